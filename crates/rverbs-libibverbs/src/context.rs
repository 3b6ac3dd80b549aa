//! Contexts: `ibv_open_device` (which takes the context's function
//! pointers from `ops.rs`) and `ibv_close_device`, the async events read
//! through a context (`ibv_get_async_event`, `ibv_ack_async_event`), and
//! the leak and counter reports at close and at exit.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::{Mutex, OnceLock};

use rverbs::{AsyncEvent, AsyncEventElement};
use rverbs_ibverbs_abi::abi::*;

use crate::ffi::{errno_of, guard, neg, null};
use crate::handles::{context_ref, counter, device_ref, Context};

/// Open contexts (addresses of their `Context`), for
/// `ibv_ack_async_event`, which names no context.
fn open_contexts() -> std::sync::MutexGuard<'static, Vec<usize>> {
    static OPEN: OnceLock<Mutex<Vec<usize>>> = OnceLock::new();
    OPEN.get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

export! { "IBVERBS_1.1"
    /// `ibv_open_device`.
    pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
        guard(ptr::null_mut(), || {
            // SAFETY: a device pointer from ibv_get_device_list, or NULL.
            let Some(d) = (unsafe { device_ref(device) }) else {
                return null(libc::EINVAL);
            };
            let rust = match d.rust.open() {
                Ok(c) => c,
                Err(e) => {
                    return null(errno_of(&e));
                }
            };
            let cmd_fd = match nix::sys::eventfd::EventFd::from_flags(
                nix::sys::eventfd::EfdFlags::EFD_CLOEXEC | nix::sys::eventfd::EfdFlags::EFD_NONBLOCK,
            ) {
                Ok(fd) => std::os::fd::OwnedFd::from(fd),
                Err(e) => return null(e as c_int),
            };
            let mut vctx = verbs_context::default();
            vctx.sz = std::mem::size_of::<verbs_context>();
            let c = &mut vctx.context;
            c.device = device;
            c.cmd_fd = cmd_fd.as_raw_fd();
            c.async_fd = rust.async_fd().as_raw_fd();
            c.num_comp_vectors = rust.num_comp_vectors() as c_int;
            c.abi_compat = usize::MAX as *mut c_void;
            crate::ops::fill(&mut vctx);
            let ctx = Box::new(Context {
                vctx,
                rust,
                pending: Mutex::new(VecDeque::new()),
                cmd_fd,
            });
            let ctx = Box::into_raw(ctx);
            open_contexts().push(ctx as usize);
            // SAFETY: just allocated; the context member's address is stable.
            unsafe { ptr::addr_of_mut!((*ctx).vctx.context) }
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_close_device`: frees the context only (objects made through it
    /// are not released, as in libibverbs).
    pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
        guard(-1, || {
            // SAFETY: a context this library opened, or NULL.
            let Some(ctx) = (unsafe { context_ref(context) }) else {
                return neg(libc::EINVAL);
            };
            let at = ptr::from_ref(ctx).cast_mut();
            let mut open = open_contexts();
            let Some(i) = open.iter().position(|&c| c == at as usize) else {
                return neg(libc::EINVAL);
            };
            open.swap_remove(i);
            if leak_check() {
                report_leaks(ctx, "at ibv_close_device");
            }
            // SAFETY: the Context was made by Box::into_raw in
            // ibv_open_device and was still listed as open: this is its one
            // close. The list's lock is held, so no ack looks at it now.
            let closed = unsafe { Box::from_raw(at) };
            if leak_check() && !closed.rust.live_resources().is_empty() {
                // Its objects keep it alive anyway; exit reports them again.
                lock_leaked().push(closed.rust);
            }
            0
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_get_async_event`: blocks on `async_fd` (or fails with EAGAIN
    /// when the program made it non-blocking); 0, or -1 with errno.
    pub unsafe extern "C" fn ibv_get_async_event(
        context: *mut ibv_context,
        event: *mut ibv_async_event,
    ) -> c_int {
        guard(-1, || {
            // SAFETY: a context this library opened, or NULL.
            let Some(ctx) = (unsafe { context_ref(context) }) else {
                return neg(libc::EINVAL);
            };
            if event.is_null() {
                return neg(libc::EINVAL);
            }
            let ev = match ctx.rust.get_async_event() {
                Ok(ev) => ev,
                Err(e) => {
                    return neg(errno_of(&e));
                }
            };
            let mut out = ibv_async_event::default();
            out.event_type = ev.event_type() as u32;
            match ev.element() {
                AsyncEventElement::Cq { user_data, .. } => out.element.cq = user_data as *mut ibv_cq,
                AsyncEventElement::Qp { user_data, .. } => out.element.qp = user_data as *mut ibv_qp,
                AsyncEventElement::Srq { user_data, .. } => {
                    out.element.srq = user_data as *mut ibv_srq
                }
                AsyncEventElement::Port(p) => out.element.port_num = c_int::from(p),
                _ => {}
            }
            // SAFETY: the caller passes a writable ibv_async_event.
            unsafe { event.write(out) };
            ctx.pending.lock().unwrap_or_else(|p| p.into_inner()).push_back(ev);
            0
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_ack_async_event`: acknowledges the oldest unacknowledged event
    /// of the same type about the same object.
    pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
        guard((), || {
            // SAFETY: the caller passes the event ibv_get_async_event filled.
            let Some(ev) = (unsafe { event.as_ref() }) else { return };
            let element = match ev.event_type {
                IBV_EVENT_CQ_ERR => ElementKey::Pointer(unsafe { ev.element.cq } as u64),
                IBV_EVENT_SRQ_ERR | IBV_EVENT_SRQ_LIMIT_REACHED => {
                    ElementKey::Pointer(unsafe { ev.element.srq } as u64)
                }
                IBV_EVENT_PORT_ACTIVE | IBV_EVENT_PORT_ERR | IBV_EVENT_LID_CHANGE
                | IBV_EVENT_PKEY_CHANGE | IBV_EVENT_SM_CHANGE | IBV_EVENT_CLIENT_REREGISTER
                | IBV_EVENT_GID_CHANGE => ElementKey::Port(unsafe { ev.element.port_num } as u8),
                IBV_EVENT_DEVICE_FATAL => ElementKey::Device,
                _ => ElementKey::Pointer(unsafe { ev.element.qp } as u64),
            };
            let open = open_contexts();
            for &at in open.iter() {
                // SAFETY: contexts are listed while open; the list's lock
                // (held) keeps ibv_close_device from freeing one meanwhile.
                let ctx = unsafe { &*(at as *const Context) };
                let mut pending = ctx.pending.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(i) = pending
                    .iter()
                    .position(|p| p.event_type() as u32 == ev.event_type && key_of(p) == element)
                {
                    let acked = pending.remove(i);
                    bump_event_counter(acked.as_ref());
                    drop(acked);
                    return;
                }
            }
        })
    }
}

#[derive(PartialEq, Eq)]
enum ElementKey {
    Pointer(u64),
    Port(u8),
    Device,
}

fn key_of(ev: &AsyncEvent) -> ElementKey {
    match ev.element() {
        AsyncEventElement::Cq { user_data, .. }
        | AsyncEventElement::Qp { user_data, .. }
        | AsyncEventElement::Srq { user_data, .. } => ElementKey::Pointer(user_data),
        AsyncEventElement::Port(p) => ElementKey::Port(p),
        _ => ElementKey::Device,
    }
}

/// `RVERBS_LEAK_CHECK` is set (and not "0"): `ibv_close_device` and
/// process exit report every object still alive.
fn leak_check() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var_os("RVERBS_LEAK_CHECK").is_some_and(|v| v != "0" && !v.is_empty())
    })
}

/// Contexts closed with objects still alive, reported again at exit if
/// those are still alive then.
fn lock_leaked() -> std::sync::MutexGuard<'static, Vec<rverbs::Context>> {
    static LEAKED: OnceLock<Mutex<Vec<rverbs::Context>>> = OnceLock::new();
    LEAKED
        .get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn report_leaks(ctx: &Context, when: &str) {
    report_context_leaks(&ctx.rust, when);
}

fn report_context_leaks(ctx: &rverbs::Context, when: &str) {
    let dev = ctx.device();
    for r in ctx.live_resources() {
        eprintln!(
            "rverbs: leak {when}: {} {} of context {} on {} is still alive",
            r.kind.name(),
            r.handle,
            ctx.handle(),
            dev.name()
        );
    }
}

/// At process exit: with `RVERBS_COUNTERS` set (and not "0"), every
/// device's non-zero counters on stderr — what a failed run needs to
/// explain itself (drops by reason, retransmissions, NAKs); then the leak
/// report.
pub(crate) extern "C" fn report_at_exit() {
    let counters = std::env::var_os("RVERBS_COUNTERS").is_some_and(|v| v != "0" && !v.is_empty());
    if counters {
        guard((), || {
            for line in rverbs::counters::summary().lines() {
                eprintln!("rverbs: counters of {line}");
            }
        });
    }
    report_leaks_at_exit();
}

/// At process exit (with `RVERBS_LEAK_CHECK`): contexts never closed, and
/// what is still alive of every context.
fn report_leaks_at_exit() {
    if !leak_check() {
        return;
    }
    guard((), || {
        let open = open_contexts();
        for &at in open.iter() {
            // SAFETY: listed contexts are open (the list's lock is held).
            let ctx = unsafe { &*(at as *const Context) };
            eprintln!(
                "rverbs: leak at exit: context {} on {} was never closed",
                ctx.rust.handle(),
                ctx.rust.device().name()
            );
            report_leaks(ctx, "at exit");
        }
        drop(open);
        for ctx in lock_leaked().iter() {
            report_context_leaks(ctx, "at exit");
        }
    });
}

/// `ibv_ack_async_event` counts the event in its object's C struct
/// (`async_events_completed` of a CQ, `events_completed` of a QP or SRQ),
/// as libibverbs does.
fn bump_event_counter(ev: Option<&AsyncEvent>) {
    let Some(ev) = ev else { return };
    let at: *mut u32 = match ev.element() {
        // SAFETY (all three): the user data is the C object, alive while it
        // has an unacknowledged event (its destroy waits for this ack).
        AsyncEventElement::Cq { user_data, .. } => unsafe {
            ptr::addr_of_mut!((*(user_data as *mut ibv_cq)).async_events_completed)
        },
        AsyncEventElement::Qp { user_data, .. } => unsafe {
            ptr::addr_of_mut!((*(user_data as *mut ibv_qp)).events_completed)
        },
        AsyncEventElement::Srq { user_data, .. } => unsafe {
            ptr::addr_of_mut!((*(user_data as *mut ibv_srq)).events_completed)
        },
        _ => return,
    };
    counter(at).fetch_add(1, std::sync::atomic::Ordering::AcqRel);
}
