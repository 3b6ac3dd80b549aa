//! Shared by the tests that load the built library.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The built `libibverbs.so` (`target/<profile>/`, beside the test's
/// `deps/`). `cargo test` does not build a cdylib for integration tests, so
/// it must be built first (`cargo build -p rverbs-libibverbs`, which
/// scripts/test does): a library older than any source it is made of fails
/// the test rather than testing stale code.
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap();
    let lib = profile_dir.join("libibverbs.so");
    let built = std::fs::metadata(&lib)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: run `cargo build -p rverbs-libibverbs` first",
                lib.display()
            )
        });
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let newest = ["libibverbs", "rverbs-ibverbs", "rverbs", "rverbs-wire"]
        .iter()
        .map(|c| newest_source(&crates.join(c)))
        .max()
        .unwrap_or(SystemTime::UNIX_EPOCH);
    assert!(
        built >= newest,
        "{} is older than its sources: run `cargo build -p rverbs-libibverbs` first",
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
