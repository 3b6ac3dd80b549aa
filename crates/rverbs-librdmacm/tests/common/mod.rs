#![allow(dead_code)] // each test binary uses part of it
//! Shared by the tests that look at or load the built library (the same
//! helpers as crates/rverbs-libibverbs/tests/common, for librdmacm).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

/// Fails under `CI`, else prints that the test is skipped: a test skipped
/// for a missing tool must fail where everything is meant to be installed.
pub fn skip(why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{why} (CI is set, so this is a failure)"
    );
    eprintln!("skipped: {why}");
}

/// The built `librdmacm.so` (`target/<profile>/`, beside the test's
/// `deps/`). `cargo test` does not build a cdylib for integration tests, so
/// it must be built first (`cargo build -p rverbs-librdmacm`, which
/// scripts/test does): a library older than any source it is made of fails
/// the test rather than testing stale code.
pub fn library() -> PathBuf {
    built(
        "librdmacm.so",
        "rverbs-librdmacm",
        &[
            "crates/rverbs-librdmacm",
            "crates/rverbs-ibverbs-abi",
            // The version script's generator (build.rs includes it).
            "build-support",
        ],
    )
}

/// The built `libibverbs.so`, checked the same way: librdmacm forwards
/// every call to the rdma_cm inside it, so the programs here run on both
/// (`cargo build -p rverbs-libibverbs` first).
pub fn libibverbs() -> PathBuf {
    built(
        "libibverbs.so",
        "rverbs-libibverbs",
        &[
            "crates/rverbs-libibverbs",
            "crates/rverbs-ibverbs-abi",
            "crates/rverbs",
            "crates/rverbs-wire",
            "build-support",
        ],
    )
}

/// `target/<profile>/<file>`, built by `cargo build -p <package>` no
/// earlier than the newest source under `sources` (relative to the
/// workspace).
fn built(file: &str, package: &str, sources: &[&str]) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap();
    let lib = profile_dir.join(file);
    let built = std::fs::metadata(&lib)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: run `cargo build -p {package}` first",
                lib.display()
            )
        });
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .unwrap();
    let newest = sources
        .iter()
        .map(|c| newest_source(&root.join(c)))
        .max()
        .unwrap_or(SystemTime::UNIX_EPOCH);
    assert!(
        built >= newest,
        "{} is older than its sources: run `cargo build -p {package}` first",
        lib.display()
    );
    lib
}

fn newest_source(dir: &Path) -> SystemTime {
    let mut newest = SystemTime::UNIX_EPOCH;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return newest;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name();
        if name == "target" || name == "tests" {
            continue;
        }
        let t = if path.is_dir() {
            newest_source(&path)
        } else if path
            .extension()
            .is_some_and(|x| x == "rs" || x == "txt" || x == "toml")
        {
            e.metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH)
        } else {
            SystemTime::UNIX_EPOCH
        };
        newest = newest.max(t);
    }
    newest
}

/// A fresh directory for `LD_LIBRARY_PATH` (the loader looks libraries up
/// by their SONAME), removed on drop.
pub struct LibDir(pub PathBuf);

impl LibDir {
    /// `librdmacm.so.1` → the built librdmacm and `libibverbs.so.1` → the
    /// built libibverbs, which holds the rdma_cm librdmacm forwards to.
    pub fn new(tag: &str) -> LibDir {
        LibDir::with(tag, &libibverbs())
    }

    /// `librdmacm.so.1` → the built librdmacm and `libibverbs.so.1` →
    /// `libibverbs`, some other library (Debian's).
    pub fn with(tag: &str, libibverbs: &Path) -> LibDir {
        let lib = library();
        let dir = std::env::temp_dir().join(format!(
            "rverbs-rdmacm-libdir-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(&lib, dir.join("librdmacm.so.1")).unwrap();
        std::os::unix::fs::symlink(libibverbs, dir.join("libibverbs.so.1")).unwrap();
        LibDir(dir)
    }
}

impl Drop for LibDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles the C program `source` against Debian's rdma_cma.h and links
/// it with `-lrdmacm`, into `dir`; `None` (after the CI check) when cc or
/// the header is missing.
pub fn compile_c(dir: &Path, name: &str, source: &str) -> Option<PathBuf> {
    let have = Path::new("/usr/include/rdma/rdma_cma.h").exists()
        && Command::new("cc").arg("--version").output().is_ok();
    if !have {
        skip("needs cc and librdmacm-dev");
        return None;
    }
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let exe = dir.join(name);
    let out = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-O0", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-lrdmacm")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cc {name}.c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

/// Runs `exe` with `args`, with `LD_LIBRARY_PATH` set to `lib_dir` when
/// given (else the system's librdmacm): whether it exited successfully, and
/// its stdout then stderr.
pub fn run_program(exe: &Path, args: &[&str], lib_dir: Option<&Path>) -> (bool, String) {
    let mut cmd = Command::new(exe);
    cmd.args(args);
    if let Some(dir) = lib_dir {
        cmd.env("LD_LIBRARY_PATH", dir);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}
