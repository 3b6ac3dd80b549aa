//! Completion queues as C objects: `ibv_create_cq` and the `create_cq_ex`
//! slot (whose CQs get the `ibv_cq_ex` polling functions), resize, destroy,
//! and `ops.poll_cq` / `ops.req_notify_cq` behind verbs.h's inline
//! wrappers.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::ffi::{c_int, c_uint, c_void};
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex};

use rverbs::{CompletionQueue, WorkCompletion};
use rverbs_ibverbs_abi::abi::*;

use crate::ffi::{errno_of, guard, lock, null};
use crate::handles::{context_ref, cq_ref, destroy_in_place, refcnt, wrapper, Channel, Cq};

export! { "IBVERBS_1.1"
    /// `ibv_create_cq`.
    pub unsafe extern "C" fn ibv_create_cq(
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq {
        guard(ptr::null_mut(), || {
            let (Ok(cqe), Ok(vector)) = (u32::try_from(cqe), u32::try_from(comp_vector)) else {
                return null(libc::EINVAL);
            };
            create_cq(context, cqe, cq_context, channel, vector, false).cast()
        })
    }
}

/// Creates a CQ (`extended`: with the `ibv_cq_ex` polling functions).
fn create_cq(
    context: *mut ibv_context,
    cqe: u32,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    vector: u32,
    extended: bool,
) -> *mut ibv_cq_ex {
    // SAFETY: a context this library opened, or NULL.
    let Some(ctx) = (unsafe { context_ref(context) }) else {
        return null(libc::EINVAL);
    };
    // SAFETY: a channel from ibv_create_comp_channel, or NULL.
    let ch = match unsafe { wrapper::<_, Channel>(channel) } {
        None => None,
        Some(w) => match w.handle() {
            Some(ch) => Some(ch),
            // Destroyed.
            None => return null(libc::EINVAL),
        },
    };
    let mut ibv = ibv_cq_ex::default();
    ibv.context = context;
    ibv.channel = channel;
    ibv.cq_context = cq_context;
    if extended {
        fill_cq_ex_ops(&mut ibv);
    }
    let cq = Box::into_raw(Box::new(Cq {
        ibv: UnsafeCell::new(ibv),
        rust: None,
        pending: Mutex::new(VecDeque::new()),
        acked: Condvar::new(),
        device: ctx.rust.device(),
        current: Mutex::new(WorkCompletion::default()),
    }));
    let mut b = ctx
        .rust
        .cq_builder()
        .cqe(cqe)
        .comp_vector(vector)
        .user_data(cq as u64);
    if let Some(c) = &ch {
        b = b.channel(c);
    }
    match b.build() {
        Ok(rust) => {
            // SAFETY: just made; nobody else has it yet.
            let w = unsafe { &mut *cq };
            w.ibv.get_mut().handle = rust.handle() as u32;
            w.ibv.get_mut().cqe = rust.cqe() as c_int;
            w.rust = Some(rust);
            if !channel.is_null() {
                refcnt(channel).fetch_add(1, Ordering::AcqRel);
            }
            cq.cast()
        }
        Err(e) => {
            // SAFETY: made above, never handed out.
            drop(unsafe { Box::from_raw(cq) });
            null(errno_of(&e))
        }
    }
}

/// `verbs_context.create_cq_ex` (behind the inline `ibv_create_cq_ex`): the
/// standard completion fields (`IBV_WC_STANDARD_FLAGS`); timestamps, VLAN,
/// flow tags, tag matching and parent domains are not supported.
pub(crate) unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard(ptr::null_mut(), || {
        // SAFETY: the caller passes a readable ibv_cq_init_attr_ex.
        let Some(a) = (unsafe { attr.as_ref() }) else {
            return null(libc::EINVAL);
        };
        let known_flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
        let supported = a.wc_flags & !u64::from(IBV_WC_STANDARD_FLAGS) == 0
            && a.comp_mask & !IBV_CQ_INIT_ATTR_MASK_FLAGS == 0
            && (a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS == 0 || a.flags & !known_flags == 0);
        if !supported {
            return null(libc::EOPNOTSUPP);
        }
        create_cq(context, a.cqe, a.cq_context, a.channel, a.comp_vector, true)
    })
}

/// Fills the polling functions of a CQ made by `ibv_create_cq_ex`.
fn fill_cq_ex_ops(q: &mut ibv_cq_ex) {
    q.start_poll = Some(cq_start_poll);
    q.next_poll = Some(cq_next_poll);
    q.end_poll = Some(cq_end_poll);
    q.read_opcode = Some(cq_read_opcode);
    q.read_vendor_err = Some(cq_read_vendor_err);
    q.read_byte_len = Some(cq_read_byte_len);
    q.read_imm_data = Some(cq_read_imm_data);
    q.read_qp_num = Some(cq_read_qp_num);
    q.read_src_qp = Some(cq_read_src_qp);
    q.read_wc_flags = Some(cq_read_wc_flags);
    q.read_slid = Some(cq_read_slid);
    q.read_sl = Some(cq_read_sl);
    q.read_dlid_path_bits = Some(cq_read_dlid_path_bits);
}

/// Takes the next completion into the CQ's current one: 0, or ENOENT.
fn cq_take_next(cq: *mut ibv_cq_ex) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a CQ from ibv_create_cq_ex (the ibv_cq_ex is its wrapper's
        // first field).
        let Some(w) = (unsafe { wrapper::<_, Cq>(cq) }) else {
            return libc::EINVAL;
        };
        let Some(rust) = w.rust.as_ref() else {
            return libc::EINVAL;
        };
        let mut one = [WorkCompletion::default()];
        match rust.poll(&mut one) {
            Ok(1) => {
                let wc = one[0];
                *lock(&w.current) = wc;
                // SAFETY: live; the polling thread owns these fields between
                // start_poll and end_poll.
                unsafe {
                    (*cq).wr_id = wc.wr_id;
                    (*cq).status = wc.status as u32;
                }
                0
            }
            Ok(_) => libc::ENOENT,
            Err(e) => errno_of(&e),
        }
    })
}

unsafe extern "C" fn cq_start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: the caller passes a readable attr (or NULL).
    if unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
        return libc::EINVAL;
    }
    cq_take_next(cq)
}

unsafe extern "C" fn cq_next_poll(cq: *mut ibv_cq_ex) -> c_int {
    cq_take_next(cq)
}

unsafe extern "C" fn cq_end_poll(_cq: *mut ibv_cq_ex) {}

/// A field of the current completion.
fn current<R: Default>(cq: *mut ibv_cq_ex, f: impl FnOnce(&WorkCompletion) -> R) -> R {
    guard(R::default(), || {
        // SAFETY: as in cq_take_next.
        match unsafe { wrapper::<_, Cq>(cq) } {
            Some(w) => f(&lock(&w.current)),
            None => R::default(),
        }
    })
}

unsafe extern "C" fn cq_read_opcode(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| w.opcode as u32)
}
unsafe extern "C" fn cq_read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| w.vendor_err)
}
unsafe extern "C" fn cq_read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| w.byte_len)
}
/// `read_imm_data`, which `ibv_wc_read_invalidated_rkey` calls too:
/// immediate data in network order, an invalidated rkey in host order.
unsafe extern "C" fn cq_read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, imm_field)
}

/// The `imm_data` / `invalidated_rkey` union of a completion: immediate
/// data in network order, an invalidated rkey in host order (verbs.h's
/// types).
fn imm_field(wc: &WorkCompletion) -> u32 {
    if wc.wc_flags.contains(rverbs::WcFlags::WITH_INV) {
        wc.imm_data
    } else {
        wc.imm_data.to_be()
    }
}
unsafe extern "C" fn cq_read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| w.qp_num)
}
unsafe extern "C" fn cq_read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| w.src_qp)
}
unsafe extern "C" fn cq_read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
    current(cq, |w| w.wc_flags.bits())
}
unsafe extern "C" fn cq_read_slid(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| u32::from(w.slid))
}
unsafe extern "C" fn cq_read_sl(cq: *mut ibv_cq_ex) -> u8 {
    current(cq, |w| w.sl)
}
unsafe extern "C" fn cq_read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    current(cq, |w| w.dlid_path_bits)
}

export! { "IBVERBS_1.1"
    /// `ibv_resize_cq`.
    pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: a CQ from ibv_create_cq, or NULL.
            let Some(rust) = (unsafe { cq_ref(cq) }) else {
                return libc::EINVAL;
            };
            let Ok(cqe) = u32::try_from(cqe) else {
                return libc::EINVAL;
            };
            match rust.resize(cqe) {
                Ok(()) => {
                    // SAFETY: live (checked above).
                    unsafe { (*cq).cqe = rust.cqe() as c_int };
                    0
                }
                Err(e) => errno_of(&e),
            }
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_destroy_cq`: waits until every completion event read from it
    /// was acknowledged; EBUSY while QPs use it.
    pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
        guard(libc::EIO, || {
            if cq.is_null() {
                return libc::EINVAL;
            }
            let w = cq.cast::<Cq>();
            // SAFETY: a CQ from ibv_create_cq, not destroyed.
            let wr = unsafe { &*w };
            let forced = || {
                wr.device.is_disassociated() && rverbs::allow_disassoc_destroy()
            };
            loop {
                if forced() {
                    // The events go with the CQ; no one will acknowledge them.
                    lock(&wr.pending).clear();
                }
                {
                    let mut pending = lock(&wr.pending);
                    while !pending.is_empty() {
                        pending = wr.acked.wait(pending).unwrap_or_else(|p| p.into_inner());
                    }
                }
                // SAFETY: as above.
                match unsafe { destroy_in_place(ptr::addr_of_mut!((*w).rust), CompletionQueue::destroy) } {
                    Ok(()) => break,
                    Err(libc::EBUSY) => {
                        // An event read by another thread and not yet
                        // handed over, or an async event of the CQ: wait for
                        // their acknowledgement as libibverbs does. QPs
                        // still using it: EBUSY.
                        let Some(rust) = wr.rust.as_ref() else {
                            return libc::EINVAL;
                        };
                        let (c_rep, c_ack) = rust.comp_events();
                        let (a_rep, a_ack) = rust.async_events();
                        if c_rep == c_ack && a_rep == a_ack {
                            return libc::EBUSY;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    Err(errno) => return errno,
                }
            }
            // SAFETY: the cell's content is live; set at creation only.
            let channel = unsafe { (*wr.ibv.get()).channel };
            if !channel.is_null() {
                // The channel outlives its CQs (its destroy is refused while
                // refcnt is not 0).
                refcnt(channel).fetch_sub(1, Ordering::AcqRel);
            }
            // SAFETY: made by Box::into_raw; freed once.
            drop(unsafe { Box::from_raw(w) });
            0
        })
    }
}

/// Converts a completion to C's `ibv_wc` (immediate data in network order,
/// an invalidated rkey in host order).
fn c_wc(wc: &WorkCompletion) -> ibv_wc {
    let mut out = ibv_wc::default();
    out.wr_id = wc.wr_id;
    out.status = wc.status as u32;
    out.opcode = wc.opcode as u32;
    out.vendor_err = wc.vendor_err;
    out.byte_len = wc.byte_len;
    out.imm.imm_data = imm_field(wc);
    out.qp_num = wc.qp_num;
    out.src_qp = wc.src_qp;
    out.wc_flags = wc.wc_flags.bits();
    out.pkey_index = wc.pkey_index;
    out.slid = wc.slid;
    out.sl = wc.sl;
    out.dlid_path_bits = wc.dlid_path_bits;
    out
}

/// `ops.poll_cq` (behind the inline `ibv_poll_cq`): completions written,
/// or -1 on error.
pub(crate) unsafe extern "C" fn poll_cq(
    cq: *mut ibv_cq,
    num_entries: c_int,
    wc: *mut ibv_wc,
) -> c_int {
    guard(-1, || {
        // SAFETY: a CQ from ibv_create_cq, or NULL.
        let Some(rust) = (unsafe { cq_ref(cq) }) else {
            return -1;
        };
        let Ok(want) = usize::try_from(num_entries) else {
            return -1;
        };
        if want > 0 && wc.is_null() {
            return -1;
        }
        let mut buf = [WorkCompletion::default(); 16];
        let mut done = 0;
        while done < want {
            let n = (want - done).min(buf.len());
            let got = match rust.poll(&mut buf[..n]) {
                Ok(got) => got,
                Err(_) => return -1,
            };
            for (i, w) in buf[..got].iter().enumerate() {
                // SAFETY: the caller's array holds num_entries entries and
                // done + i < want = num_entries.
                unsafe { wc.add(done + i).write(c_wc(w)) };
            }
            done += got;
            if got < n {
                break;
            }
        }
        done as c_int
    })
}

/// `ops.req_notify_cq` (behind the inline `ibv_req_notify_cq`).
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a CQ from ibv_create_cq, or NULL.
        let Some(rust) = (unsafe { cq_ref(cq) }) else {
            return libc::EINVAL;
        };
        match rust.req_notify(solicited_only != 0) {
            Ok(()) => 0,
            Err(e) => errno_of(&e),
        }
    })
}
