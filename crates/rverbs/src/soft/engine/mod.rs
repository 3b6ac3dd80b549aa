//! The device's network engine: its UDP socket, the QP table, and progress
//! — one file per job:
//! - here: the engine's lifecycle (create, add and remove QPs, shut down),
//!   its front door for the verbs (`modify_qp`, `post_send`, `post_recv`,
//!   `qp_state` …), and who makes progress when;
//! - `slot`: a QP as the engine holds it, and where its events go;
//! - `rx` and `tx`: receiving and transmitting packets;
//! - `thread`: the engine thread;
//! - `park`: how a poller that finds nothing waits (spin while it pays,
//!   then sleep on the socket and a completion bell);
//! - `qpn`: where QP numbers come from (unpredictable, unique);
//! - `multicast`: UD multicast groups;
//! - `gsi`: QP 1, where the connection manager's MADs come and go;
//! - `stats`: the counters.
//!
//! The engine knows the MR table, its socket, its limits and its
//! addresses, and nothing of the device or the objects above it: a QP's
//! completions and events go out through its [`QpEvents`].
//!
//! All transport state sits behind one lock. Whoever holds it makes
//! progress — receive a batch of datagrams, run due timers, transmit what
//! QPs owe, hand completions to CQs and events to contexts:
//! - a thread posting work transmits it at once on its own thread;
//! - a thread polling an empty CQ drives progress itself when the lock is
//!   free (so a busy-polling application needs no second spinning thread);
//! - the engine thread sleeps in `ppoll(2)` on the socket and a wake-up
//!   eventfd, with the earliest timer as timeout, so an idle device costs no
//!   CPU;
//! - while an application thread busy-polls a CQ, the engine thread leaves
//!   the socket to it (watching only timers and its wake-up), so the two do
//!   not fight over the lock; it takes the socket back once the polling
//!   stops for `BUSY_POLL_GRACE` (`CROWDED_GRACE` where the poller shares
//!   its core) or the application arms a CQ to sleep, and
//!   steps in meanwhile when packets wait while the pollers sleep or lag;
//! - a busy poller that has spun its budget parks (`park`): it sleeps until
//!   a packet arrives or a completion lands, so on shared cores it leaves
//!   the core to the peer it waits for.
//!
//! A panic while the lock is held — on the engine thread or in a pass an
//! application thread runs — fails the engine: every critical section runs
//! under `catch_unwind`, the engine is marked failed before the lock is
//! let go, and from then on nothing touches the state again (it may be
//! half-updated): the front door answers as for a gone QP (the verbs layer
//! says EIO), pollers find nothing to do, and the device is told once
//! ([`Engine::on_failure`]) so it raises `IBV_EVENT_DEVICE_FATAL`.
//!
//! Every packet carries an ICRC computed for the IP header Linux will write
//! (`IpUdpHeaders::linux`): the socket is unconnected with Don't Fragment
//! set, so the IPv4 ID is 0, or k for segment k of a GSO send. Received
//! packets are checked for that header first; for other senders the ID is
//! solved for (`rx`).

mod gsi;
mod local;
mod multicast;
mod park;
mod qpn;
mod rx;
mod slot;
mod stats;
mod thread;
mod tx;

use std::any::Any;
use std::collections::{BTreeSet, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{setsockopt, sockopt};
use rverbs_wire::icrc::{Ipv4IdSolver, ROCE_V2_PORT};

use crate::qp_attr::QpCaps;
use crate::soft::keymap::KeyMap;
use crate::soft::memory::MrTable;
use crate::soft::sys;
use crate::soft::transport::rc::{AckPolicy, RcQp};
use crate::soft::transport::ud::MULTICAST_QPN;
use crate::soft::transport::{PayloadRef, RecvWqe};
use crate::wr::QpState;

use gsi::GsiInbox;
pub(crate) use gsi::{GsiPort, DEFAULT_PKEY, GSI_QPN, MAD_LEN};
pub(crate) use multicast::AttachError;
use multicast::McastGroup;
use park::Bell;
pub(crate) use park::{note_found, note_poll, Parked, PollerWait};
use qpn::QpnSequence;
use rx::Received;
pub(crate) use slot::{
    CqFull, QpChange, QpEvents, RecvRefusal, SendRefusal, SendRequest, TransportConfig,
};
use slot::{QpSlot, Refused};
pub use stats::NetStats;
pub(crate) use thread::Watch;
use tx::TxPacket;

/// Largest RoCE packet the engine builds: headers, a 4096-byte MTU, pad, ICRC.
const MAX_PACKET: usize = 4096 + 128;
/// Bytes of one receive: the largest GRO batch (a UDP datagram's limit).
const RX_BUFFER: usize = 64 * 1024;
/// Datagrams (or GRO batches) received per pass before timers and
/// transmission get a turn.
const RX_BUDGET: usize = 64;
/// Longest a pass keeps receiving: the ACKs it owes leave at its end, so
/// on a slow receiver (a debug build, a busy core) a pass through a full
/// budget of GRO batches held them for tens of milliseconds, past the
/// sender's retransmission timer.
const RX_PASS_TIME: Duration = Duration::from_micros(250);
// A same-host packet (see `local`) is built in the transmit buffer.
const _: () = assert!(TX_BUFFER >= local::LOCAL_SEGMENT as usize + 128);

/// Largest UDP payload one send (a GSO batch) may carry.
const MAX_BATCH_BYTES: usize = 65_000;
/// The transmit buffer: room for a few full batches, so one system call
/// can send them all (payloads from MRs leave their room unwritten).
const TX_BUFFER: usize = 4 * (MAX_BATCH_BYTES + MAX_PACKET);
/// Most packets one QP sends in one pass; the rest waits for the next.
const FLUSH_BUDGET: usize = 256;
/// Longest one QP keeps sending in a pass (looked at every
/// [`FLUSH_CHECK_EVERY`] packets), as for receiving ([`RX_PASS_TIME`]);
/// the rest waits for the next pass, which receives first. A pass holds the
/// device's lock, and the engine thread runs in 100 µs slices
/// (`thread::ENGINE_SLICE`): beside CPU hogs, whose slices are milliseconds
/// long, a debug build's pass that sent a window of 128 packets held the
/// lock for 4–12 ms, and the ACKs of a QP pair on that device (its receive
/// side waiting for the lock) came after the 10 ms retransmission floor —
/// spurious resends in 9 of 30 runs of `tests/many_sges.rs` beside two
/// hogs; 2 of 60 with this bound. (100 µs did as well there, but cost a
/// release build's 1 MiB READ over the wire about 30 %: 1.85–2.34 GB/s
/// against 2.81–3.40, alternating runs; 250 µs, 2.73–3.60.)
const FLUSH_PASS_TIME: Duration = Duration::from_micros(250);
/// Packets a QP builds between looks at the clock for [`FLUSH_PASS_TIME`].
const FLUSH_CHECK_EVERY: usize = 16;
/// Most segments in one GSO send.
const MAX_BATCH_SEGMENTS: usize = 64;
/// Socket buffer sizes asked for (more with the privilege to force them;
/// without it the kernel caps them at net.core.rmem_max / wmem_max).
const SOCKET_BUFFER: usize = 4 << 20;
const SOCKET_BUFFER_FORCED: usize = 16 << 20;
/// How long after an application's last poll of an empty CQ the engine
/// thread keeps off the socket.
const BUSY_POLL_GRACE: Duration = Duration::from_micros(500);
/// The same for a poller whose yields show it shares its core
/// (`park::polling_crowded`): the engine thread then looks only this often
/// whether the pollers still poll (see `thread::QUIET_WATCHDOG`). Each of
/// its looks takes a core from a poller at once (the thread's short slice),
/// and a program that busy-polls without a pause keeps the engine thread
/// looking every grace: among four ping-pong pairs on two cores that was
/// 2,000 wake-ups a second per process. In 18 alternating runs of four
/// wire pairs, the p99 half round trip went from 103–203 µs (median of the
/// runs 128 µs) to 84–199 µs (106 µs), and the CPU per message from
/// 1.74–2.69× to 1.49–2.26× that of four blocking UDP pairs (docs/design.md
/// has the rest). The cost: a program that stops polling without arming a
/// CQ leaves what arrives meanwhile for up to this long (a free core's
/// poller, with the shorter grace, for up to 500 µs).
const CROWDED_GRACE: Duration = Duration::from_millis(2);

/// Longest a due timer waits for a pass that reads the socket dry. Beside
/// two CPU hogs, a debug build's engine can take more than 1 ms to work
/// through what a window of packets left in its socket, the ACK behind it:
/// with 1 ms, 7 of 739 runs of `tests/many_sges.rs` resent for that alone
/// (the timer run 1.0–1.9 ms late from a pass that had not read the socket
/// dry); with 2 ms, none of 500. A timer this late then waits once more
/// (`LATE_TIMER`, as long again).
const TIMER_DEFER: Duration = Duration::from_millis(2);

/// Where an injected panic strikes (the `fault-injection` feature: tests
/// only).
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PanicSite {
    /// A progress pass on the device's engine thread that receives a
    /// packet.
    EngineThread,
    /// A progress pass on an application thread (one that polls a CQ)
    /// that receives a packet.
    PollingThread,
    /// The transmit a post (or any QP verb) runs on the caller's thread,
    /// after the verb's own change.
    Post,
}

/// What the device allows the engine.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EngineLimits {
    /// Multicast groups the device may join (`max_mcast_grp`).
    pub(crate) max_mcast_grp: u32,
    /// QPs one group may have attached (`max_mcast_qp_attach`).
    pub(crate) max_mcast_qp_attach: u32,
}

struct State {
    socket: Option<UdpSocket>,
    groups: Vec<McastGroup>,
    local: SocketAddr,
    qps: KeyMap<QpSlot>,
    /// Where new QP numbers come from.
    qpns: QpnSequence,
    /// QPs that may owe packets or events.
    dirty: Vec<u32>,
    /// Every QP's next timer (or an earlier time), earliest first: finding
    /// what is due, or when to wake, costs no scan of all QPs.
    timers: BTreeSet<(Instant, u32)>,
    /// QPs that held an ACK back in a flush (they may hold it still).
    held_acks: Vec<u32>,
    stats: NetStats,
    /// Finds the IPv4 ID of packets from senders that number theirs.
    id_solver: Ipv4IdSolver,
    rx: Vec<u8>,
    /// A second receive buffer, for while `rx_left` holds the first.
    rx_spare: Vec<u8>,
    /// Segments of a received batch not handled yet.
    rx_left: Option<Received>,
    tx: Vec<u8>,
    /// Payloads of the batch being built that go straight from MRs.
    tx_refs: Vec<PayloadRef>,
    /// Packets of the batch being built.
    tx_pkts: Vec<TxPacket>,
    /// The kernel takes UDP GSO sends (cleared on the first refusal).
    gso: bool,
    /// When the engine thread will wake up by itself (`None`: never).
    thread_wakes_at: Option<Instant>,
    /// A panic a test armed (see `crate::fault`).
    #[cfg(feature = "fault-injection")]
    armed_panic: Option<PanicSite>,
    /// How long the next QP verb holds the lock after its transmit (a test
    /// armed it, see `crate::fault`).
    #[cfg(feature = "fault-injection")]
    armed_stall: Option<Duration>,
    /// Bytes the RC QPs' exchanges may still put into receiving sockets
    /// (packets in flight, each costed by [`in_flight_cost`]), summed over
    /// the QPs as they were last counted.
    in_flight: usize,
    /// The most `in_flight` may reach (see [`in_flight_limit`]).
    in_flight_limit: usize,
    /// QPs that wanted to send more and were held by that budget, in the
    /// order they began to wait: they get the room that frees up first.
    budget_queue: VecDeque<u32>,
    /// The order a flush serves QPs in (kept for its capacity).
    flush_order: Vec<u32>,
    /// Where MADs for QP 1 go (see `gsi`).
    gsi: Arc<GsiInbox>,
    /// Links to devices of this host (see `local`).
    links: local::Links,
    /// Where a same-host packet whose payload stays in its sender's memory
    /// is rebuilt around it (see `rx::receive_local`).
    local_packet: Vec<u8>,
    /// QPs a full same-host ring held back: a pass looks at them again
    /// after `local::RING_FULL_RECHECK`.
    ring_blocked: Vec<u32>,
    /// When a pass last read the socket (see `rx::receive`).
    socket_read_at: Option<Instant>,
    /// Since when the socket's reads found nothing (`None`: the last one
    /// found a datagram).
    socket_quiet_since: Option<Instant>,
}

/// What one packet in flight is taken to cost a receiving socket's buffer:
/// the kernel charges a datagram's whole allocation (its `truesize`). A
/// stock 425,984-byte buffer held 50 datagrams of 4,156 bytes (8.5 KiB
/// each) and 184 of 1,084 bytes (2.3 KiB).
pub(super) fn in_flight_cost(mtu: u32) -> usize {
    (mtu as usize + 128).next_power_of_two() + 768
}

/// The device's budget of bytes in flight over all its RC QPs, for a
/// socket whose receive buffer is `rx_buffer` bytes (as the kernel reports
/// it), on the guess that the peer's is as large (the same host, the same
/// defaults): that much, so a receiver that stops draining its socket for a
/// while (descheduled, or a debug build) still loses nothing of ours. Per-QP
/// congestion windows alone let a thousand QPs put megabytes in flight at
/// their minimum, far past a stock buffer, and the losses that follow cut
/// every window and resend much of it. Twice the buffer did as well in
/// release builds (none resent), but in a debug build's CI run some of
/// 1,000 QPs lost their resends 8 times running (RETRY_EXC_ERR). At least
/// 16 packets of the largest MTU.
fn in_flight_limit(rx_buffer: usize) -> usize {
    rx_buffer.max(16 * in_flight_cost(4096))
}

/// The engine failed (a panic struck while its lock was held): its state
/// is not touched again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Failed;

/// What the device does when its engine fails (raise DEVICE_FATAL).
type FailureHook = Box<dyn Fn() + Send + Sync>;

/// The network engine of one device.
pub(crate) struct Engine {
    state: Mutex<State>,
    /// A panic struck while the state was locked: set before the lock is
    /// let go, so whoever locks next sees it and leaves the state alone.
    failed: AtomicBool,
    /// The device was told of the failure (it is told once).
    failure_told: AtomicBool,
    /// What to do when the engine fails (see [`on_failure`](Self::on_failure)).
    failure_hook: OnceLock<FailureHook>,
    /// The socket's address (for the log).
    local_addr: SocketAddr,
    waker: EventFd,
    /// The device's doorbell for its same-host links: given to each peer,
    /// which writes it when it pushed records into a ring whose consumer
    /// (this device's engine thread or a parked poller) sleeps; those
    /// sleepers watch it.
    doorbell: EventFd,
    /// Doorbells a sleeper heard (`local_doorbells_received`), counted
    /// without the lock.
    doorbells_heard: AtomicU64,
    thread_started: AtomicBool,
    stopped: AtomicBool,
    /// Registered memory, which every access goes through.
    mrs: Arc<MrTable>,
    /// What the device allows (multicast groups and attachments).
    limits: EngineLimits,
    /// The interface the socket's address is on (0: unknown).
    ifindex: u32,
    /// The receive buffer the kernel gave the socket, in bytes.
    rx_buffer: usize,
    /// Time base of `busy_poll_until`.
    epoch: Instant,
    /// Until when (nanoseconds after `epoch`) an application thread counts
    /// as busy-polling: the engine thread then leaves the socket alone.
    busy_poll_until: AtomicU64,
    /// The engine thread sleeps without watching the socket.
    thread_off_socket: AtomicBool,
    /// Threads blocked waiting for `state`.
    waiting: AtomicUsize,
    /// Bumped whenever the set of multicast sockets changes (the engine
    /// thread then polls the new set).
    groups_changed: AtomicU64,
    /// Threads parked on the socket (see `park`).
    parked: AtomicU32,
    /// The last busy poller shared its core (see [`CROWDED_GRACE`]).
    pollers_crowded: AtomicBool,
    /// When (nanoseconds after `epoch`) an application thread last polled
    /// an empty CQ.
    last_poll: AtomicU64,
    /// Wakes parked threads when a completion lands in a CQ (the
    /// process's, see `park`).
    bell: &'static Bell,
    /// Bumped when a same-host link is added (a parked poller's ring
    /// snapshot is then stale: it does not sleep on it).
    links_changed: AtomicU64,
    /// Answers same-host handshakes (see `local`) while the device lives:
    /// closed with its socket, so a device that takes the address next can
    /// answer for it.
    local_listener: Mutex<Option<crate::soft::local::handshake::LocalListener>>,
}

impl Engine {
    /// An engine on a bound socket, whose address is on interface
    /// `ifindex` (0: unknown), reaching registered memory through `mrs`;
    /// the thread starts when the device asks
    /// ([`start_thread`](Self::start_thread)).
    pub(crate) fn new(
        socket: UdpSocket,
        ifindex: u32,
        mrs: Arc<MrTable>,
        limits: EngineLimits,
    ) -> io::Result<Engine> {
        socket.set_nonblocking(true)?;
        let local = socket.local_addr()?;
        sys::set_dont_fragment(&socket, local.is_ipv6())?;
        // Multicast sends leave by the device's interface, not the default
        // route's (best effort: unicast does not depend on it).
        let _ = match local.ip() {
            IpAddr::V4(v4) => sys::set_multicast_if_v4(&socket, v4),
            IpAddr::V6(_) if ifindex != 0 => sys::set_multicast_if_v6(&socket, ifindex),
            IpAddr::V6(_) => Ok(()),
        };
        // Room for bursts: each QP may have a window of packets in flight
        // before the receiver drains its socket.
        // RVERBS_SOCKET_BUFFER (bytes) overrides the sizes, to tune a host
        // or to try the data path with a small stock buffer.
        let wanted = std::env::var("RVERBS_SOCKET_BUFFER")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok());
        let (forced, asked) = match wanted {
            Some(n) => (n, n),
            None => (SOCKET_BUFFER_FORCED, SOCKET_BUFFER),
        };
        if setsockopt(&socket, sockopt::RcvBufForce, &forced).is_err() {
            let _ = setsockopt(&socket, sockopt::RcvBuf, &asked);
        }
        if setsockopt(&socket, sockopt::SndBufForce, &forced).is_err() {
            let _ = setsockopt(&socket, sockopt::SndBuf, &asked);
        }
        let rx_buffer =
            nix::sys::socket::getsockopt(&socket, sockopt::RcvBuf).unwrap_or(SOCKET_BUFFER);
        // RVERBS_GSO=0 sends one datagram per packet (up to eight per
        // sendmmsg): for a capture that shows one packet per send, or a
        // kernel whose GSO misbehaves. The engine also falls back to that
        // by itself when the kernel refuses a GSO send.
        let gso = crate::soft::config::switched_on("RVERBS_GSO");
        // GRO: take a batch of equal-sized datagrams in one receive.
        let _ = setsockopt(&socket, sockopt::UdpGroSegment, &true);
        let waker = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        let doorbell = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(Engine {
            state: Mutex::new(State {
                socket: Some(socket),
                groups: Vec::new(),
                local,
                qps: KeyMap::default(),
                qpns: QpnSequence::new(),
                dirty: Vec::new(),
                timers: BTreeSet::new(),
                held_acks: Vec::new(),
                stats: NetStats::default(),
                id_solver: Ipv4IdSolver::new(),
                rx: vec![0u8; RX_BUFFER],
                rx_spare: Vec::new(),
                rx_left: None,
                tx: vec![0u8; TX_BUFFER],
                tx_refs: Vec::new(),
                tx_pkts: Vec::new(),
                gso,
                thread_wakes_at: None,
                in_flight: 0,
                in_flight_limit: in_flight_limit(rx_buffer),
                budget_queue: VecDeque::new(),
                flush_order: Vec::new(),
                gsi: Arc::new(GsiInbox::new()?),
                links: local::Links::default(),
                ring_blocked: Vec::new(),
                local_packet: Vec::new(),
                socket_read_at: None,
                socket_quiet_since: None,
                #[cfg(feature = "fault-injection")]
                armed_panic: None,
                #[cfg(feature = "fault-injection")]
                armed_stall: None,
            }),
            failed: AtomicBool::new(false),
            failure_told: AtomicBool::new(false),
            failure_hook: OnceLock::new(),
            local_addr: local,
            waker,
            doorbell,
            doorbells_heard: AtomicU64::new(0),
            mrs,
            limits,
            ifindex,
            thread_started: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            rx_buffer,
            epoch: Instant::now(),
            busy_poll_until: AtomicU64::new(0),
            thread_off_socket: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
            groups_changed: AtomicU64::new(0),
            parked: AtomicU32::new(0),
            pollers_crowded: AtomicBool::new(false),
            last_poll: AtomicU64::new(0),
            // RVERBS_POLL_PARK=0: a polling thread never sleeps in `poll`,
            // it spins as before issue 13 (for a program that must not
            // block there, at the cost of the core).
            bell: Bell::process()?,
            links_changed: AtomicU64::new(0),
            local_listener: Mutex::new(None),
        })
    }

    /// Locks the state, unless the engine failed: then (or when the lock
    /// is poisoned, by a panic whose catcher has not said so yet) `Failed`,
    /// and the state stays untouched.
    fn lock(&self) -> Result<MutexGuard<'_, State>, Failed> {
        let locked = match self.state.try_lock() {
            Ok(st) => Ok(st),
            Err(TryLockError::Poisoned(p)) => Err(p),
            Err(TryLockError::WouldBlock) => {
                // Let a spinning engine thread see someone waits (it steps back).
                self.waiting.fetch_add(1, Ordering::SeqCst);
                let st = self.state.lock();
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                st
            }
        };
        match locked {
            Ok(st) if !self.failed.load(Ordering::SeqCst) => Ok(st),
            Ok(_) => Err(Failed),
            Err(poisoned) => {
                drop(poisoned);
                self.fail();
                Err(Failed)
            }
        }
    }

    /// Runs `f` on the locked state: a panic inside fails the engine (see
    /// [`guarded`](Self::guarded)).
    fn locked<R>(&self, f: impl FnOnce(&mut State) -> R) -> Result<R, Failed> {
        let st = self.lock()?;
        self.guarded(st, f)
    }

    /// Runs `f` on the state `st` holds, catching a panic: the engine is
    /// then marked failed before the lock is let go (so no one touches the
    /// half-updated state again), the panic is logged, and the device is
    /// told.
    fn guarded<R>(
        &self,
        mut st: MutexGuard<'_, State>,
        f: impl FnOnce(&mut State) -> R,
    ) -> Result<R, Failed> {
        match catch_unwind(AssertUnwindSafe(|| f(&mut st))) {
            Ok(r) => Ok(r),
            Err(panic) => {
                self.failed.store(true, Ordering::SeqCst);
                drop(st);
                self.panicked(&*panic);
                Err(Failed)
            }
        }
    }

    /// A panic struck while the state was locked: logs it and fails the
    /// engine.
    fn panicked(&self, panic: &(dyn Any + Send)) {
        let message = panic
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(no message)");
        tracing::error!(
            local = %self.local_addr,
            "the device's network engine panicked: {message}; the device is failed \
             (IBV_EVENT_DEVICE_FATAL, later verbs fail with EIO)"
        );
        self.fail();
    }

    /// Marks the engine failed, and once: wakes its thread and the parked
    /// pollers (they find it failed and leave) and tells the device.
    fn fail(&self) {
        self.failed.store(true, Ordering::SeqCst);
        if self.failure_told.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = self.waker.write(1);
        self.bell.wake();
        if let Some(hook) = self.failure_hook.get() {
            hook();
        }
    }

    /// Whether the engine failed.
    pub(crate) fn has_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// What to do, once, when the engine fails (the device raises
    /// `IBV_EVENT_DEVICE_FATAL`). Runs on the thread that caught the panic,
    /// with no engine lock held. Set once; later calls are ignored.
    pub(crate) fn on_failure(&self, hook: impl Fn() + Send + Sync + 'static) {
        let _ = self.failure_hook.set(Box::new(hook));
    }

    /// The failed engine gives up its endpoint: the socket closes (the
    /// address is free again; peers hear nothing more). Nothing else of the
    /// state is touched: it may be half-updated.
    pub(crate) fn abandon(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.socket = None;
        // The same-host links go too: their peers read end-of-file.
        st.links = local::Links::default();
        drop(st);
        self.stop_local();
        let _ = self.waker.write(1);
    }

    /// Arms one panic at `site` (tests only, see `crate::fault`).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn arm_panic(&self, site: PanicSite) {
        let _ = self.locked(|st| st.armed_panic = Some(site));
    }

    /// Makes the next QP verb hold the lock for `hold` after its transmit
    /// (tests only, see `crate::fault`).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn arm_stall(&self, hold: Duration) {
        let _ = self.locked(|st| st.armed_stall = Some(hold));
    }

    /// Most packets of `mtu` bytes one QP should have in flight: half of
    /// what our receive buffer holds (the kernel charges about twice the
    /// payload per packet), assuming the peer's is like ours — a stock
    /// 208 KiB buffer gets a window of ~25 packets at 4 KiB instead of
    /// overflowing and paying for it in timeouts.
    pub(crate) fn window_limit(&self, mtu: u32) -> u32 {
        let per_packet = 2 * (mtu as usize + 64);
        u32::try_from(self.rx_buffer / per_packet).unwrap_or(u32::MAX)
    }

    /// The engine's counters (after a failure, as they were: reading plain
    /// counters needs no consistent state).
    pub(crate) fn stats(&self) -> NetStats {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut stats = st.stats;
        (stats.mads_sent, stats.mads_send_errors) = st.gsi.sent();
        stats.poll_park_stalls = self.bell.stalls();
        stats.local_doorbells_received = self.doorbells_heard.load(Ordering::Relaxed);
        for slot in st.qps.values() {
            slot.add_counters(&mut stats);
        }
        stats
    }

    /// Opens the device's QP 1 for its connection manager: from now on,
    /// MADs received are queued for the port (see `gsi`). One port at a
    /// time: EBUSY while another is open; ENODEV once the engine failed or
    /// its socket closed.
    pub(crate) fn open_gsi(&self) -> io::Result<GsiPort> {
        let (inbox, socket) = self
            .locked(|st| {
                let socket = st.socket.as_ref().map(UdpSocket::try_clone);
                (Arc::clone(&st.gsi), socket)
            })
            .map_err(|Failed| io::Error::from(nix::errno::Errno::ENODEV))?;
        let socket = socket.ok_or_else(|| io::Error::from(nix::errno::Errno::ENODEV))??;
        GsiPort::new(inbox, socket, self.local_addr)
            .ok_or_else(|| io::Error::from(nix::errno::Errno::EBUSY))
    }

    /// Puts a QP on the wire (in RESET) under a fresh QP number: 24 bits,
    /// never 0, 1 or 0xFFFFFF, unique on the device, not reused until the
    /// 24-bit counter behind it wraps, and unpredictable from the numbers
    /// handed out before (see `qpn.rs`). `make` builds the QP's object from its number; its
    /// completions and events go there. `caps` bounds its queues.
    pub(crate) fn add_qp<Q: QpEvents + 'static>(
        &self,
        caps: QpCaps,
        make: impl FnOnce(u32) -> Arc<Q>,
    ) -> Result<Arc<Q>, Failed> {
        self.locked(|st| {
            let qpn = loop {
                let n = st.qpns.next();
                // 0 and 1 are special QPs, 0xFFFFFF the multicast QPN.
                if n >= 2 && n != MULTICAST_QPN && !st.qps.contains_key(&n) {
                    break n;
                }
            };
            let qp = make(qpn);
            let events: Arc<dyn QpEvents> = qp.clone();
            st.qps
                .insert(qpn, QpSlot::new(events, caps.max_send_wr, caps.max_recv_wr));
            qp
        })
    }

    /// Takes a QP off the wire; its outstanding work is dropped unreported,
    /// as destroying a QP does. An ACK it still holds back goes out first:
    /// a NIC would have acknowledged the last message before the program
    /// even saw it, and a peer left without that ACK retries until it gives
    /// up (RETRY_EXC_ERR).
    pub(crate) fn remove_qp(&self, qpn: u32) {
        let _ = self.locked(|st| {
            if st
                .qps
                .get(&qpn)
                .and_then(QpSlot::rc)
                .is_some_and(RcQp::holds_ack)
            {
                mark_dirty(st, qpn);
                tx::flush(st, &self.mrs, Instant::now(), AckPolicy::Now);
            }
            if multicast::detach(st, qpn, None) {
                self.groups_changed.fetch_add(1, Ordering::SeqCst);
                // The engine thread's copy of a closed group's socket keeps the
                // membership until it looks again.
                let _ = self.waker.write(1);
            }
            if let Some(mut slot) = st.qps.remove(&qpn) {
                if let Some(d) = slot.deadline {
                    st.timers.remove(&(d, qpn));
                }
                st.in_flight = st.in_flight.saturating_sub(slot.in_flight_counted);
                if slot.budget_queued {
                    st.budget_queue.retain(|&q| q != qpn);
                }
                slot.reset();
                slot.add_counters(&mut st.stats);
                // The room it held goes to the QP waiting longest, now.
                if slot.in_flight_counted > 0 {
                    if let Some(&first) = st.budget_queue.front() {
                        mark_dirty(st, first);
                        tx::flush(st, &self.mrs, Instant::now(), AckPolicy::Now);
                    }
                }
            }
        });
    }

    /// Runs `f` on QP `qpn`'s slot, then transmits what it owes and
    /// delivers its completions, on the caller's thread. A verb that sends
    /// nothing itself (post_recv, query) holds plain ACKs back with `acks`,
    /// so they leave with the next post_send. `None`: no such QP, or the
    /// engine failed (the device is gone).
    fn with_slot<R>(
        &self,
        acks: AckPolicy,
        qpn: u32,
        f: impl FnOnce(&mut QpSlot) -> R,
    ) -> Option<R> {
        self.locked(|st| {
            let slot = st.qps.get_mut(&qpn)?;
            let r = f(slot);
            mark_dirty(st, qpn);
            #[cfg(feature = "fault-injection")]
            injected_panic(st, PanicSite::Post);
            let now = Instant::now();
            tx::flush(st, &self.mrs, now, acks);
            self.wake_if_earlier(st, now);
            #[cfg(feature = "fault-injection")]
            if let Some(hold) = st.armed_stall.take() {
                std::thread::sleep(hold);
            }
            Some(r)
        })
        .ok()
        .flatten()
    }

    /// The state QP `qpn` is in (`None`: no such QP).
    pub(crate) fn qp_state(&self, qpn: u32) -> Option<QpState> {
        self.with_slot(AckPolicy::Hold, qpn, |slot| slot.state())
    }

    /// The state QP `qpn` is in, and whether it is in SQD with its send
    /// queue still draining (`ibv_query_qp`'s `sq_draining`).
    pub(crate) fn query_qp(&self, qpn: u32) -> Option<(QpState, bool)> {
        self.with_slot(AckPolicy::Hold, qpn, |slot| {
            let state = slot.state();
            (state, state == QpState::Sqd && slot.sq_draining())
        })
    }

    /// Applies a checked transition to QP `qpn` (`ibv_modify_qp`); what it
    /// owes afterwards (a flush's completions, say) goes at once. `Err`
    /// with the QP's state if the transport moved it since the transition
    /// was checked.
    pub(crate) fn modify_qp(&self, qpn: u32, change: QpChange) -> Option<Result<(), QpState>> {
        // An ACK the QP holds back (to coalesce) leaves before the change:
        // a QP moved to ERR sends nothing more, and its peer would see a
        // message this side received and completed flushed instead
        // (rdma_disconnect right after a receive).
        self.with_slot(AckPolicy::Now, qpn, |_| ())?;
        // A peer on this host may be reached through shared memory: the
        // link is made (or found) before the QP first sends to it.
        let rc_or_uc = matches!(change.config, TransportConfig::Rc(_));
        let to_rtr = change.from == QpState::Init && change.to == QpState::Rtr;
        let linked = rc_or_uc && (to_rtr || change.sets_av) && self.ensure_link(change.peer.ip());
        self.with_slot(AckPolicy::Now, qpn, |slot| {
            let applied = slot.apply(change);
            // A QP entering RTR with its peer on this host cuts its
            // messages into same-host segments from its first post on.
            if let (true, slot::Transport::Rc(rc)) =
                (to_rtr && applied.is_ok(), &mut slot.transport)
            {
                if linked {
                    rc.set_segment(Some(local::LOCAL_SEGMENT), local::LOCAL_WINDOW);
                } else {
                    rc.set_segment(None, 0);
                }
            }
            applied
        })
    }

    /// Queues send WRs on QP `qpn` in order and transmits at once on the
    /// caller's thread. Each WR is checked for the QP's state and room,
    /// then by `prepare` (the verbs layer's argument checks, which make its
    /// request), then, RC/UC, for the PSNs it takes; with `all`, none is
    /// queued unless every one passes.
    pub(crate) fn post_send<W, E>(
        &self,
        qpn: u32,
        wrs: &[W],
        prepare: impl FnMut(&W) -> Result<SendRequest, E>,
        all: bool,
    ) -> Option<Result<(), Refused<SendRefusal<E>>>> {
        self.bell.note_post();
        let mem: &MrTable = &self.mrs;
        self.with_slot(AckPolicy::Now, qpn, |slot| {
            slot.post_send(wrs, prepare, all, mem)
        })
    }

    /// Queues receive WRs on QP `qpn` in order, each checked for the QP's
    /// state and room, then by `prepare` (the verbs layer's checks, which
    /// make its WQE).
    pub(crate) fn post_recv<W, E>(
        &self,
        qpn: u32,
        wrs: &[W],
        prepare: impl FnMut(&W) -> Result<RecvWqe, E>,
    ) -> Option<Result<(), Refused<RecvRefusal<E>>>> {
        self.bell.note_post();
        self.with_slot(AckPolicy::Hold, qpn, |slot| slot.post_recv(wrs, prepare))
    }

    /// An application thread busy-polls a CQ at engine time `now` (see
    /// [`nanos_at`](Self::nanos_at)): for [`BUSY_POLL_GRACE`]
    /// ([`CROWDED_GRACE`] if its core is shared) the engine thread leaves
    /// the socket and the timers to it.
    pub(crate) fn note_busy_poll(&self, now: u64) {
        self.last_poll.store(now, Ordering::Relaxed);
        let crowded = park::polling_crowded();
        if self.pollers_crowded.load(Ordering::Relaxed) != crowded {
            self.pollers_crowded.store(crowded, Ordering::Relaxed);
        }
        let grace = if crowded {
            CROWDED_GRACE
        } else {
            BUSY_POLL_GRACE
        };
        self.hold_socket(now, grace);
    }

    /// Whether a poller that has spun its budget may park.
    pub(crate) fn may_park(&self) -> bool {
        self.bell.parking()
    }

    /// A poller uses the socket until engine time `until`: the engine
    /// thread leaves it alone until `grace` after that.
    fn hold_socket(&self, until: u64, grace: Duration) {
        let grace = u64::try_from(grace.as_nanos()).unwrap_or(u64::MAX);
        self.busy_poll_until
            .fetch_max(until.saturating_add(grace), Ordering::SeqCst);
    }

    /// Whether the threads that poll may be behind the socket: none polled
    /// within [`thread::WATCHDOG`] (one parked that long, woken now, may
    /// not be on a core yet). A poller parked for less is not: taking its
    /// packets from it only made the engine thread preempt the pollers of
    /// a crowded host.
    fn pollers_lag(&self, now: Instant) -> bool {
        let last = self.last_poll.load(Ordering::Relaxed);
        self.nanos_at(now).saturating_sub(last) > thread::WATCHDOG_NANOS
    }

    /// Makes progress if no one else is: for a thread that polls an empty
    /// CQ. A `busy` poller (see [`note_busy_poll`](Self::note_busy_poll))
    /// stops receiving at its first completion and holds ACKs back; one
    /// about to sleep on an armed CQ makes a full pass.
    pub(crate) fn try_progress(&self, busy: bool, now: Instant) -> bool {
        let driver = if busy { Driver::Poller } else { Driver::Engine };
        let st = match self.state.try_lock() {
            Ok(st) if !self.failed.load(Ordering::SeqCst) => st,
            Ok(_) | Err(TryLockError::WouldBlock) => return false,
            Err(TryLockError::Poisoned(poisoned)) => {
                drop(poisoned);
                self.fail();
                return false;
            }
        };
        self.guarded(st, |st| {
            progress(st, &self.mrs, driver);
            self.wake_if_earlier(st, now);
        })
        .is_ok()
    }

    /// An application thread is about to sleep on a completion channel:
    /// the engine thread must watch the socket again, now.
    pub(crate) fn app_will_sleep(&self) {
        self.busy_poll_until.store(0, Ordering::SeqCst);
        if self.thread_off_socket.load(Ordering::SeqCst) {
            let _ = self.waker.write(1);
        }
    }

    /// Nanoseconds from the engine's time base to `t` (also the clock of a
    /// [`PollerWait`]).
    pub(crate) fn nanos_at(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Until when an application thread busy-polls, if it does now.
    fn busy_polled_until(&self, now: Instant) -> Option<Instant> {
        let until = self.busy_poll_until.load(Ordering::SeqCst);
        let until = self.epoch + Duration::from_nanos(until);
        (until > now).then_some(until)
    }

    /// Wakes the engine thread if a timer now falls before it would wake.
    fn wake_if_earlier(&self, st: &mut State, now: Instant) {
        if st.thread_wakes_at.is_some_and(|t| t <= now)
            || self.thread_off_socket.load(Ordering::SeqCst)
        {
            // Awake, waking anyway, or asleep only until a busy poller's
            // grace ends (it looks at the timers then; meanwhile the poller
            // runs them, and one about to sleep wakes it: app_will_sleep).
            // A busy poller alone is no reason to skip: it may post, arm a
            // CQ and sleep while the thread sleeps on a stale deadline.
            return;
        }
        let next = next_deadline(st);
        let earlier = match (next, st.thread_wakes_at) {
            (Some(n), Some(t)) => n < t,
            (Some(_), None) => true,
            _ => false,
        };
        if earlier && self.thread_started.load(Ordering::Acquire) {
            let _ = self.waker.write(1);
        }
    }

    /// Device gone: every QP goes to ERR (flushing its work), the socket
    /// closes and the thread ends. A failed engine is only abandoned.
    pub(crate) fn shutdown(&self) {
        self.stopped.store(true, Ordering::Release);
        let flushed = self.locked(|st| {
            let qpns: Vec<u32> = st.qps.keys().copied().collect();
            for qpn in qpns {
                if let Some(slot) = st.qps.get_mut(&qpn) {
                    slot.enter_error();
                }
                mark_dirty(st, qpn);
            }
            tx::flush(st, &self.mrs, Instant::now(), AckPolicy::Now);
            st.socket = None;
            st.links = local::Links::default();
        });
        self.stop_local();
        if flushed.is_err() {
            // Failed meanwhile: its state stays as it is, the socket closes.
            self.abandon();
        }
        let _ = self.waker.write(1);
        // A poller parked on this device's socket looks again.
        self.bell.wake();
    }
}

fn mark_dirty(st: &mut State, qpn: u32) {
    if let Some(slot) = st.qps.get_mut(&qpn) {
        if !slot.dirty {
            slot.dirty = true;
            st.dirty.push(qpn);
        }
    }
}

/// When a pass is due next: now if a QP still owes packets (a flush stopped
/// at its budget) or received packets wait, else the earliest timer.
fn next_deadline(st: &mut State) -> Option<Instant> {
    if !st.dirty.is_empty() || st.rx_left.is_some() || st.links.have_records() {
        return Some(Instant::now());
    }
    settle_timers(st);
    let timer = st.timers.first().map(|&(t, _)| t);
    if st.ring_blocked.is_empty() {
        return timer;
    }
    let recheck = Instant::now() + local::RING_FULL_RECHECK;
    Some(timer.map_or(recheck, |t| t.min(recheck)))
}

/// Brings the earliest timer entries up to their QPs' real next expiry.
/// The set may hold a QP's deadline early (a flush does not move an entry
/// later: every ACK would), which is harmless for a pass — it finds nothing
/// due — but not for a sleep: a poller parked until an ACK hold that is
/// long over, or a retransmission timer since re-armed, wakes for nothing,
/// and a sleep that short costs a timer programming (see `park`).
fn settle_timers(st: &mut State) {
    while let Some(&(t, qpn)) = st.timers.first() {
        let real = st.qps.get(&qpn).and_then(|slot| {
            slot.rc()
                .and_then(RcQp::next_timeout)
                .map(|r| (slot.deadline, r))
        });
        match real {
            // Exact (or, by the invariant, never earlier than the entry).
            Some((_, r)) if r <= t => return,
            Some((Some(d), r)) if d == t => {
                st.timers.remove(&(t, qpn));
                st.timers.insert((r, qpn));
                if let Some(slot) = st.qps.get_mut(&qpn) {
                    slot.deadline = Some(r);
                }
            }
            _ => {
                // No timer left, or an entry the slot no longer knows.
                st.timers.remove(&(t, qpn));
                if let Some(slot) = st.qps.get_mut(&qpn) {
                    if slot.deadline == Some(t) {
                        slot.deadline = None;
                    }
                }
            }
        }
    }
}

/// Who drives a progress pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// A thread polling an empty CQ wants completions at once: the pass
    /// stops receiving at the first datagram that completes work, and plain
    /// ACKs are held back ([`AckPolicy::Hold`]).
    Poller,
    /// The engine thread: a full receive batch; ACKs held while packets
    /// keep arriving, sent as soon as a pass finds none.
    Engine,
    /// A poller about to park: no receive (its sleep ends at once if
    /// packets wait), only timers overdue by `TIMER_DEFER` (the socket is
    /// not known to be dry), and every held ACK goes now (the sleeper would
    /// otherwise be woken just to send it).
    Parking,
}

/// One pass: receive a batch, run due timers, transmit and deliver. It
/// reads the clock itself, with the lock held: a time taken before the
/// lock, which may have been waited for milliseconds (a debug build's long
/// pass on another thread), armed retransmission timers that long too early
/// and resent what the peer had acknowledged.
fn progress(st: &mut State, mem: &MrTable, driver: Driver) {
    if !st.ring_blocked.is_empty() {
        // QPs a full ring held back try again; a ring whose reader is gone
        // goes (its QPs' packets are lost, as to a dead peer).
        st.links.prune_dead();
        for qpn in std::mem::take(&mut st.ring_blocked) {
            mark_dirty(st, qpn);
        }
    }
    let before = st.stats.rx_recvs;
    let ring_before = st.stats.local_rx_packets;
    // A poller about to park receives nothing: its sleep ends at once if
    // packets wait. Its pass does not count as reading the socket dry, so
    // only timers overdue by `TIMER_DEFER` run in it (an earlier pass may
    // have left an ACK queued); the pass after its sleep runs the rest.
    let start = Instant::now();
    let drained = driver != Driver::Parking && rx::receive(st, mem, driver, start);
    let received = st.stats.rx_recvs != before;
    #[cfg(feature = "fault-injection")]
    if received {
        let here = if thread::on_engine_thread() {
            PanicSite::EngineThread
        } else {
            PanicSite::PollingThread
        };
        injected_panic(st, here);
    }
    // An empty pass (a busy poller's, mostly) reads the clock once.
    let now = if received { Instant::now() } else { start };
    // Timers wait until the socket is read dry: an ACK still queued there
    // would otherwise be found only after its packets were resent (a pass
    // that stopped early for a poller's completion, or a thread that comes
    // back from a long preemption to a due timer and a full socket). The
    // next pass is due at once; under a flood that never lets the socket
    // run dry, a timer waits `TIMER_DEFER` at most.
    let deferred = now.checked_sub(TIMER_DEFER).unwrap_or(now);
    let mut ripe = if drained { now } else { deferred };
    // A due timer waits, too, for the ACKs this engine owes to be sent and
    // read back: they may be owed to a QP of this very engine (an RC pair on
    // one device). After a stretch off the cores, the pass that reads a
    // request may find its requester's timer due before the ACK is made,
    // and a poller's pass holds that ACK back while the next pass, finding
    // the socket dry, runs the timer. On loopback the ACKs' send puts them
    // into this socket before it returns. (`tests/busy_poll.rs` stalls an
    // engine 10.5 ms after a SEND: 23 of 24 rounds resent before this.)
    let mut acks_owed = received || !st.held_acks.is_empty();
    while let Some(&(t, qpn)) = st.timers.first().filter(|&&(t, _)| t <= ripe) {
        // The entry may be early (see flush): what counts is whether the
        // QP's own deadline is due by the same measure.
        let due = st
            .qps
            .get(&qpn)
            .and_then(QpSlot::rc)
            .and_then(RcQp::next_timeout)
            .is_some_and(|d| d <= ripe);
        if due && acks_owed {
            acks_owed = false;
            release_held_acks(st);
            tx::flush(st, mem, now, AckPolicy::Now);
            if !rx::receive(st, mem, Driver::Engine, Instant::now()) {
                ripe = deferred;
            }
            // Look again: an ACK read back may have made it not due.
            continue;
        }
        st.timers.remove(&(t, qpn));
        let Some(slot) = st.qps.get_mut(&qpn) else {
            continue;
        };
        slot.deadline = None;
        if let (true, slot::Transport::Rc(rc)) = (due, &mut slot.transport) {
            // Nothing is lost in a same-host ring: while its reader is
            // alive and moving, packets still in it are only late.
            if slot
                .peer
                .is_some_and(|p| st.links.peer_behind(p.ip(), now, slot.ring_mark))
            {
                rc.postpone_retransmission(now, now + local::RING_LATE_RECHECK);
            }
            rc.handle_timeout(now);
        }
        // The flush puts its real next deadline back.
        mark_dirty(st, qpn);
    }
    let acks = match driver {
        Driver::Poller => AckPolicy::Hold,
        // While a stream arrives, ACKs coalesce; once it pauses (a pass
        // that received nothing), every held ACK goes at once. Not for
        // packets from same-host rings alone: there an ACK costs no system
        // call, and one held back stalls a sender whose window it would open.
        Driver::Engine if received && !from_rings_only(st, before, ring_before) => AckPolicy::Hold,
        Driver::Engine | Driver::Parking => {
            release_held_acks(st);
            AckPolicy::Now
        }
    };
    tx::flush(st, mem, now, acks);
}

/// Marks the QPs that hold an ACK back dirty, for a flush with
/// [`AckPolicy::Now`] to send them.
fn release_held_acks(st: &mut State) {
    let mut held = std::mem::take(&mut st.held_acks);
    for &qpn in &held {
        if let Some(slot) = st.qps.get_mut(&qpn) {
            slot.ack_listed = false;
        }
        mark_dirty(st, qpn);
    }
    held.clear();
    st.held_acks = held;
}

/// Whether a pass that began with these counters received only from
/// same-host rings (one receive counted for them, none from the socket).
fn from_rings_only(st: &State, recvs_before: u64, ring_before: u64) -> bool {
    st.stats.local_rx_packets != ring_before && st.stats.rx_recvs - recvs_before == 1
}

/// Panics if a test armed a panic `here`: in the middle of a pass (the
/// receive has changed the state, the transmit has not run) or of a verb
/// (its change is made, its transmit has not run).
#[cfg(feature = "fault-injection")]
fn injected_panic(st: &mut State, here: PanicSite) {
    if st.armed_panic == Some(here) {
        st.armed_panic = None;
        panic!("injected panic ({here:?}) for a test");
    }
}

/// The UDP endpoint of a RoCEv2 peer with this GID.
pub(crate) fn peer_endpoint(ip: IpAddr) -> SocketAddr {
    SocketAddr::new(ip, ROCE_V2_PORT)
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::event::AsyncEventType;
    use crate::soft::engine::slot::CqFull;
    use crate::wc::WorkCompletion;

    struct NoEvents;

    impl QpEvents for NoEvents {
        fn send_completion(&self, _: WorkCompletion) -> Result<(), CqFull> {
            Ok(())
        }
        fn recv_completion(&self, _: WorkCompletion, _: bool) -> Result<(), CqFull> {
            Ok(())
        }
        fn qp_event(&self, _: AsyncEventType) {}
        fn srq_limit_reached(&self) {}
    }

    pub(super) fn engine() -> Engine {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let limits = EngineLimits {
            max_mcast_grp: 0,
            max_mcast_qp_attach: 0,
        };
        Engine::new(socket, 0, Arc::new(MrTable::new(16)), limits).unwrap()
    }

    fn new_qpn(e: &Engine) -> u32 {
        let mut qpn = 0;
        e.add_qp(QpCaps::default(), |n| {
            qpn = n;
            Arc::new(NoEvents)
        })
        .unwrap();
        qpn
    }

    fn valid(qpn: u32) -> bool {
        (2..=0x00ff_ffff).contains(&qpn) && qpn != MULTICAST_QPN
    }

    /// One known QP number says nothing of the next: neighbours have no
    /// fixed difference, and all are valid and distinct.
    #[test]
    fn qp_numbers_are_unpredictable() {
        let e = engine();
        let qpns: Vec<u32> = (0..64).map(|_| new_qpn(&e)).collect();
        assert!(qpns.iter().all(|&q| valid(q)), "{qpns:x?}");
        let unique: HashSet<u32> = qpns.iter().copied().collect();
        assert_eq!(unique.len(), qpns.len(), "{qpns:x?}");
        let diffs: HashSet<u32> = qpns
            .windows(2)
            .map(|w| w[1].wrapping_sub(w[0]) & 0x00ff_ffff)
            .collect();
        assert!(diffs.len() >= 48, "{} distinct differences", diffs.len());
        // Nor does a difference of two neighbours tell the next one's.
        let second: HashSet<u32> = qpns
            .windows(3)
            .map(|w| {
                w[2].wrapping_sub(w[1])
                    .wrapping_sub(w[1].wrapping_sub(w[0]))
                    & 0x00ff_ffff
            })
            .collect();
        assert!(
            second.len() >= 48,
            "{} distinct second differences",
            second.len()
        );
    }

    /// Timer entries left early by re-armed timers, or by QPs that have
    /// none any more (or are gone), give way to the real next expiry: a
    /// poller's sleep is not cut short by them.
    #[test]
    fn stale_timer_entries_are_settled() {
        let e = engine();
        let qpn = new_qpn(&e);
        let mut st = e.lock().unwrap();
        let t = Instant::now() + Duration::from_micros(20);
        // The QP (in RESET: no transport timer) still has an entry, and a
        // QP that is gone left one too.
        st.timers.insert((t, qpn));
        st.qps.get_mut(&qpn).unwrap().deadline = Some(t);
        st.timers
            .insert((t + Duration::from_micros(5), 0x00ab_cdef));
        assert_eq!(st.timers.first().map(|&(t, _)| t), Some(t));
        assert_eq!(next_deadline(&mut st), None);
        assert!(st.timers.is_empty());
        assert_eq!(st.qps.get(&qpn).unwrap().deadline, None);
    }

    /// One bell for the process: a thread parked on one device's socket
    /// wakes when a completion lands in a CQ of another device.
    #[test]
    fn a_completion_on_another_device_ends_a_park() {
        let a = engine();
        let b = Arc::new(engine());
        assert!(std::ptr::eq(a.bell, b.bell));
        let stop = Arc::new(AtomicBool::new(false));
        let ringer = {
            let (b, stop) = (b.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    if a_parked(&b) {
                        b.ring();
                    }
                    std::thread::yield_now();
                }
            })
        };
        // Other tests of the process park too: some parks of this one may
        // end otherwise, but one rung by `b` must come.
        let rung = (0..200).any(|_| a.park(Instant::now(), 0, || false) == Parked::Rung);
        stop.store(true, Ordering::SeqCst);
        ringer.join().unwrap();
        assert!(rung, "no park on device a ended by device b's completion");
    }

    fn a_parked(e: &Engine) -> bool {
        e.bell.parked.load(Ordering::SeqCst) > 0
    }

    /// A destroyed QP's number is not handed out again soon.
    #[test]
    fn qp_numbers_are_not_reused() {
        let e = engine();
        let mut seen = HashSet::new();
        for _ in 0..1000 {
            let qpn = new_qpn(&e);
            assert!(valid(qpn), "{qpn:#x}");
            assert!(seen.insert(qpn), "{qpn:#x} reused");
            e.remove_qp(qpn);
        }
    }
}
