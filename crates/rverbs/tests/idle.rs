//! An idle device costs no CPU: with connected QPs that have carried
//! traffic and now sit idle — one application thread asleep on a completion
//! channel — the whole process uses under 2 % of a core over 2 s.
//!
//! Its own test binary: CPU time is measured for the whole process, so no
//! other test may run beside it.

use std::time::{Duration, Instant};

use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeVal;
use rverbs::cm::{ConnectOptions, Endpoint};
use rverbs::{devices, AccessFlags, QpCaps, RecvWr, SendWr, Sge, WorkCompletion, WrOpcode};

/// CPU time (user and system, all threads, ended ones too) the process
/// used so far.
fn process_cpu() -> Duration {
    cpu_of(UsageWho::RUSAGE_SELF)
}

/// CPU time (user and system) used so far by `who`.
fn cpu_of(who: UsageWho) -> Duration {
    let usage = getrusage(who).unwrap();
    let micros = |t: TimeVal| Duration::from_micros((t.tv_sec() * 1_000_000 + t.tv_usec()) as u64);
    micros(usage.user_time()) + micros(usage.system_time())
}

fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
        .map(|s| s.trim().to_string())
        .collect()
}

#[test]
fn connected_idle_qps_cost_no_cpu() {
    // The measurement works: a busy second thread, ended, shows up. It
    // spins until it has used 100 ms of CPU by its own count (however long
    // that takes on a loaded host: beside three CPU hogs a 100 ms spin by
    // the clock got 48 ms).
    let before = process_cpu();
    let spin = std::thread::spawn(|| {
        let give_up = Instant::now() + Duration::from_secs(30);
        let mut x = 0u64;
        while cpu_of(UsageWho::RUSAGE_THREAD) < Duration::from_millis(100)
            && Instant::now() < give_up
        {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        cpu_of(UsageWho::RUSAGE_THREAD)
    });
    let spun = spin.join().unwrap();
    let used = process_cpu() - before;
    // (Within a millisecond: both figures are rounded to microseconds.)
    assert!(
        spun >= Duration::from_millis(100) && used + Duration::from_millis(1) >= spun,
        "a thread that spun {spun:?} measured as {used:?}"
    );

    let dev = &devices().unwrap()[0];
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let ctx_a = dev.open().unwrap();
    let ctx_b = dev.open().unwrap();
    let pd_a = ctx_a.alloc_pd().unwrap();
    let pd_b = ctx_b.alloc_pd().unwrap();
    let channel = ctx_b.create_comp_channel().unwrap();
    let cq_a = ctx_a.create_cq(256).unwrap();
    let cq_b = ctx_b
        .cq_builder()
        .cqe(256)
        .channel(&channel)
        .build()
        .unwrap();
    let mr_a = pd_a.alloc_mr(1 << 16, all).unwrap();
    let mr_b = pd_b.alloc_mr(1 << 16, all).unwrap();
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let opts = ConnectOptions::default();
    let mut pairs = Vec::new();
    for _ in 0..8 {
        let qa = pd_a.qp_builder(&cq_a, &cq_a).caps(caps).build().unwrap();
        let qb = pd_b.qp_builder(&cq_b, &cq_b).caps(caps).build().unwrap();
        let ea = Endpoint::for_qp(&qa);
        let eb = Endpoint::for_qp(&qb).with_buffer(&mr_b);
        qa.connect(ea.psn, &eb, &opts).unwrap();
        qb.connect(eb.psn, &ea, &opts).unwrap();
        pairs.push((qa, qb, eb));
    }
    // Traffic on every pair first, so timers were armed and have settled.
    let sge_a = [Sge {
        addr: mr_a.iova(),
        length: 4096,
        lkey: mr_a.lkey(),
    }];
    let sge_b = [Sge {
        addr: mr_b.iova(),
        length: 4096,
        lkey: mr_b.lkey(),
    }];
    for (qa, qb, eb) in &pairs {
        qb.post_recv(&RecvWr::new(1, &sge_b)).unwrap();
        qa.post_send(&SendWr::new(2, WrOpcode::Send, &sge_a).signaled())
            .unwrap();
        let write = WrOpcode::RdmaWrite {
            remote_addr: eb.addr,
            rkey: eb.rkey,
        };
        qa.post_send(&SendWr::new(3, write, &sge_a).signaled())
            .unwrap();
    }
    let mut wc = [WorkCompletion::default(); 32];
    let mut done = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while done < 16 {
        assert!(
            Instant::now() < deadline,
            "only {done} of 16 sends completed"
        );
        done += cq_a.poll(&mut wc).unwrap();
    }
    let mut received = 0;
    while received < 8 {
        assert!(Instant::now() < deadline, "only {received} of 8 receives");
        received += cq_b.poll(&mut wc).unwrap();
    }
    // A receive WR stays posted on each B QP, and one thread sleeps on B's
    // armed CQ, as an event-driven server would.
    for (_, qb, _) in &pairs {
        qb.post_recv(&RecvWr::new(9, &sge_b)).unwrap();
    }
    cq_b.req_notify(false).unwrap();
    let sleeper = std::thread::spawn(move || channel.get_cq_event_timeout(Duration::from_secs(3)));
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        thread_names().iter().any(|n| n.starts_with("rverbs-")),
        "the engine thread runs: {:?}",
        thread_names()
    );

    let before = process_cpu();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let used = process_cpu() - before;
    let wall = start.elapsed();
    let share = used.as_secs_f64() / wall.as_secs_f64();
    assert!(
        share < 0.02,
        "idle device used {used:?} of CPU in {wall:?} ({:.2} % of a core)",
        share * 100.0
    );
    eprintln!("idle: {used:?} CPU in {wall:?}");
    let woke = sleeper.join().unwrap().unwrap();
    assert!(woke.is_none(), "nothing completed, yet the channel fired");
    drop(pairs);
}
