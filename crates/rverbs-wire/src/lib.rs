//! RoCEv2 on the wire, as plain data: no I/O, no `unsafe`.
//!
//! This crate owns everything about the bytes rverbs puts on the network and
//! accepts from it:
//! - zero-copy header views with getters and setters and checked
//!   constructors ([`Bth`], [`Reth`], [`Aeth`], [`AtomicEth`],
//!   [`AtomicAckEth`], [`ImmDt`], [`Ieth`], [`Deth`], [`Grh`]), each with a
//!   plain `…Repr` struct that parses from and emits into a view;
//! - the opcode table for RC, UC and UD, written once as data ([`Opcode`],
//!   [`OpcodeInfo`]);
//! - whole-packet parsing and emitting, checked against that table
//!   ([`PacketRepr`]);
//! - the invariant CRC over the IP/UDP pseudo-header ([`icrc`]);
//! - 24-bit PSN arithmetic ([`Psn`]);
//! - Management Datagrams ([`Mad`], [`MadRepr`], [`mad`]'s constants) and the
//!   Communication Manager's messages in them ([`cm`]: a view per message —
//!   [`CmReq`], [`CmRep`], [`CmRtu`], [`CmRej`], [`CmMra`], [`CmDreq`],
//!   [`CmDrep`], [`CmLap`], [`CmApr`], [`CmSidrReq`], [`CmSidrRep`] — and a
//!   `…Repr` for each one a connection needs, [`CmMadRepr`] for a whole CM
//!   MAD);
//! - the RDMA IP CM service rdma_cm speaks over them ([`ip_cm`]: service
//!   IDs of port spaces, the [`IpCmHdr`] at the start of a REQ's private
//!   data, the private-data room left to users).
//!
//! Parsing never panics, whatever the bytes: a malformed packet is an
//! [`Error`]. The shape follows smoltcp's `wire` module.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod macros;

pub mod aeth;
pub mod atomic;
pub mod bth;
mod bytes;
pub mod cm;
pub mod deth;
mod error;
pub mod grh;
pub mod icrc;
pub mod imm;
pub mod ip_cm;
pub mod mad;
pub mod opcode;
pub mod packet;
mod psn;
pub mod reth;

pub use aeth::{Aeth, AethRepr, NakCode, RnrTimer, Syndrome};
pub use atomic::{AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr};
pub use bth::{Bth, BthRepr};
pub use cm::{
    CmApr, CmDrep, CmDrepRepr, CmDreq, CmDreqRepr, CmLap, CmMadRepr, CmMessageRepr, CmMra,
    CmMraRepr, CmMsgRef, CmRej, CmRejRepr, CmRep, CmRepRepr, CmReq, CmReqPath, CmReqPathRepr,
    CmReqRepr, CmRtu, CmRtuRepr, CmSidrRep, CmSidrRepRepr, CmSidrReq, CmSidrReqRepr, RejReason,
    SidrStatus,
};
pub use deth::{Deth, DethRepr};
pub use error::{Error, Result};
pub use grh::{Grh, GrhRepr};
pub use imm::{Ieth, IethRepr, ImmDt, ImmDtRepr};
pub use ip_cm::{IpCmHdr, IpCmHdrRepr, RdmaPortSpace};
pub use mad::{Mad, MadRepr};
pub use opcode::{Headers, Opcode, OpcodeInfo, Operation, Position, Transport};
pub use packet::{icrc_field, PacketRepr};
pub use psn::Psn;
pub use reth::{Reth, RethRepr};
