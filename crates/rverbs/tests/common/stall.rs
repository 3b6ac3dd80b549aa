//! How long this host keeps a woken thread waiting for a core, measured
//! while a test runs: one thread per core sleeps a millisecond at a time and
//! records how late it wakes. Shared by the busy-poll tests of `rverbs` and
//! of the drop-in library (included by path).
//!
//! A retransmission on a lossless link is a bug — unless the host itself
//! kept threads off the cores for longer than the retransmission timer's
//! floor: a shared 2-core VM here once left a vCPU unscheduled for 31 ms
//! with nothing else running, and then no transport can tell a stalled peer
//! from a lost packet. The tests excuse timer expiries (and their resends)
//! only up to the number of such stalls seen during the run: by this
//! watch's sleepers, and by the tests' pollers themselves (two polls 10 ms
//! apart: a runnable thread kept off the cores, which a sleeper, favoured
//! on wake-up, may not see). A stall counts once per whole
//! [`RETRANSMIT_FLOOR`] it lasted: a QP whose peer stays silent resends
//! about that often until its timer has backed off. The sleepers are not
//! pinned, so a stall of one vCPU may go unseen: the excuse errs on the
//! strict side.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The floor of rverbs' adaptive retransmission timer (`MIN_FAST_RTO` in
/// `src/soft/transport/rc/completer.rs`; keep the two equal): a peer
/// silent for less than this is never resent to.
pub const RETRANSMIT_FLOOR: Duration = Duration::from_millis(10);

/// Gaps of at least [`RETRANSMIT_FLOOR`] between two polls of a test's
/// waiting thread (see [`note_poll_gap`]), ever, in this test binary.
static POLL_GAPS: AtomicU64 = AtomicU64::new(0);

/// A test's waiting thread polled again `gap` after its previous poll: a
/// gap of [`RETRANSMIT_FLOOR`] or more is a runnable thread kept off the
/// cores (CPU hogs beside it), which sleepers, favoured on wake-up, do not
/// see.
#[allow(dead_code)] // not every binary that includes this waits so
pub fn note_poll_gap(gap: Duration) {
    POLL_GAPS.fetch_add(floors(gap), Ordering::Relaxed);
}

/// How many whole [`RETRANSMIT_FLOOR`]s a stall of `late` lasted: the
/// expiries it excuses.
pub fn floors(late: Duration) -> u64 {
    u64::try_from(late.as_nanos() / RETRANSMIT_FLOOR.as_nanos()).unwrap_or(u64::MAX)
}

/// Sleepers that measure their own lateness until dropped (and the gaps
/// the test's waiting threads report meanwhile).
pub struct StallWatch {
    /// [`POLL_GAPS`] when the watch started.
    poll_gaps_at_start: u64,
    stop: Arc<AtomicBool>,
    worst_ns: Arc<AtomicU64>,
    /// Wake-ups late by at least [`RETRANSMIT_FLOOR`] (once per whole
    /// floor).
    stalls: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl StallWatch {
    /// Starts one sleeper per core.
    pub fn start() -> StallWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let worst_ns = Arc::new(AtomicU64::new(0));
        let stalls = Arc::new(AtomicU64::new(0));
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let threads = (0..cores)
            .map(|_| {
                let (stop, worst_ns, stalls) = (stop.clone(), worst_ns.clone(), stalls.clone());
                std::thread::spawn(move || {
                    let nap = Duration::from_millis(1);
                    while !stop.load(Ordering::Relaxed) {
                        let before = Instant::now();
                        std::thread::sleep(nap);
                        let late = before.elapsed().saturating_sub(nap);
                        stalls.fetch_add(floors(late), Ordering::Relaxed);
                        let late = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
                        worst_ns.fetch_max(late, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        StallWatch {
            poll_gaps_at_start: POLL_GAPS.load(Ordering::Relaxed),
            stop,
            worst_ns,
            stalls,
            threads,
        }
    }

    /// The longest a sleeper has waited past its wake-up time so far.
    pub fn worst(&self) -> Duration {
        Duration::from_nanos(self.worst_ns.load(Ordering::Relaxed))
    }

    /// How many times the host stalled a woken thread, or kept a waiting
    /// test thread from polling, for at least [`RETRANSMIT_FLOOR`] so far
    /// (a stall counting once per whole floor it lasted).
    pub fn stalls(&self) -> u64 {
        let gaps = POLL_GAPS
            .load(Ordering::Relaxed)
            .saturating_sub(self.poll_gaps_at_start);
        self.stalls.load(Ordering::Relaxed) + gaps
    }
}

/// Whether `timeouts` retransmission timer expiries (and the resends they
/// made) are excused by `stalls` host stalls of at least
/// [`RETRANSMIT_FLOOR`] (counted once per whole floor): each expiry needs
/// a stall of its own.
pub fn excused(stalls: u64, timeouts: u64) -> bool {
    stalls > 0 && timeouts <= stalls
}

impl Drop for StallWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
