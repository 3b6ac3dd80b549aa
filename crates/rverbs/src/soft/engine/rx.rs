//! Receive: a pass's datagrams from the device's socket (GRO batches split
//! into their packets), each packet's ICRC checked for the IPv4 ID its
//! sender gave it (expected, or solved for), parsed, and handed to its QP's
//! transport; drops are counted by reason.

use std::io::IoSliceMut;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, SockaddrStorage};
use rverbs_wire::icrc::{self, IpUdpHeaders, Ipv4IdSolver};
use rverbs_wire::packet::ICRC_LEN;
use rverbs_wire::PacketRepr;

use super::gsi::{self, GSI_QPN};
use super::local::{PulledPayload, RemotePayload};
use super::slot::Transport;
use super::{
    mark_dirty, multicast, Driver, State, MAX_BATCH_SEGMENTS, RX_BUDGET, RX_BUFFER, RX_PASS_TIME,
};
use crate::soft::memory::MrTable;
use crate::soft::transport::{Memory, RxDrop};

/// Room for the control messages a receive asks for (the GRO segment
/// size), aligned as `struct cmsghdr` wants; on the stack, so a busy poll
/// allocates nothing.
#[repr(C, align(8))]
struct CmsgBuffer([u8; 64]);

/// Receives a pass's datagrams. Whether it read the socket dry (a receive
/// found nothing more): if not, packets still wait — an ACK among them, say
/// — and retransmission timers must not run before they are seen.
pub(super) fn receive(st: &mut State, mem: &MrTable, driver: Driver, start: Instant) -> bool {
    let Some(fd) = st.socket.as_ref().map(|s| s.as_raw_fd()) else {
        return true;
    };
    let now = start;
    let local = st.local;
    // Segments of a batch a poller's pass left for later come first.
    if let Some(mut left) = st.rx_left.take() {
        if handle_segments(st, mem, now, local, driver, &mut left) {
            st.rx_left = Some(left);
            return false;
        }
        st.rx_spare = left.buf;
    }
    // Packets from devices of this host, in their rings.
    let (rings_dry, stop) = receive_local(st, mem, driver, start);
    if stop {
        return false;
    }
    // A busy poller whose peers are on this host, and whose socket has
    // had nothing for SOCKET_QUIET, looks at it only every SOCKET_EVERY:
    // the receive call would cost more than the rest of its empty pass, and
    // what comes by the socket then (a CM MAD, a first packet from a
    // remote peer) waits that long at most. A park of this thread that woke
    // for the bell or a doorbell alone counts as a look. The pass does not
    // count as reading the socket dry.
    if driver == Driver::Poller
        && !st.links.list.is_empty()
        && st
            .socket_quiet_since
            .is_some_and(|t| start.saturating_duration_since(t) >= SOCKET_QUIET)
        && st
            .socket_read_at
            .max(super::park::socket_seen_empty(fd))
            .is_some_and(|t| start.saturating_duration_since(t) < SOCKET_EVERY)
    {
        return false;
    }
    st.socket_read_at = Some(start);
    let recvs_before = st.stats.rx_recvs;
    multicast::receive(st, mem);
    let mut rx = std::mem::take(&mut st.rx);
    let mut drained = false;
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
                Err(Errno::EAGAIN) => {
                    drained = true;
                    break;
                }
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    warn_once!("receive failed: {e}");
                    drained = true;
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
        // Not quiet (set here: the pass may return early, below).
        st.socket_quiet_since = None;
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
        // Each datagram is handled at its own time: ACKs set timers from it.
        let now = Instant::now();
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
            return false;
        }
        rx = batch.buf;
        if driver == Driver::Poller && batch.completed {
            // Hand the poller its completion before another receive call.
            break;
        }
        if start.elapsed() >= RX_PASS_TIME {
            // A long pass holds the ACKs it owes (they go when it ends)
            // and the lock: end it; the next one goes on at once.
            break;
        }
    }
    st.rx = rx;
    if st.stats.rx_recvs == recvs_before && st.socket_quiet_since.is_none() {
        st.socket_quiet_since = Some(start);
    }
    drained && rings_dry
}

/// Most packets one pass takes from the same-host rings.
const LOCAL_RX_BUDGET: usize = 256;
/// How often a busy poller of a device with same-host links reads its
/// socket once that has been quiet for [`SOCKET_QUIET`] (see `receive`).
const SOCKET_EVERY: std::time::Duration = std::time::Duration::from_micros(20);
/// How long a socket must have had nothing before busy pollers read it
/// only every [`SOCKET_EVERY`].
const SOCKET_QUIET: std::time::Duration = std::time::Duration::from_millis(1);

/// Takes the packets waiting in the same-host links' rings, each handled
/// in place. Whether the rings were read dry, and whether a poller's pass
/// should stop here (a packet completed work).
fn receive_local(st: &mut State, mem: &MrTable, driver: Driver, start: Instant) -> (bool, bool) {
    if st.links.list.is_empty() {
        return (true, false);
    }
    let local = st.local;
    let mut links = std::mem::take(&mut st.links.list);
    let mut taken = 0;
    let mut stop = false;
    let mut out_of_time = false;
    let mut now = start;
    let first = st.links.rx_next % links.len();
    st.links.rx_next = st.links.rx_next.wrapping_add(1);
    let (late, early) = links.split_at_mut(first);
    'links: for link in early.iter_mut().chain(late.iter_mut()) {
        let peer = link.peer_endpoint();
        while taken < LOCAL_RX_BUDGET {
            // As for the socket: the ACKs this pass owes leave at its end,
            // and a long pass (a debug build copying megabytes) would hold
            // them past the sender's timer.
            if taken > 0 {
                now = Instant::now();
                if now.saturating_duration_since(start) >= RX_PASS_TIME {
                    out_of_time = true;
                    break 'links;
                }
            }
            let Some(next) = link.next_record() else {
                continue 'links;
            };
            let Some(rp) = next else {
                // A record that does not parse: skipped.
                link.consume();
                continue;
            };
            taken += 1;
            st.stats.rx_packets += 1;
            st.stats.local_rx_packets += 1;
            let completed = match rp.remote {
                None => dispatch(st, mem, now, (local, peer), rp.pkt, rp.segment, None),
                Some(remote) => {
                    st.stats.local_rx_pulled += 1;
                    // The packet around its payload, rebuilt in a buffer of
                    // ours: the payload's place there is never read (the
                    // transport's writes of it become copies from the
                    // sender's memory).
                    let mut whole = std::mem::take(&mut st.local_packet);
                    whole.resize(rp.pkt_len.max(whole.len()), 0);
                    whole[..rp.pkt.len()].copy_from_slice(rp.pkt);
                    let after = rp.pkt_len - rp.trailer.len();
                    whole[after..rp.pkt_len].copy_from_slice(rp.trailer);
                    let pkt = &whole[..rp.pkt_len];
                    let done =
                        dispatch(st, mem, now, (local, peer), pkt, rp.segment, Some(&remote));
                    st.local_packet = whole;
                    done
                }
            };
            link.consume();
            if completed && driver == Driver::Poller {
                stop = true;
                break 'links;
            }
        }
        break;
    }
    st.links.list = links;
    let dry = !stop && !out_of_time && taken < LOCAL_RX_BUDGET;
    if taken > 0 {
        st.stats.rx_recvs += 1;
    }
    (dry, stop)
}

/// A received datagram (one packet, or a GRO batch of `seg`-byte segments)
/// being handled, from segment `next` on.
pub(super) struct Received {
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
    // An empty datagram is one (empty) packet: received, and dropped
    // with a reason like any other too short to hold an ICRC.
    let count = batch.len.div_ceil(batch.seg).max(1);
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
    dispatch(st, mem, now, (local, peer), pkt, None, None)
}

/// Parses one received packet (its ICRC checked, or from a same-host
/// ring, which has none to check) and hands it to its QP's transport.
/// Whether its QP now has completions or events to report.
///
/// `remote`: a same-host packet whose payload is still in the sender's
/// memory. The transport's checks run as for any packet, and its writes of
/// that payload into registered memory become copies straight from the
/// sender's (see [`PulledPayload`]).
fn dispatch(
    st: &mut State,
    mem: &MrTable,
    now: Instant,
    (local, peer): (SocketAddr, SocketAddr),
    pkt: &[u8],
    segment: Option<u32>,
    remote: Option<&RemotePayload>,
) -> bool {
    let Ok(p) = PacketRepr::parse(pkt) else {
        st.stats.rx_malformed += 1;
        return false;
    };
    let Some(remote) = remote else {
        return deliver(st, mem, now, (local, peer), &p, segment);
    };
    if p.payload.len() as u64 != remote.len() {
        st.stats.rx_malformed += 1;
        return false;
    }
    let pulled = PulledPayload {
        mem,
        hole: p.payload.as_ptr() as usize..p.payload.as_ptr() as usize + p.payload.len(),
        remote,
    };
    deliver(st, &pulled, now, (local, peer), &p, segment)
}

/// Hands a parsed packet to its QP's transport (or QP 1's MAD port).
/// Whether its QP now has completions or events to report.
fn deliver(
    st: &mut State,
    mem: &dyn Memory,
    now: Instant,
    (local, peer): (SocketAddr, SocketAddr),
    p: &PacketRepr<'_>,
    segment: Option<u32>,
) -> bool {
    let qpn = p.bth.dest_qp;
    if qpn == GSI_QPN {
        gsi::receive(st, peer, p);
        return false;
    }
    let Some(slot) = st.qps.get_mut(&qpn) else {
        st.stats.rx_unknown_qp += 1;
        return false;
    };
    // Only the connected peer may talk to an RC QP.
    if slot.peer.is_some_and(|a| a.ip() != peer.ip()) {
        st.stats.rx_wrong_peer += 1;
        return false;
    }
    let (handled, completed) = match &mut slot.transport {
        // RESET: no transport yet.
        Transport::Reset => (Err(RxDrop::NotReceiving), false),
        Transport::Rc(rc) => {
            let handled = rc.handle_packet(p, now, mem, segment);
            (handled, rc.has_events())
        }
        Transport::Ud(ud) => {
            let handled = ud.handle_packet(p, mem, peer.ip(), local.ip());
            (handled, ud.has_events())
        }
    };
    // An ACK frees room in the device's in-flight budget: counted now, so
    // the pass's flush can hand it to a QP that waits.
    slot.recount_in_flight(&mut st.in_flight);
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
pub(super) fn icrc_for(
    from: SocketAddr,
    to: SocketAddr,
    pkt: &[u8],
) -> impl Fn(u16) -> IcrcCheck + '_ {
    move |id| {
        let h = IpUdpHeaders::linux(from, to, pkt.len(), id);
        IcrcCheck {
            result: icrc::check(h.ip(), h.udp(), pkt).ok(),
            ipv4_header_len: h.is_ipv4().then_some(h.ip().len()),
            roce_len: pkt.len().saturating_sub(ICRC_LEN),
        }
    }
}

/// What [`icrc_for`] gives for one assumed ID.
pub(super) struct IcrcCheck {
    result: Option<(u32, u32)>,
    ipv4_header_len: Option<usize>,
    roce_len: usize,
}

/// How a packet's IPv4 ID was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IdSource {
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
pub(super) struct SegmentIds {
    /// The segment whose ID would be 0 in the current run (IDs wrap).
    start: u16,
    /// The current run's IDs were solved for.
    solved: bool,
}

impl SegmentIds {
    /// Whether segment `k` of a batch of `count`'s ICRC (`check` gives it
    /// for an assumed ID) is right for an ID it may carry, and how that ID
    /// was found; `None`: for no ID, the packet is corrupt.
    pub(super) fn accept(
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

#[cfg(test)]
mod tests {
    use super::*;

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
                let h = IpUdpHeaders::linux(from, to, pkt.len(), id.unwrap_or(0));
                icrc::fill(h.ip(), h.udp(), &mut pkt).unwrap();
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
}
