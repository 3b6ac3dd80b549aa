//! Checks that need processes of their own: several processes sharing one
//! host's loopback, configuration read from the environment and files, and
//! `RDMAV_ALLOW_DISASSOC_DESTROY`, which is read once per process.
//!
//! The binary is its own helper: `processes --child MODE` runs one child
//! scenario; without `--child` it runs every check as the parent (a filter
//! argument selects checks by name, as with libtest).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use rverbs::{devices, AccessFlags, AsyncEventElement, AsyncEventType, ErrorKind};

mod common;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let mode = args.get(i + 1).map(String::as_str).unwrap_or("");
        child(mode, &args[i + 2..]);
        return;
    }
    let filter: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let checks: &[(&str, fn())] = &[
        ("processes_get_their_own_loopback_address", own_addresses),
        ("rverbs_addr_sets_the_address", addr_env_sets_address),
        ("bad_rverbs_addr_is_a_clear_error", bad_addr_env),
        ("config_file_sets_the_devices", config_file),
        ("address_in_use_is_reported", address_in_use),
        ("disassociation_without_allow_destroy", disassoc_unset),
        ("disassociation_with_allow_destroy_1", disassoc_set),
        ("disassociation_with_allow_destroy_0", disassoc_zero),
        (
            "multicast_reaches_other_processes",
            multicast_across_processes,
        ),
        ("multicast_crosses_a_veth_link", multicast_across_namespaces),
        ("rverbs_gso_0_sends_packet_by_packet", gso_off),
    ];
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, check) in checks {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        ran += 1;
        match std::panic::catch_unwind(check) {
            Ok(()) => println!("test {name} ... ok"),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed.push(*name);
            }
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed",
        if failed.is_empty() { "ok" } else { "FAILED" },
        ran - failed.len(),
        failed.len()
    );
    if !failed.is_empty() {
        std::process::exit(1);
    }
}

/// Loopback address `n` of this test run: 127.X.Y.n with X.Y from the
/// process id, so concurrent runs do not compete for addresses.
fn addr(n: u8) -> String {
    let pid = std::process::id();
    format!("127.{}.{}.{n}", 1 + (pid >> 8) % 250, pid % 256)
}

/// A child of this binary in `mode`, with a clean rverbs environment.
fn child_cmd(mode: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.arg("--child").arg(mode).args(args);
    for var in [
        "RVERBS_ADDR",
        "RVERBS_CONFIG",
        "RVERBS_GSO",
        "RDMAV_ALLOW_DISASSOC_DESTROY",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

struct Output {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn run(mut cmd: Command) -> Output {
    let out = cmd.output().unwrap();
    let o = Output {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(!o.stderr.contains("panicked") || !o.ok, "{}", o.stderr);
    o
}

// ---- parent checks ----

/// `RVERBS_GSO=0`: every packet is a datagram of its own (sendmmsg still
/// batches the system calls), and a WRITE, a READ and a SEND spanning many
/// packets arrive whole; by default the same traffic goes in GSO batches.
fn gso_off() {
    let counts = |gso: Option<&str>| {
        let mut cmd = child_cmd("transfer", &[]);
        if let Some(v) = gso {
            cmd.env("RVERBS_GSO", v);
        }
        let o = run(cmd);
        assert!(o.ok, "{}{}", o.stdout, o.stderr);
        let f: Vec<u64> = o
            .stdout
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect();
        // Nothing refused or corrupt. Resends are allowed: on a loaded
        // host a late ACK fires the retransmission timer, or the receive
        // buffer overflows, and go-back-N is the right answer to either.
        assert_eq!(f[2..4], [0, 0], "tx errors, ICRC errors ({} resent)", f[4]);
        (f[0], f[1])
    };
    let (sends, packets) = counts(Some("0"));
    assert!(packets > 300, "{packets} packets");
    assert_eq!(sends, packets, "one datagram per packet without GSO");
    let (sends, packets) = counts(None);
    assert!(
        sends * 4 < packets,
        "GSO batches: {sends} sends, {packets} packets"
    );
}

fn own_addresses() {
    // Three processes, no configuration: each gets its own address and GID.
    let mut children: Vec<_> = (0..3)
        .map(|_| {
            child_cmd("hold", &[])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut lines = Vec::new();
    for c in &mut children {
        let mut line = String::new();
        BufReader::new(c.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        lines.push(line.trim().to_string());
    }
    for c in &mut children {
        drop(c.stdin.take());
        assert!(c.wait().unwrap().success());
    }
    let addrs: std::collections::HashSet<_> = lines.iter().map(|l| l.split(' ').nth(1)).collect();
    assert_eq!(addrs.len(), 3, "{lines:?}");
    for l in &lines {
        let f: Vec<&str> = l.split(' ').collect();
        assert_eq!(f[0], "rverbs0", "{l}");
        assert!(f[1].starts_with("127.0.0."), "{l}");
        assert_eq!(f[2], format!("::ffff:{}", f[1]), "{l}");
    }
}

fn addr_env_sets_address() {
    let ip = addr(77);
    let mut cmd = child_cmd("show", &[]);
    cmd.env("RVERBS_ADDR", &ip);
    let o = run(cmd);
    assert!(o.ok, "{}", o.stderr);
    let v4: std::net::Ipv4Addr = ip.parse().unwrap();
    let guid = 0x5256_45ff_0000_0000u64 | u64::from(u32::from(v4));
    assert_eq!(
        o.stdout.trim(),
        format!("rverbs0 {ip} ::ffff:{ip} {guid:016x}")
    );
}

fn bad_addr_env() {
    for (value, needle) in [
        ("127.0.0.300", "not an IP address"),
        ("198.51.100.7", "not an address of this host"),
        ("", "empty"),
    ] {
        let mut cmd = child_cmd("show", &[]);
        cmd.env("RVERBS_ADDR", value);
        let o = run(cmd);
        assert!(!o.ok, "{value}: {}", o.stdout);
        assert!(o.stderr.contains("RVERBS_ADDR"), "{value}: {}", o.stderr);
        assert!(o.stderr.contains(needle), "{value}: {}", o.stderr);
        assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    }
    let mut cmd = child_cmd("show", &[]);
    cmd.env("RVERBS_CONFIG", "/nonexistent/rverbs.toml");
    let o = run(cmd);
    assert!(!o.ok && o.stderr.contains("RVERBS_CONFIG"), "{}", o.stderr);
}

fn config_file() {
    let path = std::env::temp_dir().join(format!("rverbs-proc-{}.toml", std::process::id()));
    let ip = addr(81);
    std::fs::write(
        &path,
        format!("[[device]]\nname = \"east\"\naddr = \"{ip}\"\n\n[[device]]\naddr = \"auto\"\n"),
    )
    .unwrap();
    let mut cmd = child_cmd("show", &[]);
    cmd.env("RVERBS_CONFIG", &path);
    let o = run(cmd);
    std::fs::remove_file(&path).unwrap();
    assert!(o.ok, "{}", o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", o.stdout);
    assert!(lines[0].starts_with(&format!("east {ip} ")), "{}", o.stdout);
    assert!(lines[1].starts_with("rverbs0 127.0.0."), "{}", o.stdout);
}

fn address_in_use() {
    let ip = addr(91);
    let mut holder = child_cmd("hold", &[])
        .env("RVERBS_ADDR", &ip)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains(&ip), "{line}");
    let mut cmd = child_cmd("show", &[]);
    cmd.env("RVERBS_ADDR", &ip);
    let o = run(cmd);
    drop(holder.stdin.take());
    holder.wait().unwrap();
    assert!(!o.ok);
    assert!(
        o.stderr.contains("taken by another process"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("RVERBS_ADDR"), "{}", o.stderr);
}

fn disassoc(env: Option<&str>, expect: &str) {
    let mut cmd = child_cmd("disassociate", &[expect]);
    if let Some(v) = env {
        cmd.env("RDMAV_ALLOW_DISASSOC_DESTROY", v);
    }
    let o = run(cmd);
    assert!(o.ok, "child failed:\n{}\n{}", o.stdout, o.stderr);
    assert_eq!(o.stdout.trim(), format!("disassociated: {expect}"));
}

fn disassoc_unset() {
    disassoc(None, "eio");
}

fn disassoc_set() {
    disassoc(Some("1"), "allowed");
}

fn disassoc_zero() {
    // "0" means not set.
    disassoc(Some("0"), "eio");
}

/// Two receiver processes attach a UD QP each to one multicast group; a
/// third process, attached to nothing, sends one datagram to the group.
fn multicast_across_processes() {
    let pid = std::process::id();
    let group = format!("239.{}.{}.7", 1 + (pid >> 8) % 250, pid % 256);
    let mut receivers = Vec::new();
    for n in [1, 2] {
        let mut cmd = child_cmd("mcast-recv", &[&group]);
        cmd.env("RVERBS_ADDR", addr(n))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "joined", "receiver {n}");
        receivers.push((child, out));
    }
    let mut send = child_cmd("mcast-send", &[&group]);
    send.env("RVERBS_ADDR", addr(3));
    let sent = run(send);
    assert!(sent.ok, "sender: {}", sent.stderr);
    for (n, (mut child, mut out)) in receivers.into_iter().enumerate() {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(line.trim(), "got hello group", "receiver {}", n + 1);
        assert!(status.success(), "receiver {}", n + 1);
    }
}

/// Two hosts: network namespaces joined by a veth pair; a receiver in one
/// attaches to a group, a sender in the other sends to it. Needs root and
/// iproute2 (skipped without, unless `CI` is set).
fn multicast_across_namespaces() {
    let Some(ip) = common::find_tool("ip").filter(|_| common::is_root()) else {
        assert!(std::env::var_os("CI").is_none(), "needs root and ip in CI");
        eprintln!("skipped: needs root and ip (iproute2)");
        return;
    };
    let pid = std::process::id();
    let (na, nb) = (format!("rvmca{pid}"), format!("rvmcb{pid}"));
    let sh = |args: &[&str]| {
        common::run(&ip, args);
    };
    let mut nets = common::Namespaces::new(&ip);
    nets.add(&na);
    nets.add(&nb);
    sh(&[
        "link", "add", "rvma0", "netns", &na, "type", "veth", "peer", "name", "rvmb0", "netns", &nb,
    ]);
    for (ns, dev, addr) in [
        (&na, "rvma0", "10.98.0.1/24"),
        (&nb, "rvmb0", "10.98.0.2/24"),
    ] {
        sh(&["-n", ns, "addr", "add", addr, "dev", dev]);
        sh(&["-n", ns, "link", "set", dev, "up"]);
        sh(&["-n", ns, "link", "set", "lo", "up"]);
    }
    let group = format!("239.{}.{}.9", 1 + (pid >> 8) % 250, pid % 256);
    let exe = std::env::current_exe().unwrap();
    let in_ns = |ns: &str, mode: &str, addr: &str| {
        let mut c = Command::new(&ip);
        c.args(["netns", "exec", ns])
            .arg(&exe)
            .args(["--child", mode, &group])
            .env_remove("RVERBS_CONFIG")
            .env("RVERBS_ADDR", addr);
        c
    };
    let mut recv = in_ns(&na, "mcast-recv", "10.98.0.1");
    recv.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = recv.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "joined");
    let sent = run(in_ns(&nb, "mcast-send", "10.98.0.2"));
    assert!(sent.ok, "sender: {}", sent.stderr);
    line.clear();
    out.read_line(&mut line).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(line.trim(), "got hello group");
    assert!(status.success());
}

// ---- children ----

/// Two contexts on the default device: a 1 MiB WRITE, a 256 KiB READ and
/// a 60 kB SEND between them, each checked byte for byte; prints the
/// device's datagrams, packets, send errors, ICRC errors and resent
/// packets.
fn child_transfer() {
    use rverbs::cm::{ConnectOptions, Endpoint};
    use rverbs::{QpCaps, RecvWr, SendWr, Sge, WcStatus, WorkCompletion, WrOpcode};
    let dev = &devices().unwrap()[0];
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let sides: Vec<_> = (0..2)
        .map(|_| {
            let ctx = dev.open().unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(64).unwrap();
            let qp = pd
                .qp_builder(&cq, &cq)
                .caps(QpCaps {
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                })
                .build()
                .unwrap();
            let mr = pd.alloc_mr(4 << 20, all).unwrap();
            (ctx, pd, cq, qp, mr)
        })
        .collect();
    let (a, b) = (&sides[0], &sides[1]);
    let ea = Endpoint::for_qp(&a.3).with_buffer(&a.4);
    let eb = Endpoint::for_qp(&b.3).with_buffer(&b.4);
    let opts = ConnectOptions::default();
    a.3.connect(ea.psn, &eb, &opts).unwrap();
    b.3.connect(eb.psn, &ea, &opts).unwrap();
    let sge = |mr: &rverbs::MemoryRegion, off: u64, len: u32| Sge {
        addr: mr.iova() + off,
        length: len,
        lkey: mr.lkey(),
    };
    let wait = |cq: &rverbs::CompletionQueue| {
        let mut wc = [WorkCompletion::default(); 1];
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while cq.poll(&mut wc).unwrap() == 0 {
            assert!(std::time::Instant::now() < deadline, "no completion");
        }
        assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
    };
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 13 + i / 251) as u8).collect();
    a.4.write_at(0, &data).unwrap();
    // WRITE 1 MiB from A into B at 1 MiB.
    let write = WrOpcode::RdmaWrite {
        remote_addr: eb.addr + (1 << 20),
        rkey: eb.rkey,
    };
    a.3.post_send(&SendWr::new(1, write, &[sge(&a.4, 0, 1 << 20)]).signaled())
        .unwrap();
    wait(&a.2);
    let mut got = vec![0u8; 1 << 20];
    b.4.read_at(1 << 20, &mut got).unwrap();
    assert!(got == data, "WRITE data differs");
    // READ 256 KiB of it back into A at 2 MiB.
    let read = WrOpcode::RdmaRead {
        remote_addr: eb.addr + (1 << 20) + 4096,
        rkey: eb.rkey,
    };
    a.3.post_send(&SendWr::new(2, read, &[sge(&a.4, 2 << 20, 256 << 10)]).signaled())
        .unwrap();
    wait(&a.2);
    let mut got = vec![0u8; 256 << 10];
    a.4.read_at(2 << 20, &mut got).unwrap();
    assert!(
        got[..] == data[4096..4096 + (256 << 10)],
        "READ data differs"
    );
    // SEND 60 kB from A's start into B at 3 MiB.
    b.3.post_recv(&RecvWr::new(3, &[sge(&b.4, 3 << 20, 65536)]))
        .unwrap();
    a.3.post_send(&SendWr::new(4, WrOpcode::Send, &[sge(&a.4, 0, 60_000)]).signaled())
        .unwrap();
    wait(&a.2);
    wait(&b.2);
    let mut got = vec![0u8; 60_000];
    b.4.read_at(3 << 20, &mut got).unwrap();
    assert!(got[..] == data[..60_000], "SEND data differs");
    let stats = dev.net_stats();
    println!(
        "{} {} {} {} {}",
        stats.tx_sends,
        stats.tx_packets,
        stats.tx_errors,
        stats.rx_icrc_errors,
        stats.retransmitted
    );
}

fn child(mode: &str, args: &[String]) {
    match mode {
        "show" | "hold" => match devices() {
            Ok(list) => {
                for d in &list {
                    println!("{} {} {} {:016x}", d.name(), d.addr(), d.gid(), d.guid());
                }
                std::io::stdout().flush().unwrap();
                if mode == "hold" {
                    // Keep the device (and its address) until the parent closes stdin.
                    let mut sink = String::new();
                    let _ = std::io::stdin().read_line(&mut sink);
                }
            }
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(2);
            }
        },
        "disassociate" => child_disassociate(args.first().map(String::as_str) == Some("allowed")),
        "mcast-recv" => child_multicast(&args[0], false),
        "mcast-send" => child_multicast(&args[0], true),
        "transfer" => child_transfer(),
        other => panic!("unknown child mode {other:?}"),
    }
}

fn child_disassociate(allowed: bool) {
    assert_eq!(rverbs::allow_disassoc_destroy(), allowed);
    let dev = devices().unwrap().remove(0);
    let ctx = dev.open().unwrap();
    let ch = std::sync::Arc::new(ctx.create_comp_channel().unwrap());
    let cq = ctx.cq_builder().cqe(8).channel(&ch).build().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let blocked = {
        let ch = ch.clone();
        std::thread::spawn(move || ch.get_cq_event().map(|_| ()))
    };
    std::thread::sleep(Duration::from_millis(50));

    dev.disassociate();

    // The blocked reader wakes with EIO.
    assert_eq!(blocked.join().unwrap().unwrap_err().kind(), ErrorKind::Io);
    // IBV_EVENT_DEVICE_FATAL is delivered, then the async fd reports EIO.
    let ev = ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type(), AsyncEventType::DeviceFatal);
    assert_eq!(ev.element(), AsyncEventElement::Device);
    drop(ev);
    assert_eq!(ctx.get_async_event().unwrap_err().kind(), ErrorKind::Io);
    // Later verbs fail with EIO.
    assert_eq!(ctx.query_device().unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(ctx.query_port(1).unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(ctx.alloc_pd().unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(ctx.create_cq(4).unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(ctx.create_comp_channel().unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(
        pd.reg_mr(vec![0u8; 8], AccessFlags::empty())
            .unwrap_err()
            .kind(),
        ErrorKind::Io
    );
    assert_eq!(cq.req_notify(false).unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(cq.resize(4).unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(ch.get_cq_event().unwrap_err().kind(), ErrorKind::Io);
    // The device is gone from the list and cannot be opened.
    assert!(devices().unwrap().iter().all(|d| d != &dev));
    assert_eq!(dev.open().unwrap_err().kind(), ErrorKind::NoDevice);
    // Memory the MR owns is still the program's.
    mr.write_at(0, b"mine").unwrap();

    let ch = std::sync::Arc::try_unwrap(ch).unwrap();
    if allowed {
        // Destroy verbs succeed, in any order, skipping their EBUSY checks…
        pd.dealloc().unwrap();
        cq.destroy().unwrap();
        assert_eq!(mr.dereg().unwrap().unwrap()[..4], *b"mine");
    } else {
        let e = cq.destroy().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(
            e.error().message().contains("RDMAV_ALLOW_DISASSOC_DESTROY"),
            "{e}"
        );
        let cq = e.into_inner();
        let pd = pd.dealloc().unwrap_err().into_inner();
        let mr = mr.dereg().unwrap_err().into_inner();
        assert_eq!(ctx.resources().total(), 4, "nothing was destroyed");
        // Dropping still releases everything safely.
        drop((mr, pd, cq));
    }
    // …but destroying a completion channel is no device command: as in
    // libibverbs it never fails with EIO and is EBUSY only while CQs use it.
    ch.destroy().unwrap();
    assert_eq!(ctx.resources().total(), 0);
    ctx.close().unwrap();
    // Read once per process: changing the variable now changes nothing.
    if allowed {
        std::env::remove_var("RDMAV_ALLOW_DISASSOC_DESTROY");
    } else {
        std::env::set_var("RDMAV_ALLOW_DISASSOC_DESTROY", "1");
    }
    assert_eq!(rverbs::allow_disassoc_destroy(), allowed);
    println!("disassociated: {}", if allowed { "allowed" } else { "eio" });
}

/// A UD QP with Q_Key 0x5eed: attached to `group` and waiting for one
/// datagram (`send` false), or sending one to it.
fn child_multicast(group: &str, send: bool) {
    use rverbs::{AhAttr, Gid, QpType, RecvWr, SendWr, WorkCompletion, WrOpcode};
    const QKEY: u32 = 0x5eed;
    let dev = &devices().unwrap()[0];
    let ctx = dev.open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let caps = rverbs::QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = pd
        .qp_builder(&cq, &cq)
        .qp_type(QpType::Ud)
        .caps(caps)
        .build()
        .unwrap();
    common::ud_to_rts(&qp, QKEY);
    let mgid = Gid::from_ip(group.parse().unwrap());
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mut wc = [WorkCompletion::default(); 1];
    let poll = |wc: &mut [WorkCompletion; 1]| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while cq.poll(wc).unwrap() == 0 {
            assert!(std::time::Instant::now() < deadline, "no completion");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(wc[0].is_success(), "{:?}", wc[0]);
    };
    if send {
        let ah = pd
            .create_ah(&AhAttr {
                dgid: mgid,
                ..AhAttr::default()
            })
            .unwrap();
        qp.post_send(
            &SendWr::inline(1, WrOpcode::Send, b"hello group")
                .signaled()
                .to(&ah, 0xff_ffff, QKEY),
        )
        .unwrap();
        poll(&mut wc);
        return;
    }
    qp.attach_mcast(mgid, 0).unwrap();
    let sge = rverbs::Sge {
        addr: mr.iova(),
        length: 4096,
        lkey: mr.lkey(),
    };
    qp.post_recv(&RecvWr::new(1, &[sge])).unwrap();
    println!("joined");
    std::io::stdout().flush().unwrap();
    poll(&mut wc);
    let mut data = vec![0u8; wc[0].byte_len as usize - 40];
    mr.read_at(40, &mut data).unwrap();
    println!("got {}", String::from_utf8_lossy(&data));
}
