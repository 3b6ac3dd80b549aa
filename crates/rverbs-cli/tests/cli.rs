//! The `rverbs` command as a user runs it.

use std::process::Command;

fn rverbs(args: &[&str], addr: Option<&str>) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rverbs"));
    cmd.args(args)
        .env_remove("RVERBS_CONFIG")
        .env_remove("RVERBS_ADDR");
    if let Some(a) = addr {
        cmd.env("RVERBS_ADDR", a);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// Loopback address `n` of this test run: 127.X.Y.n with X.Y from the
/// process id, so concurrent runs do not compete for addresses.
fn addr(n: u8) -> String {
    let pid = std::process::id();
    format!("127.{}.{}.{n}", 1 + (pid >> 8) % 250, pid % 256)
}

/// The node GUID rverbs derives from an IPv4 address, as ibv_devinfo prints it.
fn guid_of(ip: &str) -> String {
    let o: Vec<u8> = ip.split('.').map(|x| x.parse().unwrap()).collect();
    format!(
        "5256:45ff:{:02x}{:02x}:{:02x}{:02x}",
        o[0], o[1], o[2], o[3]
    )
}

fn field<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.trim_start().strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .trim()
}

#[test]
fn devinfo_prints_the_fields_ibv_devinfo_prints() {
    let ip = addr(55);
    let (ok, out, err) = rverbs(&["devinfo"], Some(&ip));
    assert!(ok, "{err}");
    assert!(out.starts_with("hca_id:\trverbs0\n"), "{out}");
    assert_eq!(field(&out, "transport"), "InfiniBand (0)");
    assert_eq!(field(&out, "node_guid"), guid_of(&ip));
    assert_eq!(field(&out, "sys_image_guid"), guid_of(&ip));
    assert_eq!(field(&out, "vendor_id"), "0x525645");
    assert_eq!(field(&out, "phys_port_cnt"), "1");
    assert!(out.contains("\t\tport:\t1\n"), "{out}");
    assert_eq!(field(&out, "state"), "PORT_ACTIVE (4)");
    assert_eq!(field(&out, "max_mtu"), "4096 (5)");
    assert_eq!(field(&out, "active_mtu"), "4096 (5)");
    assert_eq!(field(&out, "port_lid"), "0");
    assert_eq!(field(&out, "link_layer"), "Ethernet");
    assert_eq!(
        field(&out, "endpoint (rverbs)"),
        format!("{ip}:4791 UDP on lo")
    );
    assert!(!out.contains("max_qp:"), "not verbose");
}

#[test]
fn devinfo_verbose_adds_limits_port_details_and_gids() {
    let ip = addr(56);
    let (ok, out, err) = rverbs(&["devinfo", "-v"], Some(&ip));
    assert!(ok, "{err}");
    for name in [
        "max_qp",
        "max_qp_wr",
        "max_cqe",
        "max_mr",
        "max_pd",
        "max_qp_rd_atom",
        "num_comp_vectors",
    ] {
        let v: u64 = field(&out, name).parse().unwrap();
        assert!(v > 0, "{name}");
    }
    assert_eq!(field(&out, "atomic_cap"), "ATOMIC_HCA (1)");
    assert_eq!(field(&out, "phys_state"), "LINK_UP (5)");
    assert_eq!(field(&out, "gid_tbl_len"), "1");
    assert_eq!(field(&out, "pkey_tbl_len"), "1");
    assert!(
        out.contains(&format!("\t\t\tGID[  0]:\t\t::ffff:{ip}, RoCE v2\n")),
        "{out}"
    );
}

#[test]
fn devinfo_list_device_and_port_options() {
    let (ok, out, _) = rverbs(&["devinfo", "-l"], Some(&addr(57)));
    assert!(ok);
    assert_eq!(out, "1 HCA found:\n\trverbs0\n\n");

    let (ok, out, _) = rverbs(&["devinfo", "-d", "rverbs0", "-i", "1"], Some(&addr(57)));
    assert!(ok);
    assert!(out.contains("hca_id:\trverbs0"));

    let (ok, _, err) = rverbs(&["devinfo", "-d", "mlx5_0"], Some(&addr(57)));
    assert!(!ok);
    assert!(err.contains("IB device 'mlx5_0' wasn't found"), "{err}");

    let (ok, _, err) = rverbs(&["devinfo", "-i", "2"], Some(&addr(57)));
    assert!(!ok);
    assert!(err.contains("Invalid port requested"), "{err}");

    let (ok, _, _) = rverbs(&["devinfo", "-i", "0"], Some(&addr(57)));
    assert!(!ok, "port 0 is refused by the parser");
}

#[test]
fn two_configured_devices_are_both_listed() {
    let (a, b) = (addr(58), addr(59));
    let (ok, out, err) = rverbs(&["devices"], Some(&format!("{a},lab={b}")));
    assert!(ok, "{err}");
    let hex = |ip: &str| guid_of(ip).replace(':', "");
    assert_eq!(
        out,
        format!(
            "    device          \t   node GUID\n    ------          \t----------------\n    \
             rverbs0         \t{}\n    lab             \t{}\n",
            hex(&a),
            hex(&b)
        )
    );
}

#[test]
fn default_device_is_on_loopback() {
    let (ok, out, err) = rverbs(&["devinfo"], None);
    assert!(ok, "{err}");
    assert!(
        field(&out, "endpoint (rverbs)").starts_with("127.0.0."),
        "{out}"
    );
}

#[test]
fn bad_configuration_is_a_clear_error_not_a_panic() {
    let (ok, out, err) = rverbs(&["devinfo"], Some("127.0.0.1:99"));
    assert!(!ok);
    assert!(out.is_empty());
    assert!(
        err.starts_with("rverbs: Failed to get IB devices list: "),
        "{err}"
    );
    assert!(err.contains("RVERBS_ADDR=\"127.0.0.1:99\""), "{err}");
    assert!(err.contains("port is always 4791"), "{err}");
    assert!(!err.contains("panicked"));
}

/// `rverbs counters` asks a running program for its device's counters: a
/// ping-pong server waiting for its client shows them, by pid, in text and
/// JSON; once it is gone, asking for its pid is an error.
#[test]
fn counters_of_a_running_program() {
    let server_addr = addr(31);
    let mut server = Command::new(env!("CARGO_BIN_EXE_rverbs"))
        .args(["pingpong", "--transport", "ud", "-p", "0", "-n", "1000000"])
        .env("RVERBS_ADDR", &server_addr)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = server.id().to_string();
    let ask = |args: &[&str]| {
        let mut all = vec!["counters", "--pid", &pid];
        all.extend_from_slice(args);
        rverbs(&all, None)
    };
    // The server opens its device before it listens: wait for it.
    let mut text = String::new();
    for _ in 0..100 {
        let (ok, out, _) = ask(&["--all"]);
        if ok {
            text = out;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (ok, json, err) = ask(&["--json", "--all"]);
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        text.starts_with(&format!("pid {pid} device rverbs0 ({server_addr})")),
        "{text}"
    );
    for counter in [
        "rx_packets",
        "rx_icrc_errors",
        "rx_ip_id_solved",
        "rx_bad_pkey",
    ] {
        assert!(text.contains(counter), "{counter} missing:\n{text}");
    }
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v[0]["device"], "rverbs0");
    assert_eq!(v[0]["pid"].as_u64().unwrap().to_string(), pid);
    assert_eq!(v[0]["counters"]["rx_icrc_errors"], 0);
    // The server is gone: nothing to ask.
    let (ok, _, err) = ask(&[]);
    assert!(!ok && err.contains("no rverbs device"), "{err}");
}

/// The latency test and the bandwidth tests share one QP and CQ: a ping's
/// own send completion may arrive after its reply, and once one was left in
/// the CQ for the WRITE test, which counted it as its own and (its window
/// arithmetic wrapped) never posted again — a hang in about half the runs
/// of `--tests lat,write`. Several rounds of both, busy-polling and in
/// event mode (`--event`: both sides sleep on completion channels), must
/// finish.
#[test]
fn bench_latency_then_bandwidth_finishes() {
    use std::time::{Duration, Instant};
    for mode in [None, Some("--event")] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rverbs"))
            .arg("bench")
            .args(mode)
            .args([
                "--tests",
                "lat,write,send",
                "--iters",
                "300",
                "--sizes",
                "4096",
                "--bytes",
                "4194304",
                "--rounds",
                "3",
                "--no-baseline",
                "--quiet",
                "--json",
            ])
            .env_remove("RVERBS_CONFIG")
            .env_remove("RVERBS_ADDR")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("rverbs bench {mode:?} --tests lat,write,send did not finish in 120 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        for test in ["send_lat", "rdma_write", "\"send\""] {
            assert!(stdout.contains(test), "no {test} row in {stdout}");
        }
        // Every row says how many packets were resent, and what CPU time
        // its rverbs side cost.
        for field in ["\"retransmitted\"", "\"cpu\""] {
            assert_eq!(stdout.matches(field).count(), 3, "{field} in {stdout}");
        }
    }
}
