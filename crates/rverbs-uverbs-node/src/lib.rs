//! `librverbs_uverbs_node.so`: the kernel's verbs device node, as far as a
//! program that checks for it can tell, for programs `rverbs run` starts.
//!
//! UCX (1.13, `uct_ib_device_is_accessible`) lists a verbs device only if
//! `/dev/infiniband/<ibv_device.dev_name>` is a character device it may
//! read and write: `stat(2)` it, `S_ISCHR`, `access(R_OK | W_OK)`. rverbs'
//! devices live in user space and have no such node, and no field of
//! `struct ibv_device` can stand in for the path (the prefix is UCX's), so
//! UCX skipped them. Preloaded, this library answers `stat`, `stat64` and
//! `access` for a path `/dev/infiniband/uverbsN` that does not exist as the
//! kernel's node would look: a character device (major 231, minor 192 + N,
//! mode 0666). Every other path, and a node that does exist, gets the real
//! answer. No file is created, and nothing ever opens the node: the verbs
//! go to rverbs' `libibverbs.so.1`, as everything else in the program.
//! (Programs built against glibc before 2.33 call `__xstat` instead, which
//! is not answered: UCX 1.13 as Debian 12 builds it calls `stat`.)

#![deny(missing_docs)]

use std::ffi::{c_char, c_int, CStr};

use libc::{stat as Stat, stat64 as Stat64};

/// The kernel's device number for `uverbsN`: major 231, minor 192 + N.
fn uverbs_rdev(n: u32) -> libc::dev_t {
    libc::makedev(231, 192 + n)
}

/// `N` if `path` is `/dev/infiniband/uverbsN`.
fn uverbs_index(path: *const c_char) -> Option<u32> {
    if path.is_null() {
        return None;
    }
    // SAFETY: the caller of stat/access passes a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(path) }.to_bytes();
    let n = path.strip_prefix(b"/dev/infiniband/uverbs")?;
    if n.is_empty() || n.len() > 3 || !n.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(n).ok()?.parse().ok()
}

/// The next definition of `name` after this library (libc's).
fn next<T: Copy>(name: &CStr) -> Option<T> {
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name; the symbol,
    // if found, is the libc function whose C signature `T` spells (each
    // caller names its own), and a function pointer is pointer-sized.
    unsafe {
        let p = libc::dlsym(libc::RTLD_NEXT, name.as_ptr());
        (!p.is_null()).then(|| std::mem::transmute_copy::<*mut libc::c_void, T>(&p))
    }
}

fn set_errno(e: c_int) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

fn errno() -> c_int {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() }
}

/// A missing `uverbsN` node: its index, when the real call failed with
/// ENOENT (the node really missing, not a permission problem).
fn missing_node(path: *const c_char, real_result: c_int) -> Option<u32> {
    (real_result != 0 && errno() == libc::ENOENT)
        .then(|| uverbs_index(path))
        .flatten()
}

/// Defines `$name` (`stat` or `stat64`, filling `$buf`): the real call,
/// and for a missing `/dev/infiniband/uverbsN` the kernel's character
/// device instead of ENOENT, errno left as it was.
macro_rules! stat_like {
    ($(#[$doc:meta])* $name:ident, $buf:ty) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// As the C function: `path` NUL-terminated, `buf` writable.
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, buf: *mut $buf) -> c_int {
            type F = unsafe extern "C" fn(*const c_char, *mut $buf) -> c_int;
            let name = concat!(stringify!($name), "\0").as_bytes();
            let Some(real) = CStr::from_bytes_with_nul(name).ok().and_then(next::<F>) else {
                set_errno(libc::ENOSYS);
                return -1;
            };
            let saved = errno();
            // SAFETY: the caller's arguments, passed on.
            let r = unsafe { real(path, buf) };
            match (missing_node(path, r), buf.is_null()) {
                (Some(n), false) => {
                    // SAFETY: the caller's writable struct.
                    let b = unsafe { &mut *buf };
                    // SAFETY: all-zero is a valid struct stat / stat64.
                    *b = unsafe { std::mem::zeroed() };
                    b.st_mode = libc::S_IFCHR | 0o666;
                    b.st_rdev = uverbs_rdev(n);
                    b.st_nlink = 1;
                    b.st_blksize = 4096;
                    set_errno(saved);
                    0
                }
                _ => r,
            }
        }
    };
}

stat_like!(
    /// `stat(2)`, with a missing `/dev/infiniband/uverbsN` shown as the
    /// kernel's character device.
    stat,
    Stat
);
stat_like!(
    /// `stat64`, as [`stat`].
    stat64,
    Stat64
);

/// `access(2)`, with a missing `/dev/infiniband/uverbsN` readable and
/// writable by all.
///
/// # Safety
/// As `access(2)`: `path` NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    type F = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
    let Some(real) = next::<F>(c"access") else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    let saved = errno();
    // SAFETY: the caller's arguments, passed on.
    let r = unsafe { real(path, mode) };
    if missing_node(path, r).is_some() && mode & libc::X_OK == 0 {
        // A success leaves errno as it was (POSIX never sets it to 0).
        set_errno(saved);
        return 0;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_uverbs_nodes_are_recognised() {
        let idx = |s: &CStr| uverbs_index(s.as_ptr());
        assert_eq!(idx(c"/dev/infiniband/uverbs0"), Some(0));
        assert_eq!(idx(c"/dev/infiniband/uverbs12"), Some(12));
        for other in [
            c"/dev/infiniband/uverbs",
            c"/dev/infiniband/uverbs0x",
            c"/dev/infiniband/rdma_cm",
            c"/dev/infiniband/uverbs1234",
            c"/tmp/dev/infiniband/uverbs0",
            c"/dev/null",
        ] {
            assert_eq!(idx(other), None, "{other:?}");
        }
        assert_eq!(uverbs_index(std::ptr::null()), None);
    }
}
