//! rtnetlink, the kernel's routing socket, as the device reads it: one
//! request and its answer (`request`: the route to an address, a link's
//! flags, a neighbour entry — none needs a privilege), subscriptions to
//! the kernel's notifications (`subscribe`), and walking the messages and
//! attributes of what comes back. Messages are built and read as bytes
//! (host byte order, as netlink is), bounds-checked: a short or malformed
//! message is skipped, never trusted.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    bind, recv, sendto, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol,
    SockType,
};

/// Message types (`<linux/rtnetlink.h>`, `<linux/netlink.h>`).
pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const NLMSG_DONE: u16 = 3;
pub(crate) const RTM_NEWLINK: u16 = 16;
pub(crate) const RTM_GETLINK: u16 = 18;
pub(crate) const RTM_NEWROUTE: u16 = 24;
pub(crate) const RTM_GETROUTE: u16 = 26;
pub(crate) const RTM_NEWNEIGH: u16 = 28;
pub(crate) const RTM_GETNEIGH: u16 = 30;
/// `NLM_F_REQUEST`.
const NLM_F_REQUEST: u16 = 1;
/// Bytes of `struct nlmsghdr`.
const HEADER: usize = 16;
/// How long a request waits for the kernel's answer before it gives up
/// (the kernel answers at once; this only bounds a broken socket).
const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// Why a request got no answer.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The kernel answered with this error (`NLMSG_ERROR`).
    Kernel(Errno),
    /// The socket failed, or no answer came.
    Socket(io::Error),
}

impl From<Errno> for Failure {
    fn from(e: Errno) -> Self {
        Failure::Socket(e.into())
    }
}

/// A netlink message: type, and what follows its header.
pub(crate) struct Message<'a> {
    pub(crate) kind: u16,
    pub(crate) seq: u32,
    pub(crate) payload: &'a [u8],
}

/// The messages of one datagram, in order; stops at the first that does
/// not fit.
pub(crate) fn messages(mut buf: &[u8]) -> impl Iterator<Item = Message<'_>> {
    std::iter::from_fn(move || {
        let len = u32_at(buf, 0)? as usize;
        if len < HEADER || len > buf.len() {
            return None;
        }
        let msg = Message {
            kind: u16_at(buf, 4)?,
            seq: u32_at(buf, 8)?,
            payload: &buf[HEADER..len],
        };
        buf = buf.get(align(len)..).unwrap_or(&[]);
        Some(msg)
    })
}

/// The attributes (`struct rtattr`: type, value) from `buf` on; stops at
/// the first that does not fit.
pub(crate) fn attributes(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = usize::from(u16_at(buf, 0)?);
        if len < 4 || len > buf.len() {
            return None;
        }
        let attr = (u16_at(buf, 2)?, &buf[4..len]);
        buf = buf.get(align(len)..).unwrap_or(&[]);
        Some(attr)
    })
}

/// The native-endian u16 at `at`.
pub(crate) fn u16_at(buf: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(buf.get(at..at + 2)?.try_into().ok()?))
}

/// The native-endian u32 at `at`.
pub(crate) fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(buf.get(at..at + 4)?.try_into().ok()?))
}

fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// A request: header, the fixed `body` (a multiple of four bytes, as
/// every rtnetlink family header is), then `attrs`.
fn build(kind: u16, seq: u32, body: &[u8], attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut msg = vec![0u8; HEADER];
    msg.extend_from_slice(body);
    for (ty, value) in attrs {
        let len = 4 + value.len();
        msg.extend_from_slice(&(len as u16).to_ne_bytes());
        msg.extend_from_slice(&ty.to_ne_bytes());
        msg.extend_from_slice(value);
        msg.resize(align(msg.len()), 0);
    }
    let total = msg.len() as u32;
    msg[0..4].copy_from_slice(&total.to_ne_bytes());
    msg[4..6].copy_from_slice(&kind.to_ne_bytes());
    msg[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    msg[8..12].copy_from_slice(&seq.to_ne_bytes());
    msg
}

fn open(groups: u32, flags: SockFlag) -> io::Result<OwnedFd> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        flags | SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups))?;
    Ok(fd)
}

/// A socket subscribed to the rtnetlink multicast `groups` (`RTMGRP_*`
/// bits), non-blocking, in the calling thread's network namespace.
pub(crate) fn subscribe(groups: u32) -> io::Result<OwnedFd> {
    open(groups, SockFlag::SOCK_NONBLOCK)
}

/// Sends one request (`kind`, `body`, `attrs`) and returns the payload of
/// its answer, which must be of type `answer`. A socket of its own, so no
/// notification or other answer gets in the way.
pub(crate) fn request(
    kind: u16,
    body: &[u8],
    attrs: &[(u16, &[u8])],
    answer: u16,
) -> Result<Vec<u8>, Failure> {
    const SEQ: u32 = 1;
    let fd = open(0, SockFlag::empty()).map_err(Failure::Socket)?;
    let msg = build(kind, SEQ, body, attrs);
    sendto(
        fd.as_raw_fd(),
        &msg,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )?;
    let mut buf = vec![0u8; 32 * 1024];
    let deadline = std::time::Instant::now() + ANSWER_WAIT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(Failure::Socket(io::Error::new(
                io::ErrorKind::TimedOut,
                "rtnetlink did not answer",
            )));
        }
        let mut fds = [PollFd::new(
            std::os::fd::AsFd::as_fd(&fd),
            PollFlags::POLLIN,
        )];
        match poll(
            &mut fds,
            PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        let n = match recv(fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            Ok(n) => n,
            Err(Errno::EINTR | Errno::EAGAIN) => continue,
            Err(e) => return Err(e.into()),
        };
        for m in messages(&buf[..n]) {
            if m.seq != SEQ {
                continue;
            }
            if m.kind == NLMSG_ERROR {
                // `struct nlmsgerr`: a negative errno (0 is an ACK).
                let code = u32_at(m.payload, 0).map_or(0, |c| c as i32);
                if code < 0 {
                    return Err(Failure::Kernel(Errno::from_raw(-code)));
                }
                continue;
            }
            if m.kind == answer {
                return Ok(m.payload.to_vec());
            }
            if m.kind == NLMSG_DONE {
                return Err(Failure::Kernel(Errno::ENOENT));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_request_walks_back_as_its_message_and_attributes() {
        let msg = build(
            RTM_GETROUTE,
            7,
            &[1, 2, 3, 4],
            &[(1, &[10, 0, 0, 1]), (5, &[9])],
        );
        assert_eq!(msg.len() % 4, 0);
        let all: Vec<_> = messages(&msg).collect();
        assert_eq!(all.len(), 1);
        assert_eq!((all[0].kind, all[0].seq), (RTM_GETROUTE, 7));
        assert_eq!(&all[0].payload[..4], &[1, 2, 3, 4]);
        let attrs: Vec<_> = attributes(&all[0].payload[4..]).collect();
        assert_eq!(attrs, vec![(1, &[10u8, 0, 0, 1][..]), (5, &[9u8][..])]);
    }

    #[test]
    fn truncated_or_lying_lengths_end_the_walk() {
        let msg = build(RTM_GETLINK, 1, &[0; 16], &[(1, &[1, 2, 3, 4, 5, 6])]);
        assert_eq!(messages(&msg[..msg.len() - 1]).count(), 0);
        let mut lying = msg.clone();
        lying[0..4].copy_from_slice(&4u32.to_ne_bytes());
        assert_eq!(messages(&lying).count(), 0);
        // An attribute claiming more than there is.
        assert_eq!(attributes(&[200, 0, 1, 0, 9]).count(), 0);
        assert_eq!(attributes(&[]).count(), 0);
    }

    #[test]
    fn the_route_to_loopback_is_local() {
        // RTM_GETROUTE for 127.0.0.1: a real round trip to the kernel.
        let mut body = [0u8; 12];
        body[0] = nix::libc::AF_INET as u8;
        body[1] = 32;
        let route = request(RTM_GETROUTE, &body, &[(1, &[127, 0, 0, 1])], RTM_NEWROUTE)
            .expect("the kernel answers RTM_GETROUTE");
        // rtm_type: RTN_LOCAL.
        assert_eq!(route[7], 2);
    }
}
