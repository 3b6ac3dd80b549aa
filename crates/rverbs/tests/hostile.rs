//! The live hostile-peer suite (issue 14): a peer built from `rverbs-wire`
//! sends over a real UDP socket to this process's running `rverbs0`.
//!
//! The hostile peer binds its own loopback address (127.0.0.254 down, port
//! 4791, so the device's answers reach it) and plays the remote side of RC
//! and UC QPs: a real rverbs QP (the *victim*) is connected to a made-up
//! QP number at the hostile's address, so the hostile knows its PSNs, QPN
//! and rkey and forges packets the device takes for its peer's, each with
//! a valid ICRC (the IPv4 ID an unconnected Don't-Fragment socket sends
//! with, 0).
//!
//! Each case says what must happen — which completions with which status,
//! which async events, which device counters move (every other one must
//! stay put), which QPs stay in RTS, which bytes land — and then a fresh
//! honest pair of QPs on the same device must still carry a SEND, an RDMA
//! WRITE and an RDMA READ, data intact.
//!
//! The device's counters are the process's, so the cases run one at a
//! time (`serial`). Datagrams go out in bursts, and the next burst waits
//! until the device took the last one in (its `rx_packets`): no socket
//! buffer overflows, so every datagram sent is one the device saw, and
//! nothing depends on timing.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rverbs::cm::{ConnectOptions, Endpoint};
use rverbs::{
    AsyncEventType, Context, Gid, Mtu, NetStats, QpCaps, QpState, QpType, RecvWr, SendWr, WcFlags,
    WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use rverbs_wire::icrc::{self, IpUdpHeaders};
use rverbs_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Headers, IethRepr, ImmDtRepr,
    NakCode, Opcode, Operation, PacketRepr, Position, Psn, RethRepr, Syndrome, Transport,
};

mod common;
use common::ALL;
use common::{sge, wait, wait_event};

// ---- the cases run one at a time ------------------------------------------

/// Held by each case: they share the device and its counters.
static DEVICE: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    DEVICE.lock().unwrap_or_else(|e| e.into_inner())
}

fn device() -> rverbs::Device {
    rverbs::devices().unwrap()[0].clone()
}

fn stats() -> NetStats {
    device().net_stats()
}

// ---- the hostile peer -------------------------------------------------------

/// A raw RoCEv2 endpoint: a UDP socket on its own loopback address, port
/// 4791, that sends what it likes to the device.
struct Hostile {
    socket: UdpSocket,
    /// Its address (where the device's answers come).
    me: SocketAddr,
    /// The device's endpoint.
    device: SocketAddr,
}

/// A packet the device sent the hostile peer.
struct Seen(Vec<u8>);

impl Seen {
    fn repr(&self) -> PacketRepr<'_> {
        PacketRepr::parse(&self.0).expect("the device sends valid RoCEv2")
    }

    /// `(opcode, psn, syndrome)`, for matching and failure messages.
    fn key(&self) -> (Opcode, u32, Option<Syndrome>) {
        let p = self.repr();
        (p.bth.opcode, p.bth.psn.value(), p.aeth.map(|a| a.syndrome))
    }
}

impl std::fmt::Debug for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.repr())
    }
}

/// Most datagrams, and bytes, sent before waiting for the device to take
/// them in: far below what even a stock 208 KiB socket buffer holds
/// (counting the kernel's per-datagram overhead).
const BURST_DATAGRAMS: usize = 32;
const BURST_BYTES: usize = 48 * 1024;

impl Hostile {
    /// Binds the highest free loopback address (127.0.0.254 down; devices
    /// take theirs from 127.0.0.1 up), port 4791.
    fn bind() -> Hostile {
        let device = SocketAddr::new(device().addr(), rverbs::ROCE_V2_PORT);
        for last in (2..=254u8).rev() {
            let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, last));
            if ip == device.ip() {
                continue;
            }
            let me = SocketAddr::new(ip, rverbs::ROCE_V2_PORT);
            if let Ok(socket) = UdpSocket::bind(me) {
                return Hostile { socket, me, device };
            }
        }
        panic!("no free loopback address for the hostile peer");
    }

    /// Its GID, as a victim QP's path names it.
    fn gid(&self) -> Gid {
        let IpAddr::V4(v4) = self.me.ip() else {
            unreachable!()
        };
        Gid(v4.to_ipv6_mapped().octets())
    }

    /// Writes the ICRC of `datagram` (a whole RoCE packet, its last four
    /// bytes the ICRC's place) as the kernel will send it.
    fn seal(&self, datagram: &mut [u8]) {
        let h = IpUdpHeaders::linux(self.me, self.device, datagram.len(), 0);
        icrc::fill(h.ip(), h.udp(), datagram).unwrap();
    }

    /// `p` on the wire, ICRC valid.
    fn forge(&self, p: &PacketRepr<'_>) -> Vec<u8> {
        let mut buf = vec![0u8; p.buffer_len()];
        p.emit(&mut buf).unwrap();
        self.seal(&mut buf);
        buf
    }

    /// Sends `datagrams` in bursts, each once the device took the one
    /// before in; returns when it took every one (panics, naming the
    /// counts, if it does not within 10 s of a burst). How many it sent.
    fn send_all(&self, datagrams: impl IntoIterator<Item = Vec<u8>>) -> u64 {
        self.send_paced(datagrams, Pace::Received)
    }

    /// [`send_all`](Self::send_all), paced as `pace` says.
    fn send_paced(&self, datagrams: impl IntoIterator<Item = Vec<u8>>, pace: Pace) -> u64 {
        let s = stats();
        let start = (s.rx_packets, s.tx_packets);
        let (mut sent, mut burst, mut bytes) = (0u64, 0, 0);
        let (most, answered) = match pace {
            Pace::Received => (BURST_DATAGRAMS, false),
            Pace::Answered(n) => (n, true),
        };
        for d in datagrams {
            self.socket.send_to(&d, self.device).unwrap();
            sent += 1;
            burst += 1;
            bytes += d.len();
            if burst >= most || bytes >= BURST_BYTES {
                wait_taken_in(start, sent, answered);
                (burst, bytes) = (0, 0);
            }
        }
        wait_taken_in(start, sent, answered);
        sent
    }

    /// Forges and sends each packet (see [`send_all`](Self::send_all)).
    fn send(&self, packets: &[PacketRepr<'_>]) -> u64 {
        self.send_all(packets.iter().map(|p| self.forge(p)))
    }

    /// The next packet from the device, waiting up to `limit`.
    fn recv(&self, limit: Duration) -> Option<Seen> {
        self.socket
            .set_read_timeout(Some(limit.max(Duration::from_millis(1))))
            .unwrap();
        let mut buf = vec![0u8; 65536];
        match self.socket.recv_from(&mut buf) {
            Ok((n, from)) => {
                assert_eq!(from, self.device, "a datagram from elsewhere");
                buf.truncate(n);
                Some(Seen(buf))
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock) => None,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::TimedOut) => None,
            Err(e) => panic!("hostile receive: {e}"),
        }
    }

    /// What the device sends, until `done` says it is all there (or 5 s
    /// passed: the caller's assertion then names what came).
    fn collect(&self, done: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut got = Vec::new();
        while !done(&got) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            if let Some(s) = self.recv(left) {
                got.push(s);
            }
        }
        got
    }

    /// Everything the device sent that is still unread, after `settle`.
    fn drain(&self, settle: Duration) -> Vec<Seen> {
        std::thread::sleep(settle);
        let mut got = Vec::new();
        while let Some(s) = self.recv(Duration::from_millis(1)) {
            got.push(s);
        }
        got
    }
}

/// How [`Hostile::send_paced`] waits between bursts.
#[derive(Debug, Clone, Copy)]
enum Pace {
    /// Bursts of [`BURST_DATAGRAMS`] (or [`BURST_BYTES`]), each once the
    /// device took the one before in.
    Received,
    /// Bursts of `n`, each once the device took the one before in and sent
    /// as many packets (requests that are answered with one packet each:
    /// the answers are out, whoever reads them).
    Answered(usize),
}

/// Waits until the device received `sent` datagrams since its
/// `(rx_packets, tx_packets)` were `start` (and, if `answered`, sent as
/// many).
fn wait_taken_in(start: (u64, u64), sent: u64, answered: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = stats();
        let (got, answers) = (s.rx_packets - start.0, s.tx_packets - start.1);
        if got >= sent && (!answered || answers >= sent) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the device counted {got} of the {sent} datagrams sent (rx_packets) within 10 s, \
             and sent {answers} packets"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
}

// ---- the QP under attack ----------------------------------------------------

/// The QP number the hostile peer claims.
const HOSTILE_QPN: u32 = 0x00_c0de;
/// The victims' path MTU.
const MTU: usize = 1024;
/// The PSN the hostile peer starts at: near the wrap, so the PSNs around
/// it cross 2^24.
const HOSTILE_PSN: u32 = 0xff_fffe;
/// The PSN a victim starts sending at: just past the wrap.
const VICTIM_PSN: u32 = 0x00_0001;
/// Far ahead or behind in 24-bit PSN order (a quarter of the space).
const FAR: u32 = 1 << 22;

/// Where things are in a victim's MR: receive buffers, where WRITEs land,
/// what READs read, the atomic's word.
const RECV_AT: usize = 0;
const RECV_LEN: usize = 2048;
const LAND_AT: usize = 8192;
const SOURCE_AT: usize = 16384;
const ATOMIC_AT: usize = 24576;
const VICTIM_MR: usize = 1 << 16;
/// What READs of a victim find at `SOURCE_AT`.
const SOURCE: &[u8; 16] = b"victim's secrets";
/// The payload of a full (first or middle) packet, and of a last or only one.
static FULL: [u8; MTU] = [0xa5; MTU];
const TAIL: &[u8; 16] = b"hostile payload!";
const IMM: u32 = 0x1234_5678;

/// A real QP connected to the hostile peer, in its own context.
struct Victim {
    side: common::PairSide,
    /// The PSN the hostile's next request must carry.
    epsn: Psn,
    /// The first PSN the victim sends.
    sq_psn: Psn,
}

impl Victim {
    /// A `ty` QP connected to `hostile` with `opts` (path MTU 1024), with
    /// `recvs` receive WRs of `RECV_LEN` bytes posted (wr_id 100, 101, …),
    /// and its READ source filled.
    fn new(hostile: &Hostile, ty: QpType, opts: ConnectOptions, recvs: usize) -> Victim {
        let caps = QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        };
        let side = common::pair_side(ty, caps, VICTIM_MR, ALL);
        side.mr.write_at(SOURCE_AT, SOURCE).unwrap();
        let remote = Endpoint {
            gid: hostile.gid(),
            qpn: HOSTILE_QPN,
            psn: HOSTILE_PSN,
            rkey: 0,
            addr: 0,
            len: 0,
        };
        let opts = ConnectOptions {
            path_mtu: Some(Mtu::Mtu1024),
            ..opts
        };
        side.qp.connect(VICTIM_PSN, &remote, &opts).unwrap();
        for i in 0..recvs {
            let at = (RECV_AT + i * RECV_LEN) as u64;
            side.qp
                .post_recv(&RecvWr::new(
                    100 + i as u64,
                    &[sge(&side.mr, at, RECV_LEN as u32)],
                ))
                .unwrap();
        }
        Victim {
            side,
            epsn: Psn::new(HOSTILE_PSN),
            sq_psn: Psn::new(VICTIM_PSN),
        }
    }

    fn rc(hostile: &Hostile) -> Victim {
        Victim::new(hostile, QpType::Rc, victim_options(), 2)
    }

    fn qpn(&self) -> u32 {
        self.side.qp.qp_num()
    }

    fn va(&self, offset: usize) -> u64 {
        self.side.mr.iova() + offset as u64
    }

    fn bytes(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.side.mr.read_at(offset, &mut b).unwrap();
        b
    }

    fn atomic_word(&self) -> u64 {
        u64::from_ne_bytes(self.bytes(ATOMIC_AT, 8).try_into().unwrap())
    }

    /// A packet of opcode `op` for this victim at `psn`, ACK requested,
    /// every header its opcode needs filled in: RETHs and AtomicETHs name
    /// the victim's MR with its real rkey (WRITEs land at `LAND_AT`, READs
    /// read `SOURCE`, atomics add or swap in 5 at `ATOMIC_AT`, ATOMIC
    /// WRITEs store 8 bytes there), ACKs are
    /// positive; first and middle packets carry a full MTU, last and only
    /// ones 16 bytes.
    fn packet(&self, op: Opcode, psn: Psn) -> PacketRepr<'static> {
        let info = op.info().expect("a known opcode");
        let mut bth = BthRepr::new(op, self.qpn(), psn);
        bth.ack_req = true;
        let mut p = PacketRepr::new(bth);
        let rkey = self.side.mr.rkey();
        if info.has_payload {
            p.payload = match info.position {
                Position::First | Position::Middle => &FULL,
                Position::Last | Position::Only => TAIL,
            };
        }
        let h = info.headers;
        if info.operation == Operation::AtomicWrite {
            // An ATOMIC WRITE: 8 bytes to an aligned word.
            p.payload = &TAIL[..8];
            p.reth = Some(RethRepr {
                va: self.va(ATOMIC_AT),
                rkey,
                dma_len: 8,
            });
        } else if h.contains(Headers::RETH) {
            p.reth = Some(if info.operation == Operation::RdmaReadRequest {
                RethRepr {
                    va: self.va(SOURCE_AT),
                    rkey,
                    dma_len: SOURCE.len() as u32,
                }
            } else {
                let dma_len = match info.position {
                    Position::First => (MTU + TAIL.len()) as u32,
                    _ => TAIL.len() as u32,
                };
                RethRepr {
                    va: self.va(LAND_AT),
                    rkey,
                    dma_len,
                }
            });
        }
        if h.contains(Headers::ATOMIC_ETH) {
            p.atomic_eth = Some(AtomicEthRepr {
                va: self.va(ATOMIC_AT),
                rkey,
                swap_add: 5,
                compare: 0,
            });
        }
        if h.contains(Headers::DETH) {
            p.deth = Some(DethRepr {
                qkey: 0,
                src_qp: HOSTILE_QPN,
            });
        }
        if h.contains(Headers::AETH) {
            p.aeth = Some(AethRepr {
                syndrome: Syndrome::Ack {
                    credits: Syndrome::CREDITS_UNLIMITED,
                },
                msn: 0,
            });
        }
        if h.contains(Headers::ATOMIC_ACK_ETH) {
            p.atomic_ack_eth = Some(AtomicAckEthRepr { orig: 0 });
        }
        if h.contains(Headers::IMM_DT) {
            p.imm_dt = Some(ImmDtRepr(IMM));
        }
        if h.contains(Headers::IETH) {
            p.ieth = Some(IethRepr(rkey));
        }
        p
    }

    fn assert_state(&self, want: QpState, what: &str) {
        assert_eq!(self.side.qp.state(), want, "{what}: the victim's state");
    }

    /// Exactly these completions arrive, then nothing more.
    fn assert_completions(&self, want: &[(u64, WcStatus, WcOpcode, u32)], what: &str) {
        let got = wait(&self.side.cq, want.len(), what);
        assert_eq!(summary(&got), want, "{what}: the victim's completions");
        assert_quiet(&self.side.cq, what);
    }
}

/// ConnectOptions as ibv_rc_pingpong's, but no ACK timeout (attribute
/// 0: wait for ever): the hostile peer answers when it likes, and a
/// victim waiting for it must not run out of retries meanwhile (its
/// adaptive timer still resends, without spending any).
fn victim_options() -> ConnectOptions {
    ConnectOptions {
        timeout: 0,
        ..ConnectOptions::default()
    }
}

/// (wr_id, status, opcode, byte_len) of each completion.
fn summary(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus, WcOpcode, u32)> {
    wcs.iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect()
}

/// Nothing more arrives on `cq` for a while.
fn assert_quiet(cq: &rverbs::CompletionQueue, what: &str) {
    std::thread::sleep(Duration::from_millis(50));
    let mut wc = [WorkCompletion::default(); 8];
    let n = cq.poll(&mut wc).unwrap();
    assert_eq!(n, 0, "{what}: unexpected completions {:?}", &wc[..n]);
}

/// No async event is pending on `ctx`.
fn assert_no_event(ctx: &Context, what: &str) {
    let ev = ctx
        .get_async_event_timeout(Duration::from_millis(20))
        .unwrap();
    assert!(ev.is_none(), "{what}: async event {ev:?}");
}

// ---- the device's counters ---------------------------------------------------

/// Counters no case asserts: what the device sends (answers, retransmissions
/// a case may provoke) and how the kernel batched what it received.
const UNASSERTED: [&str; 5] = [
    "tx_packets",
    "tx_sends",
    "tx_errors",
    "tx_too_big",
    "rx_recvs",
];

/// Sends `packets` from `hostile` to victim `v`: each must be received and
/// dropped under `counter` (and no other counter move), and the QP stay in
/// RTS with no completion and no event.
fn dropped_and_counted(
    hostile: &Hostile,
    v: &Victim,
    packets: &[PacketRepr<'_>],
    counter: &str,
    what: &str,
) {
    let n = packets.len() as u64;
    let before = stats();
    hostile.send(packets);
    let after = stats();
    assert_moved(
        &before,
        &after,
        &[("rx_packets", n), (counter, n)],
        &[],
        what,
    );
    v.assert_state(QpState::Rts, what);
    v.assert_completions(&[], what);
    assert_no_event(&v.side.ctx, what);
}

/// Between `before` and `after`, exactly the counters in `want` moved, by
/// exactly that much (besides [`UNASSERTED`] and `free`, which may move).
fn assert_moved(
    before: &NetStats,
    after: &NetStats,
    want: &[(&str, u64)],
    free: &[&str],
    what: &str,
) {
    let mut moved: Vec<(&str, u64)> = before
        .counters()
        .into_iter()
        .zip(after.counters())
        .filter(|((name, _), _)| !UNASSERTED.contains(name) && !free.contains(name))
        .map(|((name, b), (_, a))| (name, a - b))
        .filter(|&(_, d)| d != 0)
        .collect();
    moved.sort_unstable();
    let mut want: Vec<(&str, u64)> = want.iter().copied().filter(|&(_, n)| n != 0).collect();
    want.sort_unstable();
    assert_eq!(moved, want, "{what}: the counters that moved");
}

// ---- after every case ---------------------------------------------------------

/// A fresh, honest RC pair on the device carries a SEND, an RDMA WRITE and
/// an RDMA READ, data intact.
fn assert_device_serves(what: &str) {
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let (a, b) = common::connected_pair(QpType::Rc, caps, 1 << 16, ALL);
    let what = format!("{what}: afterwards a fresh honest pair");
    a.mr.write_at(0, b"still serving").unwrap();
    b.qp.post_recv(&RecvWr::new(9, &[sge(&b.mr, 0, 64)]))
        .unwrap();
    let remote = b.mr.iova() + 4096;
    let rkey = b.mr.rkey();
    let (out, back) = ([sge(&a.mr, 0, 13)], [sge(&a.mr, 100, 13)]);
    let wrs = [
        SendWr::new(1, WrOpcode::Send, &out).signaled(),
        SendWr::new(
            2,
            WrOpcode::RdmaWrite {
                remote_addr: remote,
                rkey,
            },
            &out,
        )
        .signaled(),
        SendWr::new(
            3,
            WrOpcode::RdmaRead {
                remote_addr: remote,
                rkey,
            },
            &back,
        )
        .signaled(),
    ];
    for wr in &wrs {
        a.qp.post_send(wr).unwrap();
    }
    let sent = wait(&a.cq, 3, &what);
    assert_eq!(
        summary(&sent),
        [
            (1, WcStatus::Success, WcOpcode::Send, 0),
            (2, WcStatus::Success, WcOpcode::RdmaWrite, 0),
            (3, WcStatus::Success, WcOpcode::RdmaRead, 13),
        ],
        "{what}"
    );
    let recv = wait(&b.cq, 1, &what);
    assert_eq!(
        summary(&recv),
        [(9, WcStatus::Success, WcOpcode::Recv, 13)],
        "{what}"
    );
    let mut got = [0u8; 13];
    b.mr.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"still serving", "{what}: the SEND's bytes");
    b.mr.read_at(4096, &mut got).unwrap();
    assert_eq!(&got, b"still serving", "{what}: the WRITE's bytes");
    a.mr.read_at(100, &mut got).unwrap();
    assert_eq!(&got, b"still serving", "{what}: the READ's bytes");
    drop((a, b));
    settle();
}

/// Waits until the device has neither received nor sent anything for a
/// while (at most 5 s): on a loaded host an honest pair's requests may be
/// resent, and the answers to those come after its QPs are gone, which
/// the next case would count as packets for unknown QPs (3 of them, once,
/// beside three CPU hogs).
fn settle() {
    let quiet = Duration::from_millis(50);
    let deadline = Instant::now() + Duration::from_secs(5);
    let moved = |s: &NetStats| (s.rx_packets, s.tx_packets);
    let mut last = moved(&stats());
    while Instant::now() < deadline {
        std::thread::sleep(quiet);
        let now = moved(&stats());
        if now == last {
            return;
        }
        last = now;
    }
}

// ---- random numbers, reproducible ---------------------------------------------

/// xorshift64*: the same datagrams every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next() as u8;
        }
    }
}

// ---- the cases ----------------------------------------------------------------

/// Random datagrams — random bytes of random lengths 0..=9000, and random
/// bytes behind a valid ICRC, some of them with a BTH of a known opcode —
/// are each dropped and counted (ICRC error, malformed, unknown QP);
/// nothing reaches a QP: a connected victim stays in RTS, untouched.
#[test]
fn random_datagrams_are_counted_and_dropped() {
    let _serial = serial();
    let hostile = Hostile::bind();
    let victim = Victim::rc(&hostile);
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let opcodes: Vec<Opcode> = Opcode::all().collect();
    let mut datagrams = Vec::new();
    for i in 0..1500 {
        // The shortest lengths all, then random ones.
        let len = if i < 24 { i } else { rng.below(9001) as usize };
        let mut d = vec![0u8; len];
        rng.fill(&mut d);
        match i % 3 {
            0 => {} // random bytes: almost surely a bad ICRC
            1 if len >= 16 => hostile.seal(&mut d),
            2 if len >= 16 => {
                // A BTH of a known opcode, version 0, to a QP not the
                // victim's; the rest random; the ICRC valid.
                let op = opcodes[rng.below(opcodes.len() as u64) as usize];
                let mut qpn = (rng.next() as u32) & 0xff_ffff;
                if qpn == victim.qpn() {
                    qpn ^= 1;
                }
                let mut bth = BthRepr::new(op, qpn, Psn::new(rng.next() as u32));
                bth.pkey = rng.next() as u16;
                let mut view = rverbs_wire::Bth::new_unchecked(&mut d[..12]);
                bth.emit(&mut view);
                hostile.seal(&mut d);
            }
            _ => {}
        }
        datagrams.push(d);
    }
    let n = datagrams.len() as u64;
    let before = stats();
    let sent = hostile.send_all(datagrams);
    let after = stats();
    assert_eq!(sent, n);
    let dropped: u64 = [
        "rx_icrc_errors",
        "rx_malformed",
        "rx_unknown_qp",
        "rx_wrong_peer",
        "rx_wrong_transport",
        "rx_qp_not_receiving",
        "rx_bad_pkey",
    ]
    .iter()
    .map(|c| counter(&after, c) - counter(&before, c))
    .sum();
    assert_eq!(
        counter(&after, "rx_packets") - counter(&before, "rx_packets"),
        n,
        "every datagram is a received packet"
    );
    assert_eq!(dropped, n, "every datagram is dropped with a reason");
    for reason in ["rx_icrc_errors", "rx_malformed", "rx_unknown_qp"] {
        assert!(
            counter(&after, reason) > counter(&before, reason),
            "random datagrams: none dropped for {reason}"
        );
    }
    assert_moved(
        &before,
        &after,
        &[("rx_packets", n)],
        &[
            "rx_icrc_errors",
            "rx_malformed",
            "rx_unknown_qp",
            "rx_ip_id_solved",
        ],
        "random datagrams",
    );
    victim.assert_state(QpState::Rts, "random datagrams");
    victim.assert_completions(&[], "random datagrams");
    assert_no_event(&victim.side.ctx, "random datagrams");
    let answers = hostile.drain(Duration::from_millis(20));
    assert!(answers.is_empty(), "random datagrams: answered {answers:?}");
    assert_device_serves("random datagrams");
}

fn counter(s: &NetStats, name: &str) -> u64 {
    s.counters()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
        .unwrap()
}

/// An empty UDP datagram to port 4791 is a received packet, dropped and
/// counted like any other too short to carry an ICRC.
#[test]
fn empty_datagrams_are_counted() {
    let _serial = serial();
    let hostile = Hostile::bind();
    let before = stats();
    hostile.send_all([vec![], vec![], vec![0u8; 3]]);
    let after = stats();
    assert_moved(
        &before,
        &after,
        &[("rx_packets", 3), ("rx_icrc_errors", 3)],
        &[],
        "empty and 3-byte datagrams",
    );
    assert_device_serves("empty datagrams");
}

/// The PSN offsets each opcode is sent at, in this order: three behind
/// (duplicates), three ahead (a gap: one sequence NAK), then the expected
/// one.
const OFFSETS: [(i64, &str); 7] = [
    (-2, "expected-2"),
    (-1, "expected-1"),
    (-(FAR as i64), "far behind"),
    (1, "expected+1"),
    (2, "expected+2"),
    (FAR as i64, "far ahead"),
    (0, "expected"),
];

fn offset(psn: Psn, by: i64) -> Psn {
    if by < 0 {
        psn.sub((-by) as u32)
    } else {
        psn.add(by as u32)
    }
}

/// Every RC opcode, valid, ACK requested, at PSNs around the expected one,
/// each to a fresh victim (in RTS, two receive WRs posted).
///
/// Requests: the three behind are duplicates (counted; a SEND or WRITE one
/// is ACKed again with expected-1, a READ or atomic one with nothing saved
/// is ignored), the three ahead are out of sequence (counted, one sequence
/// NAK of the expected PSN), and at the expected PSN the request executes
/// — SEND ONLY completes a receive WR, WRITE ONLY lands, READ is answered
/// with the bytes asked for, an atomic with the original value, a FIRST
/// packet starts its message — or, when it cannot start a message (MIDDLE,
/// LAST) or asks to invalidate an rkey that names no memory window (here
/// the MR's), is refused: NAK invalid request, QP_REQ_ERR, the QP in ERR,
/// its receive WRs flushed — but the one a SEND ONLY with Invalidate
/// filled, which completes with REM_INV_REQ_ERR (rxe's class J).
///
/// Responses (ACK, atomic ACK, READ responses) to a victim that sent
/// nothing: those at or after its first PSN are counted as for unsent
/// PSNs, those before are old news, ignored; nothing completes, nothing
/// is answered, the QP stays in RTS.
#[test]
fn every_rc_opcode_at_psns_around_the_expected_one() {
    let _serial = serial();
    let hostile = Hostile::bind();
    for op in Opcode::all().filter(|o| o.info().unwrap().transport == Transport::Rc) {
        rc_opcode_around_expected(&hostile, op);
    }
    assert_device_serves("every RC opcode");
}

fn rc_opcode_around_expected(hostile: &Hostile, op: Opcode) {
    let info = op.info().unwrap();
    let v = Victim::rc(hostile);
    let what = format!("{op}");
    let response = matches!(
        info.operation,
        Operation::Acknowledge | Operation::AtomicAcknowledge | Operation::RdmaReadResponse
    );
    // Requests count from the hostile's PSN, responses from the victim's.
    let base = if response { v.sq_psn } else { v.epsn };
    let packets: Vec<PacketRepr<'static>> = OFFSETS
        .iter()
        .map(|&(by, _)| v.packet(op, offset(base, by)))
        .collect();
    let before = stats();
    hostile.send(&packets);
    let e = v.epsn.value();

    if response {
        let after = stats();
        assert_moved(
            &before,
            &after,
            &[("rx_packets", 7), ("acks_for_unsent", 4)],
            &[],
            &what,
        );
        v.assert_state(QpState::Rts, &what);
        v.assert_completions(&[], &what);
        assert_no_event(&v.side.ctx, &what);
        let answers = hostile.drain(Duration::from_millis(20));
        assert!(answers.is_empty(), "{what}: answered {answers:?}");
        return;
    }

    let starts = matches!(info.position, Position::First | Position::Only);
    let refused = !starts || info.has_invalidate();
    let ack = Some(Syndrome::Ack {
        credits: Syndrome::CREDITS_UNLIMITED,
    });
    let final_answer = if refused {
        (
            Opcode::RC_ACKNOWLEDGE,
            e,
            Some(Syndrome::Nak(NakCode::InvalidRequest)),
        )
    } else {
        match info.operation {
            Operation::RdmaReadRequest => (Opcode::RC_RDMA_READ_RESPONSE_ONLY, e, ack),
            Operation::CompareSwap | Operation::FetchAdd => (Opcode::RC_ATOMIC_ACKNOWLEDGE, e, ack),
            _ => (Opcode::RC_ACKNOWLEDGE, e, ack),
        }
    };
    let answers = hostile.collect(|got| got.iter().any(|s| s.key() == final_answer));
    let keys: Vec<_> = answers.iter().map(Seen::key).collect();
    assert!(
        keys.contains(&final_answer),
        "{what}: no {final_answer:?} among {answers:?}"
    );
    let seq_nak = (
        Opcode::RC_ACKNOWLEDGE,
        e,
        Some(Syndrome::Nak(NakCode::PsnSequenceError)),
    );
    assert!(
        keys.contains(&seq_nak),
        "{what}: no sequence NAK among {answers:?}"
    );
    let send_or_write = matches!(
        info.operation,
        Operation::Send | Operation::RdmaWrite | Operation::AtomicWrite
    );
    let dup_ack = (Opcode::RC_ACKNOWLEDGE, v.epsn.sub(1).value(), ack);
    // Duplicate SENDs and WRITEs are ACKed again, but that ACK may not be
    // seen on its own: if it was still queued when the packet past the gap
    // came, it merged into the sequence NAK (a NAK at e acknowledges all
    // before e), and a refusal drops the ACKs still queued (only its NAK
    // goes out of a QP in ERR). Duplicate READs and atomics are answered by
    // replays, never by a plain ACK.
    let dup_acked = keys.contains(&dup_ack);
    assert!(
        send_or_write || !dup_acked,
        "{what}: a duplicate READ or atomic ACKed plainly: {answers:?}"
    );
    for s in &answers {
        let k = s.key();
        assert!(
            k == final_answer || k == seq_nak || k == dup_ack,
            "{what}: unexpected answer {s:?}"
        );
        if k.0 == Opcode::RC_RDMA_READ_RESPONSE_ONLY {
            assert_eq!(s.repr().payload, SOURCE, "{what}: the READ's bytes");
        }
        if k.0 == Opcode::RC_ATOMIC_ACKNOWLEDGE {
            assert_eq!(s.repr().atomic_ack_eth.unwrap().orig, 0, "{what}");
        }
    }
    let late = hostile.drain(Duration::from_millis(20));
    assert!(late.is_empty(), "{what}: answered also {late:?}");

    let after = stats();
    let fatal = u64::from(refused);
    assert_moved(
        &before,
        &after,
        &[
            ("rx_packets", 7),
            ("duplicates", 3),
            ("out_of_sequence", 3),
            ("seq_naks_sent", 1),
            ("fatal_naks_sent", fatal),
        ],
        &[],
        &what,
    );

    let landed = v.bytes(LAND_AT, MTU + TAIL.len());
    let recv0 = v.bytes(RECV_AT, MTU + TAIL.len());
    let zeros = vec![0u8; MTU + TAIL.len()];
    if refused {
        wait_event(&v.side.ctx, AsyncEventType::QpReqErr, &what);
        v.assert_state(QpState::Err, &what);
        // A SEND ONLY with Invalidate was placed before its invalidation
        // was refused (as rxe orders them): its receive WR fails.
        let first = if starts {
            WcStatus::RemInvReqErr
        } else {
            WcStatus::WrFlushErr
        };
        v.assert_completions(
            &[
                (100, first, WcOpcode::Recv, 0),
                (101, WcStatus::WrFlushErr, WcOpcode::Recv, 0),
            ],
            &what,
        );
        assert_eq!(landed, zeros, "{what}: nothing written");
        if !starts {
            assert_eq!(recv0, zeros, "{what}: nothing received");
        }
        assert_eq!(v.atomic_word(), 0, "{what}: no atomic");
        return;
    }
    assert_no_event(&v.side.ctx, &what);
    v.assert_state(QpState::Rts, &what);
    let mut want_recv0 = zeros.clone();
    let mut want_landed = zeros.clone();
    let mut want_wc = Vec::new();
    let mut want_atomic = 0;
    match (info.operation, info.position) {
        (Operation::Send, Position::First) => want_recv0[..MTU].copy_from_slice(&FULL),
        (Operation::Send, _) => {
            want_recv0[..TAIL.len()].copy_from_slice(TAIL);
            want_wc.push((100, WcStatus::Success, WcOpcode::Recv, TAIL.len() as u32));
        }
        (Operation::RdmaWrite, Position::First) => want_landed[..MTU].copy_from_slice(&FULL),
        (Operation::RdmaWrite, _) => {
            want_landed[..TAIL.len()].copy_from_slice(TAIL);
            if info.has_immediate() {
                want_wc.push((100, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 16));
            }
        }
        (Operation::CompareSwap | Operation::FetchAdd, _) => want_atomic = 5,
        // Stored once, in memory order, whatever the duplicates.
        (Operation::AtomicWrite, _) => {
            want_atomic = u64::from_ne_bytes(TAIL[..8].try_into().unwrap());
        }
        _ => {}
    }
    let got = wait(&v.side.cq, want_wc.len(), &what);
    assert_eq!(summary(&got), want_wc, "{what}: completions");
    for wc in &got {
        let imm = info.has_immediate();
        assert_eq!(wc.wc_flags.contains(WcFlags::WITH_IMM), imm, "{what}");
        if imm {
            assert_eq!(wc.imm_data, IMM, "{what}");
        }
    }
    assert_quiet(&v.side.cq, &what);
    assert_eq!(landed, want_landed, "{what}: the bytes written");
    assert_eq!(recv0, want_recv0, "{what}: the bytes received");
    assert_eq!(v.atomic_word(), want_atomic, "{what}: the atomic's word");
}

/// UC, UD and CNP opcodes to an RC QP, at its expected PSN: each dropped
/// as the wrong transport, nothing else; the QP stays in RTS.
#[test]
fn other_transports_opcodes_to_an_rc_qp_are_dropped() {
    let _serial = serial();
    let hostile = Hostile::bind();
    let v = Victim::rc(&hostile);
    let packets: Vec<PacketRepr<'static>> = Opcode::all()
        .filter(|o| o.info().unwrap().transport != Transport::Rc)
        .map(|o| v.packet(o, v.epsn))
        .collect();
    let n = packets.len() as u64;
    let before = stats();
    hostile.send(&packets);
    let after = stats();
    let what = "UC, UD and CNP opcodes to an RC QP";
    assert_moved(
        &before,
        &after,
        &[("rx_packets", n), ("rx_wrong_transport", n)],
        &[],
        what,
    );
    v.assert_state(QpState::Rts, what);
    v.assert_completions(&[], what);
    assert_no_event(&v.side.ctx, what);
    assert!(
        hostile.drain(Duration::from_millis(20)).is_empty(),
        "{what}"
    );
    // The expected PSN did not move: a SEND there completes.
    hostile.send(&[v.packet(Opcode::RC_SEND_ONLY, v.epsn)]);
    v.assert_completions(&[(100, WcStatus::Success, WcOpcode::Recv, 16)], what);
    assert_device_serves(what);
}

/// Responses forged for work the victim never sent — a READ and an atomic
/// held back by its single READ/atomic credit — and for PSNs it never
/// sent (ACKs, NAKs, RNR NAKs, READ responses): each is dropped and
/// counted (`acks_for_unsent`); a READ response naming a SEND's PSN is
/// ignored. No WR completes, no byte lands in a local buffer, the QP stays
/// in RTS; once the hostile answers what was really sent, every WR
/// completes with SUCCESS and the honest data.
#[test]
fn forged_responses_for_unsent_work_complete_nothing() {
    let _serial = serial();
    let hostile = Hostile::bind();
    let opts = ConnectOptions {
        max_rd_atomic: 1,
        ..victim_options()
    };
    let v = Victim::new(&hostile, QpType::Rc, opts, 0);
    let what = "forged responses";
    let mr = &v.side.mr;
    // Local buffers the responses would fill.
    const READ1_AT: u64 = 40960;
    const READ2_AT: u64 = 41984;
    const FADD_AT: u64 = 43008;
    v.side.mr.write_at(SOURCE_AT, b"send me, honestly").unwrap();
    let sges = [
        [sge(mr, SOURCE_AT as u64, 17)],
        [sge(mr, READ1_AT, 64)],
        [sge(mr, READ2_AT, 64)],
        [sge(mr, FADD_AT, 8)],
    ];
    let wrs = [
        SendWr::new(1, WrOpcode::Send, &sges[0]).signaled(),
        SendWr::new(
            2,
            WrOpcode::RdmaRead {
                remote_addr: 0x1000,
                rkey: 0x1234,
            },
            &sges[1],
        )
        .signaled(),
        SendWr::new(
            3,
            WrOpcode::RdmaRead {
                remote_addr: 0x2000,
                rkey: 0x1234,
            },
            &sges[2],
        )
        .signaled(),
        SendWr::new(
            4,
            WrOpcode::AtomicFetchAndAdd {
                remote_addr: 0x3000,
                rkey: 0x1234,
                add: 1,
            },
            &sges[3],
        )
        .signaled(),
    ];
    for wr in &wrs {
        v.side.qp.post_send(wr).unwrap();
    }
    let s = v.sq_psn;
    let (send_psn, read1_psn, read2_psn, fadd_psn) = (s, s.add(1), s.add(2), s.add(3));
    // The victim sends the SEND and the first READ; the second READ and
    // the atomic wait for its one credit.
    let first = hostile.collect(|got| {
        got.iter()
            .any(|p| p.key().0 == Opcode::RC_RDMA_READ_REQUEST)
    });
    let keys: Vec<_> = first.iter().map(|p| (p.key().0, p.key().1)).collect();
    assert!(
        keys.contains(&(Opcode::RC_SEND_ONLY, send_psn.value()))
            && keys.contains(&(Opcode::RC_RDMA_READ_REQUEST, read1_psn.value())),
        "{what}: the victim sends {first:?}"
    );
    let held = hostile.drain(Duration::from_millis(50));
    assert!(
        held.iter()
            .all(|p| p.key().1 == send_psn.value() || p.key().1 == read1_psn.value()),
        "{what}: the credit holds the rest back: {held:?}"
    );

    let bth = |op: Opcode, psn: Psn| BthRepr::new(op, v.qpn(), psn);
    let aeth = |syndrome: Syndrome| Some(AethRepr { syndrome, msn: 7 });
    let ack = Syndrome::Ack {
        credits: Syndrome::CREDITS_UNLIMITED,
    };
    let forged_data = [0xeeu8; 64];
    let read_response = |op: Opcode, psn: Psn, with_aeth: bool| PacketRepr {
        aeth: if with_aeth { aeth(ack) } else { None },
        payload: &forged_data,
        ..PacketRepr::new(bth(op, psn))
    };
    let ack_for = |psn: Psn, syndrome: Syndrome| PacketRepr {
        aeth: aeth(syndrome),
        ..PacketRepr::new(bth(Opcode::RC_ACKNOWLEDGE, psn))
    };
    let atomic_ack = |psn: Psn| PacketRepr {
        aeth: aeth(ack),
        atomic_ack_eth: Some(AtomicAckEthRepr { orig: 0xdead_beef }),
        ..PacketRepr::new(bth(Opcode::RC_ATOMIC_ACKNOWLEDGE, psn))
    };
    let unsent = [
        // The READ never sent, answered whole or as a stream's start.
        read_response(Opcode::RC_RDMA_READ_RESPONSE_ONLY, read2_psn, true),
        read_response(Opcode::RC_RDMA_READ_RESPONSE_FIRST, read2_psn, true),
        read_response(Opcode::RC_RDMA_READ_RESPONSE_LAST, read2_psn, true),
        // The atomic never sent.
        atomic_ack(fadd_psn),
        // ACKs and NAKs covering PSNs never sent.
        ack_for(fadd_psn, ack),
        ack_for(s.add(FAR), ack),
        ack_for(read2_psn, Syndrome::Nak(NakCode::RemoteAccessError)),
        ack_for(read2_psn, Syndrome::Nak(NakCode::InvalidRequest)),
        ack_for(read2_psn, Syndrome::Nak(NakCode::PsnSequenceError)),
        ack_for(read2_psn, Syndrome::RnrNak(rverbs_wire::RnrTimer::new(1))),
        read_response(Opcode::RC_RDMA_READ_RESPONSE_ONLY, s.add(FAR), true),
    ];
    // A READ response at the SEND's PSN (sent, but no READ): ignored.
    let not_a_read = [read_response(
        Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        send_psn,
        true,
    )];
    let before = stats();
    hostile.send(&unsent);
    hostile.send(&not_a_read);
    let after = stats();
    let n = unsent.len() as u64;
    assert_moved(
        &before,
        &after,
        &[("rx_packets", n + 1), ("acks_for_unsent", n)],
        // The victim may resend its SEND and READ meanwhile.
        &["retransmitted", "timeouts", "window_cuts"],
        what,
    );
    v.assert_state(QpState::Rts, what);
    assert_quiet(&v.side.cq, what);
    assert_no_event(&v.side.ctx, what);
    assert_eq!(
        v.bytes(READ1_AT as usize, 64),
        [0u8; 64],
        "{what}: READ 1's buffer"
    );
    assert_eq!(
        v.bytes(READ2_AT as usize, 64),
        [0u8; 64],
        "{what}: READ 2's buffer"
    );
    assert_eq!(
        v.bytes(FADD_AT as usize, 8),
        [0u8; 8],
        "{what}: the atomic's buffer"
    );

    // Now the honest answers: every WR completes with the real data.
    let honest1 = [0x11u8; 64];
    let honest2 = [0x22u8; 64];
    hostile.send(&[
        ack_for(send_psn, ack),
        PacketRepr {
            payload: &honest1,
            ..read_response(Opcode::RC_RDMA_READ_RESPONSE_ONLY, read1_psn, true)
        },
    ]);
    let _ = hostile.collect(|got| {
        got.iter()
            .any(|p| p.key().0 == Opcode::RC_RDMA_READ_REQUEST && p.key().1 == read2_psn.value())
    });
    hostile.send(&[PacketRepr {
        payload: &honest2,
        ..read_response(Opcode::RC_RDMA_READ_RESPONSE_ONLY, read2_psn, true)
    }]);
    let _ = hostile.collect(|got| {
        got.iter()
            .any(|p| p.key().0 == Opcode::RC_FETCH_ADD && p.key().1 == fadd_psn.value())
    });
    hostile.send(&[PacketRepr {
        atomic_ack_eth: Some(AtomicAckEthRepr { orig: 41 }),
        ..atomic_ack(fadd_psn)
    }]);
    v.assert_completions(
        &[
            (1, WcStatus::Success, WcOpcode::Send, 0),
            (2, WcStatus::Success, WcOpcode::RdmaRead, 64),
            (3, WcStatus::Success, WcOpcode::RdmaRead, 64),
            (4, WcStatus::Success, WcOpcode::FetchAdd, 8),
        ],
        what,
    );
    assert_eq!(
        v.bytes(READ1_AT as usize, 64),
        honest1,
        "{what}: READ 1's data"
    );
    assert_eq!(
        v.bytes(READ2_AT as usize, 64),
        honest2,
        "{what}: READ 2's data"
    );
    assert_eq!(
        u64::from_ne_bytes(v.bytes(FADD_AT as usize, 8).try_into().unwrap()),
        41,
        "{what}: the atomic's original value"
    );
    v.assert_state(QpState::Rts, what);
    assert_device_serves(what);
}

/// The process's resident set, in bytes (`VmRSS`).
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

/// `n` requests to `v` from PSN `*psn` on, alternately an 8-byte READ of
/// its source and a FETCH_ADD of 1 on its atomic word, in sequence, sent
/// as `pace` says, never reading the answers. How many FETCH_ADDs.
fn flood(hostile: &Hostile, v: &Victim, psn: &mut Psn, n: usize, pace: Pace) -> u64 {
    let mut fetch_adds = 0;
    let datagrams = (0..n).map(|i| {
        let mut p = if i % 2 == 0 {
            let mut p = v.packet(Opcode::RC_RDMA_READ_REQUEST, *psn);
            if let Some(r) = &mut p.reth {
                r.dma_len = 8;
            }
            p
        } else {
            fetch_adds += 1;
            let mut p = v.packet(Opcode::RC_FETCH_ADD, *psn);
            if let Some(a) = &mut p.atomic_eth {
                a.swap_add = 1;
            }
            p
        };
        p.bth.ack_req = false;
        *psn = psn.next();
        hostile.forge(&p)
    });
    hostile.send_paced(datagrams, pace);
    fetch_adds
}

/// READs and atomics the paced part of the flood sends before waiting for
/// their answers to go out: below the victim's `max_dest_rd_atomic` (16),
/// so it never owes more than a requester may have outstanding.
const WITHIN_CREDITS: Pace = Pace::Answered(8);

/// A flood of 10^5 READ and atomic requests in sequence, whose answers the
/// hostile never reads, after a 10^4 warm-up: half paced so that the
/// victim never owes more answers than its `max_dest_rd_atomic` allows
/// (every request executes, the QP stays in RTS, every FETCH_ADD adds
/// once), half as fast as the device takes them in (every request either
/// executed, or, past a bound on what the QP owes, refused: QP_REQ_ERR,
/// the QP in ERR, one fatal NAK, the rest dropped as for a QP not
/// receiving). Through both the process's resident set grows by less
/// than 8 MiB, and the device still serves.
///
/// The bound: the engine's buffers are made once (and touched in the
/// warm-up), and what a QP keeps for the requests it answers is bounded
/// by `max_dest_rd_atomic`; state kept per packet — 84 bytes or more,
/// across 10^5 packets — would pass 8 MiB. The kernel's socket buffers
/// are not in the resident set.
#[test]
fn read_and_atomic_flood_keeps_memory_bounded() {
    let _serial = serial();
    let hostile = Hostile::bind();
    let v = Victim::rc(&hostile);
    let what = "READ and atomic flood";
    let mut psn = v.epsn;
    let start = stats();
    let mut fetch_adds = flood(&hostile, &v, &mut psn, 10_000, WITHIN_CREDITS);
    let rss_before = rss();
    fetch_adds += flood(&hostile, &v, &mut psn, 50_000, WITHIN_CREDITS);
    let paced = stats();
    assert_moved(
        &start,
        &paced,
        &[("rx_packets", 60_000)],
        &[],
        "a flood within max_dest_rd_atomic",
    );
    v.assert_state(QpState::Rts, what);
    assert_eq!(v.atomic_word(), fetch_adds, "{what}: every FETCH_ADD once");

    fetch_adds += flood(&hostile, &v, &mut psn, 50_000, Pace::Received);
    let after = stats();
    let rss_after = rss();
    let growth = rss_after.saturating_sub(rss_before);
    assert!(
        growth < 8 << 20,
        "{what}: resident set grew {} KiB ({} -> {} KiB)",
        growth >> 10,
        rss_before >> 10,
        rss_after >> 10
    );
    assert_eq!(
        counter(&after, "rx_packets") - counter(&paced, "rx_packets"),
        50_000,
        "{what}"
    );
    if v.side.qp.state() == QpState::Rts {
        assert_moved(&paced, &after, &[("rx_packets", 50_000)], &[], what);
        assert_eq!(v.atomic_word(), fetch_adds, "{what}: every FETCH_ADD once");
        assert_no_event(&v.side.ctx, what);
    } else {
        wait_event(&v.side.ctx, AsyncEventType::QpReqErr, what);
        v.assert_state(QpState::Err, what);
        assert_eq!(
            counter(&after, "fatal_naks_sent") - counter(&paced, "fatal_naks_sent"),
            1,
            "{what}: one fatal NAK"
        );
        assert!(v.atomic_word() < fetch_adds, "{what}");
    }
    assert_device_serves(what);
}

/// A requester may have no more READs and atomics outstanding than the
/// responder's `max_dest_rd_atomic`. A hostile one that sends a second
/// large READ while the first one's response stream (16384 packets) is
/// still owed, to a QP with `max_dest_rd_atomic` 1, is refused: NAK
/// invalid request (one fatal NAK), QP_REQ_ERR, the QP in ERR.
///
/// The two READs leave back to back; the second would come too late only
/// if this thread were kept off the CPU between two sends for as long as
/// the device takes to send 16384 packets.
#[test]
fn a_read_beyond_max_dest_rd_atomic_is_refused() {
    let _serial = serial();
    let hostile = Hostile::bind();
    let opts = ConnectOptions {
        max_rd_atomic: 1,
        path_mtu: Some(Mtu::Mtu256),
        ..victim_options()
    };
    let what = "a READ beyond max_dest_rd_atomic";
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    const LEN: u32 = 4 << 20;
    let side = common::pair_side(QpType::Rc, caps, LEN as usize, ALL);
    let remote = Endpoint {
        gid: hostile.gid(),
        qpn: HOSTILE_QPN,
        psn: HOSTILE_PSN,
        rkey: 0,
        addr: 0,
        len: 0,
    };
    side.qp.connect(VICTIM_PSN, &remote, &opts).unwrap();
    let read = |psn: Psn| {
        let mut bth = BthRepr::new(Opcode::RC_RDMA_READ_REQUEST, side.qp.qp_num(), psn);
        bth.ack_req = true;
        PacketRepr {
            reth: Some(RethRepr {
                va: side.mr.iova(),
                rkey: side.mr.rkey(),
                dma_len: LEN,
            }),
            ..PacketRepr::new(bth)
        }
    };
    let first = Psn::new(HOSTILE_PSN);
    let second = first.add(LEN / 256);
    let before = stats();
    // Back to back: the second arrives long before 16384 packets are out.
    hostile.send(&[read(first), read(second)]);
    wait_event(&side.ctx, AsyncEventType::QpReqErr, what);
    assert_eq!(side.qp.state(), QpState::Err, "{what}");
    // QP_REQ_ERR is the event of an invalid-request refusal. The NAK
    // itself is not looked for on the wire: READ responses sent before it
    // may have filled the hostile's socket buffer.
    let after = stats();
    assert_eq!(
        counter(&after, "fatal_naks_sent") - counter(&before, "fatal_naks_sent"),
        1,
        "{what}"
    );
    drop(side);
    hostile.drain(Duration::from_millis(10));
    assert_device_serves(what);
}

/// Zero-length requests (IBTA C9-88: no R_Key check) from the hostile peer
/// with rkey 0 and VA 0 — READ, WRITE, WRITE with immediate — and an empty
/// SEND all succeed: an empty READ response, ACKs, the receive WRs
/// complete with byte_len 0; and a zero-length READ the victim posts with
/// rkey 0, answered with an empty response, completes with SUCCESS. No
/// fatal NAK, no event, the QP stays in RTS.
#[test]
fn zero_length_requests_with_rkey_0_succeed() {
    let _serial = serial();
    let hostile = Hostile::bind();
    let v = Victim::rc(&hostile);
    let what = "zero-length requests";
    let e = v.epsn;
    let zero_reth = Some(RethRepr {
        va: 0,
        rkey: 0,
        dma_len: 0,
    });
    let with = |op: Opcode, psn: Psn| {
        let mut p = v.packet(op, psn);
        p.payload = &[];
        if p.reth.is_some() {
            p.reth = zero_reth;
        }
        p
    };
    let before = stats();
    hostile.send(&[
        with(Opcode::RC_RDMA_READ_REQUEST, e),
        with(Opcode::RC_RDMA_WRITE_ONLY, e.add(1)),
        with(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, e.add(2)),
        with(Opcode::RC_SEND_ONLY, e.add(3)),
    ]);
    let ack = Some(Syndrome::Ack {
        credits: Syndrome::CREDITS_UNLIMITED,
    });
    let last_ack = (Opcode::RC_ACKNOWLEDGE, e.add(3).value(), ack);
    let answers = hostile.collect(|got| got.iter().any(|s| s.key() == last_ack));
    let read_response = answers
        .iter()
        .find(|s| s.key().0 == Opcode::RC_RDMA_READ_RESPONSE_ONLY)
        .unwrap_or_else(|| panic!("{what}: no READ response among {answers:?}"));
    assert_eq!(
        read_response.key(),
        (Opcode::RC_RDMA_READ_RESPONSE_ONLY, e.value(), ack)
    );
    assert!(read_response.repr().payload.is_empty(), "{what}");
    for s in &answers {
        assert!(
            s.key().0 == Opcode::RC_RDMA_READ_RESPONSE_ONLY || s.key().2 == ack,
            "{what}: a NAK: {s:?}"
        );
    }
    v.assert_completions(
        &[
            (100, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 0),
            (101, WcStatus::Success, WcOpcode::Recv, 0),
        ],
        what,
    );

    // The victim's own zero-length READ with rkey 0.
    v.side
        .qp
        .post_send(
            &SendWr::new(
                7,
                WrOpcode::RdmaRead {
                    remote_addr: 0,
                    rkey: 0,
                },
                &[],
            )
            .signaled(),
        )
        .unwrap();
    let request = hostile.collect(|got| {
        got.iter()
            .any(|s| s.key().0 == Opcode::RC_RDMA_READ_REQUEST)
    });
    let request = request
        .iter()
        .find(|s| s.key().0 == Opcode::RC_RDMA_READ_REQUEST)
        .unwrap_or_else(|| panic!("{what}: the victim sent no READ: {request:?}"));
    let reth = request.repr().reth.unwrap();
    assert_eq!((reth.rkey, reth.va, reth.dma_len), (0, 0, 0), "{what}");
    let psn = request.repr().bth.psn;
    hostile.send(&[PacketRepr {
        aeth: Some(AethRepr {
            syndrome: Syndrome::Ack {
                credits: Syndrome::CREDITS_UNLIMITED,
            },
            msn: 1,
        }),
        ..PacketRepr::new(BthRepr::new(
            Opcode::RC_RDMA_READ_RESPONSE_ONLY,
            v.qpn(),
            psn,
        ))
    }]);
    v.assert_completions(&[(7, WcStatus::Success, WcOpcode::RdmaRead, 0)], what);
    let after = stats();
    assert_moved(
        &before,
        &after,
        &[("rx_packets", 5)],
        &["retransmitted", "timeouts", "window_cuts"],
        what,
    );
    v.assert_state(QpState::Rts, what);
    assert_no_event(&v.side.ctx, what);
    assert_device_serves(what);
}

/// A UC QP swept for rkeys — WRITEs with 600 wrong rkeys (0 and all ones
/// among them) and one out of the MR's bounds — refuses every one without
/// a word (UC has no NAK): each counted in `uc_access_refused`, no byte
/// lands, no completion, no event, the QP stays in RTS; a WRITE with the
/// real rkey then lands.
#[test]
fn uc_rkey_sweep_is_counted_and_the_qp_carries_on() {
    let _serial = serial();
    let hostile = Hostile::bind();
    let v = Victim::new(&hostile, QpType::Uc, victim_options(), 0);
    let what = "UC rkey sweep";
    let real = v.side.mr.rkey();
    let mut rng = Rng(0xdead_beef_0bad_f00d);
    let mut rkeys = vec![
        0,
        u32::MAX,
        real ^ 1,
        real.wrapping_add(1),
        real.wrapping_sub(1),
    ];
    while rkeys.len() < 600 {
        let k = rng.next() as u32;
        if k != real {
            rkeys.push(k);
        }
    }
    let mut psn = v.epsn;
    let mut packets = Vec::new();
    for &rkey in &rkeys {
        let mut p = v.packet(Opcode::UC_RDMA_WRITE_ONLY, psn);
        if let Some(r) = &mut p.reth {
            r.rkey = rkey;
        }
        packets.push(p);
        psn = psn.next();
    }
    let mut outside = v.packet(Opcode::UC_RDMA_WRITE_ONLY, psn);
    if let Some(r) = &mut outside.reth {
        r.va = v.va(VICTIM_MR - 8);
    }
    packets.push(outside);
    psn = psn.next();
    dropped_and_counted(&hostile, &v, &packets, "uc_access_refused", what);
    assert_eq!(v.bytes(LAND_AT, 16), [0u8; 16], "{what}: nothing landed");
    assert_eq!(
        v.bytes(VICTIM_MR - 8, 8),
        [0u8; 8],
        "{what}: nothing landed"
    );
    assert!(
        hostile.drain(Duration::from_millis(20)).is_empty(),
        "{what}"
    );
    hostile.send(&[v.packet(Opcode::UC_RDMA_WRITE_ONLY, psn)]);
    assert_eq!(v.bytes(LAND_AT, 16), TAIL, "{what}: the real rkey's WRITE");
    assert_device_serves(what);
}

/// Valid packets to QP numbers no QP has (0, 1, the multicast QPN, and
/// numbers near a live one): each dropped and counted in `rx_unknown_qp`,
/// nothing else moves, nothing is answered, the live QP is untouched.
#[test]
fn packets_to_unknown_qpns_are_counted_and_dropped() {
    let _serial = serial();
    let hostile = Hostile::bind();
    let v = Victim::rc(&hostile);
    let what = "unknown QPNs";
    // (QP 1 is the GSI QP: what is not a MAD for it is counted as a MAD
    // dropped — see the engine's gsi tests and the CM case below.)
    let mut qpns = vec![0, 0xff_ffff];
    for bit in 0..24 {
        qpns.push(v.qpn() ^ (1 << bit));
    }
    let mut packets = Vec::new();
    for &qpn in &qpns {
        for op in [
            Opcode::RC_SEND_ONLY,
            Opcode::RC_RDMA_WRITE_ONLY,
            Opcode::RC_RDMA_READ_REQUEST,
            Opcode::RC_ACKNOWLEDGE,
            Opcode::UD_SEND_ONLY,
        ] {
            let mut p = v.packet(op, v.epsn);
            p.bth.dest_qp = qpn;
            packets.push(p);
        }
    }
    dropped_and_counted(&hostile, &v, &packets, "rx_unknown_qp", what);
    assert!(
        hostile.drain(Duration::from_millis(20)).is_empty(),
        "{what}"
    );
    assert_device_serves(what);
}

/// Requests with a P_Key not the QP's (another partition, partition 0
/// full or limited) are dropped and counted in `rx_bad_pkey`; requests
/// from an address other than the QP's peer in `rx_wrong_peer`. Neither
/// executes or moves the expected PSN: a SEND at it then completes.
#[test]
fn bad_pkeys_and_wrong_peers_are_counted_and_dropped() {
    let _serial = serial();
    let hostile = Hostile::bind();
    let v = Victim::rc(&hostile);
    let what = "bad P_Keys";
    let mut packets = Vec::new();
    for pkey in [0x1234, 0x8001, 0x0000, 0x8000, 0x7ffe] {
        for op in [
            Opcode::RC_SEND_ONLY,
            Opcode::RC_RDMA_WRITE_ONLY,
            Opcode::RC_FETCH_ADD,
        ] {
            let mut p = v.packet(op, v.epsn);
            p.bth.pkey = pkey;
            packets.push(p);
        }
    }
    let n = packets.len() as u64;
    let before = stats();
    hostile.send(&packets);
    let after = stats();
    assert_moved(
        &before,
        &after,
        &[("rx_packets", n), ("rx_bad_pkey", n)],
        &[],
        what,
    );

    // The same, valid, from another address.
    let stranger = Hostile::bind();
    let valid: Vec<_> = [Opcode::RC_SEND_ONLY, Opcode::RC_RDMA_WRITE_ONLY]
        .into_iter()
        .map(|op| v.packet(op, v.epsn))
        .collect();
    let before = stats();
    stranger.send(&valid);
    let after = stats();
    assert_moved(
        &before,
        &after,
        &[("rx_packets", 2), ("rx_wrong_peer", 2)],
        &[],
        "a stranger's requests",
    );
    v.assert_state(QpState::Rts, what);
    v.assert_completions(&[], what);
    assert_no_event(&v.side.ctx, what);
    assert_eq!(v.bytes(LAND_AT, 16), [0u8; 16], "{what}: nothing landed");
    assert_eq!(v.atomic_word(), 0, "{what}: no atomic");
    assert!(
        hostile.drain(Duration::from_millis(20)).is_empty(),
        "{what}"
    );
    assert!(stranger.drain(Duration::ZERO).is_empty(), "{what}");
    hostile.send(&[v.packet(Opcode::RC_SEND_ONLY, v.epsn)]);
    v.assert_completions(&[(100, WcStatus::Success, WcOpcode::Recv, 16)], what);
    assert_device_serves(what);
}

/// MADs to QP 1 while the device's connection manager runs — random
/// bytes, random CM-class MADs, CM messages for connections that do not
/// exist — are each taken and counted; no panic; what the CM answers is a
/// valid CM MAD (a DREP to a stray DREQ, as the kernel's CM answers; a
/// REJ to a REQ for a service nobody listens on); and afterwards the CM
/// still connects, and the device still serves.
#[test]
fn garbage_and_stray_cm_mads_are_counted_and_the_cm_still_connects() {
    use rverbs::cm::{CmEventKind, CmId, ConnParam, EventChannel, PortSpace};
    use rverbs_wire::cm::{CmDreqRepr, CmMadRepr, CmMessageRepr, CmRepRepr, CmRtuRepr};

    let _serial = serial();
    let hostile = Hostile::bind();
    let ch = EventChannel::new().unwrap();
    let listener = CmId::new(&ch, PortSpace::Tcp).unwrap();
    listener
        .bind_addr(SocketAddr::new(device().addr(), 0))
        .unwrap();
    listener.listen(4).unwrap();
    let before = stats();

    let to_qp1 = |mad: &[u8]| {
        hostile.forge(&PacketRepr {
            deth: Some(DethRepr {
                qkey: 0x8001_0000,
                src_qp: 1,
            }),
            payload: mad,
            ..PacketRepr::new(BthRepr::new(Opcode::UD_SEND_ONLY, 1, Psn::new(0)))
        })
    };
    let mut rng = Rng(0x00c0_ffee_1234_5678);
    let mut datagrams = Vec::new();
    for i in 0..400 {
        let mut mad = [0u8; 256];
        rng.fill(&mut mad);
        if i % 2 == 0 {
            // A CM MAD header (class 7, version 2, Send) with any attribute.
            mad[..4].copy_from_slice(&[1, 7, 2, 3]);
            mad[16..18].copy_from_slice(&(0x10 + rng.below(12) as u16).to_be_bytes());
        }
        datagrams.push(to_qp1(&mad));
    }
    // Messages for no connection: a REP, an RTU, a DREQ.
    let stray = |message| {
        let mut mad = [0u8; 256];
        CmMadRepr::send(0x77, message).emit(&mut mad);
        to_qp1(&mad)
    };
    datagrams.push(stray(CmMessageRepr::Rep(CmRepRepr {
        local_comm_id: 0x1111,
        remote_comm_id: 0x2222,
        local_qkey: 0,
        local_qpn: 0x42,
        local_eecn: 0,
        vendor_id: 0,
        starting_psn: Psn::new(7),
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 15,
        failover_accepted: 0,
        end_to_end_flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 0x99,
        private_data: [0; 196],
    })));
    datagrams.push(stray(CmMessageRepr::Rtu(CmRtuRepr {
        local_comm_id: 0x1111,
        remote_comm_id: 0x2222,
        private_data: [0; 224],
    })));
    datagrams.push(stray(CmMessageRepr::Dreq(CmDreqRepr {
        local_comm_id: 0x3333,
        remote_comm_id: 0x4444,
        remote_qpn: 0x42,
        private_data: [0; 220],
    })));
    let sent = hostile.send_all(datagrams);

    // The engine took every one for the CM; the CM decoded or dropped each.
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let s = stats();
        let seen = (s.cm_received - before.cm_received) + (s.cm_dropped - before.cm_dropped);
        if seen >= sent || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(
        after.mads_received - before.mads_received,
        sent,
        "{after:?}"
    );
    assert_eq!(after.mads_dropped, before.mads_dropped);
    assert!(
        (after.cm_received - before.cm_received) + (after.cm_dropped - before.cm_dropped) >= sent,
        "every MAD decoded or dropped: {after:?}"
    );
    // What came back is valid CM MADs, among them the stray DREQ's DREP.
    let answers = hostile.drain(Duration::from_millis(200));
    let mut drep = false;
    for a in &answers {
        let p = a.repr();
        assert_eq!(
            (p.bth.opcode, p.bth.dest_qp),
            (Opcode::UD_SEND_ONLY, 1),
            "{a:?}"
        );
        let mad = CmMadRepr::parse(p.payload).expect("the CM sends valid CM MADs");
        drep |= matches!(mad.message, CmMessageRepr::Drep(d) if d.remote_comm_id == 0x3333);
    }
    assert!(drep, "the stray DREQ is answered: {answers:?}");

    // The CM still connects, on this device.
    let port = listener.local_addr().unwrap().port();
    let cch = EventChannel::new().unwrap();
    let client = CmId::new(&cch, PortSpace::Tcp).unwrap();
    client
        .resolve_addr(None, SocketAddr::new(device().addr(), port))
        .unwrap();
    let next = |ch: &EventChannel| {
        ch.get_event_timeout(Duration::from_secs(20))
            .unwrap()
            .unwrap()
    };
    assert_eq!(next(&cch).kind, CmEventKind::AddrResolved);
    client.resolve_route().unwrap();
    assert_eq!(next(&cch).kind, CmEventKind::RouteResolved);
    client
        .connect(
            None,
            &ConnParam {
                qp_num: 0x77,
                ..ConnParam::default()
            },
        )
        .unwrap();
    let req = next(&ch);
    assert_eq!(req.kind, CmEventKind::ConnectRequest);
    req.id
        .accept(
            None,
            &ConnParam {
                qp_num: 0x78,
                ..ConnParam::default()
            },
        )
        .unwrap();
    let resp = next(&cch);
    assert_eq!(resp.kind, CmEventKind::ConnectResponse);
    client.establish().unwrap();
    assert_eq!(next(&cch).kind, CmEventKind::Established);
    assert_eq!(next(&ch).kind, CmEventKind::Established);
    // Hang up and let the CM fall quiet before the next case counts.
    client.disconnect().unwrap();
    assert_eq!(next(&cch).kind, CmEventKind::Disconnected);
    assert_eq!(next(&ch).kind, CmEventKind::Disconnected);
    drop((client, req, listener));
    let mut last = stats();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let s = stats();
        if (s.mads_sent, s.mads_received) == (last.mads_sent, last.mads_received) {
            break;
        }
        last = s;
    }
    assert_device_serves("garbage MADs");
}
