//! rverbs-wire against an independent implementation: scapy's RoCE layer
//! (Debian's python3-scapy), driven by `tests/scapy_roce.py`.
//!
//! 1. scapy builds packets for every RC, UC and UD opcode with random fields
//!    and payloads over IPv4 and IPv6; we parse each and must describe it
//!    exactly as scapy built it, and compute the same ICRC.
//! 2. We emit packets the same way; scapy must parse each to the fields we
//!    meant and find our ICRC right.
//!
//! Without python3-scapy the test is skipped, unless `CI` is set: then it fails.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::Command;

use rverbs_wire::icrc::{self, Ipv4Header, Ipv6Header, ROCE_V2_PORT};
use rverbs_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Headers, IethRepr, ImmDtRepr,
    Opcode, PacketRepr, Psn, RethRepr, Syndrome,
};

const PYTHON: &str = "/usr/bin/python3";

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/scapy_roce.py")
}

/// Whether scapy is there; without it the test is skipped, or fails under CI.
fn scapy_available() -> bool {
    let ok = Command::new(PYTHON)
        .args(["-c", "import scapy.contrib.roce"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3-scapy is missing (apt-get install python3-scapy); scripts/test installs it"
        );
        eprintln!("skipping: {PYTHON} with scapy not found (apt-get install python3-scapy)");
    }
    ok
}

/// The canonical description `scapy_roce.py` prints.
fn describe(p: &PacketRepr<'_>) -> String {
    let b = &p.bth;
    let mut s = format!(
        "op=0x{:02x} se={} mig={} pad={} pkey=0x{:04x} fecn={} becn={} qp=0x{:06x} ack={} psn={}",
        b.opcode.0,
        u8::from(b.solicited),
        u8::from(b.mig_req),
        b.pad_count,
        b.pkey,
        u8::from(b.fecn),
        u8::from(b.becn),
        b.dest_qp,
        u8::from(b.ack_req),
        b.psn.value()
    );
    if let Some(h) = p.deth {
        write!(s, " deth=qkey:{:#x},srcqp:{:#x}", h.qkey, h.src_qp).unwrap();
    }
    if let Some(h) = p.reth {
        write!(
            s,
            " reth=dlen:{:#x},rkey:{:#x},va:{:#x}",
            h.dma_len, h.rkey, h.va
        )
        .unwrap();
    }
    if let Some(h) = p.atomic_eth {
        write!(
            s,
            " atomic=cmp:{:#x},rkey:{:#x},swap:{:#x},va:{:#x}",
            h.compare, h.rkey, h.swap_add, h.va
        )
        .unwrap();
    }
    if let Some(h) = p.aeth {
        write!(s, " aeth=msn:{:#x},syn:{:#x}", h.msn, h.syndrome.to_raw()).unwrap();
    }
    if let Some(h) = p.atomic_ack_eth {
        write!(s, " atomicack=orig:{:#x}", h.orig).unwrap();
    }
    if let Some(h) = p.imm_dt {
        write!(s, " imm=val:{:#x}", h.0).unwrap();
    }
    if let Some(h) = p.ieth {
        write!(s, " ieth=val:{:#x}", h.0).unwrap();
    }
    let payload: String = p.payload.iter().map(|b| format!("{b:02x}")).collect();
    write!(
        s,
        " payload={}",
        if payload.is_empty() { "-" } else { &payload }
    )
    .unwrap();
    s
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Splits an IP packet into IP header, UDP header and UDP payload.
fn split(pkt: &[u8]) -> (&[u8], &[u8], &[u8]) {
    let ip_len = if pkt[0] >> 4 == 4 {
        usize::from(pkt[0] & 0xf) * 4
    } else {
        40
    };
    (&pkt[..ip_len], &pkt[ip_len..ip_len + 8], &pkt[ip_len + 8..])
}

#[test]
fn we_parse_what_scapy_builds() {
    if !scapy_available() {
        return;
    }
    let count = 760; // 20 of each of the 38 opcodes, half IPv4, half IPv6
    let out = Command::new(PYTHON)
        .arg(script())
        .args(["generate", "20261129", &count.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut seen_v6 = 0;
    let mut opcodes = std::collections::HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let (hex, want) = line.split_once(' ').unwrap();
        let pkt = hex_decode(hex);
        let (ip, udp, roce) = split(&pkt);
        seen_v6 += usize::from(ip[0] >> 4 == 6);
        let p = PacketRepr::parse(roce).unwrap_or_else(|e| panic!("packet {n}: {e}\n{line}"));
        assert_eq!(describe(&p), want, "packet {n}");
        opcodes.insert(p.bth.opcode);
        let (computed, wire) = icrc::check(ip, udp, roce).unwrap();
        assert_eq!(computed, wire, "packet {n}: ICRC");
        // And we emit the same bytes back (pad and reserved bits are zero in both).
        let mut again = vec![0u8; p.buffer_len()];
        p.emit(&mut again).unwrap();
        icrc::fill(ip, udp, &mut again).unwrap();
        assert_eq!(again, roce, "packet {n}: re-emitted");
    }
    assert_eq!(text.lines().count(), count);
    assert_eq!(seen_v6, count / 2);
    let ours: std::collections::HashSet<_> = Opcode::all().filter(|o| *o != Opcode::CNP).collect();
    assert_eq!(opcodes, ours, "every RC, UC and UD opcode");
}

/// A small deterministic generator (xorshift64*), so runs are reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn bits(&mut self, n: u32) -> u64 {
        self.next() >> (64 - n)
    }
    fn flag(&mut self) -> bool {
        self.bits(1) == 1
    }
}

fn random_packet(rng: &mut Rng, op: Opcode, payload: &mut Vec<u8>) -> PacketRepr<'static> {
    let info = op.info().unwrap();
    let h = info.headers;
    payload.clear();
    if info.has_payload {
        let len = [0usize, 1, 2, 3, 5, 64, 333, 1024][rng.bits(3) as usize];
        payload.extend((0..len).map(|_| rng.bits(8) as u8));
    }
    let syndromes: Vec<u8> = (0x00..0x40).chain(0x60..0x65).collect();
    PacketRepr {
        bth: BthRepr {
            opcode: op,
            solicited: rng.flag(),
            mig_req: rng.flag(),
            pad_count: 0,
            tver: 0,
            pkey: rng.bits(16) as u16,
            fecn: rng.flag(),
            becn: rng.flag(),
            dest_qp: rng.bits(24) as u32,
            ack_req: rng.flag(),
            psn: Psn::new(rng.bits(24) as u32),
        },
        deth: h.contains(Headers::DETH).then(|| DethRepr {
            qkey: rng.bits(32) as u32,
            src_qp: rng.bits(24) as u32,
        }),
        reth: h.contains(Headers::RETH).then(|| RethRepr {
            va: rng.next(),
            rkey: rng.bits(32) as u32,
            dma_len: rng.bits(32) as u32,
        }),
        atomic_eth: h.contains(Headers::ATOMIC_ETH).then(|| AtomicEthRepr {
            va: rng.next(),
            rkey: rng.bits(32) as u32,
            swap_add: rng.next(),
            compare: rng.next(),
        }),
        aeth: h.contains(Headers::AETH).then(|| AethRepr {
            syndrome: Syndrome::from_raw(syndromes[rng.bits(6) as usize % syndromes.len()])
                .unwrap(),
            msn: rng.bits(24) as u32,
        }),
        atomic_ack_eth: h
            .contains(Headers::ATOMIC_ACK_ETH)
            .then(|| AtomicAckEthRepr { orig: rng.next() }),
        imm_dt: h
            .contains(Headers::IMM_DT)
            .then(|| ImmDtRepr(rng.bits(32) as u32)),
        ieth: h
            .contains(Headers::IETH)
            .then(|| IethRepr(rng.bits(32) as u32)),
        payload: &[],
    }
}

#[test]
fn scapy_parses_what_we_emit_and_accepts_our_icrc() {
    if !scapy_available() {
        return;
    }
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut lines = String::new();
    let mut payload = Vec::new();
    let ops: Vec<Opcode> = Opcode::all().filter(|o| *o != Opcode::CNP).collect();
    for i in 0..ops.len() * 16 {
        let mut p = random_packet(&mut rng, ops[i % ops.len()], &mut payload);
        p.payload = &payload;
        p.bth.pad_count = p.pad_len() as u8;
        let mut roce = vec![0u8; p.buffer_len()];
        p.emit(&mut roce).unwrap();
        let udp_len = (roce.len() + 8) as u16;
        let udp = icrc::udp_header(rng.bits(16) as u16 | 1024, ROCE_V2_PORT, udp_len);
        let ip: Vec<u8> = if i % 2 == 0 {
            Ipv4Header {
                src: Ipv4Addr::from(rng.bits(32) as u32),
                dst: Ipv4Addr::from(rng.bits(32) as u32),
                id: rng.bits(16) as u16,
                dont_fragment: rng.flag(),
                tos: rng.bits(8) as u8,
                ttl: rng.bits(8) as u8 | 1,
            }
            .to_bytes(udp_len)
            .to_vec()
        } else {
            Ipv6Header {
                src: Ipv6Addr::from(u128::from(rng.next()) << 64 | u128::from(rng.next())),
                dst: Ipv6Addr::from(u128::from(rng.next()) << 64 | u128::from(rng.next())),
                traffic_class: rng.bits(8) as u8,
                flow_label: rng.bits(20) as u32,
                hop_limit: rng.bits(8) as u8 | 1,
            }
            .to_bytes(udp_len)
            .to_vec()
        };
        icrc::fill(&ip, &udp, &mut roce).unwrap();
        let pkt: String = [&ip[..], &udp[..], &roce[..]]
            .concat()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        writeln!(lines, "{pkt} {}", describe(&p)).unwrap();
    }
    let path = std::env::temp_dir().join(format!("rverbs-wire-emit-{}.txt", std::process::id()));
    std::fs::write(&path, &lines).unwrap();
    let out = Command::new(PYTHON)
        .arg(script())
        .arg("check")
        .arg(&path)
        .output()
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        report.contains(&format!("checked {} packets, 0 bad", ops.len() * 16)),
        "{report}"
    );
}
