//! Values C and rverbs spell differently, converted where more than one
//! module needs them: fixed-size C strings, GIDs, address vectors
//! (`ibv_ah_attr`), scatter/gather lists and memory window binds
//! (`ibv_mw_bind_info`).

use std::ffi::{c_char, c_int};

use smallvec::SmallVec;

use rverbs::{AccessFlags, AhAttr, Gid, MwBindInfo, Sge, WrOpcode};
use rverbs_ibverbs_abi::abi::*;

/// Copies `s` into a C char array (zeroed), cut short so that a NUL stays
/// at its end.
pub(crate) fn copy_str(dst: &mut [c_char], s: &str) {
    let room = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as c_char;
    }
}

/// The GID of a C `ibv_gid`.
pub(crate) fn gid_of(g: &ibv_gid) -> Gid {
    // SAFETY: every bit pattern of the union is a valid [u8; 16].
    Gid(unsafe { g.raw })
}

/// The address vector of a C `ibv_ah_attr`; `None` without a GRH.
pub(crate) fn ah_attr(a: &ibv_ah_attr) -> Option<AhAttr> {
    // RoCE routes every packet: an address without a GRH cannot be used.
    if a.is_global == 0 {
        return None;
    }
    Some(AhAttr {
        dgid: gid_of(&a.grh.dgid),
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label,
        sl: a.sl,
        port_num: a.port_num,
    })
}

/// The C `ibv_ah_attr` of an address vector (`is_global` set).
pub(crate) fn c_ah_attr(a: &AhAttr) -> ibv_ah_attr {
    let mut out = ibv_ah_attr::default();
    out.grh.dgid = ibv_gid { raw: *a.dgid.raw() };
    out.grh.sgid_index = a.sgid_index;
    out.grh.hop_limit = a.hop_limit;
    out.grh.traffic_class = a.traffic_class;
    out.grh.flow_label = a.flow_label;
    out.sl = a.sl;
    out.is_global = 1;
    out.port_num = a.port_num;
    out
}

/// A WR's scatter/gather list: a few entries without a heap allocation.
pub(crate) type SgeVec = SmallVec<[Sge; 4]>;

/// The SGE list of a C work request; `None` (nothing read) when `num_sge`
/// is negative or above `max` — the queue's `max_sge`, checked before the
/// array is touched, as the program's array may hold fewer — or when
/// `sg_list` is NULL with entries.
///
/// # Safety
/// `sg_list` must hold `num_sge` entries when `num_sge` is at most `max`
/// (or be anything when it is 0).
pub(crate) unsafe fn sges(sg_list: *const ibv_sge, num_sge: c_int, max: u32) -> Option<SgeVec> {
    let n = usize::try_from(num_sge).ok()?;
    if n == 0 {
        return Some(SgeVec::new());
    }
    if n > max as usize || sg_list.is_null() {
        return None;
    }
    // SAFETY: per the caller, sg_list holds num_sge entries.
    let list = unsafe { std::slice::from_raw_parts(sg_list, n) };
    Some(
        list.iter()
            .map(|s| Sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            })
            .collect(),
    )
}

/// What a C `ibv_mw_bind_info` binds; `None` (EINVAL) for unknown access
/// bits, or a NULL MR with a range (as libibverbs' `ibv_bind_mw` refuses).
/// A NULL MR with a zero length unbinds.
///
/// # Safety
/// `info.mr` must be NULL or a live MR from `ibv_reg_mr*`.
pub(crate) unsafe fn mw_bind_info(info: &ibv_mw_bind_info) -> Option<MwBindInfo> {
    let access = AccessFlags::from_bits(info.mw_access_flags)?;
    let mr_lkey = if info.mr.is_null() {
        if info.addr != 0 || info.length != 0 {
            return None;
        }
        0
    } else {
        // SAFETY: per the caller, a live MR; its lkey is read, not kept.
        unsafe { (*info.mr).lkey }
    };
    Some(MwBindInfo::new(mr_lkey, info.addr, info.length, access))
}

/// The operation of a bind of window `mw` (a C `ibv_mw`) under a key with
/// `rkey`'s tag: the window is named by its rkey, as providers pass it.
///
/// # Safety
/// `mw` must be NULL or a live window from `ibv_alloc_mw`; `info.mr` as
/// for [`mw_bind_info`].
pub(crate) unsafe fn bind_mw_op(
    mw: *mut ibv_mw,
    rkey: u32,
    info: &ibv_mw_bind_info,
) -> Option<WrOpcode> {
    if mw.is_null() {
        return None;
    }
    // SAFETY: per the caller.
    let info = unsafe { mw_bind_info(info) }?;
    // SAFETY: per the caller, a live window; its rkey is read, not kept.
    let mw_rkey = unsafe { (*mw).rkey };
    Some(WrOpcode::BindMw {
        mw_rkey,
        rkey,
        info,
    })
}
