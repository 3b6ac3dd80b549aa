//! C programs of our own, compiled against Debian's verbs.h and run on the
//! drop-in library: tests/c/*.c. Each prints "ALL OK" when every check in it
//! holds.

mod common;

use std::process::Command;

fn run_c(name: &str, source: &str, env: &[(&str, &str)]) -> Option<(bool, String)> {
    let dir = common::LibDir::new(name);
    let exe = common::compile_c(&dir.0, name, source)?;
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &dir.0)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success() && text.contains("ALL OK"), text))
}

#[test]
fn seed_man_pages_events_and_error_paths_hold_in_c() {
    if let Some((ok, text)) = run_c("semantics", include_str!("c/semantics.c"), &[]) {
        assert!(ok, "{text}");
    }
}
