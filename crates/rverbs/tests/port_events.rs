//! The port follows the device's address: a device on an address of a veth
//! interface in its own network namespace sees IBV_EVENT_PORT_ERR (and a
//! DOWN port) when the address is deleted, IBV_EVENT_PORT_ACTIVE (and an
//! ACTIVE port) when it is added back.
//!
//! The test binary is its own peer: the parent makes the namespace and runs
//! `ip netns exec NS <this binary> --exact port_follows_the_address` with
//! `RVERBS_PORT_ROLE=child`; the child opens the device and reports each
//! step on stdout, and the parent changes the address between the steps.
//! Needs root and `ip` (iproute2); without them it is skipped, unless `CI`
//! is set.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use rverbs::{devices, AsyncEventElement, AsyncEventType, PortState};

mod common;
use common::{find_tool, is_root, run, Namespaces};

const ROLE: &str = "RVERBS_PORT_ROLE";
const ADDR: &str = "10.99.7.1";

#[test]
fn port_follows_the_address() {
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
    let name = format!("rvport{}", std::process::id());
    let mut nets = Namespaces::new(&ip);
    nets.add(&name);
    let n = name.as_str();
    run(&ip, &["-n", n, "link", "set", "lo", "up"]);
    // Both ends of a veth pair in the namespace (dummy interfaces need a
    // kernel module hosts often lack).
    run(
        &ip,
        &[
            "-n", n, "link", "add", "d0", "type", "veth", "peer", "name", "d1",
        ],
    );
    run(&ip, &["-n", n, "link", "set", "d0", "up"]);
    run(&ip, &["-n", n, "link", "set", "d1", "up"]);
    let cidr = format!("{ADDR}/24");
    run(&ip, &["-n", n, "addr", "add", &cidr, "dev", "d0"]);
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(&ip)
        .args(["netns", "exec", n])
        .arg(&exe)
        .args(["--exact", "port_follows_the_address", "--nocapture"])
        .env(ROLE, "child")
        .env("RVERBS_ADDR", ADDR)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut expect = |want: &str| loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("the child ended before saying {want}"))
            .unwrap();
        if line == want {
            break;
        }
    };
    expect("ready");
    run(&ip, &["-n", n, "addr", "del", &cidr, "dev", "d0"]);
    expect("down");
    run(&ip, &["-n", n, "addr", "add", &cidr, "dev", "d0"]);
    expect("up");
    let status = child.wait().unwrap();
    assert!(status.success(), "child: {status}");
}

/// Waits for the next async event and checks it is `want` on port 1.
fn expect_port_event(ctx: &rverbs::Context, want: AsyncEventType) {
    let ev = ctx
        .get_async_event_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap_or_else(|| panic!("no {want:?} within 10 s"));
    assert_eq!(ev.event_type(), want);
    assert_eq!(ev.element(), AsyncEventElement::Port(1));
}

fn child() {
    let dev = &devices().unwrap()[0];
    let ctx = dev.open().unwrap();
    assert_eq!(ctx.query_port(1).unwrap().state, PortState::Active);
    println!("ready");
    expect_port_event(&ctx, AsyncEventType::PortErr);
    let port = ctx.query_port(1).unwrap();
    assert_eq!(port.state, PortState::Down);
    assert_eq!(port.phys_state, rverbs::attr::PHYS_STATE_DISABLED);
    println!("down");
    expect_port_event(&ctx, AsyncEventType::PortActive);
    assert_eq!(ctx.query_port(1).unwrap().state, PortState::Active);
    println!("up");
}
