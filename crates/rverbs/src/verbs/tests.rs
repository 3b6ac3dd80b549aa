//! Completion and async event delivery through the public handles. These
//! live inside the crate because, until queue pairs exist, only the engine's
//! own entry point (`CqCore::push`) can produce completions.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::wc::{WcStatus, WorkCompletion};
use crate::{devices, AsyncEventElement, AsyncEventType, CompletionQueue, Context, ErrorKind};

fn ctx() -> Context {
    devices().unwrap()[0].open().unwrap()
}

/// What the transport does when a work request completes.
fn complete(cq: &CompletionQueue, wr_id: u64) {
    let wc = WorkCompletion {
        wr_id,
        ..Default::default()
    };
    cq.core.push(wc, false).unwrap();
}

fn readable(fd: impl AsFd) -> bool {
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).unwrap() == 1
}

fn set_nonblocking(fd: impl AsFd) {
    let fl = OFlag::from_bits_truncate(fcntl(fd.as_fd(), FcntlArg::F_GETFL).unwrap());
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(fl | OFlag::O_NONBLOCK)).unwrap();
}

#[test]
fn channel_fd_delivers_an_armed_cqs_notification() {
    let ctx = ctx();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx
        .cq_builder()
        .cqe(16)
        .channel(&ch)
        .user_data(0xfeed)
        .build()
        .unwrap();
    complete(&cq, 1);
    assert!(!readable(&ch), "an unarmed CQ raises no event");
    cq.req_notify(false).unwrap();
    complete(&cq, 2);
    assert!(readable(&ch), "the channel fd polls readable");
    let ev = ch.get_cq_event().unwrap();
    assert!(ev.is_for(&cq));
    assert_eq!(ev.user_data(), 0xfeed);
    assert_eq!(ev.cq_handle(), cq.handle());
    assert_eq!(cq.comp_events(), (1, 0));
    drop(ev);
    assert_eq!(cq.comp_events(), (1, 1), "dropping the event acks it");
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(cq.poll(&mut wc).unwrap(), 2);
    assert_eq!((wc[0].wr_id, wc[1].wr_id), (1, 2));
}

#[test]
fn blocking_get_waits_for_the_event() {
    let ctx = ctx();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.cq_builder().cqe(4).channel(&ch).build().unwrap();
    cq.req_notify(false).unwrap();
    thread::scope(|s| {
        let waiter = s.spawn(|| ch.get_cq_event().map(|e| e.is_for(&cq)));
        thread::sleep(Duration::from_millis(30));
        complete(&cq, 1);
        assert!(waiter.join().unwrap().unwrap());
    });
}

/// A clone waits while another handle destroys the channel: the waiter
/// keeps waiting, a second destroy is refused, no CQ can be created on the
/// destroyed channel, and the context no longer counts it.
#[test]
fn a_clone_keeps_waiting_on_a_destroyed_channel() {
    let ctx = ctx();
    let ch = ctx.create_comp_channel().unwrap();
    let waiting = ch.clone();
    let waiter = thread::spawn(move || waiting.get_cq_event_timeout(Duration::from_millis(300)));
    thread::sleep(Duration::from_millis(50));
    let other = ch.clone();
    ch.destroy().unwrap();
    let again = other.clone().destroy().unwrap_err();
    assert_eq!(
        again.error().kind(),
        ErrorKind::InvalidArgument,
        "{}",
        again.error()
    );
    let err = ctx.cq_builder().cqe(4).channel(&other).build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert_eq!(ctx.resources().total(), 0, "{:?}", ctx.live_resources());
    assert!(
        matches!(waiter.join().unwrap(), Ok(None)),
        "timed out, no event"
    );
    drop(other);
    ctx.close().unwrap();
}

#[test]
fn nonblocking_fd_gives_would_block_timeout_and_try_give_none() {
    let ctx = ctx();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.cq_builder().cqe(4).channel(&ch).build().unwrap();
    assert!(ch.try_get_cq_event().unwrap().is_none());
    let t0 = Instant::now();
    assert!(ch
        .get_cq_event_timeout(Duration::from_millis(40))
        .unwrap()
        .is_none());
    assert!(t0.elapsed() >= Duration::from_millis(40));
    set_nonblocking(&ch);
    let err = ch.get_cq_event().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WouldBlock);
    assert_eq!(err.errno(), nix::errno::Errno::EAGAIN as i32);
    cq.req_notify(false).unwrap();
    complete(&cq, 1);
    // A non-blocking descriptor still delivers what is pending.
    assert!(ch.get_cq_event().unwrap().is_for(&cq));
}

#[test]
fn cq_with_unacked_event_cannot_be_destroyed_and_no_deadlock() {
    let ctx = ctx();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.cq_builder().cqe(4).channel(&ch).build().unwrap();
    cq.req_notify(false).unwrap();
    complete(&cq, 1);
    let ev = ch.get_cq_event().unwrap();
    let err = cq.destroy().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy);
    assert!(err.error().message().contains("not acknowledged"), "{err}");
    let cq = err.into_inner();
    ev.ack();
    cq.destroy().unwrap();
    assert_eq!(ch.cq_count(), 0);
    ch.destroy().unwrap();
}

#[test]
fn channel_refused_while_cqs_use_it_stays_usable() {
    let ctx = ctx();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.cq_builder().cqe(4).channel(&ch).build().unwrap();
    let err = ch.destroy().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy);
    assert_eq!(err.error().errno(), 16);
    let ch = err.into_inner();
    // Still delivers events.
    cq.req_notify(false).unwrap();
    complete(&cq, 7);
    assert!(ch.get_cq_event().unwrap().is_for(&cq));
    cq.destroy().unwrap();
    ch.destroy().unwrap();
}

#[test]
fn several_channels_steer_events_to_their_threads() {
    let ctx = ctx();
    let channels: Vec<_> = (0..3).map(|_| ctx.create_comp_channel().unwrap()).collect();
    let cqs: Vec<_> = channels
        .iter()
        .enumerate()
        .map(|(i, ch)| {
            ctx.cq_builder()
                .cqe(64)
                .channel(ch)
                .user_data(i as u64)
                .build()
                .unwrap()
        })
        .collect();
    const ROUNDS: u64 = 50;
    thread::scope(|s| {
        let handles: Vec<_> = channels
            .iter()
            .zip(&cqs)
            .enumerate()
            .map(|(i, (ch, cq))| {
                s.spawn(move || {
                    let mut seen = 0;
                    let mut wc = [WorkCompletion::default(); 8];
                    while seen < ROUNDS {
                        let ev = ch.get_cq_event().unwrap();
                        assert_eq!(ev.user_data(), i as u64, "event on the wrong channel");
                        cq.req_notify(false).unwrap();
                        // Empty the CQ: a thread the scheduler kept off its
                        // core finds more than `wc` holds, and no event
                        // comes for what was there before it re-armed.
                        loop {
                            let n = cq.poll(&mut wc).unwrap();
                            seen += n as u64;
                            if n < wc.len() {
                                break;
                            }
                        }
                    }
                    seen
                })
            })
            .collect();
        for cq in &cqs {
            cq.req_notify(false).unwrap();
        }
        for r in 0..ROUNDS {
            for cq in &cqs {
                complete(cq, r);
            }
            thread::sleep(Duration::from_micros(200));
        }
        for h in handles {
            assert_eq!(h.join().unwrap(), ROUNDS);
        }
    });
}

#[test]
fn cq_overrun_raises_cq_err_naming_the_cq() {
    let ctx = ctx();
    let cq = ctx.cq_builder().cqe(1).user_data(42).build().unwrap();
    complete(&cq, 1);
    assert!(cq.core.push(WorkCompletion::default(), false).is_err());
    assert!(readable(ctx.async_fd()));
    let ev = ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type(), AsyncEventType::CqErr);
    assert!(ev.is_for_cq(&cq));
    assert_eq!(
        ev.element(),
        AsyncEventElement::Cq {
            handle: cq.handle(),
            user_data: 42
        }
    );
    // Unacked async event: destroy refuses.
    let cq = cq.destroy().unwrap_err().into_inner();
    assert_eq!(cq.async_events(), (1, 0));
    drop(ev);
    assert_eq!(cq.async_events(), (1, 1));
    cq.destroy().unwrap();
}

#[test]
fn async_fd_nonblocking_and_events_of_destroyed_cqs_vanish() {
    let ctx = ctx();
    set_nonblocking(ctx.async_fd());
    assert_eq!(
        ctx.get_async_event().unwrap_err().kind(),
        ErrorKind::WouldBlock
    );
    let cq = ctx.create_cq(1).unwrap();
    complete(&cq, 1);
    let _ = cq.core.push(WorkCompletion::default(), false);
    assert!(readable(ctx.async_fd()));
    cq.destroy().unwrap();
    assert!(
        !readable(ctx.async_fd()),
        "the destroyed CQ's event is gone"
    );
    assert!(ctx.try_get_async_event().unwrap().is_none());
}

#[test]
fn solicited_only_arm_through_the_public_api() {
    let ctx = ctx();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.cq_builder().cqe(8).channel(&ch).build().unwrap();
    cq.req_notify(true).unwrap();
    complete(&cq, 1);
    assert!(ch.try_get_cq_event().unwrap().is_none());
    let failed = WorkCompletion {
        status: WcStatus::RemAccessErr,
        ..Default::default()
    };
    cq.core.push(failed, false).unwrap();
    assert!(ch.try_get_cq_event().unwrap().is_some());
}

#[test]
fn get_cq_event_races_destroy_safely() {
    // libibverbs forbids this with RDMAV_ALLOW_DISASSOC_DESTROY; here it is
    // merely pointless: it must not crash, hang or leak an unacked event.
    let ctx = ctx();
    let ch = Arc::new(ctx.create_comp_channel().unwrap());
    for _ in 0..50 {
        let cq = ctx.cq_builder().cqe(4).channel(&ch).build().unwrap();
        cq.req_notify(false).unwrap();
        complete(&cq, 1);
        let reader = {
            let ch = ch.clone();
            thread::spawn(move || {
                ch.get_cq_event_timeout(Duration::from_millis(50))
                    .map(|e| e.is_some())
            })
        };
        // The destroy must succeed once the reader is done: an event it
        // took and dropped was acknowledged, not leaked.
        let mut cq = Some(cq);
        for attempt in 0.. {
            let Some(c) = cq.take() else { break };
            assert!(
                attempt < 100_000,
                "CQ stays busy: an event was not acknowledged"
            );
            if let Err(e) = c.destroy() {
                cq = Some(e.into_inner());
                thread::yield_now();
            }
        }
        // Either the reader took the event (and acked it by dropping it), or
        // the destroy dropped it first; both are fine.
        reader.join().unwrap().unwrap();
    }
    assert_eq!(ch.cq_count(), 0);
    assert!(ch.as_raw_fd() >= 0);
}
