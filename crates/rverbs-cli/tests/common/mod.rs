//! What the CLI's integration tests share: finding the external tools they
//! check against. A test skips when a tool is missing — but fails instead
//! when the `CI` variable is set, where scripts/test has installed them.

#![allow(dead_code)] // each test file uses its own part

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
