//! Shared by the test binaries: finding system tools, checking for root,
//! running setup commands, and network namespaces that clean up after
//! themselves; bringing a UD QP up; SGEs, and waiting for completions and
//! async events.
#![allow(dead_code)] // each test binary uses part of it

pub mod stall;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rverbs::{
    AsyncEvent, AsyncEventType, CompletionQueue, Context, MemoryRegion, Sge, WorkCompletion,
};

/// Every access an MR may grant: local write, remote write, read and
/// atomics.
pub const ALL: rverbs::AccessFlags = rverbs::AccessFlags::LOCAL_WRITE
    .union(rverbs::AccessFlags::REMOTE_WRITE)
    .union(rverbs::AccessFlags::REMOTE_READ)
    .union(rverbs::AccessFlags::REMOTE_ATOMIC);

/// The splitmix64 step: a fast, well-mixed pseudo-random sequence.
pub fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `len` pseudo-random bytes determined by `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut s = seed;
    for chunk in out.chunks_mut(8) {
        let word = splitmix(&mut s).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    out
}

/// Debian's Python, which has python3-scapy (not a pyenv or venv one).
pub const PYTHON: &str = "/usr/bin/python3";

/// `name` on PATH or in the usual sbin/bin directories.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
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

/// Runs a setup command; panics with its output if it fails.
pub fn run(program: &Path, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{} {args:?}: {e}", program.display()));
    assert!(
        out.status.success(),
        "{} {} failed ({}): {}",
        program.display(),
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Network namespaces a test made; dropping it deletes them (with their
/// veth ends and nftables state), also when the test panics.
pub struct Namespaces {
    pub ip: PathBuf,
    pub names: Vec<String>,
}

impl Namespaces {
    /// No namespaces yet; `ip` is iproute2's `ip`.
    pub fn new(ip: &Path) -> Namespaces {
        Namespaces {
            ip: ip.to_path_buf(),
            names: Vec::new(),
        }
    }

    /// Makes namespace `name`.
    pub fn add(&mut self, name: &str) {
        run(&self.ip, &["netns", "add", name]);
        self.names.push(name.to_string());
    }

    /// Deletes them now.
    pub fn delete(&mut self) {
        for name in self.names.drain(..) {
            let _ = Command::new(&self.ip)
                .args(["netns", "delete", &name])
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        self.delete();
    }
}

/// A UD QP on `pd` and `cq` with room for a few SGEs and inline data,
/// brought to RTS with Q_Key `qkey`.
pub fn ud_qp(
    pd: &rverbs::ProtectionDomain,
    cq: &rverbs::CompletionQueue,
    qkey: u32,
) -> rverbs::QueuePair {
    let qp = pd
        .qp_builder(cq, cq)
        .qp_type(rverbs::QpType::Ud)
        .caps(rverbs::QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        })
        .build()
        .unwrap();
    ud_to_rts(&qp, qkey);
    qp
}

/// Brings a UD QP from RESET to RTS with Q_Key `qkey` (port 1, P_Key
/// index 0, send PSN 0x1234).
pub fn ud_to_rts(qp: &rverbs::QueuePair, qkey: u32) {
    use rverbs::{QpAttr, QpAttrMask, QpState};
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qkey,
        ..QpAttr::default()
    };
    qp.modify(
        &attr,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    )
    .unwrap();
    attr.qp_state = QpState::Rtr;
    qp.modify(&attr, QpAttrMask::STATE).unwrap();
    attr.qp_state = QpState::Rts;
    attr.sq_psn = 0x1234;
    qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .unwrap();
}

/// An SGE over `len` bytes of `mr`, `offset` bytes in.
pub fn sge(mr: &MemoryRegion, offset: u64, len: u32) -> Sge {
    Sge {
        addr: mr.iova() + offset,
        length: len,
        lkey: mr.lkey(),
    }
}

/// [`wait_n`] with 10 s.
pub fn wait(cq: &CompletionQueue, n: usize, what: &str) -> Vec<WorkCompletion> {
    wait_n(cq, n, Duration::from_secs(10), what)
}

/// Polls `cq` until `n` completions arrived, taking no more than `n` (the
/// rest stay for the next wait); fails, naming `what`, after `limit`.
pub fn wait_n(cq: &CompletionQueue, n: usize, limit: Duration, what: &str) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [WorkCompletion::default(); 16];
    // When the last poll returned: the time from there to the next poll
    // is the thread's own (a yield), not a sleep inside `poll`.
    let mut returned: Option<Instant> = None;
    while got.len() < n {
        let now = Instant::now();
        assert!(
            now < deadline,
            "{what}: only {} of {n} completions after {limit:?}: {got:?}",
            got.len()
        );
        if let Some(t) = returned {
            stall::note_poll_gap(now.duration_since(t));
        }
        let k = cq.poll(&mut buf[..(n - got.len()).min(16)]).unwrap();
        returned = Some(Instant::now());
        got.extend_from_slice(&buf[..k]);
        if k == 0 {
            std::thread::yield_now();
        }
    }
    got
}

/// Waits up to 5 s for an async event of type `ty`; events of other types
/// that come first fail the test (they are listed).
pub fn wait_event(ctx: &Context, ty: AsyncEventType, what: &str) -> AsyncEvent {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut others = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match ctx.get_async_event_timeout(left).unwrap() {
            Some(ev) if ev.event_type() == ty => {
                assert!(
                    others.is_empty(),
                    "{what}: events before {ty:?}: {others:?}"
                );
                return ev;
            }
            Some(ev) => others.push(format!("{ev:?}")),
            None => panic!("{what}: no {ty:?} async event within 5 s (others: {others:?})"),
        }
    }
}

/// One side of a connected pair: its own context on the first device, a
/// PD, one CQ for sends and receives, a QP and an MR.
pub struct PairSide {
    pub ctx: Context,
    pub pd: rverbs::ProtectionDomain,
    pub cq: CompletionQueue,
    pub qp: rverbs::QueuePair,
    pub mr: MemoryRegion,
}

/// A QP of type `ty` with `caps` in its own context on the first device,
/// with an MR of `mr_len` bytes and `access`.
pub fn pair_side(
    ty: rverbs::QpType,
    caps: rverbs::QpCaps,
    mr_len: usize,
    access: rverbs::AccessFlags,
) -> PairSide {
    pair_side_on(&rverbs::devices().unwrap()[0], ty, caps, mr_len, access)
}

/// [`pair_side`] on `device`.
pub fn pair_side_on(
    device: &rverbs::Device,
    ty: rverbs::QpType,
    caps: rverbs::QpCaps,
    mr_len: usize,
    access: rverbs::AccessFlags,
) -> PairSide {
    let ctx = device.open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).unwrap();
    let qp = pd
        .qp_builder(&cq, &cq)
        .qp_type(ty)
        .caps(caps)
        .build()
        .unwrap();
    let mr = pd.alloc_mr(mr_len, access).unwrap();
    PairSide {
        ctx,
        pd,
        cq,
        qp,
        mr,
    }
}

/// Connects two sides' RC or UC QPs to each other (timeout 10).
pub fn connect_sides(a: &PairSide, b: &PairSide) {
    connect_sides_with(a, b, 10);
}

/// [`connect_sides`] with the local ACK timeout `timeout` (4.096 µs ×
/// 2^timeout).
pub fn connect_sides_with(a: &PairSide, b: &PairSide, timeout: u8) {
    let opts = rverbs::cm::ConnectOptions {
        timeout,
        ..rverbs::cm::ConnectOptions::default()
    };
    let ea = rverbs::cm::Endpoint::for_qp(&a.qp);
    let eb = rverbs::cm::Endpoint::for_qp(&b.qp);
    a.qp.connect(ea.psn, &eb, &opts).unwrap();
    b.qp.connect(eb.psn, &ea, &opts).unwrap();
}

/// Two [`pair_side`]s of type `ty` (RC or UC), connected to each other
/// (timeout 10).
pub fn connected_pair(
    ty: rverbs::QpType,
    caps: rverbs::QpCaps,
    mr_len: usize,
    access: rverbs::AccessFlags,
) -> (PairSide, PairSide) {
    let a = pair_side(ty, caps, mr_len, access);
    let b = pair_side(ty, caps, mr_len, access);
    connect_sides(&a, &b);
    (a, b)
}
