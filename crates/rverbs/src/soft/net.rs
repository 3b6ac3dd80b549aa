//! The device's network engine: its UDP socket, the QP table, and progress.
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
//!   stops for `BUSY_POLL_GRACE` or the application arms a CQ to sleep.
//!
//! Every packet carries an ICRC computed for the IP header Linux will write:
//! the socket is unconnected with Don't Fragment set, so the IPv4 ID is 0.
//! Received packets are checked for that header (any rverbs peer, or any
//! Linux sender on such a socket); other packets fail the check, are
//! counted and dropped.

use std::collections::BTreeSet;
use std::io::{self, IoSlice, IoSliceMut};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{
    recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags, SockaddrStorage,
};
use nix::sys::time::TimeSpec;
use rverbs_wire::icrc::{self, Ipv4IdSolver, ROCE_V2_PORT};
use rverbs_wire::packet::ICRC_LEN;
use rverbs_wire::PacketRepr;
use smallvec::SmallVec;

use crate::event::AsyncEventType;
use crate::soft::context::AsyncSource;
use crate::soft::device::SoftDevice;
use crate::soft::keymap::KeyMap;
use crate::soft::memory::{MrCore, MrTable};
use crate::soft::qp::QpCore;
use crate::soft::sys;
use crate::soft::transport::rc::{AckPolicy, RcCounters, RcQp};
use crate::soft::transport::ud::{UdCounters, UdQp, MULTICAST_QPN};
use crate::soft::transport::{headers, PayloadRef, QpEvent, RxDrop, TxBuffer};
use crate::wr::QpState;

/// Largest RoCE packet the engine builds: headers, a 4096-byte MTU, pad, ICRC.
const MAX_PACKET: usize = 4096 + 128;
/// Bytes of one receive: the largest GRO batch (a UDP datagram's limit).
const RX_BUFFER: usize = 64 * 1024;
/// Datagrams (or GRO batches) received per pass before timers and
/// transmission get a turn.
const RX_BUDGET: usize = 64;
/// Largest UDP payload one send (a GSO batch) may carry.
const MAX_BATCH_BYTES: usize = 65_000;
/// The transmit buffer: room for a few full batches, so one system call
/// can send them all (payloads from MRs leave their room unwritten).
const TX_BUFFER: usize = 4 * (MAX_BATCH_BYTES + MAX_PACKET);
/// Most packets one QP sends in one pass; the rest waits for the next.
const FLUSH_BUDGET: usize = 256;
/// Most segments in one GSO send.
const MAX_BATCH_SEGMENTS: usize = 64;
/// Socket buffer sizes asked for (more with the privilege to force them;
/// without it the kernel caps them at net.core.rmem_max / wmem_max).
const SOCKET_BUFFER: usize = 4 << 20;
const SOCKET_BUFFER_FORCED: usize = 16 << 20;
/// How long the engine thread keeps polling the socket after it last
/// received something, before it sleeps.
const RX_SPIN: Duration = Duration::from_micros(50);
/// How long after an application's last poll of an empty CQ the engine
/// thread keeps off the socket.
const BUSY_POLL_GRACE: Duration = Duration::from_micros(500);

/// Defines the counters struct and its `counters()` listing from one list
/// of fields, so the two cannot drift apart.
macro_rules! counters_struct {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[doc = $doc:expr])* pub $field:ident: u64,)* }) => {
        $(#[$meta])*
        pub struct $name {
            $($(#[doc = $doc])* pub $field: u64,)*
        }

        impl $name {
            /// Every counter with its field name, in declaration order (what
            /// `rverbs counters` prints).
            pub fn counters(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($field), self.$field)),*]
            }
        }
    };
}

counters_struct! {
    /// Counters of a device's network engine.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    #[non_exhaustive]
    pub struct NetStats {
        /// RoCE packets sent.
        pub tx_packets: u64,
        /// Packets that could not be sent (full socket buffer, network error);
        /// the transport retransmits them.
        pub tx_errors: u64,
        /// Sends handed to the kernel (single packets or GSO batches).
        pub tx_sends: u64,
        /// Packets the kernel refused as larger than the link's MTU allows (a
        /// path MTU above the port's active MTU), lost; the transport retries
        /// and, if the path MTU stays too big, ends in RETRY_EXC_ERR.
        pub tx_too_big: u64,
        /// RoCE packets received on port 4791.
        pub rx_packets: u64,
        /// Receive calls that returned data (single packets or GRO batches).
        pub rx_recvs: u64,
        /// Received packets whose ICRC matched for no IPv4 ID (corrupt), or
        /// did not match (IPv6), dropped.
        pub rx_icrc_errors: u64,
        /// Received IPv4 packets accepted with an ID found by solving the ICRC
        /// for it (`Ipv4IdSolver`): not the 0 or GSO numbering an rverbs peer
        /// writes, but the counting IDs of kernel Soft-RoCE, a NIC, or any
        /// other sender. The check of these is 16 bits weaker.
        pub rx_ip_id_solved: u64,
        /// Received packets that are not valid RoCEv2, dropped.
        pub rx_malformed: u64,
        /// Received packets for a QP that does not exist, dropped.
        pub rx_unknown_qp: u64,
        /// Received packets for an RC or UC QP from an address other than its
        /// peer's, dropped.
        pub rx_wrong_peer: u64,
        /// Received packets of another transport than their QP's (an RC opcode
        /// for a UD QP, say), dropped.
        pub rx_wrong_transport: u64,
        /// Received packets for a QP in RESET, INIT or ERROR, dropped.
        pub rx_qp_not_receiving: u64,
        /// Received packets whose P_Key does not match their QP's, dropped.
        pub rx_bad_pkey: u64,
        /// Received UD packets longer than the path MTU, dropped.
        pub rx_too_long: u64,
        /// Request packets sent again (go-back-N after a loss or timeout), all
        /// QPs, past and present.
        pub retransmitted: u64,
        /// Retransmission timer expiries.
        pub timeouts: u64,
        /// NAK sequence errors received.
        pub seq_naks_received: u64,
        /// RNR NAKs received.
        pub rnr_naks_received: u64,
        /// NAK sequence errors sent.
        pub seq_naks_sent: u64,
        /// RNR NAKs sent.
        pub rnr_naks_sent: u64,
        /// Duplicate requests received.
        pub duplicates: u64,
        /// Congestion window cuts.
        pub window_cuts: u64,
        /// Requests refused with a NAK that ends the QP (invalid request: a bad
        /// opcode sequence, length or alignment; remote access; remote
        /// operational error).
        pub fatal_naks_sent: u64,
        /// UC packets dropped (the rest of a message after a gap, or a message
        /// refused: no receive WR, bad rkey, too long).
        pub uc_dropped: u64,
        /// UD packets dropped for a Q_Key that did not match the QP's.
        pub qkey_violations: u64,
        /// UD packets dropped because their QP had no receive WR posted.
        pub ud_no_recv_wr: u64,
    }
}

impl NetStats {
    fn add(&mut self, c: &RcCounters) {
        let RcCounters {
            retransmitted,
            timeouts,
            seq_naks_received,
            rnr_naks_received,
            seq_naks_sent,
            rnr_naks_sent,
            duplicates,
            window_cuts,
            fatal_naks_sent,
            uc_dropped,
        } = *c;
        self.retransmitted += retransmitted;
        self.timeouts += timeouts;
        self.seq_naks_received += seq_naks_received;
        self.rnr_naks_received += rnr_naks_received;
        self.seq_naks_sent += seq_naks_sent;
        self.rnr_naks_sent += rnr_naks_sent;
        self.duplicates += duplicates;
        self.window_cuts += window_cuts;
        self.fatal_naks_sent += fatal_naks_sent;
        self.uc_dropped += uc_dropped;
    }

    /// Counts a packet a QP's transport dropped unread.
    fn count_drop(&mut self, reason: RxDrop) {
        let counter = match reason {
            RxDrop::WrongTransport => &mut self.rx_wrong_transport,
            RxDrop::NotReceiving => &mut self.rx_qp_not_receiving,
            RxDrop::PKey => &mut self.rx_bad_pkey,
            RxDrop::TooLong => &mut self.rx_too_long,
        };
        *counter += 1;
    }

    fn add_ud(&mut self, c: &UdCounters) {
        self.qkey_violations += c.qkey_violations;
        self.ud_no_recv_wr += c.no_recv_wr;
    }
}

/// A QP on the wire.
pub(crate) struct QpSlot {
    pub(crate) core: Arc<QpCore>,
    /// An RC or UC QP's transport; `None` while in RESET.
    pub(crate) rc: Option<RcQp>,
    /// A UD QP's transport; `None` while in RESET.
    pub(crate) ud: Option<UdQp>,
    /// The peer's UDP endpoint (from the address vector).
    pub(crate) peer: Option<SocketAddr>,
    /// Counters of transports this QP had before a reset.
    pub(crate) past: RcCounters,
    pub(crate) past_ud: UdCounters,
    /// This QP's entry in `State::timers` (at or before its next timer).
    deadline: Option<Instant>,
    /// In `State::held_acks`.
    ack_listed: bool,
    dirty: bool,
}

impl QpSlot {
    /// The state the QP's transport is in.
    pub(crate) fn state(&self) -> QpState {
        match (&self.rc, &self.ud) {
            (Some(rc), _) => rc.state(),
            (None, Some(ud)) => ud.state(),
            (None, None) => QpState::Reset,
        }
    }
}

/// A multicast group some of the device's UD QPs are attached to: a socket
/// bound to the group's address on port 4791 (shared with other devices
/// and processes through SO_REUSEADDR) that joined the group on the
/// device's interface.
struct McastGroup {
    addr: IpAddr,
    socket: UdpSocket,
    qpns: SmallVec<[u32; 4]>,
}

/// Why a QP could not be attached to a multicast group.
#[derive(Debug)]
pub(crate) enum AttachError {
    /// The device already has `max_mcast_grp` groups.
    TooManyGroups,
    /// The group already has `max_mcast_qp_attach` QPs.
    TooManyQps,
    /// The host refused the socket, bind or join.
    Host(io::Error),
}

struct State {
    socket: Option<UdpSocket>,
    groups: Vec<McastGroup>,
    local: SocketAddr,
    qps: KeyMap<QpSlot>,
    next_qpn: u32,
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
}

/// The network engine of one device.
pub(crate) struct Engine {
    state: Mutex<State>,
    waker: EventFd,
    thread_started: AtomicBool,
    stopped: AtomicBool,
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
}

impl Engine {
    /// An engine on a bound socket, whose address is on interface
    /// `ifindex` (0: unknown); the thread starts with the first context
    /// or QP.
    pub(crate) fn new(socket: UdpSocket, ifindex: u32) -> io::Result<Engine> {
        socket.set_nonblocking(true)?;
        let local = socket.local_addr()?;
        crate::soft::sys::set_dont_fragment(&socket, local.is_ipv6())?;
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
        let gso = std::env::var("RVERBS_GSO").map_or(true, |v| v.trim() != "0");
        // GRO: take a batch of equal-sized datagrams in one receive.
        let _ = setsockopt(&socket, sockopt::UdpGroSegment, &true);
        let waker = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        let start = (getrandom::u32().unwrap_or(0x5a5a) & 0x00ff_ffff).max(2);
        Ok(Engine {
            state: Mutex::new(State {
                socket: Some(socket),
                groups: Vec::new(),
                local,
                qps: KeyMap::default(),
                next_qpn: start,
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
            }),
            waker,
            thread_started: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            rx_buffer,
            epoch: Instant::now(),
            busy_poll_until: AtomicU64::new(0),
            thread_off_socket: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
            groups_changed: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        if let Ok(st) = self.state.try_lock() {
            return st;
        }
        // Let a spinning engine thread see someone waits (it steps back).
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        st
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

    /// The engine's counters.
    pub(crate) fn stats(&self) -> NetStats {
        let st = self.lock();
        let mut stats = st.stats;
        for slot in st.qps.values() {
            stats.add(&slot.past);
            stats.add_ud(&slot.past_ud);
            if let Some(rc) = &slot.rc {
                stats.add(&rc.counters);
            }
            if let Some(ud) = &slot.ud {
                stats.add_ud(&ud.counters);
            }
        }
        stats
    }

    /// Puts `qp` on the wire (in RESET) under a fresh QP number: 24 bits,
    /// never 0 or 1, unique on the device, not reused until the counter
    /// wraps. `make` builds the QP from its number.
    pub(crate) fn add_qp(
        &self,
        dev: &Arc<SoftDevice>,
        make: impl FnOnce(u32) -> Arc<QpCore>,
    ) -> Arc<QpCore> {
        let mut st = self.lock();
        let qpn = loop {
            let n = st.next_qpn;
            st.next_qpn = (n + 1) & 0x00ff_ffff;
            // 0 and 1 are special QPs, 0xFFFFFF the multicast QPN.
            if n >= 2 && n != MULTICAST_QPN && !st.qps.contains_key(&n) {
                break n;
            }
        };
        let core = make(qpn);
        st.qps.insert(
            qpn,
            QpSlot {
                core: core.clone(),
                rc: None,
                ud: None,
                peer: None,
                past: RcCounters::default(),
                past_ud: UdCounters::default(),
                dirty: false,
                deadline: None,
                ack_listed: false,
            },
        );
        drop(st);
        self.start_thread(dev);
        core
    }

    /// Attaches UD QP `qpn` to the multicast group at `group`: the first
    /// QP of a group makes the device join it. Attaching twice is a no-op.
    pub(crate) fn attach_mcast(
        &self,
        dev: &SoftDevice,
        qpn: u32,
        group: IpAddr,
    ) -> Result<(), AttachError> {
        let mut st = self.lock();
        if let Some(g) = st.groups.iter_mut().find(|g| g.addr == group) {
            if !g.qpns.contains(&qpn) {
                if g.qpns.len() >= dev.attr.max_mcast_qp_attach as usize {
                    return Err(AttachError::TooManyQps);
                }
                g.qpns.push(qpn);
            }
            return Ok(());
        }
        if st.groups.len() >= dev.attr.max_mcast_grp as usize {
            return Err(AttachError::TooManyGroups);
        }
        let socket = join_group(dev, group).map_err(AttachError::Host)?;
        st.groups.push(McastGroup {
            addr: group,
            socket,
            qpns: smallvec::smallvec![qpn],
        });
        self.groups_changed.fetch_add(1, Ordering::SeqCst);
        drop(st);
        let _ = self.waker.write(1);
        Ok(())
    }

    /// Detaches QP `qpn` from `group`; the last QP out makes the device
    /// leave it. False if the QP was not attached.
    pub(crate) fn detach_mcast(&self, qpn: u32, group: IpAddr) -> bool {
        let mut st = self.lock();
        let detached = detach(&mut st, qpn, Some(group));
        if detached {
            self.groups_changed.fetch_add(1, Ordering::SeqCst);
            let _ = self.waker.write(1);
        }
        detached
    }

    /// Multicast groups QP `qpn` is attached to.
    pub(crate) fn groups_of(&self, qpn: u32) -> usize {
        let st = self.lock();
        st.groups.iter().filter(|g| g.qpns.contains(&qpn)).count()
    }

    /// Takes a QP off the wire; its outstanding work is dropped unreported,
    /// as destroying a QP does. An ACK it still holds back goes out first:
    /// a NIC would have acknowledged the last message before the program
    /// even saw it, and a peer left without that ACK retries until it gives
    /// up (RETRY_EXC_ERR).
    pub(crate) fn remove_qp(&self, mrs: &MrTable, qpn: u32) {
        let mut st = self.lock();
        if st
            .qps
            .get(&qpn)
            .and_then(|s| s.rc.as_ref())
            .is_some_and(RcQp::holds_ack)
        {
            mark_dirty(&mut st, qpn);
            flush(&mut st, mrs, Instant::now(), AckPolicy::Now);
        }
        if detach(&mut st, qpn, None) {
            self.groups_changed.fetch_add(1, Ordering::SeqCst);
            // The engine thread's copy of a closed group's socket keeps the
            // membership until it looks again.
            let _ = self.waker.write(1);
        }
        if let Some(slot) = st.qps.remove(&qpn) {
            if let Some(d) = slot.deadline {
                st.timers.remove(&(d, qpn));
            }
            st.stats.add(&slot.past);
            st.stats.add_ud(&slot.past_ud);
            if let Some(mut rc) = slot.rc {
                rc.return_recv();
                st.stats.add(&rc.counters);
            }
            if let Some(ud) = slot.ud {
                st.stats.add_ud(&ud.counters);
            }
        }
    }

    /// Runs `f` on QP `qpn`'s slot, then transmits what it owes and
    /// delivers its completions, on the caller's thread. A verb that sends
    /// nothing itself (post_recv, query) holds plain ACKs back with `acks`,
    /// so they leave with the next post_send.
    pub(crate) fn with_qp<R>(
        &self,
        dev: &SoftDevice,
        acks: AckPolicy,
        qpn: u32,
        f: impl FnOnce(&mut QpSlot) -> R,
    ) -> Option<R> {
        let mut st = self.lock();
        let slot = st.qps.get_mut(&qpn)?;
        let r = f(slot);
        mark_dirty(&mut st, qpn);
        let now = Instant::now();
        flush(&mut st, &dev.mrs, now, acks);
        self.wake_if_earlier(&st, now);
        Some(r)
    }

    /// An application thread busy-polls a CQ: for [`BUSY_POLL_GRACE`] the
    /// engine thread leaves the socket and the timers to it.
    pub(crate) fn note_busy_poll(&self, now: Instant) {
        let until = self.nanos_at(now + BUSY_POLL_GRACE);
        self.busy_poll_until.store(until, Ordering::SeqCst);
    }

    /// Makes progress if no one else is: for a thread that polls an empty
    /// CQ. A `busy` poller (see [`note_busy_poll`](Self::note_busy_poll))
    /// stops receiving at its first completion and holds ACKs back; one
    /// about to sleep on an armed CQ makes a full pass.
    pub(crate) fn try_progress(&self, dev: &SoftDevice, busy: bool, now: Instant) -> bool {
        let driver = if busy { Driver::Poller } else { Driver::Engine };
        match self.state.try_lock() {
            Ok(mut st) => {
                progress(&mut st, &dev.mrs, now, driver);
                self.wake_if_earlier(&st, now);
                true
            }
            Err(TryLockError::Poisoned(p)) => {
                let mut st = p.into_inner();
                progress(&mut st, &dev.mrs, now, driver);
                self.wake_if_earlier(&st, now);
                true
            }
            Err(TryLockError::WouldBlock) => false,
        }
    }

    /// An application thread is about to sleep on a completion channel:
    /// the engine thread must watch the socket again, now.
    pub(crate) fn app_will_sleep(&self) {
        self.busy_poll_until.store(0, Ordering::SeqCst);
        if self.thread_off_socket.load(Ordering::SeqCst) {
            let _ = self.waker.write(1);
        }
    }

    fn nanos_at(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Until when an application thread busy-polls, if it does now.
    fn busy_polled_until(&self, now: Instant) -> Option<Instant> {
        let until = self.busy_poll_until.load(Ordering::SeqCst);
        let until = self.epoch + Duration::from_nanos(until);
        (until > now).then_some(until)
    }

    /// Wakes the engine thread if a timer now falls before it would wake.
    fn wake_if_earlier(&self, st: &State, now: Instant) {
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

    /// Starts the engine thread, once.
    pub(crate) fn start_thread(&self, dev: &Arc<SoftDevice>) {
        if self.thread_started.swap(true, Ordering::AcqRel) {
            return;
        }
        crate::soft::counters::publish(dev);
        let dev = dev.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("rverbs-{}", dev.name))
            .spawn(move || engine_thread(&dev));
        if let Err(e) = spawned {
            tracing::error!("cannot start the engine thread: {e}");
            self.thread_started.store(false, Ordering::Release);
        }
    }

    /// Device gone: every QP goes to ERR (flushing its work), the socket
    /// closes and the thread ends.
    pub(crate) fn shutdown(&self, dev: &SoftDevice) {
        self.stopped.store(true, Ordering::Release);
        let mut st = self.lock();
        let qpns: Vec<u32> = st.qps.keys().copied().collect();
        for qpn in qpns {
            if let Some(slot) = st.qps.get_mut(&qpn) {
                if let Some(rc) = slot.rc.as_mut() {
                    rc.enter_error();
                }
                if let Some(ud) = slot.ud.as_mut() {
                    ud.enter_error();
                }
            }
            mark_dirty(&mut st, qpn);
        }
        flush(&mut st, &dev.mrs, Instant::now(), AckPolicy::Now);
        st.socket = None;
        drop(st);
        let _ = self.waker.write(1);
    }
}

fn engine_thread(dev: &Arc<SoftDevice>) {
    let engine = &dev.engine;
    // The thread's own handle on the socket: it stays open while the thread
    // sleeps on it, even if shutdown closes the engine's.
    let socket_fd: OwnedFd = {
        let st = engine.lock();
        match st.socket.as_ref().map(|s| s.as_fd().try_clone_to_owned()) {
            Some(Ok(fd)) => fd,
            _ => return,
        }
    };
    // After a pass that received something, keep polling the socket for a
    // while before sleeping: a stream's next batch is then picked up without
    // the sender's kernel having to wake this thread for every batch.
    let mut spin_until: Option<Instant> = None;
    // The multicast sockets it watches too, as of `groups_seen`.
    let mut group_fds: Vec<OwnedFd> = Vec::new();
    let mut groups_seen = 0;
    // A change before the thread watched goes unnoticed otherwise.
    dev.check_link();
    loop {
        if engine.stopped.load(Ordering::Acquire) {
            return;
        }
        // While an application busy-polls, it owns the socket and runs the
        // timers: sleep (without the lock) until its grace runs out.
        let now = Instant::now();
        if let Some(until) = spin_until.filter(|&u| now < u) {
            if engine.waiting.load(Ordering::SeqCst) > 0 {
                // A thread waits for the lock (to post, say): the std mutex
                // is not fair, so step back rather than win it again.
                std::hint::spin_loop();
                continue;
            }
            if engine.busy_polled_until(now).is_none() {
                let mut st = engine.lock();
                st.thread_wakes_at = Some(now);
                let before = st.stats.rx_recvs;
                progress(&mut st, &dev.mrs, now, Driver::Engine);
                let got = st.stats.rx_recvs != before;
                drop(st);
                spin_until = if got {
                    Some(now + RX_SPIN)
                } else {
                    Some(until)
                };
                std::hint::spin_loop();
                continue;
            }
        }
        spin_until = None;
        if let Some(until) = engine.busy_polled_until(now) {
            // Announce the socket is left alone, then look again whether
            // the application still polls: app_will_sleep stores before it
            // loads, so one of the two sees the other (both SeqCst).
            engine.thread_off_socket.store(true, Ordering::SeqCst);
            if engine.busy_polled_until(now).is_some() {
                let mut fds = [PollFd::new(engine.waker.as_fd(), PollFlags::POLLIN)];
                let left = TimeSpec::from_duration(until.saturating_duration_since(now));
                let _ = ppoll(&mut fds, Some(left), None);
                let _ = engine.waker.read();
            }
            engine.thread_off_socket.store(false, Ordering::SeqCst);
            continue;
        }
        let timer = {
            let mut st = engine.lock();
            let timer = next_deadline(&st);
            st.thread_wakes_at = timer;
            timer
        };
        let timeout = timer.map(|t| TimeSpec::from_duration(t.saturating_duration_since(now)));
        let generation = engine.groups_changed.load(Ordering::SeqCst);
        if generation != groups_seen {
            let st = engine.lock();
            group_fds = st
                .groups
                .iter()
                .filter_map(|g| g.socket.as_fd().try_clone_to_owned().ok())
                .collect();
            groups_seen = generation;
        }
        let mut fds: SmallVec<[PollFd<'_>; 4]> = SmallVec::new();
        fds.push(PollFd::new(engine.waker.as_fd(), PollFlags::POLLIN));
        fds.push(PollFd::new(socket_fd.as_fd(), PollFlags::POLLIN));
        if let Some(w) = &dev.link_watch {
            fds.push(PollFd::new(w.fd(), PollFlags::POLLIN));
        }
        for fd in &group_fds {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
        }
        match ppoll(&mut fds, timeout, None) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => {
                tracing::error!("engine poll failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let link_changed =
            dev.link_watch.is_some() && fds[2].revents().is_some_and(|r| !r.is_empty());
        drop(fds);
        if link_changed {
            if let Some(w) = &dev.link_watch {
                w.drain();
            }
            dev.check_link();
        }
        let _ = engine.waker.read();
        let now = Instant::now();
        if engine.busy_polled_until(now).is_some() {
            // An application polls (again): it makes the progress.
            continue;
        }
        let mut st = engine.lock();
        // Awake: it looks at the timers again before it sleeps.
        st.thread_wakes_at = Some(now);
        let before = st.stats.rx_recvs;
        progress(&mut st, &dev.mrs, now, Driver::Engine);
        if st.stats.rx_recvs != before {
            spin_until = Some(now + RX_SPIN);
        }
    }
}

/// A socket that receives `group`'s datagrams to port 4791 on the device's
/// interface.
fn join_group(dev: &SoftDevice, group: IpAddr) -> io::Result<UdpSocket> {
    use nix::sys::socket::{
        bind, socket, AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6,
    };
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    let family = if group.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket(family, SockType::Datagram, flags, None)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    match group {
        IpAddr::V4(g) => bind(
            fd.as_raw_fd(),
            &SockaddrIn::from(std::net::SocketAddrV4::new(g, ROCE_V2_PORT)),
        )?,
        IpAddr::V6(g) => bind(
            fd.as_raw_fd(),
            // Link-scope groups need the interface as scope.
            &SockaddrIn6::from(std::net::SocketAddrV6::new(g, ROCE_V2_PORT, 0, dev.ifindex)),
        )?,
    }
    let socket = UdpSocket::from(fd);
    match (group, dev.addr) {
        (IpAddr::V4(g), IpAddr::V4(local)) => socket.join_multicast_v4(&g, &local)?,
        (IpAddr::V6(g), _) => socket.join_multicast_v6(&g, dev.ifindex)?,
        (IpAddr::V4(_), IpAddr::V6(_)) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an IPv4 group on an IPv6 device",
            ))
        }
    }
    Ok(socket)
}

/// Detaches `qpn` from `group` (from every group: `None`); groups left
/// without QPs close their sockets. Whether anything changed.
fn detach(st: &mut State, qpn: u32, group: Option<IpAddr>) -> bool {
    let mut changed = false;
    st.groups.retain_mut(|g| {
        if group.is_none_or(|a| a == g.addr) {
            let before = g.qpns.len();
            g.qpns.retain(|q| *q != qpn);
            changed |= g.qpns.len() != before;
        }
        !g.qpns.is_empty()
    });
    changed
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
fn next_deadline(st: &State) -> Option<Instant> {
    if !st.dirty.is_empty() || st.rx_left.is_some() {
        return Some(Instant::now());
    }
    st.timers.first().map(|&(t, _)| t)
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
}

/// One pass: receive a batch, run due timers, transmit and deliver.
fn progress(st: &mut State, mem: &MrTable, now: Instant, driver: Driver) {
    let before = st.stats.rx_recvs;
    receive(st, mem, now, driver);
    let received = st.stats.rx_recvs != before;
    while let Some(&(t, qpn)) = st.timers.first().filter(|&&(t, _)| t <= now) {
        st.timers.remove(&(t, qpn));
        let Some(slot) = st.qps.get_mut(&qpn) else {
            continue;
        };
        slot.deadline = None;
        // The entry may be early (see flush): run only what is really due.
        if let Some(rc) = slot.rc.as_mut() {
            if rc.next_timeout().is_some_and(|d| d <= now) {
                rc.handle_timeout(now);
            }
        }
        // The flush puts its real next deadline back.
        mark_dirty(st, qpn);
    }
    let acks = match driver {
        Driver::Poller => AckPolicy::Hold,
        // While a stream arrives, ACKs coalesce; once it pauses (a pass
        // that received nothing), every held ACK goes at once.
        Driver::Engine if received => AckPolicy::Hold,
        Driver::Engine => {
            let mut held = std::mem::take(&mut st.held_acks);
            for &qpn in &held {
                if let Some(slot) = st.qps.get_mut(&qpn) {
                    slot.ack_listed = false;
                }
                mark_dirty(st, qpn);
            }
            held.clear();
            st.held_acks = held;
            AckPolicy::Now
        }
    };
    flush(st, mem, now, acks);
}

/// Room for the control messages a receive asks for (the GRO segment
/// size), aligned as `struct cmsghdr` wants; on the stack, so a busy poll
/// allocates nothing.
#[repr(C, align(8))]
struct CmsgBuffer([u8; 64]);

fn receive(st: &mut State, mem: &MrTable, now: Instant, driver: Driver) {
    let Some(fd) = st.socket.as_ref().map(|s| s.as_raw_fd()) else {
        return;
    };
    let local = st.local;
    // Segments of a batch a poller's pass left for later come first.
    if let Some(mut left) = st.rx_left.take() {
        if handle_segments(st, mem, now, local, driver, &mut left) {
            st.rx_left = Some(left);
            return;
        }
        st.rx_spare = left.buf;
    }
    receive_multicast(st, mem);
    let mut rx = std::mem::take(&mut st.rx);
    for _ in 0..RX_BUDGET {
        let mut cmsg = CmsgBuffer([0; 64]);
        let (n, from, gro) = {
            let mut iov = [IoSliceMut::new(&mut rx)];
            let msg = match recvmsg::<SockaddrStorage>(
                fd,
                &mut iov,
                Some(&mut cmsg.0),
                MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(m) => m,
                Err(Errno::EAGAIN) => break,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!("receive failed: {e}");
                    break;
                }
            };
            let gro = msg.cmsgs().ok().and_then(|mut c| {
                c.find_map(|m| match m {
                    ControlMessageOwned::UdpGroSegments(size) => usize::try_from(size).ok(),
                    _ => None,
                })
            });
            (msg.bytes, msg.address, gro)
        };
        let Some(peer) = from.as_ref().and_then(sockaddr) else {
            continue;
        };
        st.stats.rx_recvs += 1;
        let seg = gro.filter(|&g| g > 0).unwrap_or(n).max(1);
        let mut batch = Received {
            buf: rx,
            len: n,
            seg,
            next: 0,
            ids: SegmentIds::default(),
            peer,
            completed: false,
        };
        let stopped = handle_segments(st, mem, now, local, driver, &mut batch);
        if stopped {
            // The rest of the batch waits for the next pass; receive into
            // the spare buffer meanwhile.
            st.rx_left = Some(batch);
            let spare = std::mem::take(&mut st.rx_spare);
            st.rx = if spare.is_empty() {
                vec![0u8; RX_BUFFER]
            } else {
                spare
            };
            return;
        }
        rx = batch.buf;
        if driver == Driver::Poller && batch.completed {
            // Hand the poller its completion before another receive call.
            break;
        }
    }
    st.rx = rx;
}

/// Receives what the multicast sockets hold (no GRO there: one packet per
/// datagram) and hands each packet to every QP attached to its group.
fn receive_multicast(st: &mut State, mem: &MrTable) {
    // Every pass comes here: without groups it must cost nothing (no
    // buffer to clear on the busy-poll path).
    if st.groups.is_empty() {
        return;
    }
    let mut buf = [0u8; MAX_PACKET];
    let mut i = 0;
    while i < st.groups.len() {
        let group = st.groups[i].addr;
        for _ in 0..RX_BUDGET {
            let (n, peer) = match st.groups[i].socket.recv_from(&mut buf) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            st.stats.rx_recvs += 1;
            st.stats.rx_packets += 1;
            let pkt = &buf[..n];
            let to = peer_endpoint(group);
            let mut ids = SegmentIds::default();
            match ids.accept(0, 1, icrc_for(peer, to, pkt), &mut st.id_solver) {
                None => {
                    st.stats.rx_icrc_errors += 1;
                    continue;
                }
                Some(IdSource::Solved) => st.stats.rx_ip_id_solved += 1,
                Some(IdSource::Expected) => {}
            }
            let Ok(p) = PacketRepr::parse(pkt) else {
                st.stats.rx_malformed += 1;
                continue;
            };
            if p.bth.dest_qp != MULTICAST_QPN {
                st.stats.rx_unknown_qp += 1;
                continue;
            }
            let qpns = st.groups[i].qpns.clone();
            for qpn in qpns {
                if let Some(ud) = st.qps.get_mut(&qpn).and_then(|s| s.ud.as_mut()) {
                    if let Err(reason) = ud.handle_packet(&p, mem, peer.ip(), group) {
                        st.stats.count_drop(reason);
                    }
                    mark_dirty(st, qpn);
                }
            }
        }
        i += 1;
    }
}

/// A received datagram (one packet, or a GRO batch of `seg`-byte segments)
/// being handled, from segment `next` on.
struct Received {
    buf: Vec<u8>,
    len: usize,
    seg: usize,
    next: usize,
    ids: SegmentIds,
    peer: SocketAddr,
    completed: bool,
}

/// Handles the segments of `batch` from `batch.next` on. For a poller, it
/// stops after a segment that completes work if all that remains is one
/// shorter segment, and says so (`true`): the poller gets its completion
/// now, and the ACK that rode along with the reply waits for the next pass.
fn handle_segments(
    st: &mut State,
    mem: &MrTable,
    now: Instant,
    local: SocketAddr,
    driver: Driver,
    batch: &mut Received,
) -> bool {
    let count = batch.len.div_ceil(batch.seg);
    while batch.next < count {
        let k = batch.next;
        let start = k * batch.seg;
        let end = (start + batch.seg).min(batch.len);
        batch.next += 1;
        let pkt = &batch.buf[start..end];
        let completed = handle_datagram(
            st,
            mem,
            now,
            local,
            batch.peer,
            (&mut batch.ids, k, count),
            pkt,
        );
        batch.completed |= completed;
        // Just one shorter segment left — the ACK a reply carried along:
        // it can wait. A batch of equal segments (a stream of READ
        // responses, say) is handled whole.
        let trailing_ack =
            batch.next + 1 == count && batch.len - batch.next * batch.seg < batch.seg;
        if completed && driver == Driver::Poller && trailing_ack {
            return true;
        }
    }
    false
}

/// Checks and dispatches one received RoCE packet, segment `k` of the
/// `count` of its datagram, whose IPv4 ID `ids` tells. Whether its QP now
/// has completions or events to report.
fn handle_datagram(
    st: &mut State,
    mem: &MrTable,
    now: Instant,
    local: SocketAddr,
    peer: SocketAddr,
    (ids, k, count): (&mut SegmentIds, usize, usize),
    pkt: &[u8],
) -> bool {
    st.stats.rx_packets += 1;
    match ids.accept(k, count, icrc_for(peer, local, pkt), &mut st.id_solver) {
        None => {
            st.stats.rx_icrc_errors += 1;
            return false;
        }
        Some(IdSource::Solved) => st.stats.rx_ip_id_solved += 1,
        Some(IdSource::Expected) => {}
    }
    let Ok(p) = PacketRepr::parse(pkt) else {
        st.stats.rx_malformed += 1;
        return false;
    };
    let qpn = p.bth.dest_qp;
    let Some(slot) = st.qps.get_mut(&qpn) else {
        st.stats.rx_unknown_qp += 1;
        return false;
    };
    // Only the connected peer may talk to an RC QP.
    if slot.peer.is_some_and(|a| a.ip() != peer.ip()) {
        st.stats.rx_wrong_peer += 1;
        return false;
    }
    let mut completed = false;
    let mut handled = Err(RxDrop::NotReceiving); // RESET: no transport yet
    if let Some(rc) = slot.rc.as_mut() {
        handled = rc.handle_packet(&p, now, mem);
        completed = rc.has_events();
    }
    if let Some(ud) = slot.ud.as_mut() {
        handled = ud.handle_packet(&p, mem, peer.ip(), local.ip());
        completed = ud.has_events();
    }
    if let Err(reason) = handled {
        st.stats.count_drop(reason);
    }
    mark_dirty(st, qpn);
    completed
}

/// The ICRC check of a packet from `from` to `to`, as a function of the
/// IPv4 ID it is assumed to carry: `(computed, on the wire)`, `None` for a
/// packet too short to have an ICRC. The IPv4 header's length too, for
/// [`Ipv4IdSolver`] (`None` for IPv6: no ID).
fn icrc_for(from: SocketAddr, to: SocketAddr, pkt: &[u8]) -> impl Fn(u16) -> IcrcCheck + '_ {
    move |id| {
        let (ip, ip_len, udp) = headers(from, to, pkt.len(), id);
        IcrcCheck {
            result: icrc::check(&ip[..ip_len], &udp, pkt).ok(),
            ipv4_header_len: (from.is_ipv4() && to.is_ipv4()).then_some(ip_len),
            roce_len: pkt.len().saturating_sub(ICRC_LEN),
        }
    }
}

/// What [`icrc_for`] gives for one assumed ID.
struct IcrcCheck {
    result: Option<(u32, u32)>,
    ipv4_header_len: Option<usize>,
    roce_len: usize,
}

/// How a packet's IPv4 ID was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdSource {
    /// The ID an rverbs sender gives (0, or its place in a GSO send).
    Expected,
    /// Solved for from the ICRC (another kind of sender).
    Solved,
}

/// The IPv4 IDs of a received datagram's segments. A GSO send's segments
/// carry 0, 1, 2, … and GRO keeps them in order; but a receiver's GRO may
/// also join several sends, whose IDs each restart at 0, and may start a
/// batch inside a send (where a NIC's poll ended). Other senders (kernel
/// Soft-RoCE, NICs) count their own way. Segment k is checked with the ID
/// the run it belongs to gives it; when that fails, the ICRC is solved for
/// the ID (`Ipv4IdSolver`: no guessing, one multiplication), which places
/// a new run: 0 starts a send, 1–63 on a batch's first segment is a batch
/// that began inside one, any other ID (or IPv6, which has none to solve)
/// is a foreign sender whose next segments are expected to count on.
#[derive(Debug, Default)]
struct SegmentIds {
    /// The segment whose ID would be 0 in the current run (IDs wrap).
    start: u16,
    /// The current run's IDs were solved for.
    solved: bool,
}

impl SegmentIds {
    /// Whether segment `k` of a batch of `count`'s ICRC (`check` gives it
    /// for an assumed ID) is right for an ID it may carry, and how that ID
    /// was found; `None`: for no ID, the packet is corrupt.
    fn accept(
        &mut self,
        k: usize,
        count: usize,
        check: impl Fn(u16) -> IcrcCheck,
        solver: &mut Ipv4IdSolver,
    ) -> Option<IdSource> {
        let k = k as u16;
        let assumed = k.wrapping_sub(self.start);
        let c = check(assumed);
        let (computed, on_wire) = c.result?;
        let source = |solved| {
            if solved {
                IdSource::Solved
            } else {
                IdSource::Expected
            }
        };
        if computed == on_wire {
            return Some(source(self.solved));
        }
        let id = solver.solve(computed, on_wire, assumed, c.ipv4_header_len?, c.roce_len)?;
        self.start = k.wrapping_sub(id);
        self.solved = !(id == 0 || (k == 0 && count > 1 && usize::from(id) < MAX_BATCH_SEGMENTS));
        Some(source(self.solved))
    }
}

fn sockaddr(s: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = s.as_sockaddr_in() {
        return Some(SocketAddr::new(IpAddr::V4(v4.ip()), v4.port()));
    }
    s.as_sockaddr_in6()
        .map(|v6| SocketAddr::new(IpAddr::V6(v6.ip()), v6.port()))
}

/// Packets gathered for one send: `count` segments of `seg` bytes (the last
/// may be shorter), `len` bytes in all.
#[derive(Default, Clone, Copy)]
struct Batch {
    len: usize,
    seg: usize,
    count: usize,
}

/// One packet of a batch: its length in the transmit buffer, and which of
/// the batch's payload references fill it.
#[derive(Debug, Clone)]
struct TxPacket {
    len: usize,
    refs: Range<usize>,
}

/// The pieces of one packet to hand the kernel, in order: bytes of the
/// transmit buffer around payloads sent straight from registered memory.
fn packet_pieces<'a>(
    pkt: &'a [u8],
    refs: &[PayloadRef],
    payloads: &[&'a [u8]],
    out: &mut SmallVec<[&'a [u8]; 8]>,
) {
    let mut pos = 0;
    for (r, payload) in refs.iter().zip(payloads) {
        let at = r.at as usize;
        if at > pos {
            out.push(&pkt[pos..at]);
        }
        out.push(payload);
        pos = at + r.len as usize;
    }
    if pos < pkt.len() {
        out.push(&pkt[pos..]);
    }
}

/// The errno of an I/O error (EIO if it has none).
fn errno(e: io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(Errno::EIO as i32))
}

/// Appends to `iov` the I/O vector of packets `range` of `buf`: the
/// buffer's bytes between payloads sent from MRs as few slices as possible
/// (packets without such payloads are one slice).
fn iovecs<'a>(
    buf: &'a [u8],
    pkts: &[TxPacket],
    refs: &[PayloadRef],
    payloads: &[&'a [u8]],
    range: Range<usize>,
    iov: &mut IoVector<'a>,
) {
    let mut off: usize = pkts[..range.start].iter().map(|p| p.len).sum();
    // The stretch of `buf` not yet added.
    let mut pending = off..off;
    for p in &pkts[range] {
        for (r, payload) in refs[p.refs.clone()].iter().zip(&payloads[p.refs.clone()]) {
            let at = off + r.at as usize;
            pending.end = at;
            if !pending.is_empty() {
                iov.push(IoSlice::new(&buf[pending.clone()]));
            }
            iov.push(IoSlice::new(payload));
            pending = at + r.len as usize..at + r.len as usize;
        }
        off += p.len;
        pending.end = off;
    }
    if !pending.is_empty() {
        iov.push(IoSlice::new(&buf[pending]));
    }
}

/// The I/O vectors of one pass's datagrams, one after another (a 64 KiB
/// WRITE's two datagrams fit without allocating; a longer stream's spill
/// to the heap).
type IoVector<'a> = SmallVec<[IoSlice<'a>; 64]>;

/// A batch closed in a flush pass, waiting for the pass's system call:
/// its packets (laid out one after another from the transmit buffer's
/// start; their payload references index the pass's whole list).
struct PendingSend {
    batch: Batch,
    pkts: Range<usize>,
}

/// A datagram ready for the kernel: its stretch of the call's I/O vector,
/// its GSO segment size (for a batch of more than one packet), and how
/// many packets it holds.
struct Outgoing {
    iov: Range<usize>,
    gso: Option<u16>,
    packets: usize,
}

/// Where batches go.
struct Sender<'a> {
    socket: Option<&'a UdpSocket>,
    gso: &'a mut bool,
    stats: &'a mut NetStats,
    local: SocketAddr,
    peer: SocketAddr,
}

impl Sender<'_> {
    /// Sends the batches `sends` of `buf` in as few system calls as the
    /// kernel allows: one `sendmmsg` for up to [`sys::MAX_DATAGRAMS`]
    /// batches, each one GSO send — or, without GSO, one datagram per
    /// packet. Payloads described in `refs` go straight from their MRs,
    /// read-locked until the kernel has copied them; each packet's ICRC is
    /// computed over its pieces for the IP ID Linux will give it.
    fn send_all(
        &mut self,
        mem: &MrTable,
        buf: &mut [u8],
        sends: &[PendingSend],
        pkts: &[TxPacket],
        refs: &[PayloadRef],
    ) {
        let Some(sock) = self.socket else { return };
        // Pin the memory: each MR once, under its read lock.
        let mut mrs: SmallVec<[(u32, Arc<MrCore>); 2]> = SmallVec::new();
        for r in refs {
            if mrs.iter().all(|(k, _)| *k != r.key) {
                if let Ok(mr) = mem.mr(r.key) {
                    mrs.push((r.key, mr));
                }
            }
        }
        let guards: SmallVec<[_; 2]> = mrs.iter().map(|(_, mr)| mr.read()).collect();
        // A reference whose MR was deregistered (or whose window no longer
        // checks) since its packet was built loses its batch: the
        // retransmission fails the WR with a protection error.
        let mut payloads: SmallVec<[&[u8]; MAX_BATCH_SEGMENTS]> = SmallVec::new();
        let mut lost: SmallVec<[bool; MAX_BATCH_SEGMENTS]> = SmallVec::new();
        for r in refs {
            let window = mrs.iter().position(|(k, _)| *k == r.key).and_then(|i| {
                guards[i]
                    .keyed_read_window(r.key, r.va, r.len as usize, r.kind, Some(r.pd))
                    .ok()
            });
            lost.push(window.is_none());
            payloads.push(window.map_or(&[][..], |w| w.into_slice()));
        }
        let usable = |s: &PendingSend| {
            pkts[s.pkts.clone()]
                .iter()
                .all(|p| !lost[p.refs.clone()].iter().any(|&l| l))
        };
        for s in sends.iter().filter(|s| !usable(s)) {
            self.stats.tx_errors += s.batch.count as u64;
        }
        let (local, peer) = (self.local, self.peer);
        // Writes the ICRCs of packets `range`, numbering IP IDs from 0
        // within the range when the kernel gives each GSO segment its own
        // (else every packet has ID 0).
        let fill = |buf: &mut [u8], range: Range<usize>, per_segment_ids: bool| {
            let mut off: usize = pkts[..range.start].iter().map(|p| p.len).sum();
            for (k, p) in pkts[range].iter().enumerate() {
                let id = if per_segment_ids { k as u16 } else { 0 };
                let (ip, ip_len, udp) = headers(local, peer, p.len, id);
                let crc = {
                    let body = &buf[off..off + p.len - ICRC_LEN];
                    let mut pieces = SmallVec::<[&[u8]; 8]>::new();
                    let r = p.refs.clone();
                    packet_pieces(body, &refs[r.clone()], &payloads[r], &mut pieces);
                    match pieces.split_first() {
                        Some((head, rest)) => {
                            icrc::compute_vectored(&ip[..ip_len], &udp, head, rest).unwrap_or(0)
                        }
                        None => 0,
                    }
                };
                off += p.len;
                buf[off - ICRC_LEN..off].copy_from_slice(&crc.to_le_bytes());
            }
        };
        let to = SockaddrStorage::from(peer);
        // Batches to send packet by packet (all of them without GSO).
        let mut unbatched: SmallVec<[&PendingSend; sys::MAX_DATAGRAMS]> = SmallVec::new();
        let mut gso_refused = false;
        if *self.gso {
            let ready: SmallVec<[&PendingSend; sys::MAX_DATAGRAMS]> =
                sends.iter().filter(|s| usable(s)).collect();
            for s in &ready {
                fill(buf, s.pkts.clone(), s.batch.count > 1);
            }
            let buf = &*buf;
            let mut iov = IoVector::new();
            let mut out: SmallVec<[Outgoing; sys::MAX_DATAGRAMS]> = SmallVec::new();
            for s in &ready {
                let start = iov.len();
                iovecs(buf, pkts, refs, &payloads, s.pkts.clone(), &mut iov);
                out.push(Outgoing {
                    iov: start..iov.len(),
                    gso: (s.batch.count > 1).then_some(s.batch.seg as u16),
                    packets: s.batch.count,
                });
            }
            if let Some(refused) = self.transmit(sock, &to, &iov, &out) {
                unbatched.extend(ready[refused..].iter().copied());
                gso_refused = true;
            }
        } else {
            unbatched.extend(sends.iter().filter(|s| usable(s)));
        }
        if !unbatched.is_empty() {
            for s in &unbatched {
                fill(buf, s.pkts.clone(), false);
            }
            let buf = &*buf;
            let mut iov = IoVector::new();
            let mut out: SmallVec<[Outgoing; sys::MAX_DATAGRAMS]> = SmallVec::new();
            for i in unbatched.iter().flat_map(|s| s.pkts.clone()) {
                let start = iov.len();
                iovecs(buf, pkts, refs, &payloads, i..i + 1, &mut iov);
                out.push(Outgoing {
                    iov: start..iov.len(),
                    gso: None,
                    packets: 1,
                });
            }
            // No GSO datagram among them: nothing to refuse. After a
            // refused GSO send, its own packets go first, alone: if the
            // kernel refuses every one of them as too big, it refused the
            // GSO send for its segments' size (EINVAL, where a plain send
            // says EMSGSIZE: a path MTU above the link's), not GSO itself.
            let first = if gso_refused {
                unbatched[0].pkts.len()
            } else {
                0
            };
            let too_big = self.stats.tx_too_big;
            self.transmit(sock, &to, &iov, &out[..first]);
            if gso_refused {
                if self.stats.tx_too_big - too_big == first as u64 {
                    *self.gso = true;
                } else {
                    tracing::info!("UDP GSO refused by the kernel; sending packet by packet");
                }
            }
            self.transmit(sock, &to, &iov, &out[first..]);
        }
        drop(payloads);
        drop(guards);
    }

    /// Hands `out` to the kernel, [`sys::MAX_DATAGRAMS`] per call. A full
    /// socket buffer is a drop (the transport retransmits). Returns the
    /// index of the first GSO datagram the kernel refuses as such, after
    /// which GSO is off and the rest is left to the caller.
    fn transmit(
        &mut self,
        sock: &UdpSocket,
        to: &SockaddrStorage,
        iov: &[IoSlice<'_>],
        out: &[Outgoing],
    ) -> Option<usize> {
        let datagrams: SmallVec<[sys::Datagram<'_>; sys::MAX_DATAGRAMS]> = out
            .iter()
            .map(|o| sys::Datagram {
                iov: &iov[o.iov.clone()],
                gso_size: o.gso,
            })
            .collect();
        let mut i = 0;
        while i < out.len() {
            let end = (i + sys::MAX_DATAGRAMS).min(out.len());
            match sys::send_many(sock, &datagrams[i..end], to).map_err(errno) {
                Ok(n) if n > 0 => {
                    for o in &out[i..i + n] {
                        self.stats.tx_sends += 1;
                        self.stats.tx_packets += o.packets as u64;
                    }
                    i += n;
                }
                Err(Errno::EINTR) => {}
                Err(e @ (Errno::EINVAL | Errno::EIO | Errno::EOPNOTSUPP))
                    if out[i].gso.is_some() =>
                {
                    tracing::debug!("UDP GSO send refused ({e}); trying packet by packet");
                    *self.gso = false;
                    return Some(i);
                }
                Err(Errno::EMSGSIZE) => {
                    tracing::debug!("a packet larger than the link MTU was refused");
                    self.stats.tx_too_big += out[i].packets as u64;
                    i += 1;
                }
                // EAGAIN / ENOBUFS (a full socket buffer) and the rest: a
                // loss, which the transport recovers from.
                Ok(_) | Err(_) => {
                    self.stats.tx_errors += out[i].packets as u64;
                    i += 1;
                }
            }
        }
        None
    }
}

/// Transmits what the dirty QPs owe and delivers their completions and
/// events. Consecutive packets of one QP with the same size go out as one
/// UDP GSO send (the last may be shorter), their payloads straight from the
/// registered memory they come from.
fn flush(st: &mut State, mem: &MrTable, now: Instant, acks: AckPolicy) {
    let mut tx = std::mem::take(&mut st.tx);
    let mut refs = std::mem::take(&mut st.tx_refs);
    let mut pkts = std::mem::take(&mut st.tx_pkts);
    let mut dirty = std::mem::take(&mut st.dirty);
    let mut unfinished: SmallVec<[u32; 8]> = SmallVec::new();
    let State {
        socket,
        qps,
        gso,
        stats,
        local,
        timers,
        held_acks,
        ..
    } = st;
    for &qpn in &dirty {
        let Some(slot) = qps.get_mut(&qpn) else {
            continue;
        };
        slot.dirty = false;
        // Still more to send after FLUSH_BUDGET packets: a later pass goes
        // on, so one QP's burst (a READ a peer asked for in one piece)
        // never holds the device for long.
        let mut out_of_budget = false;
        if let (Some(rc), Some(peer)) = (slot.rc.as_mut(), slot.peer) {
            let mut out = Sender {
                socket: socket.as_ref(),
                gso: &mut *gso,
                stats: &mut *stats,
                local: *local,
                peer,
            };
            // Closed batches wait in `sends` for one system call; `open` is
            // the batch being built, from packet `open_pkts` on; `end` is
            // where the next packet goes in the buffer.
            let mut sends: SmallVec<[PendingSend; sys::MAX_DATAGRAMS]> = SmallVec::new();
            let mut open = Batch::default();
            let (mut open_pkts, mut end) = (0, 0);
            refs.clear();
            pkts.clear();
            let mut budget = FLUSH_BUDGET;
            loop {
                if budget == 0 {
                    out_of_budget = true;
                    break;
                }
                budget -= 1;
                let at = end;
                let first_ref = refs.len();
                let mut buf = TxBuffer {
                    bytes: &mut tx[at..at + MAX_PACKET],
                    refs: Some(&mut refs),
                };
                let Some(n) = rc.poll_transmit(now, mem, &mut buf, acks) else {
                    break;
                };
                // A packet joins the open batch if it has the batch's size,
                // or is shorter and ends a batch of several. A lone packet
                // and a shorter one after it (a reply and the ACK held for
                // its QP, a RETH packet and the next) go as two datagrams
                // of one sendmmsg: a two-segment GSO send costs the kernel
                // more than two plain ones, and the first packet reaches
                // the peer sooner.
                if open.count > 0 && (n > open.seg || (n < open.seg && open.count == 1)) {
                    // It does not join: close the open batch; this packet
                    // starts the next.
                    close_batch(&mut sends, &mut open, &mut open_pkts, pkts.len());
                }
                pkts.push(TxPacket {
                    len: n,
                    refs: first_ref..refs.len(),
                });
                if open.count == 0 {
                    open.seg = n;
                }
                open.len += n;
                open.count += 1;
                end = at + n;
                let full =
                    open.count == MAX_BATCH_SEGMENTS || open.len + open.seg > MAX_BATCH_BYTES;
                if n < open.seg || full {
                    close_batch(&mut sends, &mut open, &mut open_pkts, pkts.len());
                }
                // What is pending goes when a batch has just closed and
                // there is no room for another full one (or a call's worth
                // of datagrams waits) — so a stream's batches stay whole:
                // a receiver's GRO may join GSO sends, and each send's IPv4
                // IDs restart at 0 — or, failing that, when not even one
                // more packet fits.
                let room = if open.count == 0 {
                    MAX_BATCH_BYTES + MAX_PACKET
                } else {
                    MAX_PACKET
                };
                if sends.len() >= sys::MAX_DATAGRAMS || end + room > tx.len() {
                    close_batch(&mut sends, &mut open, &mut open_pkts, pkts.len());
                    out.send_all(mem, &mut tx[..end], &sends, &pkts, &refs);
                    sends.clear();
                    refs.clear();
                    pkts.clear();
                    (open_pkts, end) = (0, 0);
                }
            }
            close_batch(&mut sends, &mut open, &mut open_pkts, pkts.len());
            if !sends.is_empty() {
                out.send_all(mem, &mut tx[..end], &sends, &pkts, &refs);
            }
        }
        if let Some(ud) = slot.ud.as_mut() {
            let mut budget = FLUSH_BUDGET;
            loop {
                if budget == 0 {
                    out_of_budget = true;
                    break;
                }
                budget -= 1;
                let mut buf = TxBuffer {
                    bytes: &mut tx[..MAX_PACKET],
                    refs: None,
                };
                let Some((n, ip)) = ud.poll_transmit(mem, &mut buf) else {
                    break;
                };
                let mut out = Sender {
                    socket: socket.as_ref(),
                    gso: &mut *gso,
                    stats: &mut *stats,
                    local: *local,
                    peer: peer_endpoint(ip),
                };
                let one = [TxPacket { len: n, refs: 0..0 }];
                let send = PendingSend {
                    batch: Batch {
                        len: n,
                        seg: n,
                        count: 1,
                    },
                    pkts: 0..1,
                };
                out.send_all(mem, &mut tx[..n], &[send], &one, &[]);
            }
        }
        if out_of_budget {
            slot.dirty = true;
            unfinished.push(qpn);
        }
        deliver_events(slot);
        if !slot.ack_listed && slot.rc.as_ref().is_some_and(RcQp::holds_ack) {
            slot.ack_listed = true;
            held_acks.push(qpn);
        }
        // The set may hold a QP's deadline early, never late: a timer
        // re-armed later (every ACK does) costs nothing here; the early
        // entry fires, finds nothing due and is replaced.
        if let Some(new) = slot.rc.as_ref().and_then(RcQp::next_timeout) {
            match slot.deadline {
                Some(old) if old <= new => {}
                old => {
                    if let Some(old) = old {
                        timers.remove(&(old, qpn));
                    }
                    timers.insert((new, qpn));
                    slot.deadline = Some(new);
                }
            }
        }
    }
    st.tx = tx;
    st.tx_refs = refs;
    st.tx_pkts = pkts;
    // Keep the list's capacity: no allocation per pass.
    dirty.clear();
    dirty.extend(unfinished);
    st.dirty = dirty;
}

/// Closes the open batch (packets `open_pkts..pkts_len`), if it holds any,
/// into `sends`; the next starts empty at `pkts_len`.
fn close_batch(
    sends: &mut SmallVec<[PendingSend; sys::MAX_DATAGRAMS]>,
    open: &mut Batch,
    open_pkts: &mut usize,
    pkts_len: usize,
) {
    if open.count > 0 {
        sends.push(PendingSend {
            batch: *open,
            pkts: *open_pkts..pkts_len,
        });
    }
    *open = Batch::default();
    *open_pkts = pkts_len;
}

/// Hands a QP's completions to its CQs and its async events to its context.
/// A full CQ moves the QP to ERR with IBV_EVENT_QP_FATAL.
fn deliver_events(slot: &mut QpSlot) {
    let QpSlot { core, rc, ud, .. } = slot;
    let mut fatal = false;
    loop {
        let event = match (rc.as_mut(), ud.as_mut()) {
            (Some(rc), _) => rc.poll_event(),
            (None, Some(ud)) => ud.poll_event(),
            (None, None) => None,
        };
        let Some(e) = event else { break };
        let pushed = match e {
            QpEvent::SendCompletion(wc) => core.send_cq.push(wc, false),
            QpEvent::RecvCompletion(wc, solicited) => core.recv_cq.push(wc, solicited),
            QpEvent::Async(ev) => {
                core.ctx
                    .post_async(ev, AsyncSource::Qp(Arc::downgrade(core)));
                Ok(())
            }
            QpEvent::SrqLimitReached => {
                if let Some(srq) = &core.srq {
                    srq.ctx.post_async(
                        AsyncEventType::SrqLimitReached,
                        AsyncSource::Srq(Arc::downgrade(srq)),
                    );
                }
                Ok(())
            }
        };
        if pushed.is_err() && !fatal {
            fatal = true;
            if let Some(rc) = rc.as_mut() {
                rc.enter_error();
            }
            if let Some(ud) = ud.as_mut() {
                ud.enter_error();
            }
            core.ctx.post_async(
                AsyncEventType::QpFatal,
                AsyncSource::Qp(Arc::downgrade(core)),
            );
        }
    }
}

/// The UDP endpoint of a RoCEv2 peer with this GID.
pub(crate) fn peer_endpoint(ip: IpAddr) -> SocketAddr {
    SocketAddr::new(ip, ROCE_V2_PORT)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends three 100-byte packets as one batch from a fresh socket (made
    /// to refuse GSO when `refuse_gso`) to a plain one; returns the engine's
    /// GSO flag and counters after, and the datagrams received, each with
    /// the IPv4 ID its ICRC is right for (`None`: none of 0..3).
    /// A received datagram and the IPv4 ID its ICRC is right for.
    type Delivered = (Vec<u8>, Option<u16>);

    /// Sends `sends` from a fresh socket on 127.0.0.1 (one the kernel
    /// refuses GSO sends from, with `refuse_gso`) to a fresh peer socket;
    /// the engine's GSO flag after it, its counters, and the peer.
    fn send_on_loopback(
        refuse_gso: bool,
        buf: &mut [u8],
        sends: &[PendingSend],
        pkts: &[TxPacket],
    ) -> (bool, NetStats, UdpSocket) {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sys::set_dont_fragment(&sock, false).unwrap();
        if refuse_gso {
            sys::set_no_udp_checksum(&sock).unwrap();
        }
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let (mut gso, mut stats) = (true, NetStats::default());
        let mut out = Sender {
            socket: Some(&sock),
            gso: &mut gso,
            stats: &mut stats,
            local: sock.local_addr().unwrap(),
            peer: peer.local_addr().unwrap(),
        };
        out.send_all(&MrTable::new(4), buf, sends, pkts, &[]);
        (gso, stats, peer)
    }

    fn send_batch(refuse_gso: bool) -> (bool, NetStats, Vec<Delivered>) {
        let mut buf: Vec<u8> = (0..300u32).map(|i| (i * 7 + 1) as u8).collect();
        let pkts: Vec<TxPacket> = (0..3)
            .map(|_| TxPacket {
                len: 100,
                refs: 0..0,
            })
            .collect();
        let send = PendingSend {
            batch: Batch {
                len: 300,
                seg: 100,
                count: 3,
            },
            pkts: 0..3,
        };
        let (gso, stats, peer) = send_on_loopback(refuse_gso, &mut buf, &[send], &pkts);
        let mut got = Vec::new();
        let mut rb = [0u8; 2048];
        while let Ok((n, from)) = peer.recv_from(&mut rb) {
            let pkt = rb[..n].to_vec();
            let id = (0..3u16).find(|&id| {
                let (ip, ip_len, udp) = headers(from, peer.local_addr().unwrap(), n, id);
                matches!(icrc::check(&ip[..ip_len], &udp, &pkt), Ok((c, w)) if c == w)
            });
            got.push((pkt, id));
        }
        (gso, stats, got)
    }

    /// Datagrams the kernel refuses as too big (here: beyond a UDP
    /// datagram's 64 KiB; on a link, beyond its MTU with DF set) are counted
    /// as such, lost, and leave GSO on.
    #[test]
    fn oversized_datagrams_count_as_too_big_and_leave_gso_on() {
        // One 70,000-byte packet alone, then a GSO batch of two of 40,000
        // (80,000 bytes in one send), then a small packet that fits.
        let lens = [70_000usize, 40_000, 40_000, 100];
        let mut buf = vec![0x5a; lens.iter().sum()];
        let pkts: Vec<TxPacket> = lens
            .iter()
            .map(|&len| TxPacket { len, refs: 0..0 })
            .collect();
        let batch = |len, seg, count| Batch { len, seg, count };
        let sends = [
            PendingSend {
                batch: batch(70_000, 70_000, 1),
                pkts: 0..1,
            },
            PendingSend {
                batch: batch(80_000, 40_000, 2),
                pkts: 1..3,
            },
            PendingSend {
                batch: batch(100, 100, 1),
                pkts: 3..4,
            },
        ];
        let (gso, stats, peer) = send_on_loopback(false, &mut buf, &sends, &pkts);
        let mut rb = [0u8; 2048];
        let (n, _) = peer.recv_from(&mut rb).expect("the small packet");
        assert_eq!(n, 100);
        assert!(
            peer.recv_from(&mut rb).is_err(),
            "only the small one arrives"
        );
        assert!(gso, "a size refusal turned GSO off");
        assert_eq!(
            (stats.tx_too_big, stats.tx_errors, stats.tx_packets),
            (3, 0, 1),
            "{stats:?}"
        );
    }

    /// How each segment of a GRO batch whose packets really carry the
    /// IPv4 IDs `wire` is taken (`None`: dropped): real packets, each with
    /// its ICRC for its ID, corrupt where `wire` says `None`.
    fn accepted(wire: &[Option<u16>]) -> Vec<Option<IdSource>> {
        let (from, to): (SocketAddr, SocketAddr) = (
            "198.18.0.1:49152".parse().unwrap(),
            "198.18.0.2:4791".parse().unwrap(),
        );
        let mut ids = SegmentIds::default();
        let mut solver = Ipv4IdSolver::new();
        wire.iter()
            .enumerate()
            .map(|(k, id)| {
                let mut pkt: Vec<u8> = (0..64u32).map(|i| (i * 13 + k as u32) as u8).collect();
                let (ip, ip_len, udp) = headers(from, to, pkt.len(), id.unwrap_or(0));
                icrc::fill(&ip[..ip_len], &udp, &mut pkt).unwrap();
                if id.is_none() {
                    pkt[20] ^= 0x10;
                }
                ids.accept(k, wire.len(), icrc_for(from, to, &pkt), &mut solver)
            })
            .collect()
    }

    #[test]
    fn gro_joining_gso_sends_keeps_every_segment() {
        use IdSource::Expected as E;
        let ok = |ids: &[u16]| ids.iter().map(|&i| Some(i)).collect::<Vec<_>>();
        // A send of 3, then one of 4: the IDs restart at 0.
        assert_eq!(accepted(&ok(&[0, 1, 2, 0, 1, 2, 3])), [Some(E); 7]);
        // Three one-packet sends.
        assert_eq!(accepted(&ok(&[0, 0, 0])), [Some(E); 3]);
        // A batch that starts inside a send, then the next send.
        assert_eq!(accepted(&ok(&[4, 5, 6, 0, 1])), [Some(E); 5]);
        // A corrupt segment is dropped; the count goes on.
        assert_eq!(
            accepted(&[Some(0), Some(1), None, Some(3)]),
            [Some(E), Some(E), None, Some(E)]
        );
    }

    #[test]
    fn counting_ids_of_other_senders_are_solved_for() {
        use IdSource::Solved as S;
        let ok = |ids: &[u16]| ids.iter().map(|&i| Some(i)).collect::<Vec<_>>();
        // A lone datagram from kernel Soft-RoCE or a NIC (ID 0x718c).
        assert_eq!(accepted(&ok(&[0x718c])), [Some(S)]);
        // Past the IDs a GSO send can give: a counting sender, whose run
        // the next segments follow.
        assert_eq!(accepted(&ok(&[70, 71, 72])), [Some(S); 3]);
        // It wraps, and its run goes on through 0.
        assert_eq!(accepted(&ok(&[0xffff, 0, 1])), [Some(S); 3]);
        // A lone datagram's ID 3 is no GSO place (one packet: ID 0).
        assert_eq!(accepted(&ok(&[3])), [Some(S)]);
        // Corrupt: right for no ID.
        assert_eq!(accepted(&[None, Some(0x1234), None]), [None, Some(S), None]);
    }

    #[test]
    fn a_batch_is_one_gso_send_with_an_icrc_per_segment_id() {
        let (gso, stats, got) = send_batch(false);
        assert!(gso);
        assert_eq!(
            (stats.tx_sends, stats.tx_packets, stats.tx_errors),
            (1, 3, 0)
        );
        // The peer has no UDP_GRO: the kernel splits the batch for it.
        let ids: Vec<_> = got.iter().map(|(p, id)| (p.len(), *id)).collect();
        assert_eq!(ids, [(100, Some(0)), (100, Some(1)), (100, Some(2))]);
    }

    #[test]
    fn refused_gso_falls_back_to_a_datagram_per_packet() {
        let (gso, stats, got) = send_batch(true);
        assert!(!gso, "GSO still on after the kernel refused it");
        assert_eq!(
            (stats.tx_sends, stats.tx_packets, stats.tx_errors),
            (3, 3, 0)
        );
        let ids: Vec<_> = got.iter().map(|(p, id)| (p.len(), *id)).collect();
        assert_eq!(ids, [(100, Some(0)), (100, Some(0)), (100, Some(0))]);
        // Each packet's own bytes, in order (the ICRC aside).
        for (k, (p, _)) in got.iter().enumerate() {
            let want: Vec<u8> = (100 * k as u32..100 * k as u32 + 96)
                .map(|i| (i * 7 + 1) as u8)
                .collect();
            assert_eq!(p[..96], want[..]);
        }
    }
}
