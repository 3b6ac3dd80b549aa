//! A QP as the engine holds it: its transport (`Transport`: none in
//! RESET, an RC/UC or a UD state machine), its peer, its counters, and
//! where its completions and events go ([`QpEvents`]). The operations the
//! verbs need — apply a modify, queue checked send and receive WRs, report
//! state — are here, behind the engine's front door (`Engine::modify_qp`,
//! `Engine::post_send` …), so no verb ever touches a transport.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::event::AsyncEventType;
use crate::soft::transport::rc::{RcConfig, RcCounters, RcQp};
use crate::soft::transport::recv::SharedRq;
use crate::soft::transport::ud::{UdConfig, UdCounters, UdQp, UdSendWqe};
use crate::soft::transport::{Memory, QpEvent, RecvWqe, SendWqe};
use crate::wc::WorkCompletion;
use crate::wr::QpState;

use super::in_flight_cost;

/// A completion queue refused a completion: it is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CqFull;

/// Where a QP's completions and async events go: its CQs, its SRQ's and its
/// context's async queues (the device's `QpCore` implements it). The engine
/// knows nothing else of the objects above it.
pub(crate) trait QpEvents: Send + Sync {
    /// A send WR completed (or was flushed).
    fn send_completion(&self, wc: WorkCompletion) -> Result<(), CqFull>;
    /// A receive WR completed; `solicited` wakes a CQ armed for solicited
    /// completions only.
    fn recv_completion(&self, wc: WorkCompletion, solicited: bool) -> Result<(), CqFull>;
    /// An async event of the QP (`IBV_EVENT_QP_FATAL`, `COMM_EST` …).
    fn qp_event(&self, event: AsyncEventType);
    /// The QP's SRQ fell below its limit (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    fn srq_limit_reached(&self);
}

/// A QP's transport state machine.
// Held in place in the engine's QP table and never moved on the data path:
// boxing the RC variant would add a pointer chase to every packet, for a
// slot smaller than the two `Option`s it replaced.
#[allow(clippy::large_enum_variant)]
pub(super) enum Transport {
    /// In RESET: no transport (it is built on the way to INIT).
    Reset,
    /// An RC or UC QP.
    Rc(RcQp),
    /// A UD QP.
    Ud(UdQp),
}

/// The settings of the transport a modify builds, by QP type.
pub(crate) enum TransportConfig {
    /// RC and UC.
    Rc(RcConfig),
    /// UD.
    Ud(UdConfig),
}

/// A state transition with the attributes it brings, checked by the verbs
/// layer against the state table and the device's limits.
pub(crate) struct QpChange {
    /// The state the transition was checked from.
    pub(crate) from: QpState,
    /// The state it goes to (`from` when the mask holds no state).
    pub(crate) to: QpState,
    /// The QP's settings after the change.
    pub(crate) config: TransportConfig,
    /// The SRQ the QP takes receive WRs from, if any.
    pub(crate) srq: Option<SharedRq>,
    /// The peer's UDP endpoint, from the address vector (RC and UC).
    pub(crate) peer: SocketAddr,
    /// The change sets the address vector (SQD → SQD may move the peer).
    pub(crate) sets_av: bool,
    /// Entering SQD asks for `IBV_EVENT_SQ_DRAINED`.
    pub(crate) sqd_notify: bool,
}

/// A checked send WR, ready for its QP's transport.
pub(crate) enum SendRequest {
    /// For an RC or UC QP.
    Rc(SendWqe),
    /// For a UD QP.
    Ud(UdSendWqe),
}

/// Why the engine refused a send WR (`E`: the verbs layer's own reason,
/// from its argument checks, passed through in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SendRefusal<E> {
    /// The QP's state takes no send WRs (they need RTS or SQD).
    NotReady(QpState),
    /// The send queue holds its `max_send_wr` WRs.
    QueueFull,
    /// The send WRs posted and not completed would span 2^23 packets.
    TooManyInFlight,
    /// A message of this many bytes would need more than 2^23 packets at
    /// the path MTU.
    MessageTooLong(u32),
    /// The verbs layer refused the WR's arguments.
    Invalid(E),
}

/// Why the engine refused a receive WR (`E` as for [`SendRefusal`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RecvRefusal<E> {
    /// The QP is in RESET.
    Reset,
    /// The receive queue holds its `max_recv_wr` WRs.
    QueueFull,
    /// The verbs layer refused the WR's arguments.
    Invalid(E),
}

/// A refused WR: its index in the list posted, and why. The WRs before it
/// were posted (or, for an all-or-none post, none was).
pub(crate) type Refused<R> = (usize, R);

/// A QP on the wire.
pub(crate) struct QpSlot {
    /// Where its completions and events go.
    events: Arc<dyn QpEvents>,
    pub(super) transport: Transport,
    /// The peer's UDP endpoint (from the address vector): only it may talk
    /// to an RC or UC QP.
    pub(super) peer: Option<SocketAddr>,
    /// Where its last packet into a same-host ring ended (see
    /// `Links::peer_behind`).
    pub(super) ring_mark: Option<u64>,
    /// Counters of transports this QP had before a reset.
    past: RcCounters,
    past_ud: UdCounters,
    max_send_wr: usize,
    max_recv_wr: usize,
    /// This QP's entry in the engine's timer set (at or before its next
    /// timer).
    pub(super) deadline: Option<Instant>,
    /// In the engine's list of QPs holding an ACK back.
    pub(super) ack_listed: bool,
    /// In the engine's list of QPs that may owe packets or events.
    pub(super) dirty: bool,
    /// What this QP adds to the device's bytes in flight (see
    /// `State::in_flight`), as last counted.
    pub(super) in_flight_counted: usize,
    /// In the engine's queue of QPs waiting for room in that budget.
    pub(super) budget_queued: bool,
}

impl QpSlot {
    /// A QP in RESET whose queues take `max_send_wr` / `max_recv_wr` WRs.
    pub(super) fn new(events: Arc<dyn QpEvents>, max_send_wr: u32, max_recv_wr: u32) -> QpSlot {
        QpSlot {
            events,
            transport: Transport::Reset,
            peer: None,
            ring_mark: None,
            past: RcCounters::default(),
            past_ud: UdCounters::default(),
            max_send_wr: max_send_wr as usize,
            max_recv_wr: max_recv_wr as usize,
            deadline: None,
            ack_listed: false,
            dirty: false,
            in_flight_counted: 0,
            budget_queued: false,
        }
    }

    /// The state the QP's transport is in.
    pub(super) fn state(&self) -> QpState {
        match &self.transport {
            Transport::Reset => QpState::Reset,
            Transport::Rc(rc) => rc.state(),
            Transport::Ud(ud) => ud.state(),
        }
    }

    /// Counts again what this QP has in flight into the device's `total`
    /// (see `State::in_flight`): after anything that may have changed it.
    pub(super) fn recount_in_flight(&mut self, total: &mut usize) {
        let counted = self
            .rc()
            .map_or(0, |rc| rc.in_flight() as usize * in_flight_cost(rc.mtu()));
        *total = total.saturating_sub(self.in_flight_counted) + counted;
        self.in_flight_counted = counted;
    }

    /// The RC/UC transport, if it is one.
    pub(super) fn rc(&self) -> Option<&RcQp> {
        match &self.transport {
            Transport::Rc(rc) => Some(rc),
            _ => None,
        }
    }

    /// Whether the send queue still drains (in SQD: SQ_DRAINED not yet due).
    pub(super) fn sq_draining(&self) -> bool {
        match &self.transport {
            Transport::Reset => false,
            Transport::Rc(rc) => rc.sq_draining(),
            Transport::Ud(ud) => ud.sq_draining(),
        }
    }

    /// Adds this QP's counters, past and present, to `stats`.
    pub(super) fn add_counters(&self, stats: &mut super::NetStats) {
        stats.add(&self.past);
        stats.add_ud(&self.past_ud);
        match &self.transport {
            Transport::Reset => {}
            Transport::Rc(rc) => stats.add(&rc.counters),
            Transport::Ud(ud) => stats.add_ud(&ud.counters),
        }
    }

    /// Back to RESET: the transport goes (its counters kept, the receive
    /// WRs it took from an SRQ given back), and so does the peer.
    pub(super) fn reset(&mut self) {
        match std::mem::replace(&mut self.transport, Transport::Reset) {
            Transport::Reset => {}
            Transport::Rc(mut rc) => {
                rc.return_recv();
                self.past.absorb(&rc.counters);
            }
            Transport::Ud(ud) => self.past_ud.absorb(&ud.counters),
        }
        self.peer = None;
    }

    /// Applies a checked transition. `Err` with the state the QP is in if
    /// the transport moved it (to ERR) since the transition was checked, so
    /// the transition checked is not this one (a move to RESET or ERR goes
    /// ahead anyway).
    pub(super) fn apply(&mut self, change: QpChange) -> Result<(), QpState> {
        let QpChange {
            from,
            to,
            config,
            srq,
            peer,
            sets_av,
            sqd_notify,
        } = change;
        let now_in = self.state();
        if now_in != from && !matches!(to, QpState::Err | QpState::Reset) {
            return Err(now_in);
        }
        if to == QpState::Reset {
            self.reset();
            return Ok(());
        }
        match config {
            TransportConfig::Ud(cfg) => match (from, to, &mut self.transport) {
                (QpState::Reset, QpState::Init, _) => {
                    self.transport = Transport::Ud(UdQp::new(cfg, srq));
                }
                (_, QpState::Err, Transport::Ud(ud)) => ud.enter_error(),
                (_, QpState::Err, _) => {
                    let mut ud = UdQp::new(cfg, srq);
                    ud.enter_error();
                    self.transport = Transport::Ud(ud);
                }
                (_, _, Transport::Ud(ud)) => {
                    *ud.config_mut() = cfg;
                    if from != to {
                        ud.enter(to, sqd_notify);
                    }
                }
                _ => {}
            },
            TransportConfig::Rc(cfg) => match (from, to, &mut self.transport) {
                (QpState::Reset, QpState::Init, _) => {
                    self.transport = Transport::Rc(RcQp::with_srq(cfg, srq));
                }
                (_, QpState::Err, Transport::Rc(rc)) => rc.enter_error(),
                (_, QpState::Err, _) => {
                    let mut rc = RcQp::with_srq(cfg, srq);
                    rc.enter_error();
                    self.transport = Transport::Rc(rc);
                }
                (QpState::Init, QpState::Rtr, Transport::Rc(rc)) => {
                    rc.enter_rtr(cfg);
                    self.peer = Some(peer);
                }
                (QpState::Rtr, QpState::Rts, Transport::Rc(rc)) => rc.enter_rts(cfg),
                (_, QpState::Sqd, Transport::Rc(rc)) => {
                    *rc.config_mut() = cfg;
                    if from != QpState::Sqd {
                        // SQ_DRAINED is asked for per transition.
                        rc.set_sq_drain(true, sqd_notify);
                    }
                    if sets_av {
                        self.peer = Some(peer);
                    }
                }
                (QpState::Sqd, QpState::Rts, Transport::Rc(rc)) => {
                    *rc.config_mut() = cfg;
                    rc.set_sq_drain(false, false);
                }
                (_, _, Transport::Rc(rc)) => *rc.config_mut() = cfg,
                _ => {}
            },
        }
        Ok(())
    }

    /// Queues send WRs in order, each checked for the QP's state and room
    /// first, then by `prepare` (the verbs layer's argument checks, which
    /// make its request), then (RC/UC) for the PSNs it takes. With `all`,
    /// none is queued unless every one passes.
    pub(super) fn post_send<W, E>(
        &mut self,
        wrs: &[W],
        mut prepare: impl FnMut(&W) -> Result<SendRequest, E>,
        all: bool,
        mem: &dyn Memory,
    ) -> Result<(), Refused<SendRefusal<E>>> {
        let state = self.state();
        // All or none: the WRs checked, waiting to be queued, and the PSNs
        // they take.
        let mut ready: Vec<SendRequest> = Vec::new();
        let mut ahead = 0u32;
        for (index, wr) in wrs.iter().enumerate() {
            let fail = |why| Err((index, why));
            let queued = match &self.transport {
                Transport::Rc(rc) => Some(rc.sq_len()),
                Transport::Ud(ud) => Some(ud.sq_len()),
                Transport::Reset => None,
            };
            let Some(queued) = queued
                .map(|n| n + ready.len())
                .filter(|_| !matches!(state, QpState::Reset | QpState::Init | QpState::Rtr))
            else {
                return fail(SendRefusal::NotReady(state));
            };
            if queued >= self.max_send_wr {
                return fail(SendRefusal::QueueFull);
            }
            let req = match prepare(wr) {
                Ok(r) => r,
                Err(e) => return fail(SendRefusal::Invalid(e)),
            };
            let packets = match (&self.transport, &req) {
                (Transport::Rc(rc), SendRequest::Rc(wqe)) => {
                    match rc.psn_room_after(&wqe.op, wqe.length, ahead) {
                        Ok(()) => {}
                        Err(true) => return fail(SendRefusal::TooManyInFlight),
                        Err(false) => return fail(SendRefusal::MessageTooLong(wqe.length)),
                    }
                    rc.packets_of(&wqe.op, wqe.length)
                }
                (Transport::Ud(_), SendRequest::Ud(_)) => 1,
                // A request for the other transport: the verbs layer builds
                // them by QP type, so none comes; refused as for no
                // transport at all.
                _ => return fail(SendRefusal::NotReady(state)),
            };
            if all {
                ahead = ahead.saturating_add(packets);
                ready.push(req);
            } else {
                self.queue_send(req, mem);
            }
        }
        for req in ready {
            self.queue_send(req, mem);
        }
        Ok(())
    }

    /// Queues a checked request; a local operation (memory window bind,
    /// local invalidate) is carried out at once, in the order posted.
    fn queue_send(&mut self, req: SendRequest, mem: &dyn Memory) {
        match (req, &mut self.transport) {
            (SendRequest::Rc(w), Transport::Rc(rc)) if w.op.is_local() => rc.post_local_op(w, mem),
            (SendRequest::Rc(w), Transport::Rc(rc)) => rc.post_send(w),
            (SendRequest::Ud(w), Transport::Ud(ud)) => ud.post_send(w),
            _ => {}
        }
    }

    /// Queues receive WRs in order, each checked for the QP's state (not
    /// RESET) and room first, then by `prepare` (the verbs layer's argument
    /// checks, which make its WQE).
    pub(super) fn post_recv<W, E>(
        &mut self,
        wrs: &[W],
        mut prepare: impl FnMut(&W) -> Result<RecvWqe, E>,
    ) -> Result<(), Refused<RecvRefusal<E>>> {
        for (index, wr) in wrs.iter().enumerate() {
            let fail = |why| Err((index, why));
            let queued = match &self.transport {
                Transport::Rc(rc) => rc.rq_len(),
                Transport::Ud(ud) => ud.rq_len(),
                Transport::Reset => return fail(RecvRefusal::Reset),
            };
            if queued >= self.max_recv_wr {
                return fail(RecvRefusal::QueueFull);
            }
            let wqe = match prepare(wr) {
                Ok(w) => w,
                Err(e) => return fail(RecvRefusal::Invalid(e)),
            };
            match &mut self.transport {
                Transport::Rc(rc) => rc.post_recv(wqe),
                Transport::Ud(ud) => ud.post_recv(wqe),
                Transport::Reset => {}
            }
        }
        Ok(())
    }

    /// Moves the transport to ERR (flushing its work).
    pub(super) fn enter_error(&mut self) {
        match &mut self.transport {
            Transport::Reset => {}
            Transport::Rc(rc) => rc.enter_error(),
            Transport::Ud(ud) => ud.enter_error(),
        }
    }

    /// Hands the QP's completions to its CQs and its async events to its
    /// context. A full CQ moves the QP to ERR with IBV_EVENT_QP_FATAL.
    pub(super) fn deliver_events(&mut self) {
        let mut fatal = false;
        loop {
            let event = match &mut self.transport {
                Transport::Reset => None,
                Transport::Rc(rc) => rc.poll_event(),
                Transport::Ud(ud) => ud.poll_event(),
            };
            let Some(e) = event else { break };
            let pushed = match e {
                QpEvent::SendCompletion(wc) => self.events.send_completion(wc),
                QpEvent::RecvCompletion(wc, solicited) => {
                    self.events.recv_completion(wc, solicited)
                }
                QpEvent::Async(ev) => {
                    self.events.qp_event(ev);
                    Ok(())
                }
                QpEvent::SrqLimitReached => {
                    self.events.srq_limit_reached();
                    Ok(())
                }
            };
            if pushed.is_err() && !fatal {
                fatal = true;
                self.enter_error();
                self.events.qp_event(AsyncEventType::QpFatal);
            }
        }
    }
}
