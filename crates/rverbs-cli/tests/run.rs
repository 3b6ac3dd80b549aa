//! `rverbs run`: unmodified C programs on the drop-in library built beside
//! the binary (scripts/test builds the whole workspace first).

use std::path::Path;
use std::process::Command;

const RVERBS: &str = env!("CARGO_BIN_EXE_rverbs");

fn rverbs(args: &[&str]) -> std::process::Output {
    Command::new(RVERBS).args(args).output().unwrap()
}

fn have_library() -> bool {
    let lib = Path::new(RVERBS).with_file_name("libibverbs.so");
    if !lib.is_file() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{} missing: scripts/test builds the workspace before testing",
            lib.display()
        );
        eprintln!("skipped: build rverbs-libibverbs first");
        return false;
    }
    true
}

#[test]
fn lib_dir_holds_libibverbs_so_1() {
    if !have_library() {
        return;
    }
    let o = rverbs(&["run", "--lib-dir"]);
    assert!(o.status.success(), "{o:?}");
    let dir = String::from_utf8(o.stdout).unwrap();
    let so = Path::new(dir.trim()).join("libibverbs.so.1");
    assert!(so.exists(), "{}", so.display());
    // It is the library built beside the binary.
    assert_eq!(
        std::fs::canonicalize(&so).unwrap(),
        std::fs::canonicalize(Path::new(RVERBS).with_file_name("libibverbs.so")).unwrap()
    );
}

#[test]
fn runs_an_unmodified_ibv_devices() {
    if !have_library() {
        return;
    }
    if !Path::new("/usr/bin/ibv_devices").exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "ibverbs-utils missing in CI"
        );
        eprintln!("skipped: ibverbs-utils not installed");
        return;
    }
    let o = rverbs(&["run", "--", "ibv_devices"]);
    assert!(o.status.success(), "{o:?}");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("rverbs0"), "{text}");
}

#[test]
fn errors_are_clear() {
    if !have_library() {
        return;
    }
    let o = rverbs(&["run"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing to run"));
    let o = rverbs(&["run", "--", "/nonexistent/program"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot run /nonexistent/program"), "{err}");
}
