//! What every exported function shares: errno, the panic guard, and how
//! each C return type reports a failure when there is no rdma_cm to forward
//! to. (Short copies of `crates/rverbs-libibverbs/src/ffi.rs`'s errno and
//! guard, and of its `rdmacm` module's failure values: this library links
//! nothing of libibverbs.)

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(value: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot,
    // valid for the thread's lifetime.
    unsafe { *libc::__errno_location() = value };
}

/// Runs `f`; a panic becomes `on_panic` (after setting errno to EIO), so no
/// unwind crosses into C.
pub(crate) fn guard<R>(on_panic: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            set_errno(libc::EIO);
            on_panic
        }
    }
}

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

/// What a function does when the rdma_cm's table has no slot for it:
/// errno ENOSYS, and its return type's failure value.
pub(crate) fn not_implemented<R: Failure>() -> R {
    set_errno(libc::ENOSYS);
    R::FAILED
}
