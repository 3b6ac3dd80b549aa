//! The verbs objects (PD, MR, MW, AH, CQ, QP, SRQ, WQ, …) and the attribute
//! structs that create, modify and query them.

use core::ffi::{c_int, c_uint, c_void};

use super::*;

opaque! {
    /// `struct ibv_flow_action_esp` (`struct ib_uverbs_flow_action_esp`):
    /// ESP parameters, only pointed to here.
    ibv_flow_action_esp;
    /// `struct ibv_flow_action_esp_encap` (`struct ib_uverbs_flow_action_esp_encap`):
    /// ESP tunnel encapsulation, only pointed to here.
    ibv_flow_action_esp_encap;
}

/// `struct ibv_alloc_dm_attr`: `ibv_alloc_dm` input.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_alloc_dm_attr {
    /// Bytes of device memory.
    pub length: usize,
    /// Required alignment (log2).
    pub log_align_req: u32,
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_dm`: device memory.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_dm {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Called by the inline `ibv_memcpy_to_dm`.
    pub memcpy_to_dm: Option<
        unsafe extern "C" fn(
            dm: *mut ibv_dm,
            dm_offset: u64,
            host_addr: *const c_void,
            length: usize,
        ) -> c_int,
    >,
    /// Called by the inline `ibv_memcpy_from_dm`.
    pub memcpy_from_dm: Option<
        unsafe extern "C" fn(
            host_addr: *mut c_void,
            dm: *mut ibv_dm,
            dm_offset: u64,
            length: usize,
        ) -> c_int,
    >,
    /// [`ibv_dm_mask`] bits.
    pub comp_mask: u32,
    /// Kernel handle.
    pub handle: u32,
}

/// `struct ibv_pd`: protection domain.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_pd {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Kernel handle.
    pub handle: u32,
}

/// `struct ibv_td_init_attr`: `ibv_alloc_td` input.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_td_init_attr {
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_td`: thread domain.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_td {
    /// Owning context.
    pub context: *mut ibv_context,
}

/// `struct ibv_xrcd_init_attr`: `ibv_open_xrcd` input.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_xrcd_init_attr {
    /// [`ibv_xrcd_init_attr_mask`] bits.
    pub comp_mask: u32,
    /// File descriptor naming the XRC domain.
    pub fd: c_int,
    /// `O_CREAT`/`O_EXCL`.
    pub oflags: c_int,
}

/// `struct ibv_xrcd`: XRC domain.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_xrcd {
    /// Owning context.
    pub context: *mut ibv_context,
}

/// `struct ibv_mr`: memory region.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mr {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Protection domain.
    pub pd: *mut ibv_pd,
    /// Start address.
    pub addr: *mut c_void,
    /// Length in bytes.
    pub length: usize,
    /// Kernel handle.
    pub handle: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// `struct ibv_mw`: memory window.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Protection domain.
    pub pd: *mut ibv_pd,
    /// Remote key.
    pub rkey: u32,
    /// Kernel handle.
    pub handle: u32,
    /// Window type.
    pub r#type: ibv_mw_type,
}

/// `struct ibv_global_route`: the GRH part of an address vector.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_global_route {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Source GID table index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`: address vector.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ah_attr {
    /// Global route (used when `is_global`).
    pub grh: ibv_global_route,
    /// Destination LID.
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// [`ibv_rate`].
    pub static_rate: u8,
    /// Non-zero when `grh` is valid.
    pub is_global: u8,
    /// Port number.
    pub port_num: u8,
}

/// `struct ibv_ah`: address handle.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ah {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Protection domain.
    pub pd: *mut ibv_pd,
    /// Kernel handle.
    pub handle: u32,
}

/// `struct ibv_srq_attr`: SRQ attributes.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    /// Maximum outstanding WRs.
    pub max_wr: u32,
    /// Maximum SGEs per WR.
    pub max_sge: u32,
    /// Limit for `IBV_EVENT_SRQ_LIMIT_REACHED`.
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`: `ibv_create_srq` input.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_srq_init_attr {
    /// User context for events.
    pub srq_context: *mut c_void,
    /// Requested sizes (updated with the actual ones).
    pub attr: ibv_srq_attr,
}

/// `struct ibv_tm_cap`: tag matching sizes of a TM SRQ.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_tm_cap {
    /// Tag list size.
    pub max_num_tags: u32,
    /// Outstanding tag operations.
    pub max_ops: u32,
}

/// `struct ibv_srq_init_attr_ex`: `ibv_create_srq_ex` input.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_srq_init_attr_ex {
    /// User context for events.
    pub srq_context: *mut c_void,
    /// Requested sizes.
    pub attr: ibv_srq_attr,
    /// [`ibv_srq_init_attr_mask`] bits.
    pub comp_mask: u32,
    /// SRQ type.
    pub srq_type: ibv_srq_type,
    /// Protection domain.
    pub pd: *mut ibv_pd,
    /// XRC domain (XRC SRQ).
    pub xrcd: *mut ibv_xrcd,
    /// Completion queue (XRC SRQ).
    pub cq: *mut ibv_cq,
    /// Tag matching sizes (TM SRQ).
    pub tm_cap: ibv_tm_cap,
}

/// `struct ibv_wq_init_attr`: `ibv_create_wq` input.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_wq_init_attr {
    /// User context for events.
    pub wq_context: *mut c_void,
    /// WQ type.
    pub wq_type: ibv_wq_type,
    /// Maximum outstanding WRs.
    pub max_wr: u32,
    /// Maximum SGEs per WR.
    pub max_sge: u32,
    /// Protection domain.
    pub pd: *mut ibv_pd,
    /// Completion queue.
    pub cq: *mut ibv_cq,
    /// [`ibv_wq_init_attr_mask`] bits.
    pub comp_mask: u32,
    /// [`ibv_wq_flags`] bits.
    pub create_flags: u32,
}

/// `struct ibv_wq_attr`: `ibv_modify_wq` input.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wq_attr {
    /// [`ibv_wq_attr_mask`] bits.
    pub attr_mask: u32,
    /// New state.
    pub wq_state: ibv_wq_state,
    /// Assumed current state.
    pub curr_wq_state: ibv_wq_state,
    /// [`ibv_wq_flags`] values.
    pub flags: u32,
    /// [`ibv_wq_flags`] to change.
    pub flags_mask: u32,
}

/// `struct ibv_rwq_ind_table`: receive WQ indirection table.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_rwq_ind_table {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Kernel handle.
    pub ind_tbl_handle: c_int,
    /// Table number.
    pub ind_tbl_num: c_int,
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_rwq_ind_table_init_attr`: `ibv_create_rwq_ind_table` input.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_rwq_ind_table_init_attr {
    /// Table size (log2).
    pub log_ind_tbl_size: u32,
    /// The receive WQs.
    pub ind_tbl: *mut *mut ibv_wq,
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_qp_cap`: QP queue sizes.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    /// Send queue WRs.
    pub max_send_wr: u32,
    /// Receive queue WRs.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send WR.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`: `ibv_create_qp` input.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_init_attr {
    /// User context for events.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// Shared receive queue, or NULL.
    pub srq: *mut ibv_srq,
    /// Requested sizes (updated with the actual ones).
    pub cap: ibv_qp_cap,
    /// QP type.
    pub qp_type: ibv_qp_type,
    /// Non-zero: every send WR generates a completion.
    pub sq_sig_all: c_int,
}

/// `struct ibv_rx_hash_conf`: RSS configuration of a QP.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_rx_hash_conf {
    /// [`ibv_rx_hash_function_flags`].
    pub rx_hash_function: u8,
    /// Key length.
    pub rx_hash_key_len: u8,
    /// Key.
    pub rx_hash_key: *mut u8,
    /// [`ibv_rx_hash_fields`] bits.
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex`: `ibv_create_qp_ex` input.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_init_attr_ex {
    /// User context for events.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// Shared receive queue, or NULL.
    pub srq: *mut ibv_srq,
    /// Requested sizes (updated with the actual ones).
    pub cap: ibv_qp_cap,
    /// QP type.
    pub qp_type: ibv_qp_type,
    /// Non-zero: every send WR generates a completion.
    pub sq_sig_all: c_int,
    /// [`ibv_qp_init_attr_mask`] bits.
    pub comp_mask: u32,
    /// Protection domain.
    pub pd: *mut ibv_pd,
    /// XRC domain.
    pub xrcd: *mut ibv_xrcd,
    /// [`ibv_qp_create_flags`] bits.
    pub create_flags: u32,
    /// Maximum TSO header.
    pub max_tso_header: u16,
    /// Indirection table (RSS).
    pub rwq_ind_tbl: *mut ibv_rwq_ind_table,
    /// RSS configuration.
    pub rx_hash_conf: ibv_rx_hash_conf,
    /// Source QPN (`IBV_QP_CREATE_SOURCE_QPN`).
    pub source_qpn: u32,
    /// [`ibv_qp_create_send_ops_flags`] bits.
    pub send_ops_flags: u64,
}

/// `struct ibv_qp_open_attr`: `ibv_open_qp` input.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_open_attr {
    /// [`ibv_qp_open_attr_mask`] bits.
    pub comp_mask: u32,
    /// QP number.
    pub qp_num: u32,
    /// XRC domain.
    pub xrcd: *mut ibv_xrcd,
    /// User context for events.
    pub qp_context: *mut c_void,
    /// QP type.
    pub qp_type: ibv_qp_type,
}

/// `struct ibv_qp_attr`: `ibv_modify_qp` / `ibv_query_qp` attributes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_attr {
    /// Target state.
    pub qp_state: ibv_qp_state,
    /// Assumed current state.
    pub cur_qp_state: ibv_qp_state,
    /// Path MTU.
    pub path_mtu: ibv_mtu,
    /// Path migration state.
    pub path_mig_state: ibv_mig_state,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Destination QP number.
    pub dest_qp_num: u32,
    /// [`ibv_access_flags`] for remote access.
    pub qp_access_flags: c_uint,
    /// Queue sizes.
    pub cap: ibv_qp_cap,
    /// Primary path.
    pub ah_attr: ibv_ah_attr,
    /// Alternate path.
    pub alt_ah_attr: ibv_ah_attr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Alternate P_Key index.
    pub alt_pkey_index: u16,
    /// Request SQ drained event.
    pub en_sqd_async_notify: u8,
    /// SQ draining (query only).
    pub sq_draining: u8,
    /// Outstanding RDMA reads/atomics as initiator.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA reads/atomics as target.
    pub max_dest_rd_atomic: u8,
    /// Minimum RNR NAK timer.
    pub min_rnr_timer: u8,
    /// Port number.
    pub port_num: u8,
    /// Local ack timeout.
    pub timeout: u8,
    /// Transport retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
    /// Alternate port number.
    pub alt_port_num: u8,
    /// Alternate local ack timeout.
    pub alt_timeout: u8,
    /// Rate limit (kbps).
    pub rate_limit: u32,
}

/// `struct ibv_qp_rate_limit_attr`: `ibv_modify_qp_rate_limit` input.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_rate_limit_attr {
    /// Rate (kbps).
    pub rate_limit: u32,
    /// Burst size (bytes).
    pub max_burst_sz: u32,
    /// Typical packet size (bytes).
    pub typical_pkt_sz: u16,
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_srq`: shared receive queue.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_srq {
    /// Owning context.
    pub context: *mut ibv_context,
    /// User context for events.
    pub srq_context: *mut c_void,
    /// Protection domain.
    pub pd: *mut ibv_pd,
    /// Kernel handle.
    pub handle: u32,
    /// Protects `events_completed`.
    pub mutex: libc::pthread_mutex_t,
    /// Signalled when `events_completed` grows.
    pub cond: libc::pthread_cond_t,
    /// Async events acknowledged.
    pub events_completed: u32,
}

/// `struct ibv_wq`: work queue.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_wq {
    /// Owning context.
    pub context: *mut ibv_context,
    /// User context for events.
    pub wq_context: *mut c_void,
    /// Protection domain.
    pub pd: *mut ibv_pd,
    /// Completion queue.
    pub cq: *mut ibv_cq,
    /// WQ number.
    pub wq_num: u32,
    /// Kernel handle.
    pub handle: u32,
    /// Current state.
    pub state: ibv_wq_state,
    /// WQ type.
    pub wq_type: ibv_wq_type,
    /// Called by the inline `ibv_post_wq_recv`.
    pub post_recv: Option<
        unsafe extern "C" fn(
            current: *mut ibv_wq,
            recv_wr: *mut ibv_recv_wr,
            bad_recv_wr: *mut *mut ibv_recv_wr,
        ) -> c_int,
    >,
    /// Protects `events_completed`.
    pub mutex: libc::pthread_mutex_t,
    /// Signalled when `events_completed` grows.
    pub cond: libc::pthread_cond_t,
    /// Async events acknowledged.
    pub events_completed: u32,
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_qp`: queue pair.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp {
    /// Owning context.
    pub context: *mut ibv_context,
    /// User context for events.
    pub qp_context: *mut c_void,
    /// Protection domain.
    pub pd: *mut ibv_pd,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// Shared receive queue, or NULL.
    pub srq: *mut ibv_srq,
    /// Kernel handle.
    pub handle: u32,
    /// QP number.
    pub qp_num: u32,
    /// Current state.
    pub state: ibv_qp_state,
    /// QP type.
    pub qp_type: ibv_qp_type,
    /// Protects `events_completed`.
    pub mutex: libc::pthread_mutex_t,
    /// Signalled when `events_completed` grows.
    pub cond: libc::pthread_cond_t,
    /// Async events acknowledged.
    pub events_completed: u32,
}

/// `struct ibv_qp_ex`: a QP with the `ibv_wr_*` work request builder interface.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_ex {
    /// The classic QP (`ibv_qp_ex` starts with it).
    pub qp_base: ibv_qp,
    /// Must be 0.
    pub comp_mask: u64,
    /// `wr_id` of the WR being built.
    pub wr_id: u64,
    /// [`ibv_send_flags`] of the WR being built.
    pub wr_flags: c_uint,
    /// `ibv_wr_atomic_cmp_swp`.
    pub wr_atomic_cmp_swp: Option<
        unsafe extern "C" fn(
            qp: *mut ibv_qp_ex,
            rkey: u32,
            remote_addr: u64,
            compare: u64,
            swap: u64,
        ),
    >,
    /// `ibv_wr_atomic_fetch_add`.
    pub wr_atomic_fetch_add:
        Option<unsafe extern "C" fn(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, add: u64)>,
    /// `ibv_wr_bind_mw`.
    pub wr_bind_mw: Option<
        unsafe extern "C" fn(
            qp: *mut ibv_qp_ex,
            mw: *mut ibv_mw,
            rkey: u32,
            bind_info: *const ibv_mw_bind_info,
        ),
    >,
    /// `ibv_wr_local_inv`.
    pub wr_local_inv: Option<unsafe extern "C" fn(qp: *mut ibv_qp_ex, invalidate_rkey: u32)>,
    /// `ibv_wr_rdma_read`.
    pub wr_rdma_read: Option<unsafe extern "C" fn(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64)>,
    /// `ibv_wr_rdma_write`.
    pub wr_rdma_write:
        Option<unsafe extern "C" fn(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64)>,
    /// `ibv_wr_rdma_write_imm`.
    pub wr_rdma_write_imm: Option<
        unsafe extern "C" fn(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm_data: __be32),
    >,
    /// `ibv_wr_send`.
    pub wr_send: Option<unsafe extern "C" fn(qp: *mut ibv_qp_ex)>,
    /// `ibv_wr_send_imm`.
    pub wr_send_imm: Option<unsafe extern "C" fn(qp: *mut ibv_qp_ex, imm_data: __be32)>,
    /// `ibv_wr_send_inv`.
    pub wr_send_inv: Option<unsafe extern "C" fn(qp: *mut ibv_qp_ex, invalidate_rkey: u32)>,
    /// `ibv_wr_send_tso`.
    pub wr_send_tso:
        Option<unsafe extern "C" fn(qp: *mut ibv_qp_ex, hdr: *mut c_void, hdr_sz: u16, mss: u16)>,
    /// `ibv_wr_set_ud_addr`.
    pub wr_set_ud_addr: Option<
        unsafe extern "C" fn(
            qp: *mut ibv_qp_ex,
            ah: *mut ibv_ah,
            remote_qpn: u32,
            remote_qkey: u32,
        ),
    >,
    /// `ibv_wr_set_xrc_srqn`.
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(qp: *mut ibv_qp_ex, remote_srqn: u32)>,
    /// `ibv_wr_set_inline_data`.
    pub wr_set_inline_data:
        Option<unsafe extern "C" fn(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize)>,
    /// `ibv_wr_set_inline_data_list`.
    pub wr_set_inline_data_list: Option<
        unsafe extern "C" fn(qp: *mut ibv_qp_ex, num_buf: usize, buf_list: *const ibv_data_buf),
    >,
    /// `ibv_wr_set_sge`.
    pub wr_set_sge:
        Option<unsafe extern "C" fn(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32)>,
    /// `ibv_wr_set_sge_list`.
    pub wr_set_sge_list:
        Option<unsafe extern "C" fn(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge)>,
    /// `ibv_wr_start`.
    pub wr_start: Option<unsafe extern "C" fn(qp: *mut ibv_qp_ex)>,
    /// `ibv_wr_complete`.
    pub wr_complete: Option<unsafe extern "C" fn(qp: *mut ibv_qp_ex) -> c_int>,
    /// `ibv_wr_abort`.
    pub wr_abort: Option<unsafe extern "C" fn(qp: *mut ibv_qp_ex)>,
    /// `ibv_wr_atomic_write`.
    pub wr_atomic_write: Option<
        unsafe extern "C" fn(
            qp: *mut ibv_qp_ex,
            rkey: u32,
            remote_addr: u64,
            atomic_wr: *const c_void,
        ),
    >,
}

/// `struct ibv_ece`: enhanced connection establishment options.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ece {
    /// IEEE OUI of the provider.
    pub vendor_id: u32,
    /// Provider-specific options.
    pub options: u32,
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_comp_channel`: completion event channel.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_comp_channel {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Pollable descriptor read by `ibv_get_cq_event`.
    pub fd: c_int,
    /// Number of CQs using the channel.
    pub refcnt: c_int,
}

/// `struct ibv_cq`: completion queue.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_cq {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Completion channel, or NULL.
    pub channel: *mut ibv_comp_channel,
    /// User context returned by `ibv_get_cq_event`.
    pub cq_context: *mut c_void,
    /// Kernel handle.
    pub handle: u32,
    /// Number of entries.
    pub cqe: c_int,
    /// Protects the event counters.
    pub mutex: libc::pthread_mutex_t,
    /// Signalled when an event counter grows.
    pub cond: libc::pthread_cond_t,
    /// Completion events acknowledged.
    pub comp_events_completed: u32,
    /// Async events acknowledged.
    pub async_events_completed: u32,
}

/// `struct ibv_poll_cq_attr`: `ibv_start_poll` input.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_poll_cq_attr {
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_wc_tm_info`: tag matching info of an extended completion.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc_tm_info {
    /// Tag from the TMH.
    pub tag: u64,
    /// Opaque user data from the TMH.
    pub r#priv: u32,
}

/// `struct ibv_cq_ex`: extended completion queue (starts like [`ibv_cq`]).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_cq_ex {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Completion channel, or NULL.
    pub channel: *mut ibv_comp_channel,
    /// User context returned by `ibv_get_cq_event`.
    pub cq_context: *mut c_void,
    /// Kernel handle.
    pub handle: u32,
    /// Number of entries.
    pub cqe: c_int,
    /// Protects the event counters.
    pub mutex: libc::pthread_mutex_t,
    /// Signalled when an event counter grows.
    pub cond: libc::pthread_cond_t,
    /// Completion events acknowledged.
    pub comp_events_completed: u32,
    /// Async events acknowledged.
    pub async_events_completed: u32,
    /// Must be 0.
    pub comp_mask: u32,
    /// Status of the current completion.
    pub status: ibv_wc_status,
    /// `wr_id` of the current completion.
    pub wr_id: u64,
    /// `ibv_start_poll`.
    pub start_poll:
        Option<unsafe extern "C" fn(current: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int>,
    /// `ibv_next_poll`.
    pub next_poll: Option<unsafe extern "C" fn(current: *mut ibv_cq_ex) -> c_int>,
    /// `ibv_end_poll`.
    pub end_poll: Option<unsafe extern "C" fn(current: *mut ibv_cq_ex)>,
    /// `ibv_wc_read_opcode`.
    pub read_opcode: Option<unsafe extern "C" fn(current: *mut ibv_cq_ex) -> ibv_wc_opcode>,
    /// `ibv_wc_read_vendor_err`.
    pub read_vendor_err: Option<unsafe extern "C" fn(current: *mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_byte_len`.
    pub read_byte_len: Option<unsafe extern "C" fn(current: *mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_imm_data` / `ibv_wc_read_invalidated_rkey`.
    pub read_imm_data: Option<unsafe extern "C" fn(current: *mut ibv_cq_ex) -> __be32>,
    /// `ibv_wc_read_qp_num`.
    pub read_qp_num: Option<unsafe extern "C" fn(current: *mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_src_qp`.
    pub read_src_qp: Option<unsafe extern "C" fn(current: *mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_wc_flags`.
    pub read_wc_flags: Option<unsafe extern "C" fn(current: *mut ibv_cq_ex) -> c_uint>,
    /// `ibv_wc_read_slid`.
    pub read_slid: Option<unsafe extern "C" fn(current: *mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_sl`.
    pub read_sl: Option<unsafe extern "C" fn(current: *mut ibv_cq_ex) -> u8>,
    /// `ibv_wc_read_dlid_path_bits`.
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(current: *mut ibv_cq_ex) -> u8>,
    /// `ibv_wc_read_completion_ts`.
    pub read_completion_ts: Option<unsafe extern "C" fn(current: *mut ibv_cq_ex) -> u64>,
    /// `ibv_wc_read_cvlan`.
    pub read_cvlan: Option<unsafe extern "C" fn(current: *mut ibv_cq_ex) -> u16>,
    /// `ibv_wc_read_flow_tag`.
    pub read_flow_tag: Option<unsafe extern "C" fn(current: *mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_tm_info`.
    pub read_tm_info:
        Option<unsafe extern "C" fn(current: *mut ibv_cq_ex, tm_info: *mut ibv_wc_tm_info)>,
    /// `ibv_wc_read_completion_wallclock_ns`.
    pub read_completion_wallclock_ns: Option<unsafe extern "C" fn(current: *mut ibv_cq_ex) -> u64>,
}

/// `struct ibv_moderate_cq`: CQ moderation parameters.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_moderate_cq {
    /// Completions per event.
    pub cq_count: u16,
    /// Period (microseconds).
    pub cq_period: u16,
}

/// `struct ibv_modify_cq_attr`: `ibv_modify_cq` input.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_modify_cq_attr {
    /// [`ibv_cq_attr_mask`] bits.
    pub attr_mask: u32,
    /// Moderation.
    pub moderate: ibv_moderate_cq,
}

/// `struct ibv_cq_init_attr_ex`: `ibv_create_cq_ex` input.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_cq_init_attr_ex {
    /// Minimum number of entries.
    pub cqe: u32,
    /// User context returned with completion events.
    pub cq_context: *mut c_void,
    /// Completion channel, or NULL.
    pub channel: *mut ibv_comp_channel,
    /// Completion vector (< `num_comp_vectors`).
    pub comp_vector: u32,
    /// [`ibv_create_cq_wc_flags`] bits.
    pub wc_flags: u64,
    /// [`ibv_cq_init_attr_mask`] bits.
    pub comp_mask: u32,
    /// [`ibv_create_cq_attr_flags`] bits.
    pub flags: u32,
    /// Parent domain (`IBV_CQ_INIT_ATTR_MASK_PD`).
    pub parent_domain: *mut ibv_pd,
}

/// `struct ibv_parent_domain_init_attr`: `ibv_alloc_parent_domain` input.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_parent_domain_init_attr {
    /// Protection domain (not NULL).
    pub pd: *mut ibv_pd,
    /// Thread domain, or NULL.
    pub td: *mut ibv_td,
    /// [`ibv_parent_domain_init_attr_mask`] bits.
    pub comp_mask: u32,
    /// Custom allocator.
    pub alloc: Option<
        unsafe extern "C" fn(
            pd: *mut ibv_pd,
            pd_context: *mut c_void,
            size: usize,
            alignment: usize,
            resource_type: u64,
        ) -> *mut c_void,
    >,
    /// Custom deallocator.
    pub free: Option<
        unsafe extern "C" fn(
            pd: *mut ibv_pd,
            pd_context: *mut c_void,
            ptr: *mut c_void,
            resource_type: u64,
        ),
    >,
    /// Passed to `alloc`/`free`.
    pub pd_context: *mut c_void,
}

/// `struct ibv_counters_init_attr`: `ibv_create_counters` input.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_counters_init_attr {
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_counters`: a counters object.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_counters {
    /// Owning context.
    pub context: *mut ibv_context,
}

/// `struct ibv_counter_attach_attr`: `ibv_attach_counters_point_flow` input.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_counter_attach_attr {
    /// What to count.
    pub counter_desc: ibv_counter_description,
    /// Index in the counters object.
    pub index: u32,
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_flow_attr`: flow steering rule header (the specs follow it in memory).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_flow_attr {
    /// Must be 0.
    pub comp_mask: u32,
    /// Rule type.
    pub r#type: ibv_flow_attr_type,
    /// Size of the header plus its specs.
    pub size: u16,
    /// Priority.
    pub priority: u16,
    /// Number of specs that follow.
    pub num_of_specs: u8,
    /// Port.
    pub port: u8,
    /// [`ibv_flow_flags`] bits.
    pub flags: u32,
}

/// `struct ibv_flow`: a flow steering rule.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_flow {
    /// Must be 0.
    pub comp_mask: u32,
    /// Owning context.
    pub context: *mut ibv_context,
    /// Kernel handle.
    pub handle: u32,
}

/// `struct ibv_flow_action`: a flow action.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_flow_action {
    /// Owning context.
    pub context: *mut ibv_context,
}

/// `struct ibv_flow_action_esp_attr`: `ibv_create_flow_action_esp` input.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_flow_action_esp_attr {
    /// ESP parameters.
    pub esp_attr: *mut ibv_flow_action_esp,
    /// Key material protocol.
    pub keymat_proto: ibv_flow_action_esp_keymat,
    /// Key material length.
    pub keymat_len: u16,
    /// Key material.
    pub keymat_ptr: *mut c_void,
    /// Replay protection protocol.
    pub replay_proto: ibv_flow_action_esp_replay,
    /// Replay data length.
    pub replay_len: u16,
    /// Replay data.
    pub replay_ptr: *mut c_void,
    /// Tunnel encapsulation.
    pub esp_encap: *mut ibv_flow_action_esp_encap,
    /// [`ibv_flow_action_esp_mask`] bits.
    pub comp_mask: u32,
    /// Extended sequence number.
    pub esn: u32,
}

zeroed_default!(
    ibv_dm,
    ibv_pd,
    ibv_td,
    ibv_xrcd,
    ibv_mr,
    ibv_mw,
    ibv_global_route,
    ibv_ah_attr,
    ibv_ah,
    ibv_srq_init_attr,
    ibv_srq_init_attr_ex,
    ibv_wq_init_attr,
    ibv_rwq_ind_table,
    ibv_rwq_ind_table_init_attr,
    ibv_qp_init_attr,
    ibv_rx_hash_conf,
    ibv_qp_init_attr_ex,
    ibv_qp_open_attr,
    ibv_qp_attr,
    ibv_srq,
    ibv_wq,
    ibv_qp,
    ibv_qp_ex,
    ibv_comp_channel,
    ibv_cq,
    ibv_cq_ex,
    ibv_cq_init_attr_ex,
    ibv_parent_domain_init_attr,
    ibv_counters,
    ibv_flow,
    ibv_flow_action,
    ibv_flow_action_esp_attr,
);
