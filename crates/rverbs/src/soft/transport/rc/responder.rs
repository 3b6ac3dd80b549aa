//! The responder: checks each request's PSN and opcode sequence, executes
//! SENDs, RDMA WRITEs, READs and atomics against checked memory, answers
//! duplicates without executing twice, and owes ACKs, NAKs and responses.

use rverbs_wire::{NakCode, Operation, PacketRepr, Position, Psn, RethRepr, Syndrome, Transport};

use super::{packets_for, Inbound, RcQp, Refusal, Resource, Response};
use crate::event::AsyncEventType;
use crate::soft::memory::{AccessError, AccessKind};
use crate::soft::transport::{qp_allows, scatter, AtomicOp, Memory, QpEvent};
use crate::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};

impl RcQp {
    pub(super) fn handle_request(&mut self, pkt: &PacketRepr<'_>, pos: Position, mem: &dyn Memory) {
        if self.cfg.transport == Transport::Uc {
            return self.handle_uc_request(pkt, pos, mem);
        }
        let psn = pkt.bth.psn;
        match psn.cmp_wrapping(self.epsn) {
            std::cmp::Ordering::Less => return self.duplicate(pkt, mem),
            std::cmp::Ordering::Greater => {
                // A gap: one NAK per gap, then drop until the missing PSN comes.
                if !self.nak_seq_sent {
                    self.nak_seq_sent = true;
                    self.counters.seq_naks_sent += 1;
                    self.responses.push_back(Response::Nak {
                        psn: self.epsn,
                        syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                        msn: self.msn,
                    });
                }
                return;
            }
            std::cmp::Ordering::Equal => self.nak_seq_sent = false,
        }
        if let Err(refusal) = self.execute(pkt, pos, mem) {
            self.refuse(psn, refusal);
        }
    }

    /// UC: packets in PSN order make messages; a gap drops the message it
    /// hit (its receive WR goes back to take the next message), and
    /// everything up to the next first or only packet. Old PSNs (duplicates,
    /// stragglers) are dropped, so no message is delivered twice or
    /// spliced from two. Nothing is acknowledged; errors drop the message
    /// and the QP carries on.
    fn handle_uc_request(&mut self, pkt: &PacketRepr<'_>, pos: Position, mem: &dyn Memory) {
        let psn = pkt.bth.psn;
        match psn.cmp_wrapping(self.epsn) {
            std::cmp::Ordering::Less => {
                self.counters.duplicates += 1;
                return;
            }
            std::cmp::Ordering::Greater => self.uc_drop_message(),
            std::cmp::Ordering::Equal => {}
        }
        self.epsn = psn.next();
        if pos.starts_message() {
            if self.inbound.is_some() {
                // The last packet of the message in progress never came.
                self.uc_drop_message();
            }
            self.uc_dropping = false;
        }
        if self.uc_dropping {
            self.counters.uc_dropped += 1;
            return;
        }
        if let Err(refusal) = self.execute(pkt, pos, mem) {
            self.refuse(psn, refusal);
        }
    }

    /// UC: abandons the message in progress.
    fn uc_drop_message(&mut self) {
        if let Some(Inbound::Send { wqe, .. }) = self.inbound.take() {
            self.rq.put_back(wqe);
        }
        self.inbound = None;
        self.uc_dropping = true;
    }

    fn execute(
        &mut self,
        pkt: &PacketRepr<'_>,
        pos: Position,
        mem: &dyn Memory,
    ) -> Result<(), Refusal> {
        let Some(info) = pkt.info() else {
            return Err(Refusal::InvalidRequest);
        };
        let op = info.operation;
        let psn = pkt.bth.psn;
        let in_order = match (&self.inbound, pos) {
            (None, Position::First | Position::Only) => true,
            (Some(Inbound::Send { .. }), Position::Middle | Position::Last) => {
                op == Operation::Send
            }
            (Some(Inbound::Write { .. }), Position::Middle | Position::Last) => {
                op == Operation::RdmaWrite
            }
            _ => false,
        };
        if !in_order {
            return Err(Refusal::InvalidRequest);
        }
        let mtu = self.cfg.mtu as usize;
        let plen = pkt.payload.len();
        let size_ok = match pos {
            Position::First | Position::Middle => plen == mtu,
            Position::Last | Position::Only => plen <= mtu,
        };
        if matches!(op, Operation::Send | Operation::RdmaWrite) && !size_ok {
            return Err(Refusal::InvalidRequest);
        }
        let pd = self.cfg.pd;
        if pkt.ieth.is_some() {
            // SEND with Invalidate: this device has no memory windows or
            // fast-registered MRs a peer could invalidate; executing it as a
            // plain SEND would leave the peer believing an rkey revoked.
            return Err(Refusal::InvalidRequest);
        }
        match op {
            Operation::Send => {
                if pos.starts_message() {
                    let Some(wqe) = self.rq.pop(&mut self.events) else {
                        self.queue_rnr(psn);
                        return Ok(());
                    };
                    self.inbound = Some(Inbound::Send { wqe, offset: 0 });
                }
                let Some(Inbound::Send { wqe, offset }) = &mut self.inbound else {
                    return Err(Refusal::InvalidRequest);
                };
                if *offset + plen as u64 > wqe.length {
                    return Err(Refusal::RecvBuffer(WcStatus::LocLenErr));
                }
                if scatter(mem, wqe.pd, &wqe.sges, *offset, pkt.payload).is_err() {
                    return Err(Refusal::RecvBuffer(WcStatus::LocProtErr));
                }
                *offset += plen as u64;
                if pos.ends_message() {
                    let Some(Inbound::Send { wqe, offset }) = self.inbound.take() else {
                        return Err(Refusal::InvalidRequest);
                    };
                    let imm = pkt.imm_dt.map(|i| i.0);
                    let wc = WorkCompletion {
                        wr_id: wqe.wr_id,
                        opcode: WcOpcode::Recv,
                        byte_len: offset as u32,
                        imm_data: imm.unwrap_or(0),
                        wc_flags: if imm.is_some() {
                            WcFlags::WITH_IMM
                        } else {
                            WcFlags::empty()
                        },
                        qp_num: self.cfg.qpn,
                        src_qp: self.cfg.dest_qpn,
                        ..Default::default()
                    };
                    self.events
                        .push_back(QpEvent::RecvCompletion(wc, pkt.bth.solicited));
                    self.msn = (self.msn + 1) & 0x00ff_ffff;
                }
            }
            Operation::RdmaWrite => {
                if !qp_allows(self.cfg.access, AccessKind::RemoteWrite) {
                    return Err(Refusal::InvalidRequest);
                }
                if pos.starts_message() {
                    let Some(reth) = pkt.reth else {
                        return Err(Refusal::InvalidRequest);
                    };
                    check_remote(mem, &reth, pd, AccessKind::RemoteWrite)?;
                    self.inbound = Some(Inbound::Write {
                        rkey: reth.rkey,
                        va: reth.va,
                        total: reth.dma_len,
                        done: 0,
                    });
                }
                // With immediate data a receive WR is needed: check before
                // touching memory, so a retry after RNR writes once more, harmlessly.
                if pkt.imm_dt.is_some() && self.rq.is_empty() {
                    if pos.starts_message() {
                        self.inbound = None;
                    }
                    self.queue_rnr(psn);
                    return Ok(());
                }
                let Some(Inbound::Write {
                    rkey,
                    va,
                    total,
                    done,
                }) = &mut self.inbound
                else {
                    return Err(Refusal::InvalidRequest);
                };
                if u64::from(*done) + plen as u64 > u64::from(*total) {
                    return Err(Refusal::InvalidRequest);
                }
                if plen > 0 {
                    let at = va.wrapping_add(u64::from(*done));
                    mem.write(*rkey, at, pd, AccessKind::RemoteWrite, pkt.payload)
                        .map_err(|_| Refusal::Access)?;
                }
                *done += plen as u32;
                if pos.ends_message() {
                    if done != total {
                        return Err(Refusal::InvalidRequest);
                    }
                    let total = *total;
                    self.inbound = None;
                    if let Some(imm) = pkt.imm_dt {
                        let Some(wqe) = self.rq.pop(&mut self.events) else {
                            return Err(Refusal::InvalidRequest);
                        };
                        let wc = WorkCompletion {
                            wr_id: wqe.wr_id,
                            opcode: WcOpcode::RecvRdmaWithImm,
                            byte_len: total,
                            imm_data: imm.0,
                            wc_flags: WcFlags::WITH_IMM,
                            qp_num: self.cfg.qpn,
                            src_qp: self.cfg.dest_qpn,
                            ..Default::default()
                        };
                        self.events
                            .push_back(QpEvent::RecvCompletion(wc, pkt.bth.solicited));
                    }
                    self.msn = (self.msn + 1) & 0x00ff_ffff;
                }
            }
            Operation::RdmaReadRequest => {
                if !qp_allows(self.cfg.access, AccessKind::RemoteRead)
                    || self.cfg.max_dest_rd_atomic == 0
                {
                    return Err(Refusal::InvalidRequest);
                }
                let Some(reth) = pkt.reth else {
                    return Err(Refusal::InvalidRequest);
                };
                check_remote(mem, &reth, pd, AccessKind::RemoteRead)?;
                let npkts = packets_for(reth.dma_len, self.cfg.mtu);
                self.save(Resource::Read {
                    first_psn: psn,
                    npkts,
                    va: reth.va,
                    rkey: reth.rkey,
                    len: reth.dma_len,
                });
                self.msn = (self.msn + 1) & 0x00ff_ffff;
                self.responses.push_back(Response::Read {
                    first_psn: psn,
                    k: 0,
                    npkts,
                    va: reth.va,
                    rkey: reth.rkey,
                    len: reth.dma_len,
                    msn: self.msn,
                });
                self.epsn = psn.add(npkts);
                return Ok(());
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                if !qp_allows(self.cfg.access, AccessKind::RemoteAtomic)
                    || self.cfg.max_dest_rd_atomic == 0
                {
                    return Err(Refusal::InvalidRequest);
                }
                let Some(a) = pkt.atomic_eth else {
                    return Err(Refusal::InvalidRequest);
                };
                let atomic = if op == Operation::CompareSwap {
                    AtomicOp::CompareSwap {
                        compare: a.compare,
                        swap: a.swap_add,
                    }
                } else {
                    AtomicOp::FetchAdd { add: a.swap_add }
                };
                // A misaligned atomic is an invalid request (rxe: class C,
                // NAK invalid request); any other refusal an access error.
                let orig = mem.atomic(a.rkey, a.va, pd, atomic).map_err(|e| match e {
                    AccessError::Misaligned { .. } => Refusal::InvalidRequest,
                    _ => Refusal::Access,
                })?;
                self.save(Resource::Atomic { psn, orig });
                self.msn = (self.msn + 1) & 0x00ff_ffff;
                self.responses.push_back(Response::Atomic {
                    psn,
                    orig,
                    msn: self.msn,
                });
                self.epsn = psn.next();
                return Ok(());
            }
            _ => return Err(Refusal::InvalidRequest),
        }
        self.epsn = psn.next();
        if pkt.bth.ack_req {
            self.queue_ack(psn);
        }
        Ok(())
    }

    /// A request with a PSN already executed: acknowledge again, or replay
    /// the READ response or atomic result, never executing twice.
    fn duplicate(&mut self, pkt: &PacketRepr<'_>, mem: &dyn Memory) {
        self.counters.duplicates += 1;
        let Some(info) = pkt.info() else { return };
        let psn = pkt.bth.psn;
        match info.operation {
            Operation::Send | Operation::RdmaWrite if pkt.bth.ack_req => {
                self.queue_ack(self.epsn.sub(1));
            }
            Operation::RdmaReadRequest => {
                let Some(reth) = pkt.reth else { return };
                let mtu = self.cfg.mtu;
                let saved = self.resources.iter().find_map(|r| match *r {
                    Resource::Read {
                        first_psn,
                        npkts,
                        va,
                        rkey,
                        len,
                    } if first_psn.distance_to(psn) < npkts => {
                        Some((first_psn, npkts, va, rkey, len))
                    }
                    _ => None,
                });
                // Replay any part of the saved range from this PSN on (the
                // requester may ask again for less, as rxe allows).
                let Some((saved_psn, saved_npkts, va, rkey, len)) = saved else {
                    return;
                };
                let skip = saved_psn.distance_to(psn) * mtu;
                if reth.rkey != rkey
                    || reth.va != va.wrapping_add(u64::from(skip))
                    || reth.dma_len > len.saturating_sub(skip)
                {
                    return;
                }
                if let Err(refusal) = check_remote(mem, &reth, self.cfg.pd, AccessKind::RemoteRead)
                {
                    self.refuse(psn, refusal);
                    return;
                }
                // Drop what is still queued of an older attempt at the same
                // READ (not of other READs); resend from here.
                self.responses.retain(|r| {
                    !matches!(r, Response::Read { first_psn, .. }
                        if saved_psn.distance_to(*first_psn) < saved_npkts)
                });
                self.responses.push_back(Response::Read {
                    first_psn: psn,
                    k: 0,
                    npkts: packets_for(reth.dma_len, mtu),
                    va: reth.va,
                    rkey,
                    len: reth.dma_len,
                    msn: self.msn,
                });
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let orig = self.resources.iter().find_map(|r| match *r {
                    Resource::Atomic { psn: p, orig } if p == psn => Some(orig),
                    _ => None,
                });
                if let Some(orig) = orig {
                    self.responses.push_back(Response::Atomic {
                        psn,
                        orig,
                        msn: self.msn,
                    });
                }
            }
            _ => {}
        }
    }

    fn save(&mut self, r: Resource) {
        self.resources.push_back(r);
        while self.resources.len() > usize::from(self.cfg.max_dest_rd_atomic.max(1)) {
            self.resources.pop_front();
        }
    }

    /// Owes an ACK of `psn`, merged into an ACK already owed.
    fn queue_ack(&mut self, psn: Psn) {
        if self.cfg.transport == Transport::Uc {
            return;
        }
        let msn = self.msn;
        if let Some(Response::Ack { psn: p, msn: m }) = self.responses.back_mut() {
            *p = psn;
            *m = msn;
        } else {
            self.responses.push_back(Response::Ack { psn, msn });
        }
    }

    /// Owes an RNR NAK of `psn`. The requests already behind it are
    /// dropped without a NAK sequence error: the requester goes back to
    /// `psn` anyway, and must not spend a retry on our slow receiver.
    fn queue_rnr(&mut self, psn: Psn) {
        if self.cfg.transport == Transport::Uc {
            // No receive WR: the message is dropped (UC has no RNR).
            self.counters.uc_dropped += 1;
            return self.uc_drop_message();
        }
        self.nak_seq_sent = true;
        self.counters.rnr_naks_sent += 1;
        self.responses.push_back(Response::Nak {
            psn,
            syndrome: Syndrome::RnrNak(self.cfg.min_rnr_timer),
            msn: self.msn,
        });
    }

    /// Refuses the request at `psn`: NAK, async event, and the QP goes to ERR.
    pub(super) fn refuse(&mut self, psn: Psn, refusal: Refusal) {
        if self.cfg.transport == Transport::Uc {
            self.counters.uc_dropped += 1;
            return self.uc_drop_message();
        }
        self.counters.fatal_naks_sent += 1;
        let (code, event) = match refusal {
            Refusal::InvalidRequest => (NakCode::InvalidRequest, Some(AsyncEventType::QpReqErr)),
            Refusal::Access => (
                NakCode::RemoteAccessError,
                Some(AsyncEventType::QpAccessErr),
            ),
            Refusal::RecvBuffer(status) => {
                // The receive WR that could not take the message fails with `status`.
                if let Some(Inbound::Send { wqe, .. }) = self.inbound.take() {
                    let wc = WorkCompletion {
                        wr_id: wqe.wr_id,
                        status,
                        opcode: WcOpcode::Recv,
                        qp_num: self.cfg.qpn,
                        src_qp: self.cfg.dest_qpn,
                        ..Default::default()
                    };
                    self.events.push_back(QpEvent::RecvCompletion(wc, false));
                }
                let code = if status == WcStatus::LocLenErr {
                    NakCode::InvalidRequest
                } else {
                    NakCode::RemoteOperationalError
                };
                (code, None)
            }
        };
        self.responses.push_back(Response::Nak {
            psn,
            syndrome: Syndrome::Nak(code),
            msn: self.msn,
        });
        if let Some(e) = event {
            self.events.push_back(QpEvent::Async(e));
        }
        self.enter_error();
    }
}

/// Checks the remote access a RETH asks for (none for a zero-length one, as
/// IBTA allows any key then); a failure is a remote access error.
fn check_remote(
    mem: &dyn Memory,
    reth: &RethRepr,
    pd: u64,
    kind: AccessKind,
) -> Result<(), Refusal> {
    if reth.dma_len == 0 {
        return Ok(());
    }
    mem.check(reth.rkey, reth.va, u64::from(reth.dma_len), pd, kind)
        .map_err(|_| Refusal::Access)
}
