//! The device context: `ibv_context` with its ops table, and the
//! `verbs_context` that surrounds it.

use core::ffi::{c_int, c_uint, c_void};

use super::*;

opaque! {
    /// `struct _compat_ibv_port_attr`: what the exported `ibv_query_port` is
    /// declared to take; callers pass an [`ibv_port_attr`].
    _compat_ibv_port_attr;
    /// `struct verbs_ex_private`: rdma-core's private part of a `verbs_context`.
    verbs_ex_private;
}

/// `struct ibv_context_ops`: the 32 slots the inline wrappers call through.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_context_ops {
    /// Legacy `ibv_query_device` entry (rdma-core fills it).
    pub _compat_query_device: Option<
        unsafe extern "C" fn(context: *mut ibv_context, device_attr: *mut ibv_device_attr) -> c_int,
    >,
    /// Legacy `ibv_query_port` entry (rdma-core fills it).
    pub _compat_query_port: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            port_num: u8,
            port_attr: *mut _compat_ibv_port_attr,
        ) -> c_int,
    >,
    /// Unused.
    pub _compat_alloc_pd: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_dealloc_pd: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_reg_mr: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_rereg_mr: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_dereg_mr: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Called by the inline `ibv_alloc_mw`.
    pub alloc_mw: Option<unsafe extern "C" fn(pd: *mut ibv_pd, type_: ibv_mw_type) -> *mut ibv_mw>,
    /// Called by the inline `ibv_bind_mw`.
    pub bind_mw: Option<
        unsafe extern "C" fn(qp: *mut ibv_qp, mw: *mut ibv_mw, mw_bind: *mut ibv_mw_bind) -> c_int,
    >,
    /// Called by the inline `ibv_dealloc_mw`.
    pub dealloc_mw: Option<unsafe extern "C" fn(mw: *mut ibv_mw) -> c_int>,
    /// Unused.
    pub _compat_create_cq: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Called by the inline `ibv_poll_cq`.
    pub poll_cq:
        Option<unsafe extern "C" fn(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int>,
    /// Called by the inline `ibv_req_notify_cq`.
    pub req_notify_cq:
        Option<unsafe extern "C" fn(cq: *mut ibv_cq, solicited_only: c_int) -> c_int>,
    /// Unused.
    pub _compat_cq_event: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_resize_cq: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_destroy_cq: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_create_srq: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_modify_srq: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_query_srq: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_destroy_srq: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Called by the inline `ibv_post_srq_recv`.
    pub post_srq_recv: Option<
        unsafe extern "C" fn(
            srq: *mut ibv_srq,
            recv_wr: *mut ibv_recv_wr,
            bad_recv_wr: *mut *mut ibv_recv_wr,
        ) -> c_int,
    >,
    /// Unused.
    pub _compat_create_qp: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_query_qp: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_modify_qp: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_destroy_qp: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Called by the inline `ibv_post_send`.
    pub post_send: Option<
        unsafe extern "C" fn(
            qp: *mut ibv_qp,
            wr: *mut ibv_send_wr,
            bad_wr: *mut *mut ibv_send_wr,
        ) -> c_int,
    >,
    /// Called by the inline `ibv_post_recv`.
    pub post_recv: Option<
        unsafe extern "C" fn(
            qp: *mut ibv_qp,
            wr: *mut ibv_recv_wr,
            bad_wr: *mut *mut ibv_recv_wr,
        ) -> c_int,
    >,
    /// Unused.
    pub _compat_create_ah: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_destroy_ah: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_attach_mcast: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_detach_mcast: Option<unsafe extern "C" fn() -> *mut c_void>,
    /// Unused.
    pub _compat_async_event: Option<unsafe extern "C" fn() -> *mut c_void>,
}

/// `struct ibv_context`: an open device, as `ibv_open_device` returns it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_context {
    /// The device this context was opened on.
    pub device: *mut ibv_device,
    /// Slots called by the inline wrappers.
    pub ops: ibv_context_ops,
    /// Command file descriptor.
    pub cmd_fd: c_int,
    /// Async event file descriptor (pollable).
    pub async_fd: c_int,
    /// Number of completion vectors.
    pub num_comp_vectors: c_int,
    /// Context mutex.
    pub mutex: libc::pthread_mutex_t,
    /// [`__VERBS_ABI_IS_EXTENDED`] when a [`verbs_context`] surrounds this context.
    pub abi_compat: *mut c_void,
}

/// `struct ibv_values_ex`: what `ibv_query_rt_values_ex` reports.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_values_ex {
    /// [`ibv_values_mask`] bits.
    pub comp_mask: u32,
    /// Raw HCA clock.
    pub raw_clock: libc::timespec,
}

/// `struct verbs_context`: the extended ops, laid out in memory just before
/// the `ibv_context` they belong to (found through `abi_compat` and `sz`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct verbs_context {
    /// Called by the inline `ibv_query_port`; NULL falls back to the export.
    pub query_port: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            port_num: u8,
            port_attr: *mut ibv_port_attr,
            port_attr_len: usize,
        ) -> c_int,
    >,
    /// `ibv_advise_mr`.
    pub advise_mr: Option<
        unsafe extern "C" fn(
            pd: *mut ibv_pd,
            advice: ibv_advise_mr_advice,
            flags: u32,
            sg_list: *mut ibv_sge,
            num_sges: u32,
        ) -> c_int,
    >,
    /// `ibv_alloc_null_mr`.
    pub alloc_null_mr: Option<unsafe extern "C" fn(pd: *mut ibv_pd) -> *mut ibv_mr>,
    /// `ibv_read_counters`.
    pub read_counters: Option<
        unsafe extern "C" fn(
            counters: *mut ibv_counters,
            counters_value: *mut u64,
            ncounters: u32,
            flags: u32,
        ) -> c_int,
    >,
    /// `ibv_attach_counters_point_flow`.
    pub attach_counters_point_flow: Option<
        unsafe extern "C" fn(
            counters: *mut ibv_counters,
            attr: *mut ibv_counter_attach_attr,
            flow: *mut ibv_flow,
        ) -> c_int,
    >,
    /// `ibv_create_counters`.
    pub create_counters: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            init_attr: *mut ibv_counters_init_attr,
        ) -> *mut ibv_counters,
    >,
    /// `ibv_destroy_counters`.
    pub destroy_counters: Option<unsafe extern "C" fn(counters: *mut ibv_counters) -> c_int>,
    /// `ibv_reg_dm_mr`.
    pub reg_dm_mr: Option<
        unsafe extern "C" fn(
            pd: *mut ibv_pd,
            dm: *mut ibv_dm,
            dm_offset: u64,
            length: usize,
            access: c_uint,
        ) -> *mut ibv_mr,
    >,
    /// `ibv_alloc_dm`.
    pub alloc_dm: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            attr: *mut ibv_alloc_dm_attr,
        ) -> *mut ibv_dm,
    >,
    /// `ibv_free_dm`.
    pub free_dm: Option<unsafe extern "C" fn(dm: *mut ibv_dm) -> c_int>,
    /// `ibv_modify_flow_action_esp`.
    pub modify_flow_action_esp: Option<
        unsafe extern "C" fn(
            action: *mut ibv_flow_action,
            attr: *mut ibv_flow_action_esp_attr,
        ) -> c_int,
    >,
    /// `ibv_destroy_flow_action`.
    pub destroy_flow_action: Option<unsafe extern "C" fn(action: *mut ibv_flow_action) -> c_int>,
    /// `ibv_create_flow_action_esp`.
    pub create_flow_action_esp: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            attr: *mut ibv_flow_action_esp_attr,
        ) -> *mut ibv_flow_action,
    >,
    /// `ibv_modify_qp_rate_limit`.
    pub modify_qp_rate_limit:
        Option<unsafe extern "C" fn(qp: *mut ibv_qp, attr: *mut ibv_qp_rate_limit_attr) -> c_int>,
    /// `ibv_alloc_parent_domain`.
    pub alloc_parent_domain: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            attr: *mut ibv_parent_domain_init_attr,
        ) -> *mut ibv_pd,
    >,
    /// `ibv_dealloc_td`.
    pub dealloc_td: Option<unsafe extern "C" fn(td: *mut ibv_td) -> c_int>,
    /// `ibv_alloc_td`.
    pub alloc_td: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            init_attr: *mut ibv_td_init_attr,
        ) -> *mut ibv_td,
    >,
    /// `ibv_modify_cq`.
    pub modify_cq:
        Option<unsafe extern "C" fn(cq: *mut ibv_cq, attr: *mut ibv_modify_cq_attr) -> c_int>,
    /// `ibv_post_srq_ops`.
    pub post_srq_ops: Option<
        unsafe extern "C" fn(
            srq: *mut ibv_srq,
            op: *mut ibv_ops_wr,
            bad_op: *mut *mut ibv_ops_wr,
        ) -> c_int,
    >,
    /// `ibv_destroy_rwq_ind_table`.
    pub destroy_rwq_ind_table:
        Option<unsafe extern "C" fn(rwq_ind_table: *mut ibv_rwq_ind_table) -> c_int>,
    /// `ibv_create_rwq_ind_table`.
    pub create_rwq_ind_table: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            init_attr: *mut ibv_rwq_ind_table_init_attr,
        ) -> *mut ibv_rwq_ind_table,
    >,
    /// `ibv_destroy_wq`.
    pub destroy_wq: Option<unsafe extern "C" fn(wq: *mut ibv_wq) -> c_int>,
    /// `ibv_modify_wq`.
    pub modify_wq:
        Option<unsafe extern "C" fn(wq: *mut ibv_wq, wq_attr: *mut ibv_wq_attr) -> c_int>,
    /// `ibv_create_wq`.
    pub create_wq: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            wq_init_attr: *mut ibv_wq_init_attr,
        ) -> *mut ibv_wq,
    >,
    /// `ibv_query_rt_values_ex`.
    pub query_rt_values: Option<
        unsafe extern "C" fn(context: *mut ibv_context, values: *mut ibv_values_ex) -> c_int,
    >,
    /// `ibv_create_cq_ex`.
    pub create_cq_ex: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            init_attr: *mut ibv_cq_init_attr_ex,
        ) -> *mut ibv_cq_ex,
    >,
    /// rdma-core's private data.
    pub r#priv: *mut verbs_ex_private,
    /// Called by the inline `ibv_query_device_ex`; NULL (or EOPNOTSUPP) falls
    /// back to `ibv_query_device`.
    pub query_device_ex: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            input: *const ibv_query_device_ex_input,
            attr: *mut ibv_device_attr_ex,
            attr_size: usize,
        ) -> c_int,
    >,
    /// `ibv_destroy_flow`.
    pub ibv_destroy_flow: Option<unsafe extern "C" fn(flow: *mut ibv_flow) -> c_int>,
    /// Placeholder, never called.
    pub ABI_placeholder2: Option<unsafe extern "C" fn()>,
    /// `ibv_create_flow`.
    pub ibv_create_flow: Option<
        unsafe extern "C" fn(qp: *mut ibv_qp, flow_attr: *mut ibv_flow_attr) -> *mut ibv_flow,
    >,
    /// Placeholder, never called.
    pub ABI_placeholder1: Option<unsafe extern "C" fn()>,
    /// `ibv_open_qp`.
    pub open_qp: Option<
        unsafe extern "C" fn(context: *mut ibv_context, attr: *mut ibv_qp_open_attr) -> *mut ibv_qp,
    >,
    /// `ibv_create_qp_ex`; NULL falls back to `ibv_create_qp` when only the
    /// classic fields are used.
    pub create_qp_ex: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            qp_init_attr_ex: *mut ibv_qp_init_attr_ex,
        ) -> *mut ibv_qp,
    >,
    /// `ibv_get_srq_num`.
    pub get_srq_num: Option<unsafe extern "C" fn(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int>,
    /// `ibv_create_srq_ex`; NULL falls back to `ibv_create_srq` for basic SRQs.
    pub create_srq_ex: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            srq_init_attr_ex: *mut ibv_srq_init_attr_ex,
        ) -> *mut ibv_srq,
    >,
    /// `ibv_open_xrcd`.
    pub open_xrcd: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            xrcd_init_attr: *mut ibv_xrcd_init_attr,
        ) -> *mut ibv_xrcd,
    >,
    /// `ibv_close_xrcd` (called without a NULL check).
    pub close_xrcd: Option<unsafe extern "C" fn(xrcd: *mut ibv_xrcd) -> c_int>,
    /// Placeholder.
    pub _ABI_placeholder3: u64,
    /// Bytes of this struct, counted back from its end, the library filled:
    /// a slot counts when `sz >= size_of::<verbs_context>() - offset_of(slot)`
    /// (648, the whole struct, for all); must be just before `context`.
    pub sz: usize,
    /// The classic context; must be the last member.
    pub context: ibv_context,
}

zeroed_default!(ibv_context, ibv_values_ex, verbs_context);
