//! Multicast through an id: `rdma_join_multicast`, `rdma_join_multicast_ex`
//! and `rdma_leave_multicast`, on `CmId::join_multicast`. As librdmacm
//! does, the id's QP (if it has one, and the join is not send-only) is
//! attached to the group, and MULTICAST_JOIN carries the join's context in
//! `param.ud.private_data`.

use std::ffi::{c_int, c_void};

use libc::sockaddr;
use rverbs_ibverbs_abi::abi::rdmacm::*;

use super::id::{id_qp, id_ref, socket_addr, status};
use crate::ffi::{guard, neg};

/// Joins `addr`'s group as a full member, or send-only.
///
/// # Safety
/// `id` must be null or a live id; `addr` null or a readable address.
unsafe fn join(
    id: *mut rdma_cm_id,
    addr: *mut sockaddr,
    context: *mut c_void,
    send_only: bool,
) -> c_int {
    // SAFETY: the caller's promise.
    let (Some(w), Some(group)) = (unsafe { id_ref(id) }, unsafe { socket_addr(addr) }) else {
        return neg(libc::EINVAL);
    };
    let group = group.ip();
    if w.joins.iter().any(|(g, _)| *g == group) {
        return neg(libc::EADDRINUSE);
    }
    w.joins.push((group, context as usize));
    let r = status(w.rust.join_multicast(group, id_qp(w), send_only));
    if r != 0 {
        w.joins.retain(|(g, _)| *g != group);
    }
    r
}

/// `rdma_join_multicast`.
pub(crate) unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut sockaddr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    guard(-1, || unsafe { join(id, addr, context, false) })
}

/// `rdma_join_multicast_ex`: the address and join flags of `mc_join_attr`
/// (full member, or send-only full member).
pub(crate) unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's attributes, or NULL.
        let Some(a) = (unsafe { mc_join_attr.as_ref() }) else {
            return neg(libc::EINVAL);
        };
        let needed = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
        if a.comp_mask & needed != needed || a.comp_mask & !needed != 0 {
            return neg(libc::EINVAL);
        }
        let send_only = match a.join_flags {
            RDMA_MC_JOIN_FLAG_FULLMEMBER => false,
            RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER => true,
            _ => return neg(libc::EINVAL),
        };
        // SAFETY: forwarded.
        unsafe { join(id, a.addr, context, send_only) }
    })
}

/// `rdma_leave_multicast`.
pub(crate) unsafe extern "C" fn rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut sockaddr,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's id and address, or NULL.
        let (Some(w), Some(group)) = (unsafe { id_ref(id) }, unsafe { socket_addr(addr) }) else {
            return neg(libc::EINVAL);
        };
        let group = group.ip();
        if !w.joins.iter().any(|(g, _)| *g == group) {
            return neg(libc::EADDRNOTAVAIL);
        }
        w.joins.retain(|(g, _)| *g != group);
        status(w.rust.leave_multicast(group, id_qp(w)))
    })
}
