//! The engine's side of the same-host path (see `soft::local`): its links
//! to devices of this host, one shared-memory ring pair each; which QPs use
//! them; a packet pushed into a link's ring instead of sent; the rings
//! drained in each receive pass; and the doorbell that wakes a peer whose
//! threads sleep.
//!
//! The packets are the ones the wire carries, so the transports above are
//! the same either way, and a QP may receive from both; only the ICRC is
//! left out (nothing corrupts shared memory on the way). A link is made
//! when an RC or UC QP goes to RTR with a peer address that is not its own
//! device's: the device there, if it is an rverbs device on this host, in
//! this network namespace and of this user, agrees over its abstract
//! socket (`soft::local::handshake`); anything else — a remote peer, kernel
//! Soft-RoCE, another user, `RVERBS_SAME_HOST=0` on either side — keeps
//! the wire, and the counters say why.
//!
//! Waking: a thread that sleeps waiting for packets (the engine thread, a
//! parked poller) first counts itself in each ring's sleepers and looks at
//! the rings once more; a sender that pushed into a ring whose consumer
//! sleeps writes the peer device's doorbell, an eventfd the peer passed in
//! the handshake and every sleeper of the peer watches; the one that wakes
//! clears it.

use std::cell::Cell;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use nix::sys::socket::{recv, MsgFlags};
use rverbs_wire::icrc::ROCE_V2_PORT;
use smallvec::SmallVec;
use std::os::fd::AsRawFd;

use super::tx::with_payload_windows;
use super::{Engine, State};
use crate::soft::local::handshake::{self, LocalListener, Refusal};
use crate::soft::local::ring::{Consumer, Producer, RingPair, RingWatch, DEFAULT_RING_BYTES};
use crate::soft::local::LinkSetup;
use crate::soft::memory::{AccessError, AccessKind, MrTable, MwError, Resolved, WindowBytes};
use crate::soft::sys;
use crate::soft::transport::PayloadRef;
use crate::soft::transport::{AtomicOp, Memory};
use crate::wr::MwBindInfo;
use std::ops::Range;

/// Payload bytes per packet of an RC/UC QP whose peer is reached through a
/// same-host link (fixed when it enters RTR): a 1 MiB WRITE is four packets,
/// where the wire takes 256 at a 4 KiB MTU.
pub(super) const LOCAL_SEGMENT: u32 = 256 << 10;
/// Most packets a same-host QP keeps in flight. Large payloads stay in the
/// sender's memory (a record of a few dozen bytes each), small ones take
/// their size in the ring: 128 of 4 KiB are half a MiB, enough for small
/// messages to stream; a full ring holds a QP back in any case.
pub(super) const LOCAL_WINDOW: u32 = 128;
/// Bytes of a ring record before the packet: the segment size its sender
/// cuts requests into (0: the path MTU), flags, and the number of payload
/// stretches a cross-memory-attach record lists after the packet.
const RECORD_PREFIX: usize = 8;
/// The record's payload stays in the sender's memory (see [`CMA_MIN`]).
const FLAG_CMA: u16 = 1;
/// Bytes of one payload stretch in such a record: its address and length.
const IOV_ENTRY: usize = 16;
/// Payloads at least this long go by cross-memory attach when the link has
/// it: the receiver, after its own checks, copies them straight from the
/// sender's registered memory into its own with `process_vm_readv` (one
/// copy, where the ring takes two); shorter ones are copied into the ring,
/// which costs less than the system call.
const CMA_MIN: usize = 16 << 10;

/// Most SGEs a send WR has (`max_send_sge`), so most payload stretches a
/// record lists.
const MAX_STRETCHES: usize = 32;

/// The ring room a packet of up to `room` bytes may take as a record:
/// prefix, packet, the payload stretches of a cross-memory-attach record,
/// and the record's own header and padding.
pub(super) fn record_room(room: usize) -> usize {
    RECORD_PREFIX + room + IOV_ENTRY * MAX_STRETCHES + 16
}

/// The largest packet a same-host QP builds (a segment and its headers).
pub(super) const MAX_LOCAL_PACKET: usize = LOCAL_SEGMENT as usize + 128;

/// How soon a pass looks again at a QP held back by a full ring.
pub(super) const RING_FULL_RECHECK: Duration = Duration::from_micros(50);

/// Bytes after a cross-memory-attach record's prefix that give the
/// packet's shape: its length, and where its payload starts.
const CMA_SHAPE: usize = 8;

/// A packet taken from a ring.
pub(super) struct RingPacket<'a> {
    /// The packet; for a cross-memory-attach one, only the bytes before
    /// its payload (see `remote`).
    pub(super) pkt: &'a [u8],
    /// The segment size its sender cuts requests into (`None`: the MTU).
    pub(super) segment: Option<u32>,
    /// Where its payload lies in the sender's memory, if it is left there.
    pub(super) remote: Option<RemotePayload>,
    /// With `remote`: the packet's bytes after its payload, and its length.
    pub(super) trailer: &'a [u8],
    pub(super) pkt_len: usize,
}

/// A payload left in a same-host peer's memory.
pub(crate) struct RemotePayload {
    /// The peer's process.
    pub(crate) pid: i32,
    /// Its stretches (address, length), in order.
    pub(crate) iovs: SmallVec<[(u64, u64); 4]>,
}

impl RemotePayload {
    /// Bytes in all.
    pub(crate) fn len(&self) -> u64 {
        self.iovs
            .iter()
            .fold(0u64, |sum, &(_, n)| sum.saturating_add(n))
    }
}

impl<'a> RingPacket<'a> {
    fn parse(record: &'a [u8], pid: u32) -> Option<RingPacket<'a>> {
        let (prefix, rest) = record.split_at_checked(RECORD_PREFIX)?;
        let segment = u32::from_le_bytes(prefix[..4].try_into().ok()?);
        let flags = u16::from_le_bytes(prefix[4..6].try_into().ok()?);
        let niov = usize::from(u16::from_le_bytes(prefix[6..8].try_into().ok()?));
        let segment = (segment != 0).then_some(segment);
        if flags & FLAG_CMA == 0 {
            return Some(RingPacket {
                pkt: rest,
                segment,
                remote: None,
                trailer: &[],
                pkt_len: rest.len(),
            });
        }
        let (shape, rest) = rest.split_at_checked(CMA_SHAPE)?;
        let pkt_len = u32::from_le_bytes(shape[..4].try_into().ok()?) as usize;
        let at = u32::from_le_bytes(shape[4..].try_into().ok()?) as usize;
        let around = rest.len().checked_sub(niov * IOV_ENTRY)?;
        let (around, tail) = rest.split_at(around);
        let (pkt, trailer) = around.split_at_checked(at)?;
        let remote = RemotePayload {
            pid: i32::try_from(pid).ok()?,
            iovs: tail
                .chunks_exact(IOV_ENTRY)
                .map(|e| {
                    let addr = u64::from_le_bytes(e[..8].try_into().unwrap_or_default());
                    let len = u64::from_le_bytes(e[8..].try_into().unwrap_or_default());
                    (addr, len)
                })
                .collect(),
        };
        // The pieces must add up to the packet, and it must be one a QP
        // could have sent (the receiver builds it in a buffer that size).
        let whole = (at as u64)
            .checked_add(remote.len())?
            .checked_add(trailer.len() as u64)?;
        if whole != pkt_len as u64 || pkt_len > MAX_LOCAL_PACKET {
            return None;
        }
        Some(RingPacket {
            pkt,
            segment,
            remote: Some(remote),
            trailer,
            pkt_len,
        })
    }
}

/// How long a retransmission timer put off for packets still in a ring
/// waits before it looks again (see [`Links::peer_behind`]).
pub(super) const RING_LATE_RECHECK: Duration = Duration::from_millis(1);
/// How long a ring's reader may take nothing while packets wait before the
/// transport's timers count them lost after all (a peer stopped, not dead).
const RING_STALL_LIMIT: Duration = Duration::from_secs(2);

/// How long ringing a sleeping peer's doorbell for new requests may be put
/// off while its own records to us still wait unread: we are awake and pass
/// again, and we need nothing from it before we have read those (the
/// requester of a READ stream, pulling the responses described, sent each
/// new request to a responder asleep since its last answer, and the
/// wake-up — an inter-processor interrupt in a VM — took a sixth of the
/// pulling thread's time). After this long it is rung anyway; a response
/// (an ACK the peer's window waits for) is never put off.
const DOORBELL_DEFER: Duration = Duration::from_micros(200);

/// How often a link looks whether its peer is gone (two system calls: a
/// pass while a full ring holds QPs back asks every time).
const PEER_CHECK: Duration = Duration::from_millis(1);

/// How long a connecting handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a refusal stands before a QP to that address asks again.
const REFUSAL_STANDS: Duration = Duration::from_millis(100);

/// Whether the same-host path may be used: `RVERBS_SAME_HOST=0` turns it
/// off for the process (no listener, no handshake: the wire for every QP,
/// for captures and interop tests).
pub(crate) fn enabled() -> bool {
    crate::soft::config::switched_on("RVERBS_SAME_HOST")
}

/// Whether payloads may go by cross-memory attach: `RVERBS_SAME_HOST_CMA=0`
/// keeps every payload in the ring (two copies), as where a container's
/// seccomp profile refuses `process_vm_readv` — to measure that fallback.
fn cma_enabled() -> bool {
    crate::soft::config::switched_on("RVERBS_SAME_HOST_CMA")
}

/// A link to a device of this host.
pub(super) struct Link {
    /// The peer device's address.
    pub(super) peer: IpAddr,
    tx: Producer,
    rx: Consumer,
    /// Records were pushed since the doorbell was last considered.
    pushed: bool,
    /// Among them a response (an ACK, a READ response, an atomic ACK):
    /// what a sleeping peer waits for, so its doorbell is not put off.
    pushed_response: bool,
    /// Cross-memory attach works both ways (see [`CMA_MIN`]).
    cma: bool,
    /// The peer's process.
    peer_pid: u32,
    /// How far the peer had read, and when that was first seen.
    reader_seen: Option<(u64, Instant)>,
    /// The handshake's connection: end-of-file once the peer's device is
    /// gone — unless a child the peer forked holds it open too.
    conn: OwnedFd,
    /// The peer's process (a pidfd): readable once it has exited, even if
    /// a child it forked lives on with its descriptors. `None` where the
    /// kernel has no pidfds.
    peer_process: Option<OwnedFd>,
    /// When the peer was last found alive (see [`PEER_CHECK`]).
    alive_at: Cell<Option<Instant>>,
    /// The peer device's doorbell (an eventfd).
    doorbell: OwnedFd,
    /// Since when ringing the doorbell has been put off (see
    /// [`DOORBELL_DEFER`]).
    bell_deferred: Option<Instant>,
}

/// The engine's links and what it remembers of handshakes.
#[derive(Default)]
pub(super) struct Links {
    /// Oldest first: QPs send on the first link to their peer's device.
    pub(super) list: Vec<Link>,
    /// The link a receive pass starts at (each pass the next one, so a
    /// busy peer does not starve the others).
    pub(super) rx_next: usize,
    /// Addresses whose handshake failed lately, and when.
    refused: Vec<(IpAddr, Instant)>,
}

impl Links {
    /// The link to the device at `peer`, if there is one.
    pub(super) fn to(&mut self, peer: IpAddr) -> Option<&mut Link> {
        self.list.iter_mut().find(|l| l.peer == peer)
    }

    /// Whether packets sent to the device at `peer` still wait in the
    /// link's ring, read by a peer that is alive and has read something
    /// within [`RING_STALL_LIMIT`]: then they are not lost, and a due
    /// retransmission timer is put off (a slow reader — a debug build, a
    /// busy core — would otherwise have them resent while they wait).
    ///
    /// `mark`: where the QP's own last packet ended in the ring (`None`: it
    /// sent none there). Once the reader is past it, the QP's packets were
    /// all read, and a timer that runs out means a loss like any other.
    pub(super) fn peer_behind(&mut self, peer: IpAddr, now: Instant, mark: Option<u64>) -> bool {
        let Some(mark) = mark else { return false };
        let Some(link) = self.to(peer) else {
            return false;
        };
        let consumed = link.tx.progress().0.consumed();
        if consumed >= mark || link.peer_gone() {
            return false;
        }
        match link.reader_seen {
            Some((at, when)) if at == consumed => {
                now.saturating_duration_since(when) < RING_STALL_LIMIT
            }
            _ => {
                link.reader_seen = Some((consumed, now));
                true
            }
        }
    }

    /// Drops links whose peer is gone (its handshake connection reads
    /// end-of-file, or its process has exited): a new device may have
    /// taken its address.
    pub(super) fn prune_dead(&mut self) {
        self.list.retain(|l| !l.peer_gone());
    }

    /// Whether any link's ring holds records not yet received.
    pub(super) fn have_records(&self) -> bool {
        self.list.iter().any(|l| !l.rx.is_empty())
    }

    /// Handles for sleepers (see the module docs).
    pub(super) fn watches(&self, out: &mut SmallVec<[RingWatch; 4]>) {
        out.extend(self.list.iter().map(|l| l.rx.watch()));
    }
}

/// Counts a sleeper in each of `watches`' rings; whether records already
/// wait there (then it must not sleep). Undo with [`sleep_end`].
pub(super) fn sleep_begin(watches: &[RingWatch]) -> bool {
    for w in watches {
        w.sleep_begin();
    }
    watches.iter().any(RingWatch::has_records)
}

/// The sleeper is up.
pub(super) fn sleep_end(watches: &[RingWatch]) {
    for w in watches {
        w.sleep_end();
    }
}

impl Link {
    /// Whether the peer's device is gone: its handshake connection reads
    /// end-of-file, or its process has exited (a child it forked keeps the
    /// connection open, but reads no ring). A peer found alive counts as
    /// alive for [`PEER_CHECK`]; a gone one stays gone.
    fn peer_gone(&self) -> bool {
        let now = Instant::now();
        if self
            .alive_at
            .get()
            .is_some_and(|t| now.saturating_duration_since(t) < PEER_CHECK)
        {
            return false;
        }
        let mut b = [0u8; 1];
        let peeked = recv(
            self.conn.as_raw_fd(),
            &mut b,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        );
        let gone = matches!(peeked, Ok(0) | Err(nix::errno::Errno::ECONNRESET))
            || self
                .peer_process
                .as_ref()
                .is_some_and(|p| sys::wait_readable(&[p.as_raw_fd()], Duration::ZERO) != 0);
        self.alive_at.set((!gone).then_some(now));
        gone
    }

    /// Whether a packet of `len` bytes fits into the ring now.
    pub(super) fn has_room(&mut self, len: usize) -> bool {
        self.tx.has_room(len)
    }

    /// Pushes the packet `pkt` — headers and, where `refs` say, payload
    /// from registered memory — into the ring. `false` if a reference no
    /// longer checks (its MR was deregistered since the packet was built:
    /// lost, as on the wire, and the retransmission fails the WR) or the
    /// ring is full.
    /// `segment`: the payload bytes per packet the sending QP cuts its
    /// requests into, when not the path MTU (the receiver checks packet
    /// sizes against it, and cuts READ responses so).
    /// `by_reference`: the payload may stay in our memory for the peer to
    /// copy (RC, whose sends complete only once the peer acknowledged
    /// them; not UC, whose complete when sent).
    pub(super) fn push(
        &mut self,
        mem: &MrTable,
        pkt: &[u8],
        refs: &[PayloadRef],
        segment: Option<u32>,
        by_reference: bool,
    ) -> bool {
        let mut prefix = [0u8; RECORD_PREFIX];
        prefix[..4].copy_from_slice(&segment.unwrap_or(0).to_le_bytes());
        // RC's responses: READ responses (0x0d-0x10), ACKNOWLEDGE, ATOMIC
        // ACKNOWLEDGE.
        self.pushed_response |= pkt.first().is_some_and(|&op| (0x0d..=0x12).contains(&op));
        if refs.is_empty() {
            let pushed = self.tx.push_pieces(&[&prefix, pkt]);
            self.pushed |= pushed;
            return pushed;
        }
        let pushed = with_payload_windows(mem, refs, |windows| {
            let windows: SmallVec<[&WindowBytes<'_>; 4]> = windows.iter().flatten().collect();
            if windows.len() != refs.len() {
                // An MR deregistered since the packet was built.
                return false;
            }
            let payload: usize = refs.iter().map(|r| r.len as usize).sum();
            if by_reference && self.cma && payload >= CMA_MIN {
                self.push_by_reference(&mut prefix, pkt, refs, &windows, payload)
            } else {
                self.push_copied(&prefix, pkt, refs, &windows)
            }
        });
        self.pushed |= pushed;
        pushed
    }

    /// Pushes a packet whose payload the peer copies itself, straight from
    /// our registered memory into its own (one copy): the record holds the
    /// bytes around the payload (headers, ICRC field), the packet's length
    /// and where the payload lies — a few dozen bytes for a packet of a
    /// quarter MiB.
    fn push_by_reference(
        &mut self,
        prefix: &mut [u8; RECORD_PREFIX],
        pkt: &[u8],
        refs: &[PayloadRef],
        windows: &[&WindowBytes<'_>],
        payload: usize,
    ) -> bool {
        prefix[4..6].copy_from_slice(&FLAG_CMA.to_le_bytes());
        prefix[6..8].copy_from_slice(&(refs.len() as u16).to_le_bytes());
        let at = refs[0].at as usize;
        let end = at + payload;
        let (head_bytes, tail_bytes) = (&pkt[..at], &pkt[end.min(pkt.len())..]);
        let mut shape = [0u8; CMA_SHAPE];
        shape[..4].copy_from_slice(&(pkt.len() as u32).to_le_bytes());
        shape[4..].copy_from_slice(&(at as u32).to_le_bytes());
        let len = RECORD_PREFIX
            + CMA_SHAPE
            + head_bytes.len()
            + tail_bytes.len()
            + IOV_ENTRY * refs.len();
        self.tx.push(len, |record| {
            let (head, rest) = record.split_at_mut(RECORD_PREFIX);
            head.copy_from_slice(prefix);
            let (sh, rest) = rest.split_at_mut(CMA_SHAPE);
            sh.copy_from_slice(&shape);
            let (hb, rest) = rest.split_at_mut(head_bytes.len());
            hb.copy_from_slice(head_bytes);
            let (tb, iovs) = rest.split_at_mut(tail_bytes.len());
            tb.copy_from_slice(tail_bytes);
            for ((r, w), entry) in refs
                .iter()
                .zip(windows)
                .zip(iovs.chunks_exact_mut(IOV_ENTRY))
            {
                let addr = match w {
                    WindowBytes::Owned(bytes) => bytes.as_ptr() as u64,
                    WindowBytes::Foreign(bytes) => bytes.addr(),
                };
                entry[..8].copy_from_slice(&addr.to_le_bytes());
                entry[8..].copy_from_slice(&u64::from(r.len).to_le_bytes());
            }
        })
    }

    /// Pushes a packet with its payload copied into the record.
    fn push_copied(
        &mut self,
        prefix: &[u8; RECORD_PREFIX],
        pkt: &[u8],
        refs: &[PayloadRef],
        windows: &[&WindowBytes<'_>],
    ) -> bool {
        self.tx.push(RECORD_PREFIX + pkt.len(), |record| {
            let (head, body) = record.split_at_mut(RECORD_PREFIX);
            head.copy_from_slice(prefix);
            let mut pos = 0;
            for (r, w) in refs.iter().zip(windows) {
                let at = r.at as usize;
                body[pos..at].copy_from_slice(&pkt[pos..at]);
                let end = at + r.len as usize;
                match w {
                    WindowBytes::Owned(bytes) => body[at..end].copy_from_slice(bytes),
                    WindowBytes::Foreign(bytes) => {
                        bytes.copy_to(&mut body[at..end]);
                    }
                }
                pos = end;
            }
            body[pos..].copy_from_slice(&pkt[pos..]);
        })
    }

    /// Where this side's records end now (compare with what the reader
    /// has consumed: see [`Links::peer_behind`]).
    pub(super) fn pushed_to(&self) -> u64 {
        self.tx.progress().1
    }

    /// The next packet from the peer, in place (see `Consumer::peek`),
    /// with the segment size its sender cuts requests into (`None`: the
    /// path MTU) and, for a payload the peer left in its own memory, where
    /// it lies there; `Some(None)` for a record that does not parse, which
    /// the caller skips with [`consume`](Self::consume) like any other.
    pub(super) fn next_record(&mut self) -> Option<Option<RingPacket<'_>>> {
        let pid = self.peer_pid;
        self.rx.peek().map(|record| RingPacket::parse(record, pid))
    }

    /// Done with the record [`next_record`](Self::next_record) gave.
    pub(super) fn consume(&mut self) {
        self.rx.consume();
    }

    /// The UDP endpoint of the peer device (what its packets count as
    /// coming from).
    pub(super) fn peer_endpoint(&self) -> SocketAddr {
        SocketAddr::new(self.peer, ROCE_V2_PORT)
    }
}

/// Rings the doorbell of every link a pass pushed into whose consumer
/// sleeps: adds one to the peer device's eventfd. For requests alone it is
/// put off (up to [`DOORBELL_DEFER`]) while the peer's records to us wait
/// unread: the pass that reads the last of them rings it.
pub(super) fn ring_doorbells(st: &mut State) {
    let State { links, stats, .. } = st;
    let mut now = None;
    for link in &mut links.list {
        if !(link.pushed && link.tx.peer_sleeping()) {
            link.pushed = false;
            link.pushed_response = false;
            link.bell_deferred = None;
            continue;
        }
        if !link.pushed_response && !link.rx.is_empty() {
            let now = *now.get_or_insert_with(Instant::now);
            let since = *link.bell_deferred.get_or_insert(now);
            if now.saturating_duration_since(since) < DOORBELL_DEFER {
                stats.local_doorbells_deferred += 1;
                continue;
            }
        }
        match nix::unistd::write(&link.doorbell, &1u64.to_ne_bytes()) {
            // EAGAIN: the count is at its maximum, so it is readable.
            Ok(_) | Err(nix::errno::Errno::EAGAIN) => {
                stats.local_doorbells_sent += 1;
                link.pushed = false;
                link.pushed_response = false;
                link.bell_deferred = None;
            }
            // Tried again next pass.
            Err(_) => {}
        }
    }
}

/// Clears the device's doorbell after a sleeper saw it readable; the
/// caller makes a pass next, which drains the records it announced.
pub(super) fn doorbell_heard(engine: &Engine) {
    if engine.doorbell.read().is_ok() {
        engine
            .doorbells_heard
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Engine {
    /// Starts answering same-host handshakes for this device (unless the
    /// path is off, or the device's address is a wildcard).
    pub(crate) fn start_local(self: &Arc<Self>) {
        if !enabled() || self.local_addr.ip().is_unspecified() {
            return;
        }
        let weak: Weak<Engine> = Arc::downgrade(self);
        let doorbell = match self.doorbell.as_fd().try_clone_to_owned() {
            Ok(fd) => fd,
            Err(e) => {
                tracing::debug!(local = %self.local_addr, "no same-host listener ({e})");
                return;
            }
        };
        match LocalListener::start(self.local_addr.ip(), doorbell, move |setup| {
            if let Some(engine) = weak.upgrade() {
                engine.install_link(setup);
            }
        }) {
            Ok(listener) => {
                let mut slot = self
                    .local_listener
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if self.stopped.load(std::sync::atomic::Ordering::Acquire) || self.has_failed() {
                    return;
                }
                *slot = Some(listener);
            }
            Err(e) => tracing::debug!(
                local = %self.local_addr,
                "no same-host listener ({e}): peers on this host use the wire"
            ),
        }
    }

    /// Waits until every same-host peer has taken the packets sent to it
    /// so far (at most `limit`): those whose payloads it copies from this
    /// process's registered memory (cross-memory attach) have then been
    /// copied. Deregistration waits for this before the memory goes back to
    /// its owner, so a peer never reads memory that is no longer an MR. A
    /// peer that does not keep up within `limit` (stopped, or dying) is
    /// waited for no longer; one whose device is gone reads nothing more.
    pub(crate) fn await_peer_copies(&self, limit: Duration) {
        // (how far the peer has read, where we had written to).
        let mut pending = Vec::new();
        let _ = self.locked(|st| {
            for link in st.links.list.iter().filter(|l| l.cma && !l.peer_gone()) {
                pending.push(link.tx.progress());
            }
        });
        let until = Instant::now() + limit;
        let mut looked_at = Instant::now();
        loop {
            pending.retain(|(p, head)| p.consumed() < *head);
            if pending.is_empty() {
                return;
            }
            let now = Instant::now();
            if now >= until {
                tracing::warn!(
                    local = %self.local_addr,
                    "a same-host peer did not take its packets within {limit:?}; \
                     deregistering anyway"
                );
                let _ = self.locked(|st| st.stats.local_copy_waits_given_up += 1);
                return;
            }
            // A peer that dies meanwhile reads nothing more: its link's
            // liveness is looked at again (at most once per PEER_CHECK).
            if now.saturating_duration_since(looked_at) >= PEER_CHECK {
                looked_at = now;
                let _ = self.locked(|st| {
                    pending.retain(|(p, _)| {
                        st.links
                            .list
                            .iter()
                            .any(|l| p.is_of(&l.tx) && !l.peer_gone())
                    });
                });
            }
            // The peer may be waiting for its doorbell's packets to be seen.
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Stops answering handshakes (the device is gone or failed): the
    /// name is free for the next device with this address.
    pub(super) fn stop_local(&self) {
        let listener = self
            .local_listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        drop(listener);
    }

    /// Makes sure a link to the device at `peer` exists if it can: called
    /// (without the lock) when a QP is given that peer. What happened is
    /// counted for the QP: a same-host QP, or the wire and why.
    /// Whether the QP now has a link to its peer.
    pub(super) fn ensure_link(&self, peer: IpAddr) -> bool {
        let local = self.local_addr.ip();
        if peer == local || peer.is_multicast() || peer.is_unspecified() {
            return false;
        }
        if !enabled() {
            let _ = self.locked(|st| st.stats.wire_qps_path_off += 1);
            return false;
        }
        let known = self.locked(|st| {
            st.links.prune_dead();
            if st.links.to(peer).is_some() {
                st.stats.local_qps += 1;
                return Some(true);
            }
            let now = Instant::now();
            st.links
                .refused
                .retain(|(_, at)| now.saturating_duration_since(*at) < REFUSAL_STANDS);
            if st.links.refused.iter().any(|(a, _)| *a == peer) {
                st.stats.wire_qps_not_local += 1;
                return Some(false);
            }
            None
        });
        match known {
            Ok(Some(linked)) => return linked,
            Ok(None) => {}
            Err(_) => return false,
        }
        let dialled = handshake::connect(
            local,
            peer,
            DEFAULT_RING_BYTES,
            HANDSHAKE_TIMEOUT,
            self.doorbell.as_fd(),
        );
        match dialled {
            Ok(setup) => {
                let linked = self.install_link(setup);
                if linked {
                    let _ = self.locked(|st| st.stats.local_qps += 1);
                }
                linked
            }
            Err(refusal) => {
                tracing::debug!(
                    local = %self.local_addr, %peer,
                    "same-host path not taken: {refusal}; the wire is used"
                );
                let _ = self.locked(|st| {
                    st.links.refused.push((peer, Instant::now()));
                    match refusal {
                        Refusal::NotLocal => st.stats.wire_qps_not_local += 1,
                        Refusal::OtherUser { .. } => st.stats.wire_qps_other_user += 1,
                        _ => st.stats.wire_qps_refused += 1,
                    }
                });
                false
            }
        }
    }

    /// Takes a link a handshake agreed into use. Whether it was.
    fn install_link(&self, setup: LinkSetup) -> bool {
        let rings = match RingPair::map(&setup.shm, setup.initiator) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(peer = %setup.peer_addr, "same-host rings unusable: {e}");
                return false;
            }
        };
        tracing::debug!(
            local = %self.local_addr, peer = %setup.peer_addr, pid = setup.peer_pid,
            cma = setup.cma, cma_refused = ?setup.cma_refused, "same-host link up"
        );
        // Taken now, while the peer is surely alive (it has just answered).
        let peer_process = sys::pidfd_open(setup.peer_pid);
        let installed = self
            .locked(|st| {
                // Not on a device that is going away (or gone): its peers
                // would never see the link end.
                if st.socket.is_none() || self.stopped.load(std::sync::atomic::Ordering::Acquire) {
                    return false;
                }
                // A second link to the same device (both dialled at once)
                // is drained but not sent on: every QP to that device sends
                // on the oldest, so a stream never switches rings midway
                // (which would reorder it).
                let link = Link {
                    peer: setup.peer_addr,
                    tx: rings.tx,
                    rx: rings.rx,
                    pushed: false,
                    pushed_response: false,
                    cma: setup.cma && cma_enabled(),
                    peer_pid: setup.peer_pid,
                    reader_seen: None,
                    conn: setup.conn,
                    peer_process,
                    alive_at: Cell::new(None),
                    doorbell: setup.peer_doorbell,
                    bell_deferred: None,
                };
                st.links.list.push(link);
                st.links.refused.retain(|(a, _)| *a != setup.peer_addr);
                st.stats.local_links += 1;
                if !setup.cma {
                    st.stats.local_links_without_cma += 1;
                }
                true
            })
            .unwrap_or(false);
        // Threads asleep now do not count as the new ring's sleepers: they
        // look again (the engine thread, and parked pollers, which also
        // compare `links_changed` before they sleep).
        self.links_changed
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _ = self.waker.write(1);
        self.bell.wake();
        installed
    }
}

/// Registered memory as the transport sees it while it handles a same-host
/// packet whose payload stayed in the sender's memory: every check and
/// access as the MR table's, except that a write of (part of) that payload
/// — the transport writes `pkt.payload`'s bytes where they belong, after
/// its checks — is made by the kernel straight from the sender's memory
/// into the MR (`process_vm_readv`), the only copy. The packet's payload
/// bytes in the ring (`hole`) are never read.
pub(super) struct PulledPayload<'a> {
    pub(super) mem: &'a MrTable,
    /// Addresses of the packet's payload in the ring record.
    pub(super) hole: Range<usize>,
    pub(super) remote: &'a RemotePayload,
}

impl PulledPayload<'_> {
    /// The stretches of the sender's memory that hold payload bytes
    /// `[off, off + len)`.
    fn stretches(&self, mut off: u64, mut len: u64) -> SmallVec<[(u64, u64); 4]> {
        let mut out = SmallVec::new();
        for &(addr, n) in &self.remote.iovs {
            if len == 0 {
                break;
            }
            if off >= n {
                off -= n;
                continue;
            }
            let take = (n - off).min(len);
            out.push((addr.wrapping_add(off), take));
            len -= take;
            off = 0;
        }
        out
    }
}

impl Memory for PulledPayload<'_> {
    fn check(
        &self,
        key: u32,
        va: u64,
        len: u64,
        pd: u64,
        kind: AccessKind,
    ) -> Result<(), AccessError> {
        Memory::check(self.mem, key, va, len, pd, kind)
    }

    fn read(
        &self,
        key: u32,
        va: u64,
        pd: u64,
        kind: AccessKind,
        dst: &mut [u8],
    ) -> Result<(), AccessError> {
        Memory::read(self.mem, key, va, pd, kind, dst)
    }

    fn write(
        &self,
        key: u32,
        va: u64,
        pd: u64,
        kind: AccessKind,
        src: &[u8],
    ) -> Result<(), AccessError> {
        let at = src.as_ptr() as usize;
        if src.is_empty() || !self.hole.contains(&at) || at + src.len() > self.hole.end {
            return Memory::write(self.mem, key, va, pd, kind, src);
        }
        let stretches = self.stretches((at - self.hole.start) as u64, src.len() as u64);
        let pid = self.remote.pid;
        self.mem
            .write(key, va, src.len(), kind, Some(pd), |mut w| {
                w.fill_raw(|dst, len| {
                    // SAFETY: `dst..dst+len` is the checked window into the
                    // MR, behind its write lock (no Rust reference to it
                    // meanwhile); the kernel copies the sender's bytes in.
                    unsafe { sys::read_from_process(pid, dst, len, &stretches) }
                })
            })?
            .map_err(AccessError::PeerMemory)
    }

    fn atomic(
        &self,
        key: u32,
        va: u64,
        pd: u64,
        kind: AccessKind,
        op: AtomicOp,
    ) -> Result<u64, AccessError> {
        Memory::atomic(self.mem, key, va, pd, kind, op)
    }

    fn resolve_remote(
        &self,
        rkey: u32,
        va: u64,
        len: u64,
        kind: AccessKind,
        pd: u64,
        qpn: u32,
    ) -> Result<Resolved, AccessError> {
        Memory::resolve_remote(self.mem, rkey, va, len, kind, pd, qpn)
    }

    fn bind_mw(
        &self,
        mw_rkey: u32,
        rkey: u32,
        info: &MwBindInfo,
        pd: u64,
        qpn: u32,
    ) -> Result<u32, MwError> {
        Memory::bind_mw(self.mem, mw_rkey, rkey, info, pd, qpn)
    }

    fn invalidate(&self, rkey: u32, pd: u64, qpn: Option<u32>) -> Result<(), MwError> {
        Memory::invalidate(self.mem, rkey, pd, qpn)
    }
}
