//! An async echo server and client on tokio (the `tokio` feature).
//!
//! ```text
//! cargo run --features tokio --example async_echo                     # server, TCP port 18517
//! cargo run --features tokio --example async_echo -- 127.0.0.1 hi ho  # a client
//! ```
//!
//! Options: `--port P` (TCP port; 0 lets the server pick one, which it prints),
//! `--clients N` (the server exits after serving N clients; default: never).
//!
//! Each client connects over TCP; the two sides exchange their RC QP's
//! endpoint on that connection (asynchronously: the line `Endpoint::encode`
//! writes, then one byte each way once the QP is up, as `rverbs::cm::connect`
//! does on a blocking stream). The server serves every client in a task of its
//! own, with a CQ it awaits as a stream of completions
//! (`rverbs::tokio::CompletionStream`): every message it receives it sends
//! back, from the very buffer it landed in. The client sends each word of its
//! command line, awaits its echo (`AsyncCompletionQueue::next_completions`),
//! and prints it; an empty message ends the session.

use std::error::Error;

use rverbs::cm::{ConnectOptions, Endpoint};
use rverbs::tokio::AsyncCompletionQueue;
use rverbs::{
    AccessFlags, QpCaps, QueuePair, RecvWr, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
    WrOpcode,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Bytes per message buffer.
const SLOT: usize = 4096;
/// Receives the server keeps posted per client.
const SLOTS: usize = 8;

type AnyResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// Exchanges endpoints over `stream` and brings `qp` to RTS, connected to
/// the peer's; returns once the peer's QP is up too (both wrote "R").
async fn exchange(stream: &mut BufReader<TcpStream>, qp: &QueuePair) -> AnyResult<Endpoint> {
    let me = Endpoint::for_qp(qp);
    stream.write_all(me.encode().as_bytes()).await?;
    let mut line = String::new();
    stream.read_line(&mut line).await?;
    let peer = Endpoint::decode(&line)?;
    qp.connect(me.psn, &peer, &ConnectOptions::default())?;
    stream.write_all(b"R").await?;
    if stream.read_u8().await? != b'R' {
        return Err("the peer did not get ready".into());
    }
    Ok(peer)
}

/// The last byte each way: neither side tears its QP down while the other
/// may still need an ACK from it.
async fn goodbye(stream: &mut BufReader<TcpStream>) -> AnyResult<()> {
    stream.write_all(b"E").await?;
    stream.read_u8().await?;
    Ok(())
}

/// An RC QP on a new awaited CQ, and a buffer of `slots` message slots.
fn resources(slots: usize) -> AnyResult<(AsyncCompletionQueue, QueuePair, rverbs::MemoryRegion)> {
    let device = rverbs::devices()?
        .into_iter()
        .next()
        .ok_or("no rverbs device")?;
    let ctx = device.open()?;
    let cq = AsyncCompletionQueue::create(&ctx, 2 * slots as u32)?;
    let pd = ctx.alloc_pd()?;
    let caps = QpCaps {
        max_send_wr: slots as u32,
        max_recv_wr: slots as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd.qp_builder(cq.cq(), cq.cq()).caps(caps).build()?;
    let mr = pd.alloc_mr(slots * SLOT, AccessFlags::LOCAL_WRITE)?;
    Ok((cq, qp, mr))
}

/// `len` bytes of slot `slot` of `mr`.
fn slot_sge(mr: &rverbs::MemoryRegion, slot: usize, len: usize) -> Sge {
    Sge {
        addr: mr.iova() + (slot * SLOT) as u64,
        length: len as u32,
        lkey: mr.lkey(),
    }
}

/// Serves one client: echoes every message until an empty one.
async fn serve(tcp: TcpStream, client: usize) -> AnyResult<()> {
    let mut stream = BufReader::new(tcp);
    let (cq, qp, mr) = resources(SLOTS)?;
    // Receives may be posted from INIT on, which `connect` passes through;
    // before it, the QP is in RESET. So: connect, then post, then say ready.
    let peer = exchange(&mut stream, &qp).await?;
    println!("client {client}: QP {:#x} at {}", peer.qpn, peer.gid);
    for slot in 0..SLOTS {
        qp.post_recv(&RecvWr::new(slot as u64, &[slot_sge(&mr, slot, SLOT)]))?;
    }
    // The client sends its first message once this byte says the receives
    // are there.
    stream.write_all(b"P").await?;

    // A received message in slot s is sent back from slot s (wr_id s); once
    // that send completes, slot s takes a receive again.
    let mut completions = cq.into_stream();
    let mut echoed = 0;
    let mut sending = 0;
    let mut done = false;
    while !done || sending > 0 {
        let wc = completions.next().await.ok_or("the CQ's stream ended")??;
        if wc.status != WcStatus::Success {
            return Err(format!("client {client}: {wc:?}").into());
        }
        let slot = wc.wr_id as usize;
        match wc.opcode {
            WcOpcode::Recv if wc.byte_len == 0 => done = true,
            WcOpcode::Recv => {
                let echo = [slot_sge(&mr, slot, wc.byte_len as usize)];
                qp.post_send(&SendWr::new(wc.wr_id, WrOpcode::Send, &echo).signaled())?;
                sending += 1;
                echoed += 1;
            }
            WcOpcode::Send => {
                sending -= 1;
                qp.post_recv(&RecvWr::new(wc.wr_id, &[slot_sge(&mr, slot, SLOT)]))?;
            }
            other => return Err(format!("unexpected completion {other:?}").into()),
        }
    }
    goodbye(&mut stream).await?;
    println!("client {client}: echoed {echoed} messages");
    Ok(())
}

async fn server(port: u16, clients: Option<usize>) -> AnyResult<()> {
    let listener = TcpListener::bind(("0.0.0.0", port)).await?;
    println!("listening on {}", listener.local_addr()?);
    let mut tasks = Vec::new();
    let mut served = 0;
    while clients.is_none_or(|n| served < n) {
        let (tcp, from) = listener.accept().await?;
        tcp.set_nodelay(true)?;
        served += 1;
        println!("client {served}: connected from {from}");
        // Each client in its own task: they are served concurrently.
        tasks.push(tokio::spawn(serve(tcp, served)));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

async fn client(host: &str, port: u16, words: &[String]) -> AnyResult<()> {
    let tcp = TcpStream::connect((host, port)).await?;
    tcp.set_nodelay(true)?;
    let mut stream = BufReader::new(tcp);
    // Slot 0 sends, slot 1 receives.
    let (mut cq, qp, mr) = resources(2)?;
    exchange(&mut stream, &qp).await?;
    // Wait until the server's receives are posted.
    if stream.read_u8().await? != b'P' {
        return Err("the server did not post its receives".into());
    }
    let mut wc = [WorkCompletion::default(); 2];
    for word in words {
        let len = word.len().min(SLOT);
        qp.post_recv(&RecvWr::new(1, &[slot_sge(&mr, 1, SLOT)]))?;
        mr.write_at(0, &word.as_bytes()[..len])?;
        qp.post_send(&SendWr::new(0, WrOpcode::Send, &[slot_sge(&mr, 0, len)]).signaled())?;
        // The send's completion and the echo's, in whatever order.
        let mut echo = None;
        let mut sent = false;
        while !sent || echo.is_none() {
            let n = cq.next_completions(&mut wc).await?;
            for done in &wc[..n] {
                if done.status != WcStatus::Success {
                    return Err(format!("{done:?}").into());
                }
                match done.opcode {
                    WcOpcode::Send => sent = true,
                    _ => echo = Some(done.byte_len as usize),
                }
            }
        }
        let mut back = vec![0u8; echo.unwrap_or(0)];
        mr.read_at(SLOT, &mut back)?;
        println!("echo: {}", String::from_utf8_lossy(&back));
    }
    // An empty message ends the session.
    qp.post_send(&SendWr::new(0, WrOpcode::Send, &[]).signaled())?;
    let n = cq.next_completions(&mut wc[..1]).await?;
    if n != 1 || wc[0].status != WcStatus::Success {
        return Err(format!("the last send: {:?}", &wc[..n]).into());
    }
    goodbye(&mut stream).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> AnyResult<()> {
    let usage = "usage: async_echo [--port P] [--clients N] [SERVER [WORD…]]";
    let mut port = 18517;
    let mut clients = None;
    let mut rest = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => port = args.next().ok_or(usage)?.parse()?,
            "--clients" => clients = Some(args.next().ok_or(usage)?.parse()?),
            s if s.starts_with('-') && rest.is_empty() => return Err(usage.into()),
            _ => rest.push(arg),
        }
    }
    match rest.split_first() {
        None => server(port, clients).await,
        Some((host, [])) => {
            let default = ["hello", "from", "tokio"].map(String::from);
            client(host, port, &default).await
        }
        Some((host, words)) => client(host, port, words).await,
    }
}
