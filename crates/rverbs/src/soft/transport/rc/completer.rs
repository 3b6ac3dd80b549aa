//! The completer: what the requester learns from ACKs, NAKs, RNR NAKs,
//! READ responses and atomic ACKs, and the completions it reports, in order.

use std::time::Instant;

use rverbs_wire::{NakCode, Opcode, PacketRepr, Position, Psn, Syndrome};

use super::{RcQp, WqeData};
use crate::soft::transport::{scatter, Memory, QpEvent};
use crate::wc::WcStatus;

impl RcQp {
    pub(super) fn handle_response(
        &mut self,
        pkt: &PacketRepr<'_>,
        _pos: Position,
        now: Instant,
        mem: &dyn Memory,
    ) {
        let psn = pkt.bth.psn;
        // Only PSNs this requester sent and has not seen acknowledged count.
        if !psn.in_window(self.una, self.una.distance_to(self.next_psn)) {
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
                        if self.state == crate::wr::QpState::Err {
                            return;
                        }
                        if self.rnr_left == 0 {
                            self.fail_head(WcStatus::RnrRetryExcErr);
                            return;
                        }
                        if self.cfg.rnr_retry != 7 {
                            self.rnr_left -= 1;
                        }
                        self.rnr_until = Some(now + timer.duration());
                        self.retransmit_at = None;
                        self.fast_rto_at = None;
                        self.rewind();
                    }
                    Syndrome::Nak(NakCode::PsnSequenceError) => {
                        self.counters.seq_naks_received += 1;
                        self.ack_through(psn.sub(1), now);
                        if self.state == crate::wr::QpState::Err || self.rnr_until.is_some() {
                            // Waiting out an RNR NAK, which goes back anyway.
                            return;
                        }
                        if self.retry_left == 0 {
                            self.fail_head(WcStatus::RetryExcErr);
                            return;
                        }
                        self.retry_left -= 1;
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
                        let nacked = self.sq.iter().position(|e| {
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
                let Some(head) = self.sq.front() else { return };
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
            _ => self.handle_read_response(pkt, psn, now, mem),
        }
    }

    fn handle_read_response(
        &mut self,
        pkt: &PacketRepr<'_>,
        psn: Psn,
        now: Instant,
        mem: &dyn Memory,
    ) {
        let Some(idx) = self
            .sq
            .iter()
            .position(|e| e.is_read() && e.first_psn.distance_to(psn) < e.npkts)
        else {
            return;
        };
        let first = self.sq[idx].first_psn;
        // A response implicitly acknowledges every earlier request.
        self.ack_through(first.sub(1), now);
        let Some(head) = self.sq.front() else { return };
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
        let mtu = self.cfg.mtu;
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
        let head = &mut self.sq[0];
        head.read_next += 1;
        if head.read_next == head.npkts {
            self.complete_rd_atomic(now, psn);
        } else {
            self.progress(psn.next(), now);
        }
    }

    /// The READ or atomic at the head of the queue is done.
    fn complete_rd_atomic(&mut self, now: Instant, last_psn: Psn) {
        if let Some(head) = self.sq.front_mut() {
            head.status = Some(WcStatus::Success);
        }
        self.rd_atomic_inflight = self.rd_atomic_inflight.saturating_sub(1);
        self.progress(last_psn.next(), now);
        self.pop_completed();
    }

    /// Cumulative acknowledgement of every request PSN up to `psn`.
    pub(super) fn ack_through(&mut self, psn: Psn, now: Instant) {
        if psn.is_before(self.una) || !psn.is_before(self.next_psn) {
            return;
        }
        let mut lost = None;
        // An ACK inside a READ (the responder is past the chunk it asked
        // for) acknowledges no more than the READ responses placed so far.
        let mut upto = psn.next();
        for e in self.sq.iter_mut() {
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
        if !self.una.is_before(una) {
            return;
        }
        self.cwnd.on_ack(self.una.distance_to(una), una);
        self.una = una;
        self.read_rewound_at = None;
        if self.tx_psn.is_before(una) {
            self.tx_psn = una;
        }
        self.retry_left = self.cfg.retry_cnt;
        self.rnr_left = self.cfg.rnr_retry;
        if let Some((psn, sent)) = self.rtt_probe {
            if psn.is_before(una) {
                let sample = now.saturating_duration_since(sent);
                self.srtt = Some(self.srtt.map_or(sample, |s| (s * 7 + sample) / 8));
                self.rtt_probe = None;
            }
        }
        self.fast_backoff = 0;
        let outstanding = self.una.is_before(self.sent_high);
        self.retransmit_at = if outstanding {
            self.cfg.timeout.map(|t| now + t)
        } else {
            None
        };
        self.fast_rto_at = outstanding.then(|| now + self.fast_rto());
    }

    /// Reports finished WRs from the head of the queue, in order.
    pub(super) fn pop_completed(&mut self) {
        while self
            .sq
            .front()
            .is_some_and(|e| e.status == Some(WcStatus::Success))
        {
            let Some(e) = self.sq.pop_front() else { break };
            self.sq_popped += 1;
            if e.wqe.signaled {
                let wc = self.send_wc(&e, WcStatus::Success);
                self.events.push_back(QpEvent::SendCompletion(wc));
            }
        }
        self.check_drained();
    }
}
