//! The system calls std and nix do not wrap (or wrap with an allocation
//! per call): socket options, `ppoll` on raw descriptors, `sendmmsg`,
//! `pidfd_open`, and `process_vm_readv` into registered memory for the
//! same-host path. With
//! `memory.rs` and `local/` (the shared rings, descriptors passed over a
//! UNIX socket), the only `unsafe` of the device.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
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

/// A process descriptor for `pid` (`pidfd_open(2)`, Linux 5.3+, always
/// close-on-exec): it reads readable once that very process has exited,
/// whoever else holds its descriptors. `None` where the kernel lacks the
/// call or the process is gone or not visible from this PID namespace.
pub(crate) fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok().filter(|&p| p > 0)?;
    // SAFETY: pidfd_open(2) takes a PID and flags and touches no memory of
    // ours.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_pidfd_open,
            libc::c_long::from(pid),
            0 as libc::c_long,
        )
    };
    let fd = RawFd::try_from(fd).ok().filter(|&fd| fd >= 0)?;
    // SAFETY: the kernel has just made this descriptor for this call;
    // nothing else knows it, so it gets exactly one owner here.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sleeps until one of `fds` is readable or `timeout` has passed
/// (`ppoll(2)`; a signal ends it early); which of them are readable, bit
/// `i` for `fds[i]` (of the first 32). Only the descriptor numbers are
/// used: if one was closed meanwhile (or its number reused), the sleep
/// merely ends early or at its timeout.
pub(crate) fn wait_readable(fds: &[std::os::fd::RawFd], timeout: std::time::Duration) -> u32 {
    let mut pfds: smallvec::SmallVec<[libc::pollfd; 4]> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `pfds` is a live array of `pfds.len()` pollfds and `ts` a live
    // timespec, both outliving the call; no signal mask is passed. poll(2)
    // only reads the descriptor numbers, so a closed or reused number is no
    // memory hazard (POLLNVAL, or another file's readiness).
    let n = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    if n <= 0 {
        return 0;
    }
    pfds.iter()
        .take(32)
        .enumerate()
        .filter(|(_, p)| p.revents != 0)
        .fold(0, |mask, (i, _)| mask | (1 << i))
}

/// `struct sched_attr` of `sched_setattr(2)` (libc does not define it).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
    sched_util_min: u32,
    sched_util_max: u32,
}

/// Asks the scheduler for short time slices for the calling thread
/// (`sched_setattr(2)` with `SCHED_OTHER` and `sched_runtime`; Linux 6.12
/// and later): under EEVDF a task with a shorter slice, woken, preempts
/// tasks with longer ones at once instead of waiting out their slice. Its
/// share of the CPU does not change. Best effort: older kernels ignore it.
/// The thread's policy and nice value are kept; only a normal
/// (`SCHED_OTHER`) thread is changed.
pub(crate) fn prefer_short_slices(slice: std::time::Duration) {
    let size = std::mem::size_of::<SchedAttr>() as u32;
    let mut attr = SchedAttr::default();
    // SAFETY: `attr` is a live sched_attr of `size` bytes the kernel may
    // fill; pid 0 is the calling thread; flags 0.
    let got = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut attr as *mut SchedAttr,
            size,
            0,
        )
    };
    if got != 0 || attr.sched_policy != libc::SCHED_OTHER as u32 {
        return;
    }
    attr.size = size;
    attr.sched_runtime = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX);
    // SAFETY: `attr` is a live, initialised sched_attr whose size field is
    // its size; pid 0 is the calling thread; flags 0.
    let _ = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
}

/// Room for one `UDP_SEGMENT` control message, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct GsoControl([u8; 32]);

/// Sends UDP datagrams without a checksum (`SO_NO_CHECK`), which makes
/// Linux refuse GSO sends (EINVAL): how the tests reach the engine's
/// fallback to a datagram per packet.
#[cfg(test)]
pub(crate) fn set_no_udp_checksum(fd: &impl AsRawFd) -> io::Result<()> {
    set_int_opt(fd, libc::SOL_SOCKET, libc::SO_NO_CHECK, 1)
}

/// One datagram of a [`send_many`] call: its bytes, and the segment size
/// when it is a UDP GSO batch.
pub(crate) struct Datagram<'a> {
    pub(crate) iov: &'a [std::io::IoSlice<'a>],
    pub(crate) gso_size: Option<u16>,
}

/// Most datagrams one [`send_many`] call hands the kernel.
pub(crate) const MAX_DATAGRAMS: usize = 8;

/// Most I/O vector entries one datagram may have (`UIO_MAXIOV`): the kernel
/// refuses a message with more (EMSGSIZE). The limit is per message, not
/// per `sendmmsg` call.
pub(crate) const MAX_IOV: usize = libc::UIO_MAXIOV as usize;

/// `sendmmsg(2)` of up to [`MAX_DATAGRAMS`] datagrams to `to`, each a GSO
/// batch when it says so: one system call where `sendmsg` would make one
/// each. How many the kernel took (it stops at the first it refuses, and
/// reports that one's error only when it took none).
pub(crate) fn send_many(
    fd: &impl AsRawFd,
    datagrams: &[Datagram<'_>],
    to: &nix::sys::socket::SockaddrStorage,
) -> io::Result<usize> {
    use nix::sys::socket::SockaddrLike;
    let datagrams = &datagrams[..datagrams.len().min(MAX_DATAGRAMS)];
    let data_len = std::mem::size_of::<u16>() as u32;
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(data_len) } as usize;
    let mut controls = [const { GsoControl([0; 32]) }; MAX_DATAGRAMS];
    // SAFETY: an all-zero mmsghdr is a valid empty one.
    let mut headers: [libc::mmsghdr; MAX_DATAGRAMS] = unsafe { std::mem::zeroed() };
    for ((d, h), control) in datagrams.iter().zip(&mut headers).zip(&mut controls) {
        let msg = &mut h.msg_hdr;
        msg.msg_name = to.as_ptr().cast_mut().cast();
        msg.msg_namelen = to.len();
        // IoSlice is guaranteed ABI-compatible with `struct iovec` on Unix.
        msg.msg_iov = d.iov.as_ptr().cast_mut().cast();
        msg.msg_iovlen = d.iov.len() as _;
        if let Some(size) = d.gso_size {
            debug_assert!(space <= control.0.len());
            msg.msg_control = control.0.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            // SAFETY: msg_control points at `space` zeroed, cmsghdr-aligned
            // bytes that outlive the call, so CMSG_FIRSTHDR returns a header
            // inside them with room for CMSG_LEN(2) bytes, the u16 included.
            unsafe {
                let cmsg = libc::CMSG_FIRSTHDR(msg);
                (*cmsg).cmsg_level = libc::SOL_UDP;
                (*cmsg).cmsg_type = libc::UDP_SEGMENT;
                (*cmsg).cmsg_len = libc::CMSG_LEN(data_len) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), size);
            }
        }
    }
    // SAFETY: `fd` is an open socket; the first `datagrams.len()` headers
    // point at the address, their iovecs (borrowed for the call) and their
    // control bytes, all live until it returns.
    let n = unsafe {
        libc::sendmmsg(
            fd.as_raw_fd(),
            headers.as_mut_ptr(),
            datagrams.len() as libc::c_uint,
            0,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Sends the socket's IPv4 multicast out of the interface holding `addr`
/// (`IP_MULTICAST_IF`); without it Linux picks the default route's.
pub(crate) fn set_multicast_if_v4(fd: &impl AsRawFd, addr: std::net::Ipv4Addr) -> io::Result<()> {
    let value = libc::in_addr {
        s_addr: u32::from_ne_bytes(addr.octets()),
    };
    // SAFETY: `fd` is an open socket borrowed for the call; the option value
    // is a live in_addr and its exact size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MULTICAST_IF,
            (&value as *const libc::in_addr).cast(),
            std::mem::size_of::<libc::in_addr>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sends the socket's IPv6 multicast out of interface `ifindex`
/// (`IPV6_MULTICAST_IF`).
pub(crate) fn set_multicast_if_v6(fd: &impl AsRawFd, ifindex: u32) -> io::Result<()> {
    set_int_opt(
        fd,
        libc::IPPROTO_IPV6,
        libc::IPV6_MULTICAST_IF,
        ifindex as libc::c_int,
    )
}

/// Copies `src` to `dst` in this process through the kernel
/// (`process_vm_writev` on our own pid): memory that is not mapped is
/// EFAULT instead of a fault.
///
/// # Safety
/// `dst..dst+src.len()` must be memory the caller may write (a checked MR
/// window behind its write lock), not aliased by a Rust reference.
pub(crate) unsafe fn write_to_self(dst: *mut u8, src: &[u8]) -> Result<(), Errno> {
    let local = libc::iovec {
        iov_base: src.as_ptr().cast_mut().cast(),
        iov_len: src.len(),
    };
    let remote = libc::iovec {
        iov_base: dst.cast(),
        iov_len: src.len(),
    };
    // SAFETY: both vectors describe live memory of this process (the
    // kernel only reads `local`; `remote` is the caller's window).
    let n = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(Errno::last());
    }
    if n as usize != src.len() {
        return Err(Errno::EFAULT);
    }
    Ok(())
}

/// Most I/O vector entries one `process_vm_readv` takes (`IOV_MAX`).
const CMA_MAX_IOV: usize = 1024;

/// Copies `len` bytes to `dst` (in this process) from the stretches
/// `remote` (address, length; in order, `len` bytes in all) of process
/// `pid`'s memory, with cross-memory attach (`process_vm_readv(2)`): one
/// copy, made by the kernel. A short copy (the peer unmapped part of it)
/// is EFAULT.
///
/// # Safety
/// `dst..dst+len` must be memory of this process that may be written
/// (registered memory behind its MR's write lock), not aliased by a Rust
/// reference meanwhile.
pub(crate) unsafe fn read_from_process(
    pid: i32,
    dst: *mut u8,
    len: usize,
    remote: &[(u64, u64)],
) -> Result<(), Errno> {
    let mut done = 0usize;
    let mut at = 0usize;
    while done < len {
        let mut iov: smallvec::SmallVec<[libc::iovec; 8]> = smallvec::SmallVec::new();
        let mut want = 0usize;
        while at < remote.len() && iov.len() < CMA_MAX_IOV && done + want < len {
            let (addr, n) = remote[at];
            let n = (n as usize).min(len - done - want);
            iov.push(libc::iovec {
                iov_base: addr as *mut libc::c_void,
                iov_len: n,
            });
            want += n;
            at += 1;
        }
        if want == 0 {
            return Err(Errno::EFAULT);
        }
        let local = libc::iovec {
            // SAFETY (of the pointer arithmetic): `done < len`, inside `dst`.
            iov_base: unsafe { dst.add(done) }.cast(),
            iov_len: want,
        };
        // SAFETY: `local` is within `dst..dst+len`, which the caller lends us
        // to write; the remote vector only names another process's memory,
        // which the kernel checks (a bad address is EFAULT, not ours).
        let n = unsafe {
            libc::process_vm_readv(pid, &local, 1, iov.as_ptr(), iov.len() as libc::c_ulong, 0)
        };
        if n < 0 {
            return Err(Errno::last());
        }
        if n as usize != want {
            return Err(Errno::EFAULT);
        }
        done += want;
    }
    Ok(())
}
