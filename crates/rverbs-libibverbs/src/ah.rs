//! Address handles as C objects: `ibv_create_ah`, `ibv_destroy_ah`, and
//! the address answering a received UD message (`ibv_init_ah_from_wc`,
//! `ibv_create_ah_from_wc`).

use std::ffi::c_int;
use std::ptr;

use rverbs::{AddressHandle, AhAttr};
use rverbs_ibverbs_abi::abi::*;

use crate::convert::{ah_attr, c_ah_attr};
use crate::ffi::{errno_of, guard, neg, null};
use crate::handles::{context_ref, destroy_wrapper, pd_ref, Ah};

/// Creates an AH on `pd` for `attr` (EINVAL for `None`).
fn new_ah(pd: *mut ibv_pd, attr: Option<AhAttr>) -> *mut ibv_ah {
    // SAFETY: a PD from ibv_alloc_pd, or NULL.
    let Some(rust_pd) = (unsafe { pd_ref(pd) }) else {
        return null(libc::EINVAL);
    };
    let Some(attr) = attr else {
        return null(libc::EINVAL);
    };
    match rust_pd.create_ah(&attr) {
        Ok(rust) => {
            let ibv = ibv_ah {
                // SAFETY: pd is live.
                context: unsafe { (*pd).context },
                pd,
                handle: rust.handle() as u32,
            };
            Box::into_raw(Box::new(Ah {
                ibv,
                rust: Some(rust),
            }))
            .cast()
        }
        Err(e) => null(errno_of(&e)),
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_create_ah`: RoCE needs `is_global` and a GRH (EINVAL without).
    pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
        guard(ptr::null_mut(), || {
            // SAFETY: the caller passes a readable ibv_ah_attr (or NULL).
            let a = unsafe { attr.as_ref() }.and_then(ah_attr);
            new_ah(pd, a)
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_destroy_ah`.
    pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: an AH from ibv_create_ah* (or NULL), not destroyed.
            unsafe {
                destroy_wrapper(ah.cast::<Ah>(), |w| ptr::addr_of_mut!((*w).rust), AddressHandle::destroy)
            }
        })
    }
}

/// The address vector answering a received UD message.
///
/// # Safety
/// `wc` and `grh` must be readable (`grh`: 40 bytes) or NULL.
unsafe fn attr_from_wc(
    context: *mut ibv_context,
    wc: *const ibv_wc,
    grh: *const ibv_grh,
) -> Result<AhAttr, c_int> {
    // SAFETY: a context this library opened, or NULL.
    let ctx = unsafe { context_ref(context) }.ok_or(libc::EINVAL)?;
    // SAFETY: per the caller.
    let wc = unsafe { wc.as_ref() }.ok_or(libc::EINVAL)?;
    if grh.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the caller, 40 readable bytes; copied by value (they sit
    // in a receive buffer, registered memory), no reference formed over them.
    let bytes: [u8; 40] = unsafe { grh.cast::<[u8; 40]>().read() };
    let mut r = rverbs::WorkCompletion::default();
    r.wc_flags = rverbs::WcFlags::from_bits_truncate(wc.wc_flags);
    r.sl = wc.sl;
    AddressHandle::attr_from_wc(&ctx.rust, &r, &bytes).map_err(|e| errno_of(&e))
}

export! { "IBVERBS_1.1"
    /// `ibv_init_ah_from_wc`: 0, or -1 with errno.
    pub unsafe extern "C" fn ibv_init_ah_from_wc(
        context: *mut ibv_context,
        port_num: u8,
        wc: *mut ibv_wc,
        grh: *mut ibv_grh,
        ah_attr_out: *mut ibv_ah_attr,
    ) -> c_int {
        guard(-1, || {
            if ah_attr_out.is_null() || port_num != 1 {
                return neg(libc::EINVAL);
            }
            // SAFETY: the caller passes a WC and the GRH of its buffer.
            match unsafe { attr_from_wc(context, wc, grh) } {
                Ok(a) => {
                    // SAFETY: the caller passes a writable ibv_ah_attr.
                    unsafe { ah_attr_out.write(c_ah_attr(&a)) };
                    0
                }
                Err(e) => neg(e),
            }
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_create_ah_from_wc`.
    pub unsafe extern "C" fn ibv_create_ah_from_wc(
        pd: *mut ibv_pd,
        wc: *mut ibv_wc,
        grh: *mut ibv_grh,
        port_num: u8,
    ) -> *mut ibv_ah {
        guard(ptr::null_mut(), || {
            if pd.is_null() || port_num != 1 {
                return null(libc::EINVAL);
            }
            // SAFETY: pd is a live PD; the caller passes a WC and its GRH.
            let a = unsafe { attr_from_wc((*pd).context, wc, grh) };
            match a {
                Ok(a) => new_ah(pd, Some(a)),
                Err(e) => null(e),
            }
        })
    }
}
