//! Protection domains as the engine sees them: an id every MR, QP and AH
//! carries, and the count of those still using it.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Verb};
use crate::resources::ResourceKind;
use crate::soft::context::ContextCore;

/// One protection domain.
pub(crate) struct PdCore {
    /// Handle, unique on the device; also the PD id the key checks compare.
    pub(crate) handle: u64,
    pub(crate) ctx: Arc<ContextCore>,
    users: AtomicU32,
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
            users: AtomicU32::new(0),
            released: AtomicBool::new(false),
        });
        ctx.ledger.add(ResourceKind::Pd, pd.handle);
        Ok(pd)
    }

    /// MRs, QPs and AHs using the PD.
    pub(crate) fn users(&self) -> u32 {
        self.users.load(Ordering::Acquire)
    }

    pub(crate) fn add_user(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn remove_user(&self) {
        self.users.fetch_sub(1, Ordering::AcqRel);
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
