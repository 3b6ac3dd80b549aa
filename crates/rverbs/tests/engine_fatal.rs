//! A panic in a device's engine — on its engine thread, or in a progress
//! pass an application thread runs while it polls a CQ — fails the device
//! as a fatal NIC error does: every context gets `IBV_EVENT_DEVICE_FATAL`
//! on its async event descriptor, later verbs fail with EIO, polling keeps
//! working, nothing hangs and the process goes on. The panics are injected
//! (`rverbs::fault`, the test-only `fault-injection` feature).

mod common;

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use common::{connect_sides, pair_side_on, sge, PairSide};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use rverbs::fault::{arm_panic, PanicSite};
use rverbs::{
    AccessFlags, AsyncEventType, Device, DeviceConfig, ErrorKind, QpAttr, QpAttrMask, QpCaps,
    QpState, QpType, RecvWr, SendWr, WorkCompletion, WrOpcode,
};

const EIO: i32 = 5;

/// Two private devices with a connected RC pair across them: `a` on the
/// first (the one made to panic), `b` on the second.
fn pair(tag: &str) -> (Device, Device, PairSide, PairSide) {
    let da = rverbs::add_device(DeviceConfig::loopback().named(format!("{tag}-a"))).unwrap();
    let db = rverbs::add_device(DeviceConfig::loopback().named(format!("{tag}-b"))).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let caps = QpCaps {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let a = pair_side_on(&da, QpType::Rc, caps, 4096, access);
    let b = pair_side_on(&db, QpType::Rc, caps, 4096, access);
    connect_sides(&a, &b);
    (da, db, a, b)
}

/// Waits up to 10 s for the async event descriptor of `side` to poll
/// readable, then reads IBV_EVENT_DEVICE_FATAL from it.
fn expect_device_fatal(side: &PairSide, what: &str) {
    let fd = side.ctx.async_fd();
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    let ready = poll(&mut fds, PollTimeout::from(10_000u16)).unwrap();
    assert_eq!(
        ready, 1,
        "{what}: no async event within 10 s (the device died silently)"
    );
    let event = side
        .ctx
        .try_get_async_event()
        .unwrap()
        .expect("the descriptor was readable");
    assert_eq!(event.event_type(), AsyncEventType::DeviceFatal, "{what}");
}

/// After the device failed: EIO from post_send, post_recv, modify and the
/// create verbs; the QP reads as ERR; polling the CQ keeps answering.
fn expect_failed(dev: &Device, side: &PairSide, what: &str) {
    assert!(dev.has_failed(), "{what}: device did not fail");
    assert!(
        dev.is_disassociated(),
        "{what}: device still listed as alive"
    );
    assert!(
        rverbs::devices().unwrap().iter().all(|d| d != dev),
        "{what}: a failed device is still listed"
    );
    let data = [sge(&side.mr, 0, 8)];
    let send = SendWr::new(100, WrOpcode::Send, &data).signaled();
    let e = side.qp.post_send(&send).unwrap_err();
    assert_eq!((e.kind(), e.errno()), (ErrorKind::Io, EIO), "{what}: {e}");
    assert!(e.message().contains("failed"), "{what}: {e}");
    let e = side.qp.post_recv(&RecvWr::new(101, &data)).unwrap_err();
    assert_eq!(e.errno(), EIO, "{what}: {e}");
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    let e = side.qp.modify(&attr, QpAttrMask::STATE).unwrap_err();
    assert_eq!(e.errno(), EIO, "{what}: {e}");
    assert_eq!(side.ctx.create_cq(4).unwrap_err().errno(), EIO, "{what}");
    assert_eq!(side.ctx.alloc_pd().unwrap_err().errno(), EIO, "{what}");
    assert_eq!(side.qp.state(), QpState::Err, "{what}");
    // Polling keeps working (what was queued stays readable) and returns.
    let mut wc = [WorkCompletion::default(); 16];
    for _ in 0..100 {
        side.cq.poll(&mut wc).unwrap();
    }
}

/// The engine thread panics in the middle of a pass (the one that receives
/// the peer's SEND, nobody polling): the device fails.
#[test]
fn a_panic_on_the_engine_thread_fails_the_device() {
    let (da, _db, a, b) = pair("fatal-thread");
    for i in 0..4 {
        a.qp.post_recv(&RecvWr::new(i, &[sge(&a.mr, 0, 64)]))
            .unwrap();
    }
    arm_panic(&da, PanicSite::EngineThread);
    // Nobody polls a's CQ: a's engine thread receives the SEND.
    let data = [sge(&b.mr, 0, 8)];
    b.qp.post_send(&SendWr::new(1, WrOpcode::Send, &data).signaled())
        .unwrap();
    expect_device_fatal(&a, "engine thread panic");
    expect_failed(&da, &a, "engine thread panic");
}

/// A pass run on the application thread that busy-polls a's CQ panics: the
/// poll returns, the device fails, the thread goes on.
#[test]
fn a_panic_in_a_pass_on_a_polling_thread_fails_the_device() {
    let (da, _db, a, b) = pair("fatal-poller");
    const SENDS: u64 = 16;
    for i in 0..SENDS {
        a.qp.post_recv(&RecvWr::new(i, &[sge(&a.mr, 0, 64)]))
            .unwrap();
    }
    arm_panic(&da, PanicSite::PollingThread);
    let data = [sge(&b.mr, 0, 8)];
    let mut wc = [WorkCompletion::default(); 16];
    let deadline = Instant::now() + Duration::from_secs(20);
    // Each SEND is received by whichever thread gets to it first; one the
    // polling thread receives is the one that panics. The SENDs come from
    // another thread while this one busy-polls (the engine thread then
    // leaves the device's packets to it): posted from this thread between
    // polls, a same-host ring's doorbell woke the sleeping engine thread,
    // which took each SEND before the poll began.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let sent = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::SeqCst)
                && sent.load(std::sync::atomic::Ordering::SeqCst) < SENDS
            {
                std::thread::sleep(Duration::from_millis(20));
                let n = sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if b.qp
                    .post_send(&SendWr::new(n, WrOpcode::Send, &data))
                    .is_err()
                {
                    return;
                }
            }
        });
        while !da.has_failed() {
            let n = sent.load(std::sync::atomic::Ordering::SeqCst);
            if n >= SENDS || Instant::now() >= deadline {
                // Let the last SEND arrive before giving up.
                std::thread::sleep(Duration::from_millis(200));
                let _ = a.cq.poll(&mut wc);
                if da.has_failed() {
                    break;
                }
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
                panic!("{n} SENDs received and no panic on the polling thread");
            }
            let _ = a.cq.poll(&mut wc);
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    expect_device_fatal(&a, "polling thread panic");
    expect_failed(&da, &a, "polling thread panic");
}

/// The transmit a post_send runs on the caller's thread panics: the post
/// fails with EIO and the device fails.
#[test]
fn a_panic_in_a_post_fails_the_device() {
    let (da, _db, a, b) = pair("fatal-post");
    b.qp.post_recv(&RecvWr::new(1, &[sge(&b.mr, 0, 64)]))
        .unwrap();
    arm_panic(&da, PanicSite::Post);
    let data = [sge(&a.mr, 0, 8)];
    let e =
        a.qp.post_send(&SendWr::new(1, WrOpcode::Send, &data).signaled())
            .unwrap_err();
    assert_eq!(e.errno(), EIO, "{e}");
    expect_device_fatal(&a, "post panic");
    expect_failed(&da, &a, "post panic");
}

/// Every context of a failed device hears of it, and a completion channel
/// reader blocked on it wakes with EIO, as on disassociation.
#[test]
fn every_context_and_channel_reader_hears_of_a_failure() {
    let (da, _db, a, b) = pair("fatal-contexts");
    let other = da.open().unwrap();
    let channel = a.ctx.create_comp_channel().unwrap();
    let reader = std::thread::spawn(move || channel.get_cq_event().map(|_| ()));
    a.qp.post_recv(&RecvWr::new(1, &[sge(&a.mr, 0, 64)]))
        .unwrap();
    arm_panic(&da, PanicSite::EngineThread);
    let data = [sge(&b.mr, 0, 8)];
    b.qp.post_send(&SendWr::new(1, WrOpcode::Send, &data))
        .unwrap();
    expect_device_fatal(&a, "first context");
    let ev = other
        .get_async_event_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("DEVICE_FATAL on the second context");
    assert_eq!(ev.event_type(), AsyncEventType::DeviceFatal);
    drop(ev);
    let woke = reader.join().unwrap();
    assert_eq!(woke.unwrap_err().errno(), EIO);
    assert_eq!(da.open().unwrap_err().kind(), ErrorKind::NoDevice);
}
