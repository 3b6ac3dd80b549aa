//! The built library exports exactly the default-versioned symbols of
//! Debian's libibverbs.so.1, each with the same version node, plus one of
//! ours ([`OURS_ONLY`]: the rdma_cm table rverbs' librdmacm calls through,
//! at a node of its own), with Debian's SONAME and version nodes (plus
//! ours). Needs binutils' objdump/readelf and Debian's libibverbs1
//! (scripts/test installs them); without them it is skipped, unless `CI` is
//! set. (Each exported function is also visible unversioned under its
//! `rverbs_`-prefixed Rust symbol, the source of its `.symver` alias; those
//! are not compared.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use rverbs_ibverbs_abi::abi::rdmacm_ops::{RdmacmOps, RDMACM_OPS_VERSION};

const DEBIAN: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";

mod common;

/// What ours exports that Debian's does not, `name → node`: the function
/// that returns the rdma_cm's table (src/rdmacm), for rverbs' librdmacm
/// alone, at the private node RVERBS_PRIVATE_1 (no parent; no program
/// built against Debian's headers can refer to it).
const OURS_ONLY: [(&str, &str); 1] = [("__rverbs_rdmacm_ops", "RVERBS_PRIVATE_1")];

fn ours() -> PathBuf {
    common::library()
}

/// `name → version` of the defined, default-versioned dynamic symbols:
/// not the unversioned (`Base`) ones, not the hidden versions (`objdump -T`
/// prints those in parentheses), not the version nodes' own `*ABS*`
/// symbols.
fn exports(lib: &Path) -> BTreeMap<String, String> {
    let out = Command::new("objdump").arg("-T").arg(lib).output().unwrap();
    assert!(out.status.success(), "objdump -T {}", lib.display());
    let mut map = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let is_symbol = fields.len() >= 4
            && fields[0].len() == 16
            && fields[0].chars().all(|c| c.is_ascii_hexdigit());
        if !is_symbol || line.contains("*UND*") {
            continue;
        }
        let (version, name) = (fields[fields.len() - 2], fields[fields.len() - 1]);
        if version != "Base" && !version.starts_with('(') && name != version {
            map.insert(name.to_string(), version.to_string());
        }
    }
    map
}

/// The version nodes a library defines, in order (its SONAME first).
fn version_nodes(lib: &Path) -> Vec<String> {
    let out = Command::new("readelf").arg("-V").arg(lib).output().unwrap();
    assert!(out.status.success(), "readelf -V {}", lib.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip_while(|l| !l.contains(".gnu.version_d"))
        .take_while(|l| !l.contains(".gnu.version_r"))
        .filter_map(|l| l.split("Name: ").nth(1))
        .map(str::to_string)
        .collect()
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
fn exports_exactly_debians_symbols_and_ours_only() {
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
    for (name, _) in OURS_ONLY {
        assert!(!theirs.contains_key(name), "Debian's exports {name} too");
    }
    let mut want = theirs.clone();
    want.extend(OURS_ONLY.map(|(n, v)| (n.to_string(), v.to_string())));
    let mut problems = Vec::new();
    for (name, version) in &want {
        match ours.get(name) {
            None => problems.push(format!("missing: {name}@@{version}")),
            Some(v) if v != version => problems.push(format!("{name}: {v}, want {version}")),
            Some(_) => {}
        }
    }
    for (name, version) in &ours {
        if !want.contains_key(name) {
            problems.push(format!("extra: {name}@@{version}"));
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
fn the_version_nodes_are_debians_then_ours() {
    if !have_tools() {
        return;
    }
    let mut want = version_nodes(Path::new(DEBIAN));
    assert!(want.len() > 10, "Debian's nodes look wrong: {want:?}");
    want.push("RVERBS_PRIVATE_1".to_string());
    assert_eq!(version_nodes(&ours()), want);
}

/// Looks `__rverbs_rdmacm_ops@RVERBS_PRIVATE_1` up with `dlvsym`, as
/// rverbs' librdmacm does, and prints the table's size and version, then
/// calls two of its slots (their byte offsets are the arguments).
const RDMACM_OPS_PROGRAM: &str = r#"
#define _GNU_SOURCE /* dlvsym */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	size_t create_channel_at = strtoul(argv[1], NULL, 0);
	size_t event_str_at = strtoul(argv[2], NULL, 0);
	void *lib = dlopen("libibverbs.so.1", RTLD_NOW);
	if (!lib) {
		printf("dlopen: %s\n", dlerror());
		return 1;
	}
	const void *(*get_ops)(void);
	*(void **)&get_ops = dlvsym(lib, "__rverbs_rdmacm_ops", "RVERBS_PRIVATE_1");
	if (!get_ops) {
		printf("dlvsym: %s\n", dlerror());
		return 1;
	}
	const char *table = get_ops();
	size_t size;
	unsigned int version;
	memcpy(&size, table, sizeof(size));
	memcpy(&version, table + 8, sizeof(version));
	printf("size %zu version %u\n", size, version);

	void *(*create_channel)(void);
	const char *(*event_str)(int);
	memcpy(&create_channel, table + create_channel_at, sizeof(create_channel));
	memcpy(&event_str, table + event_str_at, sizeof(event_str));
	errno = 0;
	void *channel = create_channel();
	printf("rdma_create_event_channel %s %s\n", channel ? "non-NULL" : "NULL",
	       errno == ENOSYS ? "ENOSYS" : strerror(errno));
	printf("%s\n", event_str(9));
	return 0;
}
"#;

#[test]
fn the_rdmacm_table_is_exported_at_rverbs_private_1() {
    let dir = common::LibDir::new("rdmacm-ops");
    let Some(exe) = common::compile_c(&dir.0, "rdmacm_ops", RDMACM_OPS_PROGRAM) else {
        return;
    };
    let create_channel_at = std::mem::offset_of!(RdmacmOps, rdma_create_event_channel);
    let event_str_at = std::mem::offset_of!(RdmacmOps, rdma_event_str);
    let (ok, out) = common::run_program(
        &exe,
        &[&create_channel_at.to_string(), &event_str_at.to_string()],
        &dir.0,
        &[],
    );
    assert!(ok, "the program failed:\n{out}");
    let want = format!(
        "size {} version {RDMACM_OPS_VERSION}\n\
         rdma_create_event_channel non-NULL Success\n\
         RDMA_CM_EVENT_ESTABLISHED\n",
        std::mem::size_of::<RdmacmOps>()
    );
    assert_eq!(out, want);
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
