//! Memory windows (issue 16): type 1 windows bound with `bind_mw`, type 2
//! windows bound with BIND_MW send WRs, remote access through a window's
//! rkey checked against the window's own range and rights, invalidation
//! (LOCAL_INV, a peer's SEND with Invalidate, a zero-length bind,
//! deallocation), and the errors rxe gives.

use rverbs::{
    inc_rkey, AccessFlags, ErrorKind, MemoryWindow, MwBind, MwBindInfo, MwType, QpCaps, QpType,
    RecvWr, SendFlags, SendWr, Sge, WcFlags, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

mod common;
use common::{connected_pair, sge, wait, PairSide};

/// The MR a window is bound to: no remote rights of its own.
const BINDABLE: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::MW_BIND);
const REMOTE_RW: AccessFlags = AccessFlags::REMOTE_READ.union(AccessFlags::REMOTE_WRITE);
/// Where the windows start in their MR, and how long they are.
const AT: u64 = 64;
const LEN: u64 = 128;

/// A connected RC pair: `a` the requester, `b` the side whose MR (of
/// `access`) windows are bound to.
fn pair(access: AccessFlags) -> (PairSide, PairSide) {
    let caps = QpCaps {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    };
    let (a, mut b) = connected_pair(QpType::Rc, caps, 4096, ALL_LOCAL);
    b.mr = b.pd.alloc_mr(4096, access).unwrap();
    (a, b)
}

const ALL_LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;

fn info(b: &PairSide, access: AccessFlags) -> MwBindInfo {
    MwBindInfo::new(b.mr.lkey(), b.mr.iova() + AT, LEN, access)
}

fn one(cq: &rverbs::CompletionQueue, what: &str) -> WorkCompletion {
    wait(cq, 1, what)[0]
}

/// Binds type 1 window `mw` of `b` to `info`; the completion's status.
fn bind1(b: &PairSide, mw: &MemoryWindow, info: MwBindInfo) -> (u32, WorkCompletion) {
    let bind = MwBind {
        wr_id: 0xb1,
        flags: SendFlags::SIGNALED,
        info,
    };
    let rkey = b.qp.bind_mw(mw, &bind).unwrap();
    (rkey, one(&b.cq, "bind"))
}

/// Binds type 2 window `mw` of `b` with a BIND_MW send WR.
fn bind2(b: &PairSide, mw: &MemoryWindow, info: MwBindInfo) -> (u32, WorkCompletion) {
    let op = mw.bind_op(info);
    let WrOpcode::BindMw { rkey, .. } = op else {
        unreachable!()
    };
    b.qp.post_send(&SendWr::new(0xb2, op, &[]).signaled())
        .unwrap();
    (rkey, one(&b.cq, "bind WR"))
}

/// `a` writes `data` at `va` through `rkey`; the completion.
fn write(a: &PairSide, rkey: u32, va: u64, data: &[u8]) -> WorkCompletion {
    a.mr.write_at(0, data).unwrap();
    let sges = [sge(&a.mr, 0, data.len() as u32)];
    let op = WrOpcode::RdmaWrite {
        remote_addr: va,
        rkey,
    };
    a.qp.post_send(&SendWr::new(7, op, &sges).signaled())
        .unwrap();
    one(&a.cq, "write")
}

/// `a` reads `len` bytes at `va` through `rkey` into its MR at 512.
fn read(a: &PairSide, rkey: u32, va: u64, len: u32) -> WorkCompletion {
    let sges = [sge(&a.mr, 512, len)];
    let op = WrOpcode::RdmaRead {
        remote_addr: va,
        rkey,
    };
    a.qp.post_send(&SendWr::new(8, op, &sges).signaled())
        .unwrap();
    one(&a.cq, "read")
}

#[test]
fn type1_window_gives_its_own_rights_under_a_new_rkey_each_bind() {
    let (a, b) = pair(BINDABLE);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    assert_eq!(mw.mw_type(), MwType::Type1);
    let first = mw.rkey();
    let (rkey, wc) = bind1(&b, &mw, info(&b, REMOTE_RW));
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (0xb1, WcStatus::Success, WcOpcode::BindMw)
    );
    assert_eq!(rkey, mw.rkey());
    assert_eq!(rkey, inc_rkey(first));
    assert_eq!(rkey & !0xff, first & !0xff, "the key's index stays");
    assert_ne!(rkey & 0xff, first & 0xff, "the tag changes");
    assert_ne!(rkey, b.mr.rkey());

    let va = b.mr.iova() + AT;
    let wc = write(&a, rkey, va + 8, b"through a window");
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    let mut got = [0u8; 16];
    b.mr.read_at((AT + 8) as usize, &mut got).unwrap();
    assert_eq!(&got, b"through a window");
    let wc = read(&a, rkey, va + 8, 16);
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    let mut back = [0u8; 16];
    a.mr.read_at(512, &mut back).unwrap();
    assert_eq!(&back, b"through a window");

    // A second bind: the tag moves again, and the old rkey is dead.
    let (second, wc) = bind1(&b, &mw, info(&b, REMOTE_RW));
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(second, inc_rkey(rkey));
    assert_eq!(write(&a, second, va, b"x").status, WcStatus::Success);
    assert_eq!(
        write(&a, rkey, va, b"x").status,
        WcStatus::RemAccessErr,
        "the rkey of the previous bind"
    );
}

#[test]
fn the_mr_rkey_grants_only_the_mrs_own_rights() {
    let (a, b) = pair(BINDABLE);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    assert_eq!(
        bind1(&b, &mw, info(&b, REMOTE_RW)).1.status,
        WcStatus::Success
    );
    let wc = write(&a, b.mr.rkey(), b.mr.iova() + AT, b"x");
    assert_eq!(wc.status, WcStatus::RemAccessErr);
}

#[test]
fn an_access_past_the_window_is_a_remote_access_error_though_inside_the_mr() {
    let (a, b) = pair(BINDABLE);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let (rkey, _) = bind1(&b, &mw, info(&b, REMOTE_RW));
    let end = b.mr.iova() + AT + LEN;
    let wc = write(&a, rkey, end - 8, &[1u8; 16]);
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    let mut untouched = [9u8; 16];
    b.mr.read_at((AT + LEN - 8) as usize, &mut untouched)
        .unwrap();
    assert_eq!(untouched, [0u8; 16], "nothing written");
}

#[test]
fn an_access_before_the_window_is_a_remote_access_error() {
    let (a, b) = pair(BINDABLE);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let (rkey, _) = bind1(&b, &mw, info(&b, REMOTE_RW));
    let wc = read(&a, rkey, b.mr.iova() + AT - 1, 4);
    assert_eq!(wc.status, WcStatus::RemAccessErr);
}

#[test]
fn a_read_through_a_write_only_window_is_a_remote_access_error() {
    let (a, b) = pair(BINDABLE);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let (rkey, _) = bind1(&b, &mw, info(&b, AccessFlags::REMOTE_WRITE));
    assert_eq!(
        write(&a, rkey, b.mr.iova() + AT, b"ok").status,
        WcStatus::Success
    );
    let wc = read(&a, rkey, b.mr.iova() + AT, 4);
    assert_eq!(wc.status, WcStatus::RemAccessErr);
}

#[test]
fn an_atomic_needs_the_windows_atomic_right() {
    let (a, b) = pair(BINDABLE);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let atomic = REMOTE_RW | AccessFlags::REMOTE_ATOMIC;
    let (rkey, _) = bind1(&b, &mw, info(&b, atomic));
    b.mr.write_at(AT as usize, &5u64.to_ne_bytes()).unwrap();
    let sges = [sge(&a.mr, 0, 8)];
    let op = WrOpcode::AtomicFetchAndAdd {
        remote_addr: b.mr.iova() + AT,
        rkey,
        add: 3,
    };
    a.qp.post_send(&SendWr::new(9, op, &sges).signaled())
        .unwrap();
    assert_eq!(one(&a.cq, "fetch-add").status, WcStatus::Success);
    let mut word = [0u8; 8];
    b.mr.read_at(AT as usize, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 8);

    let (a, b) = pair(BINDABLE);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let (rkey, _) = bind1(&b, &mw, info(&b, REMOTE_RW));
    let op = WrOpcode::AtomicFetchAndAdd {
        remote_addr: b.mr.iova() + AT,
        rkey,
        add: 3,
    };
    let sges = [sge(&a.mr, 0, 8)];
    a.qp.post_send(&SendWr::new(9, op, &sges).signaled())
        .unwrap();
    assert_eq!(one(&a.cq, "fetch-add").status, WcStatus::RemAccessErr);
}

#[test]
fn a_zero_length_bind_unbinds_a_type1_window() {
    let (a, b) = pair(BINDABLE);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let (rkey, _) = bind1(&b, &mw, info(&b, REMOTE_RW));
    assert!(mw.is_bound());
    let (after, wc) = bind1(&b, &mw, MwBindInfo::unbind());
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    assert!(!mw.is_bound());
    assert_eq!(after, inc_rkey(rkey));
    // (One refusal: it moves both QPs to ERR.)
    let wc = write(&a, rkey, b.mr.iova() + AT, b"x");
    assert_eq!(wc.status, WcStatus::RemAccessErr);
}

#[test]
fn type2_window_bound_by_a_send_wr_and_invalidated_locally() {
    let (a, b) = pair(BINDABLE);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let first = mw.rkey();
    let (rkey, wc) = bind2(&b, &mw, info(&b, REMOTE_RW));
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (0xb2, WcStatus::Success, WcOpcode::BindMw)
    );
    assert_eq!(rkey, inc_rkey(first));
    assert_eq!(mw.rkey(), rkey);
    assert_eq!(
        write(&a, rkey, b.mr.iova() + AT, b"type 2").status,
        WcStatus::Success
    );
    // A bound type 2 window must be invalidated before it is bound again.
    let inv = SendWr::new(0x1a, WrOpcode::LocalInv { rkey }, &[]).signaled();
    b.qp.post_send(&inv).unwrap();
    let wc = one(&b.cq, "local invalidate");
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (0x1a, WcStatus::Success, WcOpcode::LocalInv)
    );
    assert!(!mw.is_bound());
    assert_eq!(
        write(&a, rkey, b.mr.iova() + AT, b"x").status,
        WcStatus::RemAccessErr
    );
}

#[test]
fn a_peers_send_with_invalidate_revokes_the_window_and_reports_its_rkey() {
    let (a, b) = pair(BINDABLE);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let (rkey, _) = bind2(&b, &mw, info(&b, REMOTE_RW));
    let rsges = [sge(&b.mr, 1024, 64)];
    b.qp.post_recv(&RecvWr::new(0x77, &rsges)).unwrap();
    a.mr.write_at(0, b"done with it").unwrap();
    let sges = [sge(&a.mr, 0, 12)];
    a.qp.post_send(&SendWr::new(3, WrOpcode::SendWithInv { rkey }, &sges).signaled())
        .unwrap();
    let sent = one(&a.cq, "send with invalidate");
    assert_eq!(
        (sent.status, sent.opcode),
        (WcStatus::Success, WcOpcode::Send)
    );
    let recv = one(&b.cq, "receive");
    assert_eq!(
        (recv.wr_id, recv.status, recv.opcode, recv.byte_len),
        (0x77, WcStatus::Success, WcOpcode::Recv, 12)
    );
    assert!(recv.wc_flags.contains(WcFlags::WITH_INV), "{recv:?}");
    assert!(!recv.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(recv.imm_data, rkey, "invalidated_rkey");
    assert!(!mw.is_bound());
    assert_eq!(
        write(&a, rkey, b.mr.iova() + AT, b"x").status,
        WcStatus::RemAccessErr
    );
}

#[test]
fn a_send_with_invalidate_of_no_window_is_an_invalid_request() {
    let (a, b) = pair(BINDABLE);
    let rsges = [sge(&b.mr, 1024, 64)];
    b.qp.post_recv(&RecvWr::new(0x78, &rsges)).unwrap();
    let sges = [sge(&a.mr, 0, 4)];
    // The MR's own rkey: no fast-registered MR here to invalidate (rxe
    // refuses a user MR too).
    let op = WrOpcode::SendWithInv { rkey: b.mr.rkey() };
    a.qp.post_send(&SendWr::new(4, op, &sges).signaled())
        .unwrap();
    assert_eq!(one(&a.cq, "send").status, WcStatus::RemInvReqErr);
    let recv = one(&b.cq, "receive");
    assert_eq!((recv.wr_id, recv.status), (0x78, WcStatus::RemInvReqErr));
}

#[test]
fn a_zero_based_type2_window_takes_offsets() {
    let (a, b) = pair(BINDABLE);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let (rkey, wc) = bind2(&b, &mw, info(&b, REMOTE_RW | AccessFlags::ZERO_BASED));
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(write(&a, rkey, 16, b"zb").status, WcStatus::Success);
    let mut got = [0u8; 2];
    b.mr.read_at((AT + 16) as usize, &mut got).unwrap();
    assert_eq!(&got, b"zb");
    assert_eq!(
        write(&a, rkey, LEN - 1, b"zb").status,
        WcStatus::RemAccessErr
    );
}

#[test]
fn deallocating_a_bound_type2_window_revokes_it() {
    let (a, b) = pair(BINDABLE);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let (rkey, _) = bind2(&b, &mw, info(&b, REMOTE_RW));
    mw.dealloc().unwrap();
    assert_eq!(
        write(&a, rkey, b.mr.iova() + AT, b"x").status,
        WcStatus::RemAccessErr
    );
}

#[test]
fn binding_to_an_mr_without_mw_bind_fails_with_mw_bind_err() {
    let (_a, b) = pair(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let (_, wc) = bind2(&b, &mw, info(&b, REMOTE_RW));
    assert_eq!((wc.wr_id, wc.status), (0xb2, WcStatus::MwBindErr));
    assert_eq!(b.qp.state(), rverbs::QpState::Err);
    assert!(!mw.is_bound());
}

#[test]
fn binding_past_the_end_of_the_mr_fails_with_mw_bind_err() {
    let (_a, b) = pair(BINDABLE);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let past = MwBindInfo::new(b.mr.lkey(), b.mr.iova() + 4000, 200, REMOTE_RW);
    let (_, wc) = bind1(&b, &mw, past);
    assert_eq!(wc.status, WcStatus::MwBindErr);
}

#[test]
fn a_writable_window_needs_local_write_on_its_mr() {
    let (_a, b) = pair(AccessFlags::MW_BIND);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let (_, wc) = bind1(&b, &mw, info(&b, AccessFlags::REMOTE_WRITE));
    assert_eq!(wc.status, WcStatus::MwBindErr);
}

#[test]
fn rebinding_a_bound_type2_window_fails_with_mw_bind_err() {
    let (_a, b) = pair(BINDABLE);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    assert_eq!(
        bind2(&b, &mw, info(&b, REMOTE_RW)).1.status,
        WcStatus::Success
    );
    assert_eq!(
        bind2(&b, &mw, info(&b, REMOTE_RW)).1.status,
        WcStatus::MwBindErr
    );
}

#[test]
fn a_local_invalidate_of_a_type1_window_fails() {
    let (_a, b) = pair(BINDABLE);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let (rkey, _) = bind1(&b, &mw, info(&b, REMOTE_RW));
    let inv = SendWr::new(0x1b, WrOpcode::LocalInv { rkey }, &[]).signaled();
    b.qp.post_send(&inv).unwrap();
    assert_eq!(one(&b.cq, "invalidate").status, WcStatus::LocQpOpErr);
    assert!(mw.is_bound());
}

#[test]
fn a_failed_bind_flushes_what_follows_it() {
    let (_a, b) = pair(AccessFlags::LOCAL_WRITE);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    b.qp.post_send(&SendWr::new(1, mw.bind_op(info(&b, REMOTE_RW)), &[]).signaled())
        .unwrap();
    let sges = [sge(&b.mr, 0, 8)];
    b.qp.post_send(&SendWr::new(2, WrOpcode::Send, &sges).signaled())
        .unwrap();
    let wcs = wait(&b.cq, 2, "bind and send");
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::MwBindErr), (2, WcStatus::WrFlushErr)]
    );
}

#[test]
fn verb_errors_are_libibverbs_errnos() {
    let (_a, b) = pair(BINDABLE);
    let mw2 = b.pd.alloc_mw(MwType::Type2).unwrap();
    let bind = MwBind {
        wr_id: 1,
        flags: SendFlags::SIGNALED,
        info: info(&b, REMOTE_RW),
    };
    // ibv_bind_mw binds type 1 windows only.
    let e = b.qp.bind_mw(&mw2, &bind).unwrap_err();
    assert_eq!((e.kind(), e.errno()), (ErrorKind::InvalidArgument, 22));
    // A zero-based type 1 window.
    let mw1 = b.pd.alloc_mw(MwType::Type1).unwrap();
    let zb = MwBind {
        info: info(&b, REMOTE_RW | AccessFlags::ZERO_BASED),
        ..bind
    };
    assert_eq!(
        b.qp.bind_mw(&mw1, &zb).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    // An MR of another PD than the window's.
    let other_pd = b.ctx.alloc_pd().unwrap();
    let other_mr = other_pd.alloc_mr(256, BINDABLE).unwrap();
    let foreign = MwBind {
        info: MwBindInfo::new(other_mr.lkey(), other_mr.iova(), 64, REMOTE_RW),
        ..bind
    };
    let e = b.qp.bind_mw(&mw1, &foreign).unwrap_err();
    assert_eq!((e.kind(), e.errno()), (ErrorKind::PermissionDenied, 1));
    // Nothing was posted: no completion came.
    let mut none = [WorkCompletion::default(); 1];
    assert_eq!(b.cq.poll(&mut none).unwrap(), 0);

    // An MR with a bound window is not deregistered (rxe: EINVAL) until
    // the window lets it go.
    let (_, wc) = bind1(&b, &mw1, info(&b, REMOTE_RW));
    assert_eq!(wc.status, WcStatus::Success);
    let mr = b.mr;
    let rejected = mr.dereg().unwrap_err();
    assert_eq!(rejected.error().kind(), ErrorKind::InvalidArgument);
    let mr = rejected.into_inner();
    assert_eq!(bind1_on(&b.qp, &b.cq, &mw1).status, WcStatus::Success);
    mr.dereg().unwrap();

    // A PD with windows is busy.
    let e = other_pd.dealloc().unwrap_err();
    assert_eq!(e.error().kind(), ErrorKind::Busy, "{}", e.error());
    let other_pd = e.into_inner();
    drop(other_mr);
    let w = other_pd.alloc_mw(MwType::Type1).unwrap();
    let e = other_pd.dealloc().unwrap_err();
    assert_eq!(e.error().kind(), ErrorKind::Busy);
    drop(w);
    e.into_inner().dealloc().unwrap();
}

/// Unbinds `mw` through `qp` (a zero-length bind); the completion.
fn bind1_on(
    qp: &rverbs::QueuePair,
    cq: &rverbs::CompletionQueue,
    mw: &MemoryWindow,
) -> WorkCompletion {
    let bind = MwBind {
        wr_id: 0xb0,
        flags: SendFlags::SIGNALED,
        info: MwBindInfo::unbind(),
    };
    qp.bind_mw(mw, &bind).unwrap();
    one(cq, "unbind")
}

#[test]
fn ud_qps_take_no_window_operations() {
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let side = common::pair_side(QpType::Ud, caps, 256, BINDABLE);
    common::ud_to_rts(&side.qp, 0x11);
    let mw = side.pd.alloc_mw(MwType::Type2).unwrap();
    let op = mw.bind_op(MwBindInfo::new(
        side.mr.lkey(),
        side.mr.iova(),
        8,
        REMOTE_RW,
    ));
    let e = side
        .qp
        .post_send(&SendWr::new(1, op, &[] as &[Sge]))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn a_type2_window_serves_only_the_qp_it_was_bound_on() {
    let (a, b) = pair(BINDABLE);
    // A second connection between the same two PDs.
    let caps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qa2 = a.pd.qp_builder(&a.cq, &a.cq).caps(caps).build().unwrap();
    let qb2 = b.pd.qp_builder(&b.cq, &b.cq).caps(caps).build().unwrap();
    let opts = rverbs::cm::ConnectOptions {
        timeout: 10,
        ..rverbs::cm::ConnectOptions::default()
    };
    let (ea, eb) = (
        rverbs::cm::Endpoint::for_qp(&qa2),
        rverbs::cm::Endpoint::for_qp(&qb2),
    );
    qa2.connect(ea.psn, &eb, &opts).unwrap();
    qb2.connect(eb.psn, &ea, &opts).unwrap();

    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let (rkey, _) = bind2(&b, &mw, info(&b, REMOTE_RW));
    // Through the QP it was bound on: fine.
    assert_eq!(
        write(&a, rkey, b.mr.iova() + AT, b"qp 1").status,
        WcStatus::Success
    );
    // Through the other connection: a remote access error.
    let sges = [sge(&a.mr, 0, 4)];
    let op = WrOpcode::RdmaWrite {
        remote_addr: b.mr.iova() + AT,
        rkey,
    };
    qa2.post_send(&SendWr::new(0x22, op, &sges).signaled())
        .unwrap();
    let wc = one(&a.cq, "write on the other QP");
    assert_eq!((wc.wr_id, wc.status), (0x22, WcStatus::RemAccessErr));
    // Nor may that QP's peer invalidate it.
    assert!(mw.is_bound());
}

#[test]
fn a_window_rkey_is_no_lkey() {
    let (a, b) = pair(BINDABLE);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let (rkey, _) = bind1(&b, &mw, info(&b, REMOTE_RW));
    let _ = a;
    let sges = [Sge {
        addr: b.mr.iova() + AT,
        length: 8,
        lkey: rkey,
    }];
    b.qp.post_send(&SendWr::new(0x33, WrOpcode::Send, &sges).signaled())
        .unwrap();
    let wc = one(&b.cq, "send from a window");
    assert_eq!((wc.wr_id, wc.status), (0x33, WcStatus::LocProtErr));
}
