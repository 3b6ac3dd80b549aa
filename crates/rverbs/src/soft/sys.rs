//! The socket options std and nix do not wrap. The only `unsafe` outside
//! `memory.rs`.

use std::io;
use std::os::fd::AsRawFd;

use nix::libc;

fn set_int_opt(
    fd: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `fd` is an open socket borrowed for the call; the option value
    // is a live c_int and its exact size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets Don't Fragment on every IPv4 packet the socket sends
/// (`IP_MTU_DISCOVER = IP_PMTUDISC_DO`), so Linux writes IP ID 0 on the
/// packets of this unconnected socket and the ICRC can be computed for it.
/// IPv6 never fragments in flight; it needs no option.
pub(crate) fn set_dont_fragment(fd: &impl AsRawFd, ipv6: bool) -> io::Result<()> {
    if ipv6 {
        set_int_opt(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
    } else {
        set_int_opt(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    }
}
