//! Protection domains (`ibv_alloc_pd`, `ibv_dealloc_pd`) and memory
//! registration through them (`ibv_reg_mr` and its variants).

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::attr::AccessFlags;
use crate::error::{Error, Rejected, Result, Verb};
use crate::soft::context::ContextCore;
use crate::soft::memory::Region;
use crate::soft::pd::PdCore;
use crate::verbs::mr::{check_mapped, MemoryRegion, MrBuffer};

/// A protection domain: MRs, QPs and AHs of one PD can reach each other only.
pub struct ProtectionDomain {
    pub(crate) core: Arc<PdCore>,
}

impl ProtectionDomain {
    pub(crate) fn alloc(ctx: &Arc<ContextCore>) -> Result<ProtectionDomain> {
        Ok(ProtectionDomain {
            core: PdCore::alloc(ctx)?,
        })
    }

    /// The PD's handle (unique on the device).
    pub fn handle(&self) -> u64 {
        self.core.handle
    }

    /// Registers memory the MR takes ownership of, at its own address as the
    /// iova (`ibv_reg_mr`). On failure the buffer comes back in the error.
    pub fn reg_mr(
        &self,
        buf: impl Into<MrBuffer>,
        access: AccessFlags,
    ) -> Result<MemoryRegion, Rejected<MrBuffer>> {
        let buf = buf.into();
        let iova = buf.as_ptr() as u64;
        self.reg_mr_iova(buf, iova, access)
    }

    /// Registers a new zeroed buffer of `len` bytes.
    pub fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion> {
        self.reg_mr(MrBuffer::zeroed(len), access)
            .map_err(Error::from)
    }

    /// Registers owned memory with `iova` as the address of its first byte
    /// (`ibv_reg_mr_iova`). `iova` must have the same offset within a 4 KiB
    /// page as the buffer, as the kernel requires.
    pub fn reg_mr_iova(
        &self,
        buf: impl Into<MrBuffer>,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, Rejected<MrBuffer>> {
        let buf = buf.into();
        let (addr, len) = (buf.as_ptr() as u64, buf.len());
        let access = match MemoryRegion::check_registration(&self.core, addr, len, iova, access) {
            Ok(a) => a,
            Err(e) => return Err(Rejected::new(e, buf)),
        };
        MemoryRegion::register(&self.core, Region::owned(buf.into_owned()), iova, access).map_err(
            |(e, region)| {
                let buf = region.into_owned().unwrap_or_default();
                Rejected::new(e, MrBuffer::from_owned(buf))
            },
        )
    }

    /// Registers memory the caller owns (`ibv_reg_mr_iova2`). Memory not
    /// mapped readable — and writable, when `access` asks for any write
    /// access — is refused with EFAULT, as pinning it would be on hardware.
    ///
    /// # Safety
    /// `addr..addr+len` must be valid for reads and writes, and stay valid
    /// until the returned MR is deregistered, dropped or re-registered to
    /// other memory. Meanwhile the memory belongs to the MR: the device and
    /// the MR's `write_at` may write it at any time, so the caller must not
    /// hold Rust references to it, nor access it other than through the MR
    /// (or [`MemoryRegion::as_slice`] under that method's rules).
    pub unsafe fn reg_mr_raw(
        &self,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        let ptr =
            NonNull::new(addr).ok_or_else(|| Error::invalid(Verb::RegMr, "address is NULL"))?;
        let access = MemoryRegion::check_registration(&self.core, addr as u64, len, iova, access)?;
        check_mapped(Verb::RegMr, addr as u64, len, access)?;
        // SAFETY: the caller guarantees the range for the MR's lifetime.
        let region = unsafe { Region::foreign(ptr, len) };
        MemoryRegion::register(&self.core, region, iova, access).map_err(|(e, _)| e)
    }

    /// Builds a queue pair in this PD with `send_cq` and `recv_cq`
    /// (`ibv_create_qp`).
    pub fn qp_builder<'a>(
        &'a self,
        send_cq: &'a crate::CompletionQueue,
        recv_cq: &'a crate::CompletionQueue,
    ) -> crate::verbs::qp::QpBuilder<'a> {
        crate::verbs::qp::QpBuilder::new(self, send_cq, recv_cq)
    }

    /// Deallocates the PD (`ibv_dealloc_pd`). Fails with EBUSY, handing the
    /// PD back, while MRs, QPs or AHs use it.
    pub fn dealloc(self) -> Result<(), Rejected<ProtectionDomain>> {
        let core = &self.core;
        let checked = core.ctx.device.may_destroy(Verb::DeallocPd, || {
            let users = core.users.count();
            (users > 0)
                .then(|| format!("{users} MR(s), QP(s) or AH(s) still use PD {}", core.handle))
        });
        if let Err(e) = checked {
            return Err(Rejected::new(e, self));
        }
        self.core.release();
        Ok(())
    }
}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("handle", &self.core.handle)
            .field("users", &self.core.users.count())
            .finish()
    }
}
