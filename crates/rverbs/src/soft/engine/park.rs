//! Waiting without taking a core from the peer: how a thread that polls an
//! empty CQ, and the engine thread after a burst, decide between spinning
//! and sleeping, and how a poller sleeps ("parks") so that the next packet
//! or completion wakes it at once.
//!
//! Spinning is what makes a busy-polled ping-pong fast when a core is free:
//! the reply is picked up without a wake-up. On a shared core it is what
//! makes it slow: the peer whose packet we wait for cannot run while we
//! spin. So each waiter keeps a [`SpinBudget`] that learns from its waits:
//! a wait that ended while spinning keeps the budget (spinning paid); one
//! that had to sleep anyway halves it (spinning only burned the peer's
//! time). Now and then a wait probes with the full budget, so a budget cut
//! down while cores were busy grows back once they are free.
//!
//! A parked poller sleeps in `ppoll(2)` on the device's socket and the
//! process's [`Bell`] — an eventfd that [`Engine::ring`] writes when a
//! completion lands in any CQ of the process while someone is parked —
//! with the earliest timer as deadline. The kernel wakes it the moment a
//! packet arrives, and a woken sleeper is put back on a core far sooner
//! than a spinner that was preempted.
//!
//! While it spins, a poller gives its core away now and then
//! (`sched_yield(2)`, [`Engine::yield_while_spinning`]): where other threads wait
//! for the core — the very peer whose packet the spinner waits for, on a
//! crowded host — they run now, not when the scheduler's slice or the spin
//! budget runs out. A yield costs about 0.6 µs here even when nobody takes
//! the core, so a poller that has a core to itself yields only after
//! [`YIELD_AFTER`] of spinning (a free-core wait is rarely that long); one
//! whose yield another thread took (it came back late) is crowded, and
//! yields from the first empty poll of each wait, every [`YIELD_EVERY`],
//! until yields keep coming straight back. Yields that keep coming back
//! after [`YIELD_HOGGED`] go to a CPU hog, which takes every slice handed
//! to it: the spinner then does not yield for [`HOG_BACKOFF`]. In
//! alternating runs against the engine without yielding, four ping-pong
//! pairs on two cores went from a p99 half round trip 1.71–2.41× that of
//! four blocking UDP pairs to 1.30–2.03× (same-host) and from 2.79–3.38×
//! to 1.61–2.97× (wire); a ping-pong on one core from 0.98–1.13× blocking
//! UDP to 0.62–0.67× (same-host); free cores were as before.
//!
//! The sleep's deadline is the QP timers' real next expiry (see
//! `settle_timers`), bounded by [`PARK_LIMIT`], which is longer than a
//! scheduler tick on purpose: a sleep that ends before the next tick makes
//! the kernel program the CPU's timer for it, and cancel it when a packet
//! comes first. In a virtual machine each of those is a trap to the
//! hypervisor — measured here, a one-core ping-pong that parked with a
//! 1 ms timeout took 12–13 µs a hop against 7.3–7.9 µs with none. The bell
//! is shared by every device of the process so that a long sleep on one
//! device's socket still ends when another device's CQ gets a completion.
//!
//! Parking assumes a thread that polls an empty CQ again and again has
//! nothing else to do until a completion comes. Some programs do: a
//! runtime that keeps its own queue of deferred work and retries it in the
//! loop that polls the CQ (libfabric's rxm retries a send held back for
//! flow-control credits only after the CQ poll returns). Parked, such a
//! program stalls until the park times out, and its peer, parked too,
//! waits for it. So a park that ran out its time with nothing arriving,
//! after which the same thread's next verb is a post rather than another
//! poll of that CQ, and without a completion found meanwhile, shows the
//! program had work of its own: parking stops for the rest of the
//! process's life (pollers spin, as with `RVERBS_POLL_PARK=0`), a debug
//! line says why, and the devices count it (`poll_park_stalls`). A poll of
//! another CQ does not clear it (a program polling its receive and send
//! CQs in turn stalls the same), and a completion found — even by the very
//! poll whose park ran out, the packet having come just after — does.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use std::cell::Cell;

use nix::sys::eventfd::{EfdFlags, EventFd};
use smallvec::SmallVec;

use super::{local, multicast, next_deadline, progress, Driver, Engine, BUSY_POLL_GRACE};
use crate::soft::local::ring::RingWatch;
use crate::soft::sys;

/// The process's completion bell: one for all its devices, so that a
/// thread parked on one device's socket wakes when a completion lands in a
/// CQ of another (a program that polls CQs of several devices in turn).
#[derive(Debug)]
pub(crate) struct Bell {
    /// Written when a completion is pushed while someone is parked.
    fd: EventFd,
    /// Threads parked on it, over every device.
    pub(super) parked: AtomicU32,
    /// Completions pushed to the process's CQs, ever.
    pushed: AtomicU64,
    /// Pollers may park: `RVERBS_POLL_PARK=0` says no from the start; a
    /// stalled program (see the module docs) from then on.
    parking: AtomicBool,
    /// Spinning pollers may yield their core: `RVERBS_POLL_YIELD=0` says
    /// no (see [`Engine::yield_while_spinning`]).
    yielding: bool,
    /// Parks that stalled the program (see the module docs).
    stalls: AtomicU64,
}

/// The shortest park that counts as having run out its time: a park cut
/// short by a timer of the engine (an ACK held back for 20 µs) stalls
/// nothing worth turning parking off for.
const STALL_MIN: Duration = Duration::from_millis(1);

thread_local! {
    /// The CQ (its handle) this thread's last park ran out its time on,
    /// with nothing arriving, if the thread has not polled that CQ again
    /// nor found a completion since (see the module docs).
    static PARK_RAN_OUT: Cell<Option<u64>> = const { Cell::new(None) };
    /// The socket this thread's last park watched, and when it woke with
    /// that socket not readable: as good as a receive that found it empty
    /// (see `rx::receive`).
    static SOCKET_SEEN_EMPTY: Cell<Option<(RawFd, Instant)>> = const { Cell::new(None) };
    /// This thread's spin over empty CQs and what its yields have shown
    /// (see [`Engine::yield_while_spinning`]).
    static YIELDS: Cell<SpinYields> = const { Cell::new(SpinYields::new()) };
}

/// How often a spinning poller gives its core away (see the module docs).
const YIELD_EVERY: Duration = Duration::from_micros(5);
/// On a core it seems to have to itself, how long a poller spins before it
/// yields at all: a yield costs about 0.6 µs here, and one at the start of
/// every wait made a free-core ping-pong slower (same-host 0.32–0.34×
/// UDP against 0.20–0.29×), while a wait this long is rare there.
const YIELD_AFTER: Duration = Duration::from_micros(15);
/// A yield that returns this late ran another thread meanwhile: the core
/// is shared (a yield nobody takes returns in under a microsecond).
const YIELD_TAKEN: Duration = Duration::from_micros(3);
/// Quick yields in a row after which a crowded spinner waits
/// [`YIELD_AFTER`] again before its first yield.
const QUICK_YIELDS_FREE: u32 = 8;
/// A yield that returns this late gave the core to a thread that ran a
/// whole scheduler slice (at least a tick, 1–4 ms): a CPU hog, if it keeps
/// happening, not a peer that answers and waits (a crowded spinner yields
/// every few microseconds). Yielding again would only hand the hog more
/// slices while the spinner's own work waits: beside two hogs on two
/// cores, a ping-pong's median was 0.94 ms before this rule.
const YIELD_HOGGED: Duration = Duration::from_millis(1);
/// Two long yields this close show a hog (the second comes at the next
/// wait's first empty poll, a hog's slice after the first). One alone does
/// not: among four ping-pong pairs on two cores, about one yield in 2,000
/// came back after a millisecond or more, and a back-off after each lost
/// most of what yielding gained there.
const HOG_WINDOW: Duration = Duration::from_millis(10);
/// How long a spinner whose yields a hog took first does not yield; each
/// time a hog is found again, twice as long, up to [`HOG_BACKOFF_MAX`].
const HOG_BACKOFF: Duration = Duration::from_millis(20);
/// The longest back-off.
const HOG_BACKOFF_MAX: Duration = Duration::from_millis(640);
/// A long yield this long after the one before starts the back-off over.
const HOG_FORGET: Duration = Duration::from_secs(1);

/// A thread's spin over empty CQs (when it began, its last empty poll, its
/// last yield) and what its yields have shown of its core.
#[derive(Debug, Clone, Copy)]
struct SpinYields {
    /// The current spin: its start, its last empty poll, its last yield.
    spin: Option<(Instant, Instant, Option<Instant>)>,
    /// Another thread took the core at a recent yield: the spinner shares
    /// it, so it yields from the first empty poll of each wait.
    crowded: bool,
    /// Yields in a row that came straight back (nobody else wanted the
    /// core), since the last one that did not.
    quick: u32,
    /// When the last yield that came back after [`YIELD_HOGGED`] or more
    /// did.
    last_long: Option<Instant>,
    /// The next back-off when a hog is found.
    backoff: Duration,
    /// A hog took the yields (see [`HOG_WINDOW`]): no yields until then.
    hogged_until: Option<Instant>,
}

impl SpinYields {
    const fn new() -> SpinYields {
        SpinYields {
            spin: None,
            crowded: false,
            quick: 0,
            last_long: None,
            backoff: HOG_BACKOFF,
            hogged_until: None,
        }
    }

    /// An empty poll at `now`: whether to yield now — at once on a crowded
    /// core, after [`YIELD_AFTER`] of spinning on a free one, then every
    /// [`YIELD_EVERY`].
    fn empty_poll(&mut self, now: Instant) -> bool {
        let (since, yielded) = match self.spin {
            Some((since, last, yielded)) if now.saturating_duration_since(last) <= TIGHT_GAP => {
                (since, yielded)
            }
            // A new spin (or one after a gap: the thread did other work).
            _ => (now, None),
        };
        self.spin = Some((since, now, yielded));
        if self.hogged_until.is_some_and(|t| now < t) {
            return false;
        }
        let started = self.crowded || now.saturating_duration_since(since) >= YIELD_AFTER;
        started && yielded.is_none_or(|t| now.saturating_duration_since(t) >= YIELD_EVERY)
    }

    /// A yield called at `before` returned at `back`. Whether it was long
    /// enough ([`YIELD_HOGGED`]) to count as a park.
    fn yielded(&mut self, before: Instant, back: Instant) -> bool {
        let away = back.saturating_duration_since(before);
        let long = away >= YIELD_HOGGED;
        if long {
            let since = self.last_long.map(|t| back.saturating_duration_since(t));
            if since.is_some_and(|d| d <= HOG_WINDOW) {
                self.hogged_until = Some(back + self.backoff);
                self.backoff = (self.backoff * 2).min(HOG_BACKOFF_MAX);
            } else if since.is_none_or(|d| d >= HOG_FORGET) {
                self.backoff = HOG_BACKOFF;
            }
            self.last_long = Some(back);
        }
        let taken = away >= YIELD_TAKEN;
        self.quick = if taken {
            0
        } else {
            self.quick.saturating_add(1)
        };
        self.crowded = taken || (self.crowded && self.quick < QUICK_YIELDS_FREE);
        if let Some((since, _, _)) = self.spin {
            // The time away does not break the spin.
            self.spin = Some((since, back, Some(back)));
        }
        long
    }

    /// A poll found completions: the spin is over.
    fn found(&mut self) {
        self.spin = None;
    }
}

/// Whether the calling thread's spins over empty CQs have shown its core
/// shared: a recent yield of it ran another thread (see
/// [`Engine::yield_while_spinning`]).
pub(crate) fn polling_crowded() -> bool {
    YIELDS.get().crowded
}

/// When the calling thread's last park saw the socket `fd` empty as it
/// woke (for another descriptor: a doorbell, the bell), if it did.
pub(super) fn socket_seen_empty(fd: RawFd) -> Option<Instant> {
    SOCKET_SEEN_EMPTY
        .get()
        .and_then(|(seen, at)| (seen == fd).then_some(at))
}

/// The calling thread polls CQ `cq` again: a park that ran out on it was
/// a wait, not a stall. (A poll of another CQ proves nothing: a program
/// polling its receive and send CQs in turn may stall on either.)
pub(crate) fn note_poll(cq: u64) {
    if PARK_RAN_OUT.get() == Some(cq) {
        PARK_RAN_OUT.set(None);
    }
}

/// The calling thread's poll found completions: whatever it posts next
/// answers them, so no park before stalled it (a park that ran out just
/// before the packet it waited for came is no stall either).
pub(crate) fn note_found() {
    PARK_RAN_OUT.set(None);
    let mut yields = YIELDS.get();
    yields.found();
    YIELDS.set(yields);
}

impl Bell {
    /// The process's bell, made on first use.
    pub(crate) fn process() -> io::Result<&'static Bell> {
        static BELL: Mutex<Option<&'static Bell>> = Mutex::new(None);
        let mut bell = BELL.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = *bell {
            return Ok(b);
        }
        let made: &'static Bell = Box::leak(Box::new(Bell {
            fd: EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?,
            parked: AtomicU32::new(0),
            pushed: AtomicU64::new(0),
            parking: AtomicBool::new(crate::soft::config::switched_on("RVERBS_POLL_PARK")),
            yielding: crate::soft::config::switched_on("RVERBS_POLL_YIELD"),
            stalls: AtomicU64::new(0),
        }));
        *bell = Some(made);
        Ok(made)
    }

    /// A completion was pushed: wakes the parked threads.
    pub(crate) fn ring(&self) {
        self.pushed.fetch_add(1, Ordering::SeqCst);
        self.wake();
    }

    /// Whether pollers may park.
    pub(crate) fn parking(&self) -> bool {
        self.parking.load(Ordering::Relaxed)
    }

    /// Parks that stalled the program so far.
    pub(crate) fn stalls(&self) -> u64 {
        self.stalls.load(Ordering::Relaxed)
    }

    /// The calling thread posts work: if its last park ran out its time and
    /// it has not polled since, the program had work of its own to do
    /// meanwhile, and parking stops (see the module docs).
    pub(crate) fn note_post(&self) {
        if PARK_RAN_OUT.take().is_some() {
            self.stalls.fetch_add(1, Ordering::Relaxed);
            if self.parking.swap(false, Ordering::Relaxed) {
                tracing::debug!(
                    "a poller parked until its time ran out, then posted work instead of polling \
                     again: this program has work of its own in its poll loop, so pollers no \
                     longer park (they spin)"
                );
            }
        }
    }

    /// Wakes the parked threads without a completion (a device going away).
    pub(crate) fn wake(&self) {
        if self.parked.load(Ordering::SeqCst) > 0 {
            let _ = self.fd.write(1);
        }
    }
}

/// The most a waiter spins before it sleeps (and what a probe spins): a
/// few round trips on a free core, so ping-pong and streams keep spinning.
pub(crate) const MAX_SPIN: Duration = Duration::from_micros(50);
/// Longest one park lasts when no timer is due sooner (a packet, a
/// completion in any CQ of the process, or a due timer ends it sooner):
/// longer than a scheduler tick (up to 10 ms at 100 Hz), so the sleep's
/// own timeout costs no timer programming (see the module docs).
pub(crate) const PARK_LIMIT: Duration = Duration::from_millis(12);
/// Two empty polls further apart than this are not one spin: the program
/// did something else between them (or was preempted), and a new streak
/// starts — a program that polls now and then while it computes is never
/// parked.
const TIGHT_GAP: Duration = Duration::from_micros(20);
/// A poll that finds a completion this long after the last empty one was
/// not spinning when it came (an empty poll takes a microsecond or two).
const AWAY: Duration = Duration::from_micros(10);
/// A wait that ends sooner than this teaches the budget nothing.
const SHORT_WAIT: Duration = Duration::from_micros(3);
/// Waits between probes with the full budget: from `PROBE_FIRST`, doubled
/// after each probe that did not pay, up to `PROBE_LAST`.
const PROBE_FIRST: u32 = 16;
const PROBE_LAST: u32 = 1024;

/// How long a waiter spins before it sleeps, learnt from its waits (see the
/// module docs). Shared by the threads that poll one CQ, hence atomics; a
/// race merely blurs the estimate.
#[derive(Debug)]
pub(crate) struct SpinBudget {
    /// Nanoseconds to spin.
    budget: AtomicU64,
    /// Waits started since the last probe.
    since_probe: AtomicU32,
    /// Waits between probes.
    probe_every: AtomicU32,
}

impl Default for SpinBudget {
    fn default() -> Self {
        SpinBudget {
            budget: AtomicU64::new(nanos(MAX_SPIN)),
            since_probe: AtomicU32::new(0),
            probe_every: AtomicU32::new(PROBE_FIRST),
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The spin a wait gets: the budget, or the full one when it probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spin {
    nanos: u64,
    probe: bool,
}

impl Spin {
    /// Whether `spun` nanoseconds used it up.
    pub(crate) fn spent(self, spun: u64) -> bool {
        spun >= self.nanos
    }
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitEnd {
    /// While spinning, after this many nanoseconds.
    Spun(u64),
    /// After the waiter slept.
    Slept,
}

impl SpinBudget {
    /// The spin for a wait starting now.
    pub(crate) fn start(&self) -> Spin {
        let max = nanos(MAX_SPIN);
        let budget = self.budget.load(Ordering::Relaxed);
        if budget < max {
            let n = self.since_probe.fetch_add(1, Ordering::Relaxed) + 1;
            if n >= self.probe_every.load(Ordering::Relaxed) {
                self.since_probe.store(0, Ordering::Relaxed);
                return Spin {
                    nanos: max,
                    probe: true,
                };
            }
        }
        Spin {
            nanos: budget,
            probe: false,
        }
    }

    /// A wait with `spin` ended so. A wait that ended within
    /// [`SHORT_WAIT`] teaches nothing: it would have ended as soon without
    /// a spin (the answer was already there).
    pub(crate) fn finish(&self, spin: Spin, end: WaitEnd) {
        let max = nanos(MAX_SPIN);
        match end {
            WaitEnd::Spun(waited) if waited <= nanos(SHORT_WAIT) => {
                if spin.probe {
                    // Not a probe after all: the next wait probes.
                    let every = self.probe_every.load(Ordering::Relaxed);
                    self.since_probe.store(every, Ordering::Relaxed);
                }
            }
            WaitEnd::Spun(waited) => {
                // Spinning paid: spin at least twice as long as this wait.
                let b = self.budget.load(Ordering::Relaxed);
                self.budget
                    .store(b.max(waited.saturating_mul(2)).min(max), Ordering::Relaxed);
                if spin.probe {
                    self.probe_every.store(PROBE_FIRST, Ordering::Relaxed);
                }
            }
            WaitEnd::Slept if spin.probe => {
                let every = self.probe_every.load(Ordering::Relaxed);
                self.probe_every
                    .store((every * 2).min(PROBE_LAST), Ordering::Relaxed);
            }
            WaitEnd::Slept => {
                let b = self.budget.load(Ordering::Relaxed);
                self.budget.store(b / 2, Ordering::Relaxed);
            }
        }
    }

    /// The current budget (for tests and counters).
    #[cfg(test)]
    fn budget(&self) -> Duration {
        Duration::from_nanos(self.budget.load(Ordering::Relaxed))
    }
}

/// A CQ's view of the threads polling it while it is empty: the current
/// streak of empty polls, and its [`SpinBudget`].
#[derive(Debug, Default)]
pub(crate) struct PollerWait {
    /// Engine time (nanoseconds, plus one) of the streak's first empty
    /// poll; 0: no streak.
    since: AtomicU64,
    /// Engine time of the last empty poll.
    last: AtomicU64,
    /// This streak's spin, in nanoseconds (`u64::MAX` marks a probe).
    spin: AtomicU64,
    /// This streak parked at least once.
    parked: AtomicBool,
    /// The process's count of pushed completions at the last empty poll.
    pushed_seen: AtomicU64,
    budget: SpinBudget,
}

impl PollerWait {
    /// Whether a streak of empty polls is going on (a poll that finds
    /// completions then ends it: [`found`](Self::found)).
    pub(crate) fn waiting(&self) -> bool {
        self.since.load(Ordering::Relaxed) != 0
    }

    /// A poll at engine time `now` found completions: a streak of empty
    /// polls, if there was one, ends (and teaches the budget).
    pub(crate) fn found(&self, now: u64) {
        let since = self.since.load(Ordering::Relaxed);
        if since == 0 {
            return;
        }
        let now = now + 1;
        let last = self.last.swap(now, Ordering::Relaxed);
        self.since.store(0, Ordering::Relaxed);
        let end = if self.parked.load(Ordering::Relaxed) || now.saturating_sub(last) > nanos(AWAY) {
            // Slept, or was away when the completion came: preempted (on a
            // shared core, the peer's turn ran while the spin was cut
            // short, which would otherwise look paid), or at other work.
            // Either way spinning did not catch it.
            WaitEnd::Slept
        } else {
            WaitEnd::Spun(now.saturating_sub(since))
        };
        self.budget.finish(self.current_spin(), end);
    }

    fn current_spin(&self) -> Spin {
        match self.spin.load(Ordering::Relaxed) {
            u64::MAX => Spin {
                nanos: nanos(MAX_SPIN),
                probe: true,
            },
            n => Spin {
                nanos: n,
                probe: false,
            },
        }
    }

    /// A poll at engine time `now` found the CQ empty, with `pushed`
    /// completions pushed to the process's CQs so far (see
    /// [`Engine::pushed`]): whether the poller has spun its budget and
    /// should park.
    ///
    /// It never parks on the first empty poll of a wait — the end of the
    /// usual "poll until empty" loop, after which the program answers what
    /// it found — nor while completions land in other CQs of the process
    /// (a program polling several CQs in turn gets to them first).
    pub(crate) fn empty(&self, now: u64, pushed: u64) -> bool {
        let now = now + 1;
        let since = self.since.load(Ordering::Relaxed);
        let last = self.last.swap(now, Ordering::Relaxed);
        let moved = self.pushed_seen.swap(pushed, Ordering::Relaxed) != pushed;
        let tight = now.saturating_sub(last) <= nanos(TIGHT_GAP);
        if since == 0 || !tight {
            // A new streak (one left by a gap ended without a completion:
            // the program went off to do something else, and it teaches
            // nothing). A program that polls now and then, between other
            // work, starts a new one each time, so it never parks.
            self.since.store(now, Ordering::Relaxed);
            self.parked.store(false, Ordering::Relaxed);
            let spin = self.budget.start();
            let code = if spin.probe { u64::MAX } else { spin.nanos };
            self.spin.store(code, Ordering::Relaxed);
            return false;
        }
        // Another thread may have begun a streak after this one read the
        // clock: saturate.
        !moved && self.current_spin().spent(now.saturating_sub(since))
    }

    /// The poller parked.
    pub(crate) fn parking(&self) {
        self.parked.store(true, Ordering::Relaxed);
    }

    /// It woke up: the next poll is part of the same streak, however long
    /// the park was.
    pub(crate) fn woke(&self, now: u64) {
        self.last.store(now + 1, Ordering::Relaxed);
    }
}

/// How a [`park`](Engine::park) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parked {
    /// It did not sleep: work was due, or a completion already there.
    No,
    /// It slept until a packet came or its time was up.
    Slept,
    /// It slept until the bell rang (a completion in some CQ of the process).
    Rung,
}

impl Engine {
    /// A poll at `now` found the CQ whose wait is `wait` empty while the
    /// thread spins: gives the core away when [`SpinYields::empty_poll`]
    /// says so (see the module docs), unless `RVERBS_POLL_YIELD=0`.
    ///
    /// A yield of [`YIELD_HOGGED`] or more counts as a park, and the wait
    /// goes on across it as across a park: the thread was off its core, and
    /// spinning did not catch what came; and a gap that long between empty
    /// polls would otherwise start a new streak, whose spin budget starts
    /// afresh, so a spinner beside a CPU hog never parked. A shorter yield,
    /// which a peer took, does start a new streak: among four ping-pong
    /// pairs on two cores, keeping the wait across those too made the
    /// pollers park where yielding had handed the core over: four pairs'
    /// wire p99 was 2.32–2.65× blocking UDP against 1.79–2.15× without
    /// that, in three alternating runs.
    pub(crate) fn yield_while_spinning(&self, now: Instant, wait: &PollerWait) {
        if !self.bell.yielding {
            return;
        }
        let mut yields = YIELDS.get();
        if yields.empty_poll(now) {
            let before = Instant::now();
            std::thread::yield_now();
            let back = Instant::now();
            if yields.yielded(before, back) {
                wait.parking();
                wait.woke(self.nanos_at(back));
            }
        }
        YIELDS.set(yields);
    }

    /// Parks a thread that polls an empty CQ: one pass first (what is due
    /// runs and held ACKs go, so the sleeper is not woken just to send
    /// them), then, unless work is due, a completion was pushed to any CQ
    /// of the process meanwhile, or `ready` says the polled CQ has
    /// something, a sleep until a packet arrives, [`ring`](Self::ring) is
    /// called (on any device), the next timer is due, or [`PARK_LIMIT`]
    /// has passed. The
    /// engine thread stays off the socket meanwhile (and watches that the
    /// sleeper keeps up, see `thread`). How it ended.
    pub(crate) fn park(&self, now: Instant, cq: u64, ready: impl Fn() -> bool) -> Parked {
        let pushed = self.pushed();
        let links = self.links_changed.load(Ordering::SeqCst);
        // The socket, the bell, the same-host doorbell, and the multicast
        // groups' sockets.
        let mut fds: SmallVec<[RawFd; 4]> = SmallVec::new();
        // And the rings of same-host links.
        let mut rings: SmallVec<[RingWatch; 4]> = SmallVec::new();
        let pass = self.locked(|st| {
            progress(st, &self.mrs, Driver::Parking);
            st.links.watches(&mut rings);
            let fd = st.socket.as_ref().map(AsRawFd::as_raw_fd)?;
            fds.push(fd);
            fds.push(self.bell.fd.as_fd().as_raw_fd());
            fds.push(self.doorbell.as_fd().as_raw_fd());
            fds.extend(multicast::raw_fds(st));
            Some(next_deadline(st))
        });
        // No socket (the device is gone) or a failed engine: no sleep.
        let Ok(Some(deadline)) = pass else {
            return Parked::No;
        };
        let limit = now + PARK_LIMIT;
        let until = deadline.map_or(limit, |d| d.min(limit));
        let wait = until.saturating_duration_since(Instant::now());
        if wait.is_zero() {
            return Parked::No;
        }
        self.hold_socket(self.nanos_at(until), BUSY_POLL_GRACE);
        self.parked.fetch_add(1, Ordering::SeqCst);
        self.bell.parked.fetch_add(1, Ordering::SeqCst);
        // A completion pushed from here on rings the bell (`ring` sees the
        // count); one pushed since this call began moved `pushed`; one
        // pushed before that to the CQ polled is there for `ready`.
        let mut rung = false;
        let mut slept = false;
        if self.pushed() == pushed && !ready() {
            // Counted as a sleeper of each ring first, then one more look
            // (at the rings, and whether a link came since the snapshot).
            let records = local::sleep_begin(&rings);
            if !records && self.links_changed.load(Ordering::SeqCst) == links {
                let readable = sys::wait_readable(&fds, wait);
                // Woken by the bell or the doorbell alone: the socket had
                // nothing. (Not for a multicast socket, which the pass
                // must read, nor a timeout, when timers are due.)
                let only_bells = readable != 0 && readable & !0b110 == 0;
                SOCKET_SEEN_EMPTY.set(only_bells.then(|| (fds[0], Instant::now())));
                rung = readable & 2 != 0;
                if readable & 4 != 0 {
                    local::doorbell_heard(self);
                }
                slept = true;
                if readable == 0 && wait >= STALL_MIN {
                    PARK_RAN_OUT.set(Some(cq));
                }
            }
            local::sleep_end(&rings);
        }
        if self.parked.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Up before its time, perhaps: the engine thread may take the
            // socket back a grace after now, not after the planned end.
            self.busy_poll_until.store(
                self.nanos_at(Instant::now() + BUSY_POLL_GRACE),
                Ordering::SeqCst,
            );
        }
        if self.bell.parked.fetch_sub(1, Ordering::SeqCst) == 1 && rung {
            // The last one up silences the bell, and rings it again if
            // someone parked meanwhile (that ring may have been for them).
            // A ring it did not see is silenced by the next park, which it
            // ends at once.
            let _ = self.bell.fd.read();
            if self.bell.parked.load(Ordering::SeqCst) > 0 {
                let _ = self.bell.fd.write(1);
            }
        }
        match (slept, rung) {
            (false, _) => Parked::No,
            (true, false) => Parked::Slept,
            (true, true) => Parked::Rung,
        }
    }

    /// Completions pushed to the process's CQs so far.
    pub(crate) fn pushed(&self) -> u64 {
        self.bell.pushed.load(Ordering::SeqCst)
    }

    /// A completion was pushed: wakes the threads parked in the process.
    pub(crate) fn ring(&self) {
        self.bell.ring();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    #[test]
    fn budget_halves_when_waits_sleep_and_recovers_by_probing() {
        let b = SpinBudget::default();
        assert_eq!(b.budget(), MAX_SPIN);
        // Waits that ended while spinning keep the budget.
        for _ in 0..10 {
            let s = b.start();
            b.finish(s, WaitEnd::Spun(20 * US));
        }
        assert_eq!(b.budget(), MAX_SPIN);
        // Waits that had to sleep cut it down to nothing.
        let mut probes = 0;
        for _ in 0..200 {
            let s = b.start();
            probes += usize::from(s.probe);
            b.finish(s, WaitEnd::Slept);
        }
        assert_eq!(b.budget(), Duration::ZERO);
        assert!(probes > 0 && probes < 20, "{probes} probes");
        // Probes that fail come ever more rarely.
        assert!(b.probe_every.load(Ordering::Relaxed) > PROBE_FIRST);
        // Waits that were over at once teach nothing, even as probes.
        for _ in 0..2000 {
            let s = b.start();
            b.finish(s, WaitEnd::Spun(US));
        }
        assert_eq!(b.budget(), Duration::ZERO);
        // Once a probe finds the answer while spinning, spinning is back,
        // for twice as long as that wait took.
        let s = loop {
            let s = b.start();
            if s.probe {
                break s;
            }
            b.finish(s, WaitEnd::Slept);
        };
        assert_eq!(s.nanos, nanos(MAX_SPIN));
        b.finish(s, WaitEnd::Spun(10 * US));
        assert_eq!(b.budget(), Duration::from_micros(20));
        assert_eq!(b.probe_every.load(Ordering::Relaxed), PROBE_FIRST);
    }

    #[test]
    fn a_streak_parks_after_its_budget_and_gaps_start_a_new_one() {
        let w = PollerWait::default();
        assert!(!w.empty(0, 0));
        assert!(!w.empty(10 * US, 0));
        assert!(!w.empty(25 * US, 0));
        assert!(!w.empty(40 * US, 0));
        // Fifty microseconds of tight polling: park.
        assert!(w.empty(55 * US, 0));
        w.parking();
        w.woke(900 * US);
        // The wake-up continues the streak, which found its completion
        // after parking: the budget halves.
        assert!(w.empty(901 * US, 0));
        w.found(902 * US);
        assert_eq!(w.budget.budget(), MAX_SPIN / 2);
        // A program that polls now and then never parks.
        for k in 0..100 {
            assert!(!w.empty(2_000 * US + k * 100 * US, 0));
        }
        // A completion found right after a spin that was cut short (15 µs
        // since the last empty poll: the peer's turn on a shared core)
        // counts as not caught by spinning.
        let w = PollerWait::default();
        assert!(!w.empty(0, 0));
        assert!(!w.empty(2 * US, 0));
        w.found(17 * US);
        assert_eq!(w.budget.budget(), MAX_SPIN / 2);
        // One caught while spinning keeps it.
        assert!(!w.empty(100 * US, 0));
        assert!(!w.empty(102 * US, 0));
        w.found(104 * US);
        assert_eq!(w.budget.budget(), MAX_SPIN / 2);
    }

    #[test]
    fn a_spinner_yields_late_on_a_free_core_and_at_once_on_a_crowded_one() {
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        let mut y = SpinYields::new();
        // Free: no yield before YIELD_AFTER of spinning, then every
        // YIELD_EVERY.
        assert!(!y.empty_poll(at(0)));
        assert!(!y.empty_poll(at(10)));
        assert!(y.empty_poll(at(15)));
        y.yielded(at(15), at(15) + Duration::from_nanos(600));
        assert!(!y.crowded);
        assert!(!y.empty_poll(at(18)));
        assert!(y.empty_poll(at(21)));
        // A yield another thread took: crowded.
        y.yielded(at(21), at(40));
        assert!(y.crowded);
        y.found();
        // The next wait yields at its first empty poll, and again only
        // YIELD_EVERY later.
        assert!(y.empty_poll(at(100)));
        y.yielded(at(100), at(101));
        assert!(!y.empty_poll(at(103)));
        assert!(y.empty_poll(at(106)));
        // Quick yields in a row: free again (one more was counted above).
        for k in 0..QUICK_YIELDS_FREE - 1 {
            assert!(y.crowded, "after {k} more quick yields");
            y.yielded(at(106), at(106) + Duration::from_nanos(600));
        }
        assert!(!y.crowded);
        y.found();
        assert!(!y.empty_poll(at(200)));
        // A gap between empty polls starts a new spin: a program that polls
        // now and then, between work of its own, never yields for it.
        for k in 1..20 {
            assert!(!y.empty_poll(at(200 + k * 30)));
        }
    }

    #[test]
    fn a_spinner_whose_yields_a_hog_keeps_taking_stops_yielding_for_a_while() {
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        let mut y = SpinYields::new();
        assert!(!y.empty_poll(at(0)));
        assert!(y.empty_poll(at(15)));
        // Away for a whole slice, once: no more than crowded.
        y.yielded(at(15), at(4_015));
        assert!(y.crowded);
        y.found();
        assert!(y.empty_poll(at(4_020)));
        // Again, a slice after the first: a hog runs here.
        y.yielded(at(4_020), at(8_020));
        // No yield, in this wait or the next, until HOG_BACKOFF is over,
        // however long it spins.
        for k in 0..200 {
            assert!(!y.empty_poll(at(8_021 + k * 5)), "{k}");
        }
        y.found();
        assert!(!y.empty_poll(at(20_000)));
        // Then a crowded spinner yields again at once...
        let after = 8_020 + HOG_BACKOFF.as_micros() as u64;
        y.found();
        assert!(y.empty_poll(at(after)));
        // ... and a peer's short turn is no hog.
        y.yielded(at(after), at(after + 40));
        assert!(!y.empty_poll(at(after + 41)));
        assert!(y.empty_poll(at(after + 46)));
        // The hog again: twice the back-off.
        y.yielded(at(after + 46), at(after + 4_046));
        y.found();
        assert!(y.empty_poll(at(after + 4_050)));
        y.yielded(at(after + 4_050), at(after + 8_050));
        let back = after + 8_050;
        let twice = 2 * HOG_BACKOFF.as_micros() as u64;
        y.found();
        assert!(!y.empty_poll(at(back + twice - 1)));
        y.found();
        assert!(y.empty_poll(at(back + twice)));
        // Long yields far apart (more than HOG_WINDOW) show no hog.
        let later = back + twice + 2 * HOG_FORGET.as_micros() as u64;
        y.found();
        assert!(y.empty_poll(at(later)));
        y.yielded(at(later), at(later + 2_000));
        y.found();
        assert!(y.empty_poll(at(later + 50_000)));
        y.yielded(at(later + 50_000), at(later + 52_000));
        y.found();
        assert!(y.empty_poll(at(later + 52_001)));
    }

    #[test]
    fn never_parks_at_the_end_of_a_drain_nor_while_other_cqs_fill() {
        let w = PollerWait::default();
        // Spinning stopped paying: the budget is nothing.
        for _ in 0..30 {
            let s = w.budget.start();
            w.budget.finish(s, WaitEnd::Slept);
        }
        assert_eq!(w.budget.budget(), Duration::ZERO);
        // "Poll until empty": found, found, empty — the empty poll right
        // after completions does not park, the next one does.
        w.found(0);
        w.found(US);
        assert!(!w.empty(2 * US, 0));
        assert!(w.empty(3 * US, 0));
        // While completions land in other CQs of the process, no park.
        assert!(!w.empty(4 * US, 1));
        assert!(!w.empty(5 * US, 2));
        assert!(w.empty(6 * US, 2));
    }
}
