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

/// `devinfo --json`: the same attributes as one JSON array, numbers as
/// numbers, ports with their GIDs.
#[test]
fn devinfo_json_is_the_same_device_as_data() {
    let ip = addr(60);
    let (ok, out, err) = rverbs(&["devinfo", "--json"], Some(&ip));
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let d = &v[0];
    assert_eq!(d["hca_id"], "rverbs0");
    assert_eq!(d["address"], ip.as_str());
    assert_eq!(d["node_guid"], guid_of(&ip).as_str());
    assert_eq!(d["phys_port_cnt"], 1);
    assert!(d["max_qp"].as_u64().unwrap() > 0, "{d}");
    let port = &d["ports"][0];
    assert_eq!(port["state"], "PORT_ACTIVE");
    assert_eq!(port["active_mtu"], 4096);
    assert_eq!(port["link_layer"], "Ethernet");
    assert_eq!(port["gids"][0]["gid"], format!("::ffff:{ip}"));
    assert_eq!(port["gids"][0]["type"], "RoCE v2");
    let (ok, _, err) = rverbs(&["devinfo", "--json", "-i", "2"], Some(&ip));
    assert!(!ok && err.contains("Invalid port"), "{err}");
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
    // ibv_devices' table of this process's devices; the devices of other
    // programs running now (other tests) may follow after a blank line.
    let own = out.split("\n\n").next().unwrap();
    assert_eq!(
        own.trim_end_matches('\n'),
        format!(
            "    device          \t   node GUID\n    ------          \t----------------\n    \
             rverbs0         \t{}\n    lab             \t{}",
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
    // `rverbs stat PID|DEVICE` is the same, and `rverbs devices` lists it.
    let (stat_ok, by_pid, _) = rverbs(&["stat", &pid, "--all"], None);
    let (_, by_addr, _) = rverbs(&["stat", &server_addr], None);
    let (_, devices, _) = rverbs(&["devices"], None);
    let (bad_ok, _, bad) = rverbs(&["stat", "no-such-device"], None);
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
    assert!(stat_ok && by_pid.contains("rx_icrc_errors"), "{by_pid}");
    assert!(
        by_addr.starts_with(&format!("pid {pid} device rverbs0 ({server_addr})")),
        "{by_addr}"
    );
    assert!(
        devices
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == [pid.as_str(), "rverbs0", server_addr.as_str()]),
        "rverbs devices:\n{devices}"
    );
    assert!(!bad_ok && bad.contains("no-such-device"), "{bad}");
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
    for mode in [None, Some("--event")] {
        let mut args = vec![
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
            "--no-memcpy",
        ];
        args.extend(mode);
        let (rows, _) = bench_json(&args, std::time::Duration::from_secs(120));
        // Each test over each path, the paths' rows one after the other.
        let tests: Vec<(&str, &str)> = rows
            .iter()
            .map(|r| (r["test"].as_str().unwrap(), r["path"].as_str().unwrap()))
            .collect();
        assert_eq!(
            tests,
            [
                ("send_lat", "same-host"),
                ("send_lat", "wire"),
                ("rdma_write", "same-host"),
                ("rdma_write", "wire"),
                ("send", "same-host"),
                ("send", "wire")
            ],
            "{rows:?}"
        );
        // Every row says how many packets were resent, and what CPU time
        // its rverbs side cost.
        for row in &rows {
            assert!(row["retransmitted"].is_u64(), "{row}");
            assert!(num(row, "cpu") > 0.0, "{row}");
        }
    }
}

/// Runs `rverbs bench ARGS --json --quiet` to the end (killed and failed
/// after `limit`), and returns its JSON rows and how long it ran.
fn bench_json(args: &[&str], limit: std::time::Duration) -> (Vec<serde_json::Value>, f64) {
    let (rows, took, _) = bench_run(args, &[], limit);
    (rows, took)
}

/// [`bench_json`] with `env` added to the command's environment; also
/// returns what it said on stderr.
fn bench_run(
    args: &[&str],
    env: &[(&str, &str)],
    limit: std::time::Duration,
) -> (Vec<serde_json::Value>, f64, String) {
    use std::time::Instant;
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rverbs"))
        .arg("bench")
        .args(args)
        .args(["--json", "--quiet"])
        .env_remove("RVERBS_CONFIG")
        .env_remove("RVERBS_ADDR")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read stdout as it comes: a full pipe would stall the child.
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut text).unwrap();
        text
    });
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("rverbs bench {args:?} did not finish in {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let took = start.elapsed().as_secs_f64();
    let out = child.wait_with_output().unwrap();
    let stdout = reader.join().unwrap();
    assert!(
        out.status.success(),
        "rverbs bench {args:?}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("rverbs bench {args:?} printed no JSON ({e}):\n{stdout}"));
    (
        rows,
        took,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn num(v: &serde_json::Value, field: &str) -> f64 {
    v[field]
        .as_f64()
        .unwrap_or_else(|| panic!("no number {field} in {v}"))
}

/// A quick latency and 4 KiB WRITE run, for the tests of bench modes.
const SMALL_LAT_AND_WRITE: [&str; 8] = [
    "--tests",
    "lat,write",
    "--sizes",
    "4096",
    "--bytes",
    "1048576",
    "--iters",
    "100",
];

/// `--udp-pair`: the latency test gets a second row whose baseline is a
/// UDP ping-pong of RoCE's pair per hop (busy-polled, and blocking with
/// `--udp-blocking`), with its own figures and ratio; with `--pairs 2`
/// each pair runs both rows.
#[test]
fn bench_udp_pair_adds_a_latency_row_against_roces_pair() {
    for (extra, label, pairs) in [
        (vec![], "udp pair ping-pong", 1),
        (
            vec!["--udp-blocking", "--pairs", "2"],
            "udp pair blocking",
            2,
        ),
    ] {
        let mut args = vec![
            "--path",
            "wire",
            "--tests",
            "lat",
            "--iters",
            "200",
            "--rounds",
            "2",
            "--udp-pair",
        ];
        args.extend(extra);
        let (rows, _) = bench_json(&args, std::time::Duration::from_secs(300));
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(rows[0]["test"], "send_lat", "{rows:?}");
        assert_eq!(rows[1]["test"], "send_lat", "{rows:?}");
        assert_ne!(rows[0]["baseline"], rows[1]["baseline"], "{rows:?}");
        assert_eq!(rows[1]["baseline"], label, "{rows:?}");
        for row in &rows {
            assert!(num(row, "baseline_value") > 0.0, "{row}");
            assert!(num(row, "ratio") > 0.0, "{row}");
            assert_eq!(row["baseline_messages"], 200 * pairs, "{row}");
        }
    }
}

/// `--pairs 2`: two client/server process pairs run each phase at once,
/// the baselines too. Every row has both pairs' own figures, each pair
/// made progress on both sides, and the row's figures are theirs together.
#[test]
fn bench_pairs_report_every_pair() {
    for mode in [None, Some("--event")] {
        let mut args = vec!["--pairs", "2", "--rounds", "2", "--no-memcpy"];
        args.extend(SMALL_LAT_AND_WRITE);
        args.extend(mode);
        let (rows, _) = bench_json(&args, std::time::Duration::from_secs(300));
        // Latency, then the WRITE, each over the same-host path and the wire.
        assert_eq!(rows.len(), 4, "{rows:?}");
        for row in &rows {
            assert_eq!(row["pairs"], 2, "{row}");
            assert_eq!(row["placement"], "unpinned", "{row}");
            assert_eq!(row["baseline_placement"], "unpinned", "{row}");
            let pairs = row["per_pair"].as_array().expect("per_pair");
            assert_eq!(pairs.len(), 2, "{row}");
            let mut messages = 0.0;
            for (i, pair) in pairs.iter().enumerate() {
                assert_eq!(pair["pair"], i + 1, "{row}");
                assert!(
                    num(pair, "messages") > 0.0,
                    "a pair made no progress: {row}"
                );
                assert!(num(pair, "baseline_messages") > 0.0, "{row}");
                assert!(num(pair, "baseline_value") > 0.0, "{row}");
                assert!(num(pair, "ratio") > 0.0, "{row}");
                messages += num(pair, "messages");
            }
            assert_eq!(num(row, "messages"), messages, "{row}");
            assert!(num(row, "ratio") > 0.0, "{row}");
            assert!(row["worst_pair"].is_number(), "{row}");
        }
        for (i, path) in ["same-host", "wire"].into_iter().enumerate() {
            let (lat, write) = (&rows[i], &rows[2 + i]);
            assert_eq!(lat["test"], "send_lat");
            assert_eq!(lat["path"], path, "{lat}");
            // 100 round trips in 2 rounds, per pair.
            assert_eq!(num(lat, "messages"), 200.0, "{lat}");
            assert!(num(lat, "p99_us") >= num(lat, "median_us"), "{lat}");
            assert!(
                num(lat, "baseline_p99_us") >= num(lat, "baseline_value"),
                "{lat}"
            );
            for pair in lat["per_pair"].as_array().unwrap() {
                assert!(num(pair, "p99_us") >= num(pair, "median_us"), "{lat}");
                assert!(num(pair, "baseline_p99_us") > 0.0, "{lat}");
            }
            assert_eq!(write["test"], "rdma_write");
            assert_eq!(write["path"], path, "{write}");
            let sum: f64 = write["per_pair"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| num(p, "gb_per_s"))
                .sum();
            assert!(num(write, "gb_per_s") > 0.0, "{write}");
            assert!(num(write, "worst_pair") <= sum, "{write}");
        }
    }
}

/// The first CPU this test may run on.
fn first_cpu() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = field(&status, "Cpus_allowed_list");
    list.split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .to_string()
}

/// `--pin` pins client and server — and so the baselines, which run in the
/// same processes — and says where; `--cpus` puts them all on one CPU,
/// every pair.
#[test]
fn bench_pin_says_where_everything_ran() {
    let limit = std::time::Duration::from_secs(300);
    let mut args = vec!["--pin", "--rounds", "1", "--no-memcpy"];
    args.extend(SMALL_LAT_AND_WRITE);
    let (rows, _) = bench_json(&args, limit);
    // Two tests over two paths.
    assert_eq!(rows.len(), 4);
    for row in &rows {
        let placement = row["placement"].as_str().unwrap();
        assert!(
            placement.starts_with("client cpu ") && placement.contains(", server cpu "),
            "{row}"
        );
        assert_eq!(row["baseline_placement"], placement, "{row}");
        assert!(num(row, "messages") > 0.0, "{row}");
        assert!(num(row, "baseline_messages") > 0.0, "{row}");
    }

    let cpu = first_cpu();
    let (rows, _) = bench_json(
        &[
            "--pin",
            "--cpus",
            &cpu,
            "--pairs",
            "2",
            "--tests",
            "lat",
            "--iters",
            "40",
            "--rounds",
            "1",
            "--no-baseline",
        ],
        limit,
    );
    let one = format!("client cpu {cpu}, server cpu {cpu}");
    assert_eq!(rows.len(), 2, "a row per path: {rows:?}");
    for row in &rows {
        assert_eq!(row["placement"], format!("{one} (every pair)"));
        assert!(row.get("baseline_placement").is_none(), "no baseline");
        for pair in row["per_pair"].as_array().unwrap() {
            assert_eq!(pair["placement"], one.as_str());
            assert_eq!(pair["messages"], 40, "{pair}");
        }
    }
}

/// `--duration`: every row — bandwidth, SEND bandwidth (which ends with an
/// end mark) and latency, ours and the baselines — runs for its time and
/// makes progress, and the tests after an open-ended SEND test still finish
/// (receive WRs it left posted are counted on).
#[test]
fn bench_duration_runs_each_measurement_for_a_time() {
    for mode in [None, Some("--event")] {
        let mut args = vec![
            "--duration",
            "0.6",
            "--rounds",
            "2",
            "--tests",
            "send,lat,write,send",
            "--sizes",
            "4096",
        ];
        args.extend(mode);
        let (rows, took) = bench_json(&args, std::time::Duration::from_secs(300));
        // Four tests over two paths, then the memcpy row of 4 KiB.
        assert_eq!(rows.len(), 9, "{rows:?}");
        let (memcpy, rows) = rows.split_last().unwrap();
        for row in rows {
            assert!(num(row, "messages") > 0.0, "{row}");
            assert!(num(row, "baseline_messages") > 0.0, "{row}");
            assert!(num(row, "ratio") > 0.0, "{row}");
        }
        assert_eq!(memcpy["test"], "memcpy", "{memcpy}");
        assert!(num(memcpy, "messages") > 0.0, "{memcpy}");
        assert!(num(memcpy, "gb_per_s") > 0.0, "{memcpy}");
        // Eight rows, each 0.6 s of ours and 0.6 s of its baseline, and
        // 0.6 s of memcpy.
        assert!(took >= 8.0 * 2.0 * 0.6 + 0.6, "{mode:?} took only {took} s");
    }
}

/// Whether QPs between two `rverbs bench` processes of this host take the
/// same-host path in this build when nothing turns it off. False while the
/// engine's handshake is a stand-in that refuses every peer (issue 18): the
/// same-host rows then fall back to the wire, and say so in `path_used`.
const SAME_HOST_PATH_TAKEN: bool = true;

/// Whether this test's environment turns the same-host path off
/// (`RVERBS_SAME_HOST=0`, which the bench and its servers inherit).
fn same_host_off_here() -> bool {
    std::env::var("RVERBS_SAME_HOST").is_ok_and(|v| v.trim() == "0")
}

/// The `path_used` of a row set up for `path`.
fn expected_path_used(path: &str) -> &'static str {
    if path == "same-host" && SAME_HOST_PATH_TAKEN && !same_host_off_here() {
        "same-host"
    } else {
        "wire"
    }
}

/// A counter of a device's counters as `RVERBS_BENCH_STATS` prints them
/// (`NetStats { …, name: N, … }`).
fn counter(stats: &str, name: &str) -> u64 {
    let key = format!(" {name}: ");
    let at = stats
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {stats}"))
        + key.len();
    stats[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{name} is no number in {stats}"))
}

/// A row's test, size and path (`-` for none), to compare row lists by.
fn row_key(row: &serde_json::Value) -> (String, u64, String) {
    (
        row["test"].as_str().unwrap().to_string(),
        row["size"].as_u64().unwrap(),
        row["path"].as_str().unwrap_or("-").to_string(),
    )
}

/// The row keys `(test, size, path)` as owned values.
fn keys(list: &[(&str, u64, &str)]) -> Vec<(String, u64, String)> {
    list.iter()
        .map(|&(t, s, p)| (t.to_string(), s, p.to_string()))
        .collect()
}

/// `--path` (default: both): every rverbs row is measured over the
/// same-host path and over the wire, each against its own baseline. The
/// wire's server really ran with the path off — its device counted its QP
/// in `wire_qps_path_off`, the other server's and the client's did not, and
/// the client found no same-host listener behind it — and the wire rows'
/// QPs took the wire by the client's counters (`path_used`). A memcpy row
/// per bandwidth size copied at a positive rate. The table says the same.
#[test]
fn bench_measures_every_row_over_each_path_and_memcpy() {
    let args = [
        "--tests",
        "lat,write",
        "--sizes",
        "4096",
        "--bytes",
        "1048576",
        "--iters",
        "200",
        "--rounds",
        "1",
    ];
    let limit = std::time::Duration::from_secs(300);
    let (rows, _, stderr) = bench_run(&args, &[("RVERBS_BENCH_STATS", "1")], limit);
    assert_eq!(
        rows.iter().map(row_key).collect::<Vec<_>>(),
        keys(&[
            ("send_lat", 8, "same-host"),
            ("send_lat", 8, "wire"),
            ("rdma_write", 4096, "same-host"),
            ("rdma_write", 4096, "wire"),
            ("memcpy", 4096, "-"),
        ]),
        "{rows:?}"
    );
    for row in &rows[..4] {
        assert!(num(row, "messages") > 0.0, "{row}");
        assert!(num(row, "baseline_messages") > 0.0, "{row}");
        assert!(num(row, "ratio") > 0.0, "{row}");
        let path = row["path"].as_str().unwrap();
        assert_eq!(row["path_used"], expected_path_used(path), "{row}");
    }
    let memcpy = &rows[4];
    assert!(num(memcpy, "gb_per_s") > 0.0, "{memcpy}");
    // 1 MiB in 4 KiB copies, one round.
    assert_eq!(num(memcpy, "messages"), 256.0, "{memcpy}");
    for absent in ["path", "path_used", "ratio", "baseline", "baseline_value"] {
        assert!(memcpy.get(absent).is_none(), "{absent}: {memcpy}");
    }

    let servers: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("server "))
        .collect();
    assert_eq!(servers.len(), 2, "a server per path: {stderr}");
    let mut path_off: Vec<u64> = servers
        .iter()
        .map(|s| counter(s, "wire_qps_path_off"))
        .collect();
    path_off.sort_unstable();
    let client = stderr
        .lines()
        .find(|l| l.starts_with("client "))
        .unwrap_or_else(|| panic!("no client counters: {stderr}"));
    if same_host_off_here() {
        // Everything inherits RVERBS_SAME_HOST=0.
        assert!(path_off[0] >= 1, "{stderr}");
        assert!(counter(client, "wire_qps_path_off") >= 2, "{stderr}");
    } else {
        assert!(
            path_off[0] == 0 && path_off[1] >= 1,
            "only the wire's server turns the path off: {stderr}"
        );
        assert_eq!(
            counter(client, "wire_qps_path_off"),
            0,
            "the client's own environment is left as it is: {stderr}"
        );
        assert!(
            counter(client, "wire_qps_not_local") >= 1,
            "the wire's server has no same-host listener: {stderr}"
        );
    }

    let (ok, out, err) = rverbs(
        &[
            "bench",
            "--tests",
            "write",
            "--sizes",
            "4096",
            "--bytes",
            "262144",
            "--rounds",
            "1",
            "--no-baseline",
            "--quiet",
        ],
        None,
    );
    assert!(ok, "{err}");
    assert!(out.contains("paths measured: same-host, wire"), "{out}");
    let row_of = |test: &str, path: &str| {
        out.lines().any(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            cells.first() == Some(&test) && cells.get(2) == Some(&path)
        })
    };
    let fell_back = expected_path_used("same-host") != "same-host";
    let same_host = if fell_back { "same-host*" } else { "same-host" };
    assert!(row_of("rdma_write", same_host), "{out}");
    assert!(row_of("rdma_write", "wire"), "{out}");
    assert!(row_of("memcpy", "-"), "{out}");
    assert_eq!(out.contains("took another path"), fell_back, "{out}");
}

/// `--pairs` with both paths and memcpy: every pair's client sets up both
/// paths (the option reaches the workers), and the rows sum the pairs,
/// the memcpy row too.
#[test]
fn bench_pairs_measure_each_path_and_memcpy() {
    let args = [
        "--pairs",
        "2",
        "--tests",
        "write",
        "--sizes",
        "4096",
        "--bytes",
        "1048576",
        "--rounds",
        "1",
        "--no-baseline",
    ];
    let (rows, _) = bench_json(&args, std::time::Duration::from_secs(300));
    assert_eq!(
        rows.iter().map(row_key).collect::<Vec<_>>(),
        keys(&[
            ("rdma_write", 4096, "same-host"),
            ("rdma_write", 4096, "wire"),
            ("memcpy", 4096, "-"),
        ]),
        "{rows:?}"
    );
    for row in &rows {
        assert_eq!(row["pairs"], 2, "{row}");
        if let Some(path) = row["path"].as_str() {
            assert_eq!(row["path_used"], expected_path_used(path), "{row}");
        }
        let pairs = row["per_pair"].as_array().expect("per_pair");
        assert_eq!(pairs.len(), 2, "{row}");
        let mut sum = 0.0;
        for pair in pairs {
            assert_eq!(num(pair, "messages"), 256.0, "{row}");
            assert!(num(pair, "gb_per_s") > 0.0, "{row}");
            sum += num(pair, "gb_per_s");
        }
        // One round: the row's figure is the pairs' sum.
        assert!((num(row, "gb_per_s") - sum).abs() <= 1e-9 * sum, "{row}");
    }
}

/// Starts `rverbs bench --serve` with `RVERBS_SAME_HOST=0` and returns it
/// and its HOST:PORT.
fn wire_bench_server() -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_rverbs"))
        .args(["bench", "--serve", "127.0.0.1:0"])
        .env_remove("RVERBS_CONFIG")
        .env_remove("RVERBS_ADDR")
        .env("RVERBS_SAME_HOST", "0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    let port = first
        .strip_prefix("listening ")
        .unwrap_or_else(|| panic!("bench server said {first:?}"))
        .trim()
        .to_string();
    (child, format!("127.0.0.1:{port}"))
}

/// Waits for `child` to end, failing (after killing it) if it runs past
/// `limit`; whether it ended well.
fn ends_well(child: &mut std::process::Child, limit: std::time::Duration) -> bool {
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.success();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("a bench server did not end in {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `--server`: an external server offers one path, the one its own
/// environment chooses, and the rows are measured over that one; asking
/// for another with `--path` is a clear error, and the server then ends
/// cleanly.
#[test]
fn bench_server_measures_the_path_it_offers() {
    let limit = std::time::Duration::from_secs(120);
    let (mut server, addr) = wire_bench_server();
    let (rows, _) = bench_json(
        &[
            "--server",
            &addr,
            "--tests",
            "write",
            "--sizes",
            "4096",
            "--bytes",
            "262144",
            "--rounds",
            "1",
            "--no-baseline",
            "--no-memcpy",
        ],
        limit,
    );
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["path"], "wire", "{rows:?}");
    assert_eq!(rows[0]["path_used"], "wire", "{rows:?}");
    assert!(ends_well(&mut server, limit));

    let (mut server, addr) = wire_bench_server();
    let (ok, out, err) = rverbs(
        &[
            "bench",
            "--server",
            &addr,
            "--path",
            "same-host",
            "--tests",
            "write",
            "--sizes",
            "4096",
        ],
        None,
    );
    assert!(!ok && out.is_empty(), "{out}");
    assert!(
        err.contains("offers the wire path") && err.contains("--path needs bench's own servers"),
        "{err}"
    );
    assert!(ends_well(&mut server, limit));
}

/// Options that do not go together are refused by the parser, before
/// anything runs; a CPU this process may not use is a plain error.
#[test]
fn bench_bad_options_are_clear_errors() {
    for args in [
        &["--pairs", "0"][..],
        &["--pairs", "2", "--server", "127.0.0.1:9"],
        &["--pin", "--server", "127.0.0.1:9"],
        &["--cpus", "0"],
        &["--no-pin", "--cpus", "0"],
        &["--duration", "1", "--bytes", "1000"],
        &["--duration", "1", "--iters", "10"],
        &["--duration", "0"],
        &["--duration", "soon"],
        &["--pin", "--cpus", "zero"],
        &["--path", "bogus"],
        &["--path", "wire,"],
        &["--udp-pair", "--no-baseline"],
    ] {
        let mut all = vec!["bench"];
        all.extend_from_slice(args);
        let out = Command::new(env!("CARGO_BIN_EXE_rverbs"))
            .args(&all)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let (ok, out, err) = rverbs(&["bench", "--pin", "--cpus", "100000"], None);
    assert!(!ok && out.is_empty());
    assert!(err.contains("may not run on CPU 100000"), "{err}");
    // --udp-pair is the wire latency test's floor: without it, refused.
    for (args, says) in [
        (
            &["--udp-pair", "--tests", "write"][..],
            "--tests must include lat",
        ),
        (
            &["--udp-pair", "--path", "same-host"],
            "--path must include wire",
        ),
        (
            &["--udp-pair", "--lat-size", "4097"],
            "--lat-size at most 4096",
        ),
    ] {
        let mut all = vec!["bench"];
        all.extend_from_slice(args);
        let (ok, out, err) = rverbs(&all, None);
        assert!(!ok && out.is_empty(), "{args:?}: {out}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // An external server offers one path: asking for two is refused before
    // anything is reached.
    let (ok, out, err) = rverbs(
        &[
            "bench",
            "--server",
            "127.0.0.1:9",
            "--path",
            "same-host,wire",
        ],
        None,
    );
    assert!(!ok && out.is_empty());
    assert!(err.contains("needs bench's own servers"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// A pcap file (raw IP) of MADs from QP 1 to QP 1, each with its ICRC.
fn mad_capture(path: &std::path::Path, mads: &[Vec<u8>]) {
    use rverbs_wire::mad::GSI_QKEY;
    use rverbs_wire::{icrc, BthRepr, DethRepr, Opcode, PacketRepr, Psn};
    // Global header: magic, version 2.4, zone, sigfigs, snap length, LINKTYPE_RAW.
    let mut file = Vec::new();
    for word in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 65_535, 101] {
        file.extend(word.to_le_bytes());
    }
    for mad in mads {
        let mut p = PacketRepr::new(BthRepr::new(Opcode::UD_SEND_ONLY, 1, Psn::new(0)));
        p.deth = Some(DethRepr {
            qkey: GSI_QKEY,
            src_qp: 1,
        });
        p.payload = mad;
        let mut roce = vec![0; p.buffer_len()];
        p.emit(&mut roce).unwrap();
        let udp_len = u16::try_from(roce.len() + 8).unwrap();
        let udp = icrc::udp_header(49152, icrc::ROCE_V2_PORT, udp_len);
        let ip = icrc::Ipv4Header {
            src: [10, 0, 0, 1].into(),
            dst: [10, 0, 0, 2].into(),
            id: 0,
            dont_fragment: true,
            tos: 0,
            ttl: 64,
        }
        .to_bytes(udp_len);
        icrc::fill(&ip, &udp, &mut roce).unwrap();
        let frame = [&ip[..], &udp[..], &roce[..]].concat();
        let len = u32::try_from(frame.len()).unwrap();
        for word in [1u32, 0, len, len] {
            file.extend(word.to_le_bytes());
        }
        file.extend(frame);
    }
    std::fs::write(path, file).unwrap();
}

#[test]
fn decode_dissects_cm_mads_and_strict_fails_on_a_malformed_one() {
    use rverbs_wire::mad::{cm_attr, MadRepr, MAD_HDR_LEN, MAD_LEN};
    use rverbs_wire::{CmDreq, Mad};
    let mad = |attr: u16, fill: &dyn Fn(&mut [u8])| {
        let mut mad = vec![0u8; MAD_LEN];
        MadRepr::cm_send(attr, 7).emit(&mut Mad::new_unchecked(&mut mad[..]));
        fill(&mut mad[MAD_HDR_LEN..]);
        mad
    };
    let dreq = mad(cm_attr::DREQ, &|m| {
        let mut dreq = CmDreq::new_unchecked(m);
        dreq.set_local_comm_id(0x11);
        dreq.set_remote_comm_id(0x22);
        dreq.set_remote_qpn(0x33);
    });
    // An MRA of message code 3, which the spec reserves.
    let garbled = mad(cm_attr::MRA, &|m| m[8] = 0b11_000000);
    let dir = std::env::temp_dir();
    let good = dir.join(format!("rverbs-cli-mads-good-{}.pcap", std::process::id()));
    let bad = dir.join(format!("rverbs-cli-mads-bad-{}.pcap", std::process::id()));
    mad_capture(&good, std::slice::from_ref(&dreq));
    mad_capture(&bad, &[dreq, garbled]);

    let (ok, out, err) = rverbs(&["decode", "--strict", good.to_str().unwrap()], None);
    assert!(ok, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[0].contains(" UD_SEND_ONLY qp 0x000001 "), "{out}");
    assert_eq!(
        lines[1],
        "    CM DREQ tid 0x7 comm 0x00000011→0x00000022 qpn 0x000033"
    );
    assert!(
        err.contains("other frames skipped; 1 MADs, 0 malformed"),
        "{err}"
    );

    let (ok, out, err) = rverbs(&["decode", bad.to_str().unwrap()], None);
    assert!(
        ok,
        "without --strict a malformed MAD is printed, not an error: {err}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("    CM MRA malformed: MRA message MRAed holds 0x3")),
        "{out}"
    );
    assert!(err.contains("; 2 MADs, 1 malformed"), "{err}");
    let (ok, _, err) = rverbs(&["decode", "--strict", bad.to_str().unwrap()], None);
    assert!(!ok, "--strict must fail on the garbled MAD");
    assert!(
        err.contains("--strict: 1 RoCE packets failed their checks"),
        "{err}"
    );
    std::fs::remove_file(good).unwrap();
    std::fs::remove_file(bad).unwrap();
}

/// `RVERBS_LOG` (tracing's env-filter syntax) decides what the library's
/// events say on stderr: unset, warnings only (a device coming up is a
/// debug event and stays quiet); `debug` shows it; a filter that does not
/// parse says so and falls back to warnings.
#[test]
fn rverbs_log_filters_what_reaches_stderr() {
    let run = |log: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rverbs"));
        cmd.arg("devinfo")
            .env_remove("RVERBS_CONFIG")
            .env_remove("RVERBS_ADDR")
            .env_remove("RVERBS_LOG");
        if let Some(l) = log {
            cmd.env("RVERBS_LOG", l);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stderr).unwrap()
    };
    let quiet = run(None);
    assert!(!quiet.contains("device up"), "unset: {quiet}");
    let debug = run(Some("debug"));
    assert!(
        debug.contains("DEBUG") && debug.contains("software RoCE device up"),
        "RVERBS_LOG=debug: {debug}"
    );
    let scoped = run(Some("rverbs::soft::device=debug"));
    assert!(scoped.contains("software RoCE device up"), "{scoped}");
    let other = run(Some("rverbs::soft::engine=debug"));
    assert!(
        !other.contains("device up"),
        "another module's filter: {other}"
    );
    let bad = run(Some("==nonsense"));
    assert!(
        bad.contains("RVERBS_LOG=\"==nonsense\" is not a filter") && !bad.contains("device up"),
        "{bad}"
    );
}

/// Shell completions and man pages come from the command's own clap
/// definitions: every subcommand is in them.
#[test]
fn completions_and_man_pages_cover_every_subcommand() {
    let (ok, bash, err) = rverbs(&["completions", "bash"], None);
    assert!(ok, "{err}");
    for sub in ["devinfo", "bench", "pingpong", "counters", "decode", "run"] {
        assert!(bash.contains(sub), "bash completion lacks {sub}");
    }
    let (ok, zsh, _) = rverbs(&["completions", "zsh"], None);
    assert!(ok && zsh.contains("#compdef rverbs"), "{zsh}");
    let (ok, _, err) = rverbs(&["completions", "nosuchshell"], None);
    assert!(!ok && err.contains("nosuchshell"), "{err}");
    let (ok, page, _) = rverbs(&["man"], None);
    assert!(
        ok && page.contains(".TH rverbs 1") && page.contains("pingpong"),
        "{page}"
    );
    let dir = std::env::temp_dir().join(format!("rverbs-man-{}", std::process::id()));
    let (ok, _, err) = rverbs(&["man", "--dir", dir.to_str().unwrap()], None);
    assert!(ok, "{err}");
    let bench = std::fs::read_to_string(dir.join("rverbs-bench.1")).unwrap();
    assert!(
        bench.contains(".TH rverbs-bench 1")
            && bench.contains(r"\-\-pairs")
            && bench.contains("0.1"),
        "{bench}"
    );
    assert!(dir.join("rverbs.1").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}
