#![allow(dead_code)] // each test binary uses part of it
//! Shared by the tests that load the built library.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The built `libibverbs.so` (`target/<profile>/`, beside the test's
/// `deps/`). `cargo test` does not build a cdylib for integration tests, so
/// it must be built first (`cargo build -p rverbs-libibverbs`, which
/// scripts/test does): a library older than any source it is made of fails
/// the test rather than testing stale code.
pub fn library() -> PathBuf {
    built(
        "libibverbs.so",
        "rverbs-libibverbs",
        &[
            "rverbs-libibverbs",
            "rverbs-ibverbs-abi",
            "rverbs",
            "rverbs-wire",
            // The version script's generator (build.rs includes it).
            "../build-support",
        ],
    )
}

/// `file` in `target/<profile>/`, built by `package`, and no older than
/// any source under `sources` (crate directories): a missing or stale one
/// fails the test, saying what to build.
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
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let newest = sources
        .iter()
        .map(|c| newest_source(&crates.join(c)))
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

/// A fresh directory holding `libibverbs.so.1` → the built library, for
/// `LD_LIBRARY_PATH` (the loader looks the library up by its SONAME);
/// removed on drop.
pub struct LibDir(pub PathBuf);

/// The built `librdmacm.so` (`cargo build -p rverbs-librdmacm`), checked
/// against its sources as [`library`] is; it forwards every rdma_cm call
/// to the built libibverbs.
pub fn librdmacm() -> PathBuf {
    built(
        "librdmacm.so",
        "rverbs-librdmacm",
        &["rverbs-librdmacm", "rverbs-ibverbs-abi", "../build-support"],
    )
}

impl LibDir {
    /// The same, also holding `librdmacm.so.1` → the built librdmacm, for
    /// rdma_cm programs.
    pub fn with_rdmacm(tag: &str) -> LibDir {
        let dir = LibDir::new(tag);
        std::os::unix::fs::symlink(librdmacm(), dir.0.join("librdmacm.so.1")).unwrap();
        dir
    }

    pub fn new(tag: &str) -> LibDir {
        let lib = library();
        let dir = std::env::temp_dir().join(format!(
            "rverbs-libdir-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(&lib, dir.join("libibverbs.so.1")).unwrap();
        LibDir(dir)
    }
}

impl Drop for LibDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles the C program `source` against Debian's verbs.h and
/// libibverbs into `dir`; `None` (after the CI check) when cc or the
/// header is missing.
pub fn compile_c(dir: &Path, name: &str, source: &str) -> Option<PathBuf> {
    let have = Path::new("/usr/include/infiniband/verbs.h").exists()
        && std::process::Command::new("cc")
            .arg("--version")
            .output()
            .is_ok();
    if !have {
        assert!(
            std::env::var_os("CI").is_none(),
            "needs cc and libibverbs-dev in CI"
        );
        eprintln!("skipped: needs cc and libibverbs-dev");
        return None;
    }
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    // The CHECK macro, the RC connect and the wait for a sleeping thread
    // the C tests share, found beside the source.
    std::fs::write(dir.join("check.h"), include_str!("../c/check.h")).unwrap();
    std::fs::write(dir.join("connect.h"), include_str!("../c/connect.h")).unwrap();
    std::fs::write(dir.join("asleep.h"), include_str!("../c/asleep.h")).unwrap();
    let exe = dir.join(name);
    let out = std::process::Command::new("cc")
        .arg("-O0")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-libverbs")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cc {name}.c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

/// Runs `exe` with `args`, the drop-in from `lib_dir` and `env`: whether it
/// exited successfully, and its stdout then stderr.
pub fn run_program(
    exe: &Path,
    args: &[&str],
    lib_dir: &Path,
    env: &[(&str, &str)],
) -> (bool, String) {
    let out = std::process::Command::new(exe)
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        .unwrap_or(false)
}

/// The built `librverbs_uverbs_node.so` (`cargo build -p
/// rverbs-uverbs-node`), which `rverbs run` preloads for UCX.
pub fn uverbs_node_preload() -> PathBuf {
    built(
        "librverbs_uverbs_node.so",
        "rverbs-uverbs-node",
        &["rverbs-uverbs-node"],
    )
}
