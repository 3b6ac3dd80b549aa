//! Completion channels, CQs and rdma_cm event channels awaited on tokio
//! (the `tokio` cargo feature).
//!
//! This module owns the glue between rverbs' pollable descriptors and
//! tokio's reactor ([`AsyncFd`]); it adds no new verbs:
//!
//! - [`AsyncCompletionChannel`]: `await` the next [`CqEvent`] of a
//!   [`CompletionChannel`] (`ibv_get_cq_event` without blocking a worker
//!   thread). For a channel several CQs share: the event names its CQ.
//! - [`AsyncCompletionQueue`]: a CQ with a channel of its own, whose
//!   [`next_completions`](AsyncCompletionQueue::next_completions) returns
//!   the next completions, waiting for them without spinning. It loops over
//!   the race-free pattern of libibverbs programs: arm
//!   ([`CompletionQueue::req_notify`]), poll, and only if the CQ is empty
//!   await the channel's event and acknowledge it; then again.
//! - [`CompletionStream`]: the same CQ as a [`Stream`](futures_core::Stream)
//!   of single completions, in the order the CQ holds them.
//! - [`AsyncEventChannel`]: `await` the next rdma_cm event
//!   ([`EventChannel`]).
//!
//! ```no_run
//! # async fn demo() -> rverbs::Result<()> {
//! use rverbs::tokio::AsyncCompletionQueue;
//! use rverbs::WorkCompletion;
//!
//! let ctx = rverbs::devices()?[0].open()?;
//! let mut cq = AsyncCompletionQueue::create(&ctx, 256)?;
//! let pd = ctx.alloc_pd()?;
//! let qp = pd.qp_builder(cq.cq(), cq.cq()).build()?;
//! // … connect the QP, post work …
//! let mut wc = [WorkCompletion::default(); 16];
//! let n = cq.next_completions(&mut wc).await?; // at least one
//! # let _ = (qp, n); Ok(()) }
//! ```
//!
//! Every future here is cancel-safe: an event or a completion is taken
//! from the device only in the poll that returns it, so dropping a future
//! (a `select!` branch that lost, a timeout) loses nothing; the next call
//! finds what the dropped one would have.
//!
//! The descriptors are read without blocking whatever their flags (the
//! `try_*` reads), so nothing here sets `O_NONBLOCK`: a program may still
//! use the blocking reads of the same channel from a thread of its own.
//! Creating any of these types registers a duplicate of the descriptor
//! with the reactor of the current tokio runtime, so it must be called
//! from within a runtime that has IO enabled, or it panics, as tokio does.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::task::{ready, Context as TaskContext, Poll};

use ::tokio::io::unix::AsyncFd;
use ::tokio::io::Interest;

use crate::cm::{CmEvent, EventChannel};
use crate::error::{Error, Result, Verb};
use crate::verbs::channel::{CompletionChannel, CqEvent};
use crate::verbs::context::Context;
use crate::verbs::cq::CompletionQueue;
use crate::wc::WorkCompletion;

/// Registers a duplicate of `fd` with the current runtime's reactor, for
/// readability.
fn register_readable(fd: BorrowedFd<'_>, verb: Verb) -> Result<AsyncFd<OwnedFd>> {
    let owned = fd
        .try_clone_to_owned()
        .map_err(|e| Error::from_io(verb, &e, "duplicating the channel's descriptor"))?;
    // SAFETY: `register_with_interest` needs the descriptor to stay open,
    // and to be the same one, for as long as the `AsyncFd` holds it. An
    // `OwnedFd` is exactly that: this duplicate belongs to the `AsyncFd`
    // alone, nothing else can close it, and it is closed only when the
    // `AsyncFd` (which deregisters first) drops it.
    unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE) }.map_err(|e| {
        let (_, err) = e.into_parts();
        Error::from_io(verb, &err, "registering with tokio's reactor")
    })
}

/// A [`CompletionChannel`] whose events are awaited.
///
/// The channel stays usable through [`get_ref`](Self::get_ref) (for
/// example to build CQs on it). Several tasks may await the same channel;
/// each event goes to one of them.
#[derive(Debug)]
pub struct AsyncCompletionChannel {
    channel: CompletionChannel,
    fd: AsyncFd<OwnedFd>,
}

impl AsyncCompletionChannel {
    /// Wraps `channel`. Must run within a tokio runtime with IO enabled
    /// (else it panics, as tokio does); fails if the descriptor cannot be
    /// duplicated or registered.
    pub fn new(channel: CompletionChannel) -> Result<AsyncCompletionChannel> {
        let fd = register_readable(channel.as_fd(), Verb::GetCqEvent)?;
        Ok(AsyncCompletionChannel { channel, fd })
    }

    /// The channel.
    pub fn get_ref(&self) -> &CompletionChannel {
        &self.channel
    }

    /// The channel back, no longer registered with the reactor.
    pub fn into_inner(self) -> CompletionChannel {
        self.channel
    }

    /// The next completion event (`ibv_get_cq_event`), waiting without
    /// blocking the thread. Dropping the event acknowledges it. After the
    /// device was disassociated and pending events were read, it fails
    /// with EIO. Cancel-safe.
    pub async fn get_cq_event(&self) -> Result<CqEvent> {
        loop {
            let mut guard = self
                .fd
                .readable()
                .await
                .map_err(|e| Error::from_io(Verb::GetCqEvent, &e, "waiting for the channel"))?;
            if let Some(event) = self.channel.try_get_cq_event()? {
                return Ok(event);
            }
            // Nothing pending (another task took it): wait for the next
            // doorbell. Readiness that came after `readable` returned is
            // kept, so no event slips between the read and this.
            guard.clear_ready();
        }
    }

    /// The next event if one is pending, else registers `cx` to be woken
    /// when one may be. For a single poller (it keeps only the latest
    /// waker); tasks sharing the channel use
    /// [`get_cq_event`](Self::get_cq_event).
    pub fn poll_get_cq_event(&self, cx: &mut TaskContext<'_>) -> Poll<Result<CqEvent>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))
                .map_err(|e| Error::from_io(Verb::GetCqEvent, &e, "waiting for the channel"))?;
            if let Some(event) = self.channel.try_get_cq_event()? {
                return Poll::Ready(Ok(event));
            }
            guard.clear_ready();
        }
    }
}

/// A completion queue whose completions are awaited: a CQ with a
/// completion channel of its own.
///
/// The channel must serve this CQ alone, so that no other CQ's reader can
/// take (and acknowledge) its events; [`create`](Self::create) makes both,
/// [`new`](Self::new) checks it. Build QPs on [`cq`](Self::cq).
/// [`next_completions`](Self::next_completions) takes `&mut self`: one
/// task waits on a CQ at a time, so completions left in the CQ by one
/// caller are never stranded behind another caller's wait.
#[derive(Debug)]
pub struct AsyncCompletionQueue {
    cq: CompletionQueue,
    channel: AsyncCompletionChannel,
}

impl AsyncCompletionQueue {
    /// A new CQ of at least `cqe` entries in `ctx`, on a new completion
    /// channel of its own. Must run within a tokio runtime with IO enabled.
    pub fn create(ctx: &Context, cqe: u32) -> Result<AsyncCompletionQueue> {
        let channel = ctx.create_comp_channel()?;
        let cq = ctx.cq_builder().cqe(cqe).channel(&channel).build()?;
        AsyncCompletionQueue::new(cq, channel)
    }

    /// Awaits `cq` through `channel`: EINVAL unless `cq` was built on
    /// `channel` and no other CQ uses it. Must run within a tokio runtime
    /// with IO enabled.
    pub fn new(cq: CompletionQueue, channel: CompletionChannel) -> Result<AsyncCompletionQueue> {
        let verb = Verb::ReqNotifyCq;
        let ours = cq
            .core
            .channel
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, &channel.core));
        if !ours {
            return Err(Error::invalid(
                verb,
                format!(
                    "CQ {} was not created on completion channel {}",
                    cq.handle(),
                    channel.handle()
                ),
            ));
        }
        let users = channel.cq_count();
        if users != 1 {
            return Err(Error::invalid(
                verb,
                format!(
                    "completion channel {} serves {users} CQs; an AsyncCompletionQueue needs \
                     one of its own",
                    channel.handle()
                ),
            ));
        }
        Ok(AsyncCompletionQueue {
            cq,
            channel: AsyncCompletionChannel::new(channel)?,
        })
    }

    /// The CQ: to build QPs on, or poll without waiting.
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// The CQ and its channel back (the CQ may be left armed).
    pub fn into_parts(self) -> (CompletionQueue, CompletionChannel) {
        (self.cq, self.channel.into_inner())
    }

    /// Moves at least one and up to `wc.len()` completions, oldest first,
    /// into `wc` and returns how many, waiting for the first without
    /// spinning. An empty `wc` returns 0 at once. Errors are those of
    /// [`CompletionQueue::req_notify`], [`CompletionQueue::poll`] and
    /// [`CompletionChannel::try_get_cq_event`] (EIO once the device is
    /// gone). Cancel-safe: completions leave the CQ only in the poll that
    /// returns them.
    pub async fn next_completions(&mut self, wc: &mut [WorkCompletion]) -> Result<usize> {
        std::future::poll_fn(|cx| self.poll_next_completions(cx, wc)).await
    }

    /// [`next_completions`](Self::next_completions) as a poll: `Ready`
    /// with the completions moved into `wc`, or `Pending` with `cx`
    /// registered to be woken when the CQ's event may have come.
    pub fn poll_next_completions(
        &mut self,
        cx: &mut TaskContext<'_>,
        wc: &mut [WorkCompletion],
    ) -> Poll<Result<usize>> {
        if wc.is_empty() {
            return Poll::Ready(Ok(0));
        }
        loop {
            // Armed before polling: a completion that lands after this
            // poll fires an event, so the wait below cannot miss it. An
            // armed poll also never parks the thread (the CQ's poller is
            // not busy-polling), so no tokio worker sleeps in it.
            self.cq.req_notify(false)?;
            let n = self.cq.poll(wc)?;
            if n > 0 {
                return Poll::Ready(Ok(n));
            }
            // Empty and armed: wait for the event, acknowledge it (drop),
            // and look again. An event left over from an earlier arming
            // only costs one more empty poll.
            drop(ready!(self.channel.poll_get_cq_event(cx))?);
        }
    }

    /// The CQ as a stream of single completions.
    pub fn into_stream(self) -> CompletionStream {
        CompletionStream::new(self)
    }
}

/// How many completions a [`CompletionStream`] takes from its CQ at once.
const STREAM_BATCH: usize = 16;

/// A CQ as a [`Stream`](futures_core::Stream) of its completions, each
/// once, in the CQ's order.
///
/// It takes up to 16 completions from the CQ at a time and hands them out
/// one by one; those taken but not yet handed out are returned by
/// [`into_inner`](Self::into_inner) (dropping the stream drops them). After
/// an error it yields that error, then ends.
#[derive(Debug)]
pub struct CompletionStream {
    queue: AsyncCompletionQueue,
    batch: [WorkCompletion; STREAM_BATCH],
    next: usize,
    len: usize,
    ended: bool,
}

impl CompletionStream {
    /// The stream of `queue`'s completions.
    pub fn new(queue: AsyncCompletionQueue) -> CompletionStream {
        CompletionStream {
            queue,
            batch: [WorkCompletion::default(); STREAM_BATCH],
            next: 0,
            len: 0,
            ended: false,
        }
    }

    /// The CQ.
    pub fn cq(&self) -> &CompletionQueue {
        self.queue.cq()
    }

    /// The queue back, with the completions taken from the CQ that the
    /// stream has not yet yielded (oldest first).
    pub fn into_inner(self) -> (AsyncCompletionQueue, Vec<WorkCompletion>) {
        let pending = self.batch[self.next..self.len].to_vec();
        (self.queue, pending)
    }

    /// The next completion (`None` after an error was yielded), without
    /// needing a stream combinator crate. Cancel-safe.
    pub async fn next(&mut self) -> Option<Result<WorkCompletion>> {
        std::future::poll_fn(|cx| self.poll_next_completion(cx)).await
    }

    fn poll_next_completion(
        &mut self,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<WorkCompletion>>> {
        if self.next < self.len {
            let wc = self.batch[self.next];
            self.next += 1;
            return Poll::Ready(Some(Ok(wc)));
        }
        if self.ended {
            return Poll::Ready(None);
        }
        match ready!(self.queue.poll_next_completions(cx, &mut self.batch)) {
            Ok(n) => {
                self.next = 1;
                self.len = n;
                Poll::Ready(Some(Ok(self.batch[0])))
            }
            Err(e) => {
                self.ended = true;
                Poll::Ready(Some(Err(e)))
            }
        }
    }
}

impl futures_core::Stream for CompletionStream {
    type Item = Result<WorkCompletion>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_next_completion(cx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let buffered = self.len - self.next;
        (buffered, if self.ended { Some(buffered) } else { None })
    }
}

impl futures_core::FusedStream for CompletionStream {
    fn is_terminated(&self) -> bool {
        self.ended && self.next == self.len
    }
}

/// An rdma_cm [`EventChannel`] whose events are awaited.
///
/// Keep a clone of the channel (it is a handle) to create ids on; several
/// tasks may await the same `AsyncEventChannel`, each event going to one.
#[derive(Debug)]
pub struct AsyncEventChannel {
    channel: EventChannel,
    fd: AsyncFd<OwnedFd>,
}

impl AsyncEventChannel {
    /// Awaits the events of `channel` (a clone of the handle is enough).
    /// Must run within a tokio runtime with IO enabled.
    pub fn new(channel: EventChannel) -> Result<AsyncEventChannel> {
        let fd = register_readable(channel.as_fd(), Verb::GetCmEvent)?;
        Ok(AsyncEventChannel { channel, fd })
    }

    /// The channel.
    pub fn get_ref(&self) -> &EventChannel {
        &self.channel
    }

    /// The next event (`rdma_get_cm_event`), waiting without blocking the
    /// thread. Cancel-safe.
    pub async fn get_event(&self) -> Result<CmEvent> {
        loop {
            let mut guard = self
                .fd
                .readable()
                .await
                .map_err(|e| Error::from_io(Verb::GetCmEvent, &e, "waiting for the channel"))?;
            if let Some(event) = self.channel.try_get_event() {
                return Ok(event);
            }
            guard.clear_ready();
        }
    }
}
