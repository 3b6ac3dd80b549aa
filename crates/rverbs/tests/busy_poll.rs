//! RC between busy-polling peers, on a lossless loopback: nothing may be
//! resent and no QP may run out of retries — with the cores free, and with
//! as many threads spinning beside them as there are cores.
//!
//! The workloads are what RDMA programs do: a SEND ping-pong where each
//! side keeps one signaled SEND outstanding and spins on `poll` until it
//! completed and the peer's SEND arrived (the program that once ended in
//! RETRY_EXC_ERR); 64 KiB RDMA READs one at a time (which once resent
//! nearly one packet per READ); and a stream of 64 KiB RDMA WRITEs. The
//! passive side spins on its CQ meanwhile, as a benchmark's server does.
//!
//! And an RC pair on one device whose engine is stalled (the test-only
//! `rverbs::fault::arm_stall`) just past the retransmission floor after a
//! SEND: the ACK its own engine owes is found before the timer runs.
//!
//! The tests take turns (`ONE_AT_A_TIME`): the load beside each is what it
//! says — its own two pollers, and its hogs — not the other tests' too. A
//! resend is excused only if the host itself kept a woken thread waiting
//! longer than the retransmission timer's floor meanwhile
//! (`common::stall`); an error never is.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use rverbs::cm::{ConnectOptions, Endpoint};
use rverbs::{
    AccessFlags, CompletionQueue, Context, Device, DeviceConfig, MemoryRegion, ProtectionDomain,
    QpCaps, QueuePair, RecvWr, SendWr, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

mod common;
use common::sge;
use common::stall::StallWatch;

/// Bytes of each READ or WRITE.
const BIG: usize = 64 << 10;
/// Longest any workload may take before it counts as stalled.
const STALL_LIMIT: Duration = Duration::from_secs(60);

struct Side {
    dev: Device,
    _ctx: Context,
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn side(name: String) -> Side {
    side_on(rverbs::add_device(DeviceConfig::loopback().named(name)).unwrap())
}

fn side_on(dev: Device) -> Side {
    let ctx = dev.open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).unwrap();
    let qp = pd
        .qp_builder(&cq, &cq)
        .caps(QpCaps {
            max_send_wr: 16,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        })
        .build()
        .unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let mr = pd.alloc_mr(2 * BIG, access).unwrap();
    Side {
        dev,
        _ctx: ctx,
        _pd: pd,
        cq,
        qp,
        mr,
    }
}

/// Two connected QPs on two devices, as the failing programs set them up:
/// timeout 12 (16.8 ms), retry_cnt 7.
fn pair(tag: &str) -> (Side, Side) {
    let a = side(format!("bp-{tag}-a"));
    let b = side(format!("bp-{tag}-b"));
    connect(&a, &b, 12);
    (a, b)
}

/// Connects `a` and `b` with local ACK timeout `timeout` and retry_cnt 7.
fn connect(a: &Side, b: &Side, timeout: u8) {
    let ea = Endpoint::for_qp(&a.qp);
    let eb = Endpoint::for_qp(&b.qp);
    let opts = ConnectOptions {
        timeout,
        retry_cnt: 7,
        ..ConnectOptions::default()
    };
    a.qp.connect(ea.psn, &eb, &opts).unwrap();
    b.qp.connect(eb.psn, &ea, &opts).unwrap();
}

/// What one side saw.
#[derive(Debug, Default)]
struct Run {
    /// Rounds done.
    done: usize,
    /// The slowest round.
    slowest: Duration,
    /// A completion that was not a success, if any.
    error: Option<WorkCompletion>,
    /// Times two polls were 10 ms or more apart: the host kept this
    /// runnable thread off the cores (a poll sleeps 1 ms at most); once
    /// per whole 10 ms.
    stalls: u64,
    /// When the last poll began.
    last_poll: Option<Instant>,
}

impl Run {
    /// Notes a poll about to begin.
    fn polling(&mut self) {
        let now = Instant::now();
        if let Some(t) = self.last_poll {
            self.stalls += common::stall::floors(now.duration_since(t));
        }
        self.last_poll = Some(now);
    }

    /// Counts `c`; false if it failed (the run then stops).
    fn check(&mut self, c: &WorkCompletion) -> bool {
        if c.status != WcStatus::Success {
            self.error = Some(*c);
            return false;
        }
        true
    }
}

/// `rounds` rounds of: post a signaled 8-byte SEND, then spin on `poll`
/// until it completed and one SEND of the peer arrived (its receive WR is
/// posted again at once).
fn ping_pong(s: &Side, rounds: usize, start: &Barrier) -> Run {
    let recv_sg = [sge(&s.mr, BIG as u64, 64)];
    let recv = |id| RecvWr::new(id, &recv_sg);
    for k in 0..32 {
        s.qp.post_recv(&recv(k)).unwrap();
    }
    start.wait();
    let mut run = Run::default();
    let mut wc = [WorkCompletion::default(); 8];
    let mut arrived = 0usize;
    let began = Instant::now();
    for i in 0..rounds {
        let round = Instant::now();
        let sg = [sge(&s.mr, 0, 8)];
        s.qp.post_send(&SendWr::new(i as u64, WrOpcode::Send, &sg).signaled())
            .unwrap();
        let mut sent = false;
        while !sent || arrived == 0 {
            run.polling();
            let n = s.cq.poll(&mut wc).unwrap();
            for c in &wc[..n] {
                if !run.check(c) {
                    return run;
                }
                match c.opcode {
                    WcOpcode::Send => sent = true,
                    WcOpcode::Recv => {
                        arrived += 1;
                        s.qp.post_recv(&recv(c.wr_id)).unwrap();
                    }
                    _ => {}
                }
            }
            if began.elapsed() > STALL_LIMIT {
                return run;
            }
        }
        arrived -= 1;
        run.slowest = run.slowest.max(round.elapsed());
        run.done += 1;
    }
    run
}

/// `rounds` 64 KiB RDMA operations (`write`: WRITEs, else READs) from `s`
/// into or out of `peer`'s MR, `depth` at a time, spinning on `poll`.
fn transfers(
    s: &Side,
    peer: &MemoryRegion,
    write: bool,
    depth: usize,
    rounds: usize,
    start: &Barrier,
) -> Run {
    start.wait();
    let mut run = Run::default();
    let mut wc = [WorkCompletion::default(); 16];
    let (mut posted, mut completed) = (0usize, 0usize);
    let mut posted_at = std::collections::VecDeque::new();
    let began = Instant::now();
    while completed < rounds {
        while posted < rounds && posted - completed < depth {
            let sg = [sge(&s.mr, 0, BIG as u32)];
            let op = if write {
                WrOpcode::RdmaWrite {
                    remote_addr: peer.iova(),
                    rkey: peer.rkey(),
                }
            } else {
                WrOpcode::RdmaRead {
                    remote_addr: peer.iova(),
                    rkey: peer.rkey(),
                }
            };
            s.qp.post_send(&SendWr::new(posted as u64, op, &sg).signaled())
                .unwrap();
            posted_at.push_back(Instant::now());
            posted += 1;
        }
        run.polling();
        let n = s.cq.poll(&mut wc).unwrap();
        for c in &wc[..n] {
            if !run.check(c) {
                return run;
            }
            completed += 1;
            if let Some(t) = posted_at.pop_front() {
                run.slowest = run.slowest.max(t.elapsed());
            }
        }
        if began.elapsed() > STALL_LIMIT {
            break;
        }
    }
    run.done = completed;
    run
}

/// The passive side: spins on its CQ (which stays empty) until `stop`.
fn spin_on_cq(s: &Side, stop: &AtomicBool, start: &Barrier) -> Run {
    start.wait();
    let mut run = Run::default();
    let mut wc = [WorkCompletion::default(); 8];
    while !stop.load(Ordering::Relaxed) {
        run.polling();
        let n = s.cq.poll(&mut wc).unwrap();
        for c in &wc[..n] {
            run.check(c);
        }
    }
    run
}

/// Threads that spin until dropped.
struct Hogs {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Hogs {
    fn start(n: usize) -> Hogs {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Hogs { stop, threads }
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The workloads.
#[derive(Debug, Clone, Copy)]
enum Workload {
    PingPong,
    Reads,
    Writes,
}

/// Held by the test running.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `workload` for `rounds` on a fresh pair, `hogs` threads spinning
/// beside it, and checks that it finished, without errors and without a
/// packet resent.
fn check(workload: Workload, rounds: usize, hogs: usize, tag: &str) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let watch = StallWatch::start();
    let (a, b) = pair(tag);
    let _hogs = Hogs::start(hogs);
    let start = Barrier::new(2);
    let stop = AtomicBool::new(false);
    let (ra, rb) = std::thread::scope(|s| {
        let passive = s.spawn(|| match workload {
            Workload::PingPong => ping_pong(&b, rounds, &start),
            Workload::Reads | Workload::Writes => spin_on_cq(&b, &stop, &start),
        });
        let ra = match workload {
            Workload::PingPong => ping_pong(&a, rounds, &start),
            Workload::Reads => transfers(&a, &b.mr, false, 1, rounds, &start),
            Workload::Writes => transfers(&a, &b.mr, true, 8, rounds, &start),
        };
        stop.store(true, Ordering::Relaxed);
        (ra, passive.join().unwrap())
    });
    drop(_hogs);
    let (sa, sb) = (a.dev.net_stats(), b.dev.net_stats());
    let what = format!(
        "{workload:?} {rounds} rounds, {hogs} hogs, a woken thread kept waiting up to {:?} \
         ({} × 10 ms of host stalls)\n\
         a {ra:?}\nb {rb:?}\na counters {:?}\nb counters {:?}",
        watch.worst(),
        watch.stalls(),
        sa.counters()
            .into_iter()
            .filter(|c| c.1 != 0)
            .collect::<Vec<_>>(),
        sb.counters()
            .into_iter()
            .filter(|c| c.1 != 0)
            .collect::<Vec<_>>(),
    );
    eprintln!("{what}");
    assert!(ra.error.is_none() && rb.error.is_none(), "{what}");
    assert_eq!(ra.done, rounds, "{what}");
    if matches!(workload, Workload::PingPong) {
        assert_eq!(rb.done, rounds, "{what}");
    }
    // Resends only where the host kept threads off the cores longer than
    // the retransmission floor (see `common::stall`).
    let stalls = watch.stalls() + ra.stalls + rb.stalls;
    if !common::stall::excused(stalls, sa.timeouts + sb.timeouts) {
        assert_eq!(sa.retransmitted + sb.retransmitted, 0, "resent: {what}");
        assert_eq!(sa.timeouts + sb.timeouts, 0, "timer expiries: {what}");
    }
}

/// As many spinning threads as the host has cores.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, usize::from)
}

#[test]
fn busy_polling_ping_pong_never_resends() {
    for run in 0..3 {
        check(Workload::PingPong, 2000, 0, &format!("pp{run}"));
    }
}

#[test]
fn busy_polling_ping_pong_beside_spinning_threads_never_resends() {
    for run in 0..3 {
        check(Workload::PingPong, 700, cores(), &format!("pph{run}"));
    }
}

#[test]
fn busy_polled_reads_never_resend() {
    check(Workload::Reads, 1000, 0, "rd");
    check(Workload::Reads, 300, cores(), "rdh");
}

#[test]
fn busy_polled_write_stream_never_resends() {
    check(Workload::Writes, 2000, 0, "wr");
    check(Workload::Writes, 500, cores(), "wrh");
}

/// An RC pair on one device whose whole engine is kept off the cores a
/// little longer than the retransmission timer's floor, right after a SEND
/// left (`rverbs::fault::arm_stall`): when the engine runs again, its first
/// pass reads the request and finds the requester's timer due, the ACK not
/// made yet. Nothing may be resent — the ACK goes out and is read back
/// before the timer runs. A fresh pair each round: a QP's first round trip
/// (the stall in it) would raise its timer above the stall.
#[test]
fn an_engine_kept_off_the_cores_past_a_timer_resends_nothing_to_itself() {
    const ROUNDS: usize = 4;
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let watch = StallWatch::start();
    let dev = rverbs::add_device(DeviceConfig::loopback().named("bp-stall")).unwrap();
    let mut stalls = 0;
    let mut resent_in = Vec::new();
    for round in 0..ROUNDS {
        // The rounds' own stalls are not the host's: each round's polls
        // count gaps from its first on.
        let mut polls = Run::default();
        let before = dev.net_stats().retransmitted;
        let (a, b) = (side_on(dev.clone()), side_on(dev.clone()));
        // Timeout 14 (67 ms): only the adaptive timer, whose floor is
        // RETRANSMIT_FLOOR, can be due after the stall.
        connect(&a, &b, 14);
        let (recv_sg, send_sg) = ([sge(&b.mr, 0, 64)], [sge(&a.mr, 0, 8)]);
        b.qp.post_recv(&RecvWr::new(1, &recv_sg)).unwrap();
        let hold = common::stall::RETRANSMIT_FLOOR + Duration::from_micros(500);
        rverbs::fault::arm_stall(&dev, hold);
        a.qp.post_send(&SendWr::new(2, WrOpcode::Send, &send_sg).signaled())
            .unwrap();
        let (mut sent, mut received) = (false, false);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut wc = [WorkCompletion::default(); 4];
        while !(sent && received) {
            assert!(
                Instant::now() < deadline,
                "round {round}: no completion in 10 s"
            );
            polls.polling();
            for (cq, side_b) in [(&a.cq, false), (&b.cq, true)] {
                let n = cq.poll(&mut wc).unwrap();
                for c in &wc[..n] {
                    assert!(polls.check(c), "round {round}: {c:?}");
                    sent |= !side_b && c.opcode == WcOpcode::Send;
                    received |= side_b && c.opcode == WcOpcode::Recv;
                }
            }
        }
        stalls += polls.stalls;
        if dev.net_stats().retransmitted != before {
            resent_in.push(round);
        }
    }
    let s = dev.net_stats();
    let what = format!(
        "{ROUNDS} stalled rounds, resends in rounds {resent_in:?}; a woken thread kept \
         waiting up to {:?}; counters {:?}",
        watch.worst(),
        s.counters()
            .into_iter()
            .filter(|c| c.1 != 0)
            .collect::<Vec<_>>()
    );
    eprintln!("{what}");
    if !common::stall::excused(watch.stalls() + stalls, s.timeouts) {
        assert_eq!(s.retransmitted, 0, "resent: {what}");
        assert_eq!(s.timeouts, 0, "timer expiries: {what}");
    }
}
