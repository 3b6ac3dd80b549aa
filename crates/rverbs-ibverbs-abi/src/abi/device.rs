//! Devices, ports and GIDs: `ibv_device`, the device and port attributes and
//! the GID types.

use core::ffi::{c_char, c_int, c_uint};

use super::*;

/// `union ibv_gid`: a 128-bit GID, as bytes or as prefix + interface id.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_gid {
    /// The GID in wire order.
    pub raw: [u8; 16],
    /// The GID as subnet prefix and interface id (both big-endian).
    pub global: ibv_gid_global,
}

/// `ibv_gid.global`: the two big-endian halves of a GID.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid_global {
    /// Upper 64 bits.
    pub subnet_prefix: __be64,
    /// Lower 64 bits.
    pub interface_id: __be64,
}

/// `struct ibv_gid_entry`: one GID table entry (`ibv_query_gid_ex`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_gid_entry {
    /// The GID.
    pub gid: ibv_gid,
    /// Its index in the port's GID table.
    pub gid_index: u32,
    /// The port number.
    pub port_num: u32,
    /// An [`ibv_gid_type`] value.
    pub gid_type: u32,
    /// ifindex of the net device the GID belongs to.
    pub ndev_ifindex: u32,
}

/// `struct ibv_device_attr`: what `ibv_query_device` reports.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    /// Firmware version string.
    pub fw_ver: [c_char; 64],
    /// Node GUID (big-endian).
    pub node_guid: __be64,
    /// System image GUID (big-endian).
    pub sys_image_guid: __be64,
    /// Largest registrable region.
    pub max_mr_size: u64,
    /// Supported page sizes (bit mask).
    pub page_size_cap: u64,
    /// IEEE vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Maximum number of QPs.
    pub max_qp: c_int,
    /// Maximum outstanding WRs per queue.
    pub max_qp_wr: c_int,
    /// [`ibv_device_cap_flags`] bits.
    pub device_cap_flags: c_uint,
    /// Maximum SGEs per WR.
    pub max_sge: c_int,
    /// Maximum SGEs per RDMA read WR.
    pub max_sge_rd: c_int,
    /// Maximum number of CQs.
    pub max_cq: c_int,
    /// Maximum CQ entries.
    pub max_cqe: c_int,
    /// Maximum number of MRs.
    pub max_mr: c_int,
    /// Maximum number of PDs.
    pub max_pd: c_int,
    /// Maximum outstanding RDMA reads/atomics as target, per QP.
    pub max_qp_rd_atom: c_int,
    /// Maximum outstanding RDMA reads/atomics per EE context.
    pub max_ee_rd_atom: c_int,
    /// Maximum outstanding RDMA reads/atomics as target, per device.
    pub max_res_rd_atom: c_int,
    /// Maximum outstanding RDMA reads/atomics as initiator, per QP.
    pub max_qp_init_rd_atom: c_int,
    /// Maximum outstanding RDMA reads/atomics as initiator, per EE context.
    pub max_ee_init_rd_atom: c_int,
    /// Atomic support level.
    pub atomic_cap: ibv_atomic_cap,
    /// Maximum EE contexts.
    pub max_ee: c_int,
    /// Maximum RDDs.
    pub max_rdd: c_int,
    /// Maximum memory windows.
    pub max_mw: c_int,
    /// Maximum raw IPv6 QPs.
    pub max_raw_ipv6_qp: c_int,
    /// Maximum raw Ethertype QPs.
    pub max_raw_ethy_qp: c_int,
    /// Maximum multicast groups.
    pub max_mcast_grp: c_int,
    /// Maximum QPs per multicast group.
    pub max_mcast_qp_attach: c_int,
    /// Maximum QP attachments over all multicast groups.
    pub max_total_mcast_qp_attach: c_int,
    /// Maximum address handles.
    pub max_ah: c_int,
    /// Maximum FMRs.
    pub max_fmr: c_int,
    /// Maximum remaps per FMR.
    pub max_map_per_fmr: c_int,
    /// Maximum SRQs.
    pub max_srq: c_int,
    /// Maximum WRs per SRQ.
    pub max_srq_wr: c_int,
    /// Maximum SGEs per SRQ WR.
    pub max_srq_sge: c_int,
    /// P_Key table size.
    pub max_pkeys: u16,
    /// Local CA ack delay.
    pub local_ca_ack_delay: u8,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
}

/// `struct ibv_query_device_ex_input`: extensible input of `ibv_query_device_ex`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_query_device_ex_input {
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_odp_caps`: on-demand paging capabilities.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_odp_caps {
    /// [`ibv_odp_general_caps`] bits.
    pub general_caps: u64,
    /// Per-transport [`ibv_odp_transport_cap_bits`].
    pub per_transport_caps: ibv_odp_caps_per_transport_caps,
}

/// `ibv_odp_caps.per_transport_caps`: ODP capability bits per transport.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_odp_caps_per_transport_caps {
    /// RC.
    pub rc_odp_caps: u32,
    /// UC.
    pub uc_odp_caps: u32,
    /// UD.
    pub ud_odp_caps: u32,
}

/// `struct ibv_tso_caps`: TCP segmentation offload capabilities.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_tso_caps {
    /// Maximum TSO payload.
    pub max_tso: u32,
    /// QP types supporting TSO (bit per [`ibv_qp_type`]).
    pub supported_qpts: u32,
}

/// `struct ibv_rss_caps`: receive-side scaling capabilities.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_rss_caps {
    /// QP types supporting RSS (bit per [`ibv_qp_type`]).
    pub supported_qpts: u32,
    /// Maximum indirection tables.
    pub max_rwq_indirection_tables: u32,
    /// Maximum indirection table size.
    pub max_rwq_indirection_table_size: u32,
    /// [`ibv_rx_hash_fields`] bits.
    pub rx_hash_fields_mask: u64,
    /// [`ibv_rx_hash_function_flags`] bits.
    pub rx_hash_function: u8,
}

/// `struct ibv_packet_pacing_caps`: rate limiting capabilities.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_packet_pacing_caps {
    /// Minimum rate (kbps).
    pub qp_rate_limit_min: u32,
    /// Maximum rate (kbps).
    pub qp_rate_limit_max: u32,
    /// QP types supporting pacing (bit per [`ibv_qp_type`]).
    pub supported_qpts: u32,
}

/// `struct ibv_tm_caps`: tag matching capabilities.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_tm_caps {
    /// Maximum rendezvous header size.
    pub max_rndv_hdr_size: u32,
    /// Maximum tagged buffers in a TM-SRQ matching list.
    pub max_num_tags: u32,
    /// [`ibv_tm_cap_flags`] bits.
    pub flags: u32,
    /// Maximum outstanding list operations.
    pub max_ops: u32,
    /// Maximum SGEs in a tagged buffer.
    pub max_sge: u32,
}

/// `struct ibv_cq_moderation_caps`: CQ moderation limits.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_cq_moderation_caps {
    /// Maximum completion count.
    pub max_cq_count: u16,
    /// Maximum period (microseconds).
    pub max_cq_period: u16,
}

/// `struct ibv_pci_atomic_caps`: PCI atomic operation sizes ([`ibv_pci_atomic_op_size`]).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_pci_atomic_caps {
    /// Fetch-and-add sizes.
    pub fetch_add: u16,
    /// Swap sizes.
    pub swap: u16,
    /// Compare-and-swap sizes.
    pub compare_swap: u16,
}

/// `struct ibv_device_attr_ex`: what `ibv_query_device_ex` reports.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr_ex {
    /// The classic attributes.
    pub orig_attr: ibv_device_attr,
    /// Valid extended fields.
    pub comp_mask: u32,
    /// On-demand paging.
    pub odp_caps: ibv_odp_caps,
    /// Valid bits of completion timestamps.
    pub completion_timestamp_mask: u64,
    /// HCA core clock (kHz).
    pub hca_core_clock: u64,
    /// Extended capability flags (`device_cap_flags` plus 64-bit ones).
    pub device_cap_flags_ex: u64,
    /// TSO.
    pub tso_caps: ibv_tso_caps,
    /// RSS.
    pub rss_caps: ibv_rss_caps,
    /// Maximum receive work queues.
    pub max_wq_type_rq: u32,
    /// Packet pacing.
    pub packet_pacing_caps: ibv_packet_pacing_caps,
    /// [`ibv_raw_packet_caps`] bits.
    pub raw_packet_caps: u32,
    /// Tag matching.
    pub tm_caps: ibv_tm_caps,
    /// CQ moderation.
    pub cq_mod_caps: ibv_cq_moderation_caps,
    /// Maximum device memory size.
    pub max_dm_size: u64,
    /// PCI atomics.
    pub pci_atomic_caps: ibv_pci_atomic_caps,
    /// XRC ODP capability bits.
    pub xrc_odp_caps: u32,
    /// Number of physical ports (beyond `u8`).
    pub phys_port_cnt_ex: u32,
}

/// `struct ibv_port_attr`: what `ibv_query_port` reports.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    /// Logical port state.
    pub state: ibv_port_state,
    /// Largest supported MTU.
    pub max_mtu: ibv_mtu,
    /// Active MTU.
    pub active_mtu: ibv_mtu,
    /// GID table length.
    pub gid_tbl_len: c_int,
    /// [`ibv_port_cap_flags`] bits.
    pub port_cap_flags: u32,
    /// Largest message size.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// Base LID.
    pub lid: u16,
    /// Subnet manager LID.
    pub sm_lid: u16,
    /// LID mask control.
    pub lmc: u8,
    /// Maximum virtual lanes.
    pub max_vl_num: u8,
    /// Subnet manager service level.
    pub sm_sl: u8,
    /// Subnet propagation delay.
    pub subnet_timeout: u8,
    /// InitTypeReply.
    pub init_type_reply: u8,
    /// Active link width.
    pub active_width: u8,
    /// Active link speed.
    pub active_speed: u8,
    /// Physical port state (5 = LinkUp).
    pub phys_state: u8,
    /// `IBV_LINK_LAYER_*`.
    pub link_layer: u8,
    /// `IBV_QPF_*` bits.
    pub flags: u8,
    /// [`ibv_port_cap_flags2`] bits.
    pub port_cap_flags2: u16,
}

/// `struct _ibv_device_ops`: the two obsolete, never used slots at the start of `ibv_device`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct _ibv_device_ops {
    /// Obsolete.
    pub _dummy1:
        Option<unsafe extern "C" fn(device: *mut ibv_device, cmd_fd: c_int) -> *mut ibv_context>,
    /// Obsolete.
    pub _dummy2: Option<unsafe extern "C" fn(context: *mut ibv_context)>,
}

/// `struct ibv_device`: one entry of `ibv_get_device_list`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device {
    /// Obsolete slots, left NULL.
    pub _ops: _ibv_device_ops,
    /// Node type.
    pub node_type: ibv_node_type,
    /// Transport type.
    pub transport_type: ibv_transport_type,
    /// Kernel IB device name, e.g. "mthca0" (NUL-terminated).
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    /// uverbs device name, e.g. "uverbs0".
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    /// sysfs path of the infiniband_verbs class device.
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    /// sysfs path of the infiniband class device.
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

zeroed_default!(
    ibv_gid,
    ibv_gid_entry,
    ibv_device_attr,
    ibv_device_attr_ex,
    ibv_device,
);
