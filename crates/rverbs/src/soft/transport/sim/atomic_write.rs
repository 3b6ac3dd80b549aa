//! ATOMIC WRITE (IBTA 1.5, as Linux rxe implements it since 6.2): one
//! packet, BTH + RETH + the 8 bytes, stored at once and answered with an
//! ACK; it completes as ATOMIC_WRITE. Under loss and duplication each value
//! lands once (a duplicate is acknowledged again, never stored again) and
//! completes once; the refusals are rxe's; it holds a READ/atomic credit
//! and a fence waits for it; and a requester also takes the zero-length
//! READ RESPONSE ONLY with which rxe's responder answers one.

use std::time::Duration;

use rverbs_wire::{AethRepr, BthRepr, NakCode, Opcode, PacketRepr, Psn, RethRepr, Syndrome};

use super::{all_access, config, register, send_wqe, LinkFaults, Sim, QPN};
use crate::attr::AccessFlags;
use crate::event::AsyncEventType;
use crate::soft::transport::{InlineData, SendWqe, WqeData};
use crate::wc::{WcOpcode, WcStatus};
use crate::wr::{QpState, WrOpcode};

/// A signaled ATOMIC WRITE of `value` at `remote_addr`, as the verbs layer
/// makes it: the value travels as the WQE's 8 bytes of data.
fn atomic_write(wr_id: u64, remote_addr: u64, rkey: u32, value: [u8; 8]) -> SendWqe {
    SendWqe {
        wr_id,
        op: WrOpcode::AtomicWrite {
            remote_addr,
            rkey,
            value,
        },
        data: WqeData::Inline(InlineData::from_slice(&value)),
        length: 8,
        signaled: true,
        solicited: false,
        fence: false,
    }
}

/// Runs 40 (ATOMIC WRITE of i·100, FETCH-AND-ADD of 1) pairs on one word
/// of B under `faults` and checks that every value landed exactly once, in
/// order, and every WR completed exactly once: a stored value executed
/// again after the add would show in the add's original value or the end.
fn writes_then_adds(seed: u64, faults: LinkFaults) -> Sim {
    let mut sim = Sim::new(seed, faults);
    let (a_key, a_base) = register(&sim.sides[0].mem, 4096, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, 4096, all_access());
    let word = b_base + 64;
    for i in 0..40u64 {
        let value = (i * 100).to_ne_bytes();
        sim.sides[0]
            .qp
            .post_send(atomic_write(2 * i, word, b_key, value));
        sim.sides[0].qp.post_send(send_wqe(
            2 * i + 1,
            WrOpcode::AtomicFetchAndAdd {
                remote_addr: word,
                rkey: b_key,
                add: 1,
            },
            a_key,
            a_base + i * 8,
            8,
        ));
    }
    sim.run(Duration::from_secs(120));
    let got: Vec<(u64, WcStatus, WcOpcode)> = sim.sides[0]
        .sends
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode))
        .collect();
    let want: Vec<(u64, WcStatus, WcOpcode)> = (0..80u64)
        .map(|id| {
            let op = if id % 2 == 0 {
                WcOpcode::AtomicWrite
            } else {
                WcOpcode::FetchAdd
            };
            (id, WcStatus::Success, op)
        })
        .collect();
    assert_eq!(got, want, "seed {seed}: each WR completed once, in order");
    for i in 0..40u64 {
        let mut orig = [0u8; 8];
        sim.sides[0]
            .mem
            .read_for_test(a_key, a_base + i * 8, &mut orig);
        assert_eq!(
            u64::from_ne_bytes(orig),
            i * 100,
            "seed {seed}: the add after write {i} saw its value"
        );
    }
    let mut v = [0u8; 8];
    sim.sides[1].mem.read_for_test(b_key, word, &mut v);
    assert_eq!(u64::from_ne_bytes(v), 39 * 100 + 1, "seed {seed}");
    assert!(sim.sides[1].recvs.is_empty(), "one-sided");
    assert_eq!(sim.sides[0].qp.state(), QpState::Rts);
    assert_eq!(sim.sides[1].qp.state(), QpState::Rts);
    sim
}

#[test]
fn atomic_writes_land_and_complete_once_on_a_clean_link() {
    let sim = writes_then_adds(1, LinkFaults::CLEAN);
    // One request packet each, and only ATOMIC WRITE opcodes for them.
    let writes = sim.tx_opcodes[0]
        .iter()
        .filter(|&&op| op == Opcode::RC_ATOMIC_WRITE.0)
        .count();
    assert_eq!(writes, 40);
}

#[test]
fn atomic_writes_land_once_under_loss_duplication_and_reordering() {
    let faults = LinkFaults {
        loss: 0.15,
        duplicate: 0.3,
        reorder: 0.3,
        corrupt: 0.02,
        forge: 0.0,
    };
    let mut duplicates = 0;
    for seed in 0..8 {
        let sim = writes_then_adds(100 + seed, faults);
        duplicates += sim.sides[1].qp.counters.duplicates;
    }
    assert!(duplicates > 0, "duplicates reached the responder");
}

/// What side A's ATOMIC WRITE at `remote_addr` through `rkey` ends in, with
/// B's MR allowing `mr_access` and B's QP `qp_access`, and B keeping
/// `max_dest_rd_atomic` resources; B's word must stay untouched.
fn refused(
    remote_addr_offset: u64,
    bad_rkey: bool,
    mr_access: AccessFlags,
    qp_access: AccessFlags,
    max_dest_rd_atomic: u8,
) -> (WcStatus, Vec<AsyncEventType>) {
    let mut b_cfg = config(QPN[1], QPN[0]);
    b_cfg.access = qp_access;
    b_cfg.max_dest_rd_atomic = max_dest_rd_atomic;
    let mut sim = Sim::with_configs(7, LinkFaults::CLEAN, config(QPN[0], QPN[1]), b_cfg);
    let (b_key, b_base) = register(&sim.sides[1].mem, 4096, mr_access);
    let rkey = if bad_rkey { b_key ^ 0x5a } else { b_key };
    sim.sides[0].qp.post_send(atomic_write(
        1,
        b_base + remote_addr_offset,
        rkey,
        [0xee; 8],
    ));
    sim.run(Duration::from_secs(5));
    let mut mem = vec![1u8; 4096];
    sim.sides[1].mem.read_for_test(b_key, b_base, &mut mem);
    assert!(mem.iter().all(|&b| b == 0), "B's memory untouched");
    assert_eq!(sim.sides[0].sends.len(), 1);
    assert_eq!(sim.sides[0].sends[0].wr_id, 1);
    assert_eq!(sim.sides[0].qp.state(), QpState::Err);
    assert_eq!(sim.sides[1].qp.state(), QpState::Err);
    (sim.sides[0].sends[0].status, sim.sides[1].events.clone())
}

#[test]
fn atomic_write_refusals_are_rxes() {
    let qp_all = config(0, 0).access;
    let write_only = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    // A misaligned address: rxe's "misaligned atomic", class C, NAK
    // invalid request.
    assert_eq!(
        refused(4, false, write_only, qp_all, 4),
        (WcStatus::RemInvReqErr, vec![AsyncEventType::QpReqErr])
    );
    // The MR allows atomics and reads but not REMOTE_WRITE, which rxe's
    // rkey check asks for: remote access error.
    let no_write = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC | AccessFlags::REMOTE_READ;
    assert_eq!(
        refused(0, false, no_write, qp_all, 4),
        (WcStatus::RemAccessErr, vec![AsyncEventType::QpAccessErr])
    );
    // A bad rkey, or a word past the MR's end: remote access error.
    assert_eq!(
        refused(0, true, write_only, qp_all, 4),
        (WcStatus::RemAccessErr, vec![AsyncEventType::QpAccessErr])
    );
    assert_eq!(
        refused(4096, false, write_only, qp_all, 4),
        (WcStatus::RemAccessErr, vec![AsyncEventType::QpAccessErr])
    );
    // The QP's access flags lack REMOTE_WRITE: rxe refuses the opcode
    // (invalid request), as for an RDMA WRITE.
    assert_eq!(
        refused(
            0,
            false,
            write_only,
            AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
            4
        ),
        (WcStatus::RemInvReqErr, vec![AsyncEventType::QpReqErr])
    );
    // A responder with no READ/atomic resources takes none (rxe: "too many
    // RDMA/atomic requests").
    assert_eq!(
        refused(0, false, write_only, qp_all, 0),
        (WcStatus::RemInvReqErr, vec![AsyncEventType::QpReqErr])
    );
}

/// An ATOMIC WRITE request to side B at B's first PSN, as a peer builds it.
fn request(rkey: u32, va: u64, dma_len: u32, payload: &[u8]) -> Vec<u8> {
    let mut p = PacketRepr::new(BthRepr::new(
        Opcode::RC_ATOMIC_WRITE,
        QPN[1],
        config(QPN[1], QPN[0]).rq_psn,
    ));
    p.bth.ack_req = true;
    p.reth = Some(RethRepr { va, rkey, dma_len });
    p.payload = payload;
    let mut bytes = vec![0u8; p.buffer_len()];
    p.emit(&mut bytes).expect("a well-formed packet");
    bytes
}

/// The only response B owes, parsed: its opcode, PSN and AETH syndrome.
fn only_response(sim: &mut Sim) -> (Opcode, Psn, Syndrome) {
    let out = sim.take_packets(1);
    assert_eq!(out.len(), 1, "one response");
    let p = PacketRepr::parse(&out[0]).unwrap();
    (p.bth.opcode, p.bth.psn, p.aeth.unwrap().syndrome)
}

#[test]
fn an_atomic_write_of_other_than_8_bytes_is_an_invalid_request() {
    let psn = config(QPN[1], QPN[0]).rq_psn;
    for (dma_len, payload) in [(16u32, &[7u8; 16][..]), (8, &[7; 4]), (4, &[7; 4])] {
        let mut sim = Sim::new(3, LinkFaults::CLEAN);
        let (b_key, b_base) = register(&sim.sides[1].mem, 4096, all_access());
        sim.hand_over(1, &request(b_key, b_base, dma_len, payload));
        assert_eq!(
            only_response(&mut sim),
            (
                Opcode::RC_ACKNOWLEDGE,
                psn,
                Syndrome::Nak(NakCode::InvalidRequest)
            ),
            "RETH length {dma_len}, {} bytes",
            payload.len()
        );
        let mut v = [1u8; 16];
        sim.sides[1].mem.read_for_test(b_key, b_base, &mut v);
        assert_eq!(v, [0; 16], "nothing stored");
        assert_eq!(sim.sides[1].events, vec![AsyncEventType::QpReqErr]);
    }
    // The same with a bad rkey: the key is checked first (a remote access
    // error), as rxe checks the rkey before the length.
    let mut sim = Sim::new(3, LinkFaults::CLEAN);
    let (b_key, b_base) = register(&sim.sides[1].mem, 4096, all_access());
    sim.hand_over(1, &request(b_key ^ 1, b_base, 16, &[7; 16]));
    assert_eq!(
        only_response(&mut sim).2,
        Syndrome::Nak(NakCode::RemoteAccessError)
    );
}

#[test]
fn a_duplicate_atomic_write_is_acknowledged_again_and_not_stored_again() {
    let psn = config(QPN[1], QPN[0]).rq_psn;
    let mut sim = Sim::new(4, LinkFaults::CLEAN);
    let (b_key, b_base) = register(&sim.sides[1].mem, 4096, all_access());
    let first = request(b_key, b_base + 8, 8, &5u64.to_ne_bytes());
    sim.hand_over(1, &first);
    assert_eq!(
        only_response(&mut sim),
        (Opcode::RC_ACKNOWLEDGE, psn, Syndrome::Ack { credits: 31 })
    );
    // The word changes behind the device's back; the duplicate must not
    // undo that.
    sim.sides[1]
        .mem
        .write_for_test(b_key, b_base + 8, &6u64.to_ne_bytes());
    sim.hand_over(1, &first);
    assert_eq!(
        only_response(&mut sim),
        (Opcode::RC_ACKNOWLEDGE, psn, Syndrome::Ack { credits: 31 })
    );
    let mut v = [0u8; 8];
    sim.sides[1].mem.read_for_test(b_key, b_base + 8, &mut v);
    assert_eq!(u64::from_ne_bytes(v), 6, "not stored again");
    assert_eq!(sim.sides[1].qp.counters.duplicates, 1);
}

#[test]
fn an_atomic_write_takes_a_credit_and_a_fence_waits_for_it() {
    // max_rd_atomic 1: the second ATOMIC WRITE waits for the first's ACK.
    let mut a_cfg = config(QPN[0], QPN[1]);
    a_cfg.max_rd_atomic = 1;
    let mut sim = Sim::with_configs(5, LinkFaults::CLEAN, a_cfg, config(QPN[1], QPN[0]));
    let (b_key, b_base) = register(&sim.sides[1].mem, 4096, all_access());
    sim.sides[0]
        .qp
        .post_send(atomic_write(1, b_base, b_key, [1; 8]));
    sim.sides[0]
        .qp
        .post_send(atomic_write(2, b_base + 8, b_key, [2; 8]));
    let out = sim.take_packets(0);
    assert_eq!(out.len(), 1, "one ATOMIC WRITE outstanding at a time");
    sim.hand_over(1, &out[0]);
    for ack in sim.take_packets(1) {
        sim.hand_over(0, &ack);
    }
    assert_eq!(sim.sides[0].sends.len(), 1);
    assert_eq!(
        sim.take_packets(0).len(),
        1,
        "the second goes once the first is done"
    );

    // A fenced SEND waits for an ATOMIC WRITE before it.
    let mut sim = Sim::new(6, LinkFaults::CLEAN);
    let (a_key, a_base) = register(&sim.sides[0].mem, 4096, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, 4096, all_access());
    sim.sides[1]
        .qp
        .post_recv(super::recv_wqe(9, b_key, b_base + 1024, 64));
    sim.sides[0]
        .qp
        .post_send(atomic_write(1, b_base, b_key, [1; 8]));
    let mut fenced = send_wqe(2, WrOpcode::Send, a_key, a_base, 16);
    fenced.fence = true;
    sim.sides[0].qp.post_send(fenced);
    let out = sim.take_packets(0);
    assert_eq!(out.len(), 1, "the fenced SEND waits");
    assert_eq!(out[0][0], Opcode::RC_ATOMIC_WRITE.0);
    sim.run(Duration::from_secs(5));
    let ids: Vec<(u64, WcStatus)> = sim.sides[0]
        .sends
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(ids, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
}

#[test]
fn a_zero_length_read_response_only_completes_an_atomic_write_as_rxe_answers_it() {
    // rxe's responder answers ATOMIC WRITE with an RDMA READ RESPONSE ONLY
    // of no payload; the requester takes that as its ACK.
    let mut a_cfg = config(QPN[0], QPN[1]);
    a_cfg.max_rd_atomic = 1;
    let mut sim = Sim::with_configs(8, LinkFaults::CLEAN, a_cfg, config(QPN[1], QPN[0]));
    let (b_key, b_base) = register(&sim.sides[1].mem, 4096, all_access());
    sim.sides[0]
        .qp
        .post_send(atomic_write(1, b_base, b_key, [3; 8]));
    sim.sides[0]
        .qp
        .post_send(atomic_write(2, b_base + 8, b_key, [4; 8]));
    let out = sim.take_packets(0);
    assert_eq!(out.len(), 1);
    let psn = PacketRepr::parse(&out[0]).unwrap().bth.psn;
    let mut p = PacketRepr::new(BthRepr::new(
        Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        QPN[0],
        psn,
    ));
    p.aeth = Some(AethRepr {
        syndrome: Syndrome::Ack { credits: 31 },
        msn: 1,
    });
    let mut bytes = vec![0u8; p.buffer_len()];
    p.emit(&mut bytes).unwrap();
    sim.hand_over(0, &bytes);
    let got: Vec<(u64, WcStatus, WcOpcode)> = sim.sides[0]
        .sends
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode))
        .collect();
    assert_eq!(got, vec![(1, WcStatus::Success, WcOpcode::AtomicWrite)]);
    // Its credit came back: the second goes.
    assert_eq!(sim.take_packets(0).len(), 1);
}
