//! Shared receive queues as C objects: create, modify, query, destroy, and
//! posting to them (`ops.post_srq_recv`).

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::ptr;

use rverbs::{SharedReceiveQueue, SrqAttr, SrqAttrMask};
use rverbs_ibverbs_abi::abi::*;

use crate::ffi::{errno_of, guard, null};
use crate::handles::{destroy_in_place, pd_ref, srq_ref, Srq};
use crate::wr::post_recv_chain;

export! { "IBVERBS_1.1"
    /// `ibv_create_srq`.
    pub unsafe extern "C" fn ibv_create_srq(pd: *mut ibv_pd, init_attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
        guard(ptr::null_mut(), || {
            // SAFETY: a PD from ibv_alloc_pd, or NULL.
            let Some(rust_pd) = (unsafe { pd_ref(pd) }) else {
                return null(libc::EINVAL);
            };
            // SAFETY: the caller passes a readable ibv_srq_init_attr.
            let Some(attr) = (unsafe { init_attr.as_ref() }) else {
                return null(libc::EINVAL);
            };
            let mut ibv = ibv_srq::default();
            // SAFETY: pd is live.
            ibv.context = unsafe { (*pd).context };
            ibv.srq_context = attr.srq_context;
            ibv.pd = pd;
            let srq = Box::into_raw(Box::new(Srq {
                ibv: UnsafeCell::new(ibv),
                rust: None,
            }));
            let a = SrqAttr {
                max_wr: attr.attr.max_wr,
                max_sge: attr.attr.max_sge,
                srq_limit: attr.attr.srq_limit,
            };
            match rust_pd.create_srq_with(a, srq as u64) {
                Ok(rust) => {
                    // SAFETY: just made; not handed out yet.
                    let w = unsafe { &mut *srq };
                    w.ibv.get_mut().handle = rust.handle() as u32;
                    if let Ok(q) = rust.query() {
                        // SAFETY: the caller's init_attr (readable above) is
                        // writable too, as ibv_create_srq's contract says.
                        unsafe {
                            (*init_attr).attr.max_wr = q.max_wr;
                            (*init_attr).attr.max_sge = q.max_sge;
                        }
                    }
                    w.rust = Some(rust);
                    srq.cast()
                }
                Err(e) => {
                    // SAFETY: made above, never handed out.
                    drop(unsafe { Box::from_raw(srq) });
                    null(errno_of(&e))
                }
            }
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_modify_srq`.
    pub unsafe extern "C" fn ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: an SRQ from ibv_create_srq, or NULL.
            let Some(rust) = (unsafe { srq_ref(srq) }) else {
                return libc::EINVAL;
            };
            // SAFETY: the caller passes a readable ibv_srq_attr.
            let Some(a) = (unsafe { attr.as_ref() }) else {
                return libc::EINVAL;
            };
            let mask = SrqAttrMask::from_bits_retain(mask as u32);
            let a = SrqAttr {
                max_wr: a.max_wr,
                max_sge: a.max_sge,
                srq_limit: a.srq_limit,
            };
            match rust.modify(&a, mask) {
                Ok(()) => 0,
                Err(e) => errno_of(&e),
            }
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_query_srq`.
    pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: an SRQ from ibv_create_srq, or NULL.
            let Some(rust) = (unsafe { srq_ref(srq) }) else {
                return libc::EINVAL;
            };
            if attr.is_null() {
                return libc::EINVAL;
            }
            match rust.query() {
                Ok(q) => {
                    // SAFETY: the caller passes a writable ibv_srq_attr.
                    unsafe {
                        attr.write(ibv_srq_attr {
                            max_wr: q.max_wr,
                            max_sge: q.max_sge,
                            srq_limit: q.srq_limit,
                        })
                    };
                    0
                }
                Err(e) => errno_of(&e),
            }
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_destroy_srq`: waits for its async events to be acknowledged;
    /// EBUSY while QPs use it.
    pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
        guard(libc::EIO, || {
            if srq.is_null() {
                return libc::EINVAL;
            }
            let w = srq.cast::<Srq>();
            loop {
                // SAFETY: an SRQ from ibv_create_srq, not destroyed.
                match unsafe { destroy_in_place(ptr::addr_of_mut!((*w).rust), SharedReceiveQueue::destroy) } {
                    Ok(()) => {
                        // SAFETY: made by Box::into_raw; freed once.
                        drop(unsafe { Box::from_raw(w) });
                        return 0;
                    }
                    Err(libc::EBUSY) => {
                        // SAFETY: refused: the wrapper is intact.
                        let Some(s) = (unsafe { (*w).rust.as_ref() }) else {
                            return libc::EINVAL;
                        };
                        let (reported, acked) = s.async_events();
                        if s.users() > 0 || reported == acked {
                            return libc::EBUSY;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    Err(errno) => return errno,
                }
            }
        })
    }
}

/// `ops.post_srq_recv` (behind the inline `ibv_post_srq_recv`).
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: an SRQ from ibv_create_srq, or NULL.
        let Some(rust) = (unsafe { srq_ref(srq) }) else {
            return libc::EINVAL;
        };
        // Its sizes now (ibv_modify_srq may have resized it): the bounds of
        // the walk.
        let attr = match rust.query() {
            Ok(a) => a,
            Err(e) => {
                if !bad_wr.is_null() {
                    // SAFETY: the caller passes a writable pointer slot.
                    unsafe { *bad_wr = wr };
                }
                return errno_of(&e);
            }
        };
        // SAFETY: the caller passes a valid list and a writable bad_wr.
        unsafe {
            post_recv_chain(wr, bad_wr, attr.max_wr, attr.max_sge, |wrs| {
                rust.post_recv_list(wrs)
            })
        }
    })
}
