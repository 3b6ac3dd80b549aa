//! On the wire, end to end: real traffic between two rverbs processes —
//! RC from `rverbs bench` (RDMA WRITE, READ and SEND, ACKs, UDP GSO
//! batches), UD and UC SENDs from short `rverbs pingpong` runs — captured
//! on lo with tcpdump, must pass `rverbs decode --strict` — every packet
//! well formed, every ICRC right, GSO batches split into their segments —
//! and scapy's RoCE layer and tshark's dissector must agree with the
//! decoder packet by packet (tshark on the DETH of UD packets too).
//!
//! Every rverbs process here runs with `RVERBS_SAME_HOST=0`: two devices of
//! one host would otherwise agree on the same-host path, and their packets
//! would go through shared memory, never onto lo (a capture would hold
//! nothing but the doorbells that wake a sleeping peer).
//!
//! Needs root and tcpdump, python3-scapy and tshark (scripts/test installs
//! them); without them the test is skipped, unless `CI` is set: then it
//! fails.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use rverbs_wire::{Opcode, Transport};

mod common;
use common::{free_port, have, have_scapy, have_tool, is_root, listening, PYTHON};

const RVERBS: &str = env!("CARGO_BIN_EXE_rverbs");

/// `rverbs` with the same-host path off (`RVERBS_SAME_HOST=0`), so its
/// traffic goes on the wire, where the capture sees it.
fn rverbs_on_the_wire() -> Command {
    let mut cmd = Command::new(RVERBS);
    cmd.env("RVERBS_SAME_HOST", "0");
    cmd
}

/// A fresh directory, removed on drop — also when the test fails.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let d = std::env::temp_dir().join(format!("rverbs-capture-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process this test started, stopped with `signal` (tcpdump
/// flushes its file on INT) and reaped when dropped — also when the test
/// fails half-way, so nothing outlives it.
struct Stopped {
    child: Child,
    signal: &'static str,
}

impl Stopped {
    /// Stops the process (if it still runs) and reaps it.
    fn stop(&mut self) -> ExitStatus {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .arg(format!("-{}", self.signal))
                .arg(self.child.id().to_string())
                .status();
        }
        self.child.wait().unwrap()
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits at most `limit` for `child` to exit.
fn wait_for(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Two loopback addresses (all of 127/8 is on lo) no other test uses:
/// each process gets its own device there, and the capture filters on them.
fn addresses() -> (Ipv4Addr, Ipv4Addr) {
    let pid = std::process::id();
    let (x, y) = (64 + (pid % 128) as u8, (pid / 128 % 256) as u8);
    (Ipv4Addr::new(127, x, y, 1), Ipv4Addr::new(127, x, y, 2))
}

fn read_file(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Starts tcpdump on lo, writing packets between `a` and `b` to `file`,
/// and returns once it listens (it says so on stderr).
fn start_tcpdump(file: &Path, a: Ipv4Addr, b: Ipv4Addr) -> (Stopped, BufReader<ChildStderr>) {
    let mut tcpdump = Stopped {
        child: Command::new("tcpdump")
            // Immediate mode and -U: packets reach the file as they come,
            // not in ring blocks the interrupt could lose. A large kernel
            // buffer (KiB) so bursts are not dropped.
            .args(["-i", "lo", "-n", "-U", "--immediate-mode", "-B", "65536"])
            .arg("-w")
            .arg(file)
            .arg(format!("udp port 4791 and host {a} and host {b}"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        signal: "INT",
    };
    let mut stderr = BufReader::new(tcpdump.child.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("listening on") {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            panic!("tcpdump did not start: {said}");
        }
        said += &line;
    }
    (tcpdump, stderr)
}

/// Runs `rverbs bench` between two processes, server on `b`, client on
/// `a`, with output and errors in `dir`.
fn run_bench(dir: &Path, a: Ipv4Addr, b: Ipv4Addr) {
    let mut server = Stopped {
        child: rverbs_on_the_wire()
            .args(["bench", "--serve", "127.0.0.1:0"])
            .env("RVERBS_ADDR", b.to_string())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("server.err")).unwrap())
            .spawn()
            .unwrap(),
        signal: "KILL",
    };
    let mut first = String::new();
    BufReader::new(server.child.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    let port = first
        .strip_prefix("listening ")
        .unwrap_or_else(|| {
            panic!(
                "bench server said {first:?}: {}",
                read_file(&dir.join("server.err"))
            )
        })
        .trim()
        .to_string();
    let mut client = Stopped {
        child: rverbs_on_the_wire()
            .args(["bench", "--server", &format!("127.0.0.1:{port}")])
            // Posting lists puts several messages' packets in one GSO
            // datagram and several datagrams in one sendmmsg.
            .args(["--quiet", "--no-baseline", "--rounds", "1", "--post-list"])
            .args([
                "--sizes",
                "4096,65536",
                "--bytes",
                "4194304",
                "--iters",
                "200",
            ])
            .env("RVERBS_ADDR", a.to_string())
            .stdout(std::fs::File::create(dir.join("bench.out")).unwrap())
            .stderr(std::fs::File::create(dir.join("bench.err")).unwrap())
            .spawn()
            .unwrap(),
        signal: "KILL",
    };
    let status = wait_for(&mut client.child, Duration::from_secs(180));
    let logs = || {
        format!(
            "client: {}{}\nserver: {}",
            read_file(&dir.join("bench.out")),
            read_file(&dir.join("bench.err")),
            read_file(&dir.join("server.err"))
        )
    };
    assert!(
        status.is_some_and(|s| s.success()),
        "rverbs bench failed or hung ({status:?}): {}",
        logs()
    );
    // The client told the server to quit.
    let status = wait_for(&mut server.child, Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "bench server: {status:?}: {}",
        logs()
    );
}

/// The `rverbs pingpong` runs whose traffic joins the bench's: (options,
/// message size, round trips). UD SENDs of 2000 bytes (UD_SEND_ONLY with
/// a DETH), UC SENDs of 40 bytes (inline, UC_SEND_ONLY) and of 10000
/// bytes (UC_SEND_FIRST, MIDDLE, LAST at the 4096-byte MTU).
const PINGPONGS: [(&[&str], usize, usize); 3] = [
    (&["--transport", "ud"], 2000, 100),
    (&["--transport", "uc"], 40, 100),
    (&["--transport", "uc"], 10000, 50),
];

/// Runs one `rverbs pingpong` pair of [`PINGPONGS`], server on `b`, client
/// on `a`, with output and errors in `dir`.
fn run_pingpong(dir: &Path, a: Ipv4Addr, b: Ipv4Addr, run: (&[&str], usize, usize)) {
    let (options, size, iters) = run;
    let port = free_port().to_string();
    let (size, iters) = (size.to_string(), iters.to_string());
    let args = [options, &["-s", &size, "-n", &iters, "-p", &port]].concat();
    let log = |name: &str| dir.join(format!("pingpong-{name}"));
    let side = |addr: Ipv4Addr, name: &str, host: &[&str]| Stopped {
        child: rverbs_on_the_wire()
            .arg("pingpong")
            .args(&args)
            .args(host)
            .env("RVERBS_ADDR", addr.to_string())
            .stdout(std::fs::File::create(log(&format!("{name}.out"))).unwrap())
            .stderr(std::fs::File::create(log(&format!("{name}.err"))).unwrap())
            .spawn()
            .unwrap(),
        signal: "KILL",
    };
    let logs = || {
        ["server.out", "server.err", "client.out", "client.err"]
            .map(|n| format!("{n}: {}", read_file(&log(n))))
            .join("\n")
    };
    let mut server = side(b, "server", &[]);
    let start = Instant::now();
    while !listening(port.parse().unwrap()) {
        let running = server.child.try_wait().unwrap().is_none();
        assert!(
            running && start.elapsed() < Duration::from_secs(30),
            "the pingpong server {args:?} did not listen: {}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut client = side(a, "client", &["127.0.0.1"]);
    for (who, p) in [("client", &mut client), ("server", &mut server)] {
        let status = wait_for(&mut p.child, Duration::from_secs(60));
        assert!(
            status.is_some_and(|s| s.success()),
            "rverbs pingpong {args:?} {who} failed or hung ({status:?}):\n{}",
            logs()
        );
    }
}

/// One line of `rverbs decode`.
#[derive(Debug)]
struct Packet {
    /// Capture frame number, from 1.
    frame: u64,
    /// `(k, n)` for segment k (from 1) of a GSO batch of n.
    gso: Option<(u32, u32)>,
    opcode: Opcode,
    qp: u32,
    psn: u32,
    /// Payload bytes.
    len: usize,
    /// The ICRC verdict.
    ok: bool,
    /// The ICRC field, as a number (least significant byte first on the wire).
    icrc: u32,
    /// The DETH's Q_Key and source QP (UD).
    deth: Option<(u32, u32)>,
}

impl Packet {
    /// The RoCE packet's whole length: headers, payload, pad, ICRC.
    fn wire_len(&self) -> usize {
        self.opcode.info().unwrap().header_len() + self.len.div_ceil(4) * 4 + 4
    }

    /// "FRAME OPCODE QP PSN ok|bad", as tests/check_capture.py prints it.
    fn summary(&self) -> String {
        let verdict = if self.ok { "ok" } else { "bad" };
        format!(
            "{} {} {} {} {verdict}",
            self.frame, self.opcode.0, self.qp, self.psn
        )
    }
}

/// Parses decode's lines, numbering frames: every frame of the capture
/// makes one line, or n lines for a GSO batch of n.
fn parse(stdout: &str) -> Vec<Packet> {
    let mut frame = 0;
    let mut packets = Vec::new();
    for line in stdout.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert!(f.len() > 12 && f[5] == "qp" && f[7] == "psn", "{line}");
        let opcode = Opcode::all()
            .find(|o| o.to_string() == f[4])
            .unwrap_or_else(|| panic!("unknown opcode in {line}"));
        let at = f.iter().position(|&w| w == "icrc").unwrap();
        assert_eq!(f[at - 2], "len", "{line}");
        let gso = line.split_once("(gso segment ").map(|(_, rest)| {
            let (kn, packet) = rest.split_once(" of packet ").unwrap();
            let (k, n) = kn.split_once('/').unwrap();
            let number: u64 = packet.trim_end_matches(')').parse().unwrap();
            let (k, n): (u32, u32) = (k.parse().unwrap(), n.parse().unwrap());
            if k == 1 {
                frame += 1;
            }
            assert_eq!(number, frame, "frames numbered wrong at {line}");
            (k, n)
        });
        if gso.is_none() {
            frame += 1;
        }
        let deth = f.iter().position(|&w| w == "qkey").map(|q| {
            assert_eq!(f[q + 2], "src-qp", "{line}");
            let hex = |s: &str| u32::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
            (hex(f[q + 1]), hex(f[q + 3]))
        });
        packets.push(Packet {
            frame,
            gso,
            opcode,
            qp: u32::from_str_radix(f[6].trim_start_matches("0x"), 16).unwrap(),
            psn: f[8].parse().unwrap(),
            len: f[at - 1].parse().unwrap(),
            ok: f[at + 1] == "ok",
            icrc: u32::from_str_radix(f[at + 2].trim_start_matches("0x"), 16).unwrap(),
            deth,
        });
    }
    packets
}

/// scapy's verdicts on every packet, GSO segments included, must be ours.
///
/// scapy (2.5) has no DETH layer: a UD packet's DETH is payload to it.
/// UD packets stay in the comparison all the same — opcode, QP and PSN
/// come from the BTH, and the ICRC covers the DETH like any payload (no
/// field of it is masked) — but their DETH fields are compared with
/// tshark's only.
fn check_with_scapy(dir: &Path, file: &Path, packets: &[Packet]) {
    let batches: String = packets
        .iter()
        .filter(|p| p.gso.is_some_and(|(k, _)| k == 1))
        .map(|p| format!("{} {}\n", p.frame, p.wire_len()))
        .collect();
    let list = dir.join("batches.txt");
    std::fs::write(&list, batches).unwrap();
    let out = Command::new(PYTHON)
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/check_capture.py"))
        .arg(file)
        .arg(&list)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs = String::from_utf8(out.stdout).unwrap();
    let theirs: Vec<&str> = theirs.lines().collect();
    let ours: Vec<String> = packets.iter().map(Packet::summary).collect();
    assert_eq!(theirs.len(), ours.len(), "scapy saw another packet count");
    for (t, o) in theirs.iter().zip(&ours) {
        assert_eq!(t, o, "scapy (left) and rverbs decode (right) disagree");
    }
}

/// tshark's view of every frame that is one packet: opcode, QP, PSN and
/// ICRC field must be ours.
fn check_with_tshark(file: &Path, packets: &[Packet]) {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(["-d", "udp.port==4791,infiniband", "-T", "fields"])
        // Else its heuristics read SEND payloads as RPC-over-RDMA, which
        // hides the ICRC field.
        .args(["--disable-protocol", "rpcordma"])
        .args(["-e", "frame.number", "-e", "infiniband.bth.opcode"])
        .args(["-e", "infiniband.bth.destqp", "-e", "infiniband.bth.psn"])
        .args(["-e", "infiniband.invariant.crc"])
        .args(["-e", "infiniband.deth.q_key", "-e", "infiniband.deth.srcqp"])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let theirs = String::from_utf8(out.stdout).unwrap();
    let single: BTreeMap<u64, &Packet> = packets
        .iter()
        .filter(|p| p.gso.is_none())
        .map(|p| (p.frame, p))
        .collect();
    let mut compared = 0;
    for line in theirs.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let frame: u64 = f[0].parse().unwrap();
        let Some(p) = single.get(&frame) else {
            continue; // a GSO batch: tshark sees its first packet only
        };
        let hex = |s: &str| u32::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
        assert_eq!(
            (
                f[1].parse::<u8>().unwrap(),
                hex(f[2]),
                f[3].parse::<u32>().unwrap()
            ),
            (p.opcode.0, p.qp, p.psn),
            "tshark (left) and rverbs decode (right) disagree on frame {frame}"
        );
        // tshark shows the four ICRC bytes as a big-endian number.
        assert_eq!(hex(f[4]).swap_bytes(), p.icrc, "frame {frame}");
        let deth = (!f[5].is_empty()).then(|| (hex(f[5]), hex(f[6])));
        assert_eq!(
            deth, p.deth,
            "tshark (left) and rverbs decode (right): DETH of frame {frame}"
        );
        compared += 1;
    }
    assert_eq!(compared, single.len(), "tshark missed packets");
}

#[test]
fn rverbs_traffic_captured_on_lo_is_valid_roce_v2() {
    if !have_tool("tcpdump") || !have("root (for tcpdump)", is_root()) {
        return;
    }
    let (scapy, tshark) = (have_scapy(), have_tool("tshark"));
    let dir = TempDir::new();
    let file = dir.0.join("rverbs.pcap");
    let (a, b) = addresses();

    let (mut tcpdump, mut tcpdump_err) = start_tcpdump(&file, a, b);
    run_bench(&dir.0, a, b);
    for run in PINGPONGS {
        run_pingpong(&dir.0, a, b, run);
    }
    // Let tcpdump write what is still on its way: until the file stops growing.
    let size = || std::fs::metadata(&file).map_or(0, |m| m.len());
    let mut last = size();
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(200));
        if size() == last {
            break;
        }
        last = size();
    }
    assert!(tcpdump.stop().success());
    let mut stats = String::new();
    tcpdump_err.read_to_string(&mut stats).unwrap();
    eprintln!("tcpdump: {}", stats.trim());

    let out: Output = Command::new(RVERBS)
        .arg("decode")
        .arg("--strict")
        .arg(&file)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    let bad: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.contains(" icrc ok "))
        .take(10)
        .collect();
    assert!(out.status.success(), "{stderr}\n{bad:#?}");
    assert!(bad.is_empty(), "{bad:#?}");
    let packets = parse(&stdout);
    let frames = packets.last().map_or(0, |p| p.frame);
    assert!(
        stderr.contains(&format!(
            "{frames} frames: {} RoCE packets, 0 with a bad ICRC, 0 malformed or truncated, \
             0 other frames skipped",
            packets.len()
        )),
        "{stderr}"
    );
    assert!(packets.len() >= 500, "only {} packets", packets.len());
    eprintln!("{stderr}");

    // Only our two devices, both ways.
    let (ea, eb) = (format!("{a}.4791"), format!("{b}.4791"));
    for line in stdout.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let pair = (f[1], f[3].trim_end_matches(':'));
        assert!(
            pair == (ea.as_str(), eb.as_str()) || pair == (eb.as_str(), ea.as_str()),
            "{line}"
        );
    }
    // Every kind of packet the bench's traffic is made of.
    let kinds: BTreeSet<Opcode> = packets.iter().map(|p| p.opcode).collect();
    for want in [
        Opcode::RC_RDMA_WRITE_FIRST,
        Opcode::RC_RDMA_WRITE_MIDDLE,
        Opcode::RC_RDMA_WRITE_LAST,
        Opcode::RC_RDMA_WRITE_ONLY,
        Opcode::RC_RDMA_READ_REQUEST,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
        Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        Opcode::RC_SEND_FIRST,
        Opcode::RC_SEND_MIDDLE,
        Opcode::RC_SEND_LAST,
        Opcode::RC_SEND_ONLY,
        Opcode::RC_ACKNOWLEDGE,
        Opcode::UD_SEND_ONLY,
        Opcode::UC_SEND_ONLY,
        Opcode::UC_SEND_FIRST,
        Opcode::UC_SEND_MIDDLE,
        Opcode::UC_SEND_LAST,
    ] {
        assert!(kinds.contains(&want), "no {want} in {kinds:?}");
    }
    // The UD SENDs: each with a DETH naming ibv_ud_pingpong's Q_Key (which
    // rverbs pingpong uses too) and a source QP, the whole message in one
    // packet; no other packet has a DETH.
    let ud: Vec<&Packet> = packets
        .iter()
        .filter(|p| p.opcode == Opcode::UD_SEND_ONLY)
        .collect();
    for p in &ud {
        let (qkey, src_qp) = p.deth.unwrap_or_else(|| panic!("no DETH: {p:?}"));
        assert_eq!((qkey, p.len), (0x1111_1111, PINGPONGS[0].1), "{p:?}");
        assert!(src_qp > 1 && src_qp <= 0xff_ffff, "{p:?}");
    }
    assert!(packets
        .iter()
        .all(|p| p.deth.is_some() == (p.opcode == Opcode::UD_SEND_ONLY)));
    let uc = packets
        .iter()
        .filter(|p| p.opcode.info().unwrap().transport == Transport::Uc)
        .count();
    // Nothing is lost on lo, so every message of a run is there, unless
    // tcpdump itself dropped some.
    eprintln!("{} UD and {uc} UC packets", ud.len());
    if stats
        .lines()
        .any(|l| l.trim() == "0 packets dropped by kernel")
    {
        assert_eq!(ud.len(), 2 * PINGPONGS[0].2, "UD_SEND_ONLY packets");
        // 40 bytes: one packet a message; 10000 bytes: three.
        assert_eq!(
            uc,
            2 * PINGPONGS[1].2 + 3 * 2 * PINGPONGS[2].2,
            "UC packets"
        );
    }
    // GSO batches, split whole: segments 1..=n of one frame in a row, all
    // but the last the same size.
    let batches: Vec<&[Packet]> = packets
        .chunk_by(|x, y| x.frame == y.frame)
        .filter(|c| c[0].gso.is_some())
        .collect();
    assert!(
        batches.iter().any(|b| b.len() >= 3),
        "no GSO batches of 3 or more packets"
    );
    for b in &batches {
        let n = b.len() as u32;
        for (k, p) in b.iter().enumerate() {
            assert_eq!(p.gso, Some((k as u32 + 1, n)), "frame {}", p.frame);
        }
        let seg = b[0].wire_len();
        assert!(b[..b.len() - 1].iter().all(|p| p.wire_len() == seg));
        assert!(b[b.len() - 1].wire_len() <= seg, "frame {}", b[0].frame);
    }
    eprintln!(
        "{} packets in {frames} frames, {} GSO batches",
        packets.len(),
        batches.len()
    );

    if scapy {
        check_with_scapy(&dir.0, &file, &packets);
    }
    if tshark {
        check_with_tshark(&file, &packets);
    }
}
