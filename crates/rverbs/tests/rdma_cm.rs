//! The rdma_cm-style connection manager (`rverbs::cm::CmId`) within one
//! process: ids on one device and on two, over the IB CM on the wire
//! (REQ/REP/RTU, REJ, DREQ/DREP, SIDR) and the local rendezvous — connect
//! to 127.0.0.1 and the listening device is found.

use std::net::SocketAddr;
use std::time::Duration;

use rverbs::cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel, EventParam, PortSpace};
use rverbs::{
    devices, AccessFlags, AhAttr, CompletionQueue, Context, DeviceConfig, ErrorKind, MemoryRegion,
    QpCaps, QpState, QpType, QueuePair, RecvWr, SendWr, UdAddress, WcStatus, WrOpcode,
};

mod common;
use common::{sge, wait};

/// Longest a CM event may take on a loaded machine.
const EVENT_WAIT: Duration = Duration::from_secs(20);

/// A port no other test (nor a program) is likely to use.
fn port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 2_000) as u16 * 10;
    base + NEXT.fetch_add(1, Ordering::Relaxed)
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// The next event, which must be `kind`.
fn expect(ch: &EventChannel, kind: CmEventKind) -> CmEvent {
    let ev = ch
        .get_event_timeout(EVENT_WAIT)
        .unwrap()
        .unwrap_or_else(|| panic!("no {kind:?} within {EVENT_WAIT:?}"));
    assert_eq!(ev.kind, kind, "{ev:?}");
    ev
}

fn conn_param(ev: &CmEvent) -> &rverbs::cm::ConnEventParam {
    match &ev.param {
        EventParam::Conn(p) => p,
        other => panic!("no connection parameters: {other:?}"),
    }
}

struct Side {
    _ctx: Context,
    _pd: rverbs::ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn side(id: &CmId, qp_type: QpType) -> Side {
    let ctx = id.device().expect("the id has a device").open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let qp = pd
        .qp_builder(&cq, &cq)
        .qp_type(qp_type)
        .caps(QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        })
        .build()
        .unwrap();
    id.prepare_qp(&qp).unwrap();
    let mr = pd
        .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    Side {
        _ctx: ctx,
        _pd: pd,
        cq,
        qp,
        mr,
    }
}

fn with_data(data: &[u8]) -> ConnParam {
    ConnParam {
        private_data: data.to_vec(),
        ..ConnParam::default()
    }
}

/// A listener and a client that has resolved its route to it.
fn listening_and_resolved(
    space: PortSpace,
    listen_on: &str,
    client_src: Option<SocketAddr>,
    dst: &str,
) -> (EventChannel, CmId, EventChannel, CmId) {
    let sch = EventChannel::new().unwrap();
    let server = CmId::new(&sch, space).unwrap();
    server.bind_addr(addr(listen_on)).unwrap();
    server.listen(8).unwrap();
    let (cch, client) = resolved(space, client_src, dst);
    (sch, server, cch, client)
}

/// A client id on its own channel, its address and route to `dst`
/// resolved (from `src`, if given).
fn resolved(space: PortSpace, src: Option<SocketAddr>, dst: &str) -> (EventChannel, CmId) {
    let cch = EventChannel::new().unwrap();
    let client = CmId::new(&cch, space).unwrap();
    client.resolve_addr(src, addr(dst)).unwrap();
    expect(&cch, CmEventKind::AddrResolved);
    client.resolve_route().unwrap();
    expect(&cch, CmEventKind::RouteResolved);
    (cch, client)
}

/// Connects, accepts, sends one message each way, disconnects; checks
/// every event and the private data both ways.
fn full_cycle(listen_on: &str, client_src: Option<SocketAddr>, dst: &str) {
    let (sch, server, cch, client) =
        listening_and_resolved(PortSpace::Tcp, listen_on, client_src, dst);
    let c = side(&client, QpType::Rc);
    c.qp.post_recv(&RecvWr::new(7, &[sge(&c.mr, 0, 64)]))
        .unwrap();
    client
        .connect(Some(&c.qp), &with_data(b"hello, server"))
        .unwrap();

    let req = expect(&sch, CmEventKind::ConnectRequest);
    assert_eq!(req.listen_id.as_ref(), Some(&server));
    let p = conn_param(&req);
    assert_eq!(p.private_data.len(), 56, "a REQ's user room");
    assert!(p.private_data.starts_with(b"hello, server"));
    assert!(p.private_data[13..].iter().all(|&b| b == 0));
    assert_eq!(p.qp_num, c.qp.qp_num());
    assert_eq!((p.responder_resources, p.initiator_depth), (1, 1));
    let peer = req.peer.expect("the IP CM header names the client");
    assert_eq!(
        peer,
        client
            .local_addr()
            .map(|l| SocketAddr::new(
                if l.ip().is_unspecified() {
                    client.device().unwrap().addr()
                } else {
                    l.ip()
                },
                l.port()
            ))
            .unwrap()
    );
    let conn = req.id.clone();
    let s = side(&conn, QpType::Rc);
    s.qp.post_recv(&RecvWr::new(8, &[sge(&s.mr, 0, 64)]))
        .unwrap();
    conn.accept(Some(&s.qp), &with_data(b"welcome")).unwrap();
    assert_eq!(
        s.qp.state(),
        QpState::Rts,
        "accept brings the QP up before the REP"
    );

    let est = expect(&cch, CmEventKind::Established);
    let p = conn_param(&est);
    assert_eq!(p.private_data.len(), 196, "a REP's room");
    assert!(p.private_data.starts_with(b"welcome"));
    assert_eq!(p.qp_num, s.qp.qp_num());
    assert_eq!(c.qp.state(), QpState::Rts);
    expect(&sch, CmEventKind::Established);

    // Data both ways.
    c.mr.write_at(0, b"ping").unwrap();
    c.qp.post_send(&SendWr::new(1, WrOpcode::Send, &[sge(&c.mr, 0, 4)]).signaled())
        .unwrap();
    let got = wait(&s.cq, 1, "server receive");
    assert_eq!((got[0].status, got[0].byte_len), (WcStatus::Success, 4));
    s.mr.write_at(0, b"pong!").unwrap();
    s.qp.post_send(&SendWr::new(2, WrOpcode::Send, &[sge(&s.mr, 0, 5)]).signaled())
        .unwrap();
    let got = wait(&c.cq, 2, "client send and receive");
    assert!(
        got.iter().all(|wc| wc.status == WcStatus::Success),
        "{got:?}"
    );
    let mut buf = [0u8; 5];
    c.mr.read_at(0, &mut buf).unwrap();
    assert_eq!(&buf, b"pong!");
    wait(&s.cq, 1, "server send");

    // The client hangs up: both sides hear of it, both QPs are in ERR.
    client.disconnect().unwrap();
    expect(&cch, CmEventKind::Disconnected);
    expect(&sch, CmEventKind::Disconnected);
    assert_eq!(c.qp.state(), QpState::Err);
    assert_eq!(s.qp.state(), QpState::Err);
    // The client's device sent REQ, RTU and DREQ and took REP and DREP
    // (and the server's messages too, when both ids are on it).
    let dev = client.device().unwrap();
    let stats = dev.net_stats();
    assert!(stats.cm_sent >= 3 && stats.cm_received >= 2, "{stats:?}");
    assert_eq!(stats.mads_dropped, 0, "{stats:?}");
}

#[test]
fn connect_to_localhost_finds_the_listener() {
    let p = port();
    full_cycle(&format!("0.0.0.0:{p}"), None, &format!("127.0.0.1:{p}"));
}

#[test]
fn two_devices_connect_over_the_wire() {
    let second = rverbs::add_device(DeviceConfig::loopback().named("cm-second")).unwrap();
    let first = &devices().unwrap()[0];
    let p = port();
    // The listener on the first device's address; the client on the second.
    full_cycle(
        &format!("{}:{p}", first.addr()),
        Some(SocketAddr::new(second.addr(), 0)),
        &format!("{}:{p}", first.addr()),
    );
    let s = second.net_stats();
    assert!(s.mads_sent >= 3 && s.mads_received >= 2, "{s:?}");
    assert_eq!(s.rx_icrc_errors, 0);
    second.disassociate();
}

#[test]
fn nobody_listening_is_rejected() {
    let ch = EventChannel::new().unwrap();
    let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
    id.resolve_addr(None, addr(&format!("127.0.0.1:{}", port())))
        .unwrap();
    expect(&ch, CmEventKind::AddrResolved);
    id.resolve_route().unwrap();
    expect(&ch, CmEventKind::RouteResolved);
    let c = side(&id, QpType::Rc);
    id.connect(Some(&c.qp), &ConnParam::default()).unwrap();
    let ev = expect(&ch, CmEventKind::Rejected);
    assert_eq!(ev.status, 8, "IB_CM_REJ_INVALID_SERVICE_ID");
}

/// A listener that comes just after its peer's connect (perftest's `-R`
/// server, qperf's) still gets the request: a connect to a local port
/// nobody listens on waits a little for one.
#[test]
fn a_listener_that_comes_just_after_the_connect_gets_the_request() {
    let p = port();
    let (cch, client) = resolved(PortSpace::Tcp, None, &format!("127.0.0.1:{p}"));
    let c = side(&client, QpType::Rc);
    let listener = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let sch = EventChannel::new().unwrap();
        let server = CmId::new(&sch, PortSpace::Tcp).unwrap();
        server.bind_addr(addr(&format!("0.0.0.0:{p}"))).unwrap();
        server.listen(8).unwrap();
        let req = expect(&sch, CmEventKind::ConnectRequest);
        req.id.reject(b"seen").unwrap();
        (sch, server)
    });
    client.connect(Some(&c.qp), &ConnParam::default()).unwrap();
    let ev = expect(&cch, CmEventKind::Rejected);
    // The listener's own rejection, with its private data: the request
    // reached it.
    assert_eq!(ev.status, 28, "IB_CM_REJ_CONSUMER_DEFINED: {ev:?}");
    assert!(conn_param(&ev).private_data.starts_with(b"seen"));
    let _ = listener.join().unwrap();
}

#[test]
fn a_rejected_request_carries_the_private_data_back() {
    let p = port();
    let (sch, _server, cch, client) = listening_and_resolved(
        PortSpace::Tcp,
        &format!("0.0.0.0:{p}"),
        None,
        &format!("127.0.0.1:{p}"),
    );
    let c = side(&client, QpType::Rc);
    client.connect(Some(&c.qp), &with_data(b"may I?")).unwrap();
    let req = expect(&sch, CmEventKind::ConnectRequest);
    req.id.reject(b"no, thanks").unwrap();
    let ev = expect(&cch, CmEventKind::Rejected);
    assert_eq!(ev.status, 28, "IB_CM_REJ_CONSUMER_DEFINED");
    let pd = &conn_param(&ev).private_data;
    assert_eq!(pd.len(), 148);
    assert!(pd.starts_with(b"no, thanks"));
}

#[test]
fn a_port_has_one_listener() {
    let p = port();
    let ch = EventChannel::new().unwrap();
    let a = CmId::new(&ch, PortSpace::Tcp).unwrap();
    a.bind_addr(addr(&format!("0.0.0.0:{p}"))).unwrap();
    a.listen(1).unwrap();
    let b = CmId::new(&ch, PortSpace::Tcp).unwrap();
    b.bind_addr(addr(&format!("127.0.0.1:{p}"))).unwrap();
    assert_eq!(b.listen(1).unwrap_err().kind(), ErrorKind::AddrInUse);
    // Another port space is another port.
    let u = CmId::new(&ch, PortSpace::Udp).unwrap();
    u.bind_addr(addr(&format!("0.0.0.0:{p}"))).unwrap();
    u.listen(1).unwrap();
    drop(a);
    b.listen(1).expect("free once the listener is gone");
}

#[test]
fn misuse_is_refused_with_einval() {
    let ch = EventChannel::new().unwrap();
    let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
    assert_eq!(
        id.resolve_route().unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        id.connect(None, &ConnParam::default()).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        id.disconnect().unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        id.accept(None, &ConnParam::default()).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    id.resolve_addr(None, addr(&format!("127.0.0.1:{}", port())))
        .unwrap();
    id.resolve_route().unwrap();
    let too_long = with_data(&[1; 57]);
    assert_eq!(
        id.connect(None, &too_long).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    // A non-blocking channel says EAGAIN when nothing waits.
    let quiet = EventChannel::new().unwrap();
    quiet.set_nonblocking(true).unwrap();
    assert_eq!(quiet.get_event().unwrap_err().kind(), ErrorKind::WouldBlock);
}

#[test]
fn ud_ids_resolve_the_peers_qp_and_datagrams_flow() {
    let p = port();
    let (sch, _server, cch, client) = listening_and_resolved(
        PortSpace::Udp,
        &format!("0.0.0.0:{p}"),
        None,
        &format!("127.0.0.1:{p}"),
    );
    let c = side(&client, QpType::Ud);
    client.connect(Some(&c.qp), &with_data(b"sidr")).unwrap();
    let req = expect(&sch, CmEventKind::ConnectRequest);
    let EventParam::Ud(asked) = &req.param else {
        panic!("a UD request carries UD parameters: {req:?}");
    };
    // A SIDR_REQ's room after rdma_cm's header: 216 − 36 bytes.
    assert_eq!(asked.private_data.len(), 180);
    assert!(asked.private_data.starts_with(b"sidr"));
    let s = side(&req.id, QpType::Ud);
    s.qp.post_recv(&RecvWr::new(3, &[sge(&s.mr, 0, 40 + 64)]))
        .unwrap();
    req.id.accept(Some(&s.qp), &with_data(b"here")).unwrap();
    let est = expect(&cch, CmEventKind::Established);
    let EventParam::Ud(ud) = &est.param else {
        panic!("no UD parameters: {est:?}");
    };
    assert_eq!(
        (ud.qp_num, ud.qkey),
        (s.qp.qp_num(), rverbs::cm::RDMA_UDP_QKEY)
    );
    assert!(ud.private_data.starts_with(b"here"));
    // A datagram to the QP the SIDR named.
    send_datagram(&c, ud, b"datagram");
    let got = wait(&s.cq, 1, "UD receive");
    assert_eq!(
        (got[0].status, got[0].byte_len),
        (WcStatus::Success, 40 + 8)
    );
}

/// Sends `payload` from `from`'s UD QP where `ud` (an event's UD
/// parameters) says: its GID, QP number and Q_Key.
fn send_datagram(from: &Side, ud: &rverbs::cm::UdParam, payload: &[u8]) {
    let ah = from
        ._pd
        .create_ah(&AhAttr {
            dgid: ud.remote_gid,
            port_num: 1,
            ..AhAttr::default()
        })
        .unwrap();
    from.mr.write_at(0, payload).unwrap();
    let sges = [sge(&from.mr, 0, payload.len() as u32)];
    let mut wr = SendWr::new(4, WrOpcode::Send, &sges).signaled();
    wr.ud = Some(UdAddress {
        ah: &ah,
        remote_qpn: ud.qp_num,
        remote_qkey: ud.qkey,
    });
    from.qp.post_send(&wr).unwrap();
}

#[test]
fn multicast_join_attaches_the_qp_and_says_how_to_send() {
    let group: std::net::IpAddr = format!("239.77.{}.{}", port() % 250, port() % 250)
        .parse()
        .unwrap();
    let ch = EventChannel::new().unwrap();
    let join = |ch: &EventChannel| {
        let id = CmId::new(ch, PortSpace::Udp).unwrap();
        id.bind_addr(addr("0.0.0.0:0")).unwrap();
        let s = side(&id, QpType::Ud);
        (id, s)
    };
    let (rx_id, rx) = join(&ch);
    rx.qp
        .post_recv(&RecvWr::new(5, &[sge(&rx.mr, 0, 40 + 64)]))
        .unwrap();
    rx_id.join_multicast(group, Some(&rx.qp), false).unwrap();
    let ev = expect(&ch, CmEventKind::MulticastJoin);
    let EventParam::Ud(ud) = &ev.param else {
        panic!("no UD parameters: {ev:?}");
    };
    assert_eq!(ud.remote_gid, rverbs::Gid::from_ip(group));
    assert_eq!((ud.qp_num, ud.qkey), (0xff_ffff, rverbs::cm::RDMA_UDP_QKEY));
    // A send-only member sends to the group; the attached QP receives.
    let (tx_id, tx) = join(&ch);
    tx_id.join_multicast(group, Some(&tx.qp), true).unwrap();
    let ev = expect(&ch, CmEventKind::MulticastJoin);
    let EventParam::Ud(ud) = &ev.param else {
        panic!("no UD parameters: {ev:?}");
    };
    send_datagram(&tx, ud, b"to the group");
    let got = wait(&rx.cq, 1, "multicast receive");
    assert_eq!(
        (got[0].status, got[0].byte_len),
        (WcStatus::Success, 40 + 12)
    );
    rx_id.leave_multicast(group, Some(&rx.qp)).unwrap();
    assert_eq!(
        rx_id
            .join_multicast(addr("10.0.0.1:0").ip(), None, false)
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn ids_hear_of_their_device_going_away() {
    let dev = rverbs::add_device(DeviceConfig::loopback().named("cm-removal")).unwrap();
    let p = port();
    let ch = EventChannel::new().unwrap();
    let listener = CmId::new(&ch, PortSpace::Tcp).unwrap();
    listener.bind_addr(SocketAddr::new(dev.addr(), p)).unwrap();
    listener.listen(4).unwrap();
    let cch = EventChannel::new().unwrap();
    let client = CmId::new(&cch, PortSpace::Tcp).unwrap();
    client
        .resolve_addr(
            Some(SocketAddr::new(dev.addr(), 0)),
            SocketAddr::new(dev.addr(), p),
        )
        .unwrap();
    expect(&cch, CmEventKind::AddrResolved);
    client.resolve_route().unwrap();
    expect(&cch, CmEventKind::RouteResolved);
    let c = side(&client, QpType::Rc);
    client.connect(Some(&c.qp), &ConnParam::default()).unwrap();
    let req = expect(&ch, CmEventKind::ConnectRequest);
    let s = side(&req.id, QpType::Rc);
    req.id.accept(Some(&s.qp), &ConnParam::default()).unwrap();
    expect(&cch, CmEventKind::Established);
    expect(&ch, CmEventKind::Established);

    dev.disassociate();
    let ev = expect(&cch, CmEventKind::DeviceRemoval);
    assert_eq!(ev.id, client);
    // The listener and the accepted id, in either order.
    let mut removed = vec![
        expect(&ch, CmEventKind::DeviceRemoval).id,
        expect(&ch, CmEventKind::DeviceRemoval).id,
    ];
    removed.sort_by_key(|id| id == &listener);
    assert_eq!(removed, [req.id.clone(), listener.clone()]);
    // The QPs the ids brought up are in ERR.
    assert_eq!(c.qp.state(), QpState::Err);
    assert_eq!(s.qp.state(), QpState::Err);
}

/// Many connects at once, each answered at once (the listener rejects
/// every request as it comes): every id hears its answer. The answer may
/// come back before `connect` returns to its caller — the id must already
/// be the one the connection's events go to when its REQ leaves (cmtime
/// -c 100 hung, waiting for an ESTABLISHED that had been dropped). No id
/// here has a QP, nor has the process: the connection manager runs the
/// device (it receives the MADs) without one.
#[test]
fn answers_that_come_before_connect_returns_are_not_lost() {
    const THREADS: usize = 4;
    const CONNECTS: usize = 100;
    let p = port();
    let sch = EventChannel::new().unwrap();
    let server = CmId::new(&sch, PortSpace::Tcp).unwrap();
    server.bind_addr(addr(&format!("0.0.0.0:{p}"))).unwrap();
    server.listen(0).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rejecter = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _server = server;
            let mut rejected = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(ev) = sch.get_event_timeout(Duration::from_millis(50)).unwrap() {
                    assert_eq!(ev.kind, CmEventKind::ConnectRequest, "{ev:?}");
                    ev.id.reject(b"busy").unwrap();
                    rejected += 1;
                }
            }
            rejected
        })
    };
    let clients: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                let ch = EventChannel::new().unwrap();
                for i in 0..CONNECTS {
                    let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
                    id.resolve_addr(None, addr(&format!("127.0.0.1:{p}")))
                        .unwrap();
                    expect(&ch, CmEventKind::AddrResolved);
                    id.resolve_route().unwrap();
                    expect(&ch, CmEventKind::RouteResolved);
                    // No QP: a made-up QP number (the REQ needs one).
                    let param = ConnParam {
                        qp_num: 0x1000 + (t * CONNECTS + i) as u32,
                        ..ConnParam::default()
                    };
                    id.connect(None, &param).unwrap();
                    let ev = ch
                        .get_event_timeout(EVENT_WAIT)
                        .unwrap()
                        .unwrap_or_else(|| {
                            panic!(
                                "thread {t}, connect {i}: no answer within {EVENT_WAIT:?}; {:?}",
                                id.device().unwrap().net_stats()
                            )
                        });
                    assert_eq!(ev.kind, CmEventKind::Rejected, "{ev:?}");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(rejecter.join().unwrap(), THREADS * CONNECTS);
}

/// Both sides hang up at once, as perftest's do: the side whose
/// `disconnect` comes after the peer's DREQ succeeds all the same (the
/// kernel's rdma_disconnect returns 0 once the id had a connection; perftest
/// printed "Failed to disconnect RDMA CM connection."), and so does a
/// second disconnect, and one after a rejection.
#[test]
fn disconnecting_after_the_peer_did_succeeds() {
    let p = port();
    let (sch, _server, cch, client) = listening_and_resolved(
        PortSpace::Tcp,
        &format!("0.0.0.0:{p}"),
        None,
        &format!("127.0.0.1:{p}"),
    );
    let c = side(&client, QpType::Rc);
    client.connect(Some(&c.qp), &ConnParam::default()).unwrap();
    let req = expect(&sch, CmEventKind::ConnectRequest);
    let conn = req.id.clone();
    let s = side(&conn, QpType::Rc);
    conn.accept(Some(&s.qp), &ConnParam::default()).unwrap();
    expect(&cch, CmEventKind::Established);
    expect(&sch, CmEventKind::Established);

    conn.disconnect().unwrap();
    expect(&cch, CmEventKind::Disconnected);
    client
        .disconnect()
        .expect("disconnect after the peer's DREQ");
    expect(&sch, CmEventKind::Disconnected);
    conn.disconnect().expect("a second disconnect");
    assert_eq!(c.qp.state(), QpState::Err);
    assert_eq!(s.qp.state(), QpState::Err);

    // A rejected connect: disconnect succeeds too (and changes nothing).
    let p = port();
    let (sch, _server, cch, client) = listening_and_resolved(
        PortSpace::Tcp,
        &format!("0.0.0.0:{p}"),
        None,
        &format!("127.0.0.1:{p}"),
    );
    client
        .connect(
            None,
            &ConnParam {
                qp_num: 0x4242,
                ..ConnParam::default()
            },
        )
        .unwrap();
    expect(&sch, CmEventKind::ConnectRequest)
        .id
        .reject(&[])
        .unwrap();
    expect(&cch, CmEventKind::Rejected);
    client.disconnect().expect("disconnect after a rejection");
}

/// A listener dropped with its channel while a connection request waits
/// unread in it: the channel, the request's id and the listener all go —
/// the requester is rejected, and the port is free again (the events in a
/// channel hold their ids; the ids must not hold the channel).
#[test]
fn dropping_a_channel_with_unread_events_frees_its_ids() {
    use std::os::fd::AsFd;
    let p = port();
    let ch = EventChannel::new().unwrap();
    let listener = CmId::new(&ch, PortSpace::Tcp).unwrap();
    listener.bind_addr(addr(&format!("0.0.0.0:{p}"))).unwrap();
    listener.listen(4).unwrap();
    let (cch, client) = resolved(PortSpace::Tcp, None, &format!("127.0.0.1:{p}"));
    let c = side(&client, QpType::Rc);
    client.connect(Some(&c.qp), &ConnParam::default()).unwrap();
    // The request is waiting in the listener's channel, unread.
    let mut fds = [nix::poll::PollFd::new(
        ch.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    assert_eq!(nix::poll::poll(&mut fds, 20_000u16).unwrap(), 1);
    drop(listener);
    drop(ch);
    let ev = expect(&cch, CmEventKind::Rejected);
    assert_eq!(ev.status, 28, "{ev:?}");
    let again_ch = EventChannel::new().unwrap();
    let again = CmId::new(&again_ch, PortSpace::Tcp).unwrap();
    again.bind_addr(addr(&format!("0.0.0.0:{p}"))).unwrap();
    again.listen(4).expect("the port is free again");
}
