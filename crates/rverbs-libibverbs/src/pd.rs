//! Protection domains as C objects: `ibv_alloc_pd`, `ibv_dealloc_pd`.

use std::ffi::c_int;
use std::ptr;

use rverbs::ProtectionDomain;
use rverbs_ibverbs_abi::abi::*;

use crate::ffi::{errno_of, guard, null};
use crate::handles::{context_ref, destroy_wrapper, Pd};

export! { "IBVERBS_1.1"
    /// `ibv_alloc_pd`.
    pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
        guard(ptr::null_mut(), || {
            // SAFETY: a context this library opened, or NULL.
            let Some(ctx) = (unsafe { context_ref(context) }) else {
                return null(libc::EINVAL);
            };
            match ctx.rust.alloc_pd() {
                Ok(pd) => {
                    let ibv = ibv_pd {
                        context,
                        handle: pd.handle() as u32,
                    };
                    Box::into_raw(Box::new(Pd { ibv, rust: Some(pd) })).cast()
                }
                Err(e) => null(errno_of(&e)),
            }
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_dealloc_pd`: 0, or EBUSY while MRs, QPs, SRQs or AHs use it.
    pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: a PD from ibv_alloc_pd (or NULL), not yet deallocated.
            unsafe {
                destroy_wrapper(pd.cast::<Pd>(), |w| ptr::addr_of_mut!((*w).rust), ProtectionDomain::dealloc)
            }
        })
    }
}
