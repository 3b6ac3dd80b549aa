//! The requester (rxe's `qp->req`): the send queue and everything that puts
//! its requests on the wire — PSNs given at post time, segmentation into
//! path-MTU packets, large READs asked for a chunk at a time, AckReq
//! pacing, the congestion window, the READ/atomic credit and fence gates
//! (ATOMIC WRITEs take credits too), and go-back-N rewinds after a loss or a timeout. What comes back for
//! those requests is the [completer](super::completer)'s.

use std::collections::VecDeque;
use std::time::Instant;

use rverbs_wire::{
    AtomicEthRepr, BthRepr, IethRepr, ImmDtRepr, Opcode, PacketRepr, Position, Psn, RethRepr,
    Transport,
};

use super::{packets_for, position, RcConfig, RcQp, WINDOW};
use crate::event::AsyncEventType;
use crate::soft::transport::{gather, refer, Memory, QpEvent, SendWqe, TxBuffer, WqeData};
use crate::wc::WcStatus;
use crate::wr::{QpState, WrOpcode};

/// Most PSNs posted, unfinished send work may span: PSN order is decided
/// modulo 2^24, which holds within half the space; a window of margin.
const MAX_PSN_SPAN: u32 = (1 << 23) - WINDOW;
/// The congestion window never shrinks below this many packets.
const MIN_CWND: u32 = 8;
/// Packets a fresh QP may send before its first ACK.
const INITIAL_CWND: u32 = 64;
/// A requester asks for an ACK at least this often within a long message.
const ACK_EVERY: u32 = 64;
/// Bytes one READ request asks for at most (see [`RcQp::poll_transmit`]).
const READ_CHUNK_BYTES: u32 = 2 << 20;

/// Loss-based congestion control of one requester, in packets: slow start
/// up to the threshold, then one packet more per window acknowledged;
/// halved on a loss (once per window of data), back to the minimum on a
/// timeout. A receiving socket whose buffer overflows — a host with small
/// default buffers, a slow receiver — costs a halving, not a collapse into
/// go-back-N storms.
#[derive(Debug, Clone)]
pub(super) struct CongestionWindow {
    /// The window never grows past this (see [`RcConfig::max_window`]).
    limit: u32,
    cwnd: u32,
    ssthresh: u32,
    /// Packets acknowledged toward the next increase (congestion avoidance).
    acked: u32,
    /// A loss is one event until PSNs up to here are acknowledged.
    recovery_until: Option<Psn>,
}

impl CongestionWindow {
    fn new(limit: u32) -> CongestionWindow {
        let limit = limit.clamp(MIN_CWND, WINDOW);
        CongestionWindow {
            limit,
            cwnd: INITIAL_CWND.min(limit),
            ssthresh: limit,
            acked: 0,
            recovery_until: None,
        }
    }

    /// Packets that may be in flight now.
    fn packets(&self) -> u32 {
        self.cwnd.min(self.limit)
    }

    /// `n` more packets acknowledged; `una` the oldest still unacknowledged.
    pub(super) fn on_ack(&mut self, n: u32, una: Psn) {
        if self.recovery_until.is_some_and(|r| !una.is_before(r)) {
            self.recovery_until = None;
        }
        if self.cwnd < self.ssthresh {
            self.cwnd = (self.cwnd + n).min(self.limit);
            return;
        }
        self.acked += n;
        while self.acked >= self.cwnd && self.cwnd < self.limit {
            self.acked -= self.cwnd;
            self.cwnd += 1;
        }
    }

    /// A packet was lost (NAK sequence error, a READ response gap, an
    /// adaptive timeout); `sent_high` is one past the highest PSN sent.
    fn on_loss(&mut self, sent_high: Psn) -> bool {
        if self.recovery_until.is_some() {
            return false;
        }
        self.ssthresh = (self.cwnd / 2).max(MIN_CWND);
        self.cwnd = self.ssthresh;
        self.acked = 0;
        self.recovery_until = Some(sent_high);
        true
    }

    /// Nothing came back for a whole IBTA timeout: start over.
    pub(super) fn on_timeout(&mut self, sent_high: Psn) {
        self.ssthresh = (self.cwnd / 2).max(MIN_CWND);
        self.cwnd = MIN_CWND;
        self.acked = 0;
        self.recovery_until = Some(sent_high);
    }
}

/// A send WQE with its place in the PSN space.
#[derive(Debug)]
pub(super) struct SqEntry {
    pub(super) wqe: SendWqe,
    pub(super) first_psn: Psn,
    /// PSNs the WQE spans: request packets, or READ response packets.
    pub(super) npkts: u32,
    /// A packet of it went out at least once.
    started: bool,
    /// READ: response packets placed so far.
    pub(super) read_next: u32,
    /// READ: end of the range the last new READ request asked for.
    read_chunk_end: u32,
    /// READ: the first response packet the last READ request (new or
    /// asked again) asked for: its response is FIRST (or ONLY).
    pub(super) read_asked_from: u32,
    /// READ: the last request asked again for the rest of a chunk.
    read_reasked: bool,
    /// Set once the WQE completed; it leaves the queue in order.
    pub(super) status: Option<WcStatus>,
}

impl SqEntry {
    /// A WQE just posted, its PSNs from `first_psn` on; a local operation
    /// (no PSN, nothing sent) is `started` at once.
    fn new(wqe: SendWqe, first_psn: Psn, npkts: u32, started: bool) -> SqEntry {
        SqEntry {
            wqe,
            first_psn,
            npkts,
            started,
            read_next: 0,
            read_chunk_end: 0,
            read_asked_from: 0,
            read_reasked: false,
            status: None,
        }
    }

    pub(super) fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts - 1)
    }

    /// READ: whether a response with `opcode` fits the place of the packet
    /// placed next: the last request asked for `read_asked_from` up to
    /// `read_chunk_end`, so FIRST … LAST, or ONLY. A request that asked
    /// again for the rest of a chunk is a duplicate to the responder, and
    /// Linux rxe answers one from its saved resource as the middle of the
    /// original stream: MIDDLE … LAST, or LAST alone (we answer FIRST).
    pub(super) fn read_response_fits(&self, opcode: Opcode) -> bool {
        let first = self.read_next == self.read_asked_from;
        let last = self.read_next + 1 >= self.read_chunk_end;
        let midstream = !first || self.read_reasked;
        match opcode {
            Opcode::RC_RDMA_READ_RESPONSE_ONLY => first && last,
            Opcode::RC_RDMA_READ_RESPONSE_FIRST => first && !last,
            Opcode::RC_RDMA_READ_RESPONSE_LAST => last && midstream,
            Opcode::RC_RDMA_READ_RESPONSE_MIDDLE => !last && midstream,
            _ => false,
        }
    }

    pub(super) fn is_read(&self) -> bool {
        matches!(self.wqe.op, WrOpcode::RdmaRead { .. })
    }

    /// A READ or atomic: answered by READ responses or an atomic ACK,
    /// whose loss an ACK past it reveals.
    pub(super) fn is_rd_atomic(&self) -> bool {
        matches!(
            self.wqe.op,
            WrOpcode::RdmaRead { .. }
                | WrOpcode::AtomicCmpAndSwp { .. }
                | WrOpcode::AtomicFetchAndAdd { .. }
        )
    }

    pub(super) fn is_atomic_write(&self) -> bool {
        matches!(self.wqe.op, WrOpcode::AtomicWrite { .. })
    }

    /// Whether it holds one of the `max_rd_atomic` credits while
    /// outstanding, and a fence waits for it: READs, atomics and, as rxe
    /// counts them (its responder gives each a resource), ATOMIC WRITEs.
    pub(super) fn takes_rd_atomic_credit(&self) -> bool {
        self.is_rd_atomic() || self.is_atomic_write()
    }

    /// The first PSN the requester still has to (re)send for this WQE.
    pub(super) fn resume_psn(&self) -> Psn {
        if self.is_read() {
            self.first_psn.add(self.read_next)
        } else {
            self.first_psn
        }
    }
}

/// What the requester keeps: the send queue with its PSNs, the transmit
/// cursor, and what paces it (congestion window, READ/atomic credits, an
/// RNR wait). How far the peer acknowledged is the completer's
/// ([`CompleterState::una`](super::completer::CompleterState::una)).
pub(super) struct RequesterState {
    /// Posted send WRs not yet completed, oldest first.
    pub(super) sq: VecDeque<SqEntry>,
    /// WRs ever taken off the front of `sq`, and the position (counted the
    /// same way) of the WR transmitted last: a cursor that survives pops.
    pub(super) sq_popped: u64,
    tx_hint: u64,
    /// PSN the next posted WQE starts at.
    pub(super) next_psn: Psn,
    /// Next PSN to transmit (behind `next_psn` while work is pending).
    pub(super) tx_psn: Psn,
    /// One past the highest PSN ever transmitted.
    pub(super) sent_high: Psn,
    /// READs, atomics and ATOMIC WRITEs started and not yet completed.
    pub(super) rd_atomic_inflight: u32,
    pub(super) cwnd: CongestionWindow,
    /// After an RNR NAK: nothing is sent before then.
    pub(super) rnr_until: Option<Instant>,
    /// The resume PSN of the last go-back for a lost READ response.
    pub(super) read_rewound_at: Option<Psn>,
    /// The PSN of the last NAK sequence error acted on, until progress: a
    /// copy of it (duplicated or late) is the same loss, not a new one.
    pub(super) seq_nak_at: Option<Psn>,
    /// In SQD: report SQ_DRAINED once the send queue is empty.
    pub(super) notify_drained: bool,
    /// The most packets the device lets this QP have in flight now (its
    /// share of the device's in-flight budget, see `RcQp::set_window_cap`).
    pub(super) window_cap: u32,
}

impl RequesterState {
    /// An empty send queue starting at `cfg.sq_psn`.
    pub(super) fn new(cfg: &RcConfig) -> RequesterState {
        RequesterState {
            sq: VecDeque::new(),
            sq_popped: 0,
            tx_hint: 0,
            next_psn: cfg.sq_psn,
            tx_psn: cfg.sq_psn,
            sent_high: cfg.sq_psn,
            rd_atomic_inflight: 0,
            cwnd: CongestionWindow::new(cfg.max_window),
            rnr_until: None,
            read_rewound_at: None,
            seq_nak_at: None,
            notify_drained: false,
            window_cap: u32::MAX,
        }
    }

    /// RTR → RTS: PSNs start at `cfg.sq_psn`, with a fresh window.
    pub(super) fn enter_rts(&mut self, cfg: &RcConfig) {
        self.next_psn = cfg.sq_psn;
        self.tx_psn = cfg.sq_psn;
        self.sent_high = cfg.sq_psn;
        self.cwnd = CongestionWindow::new(cfg.max_window);
    }
}

/// What [`RcQp::transmit_request`] did with the WR it was given.
enum Transmit {
    Sent(usize),
    Blocked,
    Failed,
}

fn send_opcode(pos: Position, imm: bool) -> Opcode {
    match (pos, imm) {
        (Position::First, _) => Opcode::RC_SEND_FIRST,
        (Position::Middle, _) => Opcode::RC_SEND_MIDDLE,
        (Position::Last, false) => Opcode::RC_SEND_LAST,
        (Position::Last, true) => Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
        (Position::Only, false) => Opcode::RC_SEND_ONLY,
        (Position::Only, true) => Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
    }
}

fn write_opcode(pos: Position, imm: bool) -> Opcode {
    match (pos, imm) {
        (Position::First, _) => Opcode::RC_RDMA_WRITE_FIRST,
        (Position::Middle, _) => Opcode::RC_RDMA_WRITE_MIDDLE,
        (Position::Last, false) => Opcode::RC_RDMA_WRITE_LAST,
        (Position::Last, true) => Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        (Position::Only, false) => Opcode::RC_RDMA_WRITE_ONLY,
        (Position::Only, true) => Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
    }
}

/// Response packets one READ request asks for at most at `mtu`.
fn read_chunk(mtu: u32) -> u32 {
    (READ_CHUNK_BYTES / mtu).clamp(1, WINDOW)
}

impl RcQp {
    // ---- posting ----------------------------------------------------------

    /// In SQD: send WRs that had started are still outstanding (those that
    /// had not wait for RTS and do not count).
    pub(crate) fn sq_draining(&self) -> bool {
        self.req.sq.iter().any(|e| e.started && e.status.is_none())
    }

    /// Send WRs waiting or in flight.
    pub(crate) fn sq_len(&self) -> usize {
        self.req.sq.len()
    }

    /// PSNs a send WR of `length` bytes takes (none for a local operation).
    pub(crate) fn packets_of(&self, op: &WrOpcode, length: u32) -> u32 {
        match op {
            WrOpcode::BindMw { .. } | WrOpcode::LocalInv { .. } => 0,
            WrOpcode::AtomicCmpAndSwp { .. }
            | WrOpcode::AtomicFetchAndAdd { .. }
            | WrOpcode::AtomicWrite { .. } => 1,
            _ => packets_for(length, self.segment()),
        }
    }

    /// Whether a send WR of `length` bytes fits in the PSN space: PSNs are
    /// given at post time, and 24-bit comparisons only hold while posted,
    /// unfinished work spans less than half the space. `Err(true)`: not
    /// now (poll completions and post again); `Err(false)`: never at this
    /// path MTU.
    ///
    /// `ahead`: PSNs of WRs about to be posted before this one.
    pub(crate) fn psn_room_after(
        &self,
        op: &WrOpcode,
        length: u32,
        ahead: u32,
    ) -> Result<(), bool> {
        let npkts = self.packets_of(op, length);
        if npkts > MAX_PSN_SPAN {
            return Err(false);
        }
        let span = self
            .comp
            .una
            .distance_to(self.req.next_psn)
            .saturating_add(ahead);
        if self.state != QpState::Err && span.saturating_add(npkts) > MAX_PSN_SPAN {
            return Err(true);
        }
        Ok(())
    }

    /// In ERR a WR posted completes at once with a flush error: whether it
    /// did.
    fn flushed_in_err(&mut self, entry: &SqEntry) -> bool {
        if self.state != QpState::Err {
            return false;
        }
        self.events.push_back(QpEvent::SendCompletion(
            self.send_wc(entry, WcStatus::WrFlushErr),
        ));
        true
    }

    /// Queues a send WR. In ERR it completes at once with a flush error.
    pub(crate) fn post_send(&mut self, wqe: SendWqe) {
        let npkts = self.packets_of(&wqe.op, wqe.length);
        let entry = SqEntry::new(wqe, self.req.next_psn, npkts, false);
        if self.flushed_in_err(&entry) {
            return;
        }
        self.req.next_psn = self.req.next_psn.add(npkts);
        self.req.sq.push_back(entry);
    }

    /// Queues a local operation (a memory window bind, a local invalidate)
    /// and carries it out at once, in the order posted: it takes no PSN and
    /// sends nothing. Its completion waits its turn in the send queue
    /// (BIND_MW or LOCAL_INV); refused, it completes with MW_BIND_ERR
    /// (bind, as rxe) or LOC_QP_OP_ERR (invalidate) and the QP goes to ERR.
    /// In ERR it is flushed without effect.
    pub(crate) fn post_local_op(&mut self, wqe: SendWqe, mem: &dyn Memory) {
        let entry = SqEntry::new(wqe, self.req.next_psn, 0, true);
        if self.flushed_in_err(&entry) {
            return;
        }
        let (pd, qpn) = (self.cfg.pd, self.cfg.qpn);
        let outcome = match entry.wqe.op {
            WrOpcode::BindMw {
                mw_rkey,
                rkey,
                info,
            } => mem
                .bind_mw(mw_rkey, rkey, &info, pd, qpn)
                .map(|_| ())
                .map_err(|e| (WcStatus::MwBindErr, e)),
            WrOpcode::LocalInv { rkey } => mem
                .invalidate(rkey, pd, None)
                .map_err(|e| (WcStatus::LocQpOpErr, e)),
            _ => Ok(()),
        };
        self.req.sq.push_back(entry);
        match outcome {
            Ok(()) => {
                if let Some(e) = self.req.sq.back_mut() {
                    e.status = Some(WcStatus::Success);
                }
                self.pop_completed();
            }
            Err((status, why)) => {
                tracing::debug!("QP {qpn:#x}: local operation refused: {why}");
                self.fail_at(self.req.sq.len() - 1, status);
            }
        }
    }

    /// In SQD with SQ_DRAINED asked for: raises it once nothing started is
    /// outstanding.
    pub(super) fn check_drained(&mut self) {
        if self.state == QpState::Sqd && self.req.notify_drained && !self.sq_draining() {
            self.req.notify_drained = false;
            self.events
                .push_back(QpEvent::Async(AsyncEventType::SqDrained));
        }
    }

    // ---- the device's in-flight budget --------------------------------------

    /// Packets this QP has in flight: sent (or, for a READ, asked for) and
    /// not yet acknowledged — what its exchanges may still put into a
    /// receiving socket. A go-back to resend them does not take them out.
    /// 0 unless it sends (RTS, SQD); a UC QP has none.
    pub(crate) fn in_flight(&self) -> u32 {
        // Waiting out an RNR NAK: the responder dropped what came after
        // it, so nothing of this QP's is in a socket (and a QP a peer keeps
        // waiting for ever must not hold the device's budget meanwhile).
        if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.req.rnr_until.is_some() {
            return 0;
        }
        self.comp.una.distance_to(self.req.sent_high)
    }

    /// The path MTU its packets are cut to.
    pub(crate) fn mtu(&self) -> u32 {
        self.cfg.mtu
    }

    /// Whether the next packet is new (not a resend): only new packets
    /// take room in the device's budget.
    fn sends_new(&self) -> bool {
        !self.req.tx_psn.is_before(self.req.sent_high)
    }

    /// The most packets this QP may have in flight now: its congestion
    /// window, and for new packets its share of the device's budget.
    /// Resends are never held by the budget (they were counted when first
    /// sent): a QP waiting for room must not run out of retries meanwhile.
    fn window(&self) -> u32 {
        if self.sends_new() && self.counts_in_flight() {
            self.req.cwnd.packets().min(self.req.window_cap)
        } else {
            self.req.cwnd.packets()
        }
    }

    /// Whether its packets count in the device's budget: RC; a UC QP's are
    /// never acknowledged, so it has none in flight and its window ignores
    /// the cap.
    pub(crate) fn counts_in_flight(&self) -> bool {
        self.cfg.transport == Transport::Rc
    }

    /// The device lets this QP have at most `cap` packets in flight (its
    /// share of a budget for all its QPs, so that a thousand QPs' windows
    /// together do not overflow a receiving socket).
    pub(crate) fn set_window_cap(&mut self, cap: u32) {
        self.req.window_cap = cap;
    }

    /// Whether the device's budget, not the QP's own window or gates, is
    /// what keeps it from sending more now.
    pub(crate) fn held_by_window_cap(&self) -> bool {
        let in_flight = self.in_flight();
        matches!(self.state, QpState::Rts | QpState::Sqd)
            && self.req.tx_psn != self.req.next_psn
            && self.sends_new()
            && self.req.rnr_until.is_none()
            && in_flight >= self.req.window_cap
            && in_flight < self.req.cwnd.packets()
    }

    // ---- transmit ---------------------------------------------------------

    /// Writes the next request packet due into `buf`, if the state, an RNR
    /// wait, the window and the gates let one go.
    pub(super) fn transmit_next_request(
        &mut self,
        now: Instant,
        mem: &dyn Memory,
        buf: &mut TxBuffer<'_>,
    ) -> Option<usize> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        if let Some(until) = self.req.rnr_until {
            if now < until {
                return None;
            }
            self.req.rnr_until = None;
        }
        loop {
            if self.req.tx_psn == self.req.next_psn
                || self.comp.una.distance_to(self.req.tx_psn) >= self.window()
            {
                return None;
            }
            let holds = |e: &SqEntry| {
                e.first_psn.distance_to(self.req.tx_psn) < e.npkts && e.status.is_none()
            };
            // The WR sent last, or the next one, usually holds tx_psn: look
            // there before scanning the queue (a window may hold hundreds).
            let hint = self.req.tx_hint.wrapping_sub(self.req.sq_popped) as usize;
            let idx = [hint, hint.wrapping_add(1)]
                .into_iter()
                .find(|&i| self.req.sq.get(i).is_some_and(holds))
                .or_else(|| self.req.sq.iter().position(holds));
            let Some(idx) = idx else {
                // Everything from tx_psn on already completed (e.g. after a rewind).
                self.req.tx_psn = self.req.next_psn;
                return None;
            };
            self.req.tx_hint = self.req.sq_popped.wrapping_add(idx as u64);
            match self.transmit_request(idx, now, mem, buf) {
                Transmit::Sent(n) => return Some(n),
                Transmit::Blocked => return None,
                Transmit::Failed => {
                    if self.state == QpState::Err {
                        return None;
                    }
                }
            }
        }
    }

    fn transmit_request(
        &mut self,
        idx: usize,
        now: Instant,
        mem: &dyn Memory,
        tx: &mut TxBuffer<'_>,
    ) -> Transmit {
        let mtu = self.segment();
        let e = &self.req.sq[idx];
        // In SQD no WR that has not started may start.
        if self.state == QpState::Sqd && !e.started {
            return Transmit::Blocked;
        }
        let k = e.first_psn.distance_to(self.req.tx_psn);
        let mut bth = BthRepr::new(Opcode::RC_SEND_ONLY, self.cfg.dest_qpn, self.req.tx_psn);
        bth.pkey = self.cfg.pkey;
        let mut p = PacketRepr::new(bth);
        let mut payload = None;
        let mut next_tx = self.req.tx_psn.next();
        let mut read_chunk_end = None;
        let mut atomic_value = None;
        match e.wqe.op {
            WrOpcode::RdmaRead { remote_addr, rkey } => {
                if !e.started && !self.may_issue_rd_atomic(idx) {
                    return Transmit::Blocked;
                }
                // A large READ is asked for a chunk at a time: the responder
                // streams each request's responses at once, and a chunk is
                // what the receiving socket can be expected to absorb. The
                // next chunk goes once the previous one has fully arrived,
                // so a READ holds one responder resource at a time.
                if k > e.read_next {
                    return Transmit::Blocked;
                }
                let reasked = e.read_next < e.read_chunk_end;
                let chunk_end = if !reasked {
                    // A new chunk, as much as the window holds now (and no
                    // more than the device's budget leaves this QP).
                    let cap = self.req.window_cap.saturating_sub(self.in_flight()).max(1);
                    let chunk = read_chunk(mtu).min(self.req.cwnd.packets()).min(cap);
                    (e.read_next + chunk).min(e.npkts)
                } else {
                    // Asking again after a loss: always for the rest of the
                    // chunk, so the request matches the responder's saved
                    // range whether or not the first ask reached it.
                    e.read_chunk_end
                };
                let chunk = chunk_end - e.read_next;
                let offset = e.read_next * mtu;
                p.bth.opcode = Opcode::RC_RDMA_READ_REQUEST;
                p.bth.psn = e.first_psn.add(e.read_next);
                p.reth = Some(RethRepr {
                    va: remote_addr.wrapping_add(u64::from(offset)),
                    rkey,
                    dma_len: (e.wqe.length - offset.min(e.wqe.length)).min(chunk * mtu),
                });
                p.bth.ack_req = true;
                next_tx = e.first_psn.add(e.read_next + chunk);
                read_chunk_end = Some((chunk_end, reasked));
            }
            WrOpcode::AtomicCmpAndSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                if !e.started && !self.may_issue_rd_atomic(idx) {
                    return Transmit::Blocked;
                }
                p.bth.opcode = Opcode::RC_COMPARE_SWAP;
                p.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
                p.bth.ack_req = true;
            }
            WrOpcode::AtomicFetchAndAdd {
                remote_addr,
                rkey,
                add,
            } => {
                if !e.started && !self.may_issue_rd_atomic(idx) {
                    return Transmit::Blocked;
                }
                p.bth.opcode = Opcode::RC_FETCH_ADD;
                p.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                });
                p.bth.ack_req = true;
            }
            WrOpcode::AtomicWrite {
                remote_addr,
                rkey,
                value,
            } => {
                if !e.started && !self.may_issue_rd_atomic(idx) {
                    return Transmit::Blocked;
                }
                p.bth.opcode = Opcode::RC_ATOMIC_WRITE;
                p.reth = Some(RethRepr {
                    va: remote_addr,
                    rkey,
                    dma_len: 8,
                });
                p.bth.ack_req = true;
                atomic_value = Some(value);
            }
            op => {
                if k == 0 && e.wqe.fence && self.fence_blocks(idx) {
                    return Transmit::Blocked;
                }
                let pos = position(k, e.npkts);
                let offset = k * mtu;
                let len = mtu.min(e.wqe.length - offset);
                let imm = match op {
                    WrOpcode::SendWithImm { imm } | WrOpcode::RdmaWriteWithImm { imm, .. } => {
                        Some(imm)
                    }
                    _ => None,
                };
                let invalidate = match op {
                    WrOpcode::SendWithInv { rkey } => Some(rkey),
                    _ => None,
                };
                match op {
                    WrOpcode::RdmaWrite { remote_addr, rkey }
                    | WrOpcode::RdmaWriteWithImm {
                        remote_addr, rkey, ..
                    } => {
                        p.bth.opcode = write_opcode(pos, imm.is_some());
                        if pos.starts_message() {
                            p.reth = Some(RethRepr {
                                va: remote_addr,
                                rkey,
                                dma_len: e.wqe.length,
                            });
                        }
                    }
                    _ => p.bth.opcode = send_opcode(pos, imm.is_some()),
                }
                if let (Some(rkey), true) = (invalidate, pos.ends_message()) {
                    // The rkey to invalidate rides in the message's last packet.
                    p.bth.opcode = if pos == Position::Only {
                        Opcode::RC_SEND_ONLY_WITH_INVALIDATE
                    } else {
                        Opcode::RC_SEND_LAST_WITH_INVALIDATE
                    };
                    p.ieth = Some(IethRepr(rkey));
                }
                if pos.ends_message() {
                    p.imm_dt = imm.map(ImmDtRepr);
                    p.bth.solicited = e.wqe.solicited;
                    p.bth.ack_req = true;
                } else {
                    // Ask for an ACK regularly, and whenever this packet
                    // fills the window, so a sender held by it is answered.
                    let fills = self.comp.una.distance_to(self.req.tx_psn) + 1 >= self.window();
                    p.bth.ack_req = (k + 1) % ACK_EVERY == 0 || fills;
                }
                payload = Some((offset, len));
            }
        }
        let unreliable = self.cfg.transport == Transport::Uc;
        if unreliable {
            // The UC opcodes are the RC ones in the UC range; nothing is acknowledged.
            p.bth.opcode = Opcode(p.bth.opcode.0 | 0x20);
            p.bth.ack_req = false;
        }
        let (offset, len) = payload.unwrap_or((0, 0));
        let len = if atomic_value.is_some() { 8 } else { len };
        let Ok(total) = p.emit_around_payload(len as usize, tx.bytes) else {
            return Transmit::Blocked;
        };
        if let Some(value) = atomic_value {
            let start = p.header_len();
            tx.bytes[start..start + 8].copy_from_slice(&value);
        } else if len > 0 {
            let start = p.header_len();
            let dst = &mut tx.bytes[start..start + len as usize];
            let pd = self.cfg.pd;
            let copied = match (&e.wqe.data, tx.refs.as_deref_mut()) {
                (WqeData::Inline(data), _) => {
                    dst.copy_from_slice(&data[offset as usize..(offset + len) as usize]);
                    Ok(())
                }
                (WqeData::Sges(sges), Some(refs)) => {
                    let at = u32::try_from(start).unwrap_or(u32::MAX);
                    refer(mem, pd, sges, u64::from(offset), len as usize, at, refs)
                }
                (WqeData::Sges(sges), None) => gather(mem, pd, sges, u64::from(offset), dst),
            };
            if copied.is_err() {
                self.fail_at(idx, WcStatus::LocProtErr);
                return Transmit::Failed;
            }
        }
        let e = &mut self.req.sq[idx];
        if let Some((end, reasked)) = read_chunk_end {
            e.read_chunk_end = end;
            e.read_asked_from = e.read_next;
            e.read_reasked = reasked;
        }
        if !e.started {
            e.started = true;
            if e.takes_rd_atomic_credit() {
                self.req.rd_atomic_inflight += 1;
            }
        }
        let psn = self.req.tx_psn;
        if psn.is_before(self.req.sent_high) {
            self.counters.retransmitted += 1;
        } else {
            if self.comp.rtt_probe.is_none() {
                self.comp.rtt_probe = Some((psn, now));
            }
            self.req.sent_high = next_tx;
        }
        self.req.tx_psn = next_tx;
        if unreliable {
            // Sent is done: the WR completes with its last packet.
            self.comp.una = next_tx;
            self.comp.rtt_probe = None;
            let e = &mut self.req.sq[idx];
            if e.first_psn.distance_to(next_tx) >= e.npkts {
                e.status = Some(WcStatus::Success);
                self.pop_completed();
            }
            return Transmit::Sent(total);
        }
        if self.comp.retransmit_at.is_none() {
            self.comp.retransmit_at = self.cfg.timeout.map(|t| now + t);
        }
        if self.comp.fast_rto_at.is_none() {
            self.comp.fast_rto_at = Some(now + self.fast_rto());
        }
        Transmit::Sent(total)
    }

    fn may_issue_rd_atomic(&self, idx: usize) -> bool {
        self.req.rd_atomic_inflight < u32::from(self.cfg.max_rd_atomic.max(1))
            && !(self.req.sq[idx].wqe.fence && self.fence_blocks(idx))
    }

    /// A fenced WR waits for every earlier READ, atomic and ATOMIC WRITE
    /// to complete.
    fn fence_blocks(&self, idx: usize) -> bool {
        self.req
            .sq
            .iter()
            .take(idx)
            .any(|e| e.takes_rd_atomic_credit() && e.status.is_none())
    }

    // ---- going back -------------------------------------------------------

    /// Go back N for a lost READ response, once per resume point: further
    /// signs of the same loss (later responses, ACKs past the READ) while
    /// the request is being asked again do not resend the window again —
    /// if the new request is lost too, the retransmission timer resends.
    pub(super) fn rewind_for_read(&mut self) {
        let resume = self
            .req
            .sq
            .iter()
            .find(|e| e.status.is_none())
            .map(|e| e.resume_psn());
        if resume.is_some() && self.req.read_rewound_at == resume {
            return;
        }
        self.req.read_rewound_at = resume;
        self.cut_window();
        self.rewind();
    }

    /// A loss was detected: the congestion window shrinks (once per window).
    pub(super) fn cut_window(&mut self) {
        if self.req.cwnd.on_loss(self.req.sent_high) {
            self.counters.window_cuts += 1;
        }
    }

    /// Go back N: resend from the oldest unacknowledged PSN.
    pub(super) fn rewind(&mut self) {
        self.comp.rtt_probe = None;
        self.req.tx_psn = match self.req.sq.iter().find(|e| e.status.is_none()) {
            Some(e) if e.is_read() => e.resume_psn(),
            Some(e) if e.first_psn.is_before(self.comp.una) => self.comp.una,
            Some(e) => e.first_psn,
            None => self.req.next_psn,
        };
    }
}
