//! A buggy peer (issue 14): besides what the link does to packets (loss,
//! duplication, reordering, bit flips), a sender with a `forge` chance
//! also sends well-formed but wrong packets — a valid ICRC, parsing fine —
//! made from the one it sends: PSNs moved inside or far outside the window,
//! other contents or lengths under the same PSN, opcodes out of sequence
//! (a middle without a first, a READ response of the wrong position), wrong
//! rkeys, RETH lengths that do not match the payload, changed atomic
//! operands and results, ACKs and NAKs with lying MSNs and syndromes.
//!
//! Some lies no receiver can catch: a request with other contents at
//! exactly the PSN the responder takes next, or a READ response or atomic
//! ACK at exactly the PSN the requester places next, is indistinguishable
//! from the genuine packet. Those are withheld at delivery (counted in
//! `Sim::lies_withheld`); every other wrong packet arrives. (An ACK lying
//! about PSNs in the window is delivered: it can complete a SEND or WRITE
//! the peer never got — no RC endpoint can tell — but it places no data.)
//!
//! The property, checked by [`mixed_traffic`](super::mixed_traffic) for
//! every seed: no panic; completions one per WR and in order; a READ or
//! atomic that completed successfully holds exactly the peer's bytes and
//! ran once; no local buffer ever holds a byte no genuine packet carried;
//! and the QPs either carry on or end in ERR with an error completion.
//! With honest faults only, no run may give up on retries.

use std::time::{Duration, Instant};

use rverbs_wire::icrc;
use rverbs_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, Headers, IethRepr, ImmDtRepr, NakCode, Opcode,
    Operation, PacketRepr, Position, Psn, RethRepr, RnrTimer, Syndrome,
};

use super::{
    config, mixed_traffic_in, InFlight, LinkFaults, Outcome, RcConfig, Rng, Sim, MTU, QPN,
};

/// What kind of wrong packet a forgery is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Forgery {
    /// Wrong in a way only the protocol's state can show (a PSN, contents,
    /// a length, an MSN): withheld where it would pass for genuine.
    Lie,
    /// Wrong wherever it lands (a middle without a first, a bad rkey, a
    /// WRITE whose RETH length its payloads do not make up): the receiver
    /// must refuse it.
    Detectable,
}

/// Every RC opcode, for opcodes out of sequence.
const RC_OPCODES: [Opcode; 23] = [
    Opcode::RC_SEND_FIRST,
    Opcode::RC_SEND_MIDDLE,
    Opcode::RC_SEND_LAST,
    Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
    Opcode::RC_SEND_ONLY,
    Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
    Opcode::RC_RDMA_WRITE_FIRST,
    Opcode::RC_RDMA_WRITE_MIDDLE,
    Opcode::RC_RDMA_WRITE_LAST,
    Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
    Opcode::RC_RDMA_WRITE_ONLY,
    Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
    Opcode::RC_RDMA_READ_REQUEST,
    Opcode::RC_RDMA_READ_RESPONSE_FIRST,
    Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
    Opcode::RC_RDMA_READ_RESPONSE_LAST,
    Opcode::RC_RDMA_READ_RESPONSE_ONLY,
    Opcode::RC_ACKNOWLEDGE,
    Opcode::RC_ATOMIC_ACKNOWLEDGE,
    Opcode::RC_COMPARE_SWAP,
    Opcode::RC_FETCH_ADD,
    Opcode::RC_SEND_LAST_WITH_INVALIDATE,
    Opcode::RC_SEND_ONLY_WITH_INVALIDATE,
];

fn is_request(op: Operation) -> bool {
    matches!(
        op,
        Operation::Send
            | Operation::RdmaWrite
            | Operation::RdmaReadRequest
            | Operation::CompareSwap
            | Operation::FetchAdd
    )
}

/// Any AETH syndrome a peer could send.
fn random_syndrome(rng: &mut Rng) -> Syndrome {
    match rng.below(7) {
        0 => Syndrome::Ack {
            credits: rng.below(32) as u8,
        },
        1 => Syndrome::RnrNak(RnrTimer::new(rng.below(32) as u8)),
        2 => Syndrome::Nak(NakCode::PsnSequenceError),
        3 => Syndrome::Nak(NakCode::InvalidRequest),
        4 => Syndrome::Nak(NakCode::RemoteAccessError),
        5 => Syndrome::Nak(NakCode::RemoteOperationalError),
        _ => Syndrome::Nak(NakCode::InvalidRdRequest),
    }
}

/// Gives `p` exactly the headers its opcode has, keeping those it had.
fn fit_headers(p: &mut PacketRepr<'_>, rng: &mut Rng) {
    let Some(info) = p.info() else { return };
    let has = |h| info.headers.contains(h);
    p.reth = if has(Headers::RETH) {
        p.reth.or(Some(RethRepr {
            va: rng.next(),
            rkey: rng.next() as u32,
            dma_len: rng.below(u64::from(MTU) * 4) as u32,
        }))
    } else {
        None
    };
    p.atomic_eth = if has(Headers::ATOMIC_ETH) {
        p.atomic_eth.or(Some(AtomicEthRepr {
            va: rng.next() & !7,
            rkey: rng.next() as u32,
            swap_add: rng.next(),
            compare: rng.next(),
        }))
    } else {
        None
    };
    p.aeth = if has(Headers::AETH) {
        p.aeth.or(Some(AethRepr {
            syndrome: random_syndrome(rng),
            msn: rng.next() as u32 & 0xff_ffff,
        }))
    } else {
        None
    };
    p.atomic_ack_eth = if has(Headers::ATOMIC_ACK_ETH) {
        p.atomic_ack_eth
            .or(Some(AtomicAckEthRepr { orig: rng.next() }))
    } else {
        None
    };
    p.imm_dt = if has(Headers::IMM_DT) {
        p.imm_dt.or(Some(ImmDtRepr(rng.next() as u32)))
    } else {
        None
    };
    p.ieth = if has(Headers::IETH) {
        p.ieth.or(Some(IethRepr(rng.next() as u32)))
    } else {
        None
    };
    p.deth = None;
}

impl Sim {
    /// A buggy peer's wrong packet made from `genuine` (which side `from`
    /// is sending), on the link with its own delay; it is not lost,
    /// duplicated or corrupted (the genuine one may be).
    pub(super) fn send_forgery(&mut self, from: usize, genuine: &[u8]) {
        let Some((mut bytes, kind)) = self.forge(genuine) else {
            return;
        };
        let (ip, udp) = self.headers(from, bytes.len());
        icrc::fill(&ip, &udp, &mut bytes).expect("room for the ICRC");
        self.forged += 1;
        self.seq += 1;
        let delay = Duration::from_micros(5 + self.rng.below(400));
        self.wire.push(InFlight {
            at: self.now + delay,
            seq: self.seq,
            to: 1 - from,
            bytes,
            forgery: Some(kind),
        });
    }

    /// Whether side `to` would take the wrong packet `p` as the genuine
    /// one it expects next (see the module docs).
    pub(super) fn indistinguishable(&self, p: &PacketRepr<'_>, to: usize) -> bool {
        let Some(info) = p.info() else { return false };
        let qp = &self.sides[to].qp;
        match info.operation {
            op if is_request(op) => p.bth.psn == qp.expected_request_psn(),
            Operation::RdmaReadResponse | Operation::AtomicAcknowledge => {
                qp.placing_psn() == Some(p.bth.psn)
            }
            _ => false,
        }
    }

    /// One wrong packet made from `genuine`, or `None` if the mutation
    /// drawn does not apply to it.
    fn forge(&mut self, genuine: &[u8]) -> Option<(Vec<u8>, Forgery)> {
        let p = PacketRepr::parse(genuine).ok()?;
        let info = p.info()?;
        let rng = &mut self.rng;
        let mut q = p;
        let mut payload = p.payload.to_vec();
        let mut kind = Forgery::Lie;
        match rng.below(10) {
            0 => {
                // A PSN inside the window, either way.
                let d = 1 + rng.below(64) as u32;
                q.bth.psn = if rng.chance(0.5) {
                    p.bth.psn.add(d)
                } else {
                    p.bth.psn.sub(d)
                };
            }
            1 => q.bth.psn = Psn::new(rng.next() as u32 & Psn::MASK),
            2 => {
                // Other contents under the same PSN.
                if payload.is_empty() {
                    return None;
                }
                let i = rng.below(payload.len() as u64) as usize;
                payload[i] ^= 1 + rng.below(255) as u8;
            }
            3 => {
                // Another length.
                let len = rng.below(u64::from(MTU) + 1) as usize;
                if !info.has_payload || len == payload.len() {
                    return None;
                }
                payload.resize(len, 0x5a);
            }
            4 => {
                // The AETH lies: its MSN, or its syndrome.
                let aeth = q.aeth.as_mut()?;
                if rng.chance(0.5) {
                    aeth.msn = rng.next() as u32 & 0xff_ffff;
                } else {
                    aeth.syndrome = random_syndrome(rng);
                }
            }
            5 | 6 => {
                // Another opcode; a sibling (same operation) half the time.
                let siblings: Vec<Opcode> = RC_OPCODES
                    .into_iter()
                    .filter(|o| o.info().is_some_and(|i| i.operation == info.operation))
                    .collect();
                let pool = if rng.chance(0.5) && siblings.len() > 1 {
                    &siblings[..]
                } else {
                    &RC_OPCODES[..]
                };
                let op = pool[rng.below(pool.len() as u64) as usize];
                if op == p.bth.opcode {
                    return None;
                }
                q.bth.opcode = op;
                fit_headers(&mut q, rng);
                let new = op.info()?;
                if !new.has_payload {
                    payload.clear();
                }
                // A middle or last where a message starts: no message is in
                // progress there, so it is wrong wherever it lands.
                let starts = matches!(info.position, Position::First | Position::Only);
                let continues = matches!(new.position, Position::Middle | Position::Last);
                let sends_or_writes =
                    |o: Operation| matches!(o, Operation::Send | Operation::RdmaWrite);
                if starts
                    && continues
                    && sends_or_writes(info.operation)
                    && sends_or_writes(new.operation)
                {
                    kind = Forgery::Detectable;
                }
            }
            7 => {
                // A wrong rkey (a zero-length RETH names no memory: no key
                // is checked, and the request is as good as the genuine).
                if let Some(r) = q.reth.as_mut() {
                    r.rkey ^= 1 + rng.below(u64::from(u32::MAX)) as u32;
                } else if let Some(a) = q.atomic_eth.as_mut() {
                    a.rkey ^= 1 + rng.below(u64::from(u32::MAX)) as u32;
                } else {
                    return None;
                }
                kind = Forgery::Detectable;
            }
            8 => {
                // A RETH length that does not match: for a WRITE, the
                // payloads never make it up.
                let r = q.reth.as_mut()?;
                let len = rng.below(u64::from(MTU) * 8) as u32;
                if len == r.dma_len {
                    return None;
                }
                r.dma_len = len;
                if info.operation == Operation::RdmaWrite {
                    kind = Forgery::Detectable;
                }
            }
            _ => {
                // Other operands or results: a READ's VA, an atomic's
                // values, an atomic ACK's original value.
                if let Some(a) = q.atomic_eth.as_mut() {
                    a.swap_add ^= rng.next();
                    a.compare ^= rng.next();
                } else if let Some(a) = q.atomic_ack_eth.as_mut() {
                    a.orig ^= 1 | rng.next();
                } else if let Some(r) = q.reth.as_mut() {
                    r.va ^= 8 << rng.below(12);
                } else {
                    return None;
                }
            }
        }
        q.payload = &payload;
        let mut bytes = vec![0u8; q.buffer_len()];
        q.emit(&mut bytes).ok()?;
        Some((bytes, kind))
    }
}

/// How the runs of one fault profile ended.
#[derive(Debug, Default)]
struct Tally {
    completed: u64,
    gave_up: u64,
    /// Ended in ERR with another error completion (a buggy peer's doing).
    failed: u64,
    forged: u64,
    lies_withheld: u64,
    icrc_drops: u64,
    /// The first seeds that gave up on retries (to rerun one).
    gave_up_seeds: Vec<u64>,
    /// The slowest seed and its run time.
    slowest: (u64, Duration),
}

/// Seeds per fault profile in CI; `RVERBS_SIM_SEEDS` asks for more (or fewer).
const PROFILE_SEEDS: u64 = 2000;
/// WRs per run: short runs, many seeds.
const PROFILE_WRS: usize = 16;

/// The two sides of a profile run: the simulator's usual QPs, with the
/// local ACK timeout at 14 (67 ms, a common setting) rather than ~1 ms,
/// so the adaptive timer resends a lost packet first, spending no retry,
/// and `retry_cnt` 7 counts what it is meant to: timeouts with no sign of
/// the peer.
fn profile_sim(seed: u64, faults: LinkFaults) -> Sim {
    let cfg = |qpn, dest| RcConfig {
        timeout: RcConfig::timeout_for(14),
        ..config(qpn, dest)
    };
    Sim::with_configs(seed, faults, cfg(QPN[0], QPN[1]), cfg(QPN[1], QPN[0]))
}

/// Runs [`mixed_traffic`](super::mixed_traffic) over `PROFILE_SEEDS` seeds (from `first_seed`)
/// with `faults` both ways, and prints one summary line (seen with
/// `--nocapture`).
fn sweep(name: &str, first_seed: u64, faults: LinkFaults) -> Tally {
    let seeds: u64 = std::env::var("RVERBS_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PROFILE_SEEDS);
    let started = Instant::now();
    let mut t = Tally::default();
    for seed in first_seed..first_seed + seeds {
        let run_started = Instant::now();
        let (sim, outcome) = mixed_traffic_in(profile_sim(seed, faults), seed, PROFILE_WRS);
        let took = run_started.elapsed();
        if took > t.slowest.1 {
            t.slowest = (seed, took);
        }
        match outcome {
            Outcome::Completed => t.completed += 1,
            Outcome::GaveUp { .. } => {
                t.gave_up += 1;
                if t.gave_up_seeds.len() < 8 {
                    t.gave_up_seeds.push(seed);
                }
            }
            Outcome::Failed { .. } => t.failed += 1,
        }
        t.forged += sim.forged;
        t.lies_withheld += sim.lies_withheld;
        t.icrc_drops += sim.icrc_drops;
    }
    println!(
        "fault profile {name}: {seeds} seeds x {PROFILE_WRS} WRs: {} completed, {} gave up on \
         retries, {} ended in another error; {} wrong packets sent ({} withheld as \
         indistinguishable), {} corrupt packets caught by the ICRC; {:.1} s (slowest seed {} \
         {:.2} s); gave up: seeds {:?}",
        t.completed,
        t.gave_up,
        t.failed,
        t.forged,
        t.lies_withheld,
        t.icrc_drops,
        started.elapsed().as_secs_f64(),
        t.slowest.0,
        t.slowest.1.as_secs_f64(),
        t.gave_up_seeds,
    );
    t
}

/// A profile of one honest fault at `p`, or all four together.
fn honest(loss: f64, duplicate: f64, reorder: f64, corrupt: f64) -> LinkFaults {
    LinkFaults {
        loss,
        duplicate,
        reorder,
        corrupt,
        forge: 0.0,
    }
}

#[test]
fn profile_loss_20_percent() {
    let t = sweep("loss 20%", 10_000, honest(0.2, 0.0, 0.0, 0.0));
    assert_eq!((t.gave_up, t.failed), (0, 0), "{t:?}");
}

#[test]
fn profile_duplication_20_percent() {
    let t = sweep("duplication 20%", 20_000, honest(0.0, 0.2, 0.0, 0.0));
    assert_eq!((t.gave_up, t.failed), (0, 0), "{t:?}");
}

#[test]
fn profile_reordering_20_percent() {
    let t = sweep("reordering 20%", 30_000, honest(0.0, 0.0, 0.2, 0.0));
    assert_eq!((t.gave_up, t.failed), (0, 0), "{t:?}");
}

#[test]
fn profile_corruption_20_percent() {
    let t = sweep("corruption 20%", 40_000, honest(0.0, 0.0, 0.0, 0.2));
    assert_eq!((t.gave_up, t.failed), (0, 0), "{t:?}");
    assert!(t.icrc_drops > 0);
}

#[test]
fn profile_every_honest_fault_20_percent() {
    let t = sweep("all honest 20%", 50_000, honest(0.2, 0.2, 0.2, 0.2));
    assert_eq!((t.gave_up, t.failed), (0, 0), "{t:?}");
}

#[test]
fn profile_buggy_peer_20_percent() {
    let faults = LinkFaults {
        forge: 0.2,
        ..LinkFaults::CLEAN
    };
    let t = sweep("buggy peer 20%", 60_000, faults);
    assert!(t.forged > 0, "{t:?}");
}

#[test]
fn profile_buggy_peer_and_every_honest_fault_20_percent() {
    let t = sweep(
        "buggy peer and all honest 20%",
        70_000,
        LinkFaults {
            forge: 0.2,
            ..honest(0.2, 0.2, 0.2, 0.2)
        },
    );
    assert!(t.forged > 0, "{t:?}");
}
