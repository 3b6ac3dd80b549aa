//! `rverbs pingpong`: the software device's ibv_rc_pingpong,
//! ibv_uc_pingpong, ibv_ud_pingpong and ibv_srq_pingpong in one command.
//!
//! This module owns the command's options, the TCP exchange between server
//! and client, bringing the QPs up, the ping-pong loop and its report. A
//! server (no host argument) and a client (the server's host) exchange
//! what each needs over one TCP connection, connect one or more QPs of the
//! chosen transport pairwise, then bounce SENDs of `--size` bytes back and
//! forth `--iters` times and print what ibv_rc_pingpong prints: bytes and
//! Mbit/s, iterations and µs per iteration (or JSON with `--json`).
//!
//! The TCP conversation, in order:
//! 1. each side writes one parameter line, `rverbs-pingpong1 TRANSPORT SRQ
//!    NUM_QP SIZE ITERS`; the two must match (ibv_*_pingpong just hang
//!    when they do not);
//! 2. for each QP in turn: RC and UC use [`cm::connect`] (endpoint lines,
//!    then one ready byte each way); UD writes `rverbs-ud1 GID QPN PSN
//!    QKEY` each way, brings the QP to RTS and sends the same ready byte;
//! 3. after the loop, each side writes `done` and waits for the peer's, so
//!    neither tears its device down while the other still waits for an
//!    acknowledgement or a completion.
//!
//! As in the C tools, the QPs go to INIT and get `--rx-depth` receive WRs
//! (on their own receive queues, or on the SRQ) before the exchange, so no
//! SEND — UC and UD ones are dropped without a receive WR — can come too
//! early; [`QueuePair::connect`] then takes them INIT → INIT → RTR → RTS.
//! The loop keeps ibv_rc_pingpong's pipelining: a side sends again once
//! both its last SEND completed and the peer's next message arrived, and
//! replenishes receive WRs in bulk when only one is left per QP (with an
//! SRQ: when one per QP is left in it). With several QPs, `--iters` counts
//! round trips over all of them, as ibv_srq_pingpong does; each QP does its
//! share.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use clap::{Args, ValueEnum};
use rverbs::cm::{self, ConnectOptions, Endpoint};
use rverbs::{
    AccessFlags, AddressHandle, AhAttr, CompletionChannel, CompletionQueue, Gid, MemoryRegion,
    ProtectionDomain, QpAttr, QpAttrMask, QpCaps, QpState, QpType, QueuePair, RecvWr, SendWr, Sge,
    SharedReceiveQueue, SrqAttr, WcStatus, WorkCompletion, WrOpcode,
};
use serde::Serialize;

/// The transport the QPs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// Reliable Connected (ibv_rc_pingpong).
    Rc,
    /// Unreliable Connected (ibv_uc_pingpong).
    Uc,
    /// Unreliable Datagram (ibv_ud_pingpong).
    Ud,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Rc => "rc",
            Transport::Uc => "uc",
            Transport::Ud => "ud",
        }
    }

    fn qp_type(self) -> QpType {
        match self {
            Transport::Rc => QpType::Rc,
            Transport::Uc => QpType::Uc,
            Transport::Ud => QpType::Ud,
        }
    }
}

/// Options of `rverbs pingpong`; both sides take the same ones.
#[derive(Args, Debug)]
pub struct PingpongArgs {
    /// The server's host name or address: run as the client. Without it,
    /// run as the server and wait for one client.
    pub host: Option<String>,
    /// Transport of the QPs.
    #[arg(long, value_enum, default_value_t = Transport::Rc)]
    pub transport: Transport,
    /// Take receive WRs from one shared receive queue (ibv_srq_pingpong).
    #[arg(long)]
    pub srq: bool,
    /// QPs per side [default: 1, 16 with --srq].
    #[arg(short = 'q', long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub num_qp: Option<u32>,
    /// Message size in bytes (UD: at most the port MTU).
    #[arg(short, long, default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..=1 << 30))]
    pub size: u32,
    /// Round trips (over all QPs).
    #[arg(short = 'n', long, default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub iters: u32,
    /// Receive WRs kept posted (per QP; with --srq, in the SRQ).
    #[arg(short, long, default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub rx_depth: u32,
    /// TCP port of the exchange.
    #[arg(short, long, default_value_t = 18515)]
    pub port: u16,
    /// Sleep on a completion channel instead of busy-polling the CQ.
    #[arg(short, long)]
    pub events: bool,
    /// RDMA device [default: the first one].
    #[arg(short = 'd', long, value_name = "DEV")]
    pub ib_dev: Option<String>,
    /// Local GID index (rverbs devices have one GID: 0).
    #[arg(short, long, default_value_t = 0)]
    pub gid_idx: u32,
    /// Print the result as JSON instead of ibv_rc_pingpong's two lines.
    #[arg(long)]
    pub json: bool,
}

impl PingpongArgs {
    /// QPs per side: `--num-qp`, else 1, or 16 with `--srq`.
    pub fn qps(&self) -> u32 {
        self.num_qp.unwrap_or(if self.srq { 16 } else { 1 })
    }
}

/// What a run measured, as `--json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The transport.
    pub transport: Transport,
    /// Message size in bytes.
    pub size: u32,
    /// Round trips.
    pub iters: u32,
    /// Wall time of the ping-pong loop.
    pub seconds: f64,
    /// Bits moved both ways (2 × size × iters × 8) per µs.
    pub mbit_per_sec: f64,
    /// Microseconds per round trip.
    pub usec_per_iter: f64,
}

/// `wr_id` of every send WR.
const SEND_WRID: u64 = 1;
/// `wr_id` of every receive WR.
const RECV_WRID: u64 = 2;
/// The GRH in front of every UD receive.
const GRH_LEN: u32 = 40;
/// The Q_Key of the UD QPs (ibv_ud_pingpong's).
const UD_QKEY: u32 = 0x1111_1111;
/// Messages up to this size go inline (copied at post time), as
/// ibv_rc_pingpong does up to the QP's `max_inline_data`.
const MAX_INLINE: u32 = 64;
/// How long the exchange waits for the peer to say something.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// The ping-pong gives up after this long without a completion: a lost
/// UC/UD message (they are not retransmitted) or a stuck peer.
const STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the ping-pong waits for a completion before it looks whether
/// the peer closed the TCP connection (it failed or was killed).
const PEER_CHECK: Duration = Duration::from_millis(500);

/// Runs one side of `rverbs pingpong` — the server without `args.host`,
/// else the client — printing its result to `out`, and returns it.
pub fn pingpong(args: &PingpongArgs, out: &mut impl Write) -> Result<Summary> {
    let qps = args.qps();
    if args.gid_idx != 0 {
        bail!(
            "--gid-idx {}: rverbs devices have one GID, index 0",
            args.gid_idx
        );
    }
    if args.srq && args.rx_depth < qps {
        bail!(
            "--rx-depth {} is too small for {qps} QPs: \
             the SRQ needs at least one receive WR per QP",
            args.rx_depth
        );
    }
    let mut rig = Rig::new(args, qps)?;
    let locals = rig.local_endpoints();
    if !args.json {
        for ep in &locals {
            print_address(out, "local address: ", ep.qpn, ep.psn, ep.gid)?;
        }
        out.flush()?;
    }

    let mut stream = match &args.host {
        Some(host) => TcpStream::connect((host.as_str(), args.port))
            .with_context(|| format!("cannot connect to {host}:{}", args.port))?,
        None => {
            let listener = TcpListener::bind(("0.0.0.0", args.port))
                .with_context(|| format!("cannot listen on TCP port {}", args.port))?;
            listener
                .accept()
                .with_context(|| format!("accepting a client on TCP port {}", args.port))?
                .0
        }
    };
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(EXCHANGE_TIMEOUT))?;
    check_parameters(&mut stream, args, qps)?;
    let peers = rig.connect(&mut stream, &locals)?;
    if !args.json {
        for p in &peers {
            print_address(out, "remote address:", p.qpn, p.psn, p.gid)?;
        }
        out.flush()?;
    }

    let elapsed = rig.run(args.host.is_some(), args.iters, &stream)?;

    // Both sides finished: only now may either tear its device down.
    stream.write_all(b"done\n")?;
    let said = read_line(&mut stream).context("waiting for the peer to finish")?;
    ensure!(said == "done", "the peer said {said:?} instead of done");

    let usec = elapsed.as_secs_f64() * 1e6;
    let bytes = 2 * u64::from(args.size) * u64::from(args.iters);
    let summary = Summary {
        transport: args.transport,
        size: args.size,
        iters: args.iters,
        seconds: usec / 1e6,
        mbit_per_sec: bytes as f64 * 8.0 / usec,
        usec_per_iter: usec / f64::from(args.iters),
    };
    if args.json {
        serde_json::to_writer_pretty(&mut *out, &summary)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
            summary.seconds, summary.mbit_per_sec
        )?;
        writeln!(
            out,
            "{} iters in {:.2} seconds = {:.2} usec/iter",
            args.iters, summary.seconds, summary.usec_per_iter
        )?;
    }
    Ok(summary)
}

/// One address line as ibv_rc_pingpong prints it (LID 0 on RoCE).
fn print_address(out: &mut impl Write, what: &str, qpn: u32, psn: u32, gid: Gid) -> Result<()> {
    writeln!(
        out,
        "  {what} LID 0x0000, QPN 0x{qpn:06x}, PSN 0x{psn:06x}, GID {gid}"
    )?;
    Ok(())
}

/// Reads one line (at most 256 bytes) byte by byte, never past it.
fn read_line(stream: &mut TcpStream) -> Result<String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < 256 {
        match stream.read(&mut b) {
            Ok(0) => bail!("the peer closed the connection"),
            Ok(_) if b[0] == b'\n' => return Ok(String::from_utf8_lossy(&line).into_owned()),
            Ok(_) => line.push(b[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                bail!("the peer said nothing for {} s", EXCHANGE_TIMEOUT.as_secs())
            }
            Err(e) => return Err(e.into()),
        }
    }
    bail!("the peer sent a line longer than 256 bytes")
}

/// Exchanges the options both sides must agree on and fails, naming the
/// first that differs, when they do not.
fn check_parameters(stream: &mut TcpStream, args: &PingpongArgs, qps: u32) -> Result<()> {
    let ours = [
        ("--transport", args.transport.name().to_string()),
        ("--srq", u8::from(args.srq).to_string()),
        ("--num-qp", qps.to_string()),
        ("--size", args.size.to_string()),
        ("--iters", args.iters.to_string()),
    ];
    let line: Vec<&str> = ours.iter().map(|(_, v)| v.as_str()).collect();
    stream.write_all(format!("rverbs-pingpong1 {}\n", line.join(" ")).as_bytes())?;
    let said = read_line(stream).context("exchanging parameters with the peer")?;
    let theirs: Vec<&str> = said.split_whitespace().collect();
    if theirs.len() != ours.len() + 1 || theirs[0] != "rverbs-pingpong1" {
        bail!("the peer is not an rverbs pingpong of this version: it said {said:?}");
    }
    for ((option, mine), peer) in ours.iter().zip(&theirs[1..]) {
        if mine != peer {
            let show = |v: &str| match *option {
                "--srq" if v == "1" => "--srq".to_string(),
                "--srq" => "no --srq".to_string(),
                _ => format!("{option} {v}"),
            };
            bail!(
                "the peer runs with {}, this side with {}: both sides need the same \
                 --transport, --srq, --num-qp, --size and --iters",
                show(peer),
                show(mine)
            );
        }
    }
    Ok(())
}

/// A peer QP, as the exchange told it.
#[derive(Debug, Clone, Copy)]
struct Peer {
    gid: Gid,
    qpn: u32,
    psn: u32,
}

/// Where a UD QP's sends go.
struct UdDest {
    ah: AddressHandle,
    qpn: u32,
    qkey: u32,
}

/// Per-QP progress of the ping-pong.
#[derive(Debug, Clone, Copy, Default)]
struct Flow {
    /// Round trips this QP does.
    quota: u32,
    /// Sends completed.
    sent: u32,
    /// Receives completed.
    received: u32,
    /// `SEND_WRID | RECV_WRID` bits of what this QP still waits for.
    pending: u64,
    /// Receive WRs posted on the QP's own receive queue and not yet used.
    posted: u32,
}

/// The RDMA side: a CQ (on a channel with `--events`), a PD, one MR every
/// message is sent from and received into, maybe an SRQ, the QPs (which
/// keep their context alive).
struct Rig {
    channel: Option<CompletionChannel>,
    cq: CompletionQueue,
    pd: ProtectionDomain,
    mr: MemoryRegion,
    srq: Option<SharedReceiveQueue>,
    qps: Vec<QueuePair>,
    transport: Transport,
    size: u32,
    rx_depth: u32,
    /// The payload of inline sends (`size` ≤ [`MAX_INLINE`]).
    inline: Option<Vec<u8>>,
    /// UD destinations, one per QP once connected.
    ud: Vec<UdDest>,
    /// Receive WRs in the SRQ and not yet used.
    srq_posted: u32,
}

impl Rig {
    /// Opens the device, creates everything, brings the QPs to INIT and
    /// posts the receive WRs.
    fn new(args: &PingpongArgs, qps: u32) -> Result<Rig> {
        let device = match &args.ib_dev {
            Some(name) => rverbs::device_by_name(name)?,
            None => rverbs::devices()
                .context("cannot list RDMA devices")?
                .into_iter()
                .next()
                .ok_or_else(|| anyhow!("no RDMA devices found"))?,
        };
        let ctx = device
            .open()
            .with_context(|| format!("cannot open {}", device.name()))?;
        if args.transport == Transport::Ud {
            let mtu = ctx.query_port(1)?.active_mtu.bytes();
            if args.size > mtu {
                bail!(
                    "--size {} exceeds the MTU of {} port 1 ({mtu} bytes): \
                     a UD message is one packet",
                    args.size,
                    device.name()
                );
            }
        }
        let channel = args.events.then(|| ctx.create_comp_channel()).transpose()?;
        // At most one receive and one send completion per QP wait in the
        // CQ (a QP's next message needs both polled); ibv_rc_pingpong makes
        // room for rx_depth + 1, ibv_srq_pingpong for rx_depth + num_qp.
        let cqe = args.rx_depth.max(qps) + qps;
        let cq = match &channel {
            Some(ch) => ctx.cq_builder().cqe(cqe).channel(ch).build()?,
            None => ctx.create_cq(cqe)?,
        };
        if channel.is_some() {
            cq.req_notify(false)?;
        }
        let pd = ctx.alloc_pd()?;
        let mr = pd.alloc_mr(
            (args.size + grh_len(args.transport)) as usize,
            AccessFlags::LOCAL_WRITE,
        )?;
        let srq = args
            .srq
            .then(|| {
                pd.create_srq(SrqAttr {
                    max_wr: args.rx_depth,
                    max_sge: 1,
                    srq_limit: 0,
                })
            })
            .transpose()?;
        let mut list = Vec::with_capacity(qps as usize);
        for _ in 0..qps {
            let mut builder = pd
                .qp_builder(&cq, &cq)
                .qp_type(args.transport.qp_type())
                .caps(QpCaps {
                    max_send_wr: 1,
                    max_recv_wr: args.rx_depth,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: MAX_INLINE,
                });
            if let Some(srq) = &srq {
                builder = builder.srq(srq);
            }
            let qp = builder.build()?;
            to_init(&qp, args.transport)?;
            list.push(qp);
        }
        let mut rig = Rig {
            channel,
            cq,
            pd,
            mr,
            srq,
            qps: list,
            transport: args.transport,
            size: args.size,
            rx_depth: args.rx_depth,
            inline: (args.size <= MAX_INLINE).then(|| vec![0; args.size as usize]),
            ud: Vec::new(),
            srq_posted: 0,
        };
        match &rig.srq {
            Some(_) => rig.srq_posted = rig.post_recvs(None, args.rx_depth)?,
            None => {
                for i in 0..rig.qps.len() {
                    rig.post_recvs(Some(i), args.rx_depth)?;
                }
            }
        }
        Ok(rig)
    }

    /// Each QP's endpoint, with a random first PSN.
    fn local_endpoints(&self) -> Vec<Endpoint> {
        self.qps.iter().map(Endpoint::for_qp).collect()
    }

    /// Posts `n` receive WRs for the whole message (and the GRH on UD) on
    /// QP `qp`'s receive queue, or on the SRQ for `None`; returns `n`.
    fn post_recvs(&self, qp: Option<usize>, n: u32) -> Result<u32> {
        let sge = [Sge {
            addr: self.mr.iova(),
            length: self.mr.len() as u32,
            lkey: self.mr.lkey(),
        }];
        let wrs = vec![RecvWr::new(RECV_WRID, &sge); n as usize];
        match (qp, &self.srq) {
            (Some(i), _) => self.qps[i]
                .post_recv_list(&wrs)
                .with_context(|| format!("cannot post {n} receive WRs")),
            (None, Some(srq)) => srq
                .post_recv_list(&wrs)
                .with_context(|| format!("cannot post {n} receive WRs on the SRQ")),
            (None, None) => unreachable!("receive WRs go to a QP or the SRQ"),
        }?;
        Ok(n)
    }

    /// Connects QP i to the peer's QP i for every i, in order, and
    /// returns the peers.
    fn connect(&mut self, stream: &mut TcpStream, locals: &[Endpoint]) -> Result<Vec<Peer>> {
        let opts = ConnectOptions {
            access: AccessFlags::empty(),
            ..ConnectOptions::default()
        };
        let mut peers = Vec::with_capacity(self.qps.len());
        for (qp, local) in self.qps.iter().zip(locals) {
            let peer = match self.transport {
                Transport::Rc | Transport::Uc => {
                    let remote = cm::connect(qp, &mut *stream, local, &opts)
                        .with_context(|| format!("connecting QP {:#08x}", qp.qp_num()))?;
                    Peer {
                        gid: remote.gid,
                        qpn: remote.qpn,
                        psn: remote.psn,
                    }
                }
                Transport::Ud => {
                    let (peer, qkey) = connect_ud(qp, stream, local)
                        .with_context(|| format!("connecting UD QP {:#08x}", qp.qp_num()))?;
                    let ah = self.pd.create_ah(&AhAttr {
                        dgid: peer.gid,
                        ..AhAttr::default()
                    })?;
                    self.ud.push(UdDest {
                        ah,
                        qpn: peer.qpn,
                        qkey,
                    });
                    peer
                }
            };
            peers.push(peer);
        }
        Ok(peers)
    }

    /// Posts one signaled SEND of the message on QP `i`.
    fn post_send(&self, i: usize) -> Result<()> {
        let sge = [Sge {
            addr: self.mr.iova() + u64::from(grh_len(self.transport)),
            length: self.size,
            lkey: self.mr.lkey(),
        }];
        let mut wr = match &self.inline {
            Some(data) => SendWr::inline(SEND_WRID, WrOpcode::Send, data),
            None => SendWr::new(SEND_WRID, WrOpcode::Send, &sge),
        }
        .signaled();
        if let Some(d) = self.ud.get(i) {
            wr = wr.to(&d.ah, d.qpn, d.qkey);
        }
        self.qps[i]
            .post_send(&wr)
            .with_context(|| format!("cannot post a send on QP {:#08x}", self.qps[i].qp_num()))
    }

    /// Waits at most `limit` for completions: sleeps on the channel with
    /// `--events`, else busy-polls. Returns how many landed in `wc`.
    fn wait(&self, wc: &mut [WorkCompletion], limit: Duration) -> Result<usize> {
        if let Some(channel) = &self.channel {
            let n = self.cq.poll(wc)?;
            if n > 0 {
                return Ok(n);
            }
            return match channel.get_cq_event_timeout(limit)? {
                // Dropping the event acknowledges it; re-arm before polling,
                // so nothing that arrives meanwhile goes unnoticed.
                Some(event) => {
                    drop(event);
                    self.cq.req_notify(false)?;
                    Ok(self.cq.poll(wc)?)
                }
                None => Ok(0),
            };
        }
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let n = self.cq.poll(wc)?;
            if n > 0 {
                return Ok(n);
            }
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 && start.elapsed() > limit {
                return Ok(0);
            }
            std::hint::spin_loop();
        }
    }

    /// The ping-pong; returns the time it took. The client sends first.
    /// `control` is the TCP connection, watched while no completion comes.
    fn run(&self, client: bool, iters: u32, control: &TcpStream) -> Result<Duration> {
        let qps = self.qps.len() as u32;
        let mut flows: Vec<Flow> = (0..qps)
            .map(|i| Flow {
                // `iters` spread over the QPs, the first ones taking the rest.
                quota: iters / qps + u32::from(i < iters % qps),
                posted: if self.srq.is_some() { 0 } else { self.rx_depth },
                ..Flow::default()
            })
            .collect();
        let index: HashMap<u32, usize> = self
            .qps
            .iter()
            .enumerate()
            .map(|(i, qp)| (qp.qp_num(), i))
            .collect();
        let expected_len = self.mr.len() as u32;
        let mut srq_posted = self.srq_posted;
        let (mut sent, mut received) = (0u32, 0u32);
        let mut wc = vec![WorkCompletion::default(); 2 * self.qps.len()];

        let start = Instant::now();
        for (i, flow) in flows.iter_mut().enumerate() {
            flow.pending = RECV_WRID;
            if client && flow.quota > 0 {
                self.post_send(i)?;
                flow.pending |= SEND_WRID;
            }
        }
        let mut idle_since = Instant::now();
        while sent < iters || received < iters {
            let n = self.wait(&mut wc, PEER_CHECK)?;
            if n == 0 {
                if peer_gone(control)? {
                    bail!(
                        "the peer closed the connection after {received} of {iters} messages \
                         received and {sent} sent (it failed or was stopped)"
                    );
                }
                if idle_since.elapsed() >= STALL_TIMEOUT {
                    bail!(
                        "no completion for {} s after {received} of {iters} messages received \
                         and {sent} sent{}",
                        STALL_TIMEOUT.as_secs(),
                        match self.transport {
                            Transport::Rc => ": the peer stopped answering",
                            _ =>
                                ": a message was lost (UC and UD do not retransmit) \
                                 or the peer stopped",
                        }
                    );
                }
                continue;
            }
            idle_since = Instant::now();
            for w in &wc[..n] {
                let &i = index
                    .get(&w.qp_num)
                    .ok_or_else(|| anyhow!("a completion for unknown QP {:#08x}", w.qp_num))?;
                let what = match w.wr_id {
                    SEND_WRID => "send",
                    RECV_WRID => "receive",
                    other => bail!("a completion with unknown wr_id {other}"),
                };
                if w.status != WcStatus::Success {
                    bail!(
                        "QP {:#08x}: {what} failed: {} ({})",
                        w.qp_num,
                        w.status.as_str(),
                        w.status as u32
                    );
                }
                let flow = &mut flows[i];
                if w.wr_id == SEND_WRID {
                    flow.sent += 1;
                    sent += 1;
                } else {
                    if w.byte_len != expected_len {
                        bail!(
                            "QP {:#08x}: received {} bytes, expected {expected_len}",
                            w.qp_num,
                            w.byte_len
                        );
                    }
                    flow.received += 1;
                    received += 1;
                    if self.srq.is_some() {
                        srq_posted -= 1;
                        if srq_posted <= qps {
                            srq_posted += self.post_recvs(None, self.rx_depth - srq_posted)?;
                        }
                    } else {
                        flow.posted -= 1;
                        if flow.posted <= 1 {
                            flow.posted += self.post_recvs(Some(i), self.rx_depth - flow.posted)?;
                        }
                    }
                }
                flow.pending &= !w.wr_id;
                if flow.sent < flow.quota && flow.pending == 0 {
                    self.post_send(i)?;
                    flow.pending = SEND_WRID | RECV_WRID;
                }
            }
        }
        let elapsed = start.elapsed();
        if let Some(f) = flows
            .iter()
            .find(|f| f.sent != f.quota || f.received != f.quota)
        {
            bail!(
                "a QP sent {} and received {} messages instead of {}",
                f.sent,
                f.received,
                f.quota
            );
        }
        Ok(elapsed)
    }
}

/// Bytes of GRH in front of every received message.
fn grh_len(transport: Transport) -> u32 {
    match transport {
        Transport::Ud => GRH_LEN,
        _ => 0,
    }
}

/// Whether the peer closed the TCP connection, without reading from it.
fn peer_gone(stream: &TcpStream) -> Result<bool> {
    stream.set_nonblocking(true)?;
    let gone = match stream.peek(&mut [0u8; 1]) {
        Ok(n) => n == 0,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
        ),
    };
    stream.set_nonblocking(false)?;
    Ok(gone)
}

/// RESET → INIT: P_Key index 0, port 1, and no remote access (RC, UC) or
/// the Q_Key (UD).
fn to_init(qp: &QueuePair, transport: Transport) -> Result<()> {
    let attr = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qkey: UD_QKEY,
        qp_access_flags: AccessFlags::empty(),
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE
        | QpAttrMask::PKEY_INDEX
        | QpAttrMask::PORT
        | match transport {
            Transport::Ud => QpAttrMask::QKEY,
            _ => QpAttrMask::ACCESS_FLAGS,
        };
    qp.modify(&attr, mask)
        .with_context(|| format!("cannot move QP {:#08x} to INIT", qp.qp_num()))
}

/// The UD exchange for one QP: writes `rverbs-ud1 GID QPN PSN QKEY`, reads
/// the peer's, brings the QP (in INIT) to RTS, then one ready byte each
/// way as [`cm::connect`] does. Returns the peer and its Q_Key.
fn connect_ud(qp: &QueuePair, stream: &mut TcpStream, local: &Endpoint) -> Result<(Peer, u32)> {
    stream.write_all(
        format!(
            "rverbs-ud1 {} {:06x} {:06x} {UD_QKEY:08x}\n",
            local.gid, local.qpn, local.psn
        )
        .as_bytes(),
    )?;
    let said = read_line(stream)?;
    let f: Vec<&str> = said.split_whitespace().collect();
    let bad = || anyhow!("the peer sent {said:?}, not a UD endpoint");
    if f.len() != 5 || f[0] != "rverbs-ud1" {
        return Err(bad());
    }
    let hex = |s: &str| u32::from_str_radix(s, 16).map_err(|_| bad());
    let gid: std::net::Ipv6Addr = f[1].parse().map_err(|_| bad())?;
    let peer = Peer {
        gid: Gid(gid.octets()),
        qpn: hex(f[2])?,
        psn: hex(f[3])?,
    };
    let qkey = hex(f[4])?;
    let mut attr = QpAttr {
        qp_state: QpState::Rtr,
        ..QpAttr::default()
    };
    qp.modify(&attr, QpAttrMask::STATE)?;
    attr.qp_state = QpState::Rts;
    attr.sq_psn = local.psn;
    qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::SQ_PSN)?;
    stream.write_all(b"R")?;
    let mut ready = [0u8; 1];
    stream
        .read_exact(&mut ready)
        .context("waiting for the peer's QP to get ready")?;
    ensure!(ready == *b"R", "the peer did not get ready");
    Ok((peer, qkey))
}
