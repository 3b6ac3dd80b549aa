//! Multicast for UD QPs: the groups the device joined (a socket each,
//! bound to the group's address), attaching and detaching QPs, and
//! receiving a group's datagrams for every QP attached to it.

use std::io;
use std::net::{IpAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;

use nix::sys::socket::{setsockopt, sockopt};
use rverbs_wire::icrc::ROCE_V2_PORT;
use rverbs_wire::PacketRepr;
use smallvec::SmallVec;

use super::rx::{icrc_for, IdSource, SegmentIds};
use super::slot::Transport;
use super::{mark_dirty, peer_endpoint, Engine, Failed, State, MAX_PACKET, RX_BUDGET};
use crate::soft::memory::MrTable;
use crate::soft::transport::ud::MULTICAST_QPN;

/// A multicast group some of the device's UD QPs are attached to: a socket
/// bound to the group's address on port 4791 (shared with other devices
/// and processes through SO_REUSEADDR) that joined the group on the
/// device's interface.
pub(super) struct McastGroup {
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
    /// The engine failed (the device is gone).
    Failed,
}

impl Engine {
    /// Attaches UD QP `qpn` to the multicast group at `group`: the first
    /// QP of a group makes the device join it. Attaching twice is a no-op.
    pub(crate) fn attach_mcast(&self, qpn: u32, group: IpAddr) -> Result<(), AttachError> {
        let joined = self.locked(|st| {
            if let Some(g) = st.groups.iter_mut().find(|g| g.addr == group) {
                if !g.qpns.contains(&qpn) {
                    if g.qpns.len() >= self.limits.max_mcast_qp_attach as usize {
                        return Err(AttachError::TooManyQps);
                    }
                    g.qpns.push(qpn);
                }
                return Ok(false);
            }
            if st.groups.len() >= self.limits.max_mcast_grp as usize {
                return Err(AttachError::TooManyGroups);
            }
            let local = st.local.ip();
            let socket = join_group(local, self.ifindex, group).map_err(AttachError::Host)?;
            st.groups.push(McastGroup {
                addr: group,
                socket,
                qpns: smallvec::smallvec![qpn],
            });
            self.groups_changed.fetch_add(1, Ordering::SeqCst);
            Ok(true)
        });
        if joined.map_err(|Failed| AttachError::Failed)?? {
            let _ = self.waker.write(1);
        }
        Ok(())
    }

    /// Detaches QP `qpn` from `group`; the last QP out makes the device
    /// leave it. False if the QP was not attached (or the engine failed).
    pub(crate) fn detach_mcast(&self, qpn: u32, group: IpAddr) -> bool {
        let detached = self
            .locked(|st| detach(st, qpn, Some(group)))
            .unwrap_or(false);
        if detached {
            self.groups_changed.fetch_add(1, Ordering::SeqCst);
            let _ = self.waker.write(1);
        }
        detached
    }

    /// Multicast groups QP `qpn` is attached to (none once the engine
    /// failed).
    pub(crate) fn groups_of(&self, qpn: u32) -> usize {
        self.locked(|st| st.groups.iter().filter(|g| g.qpns.contains(&qpn)).count())
            .unwrap_or(0)
    }
}

/// A socket that receives `group`'s datagrams to port 4791 on the device's
/// interface (`ifindex`, holding address `local`).
fn join_group(local: IpAddr, ifindex: u32, group: IpAddr) -> io::Result<UdpSocket> {
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
            &SockaddrIn6::from(std::net::SocketAddrV6::new(g, ROCE_V2_PORT, 0, ifindex)),
        )?,
    }
    let socket = UdpSocket::from(fd);
    match (group, local) {
        (IpAddr::V4(g), IpAddr::V4(local)) => socket.join_multicast_v4(&g, &local)?,
        (IpAddr::V6(g), _) => socket.join_multicast_v6(&g, ifindex)?,
        (IpAddr::V4(_), IpAddr::V6(_)) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an IPv4 group on an IPv6 device",
            ))
        }
    }
    Ok(socket)
}

/// The group sockets, for the engine thread to poll (its own handles: a
/// group closed meanwhile stays open until it looks again).
pub(super) fn sockets(st: &State) -> Vec<OwnedFd> {
    st.groups
        .iter()
        .filter_map(|g| g.socket.as_fd().try_clone_to_owned().ok())
        .collect()
}

/// The descriptor numbers of the groups' sockets, for a poller that sleeps
/// on them while it holds the lock's state no longer (only the numbers:
/// see `sys::wait_readable`).
pub(super) fn raw_fds(st: &State) -> impl Iterator<Item = std::os::fd::RawFd> + '_ {
    st.groups.iter().map(|g| g.socket.as_raw_fd())
}

/// Detaches `qpn` from `group` (from every group: `None`); groups left
/// without QPs close their sockets. Whether anything changed.
pub(super) fn detach(st: &mut State, qpn: u32, group: Option<IpAddr>) -> bool {
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

/// Receives what the multicast sockets hold (no GRO there: one packet per
/// datagram) and hands each packet to every QP attached to its group.
pub(super) fn receive(st: &mut State, mem: &MrTable) {
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
                if let Some(Transport::Ud(ud)) = st.qps.get_mut(&qpn).map(|s| &mut s.transport) {
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
