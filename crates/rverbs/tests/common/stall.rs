//! How long this host keeps a woken thread waiting for a core, measured
//! while a test runs: one thread per core sleeps a millisecond at a time and
//! records how late it wakes. Shared by the busy-poll tests of `rverbs` and
//! of the drop-in library (included by path).
//!
//! A retransmission on a lossless link is a bug — unless the host itself
//! kept threads off the cores for longer than the retransmission timer's
//! floor: a shared 2-core VM here once left a vCPU unscheduled for 31 ms
//! with nothing else running, and then no transport can tell a stalled peer
//! from a lost packet. The tests excuse a resend only when this watch saw
//! such a stall during the run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The floor of rverbs' adaptive retransmission timer: a peer silent for
/// less than this is never resent to.
pub const RETRANSMIT_FLOOR: Duration = Duration::from_millis(10);

/// Sleepers that measure their own lateness until dropped.
pub struct StallWatch {
    stop: Arc<AtomicBool>,
    worst_ns: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl StallWatch {
    /// Starts one sleeper per core.
    pub fn start() -> StallWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let worst_ns = Arc::new(AtomicU64::new(0));
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let threads = (0..cores)
            .map(|_| {
                let (stop, worst_ns) = (stop.clone(), worst_ns.clone());
                std::thread::spawn(move || {
                    let nap = Duration::from_millis(1);
                    while !stop.load(Ordering::Relaxed) {
                        let before = Instant::now();
                        std::thread::sleep(nap);
                        let late = before.elapsed().saturating_sub(nap);
                        let late = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
                        worst_ns.fetch_max(late, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        StallWatch {
            stop,
            worst_ns,
            threads,
        }
    }

    /// The longest a sleeper has waited past its wake-up time so far.
    pub fn worst(&self) -> Duration {
        Duration::from_nanos(self.worst_ns.load(Ordering::Relaxed))
    }

    /// Whether the host stalled a woken thread for at least
    /// [`RETRANSMIT_FLOOR`] so far, which excuses a retransmission.
    pub fn excuses_a_resend(&self) -> bool {
        self.worst() >= RETRANSMIT_FLOOR
    }
}

impl Drop for StallWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
