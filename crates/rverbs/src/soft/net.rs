//! The device's network engine: its UDP socket, the QP table, and progress.
//!
//! All transport state sits behind one lock. Whoever holds it makes
//! progress — receive a batch of datagrams, run due timers, transmit what
//! QPs owe, hand completions to CQs and events to contexts:
//! - a thread posting work transmits it at once on its own thread;
//! - a thread polling an empty CQ drives progress itself when the lock is
//!   free (so a busy-polling application needs no second spinning thread);
//! - the engine thread sleeps in `poll(2)` on the socket and a wake-up
//!   eventfd, with the earliest timer as timeout, so an idle device costs no
//!   CPU.
//!
//! Every packet carries an ICRC computed for the IP header Linux will write:
//! the socket is unconnected with Don't Fragment set, so the IPv4 ID is 0.
//! Received packets are checked for that header (any rverbs peer, or any
//! Linux sender on such a socket); other packets fail the check, are
//! counted and dropped.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{recvfrom, SockaddrStorage};
use rverbs_wire::icrc::{self, Ipv4Header, Ipv6Header, ROCE_V2_PORT};
use rverbs_wire::PacketRepr;

use crate::event::AsyncEventType;
use crate::soft::context::AsyncSource;
use crate::soft::device::SoftDevice;
use crate::soft::memory::MrTable;
use crate::soft::qp::QpCore;
use crate::soft::transport::rc::RcQp;
use crate::soft::transport::QpEvent;

/// Largest RoCE packet the engine builds: headers, a 4096-byte MTU, pad, ICRC.
const MAX_PACKET: usize = 4096 + 128;
/// Datagrams received per pass before timers and transmission get a turn.
const RX_BUDGET: usize = 256;

/// Counters of a device's network engine.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct NetStats {
    /// RoCE packets sent.
    pub tx_packets: u64,
    /// Packets that could not be sent (full socket buffer, network error);
    /// the transport retransmits them.
    pub tx_errors: u64,
    /// Datagrams received on port 4791.
    pub rx_packets: u64,
    /// Received packets whose ICRC did not match (corrupt, or from a sender
    /// whose IPv4 ID is not 0), dropped.
    pub rx_icrc_errors: u64,
    /// Received packets that are not valid RoCEv2, dropped.
    pub rx_malformed: u64,
    /// Received packets for a QP that does not exist or is connected to
    /// another peer, dropped.
    pub rx_unknown_qp: u64,
}

/// A QP on the wire.
pub(crate) struct QpSlot {
    pub(crate) core: Arc<QpCore>,
    /// `None` while the QP is in RESET.
    pub(crate) rc: Option<RcQp>,
    /// The peer's UDP endpoint (from the address vector).
    pub(crate) peer: Option<SocketAddr>,
    dirty: bool,
}

struct State {
    socket: Option<UdpSocket>,
    local: SocketAddr,
    qps: HashMap<u32, QpSlot>,
    next_qpn: u32,
    /// QPs that may owe packets or events.
    dirty: Vec<u32>,
    stats: NetStats,
    rx: Vec<u8>,
    tx: Vec<u8>,
    /// When the engine thread will wake up by itself (`None`: never).
    thread_wakes_at: Option<Instant>,
}

/// The network engine of one device.
pub(crate) struct Engine {
    state: Mutex<State>,
    waker: EventFd,
    socket_fd: Mutex<Option<OwnedFd>>,
    thread_started: AtomicBool,
    stopped: AtomicBool,
}

impl Engine {
    /// An engine on a bound socket; the thread starts with the first QP.
    pub(crate) fn new(socket: UdpSocket) -> io::Result<Engine> {
        socket.set_nonblocking(true)?;
        let local = socket.local_addr()?;
        crate::soft::sys::set_dont_fragment(&socket, local.is_ipv6())?;
        let socket_fd = socket.as_fd().try_clone_to_owned()?;
        let waker = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        let start = (getrandom::u32().unwrap_or(0x5a5a) & 0x00ff_ffff).max(2);
        Ok(Engine {
            state: Mutex::new(State {
                socket: Some(socket),
                local,
                qps: HashMap::new(),
                next_qpn: start,
                dirty: Vec::new(),
                stats: NetStats::default(),
                rx: vec![0u8; 64 * 1024],
                tx: vec![0u8; MAX_PACKET],
                thread_wakes_at: None,
            }),
            waker,
            socket_fd: Mutex::new(Some(socket_fd)),
            thread_started: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The engine's counters.
    pub(crate) fn stats(&self) -> NetStats {
        self.lock().stats
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
            if n >= 2 && !st.qps.contains_key(&n) {
                break n;
            }
        };
        let core = make(qpn);
        st.qps.insert(
            qpn,
            QpSlot {
                core: core.clone(),
                rc: None,
                peer: None,
                dirty: false,
            },
        );
        drop(st);
        self.start_thread(dev);
        core
    }

    /// Takes a QP off the wire; its outstanding work is dropped unreported,
    /// as destroying a QP does.
    pub(crate) fn remove_qp(&self, qpn: u32) {
        let mut st = self.lock();
        st.qps.remove(&qpn);
    }

    /// Runs `f` on QP `qpn`'s slot, then transmits what it owes and
    /// delivers its completions, on the caller's thread.
    pub(crate) fn with_qp<R>(
        &self,
        dev: &SoftDevice,
        qpn: u32,
        f: impl FnOnce(&mut QpSlot) -> R,
    ) -> Option<R> {
        let mut st = self.lock();
        let slot = st.qps.get_mut(&qpn)?;
        let r = f(slot);
        mark_dirty(&mut st, qpn);
        let now = Instant::now();
        flush(&mut st, &dev.mrs, now);
        self.wake_if_earlier(&st);
        Some(r)
    }

    /// Makes progress if no one else is: for a thread that polls an empty CQ.
    pub(crate) fn try_progress(&self, dev: &SoftDevice) -> bool {
        match self.state.try_lock() {
            Ok(mut st) => {
                progress(&mut st, &dev.mrs, Instant::now());
                self.wake_if_earlier(&st);
                true
            }
            Err(TryLockError::Poisoned(p)) => {
                let mut st = p.into_inner();
                progress(&mut st, &dev.mrs, Instant::now());
                true
            }
            Err(TryLockError::WouldBlock) => false,
        }
    }

    /// Wakes the engine thread if a timer now falls before it would wake.
    fn wake_if_earlier(&self, st: &State) {
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

    fn start_thread(&self, dev: &Arc<SoftDevice>) {
        if self.thread_started.swap(true, Ordering::AcqRel) {
            return;
        }
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
            if let Some(rc) = st.qps.get_mut(&qpn).and_then(|s| s.rc.as_mut()) {
                rc.enter_error();
            }
            mark_dirty(&mut st, qpn);
        }
        flush(&mut st, &dev.mrs, Instant::now());
        st.socket = None;
        drop(st);
        self.socket_fd
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let _ = self.waker.write(1);
    }
}

fn engine_thread(dev: &Arc<SoftDevice>) {
    let engine = &dev.engine;
    loop {
        if engine.stopped.load(Ordering::Acquire) {
            return;
        }
        let timeout = {
            let mut st = engine.lock();
            let next = next_deadline(&st);
            st.thread_wakes_at = next;
            next
        };
        let poll_timeout = match timeout {
            None => PollTimeout::NONE,
            Some(t) => {
                let left = t.saturating_duration_since(Instant::now());
                PollTimeout::from(
                    u16::try_from(left.as_micros().div_ceil(1000)).unwrap_or(u16::MAX),
                )
            }
        };
        let socket_fd = {
            let guard = engine.socket_fd.lock().unwrap_or_else(|p| p.into_inner());
            match guard.as_ref().map(|fd| fd.try_clone()) {
                Some(Ok(fd)) => fd,
                _ => return,
            }
        };
        let mut fds = [
            PollFd::new(socket_fd.as_fd(), PollFlags::POLLIN),
            PollFd::new(engine.waker.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, poll_timeout) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => {
                tracing::error!("engine poll failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = engine.waker.read();
        let mut st = engine.lock();
        st.thread_wakes_at = None;
        progress(&mut st, &dev.mrs, Instant::now());
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

fn next_deadline(st: &State) -> Option<Instant> {
    st.qps
        .values()
        .filter_map(|s| s.rc.as_ref().and_then(RcQp::next_timeout))
        .min()
}

/// One pass: receive a batch, run due timers, transmit and deliver.
fn progress(st: &mut State, mem: &MrTable, now: Instant) {
    receive(st, mem, now);
    let due: Vec<u32> = st
        .qps
        .iter()
        .filter(|(_, s)| {
            s.rc.as_ref()
                .and_then(RcQp::next_timeout)
                .is_some_and(|t| t <= now)
        })
        .map(|(&q, _)| q)
        .collect();
    for qpn in due {
        if let Some(rc) = st.qps.get_mut(&qpn).and_then(|s| s.rc.as_mut()) {
            rc.handle_timeout(now);
        }
        mark_dirty(st, qpn);
    }
    flush(st, mem, now);
}

/// The IP and UDP headers of a packet between `src` and `dst` as Linux
/// writes them for an unconnected DF socket (IPv4 ID 0).
fn headers(src: SocketAddr, dst: SocketAddr, roce_len: usize) -> ([u8; 40], usize, [u8; 8]) {
    let udp_len = (roce_len + 8) as u16;
    let udp = icrc::udp_header(src.port(), dst.port(), udp_len);
    let mut ip = [0u8; 40];
    let ip_len = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let h = Ipv4Header {
                src: s,
                dst: d,
                id: 0,
                dont_fragment: true,
                tos: 0,
                ttl: 64,
            };
            ip[..20].copy_from_slice(&h.to_bytes(udp_len));
            20
        }
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V6(v) => v,
                IpAddr::V4(v) => v.to_ipv6_mapped(),
            };
            let h = Ipv6Header {
                src: v6(s),
                dst: v6(d),
                traffic_class: 0,
                flow_label: 0,
                hop_limit: 64,
            };
            ip.copy_from_slice(&h.to_bytes(udp_len));
            40
        }
    };
    (ip, ip_len, udp)
}

fn receive(st: &mut State, mem: &MrTable, now: Instant) {
    let Some(fd) = st.socket.as_ref().map(|s| s.as_raw_fd()) else {
        return;
    };
    let local = st.local;
    let mut rx = std::mem::take(&mut st.rx);
    for _ in 0..RX_BUDGET {
        let (n, from) = match recvfrom::<SockaddrStorage>(fd, &mut rx) {
            Ok((n, Some(addr))) => (n, addr),
            Ok((_, None)) => continue,
            Err(Errno::EAGAIN) => break,
            Err(Errno::EINTR) => continue,
            Err(e) => {
                tracing::warn!("receive failed: {e}");
                break;
            }
        };
        let Some(peer) = sockaddr(&from) else {
            continue;
        };
        let pkt = &rx[..n];
        st.stats.rx_packets += 1;
        let (ip, ip_len, udp) = headers(peer, local, n);
        match icrc::check(&ip[..ip_len], &udp, pkt) {
            Ok((computed, wire)) if computed == wire => {}
            _ => {
                st.stats.rx_icrc_errors += 1;
                continue;
            }
        }
        let Ok(p) = PacketRepr::parse(pkt) else {
            st.stats.rx_malformed += 1;
            continue;
        };
        let qpn = p.bth.dest_qp;
        let Some(slot) = st.qps.get_mut(&qpn) else {
            st.stats.rx_unknown_qp += 1;
            continue;
        };
        // Only the connected peer may talk to an RC QP.
        if slot.peer.is_some_and(|a| a.ip() != peer.ip()) {
            st.stats.rx_unknown_qp += 1;
            continue;
        }
        if let Some(rc) = slot.rc.as_mut() {
            rc.handle_packet(&p, now, mem);
        }
        mark_dirty(st, qpn);
    }
    st.rx = rx;
}

fn sockaddr(s: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = s.as_sockaddr_in() {
        return Some(SocketAddr::new(IpAddr::V4(v4.ip()), v4.port()));
    }
    s.as_sockaddr_in6()
        .map(|v6| SocketAddr::new(IpAddr::V6(v6.ip()), v6.port()))
}

/// Transmits what the dirty QPs owe and delivers their completions and events.
fn flush(st: &mut State, mem: &MrTable, now: Instant) {
    let local = st.local;
    let mut tx = std::mem::take(&mut st.tx);
    let dirty = std::mem::take(&mut st.dirty);
    for qpn in dirty {
        let socket = st.socket.as_ref();
        let Some(slot) = st.qps.get_mut(&qpn) else {
            continue;
        };
        slot.dirty = false;
        if let (Some(rc), Some(peer), Some(sock)) = (slot.rc.as_mut(), slot.peer, socket) {
            while let Some(n) = rc.poll_transmit(now, mem, &mut tx) {
                let (ip, ip_len, udp) = headers(local, peer, n);
                if icrc::fill(&ip[..ip_len], &udp, &mut tx[..n]).is_err() {
                    continue;
                }
                match sock.send_to(&tx[..n], peer) {
                    Ok(_) => st.stats.tx_packets += 1,
                    // A full socket buffer is a drop: the transport retransmits.
                    Err(_) => st.stats.tx_errors += 1,
                }
            }
        }
        deliver_events(slot);
    }
    st.tx = tx;
}

/// Hands a QP's completions to its CQs and its async events to its context.
/// A full CQ moves the QP to ERR with IBV_EVENT_QP_FATAL.
fn deliver_events(slot: &mut QpSlot) {
    let Some(rc) = slot.rc.as_mut() else { return };
    let core = &slot.core;
    let mut fatal = false;
    while let Some(e) = rc.poll_event() {
        let pushed = match e {
            QpEvent::SendCompletion(wc) => core.send_cq.push(wc, false),
            QpEvent::RecvCompletion(wc, solicited) => core.recv_cq.push(wc, solicited),
            QpEvent::Async(ev) => {
                core.ctx
                    .post_async(ev, AsyncSource::Qp(Arc::downgrade(core)));
                Ok(())
            }
        };
        if pushed.is_err() && !fatal {
            fatal = true;
            rc.enter_error();
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
