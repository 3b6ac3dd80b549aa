//! A READ through a memory window is checked against the window for every
//! response packet, not only the request: a window revoked mid-stream
//! (invalidated here) stops the READ with a remote access error, as rxe
//! rechecks the window per packet — the peer never reads on through a key
//! its owner took back.

use rverbs_wire::{NakCode, Opcode, PacketRepr, Syndrome};

use super::{all_access, register, send_wqe, LinkFaults, Sim, MTU, PD};
use crate::attr::AccessFlags;
use crate::soft::transport::rc::AckPolicy;
use crate::soft::transport::TxBuffer;
use crate::wc::WcStatus;
use crate::wr::{MwBindInfo, MwType, WrOpcode};

/// The next packet side `from` sends, if any.
fn one_packet(sim: &mut Sim, from: usize) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; MTU as usize + 128];
    let side = &mut sim.sides[from];
    let mut tx = TxBuffer {
        bytes: &mut buf,
        refs: None,
    };
    let n = side
        .qp
        .poll_transmit(sim.now, &side.mem, &mut tx, AckPolicy::Now)?;
    Some(buf[..n].to_vec())
}

#[test]
fn a_window_revoked_mid_read_stops_the_read() {
    let mut sim = Sim::new(1, LinkFaults::CLEAN);
    let (a_key, a_base) = register(&sim.sides[0].mem, 16 * 1024, all_access());
    let (b_key, b_base) = register(
        &sim.sides[1].mem,
        16 * 1024,
        all_access() | AccessFlags::MW_BIND,
    );
    // B's type 2 window over its MR, readable, bound to B's QP (0x22).
    let mw = sim.sides[1]
        .mem
        .alloc_mw(9, MwType::Type2, PD)
        .expect("room for a window");
    let info = MwBindInfo::new(b_key, b_base, 8 * 1024, AccessFlags::REMOTE_READ);
    let rkey = sim.sides[1]
        .mem
        .bind_mw(mw.rkey(), mw.rkey().wrapping_add(1), &info, PD, 0x22)
        .expect("bind");
    // A READs 8 KiB (8 packets) through it.
    sim.sides[0].qp.post_send(send_wqe(
        1,
        WrOpcode::RdmaRead {
            remote_addr: b_base,
            rkey,
        },
        a_key,
        a_base,
        8 * 1024,
    ));
    for p in sim.take_packets(0) {
        sim.hand_over(1, &p);
    }
    let first = one_packet(&mut sim, 1).expect("the READ's first response");
    assert_eq!(
        PacketRepr::parse(&first).unwrap().bth.opcode,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST
    );
    sim.hand_over(0, &first);
    // B's owner revokes the window while the READ streams.
    sim.sides[1]
        .mem
        .invalidate(rkey, PD, None)
        .expect("LOCAL_INV of a type 2 window");
    let rest = sim.take_packets(1);
    let opcodes: Vec<_> = rest
        .iter()
        .map(|p| {
            let p = PacketRepr::parse(p).unwrap();
            (p.bth.opcode, p.aeth.map(|a| a.syndrome))
        })
        .collect();
    assert_eq!(
        opcodes,
        [(
            Opcode::RC_ACKNOWLEDGE,
            Some(Syndrome::Nak(NakCode::RemoteAccessError))
        )],
        "after the window was revoked, no more of the READ"
    );
    for p in rest {
        sim.hand_over(0, &p);
    }
    let done: Vec<_> = sim.sides[0]
        .sends
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(done, [(1, WcStatus::RemAccessErr)]);
}
