//! Property tests: emitting then parsing gives back what was emitted, and
//! no byte string makes a parser panic.

use proptest::prelude::*;
use rverbs_wire::icrc;
use rverbs_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Grh, GrhRepr, Headers, IethRepr,
    ImmDtRepr, Opcode, PacketRepr, Psn, RethRepr, Syndrome,
};

fn syndrome() -> impl Strategy<Value = Syndrome> {
    prop_oneof![0u8..0x40, 0x60u8..0x65].prop_map(|raw| Syndrome::from_raw(raw).unwrap())
}

/// Header values for any opcode; `packet()` keeps those the opcode uses.
#[derive(Debug, Clone)]
struct Fields {
    bth: BthRepr,
    deth: DethRepr,
    reth: RethRepr,
    atomic: AtomicEthRepr,
    aeth: AethRepr,
    ack: AtomicAckEthRepr,
    imm: u32,
    ieth: u32,
}

fn fields() -> impl Strategy<Value = Fields> {
    let ops: Vec<Opcode> = Opcode::all().collect();
    (
        (
            proptest::sample::select(ops),
            any::<[bool; 6]>(),
            any::<u16>(),
            0u32..1 << 24,
            0u32..1 << 24,
        ),
        (
            any::<u32>(),
            0u32..1 << 24,
            any::<(u64, u32, u32)>(),
            any::<(u64, u32, u64, u64)>(),
        ),
        (
            syndrome(),
            0u32..1 << 24,
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
        ),
    )
        .prop_map(
            |(
                (opcode, f, pkey, qp, psn),
                (qkey, src_qp, reth, at),
                (syn, msn, orig, imm, ieth),
            )| Fields {
                bth: BthRepr {
                    opcode,
                    solicited: f[0],
                    mig_req: f[1],
                    pad_count: 0,
                    tver: 0,
                    pkey,
                    fecn: f[2],
                    becn: f[3],
                    dest_qp: qp,
                    ack_req: f[4],
                    psn: Psn::new(psn),
                },
                deth: DethRepr { qkey, src_qp },
                reth: RethRepr {
                    va: reth.0,
                    rkey: reth.1,
                    dma_len: reth.2,
                },
                atomic: AtomicEthRepr {
                    va: at.0,
                    rkey: at.1,
                    swap_add: at.2,
                    compare: at.3,
                },
                aeth: AethRepr { syndrome: syn, msn },
                ack: AtomicAckEthRepr { orig },
                imm,
                ieth,
            },
        )
}

fn packet<'a>(f: &Fields, payload: &'a [u8]) -> PacketRepr<'a> {
    let info = f.bth.opcode.info().unwrap();
    let h = info.headers;
    let payload = if info.has_payload { payload } else { &[] };
    let mut p = PacketRepr {
        bth: f.bth,
        deth: h.contains(Headers::DETH).then_some(f.deth),
        reth: h.contains(Headers::RETH).then_some(f.reth),
        atomic_eth: h.contains(Headers::ATOMIC_ETH).then_some(f.atomic),
        aeth: h.contains(Headers::AETH).then_some(f.aeth),
        atomic_ack_eth: h.contains(Headers::ATOMIC_ACK_ETH).then_some(f.ack),
        imm_dt: h.contains(Headers::IMM_DT).then_some(ImmDtRepr(f.imm)),
        ieth: h.contains(Headers::IETH).then_some(IethRepr(f.ieth)),
        payload,
    };
    p.bth.pad_count = p.pad_len() as u8;
    p
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn parse_of_emit_is_identity(f in fields(), payload in proptest::collection::vec(any::<u8>(), 0..600)) {
        let p = packet(&f, &payload);
        let mut buf = vec![0u8; p.buffer_len()];
        prop_assert_eq!(p.emit(&mut buf).unwrap(), buf.len());
        prop_assert_eq!(PacketRepr::parse(&buf).unwrap(), p);
    }

    #[test]
    fn parsing_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(p) = PacketRepr::parse(&bytes) {
            // What parses re-emits to a packet that parses the same.
            let mut buf = vec![0u8; p.buffer_len()];
            p.emit(&mut buf).unwrap();
            prop_assert_eq!(buf.len(), bytes.len());
            prop_assert_eq!(PacketRepr::parse(&buf).unwrap(), p);
        }
    }

    #[test]
    fn parsing_plausible_garbage_never_panics(
        op in proptest::sample::select(Opcode::all().collect::<Vec<_>>()),
        flags in 0u8..0x10,
        words in 3usize..40,
        fill in any::<u64>(),
    ) {
        // A known opcode, TVer 0 and an aligned length get past the first
        // checks, so the header and pad logic sees random contents.
        let mut bytes: Vec<u8> = (0..words * 4 + 4).map(|i| (fill >> (i % 8 * 8)) as u8 ^ i as u8).collect();
        bytes[0] = op.0;
        bytes[1] = flags << 4;
        if let Ok(p) = PacketRepr::parse(&bytes) {
            prop_assert_eq!(p.header_len() + p.payload.len() + usize::from(p.bth.pad_count) + 4, bytes.len());
        }
    }

    #[test]
    fn parsing_mutated_packets_never_panics(
        f in fields(),
        payload in proptest::collection::vec(any::<u8>(), 0..64),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let p = packet(&f, &payload);
        let mut buf = vec![0u8; p.buffer_len()];
        p.emit(&mut buf).unwrap();
        for (i, x) in flips {
            let at = i.index(buf.len());
            buf[at] ^= x;
        }
        let _ = PacketRepr::parse(&buf);
        let _ = PacketRepr::parse(&buf[..cut.index(buf.len() + 1)]);
    }

    #[test]
    fn icrc_of_arbitrary_headers_never_panics(
        ip in proptest::collection::vec(any::<u8>(), 0..80),
        udp in proptest::collection::vec(any::<u8>(), 0..12),
        roce in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let _ = icrc::compute(&ip, &udp, &roce);
        let _ = icrc::check(&ip, &udp, &roce);
    }

    #[test]
    fn grh_round_trip(tclass in any::<u8>(), flow in 0u32..1 << 20, len in any::<u16>(), nh in any::<u8>(),
                      hop in any::<u8>(), sgid in any::<[u8; 16]>(), dgid in any::<[u8; 16]>()) {
        let r = GrhRepr { tclass, flow_label: flow, payload_len: len, next_header: nh, hop_limit: hop, sgid, dgid };
        let mut buf = [0u8; 40];
        r.emit(&mut Grh::new_unchecked(&mut buf[..]));
        prop_assert_eq!(GrhRepr::parse(&Grh::new_checked(&buf[..]).unwrap()).unwrap(), r);
    }
}
