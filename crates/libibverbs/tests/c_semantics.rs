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

#[test]
fn rverbs_leak_check_names_what_was_left_alive() {
    let Some((ok, quiet)) = run_c("leaks", include_str!("c/leaks.c"), &[]) else {
        return;
    };
    assert!(ok, "{quiet}");
    assert!(
        !quiet.contains("rverbs: leak"),
        "no report unless asked: {quiet}"
    );
    let (ok, text) = run_c(
        "leaks",
        include_str!("c/leaks.c"),
        &[("RVERBS_LEAK_CHECK", "1")],
    )
    .expect("compiled above");
    assert!(ok, "{text}");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("rverbs: leak"))
        .collect();
    let at_close: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("at ibv_close_device"))
        .collect();
    assert_eq!(at_close.len(), 2, "{text}");
    assert!(at_close.iter().any(|l| l.contains(": PD ")), "{text}");
    assert!(at_close.iter().any(|l| l.contains(": CQ ")), "{text}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("at exit") && l.contains("was never closed")),
        "{text}"
    );
    // The closed context's objects are still alive at exit.
    assert!(
        lines
            .iter()
            .filter(|l| l.contains("at exit") && l.contains("is still alive"))
            .count()
            >= 2,
        "{text}"
    );
}
