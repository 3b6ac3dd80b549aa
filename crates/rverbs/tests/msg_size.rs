//! The largest message (issue 14, item 10). IBTA's maximum message size is
//! 2^31 bytes, and the port reports it as `max_msg_sz`. A send WR whose
//! SGE lengths add up to more — each SGE length is a u32, so the sum can
//! pass 2^32 too, and must not wrap — is EINVAL at post, the error naming
//! the limit, with nothing queued and the QP still in RTS and working
//! (RC SEND, SEND with immediate, WRITE, WRITE with immediate and READ; UC
//! SEND and WRITE; UD SEND, which one packet already limits). A message of
//! exactly 2^31 bytes is accepted at post.
//!
//! Nothing here moves 2 GiB: the checks on SGEs against their MRs come
//! when the engine gathers, so the SGEs of a refused WR may repeat the same
//! small buffer, and an accepted 2^31-byte WR fails at its first packet.

use std::time::Duration;

use rverbs::{
    devices, AccessFlags, AddressHandle, AhAttr, CompletionQueue, Error, ErrorDetail, ErrorKind,
    MemoryRegion, Mtu, QpCaps, QpState, QpType, RecvWr, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode,
};

mod common;
use common::{sge, ud_to_rts, wait};

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

const MR_LEN: usize = 1 << 16;

/// IBTA's maximum message size.
const MAX_MSG: u64 = 1 << 31;

type Side = common::PairSide;

const CAPS: QpCaps = QpCaps {
    max_send_wr: 64,
    max_recv_wr: 64,
    max_send_sge: 4,
    max_recv_sge: 2,
    max_inline_data: 64,
};

/// A QP of type `ty` in its own context on `rverbs0`.
fn side(ty: QpType) -> Side {
    common::pair_side(ty, CAPS, MR_LEN, ALL)
}

/// Two connected QPs of type `ty` (RC or UC), each in its own context.
fn pair(ty: QpType) -> (Side, Side) {
    common::connected_pair(ty, CAPS, MR_LEN, ALL)
}

/// SGEs over the start of `mr` whose lengths add up to `total` (at most
/// 2^33): four of them, repeating the same bytes.
fn sges_of(mr: &MemoryRegion, total: u64) -> Vec<Sge> {
    let quarter = total / 4;
    let mut lens = [quarter; 4];
    lens[3] = total - 3 * quarter;
    lens.iter()
        .map(|&l| sge(mr, 0, u32::try_from(l).unwrap()))
        .collect()
}

/// The RC/UC operations that carry a message, toward `b`'s buffer.
fn ops(ty: QpType, b: &Side) -> Vec<(&'static str, WrOpcode)> {
    let remote_addr = b.mr.iova();
    let rkey = b.mr.rkey();
    let mut v = vec![
        ("SEND", WrOpcode::Send),
        ("SEND with immediate", WrOpcode::SendWithImm { imm: 7 }),
        ("WRITE", WrOpcode::RdmaWrite { remote_addr, rkey }),
        (
            "WRITE with immediate",
            WrOpcode::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm: 7,
            },
        ),
    ];
    if ty == QpType::Rc {
        v.push(("READ", WrOpcode::RdmaRead { remote_addr, rkey }));
    }
    v
}

/// `e` is the refusal of the WR at `index` for passing the maximum message
/// size: EINVAL, naming `max_msg_sz` and 2^31.
fn assert_too_long(e: &Error, index: usize, what: &str) {
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{what}: {e}");
    assert_eq!(e.errno(), nix::errno::Errno::EINVAL as i32, "{what}: {e}");
    assert_eq!(
        e.detail(),
        Some(ErrorDetail::BadWr { index }),
        "{what}: {e}"
    );
    assert!(
        e.message().contains("max_msg_sz") && e.message().contains(&MAX_MSG.to_string()),
        "{what}: the error names the limit: {e}"
    );
}

/// Nothing arrives on `cq` for a while.
fn assert_quiet(cq: &CompletionQueue, what: &str) {
    std::thread::sleep(Duration::from_millis(50));
    let mut wc = [WorkCompletion::default(); 4];
    let n = cq.poll(&mut wc).unwrap();
    assert_eq!(n, 0, "{what}: unexpected completions {:?}", &wc[..n]);
}

/// (wr_id, status, opcode, byte_len) of each completion.
fn summary(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus, WcOpcode, u32)> {
    wcs.iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect()
}

/// Both QPs are in RTS and a SEND from A still arrives at B intact.
fn assert_alive(a: &Side, b: &Side, what: &str) {
    assert_eq!(a.qp.state(), QpState::Rts, "{what}: requester");
    assert_eq!(b.qp.state(), QpState::Rts, "{what}: responder");
    a.mr.write_at(0, b"still alive").unwrap();
    b.qp.post_recv(&RecvWr::new(900, &[sge(&b.mr, 4096, 64)]))
        .unwrap();
    a.qp.post_send(&SendWr::new(800, WrOpcode::Send, &[sge(&a.mr, 0, 11)]).signaled())
        .unwrap();
    assert_eq!(
        summary(&wait(&a.cq, 1, what)),
        vec![(800, WcStatus::Success, WcOpcode::Send, 0)],
        "{what}: the QP carries on"
    );
    assert_eq!(
        summary(&wait(&b.cq, 1, what)),
        vec![(900, WcStatus::Success, WcOpcode::Recv, 11)],
        "{what}"
    );
    let mut got = [0u8; 11];
    b.mr.read_at(4096, &mut got).unwrap();
    assert_eq!(&got, b"still alive", "{what}");
}

#[test]
fn the_port_reports_max_msg_sz_2_pow_31() {
    let ctx = devices().unwrap()[0].open().unwrap();
    assert_eq!(u64::from(ctx.query_port(1).unwrap().max_msg_sz), MAX_MSG);
}

/// Every message operation of `ty` over SGEs adding up to `total` is
/// EINVAL at post; nothing is queued and the QPs carry on.
fn refused_at_post(ty: QpType, total: u64) {
    let (a, b) = pair(ty);
    let sges = sges_of(&a.mr, total);
    for (name, op) in ops(ty, &b) {
        let what = format!("{ty:?} {name} of {total} bytes");
        let e =
            a.qp.post_send(&SendWr::new(1, op, &sges).signaled())
                .unwrap_err();
        assert_too_long(&e, 0, &what);
        assert_quiet(&a.cq, &what);
        assert_quiet(&b.cq, &what);
        assert_alive(&a, &b, &what);
    }
}

#[test]
fn rc_messages_of_2_pow_31_plus_1_are_einval_at_post() {
    refused_at_post(QpType::Rc, MAX_MSG + 1);
}

#[test]
fn uc_messages_of_2_pow_31_plus_1_are_einval_at_post() {
    refused_at_post(QpType::Uc, MAX_MSG + 1);
}

/// Four SGEs of 2^32 - 1 bytes: a sum kept in 32 bits would wrap.
#[test]
fn rc_sge_lengths_past_2_pow_32_are_einval_at_post() {
    refused_at_post(QpType::Rc, 4 * u64::from(u32::MAX));
}

/// SGE lengths whose sum wraps a u32 to 16 bytes: still 2^32 + 16.
#[test]
fn sge_lengths_that_would_wrap_to_a_small_message_are_einval() {
    for ty in [QpType::Rc, QpType::Uc] {
        let (a, b) = pair(ty);
        let sges = [sge(&a.mr, 0, u32::MAX), sge(&a.mr, 0, 17)];
        for (name, op) in ops(ty, &b) {
            let what = format!("{ty:?} {name} of 2^32 + 16 bytes");
            let e =
                a.qp.post_send(&SendWr::new(1, op, &sges).signaled())
                    .unwrap_err();
            assert_too_long(&e, 0, &what);
            assert_quiet(&a.cq, &what);
        }
        assert_alive(&a, &b, &format!("{ty:?} after wrapping SGEs"));
    }
}

#[test]
fn ud_send_of_2_pow_31_plus_1_is_einval_at_post() {
    let (a, b) = (side(QpType::Ud), side(QpType::Ud));
    ud_to_rts(&a.qp, 0x1111);
    ud_to_rts(&b.qp, 0x1111);
    let ah: AddressHandle =
        a.pd.create_ah(&AhAttr {
            dgid: b.qp.local_gid(),
            ..AhAttr::default()
        })
        .unwrap();
    let sges = sges_of(&a.mr, MAX_MSG + 1);
    let e =
        a.qp.post_send(&SendWr::new(1, WrOpcode::Send, &sges).to(&ah, b.qp.qp_num(), 0x1111))
            .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert_eq!(e.detail(), Some(ErrorDetail::BadWr { index: 0 }), "{e}");
    assert_quiet(&a.cq, "UD");
    assert_eq!(a.qp.state(), QpState::Rts);
}

/// In a list, the WRs before the refused one are posted and those after
/// it not; with `post_send_all`, none.
#[test]
fn a_message_too_long_in_a_list_stops_the_list_there() {
    let (a, b) = pair(QpType::Rc);
    let long = sges_of(&a.mr, MAX_MSG + 1);
    let short = [sge(&a.mr, 0, 8)];
    let write = WrOpcode::RdmaWrite {
        remote_addr: b.mr.iova(),
        rkey: b.mr.rkey(),
    };
    let wrs = [
        SendWr::new(1, write, &short).signaled(),
        SendWr::new(2, write, &long).signaled(),
        SendWr::new(3, write, &short).signaled(),
    ];
    let e = a.qp.post_send_list(&wrs).unwrap_err();
    assert_too_long(&e, 1, "post_send_list");
    assert_eq!(
        summary(&wait(&a.cq, 1, "the WR before")),
        vec![(1, WcStatus::Success, WcOpcode::RdmaWrite, 0)]
    );
    assert_quiet(&a.cq, "nothing after the refused WR");
    let e = a.qp.post_send_all(&wrs).unwrap_err();
    assert_too_long(&e, 1, "post_send_all");
    assert_quiet(&a.cq, "post_send_all: none posted");
    assert_alive(&a, &b, "after the lists");
}

/// A message of exactly 2^31 bytes passes the post's checks (at a path
/// MTU of 512 or more: at 256 it would be 2^23 packets, past the PSN
/// space, which is EINVAL of its own). Its first SGE starts just past the
/// MR, so it fails once the engine gathers (or, for a READ, the responder
/// checks the R_Key or the requester scatters): an error completion, not a
/// refusal at post, and nothing like 2 GiB moves.
#[test]
fn messages_of_exactly_2_pow_31_are_accepted_at_post() {
    for (ty, count) in [(QpType::Rc, 5), (QpType::Uc, 4)] {
        for i in 0..count {
            let (a, b) = pair(ty);
            assert!(
                a.qp.path_mtu() >= Mtu::Mtu512,
                "path MTU {:?}",
                a.qp.path_mtu()
            );
            let (name, op) = ops(ty, &b)[i];
            let what = format!("{ty:?} {name} of 2^31 bytes");
            let mut sges = sges_of(&a.mr, MAX_MSG);
            for s in &mut sges {
                s.addr = a.mr.iova() + MR_LEN as u64;
            }
            a.qp.post_send(&SendWr::new(1, op, &sges).signaled())
                .unwrap_or_else(|e| panic!("{what}: refused at post: {e}"));
            let wc = wait(&a.cq, 1, &what);
            assert_eq!(wc[0].wr_id, 1, "{what}");
            assert_ne!(wc[0].status, WcStatus::Success, "{what}");
        }
    }
}
