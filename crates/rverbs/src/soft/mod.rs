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
pub mod config;
pub(crate) mod context;
pub(crate) mod cq;
pub mod device;
pub(crate) mod keymap;
pub(crate) mod link;
pub(crate) mod memory;
pub mod net;
pub(crate) mod notify;
pub(crate) mod pd;
pub(crate) mod qp;
pub(crate) mod srq;
pub(crate) mod sys;
pub(crate) mod transport;
