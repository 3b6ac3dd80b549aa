//! The built library exports exactly the `name@@NODE` pairs of symbols.txt,
//! with the SONAME and version nodes of Debian's, and symbols.txt is what
//! Debian's librdmacm.so.1 (rdma-core 44) exports. Needs binutils'
//! objdump/readelf, and for the comparison with Debian's library the
//! librdmacm1 package (scripts/test installs them); without them the tests
//! are skipped, unless `CI` is set.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const DEBIAN: &str = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";

/// The version nodes, in the order (and with the parents) Debian's
/// library defines them.
const NODES: [&str; 4] = ["RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"];

/// `name → version` of the defined, default-versioned `RDMACM_*` dynamic
/// symbols (not the version nodes' own `*ABS*` symbols).
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
        if version.starts_with("RDMACM") && name != version {
            map.insert(name.to_string(), version.to_string());
        }
    }
    map
}

/// symbols.txt as `name → version`.
fn listed() -> BTreeMap<String, String> {
    let text = include_str!("../symbols.txt");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (name, node) = l.split_once(' ').expect("`name NODE` lines");
            (name.to_string(), node.to_string())
        })
        .collect()
}

fn have_binutils() -> bool {
    let ok = Command::new("objdump").arg("--version").output().is_ok()
        && Command::new("readelf").arg("--version").output().is_ok();
    if !ok {
        common::skip("needs binutils' objdump and readelf");
    }
    ok
}

/// The differences between two `name → version` maps, one line each.
fn differences(want: &BTreeMap<String, String>, got: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, version) in want {
        match got.get(name) {
            None => problems.push(format!("missing: {name}@@{version}")),
            Some(v) if v != version => problems.push(format!("{name}: {v}, want {version}")),
            Some(_) => {}
        }
    }
    for (name, version) in got {
        if !want.contains_key(name) {
            problems.push(format!("extra: {name}@@{version}"));
        }
    }
    problems
}

#[test]
fn exports_exactly_the_symbols_of_symbols_txt() {
    if !have_binutils() {
        return;
    }
    let want = listed();
    assert_eq!(
        want.len(),
        68,
        "symbols.txt should list Debian's 68 symbols"
    );
    let problems = differences(&want, &exports(&common::library()));
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn symbols_txt_is_what_debians_library_exports() {
    if !have_binutils() {
        return;
    }
    if !Path::new(DEBIAN).exists() {
        common::skip(&format!("needs Debian's librdmacm1 ({DEBIAN})"));
        return;
    }
    let problems = differences(&exports(Path::new(DEBIAN)), &listed());
    assert!(
        problems.is_empty(),
        "symbols.txt differs from {DEBIAN} in {} ways:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_soname_is_librdmacm_so_1() {
    if !have_binutils() {
        return;
    }
    let out = Command::new("readelf")
        .arg("-d")
        .arg(common::library())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Library soname: [librdmacm.so.1]"), "{text}");
}

#[test]
fn the_version_nodes_are_debians() {
    if !have_binutils() {
        return;
    }
    let out = Command::new("readelf")
        .arg("-V")
        .arg(common::library())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let defined: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.contains(".gnu.version_d"))
        .take_while(|l| !l.contains(".gnu.version_r"))
        .filter_map(|l| l.split("Name: ").nth(1))
        .collect();
    let mut want = vec!["librdmacm.so.1"];
    want.extend(NODES);
    assert_eq!(defined, want, "{text}");
}
