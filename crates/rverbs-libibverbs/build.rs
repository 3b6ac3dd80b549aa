//! Writes the version script that gives every exported symbol the version
//! node Debian's rdma-core 44 libibverbs gives it (symbols.txt: one
//! `name NODE` per line, taken from `objdump -T` of the installed library),
//! and sets the SONAME.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The nodes in inheritance order (each one's parent is the one before;
/// IBVERBS_PRIVATE_34 stands alone).
const CHAIN: [&str; 12] = [
    "IBVERBS_1.0",
    "IBVERBS_1.1",
    "IBVERBS_1.5",
    "IBVERBS_1.6",
    "IBVERBS_1.7",
    "IBVERBS_1.8",
    "IBVERBS_1.9",
    "IBVERBS_1.10",
    "IBVERBS_1.11",
    "IBVERBS_1.12",
    "IBVERBS_1.13",
    "IBVERBS_1.14",
];
const PRIVATE: &str = "IBVERBS_PRIVATE_34";

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    println!("cargo:rerun-if-changed=symbols.txt");
    let list = std::fs::read_to_string(format!("{dir}/symbols.txt")).expect("symbols.txt");
    let mut nodes: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for line in list.lines().filter(|l| !l.trim().is_empty()) {
        let mut it = line.split_whitespace();
        let (Some(name), Some(node)) = (it.next(), it.next()) else {
            panic!("symbols.txt: bad line {line:?}");
        };
        assert!(
            CHAIN.contains(&node) || node == PRIVATE,
            "symbols.txt: unknown node {node}"
        );
        nodes.entry(node).or_default().push(name);
    }
    let mut map = String::new();
    let mut parent: Option<&str> = None;
    for node in CHAIN.iter().copied().chain([PRIVATE]) {
        let syms = nodes.get(node).map(Vec::as_slice).unwrap_or(&[]);
        let _ = writeln!(map, "{node} {{");
        if !syms.is_empty() {
            let _ = writeln!(map, "  global:");
            for s in syms {
                let _ = writeln!(map, "    {s};");
            }
        }
        match (node, parent) {
            (PRIVATE, _) | (_, None) => {
                let _ = writeln!(map, "}};");
            }
            (_, Some(p)) => {
                let _ = writeln!(map, "}} {p};");
            }
        }
        if node != PRIVATE {
            parent = Some(node);
        }
    }
    let path = format!("{out}/libibverbs.map");
    std::fs::write(&path, map).expect("write the version script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={path}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}
