//! `CmAgent`: one device's connection manager as a sans-IO state machine
//! (see the module docs of `soft::cm` for the states and timers).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::attr::{Gid, Mtu};

use super::msg::{
    CmBytes, CmMessage, CmTransport, Drep, Dreq, Mra, MsgKind, MsgResponse, PathInfo, Rej,
    RejReason, Rep, Req, Rtu, SidrRep, SidrReq, SidrStatus, TooLong, ADDITIONAL_INFO,
    DREP_PRIVATE_DATA, DREQ_PRIVATE_DATA, REJ_PRIVATE_DATA, REP_PRIVATE_DATA,
    SIDR_REP_PRIVATE_DATA, SIDR_REQ_PRIVATE_DATA,
};

/// A connection (or SIDR request) as the agent's user names it. Never
/// reused within one agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ConnId(u64);

/// A listener as the agent's user names it. Never reused within one agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ListenId(u64);

/// The largest timeout exponent the agent waits for: 4.096 µs × 2^24 ≈
/// 68.7 s, the MRA service timeout rdma_cm asks for. Larger exponents a
/// peer (or user) gives are taken as this one, so no entry is held for
/// hours.
pub(crate) const MAX_TIMEOUT_EXP: u8 = 24;

/// The most resends of a REQ, REP or DREQ (the 4-bit "Max CM Retries").
pub(crate) const MAX_CM_RETRIES: u8 = 15;

/// The largest listen backlog; 0 or more asks for this one, as the
/// kernel's `ucma` does with its `max_backlog` default.
pub(crate) const MAX_BACKLOG: u32 = 1024;

/// A 24-bit QPN or PSN's largest value.
const MAX_24BIT: u32 = 0x00ff_ffff;

/// How many random draws the agent tries for a free local comm ID.
const COMM_ID_TRIES: u32 = 64;

/// The IBA's time unit: `4.096 µs × 2^exp`, the exponent capped at
/// [`MAX_TIMEOUT_EXP`].
pub(crate) fn iba_time(exp: u8) -> Duration {
    Duration::from_nanos(4096u64 << exp.min(MAX_TIMEOUT_EXP))
}

/// Limits on what peers can make the agent hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CmConfig {
    /// Most passive connections not yet established (REQs and SIDR_REQs
    /// received, whether the user has decided on them or not); REQs past
    /// it are dropped.
    pub(crate) max_half_open: usize,
    /// Most events waiting for `poll_event`; while it is reached, REQs and
    /// SIDR_REQs that would make a new connection are dropped.
    pub(crate) max_queued_events: usize,
    /// Most messages waiting for `poll_transmit`; more are dropped and
    /// counted (timers resend what needs an answer).
    pub(crate) max_queued_transmits: usize,
    /// The service timeout (exponent) this side's MRAs announce.
    pub(crate) mra_service_timeout: u8,
}

impl Default for CmConfig {
    fn default() -> Self {
        CmConfig {
            max_half_open: 1024,
            max_queued_events: 4096,
            max_queued_transmits: 4096,
            // rdma_cm's CMA_CM_MRA_SETTING.
            mra_service_timeout: 24,
        }
    }
}

/// What the user of the agent got wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CmError {
    /// Someone already listens on this service ID.
    #[error("service ID {0:#x} is already listened on")]
    AddrInUse(u64),
    /// The connection does not exist (destroyed, or never made).
    #[error("no such connection")]
    UnknownConn,
    /// The listener does not exist.
    #[error("no such listener")]
    UnknownListen,
    /// The call does not fit the connection's state.
    #[error("the connection is {0:?}, where this call is not allowed")]
    InvalidState(ConnState),
    /// The connection is established already.
    #[error("the connection is already established")]
    AlreadyEstablished,
    /// Private data longer than the message holds.
    #[error("private data of {len} bytes is more than the message's {max}")]
    PrivateDataTooLong {
        /// Bytes given.
        len: usize,
        /// Bytes the message holds.
        max: usize,
    },
    /// An argument out of range.
    #[error("{0}")]
    InvalidArgument(&'static str),
    /// No free local communication ID was found.
    #[error("no free communication ID")]
    NoCommId,
}

impl CmError {
    /// The errno rdma_cm returns for this.
    pub(crate) fn errno(&self) -> i32 {
        use nix::errno::Errno as E;
        (match self {
            CmError::AddrInUse(_) => E::EADDRINUSE,
            CmError::AlreadyEstablished => E::EISCONN,
            CmError::NoCommId => E::ENOMEM,
            CmError::UnknownConn
            | CmError::UnknownListen
            | CmError::InvalidState(_)
            | CmError::PrivateDataTooLong { .. }
            | CmError::InvalidArgument(_) => E::EINVAL,
        }) as i32
    }
}

impl From<TooLong> for CmError {
    fn from(e: TooLong) -> CmError {
        CmError::PrivateDataTooLong {
            len: e.len,
            max: e.max,
        }
    }
}

/// A connection's state (`enum ib_cm_state`, without LAP's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnState {
    /// Active: REQ sent, waiting for REP/REJ/MRA.
    ReqSent,
    /// Active: the peer MRA'd the REQ; waiting longer.
    MraReqRcvd,
    /// Active: REP received, waiting for the user's `establish` or `reject`.
    RepRcvd,
    /// Active: as `RepRcvd`, and an MRA told the peer to wait.
    MraRepSent,
    /// Passive: REQ received, waiting for the user's `accept` or `reject`.
    ReqRcvd,
    /// Passive: as `ReqRcvd`, and an MRA told the peer to wait.
    MraReqSent,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Passive: the peer MRA'd the REP; waiting longer.
    MraRepRcvd,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// Disconnected; the comm ID is kept until time-wait ends.
    TimeWait,
    /// SIDR_REQ sent, waiting for SIDR_REP.
    SidrReqSent,
    /// SIDR_REQ received, waiting for the user's `sidr_reply`.
    SidrReqRcvd,
    /// Finished (rejected, unreachable, time-wait over, SIDR answered):
    /// holds nothing but the entry, until `destroy`.
    Idle,
}

/// What a connect asks for: the REQ's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConnectParams {
    /// The passive side's port GID (its IP address on RoCE).
    pub(crate) peer: Gid,
    /// Service asked for (rdma_cm: port space and port).
    pub(crate) service_id: u64,
    /// This side's QPN.
    pub(crate) local_qpn: u32,
    /// The PSN this side's QP expects first (its rq_psn; the peer sends
    /// from it).
    pub(crate) starting_psn: u32,
    /// RC or UC.
    pub(crate) transport: CmTransport,
    /// RDMA READ/atomic requests this side will serve.
    pub(crate) responder_resources: u8,
    /// RDMA READ/atomic requests this side will have outstanding.
    pub(crate) initiator_depth: u8,
    /// Transport retry count (0..=7).
    pub(crate) retry_count: u8,
    /// RNR retry count (0..=7).
    pub(crate) rnr_retry_count: u8,
    /// Path MTU.
    pub(crate) path_mtu: Mtu,
    /// Partition key.
    pub(crate) pkey: u16,
    /// Whether this side's QP receives through an SRQ.
    pub(crate) srq: bool,
    /// End-to-end flow control.
    pub(crate) flow_control: bool,
    /// CM response timeout exponent, for both directions (how long this
    /// side gives the peer, and takes itself), as rdma_cm sets both.
    pub(crate) cm_response_timeout: u8,
    /// Resends of the REQ (and later the DREQ) before giving up (0..=15).
    pub(crate) max_cm_retries: u8,
    /// The QPs' local ACK timeout exponent; the packet life time the CM
    /// waits for is one less, as the kernel's CM derives it.
    pub(crate) local_ack_timeout: u8,
    /// Traffic class.
    pub(crate) traffic_class: u8,
    /// Hop limit.
    pub(crate) hop_limit: u8,
    /// Flow label (20 bits).
    pub(crate) flow_label: u32,
    /// REQ private data (at most 92 bytes).
    pub(crate) private_data: Vec<u8>,
}

impl ConnectParams {
    /// The parameters the Linux kernel's rdma_cm sends over RoCE (seen in
    /// its REQs, `testdata/`), for the rest: RC, retry counts 7, MTU 1024,
    /// default P_Key, no end-to-end flow control, CM response timeout 20
    /// (≈4.3 s), 15 CM retries, packet life 18 (ACK timeout 19), hop
    /// limit 64.
    pub(crate) fn rdma_cm_defaults(
        peer: Gid,
        service_id: u64,
        local_qpn: u32,
        starting_psn: u32,
    ) -> ConnectParams {
        ConnectParams {
            peer,
            service_id,
            local_qpn,
            starting_psn,
            transport: CmTransport::Rc,
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            path_mtu: Mtu::Mtu1024,
            pkey: 0xffff,
            srq: false,
            flow_control: false,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            local_ack_timeout: 19,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
            private_data: Vec::new(),
        }
    }
}

/// What an accept answers with: the REP's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AcceptParams {
    /// This side's QPN.
    pub(crate) local_qpn: u32,
    /// The PSN this side's QP expects first (its rq_psn; the peer sends
    /// from it).
    pub(crate) starting_psn: u32,
    /// RDMA READ/atomic requests this side will serve.
    pub(crate) responder_resources: u8,
    /// RDMA READ/atomic requests this side will have outstanding.
    pub(crate) initiator_depth: u8,
    /// RNR retry count the active side should use (0..=7).
    pub(crate) rnr_retry_count: u8,
    /// This CA's ACK delay exponent.
    pub(crate) target_ack_delay: u8,
    /// Whether this side's QP receives through an SRQ.
    pub(crate) srq: bool,
    /// End-to-end flow control.
    pub(crate) flow_control: bool,
    /// REP private data (at most 196 bytes).
    pub(crate) private_data: Vec<u8>,
}

/// What a REP told the active side: what it needs to bring its QP to RTR
/// and RTS, already turned to this side's view (the peer's initiator
/// depth is this side's responder resources, and the other way round).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConnectResponse {
    /// The passive side's QPN (the QP's destination).
    pub(crate) remote_qpn: u32,
    /// The PSN the passive side's QP expects first (this QP's send PSN).
    pub(crate) remote_starting_psn: u32,
    /// RDMA READ/atomic requests this side may serve (the peer's depth).
    pub(crate) responder_resources: u8,
    /// RDMA READ/atomic requests this side may have outstanding (the
    /// peer's resources).
    pub(crate) initiator_depth: u8,
    /// RNR retry count to use.
    pub(crate) rnr_retry_count: u8,
    /// The passive CA's ACK delay exponent.
    pub(crate) target_ack_delay: u8,
    /// Whether the passive side uses an SRQ.
    pub(crate) srq: bool,
    /// End-to-end flow control.
    pub(crate) flow_control: bool,
    /// The passive side's CA GUID.
    pub(crate) remote_ca_guid: u64,
    /// The REP's private data.
    pub(crate) private_data: CmBytes<REP_PRIVATE_DATA>,
}

/// What the agent tells its user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CmEvent {
    /// A REQ for a listened service: answer with `accept` or `reject`.
    /// The REQ's fields are the sender's view (its `initiator_depth` is
    /// this side's responder resources).
    ConnectRequest {
        /// The listener it came to.
        listen: ListenId,
        /// The new connection.
        conn: ConnId,
        /// The sender's GID.
        peer: Gid,
        /// The REQ, private data included.
        req: Box<Req>,
    },
    /// A REP for this side's REQ: bring the QP up, then `establish` (or
    /// `reject`).
    ConnectResponse {
        /// The connection.
        conn: ConnId,
        /// The REP's contents.
        response: Box<ConnectResponse>,
    },
    /// The connection is established (RTU sent, or received, or the user
    /// said so).
    Established {
        /// The connection.
        conn: ConnId,
    },
    /// The peer rejected (or abandoned) the connection.
    Rejected {
        /// The connection.
        conn: ConnId,
        /// Why.
        reason: RejReason,
        /// The REJ's private data.
        private_data: CmBytes<REJ_PRIVATE_DATA>,
    },
    /// The peer did not answer: every resend of the REQ, REP or SIDR_REQ
    /// went unanswered (rdma_cm: `RDMA_CM_EVENT_UNREACHABLE`, `-ETIMEDOUT`).
    Unreachable {
        /// The connection.
        conn: ConnId,
    },
    /// The connection is disconnected: a DREQ came (and was answered),
    /// or this side's DREQ was answered or given up on. Reported once.
    Disconnected {
        /// The connection.
        conn: ConnId,
        /// The DREQ's (or DREP's) private data.
        private_data: CmBytes<DREP_PRIVATE_DATA>,
    },
    /// Time-wait is over; the connection's comm ID is free.
    TimewaitExit {
        /// The connection.
        conn: ConnId,
    },
    /// A SIDR_REQ for a listened service: answer with `sidr_reply`.
    SidrRequest {
        /// The listener it came to.
        listen: ListenId,
        /// The new request.
        conn: ConnId,
        /// The sender's GID.
        peer: Gid,
        /// The service asked for.
        service_id: u64,
        /// The partition key asked for.
        pkey: u16,
        /// The SIDR_REQ's private data.
        private_data: CmBytes<SIDR_REQ_PRIVATE_DATA>,
    },
    /// The answer to this side's SIDR_REQ.
    SidrReply {
        /// The request.
        conn: ConnId,
        /// The outcome.
        status: SidrStatus,
        /// The serving QP.
        qpn: u32,
        /// Its Q_Key.
        qkey: u32,
        /// The SIDR_REP's private data.
        private_data: CmBytes<SIDR_REP_PRIVATE_DATA>,
    },
}

/// A message to send to the peer's GSI QP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Transmit {
    /// The peer's GID.
    pub(crate) to: Gid,
    /// The message.
    pub(crate) msg: CmMessage,
}

/// One counter per message kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MsgCounts {
    /// REQs.
    pub(crate) req: u64,
    /// MRAs.
    pub(crate) mra: u64,
    /// REJs.
    pub(crate) rej: u64,
    /// REPs.
    pub(crate) rep: u64,
    /// RTUs.
    pub(crate) rtu: u64,
    /// DREQs.
    pub(crate) dreq: u64,
    /// DREPs.
    pub(crate) drep: u64,
    /// SIDR_REQs.
    pub(crate) sidr_req: u64,
    /// SIDR_REPs.
    pub(crate) sidr_rep: u64,
}

impl MsgCounts {
    /// All messages counted.
    pub(crate) fn total(&self) -> u64 {
        self.req
            + self.mra
            + self.rej
            + self.rep
            + self.rtu
            + self.dreq
            + self.drep
            + self.sidr_req
            + self.sidr_rep
    }

    fn bump(&mut self, kind: MsgKind) {
        let counter = match kind {
            MsgKind::Req => &mut self.req,
            MsgKind::Mra => &mut self.mra,
            MsgKind::Rej => &mut self.rej,
            MsgKind::Rep => &mut self.rep,
            MsgKind::Rtu => &mut self.rtu,
            MsgKind::Dreq => &mut self.dreq,
            MsgKind::Drep => &mut self.drep,
            MsgKind::SidrReq => &mut self.sidr_req,
            MsgKind::SidrRep => &mut self.sidr_rep,
        };
        *counter += 1;
    }
}

/// Messages received and not acted on, by why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DropCounts {
    /// Its comm IDs (or request ID) match no connection.
    pub(crate) unknown_conn: u64,
    /// It does not fit its connection's state.
    pub(crate) wrong_state: u64,
    /// A duplicate needing no answer.
    pub(crate) duplicate: u64,
    /// A field out of range (comm ID 0, a QPN wider than 24 bits).
    pub(crate) malformed: u64,
    /// A REQ for a listener whose backlog is full.
    pub(crate) backlog_full: u64,
    /// A REQ or SIDR_REQ past the half-open cap, or while the event queue
    /// is full.
    pub(crate) overloaded: u64,
    /// Messages to send dropped because the transmit queue was full.
    pub(crate) transmit_queue_full: u64,
}

/// The agent's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CmStats {
    /// Messages handed to `poll_transmit`'s queue, resends included.
    pub(crate) sent: MsgCounts,
    /// Messages given to `handle_message`.
    pub(crate) received: MsgCounts,
    /// Resends (timer-driven, or answering a duplicate).
    pub(crate) retransmitted: MsgCounts,
    /// Duplicates received (answered or not).
    pub(crate) duplicates: u64,
    /// Received messages dropped, by reason.
    pub(crate) drops: DropCounts,
    /// Requests given up on after their last resend.
    pub(crate) timeouts: u64,
}

/// Which end of the exchange a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Active,
    Passive,
}

/// A message resent until answered.
#[derive(Debug)]
struct Resend {
    msg: CmMessage,
    interval: Duration,
    left: u8,
}

#[derive(Debug)]
struct Conn {
    role: Role,
    state: ConnState,
    peer: Gid,
    /// 0 when none is held (a passive SIDR request, or after time-wait).
    local_comm_id: u32,
    /// 0 while unknown.
    remote_comm_id: u32,
    remote_ca_guid: u64,
    tid: u64,
    service_id: u64,
    local_qpn: u32,
    remote_qpn: u32,
    /// Packet life time exponent of the path.
    packet_life: u8,
    /// How long the peer takes to answer us (exponent).
    peer_response: u8,
    /// How long we take to answer the peer (exponent): when our MRA is due.
    own_response: u8,
    max_retries: u8,
    /// The ACK delay exponent used for the time-wait.
    ack_delay: u8,
    /// Whether `(remote_ca_guid, remote_comm_id)` and
    /// `(remote_ca_guid, remote_qpn)` are in the index.
    remote_indexed: bool,
    /// Whether `(peer, remote_comm_id)` is in the SIDR index.
    sidr_indexed: bool,
    /// The listener whose backlog this (undecided) request counts against.
    pending_in: Option<ListenId>,
    /// Counted among the half-open passive connections.
    half_open: bool,
    resend: Option<Resend>,
    /// The state's timer: a resend, the MRA due, the end of time-wait.
    deadline: Option<Instant>,
    /// The last answer sent that nothing resends (MRA, RTU, DREP): sent
    /// again when a duplicate of what it answered comes.
    reply: Option<CmMessage>,
    disconnect_reported: bool,
}

impl Conn {
    fn new(role: Role, state: ConnState, peer: Gid) -> Conn {
        Conn {
            role,
            state,
            peer,
            local_comm_id: 0,
            remote_comm_id: 0,
            remote_ca_guid: 0,
            tid: 0,
            service_id: 0,
            local_qpn: 0,
            remote_qpn: 0,
            packet_life: 0,
            peer_response: 0,
            own_response: 0,
            max_retries: 0,
            ack_delay: 0,
            remote_indexed: false,
            sidr_indexed: false,
            pending_in: None,
            half_open: false,
            resend: None,
            deadline: None,
            reply: None,
            disconnect_reported: false,
        }
    }

    /// How long to wait for the peer's answer: its response time plus a
    /// round trip (2 × packet life), as the kernel's CM computes a REQ's.
    fn response_wait(&self) -> Duration {
        iba_time(self.peer_response) + 2 * iba_time(self.packet_life)
    }

    /// The time-wait: the QP's ACK timeout as IBA 9.7.6.1.3 defines it,
    /// the peer's ACK delay plus a round trip (2 × packet life); the
    /// kernel's CM waits this long (its `av.timeout`).
    fn timewait(&self) -> Duration {
        iba_time(self.ack_delay) + 2 * iba_time(self.packet_life)
    }

    /// Sends `msg` now and arms its resends.
    fn arm(&mut self, now: Instant, msg: CmMessage, interval: Duration) -> CmMessage {
        self.deadline = Some(now + interval);
        self.resend = Some(Resend {
            msg: msg.clone(),
            interval,
            left: self.max_retries,
        });
        msg
    }

    fn stop_timer(&mut self) {
        self.deadline = None;
        self.resend = None;
    }
}

/// The lookups from messages to connections.
#[derive(Debug, Default)]
struct Index {
    /// Live local comm IDs (and SIDR request IDs we sent).
    by_comm_id: HashMap<u32, ConnId>,
    /// `(remote CA GUID, remote comm ID)`: duplicate REQs and REPs.
    by_remote_id: HashMap<(u64, u32), ConnId>,
    /// `(remote CA GUID, remote QPN)`: stale connections.
    by_remote_qpn: HashMap<(u64, u32), ConnId>,
    /// `(sender, request ID)` of SIDR_REQs awaiting the user's reply.
    sidr_by_remote: HashMap<(Gid, u32), ConnId>,
}

impl Index {
    fn unlink_remote(&mut self, id: ConnId, c: &mut Conn) {
        if c.remote_indexed {
            remove_if(
                &mut self.by_remote_id,
                &(c.remote_ca_guid, c.remote_comm_id),
                id,
            );
            remove_if(
                &mut self.by_remote_qpn,
                &(c.remote_ca_guid, c.remote_qpn),
                id,
            );
            c.remote_indexed = false;
        }
        if c.sidr_indexed {
            remove_if(&mut self.sidr_by_remote, &(c.peer, c.remote_comm_id), id);
            c.sidr_indexed = false;
        }
    }

    /// Frees everything the connection holds in the index, its local comm
    /// ID included.
    fn unlink_all(&mut self, id: ConnId, c: &mut Conn) {
        self.unlink_remote(id, c);
        if c.local_comm_id != 0 {
            remove_if(&mut self.by_comm_id, &c.local_comm_id, id);
            c.local_comm_id = 0;
        }
    }
}

fn remove_if<K: std::hash::Hash + Eq>(map: &mut HashMap<K, ConnId>, key: &K, id: ConnId) {
    if map.get(key) == Some(&id) {
        map.remove(key);
    }
}

#[derive(Debug)]
struct Listener {
    service_id: u64,
    backlog: u32,
    /// Requests reported and not yet accepted, rejected or destroyed.
    pending: u32,
}

/// The agent's outputs: messages, events and counters.
#[derive(Debug)]
struct Outbox {
    transmits: VecDeque<Transmit>,
    events: VecDeque<CmEvent>,
    stats: CmStats,
    max_transmits: usize,
}

impl Outbox {
    fn send(&mut self, to: Gid, msg: CmMessage) {
        if self.transmits.len() >= self.max_transmits {
            self.stats.drops.transmit_queue_full += 1;
            return;
        }
        self.stats.sent.bump(msg.kind());
        self.transmits.push_back(Transmit { to, msg });
    }

    fn resend(&mut self, to: Gid, msg: CmMessage) {
        self.stats.retransmitted.bump(msg.kind());
        self.send(to, msg);
    }

    fn emit(&mut self, event: CmEvent) {
        self.events.push_back(event);
    }

    fn drop_msg(&mut self, why: DropReason) {
        let d = &mut self.stats.drops;
        *match why {
            DropReason::UnknownConn => &mut d.unknown_conn,
            DropReason::WrongState => &mut d.wrong_state,
            DropReason::Duplicate => &mut d.duplicate,
            DropReason::Malformed => &mut d.malformed,
            DropReason::BacklogFull => &mut d.backlog_full,
            DropReason::Overloaded => &mut d.overloaded,
        } += 1;
    }
}

/// A source of random 32-bit values (local comm IDs, the transaction ID's
/// high half). Injected so tests are deterministic.
pub(crate) type RandomSource = Box<dyn FnMut() -> u32 + Send>;

/// One device's connection manager: the IB CM protocol over the device's
/// GSI QP, without the I/O. Inputs are calls with the current time;
/// outputs wait in queues for `poll_transmit`, `poll_event` and
/// `poll_timeout`.
pub(crate) struct CmAgent {
    local_gid: Gid,
    ca_guid: u64,
    config: CmConfig,
    random: RandomSource,
    tid_high: u32,
    next_handle: u64,
    conns: HashMap<ConnId, Conn>,
    index: Index,
    listeners: HashMap<ListenId, Listener>,
    listen_by_service: HashMap<u64, ListenId>,
    half_open: usize,
    out: Outbox,
}

impl std::fmt::Debug for CmAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmAgent")
            .field("local_gid", &self.local_gid)
            .field("ca_guid", &self.ca_guid)
            .field("conns", &self.conns.len())
            .field("listeners", &self.listeners.len())
            .finish_non_exhaustive()
    }
}

/// Why a received message was dropped (one [`DropCounts`] counter each).
#[derive(Debug, Clone, Copy)]
enum DropReason {
    UnknownConn,
    WrongState,
    Duplicate,
    Malformed,
    BacklogFull,
    Overloaded,
}

impl CmAgent {
    /// An agent for the port with GID `local_gid` of the CA `ca_guid`.
    pub(crate) fn new(
        local_gid: Gid,
        ca_guid: u64,
        config: CmConfig,
        mut random: RandomSource,
    ) -> CmAgent {
        let tid_high = random();
        CmAgent {
            local_gid,
            ca_guid,
            config,
            random,
            tid_high,
            next_handle: 1,
            conns: HashMap::new(),
            index: Index::default(),
            listeners: HashMap::new(),
            listen_by_service: HashMap::new(),
            half_open: 0,
            out: Outbox {
                transmits: VecDeque::new(),
                events: VecDeque::new(),
                stats: CmStats::default(),
                max_transmits: config.max_queued_transmits,
            },
        }
    }

    /// How many connections (of any state) the agent holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether the agent holds no connection and no listener.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.conns.is_empty() && self.listeners.is_empty()
    }

    /// The agent's counters.
    pub(crate) fn stats(&self) -> &CmStats {
        &self.out.stats
    }

    /// A connection's state.
    pub(crate) fn state(&self, conn: ConnId) -> Option<ConnState> {
        self.conns.get(&conn).map(|c| c.state)
    }

    /// Entries in the lookup tables plus half-open connections and
    /// listeners' pending counts: 0 when nothing is held.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.index.by_comm_id.len()
            + self.index.by_remote_id.len()
            + self.index.by_remote_qpn.len()
            + self.index.sidr_by_remote.len()
            + self.half_open
            + self
                .listeners
                .values()
                .map(|l| l.pending as usize)
                .sum::<usize>()
    }

    /// Passive connections not yet established.
    #[cfg(test)]
    pub(crate) fn half_open(&self) -> usize {
        self.half_open
    }

    /// Messages and events waiting to be polled.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> (usize, usize) {
        (self.out.transmits.len(), self.out.events.len())
    }

    /// This agent's port GID.
    #[cfg(test)]
    pub(crate) fn local_gid(&self) -> Gid {
        self.local_gid
    }

    fn handle(&mut self) -> u64 {
        let h = self.next_handle;
        self.next_handle += 1;
        h
    }

    fn alloc_comm_id(&mut self) -> Option<u32> {
        for _ in 0..COMM_ID_TRIES {
            let id = (self.random)();
            if id != 0 && !self.index.by_comm_id.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }

    /// A new transaction ID for a request this side starts: the agent's
    /// random high half and the connection's comm ID, as the kernel forms
    /// them.
    fn new_tid(&self, local_comm_id: u32) -> u64 {
        (u64::from(self.tid_high) << 32) | u64::from(local_comm_id)
    }

    fn release_pending(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if let Some(listen) = c.pending_in.take() {
            if let Some(l) = self.listeners.get_mut(&listen) {
                l.pending = l.pending.saturating_sub(1);
            }
        }
    }

    fn release_half_open(&mut self, id: ConnId) {
        if let Some(c) = self.conns.get_mut(&id) {
            if c.half_open {
                c.half_open = false;
                self.half_open -= 1;
            }
        }
    }

    // ---- listeners ----

    /// Listens on `service_id`: REQs and SIDR_REQs for it become
    /// `ConnectRequest` and `SidrRequest` events, at most `backlog` of
    /// them undecided at a time (0, or more than [`MAX_BACKLOG`], means
    /// [`MAX_BACKLOG`]).
    pub(crate) fn listen(&mut self, service_id: u64, backlog: u32) -> Result<ListenId, CmError> {
        if self.listen_by_service.contains_key(&service_id) {
            return Err(CmError::AddrInUse(service_id));
        }
        let backlog = if backlog == 0 || backlog > MAX_BACKLOG {
            MAX_BACKLOG
        } else {
            backlog
        };
        let id = ListenId(self.handle());
        self.listeners.insert(
            id,
            Listener {
                service_id,
                backlog,
                pending: 0,
            },
        );
        self.listen_by_service.insert(service_id, id);
        Ok(id)
    }

    /// Stops listening. Requests already reported stay the user's.
    pub(crate) fn unlisten(&mut self, id: ListenId) -> Result<(), CmError> {
        let l = self.listeners.remove(&id).ok_or(CmError::UnknownListen)?;
        self.listen_by_service.remove(&l.service_id);
        Ok(())
    }

    // ---- the active side ----

    /// Sends a REQ; the answer comes as `ConnectResponse`, `Rejected` or
    /// `Unreachable`.
    pub(crate) fn connect(&mut self, now: Instant, p: ConnectParams) -> Result<ConnId, CmError> {
        let private_data = CmBytes::new(&p.private_data)?;
        if p.local_qpn > MAX_24BIT || p.starting_psn > MAX_24BIT {
            return Err(CmError::InvalidArgument("QPN and PSN are 24-bit"));
        }
        if p.retry_count > 7 || p.rnr_retry_count > 7 {
            return Err(CmError::InvalidArgument("retry counts are 3-bit"));
        }
        if p.max_cm_retries > MAX_CM_RETRIES {
            return Err(CmError::InvalidArgument("max CM retries is 4-bit"));
        }
        if p.cm_response_timeout > 31 || p.local_ack_timeout > 31 {
            return Err(CmError::InvalidArgument("timeouts are 5-bit exponents"));
        }
        let local_comm_id = self.alloc_comm_id().ok_or(CmError::NoCommId)?;
        let tid = self.new_tid(local_comm_id);
        let req = Req {
            tid,
            local_comm_id,
            service_id: p.service_id,
            local_ca_guid: self.ca_guid,
            local_qkey: 0,
            local_qpn: p.local_qpn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            remote_cm_response_timeout: p.cm_response_timeout,
            transport: p.transport,
            flow_control: p.flow_control,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: p.cm_response_timeout,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: p.max_cm_retries,
            path_mtu: p.path_mtu,
            pkey: p.pkey,
            srq: p.srq,
            primary: PathInfo {
                local_gid: self.local_gid,
                remote_gid: p.peer,
                flow_label: p.flow_label & 0xf_ffff,
                traffic_class: p.traffic_class,
                hop_limit: p.hop_limit,
                sl: 0,
                local_ack_timeout: p.local_ack_timeout,
            },
            private_data,
        };
        let id = ConnId(self.handle());
        let mut c = Conn::new(Role::Active, ConnState::ReqSent, p.peer);
        c.local_comm_id = local_comm_id;
        c.tid = tid;
        c.service_id = p.service_id;
        c.local_qpn = p.local_qpn;
        c.packet_life = p.local_ack_timeout.saturating_sub(1);
        c.peer_response = p.cm_response_timeout;
        c.own_response = p.cm_response_timeout;
        c.max_retries = p.max_cm_retries;
        let wait = c.response_wait();
        let msg = c.arm(now, CmMessage::Req(Box::new(req)), wait);
        self.index.by_comm_id.insert(local_comm_id, id);
        self.conns.insert(id, c);
        self.out.send(p.peer, msg);
        Ok(id)
    }

    /// Establishes a connection: on the active side after
    /// `ConnectResponse`, sends the RTU (with `private_data`); on the
    /// passive side after `accept`, takes the connection as established
    /// without waiting for the RTU — what `rdma_establish` (the kernel's
    /// `ib_cm_notify(IB_EVENT_COMM_EST)`) does when data arrives first;
    /// `private_data` is then unused.
    pub(crate) fn establish(
        &mut self,
        now: Instant,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let _ = now;
        let pd = CmBytes::new(private_data)?;
        let c = self.conns.get_mut(&conn).ok_or(CmError::UnknownConn)?;
        match (c.role, c.state) {
            (Role::Active, ConnState::RepRcvd | ConnState::MraRepSent) => {
                let rtu = CmMessage::Rtu(Box::new(Rtu {
                    tid: c.tid,
                    local_comm_id: c.local_comm_id,
                    remote_comm_id: c.remote_comm_id,
                    private_data: pd,
                }));
                c.state = ConnState::Established;
                c.stop_timer();
                c.reply = Some(rtu.clone());
                let peer = c.peer;
                self.out.send(peer, rtu);
            }
            (Role::Passive, ConnState::RepSent | ConnState::MraRepRcvd) => {
                c.state = ConnState::Established;
                c.stop_timer();
                self.release_half_open(conn);
            }
            (_, ConnState::Established) => return Err(CmError::AlreadyEstablished),
            (_, state) => return Err(CmError::InvalidState(state)),
        }
        self.out.emit(CmEvent::Established { conn });
        Ok(())
    }

    // ---- the passive side ----

    /// Accepts a `ConnectRequest`: sends the REP, resent until the RTU
    /// comes (or the user calls `establish`).
    pub(crate) fn accept(
        &mut self,
        now: Instant,
        conn: ConnId,
        p: AcceptParams,
    ) -> Result<(), CmError> {
        let private_data = CmBytes::new(&p.private_data)?;
        if p.local_qpn > MAX_24BIT || p.starting_psn > MAX_24BIT {
            return Err(CmError::InvalidArgument("QPN and PSN are 24-bit"));
        }
        if p.rnr_retry_count > 7 || p.target_ack_delay > 31 {
            return Err(CmError::InvalidArgument(
                "RNR retry is 3-bit, ACK delay a 5-bit exponent",
            ));
        }
        let ca_guid = self.ca_guid;
        let c = self.conns.get_mut(&conn).ok_or(CmError::UnknownConn)?;
        if !matches!(c.state, ConnState::ReqRcvd | ConnState::MraReqSent) {
            return Err(CmError::InvalidState(c.state));
        }
        let rep = Rep {
            tid: c.tid,
            local_comm_id: c.local_comm_id,
            remote_comm_id: c.remote_comm_id,
            local_qkey: 0,
            local_qpn: p.local_qpn,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: p.target_ack_delay,
            failover_accepted: false,
            flow_control: p.flow_control,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: ca_guid,
            private_data,
        };
        c.local_qpn = p.local_qpn;
        c.ack_delay = p.target_ack_delay;
        c.state = ConnState::RepSent;
        c.reply = None;
        let wait = c.response_wait();
        let msg = c.arm(now, CmMessage::Rep(Box::new(rep)), wait);
        let peer = c.peer;
        self.release_pending(conn);
        self.out.send(peer, msg);
        Ok(())
    }

    /// Rejects with reason consumer-defined and `private_data`: a
    /// `ConnectRequest` (before or after `accept`), or on the active side a
    /// `ConnectResponse`.
    pub(crate) fn reject(
        &mut self,
        now: Instant,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let pd = CmBytes::new(private_data)?;
        let c = self.conns.get_mut(&conn).ok_or(CmError::UnknownConn)?;
        let (rejected, timewait) = match (c.role, c.state) {
            (Role::Passive, ConnState::ReqRcvd | ConnState::MraReqSent) => {
                (MsgResponse::Req, false)
            }
            (Role::Passive, ConnState::RepSent | ConnState::MraRepRcvd) => {
                (MsgResponse::Other, true)
            }
            (Role::Active, ConnState::RepRcvd | ConnState::MraRepSent) => (MsgResponse::Rep, false),
            (_, state) => return Err(CmError::InvalidState(state)),
        };
        let rej = rej_for(c, rejected, RejReason::ConsumerDefined, pd);
        let peer = c.peer;
        self.out.send(peer, rej);
        if timewait {
            self.enter_timewait(now, conn);
        } else {
            self.go_idle(conn);
        }
        self.release_pending(conn);
        self.release_half_open(conn);
        Ok(())
    }

    /// Disconnects an established connection: sends the DREQ, resent until
    /// the DREP comes or the retries run out; then time-wait. A connection
    /// already disconnecting is left as it is.
    pub(crate) fn disconnect(
        &mut self,
        now: Instant,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let pd = CmBytes::new(private_data)?;
        let c = self.conns.get(&conn).ok_or(CmError::UnknownConn)?;
        match c.state {
            ConnState::Established => {
                self.send_dreq(now, conn, pd);
                Ok(())
            }
            ConnState::DreqSent | ConnState::TimeWait => Ok(()),
            state => Err(CmError::InvalidState(state)),
        }
    }

    fn send_dreq(&mut self, now: Instant, conn: ConnId, pd: CmBytes<DREQ_PRIVATE_DATA>) {
        let tid_high = self.tid_high;
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let dreq = Dreq {
            tid: (u64::from(tid_high) << 32) | u64::from(c.local_comm_id),
            local_comm_id: c.local_comm_id,
            remote_comm_id: c.remote_comm_id,
            remote_qpn: c.remote_qpn,
            private_data: pd,
        };
        c.state = ConnState::DreqSent;
        let wait = c.response_wait();
        let msg = c.arm(now, CmMessage::Dreq(Box::new(dreq)), wait);
        let peer = c.peer;
        self.out.send(peer, msg);
    }

    /// Ends every connection as [`destroy`](Self::destroy) does (the
    /// process is exiting: its peers hear of it as from the kernel's CM,
    /// which ends a closed process's connections). How many there were.
    pub(crate) fn destroy_all(&mut self, now: Instant) -> usize {
        let conns: Vec<ConnId> = self.conns.keys().copied().collect();
        for &conn in &conns {
            let _ = self.destroy(now, conn);
        }
        conns.len()
    }

    /// Frees a connection now, from any state, telling the peer as the
    /// spec asks: REJ (timeout, with this CA's GUID) for an unanswered
    /// REQ; REJ (consumer-defined) for a connection not yet established;
    /// one DREQ for an established one; a SIDR_REP (rejected) for an
    /// unanswered SIDR_REQ. Nothing for the other states.
    pub(crate) fn destroy(&mut self, now: Instant, conn: ConnId) -> Result<(), CmError> {
        let _ = now;
        let mut c = self.conns.remove(&conn).ok_or(CmError::UnknownConn)?;
        let msg = match c.state {
            ConnState::ReqSent | ConnState::MraReqRcvd => {
                let ari = CmBytes::new(&self.ca_guid.to_be_bytes()).unwrap_or_default();
                let mut rej = rej_for(&c, MsgResponse::Other, RejReason::Timeout, CmBytes::empty());
                if let CmMessage::Rej(r) = &mut rej {
                    r.ari = ari;
                }
                Some(rej)
            }
            ConnState::ReqRcvd | ConnState::MraReqSent => Some(rej_for(
                &c,
                MsgResponse::Req,
                RejReason::ConsumerDefined,
                CmBytes::empty(),
            )),
            ConnState::RepSent
            | ConnState::MraRepRcvd
            | ConnState::RepRcvd
            | ConnState::MraRepSent => Some(rej_for(
                &c,
                if c.role == Role::Active {
                    MsgResponse::Rep
                } else {
                    MsgResponse::Other
                },
                RejReason::ConsumerDefined,
                CmBytes::empty(),
            )),
            ConnState::Established => Some(CmMessage::Dreq(Box::new(Dreq {
                tid: self.new_tid(c.local_comm_id),
                local_comm_id: c.local_comm_id,
                remote_comm_id: c.remote_comm_id,
                remote_qpn: c.remote_qpn,
                private_data: CmBytes::empty(),
            }))),
            ConnState::SidrReqRcvd => Some(CmMessage::SidrRep(Box::new(SidrRep {
                tid: c.tid,
                request_id: c.remote_comm_id,
                status: SidrStatus::Reject,
                qpn: 0,
                service_id: c.service_id,
                qkey: 0,
                additional_info: CmBytes::empty(),
                private_data: CmBytes::empty(),
            }))),
            ConnState::DreqSent
            | ConnState::TimeWait
            | ConnState::SidrReqSent
            | ConnState::Idle => None,
        };
        if let Some(msg) = msg {
            self.out.send(c.peer, msg);
        }
        self.index.unlink_all(conn, &mut c);
        if let Some(listen) = c.pending_in.take() {
            if let Some(l) = self.listeners.get_mut(&listen) {
                l.pending = l.pending.saturating_sub(1);
            }
        }
        if c.half_open {
            self.half_open -= 1;
        }
        Ok(())
    }

    // ---- SIDR ----

    /// Sends a SIDR_REQ, resent every `timeout` up to `retries` times; the
    /// answer comes as `SidrReply`, or `Unreachable`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sidr_request(
        &mut self,
        now: Instant,
        peer: Gid,
        service_id: u64,
        pkey: u16,
        private_data: &[u8],
        timeout: Duration,
        retries: u8,
    ) -> Result<ConnId, CmError> {
        let private_data = CmBytes::new(private_data)?;
        if retries > MAX_CM_RETRIES {
            return Err(CmError::InvalidArgument("at most 15 retries"));
        }
        let request_id = self.alloc_comm_id().ok_or(CmError::NoCommId)?;
        let tid = self.new_tid(request_id);
        let req = SidrReq {
            tid,
            request_id,
            pkey,
            service_id,
            private_data,
        };
        let id = ConnId(self.handle());
        let mut c = Conn::new(Role::Active, ConnState::SidrReqSent, peer);
        c.local_comm_id = request_id;
        c.tid = tid;
        c.service_id = service_id;
        c.max_retries = retries;
        let wait = timeout.min(iba_time(MAX_TIMEOUT_EXP));
        let msg = c.arm(now, CmMessage::SidrReq(Box::new(req)), wait);
        self.index.by_comm_id.insert(request_id, id);
        self.conns.insert(id, c);
        self.out.send(peer, msg);
        Ok(id)
    }

    /// Answers a `SidrRequest`.
    pub(crate) fn sidr_reply(
        &mut self,
        now: Instant,
        conn: ConnId,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let _ = now;
        let private_data = CmBytes::new(private_data)?;
        if qpn > MAX_24BIT {
            return Err(CmError::InvalidArgument("QPN is 24-bit"));
        }
        let c = self.conns.get_mut(&conn).ok_or(CmError::UnknownConn)?;
        if c.state != ConnState::SidrReqRcvd {
            return Err(CmError::InvalidState(c.state));
        }
        let rep = CmMessage::SidrRep(Box::new(SidrRep {
            tid: c.tid,
            request_id: c.remote_comm_id,
            status,
            qpn,
            service_id: c.service_id,
            qkey,
            additional_info: CmBytes::empty(),
            private_data,
        }));
        let peer = c.peer;
        self.out.send(peer, rep);
        self.go_idle(conn);
        self.release_pending(conn);
        self.release_half_open(conn);
        Ok(())
    }

    // ---- outputs ----

    /// The next message to send.
    pub(crate) fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.transmits.pop_front()
    }

    /// The next event for the user.
    pub(crate) fn poll_event(&mut self) -> Option<CmEvent> {
        self.out.events.pop_front()
    }

    /// When `handle_timeout` is next due.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    /// Runs the timers due at `now`: resends, MRAs, give-ups, time-wait ends.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        let mut due: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        due.sort_unstable();
        for id in due {
            self.on_deadline(now, id);
        }
    }

    fn on_deadline(&mut self, now: Instant, id: ConnId) {
        let mra_service_timeout = self.config.mra_service_timeout;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.deadline = None;
        match c.state {
            ConnState::ReqRcvd | ConnState::RepRcvd => {
                // The user is taking long: tell the peer to wait.
                let mraed = if c.state == ConnState::ReqRcvd {
                    c.state = ConnState::MraReqSent;
                    MsgResponse::Req
                } else {
                    c.state = ConnState::MraRepSent;
                    MsgResponse::Rep
                };
                let mra = mra_for(c, mraed, mra_service_timeout);
                c.reply = Some(mra.clone());
                let peer = c.peer;
                self.out.send(peer, mra);
            }
            ConnState::TimeWait => {
                c.state = ConnState::Idle;
                self.index.unlink_all(id, c);
                self.out.emit(CmEvent::TimewaitExit { conn: id });
            }
            ConnState::ReqSent
            | ConnState::MraReqRcvd
            | ConnState::RepSent
            | ConnState::MraRepRcvd
            | ConnState::DreqSent
            | ConnState::SidrReqSent => {
                let Some(resend) = c.resend.as_mut() else {
                    return;
                };
                if resend.left > 0 {
                    resend.left -= 1;
                    c.deadline = Some(now + resend.interval);
                    let (peer, msg) = (c.peer, resend.msg.clone());
                    self.out.resend(peer, msg);
                    return;
                }
                self.out.stats.timeouts += 1;
                c.resend = None;
                if c.state == ConnState::DreqSent {
                    self.enter_timewait(now, id);
                    self.report_disconnect(id, CmBytes::empty());
                } else {
                    self.go_idle(id);
                    self.release_half_open(id);
                    self.out.emit(CmEvent::Unreachable { conn: id });
                }
            }
            ConnState::MraRepSent
            | ConnState::MraReqSent
            | ConnState::Established
            | ConnState::SidrReqRcvd
            | ConnState::Idle => {}
        }
    }

    /// Moves a connection to time-wait: no more resends, the remote IDs
    /// forgotten (as the kernel's CM does), the local comm ID kept so a
    /// repeated DREQ is answered.
    fn enter_timewait(&mut self, now: Instant, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.state = ConnState::TimeWait;
        c.resend = None;
        c.deadline = Some(now + c.timewait());
        self.index.unlink_remote(id, c);
    }

    /// Finishes a connection without time-wait: everything in the index
    /// is freed.
    fn go_idle(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.state = ConnState::Idle;
        c.stop_timer();
        self.index.unlink_all(id, c);
    }

    fn report_disconnect(&mut self, id: ConnId, private_data: CmBytes<DREP_PRIVATE_DATA>) {
        if let Some(c) = self.conns.get_mut(&id) {
            if !c.disconnect_reported {
                c.disconnect_reported = true;
                self.out.emit(CmEvent::Disconnected {
                    conn: id,
                    private_data,
                });
            }
        }
    }

    // ---- inputs ----

    /// Takes a message the GSI QP received from `from` (the sender's GID).
    pub(crate) fn handle_message(&mut self, now: Instant, from: Gid, msg: CmMessage) {
        self.out.stats.received.bump(msg.kind());
        match msg {
            CmMessage::Req(m) => self.on_req(now, from, *m),
            CmMessage::Mra(m) => self.on_mra(now, from, &m),
            CmMessage::Rej(m) => self.on_rej(now, from, *m),
            CmMessage::Rep(m) => self.on_rep(now, from, *m),
            CmMessage::Rtu(m) => self.on_rtu(from, &m),
            CmMessage::Dreq(m) => self.on_dreq(now, from, *m),
            CmMessage::Drep(m) => self.on_drep(now, from, &m),
            CmMessage::SidrReq(m) => self.on_sidr_req(from, *m),
            CmMessage::SidrRep(m) => self.on_sidr_rep(from, *m),
        }
    }

    /// The connection a message addresses: our comm ID `ours`, sent from
    /// the connection's peer, and — when the message names it and we know
    /// it — the sender's comm ID `theirs`.
    fn addressed(&self, from: Gid, ours: u32, theirs: Option<u32>) -> Option<ConnId> {
        let id = *self.index.by_comm_id.get(&ours)?;
        let c = self.conns.get(&id)?;
        if c.peer != from {
            return None;
        }
        match theirs {
            Some(theirs) if c.remote_comm_id != 0 && c.remote_comm_id != theirs => None,
            _ => Some(id),
        }
    }

    fn on_req(&mut self, now: Instant, from: Gid, req: Req) {
        if req.local_comm_id == 0 || req.local_qpn > MAX_24BIT || req.starting_psn > MAX_24BIT {
            self.out.drop_msg(DropReason::Malformed);
            return;
        }
        let remote_key = (req.local_ca_guid, req.local_comm_id);
        if let Some(&id) = self.index.by_remote_id.get(&remote_key) {
            self.on_duplicate_req(id);
            return;
        }
        if let Some(&old) = self
            .index
            .by_remote_qpn
            .get(&(req.local_ca_guid, req.local_qpn))
        {
            // A new REQ from a QP we still hold a connection with: that
            // connection is stale (IBA 12.9.8.3.1).
            self.out.send(
                from,
                rej_reply(
                    req.tid,
                    req.local_comm_id,
                    MsgResponse::Req,
                    RejReason::StaleConn,
                ),
            );
            if self.state(old) == Some(ConnState::Established) {
                self.send_dreq(now, old, CmBytes::empty());
            }
            return;
        }
        let Some(&listen) = self.listen_by_service.get(&req.service_id) else {
            self.out.send(
                from,
                rej_reply(
                    req.tid,
                    req.local_comm_id,
                    MsgResponse::Req,
                    RejReason::InvalidServiceId,
                ),
            );
            return;
        };
        if self.out.events.len() >= self.config.max_queued_events
            || self.half_open >= self.config.max_half_open
        {
            self.out.drop_msg(DropReason::Overloaded);
            return;
        }
        let Some(l) = self.listeners.get(&listen) else {
            return;
        };
        if l.pending >= l.backlog {
            // As the kernel's ucma: no REJ, so the REQ's resends may find
            // room later.
            self.out.drop_msg(DropReason::BacklogFull);
            return;
        }
        let Some(local_comm_id) = self.alloc_comm_id() else {
            self.out.send(
                from,
                rej_reply(
                    req.tid,
                    req.local_comm_id,
                    MsgResponse::Req,
                    RejReason::NoResources,
                ),
            );
            return;
        };
        let id = ConnId(self.handle());
        let mut c = Conn::new(Role::Passive, ConnState::ReqRcvd, from);
        c.local_comm_id = local_comm_id;
        c.remote_comm_id = req.local_comm_id;
        c.remote_ca_guid = req.local_ca_guid;
        c.tid = req.tid;
        c.service_id = req.service_id;
        c.remote_qpn = req.local_qpn;
        c.packet_life = req.primary.local_ack_timeout.saturating_sub(1);
        c.peer_response = req.local_cm_response_timeout;
        c.own_response = req.remote_cm_response_timeout;
        c.max_retries = req.max_cm_retries.min(MAX_CM_RETRIES);
        c.remote_indexed = true;
        c.pending_in = Some(listen);
        c.half_open = true;
        // The peer gives up after its response wait; an MRA half-way
        // through it keeps the peer waiting while the user decides.
        c.deadline = Some(now + iba_time(c.own_response) / 2);
        self.index.by_comm_id.insert(local_comm_id, id);
        self.index.by_remote_id.insert(remote_key, id);
        self.index
            .by_remote_qpn
            .insert((req.local_ca_guid, req.local_qpn), id);
        self.conns.insert(id, c);
        self.half_open += 1;
        if let Some(l) = self.listeners.get_mut(&listen) {
            l.pending += 1;
        }
        self.out.emit(CmEvent::ConnectRequest {
            listen,
            conn: id,
            peer: from,
            req: Box::new(req),
        });
    }

    /// A REQ again: the peer's timer ran out before our answer came.
    fn on_duplicate_req(&mut self, id: ConnId) {
        self.out.stats.duplicates += 1;
        let mra_service_timeout = self.config.mra_service_timeout;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let peer = c.peer;
        match c.state {
            ConnState::ReqRcvd => {
                // The user has not decided yet: ask the peer to wait now
                // rather than at the MRA timer (rdma_cm's delayed MRA).
                c.state = ConnState::MraReqSent;
                c.deadline = None;
                let mra = mra_for(c, MsgResponse::Req, mra_service_timeout);
                c.reply = Some(mra.clone());
                self.out.send(peer, mra);
            }
            ConnState::MraReqSent => {
                if let Some(mra) = c.reply.clone() {
                    self.out.resend(peer, mra);
                }
            }
            ConnState::RepSent | ConnState::MraRepRcvd => {
                // Our REP was lost: send it again now (its timer and
                // retry budget are left as they are).
                if let Some(rep) = c.resend.as_ref().map(|r| r.msg.clone()) {
                    self.out.resend(peer, rep);
                }
            }
            _ => self.out.drop_msg(DropReason::Duplicate),
        }
    }

    fn on_mra(&mut self, now: Instant, from: Gid, mra: &Mra) {
        let theirs = (mra.message_mraed != MsgResponse::Req).then_some(mra.local_comm_id);
        let Some(id) = self.addressed(from, mra.remote_comm_id, theirs) else {
            self.out.drop_msg(DropReason::UnknownConn);
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let next = match (c.state, mra.message_mraed) {
            (ConnState::ReqSent, MsgResponse::Req) => ConnState::MraReqRcvd,
            (ConnState::RepSent, MsgResponse::Rep) => ConnState::MraRepRcvd,
            (ConnState::MraReqRcvd | ConnState::MraRepRcvd, _) => {
                self.out.stats.duplicates += 1;
                self.out.drop_msg(DropReason::Duplicate);
                return;
            }
            _ => {
                self.out.drop_msg(DropReason::WrongState);
                return;
            }
        };
        // Wait the service time the peer asks for, plus a round trip, for
        // this and the remaining resends (as the kernel's ib_modify_mad).
        let wait = iba_time(mra.service_timeout) + 2 * iba_time(c.packet_life);
        c.state = next;
        c.deadline = Some(now + wait);
        if let Some(r) = c.resend.as_mut() {
            r.interval = wait;
        }
    }

    fn on_rej(&mut self, now: Instant, from: Gid, rej: Rej) {
        let id = if rej.reason == RejReason::Timeout && rej.ari.as_slice().len() >= 8 {
            // The active side gave up on its REQ: it names itself by its
            // CA GUID and comm ID, as it may not know ours.
            let mut guid = [0u8; 8];
            guid.copy_from_slice(&rej.ari.as_slice()[..8]);
            self.index
                .by_remote_id
                .get(&(u64::from_be_bytes(guid), rej.local_comm_id))
                .copied()
                .filter(|id| self.conns.get(id).is_some_and(|c| c.peer == from))
        } else {
            let theirs = (rej.message_rejected != MsgResponse::Req).then_some(rej.local_comm_id);
            self.addressed(from, rej.remote_comm_id, theirs)
        };
        let Some(id) = id else {
            self.out.drop_msg(DropReason::UnknownConn);
            return;
        };
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        match c.state {
            ConnState::ReqSent
            | ConnState::MraReqRcvd
            | ConnState::RepSent
            | ConnState::MraRepRcvd
            | ConnState::ReqRcvd
            | ConnState::MraReqSent => {
                if rej.reason == RejReason::StaleConn {
                    self.enter_timewait(now, id);
                } else {
                    self.go_idle(id);
                }
                self.release_half_open(id);
            }
            ConnState::DreqSent
            | ConnState::RepRcvd
            | ConnState::MraRepSent
            | ConnState::Established => self.enter_timewait(now, id),
            _ => {
                self.out.drop_msg(DropReason::WrongState);
                return;
            }
        }
        self.out.emit(CmEvent::Rejected {
            conn: id,
            reason: rej.reason,
            private_data: rej.private_data,
        });
    }

    fn on_rep(&mut self, now: Instant, from: Gid, rep: Rep) {
        if rep.local_comm_id == 0 || rep.local_qpn > MAX_24BIT || rep.starting_psn > MAX_24BIT {
            self.out.drop_msg(DropReason::Malformed);
            return;
        }
        let Some(id) = self.addressed(from, rep.remote_comm_id, Some(rep.local_comm_id)) else {
            self.out.drop_msg(DropReason::UnknownConn);
            return;
        };
        let mra_service_timeout = self.config.mra_service_timeout;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.state {
            ConnState::ReqSent | ConnState::MraReqRcvd => {}
            ConnState::RepRcvd => {
                // The user has not established yet and the peer resends:
                // ask it to wait.
                self.out.stats.duplicates += 1;
                c.state = ConnState::MraRepSent;
                c.deadline = None;
                let mra = mra_for(c, MsgResponse::Rep, mra_service_timeout);
                c.reply = Some(mra.clone());
                self.out.send(from, mra);
                return;
            }
            ConnState::MraRepSent | ConnState::Established if c.role == Role::Active => {
                // Our MRA or RTU was lost: send it again.
                self.out.stats.duplicates += 1;
                if let Some(reply) = c.reply.clone() {
                    self.out.resend(from, reply);
                }
                return;
            }
            _ => {
                self.out.drop_msg(DropReason::WrongState);
                return;
            }
        }
        if self
            .index
            .by_remote_id
            .contains_key(&(rep.local_ca_guid, rep.local_comm_id))
        {
            self.out.drop_msg(DropReason::Duplicate);
            return;
        }
        if let Some(&old) = self
            .index
            .by_remote_qpn
            .get(&(rep.local_ca_guid, rep.local_qpn))
        {
            let mut rej = rej_reply(
                rep.tid,
                rep.local_comm_id,
                MsgResponse::Rep,
                RejReason::StaleConn,
            );
            if let CmMessage::Rej(r) = &mut rej {
                r.local_comm_id = rep.remote_comm_id;
            }
            self.out.send(from, rej);
            if self.state(old) == Some(ConnState::Established) {
                self.send_dreq(now, old, CmBytes::empty());
            }
            self.go_idle(id);
            self.out.emit(CmEvent::Rejected {
                conn: id,
                reason: RejReason::StaleConn,
                private_data: CmBytes::empty(),
            });
            return;
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.remote_comm_id = rep.local_comm_id;
        c.remote_ca_guid = rep.local_ca_guid;
        c.remote_qpn = rep.local_qpn;
        c.ack_delay = rep.target_ack_delay;
        c.remote_indexed = true;
        c.state = ConnState::RepRcvd;
        c.resend = None;
        c.deadline = Some(now + iba_time(c.own_response) / 2);
        self.index
            .by_remote_id
            .insert((rep.local_ca_guid, rep.local_comm_id), id);
        self.index
            .by_remote_qpn
            .insert((rep.local_ca_guid, rep.local_qpn), id);
        self.out.emit(CmEvent::ConnectResponse {
            conn: id,
            response: Box::new(ConnectResponse {
                remote_qpn: rep.local_qpn,
                remote_starting_psn: rep.starting_psn,
                responder_resources: rep.initiator_depth,
                initiator_depth: rep.responder_resources,
                rnr_retry_count: rep.rnr_retry_count,
                target_ack_delay: rep.target_ack_delay,
                srq: rep.srq,
                flow_control: rep.flow_control,
                remote_ca_guid: rep.local_ca_guid,
                private_data: rep.private_data,
            }),
        });
    }

    fn on_rtu(&mut self, from: Gid, rtu: &Rtu) {
        let Some(id) = self.addressed(from, rtu.remote_comm_id, Some(rtu.local_comm_id)) else {
            self.out.drop_msg(DropReason::UnknownConn);
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.role != Role::Passive || !matches!(c.state, ConnState::RepSent | ConnState::MraRepRcvd)
        {
            self.out.stats.duplicates += 1;
            self.out.drop_msg(DropReason::Duplicate);
            return;
        }
        c.state = ConnState::Established;
        c.stop_timer();
        self.release_half_open(id);
        self.out.emit(CmEvent::Established { conn: id });
    }

    fn on_dreq(&mut self, now: Instant, from: Gid, dreq: Dreq) {
        let id = self
            .addressed(from, dreq.remote_comm_id, Some(dreq.local_comm_id))
            .filter(|id| self.conns.get(id).is_some_and(|c| c.remote_comm_id != 0));
        let Some(id) = id else {
            // Answer anyway, so a peer whose DREP was lost after we freed
            // the connection stops resending (as the kernel's CM does).
            self.out.drop_msg(DropReason::UnknownConn);
            self.out.send(
                from,
                CmMessage::Drep(Box::new(Drep {
                    tid: dreq.tid,
                    local_comm_id: dreq.remote_comm_id,
                    remote_comm_id: dreq.local_comm_id,
                    private_data: CmBytes::empty(),
                })),
            );
            return;
        };
        if self
            .conns
            .get(&id)
            .is_some_and(|c| c.local_qpn != dreq.remote_qpn)
        {
            // The IDs are ours but the QP is not: not for this connection.
            self.out.drop_msg(DropReason::Malformed);
            return;
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.state {
            ConnState::RepSent
            | ConnState::MraRepRcvd
            | ConnState::Established
            | ConnState::DreqSent => {
                let drep = CmMessage::Drep(Box::new(Drep {
                    tid: dreq.tid,
                    local_comm_id: c.local_comm_id,
                    remote_comm_id: c.remote_comm_id,
                    private_data: CmBytes::empty(),
                }));
                c.reply = Some(drep.clone());
                self.out.send(from, drep);
                self.enter_timewait(now, id);
                self.release_half_open(id);
                let pd = CmBytes::new(dreq.private_data.as_slice()).unwrap_or_default();
                self.report_disconnect(id, pd);
            }
            ConnState::TimeWait => {
                self.out.stats.duplicates += 1;
                let drep = match &c.reply {
                    Some(reply @ CmMessage::Drep(_)) => reply.clone(),
                    _ => CmMessage::Drep(Box::new(Drep {
                        tid: dreq.tid,
                        local_comm_id: c.local_comm_id,
                        remote_comm_id: c.remote_comm_id,
                        private_data: CmBytes::empty(),
                    })),
                };
                self.out.resend(from, drep);
            }
            _ => self.out.drop_msg(DropReason::WrongState),
        }
    }

    fn on_drep(&mut self, now: Instant, from: Gid, drep: &Drep) {
        let Some(id) = self.addressed(from, drep.remote_comm_id, Some(drep.local_comm_id)) else {
            self.out.drop_msg(DropReason::UnknownConn);
            return;
        };
        if self.state(id) != Some(ConnState::DreqSent) {
            self.out.stats.duplicates += 1;
            self.out.drop_msg(DropReason::Duplicate);
            return;
        }
        self.enter_timewait(now, id);
        self.report_disconnect(id, drep.private_data);
    }

    fn on_sidr_req(&mut self, from: Gid, req: SidrReq) {
        if self
            .index
            .sidr_by_remote
            .contains_key(&(from, req.request_id))
        {
            self.out.stats.duplicates += 1;
            self.out.drop_msg(DropReason::Duplicate);
            return;
        }
        let sidr_rep = |status| {
            CmMessage::SidrRep(Box::new(SidrRep {
                tid: req.tid,
                request_id: req.request_id,
                status,
                qpn: 0,
                service_id: req.service_id,
                qkey: 0,
                additional_info: CmBytes::<ADDITIONAL_INFO>::empty(),
                private_data: CmBytes::empty(),
            }))
        };
        let Some(&listen) = self.listen_by_service.get(&req.service_id) else {
            self.out.send(from, sidr_rep(SidrStatus::Unsupported));
            return;
        };
        if self.out.events.len() >= self.config.max_queued_events
            || self.half_open >= self.config.max_half_open
        {
            self.out.drop_msg(DropReason::Overloaded);
            return;
        }
        let Some(l) = self.listeners.get_mut(&listen) else {
            return;
        };
        if l.pending >= l.backlog {
            // The kernel's CM answers a SIDR_REQ its user refused so.
            self.out.drop_msg(DropReason::BacklogFull);
            self.out.send(from, sidr_rep(SidrStatus::Reject));
            return;
        }
        l.pending += 1;
        let id = ConnId(self.handle());
        let mut c = Conn::new(Role::Passive, ConnState::SidrReqRcvd, from);
        c.remote_comm_id = req.request_id;
        c.tid = req.tid;
        c.service_id = req.service_id;
        c.sidr_indexed = true;
        c.pending_in = Some(listen);
        c.half_open = true;
        self.index.sidr_by_remote.insert((from, req.request_id), id);
        self.conns.insert(id, c);
        self.half_open += 1;
        self.out.emit(CmEvent::SidrRequest {
            listen,
            conn: id,
            peer: from,
            service_id: req.service_id,
            pkey: req.pkey,
            private_data: req.private_data,
        });
    }

    fn on_sidr_rep(&mut self, from: Gid, rep: SidrRep) {
        let Some(id) = self.addressed(from, rep.request_id, None) else {
            self.out.drop_msg(DropReason::UnknownConn);
            return;
        };
        if self.state(id) != Some(ConnState::SidrReqSent) {
            self.out.drop_msg(DropReason::WrongState);
            return;
        }
        self.go_idle(id);
        self.out.emit(CmEvent::SidrReply {
            conn: id,
            status: rep.status,
            qpn: rep.qpn,
            qkey: rep.qkey,
            private_data: rep.private_data,
        });
    }
}

/// A REJ on a connection.
fn rej_for(
    c: &Conn,
    rejected: MsgResponse,
    reason: RejReason,
    private_data: CmBytes<REJ_PRIVATE_DATA>,
) -> CmMessage {
    CmMessage::Rej(Box::new(Rej {
        tid: c.tid,
        local_comm_id: c.local_comm_id,
        remote_comm_id: c.remote_comm_id,
        message_rejected: rejected,
        reason,
        ari: CmBytes::empty(),
        private_data,
    }))
}

/// A REJ answering a message no connection holds: the IDs swapped from it.
fn rej_reply(tid: u64, their_comm_id: u32, rejected: MsgResponse, reason: RejReason) -> CmMessage {
    CmMessage::Rej(Box::new(Rej {
        tid,
        local_comm_id: 0,
        remote_comm_id: their_comm_id,
        message_rejected: rejected,
        reason,
        ari: CmBytes::empty(),
        private_data: CmBytes::empty(),
    }))
}

fn mra_for(c: &Conn, mraed: MsgResponse, service_timeout: u8) -> CmMessage {
    CmMessage::Mra(Box::new(Mra {
        tid: c.tid,
        local_comm_id: c.local_comm_id,
        remote_comm_id: c.remote_comm_id,
        message_mraed: mraed,
        service_timeout: service_timeout.min(31),
        private_data: CmBytes::empty(),
    }))
}
