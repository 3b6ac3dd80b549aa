//! The crate's examples (`crates/rverbs/examples/`), run as a user runs them:
//! the two-sided ones as a server process and client processes, checking what
//! they print and that they exit successfully, so they cannot rot.
//!
//! The binaries are those cargo built under `target/<profile>/examples/`
//! (`cargo build -p rverbs --examples --features tokio` builds all four;
//! `cargo test` builds those that need no feature). A missing one skips its
//! test, or fails it when `CI` is set.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long an example may run before its test fails.
const LIMIT: Duration = Duration::from_secs(120);

/// The built example `name`, next to this test binary's directory
/// (`target/<profile>/deps/..` → `target/<profile>/examples/`).
fn example(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let path = profile_dir.join("examples").join(name);
    if path.is_file() {
        return Some(path);
    }
    let msg = format!(
        "example {name} is not built ({}): run `cargo build -p rverbs --examples --features tokio`",
        path.display()
    );
    assert!(std::env::var_os("CI").is_none(), "{msg}");
    eprintln!("skipped: {msg}");
    None
}

/// A child process that is killed if the test ends before it does.
struct Running {
    child: Child,
    what: String,
}

impl Running {
    fn spawn(path: &PathBuf, args: &[&str]) -> Running {
        let child = Command::new(path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Running {
            child,
            what: format!("{} {}", path.display(), args.join(" ")),
        }
    }

    /// Its output once it exits, which it must within [`LIMIT`] and with
    /// success.
    fn finish(mut self) -> String {
        let deadline = Instant::now() + LIMIT;
        while self.child.try_wait().expect("waiting").is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let out = self.collect();
                panic!("{} still running after {LIMIT:?}: {out:?}", self.what);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let out = self.collect();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{} failed ({}):\n{text}\n{}",
            self.what,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }

    fn collect(&mut self) -> Output {
        let take = |r: Option<&mut dyn std::io::Read>| {
            let mut buf = Vec::new();
            if let Some(r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        };
        let stdout = take(self.child.stdout.as_mut().map(|s| s as _));
        let stderr = take(self.child.stderr.as_mut().map(|s| s as _));
        Output {
            status: self.child.wait().expect("exit status"),
            stdout,
            stderr,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A server example: its process, the TCP port it printed, and the rest of
/// its output, which a thread reads.
struct Server {
    running: Running,
    port: String,
    rest: mpsc::Receiver<String>,
}

impl Server {
    /// Starts a server example with `--port 0` and `args`, and waits for the
    /// `listening on ADDR:PORT` line.
    fn start(path: &PathBuf, args: &[&str]) -> Server {
        let mut all = vec!["--port", "0"];
        all.extend_from_slice(args);
        let mut running = Running::spawn(path, &all);
        let stdout = running.child.stdout.take().expect("piped");
        let (port_tx, port_rx) = mpsc::channel();
        let (rest_tx, rest) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
            for line in lines.by_ref() {
                if let Some(addr) = line.strip_prefix("listening on ") {
                    let _ = port_tx.send(addr.rsplit(':').next().unwrap_or("").to_string());
                    break;
                }
            }
            let _ = rest_tx.send(lines.collect::<Vec<_>>().join("\n"));
        });
        let port = port_rx
            .recv_timeout(LIMIT)
            .unwrap_or_else(|_| panic!("{}: no `listening on ADDR:PORT` line", running.what));
        assert!(
            port.parse::<u16>().is_ok(),
            "{}: port {port:?}",
            running.what
        );
        Server {
            running,
            port,
            rest,
        }
    }

    /// Waits for it to exit successfully; returns its output after the
    /// `listening on` line.
    fn finish(self) -> String {
        let what = self.running.what.clone();
        let _ = self.running.finish();
        self.rest
            .recv_timeout(LIMIT)
            .unwrap_or_else(|_| panic!("{what}: its output never ended"))
    }
}

#[test]
fn rc_pingpong_across_two_processes() {
    let Some(path) = example("rc_pingpong") else {
        return;
    };
    let server = Server::start(&path, &["--iters", "200"]);
    let client = ["--port", &server.port, "--iters", "200", "127.0.0.1"];
    let client_out = Running::spawn(&path, &client).finish();
    let server_out = server.finish();
    assert!(
        client_out.contains("200 round trips of 64 bytes")
            && client_out.contains("average round trip"),
        "client: {client_out}"
    );
    assert!(
        server_out.contains("echoed 200 messages of 64 bytes"),
        "server: {server_out}"
    );
    // Each names the other's QP: two processes, two devices.
    assert!(client_out.contains("remote QP") && server_out.contains("remote QP"));
}

#[test]
fn write_bw_across_two_processes() {
    let Some(path) = example("write_bw") else {
        return;
    };
    let args = ["--iters", "100", "--size", "65536", "--depth", "8"];
    let server = Server::start(&path, &args);
    let mut client = vec!["--port", server.port.as_str()];
    client.extend_from_slice(&args);
    client.push("127.0.0.1");
    let client_out = Running::spawn(&path, &client).finish();
    let server_out = server.finish();
    assert!(
        client_out.contains("100 WRITEs of 65536 bytes (8 in flight)")
            && client_out.contains("GB/s"),
        "client: {client_out}"
    );
    assert!(
        server_out.contains("received 100 WRITEs of 65536 bytes; the data is intact"),
        "server: {server_out}"
    );
}

#[test]
fn ud_multicast_reaches_both_receivers() {
    let Some(path) = example("ud_multicast") else {
        return;
    };
    // A group of this process's own, so concurrent tests do not mix.
    let pid = std::process::id();
    let group = format!("239.88.{}.{}", (pid >> 8) & 0xff, pid & 0xff);
    let out = Running::spawn(&path, &[&group, "4"]).finish();
    let got: Vec<&str> = out.lines().filter(|l| l.contains(" got ")).collect();
    assert_eq!(got.len(), 8, "4 datagrams × 2 receivers: {out}");
    for i in 0..4 {
        let this = format!("\"datagram {i} to {group}\"");
        let n = got.iter().filter(|l| l.contains(&this)).count();
        assert_eq!(n, 2, "datagram {i} reached both QPs: {out}");
    }
    assert!(
        got.iter().all(|l| l.ends_with(&format!("(to {group})"))),
        "{out}"
    );
    assert!(
        out.contains("4 datagrams, each received by both QPs"),
        "{out}"
    );
}

#[test]
fn async_echo_serves_two_clients_at_once() {
    let Some(path) = example("async_echo") else {
        return;
    };
    let server = Server::start(&path, &["--clients", "2"]);
    let port = server.port.as_str();
    let one = Running::spawn(&path, &["--port", port, "127.0.0.1", "alpha", "beta"]);
    let two = Running::spawn(&path, &["--port", port, "127.0.0.1", "gamma", "delta", "ε"]);
    let (one, two) = (one.finish(), two.finish());
    assert_eq!(
        one.lines().collect::<Vec<_>>(),
        ["echo: alpha", "echo: beta"]
    );
    assert_eq!(
        two.lines().collect::<Vec<_>>(),
        ["echo: gamma", "echo: delta", "echo: ε"]
    );
    let server_out = server.finish();
    let mut echoed: Vec<&str> = server_out
        .lines()
        .filter_map(|l| l.split_once(": echoed ").map(|(_, n)| n))
        .collect();
    echoed.sort();
    assert_eq!(echoed, ["2 messages", "3 messages"], "server: {server_out}");
}
