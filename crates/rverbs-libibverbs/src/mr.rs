//! Memory regions as C objects — `ibv_reg_mr*`, `ibv_rereg_mr`,
//! `ibv_dereg_mr` — and the fork calls, whose only state is whether a
//! registration or a range call came first.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_uint, c_void};
use std::ptr;
use std::sync::atomic::Ordering;

use rverbs::{AccessFlags, MemoryRegion};
use rverbs_ibverbs_abi::abi::*;

use crate::ffi::{errno_of, guard, null, set_errno};
use crate::handles::{destroy_wrapper, pd_ref, Mr};

/// Access flags as rverbs takes them: the optional-range bits (hints a
/// device may ignore) dropped, unknown bits refused.
fn access_flags(access: c_uint) -> Option<AccessFlags> {
    let access = access & !AccessFlags::OPTIONAL_RANGE.bits();
    AccessFlags::from_bits(access)
}

/// What the `ibv_reg_mr*` calls share.
fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard(ptr::null_mut(), || {
        // SAFETY: a PD from ibv_alloc_pd, or NULL.
        let Some(rust_pd) = (unsafe { pd_ref(pd) }) else {
            return null(libc::EINVAL);
        };
        let Some(flags) = access_flags(access) else {
            return null(libc::EINVAL);
        };
        // rdma-core 44's ibv_reg_mr marks the range don't-fork, which makes
        // a later ibv_fork_init too late.
        RANGE_CALLED.store(true, Ordering::Relaxed);
        // SAFETY: as ibv_reg_mr's contract says, the program keeps
        // addr..addr+length mapped and leaves it to the device until it
        // deregisters the MR (which C programs do before freeing).
        let mr = unsafe { rust_pd.reg_mr_raw(addr.cast(), length, iova, flags) };
        match mr {
            Ok(mr) => {
                // SAFETY: pd is live (checked above); its context is set.
                let context = unsafe { (*pd).context };
                let ibv = ibv_mr {
                    context,
                    pd,
                    addr,
                    length,
                    handle: mr.handle() as u32,
                    lkey: mr.lkey(),
                    rkey: mr.rkey(),
                };
                Box::into_raw(Box::new(Mr {
                    ibv: UnsafeCell::new(ibv),
                    rust: Some(mr),
                }))
                .cast()
            }
            Err(e) => null(errno_of(&e)),
        }
    })
}

export! { "IBVERBS_1.1"
    /// `ibv_reg_mr` (the function; verbs.h's macro calls
    /// `ibv_reg_mr_iova2` when the flags are not constant).
    pub unsafe extern "C" fn ibv_reg_mr(
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        access: c_int,
    ) -> *mut ibv_mr {
        reg_mr(pd, addr, length, addr as u64, access as c_uint)
    }
}

export! { "IBVERBS_1.7"
    /// `ibv_reg_mr_iova`.
    pub unsafe extern "C" fn ibv_reg_mr_iova(
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        iova: u64,
        access: c_int,
    ) -> *mut ibv_mr {
        reg_mr(pd, addr, length, iova, access as c_uint)
    }
}

export! { "IBVERBS_1.8"
    /// `ibv_reg_mr_iova2`.
    pub unsafe extern "C" fn ibv_reg_mr_iova2(
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        iova: u64,
        access: c_uint,
    ) -> *mut ibv_mr {
        reg_mr(pd, addr, length, iova, access)
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_dereg_mr`.
    pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: an MR from ibv_reg_mr* (or NULL), not yet
            // deregistered. (Foreign memory: no buffer comes back.)
            unsafe {
                destroy_wrapper(mr.cast::<Mr>(), |w| ptr::addr_of_mut!((*w).rust), MemoryRegion::dereg)
            }
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_rereg_mr`: new memory (`IBV_REREG_MR_CHANGE_TRANSLATION`, at its
    /// own address as the iova), PD and/or access flags; the MR gets new
    /// keys. 0, or IBV_REREG_MR_ERR_INPUT (-1) for bad arguments and
    /// IBV_REREG_MR_ERR_CMD (-4) when the device refused, with errno set.
    pub unsafe extern "C" fn ibv_rereg_mr(
        mr: *mut ibv_mr,
        flags: c_int,
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        access: c_int,
    ) -> c_int {
        const CHANGE_TRANSLATION: c_int = 1;
        const CHANGE_PD: c_int = 1 << 1;
        const CHANGE_ACCESS: c_int = 1 << 2;
        const ERR_INPUT: c_int = -1;
        const ERR_CMD: c_int = -4;
        let input = |errno| {
            set_errno(errno);
            ERR_INPUT
        };
        guard(ERR_CMD, || {
            if mr.is_null() || flags == 0 || flags & !(CHANGE_TRANSLATION | CHANGE_PD | CHANGE_ACCESS) != 0 {
                return input(libc::EINVAL);
            }
            let w = mr.cast::<Mr>();
            // SAFETY: an MR from ibv_reg_mr*; libibverbs leaves it to the
            // program not to use the MR elsewhere during a rereg.
            let Some(rust) = (unsafe { (*w).rust.as_mut() }) else {
                return input(libc::EINVAL);
            };
            let mut req = rverbs::Rereg::new();
            if flags & CHANGE_PD != 0 {
                // SAFETY: a PD from ibv_alloc_pd, or NULL.
                let Some(p) = (unsafe { pd_ref(pd) }) else {
                    return input(libc::EINVAL);
                };
                req = req.pd(p);
            }
            if flags & CHANGE_ACCESS != 0 {
                let Some(a) = access_flags(access as c_uint) else {
                    return input(libc::EINVAL);
                };
                req = req.access(a);
            }
            if flags & CHANGE_TRANSLATION != 0 {
                RANGE_CALLED.store(true, Ordering::Relaxed);
                // SAFETY: as for ibv_reg_mr: the program keeps the new range
                // mapped and leaves it to the device until deregistration.
                req = unsafe { req.foreign_memory(addr.cast(), length) };
            }
            match rust.rereg(req) {
                Ok(_) => {
                    // SAFETY: the MR is live; its C fields follow the change.
                    unsafe {
                        (*mr).lkey = rust.lkey();
                        (*mr).rkey = rust.rkey();
                        if flags & CHANGE_TRANSLATION != 0 {
                            (*mr).addr = addr;
                            (*mr).length = length;
                        }
                        if flags & CHANGE_PD != 0 {
                            (*mr).pd = pd;
                        }
                    }
                    0
                }
                Err(rejected) => {
                    let errno = rejected.error().errno();
                    set_errno(errno);
                    if errno == libc::EINVAL {
                        ERR_INPUT
                    } else {
                        ERR_CMD
                    }
                }
            }
        })
    }
}

// ---- fork --------------------------------------------------------------

/// A dontfork/dofork range call came first: `ibv_fork_init` is then too
/// late (EINVAL), as in libibverbs.
static RANGE_CALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

export! { "IBVERBS_1.1"
    /// `ibv_fork_init`: nothing to protect (the device reads and writes
    /// memory with ordinary copies, so a fork cannot break it); EINVAL after
    /// a range call, as libibverbs.
    pub unsafe extern "C" fn ibv_fork_init() -> c_int {
        if RANGE_CALLED.load(std::sync::atomic::Ordering::Relaxed) {
            libc::EINVAL
        } else {
            0
        }
    }
}

export! { "IBVERBS_1.13"
    /// `ibv_is_fork_initialized`: IBV_FORK_UNNEEDED.
    pub unsafe extern "C" fn ibv_is_fork_initialized() -> c_int {
        2
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_dontfork_range`: nothing to do.
    pub unsafe extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
        RANGE_CALLED.store(true, std::sync::atomic::Ordering::Relaxed);
        0
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_dofork_range`: nothing to do.
    pub unsafe extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
        RANGE_CALLED.store(true, std::sync::atomic::Ordering::Relaxed);
        0
    }
}
