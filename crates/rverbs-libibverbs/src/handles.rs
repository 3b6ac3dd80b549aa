//! The handles C holds and the wrappers behind them, with what every
//! object module shares to get from one to the other.
//!
//! Every C object is the first field of a `#[repr(C)]` wrapper, so a C
//! pointer is a pointer to its wrapper. A C `ibv_device` starts a
//! [`Device`] that lives as long as the process (devices do not come and go
//! under a program); a C `ibv_context` sits inside the `verbs_context` that
//! starts a [`Context`], which owns the rverbs context and is freed by
//! `ibv_close_device` alone — objects made through it keep what they need,
//! as in libibverbs. The wrappers of PDs, MRs, MWs, channels, CQs, QPs, SRQs
//! and AHs own their rverbs object (`rust`, an `Option` so a refused destroy can
//! put it back; a completion channel's behind a mutex too, since a thread may
//! wait on it while another destroys it); the rverbs object's `user_data` is
//! the C pointer: async events and completion events name the C object
//! through it. Destroyed channels' memory is kept a while ([`Retired`]).
//!
//! This module owns those wrappers, the lookups from a C pointer to its
//! wrapper or rverbs object (`*_ref`), and the destroy and counter plumbing;
//! the verbs on each object are in that object's module.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::ffi::c_int;
use std::mem::offset_of;
use std::ptr;
use std::sync::atomic::{AtomicI32, AtomicU32};
use std::sync::{Condvar, Mutex};

use rverbs::{
    AddressHandle, AsyncEvent, CompletionChannel, CompletionQueue, CqEvent, MemoryRegion,
    MemoryWindow, ProtectionDomain, QueuePair, SendFlags, SharedReceiveQueue, WorkCompletion,
    WrOpcode,
};
use rverbs_ibverbs_abi::abi::*;

use crate::convert::SgeVec;

// ---- devices and contexts ----------------------------------------------

/// A device as C sees it: `ibv` first, so a `*mut ibv_device` is a
/// `*mut Device`.
#[repr(C)]
pub(crate) struct Device {
    pub(crate) ibv: ibv_device,
    pub(crate) rust: rverbs::Device,
}

// SAFETY: the C struct holds only inline strings and integers (its two
// pointers are always null); the rverbs device is Send + Sync.
unsafe impl Send for Device {}
// SAFETY: as above; nothing in it is mutated after creation.
unsafe impl Sync for Device {}

/// The `Device` behind a C pointer handed out by `ibv_get_device_list`.
///
/// # Safety
/// `device` must be null or such a pointer.
pub(crate) unsafe fn device_ref<'a>(device: *mut ibv_device) -> Option<&'a Device> {
    // SAFETY: the caller passes a pointer this library made from a leaked
    // `Device` (whose first field is the ibv_device), or null.
    unsafe { device.cast::<Device>().as_ref() }
}

/// A context as C sees it: the `verbs_context` (whose last member is the
/// `ibv_context` C programs hold) first.
#[repr(C)]
pub(crate) struct Context {
    pub(crate) vctx: verbs_context,
    pub(crate) rust: rverbs::Context,
    /// Async events read and not yet acknowledged: each is acknowledged to
    /// rverbs (dropped) by `ibv_ack_async_event`.
    pub(crate) pending: Mutex<VecDeque<AsyncEvent>>,
    /// `cmd_fd`: the kernel's libibverbs talks to the device through an
    /// open `/dev/infiniband/uverbsN`; rverbs has none, and gives an inert
    /// descriptor of the context's own (an eventfd), so a program may
    /// `dup`, poll or close-on-exec it as it would the real one. No
    /// command goes through it; `ibv_import_device` on it is EOPNOTSUPP.
    pub(crate) cmd_fd: std::os::fd::OwnedFd,
}

/// The `Context` around a C context pointer.
///
/// # Safety
/// `ctx` must be null or a context this library opened and not closed.
pub(crate) unsafe fn context_ref<'a>(ctx: *mut ibv_context) -> Option<&'a Context> {
    if ctx.is_null() {
        return None;
    }
    let at = offset_of!(Context, vctx) + offset_of!(verbs_context, context);
    // SAFETY: the caller passes the `context` member of a live Context's
    // verbs_context: stepping back by its offset gives the Context.
    unsafe { ctx.cast::<u8>().sub(at).cast::<Context>().as_ref() }
}

// ---- the wrapper plumbing ----------------------------------------------

/// The wrapper behind a C object pointer.
///
/// # Safety
/// `p` must be null or point at the C struct at the start of a live `W`
/// this library made.
pub(crate) unsafe fn wrapper<'a, C, W>(p: *mut C) -> Option<&'a W> {
    // SAFETY: per the caller, `p` is null or the first field of a live `W`.
    unsafe { p.cast::<W>().as_ref() }
}

/// Destroys the rverbs object in `slot` without taking it out first: if the
/// destroy is refused, other threads may go on using the object (destroying
/// a PD with MRs, or a CQ with QPs, is a legal EBUSY while another thread
/// polls). The destroy runs on a bitwise copy; refused, the copy is
/// forgotten and the slot is untouched; done, the slot is emptied without a
/// drop (the copy was consumed).
///
/// # Safety
/// `slot` must be the `rust` field of a live wrapper that no other thread
/// destroys at the same time.
pub(crate) unsafe fn destroy_in_place<T, K>(
    slot: *mut Option<T>,
    destroy: impl FnOnce(T) -> Result<K, rverbs::Rejected<T>>,
) -> Result<(), c_int> {
    // SAFETY: per the caller, a live field.
    let Some(obj) = (unsafe { (*slot).as_ref() }) else {
        return Err(libc::EINVAL);
    };
    // SAFETY: a bitwise copy; exactly one of it and the original is
    // dropped or consumed below.
    let copy = unsafe { ptr::read(obj) };
    match destroy(copy) {
        Ok(_) => {
            // SAFETY: the original was consumed through its copy: overwrite
            // it without dropping.
            unsafe { ptr::write(slot, None) };
            Ok(())
        }
        Err(rejected) => {
            let (e, copy) = rejected.into_parts();
            std::mem::forget(copy);
            Err(e.errno())
        }
    }
}

/// Destroys the wrapper at `p` (C's object pointer): its rverbs object
/// (the `rust` field `slot` points at) through `destroy`, then the wrapper.
/// 0, or the errno with everything left as it was.
///
/// # Safety
/// `p` must be null or a live wrapper this library made with
/// `Box::into_raw`, destroyed by no other thread at the same time.
pub(crate) unsafe fn destroy_wrapper<W, T, K>(
    p: *mut W,
    slot: impl FnOnce(*mut W) -> *mut Option<T>,
    destroy: impl FnOnce(T) -> Result<K, rverbs::Rejected<T>>,
) -> c_int {
    if p.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: per the caller, a live wrapper's field.
    match unsafe { destroy_in_place(slot(p), destroy) } {
        Ok(()) => {
            // SAFETY: made by Box::into_raw; this is its one free.
            drop(unsafe { Box::from_raw(p) });
            0
        }
        Err(errno) => errno,
    }
}

/// An event counter of a C object (`comp_events_completed`,
/// `events_completed` …), updated atomically.
pub(crate) fn counter<'a>(at: *mut u32) -> &'a AtomicU32 {
    // SAFETY: `at` is a live, aligned counter field of a C object this
    // library made; it is only ever accessed through this atomic view here.
    unsafe { AtomicU32::from_ptr(at) }
}

// ---- protection domains and memory regions -----------------------------

/// `ibv_pd` and its rverbs PD.
#[repr(C)]
pub(crate) struct Pd {
    pub(crate) ibv: ibv_pd,
    pub(crate) rust: Option<ProtectionDomain>,
}

/// The rverbs PD behind a C PD.
///
/// # Safety
/// `pd` must be null or a live PD from `ibv_alloc_pd`.
pub(crate) unsafe fn pd_ref<'a>(pd: *mut ibv_pd) -> Option<&'a ProtectionDomain> {
    // SAFETY: per the caller.
    unsafe { wrapper::<_, Pd>(pd) }.and_then(|w| w.rust.as_ref())
}

/// `ibv_mr` and its rverbs MR.
#[repr(C)]
pub(crate) struct Mr {
    /// C reads it; rereg writes it (interior mutability).
    pub(crate) ibv: UnsafeCell<ibv_mr>,
    pub(crate) rust: Option<MemoryRegion>,
}

/// `ibv_mw` and its rverbs window.
#[repr(C)]
pub(crate) struct Mw {
    /// `rkey` changes with each `ibv_bind_mw` (interior mutability).
    pub(crate) ibv: UnsafeCell<ibv_mw>,
    pub(crate) rust: Option<MemoryWindow>,
}

// ---- completion channels and queues ------------------------------------

/// `ibv_comp_channel` and its rverbs channel.
#[repr(C)]
pub(crate) struct Channel {
    /// `refcnt` is updated atomically (interior mutability).
    pub(crate) ibv: UnsafeCell<ibv_comp_channel>,
    /// The channel; `None` once `ibv_destroy_comp_channel` has run. A
    /// thread waiting in `ibv_get_cq_event` holds a clone of its own and
    /// goes on waiting, as a `read` of libibverbs' descriptor blocked in
    /// the kernel does.
    pub(crate) rust: Mutex<Option<CompletionChannel>>,
}

// SAFETY: the C struct's one pointer, `context`, is only ever handed back
// to C, never dereferenced through a channel; its `refcnt` is accessed
// atomically (`refcnt`); the rverbs channel is behind a mutex.
unsafe impl Send for Channel {}

impl Channel {
    /// The channel, unless destroyed.
    pub(crate) fn handle(&self) -> Option<CompletionChannel> {
        crate::ffi::lock(&self.rust).clone()
    }
}

/// How many destroyed channels of one kind a [`Retired`] keeps.
const RETIRED_CHANNELS: usize = 64;

/// How long a call with a destroyed channel waits before it fails (see
/// [`Retired`]).
const DESTROYED_CHANNEL_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Destroyed channels (completion or connection-manager event channels),
/// newest last, whose memory is freed only [`RETIRED_CHANNELS`] destroys
/// later.
///
/// Programs race here: rping as Debian 12 ships it destroys its channels
/// and returns from `main` while its event thread may be between two calls
/// that wait on a channel, and the next call then reads freed memory. With
/// the C libraries that thread usually already sleeps in the kernel's
/// `read`; here a late call finds the channel destroyed, waits
/// [`DESTROYED_CHANNEL_GRACE`] (an exiting process is gone by then; see
/// [`destroyed_channel`]) and fails with EBADF instead of crashing.
pub(crate) struct Retired<T>(Mutex<VecDeque<Shell<T>>>);

/// A destroyed channel's memory, freed when dropped. Held as a pointer,
/// not a `Box`: threads that called in before the destroy may still hold
/// references into it.
struct Shell<T>(std::ptr::NonNull<T>);

// SAFETY: a shell only ever frees its allocation (see Drop), from whichever
// thread evicts it; `T: Send` makes that drop sound on any thread.
unsafe impl<T: Send> Send for Shell<T> {}

impl<T> Drop for Shell<T> {
    fn drop(&mut self) {
        // SAFETY: made by `Box::into_raw` and kept once (`Retired::keep`'s
        // contract); freed here, its one free, RETIRED_CHANNELS destroys
        // after its own.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

impl<T> Retired<T> {
    /// An empty list.
    pub(crate) const fn new() -> Retired<T> {
        Retired(Mutex::new(VecDeque::new()))
    }

    /// Keeps `shell` (a destroyed channel's memory) for a while, then
    /// frees it.
    ///
    /// # Safety
    /// `shell` comes from `Box::into_raw`, is not freed elsewhere, and is
    /// kept once.
    pub(crate) unsafe fn keep(&self, shell: *mut T) {
        let Some(shell) = std::ptr::NonNull::new(shell) else {
            return;
        };
        let evicted = {
            let mut retired = crate::ffi::lock(&self.0);
            retired.push_back(Shell(shell));
            (retired.len() > RETIRED_CHANNELS).then(|| retired.pop_front())
        };
        // Freed outside the lock.
        drop(evicted);
    }
}

/// A call with a destroyed channel: see [`Retired`]. Returns the errno,
/// EBADF.
pub(crate) fn destroyed_channel() -> c_int {
    std::thread::sleep(DESTROYED_CHANNEL_GRACE);
    libc::EBADF
}

/// A channel's `refcnt`, updated atomically (CQs may be made and destroyed
/// from several threads).
pub(crate) fn refcnt<'a>(channel: *mut ibv_comp_channel) -> &'a AtomicI32 {
    // SAFETY: `channel` is live (callers checked); the int is aligned and
    // only ever accessed through this atomic view by this library.
    unsafe { AtomicI32::from_ptr(ptr::addr_of_mut!((*channel).refcnt)) }
}

/// `ibv_cq` — always allocated as the `ibv_cq_ex` the extended API uses,
/// whose leading fields are an `ibv_cq`'s — and its rverbs CQ, with the
/// completion events read and not yet acknowledged.
#[repr(C)]
pub(crate) struct Cq {
    /// Counters, `cqe`, `wr_id`/`status` change after creation (interior
    /// mutability: written through raw pointers while `&Cq`s exist).
    pub(crate) ibv: UnsafeCell<ibv_cq_ex>,
    pub(crate) rust: Option<CompletionQueue>,
    /// Completion events `ibv_get_cq_event` read, until `ibv_ack_cq_events`.
    pub(crate) pending: Mutex<VecDeque<CqEvent>>,
    /// Notified by `ibv_ack_cq_events`; `ibv_destroy_cq` waits on it.
    pub(crate) acked: Condvar,
    /// Its device: once it is disassociated with RDMAV_ALLOW_DISASSOC_DESTROY
    /// set, destroy skips waiting for acknowledgements, as libibverbs does.
    pub(crate) device: rverbs::Device,
    /// The completion `start_poll`/`next_poll` took (extended API).
    pub(crate) current: Mutex<WorkCompletion>,
}

/// The rverbs CQ behind a C CQ.
///
/// # Safety
/// `cq` must be null or a live CQ from `ibv_create_cq`.
pub(crate) unsafe fn cq_ref<'a>(cq: *mut ibv_cq) -> Option<&'a CompletionQueue> {
    // SAFETY: per the caller.
    unsafe { wrapper::<_, Cq>(cq) }.and_then(|w| w.rust.as_ref())
}

// ---- queue pairs -------------------------------------------------------

/// `ibv_qp` (inside the `ibv_qp_ex` the extended API uses) and its rverbs
/// QP, with the batch of work requests the `wr_*` calls are building.
#[repr(C)]
pub(crate) struct Qp {
    /// `state` and the `wr_*` fields change after creation (interior
    /// mutability: written through raw pointers, by C and by this library,
    /// while `&Qp`s exist).
    pub(crate) ibv: UnsafeCell<ibv_qp_ex>,
    pub(crate) rust: Option<QueuePair>,
    /// Created with send ops (`ibv_create_qp_ex`): `ibv_qp_to_qp_ex` gives
    /// the `ibv_qp_ex`.
    pub(crate) extended: bool,
    /// `sq_sig_all` as created (ibv_query_qp reports it).
    pub(crate) sq_sig_all: bool,
    /// Held from `wr_start` to `wr_complete` / `wr_abort`: the extended
    /// API's critical section, one thread at a time per QP.
    pub(crate) wr_owner: std::sync::atomic::AtomicBool,
    /// The work requests the `wr_*` calls are building.
    pub(crate) batch: Mutex<Batch>,
}

/// Work requests between `wr_start` and `wr_complete` (`qp_ex.rs`).
#[derive(Default)]
pub(crate) struct Batch {
    pub(crate) open: bool,
    pub(crate) wrs: Vec<PendingWr>,
    /// A builder call came without a WR to apply to, or with bad values:
    /// `wr_complete` fails with this.
    pub(crate) error: Option<c_int>,
}

/// One work request of a batch.
pub(crate) struct PendingWr {
    pub(crate) wr_id: u64,
    pub(crate) flags: SendFlags,
    pub(crate) opcode: WrOpcode,
    pub(crate) sges: SgeVec,
    pub(crate) inline: Option<Vec<u8>>,
    pub(crate) ud: Option<(*mut ibv_ah, u32, u32)>,
}

/// The rverbs QP behind a C QP.
///
/// # Safety
/// `qp` must be null or a live QP from `ibv_create_qp*`.
pub(crate) unsafe fn qp_ref<'a>(qp: *mut ibv_qp) -> Option<&'a QueuePair> {
    // SAFETY: per the caller: a live QP from ibv_create_qp, or NULL.
    unsafe { wrapper::<_, Qp>(qp) }.and_then(|w| w.rust.as_ref())
}

// ---- shared receive queues and address handles -------------------------

/// `ibv_srq` and its rverbs SRQ.
#[repr(C)]
pub(crate) struct Srq {
    /// `events_completed` changes after creation (interior mutability).
    pub(crate) ibv: UnsafeCell<ibv_srq>,
    pub(crate) rust: Option<SharedReceiveQueue>,
}

/// The rverbs SRQ behind a C SRQ.
///
/// # Safety
/// `srq` must be null or a live SRQ from `ibv_create_srq`.
pub(crate) unsafe fn srq_ref<'a>(srq: *mut ibv_srq) -> Option<&'a SharedReceiveQueue> {
    // SAFETY: per the caller: a live SRQ from ibv_create_srq, or NULL.
    unsafe { wrapper::<_, Srq>(srq) }.and_then(|w| w.rust.as_ref())
}

/// `ibv_ah` and its rverbs AH.
#[repr(C)]
pub(crate) struct Ah {
    pub(crate) ibv: ibv_ah,
    pub(crate) rust: Option<AddressHandle>,
}

/// The rverbs AH behind a C AH.
///
/// # Safety
/// `ah` must be null or a live AH from `ibv_create_ah*`.
pub(crate) unsafe fn ah_ref<'a>(ah: *mut ibv_ah) -> Option<&'a AddressHandle> {
    // SAFETY: per the caller: a live AH from ibv_create_ah*, or NULL.
    unsafe { wrapper::<_, Ah>(ah) }.and_then(|w| w.rust.as_ref())
}
