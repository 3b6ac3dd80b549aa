//! Memory windows as C objects. verbs.h's `ibv_alloc_mw`, `ibv_dealloc_mw`
//! and `ibv_bind_mw` are inline functions that call the context's
//! `alloc_mw`, `dealloc_mw` and `bind_mw` ops (set in `ops.rs`); these are
//! those ops. Binding a type 2 window, invalidating and SEND with
//! Invalidate are send WRs (`wr.rs`, `qp_ex.rs`).

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::ptr;

use rverbs::{MemoryWindow, MwBind, MwType, SendFlags};
use rverbs_ibverbs_abi::abi::*;

use crate::convert::mw_bind_info;
use crate::ffi::{errno_of, guard, null};
use crate::handles::{destroy_wrapper, pd_ref, qp_ref, wrapper, Mw};

/// `ops.alloc_mw`: a window of type 1 or 2 in `pd`; NULL with errno EINVAL
/// for another type (as the kernel answers), ENOMEM past `max_mw`.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, ty: ibv_mw_type) -> *mut ibv_mw {
    guard(ptr::null_mut(), || {
        // SAFETY: a PD from ibv_alloc_pd, or NULL.
        let Some(rust_pd) = (unsafe { pd_ref(pd) }) else {
            return null(libc::EINVAL);
        };
        let mw_type = match ty {
            IBV_MW_TYPE_1 => MwType::Type1,
            IBV_MW_TYPE_2 => MwType::Type2,
            _ => return null(libc::EINVAL),
        };
        match rust_pd.alloc_mw(mw_type) {
            Ok(mw) => {
                let ibv = ibv_mw {
                    // SAFETY: pd is live (checked above).
                    context: unsafe { (*pd).context },
                    pd,
                    rkey: mw.rkey(),
                    handle: mw.handle() as u32,
                    r#type: ty,
                };
                Box::into_raw(Box::new(Mw {
                    ibv: UnsafeCell::new(ibv),
                    rust: Some(mw),
                }))
                .cast()
            }
            Err(e) => null(errno_of(&e)),
        }
    })
}

/// `ops.dealloc_mw`: 0 (a bound window too, as rxe), or the errno.
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a window from ibv_alloc_mw (or NULL), not yet deallocated.
        unsafe {
            destroy_wrapper(
                mw.cast::<Mw>(),
                |w| ptr::addr_of_mut!((*w).rust),
                MemoryWindow::dealloc,
            )
        }
    })
}

/// `ops.bind_mw` (behind the inline `ibv_bind_mw`, which has checked the
/// window's type and the MR's PD): posts the bind as a send WR and, posted,
/// gives the window its new rkey, as rdma-core's providers do (a bind that
/// then completes in error leaves the program to undo it). 0 or the errno.
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    mw_bind: *mut ibv_mw_bind,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program's QP, window and bind, live or NULL.
        let (Some(rust_qp), Some(w), Some(bind)) = (
            unsafe { qp_ref(qp) },
            unsafe { wrapper::<_, Mw>(mw) },
            unsafe { mw_bind.as_ref() },
        ) else {
            return libc::EINVAL;
        };
        let Some(rust_mw) = w.rust.as_ref() else {
            return libc::EINVAL;
        };
        // SAFETY: the bind's MR is the program's live MR, or NULL.
        let Some(info) = (unsafe { mw_bind_info(&bind.bind_info) }) else {
            return libc::EINVAL;
        };
        let mut flags = SendFlags::empty();
        if bind.send_flags & IBV_SEND_SIGNALED != 0 {
            flags |= SendFlags::SIGNALED;
        }
        if bind.send_flags & IBV_SEND_FENCE != 0 {
            flags |= SendFlags::FENCE;
        }
        let req = MwBind {
            wr_id: bind.wr_id,
            flags,
            info,
        };
        match rust_qp.bind_mw(rust_mw, &req) {
            Ok(rkey) => {
                // SAFETY: the window's C struct is live; the program does
                // not write it during the call.
                unsafe { (*w.ibv.get()).rkey = rkey };
                0
            }
            Err(e) => errno_of(&e),
        }
    })
}
