//! Memory regions (`ibv_reg_mr`, `ibv_rereg_mr`, `ibv_dereg_mr`) and the
//! owned buffers the safe API registers.
//!
//! An MR registered through the safe API owns its memory ([`MrBuffer`]):
//! nothing else can free or alias it while the device may write into it, and
//! deregistration hands it back. The owner reads and writes it with the
//! copying [`MemoryRegion::read_at`] / [`MemoryRegion::write_at`], never
//! through a reference a remote write could race. Borrowing it as a slice is
//! `unsafe`, as is registering memory the MR does not own.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::attr::AccessFlags;
use crate::error::{Error, ErrorKind, Rejected, Result, Verb};
use crate::resources::ResourceKind;
use crate::soft::device::DestroyPath;
use crate::soft::memory::{AccessError, AccessKind, MrCore, MrState, OwnedMemory, Region};
use crate::soft::pd::PdCore;
use crate::verbs::pd::ProtectionDomain;

/// Memory for an MR to own. Build it from a `Vec<u8>`, a boxed slice or
/// [`MrBuffer::zeroed`]; get it back from [`MemoryRegion::dereg`].
///
/// A zeroed buffer of 1 MiB or more lives in a mapping of its own, aligned
/// to 2 MiB, advised for transparent huge pages and faulted in at once (as
/// registration pins memory on a NIC): a same-host peer's copies out of it
/// and into it run about twice as fast on huge pages, as a NIC's do with
/// fewer translation entries. Its size is rounded up to whole 2 MiB pages,
/// so a buffer of 1 MiB takes 2 MiB.
#[derive(Clone, Default)]
pub struct MrBuffer(OwnedMemory);

impl MrBuffer {
    /// `len` zero bytes (from 1 MiB on, on huge pages where the kernel
    /// has them).
    pub fn zeroed(len: usize) -> MrBuffer {
        MrBuffer(OwnedMemory::zeroed(len))
    }

    /// The bytes, as a boxed slice (a copy for a buffer on huge pages).
    pub fn into_boxed_slice(self) -> Box<[u8]> {
        self.0.into_boxed_slice()
    }

    /// The bytes, as a vector (a copy for a buffer on huge pages).
    pub fn into_vec(self) -> Vec<u8> {
        self.into_boxed_slice().into_vec()
    }

    /// The memory, for an MR to own.
    pub(crate) fn into_owned(self) -> OwnedMemory {
        self.0
    }

    /// Memory an MR owned, handed back.
    pub(crate) fn from_owned(memory: OwnedMemory) -> MrBuffer {
        MrBuffer(memory)
    }
}

impl PartialEq for MrBuffer {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for MrBuffer {}

impl Deref for MrBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl DerefMut for MrBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl From<Vec<u8>> for MrBuffer {
    fn from(v: Vec<u8>) -> Self {
        MrBuffer(OwnedMemory::Heap(v.into_boxed_slice()))
    }
}

impl From<Box<[u8]>> for MrBuffer {
    fn from(b: Box<[u8]>) -> Self {
        MrBuffer(OwnedMemory::Heap(b))
    }
}

impl From<&[u8]> for MrBuffer {
    fn from(s: &[u8]) -> Self {
        MrBuffer(OwnedMemory::Heap(s.into()))
    }
}

impl fmt::Debug for MrBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MrBuffer")
            .field("len", &self.0.len())
            .finish()
    }
}

/// Checks access flags as libibverbs and the kernel do, and drops the
/// optional flags (`IBV_ACCESS_OPTIONAL_RANGE`) the device does not act on.
pub(crate) fn validate_access(verb: Verb, access: AccessFlags) -> Result<AccessFlags> {
    let unknown = access.bits() & !AccessFlags::all().bits();
    if unknown != 0 {
        return Err(Error::invalid(
            verb,
            format!("unknown access flags {unknown:#x}"),
        ));
    }
    if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
        && !access.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(Error::invalid(
            verb,
            "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE",
        ));
    }
    if access.contains(AccessFlags::ON_DEMAND) {
        return Err(Error::new(
            verb,
            ErrorKind::NotSupported,
            "on-demand paging (ON_DEMAND) is not supported",
        ));
    }
    if access.intersects(AccessFlags::FLUSH_GLOBAL | AccessFlags::FLUSH_PERSISTENT) {
        return Err(Error::new(
            verb,
            ErrorKind::NotSupported,
            "FLUSH targets are not supported",
        ));
    }
    Ok(access - (AccessFlags::OPTIONAL_RANGE | AccessFlags::RELAXED_ORDERING))
}

/// Foreign memory must be mapped, readable, and writable when the MR asks
/// for write access, as pinning it would need on hardware: EFAULT if not.
pub(crate) fn check_mapped(verb: Verb, addr: u64, len: usize, access: AccessFlags) -> Result<()> {
    let write = access.intersects(
        AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_ATOMIC
            | AccessFlags::MW_BIND,
    );
    crate::soft::mapping::check_mapped(addr, len, write).map_err(|e| {
        Error::new(
            verb,
            ErrorKind::BadAddress,
            format!("cannot register {addr:#x}+{len}: {e}"),
        )
    })
}

fn access_error(verb: Verb, e: AccessError) -> Error {
    Error::invalid(verb, e.to_string())
}

/// A registered memory region.
///
/// Dropping it deregisters it (the owned memory is freed); [`dereg`](Self::dereg)
/// does the same, reports errors, and hands owned memory back.
pub struct MemoryRegion {
    core: Arc<MrCore>,
    pd: Arc<PdCore>,
    released: bool,
}

impl MemoryRegion {
    /// Checks a registration's arguments; returns the effective access flags.
    pub(crate) fn check_registration(
        pd: &PdCore,
        addr: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<AccessFlags> {
        let verb = Verb::RegMr;
        pd.ctx.device.check_alive(verb)?;
        let access = validate_access(verb, access)?;
        check_translation(verb, pd, addr, len, iova)?;
        Ok(access)
    }

    /// Registers `region` in `pd` with the access flags
    /// [`check_registration`](Self::check_registration) returned. On failure
    /// (`max_mr` reached) the region comes back.
    pub(crate) fn register(
        pd: &Arc<PdCore>,
        region: Region,
        iova: u64,
        access: AccessFlags,
    ) -> std::result::Result<MemoryRegion, (Error, Region)> {
        let verb = Verb::RegMr;
        let dev = &pd.ctx.device;
        let handle = dev.new_handle();
        let state = MrState {
            key: 0,
            region,
            iova,
            access,
            pd: pd.handle,
            valid: true,
        };
        let core = dev.mrs.insert(handle, state).map_err(|state| {
            let e = Error::new(
                verb,
                ErrorKind::OutOfMemory,
                format!(
                    "device {} has max_mr = {} MRs already",
                    dev.name, dev.attr.max_mr
                ),
            );
            (e, state.region)
        })?;
        pd.users.add();
        pd.ctx.ledger.add(ResourceKind::Mr, handle);
        Ok(MemoryRegion {
            core,
            pd: pd.clone(),
            released: false,
        })
    }

    /// The MR's handle (unique on the device).
    pub fn handle(&self) -> u64 {
        self.core.handle
    }

    /// The local key, for SGEs.
    pub fn lkey(&self) -> u32 {
        self.core.read().key
    }

    /// The remote key, for peers' RDMA and atomic requests.
    pub fn rkey(&self) -> u32 {
        self.core.read().key
    }

    /// Address of the first byte in this process.
    pub fn addr(&self) -> u64 {
        self.core.read().region.addr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.core.read().region.len()
    }

    /// Whether the MR is empty (never true for a registered MR).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The address SGEs and peers use for the first byte.
    pub fn iova(&self) -> u64 {
        self.core.read().iova
    }

    /// What the MR allows.
    pub fn access(&self) -> AccessFlags {
        self.core.read().access
    }

    /// Handle of the PD the MR is in.
    pub fn pd_handle(&self) -> u64 {
        self.pd.handle
    }

    /// Copies `buf.len()` bytes starting `offset` bytes into the MR into `buf`.
    pub fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        let st = self.core.read();
        let va = st.iova.wrapping_add(offset as u64);
        st.read_window(va, buf.len(), AccessKind::CpuRead, None)
            .map_err(|e| access_error(Verb::MrRead, e))?
            .read_into(buf);
        Ok(())
    }

    /// Copies `data` into the MR starting `offset` bytes in. It takes the
    /// MR's write lock, so it never races a device access or another copy.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        let mut st = self.core.write();
        let va = st.iova.wrapping_add(offset as u64);
        st.write_window(va, data.len(), AccessKind::CpuWrite, None)
            .map_err(|e| access_error(Verb::MrWrite, e))?
            .write_from(data);
        Ok(())
    }

    /// The MR's bytes as a slice.
    ///
    /// # Safety
    /// While the slice lives nothing may write the MR: no remote write or
    /// atomic, no receive or READ response landing in it, no `write_at`.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the caller rules out writers; the region cannot be replaced
        // or freed while `self` is borrowed (rereg and dereg need `self`
        // mutably or by value).
        unsafe { self.core.bytes() }
    }

    /// The MR's bytes as a mutable slice.
    ///
    /// # Safety
    /// While the slice lives nothing else may read or write the MR: no
    /// device access of any kind (local or remote).
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` keeps the owner's other
        // accesses away and the caller rules out device accesses.
        unsafe { self.core.bytes_mut() }
    }

    /// Re-registers the MR (`ibv_rereg_mr`): changes its memory
    /// (translation), access flags and/or PD at once. A new translation
    /// gets new keys (a peer holding the old rkey can no longer reach the
    /// new memory); a change of PD or access flags alone keeps them, as
    /// the kernel's Soft-RoCE and mlx5 keep them (the checks a key passes
    /// are made against the MR's current PD and flags).
    /// Returns the memory it owned before if the translation changed. A
    /// refused request comes back unchanged, and the MR is as it was.
    pub fn rereg<'a>(&mut self, req: Rereg<'a>) -> Result<Option<MrBuffer>, Rejected<Rereg<'a>>> {
        let verb = Verb::ReregMr;
        if let Err(e) = self.check_rereg(verb, &req) {
            return Err(Rejected::new(e, req));
        }
        let access = match req.access.map(|a| validate_access(verb, a)).transpose() {
            Ok(a) => a,
            Err(e) => return Err(Rejected::new(e, req)),
        };
        if let Err(e) = self.check_rereg_mapping(verb, &req, access) {
            return Err(Rejected::new(e, req));
        }
        let dev = &self.pd.ctx.device;
        let mut st = self.core.write();
        let mut old = None;
        if let Some(memory) = req.memory {
            let region = match memory {
                NewMemory::Owned(buf) => Region::owned(buf.into_owned()),
                NewMemory::Foreign(region) => region,
                NewMemory::Null => Region::empty(), // refused by check_rereg
            };
            st.iova = region.addr();
            old = Some(std::mem::replace(&mut st.region, region));
        }
        if let Some(a) = access {
            st.access = a;
        }
        if let Some(pd) = req.pd {
            st.pd = pd.core.handle;
        }
        if old.is_some() {
            st.key = dev.mrs.rekey(&self.core, st.key);
        }
        drop(st);
        if old.is_some() {
            // What same-host peers still copy from the old memory is copied
            // before it goes back (see `release`).
            dev.engine.await_peer_copies(PEER_COPY_LIMIT);
        }
        if let Some(pd) = req.pd {
            pd.core.users.add();
            self.pd.users.remove();
            self.pd = pd.core.clone();
        }
        Ok(old.and_then(Region::into_owned).map(MrBuffer::from_owned))
    }

    /// Foreign memory the MR would have after `req` is mapped as its access
    /// flags (`access`, else the MR's) need: new memory, or the MR's own
    /// when only the flags change.
    fn check_rereg_mapping(
        &self,
        verb: Verb,
        req: &Rereg<'_>,
        access: Option<AccessFlags>,
    ) -> Result<()> {
        let (current, mine) = {
            let st = self.core.read();
            let foreign = st.region.is_foreign();
            (
                st.access,
                foreign.then(|| (st.region.addr(), st.region.len())),
            )
        };
        let access = access.unwrap_or(current);
        let range = match &req.memory {
            Some(NewMemory::Foreign(region)) => Some((region.addr(), region.len())),
            Some(NewMemory::Owned(_) | NewMemory::Null) => None,
            None if req.access.is_some() => mine,
            None => None,
        };
        match range {
            Some((addr, len)) => check_mapped(verb, addr, len, access),
            None => Ok(()),
        }
    }

    fn check_rereg(&self, verb: Verb, req: &Rereg<'_>) -> Result<()> {
        self.pd.ctx.device.check_alive(verb)?;
        if req.pd.is_none() && req.access.is_none() && req.memory.is_none() {
            return Err(Error::invalid(
                verb,
                "nothing to change: give new memory, access flags or a PD",
            ));
        }
        if let Some(pd) = req.pd {
            if !Arc::ptr_eq(&pd.core.ctx, &self.pd.ctx) {
                return Err(Error::invalid(
                    verb,
                    format!("PD {} belongs to another context", pd.core.handle),
                ));
            }
        }
        if let Some(memory) = &req.memory {
            if matches!(memory, NewMemory::Null) {
                return Err(Error::invalid(verb, "address is NULL"));
            }
            let (addr, len) = memory.addr_len();
            check_translation(verb, &self.pd, addr, len, addr)?;
        }
        Ok(())
    }

    /// Deregisters the MR (`ibv_dereg_mr`) and returns the memory it owned
    /// (`None` for memory registered with [`ProtectionDomain::reg_mr_raw`]).
    /// Waits for device accesses in flight; later accesses with its keys fail.
    /// EINVAL while memory windows are bound to it (IBA 10.6.7.2.6, as rxe);
    /// dropping it deregisters it anyway, and the windows reach nothing.
    pub fn dereg(mut self) -> Result<Option<MrBuffer>, Rejected<MemoryRegion>> {
        let path = match self.pd.ctx.device.destroy_path(Verb::DeregMr) {
            Ok(path) => path,
            Err(e) => return Err(Rejected::new(e, self)),
        };
        let windows = self.core.bound_windows();
        if windows > 0 && matches!(path, DestroyPath::Checked) {
            let e = Error::invalid(
                Verb::DeregMr,
                format!("{windows} memory window(s) are bound to the MR; invalidate or unbind them first"),
            );
            return Err(Rejected::new(e, self));
        }
        Ok(self.release())
    }

    fn release(&mut self) -> Option<MrBuffer> {
        if std::mem::replace(&mut self.released, true) {
            return None;
        }
        let mut st = self.core.write();
        self.pd.ctx.device.mrs.remove(st.key);
        st.valid = false;
        drop(st);
        // Same-host peers copy payloads straight from registered memory:
        // those already sent are copied before the memory goes back (an
        // owned buffer to the caller, foreign memory to its registrant).
        self.pd.ctx.device.engine.await_peer_copies(PEER_COPY_LIMIT);
        let mut st = self.core.write();
        let region = std::mem::replace(&mut st.region, Region::empty());
        drop(st);
        self.pd.users.remove();
        self.pd
            .ctx
            .ledger
            .remove(ResourceKind::Mr, self.core.handle);
        region.into_owned().map(MrBuffer::from_owned)
    }
}

/// Longest deregistration waits for same-host peers to copy what was sent
/// from the MR (see `Engine::await_peer_copies`).
const PEER_COPY_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

fn check_translation(verb: Verb, pd: &PdCore, addr: u64, len: usize, iova: u64) -> Result<()> {
    let max = pd.ctx.device.attr.max_mr_size;
    if len == 0 {
        return Err(Error::invalid(verb, "length is 0"));
    }
    if len as u64 > max {
        return Err(Error::invalid(
            verb,
            format!("length {len} exceeds max_mr_size {max:#x}"),
        ));
    }
    if (addr ^ iova) & 0xfff != 0 {
        return Err(Error::invalid(
            verb,
            format!(
                "iova {iova:#x} and address {addr:#x} differ in their offset within a 4 KiB page"
            ),
        ));
    }
    if iova.checked_add(len as u64).is_none() {
        return Err(Error::invalid(
            verb,
            format!("iova {iova:#x} + length {len} overflows"),
        ));
    }
    Ok(())
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        drop(self.release());
    }
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.core.read();
        f.debug_struct("MemoryRegion")
            .field("handle", &self.core.handle)
            .field("addr", &format_args!("{:#x}", st.region.addr()))
            .field("len", &st.region.len())
            .field("iova", &format_args!("{:#x}", st.iova))
            .field("access", &st.access)
            .field("pd", &self.pd.handle)
            .finish()
    }
}

enum NewMemory {
    Owned(MrBuffer),
    Foreign(Region),
    /// `foreign_memory` was given a NULL pointer: refused by `rereg`.
    Null,
}

impl NewMemory {
    fn addr_len(&self) -> (u64, usize) {
        match self {
            NewMemory::Owned(b) => (b.as_ptr() as u64, b.len()),
            NewMemory::Foreign(r) => (r.addr(), r.len()),
            NewMemory::Null => (0, 0),
        }
    }
}

/// What [`MemoryRegion::rereg`] changes; at least one of memory, access, PD.
#[derive(Default)]
#[must_use]
pub struct Rereg<'a> {
    pd: Option<&'a ProtectionDomain>,
    access: Option<AccessFlags>,
    memory: Option<NewMemory>,
}

impl<'a> Rereg<'a> {
    /// An empty request.
    pub fn new() -> Self {
        Self::default()
    }

    /// Move the MR to `pd` (same context) (`IBV_REREG_MR_CHANGE_PD`).
    pub fn pd(mut self, pd: &'a ProtectionDomain) -> Self {
        self.pd = Some(pd);
        self
    }

    /// New access flags (`IBV_REREG_MR_CHANGE_ACCESS`).
    pub fn access(mut self, access: AccessFlags) -> Self {
        self.access = Some(access);
        self
    }

    /// New memory for the MR to own, at its own address as the iova
    /// (`IBV_REREG_MR_CHANGE_TRANSLATION`).
    pub fn memory(mut self, buf: impl Into<MrBuffer>) -> Self {
        self.memory = Some(NewMemory::Owned(buf.into()));
        self
    }

    /// New memory the caller owns (`IBV_REREG_MR_CHANGE_TRANSLATION`).
    ///
    /// # Safety
    /// As for [`ProtectionDomain::reg_mr_raw`]. A NULL `addr` is refused.
    pub unsafe fn foreign_memory(mut self, addr: *mut u8, len: usize) -> Self {
        self.memory = Some(match NonNull::new(addr) {
            // SAFETY: the caller guarantees the range for the MR's lifetime.
            Some(p) => NewMemory::Foreign(unsafe { Region::foreign(p, len) }),
            None => NewMemory::Null,
        });
        self
    }

    /// Takes back the buffer given to [`memory`](Self::memory), if any.
    pub fn into_buffer(self) -> Option<MrBuffer> {
        match self.memory {
            Some(NewMemory::Owned(b)) => Some(b),
            _ => None,
        }
    }
}

impl fmt::Debug for Rereg<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rereg")
            .field("pd", &self.pd.map(|p| p.handle()))
            .field("access", &self.access)
            .field("memory", &self.memory.as_ref().map(NewMemory::addr_len))
            .finish()
    }
}
