//! RC SEND ping-pong between two processes, like `ibv_rc_pingpong`.
//!
//! ```text
//! cargo run --example rc_pingpong                      # server: waits on TCP port 18515
//! cargo run --example rc_pingpong -- 127.0.0.1         # client, in another terminal
//! ```
//!
//! Options: `--port P` (TCP port for the endpoint exchange; 0 lets the server pick
//! one, which it prints), `--iters N` (round trips, default 1000), `--size B`
//! (message bytes, default 64).
//!
//! The two sides exchange their QP's endpoint (GID, QP number, first PSN) over
//! TCP with `rverbs::cm::connect`, which also brings each QP to RTS. Then the
//! client sends a message, the server sends it back, N times; the client prints
//! the average round trip. Each process has its own rverbs device (127.0.0.1,
//! 127.0.0.2, … on one host; set `RVERBS_ADDR` for a real network).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use rverbs::cm::{self, ConnectOptions, Endpoint};
use rverbs::{
    AccessFlags, CompletionQueue, QpCaps, QueuePair, RecvWr, SendWr, Sge, WcStatus, WorkCompletion,
    WrOpcode,
};

/// wr_ids: which work request a completion is for.
const RECV: u64 = 1;
const SEND: u64 = 2;

struct Options {
    server: Option<String>,
    port: u16,
    iters: u64,
    size: usize,
}

fn parse_args() -> Result<Options, String> {
    let mut opts = Options {
        server: None,
        port: 18515,
        iters: 1000,
        size: 64,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--port" => {
                opts.port = value("--port")?
                    .parse()
                    .map_err(|e| format!("--port: {e}"))?
            }
            "--iters" => {
                opts.iters = value("--iters")?
                    .parse()
                    .map_err(|e| format!("--iters: {e}"))?
            }
            "--size" => {
                opts.size = value("--size")?
                    .parse()
                    .map_err(|e| format!("--size: {e}"))?
            }
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            s => opts.server = Some(s.to_string()),
        }
    }
    if opts.size < 8 {
        return Err("--size must be at least 8 (the message carries its number)".into());
    }
    Ok(opts)
}

/// Waits for completions by wr_id on a CQ whose completions may come in
/// another order than they are waited for (the peer's next message may
/// arrive before the ACK of this side's last send).
struct Completions<'a> {
    cq: &'a CompletionQueue,
    early: Vec<WorkCompletion>,
}

impl Completions<'_> {
    /// The completion of work request `wr_id`, which must succeed.
    fn wait(&mut self, wr_id: u64) -> rverbs::Result<WorkCompletion> {
        let done = match self.early.iter().position(|wc| wc.wr_id == wr_id) {
            Some(i) => self.early.remove(i),
            None => {
                let mut wc = [WorkCompletion::default(); 1];
                loop {
                    // Polling an empty CQ is cheap and drives the device's
                    // progress.
                    if self.cq.poll(&mut wc)? == 0 {
                        continue;
                    }
                    if wc[0].wr_id == wr_id {
                        break wc[0];
                    }
                    self.early.push(wc[0]);
                }
            }
        };
        assert_eq!(
            done.status,
            WcStatus::Success,
            "work request failed: {done:?}"
        );
        Ok(done)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let opts = parse_args().map_err(|e| {
        format!("{e}\nusage: rc_pingpong [--port P] [--iters N] [--size B] [SERVER]")
    })?;

    // The TCP connection that carries the endpoints: the server accepts one
    // client, the client connects to the server.
    let mut stream = match &opts.server {
        None => {
            let listener = TcpListener::bind(("0.0.0.0", opts.port))?;
            println!("listening on {}", listener.local_addr()?);
            std::io::stdout().flush()?;
            listener.accept()?.0
        }
        Some(host) => TcpStream::connect((host.as_str(), opts.port))?,
    };
    stream.set_nodelay(true)?;

    // The verbs objects: a context on this process's device, a PD, one CQ
    // for sends and receives, an RC QP and a buffer for one message each way.
    let device = rverbs::devices()?
        .into_iter()
        .next()
        .ok_or("no rverbs device")?;
    let ctx = device.open()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16)?;
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp: QueuePair = pd.qp_builder(&cq, &cq).caps(caps).build()?;
    // Bytes [0, size) are sent from, [size, 2 size) received into.
    let mr = pd.alloc_mr(2 * opts.size, AccessFlags::LOCAL_WRITE)?;
    let send_sge = Sge {
        addr: mr.iova(),
        length: opts.size as u32,
        lkey: mr.lkey(),
    };
    let recv_sge = Sge {
        addr: mr.iova() + opts.size as u64,
        ..send_sge
    };

    // Exchange endpoints and bring the QP to RTS, connected to the peer's.
    let me = Endpoint::for_qp(&qp);
    let peer = cm::connect(&qp, &mut stream, &me, &ConnectOptions::default())?;
    println!("local  QP {:#08x} at {}", me.qpn, me.gid);
    println!("remote QP {:#08x} at {}", peer.qpn, peer.gid);

    // Both sides post their first receive, then meet once more on TCP, so
    // no message arrives before a receive waits for it.
    qp.post_recv(&RecvWr::new(RECV, &[recv_sge]))?;
    stream.write_all(b"G")?;
    stream.read_exact(&mut [0u8; 1])?;

    let mut completions = Completions {
        cq: &cq,
        early: Vec::new(),
    };
    let mut message = vec![0u8; opts.size];
    let start = Instant::now();
    for i in 0..opts.iters {
        if opts.server.is_some() {
            // Client: send message i, wait for it to come back.
            message[..8].copy_from_slice(&i.to_le_bytes());
            mr.write_at(0, &message)?;
            qp.post_send(&SendWr::new(SEND, WrOpcode::Send, &[send_sge]).signaled())?;
            completions.wait(SEND)?;
            let got = completions.wait(RECV)?;
            assert_eq!(got.byte_len as usize, opts.size);
        } else {
            // Server: wait for message i, send it back.
            let got = completions.wait(RECV)?;
            assert_eq!(got.byte_len as usize, opts.size);
        }
        // The received message carries its number; check it, post the next
        // receive before answering (the peer may send as soon as it has the
        // answer), and, on the server, echo it.
        mr.read_at(opts.size, &mut message)?;
        let number = u64::from_le_bytes(message[..8].try_into().expect("8 bytes"));
        assert_eq!(number, i, "message {i} came back as {number}");
        qp.post_recv(&RecvWr::new(RECV, &[recv_sge]))?;
        if opts.server.is_none() {
            mr.write_at(0, &message)?;
            qp.post_send(&SendWr::new(SEND, WrOpcode::Send, &[send_sge]).signaled())?;
            completions.wait(SEND)?;
        }
    }
    let elapsed = start.elapsed();

    if opts.server.is_some() {
        let rtt = elapsed.as_secs_f64() * 1e6 / opts.iters.max(1) as f64;
        println!(
            "{} round trips of {} bytes in {:.3} s: average round trip {rtt:.2} µs",
            opts.iters,
            opts.size,
            elapsed.as_secs_f64()
        );
    } else {
        println!("echoed {} messages of {} bytes", opts.iters, opts.size);
    }
    // A last byte each way: neither side tears its QP down while the peer
    // may still need an ACK from it.
    stream.write_all(b"E")?;
    stream.read_exact(&mut [0u8; 1])?;
    Ok(())
}
