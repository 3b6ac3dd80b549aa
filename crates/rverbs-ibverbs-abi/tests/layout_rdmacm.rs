//! Checks `rverbs_ibverbs_abi::abi::rdmacm` against the real
//! `<rdma/rdma_cma.h>` (with `<infiniband/sa.h>`, which it includes, and
//! `<rdma/rsocket.h>` for `SOL_RDMA` and the rsocket options).
//!
//! As `tests/layout.rs` does for verbs.h (the same `layout_harness`): the
//! table below lists every type of the module with every field path (the
//! members of the anonymous unions, nested structs and the `param` union
//! included) and every constant; the harness prints each type's `sizeof` and
//! `_Alignof`, each field's `offsetof` and `sizeof`, and each constant's
//! value from a C program compiled with `cc`, and compares every number
//! with Rust's. Without `cc` or the headers (package librdmacm-dev) the test
//! is skipped with a message, unless `CI` is set: then it fails.

#[macro_use]
mod layout_harness;

use std::mem::{align_of, offset_of, size_of};

use layout_harness::Check;
use rverbs_ibverbs_abi::abi::rdmacm::*;

/// Every type of the `rdmacm` module with every field path.
fn layout_checks() -> Vec<Check> {
    layout_table! {
        struct rdma_ib_addr { sgid, dgid, pkey }
        struct rdma_addr {
            // The anonymous union is as large as its largest member.
            src => "src_storage",
            src.src_addr => "src_addr",
            src.src_addr.sa_family => "src_addr.sa_family",
            src.src_sin => "src_sin",
            src.src_sin.sin_port => "src_sin.sin_port",
            src.src_sin.sin_addr => "src_sin.sin_addr",
            src.src_sin6 => "src_sin6",
            src.src_sin6.sin6_port => "src_sin6.sin6_port",
            src.src_sin6.sin6_addr => "src_sin6.sin6_addr",
            src.src_sin6.sin6_scope_id => "src_sin6.sin6_scope_id",
            src.src_storage => "src_storage",
            src.src_storage.ss_family => "src_storage.ss_family",
            dst => "dst_storage",
            dst.dst_addr => "dst_addr",
            dst.dst_addr.sa_family => "dst_addr.sa_family",
            dst.dst_sin => "dst_sin",
            dst.dst_sin.sin_port => "dst_sin.sin_port",
            dst.dst_sin.sin_addr => "dst_sin.sin_addr",
            dst.dst_sin6 => "dst_sin6",
            dst.dst_sin6.sin6_port => "dst_sin6.sin6_port",
            dst.dst_sin6.sin6_addr => "dst_sin6.sin6_addr",
            dst.dst_sin6.sin6_scope_id => "dst_sin6.sin6_scope_id",
            dst.dst_storage => "dst_storage",
            dst.dst_storage.ss_family => "dst_storage.ss_family",
            addr, addr.ibaddr, addr.ibaddr.sgid, addr.ibaddr.dgid, addr.ibaddr.pkey,
        }
        struct rdma_route {
            addr, addr.dst => "addr.dst_storage", addr.addr.ibaddr.pkey, path_rec, num_paths,
        }
        struct rdma_event_channel { fd }
        struct rdma_cm_id {
            verbs, channel, context, qp, route, route.addr, route.addr.src => "route.addr.src_storage",
            route.addr.dst => "route.addr.dst_storage", route.addr.addr.ibaddr.sgid,
            route.path_rec, route.num_paths, ps, port_num, event, send_cq_channel, send_cq,
            recv_cq_channel, recv_cq, srq, pd, qp_type,
        }
        struct rdma_conn_param {
            private_data, private_data_len, responder_resources, initiator_depth, flow_control,
            retry_count, rnr_retry_count, srq, qp_num,
        }
        struct rdma_ud_param {
            private_data, private_data_len, ah_attr, ah_attr.grh.dgid, ah_attr.port_num, qp_num,
            qkey,
        }
        struct rdma_cm_event {
            id, listen_id, event, status, param, param.conn, param.conn.private_data,
            param.conn.private_data_len, param.conn.responder_resources,
            param.conn.initiator_depth, param.conn.flow_control, param.conn.retry_count,
            param.conn.rnr_retry_count, param.conn.srq, param.conn.qp_num, param.ud,
            param.ud.private_data, param.ud.private_data_len, param.ud.ah_attr,
            param.ud.qp_num, param.ud.qkey,
        }
        struct rdma_addrinfo {
            ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len, ai_src_addr,
            ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len, ai_route,
            ai_connect_len, ai_connect, ai_next,
        }
        struct rdma_cm_join_mc_attr_ex { comp_mask, join_flags, addr }
        struct ibv_sa_path_rec {
            dgid, sgid, dlid, slid, raw_traffic, flow_label, hop_limit, traffic_class,
            reversible, numb_path, pkey, sl, mtu_selector, mtu, rate_selector, rate,
            packet_life_time_selector, packet_life_time, preference,
        }
        struct ibv_path_record {
            service_id, dgid, sgid, dlid, slid, flowlabel_hoplimit, tclass, reversible_numpath,
            pkey, qosclass_sl, mtu, rate, packetlifetime, preference, reserved,
        }
        struct ibv_path_data { flags, reserved, path, path.pkey }
    }
}

/// The Rust types of the unions C leaves unnamed (or names only as a
/// member): their size and alignment against a C union of the same members.
fn union_checks() -> Vec<Check> {
    let union = |what: &str, c_union: &str, size: usize, align: usize| {
        [
            Check {
                what: format!("sizeof({what})"),
                c_expr: format!("sizeof(union {{ {c_union} }})"),
                rust: layout_harness::i(size),
            },
            Check {
                what: format!("_Alignof({what})"),
                c_expr: format!("_Alignof(union {{ {c_union} }})"),
                rust: layout_harness::i(align),
            },
        ]
    };
    let sockaddrs = "struct sockaddr a; struct sockaddr_in b; struct sockaddr_in6 c; \
                     struct sockaddr_storage d;";
    [
        union(
            "rdma_addr_src",
            sockaddrs,
            size_of::<rdma_addr_src>(),
            align_of::<rdma_addr_src>(),
        ),
        union(
            "rdma_addr_dst",
            sockaddrs,
            size_of::<rdma_addr_dst>(),
            align_of::<rdma_addr_dst>(),
        ),
        union(
            "rdma_addr_addr",
            "struct rdma_ib_addr ibaddr;",
            size_of::<rdma_addr_addr>(),
            align_of::<rdma_addr_addr>(),
        ),
        union(
            "rdma_cm_event_param",
            "struct rdma_conn_param conn; struct rdma_ud_param ud;",
            size_of::<rdma_cm_event_param>(),
            align_of::<rdma_cm_event_param>(),
        ),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Every constant of the `rdmacm` module.
fn const_checks() -> Vec<Check> {
    let mut checks = const_table! {
        RDMA_CM_EVENT_ADDR_RESOLVED, RDMA_CM_EVENT_ADDR_ERROR, RDMA_CM_EVENT_ROUTE_RESOLVED,
        RDMA_CM_EVENT_ROUTE_ERROR, RDMA_CM_EVENT_CONNECT_REQUEST, RDMA_CM_EVENT_CONNECT_RESPONSE,
        RDMA_CM_EVENT_CONNECT_ERROR, RDMA_CM_EVENT_UNREACHABLE, RDMA_CM_EVENT_REJECTED,
        RDMA_CM_EVENT_ESTABLISHED, RDMA_CM_EVENT_DISCONNECTED, RDMA_CM_EVENT_DEVICE_REMOVAL,
        RDMA_CM_EVENT_MULTICAST_JOIN, RDMA_CM_EVENT_MULTICAST_ERROR,
        RDMA_CM_EVENT_ADDR_CHANGE, RDMA_CM_EVENT_TIMEWAIT_EXIT,
        RDMA_PS_IPOIB, RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IB,
        RDMA_IB_IP_PORT_MASK, RDMA_IB_IP_PS_TCP, RDMA_IB_IP_PS_UDP, RDMA_IB_PS_IB,
        RDMA_UDP_QKEY,
        RDMA_MAX_RESP_RES, RDMA_MAX_INIT_DEPTH,
        RAI_PASSIVE, RAI_NUMERICHOST, RAI_NOROUTE, RAI_FAMILY,
        RDMA_CM_JOIN_MC_ATTR_ADDRESS, RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
        RDMA_CM_JOIN_MC_ATTR_RESERVED,
        RDMA_MC_JOIN_FLAG_FULLMEMBER, RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
        RDMA_MC_JOIN_FLAG_RESERVED,
        RDMA_OPTION_ID, RDMA_OPTION_IB, RDMA_OPTION_ID_TOS, RDMA_OPTION_ID_REUSEADDR,
        RDMA_OPTION_ID_AFONLY, RDMA_OPTION_ID_ACK_TIMEOUT, RDMA_OPTION_IB_PATH,
        IBV_PATH_RECORD_REVERSIBLE,
        IBV_PATH_FLAG_GMP, IBV_PATH_FLAG_PRIMARY, IBV_PATH_FLAG_ALTERNATE,
        IBV_PATH_FLAG_OUTBOUND, IBV_PATH_FLAG_INBOUND, IBV_PATH_FLAG_INBOUND_REVERSE,
        IBV_PATH_FLAG_BIDIRECTIONAL,
        SOL_RDMA, RDMA_SQSIZE, RDMA_RQSIZE, RDMA_INLINE, RDMA_IOMAPSIZE, RDMA_ROUTE,
    };
    // Does not fit an i64 as a u64: compared bit for bit.
    checks.push(Check {
        what: "RDMA_IB_IP_PS_MASK".into(),
        c_expr: "(long long)RDMA_IB_IP_PS_MASK".into(),
        rust: RDMA_IB_IP_PS_MASK as i64,
    });
    checks
}

#[test]
fn layout_matches_rdma_cma_h() {
    let mut checks = layout_checks();
    checks.extend(union_checks());
    checks.extend(const_checks());
    layout_harness::run(
        "rverbs-ibverbs-abi-layout-rdmacm",
        &["rdma/rdma_cma.h", "rdma/rsocket.h"],
        "librdmacm-dev",
        &checks,
    );
}

/// Sizes worth knowing by heart, on the Rust side alone: an `rdma_cm_id`'s
/// route starts after four pointers and its `ps` after the route.
#[test]
fn rdma_cm_id_numbers() {
    assert_eq!(size_of::<rdma_addr>(), 128 + 128 + 40);
    assert_eq!(offset_of!(rdma_cm_id, route), 32);
    assert_eq!(offset_of!(rdma_cm_id, ps), 32 + size_of::<rdma_route>());
    assert_eq!(size_of::<rdma_cm_event>(), 80);
}

#[test]
fn default_is_zeroed() {
    let id = rdma_cm_id::default();
    assert!(id.verbs.is_null() && id.route.path_rec.is_null() && id.pd.is_null());
    assert_eq!(id.ps, 0);
    let event = rdma_cm_event::default();
    // SAFETY: every member of the union is plain integers and pointers;
    // reading the all-zero bytes as `conn` is valid.
    assert_eq!(unsafe { event.param.conn.qp_num }, 0);
}
