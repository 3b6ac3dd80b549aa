//! Two agents wired together through a fake network (which can drop or
//! duplicate chosen messages) on a fake clock, and one agent fed random
//! message sequences.

use std::time::{Duration, Instant};

use super::agent::{
    iba_time, AcceptParams, CmAgent, CmConfig, CmError, CmEvent, ConnId, ConnState, ConnectParams,
    RandomSource, MAX_BACKLOG,
};
use super::msg::{CmBytes, CmMessage, MsgKind, RejReason, SidrStatus};
use crate::attr::Gid;

const SERVICE: u64 = 0x0106_0000_0000_4a69;
const GUID_A: u64 = 0xa0a0_0000_0000_0001;
const GUID_B: u64 = 0xb0b0_0000_0000_0002;

/// The packet life time of `ConnectParams::rdma_cm_defaults`: its local
/// ACK timeout, less one.
const PACKET_LIFE: u8 = 18;
fn gid(side: Side) -> Gid {
    Gid::from_ip(match side {
        Side::A => "10.0.0.1".parse().unwrap(),
        Side::B => "10.0.0.2".parse().unwrap(),
    })
}

/// A deterministic xorshift source.
fn xorshift(seed: u32) -> RandomSource {
    let mut x = seed;
    Box::new(move || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    A,
    B,
}

impl Side {
    fn other(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Deliver,
    Drop,
    Duplicate,
}

type FateFn = Box<dyn FnMut(Side, &CmMessage) -> Fate>;

/// Drops the first `n` messages of `kind` sent by `from`.
fn drop_first(from: Side, kind: MsgKind, n: usize) -> FateFn {
    let mut seen = 0;
    Box::new(move |side, msg| {
        if side == from && msg.kind() == kind {
            seen += 1;
            if seen <= n {
                return Fate::Drop;
            }
        }
        Fate::Deliver
    })
}

struct Net {
    a: CmAgent,
    b: CmAgent,
    start: Instant,
    now: Instant,
    fate: FateFn,
    /// Everything sent, with who sent it.
    wire: Vec<(Side, CmMessage)>,
    events_a: Vec<CmEvent>,
    events_b: Vec<CmEvent>,
}

impl Net {
    fn new() -> Net {
        let start = Instant::now();
        Net {
            a: CmAgent::new(gid(Side::A), GUID_A, CmConfig::default(), xorshift(7)),
            b: CmAgent::new(gid(Side::B), GUID_B, CmConfig::default(), xorshift(99)),
            start,
            now: start,
            fate: Box::new(|_, _| Fate::Deliver),
            wire: Vec::new(),
            events_a: Vec::new(),
            events_b: Vec::new(),
        }
    }

    fn agent(&mut self, side: Side) -> &mut CmAgent {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Moves messages until none is left in flight, then collects events.
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            for side in [Side::A, Side::B] {
                while let Some(t) = self.agent(side).poll_transmit() {
                    moved = true;
                    assert_eq!(t.to, gid(side.other()), "{side:?} sent to a stranger");
                    self.wire.push((side, t.msg.clone()));
                    let now = self.now;
                    match (self.fate)(side, &t.msg) {
                        Fate::Drop => {}
                        Fate::Deliver => {
                            self.agent(side.other())
                                .handle_message(now, gid(side), t.msg)
                        }
                        Fate::Duplicate => {
                            let other = self.agent(side.other());
                            other.handle_message(now, gid(side), t.msg.clone());
                            other.handle_message(now, gid(side), t.msg);
                        }
                    }
                }
            }
            if !moved {
                break;
            }
        }
        while let Some(e) = self.a.poll_event() {
            self.events_a.push(e);
        }
        while let Some(e) = self.b.poll_event() {
            self.events_b.push(e);
        }
    }

    /// Jumps the clock to the next timer of either agent and runs it.
    fn step(&mut self) -> bool {
        let next = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(next) = next else {
            return false;
        };
        self.now = self.now.max(next);
        let now = self.now;
        self.a.handle_timeout(now);
        self.b.handle_timeout(now);
        self.pump();
        true
    }

    /// Steps until `done` holds (or no timer is left).
    fn run_until(&mut self, done: impl Fn(&Net) -> bool) {
        self.pump();
        for _ in 0..1000 {
            if done(self) || !self.step() {
                return;
            }
        }
        panic!("still not done after 1000 timer steps");
    }

    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    fn sent(&self, side: Side, kind: MsgKind) -> Vec<&CmMessage> {
        self.wire
            .iter()
            .filter(|(s, m)| *s == side && m.kind() == kind)
            .map(|(_, m)| m)
            .collect()
    }

    fn events(&self, side: Side) -> &[CmEvent] {
        match side {
            Side::A => &self.events_a,
            Side::B => &self.events_b,
        }
    }

    fn connect_request(&self) -> ConnId {
        self.connect_requests()
            .first()
            .copied()
            .expect("no ConnectRequest")
    }

    fn connect_requests(&self) -> Vec<ConnId> {
        self.events_b
            .iter()
            .filter_map(|e| match e {
                CmEvent::ConnectRequest { conn, .. } => Some(*conn),
                _ => None,
            })
            .collect()
    }

    fn has(&self, side: Side, pred: impl Fn(&CmEvent) -> bool) -> bool {
        self.events(side).iter().any(pred)
    }

    fn connect(&mut self, qpn: u32, private_data: &[u8]) -> ConnId {
        let mut p = ConnectParams::rdma_cm_defaults(gid(Side::B), SERVICE, qpn, 0x100);
        p.private_data = private_data.to_vec();
        let now = self.now;
        let conn = self.a.connect(now, p).unwrap();
        self.pump();
        conn
    }

    fn accept(&mut self, conn: ConnId, private_data: &[u8]) {
        let now = self.now;
        self.b
            .accept(now, conn, accept_params(private_data))
            .unwrap();
        self.pump();
    }

    /// A listening B, a connection from A, accepted and established.
    fn established() -> (Net, ConnId, ConnId) {
        let mut net = Net::new();
        net.b.listen(SERVICE, 8).unwrap();
        let a = net.connect(0x11, b"");
        let b = net.connect_request();
        net.accept(b, b"");
        let now = net.now;
        net.a.establish(now, a, b"").unwrap();
        net.pump();
        assert_eq!(net.a.state(a), Some(ConnState::Established));
        assert_eq!(net.b.state(b), Some(ConnState::Established));
        (net, a, b)
    }
}

fn accept_params(private_data: &[u8]) -> AcceptParams {
    AcceptParams {
        local_qpn: 0x22,
        starting_psn: 0x200,
        responder_resources: 4,
        initiator_depth: 2,
        rnr_retry_count: 7,
        target_ack_delay: 15,
        srq: false,
        flow_control: true,
        private_data: private_data.to_vec(),
    }
}

/// The REQ's resend interval with rdma_cm's defaults: CM response
/// timeout 20 plus twice the packet life.
fn default_wait() -> Duration {
    iba_time(20) + 2 * iba_time(PACKET_LIFE)
}

fn pd<const N: usize>(bytes: &[u8]) -> CmBytes<N> {
    CmBytes::new(bytes).unwrap()
}

#[test]
fn connect_accept_rtu_disconnect_timewait_with_private_data_both_ways() {
    let mut net = Net::new();
    let listen = net.b.listen(SERVICE, 8).unwrap();
    let a = net.connect(0x11, b"hello");

    let (b, req) = match &net.events_b[..] {
        [CmEvent::ConnectRequest {
            listen: l,
            conn,
            peer,
            req,
        }] => {
            assert_eq!((*l, *peer), (listen, gid(Side::A)));
            (*conn, req.clone())
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(req.private_data.as_slice(), b"hello");
    assert_eq!((req.local_qpn, req.starting_psn), (0x11, 0x100));
    assert_eq!((req.service_id, req.local_ca_guid), (SERVICE, GUID_A));
    assert_eq!(req.primary.remote_gid, gid(Side::B));
    assert_eq!(net.b.state(b), Some(ConnState::ReqRcvd));

    net.accept(b, b"welcome");
    let response = match &net.events_a[..] {
        [CmEvent::ConnectResponse { conn, response }] if *conn == a => response.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(response.private_data.as_slice(), b"welcome");
    assert_eq!(
        (response.remote_qpn, response.remote_starting_psn),
        (0x22, 0x200)
    );
    // The peer's view turned to ours.
    assert_eq!(
        (response.responder_resources, response.initiator_depth),
        (2, 4)
    );
    assert_eq!(response.remote_ca_guid, GUID_B);
    assert_eq!(response.target_ack_delay, 15);
    assert!(response.flow_control && !response.srq);
    assert_eq!(response.rnr_retry_count, 7);

    let now = net.now;
    net.a.establish(now, a, b"rtu").unwrap();
    net.pump();
    assert!(net.has(Side::A, |e| *e == CmEvent::Established { conn: a }));
    assert!(net.has(Side::B, |e| *e == CmEvent::Established { conn: b }));

    let now = net.now;
    net.a.disconnect(now, a, b"bye").unwrap();
    net.pump();
    assert!(net.has(Side::B, |e| *e
        == CmEvent::Disconnected {
            conn: b,
            private_data: pd(b"bye")
        }));
    assert!(net.has(
        Side::A,
        |e| matches!(e, CmEvent::Disconnected { conn, .. } if *conn == a)
    ));
    assert_eq!(net.a.state(a), Some(ConnState::TimeWait));
    assert_eq!(net.b.state(b), Some(ConnState::TimeWait));

    // Time-wait: the ACK delay (15) plus twice the packet life.
    let disconnected_at = net.now;
    net.run_until(|n| n.has(Side::A, |e| matches!(e, CmEvent::TimewaitExit { .. })));
    assert_eq!(
        net.now - disconnected_at,
        iba_time(15) + 2 * iba_time(PACKET_LIFE)
    );
    net.run_until(|n| n.has(Side::B, |e| matches!(e, CmEvent::TimewaitExit { .. })));
    assert_eq!(net.a.state(a), Some(ConnState::Idle));
    assert_eq!(net.b.state(b), Some(ConnState::Idle));

    // Transaction IDs: REP, RTU echo the REQ's; the DREP the DREQ's.
    let req_tid = net.sent(Side::A, MsgKind::Req)[0].tid();
    assert_eq!(net.sent(Side::B, MsgKind::Rep)[0].tid(), req_tid);
    assert_eq!(net.sent(Side::A, MsgKind::Rtu)[0].tid(), req_tid);
    let dreq_tid = net.sent(Side::A, MsgKind::Dreq)[0].tid();
    assert_eq!(net.sent(Side::B, MsgKind::Drep)[0].tid(), dreq_tid);
    match net.sent(Side::A, MsgKind::Rtu)[0] {
        CmMessage::Rtu(rtu) => assert_eq!(rtu.private_data.as_slice(), b"rtu"),
        other => panic!("{other:?}"),
    }

    let (sa, sb) = (*net.a.stats(), *net.b.stats());
    assert_eq!((sa.sent.req, sa.sent.rtu, sa.sent.dreq), (1, 1, 1));
    assert_eq!((sb.sent.rep, sb.sent.drep), (1, 1));
    assert_eq!(
        (sb.received.req, sb.received.rtu, sb.received.dreq),
        (1, 1, 1)
    );
    assert_eq!((sa.received.rep, sa.received.drep), (1, 1));
    assert_eq!(sa.retransmitted, Default::default());
    assert_eq!(sb.retransmitted, Default::default());
    assert_eq!(
        (sa.drops, sb.drops),
        (Default::default(), Default::default())
    );

    let now = net.now;
    net.a.destroy(now, a).unwrap();
    net.b.destroy(now, b).unwrap();
    net.b.unlisten(listen).unwrap();
    assert!(net.a.is_empty() && net.b.is_empty());
    assert_eq!((net.a.held(), net.b.held()), (0, 0));
    assert_eq!(net.a.poll_timeout(), None);
}

#[test]
fn user_reject_carries_private_data() {
    let mut net = Net::new();
    net.b.listen(SERVICE, 8).unwrap();
    let a = net.connect(0x11, b"");
    let b = net.connect_request();
    let now = net.now;
    net.b.reject(now, b, b"go away").unwrap();
    net.pump();
    assert_eq!(
        net.events_a,
        [CmEvent::Rejected {
            conn: a,
            reason: RejReason::ConsumerDefined,
            private_data: pd(b"go away"),
        }]
    );
    assert_eq!(
        net.sent(Side::B, MsgKind::Rej)[0].tid(),
        net.sent(Side::A, MsgKind::Req)[0].tid()
    );
    assert_eq!(net.a.state(a), Some(ConnState::Idle));
    assert_eq!(net.b.state(b), Some(ConnState::Idle));
    assert_eq!(net.a.poll_timeout(), None, "no REQ resend after the REJ");
    assert_eq!((net.a.held(), net.b.held()), (0, 0));
}

#[test]
fn no_listener_is_rejected_invalid_service_id() {
    let mut net = Net::new();
    let a = net.connect(0x11, b"");
    assert!(matches!(
        net.events_a[..],
        [CmEvent::Rejected {
            conn,
            reason: RejReason::InvalidServiceId,
            ..
        }] if conn == a
    ));
    assert_eq!(RejReason::InvalidServiceId.code(), 8);
    assert!(net.b.is_empty());
    assert!(net.events_b.is_empty());
}

#[test]
fn lost_req_is_resent_after_the_response_wait() {
    let mut net = Net::new();
    net.fate = drop_first(Side::A, MsgKind::Req, 1);
    net.b.listen(SERVICE, 8).unwrap();
    net.connect(0x11, b"");
    assert!(net.events_b.is_empty());
    net.run_until(|n| !n.connect_requests().is_empty());
    assert_eq!(net.elapsed(), default_wait());
    assert_eq!(net.a.stats().retransmitted.req, 1);
}

#[test]
fn lost_rep_is_sent_again_on_the_duplicate_req() {
    let mut net = Net::new();
    net.fate = drop_first(Side::B, MsgKind::Rep, 1);
    net.b.listen(SERVICE, 8).unwrap();
    let a = net.connect(0x11, b"");
    let b = net.connect_request();
    net.accept(b, b"");
    assert_eq!(net.a.state(a), Some(ConnState::ReqSent));
    net.run_until(|n| n.has(Side::A, |e| matches!(e, CmEvent::ConnectResponse { .. })));
    assert!(net.b.stats().duplicates >= 1);
    assert!(net.b.stats().retransmitted.rep >= 1);
    assert_eq!(
        net.connect_requests().len(),
        1,
        "the duplicate REQ is no new request"
    );
    let now = net.now;
    net.a.establish(now, a, b"").unwrap();
    net.pump();
    assert_eq!(net.b.state(b), Some(ConnState::Established));
}

#[test]
fn lost_rtu_is_answered_by_the_rep_resend() {
    let mut net = Net::new();
    net.fate = drop_first(Side::A, MsgKind::Rtu, 1);
    net.b.listen(SERVICE, 8).unwrap();
    let a = net.connect(0x11, b"");
    let b = net.connect_request();
    net.accept(b, b"");
    let now = net.now;
    net.a.establish(now, a, b"").unwrap();
    net.pump();
    assert_eq!(net.b.state(b), Some(ConnState::RepSent));
    net.run_until(|n| n.has(Side::B, |e| matches!(e, CmEvent::Established { .. })));
    assert_eq!(net.elapsed(), default_wait());
    assert_eq!(net.b.stats().retransmitted.rep, 1);
    assert_eq!(net.a.stats().retransmitted.rtu, 1);
    assert_eq!(net.b.poll_timeout(), None);
}

#[test]
fn lost_rtu_passive_side_establishes_on_user_call() {
    let mut net = Net::new();
    net.fate = Box::new(|_, m| {
        if m.kind() == MsgKind::Rtu {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    net.b.listen(SERVICE, 8).unwrap();
    let a = net.connect(0x11, b"");
    let b = net.connect_request();
    net.accept(b, b"");
    let now = net.now;
    net.a.establish(now, a, b"").unwrap();
    net.pump();
    // Data arrived on B's QP before the RTU: rdma_establish.
    net.b.establish(now, b, b"").unwrap();
    net.pump();
    assert!(net.has(Side::B, |e| *e == CmEvent::Established { conn: b }));
    assert_eq!(net.b.poll_timeout(), None, "no more REP resends");
    assert_eq!(
        net.b.establish(now, b, b""),
        Err(CmError::AlreadyEstablished)
    );
    assert_eq!(
        CmError::AlreadyEstablished.errno(),
        nix::errno::Errno::EISCONN as i32
    );
}

#[test]
fn lost_dreq_is_resent() {
    let (mut net, a, b) = Net::established();
    net.fate = drop_first(Side::A, MsgKind::Dreq, 1);
    let now = net.now;
    net.a.disconnect(now, a, b"").unwrap();
    net.pump();
    assert_eq!(net.b.state(b), Some(ConnState::Established));
    let t0 = net.now;
    net.run_until(|n| n.has(Side::A, |e| matches!(e, CmEvent::Disconnected { .. })));
    assert_eq!(net.now - t0, default_wait());
    assert_eq!(net.a.stats().retransmitted.dreq, 1);
    assert!(net.has(Side::B, |e| matches!(e, CmEvent::Disconnected { .. })));
    // Disconnecting again is no error and sends nothing.
    let now = net.now;
    net.a.disconnect(now, a, b"").unwrap();
    assert_eq!(net.a.poll_transmit(), None);
}

#[test]
fn lost_drep_is_sent_again_from_timewait() {
    // B's time-wait (ACK delay 23: ~34 s) outlasts A's DREQ resend (~4.8 s).
    let mut net = Net::new();
    net.b.listen(SERVICE, 8).unwrap();
    let a = net.connect(0x11, b"");
    let b = net.connect_request();
    let now = net.now;
    let mut params = accept_params(b"");
    params.target_ack_delay = 23;
    net.b.accept(now, b, params).unwrap();
    net.pump();
    net.a.establish(now, a, b"").unwrap();
    net.pump();
    net.fate = drop_first(Side::B, MsgKind::Drep, 1);
    net.a.disconnect(now, a, b"").unwrap();
    net.pump();
    assert_eq!(net.b.state(b), Some(ConnState::TimeWait));
    assert_eq!(net.a.state(a), Some(ConnState::DreqSent));
    net.run_until(|n| n.has(Side::A, |e| matches!(e, CmEvent::Disconnected { .. })));
    assert_eq!(net.elapsed(), default_wait());
    assert_eq!(net.a.state(a), Some(ConnState::TimeWait));
    assert_eq!(net.b.state(b), Some(ConnState::TimeWait));
    assert_eq!(net.b.stats().retransmitted.drep, 1);
    assert_eq!(net.b.stats().duplicates, 1);
    let disconnects = net
        .events_b
        .iter()
        .filter(|e| matches!(e, CmEvent::Disconnected { .. }))
        .count();
    assert_eq!(disconnects, 1, "reported once");
}

#[test]
fn dreq_after_timewait_is_still_answered() {
    // B's time-wait (~0.7 s) ends before A's DREQ resend (~4.8 s): the
    // DREQ then matches nothing, and is answered all the same.
    let (mut net, a, b) = Net::established();
    net.fate = drop_first(Side::B, MsgKind::Drep, 1);
    let now = net.now;
    net.a.disconnect(now, a, b"").unwrap();
    net.run_until(|n| n.has(Side::A, |e| matches!(e, CmEvent::Disconnected { .. })));
    assert_eq!(net.b.state(b), Some(ConnState::Idle));
    assert_eq!(net.a.state(a), Some(ConnState::TimeWait));
    assert_eq!(net.b.stats().drops.unknown_conn, 1);
    assert_eq!(net.b.stats().sent.drep, 2);
}

#[test]
fn dreq_retries_run_out_into_timewait() {
    let (mut net, a, _) = Net::established();
    net.fate = Box::new(|side, _| {
        if side == Side::A {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    let now = net.now;
    net.a.disconnect(now, a, b"").unwrap();
    let t0 = net.now;
    net.run_until(|n| n.has(Side::A, |e| matches!(e, CmEvent::Disconnected { .. })));
    assert_eq!(net.now - t0, 16 * default_wait());
    assert_eq!(net.a.state(a), Some(ConnState::TimeWait));
    assert_eq!(net.a.stats().timeouts, 1);
}

#[test]
fn duplicate_req_is_answered_with_an_mra_while_the_user_decides() {
    let mut net = Net::new();
    net.fate = Box::new(|_, m| {
        if m.kind() == MsgKind::Req {
            Fate::Duplicate
        } else {
            Fate::Deliver
        }
    });
    net.b.listen(SERVICE, 8).unwrap();
    let a = net.connect(0x11, b"");
    assert_eq!(net.connect_requests().len(), 1);
    let b = net.connect_request();
    assert_eq!(net.b.state(b), Some(ConnState::MraReqSent));
    assert_eq!(net.a.state(a), Some(ConnState::MraReqRcvd));
    assert_eq!(net.b.stats().duplicates, 1);
    assert_eq!(net.b.stats().sent.mra, 1);
    net.accept(b, b"");
    let now = net.now;
    net.a.establish(now, a, b"").unwrap();
    net.pump();
    assert_eq!(net.b.state(b), Some(ConnState::Established));
}

#[test]
fn unreachable_peer_times_out_after_every_retry() {
    let mut net = Net::new();
    net.fate = Box::new(|_, _| Fate::Drop);
    let a = net.connect(0x11, b"");
    net.run_until(|n| !n.events_a.is_empty());
    assert_eq!(net.events_a, [CmEvent::Unreachable { conn: a }]);
    // 15 resends, each after the response wait, then one more wait.
    assert_eq!(net.elapsed(), 16 * default_wait());
    assert_eq!(net.a.stats().sent.req, 16);
    assert_eq!(net.a.stats().retransmitted.req, 15);
    assert_eq!(net.a.stats().timeouts, 1);
    assert_eq!(net.a.state(a), Some(ConnState::Idle));
    assert_eq!(net.a.held(), 0);
}

#[test]
fn rep_retries_run_out_into_unreachable() {
    let mut net = Net::new();
    net.fate = Box::new(|side, m| {
        if side == Side::B && m.kind() == MsgKind::Rep {
            Fate::Drop
        } else if side == Side::A && m.kind() == MsgKind::Req {
            // The active side got tired and went away.
            Fate::Deliver
        } else {
            Fate::Deliver
        }
    });
    net.b.listen(SERVICE, 8).unwrap();
    let a = net.connect(0x11, b"");
    let b = net.connect_request();
    net.accept(b, b"");
    let now = net.now;
    net.a.destroy(now, a).unwrap();
    // A's REJ (timeout, naming A by its CA GUID) ends B's connection.
    net.pump();
    assert!(net.has(Side::B, |e| matches!(
        e,
        CmEvent::Rejected { conn, reason: RejReason::Timeout, .. } if *conn == b
    )));

    // And with A silent, B gives up on its REP.
    let mut net = Net::new();
    net.b.listen(SERVICE, 8).unwrap();
    net.fate = Box::new(|side, m| {
        if side == Side::B && m.kind() == MsgKind::Rep {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    let mut p = ConnectParams::rdma_cm_defaults(gid(Side::B), SERVICE, 0x11, 1);
    p.max_cm_retries = 2;
    let now = net.now;
    let a = net.a.connect(now, p).unwrap();
    net.pump();
    let b = net.connect_request();
    net.accept(b, b"");
    let t0 = net.now;
    net.run_until(|n| n.has(Side::B, |e| matches!(e, CmEvent::Unreachable { .. })));
    assert_eq!(net.now - t0, 3 * default_wait());
    assert_eq!(net.b.state(b), Some(ConnState::Idle));
    assert_eq!(net.b.held(), 0);
    let _ = a;
}

#[test]
fn mra_extends_the_active_sides_wait() {
    let mut net = Net::new();
    net.b.listen(SERVICE, 8).unwrap();
    let a = net.connect(0x11, b"");
    let b = net.connect_request();
    // B's user is slow: B MRAs half-way through A's response timeout.
    net.step();
    assert_eq!(net.elapsed(), iba_time(20) / 2);
    assert_eq!(net.b.state(b), Some(ConnState::MraReqSent));
    assert_eq!(net.a.state(a), Some(ConnState::MraReqRcvd));
    match net.sent(Side::B, MsgKind::Mra)[0] {
        CmMessage::Mra(m) => assert_eq!(m.service_timeout, 24),
        other => panic!("{other:?}"),
    }
    let wait = iba_time(24) + 2 * iba_time(PACKET_LIFE);
    assert_eq!(net.a.poll_timeout(), Some(net.now + wait));
    assert!(wait > default_wait());
    // Accept long after A's first wait would have run out.
    net.now += Duration::from_secs(30);
    let b_now = net.now;
    net.b.accept(b_now, b, accept_params(b"")).unwrap();
    net.pump();
    assert!(net.has(Side::A, |e| matches!(e, CmEvent::ConnectResponse { .. })));
    assert_eq!(net.a.stats().retransmitted.req, 0);
    assert_eq!(net.a.stats().received.mra, 1);
}

#[test]
fn active_side_mras_a_rep_its_user_sits_on() {
    let mut net = Net::new();
    net.b.listen(SERVICE, 8).unwrap();
    let a = net.connect(0x11, b"");
    let b = net.connect_request();
    net.accept(b, b"");
    assert_eq!(net.a.state(a), Some(ConnState::RepRcvd));
    net.step();
    assert_eq!(net.a.state(a), Some(ConnState::MraRepSent));
    assert_eq!(net.b.state(b), Some(ConnState::MraRepRcvd));
    // A duplicate REP (B's resend) gets the MRA again.
    net.step();
    assert_eq!(net.a.stats().retransmitted.mra, 1);
    let now = net.now;
    net.a.establish(now, a, b"").unwrap();
    net.pump();
    assert_eq!(net.b.state(b), Some(ConnState::Established));
}

#[test]
fn req_beyond_the_backlog_is_dropped_until_room_is_made() {
    let mut net = Net::new();
    net.b.listen(SERVICE, 1).unwrap();
    let _a1 = net.connect(0x11, b"");
    let a2 = net.connect(0x12, b"");
    assert_eq!(net.connect_requests().len(), 1);
    assert_eq!(net.b.stats().drops.backlog_full, 1);
    assert!(
        net.sent(Side::B, MsgKind::Rej).is_empty(),
        "no REJ, as ucma"
    );
    assert_eq!(net.a.state(a2), Some(ConnState::ReqSent));
    // The user rejects the first: the second's resend finds room.
    let b1 = net.connect_request();
    let now = net.now;
    net.b.reject(now, b1, b"").unwrap();
    net.run_until(|n| n.connect_requests().len() == 2);
    assert_eq!(net.elapsed(), default_wait());
    assert_eq!(net.b.half_open(), 1);
    assert_eq!(MAX_BACKLOG, 1024);
}

#[test]
fn sidr_request_and_reply() {
    let mut net = Net::new();
    net.fate = Box::new(|_, m| {
        if m.kind() == MsgKind::SidrReq {
            Fate::Duplicate
        } else {
            Fate::Deliver
        }
    });
    let listen = net.b.listen(SERVICE, 8).unwrap();
    let now = net.now;
    let a = net
        .a
        .sidr_request(
            now,
            gid(Side::B),
            SERVICE,
            0xffff,
            b"who",
            Duration::from_millis(500),
            3,
        )
        .unwrap();
    net.pump();
    let b = match &net.events_b[..] {
        [CmEvent::SidrRequest {
            listen: l,
            conn,
            peer,
            service_id,
            pkey,
            private_data,
        }] => {
            assert_eq!(
                (*l, *peer, *service_id, *pkey),
                (listen, gid(Side::A), SERVICE, 0xffff)
            );
            assert_eq!(private_data.as_slice(), b"who");
            *conn
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(net.b.stats().drops.duplicate, 1);
    net.b
        .sidr_reply(now, b, SidrStatus::Success, 0x42, 0x1234_5678, b"me")
        .unwrap();
    net.pump();
    assert_eq!(
        net.events_a,
        [CmEvent::SidrReply {
            conn: a,
            status: SidrStatus::Success,
            qpn: 0x42,
            qkey: 0x1234_5678,
            private_data: pd(b"me"),
        }]
    );
    assert_eq!(
        net.sent(Side::B, MsgKind::SidrRep)[0].tid(),
        net.sent(Side::A, MsgKind::SidrReq)[0].tid()
    );
    assert_eq!(
        (net.a.state(a), net.b.state(b)),
        (Some(ConnState::Idle), Some(ConnState::Idle))
    );
    assert_eq!((net.a.held(), net.b.held()), (0, 0));
}

#[test]
fn sidr_without_listener_and_without_peer() {
    let mut net = Net::new();
    let now = net.now;
    let a = net
        .a
        .sidr_request(
            now,
            gid(Side::B),
            SERVICE,
            0xffff,
            b"",
            Duration::from_millis(500),
            3,
        )
        .unwrap();
    net.pump();
    assert!(matches!(
        net.events_a[..],
        [CmEvent::SidrReply { conn, status: SidrStatus::Unsupported, .. }] if conn == a
    ));
    assert_eq!(SidrStatus::Unsupported.code(), 1);

    let mut net = Net::new();
    net.fate = Box::new(|_, _| Fate::Drop);
    let now = net.now;
    let a = net
        .a
        .sidr_request(
            now,
            gid(Side::B),
            SERVICE,
            0xffff,
            b"",
            Duration::from_millis(500),
            3,
        )
        .unwrap();
    net.run_until(|n| !n.events_a.is_empty());
    assert_eq!(net.events_a, [CmEvent::Unreachable { conn: a }]);
    assert_eq!(net.elapsed(), Duration::from_millis(2000));
    assert_eq!(net.a.stats().retransmitted.sidr_req, 3);
}

#[test]
fn stale_connection_is_rejected_and_the_old_one_disconnected() {
    let (mut net, a_old, b_old) = Net::established();
    // A reconnects from the same QP (say it lost its state).
    let a_new = net.connect(0x11, b"");
    assert!(net.has(Side::A, |e| matches!(
        e,
        CmEvent::Rejected { conn, reason: RejReason::StaleConn, .. } if *conn == a_new
    )));
    assert_eq!(net.connect_requests().len(), 1);
    assert!(net.has(
        Side::A,
        |e| matches!(e, CmEvent::Disconnected { conn, .. } if *conn == a_old)
    ));
    assert!(net.has(
        Side::B,
        |e| matches!(e, CmEvent::Disconnected { conn, .. } if *conn == b_old)
    ));
    assert_eq!(net.b.state(b_old), Some(ConnState::TimeWait));
}

#[test]
fn hostile_messages_are_dropped_and_counted() {
    let (mut net, a, b) = Net::established();
    let now = net.now;
    let (ga, gb) = (gid(Side::A), gid(Side::B));
    let mut rtu = match net.sent(Side::A, MsgKind::Rtu)[0].clone() {
        CmMessage::Rtu(r) => r,
        other => panic!("{other:?}"),
    };
    // Unknown comm ID.
    rtu.remote_comm_id ^= 0x5555;
    net.b.handle_message(now, ga, CmMessage::Rtu(rtu.clone()));
    assert_eq!(net.b.stats().drops.unknown_conn, 1);
    // Right IDs, wrong sender.
    rtu.remote_comm_id ^= 0x5555;
    let stranger = Gid::from_ip("10.9.9.9".parse().unwrap());
    net.b
        .handle_message(now, stranger, CmMessage::Rtu(rtu.clone()));
    assert_eq!(net.b.stats().drops.unknown_conn, 2);
    // A duplicate RTU.
    net.b.handle_message(now, ga, CmMessage::Rtu(rtu));
    assert_eq!(net.b.stats().drops.duplicate, 1);
    // A REQ with comm ID 0, and one with a 25-bit QPN.
    let mut req = match net.sent(Side::A, MsgKind::Req)[0].clone() {
        CmMessage::Req(r) => r,
        other => panic!("{other:?}"),
    };
    req.local_comm_id = 0;
    net.b.handle_message(now, ga, CmMessage::Req(req.clone()));
    req.local_comm_id = 77;
    req.local_qpn = 1 << 24;
    net.b.handle_message(now, ga, CmMessage::Req(req));
    assert_eq!(net.b.stats().drops.malformed, 2);
    // A DREQ for nobody is answered anyway.
    let mut dreq = super::msg::Dreq {
        tid: 9,
        local_comm_id: 1,
        remote_comm_id: 2,
        remote_qpn: 3,
        private_data: CmBytes::empty(),
    };
    net.a
        .handle_message(now, gb, CmMessage::Dreq(Box::new(dreq.clone())));
    match net.a.poll_transmit() {
        Some(t) => match t.msg {
            CmMessage::Drep(d) => assert_eq!((d.tid, d.local_comm_id, d.remote_comm_id), (9, 2, 1)),
            other => panic!("{other:?}"),
        },
        None => panic!("no DREP"),
    }
    // A DREQ with the right IDs but the wrong QPN: dropped, no DREP.
    let (a_id, b_id) = comm_ids(&net);
    dreq.local_comm_id = a_id;
    dreq.remote_comm_id = b_id;
    dreq.remote_qpn = 0x999;
    net.b
        .handle_message(now, ga, CmMessage::Dreq(Box::new(dreq)));
    assert_eq!(net.b.poll_transmit(), None);
    assert_eq!(net.b.stats().drops.malformed, 3);
    assert_eq!(net.a.state(a), Some(ConnState::Established));
    assert_eq!(net.b.state(b), Some(ConnState::Established));

    // An MRA asking for hours is taken as the cap (68.7 s).
    let mut net = Net::new();
    net.fate = Box::new(|_, _| Fate::Drop);
    let a = net.connect(1, b"");
    let req_id = match net.sent(Side::A, MsgKind::Req)[0] {
        CmMessage::Req(r) => r.local_comm_id,
        _ => 0,
    };
    let now = net.now;
    net.a.handle_message(
        now,
        gb,
        CmMessage::Mra(Box::new(super::msg::Mra {
            tid: 1,
            local_comm_id: 5,
            remote_comm_id: req_id,
            message_mraed: super::msg::MsgResponse::Req,
            service_timeout: 31,
            private_data: CmBytes::empty(),
        })),
    );
    assert_eq!(net.a.state(a), Some(ConnState::MraReqRcvd));
    assert_eq!(iba_time(31), iba_time(24));
    assert_eq!(
        net.a.poll_timeout(),
        Some(now + iba_time(24) + 2 * iba_time(PACKET_LIFE))
    );
}

/// A's and B's comm IDs of an established pair, from A's RTU.
fn comm_ids(net: &Net) -> (u32, u32) {
    match net.sent(Side::A, MsgKind::Rtu)[0] {
        CmMessage::Rtu(r) => (r.local_comm_id, r.remote_comm_id),
        _ => (0, 0),
    }
}

/// Drives a connection to `state`; returns the net, the side holding the
/// connection, and its ID.
fn drive_to(state: ConnState) -> (Net, Side, ConnId) {
    let mut net = Net::new();
    let sidr = |net: &mut Net| {
        let now = net.now;
        net.a
            .sidr_request(
                now,
                gid(Side::B),
                SERVICE,
                0xffff,
                b"",
                Duration::from_secs(1),
                2,
            )
            .unwrap()
    };
    match state {
        ConnState::ReqSent => (Net::new_connect_only(), Side::A, ConnId::first()),
        ConnState::MraReqRcvd | ConnState::MraReqSent => {
            net.b.listen(SERVICE, 8).unwrap();
            let a = net.connect(1, b"");
            let b = net.connect_request();
            net.step();
            if state == ConnState::MraReqRcvd {
                (net, Side::A, a)
            } else {
                (net, Side::B, b)
            }
        }
        ConnState::ReqRcvd => {
            net.b.listen(SERVICE, 8).unwrap();
            net.connect(1, b"");
            let b = net.connect_request();
            (net, Side::B, b)
        }
        ConnState::RepSent | ConnState::RepRcvd | ConnState::MraRepSent | ConnState::MraRepRcvd => {
            net.b.listen(SERVICE, 8).unwrap();
            let a = net.connect(1, b"");
            let b = net.connect_request();
            net.accept(b, b"");
            if matches!(state, ConnState::MraRepSent | ConnState::MraRepRcvd) {
                net.step();
            }
            match state {
                ConnState::RepSent | ConnState::MraRepRcvd => (net, Side::B, b),
                _ => (net, Side::A, a),
            }
        }
        ConnState::Established => {
            let (net, a, _) = Net::established();
            (net, Side::A, a)
        }
        ConnState::DreqSent | ConnState::TimeWait | ConnState::Idle => {
            let (mut net, a, _) = Net::established();
            if state == ConnState::DreqSent {
                net.fate = Box::new(|_, _| Fate::Drop);
            }
            let now = net.now;
            net.a.disconnect(now, a, b"").unwrap();
            net.pump();
            if state == ConnState::Idle {
                net.run_until(|n| n.a.state(a) == Some(ConnState::Idle));
            }
            (net, Side::A, a)
        }
        ConnState::SidrReqSent => {
            net.fate = Box::new(|_, _| Fate::Drop);
            let a = sidr(&mut net);
            net.pump();
            (net, Side::A, a)
        }
        ConnState::SidrReqRcvd => {
            net.b.listen(SERVICE, 8).unwrap();
            sidr(&mut net);
            net.pump();
            let b = net
                .events_b
                .iter()
                .find_map(|e| match e {
                    CmEvent::SidrRequest { conn, .. } => Some(*conn),
                    _ => None,
                })
                .unwrap();
            (net, Side::B, b)
        }
    }
}

impl Net {
    fn new_connect_only() -> Net {
        let mut net = Net::new();
        net.fate = Box::new(|_, _| Fate::Drop);
        net.connect(1, b"");
        net
    }
}

impl ConnId {
    /// The first ID an agent hands out (for a connect made first).
    fn first() -> ConnId {
        let mut agent = CmAgent::new(gid(Side::A), 1, CmConfig::default(), xorshift(7));
        let p = ConnectParams::rdma_cm_defaults(gid(Side::B), 1, 1, 1);
        agent.connect(Instant::now(), p).unwrap()
    }
}

#[test]
fn destroy_in_every_state_leaves_nothing_behind() {
    use ConnState::*;
    let expect = [
        (ReqSent, Some((MsgKind::Rej, Some(RejReason::Timeout)))),
        (MraReqRcvd, Some((MsgKind::Rej, Some(RejReason::Timeout)))),
        (
            ReqRcvd,
            Some((MsgKind::Rej, Some(RejReason::ConsumerDefined))),
        ),
        (
            MraReqSent,
            Some((MsgKind::Rej, Some(RejReason::ConsumerDefined))),
        ),
        (
            RepSent,
            Some((MsgKind::Rej, Some(RejReason::ConsumerDefined))),
        ),
        (
            MraRepRcvd,
            Some((MsgKind::Rej, Some(RejReason::ConsumerDefined))),
        ),
        (
            RepRcvd,
            Some((MsgKind::Rej, Some(RejReason::ConsumerDefined))),
        ),
        (
            MraRepSent,
            Some((MsgKind::Rej, Some(RejReason::ConsumerDefined))),
        ),
        (Established, Some((MsgKind::Dreq, None))),
        (DreqSent, None),
        (TimeWait, None),
        (Idle, None),
        (SidrReqSent, None),
        (SidrReqRcvd, Some((MsgKind::SidrRep, None))),
    ];
    for (state, sends) in expect {
        let (mut net, side, conn) = drive_to(state);
        assert_eq!(
            net.agent(side).state(conn),
            Some(state),
            "setup of {state:?}"
        );
        let before = net.wire.len();
        let now = net.now;
        net.agent(side).destroy(now, conn).unwrap();
        let sent: Vec<_> = std::iter::from_fn(|| net.agent(side).poll_transmit()).collect();
        match sends {
            None => assert!(sent.is_empty(), "{state:?}: {sent:?}"),
            Some((kind, reason)) => {
                assert_eq!(sent.len(), 1, "{state:?}: {sent:?}");
                assert_eq!(sent[0].msg.kind(), kind, "{state:?}");
                if let (CmMessage::Rej(rej), Some(reason)) = (&sent[0].msg, reason) {
                    assert_eq!(rej.reason, reason, "{state:?}");
                }
                if let CmMessage::SidrRep(rep) = &sent[0].msg {
                    assert_eq!(rep.status, SidrStatus::Reject);
                }
            }
        }
        let _ = before;
        let agent = net.agent(side);
        assert_eq!(agent.state(conn), None, "{state:?}");
        assert_eq!(agent.len(), 0, "{state:?}");
        assert_eq!(agent.held(), 0, "{state:?}");
        assert_eq!(agent.poll_timeout(), None, "{state:?}");
        assert_eq!(agent.destroy(now, conn), Err(CmError::UnknownConn));
    }
}

#[test]
fn misuse_is_refused_with_rdma_cms_errno() {
    use nix::errno::Errno;
    let mut net = Net::new();
    let now = net.now;
    let l = net.b.listen(SERVICE, 0).unwrap();
    let err = net.b.listen(SERVICE, 4).unwrap_err();
    assert_eq!(err, CmError::AddrInUse(SERVICE));
    assert_eq!(err.errno(), Errno::EADDRINUSE as i32);
    net.b.unlisten(l).unwrap();
    assert_eq!(net.b.unlisten(l), Err(CmError::UnknownListen));

    let mut p = ConnectParams::rdma_cm_defaults(gid(Side::B), SERVICE, 1, 1);
    p.private_data = vec![0; 93];
    let err = net.a.connect(now, p.clone()).unwrap_err();
    assert_eq!(err, CmError::PrivateDataTooLong { len: 93, max: 92 });
    assert_eq!(err.errno(), Errno::EINVAL as i32);
    p.private_data.clear();
    p.local_qpn = 1 << 24;
    assert!(matches!(
        net.a.connect(now, p.clone()),
        Err(CmError::InvalidArgument(_))
    ));
    p.local_qpn = 1;
    p.retry_count = 8;
    assert!(matches!(
        net.a.connect(now, p.clone()),
        Err(CmError::InvalidArgument(_))
    ));
    p.retry_count = 7;
    p.max_cm_retries = 16;
    assert!(matches!(
        net.a.connect(now, p.clone()),
        Err(CmError::InvalidArgument(_))
    ));
    p.max_cm_retries = 15;
    p.cm_response_timeout = 32;
    assert!(matches!(
        net.a.connect(now, p.clone()),
        Err(CmError::InvalidArgument(_))
    ));
    p.cm_response_timeout = 20;

    let a = net.a.connect(now, p.clone()).unwrap();
    let err = net.a.accept(now, a, accept_params(b"")).unwrap_err();
    assert_eq!(err, CmError::InvalidState(ConnState::ReqSent));
    assert_eq!(
        net.a.establish(now, a, b""),
        Err(CmError::InvalidState(ConnState::ReqSent))
    );
    assert_eq!(
        net.a.reject(now, a, b""),
        Err(CmError::InvalidState(ConnState::ReqSent))
    );
    assert_eq!(
        net.a.disconnect(now, a, b""),
        Err(CmError::InvalidState(ConnState::ReqSent))
    );
    assert_eq!(
        net.a.sidr_reply(now, a, SidrStatus::Success, 1, 1, b""),
        Err(CmError::InvalidState(ConnState::ReqSent))
    );
    let gone = ConnId::first();
    net.a.destroy(now, a).unwrap();
    assert_eq!(
        net.a.accept(now, gone, accept_params(b"")),
        Err(CmError::UnknownConn)
    );
    assert_eq!(
        net.a
            .sidr_reply(now, gone, SidrStatus::Success, 1 << 24, 1, b""),
        Err(CmError::InvalidArgument("QPN is 24-bit"))
    );
    assert!(matches!(
        net.a.sidr_request(
            now,
            gid(Side::B),
            1,
            1,
            &[0; 217],
            Duration::from_secs(1),
            1
        ),
        Err(CmError::PrivateDataTooLong { len: 217, max: 216 })
    ));
    assert!(matches!(
        net.a
            .sidr_request(now, gid(Side::B), 1, 1, b"", Duration::from_secs(1), 16),
        Err(CmError::InvalidArgument(_))
    ));

    // A source that only says 0 gives no comm ID.
    let mut stuck = CmAgent::new(gid(Side::A), 1, CmConfig::default(), Box::new(|| 0));
    let err = stuck.connect(now, p).unwrap_err();
    assert_eq!(err, CmError::NoCommId);
    assert_eq!(err.errno(), Errno::ENOMEM as i32);
    assert_eq!(stuck.local_gid(), gid(Side::A));
    assert!(format!("{stuck:?}").contains("CmAgent"));
    assert!(err.to_string().contains("communication ID"));
}

#[test]
fn half_open_cap_and_queue_caps_bound_a_flood() {
    let config = CmConfig {
        max_half_open: 3,
        max_queued_events: 100,
        max_queued_transmits: 5,
        mra_service_timeout: 24,
    };
    let mut agent = CmAgent::new(gid(Side::B), GUID_B, config, xorshift(3));
    agent.listen(SERVICE, 100).unwrap();
    let now = Instant::now();
    let mut template = Net::new();
    template.fate = Box::new(|_, _| Fate::Drop);
    template.connect(1, b"");
    let req = match template.sent(Side::A, MsgKind::Req)[0].clone() {
        CmMessage::Req(r) => r,
        other => panic!("{other:?}"),
    };
    for i in 1..=1000u32 {
        let mut r = req.clone();
        r.local_comm_id = i;
        r.local_qpn = i;
        r.local_ca_guid = u64::from(i);
        agent.handle_message(now, gid(Side::A), CmMessage::Req(r));
    }
    assert_eq!(agent.len(), 3);
    assert_eq!(agent.half_open(), 3);
    assert_eq!(agent.stats().drops.overloaded, 997);
    // Unknown services: REJs, but never more queued than the cap.
    for i in 1..=100u32 {
        let mut r = req.clone();
        r.local_comm_id = i;
        r.service_id = 1;
        agent.handle_message(now, gid(Side::A), CmMessage::Req(r));
    }
    assert_eq!(agent.queued().0, 5);
    assert_eq!(agent.stats().drops.transmit_queue_full, 95);
    assert_eq!(agent.queued().1, 3);
}

mod random_sequences {
    use super::*;
    use proptest::prelude::*;

    use crate::attr::Mtu;
    use crate::soft::cm::msg::{
        CmTransport, Drep, Dreq, Mra, MsgResponse, PathInfo, Rej, Rep, Req, Rtu, SidrRep, SidrReq,
    };

    /// Small ID spaces, so random messages hit live connections.
    fn comm_id() -> std::ops::Range<u32> {
        0..6
    }

    fn msg_response() -> impl Strategy<Value = MsgResponse> {
        prop_oneof![
            Just(MsgResponse::Req),
            Just(MsgResponse::Rep),
            Just(MsgResponse::Other)
        ]
    }

    fn message() -> impl Strategy<Value = CmMessage> {
        let ids = (comm_id(), comm_id(), 0u32..4, any::<u8>(), 0u64..3);
        prop_oneof![
            (ids.clone(), any::<bool>()).prop_map(|((l, _, qpn, t, guid), uc)| {
                CmMessage::Req(Box::new(Req {
                    tid: 1,
                    local_comm_id: l,
                    service_id: SERVICE + u64::from(t % 2),
                    local_ca_guid: guid,
                    local_qkey: 0,
                    local_qpn: qpn,
                    responder_resources: t,
                    initiator_depth: t,
                    remote_cm_response_timeout: t,
                    transport: if uc { CmTransport::Uc } else { CmTransport::Rc },
                    flow_control: uc,
                    starting_psn: 0,
                    local_cm_response_timeout: t,
                    retry_count: t,
                    rnr_retry_count: t,
                    max_cm_retries: t,
                    path_mtu: Mtu::Mtu1024,
                    pkey: 0xffff,
                    srq: uc,
                    primary: PathInfo {
                        local_gid: gid(Side::A),
                        remote_gid: gid(Side::B),
                        flow_label: 0,
                        traffic_class: 0,
                        hop_limit: 64,
                        sl: 0,
                        local_ack_timeout: t,
                    },
                    private_data: CmBytes::empty(),
                }))
            }),
            (ids.clone(), msg_response()).prop_map(|((l, r, _, t, _), m)| {
                CmMessage::Mra(Box::new(Mra {
                    tid: 1,
                    local_comm_id: l,
                    remote_comm_id: r,
                    message_mraed: m,
                    service_timeout: t,
                    private_data: CmBytes::empty(),
                }))
            }),
            (ids.clone(), msg_response(), any::<u16>(), any::<bool>()).prop_map(
                |((l, r, _, _, guid), m, reason, ari)| {
                    CmMessage::Rej(Box::new(Rej {
                        tid: 1,
                        local_comm_id: l,
                        remote_comm_id: r,
                        message_rejected: m,
                        reason: RejReason::from_code(reason % 36),
                        ari: if ari {
                            CmBytes::new(&guid.to_be_bytes()).unwrap()
                        } else {
                            CmBytes::empty()
                        },
                        private_data: CmBytes::empty(),
                    }))
                }
            ),
            ids.clone().prop_map(|(l, r, qpn, t, guid)| {
                CmMessage::Rep(Box::new(Rep {
                    tid: 1,
                    local_comm_id: l,
                    remote_comm_id: r,
                    local_qkey: 0,
                    local_qpn: qpn,
                    starting_psn: 0,
                    responder_resources: t,
                    initiator_depth: t,
                    target_ack_delay: t,
                    failover_accepted: false,
                    flow_control: false,
                    rnr_retry_count: t,
                    srq: false,
                    local_ca_guid: guid,
                    private_data: CmBytes::empty(),
                }))
            }),
            ids.clone().prop_map(|(l, r, _, _, _)| {
                CmMessage::Rtu(Box::new(Rtu {
                    tid: 1,
                    local_comm_id: l,
                    remote_comm_id: r,
                    private_data: CmBytes::empty(),
                }))
            }),
            ids.clone().prop_map(|(l, r, qpn, _, _)| {
                CmMessage::Dreq(Box::new(Dreq {
                    tid: 1,
                    local_comm_id: l,
                    remote_comm_id: r,
                    remote_qpn: qpn,
                    private_data: CmBytes::empty(),
                }))
            }),
            ids.clone().prop_map(|(l, r, _, _, _)| {
                CmMessage::Drep(Box::new(Drep {
                    tid: 1,
                    local_comm_id: l,
                    remote_comm_id: r,
                    private_data: CmBytes::empty(),
                }))
            }),
            ids.clone().prop_map(|(l, _, _, t, _)| {
                CmMessage::SidrReq(Box::new(SidrReq {
                    tid: 1,
                    request_id: l,
                    pkey: 0xffff,
                    service_id: SERVICE + u64::from(t % 2),
                    private_data: CmBytes::empty(),
                }))
            }),
            (ids, any::<u8>()).prop_map(|((l, _, qpn, _, _), status)| {
                CmMessage::SidrRep(Box::new(SidrRep {
                    tid: 1,
                    request_id: l,
                    status: SidrStatus::from_code(status),
                    qpn,
                    service_id: SERVICE,
                    qkey: 0,
                    additional_info: CmBytes::empty(),
                    private_data: CmBytes::empty(),
                }))
            }),
        ]
    }

    #[derive(Debug, Clone)]
    enum Op {
        Receive(CmMessage, bool),
        Advance(u64),
        Connect(u32),
        Sidr,
        Accept(usize),
        Reject(usize),
        Establish(usize),
        Disconnect(usize),
        Destroy(usize),
        SidrReply(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (message(), any::<bool>()).prop_map(|(m, stranger)| Op::Receive(m, stranger)),
            2 => (0u64..100_000).prop_map(Op::Advance),
            1 => (0u32..4).prop_map(Op::Connect),
            1 => Just(Op::Sidr),
            1 => any::<usize>().prop_map(Op::Accept),
            1 => any::<usize>().prop_map(Op::Reject),
            1 => any::<usize>().prop_map(Op::Establish),
            1 => any::<usize>().prop_map(Op::Disconnect),
            1 => any::<usize>().prop_map(Op::Destroy),
            1 => any::<usize>().prop_map(Op::SidrReply),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn never_panics_and_stays_bounded(ops in proptest::collection::vec(op(), 1..120)) {
            let config = CmConfig {
                max_half_open: 4,
                max_queued_events: 8,
                max_queued_transmits: 8,
                mra_service_timeout: 31,
            };
            // IDs from a tiny space (1..=5), so messages find connections.
            let mut n = 0u32;
            let source: RandomSource = Box::new(move || {
                n = n.wrapping_add(1);
                n % 6
            });
            let mut agent = CmAgent::new(gid(Side::B), GUID_B, config, source);
            agent.listen(SERVICE, 2).unwrap();
            let mut now = Instant::now();
            let mut conns: Vec<ConnId> = Vec::new();
            let mut created_by_user = 0usize;
            for op in ops {
                let pick = |i: usize| conns.get(i % conns.len().max(1)).copied();
                match op {
                    Op::Receive(m, stranger) => {
                        let from = if stranger { gid(Side::B) } else { gid(Side::A) };
                        agent.handle_message(now, from, m);
                    }
                    Op::Advance(ms) => {
                        now += Duration::from_millis(ms);
                        agent.handle_timeout(now);
                    }
                    Op::Connect(qpn) => {
                        let p = ConnectParams::rdma_cm_defaults(gid(Side::A), SERVICE, qpn, 0);
                        if let Ok(c) = agent.connect(now, p) {
                            conns.push(c);
                            created_by_user += 1;
                        }
                    }
                    Op::Sidr => {
                        if let Ok(c) = agent.sidr_request(now, gid(Side::A), SERVICE, 1, b"", Duration::from_millis(10), 2) {
                            conns.push(c);
                            created_by_user += 1;
                        }
                    }
                    Op::Accept(i) => if let Some(c) = pick(i) { let _ = agent.accept(now, c, accept_params(b"x")); },
                    Op::Reject(i) => if let Some(c) = pick(i) { let _ = agent.reject(now, c, b"x"); },
                    Op::Establish(i) => if let Some(c) = pick(i) { let _ = agent.establish(now, c, b"x"); },
                    Op::Disconnect(i) => if let Some(c) = pick(i) { let _ = agent.disconnect(now, c, b"x"); },
                    Op::Destroy(i) => if let Some(c) = pick(i) {
                        let _ = agent.destroy(now, c);
                        conns.retain(|x| *x != c);
                    },
                    Op::SidrReply(i) => if let Some(c) = pick(i) { let _ = agent.sidr_reply(now, c, SidrStatus::Success, 1, 1, b""); },
                }
                let (transmits, events) = agent.queued();
                prop_assert!(transmits <= 8);
                prop_assert!(agent.half_open() <= 4);
                // Events beyond the cap come only from connections that
                // exist (a handful each), never from new ones.
                prop_assert!(events <= 8 + 4 * agent.len());
                while agent.poll_transmit().is_some() {}
                while let Some(e) = agent.poll_event() {
                    if let CmEvent::ConnectRequest { conn, .. } | CmEvent::SidrRequest { conn, .. } = e {
                        conns.push(conn);
                    }
                }
                if let Some(t) = agent.poll_timeout() {
                    prop_assert!(t <= now + 17 * (iba_time(31) + 2 * iba_time(31)));
                }
                prop_assert!(agent.len() <= conns.len());
                prop_assert!(created_by_user <= 10_000);
            }
            for c in conns {
                let _ = agent.destroy(now, c);
            }
            prop_assert_eq!(agent.len(), 0);
            prop_assert_eq!(agent.held(), 0);
        }
    }
}
