//! Zero-length requests through the public API (issue 14, item 2). IBTA
//! (C9-88): a zero-length RDMA READ or WRITE makes no R_Key check, so any
//! rkey and address go — rxe and NICs send zero-length READs with rkey 0
//! and VA 0. A zero-length READ, WRITE, WRITE with immediate and SEND must
//! complete, byte_len 0, and leave both QPs in RTS and working; on UC the
//! same for WRITE, WRITE with immediate and SEND. A non-zero READ with a
//! bad rkey is still a remote access error.

use std::time::Duration;

use rverbs::{
    AsyncEventType, CompletionQueue, Context, MemoryRegion, QpCaps, QpState, QpType, RecvWr,
    SendWr, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

mod common;
use common::ALL;
use common::{sge, wait, wait_event};

const MR_LEN: usize = 1 << 16;

/// An rkey no MR of the process has (keys are random, never 0 nor all
/// ones): B's flipped in its high bits.
fn bogus_rkey(mr: &MemoryRegion) -> u32 {
    mr.rkey() ^ 0x5a5a_0000
}

type Side = common::PairSide;

/// Two connected QPs of type `ty`, each in its own context on `rverbs0`.
fn pair(ty: QpType) -> (Side, Side) {
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    };
    common::connected_pair(ty, caps, MR_LEN, ALL)
}

/// (wr_id, status, opcode, byte_len) of each completion.
fn summary(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus, WcOpcode, u32)> {
    wcs.iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect()
}

/// Nothing more arrives on `cq` for a while.
fn assert_quiet(cq: &CompletionQueue, what: &str) {
    std::thread::sleep(Duration::from_millis(50));
    let mut wc = [WorkCompletion::default(); 4];
    let n = cq.poll(&mut wc).unwrap();
    assert_eq!(n, 0, "{what}: unexpected completions {:?}", &wc[..n]);
}

/// No async event is pending on `ctx`.
fn assert_no_event(ctx: &Context, what: &str) {
    let ev = ctx
        .get_async_event_timeout(Duration::from_millis(20))
        .unwrap();
    assert!(ev.is_none(), "{what}: async event {ev:?}");
}

/// Both QPs are in RTS, raised no async event, and still carry a SEND and
/// (on RC) an RDMA WRITE and READ with real keys, data intact.
fn assert_alive(a: &Side, b: &Side, what: &str) {
    assert_eq!(a.qp.state(), QpState::Rts, "{what}: requester");
    assert_eq!(b.qp.state(), QpState::Rts, "{what}: responder");
    assert_no_event(&a.ctx, what);
    assert_no_event(&b.ctx, what);
    let rc = a.qp.qp_type() == QpType::Rc;
    a.mr.write_at(0, b"still alive").unwrap();
    b.qp.post_recv(&RecvWr::new(900, &[sge(&b.mr, 4096, 64)]))
        .unwrap();
    a.qp.post_send(&SendWr::new(800, WrOpcode::Send, &[sge(&a.mr, 0, 11)]).signaled())
        .unwrap();
    let mut want = vec![(800, WcStatus::Success, WcOpcode::Send, 0)];
    if rc {
        let remote = b.mr.iova() + 8192;
        a.qp.post_send(
            &SendWr::new(
                801,
                WrOpcode::RdmaWrite {
                    remote_addr: remote,
                    rkey: b.mr.rkey(),
                },
                &[sge(&a.mr, 0, 11)],
            )
            .signaled(),
        )
        .unwrap();
        a.qp.post_send(
            &SendWr::new(
                802,
                WrOpcode::RdmaRead {
                    remote_addr: remote,
                    rkey: b.mr.rkey(),
                },
                &[sge(&a.mr, 100, 11)],
            )
            .signaled(),
        )
        .unwrap();
        want.push((801, WcStatus::Success, WcOpcode::RdmaWrite, 0));
        want.push((802, WcStatus::Success, WcOpcode::RdmaRead, 11));
    }
    let sent = wait(&a.cq, want.len(), what);
    assert_eq!(summary(&sent), want, "{what}: the QPs carry on");
    let recv = wait(&b.cq, 1, what);
    assert_eq!(
        summary(&recv),
        vec![(900, WcStatus::Success, WcOpcode::Recv, 11)],
        "{what}"
    );
    let mut got = [0u8; 11];
    b.mr.read_at(4096, &mut got).unwrap();
    assert_eq!(&got, b"still alive", "{what}");
    if rc {
        a.mr.read_at(100, &mut got).unwrap();
        assert_eq!(&got, b"still alive", "{what}: read back");
    }
}

/// Posts a zero-length RDMA READ (no SGEs) from A to B at `remote_addr`
/// with `rkey`: it completes with SUCCESS and byte_len 0, and both QPs stay
/// in RTS and keep working.
fn zero_length_read(what: &str, remote_addr: impl Fn(&Side) -> u64, rkey: impl Fn(&Side) -> u32) {
    let (a, b) = pair(QpType::Rc);
    let op = WrOpcode::RdmaRead {
        remote_addr: remote_addr(&b),
        rkey: rkey(&b),
    };
    a.qp.post_send(&SendWr::new(1, op, &[]).signaled()).unwrap();
    let wcs = wait(&a.cq, 1, what);
    assert_eq!(
        summary(&wcs),
        vec![(1, WcStatus::Success, WcOpcode::RdmaRead, 0)],
        "zero-length READ, {what}"
    );
    assert_alive(&a, &b, what);
}

/// rkey 0 and VA 0: what rxe and NICs send.
#[test]
fn rc_zero_length_read_with_rkey_0_and_va_0_succeeds() {
    zero_length_read("rkey 0, va 0", |_| 0, |_| 0);
}

#[test]
fn rc_zero_length_read_with_rkey_0_at_a_real_buffer_succeeds() {
    zero_length_read("rkey 0 at B's buffer", |b| b.mr.iova(), |_| 0);
}

#[test]
fn rc_zero_length_read_with_a_key_no_mr_has_succeeds() {
    zero_length_read(
        "a key no MR has",
        |_| 0x1234_5678_9abc_def0,
        |b| bogus_rkey(&b.mr),
    );
}

#[test]
fn rc_zero_length_read_past_the_end_of_an_mr_succeeds() {
    zero_length_read(
        "B's key past its MR",
        |b| b.mr.iova() + MR_LEN as u64 + 4096,
        |b| b.mr.rkey(),
    );
}

/// Zero-length READs with rkey 0 pipelined around a real one: all three
/// succeed in order, the real one's data intact.
#[test]
fn rc_zero_length_reads_pipelined_with_a_real_read_succeed() {
    let (a, b) = pair(QpType::Rc);
    b.mr.write_at(0, b"0123456789").unwrap();
    let read = |id, remote_addr, rkey, sges: &[rverbs::Sge]| {
        a.qp.post_send(&SendWr::new(id, WrOpcode::RdmaRead { remote_addr, rkey }, sges).signaled())
            .unwrap();
    };
    read(10, 0, 0, &[]);
    read(11, b.mr.iova(), b.mr.rkey(), &[sge(&a.mr, 200, 10)]);
    read(12, 0, 0, &[]);
    let wcs = wait(&a.cq, 3, "pipelined");
    assert_eq!(
        summary(&wcs),
        vec![
            (10, WcStatus::Success, WcOpcode::RdmaRead, 0),
            (11, WcStatus::Success, WcOpcode::RdmaRead, 10),
            (12, WcStatus::Success, WcOpcode::RdmaRead, 0),
        ]
    );
    let mut got = [0u8; 10];
    a.mr.read_at(200, &mut got).unwrap();
    assert_eq!(&got, b"0123456789");
    assert_alive(&a, &b, "after pipelined READs");
}

/// A READ of one byte with rkey 0 is still refused: REM_ACCESS_ERR at the
/// requester, QP_ACCESS_ERR and ERR at the responder.
#[test]
fn rc_one_byte_read_with_rkey_0_is_still_a_remote_access_error() {
    let (a, b) = pair(QpType::Rc);
    a.qp.post_send(
        &SendWr::new(
            1,
            WrOpcode::RdmaRead {
                remote_addr: 0,
                rkey: 0,
            },
            &[sge(&a.mr, 0, 1)],
        )
        .signaled(),
    )
    .unwrap();
    let wcs = wait(&a.cq, 1, "one-byte READ");
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::RemAccessErr));
    wait_event(&b.ctx, AsyncEventType::QpAccessErr, "responder");
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(b.qp.state(), QpState::Err);
}

/// Zero-length RDMA WRITEs with rkey 0 (VA 0 and B's buffer) and with a key
/// no MR has: SUCCESS, nothing written, no receive completion at B.
#[test]
fn rc_zero_length_write_with_any_rkey_succeeds() {
    let (a, b) = pair(QpType::Rc);
    let cases = [
        (0, 0),
        (b.mr.iova(), 0),
        (0xdead_beef_0000, bogus_rkey(&b.mr)),
    ];
    for (i, (remote_addr, rkey)) in cases.into_iter().enumerate() {
        a.qp.post_send(
            &SendWr::new(i as u64, WrOpcode::RdmaWrite { remote_addr, rkey }, &[]).signaled(),
        )
        .unwrap();
    }
    let wcs = wait(&a.cq, 3, "zero-length WRITEs");
    assert_eq!(
        summary(&wcs),
        (0..3)
            .map(|i| (i, WcStatus::Success, WcOpcode::RdmaWrite, 0))
            .collect::<Vec<_>>()
    );
    assert_quiet(&b.cq, "one-sided");
    let mut mem = vec![1u8; MR_LEN];
    b.mr.read_at(0, &mut mem).unwrap();
    assert!(mem.iter().all(|&x| x == 0), "a zero-length WRITE wrote");
    assert_alive(&a, &b, "after zero-length WRITEs");
}

/// Zero-length RDMA WRITEs with immediate and rkey 0 (and a bogus key):
/// each consumes a receive WR at B, which completes RECV_RDMA_WITH_IMM
/// with the immediate and byte_len 0.
#[test]
fn rc_zero_length_write_with_immediate_and_rkey_0_consumes_a_receive() {
    let (a, b) = pair(QpType::Rc);
    zero_length_write_imm(&a, &b);
    assert_alive(&a, &b, "after zero-length WRITEs with immediate");
}

/// Zero-length SENDs (no SGEs; with immediate; inline, empty): the
/// receive WRs complete with byte_len 0.
#[test]
fn rc_zero_length_send_completes_with_byte_len_0() {
    let (a, b) = pair(QpType::Rc);
    zero_length_sends(&a, &b);
    assert_alive(&a, &b, "after zero-length SENDs");
}

/// UC: zero-length RDMA WRITEs with rkey 0, WRITEs with immediate with
/// rkey 0 (a receive completion each), and zero-length SENDs arrive; the
/// QPs carry on.
#[test]
fn uc_zero_length_write_write_imm_and_send_with_rkey_0_arrive() {
    let (a, b) = pair(QpType::Uc);
    for (i, (remote_addr, rkey)) in [(0, 0), (b.mr.iova(), bogus_rkey(&b.mr))]
        .into_iter()
        .enumerate()
    {
        a.qp.post_send(
            &SendWr::new(i as u64, WrOpcode::RdmaWrite { remote_addr, rkey }, &[]).signaled(),
        )
        .unwrap();
    }
    let wcs = wait(&a.cq, 2, "UC zero-length WRITEs");
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert_quiet(&b.cq, "UC one-sided");
    zero_length_write_imm(&a, &b);
    zero_length_sends(&a, &b);
    assert_alive(&a, &b, "UC after zero-length requests");
}

/// Two zero-length WRITEs with immediate from `a` to `b`, rkey 0 / VA 0
/// and a bogus key: each takes one of `b`'s receive WRs.
fn zero_length_write_imm(a: &Side, b: &Side) {
    for id in [50, 51] {
        b.qp.post_recv(&RecvWr::new(id, &[sge(&b.mr, 0, 64)]))
            .unwrap();
    }
    let cases = [(0, 0, 0xabcd), (b.mr.iova(), bogus_rkey(&b.mr), 0x1234)];
    for (i, (remote_addr, rkey, imm)) in cases.into_iter().enumerate() {
        let op = WrOpcode::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        };
        a.qp.post_send(&SendWr::new(20 + i as u64, op, &[]).signaled())
            .unwrap();
    }
    let sent = wait(&a.cq, 2, "zero-length WRITEs with immediate");
    assert_eq!(
        summary(&sent),
        vec![
            (20, WcStatus::Success, WcOpcode::RdmaWrite, 0),
            (21, WcStatus::Success, WcOpcode::RdmaWrite, 0),
        ]
    );
    let recv = wait(&b.cq, 2, "receive completions");
    let got: Vec<_> = recv
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len, w.imm()))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                50,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                0,
                Some(0xabcd)
            ),
            (
                51,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                0,
                Some(0x1234)
            ),
        ]
    );
}

/// Zero-length SENDs from `a` to `b`: no SGEs, with immediate, and empty
/// inline data.
fn zero_length_sends(a: &Side, b: &Side) {
    for id in [60, 61, 62] {
        b.qp.post_recv(&RecvWr::new(id, &[sge(&b.mr, 0, 64)]))
            .unwrap();
    }
    a.qp.post_send(&SendWr::new(30, WrOpcode::Send, &[]).signaled())
        .unwrap();
    a.qp.post_send(&SendWr::new(31, WrOpcode::SendWithImm { imm: 77 }, &[]).signaled())
        .unwrap();
    a.qp.post_send(&SendWr::inline(32, WrOpcode::Send, &[]).signaled())
        .unwrap();
    let sent = wait(&a.cq, 3, "zero-length SENDs");
    assert_eq!(
        summary(&sent),
        (30..33)
            .map(|i| (i, WcStatus::Success, WcOpcode::Send, 0))
            .collect::<Vec<_>>()
    );
    let recv = wait(&b.cq, 3, "zero-length receives");
    let got: Vec<_> = recv
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len, w.imm()))
        .collect();
    assert_eq!(
        got,
        vec![
            (60, WcStatus::Success, WcOpcode::Recv, 0, None),
            (61, WcStatus::Success, WcOpcode::Recv, 0, Some(77)),
            (62, WcStatus::Success, WcOpcode::Recv, 0, None),
        ]
    );
}
