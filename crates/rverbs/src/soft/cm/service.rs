//! The connection manager's service for one device: the I/O around the
//! sans-IO [`CmAgent`].
//!
//! It opens the device's GSI QP ([`GsiPort`]) and runs one thread,
//! `rverbs-cm`, that sleeps in `ppoll(2)` on the port's inbox and a
//! wake-up eventfd, with the agent's next timer as timeout. On waking it
//! decodes the MADs that came ([`codec`]; one that is no CM message for
//! the agent is counted and dropped), runs due timers, sends what the
//! agent queued, and hands the agent's events to their owners — the
//! [`CmSink`] registered for the connection or listener — with no lock
//! held, one at a time, in order. Calls into the agent from users
//! ([`CmService::with_agent`]) send what they queue at once, on the
//! caller's thread, and wake the service for timers and events.
//!
//! When the process exits (`exit(3)`, or the end of `main`), a hook ends
//! every connection of every device's agent — DREQ for an established
//! one, REJ for one on its way — and sends those MADs before the process
//! is gone, as the kernel's CM does for a process whose rdma_cm file
//! closes: its peers get DISCONNECTED (or REJECTED) instead of waiting
//! for their QPs' transport errors. It runs from `.fini_array`, after the
//! program's own `atexit` handlers and static destructors, whose cleanup
//! still sees its connections. A killed process runs no hook; a forked
//! child that exits ends only the connections it made itself.
//!
//! Lock order: a sink may call into the service (and the verbs: a QP's
//! transitions take the engine's lock); the service never holds its lock
//! while calling a sink, and the engine never calls the service.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::time::TimeSpec;

use super::agent::{CmAgent, CmConfig, CmEvent, ConnId, ListenId};
use super::codec;
use crate::attr::Gid;
use crate::soft::engine::{peer_endpoint, Engine, GsiPort, NetStats, DEFAULT_PKEY, GSI_QPN};
use crate::soft::memory::random_u32;

/// Most MADs one step takes under the lock: a flood cannot keep calls and
/// timers out (the inbox's bell stays rung, so the next step follows at
/// once).
const MADS_PER_STEP: usize = 64;

/// Longest the service sleeps without a timer due (it also wakes for
/// MADs, calls and shutdown).
const IDLE_WAIT: Duration = Duration::from_secs(5);

/// Who an agent event goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Owner {
    /// A connection (or SIDR request).
    Conn(ConnId),
    /// A listener (its new connection requests).
    Listen(ListenId),
}

impl Owner {
    /// The owner of an event.
    fn of(event: &CmEvent) -> Owner {
        match event {
            CmEvent::ConnectRequest { listen, .. } | CmEvent::SidrRequest { listen, .. } => {
                Owner::Listen(*listen)
            }
            CmEvent::ConnectResponse { conn, .. }
            | CmEvent::Established { conn }
            | CmEvent::Rejected { conn, .. }
            | CmEvent::Unreachable { conn }
            | CmEvent::Disconnected { conn, .. }
            | CmEvent::TimewaitExit { conn }
            | CmEvent::SidrReply { conn, .. } => Owner::Conn(*conn),
        }
    }
}

/// Where a connection's or listener's events go.
pub(crate) trait CmSink: Send + Sync {
    /// An agent event for this owner. Runs on the service thread with no
    /// lock held: it may call back into `service`.
    fn on_event(&self, service: &CmService, event: CmEvent);

    /// The device this owner's connection or listener was on went away.
    fn on_device_removal(&self);
}

/// What the service counts besides the agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ServiceStats {
    /// MADs received that are no CM message the agent takes (another
    /// class, a LAP, a malformed one).
    pub(crate) undecodable: u64,
    /// Events for an owner that had gone (dropped).
    pub(crate) orphan_events: u64,
}

struct State {
    agent: CmAgent,
    sinks: HashMap<Owner, Weak<dyn CmSink>>,
    stats: ServiceStats,
}

struct Inner {
    port: GsiPort,
    wake: EventFd,
    stop: AtomicBool,
    state: Mutex<State>,
}

/// One device's connection manager service (a handle: clones share it).
#[derive(Clone)]
pub(crate) struct CmService {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CmService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmService")
            .field("local", &self.inner.port.local())
            .finish_non_exhaustive()
    }
}

/// The process's services, each with the process that started it (a
/// forked child inherits the list, and must not end its parent's
/// connections), for the exit hook.
static LIVE: Mutex<Vec<(u32, Weak<Inner>)>> = Mutex::new(Vec::new());

/// Has `inner`'s connections ended when the process exits (see the module
/// docs).
fn end_connections_at_exit(inner: &Arc<Inner>) {
    let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    live.retain(|(_, w)| w.strong_count() > 0);
    live.push((std::process::id(), Arc::downgrade(inner)));
}

/// The exit hook runs from `.fini_array`: at `exit(3)` after every
/// `atexit` handler and C++ static destructor of the program (so its own
/// exit-time cleanup — an `rdma_disconnect` and a wait for DISCONNECTED —
/// still finds its connections), and when a library holding rverbs is
/// unloaded.
#[used]
#[link_section = ".fini_array"]
static END_CONNECTIONS_AT_EXIT: extern "C" fn() = exit_hook;

/// The exit hook: every live service of this process ends its agent's
/// connections, and what that queues is sent now. A service whose lock
/// stays held (a thread stopped inside a call) is left alone rather than
/// waited for.
extern "C" fn exit_hook() {
    let _ = std::panic::catch_unwind(|| {
        let me = std::process::id();
        let live: Vec<Arc<Inner>> = LIVE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(pid, _)| *pid == me)
            .filter_map(|(_, w)| w.upgrade())
            .collect();
        for inner in live {
            let service = CmService { inner };
            let deadline = Instant::now() + Duration::from_millis(100);
            let mut st = loop {
                match service.inner.state.try_lock() {
                    Ok(st) => break Some(st),
                    Err(std::sync::TryLockError::Poisoned(p)) => break Some(p.into_inner()),
                    Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(std::sync::TryLockError::WouldBlock) => break None,
                }
            };
            if let Some(st) = st.as_mut() {
                if st.agent.destroy_all(Instant::now()) > 0 {
                    service.transmit(st);
                }
            }
        }
    });
}

impl CmService {
    /// Opens `engine`'s GSI QP for an agent of the port with GID
    /// `local_gid` on CA `ca_guid`, and starts the service thread.
    pub(crate) fn start(engine: &Engine, local_gid: Gid, ca_guid: u64) -> io::Result<CmService> {
        let port = engine.open_gsi()?;
        let agent = CmAgent::new(
            local_gid,
            ca_guid,
            CmConfig::default(),
            Box::new(random_u32),
        );
        let inner = Arc::new(Inner {
            port,
            wake: EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?,
            stop: AtomicBool::new(false),
            state: Mutex::new(State {
                agent,
                sinks: HashMap::new(),
                stats: ServiceStats::default(),
            }),
        });
        let service = CmService {
            inner: Arc::clone(&inner),
        };
        end_connections_at_exit(&inner);
        let thread = service.clone();
        std::thread::Builder::new()
            .name("rverbs-cm".into())
            .spawn(move || thread.run())?;
        Ok(service)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under the lock leaves the agent as it was between two
        // calls (each call is one state change): go on with it.
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the agent with the current time; what it queues to send
    /// goes out now, its events on the service thread.
    pub(crate) fn with_agent<R>(&self, f: impl FnOnce(&mut CmAgent, Instant) -> R) -> R {
        let mut st = self.lock();
        let r = f(&mut st.agent, Instant::now());
        self.transmit(&mut st);
        drop(st);
        self.wake();
        r
    }

    /// Runs `f` on the agent, which makes a connection or listener, and
    /// sends that one's events to `sink` — registered before anything `f`
    /// queued goes out, so no answer can come back to nobody.
    pub(crate) fn with_agent_for<T, E>(
        &self,
        sink: Weak<dyn CmSink>,
        owner: impl FnOnce(&T) -> Owner,
        f: impl FnOnce(&mut CmAgent, Instant) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut st = self.lock();
        let made = f(&mut st.agent, Instant::now());
        if let Ok(t) = &made {
            st.sinks.insert(owner(t), sink);
        }
        self.transmit(&mut st);
        drop(st);
        self.wake();
        made
    }

    /// Sends `owner`'s events to `sink` from now on.
    pub(crate) fn set_sink(&self, owner: Owner, sink: Weak<dyn CmSink>) {
        self.lock().sinks.insert(owner, sink);
    }

    /// `owner`'s events go nowhere any more.
    pub(crate) fn remove_sink(&self, owner: Owner) {
        self.lock().sinks.remove(&owner);
    }

    /// Adds the connection manager's counters to a device's.
    pub(crate) fn add_counters(&self, stats: &mut NetStats) {
        let st = self.lock();
        let cm = st.agent.stats();
        let d = &cm.drops;
        stats.cm_sent += cm.sent.total();
        stats.cm_received += cm.received.total();
        stats.cm_retransmitted += cm.retransmitted.total();
        stats.cm_timeouts += cm.timeouts;
        stats.cm_dropped += d.unknown_conn
            + d.wrong_state
            + d.malformed
            + d.backlog_full
            + d.overloaded
            + st.stats.undecodable
            + st.stats.orphan_events;
    }

    /// The device went away: stops the service thread (the port closes
    /// when the last handle goes) and tells every id that had a connection
    /// or listener on it (DEVICE_REMOVAL), once each, with no lock held.
    pub(crate) fn shutdown(&self) {
        self.inner.stop.store(true, Ordering::Release);
        self.wake();
        // Taken out under the lock, used and dropped after it: the last
        // handle on an id going away here takes the lock again.
        let sinks = std::mem::take(&mut self.lock().sinks);
        let mut told: Vec<Arc<dyn CmSink>> = Vec::new();
        for sink in sinks.into_values().filter_map(|s| s.upgrade()) {
            if !told.iter().any(|t| Arc::ptr_eq(t, &sink)) {
                sink.on_device_removal();
                told.push(sink);
            }
        }
    }

    fn wake(&self) {
        let _ = self.inner.wake.write(1);
    }

    /// Sends every message the agent queued.
    fn transmit(&self, st: &mut State) {
        while let Some(t) = st.agent.poll_transmit() {
            let mad = codec::encode(&t.msg);
            let to = peer_endpoint(t.to.to_ip());
            if let Err(e) = self.inner.port.send(to, GSI_QPN, DEFAULT_PKEY, &mad) {
                // Counted by the port; the agent's timers resend.
                tracing::debug!("CM MAD to {to} not sent: {e}");
            }
        }
    }

    /// The service thread.
    fn run(self) {
        loop {
            if self.inner.stop.load(Ordering::Acquire) {
                return;
            }
            let due = self.lock().agent.poll_timeout();
            let wait = due.map_or(IDLE_WAIT, |t| {
                t.saturating_duration_since(Instant::now()).min(IDLE_WAIT)
            });
            {
                let mut fds = [
                    PollFd::new(self.inner.port.as_fd(), PollFlags::POLLIN),
                    PollFd::new(self.inner.wake.as_fd(), PollFlags::POLLIN),
                ];
                let _ = ppoll(&mut fds, Some(TimeSpec::from_duration(wait)), None);
            }
            let _ = self.inner.wake.read();
            for event in self.step() {
                // The sink is looked up as its event's turn comes: one
                // registered by an event before it (a request's new id)
                // gets the events that follow in the same batch.
                let owner = Owner::of(&event);
                let sink = {
                    let mut st = self.lock();
                    let sink = st.sinks.get(&owner).and_then(Weak::upgrade);
                    if sink.is_none() {
                        st.stats.orphan_events += 1;
                    }
                    sink
                };
                match sink {
                    Some(sink) => sink.on_event(&self, event),
                    None => tracing::debug!("CM event for a gone {owner:?} dropped: {event:?}"),
                }
            }
        }
    }

    /// Takes (at most [`MADS_PER_STEP`] of) the MADs that came, runs due
    /// timers, sends, and returns the events.
    fn step(&self) -> Vec<CmEvent> {
        let mut st = self.lock();
        let now = Instant::now();
        for _ in 0..MADS_PER_STEP {
            let Some(mad) = self.inner.port.recv() else {
                break;
            };
            match codec::decode(&mad.bytes) {
                Ok(msg) => st
                    .agent
                    .handle_message(now, Gid::from_ip(mad.from.ip()), msg),
                Err(e) => {
                    st.stats.undecodable += 1;
                    tracing::debug!("MAD from {} dropped: {e:?}", mad.from);
                }
            }
        }
        if st.agent.poll_timeout().is_some_and(|t| t <= now) {
            st.agent.handle_timeout(now);
        }
        self.transmit(&mut st);
        std::iter::from_fn(|| st.agent.poll_event()).collect()
    }
}
