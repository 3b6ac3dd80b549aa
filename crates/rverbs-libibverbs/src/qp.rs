//! QPs, SRQs and AHs as C objects, and posting work requests: C's linked
//! lists of `ibv_send_wr` / `ibv_recv_wr` become rverbs work requests, and a
//! refused one is reported through `bad_wr` as libibverbs does.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::Mutex;

use smallvec::SmallVec;

use rverbs::{
    AccessFlags, AddressHandle, AhAttr, ErrorDetail, Gid, Mtu, Payload, QpAttr, QpAttrMask, QpCaps,
    QpState, QpType, QueuePair, RecvWr, SendFlags, SendWr, Sge, SharedReceiveQueue, SrqAttr,
    SrqAttrMask, UdAddress, WrOpcode,
};
use rverbs_ibverbs_abi::abi::*;

use crate::device::context_ref;
use crate::ffi::{errno_of, guard, neg, null};
use crate::objects::{cq_ref, destroy_in_place, destroy_wrapper, pd_ref, wrapper};

/// Fills the ops slots for posting.
pub(crate) fn fill_ops(ops: &mut ibv_context_ops) {
    ops.post_send = Some(post_send);
    ops.post_recv = Some(post_recv);
    ops.post_srq_recv = Some(post_srq_recv);
}

// ---- conversions ------------------------------------------------------

fn qp_state(s: u32) -> Option<QpState> {
    Some(match s {
        IBV_QPS_RESET => QpState::Reset,
        IBV_QPS_INIT => QpState::Init,
        IBV_QPS_RTR => QpState::Rtr,
        IBV_QPS_RTS => QpState::Rts,
        IBV_QPS_SQD => QpState::Sqd,
        IBV_QPS_SQE => QpState::Sqe,
        IBV_QPS_ERR => QpState::Err,
        _ => return None,
    })
}

fn gid_of(g: &ibv_gid) -> Gid {
    // SAFETY: every bit pattern of the union is a valid [u8; 16].
    Gid(unsafe { g.raw })
}

fn ah_attr(a: &ibv_ah_attr) -> Option<AhAttr> {
    // RoCE routes every packet: an address without a GRH cannot be used.
    if a.is_global == 0 {
        return None;
    }
    Some(AhAttr {
        dgid: gid_of(&a.grh.dgid),
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label,
        sl: a.sl,
        port_num: a.port_num,
    })
}

fn c_ah_attr(a: &AhAttr) -> ibv_ah_attr {
    let mut out = ibv_ah_attr::default();
    out.grh.dgid = ibv_gid { raw: *a.dgid.raw() };
    out.grh.sgid_index = a.sgid_index;
    out.grh.hop_limit = a.hop_limit;
    out.grh.traffic_class = a.traffic_class;
    out.grh.flow_label = a.flow_label;
    out.sl = a.sl;
    out.is_global = 1;
    out.port_num = a.port_num;
    out
}

fn caps(c: &ibv_qp_cap) -> QpCaps {
    QpCaps {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

fn c_caps(c: &QpCaps) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// A WR's scatter/gather list: a few entries without a heap allocation.
type SgeVec = SmallVec<[Sge; 4]>;

/// The SGE list of a C work request.
///
/// # Safety
/// `sg_list` must hold `num_sge` entries (or be anything when it is 0).
unsafe fn sges(sg_list: *const ibv_sge, num_sge: c_int) -> Option<SgeVec> {
    let n = usize::try_from(num_sge).ok()?;
    if n == 0 {
        return Some(SgeVec::new());
    }
    if sg_list.is_null() {
        return None;
    }
    // SAFETY: per the caller, sg_list holds num_sge entries.
    let list = unsafe { std::slice::from_raw_parts(sg_list, n) };
    Some(
        list.iter()
            .map(|s| Sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            })
            .collect(),
    )
}

// ---- queue pairs ------------------------------------------------------

/// `ibv_qp` (inside the `ibv_qp_ex` the extended API uses) and its rverbs
/// QP, with the batch of work requests the `wr_*` calls are building.
#[repr(C)]
pub(crate) struct Qp {
    /// `state` and the `wr_*` fields change after creation (interior
    /// mutability: written through raw pointers, by C and by this library,
    /// while `&Qp`s exist).
    pub(crate) ibv: UnsafeCell<ibv_qp_ex>,
    pub(crate) rust: Option<QueuePair>,
    /// Created with send ops (`ibv_create_qp_ex`): `ibv_qp_to_qp_ex` gives
    /// the `ibv_qp_ex`.
    extended: bool,
    /// `sq_sig_all` as created (ibv_query_qp reports it).
    sq_sig_all: bool,
    /// Held from `wr_start` to `wr_complete` / `wr_abort`: the extended
    /// API's critical section, one thread at a time per QP.
    wr_owner: std::sync::atomic::AtomicBool,
    batch: Mutex<Batch>,
}

/// Work requests between `wr_start` and `wr_complete`.
#[derive(Default)]
struct Batch {
    open: bool,
    wrs: Vec<PendingWr>,
    /// A builder call came without a WR to apply to, or with bad values:
    /// `wr_complete` fails with this.
    error: Option<c_int>,
}

/// One work request of a batch.
struct PendingWr {
    wr_id: u64,
    flags: SendFlags,
    opcode: WrOpcode,
    sges: SgeVec,
    inline: Option<Vec<u8>>,
    ud: Option<(*mut ibv_ah, u32, u32)>,
}

unsafe fn qp_ref<'a>(qp: *mut ibv_qp) -> Option<&'a QueuePair> {
    // SAFETY: per the caller: a live QP from ibv_create_qp, or NULL.
    unsafe { wrapper::<_, Qp>(qp) }.and_then(|w| w.rust.as_ref())
}

/// What `ibv_create_qp` and `ibv_create_qp_ex` share.
struct CreateQp {
    pd: *mut ibv_pd,
    qp_context: *mut c_void,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    cap: ibv_qp_cap,
    qp_type: u32,
    sq_sig_all: bool,
    extended: bool,
}

/// Creates a QP; on success `cap` holds the sizes it got.
fn create_qp(c: &mut CreateQp) -> *mut ibv_qp {
    // SAFETY: a PD from ibv_alloc_pd, or NULL.
    let Some(rust_pd) = (unsafe { pd_ref(c.pd) }) else {
        return null(libc::EINVAL);
    };
    let qp_type = match c.qp_type {
        IBV_QPT_RC => QpType::Rc,
        IBV_QPT_UC => QpType::Uc,
        IBV_QPT_UD => QpType::Ud,
        _ => {
            return null(libc::EOPNOTSUPP);
        }
    };
    // SAFETY: CQs from ibv_create_cq (or NULL, refused).
    let (Some(scq), Some(rcq)) = (unsafe { cq_ref(c.send_cq) }, unsafe { cq_ref(c.recv_cq) })
    else {
        return null(libc::EINVAL);
    };
    // SAFETY: an SRQ from ibv_create_srq, or NULL.
    let srq = unsafe { srq_ref(c.srq) };
    if !c.srq.is_null() && srq.is_none() {
        return null(libc::EINVAL);
    }
    let mut ibv = ibv_qp_ex::default();
    let base = &mut ibv.qp_base;
    // SAFETY: pd is live (checked above).
    base.context = unsafe { (*c.pd).context };
    base.qp_context = c.qp_context;
    base.pd = c.pd;
    base.send_cq = c.send_cq;
    base.recv_cq = c.recv_cq;
    base.srq = c.srq;
    base.qp_type = c.qp_type;
    base.state = IBV_QPS_RESET;
    if c.extended {
        fill_wr_ops(&mut ibv);
    }
    let qp = Box::into_raw(Box::new(Qp {
        ibv: UnsafeCell::new(ibv),
        rust: None,
        extended: c.extended,
        sq_sig_all: c.sq_sig_all,
        wr_owner: std::sync::atomic::AtomicBool::new(false),
        batch: Mutex::new(Batch::default()),
    }));
    let mut b = rust_pd
        .qp_builder(scq, rcq)
        .qp_type(qp_type)
        .caps(caps(&c.cap))
        .sq_sig_all(c.sq_sig_all)
        .user_data(qp as u64);
    if let Some(s) = srq {
        b = b.srq(s);
    }
    match b.build() {
        Ok(rust) => {
            c.cap = c_caps(&rust.caps());
            // SAFETY: just made; not handed out yet.
            let w = unsafe { &mut *qp };
            w.ibv.get_mut().qp_base.handle = rust.handle() as u32;
            w.ibv.get_mut().qp_base.qp_num = rust.qp_num();
            w.rust = Some(rust);
            qp.cast()
        }
        Err(e) => {
            // SAFETY: made above, never handed out.
            drop(unsafe { Box::from_raw(qp) });
            null(errno_of(&e))
        }
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_create_qp`: RC, UC or UD; `init_attr->cap` comes back with the
    /// sizes the QP got.
    pub unsafe extern "C" fn ibv_create_qp(pd: *mut ibv_pd, init_attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
        guard(ptr::null_mut(), || {
            // SAFETY: the caller passes a readable ibv_qp_init_attr.
            let Some(attr) = (unsafe { init_attr.as_mut() }) else {
                return null(libc::EINVAL);
            };
            let mut c = CreateQp {
                pd,
                qp_context: attr.qp_context,
                send_cq: attr.send_cq,
                recv_cq: attr.recv_cq,
                srq: attr.srq,
                cap: attr.cap,
                qp_type: attr.qp_type,
                sq_sig_all: attr.sq_sig_all != 0,
                extended: false,
            };
            let qp = create_qp(&mut c);
            attr.cap = c.cap;
            qp
        })
    }
}

/// The send operations the extended API supports.
const SEND_OPS: ibv_qp_create_send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;

/// `verbs_context.create_qp_ex` (behind the inline `ibv_create_qp_ex`): a
/// PD is required; with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS the QP takes the
/// `wr_*` API for the operations above (others: EOPNOTSUPP); XRC, RSS,
/// TSO and create flags are not supported.
pub(crate) unsafe extern "C" fn create_qp_ex(
    _context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard(ptr::null_mut(), || {
        // SAFETY: the caller passes a readable ibv_qp_init_attr_ex.
        let Some(a) = (unsafe { attr.as_mut() }) else {
            return null(libc::EINVAL);
        };
        let known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            return null(libc::EINVAL);
        }
        if a.comp_mask & !known != 0 {
            return null(libc::EOPNOTSUPP);
        }
        let extended = a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
        if extended && a.send_ops_flags & !u64::from(SEND_OPS) != 0 {
            return null(libc::EOPNOTSUPP);
        }
        let mut c = CreateQp {
            pd: a.pd,
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all != 0,
            extended,
        };
        let qp = create_qp(&mut c);
        a.cap = c.cap;
        qp
    })
}

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

export! { "IBVERBS_1.1"
    /// `ibv_modify_qp`: 0 or an errno.
    pub unsafe extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: a QP from ibv_create_qp, or NULL.
            let Some(rust) = (unsafe { qp_ref(qp) }) else {
                return libc::EINVAL;
            };
            // SAFETY: the caller passes a readable ibv_qp_attr.
            let Some(a) = (unsafe { attr.as_ref() }) else {
                return libc::EINVAL;
            };
            let Some(mask) = QpAttrMask::from_bits(attr_mask as u32) else {
                return libc::EINVAL;
            };
            let mut r = QpAttr::default();
            if mask.contains(QpAttrMask::STATE) {
                let Some(s) = qp_state(a.qp_state) else { return libc::EINVAL };
                r.qp_state = s;
            }
            if mask.contains(QpAttrMask::CUR_STATE) {
                let Some(s) = qp_state(a.cur_qp_state) else { return libc::EINVAL };
                r.cur_qp_state = s;
            }
            if mask.contains(QpAttrMask::PATH_MTU) {
                let Some(m) = Mtu::from_raw(a.path_mtu) else { return libc::EINVAL };
                r.path_mtu = m;
            }
            if mask.contains(QpAttrMask::ACCESS_FLAGS) {
                let Some(f) = AccessFlags::from_bits(a.qp_access_flags) else { return libc::EINVAL };
                r.qp_access_flags = f;
            }
            if mask.contains(QpAttrMask::AV) {
                let Some(av) = ah_attr(&a.ah_attr) else { return libc::EINVAL };
                r.ah_attr = av;
            }
            r.qkey = a.qkey;
            r.rq_psn = a.rq_psn;
            r.sq_psn = a.sq_psn;
            r.dest_qp_num = a.dest_qp_num;
            r.cap = caps(&a.cap);
            r.pkey_index = a.pkey_index;
            r.en_sqd_async_notify = a.en_sqd_async_notify != 0;
            r.max_rd_atomic = a.max_rd_atomic;
            r.max_dest_rd_atomic = a.max_dest_rd_atomic;
            r.min_rnr_timer = a.min_rnr_timer;
            r.port_num = a.port_num;
            r.timeout = a.timeout;
            r.retry_cnt = a.retry_cnt;
            r.rnr_retry = a.rnr_retry;
            match rust.modify(&r, mask) {
                Ok(()) => {
                    // SAFETY: live (checked above).
                    unsafe { (*qp).state = rust.state() as u32 };
                    0
                }
                Err(e) => errno_of(&e),
            }
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_query_qp`: fills `attr` and `init_attr`.
    pub unsafe extern "C" fn ibv_query_qp(
        qp: *mut ibv_qp,
        attr: *mut ibv_qp_attr,
        _attr_mask: c_int,
        init_attr: *mut ibv_qp_init_attr,
    ) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: a QP from ibv_create_qp, or NULL.
            let Some(rust) = (unsafe { qp_ref(qp) }) else {
                return libc::EINVAL;
            };
            if attr.is_null() || init_attr.is_null() {
                return libc::EINVAL;
            }
            let q = match rust.query() {
                Ok(q) => q,
                Err(e) => return errno_of(&e),
            };
            let mut a = ibv_qp_attr::default();
            a.qp_state = q.qp_state as u32;
            a.cur_qp_state = q.cur_qp_state as u32;
            a.path_mtu = q.path_mtu as u32;
            a.qkey = q.qkey;
            a.rq_psn = q.rq_psn;
            a.sq_psn = q.sq_psn;
            a.dest_qp_num = q.dest_qp_num;
            a.qp_access_flags = q.qp_access_flags.bits();
            a.cap = c_caps(&q.cap);
            a.ah_attr = c_ah_attr(&q.ah_attr);
            a.pkey_index = q.pkey_index;
            a.en_sqd_async_notify = u8::from(q.en_sqd_async_notify);
            a.sq_draining = u8::from(q.sq_draining);
            a.max_rd_atomic = q.max_rd_atomic;
            a.max_dest_rd_atomic = q.max_dest_rd_atomic;
            a.min_rnr_timer = q.min_rnr_timer;
            a.port_num = q.port_num;
            a.timeout = q.timeout;
            a.retry_cnt = q.retry_cnt;
            a.rnr_retry = q.rnr_retry;
            // SAFETY: live QP; the caller passes writable structs.
            unsafe {
                let c = &(*qp);
                attr.write(a);
                let mut i = ibv_qp_init_attr::default();
                i.qp_context = c.qp_context;
                i.send_cq = c.send_cq;
                i.recv_cq = c.recv_cq;
                i.srq = c.srq;
                i.cap = c_caps(&q.cap);
                i.qp_type = c.qp_type;
                i.sq_sig_all = c_int::from((*qp.cast::<Qp>()).sq_sig_all);
                init_attr.write(i);
                (*qp).state = q.qp_state as u32;
            }
            0
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_destroy_qp`: waits until the QP's async events were
    /// acknowledged; EBUSY while attached to a multicast group.
    pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
        guard(libc::EIO, || {
            if qp.is_null() {
                return libc::EINVAL;
            }
            let w = qp.cast::<Qp>();
            loop {
                // SAFETY: a QP from ibv_create_qp, not destroyed.
                match unsafe { destroy_in_place(ptr::addr_of_mut!((*w).rust), QueuePair::destroy) } {
                    Ok(()) => {
                        // SAFETY: made by Box::into_raw; freed once.
                        drop(unsafe { Box::from_raw(w) });
                        return 0;
                    }
                    Err(libc::EBUSY) => {
                        // SAFETY: refused: the wrapper is intact.
                        let Some(rust) = (unsafe { (*w).rust.as_ref() }) else {
                            return libc::EINVAL;
                        };
                        let (reported, acked) = rust.async_events();
                        if reported == acked {
                            // Attached to a multicast group.
                            return libc::EBUSY;
                        }
                        // As libibverbs: wait for the program to acknowledge
                        // the QP's events.
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    Err(errno) => return errno,
                }
            }
        })
    }
}

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

/// Takes a C send WR apart; the errno when it cannot be posted.
///
/// # Safety
/// `at` must be a valid C send WR; inline data is read straight from the
/// addresses its SGEs name, as libibverbs does.
unsafe fn c_send_wr<'a>(at: *mut ibv_send_wr, qp: &QueuePair) -> Result<CSendWr<'a>, c_int> {
    // SAFETY: per the caller.
    let w = unsafe { &*at };
    // SAFETY: sg_list holds num_sge entries.
    let sges = unsafe { sges(w.sg_list, w.num_sge) }.ok_or(libc::EINVAL)?;
    // SAFETY: a valid WR.
    let (opcode, flags) = unsafe { opcode_and_flags(w) }.ok_or(libc::EINVAL)?;
    let mut inline = SmallVec::new();
    if flags.contains(SendFlags::INLINE) {
        // Checked before anything is read: no copy of an oversized
        // "inline" buffer.
        let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
        if total > u64::from(qp.caps().max_inline_data) {
            return Err(libc::EINVAL);
        }
        for s in sges.iter().filter(|s| s.length > 0) {
            // SAFETY: inline data is read from the program's own memory at
            // the SGE's address, as libibverbs does; the program guarantees
            // it is readable.
            inline.extend_from_slice(unsafe {
                std::slice::from_raw_parts(s.addr as *const u8, s.length as usize)
            });
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

/// Posts the WRs of a C list as one rverbs list — one pass of the engine for
/// the whole list: 0, or the errno with `*bad_wr` at the WR refused (those
/// before it are posted, as libibverbs does).
///
/// # Safety
/// `first` must be a valid list; `bad_wr` writable or NULL.
unsafe fn post_send_chain(
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
    let mut taken: SmallVec<[CSendWr<'_>; 4]> = SmallVec::new();
    let mut refused = None;
    let mut at = first;
    while !at.is_null() {
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

/// `ops.post_send` (behind the inline `ibv_post_send`): 0, or an errno with
/// `*bad_wr` at the WR refused (the ones before it were posted).
unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a QP from ibv_create_qp, or NULL.
        let Some(rust) = (unsafe { qp_ref(qp) }) else {
            if !bad_wr.is_null() {
                // SAFETY: the caller passes a writable pointer slot.
                unsafe { *bad_wr = wr };
            }
            return libc::EINVAL;
        };
        // SAFETY: the caller passes a valid list and a writable bad_wr.
        unsafe { post_send_chain(rust, wr, bad_wr) }
    })
}

/// Posts the WRs of a C receive list with `post` (one rverbs list, one
/// pass of the engine): 0, or the errno with `*bad_wr` at the WR refused
/// (those before it are posted).
///
/// # Safety
/// `first` must be a valid list; `bad_wr` writable or NULL.
unsafe fn post_recv_chain(
    first: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    post: impl FnOnce(&[RecvWr<'_>]) -> rverbs::Result<()>,
) -> c_int {
    let fail = |at: *mut ibv_recv_wr, errno: c_int| {
        if !bad_wr.is_null() {
            // SAFETY: per the caller.
            unsafe { *bad_wr = at };
        }
        errno
    };
    let mut taken: SmallVec<[(*mut ibv_recv_wr, u64, SgeVec); 4]> = SmallVec::new();
    let mut refused = None;
    let mut at = first;
    while !at.is_null() {
        // SAFETY: per the caller.
        let w = unsafe { &*at };
        // SAFETY: sg_list holds num_sge entries.
        match unsafe { sges(w.sg_list, w.num_sge) } {
            Some(list) => taken.push((at, w.wr_id, list)),
            None => {
                refused = Some(at);
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
        Some(at) => fail(at, libc::EINVAL),
        None => 0,
    }
}

/// `ops.post_recv` (behind the inline `ibv_post_recv`).
unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a QP from ibv_create_qp, or NULL.
        let Some(rust) = (unsafe { qp_ref(qp) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the caller passes a valid list and a writable bad_wr.
        unsafe { post_recv_chain(wr, bad_wr, |wrs| rust.post_recv_list(wrs)) }
    })
}

// ---- shared receive queues --------------------------------------------

/// `ibv_srq` and its rverbs SRQ.
#[repr(C)]
pub(crate) struct Srq {
    /// `events_completed` changes after creation (interior mutability).
    pub(crate) ibv: UnsafeCell<ibv_srq>,
    pub(crate) rust: Option<SharedReceiveQueue>,
}

unsafe fn srq_ref<'a>(srq: *mut ibv_srq) -> Option<&'a SharedReceiveQueue> {
    // SAFETY: per the caller: a live SRQ from ibv_create_srq, or NULL.
    unsafe { wrapper::<_, Srq>(srq) }.and_then(|w| w.rust.as_ref())
}

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
unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: an SRQ from ibv_create_srq, or NULL.
        let Some(rust) = (unsafe { srq_ref(srq) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the caller passes a valid list and a writable bad_wr.
        unsafe { post_recv_chain(wr, bad_wr, |wrs| rust.post_recv_list(wrs)) }
    })
}

// ---- address handles --------------------------------------------------

/// `ibv_ah` and its rverbs AH.
#[repr(C)]
pub(crate) struct Ah {
    pub(crate) ibv: ibv_ah,
    pub(crate) rust: Option<AddressHandle>,
}

unsafe fn ah_ref<'a>(ah: *mut ibv_ah) -> Option<&'a AddressHandle> {
    // SAFETY: per the caller: a live AH from ibv_create_ah*, or NULL.
    unsafe { wrapper::<_, Ah>(ah) }.and_then(|w| w.rust.as_ref())
}

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
    // SAFETY: per the caller, 40 readable bytes.
    let bytes = unsafe { std::slice::from_raw_parts(grh.cast::<u8>(), 40) };
    let mut r = rverbs::WorkCompletion::default();
    r.wc_flags = rverbs::WcFlags::from_bits_truncate(wc.wc_flags);
    r.sl = wc.sl;
    AddressHandle::attr_from_wc(&ctx.rust, &r, bytes).map_err(|e| errno_of(&e))
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

// ---- multicast --------------------------------------------------------

export! { "IBVERBS_1.1"
    /// `ibv_attach_mcast`.
    pub unsafe extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: a QP from ibv_create_qp, or NULL; a readable GID.
            let (Some(rust), Some(g)) = (unsafe { qp_ref(qp) }, unsafe { gid.as_ref() }) else {
                return libc::EINVAL;
            };
            match rust.attach_mcast(gid_of(g), lid) {
                Ok(()) => 0,
                Err(e) => errno_of(&e),
            }
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_detach_mcast`.
    pub unsafe extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: a QP from ibv_create_qp, or NULL; a readable GID.
            let (Some(rust), Some(g)) = (unsafe { qp_ref(qp) }, unsafe { gid.as_ref() }) else {
                return libc::EINVAL;
            };
            match rust.detach_mcast(gid_of(g), lid) {
                Ok(()) => 0,
                Err(e) => errno_of(&e),
            }
        })
    }
}

// ---- the extended post API (ibv_wr_*) ----------------------------------

/// Fills the `wr_*` function pointers of a QP made with send ops.
fn fill_wr_ops(q: &mut ibv_qp_ex) {
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
        let mut b = crate::objects::lock(&w.batch);
        // SAFETY: the QP's C struct is live; the program does not write its
        // wr_id / wr_flags during a wr_* call it made.
        f(unsafe { &*w.ibv.get() }, &mut b);
    })
}

/// Starts a new WR of the batch with `opcode`, taking `wr_id` and
/// `wr_flags` from the QP as the API does.
fn begin(qp: *mut ibv_qp_ex, opcode: WrOpcode) {
    with_batch(qp, |q, b| {
        if !b.open {
            b.error.get_or_insert(libc::EINVAL);
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
        let batch = std::mem::take(&mut *crate::objects::lock(&w.batch));
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

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    current(qp, |w| {
        w.inline = None;
        w.sges = smallvec::smallvec![Sge { addr, length, lkey }];
    });
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    guard((), || {
        let Ok(n) = c_int::try_from(num_sge) else {
            return current(qp, |w| w.sges.clear());
        };
        // SAFETY: the caller passes num_sge entries.
        let list = unsafe { sges(sg_list, n) };
        current(qp, |w| {
            w.inline = None;
            w.sges = list.unwrap_or_default();
        });
    })
}

/// Copies inline data from the program's memory now, as the API requires
/// (the buffers may be reused as soon as the call returns).
unsafe fn copy_inline(bufs: &[ibv_data_buf]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in bufs {
        if b.length > 0 && !b.addr.is_null() {
            // SAFETY: the program passes readable buffers of these lengths.
            out.extend_from_slice(unsafe {
                std::slice::from_raw_parts(b.addr.cast::<u8>(), b.length)
            });
        }
    }
    out
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    guard((), || {
        // SAFETY: a readable buffer of `length` bytes.
        let bytes = unsafe { copy_inline(&[ibv_data_buf { addr, length }]) };
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
        let bufs = if num_buf == 0 || buf_list.is_null() {
            &[][..]
        } else {
            // SAFETY: the caller passes num_buf entries.
            unsafe { std::slice::from_raw_parts(buf_list, num_buf) }
        };
        // SAFETY: readable buffers, per the caller.
        let bytes = unsafe { copy_inline(bufs) };
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
