//! Completion channels as C objects (`ibv_create_comp_channel`,
//! `ibv_destroy_comp_channel`) and the completion events read through them
//! (`ibv_get_cq_event`, `ibv_ack_cq_events`), which a CQ's destroy waits
//! for.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_uint, c_void};
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use rverbs_ibverbs_abi::abi::*;

use crate::ffi::{errno_of, guard, lock, neg, null};
use crate::handles::{self, context_ref, counter, refcnt, wrapper, Channel, Cq, Retired};

export! { "IBVERBS_1.0"
    /// `ibv_create_comp_channel`: `fd` is a real, pollable descriptor a
    /// program may make non-blocking; `refcnt` counts its CQs.
    pub unsafe extern "C" fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
        guard(ptr::null_mut(), || {
            // SAFETY: a context this library opened, or NULL.
            let Some(ctx) = (unsafe { context_ref(context) }) else {
                return null(libc::EINVAL);
            };
            match ctx.rust.create_comp_channel() {
                Ok(ch) => {
                    use std::os::fd::AsRawFd;
                    let ibv = ibv_comp_channel {
                        context,
                        fd: ch.as_raw_fd(),
                        refcnt: 0,
                    };
                    Box::into_raw(Box::new(Channel {
                        ibv: UnsafeCell::new(ibv),
                        rust: Mutex::new(Some(ch)),
                    }))
                    .cast()
                }
                Err(e) => null(errno_of(&e)),
            }
        })
    }
}

export! { "IBVERBS_1.0"
    /// `ibv_destroy_comp_channel`: EBUSY (returned) while CQs use it.
    /// The channel goes (its descriptor is closed once no thread waits on
    /// it), but its memory stays a while (see [`Retired`]): a thread still
    /// waiting in `ibv_get_cq_event` goes on waiting, as one blocked in
    /// libibverbs' `read` does, and a late call with it waits a second and
    /// fails with EBADF instead of crashing.
    pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: a channel from ibv_create_comp_channel, or NULL.
            let Some(w) = (unsafe { wrapper::<_, Channel>(channel) }) else {
                return libc::EINVAL;
            };
            if refcnt(channel).load(Ordering::Acquire) != 0 {
                return libc::EBUSY;
            }
            let mut slot = lock(&w.rust);
            let Some(ch) = slot.take() else {
                drop(slot);
                return handles::destroyed_channel();
            };
            if let Err(rejected) = ch.destroy() {
                let errno = errno_of(rejected.error());
                *slot = Some(rejected.into_inner());
                return errno;
            }
            drop(slot);
            // SAFETY: made by Box::into_raw in ibv_create_comp_channel, and
            // kept once: only the destroy that found the slot full gets here.
            unsafe { RETIRED.keep(channel.cast::<Channel>()) };
            0
        })
    }
}

/// Destroyed completion channels, kept a while (see [`Retired`]).
static RETIRED: Retired<Channel> = Retired::new();

export! { "IBVERBS_1.1"
    /// `ibv_get_cq_event`: reads the channel (blocking, unless the program
    /// made its fd non-blocking: then -1/EAGAIN); 0, or -1 with errno.
    pub unsafe extern "C" fn ibv_get_cq_event(
        channel: *mut ibv_comp_channel,
        cq_out: *mut *mut ibv_cq,
        cq_context: *mut *mut c_void,
    ) -> c_int {
        guard(-1, || {
            // SAFETY: a channel from ibv_create_comp_channel, or NULL.
            let Some(w) = (unsafe { wrapper::<_, Channel>(channel) }) else {
                return neg(libc::EINVAL);
            };
            let Some(ch) = w.handle() else {
                return neg(handles::destroyed_channel());
            };
            let ev = match ch.get_cq_event() {
                Ok(ev) => ev,
                Err(e) => {
                    return neg(errno_of(&e));
                }
            };
            let cq = ev.user_data() as *mut Cq;
            // SAFETY: the event's user data is the C CQ it was created with,
            // live while it has unacknowledged events (destroy waits).
            let w = unsafe { &*cq };
            if !cq_out.is_null() {
                // SAFETY: the caller passes writable pointers (or NULL).
                unsafe { *cq_out = cq.cast() };
            }
            if !cq_context.is_null() {
                // SAFETY: as above.
                unsafe { *cq_context = (*w.ibv.get()).cq_context };
            }
            lock(&w.pending).push_back(ev);
            0
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_ack_cq_events`: acknowledges `nevents` events of `cq`.
    pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
        guard((), || {
            // SAFETY: a CQ from ibv_create_cq, or NULL.
            let Some(w) = (unsafe { wrapper::<_, Cq>(cq) }) else { return };
            let mut pending = lock(&w.pending);
            for _ in 0..nevents {
                drop(pending.pop_front());
            }
            // SAFETY: cq is live (checked above).
            counter(unsafe { ptr::addr_of_mut!((*cq).comp_events_completed) })
                .fetch_add(nevents, Ordering::AcqRel);
            w.acked.notify_all();
        })
    }
}
