//! The connection manager's messages as typed values (IBA vol. 1 §12.6):
//! one struct per message with the fields the protocol uses, and the
//! message's private data bounded by its wire room. No byte layout here: a
//! codec to the wire crate's MAD views turns these into packets.
//!
//! Field names follow the sender's view, as on the wire: a REQ's
//! `local_qpn` is the active side's QP, its `initiator_depth` the active
//! side's. Timeouts are the spec's 5-bit exponents, `4.096 µs × 2^t`.

use std::fmt;

use crate::attr::{Gid, Mtu};

/// Bytes of a fixed most length `N`, held inline (no allocation): a
/// message's private data, a REJ's additional rejection information, a
/// SIDR_REP's additional information.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct CmBytes<const N: usize> {
    len: u8,
    buf: [u8; N],
}

/// Private data longer than the message's room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooLong {
    /// The length given.
    pub(crate) len: usize,
    /// The most the message holds.
    pub(crate) max: usize,
}

impl<const N: usize> CmBytes<N> {
    /// The most bytes this holds.
    #[cfg(test)]
    pub(crate) const MAX: usize = N;

    /// No bytes.
    pub(crate) fn empty() -> Self {
        CmBytes {
            len: 0,
            buf: [0; N],
        }
    }

    /// A copy of `data`, if it fits.
    pub(crate) fn new(data: &[u8]) -> Result<Self, TooLong> {
        if data.len() > N || data.len() > usize::from(u8::MAX) {
            return Err(TooLong {
                len: data.len(),
                max: N,
            });
        }
        let mut buf = [0; N];
        buf[..data.len()].copy_from_slice(data);
        Ok(CmBytes {
            len: data.len() as u8,
            buf,
        })
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

impl<const N: usize> Default for CmBytes<N> {
    fn default() -> Self {
        Self::empty()
    }
}

impl<const N: usize> fmt::Debug for CmBytes<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02x?}", self.as_slice())
    }
}

/// Private data room of each message, in bytes (`enum ib_cm_data_size`).
pub(crate) const REQ_PRIVATE_DATA: usize = 92;
/// MRA private data room.
pub(crate) const MRA_PRIVATE_DATA: usize = 222;
/// REJ private data room.
pub(crate) const REJ_PRIVATE_DATA: usize = 148;
/// REP private data room.
pub(crate) const REP_PRIVATE_DATA: usize = 196;
/// RTU private data room.
pub(crate) const RTU_PRIVATE_DATA: usize = 224;
/// DREQ private data room.
pub(crate) const DREQ_PRIVATE_DATA: usize = 220;
/// DREP private data room.
pub(crate) const DREP_PRIVATE_DATA: usize = 224;
/// SIDR_REQ private data room.
pub(crate) const SIDR_REQ_PRIVATE_DATA: usize = 216;
/// SIDR_REP private data room.
pub(crate) const SIDR_REP_PRIVATE_DATA: usize = 136;
/// Room for a REJ's additional rejection information (ARI) and a
/// SIDR_REP's additional information.
pub(crate) const ADDITIONAL_INFO: usize = 72;

/// The transport a REQ asks for (its "Transport Service Type"). XRC and
/// RD are not offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmTransport {
    /// Reliable Connected.
    Rc,
    /// Unreliable Connected.
    Uc,
}

/// Which message a REJ rejects or an MRA acknowledges
/// ("Message REJected" / "Message MRAed": 0 REQ, 1 REP, 2 other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MsgResponse {
    /// The REQ.
    Req,
    /// The REP.
    Rep,
    /// Another message (a LAP, unused here).
    Other,
}

/// Why a REJ rejects, and a SIDR_REP's status: the wire crate's codes
/// (`enum ib_cm_rej_reason`, `enum ib_cm_sidr_status`), one list for the
/// agent and the codec.
pub(crate) use rverbs_wire::{RejReason, SidrStatus};

/// A REQ's primary path, from the sender's view ("local" = the active
/// side). On RoCE the GIDs are the ports' IP addresses (IPv4-mapped) and
/// the LIDs are unused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PathInfo {
    /// The active side's port GID.
    pub(crate) local_gid: Gid,
    /// The passive side's port GID.
    pub(crate) remote_gid: Gid,
    /// Flow label (20 bits).
    pub(crate) flow_label: u32,
    /// Traffic class.
    pub(crate) traffic_class: u8,
    /// Hop limit.
    pub(crate) hop_limit: u8,
    /// Service level (4 bits).
    pub(crate) sl: u8,
    /// Local ACK timeout exponent the QPs use on this path: the
    /// packet life time plus one, as the Linux CM encodes it.
    pub(crate) local_ack_timeout: u8,
}

/// REQ: the active side asks for a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Req {
    /// Transaction ID; REP, REJ, MRA and RTU echo it.
    pub(crate) tid: u64,
    /// The active side's communication ID (never 0).
    pub(crate) local_comm_id: u32,
    /// Service asked for.
    pub(crate) service_id: u64,
    /// The active side's CA GUID.
    pub(crate) local_ca_guid: u64,
    /// The active side's Q_Key (unused for RC/UC).
    pub(crate) local_qkey: u32,
    /// The active side's QPN (24 bits).
    pub(crate) local_qpn: u32,
    /// RDMA READ/atomic requests the active side will serve.
    pub(crate) responder_resources: u8,
    /// RDMA READ/atomic requests the active side will have outstanding.
    pub(crate) initiator_depth: u8,
    /// How long the active side expects the passive side to take to
    /// answer (exponent).
    pub(crate) remote_cm_response_timeout: u8,
    /// RC or UC.
    pub(crate) transport: CmTransport,
    /// End-to-end flow control.
    pub(crate) flow_control: bool,
    /// The PSN the active side's QP expects first (24 bits): the passive
    /// side sends from it (as the Linux CM uses it).
    pub(crate) starting_psn: u32,
    /// How long the active side takes to answer (exponent).
    pub(crate) local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub(crate) retry_count: u8,
    /// RNR retry count (3 bits; 7 = infinite).
    pub(crate) rnr_retry_count: u8,
    /// How many times the active side resends the REQ (4 bits).
    pub(crate) max_cm_retries: u8,
    /// Path MTU.
    pub(crate) path_mtu: Mtu,
    /// Partition key.
    pub(crate) pkey: u16,
    /// Whether the active side's QP receives through an SRQ.
    pub(crate) srq: bool,
    /// Primary path (alternate paths are not offered).
    pub(crate) primary: PathInfo,
    /// Private data.
    pub(crate) private_data: CmBytes<REQ_PRIVATE_DATA>,
}

/// MRA: "message receipt acknowledgement" — the answer will take longer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mra {
    /// The acknowledged message's transaction ID.
    pub(crate) tid: u64,
    /// The sender's communication ID.
    pub(crate) local_comm_id: u32,
    /// The receiver's communication ID.
    pub(crate) remote_comm_id: u32,
    /// Which message this acknowledges.
    pub(crate) message_mraed: MsgResponse,
    /// How long the sender needs (exponent).
    pub(crate) service_timeout: u8,
    /// Private data.
    pub(crate) private_data: CmBytes<MRA_PRIVATE_DATA>,
}

/// REJ: a connection refused or abandoned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rej {
    /// The rejected message's transaction ID.
    pub(crate) tid: u64,
    /// The sender's communication ID (0 if it had not made one known).
    pub(crate) local_comm_id: u32,
    /// The receiver's communication ID.
    pub(crate) remote_comm_id: u32,
    /// Which message this rejects.
    pub(crate) message_rejected: MsgResponse,
    /// Why.
    pub(crate) reason: RejReason,
    /// Additional rejection information (for a `Timeout`, the sender's CA
    /// GUID).
    pub(crate) ari: CmBytes<ADDITIONAL_INFO>,
    /// Private data.
    pub(crate) private_data: CmBytes<REJ_PRIVATE_DATA>,
}

/// REP: the passive side accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rep {
    /// The REQ's transaction ID.
    pub(crate) tid: u64,
    /// The passive side's communication ID.
    pub(crate) local_comm_id: u32,
    /// The active side's communication ID.
    pub(crate) remote_comm_id: u32,
    /// The passive side's Q_Key (unused for RC/UC).
    pub(crate) local_qkey: u32,
    /// The passive side's QPN.
    pub(crate) local_qpn: u32,
    /// The PSN the passive side's QP expects first: the active side
    /// sends from it.
    pub(crate) starting_psn: u32,
    /// RDMA READ/atomic requests the passive side will serve.
    pub(crate) responder_resources: u8,
    /// RDMA READ/atomic requests the passive side will have outstanding.
    pub(crate) initiator_depth: u8,
    /// The passive CA's ACK delay (exponent).
    pub(crate) target_ack_delay: u8,
    /// Whether an alternate path was accepted (never, here).
    pub(crate) failover_accepted: bool,
    /// End-to-end flow control.
    pub(crate) flow_control: bool,
    /// RNR retry count the active side should use (3 bits).
    pub(crate) rnr_retry_count: u8,
    /// Whether the passive side's QP receives through an SRQ.
    pub(crate) srq: bool,
    /// The passive side's CA GUID.
    pub(crate) local_ca_guid: u64,
    /// Private data.
    pub(crate) private_data: CmBytes<REP_PRIVATE_DATA>,
}

/// RTU: the active side is ready to use the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rtu {
    /// The REQ's transaction ID.
    pub(crate) tid: u64,
    /// The sender's communication ID.
    pub(crate) local_comm_id: u32,
    /// The receiver's communication ID.
    pub(crate) remote_comm_id: u32,
    /// Private data.
    pub(crate) private_data: CmBytes<RTU_PRIVATE_DATA>,
}

/// DREQ: disconnect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dreq {
    /// The sender's new transaction ID; the DREP echoes it.
    pub(crate) tid: u64,
    /// The sender's communication ID.
    pub(crate) local_comm_id: u32,
    /// The receiver's communication ID.
    pub(crate) remote_comm_id: u32,
    /// The receiver's QPN.
    pub(crate) remote_qpn: u32,
    /// Private data.
    pub(crate) private_data: CmBytes<DREQ_PRIVATE_DATA>,
}

/// DREP: disconnect acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Drep {
    /// The DREQ's transaction ID.
    pub(crate) tid: u64,
    /// The sender's communication ID.
    pub(crate) local_comm_id: u32,
    /// The receiver's communication ID.
    pub(crate) remote_comm_id: u32,
    /// Private data.
    pub(crate) private_data: CmBytes<DREP_PRIVATE_DATA>,
}

/// SIDR_REQ: which UD QP serves this service?
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SidrReq {
    /// Transaction ID; the SIDR_REP echoes it.
    pub(crate) tid: u64,
    /// The requester's ID for this request.
    pub(crate) request_id: u32,
    /// Partition key.
    pub(crate) pkey: u16,
    /// Service asked for.
    pub(crate) service_id: u64,
    /// Private data.
    pub(crate) private_data: CmBytes<SIDR_REQ_PRIVATE_DATA>,
}

/// SIDR_REP: the answer to a SIDR_REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SidrRep {
    /// The SIDR_REQ's transaction ID.
    pub(crate) tid: u64,
    /// The SIDR_REQ's request ID.
    pub(crate) request_id: u32,
    /// The outcome.
    pub(crate) status: SidrStatus,
    /// The serving QP (when `status` is `Valid`).
    pub(crate) qpn: u32,
    /// The service ID answered for.
    pub(crate) service_id: u64,
    /// The serving QP's Q_Key.
    pub(crate) qkey: u32,
    /// Additional information (a redirect's address).
    pub(crate) additional_info: CmBytes<ADDITIONAL_INFO>,
    /// Private data.
    pub(crate) private_data: CmBytes<SIDR_REP_PRIVATE_DATA>,
}

/// Any CM message this agent understands. LAP and APR (alternate paths)
/// are not among them: the codec drops them, as the Linux CM does on a
/// RoCE port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CmMessage {
    /// Connection request.
    Req(Box<Req>),
    /// Message receipt acknowledgement.
    Mra(Box<Mra>),
    /// Reject.
    Rej(Box<Rej>),
    /// Reply.
    Rep(Box<Rep>),
    /// Ready to use.
    Rtu(Box<Rtu>),
    /// Disconnect request.
    Dreq(Box<Dreq>),
    /// Disconnect reply.
    Drep(Box<Drep>),
    /// Service ID resolution request.
    SidrReq(Box<SidrReq>),
    /// Service ID resolution reply.
    SidrRep(Box<SidrRep>),
}

/// The kind of a CM message, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MsgKind {
    /// REQ.
    Req,
    /// MRA.
    Mra,
    /// REJ.
    Rej,
    /// REP.
    Rep,
    /// RTU.
    Rtu,
    /// DREQ.
    Dreq,
    /// DREP.
    Drep,
    /// SIDR_REQ.
    SidrReq,
    /// SIDR_REP.
    SidrRep,
}

impl CmMessage {
    /// The message's kind.
    pub(crate) fn kind(&self) -> MsgKind {
        match self {
            CmMessage::Req(_) => MsgKind::Req,
            CmMessage::Mra(_) => MsgKind::Mra,
            CmMessage::Rej(_) => MsgKind::Rej,
            CmMessage::Rep(_) => MsgKind::Rep,
            CmMessage::Rtu(_) => MsgKind::Rtu,
            CmMessage::Dreq(_) => MsgKind::Dreq,
            CmMessage::Drep(_) => MsgKind::Drep,
            CmMessage::SidrReq(_) => MsgKind::SidrReq,
            CmMessage::SidrRep(_) => MsgKind::SidrRep,
        }
    }

    /// The message's transaction ID.
    pub(crate) fn tid(&self) -> u64 {
        match self {
            CmMessage::Req(m) => m.tid,
            CmMessage::Mra(m) => m.tid,
            CmMessage::Rej(m) => m.tid,
            CmMessage::Rep(m) => m.tid,
            CmMessage::Rtu(m) => m.tid,
            CmMessage::Dreq(m) => m.tid,
            CmMessage::Drep(m) => m.tid,
            CmMessage::SidrReq(m) => m.tid,
            CmMessage::SidrRep(m) => m.tid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rej_reason_codes_match_ib_cm_h() {
        for code in 0..=40u16 {
            let reason = RejReason::from_code(code);
            assert_eq!(reason.code(), code, "{reason:?}");
        }
        assert_eq!(RejReason::from_code(8), RejReason::InvalidServiceId);
        assert_eq!(RejReason::from_code(10), RejReason::StaleConn);
        assert_eq!(RejReason::from_code(28), RejReason::ConsumerDefined);
        assert_eq!(RejReason::from_code(34), RejReason::Other(34));
        assert_eq!(RejReason::VendorOptionNotSupported.code(), 35);
    }

    #[test]
    fn sidr_status_codes_round_trip() {
        for code in 0..=u8::MAX {
            assert_eq!(SidrStatus::from_code(code).code(), code);
        }
        assert_eq!(SidrStatus::from_code(1), SidrStatus::Unsupported);
    }

    #[test]
    fn private_data_is_bounded_by_the_message() {
        assert!(CmBytes::<REQ_PRIVATE_DATA>::new(&[7; 92]).is_ok());
        assert_eq!(
            CmBytes::<REQ_PRIVATE_DATA>::new(&[7; 93]),
            Err(TooLong { len: 93, max: 92 })
        );
        let pd = CmBytes::<RTU_PRIVATE_DATA>::new(b"hi").unwrap();
        assert_eq!(pd.as_slice(), b"hi");
        assert_eq!(CmBytes::<RTU_PRIVATE_DATA>::MAX, 224);
        assert_eq!(format!("{pd:?}"), "[68, 69]");
        assert!(CmBytes::<DREP_PRIVATE_DATA>::default()
            .as_slice()
            .is_empty());
    }
}
