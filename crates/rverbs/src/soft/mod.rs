//! The software RoCE device: the engine under the verbs.
//!
//! Each module owns one part of the device — configuration, the device and
//! its list, contexts, completion channels, CQs, PDs, registered memory, and
//! the pollable event queues. The public handles in `crate::verbs` wrap
//! these cores and add libibverbs' verb semantics (EBUSY rules, destroy
//! paths). The transport (queue pairs) plugs in here: it pushes into
//! `cq::CqCore`, posts to the context's async queue, and checks every
//! local and remote access through `memory::MrTable`.

pub(crate) mod channel;
pub(crate) mod config;
pub(crate) mod context;
pub(crate) mod counters;
pub(crate) mod cq;
pub(crate) mod device;
pub(crate) mod engine;
pub(crate) mod keymap;
pub(crate) mod link;
pub(crate) mod memory;
pub(crate) mod notify;
pub(crate) mod pd;
pub(crate) mod qp;
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
