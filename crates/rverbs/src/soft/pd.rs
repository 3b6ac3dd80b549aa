//! Protection domains as the engine sees them: an id every MR, QP and AH
//! carries, and the count of those still using it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Verb};
use crate::resources::ResourceKind;
use crate::soft::context::ContextCore;
use crate::soft::Users;

/// One protection domain.
pub(crate) struct PdCore {
    /// Handle, unique on the device; also the PD id the key checks compare.
    pub(crate) handle: u64,
    pub(crate) ctx: Arc<ContextCore>,
    pub(crate) users: Users,
    released: AtomicBool,
}

impl PdCore {
    pub(crate) fn alloc(ctx: &Arc<ContextCore>) -> Result<Arc<PdCore>, Error> {
        let dev = &ctx.device;
        dev.check_alive(Verb::AllocPd)?;
        if !dev.pds.try_acquire() {
            return Err(Error::new(
                Verb::AllocPd,
                ErrorKind::OutOfMemory,
                format!(
                    "device {} has max_pd = {} PDs already",
                    dev.name, dev.attr.max_pd
                ),
            ));
        }
        let pd = Arc::new(PdCore {
            handle: dev.new_handle(),
            ctx: ctx.clone(),
            users: Users::default(),
            released: AtomicBool::new(false),
        });
        ctx.ledger.add(ResourceKind::Pd, pd.handle);
        Ok(pd)
    }

    /// Releases the PD's accounting and quota; idempotent.
    pub(crate) fn release(&self) {
        if !self.released.swap(true, Ordering::AcqRel) {
            self.ctx.ledger.remove(ResourceKind::Pd, self.handle);
            self.ctx.device.pds.release();
        }
    }
}

impl Drop for PdCore {
    fn drop(&mut self) {
        self.release();
    }
}
