//! The `rdma_*` calls of `<rdma/rdma_cma.h>` (all but `rdma_event_str`),
//! not implemented yet: each has its exact C prototype and fails with errno
//! ENOSYS (-1, or NULL for `rdma_create_event_channel` and
//! `rdma_get_devices`, 0 for the `__be16` ports); the `void` ones
//! (`rdma_destroy_*`, `rdma_free_devices`, `rdma_freeaddrinfo`) do nothing,
//! which is right while nothing can have been created. The connection
//! manager replaces these, one by one, on the rverbs crate's CM.

use std::ffi::{c_char, c_int, c_void};

use libc::sockaddr;
use rverbs_ibverbs_abi::abi::rdmacm::*;
use rverbs_ibverbs_abi::abi::{
    __be16, ibv_context, ibv_ece, ibv_event_type, ibv_pd, ibv_qp_attr, ibv_qp_init_attr,
    ibv_qp_init_attr_ex, ibv_srq_init_attr, ibv_srq_init_attr_ex,
};

not_yet! {
    // Event channels and events.
    fn rdma_create_event_channel() -> *mut rdma_event_channel;
    fn rdma_destroy_event_channel(channel: *mut rdma_event_channel);
    fn rdma_get_cm_event(
        channel: *mut rdma_event_channel,
        event: *mut *mut rdma_cm_event,
    ) -> c_int;
    fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int;

    // Ids and endpoints.
    fn rdma_create_id(
        channel: *mut rdma_event_channel,
        id: *mut *mut rdma_cm_id,
        context: *mut c_void,
        ps: rdma_port_space,
    ) -> c_int;
    fn rdma_create_ep(
        id: *mut *mut rdma_cm_id,
        res: *mut rdma_addrinfo,
        pd: *mut ibv_pd,
        qp_init_attr: *mut ibv_qp_init_attr,
    ) -> c_int;
    fn rdma_destroy_ep(id: *mut rdma_cm_id);
    fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int;
    fn rdma_migrate_id(
        id: *mut rdma_cm_id,
        channel: *mut rdma_event_channel,
    ) -> c_int;
    fn rdma_set_option(
        id: *mut rdma_cm_id,
        level: c_int,
        optname: c_int,
        optval: *mut c_void,
        optlen: usize,
    ) -> c_int;

    // Addresses and routes.
    fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int;
    fn rdma_resolve_addr(
        id: *mut rdma_cm_id,
        src_addr: *mut sockaddr,
        dst_addr: *mut sockaddr,
        timeout_ms: c_int,
    ) -> c_int;
    fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int;
    fn rdma_get_src_port(id: *mut rdma_cm_id) -> __be16;
    fn rdma_get_dst_port(id: *mut rdma_cm_id) -> __be16;
    fn rdma_getaddrinfo(
        node: *const c_char,
        service: *const c_char,
        hints: *const rdma_addrinfo,
        res: *mut *mut rdma_addrinfo,
    ) -> c_int;
    fn rdma_freeaddrinfo(res: *mut rdma_addrinfo);

    // Devices.
    fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context;
    fn rdma_free_devices(list: *mut *mut ibv_context);

    // QPs and SRQs on an id.
    fn rdma_create_qp(
        id: *mut rdma_cm_id,
        pd: *mut ibv_pd,
        qp_init_attr: *mut ibv_qp_init_attr,
    ) -> c_int;
    fn rdma_create_qp_ex(
        id: *mut rdma_cm_id,
        qp_init_attr: *mut ibv_qp_init_attr_ex,
    ) -> c_int;
    fn rdma_destroy_qp(id: *mut rdma_cm_id);
    fn rdma_create_srq(
        id: *mut rdma_cm_id,
        pd: *mut ibv_pd,
        attr: *mut ibv_srq_init_attr,
    ) -> c_int;
    fn rdma_create_srq_ex(
        id: *mut rdma_cm_id,
        attr: *mut ibv_srq_init_attr_ex,
    ) -> c_int;
    fn rdma_destroy_srq(id: *mut rdma_cm_id);
    fn rdma_init_qp_attr(
        id: *mut rdma_cm_id,
        qp_attr: *mut ibv_qp_attr,
        qp_attr_mask: *mut c_int,
    ) -> c_int;

    // Connections.
    fn rdma_connect(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int;
    fn rdma_establish(id: *mut rdma_cm_id) -> c_int;
    fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int;
    fn rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int;
    fn rdma_accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int;
    fn rdma_reject(
        id: *mut rdma_cm_id,
        private_data: *const c_void,
        private_data_len: u8,
    ) -> c_int;
    fn rdma_reject_ece(
        id: *mut rdma_cm_id,
        private_data: *const c_void,
        private_data_len: u8,
    ) -> c_int;
    fn rdma_notify(id: *mut rdma_cm_id, event: ibv_event_type) -> c_int;
    fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int;
    fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int;
    fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int;

    // Multicast.
    fn rdma_join_multicast(
        id: *mut rdma_cm_id,
        addr: *mut sockaddr,
        context: *mut c_void,
    ) -> c_int;
    fn rdma_join_multicast_ex(
        id: *mut rdma_cm_id,
        mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
        context: *mut c_void,
    ) -> c_int;
    fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int;
}
