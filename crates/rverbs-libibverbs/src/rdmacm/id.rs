//! The rdma_cm's C objects on `rverbs::cm`: event channels, ids, events,
//! the QPs an id makes, address info — what librdmacm's `rdma_*` calls do
//! with them.
//!
//! Every C object is the first field of a `#[repr(C)]` wrapper (a C
//! pointer is a pointer to its wrapper). An id's wrapper owns its
//! `CmId`, whose `user_data` is the C pointer: an event names its id
//! through it, and a connection request's new id gets its wrapper when
//! the program reads the event. An event's wrapper holds its private data
//! until `rdma_ack_cm_event`. An id made without a channel is synchronous,
//! as in librdmacm: it gets a channel of its own, and the calls that lead
//! to an event wait for it (and leave it in `id->event`).
//!
//! Contexts: `id->verbs` is one context per device, opened by the first id
//! that needs it and kept for the process (as librdmacm keeps its
//! devices open); a QP made through an id without a PD uses that device's
//! one PD, and without CQs gets its own CQs and completion channels.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

use libc::{sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t, AF_INET, AF_INET6};
use rverbs::cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel, EventParam, PortSpace};
use rverbs_ibverbs_abi::abi::rdmacm::*;
use rverbs_ibverbs_abi::abi::*;

use crate::convert::c_ah_attr;
use crate::ffi::{errno_of, guard, lock, neg, null};
use crate::handles::{self, qp_ref, Retired};

// ---- contexts and PDs ----------------------------------------------------

/// The context and PD of each device an id used, by device name.
fn devices() -> std::sync::MutexGuard<'static, Vec<(String, usize, usize)>> {
    static OPEN: OnceLock<Mutex<Vec<(String, usize, usize)>>> = OnceLock::new();
    lock(OPEN.get_or_init(|| Mutex::new(Vec::new())))
}

/// The C context (and PD) of `dev`, opened on first use.
fn context_of(dev: &rverbs::Device) -> Option<(*mut ibv_context, *mut ibv_pd)> {
    let mut list = devices();
    if let Some((_, ctx, pd)) = list.iter().find(|(n, _, _)| n == dev.name()) {
        return Some((*ctx as *mut ibv_context, *pd as *mut ibv_pd));
    }
    let d = crate::device::c_device(dev.clone());
    // SAFETY: a device of the registry (leaked, valid for the process).
    let ctx = unsafe { crate::context::ibv_open_device(ptr::from_ref(&d.ibv).cast_mut()) };
    if ctx.is_null() {
        return None;
    }
    // SAFETY: a context just opened.
    let pd = unsafe { crate::pd::ibv_alloc_pd(ctx) };
    if pd.is_null() {
        return None;
    }
    list.push((dev.name().to_string(), ctx as usize, pd as usize));
    Some((ctx, pd))
}

// ---- wrappers ---------------------------------------------------------------

/// An event channel as C sees it.
#[repr(C)]
pub(crate) struct Channel {
    c: rdma_event_channel,
    /// The channel; `None` once `rdma_destroy_event_channel` has run. A
    /// thread waiting in `rdma_get_cm_event` then holds a clone of its
    /// own and goes on waiting, as a `read` of librdmacm's descriptor
    /// blocked in the kernel does.
    rust: Mutex<Option<EventChannel>>,
}

impl Channel {
    /// The channel, unless destroyed.
    fn events(&self) -> Option<EventChannel> {
        lock(&self.rust).clone()
    }
}

/// Destroyed channels, kept a while (see [`Retired`]).
static RETIRED: Retired<Channel> = Retired::new();

/// An id as C sees it.
#[repr(C)]
pub(crate) struct Id {
    pub(crate) c: rdma_cm_id,
    pub(crate) rust: CmId,
    /// A synchronous id's own channel (it was created without one).
    own_channel: Option<Box<Channel>>,
    /// The path record `route.path_rec` points at once resolved.
    path: ibv_sa_path_rec,
    /// What `rdma_create_ep` gave a passive id, for the QPs of the
    /// requests `rdma_get_request` hands out.
    ep_pd: *mut ibv_pd,
    ep_attr: Option<ibv_qp_init_attr>,
    /// CQs and channels `rdma_create_qp` made (destroyed with the QP).
    own_cqs: bool,
    /// The groups joined, with the context each join gave (MULTICAST_JOIN
    /// hands it back in `param.ud.private_data`, as librdmacm does).
    pub(crate) joins: Vec<(std::net::IpAddr, usize)>,
    /// Events reported that name this id (as the id or the listener) and
    /// are not acknowledged yet: `rdma_destroy_id` waits for them, as
    /// librdmacm's does, so no event points at a freed id.
    pending: Mutex<u32>,
    acked: Condvar,
}

/// Held while an event's ids are resolved from their Rust ids and while
/// an id stops being resolvable (`rdma_destroy_id`): an event never picks
/// up an id being freed.
static RESOLVING: Mutex<()> = Mutex::new(());

/// An event as C sees it, with what its pointers point at.
#[repr(C)]
struct Event {
    c: rdma_cm_event,
    private_data: Vec<u8>,
    /// The Rust event (its ids stay alive until the ack).
    _rust: CmEvent,
    /// The C ids it counts against (its id, and its listener's).
    holders: [*mut Id; 2],
}

impl Drop for Event {
    /// Acknowledged: its ids may be destroyed once all theirs are.
    fn drop(&mut self) {
        for &h in self.holders.iter().filter(|h| !h.is_null()) {
            // SAFETY: an id counted by this event is not freed before the
            // count drops to zero (rdma_destroy_id waits for it).
            let w = unsafe { &*h };
            let mut n = lock(&w.pending);
            *n = n.saturating_sub(1);
            if *n == 0 {
                w.acked.notify_all();
            }
        }
    }
}

/// `rdma_getaddrinfo`'s answer, with its addresses.
#[repr(C)]
struct AddrInfo {
    c: rdma_addrinfo,
    src: sockaddr_storage,
    dst: sockaddr_storage,
}

/// # Safety
/// `id` must be null or an id this library made and not destroyed.
pub(crate) unsafe fn id_ref<'a>(id: *mut rdma_cm_id) -> Option<&'a mut Id> {
    // SAFETY: the caller's promise; the rdma_cm_id is the wrapper's first
    // field.
    unsafe { id.cast::<Id>().as_mut() }
}

/// # Safety
/// `channel` must be null or a channel this library made and not destroyed.
unsafe fn channel_ref<'a>(channel: *mut rdma_event_channel) -> Option<&'a Channel> {
    // SAFETY: as for `id_ref`.
    unsafe { channel.cast::<Channel>().as_ref() }
}

fn port_space(ps: rdma_port_space) -> Option<PortSpace> {
    PortSpace::from_code(u16::try_from(ps).ok()?)
}

/// A C socket address as Rust's.
///
/// # Safety
/// `addr` must be null or point at a `sockaddr_in` or `sockaddr_in6` as its
/// family says.
pub(crate) unsafe fn socket_addr(addr: *const sockaddr) -> Option<SocketAddr> {
    // SAFETY: the caller's promise: the family field is readable.
    let family = c_int::from(unsafe { addr.as_ref()?.sa_family });
    match family {
        AF_INET => {
            // SAFETY: a sockaddr_in by its family.
            let a = unsafe { &*addr.cast::<sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        AF_INET6 => {
            // SAFETY: a sockaddr_in6 by its family.
            let a = unsafe { &*addr.cast::<sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Writes `addr` into a `sockaddr_storage`.
fn c_addr(addr: SocketAddr, out: &mut sockaddr_storage) -> socklen_t {
    // SAFETY: all-zero is a valid sockaddr_storage.
    *out = unsafe { zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for
            // sockaddr_in.
            let sin = unsafe { &mut *ptr::from_mut(out).cast::<sockaddr_in>() };
            sin.sin_family = AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            size_of::<sockaddr_in>() as socklen_t
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *ptr::from_mut(out).cast::<sockaddr_in6>() };
            sin6.sin6_family = AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            size_of::<sockaddr_in6>() as socklen_t
        }
    }
}

impl Id {
    /// A new wrapper for `rust`, whose events go to `channel`.
    fn new(
        rust: CmId,
        channel: *mut rdma_event_channel,
        own_channel: Option<Box<Channel>>,
        context: *mut c_void,
        ps: rdma_port_space,
    ) -> *mut Id {
        // SAFETY: all-zero is a valid rdma_cm_id (pointers NULL).
        let mut c: rdma_cm_id = unsafe { zeroed() };
        c.channel = channel;
        c.context = context;
        c.ps = ps;
        c.qp_type = if rust.port_space().is_ud() {
            IBV_QPT_UD
        } else {
            IBV_QPT_RC
        };
        let id = Box::into_raw(Box::new(Id {
            c,
            rust,
            own_channel,
            // SAFETY: all-zero is a valid path record.
            path: unsafe { zeroed() },
            ep_pd: ptr::null_mut(),
            ep_attr: None,
            own_cqs: false,
            joins: Vec::new(),
            pending: Mutex::new(0),
            acked: Condvar::new(),
        }));
        // SAFETY: just allocated.
        let w = unsafe { &mut *id };
        w.rust.set_user_data(id as u64);
        w.sync_fields();
        id
    }

    /// Brings the C fields up to the Rust id: device, addresses, route.
    fn sync_fields(&mut self) {
        if let Some(dev) = self.rust.device() {
            if self.c.verbs.is_null() {
                if let Some((ctx, pd)) = context_of(&dev) {
                    self.c.verbs = ctx;
                    if self.c.pd.is_null() {
                        self.c.pd = pd;
                    }
                }
            }
            self.c.port_num = 1;
            // Writing a union's field is safe (its bytes are plain data).
            self.c.route.addr.addr.ibaddr.sgid = ibv_gid {
                raw: *dev.gid().raw(),
            };
            self.c.route.addr.addr.ibaddr.pkey = 0xffff_u16.to_be();
        }
        if let Some(local) = self.rust.local_addr() {
            // SAFETY: the union's storage member covers it.
            unsafe { c_addr(local, &mut self.c.route.addr.src.src_storage) };
        }
        if let Some(peer) = self.rust.peer_addr() {
            // SAFETY: as above.
            unsafe { c_addr(peer, &mut self.c.route.addr.dst.dst_storage) };
        }
        if let Some(gid) = self.rust.peer_gid() {
            self.c.route.addr.addr.ibaddr.dgid = ibv_gid { raw: *gid.raw() };
            self.path.dgid = ibv_gid { raw: *gid.raw() };
            // SAFETY: plain data.
            self.path.sgid = unsafe { self.c.route.addr.addr.ibaddr.sgid };
            self.path.pkey = 0xffff_u16.to_be();
            self.path.hop_limit = 64;
            self.path.mtu = self.rust.path_mtu().map_or(3, |m| m as u8);
            self.path.packet_life_time = 16;
            self.path.reversible = 1;
            self.path.numb_path = 1;
            self.c.route.path_rec = ptr::from_mut(&mut self.path);
            self.c.route.num_paths = 1;
        }
    }

    /// The id's channel.
    fn channel(&self) -> Option<&Channel> {
        // SAFETY: the id's channel is one this library made; the program
        // may not destroy it while ids use it.
        unsafe { channel_ref(self.c.channel) }
    }

    fn is_sync(&self) -> bool {
        self.own_channel.is_some()
    }

    /// A synchronous id: waits for the event its last call leads to and
    /// leaves it in `id->event`; its status says how the call ends (-1
    /// with errno for a failure), as librdmacm's `ucma_complete`.
    fn complete(&mut self) -> c_int {
        self.complete_as(true)
    }

    /// [`complete`](Self::complete), waiting for the event only if
    /// `wait`: otherwise an event already queued completes the call, and
    /// with none it succeeds.
    fn complete_as(&mut self, wait: bool) -> c_int {
        if !self.is_sync() {
            return 0;
        }
        self.ack_held();
        let Some(ch) = self.channel().and_then(Channel::events) else {
            return neg(libc::EINVAL);
        };
        let ev = if wait {
            match ch.get_event() {
                Ok(ev) => ev,
                Err(e) => return neg(errno_of(&e)),
            }
        } else {
            match ch.try_get_event() {
                Some(ev) => ev,
                None => return 0,
            }
        };
        let kind = ev.kind;
        let status = ev.status;
        let c = to_c_event(ev);
        if c.is_null() {
            return neg(libc::EIO);
        }
        self.c.event = c.cast();
        // As librdmacm's ucma_complete: the event's status decides (a
        // connect without a QP completes with CONNECT_RESPONSE, status 0).
        match (kind, status) {
            (CmEventKind::Rejected, _) => neg(libc::ECONNREFUSED),
            (_, 0) => 0,
            (_, s) if s < 0 => neg(-s),
            (_, s) => neg(s),
        }
    }

    /// Acknowledges the event a synchronous call left.
    fn ack_held(&mut self) {
        let ev = std::mem::replace(&mut self.c.event, ptr::null_mut());
        if !ev.is_null() {
            // SAFETY: an event this library made and did not free.
            drop(unsafe { Box::from_raw(ev.cast::<Event>()) });
        }
    }
}

/// The C id of a Rust id: its wrapper, made now for a connection
/// request's new id (which inherits the listener's channel and context).
fn c_id(id: &CmId, listen: Option<&Id>) -> *mut Id {
    let p = id.user_data() as *mut Id;
    if !p.is_null() {
        return p;
    }
    let Some(l) = listen else {
        return ptr::null_mut();
    };
    let new = Id::new(id.clone(), l.c.channel, None, l.c.context, l.c.ps);
    // SAFETY: just made.
    let w = unsafe { &mut *new };
    w.c.verbs = l.c.verbs;
    w.c.pd = l.c.pd;
    w.sync_fields();
    new
}

/// A Rust event as a C one (NULL: its id is gone; the event is dropped).
fn to_c_event(ev: CmEvent) -> *mut rdma_cm_event {
    let resolving = lock(&RESOLVING);
    let listen = ev
        .listen_id
        .as_ref()
        .map(|l| l.user_data() as *mut Id)
        .filter(|l| !l.is_null());
    if ev.listen_id.is_some() && listen.is_none() {
        // The listener was destroyed: nobody takes its requests.
        return ptr::null_mut();
    }
    // SAFETY: a listener whose id resolves is not freed while RESOLVING
    // is held.
    let listen_w = listen.and_then(|l| unsafe { l.as_ref() });
    let id = c_id(&ev.id, listen_w);
    if id.is_null() {
        return ptr::null_mut();
    }
    let holders = [id, listen.unwrap_or(ptr::null_mut())];
    for &h in holders.iter().filter(|h| !h.is_null()) {
        // SAFETY: resolved under RESOLVING: alive.
        *lock(unsafe { &(*h).pending }) += 1;
    }
    // SAFETY: a live wrapper (counted now: not freed before the ack).
    let w = unsafe { &mut *id };
    w.sync_fields();
    drop(resolving);
    // SAFETY: all-zero is a valid event.
    let mut c: rdma_cm_event = unsafe { zeroed() };
    c.id = id.cast();
    c.listen_id = listen.map_or(ptr::null_mut(), |l| l.cast());
    c.event = ev.kind.code();
    c.status = ev.status;
    let private_data = match &ev.param {
        EventParam::Conn(p) => p.private_data.clone(),
        EventParam::Ud(p) => p.private_data.clone(),
        EventParam::None => Vec::new(),
    };
    let mut boxed = Box::new(Event {
        c,
        private_data,
        _rust: ev.clone(),
        holders,
    });
    let data = if boxed.private_data.is_empty() {
        ptr::null()
    } else {
        boxed.private_data.as_ptr().cast::<c_void>()
    };
    let len = u8::try_from(boxed.private_data.len()).unwrap_or(u8::MAX);
    match &ev.param {
        EventParam::Conn(p) => {
            boxed.c.param.conn = rdma_conn_param {
                private_data: data,
                private_data_len: len,
                responder_resources: p.responder_resources,
                initiator_depth: p.initiator_depth,
                flow_control: u8::from(p.flow_control),
                retry_count: p.retry_count,
                rnr_retry_count: p.rnr_retry_count,
                srq: u8::from(p.srq),
                qp_num: p.qp_num,
            };
        }
        EventParam::Ud(p) => {
            let mut ah = c_ah_attr(&rverbs::AhAttr {
                dgid: p.remote_gid,
                hop_limit: 64,
                port_num: 1,
                ..rverbs::AhAttr::default()
            });
            ah.port_num = 1;
            // A join's event carries the join's context instead.
            let joined = (ev.kind == CmEventKind::MulticastJoin)
                .then(|| {
                    w.joins
                        .iter()
                        .find(|(g, _)| rverbs::Gid::from_ip(*g) == p.remote_gid)
                })
                .flatten();
            let (data, len) = match joined {
                Some(&(_, context)) => (context as *const c_void, 0),
                None => (data, len),
            };
            boxed.c.param.ud = rdma_ud_param {
                private_data: data,
                private_data_len: len,
                ah_attr: ah,
                qp_num: p.qp_num,
                qkey: p.qkey,
            };
        }
        EventParam::None => {}
    }
    Box::into_raw(boxed).cast()
}

fn rust_conn_param(p: *const rdma_conn_param) -> ConnParam {
    // SAFETY: the caller passes a readable rdma_conn_param, or NULL.
    let Some(p) = (unsafe { p.as_ref() }) else {
        // librdmacm's defaults: the most READs/atomics each way, 7 retries.
        return ConnParam {
            responder_resources: ConnParam::MAX,
            initiator_depth: ConnParam::MAX,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        };
    };
    let private_data = if p.private_data.is_null() || p.private_data_len == 0 {
        Vec::new()
    } else {
        // SAFETY: the program says `private_data_len` bytes are there.
        unsafe {
            std::slice::from_raw_parts(p.private_data.cast::<u8>(), usize::from(p.private_data_len))
        }
        .to_vec()
    };
    ConnParam {
        private_data,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: p.flow_control != 0,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: p.srq != 0,
        qp_num: p.qp_num,
    }
}

/// The QP behind `id->qp` (NULL: none).
pub(crate) fn id_qp<'a>(w: &Id) -> Option<&'a rverbs::QueuePair> {
    // SAFETY: `id->qp` is a QP rdma_create_qp (or the program) made.
    unsafe { qp_ref(w.c.qp) }
}

/// The result of a Rust call as C's: 0, or -1 with errno.
pub(crate) fn status(r: rverbs::Result<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => neg(errno_of(&e)),
    }
}

// ---- event channels and events -------------------------------------------

/// `rdma_create_event_channel`.
pub(crate) unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(ptr::null_mut(), || match EventChannel::new() {
        Ok(rust) => new_channel(rust).cast(),
        Err(e) => null(errno_of(&e)),
    })
}

fn new_channel(rust: EventChannel) -> *mut Channel {
    let fd = rust.as_fd_raw();
    Box::into_raw(Box::new(Channel {
        c: rdma_event_channel { fd },
        rust: Mutex::new(Some(rust)),
    }))
}

trait RawFdOf {
    fn as_fd_raw(&self) -> c_int;
}

impl RawFdOf for EventChannel {
    fn as_fd_raw(&self) -> c_int {
        use std::os::fd::AsFd;
        self.as_fd().as_raw_fd()
    }
}

/// `rdma_destroy_event_channel`: the channel goes (its descriptor is
/// closed once no thread waits on it), but its memory stays a while (see
/// [`Retired`]): a late call with it waits a second and fails with EBADF
/// instead of crashing.
pub(crate) unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard((), || {
        // SAFETY: a channel from rdma_create_event_channel, or NULL; its
        // memory stays valid after a destroy (kept a while).
        let Some(ch) = (unsafe { channel_ref(channel) }) else {
            return;
        };
        // A second destroy finds it taken and keeps nothing.
        let Some(events) = lock(&ch.rust).take() else {
            return;
        };
        drop(events);
        // SAFETY: made by Box::into_raw in rdma_create_event_channel, and
        // kept once: only the destroy that took the channel gets here.
        unsafe { RETIRED.keep(channel.cast::<Channel>()) };
    });
}

/// A call with a destroyed channel: see [`Retired`].
fn destroyed_channel() -> c_int {
    neg(handles::destroyed_channel())
}

/// `rdma_get_cm_event`: the next event (waits unless the channel's fd is
/// non-blocking: then EAGAIN).
pub(crate) unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's channel, or NULL.
        let Some(ch) = (unsafe { channel_ref(channel) }) else {
            return neg(libc::EINVAL);
        };
        if event.is_null() {
            return neg(libc::EINVAL);
        }
        let Some(events) = ch.events() else {
            return destroyed_channel();
        };
        loop {
            let ev = match events.get_event() {
                Ok(ev) => ev,
                Err(e) => return neg(errno_of(&e)),
            };
            let c = to_c_event(ev);
            if !c.is_null() {
                // SAFETY: the caller passes a writable pointer.
                unsafe { *event = c };
                return 0;
            }
        }
    })
}

/// `rdma_ack_cm_event`: frees the event.
pub(crate) unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard(-1, || {
        if event.is_null() {
            return neg(libc::EINVAL);
        }
        // SAFETY: an event from rdma_get_cm_event, acknowledged once.
        drop(unsafe { Box::from_raw(event.cast::<Event>()) });
        0
    })
}

// ---- ids ----------------------------------------------------------------------

/// `rdma_create_id`: without a channel the id is synchronous.
pub(crate) unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return neg(libc::EINVAL);
        }
        let Some(space) = port_space(ps) else {
            return neg(libc::EINVAL);
        };
        let (channel, own) = if channel.is_null() {
            let rust = match EventChannel::new() {
                Ok(c) => c,
                Err(e) => return neg(errno_of(&e)),
            };
            // SAFETY: just made by Box::into_raw; owned by the id from now.
            let own = unsafe { Box::from_raw(new_channel(rust)) };
            (ptr::from_ref(&own.c).cast_mut(), Some(own))
        } else {
            (channel, None)
        };
        // SAFETY: the channel is one this library made.
        let Some(ch) = (unsafe { channel_ref(channel) }) else {
            return neg(libc::EINVAL);
        };
        let Some(events) = ch.events() else {
            return neg(libc::EBADF);
        };
        let rust = match CmId::new(&events, space) {
            Ok(r) => r,
            Err(e) => return neg(errno_of(&e)),
        };
        let w = Id::new(rust, channel, own, context, ps);
        // SAFETY: the caller passes a writable pointer.
        unsafe { *id = w.cast() };
        0
    })
}

/// `rdma_destroy_id`: tears its connection down (REJ or DREQ, as its
/// state asks) and frees it, once every event reported for it is
/// acknowledged (it waits for them, as librdmacm's does). Its QP, if any,
/// is the program's to destroy.
pub(crate) unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        // SAFETY: an id from rdma_create_id (or an event), destroyed once.
        let Some(w) = (unsafe { id_ref(id) }) else {
            return neg(libc::EINVAL);
        };
        {
            // No event resolves to it from now on.
            let _resolving = lock(&RESOLVING);
            w.rust.set_user_data(0);
        }
        w.ack_held();
        let mut n = lock(&w.pending);
        while *n > 0 {
            n = w.acked.wait(n).unwrap_or_else(|p| p.into_inner());
        }
        drop(n);
        // SAFETY: as above; nothing refers to it any more.
        drop(unsafe { Box::from_raw(id.cast::<Id>()) });
        0
    })
}

/// `rdma_migrate_id`: the id's events — those waiting too — go to
/// `channel` from now on; without a channel the id becomes synchronous (a
/// channel of its own), and a synchronous id given one becomes
/// asynchronous, as in librdmacm.
pub(crate) unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's id, or NULL.
        let Some(w) = (unsafe { id_ref(id) }) else {
            return neg(libc::EINVAL);
        };
        w.ack_held();
        if channel.is_null() {
            let rust = match EventChannel::new() {
                Ok(c) => c,
                Err(e) => return neg(errno_of(&e)),
            };
            // SAFETY: just made; owned by the id from now.
            let own = unsafe { Box::from_raw(new_channel(rust.clone())) };
            w.rust.migrate(&rust);
            w.c.channel = ptr::from_ref(&own.c).cast_mut();
            w.own_channel = Some(own);
            return 0;
        }
        // SAFETY: the program's channel.
        let Some(ch) = (unsafe { channel_ref(channel) }) else {
            return neg(libc::EINVAL);
        };
        let Some(events) = ch.events() else {
            return neg(libc::EBADF);
        };
        w.rust.migrate(&events);
        w.c.channel = channel;
        // Its own channel (if it was synchronous) goes, emptied.
        w.own_channel = None;
        0
    })
}

/// `rdma_bind_addr`.
pub(crate) unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    guard(-1, || {
        // SAFETY: the program's id and address, or NULL.
        let (Some(w), Some(a)) = (unsafe { id_ref(id) }, unsafe { socket_addr(addr) }) else {
            return neg(libc::EINVAL);
        };
        let r = status(w.rust.bind_addr(a));
        w.sync_fields();
        r
    })
}

/// `rdma_resolve_addr`: `timeout_ms` bounds the wait for the next hop's
/// neighbour (ADDR_ERROR with -ETIMEDOUT after it), as the kernel's; it is
/// unsigned there, as librdmacm passes it on.
pub(crate) unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut sockaddr,
    dst_addr: *mut sockaddr,
    timeout_ms: c_int,
) -> c_int {
    let timeout = Duration::from_millis(u64::from(timeout_ms as u32));
    guard(-1, || {
        // SAFETY: the program's id and addresses, or NULL.
        let (Some(w), Some(dst)) = (unsafe { id_ref(id) }, unsafe { socket_addr(dst_addr) }) else {
            return neg(libc::EINVAL);
        };
        // SAFETY: as above.
        let src = unsafe { socket_addr(src_addr) };
        if let Err(e) = w.rust.resolve_addr_timeout(src, dst, timeout) {
            return neg(errno_of(&e));
        }
        w.sync_fields();
        w.complete()
    })
}

/// `rdma_resolve_route`.
pub(crate) unsafe extern "C" fn rdma_resolve_route(
    id: *mut rdma_cm_id,
    timeout_ms: c_int,
) -> c_int {
    let _ = timeout_ms;
    guard(-1, || {
        // SAFETY: the program's id, or NULL.
        let Some(w) = (unsafe { id_ref(id) }) else {
            return neg(libc::EINVAL);
        };
        if let Err(e) = w.rust.resolve_route() {
            return neg(errno_of(&e));
        }
        w.sync_fields();
        w.complete()
    })
}

/// `rdma_get_src_port`: the local port, in network byte order.
pub(crate) unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> __be16 {
    guard(0, || {
        // SAFETY: the program's id, or NULL.
        unsafe { id_ref(id) }
            .and_then(|w| w.rust.local_addr())
            .map_or(0, |a| a.port().to_be())
    })
}

/// `rdma_get_dst_port`: the peer's port, in network byte order.
pub(crate) unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> __be16 {
    guard(0, || {
        // SAFETY: the program's id, or NULL.
        unsafe { id_ref(id) }
            .and_then(|w| w.rust.peer_addr())
            .map_or(0, |a| a.port().to_be())
    })
}

/// `rdma_get_devices`: a NULL-terminated array of one context per device
/// (opened for the process; `rdma_free_devices` frees the array only).
pub(crate) unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    guard(ptr::null_mut(), || {
        let devices = match rverbs::devices() {
            Ok(d) => d,
            Err(e) => return null(errno_of(&e)),
        };
        let contexts: Vec<_> = devices
            .iter()
            .filter_map(|d| context_of(d).map(|c| c.0))
            .collect();
        // SAFETY: calloc of n + 1 pointers; checked below.
        let list = unsafe { libc::calloc(contexts.len() + 1, size_of::<*mut ibv_context>()) }
            .cast::<*mut ibv_context>();
        if list.is_null() {
            return null(libc::ENOMEM);
        }
        for (i, c) in contexts.iter().enumerate() {
            // SAFETY: i < n + 1 slots.
            unsafe { *list.add(i) = *c };
        }
        if !num_devices.is_null() {
            // SAFETY: the program's int.
            unsafe { *num_devices = contexts.len() as c_int };
        }
        list
    })
}

/// `rdma_free_devices`.
pub(crate) unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: the array from rdma_get_devices' calloc, or NULL.
    unsafe { libc::free(list.cast()) }
}

/// `rdma_set_option`: rverbs takes the options rdma_cm programs set and
/// lets them change nothing that matters here (type of service, address
/// reuse, IPv6-only, ACK timeout); others (IB path records among them)
/// are ENOSYS, as the kernel's rdma_cm answers options it does not know.
pub(crate) unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's id, or NULL.
        if unsafe { id_ref(id) }.is_none() || optval.is_null() {
            return neg(libc::EINVAL);
        }
        let _ = optlen;
        match (level, optname) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS)
            | (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR)
            | (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY)
            | (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => 0,
            // Unknown options: what the kernel's rdma_cm answers.
            _ => neg(libc::ENOSYS),
        }
    })
}

// ---- QPs ------------------------------------------------------------------------

/// `rdma_create_qp`: a QP on the id's device (the device's PD if `pd` is
/// NULL; CQs of its own if the attributes name none), ready as rdma_cm
/// makes it (INIT; UD: RTS).
pub(crate) unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's id and attributes, or NULL.
        let (Some(w), Some(attr)) = (unsafe { id_ref(id) }, unsafe { qp_init_attr.as_mut() })
        else {
            return neg(libc::EINVAL);
        };
        if w.c.verbs.is_null() || !w.c.qp.is_null() {
            return neg(libc::EINVAL);
        }
        let pd = if pd.is_null() { w.c.pd } else { pd };
        if create_cqs(w, attr).is_err() {
            return -1;
        }
        if attr.srq.is_null() {
            attr.srq = w.c.srq;
        }
        // SAFETY: a PD of this library and the program's attributes.
        let qp = unsafe { crate::qp::ibv_create_qp(pd, attr) };
        if qp.is_null() {
            return -1;
        }
        // SAFETY: just made.
        let rust = unsafe { qp_ref(qp) }.expect("a QP just made");
        if let Err(e) = w.rust.prepare_qp(rust) {
            // SAFETY: the QP just made, not handed out.
            unsafe { crate::qp::ibv_destroy_qp(qp) };
            return neg(errno_of(&e));
        }
        w.c.qp = qp;
        w.c.pd = pd;
        w.c.qp_type = attr.qp_type;
        0
    })
}

/// A CQ (and its completion channel) on the id for each queue whose
/// attributes name none, as librdmacm makes them, sized for the queue.
fn create_cqs(w: &mut Id, attr: &mut ibv_qp_init_attr) -> Result<(), ()> {
    let verbs = w.c.verbs;
    let me = ptr::from_mut(w).cast::<c_void>();
    let make = |size: u32| -> Result<(*mut ibv_comp_channel, *mut ibv_cq), ()> {
        // SAFETY: the id's context.
        let ch = unsafe { crate::channel::ibv_create_comp_channel(verbs) };
        if ch.is_null() {
            return Err(());
        }
        let size = c_int::try_from(size.max(1)).unwrap_or(c_int::MAX);
        // SAFETY: the id's context and a channel just made.
        let cq = unsafe { crate::cq::ibv_create_cq(verbs, size, me, ch, 0) };
        if cq.is_null() {
            // SAFETY: the channel just made.
            unsafe { crate::channel::ibv_destroy_comp_channel(ch) };
            return Err(());
        }
        Ok((ch, cq))
    };
    if attr.recv_cq.is_null() {
        if w.c.recv_cq.is_null() {
            let (ch, cq) = make(attr.cap.max_recv_wr)?;
            w.c.recv_cq_channel = ch;
            w.c.recv_cq = cq;
            w.own_cqs = true;
        }
        attr.recv_cq = w.c.recv_cq;
    }
    if attr.send_cq.is_null() {
        if w.c.send_cq.is_null() {
            let (ch, cq) = make(attr.cap.max_send_wr)?;
            w.c.send_cq_channel = ch;
            w.c.send_cq = cq;
            w.own_cqs = true;
        }
        attr.send_cq = w.c.send_cq;
    }
    Ok(())
}

/// `rdma_create_qp_ex`: as `rdma_create_qp` for the attributes a plain
/// QP takes (PD, CQs, SRQ, caps, type, sq_sig_all).
pub(crate) unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    qp_init_attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's attributes, or NULL.
        let Some(ex) = (unsafe { qp_init_attr.as_mut() }) else {
            return neg(libc::EINVAL);
        };
        let mut attr = ibv_qp_init_attr {
            qp_context: ex.qp_context,
            send_cq: ex.send_cq,
            recv_cq: ex.recv_cq,
            srq: ex.srq,
            cap: ex.cap,
            qp_type: ex.qp_type,
            sq_sig_all: ex.sq_sig_all,
        };
        let pd = if ex.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
            ex.pd
        } else {
            ptr::null_mut()
        };
        // SAFETY: forwarded.
        let r = unsafe { rdma_create_qp(id, pd, &mut attr) };
        ex.cap = attr.cap;
        r
    })
}

/// `rdma_destroy_qp`: destroys the id's QP (and the CQs it made for it).
pub(crate) unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: the program's id, or NULL.
        let Some(w) = (unsafe { id_ref(id) }) else {
            return;
        };
        let qp = std::mem::replace(&mut w.c.qp, ptr::null_mut());
        if !qp.is_null() {
            // SAFETY: the id's QP, destroyed once.
            unsafe { crate::qp::ibv_destroy_qp(qp) };
        }
        if w.own_cqs {
            w.own_cqs = false;
            for cq in [&mut w.c.send_cq, &mut w.c.recv_cq] {
                let cq = std::mem::replace(cq, ptr::null_mut());
                if !cq.is_null() {
                    // SAFETY: a CQ create_cqs made.
                    unsafe { crate::cq::ibv_destroy_cq(cq) };
                }
            }
            for ch in [&mut w.c.send_cq_channel, &mut w.c.recv_cq_channel] {
                let ch = std::mem::replace(ch, ptr::null_mut());
                if !ch.is_null() {
                    // SAFETY: a channel create_cqs made.
                    unsafe { crate::channel::ibv_destroy_comp_channel(ch) };
                }
            }
        }
    });
}

/// `rdma_init_qp_attr`: what the program's own QP needs for the next
/// state (INIT from RESET, RTR and RTS after a connection response or
/// request) — the attributes `rdma_connect`/`rdma_accept` would set.
pub(crate) unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's id, attributes and mask, or NULL.
        let (Some(w), Some(attr), Some(mask)) =
            (unsafe { id_ref(id) }, unsafe { qp_attr.as_mut() }, unsafe {
                qp_attr_mask.as_mut()
            })
        else {
            return neg(libc::EINVAL);
        };
        let Some(state) = crate::qp::qp_state(attr.qp_state) else {
            return neg(libc::EINVAL);
        };
        let qp_type = match w.c.qp_type {
            IBV_QPT_UD => rverbs::QpType::Ud,
            IBV_QPT_UC => rverbs::QpType::Uc,
            _ => rverbs::QpType::Rc,
        };
        match w.rust.init_qp_attr(qp_type, state) {
            Ok((a, m)) => {
                *attr = crate::qp::c_qp_attr(&a);
                *mask = m.bits() as c_int;
                0
            }
            Err(e) => neg(errno_of(&e)),
        }
    })
}

// ---- connections -------------------------------------------------------------

/// `rdma_connect`.
pub(crate) unsafe extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's id, or NULL.
        let Some(w) = (unsafe { id_ref(id) }) else {
            return neg(libc::EINVAL);
        };
        // As librdmacm: an RC id with neither a QP nor parameters has no
        // QP number to offer.
        if conn_param.is_null() && w.c.qp.is_null() && w.c.ps == RDMA_PS_TCP {
            return neg(libc::EINVAL);
        }
        let param = rust_conn_param(conn_param);
        if let Err(e) = w.rust.connect(id_qp(w), &param) {
            return neg(errno_of(&e));
        }
        w.complete()
    })
}

/// `rdma_listen`.
pub(crate) unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: the program's id, or NULL.
        let Some(w) = (unsafe { id_ref(id) }) else {
            return neg(libc::EINVAL);
        };
        let r = status(w.rust.listen(backlog));
        w.sync_fields();
        r
    })
}

/// `rdma_get_request`: a synchronous listener's next connection request,
/// as a new synchronous id (with a QP like the listener's endpoint's, if
/// `rdma_create_ep` gave it QP attributes).
pub(crate) unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's id, or NULL.
        let Some(l) = (unsafe { id_ref(listen) }) else {
            return neg(libc::EINVAL);
        };
        if !l.is_sync() || id.is_null() {
            return neg(libc::EINVAL);
        }
        l.ack_held();
        let Some(ch) = l.channel().and_then(Channel::events) else {
            return neg(libc::EINVAL);
        };
        let ev = match ch.get_event() {
            Ok(ev) => ev,
            Err(e) => return neg(errno_of(&e)),
        };
        let (kind, status) = (ev.kind, ev.status);
        let c = to_c_event(ev);
        if c.is_null() {
            return neg(libc::EIO);
        }
        // As librdmacm: anything but a request stays in `listen->event`
        // and fails the call.
        if kind != CmEventKind::ConnectRequest || status != 0 {
            l.c.event = c;
            return neg(match (kind, status) {
                (CmEventKind::Rejected, _) => libc::ECONNREFUSED,
                (_, s) if s < 0 => -s,
                _ => libc::EINVAL,
            });
        }
        // SAFETY: an event just made; its id is the new id's wrapper.
        let new = unsafe { (*c).id };
        // SAFETY: the new id's wrapper.
        let nw = unsafe { id_ref(new) }.expect("a request's id");
        // The new id is synchronous: a channel of its own.
        let rust = match EventChannel::new() {
            Ok(c) => c,
            Err(e) => return neg(errno_of(&e)),
        };
        // SAFETY: just made.
        let own = unsafe { Box::from_raw(new_channel(rust.clone())) };
        nw.rust.migrate(&rust);
        nw.c.channel = ptr::from_ref(&own.c).cast_mut();
        nw.own_channel = Some(own);
        nw.c.event = c;
        if let Some(mut attr) = l.ep_attr {
            // SAFETY: forwarded: the new id and the listener's PD.
            if unsafe { rdma_create_qp(new, l.ep_pd, &mut attr) } != 0 {
                return -1;
            }
        }
        // SAFETY: the program's pointer.
        unsafe { *id = new };
        0
    })
}

/// `rdma_accept`.
pub(crate) unsafe extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's id, or NULL.
        let Some(w) = (unsafe { id_ref(id) }) else {
            return neg(libc::EINVAL);
        };
        // As librdmacm: an RC id with neither a QP nor parameters has no
        // QP number to offer.
        if conn_param.is_null() && w.c.qp.is_null() && w.c.ps == RDMA_PS_TCP {
            return neg(libc::EINVAL);
        }
        let param = rust_conn_param(conn_param);
        if let Err(e) = w.rust.accept(id_qp(w), &param) {
            return neg(errno_of(&e));
        }
        if w.rust.port_space().is_ud() {
            return 0;
        }
        w.complete()
    })
}

/// `rdma_reject`.
pub(crate) unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's id, or NULL.
        let Some(w) = (unsafe { id_ref(id) }) else {
            return neg(libc::EINVAL);
        };
        let data = if private_data.is_null() {
            &[][..]
        } else {
            // SAFETY: the program says `private_data_len` bytes are there.
            unsafe {
                std::slice::from_raw_parts(private_data.cast::<u8>(), usize::from(private_data_len))
            }
        };
        status(w.rust.reject(data))
    })
}

/// `rdma_establish`.
pub(crate) unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        // SAFETY: the program's id, or NULL.
        let Some(w) = (unsafe { id_ref(id) }) else {
            return neg(libc::EINVAL);
        };
        if let Err(e) = w.rust.establish() {
            return neg(errno_of(&e));
        }
        w.complete()
    })
}

/// `rdma_notify`: the program saw its QP's COMM_EST: the connection is up
/// (as an RTU would say).
pub(crate) unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, event: ibv_event_type) -> c_int {
    guard(-1, || {
        // SAFETY: the program's id, or NULL.
        let Some(w) = (unsafe { id_ref(id) }) else {
            return neg(libc::EINVAL);
        };
        if event != IBV_EVENT_COMM_EST {
            // The only event rdma_notify takes (the kernel's EINVAL).
            return neg(libc::EINVAL);
        }
        let _ = w.rust.establish();
        0
    })
}

/// `rdma_disconnect`.
pub(crate) unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        // SAFETY: the program's id, or NULL.
        let Some(w) = (unsafe { id_ref(id) }) else {
            return neg(libc::EINVAL);
        };
        // A synchronous id returns with the DISCONNECTED event, as
        // librdmacm's: it comes once the peer answers the DREQ (or the DREQ
        // times out). An id whose connection was over already (the peer's
        // DREQ came first) takes the event that reported it, if it waits.
        let connected = w.rust.is_connected();
        if let Err(e) = w.rust.disconnect() {
            return neg(errno_of(&e));
        }
        w.complete_as(connected)
    })
}

// ---- address info and endpoints ------------------------------------------------

/// `rdma_getaddrinfo`: `node` and `service` resolved (names through the
/// system's resolver), as the passive side's source address (RAI_PASSIVE)
/// or the active side's destination. With neither, the hints' addresses
/// (libfabric asks so); with none of the three, EINVAL.
pub(crate) unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's hints, or NULL.
        let hints = unsafe { hints.as_ref() };
        if res.is_null() || (node.is_null() && service.is_null() && hints.is_none()) {
            return neg(libc::EINVAL);
        }
        if node.is_null() && service.is_null() {
            let Some(h) = hints else {
                return neg(libc::EINVAL);
            };
            // SAFETY: the hints' addresses, as their families say.
            let (src, dst) = unsafe { (socket_addr(h.ai_src_addr), socket_addr(h.ai_dst_addr)) };
            // SAFETY: all-zero is valid for every field.
            let mut info: Box<AddrInfo> = Box::new(unsafe { zeroed() });
            info.c.ai_flags = h.ai_flags;
            info.c.ai_family = h.ai_family;
            info.c.ai_qp_type = h.ai_qp_type;
            info.c.ai_port_space = h.ai_port_space;
            if let Some(dst) = dst {
                info.c.ai_dst_len = c_addr(dst, &mut info.dst);
                info.c.ai_dst_addr = ptr::from_mut(&mut info.dst).cast();
            }
            if let Some(src) = src {
                info.c.ai_src_len = c_addr(src, &mut info.src);
                info.c.ai_src_addr = ptr::from_mut(&mut info.src).cast();
            }
            // SAFETY: the program's pointer.
            unsafe { *res = Box::into_raw(info).cast() };
            return 0;
        }
        let flags = hints.map_or(0, |h| h.ai_flags);
        let passive = flags & RAI_PASSIVE != 0;
        let port = if service.is_null() {
            0
        } else {
            // SAFETY: a NUL-terminated string.
            match unsafe { CStr::from_ptr(service) }
                .to_str()
                .ok()
                .and_then(|s| s.parse::<u16>().ok())
            {
                Some(p) => p,
                None => return neg(libc::EINVAL),
            }
        };
        let ip = if node.is_null() {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        } else {
            // SAFETY: a NUL-terminated string.
            let Some(name) = unsafe { CStr::from_ptr(node) }.to_str().ok() else {
                return neg(libc::EINVAL);
            };
            match resolve_host(name) {
                Some(ip) => ip,
                None => return neg(libc::EADDRNOTAVAIL),
            }
        };
        let addr = SocketAddr::new(ip, port);
        // SAFETY: all-zero is valid for every field.
        let mut info: Box<AddrInfo> = Box::new(unsafe { zeroed() });
        info.c.ai_flags = flags;
        info.c.ai_family = if ip.is_ipv4() { AF_INET } else { AF_INET6 };
        info.c.ai_qp_type = hints.map_or(0, |h| h.ai_qp_type);
        if info.c.ai_qp_type == 0 {
            info.c.ai_qp_type = IBV_QPT_RC as c_int;
        }
        info.c.ai_port_space = hints.map_or(0, |h| h.ai_port_space);
        if info.c.ai_port_space == 0 {
            info.c.ai_port_space = if info.c.ai_qp_type == IBV_QPT_UD as c_int {
                RDMA_PS_UDP as c_int
            } else {
                RDMA_PS_TCP as c_int
            };
        }
        if passive {
            info.c.ai_src_len = c_addr(addr, &mut info.src);
            info.c.ai_src_addr = ptr::from_mut(&mut info.src).cast();
        } else {
            info.c.ai_dst_len = c_addr(addr, &mut info.dst);
            info.c.ai_dst_addr = ptr::from_mut(&mut info.dst).cast();
            // SAFETY: the hints' source address, if any, as its family says.
            if let Some(src) = hints.and_then(|h| unsafe { socket_addr(h.ai_src_addr) }) {
                info.c.ai_src_len = c_addr(src, &mut info.src);
                info.c.ai_src_addr = ptr::from_mut(&mut info.src).cast();
            }
        }
        // SAFETY: the program's pointer.
        unsafe { *res = Box::into_raw(info).cast() };
        0
    })
}

/// A host name or numeric address as an IP address (the first the
/// system's resolver gives).
fn resolve_host(name: &str) -> Option<IpAddr> {
    if let Ok(ip) = name.parse() {
        return Some(ip);
    }
    use std::net::ToSocketAddrs;
    (name, 0).to_socket_addrs().ok()?.next().map(|a| a.ip())
}

/// `rdma_freeaddrinfo`.
pub(crate) unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard((), || {
        let mut p = res;
        while !p.is_null() {
            // SAFETY: an answer of rdma_getaddrinfo, freed once.
            let info = unsafe { Box::from_raw(p.cast::<AddrInfo>()) };
            p = info.c.ai_next;
        }
    });
}

/// `rdma_create_ep`: a synchronous id for `res` — a passive one bound to
/// its source (its QP attributes kept for `rdma_get_request`), an active
/// one resolved to its destination with a QP if `qp_init_attr` is given.
pub(crate) unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's answer of rdma_getaddrinfo, or NULL.
        let Some(info) = (unsafe { res.as_ref() }) else {
            return neg(libc::EINVAL);
        };
        if id.is_null() {
            return neg(libc::EINVAL);
        }
        let mut new: *mut rdma_cm_id = ptr::null_mut();
        let ps = rdma_port_space::try_from(info.ai_port_space).unwrap_or(RDMA_PS_TCP);
        // SAFETY: forwarded.
        if unsafe { rdma_create_id(ptr::null_mut(), &mut new, ptr::null_mut(), ps) } != 0 {
            return -1;
        }
        let fail = |new| {
            let e = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            // SAFETY: the id just made.
            unsafe { rdma_destroy_id(new) };
            neg(e)
        };
        // SAFETY: just made.
        let w = unsafe { id_ref(new) }.expect("an id just made");
        if info.ai_flags & RAI_PASSIVE != 0 {
            // SAFETY: forwarded.
            if unsafe { rdma_bind_addr(new, info.ai_src_addr) } != 0 {
                return fail(new);
            }
            w.ep_pd = if pd.is_null() { w.c.pd } else { pd };
            // SAFETY: the program's attributes, or NULL.
            w.ep_attr = unsafe { qp_init_attr.as_ref() }.map(|a| ibv_qp_init_attr {
                qp_type: qp_type_of(info),
                ..*a
            });
        } else {
            // SAFETY: forwarded.
            if unsafe { rdma_resolve_addr(new, info.ai_src_addr, info.ai_dst_addr, 2000) } != 0
                // SAFETY: forwarded.
                || unsafe { rdma_resolve_route(new, 2000) } != 0
            {
                return fail(new);
            }
            // SAFETY: the program's attributes, or NULL.
            if let Some(attr) = unsafe { qp_init_attr.as_mut() } {
                attr.qp_type = qp_type_of(info);
                // SAFETY: forwarded.
                if unsafe { rdma_create_qp(new, pd, attr) } != 0 {
                    return fail(new);
                }
            }
        }
        // SAFETY: the program's pointer.
        unsafe { *id = new };
        0
    })
}

/// The QP type an address info asks for (RC if it names none).
fn qp_type_of(info: &rdma_addrinfo) -> ibv_qp_type {
    match ibv_qp_type::try_from(info.ai_qp_type) {
        Ok(t) if t != 0 => t,
        _ => IBV_QPT_RC,
    }
}

/// `rdma_destroy_ep`: its QP (and CQs it made), then the id.
pub(crate) unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: forwarded.
        unsafe {
            rdma_destroy_qp(id);
            rdma_destroy_id(id);
        }
    });
}
