//! rdma-core's own test suite for libibverbs (pyverbs, from Debian's
//! `python3-pyverbs`: the tests under `/usr/share/doc/rdma-core/tests`),
//! unmodified, on the drop-in library: no failure, no error, at least
//! [`AT_LEAST_PASSING`] tests passing, and every skip for a reason listed
//! below — a device feature neither rverbs nor the kernel's Soft-RoCE has,
//! hardware rxe lacks too, or one of rverbs' own, which the README lists.

use std::path::Path;
use std::process::Command;

mod common;

/// Tests that pass on the drop-in (the kernel's Soft-RoCE, 6.1 with
/// Debian's rdma-core 44: 86).
const AT_LEAST_PASSING: usize = 90;

/// Why a test may skip here: substrings of unittest's skip reasons.
const ALLOWED_SKIPS: &[(&str, &str)] = &[
    // Vendor hardware and its direct verbs: skip on rxe too.
    ("non MLX5 device", "mlx5 hardware"),
    ("not an MLX5 device", "mlx5 hardware"),
    ("non EFA device", "EFA hardware"),
    ("cuda-python", "CUDA"),
    ("dmabuf", "a GPU's dma-buf"),
    ("huge pages", "the host's huge pages"),
    ("PCI device must be passed", "a PCI device for VFIO"),
    // Features the kernel's Soft-RoCE lacks as well.
    ("Device memory is not supported", "device memory"),
    ("ODP is not supported", "on-demand paging"),
    ("Create QP type 8 is not supported", "raw packet QPs"),
    ("Raw Packet QP", "raw packet QPs"),
    ("Create XRCD is not supported", "XRC"),
    ("Parent Domain is not supported", "parent domains"),
    ("Extended CQ is not supported", "tag matching"),
    (
        "memory window of type 3",
        "a type 3 memory window (none exists)",
    ),
    ("All gid indices populated", "a free GID index"),
    ("Query device real time is not supported", "a device clock"),
    // rverbs' own (the README lists them).
    ("have net interface", "a netdev in sysfs for the device"),
    ("Importing a device is not supported", "ibv_import_device"),
];

#[test]
fn rdma_cores_own_tests_pass_on_the_drop_in() {
    let suite = Path::new("/usr/share/doc/rdma-core/tests");
    if !suite.join("run_tests.py").exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3-pyverbs is needed in CI"
        );
        eprintln!("skipped: needs python3-pyverbs");
        return;
    }
    let lib = common::LibDir::with_rdmacm("pyverbs");
    // Debian ships some of the suite's modules gzipped: a copy to run.
    let copy = lib.0.join("tests");
    let cp = Command::new("cp")
        .arg("-r")
        .arg(suite)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(cp.success(), "cp -r {}", suite.display());
    let gz: Vec<_> = std::fs::read_dir(&copy)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gz"))
        .collect();
    if !gz.is_empty() {
        let unzip = Command::new("gzip").arg("-d").args(&gz).status().unwrap();
        assert!(unzip.success(), "gzip -d");
    }
    let out = Command::new("/usr/bin/python3")
        .arg(copy.join("run_tests.py"))
        .arg("-v")
        .env("LD_LIBRARY_PATH", &lib.0)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let results = results(&text);
    let count = |what: &str| results.iter().filter(|(_, r)| r == what).count();
    let (passed, failed, errors) = (count("ok"), count("FAIL"), count("ERROR"));
    let skipped: Vec<&(String, String)> = results
        .iter()
        .filter(|(_, r)| r.starts_with("skipped"))
        .collect();
    eprintln!(
        "pyverbs: {} tests, {passed} passed, {failed} failed, {errors} errors, {} skipped",
        results.len(),
        skipped.len()
    );
    assert!(
        text.contains("\nRan "),
        "the suite did not run to its end:\n{text}"
    );
    assert_eq!((failed, errors), (0, 0), "failures or errors:\n{text}");
    let unexplained: Vec<_> = skipped
        .iter()
        .filter(|(_, r)| !ALLOWED_SKIPS.iter().any(|(s, _)| r.contains(s)))
        .collect();
    assert!(
        unexplained.is_empty(),
        "skipped for reasons not listed: {unexplained:#?}"
    );
    assert!(
        passed >= AT_LEAST_PASSING,
        "{passed} passed, fewer than {AT_LEAST_PASSING}:\n{text}"
    );
}

/// Each test's name and result (`ok`, `FAIL`, `ERROR`, `skipped '…'`)
/// from unittest's verbose output: `name (module.Class.name)`, perhaps a
/// line of its docstring, then ` ... RESULT`.
fn results(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let (head, result) = match line.split_once(" ... ") {
            Some((h, r)) => (h, Some(r)),
            None => (line, None),
        };
        if let Some(open) = head.find(" (tests.") {
            if head.ends_with(')') {
                current = Some(head[..open].to_string());
            }
        }
        if let (Some(r), Some(name)) = (result, current.as_ref()) {
            out.push((name.clone(), r.trim().to_string()));
            current = None;
        }
    }
    out
}
