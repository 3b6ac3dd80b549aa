//! The responder's READ/atomic resources (issue 14): a peer that sends READ
//! and atomic requests, or duplicates of them, faster than it takes the
//! responses must not grow what side B owes it. New READs and atomics hold
//! one of `max_dest_rd_atomic` resources each; one more while the oldest is
//! still being answered is refused (NAK invalid request, QP_REQ_ERR, ERR,
//! counted as `rd_atomic_over_limit`); duplicates are answered from the
//! resources without adding entries; ACKs and NAKs owed coalesce. And our
//! own requester never has more READs and atomics outstanding than its
//! `max_rd_atomic`.

use std::time::Duration;

use rverbs_wire::{AtomicEthRepr, BthRepr, NakCode, Opcode, PacketRepr, Psn, RethRepr, Syndrome};

use super::{
    all_access, config, mixed_traffic_in, register, send_wqe, LinkFaults, Outcome, Sim, QPN,
};
use crate::event::AsyncEventType;
use crate::wc::WcStatus;
use crate::wr::{QpState, WrOpcode};

/// Requests forged in these tests; the side under test keeps 4 resources.
const FLOOD: u32 = 10_000;

/// The first PSN side B expects.
fn rq_psn() -> Psn {
    config(QPN[1], QPN[0]).rq_psn
}

/// A request to side B as a peer would build it: `opcode` at `psn`, with
/// AckReq as given, the headers `fill` sets, and `payload`.
fn request(opcode: Opcode, psn: Psn, ack_req: bool, fill: impl FnOnce(&mut PacketRepr)) -> Vec<u8> {
    let mut p = PacketRepr::new(BthRepr::new(opcode, QPN[1], psn));
    p.bth.ack_req = ack_req;
    fill(&mut p);
    let mut bytes = vec![0u8; p.buffer_len()];
    p.emit(&mut bytes).expect("a well-formed request");
    bytes
}

/// A READ request for `len` bytes at `va`.
fn read_request(psn: Psn, rkey: u32, va: u64, len: u32) -> Vec<u8> {
    request(Opcode::RC_RDMA_READ_REQUEST, psn, true, |p| {
        p.reth = Some(RethRepr {
            va,
            rkey,
            dma_len: len,
        })
    })
}

/// A fetch-and-add of 1 at `va`.
fn fetch_add(psn: Psn, rkey: u32, va: u64) -> Vec<u8> {
    request(Opcode::RC_FETCH_ADD, psn, true, |p| {
        p.atomic_eth = Some(AtomicEthRepr {
            va,
            rkey,
            swap_add: 1,
            compare: 0,
        })
    })
}

/// The NAK code of an ACK packet, if it is a NAK.
fn nak_code(pkt: &[u8]) -> Option<(Psn, NakCode)> {
    let p = PacketRepr::parse(pkt).ok()?;
    match p.aeth?.syndrome {
        Syndrome::Nak(code) if p.bth.opcode == Opcode::RC_ACKNOWLEDGE => Some((p.bth.psn, code)),
        _ => None,
    }
}

#[test]
fn a_read_flood_is_refused_past_max_dest_rd_atomic() {
    // A peer sends 10,000 READs at increasing PSNs and never takes a
    // response: B owes at most its 4 resources' worth, refuses the fifth
    // with NAK invalid request and goes to ERR (as for any invalid request),
    // and the queued responses go with the QP.
    let mut sim = Sim::new(1, LinkFaults::CLEAN);
    let (b_key, b_base) = register(&sim.sides[1].mem, 4096, all_access());
    let max = usize::from(config(QPN[1], QPN[0]).max_dest_rd_atomic);
    for i in 0..FLOOD {
        sim.hand_over(1, &read_request(rq_psn().add(i), b_key, b_base, 64));
        let owed = sim.sides[1].qp.responses_owed();
        assert!(owed <= max, "{owed} responses owed after READ {i}");
    }
    let b = &sim.sides[1];
    assert_eq!(b.qp.state(), QpState::Err);
    assert_eq!(b.events, vec![AsyncEventType::QpReqErr]);
    assert_eq!(b.qp.counters.rd_atomic_over_limit, 1);
    assert_eq!(b.qp.counters.fatal_naks_sent, 1);
    let sent = sim.take_packets(1);
    let naks: Vec<_> = sent.iter().filter_map(|p| nak_code(p)).collect();
    assert_eq!(
        naks,
        vec![(rq_psn().add(4), NakCode::InvalidRequest)],
        "the fifth READ is refused"
    );
    assert_eq!(sent.len(), 1, "nothing is read for a QP in ERR");
}

#[test]
fn a_peer_that_takes_its_responses_may_read_for_ever() {
    // The same 10,000 READs, each answered before the next comes: the
    // oldest resource is recycled each time (as rxe does), nothing is
    // refused.
    let mut sim = Sim::new(1, LinkFaults::CLEAN);
    let (b_key, b_base) = register(&sim.sides[1].mem, 4096, all_access());
    for i in 0..FLOOD {
        sim.hand_over(1, &read_request(rq_psn().add(i), b_key, b_base, 64));
        assert_eq!(sim.take_packets(1).len(), 1, "READ {i} answered");
    }
    let b = &sim.sides[1];
    assert_eq!(b.qp.state(), QpState::Rts);
    assert_eq!(b.qp.counters.rd_atomic_over_limit, 0);
}

#[test]
fn duplicate_atomics_and_reads_add_no_responses() {
    // Two fetch-and-adds and two READs fill B's 4 resources, unanswered;
    // 10,000 duplicates of them (a peer resending without reading) are
    // answered from the resources, each at most once in the queue, and
    // never run again.
    let mut sim = Sim::new(1, LinkFaults::CLEAN);
    let (b_key, b_base) = register(&sim.sides[1].mem, 4096, all_access());
    let max = usize::from(config(QPN[1], QPN[0]).max_dest_rd_atomic);
    let packets = [
        fetch_add(rq_psn(), b_key, b_base),
        fetch_add(rq_psn().add(1), b_key, b_base + 8),
        read_request(rq_psn().add(2), b_key, b_base + 64, 64),
        read_request(rq_psn().add(3), b_key, b_base + 128, 64),
    ];
    for p in &packets {
        sim.hand_over(1, p);
    }
    assert_eq!(sim.sides[1].qp.responses_owed(), 4);
    for i in 0..FLOOD as usize {
        sim.hand_over(1, &packets[i % 4]);
        let owed = sim.sides[1].qp.responses_owed();
        assert!(owed <= max, "{owed} responses owed after duplicate {i}");
    }
    let b = &sim.sides[1];
    assert_eq!(b.qp.state(), QpState::Rts);
    assert_eq!(b.qp.counters.duplicates, u64::from(FLOOD));
    assert_eq!(b.qp.counters.rd_atomic_over_limit, 0);
    let mut counters = [0u8; 16];
    b.mem.read_for_test(b_key, b_base, &mut counters);
    assert_eq!(
        counters,
        [[1, 0, 0, 0, 0, 0, 0, 0]; 2].concat()[..],
        "each ran once"
    );
    assert_eq!(sim.take_packets(1).len(), 4, "one answer each");
}

#[test]
fn acks_and_naks_owed_coalesce() {
    // B has no receive WR. Each round a peer sends a SEND at the expected
    // PSN (RNR NAK), a zero-length RDMA WRITE there (taken: it asks no
    // ACK), a packet ahead (sequence NAK) and a duplicate asking for an
    // ACK. Each report supersedes the ones before it: B owes at most two.
    let mut sim = Sim::new(1, LinkFaults::CLEAN);
    let mut psn = rq_psn();
    for round in 0..FLOOD {
        let send = request(Opcode::RC_SEND_ONLY, psn, true, |p| p.payload = b"pay!");
        sim.hand_over(1, &send);
        let write = request(Opcode::RC_RDMA_WRITE_ONLY, psn, false, |p| {
            p.reth = Some(RethRepr {
                va: 0,
                rkey: 0,
                dma_len: 0,
            })
        });
        sim.hand_over(1, &write);
        let ahead = request(Opcode::RC_RDMA_WRITE_ONLY, psn.add(5), false, |p| {
            p.reth = Some(RethRepr {
                va: 0,
                rkey: 0,
                dma_len: 0,
            })
        });
        sim.hand_over(1, &ahead);
        let dup = request(Opcode::RC_RDMA_WRITE_ONLY, psn, true, |p| {
            p.reth = Some(RethRepr {
                va: 0,
                rkey: 0,
                dma_len: 0,
            })
        });
        sim.hand_over(1, &dup);
        psn = psn.next();
        let owed = sim.sides[1].qp.responses_owed();
        assert!(owed <= 2, "{owed} responses owed after round {round}");
    }
    let b = &sim.sides[1];
    assert_eq!(b.qp.state(), QpState::Rts);
    assert_eq!(b.qp.counters.rnr_naks_sent, u64::from(FLOOD));
}

#[test]
fn our_requester_keeps_at_most_max_rd_atomic_outstanding() {
    // A may have 2 READs/atomics outstanding (B takes 2): of 6 posted, 2
    // go; each answer lets one more go; all complete, B never refuses.
    let mut a = config(QPN[0], QPN[1]);
    a.max_rd_atomic = 2;
    let mut b = config(QPN[1], QPN[0]);
    b.max_dest_rd_atomic = 2;
    let mut sim = Sim::with_configs(1, LinkFaults::CLEAN, a, b);
    let (a_key, a_base) = register(&sim.sides[0].mem, 4096, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, 4096, all_access());
    for i in 0..6u64 {
        let op = if i % 2 == 0 {
            WrOpcode::RdmaRead {
                remote_addr: b_base,
                rkey: b_key,
            }
        } else {
            WrOpcode::AtomicFetchAndAdd {
                remote_addr: b_base + 1024,
                rkey: b_key,
                add: 1,
            }
        };
        let len = if i % 2 == 0 { 2048 } else { 8 };
        sim.sides[0]
            .qp
            .post_send(send_wqe(i, op, a_key, a_base + i * 8, len));
    }
    let mut requests = sim.take_packets(0);
    assert_eq!(requests.len(), 2, "two outstanding at most");
    let mut rounds = 0;
    while !requests.is_empty() {
        rounds += 1;
        assert!(requests.len() <= 2, "{} requests at once", requests.len());
        for p in &requests {
            sim.hand_over(1, p);
        }
        for p in sim.take_packets(1) {
            sim.hand_over(0, &p);
        }
        requests = sim.take_packets(0);
    }
    assert!(rounds >= 3, "{rounds} rounds");
    sim.run(Duration::from_secs(5));
    let statuses: Vec<WcStatus> = sim.sides[0].sends.iter().map(|w| w.status).collect();
    assert_eq!(statuses, vec![WcStatus::Success; 6]);
    assert_eq!(sim.sides[1].qp.counters.rd_atomic_over_limit, 0);
}

#[test]
fn honest_requesters_at_the_responders_limit_are_never_refused() {
    // READs and atomics at exactly B's limit (1 and 1), over a link that
    // loses, duplicates and reorders: resources are recycled, never
    // refused.
    for seed in 0..40 {
        let faults = LinkFaults {
            loss: 0.1,
            duplicate: 0.1,
            reorder: 0.2,
            corrupt: 0.0,
            forge: 0.0,
        };
        let mut a = config(QPN[0], QPN[1]);
        a.max_rd_atomic = 1;
        let mut b = config(QPN[1], QPN[0]);
        b.max_dest_rd_atomic = 1;
        let sim = Sim::with_configs(seed, faults, a, b);
        let (sim, outcome) = mixed_traffic_in(sim, seed, 40);
        assert_eq!(outcome, Outcome::Completed, "seed {seed}");
        assert_eq!(sim.sides[1].qp.counters.rd_atomic_over_limit, 0);
    }
}

#[test]
fn a_duplicated_sequence_nak_spends_one_retry() {
    // A's first SEND is lost: B answers the next two with one NAK sequence
    // error, which the link duplicates. With retry_cnt 1 the copy must not
    // spend a second retry: it names the PSN A already went back to, with
    // no progress since — the same loss, not a new one.
    let mut a = config(QPN[0], QPN[1]);
    a.retry_cnt = 1;
    let mut sim = Sim::with_configs(1, LinkFaults::CLEAN, a, config(QPN[1], QPN[0]));
    super::three_sends_first_lost(&mut sim);
    let nak = sim.take_packets(1);
    assert_eq!(nak.len(), 1, "one NAK for the gap");
    sim.hand_over(0, &nak[0]);
    sim.hand_over(0, &nak[0]);
    assert_eq!(sim.sides[0].qp.counters.seq_naks_received, 2);
    assert_eq!(
        sim.sides[0].qp.state(),
        QpState::Rts,
        "{:?}",
        sim.sides[0].sends
    );
    sim.run(Duration::from_secs(5));
    let statuses: Vec<WcStatus> = sim.sides[0].sends.iter().map(|w| w.status).collect();
    assert_eq!(statuses, vec![WcStatus::Success; 3]);
    assert_eq!(sim.sides[1].recvs.len(), 3);
}

#[test]
fn an_rnr_wait_leaves_no_timer_in_the_past() {
    // Found by the buggy peer: A READs, then SENDs; B answers the READ and
    // has no receive WR for the SEND (RNR NAK, 655 ms). The RNR NAK
    // overtakes the READ response, which then completes the READ: that
    // progress armed the adaptive timer, which may not fire during the RNR
    // wait — and stayed in the past, so the QP's next timer was always
    // due: the engine would spin (the simulator crawled in 1 ns steps).
    let mut b = config(QPN[1], QPN[0]);
    b.min_rnr_timer = rverbs_wire::RnrTimer::new(0);
    let mut sim = Sim::with_configs(1, LinkFaults::CLEAN, config(QPN[0], QPN[1]), b);
    let (a_key, a_base) = register(&sim.sides[0].mem, 4096, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, 4096, all_access());
    let read = WrOpcode::RdmaRead {
        remote_addr: b_base,
        rkey: b_key,
    };
    sim.sides[0]
        .qp
        .post_send(send_wqe(0, read, a_key, a_base, 64));
    sim.sides[0]
        .qp
        .post_send(send_wqe(1, WrOpcode::Send, a_key, a_base + 64, 16));
    for p in sim.take_packets(0) {
        sim.hand_over(1, &p);
    }
    let answers = sim.take_packets(1);
    assert_eq!(answers.len(), 2, "a READ response and an RNR NAK");
    sim.hand_over(0, &answers[1]);
    sim.hand_over(0, &answers[0]);
    assert_eq!(sim.sides[0].sends.len(), 1, "the READ completed");
    for _ in 0..100 {
        sim.now += Duration::from_millis(5);
        let now = sim.now;
        let qp = &mut sim.sides[0].qp;
        if qp.next_timeout().is_some_and(|t| t <= now) {
            qp.handle_timeout(now);
        }
        let next = qp.next_timeout();
        assert!(
            next.is_none_or(|t| t > now),
            "a timer {:?} in the past at {:?}",
            next.map(|t| now - t),
            now - sim.start
        );
    }
}
