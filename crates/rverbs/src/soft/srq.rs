//! Shared receive queues as the engine sees them: the queue QPs take
//! receive WRs from, its limits, and the count of QPs using it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::resources::ResourceKind;
use crate::soft::context::{AsyncSource, ContextCore};
use crate::soft::cq::EventCounts;
use crate::soft::pd::PdCore;
use crate::soft::transport::recv::SharedRq;
use crate::soft::Users;

/// One shared receive queue.
pub(crate) struct SrqCore {
    pub(crate) handle: u64,
    pub(crate) ctx: Arc<ContextCore>,
    pub(crate) pd: Arc<PdCore>,
    pub(crate) queue: SharedRq,
    /// Most SGEs per receive WR.
    pub(crate) max_sge: u32,
    pub(crate) user_data: u64,
    pub(crate) async_events: EventCounts,
    /// QPs taking their receive WRs from it.
    pub(crate) users: Users,
    released: AtomicBool,
}

impl SrqCore {
    pub(crate) fn new(
        ctx: &Arc<ContextCore>,
        pd: &Arc<PdCore>,
        max_wr: u32,
        max_sge: u32,
        limit: u32,
        user_data: u64,
    ) -> Arc<SrqCore> {
        let srq = Arc::new(SrqCore {
            handle: ctx.device.new_handle(),
            ctx: ctx.clone(),
            pd: pd.clone(),
            queue: SharedRq::new(max_wr, limit),
            max_sge,
            user_data,
            async_events: EventCounts::default(),
            users: Users::default(),
            released: AtomicBool::new(false),
        });
        pd.users.add();
        ctx.ledger.add(ResourceKind::Srq, srq.handle);
        srq
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Releases what the SRQ uses; idempotent. Receive WRs still queued are
    /// dropped unreported, as `ibv_destroy_srq` does.
    pub(crate) fn release(&self) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        self.queue.lock().wqes.clear();
        let me: *const SrqCore = self;
        self.ctx
            .async_events
            .retain(|e| !matches!(&e.source, AsyncSource::Srq(w) if w.as_ptr() == me));
        self.pd.users.remove();
        self.ctx.ledger.remove(ResourceKind::Srq, self.handle);
        self.ctx.device.srqs.release();
    }
}

impl Drop for SrqCore {
    fn drop(&mut self) {
        self.release();
    }
}
