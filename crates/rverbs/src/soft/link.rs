//! The port follows the device's address: an rtnetlink socket subscribed to
//! the host's address and link changes wakes the engine thread, which then
//! checks whether the address is still on an interface that is up. When it
//! goes away (or its interface goes down) the port goes DOWN with
//! IBV_EVENT_PORT_ERR to every context; when it comes back, ACTIVE with
//! IBV_EVENT_PORT_ACTIVE. Nothing polls: an idle device stays idle.
//!
//! The same notifications tell of a bonding failover (`RTM_NEWLINK` with
//! `IFLA_EVENT_BONDING_FAILOVER`, which only the bonding driver raises)
//! and carry the link's hardware address: the device follows its
//! interface's address, and a failover of its interface reaches the
//! connection manager's ids (ADDR_CHANGE, as the kernel's rdma_cm raises
//! it on `NETDEV_BONDING_FAILOVER`).

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::net::if_::InterfaceFlags;
use nix::sys::socket::{recv, MsgFlags};

use super::rtnl;

/// rtnetlink multicast groups: links, IPv4 and IPv6 addresses.
const RTMGRP_LINK: u32 = 0x1;
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
const RTMGRP_IPV6_IFADDR: u32 = 0x100;

/// A subscription to the host's address and link changes.
pub(crate) struct LinkWatch {
    fd: OwnedFd,
}

impl LinkWatch {
    /// Subscribes, in the calling thread's network namespace (the one the
    /// device's socket lives in).
    pub(crate) fn open() -> io::Result<LinkWatch> {
        let fd = rtnl::subscribe(RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR)?;
        Ok(LinkWatch { fd })
    }

    /// The descriptor to poll.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Reads every pending notification: what they said of links (the
    /// address is looked up afresh, whatever they say of it).
    pub(crate) fn drain(&self) -> Notices {
        let mut buf = [0u8; 8192];
        let mut notices = Notices::default();
        loop {
            match recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
                Ok(0) => return notices,
                Ok(n) => notices.links.extend(link_notices(&buf[..n])),
                Err(Errno::EINTR) => {}
                // ENOBUFS: notifications were lost; a fresh look covers
                // the address, not the link events that were in them.
                Err(Errno::ENOBUFS) => notices.lost = true,
                Err(_) => return notices,
            }
        }
    }
}

/// What a batch of notifications said of links, in order.
#[derive(Debug, Default)]
pub(crate) struct Notices {
    pub(crate) links: Vec<LinkNotice>,
    /// Some were lost (the socket's buffer overflowed).
    pub(crate) lost: bool,
}

/// One `RTM_NEWLINK` notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinkNotice {
    pub(crate) ifindex: u32,
    /// Its hardware address (`IFLA_ADDRESS`), if it has one.
    pub(crate) hw_addr: Option<Vec<u8>>,
    /// It announces a bonding failover (`IFLA_EVENT_BONDING_FAILOVER`):
    /// the bond's active slave changed.
    pub(crate) bonding_failover: bool,
}

/// `IFLA_ADDRESS`, `IFLA_EVENT` and its `IFLA_EVENT_BONDING_FAILOVER`.
const IFLA_ADDRESS: u16 = 1;
const IFLA_EVENT: u16 = 44;
const IFLA_EVENT_BONDING_FAILOVER: u32 = 3;
/// Bytes of `struct ifinfomsg`.
const IFINFOMSG: usize = 16;

/// The link notifications in one datagram from the socket.
pub(crate) fn link_notices(buf: &[u8]) -> impl Iterator<Item = LinkNotice> + '_ {
    rtnl::messages(buf)
        .filter(|m| m.kind == rtnl::RTM_NEWLINK)
        .filter_map(|m| {
            let mut notice = LinkNotice {
                ifindex: rtnl::u32_at(m.payload, 4)?,
                hw_addr: None,
                bonding_failover: false,
            };
            for (ty, value) in rtnl::attributes(m.payload.get(IFINFOMSG..)?) {
                match ty {
                    IFLA_ADDRESS => notice.hw_addr = Some(value.to_vec()),
                    IFLA_EVENT => {
                        notice.bonding_failover =
                            rtnl::u32_at(value, 0) == Some(IFLA_EVENT_BONDING_FAILOVER);
                    }
                    _ => {}
                }
            }
            Some(notice)
        })
}

/// The hardware address of interface `ifindex` (`RTM_GETLINK`); empty if
/// it has none or cannot be read.
pub(crate) fn hw_addr(ifindex: u32) -> Vec<u8> {
    let mut body = [0u8; IFINFOMSG];
    body[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    let Ok(answer) = rtnl::request(rtnl::RTM_GETLINK, &body, &[], rtnl::RTM_NEWLINK) else {
        return Vec::new();
    };
    answer
        .get(IFINFOMSG..)
        .and_then(|attrs| {
            rtnl::attributes(attrs)
                .find(|&(ty, _)| ty == IFLA_ADDRESS)
                .map(|(_, v)| v.to_vec())
        })
        .unwrap_or_default()
}

/// Whether `addr` is on an interface that is up and running: assigned to
/// it, or — on a loopback interface, where all of 127.0.0.1/8 is local —
/// inside its prefix.
pub(crate) fn address_usable(addr: IpAddr) -> bool {
    let Ok(ifaces) = nix::ifaddrs::getifaddrs() else {
        // Cannot tell: assume it is.
        return true;
    };
    let up = InterfaceFlags::IFF_UP | InterfaceFlags::IFF_RUNNING;
    let ip_of = |s: &Option<nix::sys::socket::SockaddrStorage>| -> Option<IpAddr> {
        let s = s.as_ref()?;
        s.as_sockaddr_in()
            .map(|v4| IpAddr::V4(v4.ip()))
            .or_else(|| s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
    };
    ifaces.into_iter().any(|ifa| {
        if !ifa.flags.contains(up) {
            return false;
        }
        let ip = ip_of(&ifa.address);
        if ip == Some(addr) {
            return true;
        }
        if !ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK) {
            return false;
        }
        match (ip, ip_of(&ifa.netmask), addr) {
            (Some(IpAddr::V4(a)), Some(IpAddr::V4(m)), IpAddr::V4(x)) => {
                u32::from(a) & u32::from(m) == u32::from(x) & u32::from(m)
            }
            (Some(IpAddr::V6(a)), Some(IpAddr::V6(m)), IpAddr::V6(x)) => {
                u128::from(a) & u128::from(m) == u128::from(x) & u128::from(m)
            }
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `RTM_NEWLINK` notification for `ifindex` with `attrs`.
    fn newlink(ifindex: u32, attrs: &[(u16, &[u8])]) -> Vec<u8> {
        let mut body = vec![0u8; IFINFOMSG];
        body[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        for (ty, value) in attrs {
            let len = 4 + value.len();
            body.extend_from_slice(&(len as u16).to_ne_bytes());
            body.extend_from_slice(&ty.to_ne_bytes());
            body.extend_from_slice(value);
            body.resize((body.len() + 3) & !3, 0);
        }
        let mut msg = Vec::new();
        msg.extend_from_slice(&(16 + body.len() as u32).to_ne_bytes());
        msg.extend_from_slice(&rtnl::RTM_NEWLINK.to_ne_bytes());
        msg.extend_from_slice(&[0; 10]);
        msg.extend_from_slice(&body);
        msg
    }

    #[test]
    fn a_bonding_failover_notification_is_recognised_with_its_address() {
        let mac = [0x02, 0, 0, 0, 0, 0x2a];
        let mut batch = newlink(
            7,
            &[(IFLA_ADDRESS, &mac), (IFLA_EVENT, &3u32.to_ne_bytes())],
        );
        // A plain link change, and a notify-peers event: no failover.
        batch.extend(newlink(7, &[(IFLA_ADDRESS, &mac)]));
        batch.extend(newlink(8, &[(IFLA_EVENT, &4u32.to_ne_bytes())]));
        let got: Vec<_> = link_notices(&batch).collect();
        assert_eq!(
            got,
            vec![
                LinkNotice {
                    ifindex: 7,
                    hw_addr: Some(mac.to_vec()),
                    bonding_failover: true
                },
                LinkNotice {
                    ifindex: 7,
                    hw_addr: Some(mac.to_vec()),
                    bonding_failover: false
                },
                LinkNotice {
                    ifindex: 8,
                    hw_addr: None,
                    bonding_failover: false
                },
            ]
        );
        // Cut short: what does not fit is not read.
        assert_eq!(link_notices(&batch[..20]).count(), 0);
    }

    #[test]
    fn loopback_has_an_all_zero_hardware_address() {
        assert_eq!(hw_addr(1), vec![0; 6]);
    }

    #[test]
    fn every_loopback_address_is_usable_and_a_foreign_one_is_not() {
        for a in ["127.0.0.1", "127.0.0.2", "127.3.4.5"] {
            assert!(address_usable(a.parse().unwrap()), "{a}");
        }
        // TEST-NET-3 (RFC 5737): on no interface of a test host.
        assert!(!address_usable("203.0.113.77".parse().unwrap()));
    }
}
