//! `librdmacm.so.1` for unmodified rdma_cm programs (rping, ucmatose,
//! `ib_send_bw -R` …): every symbol Debian's rdma-core 44 librdmacm exports,
//! with its version node (`build.rs`, `symbols.txt`), each with the exact C
//! prototype of `<rdma/rdma_cma.h>` / `<rdma/rsocket.h>` and the ABI types
//! of `rverbs_ibverbs_abi::abi::rdmacm`.
//!
//! **A thin forwarder.** The rdma_cm itself lives in rverbs'
//! `libibverbs.so.1` (`crates/rverbs-libibverbs`, module `rdmacm`): its ids
//! must reach the devices, contexts, PDs and QPs that library hands out, and
//! if this library linked the `rverbs` crate, a program loading both would
//! get two copies of the engine (each cdylib has its own statics) that
//! could never see each other's objects. So this library has no engine: it
//! finds the table of rdma_cm functions libibverbs exports,
//! `__rverbs_rdmacm_ops@RVERBS_PRIVATE_1` (`ops`; the table's type,
//! `RdmacmOps`, and its prototypes are in
//! `rverbs_ibverbs_abi::abi::rdmacm_ops`), and each exported function calls
//! its slot (`forward`). If the libibverbs.so.1 of the process is not
//! rverbs' (Debian's, say), one line on stderr says so and every call fails
//! the way its prototype reports errors — -1, or NULL, with errno ENOSYS;
//! the `void` ones do nothing. What the table's functions do today (only
//! `rdma_event_str` works; the rest fail with ENOSYS until the connection
//! manager lands, rverbs issue 15) is libibverbs' business.
//!
//! Each exported function is a Rust function with an `rverbs_`-prefixed
//! symbol, aliased with `.symver` to the C name at its version node (rustc
//! passes its own version script, so a plain `#[no_mangle]` symbol would come
//! out unversioned), as in `crates/rverbs-libibverbs` (the `export!` macro is
//! a short copy of that library's). Every function runs inside the panic
//! guard of `ffi`: no panic crosses into C.
//!
//! Modules: `ffi` (errno, panic guard, how each return type fails), `ops`
//! (finding the table, once), `forward` (the exported functions).

#![deny(missing_docs)]
#![allow(clippy::missing_safety_doc)]

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

mod ffi;
mod forward;
mod ops;
