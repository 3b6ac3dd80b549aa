//! Asynchronous events (`ibv_get_async_event` / `ibv_ack_async_event`).
//!
//! An [`AsyncEvent`] acknowledges itself when dropped, so an event cannot be
//! forgotten unacknowledged. Destroying an object with unacknowledged events
//! fails with EBUSY instead of waiting as libibverbs does, so it cannot
//! deadlock on an event the same thread still holds.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result, Verb};
use crate::event::AsyncEventType;
use crate::soft::context::{AsyncSource, ContextCore};
use crate::soft::cq::CqCore;
use crate::soft::notify::{PopError, Wait};
use crate::soft::qp::QpCore;
use crate::soft::srq::SrqCore;
use crate::verbs::cq::CompletionQueue;
use crate::verbs::qp::QueuePair;
use crate::verbs::srq::SharedReceiveQueue;

/// The object an async event is about (`ibv_async_event.element`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEventElement {
    /// A completion queue: its handle and the user data it was created with.
    Cq {
        /// The CQ's handle.
        handle: u64,
        /// The CQ's `cq_context`.
        user_data: u64,
    },
    /// A queue pair: its number and the user data it was created with.
    Qp {
        /// The QP number.
        qp_num: u32,
        /// The QP's `qp_context`.
        user_data: u64,
    },
    /// A shared receive queue: its handle and the user data it was created with.
    Srq {
        /// The SRQ's handle.
        handle: u64,
        /// The SRQ's `srq_context`.
        user_data: u64,
    },
    /// A port.
    Port(u8),
    /// The device itself (unaffiliated events such as `DeviceFatal`).
    Device,
}

enum Held {
    Cq(Arc<CqCore>),
    Qp(Arc<QpCore>),
    Srq(Arc<SrqCore>),
    Port(u8),
    Device,
}

/// One async event. Dropping it acknowledges it (`ibv_ack_async_event`).
pub struct AsyncEvent {
    event_type: AsyncEventType,
    held: Held,
}

impl AsyncEvent {
    /// What happened.
    pub fn event_type(&self) -> AsyncEventType {
        self.event_type
    }

    /// What it happened to.
    pub fn element(&self) -> AsyncEventElement {
        match &self.held {
            Held::Cq(cq) => AsyncEventElement::Cq {
                handle: cq.handle,
                user_data: cq.user_data,
            },
            Held::Qp(qp) => AsyncEventElement::Qp {
                qp_num: qp.qpn,
                user_data: qp.user_data,
            },
            Held::Srq(srq) => AsyncEventElement::Srq {
                handle: srq.handle,
                user_data: srq.user_data,
            },
            Held::Port(p) => AsyncEventElement::Port(*p),
            Held::Device => AsyncEventElement::Device,
        }
    }

    /// Whether the event is about `cq`.
    pub fn is_for_cq(&self, cq: &CompletionQueue) -> bool {
        matches!(&self.held, Held::Cq(c) if Arc::ptr_eq(c, &cq.core))
    }

    /// Whether the event is about `qp`.
    pub fn is_for_qp(&self, qp: &QueuePair) -> bool {
        matches!(&self.held, Held::Qp(q) if Arc::ptr_eq(q, &qp.core))
    }

    /// Whether the event is about `srq`.
    pub fn is_for_srq(&self, srq: &SharedReceiveQueue) -> bool {
        matches!(&self.held, Held::Srq(s) if Arc::ptr_eq(s, &srq.core))
    }

    /// Acknowledges the event now (the same as dropping it).
    pub fn ack(self) {}
}

impl Drop for AsyncEvent {
    fn drop(&mut self) {
        match &self.held {
            Held::Cq(cq) => cq.async_events.ack(),
            Held::Qp(qp) => qp.async_events.ack(),
            Held::Srq(srq) => srq.async_events.ack(),
            Held::Port(_) | Held::Device => {}
        }
    }
}

impl fmt::Debug for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncEvent")
            .field("event_type", &self.event_type)
            .field("element", &self.element())
            .finish()
    }
}

/// Reads the next async event of `ctx`.
pub(crate) fn pop_async(ctx: &ContextCore, wait: Wait) -> Result<Option<AsyncEvent>> {
    let verb = Verb::GetAsyncEvent;
    ctx.async_events
        .pop_with(wait, |entry| {
            let held = match entry.source {
                AsyncSource::Cq(weak) => {
                    // A CQ destroyed meanwhile: the event goes with it. (Only an
                    // already-released CQ can be dropped here, under the queue lock,
                    // and its release is then a no-op.)
                    let cq = weak.upgrade().filter(|cq| !cq.is_released())?;
                    cq.async_events.report();
                    Held::Cq(cq)
                }
                AsyncSource::Qp(weak) => {
                    let qp = weak.upgrade().filter(|qp| !qp.is_released())?;
                    qp.async_events.report();
                    Held::Qp(qp)
                }
                AsyncSource::Srq(weak) => {
                    let srq = weak.upgrade().filter(|s| !s.is_released())?;
                    srq.async_events.report();
                    Held::Srq(srq)
                }
                AsyncSource::Port(p) => Held::Port(p),
                AsyncSource::Device => Held::Device,
            };
            Some(AsyncEvent {
                event_type: entry.event_type,
                held,
            })
        })
        .map_err(|e| match e {
            PopError::WouldBlock => Error::new(
                verb,
                ErrorKind::WouldBlock,
                "no async event pending and async_fd is non-blocking",
            ),
            PopError::Closed => Error::new(
                verb,
                ErrorKind::Io,
                format!("device {} was disassociated", ctx.device.name),
            ),
            PopError::Os(errno) => Error::from_errno(verb, errno, "reading async_fd"),
        })
}
