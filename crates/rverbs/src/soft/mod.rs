//! The software RoCE device under the verbs (private to the crate: what
//! users need of it is re-exported at the crate root).
//!
//! The object cores — configuration, the device and its list, contexts,
//! completion channels, CQs, PDs, QPs, SRQs, registered memory, the
//! pollable event queues — each own one part of the device; the public
//! handles in `crate::verbs` wrap them and add libibverbs' verb semantics
//! (EBUSY rules, destroy paths). Below them, `engine` is a device's network
//! engine (its socket, QP table and progress) and `transport` the sans-IO
//! state machines it drives; a QP's completions and events come up through
//! `engine::QpEvents`, which `qp::QpCore` implements, and every local and
//! remote access is checked through `memory::MrTable`. `cm` is the
//! connection manager's protocol core (sans-IO, like `transport`); `neigh`
//! resolves its destinations' neighbours (over `rtnl`, rtnetlink), as the
//! kernel's `rdma_resolve_addr` does.

pub(crate) mod channel;
pub(crate) mod cm;
pub(crate) mod config;
pub(crate) mod context;
pub(crate) mod counters;
pub(crate) mod cq;
pub(crate) mod device;
pub(crate) mod engine;
pub(crate) mod keymap;
pub(crate) mod link;
pub(crate) mod local;
pub(crate) mod mapping;
pub(crate) mod memory;
pub(crate) mod neigh;
pub(crate) mod notify;
pub(crate) mod pd;
pub(crate) mod qp;
pub(crate) mod rtnl;
pub(crate) mod srq;
pub(crate) mod sys;
pub(crate) mod transport;

use std::sync::atomic::{AtomicU32, Ordering};

/// How many objects use a resource — QPs a CQ or an SRQ; MRs, QPs, AHs and
/// SRQs a PD: its destroy verb is EBUSY while any do.
#[derive(Debug, Default)]
pub(crate) struct Users(AtomicU32);

impl Users {
    pub(crate) fn count(&self) -> u32 {
        self.0.load(Ordering::Acquire)
    }

    pub(crate) fn add(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn remove(&self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
