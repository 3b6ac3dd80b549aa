//! Every symbol Debian's libibverbs.so.1 exports with a default version is
//! exported by ours with the same version node, and the SONAME matches.
//! Needs binutils' objdump/readelf and Debian's libibverbs1 (scripts/test
//! installs them); without them it is skipped, unless `CI` is set.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const DEBIAN: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";

mod common;

fn ours() -> PathBuf {
    common::library()
}

/// `name → version` of the defined, default-versioned dynamic symbols
/// (`objdump -T` prints a hidden version in parentheses).
fn exports(lib: &Path) -> BTreeMap<String, String> {
    let out = Command::new("objdump").arg("-T").arg(lib).output().unwrap();
    assert!(out.status.success(), "objdump -T {}", lib.display());
    let mut map = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 4 || line.contains("*UND*") {
            continue;
        }
        let (version, name) = (fields[fields.len() - 2], fields[fields.len() - 1]);
        if version.starts_with("IBVERBS") && name != version {
            map.insert(name.to_string(), version.to_string());
        }
    }
    map
}

fn have_tools() -> bool {
    let ok = Path::new(DEBIAN).exists()
        && Command::new("objdump").arg("--version").output().is_ok()
        && Command::new("readelf").arg("--version").output().is_ok();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "needs objdump, readelf and Debian's libibverbs1 in CI"
        );
        eprintln!("skipped: needs objdump, readelf and {DEBIAN}");
    }
    ok
}

#[test]
fn every_debian_symbol_is_exported_with_its_version() {
    if !have_tools() {
        return;
    }
    let theirs = exports(Path::new(DEBIAN));
    let ours = exports(&ours());
    assert!(
        theirs.len() > 140,
        "Debian's list looks wrong: {}",
        theirs.len()
    );
    let mut problems = Vec::new();
    for (name, version) in &theirs {
        match ours.get(name) {
            None => problems.push(format!("missing: {name}@@{version}")),
            Some(v) if v != version => problems.push(format!("{name}: {v}, want {version}")),
            Some(_) => {}
        }
    }
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_soname_is_libibverbs_so_1() {
    if !have_tools() {
        return;
    }
    let out = Command::new("readelf")
        .arg("-d")
        .arg(ours())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Library soname: [libibverbs.so.1]"), "{text}");
}
