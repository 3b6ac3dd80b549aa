//! The public verbs: one module per object, each a handle over its core in
//! [`crate::soft`].

pub(crate) mod ah;
pub(crate) mod async_event;
pub(crate) mod channel;
pub(crate) mod context;
pub(crate) mod cq;
pub(crate) mod device;
pub(crate) mod mr;
pub(crate) mod mw;
pub(crate) mod pd;
pub(crate) mod qp;
pub(crate) mod srq;

#[cfg(test)]
mod tests;
