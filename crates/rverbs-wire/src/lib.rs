//! RoCEv2 on the wire, as plain data: no I/O, no `unsafe`, no allocation on
//! the parse path.
//!
//! This crate owns everything about the bytes rverbs puts on the network and
//! accepts from it. Today it holds the 24-bit packet sequence number
//! arithmetic ([`Psn`]) the transport is built on; the header views, the
//! opcode table and the ICRC come with the wire-format issue.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod psn;

pub use psn::Psn;
