//! The `rdma_*` calls of `<rdma/rdma_cma.h>` rverbs does not do yet: SRQs
//! made through an id and ECE (enhanced connection establishment). Each has its exact C prototype and fails with errno ENOSYS;
//! `rdma_destroy_srq` does nothing (no SRQ can have been made through an
//! id). The rest are in `id` (and `rdma_event_str` in `strings`).

use std::ffi::{c_int, c_void};

use rverbs_ibverbs_abi::abi::rdmacm::*;
use rverbs_ibverbs_abi::abi::{ibv_ece, ibv_pd, ibv_srq_init_attr, ibv_srq_init_attr_ex};

not_yet! {
    // SRQs on an id.
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

    // Connections.
    fn rdma_reject_ece(
        id: *mut rdma_cm_id,
        private_data: *const c_void,
        private_data_len: u8,
    ) -> c_int;
    fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int;
    fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int;

}
