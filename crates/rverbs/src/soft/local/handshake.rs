//! Who is local, and the agreement: the local handshake between two rverbs
//! devices of this host, in this network namespace, of this user.
//!
//! This module owns the handshake's socket and protocol: a device listens
//! ([`LocalListener`]) on the abstract UNIX socket [`socket_name`] of its
//! address (abstract names live in the network namespace, so only a device
//! in this namespace can be found), and a device that wants a link to a
//! peer address dials it ([`connect`]). Either side ends with a
//! [`LinkSetup`]; a dial that does not end in one says why ([`Refusal`]),
//! and the QP then uses the wire.
//!
//! The protocol (version 2) is three fixed-size messages over a
//! `SOCK_SEQPACKET` connection, each [`MESSAGE_LEN`] bytes, little-endian,
//! starting with a magic and the version:
//!
//! 1. HELLO, initiator → acceptor: its address and the address it dialled,
//!    the address and value of its process's CMA cookie, and (`SCM_RIGHTS`)
//!    the shared memory of the link's two rings (made by [`create_shm`])
//!    and its device's doorbell;
//! 2. WELCOME, acceptor → initiator: the same about the acceptor (its
//!    doorbell, no memory), and whether it could read the initiator's
//!    cookie with `process_vm_readv`;
//! 3. CONFIRM, initiator → acceptor: whether the initiator could read the
//!    acceptor's.
//!
//! A doorbell is an eventfd its device's sleepers watch: a producer that
//! pushed records while the ring's consumer sleeps writes the peer's. (It
//! used to be an empty datagram to the peer's UDP socket, which cost four
//! ping-pong pairs on two cores about 40 % of all CPU in the kernel's UDP
//! path.) A received doorbell must be an anonymous inode (an eventfd), not
//! a file: a peer's doorbell is only ever written eight bytes.
//!
//! The connection then stays open, in [`LinkSetup::conn`]: it reads end
//! of file when the peer's device goes away. Either side may instead send
//! REFUSE (a reason) and hang up; a version other than its own is
//! refused, so an old peer and a new one fall back to the wire.
//! Cross-memory attach is on only when both probes read the right bytes;
//! a probe that fails (EPERM from a seccomp profile or Yama, ESRCH for a
//! process this PID namespace cannot see) only turns it off.
//!
//! Security rules: an abstract name has no permissions, so anyone in the
//! namespace may bind or dial one. Each side therefore checks the other's
//! credentials with `SO_PEERCRED` before it trusts a byte: the peer's
//! effective UID must equal ours (no exception for root). The peer's PID
//! is taken from `SO_PEERCRED` too, never from a message (the message's
//! PID is for logs); the cookie read back through that PID proves that
//! cross-memory attach reaches the process that holds the other end. The
//! shared memory is checked to be a ring before the link is made, and a
//! received message is checked for size, magic, version, kind and
//! addresses. The acceptor spends at most [`ACCEPT_TIME`] on a connection,
//! so a slow or broken client delays the next one by that at most, and
//! nothing a client sends ends its thread.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    accept4, bind, getsockopt, listen, recvmsg, sendmsg, setsockopt, shutdown, socket, sockopt,
    AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags, Shutdown, SockFlag,
    SockType, UnixAddr,
};
use nix::sys::time::TimeVal;
use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::{geteuid, Pid};

use super::ring::{create_shm, RingPair};
use super::LinkSetup;

/// Prefix of every device's handshake socket name.
const SOCKET_PREFIX: &str = "rverbs-local/";
/// First 8 bytes of every message: "rverbsLH" (local handshake).
const MAGIC: u64 = u64::from_le_bytes(*b"rverbsLH");
/// The protocol's version.
const VERSION: u16 = 2;
/// Bytes of every message.
const MESSAGE_LEN: usize = 88;
/// The longest the acceptor spends on one connection.
const ACCEPT_TIME: Duration = Duration::from_secs(1);
/// Connections waiting to be accepted.
const BACKLOG: i32 = 64;
/// How often a wait for a message looks whether its listener is stopping.
const STOP_CHECK: Duration = Duration::from_millis(50);
/// File descriptors one message can carry (`SCM_MAX_FD`): room for all
/// of them, so that any a peer sends are received and closed.
const MAX_FDS: usize = 253;

/// Bytes of the CMA cookie.
const COOKIE_LEN: usize = 16;

/// The abstract socket name of the device at `addr` (IPv4-mapped IPv6
/// addresses name the IPv4 device).
pub(crate) fn socket_name(addr: IpAddr) -> String {
    format!("{SOCKET_PREFIX}{}", addr.to_canonical())
}

/// Why no link was made with a peer device: the QP uses the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// Nothing listens at the peer's name: a device on another host, a
    /// kernel device, or an rverbs device with the same-host path off.
    #[error("no rverbs device with the same-host path has that address in this host's network namespace")]
    NotLocal,
    /// The peer device runs as another user.
    #[error("the peer device runs as another user (uid {uid})")]
    OtherUser {
        /// The peer's effective UID, as `SO_PEERCRED` gave it (or, when
        /// the peer refused us for it, ours as it saw it).
        uid: u32,
    },
    /// The peer spoke another version of the handshake, or sent something
    /// malformed or inconsistent, or hung up halfway.
    #[error("the peer device's handshake is of another version or malformed")]
    Protocol,
    /// The peer did not answer in time.
    #[error("the peer device did not complete the handshake in time")]
    TimedOut,
    /// A system call failed.
    #[error("the local handshake failed: {0}")]
    Io(Errno),
}

impl Refusal {
    /// A short, stable name of the reason, for counters and logs.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refusal::NotLocal => "not_local",
            Refusal::OtherUser { .. } => "other_user",
            Refusal::Protocol => "protocol",
            Refusal::TimedOut => "timed_out",
            Refusal::Io(_) => "io",
        }
    }

    /// The refusal from an I/O error.
    fn from_io(e: &io::Error) -> Refusal {
        Refusal::Io(Errno::from_raw(
            e.raw_os_error().unwrap_or(Errno::EIO as i32),
        ))
    }

    /// How a REFUSE message carries it: the reason code and an errno.
    fn to_wire(self) -> (u32, i32) {
        match self {
            Refusal::OtherUser { .. } => (REFUSED_OTHER_USER, 0),
            Refusal::Io(e) => (REFUSED_IO, e as i32),
            Refusal::NotLocal | Refusal::Protocol | Refusal::TimedOut => (REFUSED_PROTOCOL, 0),
        }
    }

    /// What a REFUSE message from a peer of user `peer_uid` means here.
    fn from_wire(reason: u32, errno: i32, peer_uid: u32) -> Refusal {
        match reason {
            REFUSED_OTHER_USER => Refusal::OtherUser { uid: peer_uid },
            REFUSED_IO => Refusal::Io(Errno::from_raw(errno)),
            _ => Refusal::Protocol,
        }
    }
}

/// REFUSE reasons on the wire.
const REFUSED_PROTOCOL: u32 = 1;
const REFUSED_OTHER_USER: u32 = 2;
const REFUSED_IO: u32 = 3;

/// A message's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Hello = 1,
    Welcome = 2,
    Confirm = 3,
    Refuse = 4,
}

impl Kind {
    fn from_wire(v: u16) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Welcome,
            3 => Kind::Confirm,
            4 => Kind::Refuse,
            _ => return None,
        })
    }
}

/// One message of the handshake. Layout (little-endian):
///
/// | bytes  | field                                                    |
/// |--------|----------------------------------------------------------|
/// | 0..8   | magic                                                    |
/// | 8..10  | version                                                  |
/// | 10..12 | kind                                                     |
/// | 12..16 | sender's own PID (for logs only)                         |
/// | 16, 17 | address families of `from` and `to` (4 or 6)            |
/// | 18..20 | zero                                                     |
/// | 20..24 | REFUSE: the reason code; otherwise zero                  |
/// | 24..28 | WELCOME, CONFIRM: the sender's CMA probe (0: it worked, else the errno); REFUSE: an errno |
/// | 28..32 | zero                                                     |
/// | 32..48 | `from`: the sender's device address                      |
/// | 48..64 | `to`: the receiver's device address                      |
/// | 64..72 | the sender's cookie address                              |
/// | 72..88 | the sender's cookie                                      |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Message {
    kind: Kind,
    pid: u32,
    from: IpAddr,
    to: IpAddr,
    reason: u32,
    errno: i32,
    cookie_addr: u64,
    cookie: [u8; COOKIE_LEN],
}

impl Message {
    /// A message of `kind` from `from` to `to`, with this process's PID
    /// and cookie.
    fn new(kind: Kind, from: IpAddr, to: IpAddr) -> Message {
        let cookie = cookie();
        Message {
            kind,
            pid: std::process::id(),
            from: from.to_canonical(),
            to: to.to_canonical(),
            reason: 0,
            errno: 0,
            cookie_addr: cookie.as_ptr().addr() as u64,
            cookie: *cookie,
        }
    }

    fn encode(&self) -> [u8; MESSAGE_LEN] {
        let mut b = [0u8; MESSAGE_LEN];
        b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[8..10].copy_from_slice(&VERSION.to_le_bytes());
        b[10..12].copy_from_slice(&(self.kind as u16).to_le_bytes());
        b[12..16].copy_from_slice(&self.pid.to_le_bytes());
        b[16] = encode_addr(self.from, &mut b[32..48]);
        b[17] = encode_addr(self.to, &mut b[48..64]);
        b[20..24].copy_from_slice(&self.reason.to_le_bytes());
        b[24..28].copy_from_slice(&self.errno.to_le_bytes());
        b[64..72].copy_from_slice(&self.cookie_addr.to_le_bytes());
        b[72..88].copy_from_slice(&self.cookie);
        b
    }

    /// The message in `b`: `Protocol` unless it is exactly one message of
    /// this version.
    fn decode(b: &[u8]) -> Result<Message, Refusal> {
        let b: &[u8; MESSAGE_LEN] = b.try_into().map_err(|_| Refusal::Protocol)?;
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&b[0..8]);
        if u64::from_le_bytes(magic) != MAGIC || u16_at(8) != VERSION {
            return Err(Refusal::Protocol);
        }
        let kind = Kind::from_wire(u16_at(10)).ok_or(Refusal::Protocol)?;
        let mut cookie_addr = [0u8; 8];
        cookie_addr.copy_from_slice(&b[64..72]);
        let mut cookie = [0u8; COOKIE_LEN];
        cookie.copy_from_slice(&b[72..88]);
        Ok(Message {
            kind,
            pid: u32_at(12),
            from: decode_addr(b[16], &b[32..48])?,
            to: decode_addr(b[17], &b[48..64])?,
            reason: u32_at(20),
            errno: u32_at(24) as i32,
            cookie_addr: u64::from_le_bytes(cookie_addr),
            cookie,
        })
    }

    /// The errno of the sender's CMA probe (WELCOME, CONFIRM), if it
    /// failed.
    fn probe_error(&self) -> Option<Errno> {
        (self.errno != 0).then(|| Errno::from_raw(self.errno))
    }
}

/// Writes `addr` into the 16 bytes of `out`; its family byte.
fn encode_addr(addr: IpAddr, out: &mut [u8]) -> u8 {
    match addr {
        IpAddr::V4(a) => {
            out[..4].copy_from_slice(&a.octets());
            4
        }
        IpAddr::V6(a) => {
            out.copy_from_slice(&a.octets());
            6
        }
    }
}

fn decode_addr(family: u8, b: &[u8]) -> Result<IpAddr, Refusal> {
    let mut v6 = [0u8; 16];
    v6.copy_from_slice(b);
    match family {
        4 if v6[4..].iter().all(|&x| x == 0) => {
            Ok(IpAddr::V4(Ipv4Addr::new(v6[0], v6[1], v6[2], v6[3])))
        }
        6 => Ok(IpAddr::V6(Ipv6Addr::from(v6)).to_canonical()),
        _ => Err(Refusal::Protocol),
    }
}

/// This process's CMA cookie: random bytes a peer reads with
/// `process_vm_readv` to prove that it reaches this process.
fn cookie() -> &'static [u8; COOKIE_LEN] {
    static COOKIE: OnceLock<[u8; COOKIE_LEN]> = OnceLock::new();
    COOKIE.get_or_init(|| {
        let mut c = [0u8; COOKIE_LEN];
        if getrandom::fill(&mut c).is_err() {
            // Not a secret, only this process's mark: without the kernel's
            // randomness, the PID and the time tell processes apart.
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            c[..8].copy_from_slice(&nanos.to_le_bytes());
            c[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        }
        c
    })
}

/// Reads the peer's cookie (`expected`, at `addr` in process `pid`) with
/// `process_vm_readv`. The error says why cross-memory attach does not
/// work: the call's own (EPERM …), ESRCH for a PID of 0 (a process in a
/// PID namespace this one cannot see) or other bytes than the cookie (not
/// the peer's process), EFAULT for a short read.
fn probe_cma(pid: u32, addr: u64, expected: &[u8; COOKIE_LEN]) -> Result<(), Errno> {
    let pid = i32::try_from(pid)
        .ok()
        .filter(|&p| p > 0)
        .ok_or(Errno::ESRCH)?;
    let base = usize::try_from(addr).map_err(|_| Errno::EFAULT)?;
    let mut got = [0u8; COOKIE_LEN];
    let read = process_vm_readv(
        Pid::from_raw(pid),
        &mut [IoSliceMut::new(&mut got)],
        &[RemoteIoVec {
            base,
            len: COOKIE_LEN,
        }],
    )?;
    if read != COOKIE_LEN {
        return Err(Errno::EFAULT);
    }
    if &got != expected {
        return Err(Errno::ESRCH);
    }
    Ok(())
}

/// The PID of the other end of `conn`, after checking that it runs as our
/// effective user (`OtherUser` if not).
fn check_peer(conn: &OwnedFd) -> Result<u32, Refusal> {
    let cred = getsockopt(conn, sockopt::PeerCredentials).map_err(Refusal::Io)?;
    if cred.uid() != geteuid().as_raw() {
        return Err(Refusal::OtherUser { uid: cred.uid() });
    }
    Ok(u32::try_from(cred.pid()).unwrap_or(0))
}

/// Sends `msg` (and `fds`, if any) without blocking.
fn send(conn: &OwnedFd, msg: &Message, fds: &[RawFd]) -> Result<(), Refusal> {
    let bytes = msg.encode();
    let iov = [IoSlice::new(&bytes)];
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
    loop {
        let flags = MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT;
        match sendmsg::<()>(conn.as_raw_fd(), &iov, cmsgs, flags, None) {
            Ok(n) if n == bytes.len() => return Ok(()),
            Ok(_) => return Err(Refusal::Io(Errno::EMSGSIZE)),
            Err(Errno::EINTR) => {}
            Err(e) => return Err(Refusal::Io(e)),
        }
    }
}

/// Tells the peer why we hang up (best effort: it may be gone).
fn send_refusal(conn: &OwnedFd, own: IpAddr, peer: IpAddr, why: Refusal) {
    let mut msg = Message::new(Kind::Refuse, own, peer);
    (msg.reason, msg.errno) = why.to_wire();
    msg.cookie_addr = 0;
    msg.cookie = [0; COOKIE_LEN];
    let _ = send(conn, &msg, &[]);
}

/// Waits (until `deadline`, or until `stopping` is set) for the next
/// message on `conn`, with the descriptors it carries.
fn receive(
    conn: &OwnedFd,
    deadline: Instant,
    stopping: Option<&AtomicBool>,
) -> Result<(Message, Vec<OwnedFd>), Refusal> {
    loop {
        if stopping.is_some_and(|s| s.load(Ordering::Acquire)) {
            return Err(Refusal::Io(Errno::ECANCELED));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Refusal::TimedOut);
        }
        let slice = if stopping.is_some() {
            left.min(STOP_CHECK)
        } else {
            left
        };
        let ms = u16::try_from(slice.as_micros().div_ceil(1000)).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(conn.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(Refusal::Io(e)),
        }
        match receive_now(conn) {
            Err(Refusal::Io(Errno::EAGAIN | Errno::EINTR)) => continue,
            // The peer hung up with a message of ours unread, and the
            // error came first; reading it cleared it, and what the peer
            // sent before (a REFUSE) is still queued behind.
            Err(Refusal::Io(Errno::ECONNRESET)) => {
                return receive_now(conn).map_err(|_| Refusal::Io(Errno::ECONNRESET))
            }
            other => return other,
        }
    }
}

/// Receives one message on `conn` without blocking.
fn receive_now(conn: &OwnedFd) -> Result<(Message, Vec<OwnedFd>), Refusal> {
    // One byte more than a message: a longer one is seen as such.
    let mut buf = [0u8; MESSAGE_LEN + 1];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC;
    let r =
        recvmsg::<()>(conn.as_raw_fd(), &mut iov, Some(&mut space), flags).map_err(Refusal::Io)?;
    let (len, truncated) = (
        r.bytes,
        r.flags
            .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC),
    );
    let mut fds = Vec::new();
    if let Ok(cmsgs) = r.cmsgs() {
        for cmsg in cmsgs {
            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                // SAFETY: the kernel has just installed these descriptors
                // in this process for this message; nothing else knows
                // them, so each gets exactly one owner here.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
    }
    if len == 0 {
        // End of file: the peer hung up before this message.
        return Err(Refusal::Protocol);
    }
    if truncated {
        return Err(Refusal::Protocol);
    }
    Ok((Message::decode(&buf[..len])?, fds))
}

/// Checks that a peer's doorbell is an eventfd: an anonymous inode (not a
/// file, pipe or socket that eight-byte writes would fill) that takes an
/// eight-byte write of zero, which adds nothing (a pidfd, timerfd or epoll
/// descriptor refuses it, and would refuse every ring).
fn check_doorbell(fd: &OwnedFd) -> Result<(), Refusal> {
    let st = nix::sys::stat::fstat(fd).map_err(Refusal::Io)?;
    if st.st_mode & nix::libc::S_IFMT != 0 {
        return Err(Refusal::Protocol);
    }
    match nix::unistd::write(fd, &0u64.to_ne_bytes()) {
        Ok(8) => Ok(()),
        _ => Err(Refusal::Protocol),
    }
}

/// Dials the device at `peer`, waiting for room in its backlog until
/// `deadline`.
fn dial(peer: IpAddr, deadline: Instant) -> Result<OwnedFd, Refusal> {
    let conn = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(Refusal::Io)?;
    let name = socket_name(peer);
    let addr = UnixAddr::new_abstract(name.as_bytes()).map_err(Refusal::Io)?;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Refusal::TimedOut);
        }
        // A blocking connect waits (up to the send timeout) while the
        // listener's backlog is full.
        let micros = i64::try_from(left.as_micros()).unwrap_or(i64::MAX).max(1);
        let timeout = TimeVal::new(micros / 1_000_000, micros % 1_000_000);
        setsockopt(&conn, sockopt::SendTimeout, &timeout).map_err(Refusal::Io)?;
        match nix::sys::socket::connect(conn.as_raw_fd(), &addr) {
            Ok(()) => break,
            Err(Errno::ECONNREFUSED | Errno::ENOENT) => return Err(Refusal::NotLocal),
            Err(Errno::EINTR | Errno::EAGAIN) => {}
            Err(e) => return Err(Refusal::Io(e)),
        }
    }
    setsockopt(&conn, sockopt::SendTimeout, &TimeVal::new(0, 0)).map_err(Refusal::Io)?;
    Ok(conn)
}

/// The initiator's half: dials the device at `peer` for the device at
/// `local`, whose doorbell is `doorbell`, and agrees a link whose rings
/// hold `ring_bytes` each, within `timeout` (it blocks meanwhile: a few
/// system calls each way when the peer answers). The shared memory is
/// made here and passed.
pub(crate) fn connect(
    local: IpAddr,
    peer: IpAddr,
    ring_bytes: usize,
    timeout: Duration,
    doorbell: BorrowedFd<'_>,
) -> Result<LinkSetup, Refusal> {
    let (local, peer) = (local.to_canonical(), peer.to_canonical());
    let now = Instant::now();
    let deadline = now
        .checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(86_400));
    let conn = dial(peer, deadline)?;
    let peer_pid = check_peer(&conn)?;
    let shm = create_shm(ring_bytes).map_err(|e| Refusal::from_io(&e))?;
    send(
        &conn,
        &Message::new(Kind::Hello, local, peer),
        &[shm.as_raw_fd(), doorbell.as_raw_fd()],
    )?;
    let agreed = (|| {
        let (welcome, mut fds) = receive(&conn, deadline, None)?;
        match welcome.kind {
            Kind::Welcome => {}
            Kind::Refuse => {
                let uid = geteuid().as_raw();
                return Err(Refusal::from_wire(welcome.reason, welcome.errno, uid));
            }
            Kind::Hello | Kind::Confirm => return Err(Refusal::Protocol),
        }
        if welcome.from != peer || welcome.to != local || fds.len() != 1 {
            return Err(Refusal::Protocol);
        }
        let peer_doorbell = fds.pop().ok_or(Refusal::Protocol)?;
        check_doorbell(&peer_doorbell)?;
        let ours = probe_cma(peer_pid, welcome.cookie_addr, &welcome.cookie).err();
        let mut confirm = Message::new(Kind::Confirm, local, peer);
        confirm.errno = ours.map_or(0, |e| e as i32);
        send(&conn, &confirm, &[])?;
        Ok((peer_doorbell, ours.or(welcome.probe_error())))
    })();
    match agreed {
        Ok((peer_doorbell, cma_refused)) => Ok(LinkSetup {
            shm,
            peer_doorbell,
            initiator: true,
            peer_addr: peer,
            peer_pid,
            cma: cma_refused.is_none(),
            cma_refused,
            conn,
        }),
        Err(why) => {
            send_refusal(&conn, local, peer, why);
            Err(why)
        }
    }
}

/// The acceptor's half, on a connection `conn` to the device at `own`,
/// whose doorbell is `doorbell`, within [`ACCEPT_TIME`] (or until
/// `stopping`).
fn accept_link(
    conn: OwnedFd,
    own: IpAddr,
    doorbell: BorrowedFd<'_>,
    stopping: &AtomicBool,
) -> Result<LinkSetup, Refusal> {
    let deadline = Instant::now() + ACCEPT_TIME;
    let mut peer_addr = None;
    let agreed = (|| {
        let peer_pid = check_peer(&conn)?;
        let (hello, mut fds) = receive(&conn, deadline, Some(stopping))?;
        if hello.kind != Kind::Hello || hello.to != own || fds.len() != 2 {
            return Err(Refusal::Protocol);
        }
        peer_addr = Some(hello.from);
        let peer_doorbell = fds.pop().ok_or(Refusal::Protocol)?;
        let shm = fds.pop().ok_or(Refusal::Protocol)?;
        check_doorbell(&peer_doorbell)?;
        // Only memory made by `create_shm` (a ring's header, the right
        // size) makes a link.
        RingPair::map(&shm, false).map_err(|_| Refusal::Protocol)?;
        let ours = probe_cma(peer_pid, hello.cookie_addr, &hello.cookie).err();
        let mut welcome = Message::new(Kind::Welcome, own, hello.from);
        welcome.errno = ours.map_or(0, |e| e as i32);
        send(&conn, &welcome, &[doorbell.as_raw_fd()])?;
        let (confirm, fds) = receive(&conn, deadline, Some(stopping))?;
        let consistent = confirm.from == hello.from && confirm.to == own;
        if confirm.kind != Kind::Confirm || !consistent || !fds.is_empty() {
            return Err(Refusal::Protocol);
        }
        Ok((
            shm,
            peer_doorbell,
            hello.from,
            peer_pid,
            ours.or(confirm.probe_error()),
        ))
    })();
    match agreed {
        Ok((shm, peer_doorbell, peer_addr, peer_pid, cma_refused)) => Ok(LinkSetup {
            shm,
            peer_doorbell,
            initiator: false,
            peer_addr,
            peer_pid,
            cma: cma_refused.is_none(),
            cma_refused,
            conn,
        }),
        Err(why) => {
            let peer = peer_addr.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            send_refusal(&conn, own, peer, why);
            Err(why)
        }
    }
}

/// A device's handshake socket and the thread (`rverbs-local`) that
/// accepts links on it. Dropping it stops the thread and frees the name.
pub(crate) struct LocalListener {
    #[cfg_attr(not(test), allow(dead_code))]
    addr: IpAddr,
    socket: Arc<OwnedFd>,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl LocalListener {
    /// Listens for the devices of this host that want a link with the
    /// device at `addr`, whose doorbell is `doorbell` (given to each peer),
    /// and hands each agreed link to `on_link` (on the
    /// listener's thread; a panic in it is caught and logged). EADDRINUSE
    /// if another listener has the name.
    ///
    /// Dropping the listener waits for its thread, so `on_link` must not
    /// wait for anything that the code dropping the listener holds.
    pub(crate) fn start(
        addr: IpAddr,
        doorbell: OwnedFd,
        on_link: impl Fn(LinkSetup) + Send + Sync + 'static,
    ) -> io::Result<LocalListener> {
        let addr = addr.to_canonical();
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        let name = socket_name(addr);
        bind(fd.as_raw_fd(), &UnixAddr::new_abstract(name.as_bytes())?)?;
        listen(&fd, Backlog::new(BACKLOG)?)?;
        let socket = Arc::new(fd);
        let stopping = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("rverbs-local".into())
            .spawn({
                let (socket, stopping) = (Arc::clone(&socket), Arc::clone(&stopping));
                move || serve(&socket, addr, &doorbell, &stopping, &on_link)
            })?;
        Ok(LocalListener {
            addr,
            socket,
            stopping,
            thread: Some(thread),
        })
    }

    /// The address of the device it listens for.
    #[cfg(test)]
    pub(crate) fn addr(&self) -> IpAddr {
        self.addr
    }
}

impl Drop for LocalListener {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        // Makes a blocked accept return (EINVAL) and refuses new dials.
        let _ = shutdown(self.socket.as_raw_fd(), Shutdown::Both);
        if let Some(thread) = self.thread.take() {
            // Not when dropped by `on_link` on the thread itself: the
            // thread ends by itself after it returns.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// The listener's thread: accepts and agrees links until stopped.
fn serve(
    listener: &OwnedFd,
    addr: IpAddr,
    doorbell: &OwnedFd,
    stopping: &AtomicBool,
    on_link: &dyn Fn(LinkSetup),
) {
    loop {
        if stopping.load(Ordering::Acquire) {
            return;
        }
        match accept4(listener.as_fd(), SockFlag::SOCK_CLOEXEC) {
            Ok(conn) => {
                // A panic while agreeing or taking one link (a bug; no
                // input should cause one) costs that link, not the thread.
                let handled = catch_unwind(AssertUnwindSafe(|| {
                    match accept_link(conn, addr, doorbell.as_fd(), stopping) {
                        Ok(setup) => {
                            let (peer, cma) = (setup.peer_addr, setup.cma);
                            tracing::debug!("{addr}: local link from {peer} (cma {cma})");
                            on_link(setup);
                        }
                        Err(why) => tracing::debug!(
                            "{addr}: refused a local link ({}): {why}",
                            why.reason()
                        ),
                    }
                }));
                if handled.is_err() {
                    tracing::warn!("{addr}: a local link's handshake panicked");
                }
            }
            Err(_) if stopping.load(Ordering::Acquire) => return,
            Err(Errno::EINTR | Errno::ECONNABORTED) => {}
            Err(e @ (Errno::EMFILE | Errno::ENFILE | Errno::ENOBUFS | Errno::ENOMEM)) => {
                tracing::debug!("{addr}: local links wait: {e}");
                std::thread::sleep(STOP_CHECK);
            }
            Err(e) => {
                tracing::warn!("{addr}: no more local links: {e}");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::sync::mpsc;
    use std::sync::Mutex;

    use nix::fcntl::OFlag;
    use nix::libc;
    use nix::sys::socket::{recv, SockaddrLike};
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, pipe2, ForkResult};

    use super::*;

    /// Bytes of each ring in the tests (the smallest).
    const RING: usize = 64 << 10;
    /// Long enough for any handshake on a loaded machine.
    const WAIT: Duration = Duration::from_secs(30);
    /// The user a forked child becomes (`nobody`).
    const OTHER_UID: u32 = 65534;

    /// Test `test`'s two device addresses, unique to it and (with the
    /// PID) to this process, so tests running at once do not meet.
    fn addrs(test: u8) -> (IpAddr, IpAddr) {
        let pid = std::process::id();
        let ip = |side: u8| {
            IpAddr::V4(Ipv4Addr::new(
                127,
                (pid >> 8) as u8,
                pid as u8,
                test * 2 + side,
            ))
        };
        (ip(0), ip(1))
    }

    /// A device's doorbell, as the engine makes it.
    fn doorbell() -> OwnedFd {
        let efd = nix::sys::eventfd::EventFd::from_flags(
            nix::sys::eventfd::EfdFlags::EFD_NONBLOCK | nix::sys::eventfd::EfdFlags::EFD_CLOEXEC,
        )
        .unwrap();
        efd.as_fd().try_clone_to_owned().unwrap()
    }

    /// [`connect`] for a device with a doorbell of its own.
    fn connect_belled(
        local: IpAddr,
        peer: IpAddr,
        ring_bytes: usize,
        timeout: Duration,
    ) -> Result<LinkSetup, Refusal> {
        connect(local, peer, ring_bytes, timeout, doorbell().as_fd())
    }

    /// A listener for `addr` whose links arrive on the receiver.
    fn listener(addr: IpAddr) -> (LocalListener, mpsc::Receiver<LinkSetup>) {
        let (tx, rx) = mpsc::channel();
        let l = LocalListener::start(addr, doorbell(), move |setup| {
            let _ = tx.send(setup);
        })
        .expect("listen");
        (l, rx)
    }

    /// A plain SEQPACKET connection to the listener of `addr`.
    fn dial_raw(addr: IpAddr) -> OwnedFd {
        dial(addr, Instant::now() + WAIT).expect("dial")
    }

    /// Whether a test that changes user can run: as root. Otherwise it is
    /// skipped with a note, except under CI, where it fails.
    fn root_or_skip(what: &str) -> bool {
        if geteuid().is_root() {
            return true;
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "{what}: needs root (to become another user) under CI"
        );
        eprintln!("skipped {what}: needs root to become another user");
        false
    }

    /// Forks (with [`FORK_LOCK`] held until the child has closed the
    /// descriptors it does not need) and runs the async-signal-safe
    /// `child` in the child, which then `_exit`s with its result.
    static FORK_LOCK: Mutex<()> = Mutex::new(());

    /// In a forked child: closes every descriptor above 2 except `keep`
    /// (sorted). Async-signal-safe (system calls and arithmetic only).
    fn close_all_but(keep: &[RawFd]) {
        let close_range = |first: RawFd, last: libc::c_uint| {
            // SAFETY: close_range(2) on this (forked, single-threaded)
            // child's own descriptor table; no Rust object of the child
            // uses the descriptors closed.
            unsafe { libc::syscall(libc::SYS_close_range, first as libc::c_uint, last, 0u32) };
        };
        let mut first = 3;
        for &fd in keep {
            if fd > first {
                close_range(first, (fd - 1) as libc::c_uint);
            }
            first = first.max(fd + 1);
        }
        close_range(first, libc::c_uint::MAX);
    }

    /// In a forked child: becomes user [`OTHER_UID`]; whether it did.
    fn become_other_user() -> bool {
        let uid = OTHER_UID as libc::c_long;
        // SAFETY: a raw setresuid(2) of this single-threaded child.
        unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) == 0 }
    }

    /// In a forked child: writes `byte` to `fd`.
    fn say(fd: RawFd, byte: u8) {
        // SAFETY: writes one byte from a live local to a descriptor.
        unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
    }

    /// In a forked child: a SEQPACKET socket connected to `addr`, or -1.
    fn child_connect(addr: &UnixAddr) -> RawFd {
        // SAFETY: socket(2) and connect(2) with a socket address built
        // before the fork (pointer and length from the live `addr`).
        unsafe {
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
            if s < 0 || libc::connect(s, addr.as_ptr().cast(), addr.len()) != 0 {
                return -1;
            }
            s
        }
    }

    /// In a forked child: sends `bytes` with descriptor `fd` on `s`
    /// (`SCM_RIGHTS`), errors ignored.
    fn child_send_with_fd(s: RawFd, bytes: &[u8], fd: RawFd) {
        #[repr(C, align(8))]
        struct Control([u8; 64]);
        let mut control = Control([0; 64]);
        let mut iov = libc::iovec {
            iov_base: bytes.as_ptr().cast_mut().cast(),
            iov_len: bytes.len(),
        };
        // SAFETY: a msghdr pointing to the live `iov` and `control`
        // (aligned, larger than CMSG_SPACE of one descriptor), its one
        // control message written within `control` through the CMSG
        // macros; sendmsg(2) only reads them.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.0.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(4) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(4) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
            libc::sendmsg(s, &msg, libc::MSG_NOSIGNAL);
        }
    }

    /// In a forked child: the next message on `s` (waiting up to
    /// [`WAIT`]), `Err(n)` with what `recv` returned if it is none.
    fn child_receive(s: RawFd) -> Result<Message, isize> {
        let timeout = libc::timeval {
            tv_sec: WAIT.as_secs() as libc::time_t,
            tv_usec: 0,
        };
        let mut buf = [0u8; MESSAGE_LEN];
        // SAFETY: setsockopt(2) with a live timeval of its exact size.
        unsafe {
            libc::setsockopt(
                s,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        // SAFETY: recv(2) into a live buffer of its length.
        let mut recv = || unsafe { libc::recv(s, buf.as_mut_ptr().cast(), buf.len(), 0) };
        let mut n = recv();
        if n < 0 {
            // ECONNRESET (the listener hung up with our hello unread)
            // comes before what it sent: once more for that.
            n = recv();
        }
        if n != MESSAGE_LEN as isize {
            return Err(n);
        }
        Message::decode(&buf).map_err(|_| -2)
    }

    /// In a forked child: ends it.
    fn child_exit(code: i32) -> ! {
        // SAFETY: _exit(2) runs no handlers of the parent's.
        unsafe { libc::_exit(code) }
    }

    /// Reads the one byte a child says on `from`.
    fn hear(from: OwnedFd) -> Option<u8> {
        let mut byte = [0u8; 1];
        let n = std::fs::File::from(from).read(&mut byte).ok()?;
        (n == 1).then_some(byte[0])
    }

    /// Makes this thread's `process_vm_readv` fail with EPERM, as a
    /// container's seccomp profile does (a filter on this thread only).
    fn deny_process_vm_readv_on_this_thread() -> io::Result<()> {
        let stmt = |code: u32, k: u32| libc::sock_filter {
            code: code as u16,
            jt: 0,
            jf: 0,
            k,
        };
        let filter = [
            // The system call's number (`seccomp_data.nr`, at offset 0).
            stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
            // process_vm_readv: go on; anything else: skip one.
            libc::sock_filter {
                code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
                jt: 0,
                jf: 1,
                k: libc::SYS_process_vm_readv as u32,
            },
            stmt(
                libc::BPF_RET | libc::BPF_K,
                libc::SECCOMP_RET_ERRNO | (libc::EPERM as u32 & libc::SECCOMP_RET_DATA),
            ),
            stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
        ];
        let program = libc::sock_fprog {
            len: filter.len() as u16,
            filter: filter.as_ptr().cast_mut(),
        };
        // SAFETY: prctl(2) with integer arguments: this thread's
        // no_new_privs, which a filter of an unprivileged thread needs.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `program` points to `filter`, both live for the call,
        // which copies the program; it applies to this thread only.
        let rc = unsafe {
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &program as *const libc::sock_fprog,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    #[test]
    fn a_link_shares_its_rings_and_cross_memory_attach_works() {
        let (a, b) = addrs(1);
        let (_listener, links) = listener(a);
        let bell = doorbell();
        let ours = connect(b, a, RING, WAIT, bell.as_fd()).expect("a link");
        let theirs = links.recv_timeout(WAIT).expect("the acceptor's link");

        // The acceptor got our doorbell: what it writes there, we read.
        nix::unistd::write(&theirs.peer_doorbell, &3u64.to_ne_bytes()).unwrap();
        let mut count = [0u8; 8];
        assert_eq!(nix::unistd::read(&bell, &mut count), Ok(8));
        assert_eq!(u64::from_ne_bytes(count), 3);
        assert!(check_doorbell(&ours.peer_doorbell).is_ok());

        assert!(ours.initiator && !theirs.initiator);
        assert_eq!((ours.peer_addr, theirs.peer_addr), (a, b));
        assert_eq!(ours.peer_pid, std::process::id());
        assert_eq!(theirs.peer_pid, std::process::id());
        assert!(ours.cma && theirs.cma);
        assert_eq!((ours.cma_refused, theirs.cma_refused), (None, None));

        // Both map the same memory: a record crosses each way.
        let mut init = RingPair::map(&ours.shm, true).expect("initiator maps");
        let mut acc = RingPair::map(&theirs.shm, false).expect("acceptor maps");
        assert!(init.tx.push_pieces(&[b"to the ", b"acceptor"]));
        assert_eq!(acc.rx.peek(), Some(&b"to the acceptor"[..]));
        acc.rx.consume();
        assert!(acc.tx.push_pieces(&[b"to the initiator"]));
        assert_eq!(init.rx.peek(), Some(&b"to the initiator"[..]));
        init.rx.consume();

        // The connection tells the acceptor when the initiator goes away.
        drop(ours);
        setsockopt(&theirs.conn, sockopt::ReceiveTimeout, &TimeVal::new(30, 0)).unwrap();
        let mut buf = [0u8; 8];
        let n = recv(theirs.conn.as_raw_fd(), &mut buf, MsgFlags::empty());
        assert_eq!(n, Ok(0), "end of file");
    }

    #[test]
    fn ipv6_devices_link_too() {
        let pid = std::process::id();
        let a: IpAddr = format!("fd00::{:x}:1", pid & 0xffff).parse().unwrap();
        let b: IpAddr = format!("fd00::{:x}:2", pid & 0xffff).parse().unwrap();
        let (_listener, links) = listener(a);
        let ours = connect_belled(b, a, RING, WAIT).expect("a link");
        let theirs = links.recv_timeout(WAIT).expect("the acceptor's link");
        assert_eq!((ours.peer_addr, theirs.peer_addr), (a, b));
    }

    #[test]
    fn no_listener_is_not_local() {
        let (a, b) = addrs(2);
        let got = connect_belled(b, a, RING, WAIT);
        assert_eq!(got.unwrap_err(), Refusal::NotLocal);
        assert_eq!(Refusal::NotLocal.reason(), "not_local");
    }

    #[test]
    fn a_listener_of_another_user_is_refused() {
        if !root_or_skip("a_listener_of_another_user_is_refused") {
            return;
        }
        let (a, b) = addrs(3);
        let name = UnixAddr::new_abstract(socket_name(a).as_bytes()).unwrap();
        let (ready_r, ready_w) = pipe2(OFlag::O_CLOEXEC).unwrap();
        let (done_r, done_w) = pipe2(OFlag::O_CLOEXEC).unwrap();
        let (ready, done) = (ready_w.as_raw_fd(), done_r.as_raw_fd());
        let mut keep = [ready, done];
        keep.sort_unstable();
        let guard = FORK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the child makes only async-signal-safe calls (system
        // calls on data made before the fork) and ends with _exit.
        let child = match unsafe { fork() }.expect("fork") {
            ForkResult::Child => {
                close_all_but(&keep);
                if !become_other_user() {
                    say(ready, b'u');
                    child_exit(1);
                }
                // SAFETY: socket(2), bind(2) to the address made before
                // the fork, listen(2).
                let listening = unsafe {
                    let s = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
                    s >= 0
                        && libc::bind(s, name.as_ptr().cast(), name.len()) == 0
                        && libc::listen(s, 8) == 0
                };
                say(ready, if listening { b'l' } else { b'b' });
                // Until the parent is done (it closes its end).
                let mut byte = 0u8;
                // SAFETY: reads into a live local byte.
                unsafe { libc::read(done, (&mut byte as *mut u8).cast(), 1) };
                child_exit(0);
            }
            ForkResult::Parent { child } => child,
        };
        drop((ready_w, done_r));
        let said = hear(ready_r);
        drop(guard);
        let got = (said == Some(b'l')).then(|| connect_belled(b, a, RING, WAIT));
        drop(done_w);
        let status = waitpid(child, None).expect("wait");
        assert_eq!(said, Some(b'l'), "the child listens as another user");
        assert_eq!(
            got.unwrap().unwrap_err(),
            Refusal::OtherUser { uid: OTHER_UID }
        );
        assert_eq!(status, WaitStatus::Exited(child, 0));
    }

    #[test]
    fn a_client_of_another_user_is_refused() {
        if !root_or_skip("a_client_of_another_user_is_refused") {
            return;
        }
        let (a, b) = addrs(4);
        let (_listener, links) = listener(a);
        let name = UnixAddr::new_abstract(socket_name(a).as_bytes()).unwrap();
        let shm = create_shm(RING).unwrap();
        let hello = Message::new(Kind::Hello, b, a).encode();
        let (ready_r, ready_w) = pipe2(OFlag::O_CLOEXEC).unwrap();
        let (ready, shm_fd) = (ready_w.as_raw_fd(), shm.as_raw_fd());
        let mut keep = [ready, shm_fd];
        keep.sort_unstable();
        let guard = FORK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the child makes only async-signal-safe calls (system
        // calls on data made before the fork) and ends with _exit.
        let child = match unsafe { fork() }.expect("fork") {
            ForkResult::Child => {
                close_all_but(&keep);
                say(ready, b'c');
                if !become_other_user() {
                    child_exit(10);
                }
                let s = child_connect(&name);
                if s < 0 {
                    child_exit(11);
                }
                child_send_with_fd(s, &hello, shm_fd);
                child_exit(match child_receive(s) {
                    Ok(m) if m.kind == Kind::Refuse && m.reason == REFUSED_OTHER_USER => 0,
                    Ok(m) if m.kind == Kind::Welcome => 1,
                    Ok(_) => 3,
                    Err(0) => 2,
                    Err(_) => 4,
                });
            }
            ForkResult::Parent { child } => child,
        };
        drop(ready_w);
        let said = hear(ready_r);
        drop(guard);
        let status = waitpid(child, None).expect("wait");
        assert_eq!(said, Some(b'c'));
        assert_eq!(
            status,
            WaitStatus::Exited(child, 0),
            "the child (another user) gets REFUSE (other user)"
        );
        // The listener made no link of it, and still makes ours.
        let ours = connect_belled(b, a, RING, WAIT);
        assert!(ours.is_ok(), "{ours:?}");
        assert!(links.recv_timeout(WAIT).is_ok());
        assert!(links.try_recv().is_err(), "one link only");
    }

    #[test]
    fn a_peer_that_cannot_attach_makes_a_link_without_cma() {
        let (a, b) = addrs(5);
        let (_listener, links) = listener(a);
        // The initiator runs on a thread whose process_vm_readv is denied
        // (the listener's thread, like a peer process, is not).
        let initiator = std::thread::spawn(move || {
            deny_process_vm_readv_on_this_thread().map(|()| connect_belled(b, a, RING, WAIT))
        });
        let ours = match initiator.join().expect("the thread") {
            Ok(got) => got.expect("a link"),
            Err(e) => {
                assert!(std::env::var_os("CI").is_none(), "no seccomp filter: {e}");
                eprintln!("skipped a_peer_that_cannot_attach_makes_a_link_without_cma: no seccomp filter: {e}");
                return;
            }
        };
        let theirs = links.recv_timeout(WAIT).expect("the acceptor's link");
        assert!(!ours.cma && !theirs.cma);
        assert_eq!(ours.cma_refused, Some(Errno::EPERM), "its own probe");
        assert_eq!(
            theirs.cma_refused,
            Some(Errno::EPERM),
            "as the peer reported"
        );
        assert!(RingPair::map(&ours.shm, true).is_ok());
        assert!(RingPair::map(&theirs.shm, false).is_ok());
    }

    #[test]
    fn bad_clients_do_not_stop_the_listener() {
        let (a, b) = addrs(6);
        let (_listener, links) = listener(a);
        let shm = create_shm(RING).unwrap();
        let send_raw = |conn: &OwnedFd, bytes: &[u8], fds: &[RawFd]| {
            let rights = [ControlMessage::ScmRights(fds)];
            let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
            sendmsg::<()>(
                conn.as_raw_fd(),
                &[IoSlice::new(bytes)],
                cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .expect("send");
        };
        // Junk.
        let junk = dial_raw(a);
        send_raw(&junk, b"junk", &[]);
        // Nothing at all, and it stays.
        let silent = dial_raw(a);
        // Another version.
        let mut newer = Message::new(Kind::Hello, b, a).encode();
        newer[8..10].copy_from_slice(&(VERSION + 1).to_le_bytes());
        let other_version = dial_raw(a);
        send_raw(&other_version, &newer, &[shm.as_raw_fd()]);
        // A hello with three descriptors.
        let hello = Message::new(Kind::Hello, b, a).encode();
        let too_many = dial_raw(a);
        let fd = shm.as_raw_fd();
        send_raw(&too_many, &hello, &[fd, fd, fd]);
        let bell = doorbell();
        // A hello with the memory but no doorbell (as version 1 sent it).
        let no_bell = dial_raw(a);
        send_raw(&no_bell, &hello, &[fd]);
        // A hello whose memory is not a ring.
        let not_a_ring = dial_raw(a);
        let memfd =
            nix::sys::memfd::memfd_create(c"not-a-ring", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
                .unwrap();
        send_raw(&not_a_ring, &hello, &[memfd.as_raw_fd(), bell.as_raw_fd()]);
        // A hello whose doorbell is a file.
        let file_bell = dial_raw(a);
        send_raw(&file_bell, &hello, &[fd, memfd.as_raw_fd()]);
        // A hello for another device.
        let elsewhere = dial_raw(a);
        let to_b = Message::new(Kind::Hello, b, b).encode();
        send_raw(&elsewhere, &to_b, &[fd, bell.as_raw_fd()]);

        // Each bad one is refused, and a good one still gets its link.
        let bad = [
            &other_version,
            &too_many,
            &no_bell,
            &not_a_ring,
            &file_bell,
            &elsewhere,
        ];
        for conn in bad {
            let (reply, fds) = receive(conn, Instant::now() + WAIT, None).expect("a reply");
            assert_eq!(
                (reply.kind, reply.reason, fds.len()),
                (Kind::Refuse, REFUSED_PROTOCOL, 0)
            );
        }
        let ours = connect_belled(b, a, RING, WAIT);
        assert!(ours.is_ok(), "{ours:?}");
        assert!(links.recv_timeout(WAIT).is_ok());
        assert!(links.try_recv().is_err(), "one link only");
        drop((junk, silent));
    }

    #[test]
    fn only_an_eventfd_is_a_doorbell() {
        assert!(check_doorbell(&doorbell()).is_ok());
        // A file, and an anonymous inode that is not an eventfd.
        let file =
            nix::sys::memfd::memfd_create(c"bell", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap();
        assert_eq!(check_doorbell(&file), Err(Refusal::Protocol));
        if let Some(pidfd) = crate::soft::sys::pidfd_open(std::process::id()) {
            assert_eq!(check_doorbell(&pidfd), Err(Refusal::Protocol));
        }
        // The check adds nothing to a real one.
        let bell = doorbell();
        check_doorbell(&bell).unwrap();
        let mut count = [0u8; 8];
        assert_eq!(
            nix::unistd::read(&bell, &mut count),
            Err(Errno::EAGAIN),
            "still zero"
        );
    }

    #[test]
    fn a_bad_acceptor_ends_in_a_refusal() {
        let (a, b) = addrs(8);
        let fake = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        bind(
            fake.as_raw_fd(),
            &UnixAddr::new_abstract(socket_name(a).as_bytes()).unwrap(),
        )
        .unwrap();
        listen(&fake, Backlog::new(8).unwrap()).unwrap();
        // Dials the fake acceptor, which answers the hello with `reply`
        // (or nothing); what the dial ends in.
        let answer_with = |reply: Option<[u8; MESSAGE_LEN]>, fd: Option<RawFd>, timeout| {
            let dialler = std::thread::spawn(move || connect_belled(b, a, RING, timeout));
            let conn = accept4(fake.as_fd(), SockFlag::SOCK_CLOEXEC).expect("accept");
            let (hello, fds) = receive(&conn, Instant::now() + WAIT, None).expect("a hello");
            assert_eq!(
                (hello.kind, hello.from, hello.to, fds.len()),
                (Kind::Hello, b, a, 2)
            );
            if let Some(reply) = reply {
                let fds: Vec<RawFd> = fd.into_iter().collect();
                let rights = [ControlMessage::ScmRights(&fds)];
                let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
                sendmsg::<()>(
                    conn.as_raw_fd(),
                    &[IoSlice::new(&reply)],
                    cmsgs,
                    MsgFlags::MSG_NOSIGNAL,
                    None,
                )
                .expect("reply");
            }
            dialler.join().expect("the dialling thread")
        };
        let answer = |reply, timeout| answer_with(reply, None, timeout);

        let mut refuse = Message::new(Kind::Refuse, a, b);
        (refuse.reason, refuse.errno) = Refusal::Io(Errno::ENOMEM).to_wire();
        assert_eq!(
            answer(Some(refuse.encode()), WAIT).unwrap_err(),
            Refusal::Io(Errno::ENOMEM)
        );
        let mut refuse = Message::new(Kind::Refuse, a, b);
        (refuse.reason, refuse.errno) = Refusal::OtherUser { uid: 0 }.to_wire();
        let uid = geteuid().as_raw();
        assert_eq!(
            answer(Some(refuse.encode()), WAIT).unwrap_err(),
            Refusal::OtherUser { uid }
        );

        let another_device = Message::new(Kind::Welcome, b, b).encode();
        assert_eq!(
            answer(Some(another_device), WAIT).unwrap_err(),
            Refusal::Protocol
        );
        let mut newer = Message::new(Kind::Welcome, a, b).encode();
        newer[8..10].copy_from_slice(&(VERSION + 1).to_le_bytes());
        assert_eq!(answer(Some(newer), WAIT).unwrap_err(), Refusal::Protocol);
        let hello_back = Message::new(Kind::Hello, a, b).encode();
        assert_eq!(
            answer(Some(hello_back), WAIT).unwrap_err(),
            Refusal::Protocol
        );

        // A welcome without a doorbell, or with a file for one.
        let welcome = Message::new(Kind::Welcome, a, b).encode();
        assert_eq!(answer(Some(welcome), WAIT).unwrap_err(), Refusal::Protocol);
        let file =
            nix::sys::memfd::memfd_create(c"not-a-bell", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
                .unwrap();
        let file_bell = answer_with(Some(welcome), Some(file.as_raw_fd()), WAIT);
        assert_eq!(file_bell.unwrap_err(), Refusal::Protocol);
        // The same welcome with an eventfd makes the link.
        let bell = doorbell();
        let belled = answer_with(Some(welcome), Some(bell.as_raw_fd()), WAIT);
        assert!(belled.is_ok(), "{belled:?}");

        let silence = answer(None, Duration::from_millis(200));
        assert_eq!(silence.unwrap_err(), Refusal::TimedOut);
        assert_eq!(Refusal::TimedOut.reason(), "timed_out");
    }

    #[test]
    fn dropping_the_listener_frees_its_name() {
        let (a, b) = addrs(7);
        let _no_fork = FORK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (first, _links) = listener(a);
        assert_eq!(first.addr(), a);
        let taken = LocalListener::start(a, doorbell(), |_| {});
        assert_eq!(
            taken.err().and_then(|e| e.raw_os_error()),
            Some(Errno::EADDRINUSE as i32)
        );
        // Dropped while a client that says nothing waits on it.
        let silent = dial_raw(a);
        drop(first);
        assert_eq!(
            connect_belled(b, a, RING, WAIT).unwrap_err(),
            Refusal::NotLocal
        );
        let (_again, links) = listener(a);
        assert!(connect_belled(b, a, RING, WAIT).is_ok());
        assert!(links.recv_timeout(WAIT).is_ok());
        drop(silent);
    }

    #[test]
    fn messages_round_trip_and_malformed_ones_are_refused() {
        let v4: IpAddr = "127.1.2.3".parse().unwrap();
        let v6: IpAddr = "fd00::1".parse().unwrap();
        let mut msg = Message::new(Kind::Welcome, v4, v6);
        msg.errno = Errno::EPERM as i32;
        let bytes = msg.encode();
        assert_eq!(Message::decode(&bytes), Ok(msg));
        assert_eq!(
            Message::decode(&bytes).unwrap().probe_error(),
            Some(Errno::EPERM)
        );

        let spoil = |at: usize, v: u8| {
            let mut b = bytes;
            b[at] = v;
            Message::decode(&b)
        };
        assert_eq!(spoil(0, b'x').unwrap_err(), Refusal::Protocol, "magic");
        assert_eq!(spoil(8, 1).unwrap_err(), Refusal::Protocol, "version");
        assert_eq!(spoil(10, 9).unwrap_err(), Refusal::Protocol, "kind");
        assert_eq!(spoil(16, 5).unwrap_err(), Refusal::Protocol, "family");
        assert_eq!(
            spoil(40, 1).unwrap_err(),
            Refusal::Protocol,
            "IPv4 with more bytes"
        );
        assert_eq!(Message::decode(&bytes[1..]).unwrap_err(), Refusal::Protocol);

        // An IPv4-mapped address is its IPv4 device.
        let mapped: IpAddr = "::ffff:127.1.2.3".parse().unwrap();
        assert_eq!(socket_name(mapped), "rverbs-local/127.1.2.3");
        assert_eq!(socket_name(mapped), socket_name(v4));

        // Refusals as REFUSE carries them.
        for why in [
            Refusal::Protocol,
            Refusal::OtherUser { uid: 7 },
            Refusal::Io(Errno::ENOMEM),
        ] {
            let (reason, errno) = why.to_wire();
            assert_eq!(Refusal::from_wire(reason, errno, 7), why);
        }
    }

    #[test]
    fn the_cma_probe_checks_the_bytes_it_reads() {
        let me = std::process::id();
        let c = cookie();
        let at = c.as_ptr().addr() as u64;
        assert_eq!(probe_cma(me, at, c), Ok(()));
        let mut other = *c;
        other[0] ^= 1;
        assert_eq!(
            probe_cma(me, at, &other),
            Err(Errno::ESRCH),
            "another process's bytes"
        );
        assert_eq!(probe_cma(0, at, c), Err(Errno::ESRCH), "not visible here");
        assert_eq!(probe_cma(me, 0, c), Err(Errno::EFAULT));
    }
}
