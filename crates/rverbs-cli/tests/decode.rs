//! `rverbs decode` on captures written by scapy (every link type, pcap and
//! pcapng), checked against what scapy built and against tshark's RoCE
//! dissector, and on a real tcpdump capture of packets sent on lo.
//!
//! Needs python3-scapy, tshark and tcpdump (scripts/test installs them) and
//! root for the live capture; without them the tests are skipped, unless
//! `CI` is set: then they fail.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use rverbs_wire::Opcode;

mod common;
use common::{have, have_scapy, have_tool, is_root, PYTHON};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/make_captures.py")
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rverbs-decode-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn make_captures(dir: &Path) {
    let out = Command::new(PYTHON)
        .arg(script())
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn decode(file: &Path, strict: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rverbs"));
    cmd.arg("decode").arg(file);
    if strict {
        cmd.arg("--strict");
    }
    cmd.output().unwrap()
}

/// "0x04 4660 17 ok" from one output line: opcode, QP, PSN, verdict.
fn summarize(line: &str) -> String {
    if line.contains("malformed RoCE packet") {
        return "malformed".into();
    }
    let f: Vec<&str> = line.split_whitespace().collect();
    let name = f[4];
    let op = Opcode::all()
        .find(|o| o.to_string() == name)
        .unwrap_or_else(|| panic!("unknown opcode name in {line}"));
    let qp = u32::from_str_radix(f[6].trim_start_matches("0x"), 16).unwrap();
    let psn: u32 = f[8].parse().unwrap();
    let verdict = if line.contains(" icrc ok ") {
        "ok"
    } else if line.contains(" icrc BAD ") {
        "bad"
    } else {
        panic!("no ICRC verdict in {line}")
    };
    format!("0x{:02x} {qp} {psn} {verdict}", op.0)
}

#[test]
fn every_link_type_and_format_decodes_to_what_scapy_built() {
    if !have_scapy() {
        return;
    }
    let dir = tempdir("links");
    make_captures(&dir);
    let expected = std::fs::read_to_string(dir.join("expected.txt")).unwrap();
    let expected: Vec<&str> = expected.lines().collect();
    for name in [
        "eth.pcap",
        "eth.pcapng",
        "sll.pcap",
        "sll2.pcap",
        "null.pcap",
        "raw.pcap",
    ] {
        let out = decode(&dir.join(name), false);
        let stdout = String::from_utf8(out.stdout).unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(out.status.success(), "{name}: {stderr}");
        let got: Vec<String> = stdout.lines().map(summarize).collect();
        assert_eq!(got, expected, "{name}");
        assert_eq!(
            stderr.trim(),
            "81 frames: 80 RoCE packets, 1 with a bad ICRC, 1 malformed or truncated, \
             2 other frames skipped",
            "{name}"
        );
        // Timestamps: the first frame was stamped 12:40:00.25 UTC.
        assert!(
            stdout.starts_with("12:40:00.250000 "),
            "{name}: {stdout:.40}"
        );
        // The GSO batch is split into its three segments.
        assert_eq!(stdout.matches("(gso segment ").count(), 3, "{name}");

        // The same capture on stdin (`rverbs decode -`, as from
        // `tcpdump -w -`) decodes the same.
        let piped = Command::new(env!("CARGO_BIN_EXE_rverbs"))
            .args(["decode", "-"])
            .stdin(std::fs::File::open(dir.join(name)).unwrap())
            .output()
            .unwrap();
        assert!(piped.status.success(), "{name} on stdin: {piped:?}");
        assert_eq!(
            String::from_utf8(piped.stdout).unwrap(),
            stdout,
            "{name} on stdin"
        );

        // --json: one object per packet line of the text, with the same
        // opcode, QP, PSN and ICRC verdict.
        let json = Command::new(env!("CARGO_BIN_EXE_rverbs"))
            .args(["decode", "--json"])
            .arg(dir.join(name))
            .output()
            .unwrap();
        assert!(json.status.success(), "{name} --json: {json:?}");
        let objects: Vec<serde_json::Value> = String::from_utf8(json.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let from_json: Vec<String> = objects
            .iter()
            .map(|o| {
                if o.get("malformed").is_some() {
                    return "malformed".to_string();
                }
                let op = Opcode::all()
                    .find(|op| op.to_string() == o["opcode"].as_str().unwrap())
                    .unwrap();
                let verdict = if o["icrc"] == "ok" { "ok" } else { "bad" };
                format!("0x{:02x} {} {} {verdict}", op.0, o["qpn"], o["psn"])
            })
            .collect();
        assert_eq!(from_json, expected, "{name} --json");
        assert_eq!(
            objects
                .iter()
                .filter(|o| o.get("gso_segment").is_some())
                .count(),
            3,
            "{name} --json"
        );

        let strict = decode(&dir.join(name), true);
        assert!(!strict.status.success(), "{name}: --strict must fail");
        let err = String::from_utf8(strict.stderr).unwrap();
        assert!(err.contains("--strict: 2 RoCE packets failed"), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tshark_sees_the_same_opcodes_qps_and_psns() {
    if !have_scapy() || !have_tool("tshark") {
        return;
    }
    let dir = tempdir("tshark");
    make_captures(&dir);
    let file = dir.join("eth.pcap");
    let ours: Vec<String> = String::from_utf8(decode(&file, false).stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.contains("malformed") && !l.contains("(gso segment"))
        .map(|l| {
            let s = summarize(l);
            s.rsplit_once(' ').unwrap().0.to_string()
        })
        .collect();
    let out = Command::new("tshark")
        .arg("-r")
        .arg(&file)
        .args([
            "-Y",
            "infiniband && !(infiniband.bth.opcode == 0x40) && udp.length < 2000",
            "-T",
            "fields",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.bth.destqp",
            "-e",
            "infiniband.bth.psn",
        ])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let theirs: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let qp = u32::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap();
            format!("0x{:02x} {qp} {}", f[0].parse::<u8>().unwrap(), f[2])
        })
        .collect();
    assert_eq!(ours.len(), 77);
    assert_eq!(ours, theirs);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn frames_cut_by_the_snap_length_are_reported_not_checked() {
    if !have_scapy() {
        return;
    }
    let dir = tempdir("snaplen");
    make_captures(&dir);
    let out = decode(&dir.join("snaplen.pcap"), false);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[0].contains("truncated by the capture: 36 of 80 bytes (packet 1)"),
        "{stdout}"
    );
    assert!(lines[1].contains(" icrc ok "), "{stdout}");
    assert!(!decode(&dir.join("snaplen.pcap"), true).status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn truncated_or_corrupt_captures_are_errors_with_the_packet_number() {
    if !have_scapy() {
        return;
    }
    let dir = tempdir("corrupt");
    make_captures(&dir);
    for name in ["eth.pcap", "eth.pcapng"] {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        // Find where the 10th record starts by cutting progressively: a cut
        // anywhere inside the file must give a clear error, never a panic.
        let mut last_err = String::new();
        for cut in (40..bytes.len()).step_by(97) {
            let f = dir.join(format!("cut-{name}"));
            std::fs::write(&f, &bytes[..cut]).unwrap();
            let out = decode(&f, false);
            let err = String::from_utf8(out.stderr).unwrap();
            assert!(!err.contains("panicked"), "{name} cut at {cut}: {err}");
            if !out.status.success() {
                assert!(
                    err.contains(": capture truncated or corrupt") && err.contains("packet "),
                    "{name} cut at {cut}: {err}"
                );
                last_err = err;
            }
        }
        assert!(
            last_err.contains("packet 81: capture truncated"),
            "{name}: {last_err}"
        );
        // Flipped bytes in record headers: errors or decoded lines, no panic.
        let mut corrupt = bytes.clone();
        for at in (30..corrupt.len()).step_by(211) {
            corrupt[at] ^= 0xff;
        }
        let f = dir.join(format!("flipped-{name}"));
        std::fs::write(&f, &corrupt).unwrap();
        let err = String::from_utf8(decode(&f, false).stderr).unwrap();
        assert!(!err.contains("panicked"), "{err}");
    }
    let f = dir.join("garbage.pcap");
    std::fs::write(&f, b"this is not a capture at all").unwrap();
    let out = decode(&f, false);
    assert!(!out.status.success());
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("is not a pcap or pcapng capture"));
    let out = decode(&dir.join("missing.pcap"), false);
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("cannot open"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_real_tcpdump_capture_on_lo_checks_out() {
    if !have_scapy() || !have_tool("tcpdump") || !have("root (for tcpdump)", is_root()) {
        return;
    }
    let dir = tempdir("live");
    // Our packets go to QPs no concurrent run of this test uses.
    let qp_base = (std::process::id() & 0xffff) << 8;
    let ours = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| (0..20).any(|k| l.contains(&format!(" qp {:#08x} psn {k} ", qp_base + k))))
            .map(str::to_string)
            .collect()
    };
    for (iface, link) in [("lo", "EN10MB"), ("any", "LINUX_SLL2")] {
        let file = dir.join(format!("{iface}.pcap"));
        let mut tcpdump = Interrupted(
            Command::new("tcpdump")
                // Immediate mode: without it libpcap hands packets over in ring
                // blocks (up to a second late), and the interrupt below loses them.
                .args([
                    "-i",
                    iface,
                    "-y",
                    link,
                    "--immediate-mode",
                    "-U",
                    "-n",
                    "-w",
                ])
                .arg(&file)
                .args(["udp", "dst", "port", "4791", "and", "host", "127.0.0.1"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        // Wait until tcpdump listens (it says so on stderr), then send.
        let mut stderr = std::io::BufReader::new(tcpdump.0.stderr.take().unwrap());
        let mut said = String::new();
        while !said.contains("listening") {
            let mut line = String::new();
            if std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() == 0 {
                panic!("tcpdump did not start: {said}");
            }
            said += &line;
        }
        let sent = Command::new(PYTHON)
            .arg(script())
            .args(["send", "20", &qp_base.to_string()])
            .output()
            .unwrap();
        assert!(
            sent.status.success(),
            "{}",
            String::from_utf8_lossy(&sent.stderr)
        );
        // Wait (at most 10 s) until tcpdump has written all 20 packets.
        for _ in 0..100 {
            let so_far = String::from_utf8(decode(&file, false).stdout).unwrap();
            if ours(&so_far).len() >= 20 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(tcpdump);

        let out = decode(&file, true);
        let stdout = String::from_utf8(out.stdout).unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(out.status.success(), "{iface}: {stdout}\n{stderr}");
        let mine = ours(&stdout);
        assert_eq!(mine.len(), 20, "{iface}: {stdout}\n{stderr}");
        assert!(mine.iter().all(|l| l.contains(" icrc ok ")), "{mine:?}");
        // Even k: raw socket, IP ID 1000+k. Odd k: DF socket, IP ID 0 by the kernel.
        assert!(
            mine[0].contains(&format!(
                "127.0.0.1.40000 > 127.0.0.1.4791: RC_SEND_ONLY qp {qp_base:#08x} psn 0 [ACK] len 12"
            )),
            "{}",
            mine[0]
        );
        assert!(!stderr.contains(" 0 RoCE packets"), "{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A child process that is interrupted (SIGINT, so tcpdump flushes its
/// file) and reaped when dropped — also when the test fails half-way.
struct Interrupted(std::process::Child);

impl Drop for Interrupted {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-INT")
            .arg(self.0.id().to_string())
            .status();
        let _ = self.0.wait();
    }
}
