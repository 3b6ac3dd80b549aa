//! Checks `rverbs_ibverbs_abi::abi` against the real `<infiniband/verbs.h>`.
//!
//! One table below lists every type of the `abi` module with every field
//! path and every constant. From it the test generates a C program that
//! prints, for each type, `sizeof` and `_Alignof`, for each field `offsetof`
//! and the member's `sizeof` (nested unions and structs included, e.g.
//! `wr.rdma.rkey`), for `verbs_context` each slot's offset relative to its
//! `context` member, and the value of each constant; compiles it with `cc`,
//! runs it and compares every number with what Rust computes from the same
//! table (`size_of`, `align_of`, `offset_of!`). Any difference fails the test
//! with the full list.
//!
//! The table macros and the compile-run-compare step are shared with
//! `tests/layout_rdmacm.rs` (`layout_harness`). Without `cc` or without the
//! header (package libibverbs-dev) the test is skipped with a message,
//! unless the `CI` environment variable is set: then it fails.
//! `abi_md_numbers` checks the layout facts of shared/design/ABI.md on the
//! Rust side alone, so it always runs.

#[macro_use]
mod layout_harness;

use std::mem::{offset_of, size_of};

use layout_harness::{i, Check};
use rverbs_ibverbs_abi::abi::*;

/// Every type of the `abi` module with every field path.
fn layout_checks() -> Vec<Check> {
    layout_table! {
        union ibv_gid { raw, global, global.subnet_prefix, global.interface_id }
        struct ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }
        struct ibv_alloc_dm_attr { length, log_align_req, comp_mask }
        struct ibv_dm { context, memcpy_to_dm, memcpy_from_dm, comp_mask, handle }
        struct ibv_device_attr {
            fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
            vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd,
            max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
            max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw,
            max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
            max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr,
            max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt,
        }
        struct ibv_query_device_ex_input { comp_mask }
        struct ibv_odp_caps {
            general_caps, per_transport_caps, per_transport_caps.rc_odp_caps,
            per_transport_caps.uc_odp_caps, per_transport_caps.ud_odp_caps,
        }
        struct ibv_tso_caps { max_tso, supported_qpts }
        struct ibv_rss_caps {
            supported_qpts, max_rwq_indirection_tables, max_rwq_indirection_table_size,
            rx_hash_fields_mask, rx_hash_function,
        }
        struct ibv_packet_pacing_caps { qp_rate_limit_min, qp_rate_limit_max, supported_qpts }
        struct ibv_tm_caps { max_rndv_hdr_size, max_num_tags, flags, max_ops, max_sge }
        struct ibv_cq_moderation_caps { max_cq_count, max_cq_period }
        struct ibv_pci_atomic_caps { fetch_add, swap, compare_swap }
        struct ibv_device_attr_ex {
            orig_attr, orig_attr.phys_port_cnt, comp_mask, odp_caps,
            odp_caps.per_transport_caps.ud_odp_caps, completion_timestamp_mask, hca_core_clock,
            device_cap_flags_ex, tso_caps, rss_caps, rss_caps.rx_hash_function, max_wq_type_rq,
            packet_pacing_caps, raw_packet_caps, tm_caps, cq_mod_caps, max_dm_size,
            pci_atomic_caps, pci_atomic_caps.compare_swap, xrc_odp_caps, phys_port_cnt_ex,
        }
        struct ibv_port_attr {
            state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr,
            qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout,
            init_type_reply, active_width, active_speed, phys_state, link_layer, flags,
            port_cap_flags2,
        }
        struct ibv_async_event {
            element, element.cq, element.qp, element.srq, element.wq, element.port_num,
            event_type,
        }
        struct ibv_wc {
            wr_id, status, opcode, vendor_err, byte_len,
            imm => "imm_data",
            imm.imm_data => "imm_data",
            imm.invalidated_rkey => "invalidated_rkey",
            qp_num, src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits,
        }
        struct ibv_mw_bind_info { mr, addr, length, mw_access_flags }
        struct ibv_pd { context, handle }
        struct ibv_td_init_attr { comp_mask }
        struct ibv_td { context }
        struct ibv_xrcd_init_attr { comp_mask, fd, oflags }
        struct ibv_xrcd { context }
        struct ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        struct ibv_mw { context, pd, rkey, handle, r#type }
        struct ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
        struct ibv_grh { version_tclass_flow, paylen, next_hdr, hop_limit, sgid, dgid }
        struct ibv_ah_attr {
            grh, grh.dgid, grh.flow_label, grh.sgid_index, grh.hop_limit, grh.traffic_class,
            dlid, sl, src_path_bits, static_rate, is_global, port_num,
        }
        struct ibv_srq_attr { max_wr, max_sge, srq_limit }
        struct ibv_srq_init_attr { srq_context, attr, attr.max_wr, attr.max_sge, attr.srq_limit }
        struct ibv_tm_cap { max_num_tags, max_ops }
        struct ibv_srq_init_attr_ex {
            srq_context, attr, comp_mask, srq_type, pd, xrcd, cq, tm_cap, tm_cap.max_num_tags,
            tm_cap.max_ops,
        }
        struct ibv_wq_init_attr {
            wq_context, wq_type, max_wr, max_sge, pd, cq, comp_mask, create_flags,
        }
        struct ibv_wq_attr { attr_mask, wq_state, curr_wq_state, flags, flags_mask }
        struct ibv_rwq_ind_table { context, ind_tbl_handle, ind_tbl_num, comp_mask }
        struct ibv_rwq_ind_table_init_attr { log_ind_tbl_size, ind_tbl, comp_mask }
        struct ibv_qp_cap {
            max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data,
        }
        struct ibv_qp_init_attr {
            qp_context, send_cq, recv_cq, srq, cap, cap.max_inline_data, qp_type, sq_sig_all,
        }
        struct ibv_rx_hash_conf {
            rx_hash_function, rx_hash_key_len, rx_hash_key, rx_hash_fields_mask,
        }
        struct ibv_qp_init_attr_ex {
            qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd, xrcd,
            create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf,
            rx_hash_conf.rx_hash_fields_mask, source_qpn, send_ops_flags,
        }
        struct ibv_qp_open_attr { comp_mask, qp_num, xrcd, qp_context, qp_type }
        struct ibv_qp_attr {
            qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num,
            qp_access_flags, cap, ah_attr, ah_attr.grh.dgid, ah_attr.grh.sgid_index,
            ah_attr.dlid, ah_attr.is_global, ah_attr.port_num, alt_ah_attr, alt_ah_attr.port_num,
            pkey_index, alt_pkey_index, en_sqd_async_notify, sq_draining, max_rd_atomic,
            max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry,
            alt_port_num, alt_timeout, rate_limit,
        }
        struct ibv_qp_rate_limit_attr { rate_limit, max_burst_sz, typical_pkt_sz, comp_mask }
        struct ibv_data_buf { addr, length }
        struct ibv_sge { addr, length, lkey }
        struct ibv_send_wr {
            wr_id, next, sg_list, num_sge, opcode, send_flags,
            imm => "imm_data",
            imm.imm_data => "imm_data",
            imm.invalidate_rkey => "invalidate_rkey",
            wr, wr.rdma, wr.rdma.remote_addr, wr.rdma.rkey,
            wr.atomic, wr.atomic.remote_addr, wr.atomic.compare_add, wr.atomic.swap,
            wr.atomic.rkey,
            wr.ud, wr.ud.ah, wr.ud.remote_qpn, wr.ud.remote_qkey,
            qp_type, qp_type.xrc, qp_type.xrc.remote_srqn,
            // The anonymous union is as large as its larger member, bind_mw.
            bind_mw_tso => "bind_mw",
            bind_mw_tso.bind_mw => "bind_mw",
            bind_mw_tso.bind_mw.mw => "bind_mw.mw",
            bind_mw_tso.bind_mw.rkey => "bind_mw.rkey",
            bind_mw_tso.bind_mw.bind_info => "bind_mw.bind_info",
            bind_mw_tso.bind_mw.bind_info.mr => "bind_mw.bind_info.mr",
            bind_mw_tso.bind_mw.bind_info.addr => "bind_mw.bind_info.addr",
            bind_mw_tso.bind_mw.bind_info.length => "bind_mw.bind_info.length",
            bind_mw_tso.bind_mw.bind_info.mw_access_flags => "bind_mw.bind_info.mw_access_flags",
            bind_mw_tso.tso => "tso",
            bind_mw_tso.tso.hdr => "tso.hdr",
            bind_mw_tso.tso.hdr_sz => "tso.hdr_sz",
            bind_mw_tso.tso.mss => "tso.mss",
        }
        struct ibv_recv_wr { wr_id, next, sg_list, num_sge }
        struct ibv_ops_wr {
            wr_id, next, opcode, flags, tm, tm.unexpected_cnt, tm.handle, tm.add,
            tm.add.recv_wr_id, tm.add.sg_list, tm.add.num_sge, tm.add.tag, tm.add.mask,
        }
        struct ibv_mw_bind { wr_id, send_flags, bind_info, bind_info.mr, bind_info.mw_access_flags }
        struct ibv_srq {
            context, srq_context, pd, handle, mutex, cond, events_completed,
        }
        struct ibv_wq {
            context, wq_context, pd, cq, wq_num, handle, state, wq_type, post_recv, mutex, cond,
            events_completed, comp_mask,
        }
        struct ibv_qp {
            context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type,
            mutex, cond, events_completed,
        }
        struct ibv_qp_ex {
            qp_base, qp_base.qp_num, qp_base.events_completed, comp_mask, wr_id, wr_flags,
            wr_atomic_cmp_swp, wr_atomic_fetch_add, wr_bind_mw, wr_local_inv, wr_rdma_read,
            wr_rdma_write, wr_rdma_write_imm, wr_send, wr_send_imm, wr_send_inv, wr_send_tso,
            wr_set_ud_addr, wr_set_xrc_srqn, wr_set_inline_data, wr_set_inline_data_list,
            wr_set_sge, wr_set_sge_list, wr_start, wr_complete, wr_abort, wr_atomic_write,
        }
        struct ibv_ece { vendor_id, options, comp_mask }
        struct ibv_comp_channel { context, fd, refcnt }
        struct ibv_cq {
            context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed,
        }
        struct ibv_poll_cq_attr { comp_mask }
        struct ibv_wc_tm_info { tag, r#priv }
        struct ibv_cq_ex {
            context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed, comp_mask, status, wr_id, start_poll, next_poll, end_poll,
            read_opcode, read_vendor_err, read_byte_len, read_imm_data, read_qp_num,
            read_src_qp, read_wc_flags, read_slid, read_sl, read_dlid_path_bits,
            read_completion_ts, read_cvlan, read_flow_tag, read_tm_info,
            read_completion_wallclock_ns,
        }
        struct ibv_moderate_cq { cq_count, cq_period }
        struct ibv_modify_cq_attr { attr_mask, moderate, moderate.cq_count, moderate.cq_period }
        struct ibv_ah { context, pd, handle }
        struct ibv_flow_attr { comp_mask, r#type, size, priority, num_of_specs, port, flags }
        struct ibv_flow { comp_mask, context, handle }
        struct ibv_flow_action { context }
        struct ibv_flow_action_esp_attr {
            esp_attr, keymat_proto, keymat_len, keymat_ptr, replay_proto, replay_len,
            replay_ptr, esp_encap, comp_mask, esn,
        }
        struct _ibv_device_ops { _dummy1, _dummy2 }
        struct ibv_device {
            _ops, _ops._dummy1, _ops._dummy2, node_type, transport_type, name, dev_name,
            dev_path, ibdev_path,
        }
        struct ibv_context_ops {
            _compat_query_device, _compat_query_port, _compat_alloc_pd, _compat_dealloc_pd,
            _compat_reg_mr, _compat_rereg_mr, _compat_dereg_mr, alloc_mw, bind_mw, dealloc_mw,
            _compat_create_cq, poll_cq, req_notify_cq, _compat_cq_event, _compat_resize_cq,
            _compat_destroy_cq, _compat_create_srq, _compat_modify_srq, _compat_query_srq,
            _compat_destroy_srq, post_srq_recv, _compat_create_qp, _compat_query_qp,
            _compat_modify_qp, _compat_destroy_qp, post_send, post_recv, _compat_create_ah,
            _compat_destroy_ah, _compat_attach_mcast, _compat_detach_mcast, _compat_async_event,
        }
        struct ibv_context {
            device, ops, ops._compat_query_device, ops._compat_query_port, ops.alloc_mw,
            ops.bind_mw, ops.dealloc_mw, ops.poll_cq, ops.req_notify_cq, ops.post_srq_recv,
            ops.post_send, ops.post_recv, ops._compat_async_event, cmd_fd, async_fd,
            num_comp_vectors, mutex, abi_compat,
        }
        struct ibv_cq_init_attr_ex {
            cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain,
        }
        struct ibv_parent_domain_init_attr { pd, td, comp_mask, alloc, free, pd_context }
        struct ibv_counters_init_attr { comp_mask }
        struct ibv_counters { context }
        struct ibv_counter_attach_attr { counter_desc, index, comp_mask }
        struct ibv_values_ex { comp_mask, raw_clock }
        struct verbs_context {
            query_port, advise_mr, alloc_null_mr, read_counters, attach_counters_point_flow,
            create_counters, destroy_counters, reg_dm_mr, alloc_dm, free_dm,
            modify_flow_action_esp, destroy_flow_action, create_flow_action_esp,
            modify_qp_rate_limit, alloc_parent_domain, dealloc_td, alloc_td, modify_cq,
            post_srq_ops, destroy_rwq_ind_table, create_rwq_ind_table, destroy_wq, modify_wq,
            create_wq, query_rt_values, create_cq_ex, r#priv, query_device_ex, ibv_destroy_flow,
            ABI_placeholder2, ibv_create_flow, ABI_placeholder1, open_qp, create_qp_ex,
            get_srq_num, create_srq_ex, open_xrcd, close_xrcd, _ABI_placeholder3, sz, context,
            context.ops.poll_cq, context.abi_compat,
        }
    }
}

/// Every constant of the `abi` module.
fn const_checks() -> Vec<Check> {
    const_table! {
        IBV_GID_TYPE_IB, IBV_GID_TYPE_ROCE_V1, IBV_GID_TYPE_ROCE_V2,
        IBV_NODE_UNKNOWN, IBV_NODE_CA, IBV_NODE_SWITCH, IBV_NODE_ROUTER, IBV_NODE_RNIC,
        IBV_NODE_USNIC, IBV_NODE_USNIC_UDP, IBV_NODE_UNSPECIFIED,
        IBV_TRANSPORT_UNKNOWN, IBV_TRANSPORT_IB, IBV_TRANSPORT_IWARP, IBV_TRANSPORT_USNIC,
        IBV_TRANSPORT_USNIC_UDP, IBV_TRANSPORT_UNSPECIFIED,
        IBV_DEVICE_RESIZE_MAX_WR, IBV_DEVICE_BAD_PKEY_CNTR, IBV_DEVICE_BAD_QKEY_CNTR,
        IBV_DEVICE_RAW_MULTI, IBV_DEVICE_AUTO_PATH_MIG, IBV_DEVICE_CHANGE_PHY_PORT,
        IBV_DEVICE_UD_AV_PORT_ENFORCE, IBV_DEVICE_CURR_QP_STATE_MOD, IBV_DEVICE_SHUTDOWN_PORT,
        IBV_DEVICE_INIT_TYPE, IBV_DEVICE_PORT_ACTIVE_EVENT, IBV_DEVICE_SYS_IMAGE_GUID,
        IBV_DEVICE_RC_RNR_NAK_GEN, IBV_DEVICE_SRQ_RESIZE, IBV_DEVICE_N_NOTIFY_CQ,
        IBV_DEVICE_MEM_WINDOW, IBV_DEVICE_UD_IP_CSUM, IBV_DEVICE_XRC,
        IBV_DEVICE_MEM_MGT_EXTENSIONS, IBV_DEVICE_MEM_WINDOW_TYPE_2A,
        IBV_DEVICE_MEM_WINDOW_TYPE_2B, IBV_DEVICE_RC_IP_CSUM, IBV_DEVICE_RAW_IP_CSUM,
        IBV_DEVICE_MANAGED_FLOW_STEERING, IBV_DEVICE_RAW_SCATTER_FCS,
        IBV_DEVICE_PCI_WRITE_END_PADDING,
        IBV_FORK_DISABLED, IBV_FORK_ENABLED, IBV_FORK_UNNEEDED,
        IBV_ATOMIC_NONE, IBV_ATOMIC_HCA, IBV_ATOMIC_GLOB,
        IBV_DM_MASK_HANDLE,
        IBV_ODP_SUPPORT_SEND, IBV_ODP_SUPPORT_RECV, IBV_ODP_SUPPORT_WRITE, IBV_ODP_SUPPORT_READ,
        IBV_ODP_SUPPORT_ATOMIC, IBV_ODP_SUPPORT_SRQ_RECV, IBV_ODP_SUPPORT,
        IBV_ODP_SUPPORT_IMPLICIT,
        IBV_RX_HASH_FUNC_TOEPLITZ, IBV_RX_HASH_SRC_IPV4, IBV_RX_HASH_DST_IPV4,
        IBV_RX_HASH_SRC_IPV6, IBV_RX_HASH_DST_IPV6, IBV_RX_HASH_SRC_PORT_TCP,
        IBV_RX_HASH_DST_PORT_TCP, IBV_RX_HASH_SRC_PORT_UDP, IBV_RX_HASH_DST_PORT_UDP,
        IBV_RX_HASH_IPSEC_SPI, IBV_RX_HASH_INNER,
        IBV_RAW_PACKET_CAP_CVLAN_STRIPPING, IBV_RAW_PACKET_CAP_SCATTER_FCS,
        IBV_RAW_PACKET_CAP_IP_CSUM, IBV_RAW_PACKET_CAP_DELAY_DROP,
        IBV_TM_CAP_RC,
        IBV_PCI_ATOMIC_OPERATION_4_BYTE_SIZE_SUP, IBV_PCI_ATOMIC_OPERATION_8_BYTE_SIZE_SUP,
        IBV_PCI_ATOMIC_OPERATION_16_BYTE_SIZE_SUP,
        IBV_MTU_256, IBV_MTU_512, IBV_MTU_1024, IBV_MTU_2048, IBV_MTU_4096,
        IBV_PORT_NOP, IBV_PORT_DOWN, IBV_PORT_INIT, IBV_PORT_ARMED, IBV_PORT_ACTIVE,
        IBV_PORT_ACTIVE_DEFER,
        IBV_LINK_LAYER_UNSPECIFIED, IBV_LINK_LAYER_INFINIBAND, IBV_LINK_LAYER_ETHERNET,
        IBV_PORT_SM, IBV_PORT_NOTICE_SUP, IBV_PORT_TRAP_SUP, IBV_PORT_OPT_IPD_SUP,
        IBV_PORT_AUTO_MIGR_SUP, IBV_PORT_SL_MAP_SUP, IBV_PORT_MKEY_NVRAM, IBV_PORT_PKEY_NVRAM,
        IBV_PORT_LED_INFO_SUP, IBV_PORT_SYS_IMAGE_GUID_SUP, IBV_PORT_PKEY_SW_EXT_PORT_TRAP_SUP,
        IBV_PORT_EXTENDED_SPEEDS_SUP, IBV_PORT_CAP_MASK2_SUP, IBV_PORT_CM_SUP,
        IBV_PORT_SNMP_TUNNEL_SUP, IBV_PORT_REINIT_SUP, IBV_PORT_DEVICE_MGMT_SUP,
        IBV_PORT_VENDOR_CLASS_SUP, IBV_PORT_DR_NOTICE_SUP, IBV_PORT_CAP_MASK_NOTICE_SUP,
        IBV_PORT_BOOT_MGMT_SUP, IBV_PORT_LINK_LATENCY_SUP, IBV_PORT_CLIENT_REG_SUP,
        IBV_PORT_IP_BASED_GIDS,
        IBV_PORT_SET_NODE_DESC_SUP, IBV_PORT_INFO_EXT_SUP, IBV_PORT_VIRT_SUP,
        IBV_PORT_SWITCH_PORT_STATE_TABLE_SUP, IBV_PORT_LINK_WIDTH_2X_SUP,
        IBV_PORT_LINK_SPEED_HDR_SUP, IBV_PORT_LINK_SPEED_NDR_SUP,
        IBV_EVENT_CQ_ERR, IBV_EVENT_QP_FATAL, IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR,
        IBV_EVENT_COMM_EST, IBV_EVENT_SQ_DRAINED, IBV_EVENT_PATH_MIG, IBV_EVENT_PATH_MIG_ERR,
        IBV_EVENT_DEVICE_FATAL, IBV_EVENT_PORT_ACTIVE, IBV_EVENT_PORT_ERR,
        IBV_EVENT_LID_CHANGE, IBV_EVENT_PKEY_CHANGE, IBV_EVENT_SM_CHANGE, IBV_EVENT_SRQ_ERR,
        IBV_EVENT_SRQ_LIMIT_REACHED, IBV_EVENT_QP_LAST_WQE_REACHED,
        IBV_EVENT_CLIENT_REREGISTER, IBV_EVENT_GID_CHANGE, IBV_EVENT_WQ_FATAL,
        IBV_WC_SUCCESS, IBV_WC_LOC_LEN_ERR, IBV_WC_LOC_QP_OP_ERR, IBV_WC_LOC_EEC_OP_ERR,
        IBV_WC_LOC_PROT_ERR, IBV_WC_WR_FLUSH_ERR, IBV_WC_MW_BIND_ERR, IBV_WC_BAD_RESP_ERR,
        IBV_WC_LOC_ACCESS_ERR, IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_ACCESS_ERR,
        IBV_WC_REM_OP_ERR, IBV_WC_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR,
        IBV_WC_LOC_RDD_VIOL_ERR, IBV_WC_REM_INV_RD_REQ_ERR, IBV_WC_REM_ABORT_ERR,
        IBV_WC_INV_EECN_ERR, IBV_WC_INV_EEC_STATE_ERR, IBV_WC_FATAL_ERR,
        IBV_WC_RESP_TIMEOUT_ERR, IBV_WC_GENERAL_ERR, IBV_WC_TM_ERR, IBV_WC_TM_RNDV_INCOMPLETE,
        IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_COMP_SWAP, IBV_WC_FETCH_ADD,
        IBV_WC_BIND_MW, IBV_WC_LOCAL_INV, IBV_WC_TSO, IBV_WC_ATOMIC_WRITE, IBV_WC_RECV,
        IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_TM_ADD, IBV_WC_TM_DEL, IBV_WC_TM_SYNC,
        IBV_WC_TM_RECV, IBV_WC_TM_NO_TAG, IBV_WC_DRIVER1, IBV_WC_DRIVER2, IBV_WC_DRIVER3,
        IBV_WC_IP_CSUM_OK_SHIFT,
        IBV_WC_EX_WITH_BYTE_LEN, IBV_WC_EX_WITH_IMM, IBV_WC_EX_WITH_QP_NUM,
        IBV_WC_EX_WITH_SRC_QP, IBV_WC_EX_WITH_SLID, IBV_WC_EX_WITH_SL,
        IBV_WC_EX_WITH_DLID_PATH_BITS, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
        IBV_WC_EX_WITH_CVLAN, IBV_WC_EX_WITH_FLOW_TAG, IBV_WC_EX_WITH_TM_INFO,
        IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK, IBV_WC_STANDARD_FLAGS,
        IBV_CREATE_CQ_SUP_WC_FLAGS,
        IBV_WC_GRH, IBV_WC_WITH_IMM, IBV_WC_IP_CSUM_OK, IBV_WC_WITH_INV, IBV_WC_TM_SYNC_REQ,
        IBV_WC_TM_MATCH, IBV_WC_TM_DATA_VALID,
        IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ,
        IBV_ACCESS_REMOTE_ATOMIC, IBV_ACCESS_MW_BIND, IBV_ACCESS_ZERO_BASED,
        IBV_ACCESS_ON_DEMAND, IBV_ACCESS_HUGETLB, IBV_ACCESS_RELAXED_ORDERING,
        IBV_ACCESS_OPTIONAL_FIRST, IBV_ACCESS_OPTIONAL_RANGE,
        IBV_XRCD_INIT_ATTR_FD, IBV_XRCD_INIT_ATTR_OFLAGS, IBV_XRCD_INIT_ATTR_RESERVED,
        IBV_REREG_MR_CHANGE_TRANSLATION, IBV_REREG_MR_CHANGE_PD, IBV_REREG_MR_CHANGE_ACCESS,
        IBV_REREG_MR_FLAGS_SUPPORTED,
        IBV_REREG_MR_ERR_INPUT, IBV_REREG_MR_ERR_DONT_FORK_NEW, IBV_REREG_MR_ERR_DO_FORK_OLD,
        IBV_REREG_MR_ERR_CMD, IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW,
        IBV_MW_TYPE_1, IBV_MW_TYPE_2,
        IBV_RATE_MAX, IBV_RATE_2_5_GBPS, IBV_RATE_5_GBPS, IBV_RATE_10_GBPS, IBV_RATE_20_GBPS,
        IBV_RATE_30_GBPS, IBV_RATE_40_GBPS, IBV_RATE_60_GBPS, IBV_RATE_80_GBPS,
        IBV_RATE_120_GBPS, IBV_RATE_14_GBPS, IBV_RATE_56_GBPS, IBV_RATE_112_GBPS,
        IBV_RATE_168_GBPS, IBV_RATE_25_GBPS, IBV_RATE_100_GBPS, IBV_RATE_200_GBPS,
        IBV_RATE_300_GBPS, IBV_RATE_28_GBPS, IBV_RATE_50_GBPS, IBV_RATE_400_GBPS,
        IBV_RATE_600_GBPS, IBV_RATE_800_GBPS, IBV_RATE_1200_GBPS,
        IBV_SRQ_MAX_WR, IBV_SRQ_LIMIT,
        IBV_SRQT_BASIC, IBV_SRQT_XRC, IBV_SRQT_TM,
        IBV_SRQ_INIT_ATTR_TYPE, IBV_SRQ_INIT_ATTR_PD, IBV_SRQ_INIT_ATTR_XRCD,
        IBV_SRQ_INIT_ATTR_CQ, IBV_SRQ_INIT_ATTR_TM, IBV_SRQ_INIT_ATTR_RESERVED,
        IBV_WQT_RQ, IBV_WQ_INIT_ATTR_FLAGS, IBV_WQ_INIT_ATTR_RESERVED,
        IBV_WQ_FLAGS_CVLAN_STRIPPING, IBV_WQ_FLAGS_SCATTER_FCS, IBV_WQ_FLAGS_DELAY_DROP,
        IBV_WQ_FLAGS_PCI_WRITE_END_PADDING, IBV_WQ_FLAGS_RESERVED,
        IBV_WQS_RESET, IBV_WQS_RDY, IBV_WQS_ERR, IBV_WQS_UNKNOWN,
        IBV_WQ_ATTR_STATE, IBV_WQ_ATTR_CURR_STATE, IBV_WQ_ATTR_FLAGS, IBV_WQ_ATTR_RESERVED,
        IBV_CREATE_IND_TABLE_RESERVED,
        IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_RAW_PACKET, IBV_QPT_XRC_SEND,
        IBV_QPT_XRC_RECV, IBV_QPT_DRIVER,
        IBV_QP_INIT_ATTR_PD, IBV_QP_INIT_ATTR_XRCD, IBV_QP_INIT_ATTR_CREATE_FLAGS,
        IBV_QP_INIT_ATTR_MAX_TSO_HEADER, IBV_QP_INIT_ATTR_IND_TABLE, IBV_QP_INIT_ATTR_RX_HASH,
        IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        IBV_QP_CREATE_BLOCK_SELF_MCAST_LB, IBV_QP_CREATE_SCATTER_FCS,
        IBV_QP_CREATE_CVLAN_STRIPPING, IBV_QP_CREATE_SOURCE_QPN,
        IBV_QP_CREATE_PCI_WRITE_END_PADDING,
        IBV_QP_EX_WITH_RDMA_WRITE, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, IBV_QP_EX_WITH_SEND,
        IBV_QP_EX_WITH_SEND_WITH_IMM, IBV_QP_EX_WITH_RDMA_READ,
        IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
        IBV_QP_EX_WITH_LOCAL_INV, IBV_QP_EX_WITH_BIND_MW, IBV_QP_EX_WITH_SEND_WITH_INV,
        IBV_QP_EX_WITH_TSO, IBV_QP_EX_WITH_ATOMIC_WRITE,
        IBV_QP_OPEN_ATTR_NUM, IBV_QP_OPEN_ATTR_XRCD, IBV_QP_OPEN_ATTR_CONTEXT,
        IBV_QP_OPEN_ATTR_TYPE, IBV_QP_OPEN_ATTR_RESERVED,
        IBV_QP_STATE, IBV_QP_CUR_STATE, IBV_QP_EN_SQD_ASYNC_NOTIFY, IBV_QP_ACCESS_FLAGS,
        IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_QKEY, IBV_QP_AV, IBV_QP_PATH_MTU,
        IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY, IBV_QP_RQ_PSN,
        IBV_QP_MAX_QP_RD_ATOMIC, IBV_QP_ALT_PATH, IBV_QP_MIN_RNR_TIMER, IBV_QP_SQ_PSN,
        IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_PATH_MIG_STATE, IBV_QP_CAP, IBV_QP_DEST_QPN,
        IBV_QP_RATE_LIMIT,
        IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_SQE,
        IBV_QPS_ERR, IBV_QPS_UNKNOWN,
        IBV_MIG_MIGRATED, IBV_MIG_REARM, IBV_MIG_ARMED,
        IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND, IBV_WR_SEND_WITH_IMM,
        IBV_WR_RDMA_READ, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD,
        IBV_WR_LOCAL_INV, IBV_WR_BIND_MW, IBV_WR_SEND_WITH_INV, IBV_WR_TSO, IBV_WR_DRIVER1,
        IBV_WR_ATOMIC_WRITE,
        IBV_SEND_FENCE, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED, IBV_SEND_INLINE,
        IBV_SEND_IP_CSUM,
        IBV_WR_TAG_ADD, IBV_WR_TAG_DEL, IBV_WR_TAG_SYNC, IBV_OPS_SIGNALED, IBV_OPS_TM_SYNC,
        IBV_CQ_ATTR_MODERATE, IBV_CQ_ATTR_RESERVED,
        IBV_FLOW_ATTR_FLAGS_DONT_TRAP, IBV_FLOW_ATTR_FLAGS_EGRESS,
        IBV_FLOW_ATTR_NORMAL, IBV_FLOW_ATTR_ALL_DEFAULT, IBV_FLOW_ATTR_MC_DEFAULT,
        IBV_FLOW_ATTR_SNIFFER,
        IBV_FLOW_SPEC_ETH, IBV_FLOW_SPEC_IPV4, IBV_FLOW_SPEC_IPV6, IBV_FLOW_SPEC_IPV4_EXT,
        IBV_FLOW_SPEC_ESP, IBV_FLOW_SPEC_TCP, IBV_FLOW_SPEC_UDP, IBV_FLOW_SPEC_VXLAN_TUNNEL,
        IBV_FLOW_SPEC_GRE, IBV_FLOW_SPEC_MPLS, IBV_FLOW_SPEC_INNER, IBV_FLOW_SPEC_ACTION_TAG,
        IBV_FLOW_SPEC_ACTION_DROP, IBV_FLOW_SPEC_ACTION_HANDLE, IBV_FLOW_SPEC_ACTION_COUNT,
        IBV_FLOW_ACTION_ESP_MASK_ESN, IBV_FLOW_ACTION_ESP_KEYMAT_AES_GCM,
        IBV_FLOW_ACTION_ESP_REPLAY_NONE, IBV_FLOW_ACTION_ESP_REPLAY_BMP,
        IBV_CQ_INIT_ATTR_MASK_FLAGS, IBV_CQ_INIT_ATTR_MASK_PD,
        IBV_CREATE_CQ_ATTR_SINGLE_THREADED, IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN,
        IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS, IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
        IBV_COUNTER_PACKETS, IBV_COUNTER_BYTES, IBV_READ_COUNTERS_ATTR_PREFER_CACHED,
        IBV_VALUES_MASK_RAW_CLOCK, IBV_VALUES_MASK_RESERVED,
        IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
        IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, IBV_ADVISE_MR_FLAG_FLUSH,
        IBV_QPF_GRH_REQUIRED,
        IB_ROCE_UDP_ENCAP_VALID_PORT_MIN, IB_ROCE_UDP_ENCAP_VALID_PORT_MAX,
        IB_GRH_FLOWLABEL_MASK,
    }
}

/// Constants of type `usize` and the extended-ABI marker pointer.
fn other_checks() -> Vec<Check> {
    vec![
        Check {
            what: "IBV_SYSFS_NAME_MAX".into(),
            c_expr: "IBV_SYSFS_NAME_MAX".into(),
            rust: i(IBV_SYSFS_NAME_MAX),
        },
        Check {
            what: "IBV_SYSFS_PATH_MAX".into(),
            c_expr: "IBV_SYSFS_PATH_MAX".into(),
            rust: i(IBV_SYSFS_PATH_MAX),
        },
        Check {
            what: "ETHERNET_LL_SIZE".into(),
            c_expr: "ETHERNET_LL_SIZE".into(),
            rust: i(ETHERNET_LL_SIZE),
        },
        Check {
            what: "__VERBS_ABI_IS_EXTENDED".into(),
            c_expr: "(uintptr_t)__VERBS_ABI_IS_EXTENDED".into(),
            // The C side prints the uintptr_t through `long long`: -1.
            rust: __VERBS_ABI_IS_EXTENDED as usize as i64,
        },
    ]
}

/// `verbs_context`'s slots relative to its `context` member, the way the
/// inline wrappers reach them (`container_of` from the `ibv_context *`).
fn verbs_context_relative_checks(layout: &[Check]) -> Vec<Check> {
    let prefix = "offsetof(struct verbs_context, ";
    let context = layout
        .iter()
        .find(|c| c.what == "offsetof(struct verbs_context, context)")
        .expect("verbs_context.context is in the table")
        .rust;
    layout
        .iter()
        .filter_map(|c| {
            let field = c.what.strip_prefix(prefix)?.strip_suffix(')')?;
            Some(Check {
                what: format!("{} - offsetof(struct verbs_context, context)", c.what),
                c_expr: format!(
                    "(long long)offsetof(struct verbs_context, {field}) \
                     - (long long)offsetof(struct verbs_context, context)"
                ),
                rust: c.rust - context,
            })
        })
        .collect()
}

fn all_checks() -> Vec<Check> {
    let mut checks = layout_checks();
    let relative = verbs_context_relative_checks(&checks);
    checks.extend(relative);
    checks.extend(const_checks());
    checks.extend(other_checks());
    checks
}

#[test]
fn layout_matches_verbs_h() {
    layout_harness::run(
        "rverbs-ibverbs-abi-layout",
        &["infiniband/verbs.h"],
        "libibverbs-dev",
        &all_checks(),
    );
}

/// The facts of shared/design/ABI.md, on the Rust side alone.
#[test]
fn abi_md_numbers() {
    let vctx_rel = |off: usize| i(off) - i(offset_of!(verbs_context, context));

    assert_eq!(size_of::<ibv_device>(), 664);
    assert_eq!(offset_of!(ibv_device, node_type), 16);
    assert_eq!(offset_of!(ibv_device, transport_type), 20);
    assert_eq!(offset_of!(ibv_device, name), 24);
    assert_eq!(offset_of!(ibv_device, dev_name), 88);
    assert_eq!(offset_of!(ibv_device, dev_path), 152);
    assert_eq!(offset_of!(ibv_device, ibdev_path), 408);

    assert_eq!(size_of::<ibv_context>(), 328);
    assert_eq!(size_of::<ibv_context_ops>(), 256);
    assert_eq!(offset_of!(ibv_context, ops), 8);
    assert_eq!(offset_of!(ibv_context, cmd_fd), 264);
    assert_eq!(offset_of!(ibv_context, async_fd), 268);
    assert_eq!(offset_of!(ibv_context, num_comp_vectors), 272);
    assert_eq!(offset_of!(ibv_context, mutex), 280);
    assert_eq!(size_of::<libc::pthread_mutex_t>(), 40);
    assert_eq!(offset_of!(ibv_context, abi_compat), 320);
    assert_eq!(offset_of!(ibv_context, ops._compat_query_device), 8);
    assert_eq!(offset_of!(ibv_context, ops._compat_query_port), 16);
    assert_eq!(offset_of!(ibv_context, ops.alloc_mw), 64);
    assert_eq!(offset_of!(ibv_context, ops.bind_mw), 72);
    assert_eq!(offset_of!(ibv_context, ops.dealloc_mw), 80);
    assert_eq!(offset_of!(ibv_context, ops.poll_cq), 96);
    assert_eq!(offset_of!(ibv_context, ops.req_notify_cq), 104);
    assert_eq!(offset_of!(ibv_context, ops.post_srq_recv), 168);
    assert_eq!(offset_of!(ibv_context, ops.post_send), 208);
    assert_eq!(offset_of!(ibv_context, ops.post_recv), 216);

    assert_eq!(size_of::<verbs_context>(), 648);
    assert_eq!(offset_of!(verbs_context, context), 320);
    assert_eq!(vctx_rel(offset_of!(verbs_context, query_port)), -320);
    assert_eq!(vctx_rel(offset_of!(verbs_context, query_device_ex)), -104);
    assert_eq!(vctx_rel(offset_of!(verbs_context, create_qp_ex)), -56);
    assert_eq!(vctx_rel(offset_of!(verbs_context, create_srq_ex)), -40);
    assert_eq!(vctx_rel(offset_of!(verbs_context, open_xrcd)), -32);
    assert_eq!(vctx_rel(offset_of!(verbs_context, close_xrcd)), -24);
    assert_eq!(vctx_rel(offset_of!(verbs_context, sz)), -8);

    assert_eq!(size_of::<ibv_pd>(), 16);
    assert_eq!(size_of::<ibv_mr>(), 48);
    assert_eq!(offset_of!(ibv_mr, pd), 8);
    assert_eq!(offset_of!(ibv_mr, addr), 16);
    assert_eq!(offset_of!(ibv_mr, length), 24);
    assert_eq!(offset_of!(ibv_mr, handle), 32);
    assert_eq!(offset_of!(ibv_mr, lkey), 36);
    assert_eq!(offset_of!(ibv_mr, rkey), 40);

    assert_eq!(size_of::<ibv_comp_channel>(), 16);
    assert_eq!(offset_of!(ibv_comp_channel, fd), 8);
    assert_eq!(offset_of!(ibv_comp_channel, refcnt), 12);

    assert_eq!(size_of::<ibv_cq>(), 128);
    assert_eq!(offset_of!(ibv_cq, channel), 8);
    assert_eq!(offset_of!(ibv_cq, cq_context), 16);
    assert_eq!(offset_of!(ibv_cq, handle), 24);
    assert_eq!(offset_of!(ibv_cq, cqe), 28);
    assert_eq!(offset_of!(ibv_cq, mutex), 32);
    assert_eq!(offset_of!(ibv_cq, cond), 72);
    assert_eq!(offset_of!(ibv_cq, comp_events_completed), 120);
    assert_eq!(offset_of!(ibv_cq, async_events_completed), 124);

    assert_eq!(size_of::<ibv_qp>(), 160);
    assert_eq!(offset_of!(ibv_qp, qp_context), 8);
    assert_eq!(offset_of!(ibv_qp, pd), 16);
    assert_eq!(offset_of!(ibv_qp, send_cq), 24);
    assert_eq!(offset_of!(ibv_qp, recv_cq), 32);
    assert_eq!(offset_of!(ibv_qp, srq), 40);
    assert_eq!(offset_of!(ibv_qp, handle), 48);
    assert_eq!(offset_of!(ibv_qp, qp_num), 52);
    assert_eq!(offset_of!(ibv_qp, state), 56);
    assert_eq!(offset_of!(ibv_qp, qp_type), 60);
    assert_eq!(offset_of!(ibv_qp, mutex), 64);
    assert_eq!(offset_of!(ibv_qp, cond), 104);
    assert_eq!(offset_of!(ibv_qp, events_completed), 152);

    assert_eq!(size_of::<ibv_qp_ex>(), 352);
    assert_eq!(size_of::<ibv_srq>(), 128);
    assert_eq!(size_of::<ibv_ah>(), 24);

    assert_eq!(size_of::<ibv_port_attr>(), 52);
    assert_eq!(offset_of!(ibv_port_attr, max_mtu), 4);
    assert_eq!(offset_of!(ibv_port_attr, active_mtu), 8);
    assert_eq!(offset_of!(ibv_port_attr, gid_tbl_len), 12);
    assert_eq!(offset_of!(ibv_port_attr, port_cap_flags), 16);
    assert_eq!(offset_of!(ibv_port_attr, max_msg_sz), 20);
    assert_eq!(offset_of!(ibv_port_attr, lid), 34);
    assert_eq!(offset_of!(ibv_port_attr, link_layer), 46);

    assert_eq!(size_of::<ibv_gid_entry>(), 32);
    assert_eq!(offset_of!(ibv_gid_entry, gid_index), 16);
    assert_eq!(offset_of!(ibv_gid_entry, port_num), 20);
    assert_eq!(offset_of!(ibv_gid_entry, gid_type), 24);
    assert_eq!(offset_of!(ibv_gid_entry, ndev_ifindex), 28);
}

/// `Default` is all-zero: NULL pointers and `None` slots.
#[test]
fn default_is_zeroed() {
    let vctx = verbs_context::default();
    assert!(vctx.query_port.is_none() && vctx.close_xrcd.is_none());
    assert!(vctx.context.device.is_null() && vctx.context.ops.post_send.is_none());
    assert_eq!(vctx.sz, 0);
    let wr = ibv_send_wr::default();
    assert!(wr.next.is_null());
    // SAFETY: every member of the union is a plain integer/pointer struct;
    // reading the all-zero bytes as `rdma` is valid.
    assert_eq!(unsafe { wr.wr.rdma.rkey }, 0);
}
