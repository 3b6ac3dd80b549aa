//! The extended post API of QPs made with send ops (`ibv_qp_ex`):
//! `ibv_qp_to_qp_ex` and the `wr_*` function pointers — `wr_start`, the
//! opcode builders, the SGE / inline / UD address setters, `wr_complete`
//! (all or nothing) and `wr_abort`. The batch they build lives in the QP's
//! wrapper (`handles::Qp`); `qp.rs` makes such QPs.

use std::ffi::{c_int, c_void};
use std::ptr;

use rverbs::{Payload, QpCaps, SendFlags, SendWr, Sge, UdAddress, WrOpcode};
use rverbs_ibverbs_abi::abi::*;

use crate::convert::{bind_mw_op, sges, SgeVec};
use crate::ffi::{copy_from_program, errno_of, guard, lock};
use crate::handles::{ah_ref, wrapper, Batch, PendingWr, Qp};

/// The send operations the extended API supports.
pub(crate) const SEND_OPS: ibv_qp_create_send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_BIND_MW
    | IBV_QP_EX_WITH_SEND_WITH_INV
    | IBV_QP_EX_WITH_ATOMIC_WRITE;

export! { "IBVERBS_1.6"
    /// `ibv_qp_to_qp_ex`: the `ibv_qp_ex` of a QP made with send ops, else
    /// NULL.
    pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
        // SAFETY: a QP from ibv_create_qp*, or NULL.
        match unsafe { wrapper::<_, Qp>(qp) } {
            Some(w) if w.extended => qp.cast(),
            _ => ptr::null_mut(),
        }
    }
}

/// Fills the `wr_*` function pointers of a QP made with send ops.
pub(crate) fn fill_wr_ops(q: &mut ibv_qp_ex) {
    q.wr_start = Some(wr_start);
    q.wr_complete = Some(wr_complete);
    q.wr_abort = Some(wr_abort);
    q.wr_send = Some(wr_send);
    q.wr_send_imm = Some(wr_send_imm);
    q.wr_rdma_write = Some(wr_rdma_write);
    q.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    q.wr_rdma_read = Some(wr_rdma_read);
    q.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    q.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    q.wr_bind_mw = Some(wr_bind_mw);
    q.wr_local_inv = Some(wr_local_inv);
    q.wr_send_inv = Some(wr_send_inv);
    q.wr_atomic_write = Some(wr_atomic_write);
    q.wr_set_sge = Some(wr_set_sge);
    q.wr_set_sge_list = Some(wr_set_sge_list);
    q.wr_set_inline_data = Some(wr_set_inline_data);
    q.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    q.wr_set_ud_addr = Some(wr_set_ud_addr);
}

/// Runs `f` on the batch of the QP behind `qp` (nothing for a NULL or
/// foreign pointer).
fn with_batch(qp: *mut ibv_qp_ex, f: impl FnOnce(&ibv_qp_ex, &mut Batch)) {
    guard((), || {
        // SAFETY: the extended API hands back the ibv_qp_ex of a QP from
        // ibv_create_qp_ex, the first field of its wrapper.
        let Some(w) = (unsafe { wrapper::<_, Qp>(qp) }) else {
            return;
        };
        let mut b = lock(&w.batch);
        // SAFETY: the QP's C struct is live; the program does not write its
        // wr_id / wr_flags during a wr_* call it made.
        f(unsafe { &*w.ibv.get() }, &mut b);
    })
}

/// The sizes of the QP behind `qp` (`None` for a NULL or foreign pointer).
fn caps_of(qp: *mut ibv_qp_ex) -> Option<QpCaps> {
    // SAFETY: as in with_batch.
    let w = unsafe { wrapper::<_, Qp>(qp) }?;
    w.rust.as_ref().map(|r| r.caps())
}

/// Marks the batch failed with `errno` (`wr_complete` reports the first).
fn fail(qp: *mut ibv_qp_ex, errno: c_int) {
    with_batch(qp, |_, b| {
        b.error.get_or_insert(errno);
    });
}

/// Starts a new WR of the batch with `opcode`, taking `wr_id` and
/// `wr_flags` from the QP as the API does. A batch holds at most the send
/// queue's `max_send_wr` WRs: past that, ENOMEM (as mlx5 once its queue is
/// full), and the batch grows no further.
fn begin(qp: *mut ibv_qp_ex, opcode: WrOpcode) {
    let max_wr = caps_of(qp).map_or(0, |c| c.max_send_wr as usize);
    with_batch(qp, |q, b| {
        if !b.open {
            b.error.get_or_insert(libc::EINVAL);
            return;
        }
        if b.wrs.len() >= max_wr {
            b.error.get_or_insert(libc::ENOMEM);
            return;
        }
        let mut flags = SendFlags::empty();
        if q.wr_flags & IBV_SEND_FENCE != 0 {
            flags |= SendFlags::FENCE;
        }
        if q.wr_flags & IBV_SEND_SIGNALED != 0 {
            flags |= SendFlags::SIGNALED;
        }
        if q.wr_flags & IBV_SEND_SOLICITED != 0 {
            flags |= SendFlags::SOLICITED;
        }
        b.wrs.push(PendingWr {
            wr_id: q.wr_id,
            flags,
            opcode,
            sges: SgeVec::new(),
            inline: None,
            ud: None,
        });
    });
}

/// Applies `f` to the WR being built.
fn current(qp: *mut ibv_qp_ex, f: impl FnOnce(&mut PendingWr)) {
    with_batch(qp, |_, b| match b.wrs.last_mut() {
        Some(w) if b.open => f(w),
        _ => {
            b.error.get_or_insert(libc::EINVAL);
        }
    });
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    guard((), || {
        // SAFETY: as in with_batch.
        if let Some(w) = unsafe { wrapper::<_, Qp>(qp) } {
            use std::sync::atomic::Ordering;
            while w
                .wr_owner
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                std::thread::yield_now();
            }
        }
    });
    with_batch(qp, |_, b| {
        *b = Batch {
            open: true,
            ..Batch::default()
        };
    });
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    with_batch(qp, |_, b| *b = Batch::default());
    release_wr(qp);
}

/// Ends the `wr_start` critical section.
fn release_wr(qp: *mut ibv_qp_ex) {
    // SAFETY: as in with_batch.
    if let Some(w) = unsafe { wrapper::<_, Qp>(qp) } {
        w.wr_owner
            .store(false, std::sync::atomic::Ordering::Release);
    }
}

/// Posts the batch, all or nothing: 0, or the errno of the first WR
/// refused (then none was posted).
unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    let r = post_batch(qp);
    release_wr(qp);
    r
}

fn post_batch(qp: *mut ibv_qp_ex) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: as in with_batch.
        let Some(w) = (unsafe { wrapper::<_, Qp>(qp) }) else {
            return libc::EINVAL;
        };
        let Some(rust) = w.rust.as_ref() else {
            return libc::EINVAL;
        };
        let batch = std::mem::take(&mut *lock(&w.batch));
        if !batch.open {
            return libc::EINVAL;
        }
        if let Some(e) = batch.error {
            return e;
        }
        let mut wrs = Vec::with_capacity(batch.wrs.len());
        for p in &batch.wrs {
            let payload = match &p.inline {
                Some(bytes) => Payload::Inline(bytes),
                None => Payload::Sges(&p.sges),
            };
            let mut wr = SendWr {
                wr_id: p.wr_id,
                opcode: p.opcode,
                payload,
                flags: p.flags,
                ud: None,
            };
            if p.inline.is_some() {
                wr.flags |= SendFlags::INLINE;
            }
            if let Some((ah, qpn, qkey)) = p.ud {
                // SAFETY: an AH from ibv_create_ah, or NULL.
                let Some(ah) = (unsafe { ah_ref(ah) }) else {
                    return libc::EINVAL;
                };
                wr.ud = Some(UdAddress {
                    ah,
                    remote_qpn: qpn,
                    remote_qkey: qkey,
                });
            }
            wrs.push(wr);
        }
        // All or nothing, as ibv_wr_complete promises.
        match rust.post_send_all(&wrs) {
            Ok(()) => 0,
            Err(e) => errno_of(&e),
        }
    })
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    begin(qp, WrOpcode::Send);
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm_data: u32) {
    begin(
        qp,
        WrOpcode::SendWithImm {
            imm: u32::from_be(imm_data),
        },
    );
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    begin(qp, WrOpcode::RdmaWrite { remote_addr, rkey });
}

unsafe extern "C" fn wr_rdma_write_imm(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm_data: u32,
) {
    begin(
        qp,
        WrOpcode::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm: u32::from_be(imm_data),
        },
    );
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    begin(
        qp,
        WrOpcode::SendWithInv {
            rkey: invalidate_rkey,
        },
    );
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    begin(
        qp,
        WrOpcode::LocalInv {
            rkey: invalidate_rkey,
        },
    );
}

/// `ibv_wr_bind_mw`: binds window `mw` to `bind_info` under a key with
/// `rkey`'s tag (a bad window or info fails the batch with EINVAL).
unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    bind_info: *const ibv_mw_bind_info,
) {
    guard((), || {
        // SAFETY: the program passes its live window and bind info (whose
        // MR is live), as ibv_wr_bind_mw requires; NULL is refused.
        let op = unsafe { bind_info.as_ref().and_then(|i| bind_mw_op(mw, rkey, i)) };
        match op {
            Some(op) => begin(qp, op),
            None => fail(qp, libc::EINVAL),
        }
    })
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    begin(qp, WrOpcode::RdmaRead { remote_addr, rkey });
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    begin(
        qp,
        WrOpcode::AtomicCmpAndSwp {
            remote_addr,
            rkey,
            compare,
            swap,
        },
    );
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    begin(
        qp,
        WrOpcode::AtomicFetchAndAdd {
            remote_addr,
            rkey,
            add,
        },
    );
}

/// `ibv_wr_atomic_write`: the 8 bytes at `atomic_wr` are copied now (the
/// buffer may be reused as soon as the call returns), as rxe's provider
/// copies them into its WQE; a NULL pointer fails the batch (EINVAL).
unsafe extern "C" fn wr_atomic_write(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
) {
    guard((), || {
        if atomic_wr.is_null() {
            return fail(qp, libc::EINVAL);
        }
        let mut value = [0u8; 8];
        // SAFETY: the API passes 8 readable bytes of the program's memory.
        unsafe { copy_from_program(atomic_wr.cast::<u8>(), 8, |b| value.copy_from_slice(b)) };
        begin(
            qp,
            WrOpcode::AtomicWrite {
                remote_addr,
                rkey,
                value,
            },
        );
    })
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    current(qp, |w| {
        w.inline = None;
        w.sges = smallvec::smallvec![Sge { addr, length, lkey }];
    });
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    guard((), || {
        let max = caps_of(qp).map_or(0, |c| c.max_send_sge);
        // More than max_send_sge entries (or a NULL list with some): EINVAL
        // at wr_complete, the array unread.
        let list = c_int::try_from(num_sge)
            .ok()
            // SAFETY: the caller passes num_sge entries; sges reads them
            // only when there are no more than max.
            .and_then(|n| unsafe { sges(sg_list, n, max) });
        let Some(list) = list else {
            return fail(qp, libc::EINVAL);
        };
        current(qp, |w| {
            w.inline = None;
            w.sges = list;
        });
    })
}

/// Copies inline data from the program's memory now, as the API requires
/// (the buffers may be reused as soon as the call returns): the `num_buf`
/// buffers `bufs` names, once their total is known to fit the QP's
/// `max_inline_data`. More is EINVAL at `wr_complete` and not a byte of
/// data is read (nor an entry of `bufs` past the one that overflowed).
///
/// # Safety
/// `bufs` must hold `num_buf` entries naming readable buffers (or be
/// anything when `num_buf` is 0).
unsafe fn copy_inline(
    qp: *mut ibv_qp_ex,
    bufs: *const ibv_data_buf,
    num_buf: usize,
) -> Option<Vec<u8>> {
    let max = caps_of(qp).map_or(0, |c| c.max_inline_data as usize);
    let mut total = 0usize;
    let mut taken = Vec::new();
    for i in 0..if bufs.is_null() { 0 } else { num_buf } {
        // SAFETY: per the caller, entry i exists.
        let b = unsafe { bufs.add(i).read() };
        total = total.saturating_add(b.length);
        if total > max {
            fail(qp, libc::EINVAL);
            return None;
        }
        taken.push(b);
    }
    let mut out = Vec::with_capacity(total);
    for b in taken {
        if b.length > 0 && !b.addr.is_null() {
            // SAFETY: the program passes readable buffers of these lengths
            // (at most max_inline_data bytes in all).
            unsafe {
                copy_from_program(b.addr.cast::<u8>(), b.length, |p| out.extend_from_slice(p))
            };
        }
    }
    Some(out)
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    guard((), || {
        let buf = ibv_data_buf { addr, length };
        // SAFETY: a readable buffer of `length` bytes.
        let Some(bytes) = (unsafe { copy_inline(qp, &buf, 1) }) else {
            return;
        };
        current(qp, |w| {
            w.sges.clear();
            w.inline = Some(bytes);
        });
    })
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
) {
    guard((), || {
        // SAFETY: num_buf entries of readable buffers, per the caller.
        let Some(bytes) = (unsafe { copy_inline(qp, buf_list, num_buf) }) else {
            return;
        };
        current(qp, |w| {
            w.sges.clear();
            w.inline = Some(bytes);
        });
    })
}

unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    current(qp, |w| w.ud = Some((ah, remote_qpn, remote_qkey)));
}
