//! A poller that parks must not stall a program that has work of its own
//! in its poll loop (libfabric's rxm retries sends held back for credits
//! only after the CQ poll returns: parked, its ping-pong took 6 ms a round
//! trip instead of tens of microseconds). A park that ran out its time,
//! followed by a post instead of another poll of that CQ, turns parking
//! off for the process, counted in `poll_park_stalls`; a park followed by
//! another poll of the CQ (a server waiting for requests) does not, and a
//! poll of another CQ in between (a loop polling its receive and send CQs
//! in turn) does not hide the stall.
//!
//! Its own test binary: whether pollers park is the process's setting.

mod common;

use std::time::{Duration, Instant};

use rverbs::{AccessFlags, QpAttr, QpAttrMask, QpCaps, QpState, QpType, RecvWr, WorkCompletion};

/// Polls the (empty) CQ back to back for `how_long`: long enough for the
/// poller to spend its spin budget and park until its time runs out.
fn poll_tightly(cq: &rverbs::CompletionQueue, how_long: Duration) {
    let end = Instant::now() + how_long;
    let mut wc = [WorkCompletion::default(); 4];
    while Instant::now() < end {
        assert_eq!(cq.poll(&mut wc).unwrap(), 0, "the CQ got a completion");
    }
}

#[test]
fn a_park_that_stalls_the_program_turns_parking_off() {
    // Whether pollers park is read once per process: the default here.
    std::env::remove_var("RVERBS_POLL_PARK");
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let side = common::pair_side(QpType::Rc, caps, 4096, AccessFlags::LOCAL_WRITE);
    let init = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        ..QpAttr::default()
    };
    let mask =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    side.qp.modify(&init, mask).expect("INIT");
    let dev = side.ctx.device();
    let stalls = || dev.net_stats().poll_park_stalls;
    let mut wr_id = 0;
    let mut post = || {
        wr_id += 1;
        side.qp
            .post_recv(&RecvWr::new(wr_id, &[common::sge(&side.mr, 0, 64)]))
            .expect("post_recv");
    };
    assert_eq!(stalls(), 0);

    // A server waiting for requests: its parks run out, it polls again
    // (after a pause, so this poll does not park), then posts.
    poll_tightly(&side.cq, Duration::from_millis(40));
    std::thread::sleep(Duration::from_millis(2));
    let mut wc = [WorkCompletion::default(); 1];
    assert_eq!(side.cq.poll(&mut wc).unwrap(), 0);
    post();
    assert_eq!(stalls(), 0, "a park followed by a poll counted as a stall");

    // A program whose loop had its own work: after the poll of its receive
    // CQ that parked returns, it polls its (empty) send CQ once and posts.
    let send_cq = side.ctx.create_cq(4).unwrap();
    poll_tightly(&side.cq, Duration::from_millis(40));
    std::thread::sleep(Duration::from_millis(1));
    assert_eq!(send_cq.poll(&mut wc).unwrap(), 0);
    post();
    assert_eq!(stalls(), 1, "a park followed by a post was not noticed");

    // Parking is off: the same loop no longer parks, so nothing stalls.
    poll_tightly(&side.cq, Duration::from_millis(40));
    post();
    assert_eq!(stalls(), 1, "pollers still park after a stall");
}
