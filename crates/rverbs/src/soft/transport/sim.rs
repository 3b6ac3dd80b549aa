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
use rverbs_wire::{Opcode, Operation, PacketRepr, Psn, RnrTimer, Transport};

use super::rc::{AckPolicy, RcConfig, RcQp};
use super::recv::SharedRq;
use smallvec::smallvec;

use super::{InlineData, Memory, QpEvent, RecvWqe, RxDrop, SendWqe, TxBuffer, WqeData};
use crate::attr::AccessFlags;
use crate::event::AsyncEventType;
use crate::soft::memory::{MrCore, MrState, MrTable, Region};
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};
use crate::wr::{QpState, Sge, WrOpcode};

mod atomic_write;
mod buggy_peer;
mod rd_atomic;

use buggy_peer::Forgery;
mod unsent;
mod window_read;

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
    /// Chance the sender — a buggy peer — also sends a well-formed but
    /// wrong packet made from this one (valid ICRC, parses fine: see
    /// [`buggy_peer`]).
    forge: f64,
}

impl LinkFaults {
    const CLEAN: LinkFaults = LinkFaults {
        loss: 0.0,
        duplicate: 0.0,
        reorder: 0.0,
        corrupt: 0.0,
        forge: 0.0,
    };
}

struct InFlight {
    at: Instant,
    seq: u64,
    to: usize,
    bytes: Vec<u8>,
    /// A buggy peer's wrong packet, and of what kind.
    forgery: Option<Forgery>,
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
    /// Wrong packets a buggy peer sent.
    forged: u64,
    /// Of those, lies withheld because the receiver could not have told
    /// them from the genuine packet (see [`buggy_peer`]).
    lies_withheld: u64,
    /// The BTH opcode of every packet each side transmitted, before the
    /// link's faults (lost ones too).
    tx_opcodes: [Vec<u8>; 2],
    /// Each side's QP cuts its messages into packets of this many bytes
    /// instead of the MTU, as over a same-host ring, which says so with
    /// each packet.
    segments: [Option<u32>; 2],
}

fn config(qpn: u32, dest: u32) -> RcConfig {
    RcConfig {
        transport: rverbs_wire::Transport::Rc,
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
            forged: 0,
            lies_withheld: 0,
            tx_opcodes: [Vec::new(), Vec::new()],
            segments: [None, None],
        }
    }

    /// Both QPs segment at `bytes` (see [`Sim::segments`]).
    fn with_segment(self, bytes: u32) -> Sim {
        self.with_segments([Some(bytes), Some(bytes)])
    }

    /// Each side's QP segments as `segments` says (`None`: at the MTU).
    fn with_segments(mut self, segments: [Option<u32>; 2]) -> Sim {
        for (side, seg) in self.sides.iter_mut().zip(segments) {
            side.qp.set_segment(seg, super::rc::WINDOW);
        }
        self.segments = segments;
        self
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
        self.tx_opcodes[from].push(bytes[0]);
        let f = self.faults[from];
        if self.mute[from] {
            return;
        }
        // (No random draw without a buggy peer: honest seeds stay as they were.)
        if f.forge > 0.0 && self.rng.chance(f.forge) {
            self.send_forgery(from, &bytes);
        }
        if self.rng.chance(f.loss) {
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
                forgery: None,
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
        if pkt.forgery == Some(Forgery::Lie) && self.indistinguishable(&p, pkt.to) {
            self.lies_withheld += 1;
            return;
        }
        self.delivered += 1;
        let side = &mut self.sides[pkt.to];
        // A QP that went to ERR drops what still arrives; the contract
        // checks see to the rest.
        let sent_by = self.segments[1 - pkt.to];
        let _ = side.qp.handle_packet(&p, self.now, &side.mem, sent_by);
    }

    fn drain_events(&mut self) {
        for side in &mut self.sides {
            while let Some(e) = side.qp.poll_event() {
                match e {
                    QpEvent::SendCompletion(wc) => side.sends.push(wc),
                    QpEvent::RecvCompletion(wc, se) => side.recvs.push((wc, se)),
                    QpEvent::Async(a) => side.events.push(a),
                    QpEvent::SrqLimitReached => side.events.push(AsyncEventType::SrqLimitReached),
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
        let largest = self.segments.iter().flatten().copied().max().unwrap_or(MTU);
        let mut buf = vec![0u8; largest.max(MTU) as usize + 128];
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
        pd: PD,
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
    /// WR `at` failed with `status`, another error: only a buggy peer's
    /// wrong packets may cause that (see [`buggy_peer`]).
    Failed { at: usize, status: WcStatus },
}

/// A mix of SENDs (with and without immediate), RDMA WRITEs, READs and
/// fetch-and-adds from A to B under `faults`, then checks the RC contract:
/// completions one per WR and in order; every WR that completed successfully
/// took effect exactly once, intact; nothing took effect twice or out of
/// order; and if the requester gave up, it was with RETRY_EXC_ERR followed
/// by flushes. With a buggy peer ([`LinkFaults::forge`]) the requester may
/// also fail with another error, an ACK's lie may complete a SEND or WRITE
/// that never arrived, and either side may end in ERR; but a READ or
/// atomic that succeeded holds exactly the peer's bytes, and no buffer
/// ever holds a byte no genuine packet carried.
fn mixed_traffic(seed: u64, faults: LinkFaults, count: usize) -> (Sim, Outcome) {
    mixed_traffic_in(Sim::new(seed, faults), seed, count)
}

/// [`mixed_traffic`] over `sim` as it was built (its configurations and faults).
fn mixed_traffic_in(mut sim: Sim, seed: u64, count: usize) -> (Sim, Outcome) {
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
            pd: PD,
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

    let buggy = sim.faults.iter().any(|f| f.forge > 0.0);
    let a = &sim.sides[0];
    let b = &sim.sides[1];
    // A requester within its max_rd_atomic never exceeds the responder's
    // resources, whatever the link did.
    assert_eq!(b.qp.counters.rd_atomic_over_limit, 0, "seed {seed}");
    // One completion per WR, in order.
    let ids: Vec<u64> = a.sends.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..count as u64).collect::<Vec<_>>(), "seed {seed}");
    let ok = a
        .sends
        .iter()
        .take_while(|w| w.status == WcStatus::Success)
        .count();
    let outcome = if ok == count {
        assert!(
            a.qp.state() == QpState::Rts || buggy,
            "seed {seed}: {:?}",
            a.qp.state()
        );
        Outcome::Completed
    } else if !buggy {
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
    } else {
        // One WR failed with an error (those before it that were still in
        // flight may be flushed first), the rest were flushed.
        let errors: Vec<(usize, WcStatus)> = a.sends[ok..]
            .iter()
            .enumerate()
            .map(|(k, w)| (ok + k, w.status))
            .filter(|&(_, st)| st != WcStatus::WrFlushErr)
            .collect();
        assert!(errors.len() <= 1, "seed {seed}: {errors:?}");
        assert!(
            errors.iter().all(|&(_, st)| st != WcStatus::Success),
            "seed {seed}: a success after a failure: {errors:?}"
        );
        assert_eq!(a.qp.state(), QpState::Err, "seed {seed}");
        match errors.first() {
            Some(&(at, WcStatus::RetryExcErr)) => Outcome::GaveUp { at },
            Some(&(at, status)) => Outcome::Failed { at, status },
            None => Outcome::Failed {
                at: ok,
                status: WcStatus::WrFlushErr,
            },
        }
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
    // Receive WRs complete in order; a buggy peer's run may end with B in
    // ERR, flushing the rest (posted one per message, SENDs or not).
    let received = b
        .recvs
        .iter()
        .take_while(|(wc, _)| wc.status == WcStatus::Success)
        .count();
    assert!(
        b.recvs[received..]
            .iter()
            .all(|(wc, _)| wc.status == WcStatus::WrFlushErr && buggy),
        "seed {seed}: receive completions {:?}",
        b.recvs.iter().map(|(wc, _)| wc.status).collect::<Vec<_>>()
    );
    assert!(
        (received >= must_recv || buggy) && received <= recv_msgs.len(),
        "seed {seed}: {received} receives"
    );
    for (k, (wc, se)) in b.recvs[..received].iter().enumerate() {
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
                if i < ok && !buggy {
                    assert_eq!(&got, data, "seed {seed} msg {i}: RDMA WRITE");
                }
                // Never a byte no genuine packet carried (the target was 0).
                assert!(
                    got.iter().zip(data).all(|(g, d)| g == d || *g == 0),
                    "seed {seed} msg {i}: RDMA WRITE placed fabricated bytes"
                );
            }
            Expect::Read { addr, data } => {
                let got = read(&a.mem, a_key, *addr, data.len());
                if i < ok {
                    assert_eq!(&got, data, "seed {seed} msg {i}: RDMA READ");
                }
                // Unfinished, it holds some of the peer's bytes at most.
                assert!(
                    got.iter().zip(data).all(|(g, d)| g == d || *g == 0),
                    "seed {seed} msg {i}: RDMA READ placed fabricated bytes"
                );
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
                    // The genuine original value is 0, as the buffer was.
                    assert_eq!(
                        read(&a.mem, a_key, *result, 8),
                        [0; 8],
                        "seed {seed} msg {i}: a fabricated original value"
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
            forge: 0.0,
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

/// Same-host segments (larger than the MTU, and no multiple of it): every
/// kind of traffic still completes, byte for byte, through loss,
/// duplication and reordering.
#[test]
fn same_host_segments_survive_a_faulty_link() {
    let mut gave_up = 0;
    for seed in 0..30u64 {
        let faults = LinkFaults {
            loss: (seed % 3) as f64 * 0.05,
            duplicate: 0.05,
            reorder: 0.1,
            corrupt: 0.0,
            forge: 0.0,
        };
        let sim = Sim::new(seed, faults).with_segment(3 * MTU - 200);
        let (_, outcome) = mixed_traffic_in(sim, seed, 40);
        gave_up += u32::from(outcome != Outcome::Completed);
    }
    assert!(gave_up <= 1, "{gave_up} of 30 runs ran out of retries");
}

/// One side segments for the same-host path, the other at the MTU (its
/// QP entered RTR before the link existed): every kind of traffic still
/// completes, READ responses cut by each requester's own segment.
#[test]
fn mismatched_segments_still_agree() {
    for seed in 0..12u64 {
        let faults = LinkFaults {
            loss: (seed % 3) as f64 * 0.03,
            duplicate: 0.02,
            reorder: 0.05,
            corrupt: 0.0,
            forge: 0.0,
        };
        let segments = if seed % 2 == 0 {
            [Some(3 * MTU - 200), None]
        } else {
            [None, Some(4 * MTU)]
        };
        let sim = Sim::new(seed, faults).with_segments(segments);
        let (_, outcome) = mixed_traffic_in(sim, seed, 40);
        assert_eq!(
            outcome,
            Outcome::Completed,
            "seed {seed}, segments {segments:?}"
        );
    }
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
            forge: 0.0,
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

/// Side 0 SENDs 16 bytes to side 1 (which has a receive posted), both
/// with IBTA `timeout` 12 (16.8 ms).
fn one_send_with_timeout_12(seed: u64) -> Sim {
    let [mut a, mut b] = [config(0x11, 0x22), config(0x22, 0x11)];
    a.timeout = RcConfig::timeout_for(12);
    b.timeout = a.timeout;
    let mut sim = Sim::with_configs(seed, LinkFaults::CLEAN, a, b);
    let (a_key, a_base) = register(&sim.sides[0].mem, 8192, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, 8192, all_access());
    sim.sides[1].qp.post_recv(recv_wqe(9, b_key, b_base, 64));
    sim.sides[0]
        .qp
        .post_send(send_wqe(1, WrOpcode::Send, a_key, a_base, 16));
    sim
}

/// SEND ONLY packets side 0 transmitted.
fn sends_transmitted(sim: &Sim) -> usize {
    let send_only = Opcode::RC_SEND_ONLY.0;
    sim.tx_opcodes[0]
        .iter()
        .filter(|&&o| o == send_only)
        .count()
}

/// A peer whose answers stop for a little longer than `timeout` (a host
/// that kept it off the cores) is resent to once: the IBTA timer waits
/// for the adaptive timer's resend. (Before, the IBTA timer of the first
/// send resent again 7 ms after the adaptive one, and a CI run counted
/// both against one 19 ms host stall.)
#[test]
fn a_peer_silent_a_little_past_timeout_is_resent_to_once() {
    let mut sim = one_send_with_timeout_12(21);
    let timeout = RcConfig::timeout_for(12).unwrap();
    // Its ACKs are lost until a little past `timeout`.
    sim.mute[1] = true;
    assert!(!sim.run_until(sim.start + timeout + Duration::from_millis(2)));
    assert_eq!(sends_transmitted(&sim), 2, "the first send and one resend");
    assert_eq!(sim.sides[0].qp.counters.timeouts, 1);
    // Its answers come back: the next resend is acknowledged.
    sim.mute[1] = false;
    sim.run(Duration::from_secs(5));
    assert_eq!(sim.sides[0].sends.len(), 1);
    assert_eq!(sim.sides[0].sends[0].status, WcStatus::Success);
    assert_eq!(sim.sides[1].recvs.len(), 1, "delivered once");
    assert_eq!(sim.sides[1].recvs[0].0.byte_len, 16);
}

/// Waiting for the adaptive timer's resends, the IBTA timer still spends
/// a dead peer's retries, each at most one adaptive timeout late:
/// RETRY_EXC_ERR after the 8th expiry, well within the 4× `timeout` per
/// expiry IBTA allows.
#[test]
fn a_dead_peer_spends_its_retries_a_timeout_apart() {
    let mut sim = one_send_with_timeout_12(22);
    let timeout = RcConfig::timeout_for(12).unwrap();
    sim.mute[1] = true;
    sim.run(Duration::from_secs(60));
    let a = &sim.sides[0];
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(a.sends.len(), 1);
    assert_eq!(a.sends[0].status, WcStatus::RetryExcErr);
    // retry_cnt 7: eight IBTA expiries, each at most 2 × `timeout` after
    // the one before (the first after the send).
    let elapsed = sim.now - sim.start;
    assert!(
        elapsed >= timeout * 8 && elapsed <= timeout * 16,
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
        forge: 0.0,
    };
    sim.faults[0] = LinkFaults {
        loss: 0.0,
        duplicate: 0.5,
        reorder: 0.3,
        corrupt: 0.0,
        forge: 0.0,
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
            forge: 0.0,
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
            forge: 0.0,
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
    while qp.psn_room_after(&WrOpcode::Send, gib, 0).is_ok() {
        qp.post_send(send(gib));
        posted += 1;
    }
    assert_eq!(posted, 7, "7 × 2^20 packets fit under 2^23 - WINDOW");
    assert_eq!(qp.psn_room_after(&WrOpcode::Send, gib, 0), Err(true));
    assert_eq!(
        qp.psn_room_after(&WrOpcode::Send, 1 << 20, 0),
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
    assert_eq!(
        small_mtu.psn_room_after(&WrOpcode::Send, 1 << 31, 0),
        Err(false)
    );
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
    side.qp
        .handle_packet(&p, sim.now, &side.mem, sim.segments[0])
        .unwrap();
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

// ---- UC, and receive WRs from shared receive queues ------------------------

/// The QP numbers of the two sides in every [`Sim`].
const QPN: [u32; 2] = [0x11, 0x22];

fn uc_config(qpn: u32, dest: u32) -> RcConfig {
    RcConfig {
        transport: Transport::Uc,
        ..config(qpn, dest)
    }
}

impl Sim {
    /// Two UC QPs.
    fn uc(seed: u64, faults: LinkFaults) -> Sim {
        Sim::with_configs(
            seed,
            faults,
            uc_config(QPN[0], QPN[1]),
            uc_config(QPN[1], QPN[0]),
        )
    }

    /// Rebuilds side `i`'s QP, with the same configuration and in RTS, to
    /// take its receive WRs from `srq`.
    fn use_srq(&mut self, i: usize, srq: &SharedRq) {
        let side = &mut self.sides[i];
        let cfg = side.qp.config_mut().clone();
        let mut qp = RcQp::with_srq(cfg.clone(), Some(srq.clone()));
        qp.enter_rtr(cfg.clone());
        qp.enter_rts(cfg);
        side.qp = qp;
    }

    /// Every packet side `from` has to send now, taken off it instead of
    /// going on the link.
    fn take_packets(&mut self, from: usize) -> Vec<Vec<u8>> {
        self.take_packets_built(from, false)
    }

    /// [`take_packets`](Self::take_packets), the payloads copied in as
    /// the packets are built or (`zero_copy`) described by reference and
    /// fetched after, as the engine does.
    fn take_packets_built(&mut self, from: usize, zero_copy: bool) -> Vec<Vec<u8>> {
        let mut buf = vec![0u8; MTU as usize + 128];
        let mut refs = Vec::new();
        let mut out = Vec::new();
        let side = &mut self.sides[from];
        loop {
            refs.clear();
            let mut tx = TxBuffer {
                bytes: &mut buf,
                refs: zero_copy.then_some(&mut refs),
            };
            let Some(n) = side
                .qp
                .poll_transmit(self.now, &side.mem, &mut tx, AckPolicy::Now)
            else {
                break;
            };
            for r in &refs {
                let dst = &mut buf[r.at as usize..(r.at + r.len) as usize];
                Memory::read(&side.mem, r.key, r.va, r.pd, r.kind, dst).unwrap();
            }
            out.push(buf[..n].to_vec());
        }
        self.drain_events();
        out
    }

    /// Hands `pkt` straight to side `to`, as if it arrived intact.
    fn hand_over(&mut self, to: usize, pkt: &[u8]) {
        let p = PacketRepr::parse(pkt).expect("a packet the QP built parses");
        let side = &mut self.sides[to];
        let _ = side.qp.handle_packet(&p, self.now, &side.mem, None); // ERR drops it
        self.drain_events();
    }
}

/// Whether `op` is a UC SEND or RDMA WRITE opcode: anything else from a UC
/// QP — an ACK or NAK above all — is wrong.
fn is_uc_request(op: u8) -> bool {
    Opcode(op).info().is_some_and(|i| {
        i.transport == Transport::Uc
            && matches!(i.operation, Operation::Send | Operation::RdmaWrite)
    })
}

/// Each side's 2 MiB MR in the stream tests, in 4 KiB slots: message
/// sources (slot = message index), RDMA WRITE targets (slot = message
/// index) and receive buffers (slot = receive WR index).
const SLOT: u64 = 4096;
const SRC_AREA: u64 = 0;
const DST_AREA: u64 = 512 << 10;
const RECV_AREA: u64 = 1 << 20;

/// A 2 MiB MR on each side, laid out as above.
fn stream_mrs(sim: &Sim) -> [(u32, u64); 2] {
    [0, 1].map(|i| register(&sim.sides[i].mem, 2 << 20, all_access()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send { imm: Option<u32> },
    WriteImm { imm: u32 },
    Write,
}

#[derive(Debug)]
struct Msg {
    kind: Kind,
    data: Vec<u8>,
    solicited: bool,
}

/// Messages from side `from` to the other, and the receive WRs posted
/// there for them: the k-th posted has wr_id 1000 + k and receive buffer
/// slot k. Receive WRs are taken in the order posted (a WR UC took for a
/// message it then dropped goes back to the head), so the k-th receive
/// completion must be WR 1000 + k.
struct Stream {
    from: usize,
    mrs: [(u32, u64); 2],
    /// Where the receiving side's WRs go (its own queue if `None`).
    srq: Option<SharedRq>,
    msgs: Vec<Msg>,
    recvs_posted: u64,
}

impl Stream {
    fn new(from: usize, mrs: [(u32, u64); 2], srq: Option<SharedRq>) -> Stream {
        Stream {
            from,
            mrs,
            srq,
            msgs: Vec::new(),
            recvs_posted: 0,
        }
    }

    fn to(&self) -> usize {
        1 - self.from
    }

    /// How many of the messages from `first` on take a receive WR.
    fn takes_recv(&self, first: usize) -> usize {
        self.msgs[first..]
            .iter()
            .filter(|m| m.kind != Kind::Write)
            .count()
    }

    /// Posts `n` more receive WRs at the receiving side (to its SRQ if any).
    fn post_recvs(&mut self, sim: &mut Sim, n: usize) {
        let to = self.to();
        let (key, base) = self.mrs[to];
        for _ in 0..n {
            let k = self.recvs_posted;
            assert!(k < 256, "out of receive buffer slots");
            let wqe = recv_wqe(1000 + k, key, base + RECV_AREA + k * SLOT, SLOT as u32);
            match &self.srq {
                Some(srq) => srq.lock().wqes.push_back(wqe),
                None => sim.sides[to].qp.post_recv(wqe),
            }
            self.recvs_posted += 1;
        }
    }

    /// Posts message `kind` of `len` bytes (wr_id = its index; tiny ones inline).
    fn post(&mut self, sim: &mut Sim, kind: Kind, len: usize) {
        let i = self.msgs.len();
        assert!(i < 128 && len as u64 <= SLOT, "out of message slots");
        let (key, base) = self.mrs[self.from];
        let (rkey, rbase) = self.mrs[self.to()];
        let data = message(i + 128 * self.from, len);
        let src = base + SRC_AREA + i as u64 * SLOT;
        sim.sides[self.from].mem.write_for_test(key, src, &data);
        let remote_addr = rbase + DST_AREA + i as u64 * SLOT;
        let op = match kind {
            Kind::Send { imm: None } => WrOpcode::Send,
            Kind::Send { imm: Some(imm) } => WrOpcode::SendWithImm { imm },
            Kind::WriteImm { imm } => WrOpcode::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
            Kind::Write => WrOpcode::RdmaWrite { remote_addr, rkey },
        };
        let mut wqe = if len <= 7 {
            inline_wqe(i as u64, op, &data)
        } else {
            send_wqe(i as u64, op, key, src, len as u32)
        };
        let solicited = i % 3 == 0;
        wqe.solicited = solicited;
        sim.sides[self.from].qp.post_send(wqe);
        self.msgs.push(Msg {
            kind,
            data,
            solicited,
        });
    }

    /// Posts `n` messages of random kinds and sizes, some of several packets.
    fn post_random(&mut self, sim: &mut Sim, rng: &mut Rng, n: usize) {
        for _ in 0..n {
            let i = self.msgs.len() as u32;
            let len = [0usize, 1, 7, 1023, 1024, 1025, 2048, 3000, 4096][rng.below(9) as usize];
            let imm = 0x5a00_0000 | (self.from as u32) << 16 | i;
            let kind = match rng.below(5) {
                0 | 1 => Kind::Send { imm: None },
                2 => Kind::Send { imm: Some(imm) },
                3 => Kind::WriteImm { imm },
                _ => Kind::Write,
            };
            self.post(sim, kind, len);
        }
    }

    /// Checks what messages `first_msg..` left at the receiving side,
    /// against its receive completions from `first_recv` on, and returns
    /// the indices of the messages that arrived:
    /// - every send WR of the stream completed successfully, once, in order;
    /// - each receive completion is one whole message sent (byte_len, imm,
    ///   opcode, solicited bit and every byte equal), later than the one
    ///   before it: never partial, spliced, duplicated or out of order;
    /// - `exact`: every message that takes a receive WR arrived, and every
    ///   plain RDMA WRITE's bytes are in place.
    fn check(
        &self,
        sim: &Sim,
        first_msg: usize,
        first_recv: usize,
        exact: bool,
        what: &str,
    ) -> Vec<usize> {
        let (from, to) = (&sim.sides[self.from], &sim.sides[self.to()]);
        let sends: Vec<(u64, WcStatus, WcOpcode)> = from
            .sends
            .iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect();
        let want: Vec<(u64, WcStatus, WcOpcode)> = self
            .msgs
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let op = match m.kind {
                    Kind::Send { .. } => WcOpcode::Send,
                    _ => WcOpcode::RdmaWrite,
                };
                (i as u64, WcStatus::Success, op)
            })
            .collect();
        assert_eq!(sends, want, "{what}: send completions");
        let (rkey, rbase) = self.mrs[self.to()];
        let read = |addr: u64, len: usize| {
            let mut v = vec![0u8; len];
            to.mem.read_for_test(rkey, addr, &mut v);
            v
        };
        let mut next = first_msg;
        let mut arrived = Vec::new();
        for (k, (wc, se)) in to.recvs.iter().enumerate().skip(first_recv) {
            assert_eq!(wc.status, WcStatus::Success, "{what}: receive {k}: {wc:?}");
            assert_eq!(
                wc.wr_id,
                1000 + k as u64,
                "{what}: receive WRs are taken in the order posted"
            );
            assert_eq!(
                (wc.qp_num, wc.src_qp),
                (QPN[self.to()], QPN[self.from]),
                "{what}: receive {k}"
            );
            let buf = rbase + RECV_AREA + k as u64 * SLOT;
            let is = |i: usize| {
                let m = &self.msgs[i];
                if m.data.len() != wc.byte_len as usize || m.solicited != *se {
                    return false;
                }
                match m.kind {
                    Kind::Write => false,
                    Kind::Send { imm } => {
                        wc.opcode == WcOpcode::Recv
                            && wc.imm() == imm
                            && read(buf, m.data.len()) == m.data
                    }
                    Kind::WriteImm { imm } => {
                        let dst = rbase + DST_AREA + i as u64 * SLOT;
                        wc.opcode == WcOpcode::RecvRdmaWithImm
                            && wc.imm() == Some(imm)
                            && read(dst, m.data.len()) == m.data
                    }
                }
            };
            let mut candidates =
                (next..self.msgs.len()).filter(|&i| self.msgs[i].kind != Kind::Write);
            let found = if exact {
                candidates.next().filter(|&i| is(i))
            } else {
                candidates.find(|&i| is(i))
            };
            let Some(i) = found else {
                panic!(
                    "{what}: receive {k} ({wc:?}) is no whole message sent from message \
                     {next} on (partial, spliced, duplicated or out of order)"
                )
            };
            arrived.push(i);
            next = i + 1;
        }
        if exact {
            assert_eq!(
                arrived.len(),
                self.takes_recv(first_msg),
                "{what}: every message arrived"
            );
            for (i, m) in self.msgs.iter().enumerate().skip(first_msg) {
                if m.kind == Kind::Write {
                    let dst = rbase + DST_AREA + i as u64 * SLOT;
                    assert!(read(dst, m.data.len()) == m.data, "{what}: RDMA WRITE {i}");
                }
            }
        }
        arrived
    }
}

/// Receive WRs side `i` holds: its own queue, the message in progress,
/// and its SRQ's.
fn recvs_queued(sim: &Sim, i: usize, srq: Option<&SharedRq>) -> usize {
    sim.sides[i].qp.rq_len() + srq.map_or(0, |s| s.lock().wqes.len())
}

/// What one [`uc_traffic`] run saw of its lossy part.
#[derive(Default)]
struct UcTally {
    /// Messages that needed a receive WR.
    sent: usize,
    arrived: usize,
    /// Of them, messages of several packets.
    long_arrived: usize,
}

/// UC both ways under `faults` (each side on a SharedRq if `srq`, with an
/// armed limit), then more traffic on a clean link, which must all arrive
/// whatever the lossy part left half done. Checks the UC contract with
/// [`Stream::check`], that no side ever sent anything but UC requests,
/// that receive WRs are never lost (completed + still queued = posted),
/// and that an SRQ limit fires at most once, exactly when the SRQ fell
/// below it.
fn uc_traffic(seed: u64, faults: LinkFaults, srq: bool) -> UcTally {
    let mut sim = Sim::uc(seed, faults);
    let mut rng = Rng::new(seed ^ 0x5eed);
    let mrs = stream_mrs(&sim);
    // srqs[i] is side i's.
    let srqs = [SharedRq::new(256, 0), SharedRq::new(256, 0)];
    if srq {
        sim.use_srq(0, &srqs[0]);
        sim.use_srq(1, &srqs[1]);
    }
    let mut streams =
        [0, 1].map(|from| Stream::new(from, mrs, srq.then(|| srqs[1 - from].clone())));
    let mut limits = [0u32; 2];
    for (s, n) in streams.iter_mut().zip([40, 24]) {
        s.post_random(&mut sim, &mut rng, n);
        let need = s.takes_recv(0);
        s.post_recvs(&mut sim, need + 2);
        if let Some(q) = &s.srq {
            // Fires once six WRs were taken.
            let limit = (need + 2).saturating_sub(5) as u32;
            q.lock().limit = limit;
            limits[s.to()] = limit;
        }
    }
    sim.run(Duration::from_secs(60));
    let exact = faults.loss == 0.0 && faults.reorder == 0.0 && faults.corrupt == 0.0;
    let mut tally = UcTally::default();
    let mut firsts = [(0, 0); 2];
    for (n, s) in streams.iter_mut().enumerate() {
        let what = format!("seed {seed} stream {n} ({faults:?}, srq {srq})");
        let arrived = s.check(&sim, 0, 0, exact, &what);
        tally.sent += s.takes_recv(0);
        tally.arrived += arrived.len();
        tally.long_arrived += arrived
            .iter()
            .filter(|&&i| s.msgs[i].data.len() > MTU as usize)
            .count();
        firsts[n] = (s.msgs.len(), sim.sides[s.to()].recvs.len());
    }
    // A clean link: the next messages all arrive.
    sim.faults = [LinkFaults::CLEAN; 2];
    for s in &mut streams {
        let first = s.msgs.len();
        s.post_random(&mut sim, &mut rng, 16);
        let need = s.takes_recv(first);
        s.post_recvs(&mut sim, need);
    }
    sim.run(Duration::from_secs(120));
    for (n, s) in streams.iter().enumerate() {
        let what = format!("seed {seed} stream {n} (clean after {faults:?}, srq {srq})");
        let (first_msg, first_recv) = firsts[n];
        s.check(&sim, first_msg, first_recv, true, &what);
        let to = s.to();
        assert_eq!(
            sim.sides[to].recvs.len() + recvs_queued(&sim, to, s.srq.as_ref()),
            s.recvs_posted as usize,
            "{what}: receive WRs completed + still queued = posted"
        );
    }
    for i in 0..2 {
        let what = format!("seed {seed} side {i} ({faults:?}, srq {srq})");
        assert_eq!(sim.sides[i].qp.state(), QpState::Rts, "{what}");
        assert!(!sim.tx_opcodes[i].is_empty(), "{what}");
        let bad: Vec<Opcode> = sim.tx_opcodes[i]
            .iter()
            .filter(|&&op| !is_uc_request(op))
            .map(|&op| Opcode(op))
            .collect();
        assert!(bad.is_empty(), "{what}: a UC QP sent {bad:?}");
        let events = &sim.sides[i].events;
        if !srq {
            assert!(events.is_empty(), "{what}: {events:?}");
            continue;
        }
        assert!(
            events.len() <= 1 && events.iter().all(|e| *e == AsyncEventType::SrqLimitReached),
            "{what}: {events:?}"
        );
        let fired = events.len() == 1;
        let q = srqs[i].lock();
        assert_eq!(q.limit == 0, fired, "{what}: a fired limit reads 0");
        if q.wqes.len() < limits[i] as usize {
            assert!(fired, "{what}: the SRQ fell below its limit");
        }
    }
    tally
}

#[test]
fn uc_under_loss_delivers_whole_messages_in_order_or_not_at_all() {
    // RVERBS_SIM_SEEDS runs more seeds (the CI run takes the default).
    let seeds: u64 = std::env::var("RVERBS_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let mut total = UcTally::default();
    for seed in 0..seeds {
        let faults = LinkFaults {
            loss: (seed % 5) as f64 * 0.05, // 0 … 20 %
            duplicate: 0.05,
            reorder: 0.1,
            corrupt: 0.02,
            forge: 0.0,
        };
        let t = uc_traffic(seed, faults, seed % 2 == 1);
        total.sent += t.sent;
        total.arrived += t.arrived;
        total.long_arrived += t.long_arrived;
    }
    // The faults really cost messages, and most still made it.
    assert!(
        total.arrived < total.sent,
        "{} of {} arrived",
        total.arrived,
        total.sent
    );
    assert!(
        total.arrived * 2 > total.sent,
        "{} of {} arrived",
        total.arrived,
        total.sent
    );
    assert!(total.long_arrived > 0);
}

#[test]
fn uc_on_a_clean_link_delivers_everything() {
    for seed in 0..8 {
        let faults = LinkFaults {
            duplicate: if seed % 4 < 2 { 0.0 } else { 0.2 },
            ..LinkFaults::CLEAN
        };
        let t = uc_traffic(seed, faults, seed % 2 == 1);
        assert_eq!(t.arrived, t.sent, "seed {seed}");
    }
}

#[test]
fn uc_never_splices_or_repeats_messages_whatever_packets_arrive() {
    // Messages of 3, 3 and 1 packets: packets 0 1 2 | 3 4 5 | 6.
    #[rustfmt::skip]
    let cases: &[(&[usize], &[usize])] = &[
        (&[0, 1, 2, 3, 4, 5, 6], &[0, 1, 2]),
        (&[0, 1, 3, 4, 5, 6], &[1, 2]),       // message 0's last packet lost
        (&[0, 2, 3, 4, 5, 6], &[1, 2]),       // its middle packet lost
        (&[0, 1, 2, 4, 5, 6], &[0, 2]),       // message 1's first packet lost
        (&[0, 2, 1, 3, 4, 5, 6], &[1, 2]),    // reordered within message 0
        (&[0, 1, 3, 2, 4, 5, 6], &[1, 2]),    // message 0's tail overtaken
        (&[0, 1, 4, 5, 6], &[2]),             // 0's head, then 1's tail
        (&[0, 1, 5, 6], &[2]),
        (&[3, 4, 5, 0, 1, 2, 6], &[1, 2]),    // message 1 overtakes message 0
        (&[0, 1, 2, 6, 3, 4, 5], &[0, 2]),    // message 2 overtakes message 1
        (&[0, 0, 1, 1, 2, 2, 3, 3, 4, 5, 5, 6, 6], &[0, 1, 2]), // duplicates
        (&[0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6], &[0, 1, 2]), // replayed
        (&[0, 1, 2, 3, 4, 5, 6, 3, 4, 5], &[0, 1, 2]),
        (&[], &[]),
    ];
    for middle in [Kind::Send { imm: Some(7) }, Kind::WriteImm { imm: 7 }] {
        for (arrive, want) in cases {
            let what = format!("{middle:?}, packets {arrive:?}");
            let mut sim = Sim::uc(1, LinkFaults::CLEAN);
            let mrs = stream_mrs(&sim);
            let mut s = Stream::new(0, mrs, None);
            s.post(&mut sim, Kind::Send { imm: None }, 3000);
            s.post(&mut sim, middle, 2100);
            s.post(&mut sim, Kind::Send { imm: None }, 10);
            s.post_recvs(&mut sim, 3);
            let pkts = sim.take_packets(0);
            assert_eq!(pkts.len(), 7);
            assert!(pkts.iter().all(|p| is_uc_request(p[0])), "{what}");
            for &p in *arrive {
                sim.hand_over(1, &pkts[p]);
            }
            assert_eq!(s.check(&sim, 0, 0, false, &what), *want, "{what}");
            assert!(
                sim.take_packets(1).is_empty(),
                "{what}: the UC responder sent something (an ACK or NAK?)"
            );
            assert_eq!(sim.sides[1].qp.state(), QpState::Rts, "{what}");
            assert!(sim.sides[1].events.is_empty(), "{what}");
            assert_eq!(
                sim.sides[1].recvs.len() + sim.sides[1].qp.rq_len(),
                3,
                "{what}: receive WRs completed + still queued = posted"
            );
        }
    }
}

/// RC and UC check the BTH's P_Key on receive: a packet of another
/// partition is dropped as `RxDrop::PKey` (the engine counts it as
/// `rx_bad_pkey`) before anything reads it; the same packet with the right
/// P_Key gets through.
#[test]
fn rc_and_uc_drop_a_packet_of_another_partition() {
    for uc in [false, true] {
        let mut sim = if uc {
            Sim::uc(4, LinkFaults::CLEAN)
        } else {
            Sim::new(4, LinkFaults::CLEAN)
        };
        let (b_key, b_base) = register(&sim.sides[1].mem, 4096, all_access());
        sim.sides[1].qp.post_recv(recv_wqe(1, b_key, b_base, 4096));
        sim.sides[0]
            .qp
            .post_send(inline_wqe(1, WrOpcode::Send, b"partition"));
        let pkts = sim.take_packets(0);
        assert_eq!(pkts.len(), 1, "uc {uc}");
        let mut forged = pkts[0].clone();
        forged[2..4].copy_from_slice(&0x1234u16.to_be_bytes());
        let p = PacketRepr::parse(&forged).unwrap();
        let side = &mut sim.sides[1];
        assert_eq!(
            side.qp
                .handle_packet(&p, sim.now, &side.mem, sim.segments[0]),
            Err(RxDrop::PKey),
            "uc {uc}"
        );
        sim.drain_events();
        assert!(sim.sides[1].recvs.is_empty(), "uc {uc}: delivered");
        let p = PacketRepr::parse(&pkts[0]).unwrap();
        let side = &mut sim.sides[1];
        assert_eq!(
            side.qp
                .handle_packet(&p, sim.now, &side.mem, sim.segments[0]),
            Ok(())
        );
        sim.drain_events();
        assert_eq!(sim.sides[1].recvs.len(), 1, "uc {uc}");
    }
}

/// A peer sweeping rkeys over UC gets no NAK, but the device counts every
/// refusal under its own reason (`uc_access_refused`), apart from the
/// other UC drops (`uc_dropped`).
#[test]
fn uc_access_refusals_are_counted_apart() {
    let mut sim = Sim::uc(3, LinkFaults::CLEAN);
    let (a_key, a_base) = register(&sim.sides[0].mem, 4096, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, 4096, all_access());
    const SWEEP: u32 = 16;
    for i in 0..SWEEP {
        let op = WrOpcode::RdmaWrite {
            remote_addr: b_base,
            rkey: b_key ^ ((i + 1) << 8),
        };
        sim.sides[0]
            .qp
            .post_send(send_wqe(u64::from(i), op, a_key, a_base, 100));
    }
    // And one past the end of B's MR.
    let op = WrOpcode::RdmaWrite {
        remote_addr: b_base + 4096 - 50,
        rkey: b_key,
    };
    sim.sides[0]
        .qp
        .post_send(send_wqe(99, op, a_key, a_base, 100));
    sim.run(Duration::from_secs(5));
    assert_eq!(sim.sides[0].sends.len(), SWEEP as usize + 1);
    let c = &sim.sides[1].qp.counters;
    assert_eq!(c.uc_access_refused, u64::from(SWEEP) + 1);
    assert_eq!(c.uc_dropped, 0, "no other reason");
    assert_eq!(sim.sides[1].qp.state(), QpState::Rts);
    assert!(
        sim.tx_opcodes[1].is_empty(),
        "the UC responder sent packets"
    );
}

/// Side A posts three 16-byte SENDs (B has a receive WR for each, wr_ids
/// from 100) and transmits them; the first is lost, B gets the other two
/// (early). The three packets A sent.
fn three_sends_first_lost(sim: &mut Sim) -> Vec<Vec<u8>> {
    let (a_key, a_base) = register(&sim.sides[0].mem, 4096, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, 4096, all_access());
    for k in 0..3u64 {
        sim.sides[1]
            .qp
            .post_recv(recv_wqe(100 + k, b_key, b_base + k * 64, 64));
        sim.sides[0]
            .qp
            .post_send(send_wqe(k, WrOpcode::Send, a_key, a_base, 16));
    }
    let sent = sim.take_packets(0);
    assert_eq!(sent.len(), 3);
    sim.hand_over(1, &sent[1]);
    sim.hand_over(1, &sent[2]);
    sent
}

/// Request packets that arrive ahead of the expected PSN (one before them
/// was lost) are dropped and counted, each one (`out_of_sequence`), with
/// one sequence NAK for the gap; once the missing packet comes, all are
/// taken in order.
#[test]
fn out_of_sequence_requests_are_counted() {
    let mut sim = Sim::new(4, LinkFaults::CLEAN);
    let sent = three_sends_first_lost(&mut sim);
    let c = &sim.sides[1].qp.counters;
    assert_eq!((c.out_of_sequence, c.seq_naks_sent), (2, 1));
    assert!(sim.sides[1].recvs.is_empty(), "taken out of order");
    // The missing one comes, and the rest again, in order.
    for p in &sent {
        sim.hand_over(1, p);
    }
    assert_eq!(sim.sides[1].recvs.len(), 3);
    let c = &sim.sides[1].qp.counters;
    assert_eq!((c.out_of_sequence, c.seq_naks_sent), (2, 1));
    assert_eq!(sim.sides[1].qp.state(), QpState::Rts);
}

#[test]
fn uc_errors_drop_the_message_and_the_qp_carries_on() {
    let mut sim = Sim::uc(2, LinkFaults::CLEAN);
    let (a_key, a_base) = register(&sim.sides[0].mem, 8192, all_access());
    let (b_key, b_base) = register(&sim.sides[1].mem, 16384, all_access());
    sim.sides[0]
        .mem
        .write_for_test(a_key, a_base, &message(1, 8192));
    // One 4 KiB receive WR.
    sim.sides[1]
        .qp
        .post_recv(recv_wqe(1000, b_key, b_base, 4096));
    let posts = [
        // A bad rkey.
        WrOpcode::RdmaWriteWithImm {
            remote_addr: b_base + 8192,
            rkey: b_key ^ 0x100,
            imm: 1,
        },
        // Past the end of B's MR.
        WrOpcode::RdmaWrite {
            remote_addr: b_base + 16384 - 50,
            rkey: b_key,
        },
        // 5000 bytes: too long for the receive WR.
        WrOpcode::Send,
        // Lands in receive WR 1000.
        WrOpcode::SendWithImm { imm: 4 },
        // No receive WR left: dropped silently (UC has no RNR).
        WrOpcode::Send,
        WrOpcode::RdmaWriteWithImm {
            remote_addr: b_base + 12288,
            rkey: b_key,
            imm: 5,
        },
    ];
    for (i, op) in posts.into_iter().enumerate() {
        let len = [100, 100, 5000, 50, 30, 64][i];
        sim.sides[0]
            .qp
            .post_send(send_wqe(i as u64, op, a_key, a_base, len));
    }
    sim.run(Duration::from_secs(5));
    let sends: Vec<(u64, WcStatus)> = sim.sides[0]
        .sends
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        sends,
        (0..6).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>(),
        "a UC send WR completes once sent"
    );
    let recvs: Vec<(u64, WcStatus, u32, Option<u32>)> = sim.sides[1]
        .recvs
        .iter()
        .map(|(w, _)| (w.wr_id, w.status, w.byte_len, w.imm()))
        .collect();
    assert_eq!(recvs, vec![(1000, WcStatus::Success, 50, Some(4))]);
    let mut got = vec![0u8; 50];
    sim.sides[1].mem.read_for_test(b_key, b_base, &mut got);
    assert_eq!(got, message(1, 50));
    let mut untouched = vec![0u8; 100];
    sim.sides[1]
        .mem
        .read_for_test(b_key, b_base + 8192, &mut untouched);
    assert!(
        untouched.iter().all(|&b| b == 0),
        "the bad-rkey WRITE wrote"
    );
    for i in 0..2 {
        assert_eq!(sim.sides[i].qp.state(), QpState::Rts, "side {i}");
        assert!(
            sim.sides[i].events.is_empty(),
            "side {i}: {:?}",
            sim.sides[i].events
        );
    }
    assert!(
        sim.tx_opcodes[1].is_empty(),
        "the UC responder sent packets"
    );
    // It carries on once a receive WR is there.
    sim.sides[1]
        .qp
        .post_recv(recv_wqe(1001, b_key, b_base + 4096, 4096));
    sim.sides[0]
        .qp
        .post_send(inline_wqe(6, WrOpcode::SendWithImm { imm: 6 }, b"again"));
    sim.run(Duration::from_secs(10));
    let last = sim.sides[1]
        .recvs
        .last()
        .map(|(w, _)| (w.wr_id, w.byte_len, w.imm()));
    assert_eq!(last, Some((1001, 5, Some(6))));
    assert_eq!(sim.sides[1].recvs.len(), 2);
}

#[test]
fn rc_on_shared_receive_queues_delivers_exactly_once_and_fires_the_limit_once() {
    for seed in 0..20 {
        let faults = LinkFaults {
            loss: (seed % 3) as f64 * 0.05,
            duplicate: 0.05,
            reorder: 0.1,
            corrupt: 0.02,
            forge: 0.0,
        };
        let mut sim = Sim::new(seed, faults);
        let mut rng = Rng::new(seed ^ 0x7777);
        let srqs = [SharedRq::new(128, 0), SharedRq::new(128, 0)];
        sim.use_srq(0, &srqs[0]);
        sim.use_srq(1, &srqs[1]);
        let mrs = stream_mrs(&sim);
        let mut streams = [0, 1].map(|from| Stream::new(from, mrs, Some(srqs[1 - from].clone())));
        for s in &mut streams {
            s.post_random(&mut sim, &mut rng, 40);
            let need = s.takes_recv(0);
            s.post_recvs(&mut sim, need + 10);
        }
        // Ten WRs are left at the end: B's limit of 15 is crossed, A's of 5 not.
        srqs[1].lock().limit = 15;
        srqs[0].lock().limit = 5;
        sim.run(Duration::from_secs(600));
        for (n, s) in streams.iter().enumerate() {
            s.check(&sim, 0, 0, true, &format!("seed {seed} stream {n}"));
        }
        for (i, q) in srqs.iter().enumerate() {
            assert_eq!(q.lock().wqes.len(), 10, "seed {seed} side {i}");
            assert_eq!(
                sim.sides[i].qp.state(),
                QpState::Rts,
                "seed {seed} side {i}"
            );
        }
        assert_eq!(
            sim.sides[1].events,
            vec![AsyncEventType::SrqLimitReached],
            "seed {seed}"
        );
        assert_eq!(srqs[1].lock().limit, 0, "seed {seed}: the limit disarmed");
        assert_eq!(sim.sides[0].events, vec![], "seed {seed}");
        assert_eq!(srqs[0].lock().limit, 5, "seed {seed}: still armed");
        // B goes to ERR: LAST_WQE_REACHED, and its SRQ keeps its WRs.
        let received = sim.sides[1].recvs.len();
        sim.sides[1].qp.enter_error();
        sim.drain_events();
        assert_eq!(
            sim.sides[1].events,
            vec![
                AsyncEventType::SrqLimitReached,
                AsyncEventType::QpLastWqeReached
            ],
            "seed {seed}"
        );
        assert_eq!(sim.sides[1].recvs.len(), received, "seed {seed}: no flush");
        assert_eq!(srqs[1].lock().wqes.len(), 10, "seed {seed}");
    }
}

#[test]
fn rc_on_an_empty_srq_waits_out_rnr_until_a_wr_is_posted() {
    let mut sim = Sim::new(12, LinkFaults::CLEAN);
    let srq = SharedRq::new(16, 0);
    sim.use_srq(1, &srq);
    let mrs = stream_mrs(&sim);
    let mut s = Stream::new(0, mrs, Some(srq.clone()));
    s.post(&mut sim, Kind::Send { imm: None }, 100);
    s.post(&mut sim, Kind::Send { imm: Some(9) }, 2000);
    s.post(&mut sim, Kind::WriteImm { imm: 10 }, 300);
    let stop = sim.now + Duration::from_millis(2);
    sim.run_until(stop);
    sim.now = sim.now.max(stop);
    assert!(sim.sides[0].sends.is_empty(), "{:?}", sim.sides[0].sends);
    assert!(sim.sides[1].recvs.is_empty());
    assert!(sim.sides[1].qp.counters.rnr_naks_sent > 0);
    s.post_recvs(&mut sim, 3);
    sim.run(Duration::from_secs(60));
    s.check(&sim, 0, 0, true, "after RNR");
    assert!(srq.lock().wqes.is_empty());
    assert!(sim.sides[1].events.is_empty(), "{:?}", sim.sides[1].events);
}

#[test]
fn an_rc_qp_on_an_srq_in_err_flushes_only_the_wr_it_took() {
    let mut sim = Sim::new(13, LinkFaults::CLEAN);
    let srq = SharedRq::new(16, 0);
    sim.use_srq(1, &srq);
    let mrs = stream_mrs(&sim);
    let mut s = Stream::new(0, mrs, Some(srq.clone()));
    s.post(&mut sim, Kind::Send { imm: None }, 3000);
    s.post_recvs(&mut sim, 3);
    let pkts = sim.take_packets(0);
    assert_eq!(pkts.len(), 3);
    // B takes WR 1000 for the message, whose rest never comes.
    sim.hand_over(1, &pkts[0]);
    assert_eq!(srq.lock().wqes.len(), 2);
    sim.sides[1].qp.enter_error();
    sim.drain_events();
    let recvs: Vec<(u64, WcStatus)> = sim.sides[1]
        .recvs
        .iter()
        .map(|(w, _)| (w.wr_id, w.status))
        .collect();
    assert_eq!(recvs, vec![(1000, WcStatus::WrFlushErr)]);
    assert_eq!(sim.sides[1].events, vec![AsyncEventType::QpLastWqeReached]);
    let left: Vec<u64> = srq.lock().wqes.iter().map(|w| w.wr_id).collect();
    assert_eq!(left, vec![1001, 1002], "the SRQ's WRs stay with it");
    // Nothing more on a second move to ERR.
    sim.sides[1].qp.enter_error();
    sim.drain_events();
    assert_eq!(sim.sides[1].events.len(), 1);
    assert_eq!(sim.sides[1].recvs.len(), 1);
}

/// `pkt` with its BTH PSN moved back by `by`.
fn psn_earlier(pkt: &[u8], by: u32) -> Vec<u8> {
    let mut p = pkt.to_vec();
    let psn = u32::from_be_bytes([0, p[9], p[10], p[11]]);
    let psn = Psn::new(psn).sub(by).value();
    p[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
    p
}

#[test]
fn uc_a_message_cut_short_by_the_next_one_gives_its_wr_to_that_one() {
    // No PSN is missing, but message 1 starts where message 0's last packet
    // belongs (a sender that abandoned message 0): message 0 is dropped and
    // its receive WR taken by message 1.
    let mut sim = Sim::uc(3, LinkFaults::CLEAN);
    let mrs = stream_mrs(&sim);
    let mut s = Stream::new(0, mrs, None);
    s.post(&mut sim, Kind::Send { imm: None }, 3000);
    s.post(&mut sim, Kind::Send { imm: Some(1) }, 2100);
    s.post(&mut sim, Kind::Send { imm: None }, 10);
    s.post_recvs(&mut sim, 3);
    let pkts = sim.take_packets(0);
    assert_eq!(pkts.len(), 7);
    sim.hand_over(1, &pkts[0]);
    sim.hand_over(1, &pkts[1]);
    for p in &pkts[3..] {
        sim.hand_over(1, &psn_earlier(p, 1));
    }
    assert_eq!(s.check(&sim, 0, 0, false, "cut short"), vec![1, 2]);
    assert_eq!(sim.sides[1].recvs.len() + sim.sides[1].qp.rq_len(), 3);
    assert_eq!(sim.sides[1].qp.state(), QpState::Rts);
}

#[test]
fn uc_keeps_an_abandoned_srq_wr_and_the_srq_stays_within_max_wr() {
    // A UC QP on an SRQ takes a receive WR at a message's first packet (the
    // SRQ's slot frees, as in rxe), and the application may refill the SRQ
    // meanwhile. When the message then loses a packet, the QP keeps the WR
    // for its next message; it counts against max_wr, so posts are refused
    // until the SRQ is back within it.
    let mut sim = Sim::uc(4, LinkFaults::CLEAN);
    let srq = SharedRq::new(2, 0);
    sim.use_srq(1, &srq);
    let mrs = stream_mrs(&sim);
    let mut s = Stream::new(0, mrs, Some(srq.clone()));
    s.post(&mut sim, Kind::Send { imm: None }, 3000);
    s.post(&mut sim, Kind::Send { imm: None }, 10);
    s.post_recvs(&mut sim, 2);
    let pkts = sim.take_packets(0);
    assert_eq!(pkts.len(), 4);
    sim.hand_over(1, &pkts[0]); // WR 1000 taken for message 0
                                // The application refills the SRQ (what post_srq_recv checks first).
    let (key, base) = mrs[1];
    let post = |wr_id: u64| {
        let mut q = srq.lock();
        let room = q.occupied() < q.max_wr as usize;
        if room {
            q.wqes.push_back(recv_wqe(wr_id, key, base + RECV_AREA, 64));
        }
        room
    };
    assert!(post(1002), "WR 1000 is in use by message 0, not counted");
    // Message 0 loses its middle packet: dropped, WR 1000 kept by the QP.
    sim.hand_over(1, &pkts[2]);
    {
        let q = srq.lock();
        assert_eq!((q.wqes.len(), q.held), (2, 1));
        assert_eq!(q.occupied(), q.max_wr as usize + 1);
    }
    assert!(!post(1003), "the kept WR counts against max_wr");
    // The QP goes away (reset, destroy): the kept WR goes back to the SRQ,
    // first in line.
    sim.sides[1].qp.return_recv();
    let q = srq.lock();
    assert_eq!(q.held, 0);
    let ids: Vec<u64> = q.wqes.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [1000, 1001, 1002]);
}

/// A zero-length READ request as rxe and NICs send it — DMA length 0,
/// R_Key 0, VA 0; our requester puts the same on the wire for a
/// zero-length READ WR with rkey 0 at VA 0 — makes no key check (IBTA
/// C9-88): the responder answers with one READ RESPONSE ONLY carrying an
/// ACK and no payload, whether payloads are copied or sent by reference,
/// replays it for a duplicate, and stays in RTS; the requester's WR
/// completes with byte_len 0. One byte with the same key is still a
/// remote access error.
#[test]
fn a_zero_length_read_request_with_rkey_0_is_answered_without_a_key_check() {
    use rverbs_wire::{AethRepr, BthRepr, NakCode, RethRepr, Syndrome};
    for zero_copy in [false, true] {
        let what = if zero_copy { "by reference" } else { "copied" };
        let mut sim = Sim::new(12, LinkFaults::CLEAN);
        // B has an MR; the request names none.
        register(&sim.sides[1].mem, 4096, all_access());
        let psn = Psn::new(0xff_fff0);
        let mut bth = BthRepr::new(Opcode::RC_RDMA_READ_REQUEST, QPN[1], psn);
        bth.ack_req = true;
        let mut crafted = PacketRepr::new(bth);
        crafted.reth = Some(RethRepr {
            va: 0,
            rkey: 0,
            dma_len: 0,
        });
        let mut req = vec![0u8; crafted.buffer_len()];
        crafted.emit(&mut req).unwrap();
        sim.sides[0].qp.post_send(SendWqe {
            wr_id: 1,
            op: WrOpcode::RdmaRead {
                remote_addr: 0,
                rkey: 0,
            },
            data: WqeData::Sges(smallvec![]),
            length: 0,
            signaled: true,
            solicited: false,
            fence: false,
        });
        let ours = sim.take_packets(0);
        assert_eq!(ours, vec![req.clone()], "what our requester sends");
        let mut response = Vec::new();
        for round in ["new", "duplicate"] {
            sim.hand_over(1, &req);
            let out = sim.take_packets_built(1, zero_copy);
            assert_eq!(out.len(), 1, "{what}, {round}: {out:?}");
            let p = PacketRepr::parse(&out[0]).unwrap();
            assert_eq!(
                (p.bth.opcode, p.bth.psn, p.payload.len()),
                (Opcode::RC_RDMA_READ_RESPONSE_ONLY, psn, 0),
                "{what}, {round}"
            );
            assert!(
                matches!(
                    p.aeth,
                    Some(AethRepr {
                        syndrome: Syndrome::Ack { .. },
                        ..
                    })
                ),
                "{what}, {round}: {:?}",
                p.aeth
            );
            assert_eq!(sim.sides[1].qp.state(), QpState::Rts, "{what}, {round}");
            assert!(sim.sides[1].events.is_empty(), "{what}, {round}");
            response = out[0].clone();
        }
        sim.hand_over(0, &response);
        let wcs: Vec<_> = sim.sides[0]
            .sends
            .iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect();
        assert_eq!(
            wcs,
            vec![(1, WcStatus::Success, WcOpcode::RdmaRead, 0)],
            "{what}"
        );
        // One byte through the same key: NAK remote access error.
        crafted.bth.psn = psn.next();
        crafted.reth = Some(RethRepr {
            va: 0,
            rkey: 0,
            dma_len: 1,
        });
        let mut req = vec![0u8; crafted.buffer_len()];
        crafted.emit(&mut req).unwrap();
        sim.hand_over(1, &req);
        let out = sim.take_packets_built(1, zero_copy);
        let naks: Vec<_> = out
            .iter()
            .map(|b| {
                let p = PacketRepr::parse(b).unwrap();
                (p.bth.opcode, p.bth.psn, p.aeth.map(|a| a.syndrome))
            })
            .collect();
        assert_eq!(
            naks,
            vec![(
                Opcode::RC_ACKNOWLEDGE,
                psn.next(),
                Some(Syndrome::Nak(NakCode::RemoteAccessError))
            )],
            "{what}"
        );
        assert_eq!(sim.sides[1].qp.state(), QpState::Err, "{what}");
        assert_eq!(
            sim.sides[1].events,
            vec![AsyncEventType::QpAccessErr],
            "{what}"
        );
    }
}

/// Registered memory without bounds: every check passes, reads give
/// zeros and writes vanish — a peer's MR of 4 GiB, without the 4 GiB.
struct Boundless;

impl Memory for Boundless {
    fn check(
        &self,
        _: u32,
        _: u64,
        _: u64,
        _: u64,
        _: crate::soft::memory::AccessKind,
    ) -> Result<(), crate::soft::memory::AccessError> {
        Ok(())
    }
    fn read(
        &self,
        _: u32,
        _: u64,
        _: u64,
        _: crate::soft::memory::AccessKind,
        dst: &mut [u8],
    ) -> Result<(), crate::soft::memory::AccessError> {
        dst.fill(0);
        Ok(())
    }
    fn write(
        &self,
        _: u32,
        _: u64,
        _: u64,
        _: crate::soft::memory::AccessKind,
        _: &[u8],
    ) -> Result<(), crate::soft::memory::AccessError> {
        Ok(())
    }
    fn atomic(
        &self,
        _: u32,
        _: u64,
        _: u64,
        _: crate::soft::memory::AccessKind,
        _: super::AtomicOp,
    ) -> Result<u64, crate::soft::memory::AccessError> {
        Ok(0)
    }
}

#[test]
fn a_read_or_write_request_over_2_pow_31_bytes_is_an_invalid_request() {
    // Issue 14, item 10: IBTA's maximum message size is 2^31 bytes. A READ
    // request whose RETH asks for more (over an MR that big) made the
    // responder take its PSNs — 2^32 - 1 bytes at MTU 1024 are 2^22 of
    // them, past what 24-bit order can tell apart — and stream the
    // responses; a WRITE's first packet began a message of that length.
    // The responder now NAKs either as an invalid request (QP_REQ_ERR),
    // before any R_Key check, and sends no response.
    for (name, op, len, dma_len) in [
        (
            "READ",
            WrOpcode::RdmaRead {
                remote_addr: 0x10_0000,
                rkey: 0x1234,
            },
            16,
            (1u32 << 31) + 1,
        ),
        (
            "READ",
            WrOpcode::RdmaRead {
                remote_addr: 0x10_0000,
                rkey: 0x1234,
            },
            16,
            u32::MAX,
        ),
        (
            "WRITE",
            WrOpcode::RdmaWrite {
                remote_addr: 0x10_0000,
                rkey: 0x1234,
            },
            2 * MTU,
            (1u32 << 31) + 1,
        ),
    ] {
        let what = format!("{name} with a DMA length of {dma_len}");
        let mut sim = Sim::new(4, LinkFaults::CLEAN);
        let (key, base) = register(&sim.sides[0].mem, 2 * MTU as usize, all_access());
        sim.sides[0].qp.post_send(SendWqe {
            wr_id: 1,
            op,
            data: WqeData::Sges(smallvec![Sge {
                addr: base,
                length: len,
                lkey: key,
            }]),
            length: len,
            signaled: true,
            solicited: false,
            fence: false,
        });
        let mut first = sim.take_packets(0).swap_remove(0);
        // BTH (12 bytes), then the RETH: VA (8), R_Key (4), DMA length (4).
        first[24..28].copy_from_slice(&dma_len.to_be_bytes());
        let p = PacketRepr::parse(&first).unwrap();
        assert_eq!(p.reth.unwrap().dma_len, dma_len, "{what}");
        let now = sim.now;
        let side = &mut sim.sides[1];
        let _ = side.qp.handle_packet(&p, now, &Boundless, None);
        let mut buf = vec![0u8; MTU as usize + 128];
        let mut sent = Vec::new();
        while sent.len() < 4 {
            let mut tx = TxBuffer {
                bytes: &mut buf,
                refs: None,
            };
            let Some(n) = side
                .qp
                .poll_transmit(now, &Boundless, &mut tx, AckPolicy::Now)
            else {
                break;
            };
            let p = PacketRepr::parse(&buf[..n]).unwrap();
            sent.push((p.bth.opcode, p.aeth.map(|a| a.syndrome)));
        }
        assert_eq!(
            sent,
            vec![(
                Opcode::RC_ACKNOWLEDGE,
                Some(rverbs_wire::Syndrome::Nak(
                    rverbs_wire::NakCode::InvalidRequest
                ))
            )],
            "{what}: one NAK, no response"
        );
        sim.drain_events();
        assert_eq!(sim.sides[1].qp.state(), QpState::Err, "{what}");
        assert_eq!(
            sim.sides[1].events,
            vec![AsyncEventType::QpReqErr],
            "{what}"
        );
    }
}
