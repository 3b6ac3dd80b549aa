//! Devices and contexts: `ibv_get_device_list`, `ibv_open_device`, the
//! queries, and async events.
//!
//! A C `ibv_device` is the first field of a [`Device`] that lives as long as
//! the process (devices do not come and go under a program); a C
//! `ibv_context` sits inside the `verbs_context` that starts a [`Context`],
//! which owns the rverbs context and is freed by `ibv_close_device` alone —
//! objects made through it keep what they need, as in libibverbs.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void};
use std::mem::offset_of;
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::{Mutex, OnceLock};

use rverbs::{AsyncEvent, AsyncEventElement};
use rverbs_ibverbs_abi::abi::*;

use crate::ffi::{errno_of, guard, neg, null, set_errno};

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

/// Every device handed out, by name; never freed (C keeps `ibv_device`
/// pointers past `ibv_free_device_list` as long as contexts use them).
fn registry() -> &'static Mutex<Vec<&'static Device>> {
    static DEVICES: OnceLock<Mutex<Vec<&'static Device>>> = OnceLock::new();
    DEVICES.get_or_init(|| Mutex::new(Vec::new()))
}

fn copy_str(dst: &mut [c_char], s: &str) {
    let room = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as c_char;
    }
}

/// The C device for `dev`, made on first sight.
fn c_device(dev: rverbs::Device) -> &'static Device {
    let mut list = registry().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = list.iter().find(|d| d.rust.name() == dev.name()) {
        return d;
    }
    let mut ibv = ibv_device::default();
    ibv.node_type = IBV_NODE_CA;
    ibv.transport_type = IBV_TRANSPORT_IB;
    let index = list.len();
    copy_str(&mut ibv.name, dev.name());
    copy_str(&mut ibv.dev_name, &format!("uverbs{index}"));
    copy_str(
        &mut ibv.dev_path,
        &format!("/sys/class/infiniband_verbs/uverbs{index}"),
    );
    copy_str(
        &mut ibv.ibdev_path,
        &format!("/sys/class/infiniband/{}", dev.name()),
    );
    let d: &'static Device = Box::leak(Box::new(Device { ibv, rust: dev }));
    list.push(d);
    d
}

/// The `Device` behind a C pointer handed out by `ibv_get_device_list`.
///
/// # Safety
/// `device` must be null or such a pointer.
unsafe fn device_ref<'a>(device: *mut ibv_device) -> Option<&'a Device> {
    // SAFETY: the caller passes a pointer this library made from a leaked
    // `Device` (whose first field is the ibv_device), or null.
    unsafe { device.cast::<Device>().as_ref() }
}

export! { "IBVERBS_1.1"
    /// `ibv_get_device_list`: a NULL-terminated array (free it with
    /// `ibv_free_device_list`), its length in `*num_devices` if not NULL.
    pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
        guard(ptr::null_mut(), || {
            let devices = match rverbs::devices() {
                Ok(d) => d,
                Err(e) => {
                    return null(errno_of(&e));
                }
            };
            let n = devices.len();
            // SAFETY: calloc of n + 1 pointers; checked for NULL below.
            let list = unsafe { libc::calloc(n + 1, std::mem::size_of::<*mut ibv_device>()) }
                .cast::<*mut ibv_device>();
            if list.is_null() {
                return null(libc::ENOMEM);
            }
            for (i, dev) in devices.into_iter().enumerate() {
                let d = c_device(dev);
                // SAFETY: i < n, inside the n + 1 slots allocated; the device
                // is leaked, so the pointer stays valid.
                unsafe { *list.add(i) = ptr::from_ref(&d.ibv).cast_mut() };
            }
            if !num_devices.is_null() {
                // SAFETY: the caller passes a writable int or NULL.
                unsafe { *num_devices = n as c_int };
            }
            list
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_free_device_list`: frees the array (the devices stay).
    pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
        // SAFETY: `list` came from ibv_get_device_list's calloc (or is NULL).
        unsafe { libc::free(list.cast()) }
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_get_device_name`.
    pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
        // SAFETY: a device pointer from ibv_get_device_list, or NULL.
        match unsafe { device_ref(device) } {
            Some(d) => d.ibv.name.as_ptr(),
            None => {
                set_errno(libc::EINVAL);
                ptr::null()
            }
        }
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_get_device_guid`: the node GUID in network byte order.
    pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
        // SAFETY: a device pointer from ibv_get_device_list, or NULL.
        match unsafe { device_ref(device) } {
            Some(d) => d.rust.guid().to_be(),
            None => 0,
        }
    }
}

export! { "IBVERBS_1.9"
    /// `ibv_get_device_index`: its position among the devices.
    pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
        // SAFETY: a device pointer from ibv_get_device_list, or NULL.
        let Some(d) = (unsafe { device_ref(device) }) else {
            return neg(libc::EINVAL);
        };
        let list = registry().lock().unwrap_or_else(|p| p.into_inner());
        list.iter()
            .position(|x| ptr::eq(*x, d))
            .map_or(-1, |i| i as c_int)
    }
}

/// `int rverbs_device_disassociate(struct ibv_device *device)` — an rverbs
/// extension (no libibverbs equivalent): what a hot-unplugged NIC does to
/// its device. Every open context gets IBV_EVENT_DEVICE_FATAL, blocked
/// event readers wake, later verbs fail with EIO, and destroys follow
/// RDMAV_ALLOW_DISASSOC_DESTROY. For testing a program's handling of
/// device loss. 0, or EINVAL for a pointer that is not a device.
#[no_mangle]
pub unsafe extern "C" fn rverbs_device_disassociate(device: *mut ibv_device) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a device pointer from ibv_get_device_list, or NULL.
        match unsafe { device_ref(device) } {
            Some(d) => {
                d.rust.disassociate();
                0
            }
            None => libc::EINVAL,
        }
    })
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
}

/// Open contexts (addresses of their `Context`), for
/// `ibv_ack_async_event`, which names no context.
fn open_contexts() -> std::sync::MutexGuard<'static, Vec<usize>> {
    static OPEN: OnceLock<Mutex<Vec<usize>>> = OnceLock::new();
    OPEN.get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
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

export! { "IBVERBS_1.1"
    /// `ibv_open_device`.
    pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
        guard(ptr::null_mut(), || {
            // SAFETY: a device pointer from ibv_get_device_list, or NULL.
            let Some(d) = (unsafe { device_ref(device) }) else {
                return null(libc::EINVAL);
            };
            let rust = match d.rust.open() {
                Ok(c) => c,
                Err(e) => {
                    return null(errno_of(&e));
                }
            };
            let mut vctx = verbs_context::default();
            vctx.sz = std::mem::size_of::<verbs_context>();
            vctx.query_port = Some(verbs_query_port);
            vctx.query_device_ex = Some(query_device_ex);
            vctx.create_qp_ex = Some(crate::qp::create_qp_ex);
            vctx.create_cq_ex = Some(crate::objects::create_cq_ex);
            // The inline ibv_close_xrcd calls through without a NULL check;
            // no XRC domain can exist (open_xrcd is NULL), so it only
            // answers EOPNOTSUPP.
            vctx.close_xrcd = Some(close_xrcd);
            let c = &mut vctx.context;
            c.device = device;
            c.cmd_fd = -1;
            c.async_fd = rust.async_fd().as_raw_fd();
            c.num_comp_vectors = rust.num_comp_vectors() as c_int;
            c.abi_compat = usize::MAX as *mut c_void;
            c.ops._compat_query_device = Some(ibv_query_device);
            // SAFETY: only the pointer's type changes: _compat_query_port
            // is called with a struct ibv_port_attr (verbs.h's compat type
            // is an incomplete struct standing for it).
            c.ops._compat_query_port = Some(unsafe {
                std::mem::transmute::<
                    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
                    unsafe extern "C" fn(*mut ibv_context, u8, *mut _compat_ibv_port_attr) -> c_int,
                >(ibv_query_port)
            });
            crate::objects::fill_ops(&mut c.ops);
            let ctx = Box::new(Context {
                vctx,
                rust,
                pending: Mutex::new(VecDeque::new()),
            });
            let ctx = Box::into_raw(ctx);
            open_contexts().push(ctx as usize);
            // SAFETY: just allocated; the context member's address is stable.
            unsafe { ptr::addr_of_mut!((*ctx).vctx.context) }
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_close_device`: frees the context only (objects made through it
    /// are not released, as in libibverbs).
    pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
        guard(-1, || {
            // SAFETY: a context this library opened, or NULL.
            let Some(ctx) = (unsafe { context_ref(context) }) else {
                return neg(libc::EINVAL);
            };
            let at = ptr::from_ref(ctx).cast_mut();
            let mut open = open_contexts();
            let Some(i) = open.iter().position(|&c| c == at as usize) else {
                return neg(libc::EINVAL);
            };
            open.swap_remove(i);
            if leak_check() {
                report_leaks(ctx, "at ibv_close_device");
            }
            // SAFETY: the Context was made by Box::into_raw in
            // ibv_open_device and was still listed as open: this is its one
            // close. The list's lock is held, so no ack looks at it now.
            let closed = unsafe { Box::from_raw(at) };
            if leak_check() && !closed.rust.live_resources().is_empty() {
                // Its objects keep it alive anyway; exit reports them again.
                lock_leaked().push(closed.rust);
            }
            0
        })
    }
}

fn c_device_attr(ctx: &Context) -> Result<ibv_device_attr, c_int> {
    let a = ctx.rust.query_device().map_err(|e| errno_of(&e))?;
    let mut out = ibv_device_attr::default();
    copy_str(&mut out.fw_ver, &a.fw_ver);
    out.node_guid = a.node_guid.to_be();
    out.sys_image_guid = a.sys_image_guid.to_be();
    out.max_mr_size = a.max_mr_size;
    out.page_size_cap = a.page_size_cap;
    out.vendor_id = a.vendor_id;
    out.vendor_part_id = a.vendor_part_id;
    out.hw_ver = a.hw_ver;
    let int = |v: u32| c_int::try_from(v).unwrap_or(c_int::MAX);
    out.max_qp = int(a.max_qp);
    out.max_qp_wr = int(a.max_qp_wr);
    out.device_cap_flags = a.device_cap_flags.bits() as _;
    out.max_sge = int(a.max_sge);
    out.max_sge_rd = int(a.max_sge_rd);
    out.max_cq = int(a.max_cq);
    out.max_cqe = int(a.max_cqe);
    out.max_mr = int(a.max_mr);
    out.max_pd = int(a.max_pd);
    out.max_qp_rd_atom = int(a.max_qp_rd_atom);
    out.max_ee_rd_atom = int(a.max_ee_rd_atom);
    out.max_res_rd_atom = int(a.max_res_rd_atom);
    out.max_qp_init_rd_atom = int(a.max_qp_init_rd_atom);
    out.max_ee_init_rd_atom = int(a.max_ee_init_rd_atom);
    out.atomic_cap = a.atomic_cap as _;
    out.max_ee = int(a.max_ee);
    out.max_rdd = int(a.max_rdd);
    out.max_mw = int(a.max_mw);
    out.max_raw_ipv6_qp = int(a.max_raw_ipv6_qp);
    out.max_raw_ethy_qp = int(a.max_raw_ethy_qp);
    out.max_mcast_grp = int(a.max_mcast_grp);
    out.max_mcast_qp_attach = int(a.max_mcast_qp_attach);
    out.max_total_mcast_qp_attach = int(a.max_total_mcast_qp_attach);
    out.max_ah = int(a.max_ah);
    out.max_fmr = int(a.max_fmr);
    out.max_map_per_fmr = int(a.max_map_per_fmr);
    out.max_srq = int(a.max_srq);
    out.max_srq_wr = int(a.max_srq_wr);
    out.max_srq_sge = int(a.max_srq_sge);
    out.max_pkeys = a.max_pkeys;
    out.local_ca_ack_delay = a.local_ca_ack_delay;
    out.phys_port_cnt = a.phys_port_cnt;
    Ok(out)
}

export! { "IBVERBS_1.1"
    /// `ibv_query_device`: 0 or an errno.
    pub unsafe extern "C" fn ibv_query_device(
        context: *mut ibv_context,
        device_attr: *mut ibv_device_attr,
    ) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: a context this library opened, or NULL.
            let Some(ctx) = (unsafe { context_ref(context) }) else {
                return libc::EINVAL;
            };
            if device_attr.is_null() {
                return libc::EINVAL;
            }
            match c_device_attr(ctx) {
                Ok(a) => {
                    // SAFETY: the caller passes a writable ibv_device_attr.
                    unsafe { device_attr.write(a) };
                    0
                }
                Err(e) => e,
            }
        })
    }
}

unsafe extern "C" fn close_xrcd(_xrcd: *mut ibv_xrcd) -> c_int {
    libc::EOPNOTSUPP
}

/// `verbs_context.query_device_ex` (behind the inline
/// `ibv_query_device_ex`): the classic attributes, and no extended
/// capabilities (ODP, TSO, RSS, packet pacing, tag matching: none).
unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a context this library opened, or NULL.
        let Some(ctx) = (unsafe { context_ref(context) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the caller passes a readable input, or NULL.
        if unsafe { input.as_ref() }.is_some_and(|i| i.comp_mask != 0) {
            return libc::EINVAL;
        }
        if attr.is_null() || attr_size < std::mem::size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        match c_device_attr(ctx) {
            Ok(a) => {
                let mut ex = ibv_device_attr_ex::default();
                ex.orig_attr = a;
                let n = attr_size.min(std::mem::size_of::<ibv_device_attr_ex>());
                // SAFETY: the caller's buffer holds attr_size bytes; at most
                // that many are copied from a local.
                unsafe {
                    ptr::write_bytes(attr.cast::<u8>(), 0, n);
                    ptr::copy_nonoverlapping(ptr::from_ref(&ex).cast::<u8>(), attr.cast::<u8>(), n);
                }
                0
            }
            Err(e) => e,
        }
    })
}

fn port_attr(ctx: &Context, port: u8) -> Result<ibv_port_attr, c_int> {
    let p = ctx.rust.query_port(port).map_err(|e| errno_of(&e))?;
    let mut out = ibv_port_attr::default();
    out.state = p.state as _;
    out.max_mtu = p.max_mtu as _;
    out.active_mtu = p.active_mtu as _;
    out.gid_tbl_len = p.gid_tbl_len as c_int;
    out.port_cap_flags = p.port_cap_flags.bits();
    out.max_msg_sz = p.max_msg_sz;
    out.bad_pkey_cntr = p.bad_pkey_cntr;
    out.qkey_viol_cntr = p.qkey_viol_cntr;
    out.pkey_tbl_len = p.pkey_tbl_len;
    out.lid = p.lid;
    out.sm_lid = p.sm_lid;
    out.lmc = p.lmc;
    out.max_vl_num = p.max_vl_num;
    out.sm_sl = p.sm_sl;
    out.subnet_timeout = p.subnet_timeout;
    out.init_type_reply = p.init_type_reply;
    out.active_width = p.active_width;
    out.active_speed = p.active_speed;
    out.phys_state = p.phys_state;
    out.link_layer = p.link_layer as u8;
    out.flags = p.flags;
    Ok(out)
}

export! { "IBVERBS_1.1"
    /// `ibv_query_port` (the exported fallback of the inline wrapper).
    pub unsafe extern "C" fn ibv_query_port(
        context: *mut ibv_context,
        port_num: u8,
        port_attr_out: *mut ibv_port_attr,
    ) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: a context this library opened, or NULL.
            let Some(ctx) = (unsafe { context_ref(context) }) else {
                return libc::EINVAL;
            };
            if port_attr_out.is_null() {
                return libc::EINVAL;
            }
            match port_attr(ctx, port_num) {
                Ok(a) => {
                    // The exported function takes the old, 48-byte struct
                    // (verbs.h passes a `_compat_ibv_port_attr`); the inline
                    // wrapper zeroed the rest of a new one.
                    // SAFETY: the caller passes at least 48 writable bytes;
                    // they are copied from a local.
                    unsafe {
                        ptr::copy_nonoverlapping(
                            ptr::from_ref(&a).cast::<u8>(),
                            port_attr_out.cast::<u8>(),
                            COMPAT_PORT_ATTR_LEN,
                        )
                    };
                    0
                }
                Err(e) => e,
            }
        })
    }
}

/// Bytes of the `_compat_ibv_port_attr` the exported `ibv_query_port`
/// fills: `ibv_port_attr` up to `port_cap_flags2`.
const COMPAT_PORT_ATTR_LEN: usize = std::mem::offset_of!(ibv_port_attr, port_cap_flags2);

/// `verbs_context.query_port`, which the inline `ibv_query_port` calls:
/// fills at most `port_attr_len` bytes.
unsafe extern "C" fn verbs_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr_out: *mut ibv_port_attr,
    port_attr_len: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a context this library opened, or NULL.
        let Some(ctx) = (unsafe { context_ref(context) }) else {
            return libc::EINVAL;
        };
        if port_attr_out.is_null() {
            return libc::EINVAL;
        }
        match port_attr(ctx, port_num) {
            Ok(a) => {
                let n = port_attr_len.min(std::mem::size_of::<ibv_port_attr>());
                // SAFETY: the caller's buffer holds port_attr_len bytes; it
                // is zeroed, then at most that many are copied from a local.
                unsafe {
                    ptr::write_bytes(port_attr_out.cast::<u8>(), 0, port_attr_len);
                    ptr::copy_nonoverlapping(
                        ptr::from_ref(&a).cast::<u8>(),
                        port_attr_out.cast::<u8>(),
                        n,
                    )
                };
                0
            }
            Err(e) => e,
        }
    })
}

export! { "IBVERBS_1.1"
    /// `ibv_query_gid`: 0, or -1 (errno set).
    pub unsafe extern "C" fn ibv_query_gid(
        context: *mut ibv_context,
        port_num: u8,
        index: c_int,
        gid: *mut ibv_gid,
    ) -> c_int {
        guard(-1, || {
            // SAFETY: a context this library opened, or NULL.
            let Some(ctx) = (unsafe { context_ref(context) }) else {
                return neg(libc::EINVAL);
            };
            let Ok(index) = u32::try_from(index) else {
                return neg(libc::EINVAL);
            };
            if gid.is_null() {
                return neg(libc::EINVAL);
            }
            match ctx.rust.query_gid(port_num, index) {
                Ok(g) => {
                    // SAFETY: the caller passes a writable ibv_gid.
                    unsafe { gid.write(ibv_gid { raw: *g.raw() }) };
                    0
                }
                Err(e) => neg(errno_of(&e)),
            }
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_query_pkey`: the P_Key in network byte order; 0, or -1.
    pub unsafe extern "C" fn ibv_query_pkey(
        context: *mut ibv_context,
        port_num: u8,
        index: c_int,
        pkey: *mut u16,
    ) -> c_int {
        guard(-1, || {
            // SAFETY: a context this library opened, or NULL.
            let Some(ctx) = (unsafe { context_ref(context) }) else {
                return neg(libc::EINVAL);
            };
            let Ok(index) = u16::try_from(index) else {
                return neg(libc::EINVAL);
            };
            if pkey.is_null() {
                return neg(libc::EINVAL);
            }
            match ctx.rust.query_pkey(port_num, index) {
                Ok(p) => {
                    // SAFETY: the caller passes a writable u16.
                    unsafe { pkey.write(p.to_be()) };
                    0
                }
                Err(e) => neg(errno_of(&e)),
            }
        })
    }
}

export! { "IBVERBS_1.5"
    /// `ibv_get_pkey_index`: the index of a P_Key (network byte order), or
    /// -1 (errno ENOENT when absent).
    pub unsafe extern "C" fn ibv_get_pkey_index(
        context: *mut ibv_context,
        port_num: u8,
        pkey: u16,
    ) -> c_int {
        guard(-1, || {
            // SAFETY: a context this library opened, or NULL.
            let Some(ctx) = (unsafe { context_ref(context) }) else {
                return neg(libc::EINVAL);
            };
            let len = match ctx.rust.query_port(port_num) {
                Ok(p) => p.pkey_tbl_len,
                Err(e) => {
                    return neg(errno_of(&e));
                }
            };
            for i in 0..len {
                if ctx.rust.query_pkey(port_num, i).is_ok_and(|p| p.to_be() == pkey) {
                    return c_int::from(i);
                }
            }
            neg(libc::ENOENT)
        })
    }
}

fn c_gid_entry(e: &rverbs::attr::GidEntry) -> ibv_gid_entry {
    ibv_gid_entry {
        gid: ibv_gid { raw: *e.gid.raw() },
        gid_index: e.gid_index,
        port_num: e.port_num,
        gid_type: e.gid_type as u32,
        ndev_ifindex: e.ndev_ifindex,
    }
}

fn gid_entry(ctx: &Context, port: u8, index: u32) -> Result<ibv_gid_entry, c_int> {
    let e = ctx
        .rust
        .query_gid_entry(port, index)
        .map_err(|e| errno_of(&e))?;
    Ok(c_gid_entry(&e))
}

export! { "IBVERBS_1.11"
    /// `_ibv_query_gid_ex` (behind the inline `ibv_query_gid_ex`): 0 or an
    /// errno.
    pub unsafe extern "C" fn _ibv_query_gid_ex(
        context: *mut ibv_context,
        port_num: u32,
        gid_index: u32,
        entry: *mut ibv_gid_entry,
        flags: u32,
        entry_size: usize,
    ) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: a context this library opened, or NULL.
            let Some(ctx) = (unsafe { context_ref(context) }) else {
                return libc::EINVAL;
            };
            if flags != 0 || entry.is_null() || entry_size < std::mem::size_of::<ibv_gid_entry>() {
                return libc::EINVAL;
            }
            let Ok(port) = u8::try_from(port_num) else {
                return libc::EINVAL;
            };
            match gid_entry(ctx, port, gid_index) {
                Ok(e) => {
                    // SAFETY: the caller passes entry_size ≥ sizeof bytes.
                    unsafe { entry.write(e) };
                    0
                }
                Err(e) => e,
            }
        })
    }
}

export! { "IBVERBS_1.11"
    /// `_ibv_query_gid_table`: the number of entries written, or -errno.
    pub unsafe extern "C" fn _ibv_query_gid_table(
        context: *mut ibv_context,
        entries: *mut ibv_gid_entry,
        max_entries: usize,
        flags: u32,
        entry_size: usize,
    ) -> isize {
        guard(-(libc::EIO as isize), || {
            // SAFETY: a context this library opened, or NULL.
            let Some(ctx) = (unsafe { context_ref(context) }) else {
                return -(libc::EINVAL as isize);
            };
            if flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
                return -(libc::EINVAL as isize);
            }
            let table = match ctx.rust.query_gid_table() {
                Ok(t) => t,
                Err(e) => return -(errno_of(&e) as isize),
            };
            if table.len() > max_entries {
                return -(libc::EINVAL as isize);
            }
            for (i, e) in table.iter().enumerate() {
                let c = c_gid_entry(e);
                // SAFETY: the caller's array holds max_entries entries of
                // entry_size bytes each, and i < table.len() ≤ max_entries.
                unsafe { entries.cast::<u8>().add(i * entry_size).cast::<ibv_gid_entry>().write_unaligned(c) };
            }
            table.len() as isize
        })
    }
}

export! { "IBVERBS_PRIVATE_34"
    /// `ibv_query_gid_type` (ibv_devinfo uses it): the sysfs GID type,
    /// IBV_GID_TYPE_SYSFS_ROCE_V2 (1) for RoCEv2 entries.
    pub unsafe extern "C" fn ibv_query_gid_type(
        context: *mut ibv_context,
        port_num: u8,
        index: u32,
        gid_type: *mut u32,
    ) -> c_int {
        guard(-1, || {
            // SAFETY: a context this library opened, or NULL.
            let Some(ctx) = (unsafe { context_ref(context) }) else {
                return neg(libc::EINVAL);
            };
            if gid_type.is_null() {
                return neg(libc::EINVAL);
            }
            match gid_entry(ctx, port_num, index) {
                Ok(e) => {
                    let sysfs = u32::from(e.gid_type == IBV_GID_TYPE_ROCE_V2);
                    // SAFETY: the caller passes a writable enum slot.
                    unsafe { gid_type.write(sysfs) };
                    0
                }
                Err(e) => neg(e),
            }
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_get_async_event`: blocks on `async_fd` (or fails with EAGAIN
    /// when the program made it non-blocking); 0, or -1 with errno.
    pub unsafe extern "C" fn ibv_get_async_event(
        context: *mut ibv_context,
        event: *mut ibv_async_event,
    ) -> c_int {
        guard(-1, || {
            // SAFETY: a context this library opened, or NULL.
            let Some(ctx) = (unsafe { context_ref(context) }) else {
                return neg(libc::EINVAL);
            };
            if event.is_null() {
                return neg(libc::EINVAL);
            }
            let ev = match ctx.rust.get_async_event() {
                Ok(ev) => ev,
                Err(e) => {
                    return neg(errno_of(&e));
                }
            };
            let mut out = ibv_async_event::default();
            out.event_type = ev.event_type() as u32;
            match ev.element() {
                AsyncEventElement::Cq { user_data, .. } => out.element.cq = user_data as *mut ibv_cq,
                AsyncEventElement::Qp { user_data, .. } => out.element.qp = user_data as *mut ibv_qp,
                AsyncEventElement::Srq { user_data, .. } => {
                    out.element.srq = user_data as *mut ibv_srq
                }
                AsyncEventElement::Port(p) => out.element.port_num = c_int::from(p),
                _ => {}
            }
            // SAFETY: the caller passes a writable ibv_async_event.
            unsafe { event.write(out) };
            ctx.pending.lock().unwrap_or_else(|p| p.into_inner()).push_back(ev);
            0
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_ack_async_event`: acknowledges the oldest unacknowledged event
    /// of the same type about the same object.
    pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
        guard((), || {
            // SAFETY: the caller passes the event ibv_get_async_event filled.
            let Some(ev) = (unsafe { event.as_ref() }) else { return };
            let element = match ev.event_type {
                IBV_EVENT_CQ_ERR => ElementKey::Pointer(unsafe { ev.element.cq } as u64),
                IBV_EVENT_SRQ_ERR | IBV_EVENT_SRQ_LIMIT_REACHED => {
                    ElementKey::Pointer(unsafe { ev.element.srq } as u64)
                }
                IBV_EVENT_PORT_ACTIVE | IBV_EVENT_PORT_ERR | IBV_EVENT_LID_CHANGE
                | IBV_EVENT_PKEY_CHANGE | IBV_EVENT_SM_CHANGE | IBV_EVENT_CLIENT_REREGISTER
                | IBV_EVENT_GID_CHANGE => ElementKey::Port(unsafe { ev.element.port_num } as u8),
                IBV_EVENT_DEVICE_FATAL => ElementKey::Device,
                _ => ElementKey::Pointer(unsafe { ev.element.qp } as u64),
            };
            let open = open_contexts();
            for &at in open.iter() {
                // SAFETY: contexts are listed while open; the list's lock
                // (held) keeps ibv_close_device from freeing one meanwhile.
                let ctx = unsafe { &*(at as *const Context) };
                let mut pending = ctx.pending.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(i) = pending
                    .iter()
                    .position(|p| p.event_type() as u32 == ev.event_type && key_of(p) == element)
                {
                    let acked = pending.remove(i);
                    bump_event_counter(acked.as_ref());
                    drop(acked);
                    return;
                }
            }
        })
    }
}

#[derive(PartialEq, Eq)]
enum ElementKey {
    Pointer(u64),
    Port(u8),
    Device,
}

fn key_of(ev: &AsyncEvent) -> ElementKey {
    match ev.element() {
        AsyncEventElement::Cq { user_data, .. }
        | AsyncEventElement::Qp { user_data, .. }
        | AsyncEventElement::Srq { user_data, .. } => ElementKey::Pointer(user_data),
        AsyncEventElement::Port(p) => ElementKey::Port(p),
        _ => ElementKey::Device,
    }
}

/// `RVERBS_LEAK_CHECK` is set (and not "0"): `ibv_close_device` and
/// process exit report every object still alive.
fn leak_check() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var_os("RVERBS_LEAK_CHECK").is_some_and(|v| v != "0" && !v.is_empty())
    })
}

/// Contexts closed with objects still alive, reported again at exit if
/// those are still alive then.
fn lock_leaked() -> std::sync::MutexGuard<'static, Vec<rverbs::Context>> {
    static LEAKED: OnceLock<Mutex<Vec<rverbs::Context>>> = OnceLock::new();
    LEAKED
        .get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn report_leaks(ctx: &Context, when: &str) {
    report_context_leaks(&ctx.rust, when);
}

fn report_context_leaks(ctx: &rverbs::Context, when: &str) {
    let dev = ctx.device();
    for r in ctx.live_resources() {
        eprintln!(
            "rverbs: leak {when}: {} {} of context {} on {} is still alive",
            r.kind.name(),
            r.handle,
            ctx.handle(),
            dev.name()
        );
    }
}

/// At process exit: with `RVERBS_COUNTERS` set (and not "0"), every
/// device's non-zero counters on stderr — what a failed run needs to
/// explain itself (drops by reason, retransmissions, NAKs); then the leak
/// report.
pub(crate) extern "C" fn report_at_exit() {
    let counters = std::env::var_os("RVERBS_COUNTERS").is_some_and(|v| v != "0" && !v.is_empty());
    if counters {
        guard((), || {
            for line in rverbs::soft::counters::summary().lines() {
                eprintln!("rverbs: counters of {line}");
            }
        });
    }
    report_leaks_at_exit();
}

/// At process exit (with `RVERBS_LEAK_CHECK`): contexts never closed, and
/// what is still alive of every context.
fn report_leaks_at_exit() {
    if !leak_check() {
        return;
    }
    guard((), || {
        let open = open_contexts();
        for &at in open.iter() {
            // SAFETY: listed contexts are open (the list's lock is held).
            let ctx = unsafe { &*(at as *const Context) };
            eprintln!(
                "rverbs: leak at exit: context {} on {} was never closed",
                ctx.rust.handle(),
                ctx.rust.device().name()
            );
            report_leaks(ctx, "at exit");
        }
        drop(open);
        for ctx in lock_leaked().iter() {
            report_context_leaks(ctx, "at exit");
        }
    });
}

/// `ibv_ack_async_event` counts the event in its object's C struct
/// (`async_events_completed` of a CQ, `events_completed` of a QP or SRQ),
/// as libibverbs does.
fn bump_event_counter(ev: Option<&AsyncEvent>) {
    let Some(ev) = ev else { return };
    let at: *mut u32 = match ev.element() {
        // SAFETY (all three): the user data is the C object, alive while it
        // has an unacknowledged event (its destroy waits for this ack).
        AsyncEventElement::Cq { user_data, .. } => unsafe {
            ptr::addr_of_mut!((*(user_data as *mut ibv_cq)).async_events_completed)
        },
        AsyncEventElement::Qp { user_data, .. } => unsafe {
            ptr::addr_of_mut!((*(user_data as *mut ibv_qp)).events_completed)
        },
        AsyncEventElement::Srq { user_data, .. } => unsafe {
            ptr::addr_of_mut!((*(user_data as *mut ibv_srq)).events_completed)
        },
        _ => return,
    };
    crate::objects::counter(at).fetch_add(1, std::sync::atomic::Ordering::AcqRel);
}
