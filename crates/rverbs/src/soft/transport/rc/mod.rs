//! Reliable Connected: the requester (segmentation, PSN window, AckReq
//! pacing, go-back-N retransmission on timeout or NAK, RNR waits), the
//! completer (cumulative ACKs, READ responses, atomic ACKs, completions in
//! order) and the responder (PSN checks with one NAK per gap, duplicate
//! re-ACKs, READ and atomic replay from saved resources, RNR NAKs, every
//! remote access checked, coalesced ACKs), following IBTA vol. 1 ch. 9 as
//! the Linux rxe driver implements it.
//!
//! Nothing here sleeps or touches a socket: see the module docs of
//! [`super`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rverbs_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, ImmDtRepr, Opcode, Operation, PacketRepr,
    Position, Psn, RethRepr, RnrTimer, Syndrome, Transport,
};

use super::recv::{RecvQueue, SharedRq};
use super::{
    gather, pkey_matches, recv_flush_wc, refer, Memory, PayloadRef, QpEvent, RecvWqe, RxDrop,
    SendWqe, TxBuffer, WqeData,
};
use crate::attr::AccessFlags;
use crate::event::AsyncEventType;
use crate::soft::memory::AccessKind;
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};
use crate::wr::{QpState, WrOpcode};

/// Longest a plain ACK is held back under [`AckPolicy::Hold`].
pub(crate) const ACK_HOLD: Duration = Duration::from_micros(20);

/// Whether [`RcQp::poll_transmit`] sends a plain ACK that is due now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckPolicy {
    /// Send it (after the QP's own requests).
    Now,
    /// Hold it back for up to [`ACK_HOLD`], coalescing with later ACKs: a
    /// thread that polls a CQ gets its completion without first paying for
    /// the ACK's send, and the ACK leaves with the next post (a ping-pong
    /// reply), the next pass, or when its time is up.
    Hold,
}

/// Most PSNs a requester has in flight unacknowledged: 2 MiB at a 4 KiB
/// MTU. The congestion window keeps it lower while the path (a receiving
/// socket's buffer, above all) drops packets.
pub(crate) const WINDOW: u32 = 512;
/// Most PSNs posted, unfinished send work may span: PSN order is decided
/// modulo 2^24, which holds within half the space; a window of margin.
pub(crate) const MAX_PSN_SPAN: u32 = (1 << 23) - WINDOW;
/// The congestion window never shrinks below this many packets.
const MIN_CWND: u32 = 8;
/// Packets a fresh QP may send before its first ACK.
const INITIAL_CWND: u32 = 64;

/// Loss-based congestion control of one requester, in packets: slow start
/// up to the threshold, then one packet more per window acknowledged;
/// halved on a loss (once per window of data), back to the minimum on a
/// timeout. A receiving socket whose buffer overflows — a host with small
/// default buffers, a slow receiver — costs a halving, not a collapse into
/// go-back-N storms.
#[derive(Debug, Clone)]
pub(crate) struct CongestionWindow {
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
    pub(crate) fn packets(&self) -> u32 {
        self.cwnd.min(self.limit)
    }

    /// `n` more packets acknowledged; `una` the oldest still unacknowledged.
    fn on_ack(&mut self, n: u32, una: Psn) {
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
    fn on_timeout(&mut self, sent_high: Psn) {
        self.ssthresh = (self.cwnd / 2).max(MIN_CWND);
        self.cwnd = MIN_CWND;
        self.acked = 0;
        self.recovery_until = Some(sent_high);
    }
}
/// Bounds of the adaptive retransmission timer. The floor sits above a
/// scheduler time slice: on a busy host (two cores, three runnable
/// threads) a peer is sometimes off the CPU for a few milliseconds, and a
/// 0.5 ms floor resent up to a whole window (2 MiB) on a lossless loopback
/// once or twice a second; a lost tail still recovers in milliseconds, not
/// the IBTA timeout's tens of them.
const MIN_FAST_RTO: Duration = Duration::from_millis(4);
const MAX_FAST_RTO: Duration = Duration::from_secs(1);
/// A requester asks for an ACK at least this often within a long message.
pub(crate) const ACK_EVERY: u32 = 64;
/// The credit code in every ACK: no end-to-end flow control credits (as rxe).
const CREDITS: Syndrome = Syndrome::Ack {
    credits: Syndrome::CREDITS_UNLIMITED,
};

/// The transport parameters of an RC (or UC) QP, set by modify_qp.
#[derive(Debug, Clone)]
pub(crate) struct RcConfig {
    /// RC, or UC: the same segmentation and PSN checks without ACKs,
    /// retransmission, READs or atomics — a send WR completes once its last
    /// packet is sent, and the responder drops a message that lost a packet.
    pub(crate) transport: Transport,
    pub(crate) qpn: u32,
    pub(crate) dest_qpn: u32,
    /// The QP's PD: every local and remote access must be in it.
    pub(crate) pd: u64,
    /// Path MTU in bytes.
    pub(crate) mtu: u32,
    pub(crate) sq_psn: Psn,
    pub(crate) rq_psn: Psn,
    /// Local ACK timeout (`None`: wait for ever, timeout attribute 0).
    pub(crate) timeout: Option<Duration>,
    pub(crate) retry_cnt: u8,
    /// 7 retries for ever.
    pub(crate) rnr_retry: u8,
    pub(crate) min_rnr_timer: RnrTimer,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    /// What peers may do to this QP's memory (`qp_access_flags`).
    pub(crate) access: AccessFlags,
    pub(crate) pkey: u16,
    /// Most packets in flight this path can take (the engine derives it
    /// from the socket buffers), at most [`WINDOW`].
    pub(crate) max_window: u32,
}

impl RcConfig {
    /// The retransmission timeout for the `timeout` attribute: 4.096 µs × 2^t.
    pub(crate) fn timeout_for(t: u8) -> Option<Duration> {
        (t != 0).then(|| Duration::from_nanos(4096u64 << t.min(31)))
    }
}

/// A send WQE with its place in the PSN space.
#[derive(Debug)]
struct SqEntry {
    wqe: SendWqe,
    first_psn: Psn,
    /// PSNs the WQE spans: request packets, or READ response packets.
    npkts: u32,
    /// A packet of it went out at least once.
    started: bool,
    /// READ: response packets placed so far.
    read_next: u32,
    /// READ: end of the range the last new READ request asked for.
    read_chunk_end: u32,
    /// Set once the WQE completed; it leaves the queue in order.
    status: Option<WcStatus>,
}

impl SqEntry {
    fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts - 1)
    }

    fn is_read(&self) -> bool {
        matches!(self.wqe.op, WrOpcode::RdmaRead { .. })
    }

    fn is_rd_atomic(&self) -> bool {
        matches!(
            self.wqe.op,
            WrOpcode::RdmaRead { .. }
                | WrOpcode::AtomicCmpAndSwp { .. }
                | WrOpcode::AtomicFetchAndAdd { .. }
        )
    }

    /// The first PSN the requester still has to (re)send for this WQE.
    fn resume_psn(&self) -> Psn {
        if self.is_read() {
            self.first_psn.add(self.read_next)
        } else {
            self.first_psn
        }
    }
}

/// The incoming message a responder is in the middle of.
#[derive(Debug)]
enum Inbound {
    Send {
        wqe: RecvWqe,
        offset: u64,
    },
    Write {
        rkey: u32,
        va: u64,
        total: u32,
        done: u32,
    },
}

/// A saved READ or atomic, to answer duplicates without re-executing.
#[derive(Debug, Clone, Copy)]
enum Resource {
    Read {
        first_psn: Psn,
        npkts: u32,
        va: u64,
        rkey: u32,
        len: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
}

/// A packet (or stream of READ response packets) the responder owes.
#[derive(Debug, Clone, Copy)]
enum Response {
    Ack {
        psn: Psn,
        msn: u32,
    },
    Nak {
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
    },
    Read {
        first_psn: Psn,
        k: u32,
        npkts: u32,
        va: u64,
        rkey: u32,
        len: u32,
        msn: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
}

/// Where packet `k` of `n` sits in its message.
fn position(k: u32, n: u32) -> Position {
    match (k, n) {
        (_, 1) => Position::Only,
        (0, _) => Position::First,
        (k, n) if k + 1 == n => Position::Last,
        _ => Position::Middle,
    }
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

fn read_response_opcode(pos: Position) -> Opcode {
    match pos {
        Position::First => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        Position::Middle => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        Position::Last => Opcode::RC_RDMA_READ_RESPONSE_LAST,
        Position::Only => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
    }
}

/// Bytes one READ request asks for at most (see [`RcQp::poll_transmit`]).
const READ_CHUNK_BYTES: u32 = 2 << 20;

/// Response packets one READ request asks for at most at `mtu`.
fn read_chunk(mtu: u32) -> u32 {
    (READ_CHUNK_BYTES / mtu).clamp(1, WINDOW)
}

/// Packets a message of `len` bytes needs at `mtu` (at least one).
fn packets_for(len: u32, mtu: u32) -> u32 {
    len.div_ceil(mtu).max(1)
}

/// Why a responder refuses a request.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// Malformed or unsupported request: NAK invalid request, QP_REQ_ERR.
    InvalidRequest,
    /// Key, bounds, rights or PD: NAK remote access error, QP_ACCESS_ERR.
    Access,
    /// The receive WR cannot take the message: it completes with `status`
    /// (LOC_LEN_ERR: too small, NAK invalid request, as rxe; LOC_PROT_ERR: a
    /// bad scatter list, NAK remote operational error).
    RecvBuffer(WcStatus),
}

/// What one RC queue pair's transport went through (the engine sums them
/// into [`NetStats`](crate::NetStats)).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RcCounters {
    /// Request packets sent again (go-back-N after a loss or a timeout).
    pub(crate) retransmitted: u64,
    /// Retransmission timer expiries (adaptive or IBTA `timeout`).
    pub(crate) timeouts: u64,
    /// NAK sequence errors received (the peer saw a gap).
    pub(crate) seq_naks_received: u64,
    /// RNR NAKs received (the peer had no receive WR).
    pub(crate) rnr_naks_received: u64,
    /// NAK sequence errors sent (a gap in the peer's requests).
    pub(crate) seq_naks_sent: u64,
    /// RNR NAKs sent.
    pub(crate) rnr_naks_sent: u64,
    /// Duplicate requests received (answered, never executed again).
    pub(crate) duplicates: u64,
    /// Times the congestion window was cut.
    pub(crate) window_cuts: u64,
    /// Requests refused with a NAK that ends the QP: invalid request (a bad
    /// opcode sequence, length or alignment), remote access or remote
    /// operational error.
    pub(crate) fatal_naks_sent: u64,
    /// UC packets dropped: the rest of a message after a gap, or a message
    /// refused (no receive WR, bad rkey, too long).
    pub(crate) uc_dropped: u64,
}

impl RcCounters {
    /// Adds `other`'s counts to these.
    pub(crate) fn absorb(&mut self, other: &RcCounters) {
        self.retransmitted += other.retransmitted;
        self.timeouts += other.timeouts;
        self.seq_naks_received += other.seq_naks_received;
        self.rnr_naks_received += other.rnr_naks_received;
        self.seq_naks_sent += other.seq_naks_sent;
        self.rnr_naks_sent += other.rnr_naks_sent;
        self.duplicates += other.duplicates;
        self.window_cuts += other.window_cuts;
        self.fatal_naks_sent += other.fatal_naks_sent;
        self.uc_dropped += other.uc_dropped;
    }
}

/// One RC queue pair's transport state.
pub(crate) struct RcQp {
    cfg: RcConfig,
    state: QpState,
    // requester
    sq: VecDeque<SqEntry>,
    /// WRs ever taken off the front of `sq`, and the position (counted the
    /// same way) of the WR transmitted last: a cursor that survives pops.
    sq_popped: u64,
    tx_hint: u64,
    /// PSN the next posted WQE starts at.
    next_psn: Psn,
    /// Oldest PSN not yet acknowledged.
    una: Psn,
    /// Next PSN to transmit (behind `next_psn` while work is pending).
    tx_psn: Psn,
    rd_atomic_inflight: u32,
    retry_left: u8,
    rnr_left: u8,
    /// The IBTA local ACK timer: `timeout` without progress spends a retry.
    retransmit_at: Option<Instant>,
    /// The adaptive timer: a few round trips without progress resend from
    /// the oldest unacknowledged PSN at once, without spending a retry, so a
    /// lost tail costs about a round trip instead of a whole `timeout`.
    fast_rto_at: Option<Instant>,
    fast_backoff: u32,
    srtt: Option<Duration>,
    /// A new packet being timed for the round-trip estimate (Karn: never a
    /// retransmitted one).
    rtt_probe: Option<(Psn, Instant)>,
    /// One past the highest PSN ever transmitted.
    sent_high: Psn,
    cwnd: CongestionWindow,
    pub(crate) counters: RcCounters,
    rnr_until: Option<Instant>,
    /// The resume PSN of the last go-back for a lost READ response.
    read_rewound_at: Option<Psn>,
    /// In SQD: report SQ_DRAINED once the send queue is empty.
    notify_drained: bool,
    // responder
    epsn: Psn,
    msn: u32,
    rq: RecvQueue,
    inbound: Option<Inbound>,
    resources: VecDeque<Resource>,
    responses: VecDeque<Response>,
    /// A plain ACK held back (see [`AckPolicy::Hold`]) goes out by then.
    ack_due: Option<Instant>,
    nak_seq_sent: bool,
    /// Whether any packet arrived yet (for COMM_EST in RTR).
    heard_from_peer: bool,
    /// UC: the message in progress lost a packet; drop until the next one starts.
    uc_dropping: bool,
    events: VecDeque<QpEvent>,
}

impl RcQp {
    /// A QP in INIT with `cfg`'s identity; the rest of `cfg` is set by
    /// [`enter_rtr`](Self::enter_rtr) and [`enter_rts`](Self::enter_rts).
    #[cfg(test)]
    pub(crate) fn new(cfg: RcConfig) -> RcQp {
        RcQp::with_srq(cfg, None)
    }

    /// The same, taking receive WRs from `srq` if given.
    pub(crate) fn with_srq(cfg: RcConfig, srq: Option<SharedRq>) -> RcQp {
        let max_window = cfg.max_window;
        let mut qp = RcQp {
            next_psn: cfg.sq_psn,
            una: cfg.sq_psn,
            tx_psn: cfg.sq_psn,
            epsn: cfg.rq_psn,
            retry_left: cfg.retry_cnt,
            rnr_left: cfg.rnr_retry,
            cfg,
            state: QpState::Init,
            sq: VecDeque::new(),
            sq_popped: 0,
            tx_hint: 0,
            rd_atomic_inflight: 0,
            retransmit_at: None,
            fast_rto_at: None,
            fast_backoff: 0,
            srtt: None,
            rtt_probe: None,
            sent_high: Psn::new(0),
            cwnd: CongestionWindow::new(max_window),
            counters: RcCounters::default(),
            rnr_until: None,
            read_rewound_at: None,
            notify_drained: false,
            msn: 0,
            rq: RecvQueue::new(srq),
            inbound: None,
            resources: VecDeque::new(),
            responses: VecDeque::new(),
            ack_due: None,
            nak_seq_sent: false,
            heard_from_peer: false,
            uc_dropping: false,
            events: VecDeque::new(),
        };
        qp.sent_high = qp.next_psn;
        qp
    }

    /// Mutable configuration, for attributes modify_qp may change in place
    /// (access flags, timers, retry counts).
    pub(crate) fn config_mut(&mut self) -> &mut RcConfig {
        &mut self.cfg
    }

    /// The QP state.
    pub(crate) fn state(&self) -> QpState {
        self.state
    }

    /// INIT → RTR: the responder starts at `cfg.rq_psn`.
    pub(crate) fn enter_rtr(&mut self, cfg: RcConfig) {
        self.epsn = cfg.rq_psn;
        self.cfg = cfg;
        self.state = QpState::Rtr;
    }

    /// RTR → RTS: the requester starts at `cfg.sq_psn`.
    pub(crate) fn enter_rts(&mut self, cfg: RcConfig) {
        self.next_psn = cfg.sq_psn;
        self.una = cfg.sq_psn;
        self.tx_psn = cfg.sq_psn;
        self.sent_high = cfg.sq_psn;
        self.retry_left = cfg.retry_cnt;
        self.rnr_left = cfg.rnr_retry;
        self.cwnd = CongestionWindow::new(cfg.max_window);
        self.cfg = cfg;
        self.state = QpState::Rts;
    }

    /// RTS ↔ SQD. Entering SQD with `notify`, SQ_DRAINED follows once every
    /// started send WR completed.
    pub(crate) fn set_sq_drain(&mut self, drain: bool, notify: bool) {
        self.state = if drain { QpState::Sqd } else { QpState::Rts };
        self.notify_drained = drain && notify;
        self.check_drained();
    }

    /// In SQD: send WRs that had started are still outstanding (those that
    /// had not wait for RTS and do not count).
    pub(crate) fn sq_draining(&self) -> bool {
        self.sq.iter().any(|e| e.started && e.status.is_none())
    }

    /// Send WRs waiting or in flight.
    pub(crate) fn sq_len(&self) -> usize {
        self.sq.len()
    }

    /// The QP is reset or destroyed: a receive WR it kept goes back to its SRQ.
    pub(crate) fn return_recv(&mut self) {
        self.rq.return_held();
    }

    /// Receive WRs posted and not yet consumed.
    pub(crate) fn rq_len(&self) -> usize {
        self.rq.own_len() + usize::from(matches!(self.inbound, Some(Inbound::Send { .. })))
    }

    /// Queues a send WR. In ERR it completes at once with a flush error.
    /// PSNs a send WR of `length` bytes takes.
    pub(crate) fn packets_of(&self, op: &WrOpcode, length: u32) -> u32 {
        match op {
            WrOpcode::AtomicCmpAndSwp { .. } | WrOpcode::AtomicFetchAndAdd { .. } => 1,
            _ => packets_for(length, self.cfg.mtu),
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
        let span = self.una.distance_to(self.next_psn).saturating_add(ahead);
        if self.state != QpState::Err && span.saturating_add(npkts) > MAX_PSN_SPAN {
            return Err(true);
        }
        Ok(())
    }

    pub(crate) fn post_send(&mut self, wqe: SendWqe) {
        let npkts = self.packets_of(&wqe.op, wqe.length);
        let entry = SqEntry {
            wqe,
            first_psn: self.next_psn,
            npkts,
            started: false,
            read_next: 0,
            read_chunk_end: 0,
            status: None,
        };
        if self.state == QpState::Err {
            self.events.push_back(QpEvent::SendCompletion(
                self.send_wc(&entry, WcStatus::WrFlushErr),
            ));
            return;
        }
        self.next_psn = self.next_psn.add(npkts);
        self.sq.push_back(entry);
    }

    /// Queues a receive WR. In ERR it completes at once with a flush error.
    pub(crate) fn post_recv(&mut self, wqe: RecvWqe) {
        if self.state == QpState::Err {
            self.events.push_back(QpEvent::RecvCompletion(
                recv_flush_wc(&wqe, self.cfg.qpn, self.cfg.dest_qpn),
                false,
            ));
            return;
        }
        self.rq.push(wqe);
    }

    /// The next completion or event for the engine.
    pub(crate) fn poll_event(&mut self) -> Option<QpEvent> {
        self.events.pop_front()
    }

    /// Whether a plain ACK is being held back (see [`AckPolicy::Hold`]).
    pub(crate) fn holds_ack(&self) -> bool {
        self.ack_due.is_some()
    }

    /// Whether completions or events wait for [`poll_event`](Self::poll_event).
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// When [`handle_timeout`](Self::handle_timeout) wants to run next.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        [
            self.retransmit_at,
            self.fast_rto_at,
            self.rnr_until,
            self.ack_due,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The adaptive retransmission timeout: two smoothed round trips and a
    /// margin, doubled per unanswered resend, within `[4 ms, timeout]`.
    fn fast_rto(&self) -> Duration {
        let base = self.srtt.map_or(Duration::from_millis(1), |s| {
            2 * s + Duration::from_micros(200)
        });
        let cap = self.cfg.timeout.unwrap_or(MAX_FAST_RTO).min(MAX_FAST_RTO);
        (base * (1 << self.fast_backoff.min(10))).clamp(MIN_FAST_RTO, cap.max(MIN_FAST_RTO))
    }

    // ---- errors ----------------------------------------------------------

    fn send_wc(&self, e: &SqEntry, status: WcStatus) -> WorkCompletion {
        let (opcode, byte_len) = match e.wqe.op {
            WrOpcode::Send | WrOpcode::SendWithImm { .. } => (WcOpcode::Send, 0),
            WrOpcode::RdmaWrite { .. } | WrOpcode::RdmaWriteWithImm { .. } => {
                (WcOpcode::RdmaWrite, 0)
            }
            WrOpcode::RdmaRead { .. } => (WcOpcode::RdmaRead, e.wqe.length),
            WrOpcode::AtomicCmpAndSwp { .. } => (WcOpcode::CompSwap, 8),
            WrOpcode::AtomicFetchAndAdd { .. } => (WcOpcode::FetchAdd, 8),
        };
        WorkCompletion {
            wr_id: e.wqe.wr_id,
            status,
            opcode,
            byte_len: if status == WcStatus::Success {
                byte_len
            } else {
                0
            },
            qp_num: self.cfg.qpn,
            src_qp: self.cfg.dest_qpn,
            ..Default::default()
        }
    }

    /// Moves the QP to ERR: the failed send WR (if any, at the head of the
    /// queue) completes with its status, every other send and receive WR
    /// with a flush error. Responses already queued (the NAK that explains
    /// the error) still go out.
    pub(crate) fn enter_error(&mut self) {
        if self.state == QpState::Err {
            return;
        }
        self.state = QpState::Err;
        self.retransmit_at = None;
        self.fast_rto_at = None;
        self.rnr_until = None;
        // A QP in ERR processes nothing more: queued ACKs, READ responses
        // and atomic results are dropped (no more reading its memory); only
        // the NAK that reports the error still goes out.
        self.responses.retain(|r| matches!(r, Response::Nak { .. }));
        self.ack_due = None;
        while let Some(e) = self.sq.pop_front() {
            self.sq_popped += 1;
            let status = e.status.unwrap_or(WcStatus::WrFlushErr);
            // Successful ones completed earlier would have left the queue.
            let wc = self.send_wc(&e, status);
            if status != WcStatus::Success || e.wqe.signaled {
                self.events.push_back(QpEvent::SendCompletion(wc));
            }
        }
        if let Some(Inbound::Send { wqe, .. }) = self.inbound.take() {
            let wc = recv_flush_wc(&wqe, self.cfg.qpn, self.cfg.dest_qpn);
            self.events.push_back(QpEvent::RecvCompletion(wc, false));
        }
        let (qpn, src_qp) = (self.cfg.qpn, self.cfg.dest_qpn);
        self.rq
            .flush(&mut self.events, |wqe| recv_flush_wc(wqe, qpn, src_qp));
        self.tx_psn = self.next_psn;
    }

    /// Completes the WR at the head of the send queue with an error and
    /// moves to ERR.
    fn fail_head(&mut self, status: WcStatus) {
        if let Some(head) = self.sq.front_mut() {
            head.status = Some(status);
        }
        self.enter_error();
    }

    // ---- transmit ---------------------------------------------------------

    /// Writes the next packet to send into `buf` (at least
    /// `header room + MTU` bytes) and returns its length, or `None` when
    /// nothing is due. The ICRC field is left zero for the engine.
    ///
    /// Responses go first, except a plain ACK: it goes after this QP's own
    /// requests, or — under [`AckPolicy::Hold`] — stays back until
    /// [`ACK_HOLD`] has passed (see [`next_timeout`](Self::next_timeout)).
    pub(crate) fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &dyn Memory,
        buf: &mut TxBuffer<'_>,
        acks: AckPolicy,
    ) -> Option<usize> {
        // Only a lone ACK is held: anything queued with it goes now.
        let plain_ack = matches!(self.responses.front(), Some(Response::Ack { .. }));
        let lone_ack = plain_ack && self.responses.len() == 1;
        if !plain_ack {
            self.ack_due = None;
            if let Some(n) = self.transmit_response(mem, buf) {
                return Some(n);
            }
        }
        if let Some(n) = self.transmit_next_request(now, mem, buf) {
            return Some(n);
        }
        if !plain_ack {
            return None;
        }
        let due = *self.ack_due.get_or_insert(now + ACK_HOLD);
        if acks == AckPolicy::Hold && lone_ack && now < due {
            return None;
        }
        self.ack_due = None;
        self.transmit_response(mem, buf)
    }

    fn transmit_next_request(
        &mut self,
        now: Instant,
        mem: &dyn Memory,
        buf: &mut TxBuffer<'_>,
    ) -> Option<usize> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        if let Some(until) = self.rnr_until {
            if now < until {
                return None;
            }
            self.rnr_until = None;
        }
        loop {
            if self.tx_psn == self.next_psn
                || self.una.distance_to(self.tx_psn) >= self.cwnd.packets()
            {
                return None;
            }
            let holds =
                |e: &SqEntry| e.first_psn.distance_to(self.tx_psn) < e.npkts && e.status.is_none();
            // The WR sent last, or the next one, usually holds tx_psn: look
            // there before scanning the queue (a window may hold hundreds).
            let hint = self.tx_hint.wrapping_sub(self.sq_popped) as usize;
            let idx = [hint, hint.wrapping_add(1)]
                .into_iter()
                .find(|&i| self.sq.get(i).is_some_and(holds))
                .or_else(|| self.sq.iter().position(holds));
            let Some(idx) = idx else {
                // Everything from tx_psn on already completed (e.g. after a rewind).
                self.tx_psn = self.next_psn;
                return None;
            };
            self.tx_hint = self.sq_popped.wrapping_add(idx as u64);
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
        let mtu = self.cfg.mtu;
        let e = &self.sq[idx];
        // In SQD no WR that has not started may start.
        if self.state == QpState::Sqd && !e.started {
            return Transmit::Blocked;
        }
        let k = e.first_psn.distance_to(self.tx_psn);
        let mut bth = BthRepr::new(Opcode::RC_SEND_ONLY, self.cfg.dest_qpn, self.tx_psn);
        bth.pkey = self.cfg.pkey;
        let mut p = PacketRepr::new(bth);
        let mut payload = None;
        let mut next_tx = self.tx_psn.next();
        let mut read_chunk_end = None;
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
                let chunk_end = if e.read_next >= e.read_chunk_end {
                    // A new chunk, as much as the window holds now.
                    (e.read_next + read_chunk(mtu).min(self.cwnd.packets())).min(e.npkts)
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
                read_chunk_end = Some(chunk_end);
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
                if pos.ends_message() {
                    p.imm_dt = imm.map(ImmDtRepr);
                    p.bth.solicited = e.wqe.solicited;
                    p.bth.ack_req = true;
                } else {
                    // Ask for an ACK regularly, and whenever this packet
                    // fills the window, so a sender held by it is answered.
                    let fills = self.una.distance_to(self.tx_psn) + 1 >= self.cwnd.packets();
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
        let Ok(total) = p.emit_around_payload(len as usize, tx.bytes) else {
            return Transmit::Blocked;
        };
        if len > 0 {
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
        let e = &mut self.sq[idx];
        if let Some(end) = read_chunk_end {
            e.read_chunk_end = end;
        }
        if !e.started {
            e.started = true;
            if e.is_rd_atomic() {
                self.rd_atomic_inflight += 1;
            }
        }
        let psn = self.tx_psn;
        if psn.is_before(self.sent_high) {
            self.counters.retransmitted += 1;
        } else {
            if self.rtt_probe.is_none() {
                self.rtt_probe = Some((psn, now));
            }
            self.sent_high = next_tx;
        }
        self.tx_psn = next_tx;
        if unreliable {
            // Sent is done: the WR completes with its last packet.
            self.una = next_tx;
            self.rtt_probe = None;
            let e = &mut self.sq[idx];
            if e.first_psn.distance_to(next_tx) >= e.npkts {
                e.status = Some(WcStatus::Success);
                self.pop_completed();
            }
            return Transmit::Sent(total);
        }
        if self.retransmit_at.is_none() {
            self.retransmit_at = self.cfg.timeout.map(|t| now + t);
        }
        if self.fast_rto_at.is_none() {
            self.fast_rto_at = Some(now + self.fast_rto());
        }
        Transmit::Sent(total)
    }

    /// Completes send WR `idx` with `status` (a local error) and moves to ERR.
    pub(super) fn fail_at(&mut self, idx: usize, status: WcStatus) {
        // WRs before it that were acknowledged completed already; those still
        // in flight are flushed along with it, in order.
        self.sq[idx].status = Some(status);
        for e in self.sq.iter_mut().take(idx) {
            e.status.get_or_insert(WcStatus::WrFlushErr);
        }
        self.enter_error();
    }

    fn may_issue_rd_atomic(&self, idx: usize) -> bool {
        self.rd_atomic_inflight < u32::from(self.cfg.max_rd_atomic.max(1))
            && !(self.sq[idx].wqe.fence && self.fence_blocks(idx))
    }

    /// A fenced WR waits for every earlier READ and atomic to complete.
    fn fence_blocks(&self, idx: usize) -> bool {
        self.sq
            .iter()
            .take(idx)
            .any(|e| e.is_rd_atomic() && e.status.is_none())
    }

    fn transmit_response(&mut self, mem: &dyn Memory, tx: &mut TxBuffer<'_>) -> Option<usize> {
        let r = *self.responses.front()?;
        let mut bth = BthRepr::new(Opcode::RC_ACKNOWLEDGE, self.cfg.dest_qpn, Psn::new(0));
        bth.pkey = self.cfg.pkey;
        let mut p = PacketRepr::new(bth);
        let n = match r {
            Response::Ack { psn, msn } => {
                p.bth.psn = psn;
                p.aeth = Some(AethRepr {
                    syndrome: CREDITS,
                    msn,
                });
                self.responses.pop_front();
                p.emit(tx.bytes).ok()?
            }
            Response::Nak { psn, syndrome, msn } => {
                p.bth.psn = psn;
                p.aeth = Some(AethRepr { syndrome, msn });
                self.responses.pop_front();
                p.emit(tx.bytes).ok()?
            }
            Response::Atomic { psn, orig, msn } => {
                p.bth.opcode = Opcode::RC_ATOMIC_ACKNOWLEDGE;
                p.bth.psn = psn;
                p.aeth = Some(AethRepr {
                    syndrome: CREDITS,
                    msn,
                });
                p.atomic_ack_eth = Some(AtomicAckEthRepr { orig });
                self.responses.pop_front();
                p.emit(tx.bytes).ok()?
            }
            Response::Read {
                first_psn,
                k,
                npkts,
                va,
                rkey,
                len,
                msn,
            } => {
                let mtu = self.cfg.mtu;
                let pos = position(k, npkts);
                let offset = k * mtu;
                let plen = mtu.min(len - offset.min(len));
                p.bth.opcode = read_response_opcode(pos);
                p.bth.psn = first_psn.add(k);
                if matches!(pos, Position::First | Position::Last | Position::Only) {
                    p.aeth = Some(AethRepr {
                        syndrome: CREDITS,
                        msn,
                    });
                }
                let total = p.emit_around_payload(plen as usize, tx.bytes).ok()?;
                let start = p.header_len();
                let va = va.wrapping_add(u64::from(offset));
                let pd = self.cfg.pd;
                let read = match tx.refs.as_deref_mut() {
                    Some(refs) if plen > 0 => {
                        let kind = AccessKind::RemoteRead;
                        mem.check(rkey, va, u64::from(plen), pd, kind).map(|()| {
                            refs.push(PayloadRef {
                                at: u32::try_from(start).unwrap_or(u32::MAX),
                                key: rkey,
                                va,
                                len: plen,
                                pd,
                                kind,
                            });
                        })
                    }
                    _ => mem.read(
                        rkey,
                        va,
                        pd,
                        AccessKind::RemoteRead,
                        &mut tx.bytes[start..start + plen as usize],
                    ),
                };
                if read.is_err() {
                    // The MR went away after the request was checked.
                    self.responses.pop_front();
                    self.refuse(p.bth.psn, Refusal::Access);
                    return self.transmit_response(mem, tx);
                }
                if k + 1 == npkts {
                    self.responses.pop_front();
                } else if let Some(Response::Read { k, .. }) = self.responses.front_mut() {
                    *k += 1;
                }
                total
            }
        };
        Some(n)
    }

    // ---- receive ----------------------------------------------------------

    /// Handles a packet for this QP (already ICRC-checked and parsed); why
    /// it was dropped unread, if it was.
    pub(crate) fn handle_packet(
        &mut self,
        pkt: &PacketRepr<'_>,
        now: Instant,
        mem: &dyn Memory,
    ) -> Result<(), RxDrop> {
        let Some(info) = pkt.info() else {
            return Err(RxDrop::WrongTransport);
        };
        if info.transport != self.cfg.transport || pkt.bth.dest_qp != self.cfg.qpn {
            return Err(RxDrop::WrongTransport);
        }
        if matches!(self.state, QpState::Reset | QpState::Init | QpState::Err) {
            return Err(RxDrop::NotReceiving);
        }
        if !pkey_matches(pkt.bth.pkey, self.cfg.pkey) {
            return Err(RxDrop::PKey);
        }
        if self.state == QpState::Rtr && !self.heard_from_peer {
            self.events
                .push_back(QpEvent::Async(AsyncEventType::CommEst));
        }
        self.heard_from_peer = true;
        match info.operation {
            Operation::Send
            | Operation::RdmaWrite
            | Operation::RdmaReadRequest
            | Operation::CompareSwap
            | Operation::FetchAdd => self.handle_request(pkt, info.position, mem),
            Operation::Acknowledge | Operation::AtomicAcknowledge | Operation::RdmaReadResponse => {
                if matches!(self.state, QpState::Rts | QpState::Sqd) {
                    self.handle_response(pkt, info.position, now, mem);
                }
            }
            Operation::Cnp => {}
        }
        Ok(())
    }

    // ---- timers -----------------------------------------------------------

    /// Runs expired timers: retransmission (go back to the oldest
    /// unacknowledged PSN, or RETRY_EXC_ERR) and the RNR wait.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if self.rnr_until.is_some_and(|t| t <= now) {
            self.rnr_until = None;
        }
        let outstanding = self.una.is_before(self.sent_high);
        if !outstanding {
            self.retransmit_at = None;
            self.fast_rto_at = None;
        }
        if self.retransmit_at.is_some_and(|t| t <= now) {
            if self.retry_left == 0 {
                self.fail_head(WcStatus::RetryExcErr);
                return;
            }
            self.retry_left -= 1;
            self.counters.timeouts += 1;
            self.counters.window_cuts += 1;
            self.cwnd.on_timeout(self.sent_high);
            self.rewind();
            self.retransmit_at = self.cfg.timeout.map(|t| now + t);
        }
        if self.fast_rto_at.is_some_and(|t| t <= now) && self.rnr_until.is_none() {
            self.counters.timeouts += 1;
            self.cut_window();
            self.rewind();
            self.fast_backoff = (self.fast_backoff + 1).min(10);
            self.fast_rto_at = Some(now + self.fast_rto());
        }
    }

    /// Go back N for a lost READ response, once per resume point: further
    /// signs of the same loss (later responses, ACKs past the READ) while
    /// the request is being asked again do not resend the window again —
    /// if the new request is lost too, the retransmission timer resends.
    fn rewind_for_read(&mut self) {
        let resume = self
            .sq
            .iter()
            .find(|e| e.status.is_none())
            .map(|e| e.resume_psn());
        if resume.is_some() && self.read_rewound_at == resume {
            return;
        }
        self.read_rewound_at = resume;
        self.cut_window();
        self.rewind();
    }

    /// A loss was detected: the congestion window shrinks (once per window).
    pub(super) fn cut_window(&mut self) {
        if self.cwnd.on_loss(self.sent_high) {
            self.counters.window_cuts += 1;
        }
    }

    /// Go back N: resend from the oldest unacknowledged PSN.
    fn rewind(&mut self) {
        self.rtt_probe = None;
        self.tx_psn = match self.sq.iter().find(|e| e.status.is_none()) {
            Some(e) if e.is_read() => e.resume_psn(),
            Some(e) if e.first_psn.is_before(self.una) => self.una,
            Some(e) => e.first_psn,
            None => self.next_psn,
        };
    }

    fn check_drained(&mut self) {
        if self.state == QpState::Sqd && self.notify_drained && !self.sq_draining() {
            self.notify_drained = false;
            self.events
                .push_back(QpEvent::Async(AsyncEventType::SqDrained));
        }
    }
}

enum Transmit {
    Sent(usize),
    Blocked,
    Failed,
}

mod completer;
mod responder;
