//! Shared by the drop-in C libraries' build scripts
//! (`crates/rverbs-libibverbs/build.rs`, `crates/rverbs-librdmacm/build.rs`,
//! each including this file with `#[path]`): turns the crate's `symbols.txt`
//! (one `name NODE` per line, taken from `objdump -T` of Debian's library)
//! into a version script that gives every exported symbol its version node,
//! and sets the SONAME.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A library's version nodes and SONAME.
pub struct Versions<'a> {
    /// The file name of the script, in `OUT_DIR` (`libibverbs.map`).
    pub script: &'a str,
    /// The SONAME (`libibverbs.so.1`).
    pub soname: &'a str,
    /// The nodes in inheritance order: each one's parent is the one before.
    pub chain: &'a [&'a str],
    /// Nodes with no parent, written after the chain.
    pub standalone: &'a [&'a str],
}

/// Reads `symbols.txt`, writes the version script into `OUT_DIR` and tells
/// cargo to link the cdylib with it and with the SONAME. Panics on a line
/// that is not `name NODE` or names a node that is not in `versions`.
pub fn write(versions: &Versions) {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    println!("cargo:rerun-if-changed=symbols.txt");
    println!("cargo:rerun-if-changed=../../build-support/version_script.rs");
    let list = std::fs::read_to_string(format!("{dir}/symbols.txt")).expect("symbols.txt");
    let mut nodes: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for line in list.lines().filter(|l| !l.trim().is_empty()) {
        let mut it = line.split_whitespace();
        let (Some(name), Some(node), None) = (it.next(), it.next(), it.next()) else {
            panic!("symbols.txt: bad line {line:?}");
        };
        assert!(
            versions.chain.contains(&node) || versions.standalone.contains(&node),
            "symbols.txt: unknown node {node}"
        );
        nodes.entry(node).or_default().push(name);
    }
    let mut map = String::new();
    let mut parent: Option<&str> = None;
    let chained = versions.chain.iter().map(|n| (*n, true));
    let alone = versions.standalone.iter().map(|n| (*n, false));
    for (node, in_chain) in chained.chain(alone) {
        let syms = nodes.get(node).map(Vec::as_slice).unwrap_or(&[]);
        let _ = writeln!(map, "{node} {{");
        if !syms.is_empty() {
            let _ = writeln!(map, "  global:");
            for s in syms {
                let _ = writeln!(map, "    {s};");
            }
        }
        match (in_chain, parent) {
            (true, Some(p)) => {
                let _ = writeln!(map, "}} {p};");
            }
            _ => {
                let _ = writeln!(map, "}};");
            }
        }
        if in_chain {
            parent = Some(node);
        }
    }
    let path = format!("{out}/{}", versions.script);
    std::fs::write(&path, map).expect("write the version script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={path}");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,-soname,{}",
        versions.soname
    );
}
