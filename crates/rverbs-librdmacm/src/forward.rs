//! The exported functions: every symbol of librdmacm, at its version node,
//! with its C prototype (from `rverbs_ibverbs_abi::for_each_rdmacm_function!`),
//! each calling the slot of the same name in the rdma_cm's table
//! (`crate::ops`) with its arguments unchanged.
//!
//! With no table (the libibverbs.so.1 loaded is not rverbs'), or an empty
//! slot, a function fails the way its prototype reports errors — -1, or
//! NULL, with errno ENOSYS (0 for the `__be16` ports, `(size_t)-1` for
//! `riowrite`); a `void` one does nothing; `rdma_event_str` answers
//! `"UNKNOWN EVENT"` (a string a program can print, never NULL). Every
//! function runs inside the panic guard of `crate::ffi`.
//!
//! `rfcntl(int, int, ...)` is variadic, which stable Rust cannot define: it
//! is defined with a third named argument, a `c_long`. On x86_64 the caller
//! passes a variadic integer or pointer argument in the register of the
//! third named one, so the value arrives unchanged (garbage when the
//! command takes none, F_GETFL, and then ignored) and is passed on to the
//! table's `rfcntl`, which takes it the same way.

use rverbs_ibverbs_abi::abi::rdmacm_ops::prototype_types::*;

/// What `rdma_event_str` answers with no table: rdma-core's name for a
/// value that is no event.
const UNKNOWN_EVENT: &std::ffi::CStr = c"UNKNOWN EVENT";

/// Exports one forwarder per function of the list.
macro_rules! forwarders {
    ($($node:literal fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        $( forwarders!(@one $node $name ($($arg: $ty),*) $(-> $ret)?); )*
    };
    (@one $node:literal rdma_event_str ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        forwarders!(@fn $node rdma_event_str ($($arg: $ty),*) -> $ret;
            failed: UNKNOWN_EVENT.as_ptr(); unavailable: UNKNOWN_EVENT.as_ptr());
    };
    (@one $node:literal $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        forwarders!(@fn $node $name ($($arg: $ty),*) -> $ret;
            failed: <$ret as crate::ffi::Failure>::FAILED;
            unavailable: crate::ffi::not_implemented());
    };
    (@fn $node:literal $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty;
        failed: $failed:expr; unavailable: $unavailable:expr) => {
        export! { $node
            #[doc = concat!(
                "`", stringify!($name), "`: the rdma_cm's, in rverbs' libibverbs.so.1 ",
                "(fails with ENOSYS when that is not loaded)."
            )]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                crate::ffi::guard($failed, || match crate::ops::table().and_then(|ops| ops.$name) {
                    // SAFETY: the slot for this very function, with its C
                    // prototype (the table's version and size are checked);
                    // the arguments are the caller's, passed on unchanged.
                    Some(function) => unsafe { function($($arg),*) },
                    None => $unavailable,
                })
            }
        }
    };
    (@one $node:literal $name:ident ($($arg:ident: $ty:ty),*)) => {
        export! { $node
            #[doc = concat!(
                "`", stringify!($name), "`: the rdma_cm's, in rverbs' libibverbs.so.1 ",
                "(does nothing when that is not loaded)."
            )]
            pub unsafe extern "C" fn $name($($arg: $ty),*) {
                crate::ffi::guard((), || {
                    if let Some(function) = crate::ops::table().and_then(|ops| ops.$name) {
                        // SAFETY: the slot for this very function, with its
                        // C prototype (the table's version and size are
                        // checked); the arguments are the caller's, passed
                        // on unchanged.
                        unsafe { function($($arg),*) }
                    }
                })
            }
        }
    };
}

rverbs_ibverbs_abi::for_each_rdmacm_function!(forwarders);
