//! Reliable Connected (and Unreliable Connected) queue pairs, following
//! IBTA vol. 1 ch. 9 as the Linux rxe driver implements it, and split by
//! role as rxe splits a QP into `qp->req`, `qp->comp` and `qp->resp`:
//!
//! - [`requester`]: the send queue — segmentation, the PSN window and
//!   congestion window, AckReq pacing, READ/atomic credits and fences,
//!   go-back-N retransmission on timeout or NAK, RNR waits;
//! - [`completer`]: what comes back for those requests — cumulative ACKs,
//!   READ responses, atomic ACKs, the retry budgets and retransmission
//!   timers, and the send completions, in order;
//! - [`responder`]: the peer's requests — PSN checks with one NAK per gap,
//!   duplicate re-ACKs, READ and atomic replay from saved resources, RNR
//!   NAKs, every remote access checked — and the coalesced ACKs, NAKs and
//!   READ and atomic responses it owes.
//!
//! This module is the [`RcQp`] shell the three share: construction, the QP
//! state and its transitions, the configuration ([`RcConfig`]) and counters
//! ([`RcCounters`]), the timers, the event queue, and the entry points the
//! engine drives ([`RcQp::poll_transmit`], [`RcQp::handle_packet`],
//! [`RcQp::handle_timeout`], [`RcQp::poll_event`]), which hand each packet
//! to the role it is for. Each role keeps its state in its own struct
//! ([`RequesterState`], [`CompleterState`], [`ResponderState`]); the roles'
//! methods are `impl RcQp` blocks in their modules, as each reaches into
//! the others' state where the protocol ties them (an ACK moves the
//! requester's window, a NAK rewinds it).
//!
//! Nothing here sleeps or touches a socket: see the module docs of
//! [`super`].

mod completer;
mod requester;
mod responder;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rverbs_wire::{Operation, PacketRepr, Position, Psn, RnrTimer, Transport};

use self::completer::CompleterState;
use self::requester::RequesterState;
use self::responder::ResponderState;
use super::recv::SharedRq;
use super::{pkey_matches, Memory, QpEvent, RxDrop, TxBuffer};
use crate::attr::AccessFlags;
use crate::event::AsyncEventType;
use crate::wc::WcStatus;
use crate::wr::QpState;

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
    /// refused for no receive WR or as an invalid request (too long, bad
    /// opcode sequence) — and the packets after the first of a message
    /// refused for access.
    pub(crate) uc_dropped: u64,
    /// UC messages refused for a remote access error (bad rkey, bounds,
    /// rights, PD): one per message, counted at its refused packet. UC sends
    /// no NAK, so this is how an rkey sweep shows.
    pub(crate) uc_access_refused: u64,
    /// ACKs, NAKs, READ responses and atomic ACKs dropped for naming a PSN
    /// this requester never sent (posted work not yet on the wire, or
    /// beyond): forged, or from a confused peer.
    pub(crate) acks_for_unsent: u64,
    /// RC request packets dropped for arriving ahead of the expected PSN
    /// (after a loss): the first of a gap is answered with one sequence
    /// NAK, it and the rest are dropped until the missing PSN comes.
    pub(crate) out_of_sequence: u64,
    /// READ and atomic requests refused (NAK invalid request, the QP to
    /// ERR) for exceeding this responder's resources: a new one while the
    /// oldest of `max_dest_rd_atomic` is still being answered, or any when
    /// `max_dest_rd_atomic` is 0. Also counted in `fatal_naks_sent`.
    pub(crate) rd_atomic_over_limit: u64,
    /// READ responses dropped at the expected PSN for an opcode out of
    /// place in their response stream, or a NAK in their AETH.
    pub(crate) read_responses_out_of_place: u64,
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
        self.uc_access_refused += other.uc_access_refused;
        self.acks_for_unsent += other.acks_for_unsent;
        self.out_of_sequence += other.out_of_sequence;
        self.rd_atomic_over_limit += other.rd_atomic_over_limit;
        self.read_responses_out_of_place += other.read_responses_out_of_place;
    }
}

/// One RC queue pair's transport state: each role's own, and what they
/// share.
pub(crate) struct RcQp {
    cfg: RcConfig,
    state: QpState,
    /// The send queue and what puts its requests on the wire.
    req: RequesterState,
    /// What came back for those requests: acknowledgement, retries, timers.
    comp: CompleterState,
    /// The peer's requests and what they are owed.
    resp: ResponderState,
    pub(crate) counters: RcCounters,
    /// Whether any packet arrived yet (for COMM_EST in RTR).
    heard_from_peer: bool,
    /// Completions and async events for the engine, in order.
    events: VecDeque<QpEvent>,
    /// The payload bytes per request packet this QP cuts messages into,
    /// when not the path MTU: a QP whose peer is on this host (the
    /// same-host path) sends much larger packets, fixed when it enters
    /// RTR (PSNs are counted in them from the first post on).
    segment: Option<u32>,
    /// With `segment`: the most packets in flight (its window's cap).
    segment_window: u32,
    /// The segment size of the peer's requests in the packet being handled
    /// (the path MTU unless a same-host packet says otherwise).
    rx_segment: u32,
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
        RcQp {
            req: RequesterState::new(&cfg),
            comp: CompleterState::new(&cfg),
            resp: ResponderState::new(&cfg, srq),
            cfg,
            state: QpState::Init,
            counters: RcCounters::default(),
            heard_from_peer: false,
            events: VecDeque::new(),
            segment: None,
            segment_window: WINDOW,
            rx_segment: 0,
        }
    }

    /// Cuts this QP's messages into packets of `bytes` of payload instead
    /// of the path MTU (`None`: the MTU again), with at most `window` of
    /// them in flight. For a QP whose packets go through a same-host ring;
    /// set before it first posts (entering RTR).
    pub(crate) fn set_segment(&mut self, bytes: Option<u32>, window: u32) {
        self.segment = bytes;
        self.segment_window = window.max(1);
    }

    /// Payload bytes per packet this QP's messages are cut into: the path
    /// MTU, or the same-host segment.
    pub(crate) fn segment(&self) -> u32 {
        self.segment.unwrap_or(self.cfg.mtu)
    }

    /// Mutable configuration, for attributes modify_qp may change in place
    /// (access flags, timers, retry counts).
    pub(crate) fn config_mut(&mut self) -> &mut RcConfig {
        &mut self.cfg
    }

    /// Responses (ACKs, NAKs, READ response streams, atomic ACKs) owed
    /// and not yet sent.
    #[cfg(test)]
    pub(crate) fn responses_owed(&self) -> usize {
        self.resp.responses_owed()
    }

    /// The PSN the responder takes a new request at (the simulator's
    /// buggy peer withholds wrong requests there: nothing could tell them
    /// from genuine ones).
    #[cfg(test)]
    pub(crate) fn expected_request_psn(&self) -> Psn {
        self.resp.epsn
    }

    /// The PSN whose READ response or atomic ACK the completer would place
    /// next in local memory, if it waits for one: that of the first READ or
    /// atomic not done (a response acknowledges the requests before it).
    #[cfg(test)]
    pub(crate) fn placing_psn(&self) -> Option<Psn> {
        let e = self
            .req
            .sq
            .iter()
            .find(|e| e.status.is_none() && e.is_rd_atomic())?;
        Some(e.resume_psn())
    }

    /// The QP state.
    pub(crate) fn state(&self) -> QpState {
        self.state
    }

    /// INIT → RTR: the responder starts at `cfg.rq_psn`.
    pub(crate) fn enter_rtr(&mut self, cfg: RcConfig) {
        self.resp.epsn = cfg.rq_psn;
        self.cfg = cfg;
        self.state = QpState::Rtr;
    }

    /// RTR → RTS: the requester starts at `cfg.sq_psn`.
    pub(crate) fn enter_rts(&mut self, mut cfg: RcConfig) {
        if self.segment.is_some() {
            cfg.max_window = cfg.max_window.min(self.segment_window);
        }
        self.req.enter_rts(&cfg);
        self.comp.enter_rts(&cfg);
        self.cfg = cfg;
        self.state = QpState::Rts;
    }

    /// RTS ↔ SQD. Entering SQD with `notify`, SQ_DRAINED follows once every
    /// started send WR completed.
    pub(crate) fn set_sq_drain(&mut self, drain: bool, notify: bool) {
        self.state = if drain { QpState::Sqd } else { QpState::Rts };
        self.req.notify_drained = drain && notify;
        self.check_drained();
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
        self.comp.retransmit_at = None;
        self.comp.fast_rto_at = None;
        self.req.rnr_until = None;
        self.flush_send_queue();
        self.flush_responder();
        self.req.tx_psn = self.req.next_psn;
    }

    /// The next completion or event for the engine.
    pub(crate) fn poll_event(&mut self) -> Option<QpEvent> {
        self.events.pop_front()
    }

    /// Whether completions or events wait for [`poll_event`](Self::poll_event).
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
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
        let plain_ack = self.resp.plain_ack_next();
        let lone_ack = plain_ack && self.resp.responses_owed() == 1;
        if !plain_ack {
            self.resp.ack_due = None;
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
        let due = *self.resp.ack_due.get_or_insert(now + ACK_HOLD);
        if acks == AckPolicy::Hold && lone_ack && now < due {
            return None;
        }
        self.resp.ack_due = None;
        self.transmit_response(mem, buf)
    }

    // ---- receive ----------------------------------------------------------

    /// Handles a packet for this QP (already ICRC-checked and parsed); why
    /// it was dropped unread, if it was. `segment`: for a packet from a
    /// same-host ring, the payload bytes per packet its sender cuts its
    /// requests into (`None`: the path MTU, as on the wire).
    pub(crate) fn handle_packet(
        &mut self,
        pkt: &PacketRepr<'_>,
        now: Instant,
        mem: &dyn Memory,
        segment: Option<u32>,
    ) -> Result<(), RxDrop> {
        self.rx_segment = segment.unwrap_or(self.cfg.mtu);
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
            | Operation::FetchAdd
            | Operation::AtomicWrite => self.handle_request(pkt, info.position, mem),
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

    /// When [`handle_timeout`](Self::handle_timeout) wants to run next.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        [
            self.comp.retransmit_at,
            self.comp.fast_rto_at,
            self.req.rnr_until,
            self.resp.ack_due,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Runs expired timers: retransmission (go back to the oldest
    /// unacknowledged PSN, or RETRY_EXC_ERR) and the RNR wait.
    /// Puts off retransmission timers that are due until `until`: the
    /// engine knows the packets are not lost, only not yet read (they wait
    /// in a same-host ring whose reader is alive and busy).
    pub(crate) fn postpone_retransmission(&mut self, now: Instant, until: Instant) {
        for t in [&mut self.comp.retransmit_at, &mut self.comp.fast_rto_at] {
            if t.is_some_and(|t| t <= now) {
                *t = Some(until);
            }
        }
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if self.req.rnr_until.is_some_and(|t| t <= now) {
            self.req.rnr_until = None;
        }
        let outstanding = self.comp.una.is_before(self.req.sent_high);
        if !outstanding {
            self.comp.retransmit_at = None;
            self.comp.fast_rto_at = None;
        }
        // The adaptive timer resent since the last progress, and that
        // resend is not yet overdue by its own measure: a due IBTA timer
        // waits for it. A peer kept off the cores a little past `timeout`
        // (a host stall) is resent to once, not again a few milliseconds
        // after the adaptive timer. A dead peer's retries each come at most
        // one adaptive timeout late (at most 2 × `timeout` apart, within
        // the 4× IBTA allows).
        let fast_resend_pending =
            self.comp.fast_backoff > 0 && self.comp.fast_rto_at.is_some_and(|f| f > now);
        if fast_resend_pending && self.comp.retransmit_at.is_some_and(|t| t <= now) {
            self.comp.retransmit_at = self.comp.fast_rto_at;
        }
        if self.comp.retransmit_at.is_some_and(|t| t <= now) {
            if self.comp.retry_left == 0 {
                self.fail_head(WcStatus::RetryExcErr);
                return;
            }
            self.comp.retry_left -= 1;
            self.counters.timeouts += 1;
            self.counters.window_cuts += 1;
            self.req.cwnd.on_timeout(self.req.sent_high);
            self.rewind();
            self.comp.retransmit_at = self.cfg.timeout.map(|t| now + t);
            // The resend just made is the adaptive timer's too: it waits a
            // whole timeout of its own rather than resending again at once.
            if self.comp.fast_rto_at.is_some() {
                self.comp.fast_rto_at = Some(now + self.fast_rto());
            }
        }
        let late_put_off = self
            .comp
            .fast_rto_at
            .filter(|&t| t <= now)
            .is_some_and(|due| self.defer_late_fast_rto(due, now));
        if !late_put_off
            && self.comp.fast_rto_at.is_some_and(|t| t <= now)
            && self.req.rnr_until.is_none()
        {
            self.counters.timeouts += 1;
            self.cut_window();
            self.rewind();
            self.comp.fast_backoff = (self.comp.fast_backoff + 1).min(10);
            self.comp.fast_rto_at = Some(now + self.fast_rto());
        }
        if let Some(rnr_end) = self.req.rnr_until {
            // Waiting out an RNR NAK, the adaptive timer (armed by progress
            // made meanwhile: a READ response that came late) waits with
            // it; left in the past, it kept the QP's next timer due, and
            // whoever drives the timers spun until the wait ended.
            if self.comp.fast_rto_at.is_some_and(|t| t <= now) {
                self.comp.fast_rto_at = Some(rnr_end);
            }
        }
    }
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

/// Packets a message of `len` bytes needs at `mtu` (at least one).
fn packets_for(len: u32, mtu: u32) -> u32 {
    len.div_ceil(mtu).max(1)
}
