//! `rverbs bench`: RDMA WRITE, READ and SEND bandwidth and message rate over
//! a sweep of sizes, and SEND ping-pong latency, between a client and a
//! server over loopback — by default two processes, each with its own
//! software device — measured in the same run against a TCP stream and a
//! UDP ping-pong of the same sizes on the same loopback, and printed as
//! ratios to them.
//!
//! The client drives; the server answers commands on a TCP control
//! connection (one line each) and runs its side of every test.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use rverbs::cm::{self, ConnectOptions, Endpoint};
use rverbs::{
    AccessFlags, CompletionChannel, CompletionQueue, Context, MemoryRegion, ProtectionDomain,
    QpCaps, QueuePair, RecvWr, SendWr, Sge, WcStatus, WorkCompletion, WrOpcode,
};
use serde::Serialize;

/// Which measurements to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
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

/// Options of `rverbs bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Message sizes for the bandwidth tests, in bytes.
    #[arg(long, value_delimiter = ',', default_values_t = [4096usize, 65536, 1 << 20])]
    pub sizes: Vec<usize>,
    /// Bytes to move per bandwidth test and size.
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
    /// Round trips of the latency test.
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
    /// Skip the TCP and UDP baselines.
    #[arg(long)]
    pub no_baseline: bool,
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
}

/// One measured figure with its baseline.
#[derive(Debug, Serialize)]
pub struct Row {
    /// What was measured.
    pub test: String,
    /// Message size in bytes.
    pub size: usize,
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
    /// The baseline's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    /// The baseline's figure (GB/s, or median µs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_value: Option<f64>,
    /// Bandwidth: ours / baseline (higher is better). Latency: ours /
    /// baseline (lower is better).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// CPU time both processes (all their threads) spent on the rverbs
    /// side of the row: seconds per GB moved (bandwidth tests) or per
    /// million messages, pings and replies (latency test).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    /// The same for the baseline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_cpu: Option<f64>,
    /// `cpu` / `baseline_cpu` (lower is better).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_ratio: Option<f64>,
    /// Request packets both devices sent again during the row's rounds
    /// (go-back-N after a NAK, an RNR NAK or a timeout): on loopback, where
    /// nothing is lost, each comes from a receiver out of receive WRs or a
    /// timer that fired while the peer was slow.
    pub retransmitted: u64,
}

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
}

// ---- server ---------------------------------------------------------------

/// `rverbs bench --serve`: answers one client's commands until it quits.
pub fn serve(listen: &str) -> Result<()> {
    let listener =
        TcpListener::bind(listen).with_context(|| format!("cannot listen on {listen}"))?;
    println!("listening {}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    let (mut control, _) = listener.accept()?;
    control.set_nodelay(true)?;
    let setup = line(&mut control)?;
    let f: Vec<&str> = setup.split_whitespace().collect();
    let (qps, mr_len, event) = match f.as_slice() {
        ["setup", q, m] => (q.parse()?, m.parse()?, false),
        ["setup", q, m, "event"] => (q.parse()?, m.parse()?, true),
        _ => bail!("bad setup line {setup:?}"),
    };
    let rig = rig(qps, mr_len, event, &mut control)?;
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
            ["recv", size, count] => serve_recv(&rig, size.parse()?, count.parse()?, &mut control)?,
            ["echo", size, count] => serve_echo(&rig, size.parse()?, count.parse()?, &mut control)?,
            ["tcp", bytes] => {
                let l = TcpListener::bind("127.0.0.1:0")?;
                send_line(&mut control, &format!("port {}", l.local_addr()?.port()))?;
                let (mut s, _) = l.accept()?;
                let mut left: u64 = bytes.parse()?;
                let mut buf = vec![0u8; 1 << 20];
                while left > 0 {
                    let n = s.read(&mut buf)?;
                    if n == 0 {
                        bail!("TCP stream ended early");
                    }
                    left -= n as u64;
                }
            }
            ["udp", size, count] => {
                let sock = UdpSocket::bind("127.0.0.1:0")?;
                send_line(&mut control, &format!("port {}", sock.local_addr()?.port()))?;
                // Busy-polled as the RDMA side polls its CQ; with --event
                // it blocks, as the RDMA side sleeps on its channel.
                sock.set_nonblocking(!event)?;
                let mut buf = vec![0u8; size.parse::<usize>()?.max(1)];
                for _ in 0..count.parse::<u64>()? {
                    let (n, from) = spin(|| sock.recv_from(&mut buf))?;
                    sock.send_to(&buf[..n], from)?;
                }
            }
            _ => bail!("unknown command {cmd:?}"),
        }
        send_line(&mut control, "ok")?;
    }
}

fn recv_sge(rig: &Rig, size: usize) -> Sge {
    Sge {
        addr: rig.mr.iova(),
        length: size as u32,
        lkey: rig.mr.lkey(),
    }
}

/// Receives `count` SENDs of `size` bytes spread over the QPs, keeping up
/// to 2048 receive WRs posted per QP: each QP gets exactly as many as the
/// client sends on it (it sends SEND n on QP n % qps), so none is left over
/// for the next test and none is missing. Says `ready` once the first ones
/// are posted: SENDs that came before would meet no receive WR (RNR NAKs,
/// and the window resent).
fn serve_recv(rig: &Rig, size: usize, count: u64, control: &mut TcpStream) -> Result<()> {
    let sge = [recv_sge(rig, size)];
    let qps = rig.qps.len() as u64;
    let share = |i: usize| count / qps + u64::from((i as u64) < count % qps);
    let mut posted = vec![0u64; rig.qps.len()];
    for (i, qp) in rig.qps.iter().enumerate() {
        while posted[i] < share(i).min(2048) {
            qp.post_recv(&RecvWr::new(0, &sge))?;
            posted[i] += 1;
        }
    }
    send_line(control, "ready")?;
    let mut done = 0u64;
    let mut wc = [WorkCompletion::default(); 64];
    while done < count {
        let n = rig.wait(&mut wc)?;
        for w in &wc[..n] {
            done += 1;
            let i = rig
                .qps
                .iter()
                .position(|q| q.qp_num() == w.qp_num)
                .unwrap_or(0);
            if posted[i] < share(i) {
                rig.qps[i].post_recv(&RecvWr::new(0, &sge))?;
                posted[i] += 1;
            }
        }
    }
    Ok(())
}

/// Echoes `count` SENDs of `size` bytes on the first QP: receive, send back.
fn serve_echo(rig: &Rig, size: usize, count: u64, control: &mut TcpStream) -> Result<()> {
    let qp = &rig.qps[0];
    let sge = [recv_sge(rig, size.max(1))];
    let mut posted = 0;
    while posted < count.min(4) {
        qp.post_recv(&RecvWr::new(0, &sge))?;
        posted += 1;
    }
    // Pings before this would meet no receive WR: RNR NAKs, waits and
    // resends inside the measurement.
    send_line(control, "ready")?;
    let mut wc = [WorkCompletion::default(); 16];
    let mut data = vec![0u8; size];
    let (mut echoed, mut sent) = (0, 0);
    while echoed < count || sent < count {
        let n = rig.wait(&mut wc)?;
        for w in &wc[..n] {
            if w.opcode != rverbs::WcOpcode::Recv {
                sent += 1;
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
            if posted < count {
                qp.post_recv(&RecvWr::new(0, &sge))?;
                posted += 1;
            }
        }
    }
    Ok(())
}

// ---- client ---------------------------------------------------------------

struct Server {
    child: Option<Child>,
    control: TcpStream,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = send_line(&mut self.control, "quit");
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

fn start_server(args: &BenchArgs) -> Result<Server> {
    let (child, addr) = match &args.server {
        Some(addr) => (None, addr.clone()),
        None => {
            let exe = std::env::current_exe()?;
            let mut child = Command::new(exe)
                .args(["bench", "--serve", "127.0.0.1:0"])
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
    Ok(Server { child, control })
}

fn bar(args: &BenchArgs, len: u64, what: &str) -> ProgressBar {
    if args.quiet || args.json {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg:>22} [{bar:30}] {percent:>3}% {per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// Runs `count` operations of `size` bytes with `qd` outstanding per QP,
/// each refill posted WR by WR or, with `post_list`, as one list per QP;
/// returns the elapsed time.
fn bandwidth(
    rig: &Rig,
    op: Test,
    size: usize,
    count: u64,
    (qd, post_list): (u32, bool),
    pb: &ProgressBar,
) -> Result<Duration> {
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
    while done < count {
        while posted < count && posted - done < window {
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
    Ok(start.elapsed())
}

/// Half round trips of a SEND ping-pong, in µs, sorted.
fn pingpong(rig: &Rig, size: usize, iters: u32, pb: &ProgressBar) -> Result<Vec<f64>> {
    let qp = &rig.qps[0];
    let sge = [Sge {
        addr: rig.mr.iova(),
        length: size.max(1) as u32,
        lkey: rig.mr.lkey(),
    }];
    let payload = vec![0x5au8; size];
    let mut wc = [WorkCompletion::default(); 16];
    let mut samples = Vec::with_capacity(iters as usize);
    // Send completions seen (each ping is signaled).
    let mut sent = 0u64;
    // Two receive WRs posted ahead: the one each reply uses is replenished
    // while the next ping is on its way, off the critical path.
    // Exactly `iters` in all, so none is left over for the next test.
    for _ in 0..iters.min(2) {
        qp.post_recv(&RecvWr::new(0, &sge))?;
    }
    for i in 0..iters {
        let start = Instant::now();
        if size <= 64 {
            qp.post_send(&SendWr::inline(1, WrOpcode::Send, &payload).signaled())?;
        } else {
            qp.post_send(&SendWr::new(1, WrOpcode::Send, &sge).signaled())?;
        }
        if i > 0 && i + 1 < iters {
            qp.post_recv(&RecvWr::new(0, &sge))?;
        }
        let mut got_reply = false;
        while !got_reply {
            let n = rig.wait(&mut wc)?;
            got_reply = wc[..n].iter().any(|w| w.opcode == rverbs::WcOpcode::Recv);
            sent += count_sends(&wc[..n]);
        }
        samples.push(start.elapsed().as_secs_f64() * 1e6 / 2.0);
        pb.inc(1);
    }
    // A ping's own completion may come after its reply: wait for the last
    // ones here, or the next test would count them as its own.
    while sent < u64::from(iters) {
        let n = rig.wait(&mut wc)?;
        sent += count_sends(&wc[..n]);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples)
}

/// How many of `wc` complete SENDs.
fn count_sends(wc: &[WorkCompletion]) -> u64 {
    wc.iter()
        .filter(|w| w.opcode == rverbs::WcOpcode::Send)
        .count() as u64
}

/// The median (upper one of an even count), `None` for no values.
fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn tcp_stream(control: &mut TcpStream, size: usize, bytes: u64) -> Result<f64> {
    send_line(control, &format!("tcp {bytes}"))?;
    let port = line(control)?;
    let port = port
        .strip_prefix("port ")
        .ok_or_else(|| anyhow!("server said {port:?}"))?;
    let mut s = TcpStream::connect(format!("127.0.0.1:{port}"))?;
    s.set_nodelay(true)?;
    let buf = vec![0x5au8; size];
    let start = Instant::now();
    let mut left = bytes;
    while left > 0 {
        let n = (left as usize).min(size);
        s.write_all(&buf[..n])?;
        left -= n as u64;
    }
    expect(control, "ok")?;
    Ok(bytes as f64 / start.elapsed().as_secs_f64() / 1e9)
}

fn udp_pingpong(control: &mut TcpStream, size: usize, iters: u32, event: bool) -> Result<Vec<f64>> {
    send_line(control, &format!("udp {size} {iters}"))?;
    let port = line(control)?;
    let port = port
        .strip_prefix("port ")
        .ok_or_else(|| anyhow!("server said {port:?}"))?;
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    sock.connect(format!("127.0.0.1:{port}"))?;
    sock.set_nonblocking(!event)?;
    let payload = vec![0x5au8; size.max(1)];
    let mut buf = vec![0u8; size.max(1)];
    let mut samples = Vec::with_capacity(iters as usize);
    for _ in 0..iters {
        let start = Instant::now();
        sock.send(&payload)?;
        spin(|| sock.recv(&mut buf))?;
        samples.push(start.elapsed().as_secs_f64() * 1e6 / 2.0);
    }
    expect(control, "ok")?;
    samples.sort_by(f64::total_cmp);
    Ok(samples)
}

/// Busy-polls a non-blocking receive, as the RDMA side busy-polls its CQ:
/// the baseline gets the same treatment.
fn spin<T>(mut recv: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    loop {
        match recv() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            r => return r,
        }
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

    /// Seconds per `units`: (ours, the baseline's, ours / the baseline's).
    fn per(&self, units: f64, with_baseline: bool) -> (Option<f64>, Option<f64>, Option<f64>) {
        let ours = self.ours.as_secs_f64() / units;
        if !with_baseline {
            return (Some(ours), None, None);
        }
        let base = self.baseline.as_secs_f64() / units;
        (Some(ours), Some(base), (base > 0.0).then(|| ours / base))
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

/// `rverbs bench`.
pub fn bench(args: &BenchArgs, out: &mut impl Write) -> Result<Vec<Row>> {
    if let Some(listen) = &args.serve {
        serve(listen)?;
        return Ok(Vec::new());
    }
    if args.sizes.iter().any(|&s| s == 0 || s > 1 << 30) {
        bail!("sizes must be between 1 byte and 1 GiB");
    }
    if args.qps == 0 || args.qd == 0 {
        bail!("--qps and --qd must be at least 1");
    }
    let max = args
        .sizes
        .iter()
        .copied()
        .max()
        .unwrap_or(4096)
        .max(args.lat_size)
        .max(4096);
    let mut server = start_server(args)?;
    let mode = if args.event { " event" } else { "" };
    send_line(
        &mut server.control,
        &format!("setup {} {max}{mode}", args.qps),
    )?;
    let rig = rig(args.qps, max, args.event, &mut server.control)?;
    let mut rows = Vec::new();
    let rounds = args.rounds;
    for &test in &args.tests {
        if test == Test::Lat {
            let iters = (args.iters / rounds).max(1);
            let size = args.lat_size;
            let pb = bar(
                args,
                u64::from(iters * rounds),
                &format!("send ping-pong {size} B"),
            );
            let (mut ours, mut udp, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            let resent_before = resent(&mut server.control)?;
            let mut bill = CpuBill::default();
            for _ in 0..rounds {
                let round = bill.charge(&mut server.control, false, |control| {
                    send_line(control, &format!("echo {size} {iters}"))?;
                    expect(control, "ready")?;
                    let round = pingpong(&rig, size, iters, &pb)?;
                    expect(control, "ok")?;
                    Ok(round)
                })?;
                if !args.no_baseline {
                    let base = bill.charge(&mut server.control, true, |control| {
                        udp_pingpong(control, size, iters, args.event)
                    })?;
                    ratios.push(percentile(&round, 0.5) / percentile(&base, 0.5));
                    udp.extend(base);
                }
                ours.extend(round);
            }
            pb.finish_and_clear();
            // Per million messages: each round trip is a ping and a reply.
            let messages = 2.0 * f64::from(iters * rounds) / 1e6;
            let (cpu, baseline_cpu, cpu_ratio) = bill.per(messages, !args.no_baseline);
            ours.sort_by(f64::total_cmp);
            udp.sort_by(f64::total_cmp);
            let udp_name = if args.event {
                "udp blocking"
            } else {
                "udp ping-pong"
            };
            let baseline = (!args.no_baseline).then(|| udp_name.to_string());
            rows.push(Row {
                test: "send_lat".into(),
                size,
                gb_per_s: None,
                mmsg_per_s: None,
                median_us: Some(percentile(&ours, 0.5)),
                p99_us: Some(percentile(&ours, 0.99)),
                baseline_value: baseline.as_ref().map(|_| percentile(&udp, 0.5)),
                baseline,
                ratio: median(&mut ratios),
                cpu,
                baseline_cpu,
                cpu_ratio,
                retransmitted: resent(&mut server.control)? - resent_before,
            });
            continue;
        }
        for &size in &args.sizes {
            let count = (args.bytes / u64::from(rounds) / size as u64).max(64);
            let moved = count * size as u64;
            let name = match test {
                Test::Write => "rdma_write",
                Test::Read => "rdma_read",
                _ => "send",
            };
            let pb = bar(args, moved * u64::from(rounds), &format!("{name} {size} B"));
            let (mut gbps, mut rates, mut tcp, mut ratios) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let resent_before = resent(&mut server.control)?;
            let mut bill = CpuBill::default();
            for _ in 0..rounds {
                let elapsed = bill.charge(&mut server.control, false, |control| {
                    if test == Test::Send {
                        send_line(control, &format!("recv {size} {count}"))?;
                        expect(control, "ready")?;
                    } else {
                        send_line(control, "idle")?;
                    }
                    let elapsed =
                        bandwidth(&rig, test, size, count, (args.qd, args.post_list), &pb)?;
                    expect(control, "ok")?;
                    Ok(elapsed)
                })?;
                let ours = moved as f64 / elapsed.as_secs_f64() / 1e9;
                gbps.push(ours);
                rates.push(count as f64 / elapsed.as_secs_f64() / 1e6);
                if !args.no_baseline {
                    let base = bill.charge(&mut server.control, true, |control| {
                        tcp_stream(control, size, moved)
                    })?;
                    tcp.push(base);
                    ratios.push(ours / base);
                }
            }
            pb.finish_and_clear();
            let gb = (moved * u64::from(rounds)) as f64 / 1e9;
            let (cpu, baseline_cpu, cpu_ratio) = bill.per(gb, !args.no_baseline);
            let baseline = (!args.no_baseline).then(|| "tcp stream".to_string());
            rows.push(Row {
                test: name.into(),
                size,
                gb_per_s: median(&mut gbps),
                mmsg_per_s: median(&mut rates),
                median_us: None,
                p99_us: None,
                baseline,
                baseline_value: median(&mut tcp),
                ratio: median(&mut ratios),
                cpu,
                baseline_cpu,
                cpu_ratio,
                retransmitted: resent(&mut server.control)? - resent_before,
            });
        }
    }
    if std::env::var_os("RVERBS_BENCH_STATS").is_some() {
        if let Some(dev) = rverbs::devices()?.first() {
            eprintln!("client {:?}", dev.net_stats());
        }
    }
    drop(rig);
    drop(server);
    if args.json {
        serde_json::to_writer_pretty(&mut *out, &rows)?;
        writeln!(out)?;
    } else {
        print_table(&rows, out)?;
    }
    Ok(rows)
}

fn print_table(rows: &[Row], out: &mut impl Write) -> Result<()> {
    writeln!(
        out,
        "{:<11} {:>9} {:>10} {:>10} {:>11} {:>9}   {:<14} {:>10} {:>7} {:>6} {:>7}",
        "test",
        "size",
        "GB/s",
        "Mmsg/s",
        "median µs",
        "p99 µs",
        "baseline",
        "value",
        "ratio",
        "cpu",
        "resent"
    )?;
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |v| format!("{v:.prec$}"));
    for r in rows {
        let value = match (r.baseline_value, r.median_us.is_some()) {
            (Some(v), true) => format!("{v:.2} µs"),
            (Some(v), false) => format!("{v:.3} GB/s"),
            (None, _) => "-".into(),
        };
        writeln!(
            out,
            "{:<11} {:>9} {:>10} {:>10} {:>11} {:>9}   {:<14} {:>10} {:>7} {:>6} {:>7}",
            r.test,
            r.size,
            opt(r.gb_per_s, 3),
            opt(r.mmsg_per_s, 3),
            opt(r.median_us, 2),
            opt(r.p99_us, 2),
            r.baseline.as_deref().unwrap_or("-"),
            value,
            r.ratio.map_or("-".to_string(), |v| format!("{v:.2}x")),
            r.cpu_ratio.map_or("-".to_string(), |v| format!("{v:.2}x")),
            r.retransmitted,
        )?;
    }
    Ok(())
}
