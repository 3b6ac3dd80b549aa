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
//! - `soak_two_namespaces`: `scripts/soak`'s long run of the same traffic,
//!   on many QPs per process (sharing its CQs and MR) and several process
//!   pairs, each process on its own veth address, in rounds until
//!   `RVERBS_SOAK_SECS` passed, with progress lines, RSS samples and a
//!   summary. Without `RVERBS_SOAK_SECS` (under `cargo test`) it does
//!   nothing.
//!
//! The test binary is its own peer (as `processes.rs` is): a test runs
//! `<this binary> --exact <test> --nocapture` with `RVERBS_MULTIHOST_ROLE`
//! naming the part the child plays, and the test function plays that part
//! instead of the parent's.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod common;
use common::{find_tool, is_root, run};
use common::{pattern, splitmix, ALL};

use rverbs::cm::{self, ConnectOptions, Endpoint};
use rverbs::{
    devices, CompletionQueue, Context, Device, Gid, MemoryRegion, Mtu, ProtectionDomain, QpCaps,
    QpState, QueuePair, RecvWr, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

/// Selects the part a child plays (unset in the parent).
const ROLE: &str = "RVERBS_MULTIHOST_ROLE";
/// Where the one-host peer finds the parent's TCP listener.
const CONNECT_TO: &str = "RVERBS_MULTIHOST_CONNECT";
/// A namespace peer's partner address.
const PEER_ADDR: &str = "RVERBS_MULTIHOST_PEER";
/// The veth interface a namespace peer's address is on.
const IFACE: &str = "RVERBS_MULTIHOST_IFACE";

// ---------------------------------------------------------------------------
// Shared helpers

fn mix(x: u64) -> u64 {
    let mut s = x;
    splitmix(&mut s)
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
    _ctx: Context,
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
            _ctx: ctx,
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
// (b) Two network namespaces with packet loss, and the soak

const TEST_NETNS: &str = "two_namespaces_with_loss";
const LOSS_PERCENT: u32 = 3;
/// Messages each way.
const MESSAGES: u64 = 3000;
const MAX_MSG: usize = 40 << 10;
const READ_MAX: usize = 32 << 10;
/// Large READs: more packets than one READ request asks for at a time at
/// the veth's MTU, so they take several requests.
const BIG_READ_MIN: usize = 700 << 10;
const BIG_READ_MAX: usize = BIG_READ_MIN + (64 << 10);
/// The area every QP of a peer READs from, at the start of the MR.
const STATIC_LEN: usize = 1 << 20;
const HEADER: usize = 16;
const MAGIC: u32 = 0x524d_4831;
const TCP_PORT: u16 = 18515;
/// A hang (no completion in a whole process for this long) fails fast,
/// with the state of every stream; a slow machine only has to keep making
/// progress.
const STALL: Duration = Duration::from_secs(20);

/// How much one QP's stream keeps in flight, which sizes its area of the MR.
#[derive(Clone, Copy, Debug)]
struct Depths {
    /// Send WRs outstanding at most.
    window: usize,
    /// Receive WRs posted.
    rq_depth: usize,
}

/// `two_namespaces_with_loss`'s one QP per peer.
const TEST_DEPTHS: Depths = Depths {
    window: 64,
    rq_depth: 256,
};

/// The soak's many QPs per peer, each with a smaller area.
const SOAK_DEPTHS: Depths = Depths {
    window: 16,
    rq_depth: 32,
};

/// The layout of one QP's area (offsets from its start).
impl Depths {
    fn stage_slots(self) -> usize {
        2 * self.window
    }

    /// RDMA WRITE targets. A WRITE for message m is placed only after
    /// message m-1 took a receive WR, so (receives being reposted after a
    /// message is checked) messages up to m-1-rq_depth have been checked:
    /// more slots than rq_depth + 1 and no WRITE overwrites a slot not
    /// checked yet.
    fn write_slots(self) -> usize {
        self.rq_depth + 16
    }

    fn recv_off(self) -> usize {
        self.stage_slots() * MAX_MSG
    }

    fn wslot_off(self) -> usize {
        self.recv_off() + self.rq_depth * MAX_MSG
    }

    fn land_off(self) -> usize {
        self.wslot_off() + self.write_slots() * MAX_MSG
    }

    fn big_land_off(self) -> usize {
        self.land_off() + self.window * READ_MAX
    }

    /// The fetch-add target the peer's QP adds to.
    fn counter_off(self) -> usize {
        self.big_land_off() + BIG_READ_MAX
    }

    fn result_off(self) -> usize {
        self.counter_off() + 8
    }

    fn area_len(self) -> usize {
        (self.result_off() + self.window * 8).next_multiple_of(4096)
    }

    /// Where QP `q`'s area starts in the MR (after the static area).
    fn area(self, q: usize) -> usize {
        STATIC_LEN + q * self.area_len()
    }
}

/// What a pair of namespace peers exchange.
#[derive(Clone, Copy, Debug)]
struct Traffic {
    /// QPs per peer, connected in order (QP q of one peer to QP q of the other).
    qps: usize,
    depths: Depths,
    /// Messages each QP sends per round.
    round: u64,
    /// Rounds go on until this much time passed (`None`: one round).
    duration: Option<Duration>,
    /// How often to print a progress line (`None`: never).
    report: Option<Duration>,
}

/// The traffic of `two_namespaces_with_loss`: one round of MESSAGES.
const TEST_TRAFFIC: Traffic = Traffic {
    qps: 1,
    depths: TEST_DEPTHS,
    round: MESSAGES,
    duration: None,
    report: None,
};

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

/// One large READ every 128 messages: more than a window of WRs apart, so
/// the previous one completed and its landing area is free.
fn big_read_at(seq: u64) -> bool {
    seq % 128 == 77
}

fn atomic_at(seq: u64) -> bool {
    seq % 32 == 9
}

/// The seed of the stream the listening (`a`) or connecting (`b`) peer of
/// process pair `pair` sends on its QP `q`.
fn stream_seed(listens: bool, pair: u64, q: usize) -> u64 {
    let base: u64 = if listens {
        0xaaaa_0000_1111
    } else {
        0xbbbb_0000_2222
    };
    base ^ pair.wrapping_mul(0x1000_0001_0000) ^ (q as u64).wrapping_mul(0x0100_0000_0001)
}

/// The seed of the static area a peer fills and the other READs.
fn static_seed(listens: bool, pair: u64) -> u64 {
    stream_seed(listens, pair, 0) ^ 0x57a7_1c00
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

/// `ip` and `nft`, or what is missing (root, a tool).
fn netns_tools() -> Result<(PathBuf, PathBuf), String> {
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
    match (ip, nft) {
        (Some(ip), Some(nft)) if missing.is_empty() => Ok((ip, nft)),
        _ => Err(missing.join(", ")),
    }
}

/// Two network namespaces `a` and `b` joined by a veth pair, `per_side`
/// addresses on each end, and an nftables rule in `b` dropping
/// `loss_percent` % of the RoCE packets entering it: requests from `a`, and
/// ACKs and READ/atomic responses to `b`'s requests. Dropping it deletes the
/// namespaces.
struct LossyNamespaces {
    nets: common::Namespaces,
    ns: [String; 2],
    veth: [String; 2],
    /// The addresses on each side's veth end; address i of `a` pairs with
    /// address i of `b`.
    addrs: [Vec<String>; 2],
    nft: PathBuf,
}

impl LossyNamespaces {
    fn new(
        ip: &Path,
        nft: &Path,
        tag: &str,
        per_side: usize,
        loss_percent: u32,
    ) -> LossyNamespaces {
        assert!((1..=100).contains(&per_side), "1 to 100 addresses a side");
        let pid = std::process::id();
        let ns = [format!("{tag}-a-{pid}"), format!("{tag}-b-{pid}")];
        let veth = [format!("{tag}a{pid}"), format!("{tag}b{pid}")];
        let net = format!("10.{}.{}", 1 + (pid >> 8) % 250, pid % 256);
        let addrs = [
            (0..per_side).map(|i| format!("{net}.{}", 1 + i)).collect(),
            (0..per_side)
                .map(|i| format!("{net}.{}", 1 + per_side + i))
                .collect(),
        ];
        let mut nets = common::Namespaces::new(ip);
        nets.add(&ns[0]);
        nets.add(&ns[1]);
        run(
            ip,
            &[
                "link", "add", &veth[0], "netns", &ns[0], "type", "veth", "peer", "name", &veth[1],
                "netns", &ns[1],
            ],
        );
        for i in 0..2 {
            for a in &addrs[i] {
                let prefix = format!("{a}/24");
                run(ip, &["-n", &ns[i], "addr", "add", &prefix, "dev", &veth[i]]);
            }
            run(ip, &["-n", &ns[i], "link", "set", &veth[i], "up"]);
            run(ip, &["-n", &ns[i], "link", "set", "lo", "up"]);
        }
        let nft_s = nft.to_str().unwrap();
        let rule = format!("udp dport 4791 numgen random mod 100 < {loss_percent} counter drop");
        for cmd in [
            "add table inet rvloss".to_string(),
            "add chain inet rvloss in { type filter hook input priority 0; }".to_string(),
            format!("add rule inet rvloss in {rule}"),
        ] {
            let mut args = vec!["netns", "exec", &ns[1], nft_s];
            args.extend(cmd.split(' '));
            run(ip, &args);
        }
        let set = LossyNamespaces {
            nets,
            ns,
            veth,
            addrs,
            nft: nft.to_path_buf(),
        };
        assert_eq!(set.drops(), 0);
        set
    }

    /// The drop counter of the loss rule.
    fn drops(&self) -> u64 {
        let listing = run(
            &self.nets.ip,
            &[
                "netns",
                "exec",
                &self.ns[1],
                self.nft.to_str().unwrap(),
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

    /// A namespace peer: this binary running `test` as `role` inside
    /// namespace `side` (0 is `a`) on its address `i`, paired with address
    /// `i` of the other side.
    fn peer(&self, test: &str, role: &str, side: usize, i: usize) -> Command {
        let mut cmd = Command::new(&self.nets.ip);
        cmd.args(["netns", "exec", &self.ns[side]])
            .args(self_args(test))
            .env(ROLE, role)
            .env("RVERBS_ADDR", &self.addrs[side][i])
            .env(PEER_ADDR, &self.addrs[1 - side][i])
            .env(IFACE, &self.veth[side])
            .env(PAIR, i.to_string())
            .env_remove("RVERBS_CONFIG");
        cmd
    }

    /// Deletes the namespaces and checks none is left.
    fn delete(mut self) {
        self.nets.delete();
        let left = run(&self.nets.ip, &["netns", "list"]);
        assert!(
            !left.contains(&self.ns[0]) && !left.contains(&self.ns[1]),
            "namespaces left behind:\n{left}"
        );
    }
}

/// The `RESULT` line a namespace peer ends with: `key=value` fields.
struct PeerResult(String);

impl PeerResult {
    fn find(name: &str, output: &str) -> PeerResult {
        let line = output
            .lines()
            .find_map(|l| l.strip_prefix("RESULT "))
            .unwrap_or_else(|| panic!("no RESULT line from {name}:\n{output}"));
        PeerResult(line.to_string())
    }

    fn get(&self, name: &str) -> &str {
        self.0
            .split(' ')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {name} in {}", self.0))
    }

    fn num(&self, name: &str) -> u64 {
        self.get(name)
            .parse()
            .unwrap_or_else(|_| panic!("{name} is not a number in {}", self.0))
    }
}

#[test]
fn two_namespaces_with_loss() {
    match std::env::var(ROLE).as_deref() {
        Ok(role @ ("ns-a" | "ns-b")) => return namespace_peer(role, &TEST_TRAFFIC),
        Ok(_) => return, // a child process of another test
        Err(_) => {}
    }
    let (ip, nft) = match netns_tools() {
        Ok(tools) => tools,
        Err(missing) => {
            let msg = format!("{TEST_NETNS} needs {missing}");
            assert!(
                std::env::var_os("CI").is_none(),
                "{msg}; under CI that is a failure (scripts/test installs the packages and runs as root)"
            );
            println!("{msg}: skipped");
            return;
        }
    };
    let t0 = Instant::now();
    let nets = LossyNamespaces::new(&ip, &nft, "rvmh", 1, LOSS_PERCENT);
    let (ns, veth, addr) = (&nets.ns, &nets.veth, [&nets.addrs[0][0], &nets.addrs[1][0]]);
    println!(
        "{TEST_NETNS}: namespaces {} ({}) and {} ({}) over veth, {LOSS_PERCENT}% loss into {}, set up in {:?}",
        ns[0], addr[0], ns[1], addr[1], ns[1], t0.elapsed()
    );

    let deadline = Instant::now() + Duration::from_secs(180);
    let mut peers: Vec<PeerProcess> = (0..2)
        .map(|i| {
            let role = ["ns-a", "ns-b"][i];
            PeerProcess::spawn(role, nets.peer(TEST_NETNS, role, i, 0))
        })
        .collect();
    let outputs: Vec<String> = peers.iter_mut().map(|p| p.finish(deadline)).collect();
    let drops = nets.drops();
    drop(peers);

    // Each peer really was on its namespace's veth address.
    for (i, out) in outputs.iter().enumerate() {
        let result = PeerResult::find(&format!("peer {i}"), out);
        assert_eq!(result.get("addr"), addr[i], "{}", result.0);
        assert_eq!(
            result.get("gid"),
            format!("::ffff:{}", addr[i]),
            "{}",
            result.0
        );
        assert_eq!(
            result.get("remote_gid"),
            format!("::ffff:{}", addr[1 - i]),
            "{}",
            result.0
        );
        assert_eq!(result.get("iface"), veth[i], "{}", result.0);
        assert_eq!(result.num("received"), MESSAGES, "{}", result.0);
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

/// What a stream moved and verified.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    /// Messages sent, and their bytes, all completed successfully.
    sent: u64,
    sent_bytes: u64,
    /// The peer's messages received, each checked byte for byte.
    received: u64,
    received_bytes: u64,
    /// READs whose data was checked, and their bytes.
    reads: u64,
    read_bytes: u64,
    /// Fetch-adds whose original value was checked.
    atomics: u64,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.sent += o.sent;
        self.sent_bytes += o.sent_bytes;
        self.received += o.received;
        self.received_bytes += o.received_bytes;
        self.reads += o.reads;
        self.read_bytes += o.read_bytes;
        self.atomics += o.atomics;
    }

    fn fields(&self) -> String {
        format!(
            "sent={} sent_bytes={} received={} received_bytes={} reads={} read_bytes={} atomics={}",
            self.sent,
            self.sent_bytes,
            self.received,
            self.received_bytes,
            self.reads,
            self.read_bytes,
            self.atomics
        )
    }
}

/// One QP of a namespace peer and the two message streams over it: the one
/// it sends and the one it receives and checks.
struct QpStream {
    qp: QueuePair,
    remote: Endpoint,
    /// This QP's area in the local MR.
    area: usize,
    /// The peer QP's area, as an address in the peer's MR.
    remote_area: u64,
    seed: u64,
    peer_seed: u64,
    posted: VecDeque<Posted>,
    /// Messages posted; the next one's number.
    next_seq: u64,
    wr_id: u64,
    /// READs and fetch-adds posted (which picks their landing slots and
    /// the value a fetch-add must return).
    reads_posted: usize,
    atomics_posted: u64,
    tally: Tally,
}

impl QpStream {
    fn describe(&self) -> String {
        format!(
            "QP {:#x}: sent {}, {} WRs outstanding, received {}; {:?}",
            self.qp.qp_num(),
            self.next_seq,
            self.posted.len(),
            self.tally.received,
            self.qp.state()
        )
    }

    /// Posts messages up to (not including) `until` while the window has
    /// room; whether it posted any.
    fn post(&mut self, mr: &MemoryRegion, d: Depths, until: u64) -> bool {
        let mut busy = false;
        // Message next_seq takes up to four WRs.
        while self.next_seq < until && self.posted.len() + 4 <= d.window {
            let seq = self.next_seq;
            let seed = self.seed;
            let (kind, len) = message(seed, seq);
            let data = body(seed, seq, kind, len);
            let stage = self.area + (seq as usize % d.stage_slots()) * MAX_MSG;
            mr.write_at(stage, &data).unwrap();
            let sges = [mr_sge(mr, stage, len)];
            let slot = self.remote_area
                + (d.wslot_off() + (seq as usize % d.write_slots()) * MAX_MSG) as u64;
            let rkey = self.remote.rkey;
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
                        rkey,
                    };
                    wrs.push((SendWr::new(0, op, &sges), WcOpcode::RdmaWrite));
                    wrs.push((SendWr::inline(0, WrOpcode::Send, &hdr), WcOpcode::Send));
                }
                Kind::WriteImm => {
                    let op = WrOpcode::RdmaWriteWithImm {
                        remote_addr: slot,
                        rkey,
                        imm: imm_for(kind, seq),
                    };
                    wrs.push((SendWr::new(0, op, &sges), WcOpcode::RdmaWrite));
                }
            }
            for (wr, opcode) in wrs {
                self.wr_id += 1;
                let wr_id = self.wr_id;
                self.qp
                    .post_send(&SendWr { wr_id, ..wr }.signaled())
                    .unwrap();
                self.posted.push_back(Posted {
                    wr_id,
                    opcode,
                    seq,
                    check: Check::Nothing,
                });
            }
            if reads_at(seq) || big_read_at(seq) {
                let h = mix(seed ^ seq ^ 0x4ead);
                let (len, land) = if big_read_at(seq) {
                    (
                        BIG_READ_MIN + (h as usize) % (BIG_READ_MAX - BIG_READ_MIN),
                        d.big_land_off(),
                    )
                } else {
                    let land = d.land_off() + (self.reads_posted % d.window) * READ_MAX;
                    (1 + (h as usize) % READ_MAX, land)
                };
                let land = self.area + land;
                let src = (h >> 32) as usize % (STATIC_LEN - len);
                self.reads_posted += 1;
                self.wr_id += 1;
                let op = WrOpcode::RdmaRead {
                    remote_addr: self.remote.addr + src as u64,
                    rkey,
                };
                self.qp
                    .post_send(&SendWr::new(self.wr_id, op, &[mr_sge(mr, land, len)]).signaled())
                    .unwrap();
                self.posted.push_back(Posted {
                    wr_id: self.wr_id,
                    opcode: WcOpcode::RdmaRead,
                    seq,
                    check: Check::Read { land, src, len },
                });
            }
            if atomic_at(seq) {
                let atomics = self.atomics_posted;
                let res = self.area + d.result_off() + (atomics as usize % d.window) * 8;
                self.wr_id += 1;
                let op = WrOpcode::AtomicFetchAndAdd {
                    remote_addr: self.remote_area + d.counter_off() as u64,
                    rkey,
                    add: 1,
                };
                self.qp
                    .post_send(&SendWr::new(self.wr_id, op, &[mr_sge(mr, res, 8)]).signaled())
                    .unwrap();
                self.posted.push_back(Posted {
                    wr_id: self.wr_id,
                    opcode: WcOpcode::FetchAdd,
                    seq,
                    check: Check::Atomic { res, want: atomics },
                });
                self.atomics_posted += 1;
            }
            self.next_seq += 1;
            busy = true;
        }
        busy
    }

    /// A send completion: the oldest WR posted, successful, its READ data
    /// or fetch-add result right.
    fn on_send(&mut self, wc: &WorkCompletion, mr: &MemoryRegion, peer_static: &[u8], role: &str) {
        let p = self
            .posted
            .pop_front()
            .unwrap_or_else(|| panic!("{role}: completion for nothing posted: {wc:?}"));
        assert!(
            wc.wr_id == p.wr_id && wc.status == WcStatus::Success && wc.opcode == p.opcode,
            "{role}: WR {} of message {} should complete as {:?}, got {wc:?}; {}",
            p.wr_id,
            p.seq,
            p.opcode,
            self.describe()
        );
        match p.check {
            Check::Nothing => {}
            Check::Read { land, src, len } => {
                assert_eq!(wc.byte_len as usize, len, "{role}: READ {wc:?}");
                assert_same(
                    &mr_read(mr, land, len),
                    &peer_static[src..src + len],
                    &format!("{role}: READ of {len} bytes at {src} (message {})", p.seq),
                );
                self.tally.reads += 1;
                self.tally.read_bytes += len as u64;
            }
            Check::Atomic { res, want } => {
                assert_eq!(wc.byte_len, 8, "{role}: atomic {wc:?}");
                assert_eq!(
                    mr_read_u64(mr, res),
                    want,
                    "{role}: fetch-add #{want} (message {}) returned a wrong original value",
                    p.seq
                );
                self.tally.atomics += 1;
            }
        }
        if self.posted.front().is_none_or(|next| next.seq != p.seq) {
            // The message's last WR.
            self.tally.sent += 1;
            self.tally.sent_bytes += message(self.seed, p.seq).1 as u64;
        }
    }

    /// A receive completion: the peer's next message, checked byte for
    /// byte; the receive WR is posted again. `limit`: no message this far
    /// can have been sent yet.
    fn on_recv(
        &mut self,
        wc: &WorkCompletion,
        mr: &MemoryRegion,
        d: Depths,
        limit: u64,
        role: &str,
    ) {
        let seq = self.tally.received;
        assert!(
            seq < limit,
            "{role}: a receive completion for message {seq}, beyond the {limit} the peer may have sent: {wc:?}"
        );
        let (kind, len) = message(self.peer_seed, seq);
        let what = format!(
            "{role}: QP {:#x} message {seq} ({kind:?}, {len} bytes)",
            self.qp.qp_num()
        );
        assert_eq!(wc.status, WcStatus::Success, "{what}: {wc:?}");
        let buf = self.area + d.recv_off() + wc.wr_id as usize * MAX_MSG;
        let want = body(self.peer_seed, seq, kind, len);
        let slot = self.area + d.wslot_off() + (seq as usize % d.write_slots()) * MAX_MSG;
        match kind {
            Kind::Send | Kind::SendImm => {
                let imm = (kind == Kind::SendImm).then(|| imm_for(kind, seq));
                assert_eq!(
                    (wc.opcode, wc.byte_len as usize, wc.imm()),
                    (WcOpcode::Recv, len, imm),
                    "{what}: {wc:?}"
                );
                let got = mr_read(mr, buf, len);
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
                let got = mr_read(mr, buf, HEADER);
                assert_eq!(got, header(seq, kind, len), "{what}: the announcement");
                assert_same(
                    &mr_read(mr, slot, len),
                    &want,
                    &format!("{what}: WRITE data"),
                );
            }
            Kind::WriteImm => {
                assert_eq!(
                    (wc.opcode, wc.byte_len as usize, wc.imm()),
                    (WcOpcode::RecvRdmaWithImm, len, Some(imm_for(kind, seq))),
                    "{what}: {wc:?}"
                );
                assert_same(
                    &mr_read(mr, slot, len),
                    &want,
                    &format!("{what}: WRITE data"),
                );
            }
        }
        self.post_recv(mr, d, wc.wr_id as usize);
        self.tally.received += 1;
        self.tally.received_bytes += len as u64;
    }

    fn post_recv(&self, mr: &MemoryRegion, d: Depths, k: usize) {
        let buf = self.area + d.recv_off() + k * MAX_MSG;
        self.qp
            .post_recv(&RecvWr::new(k as u64, &[mr_sge(mr, buf, MAX_MSG)]))
            .unwrap();
    }
}

/// The first completion of `cq` with an error other than a flush: why a
/// QP whose receives were flushed went to ERROR.
fn first_send_error(cq: &CompletionQueue) -> Option<WorkCompletion> {
    let mut wcs = [WorkCompletion::default(); 64];
    loop {
        let k = cq.poll(&mut wcs).ok()?;
        if k == 0 {
            return None;
        }
        let bad = wcs[..k]
            .iter()
            .find(|wc| !matches!(wc.status, WcStatus::Success | WcStatus::WrFlushErr));
        if let Some(wc) = bad {
            return Some(*wc);
        }
    }
}

fn mr_sge(mr: &MemoryRegion, offset: usize, len: usize) -> Sge {
    Sge {
        addr: mr.iova() + offset as u64,
        length: u32::try_from(len).unwrap(),
        lkey: mr.lkey(),
    }
}

fn mr_read(mr: &MemoryRegion, offset: usize, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    mr.read_at(offset, &mut buf).unwrap();
    buf
}

fn mr_read_u64(mr: &MemoryRegion, offset: usize) -> u64 {
    u64::from_ne_bytes(mr_read(mr, offset, 8).try_into().unwrap())
}

/// This process's resident set in KiB (`VmRSS` of /proc/self/status: the
/// resident pages of /proc/self/statm, in KiB).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/self/status:\n{status}"))
}

/// A process's RSS sampled over a run: at the start, at the end of the
/// warm-up, the largest after it, and the last.
#[derive(Debug)]
struct RssSamples {
    start: u64,
    warm_up: Duration,
    warm: Option<u64>,
    max: u64,
    last: u64,
    samples: u64,
}

/// The warm-up of a run of `duration`: a quarter of it, at most a minute.
fn warm_up(duration: Option<Duration>) -> Duration {
    duration.map_or(Duration::ZERO, |d| (d / 4).min(Duration::from_secs(60)))
}

impl RssSamples {
    const EVERY: Duration = Duration::from_secs(5);

    fn new(warm_up: Duration) -> RssSamples {
        let now = rss_kib();
        RssSamples {
            start: now,
            warm_up,
            warm: None,
            max: now,
            last: now,
            samples: 1,
        }
    }

    fn sample(&mut self, elapsed: Duration) {
        let now = rss_kib();
        self.samples += 1;
        self.last = now;
        match self.warm {
            None if elapsed >= self.warm_up => {
                self.warm = Some(now);
                self.max = now;
            }
            None => {}
            Some(_) => self.max = self.max.max(now),
        }
    }

    fn fields(&self) -> String {
        let warm = self.warm.unwrap_or(self.last);
        format!(
            "rss_start_kib={} rss_warm_kib={warm} rss_max_kib={} rss_last_kib={} rss_samples={}",
            self.start,
            self.max.max(self.last),
            self.last,
            self.samples
        )
    }
}

/// Environment of a namespace peer: its pair number.
const PAIR: &str = "RVERBS_MULTIHOST_PAIR";

/// One namespace peer, in a child process inside its namespace with
/// RVERBS_ADDR set to its veth address: `traffic.qps` QPs to the peer
/// process, each carrying a stream of verified messages each way, in rounds
/// until `traffic.duration` passed (the listening peer decides, after each
/// round, whether another follows).
fn namespace_peer(role: &str, traffic: &Traffic) {
    let t0 = Instant::now();
    let my_ip: IpAddr = env("RVERBS_ADDR").parse().unwrap();
    let peer_ip: IpAddr = env(PEER_ADDR).parse().unwrap();
    let pair: u64 = env(PAIR).parse().unwrap();
    let listens = role.contains("-a");
    let d = traffic.depths;

    let dev = devices().expect("the rverbs devices").remove(0);
    // The device is on the configured veth address, not a loopback default.
    assert_eq!(dev.addr(), my_ip);
    assert_eq!(dev.gid(), Gid::from_ip(my_ip));
    assert_eq!(dev.interface(), Some(env(IFACE).as_str()));
    let ctx = dev.open().unwrap();
    assert_eq!(ctx.query_gid(1, 0).unwrap(), Gid::from_ip(my_ip));
    let port = ctx.query_port(1).unwrap();
    assert_eq!(
        port.active_mtu,
        Mtu::for_link_mtu(1500).unwrap(),
        "veth MTU 1500"
    );
    let pd = ctx.alloc_pd().unwrap();
    let send_cq = ctx.create_cq((2 * traffic.qps * d.window) as u32).unwrap();
    let recv_cq = ctx
        .create_cq((2 * traffic.qps * d.rq_depth) as u32)
        .unwrap();
    let mr_len = d.area(traffic.qps);
    let mr = pd.alloc_mr(mr_len, ALL).unwrap();
    // Every page resident from the start, so RSS shows what the library
    // itself allocates.
    let zeros = vec![0u8; 1 << 20];
    for at in (0..mr_len).step_by(zeros.len()) {
        mr.write_at(at, &zeros[..zeros.len().min(mr_len - at)])
            .unwrap();
    }
    mr.write_at(0, &pattern(static_seed(listens, pair), STATIC_LEN))
        .unwrap();
    let peer_static = pattern(static_seed(!listens, pair), STATIC_LEN);

    let deadline = Instant::now() + Duration::from_secs(20);
    let stream = if listens {
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
    let mut streams = Vec::with_capacity(traffic.qps);
    let mut by_qpn = std::collections::HashMap::new();
    for q in 0..traffic.qps {
        let qp = pd
            .qp_builder(&send_cq, &recv_cq)
            .caps(QpCaps {
                max_send_wr: 2 * d.window as u32,
                max_recv_wr: 2 * d.rq_depth as u32,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            })
            .build()
            .unwrap();
        assert_eq!(qp.local_gid(), Gid::from_ip(my_ip));
        let me = Endpoint::for_qp(&qp).with_buffer(&mr);
        let remote = cm::connect(&qp, &stream, &me, &ns_opts()).unwrap();
        assert_eq!(
            remote.gid,
            Gid::from_ip(peer_ip),
            "the peer's GID is its veth address"
        );
        assert_eq!(qp.query().unwrap().ah_attr.dgid, Gid::from_ip(peer_ip));
        by_qpn.insert(qp.qp_num(), q);
        streams.push(QpStream {
            qp,
            remote,
            area: d.area(q),
            remote_area: remote.addr + d.area(q) as u64,
            seed: stream_seed(listens, pair, q),
            peer_seed: stream_seed(!listens, pair, q),
            posted: VecDeque::new(),
            next_seq: 0,
            wr_id: 0,
            reads_posted: 0,
            atomics_posted: 0,
            tally: Tally::default(),
        });
    }
    let mut link = Link::new(stream);
    // Receive WRs need a QP out of RESET; both sides post theirs before
    // either sends.
    for st in &streams {
        for k in 0..d.rq_depth {
            st.post_recv(&mr, d, k);
        }
    }
    link.send("recv-ready");
    link.expect("recv-ready");
    let t_connected = t0.elapsed();
    let t_start = Instant::now();
    let mut rss = RssSamples::new(warm_up(traffic.duration));
    let mut next_sample = Instant::now() + RssSamples::EVERY;
    let mut next_report = traffic.report.map(|r| Instant::now() + r);
    let total = |streams: &[QpStream]| {
        let mut t = Tally::default();
        for st in streams {
            t.add(&st.tally);
        }
        t
    };
    let describe = |streams: &[QpStream]| {
        let mut s: Vec<String> = streams.iter().map(QpStream::describe).collect();
        s.push(format!("{:?}", dev.net_stats()));
        s.join("\n")
    };

    let mut wcs = [WorkCompletion::default(); 64];
    let mut last_progress = Instant::now();
    let mut round_end = traffic.round;
    let mut rounds = 0u64;
    loop {
        // One round: every QP sends its messages up to round_end, all
        // complete, and the peer's arrive (the peer may be a round ahead).
        while !streams.iter().all(|st| {
            st.next_seq == round_end && st.posted.is_empty() && st.tally.received >= round_end
        }) {
            let mut busy = false;
            for st in &mut streams {
                busy |= st.post(&mr, d, round_end);
            }
            let k = send_cq.poll(&mut wcs).unwrap();
            for wc in &wcs[..k] {
                let q = *by_qpn
                    .get(&wc.qp_num)
                    .unwrap_or_else(|| panic!("{role}: a completion of no QP of ours: {wc:?}"));
                streams[q].on_send(wc, &mr, &peer_static, role);
            }
            busy |= k > 0;
            let k = recv_cq.poll(&mut wcs).unwrap();
            for wc in &wcs[..k] {
                if wc.status != WcStatus::Success {
                    panic!(
                        "{role}: receive completion {wc:?}; the first failed send completion: {:?}\n{}",
                        first_send_error(&send_cq),
                        describe(&streams)
                    );
                }
                let q = *by_qpn
                    .get(&wc.qp_num)
                    .unwrap_or_else(|| panic!("{role}: a completion of no QP of ours: {wc:?}"));
                streams[q].on_recv(wc, &mr, d, round_end + traffic.round, role);
            }
            busy |= k > 0;

            if busy {
                last_progress = Instant::now();
            } else {
                assert!(
                    last_progress.elapsed() < STALL,
                    "{role}: stalled: no completion for {STALL:?}:\n{}",
                    describe(&streams)
                );
                std::thread::yield_now();
            }
            let now = Instant::now();
            if now >= next_sample {
                rss.sample(t_start.elapsed());
                next_sample = now + RssSamples::EVERY;
            }
            if let (Some(at), Some(every)) = (next_report, traffic.report) {
                if now >= at {
                    let stats = dev.net_stats();
                    println!(
                        "PROGRESS {role} t={}s round={rounds} {} rss_kib={} retransmitted={} timeouts={} \
                         seq_naks_sent={} seq_naks_received={} duplicates={}",
                        t_start.elapsed().as_secs(),
                        total(&streams).fields(),
                        rss_kib(),
                        stats.retransmitted,
                        stats.timeouts,
                        stats.seq_naks_sent,
                        stats.seq_naks_received,
                        stats.duplicates,
                    );
                    next_report = Some(now + every);
                }
            }
        }
        rounds += 1;
        let stop = if listens {
            let stop = traffic.duration.is_none_or(|d| t_start.elapsed() >= d);
            link.send(if stop { "stop" } else { "next" });
            stop
        } else {
            match link.recv().as_str() {
                "stop" => true,
                "next" => false,
                other => panic!("{role}: the peer said {other:?} after round {rounds}"),
            }
        };
        if stop {
            break;
        }
        round_end += traffic.round;
    }
    let t_stream = t_start.elapsed();

    // Both sides' streams are complete before any QP goes away.
    link.send("done");
    link.expect("done");
    let peer_atomics = (0..round_end).filter(|&q| atomic_at(q)).count() as u64;
    for st in &streams {
        assert_eq!(st.tally.received, round_end, "{role}: {}", st.describe());
        assert_eq!(
            mr_read_u64(&mr, st.area + d.counter_off()),
            peer_atomics,
            "{role}: the peer's {peer_atomics} fetch-adds on QP {:#x} must each apply exactly once",
            st.qp.qp_num()
        );
    }
    std::thread::sleep(Duration::from_millis(100));
    for (cq, which) in [(&send_cq, "send"), (&recv_cq, "receive")] {
        let k = cq.poll(&mut wcs).unwrap();
        assert_eq!(
            k,
            0,
            "{role}: unexpected {which} completions: {:?}",
            &wcs[..k]
        );
    }
    for st in &streams {
        assert_eq!(st.qp.state(), QpState::Rts, "{role}: {}", st.describe());
    }
    rss.sample(t_start.elapsed());
    let stats = dev.net_stats();
    assert_eq!(stats.rx_icrc_errors, 0, "{stats:?}");
    let counters: Vec<String> = stats
        .counters()
        .iter()
        .map(|(name, v)| format!("{name}={v}"))
        .collect();
    println!(
        "RESULT role={role} addr={} gid={} iface={} remote_gid={} mtu={} qps={} rounds={rounds} {} \
         connected_ms={} stream_ms={} {} {}",
        dev.addr(),
        streams[0].qp.local_gid(),
        dev.interface().unwrap_or("-"),
        streams[0].remote.gid,
        port.active_mtu.bytes(),
        traffic.qps,
        total(&streams).fields(),
        t_connected.as_millis(),
        t_stream.as_millis(),
        rss.fields(),
        counters.join(" "),
    );
}

// ---------------------------------------------------------------------------
// (c) The soak: scripts/soak runs it

const TEST_SOAK: &str = "soak_two_namespaces";
/// Seconds of traffic; the soak runs only when this is set (by scripts/soak).
const SOAK_SECS: &str = "RVERBS_SOAK_SECS";
/// QPs per peer process (default 32).
const SOAK_QPS: &str = "RVERBS_SOAK_QPS";
/// Peer process pairs, one process of each in each namespace (default 2).
const SOAK_PAIRS: &str = "RVERBS_SOAK_PAIRS";
/// Percent of the RoCE packets entering namespace b dropped (default 3).
const SOAK_LOSS: &str = "RVERBS_SOAK_LOSS";
/// MiB a peer's RSS may grow after the warm-up (default 4).
const SOAK_RSS_SLACK_MIB: &str = "RVERBS_SOAK_RSS_SLACK_MIB";
/// Messages each QP sends per round.
const SOAK_ROUND: u64 = 250;
/// How often peers and the parent print a progress line.
const SOAK_REPORT: Duration = Duration::from_secs(30);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid number")),
        Err(_) => default,
    }
}

fn soak_traffic() -> Traffic {
    Traffic {
        qps: env_or(SOAK_QPS, 32),
        depths: SOAK_DEPTHS,
        round: SOAK_ROUND,
        duration: Some(Duration::from_secs(env_or(SOAK_SECS, 0))),
        report: Some(SOAK_REPORT),
    }
}

/// The soak: `RVERBS_SOAK_PAIRS` pairs of peer processes, one of each pair
/// in each of two namespaces joined by veth, every process on its own veth
/// address, with `RVERBS_SOAK_LOSS` % of the RoCE packets entering one
/// namespace dropped; each pair runs `RVERBS_SOAK_QPS` QPs of the traffic of
/// `two_namespaces_with_loss`, every byte checked, in rounds for
/// `RVERBS_SOAK_SECS` seconds. Prints progress lines every 30 s and a
/// summary; fails on any failed or wrong work, a moved count the two sides
/// of a pair disagree on, or RSS growing past `RVERBS_SOAK_RSS_SLACK_MIB`
/// after the warm-up. Without `RVERBS_SOAK_SECS` (as under `cargo test`)
/// it does nothing.
#[test]
fn soak_two_namespaces() {
    match std::env::var(ROLE).as_deref() {
        Ok(role) if role.starts_with("soak-") => return namespace_peer(role, &soak_traffic()),
        Ok(_) => return, // a child process of another test
        Err(_) => {}
    }
    if std::env::var_os(SOAK_SECS).is_none() {
        println!("{TEST_SOAK}: not a soak run ({SOAK_SECS} unset; scripts/soak sets it)");
        return;
    }
    let traffic = soak_traffic();
    let secs = traffic.duration.unwrap().as_secs();
    let pairs: usize = env_or(SOAK_PAIRS, 2);
    let loss: u32 = env_or(SOAK_LOSS, 3);
    assert!(
        (1..=99).contains(&loss),
        "{SOAK_LOSS}={loss}: 1 to 99 percent (nft's random mod 100 < N)"
    );
    assert!(
        pairs >= 1 && traffic.qps >= 1,
        "at least one pair and one QP"
    );
    let slack_kib: u64 = env_or(SOAK_RSS_SLACK_MIB, 4) << 10;
    let (ip, nft) = netns_tools().unwrap_or_else(|missing| panic!("{TEST_SOAK} needs {missing}"));
    let nets = LossyNamespaces::new(&ip, &nft, "rvsk", pairs, loss);
    println!(
        "{TEST_SOAK}: {secs} s, {pairs} process pairs x {} QPs, {loss}% loss into {}; a: {} on {}, b: {} on {}",
        traffic.qps,
        nets.ns[1],
        nets.addrs[0].join(" "),
        nets.veth[0],
        nets.addrs[1].join(" "),
        nets.veth[1],
    );

    let t0 = Instant::now();
    let mut peers: Vec<PeerProcess> = Vec::new();
    for i in 0..pairs {
        for side in 0..2 {
            let role = format!("soak-{}{i}", ["a", "b"][side]);
            let mut cmd = nets.peer(TEST_SOAK, &role, side, i);
            cmd.env(SOAK_SECS, secs.to_string())
                .env(SOAK_QPS, traffic.qps.to_string());
            peers.push(PeerProcess::spawn(&role, cmd));
        }
    }
    // Wait for every peer; once one fails, give the rest a little while to
    // fail on their own (their partner is gone), then kill them.
    let deadline = t0 + Duration::from_secs(secs + 300);
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; peers.len()];
    let mut failed_at: Option<Instant> = None;
    let mut next_report = t0 + SOAK_REPORT;
    while statuses.iter().any(Option::is_none) {
        for (p, status) in peers.iter_mut().zip(&mut statuses) {
            if status.is_none() {
                *status = p.exited();
                if status.is_some_and(|s| !s.success()) {
                    failed_at.get_or_insert_with(Instant::now);
                }
            }
        }
        let give_up = Instant::now() >= deadline
            || failed_at.is_some_and(|t| t.elapsed() > Duration::from_secs(10));
        if give_up {
            for (p, status) in peers.iter_mut().zip(&mut statuses) {
                if status.is_none() {
                    println!("{TEST_SOAK}: killing {}", p.name);
                    let _ = p.child.kill();
                    *status = Some(p.child.wait().unwrap());
                }
            }
        }
        if Instant::now() >= next_report {
            println!(
                "PROGRESS {TEST_SOAK} t={}s nft_drops={}",
                t0.elapsed().as_secs(),
                nets.drops()
            );
            next_report += SOAK_REPORT;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let drops = nets.drops();
    let outputs: Vec<String> = peers
        .iter_mut()
        .map(|p| {
            for r in std::mem::take(&mut p.readers) {
                r.join().unwrap();
            }
            p.output.lock().unwrap().clone()
        })
        .collect();
    nets.delete();

    // The summary, then the verdict.
    let mut errors: Vec<String> = Vec::new();
    let mut results: Vec<Option<PeerResult>> = Vec::new();
    for ((p, status), out) in peers.iter().zip(&statuses).zip(&outputs) {
        let status = status.unwrap();
        let result = out
            .lines()
            .find_map(|l| l.strip_prefix("RESULT "))
            .map(|l| PeerResult(l.to_string()));
        if !status.success() || result.is_none() {
            let why = out
                .lines()
                .find(|l| l.contains("panicked at"))
                .map(|l| {
                    let at = out.find(l).unwrap();
                    out[at..].lines().take(3).collect::<Vec<_>>().join(" | ")
                })
                .unwrap_or_else(|| "no RESULT line".into());
            errors.push(format!("{} failed ({status}): {why}", p.name));
        }
        results.push(result);
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!();
    println!(
        "==== soak summary: {} s in all ({secs} s asked), {pairs} pairs x {} QPs, {loss}% loss into namespace b ====",
        t0.elapsed().as_secs(),
        traffic.qps
    );
    println!(
        "{:<8} {:>9} {:>10} {:>10} {:>10} {:>10} {:>8} {:>9} {:>8} {:>6}",
        "peer",
        "sent",
        "sent MiB",
        "verified",
        "verif MiB",
        "READs",
        "READ MiB",
        "atomics",
        "rounds",
        "ok"
    );
    for (p, r) in peers.iter().zip(&results) {
        match r {
            Some(r) => println!(
                "{:<8} {:>9} {:>10.1} {:>10} {:>10.1} {:>10} {:>8.1} {:>9} {:>8} {:>6}",
                p.name,
                r.num("sent"),
                mib(r.num("sent_bytes")),
                r.num("received"),
                mib(r.num("received_bytes")),
                r.num("reads"),
                mib(r.num("read_bytes")),
                r.num("atomics"),
                r.num("rounds"),
                "yes"
            ),
            None => println!("{:<8} (failed: no result)", p.name),
        }
    }
    println!("nft drops (RoCE packets entering namespace b): {drops}");
    let counters = [
        "tx_packets",
        "rx_packets",
        "retransmitted",
        "timeouts",
        "seq_naks_sent",
        "seq_naks_received",
        "rnr_naks_received",
        "duplicates",
        "out_of_sequence",
        "tx_errors",
        "rx_icrc_errors",
    ];
    println!("device counters:");
    println!(
        "{:<8} {}",
        "peer",
        counters.map(|c| format!("{c:>11}")).join(" ")
    );
    for (p, r) in peers.iter().zip(&results) {
        if let Some(r) = r {
            println!(
                "{:<8} {}",
                p.name,
                counters.map(|c| format!("{:>11}", r.num(c))).join(" ")
            );
        }
    }
    println!(
        "RSS KiB (sampled every {:?}; warm-up {:?}; growth after it bounded by {slack_kib} KiB):",
        RssSamples::EVERY,
        warm_up(traffic.duration)
    );
    println!(
        "{:<8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "peer", "start", "warm", "max", "last", "growth", "samples"
    );
    for (p, r) in peers.iter().zip(&results) {
        let Some(r) = r else { continue };
        let (warm, max, last) = (
            r.num("rss_warm_kib"),
            r.num("rss_max_kib"),
            r.num("rss_last_kib"),
        );
        let growth = max.saturating_sub(warm);
        println!(
            "{:<8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
            p.name,
            r.num("rss_start_kib"),
            warm,
            max,
            last,
            growth,
            r.num("rss_samples")
        );
        if growth > slack_kib {
            errors.push(format!(
                "{}: RSS grew {growth} KiB after the warm-up (from {warm} to {max}), more than {slack_kib}",
                p.name
            ));
        }
        if r.num("rx_icrc_errors") != 0 || r.num("fatal_naks_sent") != 0 {
            errors.push(format!("{}: ICRC errors or fatal NAKs: {}", p.name, r.0));
        }
    }
    // What one side of a pair sent, the other received and checked.
    for i in 0..pairs {
        if let (Some(a), Some(b)) = (&results[2 * i], &results[2 * i + 1]) {
            for (from, to, names) in [(a, b, ("a", "b")), (b, a, ("b", "a"))] {
                for (sent, got) in [("sent", "received"), ("sent_bytes", "received_bytes")] {
                    if from.num(sent) != to.num(got) {
                        errors.push(format!(
                            "pair {i}: {} {sent}={} but {} {got}={}",
                            names.0,
                            from.num(sent),
                            names.1,
                            to.num(got)
                        ));
                    }
                }
            }
        }
    }
    if drops == 0 {
        errors.push("the loss rule dropped nothing: no loss was exercised".into());
    }
    println!("errors: {}", errors.len());
    for e in &errors {
        println!("  {e}");
    }
    println!("soak: {}", if errors.is_empty() { "PASS" } else { "FAIL" });
    assert!(errors.is_empty(), "{TEST_SOAK}: {} errors", errors.len());
}
