//! Responses for work never sent (issue 14): a PSN is posted when its WR
//! is, but only one that went on the wire may be acknowledged. An ACK, a
//! NAK, a READ response or an atomic ACK naming a PSN still waiting behind
//! the congestion window (or not yet transmitted at all) comes from a
//! forger or a confused peer: it is ignored, as rxe ignores it, and the
//! work it names is still sent and completes for real.

use std::time::Duration;

use rverbs_wire::{
    AethRepr, AtomicAckEthRepr, BthRepr, Headers, NakCode, Opcode, PacketRepr, Psn, Syndrome,
};

use super::{
    all_access, config, inline_wqe, message, recv_wqe, register, send_wqe, LinkFaults, Sim, QPN,
};
use crate::wc::WcStatus;
use crate::wr::{QpState, WrOpcode};

const ACK: Syndrome = Syndrome::Ack { credits: 31 };

/// The first PSN side A sends.
fn sq_psn() -> Psn {
    config(QPN[0], QPN[1]).sq_psn
}

/// A response to side A as a forger would build it: `opcode` at `psn`, an
/// AETH with `syndrome` if the opcode has one, `payload`, and for an
/// atomic ACK an original value of 0xdead_beef.
fn forged(opcode: Opcode, psn: Psn, syndrome: Syndrome, payload: &[u8]) -> Vec<u8> {
    let mut p = PacketRepr::new(BthRepr::new(opcode, QPN[0], psn));
    let info = opcode.info().expect("a known opcode");
    if info.headers.contains(Headers::AETH) {
        p.aeth = Some(AethRepr { syndrome, msn: 0 });
    }
    if opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE {
        p.atomic_ack_eth = Some(AtomicAckEthRepr { orig: 0xdead_beef });
    }
    p.payload = payload;
    let mut bytes = vec![0u8; p.buffer_len()];
    p.emit(&mut bytes).expect("a well-formed response");
    bytes
}

/// Side A may have `window` packets in flight; it posts `sends` one-packet
/// SENDs (wr_id 0, 1, …; B has a receive WR for each) and transmits what
/// the window lets go. Those packets are returned, not on the link yet.
fn windowed_sends(window: u32, sends: u64) -> (Sim, Vec<Vec<u8>>) {
    let mut a = config(QPN[0], QPN[1]);
    a.max_window = window;
    let mut sim = Sim::with_configs(1, LinkFaults::CLEAN, a, config(QPN[1], QPN[0]));
    let (key, base) = register(&sim.sides[1].mem, 64 * sends as usize, all_access());
    for i in 0..sends {
        sim.sides[1]
            .qp
            .post_recv(recv_wqe(i, key, base + 64 * i, 64));
        sim.sides[0]
            .qp
            .post_send(inline_wqe(i, WrOpcode::Send, &[i as u8; 8]));
    }
    let sent = sim.take_packets(0);
    (sim, sent)
}

/// Puts `packets` side A sent on the (clean) link and runs until quiet.
fn finish(sim: &mut Sim, packets: Vec<Vec<u8>>) {
    for p in packets {
        sim.transmit(0, p);
    }
    sim.run(Duration::from_secs(10));
}

/// Side A's send completions so far.
fn completions(sim: &Sim) -> Vec<(u64, WcStatus)> {
    sim.sides[0]
        .sends
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect()
}

fn all_succeeded(n: u64) -> Vec<(u64, WcStatus)> {
    (0..n).map(|i| (i, WcStatus::Success)).collect()
}

/// A clean simulator in which side A has posted (not yet sent) a READ of
/// `len` bytes of B's memory, which holds `message(seed, len)`, into its
/// own MR at `a_base`: `(sim, a_key, a_base, B's bytes)`.
fn posted_read(seed: usize, len: usize) -> (Sim, u32, u64, Vec<u8>) {
    let mut sim = Sim::new(1, LinkFaults::CLEAN);
    let mr_len = len.max(4096);
    let (a_key, a_base) = register(&sim.sides[0].mem, mr_len, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, mr_len, all_access());
    let real = message(seed, len);
    sim.sides[1].mem.write_for_test(b_key, b_base, &real);
    sim.sides[0].qp.post_send(send_wqe(
        0,
        WrOpcode::RdmaRead {
            remote_addr: b_base,
            rkey: b_key,
        },
        a_key,
        a_base,
        len as u32,
    ));
    (sim, a_key, a_base, real)
}

#[test]
fn an_ack_for_packets_never_sent_is_ignored() {
    // A's window of 8 holds SENDs 8 and 9 back. An ACK for the first PSN
    // not sent, or for the last one posted, acknowledges nothing: taken,
    // it completed SENDs 8 and 9 with SUCCESS and they were never sent.
    let (mut sim, sent) = windowed_sends(8, 10);
    assert_eq!(sent.len(), 8, "the window holds two SENDs back");
    for psn in [sq_psn().add(8), sq_psn().add(9)] {
        sim.hand_over(0, &forged(Opcode::RC_ACKNOWLEDGE, psn, ACK, &[]));
    }
    assert_eq!(completions(&sim), vec![], "completed on a forged ACK");
    assert_eq!(sim.sides[0].qp.state(), QpState::Rts);
    assert_eq!(sim.sides[0].qp.counters.acks_for_unsent, 2);
    finish(&mut sim, sent);
    assert_eq!(completions(&sim), all_succeeded(10));
    assert_eq!(
        sim.sides[1].recvs.len(),
        10,
        "every SEND was sent and arrived"
    );
}

#[test]
fn a_nak_naming_a_psn_never_sent_is_ignored() {
    // A NAK names the PSN the peer expects (or refused): one never sent
    // acknowledges nothing before it, spends no retry, starts no RNR wait,
    // and fails no WR.
    let (mut sim, sent) = windowed_sends(8, 10);
    let naks = [
        (sq_psn().add(9), Syndrome::Nak(NakCode::PsnSequenceError)),
        (
            sq_psn().add(8),
            Syndrome::RnrNak(rverbs_wire::RnrTimer::new(31)),
        ),
        (sq_psn().add(9), Syndrome::Nak(NakCode::RemoteAccessError)),
    ];
    for (psn, syndrome) in naks {
        sim.hand_over(0, &forged(Opcode::RC_ACKNOWLEDGE, psn, syndrome, &[]));
    }
    assert_eq!(completions(&sim), vec![], "completed on a forged NAK");
    assert_eq!(sim.sides[0].qp.state(), QpState::Rts);
    let c = sim.sides[0].qp.counters;
    assert_eq!((c.seq_naks_received, c.rnr_naks_received), (0, 0));
    assert_eq!(c.acks_for_unsent, 3);
    finish(&mut sim, sent);
    assert_eq!(completions(&sim), all_succeeded(10));
    assert_eq!(sim.sides[1].recvs.len(), 10);
}

#[test]
fn a_read_response_for_a_request_never_sent_places_nothing() {
    // A READ is posted and not yet transmitted: a response to it is
    // forged, and its bytes must not land in A's buffer.
    let (mut sim, a_key, a_base, real) = posted_read(5, 1024);
    let fake = [0xee; 1024];
    let response = forged(Opcode::RC_RDMA_READ_RESPONSE_ONLY, sq_psn(), ACK, &fake);
    sim.hand_over(0, &response);
    let mut back = vec![0u8; 1024];
    sim.sides[0].mem.read_for_test(a_key, a_base, &mut back);
    assert!(back.iter().all(|&b| b == 0), "forged READ data placed");
    assert_eq!(completions(&sim), vec![], "completed on a forged response");
    assert_eq!(sim.sides[0].qp.counters.acks_for_unsent, 1);
    finish(&mut sim, Vec::new());
    assert_eq!(completions(&sim), all_succeeded(1));
    sim.sides[0].mem.read_for_test(a_key, a_base, &mut back);
    assert!(back == real, "the READ placed the peer's bytes");
}

#[test]
fn a_read_response_past_the_chunk_asked_for_is_ignored() {
    // A large READ is asked for a chunk at a time (64 packets while the
    // window is 64): a response beyond the chunk was never asked for. Taken
    // as a sign of lost responses, it cut the window and went back.
    const LEN: usize = 256 * 1024;
    let (mut sim, a_key, a_base, real) = posted_read(6, LEN);
    let request = sim.take_packets(0);
    assert_eq!(request.len(), 1, "one READ request, for the first chunk");
    let fake = [0xee; 1024];
    let psn = sq_psn().add(100);
    let response = forged(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, psn, ACK, &fake);
    sim.hand_over(0, &response);
    assert_eq!(sim.sides[0].qp.counters.window_cuts, 0, "went back");
    assert_eq!(sim.sides[0].qp.counters.acks_for_unsent, 1);
    assert_eq!(sim.take_packets(0), Vec::<Vec<u8>>::new(), "asked again");
    finish(&mut sim, request);
    assert_eq!(completions(&sim), all_succeeded(1));
    let mut back = vec![0u8; LEN];
    sim.sides[0].mem.read_for_test(a_key, a_base, &mut back);
    assert!(back == real, "the READ placed the peer's bytes");
}

#[test]
fn a_read_response_out_of_place_in_its_stream_places_nothing() {
    // A READ of 3 packets (MTU 1024) was asked for: its responses must come
    // as FIRST, MIDDLE, LAST. At the PSN expected next, a response with the
    // wrong opcode for that place (MIDDLE or ONLY first, FIRST or LAST in
    // the middle, MIDDLE last), or a right one whose AETH is a NAK, is
    // dropped and counted; before, any READ response opcode was placed.
    let (mut sim, a_key, a_base, real) = posted_read(7, 3072);
    let request = sim.take_packets(0);
    assert_eq!(request.len(), 1, "one READ request");
    let fake = [0xee; 1024];
    let nak = Syndrome::Nak(NakCode::RemoteAccessError);
    let wrong = [
        (0, Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, ACK),
        (0, Opcode::RC_RDMA_READ_RESPONSE_ONLY, ACK),
        (0, Opcode::RC_RDMA_READ_RESPONSE_LAST, ACK),
        (0, Opcode::RC_RDMA_READ_RESPONSE_FIRST, nak),
    ];
    let mut dropped = 0;
    for (k, opcode, syndrome) in wrong {
        sim.hand_over(0, &forged(opcode, sq_psn().add(k), syndrome, &fake));
        dropped += 1;
    }
    // The real FIRST, then wrong ones for the middle packet.
    sim.hand_over(
        0,
        &forged(
            Opcode::RC_RDMA_READ_RESPONSE_FIRST,
            sq_psn(),
            ACK,
            &real[..1024],
        ),
    );
    for opcode in [
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
        Opcode::RC_RDMA_READ_RESPONSE_ONLY,
    ] {
        sim.hand_over(0, &forged(opcode, sq_psn().add(1), ACK, &fake));
        dropped += 1;
    }
    let mut back = vec![0u8; 3072];
    sim.sides[0].mem.read_for_test(a_key, a_base, &mut back);
    assert_eq!(&back[..1024], &real[..1024], "the real FIRST was placed");
    assert!(
        back[1024..].iter().all(|&b| b == 0),
        "a response out of place was placed"
    );
    assert_eq!(completions(&sim), vec![]);
    assert_eq!(sim.sides[0].qp.state(), QpState::Rts);
    assert_eq!(
        sim.sides[0].qp.counters.read_responses_out_of_place,
        dropped
    );
    // The peer's real answer completes it.
    finish(&mut sim, request);
    assert_eq!(completions(&sim), all_succeeded(1));
    sim.sides[0].mem.read_for_test(a_key, a_base, &mut back);
    assert!(back == real, "the READ placed the peer's bytes");
}

#[test]
fn a_read_asked_again_takes_rxe_style_replies_from_the_middle() {
    // A READ of 3 packets loses its middle response: the requester asks
    // again for the rest (packets 1 and 2). To Linux rxe that request is a
    // duplicate, answered from its saved resource as the middle of the
    // original stream — MIDDLE, LAST — not FIRST, LAST as a new READ.
    let (mut sim, a_key, a_base, real) = posted_read(8, 3072);
    assert_eq!(sim.take_packets(0).len(), 1, "one READ request");
    let response = |opcode, k: u32| {
        forged(
            opcode,
            sq_psn().add(k),
            ACK,
            &real[k as usize * 1024..][..1024],
        )
    };
    sim.hand_over(0, &response(Opcode::RC_RDMA_READ_RESPONSE_FIRST, 0));
    // Packet 1 lost: LAST shows the gap, and the requester asks again.
    sim.hand_over(0, &response(Opcode::RC_RDMA_READ_RESPONSE_LAST, 2));
    let again = sim.take_packets(0);
    assert_eq!(again.len(), 1, "asked again for the rest");
    sim.hand_over(0, &response(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 1));
    sim.hand_over(0, &response(Opcode::RC_RDMA_READ_RESPONSE_LAST, 2));
    assert_eq!(sim.sides[0].qp.counters.read_responses_out_of_place, 0);
    assert_eq!(completions(&sim), all_succeeded(1));
    let mut back = vec![0u8; 3072];
    sim.sides[0].mem.read_for_test(a_key, a_base, &mut back);
    assert!(back == real, "the READ placed the peer's bytes");
}

#[test]
fn an_atomic_ack_for_a_request_never_sent_places_nothing() {
    let mut sim = Sim::new(1, LinkFaults::CLEAN);
    let (a_key, a_base) = register(&sim.sides[0].mem, 64, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, 64, all_access());
    sim.sides[1]
        .mem
        .write_for_test(b_key, b_base, &41u64.to_ne_bytes());
    sim.sides[0].qp.post_send(send_wqe(
        0,
        WrOpcode::AtomicFetchAndAdd {
            remote_addr: b_base,
            rkey: b_key,
            add: 1,
        },
        a_key,
        a_base,
        8,
    ));
    sim.hand_over(
        0,
        &forged(Opcode::RC_ATOMIC_ACKNOWLEDGE, sq_psn(), ACK, &[]),
    );
    let mut orig = [0u8; 8];
    sim.sides[0].mem.read_for_test(a_key, a_base, &mut orig);
    assert_eq!(u64::from_ne_bytes(orig), 0, "forged original value placed");
    assert_eq!(
        completions(&sim),
        vec![],
        "completed on a forged atomic ACK"
    );
    assert_eq!(sim.sides[0].qp.counters.acks_for_unsent, 1);
    finish(&mut sim, Vec::new());
    assert_eq!(completions(&sim), all_succeeded(1));
    sim.sides[0].mem.read_for_test(a_key, a_base, &mut orig);
    assert_eq!(u64::from_ne_bytes(orig), 41);
    sim.sides[1].mem.read_for_test(b_key, b_base, &mut orig);
    assert_eq!(u64::from_ne_bytes(orig), 42, "the fetch-and-add ran once");
}

#[test]
fn old_and_duplicate_acks_change_nothing() {
    // SENDs 0–7 are acknowledged for real; ACKs at or before them again
    // (a duplicate, an older one) complete nothing more, whatever is
    // still unsent.
    let (mut sim, sent) = windowed_sends(8, 10);
    for p in &sent {
        sim.hand_over(1, p);
    }
    for ack in sim.take_packets(1) {
        sim.hand_over(0, &ack);
    }
    assert_eq!(completions(&sim), all_succeeded(8));
    for psn in [sq_psn().add(7), sq_psn().add(3), sq_psn().sub(1)] {
        sim.hand_over(0, &forged(Opcode::RC_ACKNOWLEDGE, psn, ACK, &[]));
    }
    assert_eq!(completions(&sim), all_succeeded(8));
    assert_eq!(sim.sides[0].qp.state(), QpState::Rts);
    // Old responses are the usual duplicates, not forgeries.
    assert_eq!(sim.sides[0].qp.counters.acks_for_unsent, 0);
    let rest = sim.take_packets(0);
    assert_eq!(rest.len(), 2, "SENDs 8 and 9 still go");
    finish(&mut sim, rest);
    assert_eq!(completions(&sim), all_succeeded(10));
    assert_eq!(sim.sides[1].recvs.len(), 10);
}

#[test]
fn after_a_go_back_an_ack_for_packets_sent_before_still_counts() {
    // A times out and goes back to its first PSN: packets up to the highest
    // sent were on the wire once, and the peer's (late) ACK for them is
    // real. It completes them though they have not been sent again.
    let (mut sim, sent) = windowed_sends(8, 10);
    for p in &sent {
        sim.hand_over(1, p);
    }
    let acks = sim.take_packets(1);
    sim.now += Duration::from_secs(1);
    let now = sim.now;
    sim.sides[0].qp.handle_timeout(now);
    assert!(sim.sides[0].qp.counters.timeouts >= 1, "went back");
    for ack in &acks {
        sim.hand_over(0, ack);
    }
    assert_eq!(completions(&sim), all_succeeded(8));
    assert_eq!(sim.sides[0].qp.counters.acks_for_unsent, 0);
    finish(&mut sim, Vec::new());
    assert_eq!(completions(&sim), all_succeeded(10));
    assert_eq!(sim.sides[1].recvs.len(), 10);
}
