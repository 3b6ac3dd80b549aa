//! librdmacm's semantics as a C program sees them (`c/rdmacm_semantics.c`,
//! built against Debian's `<rdma/rdma_cma.h>` and run on both drop-ins):
//! event channels, ids, listeners, private data and its limits, rejects,
//! devices, ports; synchronous ids (`c/rdmacm_sync.c`); a program that
//! exits connected (`c/rdmacm_exit.c`).

use std::path::{Path, PathBuf};

mod common;

/// Compiles `tests/c/NAME.c` against Debian's rdma_cma.h with `flags`
/// into `dir`; `None` (after the CI check) without the header.
fn compile(dir: &Path, name: &str, flags: &[&str]) -> Option<PathBuf> {
    if !Path::new("/usr/include/rdma/rdma_cma.h").exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "librdmacm-dev is needed in CI"
        );
        eprintln!("skipped: needs librdmacm-dev");
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let exe = dir.join(name);
    let out = std::process::Command::new("cc")
        .args(flags)
        .arg("-I")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg(src.join(format!("{name}.c")))
        .arg("-lrdmacm")
        .arg("-libverbs")
        .arg("-lpthread")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

#[test]
fn librdmacm_semantics() {
    let dir = common::LibDir::with_rdmacm("semantics");
    let Some(exe) = compile(&dir.0, "rdmacm_semantics", &["-O0"]) else {
        return;
    };
    let port = (22_000 + std::process::id() % 20_000).to_string();
    let (ok, text) = common::run_program(&exe, &[&port], &dir.0, &[]);
    assert!(ok && text.contains("ok"), "{text}");
}

/// Synchronous ids (`c/rdmacm_sync.c`, rdma_create_ep's): each call
/// returns with the event it leads to in `id->event` — ESTABLISHED after
/// connect and accept, DISCONNECTED after disconnect on both sides.
#[test]
fn synchronous_ids_return_with_their_events() {
    let dir = common::LibDir::with_rdmacm("sync");
    let Some(exe) = compile(&dir.0, "rdmacm_sync", &["-O0"]) else {
        return;
    };
    let port = (24_000 + std::process::id() % 20_000).to_string();
    let (ok, text) = common::run_program(&exe, &[&port], &dir.0, &[]);
    assert!(ok && text.contains("ok"), "{text}");
}

/// A program that exits with a connection up (`c/rdmacm_exit.c`: no
/// disconnect, no destroy) ends it as the kernel's CM ends a closed
/// process's: the peer, a Rust listener here, gets DISCONNECTED. And a
/// program whose own atexit handler disconnects (and waits for
/// DISCONNECTED) still finds its connection there: rverbs ends what is
/// left only after the program's exit-time cleanup.
#[test]
fn a_program_that_exits_connected_disconnects_its_peer() {
    use rverbs::cm::{CmEventKind, CmId, ConnParam, EventChannel, PortSpace};
    use rverbs::{QpCaps, QpType};
    let dir = common::LibDir::with_rdmacm("exit");
    let Some(exe) = compile(&dir.0, "rdmacm_exit", &["-O0"]) else {
        return;
    };
    for (k, mode) in ["plain", "cleanup"].into_iter().enumerate() {
        let port = 26_000 + (std::process::id() % 20_000) as u16 + k as u16;
        let ch = EventChannel::new().unwrap();
        let listener = CmId::new(&ch, PortSpace::Tcp).unwrap();
        listener
            .bind_addr(format!("0.0.0.0:{port}").parse().unwrap())
            .unwrap();
        listener.listen(1).unwrap();
        let child = std::process::Command::new(&exe)
            .args([port.to_string().as_str(), mode])
            .env("LD_LIBRARY_PATH", &dir.0)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let wait = std::time::Duration::from_secs(15);
        let next = |kind: CmEventKind| {
            let ev = ch
                .get_event_timeout(wait)
                .unwrap()
                .unwrap_or_else(|| panic!("{mode}: no {kind:?} within {wait:?}"));
            assert_eq!(ev.kind, kind, "{mode}: {ev:?}");
            ev
        };
        let req = next(CmEventKind::ConnectRequest);
        let id = req.id.clone();
        let ctx = id.device().unwrap().open().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(4).unwrap();
        let qp = pd
            .qp_builder(&cq, &cq)
            .qp_type(QpType::Rc)
            .caps(QpCaps {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            })
            .build()
            .unwrap();
        id.accept(Some(&qp), &ConnParam::default()).unwrap();
        next(CmEventKind::Established);
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && text.contains("established"),
            "{mode}: {text}"
        );
        if mode == "cleanup" {
            assert!(text.contains("cleanup ok"), "{mode}: {text}");
        }
        next(CmEventKind::Disconnected);
    }
}

/// No route to the peer: `rdma_resolve_addr` fails at once with
/// ENETUNREACH, as the kernel's does (`c/rdmacm_noroute.c`, in a network
/// namespace of its own with only loopback up; needs root).
#[test]
fn resolving_an_address_without_a_route_fails_at_once() {
    if !common::is_root() {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("skipped: needs root for a network namespace");
        return;
    }
    let dir = common::LibDir::with_rdmacm("noroute");
    let Some(exe) = compile(&dir.0, "rdmacm_noroute", &["-O0"]) else {
        return;
    };
    let exe = exe.to_str().unwrap();
    let (ok, text) = common::run_program(
        Path::new("/usr/bin/unshare"),
        &["--net", "sh", "-c", "ip link set lo up && exec \"$0\"", exe],
        &dir.0,
        &[],
    );
    assert!(ok && text.contains("ok"), "{text}");
}

/// An address on the link that nobody holds: `rdma_resolve_addr` returns
/// 0 and ADDR_ERROR comes with status -ETIMEDOUT after the timeout (no
/// neighbour answered), as from the kernel's rdma_cm; a synchronous id's
/// call fails with ETIMEDOUT (`c/rdmacm_addr_error.c`, in a network
/// namespace of its own with a veth pair, the device on one end; needs
/// root).
#[test]
fn resolving_an_address_nobody_holds_ends_in_addr_error() {
    if !common::is_root() {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("skipped: needs root for a network namespace");
        return;
    }
    let dir = common::LibDir::with_rdmacm("addr_error");
    let Some(exe) = compile(&dir.0, "rdmacm_addr_error", &["-O0"]) else {
        return;
    };
    let exe = exe.to_str().unwrap();
    let setup = "ip link set lo up && ip link add d0 type veth peer name d1 \
                 && ip addr add 10.99.8.1/24 dev d0 && ip link set d0 up \
                 && ip link set d1 up && exec \"$0\"";
    let (ok, text) = common::run_program(
        Path::new("/usr/bin/unshare"),
        &["--net", "sh", "-c", setup, exe],
        &dir.0,
        &[("RVERBS_ADDR", "10.99.8.1")],
    );
    assert!(ok && text.contains("ok"), "{text}");
}

/// `rdma_destroy_id` waits for the id's events to be acknowledged, so an
/// event thread may read `event->id` until its ack (AddressSanitizer
/// catches a use after free).
#[test]
fn destroy_waits_for_the_ids_events() {
    let dir = common::LibDir::with_rdmacm("destroy");
    let Some(exe) = compile(
        &dir.0,
        "rdmacm_destroy_race",
        &["-O1", "-g", "-fsanitize=address"],
    ) else {
        return;
    };
    let (ok, text) = common::run_program(&exe, &[], &dir.0, &[("ASAN_OPTIONS", "detect_leaks=0")]);
    assert!(ok && text.contains("done"), "{text}");
}

/// A channel destroyed while threads use it (`c/rdmacm_channel_race.c`,
/// Debian 12's rping at exit): a thread waiting in `rdma_get_cm_event`
/// goes on waiting, and a call made with the destroyed channel fails with
/// EBADF instead of reading freed memory.
#[test]
fn a_destroyed_channel_neither_wakes_its_waiter_nor_crashes_a_late_caller() {
    let dir = common::LibDir::with_rdmacm("channel-race");
    let Some(exe) = compile(&dir.0, "rdmacm_channel_race", &["-O1", "-g"]) else {
        return;
    };
    let (ok, text) = common::run_program(&exe, &[], &dir.0, &[]);
    assert!(ok && text.contains("done"), "{text}");
}
