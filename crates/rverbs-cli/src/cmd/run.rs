//! `rverbs run -- PROGRAM ARGS…`: runs an unmodified C verbs program on
//! rverbs by putting the drop-in `libibverbs.so.1` first on its library
//! path. The library is the one built beside this binary
//! (`target/<profile>/libibverbs.so`); the loader looks it up by its SONAME,
//! so a directory `ibverbs/` next to it holds a `libibverbs.so.1` link to it.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

/// Arguments of `rverbs run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Print the directory that holds libibverbs.so.1 (for LD_LIBRARY_PATH)
    /// and exit.
    #[arg(long)]
    pub lib_dir: bool,
    /// The program and its arguments (after `--`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

/// The directory holding `libibverbs.so.1`, made if needed next to the
/// built `libibverbs.so`.
pub fn lib_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("where is this rverbs binary?")?;
    let built = exe.parent().unwrap_or(Path::new(".")).join("libibverbs.so");
    if !built.is_file() {
        bail!(
            "{} is missing: build the drop-in library with \
             `cargo build --release -p rverbs-libibverbs` (the same profile as this rverbs)",
            built.display()
        );
    }
    let dir = built.with_file_name("ibverbs");
    let link = dir.join("libibverbs.so.1");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    if std::fs::read_link(&link).ok().as_deref() != Some(Path::new("../libibverbs.so")) {
        // Made beside and renamed over: several rverbs at once all succeed.
        let tmp = dir.join(format!(".libibverbs.so.1.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink("../libibverbs.so", &tmp)
            .with_context(|| format!("linking {}", tmp.display()))?;
        std::fs::rename(&tmp, &link).with_context(|| format!("linking {}", link.display()))?;
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
    out.flush()?;
    let err = std::process::Command::new(program)
        .args(rest)
        .env("LD_LIBRARY_PATH", path)
        .exec();
    bail!("cannot run {}: {err}", program.to_string_lossy())
}
