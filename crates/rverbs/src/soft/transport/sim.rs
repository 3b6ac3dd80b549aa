//! Deterministic fault tests of the RC transport: two queue pairs joined by
//! a seeded, simulated link that loses, duplicates, reorders and corrupts
//! packets (corruption is caught by the real ICRC check), in virtual time.
//! Every run asserts that each message arrives exactly once, in order,
//! intact, with matching completions — or, with a dead peer, that the
//! requester ends in RETRY_EXC_ERR rather than hanging.

use std::collections::BinaryHeap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rverbs_wire::icrc::{self, Ipv4Header, ROCE_V2_PORT};
use rverbs_wire::{PacketRepr, Psn, RnrTimer};

use super::rc::{AckPolicy, RcConfig, RcQp};
use smallvec::smallvec;

use super::{InlineData, Memory, QpEvent, RecvWqe, SendWqe, TxBuffer, WqeData};
use crate::attr::AccessFlags;
use crate::event::AsyncEventType;
use crate::soft::memory::{MrCore, MrState, MrTable, Region};
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};
use crate::wr::{QpState, Sge, WrOpcode};

const PD: u64 = 7;
const MTU: u32 = 1024;

/// xorshift64*: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 1.0 < p
    }
}

/// What the link does to packets.
#[derive(Debug, Clone, Copy)]
struct LinkFaults {
    loss: f64,
    duplicate: f64,
    /// Chance a packet is held back by up to `max_delay_us` extra (reordering).
    reorder: f64,
    corrupt: f64,
}

impl LinkFaults {
    const CLEAN: LinkFaults = LinkFaults {
        loss: 0.0,
        duplicate: 0.0,
        reorder: 0.0,
        corrupt: 0.0,
    };
}

struct InFlight {
    at: Instant,
    seq: u64,
    to: usize,
    bytes: Vec<u8>,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    // BinaryHeap is a max-heap: the earliest packet is the greatest.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

struct Side {
    qp: RcQp,
    mem: MrTable,
    addr: Ipv4Addr,
    sends: Vec<WorkCompletion>,
    recvs: Vec<(WorkCompletion, bool)>,
    events: Vec<AsyncEventType>,
}

struct Sim {
    sides: [Side; 2],
    rng: Rng,
    faults: [LinkFaults; 2],
    /// Drop everything a side sends (a dead peer).
    mute: [bool; 2],
    /// How each side treats plain ACKs (both policies, by seed).
    acks: [AckPolicy; 2],
    /// Payloads described by reference instead of copied (by seed), as the
    /// engine builds packets.
    zero_copy: bool,
    wire: BinaryHeap<InFlight>,
    seq: u64,
    start: Instant,
    now: Instant,
    icrc_drops: u64,
    delivered: u64,
}

fn config(qpn: u32, dest: u32) -> RcConfig {
    RcConfig {
        max_window: super::rc::WINDOW,
        qpn,
        dest_qpn: dest,
        pd: PD,
        mtu: MTU,
        sq_psn: Psn::new(0xff_fff0), // wraps during the test
        rq_psn: Psn::new(0xff_fff0),
        timeout: RcConfig::timeout_for(8), // ~1 ms
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: RnrTimer::new(1),
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        pkey: 0xffff,
    }
}

fn register(mem: &MrTable, len: usize, access: AccessFlags) -> (u32, u64) {
    let mr: Arc<MrCore> = mem
        .insert(
            1,
            MrState {
                key: 0,
                region: Region::owned(vec![0u8; len].into_boxed_slice()),
                iova: 0x10_0000,
                access,
                pd: PD,
                valid: true,
            },
        )
        .ok()
        .expect("room in the key table");
    let key = mr.read().key;
    (key, 0x10_0000)
}

fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

impl Sim {
    fn new(seed: u64, faults: LinkFaults) -> Sim {
        Self::with_configs(seed, faults, config(0x11, 0x22), config(0x22, 0x11))
    }

    fn with_configs(seed: u64, faults: LinkFaults, a: RcConfig, b: RcConfig) -> Sim {
        let side = |cfg: RcConfig, addr| {
            let mut qp = RcQp::new(cfg.clone());
            qp.enter_rtr(cfg.clone());
            qp.enter_rts(cfg);
            Side {
                qp,
                mem: MrTable::new(64),
                addr,
                sends: Vec::new(),
                recvs: Vec::new(),
                events: Vec::new(),
            }
        };
        let start = Instant::now();
        Sim {
            sides: [
                side(a, Ipv4Addr::new(10, 0, 0, 1)),
                side(b, Ipv4Addr::new(10, 0, 0, 2)),
            ],
            rng: Rng::new(seed),
            faults: [faults; 2],
            mute: [false; 2],
            acks: [0, 1].map(|i| {
                if (seed >> i) & 1 == 1 {
                    AckPolicy::Hold
                } else {
                    AckPolicy::Now
                }
            }),
            zero_copy: (seed >> 2) & 1 == 1,
            wire: BinaryHeap::new(),
            seq: 0,
            start,
            now: start,
            icrc_drops: 0,
            delivered: 0,
        }
    }

    fn headers(&self, from: usize, len: usize) -> ([u8; 20], [u8; 8]) {
        let udp_len = (len + 8) as u16;
        let ip = Ipv4Header {
            src: self.sides[from].addr,
            dst: self.sides[1 - from].addr,
            id: 0,
            dont_fragment: true,
            tos: 0,
            ttl: 64,
        }
        .to_bytes(udp_len);
        (ip, icrc::udp_header(ROCE_V2_PORT, ROCE_V2_PORT, udp_len))
    }

    fn transmit(&mut self, from: usize, mut bytes: Vec<u8>) {
        let (ip, udp) = self.headers(from, bytes.len());
        icrc::fill(&ip, &udp, &mut bytes).unwrap();
        let f = self.faults[from];
        if self.mute[from] || self.rng.chance(f.loss) {
            return;
        }
        if self.rng.chance(f.corrupt) {
            let bit = self.rng.below(bytes.len() as u64 * 8);
            bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
        }
        let copies = if self.rng.chance(f.duplicate) { 2 } else { 1 };
        for _ in 0..copies {
            let mut delay = Duration::from_micros(5);
            if self.rng.chance(f.reorder) {
                delay += Duration::from_micros(self.rng.below(400));
            }
            self.seq += 1;
            self.wire.push(InFlight {
                at: self.now + delay,
                seq: self.seq,
                to: 1 - from,
                bytes: bytes.clone(),
            });
        }
    }

    fn deliver(&mut self, pkt: InFlight) {
        let from = 1 - pkt.to;
        let (ip, udp) = self.headers(from, pkt.bytes.len());
        match icrc::check(&ip, &udp, &pkt.bytes) {
            Ok((computed, wire)) if computed == wire => {}
            _ => {
                self.icrc_drops += 1;
                return;
            }
        }
        let Ok(p) = PacketRepr::parse(&pkt.bytes) else {
            panic!("a packet with a good ICRC must parse")
        };
        self.delivered += 1;
        let side = &mut self.sides[pkt.to];
        side.qp.handle_packet(&p, self.now, &side.mem);
    }

    fn drain_events(&mut self) {
        for side in &mut self.sides {
            while let Some(e) = side.qp.poll_event() {
                match e {
                    QpEvent::SendCompletion(wc) => side.sends.push(wc),
                    QpEvent::RecvCompletion(wc, se) => side.recvs.push((wc, se)),
                    QpEvent::Async(a) => side.events.push(a),
                }
            }
        }
    }

    /// Runs until nothing is in flight, nothing is due and no timer is armed,
    /// or `limit` of virtual time passed (then it panics: a hang).
    fn run(&mut self, limit: Duration) {
        let stop = self.start + limit;
        assert!(
            self.run_until(stop),
            "no quiescence within {limit:?}: a hang"
        );
    }

    /// Runs until both sides are quiet (true) or the clock reaches `stop`.
    fn run_until(&mut self, stop: Instant) -> bool {
        let mut buf = vec![0u8; MTU as usize + 128];
        let mut refs = Vec::new();
        loop {
            if self.now >= stop {
                return false;
            }
            let mut busy = false;
            for i in 0..2 {
                let side = &mut self.sides[i];
                if side.qp.next_timeout().is_some_and(|t| t <= self.now) {
                    side.qp.handle_timeout(self.now);
                }
                loop {
                    refs.clear();
                    let zero_copy = self.zero_copy;
                    let mut tx = TxBuffer {
                        bytes: &mut buf,
                        refs: zero_copy.then_some(&mut refs),
                    };
                    let side = &mut self.sides[i];
                    let Some(n) = side
                        .qp
                        .poll_transmit(self.now, &side.mem, &mut tx, self.acks[i])
                    else {
                        break;
                    };
                    // Zero-copy: fetch the payloads as the engine's send would.
                    for r in &refs {
                        let at = r.at as usize;
                        let dst = &mut buf[at..at + r.len as usize];
                        Memory::read(&side.mem, r.key, r.va, r.pd, r.kind, dst).unwrap();
                    }
                    busy = true;
                    self.transmit(i, buf[..n].to_vec());
                }
            }
            self.drain_events();
            while self.wire.peek().is_some_and(|p| p.at <= self.now) {
                let Some(p) = self.wire.pop() else { break };
                busy = true;
                self.deliver(p);
            }
            self.drain_events();
            if busy {
                continue;
            }
            let next = [
                self.wire.peek().map(|p| p.at),
                self.sides[0].qp.next_timeout(),
                self.sides[1].qp.next_timeout(),
            ]
            .into_iter()
            .flatten()
            .min();
            match next {
                Some(t) => self.now = t.max(self.now + Duration::from_nanos(1)),
                None => return true,
            }
        }
    }
}

/// A signaled send WR of `len` bytes from one SGE.
fn send_wqe(wr_id: u64, op: WrOpcode, lkey: u32, addr: u64, len: u32) -> SendWqe {
    SendWqe {
        wr_id,
        op,
        data: WqeData::Sges(smallvec![Sge {
            addr,
            length: len,
            lkey,
        }]),
        length: len,
        signaled: true,
        solicited: false,
        fence: false,
    }
}

/// A signaled send WR carrying `data` inline.
fn inline_wqe(wr_id: u64, op: WrOpcode, data: &[u8]) -> SendWqe {
    SendWqe {
        wr_id,
        op,
        data: WqeData::Inline(InlineData::from_slice(data)),
        length: data.len() as u32,
        signaled: true,
        solicited: false,
        fence: false,
    }
}

/// A receive WR of one SGE.
fn recv_wqe(wr_id: u64, lkey: u32, addr: u64, len: u32) -> RecvWqe {
    RecvWqe {
        wr_id,
        sges: smallvec![Sge {
            addr,
            length: len,
            lkey,
        }],
        length: u64::from(len),
    }
}

fn message(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j * 7 + 3) as u8).collect()
}

/// What a message of [`mixed_traffic`] must leave behind.
enum Expect {
    /// The k-th SEND lands in receive WR k.
    Recv {
        data: Vec<u8>,
        imm: Option<u32>,
        solicited: bool,
    },
    Write {
        addr: u64,
        data: Vec<u8>,
    },
    Read {
        addr: u64,
        data: Vec<u8>,
    },
    /// Adds `add` to its own zeroed counter; the original value (0) lands at `result`.
    Add {
        counter: u64,
        add: u64,
        result: u64,
    },
}

/// How a [`mixed_traffic`] run ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Every WR succeeded.
    Completed,
    /// The link lost so much that WR `at` ran out of retries (RETRY_EXC_ERR).
    GaveUp { at: usize },
}

/// A mix of SENDs (with and without immediate), RDMA WRITEs, READs and
/// fetch-and-adds from A to B under `faults`, then checks the RC contract:
/// completions one per WR and in order; every WR that completed successfully
/// took effect exactly once, intact; nothing took effect twice or out of
/// order; and if the requester gave up, it was with RETRY_EXC_ERR followed
/// by flushes.
fn mixed_traffic(seed: u64, faults: LinkFaults, count: usize) -> (Sim, Outcome) {
    let mut sim = Sim::new(seed, faults);
    let mut rng = Rng::new(seed ^ 0xabcdef);
    // Each side's 2 MiB MR holds 4 KiB slots per message in separate areas:
    // A: sources [0, 512K), READ targets [512K, 1M), atomic results [1M, …);
    // B: WRITE targets [0, 512K), READ sources [512K, 1M), receive buffers
    // [1M, 1.5M), atomic counters [1.5M, …).
    assert!(count <= 128);
    const AREA: u64 = 512 << 10;
    let (a_key, a_base) = register(&sim.sides[0].mem, 2 << 20, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, 2 << 20, all_access());
    for i in 0..count {
        let sge = Sge {
            addr: b_base + 2 * AREA + (i as u64) * 4096,
            length: 4096,
            lkey: b_key,
        };
        sim.sides[1].qp.post_recv(RecvWqe {
            wr_id: 1000 + i as u64,
            sges: smallvec![sge],
            length: 4096,
        });
    }
    let mut expect = Vec::new();
    for i in 0..count {
        let len = [0usize, 1, 7, 1024, 1025, 3000, 4096][rng.below(7) as usize];
        let data = message(i, len);
        let slot = (i as u64) * 4096;
        sim.sides[0].mem.write_for_test(a_key, a_base + slot, &data);
        let source = vec![Sge {
            addr: a_base + slot,
            length: len as u32,
            lkey: a_key,
        }];
        let solicited = i % 3 == 0;
        let (op, sges, length, e) = match rng.below(6) {
            0 | 1 => {
                let imm = (rng.below(2) == 0).then_some(i as u32);
                let op = imm.map_or(WrOpcode::Send, |imm| WrOpcode::SendWithImm { imm });
                (
                    op,
                    source,
                    len as u32,
                    Expect::Recv {
                        data,
                        imm,
                        solicited,
                    },
                )
            }
            2 => {
                let addr = b_base + slot;
                let op = WrOpcode::RdmaWrite {
                    remote_addr: addr,
                    rkey: b_key,
                };
                (op, source, len as u32, Expect::Write { addr, data })
            }
            3 => {
                let src = message(i + 5000, len);
                sim.sides[1]
                    .mem
                    .write_for_test(b_key, b_base + AREA + slot, &src);
                let dst = a_base + AREA + slot;
                let op = WrOpcode::RdmaRead {
                    remote_addr: b_base + AREA + slot,
                    rkey: b_key,
                };
                let sges = vec![Sge {
                    addr: dst,
                    length: len as u32,
                    lkey: a_key,
                }];
                (
                    op,
                    sges,
                    len as u32,
                    Expect::Read {
                        addr: dst,
                        data: src,
                    },
                )
            }
            _ => {
                let counter = b_base + 3 * AREA + i as u64 * 8;
                let result = a_base + 2 * AREA + i as u64 * 8;
                let add = i as u64 + 1;
                let op = WrOpcode::AtomicFetchAndAdd {
                    remote_addr: counter,
                    rkey: b_key,
                    add,
                };
                let sges = vec![Sge {
                    addr: result,
                    length: 8,
                    lkey: a_key,
                }];
                (
                    op,
                    sges,
                    8,
                    Expect::Add {
                        counter,
                        add,
                        result,
                    },
                )
            }
        };
        expect.push(e);
        sim.sides[0].qp.post_send(SendWqe {
            wr_id: i as u64,
            op,
            data: WqeData::Sges(sges.into()),
            length,
            signaled: true,
            solicited,
            fence: false,
        });
    }
    sim.run(Duration::from_secs(600));

    let a = &sim.sides[0];
    let b = &sim.sides[1];
    // One completion per WR, in order.
    let ids: Vec<u64> = a.sends.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..count as u64).collect::<Vec<_>>(), "seed {seed}");
    let ok = a
        .sends
        .iter()
        .take_while(|w| w.status == WcStatus::Success)
        .count();
    let outcome = if ok == count {
        assert_eq!(a.qp.state(), QpState::Rts, "seed {seed}");
        Outcome::Completed
    } else {
        // The only failure a lossy link may cause: retries ran out.
        assert_eq!(
            a.sends[ok].status,
            WcStatus::RetryExcErr,
            "seed {seed}: {:?}",
            a.sends[ok]
        );
        assert!(
            a.sends[ok + 1..]
                .iter()
                .all(|w| w.status == WcStatus::WrFlushErr),
            "seed {seed}"
        );
        assert_eq!(a.qp.state(), QpState::Err);
        Outcome::GaveUp { at: ok }
    };
    let read = |mem: &MrTable, key, addr, len| {
        let mut got = vec![0u8; len];
        mem.read_for_test(key, addr, &mut got);
        got
    };
    // SENDs: received in order, each at most once, all completed ones present.
    let recv_msgs: Vec<usize> = (0..count)
        .filter(|&i| matches!(expect[i], Expect::Recv { .. }))
        .collect();
    let must_recv = recv_msgs.iter().filter(|&&i| i < ok).count();
    assert!(
        b.recvs.len() >= must_recv && b.recvs.len() <= recv_msgs.len(),
        "seed {seed}: {} receives",
        b.recvs.len()
    );
    for (k, (wc, se)) in b.recvs.iter().enumerate() {
        let i = recv_msgs[k];
        let Expect::Recv {
            data,
            imm,
            solicited,
        } = &expect[i]
        else {
            unreachable!()
        };
        assert_eq!(wc.status, WcStatus::Success, "seed {seed} msg {i}");
        assert_eq!(
            wc.wr_id,
            1000 + k as u64,
            "seed {seed}: receive WRs are used in order"
        );
        assert_eq!(wc.byte_len as usize, data.len(), "seed {seed} msg {i}");
        assert_eq!(wc.imm(), *imm, "seed {seed} msg {i}");
        assert_eq!(se, solicited, "seed {seed} msg {i}: solicited bit");
        assert_eq!(
            &read(
                &b.mem,
                b_key,
                b_base + 2 * AREA + k as u64 * 4096,
                data.len()
            ),
            data,
            "seed {seed} msg {i}"
        );
    }
    for (i, e) in expect.iter().enumerate() {
        match e {
            Expect::Recv { .. } => {}
            Expect::Write { addr, data } => {
                let got = read(&b.mem, b_key, *addr, data.len());
                if i < ok {
                    assert_eq!(&got, data, "seed {seed} msg {i}: RDMA WRITE");
                }
            }
            Expect::Read { addr, data } => {
                if i < ok {
                    assert_eq!(
                        &read(&a.mem, a_key, *addr, data.len()),
                        data,
                        "seed {seed} msg {i}: RDMA READ"
                    );
                }
            }
            Expect::Add {
                counter,
                add,
                result,
            } => {
                let value =
                    u64::from_ne_bytes(read(&b.mem, b_key, *counter, 8).try_into().unwrap());
                if i < ok {
                    assert_eq!(
                        value, *add,
                        "seed {seed} msg {i}: fetch-and-add ran exactly once"
                    );
                    assert_eq!(
                        read(&a.mem, a_key, *result, 8),
                        [0; 8],
                        "seed {seed} msg {i}: original value"
                    );
                } else {
                    assert!(
                        value == 0 || value == *add,
                        "seed {seed} msg {i}: at most once"
                    );
                }
            }
        }
    }
    (sim, outcome)
}

#[test]
fn clean_link_delivers_everything() {
    let (sim, outcome) = mixed_traffic(1, LinkFaults::CLEAN, 60);
    assert_eq!(outcome, Outcome::Completed);
    assert_eq!(sim.icrc_drops, 0);
}

#[test]
fn many_seeds_of_loss_duplication_reordering_and_corruption() {
    // RVERBS_SIM_SEEDS runs more seeds (the CI run takes the default).
    let seeds: u64 = std::env::var("RVERBS_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let mut corrupted = 0;
    let mut gave_up = 0;
    for seed in 0..seeds {
        let loss = (seed % 5) as f64 * 0.05; // 0 … 20 %
        let faults = LinkFaults {
            loss,
            duplicate: 0.05,
            reorder: 0.1,
            corrupt: 0.02,
        };
        let (sim, outcome) = mixed_traffic(seed, faults, 40);
        corrupted += sim.icrc_drops;
        gave_up += u64::from(outcome != Outcome::Completed);
    }
    assert!(
        corrupted > 0,
        "some corruption was injected and caught by the ICRC"
    );
    // retry_cnt 7 runs out only after eight lost round trips in a row.
    assert!(
        gave_up * 100 <= seeds,
        "{gave_up} of {seeds} runs ran out of retries"
    );
}

#[test]
fn twenty_percent_loss_both_ways() {
    let mut gave_up = 0;
    for seed in 1000..1010 {
        let faults = LinkFaults {
            loss: 0.2,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
        };
        gave_up += u32::from(mixed_traffic(seed, faults, 80).1 != Outcome::Completed);
    }
    assert_eq!(gave_up, 0);
}

#[test]
fn dead_peer_ends_in_retry_exc_err_not_a_hang() {
    let mut sim = Sim::new(5, LinkFaults::CLEAN);
    sim.mute[1] = true;
    let (a_key, a_base) = register(&sim.sides[0].mem, 8192, all_access());
    for i in 0..3 {
        sim.sides[0].qp.post_send(SendWqe {
            wr_id: i,
            op: WrOpcode::Send,
            data: WqeData::Sges(smallvec![Sge {
                addr: a_base,
                length: 100,
                lkey: a_key,
            }]),
            length: 100,
            signaled: i != 1,
            solicited: false,
            fence: false,
        });
    }
    sim.run(Duration::from_secs(60));
    let a = &sim.sides[0];
    assert_eq!(a.qp.state(), QpState::Err);
    let got: Vec<(u64, WcStatus)> = a.sends.iter().map(|w| (w.wr_id, w.status)).collect();
    // The first WR fails, the rest are flushed — unsignaled ones too.
    assert_eq!(
        got,
        vec![
            (0, WcStatus::RetryExcErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    // retry_cnt 7: 8 timeouts of ~1 ms each.
    let elapsed = sim.now - sim.start;
    assert!(
        elapsed >= Duration::from_millis(8) && elapsed < Duration::from_millis(20),
        "{elapsed:?}"
    );
}

#[test]
fn rnr_retries_then_succeeds_when_a_receive_is_posted() {
    let mut sim = Sim::new(6, LinkFaults::CLEAN);
    let (a_key, a_base) = register(&sim.sides[0].mem, 8192, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, 8192, all_access());
    sim.sides[0]
        .qp
        .post_send(send_wqe(1, WrOpcode::Send, a_key, a_base, 16));
    // No receive WR yet: RNR NAKs, retried.
    let mut buf = vec![0u8; 2048];
    for _ in 0..3 {
        while let Some(n) = sim.sides[0].qp.poll_transmit(
            sim.now,
            &sim.sides[0].mem,
            &mut TxBuffer::copying(&mut buf),
            AckPolicy::Now,
        ) {
            sim.transmit(0, buf[..n].to_vec());
        }
        sim.now += Duration::from_micros(10);
        while let Some(p) = sim.wire.pop() {
            sim.deliver(p);
        }
        while let Some(n) = sim.sides[1].qp.poll_transmit(
            sim.now,
            &sim.sides[1].mem,
            &mut TxBuffer::copying(&mut buf),
            AckPolicy::Now,
        ) {
            sim.transmit(1, buf[..n].to_vec());
        }
        sim.now += Duration::from_micros(10);
        while let Some(p) = sim.wire.pop() {
            sim.deliver(p);
        }
        sim.now += Duration::from_micros(20); // RNR timer code 1: 10 µs
        sim.sides[0].qp.handle_timeout(sim.now);
    }
    sim.drain_events();
    assert!(
        sim.sides[0].sends.is_empty(),
        "still waiting for the receiver"
    );
    sim.sides[1].qp.post_recv(recv_wqe(9, b_key, b_base, 64));
    sim.run(Duration::from_secs(5));
    assert_eq!(sim.sides[0].sends[0].status, WcStatus::Success);
    assert_eq!(sim.sides[1].recvs[0].0.byte_len, 16);
}

#[test]
fn rnr_retry_budget_runs_out() {
    let mut a = config(0x11, 0x22);
    a.rnr_retry = 2;
    let mut sim = Sim::with_configs(7, LinkFaults::CLEAN, a, config(0x22, 0x11));
    let (a_key, a_base) = register(&sim.sides[0].mem, 8192, all_access());
    sim.sides[0]
        .qp
        .post_send(send_wqe(1, WrOpcode::Send, a_key, a_base, 16));
    sim.run(Duration::from_secs(5));
    assert_eq!(sim.sides[0].sends[0].status, WcStatus::RnrRetryExcErr);
    assert_eq!(sim.sides[0].qp.state(), QpState::Err);
}

#[test]
fn remote_access_errors_leave_responder_memory_untouched() {
    for (bad_key, offset, len) in [
        (true, 0u64, 64u32),
        (false, (1 << 20) - 32, 64),
        (false, 0, 0),
    ] {
        let mut sim = Sim::new(8, LinkFaults::CLEAN);
        let (a_key, a_base) = register(&sim.sides[0].mem, 8192, all_access());
        // B's MR allows local write only: no remote access at all.
        let (b_key, b_base) = register(
            &sim.sides[1].mem,
            1 << 20,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        );
        sim.sides[0].mem.write_for_test(a_key, a_base, &[0xab; 64]);
        let op = if len == 0 {
            // READ from an MR without REMOTE_READ.
            WrOpcode::RdmaRead {
                remote_addr: b_base,
                rkey: b_key,
            }
        } else {
            WrOpcode::RdmaWrite {
                remote_addr: b_base + offset,
                rkey: if bad_key { b_key ^ 0x5a5a } else { b_key },
            }
        };
        let length = if len == 0 { 16 } else { len };
        for wr_id in 0..3 {
            sim.sides[0].qp.post_send(SendWqe {
                wr_id,
                op,
                data: WqeData::Sges(smallvec![Sge {
                    addr: a_base,
                    length,
                    lkey: a_key,
                }]),
                length,
                signaled: true,
                solicited: false,
                fence: false,
            });
        }
        sim.run(Duration::from_secs(5));
        let statuses: Vec<WcStatus> = sim.sides[0].sends.iter().map(|w| w.status).collect();
        assert_eq!(
            statuses,
            vec![
                WcStatus::RemAccessErr,
                WcStatus::WrFlushErr,
                WcStatus::WrFlushErr
            ]
        );
        assert_eq!(sim.sides[0].qp.state(), QpState::Err);
        assert_eq!(sim.sides[1].qp.state(), QpState::Err);
        assert_eq!(sim.sides[1].events, vec![AsyncEventType::QpAccessErr]);
        let mut mem = vec![1u8; 1 << 20];
        sim.sides[1].mem.read_for_test(b_key, b_base, &mut mem);
        assert!(mem.iter().all(|&b| b == 0), "responder memory untouched");
    }
}

#[test]
fn receive_buffer_too_small_is_loc_len_err_and_rem_inv_req_err() {
    let mut sim = Sim::new(9, LinkFaults::CLEAN);
    let (a_key, a_base) = register(&sim.sides[0].mem, 8192, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, 8192, all_access());
    sim.sides[1].qp.post_recv(recv_wqe(5, b_key, b_base, 100));
    sim.sides[1].qp.post_recv(recv_wqe(6, b_key, b_base, 100));
    sim.sides[0]
        .qp
        .post_send(send_wqe(1, WrOpcode::Send, a_key, a_base, 2000));
    sim.run(Duration::from_secs(5));
    assert_eq!(sim.sides[0].sends[0].status, WcStatus::RemInvReqErr);
    let recv: Vec<(u64, WcStatus)> = sim.sides[1]
        .recvs
        .iter()
        .map(|(w, _)| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        recv,
        vec![(5, WcStatus::LocLenErr), (6, WcStatus::WrFlushErr)]
    );
}

#[test]
fn bad_lkey_is_loc_prot_err_and_nothing_is_sent() {
    let mut sim = Sim::new(10, LinkFaults::CLEAN);
    let (a_key, a_base) = register(&sim.sides[0].mem, 8192, all_access());
    sim.sides[0].qp.post_send(SendWqe {
        wr_id: 1,
        op: WrOpcode::Send,
        data: WqeData::Sges(smallvec![Sge {
            addr: a_base,
            length: 16,
            lkey: a_key ^ 1,
        }]),
        length: 16,
        signaled: false,
        solicited: false,
        fence: false,
    });
    sim.run(Duration::from_secs(5));
    assert_eq!(sim.sides[0].sends[0].status, WcStatus::LocProtErr);
    assert_eq!(sim.delivered, 0);
}

#[test]
fn duplicated_atomics_execute_once_and_reads_replay() {
    // Heavy duplication and loss of responses only (B's packets).
    let mut sim = Sim::new(11, LinkFaults::CLEAN);
    sim.faults[1] = LinkFaults {
        loss: 0.3,
        duplicate: 0.3,
        reorder: 0.3,
        corrupt: 0.0,
    };
    sim.faults[0] = LinkFaults {
        loss: 0.0,
        duplicate: 0.5,
        reorder: 0.3,
        corrupt: 0.0,
    };
    let (a_key, a_base) = register(&sim.sides[0].mem, 1 << 16, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, 1 << 16, all_access());
    sim.sides[1]
        .mem
        .write_for_test(b_key, b_base, &10u64.to_ne_bytes());
    for i in 0..50u64 {
        sim.sides[0].qp.post_send(send_wqe(
            i,
            WrOpcode::AtomicCmpAndSwp {
                remote_addr: b_base,
                rkey: b_key,
                compare: 10 + i,
                swap: 11 + i,
            },
            a_key,
            a_base + i * 8,
            8,
        ));
    }
    sim.run(Duration::from_secs(60));
    let mut v = [0u8; 8];
    sim.sides[1].mem.read_for_test(b_key, b_base, &mut v);
    assert_eq!(
        u64::from_ne_bytes(v),
        60,
        "each compare-and-swap ran once, in order"
    );
    for i in 0..50u64 {
        let mut orig = [0u8; 8];
        sim.sides[0]
            .mem
            .read_for_test(a_key, a_base + i * 8, &mut orig);
        assert_eq!(
            u64::from_ne_bytes(orig),
            10 + i,
            "original value of CAS {i}"
        );
    }
    assert!(sim.sides[0]
        .sends
        .iter()
        .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::CompSwap));
}

#[test]
fn a_large_read_is_asked_for_in_chunks_and_survives_loss() {
    const LEN: usize = 1536 * 1024 + 100; // 1537 packets at MTU 1024: 4 chunks
    for seed in 0..16 {
        let faults = LinkFaults {
            loss: 0.05,
            duplicate: 0.01,
            reorder: 0.05,
            corrupt: 0.0,
        };
        let mut sim = Sim::new(seed, faults);
        let (a_key, a_base) = register(&sim.sides[0].mem, LEN, all_access());
        let (b_key, b_base) = register(&sim.sides[1].mem, LEN, all_access());
        let data = message(seed as usize, LEN);
        sim.sides[1].mem.write_for_test(b_key, b_base, &data);
        // A SEND ahead of the READ: its duplicates (after a lost ACK) are
        // acknowledged with PSNs inside the READ's range.
        let (r_key, r_base) = register(&sim.sides[1].mem, 64, all_access());
        for wr_id in [5, 8] {
            sim.sides[1].qp.post_recv(recv_wqe(
                wr_id,
                r_key,
                r_base + if wr_id == 5 { 0 } else { 32 },
                16,
            ));
        }
        sim.sides[0]
            .qp
            .post_send(inline_wqe(4, WrOpcode::Send, b"before"));
        sim.sides[0].qp.post_send(send_wqe(
            7,
            WrOpcode::RdmaRead {
                remote_addr: b_base,
                rkey: b_key,
            },
            a_key,
            a_base,
            LEN as u32,
        ));
        // A SEND behind the READ waits for the READ's last chunk.
        sim.sides[0]
            .qp
            .post_send(inline_wqe(9, WrOpcode::Send, b"after"));
        sim.run(Duration::from_secs(60));
        let got: Vec<(u64, WcStatus, u32)> = sim.sides[0]
            .sends
            .iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect();
        assert_eq!(
            got,
            vec![
                (4, WcStatus::Success, 0),
                (7, WcStatus::Success, LEN as u32),
                (9, WcStatus::Success, 0)
            ],
            "seed {seed}"
        );
        let mut back = vec![0u8; LEN];
        sim.sides[0].mem.read_for_test(a_key, a_base, &mut back);
        assert!(back == data, "seed {seed}: the READ placed the data intact");
        assert_eq!(sim.sides[1].recvs.len(), 2, "seed {seed}");
    }
}

#[test]
fn a_slow_receiver_costs_rnr_waits_not_retries() {
    // retry_cnt 1: a single NAK sequence error per RNR episode would kill
    // the connection; RNR retries are unlimited (7).
    let mut a = config(0x11, 0x22);
    a.retry_cnt = 1;
    let mut sim = Sim::with_configs(11, LinkFaults::CLEAN, a, config(0x22, 0x11));
    let (a_key, a_base) = register(&sim.sides[0].mem, 4096, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, 64 * 64, all_access());
    for i in 0..40u64 {
        sim.sides[0]
            .qp
            .post_send(send_wqe(i, WrOpcode::Send, a_key, a_base, 32));
    }
    // The receiver posts one receive WR every 200 µs.
    for i in 0..40u64 {
        sim.sides[1]
            .qp
            .post_recv(recv_wqe(i, b_key, b_base + i * 64, 64));
        let stop = sim.now + Duration::from_micros(200);
        sim.run_until(stop);
        sim.now = sim.now.max(stop);
    }
    sim.run(Duration::from_secs(60));
    let statuses: Vec<WcStatus> = sim.sides[0].sends.iter().map(|w| w.status).collect();
    assert_eq!(statuses, vec![WcStatus::Success; 40]);
    assert_eq!(sim.sides[1].recvs.len(), 40);
}

#[test]
fn many_pipelined_reads_survive_loss() {
    const LEN: usize = 64 * 1024;
    const READS: usize = 24;
    for seed in 0..6 {
        let faults = LinkFaults {
            loss: 0.05,
            duplicate: 0.0,
            reorder: 0.02,
            corrupt: 0.0,
        };
        let mut a = config(0x11, 0x22);
        a.max_rd_atomic = 8;
        let mut b = config(0x22, 0x11);
        b.max_dest_rd_atomic = 8;
        let mut sim = Sim::with_configs(seed, faults, a, b);
        let (a_key, a_base) = register(&sim.sides[0].mem, LEN * READS, all_access());
        let (b_key, b_base) = register(&sim.sides[1].mem, LEN * READS, all_access());
        let data = message(seed as usize, LEN * READS);
        sim.sides[1].mem.write_for_test(b_key, b_base, &data);
        for i in 0..READS {
            let off = (i * LEN) as u64;
            sim.sides[0].qp.post_send(send_wqe(
                i as u64,
                WrOpcode::RdmaRead {
                    remote_addr: b_base + off,
                    rkey: b_key,
                },
                a_key,
                a_base + off,
                LEN as u32,
            ));
        }
        sim.run(Duration::from_secs(60));
        let got: Vec<(u64, WcStatus)> = sim.sides[0]
            .sends
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect();
        let want: Vec<(u64, WcStatus)> =
            (0..READS as u64).map(|i| (i, WcStatus::Success)).collect();
        assert_eq!(got, want, "seed {seed}");
        let mut back = vec![0u8; LEN * READS];
        sim.sides[0].mem.read_for_test(a_key, a_base, &mut back);
        assert!(
            back == data,
            "seed {seed}: the READs placed the data intact"
        );
    }
}

#[test]
fn an_ack_inside_a_read_acknowledges_only_the_responses_placed() {
    // B executes a SEND and the first chunk of a large READ, but all it
    // sends is lost. A times out and resends the SEND: B acknowledges the
    // duplicate with its expected PSN minus one, which lies inside the READ.
    // That ACK must not move A past READ responses it never placed.
    const LEN: usize = 1024 * 1024; // 1024 packets at MTU 1024: 2 chunks
    let mut sim = Sim::new(21, LinkFaults::CLEAN);
    let (a_key, a_base) = register(&sim.sides[0].mem, LEN, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, LEN, all_access());
    let data = message(3, LEN);
    sim.sides[1].mem.write_for_test(b_key, b_base, &data);
    let (r_key, r_base) = register(&sim.sides[1].mem, 64, all_access());
    sim.sides[1].qp.post_recv(recv_wqe(1, r_key, r_base, 16));
    sim.sides[0]
        .qp
        .post_send(inline_wqe(1, WrOpcode::Send, b"first"));
    sim.sides[0].qp.post_send(send_wqe(
        2,
        WrOpcode::RdmaRead {
            remote_addr: b_base,
            rkey: b_key,
        },
        a_key,
        a_base,
        LEN as u32,
    ));
    sim.mute[1] = true;
    let stop = sim.now + Duration::from_micros(300);
    sim.run_until(stop);
    sim.now = sim.now.max(stop);
    sim.mute[1] = false;
    sim.run(Duration::from_secs(60));
    let got: Vec<(u64, WcStatus)> = sim.sides[0]
        .sends
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(got, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    let mut back = vec![0u8; LEN];
    sim.sides[0].mem.read_for_test(a_key, a_base, &mut back);
    assert!(back == data, "the READ placed every byte");
}

#[test]
fn posted_work_may_not_span_half_the_psn_space() {
    // Found in review: with PSNs given at post time, more than 2^23 PSNs of
    // posted work made ACKs look ancient (RETRY_EXC_ERR on a clean link),
    // and 2^24 made next_psn wrap onto the oldest unacknowledged PSN (a
    // silent hang). The verbs refuse such a post (ENOMEM) until completions
    // make room.
    let sim = Sim::new(1, LinkFaults::CLEAN);
    let mut qp = sim.sides.into_iter().next().unwrap().qp;
    let send = |length: u32| SendWqe {
        wr_id: 0,
        op: WrOpcode::Send,
        data: WqeData::Sges(smallvec![Sge {
            addr: 0,
            length,
            lkey: 1,
        }]),
        length,
        signaled: true,
        solicited: false,
        fence: false,
    };
    let gib = 1u32 << 30; // 2^20 packets at MTU 1024
    let mut posted = 0;
    while qp.psn_room(&WrOpcode::Send, gib).is_ok() {
        qp.post_send(send(gib));
        posted += 1;
    }
    assert_eq!(posted, 7, "7 × 2^20 packets fit under 2^23 - WINDOW");
    assert_eq!(qp.psn_room(&WrOpcode::Send, gib), Err(true));
    assert_eq!(
        qp.psn_room(&WrOpcode::Send, 1 << 20),
        Ok(()),
        "a smaller one still fits"
    );
    // 2^31 bytes at MTU 1024 is 2^21 packets: fine in itself. At MTU 256
    // it would be 2^23: never.
    let mut cfg = config(0x11, 0x22);
    cfg.mtu = 256;
    let mut small_mtu = RcQp::new(cfg.clone());
    small_mtu.enter_rtr(cfg.clone());
    small_mtu.enter_rts(cfg);
    assert_eq!(small_mtu.psn_room(&WrOpcode::Send, 1 << 31), Err(false));
}

#[test]
fn a_qp_in_err_sends_no_queued_read_responses() {
    // Found in review: after modify(ERR) the responder kept reading its MR
    // and streaming READ responses queued before.
    const LEN: usize = 256 * 1024;
    let mut sim = Sim::new(3, LinkFaults::CLEAN);
    let (a_key, a_base) = register(&sim.sides[0].mem, LEN, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, LEN, all_access());
    sim.sides[0].qp.post_send(send_wqe(
        1,
        WrOpcode::RdmaRead {
            remote_addr: b_base,
            rkey: b_key,
        },
        a_key,
        a_base,
        LEN as u32,
    ));
    let mut buf = vec![0u8; MTU as usize + 128];
    let n = sim.sides[0]
        .qp
        .poll_transmit(
            sim.now,
            &sim.sides[0].mem,
            &mut TxBuffer::copying(&mut buf),
            AckPolicy::Now,
        )
        .unwrap();
    let request = buf[..n].to_vec();
    let p = PacketRepr::parse(&request).unwrap();
    let side = &mut sim.sides[1];
    side.qp.handle_packet(&p, sim.now, &side.mem);
    side.qp.enter_error(); // modify_qp → ERR
    let mut sent = 0;
    while side
        .qp
        .poll_transmit(
            sim.now,
            &side.mem,
            &mut TxBuffer::copying(&mut buf),
            AckPolicy::Now,
        )
        .is_some()
    {
        sent += 1;
    }
    assert_eq!(sent, 0, "B in ERR still sent {sent} READ responses");
}

#[test]
fn a_nak_fails_the_wr_it_names_and_flushes_an_unanswered_read_before_it() {
    // B runs a READ and then refuses the WRITE behind it (bad rkey): it
    // moves to ERR before sending the READ's responses, and NAKs the
    // WRITE. A's READ never got its data: it is flushed, and the WRITE —
    // not the READ — reports REM_ACCESS_ERR. Found in review.
    let mut sim = Sim::new(4, LinkFaults::CLEAN);
    let (a_key, a_base) = register(&sim.sides[0].mem, 8192, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, 8192, all_access());
    let read = WrOpcode::RdmaRead {
        remote_addr: b_base,
        rkey: b_key,
    };
    let write = WrOpcode::RdmaWrite {
        remote_addr: b_base,
        rkey: b_key ^ 0x100,
    };
    for (wr_id, op) in [(1, read), (2, write)] {
        sim.sides[0].qp.post_send(SendWqe {
            wr_id,
            op,
            data: WqeData::Sges(smallvec![Sge {
                addr: a_base,
                length: 64,
                lkey: a_key,
            }]),
            length: 64,
            signaled: true,
            solicited: false,
            fence: false,
        });
    }
    sim.run(Duration::from_secs(10));
    let got: Vec<(u64, WcStatus)> = sim.sides[0]
        .sends
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        got,
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::RemAccessErr)]
    );
}
