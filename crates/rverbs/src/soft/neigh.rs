//! Address resolution for the connection manager (`rdma_resolve_addr` to a
//! destination that is not this host's), as the kernel's `ib_addr` does it
//! (drivers/infiniband/core/addr.c): the route to the destination gives
//! the next hop (its gateway, or the destination itself on a link), and the
//! address is resolved once that hop's neighbour entry (ARP, IPv6 ND) is
//! valid. This module owns asking the kernel (over rtnetlink: the route,
//! the outgoing link's flags, the neighbour entry — no privilege needed),
//! making the kernel resolve a neighbour, and the resolver thread that
//! waits for the resolutions still pending.
//!
//! The rules are kernel 6.1's:
//! - no route: the call fails at once with the route lookup's error
//!   (ENETUNREACH; EHOSTUNREACH for an `unreachable` route …);
//! - nothing to resolve — a local, broadcast or multicast route, an
//!   outgoing link that is loopback or has no ARP (`IFF_NOARP`), or a
//!   neighbour already valid (REACHABLE, STALE, DELAY, PROBE, PERMANENT,
//!   NOARP): resolved at once;
//! - otherwise the kernel is made to resolve the neighbour, and the
//!   resolution waits: resolved as soon as the neighbour is valid; at the
//!   caller's timeout, one last look, then ETIMEDOUT. A neighbour that
//!   turns FAILED does not end the wait early (the kernel retries only when
//!   some neighbour becomes valid, or at the timeout, and reports
//!   ETIMEDOUT for any failure it finds then). A look before the timeout
//!   that finds the route gone ends with the route's error.
//!
//! **Making the kernel resolve.** The kernel's CM calls `neigh_event_send`;
//! a program cannot, but any packet routed to the destination does the
//! same. rverbs sends one empty UDP datagram to the destination's discard
//! port (9) from a throwaway socket: the kernel queues it on the neighbour
//! and starts ARP or ND for the next hop; the datagram leaves only once the
//! neighbour resolves, and nothing at UDP port 9 is RoCE traffic (a peer
//! answers it with ICMP port unreachable at most).
//!
//! **Waiting.** One thread per process, `rverbs-neigh`, started by the
//! first pending resolution and ending when none is left. It listens to the
//! kernel's neighbour notifications (`RTMGRP_NEIGH`) and looks again at
//! every pending resolution when a neighbour becomes valid, when a new
//! resolution is added, and at each deadline — as the kernel's work queue
//! does. A resolution whose waiter is gone (its id was dropped) is
//! forgotten.
//!
//! If rtnetlink cannot be asked here (no netlink socket, or a kernel that
//! does not answer a single-entry RTM_GETNEIGH, before 5.0), the
//! destination resolves at once as before this module: the route is still
//! checked, with a connected UDP socket.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::libc;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{recv, MsgFlags};

use super::rtnl::{self, Failure};

/// The UDP discard port, where the datagram that starts resolution goes.
const DISCARD_PORT: u16 = 9;
/// `RTMGRP_NEIGH`: neighbour table changes.
const RTMGRP_NEIGH: u32 = 0x4;
/// Route attributes: destination, output interface, gateway, and a
/// gateway of another family (`RTA_VIA`: an IPv6 next hop of an IPv4
/// route).
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_VIA: u16 = 18;
/// `NDA_DST`: a neighbour's address.
const NDA_DST: u16 = 1;
/// `RTN_UNICAST`: the only route type with a neighbour to resolve.
const RTN_UNICAST: u8 = 1;
/// Link flags: loopback, no ARP.
const IFF_LOOPBACK: u32 = 0x8;
const IFF_NOARP: u32 = 0x80;
/// `NUD_VALID`: REACHABLE, STALE, DELAY, PROBE, NOARP, PERMANENT.
const NUD_VALID: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80;

/// Where a destination stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NextHop {
    /// Nothing to resolve, or its neighbour is valid.
    Ready,
    /// Its next hop's neighbour is not valid (yet).
    Unresolved,
}

/// The outcome of [`resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// Resolved now; the waiter is not called.
    Now,
    /// Pending: the waiter hears the outcome, once.
    Later,
}

/// Who waits for a pending resolution (a connection manager id).
pub(crate) trait NeighbourWaiter: Send + Sync {
    /// The resolution is over: `Ok` resolved, or the errno it failed with
    /// (ETIMEDOUT; a route's error).
    fn neighbour_resolved(&self, result: Result<(), Errno>);
}

/// The route to `dst`, as far as resolution needs it.
struct Route {
    /// `rtm_type`.
    kind: u8,
    /// The output interface.
    oif: u32,
    /// Its gateway, if it has one.
    gateway: Option<IpAddr>,
}

fn family(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn ip_from(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(bytes).ok()?,
        ))),
        _ => None,
    }
}

/// RTM_GETROUTE for `dst` (as `ip route get`).
fn route(dst: IpAddr) -> Result<Route, Failure> {
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol,
    // scope, type; flags.
    let mut body = [0u8; 12];
    body[0] = family(dst);
    body[1] = if dst.is_ipv4() { 32 } else { 128 };
    let answer = rtnl::request(
        rtnl::RTM_GETROUTE,
        &body,
        &[(RTA_DST, &octets(dst))],
        rtnl::RTM_NEWROUTE,
    )?;
    let bad = || Failure::Socket(io::Error::new(io::ErrorKind::InvalidData, "short route"));
    let kind = *answer.get(7).ok_or_else(bad)?;
    let mut route = Route {
        kind,
        oif: 0,
        gateway: None,
    };
    for (ty, value) in rtnl::attributes(answer.get(12..).ok_or_else(bad)?) {
        match ty {
            RTA_OIF => route.oif = rtnl::u32_at(value, 0).unwrap_or(0),
            RTA_GATEWAY => route.gateway = ip_from(value),
            // struct rtvia: family (u16), address.
            RTA_VIA => route.gateway = value.get(2..).and_then(ip_from),
            _ => {}
        }
    }
    Ok(route)
}

/// RTM_GETLINK for `ifindex`: its `IFF_*` flags.
fn link_flags(ifindex: u32) -> Result<u32, Failure> {
    // struct ifinfomsg: family, pad, type (u16), index (i32), flags,
    // change.
    let mut body = [0u8; 16];
    body[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    let answer = rtnl::request(rtnl::RTM_GETLINK, &body, &[], rtnl::RTM_NEWLINK)?;
    rtnl::u32_at(&answer, 8)
        .ok_or_else(|| Failure::Socket(io::Error::new(io::ErrorKind::InvalidData, "short link")))
}

/// RTM_GETNEIGH for `addr` on `ifindex`: its `NUD_*` state, `None` if the
/// table has no entry.
fn neighbour_state(ifindex: u32, addr: IpAddr) -> Result<Option<u16>, Failure> {
    // struct ndmsg: family, pad1, pad2 (u16), ifindex (i32), state (u16),
    // flags, type.
    let mut body = [0u8; 12];
    body[0] = family(addr);
    body[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    match rtnl::request(
        rtnl::RTM_GETNEIGH,
        &body,
        &[(NDA_DST, &octets(addr))],
        rtnl::RTM_NEWNEIGH,
    ) {
        Ok(answer) => Ok(rtnl::u16_at(&answer, 8)),
        Err(Failure::Kernel(Errno::ENOENT)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A destination as the kernel routes it: an IPv4-mapped IPv6 address is
/// the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// The route to `dst` exists (a UDP socket `connect`ed there asks the
/// routing table; nothing is sent): the route lookup's error otherwise.
pub(crate) fn check_route(dst: IpAddr) -> io::Result<()> {
    let any: SocketAddr = match dst {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    UdpSocket::bind(any)?.connect(SocketAddr::new(dst, DISCARD_PORT))
}

/// Where `dst` (not this host's) stands: the route lookup's error if there
/// is no route.
pub(crate) fn next_hop(dst: IpAddr) -> io::Result<NextHop> {
    let dst = canonical(dst);
    let route = match route(dst) {
        Ok(r) => r,
        Err(Failure::Kernel(e)) => return Err(e.into()),
        Err(Failure::Socket(e)) => {
            tracing::debug!(%dst, "rtnetlink unavailable ({e}); not resolving neighbours");
            check_route(dst)?;
            return Ok(NextHop::Ready);
        }
    };
    if route.kind != RTN_UNICAST || dst.is_multicast() {
        return Ok(NextHop::Ready);
    }
    let cannot_tell = |what: &str, e: Failure| {
        tracing::debug!(%dst, "cannot read the {what} ({e:?}); taking the address as resolved");
        Ok(NextHop::Ready)
    };
    match link_flags(route.oif) {
        Ok(flags) if flags & (IFF_LOOPBACK | IFF_NOARP) != 0 => return Ok(NextHop::Ready),
        Ok(_) => {}
        Err(e) => return cannot_tell("outgoing link", e),
    }
    let hop = route.gateway.unwrap_or(dst);
    match neighbour_state(route.oif, hop) {
        Ok(Some(state)) if state & NUD_VALID != 0 => Ok(NextHop::Ready),
        Ok(_) => Ok(NextHop::Unresolved),
        Err(e) => cannot_tell("neighbour table", e),
    }
}

/// Makes the kernel resolve the next hop to `dst`: an empty datagram to
/// its discard port, which waits on the neighbour (see the module docs).
fn solicit(dst: IpAddr) {
    let any: SocketAddr = match dst {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sent = UdpSocket::bind(any).and_then(|s| s.send_to(&[], (dst, DISCARD_PORT)));
    if let Err(e) = sent {
        tracing::debug!(%dst, "could not start neighbour resolution: {e}");
    }
}

/// Resolves `dst` (not this host's, a route checked or not) within
/// `timeout`: [`Resolution::Now`] if there is nothing to wait for,
/// [`Resolution::Later`] if `waiter` will hear the outcome; the route
/// lookup's error if there is no route.
pub(crate) fn resolve(
    dst: IpAddr,
    timeout: Duration,
    waiter: Weak<dyn NeighbourWaiter>,
) -> io::Result<Resolution> {
    let dst = canonical(dst);
    if next_hop(dst)? == NextHop::Ready {
        return Ok(Resolution::Now);
    }
    solicit(dst);
    let now = Instant::now();
    let deadline = now
        .checked_add(timeout)
        .unwrap_or(now + Duration::from_secs(u64::from(u32::MAX)));
    let mut r = resolver();
    r.pending.push(Pending {
        dst,
        deadline,
        waiter,
    });
    if let Some(wake) = &r.wake {
        let _ = wake.write(1);
        return Ok(Resolution::Later);
    }
    let started = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
        .map_err(io::Error::from)
        .and_then(|wake| {
            let wake = Arc::new(wake);
            let theirs = wake.clone();
            std::thread::Builder::new()
                .name("rverbs-neigh".into())
                .spawn(move || run(&theirs))?;
            Ok(wake)
        });
    match started {
        Ok(wake) => {
            r.wake = Some(wake);
            Ok(Resolution::Later)
        }
        Err(e) => {
            r.pending.pop();
            Err(e)
        }
    }
}

/// A resolution waiting for its neighbour.
struct Pending {
    dst: IpAddr,
    deadline: Instant,
    waiter: Weak<dyn NeighbourWaiter>,
}

/// The pending resolutions, and how to wake the thread that waits for
/// them (`None`: no thread runs; the next resolution starts one).
struct Resolver {
    pending: Vec<Pending>,
    wake: Option<Arc<EventFd>>,
}

static RESOLVER: Mutex<Resolver> = Mutex::new(Resolver {
    pending: Vec::new(),
    wake: None,
});

fn resolver() -> MutexGuard<'static, Resolver> {
    RESOLVER.lock().unwrap_or_else(|p| p.into_inner())
}

/// The resolver thread (see the module docs).
fn run(wake: &EventFd) {
    let watch = match rtnl::subscribe(RTMGRP_NEIGH) {
        Ok(fd) => Some(fd),
        Err(e) => {
            tracing::debug!("no neighbour notifications ({e}); looking every 100 ms");
            None
        }
    };
    loop {
        let batch = std::mem::take(&mut resolver().pending);
        let now = Instant::now();
        let mut looked: Vec<(IpAddr, Result<NextHop, Errno>)> = Vec::new();
        let mut done: Vec<(Weak<dyn NeighbourWaiter>, Result<(), Errno>)> = Vec::new();
        let mut keep = Vec::new();
        for p in batch {
            if p.waiter.strong_count() == 0 {
                continue;
            }
            let found = match looked.iter().find(|(d, _)| *d == p.dst) {
                Some((_, r)) => *r,
                None => {
                    let r = next_hop(p.dst).map_err(|e| {
                        Errno::from_raw(e.raw_os_error().unwrap_or(libc::EHOSTUNREACH))
                    });
                    looked.push((p.dst, r));
                    r
                }
            };
            match found {
                Ok(NextHop::Ready) => done.push((p.waiter, Ok(()))),
                _ if now >= p.deadline => done.push((p.waiter, Err(Errno::ETIMEDOUT))),
                Err(e) => done.push((p.waiter, Err(e))),
                Ok(NextHop::Unresolved) => keep.push(p),
            }
        }
        let next_deadline = {
            let mut r = resolver();
            r.pending.extend(keep);
            if r.pending.is_empty() {
                r.wake = None;
            }
            r.pending.iter().map(|p| p.deadline).min()
        };
        for (waiter, result) in done {
            if let Some(w) = waiter.upgrade() {
                w.neighbour_resolved(result);
            }
        }
        let Some(deadline) = next_deadline else {
            return;
        };
        wait(watch.as_ref(), wake, deadline);
    }
}

/// Sleeps until a neighbour becomes valid, a resolution is added, or
/// `deadline`.
fn wait(watch: Option<&OwnedFd>, wake: &EventFd, deadline: Instant) {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let left = if watch.is_none() {
            left.min(Duration::from_millis(100))
        } else {
            left
        };
        let mut fds = vec![PollFd::new(wake.as_fd(), PollFlags::POLLIN)];
        if let Some(w) = watch {
            fds.push(PollFd::new(w.as_fd(), PollFlags::POLLIN));
        }
        match poll(
            &mut fds,
            PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(0) if watch.is_none() => return,
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(_) => return,
        }
        if wake.read().is_ok() {
            return;
        }
        if watch.is_some_and(a_neighbour_became_valid) {
            return;
        }
    }
}

/// Reads the pending neighbour notifications: whether one says a
/// neighbour is now valid (or some were lost, which may hide one).
fn a_neighbour_became_valid(watch: &OwnedFd) -> bool {
    let mut buf = vec![0u8; 16 * 1024];
    let mut valid = false;
    loop {
        match recv(watch.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            Ok(0) => return valid,
            Ok(n) => {
                valid |= rtnl::messages(&buf[..n]).any(|m| {
                    m.kind == rtnl::RTM_NEWNEIGH
                        && rtnl::u16_at(m.payload, 8).is_some_and(|s| s & NUD_VALID != 0)
                });
            }
            Err(Errno::EINTR) => {}
            Err(Errno::ENOBUFS) => valid = true,
            Err(_) => return valid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_multicast_have_nothing_to_resolve() {
        assert_eq!(
            next_hop("127.0.0.1".parse().unwrap()).unwrap(),
            NextHop::Ready
        );
        // A multicast route (or none: then ENETUNREACH, as the kernel's).
        match next_hop("239.1.2.3".parse().unwrap()) {
            Ok(hop) => assert_eq!(hop, NextHop::Ready),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENETUNREACH)),
        }
    }

    #[test]
    fn ipv4_mapped_addresses_route_as_ipv4() {
        assert_eq!(
            canonical("::ffff:10.1.2.3".parse().unwrap()),
            "10.1.2.3".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            canonical("fe80::1".parse().unwrap()),
            "fe80::1".parse::<IpAddr>().unwrap()
        );
    }
}
