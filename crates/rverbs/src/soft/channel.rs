//! Completion channels as the engine sees them: a queue of CQs that fired,
//! behind a pollable descriptor, and the count of CQs attached (libibverbs'
//! `refcnt`).

use std::sync::atomic::{AtomicU32, Ordering};
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
    /// The CQs attached, and [`RELEASED`] once the channel is destroyed:
    /// one word, so that attaching a CQ and destroying the channel cannot
    /// both succeed when they race (each is one compare-and-swap).
    cqs: AtomicU32,
}

/// The bit of [`ChannelCore::cqs`] that says the channel was released.
const RELEASED: u32 = 1 << 31;

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
        });
        ctx.ledger.add(ResourceKind::CompChannel, ch.handle);
        ctx.register_channel(&ch);
        Ok(ch)
    }

    /// CQs attached (created on it and not yet destroyed).
    pub(crate) fn cq_count(&self) -> u32 {
        self.cqs.load(Ordering::Acquire) & !RELEASED
    }

    /// Attaches a CQ; `false` if the channel was released (then nothing
    /// changed).
    pub(crate) fn try_attach_cq(&self) -> bool {
        self.cqs
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n & RELEASED == 0).then_some(n + 1)
            })
            .is_ok()
    }

    /// Detaches `cq`: forgets its pending notifications.
    pub(crate) fn detach_cq(&self, cq: *const CqCore) {
        self.queue.retain(|w| w.as_ptr() != cq);
        self.cqs.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether the channel was destroyed (or dropped).
    #[cfg(test)]
    pub(crate) fn is_released(&self) -> bool {
        self.cqs.load(Ordering::Acquire) & RELEASED != 0
    }

    /// Releases the channel (`destroy`) unless CQs are attached:
    /// `Err(Some(n))` with `n` CQs attached, `Err(None)` if it was released
    /// already.
    pub(crate) fn try_release(&self) -> Result<(), Option<u32>> {
        match self
            .cqs
            .compare_exchange(0, RELEASED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                self.forget();
                Ok(())
            }
            Err(n) if n & RELEASED != 0 => Err(None),
            Err(n) => Err(Some(n)),
        }
    }

    /// Takes the channel out of its context's ledger.
    fn forget(&self) {
        self.ctx
            .ledger
            .remove(ResourceKind::CompChannel, self.handle);
    }
}

impl Drop for ChannelCore {
    /// The last handle is gone: a channel never destroyed leaves its
    /// context's ledger now.
    fn drop(&mut self) {
        if *self.cqs.get_mut() & RELEASED == 0 {
            self.forget();
        }
    }
}
