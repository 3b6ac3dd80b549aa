//! RDMA WRITE bandwidth between two processes, like perftest's `ib_write_bw`.
//!
//! ```text
//! cargo run --release --example write_bw                  # server: waits on TCP port 18516
//! cargo run --release --example write_bw -- 127.0.0.1     # client, in another terminal
//! ```
//!
//! Options: `--port P` (TCP port for the endpoint exchange; 0 lets the server pick
//! one, which it prints), `--size B` (bytes per WRITE, default 65536), `--iters N`
//! (WRITEs, default 5000), `--depth D` (WRITEs in flight, default 32).
//!
//! The server offers a buffer (its rkey and address travel in its endpoint);
//! the client writes into it, keeping `depth` WRITEs in flight, and prints the
//! bandwidth in GB/s. A last RDMA WRITE with immediate data tells the server
//! that all data has landed (it consumes a receive there, after every earlier
//! WRITE, as RC delivers in order); the server then checks the data's pattern.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use rverbs::cm::{self, ConnectOptions, Endpoint};
use rverbs::{
    AccessFlags, QpCaps, RecvWr, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

/// The immediate value of the last WRITE: "all data is there".
const DONE: u32 = 0xd0e;

struct Options {
    server: Option<String>,
    port: u16,
    size: usize,
    iters: u64,
    depth: u32,
}

fn parse_args() -> Result<Options, String> {
    let mut opts = Options {
        server: None,
        port: 18516,
        size: 65536,
        iters: 5000,
        depth: 32,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        let bad = |name: &str, e: std::num::ParseIntError| format!("{name}: {e}");
        match arg.as_str() {
            "--port" => opts.port = value("--port")?.parse().map_err(|e| bad("--port", e))?,
            "--size" => opts.size = value("--size")?.parse().map_err(|e| bad("--size", e))?,
            "--iters" => opts.iters = value("--iters")?.parse().map_err(|e| bad("--iters", e))?,
            "--depth" => opts.depth = value("--depth")?.parse().map_err(|e| bad("--depth", e))?,
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            s => opts.server = Some(s.to_string()),
        }
    }
    if opts.size == 0 || opts.depth == 0 {
        return Err("--size and --depth must be at least 1".into());
    }
    Ok(opts)
}

/// The byte at `offset` of the pattern the client writes.
fn pattern(offset: usize) -> u8 {
    (offset % 251) as u8
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let opts = parse_args().map_err(|e| {
        format!("{e}\nusage: write_bw [--port P] [--size B] [--iters N] [--depth D] [SERVER]")
    })?;
    let client = opts.server.is_some();

    let mut stream = match &opts.server {
        None => {
            let listener = TcpListener::bind(("0.0.0.0", opts.port))?;
            println!("listening on {}", listener.local_addr()?);
            std::io::stdout().flush()?;
            listener.accept()?.0
        }
        Some(host) => TcpStream::connect((host.as_str(), opts.port))?,
    };

    let device = rverbs::devices()?
        .into_iter()
        .next()
        .ok_or("no rverbs device")?;
    let ctx = device.open()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(opts.depth + 1)?;
    let caps = QpCaps {
        max_send_wr: opts.depth + 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd.qp_builder(&cq, &cq).caps(caps).build()?;
    // The server's buffer takes remote WRITEs; the client's is the source.
    let access = if client {
        AccessFlags::LOCAL_WRITE
    } else {
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
    };
    let mr = pd.alloc_mr(opts.size, access)?;

    // The server's endpoint carries its buffer (rkey, address, length).
    let me = if client {
        Endpoint::for_qp(&qp)
    } else {
        Endpoint::for_qp(&qp).with_buffer(&mr)
    };
    let peer = cm::connect(&qp, &mut stream, &me, &ConnectOptions::default())?;

    if client {
        // The source data: a pattern the server checks.
        let data: Vec<u8> = (0..opts.size).map(pattern).collect();
        mr.write_at(0, &data)?;
        if peer.len < opts.size as u64 {
            return Err(format!(
                "the server's buffer has {} bytes, not {}",
                peer.len, opts.size
            )
            .into());
        }
        // Wait until the server has posted its receive.
        stream.read_exact(&mut [0u8; 1])?;

        let sge = [Sge {
            addr: mr.iova(),
            length: opts.size as u32,
            lkey: mr.lkey(),
        }];
        let write = WrOpcode::RdmaWrite {
            remote_addr: peer.addr,
            rkey: peer.rkey,
        };
        let mut wc = [WorkCompletion::default(); 16];
        let (mut posted, mut completed) = (0u64, 0u64);
        let start = Instant::now();
        while completed < opts.iters {
            // Keep `depth` WRITEs in flight, each signaled so its slot in
            // the send queue is known to be free when it completes.
            while posted < opts.iters && posted - completed < u64::from(opts.depth) {
                qp.post_send(&SendWr::new(posted, write, &sge).signaled())?;
                posted += 1;
            }
            let n = cq.poll(&mut wc)?;
            for done in &wc[..n] {
                assert_eq!(done.status, WcStatus::Success, "WRITE failed: {done:?}");
            }
            completed += n as u64;
        }
        let secs = start.elapsed().as_secs_f64();
        let bytes = opts.iters as f64 * opts.size as f64;
        println!(
            "{} WRITEs of {} bytes ({} in flight) in {secs:.3} s: {:.3} GB/s",
            opts.iters,
            opts.size,
            opts.depth,
            bytes / secs / 1e9
        );

        // The end: a WRITE with immediate, which completes a receive at the
        // server after everything before it.
        let last = WrOpcode::RdmaWriteWithImm {
            remote_addr: peer.addr,
            rkey: peer.rkey,
            imm: DONE,
        };
        qp.post_send(&SendWr::new(u64::MAX, last, &[]).signaled())?;
        while cq.poll(&mut wc[..1])? == 0 {}
        assert_eq!(wc[0].status, WcStatus::Success, "last WRITE: {:?}", wc[0]);
    } else {
        // The receive the client's last WRITE (with immediate) consumes; the
        // client starts once it is posted.
        qp.post_recv(&RecvWr::new(0, &[]))?;
        stream.write_all(b"R")?;
        let mut wc = [WorkCompletion::default(); 1];
        while cq.poll(&mut wc)? == 0 {}
        let done = wc[0];
        assert_eq!(done.status, WcStatus::Success, "{done:?}");
        assert_eq!(done.opcode, WcOpcode::RecvRdmaWithImm, "{done:?}");
        assert_eq!(done.imm_data, DONE, "{done:?}");
        let mut data = vec![0u8; opts.size];
        mr.read_at(0, &mut data)?;
        let wrong = (0..opts.size).find(|&i| data[i] != pattern(i));
        if let Some(i) = wrong {
            return Err(format!("byte {i} is {:#x}, not {:#x}", data[i], pattern(i)).into());
        }
        println!(
            "received {} WRITEs of {} bytes; the data is intact",
            opts.iters, opts.size
        );
    }
    // Neither side tears down while the other may still need it.
    stream.write_all(b"E")?;
    stream.read_exact(&mut [0u8; 1])?;
    Ok(())
}
