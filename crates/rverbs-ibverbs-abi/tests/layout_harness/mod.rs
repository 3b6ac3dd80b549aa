#![allow(dead_code)] // each test binary uses part of it
//! What the layout tests share (`tests/layout.rs` for verbs.h,
//! `tests/layout_rdmacm.rs` for rdma_cma.h): the table macros that turn a
//! list of types, field paths and constants into [`Check`]s, and [`run`],
//! which generates the C program that prints the same numbers from the real
//! header, compiles it with `cc`, runs it and compares.
//!
//! Without `cc` or without the header the check is skipped with a message,
//! unless the `CI` environment variable is set: then it fails.

use std::fmt::Write as _;
use std::mem::size_of;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One number computed on both sides.
pub struct Check {
    /// What is measured, for the mismatch report.
    pub what: String,
    /// The C expression (an integer) the generated program prints.
    pub c_expr: String,
    /// The Rust side's value.
    pub rust: i64,
}

/// `size_of::<F>()` for the type `F` of the field the (never called) closure
/// projects to.
pub fn field_size<T, F>(_project: fn(*const T) -> *const F) -> usize {
    size_of::<F>()
}

/// Joins a field path's identifiers with `.`, dropping the `r#` of raw
/// identifiers (`r#priv` is C's `priv`).
pub fn c_path(idents: &[&str]) -> String {
    idents
        .iter()
        .map(|i| i.trim_start_matches("r#"))
        .collect::<Vec<_>>()
        .join(".")
}

/// `n` as the `i64` every check compares.
pub fn i(n: usize) -> i64 {
    i64::try_from(n).expect("size fits in i64")
}

/// The layout table. Each entry is `struct|union name { field paths }`; a
/// path is the Rust path, and `=> "c.path"` gives the C spelling when it
/// differs (members of C's anonymous unions, which Rust has to name).
#[macro_export]
macro_rules! layout_table {
    ($( $kind:ident $ty:ident { $( $($f:ident).+ $(=> $c:literal)? ),* $(,)? } )*) => {{
        let mut checks: Vec<$crate::layout_harness::Check> = Vec::new();
        $(
            let c_ty = concat!(stringify!($kind), " ", stringify!($ty));
            checks.push($crate::layout_harness::Check {
                what: format!("sizeof({c_ty})"),
                c_expr: format!("sizeof({c_ty})"),
                rust: $crate::layout_harness::i(::std::mem::size_of::<$ty>()),
            });
            checks.push($crate::layout_harness::Check {
                what: format!("_Alignof({c_ty})"),
                c_expr: format!("_Alignof({c_ty})"),
                rust: $crate::layout_harness::i(::std::mem::align_of::<$ty>()),
            });
            $(
                let path: String = None::<&str>
                    $(.or(Some($c)))?
                    .map(str::to_string)
                    .unwrap_or_else(|| $crate::layout_harness::c_path(&[$(stringify!($f)),+]));
                checks.push($crate::layout_harness::Check {
                    what: format!("offsetof({c_ty}, {path})"),
                    c_expr: format!("offsetof({c_ty}, {path})"),
                    rust: $crate::layout_harness::i(::std::mem::offset_of!($ty, $($f).+)),
                });
                checks.push($crate::layout_harness::Check {
                    what: format!("sizeof((({c_ty} *)0)->{path})"),
                    c_expr: format!("sizeof((({c_ty} *)0)->{path})"),
                    // SAFETY: the closure is never called; it only names the
                    // field's type.
                    rust: $crate::layout_harness::i($crate::layout_harness::field_size(|p: *const $ty| unsafe {
                        std::ptr::addr_of!((*p).$($f).+)
                    })),
                });
            )*
        )*
        checks
    }};
}

/// Constants whose Rust value must equal the header's.
#[macro_export]
macro_rules! const_table {
    ($($name:ident),* $(,)?) => {
        vec![$(
            $crate::layout_harness::Check {
                what: stringify!($name).to_string(),
                c_expr: stringify!($name).to_string(),
                rust: $name as i64,
            },
        )*]
    };
}

/// The C program: includes `headers`, prints `<index> <value>` for every
/// check.
fn c_program(headers: &[&str], checks: &[Check]) -> String {
    let mut src = String::from("#include <stddef.h>\n#include <stdint.h>\n#include <stdio.h>\n");
    for h in headers {
        writeln!(src, "#include <{h}>").expect("writing to a String");
    }
    src.push_str("\nint main(void)\n{\n");
    for (n, check) in checks.iter().enumerate() {
        writeln!(
            src,
            "\tprintf(\"{n} %lld\\n\", (long long)({}));",
            check.c_expr
        )
        .expect("writing to a String");
    }
    src.push_str("\treturn 0;\n}\n");
    src
}

/// Without a compiler or the header: skip, or fail under CI.
fn unavailable(header: &str, why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("layout check impossible: {why} (CI is set, so this is a failure)");
    }
    eprintln!("SKIPPED layout check against {header}: {why}");
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
}

fn work_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).expect("create the test's temporary directory");
    dir
}

/// Whether `cc` exists and finds `headers`; reports why not (`package`
/// provides them).
fn toolchain_ready(dir: &Path, headers: &[&str], package: &str) -> bool {
    let probe = dir.join("probe.c");
    let includes: String = headers
        .iter()
        .map(|h| format!("#include <{h}>\n"))
        .collect();
    std::fs::write(&probe, includes).expect("write probe.c");
    match Command::new(cc()).arg("-E").arg(&probe).output() {
        Err(e) => {
            unavailable(headers[0], &format!("cannot run `{}`: {e}", cc()));
            false
        }
        Ok(out) if !out.status.success() => {
            unavailable(
                headers[0],
                &format!(
                    "`{} -E` cannot include {headers:?} (install {package}): {}",
                    cc(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            );
            false
        }
        Ok(_) => true,
    }
}

/// Checks every number of `checks` against the C program built with
/// `headers` (the first one names the check in messages; `package` provides
/// them) in `target/tmp/<work_dir>`; panics with the full list of
/// differences.
pub fn run(work_dir_name: &str, headers: &[&str], package: &str, checks: &[Check]) {
    let header = headers[0];
    let dir = work_dir(work_dir_name);
    if !toolchain_ready(&dir, headers, package) {
        return;
    }
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c_program(headers, checks)).expect("write layout.c");
    let out = Command::new(cc())
        .args(["-std=gnu11", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "compiling {} failed (a field or constant in the table is not in {header}?):\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().expect("run the layout program");
    assert!(
        run.status.success(),
        "{} failed: {:?}",
        exe.display(),
        run.status
    );

    let mut c_values: Vec<Option<i64>> = vec![None; checks.len()];
    for line in String::from_utf8(run.stdout).expect("ASCII output").lines() {
        let (n, value) = line.split_once(' ').expect("`<index> <value>` lines");
        let n: usize = n.parse().expect("index");
        c_values[n] = Some(value.parse().expect("value"));
    }

    let mut mismatches = Vec::new();
    for (check, c) in checks.iter().zip(&c_values) {
        match c {
            Some(c) if *c == check.rust => {}
            Some(c) => mismatches.push(format!("{}: C {c}, Rust {}", check.what, check.rust)),
            None => mismatches.push(format!("{}: no value from the C program", check.what)),
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} layout/constant checks differ from {header}:\n  {}",
        mismatches.len(),
        checks.len(),
        mismatches.join("\n  ")
    );
    eprintln!("{} layout/constant checks match {header}", checks.len());
}
