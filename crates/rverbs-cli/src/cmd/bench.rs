//! `rverbs bench`: RDMA WRITE, READ and SEND bandwidth and message rate over
//! a sweep of sizes, and SEND ping-pong latency, between a client and a
//! server over loopback — by default two processes, each with its own
//! software device — measured in the same run against a TCP stream and a
//! UDP ping-pong of the same sizes on the same loopback, and printed as
//! ratios to them.
//!
//! The client drives; the server answers commands on a TCP control
//! connection (one line each) and runs its side of every test.
//!
//! Every rverbs row is measured once per data path (`--path`): the
//! same-host path, and the wire (UDP), each with its own server process —
//! the wire's started with `RVERBS_SAME_HOST=0`, so its device has no
//! same-host listener and the client's device falls back to the wire too.
//! Each row says which path it asked for and which one the client device's
//! counters say its QPs took. A memcpy row per bandwidth size shows what
//! one thread copying through memory reaches: the limit on one host.
//!
//! With `--pairs N` the command starts N client processes (hidden
//! `--pair-worker`s), each with its own server process per path, and
//! starts every measured phase — ours or a baseline — in all pairs at once:
//! each worker says `wait` on its stdout before a phase and begins it when
//! the parent writes `go` to its stdin; at the end it prints `report` and
//! its raw figures as JSON, which the parent adds up. `--pin` pins each
//! client and server process to a CPU; `--duration` runs each measurement
//! for a time instead of a number of bytes or round trips.

use std::cell::Cell;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, UdpSocket};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use rverbs::cm::{self, ConnectOptions, Endpoint};
use rverbs::{
    AccessFlags, CompletionChannel, CompletionQueue, Context, MemoryRegion, ProtectionDomain,
    QpCaps, QueuePair, RecvWr, SendWr, Sge, WcStatus, WorkCompletion, WrOpcode,
};
use serde::{Deserialize, Serialize};

/// Which measurements to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Test {
    /// RDMA WRITE bandwidth and message rate.
    Write,
    /// RDMA READ bandwidth and message rate.
    Read,
    /// SEND bandwidth and message rate.
    Send,
    /// SEND ping-pong latency.
    Lat,
}

/// The data path a row's QPs are meant to take (`--path`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DataPath {
    /// Between two devices of this host that agree on it: shared memory
    /// and cross-memory attach instead of UDP datagrams.
    SameHost,
    /// UDP datagrams through the kernel, as between two hosts: the server
    /// runs with `RVERBS_SAME_HOST=0`.
    Wire,
}

impl DataPath {
    /// The name `--path`, the table and the JSON use.
    pub fn name(self) -> &'static str {
        match self {
            DataPath::SameHost => "same-host",
            DataPath::Wire => "wire",
        }
    }
}

/// The path a row's QPs took, from the client device's counters: how many
/// of the QPs set up for the row's path were counted as same-host QPs
/// (`local_qps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathUsed {
    /// Every QP: the same-host path.
    SameHost,
    /// None: the wire.
    Wire,
    /// Some QPs (or some pairs) one way, some the other.
    Mixed,
}

impl PathUsed {
    /// From the QPs set up and how many of them the counters call local.
    fn of(qps: u64, local: u64) -> PathUsed {
        match local {
            0 => PathUsed::Wire,
            n if n >= qps => PathUsed::SameHost,
            _ => PathUsed::Mixed,
        }
    }

    /// Whether this is the path `path` asked for.
    fn is(self, path: DataPath) -> bool {
        matches!(
            (self, path),
            (PathUsed::SameHost, DataPath::SameHost) | (PathUsed::Wire, DataPath::Wire)
        )
    }

    /// The name the table's footnote uses.
    fn name(self) -> &'static str {
        match self {
            PathUsed::SameHost => "same-host",
            PathUsed::Wire => "wire",
            PathUsed::Mixed => "mixed",
        }
    }
}

/// The environment variable that turns the same-host path off in a process
/// (`0`), as the rverbs engine reads it.
const SAME_HOST_ENV: &str = "RVERBS_SAME_HOST";

/// The path this process's device offers peers on this host: the wire if
/// `RVERBS_SAME_HOST=0` (the engine then has no same-host listener), else
/// the same-host path.
fn path_in_environment() -> DataPath {
    match std::env::var(SAME_HOST_ENV) {
        Ok(v) if v.trim() == "0" => DataPath::Wire,
        _ => DataPath::SameHost,
    }
}

/// Options of `rverbs bench`.
#[derive(Args, Debug, Clone, Serialize, Deserialize)]
pub struct BenchArgs {
    /// Message sizes for the bandwidth tests, in bytes.
    #[arg(long, value_delimiter = ',', default_values_t = [4096usize, 65536, 1 << 20])]
    pub sizes: Vec<usize>,
    /// Bytes to move per bandwidth test and size (per pair with --pairs).
    #[arg(long, default_value_t = 512 << 20)]
    pub bytes: u64,
    /// Outstanding work requests (queue depth) per QP.
    #[arg(long, default_value_t = 32)]
    pub qd: u32,
    /// Queue pairs the bandwidth tests spread over.
    #[arg(long, default_value_t = 1)]
    pub qps: u32,
    /// Post each refill of a send queue as one list of WRs (one doorbell
    /// for several WRs, like perftest's --post_list) instead of one
    /// post_send per WR. Equal-sized packets of a list then share GSO
    /// datagrams.
    #[arg(long)]
    pub post_list: bool,

    /// Wait for completions on a completion channel — poll, arm the CQ,
    /// poll again, sleep in `get_cq_event` — instead of busy-polling, on
    /// both sides; the UDP ping-pong baseline then blocks in `recv` too
    #[arg(long)]
    pub event: bool,
    /// The UDP ping-pong baseline blocks in `recv` while rverbs busy-polls:
    /// the baseline a busy-polling program should be held to where client
    /// and server share a core (`--pin --cpus 0`), since two busy-polling
    /// UDP processes on one core take turns a scheduler slice at a time.
    #[arg(long)]
    pub udp_blocking: bool,
    /// The latency test gets a second row, whose UDP ping-pong baseline
    /// sends per hop what rverbs puts on the wire: the message with its
    /// RoCE headers (16 bytes more) and a 20-byte ACK as one two-segment
    /// GSO datagram (`UDP_SEGMENT`), received with `UDP_GRO`, both sides
    /// sending from unconnected sockets as rverbs does — the kernel's part
    /// of a RoCE ping-pong hop, without rverbs' own work. For the wire
    /// path's latency test, with messages of at most 4096 bytes (one packet).
    #[arg(long, conflicts_with = "no_baseline")]
    pub udp_pair: bool,
    /// Round trips of the latency test (per pair with --pairs).
    #[arg(long, default_value_t = 20_000)]
    pub iters: u32,
    /// Message size of the latency test.
    #[arg(long, default_value_t = 8)]
    pub lat_size: usize,
    /// Tests to run.
    #[arg(long, value_delimiter = ',', default_values = ["write", "read", "send", "lat"])]
    pub tests: Vec<Test>,
    /// Rounds per measurement: each round runs ours, then its baseline,
    /// with a share of the bytes or iterations; the table shows medians, and
    /// the ratio is the median of the rounds' ratios (so a slow spell on a
    /// shared machine skews one round, not the result).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// Run each measurement for SECS seconds in all instead of moving
    /// --bytes or making --iters round trips: every round runs ours for
    /// SECS / --rounds, then its baseline for as long (so a row takes about
    /// 2 × SECS).
    #[arg(long, value_name = "SECS", value_parser = parse_secs, conflicts_with_all = ["bytes", "iters"])]
    pub duration: Option<f64>,
    /// Client/server process pairs to run at once, each pair a client and
    /// a server per path, each process with a device; the baselines run as
    /// many pairs at once. Rows
    /// then show the sum over the pairs (bandwidth) or all their samples
    /// pooled (latency), then each pair's own figures.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64), conflicts_with = "server")]
    pub pairs: u32,
    /// Pin every client and server process to one CPU (sched_setaffinity):
    /// the first pair's client to the first CPU of --cpus and its server to
    /// the second, the next pair's to the next two, and so on round the
    /// list. The baselines run in the same processes,
    /// so they are pinned the same. With --serve: the server pins itself
    /// to the first CPU of --cpus (default: the first it may use).
    #[arg(long, overrides_with = "no_pin", conflicts_with = "server")]
    pub pin: bool,
    /// Leave the processes where the scheduler puts them (the default).
    #[arg(long, overrides_with = "pin", conflicts_with = "cpus")]
    pub no_pin: bool,
    /// With --pin: the CPUs to use, comma-separated (default: every CPU this
    /// process may run on). `--pin --cpus 0` puts everything on CPU 0, as
    /// `taskset -c 0` does.
    #[arg(long, value_name = "LIST", value_delimiter = ',', requires = "pin")]
    pub cpus: Vec<usize>,
    /// Skip the TCP and UDP baselines.
    #[arg(long)]
    pub no_baseline: bool,
    /// Data paths to measure every rverbs row over, comma-separated:
    /// `same-host` (shared memory between the two processes' devices) and
    /// `wire` (UDP; its server runs with RVERBS_SAME_HOST=0, which makes
    /// the client's device use the wire to it too). Each path has its own
    /// server process and its own baseline rounds. [default: same-host,wire]
    /// Needs bench's own servers: with --server only the path that server
    /// runs is measured, and --path may name only that one.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub path: Option<Vec<DataPath>>,
    /// Skip the memcpy rows (one per bandwidth size: one thread of the
    /// client copying that many bytes at a time between buffers larger
    /// than the caches, the limit of a copy on this host).
    #[arg(long)]
    pub no_memcpy: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
    /// Use a server already running (`rverbs bench --serve`) at HOST:PORT
    /// instead of starting one.
    #[arg(long, value_name = "HOST:PORT")]
    pub server: Option<String>,
    /// Run as the server, listening for one client on this TCP address.
    #[arg(long, value_name = "HOST:PORT", num_args = 0..=1, default_missing_value = "127.0.0.1:0")]
    pub serve: Option<String>,
    /// Run as one client of `--pairs`: read these options as JSON from
    /// stdin, then take each phase's start from it (internal).
    #[arg(long, hide = true)]
    pub pair_worker: bool,
}

/// Parses `--duration`: seconds, at least a millisecond, at most a day.
fn parse_secs(text: &str) -> Result<f64, String> {
    let secs: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(0.001..=86_400.0).contains(&secs) {
        return Err("must be between 0.001 and 86400 seconds".into());
    }
    Ok(secs)
}

/// One measured figure with its baseline: the whole of it, every pair
/// together.
#[derive(Debug, Serialize)]
pub struct Row {
    /// What was measured.
    pub test: String,
    /// Message size in bytes.
    pub size: usize,
    /// The data path the row's rverbs side was set up for (`same-host`,
    /// `wire`); none for the memcpy rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<DataPath>,
    /// The path the client device's counters say the row's QPs took
    /// (`same-host`, `wire`, or `mixed`): a same-host row that fell back
    /// to the wire says `wire` here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_used: Option<PathUsed>,
    /// Client/server pairs that ran at once.
    pub pairs: u32,
    /// Where rverbs' processes ran: `unpinned`, or the CPUs of the client
    /// and the server.
    pub placement: String,
    /// Where the baseline ran (the same processes, so the same place).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_placement: Option<String>,
    /// The figures: summed over the pairs (GB/s, messages) or over every
    /// pair's samples (latency).
    #[serde(flatten)]
    pub figures: Figures,
    /// The baseline's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    /// CPU time both processes of every pair (all their threads) spent on
    /// the rverbs side of the row: seconds per GB moved (bandwidth tests) or
    /// per million messages, pings and replies (latency test).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    /// The same for the baseline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_cpu: Option<f64>,
    /// `cpu` / `baseline_cpu` (lower is better).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_ratio: Option<f64>,
    /// With more than one pair: the worst pair's figure — the lowest GB/s,
    /// or the highest median µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst_pair: Option<f64>,
    /// With more than one pair: each pair's own figures.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub per_pair: Vec<PairFigures>,
}

/// One pair's own figures in a row of `--pairs`.
#[derive(Debug, Serialize)]
pub struct PairFigures {
    /// The pair, from 1.
    pub pair: u32,
    /// Where this pair's processes ran.
    pub placement: String,
    /// The pair's own figures.
    #[serde(flatten)]
    pub figures: Figures,
}

/// The figures of a row, or of one pair's part of it: for a row, summed
/// over the pairs (GB/s, message rate, messages, resends) or taken over
/// every pair's samples (latency); for a pair, its own (GB/s: the median
/// of its rounds).
#[derive(Debug, Default, Serialize)]
pub struct Figures {
    /// Bandwidth tests: GB/s (10^9 bytes per second).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gb_per_s: Option<f64>,
    /// Bandwidth tests: millions of messages per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mmsg_per_s: Option<f64>,
    /// Latency tests: median half round trip, µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub median_us: Option<f64>,
    /// Latency tests: 99th percentile half round trip, µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_us: Option<f64>,
    /// The baseline's figure (GB/s, or median µs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_value: Option<f64>,
    /// Latency tests: the baseline's 99th percentile, µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_p99_us: Option<f64>,
    /// Ours / baseline, the median of the per-round ratios: for bandwidth
    /// higher is better, for latency lower.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// Request packets the devices sent again during the rounds (go-back-N
    /// after a NAK, an RNR NAK or a timeout): on loopback, where nothing is
    /// lost, each comes from a receiver out of receive WRs or a timer that
    /// fired while the peer was slow.
    pub retransmitted: u64,
    /// Work requests (bandwidth tests) or round trips (latency test) of the
    /// rverbs side, over the rounds.
    pub messages: u64,
    /// The same for the baseline: writes of `size` bytes, or round trips.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_messages: Option<u64>,
}

/// One side — rverbs or its baseline — of one round of one pair, raw.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Side {
    /// Work requests or writes (bandwidth tests), round trips (latency).
    messages: u64,
    /// Bytes moved (bandwidth tests).
    bytes: u64,
    /// How long it took (bandwidth tests).
    secs: f64,
    /// Half round trips in ns (latency test), sorted.
    samples_ns: Vec<u64>,
}

impl Side {
    fn gb_per_s(&self) -> f64 {
        if self.secs > 0.0 {
            self.bytes as f64 / self.secs / 1e9
        } else {
            0.0
        }
    }

    fn mmsg_per_s(&self) -> f64 {
        if self.secs > 0.0 {
            self.messages as f64 / self.secs / 1e6
        } else {
            0.0
        }
    }
}

/// One round of one pair: ours, then the baseline.
#[derive(Debug, Serialize, Deserialize)]
struct Round {
    ours: Side,
    baseline: Option<Side>,
}

/// One pair's raw results for one row; a `--pair-worker` reports a list
/// of these to its parent.
#[derive(Debug, Serialize, Deserialize)]
struct PairRow {
    test: String,
    size: usize,
    /// The path the rverbs side was set up for; none for memcpy.
    path: Option<DataPath>,
    /// What the client device's counters say its QPs took.
    path_used: Option<PathUsed>,
    latency: bool,
    rounds: Vec<Round>,
    /// CPU time of both processes on our side, ns.
    cpu_ns: u64,
    /// The same on the baseline's.
    baseline_cpu_ns: u64,
    /// Request packets both devices resent during the row.
    resent: u64,
    /// A latency row whose baseline sends RoCE's pair per hop (`--udp-pair`).
    pair_baseline: bool,
}

/// How long one side of a round runs: a number of operations (work
/// requests, round trips, or for the TCP stream bytes), or a time.
#[derive(Debug, Clone, Copy)]
enum Span {
    Count(u64),
    Time(Duration),
}

impl Span {
    /// Whether a loop that has done `done` operations since `start` goes on.
    fn more(self, done: u64, start: Instant) -> bool {
        match self {
            Span::Count(count) => done < count,
            Span::Time(time) => start.elapsed() < time,
        }
    }

    /// The count a server command carries: the number, or 0 for "until the
    /// client's end mark".
    fn wire(self) -> u64 {
        match self {
            Span::Count(count) => count,
            Span::Time(_) => 0,
        }
    }

    /// The number, if it is one.
    fn count(self) -> Option<u64> {
        match self {
            Span::Count(count) => Some(count),
            Span::Time(_) => None,
        }
    }
}

/// The immediate data of the SEND that ends an open-ended (`--duration`)
/// SEND test or ping-pong: the receiver stops there.
const END_MARK: u32 = 0x454e_4421;

const ALL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// The RDMA side of one endpoint: context, CQ, QPs, one MR.
struct Rig {
    _ctx: Context,
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    /// With `--event`: the CQ's completion channel, which waits sleep on.
    channel: Option<CompletionChannel>,
    qps: Vec<QueuePair>,
    mr: MemoryRegion,
    remote: Vec<Endpoint>,
    /// Receive WRs posted and not yet consumed, per QP. A test that counts
    /// posts exactly as many as it receives; an open-ended one
    /// (`--duration`) leaves some, which the next test counts on.
    recvs: Vec<Cell<u64>>,
}

fn rig(qps: u32, mr_len: usize, event: bool, control: &mut TcpStream) -> Result<Rig> {
    let dev = rverbs::devices()?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("no RDMA device"))?;
    let ctx = dev.open()?;
    let pd = ctx.alloc_pd()?;
    let channel = event.then(|| ctx.create_comp_channel()).transpose()?;
    let mut cq = ctx.cq_builder().cqe(16 * 1024);
    if let Some(ch) = &channel {
        cq = cq.channel(ch);
    }
    let cq = cq.build()?;
    let mr = pd.alloc_mr(mr_len, ALL_ACCESS)?;
    let opts = ConnectOptions {
        min_rnr_timer: 1,
        ..ConnectOptions::default()
    };
    let mut list = Vec::new();
    let mut remote = Vec::new();
    for _ in 0..qps {
        let qp = pd
            .qp_builder(&cq, &cq)
            .caps(QpCaps {
                max_send_wr: 4096,
                max_recv_wr: 4096,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            })
            .build()?;
        let me = Endpoint::for_qp(&qp).with_buffer(&mr);
        remote.push(cm::connect(&qp, &mut *control, &me, &opts)?);
        list.push(qp);
    }
    Ok(Rig {
        _ctx: ctx,
        _pd: pd,
        cq,
        channel,
        recvs: list.iter().map(|_| Cell::new(0)).collect(),
        qps: list,
        mr,
        remote,
    })
}

fn line(stream: &mut TcpStream) -> Result<String> {
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    loop {
        stream
            .read_exact(&mut b)
            .context("control connection closed")?;
        if b[0] == b'\n' {
            return Ok(String::from_utf8(out)?);
        }
        out.push(b[0]);
    }
}

fn send_line(stream: &mut TcpStream, text: &str) -> Result<()> {
    stream.write_all(format!("{text}\n").as_bytes())?;
    Ok(())
}

/// Polls `cq` into `wc`, failing on any completion error.
fn poll(cq: &CompletionQueue, wc: &mut [WorkCompletion]) -> Result<usize> {
    let n = cq.poll(wc)?;
    if let Some(bad) = wc[..n].iter().find(|w| w.status != WcStatus::Success) {
        bail!("work request {} failed: {}", bad.wr_id, bad.status.as_str());
    }
    Ok(n)
}

impl Rig {
    /// Completions into `wc`, failing on any error. Busy-polling, one poll
    /// (it may find none); with a channel, it sleeps until there are some.
    fn wait(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        let Some(channel) = &self.channel else {
            return poll(&self.cq, wc);
        };
        loop {
            let n = poll(&self.cq, wc)?;
            if n > 0 {
                return Ok(n);
            }
            // Arm, then look again: a completion that came before the arm
            // raises no event.
            self.cq.req_notify(false)?;
            let n = poll(&self.cq, wc)?;
            if n > 0 {
                return Ok(n);
            }
            channel.get_cq_event()?.ack();
        }
    }

    /// Posts one receive WR on QP `i`, over the whole MR: whatever test
    /// comes next, its SENDs fit.
    fn post_recv(&self, i: usize) -> Result<()> {
        let sge = [Sge {
            addr: self.mr.iova(),
            length: self.mr.len() as u32,
            lkey: self.mr.lkey(),
        }];
        self.qps[i].post_recv(&RecvWr::new(0, &sge))?;
        self.recvs[i].set(self.recvs[i].get() + 1);
        Ok(())
    }

    /// Counts the receive WR that `w` consumed; returns its QP's index.
    fn consumed(&self, w: &WorkCompletion) -> usize {
        let i = self
            .qps
            .iter()
            .position(|q| q.qp_num() == w.qp_num)
            .unwrap_or(0);
        self.recvs[i].set(self.recvs[i].get().saturating_sub(1));
        i
    }

    /// Sends the end mark of an open-ended test on the first QP and waits
    /// for its completion (and no other).
    fn send_end_mark(&self) -> Result<()> {
        let mark = SendWr::new(u64::MAX, WrOpcode::SendWithImm { imm: END_MARK }, &[]);
        self.qps[0].post_send(&mark.signaled())?;
        let mut wc = [WorkCompletion::default(); 1];
        while self.wait(&mut wc)? == 0 {}
        if wc[0].wr_id != u64::MAX {
            bail!(
                "a completion for work request {} after the last",
                wc[0].wr_id
            );
        }
        Ok(())
    }
}

// ---- placement ------------------------------------------------------------

/// Pins the calling thread — and so every thread it starts from now on —
/// to `cpu`.
fn pin_to(cpu: usize) -> Result<()> {
    use nix::sched::{sched_setaffinity, CpuSet};
    let mut set = CpuSet::new();
    set.set(cpu)
        .map_err(|_| anyhow!("there is no CPU {cpu} (at most {})", CpuSet::count()))?;
    sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .with_context(|| format!("cannot pin to CPU {cpu}"))
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Result<Vec<usize>> {
    use nix::sched::{sched_getaffinity, CpuSet};
    let set = sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .context("cannot read this process's CPU affinity")?;
    Ok((0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

/// Where each pair's (client, server) processes run: `None` unpinned.
fn placements(args: &BenchArgs) -> Result<Vec<Option<(usize, usize)>>> {
    if !args.pin {
        return Ok(vec![None; args.pairs as usize]);
    }
    let allowed = allowed_cpus()?;
    let cpus = if args.cpus.is_empty() {
        allowed.clone()
    } else {
        args.cpus.clone()
    };
    if let Some(bad) = cpus.iter().find(|c| !allowed.contains(c)) {
        bail!(
            "--cpus: this process may not run on CPU {bad} (it may on {})",
            allowed
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    if cpus.is_empty() {
        bail!("--pin: no CPU to pin to");
    }
    let at = |i: usize| cpus[i % cpus.len()];
    Ok((0..args.pairs as usize)
        .map(|i| Some((at(2 * i), at(2 * i + 1))))
        .collect())
}

/// One pair's placement in words.
fn place_text(place: Option<(usize, usize)>) -> String {
    match place {
        None => "unpinned".into(),
        Some((client, server)) => format!("client cpu {client}, server cpu {server}"),
    }
}

/// Every pair's placement in words: one phrase if they are all the same.
fn placement_text(places: &[Option<(usize, usize)>]) -> String {
    match places {
        [] => "unpinned".into(),
        [one] => place_text(*one),
        [first, rest @ ..] if rest.iter().all(|p| p == first) => match first {
            None => "unpinned".into(),
            Some(_) => format!("{} (every pair)", place_text(*first)),
        },
        _ => places
            .iter()
            .enumerate()
            .map(|(i, p)| format!("pair {}: {}", i + 1, place_text(*p)))
            .collect::<Vec<_>>()
            .join("; "),
    }
}

// ---- server ---------------------------------------------------------------

/// `rverbs bench --serve`: answers one client's commands until it quits;
/// pinned to `pin` if given, before anything starts.
pub fn serve(listen: &str, pin: Option<usize>) -> Result<()> {
    if let Some(cpu) = pin {
        pin_to(cpu)?;
    }
    let listener =
        TcpListener::bind(listen).with_context(|| format!("cannot listen on {listen}"))?;
    println!("listening {}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    let (mut control, _) = listener.accept()?;
    control.set_nodelay(true)?;
    // Before the setup, a client may ask which path this server's device
    // offers (a client of an external server labels its rows with it), and
    // quit if it is not the one it wants.
    let setup = loop {
        let text = line(&mut control)?;
        match text.as_str() {
            "path" => send_line(
                &mut control,
                &format!("path {}", path_in_environment().name()),
            )?,
            "quit" => return Ok(()),
            _ => break text,
        }
    };
    let f: Vec<&str> = setup.split_whitespace().collect();
    let (qps, mr_len, event) = match f.as_slice() {
        ["setup", q, m] => (q.parse()?, m.parse()?, false),
        ["setup", q, m, "event"] => (q.parse()?, m.parse()?, true),
        _ => bail!("bad setup line {setup:?}"),
    };
    let rig = rig(qps, mr_len, event, &mut control)?;
    // A count of 0 in a command: until the client's end mark (--duration).
    let count = |text: &str| -> Result<Option<u64>> {
        let n: u64 = text.parse()?;
        Ok((n > 0).then_some(n))
    };
    loop {
        let cmd = line(&mut control)?;
        let f: Vec<&str> = cmd.split_whitespace().collect();
        match f.as_slice() {
            ["quit"] => {
                if std::env::var_os("RVERBS_BENCH_STATS").is_some() {
                    if let Some(dev) = rverbs::devices()?.first() {
                        eprintln!("server {:?}", dev.net_stats());
                    }
                }
                return Ok(());
            }
            ["idle"] => {} // one-sided tests: the engine thread serves them
            ["cpu"] => send_line(&mut control, &format!("cpu {}", cpu_time().as_nanos()))?,
            ["resent"] => {
                let resent = rverbs::devices()?
                    .first()
                    .map_or(0, |d| d.net_stats().retransmitted);
                send_line(&mut control, &format!("resent {resent}"))?;
            }
            ["recv", _size, n] => serve_recv(&rig, count(n)?, &mut control)?,
            ["echo", size, n] => serve_echo(&rig, size.parse()?, count(n)?, &mut control)?,
            ["tcp", bytes] => {
                let want = count(bytes)?;
                let l = TcpListener::bind("127.0.0.1:0")?;
                send_line(&mut control, &format!("port {}", l.local_addr()?.port()))?;
                let (mut s, _) = l.accept()?;
                let mut got = 0u64;
                let mut buf = vec![0u8; 1 << 20];
                while want.is_none_or(|w| got < w) {
                    let n = s.read(&mut buf)?;
                    if n == 0 {
                        // The end of an open-ended stream.
                        if want.is_none() {
                            break;
                        }
                        bail!("TCP stream ended early");
                    }
                    got += n as u64;
                }
            }
            ["udp", size, n, mode @ ..] => {
                // The client ends with an end mark whatever it counted (it
                // may resend a ping whose reply was lost): the count is
                // only checked.
                count(n)?;
                let sock = UdpSocket::bind("127.0.0.1:0")?;
                send_line(&mut control, &format!("port {}", sock.local_addr()?.port()))?;
                // Busy-polled as the RDMA side polls its CQ; with --event
                // it blocks, as the RDMA side sleeps on its channel (and
                // with --udp-blocking, whose client says "block").
                let blocking = event || mode.contains(&"block");
                sock.set_nonblocking(!blocking)?;
                sock.set_read_timeout(Some(UDP_SERVER_IDLE))?;
                let size = size.parse::<usize>()?;
                let pair = mode
                    .contains(&"pair")
                    .then(|| RocePair::new(&sock, size))
                    .transpose()?;
                let mut buf = vec![0u8; size.max(1).max(PAIR_RECV_BUFFER)];
                loop {
                    // A client whose end mark was lost is long gone.
                    let Some((n, from)) =
                        wait_datagram(&sock, blocking, UDP_SERVER_IDLE, |s| s.recv_from(&mut buf))?
                    else {
                        break;
                    };
                    // An empty datagram is the client's end mark (pings
                    // carry at least a byte).
                    if n == 0 {
                        break;
                    }
                    match &pair {
                        Some(pair) => {
                            // A pair whose rest was lost is answered too:
                            // the client waits for a whole one.
                            pair.receive_rest(&sock, blocking, n, &mut buf)?;
                            pair.send(&sock, &buf, from)?;
                        }
                        None => {
                            sock.send_to(&buf[..n], from)?;
                        }
                    }
                }
            }
            _ => bail!("unknown command {cmd:?}"),
        }
        send_line(&mut control, "ok")?;
    }
}

/// Receives `count` SENDs spread over the QPs — or, with `None`, SENDs
/// until the end mark — keeping up to 2048 receive WRs posted per QP. With
/// a count, each QP gets exactly as many as the client sends on it (it
/// sends SEND n on QP n % qps), so none is left over for the next test and
/// none is missing. Says `ready` once the first ones are posted: SENDs that
/// came before would meet no receive WR (RNR NAKs, and the window resent).
fn serve_recv(rig: &Rig, count: Option<u64>, control: &mut TcpStream) -> Result<()> {
    let qps = rig.qps.len() as u64;
    let share = |i: usize| count.map(|c| c / qps + u64::from((i as u64) < c % qps));
    let mut posted = vec![0u64; rig.qps.len()];
    let may_post = |i: usize, posted: &[u64]| share(i).is_none_or(|s| posted[i] < s);
    for i in 0..rig.qps.len() {
        while rig.recvs[i].get() < 2048 && may_post(i, &posted) {
            rig.post_recv(i)?;
            posted[i] += 1;
        }
    }
    send_line(control, "ready")?;
    let mut done = 0u64;
    let mut ended = false;
    let mut wc = [WorkCompletion::default(); 64];
    while count.map_or(!ended, |c| done < c) {
        let n = rig.wait(&mut wc)?;
        for w in &wc[..n] {
            let i = rig.consumed(w);
            if w.imm() == Some(END_MARK) {
                ended = true;
                continue;
            }
            done += 1;
            if !ended && may_post(i, &posted) {
                rig.post_recv(i)?;
                posted[i] += 1;
            }
        }
    }
    Ok(())
}

/// Echoes `count` SENDs of `size` bytes on the first QP — or, with `None`,
/// SENDs until the end mark: receive, send back.
fn serve_echo(rig: &Rig, size: usize, count: Option<u64>, control: &mut TcpStream) -> Result<()> {
    let qp = &rig.qps[0];
    let may_post = |posted: u64| count.is_none_or(|c| posted < c);
    let mut posted = 0;
    while rig.recvs[0].get() < 4 && may_post(posted) {
        rig.post_recv(0)?;
        posted += 1;
    }
    // Pings before this would meet no receive WR: RNR NAKs, waits and
    // resends inside the measurement.
    send_line(control, "ready")?;
    let mut wc = [WorkCompletion::default(); 16];
    let mut data = vec![0u8; size];
    let (mut echoed, mut sent, mut ended) = (0u64, 0u64, false);
    while count.map_or(!ended, |c| echoed < c) || sent < echoed {
        let n = rig.wait(&mut wc)?;
        for w in &wc[..n] {
            if w.opcode != rverbs::WcOpcode::Recv {
                sent += 1;
                continue;
            }
            rig.consumed(w);
            if w.imm() == Some(END_MARK) {
                ended = true;
                continue;
            }
            echoed += 1;
            // Reply first; receive WRs are posted ahead (up to four), so
            // replenishing one after the reply is off the critical path.
            if size <= 64 {
                rig.mr.read_at(0, &mut data)?;
                qp.post_send(&SendWr::inline(1, WrOpcode::Send, &data).signaled())?;
            } else {
                let payload = [Sge {
                    addr: rig.mr.iova(),
                    length: size as u32,
                    lkey: rig.mr.lkey(),
                }];
                qp.post_send(&SendWr::new(1, WrOpcode::Send, &payload).signaled())?;
            }
            if rig.recvs[0].get() < 4 && may_post(posted) {
                rig.post_recv(0)?;
                posted += 1;
            }
        }
    }
    Ok(())
}

// ---- client ---------------------------------------------------------------

/// A server process of ours, or an external one, and the control
/// connection to it.
struct Server {
    child: Option<Child>,
    control: TcpStream,
    /// Where it listens, HOST:PORT.
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = send_line(&mut self.control, "quit");
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

/// Starts a server process for `path` (pinned to `cpu` if given): for the
/// wire with `RVERBS_SAME_HOST=0` in its environment, for the same-host
/// path with this process's environment as it is. Or reaches the one
/// `--server` names, whatever its path.
fn start_server(args: &BenchArgs, path: DataPath, cpu: Option<usize>) -> Result<Server> {
    let (child, addr) = match &args.server {
        Some(addr) => (None, addr.clone()),
        None => {
            let exe = std::env::current_exe()?;
            let mut cmd = Command::new(exe);
            cmd.args(["bench", "--serve", "127.0.0.1:0"]);
            if let Some(cpu) = cpu {
                cmd.args(["--pin", "--cpus", &cpu.to_string()]);
            }
            if path == DataPath::Wire {
                cmd.env(SAME_HOST_ENV, "0");
            }
            let mut child = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .context("cannot start the bench server process")?;
            let mut first = String::new();
            BufReader::new(child.stdout.as_mut().ok_or_else(|| anyhow!("no stdout"))?)
                .read_line(&mut first)?;
            let port = first
                .strip_prefix("listening ")
                .ok_or_else(|| anyhow!("server said {first:?}"))?
                .trim()
                .to_string();
            (Some(child), format!("127.0.0.1:{port}"))
        }
    };
    let control = TcpStream::connect(&addr)
        .with_context(|| format!("cannot reach the bench server at {addr}"))?;
    control.set_nodelay(true)?;
    Ok(Server {
        child,
        control,
        addr,
    })
}

/// Asks a server, before its setup, which path its device offers peers on
/// this host.
fn ask_server_path(server: &mut Server) -> Result<DataPath> {
    let addr = server.addr.clone();
    let old = || format!("the bench server at {addr} does not say its path (older than --path?)");
    send_line(&mut server.control, "path").with_context(old)?;
    let reply = line(&mut server.control).with_context(old)?;
    match reply.strip_prefix("path ") {
        Some("same-host") => Ok(DataPath::SameHost),
        Some("wire") => Ok(DataPath::Wire),
        _ => bail!("the bench server at {addr} said {reply:?} for its path"),
    }
}

/// A progress bar of `len` units, or with `None` (a measurement that runs
/// for a time) a spinner with the rate.
fn bar(args: &BenchArgs, len: Option<u64>, what: &str) -> ProgressBar {
    if args.quiet || args.json {
        return ProgressBar::hidden();
    }
    let (pb, template) = match len {
        Some(len) => (
            ProgressBar::new(len),
            "{msg:>22} [{bar:30}] {percent:>3}% {per_sec}",
        ),
        None => (ProgressBar::new_spinner(), "{msg:>22} {spinner} {per_sec}"),
    };
    pb.set_style(
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// Starts each measured phase of a pair: at once when the pair runs alone;
/// as a `--pair-worker`, when the parent says so — it says `go` to every
/// pair once all are waiting, so every pair's phase, ours or a baseline's,
/// runs at the same time.
enum Gate<'a> {
    Alone,
    Parent(&'a mut dyn Write),
}

impl Gate<'_> {
    fn go(&mut self) -> Result<()> {
        if let Gate::Parent(out) = self {
            writeln!(out, "wait")?;
            out.flush()?;
            let mut reply = String::new();
            std::io::stdin().lock().read_line(&mut reply)?;
            if reply.trim_end() != "go" {
                bail!("the bench parent said {reply:?}, not go");
            }
        }
        Ok(())
    }
}

/// Runs `span` operations of `size` bytes (or operations for a time) with
/// `qd` outstanding per QP, each refill posted WR by WR or, with
/// `post_list`, as one list per QP. Open-ended SEND tests end with the
/// end mark, after the time is taken.
fn bandwidth(
    rig: &Rig,
    op: Test,
    size: usize,
    span: Span,
    (qd, post_list): (u32, bool),
    pb: &ProgressBar,
) -> Result<Side> {
    let qps = rig.qps.len() as u64;
    let window = u64::from(qd) * qps;
    let local = [Sge {
        addr: rig.mr.iova(),
        length: size as u32,
        lkey: rig.mr.lkey(),
    }];
    let mut posted = 0u64;
    let mut done = 0u64;
    let mut wc = [WorkCompletion::default(); 64];
    // With `post_list`, the WRs of a refill, per QP.
    let mut lists: Vec<Vec<SendWr<'_>>> = vec![Vec::new(); rig.qps.len()];
    let start = Instant::now();
    loop {
        while posted - done < window && span.more(posted, start) {
            let i = (posted % qps) as usize;
            let remote = &rig.remote[i];
            let opcode = match op {
                Test::Write => WrOpcode::RdmaWrite {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                },
                Test::Read => WrOpcode::RdmaRead {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                },
                _ => WrOpcode::Send,
            };
            let wr = SendWr::new(posted, opcode, &local).signaled();
            if post_list {
                lists[i].push(wr);
            } else {
                rig.qps[i].post_send(&wr)?;
            }
            posted += 1;
        }
        for (qp, list) in rig.qps.iter().zip(&mut lists) {
            if !list.is_empty() {
                qp.post_send_list(list)?;
                list.clear();
            }
        }
        // Nothing outstanding, and the loop above posted nothing more: the
        // span is over.
        if done == posted {
            break;
        }
        let n = rig.wait(&mut wc)?;
        done += n as u64;
        // A completion left over from another test would make the window
        // arithmetic wrap (the loop then never posts again): refuse it.
        if done > posted {
            bail!("{done} completions for {posted} work requests posted");
        }
        if n > 0 {
            pb.inc((n * size) as u64);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if op == Test::Send && span.count().is_none() {
        rig.send_end_mark()?;
    }
    Ok(Side {
        messages: posted,
        bytes: posted * size as u64,
        secs,
        samples_ns: Vec::new(),
    })
}

/// Half round trips of a SEND ping-pong, in ns, sorted. Open-ended
/// (`--duration`), it ends with the end mark, which has no reply.
fn pingpong(rig: &Rig, size: usize, span: Span, pb: &ProgressBar) -> Result<Side> {
    let qp = &rig.qps[0];
    let sge = [Sge {
        addr: rig.mr.iova(),
        length: size.max(1) as u32,
        lkey: rig.mr.lkey(),
    }];
    let payload = vec![0x5au8; size];
    let mut wc = [WorkCompletion::default(); 16];
    let mut samples = Vec::with_capacity(span.count().unwrap_or(1 << 16) as usize);
    // Send completions seen (each ping is signaled).
    let mut sent = 0u64;
    // Two receive WRs posted ahead: the one each reply uses is replenished
    // while the next ping is on its way, off the critical path. With a
    // count, exactly that many in all, so none is left over for the next
    // test.
    let mut posted = 0u64;
    let may_post = |posted: u64| span.count().is_none_or(|c| posted < c);
    let top_up = |posted: &mut u64| -> Result<()> {
        while rig.recvs[0].get() < 2 && may_post(*posted) {
            rig.post_recv(0)?;
            *posted += 1;
        }
        Ok(())
    };
    top_up(&mut posted)?;
    let start = Instant::now();
    let mut pings = 0u64;
    while span.more(pings, start) {
        let t = Instant::now();
        if size <= 64 {
            qp.post_send(&SendWr::inline(1, WrOpcode::Send, &payload).signaled())?;
        } else {
            qp.post_send(&SendWr::new(1, WrOpcode::Send, &sge).signaled())?;
        }
        pings += 1;
        top_up(&mut posted)?;
        let mut got_reply = false;
        while !got_reply {
            let n = rig.wait(&mut wc)?;
            for w in wc[..n]
                .iter()
                .filter(|w| w.opcode == rverbs::WcOpcode::Recv)
            {
                rig.consumed(w);
                got_reply = true;
            }
            sent += count_sends(&wc[..n]);
        }
        samples.push((t.elapsed().as_nanos() / 2) as u64);
        pb.inc(1);
    }
    // A ping's own completion may come after its reply: wait for the last
    // ones here, or the next test would count them as its own.
    while sent < pings {
        let n = rig.wait(&mut wc)?;
        sent += count_sends(&wc[..n]);
    }
    if span.count().is_none() {
        rig.send_end_mark()?;
    }
    samples.sort_unstable();
    Ok(Side {
        messages: pings,
        samples_ns: samples,
        ..Side::default()
    })
}

/// How many of `wc` complete SENDs.
fn count_sends(wc: &[WorkCompletion]) -> u64 {
    wc.iter()
        .filter(|w| w.opcode == rverbs::WcOpcode::Send)
        .count() as u64
}

/// The median (upper one of an even count), `None` for no values.
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

/// The `p` quantile of sorted ns samples, in µs (NaN for none).
fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i] as f64 / 1e3
}

/// A TCP stream of `size`-byte writes: `span` counts bytes.
fn tcp_stream(control: &mut TcpStream, size: usize, span: Span, gate: &mut Gate) -> Result<Side> {
    send_line(control, &format!("tcp {}", span.wire()))?;
    let port = line(control)?;
    let port = port
        .strip_prefix("port ")
        .ok_or_else(|| anyhow!("server said {port:?}"))?;
    let mut s = TcpStream::connect(format!("127.0.0.1:{port}"))?;
    s.set_nodelay(true)?;
    let buf = vec![0x5au8; size];
    gate.go()?;
    let start = Instant::now();
    let (mut bytes, mut writes) = (0u64, 0u64);
    while span.more(bytes, start) {
        let n = span
            .count()
            .map_or(size, |c| ((c - bytes) as usize).min(size));
        s.write_all(&buf[..n])?;
        bytes += n as u64;
        writes += 1;
    }
    // The server reads to the end of an open-ended stream.
    s.shutdown(Shutdown::Write)?;
    expect(control, "ok")?;
    Ok(Side {
        messages: writes,
        bytes,
        secs: start.elapsed().as_secs_f64(),
        samples_ns: Vec::new(),
    })
}

/// The UDP ping-pong baseline's client: `(blocking, pair)` — whether it
/// blocks in `recv` rather than busy-polling, and whether each hop is
/// RoCE's pair (see [`RocePair`]) rather than one datagram of `size`.
fn udp_pingpong(
    control: &mut TcpStream,
    size: usize,
    span: Span,
    (blocking, pair): (bool, bool),
    gate: &mut Gate,
) -> Result<Side> {
    let mut mode = String::new();
    if blocking {
        mode.push_str(" block");
    }
    if pair {
        mode.push_str(" pair");
    }
    send_line(control, &format!("udp {size} {}{mode}", span.wire()))?;
    let port = line(control)?;
    let port = port
        .strip_prefix("port ")
        .ok_or_else(|| anyhow!("server said {port:?}"))?;
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    let server: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
    // The pair is sent as rverbs must send it: from an unconnected socket,
    // naming the peer each time (a connected socket's route is cached, but
    // Linux then numbers its IPv4 IDs from a random start, which a RoCE
    // sender must know for its ICRC). The plain baseline's client connects.
    if !pair {
        sock.connect(server)?;
    }
    sock.set_nonblocking(!blocking)?;
    sock.set_read_timeout(Some(UDP_RESEND))?;
    let pair = pair.then(|| RocePair::new(&sock, size)).transpose()?;
    let mut payload = vec![0x5au8; pair.as_ref().map_or(size.max(1), RocePair::len)];
    let mut buf = vec![0u8; payload.len().max(PAIR_RECV_BUFFER)];
    let mut samples = Vec::with_capacity(span.count().unwrap_or(1 << 16) as usize);
    // Each ping starts with its number, which its reply echoes: a reply to
    // a ping sent again (its first reply late, not lost) is told apart.
    let tag = payload.len().min(8);
    gate.go()?;
    let start = Instant::now();
    while span.more(samples.len() as u64, start) {
        let seq = (samples.len() as u64).to_le_bytes();
        payload[..tag].copy_from_slice(&seq[..tag]);
        let t = Instant::now();
        let mut sent = 0;
        'ping: loop {
            // Loopback may drop a datagram (its backlog full, with many
            // processes sending at once): send the ping again.
            sent += 1;
            if sent > UDP_SENDS {
                bail!(
                    "UDP ping-pong: no reply to ping {} in {UDP_SENDS} tries",
                    samples.len()
                );
            }
            match &pair {
                Some(pair) => pair.send(&sock, &payload, server)?,
                None => {
                    sock.send(&payload)?;
                }
            }
            let until = Instant::now() + UDP_RESEND;
            loop {
                let left = until.saturating_duration_since(Instant::now());
                let Some(n) = wait_datagram(&sock, blocking, left, |s| s.recv(&mut buf))? else {
                    continue 'ping;
                };
                if n >= tag && buf[..tag] == seq[..tag] {
                    match &pair {
                        Some(pair) if !pair.receive_rest(&sock, blocking, n, &mut buf)? => {
                            continue 'ping;
                        }
                        _ => break 'ping,
                    }
                }
            }
        }
        samples.push((t.elapsed().as_nanos() / 2) as u64);
    }
    // The end mark: an empty datagram (a few, in case one is lost; the
    // server stops at the first, and after UDP_SERVER_IDLE without any).
    // Once the server's socket is closed, a later one is refused (ICMP port
    // unreachable): that is no error.
    sock.send_to(&[], server)?;
    for _ in 0..2 {
        let _ = sock.send_to(&[], server);
    }
    expect(control, "ok")?;
    samples.sort_unstable();
    Ok(Side {
        messages: samples.len() as u64,
        samples_ns: samples,
        ..Side::default()
    })
}

/// A receive buffer that takes a whole GRO batch of RoCE's pair.
const PAIR_RECV_BUFFER: usize = 65536;

/// The longest message `--udp-pair` models: one packet at the largest path
/// MTU.
const PAIR_MAX_MESSAGE: usize = 4096;

/// The `--udp-pair` baseline's hop: what rverbs sends per hop of a SEND
/// ping-pong over the wire — the reply (BTH, payload, ICRC: `size` + 16
/// bytes) and the ACK it carries for the message before (BTH, AETH,
/// ICRC: 20 bytes) as one two-segment GSO datagram, which the peer's
/// socket (`UDP_GRO` on) takes in one receive.
struct RocePair {
    /// The two segments' sizes, the longer first (a GSO send's last
    /// segment may be shorter than the rest, not longer).
    segments: (usize, usize),
}

impl RocePair {
    /// The pair for `size`-byte messages; turns `UDP_GRO` on for `sock`.
    fn new(sock: &UdpSocket, size: usize) -> Result<RocePair> {
        use nix::sys::socket::{setsockopt, sockopt::UdpGroSegment};
        setsockopt(sock, UdpGroSegment, &true).context("turning UDP_GRO on")?;
        let (reply, ack) = (size + 16, 20);
        Ok(RocePair {
            segments: (reply.max(ack), reply.min(ack)),
        })
    }

    /// Bytes of one pair.
    fn len(&self) -> usize {
        self.segments.0 + self.segments.1
    }

    /// After a receive of `got` bytes into `buf`, the rest of the pair:
    /// usually nothing (GRO hands the pair over whole), but the kernel now
    /// and then delivers the segments one by one (a CI run saw 24 bytes,
    /// then the 20 of the ACK), as rverbs also takes them. `false`: the
    /// rest did not come within [`UDP_RESEND`].
    fn receive_rest(
        &self,
        sock: &UdpSocket,
        blocking: bool,
        mut got: usize,
        buf: &mut [u8],
    ) -> Result<bool> {
        while got < self.len() {
            let Some(n) = wait_datagram(sock, blocking, UDP_RESEND, |s| s.recv(&mut buf[got..]))?
            else {
                return Ok(false);
            };
            got += n;
        }
        if got != self.len() {
            bail!(
                "--udp-pair: received {got} bytes of a {}-byte pair",
                self.len()
            );
        }
        Ok(true)
    }

    /// Sends the pair from `buf` (at least [`len`](Self::len) bytes) as
    /// one GSO datagram, to `to`.
    fn send(&self, sock: &UdpSocket, buf: &[u8], to: std::net::SocketAddr) -> Result<()> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrStorage};
        use std::os::fd::AsRawFd;
        let segment = u16::try_from(self.segments.0).context("message too long for a GSO pair")?;
        let iov = [std::io::IoSlice::new(&buf[..self.len()])];
        let cmsg = [ControlMessage::UdpGsoSegments(&segment)];
        let to = SockaddrStorage::from(to);
        sendmsg(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), Some(&to))
            .context("sending a UDP GSO pair (UDP_SEGMENT; a kernel without UDP GSO refuses it)")?;
        Ok(())
    }
}

/// How long the UDP ping-pong's client waits for a reply before it sends
/// the ping again.
const UDP_RESEND: Duration = Duration::from_millis(200);
/// Most times the client sends one ping.
const UDP_SENDS: u32 = 25;
/// How long the UDP ping-pong's server waits for the next datagram before
/// it takes the client for gone.
const UDP_SERVER_IDLE: Duration = Duration::from_secs(10);

/// The next datagram `recv` takes from `sock` within `limit` (`None`: none
/// came). A non-blocking socket is busy-polled, as the RDMA side polls its
/// CQ; a blocking one sleeps in the call (for at most its read timeout,
/// set once: no extra system call per ping).
fn wait_datagram<T>(
    sock: &UdpSocket,
    blocking: bool,
    limit: Duration,
    mut recv: impl FnMut(&UdpSocket) -> std::io::Result<T>,
) -> Result<Option<T>> {
    use std::io::ErrorKind::{TimedOut, WouldBlock};
    let until = Instant::now() + limit;
    let mut polls = 0u32;
    loop {
        match recv(sock) {
            Ok(v) => return Ok(Some(v)),
            Err(e) if matches!(e.kind(), WouldBlock | TimedOut) => {}
            Err(e) => return Err(e.into()),
        }
        polls = polls.wrapping_add(1);
        // Spinning, the clock is read now and then only: the spin stays
        // as tight as before.
        if (blocking || polls % 64 == 0) && Instant::now() >= until {
            return Ok(None);
        }
        std::hint::spin_loop();
    }
}

/// CPU time this process (every thread) has used so far, user and system.
fn cpu_time() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF).map_or(Duration::ZERO, |u| {
        let tv = |t: nix::sys::time::TimeVal| {
            Duration::from_secs(t.tv_sec().max(0) as u64)
                + Duration::from_micros(t.tv_usec().max(0) as u64)
        };
        tv(u.user_time()) + tv(u.system_time())
    })
}

/// Asks the server for one of its figures: sends `what`, reads the
/// `what N` it answers and the `ok` after it.
fn ask_server(control: &mut TcpStream, what: &str) -> Result<u64> {
    send_line(control, what)?;
    let reply = line(control)?;
    let value = reply
        .strip_prefix(what)
        .and_then(|v| v.strip_prefix(' '))
        .ok_or_else(|| anyhow!("server said {reply:?}"))?
        .parse()?;
    expect(control, "ok")?;
    Ok(value)
}

/// CPU time both processes have used so far: ours and the server's.
fn both_cpu(control: &mut TcpStream) -> Result<Duration> {
    Ok(cpu_time() + Duration::from_nanos(ask_server(control, "cpu")?))
}

/// Adds up CPU time over the phases of a row's rounds.
#[derive(Default)]
struct CpuBill {
    ours: Duration,
    baseline: Duration,
}

impl CpuBill {
    /// Runs `phase` and adds both processes' CPU time to ours or to the
    /// baseline's.
    fn charge<T>(
        &mut self,
        control: &mut TcpStream,
        baseline: bool,
        phase: impl FnOnce(&mut TcpStream) -> Result<T>,
    ) -> Result<T> {
        let before = both_cpu(control)?;
        let out = phase(control)?;
        let used = both_cpu(control)?.saturating_sub(before);
        if baseline {
            self.baseline += used;
        } else {
            self.ours += used;
        }
        Ok(out)
    }
}

/// Request packets resent so far by both devices: ours and the server's.
fn resent(control: &mut TcpStream) -> Result<u64> {
    let ours = rverbs::devices()?
        .first()
        .map_or(0, |d| d.net_stats().retransmitted);
    Ok(ours + ask_server(control, "resent")?)
}

/// Reads the server's next line, which must be `want` (`ok` after a
/// command; `ready` once its receive WRs are posted).
fn expect(control: &mut TcpStream, want: &str) -> Result<()> {
    let reply = line(control)?;
    if reply != want {
        bail!("server said {reply:?}");
    }
    Ok(())
}

/// How long each side of a round runs with `--duration`.
fn round_time(args: &BenchArgs) -> Option<Duration> {
    args.duration
        .map(|secs| Duration::from_secs_f64(secs / f64::from(args.rounds)))
}

/// The paths `--path` asks for, in its order, each once (default: both).
fn wanted_paths(args: &BenchArgs) -> Vec<DataPath> {
    let mut paths = Vec::new();
    for &p in args
        .path
        .as_deref()
        .unwrap_or(&[DataPath::SameHost, DataPath::Wire])
    {
        if !paths.contains(&p) {
            paths.push(p);
        }
    }
    paths
}

/// The same-host QPs the client's device has counted so far.
fn local_qps_so_far() -> Result<u64> {
    Ok(rverbs::devices()?
        .first()
        .map_or(0, |d| d.net_stats().local_qps))
}

/// One path of a pair: its server, the client's side connected to it, and
/// the path its QPs took.
struct PathRig {
    path: DataPath,
    used: PathUsed,
    /// Dropped before the server, which is then told to quit.
    rig: Rig,
    server: Server,
}

/// Starts (or, with `--server`, reaches) the server of `path` and
/// connects the client's QPs to it, reading the client device's counters
/// around that to learn which path the QPs took. With `--server` the path
/// is the one that server offers, which must be `path` if `--path` names
/// one.
fn connect_path(
    args: &BenchArgs,
    path: DataPath,
    cpu: Option<usize>,
    mr_len: usize,
) -> Result<PathRig> {
    let mut server = start_server(args, path, cpu)?;
    let path = if args.server.is_some() {
        let offered = ask_server_path(&mut server)?;
        if let Some(&[asked]) = args.path.as_deref() {
            if asked != offered {
                let how = match offered {
                    DataPath::Wire => "with",
                    DataPath::SameHost => "without",
                };
                bail!(
                    "the bench server at {} offers the {} path (it runs {how} \
                     {SAME_HOST_ENV}=0), not --path {}: --path needs bench's own servers",
                    server.addr,
                    offered.name(),
                    asked.name()
                );
            }
        }
        offered
    } else {
        path
    };
    let mode = if args.event { " event" } else { "" };
    send_line(
        &mut server.control,
        &format!("setup {} {mr_len}{mode}", args.qps),
    )?;
    let before = local_qps_so_far()?;
    let rig = rig(args.qps, mr_len, args.event, &mut server.control)?;
    let local = local_qps_so_far()?.saturating_sub(before);
    Ok(PathRig {
        path,
        used: PathUsed::of(u64::from(args.qps), local),
        rig,
        server,
    })
}

/// One pair: pins its client (this process) and servers to `place` if
/// given, starts (or reaches) a server per path and runs every test over
/// each path in turn — row by row, so the paths' rows of a test and size
/// are measured one after the other — then the memcpy rows; each phase
/// started by `gate`.
fn run_pair(
    args: &BenchArgs,
    place: Option<(usize, usize)>,
    gate: &mut Gate,
) -> Result<Vec<PairRow>> {
    if let Some((client, _)) = place {
        pin_to(client)?;
    }
    let max = args
        .sizes
        .iter()
        .copied()
        .max()
        .unwrap_or(4096)
        .max(args.lat_size)
        .max(4096);
    // An external server takes one client, and offers its own path.
    let wanted = wanted_paths(args);
    let count = if args.server.is_some() {
        1
    } else {
        wanted.len()
    };
    let mut paths = Vec::new();
    for &path in &wanted[..count] {
        paths.push(connect_path(args, path, place.map(|(_, s)| s), max)?);
    }
    let mut rows = Vec::new();
    let mark = |mut row: PairRow, p: &PathRig| {
        row.path = Some(p.path);
        row.path_used = Some(p.used);
        row
    };
    for &test in &args.tests {
        if test == Test::Lat {
            for p in &mut paths {
                let row = latency_row(args, &p.rig, &mut p.server.control, gate, false)?;
                rows.push(mark(row, p));
                if args.udp_pair && p.path == DataPath::Wire {
                    let row = latency_row(args, &p.rig, &mut p.server.control, gate, true)?;
                    rows.push(mark(row, p));
                }
            }
        } else {
            for &size in &args.sizes {
                for p in &mut paths {
                    let row =
                        bandwidth_row(args, (test, size), &p.rig, &mut p.server.control, gate)?;
                    rows.push(mark(row, p));
                }
            }
        }
    }
    if std::env::var_os("RVERBS_BENCH_STATS").is_some() {
        if let Some(dev) = rverbs::devices()?.first() {
            eprintln!("client {:?}", dev.net_stats());
        }
    }
    // The servers quit before the memcpy rows: nothing else runs then.
    drop(paths);
    if measures_memcpy(args) {
        let set = memcpy_working_set();
        for &size in &args.sizes {
            rows.push(memcpy_row(args, size, set, gate)?);
        }
    }
    Ok(rows)
}

/// The SEND ping-pong row of one pair, each round against the UDP
/// ping-pong.
fn latency_row(
    args: &BenchArgs,
    rig: &Rig,
    control: &mut TcpStream,
    gate: &mut Gate,
    pair_baseline: bool,
) -> Result<PairRow> {
    let size = args.lat_size;
    let span = round_time(args).map_or_else(
        || Span::Count(u64::from((args.iters / args.rounds).max(1))),
        Span::Time,
    );
    let pb = bar(
        args,
        span.count().map(|c| c * u64::from(args.rounds)),
        &format!("send ping-pong {size} B"),
    );
    let resent_before = resent(control)?;
    let mut bill = CpuBill::default();
    let mut rounds = Vec::new();
    for _ in 0..args.rounds {
        let ours = bill.charge(control, false, |control| {
            send_line(control, &format!("echo {size} {}", span.wire()))?;
            expect(control, "ready")?;
            gate.go()?;
            let side = pingpong(rig, size, span, &pb)?;
            expect(control, "ok")?;
            Ok(side)
        })?;
        let baseline = if args.no_baseline {
            None
        } else {
            Some(bill.charge(control, true, |control| {
                let blocking = args.event || args.udp_blocking;
                udp_pingpong(control, size, span, (blocking, pair_baseline), gate)
            })?)
        };
        rounds.push(Round { ours, baseline });
    }
    pb.finish_and_clear();
    Ok(PairRow {
        test: "send_lat".into(),
        size,
        path: None,
        path_used: None,
        latency: true,
        rounds,
        cpu_ns: bill.ours.as_nanos() as u64,
        baseline_cpu_ns: bill.baseline.as_nanos() as u64,
        resent: resent(control)?.saturating_sub(resent_before),
        pair_baseline,
    })
}

/// The row of one bandwidth test and size of one pair, each round against
/// the TCP stream.
fn bandwidth_row(
    args: &BenchArgs,
    (test, size): (Test, usize),
    rig: &Rig,
    control: &mut TcpStream,
    gate: &mut Gate,
) -> Result<PairRow> {
    let count = (args.bytes / u64::from(args.rounds) / size as u64).max(64);
    let (span, tcp_span) = match round_time(args) {
        Some(time) => (Span::Time(time), Span::Time(time)),
        None => (Span::Count(count), Span::Count(count * size as u64)),
    };
    let name = match test {
        Test::Write => "rdma_write",
        Test::Read => "rdma_read",
        _ => "send",
    };
    let pb = bar(
        args,
        tcp_span.count().map(|b| b * u64::from(args.rounds)),
        &format!("{name} {size} B"),
    );
    let resent_before = resent(control)?;
    let mut bill = CpuBill::default();
    let mut rounds = Vec::new();
    for _ in 0..args.rounds {
        let ours = bill.charge(control, false, |control| {
            if test == Test::Send {
                send_line(control, &format!("recv {size} {}", span.wire()))?;
                expect(control, "ready")?;
            } else {
                send_line(control, "idle")?;
            }
            gate.go()?;
            let side = bandwidth(rig, test, size, span, (args.qd, args.post_list), &pb)?;
            expect(control, "ok")?;
            Ok(side)
        })?;
        let baseline = if args.no_baseline {
            None
        } else {
            Some(bill.charge(control, true, |control| {
                tcp_stream(control, size, tcp_span, gate)
            })?)
        };
        rounds.push(Round { ours, baseline });
    }
    pb.finish_and_clear();
    Ok(PairRow {
        test: name.into(),
        size,
        path: None,
        path_used: None,
        latency: false,
        rounds,
        cpu_ns: bill.ours.as_nanos() as u64,
        baseline_cpu_ns: bill.baseline.as_nanos() as u64,
        resent: resent(control)?.saturating_sub(resent_before),
        pair_baseline: false,
    })
}

// ---- memcpy ---------------------------------------------------------------

/// The least the memcpy rows copy over, source and destination together:
/// more than the last-level cache of most machines, so the large sizes
/// stream from memory as a transfer between two processes does.
const MEMCPY_MIN_WORKING_SET: usize = 64 << 20;
/// The most (a machine with a huge cache still gets a working set twice
/// its cache, up to this).
const MEMCPY_MAX_WORKING_SET: usize = 256 << 20;

/// Whether the run has memcpy rows: on unless `--no-memcpy`, and only with
/// a bandwidth test (their sizes are the bandwidth tests').
fn measures_memcpy(args: &BenchArgs) -> bool {
    !args.no_memcpy && args.tests.iter().any(|&t| t != Test::Lat)
}

/// Bytes the memcpy rows rotate over, source and destination together:
/// twice the largest CPU cache sysfs reports, at least
/// [`MEMCPY_MIN_WORKING_SET`] and at most [`MEMCPY_MAX_WORKING_SET`].
fn memcpy_working_set() -> usize {
    largest_cache()
        .unwrap_or(0)
        .saturating_mul(2)
        .clamp(MEMCPY_MIN_WORKING_SET, MEMCPY_MAX_WORKING_SET)
}

/// The largest cache of CPU 0 (its last level), in bytes, from sysfs.
fn largest_cache() -> Option<usize> {
    std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache")
        .ok()?
        .filter_map(|entry| std::fs::read_to_string(entry.ok()?.path().join("size")).ok())
        .filter_map(|text| parse_cache_size(text.trim()))
        .max()
}

/// A sysfs cache size: digits and an optional `K`, `M` or `G`.
fn parse_cache_size(text: &str) -> Option<usize> {
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    number.parse::<usize>().ok()?.checked_mul(scale)
}

/// The buffers of a memcpy row: a source and a destination of `slots`
/// slots of `size` bytes each; copy n goes from source slot n % slots to
/// the same destination slot, so successive copies walk the whole working
/// set and the large sizes miss the caches.
struct CopyBuffers {
    src: Vec<u8>,
    dst: Vec<u8>,
    size: usize,
    slots: usize,
    /// The slot the next copy uses.
    next: usize,
}

impl CopyBuffers {
    /// Buffers for copies of `size` bytes over `working_set` bytes (at
    /// least one slot each), every page written once so no copy meets a
    /// page fault or the shared zero page.
    fn new(size: usize, working_set: usize) -> CopyBuffers {
        let slots = (working_set / 2 / size).max(1);
        CopyBuffers {
            src: vec![0x5a; slots * size],
            dst: vec![0xa5; slots * size],
            size,
            slots,
            next: 0,
        }
    }

    /// Copies `size` bytes at a time for `span` (a number of copies, or a
    /// time).
    fn copy(&mut self, span: Span) -> Side {
        let start = Instant::now();
        let mut copies = 0u64;
        while span.more(copies, start) {
            let at = self.next * self.size..(self.next + 1) * self.size;
            self.dst[at.clone()].copy_from_slice(&self.src[at.clone()]);
            // The copy is observed, so it is made.
            std::hint::black_box(&mut self.dst[at]);
            self.next = (self.next + 1) % self.slots;
            copies += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        Side {
            messages: copies,
            bytes: copies * self.size as u64,
            secs,
            samples_ns: Vec::new(),
        }
    }
}

/// The memcpy row of one size: copies of `size` bytes between buffers of
/// `working_set` bytes in all, in this thread, in rounds as the bandwidth
/// rows (as many bytes or as long a time); no baseline.
fn memcpy_row(
    args: &BenchArgs,
    size: usize,
    working_set: usize,
    gate: &mut Gate,
) -> Result<PairRow> {
    let span = round_time(args).map_or_else(
        || Span::Count((args.bytes / u64::from(args.rounds) / size as u64).max(64)),
        Span::Time,
    );
    let pb = bar(
        args,
        span.count()
            .map(|c| c * size as u64 * u64::from(args.rounds)),
        &format!("memcpy {size} B"),
    );
    let mut buffers = CopyBuffers::new(size, working_set);
    let mut cpu = Duration::ZERO;
    let mut rounds = Vec::new();
    for _ in 0..args.rounds {
        gate.go()?;
        let before = cpu_time();
        let ours = buffers.copy(span);
        cpu += cpu_time().saturating_sub(before);
        pb.inc(ours.bytes);
        rounds.push(Round {
            ours,
            baseline: None,
        });
    }
    pb.finish_and_clear();
    Ok(PairRow {
        test: "memcpy".into(),
        size,
        path: None,
        path_used: None,
        latency: false,
        rounds,
        cpu_ns: cpu.as_nanos() as u64,
        baseline_cpu_ns: 0,
        resent: 0,
        pair_baseline: false,
    })
}

// ---- pairs ----------------------------------------------------------------

/// The client processes of `--pairs`, killed (with that their servers end)
/// if they are still running when this is dropped.
struct Workers(Vec<Worker>);

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.0 {
            if matches!(w.child.try_wait(), Ok(None)) {
                let _ = w.child.kill();
            }
            let _ = w.child.wait();
        }
    }
}

/// `--pairs N`: starts a client process per pair (`--pair-worker`, with the
/// options as JSON on its stdin), lets every pair start each phase at once,
/// and collects their reports, in pair order.
fn run_pairs(args: &BenchArgs, places: &[Option<(usize, usize)>]) -> Result<Vec<Vec<PairRow>>> {
    let exe = std::env::current_exe()?;
    let mut workers = Workers(Vec::new());
    for place in places {
        let mut child = Command::new(&exe)
            .args(["bench", "--pair-worker"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start a bench client process")?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            bail!("no pipes to a bench client process");
        };
        let mut options = args.clone();
        options.pairs = 1;
        options.quiet = true;
        options.json = false;
        options.pair_worker = true;
        options.cpus = place.map_or_else(Vec::new, |(c, s)| vec![c, s]);
        writeln!(stdin, "{}", serde_json::to_string(&options)?)?;
        workers.0.push(Worker {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        });
    }
    // Phases: every rverbs row's rounds, each with its baseline's, then
    // the memcpy rows' rounds.
    let paths = wanted_paths(args);
    let wire = paths.iter().filter(|&&p| p == DataPath::Wire).count();
    let rows = args
        .tests
        .iter()
        .map(|&t| match t {
            // With --udp-pair, the wire's second row against RoCE's pair.
            Test::Lat => paths.len() + if args.udp_pair { wire } else { 0 },
            _ => args.sizes.len() * paths.len(),
        })
        .sum::<usize>();
    let memcpy_rows = if measures_memcpy(args) {
        args.sizes.len()
    } else {
        0
    };
    let phases = (rows as u64 * if args.no_baseline { 1 } else { 2 } + memcpy_rows as u64)
        * u64::from(args.rounds);
    let pb = bar(args, Some(phases), &format!("{} pairs", places.len()));
    loop {
        let mut said = Vec::new();
        for (i, w) in workers.0.iter_mut().enumerate() {
            let mut text = String::new();
            if w.stdout.read_line(&mut text)? == 0 {
                bail!("the client process of pair {} stopped", i + 1);
            }
            said.push(text);
        }
        if said.iter().all(|s| s.trim_end() == "wait") {
            for w in &mut workers.0 {
                writeln!(w.stdin, "go")?;
                w.stdin.flush()?;
            }
            pb.inc(1);
            continue;
        }
        pb.finish_and_clear();
        let mut reports = Vec::new();
        for (i, text) in said.iter().enumerate() {
            let json = text
                .strip_prefix("report ")
                .ok_or_else(|| anyhow!("pair {} is out of step: {:?}", i + 1, text.trim_end()))?;
            reports.push(serde_json::from_str(json).context("a pair's report")?);
        }
        for (i, w) in workers.0.iter_mut().enumerate() {
            let status = w.child.wait()?;
            if !status.success() {
                bail!("the client process of pair {} ended with {status}", i + 1);
            }
        }
        return Ok(reports);
    }
}

/// `--pair-worker`: one pair of `--pairs`, its options on stdin, each
/// phase started by the parent; prints `report` and the pair's rows as
/// JSON.
fn pair_worker(out: &mut dyn Write) -> Result<()> {
    let mut first = String::new();
    std::io::stdin().lock().read_line(&mut first)?;
    let args: BenchArgs =
        serde_json::from_str(&first).context("a bench client's options (on its stdin)")?;
    let place = match args.cpus.as_slice() {
        [client, server] => Some((*client, *server)),
        _ => None,
    };
    let rows = run_pair(&args, place, &mut Gate::Parent(&mut *out))?;
    writeln!(out, "report {}", serde_json::to_string(&rows)?)?;
    out.flush()?;
    Ok(())
}

// ---- figures --------------------------------------------------------------

/// Every pair's samples of one side, sorted.
fn pooled<'a>(sides: impl Iterator<Item = &'a Side>) -> Vec<u64> {
    let mut all: Vec<u64> = sides.flat_map(|s| s.samples_ns.iter().copied()).collect();
    all.sort_unstable();
    all
}

/// A pair's side of round `k`: ours.
fn ours(p: &PairRow, k: usize) -> &Side {
    &p.rounds[k].ours
}

/// A pair's side of round `k`: the baseline's, if it ran.
fn base(p: &PairRow, k: usize) -> Option<&Side> {
    p.rounds[k].baseline.as_ref()
}

/// CPU seconds per unit, if there were units.
fn per(cpu_ns: u64, units: f64) -> Option<f64> {
    (units > 0.0).then(|| cpu_ns as f64 / 1e9 / units)
}

/// Turns every pair's raw results (the same rows in each) into the rows
/// shown: sums or pooled samples over the pairs, medians over the rounds,
/// and with more than one pair each pair's own figures.
fn summarize(
    args: &BenchArgs,
    places: &[Option<(usize, usize)>],
    pairs: &[Vec<PairRow>],
) -> Result<Vec<Row>> {
    let placement = placement_text(places);
    let first = pairs.first().ok_or_else(|| anyhow!("no pair reported"))?;
    let mut rows = Vec::new();
    for (r, head) in first.iter().enumerate() {
        let of: Vec<&PairRow> = pairs
            .iter()
            .map(|p| p.get(r))
            .collect::<Option<_>>()
            .ok_or_else(|| anyhow!("the pairs reported different rows"))?;
        let rounds = head.rounds.len();
        if of.iter().any(|p| {
            p.rounds.len() != rounds
                || p.test != head.test
                || p.size != head.size
                || p.path != head.path
                || p.pair_baseline != head.pair_baseline
        }) {
            bail!("the pairs reported different rows");
        }
        // Whether this row ran a baseline (not with --no-baseline, nor for
        // memcpy).
        let baseline = head.rounds.iter().any(|r| r.baseline.is_some());
        // Every pair's QPs took one path, or the row says `mixed`.
        let path_used = head.path_used.map(|used| {
            if of.iter().all(|p| p.path_used == Some(used)) {
                used
            } else {
                PathUsed::Mixed
            }
        });
        let messages: u64 = of
            .iter()
            .flat_map(|p| &p.rounds)
            .map(|r| r.ours.messages)
            .sum();
        let base_messages: u64 = of
            .iter()
            .flat_map(|p| &p.rounds)
            .filter_map(|r| r.baseline.as_ref())
            .map(|s| s.messages)
            .sum();
        let cpu_ns: u64 = of.iter().map(|p| p.cpu_ns).sum();
        let base_cpu_ns: u64 = of.iter().map(|p| p.baseline_cpu_ns).sum();
        let mut row = Row {
            test: head.test.clone(),
            size: head.size,
            path: head.path,
            path_used,
            pairs: of.len() as u32,
            placement: placement.clone(),
            baseline_placement: baseline.then(|| placement.clone()),
            figures: Figures {
                retransmitted: of.iter().map(|p| p.resent).sum(),
                messages,
                baseline_messages: baseline.then_some(base_messages),
                ..Figures::default()
            },
            baseline: None,
            cpu: None,
            baseline_cpu: None,
            cpu_ratio: None,
            worst_pair: None,
            per_pair: Vec::new(),
        };
        let mut per_pair: Vec<PairFigures> = of
            .iter()
            .enumerate()
            .map(|(i, p)| PairFigures {
                pair: i as u32 + 1,
                placement: place_text(places.get(i).copied().flatten()),
                figures: Figures {
                    retransmitted: p.resent,
                    messages: p.rounds.iter().map(|r| r.ours.messages).sum(),
                    baseline_messages: baseline.then(|| {
                        p.rounds
                            .iter()
                            .filter_map(|r| r.baseline.as_ref())
                            .map(|s| s.messages)
                            .sum()
                    }),
                    ..Figures::default()
                },
            })
            .collect();
        // The row's figures over every pair, and each pair's over itself.
        let figures: fn(&[&PairRow], bool, &mut Figures) = if head.latency {
            latency_figures
        } else {
            bandwidth_figures
        };
        figures(&of, baseline, &mut row.figures);
        for (fig, p) in per_pair.iter_mut().zip(&of) {
            figures(&[*p], baseline, &mut fig.figures);
        }
        let pair_figures = per_pair.iter().map(|f| &f.figures);
        row.worst_pair = if head.latency {
            pair_figures
                .filter_map(|f| f.median_us)
                .max_by(f64::total_cmp)
        } else {
            pair_figures
                .filter_map(|f| f.gb_per_s)
                .min_by(f64::total_cmp)
        };
        let (cpu_units, base_units) = if head.latency {
            row.baseline = baseline.then(|| {
                match (args.event || args.udp_blocking, head.pair_baseline) {
                    (true, false) => "udp blocking",
                    (false, false) => "udp ping-pong",
                    (true, true) => "udp pair blocking",
                    (false, true) => "udp pair ping-pong",
                }
                .into()
            });
            // Per million messages: each round trip is a ping and a reply.
            (
                2.0 * messages as f64 / 1e6,
                2.0 * base_messages as f64 / 1e6,
            )
        } else {
            row.baseline = baseline.then(|| "tcp stream".into());
            // (memcpy rows have none: `baseline` is false for them.)
            let bytes = |side: fn(&Round) -> Option<&Side>| {
                of.iter()
                    .flat_map(|p| &p.rounds)
                    .filter_map(side)
                    .map(|s| s.bytes)
                    .sum::<u64>()
            };
            (
                bytes(|r| Some(&r.ours)) as f64 / 1e9,
                bytes(|r| r.baseline.as_ref()) as f64 / 1e9,
            )
        };
        row.cpu = per(cpu_ns, cpu_units);
        if baseline {
            row.baseline_cpu = per(base_cpu_ns, base_units);
            row.cpu_ratio = match (row.cpu, row.baseline_cpu) {
                (Some(o), Some(b)) if b > 0.0 => Some(o / b),
                _ => None,
            };
        }
        if of.len() > 1 {
            row.per_pair = per_pair;
        } else {
            row.worst_pair = None;
        }
        rows.push(row);
    }
    Ok(rows)
}

/// The latency figures of `of` — every pair of a row, or one pair — into
/// `fig`: percentiles over all their samples, and the median of the rounds'
/// ratios, each over all their samples of that round.
fn latency_figures(of: &[&PairRow], baseline: bool, fig: &mut Figures) {
    let rounds = of[0].rounds.len();
    let all = pooled(of.iter().flat_map(|p| (0..rounds).map(|k| ours(p, k))));
    fig.median_us = Some(percentile(&all, 0.5));
    fig.p99_us = Some(percentile(&all, 0.99));
    if baseline {
        let udp = pooled(
            of.iter()
                .flat_map(|p| (0..rounds).filter_map(|k| base(p, k))),
        );
        fig.baseline_value = Some(percentile(&udp, 0.5));
        fig.baseline_p99_us = Some(percentile(&udp, 0.99));
        fig.ratio = median(
            (0..rounds)
                .map(|k| {
                    let o = pooled(of.iter().map(|p| ours(p, k)));
                    let b = pooled(of.iter().filter_map(|p| base(p, k)));
                    percentile(&o, 0.5) / percentile(&b, 0.5)
                })
                .collect(),
        );
    }
}

/// The bandwidth figures of `of` — every pair of a row, or one pair — into
/// `fig`: each round's figures summed over `of`, and their medians.
fn bandwidth_figures(of: &[&PairRow], baseline: bool, fig: &mut Figures) {
    let rounds = of[0].rounds.len();
    let sum = |k: usize, f: fn(&Side) -> f64, side: fn(&Round) -> Option<&Side>| {
        of.iter()
            .filter_map(|p| side(&p.rounds[k]))
            .map(f)
            .sum::<f64>()
    };
    let ours_side: fn(&Round) -> Option<&Side> = |r| Some(&r.ours);
    let base_side: fn(&Round) -> Option<&Side> = |r| r.baseline.as_ref();
    let over_rounds = |f: &dyn Fn(usize) -> f64| median((0..rounds).map(f).collect());
    fig.gb_per_s = over_rounds(&|k| sum(k, Side::gb_per_s, ours_side));
    fig.mmsg_per_s = over_rounds(&|k| sum(k, Side::mmsg_per_s, ours_side));
    if baseline {
        fig.baseline_value = over_rounds(&|k| sum(k, Side::gb_per_s, base_side));
        fig.ratio =
            over_rounds(&|k| sum(k, Side::gb_per_s, ours_side) / sum(k, Side::gb_per_s, base_side));
    }
}

// ---- the command ----------------------------------------------------------

/// `rverbs bench`.
pub fn bench(args: &BenchArgs, out: &mut impl Write) -> Result<Vec<Row>> {
    if let Some(listen) = &args.serve {
        let pin = if args.pin {
            Some(match args.cpus.first() {
                Some(&cpu) => cpu,
                None => *allowed_cpus()?
                    .first()
                    .ok_or_else(|| anyhow!("--pin: no CPU to pin to"))?,
            })
        } else {
            None
        };
        serve(listen, pin)?;
        return Ok(Vec::new());
    }
    if args.pair_worker {
        pair_worker(out)?;
        return Ok(Vec::new());
    }
    if args.sizes.iter().any(|&s| s == 0 || s > 1 << 30) {
        bail!("sizes must be between 1 byte and 1 GiB");
    }
    if args.qps == 0 || args.qd == 0 {
        bail!("--qps and --qd must be at least 1");
    }
    if args.udp_pair {
        if !args.tests.contains(&Test::Lat) {
            bail!("--udp-pair adds a row to the latency test: --tests must include lat");
        }
        if !wanted_paths(args).contains(&DataPath::Wire) {
            bail!("--udp-pair is the wire's floor: --path must include wire");
        }
        if args.lat_size > PAIR_MAX_MESSAGE {
            bail!(
                "--udp-pair sends a message as one RoCE packet: --lat-size at most \
                 {PAIR_MAX_MESSAGE} (the largest path MTU)"
            );
        }
    }
    if let Some(addr) = &args.server {
        if wanted_paths(args).len() > 1 && args.path.is_some() {
            bail!(
                "--path {}: an external server (--server {addr}) offers one path, the one its \
                 {SAME_HOST_ENV} chooses; measuring several needs bench's own servers (leave \
                 out --server)",
                wanted_paths(args)
                    .iter()
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(",")
            );
        }
    }
    let places = placements(args)?;
    let results = if args.pairs == 1 {
        vec![run_pair(args, places[0], &mut Gate::Alone)?]
    } else {
        run_pairs(args, &places)?
    };
    let rows = summarize(args, &places, &results)?;
    if args.json {
        serde_json::to_writer_pretty(&mut *out, &rows)?;
        writeln!(out)?;
    } else {
        writeln!(out, "{}", setup_line(args, &places, &rows))?;
        print_table(&rows, out)?;
    }
    Ok(rows)
}

/// The table's first lines: pairs, rounds, how long each runs, where
/// rverbs and the baselines ran, the paths measured and the memcpy rows'
/// working set.
fn setup_line(args: &BenchArgs, places: &[Option<(usize, usize)>], rows: &[Row]) -> String {
    let placement = placement_text(places);
    let pairs = match args.pairs {
        1 => "1 pair".to_string(),
        n => format!("{n} pairs at once"),
    };
    let span = match args.duration {
        Some(secs) => format!("{secs} s per measurement"),
        None => {
            let mut counts = Vec::new();
            if args.tests.iter().any(|&t| t != Test::Lat) {
                counts.push(format!("{} bytes per size", args.bytes));
            }
            if args.tests.contains(&Test::Lat) {
                counts.push(format!("{} round trips", args.iters));
            }
            let each = if args.pairs > 1 { " per pair" } else { "" };
            format!("{}{each}", counts.join(" and "))
        }
    };
    let mut text = format!(
        "setup: {pairs}; {span}, in {} round{}; rverbs placement: {placement}",
        args.rounds,
        if args.rounds == 1 { "" } else { "s" }
    );
    if !args.no_baseline {
        text += &format!("; baseline placement: {placement} (the same processes)");
    }
    let mut paths: Vec<DataPath> = Vec::new();
    for path in rows.iter().filter_map(|r| r.path) {
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    let mut second = Vec::new();
    if !paths.is_empty() {
        let names: Vec<&str> = paths.iter().map(|p| p.name()).collect();
        let how = match (&args.server, paths.as_slice()) {
            (Some(addr), _) => format!("the path the server at {addr} offers"),
            (None, [DataPath::Wire]) => format!("its server with {SAME_HOST_ENV}=0"),
            (None, [_]) => "its own server".to_string(),
            (None, _) => format!("a server each; the wire's with {SAME_HOST_ENV}=0"),
        };
        second.push(format!(
            "path{} measured: {} ({how})",
            if paths.len() == 1 { "" } else { "s" },
            names.join(", ")
        ));
    }
    if rows.iter().any(|r| r.test == "memcpy") {
        second.push(format!(
            "memcpy: one thread of the client, over {} MiB (source and destination)",
            memcpy_working_set() >> 20
        ));
    }
    if !second.is_empty() {
        text += &format!("\n       {}", second.join("; "));
    }
    if args.pairs > 1 {
        text += "\n       rows: GB/s and Mmsg/s summed over the pairs, latency over every \
                 pair's samples; then each pair's own";
    }
    text
}

/// The path cell of a row: the path asked for, starred if the counters say
/// its QPs took another; `-` for memcpy.
fn path_cell(row: &Row) -> String {
    match (row.path, row.path_used) {
        (Some(path), Some(used)) if !used.is(path) => format!("{}*", path.name()),
        (Some(path), _) => path.name().to_string(),
        (None, _) => "-".to_string(),
    }
}

fn print_table(rows: &[Row], out: &mut impl Write) -> Result<()> {
    let line = |out: &mut dyn Write, cells: [&str; 14]| -> Result<()> {
        writeln!(
            out,
            "{:<11} {:>9} {:<10} {:>10} {:>10} {:>11} {:>9}   {:<14} {:>10} {:>9} {:>7} {:>6} {:>7} {:>10}",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5],
            cells[6],
            cells[7],
            cells[8],
            cells[9],
            cells[10],
            cells[11],
            cells[12],
            cells[13],
        )?;
        Ok(())
    };
    line(
        out,
        [
            "test",
            "size",
            "path",
            "GB/s",
            "Mmsg/s",
            "median µs",
            "p99 µs",
            "baseline",
            "value",
            "b.p99 µs",
            "ratio",
            "cpu",
            "resent",
            "msgs",
        ],
    )?;
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |v| format!("{v:.prec$}"));
    let times = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}x"));
    let value = |v: Option<f64>, latency: bool| match v {
        Some(v) if latency => format!("{v:.2} µs"),
        Some(v) => format!("{v:.3} GB/s"),
        None => "-".into(),
    };
    // The figure cells, from GB/s to the ratio, of a row or a pair.
    let cells = |f: &Figures, latency: bool| {
        [
            opt(f.gb_per_s, 3),
            opt(f.mmsg_per_s, 3),
            opt(f.median_us, 2),
            opt(f.p99_us, 2),
            value(f.baseline_value, latency),
            opt(f.baseline_p99_us, 2),
            times(f.ratio),
        ]
    };
    for r in rows {
        let f = &r.figures;
        let latency = f.median_us.is_some();
        let [gb, mmsg, median, p99, base, base_p99, ratio] = cells(f, latency);
        line(
            out,
            [
                &r.test,
                &r.size.to_string(),
                &path_cell(r),
                &gb,
                &mmsg,
                &median,
                &p99,
                r.baseline.as_deref().unwrap_or("-"),
                &base,
                &base_p99,
                &ratio,
                &times(r.cpu_ratio),
                &f.retransmitted.to_string(),
                &f.messages.to_string(),
            ],
        )?;
        for p in &r.per_pair {
            let f = &p.figures;
            let [gb, mmsg, median, p99, base, base_p99, ratio] = cells(f, latency);
            line(
                out,
                [
                    &format!("  pair {}", p.pair),
                    "",
                    "",
                    &gb,
                    &mmsg,
                    &median,
                    &p99,
                    "",
                    &base,
                    &base_p99,
                    &ratio,
                    "",
                    &f.retransmitted.to_string(),
                    &f.messages.to_string(),
                ],
            )?;
        }
    }
    // Rows whose QPs did not take the path they were set up for.
    let mut astray: Vec<String> = Vec::new();
    for r in rows {
        if let (Some(path), Some(used)) = (r.path, r.path_used) {
            let text = format!("{} rows: {}", path.name(), used.name());
            if !used.is(path) && !astray.contains(&text) {
                astray.push(text);
            }
        }
    }
    if !astray.is_empty() {
        writeln!(
            out,
            "* the client device's counters say these QPs took another path ({}): \
             see `rverbs counters` (wire_qps_*) and RVERBS_LOG=debug for why",
            astray.join("; ")
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pair the kernel delivers segment by segment (as a CI run saw) is
    /// taken whole; one whose rest never comes is reported, not waited
    /// for.
    #[test]
    fn a_pair_arriving_in_segments_is_taken_whole() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        rx.set_read_timeout(Some(UDP_RESEND)).unwrap();
        let pair = RocePair::new(&rx, 8).unwrap();
        assert_eq!(pair.len(), 44);
        let mut buf = vec![0u8; PAIR_RECV_BUFFER];
        tx.send(&[1; 24]).unwrap();
        tx.send(&[2; 20]).unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(n, 24, "plain sends arrive one by one");
        assert!(pair.receive_rest(&rx, true, n, &mut buf).unwrap());
        assert_eq!(&buf[..44], [[1u8; 24].as_slice(), &[2; 20]].concat());
        tx.send(&[3; 24]).unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert!(
            !pair.receive_rest(&rx, true, n, &mut buf).unwrap(),
            "no rest came"
        );
    }
}
