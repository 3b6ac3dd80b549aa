//! The Rust connection manager (`rverbs::cm`) and the C one (this
//! library's librdmacm, under an unmodified `ucmatose`) on the wire, each
//! way: a Rust id connects to `ucmatose` listening, and `ucmatose`
//! connects to a Rust id listening — found through the local rendezvous
//! from 127.0.0.1, over REQ/REP/RTU and DREQ/DREP between two processes'
//! devices — and they exchange `ucmatose`'s messages (one 100-byte SEND
//! each way).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rverbs::cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel, PortSpace};
use rverbs::{
    AccessFlags, CompletionQueue, MemoryRegion, QpCaps, QpType, QueuePair, RecvWr, SendWr, Sge,
    WcStatus, WrOpcode,
};

mod common;

/// `ucmatose`'s default message size.
const MESSAGE: u32 = 100;
const EVENT_WAIT: Duration = Duration::from_secs(12);

/// `ucmatose` from Debian's rdmacm-utils; `None` (skipped) without it,
/// outside CI.
fn ucmatose() -> Option<PathBuf> {
    let path = PathBuf::from("/usr/bin/ucmatose");
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "ucmatose (rdmacm-utils) is needed in CI"
    );
    eprintln!("skipped: ucmatose (rdmacm-utils) is not installed");
    None
}

fn start(libs: &common::LibDir, args: &[&str]) -> Child {
    Command::new("stdbuf")
        .arg("-o0")
        .arg(ucmatose().unwrap())
        .args(args)
        .env("LD_LIBRARY_PATH", &libs.0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for the program (killing it after `EVENT_WAIT`): its status and output.
fn finish(mut child: Child) -> (bool, String) {
    let deadline = Instant::now() + EVENT_WAIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn port() -> u16 {
    30_000 + (std::process::id() % 10_000) as u16
}

fn next(ch: &EventChannel, kind: CmEventKind) -> CmEvent {
    let ev = ch
        .get_event_timeout(EVENT_WAIT)
        .unwrap()
        .unwrap_or_else(|| panic!("no {kind:?} within {EVENT_WAIT:?}"));
    assert_eq!(ev.kind, kind, "{ev:?}");
    ev
}

struct Node {
    _pd: rverbs::ProtectionDomain,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn node(id: &CmId) -> Node {
    let ctx = id.device().unwrap().open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let send_cq = ctx.create_cq(16).unwrap();
    let recv_cq = ctx.create_cq(16).unwrap();
    let qp = pd
        .qp_builder(&send_cq, &recv_cq)
        .qp_type(QpType::Rc)
        .caps(QpCaps {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        })
        .build()
        .unwrap();
    id.prepare_qp(&qp).unwrap();
    let mr = pd
        .alloc_mr(2 * MESSAGE as usize, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let recv = [Sge {
        addr: mr.iova(),
        length: MESSAGE,
        lkey: mr.lkey(),
    }];
    qp.post_recv(&RecvWr::new(1, &recv)).unwrap();
    Node {
        _pd: pd,
        send_cq,
        recv_cq,
        qp,
        mr,
    }
}

/// One successful completion of a receive (of a message) or of a send.
fn complete(n: &Node, want_recv: bool) {
    let deadline = Instant::now() + EVENT_WAIT;
    let mut wc = [rverbs::WorkCompletion::default(); 1];
    let cq = if want_recv { &n.recv_cq } else { &n.send_cq };
    loop {
        assert!(Instant::now() < deadline, "no completion");
        if cq.poll(&mut wc).unwrap() == 1 {
            assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
            assert_eq!(
                wc[0].opcode == rverbs::WcOpcode::Recv,
                want_recv,
                "{:?}",
                wc[0]
            );
            if want_recv {
                assert_eq!(wc[0].byte_len, MESSAGE);
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn send(n: &Node) {
    let sge = [Sge {
        addr: n.mr.iova() + u64::from(MESSAGE),
        length: MESSAGE,
        lkey: n.mr.lkey(),
    }];
    n.qp.post_send(&SendWr::new(2, WrOpcode::Send, &sge).signaled())
        .unwrap();
    complete(n, false);
}

#[test]
fn a_rust_id_connects_to_ucmatose() {
    if ucmatose().is_none() {
        return;
    }
    let libs = common::LibDir::with_rdmacm("cm-rust-c");
    let p = port().to_string();
    let server = start(&libs, &["-p", &p, "-c", "1", "-C", "1"]);
    // Wait for its listener (the rendezvous has its port).
    let ch = EventChannel::new().unwrap();
    let dst: SocketAddr = format!("127.0.0.1:{p}").parse().unwrap();
    let deadline = Instant::now() + EVENT_WAIT;
    let (id, n) = loop {
        let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
        id.resolve_addr(None, dst).unwrap();
        next(&ch, CmEventKind::AddrResolved);
        id.resolve_route().unwrap();
        next(&ch, CmEventKind::RouteResolved);
        let n = node(&id);
        id.connect(Some(&n.qp), &ConnParam::default()).unwrap();
        let ev = ch.get_event_timeout(EVENT_WAIT).unwrap().expect("an event");
        match ev.kind {
            CmEventKind::Established => break (id, n),
            CmEventKind::Rejected if Instant::now() < deadline => {
                // Not listening yet.
                std::thread::sleep(Duration::from_millis(50));
            }
            _ => panic!("{ev:?}"),
        }
    };
    // ucmatose's server sends first, then takes the reply and hangs up.
    complete(&n, true);
    send(&n);
    next(&ch, CmEventKind::Disconnected);
    let (ok, out) = finish(server);
    assert!(ok, "ucmatose:\n{out}");
    assert!(out.contains("data transfers complete"), "{out}");
    drop(id);
}

#[test]
fn ucmatose_connects_to_a_rust_id() {
    if ucmatose().is_none() {
        return;
    }
    let libs = common::LibDir::with_rdmacm("cm-rust-c");
    let p = port() + 1;
    let ch = EventChannel::new().unwrap();
    let listener = CmId::new(&ch, PortSpace::Tcp).unwrap();
    listener
        .bind_addr(format!("0.0.0.0:{p}").parse().unwrap())
        .unwrap();
    listener.listen(4).unwrap();
    let client = start(
        &libs,
        &[
            "-s",
            "127.0.0.1",
            "-p",
            &p.to_string(),
            "-c",
            "1",
            "-C",
            "1",
        ],
    );
    let req = next(&ch, CmEventKind::ConnectRequest);
    let id = req.id.clone();
    let n = node(&id);
    id.accept(Some(&n.qp), &ConnParam::default()).unwrap();
    let Some(ev) = ch.get_event_timeout(EVENT_WAIT).unwrap() else {
        let stats = id.device().unwrap().net_stats();
        let (_, out) = finish(client);
        panic!("no ESTABLISHED ({stats:?}); ucmatose -s said:\n{out}");
    };
    assert_eq!(ev.kind, CmEventKind::Established, "{ev:?}");
    // As ucmatose's server: send, take the reply, hang up.
    send(&n);
    complete(&n, true);
    id.disconnect().unwrap();
    next(&ch, CmEventKind::Disconnected);
    let (ok, out) = finish(client);
    assert!(ok, "ucmatose -s:\n{out}");
    assert!(out.contains("data transfers complete"), "{out}");
}
