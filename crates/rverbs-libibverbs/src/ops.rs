//! The function pointers a context hands C, set in one place: the
//! `verbs_context` slots (`query_port`, `query_device_ex`, `create_qp_ex`,
//! `create_cq_ex`, `close_xrcd`) and the `ibv_context_ops` that verbs.h's
//! inline wrappers call through (`poll_cq`, `req_notify_cq`, `post_send`,
//! `post_recv`, `post_srq_recv`, `alloc_mw`, `dealloc_mw`, `bind_mw`, and the two `_compat_query_*` slots
//! rdma-core fills). The functions themselves live with their objects; the
//! tables of single objects (an `ibv_cq_ex`'s polling functions, an
//! `ibv_qp_ex`'s `wr_*`) are set by `cq.rs` and `qp_ex.rs` when such an
//! object is made.

use std::ffi::c_int;

use rverbs_ibverbs_abi::abi::*;

use crate::{cq, mw, qp, query, srq};

/// Sets the function pointers of a context being opened.
pub(crate) fn fill(vctx: &mut verbs_context) {
    vctx.query_port = Some(query::verbs_query_port);
    vctx.query_device_ex = Some(query::query_device_ex);
    vctx.create_qp_ex = Some(qp::create_qp_ex);
    vctx.create_cq_ex = Some(cq::create_cq_ex);
    // The inline ibv_close_xrcd calls through without a NULL check; no XRC
    // domain can exist (open_xrcd is NULL), so it only answers EOPNOTSUPP.
    vctx.close_xrcd = Some(close_xrcd);
    let ops = &mut vctx.context.ops;
    ops._compat_query_device = Some(query::ibv_query_device);
    // SAFETY: only the pointer's type changes: _compat_query_port is called
    // with a struct ibv_port_attr (verbs.h's compat type is an incomplete
    // struct standing for it).
    ops._compat_query_port = Some(unsafe {
        std::mem::transmute::<
            unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
            unsafe extern "C" fn(*mut ibv_context, u8, *mut _compat_ibv_port_attr) -> c_int,
        >(query::ibv_query_port)
    });
    ops.poll_cq = Some(cq::poll_cq);
    ops.req_notify_cq = Some(cq::req_notify_cq);
    ops.post_send = Some(qp::post_send);
    ops.post_recv = Some(qp::post_recv);
    ops.post_srq_recv = Some(srq::post_srq_recv);
    // verbs.h's inline ibv_alloc_mw answers EOPNOTSUPP when alloc_mw is NULL.
    ops.alloc_mw = Some(mw::alloc_mw);
    ops.dealloc_mw = Some(mw::dealloc_mw);
    ops.bind_mw = Some(mw::bind_mw);
}

unsafe extern "C" fn close_xrcd(_xrcd: *mut ibv_xrcd) -> c_int {
    libc::EOPNOTSUPP
}
