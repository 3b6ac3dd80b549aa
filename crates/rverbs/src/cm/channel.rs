//! The event channel of the rdma_cm-style connection manager and its
//! events: what `rdma_create_event_channel` and `rdma_get_cm_event` give.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::id::CmId;
use crate::attr::Gid;
use crate::error::{Error, ErrorKind, Result, Verb};

/// What happened (`enum rdma_cm_event_type`, same order and values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CmEventKind {
    /// The destination address is resolved: the id has its device.
    AddrResolved,
    /// Address resolution failed.
    AddrError,
    /// The route is resolved: the id may connect.
    RouteResolved,
    /// Route resolution failed.
    RouteError,
    /// A peer asks to connect: the event's id is a new id to accept or
    /// reject, its `listen_id` the listener.
    ConnectRequest,
    /// The peer accepted, and the id has no QP to bring up: bring it up,
    /// then [`CmId::establish`].
    ConnectResponse,
    /// Connecting failed on this side (bringing the QP up).
    ConnectError,
    /// The peer did not answer: status `-ETIMEDOUT`; for UD, a resolution
    /// the peer refused: status the SIDR status.
    Unreachable,
    /// The peer rejected: status the IB CM reject reason (8: nobody
    /// listens on that port; 28: the peer's program rejected).
    Rejected,
    /// Connected (UD: the peer's QP is known, in the event's
    /// [`UdParam`]).
    Established,
    /// The connection is down (the peer disconnected, or this side did).
    Disconnected,
    /// The device went away.
    DeviceRemoval,
    /// A multicast group was joined.
    MulticastJoin,
    /// Joining a multicast group failed.
    MulticastError,
    /// The device's address changed.
    AddrChange,
    /// The connection's time-wait is over: its QP may be reused.
    TimewaitExit,
}

impl CmEventKind {
    /// The `rdma_cm_event_type` value.
    pub fn code(self) -> u32 {
        self as u32
    }
}

/// The connection parameters an event carries (`struct rdma_conn_param`
/// in the event): the peer's offer, in this side's view.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnEventParam {
    /// The peer's private data, at its message's full room (the wire
    /// carries no length: REQ 56 bytes after rdma_cm's header, REP 196,
    /// REJ 148, RTU 224, DREQ 220 …).
    pub private_data: Vec<u8>,
    /// RDMA READs/atomics this side may serve (the peer's initiator depth).
    pub responder_resources: u8,
    /// RDMA READs/atomics this side may have outstanding (the peer's
    /// responder resources).
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Transport retry count.
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// The peer's QP uses an SRQ.
    pub srq: bool,
    /// The peer's QP number.
    pub qp_num: u32,
}

/// The UD parameters an event carries (`struct rdma_ud_param`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdParam {
    /// The peer's private data, at its message's full room.
    pub private_data: Vec<u8>,
    /// Where the peer's QP is (the GID to address it by).
    pub remote_gid: Gid,
    /// The peer's QP number.
    pub qp_num: u32,
    /// Its Q_Key.
    pub qkey: u32,
}

/// An event's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventParam {
    /// None.
    None,
    /// A connection's (RC, UC).
    Conn(ConnEventParam),
    /// A UD id's.
    Ud(UdParam),
}

/// One connection manager event (`struct rdma_cm_event`).
#[derive(Debug, Clone)]
pub struct CmEvent {
    /// The id it is about (for a connection request, the new id).
    pub id: CmId,
    /// For a connection request, the listening id.
    pub listen_id: Option<CmId>,
    /// What happened.
    pub kind: CmEventKind,
    /// 0, an errno as a negative number, or a reject reason / SIDR status.
    pub status: i32,
    /// Its parameters.
    pub param: EventParam,
    /// For a connection request, the peer's address and port as its IP CM
    /// header tells.
    pub peer: Option<SocketAddr>,
}

/// The queue behind an [`EventChannel`]: its eventfd is readable while
/// events wait.
#[derive(Debug)]
pub(crate) struct ChannelCore {
    queue: Mutex<VecDeque<CmEvent>>,
    /// Its counter is non-zero exactly while events wait (so reading it
    /// never blocks the library, whatever the program set with `fcntl`).
    ready: EventFd,
}

impl ChannelCore {
    /// Queues an event.
    pub(crate) fn push(&self, event: CmEvent) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.is_empty() {
            let _ = self.ready.write(1);
        }
        q.push_back(event);
    }

    /// Takes the waiting events about `id` (as the id or the listener),
    /// in order, leaving the others.
    pub(crate) fn take_events_of(&self, id: &CmId) -> Vec<CmEvent> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let was = q.len();
        let (mine, rest): (VecDeque<_>, VecDeque<_>) = q
            .drain(..)
            .partition(|e| &e.id == id || e.listen_id.as_ref() == Some(id));
        *q = rest;
        if was > 0 && q.is_empty() {
            // Non-zero while events waited: reset, as `pop` does.
            let _ = self.ready.read();
        }
        mine.into()
    }

    fn pop(&self) -> Option<CmEvent> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let event = q.pop_front()?;
        if q.is_empty() {
            // The counter is non-zero (the push into the empty queue rang
            // it), so this read does not block. Reset while holding the
            // queue: a push after this rings again.
            let _ = self.ready.read();
        }
        Some(event)
    }
}

/// Where a connection manager's events arrive (`rdma_create_event_channel`):
/// pollable ([`AsFd`]: readable while events wait), blocking or not.
#[derive(Debug, Clone)]
pub struct EventChannel {
    pub(crate) core: Arc<ChannelCore>,
}

impl EventChannel {
    /// A new channel (blocking).
    pub fn new() -> Result<EventChannel> {
        let ready = EventFd::from_flags(EfdFlags::EFD_CLOEXEC)
            .map_err(|e| Error::from_errno(Verb::CreateEventChannel, e, "eventfd"))?;
        Ok(EventChannel {
            core: Arc::new(ChannelCore {
                queue: Mutex::new(VecDeque::new()),
                ready,
            }),
        })
    }

    /// Makes [`get_event`](Self::get_event) fail with EAGAIN instead of
    /// waiting: sets `O_NONBLOCK` on the channel's descriptor, as a C
    /// program does with `fcntl` (which this honours too).
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        let fd = self.core.ready.as_fd();
        let flags = fcntl(fd, FcntlArg::F_GETFL)
            .map_err(|e| Error::from_errno(Verb::GetCmEvent, e, "fcntl"))?;
        let mut flags = OFlag::from_bits_retain(flags);
        flags.set(OFlag::O_NONBLOCK, nonblocking);
        fcntl(fd, FcntlArg::F_SETFL(flags))
            .map_err(|e| Error::from_errno(Verb::GetCmEvent, e, "fcntl"))?;
        Ok(())
    }

    /// Whether the channel is non-blocking (its descriptor has
    /// `O_NONBLOCK`).
    pub fn is_nonblocking(&self) -> bool {
        fcntl(self.core.ready.as_fd(), FcntlArg::F_GETFL)
            .is_ok_and(|f| OFlag::from_bits_retain(f).contains(OFlag::O_NONBLOCK))
    }

    /// The next event (`rdma_get_cm_event`): waits for one, unless the
    /// channel is non-blocking (then EAGAIN when none waits).
    pub fn get_event(&self) -> Result<CmEvent> {
        if self.is_nonblocking() {
            return self.try_get_event().ok_or_else(|| {
                Error::new(
                    Verb::GetCmEvent,
                    ErrorKind::WouldBlock,
                    "no connection manager event is waiting",
                )
            });
        }
        loop {
            if let Some(event) = self.wait(None)? {
                return Ok(event);
            }
        }
    }

    /// The next event if one comes within `timeout`.
    pub fn get_event_timeout(&self, timeout: Duration) -> Result<Option<CmEvent>> {
        self.wait(Some(Instant::now() + timeout))
    }

    /// The next event, if one waits.
    pub fn try_get_event(&self) -> Option<CmEvent> {
        self.core.pop()
    }

    fn wait(&self, until: Option<Instant>) -> Result<Option<CmEvent>> {
        loop {
            if let Some(event) = self.core.pop() {
                return Ok(Some(event));
            }
            let timeout = match until {
                None => PollTimeout::NONE,
                Some(t) => {
                    let left = t.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX)
                }
            };
            let mut fds = [PollFd::new(self.core.ready.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, timeout) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(Error::from_errno(Verb::GetCmEvent, e, "poll")),
            }
        }
    }
}

impl AsFd for EventChannel {
    /// Readable while events wait.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.core.ready.as_fd()
    }
}
