//! `CmId::resolve_addr` resolves another host's address as the kernel's
//! `rdma_resolve_addr` does: by the route's next hop, whose neighbour (ARP,
//! IPv6 ND) must answer within the timeout — ADDR_RESOLVED when it does,
//! ADDR_ERROR with status -ETIMEDOUT when nobody holds the address; no
//! route fails the call at once; a local destination and a neighbour
//! already known resolve at once.
//!
//! Two network namespaces joined by a veth pair: `a` (10.99.8.1,
//! fd00:99:8::1) where the test's child runs with its device on
//! `RVERBS_ADDR=10.99.8.1`, and `b` (10.99.8.2, fd00:99:8::2) which only
//! answers ARP and ND. From `a`, 10.99.9.0/24 goes through 10.99.8.2 and
//! 10.99.10.0/24 through 10.99.8.66, which nobody holds. The test binary is
//! its own peer: the parent makes the namespaces and runs
//! `ip netns exec <a> <this binary> --exact <test>` with `RVERBS_NEIGH_ROLE`
//! set. Needs root and `ip` (iproute2); without them it is skipped, unless
//! `CI` is set.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use rverbs::cm::{CmEvent, CmEventKind, CmId, EventChannel, PortSpace};
use rverbs::{ErrorKind, Gid};

mod common;
use common::{find_tool, is_root, run, Namespaces};

const ROLE: &str = "RVERBS_NEIGH_ROLE";
/// Longest an event may take on a loaded machine (the timeouts below are
/// far shorter; the event comes after them).
const EVENT_WAIT: Duration = Duration::from_secs(20);
/// The timeout given for addresses nobody holds: ADDR_ERROR after it.
const SHORT: Duration = Duration::from_millis(300);
/// `-ETIMEDOUT`, the status of the kernel's ADDR_ERROR after the timeout.
const MINUS_ETIMEDOUT: i32 = -110;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// The next event on `ch`: it must be `kind`, about `id`.
fn expect(ch: &EventChannel, id: &CmId, kind: CmEventKind) -> CmEvent {
    let ev = ch
        .get_event_timeout(EVENT_WAIT)
        .unwrap()
        .unwrap_or_else(|| panic!("no {kind:?} within {EVENT_WAIT:?}"));
    assert_eq!(ev.kind, kind, "{ev:?}");
    assert_eq!(&ev.id, id, "{ev:?}");
    ev
}

#[test]
fn addresses_resolve_through_their_neighbours() {
    if std::env::var_os(ROLE).is_some() {
        return child();
    }
    let ip = find_tool("ip");
    if ip.is_none() || !is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "needs root and ip (iproute2) in CI"
        );
        eprintln!("skipped: needs root and ip (iproute2)");
        return;
    }
    let ip = ip.unwrap();
    let pid = std::process::id();
    let (a, b) = (format!("rvneigha{pid}"), format!("rvneighb{pid}"));
    let (va, vb) = (format!("na{pid}"), format!("nb{pid}"));
    let mut nets = Namespaces::new(&ip);
    nets.add(&a);
    nets.add(&b);
    run(
        &ip,
        &[
            "-n", &a, "link", "add", &va, "type", "veth", "peer", "name", &vb, "netns", &b,
        ],
    );
    for (ns, dev, v4, v6) in [
        (&a, &va, "10.99.8.1/24", "fd00:99:8::1/64"),
        (&b, &vb, "10.99.8.2/24", "fd00:99:8::2/64"),
    ] {
        run(&ip, &["-n", ns, "link", "set", "lo", "up"]);
        run(&ip, &["-n", ns, "addr", "add", v4, "dev", dev]);
        run(&ip, &["-n", ns, "addr", "add", v6, "dev", dev, "nodad"]);
        run(&ip, &["-n", ns, "link", "set", dev, "up"]);
    }
    run(
        &ip,
        &["-n", &a, "route", "add", "10.99.9.0/24", "via", "10.99.8.2"],
    );
    run(
        &ip,
        &[
            "-n",
            &a,
            "route",
            "add",
            "10.99.10.0/24",
            "via",
            "10.99.8.66",
        ],
    );
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(&ip)
        .args(["netns", "exec", &a])
        .arg(&exe)
        .args([
            "--exact",
            "addresses_resolve_through_their_neighbours",
            "--nocapture",
        ])
        .env(ROLE, "child")
        .env("RVERBS_ADDR", "10.99.8.1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("child done"),
        "child: {}\n{text}",
        out.status
    );
    // The resolution really asked the neighbour: `a` knows b's link-layer
    // address now (nothing else in `a` sent b a packet).
    for held in ["10.99.8.2", "fd00:99:8::2"] {
        let neigh = run(&ip, &["-n", &a, "neigh", "show", held, "dev", &va]);
        assert!(neigh.contains("lladdr"), "{held}: {neigh:?}");
    }
}

fn child() {
    let ch = EventChannel::new().unwrap();
    let new_id = || CmId::new(&ch, PortSpace::Tcp).unwrap();

    // A held address on the link: its neighbour answers.
    for (dst, gid) in [
        ("10.99.8.2:7471", "10.99.8.2"),
        ("[fd00:99:8::2]:7471", "fd00:99:8::2"),
    ] {
        let id = new_id();
        id.resolve_addr_timeout(None, addr(dst), Duration::from_secs(10))
            .unwrap();
        expect(&ch, &id, CmEventKind::AddrResolved);
        assert_eq!(id.peer_addr(), Some(addr(dst)));
        assert_eq!(id.peer_gid(), Some(Gid::from_ip(gid.parse().unwrap())));
        if dst.starts_with("10.") {
            // The connection comes from the device's address.
            assert_eq!(id.local_addr().unwrap().ip(), addr("10.99.8.1:0").ip());
        }
        id.resolve_route().unwrap();
        expect(&ch, &id, CmEventKind::RouteResolved);
        // A neighbour already valid resolves at once: the event is queued
        // before the call returns.
        let again = new_id();
        again
            .resolve_addr_timeout(None, addr(dst), Duration::from_secs(10))
            .unwrap();
        let ev = ch.try_get_event().expect("ADDR_RESOLVED queued at once");
        assert_eq!((ev.kind, &ev.id), (CmEventKind::AddrResolved, &again));
    }

    // Nobody holds it: ADDR_ERROR, -ETIMEDOUT, after the timeout; the id
    // is bound again and may resolve anew.
    for dst in ["10.99.8.77:7471", "[fd00:99:8::77]:7471"] {
        let id = new_id();
        id.resolve_addr_timeout(None, addr(dst), SHORT).unwrap();
        let ev = expect(&ch, &id, CmEventKind::AddrError);
        assert_eq!(ev.status, MINUS_ETIMEDOUT, "{dst}");
        assert_eq!(
            id.resolve_route().unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        id.resolve_addr_timeout(None, addr(dst), SHORT).unwrap();
        let ev = expect(&ch, &id, CmEventKind::AddrError);
        assert_eq!(ev.status, MINUS_ETIMEDOUT, "{dst} again");
    }

    // Through a gateway: the gateway's neighbour decides, not the
    // destination's (nobody holds 10.99.9.5; 10.99.8.2 routes there).
    let id = new_id();
    id.resolve_addr_timeout(None, addr("10.99.9.5:7471"), Duration::from_secs(10))
        .unwrap();
    expect(&ch, &id, CmEventKind::AddrResolved);
    let id = new_id();
    id.resolve_addr_timeout(None, addr("10.99.10.5:7471"), SHORT)
        .unwrap();
    assert_eq!(
        expect(&ch, &id, CmEventKind::AddrError).status,
        MINUS_ETIMEDOUT
    );

    // While a resolution is pending the id takes no other: EINVAL, as the
    // kernel's in ADDR_QUERY. Dropped while pending, it reports nothing.
    {
        let other = EventChannel::new().unwrap();
        let pending = CmId::new(&other, PortSpace::Tcp).unwrap();
        pending
            .resolve_addr_timeout(None, addr("10.99.8.78:7471"), Duration::from_secs(600))
            .unwrap();
        assert_eq!(
            pending
                .resolve_addr_timeout(None, addr("10.99.8.2:7471"), SHORT)
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            pending.resolve_route().unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(pending.peer_addr(), Some(addr("10.99.8.78:7471")));
        assert!(other.try_get_event().is_none());
    }

    // No route: the call fails at once.
    let id = new_id();
    let err = id
        .resolve_addr_timeout(None, addr("10.200.0.1:7471"), SHORT)
        .unwrap_err();
    assert_eq!(err.kind().errno(), 101, "ENETUNREACH: {err}");

    // Local destinations resolve at once, as before (the rendezvous).
    for dst in ["10.99.8.1:7471", "127.0.0.1:7471"] {
        let id = new_id();
        id.resolve_addr_timeout(None, addr(dst), SHORT).unwrap();
        let ev = ch.try_get_event().expect("ADDR_RESOLVED queued at once");
        assert_eq!((ev.kind, &ev.id), (CmEventKind::AddrResolved, &id), "{dst}");
    }
    assert!(ch.try_get_event().is_none());
    println!("child done");
}
