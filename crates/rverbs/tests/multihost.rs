//! RC between separate processes, each with its own software device:
//!
//! - `two_processes_on_one_host`: this process and a child on the loopback
//!   default addresses (127.0.0.x), connected with `rverbs::cm` over TCP;
//!   SEND/RECV with and without immediate, RDMA WRITE (with immediate),
//!   RDMA READ and atomics, including a 64 MiB WRITE and a 64 MiB READ.
//! - `two_namespaces_with_loss`: two network namespaces joined by a veth
//!   pair, one peer process in each configured with `RVERBS_ADDR`, and an
//!   nftables rule dropping a few percent of the RoCE packets entering one
//!   namespace. Each peer sends the other thousands of messages (SENDs with
//!   and without immediate, RDMA WRITEs announced by a SEND or carrying an
//!   immediate), which must arrive exactly once, in order and intact, mixed
//!   with RDMA READs (small ones, and large ones that take several READ
//!   requests) and fetch-adds that must apply exactly once. Needs root,
//!   `ip` (iproute2) and `nft` (nftables); without them it is skipped, unless
//!   `CI` is set.
//!
//! The test binary is its own peer (as `processes.rs` is): a test runs
//! `<this binary> --exact <test> --nocapture` with `RVERBS_MULTIHOST_ROLE`
//! naming the part the child plays, and the test function plays that part
//! instead of the parent's.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod common;
use common::{find_tool, is_root, run};

use rverbs::cm::{self, ConnectOptions, Endpoint};
use rverbs::{
    devices, AccessFlags, CompletionQueue, Context, Device, Gid, MemoryRegion, Mtu,
    ProtectionDomain, QpCaps, QpState, QueuePair, RecvWr, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode,
};

/// Selects the part a child plays (unset in the parent).
const ROLE: &str = "RVERBS_MULTIHOST_ROLE";
/// Where the one-host peer finds the parent's TCP listener.
const CONNECT_TO: &str = "RVERBS_MULTIHOST_CONNECT";
/// A namespace peer's partner address.
const PEER_ADDR: &str = "RVERBS_MULTIHOST_PEER";
/// The veth interface a namespace peer's address is on.
const IFACE: &str = "RVERBS_MULTIHOST_IFACE";

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

// ---------------------------------------------------------------------------
// Shared helpers

/// The splitmix64 step: a fast, well-mixed pseudo-random sequence.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn mix(x: u64) -> u64 {
    let mut s = x;
    splitmix(&mut s)
}

/// `len` pseudo-random bytes determined by `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut s = seed;
    for chunk in out.chunks_mut(8) {
        let word = splitmix(&mut s).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    out
}

/// Panics naming the first differing byte unless `got == want`.
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    if let Some(i) = mismatch(got, want) {
        panic!(
            "{what}: {} bytes, {} expected; first difference at byte {i}: got {:?}, want {:?}",
            got.len(),
            want.len(),
            got.get(i),
            want.get(i)
        );
    }
}

fn mismatch(got: &[u8], want: &[u8]) -> Option<usize> {
    if got == want {
        return None;
    }
    Some(
        got.iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len())),
    )
}

/// One side of a connection: a context with its own send and receive CQs, a
/// QP and one MR with all access.
struct Side {
    qp: QueuePair,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    mr: MemoryRegion,
    _pd: ProtectionDomain,
    ctx: Context,
    dev: Device,
}

impl Side {
    fn open(mr_len: usize, max_wr: u32) -> Side {
        let dev = devices().expect("the rverbs devices").remove(0);
        let ctx = dev.open().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let send_cq = ctx.create_cq(4 * max_wr).unwrap();
        let recv_cq = ctx.create_cq(4 * max_wr).unwrap();
        let qp = pd
            .qp_builder(&send_cq, &recv_cq)
            .caps(QpCaps {
                max_send_wr: max_wr,
                max_recv_wr: max_wr,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            })
            .build()
            .unwrap();
        let mr = pd.alloc_mr(mr_len, ALL).unwrap();
        Side {
            qp,
            send_cq,
            recv_cq,
            mr,
            _pd: pd,
            ctx,
            dev,
        }
    }

    fn sge(&self, offset: usize, len: usize) -> Sge {
        Sge {
            addr: self.mr.iova() + offset as u64,
            length: u32::try_from(len).unwrap(),
            lkey: self.mr.lkey(),
        }
    }

    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.mr.read_at(offset, &mut buf).unwrap();
        buf
    }

    fn read_u64(&self, offset: usize) -> u64 {
        u64::from_ne_bytes(self.read(offset, 8).try_into().unwrap())
    }

    /// Asserts that neither CQ holds a completion nobody expected.
    fn assert_no_more_completions(&self) {
        let mut buf = [WorkCompletion::default(); 8];
        for (cq, which) in [(&self.send_cq, "send"), (&self.recv_cq, "receive")] {
            let k = cq.poll(&mut buf).unwrap();
            assert_eq!(k, 0, "unexpected {which} completions: {:?}", &buf[..k]);
        }
    }
}

/// Polls until exactly `n` completions arrived.
fn wait_cq(cq: &CompletionQueue, n: usize, timeout: Duration, what: &str) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + timeout;
    let mut got = Vec::with_capacity(n);
    let mut buf = [WorkCompletion::default(); 32];
    while got.len() < n {
        let want = (n - got.len()).min(buf.len());
        let k = cq.poll(&mut buf[..want]).unwrap();
        got.extend_from_slice(&buf[..k]);
        if k == 0 {
            assert!(
                Instant::now() < deadline,
                "{what}: only {} of {n} completions after {timeout:?}: {got:?}",
                got.len()
            );
            std::thread::yield_now();
        }
    }
    got
}

/// Asserts a completion's wr_id, status, opcode, byte_len and immediate.
fn check_wc(wc: &WorkCompletion, wr_id: u64, opcode: WcOpcode, len: Option<u32>, imm: Option<u32>) {
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (wr_id, WcStatus::Success, opcode),
        "{wc:?}"
    );
    if let Some(len) = len {
        assert_eq!(wc.byte_len, len, "byte_len of {wc:?}");
    }
    assert_eq!(wc.imm(), imm, "immediate of {wc:?}");
}

/// A line protocol over the TCP connection the endpoints were exchanged on.
struct Link {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Link {
    fn new(stream: TcpStream) -> Link {
        stream
            .set_read_timeout(Some(Duration::from_secs(150)))
            .unwrap();
        Link {
            reader: BufReader::new(stream.try_clone().unwrap()),
            writer: stream,
        }
    }

    fn send(&mut self, line: &str) {
        self.writer
            .write_all(format!("{line}\n").as_bytes())
            .unwrap_or_else(|e| panic!("sending {line:?} to the peer: {e}"));
    }

    fn recv(&mut self) -> String {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("reading from the peer: {e}"));
        assert!(n > 0, "the peer closed the connection (did it fail?)");
        line.trim_end().to_string()
    }

    fn expect(&mut self, want: &str) {
        let got = self.recv();
        assert_eq!(got, want, "the peer answered {got:?}");
    }
}

/// A child process of this test binary; its output is echoed (the test
/// harness captures it) and collected. Dropping it kills it if it still runs.
struct PeerProcess {
    name: String,
    child: Child,
    output: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

impl PeerProcess {
    fn spawn(name: &str, mut cmd: Command) -> PeerProcess {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {name} ({cmd:?}): {e}"));
        let output = Arc::new(Mutex::new(String::new()));
        let stdout: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let stderr: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        let readers = [stdout, stderr]
            .into_iter()
            .map(|pipe| {
                let output = output.clone();
                let name = name.to_string();
                std::thread::spawn(move || {
                    for line in BufReader::new(pipe).lines() {
                        let Ok(line) = line else { break };
                        println!("[{name}] {line}");
                        let mut out = output.lock().unwrap();
                        out.push_str(&line);
                        out.push('\n');
                    }
                })
            })
            .collect();
        PeerProcess {
            name: name.to_string(),
            child,
            output,
            readers,
        }
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Waits for the child to exit successfully; returns its output.
    fn finish(&mut self, deadline: Instant) -> String {
        let status = loop {
            if let Some(status) = self.exited() {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("{} did not finish in time; killed it", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        for r in std::mem::take(&mut self.readers) {
            r.join().unwrap();
        }
        let output = self.output.lock().unwrap().clone();
        assert!(
            status.success(),
            "{} failed ({status}); its output:\n{output}",
            self.name
        );
        output
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The command line that runs `test` of this binary as a child: `--exact`
/// selects the test, `ROLE` the part it plays.
fn self_args(test: &str) -> [std::ffi::OsString; 4] {
    [
        std::env::current_exe().unwrap().into_os_string(),
        "--exact".into(),
        test.into(),
        "--nocapture".into(),
    ]
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

fn accept_before(
    listener: &TcpListener,
    deadline: Instant,
    mut peer: Option<&mut PeerProcess>,
) -> TcpStream {
    listener.set_nonblocking(true).unwrap();
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).unwrap();
                return stream;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if let Some(p) = peer.as_deref_mut() {
                    if let Some(status) = p.exited() {
                        panic!("{} exited ({status}) before connecting", p.name);
                    }
                }
                assert!(Instant::now() < deadline, "no peer connected in time");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------
// (a) Two processes on one host

const TEST_LOCAL: &str = "two_processes_on_one_host";
/// The big transfers.
const BIG: usize = 64 << 20;
/// 1 MiB of scratch for sends and small RDMA.
const SMALL_OFF: usize = BIG;
/// Receive buffers, `RECV_SLOT` bytes each.
const RECV_OFF: usize = BIG + (1 << 20);
const RECV_SLOT: usize = 128 << 10;
/// Atomic targets (peer) and results (parent).
const ATOMIC_OFF: usize = BIG + (2 << 20);
const LOCAL_MR_LEN: usize = BIG + (3 << 20);

const SEND_GATHER_SEED: u64 = 0x5eed_0001;
const SEND_IMM_SEED: u64 = 0x5eed_0002;
const WRITE_IMM_SEED: u64 = 0x5eed_0003;
const BACK_SEED: u64 = 0x5eed_0004;
const SMALL_WRITE_SEED: u64 = 0x5eed_0005;
const BIG_WRITE_SEED: u64 = 0x5eed_0006;
const BIG_READ_SEED: u64 = 0x5eed_0007;
const SMALL_READ_SEED: u64 = 0x5eed_0008;

const SEND_IMM_LEN: usize = 100_000;
const WRITE_IMM_LEN: usize = 20_000;
const WRITE_IMM_AT: usize = SMALL_OFF + 333;
const INLINE_MSG: &[u8] = b"inline payload across processes";
const BACK_LEN: usize = 3000;
const BACK_GATHER: [usize; 2] = [1000, 69_001];

/// Initial values of the peer's atomic targets at ATOMIC_OFF + 0, 8, 16.
const COUNTERS: [u64; 3] = [0xffff_ffff, 100, u64::MAX];
const FETCH_ADDS: u64 = 64;

fn local_opts() -> ConnectOptions {
    ConnectOptions {
        timeout: 16,
        retry_cnt: 7,
        ..ConnectOptions::default()
    }
}

#[test]
fn two_processes_on_one_host() {
    match std::env::var(ROLE).as_deref() {
        Ok("local-peer") => return local_peer(),
        Ok(_) => return, // a child process of another test
        Err(_) => {}
    }
    let t0 = Instant::now();
    let phase = |what: &str| println!("{TEST_LOCAL}: {what} at {:?}", t0.elapsed());
    let deadline = Instant::now() + Duration::from_secs(240);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(&self_args(TEST_LOCAL)[1..])
        .env(ROLE, "local-peer")
        .env(CONNECT_TO, listener.local_addr().unwrap().to_string())
        .env_remove("RVERBS_ADDR")
        .env_remove("RVERBS_CONFIG");
    let mut peer = PeerProcess::spawn("peer", cmd);

    let a = Side::open(LOCAL_MR_LEN, 256);
    let stream = accept_before(
        &listener,
        Instant::now() + Duration::from_secs(60),
        Some(&mut peer),
    );
    let me = Endpoint::for_qp(&a.qp).with_buffer(&a.mr);
    let remote = cm::connect(&a.qp, &stream, &me, &local_opts()).unwrap();
    let mut link = Link::new(stream);
    phase("connected");

    // Each process has its own device on its own loopback address.
    let line = link.recv();
    let f: Vec<&str> = line.split(' ').collect();
    assert_eq!((f.len(), f[0]), (4, "device"), "{line}");
    let peer_ip: IpAddr = f[1].parse().unwrap();
    assert!(
        a.dev.addr().is_loopback() && peer_ip.is_loopback(),
        "{line}"
    );
    assert_ne!(a.dev.addr(), peer_ip, "two processes, two addresses");
    assert_eq!(me.gid, Gid::from_ip(a.dev.addr()));
    assert_eq!(remote.gid, Gid::from_ip(peer_ip));
    assert_eq!(f[2], remote.gid.to_string());
    assert_eq!(u32::from_str_radix(f[3], 16).unwrap(), remote.qpn);
    assert_eq!(remote.len, LOCAL_MR_LEN as u64);
    let q = a.qp.query().unwrap();
    assert_eq!((q.qp_state, q.dest_qp_num), (QpState::Rts, remote.qpn));
    assert_eq!(q.ah_attr.dgid, remote.gid);

    // SEND / RECV from here to the peer: gathered, with immediate, inline
    // with immediate, WRITE with immediate, and zero bytes.
    link.expect("recv-ready");
    let gather = pattern(SEND_GATHER_SEED, 5000);
    a.mr.write_at(SMALL_OFF, &gather[..3000]).unwrap();
    a.mr.write_at(SMALL_OFF + 4096, &gather[3000..]).unwrap();
    a.mr.write_at(SMALL_OFF + 8192, &pattern(SEND_IMM_SEED, SEND_IMM_LEN))
        .unwrap();
    a.mr.write_at(SMALL_OFF + 200_000, &pattern(WRITE_IMM_SEED, WRITE_IMM_LEN))
        .unwrap();
    let two = [a.sge(SMALL_OFF, 3000), a.sge(SMALL_OFF + 4096, 2000)];
    let one = [a.sge(SMALL_OFF + 8192, SEND_IMM_LEN)];
    let wimm = [a.sge(SMALL_OFF + 200_000, WRITE_IMM_LEN)];
    a.qp.post_send_list(&[
        SendWr::new(11, WrOpcode::Send, &two).signaled(),
        SendWr::new(12, WrOpcode::SendWithImm { imm: 0xdead_beef }, &one).signaled(),
        SendWr::inline(13, WrOpcode::SendWithImm { imm: 0x1234_5678 }, INLINE_MSG).signaled(),
        SendWr::new(
            14,
            WrOpcode::RdmaWriteWithImm {
                remote_addr: remote.addr + WRITE_IMM_AT as u64,
                rkey: remote.rkey,
                imm: 0xabcd_ef01,
            },
            &wimm,
        )
        .signaled(),
        SendWr::new(15, WrOpcode::Send, &[]).signaled(),
    ])
    .unwrap();
    let wcs = wait_cq(&a.send_cq, 5, Duration::from_secs(30), "sends");
    for (wc, (id, op)) in wcs.iter().zip([
        (11, WcOpcode::Send),
        (12, WcOpcode::Send),
        (13, WcOpcode::Send),
        (14, WcOpcode::RdmaWrite),
        (15, WcOpcode::Send),
    ]) {
        check_wc(wc, id, op, None, None);
        assert_eq!(wc.qp_num, a.qp.qp_num());
    }
    link.expect("recv-ok");
    phase("sends checked");

    // And back: the peer SENDs with immediate into two scattered buffers.
    a.qp.post_recv(&RecvWr::new(
        201,
        &[
            a.sge(RECV_OFF, BACK_GATHER[0]),
            a.sge(RECV_OFF + RECV_SLOT, BACK_GATHER[1]),
        ],
    ))
    .unwrap();
    a.qp.post_recv(&RecvWr::new(
        202,
        &[a.sge(RECV_OFF + 2 * RECV_SLOT, RECV_SLOT)],
    ))
    .unwrap();
    link.send("recv-ready");
    let wcs = wait_cq(&a.recv_cq, 2, Duration::from_secs(30), "receives");
    check_wc(
        &wcs[0],
        201,
        WcOpcode::Recv,
        Some(BACK_LEN as u32),
        Some(0x0bad_cafe),
    );
    let back = pattern(BACK_SEED, BACK_LEN + 64_000);
    let mut got = a.read(RECV_OFF, BACK_GATHER[0]);
    got.extend(a.read(RECV_OFF + RECV_SLOT, BACK_LEN - BACK_GATHER[0]));
    assert_same(&got, &back[..BACK_LEN], "SEND with immediate from the peer");
    check_wc(&wcs[1], 202, WcOpcode::Recv, Some(64_000), None);
    assert_same(
        &a.read(RECV_OFF + 2 * RECV_SLOT, 64_000),
        &back[BACK_LEN..],
        "SEND from the peer",
    );
    assert_eq!(wcs[0].qp_num, a.qp.qp_num());
    link.expect("sent");
    phase("receives checked");

    // RDMA WRITE: a small unaligned one, then 64 MiB.
    let small = pattern(SMALL_WRITE_SEED, 77_777);
    a.mr.write_at(SMALL_OFF + 300_000, &small).unwrap();
    let at = SMALL_OFF + 500_013;
    a.qp.post_send(
        &SendWr::new(
            31,
            WrOpcode::RdmaWrite {
                remote_addr: remote.addr + at as u64,
                rkey: remote.rkey,
            },
            &[a.sge(SMALL_OFF + 300_000, small.len())],
        )
        .signaled(),
    )
    .unwrap();
    let wc = wait_cq(&a.send_cq, 1, Duration::from_secs(30), "small WRITE");
    check_wc(&wc[0], 31, WcOpcode::RdmaWrite, None, None);
    link.send(&format!("check {at} {} {SMALL_WRITE_SEED}", small.len()));
    link.expect("ok");

    a.mr.write_at(0, &pattern(BIG_WRITE_SEED, BIG)).unwrap();
    phase("64 MiB WRITE posted");
    let t = Instant::now();
    a.qp.post_send(
        &SendWr::new(
            32,
            WrOpcode::RdmaWrite {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            &[a.sge(0, BIG)],
        )
        .signaled(),
    )
    .unwrap();
    let wc = wait_cq(&a.send_cq, 1, Duration::from_secs(120), "64 MiB WRITE");
    check_wc(&wc[0], 32, WcOpcode::RdmaWrite, None, None);
    println!("{TEST_LOCAL}: 64 MiB RDMA WRITE took {:?}", t.elapsed());
    link.send(&format!("check 0 {BIG} {BIG_WRITE_SEED}"));
    link.expect("ok");
    phase("64 MiB WRITE verified by the peer");

    // RDMA READ: 64 MiB, then a small unaligned one into two SGEs.
    link.send(&format!("fill 0 {BIG} {BIG_READ_SEED}"));
    link.expect("ok");
    a.mr.write_at(0, &vec![0u8; BIG]).unwrap();
    let t = Instant::now();
    a.qp.post_send(
        &SendWr::new(
            41,
            WrOpcode::RdmaRead {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            &[a.sge(0, BIG)],
        )
        .signaled(),
    )
    .unwrap();
    let wc = wait_cq(&a.send_cq, 1, Duration::from_secs(120), "64 MiB READ");
    check_wc(&wc[0], 41, WcOpcode::RdmaRead, Some(BIG as u32), None);
    println!("{TEST_LOCAL}: 64 MiB RDMA READ took {:?}", t.elapsed());
    assert_same(&a.read(0, BIG), &pattern(BIG_READ_SEED, BIG), "64 MiB READ");
    phase("64 MiB READ verified");

    let at = SMALL_OFF + 700_001;
    link.send(&format!("fill {at} 50001 {SMALL_READ_SEED}"));
    link.expect("ok");
    a.qp.post_send(
        &SendWr::new(
            42,
            WrOpcode::RdmaRead {
                remote_addr: remote.addr + at as u64,
                rkey: remote.rkey,
            },
            &[
                a.sge(SMALL_OFF + 600_000, 20_000),
                a.sge(SMALL_OFF + 650_000, 30_001),
            ],
        )
        .signaled(),
    )
    .unwrap();
    let wc = wait_cq(&a.send_cq, 1, Duration::from_secs(30), "small READ");
    check_wc(&wc[0], 42, WcOpcode::RdmaRead, Some(50_001), None);
    let mut got = a.read(SMALL_OFF + 600_000, 20_000);
    got.extend(a.read(SMALL_OFF + 650_000, 30_001));
    assert_same(&got, &pattern(SMALL_READ_SEED, 50_001), "small READ");

    // Atomics on the peer's counters.
    let target = |i: usize| remote.addr + (ATOMIC_OFF + 8 * i) as u64;
    let res = |i: usize| [a.sge(ATOMIC_OFF + 8 * i, 8)];
    let (r0, r1, r2, r3) = (res(0), res(1), res(2), res(3));
    let mut wrs = vec![
        SendWr::new(
            51,
            WrOpcode::AtomicFetchAndAdd {
                remote_addr: target(0),
                rkey: remote.rkey,
                add: 1,
            },
            &r0,
        ),
        SendWr::new(
            52,
            WrOpcode::AtomicCmpAndSwp {
                remote_addr: target(0),
                rkey: remote.rkey,
                compare: 0x1_0000_0000,
                swap: 0xdead_beef_0000_0001,
            },
            &r1,
        ),
        SendWr::new(
            53,
            WrOpcode::AtomicCmpAndSwp {
                remote_addr: target(0),
                rkey: remote.rkey,
                compare: 5,
                swap: 6,
            },
            &r2,
        ),
        SendWr::new(
            54,
            WrOpcode::AtomicFetchAndAdd {
                remote_addr: target(2),
                rkey: remote.rkey,
                add: 2,
            },
            &r3,
        ),
    ];
    let adds: Vec<[Sge; 1]> = (0..FETCH_ADDS as usize).map(|k| res(4 + k)).collect();
    for (k, sge) in adds.iter().enumerate() {
        wrs.push(SendWr::new(
            100 + k as u64,
            WrOpcode::AtomicFetchAndAdd {
                remote_addr: target(1),
                rkey: remote.rkey,
                add: 3,
            },
            sge,
        ));
    }
    let wrs: Vec<SendWr> = wrs.into_iter().map(SendWr::signaled).collect();
    a.qp.post_send_list(&wrs).unwrap();
    let wcs = wait_cq(&a.send_cq, wrs.len(), Duration::from_secs(30), "atomics");
    for (wc, wr) in wcs.iter().zip(&wrs) {
        let op = match wr.opcode {
            WrOpcode::AtomicCmpAndSwp { .. } => WcOpcode::CompSwap,
            _ => WcOpcode::FetchAdd,
        };
        check_wc(wc, wr.wr_id, op, Some(8), None);
    }
    assert_eq!(a.read_u64(ATOMIC_OFF), COUNTERS[0], "fetch-add result");
    assert_eq!(
        a.read_u64(ATOMIC_OFF + 8),
        0x1_0000_0000,
        "swapping CAS result"
    );
    assert_eq!(
        a.read_u64(ATOMIC_OFF + 16),
        0xdead_beef_0000_0001,
        "failing CAS result"
    );
    assert_eq!(
        a.read_u64(ATOMIC_OFF + 24),
        u64::MAX,
        "wrapping fetch-add result"
    );
    for k in 0..FETCH_ADDS as usize {
        assert_eq!(
            a.read_u64(ATOMIC_OFF + 32 + 8 * k),
            COUNTERS[1] + 3 * k as u64,
            "fetch-add #{k} result"
        );
    }
    for (i, want) in [
        (0, 0xdead_beef_0000_0001),
        (1, COUNTERS[1] + 3 * FETCH_ADDS),
        (2, 1),
    ] {
        link.send(&format!("get-u64 {}", ATOMIC_OFF + 8 * i));
        assert_eq!(link.recv(), format!("value {want:x}"), "peer counter {i}");
    }
    phase("atomics checked");

    link.send("done");
    let bye = link.recv();
    assert!(bye.starts_with("bye"), "{bye}");
    a.assert_no_more_completions();
    assert_eq!(a.qp.state(), QpState::Rts);
    peer.finish(deadline);
    let stats = a.dev.net_stats();
    println!(
        "{TEST_LOCAL}: done in {:?}; here {stats:?}; peer {bye}",
        t0.elapsed()
    );
    assert_eq!(stats.rx_icrc_errors, 0);
}

/// The peer of `two_processes_on_one_host`, in a child process.
fn local_peer() {
    let addr: SocketAddr = env(CONNECT_TO).parse().unwrap();
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).unwrap();
    let b = Side::open(LOCAL_MR_LEN, 256);
    for (i, v) in COUNTERS.iter().enumerate() {
        b.mr.write_at(ATOMIC_OFF + 8 * i, &v.to_ne_bytes()).unwrap();
    }
    let me = Endpoint::for_qp(&b.qp).with_buffer(&b.mr);
    let remote = cm::connect(&b.qp, &stream, &me, &local_opts()).unwrap();
    let mut link = Link::new(stream);
    assert_eq!(me.gid, Gid::from_ip(b.dev.addr()));
    link.send(&format!(
        "device {} {} {:x}",
        b.dev.addr(),
        b.qp.local_gid(),
        b.qp.qp_num()
    ));

    // Five receives for the parent's sends.
    for k in 0..5 {
        b.qp.post_recv(&RecvWr::new(
            101 + k as u64,
            &[b.sge(RECV_OFF + k * RECV_SLOT, RECV_SLOT)],
        ))
        .unwrap();
    }
    link.send("recv-ready");
    let wcs = wait_cq(&b.recv_cq, 5, Duration::from_secs(30), "peer receives");
    check_wc(&wcs[0], 101, WcOpcode::Recv, Some(5000), None);
    assert_same(
        &b.read(RECV_OFF, 5000),
        &pattern(SEND_GATHER_SEED, 5000),
        "gathered SEND",
    );
    check_wc(
        &wcs[1],
        102,
        WcOpcode::Recv,
        Some(SEND_IMM_LEN as u32),
        Some(0xdead_beef),
    );
    assert_same(
        &b.read(RECV_OFF + RECV_SLOT, SEND_IMM_LEN),
        &pattern(SEND_IMM_SEED, SEND_IMM_LEN),
        "SEND with immediate",
    );
    check_wc(
        &wcs[2],
        103,
        WcOpcode::Recv,
        Some(INLINE_MSG.len() as u32),
        Some(0x1234_5678),
    );
    assert_same(
        &b.read(RECV_OFF + 2 * RECV_SLOT, INLINE_MSG.len()),
        INLINE_MSG,
        "inline SEND",
    );
    check_wc(
        &wcs[3],
        104,
        WcOpcode::RecvRdmaWithImm,
        Some(WRITE_IMM_LEN as u32),
        Some(0xabcd_ef01),
    );
    assert_same(
        &b.read(WRITE_IMM_AT, WRITE_IMM_LEN),
        &pattern(WRITE_IMM_SEED, WRITE_IMM_LEN),
        "WRITE with immediate",
    );
    check_wc(&wcs[4], 105, WcOpcode::Recv, Some(0), None);
    for wc in &wcs {
        assert_eq!(wc.qp_num, b.qp.qp_num());
    }
    link.send("recv-ok");

    // SENDs back: with immediate, then a plain one, from two SGEs each.
    link.expect("recv-ready");
    let back = pattern(BACK_SEED, BACK_LEN + 64_000);
    b.mr.write_at(SMALL_OFF, &back).unwrap();
    let s1 = [b.sge(SMALL_OFF, 10), b.sge(SMALL_OFF + 10, BACK_LEN - 10)];
    let s2 = [
        b.sge(SMALL_OFF + BACK_LEN, 32_000),
        b.sge(SMALL_OFF + BACK_LEN + 32_000, 32_000),
    ];
    b.qp.post_send_list(&[
        SendWr::new(21, WrOpcode::SendWithImm { imm: 0x0bad_cafe }, &s1).signaled(),
        SendWr::new(22, WrOpcode::Send, &s2).signaled(),
    ])
    .unwrap();
    let wcs = wait_cq(&b.send_cq, 2, Duration::from_secs(30), "peer sends");
    check_wc(&wcs[0], 21, WcOpcode::Send, None, None);
    check_wc(&wcs[1], 22, WcOpcode::Send, None, None);
    link.send("sent");

    // Then serve the parent's requests.
    loop {
        let line = link.recv();
        let f: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| f[i].parse::<u64>().unwrap();
        match f[0] {
            "check" => {
                let (at, len, seed) = (num(1) as usize, num(2) as usize, num(3));
                let got = b.read(at, len);
                match mismatch(&got, &pattern(seed, len)) {
                    None => link.send("ok"),
                    Some(i) => link.send(&format!("mismatch at byte {i} of {len}")),
                }
            }
            "fill" => {
                let (at, len, seed) = (num(1) as usize, num(2) as usize, num(3));
                b.mr.write_at(at, &pattern(seed, len)).unwrap();
                link.send("ok");
            }
            "get-u64" => link.send(&format!("value {:x}", b.read_u64(num(1) as usize))),
            "done" => break,
            other => panic!("unknown request {other:?}"),
        }
    }
    b.assert_no_more_completions();
    assert_eq!(b.qp.state(), QpState::Rts);
    assert_eq!(remote.qpn, b.qp.query().unwrap().dest_qp_num);
    let stats = b.dev.net_stats();
    assert_eq!(stats.rx_icrc_errors, 0);
    link.send(&format!(
        "bye tx_packets {} rx_packets {}",
        stats.tx_packets, stats.rx_packets
    ));
}

// ---------------------------------------------------------------------------
// (b) Two network namespaces with packet loss

const TEST_NETNS: &str = "two_namespaces_with_loss";
const LOSS_PERCENT: u32 = 3;
/// Messages each way.
const MESSAGES: u64 = 3000;
const MAX_MSG: usize = 40 << 10;
/// Send WRs outstanding at most.
const WINDOW: usize = 64;
/// Receive WRs posted.
const RQ_DEPTH: usize = 256;
/// RDMA WRITE targets. A WRITE for message m is placed only after message
/// m-1 took a receive WR, so (receives being reposted after a message is
/// checked) messages up to m-1-RQ_DEPTH have been checked: more slots than
/// RQ_DEPTH + 1 and no WRITE overwrites a slot not checked yet.
const WRITE_SLOTS: usize = RQ_DEPTH + 16;
const READ_MAX: usize = 32 << 10;
/// Large READs: more packets than one READ request asks for at a time at
/// the veth's MTU, so they take several requests.
const BIG_READ_MIN: usize = 700 << 10;
const STATIC_LEN: usize = 1 << 20;
const HEADER: usize = 16;
const MAGIC: u32 = 0x524d_4831;
const TCP_PORT: u16 = 18515;

// The namespace peers' MR layout.
const STAGE_OFF: usize = 0;
const STAGE_SLOTS: usize = 2 * WINDOW;
const NS_RECV_OFF: usize = STAGE_OFF + STAGE_SLOTS * MAX_MSG;
const WSLOT_OFF: usize = NS_RECV_OFF + RQ_DEPTH * MAX_MSG;
const STATIC_OFF: usize = WSLOT_OFF + WRITE_SLOTS * MAX_MSG;
const LAND_OFF: usize = STATIC_OFF + STATIC_LEN;
const BIG_LAND_OFF: usize = LAND_OFF + WINDOW * READ_MAX;
const COUNTER_OFF: usize = BIG_LAND_OFF + STATIC_LEN;
const RESULT_OFF: usize = COUNTER_OFF + 8;
const NS_MR_LEN: usize = RESULT_OFF + WINDOW * 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send = 1,
    SendImm = 2,
    /// An RDMA WRITE, then an inline SEND of the header announcing it.
    Write = 3,
    WriteImm = 4,
}

/// Message `seq` of the stream the peer with `seed` sends.
fn message(seed: u64, seq: u64) -> (Kind, usize) {
    let h = mix(seed ^ seq.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let kind = match h % 16 {
        0..=7 => Kind::Send,
        8..=9 => Kind::SendImm,
        10..=12 => Kind::Write,
        _ => Kind::WriteImm,
    };
    let r = (h >> 16) as usize;
    let len = match (seq % 500, (h >> 8) % 100) {
        (1, _) => MAX_MSG,
        (2, _) => 1024,
        (3, _) => 1025,
        (4, _) => HEADER,
        (_, 0..=59) => HEADER + r % 1009,
        (_, 60..=84) => 1025 + r % 7168,
        _ => 8193 + r % (MAX_MSG - 8193),
    };
    (kind, len)
}

fn header(seq: u64, kind: Kind, len: usize) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&(seq as u32).to_le_bytes());
    h[8..12].copy_from_slice(&(kind as u32).to_le_bytes());
    h[12..].copy_from_slice(&(len as u32).to_le_bytes());
    h
}

/// The bytes of message `seq`: for SENDs the header and a pattern, for
/// WRITEs the pattern the WRITE places.
fn body(seed: u64, seq: u64, kind: Kind, len: usize) -> Vec<u8> {
    let data_seed = mix(seed.wrapping_add(seq) ^ 0xb0d1);
    match kind {
        Kind::Send | Kind::SendImm => {
            let mut v = header(seq, kind, len).to_vec();
            v.extend(pattern(data_seed, len - HEADER));
            v
        }
        Kind::Write | Kind::WriteImm => pattern(data_seed, len),
    }
}

fn imm_for(kind: Kind, seq: u64) -> u32 {
    match kind {
        Kind::SendImm => !(seq as u32),
        _ => (seq as u32).wrapping_mul(0x9e37_79b1),
    }
}

fn reads_at(seq: u64) -> bool {
    seq % 16 == 5
}

/// One large READ every 128 messages: more than WINDOW WRs apart, so the
/// previous one completed and its landing area is free.
fn big_read_at(seq: u64) -> bool {
    seq % 128 == 77
}

fn atomic_at(seq: u64) -> bool {
    seq % 32 == 9
}

fn stream_seed(role: &str) -> u64 {
    match role {
        "ns-a" => 0xaaaa_0000_1111,
        _ => 0xbbbb_0000_2222,
    }
}

fn static_seed(role: &str) -> u64 {
    stream_seed(role) ^ 0x57a7_1c00
}

fn ns_opts() -> ConnectOptions {
    // Generous: ~268 ms local ACK timeout, 7 retries, RNR retries for ever.
    ConnectOptions {
        timeout: 16,
        retry_cnt: 7,
        rnr_retry: 7,
        ..ConnectOptions::default()
    }
}

/// The drop counter of the loss rule.
fn nft_drops(ip: &Path, nft: &Path, ns: &str) -> u64 {
    let listing = run(
        ip,
        &[
            "netns",
            "exec",
            ns,
            nft.to_str().unwrap(),
            "list",
            "chain",
            "inet",
            "rvloss",
            "in",
        ],
    );
    let counter = listing
        .split("counter packets ")
        .nth(1)
        .unwrap_or_else(|| panic!("no counter in the nft rule:\n{listing}"));
    counter
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("bad counter in:\n{listing}"))
}

#[test]
fn two_namespaces_with_loss() {
    match std::env::var(ROLE).as_deref() {
        Ok(role @ ("ns-a" | "ns-b")) => return namespace_peer(role),
        Ok(_) => return, // a child process of another test
        Err(_) => {}
    }
    let (ip, nft) = (find_tool("ip"), find_tool("nft"));
    let mut missing = Vec::new();
    if !is_root() {
        missing.push("root");
    }
    if ip.is_none() {
        missing.push("the ip tool (Debian package iproute2)");
    }
    if nft.is_none() {
        missing.push("the nft tool (Debian package nftables)");
    }
    if !missing.is_empty() {
        let msg = format!("{TEST_NETNS} needs {}", missing.join(", "));
        assert!(
            std::env::var_os("CI").is_none(),
            "{msg}; under CI that is a failure (scripts/test installs the packages and runs as root)"
        );
        println!("{msg}: skipped");
        return;
    }
    let (ip, nft) = (ip.unwrap(), nft.unwrap());
    let t0 = Instant::now();
    let pid = std::process::id();
    let ns = [format!("rvmh-a-{pid}"), format!("rvmh-b-{pid}")];
    let veth = [format!("rvmha{pid}"), format!("rvmhb{pid}")];
    let net = format!("10.{}.{}", 1 + (pid >> 8) % 250, pid % 256);
    let addr = [format!("{net}.1"), format!("{net}.2")];

    let mut nets = common::Namespaces {
        ip: ip.clone(),
        names: Vec::new(),
    };
    nets.add(&ns[0]);
    nets.add(&ns[1]);
    run(
        &ip,
        &[
            "link", "add", &veth[0], "netns", &ns[0], "type", "veth", "peer", "name", &veth[1],
            "netns", &ns[1],
        ],
    );
    for i in 0..2 {
        let prefix = format!("{}/24", addr[i]);
        run(
            &ip,
            &["-n", &ns[i], "addr", "add", &prefix, "dev", &veth[i]],
        );
        run(&ip, &["-n", &ns[i], "link", "set", &veth[i], "up"]);
        run(&ip, &["-n", &ns[i], "link", "set", "lo", "up"]);
    }
    // Drop LOSS_PERCENT % of the RoCE packets entering namespace b: requests
    // from a, and ACKs and READ/atomic responses to b's requests.
    let nft_s = nft.to_str().unwrap();
    let rule = format!("udp dport 4791 numgen random mod 100 < {LOSS_PERCENT} counter drop");
    for cmd in [
        "add table inet rvloss".to_string(),
        "add chain inet rvloss in { type filter hook input priority 0; }".to_string(),
        format!("add rule inet rvloss in {rule}"),
    ] {
        let mut args = vec!["netns", "exec", &ns[1], nft_s];
        args.extend(cmd.split(' '));
        run(&ip, &args);
    }
    assert_eq!(nft_drops(&ip, &nft, &ns[1]), 0);
    println!(
        "{TEST_NETNS}: namespaces {} ({}) and {} ({}) over veth, {LOSS_PERCENT}% loss into {}, set up in {:?}",
        ns[0], addr[0], ns[1], addr[1], ns[1], t0.elapsed()
    );

    let deadline = Instant::now() + Duration::from_secs(180);
    let mut peers: Vec<PeerProcess> = (0..2)
        .map(|i| {
            let role = ["ns-a", "ns-b"][i];
            let mut cmd = Command::new(&ip);
            cmd.args(["netns", "exec", &ns[i]])
                .args(self_args(TEST_NETNS))
                .env(ROLE, role)
                .env("RVERBS_ADDR", &addr[i])
                .env(PEER_ADDR, &addr[1 - i])
                .env(IFACE, &veth[i])
                .env_remove("RVERBS_CONFIG");
            PeerProcess::spawn(role, cmd)
        })
        .collect();
    let outputs: Vec<String> = peers.iter_mut().map(|p| p.finish(deadline)).collect();
    let drops = nft_drops(&ip, &nft, &ns[1]);
    drop(peers);

    // Each peer really was on its namespace's veth address.
    for (i, out) in outputs.iter().enumerate() {
        let result = out
            .lines()
            .find_map(|l| l.strip_prefix("RESULT "))
            .unwrap_or_else(|| panic!("no RESULT line from peer {i}:\n{out}"));
        let field = |name: &str| {
            result
                .split(' ')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("no {name} in {result}"))
                .to_string()
        };
        assert_eq!(field("addr"), addr[i], "{result}");
        assert_eq!(field("gid"), format!("::ffff:{}", addr[i]), "{result}");
        assert_eq!(
            field("remote_gid"),
            format!("::ffff:{}", addr[1 - i]),
            "{result}"
        );
        assert_eq!(field("iface"), veth[i], "{result}");
        assert_eq!(field("received"), MESSAGES.to_string(), "{result}");
    }
    println!(
        "{TEST_NETNS}: nft dropped {drops} packets entering {}; total {:?}",
        ns[1],
        t0.elapsed()
    );
    assert!(
        drops >= 10,
        "the loss rule dropped only {drops} packets: the test did not exercise loss"
    );

    nets.delete();
    let left = run(&ip, &["netns", "list"]);
    assert!(
        !left.contains(&ns[0]) && !left.contains(&ns[1]),
        "namespaces left behind:\n{left}"
    );
}

/// What a sent WR must complete as.
struct Posted {
    wr_id: u64,
    opcode: WcOpcode,
    seq: u64,
    check: Check,
}

enum Check {
    Nothing,
    /// READ of `len` bytes of the peer's static area at `src`, landed at `land`.
    Read {
        land: usize,
        src: usize,
        len: usize,
    },
    /// Fetch-add whose original value (landed at `res`) must be `want`.
    Atomic {
        res: usize,
        want: u64,
    },
}

/// One peer of `two_namespaces_with_loss`, in a child process inside its
/// namespace, with RVERBS_ADDR set to the namespace's veth address.
fn namespace_peer(role: &str) {
    let t0 = Instant::now();
    let my_ip: IpAddr = env("RVERBS_ADDR").parse().unwrap();
    let peer_ip: IpAddr = env(PEER_ADDR).parse().unwrap();
    let peer_role = if role == "ns-a" { "ns-b" } else { "ns-a" };

    let s = Side::open(NS_MR_LEN, 512);
    // The device is on the configured veth address, not a loopback default.
    assert_eq!(s.dev.addr(), my_ip);
    assert_eq!(s.dev.gid(), Gid::from_ip(my_ip));
    assert_eq!(s.qp.local_gid(), Gid::from_ip(my_ip));
    assert_eq!(s.dev.interface(), Some(env(IFACE).as_str()));
    assert_eq!(s.ctx.query_gid(1, 0).unwrap(), Gid::from_ip(my_ip));
    let port = s.ctx.query_port(1).unwrap();
    assert_eq!(
        port.active_mtu,
        Mtu::for_link_mtu(1500).unwrap(),
        "veth MTU 1500"
    );

    s.mr.write_at(STATIC_OFF, &pattern(static_seed(role), STATIC_LEN))
        .unwrap();
    let peer_static = pattern(static_seed(peer_role), STATIC_LEN);
    let deadline = Instant::now() + Duration::from_secs(20);
    let stream = if role == "ns-a" {
        let listener = TcpListener::bind((my_ip, TCP_PORT)).unwrap();
        accept_before(&listener, deadline, None)
    } else {
        loop {
            match TcpStream::connect_timeout(&(peer_ip, TCP_PORT).into(), Duration::from_secs(2)) {
                Ok(stream) => break stream,
                Err(e) => {
                    assert!(Instant::now() < deadline, "connecting to {peer_ip}: {e}");
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    };
    let me = Endpoint::for_qp(&s.qp).with_buffer(&s.mr);
    let remote = cm::connect(&s.qp, &stream, &me, &ns_opts()).unwrap();
    let mut link = Link::new(stream);
    assert_eq!(
        remote.gid,
        Gid::from_ip(peer_ip),
        "the peer's GID is its veth address"
    );
    assert_eq!(s.qp.query().unwrap().ah_attr.dgid, Gid::from_ip(peer_ip));
    // Receive WRs need a QP out of RESET; both sides post theirs before
    // either sends.
    for k in 0..RQ_DEPTH {
        s.qp.post_recv(&RecvWr::new(
            k as u64,
            &[s.sge(NS_RECV_OFF + k * MAX_MSG, MAX_MSG)],
        ))
        .unwrap();
    }
    link.send("recv-ready");
    link.expect("recv-ready");
    let t_connected = t0.elapsed();

    let seed = stream_seed(role);
    let peer_seed = stream_seed(peer_role);
    let mut posted: VecDeque<Posted> = VecDeque::new();
    let (mut next_seq, mut received, mut wr_id) = (0u64, 0u64, 0u64);
    let (mut reads, mut atomics) = (0usize, 0u64);
    let mut wcs = [WorkCompletion::default(); 64];
    // A hang (no completion for STALL) fails fast, with the state of both
    // streams; a slow machine only has to keep making progress.
    const STALL: Duration = Duration::from_secs(20);
    let mut last_progress = Instant::now();
    let progress = |next_seq: u64, received: u64, posted: usize| {
        format!(
            "{role}: sent {next_seq}, {posted} WRs outstanding, received {received}; QP {:?}; {:?}",
            s.qp.state(),
            s.dev.net_stats()
        )
    };
    while next_seq < MESSAGES || !posted.is_empty() || received < MESSAGES {
        let mut busy = false;
        // Post message next_seq (up to four WRs) while the window has room.
        while next_seq < MESSAGES && posted.len() + 4 <= WINDOW {
            let seq = next_seq;
            let (kind, len) = message(seed, seq);
            let data = body(seed, seq, kind, len);
            let stage = STAGE_OFF + (seq as usize % STAGE_SLOTS) * MAX_MSG;
            s.mr.write_at(stage, &data).unwrap();
            let sges = [s.sge(stage, len)];
            let slot = remote.addr + (WSLOT_OFF + (seq as usize % WRITE_SLOTS) * MAX_MSG) as u64;
            let hdr = header(seq, kind, len);
            let mut wrs = Vec::new();
            match kind {
                Kind::Send => wrs.push((SendWr::new(0, WrOpcode::Send, &sges), WcOpcode::Send)),
                Kind::SendImm => wrs.push((
                    SendWr::new(
                        0,
                        WrOpcode::SendWithImm {
                            imm: imm_for(kind, seq),
                        },
                        &sges,
                    ),
                    WcOpcode::Send,
                )),
                Kind::Write => {
                    let op = WrOpcode::RdmaWrite {
                        remote_addr: slot,
                        rkey: remote.rkey,
                    };
                    wrs.push((SendWr::new(0, op, &sges), WcOpcode::RdmaWrite));
                    wrs.push((SendWr::inline(0, WrOpcode::Send, &hdr), WcOpcode::Send));
                }
                Kind::WriteImm => {
                    let op = WrOpcode::RdmaWriteWithImm {
                        remote_addr: slot,
                        rkey: remote.rkey,
                        imm: imm_for(kind, seq),
                    };
                    wrs.push((SendWr::new(0, op, &sges), WcOpcode::RdmaWrite));
                }
            }
            for (wr, opcode) in wrs {
                wr_id += 1;
                s.qp.post_send(&SendWr { wr_id, ..wr }.signaled()).unwrap();
                posted.push_back(Posted {
                    wr_id,
                    opcode,
                    seq,
                    check: Check::Nothing,
                });
            }
            if reads_at(seq) || big_read_at(seq) {
                let h = mix(seed ^ seq ^ 0x4ead);
                let (len, land) = if big_read_at(seq) {
                    (BIG_READ_MIN + (h as usize) % (64 << 10), BIG_LAND_OFF)
                } else {
                    let land = LAND_OFF + (reads % WINDOW) * READ_MAX;
                    (1 + (h as usize) % READ_MAX, land)
                };
                let src = (h >> 32) as usize % (STATIC_LEN - len);
                reads += 1;
                wr_id += 1;
                let op = WrOpcode::RdmaRead {
                    remote_addr: remote.addr + (STATIC_OFF + src) as u64,
                    rkey: remote.rkey,
                };
                s.qp.post_send(&SendWr::new(wr_id, op, &[s.sge(land, len)]).signaled())
                    .unwrap();
                posted.push_back(Posted {
                    wr_id,
                    opcode: WcOpcode::RdmaRead,
                    seq,
                    check: Check::Read { land, src, len },
                });
            }
            if atomic_at(seq) {
                let res = RESULT_OFF + (atomics as usize % WINDOW) * 8;
                wr_id += 1;
                let op = WrOpcode::AtomicFetchAndAdd {
                    remote_addr: remote.addr + COUNTER_OFF as u64,
                    rkey: remote.rkey,
                    add: 1,
                };
                s.qp.post_send(&SendWr::new(wr_id, op, &[s.sge(res, 8)]).signaled())
                    .unwrap();
                posted.push_back(Posted {
                    wr_id,
                    opcode: WcOpcode::FetchAdd,
                    seq,
                    check: Check::Atomic { res, want: atomics },
                });
                atomics += 1;
            }
            next_seq += 1;
            busy = true;
        }

        // Send completions: every WR, in order, successful.
        let k = s.send_cq.poll(&mut wcs).unwrap();
        for wc in &wcs[..k] {
            let p = posted
                .pop_front()
                .unwrap_or_else(|| panic!("{role}: completion for nothing posted: {wc:?}"));
            assert!(
                wc.wr_id == p.wr_id && wc.status == WcStatus::Success && wc.opcode == p.opcode,
                "{role}: WR {} of message {} should complete as {:?}, got {wc:?}; {}",
                p.wr_id,
                p.seq,
                p.opcode,
                progress(next_seq, received, posted.len())
            );
            match p.check {
                Check::Nothing => {}
                Check::Read { land, src, len } => {
                    assert_eq!(wc.byte_len as usize, len, "{role}: READ {wc:?}");
                    assert_same(
                        &s.read(land, len),
                        &peer_static[src..src + len],
                        &format!("{role}: READ of {len} bytes at {src} (message {})", p.seq),
                    );
                }
                Check::Atomic { res, want } => {
                    assert_eq!(wc.byte_len, 8, "{role}: atomic {wc:?}");
                    assert_eq!(
                        s.read_u64(res),
                        want,
                        "{role}: fetch-add #{want} (message {}) returned a wrong original value",
                        p.seq
                    );
                }
            }
        }
        busy |= k > 0;

        // Receive completions: the peer's messages, each once, in order.
        let k = s.recv_cq.poll(&mut wcs).unwrap();
        for wc in &wcs[..k] {
            let seq = received;
            assert!(
                seq < MESSAGES,
                "{role}: a receive completion after all {MESSAGES} messages: {wc:?}"
            );
            let (kind, len) = message(peer_seed, seq);
            let what = format!("{role}: message {seq} ({kind:?}, {len} bytes)");
            assert_eq!(wc.status, WcStatus::Success, "{what}: {wc:?}");
            let buf = NS_RECV_OFF + wc.wr_id as usize * MAX_MSG;
            let want = body(peer_seed, seq, kind, len);
            let slot = WSLOT_OFF + (seq as usize % WRITE_SLOTS) * MAX_MSG;
            match kind {
                Kind::Send | Kind::SendImm => {
                    let imm = (kind == Kind::SendImm).then(|| imm_for(kind, seq));
                    assert_eq!(
                        (wc.opcode, wc.byte_len as usize, wc.imm()),
                        (WcOpcode::Recv, len, imm),
                        "{what}: {wc:?}"
                    );
                    let got = s.read(buf, len);
                    assert_eq!(
                        got[..HEADER],
                        header(seq, kind, len),
                        "{what}: the header says message {}",
                        u32::from_le_bytes(got[4..8].try_into().unwrap())
                    );
                    assert_same(&got, &want, &what);
                }
                Kind::Write => {
                    assert_eq!(
                        (wc.opcode, wc.byte_len as usize, wc.imm()),
                        (WcOpcode::Recv, HEADER, None),
                        "{what}: {wc:?}"
                    );
                    let got = s.read(buf, HEADER);
                    assert_eq!(got, header(seq, kind, len), "{what}: the announcement");
                    assert_same(&s.read(slot, len), &want, &format!("{what}: WRITE data"));
                }
                Kind::WriteImm => {
                    assert_eq!(
                        (wc.opcode, wc.byte_len as usize, wc.imm()),
                        (WcOpcode::RecvRdmaWithImm, len, Some(imm_for(kind, seq))),
                        "{what}: {wc:?}"
                    );
                    assert_same(&s.read(slot, len), &want, &format!("{what}: WRITE data"));
                }
            }
            s.qp.post_recv(&RecvWr::new(
                wc.wr_id,
                &[s.sge(NS_RECV_OFF + wc.wr_id as usize * MAX_MSG, MAX_MSG)],
            ))
            .unwrap();
            received += 1;
        }
        busy |= k > 0;

        if busy {
            last_progress = Instant::now();
        } else {
            assert!(
                last_progress.elapsed() < STALL,
                "stalled: no completion for {STALL:?}: {}",
                progress(next_seq, received, posted.len())
            );
            std::thread::yield_now();
        }
    }
    let t_stream = t0.elapsed();

    // Both streams are complete on both sides before either QP goes away.
    link.send("done");
    link.expect("done");
    let peer_atomics = (0..MESSAGES).filter(|&q| atomic_at(q)).count() as u64;
    assert_eq!(
        s.read_u64(COUNTER_OFF),
        peer_atomics,
        "{role}: the peer's {peer_atomics} fetch-adds must each apply exactly once"
    );
    std::thread::sleep(Duration::from_millis(100));
    s.assert_no_more_completions();
    assert_eq!(s.qp.state(), QpState::Rts);
    let stats = s.dev.net_stats();
    assert_eq!(stats.rx_icrc_errors, 0, "{stats:?}");
    println!(
        "RESULT role={role} addr={} gid={} iface={} remote_gid={} mtu={} received={received} \
         sent={next_seq} reads={reads} atomics={atomics} connected_ms={} stream_ms={} \
         tx_packets={} rx_packets={} tx_errors={} rx_unknown_qp={}",
        s.dev.addr(),
        s.qp.local_gid(),
        s.dev.interface().unwrap_or("-"),
        remote.gid,
        port.active_mtu.bytes(),
        t_connected.as_millis(),
        t_stream.as_millis(),
        stats.tx_packets,
        stats.rx_packets,
        stats.tx_errors,
        stats.rx_unknown_qp,
    );
}
