//! `rverbs run -- PROGRAM ARGS…`: runs an unmodified C verbs or rdma_cm
//! program on rverbs by putting the drop-in `libibverbs.so.1` and
//! `librdmacm.so.1` first on its library path, and preloading
//! `librverbs_uverbs_node.so`, which shows programs that look for the
//! kernel's `/dev/infiniband/uverbsN` before they use a device (UCX) the
//! node they expect (see `crates/rverbs-uverbs-node`). Installed
//! (`scripts/install`), they are in `lib/rverbs/` beside this binary's
//! `bin/`. In the build tree they are the ones built beside this binary
//! (`target/<profile>/libibverbs.so` and `librdmacm.so`); the loader looks
//! them up by their SONAMEs, so a directory `ibverbs/` next to them holds
//! `libibverbs.so.1` and `librdmacm.so.1` links to them.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

/// Arguments of `rverbs run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Print the directory that holds libibverbs.so.1 and librdmacm.so.1
    /// (for LD_LIBRARY_PATH) and exit.
    #[arg(long)]
    pub lib_dir: bool,
    /// The program and its arguments (after `--`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

/// The drop-in libraries and the preload: the file cargo builds, the name
/// programs load it by, and the package that builds it.
const LIBRARIES: [(&str, &str, &str); 3] = [
    ("libibverbs.so", "libibverbs.so.1", "rverbs-libibverbs"),
    ("librdmacm.so", "librdmacm.so.1", "rverbs-librdmacm"),
    (PRELOAD, PRELOAD, "rverbs-uverbs-node"),
];

/// The library `rverbs run` preloads (`crates/rverbs-uverbs-node`).
pub const PRELOAD: &str = "librverbs_uverbs_node.so";

/// The directory holding `libibverbs.so.1` and `librdmacm.so.1`: the
/// installed `PREFIX/lib/rverbs`, or one made if needed next to the built
/// libraries. Either library missing is an error that says how to build
/// or install it.
pub fn lib_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("where is this rverbs binary?")?;
    let profile = exe.parent().unwrap_or(Path::new("."));
    if let Some(installed) = profile
        .parent()
        .map(|prefix| prefix.join("lib").join("rverbs"))
        .filter(|d| {
            LIBRARIES
                .iter()
                .all(|(_, soname, _)| d.join(soname).is_file())
        })
    {
        return Ok(installed);
    }
    for (file, _, package) in LIBRARIES {
        let built = profile.join(file);
        if !built.is_file() {
            bail!(
                "{} is missing: build the drop-in libraries with \
                 `cargo build --release -p rverbs-libibverbs -p rverbs-librdmacm \
                 -p rverbs-uverbs-node` \
                 (the same profile as this rverbs; {file} is {package}'s), \
                 or install rverbs with scripts/install",
                built.display()
            );
        }
    }
    let dir = profile.join("ibverbs");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for (file, soname, _) in LIBRARIES {
        let link = dir.join(soname);
        let target = Path::new("..").join(file);
        if std::fs::read_link(&link).ok().as_deref() != Some(target.as_path()) {
            // Made beside and renamed over: several rverbs at once all succeed.
            let tmp = dir.join(format!(".{soname}.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&target, &tmp)
                .with_context(|| format!("linking {}", tmp.display()))?;
            std::fs::rename(&tmp, &link).with_context(|| format!("linking {}", link.display()))?;
        }
    }
    Ok(dir)
}

/// Runs `rverbs run`: replaces this process with the program (it only
/// returns on error).
pub fn run(args: &RunArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let dir = lib_dir()?;
    if args.lib_dir {
        writeln!(out, "{}", dir.display())?;
        return Ok(());
    }
    let Some((program, rest)) = args.command.split_first() else {
        bail!("nothing to run: rverbs run -- PROGRAM [ARGS…]");
    };
    let mut path = OsString::from(&dir);
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut preload = OsString::from(dir.join(PRELOAD));
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    out.flush()?;
    let err = std::process::Command::new(program)
        .args(rest)
        .env("LD_LIBRARY_PATH", path)
        .env("LD_PRELOAD", preload)
        .exec();
    bail!("cannot run {}: {err}", program.to_string_lossy())
}
