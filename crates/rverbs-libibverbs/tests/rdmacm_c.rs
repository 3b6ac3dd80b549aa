//! librdmacm's semantics as a C program sees them (`c/rdmacm_semantics.c`,
//! built against Debian's `<rdma/rdma_cma.h>` and run on both drop-ins):
//! event channels, ids, listeners, private data and its limits, rejects,
//! devices, ports.

use std::path::{Path, PathBuf};

mod common;

/// A directory with both drop-ins under their SONAMEs.
fn lib_dir() -> PathBuf {
    let ibverbs = common::library();
    let rdmacm = ibverbs.with_file_name("librdmacm.so");
    assert!(
        rdmacm.exists(),
        "{} is missing: run `cargo build -p rverbs-librdmacm` first",
        rdmacm.display()
    );
    let dir = std::env::temp_dir().join(format!("rverbs-rdmacm-c-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(&ibverbs, dir.join("libibverbs.so.1")).unwrap();
    std::os::unix::fs::symlink(&rdmacm, dir.join("librdmacm.so.1")).unwrap();
    dir
}

#[test]
fn librdmacm_semantics() {
    if !Path::new("/usr/include/rdma/rdma_cma.h").exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "librdmacm-dev is needed in CI"
        );
        eprintln!("skipped: needs librdmacm-dev");
        return;
    }
    let dir = lib_dir();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let exe = dir.join("rdmacm_semantics");
    let out = std::process::Command::new("cc")
        .arg("-O0")
        .arg("-I")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg(src.join("rdmacm_semantics.c"))
        .arg("-lrdmacm")
        .arg("-libverbs")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let port = (22_000 + std::process::id() % 20_000).to_string();
    let (ok, text) = common::run_program(&exe, &[&port], &dir, &[]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok && text.contains("ok"), "{text}");
}
