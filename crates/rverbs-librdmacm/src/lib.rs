//! `librdmacm.so.1` for unmodified rdma_cm programs (rping, ucmatose,
//! `ib_send_bw -R` …): every symbol Debian's rdma-core 44 librdmacm exports,
//! with its version node (`build.rs`, `symbols.txt`), each with the exact C
//! prototype of `<rdma/rdma_cma.h>` / `<rdma/rsocket.h>` and the ABI types
//! of `rverbs_ibverbs_abi::abi::rdmacm`.
//!
//! **This is the skeleton.** Only `rdma_event_str` works (`strings`);
//! every other function fails cleanly the way its prototype reports errors
//! — -1, or NULL, with errno ENOSYS; the `void` ones do nothing — so a
//! program linked against it loads, resolves every symbol at its version,
//! and stops at its first rdma_cm call with a clear "Function not
//! implemented" (`cm`, `rsocket`). What comes next (rverbs issue 15):
//! event channels (an fd the library's own thread makes readable), ids and
//! their address/route resolution over the rverbs device's IP addresses,
//! `rdma_create_qp`/`rdma_create_ep` through our `libibverbs.so.1` (the
//! `ibv_context`s and QPs must be that library's, so this one will reach
//! them through its exported verbs, not through a second copy of the
//! engine), the connection handshake (REQ/REP/RTU, reject, disconnect) as
//! messages between two rverbs devices, `rdma_getaddrinfo`, then UD and
//! multicast; rsockets last, if ever.
//!
//! Each exported function is a Rust function with an `rverbs_`-prefixed
//! symbol, aliased with `.symver` to the C name at its version node (rustc
//! passes its own version script, so a plain `#[no_mangle]` symbol would come
//! out unversioned), as in `crates/rverbs-libibverbs` (the `export!` macro is
//! a short copy of that library's). Every function runs inside the panic
//! guard of `ffi`: no panic crosses into C.
//!
//! Modules: `ffi` (errno, panic guard, how each return type fails),
//! `strings` (`rdma_event_str`), `cm` (the `rdma_*` calls), `rsocket` (the
//! `r*` socket calls).

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

/// Exports functions that are not implemented yet, each with its exact C
/// prototype: one with a return type fails as [`ffi::Failure`] says for
/// that type (errno ENOSYS); a `void` one does nothing. The arguments are
/// ignored. Both run inside the panic guard.
macro_rules! not_yet {
    ($($node:literal fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        $( not_yet!(@one $node $name ($($arg: $ty),*) $(-> $ret)?); )*
    };
    (@one $node:literal $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        export! { $node
            #[doc = concat!("`", stringify!($name), "`: not implemented yet; fails with errno ENOSYS.")]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                $( let _ = $arg; )*
                crate::ffi::guard(<$ret as crate::ffi::Failure>::FAILED, crate::ffi::not_implemented)
            }
        }
    };
    (@one $node:literal $name:ident ($($arg:ident: $ty:ty),*)) => {
        export! { $node
            #[doc = concat!("`", stringify!($name), "`: not implemented yet; does nothing.")]
            pub unsafe extern "C" fn $name($($arg: $ty),*) {
                $( let _ = $arg; )*
                crate::ffi::guard((), || ())
            }
        }
    };
}

mod cm;
mod ffi;
mod rsocket;
mod strings;
