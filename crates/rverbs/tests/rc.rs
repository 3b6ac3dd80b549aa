//! RC queue pairs over real UDP sockets, within one process: two contexts
//! on one device, and two devices on different loopback addresses.

use std::time::{Duration, Instant};

use rverbs::cm::{ConnectOptions, Endpoint};
use rverbs::{
    devices, AccessFlags, CompletionQueue, Context, DeviceConfig, MemoryRegion, QpCaps, QueuePair,
    RecvWr, SendWr, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

mod common;
use common::sge;
use common::ALL;

struct Side {
    ctx: Context,
    _pd: rverbs::ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn side(ctx: Context, mr_len: usize) -> Side {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024).unwrap();
    let qp = pd
        .qp_builder(&cq, &cq)
        .caps(QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        })
        .build()
        .unwrap();
    let mr = pd.alloc_mr(mr_len, ALL).unwrap();
    Side {
        ctx,
        _pd: pd,
        cq,
        qp,
        mr,
    }
}

fn connect(a: &Side, b: &Side) {
    let ea = Endpoint::for_qp(&a.qp).with_buffer(&a.mr);
    let eb = Endpoint::for_qp(&b.qp).with_buffer(&b.mr);
    let opts = ConnectOptions {
        timeout: 10,
        ..ConnectOptions::default()
    };
    a.qp.connect(ea.psn, &eb, &opts).unwrap();
    b.qp.connect(eb.psn, &ea, &opts).unwrap();
}

fn pair_on_one_device() -> (Side, Side) {
    let dev = &devices().unwrap()[0];
    let a = side(dev.open().unwrap(), 1 << 20);
    let b = side(dev.open().unwrap(), 1 << 20);
    connect(&a, &b);
    (a, b)
}

/// Polls until `n` completions arrived (or 10 s passed).
fn wait(cq: &CompletionQueue, n: usize) -> Vec<WorkCompletion> {
    wait_long(cq, n, Duration::from_secs(10))
}

/// Polls until `n` completions arrived (or `limit` passed).
fn wait_long(cq: &CompletionQueue, n: usize, limit: Duration) -> Vec<WorkCompletion> {
    common::wait_n(cq, n, limit, "completions")
}

#[test]
fn send_and_receive_between_two_contexts() {
    let (a, b) = pair_on_one_device();
    assert_ne!(a.qp.qp_num(), b.qp.qp_num());
    b.qp.post_recv(&RecvWr::new(7, &[sge(&b.mr, 0, 8192)]))
        .unwrap();
    b.qp.post_recv(&RecvWr::new(8, &[sge(&b.mr, 8192, 64)]))
        .unwrap();
    let msg: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    a.mr.write_at(0, &msg).unwrap();
    a.qp.post_send(&SendWr::new(1, WrOpcode::Send, &[sge(&a.mr, 0, 5000)]).signaled())
        .unwrap();
    a.qp.post_send(
        &SendWr::inline(2, WrOpcode::SendWithImm { imm: 0xfeed }, b"inline!")
            .signaled()
            .solicited(),
    )
    .unwrap();
    let sent = wait(&a.cq, 2);
    assert!(
        sent.iter()
            .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::Send),
        "{sent:?}"
    );
    let recv = wait(&b.cq, 2);
    assert_eq!(
        (recv[0].wr_id, recv[0].byte_len, recv[0].opcode),
        (7, 5000, WcOpcode::Recv)
    );
    assert_eq!(
        (recv[1].wr_id, recv[1].byte_len, recv[1].imm()),
        (8, 7, Some(0xfeed))
    );
    assert_eq!(recv[0].qp_num, b.qp.qp_num());
    assert_eq!(recv[0].src_qp, a.qp.qp_num());
    let mut got = vec![0u8; 5000];
    b.mr.read_at(0, &mut got).unwrap();
    assert_eq!(got, msg);
    let mut got = [0u8; 7];
    b.mr.read_at(8192, &mut got).unwrap();
    assert_eq!(&got, b"inline!");
}

#[test]
fn rdma_write_read_and_atomics() {
    let (a, b) = pair_on_one_device();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    a.mr.write_at(0, &data).unwrap();
    // WRITE 100 kB into B, READ it back into A at 200 kB.
    a.qp.post_send(
        &SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.iova() + 4096,
                rkey: b.mr.rkey(),
            },
            &[sge(&a.mr, 0, 100_000)],
        )
        .signaled(),
    )
    .unwrap();
    a.qp.post_send(
        &SendWr::new(
            2,
            WrOpcode::RdmaRead {
                remote_addr: b.mr.iova() + 4096,
                rkey: b.mr.rkey(),
            },
            &[sge(&a.mr, 200_000, 100_000)],
        )
        .signaled(),
    )
    .unwrap();
    // Atomics on a counter in B.
    b.mr.write_at(512 * 1024, &41u64.to_ne_bytes()).unwrap();
    let counter = b.mr.iova() + 512 * 1024;
    a.qp.post_send(
        &SendWr::new(
            3,
            WrOpcode::AtomicFetchAndAdd {
                remote_addr: counter,
                rkey: b.mr.rkey(),
                add: 1,
            },
            &[sge(&a.mr, 400_000, 8)],
        )
        .signaled(),
    )
    .unwrap();
    a.qp.post_send(
        &SendWr::new(
            4,
            WrOpcode::AtomicCmpAndSwp {
                remote_addr: counter,
                rkey: b.mr.rkey(),
                compare: 42,
                swap: 1000,
            },
            &[sge(&a.mr, 400_008, 8)],
        )
        .signaled(),
    )
    .unwrap();
    let wcs = wait(&a.cq, 4);
    let got: Vec<(u64, WcStatus, WcOpcode, u32)> = wcs
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaWrite, 0),
            (2, WcStatus::Success, WcOpcode::RdmaRead, 100_000),
            (3, WcStatus::Success, WcOpcode::FetchAdd, 8),
            (4, WcStatus::Success, WcOpcode::CompSwap, 8),
        ]
    );
    let mut back = vec![0u8; 100_000];
    b.mr.read_at(4096, &mut back).unwrap();
    assert_eq!(back, data, "written");
    a.mr.read_at(200_000, &mut back).unwrap();
    assert_eq!(back, data, "read back");
    let mut v = [0u8; 8];
    a.mr.read_at(400_000, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 41);
    a.mr.read_at(400_008, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 42);
    b.mr.read_at(512 * 1024, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 1000);
    assert!(
        b.cq.poll(&mut [WorkCompletion::default(); 4]).unwrap() == 0,
        "one-sided: no receive completions"
    );
}

#[test]
fn atomic_write_lands_eight_bytes_and_completes_as_atomic_write() {
    let (a, b) = pair_on_one_device();
    let word = b.mr.iova() + 4096;
    let value = 0x0102_0304_0506_0708u64.to_ne_bytes();
    let op = WrOpcode::AtomicWrite {
        remote_addr: word,
        rkey: b.mr.rkey(),
        value,
    };
    // The value is in the opcode: a payload is a misuse (EINVAL).
    let err =
        a.qp.post_send(&SendWr::new(1, op, &[sge(&a.mr, 0, 8)]))
            .unwrap_err();
    assert_eq!(err.kind(), rverbs::ErrorKind::InvalidArgument, "{err}");
    a.qp.post_send(&SendWr::new(2, op, &[]).signaled()).unwrap();
    let wcs = wait(&a.cq, 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status, wcs[0].opcode, wcs[0].byte_len),
        (2, WcStatus::Success, WcOpcode::AtomicWrite, 8)
    );
    let mut got = [0u8; 16];
    b.mr.read_at(4096, &mut got).unwrap();
    assert_eq!(got[..8], value);
    assert_eq!(got[8..], [0; 8], "eight bytes, no more");
    assert!(
        b.cq.poll(&mut [WorkCompletion::default(); 4]).unwrap() == 0,
        "one-sided: no receive completion"
    );
    // Misaligned: the responder refuses it as an invalid request (rxe).
    a.qp.post_send(
        &SendWr::new(
            3,
            WrOpcode::AtomicWrite {
                remote_addr: word + 12,
                rkey: b.mr.rkey(),
                value,
            },
            &[],
        )
        .signaled(),
    )
    .unwrap();
    let wcs = wait(&a.cq, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (3, WcStatus::RemInvReqErr));
    b.mr.read_at(4096 + 8, &mut got).unwrap();
    assert_eq!(got, [0; 16], "nothing stored");
}

#[test]
fn atomic_write_needs_remote_write_not_remote_atomic() {
    let (a, b) = pair_on_one_device();
    let mr = b
        ._pd
        .alloc_mr(
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    a.qp.post_send(
        &SendWr::new(
            1,
            WrOpcode::AtomicWrite {
                remote_addr: mr.iova(),
                rkey: mr.rkey(),
                value: [0xee; 8],
            },
            &[],
        )
        .signaled(),
    )
    .unwrap();
    let wcs = wait(&a.cq, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::RemAccessErr));
    let mut got = [1u8; 8];
    mr.read_at(0, &mut got).unwrap();
    assert_eq!(got, [0; 8], "nothing stored");
}

#[test]
fn two_devices_on_two_loopback_addresses() {
    let second = rverbs::add_device(DeviceConfig::loopback().named("rc-second")).unwrap();
    let first = &devices().unwrap()[0];
    assert_ne!(first.addr(), second.addr());
    let a = side(first.open().unwrap(), 1 << 16);
    let b = side(second.open().unwrap(), 1 << 16);
    connect(&a, &b);
    b.qp.post_recv(&RecvWr::new(1, &[sge(&b.mr, 0, 1024)]))
        .unwrap();
    a.mr.write_at(0, b"across devices").unwrap();
    a.qp.post_send(&SendWr::new(9, WrOpcode::Send, &[sge(&a.mr, 0, 14)]).signaled())
        .unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(wait(&b.cq, 1)[0].byte_len, 14);
    let stats = second.net_stats();
    assert!(stats.rx_packets >= 1 && stats.tx_packets >= 1, "{stats:?}");
    assert_eq!(stats.rx_icrc_errors, 0);
    drop((a, b));
    second.disassociate();
}

#[test]
fn remote_access_error_moves_both_to_error_and_flushes() {
    let (a, b) = pair_on_one_device();
    let dev = &devices().unwrap()[0];
    let fatal_naks = dev.net_stats().fatal_naks_sent;
    b.qp.post_recv(&RecvWr::new(50, &[sge(&b.mr, 0, 64)]))
        .unwrap();
    a.qp.post_send(
        &SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.iova(),
                rkey: b.mr.rkey() ^ 0x40,
            },
            &[sge(&a.mr, 0, 64)],
        )
        .signaled(),
    )
    .unwrap();
    a.qp.post_send(&SendWr::new(2, WrOpcode::Send, &[sge(&a.mr, 0, 8)]))
        .unwrap();
    let wcs = wait(&a.cq, 2);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::RemAccessErr));
    assert_eq!(
        (wcs[1].wr_id, wcs[1].status),
        (2, WcStatus::WrFlushErr),
        "unsignaled WRs flush too"
    );
    assert_eq!(a.qp.state(), rverbs::QpState::Err);
    // The device counts the refusal (other tests share it: at least one).
    assert!(dev.net_stats().fatal_naks_sent > fatal_naks);
    // The responder: QP_ACCESS_ERR, its receive WR flushed.
    let flushed = wait(&b.cq, 1);
    assert_eq!(
        (flushed[0].wr_id, flushed[0].status),
        (50, WcStatus::WrFlushErr)
    );
    let ev = b
        .ctx
        .get_async_event_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("an async event");
    assert_eq!(ev.event_type(), rverbs::AsyncEventType::QpAccessErr);
    assert!(ev.is_for_qp(&b.qp));
    drop(ev);
    // Posting to a QP in ERR completes at once with a flush error.
    a.qp.post_send(&SendWr::new(3, WrOpcode::Send, &[sge(&a.mr, 0, 8)]).signaled())
        .unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::WrFlushErr);
}

/// A pseudo-random byte pattern (xorshift), different per `seed`.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn sixty_four_mib_write_and_read_byte_for_byte() {
    const LEN: usize = 64 << 20;
    let dev = &devices().unwrap()[0];
    let a = side(dev.open().unwrap(), 2 * LEN);
    let b = side(dev.open().unwrap(), LEN);
    connect(&a, &b);
    let data = pattern(LEN, 64);
    a.mr.write_at(0, &data).unwrap();
    let remote = WrOpcode::RdmaWrite {
        remote_addr: b.mr.iova(),
        rkey: b.mr.rkey(),
    };
    a.qp.post_send(&SendWr::new(1, remote, &[sge(&a.mr, 0, LEN as u32)]).signaled())
        .unwrap();
    let read = WrOpcode::RdmaRead {
        remote_addr: b.mr.iova(),
        rkey: b.mr.rkey(),
    };
    a.qp.post_send(&SendWr::new(2, read, &[sge(&a.mr, LEN as u64, LEN as u32)]).signaled())
        .unwrap();
    let wcs = wait_long(&a.cq, 2, Duration::from_secs(120));
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, 0),
            (2, WcStatus::Success, LEN as u32)
        ]
    );
    let mut got = vec![0u8; LEN];
    b.mr.read_at(0, &mut got).unwrap();
    assert!(got == data, "the WRITE landed intact");
    got.fill(0);
    a.mr.read_at(LEN, &mut got).unwrap();
    assert!(got == data, "the READ came back intact");
}

#[test]
fn several_threads_post_on_one_qp() {
    const THREADS: u64 = 4;
    const PER_THREAD: u64 = 1500;
    const MSG: usize = 24;
    let dev = &devices().unwrap()[0];
    let a = side(dev.open().unwrap(), 1 << 20);
    let b = side(dev.open().unwrap(), 1 << 20);
    connect(&a, &b);
    let total = THREADS * PER_THREAD;
    // Send completions, whichever thread polls them; all must succeed.
    let completed = std::sync::atomic::AtomicU64::new(0);
    let drain = || {
        let mut wc = [WorkCompletion::default(); 32];
        let n = a.cq.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
        }
        completed.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    };
    let got = std::thread::scope(|s| {
        // B keeps receive WRs posted: each lands in its own slot.
        let receiver = s.spawn(|| {
            let mut posted = 0u64;
            let mut got = Vec::new();
            let mut wc = [WorkCompletion::default(); 64];
            let deadline = Instant::now() + Duration::from_secs(60);
            while (got.len() as u64) < total {
                assert!(
                    Instant::now() < deadline,
                    "{} of {total} received",
                    got.len()
                );
                while posted < total && posted - (got.len() as u64) < 200 {
                    let slot = posted % 4096;
                    b.qp.post_recv(&RecvWr::new(slot, &[sge(&b.mr, slot * 64, 64)]))
                        .unwrap();
                    posted += 1;
                }
                let n = b.cq.poll(&mut wc).unwrap();
                for w in &wc[..n] {
                    assert_eq!((w.status, w.byte_len as usize), (WcStatus::Success, MSG));
                    let mut m = [0u8; MSG];
                    b.mr.read_at(w.wr_id as usize * 64, &mut m).unwrap();
                    got.push(m);
                }
            }
            got
        });
        // Senders: each thread posts its own numbered messages on the one
        // QP; the send queue (256) is shared, so ENOMEM means "poll, retry".
        for t in 0..THREADS {
            let (a, drain) = (&a, &drain);
            s.spawn(move || {
                for i in 0..PER_THREAD {
                    let mut m = [0u8; MSG];
                    m[..8].copy_from_slice(&t.to_le_bytes());
                    m[8..16].copy_from_slice(&i.to_le_bytes());
                    m[16..].copy_from_slice(&(t * 1_000_003 + i).to_le_bytes());
                    let wr = SendWr::inline(t << 32 | i, WrOpcode::Send, &m).signaled();
                    loop {
                        match a.qp.post_send(&wr) {
                            Ok(()) => break,
                            Err(e) if e.errno() == nix::libc::ENOMEM => drain(),
                            Err(e) => panic!("post_send: {e}"),
                        }
                    }
                    drain();
                }
            });
        }
        receiver.join().unwrap()
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while completed.load(std::sync::atomic::Ordering::Relaxed) < total {
        assert!(Instant::now() < deadline, "send completions missing");
        drain();
    }
    // Every message arrived once, intact, and each thread's in its order.
    let mut next = [0u64; THREADS as usize];
    for m in &got {
        let t = u64::from_le_bytes(m[..8].try_into().unwrap());
        let i = u64::from_le_bytes(m[8..16].try_into().unwrap());
        let check = u64::from_le_bytes(m[16..].try_into().unwrap());
        assert_eq!(check, t * 1_000_003 + i, "intact");
        assert_eq!(
            i, next[t as usize],
            "thread {t}'s messages in order, once each"
        );
        next[t as usize] += 1;
    }
    assert_eq!(next, [PER_THREAD; THREADS as usize]);
}

/// An event-driven requester (poll until empty, post, arm, sleep) whose
/// first packet is lost must still retransmit: the engine thread may not
/// keep sleeping on a deadline from before the post. Found in review.
#[test]
fn a_lost_packet_after_a_busy_poll_is_retransmitted_while_the_app_sleeps() {
    let da = rverbs::add_device(DeviceConfig::loopback().named("wake-a")).unwrap();
    let db = rverbs::add_device(DeviceConfig::loopback().named("wake-b")).unwrap();
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let ca = da.open().unwrap();
    let pa = ca.alloc_pd().unwrap();
    let channel = ca.create_comp_channel().unwrap();
    let cqa = ca.cq_builder().cqe(16).channel(&channel).build().unwrap();
    let qa = pa.qp_builder(&cqa, &cqa).build().unwrap();
    let ma = pa.alloc_mr(4096, all).unwrap();
    let cb = db.open().unwrap();
    let pb = cb.alloc_pd().unwrap();
    let cqb = cb.create_cq(16).unwrap();
    let qb = pb.qp_builder(&cqb, &cqb).build().unwrap(); // in RESET: drops what comes
    let mb = pb.alloc_mr(4096, all).unwrap();
    let (ea, eb) = (Endpoint::for_qp(&qa), Endpoint::for_qp(&qb));
    let opts = ConnectOptions {
        timeout: 14,
        ..ConnectOptions::default()
    };
    qa.connect(ea.psn, &eb, &opts).unwrap();
    // A's engine thread goes to sleep with no timer.
    std::thread::sleep(Duration::from_millis(50));
    let mut wc = [WorkCompletion::default(); 1];
    assert_eq!(
        cqa.poll(&mut wc).unwrap(),
        0,
        "one empty poll: a busy poller"
    );
    qa.post_send(&SendWr::new(1, WrOpcode::Send, &[sge(&ma, 0, 8)]).signaled())
        .unwrap();
    cqa.req_notify(false).unwrap();
    // B drops the first transmission, then comes up.
    std::thread::sleep(Duration::from_millis(20));
    qb.connect(eb.psn, &ea, &opts).unwrap();
    qb.post_recv(&RecvWr::new(9, &[sge(&mb, 0, 64)])).unwrap();
    let event = channel
        .get_cq_event_timeout(Duration::from_secs(5))
        .unwrap();
    assert!(event.is_some(), "hang: {:?}", da.net_stats());
    drop(event);
    assert_eq!(cqa.poll(&mut wc).unwrap(), 1);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert!(da.net_stats().retransmitted >= 1, "{:?}", da.net_stats());
    drop((qa, qb, cqa, cqb, channel));
    da.disassociate();
    db.disassociate();
}
