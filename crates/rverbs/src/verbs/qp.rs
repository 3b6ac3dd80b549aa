//! Queue pairs (`ibv_create_qp`, `ibv_modify_qp`, `ibv_query_qp`,
//! `ibv_post_send`, `ibv_post_recv`, `ibv_destroy_qp`).

use std::fmt;
use std::sync::Arc;

use rverbs_wire::{Psn, RnrTimer};

use crate::attr::{AccessFlags, Gid, Mtu};
use crate::error::{Error, ErrorDetail, ErrorKind, Rejected, Result, Verb};
use crate::qp_attr::{check_transition, AhAttr, QpAttr, QpAttrMask, QpCaps, QpType};
use crate::soft::device::{SoftDevice, PORT_NUM};
use crate::soft::engine::{
    peer_endpoint, AttachError, QpChange, RecvRefusal, SendRefusal, SendRequest, TransportConfig,
};
use crate::soft::qp::QpCore;
use crate::soft::transport::rc::RcConfig;
use crate::soft::transport::ud::{UdConfig, UdDest, UdSendWqe};
use crate::soft::transport::{InlineData, RecvWqe, SendWqe, SgeList, WqeData};
use crate::verbs::cq::CompletionQueue;
use crate::verbs::mw::MemoryWindow;
use crate::verbs::pd::ProtectionDomain;
use crate::verbs::srq::SharedReceiveQueue;
use crate::wr::{inc_rkey, MwBind, MwType, Payload, QpState, RecvWr, SendFlags, SendWr, WrOpcode};

/// Most bytes of inline data a send WR may carry.
pub const MAX_INLINE_DATA: u32 = 512;

/// Bytes of a scatter/gather element in a WQE (`struct ibv_sge`): a QP's
/// inline room is at least this much per send SGE.
const SGE_BYTES: u32 = 16;
/// Largest message (the port's `max_msg_sz`).
const MAX_MSG: u64 = crate::soft::transport::MAX_MSG_SZ as u64;

/// Builds a QP (`struct ibv_qp_init_attr`).
#[must_use]
pub struct QpBuilder<'a> {
    pd: &'a ProtectionDomain,
    send_cq: &'a CompletionQueue,
    recv_cq: &'a CompletionQueue,
    qp_type: QpType,
    caps: QpCaps,
    sq_sig_all: bool,
    user_data: u64,
    srq: Option<&'a SharedReceiveQueue>,
}

impl<'a> QpBuilder<'a> {
    pub(crate) fn new(
        pd: &'a ProtectionDomain,
        send_cq: &'a CompletionQueue,
        recv_cq: &'a CompletionQueue,
    ) -> Self {
        QpBuilder {
            pd,
            send_cq,
            recv_cq,
            qp_type: QpType::Rc,
            caps: QpCaps {
                max_send_wr: 128,
                max_recv_wr: 128,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
            user_data: 0,
            srq: None,
        }
    }

    /// The transport (RC; UC and UD come later).
    pub fn qp_type(mut self, ty: QpType) -> Self {
        self.qp_type = ty;
        self
    }

    /// Queue sizes (default 128 WRs each way, one SGE, no inline data).
    pub fn caps(mut self, caps: QpCaps) -> Self {
        self.caps = caps;
        self
    }

    /// Takes receive WRs from `srq` instead of a receive queue of its own
    /// (`max_recv_wr` and `max_recv_sge` are then ignored and read back 0).
    pub fn srq(mut self, srq: &'a SharedReceiveQueue) -> Self {
        self.srq = Some(srq);
        self
    }

    /// Every send WR generates a completion, signaled or not.
    pub fn sq_sig_all(mut self, on: bool) -> Self {
        self.sq_sig_all = on;
        self
    }

    /// A value returned with every async event of this QP (`qp_context`).
    pub fn user_data(mut self, user_data: u64) -> Self {
        self.user_data = user_data;
        self
    }

    /// Creates the QP, in RESET.
    pub fn build(self) -> Result<QueuePair> {
        let verb = Verb::CreateQp;
        let pd = &self.pd.core;
        let ctx = &pd.ctx;
        let dev = &ctx.device;
        dev.check_alive(verb)?;
        let cqs = [self.send_cq, self.recv_cq].map(|cq| ("CQ", &cq.core.ctx, cq.handle()));
        let srq = self.srq.map(|srq| ("SRQ", &srq.core.ctx, srq.handle()));
        for (what, owner, handle) in cqs.into_iter().chain(srq) {
            if !Arc::ptr_eq(owner, ctx) {
                return Err(Error::invalid(
                    verb,
                    format!(
                        "{what} {handle} belongs to another context than PD {}",
                        pd.handle
                    ),
                ));
            }
        }
        let a = &dev.attr;
        let mut c = self.caps;
        if self.srq.is_some() {
            c.max_recv_wr = 0;
            c.max_recv_sge = 0;
        }
        let checks = [
            (c.max_send_wr, a.max_qp_wr, "max_send_wr", "max_qp_wr"),
            (c.max_recv_wr, a.max_qp_wr, "max_recv_wr", "max_qp_wr"),
            (c.max_send_sge, a.max_sge, "max_send_sge", "max_sge"),
            (c.max_recv_sge, a.max_sge, "max_recv_sge", "max_sge"),
            (
                c.max_inline_data,
                MAX_INLINE_DATA,
                "max_inline_data",
                "the inline limit",
            ),
        ];
        for (value, limit, what, of) in checks {
            if value > limit {
                return Err(Error::invalid(
                    verb,
                    format!("{what} {value} exceeds {of} {limit}"),
                ));
            }
        }
        // The inline room is at least what the send SGEs take in a WQE
        // (16 bytes each), as kernel rxe and the mlx providers report it:
        // programs post that much inline on a QP that asked for none.
        c.max_inline_data = c
            .max_inline_data
            .max(c.max_send_sge.saturating_mul(SGE_BYTES))
            .min(MAX_INLINE_DATA);
        if !dev.qps.try_acquire() {
            return Err(Error::new(
                verb,
                ErrorKind::OutOfMemory,
                format!("device {} has max_qp = {} QPs already", dev.name, a.max_qp),
            ));
        }
        // Whether the QP's object was made: its drop gives the quota back.
        let made = std::cell::Cell::new(false);
        let added = dev.engine.add_qp(c, |qpn| {
            made.set(true);
            QpCore::new(
                qpn,
                self.qp_type,
                ctx,
                pd,
                &self.send_cq.core,
                &self.recv_cq.core,
                self.srq.map(|s| &s.core),
                c,
                self.sq_sig_all,
                self.user_data,
            )
        });
        let Ok(core) = added else {
            // The engine failed meanwhile (the device is gone).
            if !made.get() {
                dev.qps.release();
            }
            return Err(dev.gone_error(verb));
        };
        dev.start_engine();
        Ok(QueuePair { core, owned: true })
    }
}

/// The EIO of a QP verb the engine could not run: the QP is gone from it,
/// or the engine failed (the device is gone; the error says so).
fn qp_gone(dev: &SoftDevice, verb: Verb) -> Error {
    if dev.has_failed() {
        dev.gone_error(verb)
    } else {
        Error::new(verb, ErrorKind::Io, "QP is gone")
    }
}

/// A queue pair.
///
/// It keeps its PD, CQs and context alive. Dropping it destroys it (work
/// still outstanding is dropped unreported, as `ibv_destroy_qp` does);
/// [`destroy`](Self::destroy) does the same and reports errors.
pub struct QueuePair {
    pub(crate) core: Arc<QpCore>,
    /// Dropping it destroys the QP (false for the connection manager's
    /// [`view`](Self::view) of a QP its user owns).
    owned: bool,
}

impl QueuePair {
    /// A second handle on this QP that does not own it: the verbs work
    /// through it (until the owner destroys the QP: then they fail as on
    /// a destroyed QP), and dropping it destroys nothing. The connection
    /// manager keeps one of the QP an id connects.
    pub(crate) fn view(&self) -> QueuePair {
        QueuePair {
            core: Arc::clone(&self.core),
            owned: false,
        }
    }

    /// The QP number (24 bits, never 0 or 1, unique on the device).
    pub fn qp_num(&self) -> u32 {
        self.core.qpn
    }

    /// The QP's handle (unique on the device).
    pub fn handle(&self) -> u64 {
        self.core.handle
    }

    /// The transport.
    pub fn qp_type(&self) -> QpType {
        self.core.qp_type
    }

    /// Queue sizes.
    pub fn caps(&self) -> QpCaps {
        self.core.caps
    }

    /// The user data it was created with.
    pub fn user_data(&self) -> u64 {
        self.core.user_data
    }

    /// The current state (the transport moves to ERR on its own on errors).
    pub fn state(&self) -> QpState {
        let dev = &self.core.ctx.device;
        dev.engine.qp_state(self.core.qpn).unwrap_or(QpState::Err)
    }

    /// Async events (reported, acknowledged) so far.
    pub fn async_events(&self) -> (u32, u32) {
        self.core.async_events.totals()
    }

    /// Changes state and attributes (`ibv_modify_qp`). The transition must
    /// exist for the QP type and `mask` must hold exactly the attributes it
    /// requires plus any it allows; otherwise EINVAL with an
    /// [`ErrorDetail::Transition`] naming the problem. A move to RESET
    /// takes the QP's completions out of its CQs (the flushes of an error
    /// it is reset from, say), as mlx5's provider does (the kernel's
    /// Soft-RoCE leaves them).
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let verb = Verb::ModifyQp;
        let core = &self.core;
        let dev = &core.ctx.device;
        dev.check_alive(verb)?;
        if core.is_released() {
            // Only a view (the connection manager's) outlives its QP.
            return Err(Error::invalid(
                verb,
                format!("QP {:#x} was destroyed", core.qpn),
            ));
        }
        let from = self.state();
        if mask.contains(QpAttrMask::CUR_STATE) && attr.cur_qp_state != from {
            return Err(Error::invalid(
                verb,
                format!(
                    "cur_qp_state is {} but QP {:#x} is in {}",
                    attr.cur_qp_state.name(),
                    core.qpn,
                    from.name()
                ),
            ));
        }
        let to = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
        } else {
            from
        };
        check_transition(core.qp_type, from, to, mask).map_err(|e| {
            let msg = match e {
                crate::qp_attr::TransitionError::Invalid { from, to } => {
                    format!("no transition from {} to {}", from.name(), to.name())
                }
                crate::qp_attr::TransitionError::Missing(m) => {
                    format!("{} → {} needs {:?}", from.name(), to.name(), m)
                }
                crate::qp_attr::TransitionError::Forbidden(m) => {
                    format!("{} → {} does not take {:?}", from.name(), to.name(), m)
                }
            };
            Error::invalid(verb, msg).with_detail(ErrorDetail::Transition(e))
        })?;
        self.check_values(attr, mask)?;

        // Merge the attributes given into those the QP has.
        let merged = {
            let mut cur = *core.attr();
            merge(&mut cur, attr, mask);
            cur.qp_state = to;
            cur
        };
        let config = match core.qp_type {
            QpType::Ud => TransportConfig::Ud(UdConfig {
                qpn: core.qpn,
                pd: core.pd.handle,
                qkey: merged.qkey,
                mtu: dev.port.active_mtu.bytes(),
                pkey: 0xffff,
                sq_psn: Psn::new(merged.sq_psn),
            }),
            _ => TransportConfig::Rc(self.rc_config(&merged)),
        };
        let change = QpChange {
            from,
            to,
            config,
            srq: core.srq.as_ref().map(|s| s.queue.clone()),
            peer: peer_endpoint(merged.ah_attr.dgid.to_ip()),
            sets_av: mask.contains(QpAttrMask::AV),
            sqd_notify: mask.contains(QpAttrMask::EN_SQD_ASYNC_NOTIFY) && attr.en_sqd_async_notify,
        };
        match dev.engine.modify_qp(core.qpn, change) {
            None => return Err(qp_gone(dev, verb)),
            // The transport moved the QP (to ERR) since `from` was read:
            // the transition checked is then not this one.
            Some(Err(now_in)) => {
                return Err(Error::invalid(
                    verb,
                    format!(
                        "QP {:#x} went from {} to {} meanwhile",
                        core.qpn,
                        from.name(),
                        now_in.name()
                    ),
                ))
            }
            Some(Ok(())) => {}
        }
        if to == QpState::Reset && from != QpState::Reset {
            // Its completions still in its CQs go (flushes of an error
            // before, above all): what the QP does after RESET starts
            // afresh, as mlx5's provider cleans its CQs on RESET.
            core.send_cq.purge_qp(core.qpn);
            core.recv_cq.purge_qp(core.qpn);
        }
        *core.attr() = merged;
        Ok(())
    }

    fn check_values(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let verb = Verb::ModifyQp;
        let dev = &self.core.ctx.device;
        let bad = |msg: String| Err(Error::invalid(verb, msg));
        if mask.contains(QpAttrMask::PORT) && attr.port_num != PORT_NUM {
            return bad(format!("port {} does not exist", attr.port_num));
        }
        if mask.contains(QpAttrMask::PKEY_INDEX) && attr.pkey_index >= dev.port.pkey_tbl_len {
            return bad(format!(
                "pkey_index {} is not below pkey_tbl_len",
                attr.pkey_index
            ));
        }
        if mask.contains(QpAttrMask::AV) {
            let av = &attr.ah_attr;
            if av.dgid.to_ip().is_multicast() {
                return bad(format!("dgid {} is not a unicast RoCEv2 address", av.dgid));
            }
            crate::verbs::ah::check_ah_attr(dev, verb, av)?;
        }
        // A path MTU up to the port's max_mtu is the application's choice,
        // as on kernel Soft-RoCE and NICs, even above the active MTU the
        // link allows: packets that do not fit the link are then refused by
        // the kernel (counted as `tx_too_big`) and the QP ends in
        // RETRY_EXC_ERR, where rxe retries for ever.
        if mask.contains(QpAttrMask::PATH_MTU) && attr.path_mtu > dev.port.max_mtu {
            return bad(format!(
                "path_mtu {} exceeds the port's max MTU {}",
                attr.path_mtu.bytes(),
                dev.port.max_mtu.bytes()
            ));
        }
        if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC)
            && u32::from(attr.max_rd_atomic) > dev.attr.max_qp_init_rd_atom
        {
            return bad(format!(
                "max_rd_atomic {} exceeds max_qp_init_rd_atom",
                attr.max_rd_atomic
            ));
        }
        if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC)
            && u32::from(attr.max_dest_rd_atomic) > dev.attr.max_qp_rd_atom
        {
            return bad(format!(
                "max_dest_rd_atomic {} exceeds max_qp_rd_atom",
                attr.max_dest_rd_atomic
            ));
        }
        let limits = [
            (QpAttrMask::TIMEOUT, u32::from(attr.timeout), 31, "timeout"),
            (
                QpAttrMask::RETRY_CNT,
                u32::from(attr.retry_cnt),
                7,
                "retry_cnt",
            ),
            (
                QpAttrMask::RNR_RETRY,
                u32::from(attr.rnr_retry),
                7,
                "rnr_retry",
            ),
            (
                QpAttrMask::MIN_RNR_TIMER,
                u32::from(attr.min_rnr_timer),
                31,
                "min_rnr_timer",
            ),
            (
                QpAttrMask::DEST_QPN,
                attr.dest_qp_num,
                0xff_ffff,
                "dest_qp_num",
            ),
            (QpAttrMask::RQ_PSN, attr.rq_psn, 0xff_ffff, "rq_psn"),
            (QpAttrMask::SQ_PSN, attr.sq_psn, 0xff_ffff, "sq_psn"),
        ];
        for (flag, value, max, name) in limits {
            if mask.contains(flag) && value > max {
                return bad(format!("{name} {value} exceeds {max}"));
            }
        }
        let allowed = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC
            | AccessFlags::MW_BIND;
        if mask.contains(QpAttrMask::ACCESS_FLAGS) && !allowed.contains(attr.qp_access_flags) {
            return bad(format!(
                "qp_access_flags {:?} holds flags a QP does not take",
                attr.qp_access_flags
            ));
        }
        Ok(())
    }

    fn rc_config(&self, a: &QpAttr) -> RcConfig {
        RcConfig {
            transport: match self.core.qp_type {
                QpType::Uc => rverbs_wire::Transport::Uc,
                _ => rverbs_wire::Transport::Rc,
            },
            qpn: self.core.qpn,
            dest_qpn: a.dest_qp_num,
            pd: self.core.pd.handle,
            mtu: a.path_mtu.bytes(),
            sq_psn: Psn::new(a.sq_psn),
            rq_psn: Psn::new(a.rq_psn),
            timeout: RcConfig::timeout_for(a.timeout),
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            min_rnr_timer: RnrTimer::new(a.min_rnr_timer),
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            access: a.qp_access_flags,
            pkey: 0xffff,
            max_window: self.core.ctx.device.engine.window_limit(a.path_mtu.bytes()),
        }
    }

    /// The QP's attributes (`ibv_query_qp`): those last set, with the state
    /// the QP is really in.
    pub fn query(&self) -> Result<QpAttr> {
        self.core.ctx.device.check_alive(Verb::QueryQp)?;
        let dev = &self.core.ctx.device;
        let (state, draining) = dev
            .engine
            .query_qp(self.core.qpn)
            .unwrap_or((QpState::Err, false));
        let mut attr = *self.core.attr();
        attr.qp_state = state;
        attr.cur_qp_state = state;
        attr.sq_draining = draining;
        attr.cap = self.core.caps;
        Ok(attr)
    }

    /// Posts one send WR (`ibv_post_send`).
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<()> {
        self.post_send_list(std::slice::from_ref(wr))
    }

    /// Posts send WRs in order. On a refused WR the error carries
    /// [`ErrorDetail::BadWr`] with its index; the WRs before it were posted.
    /// A full send queue is ENOMEM; too many SGEs, too much inline data or a
    /// QP not yet in RTS is EINVAL. Bad lkeys and lengths surface as
    /// completion errors (LOC_PROT_ERR, LOC_LEN_ERR), as in libibverbs.
    pub fn post_send_list(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.post_sends(wrs, false)
    }

    /// Posts send WRs in order, all or none: if any is refused (the error
    /// carries its [`ErrorDetail::BadWr`] index), none was posted — what
    /// `ibv_wr_complete` promises for a batch.
    pub fn post_send_all(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.post_sends(wrs, true)
    }

    fn post_sends(&self, wrs: &[SendWr<'_>], all: bool) -> Result<()> {
        let verb = Verb::PostSend;
        let core = &self.core;
        let caps = core.caps;
        // The engine checks each WR's arguments with `prepare`, after its
        // checks of the QP's state and room.
        let prepare = |wr: &SendWr<'_>| match core.qp_type {
            QpType::Ud => self.prepare_ud(wr),
            _ => self.prepare_rc(wr),
        };
        let refused = match core
            .ctx
            .device
            .engine
            .post_send(core.qpn, wrs, prepare, all)
        {
            None => return Err(qp_gone(&core.ctx.device, verb)),
            Some(Ok(())) => return Ok(()),
            Some(Err(refused)) => refused,
        };
        let (index, why) = refused;
        let (kind, msg) = match why {
            SendRefusal::NotReady(state) => (
                ErrorKind::InvalidArgument,
                format!(
                    "QP {:#x} is in {}; send WRs need RTS",
                    core.qpn,
                    state.name()
                ),
            ),
            SendRefusal::QueueFull => (
                ErrorKind::OutOfMemory,
                format!("send queue full ({} WRs)", caps.max_send_wr),
            ),
            SendRefusal::TooManyInFlight => (
                ErrorKind::OutOfMemory,
                "the send WRs posted and not yet completed span 2^23 packets; \
                 poll completions first"
                    .into(),
            ),
            SendRefusal::MessageTooLong(length) => (
                ErrorKind::InvalidArgument,
                format!(
                    "a message of {length} bytes needs more than 2^23 packets at this path MTU"
                ),
            ),
            SendRefusal::Invalid((kind, msg)) => (kind, msg),
        };
        Err(Error::new(verb, kind, msg).with_detail(ErrorDetail::BadWr { index }))
    }

    /// Binds the type 1 memory window `mw` as `bind` says (`ibv_bind_mw`):
    /// posted as a send WR, which completes as BIND_MW (signaled if `bind`
    /// asks, or the QP signals all), or with MW_BIND_ERR when the device
    /// refuses the bind (the QP then goes to ERR). Returns the rkey the
    /// window has once the bind completes (its low 8 bits counted up, as
    /// libibverbs' providers do). EINVAL for a type 2 window (bound with a
    /// [`WrOpcode::BindMw`] send WR instead) or a zero-based one, EPERM for
    /// an MR in another PD than the window; otherwise as
    /// [`post_send`](Self::post_send).
    pub fn bind_mw(&self, mw: &MemoryWindow, bind: &MwBind) -> Result<u32> {
        let verb = Verb::BindMw;
        let dev = &self.core.ctx.device;
        dev.check_alive(verb)?;
        if mw.mw_type() != MwType::Type1 {
            return Err(Error::invalid(
                verb,
                "ibv_bind_mw binds type 1 windows; bind a type 2 window with a BIND_MW send WR",
            ));
        }
        if bind.info.access.contains(AccessFlags::ZERO_BASED) {
            return Err(Error::invalid(
                verb,
                "a type 1 memory window cannot be zero-based",
            ));
        }
        if bind.info.length > 0 {
            if let Ok(mr) = dev.mrs.mr(bind.info.mr_lkey) {
                let mr_pd = mr.read().pd;
                if mr_pd != mw.pd_handle() {
                    return Err(Error::new(
                        verb,
                        ErrorKind::PermissionDenied,
                        format!(
                            "the MR is in PD {mr_pd}, the memory window in PD {}",
                            mw.pd_handle()
                        ),
                    ));
                }
            }
        }
        let mw_rkey = mw.rkey();
        let rkey = inc_rkey(mw_rkey);
        let wr = SendWr {
            wr_id: bind.wr_id,
            opcode: WrOpcode::BindMw {
                mw_rkey,
                rkey,
                info: bind.info,
            },
            payload: Payload::Sges(&[]),
            flags: bind.flags & (SendFlags::SIGNALED | SendFlags::FENCE),
            ud: None,
        };
        self.post_send(&wr).map_err(|e| {
            let mut out = Error::new(verb, e.kind(), e.message().to_string());
            if let Some(d) = e.detail() {
                out = out.with_detail(d);
            }
            out
        })?;
        Ok(rkey)
    }

    /// Checks an RC or UC send WR's arguments and makes its WQE (the engine
    /// checks the PSNs it takes).
    fn prepare_rc(&self, wr: &SendWr<'_>) -> std::result::Result<SendRequest, (ErrorKind, String)> {
        let core = &self.core;
        let bad = |msg: String| Err((ErrorKind::InvalidArgument, msg));
        let uc = core.qp_type == QpType::Uc;
        match wr.opcode {
            WrOpcode::LocalInv { .. } if uc => {
                return bad("LOCAL_INV is posted on RC QPs (as rxe)".into());
            }
            WrOpcode::SendWithInv { .. } if uc => {
                return bad("UC has no SEND with Invalidate".into());
            }
            WrOpcode::BindMw { .. } | WrOpcode::LocalInv { .. } => {
                // Local operations carry no data: the scatter list is ignored.
                let wqe = self.send_wqe(wr, WqeData::Sges(SgeList::new()), 0);
                return Ok(SendRequest::Rc(wqe));
            }
            _ => {}
        }
        let is_rd_atomic = matches!(
            wr.opcode,
            WrOpcode::RdmaRead { .. }
                | WrOpcode::AtomicCmpAndSwp { .. }
                | WrOpcode::AtomicFetchAndAdd { .. }
        );
        let atomic_write = matches!(wr.opcode, WrOpcode::AtomicWrite { .. });
        if (is_rd_atomic || atomic_write) && core.qp_type == QpType::Uc {
            return bad("UC QPs carry no READs, atomics or ATOMIC WRITEs".into());
        }
        if atomic_write {
            // Its 8 bytes travel in the opcode; the requester sends them
            // from there.
            let carries = match wr.payload {
                Payload::Sges(sges) => !sges.is_empty(),
                Payload::Inline(data) => !data.is_empty(),
            };
            if carries {
                return bad(
                    "an ATOMIC WRITE carries its 8 bytes in WrOpcode::AtomicWrite's value; \
                     its payload must be empty"
                        .into(),
                );
            }
            return Ok(SendRequest::Rc(self.send_wqe(
                wr,
                WqeData::Sges(SgeList::new()),
                8,
            )));
        }
        let (data, length) = match wr_payload(wr, core.caps, is_rd_atomic) {
            Ok(p) => p,
            Err(msg) => return bad(msg),
        };
        if length > MAX_MSG {
            return bad(format!(
                "message of {length} bytes exceeds max_msg_sz {MAX_MSG}"
            ));
        }
        let atomic = matches!(
            wr.opcode,
            WrOpcode::AtomicCmpAndSwp { .. } | WrOpcode::AtomicFetchAndAdd { .. }
        );
        if atomic && length != 8 {
            return bad(format!(
                "an atomic needs an 8-byte local buffer, not {length} bytes"
            ));
        }
        Ok(SendRequest::Rc(self.send_wqe(wr, data, length as u32)))
    }

    /// The WQE of checked send WR `wr` carrying `data` (`length` bytes):
    /// signaled if the WR asks or the QP signals all.
    fn send_wqe(&self, wr: &SendWr<'_>, data: WqeData, length: u32) -> SendWqe {
        SendWqe {
            wr_id: wr.wr_id,
            op: wr.opcode,
            data,
            length,
            signaled: self.core.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED),
            solicited: wr.flags.contains(SendFlags::SOLICITED),
            fence: wr.flags.contains(SendFlags::FENCE),
        }
    }

    /// Checks a UD send — SEND or SEND with immediate, to the QP its
    /// [`UdAddress`](crate::UdAddress) names, at most the port's MTU — and
    /// makes its WQE.
    fn prepare_ud(&self, wr: &SendWr<'_>) -> std::result::Result<SendRequest, (ErrorKind, String)> {
        let core = &self.core;
        let mtu = core.ctx.device.port.active_mtu.bytes();
        let bad = |msg: String| Err((ErrorKind::InvalidArgument, msg));
        if !matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm { .. }) {
            return bad("UD QPs only SEND (with or without immediate)".into());
        }
        let Some(to) = wr.ud else {
            return bad("a UD send needs a destination (SendWr::to)".into());
        };
        if !Arc::ptr_eq(&to.ah.core.pd, &core.pd) {
            return bad(format!(
                "AH {} belongs to another PD than QP {:#x}",
                to.ah.handle(),
                core.qpn
            ));
        }
        if to.remote_qpn > 0x00ff_ffff {
            return bad(format!("remote_qpn {:#x} exceeds 24 bits", to.remote_qpn));
        }
        let (data, length) = match wr_payload(wr, core.caps, false) {
            Ok(p) => p,
            Err(msg) => return bad(msg),
        };
        if length > u64::from(mtu) {
            return bad(format!(
                "a UD message is one packet: {length} bytes exceed the MTU {mtu}"
            ));
        }
        let wqe = UdSendWqe {
            // No fence on UD: nothing it sends reads or writes remotely.
            wqe: SendWqe {
                fence: false,
                ..self.send_wqe(wr, data, length as u32)
            },
            dest: UdDest {
                ip: to.ah.core.attr.dgid.to_ip(),
                qpn: to.remote_qpn,
                qkey: to.remote_qkey,
            },
        };
        Ok(SendRequest::Ud(wqe))
    }

    /// Posts one receive WR (`ibv_post_recv`).
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        self.post_recv_list(std::slice::from_ref(wr))
    }

    /// Posts receive WRs in order (a refused one carries
    /// [`ErrorDetail::BadWr`]): EINVAL in RESET or with too many SGEs,
    /// ENOMEM when the receive queue is full.
    pub fn post_recv_list(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let verb = Verb::PostRecv;
        let core = &self.core;
        let dev = &core.ctx.device;
        let caps = core.caps;
        let fail = |index, kind, msg: String| {
            Err(Error::new(verb, kind, msg).with_detail(ErrorDetail::BadWr { index }))
        };
        if core.srq.is_some() && !wrs.is_empty() {
            return fail(
                0,
                ErrorKind::InvalidArgument,
                format!(
                    "QP {:#x} takes its receive WRs from an SRQ: post them there",
                    core.qpn
                ),
            );
        }
        // The engine checks each WR's arguments with `prepare`, after its
        // checks of the QP's state and room.
        let prepare = |wr: &RecvWr<'_>| {
            if wr.sg_list.len() > caps.max_recv_sge as usize {
                return Err(format!(
                    "{} SGEs exceed max_recv_sge {}",
                    wr.sg_list.len(),
                    caps.max_recv_sge
                ));
            }
            Ok(RecvWqe {
                wr_id: wr.wr_id,
                sges: SgeList::from_slice(wr.sg_list),
                length: wr.sg_list.iter().map(|s| u64::from(s.length)).sum(),
                pd: core.pd.handle,
            })
        };
        match dev.engine.post_recv(core.qpn, wrs, prepare) {
            None => Err(qp_gone(dev, verb)),
            Some(Ok(())) => Ok(()),
            Some(Err((index, why))) => match why {
                RecvRefusal::QueueFull => fail(
                    index,
                    ErrorKind::OutOfMemory,
                    format!("receive queue full ({} WRs)", caps.max_recv_wr),
                ),
                RecvRefusal::Invalid(msg) => fail(index, ErrorKind::InvalidArgument, msg),
                RecvRefusal::Reset => fail(
                    index,
                    ErrorKind::InvalidArgument,
                    format!("QP {:#x} is in RESET", core.qpn),
                ),
            },
        }
    }

    /// Destroys the QP (`ibv_destroy_qp`). Fails with EBUSY, handing the QP
    /// back, while it is attached to a multicast group or an
    /// [`AsyncEvent`](crate::AsyncEvent) for it is unacknowledged. (Dropping
    /// it detaches it.)
    pub fn destroy(self) -> Result<(), Rejected<QueuePair>> {
        let core = &self.core;
        let checked = core.ctx.device.may_destroy(Verb::DestroyQp, || {
            let groups = core.ctx.device.engine.groups_of(core.qpn);
            if groups > 0 {
                return Some(format!(
                    "QP {:#x} is attached to {groups} multicast group(s): detach first",
                    core.qpn
                ));
            }
            let qp = format_args!("QP {:#x}", core.qpn);
            core.async_events.unacked_reason("async", qp, "AsyncEvent")
        });
        if let Err(e) = checked {
            return Err(Rejected::new(e, self));
        }
        self.core.release();
        Ok(())
    }

    /// Brings an RC or UC QP in RESET or INIT (receive WRs posted there are
    /// kept) to RTS, connected to `remote` (what
    /// `ibv_rc_pingpong` does by hand): INIT with `opts.access`, RTR with the
    /// remote's GID, QPN and PSN, RTS with `local_psn` (UC takes no timers,
    /// retry counts or READ/atomic depths).
    pub fn connect(
        &self,
        local_psn: u32,
        remote: &crate::cm::Endpoint,
        opts: &crate::cm::ConnectOptions,
    ) -> Result<()> {
        let dev = &self.core.ctx.device;
        let mtu = opts
            .path_mtu
            .unwrap_or(dev.port.active_mtu)
            .min(dev.port.active_mtu);
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: PORT_NUM,
            qp_access_flags: opts.access,
            ..QpAttr::default()
        };
        self.modify(
            &attr,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )?;
        attr.qp_state = QpState::Rtr;
        attr.path_mtu = mtu;
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = remote.psn;
        attr.max_dest_rd_atomic = opts.max_rd_atomic;
        attr.min_rnr_timer = opts.min_rnr_timer;
        attr.ah_attr = AhAttr {
            dgid: remote.gid,
            ..AhAttr::default()
        };
        let rc = self.core.qp_type == QpType::Rc;
        let rc_only = |m: QpAttrMask| if rc { m } else { QpAttrMask::empty() };
        self.modify(
            &attr,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | rc_only(QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER),
        )?;
        attr.qp_state = QpState::Rts;
        attr.sq_psn = local_psn;
        attr.timeout = opts.timeout;
        attr.retry_cnt = opts.retry_cnt;
        attr.rnr_retry = opts.rnr_retry;
        attr.max_rd_atomic = opts.max_rd_atomic;
        self.modify(
            &attr,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | rc_only(
                    QpAttrMask::TIMEOUT
                        | QpAttrMask::RETRY_CNT
                        | QpAttrMask::RNR_RETRY
                        | QpAttrMask::MAX_QP_RD_ATOMIC,
                ),
        )
    }

    /// Attaches this UD QP to the multicast group `mgid` (`ibv_attach_mcast`;
    /// `lid` is unused on RoCE). RoCEv2 maps the group to IP multicast: the
    /// device joins the IPv4 (IPv4-mapped GID) or IPv6 group on its
    /// interface, and every datagram sent to that GID with remote QPN
    /// 0xFFFFFF reaches every attached QP, on every host that joined.
    /// EINVAL for a QP that is not UD or a GID that is not multicast (or of
    /// the other IP family); ENOMEM past `max_mcast_grp` /
    /// `max_mcast_qp_attach`; the host's error (naming the group and the
    /// address) when it cannot join — no multicast route, say.
    pub fn attach_mcast(&self, mgid: Gid, lid: u16) -> Result<()> {
        let _ = lid;
        let verb = Verb::AttachMcast;
        let group = self.check_mcast(verb, mgid)?;
        let dev = &self.core.ctx.device;
        dev.engine
            .attach_mcast(self.core.qpn, group)
            .map_err(|e| match e {
                AttachError::TooManyGroups => Error::new(
                    verb,
                    ErrorKind::OutOfMemory,
                    format!(
                        "device {} is in max_mcast_grp = {} groups already",
                        dev.name, dev.attr.max_mcast_grp
                    ),
                ),
                AttachError::TooManyQps => Error::new(
                    verb,
                    ErrorKind::OutOfMemory,
                    format!(
                        "group {mgid} has max_mcast_qp_attach = {} QPs already",
                        dev.attr.max_mcast_qp_attach
                    ),
                ),
                AttachError::Host(e) => Error::from_io(
                    verb,
                    &e,
                    &format!(
                        "cannot join multicast group {group} on {} (does the host route \
                         multicast on that interface?)",
                        dev.addr
                    ),
                ),
                AttachError::Failed => dev.gone_error(verb),
            })
    }

    /// Detaches this QP from the multicast group `mgid` (`ibv_detach_mcast`):
    /// EINVAL if it was not attached.
    pub fn detach_mcast(&self, mgid: Gid, lid: u16) -> Result<()> {
        let _ = lid;
        let verb = Verb::DetachMcast;
        let group = self.check_mcast(verb, mgid)?;
        let dev = &self.core.ctx.device;
        if dev.engine.detach_mcast(self.core.qpn, group) {
            Ok(())
        } else {
            Err(Error::invalid(
                verb,
                format!("QP {:#x} is not attached to {mgid}", self.core.qpn),
            ))
        }
    }

    fn check_mcast(&self, verb: Verb, mgid: Gid) -> Result<std::net::IpAddr> {
        let dev = &self.core.ctx.device;
        dev.check_alive(verb)?;
        if self.core.qp_type != QpType::Ud {
            return Err(Error::invalid(
                verb,
                format!(
                    "only UD QPs join multicast groups, not {:?}",
                    self.core.qp_type
                ),
            ));
        }
        let ip = mgid.to_ip();
        if !ip.is_multicast() {
            return Err(Error::invalid(
                verb,
                format!("{mgid} is not a multicast GID"),
            ));
        }
        if ip.is_ipv4() != dev.addr.is_ipv4() {
            return Err(Error::invalid(
                verb,
                format!("{mgid} is not of {}'s IP family", dev.addr),
            ));
        }
        Ok(ip)
    }

    /// The GID this QP's packets come from (GID index 0).
    pub fn local_gid(&self) -> Gid {
        self.core.ctx.device.gid
    }

    /// The path MTU in use.
    pub fn path_mtu(&self) -> Mtu {
        self.core.attr().path_mtu
    }
}

/// A send WR's data as the QP keeps it, and its length; an error message
/// (EINVAL) for too many SGEs or too much inline data.
fn wr_payload(
    wr: &SendWr<'_>,
    caps: QpCaps,
    is_rd_atomic: bool,
) -> std::result::Result<(WqeData, u64), String> {
    match wr.payload {
        Payload::Sges(sges) => {
            if sges.len() > caps.max_send_sge as usize {
                return Err(format!(
                    "{} SGEs exceed max_send_sge {}",
                    sges.len(),
                    caps.max_send_sge
                ));
            }
            let len: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
            Ok((WqeData::Sges(SgeList::from_slice(sges)), len))
        }
        Payload::Inline(data) => {
            if is_rd_atomic {
                return Err("READ and atomics cannot carry inline data".into());
            }
            if data.len() > caps.max_inline_data as usize {
                return Err(format!(
                    "{} bytes of inline data exceed max_inline_data {}",
                    data.len(),
                    caps.max_inline_data
                ));
            }
            Ok((
                WqeData::Inline(InlineData::from_slice(data)),
                data.len() as u64,
            ))
        }
    }
}

fn merge(cur: &mut QpAttr, a: &QpAttr, mask: QpAttrMask) {
    use QpAttrMask as M;
    let set = |flag: M| mask.contains(flag);
    if set(M::EN_SQD_ASYNC_NOTIFY) {
        cur.en_sqd_async_notify = a.en_sqd_async_notify;
    }
    if set(M::ACCESS_FLAGS) {
        cur.qp_access_flags = a.qp_access_flags;
    }
    if set(M::PKEY_INDEX) {
        cur.pkey_index = a.pkey_index;
    }
    if set(M::PORT) {
        cur.port_num = a.port_num;
    }
    if set(M::QKEY) {
        cur.qkey = a.qkey;
    }
    if set(M::AV) {
        cur.ah_attr = a.ah_attr;
    }
    if set(M::PATH_MTU) {
        cur.path_mtu = a.path_mtu;
    }
    if set(M::TIMEOUT) {
        cur.timeout = a.timeout;
    }
    if set(M::RETRY_CNT) {
        cur.retry_cnt = a.retry_cnt;
    }
    if set(M::RNR_RETRY) {
        cur.rnr_retry = a.rnr_retry;
    }
    if set(M::RQ_PSN) {
        cur.rq_psn = a.rq_psn;
    }
    if set(M::MAX_QP_RD_ATOMIC) {
        cur.max_rd_atomic = a.max_rd_atomic;
    }
    if set(M::MIN_RNR_TIMER) {
        cur.min_rnr_timer = a.min_rnr_timer;
    }
    if set(M::SQ_PSN) {
        cur.sq_psn = a.sq_psn;
    }
    if set(M::MAX_DEST_RD_ATOMIC) {
        cur.max_dest_rd_atomic = a.max_dest_rd_atomic;
    }
    if set(M::DEST_QPN) {
        cur.dest_qp_num = a.dest_qp_num;
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        if self.owned {
            self.core.release();
        }
    }
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &format_args!("{:#x}", self.core.qpn))
            .field("qp_type", &self.core.qp_type)
            .finish()
    }
}
