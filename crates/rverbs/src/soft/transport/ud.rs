//! Unreliable Datagram: one packet per message (SEND, SEND with immediate)
//! to any UD QP named by an address handle, QP number and Q_Key; no
//! connection, no ACKs. A send WR completes once its packet is out. A
//! receive needs a posted WR (none: the packet is dropped, UD has no RNR)
//! and a matching Q_Key; the payload lands after a 40-byte GRH at the head
//! of the receive buffer — for IPv4 an IPv4 header with the packet's
//! addresses in its last 20 bytes, as rdma-core's `ibv_init_ah_from_wc`
//! reads it — and `byte_len` counts the GRH; `sl` says which (2 = IPv4,
//! 1 = IPv6: mlx5's RoCE L3 header types, which UCX's `ud_verbs` relies
//! on). A send completes once its packet is handed to the engine; a full
//! socket buffer drops it like a lossy network would (UD promises no
//! delivery).
//!
//! Local errors move the QP to SQE (IBTA 10.3.1.6): the failed WR completes
//! with its status, later ones with a flush error, receives go on; modify
//! back to RTS resumes sending.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};

use rverbs_wire::{BthRepr, DethRepr, ImmDtRepr, Opcode, PacketRepr, Psn, Transport};

use super::recv::{RecvQueue, SharedRq};
use super::{
    gather, pkey_matches, scatter_unfaulting, Memory, QpEvent, RecvWqe, RxDrop, SendWqe, TxBuffer,
    WqeData,
};
use crate::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
use crate::wr::{QpState, WrOpcode};

/// Bytes of the GRH at the head of every UD receive buffer.
pub(crate) const GRH_LEN: usize = 40;
/// The QP number that addresses every QP attached to a multicast group.
pub(crate) const MULTICAST_QPN: u32 = 0x00ff_ffff;

/// The parameters of a UD QP, set by modify_qp.
#[derive(Debug, Clone)]
pub(crate) struct UdConfig {
    pub(crate) qpn: u32,
    /// The QP's PD: every local access must be in it.
    pub(crate) pd: u64,
    pub(crate) qkey: u32,
    /// Largest message (the port's active MTU).
    pub(crate) mtu: u32,
    pub(crate) pkey: u16,
    pub(crate) sq_psn: Psn,
}

/// Where a UD send goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UdDest {
    pub(crate) ip: IpAddr,
    pub(crate) qpn: u32,
    /// The Q_Key from the WR (its high bit set: use the QP's own).
    pub(crate) qkey: u32,
}

/// A posted UD send WR.
#[derive(Debug, Clone)]
pub(crate) struct UdSendWqe {
    pub(crate) wqe: SendWqe,
    pub(crate) dest: UdDest,
}

/// Counters of a UD QP.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UdCounters {
    /// Packets dropped for a wrong Q_Key.
    pub(crate) qkey_violations: u64,
    /// Packets dropped because no receive WR was posted.
    pub(crate) no_recv_wr: u64,
}

impl UdCounters {
    /// Adds `other`'s counts.
    pub(crate) fn absorb(&mut self, other: &UdCounters) {
        self.qkey_violations += other.qkey_violations;
        self.no_recv_wr += other.no_recv_wr;
    }
}

/// One UD queue pair's transport state.
pub(crate) struct UdQp {
    cfg: UdConfig,
    state: QpState,
    sq: VecDeque<UdSendWqe>,
    next_psn: Psn,
    rq: RecvQueue,
    /// In SQD: report SQ_DRAINED once the send queue is empty.
    notify_drained: bool,
    pub(crate) counters: UdCounters,
    events: VecDeque<QpEvent>,
}

impl UdQp {
    /// A QP in INIT, taking receive WRs from `srq` if given.
    pub(crate) fn new(cfg: UdConfig, srq: Option<SharedRq>) -> UdQp {
        UdQp {
            next_psn: cfg.sq_psn,
            cfg,
            state: QpState::Init,
            sq: VecDeque::new(),
            rq: RecvQueue::new(srq),
            notify_drained: false,
            counters: UdCounters::default(),
            events: VecDeque::new(),
        }
    }

    /// The QP state.
    pub(crate) fn state(&self) -> QpState {
        self.state
    }

    /// Mutable configuration (Q_Key, P_Key index…).
    pub(crate) fn config_mut(&mut self) -> &mut UdConfig {
        &mut self.cfg
    }

    /// Moves to `to` (RTR, RTS, SQD, back from SQE); RTS from RTR starts
    /// the PSNs at `cfg.sq_psn`.
    pub(crate) fn enter(&mut self, to: QpState, notify_drained: bool) {
        if self.state == QpState::Rtr && to == QpState::Rts {
            self.next_psn = self.cfg.sq_psn;
        }
        self.state = to;
        self.notify_drained = to == QpState::Sqd && notify_drained;
        self.check_drained();
    }

    /// Send WRs waiting.
    pub(crate) fn sq_len(&self) -> usize {
        self.sq.len()
    }

    /// Receive WRs posted to the QP's own queue.
    pub(crate) fn rq_len(&self) -> usize {
        self.rq.own_len()
    }

    /// In SQD: whether WRs that started are still outstanding — never: a
    /// UD WR is done once its packet is out, and in SQD none starts.
    pub(crate) fn sq_draining(&self) -> bool {
        false
    }

    /// Queues a send WR; in ERR or SQE it completes at once with a flush
    /// error.
    pub(crate) fn post_send(&mut self, wqe: UdSendWqe) {
        if matches!(self.state, QpState::Err | QpState::Sqe) {
            let wc = self.send_wc(&wqe.wqe, WcStatus::WrFlushErr);
            self.events.push_back(QpEvent::SendCompletion(wc));
            return;
        }
        self.sq.push_back(wqe);
    }

    /// Queues a receive WR; in ERR it completes at once with a flush error.
    pub(crate) fn post_recv(&mut self, wqe: RecvWqe) {
        if self.state == QpState::Err {
            let wc = super::recv_flush_wc(&wqe, self.cfg.qpn, 0);
            self.events.push_back(QpEvent::RecvCompletion(wc, false));
            return;
        }
        self.rq.push(wqe);
    }

    /// The next completion or event for the engine.
    pub(crate) fn poll_event(&mut self) -> Option<QpEvent> {
        self.events.pop_front()
    }

    /// Whether completions or events wait.
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    fn send_wc(&self, wqe: &SendWqe, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id: wqe.wr_id,
            status,
            opcode: WcOpcode::Send,
            qp_num: self.cfg.qpn,
            ..Default::default()
        }
    }

    /// Moves to ERR: every send and receive WR completes with a flush error
    /// (an SRQ's WRs stay with it: QP_LAST_WQE_REACHED instead).
    pub(crate) fn enter_error(&mut self) {
        if self.state == QpState::Err {
            return;
        }
        self.state = QpState::Err;
        self.flush_sends();
        let qpn = self.cfg.qpn;
        self.rq
            .flush(&mut self.events, |wqe| super::recv_flush_wc(wqe, qpn, 0));
    }

    fn flush_sends(&mut self) {
        while let Some(e) = self.sq.pop_front() {
            let wc = self.send_wc(&e.wqe, WcStatus::WrFlushErr);
            self.events.push_back(QpEvent::SendCompletion(wc));
        }
    }

    /// A local error on the send WR at the head: it completes with
    /// `status`, the rest flush, and the QP goes to SQE.
    fn fail_head(&mut self, status: WcStatus) {
        if let Some(e) = self.sq.pop_front() {
            let wc = self.send_wc(&e.wqe, status);
            self.events.push_back(QpEvent::SendCompletion(wc));
        }
        self.state = QpState::Sqe;
        self.flush_sends();
    }

    fn check_drained(&mut self) {
        if self.state == QpState::Sqd && self.notify_drained {
            self.notify_drained = false;
            self.events
                .push_back(QpEvent::Async(crate::event::AsyncEventType::SqDrained));
        }
    }

    /// Writes the next packet into `tx` and returns its length and
    /// destination, or `None` when nothing is due. The payload is copied
    /// (a UD message is one packet). The ICRC field is left zero.
    pub(crate) fn poll_transmit(
        &mut self,
        mem: &dyn Memory,
        tx: &mut TxBuffer<'_>,
    ) -> Option<(usize, IpAddr)> {
        loop {
            // In SQD no WR starts: they wait for RTS.
            if self.state != QpState::Rts {
                return None;
            }
            let e = self.sq.front()?;
            let imm = match e.wqe.op {
                WrOpcode::Send => None,
                WrOpcode::SendWithImm { imm } => Some(imm),
                // The verbs accept nothing else on UD.
                _ => {
                    self.fail_head(WcStatus::LocQpOpErr);
                    continue;
                }
            };
            if e.wqe.length > self.cfg.mtu {
                self.fail_head(WcStatus::LocLenErr);
                continue;
            }
            let opcode = if imm.is_some() {
                Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
            } else {
                Opcode::UD_SEND_ONLY
            };
            let mut bth = BthRepr::new(opcode, e.dest.qpn, self.next_psn);
            bth.pkey = self.cfg.pkey;
            bth.solicited = e.wqe.solicited;
            let mut p = PacketRepr::new(bth);
            // A Q_Key with its high bit set in a WR means the QP's own.
            let qkey = if e.dest.qkey & 0x8000_0000 != 0 {
                self.cfg.qkey
            } else {
                e.dest.qkey
            };
            p.deth = Some(DethRepr {
                qkey,
                src_qp: self.cfg.qpn,
            });
            p.imm_dt = imm.map(ImmDtRepr);
            let len = e.wqe.length as usize;
            let Ok(total) = p.emit_around_payload(len, tx.bytes) else {
                self.fail_head(WcStatus::LocLenErr);
                continue;
            };
            let start = p.header_len();
            let dst = &mut tx.bytes[start..start + len];
            let copied = match &e.wqe.data {
                WqeData::Inline(data) => {
                    dst.copy_from_slice(&data[..len]);
                    Ok(())
                }
                WqeData::Sges(sges) => gather(mem, self.cfg.pd, sges, 0, dst),
            };
            if copied.is_err() {
                self.fail_head(WcStatus::LocProtErr);
                continue;
            }
            let ip = e.dest.ip;
            self.next_psn = self.next_psn.next();
            if let Some(e) = self.sq.pop_front() {
                if e.wqe.signaled {
                    let wc = self.send_wc(&e.wqe, WcStatus::Success);
                    self.events.push_back(QpEvent::SendCompletion(wc));
                }
            }
            return Some((total, ip));
        }
    }

    /// Handles a packet for this QP (ICRC-checked, parsed), sent from `src`
    /// to `dst` (the local address, or a multicast group).
    pub(crate) fn handle_packet(
        &mut self,
        pkt: &PacketRepr<'_>,
        mem: &dyn Memory,
        src: IpAddr,
        dst: IpAddr,
    ) -> Result<(), RxDrop> {
        let Some(info) = pkt.info() else {
            return Err(RxDrop::WrongTransport);
        };
        if info.transport != Transport::Ud {
            return Err(RxDrop::WrongTransport);
        }
        let receiving = matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        );
        if !receiving {
            return Err(RxDrop::NotReceiving);
        }
        if !pkey_matches(pkt.bth.pkey, self.cfg.pkey) {
            return Err(RxDrop::PKey);
        }
        let Some(deth) = pkt.deth else {
            return Err(RxDrop::WrongTransport);
        };
        // One packet per message, at most the MTU: anything longer is not
        // from a conforming sender.
        if pkt.payload.len() > self.cfg.mtu as usize {
            return Err(RxDrop::TooLong);
        }
        if deth.qkey != self.cfg.qkey {
            self.counters.qkey_violations += 1;
            return Ok(());
        }
        let Some(wqe) = self.rq.pop(&mut self.events) else {
            self.counters.no_recv_wr += 1;
            return Ok(());
        };
        let len = GRH_LEN + pkt.payload.len();
        let mut wc = WorkCompletion {
            wr_id: wqe.wr_id,
            opcode: WcOpcode::Recv,
            qp_num: self.cfg.qpn,
            src_qp: deth.src_qp,
            ..Default::default()
        };
        if (len as u64) > wqe.length {
            wc.status = WcStatus::LocLenErr;
            self.events.push_back(QpEvent::RecvCompletion(wc, false));
            return Ok(());
        }
        let grh = grh_bytes(src, dst, pkt.buffer_len());
        let pd = wqe.pd;
        // A UD receive pool the program freed before destroying the QP (UCX
        // at teardown) is an error here, not a fault.
        let placed = scatter_unfaulting(mem, pd, &wqe.sges, 0, &grh)
            .and_then(|()| scatter_unfaulting(mem, pd, &wqe.sges, GRH_LEN as u64, pkt.payload));
        if placed.is_err() {
            wc.status = WcStatus::LocProtErr;
            self.events.push_back(QpEvent::RecvCompletion(wc, false));
            return Ok(());
        }
        wc.byte_len = len as u32;
        wc.wc_flags = WcFlags::GRH;
        wc.sl = roce_l3_type(src, dst);
        if let Some(imm) = pkt.imm_dt {
            wc.imm_data = imm.0;
            wc.wc_flags |= WcFlags::WITH_IMM;
        }
        self.events
            .push_back(QpEvent::RecvCompletion(wc, pkt.bth.solicited));
        Ok(())
    }
}

/// The L3 header type a UD receive reports in `sl`, as mlx5 does for RoCE:
/// IPv4 when both addresses are IPv4 (the header [`grh_bytes`] writes then
/// is an IPv4 one), else IPv6.
fn roce_l3_type(src: IpAddr, dst: IpAddr) -> u8 {
    match (src, dst) {
        (IpAddr::V4(_), IpAddr::V4(_)) => crate::wc::ROCE_L3_TYPE_IPV4,
        _ => crate::wc::ROCE_L3_TYPE_IPV6,
    }
}

/// The 40 bytes placed ahead of a UD payload, for a RoCE packet of
/// `roce_len` bytes (BTH to ICRC): for IPv4 20 zero bytes and an IPv4
/// header, for IPv6 an IPv6 header, with the packet's addresses and
/// lengths. TTL/hop limit (64), TOS (0) and the IPv4 ID (0) are those rverbs
/// senders use, not read from the packet (the socket does not report them).
pub(crate) fn grh_bytes(src: IpAddr, dst: IpAddr, roce_len: usize) -> [u8; GRH_LEN] {
    let port = rverbs_wire::icrc::ROCE_V2_PORT;
    let headers = rverbs_wire::icrc::IpUdpHeaders::linux(
        SocketAddr::new(src, port),
        SocketAddr::new(dst, port),
        roce_len,
        0,
    );
    let ip = headers.ip();
    let mut grh = [0u8; GRH_LEN];
    // IPv4: the header in the last 20 bytes; IPv6: the whole 40.
    grh[GRH_LEN - ip.len()..].copy_from_slice(ip);
    grh
}
