//! The responder (rxe's `qp->resp`): the receive side of the QP. Its input
//! checks each request's PSN and opcode sequence (one NAK per gap),
//! executes SENDs, RDMA WRITEs, READs, atomics and ATOMIC WRITEs against
//! checked memory (an rkey that names a memory window is checked against
//! the window, then reaches the MR beneath), invalidates the window a SEND
//! with Invalidate names, answers duplicates from saved resources (or with
//! an ACK) without executing twice, and refuses what it must; its output
//! is what that owes the peer — ACKs
//! (coalesced, a plain one possibly held back), NAKs, READ response
//! streams and atomic ACKs — written by [`RcQp::transmit_response`].
//!
//! What a peer can make it owe is bounded, whatever the peer's send rate
//! and whether or not it takes the responses:
//!
//! - a new READ or atomic takes one of `max_dest_rd_atomic` resources. When
//!   all are held, the oldest is recycled (as rxe does) — unless its first
//!   answer is still owed: then the peer has more READs and atomics
//!   outstanding than we offered, and the request is refused as an invalid
//!   request (NAK, QP_REQ_ERR, ERR; counted as `rd_atomic_over_limit`).
//!   Replays of a recycled resource still owed are dropped with it: a
//!   requester within its limit has finished with the oldest before it
//!   asks for more;
//! - a duplicate READ or atomic is answered from its resource and replaces
//!   that resource's answer still owed, so each resource has at most one
//!   response in the queue, and a duplicate's lookups scan at most the
//!   resources and that queue;
//! - plain ACKs, sequence NAKs and RNR NAKs report where the responder
//!   stands, and a newer report replaces the ones at the back of the
//!   queue it supersedes (a NAK at PSN p also acknowledges everything
//!   before p), so at most two sit between two READ or atomic answers.
//!
//! So the queue holds at most `max_dest_rd_atomic` READ/atomic answers,
//! two reports before, between and after them, and a final NAK.

use std::collections::VecDeque;
use std::time::Instant;

use rverbs_wire::{
    AethRepr, AtomicAckEthRepr, BthRepr, NakCode, Opcode, Operation, PacketRepr, Position, Psn,
    RethRepr, Syndrome, Transport,
};

use super::{packets_for, position, RcConfig, RcQp};
use crate::event::AsyncEventType;
use crate::soft::memory::{AccessError, AccessKind, Resolved};
use crate::soft::transport::recv::{RecvQueue, SharedRq};
use crate::soft::transport::{
    qp_allows, recv_flush_wc, scatter, AtomicOp, Memory, PayloadRef, QpEvent, RecvWqe, TxBuffer,
    MAX_MSG_SZ,
};
use crate::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
use crate::wr::QpState;

/// The credit code in every ACK: no end-to-end flow control credits (as rxe).
const CREDITS: Syndrome = Syndrome::Ack {
    credits: Syndrome::CREDITS_UNLIMITED,
};

/// The incoming message a responder is in the middle of.
#[derive(Debug)]
enum Inbound {
    Send {
        wqe: RecvWqe,
        offset: u64,
    },
    /// An RDMA WRITE, to the memory its rkey resolved to at its first packet.
    Write {
        target: Resolved,
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
        /// The memory the request's rkey and address resolved to.
        target: Resolved,
        /// The request's own rkey and address: a memory window's is
        /// resolved again for every response packet, so a window revoked
        /// (invalidated, rebound, deallocated) mid-stream stops the READ,
        /// as rxe rechecks it per packet.
        rkey: u32,
        va: u64,
        len: u32,
        msn: u32,
        /// An answer to a duplicate, not the READ's first.
        replay: bool,
        /// Payload bytes per response packet: the requester's segment
        /// size, which it counted the READ's PSNs in.
        segment: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: u32,
        /// An answer to a duplicate, not the atomic's first.
        replay: bool,
    },
}

impl Response {
    /// Whether this is a READ's or atomic's first answer.
    fn is_first_answer(&self) -> bool {
        matches!(
            self,
            Response::Read { replay: false, .. } | Response::Atomic { replay: false, .. }
        )
    }

    /// Whether this only reports where the responder stands: a plain ACK,
    /// a sequence NAK or an RNR NAK, at PSN `psn`.
    fn report_psn(&self) -> Option<Psn> {
        match *self {
            Response::Ack { psn, .. } => Some(psn),
            Response::Nak {
                psn,
                syndrome: Syndrome::Nak(NakCode::PsnSequenceError) | Syndrome::RnrNak(_),
                ..
            } => Some(psn),
            _ => None,
        }
    }
}

impl Resource {
    /// Whether `r` is (part of) this resource's answer.
    fn answered_by(&self, r: &Response) -> bool {
        match (*self, *r) {
            (
                Resource::Read {
                    first_psn, npkts, ..
                },
                Response::Read { first_psn: p, .. },
            ) => first_psn.distance_to(p) < npkts,
            (Resource::Atomic { psn, .. }, Response::Atomic { psn: p, .. }) => p == psn,
            _ => false,
        }
    }
}

/// Why a responder refuses a request.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// Malformed or unsupported request: NAK invalid request, QP_REQ_ERR.
    InvalidRequest,
    /// A READ or atomic beyond the responder's resources: an invalid
    /// request too (IBTA's class B, rxe's "too many RDMA/atomic
    /// requests"), counted apart.
    TooManyRdAtomic,
    /// Key, bounds, rights or PD: NAK remote access error, QP_ACCESS_ERR.
    Access,
    /// The receive WR cannot take the message: it completes with `status`
    /// (LOC_LEN_ERR: too small, NAK invalid request, as rxe; LOC_PROT_ERR: a
    /// bad scatter list, NAK remote operational error).
    RecvBuffer(WcStatus),
    /// A SEND with Invalidate naming no window this QP may invalidate: the
    /// receive WR completes with REM_INV_REQ_ERR (rxe's class J), NAK
    /// invalid request, QP_REQ_ERR.
    Invalidate,
}

fn read_response_opcode(pos: Position) -> Opcode {
    match pos {
        Position::First => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        Position::Middle => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        Position::Last => Opcode::RC_RDMA_READ_RESPONSE_LAST,
        Position::Only => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
    }
}

/// What the responder keeps: the PSN and MSN it is at, its receive queue,
/// the message in progress, saved READs and atomics, and what it owes.
pub(super) struct ResponderState {
    /// The PSN the next new request must carry.
    pub(super) epsn: Psn,
    /// Messages completed (24 bits), reported in every ACK.
    msn: u32,
    rq: RecvQueue,
    inbound: Option<Inbound>,
    /// Saved READs and atomics, oldest first: at most `max_dest_rd_atomic`.
    resources: VecDeque<Resource>,
    /// What is owed, in order (bounded: see the module docs).
    responses: VecDeque<Response>,
    /// A plain ACK held back (see [`AckPolicy::Hold`](super::AckPolicy::Hold))
    /// goes out by then.
    pub(super) ack_due: Option<Instant>,
    nak_seq_sent: bool,
    /// UC: the message in progress lost a packet; drop until the next one starts.
    uc_dropping: bool,
}

impl ResponderState {
    /// Nothing received yet: requests start at `cfg.rq_psn`; receive WRs
    /// come from `srq` if given.
    pub(super) fn new(cfg: &RcConfig, srq: Option<SharedRq>) -> ResponderState {
        ResponderState {
            epsn: cfg.rq_psn,
            msn: 0,
            rq: RecvQueue::new(srq),
            inbound: None,
            resources: VecDeque::new(),
            responses: VecDeque::new(),
            ack_due: None,
            nak_seq_sent: false,
            uc_dropping: false,
        }
    }

    /// Whether the next response owed is a plain ACK (one that
    /// [`AckPolicy::Hold`](super::AckPolicy::Hold) may hold back).
    pub(super) fn plain_ack_next(&self) -> bool {
        matches!(self.responses.front(), Some(Response::Ack { .. }))
    }

    /// Responses owed.
    pub(super) fn responses_owed(&self) -> usize {
        self.responses.len()
    }
}

impl RcQp {
    // ---- receive queue ----------------------------------------------------

    /// The QP is reset or destroyed: a receive WR it kept goes back to its SRQ.
    pub(crate) fn return_recv(&mut self) {
        self.resp.rq.return_held();
    }

    /// Receive WRs posted and not yet consumed.
    pub(crate) fn rq_len(&self) -> usize {
        self.resp.rq.own_len()
            + usize::from(matches!(self.resp.inbound, Some(Inbound::Send { .. })))
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
        self.resp.rq.push(wqe);
    }

    /// Whether a plain ACK is being held back (see [`AckPolicy::Hold`](super::AckPolicy::Hold)).
    pub(crate) fn holds_ack(&self) -> bool {
        self.resp.ack_due.is_some()
    }

    /// Entering ERR: responses owed are dropped but the NAK that explains
    /// the error, and every receive WR left (the one a message was filling
    /// first) completes with a flush error.
    pub(super) fn flush_responder(&mut self) {
        // A QP in ERR processes nothing more: queued ACKs, READ responses
        // and atomic results are dropped (no more reading its memory); only
        // the NAK that reports the error still goes out.
        self.resp
            .responses
            .retain(|r| matches!(r, Response::Nak { .. }));
        self.resp.ack_due = None;
        if let Some(Inbound::Send { wqe, .. }) = self.resp.inbound.take() {
            let wc = recv_flush_wc(&wqe, self.cfg.qpn, self.cfg.dest_qpn);
            self.events.push_back(QpEvent::RecvCompletion(wc, false));
        }
        let (qpn, src_qp) = (self.cfg.qpn, self.cfg.dest_qpn);
        self.resp
            .rq
            .flush(&mut self.events, |wqe| recv_flush_wc(wqe, qpn, src_qp));
    }

    // ---- output -----------------------------------------------------------

    /// Writes the next response owed into `tx` (a READ response stream one
    /// packet at a time), if any.
    pub(super) fn transmit_response(
        &mut self,
        mem: &dyn Memory,
        tx: &mut TxBuffer<'_>,
    ) -> Option<usize> {
        let r = *self.resp.responses.front()?;
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
                self.resp.responses.pop_front();
                p.emit(tx.bytes).ok()?
            }
            Response::Nak { psn, syndrome, msn } => {
                p.bth.psn = psn;
                p.aeth = Some(AethRepr { syndrome, msn });
                self.resp.responses.pop_front();
                p.emit(tx.bytes).ok()?
            }
            Response::Atomic { psn, orig, msn, .. } => {
                p.bth.opcode = Opcode::RC_ATOMIC_ACKNOWLEDGE;
                p.bth.psn = psn;
                p.aeth = Some(AethRepr {
                    syndrome: CREDITS,
                    msn,
                });
                p.atomic_ack_eth = Some(AtomicAckEthRepr { orig });
                self.resp.responses.pop_front();
                p.emit(tx.bytes).ok()?
            }
            Response::Read {
                first_psn,
                k,
                npkts,
                target,
                rkey: req_rkey,
                va: req_va,
                len,
                msn,
                segment,
                ..
            } => {
                let mtu = segment;
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
                let pd = self.cfg.pd;
                // An MR's rkey resolved to itself: the check below covers
                // it. A window's is resolved again (one key lookup).
                let target = if target.key == req_rkey || plen == 0 {
                    Ok(Resolved {
                        va: target.va.wrapping_add(u64::from(offset)),
                        ..target
                    })
                } else {
                    mem.resolve_remote(
                        req_rkey,
                        req_va.wrapping_add(u64::from(offset)),
                        u64::from(plen),
                        AccessKind::RemoteRead,
                        pd,
                        self.cfg.qpn,
                    )
                };
                let Ok(target) = target else {
                    // The window was revoked since the request.
                    self.resp.responses.pop_front();
                    self.refuse(p.bth.psn, Refusal::Access);
                    return self.transmit_response(mem, tx);
                };
                let (rkey, kind, va) = (target.key, target.kind, target.va);
                let read = match tx.refs.as_deref_mut() {
                    // A zero-length READ (only then is `plen` 0) names no
                    // memory: no key is looked up (IBTA C9-88), as the
                    // request was not checked either — any rkey and VA go.
                    _ if plen == 0 => Ok(()),
                    Some(refs) => mem.check(rkey, va, u64::from(plen), pd, kind).map(|()| {
                        refs.push(PayloadRef {
                            at: u32::try_from(start).unwrap_or(u32::MAX),
                            key: rkey,
                            va,
                            len: plen,
                            pd,
                            kind,
                        });
                    }),
                    None => mem.read(
                        rkey,
                        va,
                        pd,
                        kind,
                        &mut tx.bytes[start..start + plen as usize],
                    ),
                };
                if read.is_err() {
                    // The MR went away after the request was checked.
                    self.resp.responses.pop_front();
                    self.refuse(p.bth.psn, Refusal::Access);
                    return self.transmit_response(mem, tx);
                }
                if k + 1 == npkts {
                    self.resp.responses.pop_front();
                } else if let Some(Response::Read { k, .. }) = self.resp.responses.front_mut() {
                    *k += 1;
                }
                total
            }
        };
        Some(n)
    }

    // ---- input ------------------------------------------------------------

    pub(super) fn handle_request(&mut self, pkt: &PacketRepr<'_>, pos: Position, mem: &dyn Memory) {
        if self.cfg.transport == Transport::Uc {
            return self.handle_uc_request(pkt, pos, mem);
        }
        let psn = pkt.bth.psn;
        match psn.cmp_wrapping(self.resp.epsn) {
            std::cmp::Ordering::Less => return self.duplicate(pkt, mem),
            std::cmp::Ordering::Greater => {
                // A gap: one NAK per gap, then drop until the missing PSN comes.
                self.counters.out_of_sequence += 1;
                if !self.resp.nak_seq_sent {
                    self.resp.nak_seq_sent = true;
                    self.counters.seq_naks_sent += 1;
                    let nak = Syndrome::Nak(NakCode::PsnSequenceError);
                    self.queue_nak_report(self.resp.epsn, nak);
                }
                return;
            }
            std::cmp::Ordering::Equal => self.resp.nak_seq_sent = false,
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
        match psn.cmp_wrapping(self.resp.epsn) {
            std::cmp::Ordering::Less => {
                self.counters.duplicates += 1;
                return;
            }
            std::cmp::Ordering::Greater => self.uc_drop_message(),
            std::cmp::Ordering::Equal => {}
        }
        self.resp.epsn = psn.next();
        if pos.starts_message() {
            if self.resp.inbound.is_some() {
                // The last packet of the message in progress never came.
                self.uc_drop_message();
            }
            self.resp.uc_dropping = false;
        }
        if self.resp.uc_dropping {
            self.counters.uc_dropped += 1;
            return;
        }
        if let Err(refusal) = self.execute(pkt, pos, mem) {
            self.refuse(psn, refusal);
        }
    }

    /// UC: abandons the message in progress.
    fn uc_drop_message(&mut self) {
        if let Some(Inbound::Send { wqe, .. }) = self.resp.inbound.take() {
            self.resp.rq.put_back(wqe);
        }
        self.resp.inbound = None;
        self.resp.uc_dropping = true;
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
        let in_order = match (&self.resp.inbound, pos) {
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
        let mtu = self.rx_segment as usize;
        let plen = pkt.payload.len();
        let size_ok = match pos {
            Position::First | Position::Middle => plen == mtu,
            Position::Last | Position::Only => plen <= mtu,
        };
        if matches!(op, Operation::Send | Operation::RdmaWrite) && !size_ok {
            return Err(Refusal::InvalidRequest);
        }
        let pd = self.cfg.pd;
        let qpn = self.cfg.qpn;
        match op {
            Operation::Send => {
                if pos.starts_message() {
                    let Some(wqe) = self.resp.rq.pop(&mut self.events) else {
                        self.queue_rnr(psn);
                        return Ok(());
                    };
                    self.resp.inbound = Some(Inbound::Send { wqe, offset: 0 });
                }
                let Some(Inbound::Send { wqe, offset }) = &mut self.resp.inbound else {
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
                    let Some(Inbound::Send { wqe, offset }) = self.resp.inbound.take() else {
                        return Err(Refusal::InvalidRequest);
                    };
                    let imm = pkt.imm_dt.map(|i| i.0);
                    let (imm_data, wc_flags) = match (imm, pkt.ieth) {
                        (Some(imm), _) => (imm, WcFlags::WITH_IMM),
                        (None, Some(inv)) => {
                            // SEND with Invalidate: the window goes before
                            // the receive completes (rxe's order).
                            if let Err(why) = mem.invalidate(inv.0, pd, Some(qpn)) {
                                tracing::debug!(
                                    "QP {qpn:#x}: SEND with Invalidate of {:#010x} refused: {why}",
                                    inv.0
                                );
                                self.resp.inbound = Some(Inbound::Send { wqe, offset });
                                return Err(Refusal::Invalidate);
                            }
                            (inv.0, WcFlags::WITH_INV)
                        }
                        (None, None) => (0, WcFlags::empty()),
                    };
                    let wc = WorkCompletion {
                        wr_id: wqe.wr_id,
                        opcode: WcOpcode::Recv,
                        byte_len: offset as u32,
                        imm_data,
                        wc_flags,
                        qp_num: self.cfg.qpn,
                        src_qp: self.cfg.dest_qpn,
                        ..Default::default()
                    };
                    self.events
                        .push_back(QpEvent::RecvCompletion(wc, pkt.bth.solicited));
                    self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
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
                    let target = check_remote(mem, &reth, pd, qpn, AccessKind::RemoteWrite)?;
                    self.resp.inbound = Some(Inbound::Write {
                        target,
                        total: reth.dma_len,
                        done: 0,
                    });
                }
                // With immediate data a receive WR is needed: check before
                // touching memory, so a retry after RNR writes once more, harmlessly.
                if pkt.imm_dt.is_some() && self.resp.rq.is_empty() {
                    if pos.starts_message() {
                        self.resp.inbound = None;
                    }
                    self.queue_rnr(psn);
                    return Ok(());
                }
                let Some(Inbound::Write {
                    target,
                    total,
                    done,
                }) = &mut self.resp.inbound
                else {
                    return Err(Refusal::InvalidRequest);
                };
                if u64::from(*done) + plen as u64 > u64::from(*total) {
                    return Err(Refusal::InvalidRequest);
                }
                if plen > 0 {
                    let at = target.va.wrapping_add(u64::from(*done));
                    mem.write(target.key, at, pd, target.kind, pkt.payload)
                        .map_err(|_| Refusal::Access)?;
                }
                *done += plen as u32;
                if pos.ends_message() {
                    if done != total {
                        return Err(Refusal::InvalidRequest);
                    }
                    let total = *total;
                    self.resp.inbound = None;
                    if let Some(imm) = pkt.imm_dt {
                        let Some(wqe) = self.resp.rq.pop(&mut self.events) else {
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
                    self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
                }
            }
            Operation::RdmaReadRequest => {
                if !qp_allows(self.cfg.access, AccessKind::RemoteRead) {
                    return Err(Refusal::InvalidRequest);
                }
                let Some(reth) = pkt.reth else {
                    return Err(Refusal::InvalidRequest);
                };
                let target = check_remote(mem, &reth, pd, qpn, AccessKind::RemoteRead)?;
                self.free_rd_atomic_resource()?;
                let npkts = packets_for(reth.dma_len, self.rx_segment);
                self.resp.resources.push_back(Resource::Read {
                    first_psn: psn,
                    npkts,
                    va: reth.va,
                    rkey: reth.rkey,
                    len: reth.dma_len,
                });
                self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
                self.resp.responses.push_back(Response::Read {
                    first_psn: psn,
                    k: 0,
                    npkts,
                    target,
                    rkey: reth.rkey,
                    va: reth.va,
                    len: reth.dma_len,
                    msn: self.resp.msn,
                    replay: false,
                    segment: self.rx_segment,
                });
                self.resp.epsn = psn.add(npkts);
                return Ok(());
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                if !qp_allows(self.cfg.access, AccessKind::RemoteAtomic) {
                    return Err(Refusal::InvalidRequest);
                }
                let Some(a) = pkt.atomic_eth else {
                    return Err(Refusal::InvalidRequest);
                };
                // Before the atomic runs: a refused one must not have.
                self.free_rd_atomic_resource()?;
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
                let refusal = |e| match e {
                    AccessError::Misaligned { .. } => Refusal::InvalidRequest,
                    _ => Refusal::Access,
                };
                let t = mem
                    .resolve_remote(a.rkey, a.va, 8, AccessKind::RemoteAtomic, pd, qpn)
                    .map_err(refusal)?;
                let orig = mem
                    .atomic(t.key, t.va, pd, t.kind, atomic)
                    .map_err(refusal)?;
                self.resp
                    .resources
                    .push_back(Resource::Atomic { psn, orig });
                self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
                self.resp.responses.push_back(Response::Atomic {
                    psn,
                    orig,
                    msn: self.resp.msn,
                    replay: false,
                });
                self.resp.epsn = psn.next();
                return Ok(());
            }
            Operation::AtomicWrite => {
                // As rxe: the QP must allow REMOTE_WRITE, and the responder
                // keep READ/atomic resources (though a plain ACK answers
                // it, and a duplicate is answered as a WRITE's is).
                if !qp_allows(self.cfg.access, AccessKind::RemoteAtomicWrite) {
                    return Err(Refusal::InvalidRequest);
                }
                if self.cfg.max_dest_rd_atomic == 0 {
                    return Err(Refusal::TooManyRdAtomic);
                }
                let Some(reth) = pkt.reth else {
                    return Err(Refusal::InvalidRequest);
                };
                let Ok(value) = <[u8; 8]>::try_from(pkt.payload) else {
                    // rxe checks the key before the length.
                    check_remote(mem, &reth, pd, qpn, AccessKind::RemoteWrite)?;
                    return Err(Refusal::InvalidRequest);
                };
                if reth.dma_len != 8 {
                    check_remote(mem, &reth, pd, qpn, AccessKind::RemoteWrite)?;
                    return Err(Refusal::InvalidRequest);
                }
                // One 64-bit store (through a memory window too).
                // Misaligned is rxe's "misaligned atomic" (NAK invalid
                // request); any other refusal an access error.
                let refusal = |e| match e {
                    AccessError::Misaligned { .. } => Refusal::InvalidRequest,
                    _ => Refusal::Access,
                };
                let t = mem
                    .resolve_remote(
                        reth.rkey,
                        reth.va,
                        8,
                        AccessKind::RemoteAtomicWrite,
                        pd,
                        qpn,
                    )
                    .map_err(refusal)?;
                mem.atomic(t.key, t.va, pd, t.kind, AtomicOp::Write { value })
                    .map_err(refusal)?;
                self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
                self.resp.epsn = psn.next();
                self.queue_ack(psn);
                return Ok(());
            }
            _ => return Err(Refusal::InvalidRequest),
        }
        self.resp.epsn = psn.next();
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
                self.queue_ack(self.resp.epsn.sub(1));
            }
            // Stored once already: acknowledged again, never stored again.
            Operation::AtomicWrite => self.queue_ack(self.resp.epsn.sub(1)),
            Operation::RdmaReadRequest => {
                let Some(reth) = pkt.reth else { return };
                let mtu = self.rx_segment;
                let saved = self.resp.resources.iter().find_map(|r| match *r {
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
                let (pd, qpn) = (self.cfg.pd, self.cfg.qpn);
                let target = match check_remote(mem, &reth, pd, qpn, AccessKind::RemoteRead) {
                    Ok(t) => t,
                    Err(refusal) => {
                        self.refuse(psn, refusal);
                        return;
                    }
                };
                // Drop what is still queued of an older attempt at the same
                // READ (not of other READs); resend from here.
                self.resp.responses.retain(|r| {
                    !matches!(r, Response::Read { first_psn, .. }
                        if saved_psn.distance_to(*first_psn) < saved_npkts)
                });
                self.resp.responses.push_back(Response::Read {
                    first_psn: psn,
                    k: 0,
                    npkts: packets_for(reth.dma_len, mtu),
                    target,
                    rkey: reth.rkey,
                    va: reth.va,
                    len: reth.dma_len,
                    msn: self.resp.msn,
                    replay: true,
                    segment: mtu,
                });
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let orig = self.resp.resources.iter().find_map(|r| match *r {
                    Resource::Atomic { psn: p, orig } if p == psn => Some(orig),
                    _ => None,
                });
                let Some(orig) = orig else { return };
                // Its answer still owed answers this one too.
                let owed = self
                    .resp
                    .responses
                    .iter()
                    .any(|r| matches!(*r, Response::Atomic { psn: p, .. } if p == psn));
                if !owed {
                    self.resp.responses.push_back(Response::Atomic {
                        psn,
                        orig,
                        msn: self.resp.msn,
                        replay: true,
                    });
                }
            }
            _ => {}
        }
    }

    /// Makes room for a new READ or atomic among the `max_dest_rd_atomic`
    /// resources: the oldest is recycled, with any replay of it still owed
    /// (a requester within its limit is done with it) — unless its first
    /// answer is still owed, when the peer has more outstanding than we
    /// offered. Scans at most the resources and the (bounded) queue.
    fn free_rd_atomic_resource(&mut self) -> Result<(), Refusal> {
        let limit = usize::from(self.cfg.max_dest_rd_atomic);
        if limit == 0 {
            return Err(Refusal::TooManyRdAtomic);
        }
        while self.resp.resources.len() >= limit {
            let Some(oldest) = self.resp.resources.front().copied() else {
                break;
            };
            let responses = &mut self.resp.responses;
            if responses
                .iter()
                .any(|r| r.is_first_answer() && oldest.answered_by(r))
            {
                return Err(Refusal::TooManyRdAtomic);
            }
            responses.retain(|r| !oldest.answered_by(r));
            self.resp.resources.pop_front();
        }
        Ok(())
    }

    /// Owes an ACK of `psn`: merged into an ACK owed at the back of the
    /// queue, and nothing more if a NAK owed there already acknowledges it.
    fn queue_ack(&mut self, psn: Psn) {
        if self.cfg.transport == Transport::Uc {
            return;
        }
        let msn = self.resp.msn;
        let back = self.resp.responses.back_mut();
        if let Some(Response::Ack { psn: p, msn: m }) = back {
            *p = psn;
            *m = msn;
            return;
        }
        let acknowledged = back.is_some_and(|r| {
            matches!(*r, Response::Nak { msn: m, .. } if m == msn)
                && r.report_psn().is_some_and(|p| psn.is_before(p))
        });
        if !acknowledged {
            self.resp.responses.push_back(Response::Ack { psn, msn });
        }
    }

    /// Owes a sequence or RNR NAK at `psn` (the PSN expected), replacing
    /// the reports at the back of the queue it supersedes: ACKs before
    /// `psn` and NAKs at or before it — it acknowledges everything before
    /// `psn` itself, with the current MSN.
    fn queue_nak_report(&mut self, psn: Psn, syndrome: Syndrome) {
        while self
            .resp
            .responses
            .back()
            .and_then(Response::report_psn)
            .is_some_and(|p| !psn.is_before(p))
        {
            self.resp.responses.pop_back();
        }
        self.resp.responses.push_back(Response::Nak {
            psn,
            syndrome,
            msn: self.resp.msn,
        });
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
        self.resp.nak_seq_sent = true;
        self.counters.rnr_naks_sent += 1;
        self.queue_nak_report(psn, Syndrome::RnrNak(self.cfg.min_rnr_timer));
    }

    /// Refuses the request at `psn`: NAK, async event, and the QP goes to ERR.
    fn refuse(&mut self, psn: Psn, refusal: Refusal) {
        if self.cfg.transport == Transport::Uc {
            if matches!(refusal, Refusal::Access) {
                self.counters.uc_access_refused += 1;
            } else {
                self.counters.uc_dropped += 1;
            }
            return self.uc_drop_message();
        }
        self.counters.fatal_naks_sent += 1;
        let (code, event) = match refusal {
            Refusal::InvalidRequest => (NakCode::InvalidRequest, Some(AsyncEventType::QpReqErr)),
            Refusal::TooManyRdAtomic => {
                self.counters.rd_atomic_over_limit += 1;
                (NakCode::InvalidRequest, Some(AsyncEventType::QpReqErr))
            }
            Refusal::Access => (
                NakCode::RemoteAccessError,
                Some(AsyncEventType::QpAccessErr),
            ),
            Refusal::Invalidate => {
                self.fail_inbound_recv(WcStatus::RemInvReqErr);
                (NakCode::InvalidRequest, Some(AsyncEventType::QpReqErr))
            }
            Refusal::RecvBuffer(status) => {
                // The receive WR that could not take the message fails with `status`.
                self.fail_inbound_recv(status);
                let code = if status == WcStatus::LocLenErr {
                    NakCode::InvalidRequest
                } else {
                    NakCode::RemoteOperationalError
                };
                (code, None)
            }
        };
        self.resp.responses.push_back(Response::Nak {
            psn,
            syndrome: Syndrome::Nak(code),
            msn: self.resp.msn,
        });
        if let Some(e) = event {
            self.events.push_back(QpEvent::Async(e));
        }
        self.enter_error();
    }

    /// The receive WR of the SEND in progress completes with `status`.
    fn fail_inbound_recv(&mut self, status: WcStatus) {
        if let Some(Inbound::Send { wqe, .. }) = self.resp.inbound.take() {
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
    }
}

/// Checks the remote access a RETH asks for, arriving on QP `qpn` (none
/// for a zero-length one, as IBTA allows any key then), and returns the
/// memory it reaches: a memory window's rkey resolves to the MR beneath. A
/// failure is a remote access error. A length over the maximum message
/// size is an invalid request, whatever the key: a READ that long would
/// take more PSNs than 24-bit order can tell apart.
fn check_remote(
    mem: &dyn Memory,
    reth: &RethRepr,
    pd: u64,
    qpn: u32,
    kind: AccessKind,
) -> Result<Resolved, Refusal> {
    if reth.dma_len > MAX_MSG_SZ {
        return Err(Refusal::InvalidRequest);
    }
    let unresolved = Resolved {
        key: reth.rkey,
        va: reth.va,
        kind,
    };
    if reth.dma_len == 0 {
        return Ok(unresolved);
    }
    let len = u64::from(reth.dma_len);
    let target = mem
        .resolve_remote(reth.rkey, reth.va, len, kind, pd, qpn)
        .map_err(|_| Refusal::Access)?;
    mem.check(target.key, target.va, len, pd, target.kind)
        .map_err(|_| Refusal::Access)?;
    Ok(target)
}
