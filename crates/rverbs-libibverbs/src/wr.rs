//! Posting C work request lists: a C linked list of `ibv_send_wr` /
//! `ibv_recv_wr` becomes one rverbs list (one pass of the engine), and a
//! refused WR is reported through `bad_wr` as libibverbs does. The post
//! functions of QPs (`qp.rs`) and SRQs (`srq.rs`) call these.

use std::ffi::c_int;

use smallvec::SmallVec;

use rverbs::{
    ErrorDetail, Payload, QpType, QueuePair, RecvWr, SendFlags, SendWr, UdAddress, WrOpcode,
};
use rverbs_ibverbs_abi::abi::*;

use crate::convert::{bind_mw_op, sges, SgeVec};
use crate::ffi::{copy_from_program, errno_of};
use crate::handles::ah_ref;

/// The operation and flags of a C send WR; `None` for an opcode rverbs
/// does not carry.
///
/// # Safety
/// `wr` must be a valid C send WR.
unsafe fn opcode_and_flags(wr: &ibv_send_wr) -> Option<(WrOpcode, SendFlags)> {
    // SAFETY: the union member read is the one the opcode selects.
    let opcode = unsafe {
        match wr.opcode {
            IBV_WR_SEND => WrOpcode::Send,
            IBV_WR_SEND_WITH_IMM => WrOpcode::SendWithImm {
                imm: u32::from_be(wr.imm.imm_data),
            },
            IBV_WR_RDMA_WRITE => WrOpcode::RdmaWrite {
                remote_addr: wr.wr.rdma.remote_addr,
                rkey: wr.wr.rdma.rkey,
            },
            IBV_WR_RDMA_WRITE_WITH_IMM => WrOpcode::RdmaWriteWithImm {
                remote_addr: wr.wr.rdma.remote_addr,
                rkey: wr.wr.rdma.rkey,
                imm: u32::from_be(wr.imm.imm_data),
            },
            IBV_WR_RDMA_READ => WrOpcode::RdmaRead {
                remote_addr: wr.wr.rdma.remote_addr,
                rkey: wr.wr.rdma.rkey,
            },
            IBV_WR_ATOMIC_CMP_AND_SWP => WrOpcode::AtomicCmpAndSwp {
                remote_addr: wr.wr.atomic.remote_addr,
                rkey: wr.wr.atomic.rkey,
                compare: wr.wr.atomic.compare_add,
                swap: wr.wr.atomic.swap,
            },
            IBV_WR_ATOMIC_FETCH_AND_ADD => WrOpcode::AtomicFetchAndAdd {
                remote_addr: wr.wr.atomic.remote_addr,
                rkey: wr.wr.atomic.rkey,
                add: wr.wr.atomic.compare_add,
            },
            IBV_WR_SEND_WITH_INV => WrOpcode::SendWithInv {
                rkey: wr.imm.invalidate_rkey,
            },
            IBV_WR_LOCAL_INV => WrOpcode::LocalInv {
                rkey: wr.imm.invalidate_rkey,
            },
            IBV_WR_BIND_MW => {
                let bind = &wr.bind_mw_tso.bind_mw;
                // The window and MR are the program's live objects, as
                // ibv_post_send requires.
                bind_mw_op(bind.mw, bind.rkey, &bind.bind_info)?
            }
            // The value comes from the SGEs (see `c_send_wr`).
            IBV_WR_ATOMIC_WRITE => WrOpcode::AtomicWrite {
                remote_addr: wr.wr.rdma.remote_addr,
                rkey: wr.wr.rdma.rkey,
                value: [0; 8],
            },
            _ => return None,
        }
    };
    let mut flags = SendFlags::empty();
    for (c, f) in [
        (IBV_SEND_FENCE, SendFlags::FENCE),
        (IBV_SEND_SIGNALED, SendFlags::SIGNALED),
        (IBV_SEND_SOLICITED, SendFlags::SOLICITED),
        (IBV_SEND_INLINE, SendFlags::INLINE),
    ] {
        if wr.send_flags & c != 0 {
            flags |= f;
        }
    }
    Some((opcode, flags))
}

/// The 8 bytes an `IBV_WR_ATOMIC_WRITE` posted with `ibv_post_send`
/// stores: the bytes its SGEs name, exactly 8 of them (else EINVAL), read
/// from the program's memory at post time as inline data is — rdma-core's
/// rxe provider takes them from the WQE's inline copy of the SGEs (the
/// extended API's `ibv_wr_atomic_write` passes them directly).
///
/// # Safety
/// Each SGE must name `length` readable bytes of the program's memory.
unsafe fn atomic_write_value(sges: &SgeVec) -> Result<[u8; 8], c_int> {
    let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
    if total != 8 {
        return Err(libc::EINVAL);
    }
    let mut value = SmallVec::<[u8; 8]>::new();
    for s in sges.iter().filter(|s| s.length > 0) {
        // SAFETY: per the caller; 8 bytes in all, checked above.
        unsafe {
            copy_from_program(s.addr as *const u8, s.length as usize, |b| {
                value.extend_from_slice(b)
            })
        };
    }
    <[u8; 8]>::try_from(value.as_slice()).map_err(|_| libc::EINVAL)
}

/// One C send WR taken apart: what the rverbs WR borrows.
struct CSendWr<'a> {
    at: *mut ibv_send_wr,
    wr_id: u64,
    opcode: WrOpcode,
    flags: SendFlags,
    sges: SgeVec,
    /// Inline data, copied from the program's memory at post time.
    inline: SmallVec<[u8; 64]>,
    ud: Option<UdAddress<'a>>,
}

/// Takes a C send WR apart; the errno when it cannot be posted. What the
/// WR points at is read only once checked: its SGE array once `num_sge` is
/// within `max_send_sge`, its inline data once the total is within
/// `max_inline_data`.
///
/// # Safety
/// `at` must be a valid C send WR; inline data is read straight from the
/// addresses its SGEs name, as libibverbs does.
unsafe fn c_send_wr<'a>(at: *mut ibv_send_wr, qp: &QueuePair) -> Result<CSendWr<'a>, c_int> {
    // SAFETY: per the caller.
    let w = unsafe { &*at };
    let caps = qp.caps();
    // SAFETY: sg_list holds num_sge entries when there are no more than
    // max_send_sge (sges checks that before reading).
    let sges = unsafe { sges(w.sg_list, w.num_sge, caps.max_send_sge) }.ok_or(libc::EINVAL)?;
    // SAFETY: a valid WR.
    let (mut opcode, flags) = unsafe { opcode_and_flags(w) }.ok_or(libc::EINVAL)?;
    if let WrOpcode::AtomicWrite { value, .. } = &mut opcode {
        // SAFETY: the SGEs name the program's own memory, read as inline
        // data is.
        *value = unsafe { atomic_write_value(&sges) }?;
        return Ok(CSendWr {
            at,
            wr_id: w.wr_id,
            opcode,
            flags: flags - SendFlags::INLINE,
            sges: SgeVec::new(),
            inline: SmallVec::new(),
            ud: None,
        });
    }
    let mut inline = SmallVec::new();
    if flags.contains(SendFlags::INLINE) {
        // Checked before anything is read: no copy of an oversized
        // "inline" buffer.
        let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
        if total > u64::from(caps.max_inline_data) {
            return Err(libc::EINVAL);
        }
        for s in sges.iter().filter(|s| s.length > 0) {
            // SAFETY: inline data is read from the program's own memory at
            // the SGE's address, as libibverbs does; the program guarantees
            // it is readable.
            unsafe {
                copy_from_program(s.addr as *const u8, s.length as usize, |b| {
                    inline.extend_from_slice(b)
                })
            };
        }
    }
    let ud = if qp.qp_type() == QpType::Ud {
        // SAFETY: for UD the `ud` member is the one in use.
        let ud = unsafe { w.wr.ud };
        // SAFETY: an AH from ibv_create_ah, or NULL.
        let ah = unsafe { ah_ref(ud.ah) }.ok_or(libc::EINVAL)?;
        Some(UdAddress {
            ah,
            remote_qpn: ud.remote_qpn,
            remote_qkey: ud.remote_qkey,
        })
    } else {
        None
    };
    Ok(CSendWr {
        at,
        wr_id: w.wr_id,
        opcode,
        flags,
        sges,
        inline,
        ud,
    })
}

/// How many WRs of a C list are taken for a queue of `max_wr`: no list can
/// put more on it, so the walk stops there (ENOMEM at the next WR, as mlx5
/// answers once its queue is full) — a cyclic `next` list ends too. At
/// least one, so that a queue with no room of its own (a QP's receive queue
/// when it has an SRQ) refuses the first WR with the engine's reason.
fn walk_bound(max_wr: u32) -> usize {
    (max_wr as usize).max(1)
}

/// Posts the WRs of a C list as one rverbs list — one pass of the engine for
/// the whole list: 0, or the errno with `*bad_wr` at the WR refused (those
/// before it are posted, as libibverbs does). The walk stops after as many
/// WRs as the send queue holds: ENOMEM at the first one past them.
///
/// # Safety
/// `first` must be a valid list; `bad_wr` writable or NULL.
pub(crate) unsafe fn post_send_chain(
    qp: &QueuePair,
    first: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    let fail = |at: *mut ibv_send_wr, errno: c_int| {
        if !bad_wr.is_null() {
            // SAFETY: the caller passes a writable pointer slot.
            unsafe { *bad_wr = at };
        }
        errno
    };
    let bound = walk_bound(qp.caps().max_send_wr);
    let mut taken: SmallVec<[CSendWr<'_>; 4]> = SmallVec::new();
    let mut refused = None;
    let mut at = first;
    while !at.is_null() {
        if taken.len() == bound {
            refused = Some((at, libc::ENOMEM));
            break;
        }
        // SAFETY: a valid list, per the caller.
        match unsafe { c_send_wr(at, qp) } {
            Ok(c) => taken.push(c),
            Err(errno) => {
                refused = Some((at, errno));
                break;
            }
        }
        // SAFETY: as above.
        at = unsafe { (*at).next };
    }
    let wrs: SmallVec<[SendWr<'_>; 4]> = taken
        .iter()
        .map(|c| SendWr {
            wr_id: c.wr_id,
            opcode: c.opcode,
            payload: if c.flags.contains(SendFlags::INLINE) {
                Payload::Inline(&c.inline)
            } else {
                Payload::Sges(&c.sges)
            },
            flags: c.flags,
            ud: c.ud,
        })
        .collect();
    if let Err(e) = qp.post_send_list(&wrs) {
        let at = match e.detail() {
            Some(ErrorDetail::BadWr { index }) => taken.get(index).map_or(first, |c| c.at),
            _ => first,
        };
        return fail(at, errno_of(&e));
    }
    match refused {
        Some((at, errno)) => fail(at, errno),
        None => 0,
    }
}

/// Posts the WRs of a C receive list with `post` (one rverbs list, one
/// pass of the engine) on a queue of `max_wr` WRs of `max_sge` SGEs: 0, or
/// the errno with `*bad_wr` at the WR refused (those before it are posted).
/// A WR with more than `max_sge` SGEs is EINVAL before its array is read;
/// the walk stops after `max_wr` WRs, ENOMEM at the first past them.
///
/// # Safety
/// `first` must be a valid list; `bad_wr` writable or NULL.
pub(crate) unsafe fn post_recv_chain(
    first: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    max_wr: u32,
    max_sge: u32,
    post: impl FnOnce(&[RecvWr<'_>]) -> rverbs::Result<()>,
) -> c_int {
    let fail = |at: *mut ibv_recv_wr, errno: c_int| {
        if !bad_wr.is_null() {
            // SAFETY: per the caller.
            unsafe { *bad_wr = at };
        }
        errno
    };
    let bound = walk_bound(max_wr);
    let mut taken: SmallVec<[(*mut ibv_recv_wr, u64, SgeVec); 4]> = SmallVec::new();
    let mut refused = None;
    let mut at = first;
    while !at.is_null() {
        if taken.len() == bound {
            refused = Some((at, libc::ENOMEM));
            break;
        }
        // SAFETY: per the caller.
        let w = unsafe { &*at };
        // SAFETY: sg_list holds num_sge entries when there are no more than
        // max_sge (sges checks that before reading).
        match unsafe { sges(w.sg_list, w.num_sge, max_sge) } {
            Some(list) => taken.push((at, w.wr_id, list)),
            None => {
                refused = Some((at, libc::EINVAL));
                break;
            }
        }
        at = w.next;
    }
    let wrs: SmallVec<[RecvWr<'_>; 4]> = taken
        .iter()
        .map(|(_, wr_id, list)| RecvWr::new(*wr_id, list))
        .collect();
    if let Err(e) = post(&wrs) {
        let at = match e.detail() {
            Some(ErrorDetail::BadWr { index }) => taken.get(index).map_or(first, |t| t.0),
            _ => first,
        };
        return fail(at, errno_of(&e));
    }
    match refused {
        Some((at, errno)) => fail(at, errno),
        None => 0,
    }
}
