//! Transmit: what the dirty QPs owe, built into one buffer and handed to
//! the kernel in as few system calls as it takes — consecutive packets of
//! one QP with the same size as one UDP GSO send, up to
//! [`sys::MAX_DATAGRAMS`] sends per `sendmmsg`, payloads straight from the
//! registered memory they come from, each packet's ICRC computed for the IP
//! header Linux will give it. Then each QP's completions and events go out
//! and its timer is filed.

use std::io::{self, IoSlice};
use std::net::{SocketAddr, UdpSocket};
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::socket::SockaddrStorage;
use rverbs_wire::icrc::{self, IpUdpHeaders};
use rverbs_wire::packet::ICRC_LEN;
use smallvec::SmallVec;

use super::local::{self, LOCAL_SEGMENT};
use super::slot::Transport;
use super::{
    in_flight_cost, peer_endpoint, NetStats, State, FLUSH_BUDGET, FLUSH_CHECK_EVERY,
    FLUSH_PASS_TIME, MAX_BATCH_BYTES, MAX_BATCH_SEGMENTS, MAX_PACKET,
};
use crate::soft::memory::{MrCore, MrTable, WindowBytes};
use crate::soft::sys;
use crate::soft::transport::rc::{AckPolicy, RcQp};
use crate::soft::transport::{PayloadRef, TxBuffer};

/// Packets gathered for one send: `count` segments of `seg` bytes (the last
/// may be shorter), `len` bytes in all, their I/O vector at most `iovs`
/// entries long (see [`iov_entries`]).
#[derive(Default, Clone, Copy)]
struct Batch {
    len: usize,
    seg: usize,
    count: usize,
    iovs: usize,
}

/// One packet of a batch: its length in the transmit buffer, and which of
/// the batch's payload references fill it.
#[derive(Debug, Clone)]
pub(super) struct TxPacket {
    len: usize,
    refs: Range<usize>,
}

/// The pieces of one packet to hand the kernel, in order: bytes of the
/// transmit buffer around payloads sent straight from registered memory.
fn packet_pieces<'a>(
    pkt: &'a [u8],
    refs: &[PayloadRef],
    payloads: &[Option<&'a [u8]>],
    out: &mut SmallVec<[&'a [u8]; 8]>,
) {
    let mut pos = 0;
    for (r, payload) in refs.iter().zip(payloads) {
        let Some(payload) = payload else { continue };
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

/// How many I/O vector entries at most a packet whose payload references
/// are `refs` adds to its datagram's (see [`iovecs`]): one per reference,
/// one per stretch of the buffer before one, and one for the buffer's rest
/// (which, in a batch, the next packet's header joins). A packet without
/// references is one; one of the most SGEs, 1 + 32 + 1 (its pieces follow
/// each other), always far below [`sys::MAX_IOV`].
fn iov_entries(refs: &[PayloadRef]) -> usize {
    let mut pos = 0;
    let mut n = 1;
    for r in refs {
        n += 1 + usize::from(r.at as usize > pos);
        pos = r.at as usize + r.len as usize;
    }
    n
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
    payloads: &[Option<&'a [u8]>],
    range: Range<usize>,
    iov: &mut IoVector<'a>,
) {
    let mut off: usize = pkts[..range.start].iter().map(|p| p.len).sum();
    // The stretch of `buf` not yet added.
    let mut pending = off..off;
    for p in &pkts[range] {
        for (r, payload) in refs[p.refs.clone()].iter().zip(&payloads[p.refs.clone()]) {
            let Some(payload) = payload else { continue };
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

/// Payload references a send's per-reference lists keep without a heap
/// allocation. Small: those lists are built on every send, and a large
/// inline array costs its copies on each (a ping-pong's reply and ACK have
/// none; 64 cost about 75 ns a hop), while a batch with more references
/// moves enough bytes that one allocation is nothing.
const INLINE_REFS: usize = 8;

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
        with_payload_windows(mem, refs, |windows| {
            self.send_windows(buf, sends, pkts, refs, windows, sock)
        });
    }

    /// [`send_all`](Self::send_all) with the references' windows open.
    fn send_windows(
        &mut self,
        buf: &mut [u8],
        sends: &[PendingSend],
        pkts: &[TxPacket],
        refs: &[PayloadRef],
        windows: &[Option<WindowBytes<'_>>],
        sock: &UdpSocket,
    ) {
        // A reference whose MR was deregistered (or whose window no longer
        // checks) since its packet was built loses its batch: the
        // retransmission fails the WR with a protection error. Memory the
        // MR owns goes straight from the MR; foreign memory, which its
        // registrant may be writing, is copied into its packet here, once:
        // never borrowed, and the ICRC covers exactly the bytes sent.
        let mut payloads: SmallVec<[Option<&[u8]>; INLINE_REFS]> =
            SmallVec::from_elem(None, refs.len());
        let mut lost: SmallVec<[bool; INLINE_REFS]> = SmallVec::from_elem(true, refs.len());
        let mut pkt_at = 0;
        for p in pkts {
            for i in p.refs.clone() {
                let Some(window) = &windows[i] else {
                    continue;
                };
                lost[i] = false;
                payloads[i] = match window {
                    WindowBytes::Owned(bytes) => Some(*bytes),
                    WindowBytes::Foreign(bytes) => {
                        let at = pkt_at + refs[i].at as usize;
                        bytes.copy_to(&mut buf[at..at + bytes.len()]);
                        None
                    }
                };
            }
            pkt_at += p.len;
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
                let h = IpUdpHeaders::linux(local, peer, p.len, id);
                let crc = {
                    let body = &buf[off..off + p.len - ICRC_LEN];
                    let mut pieces = SmallVec::<[&[u8]; 8]>::new();
                    let r = p.refs.clone();
                    packet_pieces(body, &refs[r.clone()], &payloads[r], &mut pieces);
                    match pieces.split_first() {
                        Some((head, rest)) => {
                            icrc::compute_vectored(h.ip(), h.udp(), head, rest).unwrap_or(0)
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

/// Opens a read window on each payload reference — each MR looked up once
/// and read-locked for the call — and hands them to `f`, in order: `None`
/// where a reference no longer checks (its MR deregistered, or its window
/// revoked, since the packet was built). What the windows lend is valid
/// inside `f` only.
pub(super) fn with_payload_windows<R>(
    mem: &MrTable,
    refs: &[PayloadRef],
    f: impl FnOnce(&[Option<WindowBytes<'_>>]) -> R,
) -> R {
    let mut mrs: SmallVec<[(u32, Arc<MrCore>); 2]> = SmallVec::new();
    for r in refs {
        if mrs.iter().all(|(k, _)| *k != r.key) {
            if let Ok(mr) = mem.mr(r.key) {
                mrs.push((r.key, mr));
            }
        }
    }
    let guards: SmallVec<[_; 2]> = mrs.iter().map(|(_, mr)| mr.read()).collect();
    let windows: SmallVec<[Option<WindowBytes<'_>>; INLINE_REFS]> = refs
        .iter()
        .map(|r| {
            let m = mrs.iter().position(|(k, _)| *k == r.key)?;
            guards[m]
                .keyed_read_window(r.key, r.va, r.len as usize, r.kind, Some(r.pd))
                .ok()
                .map(|w| w.into_bytes())
        })
        .collect();
    f(&windows)
}

/// The smallest path MTU (IBTA), for the most QPs some free room may serve.
const MIN_MTU: u32 = 256;

/// Transmits what the dirty QPs owe and delivers their completions and
/// events. Consecutive packets of one QP with the same size go out as one
/// UDP GSO send (the last may be shorter), their payloads straight from the
/// registered memory they come from.
pub(super) fn flush(st: &mut State, mem: &MrTable, now: Instant, acks: AckPolicy) {
    let mut tx = std::mem::take(&mut st.tx);
    let mut refs = std::mem::take(&mut st.tx_refs);
    let mut pkts = std::mem::take(&mut st.tx_pkts);
    let mut dirty = std::mem::take(&mut st.dirty);
    let mut unfinished: SmallVec<[u32; 8]> = SmallVec::new();
    // QPs held by the device's in-flight budget are served first, in the
    // order they began to wait, as many as the free room could let send.
    let mut order = std::mem::take(&mut st.flush_order);
    order.clear();
    let free = st.in_flight_limit.saturating_sub(st.in_flight);
    let served = st
        .budget_queue
        .len()
        .min(free / in_flight_cost(MIN_MTU) + 1);
    order.extend(st.budget_queue.drain(..served));
    order.extend_from_slice(&dirty);
    // Those still without room when their turn comes keep their place.
    let mut unserved: SmallVec<[u32; 8]> = SmallVec::new();
    let State {
        socket,
        qps,
        gso,
        stats,
        local,
        timers,
        held_acks,
        in_flight,
        in_flight_limit,
        budget_queue,
        links,
        ring_blocked,
        ..
    } = st;
    for (i, &qpn) in order.iter().enumerate() {
        let Some(slot) = qps.get_mut(&qpn) else {
            continue;
        };
        slot.dirty = false;
        let from_queue = i < served;
        if from_queue {
            slot.budget_queued = false;
        }
        // Its share of the budget: what the other QPs leave. One that did
        // not wait gets no more than it has while others wait (it queues
        // behind them); one whose turn it is, all of it.
        let mut no_room = false;
        let counted_before = slot.in_flight_counted;
        if let Transport::Rc(rc) = &mut slot.transport {
            // (UC counts nothing and is never held.)
            if rc.counts_in_flight() {
                let others = in_flight.saturating_sub(counted_before);
                let room = in_flight_limit.saturating_sub(others) / in_flight_cost(rc.mtu());
                let room = u32::try_from(room).unwrap_or(u32::MAX);
                let own = rc.in_flight();
                let others_wait = !budget_queue.is_empty() || !unserved.is_empty();
                no_room = room <= own;
                rc.set_window_cap(if from_queue || !others_wait {
                    room
                } else {
                    room.min(own)
                });
            }
        }
        // Still more to send after FLUSH_BUDGET packets: a later pass goes
        // on, so one QP's burst (a READ a peer asked for in one piece)
        // never holds the device for long.
        let mut out_of_budget = false;
        let peer = slot.peer;
        let link = peer.and_then(|p| links.to(p.ip()));
        // A QP that cuts same-host segments whose link is gone (its peer's
        // device with it) has nowhere to send them: lost, as to a dead peer.
        let orphan = link.is_none()
            && matches!(&slot.transport, Transport::Rc(rc) if rc.segment() as usize + 128 > MAX_PACKET);
        if let (Transport::Rc(rc), Some(link)) = (&mut slot.transport, link) {
            // A peer on this host: each packet into the link's ring. Room
            // for the largest packet of any QP on a link: a READ's
            // responses are cut by the requester's segment, whatever ours.
            let room = LOCAL_SEGMENT.max(rc.mtu()) as usize + 128;
            let segment = (rc.segment() != rc.mtu()).then(|| rc.segment());
            // UC completes a send once its packets are out: its payloads
            // must be in the ring, not left in memory the program may
            // reuse at once.
            let by_reference = rc.counts_in_flight();
            let mut budget = FLUSH_BUDGET;
            loop {
                if budget == 0 || out_of_time(now, FLUSH_BUDGET - budget) {
                    out_of_budget = true;
                    break;
                }
                if !link.has_room(local::record_room(room)) {
                    // The peer has not caught up: the rest waits until it
                    // has (nothing is built that would be lost); the pass
                    // looks again shortly, not at once (see `local`).
                    stats.local_ring_full += 1;
                    ring_blocked.push(qpn);
                    break;
                }
                budget -= 1;
                refs.clear();
                let mut buf = TxBuffer {
                    bytes: &mut tx[..room],
                    refs: Some(&mut refs),
                };
                let Some(n) = rc.poll_transmit(now, mem, &mut buf, acks) else {
                    break;
                };
                if link.push(mem, &tx[..n], &refs, segment, by_reference) {
                    stats.tx_packets += 1;
                    stats.local_tx_packets += 1;
                    slot.ring_mark = Some(link.pushed_to());
                } else {
                    stats.tx_errors += 1;
                }
            }
        } else if let (true, Transport::Rc(rc)) = (orphan, &mut slot.transport) {
            let room = rc.segment() as usize + 128;
            for _ in 0..FLUSH_BUDGET {
                refs.clear();
                let mut buf = TxBuffer {
                    bytes: &mut tx[..room],
                    refs: Some(&mut refs),
                };
                if rc.poll_transmit(now, mem, &mut buf, acks).is_none() {
                    break;
                }
                stats.tx_errors += 1;
            }
        } else if let (Transport::Rc(rc), Some(peer)) = (&mut slot.transport, peer) {
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
                if budget == 0 || out_of_time(now, FLUSH_BUDGET - budget) {
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
                // or is shorter (and then ends it): a reply and the ACK held
                // for its QP go as one GSO send, which the peer takes in one
                // wake-up and one receive call. (As two datagrams of one
                // sendmmsg they cost a sleeping peer a second receive, and
                // on a shared core one-core ping-pong took 22.6–23.6 µs a
                // hop against 18.8–19.9 µs; on free cores the two were
                // within 0.4 µs.)
                // Nor does a packet whose pieces would take the batch's I/O
                // vector past what the kernel takes for one datagram (it
                // would refuse the whole batch): many small SGEs each.
                let iovs = iov_entries(&refs[first_ref..]);
                if open.count > 0 && (n > open.seg || open.iovs + iovs > sys::MAX_IOV) {
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
                open.iovs += iovs;
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
        if let Transport::Ud(ud) = &mut slot.transport {
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
                if let Some(link) = links.to(ip) {
                    if link.push(mem, &tx[..n], &[], None, false) {
                        stats.tx_packets += 1;
                        stats.local_tx_packets += 1;
                    } else {
                        // A full ring: a datagram lost, as UD may lose one.
                        stats.local_ring_full += 1;
                        stats.tx_errors += 1;
                    }
                    continue;
                }
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
                        iovs: 1,
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
        // Delivering may move the QP to ERR (a full CQ): counted after it.
        slot.deliver_events();
        // Count what it has in flight now; if the budget holds it, it waits
        // for room (at its old place if it never got any).
        slot.recount_in_flight(in_flight);
        if !slot.budget_queued && slot.rc().is_some_and(RcQp::held_by_window_cap) {
            slot.budget_queued = true;
            if from_queue && no_room {
                unserved.push(qpn);
            } else {
                budget_queue.push_back(qpn);
            }
        }
        if !slot.ack_listed && slot.rc().is_some_and(RcQp::holds_ack) {
            slot.ack_listed = true;
            held_acks.push(qpn);
        }
        // The set may hold a QP's deadline early, never late: a timer
        // re-armed later (every ACK does) costs nothing here; the early
        // entry fires, finds nothing due and is replaced.
        if let Some(new) = slot.rc().and_then(RcQp::next_timeout) {
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
    for &qpn in unserved.iter().rev() {
        budget_queue.push_front(qpn);
    }
    // Room freed in this pass (by what its QPs had acknowledged) goes to
    // the QP waiting longest in the next pass, due at once.
    if let Some(&first) = budget_queue.front() {
        let room = in_flight_limit.saturating_sub(*in_flight);
        if let Some(slot) = qps.get_mut(&first) {
            let cost = slot.rc().map_or(usize::MAX, |rc| in_flight_cost(rc.mtu()));
            if room >= cost && !slot.dirty {
                slot.dirty = true;
                unfinished.push(first);
            }
        }
    }
    st.tx = tx;
    st.tx_refs = refs;
    st.tx_pkts = pkts;
    st.flush_order = order;
    // Keep the list's capacity: no allocation per pass.
    dirty.clear();
    dirty.extend(unfinished);
    st.dirty = dirty;
    super::local::ring_doorbells(st);
}

/// Whether a QP that has built `built` packets in a pass whose transmit
/// began at `start` has sent for long enough (see [`FLUSH_PASS_TIME`]): the
/// clock is read every [`FLUSH_CHECK_EVERY`] packets.
fn out_of_time(start: Instant, built: usize) -> bool {
    built > 0 && built % FLUSH_CHECK_EVERY == 0 && start.elapsed() >= FLUSH_PASS_TIME
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
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

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

    /// Sends three 100-byte packets as one batch from a fresh socket (made
    /// to refuse GSO when `refuse_gso`) to a plain one; returns the engine's
    /// GSO flag and counters after, and the datagrams received, each with
    /// the IPv4 ID its ICRC is right for (`None`: none of 0..3).
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
                iovs: 1,
            },
            pkts: 0..3,
        };
        let (gso, stats, peer) = send_on_loopback(refuse_gso, &mut buf, &[send], &pkts);
        let mut got = Vec::new();
        let mut rb = [0u8; 2048];
        while let Ok((n, from)) = peer.recv_from(&mut rb) {
            let pkt = rb[..n].to_vec();
            let id = (0..3u16).find(|&id| {
                let h = IpUdpHeaders::linux(from, peer.local_addr().unwrap(), n, id);
                matches!(icrc::check(h.ip(), h.udp(), &pkt), Ok((c, w)) if c == w)
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
        let batch = |len, seg, count| Batch {
            len,
            seg,
            count,
            iovs: count,
        };
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

    /// `iov_entries` is what `iovecs` takes for a packet alone (in a batch
    /// at most that): one for a packet without references, one more per
    /// reference whose pieces follow each other, and a stretch more per
    /// gap between them.
    #[test]
    fn iov_entries_is_a_packets_io_vector_length() {
        let piece = |at: u32, len: u32| PayloadRef {
            at,
            key: 1,
            va: 0,
            len,
            pd: 0,
            kind: crate::soft::memory::AccessKind::LocalRead,
        };
        let data = [7u8; 64];
        let buf = [0u8; 200];
        let cases: [(&[PayloadRef], usize); 4] = [
            (&[], 1),
            (&[piece(28, 8)], 3),
            (&[piece(28, 8), piece(36, 8), piece(44, 8)], 5),
            (&[piece(28, 8), piece(40, 8), piece(48, 8)], 6),
        ];
        for (refs, want) in cases {
            let payloads: Vec<Option<&[u8]>> =
                refs.iter().map(|r| Some(&data[..r.len as usize])).collect();
            let pkts = [TxPacket {
                len: buf.len(),
                refs: 0..refs.len(),
            }];
            let mut iov = IoVector::new();
            iovecs(&buf, &pkts, refs, &payloads, 0..1, &mut iov);
            assert_eq!((iov_entries(refs), iov.len()), (want, want), "{refs:?}");
        }
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
