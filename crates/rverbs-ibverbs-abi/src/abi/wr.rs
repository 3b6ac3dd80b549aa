//! Work requests, completions and async events: what crosses the data path.

use core::ffi::{c_int, c_uint, c_void};

use super::*;

/// `struct ibv_sge`: one scatter/gather element.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the MR holding the buffer.
    pub lkey: u32,
}

/// `struct ibv_data_buf`: one inline data buffer (`ibv_wr_set_inline_data_list`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_data_buf {
    /// Start address.
    pub addr: *mut c_void,
    /// Length in bytes.
    pub length: usize,
}

/// `struct ibv_mw_bind_info`: what a memory window bind covers.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    /// The MR the window lies in.
    pub mr: *mut ibv_mr,
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// [`ibv_access_flags`] of the window.
    pub mw_access_flags: c_uint,
}

/// `struct ibv_mw_bind`: `ibv_bind_mw` input (type 1 windows).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind {
    /// Completion id.
    pub wr_id: u64,
    /// [`ibv_send_flags`] bits.
    pub send_flags: c_uint,
    /// What to bind.
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_send_wr`: a send queue work request.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr {
    /// Completion id.
    pub wr_id: u64,
    /// Next WR in the list, or NULL.
    pub next: *mut ibv_send_wr,
    /// Scatter/gather list.
    pub sg_list: *mut ibv_sge,
    /// Entries in `sg_list`.
    pub num_sge: c_int,
    /// Operation.
    pub opcode: ibv_wr_opcode,
    /// [`ibv_send_flags`] bits.
    pub send_flags: c_uint,
    /// C: the anonymous union `{ imm_data; invalidate_rkey; }`.
    pub imm: ibv_send_wr_imm,
    /// Per-operation remote parameters.
    pub wr: ibv_send_wr_wr,
    /// Per-QP-type parameters.
    pub qp_type: ibv_send_wr_qp_type,
    /// C: the anonymous union `{ bind_mw; tso; }`.
    pub bind_mw_tso: ibv_send_wr_bind_mw_tso,
}

/// `ibv_send_wr`'s anonymous union of `imm_data` and `invalidate_rkey`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_imm {
    /// Immediate data (network byte order), for `*_WITH_IMM`.
    pub imm_data: __be32,
    /// Rkey to invalidate, for `*_WITH_INV`.
    pub invalidate_rkey: u32,
}

/// `ibv_send_wr.wr`: the remote side of RDMA, atomic or UD operations.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    /// RDMA read/write.
    pub rdma: ibv_send_wr_rdma,
    /// Atomics.
    pub atomic: ibv_send_wr_atomic,
    /// UD sends.
    pub ud: ibv_send_wr_ud,
}

/// `ibv_send_wr.wr.rdma`: remote buffer of an RDMA read/write.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_send_wr_rdma {
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `ibv_send_wr.wr.atomic`: operands of an atomic operation.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_send_wr_atomic {
    /// Remote address.
    pub remote_addr: u64,
    /// Compare value (CAS) or addend (FAA).
    pub compare_add: u64,
    /// Swap value (CAS).
    pub swap: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `ibv_send_wr.wr.ud`: destination of a UD send.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_ud {
    /// Address handle.
    pub ah: *mut ibv_ah,
    /// Remote QP number.
    pub remote_qpn: u32,
    /// Remote Q_Key.
    pub remote_qkey: u32,
}

/// `ibv_send_wr.qp_type`: per-QP-type parameters.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_qp_type {
    /// XRC.
    pub xrc: ibv_send_wr_xrc,
}

/// `ibv_send_wr.qp_type.xrc`: XRC target.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_send_wr_xrc {
    /// Remote SRQ number.
    pub remote_srqn: u32,
}

/// `ibv_send_wr`'s anonymous union of `bind_mw` and `tso`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_bind_mw_tso {
    /// `IBV_WR_BIND_MW`.
    pub bind_mw: ibv_send_wr_bind_mw,
    /// `IBV_WR_TSO`.
    pub tso: ibv_send_wr_tso,
}

/// `ibv_send_wr.bind_mw`: a type 2 memory window bind.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_bind_mw {
    /// The window.
    pub mw: *mut ibv_mw,
    /// New rkey.
    pub rkey: u32,
    /// What to bind.
    pub bind_info: ibv_mw_bind_info,
}

/// `ibv_send_wr.tso`: TSO header.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_tso {
    /// Header.
    pub hdr: *mut c_void,
    /// Header size.
    pub hdr_sz: u16,
    /// Maximum segment size.
    pub mss: u16,
}

/// `struct ibv_recv_wr`: a receive queue work request.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_recv_wr {
    /// Completion id.
    pub wr_id: u64,
    /// Next WR in the list, or NULL.
    pub next: *mut ibv_recv_wr,
    /// Scatter list.
    pub sg_list: *mut ibv_sge,
    /// Entries in `sg_list`.
    pub num_sge: c_int,
}

/// `struct ibv_ops_wr`: a tag matching list operation (`ibv_post_srq_ops`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ops_wr {
    /// Completion id.
    pub wr_id: u64,
    /// Next operation, or NULL.
    pub next: *mut ibv_ops_wr,
    /// Operation.
    pub opcode: ibv_ops_wr_opcode,
    /// [`ibv_ops_flags`] bits.
    pub flags: c_int,
    /// Tag matching parameters.
    pub tm: ibv_ops_wr_tm,
}

/// `ibv_ops_wr.tm`: tag matching parameters.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ops_wr_tm {
    /// Unexpected messages count.
    pub unexpected_cnt: u32,
    /// Tag handle.
    pub handle: u32,
    /// `IBV_WR_TAG_ADD` parameters.
    pub add: ibv_ops_wr_tm_add,
}

/// `ibv_ops_wr.tm.add`: a tagged buffer to add.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ops_wr_tm_add {
    /// Completion id of the receive.
    pub recv_wr_id: u64,
    /// Scatter list.
    pub sg_list: *mut ibv_sge,
    /// Entries in `sg_list`.
    pub num_sge: c_int,
    /// Tag.
    pub tag: u64,
    /// Tag mask.
    pub mask: u64,
}

/// `struct ibv_wc`: a work completion (`ibv_poll_cq`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_wc {
    /// Completion id of the WR.
    pub wr_id: u64,
    /// Status.
    pub status: ibv_wc_status,
    /// Operation.
    pub opcode: ibv_wc_opcode,
    /// Vendor error syndrome.
    pub vendor_err: u32,
    /// Bytes received.
    pub byte_len: u32,
    /// C: the anonymous union `{ imm_data; invalidated_rkey; }`.
    pub imm: ibv_wc_imm,
    /// Local QP number.
    pub qp_num: u32,
    /// Remote QP number (UD).
    pub src_qp: u32,
    /// [`ibv_wc_flags`] bits.
    pub wc_flags: c_uint,
    /// P_Key index (GSI).
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// DLID path bits.
    pub dlid_path_bits: u8,
}

/// `ibv_wc`'s anonymous union of `imm_data` and `invalidated_rkey`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_wc_imm {
    /// Immediate data (network byte order), with `IBV_WC_WITH_IMM`.
    pub imm_data: __be32,
    /// Invalidated rkey, with `IBV_WC_WITH_INV`.
    pub invalidated_rkey: u32,
}

/// `struct ibv_grh`: the 40-byte global route header in front of UD receives.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_grh {
    /// IP version, traffic class and flow label (big-endian).
    pub version_tclass_flow: __be32,
    /// Payload length (big-endian).
    pub paylen: __be16,
    /// Next header.
    pub next_hdr: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination GID.
    pub dgid: ibv_gid,
}

/// `struct ibv_async_event`: what `ibv_get_async_event` returns.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_async_event {
    /// The object the event concerns (by `event_type`).
    pub element: ibv_async_event_element,
    /// Event type.
    pub event_type: ibv_event_type,
}

/// `ibv_async_event.element`: the affected CQ, QP, SRQ, WQ or port.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_async_event_element {
    /// CQ events.
    pub cq: *mut ibv_cq,
    /// QP events.
    pub qp: *mut ibv_qp,
    /// SRQ events.
    pub srq: *mut ibv_srq,
    /// WQ events.
    pub wq: *mut ibv_wq,
    /// Port events.
    pub port_num: c_int,
}

zeroed_default!(
    ibv_data_buf,
    ibv_mw_bind_info,
    ibv_mw_bind,
    ibv_send_wr,
    ibv_send_wr_imm,
    ibv_send_wr_wr,
    ibv_send_wr_ud,
    ibv_send_wr_qp_type,
    ibv_send_wr_bind_mw_tso,
    ibv_send_wr_bind_mw,
    ibv_send_wr_tso,
    ibv_recv_wr,
    ibv_ops_wr,
    ibv_ops_wr_tm,
    ibv_ops_wr_tm_add,
    ibv_wc,
    ibv_wc_imm,
    ibv_grh,
    ibv_async_event,
    ibv_async_event_element,
);
