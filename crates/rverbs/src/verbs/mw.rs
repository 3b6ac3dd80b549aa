//! Memory windows (`ibv_alloc_mw`, `ibv_dealloc_mw`, `ibv_bind_mw`): a
//! remote key over part of an MR, with rights of its own, that the owner
//! binds, moves and revokes without re-registering the memory.
//!
//! A window is allocated in a PD ([`ProtectionDomain::alloc_mw`]) and bound
//! through a QP: a type 1 window with [`QueuePair::bind_mw`] (libibverbs'
//! `ibv_bind_mw`, posted as a send WR), a type 2 window with a
//! [`WrOpcode::BindMw`] send WR ([`MemoryWindow::bind_op`]), which ties it to
//! that QP. Each bind gives the window a new rkey: the same upper 24 bits,
//! the low 8 bits (the tag) from the bind. A peer's READ, WRITE or atomic
//! through the rkey is checked against the window's range and rights (and
//! QP, type 2), then reaches the MR, whose own remote flags are not asked.
//! A type 2 window is revoked by a [`WrOpcode::LocalInv`] WR or by the
//! peer's [`WrOpcode::SendWithInv`]; a type 1 window by a zero-length bind
//! ([`MwBindInfo::unbind`]). The checks and errors are Linux rxe's.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Rejected, Result, Verb};
use crate::resources::ResourceKind;
use crate::soft::memory::MwCore;
use crate::soft::pd::PdCore;
use crate::verbs::pd::ProtectionDomain;
use crate::wr::{inc_rkey, MwBindInfo, MwType, WrOpcode};

/// A memory window.
///
/// Dropping it deallocates it; [`dealloc`](Self::dealloc) does the same
/// and reports errors. A bound window may be deallocated (its rkey stops
/// working at once), as on rxe.
pub struct MemoryWindow {
    pub(crate) core: Arc<MwCore>,
    pd: Arc<PdCore>,
    released: bool,
}

impl ProtectionDomain {
    /// Allocates a memory window of type `ty` (`ibv_alloc_mw`): a type 1
    /// window starts unbound, a type 2 window free. ENOMEM once the device
    /// has `max_mw` windows.
    pub fn alloc_mw(&self, ty: MwType) -> Result<MemoryWindow> {
        MemoryWindow::alloc(&self.core, ty)
    }
}

impl MemoryWindow {
    fn alloc(pd: &Arc<PdCore>, ty: MwType) -> Result<MemoryWindow> {
        let verb = Verb::AllocMw;
        let dev = &pd.ctx.device;
        dev.check_alive(verb)?;
        let handle = dev.new_handle();
        let core = dev.mrs.alloc_mw(handle, ty, pd.handle).ok_or_else(|| {
            Error::new(
                verb,
                ErrorKind::OutOfMemory,
                format!(
                    "device {} has max_mw = {} memory windows already",
                    dev.name, dev.attr.max_mw
                ),
            )
        })?;
        pd.users.add();
        pd.ctx.ledger.add(ResourceKind::Mw, handle);
        Ok(MemoryWindow {
            core,
            pd: pd.clone(),
            released: false,
        })
    }

    /// The window's handle (unique on the device).
    pub fn handle(&self) -> u64 {
        self.core.handle
    }

    /// The window's type.
    pub fn mw_type(&self) -> MwType {
        self.core.ty
    }

    /// The window's rkey now: what peers use once a bind completed (each
    /// bind changes its low 8 bits).
    pub fn rkey(&self) -> u32 {
        self.core.rkey()
    }

    /// Whether the window is bound (a type 2 window: valid, not yet invalidated).
    pub fn is_bound(&self) -> bool {
        self.core.is_bound()
    }

    /// Handle of the PD the window is in.
    pub fn pd_handle(&self) -> u64 {
        self.pd.handle
    }

    /// The operation of a send WR binding this (type 2) window to `info`
    /// under the next rkey ([`inc_rkey`] of the current one, which the
    /// operation's `rkey` holds): post it on a QP of the window's PD.
    pub fn bind_op(&self, info: MwBindInfo) -> WrOpcode {
        let mw_rkey = self.rkey();
        WrOpcode::BindMw {
            mw_rkey,
            rkey: inc_rkey(mw_rkey),
            info,
        }
    }

    /// Deallocates the window (`ibv_dealloc_mw`): its rkey stops working,
    /// bound or not.
    pub fn dealloc(mut self) -> Result<(), Rejected<MemoryWindow>> {
        if let Err(e) = self.pd.ctx.device.may_destroy(Verb::DeallocMw, || None) {
            return Err(Rejected::new(e, self));
        }
        self.release();
        Ok(())
    }

    fn release(&mut self) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        self.pd.ctx.device.mrs.dealloc_mw(&self.core);
        self.pd.users.remove();
        self.pd
            .ctx
            .ledger
            .remove(ResourceKind::Mw, self.core.handle);
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        self.release();
    }
}

impl fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("handle", &self.core.handle)
            .field("type", &self.core.ty)
            .field("rkey", &format_args!("{:#010x}", self.rkey()))
            .finish()
    }
}
