//! Completion channels as the engine sees them: a queue of CQs that fired,
//! behind a pollable descriptor, and the count of CQs attached (libibverbs'
//! `refcnt`).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use crate::error::{Error, Verb};
use crate::resources::ResourceKind;
use crate::soft::context::ContextCore;
use crate::soft::cq::CqCore;
use crate::soft::notify::EventQueue;

/// One completion channel.
pub(crate) struct ChannelCore {
    pub(crate) handle: u64,
    pub(crate) ctx: Arc<ContextCore>,
    /// CQs whose armed notification fired, oldest first.
    pub(crate) queue: EventQueue<Weak<CqCore>>,
    cqs: AtomicU32,
    released: AtomicBool,
}

impl ChannelCore {
    pub(crate) fn create(ctx: &Arc<ContextCore>) -> Result<Arc<ChannelCore>, Error> {
        ctx.device.check_alive(Verb::CreateCompChannel)?;
        let queue = EventQueue::new()
            .map_err(|e| Error::from_errno(Verb::CreateCompChannel, e, "channel descriptor"))?;
        let ch = Arc::new(ChannelCore {
            handle: ctx.device.new_handle(),
            ctx: ctx.clone(),
            queue,
            cqs: AtomicU32::new(0),
            released: AtomicBool::new(false),
        });
        ctx.ledger.add(ResourceKind::CompChannel, ch.handle);
        ctx.register_channel(&ch);
        Ok(ch)
    }

    /// CQs attached (created on it and not yet destroyed).
    pub(crate) fn cq_count(&self) -> u32 {
        self.cqs.load(Ordering::Acquire)
    }

    pub(crate) fn attach_cq(&self) {
        self.cqs.fetch_add(1, Ordering::AcqRel);
    }

    /// Detaches `cq`: forgets its pending notifications.
    pub(crate) fn detach_cq(&self, cq: *const CqCore) {
        self.queue.retain(|w| w.as_ptr() != cq);
        self.cqs.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether the channel was destroyed (or dropped).
    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Releases the channel's accounting; idempotent.
    pub(crate) fn release(&self) {
        if !self.released.swap(true, Ordering::AcqRel) {
            self.ctx
                .ledger
                .remove(ResourceKind::CompChannel, self.handle);
        }
    }
}

impl Drop for ChannelCore {
    fn drop(&mut self) {
        self.release();
    }
}
