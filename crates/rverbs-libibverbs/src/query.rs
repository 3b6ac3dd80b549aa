//! Device and port queries: `ibv_query_device` and the `query_device_ex`
//! slot, `ibv_query_port` and the `query_port` slot, GIDs (one, one entry,
//! the table, an entry's type) and P_Keys.

use std::ffi::c_int;
use std::ptr;

use rverbs_ibverbs_abi::abi::*;

use crate::convert::copy_str;
use crate::ffi::{errno_of, guard, neg};
use crate::handles::{context_ref, Context};

/// The C attributes of the context's device.
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

/// `verbs_context.query_device_ex` (behind the inline
/// `ibv_query_device_ex`): the classic attributes, the port count again
/// (`phys_port_cnt_ex`) and the capability flags as 64 bits
/// (`device_cap_flags_ex`: beyond the classic 32 only ATOMIC WRITE, bit
/// 40, as rxe sets it), and no other
/// extended capability (ODP, timestamps, TSO, RSS, packet pacing, tag
/// matching, CQ moderation, device memory: none, as on the kernel's
/// Soft-RoCE).
pub(crate) unsafe extern "C" fn query_device_ex(
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
                ex.phys_port_cnt_ex = u32::from(a.phys_port_cnt);
                ex.device_cap_flags_ex =
                    u64::from(a.device_cap_flags) | IB_UVERBS_DEVICE_ATOMIC_WRITE;
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

/// The C attributes of a port.
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
pub(crate) unsafe extern "C" fn verbs_query_port(
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
