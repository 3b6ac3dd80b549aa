//! The engine thread: sleeps in `ppoll(2)` on the socket, the multicast
//! sockets, a wake-up eventfd and what its device asks it to watch (the
//! host's address changes), with the earliest timer as timeout; spins
//! briefly while a stream arrives (as long as spinning pays, see `park`);
//! and leaves the socket to an application thread that busy-polls a CQ.
//! A panic on it fails the engine (see the parent module): it is caught at
//! the thread's top, logged, and the device raises DEVICE_FATAL.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::time::TimeSpec;
use smallvec::SmallVec;

use super::park::{Spin, SpinBudget, WaitEnd};
use super::{local, multicast, next_deadline, progress, Driver, Engine};
use crate::soft::local::ring::RingWatch;
use crate::soft::sys;

/// The time slice the engine thread asks for: short, so that, woken by a
/// packet on a host whose cores are all busy, it gets on one at once.
const ENGINE_SLICE: Duration = Duration::from_micros(100);
/// While application threads poll, the engine thread looks this often
/// whether they keep up with the socket.
const WATCHDOG: Duration = Duration::from_micros(500);
pub(super) const WATCHDOG_NANOS: u64 = WATCHDOG.as_nanos() as u64;
/// While a poller is parked, or pollers whose core is shared spin (see
/// `CROWDED_GRACE` in the engine), the engine thread looks this seldom: a
/// sleeper is woken by the kernel for every packet, doorbell and timer
/// itself, so the look only covers a program that stops polling right
/// after its park ends, and on a shared core each look preempts a poller.
/// Looking every [`WATCHDOG`] while pollers were parked cost four
/// ping-pong pairs on two cores about a quarter of their p99 (an engine
/// thread woke 2,000 times a second per process and preempted the
/// pollers).
const QUIET_WATCHDOG: Duration = Duration::from_millis(2);

/// What the engine thread watches for its device besides the network (the
/// host's address changes, for the port): a descriptor to poll, if there
/// is one, and what to do when it is readable — it must drain it — and
/// once as the thread starts, so a change from before it watched is not
/// missed.
pub(crate) trait Watch: Send + Sync {
    /// The descriptor to poll for readability (`None`: nothing to poll;
    /// [`on_ready`](Self::on_ready) still runs once at the start).
    fn fd(&self) -> Option<BorrowedFd<'_>>;
    /// Drains the descriptor and acts on what changed.
    fn on_ready(&self);
}

impl Engine {
    /// Starts the engine thread, named `rverbs-{name}`, once, watching
    /// `watch` too. Whether this call started it.
    pub(crate) fn start_thread(self: &Arc<Self>, name: &str, watch: Box<dyn Watch>) -> bool {
        if self.thread_started.swap(true, Ordering::AcqRel) {
            return false;
        }
        let engine = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("rverbs-{name}"))
            .spawn(move || {
                // A panic anywhere on the thread fails the engine (a lock
                // it held is poisoned, so no one else uses the state).
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| engine_thread(&engine, watch)))
                {
                    engine.panicked(&*panic);
                }
            });
        if let Err(e) = spawned {
            tracing::error!("cannot start the engine thread: {e}");
            self.thread_started.store(false, Ordering::Release);
            return false;
        }
        true
    }
}

#[cfg(feature = "fault-injection")]
thread_local! {
    /// This thread is a device's engine thread (for injected panics).
    static ON_ENGINE_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is a device's engine thread.
#[cfg(feature = "fault-injection")]
pub(super) fn on_engine_thread() -> bool {
    ON_ENGINE_THREAD.with(std::cell::Cell::get)
}

fn engine_thread(engine: &Engine, watch: Box<dyn Watch>) {
    #[cfg(feature = "fault-injection")]
    ON_ENGINE_THREAD.with(|on| on.set(true));
    let mrs = &*engine.mrs;
    // The thread's own handle on the socket: it stays open while the thread
    // sleeps on it, even if shutdown closes the engine's.
    let socket_fd: OwnedFd = {
        let Ok(st) = engine.lock() else { return };
        match st.socket.as_ref().map(|s| s.as_fd().try_clone_to_owned()) {
            Some(Ok(fd)) => fd,
            _ => return,
        }
    };
    sys::prefer_short_slices(ENGINE_SLICE);
    // After a pass that received something, keep polling the socket for a
    // while before sleeping: a stream's next batch is then picked up without
    // the sender's kernel having to wake this thread for every batch. How
    // long is learnt (`SpinBudget`): where the sender shares our core, the
    // spin only delays it, and the budget drops to nothing.
    let rx_spin = SpinBudget::default();
    let mut spinning: Option<(Instant, Spin)> = None;
    // The multicast sockets it watches too, as of `groups_seen`.
    let mut group_fds: Vec<OwnedFd> = Vec::new();
    // The same-host links' rings, as of the last look under the lock.
    let mut rings: SmallVec<[RingWatch; 4]> = SmallVec::new();
    let mut groups_seen = 0;
    // A change before the thread watched goes unnoticed otherwise.
    watch.on_ready();
    loop {
        if engine.stopped.load(Ordering::Acquire) || engine.has_failed() {
            return;
        }
        // While an application busy-polls, it owns the socket and runs the
        // timers: sleep (without the lock) until its grace runs out.
        let now = Instant::now();
        if let Some((since, spin)) = spinning {
            let spun = u64::try_from(now.saturating_duration_since(since).as_nanos());
            let spent = spin.spent(spun.unwrap_or(u64::MAX));
            if !spent {
                if engine.waiting.load(Ordering::SeqCst) > 0 {
                    // A thread waits for the lock (to post, say): the std
                    // mutex is not fair, so step back rather than win it again.
                    std::hint::spin_loop();
                    continue;
                }
                if engine.busy_polled_until(now).is_none() {
                    let Ok(mut st) = engine.lock() else { return };
                    st.thread_wakes_at = Some(now);
                    let before = st.stats.rx_recvs;
                    progress(&mut st, mrs, Driver::Engine);
                    let got = st.stats.rx_recvs != before;
                    drop(st);
                    if got {
                        // The spin paid: a new one starts.
                        rx_spin.finish(spin, WaitEnd::Spun(spun.unwrap_or(u64::MAX)));
                        spinning = Some((now, rx_spin.start()));
                    }
                    std::hint::spin_loop();
                    continue;
                }
            }
            if spent {
                // Spent without a packet: spinning did not pay.
                rx_spin.finish(spin, WaitEnd::Slept);
            }
        }
        spinning = None;
        if let Some(until) = engine.busy_polled_until(now) {
            // Announce the socket is left alone, then look again whether
            // the application still polls: app_will_sleep stores before it
            // loads, so one of the two sees the other (both SeqCst).
            engine.thread_off_socket.store(true, Ordering::SeqCst);
            if engine.busy_polled_until(now).is_some() {
                let mut fds = [PollFd::new(engine.waker.as_fd(), PollFlags::POLLIN)];
                let watchdog = if engine.parked.load(Ordering::SeqCst) > 0
                    || engine.pollers_crowded.load(Ordering::Relaxed)
                {
                    QUIET_WATCHDOG
                } else {
                    WATCHDOG
                };
                let wake = until.min(now + watchdog);
                let left = TimeSpec::from_duration(wake.saturating_duration_since(now));
                let _ = ppoll(&mut fds, Some(left), None);
                if fds[0].revents().is_some_and(|r| !r.is_empty()) {
                    let _ = engine.waker.read();
                }
                let now = Instant::now();
                let mut watched: SmallVec<[RawFd; 4]> = SmallVec::new();
                watched.push(socket_fd.as_raw_fd());
                watched.extend(group_fds.iter().map(AsRawFd::as_raw_fd));
                if engine.pollers_lag(now)
                    && (sys::wait_readable(&watched, Duration::ZERO) != 0
                        || rings.iter().any(RingWatch::has_records))
                {
                    // Packets wait while the pollers are asleep or have not
                    // polled for a while: on a busy host, the one woken for
                    // them is not on a core yet. This thread, with its short
                    // slice, gets on one at once: it makes the pass, so the
                    // ACKs the peer waits for leave now.
                    let Ok(mut st) = engine.lock() else { return };
                    progress(&mut st, mrs, Driver::Engine);
                }
            }
            engine.thread_off_socket.store(false, Ordering::SeqCst);
            continue;
        }
        let timer = {
            let Ok(mut st) = engine.lock() else { return };
            let timer = next_deadline(&mut st);
            st.thread_wakes_at = timer;
            rings.clear();
            st.links.watches(&mut rings);
            timer
        };
        let timeout = timer.map(|t| TimeSpec::from_duration(t.saturating_duration_since(now)));
        let generation = engine.groups_changed.load(Ordering::SeqCst);
        if generation != groups_seen {
            let Ok(st) = engine.lock() else { return };
            group_fds = multicast::sockets(&st);
            groups_seen = generation;
        }
        let mut fds: SmallVec<[PollFd<'_>; 4]> = SmallVec::new();
        fds.push(PollFd::new(engine.waker.as_fd(), PollFlags::POLLIN));
        fds.push(PollFd::new(socket_fd.as_fd(), PollFlags::POLLIN));
        fds.push(PollFd::new(engine.doorbell.as_fd(), PollFlags::POLLIN));
        let watched_fd = watch.fd();
        if let Some(fd) = watched_fd {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
        }
        for fd in &group_fds {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
        }
        // Counted as a sleeper of each same-host ring, then one more look.
        if !local::sleep_begin(&rings) {
            match ppoll(&mut fds, timeout, None) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => {
                    warn_once!("engine poll failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        local::sleep_end(&rings);
        let woken = fds[0].revents().is_some_and(|r| !r.is_empty());
        let rung = fds[2].revents().is_some_and(|r| !r.is_empty());
        let watched = watched_fd.is_some() && fds[3].revents().is_some_and(|r| !r.is_empty());
        drop(fds);
        if watched {
            watch.on_ready();
        }
        if woken {
            let _ = engine.waker.read();
        }
        let now = Instant::now();
        if engine.busy_polled_until(now).is_some() {
            // An application polls (again): it makes the progress. A
            // doorbell stays rung for it (a poller about to park sees it).
            continue;
        }
        if rung {
            // Cleared only by a thread about to make a pass.
            local::doorbell_heard(engine);
        }
        let Ok(mut st) = engine.lock() else { return };
        // Awake: it looks at the timers again before it sleeps.
        st.thread_wakes_at = Some(now);
        let before = st.stats.rx_recvs;
        progress(&mut st, mrs, Driver::Engine);
        if st.stats.rx_recvs != before {
            spinning = Some((now, rx_spin.start()));
        }
    }
}
