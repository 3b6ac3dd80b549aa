//! Registered memory as the device sees it.
//!
//! This module owns four things:
//! - the device's key table ([`MrTable`]): random 32-bit keys, unique per
//!   device, so a peer cannot guess an rkey (lkey and rkey are the same
//!   value, as on rxe and mlx5). Keys are found by their upper 24 bits (the
//!   key's index, unique among MRs and memory windows) and the low 8 bits
//!   must match too: a memory window keeps its index and changes those 8
//!   bits (its tag) at each bind, as IBTA's keys are made;
//! - memory windows ([`MwCore`]): binding, invalidation, and the check a
//!   remote access through a window's rkey passes (its own range, rights,
//!   PD and, type 2, QP) before it goes on to the MR beneath
//!   ([`MrTable::resolve_remote`]);
//! - the one check every access goes through ([`MrState::check`]): key
//!   validity, protection domain, access flags, bounds and atomic alignment —
//!   used for local SGEs, remote requests and the owner's own
//!   `read_at`/`write_at` alike;
//! - the only code that touches registered memory ([`ReadWindow`],
//!   [`WriteWindow`], [`ForeignBytes`]).
//!
//! Registered memory is never handed out as a Rust reference in safe code,
//! and no two of the device's copies race: copies out of an MR run under its
//! read lock, copies into it (the owner's `write_at`, receives, READ
//! responses, remote writes and atomics) under its write lock — the borrow
//! checker enforces it, as a [`WriteWindow`] can only be made from
//! `&mut MrState`. Deregistration and re-registration take the write lock
//! too, so they wait for copies in flight and later lookups fail. Locks are
//! not reentrant: code that holds a window must not open another on any MR
//! (the transport always copies through a packet buffer, so it never needs
//! to).
//!
//! Foreign memory (registered through `reg_mr_raw`, as everything the C
//! drop-in registers) is the registrant's: it may write it at any time,
//! behind every lock. So it is only ever reached through raw pointer copies
//! (`ptr::copy`) and atomic read-modify-writes, never through a `&[u8]`: a
//! shared reference would promise the compiler bytes that do not change.
//! [`ReadWindow::into_bytes`] lends memory the MR owns as a slice (the
//! engine sends it straight from the MR) and foreign memory only as
//! [`ForeignBytes`], which can be copied out and nothing else.

use crate::soft::keymap::KeyMap;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::attr::AccessFlags;
use crate::wr::{MwBindInfo, MwType};

/// Memory an MR may own: what the safe API registers and hands back.
pub(crate) enum OwnedMemory {
    /// A heap allocation (the caller's `Vec` or boxed slice, or a small
    /// zeroed buffer).
    Heap(Box<[u8]>),
    /// A large zeroed buffer in its own mapping, on huge pages where the
    /// kernel has them ([`HugeBuffer`]).
    Huge(HugeBuffer),
}

impl OwnedMemory {
    /// `len` zero bytes: in a [`HugeBuffer`] from [`HUGE_BUFFER_MIN`] bytes
    /// on (on the heap if that mapping fails), on the heap below.
    pub(crate) fn zeroed(len: usize) -> OwnedMemory {
        if len >= HUGE_BUFFER_MIN {
            if let Some(huge) = HugeBuffer::zeroed(len) {
                return OwnedMemory::Huge(huge);
            }
        }
        OwnedMemory::Heap(vec![0; len].into_boxed_slice())
    }

    /// The bytes as a boxed slice (a copy for a [`HugeBuffer`]).
    pub(crate) fn into_boxed_slice(self) -> Box<[u8]> {
        match self {
            OwnedMemory::Heap(b) => b,
            OwnedMemory::Huge(h) => Box::from(&*h),
        }
    }
}

impl Default for OwnedMemory {
    fn default() -> Self {
        OwnedMemory::Heap(Box::default())
    }
}

impl From<Box<[u8]>> for OwnedMemory {
    fn from(b: Box<[u8]>) -> Self {
        OwnedMemory::Heap(b)
    }
}

impl Clone for OwnedMemory {
    fn clone(&self) -> Self {
        match self {
            OwnedMemory::Heap(b) => OwnedMemory::Heap(b.clone()),
            OwnedMemory::Huge(h) => match HugeBuffer::zeroed(h.len) {
                Some(mut copy) => {
                    copy.copy_from_slice(h);
                    OwnedMemory::Huge(copy)
                }
                None => OwnedMemory::Heap(Box::from(&**h)),
            },
        }
    }
}

impl std::ops::Deref for OwnedMemory {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            OwnedMemory::Heap(b) => b,
            OwnedMemory::Huge(h) => h,
        }
    }
}

impl std::ops::DerefMut for OwnedMemory {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            OwnedMemory::Heap(b) => b,
            OwnedMemory::Huge(h) => h,
        }
    }
}

/// Transparent huge pages are 2 MiB on x86-64 and on arm64's 4 KiB granule.
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// Zeroed buffers of at least this many bytes get a [`HugeBuffer`]: from
/// half a huge page on, the page rounded up to costs at most twice the
/// bytes asked for.
pub(crate) const HUGE_BUFFER_MIN: usize = HUGE_PAGE / 2;

/// Zeroed memory in an anonymous private mapping of its own, aligned to
/// [`HUGE_PAGE`], rounded up to whole huge pages and advised for
/// transparent huge pages (`MADV_HUGEPAGE`; on a kernel without them, or
/// with them off, plain pages). Why: a same-host peer copies registered
/// memory with cross-memory attach, and the kernel's walk of the source's
/// page tables costs as much as the copy on 4 KiB pages; on 2 MiB pages
/// the copy runs about twice as fast (see docs/design.md). The pages are
/// faulted in when it is made, as registration pins them on a NIC.
pub(crate) struct HugeBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a HugeBuffer owns its mapping exclusively (as a Box owns its
// allocation); it is read and written only through `&self`/`&mut self`.
unsafe impl Send for HugeBuffer {}
// SAFETY: as above; `&HugeBuffer` only reads.
unsafe impl Sync for HugeBuffer {}

impl HugeBuffer {
    /// A zeroed buffer of `len` bytes, or `None` if the kernel refuses the
    /// mapping (or `len` is 0 or absurd).
    pub(crate) fn zeroed(len: usize) -> Option<HugeBuffer> {
        use nix::sys::mman::{madvise, mmap_anonymous, munmap, MapFlags, MmapAdvise, ProtFlags};
        let map_len = len.checked_next_multiple_of(HUGE_PAGE)?;
        // One huge page more than needed, so an aligned start lies inside.
        let span = std::num::NonZeroUsize::new(map_len.checked_add(HUGE_PAGE)?)?;
        // SAFETY: a fresh private anonymous mapping at an address the kernel
        // picks: it aliases nothing.
        let base = unsafe {
            mmap_anonymous(
                None,
                span,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }
        .ok()?;
        let start = base.as_ptr() as usize;
        let head = start.next_multiple_of(HUGE_PAGE) - start;
        let tail = span.get() - head - map_len;
        // SAFETY: `head` bytes from the mapping's start and `tail` bytes at
        // its end are parts of the mapping made above that nothing uses;
        // what stays is `map_len` bytes at an aligned address.
        let aligned = unsafe {
            if head > 0 {
                let _ = munmap(base, head);
            }
            let aligned = base.byte_add(head);
            if tail > 0 {
                let _ = munmap(aligned.byte_add(map_len), tail);
            }
            aligned
        };
        // SAFETY: advice on the mapping this buffer owns, whose pages are not
        // yet touched; refused advice (no transparent huge pages in this
        // kernel) leaves plain pages, which work the same.
        let _ = unsafe { madvise(aligned, map_len, MmapAdvise::MADV_HUGEPAGE) };
        // Faulted in now, as registration pins pages on a NIC: a huge page's
        // first touch zeroes 2 MiB and may compact memory to find one, which
        // took tens of milliseconds in the first receive of a fresh MR on a
        // busy host (its peer's retransmission timer ran out meanwhile). A
        // kernel without MADV_POPULATE_WRITE (before 5.14) faults them in on
        // first touch instead.
        // SAFETY: as above; populating writes nothing a reader could see
        // (the pages read as zero before and after).
        let _ = unsafe { madvise(aligned, map_len, MmapAdvise::MADV_POPULATE_WRITE) };
        Some(HugeBuffer {
            ptr: aligned.cast(),
            len,
        })
    }

    /// The mapping's length: `len` rounded up to whole huge pages (which
    /// `zeroed` checked does not overflow).
    fn map_len(&self) -> usize {
        self.len.next_multiple_of(HUGE_PAGE)
    }
}

impl std::ops::Deref for HugeBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is inside the mapping this buffer owns,
        // readable and writable until Drop; `&self` rules out writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for HugeBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` rules out every other access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HugeBuffer {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `zeroed`, `map_len()` bytes at `ptr`,
        // unmapped once; nothing borrows it any more.
        let _ = unsafe { nix::sys::mman::munmap(self.ptr.cast(), self.map_len()) };
    }
}

/// Who owns a [`Region`]'s memory.
enum Owner {
    /// The registrant (`reg_mr_raw`), or nobody (an empty region).
    Registrant,
    /// The MR: a heap allocation, leaked while registered (a `Box` held in
    /// the region would claim unique access the device's copies break).
    Heap,
    /// The MR: a [`HugeBuffer`] (which holds a raw pointer, not a `Box`).
    Huge(HugeBuffer),
}

/// Where an MR's bytes live.
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
    owner: Owner,
}

// SAFETY: a Region is a pointer to memory that is either owned by the MR
// (a leaked Box, freed only by `into_owned`, or a HugeBuffer) or promised
// valid by the caller of the unsafe registration until deregistration. It is
// only read and written through window copies (and owned memory lent under
// the MR's read lock), so moving the pointer between threads or sharing it is
// sound.
unsafe impl Send for Region {}
// SAFETY: see `Send` above; shared access only performs raw copies.
unsafe impl Sync for Region {}

impl Region {
    /// Memory the MR owns from now on.
    pub(crate) fn owned(buf: impl Into<OwnedMemory>) -> Region {
        match buf.into() {
            OwnedMemory::Heap(buf) => {
                let len = buf.len();
                let raw: *mut [u8] = Box::into_raw(buf);
                Region {
                    // A Box pointer is never null.
                    ptr: NonNull::new(raw.cast::<u8>()).unwrap_or(NonNull::dangling()),
                    len,
                    owner: Owner::Heap,
                }
            }
            OwnedMemory::Huge(huge) => Region {
                ptr: huge.ptr,
                len: huge.len,
                owner: Owner::Huge(huge),
            },
        }
    }

    /// The caller's memory.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid for reads and writes until the Region is
    /// dropped or replaced, and must not be accessed through Rust references
    /// while the device may copy into it.
    pub(crate) unsafe fn foreign(ptr: NonNull<u8>, len: usize) -> Region {
        Region {
            ptr,
            len,
            owner: Owner::Registrant,
        }
    }

    /// A zero-length region that owns nothing (what a deregistered MR keeps).
    pub(crate) fn empty() -> Region {
        Region {
            ptr: NonNull::dangling(),
            len: 0,
            owner: Owner::Registrant,
        }
    }

    /// The start address.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the MR owns the memory.
    fn is_owned(&self) -> bool {
        !matches!(self.owner, Owner::Registrant)
    }

    /// Whether the memory is the registrant's, not the MR's.
    pub(crate) fn is_foreign(&self) -> bool {
        !self.is_owned() && self.len > 0
    }

    /// Gives owned memory back (and `None` for foreign memory).
    pub(crate) fn into_owned(mut self) -> Option<OwnedMemory> {
        self.take_owned()
    }

    /// Takes the owned allocation out, leaving the region owning nothing.
    fn take_owned(&mut self) -> Option<OwnedMemory> {
        match std::mem::replace(&mut self.owner, Owner::Registrant) {
            Owner::Registrant => None,
            Owner::Huge(huge) => Some(OwnedMemory::Huge(huge)),
            Owner::Heap => {
                let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
                // SAFETY: `raw` is exactly the pointer and length
                // `Box::into_raw` gave in `owned`, and clearing the owner
                // above makes this the only rebuild.
                Some(OwnedMemory::Heap(unsafe { Box::from_raw(raw) }))
            }
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        drop(self.take_owned());
    }
}

/// What an access wants to do with the memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AccessKind {
    /// The owner reads through `MemoryRegion::read_at`.
    CpuRead,
    /// The owner writes through `MemoryRegion::write_at`.
    CpuWrite,
    /// The device gathers from it (send SGE): always allowed.
    LocalRead,
    /// The device scatters into it (receive SGE, READ response): `LOCAL_WRITE`.
    LocalWrite,
    /// A peer's RDMA READ: `REMOTE_READ`.
    RemoteRead,
    /// A peer's RDMA WRITE: `REMOTE_WRITE`.
    RemoteWrite,
    /// A peer's atomic: `REMOTE_ATOMIC`, 8 bytes, 8-byte aligned.
    RemoteAtomic,
    /// A peer's RDMA READ through a memory window bound to the MR: the
    /// window granted the right and checked its own range
    /// ([`MrTable::resolve_remote`]); the MR's flags are not asked.
    WindowRead,
    /// A peer's RDMA WRITE through a memory window (as `WindowRead`).
    WindowWrite,
    /// A peer's atomic through a memory window: 8 bytes, 8-byte aligned.
    WindowAtomic,
    /// A peer's ATOMIC WRITE: `REMOTE_WRITE` (as rxe asks of it), 8 bytes,
    /// 8-byte aligned.
    RemoteAtomicWrite,
    /// A peer's ATOMIC WRITE through a memory window: 8 bytes, 8-byte
    /// aligned (the window granted `REMOTE_WRITE`).
    WindowAtomicWrite,
}

impl AccessKind {
    /// Whether the access writes the memory (and so needs a [`WriteWindow`]).
    pub(crate) fn writes(self) -> bool {
        matches!(
            self,
            AccessKind::CpuWrite
                | AccessKind::LocalWrite
                | AccessKind::RemoteWrite
                | AccessKind::RemoteAtomic
                | AccessKind::WindowWrite
                | AccessKind::WindowAtomic
                | AccessKind::RemoteAtomicWrite
                | AccessKind::WindowAtomicWrite
        )
    }

    /// Whether the access is an atomic (8 aligned bytes).
    fn is_atomic(self) -> bool {
        matches!(
            self,
            AccessKind::RemoteAtomic
                | AccessKind::WindowAtomic
                | AccessKind::RemoteAtomicWrite
                | AccessKind::WindowAtomicWrite
        )
    }

    /// The same access made through a memory window.
    fn through_window(self) -> AccessKind {
        match self {
            AccessKind::RemoteRead => AccessKind::WindowRead,
            AccessKind::RemoteWrite => AccessKind::WindowWrite,
            AccessKind::RemoteAtomic => AccessKind::WindowAtomic,
            AccessKind::RemoteAtomicWrite => AccessKind::WindowAtomicWrite,
            other => other,
        }
    }

    fn needs(self) -> AccessFlags {
        match self {
            AccessKind::CpuRead
            | AccessKind::CpuWrite
            | AccessKind::LocalRead
            | AccessKind::WindowRead
            | AccessKind::WindowWrite
            | AccessKind::WindowAtomic
            | AccessKind::WindowAtomicWrite => AccessFlags::empty(),
            AccessKind::LocalWrite => AccessFlags::LOCAL_WRITE,
            AccessKind::RemoteRead => AccessFlags::REMOTE_READ,
            AccessKind::RemoteWrite | AccessKind::RemoteAtomicWrite => AccessFlags::REMOTE_WRITE,
            AccessKind::RemoteAtomic => AccessFlags::REMOTE_ATOMIC,
        }
    }
}

/// Why an access was refused. The transport maps these to completion
/// statuses (local) or NAK codes (remote).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AccessError {
    /// No MR has this key (never had, or deregistered).
    #[error("no memory region has key {0:#010x}")]
    NoSuchKey(u32),
    /// The MR belongs to another protection domain.
    #[error("memory region is in PD {mr_pd}, the access comes from PD {pd}")]
    WrongPd {
        /// The MR's PD.
        mr_pd: u64,
        /// The accessor's PD.
        pd: u64,
    },
    /// The MR's access flags do not allow it.
    #[error("access needs {needed:?}, the memory region allows {allowed:?}")]
    Denied {
        /// The flag the access needs.
        needed: AccessFlags,
        /// What the MR allows.
        allowed: AccessFlags,
    },
    /// The range is not inside the MR.
    #[error("range {va:#x}+{len} is outside the memory region {start:#x}+{mr_len}")]
    OutOfBounds {
        /// Start of the access.
        va: u64,
        /// Its length.
        len: u64,
        /// Start of the MR.
        start: u64,
        /// Length of the MR.
        mr_len: u64,
    },
    /// A type 2 memory window bound to another QP than the one the access came on.
    #[error("memory window is bound to QP {mw_qpn:#x}, the access comes from QP {qpn:#x}")]
    WrongQp {
        /// The QP the window is bound to.
        mw_qpn: u32,
        /// The QP the access came on.
        qpn: u32,
    },
    /// An atomic on a range that is not 8 bytes at an 8-byte boundary.
    #[error("atomic access at {va:#x}+{len} is not 8 bytes at an 8-byte aligned address")]
    Misaligned {
        /// Start of the access.
        va: u64,
        /// Its length.
        len: u64,
    },
    /// A same-host peer's payload could not be read from its memory
    /// (`process_vm_readv` failed: the peer died, or freed the memory it
    /// sends from).
    #[error("the same-host peer's payload could not be read ({0})")]
    PeerMemory(nix::errno::Errno),
    /// Registered foreign memory its registrant unmapped while it was still
    /// registered (a use-after-free in the program).
    #[error("registered memory is no longer mapped ({0})")]
    Unmapped(nix::errno::Errno),
}

/// The mutable part of an MR: replaced by re-registration.
pub(crate) struct MrState {
    /// lkey and rkey.
    pub(crate) key: u32,
    pub(crate) region: Region,
    /// The address peers and SGEs use for the first byte.
    pub(crate) iova: u64,
    pub(crate) access: AccessFlags,
    /// Id of the PD it belongs to.
    pub(crate) pd: u64,
    /// False once deregistered.
    pub(crate) valid: bool,
}

impl MrState {
    /// The one check for every access: validity, PD, access flags, bounds,
    /// atomic alignment. Returns the byte offset of `va` in the region.
    pub(crate) fn check(
        &self,
        va: u64,
        len: u64,
        kind: AccessKind,
        pd: Option<u64>,
    ) -> Result<usize, AccessError> {
        if !self.valid {
            return Err(AccessError::NoSuchKey(self.key));
        }
        if let Some(pd) = pd {
            if pd != self.pd {
                return Err(AccessError::WrongPd { mr_pd: self.pd, pd });
            }
        }
        let needed = kind.needs();
        if !self.access.contains(needed) {
            return Err(AccessError::Denied {
                needed,
                allowed: self.access,
            });
        }
        let out_of_bounds = AccessError::OutOfBounds {
            va,
            len,
            start: self.iova,
            mr_len: self.region.len as u64,
        };
        let offset = va.checked_sub(self.iova).ok_or(out_of_bounds)?;
        let end = offset.checked_add(len).ok_or(out_of_bounds)?;
        if end > self.region.len as u64 {
            return Err(out_of_bounds);
        }
        if kind.is_atomic() && (len != 8 || va % 8 != 0) {
            return Err(AccessError::Misaligned { va, len });
        }
        Ok(offset as usize)
    }

    /// The start of `[va, va+len)` after [`check`](Self::check) passed.
    fn checked_ptr(
        &self,
        va: u64,
        len: usize,
        kind: AccessKind,
        pd: Option<u64>,
    ) -> Result<*mut u8, AccessError> {
        let offset = self.check(va, len as u64, kind, pd)?;
        // SAFETY: check() proved offset + len <= region.len, so the pointer
        // stays inside (or one past the end of) the region's allocation.
        Ok(unsafe { self.region.ptr.as_ptr().add(offset) })
    }

    /// A window to read `[va, va+len)`; `kind` must be a reading access.
    pub(crate) fn read_window(
        &self,
        va: u64,
        len: usize,
        kind: AccessKind,
        pd: Option<u64>,
    ) -> Result<ReadWindow<'_>, AccessError> {
        debug_assert!(!kind.writes());
        let ptr = self.checked_ptr(va, len, kind, pd)?;
        Ok(ReadWindow {
            ptr,
            len,
            owned: self.region.is_owned(),
            _state: PhantomData,
        })
    }

    /// [`read_window`](Self::read_window) through `key`, refusing a key the
    /// MR no longer has (re-keyed since it was looked up).
    pub(crate) fn keyed_read_window(
        &self,
        key: u32,
        va: u64,
        len: usize,
        kind: AccessKind,
        pd: Option<u64>,
    ) -> Result<ReadWindow<'_>, AccessError> {
        if self.key != key {
            return Err(AccessError::NoSuchKey(key));
        }
        self.read_window(va, len, kind, pd)
    }

    /// A window to write `[va, va+len)`. Needs `&mut self`: the MR's write lock.
    pub(crate) fn write_window(
        &mut self,
        va: u64,
        len: usize,
        kind: AccessKind,
        pd: Option<u64>,
    ) -> Result<WriteWindow<'_>, AccessError> {
        let ptr = self.checked_ptr(va, len, kind, pd)?;
        Ok(WriteWindow {
            ptr,
            len,
            foreign: self.region.is_foreign(),
            _state: PhantomData,
        })
    }
}

/// A checked range of registered memory to copy out of, valid while the MR's
/// read lock it borrows from is held: readers may share it, no writer can.
pub(crate) struct ReadWindow<'a> {
    ptr: *mut u8,
    len: usize,
    /// The MR owns the memory (nothing writes it under the read lock).
    owned: bool,
    _state: PhantomData<&'a MrState>,
}

/// A read window's bytes, as [`ReadWindow::into_bytes`] lends them.
pub(crate) enum WindowBytes<'a> {
    /// Memory the MR owns: written only under its write lock, so it can be
    /// borrowed while the read lock is held (and sent straight from).
    Owned(&'a [u8]),
    /// Memory the registrant may write at any time: only copied.
    Foreign(ForeignBytes<'a>),
}

/// A checked range of foreign registered memory, valid while the MR's read
/// lock is held. Its registrant may write it at any moment, so it offers no
/// reference to its bytes, only copies of them.
pub(crate) struct ForeignBytes<'a> {
    ptr: *const u8,
    len: usize,
    _state: PhantomData<&'a MrState>,
}

impl ForeignBytes<'_> {
    /// The address of its first byte in this process (for a same-host
    /// peer's cross-memory attach, which reads it as a DMA read would).
    pub(crate) fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies the start of the range into `dst`; returns bytes copied.
    pub(crate) fn copy_to(&self, dst: &mut [u8]) -> usize {
        copy_out(self.ptr, self.len, dst)
    }
}

/// A checked range of registered memory to copy into, valid while the MR's
/// write lock it borrows from is held: nothing else touches the MR meanwhile.
pub(crate) struct WriteWindow<'a> {
    ptr: *mut u8,
    len: usize,
    /// The registrant's memory, not the MR's (see `write_from_unfaulting`).
    foreign: bool,
    _state: PhantomData<&'a mut MrState>,
}

/// Copies the start of a window into `dst`; returns bytes copied.
fn copy_out(ptr: *const u8, len: usize, dst: &mut [u8]) -> usize {
    let n = dst.len().min(len);
    // SAFETY: `ptr..ptr+n` is inside the registered region (checked when the
    // window was made) and stays allocated while the MR lock behind the
    // window is held; no device write runs meanwhile (those need the write
    // lock). A foreign registrant may write its memory during the copy: the
    // copy is a raw one, no reference is formed, so at worst it copies a mix
    // of old and new bytes, as a DMA read would. Only foreign registrations
    // could overlap `dst`; `ptr::copy` allows that.
    unsafe { std::ptr::copy(ptr, dst.as_mut_ptr(), n) };
    n
}

impl WriteWindow<'_> {
    /// Fills the window through `fill`, given its start and length: for a
    /// copy made by the kernel (cross-memory attach from a same-host peer),
    /// which writes the MR's bytes as a DMA write would.
    pub(crate) fn fill_raw<R>(&mut self, fill: impl FnOnce(*mut u8, usize) -> R) -> R {
        fill(self.ptr, self.len)
    }
}

impl<'a> ReadWindow<'a> {
    /// Copies the start of the window into `dst`; returns bytes copied.
    pub(crate) fn read_into(&self, dst: &mut [u8]) -> usize {
        copy_out(self.ptr, self.len, dst)
    }

    /// The window's bytes, for as long as the read lock behind it is held:
    /// memory the MR owns as a slice (what the engine hands the kernel to
    /// send straight from the MR), foreign memory as bytes to copy.
    pub(crate) fn into_bytes(self) -> WindowBytes<'a> {
        if !self.owned {
            return WindowBytes::Foreign(ForeignBytes {
                ptr: self.ptr,
                len: self.len,
                _state: PhantomData,
            });
        }
        // SAFETY: `ptr..ptr+len` is inside the registered region (checked
        // when the window was made; `ptr` is never null), which stays
        // allocated while the MR read lock that `'a` borrows is held (dereg
        // and rereg take the write lock). The MR owns it, so nothing writes
        // it meanwhile: every write into it — the device's and the owner's
        // `write_at` — goes through a write window under the write lock.
        WindowBytes::Owned(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }
}

impl WriteWindow<'_> {
    /// Copies the start of the window into `dst`; returns bytes copied.
    pub(crate) fn read_into(&self, dst: &mut [u8]) -> usize {
        copy_out(self.ptr, self.len, dst)
    }

    /// Copies `src` into the start of the window; returns bytes copied.
    pub(crate) fn write_from(&mut self, src: &[u8]) -> usize {
        let n = src.len().min(self.len);
        // SAFETY: as in `copy_out`; the write lock behind the window excludes
        // every other access to the MR's memory through rverbs.
        unsafe { std::ptr::copy(src.as_ptr(), self.ptr, n) };
        n
    }

    /// Copies `src` into the start of the window as `write_from` does, but
    /// into foreign memory through the kernel (`process_vm_writev` on this
    /// process), so memory its registrant unmapped while registered is
    /// EFAULT, not a SIGSEGV that takes the process down. For receives the
    /// program may tear down carelessly (UCX frees its UD receive pool
    /// before it destroys the QP, and a late datagram then landed in
    /// unmapped memory); it costs a system call, so not for every copy.
    pub(crate) fn write_from_unfaulting(&mut self, src: &[u8]) -> Result<usize, nix::errno::Errno> {
        if !self.foreign {
            return Ok(self.write_from(src));
        }
        let n = src.len().min(self.len);
        // SAFETY: `ptr..ptr+n` is the checked window behind the MR's write
        // lock; the kernel writes it (or finds it unmapped: EFAULT).
        unsafe { crate::soft::sys::write_to_self(self.ptr, &src[..n]) }?;
        Ok(n)
    }

    /// The window's 8 bytes as one atomic word, for a remote atomic (`None`
    /// unless the window is 8 bytes at an 8-byte aligned address, which
    /// [`MrState::check`] ensures for atomics: the iova and the address
    /// share their offset in a page). A registrant that uses atomics on the
    /// word itself sees the device's read-modify-write whole.
    pub(crate) fn atomic_u64(&mut self) -> Option<&AtomicU64> {
        if self.len != 8 || !self.ptr.cast::<AtomicU64>().is_aligned() {
            return None;
        }
        // SAFETY: the 8 bytes are inside the registered region, aligned
        // (checked above), and stay allocated while the write lock behind
        // the window — which `&mut self` borrows for the reference's
        // lifetime — is held; no other rverbs access, atomic or not, runs
        // meanwhile (they need the MR's lock).
        Some(unsafe { AtomicU64::from_ptr(self.ptr.cast::<u64>()) })
    }
}

/// An MR as the device knows it.
pub(crate) struct MrCore {
    /// Handle of the MR (device-unique).
    pub(crate) handle: u64,
    state: RwLock<MrState>,
    /// Memory windows bound to it (deregistration waits for none).
    windows: AtomicU32,
}

impl MrCore {
    pub(crate) fn new(handle: u64, state: MrState) -> MrCore {
        MrCore {
            handle,
            state: RwLock::new(state),
            windows: AtomicU32::new(0),
        }
    }

    /// How many memory windows are bound to the MR.
    pub(crate) fn bound_windows(&self) -> u32 {
        self.windows.load(Ordering::Acquire)
    }

    /// Read access: copies run under it.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, MrState> {
        // MrState is never left half-updated: a panic elsewhere cannot poison meaning.
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The registered bytes as a slice, for as long as `self` is borrowed.
    ///
    /// # Safety
    /// Nothing may write the region while the slice lives (no device access
    /// with write permission, no owner write), and the region must not be
    /// replaced or released meanwhile (the caller's borrow rules that out).
    pub(crate) unsafe fn bytes(&self) -> &[u8] {
        let st = self.read();
        let (ptr, len) = (st.region.ptr, st.region.len);
        // SAFETY: ptr..ptr+len is one live allocation (an owned Box, or memory
        // the registrant promised valid) that outlives the borrow of `self`
        // per the caller's guarantee; the caller rules out writers.
        unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) }
    }

    /// The registered bytes as a mutable slice.
    ///
    /// # Safety
    /// As for [`bytes`](Self::bytes), and nothing else may read the region either.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self) -> &mut [u8] {
        let st = self.read();
        let (ptr, len) = (st.region.ptr, st.region.len);
        // SAFETY: as in `bytes`; the caller rules out every other access.
        unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), len) }
    }

    /// Write access: waits for in-flight copies.
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, MrState> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a key's index names: an MR or a memory window.
enum Keyed {
    Mr(Arc<MrCore>),
    Mw(Arc<MwCore>),
}

/// The key table's contents.
#[derive(Default)]
struct Keys {
    /// MRs and windows by their keys' index ([`key_index`]).
    by_index: KeyMap<Keyed>,
    /// MRs registered.
    mrs: usize,
    /// Windows allocated.
    mws: usize,
}

/// The part of a key the table finds it by: all but the low 8 bits (the
/// tag a memory window's bind changes).
fn key_index(key: u32) -> u32 {
    key >> 8
}

/// A remote access after [`MrTable::resolve_remote`]: the key, address
/// and kind to make it with — the rkey's own for an MR, the MR beneath
/// for a memory window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub(crate) key: u32,
    pub(crate) va: u64,
    pub(crate) kind: AccessKind,
}

/// The device's MRs and memory windows by key.
pub(crate) struct MrTable {
    keys: RwLock<Keys>,
    limit: usize,
    mw_limit: usize,
}

impl MrTable {
    /// A table of at most `limit` MRs and as many windows.
    #[cfg(test)]
    pub(crate) fn new(limit: usize) -> MrTable {
        MrTable::with_limits(limit, limit)
    }

    /// A table of at most `max_mr` MRs and `max_mw` windows.
    pub(crate) fn with_limits(max_mr: usize, max_mw: usize) -> MrTable {
        MrTable {
            keys: RwLock::new(Keys::default()),
            limit: max_mr,
            mw_limit: max_mw,
        }
    }

    fn keys_read(&self) -> RwLockReadGuard<'_, Keys> {
        self.keys.read().unwrap_or_else(|p| p.into_inner())
    }

    fn keys_write(&self) -> RwLockWriteGuard<'_, Keys> {
        self.keys.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of registered MRs.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.keys_read().mrs
    }

    /// Registers an MR under a fresh key (written into `state.key`). When the
    /// table is full (`max_mr`) the state comes back.
    pub(crate) fn insert(&self, handle: u64, mut state: MrState) -> Result<Arc<MrCore>, MrState> {
        let mut keys = self.keys_write();
        if keys.mrs >= self.limit {
            return Err(state);
        }
        let key = fresh_key(&keys.by_index);
        state.key = key;
        let mr = Arc::new(MrCore::new(handle, state));
        keys.by_index.insert(key_index(key), Keyed::Mr(mr.clone()));
        keys.mrs += 1;
        Ok(mr)
    }

    /// Gives `mr` a fresh key (re-registration), retiring `old`. Returns the new key.
    pub(crate) fn rekey(&self, mr: &Arc<MrCore>, old: u32) -> u32 {
        let mut keys = self.keys_write();
        if matches!(keys.by_index.get(&key_index(old)), Some(Keyed::Mr(m)) if Arc::ptr_eq(m, mr)) {
            keys.by_index.remove(&key_index(old));
        }
        let key = fresh_key(&keys.by_index);
        keys.by_index.insert(key_index(key), Keyed::Mr(mr.clone()));
        key
    }

    /// Forgets an MR's key: later lookups fail.
    pub(crate) fn remove(&self, key: u32) {
        let mut keys = self.keys_write();
        if let Some(Keyed::Mr(_)) = keys.by_index.get(&key_index(key)) {
            keys.by_index.remove(&key_index(key));
            keys.mrs -= 1;
        }
    }

    /// The MR `key` names, to open windows on under its read lock
    /// ([`MrState::keyed_read_window`]).
    pub(crate) fn mr(&self, key: u32) -> Result<Arc<MrCore>, AccessError> {
        self.lookup(key)
    }

    /// The MR whose key has `key`'s index; its callers compare the whole
    /// key under the MR's lock (it may have been re-keyed meanwhile).
    fn lookup(&self, key: u32) -> Result<Arc<MrCore>, AccessError> {
        match self.keys_read().by_index.get(&key_index(key)) {
            Some(Keyed::Mr(mr)) => Ok(mr.clone()),
            _ => Err(AccessError::NoSuchKey(key)),
        }
    }

    /// Checks an access to `[va, va+len)` through `key` without moving data.
    pub(crate) fn check_access(
        &self,
        key: u32,
        va: u64,
        len: u64,
        kind: AccessKind,
        pd: Option<u64>,
    ) -> Result<(), AccessError> {
        let mr = self.lookup(key)?;
        let state = mr.read();
        if state.key != key {
            return Err(AccessError::NoSuchKey(key));
        }
        state.check(va, len, kind, pd).map(|_| ())
    }

    /// Looks `key` up, checks a reading access and runs `f` on the window
    /// while the MR cannot be written, deregistered or re-registered. `f`
    /// must not open another window.
    pub(crate) fn read<R>(
        &self,
        key: u32,
        va: u64,
        len: usize,
        kind: AccessKind,
        pd: Option<u64>,
        f: impl FnOnce(ReadWindow<'_>) -> R,
    ) -> Result<R, AccessError> {
        let mr = self.lookup(key)?;
        // The key is checked again under the lock: re-keyed since the lookup?
        let state = mr.read();
        Ok(f(state.keyed_read_window(key, va, len, kind, pd)?))
    }

    /// Looks `key` up, checks a writing access and runs `f` on the window
    /// while nothing else can touch the MR. `f` must not open another window.
    pub(crate) fn write<R>(
        &self,
        key: u32,
        va: u64,
        len: usize,
        kind: AccessKind,
        pd: Option<u64>,
        f: impl FnOnce(WriteWindow<'_>) -> R,
    ) -> Result<R, AccessError> {
        let mr = self.lookup(key)?;
        let mut state = mr.write();
        if state.key != key {
            return Err(AccessError::NoSuchKey(key));
        }
        Ok(f(state.write_window(va, len, kind, pd)?))
    }

    // ---- memory windows ---------------------------------------------------

    /// Allocates a memory window of type `ty` in PD `pd` under a fresh
    /// rkey (type 1 valid and unbound, type 2 free); `None` when `max_mw`
    /// windows exist.
    pub(crate) fn alloc_mw(&self, handle: u64, ty: MwType, pd: u64) -> Option<Arc<MwCore>> {
        let mut keys = self.keys_write();
        if keys.mws >= self.mw_limit {
            return None;
        }
        let rkey = fresh_key(&keys.by_index);
        let mw = Arc::new(MwCore {
            handle,
            ty,
            pd,
            index: key_index(rkey),
            state: Mutex::new(MwState {
                rkey,
                binding: None,
                allocated: true,
            }),
        });
        keys.by_index.insert(key_index(rkey), Keyed::Mw(mw.clone()));
        keys.mws += 1;
        Some(mw)
    }

    /// Deallocates `mw`: its key stops working and a bound window lets its
    /// MR go (a bound type 2 window too, as rxe).
    pub(crate) fn dealloc_mw(&self, mw: &Arc<MwCore>) {
        {
            let mut keys = self.keys_write();
            if matches!(keys.by_index.get(&mw.index), Some(Keyed::Mw(m)) if Arc::ptr_eq(m, mw)) {
                keys.by_index.remove(&mw.index);
                keys.mws -= 1;
            }
        }
        let mut st = mw.lock();
        st.allocated = false;
        st.unbind();
    }

    /// The window `rkey`'s index names (its whole key is checked under its lock).
    fn window(&self, rkey: u32) -> Result<Arc<MwCore>, MwError> {
        match self.keys_read().by_index.get(&key_index(rkey)) {
            Some(Keyed::Mw(mw)) => Ok(mw.clone()),
            Some(Keyed::Mr(_)) => Err(MwError::IsMr(rkey)),
            None => Err(MwError::NoSuchWindow(rkey)),
        }
    }

    /// Binds the window whose rkey has `mw_rkey`'s index to `info` for a
    /// bind WR posted on QP `qpn` of PD `pd`, with `rkey`'s low 8 bits as
    /// its new tag (IBTA 10.6.7, as rxe checks it). Returns the window's
    /// new rkey.
    pub(crate) fn bind_mw(
        &self,
        mw_rkey: u32,
        rkey: u32,
        info: &MwBindInfo,
        pd: u64,
        qpn: u32,
    ) -> Result<u32, MwError> {
        let mw = self.window(mw_rkey)?;
        let mr = if info.length > 0 {
            Some(
                self.lookup(info.mr_lkey)
                    .map_err(|_| MwError::NoSuchMr(info.mr_lkey))?,
            )
        } else {
            None
        };
        let mut st = mw.lock();
        // The window is found by its key's index, whatever the tag: as
        // mlx5 finds it (rxe also wants the tag current, which a program
        // that binds type 2 windows by send WR must then copy into its
        // ibv_mw after each bind).
        if !st.allocated {
            return Err(MwError::NoSuchWindow(mw_rkey));
        }
        let zero_based = info.access.contains(AccessFlags::ZERO_BASED);
        match mw.ty {
            MwType::Type1 if zero_based => return Err(MwError::ZeroBasedType1),
            MwType::Type1 => {}
            MwType::Type2 => {
                if st.binding.is_some() {
                    return Err(MwError::NotFree);
                }
                if pd != mw.pd {
                    return Err(MwError::WrongPd { mw_pd: mw.pd, pd });
                }
                if mr.is_none() {
                    return Err(MwError::ZeroLengthType2);
                }
            }
        }
        let binding = match mr {
            None => None,
            Some(mr) => {
                let ms = mr.read();
                if !ms.valid || ms.key != info.mr_lkey {
                    return Err(MwError::NoSuchMr(info.mr_lkey));
                }
                if ms.pd != mw.pd {
                    return Err(MwError::WrongPd {
                        mw_pd: mw.pd,
                        pd: ms.pd,
                    });
                }
                if !ms.access.contains(AccessFlags::MW_BIND) {
                    return Err(MwError::MrNotBindable);
                }
                let writes = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
                if info.access.intersects(writes) && !ms.access.contains(AccessFlags::LOCAL_WRITE) {
                    return Err(MwError::MrNotWritable);
                }
                let mr_len = ms.region.len() as u64;
                let inside = if zero_based {
                    info.length <= mr_len
                } else {
                    info.addr >= ms.iova
                        && info
                            .addr
                            .checked_add(info.length)
                            .is_some_and(|end| end - ms.iova <= mr_len)
                };
                if !inside {
                    return Err(MwError::OutsideMr {
                        addr: info.addr,
                        length: info.length,
                        iova: ms.iova,
                        mr_len,
                    });
                }
                drop(ms);
                mr.windows.fetch_add(1, Ordering::AcqRel);
                Some(MwBinding {
                    mr,
                    mr_key: info.mr_lkey,
                    addr: info.addr,
                    length: info.length,
                    access: info.access
                        & (AccessFlags::REMOTE_READ
                            | AccessFlags::REMOTE_WRITE
                            | AccessFlags::REMOTE_ATOMIC),
                    zero_based,
                    qpn: (mw.ty == MwType::Type2).then_some(qpn),
                })
            }
        };
        st.unbind();
        st.binding = binding;
        st.rkey = (st.rkey & !0xff) | (rkey & 0xff);
        Ok(st.rkey)
    }

    /// Invalidates the type 2 window `rkey` names, in PD `pd`: locally
    /// (`qpn` `None`, a LOCAL_INV WR) or for a peer's SEND with Invalidate
    /// arriving on QP `qpn`, which must be the window's. An MR's rkey is
    /// refused: this device has no fast-registered MRs (rxe refuses user
    /// MRs too).
    pub(crate) fn invalidate(&self, rkey: u32, pd: u64, qpn: Option<u32>) -> Result<(), MwError> {
        let mw = self.window(rkey)?;
        let mut st = mw.lock();
        if !st.allocated || st.rkey != rkey {
            return Err(MwError::NoSuchWindow(rkey));
        }
        if mw.ty == MwType::Type1 {
            return Err(MwError::Type1Invalidated);
        }
        if mw.pd != pd {
            return Err(MwError::WrongPd { mw_pd: mw.pd, pd });
        }
        let Some(bound) = &st.binding else {
            return Err(MwError::NotBound(rkey));
        };
        if let Some(q) = qpn {
            if bound.qpn != Some(q) {
                return Err(MwError::WrongQp {
                    mw_qpn: bound.qpn.unwrap_or(0),
                    qpn: q,
                });
            }
        }
        st.unbind();
        Ok(())
    }

    /// Resolves a peer's access of `kind` to `[va, va+len)` through `rkey`,
    /// arriving on QP `qpn` of PD `pd`. An MR's rkey resolves to itself
    /// (the MR's own check follows when the access is made); a bound
    /// window's is checked here — its key, PD, QP (type 2), rights and
    /// range — and resolves to the MR beneath, at the address the window
    /// maps `va` to, with a `Window*` kind. O(1): one table lookup.
    pub(crate) fn resolve_remote(
        &self,
        rkey: u32,
        va: u64,
        len: u64,
        kind: AccessKind,
        pd: u64,
        qpn: u32,
    ) -> Result<Resolved, AccessError> {
        // The table stays read-locked while the window's lock is taken
        // (nothing takes them the other way round): no Arc clone per packet.
        let keys = self.keys_read();
        match keys.by_index.get(&key_index(rkey)) {
            Some(Keyed::Mw(mw)) => mw.resolve(rkey, va, len, kind, pd, qpn),
            _ => Ok(Resolved {
                key: rkey,
                va,
                kind,
            }),
        }
    }
}

#[cfg(test)]
impl MrTable {
    /// The owner's copy into an MR, for tests.
    pub(crate) fn write_for_test(&self, key: u32, va: u64, data: &[u8]) {
        self.write(key, va, data.len(), AccessKind::CpuWrite, None, |mut w| {
            w.write_from(data);
        })
        .expect("test write in bounds");
    }

    /// The owner's copy out of an MR, for tests.
    pub(crate) fn read_for_test(&self, key: u32, va: u64, out: &mut [u8]) {
        self.read(key, va, out.len(), AccessKind::CpuRead, None, |w| {
            w.read_into(out);
        })
        .expect("test read in bounds");
    }
}

/// Why a memory window bind or invalidation was refused (the WR completes
/// with `MW_BIND_ERR` or `LOC_QP_OP_ERR`; a peer's SEND with Invalidate is
/// NAKed invalid request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MwError {
    /// No allocated window has this rkey now.
    #[error("no memory window has rkey {0:#010x}")]
    NoSuchWindow(u32),
    /// The key is an MR's, which cannot be bound or invalidated here.
    #[error("rkey {0:#010x} is a memory region's, not a window's")]
    IsMr(u32),
    /// No MR has the bind's lkey.
    #[error("no memory region has lkey {0:#010x}")]
    NoSuchMr(u32),
    /// A type 2 window is bound already (it must be invalidated first).
    #[error("a type 2 memory window must be free (invalidated) to be bound")]
    NotFree,
    /// A zero-length bind of a type 2 window (only type 1 unbinds so).
    #[error("a type 2 memory window cannot be bound to zero bytes")]
    ZeroLengthType2,
    /// A zero-based type 1 window.
    #[error("a type 1 memory window cannot be zero-based")]
    ZeroBasedType1,
    /// The window, the QP or the MR are in different PDs.
    #[error("the memory window is in PD {mw_pd}, the QP or MR in PD {pd}")]
    WrongPd {
        /// The window's PD.
        mw_pd: u64,
        /// The other object's.
        pd: u64,
    },
    /// The MR was registered without `MW_BIND`.
    #[error("the memory region was registered without IBV_ACCESS_MW_BIND")]
    MrNotBindable,
    /// A window peers may write into an MR without `LOCAL_WRITE`.
    #[error("a window with remote write or atomic access needs an MR with LOCAL_WRITE")]
    MrNotWritable,
    /// The window does not lie inside the MR.
    #[error("window {addr:#x}+{length} is outside the memory region {iova:#x}+{mr_len}")]
    OutsideMr {
        /// Start of the window.
        addr: u64,
        /// Its length.
        length: u64,
        /// Start of the MR.
        iova: u64,
        /// Length of the MR.
        mr_len: u64,
    },
    /// Type 1 windows are not invalidated (IBTA o10-37.2.26).
    #[error("a type 1 memory window cannot be invalidated")]
    Type1Invalidated,
    /// The window is not bound.
    #[error("memory window {0:#010x} is not bound")]
    NotBound(u32),
    /// A peer's invalidation of a type 2 window bound to another QP.
    #[error("the memory window is bound to QP {mw_qpn:#x}, not {qpn:#x}")]
    WrongQp {
        /// The QP the window is bound to.
        mw_qpn: u32,
        /// The QP the request came on.
        qpn: u32,
    },
}

/// A memory window as the device knows it.
pub(crate) struct MwCore {
    /// Handle (device-unique).
    pub(crate) handle: u64,
    pub(crate) ty: MwType,
    /// Id of its PD.
    pub(crate) pd: u64,
    /// Its keys' index: fixed, only the tag changes.
    index: u32,
    state: Mutex<MwState>,
}

/// A window's mutable part.
struct MwState {
    rkey: u32,
    /// What it is bound to (`None`: a type 1 window not bound, a type 2
    /// window free).
    binding: Option<MwBinding>,
    /// False once deallocated.
    allocated: bool,
}

/// What a bound window covers.
struct MwBinding {
    /// The MR beneath (counted in its `windows`).
    mr: Arc<MrCore>,
    /// The MR's key at bind time: a re-keyed MR is no longer reached.
    mr_key: u32,
    addr: u64,
    length: u64,
    /// Remote rights only.
    access: AccessFlags,
    /// Peers address offsets from `addr`.
    zero_based: bool,
    /// Type 2: the QP it was bound on, the only one it serves.
    qpn: Option<u32>,
}

impl MwState {
    /// Drops the binding, letting its MR go.
    fn unbind(&mut self) {
        if let Some(old) = self.binding.take() {
            old.mr.windows.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl MwCore {
    fn lock(&self) -> MutexGuard<'_, MwState> {
        // MwState is never left half-updated.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The window's rkey now.
    pub(crate) fn rkey(&self) -> u32 {
        self.lock().rkey
    }

    /// Whether the window is bound (type 1) or valid (type 2).
    pub(crate) fn is_bound(&self) -> bool {
        self.lock().binding.is_some()
    }

    /// See [`MrTable::resolve_remote`].
    fn resolve(
        &self,
        rkey: u32,
        va: u64,
        len: u64,
        kind: AccessKind,
        pd: u64,
        qpn: u32,
    ) -> Result<Resolved, AccessError> {
        let st = self.lock();
        let Some(b) = st
            .binding
            .as_ref()
            .filter(|_| st.allocated && st.rkey == rkey)
        else {
            return Err(AccessError::NoSuchKey(rkey));
        };
        if pd != self.pd {
            return Err(AccessError::WrongPd { mr_pd: self.pd, pd });
        }
        if let Some(mw_qpn) = b.qpn {
            if mw_qpn != qpn {
                return Err(AccessError::WrongQp { mw_qpn, qpn });
            }
        }
        let needed = kind.needs();
        if needed.is_empty() || !b.access.contains(needed) {
            return Err(AccessError::Denied {
                needed,
                allowed: b.access,
            });
        }
        let start = if b.zero_based { 0 } else { b.addr };
        let out_of_bounds = AccessError::OutOfBounds {
            va,
            len,
            start,
            mr_len: b.length,
        };
        let offset = va.checked_sub(start).ok_or(out_of_bounds)?;
        let end = offset.checked_add(len).ok_or(out_of_bounds)?;
        if end > b.length {
            return Err(out_of_bounds);
        }
        // A zero-based window's base address was never range-checked (as
        // rxe): a peer's offset must not overflow it.
        let va = b.addr.checked_add(offset).ok_or(out_of_bounds)?;
        Ok(Resolved {
            key: b.mr_key,
            va,
            kind: kind.through_window(),
        })
    }
}

/// A random key whose index is not in use: neither 0 nor all ones, which
/// some programs treat as "no key".
fn fresh_key<V>(taken: &KeyMap<V>) -> u32 {
    loop {
        let k = random_u32();
        if k != 0 && k != u32::MAX && !taken.contains_key(&key_index(k)) {
            return k;
        }
    }
}

pub(crate) fn random_u32() -> u32 {
    match getrandom::u32() {
        Ok(v) => v,
        Err(e) => {
            // getrandom(2) only fails before the kernel's pool is seeded; wait for it.
            warn_once!("getrandom failed ({e}); retrying");
            std::thread::yield_now();
            random_u32()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    fn table_with(access: AccessFlags, len: usize) -> (MrTable, Arc<MrCore>, u32) {
        let t = MrTable::new(16);
        let mr = t
            .insert(
                1,
                MrState {
                    key: 0,
                    region: Region::owned(vec![0u8; len].into_boxed_slice()),
                    iova: 0x1000,
                    access,
                    pd: 7,
                    valid: true,
                },
            )
            .ok()
            .unwrap();
        let key = mr.read().key;
        (t, mr, key)
    }

    #[test]
    fn remote_write_then_local_read_round_trip() {
        let (t, _mr, key) = table_with(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE, 64);
        t.write(key, 0x1010, 4, AccessKind::RemoteWrite, Some(7), |mut w| {
            assert_eq!(w.write_from(b"abcd"), 4)
        })
        .unwrap();
        let mut out = [0u8; 4];
        t.read(key, 0x1010, 4, AccessKind::LocalRead, Some(7), |w| {
            w.read_into(&mut out)
        })
        .unwrap();
        assert_eq!(&out, b"abcd");
        let mut back = [0u8; 2];
        t.write(key, 0x1011, 2, AccessKind::LocalWrite, Some(7), |w| {
            w.read_into(&mut back)
        })
        .unwrap();
        assert_eq!(&back, b"bc");
    }

    #[test]
    fn every_check_refuses_what_it_must() {
        let (t, _mr, key) = table_with(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ, 64);
        let nop = |_: ReadWindow<'_>| ();
        let wnop = |_: WriteWindow<'_>| ();
        assert_eq!(
            t.read(key ^ 1, 0x1000, 1, AccessKind::RemoteRead, Some(7), nop),
            Err(AccessError::NoSuchKey(key ^ 1))
        );
        assert!(matches!(
            t.read(key, 0x1000, 1, AccessKind::RemoteRead, Some(8), nop),
            Err(AccessError::WrongPd { mr_pd: 7, pd: 8 })
        ));
        assert!(matches!(
            t.write(key, 0x1000, 1, AccessKind::RemoteWrite, Some(7), wnop),
            Err(AccessError::Denied { .. })
        ));
        assert!(matches!(
            t.write(key, 0x1000, 8, AccessKind::RemoteAtomic, Some(7), wnop),
            Err(AccessError::Denied { .. })
        ));
        for (va, len) in [(0xfff, 1), (0x1000, 65), (0x1040, 1), (u64::MAX, 2)] {
            assert!(
                matches!(
                    t.read(key, va, len, AccessKind::RemoteRead, Some(7), nop),
                    Err(AccessError::OutOfBounds { .. })
                ),
                "{va:#x}+{len}"
            );
        }
        // Edges are inside: the last byte and an empty access at the end.
        t.read(key, 0x103f, 1, AccessKind::RemoteRead, Some(7), nop)
            .unwrap();
        t.read(key, 0x1040, 0, AccessKind::RemoteRead, Some(7), nop)
            .unwrap();
    }

    #[test]
    fn atomics_need_eight_aligned_bytes() {
        let (t, _mr, key) = table_with(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC, 64);
        let nop = |_: WriteWindow<'_>| ();
        t.write(key, 0x1008, 8, AccessKind::RemoteAtomic, None, nop)
            .unwrap();
        assert!(matches!(
            t.write(key, 0x1004, 8, AccessKind::RemoteAtomic, None, nop),
            Err(AccessError::Misaligned { .. })
        ));
        assert!(matches!(
            t.write(key, 0x1008, 4, AccessKind::RemoteAtomic, None, nop),
            Err(AccessError::Misaligned { .. })
        ));
    }

    #[test]
    fn an_atomic_write_needs_remote_write_and_eight_aligned_bytes() {
        let nop = |_: WriteWindow<'_>| ();
        // REMOTE_ATOMIC is not what it needs: rxe checks REMOTE_WRITE.
        let (t, _mr, key) = table_with(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC, 64);
        assert!(matches!(
            t.write(key, 0x1008, 8, AccessKind::RemoteAtomicWrite, None, nop),
            Err(AccessError::Denied {
                needed: AccessFlags::REMOTE_WRITE,
                ..
            })
        ));
        let (t, _mr, key) = table_with(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE, 64);
        t.write(key, 0x1008, 8, AccessKind::RemoteAtomicWrite, None, nop)
            .unwrap();
        for (va, len) in [(0x1004, 8), (0x1008, 4), (0x1008, 16)] {
            assert!(
                matches!(
                    t.write(key, va, len, AccessKind::RemoteAtomicWrite, None, nop),
                    Err(AccessError::Misaligned { .. })
                ),
                "{va:#x}+{len}"
            );
        }
        // Bounds come before alignment (rxe: an rkey violation first).
        assert!(matches!(
            t.write(key, 0x1044, 8, AccessKind::RemoteAtomicWrite, None, nop),
            Err(AccessError::OutOfBounds { .. })
        ));
    }

    #[test]
    fn removed_and_rekeyed_keys_stop_working() {
        let (t, mr, key) = table_with(AccessFlags::LOCAL_WRITE, 8);
        let nop = |_: WriteWindow<'_>| ();
        let new_key = t.rekey(&mr, key);
        mr.write().key = new_key;
        assert_ne!(new_key, key);
        assert!(t
            .write(key, 0x1000, 1, AccessKind::LocalWrite, None, nop)
            .is_err());
        t.write(new_key, 0x1000, 1, AccessKind::LocalWrite, None, nop)
            .unwrap();
        t.remove(new_key);
        assert_eq!(t.len(), 0);
        assert!(t
            .write(new_key, 0x1000, 1, AccessKind::LocalWrite, None, nop)
            .is_err());
    }

    fn state() -> MrState {
        MrState {
            key: 0,
            region: Region::owned(vec![0u8; 1].into_boxed_slice()),
            iova: 0,
            access: AccessFlags::empty(),
            pd: 0,
            valid: true,
        }
    }

    #[test]
    fn table_limit_hands_the_state_back() {
        let t = MrTable::new(2);
        assert!(t.insert(0, state()).is_ok());
        assert!(t.insert(0, state()).is_ok());
        let back = t.insert(0, state()).err().expect("table is full");
        assert_eq!(back.region.len(), 1);
    }

    #[test]
    fn keys_are_unique_and_spread() {
        let t = MrTable::new(10_000);
        let mut keys = std::collections::HashSet::new();
        for _ in 0..2000 {
            let mr = t.insert(0, state()).ok().unwrap();
            assert!(keys.insert(mr.read().key));
        }
        // Keys are random, not counted: their upper halves take every bit.
        let high_bits_seen = keys.iter().fold(0u32, |acc, k| acc | (k >> 16));
        assert_eq!(high_bits_seen, 0xffff);
    }

    /// Foreign memory is lent only as bytes to copy; owned memory as a
    /// slice; atomics on either are one read-modify-write on the word.
    #[test]
    fn foreign_memory_is_only_copied_and_atomics_are_atomic() {
        let words = [AtomicU64::new(0x0102_0304_0506_0708), AtomicU64::new(5)];
        let ptr = NonNull::new(words.as_ptr().cast::<u8>().cast_mut()).unwrap();
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC;
        let mut foreign = MrState {
            key: 1,
            // SAFETY: `words` outlives the state and is only accessed
            // through atomics meanwhile.
            region: unsafe { Region::foreign(ptr, 16) },
            iova: ptr.as_ptr() as u64,
            access,
            pd: 0,
            valid: true,
        };
        let va = foreign.iova;
        let w = foreign
            .read_window(va, 16, AccessKind::LocalRead, None)
            .unwrap();
        match w.into_bytes() {
            WindowBytes::Foreign(bytes) => {
                let mut out = [0u8; 16];
                assert_eq!(bytes.copy_to(&mut out), 16);
                assert_eq!(out[..8], 0x0102_0304_0506_0708u64.to_ne_bytes());
            }
            WindowBytes::Owned(_) => panic!("foreign memory lent as a slice"),
        }
        let mut w = foreign
            .write_window(va + 8, 8, AccessKind::RemoteAtomic, None)
            .unwrap();
        assert_eq!(w.atomic_u64().unwrap().fetch_add(3, Ordering::SeqCst), 5);
        assert_eq!(words[1].load(Ordering::SeqCst), 8);
        let mut odd = foreign
            .write_window(va + 1, 8, AccessKind::LocalWrite, None)
            .unwrap();
        assert!(odd.atomic_u64().is_none(), "unaligned");
        drop(foreign);

        let owned = state();
        let w = owned
            .read_window(0, 1, AccessKind::LocalRead, None)
            .unwrap();
        assert!(matches!(w.into_bytes(), WindowBytes::Owned(b) if b == [0]));
    }

    /// The `/proc/self/smaps` lines of the mapping of this process that
    /// holds `addr`.
    fn smaps_of(addr: usize) -> Vec<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut block: Option<Vec<String>> = None;
        for line in smaps.lines() {
            let range = line.split_once(' ').and_then(|(r, _)| r.split_once('-'));
            let bounds = range.and_then(|(lo, hi)| {
                Some((
                    usize::from_str_radix(lo, 16).ok()?,
                    usize::from_str_radix(hi, 16).ok()?,
                ))
            });
            if let Some((lo, hi)) = bounds {
                if block.is_some() {
                    break;
                }
                if (lo..hi).contains(&addr) {
                    block = Some(Vec::new());
                }
            } else if let Some(b) = &mut block {
                b.push(line.to_string());
            }
        }
        block.unwrap_or_else(|| panic!("no mapping holds {addr:#x}"))
    }

    /// A `smaps` field of a mapping, in kB.
    fn smaps_kb(block: &[String], field: &str) -> u64 {
        block
            .iter()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {block:?}"))
    }

    #[test]
    fn a_large_zeroed_buffer_gets_an_aligned_mapping_advised_for_huge_pages() {
        let mut big = OwnedMemory::zeroed(HUGE_BUFFER_MIN + 5);
        let OwnedMemory::Huge(huge) = &big else {
            panic!(
                "a buffer of {} bytes stayed on the heap",
                HUGE_BUFFER_MIN + 5
            )
        };
        let addr = huge.as_ptr() as usize;
        assert_eq!(
            addr % HUGE_PAGE,
            0,
            "{addr:#x} is not on a huge page boundary"
        );
        assert_eq!(huge.map_len(), HUGE_PAGE);
        assert_eq!(big.len(), HUGE_BUFFER_MIN + 5);
        let block = smaps_of(addr);
        // `hg`: the kernel took MADV_HUGEPAGE for the mapping (it has
        // transparent huge pages whenever /sys says so).
        if std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            let flags = block
                .iter()
                .find_map(|l| l.strip_prefix("VmFlags:"))
                .unwrap();
            assert!(flags.split(' ').any(|f| f == "hg"), "VmFlags: {flags}");
        }
        // Faulted in already, none of it read or written yet.
        assert_eq!(
            smaps_kb(&block, "Rss"),
            (HUGE_PAGE / 1024) as u64,
            "{block:?}"
        );
        assert!(big.iter().all(|&b| b == 0));
        let last = big.len() - 1;
        big[last] = 7;
        let copy = big.clone();
        assert!(matches!(copy, OwnedMemory::Huge(_)));
        assert_eq!(&*copy, &*big);
        let boxed = copy.into_boxed_slice();
        assert_eq!(boxed.len(), HUGE_BUFFER_MIN + 5);
        assert_eq!(boxed[last], 7);

        let small = OwnedMemory::zeroed(HUGE_BUFFER_MIN - 1);
        assert!(matches!(small, OwnedMemory::Heap(_)));
    }

    #[test]
    fn a_huge_buffer_goes_through_a_region_and_back() {
        let mut big = OwnedMemory::zeroed(3 * HUGE_PAGE);
        big[HUGE_PAGE] = 42;
        let addr = big.as_ptr() as u64;
        let r = Region::owned(big);
        assert_eq!((r.addr(), r.len()), (addr, 3 * HUGE_PAGE));
        assert!(!r.is_foreign());
        let back = r.into_owned().unwrap();
        assert!(matches!(back, OwnedMemory::Huge(_)));
        assert_eq!((back.as_ptr() as u64, back[HUGE_PAGE]), (addr, 42));
    }

    #[test]
    fn owned_region_comes_back_intact() {
        let r = Region::owned(vec![1, 2, 3].into_boxed_slice());
        assert_eq!(r.len(), 3);
        assert_eq!(&*r.into_owned().unwrap(), &[1, 2, 3]);
        let mut backing = [9u8; 4];
        // SAFETY: `backing` outlives the region and is not otherwise used meanwhile.
        let f = unsafe { Region::foreign(NonNull::new(backing.as_mut_ptr()).unwrap(), 4) };
        assert!(f.into_owned().is_none());
    }
}
