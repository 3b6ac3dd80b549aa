//! C programs of our own, compiled against Debian's verbs.h and run on the
//! drop-in library: tests/c/*.c. Each prints "ALL OK" when every check in it
//! holds.

mod common;

use std::process::Command;

fn run_c(name: &str, source: &str, env: &[(&str, &str)]) -> Option<(bool, String)> {
    let dir = common::LibDir::new(name);
    let exe = common::compile_c(&dir.0, name, source)?;
    let (ok, text) = common::run_program(&exe, &[], &dir.0, env);
    Some((ok && text.contains("ALL OK"), text))
}

/// IBV_WR_ATOMIC_WRITE through both post APIs, its completions and its
/// refusals, and the capability bit (`c/atomic_write.c`).
#[test]
fn atomic_write_works_from_c_as_on_rxe() {
    if let Some((ok, text)) = run_c("atomic_write", include_str!("c/atomic_write.c"), &[]) {
        assert!(ok, "{text}");
    }
}

#[test]
fn seed_man_pages_events_and_error_paths_hold_in_c() {
    if let Some((ok, text)) = run_c("semantics", include_str!("c/semantics.c"), &[]) {
        assert!(ok, "{text}");
    }
}

/// What rdma-core's pyverbs suite expects of a device, each its own
/// check here (`c/conformance.c`): ibv_query_device_ex's extended fields,
/// ibv_query_qp_data_in_order, a dup-able cmd_fd, create flags that are
/// none, rereg keeping keys, RESET purging a QP's completions.
#[test]
fn what_rdma_cores_own_tests_expect_holds_in_c() {
    if let Some((ok, text)) = run_c("conformance", include_str!("c/conformance.c"), &[]) {
        assert!(ok, "{text}");
    }
}

/// Memory windows through the C API (issue 16): ibv_alloc_mw, ibv_bind_mw,
/// IBV_WR_BIND_MW / LOCAL_INV / SEND_WITH_INV and their ibv_wr_* forms.
#[test]
fn memory_windows_bind_invalidate_and_fail_as_on_rxe_in_c() {
    if let Some((ok, text)) = run_c("mw", include_str!("c/mw.c"), &[]) {
        assert!(ok, "{text}");
    }
}

/// A completion channel destroyed while threads use it
/// (`c/comp_channel_race.c`): a thread waiting in `ibv_get_cq_event` goes
/// on waiting, a call made with the destroyed channel fails with EBADF
/// instead of reading freed memory, and the context closes.
#[test]
fn a_destroyed_comp_channel_neither_wakes_its_waiter_nor_crashes_a_late_caller() {
    if let Some((ok, text)) = run_c(
        "comp_channel_race",
        include_str!("c/comp_channel_race.c"),
        &[],
    ) {
        assert!(ok, "{text}");
    }
}

#[test]
fn rverbs_leak_check_names_what_was_left_alive() {
    let Some((ok, quiet)) = run_c("leaks", include_str!("c/leaks.c"), &[]) else {
        return;
    };
    assert!(ok, "{quiet}");
    assert!(
        !quiet.contains("rverbs: leak"),
        "no report unless asked: {quiet}"
    );
    let (ok, text) = run_c(
        "leaks",
        include_str!("c/leaks.c"),
        &[("RVERBS_LEAK_CHECK", "1")],
    )
    .expect("compiled above");
    assert!(ok, "{text}");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("rverbs: leak"))
        .collect();
    let at_close: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("at ibv_close_device"))
        .collect();
    assert_eq!(at_close.len(), 2, "{text}");
    assert!(at_close.iter().any(|l| l.contains(": PD ")), "{text}");
    assert!(at_close.iter().any(|l| l.contains(": CQ ")), "{text}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("at exit") && l.contains("was never closed")),
        "{text}"
    );
    // The closed context's objects are still alive at exit.
    assert!(
        lines
            .iter()
            .filter(|l| l.contains("at exit") && l.contains("is still alive"))
            .count()
            >= 2,
        "{text}"
    );
}

/// The seed man page: RDMAV_ALLOW_DISASSOC_DESTROY "tells the library to
/// relate an EIO from destroy commands as a success".
#[test]
fn disassociation_and_rdmav_allow_disassoc_destroy() {
    let dir = common::LibDir::new("disassoc");
    let Some(exe) = common::compile_c(&dir.0, "disassoc", include_str!("c/disassoc.c")) else {
        return;
    };
    for (env, want) in [(None, libc_eio()), (Some("1"), 0), (Some("0"), libc_eio())] {
        let mut cmd = Command::new(&exe);
        cmd.arg(want.to_string())
            .env("LD_LIBRARY_PATH", &dir.0)
            .env_remove("RDMAV_ALLOW_DISASSOC_DESTROY");
        if let Some(v) = env {
            cmd.env("RDMAV_ALLOW_DISASSOC_DESTROY", v);
        }
        let out = cmd.output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && text.contains("ALL OK"),
            "RDMAV_ALLOW_DISASSOC_DESTROY={env:?}: {text}"
        );
    }
}

/// EIO on Linux.
fn libc_eio() -> i32 {
    5
}

/// Issue 14.9: a WR's inputs are checked before they are read — num_sge
/// above the queue's max_sge (the SGE array ends at a guard page), inline
/// data above max_inline_data (the data ends at a guard page) — and a WR
/// list longer than the queue's room, even a cyclic one, stops with ENOMEM
/// at the first WR past it (under alarm(10) and a 1 GiB RLIMIT_AS).
#[test]
fn wr_inputs_are_checked_before_they_are_read_and_lists_are_bounded() {
    if let Some((ok, text)) = run_c("wr_inputs", include_str!("c/wr_inputs.c"), &[]) {
        assert!(ok, "{text}");
    }
}

/// Issue 14.4: ibv_reg_mr* over munmap'ed or PROT_NONE memory, or asking
/// for write access to read-only memory, is NULL with errno EFAULT, and
/// ibv_rereg_mr onto munmap'ed memory IBV_REREG_MR_ERR_CMD with EFAULT;
/// nothing is leaked.
#[test]
fn registering_unmapped_memory_is_efault() {
    let Some((ok, text)) = run_c(
        "reg_fault",
        include_str!("c/reg_fault.c"),
        &[("RVERBS_LEAK_CHECK", "1")],
    ) else {
        return;
    };
    assert!(ok, "{text}");
    assert!(!text.contains("rverbs: leak"), "{text}");
}
