//! The rdma_cm (librdmacm's functions), inside libibverbs: the module owns
//! every function of `librdmacm.so.1` and the one table through which that
//! library reaches them.
//!
//! Why here: rverbs' `librdmacm.so.1` (`crates/rverbs-librdmacm`) is a thin
//! forwarder with no engine of its own. An rdma_cm id must reach the
//! devices, contexts, PDs and QPs this library hands out, and a cdylib that
//! linked the `rverbs` crate itself would carry a second copy of the engine
//! (each cdylib has its own statics) that could never see them. So this
//! library exports one function, `__rverbs_rdmacm_ops@@RVERBS_PRIVATE_1`,
//! returning [`OPS`], an [`RdmacmOps`] with one slot per librdmacm function
//! (`rverbs_ibverbs_abi::abi::rdmacm_ops` defines the table, its prototypes
//! and its compatibility rules), and librdmacm calls through it.
//!
//! `id` does the rdma_cm on the rverbs crate's connection manager
//! (`rverbs::cm`): event channels, ids, events, QPs through ids, address
//! info, endpoints; `strings` is `rdma_event_str`. What rverbs does not do
//! yet — SRQs through ids, ECE, multicast (`cm`) and rsockets (`rsocket`) —
//! fails the way its prototype reports errors: -1, or NULL, with errno
//! ENOSYS (`(size_t)-1` for `riowrite`); the `void` ones do nothing. Every
//! function runs inside the panic guard of `crate::ffi`.

use std::ffi::c_int;

use rverbs_ibverbs_abi::abi::rdmacm_ops::{RdmacmOps, RDMACM_OPS_VERSION};

use crate::ffi::set_errno;

/// Defines functions that are not implemented yet, each with its exact C
/// prototype: one with a return type fails as [`Failure`] says for that
/// type (errno ENOSYS); a `void` one does nothing. The arguments are
/// ignored. Both run inside the panic guard.
macro_rules! not_yet {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        $( not_yet!(@one $name ($($arg: $ty),*) $(-> $ret)?); )*
    };
    (@one $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        #[doc = concat!("`", stringify!($name), "`: not implemented yet; fails with errno ENOSYS.")]
        pub(crate) unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            $( let _ = $arg; )*
            crate::ffi::guard(
                <$ret as crate::rdmacm::Failure>::FAILED,
                crate::rdmacm::not_implemented,
            )
        }
    };
    (@one $name:ident ($($arg:ident: $ty:ty),*)) => {
        #[doc = concat!("`", stringify!($name), "`: not implemented yet; does nothing.")]
        pub(crate) unsafe extern "C" fn $name($($arg: $ty),*) {
            $( let _ = $arg; )*
            crate::ffi::guard((), || ())
        }
    };
}

mod cm;
mod id;
mod multicast;
mod rsocket;
mod strings;

use cm::*;
use id::*;
use multicast::*;
use rsocket::*;
use strings::*;

/// The value a C return type reports failure with (errno says why), as
/// librdmacm does: -1 for `int`, `ssize_t` and `off_t`; `(size_t)-1` for
/// `riowrite`'s `size_t`; NULL for pointers; 0 for the `__be16` ports.
pub(crate) trait Failure: Copy {
    /// The failure value.
    const FAILED: Self;
}

impl Failure for c_int {
    const FAILED: Self = -1;
}

impl Failure for libc::ssize_t {
    const FAILED: Self = -1;
}

impl Failure for libc::off_t {
    const FAILED: Self = -1;
}

impl Failure for libc::size_t {
    const FAILED: Self = libc::size_t::MAX;
}

impl Failure for u16 {
    const FAILED: Self = 0;
}

impl<T> Failure for *mut T {
    const FAILED: Self = std::ptr::null_mut();
}

/// What a function that is not implemented yet does: errno ENOSYS, and its
/// return type's failure value.
pub(crate) fn not_implemented<R: Failure>() -> R {
    set_errno(libc::ENOSYS);
    R::FAILED
}

/// Defines [`OPS`] from the list of `for_each_rdmacm_function!`: every slot
/// is the function of the same name in this module.
macro_rules! ops_table {
    ($($node:literal fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        /// The table `__rverbs_rdmacm_ops` returns: every librdmacm
        /// function, at this library's [`RDMACM_OPS_VERSION`].
        static OPS: RdmacmOps = RdmacmOps {
            size: std::mem::size_of::<RdmacmOps>(),
            version: RDMACM_OPS_VERSION,
            $( $name: Some($name), )*
        };
    };
}

rverbs_ibverbs_abi::for_each_rdmacm_function!(ops_table);

export! { "RVERBS_PRIVATE_1"
    /// `const RdmacmOps *__rverbs_rdmacm_ops(void)`: the rdma_cm's table,
    /// for rverbs' librdmacm (private: no header declares it). Never NULL;
    /// valid for as long as this library is loaded.
    pub unsafe extern "C" fn __rverbs_rdmacm_ops() -> *const RdmacmOps {
        &OPS
    }
}
