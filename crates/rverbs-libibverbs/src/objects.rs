//! PDs, MRs, completion channels and CQs as C objects.
//!
//! Each C object is the first field of a `#[repr(C)]` wrapper that owns the
//! rverbs object (`rust`, an `Option` so a refused destroy can put it
//! back), so a C pointer is a pointer to its wrapper. The rverbs object's
//! `user_data` is the C pointer: async events and completion events name
//! the C object through it.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::ffi::{c_int, c_uint, c_void};
use std::ptr;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};

use rverbs::{
    AccessFlags, CompletionChannel, CompletionQueue, CqEvent, MemoryRegion, ProtectionDomain,
    WorkCompletion,
};
use rverbs_ibverbs_abi::abi::*;

use crate::device::context_ref;
use crate::ffi::{errno_of, guard, neg, null, set_errno};

/// Fills the ops slots the inline wrappers of verbs.h call.
pub(crate) fn fill_ops(ops: &mut ibv_context_ops) {
    ops.poll_cq = Some(poll_cq);
    ops.req_notify_cq = Some(req_notify_cq);
    crate::qp::fill_ops(ops);
}

/// Locks, shrugging off poisoning (a panic elsewhere was already turned
/// into an errno).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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

// ---- protection domains -----------------------------------------------

/// `ibv_pd` and its rverbs PD.
#[repr(C)]
pub(crate) struct Pd {
    pub(crate) ibv: ibv_pd,
    pub(crate) rust: Option<ProtectionDomain>,
}

/// The wrapper behind a C object pointer.
///
/// # Safety
/// `p` must be null or point at the C struct at the start of a live `W`
/// this library made.
pub(crate) unsafe fn wrapper<'a, C, W>(p: *mut C) -> Option<&'a W> {
    // SAFETY: per the caller, `p` is null or the first field of a live `W`.
    unsafe { p.cast::<W>().as_ref() }
}

export! { "IBVERBS_1.1"
    /// `ibv_alloc_pd`.
    pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
        guard(ptr::null_mut(), || {
            // SAFETY: a context this library opened, or NULL.
            let Some(ctx) = (unsafe { context_ref(context) }) else {
                return null(libc::EINVAL);
            };
            match ctx.rust.alloc_pd() {
                Ok(pd) => {
                    let ibv = ibv_pd {
                        context,
                        handle: pd.handle() as u32,
                    };
                    Box::into_raw(Box::new(Pd { ibv, rust: Some(pd) })).cast()
                }
                Err(e) => null(errno_of(&e)),
            }
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_dealloc_pd`: 0, or EBUSY while MRs, QPs, SRQs or AHs use it.
    pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: a PD from ibv_alloc_pd (or NULL), not yet deallocated.
            unsafe {
                destroy_wrapper(pd.cast::<Pd>(), |w| ptr::addr_of_mut!((*w).rust), ProtectionDomain::dealloc)
            }
        })
    }
}

/// The rverbs PD behind a C PD.
///
/// # Safety
/// `pd` must be null or a live PD from `ibv_alloc_pd`.
pub(crate) unsafe fn pd_ref<'a>(pd: *mut ibv_pd) -> Option<&'a ProtectionDomain> {
    // SAFETY: per the caller.
    unsafe { wrapper::<_, Pd>(pd) }.and_then(|w| w.rust.as_ref())
}

// ---- memory regions ---------------------------------------------------

/// `ibv_mr` and its rverbs MR.
#[repr(C)]
pub(crate) struct Mr {
    /// C reads it; rereg writes it (interior mutability).
    pub(crate) ibv: UnsafeCell<ibv_mr>,
    pub(crate) rust: Option<MemoryRegion>,
}

/// Access flags as rverbs takes them: the optional-range bits (hints a
/// device may ignore) dropped, unknown bits refused.
fn access_flags(access: c_uint) -> Option<AccessFlags> {
    let access = access & !AccessFlags::OPTIONAL_RANGE.bits();
    AccessFlags::from_bits(access)
}

fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard(ptr::null_mut(), || {
        // SAFETY: a PD from ibv_alloc_pd, or NULL.
        let Some(rust_pd) = (unsafe { pd_ref(pd) }) else {
            return null(libc::EINVAL);
        };
        let Some(flags) = access_flags(access) else {
            return null(libc::EINVAL);
        };
        // rdma-core 44's ibv_reg_mr marks the range don't-fork, which makes
        // a later ibv_fork_init too late.
        RANGE_CALLED.store(true, Ordering::Relaxed);
        // SAFETY: as ibv_reg_mr's contract says, the program keeps
        // addr..addr+length mapped and leaves it to the device until it
        // deregisters the MR (which C programs do before freeing).
        let mr = unsafe { rust_pd.reg_mr_raw(addr.cast(), length, iova, flags) };
        match mr {
            Ok(mr) => {
                // SAFETY: pd is live (checked above); its context is set.
                let context = unsafe { (*pd).context };
                let ibv = ibv_mr {
                    context,
                    pd,
                    addr,
                    length,
                    handle: mr.handle() as u32,
                    lkey: mr.lkey(),
                    rkey: mr.rkey(),
                };
                Box::into_raw(Box::new(Mr {
                    ibv: UnsafeCell::new(ibv),
                    rust: Some(mr),
                }))
                .cast()
            }
            Err(e) => null(errno_of(&e)),
        }
    })
}

export! { "IBVERBS_1.1"
    /// `ibv_reg_mr` (the function; verbs.h's macro calls
    /// `ibv_reg_mr_iova2` when the flags are not constant).
    pub unsafe extern "C" fn ibv_reg_mr(
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        access: c_int,
    ) -> *mut ibv_mr {
        reg_mr(pd, addr, length, addr as u64, access as c_uint)
    }
}

export! { "IBVERBS_1.7"
    /// `ibv_reg_mr_iova`.
    pub unsafe extern "C" fn ibv_reg_mr_iova(
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        iova: u64,
        access: c_int,
    ) -> *mut ibv_mr {
        reg_mr(pd, addr, length, iova, access as c_uint)
    }
}

export! { "IBVERBS_1.8"
    /// `ibv_reg_mr_iova2`.
    pub unsafe extern "C" fn ibv_reg_mr_iova2(
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        iova: u64,
        access: c_uint,
    ) -> *mut ibv_mr {
        reg_mr(pd, addr, length, iova, access)
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_dereg_mr`.
    pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: an MR from ibv_reg_mr* (or NULL), not yet
            // deregistered. (Foreign memory: no buffer comes back.)
            unsafe {
                destroy_wrapper(mr.cast::<Mr>(), |w| ptr::addr_of_mut!((*w).rust), MemoryRegion::dereg)
            }
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_rereg_mr`: new memory (`IBV_REREG_MR_CHANGE_TRANSLATION`, at its
    /// own address as the iova), PD and/or access flags; the MR gets new
    /// keys. 0, or IBV_REREG_MR_ERR_INPUT (-1) for bad arguments and
    /// IBV_REREG_MR_ERR_CMD (-4) when the device refused, with errno set.
    pub unsafe extern "C" fn ibv_rereg_mr(
        mr: *mut ibv_mr,
        flags: c_int,
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        access: c_int,
    ) -> c_int {
        const CHANGE_TRANSLATION: c_int = 1;
        const CHANGE_PD: c_int = 1 << 1;
        const CHANGE_ACCESS: c_int = 1 << 2;
        const ERR_INPUT: c_int = -1;
        const ERR_CMD: c_int = -4;
        let input = |errno| {
            set_errno(errno);
            ERR_INPUT
        };
        guard(ERR_CMD, || {
            if mr.is_null() || flags == 0 || flags & !(CHANGE_TRANSLATION | CHANGE_PD | CHANGE_ACCESS) != 0 {
                return input(libc::EINVAL);
            }
            let w = mr.cast::<Mr>();
            // SAFETY: an MR from ibv_reg_mr*; libibverbs leaves it to the
            // program not to use the MR elsewhere during a rereg.
            let Some(rust) = (unsafe { (*w).rust.as_mut() }) else {
                return input(libc::EINVAL);
            };
            let mut req = rverbs::Rereg::new();
            if flags & CHANGE_PD != 0 {
                // SAFETY: a PD from ibv_alloc_pd, or NULL.
                let Some(p) = (unsafe { pd_ref(pd) }) else {
                    return input(libc::EINVAL);
                };
                req = req.pd(p);
            }
            if flags & CHANGE_ACCESS != 0 {
                let Some(a) = access_flags(access as c_uint) else {
                    return input(libc::EINVAL);
                };
                req = req.access(a);
            }
            if flags & CHANGE_TRANSLATION != 0 {
                RANGE_CALLED.store(true, Ordering::Relaxed);
                // SAFETY: as for ibv_reg_mr: the program keeps the new range
                // mapped and leaves it to the device until deregistration.
                req = unsafe { req.foreign_memory(addr.cast(), length) };
            }
            match rust.rereg(req) {
                Ok(_) => {
                    // SAFETY: the MR is live; its C fields follow the change.
                    unsafe {
                        (*mr).lkey = rust.lkey();
                        (*mr).rkey = rust.rkey();
                        if flags & CHANGE_TRANSLATION != 0 {
                            (*mr).addr = addr;
                            (*mr).length = length;
                        }
                        if flags & CHANGE_PD != 0 {
                            (*mr).pd = pd;
                        }
                    }
                    0
                }
                Err(rejected) => {
                    let errno = rejected.error().errno();
                    set_errno(errno);
                    if errno == libc::EINVAL {
                        ERR_INPUT
                    } else {
                        ERR_CMD
                    }
                }
            }
        })
    }
}

// ---- completion channels ----------------------------------------------

/// `ibv_comp_channel` and its rverbs channel.
#[repr(C)]
pub(crate) struct Channel {
    /// `refcnt` is updated atomically (interior mutability).
    pub(crate) ibv: UnsafeCell<ibv_comp_channel>,
    pub(crate) rust: Option<CompletionChannel>,
}

export! { "IBVERBS_1.0"
    /// `ibv_create_comp_channel`: `fd` is a real, pollable descriptor a
    /// program may make non-blocking; `refcnt` counts its CQs.
    pub unsafe extern "C" fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
        guard(ptr::null_mut(), || {
            // SAFETY: a context this library opened, or NULL.
            let Some(ctx) = (unsafe { context_ref(context) }) else {
                return null(libc::EINVAL);
            };
            match ctx.rust.create_comp_channel() {
                Ok(ch) => {
                    use std::os::fd::AsRawFd;
                    let ibv = ibv_comp_channel {
                        context,
                        fd: ch.as_raw_fd(),
                        refcnt: 0,
                    };
                    Box::into_raw(Box::new(Channel {
                        ibv: UnsafeCell::new(ibv),
                        rust: Some(ch),
                    }))
                    .cast()
                }
                Err(e) => null(errno_of(&e)),
            }
        })
    }
}

export! { "IBVERBS_1.0"
    /// `ibv_destroy_comp_channel`: EBUSY (returned) while CQs use it.
    pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
        guard(libc::EIO, || {
            if channel.is_null() {
                return libc::EINVAL;
            }
            if refcnt(channel).load(Ordering::Acquire) != 0 {
                return libc::EBUSY;
            }
            // SAFETY: a channel from ibv_create_comp_channel, not destroyed.
            unsafe {
                destroy_wrapper(
                    channel.cast::<Channel>(),
                    |w| ptr::addr_of_mut!((*w).rust),
                    CompletionChannel::destroy,
                )
            }
        })
    }
}

/// A channel's `refcnt`, updated atomically (CQs may be made and destroyed
/// from several threads).
fn refcnt<'a>(channel: *mut ibv_comp_channel) -> &'a AtomicI32 {
    // SAFETY: `channel` is live (callers checked); the int is aligned and
    // only ever accessed through this atomic view by this library.
    unsafe { AtomicI32::from_ptr(ptr::addr_of_mut!((*channel).refcnt)) }
}

// ---- completion queues ------------------------------------------------

/// `ibv_cq` — always allocated as the `ibv_cq_ex` the extended API uses,
/// whose leading fields are an `ibv_cq`'s — and its rverbs CQ, with the
/// completion events read and not yet acknowledged.
#[repr(C)]
pub(crate) struct Cq {
    /// Counters, `cqe`, `wr_id`/`status` change after creation (interior
    /// mutability: written through raw pointers while `&Cq`s exist).
    pub(crate) ibv: UnsafeCell<ibv_cq_ex>,
    pub(crate) rust: Option<CompletionQueue>,
    pending: Mutex<VecDeque<CqEvent>>,
    acked: Condvar,
    /// Its device: once it is disassociated with RDMAV_ALLOW_DISASSOC_DESTROY
    /// set, destroy skips waiting for acknowledgements, as libibverbs does.
    device: rverbs::Device,
    /// The completion `start_poll`/`next_poll` took (extended API).
    current: Mutex<WorkCompletion>,
}

/// The rverbs CQ behind a C CQ.
///
/// # Safety
/// `cq` must be null or a live CQ from `ibv_create_cq`.
pub(crate) unsafe fn cq_ref<'a>(cq: *mut ibv_cq) -> Option<&'a CompletionQueue> {
    // SAFETY: per the caller.
    unsafe { wrapper::<_, Cq>(cq) }.and_then(|w| w.rust.as_ref())
}

export! { "IBVERBS_1.1"
    /// `ibv_create_cq`.
    pub unsafe extern "C" fn ibv_create_cq(
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq {
        guard(ptr::null_mut(), || {
            let (Ok(cqe), Ok(vector)) = (u32::try_from(cqe), u32::try_from(comp_vector)) else {
                return null(libc::EINVAL);
            };
            create_cq(context, cqe, cq_context, channel, vector, false).cast()
        })
    }
}

/// Creates a CQ (`extended`: with the `ibv_cq_ex` polling functions).
fn create_cq(
    context: *mut ibv_context,
    cqe: u32,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    vector: u32,
    extended: bool,
) -> *mut ibv_cq_ex {
    // SAFETY: a context this library opened, or NULL.
    let Some(ctx) = (unsafe { context_ref(context) }) else {
        return null(libc::EINVAL);
    };
    // SAFETY: a channel from ibv_create_comp_channel, or NULL.
    let ch = unsafe { wrapper::<_, Channel>(channel) };
    if !channel.is_null() && ch.and_then(|c| c.rust.as_ref()).is_none() {
        return null(libc::EINVAL);
    }
    let mut ibv = ibv_cq_ex::default();
    ibv.context = context;
    ibv.channel = channel;
    ibv.cq_context = cq_context;
    if extended {
        fill_cq_ex_ops(&mut ibv);
    }
    let cq = Box::into_raw(Box::new(Cq {
        ibv: UnsafeCell::new(ibv),
        rust: None,
        pending: Mutex::new(VecDeque::new()),
        acked: Condvar::new(),
        device: ctx.rust.device(),
        current: Mutex::new(WorkCompletion::default()),
    }));
    let mut b = ctx
        .rust
        .cq_builder()
        .cqe(cqe)
        .comp_vector(vector)
        .user_data(cq as u64);
    if let Some(c) = ch.and_then(|c| c.rust.as_ref()) {
        b = b.channel(c);
    }
    match b.build() {
        Ok(rust) => {
            // SAFETY: just made; nobody else has it yet.
            let w = unsafe { &mut *cq };
            w.ibv.get_mut().handle = rust.handle() as u32;
            w.ibv.get_mut().cqe = rust.cqe() as c_int;
            w.rust = Some(rust);
            if !channel.is_null() {
                refcnt(channel).fetch_add(1, Ordering::AcqRel);
            }
            cq.cast()
        }
        Err(e) => {
            // SAFETY: made above, never handed out.
            drop(unsafe { Box::from_raw(cq) });
            null(errno_of(&e))
        }
    }
}

/// `verbs_context.create_cq_ex` (behind the inline `ibv_create_cq_ex`): the
/// standard completion fields (`IBV_WC_STANDARD_FLAGS`); timestamps, VLAN,
/// flow tags, tag matching and parent domains are not supported.
pub(crate) unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard(ptr::null_mut(), || {
        // SAFETY: the caller passes a readable ibv_cq_init_attr_ex.
        let Some(a) = (unsafe { attr.as_ref() }) else {
            return null(libc::EINVAL);
        };
        let known_flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
        let supported = a.wc_flags & !u64::from(IBV_WC_STANDARD_FLAGS) == 0
            && a.comp_mask & !IBV_CQ_INIT_ATTR_MASK_FLAGS == 0
            && (a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS == 0 || a.flags & !known_flags == 0);
        if !supported {
            return null(libc::EOPNOTSUPP);
        }
        create_cq(context, a.cqe, a.cq_context, a.channel, a.comp_vector, true)
    })
}

fn fill_cq_ex_ops(q: &mut ibv_cq_ex) {
    q.start_poll = Some(cq_start_poll);
    q.next_poll = Some(cq_next_poll);
    q.end_poll = Some(cq_end_poll);
    q.read_opcode = Some(cq_read_opcode);
    q.read_vendor_err = Some(cq_read_vendor_err);
    q.read_byte_len = Some(cq_read_byte_len);
    q.read_imm_data = Some(cq_read_imm_data);
    q.read_qp_num = Some(cq_read_qp_num);
    q.read_src_qp = Some(cq_read_src_qp);
    q.read_wc_flags = Some(cq_read_wc_flags);
    q.read_slid = Some(cq_read_slid);
    q.read_sl = Some(cq_read_sl);
    q.read_dlid_path_bits = Some(cq_read_dlid_path_bits);
}

/// Takes the next completion into the CQ's current one: 0, or ENOENT.
fn cq_take_next(cq: *mut ibv_cq_ex) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a CQ from ibv_create_cq_ex (the ibv_cq_ex is its wrapper's
        // first field).
        let Some(w) = (unsafe { wrapper::<_, Cq>(cq) }) else {
            return libc::EINVAL;
        };
        let Some(rust) = w.rust.as_ref() else {
            return libc::EINVAL;
        };
        let mut one = [WorkCompletion::default()];
        match rust.poll(&mut one) {
            Ok(1) => {
                let wc = one[0];
                *lock(&w.current) = wc;
                // SAFETY: live; the polling thread owns these fields between
                // start_poll and end_poll.
                unsafe {
                    (*cq).wr_id = wc.wr_id;
                    (*cq).status = wc.status as u32;
                }
                0
            }
            Ok(_) => libc::ENOENT,
            Err(e) => errno_of(&e),
        }
    })
}

unsafe extern "C" fn cq_start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: the caller passes a readable attr (or NULL).
    if unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
        return libc::EINVAL;
    }
    cq_take_next(cq)
}

unsafe extern "C" fn cq_next_poll(cq: *mut ibv_cq_ex) -> c_int {
    cq_take_next(cq)
}

unsafe extern "C" fn cq_end_poll(_cq: *mut ibv_cq_ex) {}

/// A field of the current completion.
fn current<R: Default>(cq: *mut ibv_cq_ex, f: impl FnOnce(&WorkCompletion) -> R) -> R {
    guard(R::default(), || {
        // SAFETY: as in cq_take_next.
        match unsafe { wrapper::<_, Cq>(cq) } {
            Some(w) => f(&lock(&w.current)),
            None => R::default(),
        }
    })
}

unsafe extern "C" fn cq_read_opcode(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| w.opcode as u32)
}
unsafe extern "C" fn cq_read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| w.vendor_err)
}
unsafe extern "C" fn cq_read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| w.byte_len)
}
unsafe extern "C" fn cq_read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| w.imm_data.to_be())
}
unsafe extern "C" fn cq_read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| w.qp_num)
}
unsafe extern "C" fn cq_read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| w.src_qp)
}
unsafe extern "C" fn cq_read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
    current(cq, |w| w.wc_flags.bits())
}
unsafe extern "C" fn cq_read_slid(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| u32::from(w.slid))
}
unsafe extern "C" fn cq_read_sl(cq: *mut ibv_cq_ex) -> u8 {
    current(cq, |w| w.sl)
}
unsafe extern "C" fn cq_read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    current(cq, |w| w.dlid_path_bits)
}

export! { "IBVERBS_1.1"
    /// `ibv_resize_cq`.
    pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: a CQ from ibv_create_cq, or NULL.
            let Some(rust) = (unsafe { cq_ref(cq) }) else {
                return libc::EINVAL;
            };
            let Ok(cqe) = u32::try_from(cqe) else {
                return libc::EINVAL;
            };
            match rust.resize(cqe) {
                Ok(()) => {
                    // SAFETY: live (checked above).
                    unsafe { (*cq).cqe = rust.cqe() as c_int };
                    0
                }
                Err(e) => errno_of(&e),
            }
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_destroy_cq`: waits until every completion event read from it
    /// was acknowledged; EBUSY while QPs use it.
    pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
        guard(libc::EIO, || {
            if cq.is_null() {
                return libc::EINVAL;
            }
            let w = cq.cast::<Cq>();
            // SAFETY: a CQ from ibv_create_cq, not destroyed.
            let wr = unsafe { &*w };
            let forced = || {
                wr.device.is_disassociated() && rverbs::soft::device::allow_disassoc_destroy()
            };
            loop {
                if forced() {
                    // The events go with the CQ; no one will acknowledge them.
                    lock(&wr.pending).clear();
                }
                {
                    let mut pending = lock(&wr.pending);
                    while !pending.is_empty() {
                        pending = wr.acked.wait(pending).unwrap_or_else(|p| p.into_inner());
                    }
                }
                // SAFETY: as above.
                match unsafe { destroy_in_place(ptr::addr_of_mut!((*w).rust), CompletionQueue::destroy) } {
                    Ok(()) => break,
                    Err(libc::EBUSY) => {
                        // An event read by another thread and not yet
                        // handed over, or an async event of the CQ: wait for
                        // their acknowledgement as libibverbs does. QPs
                        // still using it: EBUSY.
                        let Some(rust) = wr.rust.as_ref() else {
                            return libc::EINVAL;
                        };
                        let (c_rep, c_ack) = rust.comp_events();
                        let (a_rep, a_ack) = rust.async_events();
                        if c_rep == c_ack && a_rep == a_ack {
                            return libc::EBUSY;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    Err(errno) => return errno,
                }
            }
            // SAFETY: the cell's content is live; set at creation only.
            let channel = unsafe { (*wr.ibv.get()).channel };
            if !channel.is_null() {
                // The channel outlives its CQs (its destroy is refused while
                // refcnt is not 0).
                refcnt(channel).fetch_sub(1, Ordering::AcqRel);
            }
            // SAFETY: made by Box::into_raw; freed once.
            drop(unsafe { Box::from_raw(w) });
            0
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_get_cq_event`: reads the channel (blocking, unless the program
    /// made its fd non-blocking: then -1/EAGAIN); 0, or -1 with errno.
    pub unsafe extern "C" fn ibv_get_cq_event(
        channel: *mut ibv_comp_channel,
        cq_out: *mut *mut ibv_cq,
        cq_context: *mut *mut c_void,
    ) -> c_int {
        guard(-1, || {
            // SAFETY: a channel from ibv_create_comp_channel, or NULL.
            let Some(ch) = (unsafe { wrapper::<_, Channel>(channel) }).and_then(|c| c.rust.as_ref()) else {
                return neg(libc::EINVAL);
            };
            let ev = match ch.get_cq_event() {
                Ok(ev) => ev,
                Err(e) => {
                    return neg(errno_of(&e));
                }
            };
            let cq = ev.user_data() as *mut Cq;
            // SAFETY: the event's user data is the C CQ it was created with,
            // live while it has unacknowledged events (destroy waits).
            let w = unsafe { &*cq };
            if !cq_out.is_null() {
                // SAFETY: the caller passes writable pointers (or NULL).
                unsafe { *cq_out = cq.cast() };
            }
            if !cq_context.is_null() {
                // SAFETY: as above.
                unsafe { *cq_context = (*w.ibv.get()).cq_context };
            }
            lock(&w.pending).push_back(ev);
            0
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_ack_cq_events`: acknowledges `nevents` events of `cq`.
    pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
        guard((), || {
            // SAFETY: a CQ from ibv_create_cq, or NULL.
            let Some(w) = (unsafe { wrapper::<_, Cq>(cq) }) else { return };
            let mut pending = lock(&w.pending);
            for _ in 0..nevents {
                drop(pending.pop_front());
            }
            // SAFETY: cq is live (checked above).
            counter(unsafe { ptr::addr_of_mut!((*cq).comp_events_completed) })
                .fetch_add(nevents, Ordering::AcqRel);
            w.acked.notify_all();
        })
    }
}

/// An event counter of a C object (`comp_events_completed`,
/// `events_completed` …), updated atomically.
pub(crate) fn counter<'a>(at: *mut u32) -> &'a AtomicU32 {
    // SAFETY: `at` is a live, aligned counter field of a C object this
    // library made; it is only ever accessed through this atomic view here.
    unsafe { AtomicU32::from_ptr(at) }
}

/// Converts a completion to C's `ibv_wc` (immediate data in network order).
pub(crate) fn c_wc(wc: &WorkCompletion) -> ibv_wc {
    let mut out = ibv_wc::default();
    out.wr_id = wc.wr_id;
    out.status = wc.status as u32;
    out.opcode = wc.opcode as u32;
    out.vendor_err = wc.vendor_err;
    out.byte_len = wc.byte_len;
    out.imm.imm_data = wc.imm_data.to_be();
    out.qp_num = wc.qp_num;
    out.src_qp = wc.src_qp;
    out.wc_flags = wc.wc_flags.bits();
    out.pkey_index = wc.pkey_index;
    out.slid = wc.slid;
    out.sl = wc.sl;
    out.dlid_path_bits = wc.dlid_path_bits;
    out
}

/// `ops.poll_cq` (behind the inline `ibv_poll_cq`): completions written,
/// or -1 on error.
unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        // SAFETY: a CQ from ibv_create_cq, or NULL.
        let Some(rust) = (unsafe { cq_ref(cq) }) else {
            return -1;
        };
        let Ok(want) = usize::try_from(num_entries) else {
            return -1;
        };
        if want > 0 && wc.is_null() {
            return -1;
        }
        let mut buf = [WorkCompletion::default(); 16];
        let mut done = 0;
        while done < want {
            let n = (want - done).min(buf.len());
            let got = match rust.poll(&mut buf[..n]) {
                Ok(got) => got,
                Err(_) => return -1,
            };
            for (i, w) in buf[..got].iter().enumerate() {
                // SAFETY: the caller's array holds num_entries entries and
                // done + i < want = num_entries.
                unsafe { wc.add(done + i).write(c_wc(w)) };
            }
            done += got;
            if got < n {
                break;
            }
        }
        done as c_int
    })
}

/// `ops.req_notify_cq` (behind the inline `ibv_req_notify_cq`).
unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a CQ from ibv_create_cq, or NULL.
        let Some(rust) = (unsafe { cq_ref(cq) }) else {
            return libc::EINVAL;
        };
        match rust.req_notify(solicited_only != 0) {
            Ok(()) => 0,
            Err(e) => errno_of(&e),
        }
    })
}

// ---- fork -------------------------------------------------------------

/// A dontfork/dofork range call came first: `ibv_fork_init` is then too
/// late (EINVAL), as in libibverbs.
static RANGE_CALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

export! { "IBVERBS_1.1"
    /// `ibv_fork_init`: nothing to protect (the device reads and writes
    /// memory with ordinary copies, so a fork cannot break it); EINVAL after
    /// a range call, as libibverbs.
    pub unsafe extern "C" fn ibv_fork_init() -> c_int {
        if RANGE_CALLED.load(std::sync::atomic::Ordering::Relaxed) {
            libc::EINVAL
        } else {
            0
        }
    }
}

export! { "IBVERBS_1.13"
    /// `ibv_is_fork_initialized`: IBV_FORK_UNNEEDED.
    pub unsafe extern "C" fn ibv_is_fork_initialized() -> c_int {
        2
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_dontfork_range`: nothing to do.
    pub unsafe extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
        RANGE_CALLED.store(true, std::sync::atomic::Ordering::Relaxed);
        0
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_dofork_range`: nothing to do.
    pub unsafe extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
        RANGE_CALLED.store(true, std::sync::atomic::Ordering::Relaxed);
        0
    }
}
