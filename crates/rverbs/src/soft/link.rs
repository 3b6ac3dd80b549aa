//! The port follows the device's address: an rtnetlink socket subscribed to
//! the host's address and link changes wakes the engine thread, which then
//! checks whether the address is still on an interface that is up. When it
//! goes away (or its interface goes down) the port goes DOWN with
//! IBV_EVENT_PORT_ERR to every context; when it comes back, ACTIVE with
//! IBV_EVENT_PORT_ACTIVE. Nothing polls: an idle device stays idle.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::net::if_::InterfaceFlags;
use nix::sys::socket::{
    bind, recv, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};

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
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )?;
        let groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups))?;
        Ok(LinkWatch { fd })
    }

    /// The descriptor to poll.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Reads every pending notification (their content does not matter:
    /// the address is looked up afresh); whether there was any.
    pub(crate) fn drain(&self) -> bool {
        let mut buf = [0u8; 8192];
        let mut any = false;
        loop {
            match recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
                Ok(0) => return any,
                Ok(_) => any = true,
                Err(Errno::EINTR) => {}
                // ENOBUFS: notifications were lost; a fresh look covers them.
                Err(Errno::ENOBUFS) => any = true,
                Err(_) => return any,
            }
        }
    }
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

    #[test]
    fn every_loopback_address_is_usable_and_a_foreign_one_is_not() {
        for a in ["127.0.0.1", "127.0.0.2", "127.3.4.5"] {
            assert!(address_usable(a.parse().unwrap()), "{a}");
        }
        // TEST-NET-3 (RFC 5737): on no interface of a test host.
        assert!(!address_usable("203.0.113.77".parse().unwrap()));
    }
}
