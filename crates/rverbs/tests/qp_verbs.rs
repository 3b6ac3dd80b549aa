//! The queue-pair verbs of the public API, checked against what libibverbs
//! (over the Linux rxe driver and the RDMA core's state table) does:
//! `ibv_create_qp` limits, QP numbers, the `ibv_modify_qp` state machine and
//! `ibv_query_qp`, `ibv_post_send` / `ibv_post_recv` errors (`bad_wr`),
//! work completions, the error state and flushing, affiliated async events,
//! and completion-channel notification.
//!
//! Every QP here lives on the process's device `rverbs0` (two contexts talk
//! over the device's own UDP socket), except the `max_qp` test, which uses a
//! device of its own so it cannot starve the others.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rverbs::cm::{ConnectOptions, Endpoint};
use rverbs::{
    devices, AccessFlags, AsyncEventElement, AsyncEventType, CompletionChannel, CompletionQueue,
    Context, Device, DeviceConfig, Error, ErrorDetail, ErrorKind, MemoryRegion, Mtu,
    ProtectionDomain, QpAttr, QpAttrMask, QpCaps, QpState, QueuePair, RecvWr, SendWr, Sge,
    TransitionError, Verb, WcFlags, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

mod common;
use common::ALL;
use common::{sge, wait, wait_event};

const EINVAL: i32 = 22;
const ENOMEM: i32 = 12;

const MR_LEN: usize = 64 * 1024;

// ---- set-up --------------------------------------------------------------

fn device() -> Device {
    devices()
        .unwrap()
        .into_iter()
        .next()
        .expect("rverbs0 is always there")
}

/// How a [`Side`] is built.
#[derive(Clone, Copy)]
struct Opts {
    caps: QpCaps,
    sq_sig_all: bool,
    send_cqe: u32,
    recv_cqe: u32,
    /// Give the receive CQ a completion channel.
    channel: bool,
    user_data: u64,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            caps: QpCaps {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            },
            sq_sig_all: false,
            send_cqe: 256,
            recv_cqe: 256,
            channel: false,
            user_data: 0,
        }
    }
}

/// One end: its own context, PD, a send CQ and a receive CQ, a QP, an MR.
struct Side {
    ctx: Context,
    _pd: ProtectionDomain,
    channel: Option<CompletionChannel>,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn side(o: Opts) -> Side {
    let ctx = device().open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let channel = o.channel.then(|| ctx.create_comp_channel().unwrap());
    let scq = ctx
        .cq_builder()
        .cqe(o.send_cqe)
        .user_data(0x5c)
        .build()
        .unwrap();
    let mut b = ctx.cq_builder().cqe(o.recv_cqe).user_data(0x7c);
    if let Some(ch) = &channel {
        b = b.channel(ch);
    }
    let rcq = b.build().unwrap();
    let qp = pd
        .qp_builder(&scq, &rcq)
        .caps(o.caps)
        .sq_sig_all(o.sq_sig_all)
        .user_data(o.user_data)
        .build()
        .unwrap();
    let mr = pd.alloc_mr(MR_LEN, ALL).unwrap();
    Side {
        ctx,
        _pd: pd,
        channel,
        scq,
        rcq,
        qp,
        mr,
    }
}

fn endpoint(s: &Side) -> Endpoint {
    Endpoint::for_qp(&s.qp).with_buffer(&s.mr)
}

/// The defaults of ibv_rc_pingpong: a 67 ms ACK timeout, so a loaded
/// machine does not run out of retries.
fn conn_opts() -> ConnectOptions {
    ConnectOptions::default()
}

fn connect(a: &Side, b: &Side) {
    let (ea, eb) = (endpoint(a), endpoint(b));
    a.qp.connect(ea.psn, &eb, &conn_opts()).unwrap();
    b.qp.connect(eb.psn, &ea, &conn_opts()).unwrap();
}

fn pair(oa: Opts, ob: Opts) -> (Side, Side) {
    let (a, b) = (side(oa), side(ob));
    connect(&a, &b);
    (a, b)
}

/// A connected to a peer that never answers: B exists but stays in RESET,
/// so its device drops A's packets. With `timeout` 0 (wait for ever) A's
/// send WRs stay queued.
fn pair_with_silent_peer(oa: Opts) -> (Side, Side) {
    let (a, b) = (side(oa), side(Opts::default()));
    let opts = ConnectOptions {
        timeout: 0,
        ..conn_opts()
    };
    a.qp.connect(endpoint(&a).psn, &endpoint(&b), &opts)
        .unwrap();
    (a, b)
}

/// Polls for `dur` and returns whatever completed meanwhile.
fn drain_for(cq: &CompletionQueue, dur: Duration) -> Vec<WorkCompletion> {
    let end = Instant::now() + dur;
    let mut got = Vec::new();
    let mut buf = [WorkCompletion::default(); 16];
    while Instant::now() < end {
        let k = cq.poll(&mut buf).unwrap();
        got.extend_from_slice(&buf[..k]);
        if k == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    got
}

fn assert_quiet(cq: &CompletionQueue, what: &str) {
    let extra = drain_for(cq, Duration::from_millis(100));
    assert!(extra.is_empty(), "{what}: unexpected completions {extra:?}");
}

fn ids_and_status(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

fn assert_no_event(ctx: &Context, dur: Duration, what: &str) {
    let ev = ctx.get_async_event_timeout(dur).unwrap();
    assert!(ev.is_none(), "{what}: unexpected async event {ev:?}");
}

fn err_of(r: rverbs::Result<()>, what: &str) -> Error {
    match r {
        Ok(()) => panic!("{what}: succeeded, should have failed"),
        Err(e) => e,
    }
}

fn assert_einval_bad_wr(r: rverbs::Result<()>, index: usize, what: &str) {
    let e = err_of(r, what);
    assert_eq!(e.errno(), EINVAL, "{what}: errno of {e}");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{what}: {e}");
    assert_eq!(
        e.detail(),
        Some(ErrorDetail::BadWr { index }),
        "{what}: bad_wr of {e}"
    );
}

fn assert_enomem_bad_wr(r: rverbs::Result<()>, index: usize, what: &str) {
    let e = err_of(r, what);
    assert_eq!(e.errno(), ENOMEM, "{what}: errno of {e}");
    assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{what}: {e}");
    assert_eq!(
        e.detail(),
        Some(ErrorDetail::BadWr { index }),
        "{what}: bad_wr of {e}"
    );
}

// ---- modify_qp attributes ------------------------------------------------

const RQ_PSN: u32 = 0x12_3456;
const SQ_PSN: u32 = 0xab_cdef;

fn init_mask() -> QpAttrMask {
    QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS
}

fn rtr_mask() -> QpAttrMask {
    QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER
}

fn rts_mask() -> QpAttrMask {
    QpAttrMask::STATE
        | QpAttrMask::SQ_PSN
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MAX_QP_RD_ATOMIC
}

/// Every attribute set to a distinct, valid value, aimed at `dest_qpn` on
/// this device.
fn full_attr(qp: &QueuePair, state: QpState, dest_qpn: u32) -> QpAttr {
    let mut a = QpAttr {
        qp_state: state,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: dest_qpn,
        rq_psn: RQ_PSN,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 12,
        sq_psn: SQ_PSN,
        timeout: 14,
        retry_cnt: 5,
        rnr_retry: 6,
        max_rd_atomic: 3,
        ..QpAttr::default()
    };
    a.ah_attr.dgid = qp.local_gid();
    a
}

fn to_init(qp: &QueuePair) {
    qp.modify(&full_attr(qp, QpState::Init, 0), init_mask())
        .unwrap();
}

fn to_rtr(qp: &QueuePair, dest_qpn: u32) {
    qp.modify(&full_attr(qp, QpState::Rtr, dest_qpn), rtr_mask())
        .unwrap();
}

fn to_rts(qp: &QueuePair) {
    qp.modify(&full_attr(qp, QpState::Rts, 0), rts_mask())
        .unwrap();
}

fn to_state(qp: &QueuePair, s: QpState) {
    let only = |s| {
        qp.modify(
            &QpAttr {
                qp_state: s,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
    };
    assert_eq!(qp.state(), QpState::Reset, "to_state starts in RESET");
    match s {
        QpState::Reset => {}
        QpState::Err => only(QpState::Err).unwrap(),
        _ => {
            to_init(qp);
            if s >= QpState::Rtr {
                to_rtr(qp, 0x42);
            }
            if s >= QpState::Rts {
                to_rts(qp);
            }
            if s == QpState::Sqd {
                only(QpState::Sqd).unwrap();
            }
        }
    }
    assert_eq!(qp.state(), s, "brought to {}", s.name());
}

fn modify_state(qp: &QueuePair, s: QpState) -> rverbs::Result<()> {
    qp.modify(
        &QpAttr {
            qp_state: s,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    )
}

fn assert_transition_err(r: rverbs::Result<()>, want: TransitionError, what: &str) {
    let e = err_of(r, what);
    assert_eq!(e.errno(), EINVAL, "{what}: errno of {e}");
    assert_eq!(e.verb(), Verb::ModifyQp, "{what}: {e}");
    assert_eq!(
        e.detail(),
        Some(ErrorDetail::Transition(want)),
        "{what}: detail of {e}"
    );
}

fn lone_qp(caps: QpCaps) -> (Context, ProtectionDomain, CompletionQueue, QueuePair) {
    let ctx = device().open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let qp = pd.qp_builder(&cq, &cq).caps(caps).build().unwrap();
    (ctx, pd, cq, qp)
}

// ---- 1. create -----------------------------------------------------------

#[test]
fn create_rejects_caps_above_device_limits_with_einval() {
    let ctx = device().open().unwrap();
    let attr = ctx.query_device().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let ok = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let cases = [
        (
            "max_send_wr > max_qp_wr",
            QpCaps {
                max_send_wr: attr.max_qp_wr + 1,
                ..ok
            },
        ),
        (
            "max_recv_wr > max_qp_wr",
            QpCaps {
                max_recv_wr: attr.max_qp_wr + 1,
                ..ok
            },
        ),
        (
            "max_send_sge > max_sge",
            QpCaps {
                max_send_sge: attr.max_sge + 1,
                ..ok
            },
        ),
        (
            "max_recv_sge > max_sge",
            QpCaps {
                max_recv_sge: attr.max_sge + 1,
                ..ok
            },
        ),
        (
            // No device takes a megabyte of inline data per WR.
            "max_inline_data above the device's inline limit",
            QpCaps {
                max_inline_data: 1 << 20,
                ..ok
            },
        ),
        (
            "max_send_wr = u32::MAX",
            QpCaps {
                max_send_wr: u32::MAX,
                ..ok
            },
        ),
    ];
    for (what, caps) in cases {
        let e = pd.qp_builder(&cq, &cq).caps(caps).build().expect_err(what);
        assert_eq!(
            e.errno(),
            EINVAL,
            "{what}: rxe_qp_chk_cap gives EINVAL: {e}"
        );
        assert_eq!(e.verb(), Verb::CreateQp, "{what}");
    }
    assert_eq!(ctx.resources().qps, 0, "refused creates leave no QP behind");
    // Exactly at the device limits is fine.
    let at_limit = QpCaps {
        max_send_wr: attr.max_qp_wr,
        max_recv_wr: attr.max_qp_wr,
        max_send_sge: attr.max_sge,
        max_recv_sge: attr.max_sge,
        max_inline_data: 64,
    };
    let qp = pd
        .qp_builder(&cq, &cq)
        .caps(at_limit)
        .build()
        .expect("caps exactly at the device limits");
    let got = qp.caps();
    assert!(
        got.max_send_wr >= at_limit.max_send_wr
            && got.max_recv_wr >= at_limit.max_recv_wr
            && got.max_send_sge >= at_limit.max_send_sge
            && got.max_recv_sge >= at_limit.max_recv_sge
            && got.max_inline_data >= at_limit.max_inline_data,
        "caps {got:?} below those asked {at_limit:?}"
    );
    // A CQ of another context is refused.
    let other = device().open().unwrap();
    let foreign_cq = other.create_cq(16).unwrap();
    let e = pd
        .qp_builder(&foreign_cq, &cq)
        .build()
        .expect_err("send CQ of another context");
    assert_eq!(e.errno(), EINVAL, "CQ of another context: {e}");
}

#[test]
fn create_allows_zero_caps_and_returns_at_least_what_was_asked() {
    let ctx = device().open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let zero = QpCaps::default();
    let qp = pd
        .qp_builder(&cq, &cq)
        .caps(zero)
        .user_data(0xfeed_f00d)
        .build()
        .expect("a QP with no send WRs, no receive WRs, no SGEs is allowed");
    assert_eq!(qp.state(), QpState::Reset, "a new QP is in RESET");
    assert_eq!(qp.user_data(), 0xfeed_f00d);
    assert_eq!(qp.qp_type(), rverbs::QpType::Rc);
    let q = qp.query().unwrap();
    assert_eq!(q.qp_state, QpState::Reset, "query of a new QP");
    assert_eq!(q.cap, qp.caps(), "query reports the QP's caps");

    for asked in [
        QpCaps {
            max_send_wr: 1,
            max_recv_wr: 3,
            max_send_sge: 2,
            max_recv_sge: 5,
            max_inline_data: 7,
        },
        QpCaps {
            max_send_wr: 100,
            max_recv_wr: 0,
            max_send_sge: 0,
            max_recv_sge: 1,
            max_inline_data: 256,
        },
    ] {
        let qp = pd.qp_builder(&cq, &cq).caps(asked).build().unwrap();
        let got = qp.caps();
        assert!(
            got.max_send_wr >= asked.max_send_wr
                && got.max_recv_wr >= asked.max_recv_wr
                && got.max_send_sge >= asked.max_send_sge
                && got.max_recv_sge >= asked.max_recv_sge
                && got.max_inline_data >= asked.max_inline_data,
            "caps {got:?} below those asked {asked:?}"
        );
        assert_eq!(qp.query().unwrap().cap, got, "query_qp caps = create's");
    }
}

/// A QP's inline room is at least what its send SGEs take in a WQE (16
/// bytes each), whatever was asked, as kernel rxe and the mlx providers
/// report it: rdma_xclient posts 16 bytes IBV_SEND_INLINE on a QP made
/// with max_inline_data 0 and one SGE, and failed with EINVAL.
#[test]
fn inline_room_covers_the_send_sges() {
    let ctx = device().open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    for (sges, asked, want) in [(1, 0, 16), (4, 0, 64), (1, 100, 100), (0, 0, 0)] {
        let qp = pd
            .qp_builder(&cq, &cq)
            .caps(QpCaps {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: sges,
                max_recv_sge: 1,
                max_inline_data: asked,
            })
            .build()
            .unwrap();
        assert_eq!(
            qp.caps().max_inline_data,
            want,
            "{sges} send SGEs, {asked} inline bytes asked"
        );
    }
}

// ---- 2. many QPs ---------------------------------------------------------

#[test]
fn qp_numbers_of_256_qps_are_unique_and_never_0_or_1() {
    let ctx = device().open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let check = |qps: &[QueuePair]| {
        let nums: HashSet<u32> = qps.iter().map(QueuePair::qp_num).collect();
        assert_eq!(nums.len(), qps.len(), "QP numbers repeat");
        for n in &nums {
            assert!(*n > 1, "QP number {n} is reserved (0: SMI, 1: GSI)");
            assert!(*n <= 0xff_ffff, "QP number {n:#x} is not 24 bits");
        }
        nums.len()
    };
    let qps = make_qps(&pd, &cq, 256);
    assert_eq!(check(&qps), 256);
    assert_eq!(ctx.resources().qps, 256);
    // A CQ or PD that QPs use cannot go (EBUSY), and comes back usable.
    let rejected = cq.destroy().expect_err("destroy a CQ QPs use");
    assert_eq!(
        rejected.kind(),
        ErrorKind::Busy,
        "destroy_cq: {}",
        rejected.error()
    );
    let cq = rejected.into_inner();
    let rejected = pd.dealloc().expect_err("dealloc a PD QPs use");
    assert_eq!(
        rejected.kind(),
        ErrorKind::Busy,
        "dealloc_pd: {}",
        rejected.error()
    );
    let pd = rejected.into_inner();
    // Every one works: bring them all to INIT.
    for qp in &qps {
        to_init(qp);
    }
    for qp in qps {
        qp.destroy().expect("destroy");
    }
    assert_eq!(ctx.resources().qps, 0, "all destroyed");
    let again = make_qps(&pd, &cq, 256);
    assert_eq!(check(&again), 256);
    assert_eq!(ctx.resources().qps, 256);
}

fn make_qps(pd: &ProtectionDomain, cq: &CompletionQueue, n: u32) -> Vec<QueuePair> {
    let small = QpCaps {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    (0..n)
        .map(|i| {
            pd.qp_builder(cq, cq)
                .caps(small)
                .build()
                .unwrap_or_else(|e| panic!("QP #{i} of {n}: {e}"))
        })
        .collect()
}

#[test]
fn creating_beyond_max_qp_fails_with_enomem() {
    // A device of its own: filling it must not starve the other tests.
    let dev = rverbs::add_device(DeviceConfig::loopback().named("qp-verbs-max-qp")).unwrap();
    let ctx = dev.open().unwrap();
    let max_qp = ctx.query_device().unwrap().max_qp;
    assert!(max_qp > 0, "max_qp must be reported");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    if max_qp <= 64 * 1024 {
        let mut qps = make_qps(&pd, &cq, max_qp);
        let e = pd
            .qp_builder(&cq, &cq)
            .build()
            .expect_err("QP number max_qp + 1");
        assert_eq!(e.errno(), ENOMEM, "beyond max_qp: {e}");
        // One destroyed makes room for one more.
        qps.pop().unwrap().destroy().unwrap();
        let qp = pd
            .qp_builder(&cq, &cq)
            .build()
            .expect("room after a destroy");
        qps.push(qp);
        drop(qps);
        pd.qp_builder(&cq, &cq)
            .build()
            .expect("after destroying all");
    } else {
        // Too many to fill quickly: a good number must work at least.
        assert_eq!(make_qps(&pd, &cq, 1024).len(), 1024);
    }
    drop((cq, pd, ctx));
    dev.disassociate();
}

// ---- 3. modify_qp / query_qp ---------------------------------------------

#[test]
fn modify_reset_init_rtr_rts_with_required_masks_and_query_returns_what_was_set() {
    let (_ctx, _pd, _cq, qp) = lone_qp(Opts::default().caps);
    let attr = full_attr(&qp, QpState::Init, 0x4242);

    qp.modify(&attr, init_mask()).expect("RESET → INIT");
    let q = qp.query().unwrap();
    assert_eq!((q.qp_state, q.cur_qp_state), (QpState::Init, QpState::Init));
    assert_eq!(q.qp_access_flags, attr.qp_access_flags, "INIT access flags");
    assert_eq!((q.pkey_index, q.port_num), (0, 1), "INIT pkey index / port");

    let attr = QpAttr {
        qp_state: QpState::Rtr,
        ..attr
    };
    qp.modify(&attr, rtr_mask()).expect("INIT → RTR");
    let q = qp.query().unwrap();
    assert_eq!(q.qp_state, QpState::Rtr);
    assert_eq!(q.path_mtu, Mtu::Mtu1024, "path MTU");
    assert_eq!(q.dest_qp_num, 0x4242, "dest QPN");
    assert_eq!(q.rq_psn, RQ_PSN, "rq_psn");
    assert_eq!(q.max_dest_rd_atomic, 4, "max_dest_rd_atomic");
    assert_eq!(q.min_rnr_timer, 12, "min_rnr_timer");
    assert_eq!(q.ah_attr.dgid, qp.local_gid(), "ah_attr.dgid");

    let attr = QpAttr {
        qp_state: QpState::Rts,
        ..attr
    };
    qp.modify(&attr, rts_mask()).expect("RTR → RTS");
    let q = qp.query().unwrap();
    assert_eq!((q.qp_state, q.cur_qp_state), (QpState::Rts, QpState::Rts));
    assert_eq!(q.sq_psn, SQ_PSN, "sq_psn");
    assert_eq!(q.rq_psn, RQ_PSN, "rq_psn kept");
    assert_eq!(q.timeout, 14, "timeout");
    assert_eq!(q.retry_cnt, 5, "retry_cnt");
    assert_eq!(q.rnr_retry, 6, "rnr_retry");
    assert_eq!(q.max_rd_atomic, 3, "max_rd_atomic");
    assert_eq!(q.path_mtu, Mtu::Mtu1024, "path MTU kept");
    assert_eq!(q.dest_qp_num, 0x4242, "dest QPN kept");
    assert_eq!(q.qp_access_flags, attr.qp_access_flags, "access flags kept");
    assert_eq!(q.cap, qp.caps(), "caps");
    assert!(!q.sq_draining, "not draining in RTS");
    assert_eq!(qp.state(), QpState::Rts);

    // RTS → RTS may change the access flags and the RNR timer, with
    // cur_qp_state given (it must be right).
    let change = QpAttr {
        qp_state: QpState::Rts,
        cur_qp_state: QpState::Rts,
        qp_access_flags: ALL,
        min_rnr_timer: 3,
        ..attr
    };
    qp.modify(
        &change,
        QpAttrMask::STATE
            | QpAttrMask::CUR_STATE
            | QpAttrMask::ACCESS_FLAGS
            | QpAttrMask::MIN_RNR_TIMER,
    )
    .expect("RTS → RTS with access flags and RNR timer");
    let q = qp.query().unwrap();
    assert_eq!(q.qp_access_flags, ALL, "new access flags");
    assert_eq!(q.min_rnr_timer, 3, "new RNR timer");
    assert_eq!(q.sq_psn, SQ_PSN, "the rest kept");
    // A mask without STATE changes attributes in the current state.
    qp.modify(
        &QpAttr {
            qp_access_flags: AccessFlags::LOCAL_WRITE,
            ..QpAttr::default()
        },
        QpAttrMask::ACCESS_FLAGS,
    )
    .expect("modify without STATE (RTS → RTS)");
    assert_eq!(qp.query().unwrap().qp_state, QpState::Rts);
    assert_eq!(
        qp.query().unwrap().qp_access_flags,
        AccessFlags::LOCAL_WRITE
    );
}

#[test]
fn modify_missing_a_required_attribute_is_einval_naming_it() {
    let (_ctx, _pd, _cq, qp) = lone_qp(Opts::default().caps);
    let steps: [(QpState, QpAttrMask, &[QpAttrMask]); 3] = [
        (
            QpState::Init,
            init_mask(),
            &[
                QpAttrMask::PKEY_INDEX,
                QpAttrMask::PORT,
                QpAttrMask::ACCESS_FLAGS,
            ],
        ),
        (
            QpState::Rtr,
            rtr_mask(),
            &[
                QpAttrMask::AV,
                QpAttrMask::PATH_MTU,
                QpAttrMask::DEST_QPN,
                QpAttrMask::RQ_PSN,
                QpAttrMask::MAX_DEST_RD_ATOMIC,
                QpAttrMask::MIN_RNR_TIMER,
            ],
        ),
        (
            QpState::Rts,
            rts_mask(),
            &[
                QpAttrMask::SQ_PSN,
                QpAttrMask::TIMEOUT,
                QpAttrMask::RETRY_CNT,
                QpAttrMask::RNR_RETRY,
                QpAttrMask::MAX_QP_RD_ATOMIC,
            ],
        ),
    ];
    for (to, mask, required) in steps {
        let from = qp.state();
        let attr = full_attr(&qp, to, 0x4242);
        for &flag in required {
            let what = format!("{} → {} without {flag:?}", from.name(), to.name());
            assert_transition_err(
                qp.modify(&attr, mask - flag),
                TransitionError::Missing(flag),
                &what,
            );
            assert_eq!(qp.state(), from, "{what}: the state must not change");
        }
        // Two missing at once are both named.
        let two = required[0] | required[required.len() - 1];
        assert_transition_err(
            qp.modify(&attr, mask - two),
            TransitionError::Missing(two),
            &format!("{} → {} without {two:?}", from.name(), to.name()),
        );
        qp.modify(&attr, mask)
            .unwrap_or_else(|e| panic!("{} → {} with all: {e}", from.name(), to.name()));
    }
    assert_eq!(qp.state(), QpState::Rts);
}

#[test]
fn modify_with_an_attribute_the_transition_does_not_take_is_einval_naming_it() {
    let (_ctx, _pd, _cq, qp) = lone_qp(Opts::default().caps);
    let check = |to: QpState, mask: QpAttrMask, extra: QpAttrMask| {
        let from = qp.state();
        let what = format!("{} → {} with {extra:?}", from.name(), to.name());
        let mut attr = full_attr(&qp, to, 0x4242);
        attr.cur_qp_state = from;
        assert_transition_err(
            qp.modify(&attr, mask | extra),
            TransitionError::Forbidden(extra),
            &what,
        );
        assert_eq!(qp.state(), from, "{what}: the state must not change");
    };
    // RESET → INIT.
    check(QpState::Init, init_mask(), QpAttrMask::SQ_PSN);
    check(QpState::Init, init_mask(), QpAttrMask::QKEY); // UD only
    check(QpState::Init, init_mask(), QpAttrMask::DEST_QPN);
    check(QpState::Init, init_mask(), QpAttrMask::CUR_STATE); // not from RESET
    to_init(&qp);
    // INIT → RTR.
    check(QpState::Rtr, rtr_mask(), QpAttrMask::SQ_PSN);
    check(QpState::Rtr, rtr_mask(), QpAttrMask::TIMEOUT);
    check(QpState::Rtr, rtr_mask(), QpAttrMask::RETRY_CNT);
    check(QpState::Rtr, rtr_mask(), QpAttrMask::MAX_QP_RD_ATOMIC);
    to_rtr(&qp, 0x4242);
    // RTR → RTS.
    check(QpState::Rts, rts_mask(), QpAttrMask::DEST_QPN);
    check(QpState::Rts, rts_mask(), QpAttrMask::PATH_MTU);
    check(QpState::Rts, rts_mask(), QpAttrMask::RQ_PSN);
    check(QpState::Rts, rts_mask(), QpAttrMask::AV);
    check(QpState::Rts, rts_mask(), QpAttrMask::MAX_DEST_RD_ATOMIC);
    to_rts(&qp);
    // RTS → RTS: the timers of the requester are fixed.
    check(QpState::Rts, QpAttrMask::STATE, QpAttrMask::TIMEOUT);
    check(QpState::Rts, QpAttrMask::STATE, QpAttrMask::SQ_PSN);
    // RTS → SQD takes only EN_SQD_ASYNC_NOTIFY.
    check(QpState::Sqd, QpAttrMask::STATE, QpAttrMask::TIMEOUT);
    check(QpState::Sqd, QpAttrMask::STATE, QpAttrMask::ACCESS_FLAGS);
    assert_eq!(qp.state(), QpState::Rts);
}

#[test]
fn modify_along_a_transition_that_does_not_exist_is_einval() {
    let (_ctx, _pd, _cq, qp) = lone_qp(Opts::default().caps);
    let illegal: &[(QpState, &[QpState])] = &[
        (QpState::Reset, &[QpState::Rtr, QpState::Rts, QpState::Sqd]),
        (QpState::Init, &[QpState::Rts, QpState::Sqd]),
        (QpState::Rtr, &[QpState::Init, QpState::Rtr, QpState::Sqd]),
        (QpState::Rts, &[QpState::Init, QpState::Rtr, QpState::Sqe]),
        (QpState::Sqd, &[QpState::Init, QpState::Rtr]),
        (QpState::Err, &[QpState::Init, QpState::Rtr, QpState::Rts]),
    ];
    for &(from, tos) in illegal {
        if qp.state() != QpState::Reset {
            modify_state(&qp, QpState::Reset).unwrap();
        }
        to_state(&qp, from);
        for &to in tos {
            let what = format!("{} → {}", from.name(), to.name());
            // With the attributes the target state would need, so only the
            // transition itself is wrong.
            let mask = match to {
                QpState::Init => init_mask(),
                QpState::Rtr => rtr_mask(),
                QpState::Rts => rts_mask(),
                _ => QpAttrMask::STATE,
            };
            assert_transition_err(
                qp.modify(&full_attr(&qp, to, 0x4242), mask),
                TransitionError::Invalid { from, to },
                &what,
            );
            assert_eq!(qp.state(), from, "{what}: the state must not change");
        }
    }
}

#[test]
fn every_state_may_go_to_reset_and_to_err() {
    let (_ctx, _pd, _cq, qp) = lone_qp(Opts::default().caps);
    let states = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Err,
    ];
    for from in states {
        for to in [QpState::Err, QpState::Reset] {
            to_state(&qp, from);
            let what = format!("{} → {}", from.name(), to.name());
            modify_state(&qp, to).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(qp.state(), to, "{what}");
            assert_eq!(qp.query().unwrap().qp_state, to, "{what}: query");
            if to == QpState::Err {
                modify_state(&qp, QpState::Reset).unwrap_or_else(|e| panic!("{what} → RESET: {e}"));
            }
        }
    }
    // And after all that the QP is usable again.
    to_state(&qp, QpState::Rts);
}

#[test]
fn rts_sqd_rts_round_trip_holds_new_sends_until_back_in_rts() {
    let (a, b) = pair(Opts::default(), Opts::default());
    b.qp.post_recv(&RecvWr::new(1, &[sge(&b.mr, 0, 64)]))
        .unwrap();
    b.qp.post_recv(&RecvWr::new(2, &[sge(&b.mr, 64, 64)]))
        .unwrap();
    modify_state(&a.qp, QpState::Sqd).expect("RTS → SQD");
    let q = a.qp.query().unwrap();
    assert_eq!(q.qp_state, QpState::Sqd, "query in SQD");
    assert!(!q.sq_draining, "nothing to drain");

    // SQD → SQD may change the requester's timers (not so RTS → RTS).
    let mut attr = a.qp.query().unwrap();
    attr.qp_state = QpState::Sqd;
    attr.timeout = 16;
    attr.retry_cnt = 6;
    a.qp.modify(
        &attr,
        QpAttrMask::STATE | QpAttrMask::TIMEOUT | QpAttrMask::RETRY_CNT,
    )
    .expect("SQD → SQD with timeout and retry count");
    let q = a.qp.query().unwrap();
    assert_eq!((q.timeout, q.retry_cnt), (16, 6), "set in SQD");

    // A send posted in SQD is accepted (as rxe: SQD ≥ RTS) but not started.
    a.mr.write_at(0, b"held in SQD").unwrap();
    a.qp.post_send(&SendWr::new(10, WrOpcode::Send, &[sge(&a.mr, 0, 11)]).signaled())
        .expect("post_send in SQD");
    assert!(
        drain_for(&b.rcq, Duration::from_millis(100)).is_empty(),
        "a send WR posted in SQD must not start"
    );
    modify_state(&a.qp, QpState::Rts).expect("SQD → RTS");
    assert_eq!(a.qp.state(), QpState::Rts);
    let got = wait(&b.rcq, 1, "the send held in SQD, after SQD → RTS");
    assert_eq!(ids_and_status(&got), [(1, WcStatus::Success)]);
    assert_eq!(got[0].byte_len, 11);
    let sent = wait(&a.scq, 1, "sender");
    assert_eq!(ids_and_status(&sent), [(10, WcStatus::Success)]);
    // Traffic goes on as usual.
    a.qp.post_send(&SendWr::inline(11, WrOpcode::Send, b"again").signaled())
        .unwrap();
    assert_eq!(wait(&b.rcq, 1, "second send")[0].byte_len, 5);
}

// ---- 6 (part). SQ_DRAINED --------------------------------------------------

#[test]
fn sqd_with_async_notify_raises_sq_drained_once_the_send_queue_drained() {
    let oa = Opts {
        user_data: 0x5eed,
        ..Opts::default()
    };
    let (a, b) = pair(oa, Opts::default());
    b.qp.post_recv(&RecvWr::new(1, &[sge(&b.mr, 0, 4096)]))
        .unwrap();
    a.qp.post_send(&SendWr::new(7, WrOpcode::Send, &[sge(&a.mr, 0, 3000)]).signaled())
        .unwrap();
    let attr = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    a.qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY)
        .expect("RTS → SQD with EN_SQD_ASYNC_NOTIFY");
    let ev = wait_event(&a.ctx, AsyncEventType::SqDrained, "SQD with notify");
    assert!(ev.is_for_qp(&a.qp), "SQ_DRAINED names the QP: {ev:?}");
    assert_eq!(
        ev.element(),
        AsyncEventElement::Qp {
            qp_num: a.qp.qp_num(),
            user_data: 0x5eed
        },
        "the event carries qp_context"
    );
    drop(ev);
    let sent = wait(&a.scq, 1, "the send in flight at SQD");
    assert_eq!(ids_and_status(&sent), [(7, WcStatus::Success)]);
    let q = a.qp.query().unwrap();
    assert_eq!(q.qp_state, QpState::Sqd);
    assert!(!q.sq_draining, "drained");
    assert_no_event(&a.ctx, Duration::from_millis(50), "SQ_DRAINED only once");
}

/// `en_sqd_async_notify` is a request of one RTS → SQD modify (IBTA
/// 11.2.4.2: valid only for that transition; mlx4/mlx5 ask for the event
/// only when the mask holds `IBV_QP_EN_SQD_ASYNC_NOTIFY` with the value set).
/// A later RTS → SQD whose mask does not ask for it raises no SQ_DRAINED.
#[test]
fn sqd_without_async_notify_raises_no_sq_drained() {
    let (a, _b) = pair(Opts::default(), Opts::default());
    modify_state(&a.qp, QpState::Sqd).unwrap();
    assert_no_event(
        &a.ctx,
        Duration::from_millis(100),
        "first RTS → SQD without EN_SQD_ASYNC_NOTIFY",
    );
    modify_state(&a.qp, QpState::Rts).unwrap();
    let notify = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    a.qp.modify(&notify, QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY)
        .unwrap();
    drop(wait_event(&a.ctx, AsyncEventType::SqDrained, "asked for"));
    modify_state(&a.qp, QpState::Rts).unwrap();
    // Now without the flag in the mask: the earlier request must not stick.
    modify_state(&a.qp, QpState::Sqd).unwrap();
    assert_no_event(
        &a.ctx,
        Duration::from_millis(100),
        "RTS → SQD whose mask has no EN_SQD_ASYNC_NOTIFY (after one that had it)",
    );
    // And with the flag in the mask but the value false, neither.
    modify_state(&a.qp, QpState::Rts).unwrap();
    let no = QpAttr {
        en_sqd_async_notify: false,
        ..notify
    };
    a.qp.modify(&no, QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY)
        .unwrap();
    assert_no_event(
        &a.ctx,
        Duration::from_millis(100),
        "RTS → SQD with en_sqd_async_notify = false",
    );
}

/// IBTA 10.3.1 / `ibv_modify_qp(3)`: in SQD the QP finishes the send WRs in
/// progress and starts no new one; SQ_DRAINED comes when those in progress
/// completed — WRs not yet started stay queued and do not count, and
/// `sq_draining` turns false then.
#[test]
fn sq_drained_does_not_wait_for_send_wrs_that_had_not_started() {
    let (a, b) = (side(Opts::default()), side(Opts::default()));
    let (ea, eb) = (endpoint(&a), endpoint(&b));
    // One READ/atomic at a time, and B silent for now (RESET): READ 1 is in
    // flight unanswered, READ 2 waits for it and has not started.
    let opts = ConnectOptions {
        timeout: 0,
        max_rd_atomic: 1,
        ..conn_opts()
    };
    a.qp.connect(ea.psn, &eb, &opts).unwrap();
    b.mr.write_at(0, &[0xabu8; 256]).unwrap();
    let read = |id: u64, off: u64| {
        a.qp.post_send(
            &SendWr::new(
                id,
                WrOpcode::RdmaRead {
                    remote_addr: b.mr.iova(),
                    rkey: b.mr.rkey(),
                },
                &[sge(&a.mr, off, 256)],
            )
            .signaled(),
        )
        .unwrap();
    };
    read(1, 0);
    read(2, 1024);
    let attr = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    a.qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY)
        .unwrap();
    assert!(
        a.qp.query().unwrap().sq_draining,
        "READ 1 is in progress: the SQ is draining"
    );
    assert_no_event(
        &a.ctx,
        Duration::from_millis(50),
        "SQ_DRAINED while READ 1 is in progress",
    );
    // B comes up: A's retransmitted READ 1 is answered.
    b.qp.connect(eb.psn, &ea, &opts).unwrap();
    let got = wait(&a.scq, 1, "READ 1 after the peer came up");
    assert_eq!(ids_and_status(&got), [(1, WcStatus::Success)]);
    assert_quiet(&a.scq, "READ 2 must not start in SQD");
    let ev = wait_event(
        &a.ctx,
        AsyncEventType::SqDrained,
        "SQD: every WR in progress completed (READ 2 never started)",
    );
    assert!(ev.is_for_qp(&a.qp));
    drop(ev);
    assert!(
        !a.qp.query().unwrap().sq_draining,
        "drained: only a WR that has not started is left"
    );
    modify_state(&a.qp, QpState::Rts).unwrap();
    let got = wait(&a.scq, 1, "READ 2 after SQD → RTS");
    assert_eq!(ids_and_status(&got), [(2, WcStatus::Success)]);
}

// ---- 4. post_send / post_recv ----------------------------------------------

#[test]
fn full_send_and_receive_queues_are_enomem_at_the_first_wr_that_did_not_fit() {
    let oa = Opts {
        caps: QpCaps {
            max_send_wr: 8,
            max_recv_wr: 8,
            ..Opts::default().caps
        },
        ..Opts::default()
    };
    let (a, _b) = pair_with_silent_peer(oa);
    let send_cap = a.qp.caps().max_send_wr as usize;
    let recv_cap = a.qp.caps().max_recv_wr as usize;
    let s = [sge(&a.mr, 0, 16)];
    let sends: Vec<SendWr<'_>> = (0..send_cap as u64 + 4)
        .map(|i| SendWr::new(i, WrOpcode::Send, &s).signaled())
        .collect();
    assert_enomem_bad_wr(
        a.qp.post_send_list(&sends),
        send_cap,
        "post_send_list of max_send_wr + 4 WRs",
    );
    assert_enomem_bad_wr(
        a.qp.post_send(&sends[0]),
        0,
        "post_send to a full send queue",
    );
    let r = [sge(&a.mr, 4096, 64)];
    let recvs: Vec<RecvWr<'_>> = (0..recv_cap as u64 + 3)
        .map(|i| RecvWr::new(100 + i, &r))
        .collect();
    assert_enomem_bad_wr(
        a.qp.post_recv_list(&recvs),
        recv_cap,
        "post_recv_list of max_recv_wr + 3 WRs",
    );
    assert_enomem_bad_wr(
        a.qp.post_recv(&recvs[0]),
        0,
        "post_recv to a full receive queue",
    );
    assert!(
        drain_for(&a.scq, Duration::from_millis(50)).is_empty(),
        "the peer never answers: nothing completes"
    );
    // ERR flushes exactly the WRs that were posted, in order.
    modify_state(&a.qp, QpState::Err).unwrap();
    let flushed = wait(&a.scq, send_cap, "flushed sends");
    let want: Vec<(u64, WcStatus)> = (0..send_cap as u64)
        .map(|i| (i, WcStatus::WrFlushErr))
        .collect();
    assert_eq!(ids_and_status(&flushed), want, "send WRs flushed on ERR");
    let flushed = wait(&a.rcq, recv_cap, "flushed receives");
    let want: Vec<(u64, WcStatus)> = (0..recv_cap as u64)
        .map(|i| (100 + i, WcStatus::WrFlushErr))
        .collect();
    assert_eq!(ids_and_status(&flushed), want, "receive WRs flushed on ERR");
    assert!(
        flushed.iter().all(|w| w.qp_num == a.qp.qp_num()),
        "flush completions carry the QP number: {flushed:?}"
    );
    assert_quiet(&a.scq, "nothing beyond the posted WRs");
}

#[test]
fn queues_of_zero_wrs_take_no_wr() {
    let oa = Opts {
        caps: QpCaps::default(),
        ..Opts::default()
    };
    let (a, _b) = pair_with_silent_peer(oa);
    assert_eq!(a.qp.caps().max_send_wr, 0);
    assert_enomem_bad_wr(
        a.qp.post_send(&SendWr::new(1, WrOpcode::Send, &[]).signaled()),
        0,
        "post_send with max_send_wr 0",
    );
    assert_enomem_bad_wr(
        a.qp.post_recv(&RecvWr::new(2, &[])),
        0,
        "post_recv with max_recv_wr 0",
    );
}

#[test]
fn too_many_sges_are_einval_at_the_bad_wr_and_earlier_wrs_are_posted() {
    let caps = QpCaps {
        max_send_sge: 2,
        max_recv_sge: 2,
        ..Opts::default().caps
    };
    let o = Opts {
        caps,
        ..Opts::default()
    };
    let (a, b) = pair(o, o);
    let send_sges = a.qp.caps().max_send_sge as usize;
    let recv_sges = b.qp.caps().max_recv_sge as usize;
    // Receive side: the second WR has one SGE too many.
    let ok: Vec<Sge> = (0..recv_sges as u64)
        .map(|i| sge(&b.mr, i * 1024, 1024))
        .collect();
    let too_many: Vec<Sge> = (0..=recv_sges as u64)
        .map(|i| sge(&b.mr, i * 1024, 1024))
        .collect();
    assert_einval_bad_wr(
        b.qp.post_recv_list(&[
            RecvWr::new(1, &ok),
            RecvWr::new(2, &too_many),
            RecvWr::new(3, &ok),
        ]),
        1,
        "post_recv_list with max_recv_sge + 1 SGEs in WR 1",
    );
    b.qp.post_recv(&RecvWr::new(4, &ok)).unwrap();
    // Send side: the third WR has one SGE too many.
    let one = [sge(&a.mr, 0, 10)];
    let full: Vec<Sge> = (0..send_sges as u64)
        .map(|i| sge(&a.mr, 100 * i, 10))
        .collect();
    let over: Vec<Sge> = (0..=send_sges as u64)
        .map(|i| sge(&a.mr, 100 * i, 10))
        .collect();
    assert_einval_bad_wr(
        a.qp.post_send_list(&[
            SendWr::new(10, WrOpcode::Send, &one).signaled(),
            SendWr::new(11, WrOpcode::Send, &full).signaled(),
            SendWr::new(12, WrOpcode::Send, &over).signaled(),
            SendWr::new(13, WrOpcode::Send, &one).signaled(),
        ]),
        2,
        "post_send_list with max_send_sge + 1 SGEs in WR 2",
    );
    let sent = wait(&a.scq, 2, "the two WRs before the bad one");
    assert_eq!(
        ids_and_status(&sent),
        [(10, WcStatus::Success), (11, WcStatus::Success)]
    );
    let got = wait(&b.rcq, 2, "receiver");
    assert_eq!(
        got.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        [
            (1, WcStatus::Success, 10),
            (4, WcStatus::Success, 10 * send_sges as u32)
        ],
        "receive WR 1 was posted, 2 and 3 were not"
    );
    assert_quiet(&a.scq, "WRs after the bad one were not posted");
}

#[test]
fn inline_data_beyond_max_inline_data_is_einval() {
    let (a, b) = pair(Opts::default(), Opts::default());
    let max = a.qp.caps().max_inline_data as usize;
    assert!(max >= 64, "asked for 64 bytes of inline data, got {max}");
    let big = vec![0x5au8; max + 1];
    let exact: Vec<u8> = (0..max).map(|i| i as u8).collect();
    b.qp.post_recv(&RecvWr::new(1, &[sge(&b.mr, 0, 4096)]))
        .unwrap();
    b.qp.post_recv(&RecvWr::new(2, &[sge(&b.mr, 4096, 4096)]))
        .unwrap();
    assert_einval_bad_wr(
        a.qp.post_send(&SendWr::inline(1, WrOpcode::Send, &big).signaled()),
        0,
        "inline data of max_inline_data + 1 bytes",
    );
    assert_einval_bad_wr(
        a.qp.post_send_list(&[
            SendWr::inline(2, WrOpcode::Send, &exact).signaled(),
            SendWr::inline(3, WrOpcode::Send, &big).signaled(),
        ]),
        1,
        "the second WR carries too much inline data",
    );
    let sent = wait(&a.scq, 1, "the WR of exactly max_inline_data bytes");
    assert_eq!(ids_and_status(&sent), [(2, WcStatus::Success)]);
    let got = wait(&b.rcq, 1, "receiver");
    assert_eq!((got[0].wr_id, got[0].byte_len), (1, max as u32));
    let mut back = vec![0u8; max];
    b.mr.read_at(0, &mut back).unwrap();
    assert_eq!(back, exact, "inline payload");
    // RDMA WRITE inline too.
    a.qp.post_send(
        &SendWr::inline(
            4,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.iova() + 8192,
                rkey: b.mr.rkey(),
            },
            &big,
        )
        .signaled(),
    )
    .map_or_else(
        |e| {
            assert_eq!(e.errno(), EINVAL, "inline RDMA WRITE too big: {e}");
        },
        |()| panic!("an RDMA WRITE with too much inline data was accepted"),
    );
}

#[test]
fn post_send_needs_rts_and_post_recv_needs_init() {
    let (a, b) = (side(Opts::default()), side(Opts::default()));
    let (ea, eb) = (endpoint(&a), endpoint(&b));
    b.qp.connect(eb.psn, &ea, &conn_opts()).unwrap();
    let send = [sge(&a.mr, 0, 8)];
    let swr = SendWr::new(1, WrOpcode::Send, &send).signaled();
    let recv = [sge(&a.mr, 4096, 64)];
    // RESET: neither.
    assert_einval_bad_wr(a.qp.post_send(&swr), 0, "post_send in RESET");
    assert_einval_bad_wr(
        a.qp.post_recv(&RecvWr::new(10, &recv)),
        0,
        "post_recv in RESET",
    );
    // INIT: receives only.
    let mut attr = full_attr(&a.qp, QpState::Init, eb.qpn);
    attr.qp_access_flags = ALL;
    attr.rq_psn = eb.psn;
    attr.sq_psn = ea.psn;
    a.qp.modify(&attr, init_mask()).unwrap();
    assert_einval_bad_wr(a.qp.post_send(&swr), 0, "post_send in INIT");
    a.qp.post_recv(&RecvWr::new(11, &recv))
        .expect("post_recv in INIT");
    // RTR: receives only.
    attr.qp_state = QpState::Rtr;
    a.qp.modify(&attr, rtr_mask()).unwrap();
    assert_einval_bad_wr(a.qp.post_send(&swr), 0, "post_send in RTR");
    a.qp.post_recv(&RecvWr::new(12, &recv[..]))
        .expect("post_recv in RTR");
    // RTS: both; the receives posted in INIT and RTR take B's messages.
    attr.qp_state = QpState::Rts;
    a.qp.modify(&attr, rts_mask()).unwrap();
    a.qp.post_send(&swr).expect("post_send in RTS");
    b.qp.post_recv(&RecvWr::new(20, &[sge(&b.mr, 0, 64)]))
        .unwrap();
    assert_eq!(
        ids_and_status(&wait(&a.scq, 1, "send from RTS")),
        [(1, WcStatus::Success)]
    );
    b.qp.post_send(&SendWr::inline(21, WrOpcode::Send, b"one").signaled())
        .unwrap();
    b.qp.post_send(&SendWr::inline(22, WrOpcode::Send, b"two").signaled())
        .unwrap();
    let got = wait(&a.rcq, 2, "receives posted in INIT and RTR");
    assert_eq!(
        ids_and_status(&got),
        [(11, WcStatus::Success), (12, WcStatus::Success)]
    );
}

#[test]
fn bad_lkey_in_a_send_sge_completes_with_loc_prot_err() {
    let (a, b) = pair(Opts::default(), Opts::default());
    b.qp.post_recv(&RecvWr::new(1, &[sge(&b.mr, 0, 64)]))
        .unwrap();
    let mut bad = sge(&a.mr, 0, 32);
    bad.lkey ^= 0x5a5a_0000;
    let good = [sge(&a.mr, 0, 32)];
    a.qp.post_send_list(&[
        SendWr::new(1, WrOpcode::Send, &[bad]).signaled(),
        SendWr::new(2, WrOpcode::Send, &good),
    ])
    .expect("a bad lkey is no post-time error (as libibverbs)");
    let wcs = wait(&a.scq, 2, "bad lkey");
    assert_eq!(
        ids_and_status(&wcs),
        [(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)],
        "IBV_WC_LOC_PROT_ERR, then the QP is in ERR and the rest flushes"
    );
    assert_eq!(wcs[0].qp_num, a.qp.qp_num());
    assert_eq!(a.qp.state(), QpState::Err);
    assert!(
        drain_for(&b.rcq, Duration::from_millis(50)).is_empty(),
        "nothing reached the receiver"
    );
    assert_eq!(b.qp.state(), QpState::Rts, "the receiver is unaffected");

    // An SGE past the end of the MR is a protection error as well.
    let (c, d) = pair(Opts::default(), Opts::default());
    d.qp.post_recv(&RecvWr::new(1, &[sge(&d.mr, 0, 64)]))
        .unwrap();
    c.qp.post_send(
        &SendWr::new(5, WrOpcode::Send, &[sge(&c.mr, MR_LEN as u64 - 8, 16)]).signaled(),
    )
    .unwrap();
    assert_eq!(
        ids_and_status(&wait(&c.scq, 1, "SGE beyond the MR")),
        [(5, WcStatus::LocProtErr)]
    );
}

#[test]
fn bad_lkey_in_a_receive_sge_fails_the_receive_with_loc_prot_err() {
    let (a, b) = pair(Opts::default(), Opts::default());
    let mut bad = sge(&b.mr, 0, 64);
    bad.lkey ^= 0x00a5_a500;
    b.qp.post_recv(&RecvWr::new(1, &[bad])).unwrap();
    a.qp.post_send(&SendWr::inline(9, WrOpcode::Send, b"payload").signaled())
        .unwrap();
    let got = wait(&b.rcq, 1, "receive with a bad lkey");
    assert_eq!(ids_and_status(&got), [(1, WcStatus::LocProtErr)]);
    let sent = wait(&a.scq, 1, "sender");
    assert_eq!(
        ids_and_status(&sent),
        [(9, WcStatus::RemOpErr)],
        "NAK remote operational error (as rxe)"
    );
}

#[test]
fn receive_buffer_too_small_is_loc_len_err_and_the_sender_gets_rem_inv_req_err() {
    let (a, b) = pair(Opts::default(), Opts::default());
    b.qp.post_recv(&RecvWr::new(1, &[sge(&b.mr, 0, 16)]))
        .unwrap();
    b.qp.post_recv(&RecvWr::new(2, &[sge(&b.mr, 64, 4096)]))
        .unwrap();
    a.qp.post_send(&SendWr::new(7, WrOpcode::Send, &[sge(&a.mr, 0, 64)]).signaled())
        .unwrap();
    let got = wait(&b.rcq, 2, "receiver");
    assert_eq!(
        ids_and_status(&got),
        [(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)],
        "the receive WR fails with IBV_WC_LOC_LEN_ERR, the QP goes to ERR"
    );
    assert_eq!(got[0].qp_num, b.qp.qp_num());
    let sent = wait(&a.scq, 1, "sender");
    assert_eq!(
        ids_and_status(&sent),
        [(7, WcStatus::RemInvReqErr)],
        "rxe NAKs invalid request: IBV_WC_REM_INV_REQ_ERR"
    );
    assert_eq!(a.qp.state(), QpState::Err, "requester in ERR");
    assert_eq!(b.qp.state(), QpState::Err, "responder in ERR");
}

// ---- 5. completions ----------------------------------------------------------

#[test]
fn immediate_data_completions_have_opcode_length_imm_flags_and_qp_numbers() {
    let (a, b) = pair(Opts::default(), Opts::default());
    b.qp.post_recv(&RecvWr::new(1, &[sge(&b.mr, 0, 1024)]))
        .unwrap();
    b.qp.post_recv(&RecvWr::new(2, &[])).unwrap();
    b.qp.post_recv(&RecvWr::new(3, &[sge(&b.mr, 1024, 1024)]))
        .unwrap();
    let payload: Vec<u8> = (0..300u32).map(|i| (i * 3) as u8).collect();
    a.mr.write_at(0, &payload).unwrap();
    a.qp.post_send(
        &SendWr::new(
            10,
            WrOpcode::SendWithImm { imm: 0xdead_beef },
            &[sge(&a.mr, 0, 20)],
        )
        .signaled(),
    )
    .unwrap();
    a.qp.post_send(
        &SendWr::new(
            11,
            WrOpcode::RdmaWriteWithImm {
                remote_addr: b.mr.iova() + 8192,
                rkey: b.mr.rkey(),
                imm: 0x0123_4567,
            },
            &[sge(&a.mr, 0, 300)],
        )
        .signaled(),
    )
    .unwrap();
    a.qp.post_send(&SendWr::new(12, WrOpcode::Send, &[sge(&a.mr, 0, 7)]).signaled())
        .unwrap();

    let got = wait(&b.rcq, 3, "receiver");
    let (qa, qb) = (a.qp.qp_num(), b.qp.qp_num());
    let s = &got[0];
    assert_eq!(
        (s.wr_id, s.status, s.opcode, s.byte_len),
        (1, WcStatus::Success, WcOpcode::Recv, 20),
        "SEND_WITH_IMM: {s:?}"
    );
    assert_eq!(s.imm_data, 0xdead_beef, "SEND_WITH_IMM imm_data");
    assert!(s.wc_flags.contains(WcFlags::WITH_IMM), "IBV_WC_WITH_IMM");
    assert_eq!(
        (s.qp_num, s.src_qp),
        (qb, qa),
        "SEND_WITH_IMM qp_num / src_qp"
    );

    let w = &got[1];
    assert_eq!(
        (w.wr_id, w.status, w.opcode, w.byte_len),
        (2, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 300),
        "RDMA_WRITE_WITH_IMM: {w:?}"
    );
    assert_eq!(w.imm(), Some(0x0123_4567), "RDMA_WRITE_WITH_IMM imm_data");
    assert!(w.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!((w.qp_num, w.src_qp), (qb, qa));
    let mut back = vec![0u8; 300];
    b.mr.read_at(8192, &mut back).unwrap();
    assert_eq!(back, payload, "the WRITE landed at remote_addr");

    let p = &got[2];
    assert_eq!(
        (p.wr_id, p.status, p.opcode, p.byte_len),
        (3, WcStatus::Success, WcOpcode::Recv, 7),
        "plain SEND: {p:?}"
    );
    assert!(
        !p.wc_flags.contains(WcFlags::WITH_IMM),
        "plain SEND has no immediate: {p:?}"
    );
    assert_eq!(p.imm(), None);
    let mut first = [0u8; 20];
    b.mr.read_at(0, &mut first).unwrap();
    assert_eq!(&first[..], &payload[..20], "SEND_WITH_IMM payload");

    let sent = wait(&a.scq, 3, "sender");
    assert_eq!(
        sent.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.qp_num))
            .collect::<Vec<_>>(),
        [
            (10, WcStatus::Success, WcOpcode::Send, qa),
            (11, WcStatus::Success, WcOpcode::RdmaWrite, qa),
            (12, WcStatus::Success, WcOpcode::Send, qa),
        ],
        "sender completions: IBV_WC_SEND / IBV_WC_RDMA_WRITE"
    );
}

#[test]
fn zero_length_messages_with_immediate_data() {
    let (a, b) = pair(Opts::default(), Opts::default());
    b.qp.post_recv(&RecvWr::new(1, &[])).unwrap();
    b.qp.post_recv(&RecvWr::new(2, &[])).unwrap();
    a.qp.post_send(&SendWr::new(10, WrOpcode::SendWithImm { imm: 77 }, &[]).signaled())
        .unwrap();
    a.qp.post_send(
        &SendWr::new(
            11,
            WrOpcode::RdmaWriteWithImm {
                remote_addr: b.mr.iova(),
                rkey: b.mr.rkey(),
                imm: 78,
            },
            &[],
        )
        .signaled(),
    )
    .unwrap();
    let got = wait(&b.rcq, 2, "zero-length messages");
    assert_eq!(
        got.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len, w.imm()))
            .collect::<Vec<_>>(),
        [
            (1, WcStatus::Success, WcOpcode::Recv, 0, Some(77)),
            (2, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 0, Some(78)),
        ]
    );
    assert_eq!(
        ids_and_status(&wait(&a.scq, 2, "sender")),
        [(10, WcStatus::Success), (11, WcStatus::Success)]
    );
}

#[test]
fn unsignaled_send_wrs_complete_silently_and_signaled_ones_do_not() {
    let (a, b) = pair(Opts::default(), Opts::default());
    for i in 0..4 {
        b.qp.post_recv(&RecvWr::new(i, &[sge(&b.mr, i * 64, 64)]))
            .unwrap();
    }
    let s = [sge(&a.mr, 0, 8)];
    a.qp.post_send_list(&[
        SendWr::new(1, WrOpcode::Send, &s),
        SendWr::new(2, WrOpcode::Send, &s),
        SendWr::new(3, WrOpcode::Send, &s),
        SendWr::new(4, WrOpcode::Send, &s).signaled(),
    ])
    .unwrap();
    assert_eq!(wait(&b.rcq, 4, "all four arrive").len(), 4);
    let sent = wait(&a.scq, 1, "the signaled one");
    assert_eq!(
        ids_and_status(&sent),
        [(4, WcStatus::Success)],
        "only the signaled WR completes"
    );
    assert_quiet(&a.scq, "unsignaled WRs must produce no completion");
}

#[test]
fn sq_sig_all_signals_every_send_wr() {
    let oa = Opts {
        sq_sig_all: true,
        ..Opts::default()
    };
    let (a, b) = pair(oa, Opts::default());
    for i in 0..3 {
        b.qp.post_recv(&RecvWr::new(i, &[sge(&b.mr, i * 64, 64)]))
            .unwrap();
    }
    let s = [sge(&a.mr, 0, 8)];
    a.qp.post_send_list(&[
        SendWr::new(1, WrOpcode::Send, &s),
        SendWr::new(2, WrOpcode::Send, &s),
        SendWr::new(
            3,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.iova(),
                rkey: b.mr.rkey(),
            },
            &s,
        ),
    ])
    .unwrap();
    let sent = wait(&a.scq, 3, "sq_sig_all");
    assert_eq!(
        ids_and_status(&sent),
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    assert_quiet(&a.scq, "exactly one completion per WR");
}

// ---- 6. the error state and async events -------------------------------------

#[test]
fn remote_access_error_flushes_every_outstanding_wr_on_both_cqs_of_both_sides() {
    let (a, b) = pair(Opts::default(), Opts::default());
    for i in 0..2 {
        b.qp.post_recv(&RecvWr::new(50 + i, &[sge(&b.mr, i * 64, 64)]))
            .unwrap();
        a.qp.post_recv(&RecvWr::new(60 + i, &[sge(&a.mr, 8192 + i * 64, 64)]))
            .unwrap();
    }
    let s = [sge(&a.mr, 0, 64)];
    a.qp.post_send_list(&[
        SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.iova(),
                rkey: b.mr.rkey() ^ 0x0101_0000,
            },
            &s,
        )
        .signaled(),
        SendWr::new(2, WrOpcode::Send, &s),
        SendWr::new(3, WrOpcode::Send, &s).signaled(),
    ])
    .unwrap();
    let sq = wait(&a.scq, 3, "requester send CQ");
    assert_eq!(
        ids_and_status(&sq),
        [
            (1, WcStatus::RemAccessErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ],
        "the failed WR, then every later one flushed (unsignaled too)"
    );
    assert_eq!(a.qp.state(), QpState::Err);
    let rq = wait(&a.rcq, 2, "requester receive CQ");
    assert_eq!(
        ids_and_status(&rq),
        [(60, WcStatus::WrFlushErr), (61, WcStatus::WrFlushErr)],
        "the requester's receive WRs flush too"
    );
    // The responder: QP_ACCESS_ERR, ERR, its receive WRs flushed.
    let ev = wait_event(&b.ctx, AsyncEventType::QpAccessErr, "responder");
    assert!(ev.is_for_qp(&b.qp), "{ev:?}");
    drop(ev);
    let rq = wait(&b.rcq, 2, "responder receive CQ");
    assert_eq!(
        ids_and_status(&rq),
        [(50, WcStatus::WrFlushErr), (51, WcStatus::WrFlushErr)]
    );
    assert_eq!(b.qp.state(), QpState::Err);
    assert_quiet(&b.scq, "the responder had no send WRs");
    assert_no_event(
        &a.ctx,
        Duration::from_millis(50),
        "a requester learns of a NAK from its completion, not an async event",
    );

    // Posting to a QP in ERR completes at once with a flush error, signaled
    // or not, on either queue.
    a.qp.post_send(&SendWr::new(4, WrOpcode::Send, &s).signaled())
        .expect("post_send in ERR is accepted");
    a.qp.post_send(&SendWr::new(5, WrOpcode::Send, &s))
        .expect("post_send in ERR is accepted");
    assert_eq!(
        ids_and_status(&wait(&a.scq, 2, "post_send in ERR")),
        [(4, WcStatus::WrFlushErr), (5, WcStatus::WrFlushErr)]
    );
    a.qp.post_recv(&RecvWr::new(62, &[sge(&a.mr, 8192, 64)]))
        .expect("post_recv in ERR is accepted");
    b.qp.post_recv(&RecvWr::new(52, &[sge(&b.mr, 0, 64)]))
        .expect("post_recv in ERR is accepted");
    assert_eq!(
        ids_and_status(&wait(&a.rcq, 1, "post_recv in ERR")),
        [(62, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        ids_and_status(&wait(&b.rcq, 1, "post_recv in ERR")),
        [(52, WcStatus::WrFlushErr)]
    );
}

#[test]
fn rnr_retry_exhausted_is_rnr_retry_exc_err_and_rnr_retry_7_waits_for_ever() {
    let (a, b) = (side(Opts::default()), side(Opts::default()));
    let (ea, eb) = (endpoint(&a), endpoint(&b));
    let no_rnr_retry = ConnectOptions {
        rnr_retry: 0,
        min_rnr_timer: 1,
        ..conn_opts()
    };
    a.qp.connect(ea.psn, &eb, &no_rnr_retry).unwrap();
    b.qp.connect(eb.psn, &ea, &no_rnr_retry).unwrap();
    // No receive WR at B and no RNR retries: the SEND fails at once.
    a.qp.post_send_list(&[
        SendWr::inline(1, WrOpcode::Send, b"nobody listens").signaled(),
        SendWr::inline(2, WrOpcode::Send, b"behind it"),
    ])
    .unwrap();
    assert_eq!(
        ids_and_status(&wait(&a.scq, 2, "RNR with rnr_retry 0")),
        [(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)],
        "IBV_WC_RNR_RETRY_EXC_ERR, then the QP is in ERR"
    );
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(
        b.qp.state(),
        QpState::Rts,
        "an RNR NAK leaves the responder as it was"
    );

    // rnr_retry 7: the requester retries until a receive WR is posted.
    let (c, d) = (side(Opts::default()), side(Opts::default()));
    let (ec, ed) = (endpoint(&c), endpoint(&d));
    let for_ever = ConnectOptions {
        rnr_retry: 7,
        min_rnr_timer: 1,
        ..conn_opts()
    };
    c.qp.connect(ec.psn, &ed, &for_ever).unwrap();
    d.qp.connect(ed.psn, &ec, &for_ever).unwrap();
    c.qp.post_send(&SendWr::inline(3, WrOpcode::Send, b"wait for me").signaled())
        .unwrap();
    assert!(
        drain_for(&c.scq, Duration::from_millis(50)).is_empty(),
        "no receive WR yet: the SEND waits"
    );
    d.qp.post_recv(&RecvWr::new(4, &[sge(&d.mr, 0, 64)]))
        .unwrap();
    assert_eq!(
        ids_and_status(&wait(&c.scq, 1, "after the receive WR came")),
        [(3, WcStatus::Success)]
    );
    assert_eq!(wait(&d.rcq, 1, "receiver")[0].byte_len, 11);
}

#[test]
fn silent_peer_exhausts_retry_cnt_with_retry_exc_err() {
    let (a, b) = (side(Opts::default()), side(Opts::default()));
    let opts = ConnectOptions {
        timeout: 8, // about 1 ms
        retry_cnt: 1,
        ..conn_opts()
    };
    // B stays in RESET: its device drops A's packets.
    a.qp.connect(endpoint(&a).psn, &endpoint(&b), &opts)
        .unwrap();
    a.qp.post_send_list(&[
        SendWr::inline(1, WrOpcode::Send, b"hello?").signaled(),
        SendWr::inline(2, WrOpcode::Send, b"anyone?"),
    ])
    .unwrap();
    assert_eq!(
        ids_and_status(&wait(&a.scq, 2, "retries exhausted")),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)],
        "IBV_WC_RETRY_EXC_ERR, then the QP is in ERR"
    );
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn modify_to_err_flushes_posted_receives() {
    let (ctx, pd, cq, qp) = lone_qp(Opts::default().caps);
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    to_init(&qp);
    qp.post_recv_list(&[
        RecvWr::new(1, &[sge(&mr, 0, 64)]),
        RecvWr::new(2, &[sge(&mr, 64, 64)]),
    ])
    .unwrap();
    assert!(
        drain_for(&cq, Duration::from_millis(20)).is_empty(),
        "receives wait in INIT"
    );
    modify_state(&qp, QpState::Err).unwrap();
    let got = wait(&cq, 2, "modify to ERR");
    assert_eq!(
        ids_and_status(&got),
        [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(got.iter().all(|w| w.qp_num == qp.qp_num()));
    // RESET empties the queues without completions; the QP starts afresh.
    modify_state(&qp, QpState::Reset).unwrap();
    to_init(&qp);
    qp.post_recv(&RecvWr::new(3, &[sge(&mr, 0, 64)])).unwrap();
    modify_state(&qp, QpState::Reset).unwrap();
    assert_quiet(&cq, "RESET discards WRs without completions");
    drop(ctx);
}

#[test]
fn cq_overrun_raises_cq_err_for_the_cq_and_qp_fatal_for_the_qp() {
    let oa = Opts {
        send_cqe: 2,
        sq_sig_all: true,
        user_data: 0xfa7a1,
        ..Opts::default()
    };
    let (a, b) = pair(oa, Opts::default());
    let cap = a.scq.cqe() as u64;
    assert!(cap < 16, "asked for 2 CQEs, got {cap}");
    for i in 0..cap + 4 {
        b.qp.post_recv(&RecvWr::new(i, &[sge(&b.mr, i * 64, 64)]))
            .unwrap();
    }
    let s = [sge(&a.mr, 0, 8)];
    let wrs: Vec<SendWr<'_>> = (0..cap + 2)
        .map(|i| SendWr::new(i, WrOpcode::Send, &s))
        .collect();
    a.qp.post_send_list(&wrs).unwrap();
    // Nobody polls A's send CQ: the completion after `cap` overruns it.
    let ev = wait_event(&a.ctx, AsyncEventType::CqErr, "CQ overrun");
    assert!(ev.is_for_cq(&a.scq), "CQ_ERR names the CQ: {ev:?}");
    assert_eq!(
        ev.element(),
        AsyncEventElement::Cq {
            handle: a.scq.handle(),
            user_data: 0x5c
        }
    );
    drop(ev);
    let ev = wait_event(
        &a.ctx,
        AsyncEventType::QpFatal,
        "the QP whose completion was lost",
    );
    assert!(ev.is_for_qp(&a.qp), "QP_FATAL names the QP: {ev:?}");
    assert_eq!(
        ev.element(),
        AsyncEventElement::Qp {
            qp_num: a.qp.qp_num(),
            user_data: 0xfa7a1
        }
    );
    drop(ev);
    assert_eq!(a.qp.state(), QpState::Err, "QP_FATAL: the QP is in ERR");
    let mut buf = [WorkCompletion::default(); 32];
    let n = a.scq.poll(&mut buf).unwrap();
    assert_eq!(n as u64, cap, "the CQ holds the completions that fit");
    let want: Vec<(u64, WcStatus)> = (0..cap).map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(ids_and_status(&buf[..n]), want);
    assert_no_event(&a.ctx, Duration::from_millis(50), "CQ_ERR is raised once");
}

#[test]
fn comm_est_when_the_first_packet_reaches_a_qp_in_rtr() {
    let oa = Opts {
        user_data: 0xc0,
        ..Opts::default()
    };
    let (a, b) = (side(oa), side(Opts::default()));
    let (ea, eb) = (endpoint(&a), endpoint(&b));
    // A stays in RTR, B goes to RTS and sends first.
    let mut attr = full_attr(&a.qp, QpState::Init, eb.qpn);
    attr.qp_access_flags = ALL;
    attr.rq_psn = eb.psn;
    a.qp.modify(&attr, init_mask()).unwrap();
    attr.qp_state = QpState::Rtr;
    a.qp.modify(&attr, rtr_mask()).unwrap();
    a.qp.post_recv(&RecvWr::new(1, &[sge(&a.mr, 0, 64)]))
        .unwrap();
    a.qp.post_recv(&RecvWr::new(2, &[sge(&a.mr, 64, 64)]))
        .unwrap();
    assert_no_event(&a.ctx, Duration::from_millis(20), "nothing received yet");
    b.qp.connect(eb.psn, &ea, &conn_opts()).unwrap();
    b.qp.post_send(&SendWr::inline(5, WrOpcode::Send, b"hello rtr").signaled())
        .unwrap();
    let got = wait(&a.rcq, 1, "receive in RTR");
    assert_eq!(ids_and_status(&got), [(1, WcStatus::Success)]);
    assert_eq!(got[0].byte_len, 9);
    let ev = wait_event(&a.ctx, AsyncEventType::CommEst, "first packet in RTR");
    assert!(ev.is_for_qp(&a.qp), "COMM_EST names the QP: {ev:?}");
    assert_eq!(
        ev.element(),
        AsyncEventElement::Qp {
            qp_num: a.qp.qp_num(),
            user_data: 0xc0
        }
    );
    drop(ev);
    assert_eq!(
        ids_and_status(&wait(&b.scq, 1, "sender")),
        [(5, WcStatus::Success)]
    );
    // Once only.
    b.qp.post_send(&SendWr::inline(6, WrOpcode::Send, b"again").signaled())
        .unwrap();
    assert_eq!(wait(&a.rcq, 1, "second receive")[0].wr_id, 2);
    assert_no_event(&a.ctx, Duration::from_millis(50), "COMM_EST only once");
    // A in RTS: the connection works both ways.
    attr.qp_state = QpState::Rts;
    attr.sq_psn = ea.psn;
    a.qp.modify(&attr, rts_mask()).unwrap();
    b.qp.post_recv(&RecvWr::new(30, &[sge(&b.mr, 0, 64)]))
        .unwrap();
    a.qp.post_send(&SendWr::inline(31, WrOpcode::Send, b"back").signaled())
        .unwrap();
    assert_eq!(
        ids_and_status(&wait(&b.rcq, 1, "A → B")),
        [(30, WcStatus::Success)]
    );
}

// ---- 7. completion channels ----------------------------------------------------

#[test]
fn armed_cq_fires_once_on_the_next_completion() {
    let ob = Opts {
        channel: true,
        ..Opts::default()
    };
    let (a, b) = pair(Opts::default(), ob);
    let ch = b.channel.as_ref().unwrap();
    for i in 0..3 {
        b.qp.post_recv(&RecvWr::new(i, &[sge(&b.mr, i * 64, 64)]))
            .unwrap();
    }
    b.rcq.req_notify(false).unwrap();
    assert!(
        ch.try_get_cq_event().unwrap().is_none(),
        "no event before any completion"
    );
    a.qp.post_send_list(&[
        SendWr::inline(1, WrOpcode::Send, b"one").signaled(),
        SendWr::inline(2, WrOpcode::Send, b"two").signaled(),
    ])
    .unwrap();
    let ev = ch
        .get_cq_event_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("the armed CQ fires on the next completion");
    assert!(ev.is_for(&b.rcq), "the event names the receive CQ");
    assert_eq!(ev.user_data(), 0x7c, "cq_context");
    drop(ev);
    assert_eq!(wait(&a.scq, 2, "sender").len(), 2);
    assert_eq!(wait(&b.rcq, 2, "both receives").len(), 2);
    assert!(
        ch.try_get_cq_event().unwrap().is_none(),
        "one arm, one event: the second completion must not fire again"
    );
    // Re-armed, it fires again.
    b.rcq.req_notify(false).unwrap();
    a.qp.post_send(&SendWr::inline(3, WrOpcode::Send, b"three").signaled())
        .unwrap();
    let ev = ch
        .get_cq_event_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("re-armed CQ fires");
    assert!(ev.is_for(&b.rcq));
    drop(ev);
    assert_eq!(b.rcq.comp_events(), (2, 2), "two events, both acknowledged");
}

#[test]
fn solicited_only_arm_fires_for_a_solicited_send_only() {
    let ob = Opts {
        channel: true,
        ..Opts::default()
    };
    let (a, b) = pair(Opts::default(), ob);
    let ch = b.channel.as_ref().unwrap();
    for i in 0..3 {
        b.qp.post_recv(&RecvWr::new(i, &[sge(&b.mr, i * 64, 64)]))
            .unwrap();
    }
    b.rcq.req_notify(true).unwrap();
    // Not solicited: the receive completes, no event.
    a.qp.post_send(&SendWr::inline(1, WrOpcode::Send, b"plain").signaled())
        .unwrap();
    assert_eq!(
        wait(&a.scq, 1, "unsolicited send")[0].status,
        WcStatus::Success
    );
    assert_eq!(wait(&b.rcq, 1, "unsolicited receive")[0].wr_id, 0);
    assert!(
        ch.get_cq_event_timeout(Duration::from_millis(100))
            .unwrap()
            .is_none(),
        "a solicited-only arm must not fire for a SEND without the solicited flag"
    );
    // Solicited: it fires.
    a.qp.post_send(
        &SendWr::inline(2, WrOpcode::SendWithImm { imm: 9 }, b"urgent")
            .signaled()
            .solicited(),
    )
    .unwrap();
    let ev = ch
        .get_cq_event_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("a solicited SEND fires a solicited-only arm");
    assert!(ev.is_for(&b.rcq));
    drop(ev);
    let got = wait(&b.rcq, 1, "solicited receive");
    assert_eq!((got[0].wr_id, got[0].imm()), (1, Some(9)));
    // An error completion fires a solicited-only arm as well (IBTA 11.4.2.2):
    // the flush of the last receive WR when B goes to ERR.
    b.rcq.req_notify(true).unwrap();
    modify_state(&b.qp, QpState::Err).unwrap();
    let ev = ch
        .get_cq_event_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("an unsuccessful completion fires a solicited-only arm");
    drop(ev);
    assert_eq!(
        ids_and_status(&wait(&b.rcq, 1, "flushed receive")),
        [(2, WcStatus::WrFlushErr)]
    );
}

#[test]
fn a_request_the_responder_does_not_allow_raises_qp_req_err() {
    let (a, b) = (side(Opts::default()), side(Opts::default()));
    let (ea, eb) = (endpoint(&a), endpoint(&b));
    a.qp.connect(ea.psn, &eb, &conn_opts()).unwrap();
    // B lets peers read its memory, not write it.
    let read_only = ConnectOptions {
        access: AccessFlags::REMOTE_READ,
        ..conn_opts()
    };
    b.qp.connect(eb.psn, &ea, &read_only).unwrap();
    let s = [sge(&a.mr, 0, 64)];
    a.qp.post_send(
        &SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.iova(),
                rkey: b.mr.rkey(),
            },
            &s,
        )
        .signaled(),
    )
    .unwrap();
    let sq = wait(&a.scq, 1, "requester send CQ");
    assert_eq!(ids_and_status(&sq), [(1, WcStatus::RemInvReqErr)]);
    let ev = wait_event(&b.ctx, AsyncEventType::QpReqErr, "responder");
    assert!(ev.is_for_qp(&b.qp), "{ev:?}");
    assert_eq!(
        ev.element(),
        rverbs::AsyncEventElement::Qp {
            qp_num: b.qp.qp_num(),
            user_data: b.qp.user_data()
        }
    );
    drop(ev);
    assert_eq!(b.qp.state(), QpState::Err);
}

#[test]
fn destroying_a_qp_right_after_its_last_receive_still_acknowledges_it() {
    // A busy poller's pass holds the ACK of what it received back (to ride
    // with a reply); destroying the QP at once must still send it, or the
    // sender retries into RETRY_EXC_ERR (ibv_rc_pingpong's last message).
    for round in 0..20 {
        let (a, b) = pair(Opts::default(), Opts::default());
        b.qp.post_recv(&RecvWr::new(1, &[sge(&b.mr, 0, 64)]))
            .unwrap();
        let s = [sge(&a.mr, 0, 64)];
        a.qp.post_send(&SendWr::new(2, WrOpcode::Send, &s).signaled())
            .unwrap();
        let got = wait(&b.rcq, 1, "receive");
        assert_eq!(got[0].status, WcStatus::Success);
        let Side { qp, .. } = b;
        qp.destroy().unwrap();
        let sent = wait(&a.scq, 1, "send");
        assert_eq!(
            ids_and_status(&sent),
            [(2, WcStatus::Success)],
            "round {round}"
        );
    }
}

#[test]
fn post_send_all_posts_every_wr_or_none() {
    let (a, b) = pair(Opts::default(), Opts::default());
    for i in 0..4 {
        b.qp.post_recv(&RecvWr::new(100 + i, &[sge(&b.mr, i * 64, 64)]))
            .unwrap();
    }
    let one = [sge(&a.mr, 0, 8)];
    let five: Vec<Sge> = (0..5).map(|i| sge(&a.mr, i * 8, 8)).collect();
    // The third WR has more SGEs than max_send_sge (4): none goes.
    let batch = [
        SendWr::new(1, WrOpcode::Send, &one).signaled(),
        SendWr::new(2, WrOpcode::Send, &one).signaled(),
        SendWr::new(3, WrOpcode::Send, &five).signaled(),
    ];
    let e = a.qp.post_send_all(&batch).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(e.detail(), Some(ErrorDetail::BadWr { index: 2 }));
    assert_quiet(&a.scq, "nothing was posted");
    assert_quiet(&b.rcq, "nothing arrived");
    // post_send_list posts the WRs before the refused one.
    let e = a.qp.post_send_list(&batch).unwrap_err();
    assert_eq!(e.detail(), Some(ErrorDetail::BadWr { index: 2 }));
    assert_eq!(ids_and_status(&wait(&a.scq, 2, "the first two")).len(), 2);
    // A good batch goes whole.
    a.qp.post_send_all(&batch[..2]).unwrap();
    assert_eq!(
        ids_and_status(&wait(&a.scq, 2, "batch")),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(wait(&b.rcq, 4, "receives").len(), 4);
}

/// A QP moved to RESET takes its completions out of its CQs — the flushes
/// of the error it is reset from — as mlx5's provider does, so a program
/// that resets and reconnects a QP polls only what comes after (rdma-core's
/// `test_mr_rereg_pd` does so). Another QP's completions in the same CQ
/// stay, in order.
#[test]
fn reset_purges_the_qps_completions_and_only_its() {
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let ctx = device().open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let mr = pd.alloc_mr(256, AccessFlags::LOCAL_WRITE).unwrap();
    let a = pd.qp_builder(&cq, &cq).caps(caps).build().unwrap();
    let b = pd.qp_builder(&cq, &cq).caps(caps).build().unwrap();
    for (qp, base) in [(&a, 100u64), (&b, 200u64)] {
        to_init(qp);
        for i in 0..3 {
            qp.post_recv(&RecvWr::new(base + i, &[sge(&mr, 0, 64)]))
                .unwrap();
        }
        modify_state(qp, QpState::Err).unwrap();
    }
    // Both QPs' receives were flushed into the one CQ (the move to ERR
    // flushes at once); nothing is polled before a's RESET.
    modify_state(&a, QpState::Reset).unwrap();
    let left = wait(&cq, 3, "b's flushes");
    assert_eq!(
        ids_and_status(&left),
        (200..203)
            .map(|i| (i, WcStatus::WrFlushErr))
            .collect::<Vec<_>>(),
        "after a's RESET only b's completions are left"
    );
    assert_quiet(&cq, "nothing more");
}
