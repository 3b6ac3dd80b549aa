//! The enums and `#define`s of `verbs.h` (and the `ib_uverbs_*` values it
//! re-exports from `<infiniband/verbs_api.h>`) as constants.
//!
//! Each named C enum becomes a type alias of the integer type gcc gives it on
//! x86_64 (`u32`, or `i32` when the enum has a negative value) and its
//! values become constants of that alias, so `ibv_qp_state` in a struct
//! field and `IBV_QPS_RTS` have the same type. Anonymous enums get the type
//! of the struct field they are stored in (`u8` for the link layers, `usize`
//! for array lengths).

use core::ffi::c_void;

/// `enum ibv_gid_type` (stored as `uint32_t` in `ibv_gid_entry`).
pub type ibv_gid_type = u32;
/// InfiniBand GID.
pub const IBV_GID_TYPE_IB: ibv_gid_type = 0;
/// RoCE v1 GID.
pub const IBV_GID_TYPE_ROCE_V1: ibv_gid_type = 1;
/// RoCE v2 GID.
pub const IBV_GID_TYPE_ROCE_V2: ibv_gid_type = 2;

/// `__VERBS_ABI_IS_EXTENDED`: the `ibv_context::abi_compat` value that tells
/// the inline wrappers a `verbs_context` surrounds the context.
pub const __VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// `enum ibv_node_type`.
pub type ibv_node_type = i32;
/// Unknown node type.
pub const IBV_NODE_UNKNOWN: ibv_node_type = -1;
/// Channel adapter.
pub const IBV_NODE_CA: ibv_node_type = 1;
/// Switch.
pub const IBV_NODE_SWITCH: ibv_node_type = 2;
/// Router.
pub const IBV_NODE_ROUTER: ibv_node_type = 3;
/// iWARP RNIC.
pub const IBV_NODE_RNIC: ibv_node_type = 4;
/// usNIC.
pub const IBV_NODE_USNIC: ibv_node_type = 5;
/// usNIC over UDP.
pub const IBV_NODE_USNIC_UDP: ibv_node_type = 6;
/// Unspecified node type.
pub const IBV_NODE_UNSPECIFIED: ibv_node_type = 7;

/// `enum ibv_transport_type`.
pub type ibv_transport_type = i32;
/// Unknown transport.
pub const IBV_TRANSPORT_UNKNOWN: ibv_transport_type = -1;
/// InfiniBand transport (also RoCE).
pub const IBV_TRANSPORT_IB: ibv_transport_type = 0;
/// iWARP transport.
pub const IBV_TRANSPORT_IWARP: ibv_transport_type = 1;
/// usNIC transport.
pub const IBV_TRANSPORT_USNIC: ibv_transport_type = 2;
/// usNIC over UDP transport.
pub const IBV_TRANSPORT_USNIC_UDP: ibv_transport_type = 3;
/// Unspecified transport.
pub const IBV_TRANSPORT_UNSPECIFIED: ibv_transport_type = 4;

/// `enum ibv_device_cap_flags` (bits of `ibv_device_attr::device_cap_flags`).
pub type ibv_device_cap_flags = u32;
/// Device supports resizing the maximum number of WRs.
pub const IBV_DEVICE_RESIZE_MAX_WR: ibv_device_cap_flags = 1;
/// Bad P_Key counter supported.
pub const IBV_DEVICE_BAD_PKEY_CNTR: ibv_device_cap_flags = 1 << 1;
/// Bad Q_Key counter supported.
pub const IBV_DEVICE_BAD_QKEY_CNTR: ibv_device_cap_flags = 1 << 2;
/// Raw multicast supported.
pub const IBV_DEVICE_RAW_MULTI: ibv_device_cap_flags = 1 << 3;
/// Automatic path migration supported.
pub const IBV_DEVICE_AUTO_PATH_MIG: ibv_device_cap_flags = 1 << 4;
/// Changing the primary port of a QP supported.
pub const IBV_DEVICE_CHANGE_PHY_PORT: ibv_device_cap_flags = 1 << 5;
/// UD address vector port enforcement.
pub const IBV_DEVICE_UD_AV_PORT_ENFORCE: ibv_device_cap_flags = 1 << 6;
/// Current-QP-state modifier supported.
pub const IBV_DEVICE_CURR_QP_STATE_MOD: ibv_device_cap_flags = 1 << 7;
/// Port shutdown supported.
pub const IBV_DEVICE_SHUTDOWN_PORT: ibv_device_cap_flags = 1 << 8;
/// InitType supported.
pub const IBV_DEVICE_INIT_TYPE: ibv_device_cap_flags = 1 << 9;
/// Port active event supported.
pub const IBV_DEVICE_PORT_ACTIVE_EVENT: ibv_device_cap_flags = 1 << 10;
/// System image GUID supported.
pub const IBV_DEVICE_SYS_IMAGE_GUID: ibv_device_cap_flags = 1 << 11;
/// RC RNR NAK generation supported.
pub const IBV_DEVICE_RC_RNR_NAK_GEN: ibv_device_cap_flags = 1 << 12;
/// SRQ resize supported.
pub const IBV_DEVICE_SRQ_RESIZE: ibv_device_cap_flags = 1 << 13;
/// `IBV_CQ_NEXT_COMP` style notification supported.
pub const IBV_DEVICE_N_NOTIFY_CQ: ibv_device_cap_flags = 1 << 14;
/// Memory windows supported.
pub const IBV_DEVICE_MEM_WINDOW: ibv_device_cap_flags = 1 << 17;
/// UD IP checksum offload.
pub const IBV_DEVICE_UD_IP_CSUM: ibv_device_cap_flags = 1 << 18;
/// XRC supported.
pub const IBV_DEVICE_XRC: ibv_device_cap_flags = 1 << 20;
/// Memory management extensions.
pub const IBV_DEVICE_MEM_MGT_EXTENSIONS: ibv_device_cap_flags = 1 << 21;
/// Type 2A memory windows.
pub const IBV_DEVICE_MEM_WINDOW_TYPE_2A: ibv_device_cap_flags = 1 << 23;
/// Type 2B memory windows.
pub const IBV_DEVICE_MEM_WINDOW_TYPE_2B: ibv_device_cap_flags = 1 << 24;
/// RC IP checksum offload.
pub const IBV_DEVICE_RC_IP_CSUM: ibv_device_cap_flags = 1 << 25;
/// Raw IP checksum offload.
pub const IBV_DEVICE_RAW_IP_CSUM: ibv_device_cap_flags = 1 << 26;
/// Managed flow steering.
pub const IBV_DEVICE_MANAGED_FLOW_STEERING: ibv_device_cap_flags = 1 << 29;
/// `#define IBV_DEVICE_RAW_SCATTER_FCS` (bit of `device_cap_flags_ex`).
pub const IBV_DEVICE_RAW_SCATTER_FCS: u64 = 1 << 34;
/// The kernel's `IB_UVERBS_DEVICE_ATOMIC_WRITE` (bit of
/// `device_cap_flags_ex`, which the kernel passes through; libibverbs has
/// no name for it): the device executes ATOMIC WRITE (Linux rxe sets it).
pub const IB_UVERBS_DEVICE_ATOMIC_WRITE: u64 = 1 << 40;
/// `#define IBV_DEVICE_PCI_WRITE_END_PADDING` (bit of `device_cap_flags_ex`).
pub const IBV_DEVICE_PCI_WRITE_END_PADDING: u64 = 1 << 36;

/// `enum ibv_fork_status` (return of `ibv_is_fork_initialized`).
pub type ibv_fork_status = u32;
/// Fork protection not enabled.
pub const IBV_FORK_DISABLED: ibv_fork_status = 0;
/// Fork protection enabled.
pub const IBV_FORK_ENABLED: ibv_fork_status = 1;
/// The kernel makes fork protection unnecessary.
pub const IBV_FORK_UNNEEDED: ibv_fork_status = 2;

/// `enum ibv_atomic_cap`.
pub type ibv_atomic_cap = u32;
/// No atomics.
pub const IBV_ATOMIC_NONE: ibv_atomic_cap = 0;
/// Atomic within this HCA.
pub const IBV_ATOMIC_HCA: ibv_atomic_cap = 1;
/// Atomic between HCAs and CPU.
pub const IBV_ATOMIC_GLOB: ibv_atomic_cap = 2;

/// `enum ibv_dm_mask` (bits of `ibv_dm::comp_mask`).
pub type ibv_dm_mask = u32;
/// `ibv_dm::handle` is valid.
pub const IBV_DM_MASK_HANDLE: ibv_dm_mask = 1;

/// `enum ibv_odp_transport_cap_bits`.
pub type ibv_odp_transport_cap_bits = u32;
/// ODP for send.
pub const IBV_ODP_SUPPORT_SEND: ibv_odp_transport_cap_bits = 1;
/// ODP for receive.
pub const IBV_ODP_SUPPORT_RECV: ibv_odp_transport_cap_bits = 1 << 1;
/// ODP for RDMA write.
pub const IBV_ODP_SUPPORT_WRITE: ibv_odp_transport_cap_bits = 1 << 2;
/// ODP for RDMA read.
pub const IBV_ODP_SUPPORT_READ: ibv_odp_transport_cap_bits = 1 << 3;
/// ODP for atomics.
pub const IBV_ODP_SUPPORT_ATOMIC: ibv_odp_transport_cap_bits = 1 << 4;
/// ODP for SRQ receive.
pub const IBV_ODP_SUPPORT_SRQ_RECV: ibv_odp_transport_cap_bits = 1 << 5;

/// `enum ibv_odp_general_caps`.
pub type ibv_odp_general_caps = u32;
/// On-demand paging supported.
pub const IBV_ODP_SUPPORT: ibv_odp_general_caps = 1;
/// Implicit ODP supported.
pub const IBV_ODP_SUPPORT_IMPLICIT: ibv_odp_general_caps = 1 << 1;

/// `enum ibv_rx_hash_function_flags`.
pub type ibv_rx_hash_function_flags = u32;
/// Toeplitz hash.
pub const IBV_RX_HASH_FUNC_TOEPLITZ: ibv_rx_hash_function_flags = 1;

/// `enum ibv_rx_hash_fields` (bits of the 64-bit `rx_hash_fields_mask`).
pub type ibv_rx_hash_fields = u32;
/// Hash on source IPv4.
pub const IBV_RX_HASH_SRC_IPV4: ibv_rx_hash_fields = 1;
/// Hash on destination IPv4.
pub const IBV_RX_HASH_DST_IPV4: ibv_rx_hash_fields = 1 << 1;
/// Hash on source IPv6.
pub const IBV_RX_HASH_SRC_IPV6: ibv_rx_hash_fields = 1 << 2;
/// Hash on destination IPv6.
pub const IBV_RX_HASH_DST_IPV6: ibv_rx_hash_fields = 1 << 3;
/// Hash on TCP source port.
pub const IBV_RX_HASH_SRC_PORT_TCP: ibv_rx_hash_fields = 1 << 4;
/// Hash on TCP destination port.
pub const IBV_RX_HASH_DST_PORT_TCP: ibv_rx_hash_fields = 1 << 5;
/// Hash on UDP source port.
pub const IBV_RX_HASH_SRC_PORT_UDP: ibv_rx_hash_fields = 1 << 6;
/// Hash on UDP destination port.
pub const IBV_RX_HASH_DST_PORT_UDP: ibv_rx_hash_fields = 1 << 7;
/// Hash on IPsec SPI.
pub const IBV_RX_HASH_IPSEC_SPI: ibv_rx_hash_fields = 1 << 8;
/// Hash on the inner headers.
pub const IBV_RX_HASH_INNER: ibv_rx_hash_fields = 1 << 31;

/// `enum ibv_raw_packet_caps`.
pub type ibv_raw_packet_caps = u32;
/// C-VLAN stripping.
pub const IBV_RAW_PACKET_CAP_CVLAN_STRIPPING: ibv_raw_packet_caps = 1;
/// Scatter FCS.
pub const IBV_RAW_PACKET_CAP_SCATTER_FCS: ibv_raw_packet_caps = 1 << 1;
/// IP checksum offload.
pub const IBV_RAW_PACKET_CAP_IP_CSUM: ibv_raw_packet_caps = 1 << 2;
/// Delay drop.
pub const IBV_RAW_PACKET_CAP_DELAY_DROP: ibv_raw_packet_caps = 1 << 3;

/// `enum ibv_tm_cap_flags`.
pub type ibv_tm_cap_flags = u32;
/// Tag matching on RC.
pub const IBV_TM_CAP_RC: ibv_tm_cap_flags = 1;

/// `enum ibv_pci_atomic_op_size`.
pub type ibv_pci_atomic_op_size = u32;
/// 4-byte PCI atomics.
pub const IBV_PCI_ATOMIC_OPERATION_4_BYTE_SIZE_SUP: ibv_pci_atomic_op_size = 1;
/// 8-byte PCI atomics.
pub const IBV_PCI_ATOMIC_OPERATION_8_BYTE_SIZE_SUP: ibv_pci_atomic_op_size = 1 << 1;
/// 16-byte PCI atomics.
pub const IBV_PCI_ATOMIC_OPERATION_16_BYTE_SIZE_SUP: ibv_pci_atomic_op_size = 1 << 2;

/// `enum ibv_mtu`.
pub type ibv_mtu = u32;
/// 256-byte MTU.
pub const IBV_MTU_256: ibv_mtu = 1;
/// 512-byte MTU.
pub const IBV_MTU_512: ibv_mtu = 2;
/// 1024-byte MTU.
pub const IBV_MTU_1024: ibv_mtu = 3;
/// 2048-byte MTU.
pub const IBV_MTU_2048: ibv_mtu = 4;
/// 4096-byte MTU.
pub const IBV_MTU_4096: ibv_mtu = 5;

/// `enum ibv_port_state`.
pub type ibv_port_state = u32;
/// No state change.
pub const IBV_PORT_NOP: ibv_port_state = 0;
/// Port down.
pub const IBV_PORT_DOWN: ibv_port_state = 1;
/// Port initializing.
pub const IBV_PORT_INIT: ibv_port_state = 2;
/// Port armed.
pub const IBV_PORT_ARMED: ibv_port_state = 3;
/// Port active.
pub const IBV_PORT_ACTIVE: ibv_port_state = 4;
/// Port active, deferred.
pub const IBV_PORT_ACTIVE_DEFER: ibv_port_state = 5;

/// Anonymous enum: unspecified link layer (`ibv_port_attr::link_layer`, a `uint8_t`).
pub const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
/// Anonymous enum: InfiniBand link layer.
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
/// Anonymous enum: Ethernet link layer (RoCE).
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// `enum ibv_port_cap_flags` (bits of `ibv_port_attr::port_cap_flags`).
pub type ibv_port_cap_flags = u32;
/// Subnet manager.
pub const IBV_PORT_SM: ibv_port_cap_flags = 1 << 1;
/// Notices supported.
pub const IBV_PORT_NOTICE_SUP: ibv_port_cap_flags = 1 << 2;
/// Traps supported.
pub const IBV_PORT_TRAP_SUP: ibv_port_cap_flags = 1 << 3;
/// Optional IPD supported.
pub const IBV_PORT_OPT_IPD_SUP: ibv_port_cap_flags = 1 << 4;
/// Automatic migration supported.
pub const IBV_PORT_AUTO_MIGR_SUP: ibv_port_cap_flags = 1 << 5;
/// SL-to-VL mapping supported.
pub const IBV_PORT_SL_MAP_SUP: ibv_port_cap_flags = 1 << 6;
/// M_Key in NVRAM.
pub const IBV_PORT_MKEY_NVRAM: ibv_port_cap_flags = 1 << 7;
/// P_Key in NVRAM.
pub const IBV_PORT_PKEY_NVRAM: ibv_port_cap_flags = 1 << 8;
/// LED info supported.
pub const IBV_PORT_LED_INFO_SUP: ibv_port_cap_flags = 1 << 9;
/// System image GUID supported.
pub const IBV_PORT_SYS_IMAGE_GUID_SUP: ibv_port_cap_flags = 1 << 11;
/// P_Key switch external port trap supported.
pub const IBV_PORT_PKEY_SW_EXT_PORT_TRAP_SUP: ibv_port_cap_flags = 1 << 12;
/// Extended speeds supported.
pub const IBV_PORT_EXTENDED_SPEEDS_SUP: ibv_port_cap_flags = 1 << 14;
/// `port_cap_flags2` valid.
pub const IBV_PORT_CAP_MASK2_SUP: ibv_port_cap_flags = 1 << 15;
/// Communication manager supported.
pub const IBV_PORT_CM_SUP: ibv_port_cap_flags = 1 << 16;
/// SNMP tunnel supported.
pub const IBV_PORT_SNMP_TUNNEL_SUP: ibv_port_cap_flags = 1 << 17;
/// Reinit supported.
pub const IBV_PORT_REINIT_SUP: ibv_port_cap_flags = 1 << 18;
/// Device management supported.
pub const IBV_PORT_DEVICE_MGMT_SUP: ibv_port_cap_flags = 1 << 19;
/// Vendor class supported.
pub const IBV_PORT_VENDOR_CLASS_SUP: ibv_port_cap_flags = 1 << 20;
/// DR notice supported.
pub const IBV_PORT_DR_NOTICE_SUP: ibv_port_cap_flags = 1 << 21;
/// Capability mask notice supported.
pub const IBV_PORT_CAP_MASK_NOTICE_SUP: ibv_port_cap_flags = 1 << 22;
/// Boot management supported.
pub const IBV_PORT_BOOT_MGMT_SUP: ibv_port_cap_flags = 1 << 23;
/// Link latency supported.
pub const IBV_PORT_LINK_LATENCY_SUP: ibv_port_cap_flags = 1 << 24;
/// Client reregistration supported.
pub const IBV_PORT_CLIENT_REG_SUP: ibv_port_cap_flags = 1 << 25;
/// GIDs are IP based (RoCE).
pub const IBV_PORT_IP_BASED_GIDS: ibv_port_cap_flags = 1 << 26;

/// `enum ibv_port_cap_flags2` (bits of `ibv_port_attr::port_cap_flags2`).
pub type ibv_port_cap_flags2 = u32;
/// Set node description supported.
pub const IBV_PORT_SET_NODE_DESC_SUP: ibv_port_cap_flags2 = 1;
/// Port info extended supported.
pub const IBV_PORT_INFO_EXT_SUP: ibv_port_cap_flags2 = 1 << 1;
/// Virtualization supported.
pub const IBV_PORT_VIRT_SUP: ibv_port_cap_flags2 = 1 << 2;
/// Switch port state table supported.
pub const IBV_PORT_SWITCH_PORT_STATE_TABLE_SUP: ibv_port_cap_flags2 = 1 << 3;
/// 2x link width supported.
pub const IBV_PORT_LINK_WIDTH_2X_SUP: ibv_port_cap_flags2 = 1 << 4;
/// HDR link speed supported.
pub const IBV_PORT_LINK_SPEED_HDR_SUP: ibv_port_cap_flags2 = 1 << 5;
/// NDR link speed supported.
pub const IBV_PORT_LINK_SPEED_NDR_SUP: ibv_port_cap_flags2 = 1 << 10;

/// `enum ibv_event_type`.
pub type ibv_event_type = u32;
/// CQ error (overrun).
pub const IBV_EVENT_CQ_ERR: ibv_event_type = 0;
/// QP fatal error.
pub const IBV_EVENT_QP_FATAL: ibv_event_type = 1;
/// Invalid request on a QP.
pub const IBV_EVENT_QP_REQ_ERR: ibv_event_type = 2;
/// QP access violation.
pub const IBV_EVENT_QP_ACCESS_ERR: ibv_event_type = 3;
/// Communication established.
pub const IBV_EVENT_COMM_EST: ibv_event_type = 4;
/// Send queue drained.
pub const IBV_EVENT_SQ_DRAINED: ibv_event_type = 5;
/// Path migrated.
pub const IBV_EVENT_PATH_MIG: ibv_event_type = 6;
/// Path migration failed.
pub const IBV_EVENT_PATH_MIG_ERR: ibv_event_type = 7;
/// Device fatal error (unaffiliated).
pub const IBV_EVENT_DEVICE_FATAL: ibv_event_type = 8;
/// Port became active.
pub const IBV_EVENT_PORT_ACTIVE: ibv_event_type = 9;
/// Port error.
pub const IBV_EVENT_PORT_ERR: ibv_event_type = 10;
/// LID changed.
pub const IBV_EVENT_LID_CHANGE: ibv_event_type = 11;
/// P_Key table changed.
pub const IBV_EVENT_PKEY_CHANGE: ibv_event_type = 12;
/// SM changed.
pub const IBV_EVENT_SM_CHANGE: ibv_event_type = 13;
/// SRQ error.
pub const IBV_EVENT_SRQ_ERR: ibv_event_type = 14;
/// SRQ limit reached.
pub const IBV_EVENT_SRQ_LIMIT_REACHED: ibv_event_type = 15;
/// Last WQE reached on a QP attached to an SRQ.
pub const IBV_EVENT_QP_LAST_WQE_REACHED: ibv_event_type = 16;
/// Client reregistration requested.
pub const IBV_EVENT_CLIENT_REREGISTER: ibv_event_type = 17;
/// GID table changed.
pub const IBV_EVENT_GID_CHANGE: ibv_event_type = 18;
/// WQ fatal error.
pub const IBV_EVENT_WQ_FATAL: ibv_event_type = 19;

/// `enum ibv_wc_status`.
pub type ibv_wc_status = u32;
/// Success.
pub const IBV_WC_SUCCESS: ibv_wc_status = 0;
/// Local length error.
pub const IBV_WC_LOC_LEN_ERR: ibv_wc_status = 1;
/// Local QP operation error.
pub const IBV_WC_LOC_QP_OP_ERR: ibv_wc_status = 2;
/// Local EE context operation error.
pub const IBV_WC_LOC_EEC_OP_ERR: ibv_wc_status = 3;
/// Local protection error.
pub const IBV_WC_LOC_PROT_ERR: ibv_wc_status = 4;
/// WR flushed.
pub const IBV_WC_WR_FLUSH_ERR: ibv_wc_status = 5;
/// Memory window bind error.
pub const IBV_WC_MW_BIND_ERR: ibv_wc_status = 6;
/// Bad response.
pub const IBV_WC_BAD_RESP_ERR: ibv_wc_status = 7;
/// Local access error.
pub const IBV_WC_LOC_ACCESS_ERR: ibv_wc_status = 8;
/// Remote invalid request.
pub const IBV_WC_REM_INV_REQ_ERR: ibv_wc_status = 9;
/// Remote access error.
pub const IBV_WC_REM_ACCESS_ERR: ibv_wc_status = 10;
/// Remote operation error.
pub const IBV_WC_REM_OP_ERR: ibv_wc_status = 11;
/// Transport retry counter exceeded.
pub const IBV_WC_RETRY_EXC_ERR: ibv_wc_status = 12;
/// RNR retry counter exceeded.
pub const IBV_WC_RNR_RETRY_EXC_ERR: ibv_wc_status = 13;
/// Local RDD violation.
pub const IBV_WC_LOC_RDD_VIOL_ERR: ibv_wc_status = 14;
/// Remote invalid RD request.
pub const IBV_WC_REM_INV_RD_REQ_ERR: ibv_wc_status = 15;
/// Remote abort.
pub const IBV_WC_REM_ABORT_ERR: ibv_wc_status = 16;
/// Invalid EE context number.
pub const IBV_WC_INV_EECN_ERR: ibv_wc_status = 17;
/// Invalid EE context state.
pub const IBV_WC_INV_EEC_STATE_ERR: ibv_wc_status = 18;
/// Fatal error.
pub const IBV_WC_FATAL_ERR: ibv_wc_status = 19;
/// Response timeout.
pub const IBV_WC_RESP_TIMEOUT_ERR: ibv_wc_status = 20;
/// General error.
pub const IBV_WC_GENERAL_ERR: ibv_wc_status = 21;
/// Tag matching error.
pub const IBV_WC_TM_ERR: ibv_wc_status = 22;
/// Tag matching rendezvous incomplete.
pub const IBV_WC_TM_RNDV_INCOMPLETE: ibv_wc_status = 23;

/// `enum ibv_wc_opcode`.
pub type ibv_wc_opcode = u32;
/// Send completed.
pub const IBV_WC_SEND: ibv_wc_opcode = 0;
/// RDMA write completed.
pub const IBV_WC_RDMA_WRITE: ibv_wc_opcode = 1;
/// RDMA read completed.
pub const IBV_WC_RDMA_READ: ibv_wc_opcode = 2;
/// Compare-and-swap completed.
pub const IBV_WC_COMP_SWAP: ibv_wc_opcode = 3;
/// Fetch-and-add completed.
pub const IBV_WC_FETCH_ADD: ibv_wc_opcode = 4;
/// Memory window bind completed.
pub const IBV_WC_BIND_MW: ibv_wc_opcode = 5;
/// Local invalidate completed.
pub const IBV_WC_LOCAL_INV: ibv_wc_opcode = 6;
/// TSO send completed.
pub const IBV_WC_TSO: ibv_wc_opcode = 7;
/// Atomic write completed.
pub const IBV_WC_ATOMIC_WRITE: ibv_wc_opcode = 9;
/// Receive completed (receive opcodes have this bit set).
pub const IBV_WC_RECV: ibv_wc_opcode = 1 << 7;
/// RDMA write with immediate received.
pub const IBV_WC_RECV_RDMA_WITH_IMM: ibv_wc_opcode = 129;
/// Tag matching: tag added.
pub const IBV_WC_TM_ADD: ibv_wc_opcode = 130;
/// Tag matching: tag deleted.
pub const IBV_WC_TM_DEL: ibv_wc_opcode = 131;
/// Tag matching: sync.
pub const IBV_WC_TM_SYNC: ibv_wc_opcode = 132;
/// Tag matching: receive.
pub const IBV_WC_TM_RECV: ibv_wc_opcode = 133;
/// Tag matching: no tag.
pub const IBV_WC_TM_NO_TAG: ibv_wc_opcode = 134;
/// Driver-specific opcode 1.
pub const IBV_WC_DRIVER1: ibv_wc_opcode = 135;
/// Driver-specific opcode 2.
pub const IBV_WC_DRIVER2: ibv_wc_opcode = 136;
/// Driver-specific opcode 3.
pub const IBV_WC_DRIVER3: ibv_wc_opcode = 137;

/// Anonymous enum: bit position of `IBV_WC_IP_CSUM_OK`.
pub const IBV_WC_IP_CSUM_OK_SHIFT: u32 = 2;

/// `enum ibv_create_cq_wc_flags` (bits of `ibv_cq_init_attr_ex::wc_flags`).
pub type ibv_create_cq_wc_flags = u32;
/// `byte_len` readable.
pub const IBV_WC_EX_WITH_BYTE_LEN: ibv_create_cq_wc_flags = 1;
/// Immediate data readable.
pub const IBV_WC_EX_WITH_IMM: ibv_create_cq_wc_flags = 1 << 1;
/// QP number readable.
pub const IBV_WC_EX_WITH_QP_NUM: ibv_create_cq_wc_flags = 1 << 2;
/// Source QP readable.
pub const IBV_WC_EX_WITH_SRC_QP: ibv_create_cq_wc_flags = 1 << 3;
/// SLID readable.
pub const IBV_WC_EX_WITH_SLID: ibv_create_cq_wc_flags = 1 << 4;
/// SL readable.
pub const IBV_WC_EX_WITH_SL: ibv_create_cq_wc_flags = 1 << 5;
/// DLID path bits readable.
pub const IBV_WC_EX_WITH_DLID_PATH_BITS: ibv_create_cq_wc_flags = 1 << 6;
/// Completion timestamp readable.
pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP: ibv_create_cq_wc_flags = 1 << 7;
/// C-VLAN readable.
pub const IBV_WC_EX_WITH_CVLAN: ibv_create_cq_wc_flags = 1 << 8;
/// Flow tag readable.
pub const IBV_WC_EX_WITH_FLOW_TAG: ibv_create_cq_wc_flags = 1 << 9;
/// Tag matching info readable.
pub const IBV_WC_EX_WITH_TM_INFO: ibv_create_cq_wc_flags = 1 << 10;
/// Wall-clock completion timestamp readable.
pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK: ibv_create_cq_wc_flags = 1 << 11;
/// Anonymous enum: the fields of a classic `ibv_wc`.
pub const IBV_WC_STANDARD_FLAGS: ibv_create_cq_wc_flags = IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS;
/// Anonymous enum: every flag `ibv_create_cq_ex` accepts.
pub const IBV_CREATE_CQ_SUP_WC_FLAGS: ibv_create_cq_wc_flags = IBV_WC_STANDARD_FLAGS
    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
    | IBV_WC_EX_WITH_CVLAN
    | IBV_WC_EX_WITH_FLOW_TAG
    | IBV_WC_EX_WITH_TM_INFO
    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

/// `enum ibv_wc_flags` (bits of `ibv_wc::wc_flags`).
pub type ibv_wc_flags = u32;
/// A GRH is present in the first 40 bytes of the receive buffer.
pub const IBV_WC_GRH: ibv_wc_flags = 1;
/// `imm_data` is valid.
pub const IBV_WC_WITH_IMM: ibv_wc_flags = 1 << 1;
/// IP checksum verified.
pub const IBV_WC_IP_CSUM_OK: ibv_wc_flags = 1 << IBV_WC_IP_CSUM_OK_SHIFT;
/// `invalidated_rkey` is valid.
pub const IBV_WC_WITH_INV: ibv_wc_flags = 1 << 3;
/// Tag matching sync request.
pub const IBV_WC_TM_SYNC_REQ: ibv_wc_flags = 1 << 4;
/// Tag matching match.
pub const IBV_WC_TM_MATCH: ibv_wc_flags = 1 << 5;
/// Tag matching data valid.
pub const IBV_WC_TM_DATA_VALID: ibv_wc_flags = 1 << 6;

/// `IBV_ACCESS_OPTIONAL_FIRST` (`IB_UVERBS_ACCESS_OPTIONAL_FIRST`): first optional access bit.
pub const IBV_ACCESS_OPTIONAL_FIRST: ibv_access_flags = 1 << 20;
/// `IBV_ACCESS_OPTIONAL_RANGE` (`IB_UVERBS_ACCESS_OPTIONAL_RANGE`): bits 20..=29, which a
/// device may ignore.
pub const IBV_ACCESS_OPTIONAL_RANGE: ibv_access_flags = 0x3ff0_0000;

/// `enum ibv_access_flags` (MR, MW and QP access bits).
pub type ibv_access_flags = u32;
/// Local write.
pub const IBV_ACCESS_LOCAL_WRITE: ibv_access_flags = 1;
/// Remote write.
pub const IBV_ACCESS_REMOTE_WRITE: ibv_access_flags = 1 << 1;
/// Remote read.
pub const IBV_ACCESS_REMOTE_READ: ibv_access_flags = 1 << 2;
/// Remote atomic.
pub const IBV_ACCESS_REMOTE_ATOMIC: ibv_access_flags = 1 << 3;
/// Memory window binding allowed.
pub const IBV_ACCESS_MW_BIND: ibv_access_flags = 1 << 4;
/// Zero-based addressing.
pub const IBV_ACCESS_ZERO_BASED: ibv_access_flags = 1 << 5;
/// On-demand paging.
pub const IBV_ACCESS_ON_DEMAND: ibv_access_flags = 1 << 6;
/// Huge pages.
pub const IBV_ACCESS_HUGETLB: ibv_access_flags = 1 << 7;
/// Relaxed ordering (optional bit).
pub const IBV_ACCESS_RELAXED_ORDERING: ibv_access_flags = IBV_ACCESS_OPTIONAL_FIRST;

/// `enum ibv_xrcd_init_attr_mask`.
pub type ibv_xrcd_init_attr_mask = u32;
/// `fd` is valid.
pub const IBV_XRCD_INIT_ATTR_FD: ibv_xrcd_init_attr_mask = 1;
/// `oflags` is valid.
pub const IBV_XRCD_INIT_ATTR_OFLAGS: ibv_xrcd_init_attr_mask = 1 << 1;
/// First reserved bit.
pub const IBV_XRCD_INIT_ATTR_RESERVED: ibv_xrcd_init_attr_mask = 1 << 2;

/// `enum ibv_rereg_mr_flags`.
pub type ibv_rereg_mr_flags = u32;
/// Change address and length.
pub const IBV_REREG_MR_CHANGE_TRANSLATION: ibv_rereg_mr_flags = 1;
/// Change protection domain.
pub const IBV_REREG_MR_CHANGE_PD: ibv_rereg_mr_flags = 1 << 1;
/// Change access flags.
pub const IBV_REREG_MR_CHANGE_ACCESS: ibv_rereg_mr_flags = 1 << 2;
/// Every supported rereg flag.
pub const IBV_REREG_MR_FLAGS_SUPPORTED: ibv_rereg_mr_flags = (IBV_REREG_MR_CHANGE_ACCESS << 1) - 1;

/// `enum ibv_rereg_mr_err_code` (negative returns of `ibv_rereg_mr`).
pub type ibv_rereg_mr_err_code = i32;
/// Old MR valid, invalid input.
pub const IBV_REREG_MR_ERR_INPUT: ibv_rereg_mr_err_code = -1;
/// Old MR valid, dontfork on the new range failed.
pub const IBV_REREG_MR_ERR_DONT_FORK_NEW: ibv_rereg_mr_err_code = -2;
/// New MR valid, dofork on the old range failed.
pub const IBV_REREG_MR_ERR_DO_FORK_OLD: ibv_rereg_mr_err_code = -3;
/// MR unusable, command error.
pub const IBV_REREG_MR_ERR_CMD: ibv_rereg_mr_err_code = -4;
/// MR unusable, command error and bad fork state on the new range.
pub const IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW: ibv_rereg_mr_err_code = -5;

/// `enum ibv_mw_type`.
pub type ibv_mw_type = u32;
/// Type 1 memory window.
pub const IBV_MW_TYPE_1: ibv_mw_type = 1;
/// Type 2 memory window.
pub const IBV_MW_TYPE_2: ibv_mw_type = 2;

/// `enum ibv_rate`.
pub type ibv_rate = u32;
/// Maximum rate.
pub const IBV_RATE_MAX: ibv_rate = 0;
/// 2.5 Gb/s.
pub const IBV_RATE_2_5_GBPS: ibv_rate = 2;
/// 5 Gb/s.
pub const IBV_RATE_5_GBPS: ibv_rate = 5;
/// 10 Gb/s.
pub const IBV_RATE_10_GBPS: ibv_rate = 3;
/// 20 Gb/s.
pub const IBV_RATE_20_GBPS: ibv_rate = 6;
/// 30 Gb/s.
pub const IBV_RATE_30_GBPS: ibv_rate = 4;
/// 40 Gb/s.
pub const IBV_RATE_40_GBPS: ibv_rate = 7;
/// 60 Gb/s.
pub const IBV_RATE_60_GBPS: ibv_rate = 8;
/// 80 Gb/s.
pub const IBV_RATE_80_GBPS: ibv_rate = 9;
/// 120 Gb/s.
pub const IBV_RATE_120_GBPS: ibv_rate = 10;
/// 14 Gb/s.
pub const IBV_RATE_14_GBPS: ibv_rate = 11;
/// 56 Gb/s.
pub const IBV_RATE_56_GBPS: ibv_rate = 12;
/// 112 Gb/s.
pub const IBV_RATE_112_GBPS: ibv_rate = 13;
/// 168 Gb/s.
pub const IBV_RATE_168_GBPS: ibv_rate = 14;
/// 25 Gb/s.
pub const IBV_RATE_25_GBPS: ibv_rate = 15;
/// 100 Gb/s.
pub const IBV_RATE_100_GBPS: ibv_rate = 16;
/// 200 Gb/s.
pub const IBV_RATE_200_GBPS: ibv_rate = 17;
/// 300 Gb/s.
pub const IBV_RATE_300_GBPS: ibv_rate = 18;
/// 28 Gb/s.
pub const IBV_RATE_28_GBPS: ibv_rate = 19;
/// 50 Gb/s.
pub const IBV_RATE_50_GBPS: ibv_rate = 20;
/// 400 Gb/s.
pub const IBV_RATE_400_GBPS: ibv_rate = 21;
/// 600 Gb/s.
pub const IBV_RATE_600_GBPS: ibv_rate = 22;
/// 800 Gb/s.
pub const IBV_RATE_800_GBPS: ibv_rate = 23;
/// 1200 Gb/s.
pub const IBV_RATE_1200_GBPS: ibv_rate = 24;

/// `enum ibv_srq_attr_mask` (`attr_mask` of `ibv_modify_srq`).
pub type ibv_srq_attr_mask = u32;
/// Resize the SRQ (`max_wr`).
pub const IBV_SRQ_MAX_WR: ibv_srq_attr_mask = 1;
/// Set the SRQ limit (`srq_limit`).
pub const IBV_SRQ_LIMIT: ibv_srq_attr_mask = 1 << 1;

/// `enum ibv_srq_type`.
pub type ibv_srq_type = u32;
/// Basic SRQ.
pub const IBV_SRQT_BASIC: ibv_srq_type = 0;
/// XRC SRQ.
pub const IBV_SRQT_XRC: ibv_srq_type = 1;
/// Tag-matching SRQ.
pub const IBV_SRQT_TM: ibv_srq_type = 2;

/// `enum ibv_srq_init_attr_mask` (bits of `ibv_srq_init_attr_ex::comp_mask`).
pub type ibv_srq_init_attr_mask = u32;
/// `srq_type` valid.
pub const IBV_SRQ_INIT_ATTR_TYPE: ibv_srq_init_attr_mask = 1;
/// `pd` valid.
pub const IBV_SRQ_INIT_ATTR_PD: ibv_srq_init_attr_mask = 1 << 1;
/// `xrcd` valid.
pub const IBV_SRQ_INIT_ATTR_XRCD: ibv_srq_init_attr_mask = 1 << 2;
/// `cq` valid.
pub const IBV_SRQ_INIT_ATTR_CQ: ibv_srq_init_attr_mask = 1 << 3;
/// `tm_cap` valid.
pub const IBV_SRQ_INIT_ATTR_TM: ibv_srq_init_attr_mask = 1 << 4;
/// First reserved bit.
pub const IBV_SRQ_INIT_ATTR_RESERVED: ibv_srq_init_attr_mask = 1 << 5;

/// `enum ibv_wq_type`.
pub type ibv_wq_type = u32;
/// Receive work queue.
pub const IBV_WQT_RQ: ibv_wq_type = 0;

/// `enum ibv_wq_init_attr_mask`.
pub type ibv_wq_init_attr_mask = u32;
/// `create_flags` valid.
pub const IBV_WQ_INIT_ATTR_FLAGS: ibv_wq_init_attr_mask = 1;
/// First reserved bit.
pub const IBV_WQ_INIT_ATTR_RESERVED: ibv_wq_init_attr_mask = 1 << 1;

/// `enum ibv_wq_flags`.
pub type ibv_wq_flags = u32;
/// C-VLAN stripping.
pub const IBV_WQ_FLAGS_CVLAN_STRIPPING: ibv_wq_flags = 1;
/// Scatter FCS.
pub const IBV_WQ_FLAGS_SCATTER_FCS: ibv_wq_flags = 1 << 1;
/// Delay drop.
pub const IBV_WQ_FLAGS_DELAY_DROP: ibv_wq_flags = 1 << 2;
/// PCI write end padding.
pub const IBV_WQ_FLAGS_PCI_WRITE_END_PADDING: ibv_wq_flags = 1 << 3;
/// First reserved bit.
pub const IBV_WQ_FLAGS_RESERVED: ibv_wq_flags = 1 << 4;

/// `enum ibv_wq_state`.
pub type ibv_wq_state = u32;
/// Reset.
pub const IBV_WQS_RESET: ibv_wq_state = 0;
/// Ready.
pub const IBV_WQS_RDY: ibv_wq_state = 1;
/// Error.
pub const IBV_WQS_ERR: ibv_wq_state = 2;
/// Unknown.
pub const IBV_WQS_UNKNOWN: ibv_wq_state = 3;

/// `enum ibv_wq_attr_mask`.
pub type ibv_wq_attr_mask = u32;
/// `wq_state` valid.
pub const IBV_WQ_ATTR_STATE: ibv_wq_attr_mask = 1;
/// `curr_wq_state` valid.
pub const IBV_WQ_ATTR_CURR_STATE: ibv_wq_attr_mask = 1 << 1;
/// `flags` valid.
pub const IBV_WQ_ATTR_FLAGS: ibv_wq_attr_mask = 1 << 2;
/// First reserved bit.
pub const IBV_WQ_ATTR_RESERVED: ibv_wq_attr_mask = 1 << 3;

/// `enum ibv_ind_table_init_attr_mask`.
pub type ibv_ind_table_init_attr_mask = u32;
/// First reserved bit.
pub const IBV_CREATE_IND_TABLE_RESERVED: ibv_ind_table_init_attr_mask = 1;

/// `enum ibv_qp_type`.
pub type ibv_qp_type = u32;
/// Reliable connected.
pub const IBV_QPT_RC: ibv_qp_type = 2;
/// Unreliable connected.
pub const IBV_QPT_UC: ibv_qp_type = 3;
/// Unreliable datagram.
pub const IBV_QPT_UD: ibv_qp_type = 4;
/// Raw packet.
pub const IBV_QPT_RAW_PACKET: ibv_qp_type = 8;
/// XRC initiator.
pub const IBV_QPT_XRC_SEND: ibv_qp_type = 9;
/// XRC target.
pub const IBV_QPT_XRC_RECV: ibv_qp_type = 10;
/// Driver-specific QP type.
pub const IBV_QPT_DRIVER: ibv_qp_type = 0xff;

/// `enum ibv_qp_init_attr_mask` (bits of `ibv_qp_init_attr_ex::comp_mask`).
pub type ibv_qp_init_attr_mask = u32;
/// `pd` valid.
pub const IBV_QP_INIT_ATTR_PD: ibv_qp_init_attr_mask = 1;
/// `xrcd` valid.
pub const IBV_QP_INIT_ATTR_XRCD: ibv_qp_init_attr_mask = 1 << 1;
/// `create_flags` valid.
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: ibv_qp_init_attr_mask = 1 << 2;
/// `max_tso_header` valid.
pub const IBV_QP_INIT_ATTR_MAX_TSO_HEADER: ibv_qp_init_attr_mask = 1 << 3;
/// `rwq_ind_tbl` valid.
pub const IBV_QP_INIT_ATTR_IND_TABLE: ibv_qp_init_attr_mask = 1 << 4;
/// `rx_hash_conf` valid.
pub const IBV_QP_INIT_ATTR_RX_HASH: ibv_qp_init_attr_mask = 1 << 5;
/// `send_ops_flags` valid (the QP gets an `ibv_qp_ex` interface).
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: ibv_qp_init_attr_mask = 1 << 6;

/// `enum ibv_qp_create_flags`.
pub type ibv_qp_create_flags = u32;
/// Block multicast loopback to self.
pub const IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: ibv_qp_create_flags = 1 << 1;
/// Scatter FCS.
pub const IBV_QP_CREATE_SCATTER_FCS: ibv_qp_create_flags = 1 << 8;
/// C-VLAN stripping.
pub const IBV_QP_CREATE_CVLAN_STRIPPING: ibv_qp_create_flags = 1 << 9;
/// `source_qpn` valid.
pub const IBV_QP_CREATE_SOURCE_QPN: ibv_qp_create_flags = 1 << 10;
/// PCI write end padding.
pub const IBV_QP_CREATE_PCI_WRITE_END_PADDING: ibv_qp_create_flags = 1 << 11;

/// `enum ibv_qp_create_send_ops_flags` (bits of the 64-bit `send_ops_flags`).
pub type ibv_qp_create_send_ops_flags = u32;
/// `wr_rdma_write`.
pub const IBV_QP_EX_WITH_RDMA_WRITE: ibv_qp_create_send_ops_flags = 1;
/// `wr_rdma_write_imm`.
pub const IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM: ibv_qp_create_send_ops_flags = 1 << 1;
/// `wr_send`.
pub const IBV_QP_EX_WITH_SEND: ibv_qp_create_send_ops_flags = 1 << 2;
/// `wr_send_imm`.
pub const IBV_QP_EX_WITH_SEND_WITH_IMM: ibv_qp_create_send_ops_flags = 1 << 3;
/// `wr_rdma_read`.
pub const IBV_QP_EX_WITH_RDMA_READ: ibv_qp_create_send_ops_flags = 1 << 4;
/// `wr_atomic_cmp_swp`.
pub const IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP: ibv_qp_create_send_ops_flags = 1 << 5;
/// `wr_atomic_fetch_add`.
pub const IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD: ibv_qp_create_send_ops_flags = 1 << 6;
/// `wr_local_inv`.
pub const IBV_QP_EX_WITH_LOCAL_INV: ibv_qp_create_send_ops_flags = 1 << 7;
/// `wr_bind_mw`.
pub const IBV_QP_EX_WITH_BIND_MW: ibv_qp_create_send_ops_flags = 1 << 8;
/// `wr_send_inv`.
pub const IBV_QP_EX_WITH_SEND_WITH_INV: ibv_qp_create_send_ops_flags = 1 << 9;
/// `wr_send_tso`.
pub const IBV_QP_EX_WITH_TSO: ibv_qp_create_send_ops_flags = 1 << 10;
/// `wr_atomic_write`.
pub const IBV_QP_EX_WITH_ATOMIC_WRITE: ibv_qp_create_send_ops_flags = 1 << 12;

/// `enum ibv_qp_open_attr_mask`.
pub type ibv_qp_open_attr_mask = u32;
/// `qp_num` valid.
pub const IBV_QP_OPEN_ATTR_NUM: ibv_qp_open_attr_mask = 1;
/// `xrcd` valid.
pub const IBV_QP_OPEN_ATTR_XRCD: ibv_qp_open_attr_mask = 1 << 1;
/// `qp_context` valid.
pub const IBV_QP_OPEN_ATTR_CONTEXT: ibv_qp_open_attr_mask = 1 << 2;
/// `qp_type` valid.
pub const IBV_QP_OPEN_ATTR_TYPE: ibv_qp_open_attr_mask = 1 << 3;
/// First reserved bit.
pub const IBV_QP_OPEN_ATTR_RESERVED: ibv_qp_open_attr_mask = 1 << 4;

/// `enum ibv_qp_attr_mask` (`attr_mask` of `ibv_modify_qp` / `ibv_query_qp`).
pub type ibv_qp_attr_mask = u32;
/// `qp_state`.
pub const IBV_QP_STATE: ibv_qp_attr_mask = 1;
/// `cur_qp_state`.
pub const IBV_QP_CUR_STATE: ibv_qp_attr_mask = 1 << 1;
/// `en_sqd_async_notify`.
pub const IBV_QP_EN_SQD_ASYNC_NOTIFY: ibv_qp_attr_mask = 1 << 2;
/// `qp_access_flags`.
pub const IBV_QP_ACCESS_FLAGS: ibv_qp_attr_mask = 1 << 3;
/// `pkey_index`.
pub const IBV_QP_PKEY_INDEX: ibv_qp_attr_mask = 1 << 4;
/// `port_num`.
pub const IBV_QP_PORT: ibv_qp_attr_mask = 1 << 5;
/// `qkey`.
pub const IBV_QP_QKEY: ibv_qp_attr_mask = 1 << 6;
/// `ah_attr`.
pub const IBV_QP_AV: ibv_qp_attr_mask = 1 << 7;
/// `path_mtu`.
pub const IBV_QP_PATH_MTU: ibv_qp_attr_mask = 1 << 8;
/// `timeout`.
pub const IBV_QP_TIMEOUT: ibv_qp_attr_mask = 1 << 9;
/// `retry_cnt`.
pub const IBV_QP_RETRY_CNT: ibv_qp_attr_mask = 1 << 10;
/// `rnr_retry`.
pub const IBV_QP_RNR_RETRY: ibv_qp_attr_mask = 1 << 11;
/// `rq_psn`.
pub const IBV_QP_RQ_PSN: ibv_qp_attr_mask = 1 << 12;
/// `max_rd_atomic`.
pub const IBV_QP_MAX_QP_RD_ATOMIC: ibv_qp_attr_mask = 1 << 13;
/// `alt_ah_attr`, `alt_pkey_index`, `alt_port_num`, `alt_timeout`.
pub const IBV_QP_ALT_PATH: ibv_qp_attr_mask = 1 << 14;
/// `min_rnr_timer`.
pub const IBV_QP_MIN_RNR_TIMER: ibv_qp_attr_mask = 1 << 15;
/// `sq_psn`.
pub const IBV_QP_SQ_PSN: ibv_qp_attr_mask = 1 << 16;
/// `max_dest_rd_atomic`.
pub const IBV_QP_MAX_DEST_RD_ATOMIC: ibv_qp_attr_mask = 1 << 17;
/// `path_mig_state`.
pub const IBV_QP_PATH_MIG_STATE: ibv_qp_attr_mask = 1 << 18;
/// `cap`.
pub const IBV_QP_CAP: ibv_qp_attr_mask = 1 << 19;
/// `dest_qp_num`.
pub const IBV_QP_DEST_QPN: ibv_qp_attr_mask = 1 << 20;
/// `rate_limit`.
pub const IBV_QP_RATE_LIMIT: ibv_qp_attr_mask = 1 << 25;

/// `enum ibv_qp_state`.
pub type ibv_qp_state = u32;
/// Reset.
pub const IBV_QPS_RESET: ibv_qp_state = 0;
/// Initialized.
pub const IBV_QPS_INIT: ibv_qp_state = 1;
/// Ready to receive.
pub const IBV_QPS_RTR: ibv_qp_state = 2;
/// Ready to send.
pub const IBV_QPS_RTS: ibv_qp_state = 3;
/// Send queue drain.
pub const IBV_QPS_SQD: ibv_qp_state = 4;
/// Send queue error.
pub const IBV_QPS_SQE: ibv_qp_state = 5;
/// Error.
pub const IBV_QPS_ERR: ibv_qp_state = 6;
/// Unknown.
pub const IBV_QPS_UNKNOWN: ibv_qp_state = 7;

/// `enum ibv_mig_state`.
pub type ibv_mig_state = u32;
/// Migrated.
pub const IBV_MIG_MIGRATED: ibv_mig_state = 0;
/// Rearm.
pub const IBV_MIG_REARM: ibv_mig_state = 1;
/// Armed.
pub const IBV_MIG_ARMED: ibv_mig_state = 2;

/// `enum ibv_wr_opcode`.
pub type ibv_wr_opcode = u32;
/// RDMA write.
pub const IBV_WR_RDMA_WRITE: ibv_wr_opcode = 0;
/// RDMA write with immediate.
pub const IBV_WR_RDMA_WRITE_WITH_IMM: ibv_wr_opcode = 1;
/// Send.
pub const IBV_WR_SEND: ibv_wr_opcode = 2;
/// Send with immediate.
pub const IBV_WR_SEND_WITH_IMM: ibv_wr_opcode = 3;
/// RDMA read.
pub const IBV_WR_RDMA_READ: ibv_wr_opcode = 4;
/// Atomic compare-and-swap.
pub const IBV_WR_ATOMIC_CMP_AND_SWP: ibv_wr_opcode = 5;
/// Atomic fetch-and-add.
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: ibv_wr_opcode = 6;
/// Local invalidate.
pub const IBV_WR_LOCAL_INV: ibv_wr_opcode = 7;
/// Bind memory window.
pub const IBV_WR_BIND_MW: ibv_wr_opcode = 8;
/// Send with invalidate.
pub const IBV_WR_SEND_WITH_INV: ibv_wr_opcode = 9;
/// TCP segmentation offload send.
pub const IBV_WR_TSO: ibv_wr_opcode = 10;
/// Driver-specific opcode.
pub const IBV_WR_DRIVER1: ibv_wr_opcode = 11;
/// Atomic write.
pub const IBV_WR_ATOMIC_WRITE: ibv_wr_opcode = 15;

/// `enum ibv_send_flags` (bits of `ibv_send_wr::send_flags`).
pub type ibv_send_flags = u32;
/// Fence: wait for earlier reads/atomics.
pub const IBV_SEND_FENCE: ibv_send_flags = 1;
/// Generate a completion.
pub const IBV_SEND_SIGNALED: ibv_send_flags = 1 << 1;
/// Set the solicited event bit.
pub const IBV_SEND_SOLICITED: ibv_send_flags = 1 << 2;
/// Copy the payload at post time (inline data).
pub const IBV_SEND_INLINE: ibv_send_flags = 1 << 3;
/// IP checksum offload.
pub const IBV_SEND_IP_CSUM: ibv_send_flags = 1 << 4;

/// `enum ibv_ops_wr_opcode`.
pub type ibv_ops_wr_opcode = u32;
/// Add a tag.
pub const IBV_WR_TAG_ADD: ibv_ops_wr_opcode = 0;
/// Delete a tag.
pub const IBV_WR_TAG_DEL: ibv_ops_wr_opcode = 1;
/// Sync tags.
pub const IBV_WR_TAG_SYNC: ibv_ops_wr_opcode = 2;

/// `enum ibv_ops_flags`.
pub type ibv_ops_flags = u32;
/// Generate a completion.
pub const IBV_OPS_SIGNALED: ibv_ops_flags = 1;
/// Tag matching sync.
pub const IBV_OPS_TM_SYNC: ibv_ops_flags = 1 << 1;

/// `enum ibv_cq_attr_mask` (bits of `ibv_modify_cq_attr::attr_mask`).
pub type ibv_cq_attr_mask = u32;
/// `moderate` valid.
pub const IBV_CQ_ATTR_MODERATE: ibv_cq_attr_mask = 1;
/// First reserved bit.
pub const IBV_CQ_ATTR_RESERVED: ibv_cq_attr_mask = 1 << 1;

/// `enum ibv_flow_flags`.
pub type ibv_flow_flags = u32;
/// Don't trap: also deliver to lower-priority rules.
pub const IBV_FLOW_ATTR_FLAGS_DONT_TRAP: ibv_flow_flags = 1 << 1;
/// Egress rule.
pub const IBV_FLOW_ATTR_FLAGS_EGRESS: ibv_flow_flags = 1 << 2;

/// `enum ibv_flow_attr_type`.
pub type ibv_flow_attr_type = u32;
/// Steer by the rule's specifications.
pub const IBV_FLOW_ATTR_NORMAL: ibv_flow_attr_type = 0;
/// Default unicast and multicast rule.
pub const IBV_FLOW_ATTR_ALL_DEFAULT: ibv_flow_attr_type = 1;
/// Default multicast rule.
pub const IBV_FLOW_ATTR_MC_DEFAULT: ibv_flow_attr_type = 2;
/// Sniffer rule.
pub const IBV_FLOW_ATTR_SNIFFER: ibv_flow_attr_type = 3;

/// `enum ibv_flow_spec_type`.
pub type ibv_flow_spec_type = u32;
/// Ethernet spec.
pub const IBV_FLOW_SPEC_ETH: ibv_flow_spec_type = 0x20;
/// IPv4 spec.
pub const IBV_FLOW_SPEC_IPV4: ibv_flow_spec_type = 0x30;
/// IPv6 spec.
pub const IBV_FLOW_SPEC_IPV6: ibv_flow_spec_type = 0x31;
/// Extended IPv4 spec.
pub const IBV_FLOW_SPEC_IPV4_EXT: ibv_flow_spec_type = 0x32;
/// ESP spec.
pub const IBV_FLOW_SPEC_ESP: ibv_flow_spec_type = 0x34;
/// TCP spec.
pub const IBV_FLOW_SPEC_TCP: ibv_flow_spec_type = 0x40;
/// UDP spec.
pub const IBV_FLOW_SPEC_UDP: ibv_flow_spec_type = 0x41;
/// VXLAN tunnel spec.
pub const IBV_FLOW_SPEC_VXLAN_TUNNEL: ibv_flow_spec_type = 0x50;
/// GRE spec.
pub const IBV_FLOW_SPEC_GRE: ibv_flow_spec_type = 0x51;
/// MPLS spec.
pub const IBV_FLOW_SPEC_MPLS: ibv_flow_spec_type = 0x60;
/// Inner-header modifier bit.
pub const IBV_FLOW_SPEC_INNER: ibv_flow_spec_type = 0x100;
/// Tag action.
pub const IBV_FLOW_SPEC_ACTION_TAG: ibv_flow_spec_type = 0x1000;
/// Drop action.
pub const IBV_FLOW_SPEC_ACTION_DROP: ibv_flow_spec_type = 0x1001;
/// Flow action handle.
pub const IBV_FLOW_SPEC_ACTION_HANDLE: ibv_flow_spec_type = 0x1002;
/// Counter action.
pub const IBV_FLOW_SPEC_ACTION_COUNT: ibv_flow_spec_type = 0x1003;

/// `enum ibv_flow_action_esp_mask`.
pub type ibv_flow_action_esp_mask = u32;
/// `esn` valid.
pub const IBV_FLOW_ACTION_ESP_MASK_ESN: ibv_flow_action_esp_mask = 1;

/// `ibv_flow_action_esp_keymat` (`enum ib_uverbs_flow_action_esp_keymat`).
pub type ibv_flow_action_esp_keymat = u32;
/// AES-GCM key material.
pub const IBV_FLOW_ACTION_ESP_KEYMAT_AES_GCM: ibv_flow_action_esp_keymat = 0;

/// `ibv_flow_action_esp_replay` (`enum ib_uverbs_flow_action_esp_replay`).
pub type ibv_flow_action_esp_replay = u32;
/// No replay protection.
pub const IBV_FLOW_ACTION_ESP_REPLAY_NONE: ibv_flow_action_esp_replay = 0;
/// Bitmap replay protection.
pub const IBV_FLOW_ACTION_ESP_REPLAY_BMP: ibv_flow_action_esp_replay = 1;

/// Anonymous enum: `IBV_SYSFS_NAME_MAX`, length of `ibv_device::name`/`dev_name`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// Anonymous enum: `IBV_SYSFS_PATH_MAX`, length of `ibv_device::dev_path`/`ibdev_path`.
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// `enum ibv_cq_init_attr_mask` (bits of `ibv_cq_init_attr_ex::comp_mask`).
pub type ibv_cq_init_attr_mask = u32;
/// `flags` valid.
pub const IBV_CQ_INIT_ATTR_MASK_FLAGS: ibv_cq_init_attr_mask = 1;
/// `parent_domain` valid.
pub const IBV_CQ_INIT_ATTR_MASK_PD: ibv_cq_init_attr_mask = 1 << 1;

/// `enum ibv_create_cq_attr_flags` (bits of `ibv_cq_init_attr_ex::flags`).
pub type ibv_create_cq_attr_flags = u32;
/// Single-threaded use: no locking needed.
pub const IBV_CREATE_CQ_ATTR_SINGLE_THREADED: ibv_create_cq_attr_flags = 1;
/// Ignore overruns.
pub const IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN: ibv_create_cq_attr_flags = 1 << 1;

/// `enum ibv_parent_domain_init_attr_mask`.
pub type ibv_parent_domain_init_attr_mask = u32;
/// `alloc`/`free` valid.
pub const IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS: ibv_parent_domain_init_attr_mask = 1;
/// `pd_context` valid.
pub const IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT: ibv_parent_domain_init_attr_mask = 1 << 1;

/// `enum ibv_counter_description`.
pub type ibv_counter_description = u32;
/// Packet counter.
pub const IBV_COUNTER_PACKETS: ibv_counter_description = 0;
/// Byte counter.
pub const IBV_COUNTER_BYTES: ibv_counter_description = 1;

/// `enum ibv_read_counters_flags`.
pub type ibv_read_counters_flags = u32;
/// Prefer cached values.
pub const IBV_READ_COUNTERS_ATTR_PREFER_CACHED: ibv_read_counters_flags = 1;

/// `enum ibv_values_mask` (bits of `ibv_values_ex::comp_mask`).
pub type ibv_values_mask = u32;
/// `raw_clock` valid.
pub const IBV_VALUES_MASK_RAW_CLOCK: ibv_values_mask = 1;
/// First reserved bit.
pub const IBV_VALUES_MASK_RESERVED: ibv_values_mask = 1 << 1;

/// `ibv_advise_mr_advice` (`enum ib_uverbs_advise_mr_advice`).
pub type ibv_advise_mr_advice = u32;
/// Prefetch for read.
pub const IBV_ADVISE_MR_ADVICE_PREFETCH: ibv_advise_mr_advice = 0;
/// Prefetch for write.
pub const IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE: ibv_advise_mr_advice = 1;
/// Prefetch without faulting.
pub const IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT: ibv_advise_mr_advice = 2;
/// `IBV_ADVISE_MR_FLAG_FLUSH`: wait for the advice to complete.
pub const IBV_ADVISE_MR_FLAG_FLUSH: u32 = 1;

/// `IBV_QPF_GRH_REQUIRED` (bit of `ibv_port_attr::flags`): the port needs a GRH
/// in every address vector (RoCE).
pub const IBV_QPF_GRH_REQUIRED: u8 = 1;

/// `ETHERNET_LL_SIZE`: length of a MAC address.
pub const ETHERNET_LL_SIZE: usize = 6;
/// `IB_ROCE_UDP_ENCAP_VALID_PORT_MIN`: lowest RoCEv2 UDP source port.
pub const IB_ROCE_UDP_ENCAP_VALID_PORT_MIN: u16 = 0xC000;
/// `IB_ROCE_UDP_ENCAP_VALID_PORT_MAX`: highest RoCEv2 UDP source port.
pub const IB_ROCE_UDP_ENCAP_VALID_PORT_MAX: u16 = 0xFFFF;
/// `IB_GRH_FLOWLABEL_MASK`: the 20 flow-label bits.
pub const IB_GRH_FLOWLABEL_MASK: u32 = 0x000F_FFFF;
