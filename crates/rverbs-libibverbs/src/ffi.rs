//! What every exported function shares: errno, the panic guard, locking
//! that shrugs off poisoning, and copying bytes out of the program's memory.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(value: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot,
    // valid for the thread's lifetime.
    unsafe { *libc::__errno_location() = value };
}

/// Copies `len` bytes of the program's memory at `addr` (inline data)
/// through a stack buffer, handing each piece to `out`. The bytes may lie in
/// registered memory that the device or another thread of the program
/// writes meanwhile, so they are copied raw: no Rust reference is ever
/// formed over them.
///
/// # Safety
/// `addr..addr+len` must be readable.
pub(crate) unsafe fn copy_from_program(addr: *const u8, len: usize, mut out: impl FnMut(&[u8])) {
    let mut chunk = [0u8; 256];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(chunk.len());
        // SAFETY: `addr + done .. + n` is inside the readable range the
        // caller vouches for, and `chunk` is ours: they cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(addr.add(done), chunk.as_mut_ptr(), n) };
        out(&chunk[..n]);
        done += n;
    }
}

/// -1 with errno `e`: how ibv_query_gid, ibv_get_cq_event and others fail.
pub(crate) fn neg(e: i32) -> std::ffi::c_int {
    set_errno(e);
    -1
}

/// NULL with errno `e`: how the constructors (ibv_open_device,
/// ibv_create_cq …) fail.
pub(crate) fn null<T>(e: i32) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
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

/// The errno libibverbs would report for an rverbs error. A setup problem
/// (a destination the device cannot reach from its address) is also
/// printed on stderr: a C program sees only EINVAL, and its user needs to
/// know that RVERBS_ADDR is the fix.
pub(crate) fn errno_of(e: &rverbs::Error) -> i32 {
    if e.detail() == Some(rverbs::ErrorDetail::Unreachable) {
        eprintln!("rverbs: {e}");
    }
    e.errno()
}

/// Locks, shrugging off poisoning (a panic elsewhere was already turned
/// into an errno).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
