//! What the CLI's integration tests share: finding the external tools they
//! check against — a test skips when a tool is missing, but fails instead
//! when the `CI` variable is set, where scripts/test has installed them —
//! and finding TCP ports for `rverbs pingpong` servers.

#![allow(dead_code)] // each test file uses its own part

use std::net::TcpListener;
use std::process::Command;

/// Debian's Python, which has python3-scapy.
pub const PYTHON: &str = "/usr/bin/python3";

/// `ok`, after saying what is missing (a failure under CI).
pub fn have(what: &str, ok: bool) -> bool {
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "{what} is missing; scripts/test installs it"
        );
        eprintln!("skipping: {what} is missing");
    }
    ok
}

/// Whether scapy's RoCE layer imports.
pub fn have_scapy() -> bool {
    let ok = Command::new(PYTHON)
        .args(["-c", "import scapy.contrib.roce"])
        .output()
        .is_ok_and(|o| o.status.success());
    have("python3-scapy", ok)
}

/// Whether `tool --version` runs.
pub fn have_tool(tool: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    have(tool, ok)
}

/// Whether the tests run as root (`id -u`, to stay free of libc bindings).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .is_some_and(|s| s.trim() == "0")
}

/// A TCP port nothing listens on right now (another process may still
/// take it before the caller does).
pub fn free_port() -> u16 {
    TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether something listens on IPv4 TCP `port`, from /proc/net/tcp:
/// without connecting, which would use up an `rverbs pingpong` server's
/// one accept.
pub fn listening(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let local_port = f
            .get(1)
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| u16::from_str_radix(p, 16).ok());
        f.get(3) == Some(&"0A") && local_port == Some(port) // 0A: LISTEN
    })
}
