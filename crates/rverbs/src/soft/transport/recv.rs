//! Receive queues: a QP's own, or a shared receive queue (SRQ) that many
//! QPs take receive WRs from, with its armed limit (`srq_limit`).
//!
//! An SRQ's queue sits behind its own small lock, taken inside the engine
//! lock when a QP consumes a WR and alone when the application posts one,
//! so posting to an SRQ never waits for the engine.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{QpEvent, RecvWqe};
use crate::event::AsyncEventType;
use crate::wc::WorkCompletion;

/// The state of a shared receive queue.
#[derive(Debug)]
pub(crate) struct SrqState {
    /// Posted receive WRs, oldest first.
    pub(crate) wqes: VecDeque<RecvWqe>,
    /// Most WRs the queue holds (`max_wr`).
    pub(crate) max_wr: u32,
    /// Armed limit (`srq_limit`, 0 = not armed): once fewer WRs than this
    /// remain, SRQ_LIMIT_REACHED is raised once and the limit disarms.
    pub(crate) limit: u32,
    /// WRs QPs took and kept for their next message after abandoning one
    /// (UC): they count against `max_wr` until used or given back. (A WR
    /// frees its slot when a message takes it, so the application may have
    /// refilled the queue meanwhile: then the SRQ is over `max_wr` by the
    /// kept WRs for a while, and refuses posts until it is back within.)
    pub(crate) held: u32,
}

impl SrqState {
    /// WRs the SRQ answers for: queued, or kept by a QP.
    pub(crate) fn occupied(&self) -> usize {
        self.wqes.len() + self.held as usize
    }
}

/// A shared receive queue as QPs see it (cloned into each QP using it).
#[derive(Debug, Clone)]
pub(crate) struct SharedRq(Arc<Mutex<SrqState>>);

impl SharedRq {
    /// An empty queue.
    pub(crate) fn new(max_wr: u32, limit: u32) -> SharedRq {
        SharedRq(Arc::new(Mutex::new(SrqState {
            wqes: VecDeque::new(),
            max_wr,
            limit,
            held: 0,
        })))
    }

    /// The queue, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, SrqState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the oldest WR. The flag says this took the queue below its
    /// armed limit (which is now disarmed).
    pub(crate) fn take(&self) -> (Option<RecvWqe>, bool) {
        let mut q = self.lock();
        let wqe = q.wqes.pop_front();
        let fired = wqe.is_some() && q.limit > 0 && (q.wqes.len() as u64) < u64::from(q.limit);
        if fired {
            q.limit = 0;
        }
        (wqe, fired)
    }
}

/// Where a QP's receive WRs come from.
#[derive(Debug)]
pub(crate) enum RecvQueue {
    /// The QP's own queue.
    Own(VecDeque<RecvWqe>),
    /// A shared receive queue, and a WR this QP took from it for a message
    /// it then abandoned (UC after a loss): the QP's next message takes it.
    /// It stays out of the SRQ, so the SRQ never holds more than `max_wr`.
    Shared(SharedRq, Option<RecvWqe>),
}

impl RecvQueue {
    /// A queue of the QP's own, or the SRQ given.
    pub(crate) fn new(srq: Option<SharedRq>) -> RecvQueue {
        match srq {
            Some(s) => RecvQueue::Shared(s, None),
            None => RecvQueue::Own(VecDeque::new()),
        }
    }

    /// Takes the next receive WR; an SRQ falling below its limit queues
    /// [`QpEvent::SrqLimitReached`] into `events`.
    pub(crate) fn pop(&mut self, events: &mut VecDeque<QpEvent>) -> Option<RecvWqe> {
        match self {
            RecvQueue::Own(q) => q.pop_front(),
            RecvQueue::Shared(s, held) => {
                if let Some(wqe) = held.take() {
                    let mut q = s.lock();
                    q.held = q.held.saturating_sub(1);
                    return Some(wqe);
                }
                let (wqe, fired) = s.take();
                if fired {
                    events.push_back(QpEvent::SrqLimitReached);
                }
                wqe
            }
        }
    }

    /// Returns a WR taken for a message that was then abandoned (UC after
    /// a loss): it takes the next message instead.
    pub(crate) fn put_back(&mut self, wqe: RecvWqe) {
        match self {
            RecvQueue::Own(q) => q.push_front(wqe),
            RecvQueue::Shared(s, held) => {
                if held.replace(wqe).is_none() {
                    s.lock().held += 1;
                }
            }
        }
    }

    /// Whether no receive WR is waiting.
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            RecvQueue::Own(q) => q.is_empty(),
            RecvQueue::Shared(s, held) => held.is_none() && s.lock().wqes.is_empty(),
        }
    }

    /// WRs in the QP's own queue (0 on an SRQ).
    pub(crate) fn own_len(&self) -> usize {
        match self {
            RecvQueue::Own(q) => q.len(),
            RecvQueue::Shared(..) => 0,
        }
    }

    /// Posts to the QP's own queue (the verbs refuse post_recv on an SRQ
    /// QP before it gets here).
    pub(crate) fn push(&mut self, wqe: RecvWqe) {
        match self {
            RecvQueue::Own(q) => q.push_back(wqe),
            RecvQueue::Shared(s, _) => s.lock().wqes.push_back(wqe),
        }
    }

    /// The QP entered ERR: every WR it holds — its own queue, or the one it
    /// took from its SRQ and kept — completes with the flush error `wc`
    /// makes; on an SRQ, whose WRs stay there, QP_LAST_WQE_REACHED follows.
    pub(crate) fn flush(
        &mut self,
        events: &mut VecDeque<QpEvent>,
        wc: impl Fn(&RecvWqe) -> WorkCompletion,
    ) {
        let flushed = |wqe: RecvWqe| QpEvent::RecvCompletion(wc(&wqe), false);
        match self {
            RecvQueue::Own(q) => events.extend(q.drain(..).map(flushed)),
            RecvQueue::Shared(s, held) => {
                if let Some(wqe) = held.take() {
                    let mut q = s.lock();
                    q.held = q.held.saturating_sub(1);
                    drop(q);
                    events.push_back(flushed(wqe));
                }
                events.push_back(QpEvent::Async(AsyncEventType::QpLastWqeReached));
            }
        }
    }

    /// The QP goes away (destroy, reset): a WR it kept goes back to the
    /// head of its SRQ, where other QPs find it.
    pub(crate) fn return_held(&mut self) {
        if let RecvQueue::Shared(s, held) = self {
            if let Some(wqe) = held.take() {
                let mut q = s.lock();
                q.held = q.held.saturating_sub(1);
                q.wqes.push_front(wqe);
            }
        }
    }
}
