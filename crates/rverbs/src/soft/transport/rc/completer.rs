//! The completer (rxe's `qp->comp`): what the requester learns from ACKs,
//! NAKs, RNR NAKs, READ responses and atomic ACKs (and the zero-length READ
//! response rxe answers an ATOMIC WRITE with) — cumulative
//! acknowledgement, READ data and atomic results placed, retry budgets
//! spent or restored, the retransmission timers and the round-trip
//! estimate behind them — and the send completions it reports, in order,
//! errors and flushes included.

use std::time::{Duration, Instant};

use rverbs_wire::{NakCode, Opcode, PacketRepr, Position, Psn, Syndrome};

use super::requester::SqEntry;
use super::{RcConfig, RcQp};
use crate::soft::transport::{scatter, Memory, QpEvent, WqeData};
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};
use crate::wr::{QpState, WrOpcode};

/// Bounds of the adaptive retransmission timer. The floor sits above the
/// scheduling delays of a busy host: on two cores shared by spinning
/// threads, a peer is now and then off the CPU for several milliseconds
/// (a 0.5 ms floor resent up to a whole window, 2 MiB, on a lossless
/// loopback once or twice a second; a 4 ms floor still resent now and
/// then beside CPU hogs). A lost tail still recovers faster than the IBTA
/// timeout's tens of milliseconds, without spending a retry.
const MIN_FAST_RTO: Duration = Duration::from_millis(10);
const MAX_FAST_RTO: Duration = Duration::from_secs(1);
/// How long the largest recent round trip counts for the adaptive timer.
const RTT_PEAK_MEMORY: Duration = Duration::from_secs(2);
/// An adaptive timer that runs this late says the host is busy: our own
/// threads were kept off the cores, and the peer's ACK, on a host as busy,
/// may be late for the same reason. It waits as long again (at most one
/// more timeout), once, before it resends. The engine's own deferral of
/// timers while packets wait in its socket (2 ms) ends this late too: a
/// backlog that long is a busy host as well.
const LATE_TIMER: Duration = Duration::from_millis(2);

/// What the completer keeps: how far the peer acknowledged, the retry
/// budgets, and the retransmission timers with the round-trip estimate
/// that sets them.
pub(super) struct CompleterState {
    /// Oldest PSN not yet acknowledged.
    pub(super) una: Psn,
    /// Retries left (`retry_cnt`) before RETRY_EXC_ERR.
    pub(super) retry_left: u8,
    /// RNR retries left (`rnr_retry`) before RNR_RETRY_EXC_ERR.
    rnr_left: u8,
    /// The IBTA local ACK timer: `timeout` without progress spends a retry.
    pub(super) retransmit_at: Option<Instant>,
    /// The adaptive timer: a few round trips without progress resend from
    /// the oldest unacknowledged PSN at once, without spending a retry, so a
    /// lost tail costs about a round trip instead of a whole `timeout`.
    pub(super) fast_rto_at: Option<Instant>,
    pub(super) fast_backoff: u32,
    /// The adaptive timer, found late, was put off once (see
    /// [`LATE_TIMER`]); cleared by progress.
    pub(super) fast_deferred: bool,
    /// Smoothed round trip (RFC 6298's SRTT; `None` before a sample).
    srtt: Option<Duration>,
    /// Its mean deviation (RTTVAR).
    rttvar: Duration,
    /// The largest round trip measured, and when: a sample replaces it if
    /// larger, or once it is [`RTT_PEAK_MEMORY`] old. A peer that was once
    /// off the CPU for milliseconds can be again, whatever the average
    /// says.
    rtt_peak: Option<(Duration, Instant)>,
    /// A new packet being timed for the round-trip estimate (Karn: never a
    /// retransmitted one).
    pub(super) rtt_probe: Option<(Psn, Instant)>,
}

impl CompleterState {
    /// Nothing acknowledged yet: `cfg.sq_psn` is the oldest PSN, with the
    /// full retry budgets.
    pub(super) fn new(cfg: &RcConfig) -> CompleterState {
        CompleterState {
            una: cfg.sq_psn,
            retry_left: cfg.retry_cnt,
            rnr_left: cfg.rnr_retry,
            retransmit_at: None,
            fast_rto_at: None,
            fast_backoff: 0,
            fast_deferred: false,
            srtt: None,
            rttvar: Duration::ZERO,
            rtt_peak: None,
            rtt_probe: None,
        }
    }

    /// RTR → RTS: acknowledgement starts at `cfg.sq_psn`, with the full
    /// retry budgets.
    pub(super) fn enter_rts(&mut self, cfg: &RcConfig) {
        self.una = cfg.sq_psn;
        self.retry_left = cfg.retry_cnt;
        self.rnr_left = cfg.rnr_retry;
    }
}

impl CompleterState {
    /// A round trip measured at `now` (RFC 6298's smoothing).
    fn rtt_sample(&mut self, sample: Duration, now: Instant) {
        match self.srtt {
            None => {
                self.srtt = Some(sample);
                self.rttvar = sample / 2;
            }
            Some(srtt) => {
                let dev = srtt.abs_diff(sample);
                self.rttvar = (self.rttvar * 3 + dev) / 4;
                self.srtt = Some((srtt * 7 + sample) / 8);
            }
        }
        let keep = self.rtt_peak.is_some_and(|(p, at)| {
            p >= sample && now.saturating_duration_since(at) < RTT_PEAK_MEMORY
        });
        if !keep {
            self.rtt_peak = Some((sample, now));
        }
    }
}

impl RcQp {
    // ---- responses --------------------------------------------------------

    pub(super) fn handle_response(
        &mut self,
        pkt: &PacketRepr<'_>,
        _pos: Position,
        now: Instant,
        mem: &dyn Memory,
    ) {
        let psn = pkt.bth.psn;
        // Only PSNs this requester sent and has not seen acknowledged count.
        // Sent: below `sent_high`, not merely posted (`next_psn`) — work
        // held back by the window, a credit or a fence was acknowledged by
        // no genuine peer (rxe ignores such responses too). This bounds
        // READ responses to the range asked for as well: while a READ is
        // incomplete nothing after the chunk last asked for goes out.
        // Below `una`: an old or duplicate response, ignored unremarked.
        if !psn.in_window(self.comp.una, self.comp.una.distance_to(self.req.sent_high)) {
            if !psn.is_before(self.comp.una) {
                self.counters.acks_for_unsent += 1;
            }
            return;
        }
        match pkt.bth.opcode {
            Opcode::RC_ACKNOWLEDGE => {
                let Some(aeth) = pkt.aeth else { return };
                match aeth.syndrome {
                    Syndrome::Ack { .. } => self.ack_through(psn, now),
                    Syndrome::RnrNak(timer) => {
                        self.counters.rnr_naks_received += 1;
                        self.ack_through(psn.sub(1), now);
                        if self.state == QpState::Err {
                            return;
                        }
                        if self.comp.rnr_left == 0 {
                            self.fail_head(WcStatus::RnrRetryExcErr);
                            return;
                        }
                        if self.cfg.rnr_retry != 7 {
                            self.comp.rnr_left -= 1;
                        }
                        self.req.rnr_until = Some(now + timer.duration());
                        self.comp.retransmit_at = None;
                        self.comp.fast_rto_at = None;
                        self.rewind();
                    }
                    Syndrome::Nak(NakCode::PsnSequenceError) => {
                        self.counters.seq_naks_received += 1;
                        self.ack_through(psn.sub(1), now);
                        if self.state == QpState::Err || self.req.rnr_until.is_some() {
                            // Waiting out an RNR NAK, which goes back anyway.
                            return;
                        }
                        // One retry per loss event, as rxe counts them: once
                        // a sequence NAK has sent the requester back, later
                        // ones before any progress — a copy of it, or a gap
                        // behind a READ whose responses were lost, which the
                        // go-back resends anyway — spend no second retry and
                        // cause no second go-back (the timer still counts).
                        if self.req.seq_nak_at.is_some() {
                            return;
                        }
                        self.req.seq_nak_at = Some(psn);
                        if self.comp.retry_left == 0 {
                            self.fail_head(WcStatus::RetryExcErr);
                            return;
                        }
                        self.comp.retry_left -= 1;
                        self.cut_window();
                        self.rewind();
                    }
                    Syndrome::Nak(code) => {
                        self.ack_through(psn.sub(1), now);
                        let status = match code {
                            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                            NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                            NakCode::InvalidRdRequest | NakCode::PsnSequenceError => {
                                WcStatus::RemInvRdReqErr
                            }
                        };
                        // The WR the NAKed PSN belongs to takes the error;
                        // earlier ones still incomplete (a READ whose
                        // response was lost) are flushed before it.
                        let nacked = self.req.sq.iter().position(|e| {
                            e.status.is_none() && e.first_psn.distance_to(psn) < e.npkts
                        });
                        match nacked {
                            Some(idx) => self.fail_at(idx, status),
                            None => self.fail_head(status),
                        }
                    }
                }
            }
            Opcode::RC_ATOMIC_ACKNOWLEDGE => {
                let Some(orig) = pkt.atomic_ack_eth.map(|a| a.orig) else {
                    return;
                };
                self.ack_through(psn.sub(1), now);
                let Some(head) = self.req.sq.front() else {
                    return;
                };
                if head.first_psn != psn || !head.is_rd_atomic() || head.is_read() {
                    return; // a duplicate
                }
                let placed = match &head.wqe.data {
                    WqeData::Sges(sges) => scatter(mem, self.cfg.pd, sges, 0, &orig.to_ne_bytes()),
                    WqeData::Inline(_) => Ok(()),
                };
                if placed.is_err() {
                    self.fail_head(WcStatus::LocProtErr);
                    return;
                }
                self.complete_rd_atomic(now, psn);
            }
            Opcode::RC_RDMA_READ_RESPONSE_ONLY if self.answers_atomic_write(pkt) => {
                self.ack_through(psn, now);
            }
            _ => self.handle_read_response(pkt, psn, now, mem),
        }
    }

    /// Whether `pkt`, a READ RESPONSE ONLY, is the answer rxe's responder
    /// gives an ATOMIC WRITE (IBTA 1.5): no payload, an ACK in its AETH, at
    /// the PSN of an ATOMIC WRITE not yet done. It acknowledges it as a
    /// plain ACK would.
    fn answers_atomic_write(&self, pkt: &PacketRepr<'_>) -> bool {
        let ack = pkt
            .aeth
            .is_some_and(|a| matches!(a.syndrome, Syndrome::Ack { .. }));
        ack && pkt.payload.is_empty()
            && self
                .req
                .sq
                .iter()
                .any(|e| e.status.is_none() && e.first_psn == pkt.bth.psn && e.is_atomic_write())
    }

    fn handle_read_response(
        &mut self,
        pkt: &PacketRepr<'_>,
        psn: Psn,
        now: Instant,
        mem: &dyn Memory,
    ) {
        let Some(idx) = self
            .req
            .sq
            .iter()
            .position(|e| e.is_read() && e.first_psn.distance_to(psn) < e.npkts)
        else {
            return;
        };
        let first = self.req.sq[idx].first_psn;
        // A response implicitly acknowledges every earlier request.
        self.ack_through(first.sub(1), now);
        let Some(head) = self.req.sq.front() else {
            return;
        };
        if head.first_psn != first || head.status.is_some() {
            return;
        }
        let expected = head.resume_psn();
        if psn != expected {
            if expected.is_before(psn) {
                // A gap: responses were lost. Ask again from the first missing one.
                self.rewind_for_read();
            }
            return;
        }
        // In place in the response stream the last ask started, with no
        // NAK in its AETH (FIRST, LAST and ONLY carry one); anything else
        // at this PSN is a late answer to an earlier ask, or a confused or
        // forged peer, and the right packet may still come.
        let nak = pkt
            .aeth
            .is_some_and(|a| !matches!(a.syndrome, Syndrome::Ack { .. }));
        if !head.read_response_fits(pkt.bth.opcode) || nak {
            self.counters.read_responses_out_of_place += 1;
            return;
        }
        let mtu = self.segment();
        let offset = head.read_next * mtu;
        let want = mtu.min(head.wqe.length - offset.min(head.wqe.length));
        if pkt.payload.len() != want as usize {
            self.fail_head(WcStatus::BadRespErr);
            return;
        }
        let placed = match &head.wqe.data {
            WqeData::Sges(sges) => scatter(mem, self.cfg.pd, sges, u64::from(offset), pkt.payload),
            WqeData::Inline(_) => Ok(()),
        };
        if placed.is_err() {
            self.fail_head(WcStatus::LocProtErr);
            return;
        }
        let head = &mut self.req.sq[0];
        head.read_next += 1;
        if head.read_next == head.npkts {
            self.complete_rd_atomic(now, psn);
        } else {
            self.progress(psn.next(), now);
        }
    }

    /// The READ or atomic at the head of the queue is done.
    fn complete_rd_atomic(&mut self, now: Instant, last_psn: Psn) {
        if let Some(head) = self.req.sq.front_mut() {
            head.status = Some(WcStatus::Success);
        }
        self.req.rd_atomic_inflight = self.req.rd_atomic_inflight.saturating_sub(1);
        self.progress(last_psn.next(), now);
        self.pop_completed();
    }

    /// Cumulative acknowledgement of every request PSN up to `psn` (one
    /// that was sent: never past `sent_high`).
    fn ack_through(&mut self, psn: Psn, now: Instant) {
        if psn.is_before(self.comp.una) || !psn.is_before(self.req.sent_high) {
            return;
        }
        let mut lost = None;
        // An ACK inside a READ (the responder is past the chunk it asked
        // for) acknowledges no more than the READ responses placed so far.
        let mut upto = psn.next();
        for e in self.req.sq.iter_mut() {
            if e.status.is_some() {
                continue;
            }
            if psn.is_before(e.last_psn()) {
                if e.is_read() && e.resume_psn().is_before(upto) {
                    upto = e.resume_psn();
                }
                break;
            }
            if e.is_rd_atomic() {
                // Acknowledged past a READ or atomic whose response never
                // came: the response was lost. Ask again.
                lost = Some(e.resume_psn());
                break;
            }
            if e.is_atomic_write() {
                // Acknowledged (the responder executes in PSN order): its
                // credit comes back.
                self.req.rd_atomic_inflight = self.req.rd_atomic_inflight.saturating_sub(1);
            }
            e.status = Some(WcStatus::Success);
        }
        match lost {
            Some(resume) => {
                self.progress(resume, now);
                self.rewind_for_read();
            }
            None => self.progress(upto, now),
        }
        self.pop_completed();
    }

    /// The oldest unacknowledged PSN moved to `una`: restart the retry
    /// budgets and the retransmission timer.
    fn progress(&mut self, una: Psn, now: Instant) {
        if !self.comp.una.is_before(una) {
            return;
        }
        self.req.cwnd.on_ack(self.comp.una.distance_to(una), una);
        self.comp.una = una;
        self.req.read_rewound_at = None;
        self.req.seq_nak_at = None;
        if self.req.tx_psn.is_before(una) {
            self.req.tx_psn = una;
        }
        self.comp.retry_left = self.cfg.retry_cnt;
        self.comp.rnr_left = self.cfg.rnr_retry;
        if let Some((psn, sent)) = self.comp.rtt_probe {
            if psn.is_before(una) {
                let sample = now.saturating_duration_since(sent);
                self.comp.rtt_sample(sample, now);
                self.comp.rtt_probe = None;
            }
        }
        self.comp.fast_backoff = 0;
        self.comp.fast_deferred = false;
        let outstanding = self.comp.una.is_before(self.req.sent_high);
        self.comp.retransmit_at = if outstanding {
            self.cfg.timeout.map(|t| now + t)
        } else {
            None
        };
        self.comp.fast_rto_at = outstanding.then(|| now + self.fast_rto());
    }

    /// Reports finished WRs from the head of the queue, in order.
    pub(super) fn pop_completed(&mut self) {
        while self
            .req
            .sq
            .front()
            .is_some_and(|e| e.status == Some(WcStatus::Success))
        {
            let Some(e) = self.req.sq.pop_front() else {
                break;
            };
            self.req.sq_popped += 1;
            if e.wqe.signaled {
                let wc = self.send_wc(&e, WcStatus::Success);
                self.events.push_back(QpEvent::SendCompletion(wc));
            }
        }
        self.check_drained();
    }

    // ---- timers -----------------------------------------------------------

    /// The adaptive retransmission timeout: the smoothed round trip and
    /// four deviations (RFC 6298), and at least one and a half times the
    /// largest recent round trip, doubled per unanswered resend, within
    /// `[10 ms, timeout]`.
    pub(super) fn fast_rto(&self) -> Duration {
        let comp = &self.comp;
        let base = comp
            .srtt
            .map_or(Duration::from_millis(1), |s| s + 4 * comp.rttvar);
        let peak = comp.rtt_peak.map_or(Duration::ZERO, |(p, _)| p * 3 / 2);
        let cap = self.cfg.timeout.unwrap_or(MAX_FAST_RTO).min(MAX_FAST_RTO);
        (base.max(peak) * (1 << comp.fast_backoff.min(10)))
            .clamp(MIN_FAST_RTO, cap.max(MIN_FAST_RTO))
    }

    /// Whether the adaptive timer, due at `due` and found at `now`, is put
    /// off (see [`LATE_TIMER`]); if so it is re-armed.
    pub(super) fn defer_late_fast_rto(&mut self, due: Instant, now: Instant) -> bool {
        let late = now.saturating_duration_since(due);
        if late < LATE_TIMER || self.comp.fast_deferred {
            return false;
        }
        self.comp.fast_deferred = true;
        self.comp.fast_rto_at = Some(now + late.min(self.fast_rto()));
        true
    }

    // ---- completions and errors -------------------------------------------

    pub(super) fn send_wc(&self, e: &SqEntry, status: WcStatus) -> WorkCompletion {
        let (opcode, byte_len) = match e.wqe.op {
            WrOpcode::Send | WrOpcode::SendWithImm { .. } | WrOpcode::SendWithInv { .. } => {
                (WcOpcode::Send, 0)
            }
            WrOpcode::BindMw { .. } => (WcOpcode::BindMw, 0),
            WrOpcode::LocalInv { .. } => (WcOpcode::LocalInv, 0),
            WrOpcode::RdmaWrite { .. } | WrOpcode::RdmaWriteWithImm { .. } => {
                (WcOpcode::RdmaWrite, 0)
            }
            WrOpcode::RdmaRead { .. } => (WcOpcode::RdmaRead, e.wqe.length),
            WrOpcode::AtomicCmpAndSwp { .. } => (WcOpcode::CompSwap, 8),
            WrOpcode::AtomicFetchAndAdd { .. } => (WcOpcode::FetchAdd, 8),
            WrOpcode::AtomicWrite { .. } => (WcOpcode::AtomicWrite, 8),
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

    /// Completes send WR `idx` with `status` (a local error) and moves to ERR.
    pub(super) fn fail_at(&mut self, idx: usize, status: WcStatus) {
        // WRs before it that were acknowledged completed already; those still
        // in flight are flushed along with it, in order.
        self.req.sq[idx].status = Some(status);
        for e in self.req.sq.iter_mut().take(idx) {
            e.status.get_or_insert(WcStatus::WrFlushErr);
        }
        self.enter_error();
    }

    /// Completes the WR at the head of the send queue with an error and
    /// moves to ERR.
    pub(super) fn fail_head(&mut self, status: WcStatus) {
        if let Some(head) = self.req.sq.front_mut() {
            head.status = Some(status);
        }
        self.enter_error();
    }

    /// Entering ERR: every send WR left completes, in order — with the
    /// status it was given (the failed one), or a flush error.
    pub(super) fn flush_send_queue(&mut self) {
        while let Some(e) = self.req.sq.pop_front() {
            self.req.sq_popped += 1;
            let status = e.status.unwrap_or(WcStatus::WrFlushErr);
            // Successful ones completed earlier would have left the queue.
            let wc = self.send_wc(&e, status);
            if status != WcStatus::Success || e.wqe.signaled {
                self.events.push_back(QpEvent::SendCompletion(wc));
            }
        }
    }
}
