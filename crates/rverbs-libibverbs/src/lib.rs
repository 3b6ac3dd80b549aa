//! `libibverbs.so.1` for unmodified C programs: every symbol Debian's
//! rdma-core 44 libibverbs exports, with its version node (`build.rs`,
//! `symbols.txt`), over the rverbs software device.
//!
//! Each exported function is a Rust function with an `rverbs_`-prefixed
//! symbol, aliased with `.symver` to the C name at its version node (rustc
//! passes its own version script, so a plain `#[no_mangle]` symbol would come
//! out unversioned). Every function that does work runs inside a panic
//! guard; the rest only return constants. No panic crosses into C.
//!
//! One module per object family, each using the shared layers below it and
//! not each other (the exceptions: `context` takes the ops table from
//! `ops`, and `qp` gives QPs made with send ops the `qp_ex` functions):
//!
//! - shared: `ffi` (errno, panic guard, lock), `convert` (C ↔ rverbs
//!   values), `handles` (every C object's wrapper, the C pointer → wrapper
//!   lookups, destroy plumbing), `wr` (C work request lists → rverbs posts);
//! - `ops`: the function pointers set in a context, in one place;
//! - objects: `device`, `context` (open/close, async events, leak report),
//!   `query` (device, port, GID, P_Key), `pd`, `mr` (and fork), `mw`, `channel`
//!   (and completion events), `cq`, `qp`, `qp_ex` (`ibv_wr_*`), `srq`, `ah`;
//! - the rest: `strings` (`ibv_*_str`, rates), `unsupported` (EOPNOTSUPP
//!   verbs), `private` (IBVERBS_PRIVATE_34, load-time setup);
//! - `rdmacm`: the rdma_cm, every function of `librdmacm.so.1`, which
//!   rverbs' librdmacm reaches through the one table this library exports
//!   for it, `__rverbs_rdmacm_ops@@RVERBS_PRIVATE_1` (a node of ours, not
//!   Debian's): the rdma_cm's ids must reach this library's contexts and
//!   QPs, so it lives beside them rather than in a second copy of the engine.

#![deny(missing_docs)]
#![allow(clippy::missing_safety_doc)]
// C structs are zeroed, then filled field by field as verbs.h lists them.
#![allow(clippy::field_reassign_with_default)]

/// Exports a function under its C name at version node `$node`: the Rust
/// function keeps the C name, its symbol is `rverbs_<name>`, and a `.symver`
/// directive makes `<name>@@<node>` the default version of that symbol.
macro_rules! export {
    ($node:literal
     $(#[$meta:meta])*
     pub unsafe extern "C" fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block
    ) => {
        $(#[$meta])*
        #[export_name = concat!("rverbs_", stringify!($name))]
        pub unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? $body

        core::arch::global_asm!(concat!(
            ".symver rverbs_", stringify!($name), ", ", stringify!($name), "@@", $node
        ));
    };
}

mod ah;
mod channel;
mod context;
mod convert;
mod cq;
mod device;
mod ffi;
mod handles;
mod mr;
mod mw;
mod ops;
mod pd;
mod private;
mod qp;
mod qp_ex;
mod query;
mod rdmacm;
mod srq;
mod strings;
mod unsupported;
mod wr;
