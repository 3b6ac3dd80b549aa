//! Completion channels (`ibv_create_comp_channel`, `ibv_get_cq_event`,
//! `ibv_ack_cq_events`, `ibv_destroy_comp_channel`).
//!
//! A completion channel is a file descriptor that delivers completion
//! notifications: when a CQ created on the channel has been armed with
//! [`CompletionQueue::req_notify`] and a completion arrives, the CQ is queued
//! on the channel and the descriptor polls readable. Several channels let a
//! program steer the events of different CQs to different threads.
//!
//! Each [`CqEvent`] must be acknowledged before its CQ can be destroyed. The
//! event acknowledges itself when dropped, so this cannot be forgotten; and
//! destroying a CQ with an event still held fails with EBUSY rather than
//! waiting for it as libibverbs does, so it cannot deadlock.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, ErrorKind, Rejected, Result, Verb};
use crate::soft::channel::ChannelCore;
use crate::soft::context::ContextCore;
use crate::soft::cq::CqCore;
use crate::soft::notify::{PopError, Wait};
use crate::verbs::cq::CompletionQueue;

/// A completion event channel.
///
/// Its descriptor ([`AsFd`]) is real: `poll(2)` it, hand it to an event loop,
/// or set `O_NONBLOCK` on it so that [`get_cq_event`](Self::get_cq_event)
/// returns a `WouldBlock` error instead of blocking when nothing is pending.
///
/// Clones are handles to one channel, for a thread that waits on it while
/// another may destroy it: [`destroy`](Self::destroy) through any handle ends
/// the channel as a verbs object (its context no longer counts it and no CQ
/// can be created on it), a handle still waiting goes on waiting as a `read`
/// of libibverbs' descriptor does, and the descriptor closes when the last
/// handle drops.
#[derive(Clone)]
pub struct CompletionChannel {
    pub(crate) core: Arc<ChannelCore>,
}

impl CompletionChannel {
    pub(crate) fn create(ctx: &Arc<ContextCore>) -> Result<CompletionChannel> {
        Ok(CompletionChannel {
            core: ChannelCore::create(ctx)?,
        })
    }

    /// The channel's handle (unique on the device).
    pub fn handle(&self) -> u64 {
        self.core.handle
    }

    /// CQs attached to the channel (libibverbs' `refcnt`).
    pub fn cq_count(&self) -> u32 {
        self.core.cq_count()
    }

    fn pop(&self, wait: Wait) -> Result<Option<CqEvent>> {
        let verb = Verb::GetCqEvent;
        self.core
            .queue
            .pop_with(wait, |weak| {
                // A CQ destroyed since it fired: its event went with it.
                let cq = weak.upgrade().filter(|cq| !cq.is_released())?;
                cq.comp_events.report();
                Some(CqEvent { cq })
            })
            .map_err(|e| match e {
                PopError::WouldBlock => Error::new(
                    verb,
                    ErrorKind::WouldBlock,
                    "no completion event pending and the channel is non-blocking",
                ),
                PopError::Closed => Error::new(
                    verb,
                    ErrorKind::Io,
                    format!("device {} was disassociated", self.core.ctx.device.name),
                ),
                PopError::Os(errno) => Error::from_errno(verb, errno, "reading channel fd"),
            })
    }

    /// Waits for the next completion event (`ibv_get_cq_event`). Blocks
    /// unless the user set `O_NONBLOCK` on the descriptor; then, with nothing
    /// pending, it returns a `WouldBlock` error (EAGAIN). After the device was
    /// disassociated and pending events were read, it returns EIO.
    pub fn get_cq_event(&self) -> Result<CqEvent> {
        self.pop(Wait::Block)?.ok_or_else(|| {
            Error::new(
                Verb::GetCqEvent,
                ErrorKind::WouldBlock,
                "no completion event pending",
            )
        })
    }

    /// Waits at most `timeout` for the next completion event.
    pub fn get_cq_event_timeout(&self, timeout: Duration) -> Result<Option<CqEvent>> {
        self.pop(Wait::timeout(timeout))
    }

    /// The next completion event if one is pending, without waiting.
    pub fn try_get_cq_event(&self) -> Result<Option<CqEvent>> {
        self.pop(Wait::Poll)
    }

    /// Destroys the channel (`ibv_destroy_comp_channel`). Fails with EBUSY
    /// while any CQ still uses it, and with EINVAL if it was destroyed
    /// already (through another clone), handing the channel back
    /// unchanged. As in libibverbs this involves no device command, so it
    /// behaves the same after a disassociation (never EIO; still EBUSY while
    /// CQs use it). A CQ being created on the channel meanwhile either
    /// counts (EBUSY) or is refused (EINVAL).
    ///
    /// Dropping a handle without destroying it releases the channel only
    /// when it is the last: until then its context counts it.
    pub fn destroy(self) -> Result<(), Rejected<CompletionChannel>> {
        let err = match self.core.try_release() {
            Ok(()) => return Ok(()),
            Err(Some(n)) => Error::busy(
                Verb::DestroyCompChannel,
                format!(
                    "{n} CQ{} still use completion channel {}",
                    if n == 1 { "" } else { "s" },
                    self.core.handle
                ),
            ),
            Err(None) => Error::invalid(
                Verb::DestroyCompChannel,
                format!(
                    "completion channel {} was destroyed already",
                    self.core.handle
                ),
            ),
        };
        Err(Rejected::new(err, self))
    }
}

impl AsFd for CompletionChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.core.queue.fd()
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.core.queue.fd().as_raw_fd()
    }
}

impl fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionChannel")
            .field("handle", &self.core.handle)
            .field("fd", &self.as_raw_fd())
            .field("cqs", &self.core.cq_count())
            .finish()
    }
}

/// A completion event: the CQ whose armed notification fired. Dropping it
/// acknowledges it (`ibv_ack_cq_events`); the CQ cannot be destroyed while
/// it is held.
pub struct CqEvent {
    cq: Arc<CqCore>,
}

impl CqEvent {
    /// Whether the event is for `cq`.
    pub fn is_for(&self, cq: &CompletionQueue) -> bool {
        Arc::ptr_eq(&self.cq, &cq.core)
    }

    /// The handle of the CQ that fired.
    pub fn cq_handle(&self) -> u64 {
        self.cq.handle
    }

    /// The user data (`cq_context`) the CQ was created with.
    pub fn user_data(&self) -> u64 {
        self.cq.user_data
    }

    /// Acknowledges the event now (the same as dropping it).
    pub fn ack(self) {}
}

impl Drop for CqEvent {
    fn drop(&mut self) {
        self.cq.comp_events.ack();
    }
}

impl fmt::Debug for CqEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqEvent")
            .field("cq", &self.cq.handle)
            .field("user_data", &self.cq.user_data)
            .finish()
    }
}
