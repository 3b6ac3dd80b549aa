//! `rverbs run`: unmodified C programs on the drop-in libraries built
//! beside the binary (scripts/test builds the whole workspace first).

use std::path::Path;
use std::process::Command;

const RVERBS: &str = env!("CARGO_BIN_EXE_rverbs");

fn rverbs(args: &[&str]) -> std::process::Output {
    Command::new(RVERBS).args(args).output().unwrap()
}

fn have_library() -> bool {
    for file in ["libibverbs.so", "librdmacm.so", "librverbs_uverbs_node.so"] {
        let lib = Path::new(RVERBS).with_file_name(file);
        if !lib.is_file() {
            assert!(
                std::env::var_os("CI").is_none(),
                "{} missing: scripts/test builds the workspace before testing",
                lib.display()
            );
            eprintln!(
                "skipped: build rverbs-libibverbs, rverbs-librdmacm and rverbs-uverbs-node first"
            );
            return false;
        }
    }
    true
}

#[test]
fn lib_dir_holds_libibverbs_so_1_and_librdmacm_so_1() {
    if !have_library() {
        return;
    }
    let o = rverbs(&["run", "--lib-dir"]);
    assert!(o.status.success(), "{o:?}");
    let dir = String::from_utf8(o.stdout).unwrap();
    for (soname, file) in [
        ("libibverbs.so.1", "libibverbs.so"),
        ("librdmacm.so.1", "librdmacm.so"),
    ] {
        let so = Path::new(dir.trim()).join(soname);
        assert!(so.exists(), "{}", so.display());
        // It is the library built beside the binary.
        assert_eq!(
            std::fs::canonicalize(&so).unwrap(),
            std::fs::canonicalize(Path::new(RVERBS).with_file_name(file)).unwrap()
        );
    }
}

/// A copy of the rverbs binary in a directory of its own, with
/// `libibverbs.so` beside it but no `librdmacm.so`: `run` says which
/// library is missing and how to build it, and runs nothing.
#[test]
fn a_missing_librdmacm_is_a_clear_error() {
    if !have_library() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("rverbs-run-nocm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("rverbs");
    std::fs::copy(RVERBS, &exe).unwrap();
    std::os::unix::fs::symlink(
        Path::new(RVERBS).with_file_name("libibverbs.so"),
        dir.join("libibverbs.so"),
    )
    .unwrap();
    let o = Command::new(&exe)
        .args(["run", "--", "true"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("librdmacm.so is missing")
            && err.contains("cargo build --release -p rverbs-libibverbs -p rverbs-librdmacm"),
        "{err}"
    );
}

#[test]
fn runs_an_unmodified_rdma_cm_program() {
    if !have_library() {
        return;
    }
    if !Path::new("/usr/bin/rping").exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "rdmacm-utils missing in CI"
        );
        eprintln!("skipped: rdmacm-utils not installed");
        return;
    }
    // rping's client to a port nobody listens on: rdma_cm on rverbs (the
    // kernel's would say there is no RDMA device) reports the rejection.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let o = rverbs(&[
        "run",
        "--",
        "rping",
        "-c",
        "-a",
        "127.0.0.1",
        "-p",
        &port,
        "-C",
        "1",
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(text.contains("RDMA_CM_EVENT_REJECTED"), "{text}");
}

#[test]
fn runs_an_unmodified_ibv_devices() {
    if !have_library() {
        return;
    }
    if !Path::new("/usr/bin/ibv_devices").exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "ibverbs-utils missing in CI"
        );
        eprintln!("skipped: ibverbs-utils not installed");
        return;
    }
    let o = rverbs(&["run", "--", "ibv_devices"]);
    assert!(o.status.success(), "{o:?}");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("rverbs0"), "{text}");
}

#[test]
fn errors_are_clear() {
    if !have_library() {
        return;
    }
    let o = rverbs(&["run"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing to run"));
    let o = rverbs(&["run", "--", "/nonexistent/program"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot run /nonexistent/program"), "{err}");
}

/// `scripts/install` into a scratch root (`--destdir`, the way a package
/// is staged), then the installed `rverbs run` runs an unmodified
/// `ibv_devinfo` from another directory through the installed libraries
/// alone: `lib/rverbs` beside its `bin/`, never the build tree.
#[test]
fn the_installed_files_run_an_unmodified_program_from_anywhere() {
    if !have_library() {
        return;
    }
    let Some(devinfo) = ["/usr/bin/ibv_devinfo"]
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
    else {
        assert!(
            std::env::var_os("CI").is_none(),
            "ibv_devinfo (ibverbs-utils) is needed in CI"
        );
        eprintln!("skipped: needs ibverbs-utils");
        return;
    };
    let root = std::env::temp_dir().join(format!("rverbs-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let profile = Path::new(RVERBS)
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/install");
    let o = Command::new(&script)
        .args([
            "--no-build",
            "--profile",
            profile,
            "--prefix",
            "/usr",
            "--destdir",
        ])
        .arg(&root)
        .output()
        .unwrap();
    assert!(o.status.success(), "scripts/install: {o:?}");
    let bin = root.join("usr/bin/rverbs");
    for f in [
        "share/man/man1/rverbs.1",
        "share/man/man1/rverbs-run.1",
        "share/bash-completion/completions/rverbs",
        "share/zsh/site-functions/_rverbs",
    ] {
        assert!(root.join("usr").join(f).is_file(), "{f} installed");
    }
    for f in [
        "libibverbs.so.1",
        "librdmacm.so.1",
        "librverbs_uverbs_node.so",
    ] {
        assert!(
            root.join("usr/lib/rverbs").join(f).is_file(),
            "{f} installed"
        );
    }
    let o = Command::new(&bin)
        .args(["run", "--lib-dir"])
        .current_dir("/")
        .output()
        .unwrap();
    let dir = String::from_utf8(o.stdout).unwrap();
    assert_eq!(
        Path::new(dir.trim()),
        root.join("usr/lib/rverbs"),
        "the installed rverbs uses the installed libraries"
    );
    let o = Command::new(&bin)
        .args(["run", "--"])
        .arg(devinfo)
        .current_dir("/")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && text.contains("hca_id:\trverbs0"),
        "installed rverbs run -- ibv_devinfo: {o:?}"
    );
    let _ = std::fs::remove_dir_all(&root);
}
