//! Issue 13's plain-verbs C reproducer, tests/c/busy_pingpong.c: two
//! processes on the drop-in, each with its own device, ping-pong one
//! signaled SEND at a time over RC while both busy-poll their CQ (timeout
//! 12, retry_cnt 7) — alone, and with as many CPU hogs beside them as the
//! machine has cores. On a lossless link no workload retransmits, and a QP
//! whose peer process is alive never exhausts its retries: every run ends
//! in "ALL OK" from both processes with no retransmission and no timer
//! expiry in either device's counters (`RVERBS_COUNTERS=1`).
//!
//! Its own test binary, so that no other test of the crate runs beside it
//! and skews it; its tests take turns (`ONE_AT_A_TIME`). A retransmission is excused only if the host itself kept a
//! woken thread waiting longer than the retransmission timer's floor during
//! the run (`stall`); an error or exhausted retries never are.

mod common;
#[path = "../../rverbs/tests/common/stall.rs"]
mod stall;

use std::collections::HashMap;
use std::path::Path;

/// One run's outcome, from the program's output.
struct Run {
    label: String,
    /// The longest this host kept a woken thread waiting during the run.
    stall: std::time::Duration,
    /// Host stalls at least as long as the retransmission floor.
    stalls: u64,
    exit_ok: bool,
    all_ok: usize,
    /// Slowest iteration of each process, in µs.
    slowest_us: Vec<u64>,
    /// Each process's device counters (a missing counter is 0).
    counters: Vec<HashMap<String, u64>>,
    text: String,
}

impl Run {
    fn counter(&self, name: &str) -> Vec<u64> {
        self.counters
            .iter()
            .map(|c| c.get(name).copied().unwrap_or(0))
            .collect()
    }

    /// Why this run fails the test, if it does.
    fn faults(&self) -> Vec<String> {
        let mut faults = Vec::new();
        if !self.exit_ok {
            faults.push("exit status".to_string());
        }
        if self.all_ok != 2 {
            faults.push(format!("{} of 2 processes said ALL OK", self.all_ok));
        }
        if self.text.to_lowercase().contains("retry") {
            faults.push("a retry error".to_string());
        }
        if self.counters.len() != 2 {
            faults.push(format!("{} of 2 counter reports", self.counters.len()));
        }
        for name in ["retransmitted", "timeouts"] {
            // Excused only where the host kept threads off the cores longer
            // than the retransmission floor (see `stall`).
            if self.counter(name).iter().any(|&n| n != 0) && !self.excused() {
                faults.push(format!("{name} {:?}", self.counter(name)));
            }
        }
        faults
    }

    /// Whether the timer expiries of both processes are excused: at most
    /// one per host stall of the retransmission floor or more (see `stall`).
    fn excused(&self) -> bool {
        stall::excused(self.stalls, self.counter("timeouts").iter().sum())
    }

    fn summary(&self) -> String {
        format!(
            "{}: exit {}, ALL OK {}/2, slowest {:?} us, retransmitted {:?}, timeouts {:?}, \
             duplicates {:?}, host stall {:?} ({} × 10 ms)",
            self.label,
            if self.exit_ok { "ok" } else { "FAILED" },
            self.all_ok,
            self.slowest_us,
            self.counter("retransmitted"),
            self.counter("timeouts"),
            self.counter("duplicates"),
            self.stall,
            self.stalls,
        )
    }
}

/// Runs the program once: `iterations` ping-pongs with `hogs` spinning
/// threads in each process.
fn run(exe: &Path, lib_dir: &Path, label: String, iterations: u32, hogs: u32) -> Run {
    let (iterations, hogs) = (iterations.to_string(), hogs.to_string());
    let watch = stall::StallWatch::start();
    let (exit_ok, text) = common::run_program(
        exe,
        &[&iterations, &hogs],
        lib_dir,
        &[("RVERBS_COUNTERS", "1")],
    );
    Run {
        label,
        stall: watch.worst(),
        // Stalls the sleepers saw, and those the pollers saw of
        // themselves (a runnable thread kept off the cores).
        stalls: watch.stalls()
            + text
                .lines()
                .filter_map(|l| {
                    l.split_once(": poller stalls ")?
                        .1
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .sum::<u64>(),
        exit_ok,
        all_ok: text.lines().filter(|l| l.ends_with(": ALL OK")).count(),
        slowest_us: text.lines().filter_map(slowest_us).collect(),
        counters: text.lines().filter_map(counters).collect(),
        text,
    }
}

/// `<role>: slowest <µs> us …` → µs.
fn slowest_us(line: &str) -> Option<u64> {
    let rest = line.split_once(": slowest ")?.1;
    rest.split_whitespace().next()?.parse().ok()
}

/// `rverbs: counters of <dev> (<addr>): name=value …` → the counters.
fn counters(line: &str) -> Option<HashMap<String, u64>> {
    let rest = line.strip_prefix("rverbs: counters of ")?;
    let list = rest.split_once("):").map_or("", |(_, l)| l);
    Some(
        list.split_whitespace()
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect(),
    )
}

#[test]
fn busy_polling_rc_ping_pong_never_retransmits_nor_exhausts_retries() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some((dir, exe)) = program("busy_pingpong") else {
        return;
    };
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);
    // Hogs per process: as many in all as the machine has cores.
    let hogs = cores.div_ceil(2);
    let plan = [(4, 1500, 0), (3, 800, hogs)];
    let mut runs = Vec::new();
    for (count, iterations, hogs) in plan {
        for i in 1..=count {
            let label = format!("{iterations} iterations, {hogs} hogs/process, run {i}/{count}");
            runs.push(run(&exe, &dir.0, label, iterations, hogs));
        }
    }
    let table: Vec<String> = runs.iter().map(Run::summary).collect();
    let failed: Vec<String> = runs
        .iter()
        .filter(|r| !r.faults().is_empty())
        .map(|r| format!("--- {}: {}\n{}", r.label, r.faults().join(", "), r.text))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} runs failed:\n{}\n\n{}",
        failed.len(),
        runs.len(),
        table.join("\n"),
        failed.join("\n")
    );
    // The figures of a passing run, for `--nocapture`.
    eprintln!("{}", table.join("\n"));
}

/// The C program, compiled into a fresh library directory named by `tag`
/// (`None`, after the CI check, without cc or verbs.h).
fn program(tag: &str) -> Option<(common::LibDir, std::path::PathBuf)> {
    let dir = common::LibDir::new(tag);
    let exe = common::compile_c(&dir.0, "busy_pingpong", include_str!("c/busy_pingpong.c"))?;
    Some((dir, exe))
}

/// Held by the test running, so neither skews the other.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The CPU share each process used while busy-polling its idle CQ for a
/// second (`IDLE_POLL_MS`), with `env` set.
fn idle_poll_cpu(exe: &Path, lib_dir: &Path, env: &[(&str, &str)]) -> Vec<f64> {
    let mut env = env.to_vec();
    env.push(("IDLE_POLL_MS", "1000"));
    let (ok, text) = common::run_program(exe, &["10", "0"], lib_dir, &env);
    assert!(ok && text.contains("child: ALL OK"), "{text}");
    let shares: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split_once(": idle poll cpu ")?.1.trim().parse().ok())
        .collect();
    assert_eq!(shares.len(), 2, "{text}");
    shares
}

/// A program that busy-polls an idle connected QP leaves the core: its
/// poller sleeps in `ibv_poll_cq` once spinning stops paying (measured:
/// 3 % of a core against 99 % before). `RVERBS_POLL_PARK=0` brings the
/// spinning back.
#[test]
fn busy_polling_an_idle_cq_leaves_the_core_unless_told_not_to() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some((dir, exe)) = program("idle_poll") else {
        return;
    };
    let parked = idle_poll_cpu(&exe, &dir.0, &[]);
    let spinning = idle_poll_cpu(&exe, &dir.0, &[("RVERBS_POLL_PARK", "0")]);
    eprintln!("idle poll CPU share: parking {parked:?}, RVERBS_POLL_PARK=0 {spinning:?}");
    for (p, s) in parked.iter().zip(&spinning) {
        // A spinner gets at least a third of a core even on a busy 2-core
        // host; a parked poller wakes about a thousand times a second.
        assert!(*p < 0.2, "parked pollers used {parked:?} of a core");
        assert!(
            *s > 3.0 * p,
            "spinning {spinning:?} against parked {parked:?}"
        );
    }
}

#[test]
fn counter_lines_parse_with_missing_counters_as_zero() {
    let line = "rverbs: counters of rverbs0 (127.0.0.3): tx_packets=3068 retransmitted=59 \
                timeouts=5";
    let c = counters(line).unwrap();
    assert_eq!(c.get("retransmitted"), Some(&59));
    assert_eq!(c.get("timeouts"), Some(&5));
    let quiet = counters("rverbs: counters of rverbs0 (127.0.0.4): ").unwrap();
    assert!(quiet.is_empty());
    assert_eq!(counters("parent: ALL OK"), None);
    assert_eq!(
        slowest_us("child: slowest 168709 us at iteration 406 of 1500"),
        Some(168709)
    );
}
