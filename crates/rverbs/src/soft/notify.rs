//! Event queues behind real, pollable file descriptors: what completion
//! channels and a context's async events are made of.
//!
//! Events wait in a queue in memory. A `socketpair(AF_UNIX, SOCK_DGRAM)`
//! carries a one-byte *doorbell*: while the queue holds events, exactly one
//! doorbell is in the socket (or in the hands of the reader about to take an
//! event), so the user's descriptor polls readable exactly when an event is
//! pending. A reader takes the doorbell, then pops under the lock, and rings
//! again if events remain. A socket, not an eventfd or pipe, because `recv`
//! takes `MSG_DONTWAIT` per call: the timed and non-blocking reads never
//! block, whatever flags the user set on the descriptor, while the plain read
//! honours the user's `O_NONBLOCK` exactly as `read(channel->fd)` does in
//! libibverbs.
//!
//! After [`EventQueue::close`] (device disassociation) events already queued
//! are still delivered; then every read fails with [`PopError::Closed`] (EIO)
//! and the descriptor stays readable so no one sleeps forever.

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recv, send, socketpair, AddressFamily, MsgFlags, SockFlag, SockType};

/// How long a read may wait for an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Block, unless the user made the descriptor non-blocking; then a read
    /// with nothing pending fails with `WouldBlock`.
    Block,
    /// Wait until this instant (`None`: for ever), whatever the descriptor's flags.
    Until(Option<Instant>),
    /// Do not wait.
    Poll,
}

impl Wait {
    /// Wait at most `timeout` (a timeout too large to represent waits for ever).
    pub(crate) fn timeout(timeout: Duration) -> Wait {
        Wait::Until(Instant::now().checked_add(timeout))
    }
}

/// Why a read returned no event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PopError {
    /// `Wait::Block` on a descriptor the user set `O_NONBLOCK` on, with nothing pending.
    WouldBlock,
    /// The queue was closed (device gone) and is empty.
    Closed,
    /// The socket failed.
    Os(Errno),
}

struct State<T> {
    items: VecDeque<T>,
    /// A doorbell byte is in the socket, or taken by a reader that has not yet locked.
    doorbell: bool,
    closed: bool,
}

/// A queue of events with a pollable descriptor.
pub(crate) struct EventQueue<T> {
    reader: OwnedFd,
    writer: OwnedFd,
    state: Mutex<State<T>>,
}

impl<T> EventQueue<T> {
    /// A new, empty queue (two descriptors, close-on-exec).
    pub(crate) fn new() -> nix::Result<Self> {
        let (reader, writer) = socketpair(
            AddressFamily::Unix,
            SockType::Datagram,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        Ok(EventQueue {
            reader,
            writer,
            state: Mutex::new(State {
                items: VecDeque::new(),
                doorbell: false,
                closed: false,
            }),
        })
    }

    /// The descriptor users poll and may set `O_NONBLOCK` on.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.reader.as_fd()
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Every update of State is complete before any call that could panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ring(&self, st: &mut State<T>) {
        if st.doorbell {
            return;
        }
        // One byte, never more than one in flight: cannot fill the socket.
        match send(self.writer.as_raw_fd(), &[1], MsgFlags::MSG_DONTWAIT) {
            Ok(_) => st.doorbell = true,
            Err(e) => warn_once!("event queue doorbell failed: {e}"),
        }
    }

    /// Queues an event and makes the descriptor readable.
    pub(crate) fn push(&self, item: T) {
        let mut st = self.lock();
        st.items.push_back(item);
        self.ring(&mut st);
    }

    /// Drops queued events for which `keep` is false (their object is gone).
    pub(crate) fn retain(&self, keep: impl FnMut(&T) -> bool) {
        let mut st = self.lock();
        st.items.retain(keep);
        if st.items.is_empty() && st.doorbell && !st.closed {
            let mut b = [0u8; 1];
            // If a reader took the byte already it will find the queue empty itself.
            if recv(self.reader.as_raw_fd(), &mut b, MsgFlags::MSG_DONTWAIT).is_ok() {
                st.doorbell = false;
            }
        }
    }

    /// Runs `f` under the queue's lock: a reader's `accept` cannot run
    /// meanwhile.
    pub(crate) fn locked<R>(&self, f: impl FnOnce() -> R) -> R {
        let _st = self.lock();
        f()
    }

    /// Number of events waiting.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// Ends the queue: queued events are still delivered, then reads fail with
    /// `Closed`; every waiter wakes.
    pub(crate) fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        self.ring(&mut st);
    }

    /// Takes the next event `accept` turns into a result, waiting as `wait`
    /// says; `Ok(None)` when none came in time (never for `Wait::Block`).
    /// `accept` runs under the queue lock and may reject a stale event (its
    /// object was destroyed) by returning `None`; the read then goes on to the
    /// next one.
    pub(crate) fn pop_with<R>(
        &self,
        wait: Wait,
        mut accept: impl FnMut(T) -> Option<R>,
    ) -> Result<Option<R>, PopError> {
        loop {
            if !self.take_doorbell(wait)? {
                return Ok(None);
            }
            let mut st = self.lock();
            st.doorbell = false;
            let mut got = None;
            while let Some(item) = st.items.pop_front() {
                if let Some(r) = accept(item) {
                    got = Some(r);
                    break;
                }
            }
            if !st.items.is_empty() || st.closed {
                self.ring(&mut st);
            }
            match got {
                Some(r) => return Ok(Some(r)),
                None if st.closed => return Err(PopError::Closed),
                // Only stale events were queued: wait for the next doorbell.
                None => continue,
            }
        }
    }

    /// Takes the doorbell byte. `Ok(false)`: none came within `wait`; a
    /// blocking wait interrupted by a signal is `Os(EINTR)`.
    fn take_doorbell(&self, wait: Wait) -> Result<bool, PopError> {
        let fd = self.reader.as_raw_fd();
        let mut b = [0u8; 1];
        let flags = match wait {
            Wait::Block => MsgFlags::empty(),
            Wait::Until(_) | Wait::Poll => MsgFlags::MSG_DONTWAIT,
        };
        loop {
            let deadline = match (recv(fd, &mut b, flags), wait) {
                (Ok(_), _) => return Ok(true),
                // A blocking wait a signal interrupts says so, as a
                // read(2) of the kernel's channel fd does (only a handler
                // without SA_RESTART lets the call see it): a program's
                // timer can end its wait (qperf's end-of-test alarm).
                (Err(Errno::EINTR), Wait::Block) => return Err(PopError::Os(Errno::EINTR)),
                (Err(Errno::EINTR), _) => continue,
                (Err(Errno::EAGAIN), Wait::Block) => return Err(PopError::WouldBlock),
                (Err(Errno::EAGAIN), Wait::Poll) => return Ok(false),
                (Err(Errno::EAGAIN), Wait::Until(deadline)) => deadline,
                (Err(e), _) => return Err(PopError::Os(e)),
            };
            let timeout = match deadline {
                None => PollTimeout::NONE,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(false);
                    }
                    // Round up so a sub-millisecond wait still sleeps; long
                    // waits poll in 65 s steps.
                    PollTimeout::from(
                        u16::try_from(left.as_micros().div_ceil(1000)).unwrap_or(u16::MAX),
                    )
                }
            };
            let mut fds = [PollFd::new(self.reader.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(e) => return Err(PopError::Os(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    use std::sync::Arc;

    fn readable(q: &EventQueue<u32>) -> bool {
        let mut fds = [PollFd::new(q.fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::ZERO).unwrap() == 1
    }

    #[test]
    fn readable_exactly_while_events_wait() {
        let q = EventQueue::new().unwrap();
        assert!(!readable(&q));
        q.push(1);
        q.push(2);
        assert!(readable(&q));
        assert_eq!(q.pop_with(Wait::Block, Some), Ok(Some(1)));
        assert!(readable(&q));
        assert_eq!(q.pop_with(Wait::Poll, Some), Ok(Some(2)));
        assert!(!readable(&q));
        assert_eq!(q.pop_with(Wait::Poll, Some), Ok(None));
    }

    #[test]
    fn user_nonblocking_flag_makes_block_return_would_block() {
        let q: EventQueue<u32> = EventQueue::new().unwrap();
        let fl = OFlag::from_bits_truncate(fcntl(q.fd(), FcntlArg::F_GETFL).unwrap());
        fcntl(q.fd(), FcntlArg::F_SETFL(fl | OFlag::O_NONBLOCK)).unwrap();
        assert_eq!(q.pop_with(Wait::Block, Some), Err(PopError::WouldBlock));
        q.push(7);
        assert_eq!(q.pop_with(Wait::Block, Some), Ok(Some(7)));
    }

    #[test]
    fn timeout_expires_and_wakes_on_push() {
        let q = Arc::new(EventQueue::new().unwrap());
        let t0 = Instant::now();
        assert_eq!(
            q.pop_with(Wait::timeout(Duration::from_millis(30)), Some),
            Ok(None)
        );
        assert!(t0.elapsed() >= Duration::from_millis(30));
        let q2 = q.clone();
        let h =
            std::thread::spawn(move || q2.pop_with(Wait::timeout(Duration::from_secs(30)), Some));
        std::thread::sleep(Duration::from_millis(20));
        q.push(9u32);
        assert_eq!(h.join().unwrap(), Ok(Some(9)));
    }

    #[test]
    fn stale_events_are_skipped_and_retain_clears_the_doorbell() {
        let q = EventQueue::new().unwrap();
        q.push(1u32);
        q.push(2);
        q.push(3);
        // accept rejects odd numbers: 1 is skipped, 2 delivered.
        assert_eq!(
            q.pop_with(Wait::Poll, |v| (v % 2 == 0).then_some(v)),
            Ok(Some(2))
        );
        q.retain(|&v| v != 3);
        assert_eq!(q.len(), 0);
        assert!(!readable(&q));
    }

    #[test]
    fn close_drains_then_fails_and_wakes_blocked_readers() {
        let q = Arc::new(EventQueue::new().unwrap());
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let q = q.clone();
                std::thread::spawn(move || q.pop_with(Wait::Block, Some))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        q.push(5u32);
        q.close();
        let mut results: Vec<_> = readers.into_iter().map(|h| h.join().unwrap()).collect();
        results.sort_by_key(|r| format!("{r:?}"));
        assert_eq!(
            results,
            vec![Err(PopError::Closed), Err(PopError::Closed), Ok(Some(5))]
        );
        assert!(readable(&q), "a closed queue stays readable");
        assert_eq!(q.pop_with(Wait::Poll, Some), Err(PopError::Closed));
    }

    #[test]
    fn huge_timeouts_wait_for_ever_without_overflow() {
        let q = Arc::new(EventQueue::new().unwrap());
        let q2 = q.clone();
        let h = std::thread::spawn(move || q2.pop_with(Wait::timeout(Duration::MAX), Some));
        std::thread::sleep(Duration::from_millis(20));
        q.push(3u32);
        assert_eq!(h.join().unwrap(), Ok(Some(3)));
        assert_eq!(Wait::timeout(Duration::MAX), Wait::Until(None));
    }

    #[test]
    fn many_threads_each_event_once() {
        use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
        let q = Arc::new(EventQueue::new().unwrap());
        let n = 2000u32;
        let taken = Arc::new(AtomicU32::new(0));
        let consumers: Vec<_> = (0..4)
            .map(|_| {
                let (q, taken) = (q.clone(), taken.clone());
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    // Until every event is taken by someone.
                    while taken.load(SeqCst) < n {
                        match q.pop_with(Wait::timeout(Duration::from_millis(20)), Some) {
                            Ok(Some(v)) => {
                                taken.fetch_add(1, SeqCst);
                                got.push(v);
                            }
                            Ok(None) => {}
                            Err(e) => panic!("{e:?}"),
                        }
                    }
                    got
                })
            })
            .collect();
        let producers: Vec<_> = (0..2)
            .map(|p| {
                let q = q.clone();
                std::thread::spawn(move || {
                    for i in 0..n / 2 {
                        q.push(p * (n / 2) + i);
                    }
                })
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        let mut all: Vec<u32> = consumers
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..n).collect::<Vec<_>>());
    }
}
