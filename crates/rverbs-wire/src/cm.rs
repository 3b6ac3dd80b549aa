//! Communication Management messages (IBA vol. 1 §12.6), as the 232 data
//! bytes of a CM MAD ([`crate::mad`]).
//!
//! Each message is a view over the MAD data — [`CmReq`], [`CmMra`],
//! [`CmRej`], [`CmRep`], [`CmRtu`], [`CmDreq`], [`CmDrep`], [`CmLap`],
//! [`CmApr`], [`CmSidrReq`], [`CmSidrRep`] — with a getter and a setter for
//! every field at the byte and bit offsets of the spec's message tables
//! (Tables 106–120; ECE's vendor IDs from IBA 1.4). Offsets below count
//! from the start of the data, as the tables do; `Byte[Bit]` counts bits from
//! the most significant (bit 0 is 0x80). The messages a connection needs
//! have a `…Repr` with `parse` and `emit`, and [`CmMessageRepr`] /
//! [`CmMadRepr`] parse a whole CM MAD by its attribute ID.
//!
//! Parsing never panics: a buffer shorter than 232 bytes is
//! [`Error::Truncated`], a reserved value in a field
//! a `Repr` types (MRA's message MRAed, REJ's message rejected, a reject or
//! SIDR information length over 72) is
//! [`Error::InvalidField`]. Reserved bits are
//! ignored when read and zeroed by `emit`.
//!
//! REQ (Table 106):
//!
//! ```text
//!   0..4   local communication ID
//!   5..8   ECE vendor ID (24)
//!   8..16  service ID
//!  16..24  local CA GUID
//!  28..32  local Q_Key
//!  32..35  local QPN                       35  responder resources
//!  36..39  local EECN                      39  initiator depth
//!  40..43  remote EECN
//!  43      remote CM response timeout[0..5] transport service type[5..7]
//!          end-to-end flow control[7]
//!  44..47  starting PSN
//!  47      local CM response timeout[0..5] retry count[5..8]
//!  48..50  partition key
//!  50      path MTU[0..4] RDC exists[4] RNR retry count[5..8]
//!  51      max CM retries[0..4] SRQ[4] extended transport type[5..8]
//!  52..96  primary path (see CmReqPath)
//!  96..140 alternate path; 139[5] SAP supported
//! 140..232 private data (92)
//! ```

use crate::bytes::{get_u16, set_u16, set_u32};
use crate::macros::{header_view, wire_areas, wire_fields};
use crate::mad::{cm_attr, Mad, MadRepr, CM_CLASS_VERSION, MAD_DATA_LEN, MGMT_CLASS_CM};
use crate::{Error, Psn, Result};

/// Length of every CM message: the MAD data area.
pub const CM_MSG_LEN: usize = MAD_DATA_LEN;

/// REQ transport service type: Reliable Connection.
pub const TRANSPORT_SERVICE_RC: u8 = 0;
/// REQ transport service type: Unreliable Connection.
pub const TRANSPORT_SERVICE_UC: u8 = 1;
/// REQ transport service type: Reliable Datagram.
pub const TRANSPORT_SERVICE_RD: u8 = 2;
/// REQ transport service type: see the extended transport type.
pub const TRANSPORT_SERVICE_EXTENDED: u8 = 3;
/// REQ extended transport type: XRC.
pub const EXTENDED_TRANSPORT_XRC: u8 = 1;

/// Length of a reject's additional rejection information, an APR's and a
/// SIDR_REP's additional information.
pub const ADDITIONAL_INFO_LEN: usize = 72;

fn check_msg_len(got: usize) -> Result<()> {
    if got < CM_MSG_LEN {
        Err(Error::Truncated {
            needed: CM_MSG_LEN,
            got,
        })
    } else {
        Ok(())
    }
}

fn copy_area<const N: usize>(from: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(from);
    a
}

// ---------------------------------------------------------------- REQ paths

/// Length of one path in a REQ.
pub const CM_REQ_PATH_LEN: usize = 44;
/// Where the REQ's primary path starts.
pub const CM_REQ_PRIMARY_PATH: usize = 52;
/// Where the REQ's alternate path starts.
pub const CM_REQ_ALTERNATE_PATH: usize = 96;

header_view! {
    /// A view of one of a REQ's two paths (44 bytes; offsets from the path's
    /// start, which is REQ byte 52 for the primary and 96 for the alternate):
    ///
    /// ```text
    ///  0..2   local port LID           2..4  remote port LID
    ///  4..20  local port GID          20..36 remote port GID
    /// 36..39  flow label[0..20]       39     packet rate[2..8]
    /// 40      traffic class           41     hop limit
    /// 42      SL[0..4] subnet local[4]
    /// 43      local ACK timeout[0..5]
    /// ```
    CmReqPath, CM_REQ_PATH_LEN
}

wire_fields! { CmReqPath {
    /// Local port LID (0xFFFF, the permissive LID, off the local subnet; on RoCE a GID routes).
    local_lid / set_local_lid: u16 @ 0;
    /// Remote port LID.
    remote_lid / set_remote_lid: u16 @ 2;
    /// Local port GID.
    local_gid / set_local_gid: gid @ 4;
    /// Remote port GID.
    remote_gid / set_remote_gid: gid @ 20;
    /// Flow label (20 bits).
    flow_label / set_flow_label: hi20 @ 36;
    /// Static rate (6 bits, the IBA rate encoding).
    packet_rate / set_packet_rate: bits[2, 6] @ 39;
    /// Traffic class.
    traffic_class / set_traffic_class: u8 @ 40;
    /// Hop limit.
    hop_limit / set_hop_limit: u8 @ 41;
    /// Service level (4 bits).
    sl / set_sl: bits[0, 4] @ 42;
    /// The path stays within the local subnet.
    subnet_local / set_subnet_local: flag[4] @ 42;
    /// Local ACK timeout (5 bits, 4.096 µs × 2^n).
    local_ack_timeout / set_local_ack_timeout: bits[0, 5] @ 43;
}}

/// A REQ path's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmReqPathRepr {
    /// Local port LID.
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits).
    pub local_ack_timeout: u8,
}

impl CmReqPathRepr {
    /// Reads a view.
    pub fn parse<T: AsRef<[u8]>>(p: &CmReqPath<T>) -> Result<Self> {
        p.check_len()?;
        Ok(CmReqPathRepr {
            local_lid: p.local_lid(),
            remote_lid: p.remote_lid(),
            local_gid: p.local_gid(),
            remote_gid: p.remote_gid(),
            flow_label: p.flow_label(),
            packet_rate: p.packet_rate(),
            traffic_class: p.traffic_class(),
            hop_limit: p.hop_limit(),
            sl: p.sl(),
            subnet_local: p.subnet_local(),
            local_ack_timeout: p.local_ack_timeout(),
        })
    }

    /// Writes every field. Bits outside the fields keep their value (a REQ
    /// keeps its SAP-supported bit in the alternate path's last byte);
    /// [`CmReqRepr::emit`] zeroes them first.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut CmReqPath<T>) {
        p.set_local_lid(self.local_lid);
        p.set_remote_lid(self.remote_lid);
        p.set_local_gid(self.local_gid);
        p.set_remote_gid(self.remote_gid);
        p.set_flow_label(self.flow_label);
        p.set_packet_rate(self.packet_rate);
        p.set_traffic_class(self.traffic_class);
        p.set_hop_limit(self.hop_limit);
        p.set_sl(self.sl);
        p.set_subnet_local(self.subnet_local);
        p.set_local_ack_timeout(self.local_ack_timeout);
    }
}

// ---------------------------------------------------------------- REQ

header_view! {
    /// A view of a REQ (ConnectRequest, Table 106) over the MAD data.
    CmReq, CM_MSG_LEN
}

wire_fields! { CmReq {
    /// Local communication ID: the sender's ID for this connection.
    local_comm_id / set_local_comm_id: u32 @ 0;
    /// ECE vendor ID (24 bits; 0 without Enhanced Connection Establishment).
    vendor_id / set_vendor_id: u24 @ 5;
    /// Service ID the connection is for (see [`crate::ip_cm`]).
    service_id / set_service_id: u64 @ 8;
    /// Local CA GUID.
    local_ca_guid / set_local_ca_guid: u64 @ 16;
    /// Local Q_Key (RD only).
    local_qkey / set_local_qkey: u32 @ 28;
    /// Local QP number (24 bits).
    local_qpn / set_local_qpn: u24 @ 32;
    /// Responder resources: RDMA READs and atomics the sender accepts at once.
    responder_resources / set_responder_resources: u8 @ 35;
    /// Local EE context number (24 bits; RD only).
    local_eecn / set_local_eecn: u24 @ 36;
    /// Initiator depth: RDMA READs and atomics the sender issues at once.
    initiator_depth / set_initiator_depth: u8 @ 39;
    /// Remote EE context number (24 bits; RD only).
    remote_eecn / set_remote_eecn: u24 @ 40;
    /// Remote CM response timeout (5 bits, 4.096 µs × 2^n).
    remote_cm_response_timeout / set_remote_cm_response_timeout: bits[0, 5] @ 43;
    /// Transport service type (2 bits; [`TRANSPORT_SERVICE_RC`] …).
    transport_service_type / set_transport_service_type: bits[5, 2] @ 43;
    /// End-to-end flow control.
    end_to_end_flow_control / set_end_to_end_flow_control: flag[7] @ 43;
    /// Starting PSN: the one the sender's QP receives first, which the
    /// receiver's send queue starts at (as the Linux CM uses it).
    starting_psn / set_starting_psn: psn @ 44;
    /// Local CM response timeout (5 bits).
    local_cm_response_timeout / set_local_cm_response_timeout: bits[0, 5] @ 47;
    /// Retry count (3 bits).
    retry_count / set_retry_count: bits[5, 3] @ 47;
    /// Partition key.
    pkey / set_pkey: u16 @ 48;
    /// Path MTU (4 bits: 1 = 256 … 5 = 4096).
    path_mtu / set_path_mtu: bits[0, 4] @ 50;
    /// RDC exists (RD only).
    rdc_exists / set_rdc_exists: flag[4] @ 50;
    /// RNR retry count (3 bits; 7 is infinite).
    rnr_retry_count / set_rnr_retry_count: bits[5, 3] @ 50;
    /// Max CM retries (4 bits).
    max_cm_retries / set_max_cm_retries: bits[0, 4] @ 51;
    /// The sender's QP uses an SRQ.
    srq / set_srq: flag[4] @ 51;
    /// Extended transport type (3 bits; [`EXTENDED_TRANSPORT_XRC`]).
    extended_transport_type / set_extended_transport_type: bits[5, 3] @ 51;
    /// SAP supported (alternate path byte 43, bit 5).
    sap_supported / set_sap_supported: flag[5] @ 139;
}}

wire_areas! { CmReq {
    /// Private data (92 bytes; an rdma_cm REQ starts it with an
    /// [`IpCmHdr`](crate::ip_cm::IpCmHdr)).
    private_data / private_data_mut / PRIVATE_DATA_LEN @ 140, 92;
}}

impl<T: AsRef<[u8]>> CmReq<T> {
    /// The primary path.
    pub fn primary_path(&self) -> CmReqPath<&[u8]> {
        CmReqPath::new_unchecked(
            &self.buffer.as_ref()[CM_REQ_PRIMARY_PATH..CM_REQ_PRIMARY_PATH + CM_REQ_PATH_LEN],
        )
    }

    /// The alternate path (all zero when there is none).
    pub fn alternate_path(&self) -> CmReqPath<&[u8]> {
        CmReqPath::new_unchecked(
            &self.buffer.as_ref()[CM_REQ_ALTERNATE_PATH..CM_REQ_ALTERNATE_PATH + CM_REQ_PATH_LEN],
        )
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmReq<T> {
    /// The primary path, to write.
    pub fn primary_path_mut(&mut self) -> CmReqPath<&mut [u8]> {
        CmReqPath::new_unchecked(
            &mut self.buffer.as_mut()[CM_REQ_PRIMARY_PATH..CM_REQ_PRIMARY_PATH + CM_REQ_PATH_LEN],
        )
    }

    /// The alternate path, to write.
    pub fn alternate_path_mut(&mut self) -> CmReqPath<&mut [u8]> {
        CmReqPath::new_unchecked(
            &mut self.buffer.as_mut()
                [CM_REQ_ALTERNATE_PATH..CM_REQ_ALTERNATE_PATH + CM_REQ_PATH_LEN],
        )
    }

    fn clear(&mut self) {
        self.buffer.as_mut()[..CM_MSG_LEN].fill(0);
    }
}

/// A REQ's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmReqRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// ECE vendor ID (24 bits).
    pub vendor_id: u32,
    /// Service ID.
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits).
    pub transport_service_type: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN.
    pub starting_psn: Psn,
    /// Local CM response timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (4 bits).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits).
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary_path: CmReqPathRepr,
    /// Alternate path (all zero when there is none).
    pub alternate_path: CmReqPathRepr,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data.
    pub private_data: [u8; 92],
}

impl CmReqRepr {
    /// Reads a view.
    pub fn parse<T: AsRef<[u8]>>(m: &CmReq<T>) -> Result<Self> {
        m.check_len()?;
        Ok(CmReqRepr {
            local_comm_id: m.local_comm_id(),
            vendor_id: m.vendor_id(),
            service_id: m.service_id(),
            local_ca_guid: m.local_ca_guid(),
            local_qkey: m.local_qkey(),
            local_qpn: m.local_qpn(),
            responder_resources: m.responder_resources(),
            local_eecn: m.local_eecn(),
            initiator_depth: m.initiator_depth(),
            remote_eecn: m.remote_eecn(),
            remote_cm_response_timeout: m.remote_cm_response_timeout(),
            transport_service_type: m.transport_service_type(),
            end_to_end_flow_control: m.end_to_end_flow_control(),
            starting_psn: m.starting_psn(),
            local_cm_response_timeout: m.local_cm_response_timeout(),
            retry_count: m.retry_count(),
            pkey: m.pkey(),
            path_mtu: m.path_mtu(),
            rdc_exists: m.rdc_exists(),
            rnr_retry_count: m.rnr_retry_count(),
            max_cm_retries: m.max_cm_retries(),
            srq: m.srq(),
            extended_transport_type: m.extended_transport_type(),
            primary_path: CmReqPathRepr::parse(&m.primary_path())?,
            alternate_path: CmReqPathRepr::parse(&m.alternate_path())?,
            sap_supported: m.sap_supported(),
            private_data: copy_area(m.private_data()),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        CM_MSG_LEN
    }

    /// Writes the message; reserved bits become zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, m: &mut CmReq<T>) {
        m.clear();
        m.set_local_comm_id(self.local_comm_id);
        m.set_vendor_id(self.vendor_id);
        m.set_service_id(self.service_id);
        m.set_local_ca_guid(self.local_ca_guid);
        m.set_local_qkey(self.local_qkey);
        m.set_local_qpn(self.local_qpn);
        m.set_responder_resources(self.responder_resources);
        m.set_local_eecn(self.local_eecn);
        m.set_initiator_depth(self.initiator_depth);
        m.set_remote_eecn(self.remote_eecn);
        m.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        m.set_transport_service_type(self.transport_service_type);
        m.set_end_to_end_flow_control(self.end_to_end_flow_control);
        m.set_starting_psn(self.starting_psn);
        m.set_local_cm_response_timeout(self.local_cm_response_timeout);
        m.set_retry_count(self.retry_count);
        m.set_pkey(self.pkey);
        m.set_path_mtu(self.path_mtu);
        m.set_rdc_exists(self.rdc_exists);
        m.set_rnr_retry_count(self.rnr_retry_count);
        m.set_max_cm_retries(self.max_cm_retries);
        m.set_srq(self.srq);
        m.set_extended_transport_type(self.extended_transport_type);
        self.primary_path.emit(&mut m.primary_path_mut());
        self.alternate_path.emit(&mut m.alternate_path_mut());
        m.set_sap_supported(self.sap_supported);
        m.private_data_mut().copy_from_slice(&self.private_data);
    }
}

// ---------------------------------------------------------------- MRA

/// Which message an MRA or a REJ answers (the 2-bit "message MRAed" /
/// "message rejected" field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMsgRef {
    /// A REQ (0).
    Req,
    /// A REP (1).
    Rep,
    /// For an MRA a LAP, for a REJ "other" (2).
    Other,
}

impl CmMsgRef {
    /// The 2-bit code.
    pub const fn code(self) -> u8 {
        match self {
            CmMsgRef::Req => 0,
            CmMsgRef::Rep => 1,
            CmMsgRef::Other => 2,
        }
    }

    /// The variant for a code; 3 is reserved.
    pub fn from_code(code: u8, field: &'static str) -> Result<Self> {
        match code {
            0 => Ok(CmMsgRef::Req),
            1 => Ok(CmMsgRef::Rep),
            2 => Ok(CmMsgRef::Other),
            _ => Err(Error::InvalidField {
                field,
                value: code.into(),
            }),
        }
    }
}

header_view! {
    /// A view of an MRA (MsgRcptAck, Table 107) over the MAD data:
    /// communication IDs at 0 and 4, message MRAed at 8[0..2], service
    /// timeout at 9[0..5], private data at 10 (222 bytes).
    CmMra, CM_MSG_LEN
}

wire_fields! { CmMra {
    /// Local communication ID (the MRA sender's).
    local_comm_id / set_local_comm_id: u32 @ 0;
    /// Remote communication ID (the acknowledged message sender's).
    remote_comm_id / set_remote_comm_id: u32 @ 4;
    /// Message MRAed (2 bits: 0 REQ, 1 REP, 2 LAP).
    message_mraed / set_message_mraed: bits[0, 2] @ 8;
    /// Service timeout (5 bits, 4.096 µs × 2^n): how long the reply may take.
    service_timeout / set_service_timeout: bits[0, 5] @ 9;
}}

wire_areas! { CmMra {
    /// Private data (222 bytes).
    private_data / private_data_mut / PRIVATE_DATA_LEN @ 10, 222;
}}

/// An MRA's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMraRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// The message acknowledged ([`CmMsgRef::Other`] is a LAP).
    pub message_mraed: CmMsgRef,
    /// Service timeout (5 bits).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; 222],
}

impl CmMraRepr {
    /// Reads a view; a reserved "message MRAed" (3) is an error.
    pub fn parse<T: AsRef<[u8]>>(m: &CmMra<T>) -> Result<Self> {
        m.check_len()?;
        Ok(CmMraRepr {
            local_comm_id: m.local_comm_id(),
            remote_comm_id: m.remote_comm_id(),
            message_mraed: CmMsgRef::from_code(m.message_mraed(), "MRA message MRAed")?,
            service_timeout: m.service_timeout(),
            private_data: copy_area(m.private_data()),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        CM_MSG_LEN
    }

    /// Writes the message; reserved bits become zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, m: &mut CmMra<T>) {
        m.buffer.as_mut()[..CM_MSG_LEN].fill(0);
        m.set_local_comm_id(self.local_comm_id);
        m.set_remote_comm_id(self.remote_comm_id);
        m.set_message_mraed(self.message_mraed.code());
        m.set_service_timeout(self.service_timeout);
        m.private_data_mut().copy_from_slice(&self.private_data);
    }
}

// ---------------------------------------------------------------- REJ

macro_rules! rej_reasons {
    ($($(#[$doc:meta])* $name:ident = $code:literal,)*) => {
        /// Why a REJ rejects (IBA vol. 1 §12.6; the codes of the Linux kernel's
        /// `enum ib_cm_rej_reason`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum RejReason {
            $($(#[$doc])* $name,)*
            /// A code the table above does not list (never one it does).
            Other(u16),
        }

        impl RejReason {
            /// The 16-bit code on the wire.
            pub const fn code(self) -> u16 {
                match self {
                    $(RejReason::$name => $code,)*
                    RejReason::Other(code) => code,
                }
            }

            /// The reason for a code.
            pub const fn from_code(code: u16) -> Self {
                match code {
                    $($code => RejReason::$name,)*
                    other => RejReason::Other(other),
                }
            }
        }
    };
}

rej_reasons! {
    /// 1: no QP available.
    NoQp = 1,
    /// 2: no EE context available.
    NoEec = 2,
    /// 3: no resources available.
    NoResources = 3,
    /// 4: timeout.
    Timeout = 4,
    /// 5: unsupported request.
    Unsupported = 5,
    /// 6: invalid communication ID.
    InvalidCommId = 6,
    /// 7: invalid communication instance.
    InvalidCommInstance = 7,
    /// 8: invalid service ID (no listener).
    InvalidServiceId = 8,
    /// 9: invalid transport service type.
    InvalidTransportType = 9,
    /// 10: stale connection.
    StaleConn = 10,
    /// 11: RDC does not exist.
    RdcNotExist = 11,
    /// 12: primary remote port GID rejected.
    InvalidGid = 12,
    /// 13: primary remote port LID rejected.
    InvalidLid = 13,
    /// 14: primary SL rejected.
    InvalidSl = 14,
    /// 15: primary traffic class rejected.
    InvalidTrafficClass = 15,
    /// 16: primary hop limit rejected.
    InvalidHopLimit = 16,
    /// 17: primary packet rate rejected.
    InvalidPacketRate = 17,
    /// 18: alternate remote port GID rejected.
    InvalidAltGid = 18,
    /// 19: alternate remote port LID rejected.
    InvalidAltLid = 19,
    /// 20: alternate SL rejected.
    InvalidAltSl = 20,
    /// 21: alternate traffic class rejected.
    InvalidAltTrafficClass = 21,
    /// 22: alternate hop limit rejected.
    InvalidAltHopLimit = 22,
    /// 23: alternate packet rate rejected.
    InvalidAltPacketRate = 23,
    /// 24: port CM redirect.
    PortCmRedirect = 24,
    /// 25: port redirect.
    PortRedirect = 25,
    /// 26: invalid path MTU.
    InvalidMtu = 26,
    /// 27: insufficient responder resources.
    InsufficientRespResources = 27,
    /// 28: consumer defined (what `rdma_reject` sends).
    ConsumerDefined = 28,
    /// 29: invalid RNR retry count.
    InvalidRnrRetry = 29,
    /// 30: duplicate local communication ID.
    DuplicateLocalCommId = 30,
    /// 31: unsupported class version.
    InvalidClassVersion = 31,
    /// 32: invalid primary flow label.
    InvalidFlowLabel = 32,
    /// 33: invalid alternate flow label.
    InvalidAltFlowLabel = 33,
    /// 35: vendor option (ECE) not supported.
    VendorOptionNotSupported = 35,
}

header_view! {
    /// A view of a REJ (ConnectReject, Table 108) over the MAD data:
    /// communication IDs at 0 and 4, message rejected at 8[0..2], reject
    /// info length at 9[0..7], reason at 10..12, additional rejection
    /// information (ARI) at 12 (72 bytes), private data at 84 (148 bytes).
    CmRej, CM_MSG_LEN
}

wire_fields! { CmRej {
    /// Local communication ID (the rejecter's; 0 if it has none).
    local_comm_id / set_local_comm_id: u32 @ 0;
    /// Remote communication ID (the rejected message sender's).
    remote_comm_id / set_remote_comm_id: u32 @ 4;
    /// Message rejected (2 bits: 0 REQ, 1 REP, 2 other).
    message_rejected / set_message_rejected: bits[0, 2] @ 8;
    /// Reject info length: bytes of the ARI in use (7 bits).
    reject_info_length / set_reject_info_length: bits[0, 7] @ 9;
    /// Reason code ([`RejReason::code`]).
    reason / set_reason: u16 @ 10;
}}

wire_areas! { CmRej {
    /// Additional rejection information (72 bytes).
    ari / ari_mut / ARI_LEN @ 12, 72;
    /// Private data (148 bytes).
    private_data / private_data_mut / PRIVATE_DATA_LEN @ 84, 148;
}}

/// A REJ's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmRejRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// The message rejected.
    pub message_rejected: CmMsgRef,
    /// Bytes of `ari` in use (at most 72).
    pub ari_length: u8,
    /// Reason.
    pub reason: RejReason,
    /// Additional rejection information.
    pub ari: [u8; 72],
    /// Private data.
    pub private_data: [u8; 148],
}

impl CmRejRepr {
    /// Reads a view; a reserved "message rejected" (3) or a reject info
    /// length over 72 is an error.
    pub fn parse<T: AsRef<[u8]>>(m: &CmRej<T>) -> Result<Self> {
        m.check_len()?;
        let ari_length = m.reject_info_length();
        if usize::from(ari_length) > ADDITIONAL_INFO_LEN {
            return Err(Error::InvalidField {
                field: "REJ reject info length",
                value: ari_length.into(),
            });
        }
        Ok(CmRejRepr {
            local_comm_id: m.local_comm_id(),
            remote_comm_id: m.remote_comm_id(),
            message_rejected: CmMsgRef::from_code(m.message_rejected(), "REJ message rejected")?,
            ari_length,
            reason: RejReason::from_code(m.reason()),
            ari: copy_area(m.ari()),
            private_data: copy_area(m.private_data()),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        CM_MSG_LEN
    }

    /// Writes the message; reserved bits become zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, m: &mut CmRej<T>) {
        m.buffer.as_mut()[..CM_MSG_LEN].fill(0);
        m.set_local_comm_id(self.local_comm_id);
        m.set_remote_comm_id(self.remote_comm_id);
        m.set_message_rejected(self.message_rejected.code());
        m.set_reject_info_length(self.ari_length);
        m.set_reason(self.reason.code());
        m.ari_mut().copy_from_slice(&self.ari);
        m.private_data_mut().copy_from_slice(&self.private_data);
    }
}

// ---------------------------------------------------------------- REP

header_view! {
    /// A view of a REP (ConnectReply, Table 110) over the MAD data:
    ///
    /// ```text
    ///  0..4   local communication ID    4..8  remote communication ID
    ///  8..12  local Q_Key
    /// 12..15  local QPN                15     ECE vendor ID bits 23..16
    /// 16..19  local EECN               19     ECE vendor ID bits 15..8
    /// 20..23  starting PSN             23     ECE vendor ID bits 7..0
    /// 24      responder resources      25     initiator depth
    /// 26      target ACK delay[0..5] failover accepted[5..7]
    ///         end-to-end flow control[7]
    /// 27      RNR retry count[0..3] SRQ[3]
    /// 28..36  local CA GUID
    /// 36..232 private data (196)
    /// ```
    CmRep, CM_MSG_LEN
}

wire_fields! { CmRep {
    /// Local communication ID (the replier's).
    local_comm_id / set_local_comm_id: u32 @ 0;
    /// Remote communication ID (the requester's).
    remote_comm_id / set_remote_comm_id: u32 @ 4;
    /// Local Q_Key (RD only).
    local_qkey / set_local_qkey: u32 @ 8;
    /// Local QP number (24 bits).
    local_qpn / set_local_qpn: u24 @ 12;
    /// Local EE context number (24 bits; RD only).
    local_eecn / set_local_eecn: u24 @ 16;
    /// Starting PSN: the one the replier's QP receives first, which the
    /// active side's send queue starts at (as the Linux CM uses it).
    starting_psn / set_starting_psn: psn @ 20;
    /// Responder resources.
    responder_resources / set_responder_resources: u8 @ 24;
    /// Initiator depth.
    initiator_depth / set_initiator_depth: u8 @ 25;
    /// Target ACK delay (5 bits).
    target_ack_delay / set_target_ack_delay: bits[0, 5] @ 26;
    /// Failover accepted (2 bits: 0 accepted, 1 not supported, 2 rejected).
    failover_accepted / set_failover_accepted: bits[5, 2] @ 26;
    /// End-to-end flow control.
    end_to_end_flow_control / set_end_to_end_flow_control: flag[7] @ 26;
    /// RNR retry count (3 bits).
    rnr_retry_count / set_rnr_retry_count: bits[0, 3] @ 27;
    /// The replier's QP uses an SRQ.
    srq / set_srq: flag[3] @ 27;
    /// Local CA GUID.
    local_ca_guid / set_local_ca_guid: u64 @ 28;
}}

wire_areas! { CmRep {
    /// Private data (196 bytes).
    private_data / private_data_mut / PRIVATE_DATA_LEN @ 36, 196;
}}

impl<T: AsRef<[u8]>> CmRep<T> {
    /// ECE vendor ID (24 bits, in the bytes after the local QPN, the local
    /// EECN and the starting PSN).
    pub fn vendor_id(&self) -> u32 {
        let b = self.buffer.as_ref();
        (u32::from(b[15]) << 16) | (u32::from(b[19]) << 8) | u32::from(b[23])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmRep<T> {
    /// Sets the ECE vendor ID (low 24 bits).
    pub fn set_vendor_id(&mut self, id: u32) {
        let b = self.buffer.as_mut();
        b[15] = (id >> 16) as u8;
        b[19] = (id >> 8) as u8;
        b[23] = id as u8;
    }
}

/// A REP's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmRepRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// ECE vendor ID (24 bits).
    pub vendor_id: u32,
    /// Starting PSN.
    pub starting_psn: Psn,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; 196],
}

impl CmRepRepr {
    /// Reads a view.
    pub fn parse<T: AsRef<[u8]>>(m: &CmRep<T>) -> Result<Self> {
        m.check_len()?;
        Ok(CmRepRepr {
            local_comm_id: m.local_comm_id(),
            remote_comm_id: m.remote_comm_id(),
            local_qkey: m.local_qkey(),
            local_qpn: m.local_qpn(),
            local_eecn: m.local_eecn(),
            vendor_id: m.vendor_id(),
            starting_psn: m.starting_psn(),
            responder_resources: m.responder_resources(),
            initiator_depth: m.initiator_depth(),
            target_ack_delay: m.target_ack_delay(),
            failover_accepted: m.failover_accepted(),
            end_to_end_flow_control: m.end_to_end_flow_control(),
            rnr_retry_count: m.rnr_retry_count(),
            srq: m.srq(),
            local_ca_guid: m.local_ca_guid(),
            private_data: copy_area(m.private_data()),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        CM_MSG_LEN
    }

    /// Writes the message; reserved bits become zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, m: &mut CmRep<T>) {
        m.buffer.as_mut()[..CM_MSG_LEN].fill(0);
        m.set_local_comm_id(self.local_comm_id);
        m.set_remote_comm_id(self.remote_comm_id);
        m.set_local_qkey(self.local_qkey);
        m.set_local_qpn(self.local_qpn);
        m.set_local_eecn(self.local_eecn);
        m.set_vendor_id(self.vendor_id);
        m.set_starting_psn(self.starting_psn);
        m.set_responder_resources(self.responder_resources);
        m.set_initiator_depth(self.initiator_depth);
        m.set_target_ack_delay(self.target_ack_delay);
        m.set_failover_accepted(self.failover_accepted);
        m.set_end_to_end_flow_control(self.end_to_end_flow_control);
        m.set_rnr_retry_count(self.rnr_retry_count);
        m.set_srq(self.srq);
        m.set_local_ca_guid(self.local_ca_guid);
        m.private_data_mut().copy_from_slice(&self.private_data);
    }
}

// ------------------------------------------------- RTU, DREQ, DREP

header_view! {
    /// A view of an RTU (ReadyToUse, Table 111) over the MAD data:
    /// communication IDs at 0 and 4, private data at 8 (224 bytes).
    CmRtu, CM_MSG_LEN
}

wire_fields! { CmRtu {
    /// Local communication ID (the requester's).
    local_comm_id / set_local_comm_id: u32 @ 0;
    /// Remote communication ID (the replier's).
    remote_comm_id / set_remote_comm_id: u32 @ 4;
}}

wire_areas! { CmRtu {
    /// Private data (224 bytes).
    private_data / private_data_mut / PRIVATE_DATA_LEN @ 8, 224;
}}

header_view! {
    /// A view of a DREQ (DisconnectRequest, Table 112) over the MAD data:
    /// communication IDs at 0 and 4, remote QPN/EECN at 8..11, private data
    /// at 12 (220 bytes).
    CmDreq, CM_MSG_LEN
}

wire_fields! { CmDreq {
    /// Local communication ID (the disconnecter's).
    local_comm_id / set_local_comm_id: u32 @ 0;
    /// Remote communication ID.
    remote_comm_id / set_remote_comm_id: u32 @ 4;
    /// Remote QPN (or EECN; 24 bits): the receiver's QP being disconnected.
    remote_qpn / set_remote_qpn: u24 @ 8;
}}

wire_areas! { CmDreq {
    /// Private data (220 bytes).
    private_data / private_data_mut / PRIVATE_DATA_LEN @ 12, 220;
}}

header_view! {
    /// A view of a DREP (DisconnectReply, Table 113) over the MAD data:
    /// communication IDs at 0 and 4, private data at 8 (224 bytes).
    CmDrep, CM_MSG_LEN
}

wire_fields! { CmDrep {
    /// Local communication ID (the replier's).
    local_comm_id / set_local_comm_id: u32 @ 0;
    /// Remote communication ID (the disconnecter's).
    remote_comm_id / set_remote_comm_id: u32 @ 4;
}}

wire_areas! { CmDrep {
    /// Private data (224 bytes).
    private_data / private_data_mut / PRIVATE_DATA_LEN @ 8, 224;
}}

/// An RTU's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmRtuRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; 224],
}

/// A DREQ's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmDreqRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Remote QPN (24 bits).
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: [u8; 220],
}

/// A DREP's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmDrepRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; 224],
}

impl CmRtuRepr {
    /// Reads a view.
    pub fn parse<T: AsRef<[u8]>>(m: &CmRtu<T>) -> Result<Self> {
        m.check_len()?;
        Ok(CmRtuRepr {
            local_comm_id: m.local_comm_id(),
            remote_comm_id: m.remote_comm_id(),
            private_data: copy_area(m.private_data()),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        CM_MSG_LEN
    }

    /// Writes the message.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, m: &mut CmRtu<T>) {
        m.set_local_comm_id(self.local_comm_id);
        m.set_remote_comm_id(self.remote_comm_id);
        m.private_data_mut().copy_from_slice(&self.private_data);
    }
}

impl CmDreqRepr {
    /// Reads a view.
    pub fn parse<T: AsRef<[u8]>>(m: &CmDreq<T>) -> Result<Self> {
        m.check_len()?;
        Ok(CmDreqRepr {
            local_comm_id: m.local_comm_id(),
            remote_comm_id: m.remote_comm_id(),
            remote_qpn: m.remote_qpn(),
            private_data: copy_area(m.private_data()),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        CM_MSG_LEN
    }

    /// Writes the message; the reserved byte 11 becomes zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, m: &mut CmDreq<T>) {
        m.set_local_comm_id(self.local_comm_id);
        m.set_remote_comm_id(self.remote_comm_id);
        set_u32(m.buffer.as_mut(), 8, 0);
        m.set_remote_qpn(self.remote_qpn);
        m.private_data_mut().copy_from_slice(&self.private_data);
    }
}

impl CmDrepRepr {
    /// Reads a view.
    pub fn parse<T: AsRef<[u8]>>(m: &CmDrep<T>) -> Result<Self> {
        m.check_len()?;
        Ok(CmDrepRepr {
            local_comm_id: m.local_comm_id(),
            remote_comm_id: m.remote_comm_id(),
            private_data: copy_area(m.private_data()),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        CM_MSG_LEN
    }

    /// Writes the message.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, m: &mut CmDrep<T>) {
        m.set_local_comm_id(self.local_comm_id);
        m.set_remote_comm_id(self.remote_comm_id);
        m.private_data_mut().copy_from_slice(&self.private_data);
    }
}

// ---------------------------------------------------------------- LAP, APR

header_view! {
    /// A view of a LAP (LoadAlternatePath, Table 115) over the MAD data:
    ///
    /// ```text
    ///  0..4   local communication ID     4..8  remote communication ID
    /// 12..15  remote QPN/EECN           15     remote CM response timeout[0..5]
    /// 20..22  alternate local port LID  22..24 alternate remote port LID
    /// 24..40  alternate local port GID  40..56 alternate remote port GID
    /// 56..59  alternate flow label[0..20]
    /// 59      alternate traffic class   60     alternate hop limit
    /// 61      alternate packet rate[2..8]
    /// 62      alternate SL[0..4] alternate subnet local[4]
    /// 63      alternate local ACK timeout[0..5]
    /// 64..232 private data (168)
    /// ```
    CmLap, CM_MSG_LEN
}

wire_fields! { CmLap {
    /// Local communication ID.
    local_comm_id / set_local_comm_id: u32 @ 0;
    /// Remote communication ID.
    remote_comm_id / set_remote_comm_id: u32 @ 4;
    /// Remote QPN or EECN (24 bits).
    remote_qpn / set_remote_qpn: u24 @ 12;
    /// Remote CM response timeout (5 bits).
    remote_cm_response_timeout / set_remote_cm_response_timeout: bits[0, 5] @ 15;
    /// Alternate local port LID.
    alternate_local_lid / set_alternate_local_lid: u16 @ 20;
    /// Alternate remote port LID.
    alternate_remote_lid / set_alternate_remote_lid: u16 @ 22;
    /// Alternate local port GID.
    alternate_local_gid / set_alternate_local_gid: gid @ 24;
    /// Alternate remote port GID.
    alternate_remote_gid / set_alternate_remote_gid: gid @ 40;
    /// Alternate flow label (20 bits).
    alternate_flow_label / set_alternate_flow_label: hi20 @ 56;
    /// Alternate traffic class.
    alternate_traffic_class / set_alternate_traffic_class: u8 @ 59;
    /// Alternate hop limit.
    alternate_hop_limit / set_alternate_hop_limit: u8 @ 60;
    /// Alternate packet rate (6 bits).
    alternate_packet_rate / set_alternate_packet_rate: bits[2, 6] @ 61;
    /// Alternate SL (4 bits).
    alternate_sl / set_alternate_sl: bits[0, 4] @ 62;
    /// Alternate subnet local.
    alternate_subnet_local / set_alternate_subnet_local: flag[4] @ 62;
    /// Alternate local ACK timeout (5 bits).
    alternate_local_ack_timeout / set_alternate_local_ack_timeout: bits[0, 5] @ 63;
}}

wire_areas! { CmLap {
    /// Private data (168 bytes).
    private_data / private_data_mut / PRIVATE_DATA_LEN @ 64, 168;
}}

header_view! {
    /// A view of an APR (AlternatePathResponse, Table 116) over the MAD
    /// data: communication IDs at 0 and 4, additional information length at
    /// 8, AP status at 9, additional information at 12 (72 bytes), private
    /// data at 84 (148 bytes).
    CmApr, CM_MSG_LEN
}

wire_fields! { CmApr {
    /// Local communication ID.
    local_comm_id / set_local_comm_id: u32 @ 0;
    /// Remote communication ID.
    remote_comm_id / set_remote_comm_id: u32 @ 4;
    /// Bytes of the additional information in use.
    additional_info_length / set_additional_info_length: u8 @ 8;
    /// AP status (0 loaded; the kernel's `enum ib_cm_apr_status`).
    ap_status / set_ap_status: u8 @ 9;
}}

wire_areas! { CmApr {
    /// Additional information (72 bytes).
    additional_info / additional_info_mut / ADDITIONAL_INFO_LEN @ 12, 72;
    /// Private data (148 bytes).
    private_data / private_data_mut / PRIVATE_DATA_LEN @ 84, 148;
}}

// ---------------------------------------------------------------- SIDR

header_view! {
    /// A view of a SIDR_REQ (ServiceIDResReq, Table 119) over the MAD data:
    /// request ID at 0, partition key at 4, service ID at 8, private data at
    /// 16 (216 bytes).
    CmSidrReq, CM_MSG_LEN
}

wire_fields! { CmSidrReq {
    /// Request ID: the SIDR_REP echoes it.
    request_id / set_request_id: u32 @ 0;
    /// Partition key.
    pkey / set_pkey: u16 @ 4;
    /// Service ID to resolve.
    service_id / set_service_id: u64 @ 8;
}}

wire_areas! { CmSidrReq {
    /// Private data (216 bytes; rdma_cm starts it with an
    /// [`IpCmHdr`](crate::ip_cm::IpCmHdr)).
    private_data / private_data_mut / PRIVATE_DATA_LEN @ 16, 216;
}}

/// A SIDR_REQ's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmSidrReqRepr {
    /// Request ID.
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data.
    pub private_data: [u8; 216],
}

impl CmSidrReqRepr {
    /// Reads a view.
    pub fn parse<T: AsRef<[u8]>>(m: &CmSidrReq<T>) -> Result<Self> {
        m.check_len()?;
        Ok(CmSidrReqRepr {
            request_id: m.request_id(),
            pkey: m.pkey(),
            service_id: m.service_id(),
            private_data: copy_area(m.private_data()),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        CM_MSG_LEN
    }

    /// Writes the message; the reserved bytes 6..8 become zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, m: &mut CmSidrReq<T>) {
        m.set_request_id(self.request_id);
        m.set_pkey(self.pkey);
        set_u16(m.buffer.as_mut(), 6, 0);
        m.set_service_id(self.service_id);
        m.private_data_mut().copy_from_slice(&self.private_data);
    }
}

/// A SIDR_REP's status (the codes of the Linux kernel's
/// `enum ib_cm_sidr_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SidrStatus {
    /// 0: the QPN and Q_Key are valid.
    Success,
    /// 1: service ID not supported.
    Unsupported,
    /// 2: rejected by the service provider.
    Reject,
    /// 3: no QP available.
    NoQp,
    /// 4: redirect: the additional information holds a ClassPortInfo.
    Redirect,
    /// 5: unsupported class version.
    UnsupportedVersion,
    /// A code the table above does not list (never one it does).
    Other(u8),
}

impl SidrStatus {
    /// The 8-bit code on the wire.
    pub const fn code(self) -> u8 {
        match self {
            SidrStatus::Success => 0,
            SidrStatus::Unsupported => 1,
            SidrStatus::Reject => 2,
            SidrStatus::NoQp => 3,
            SidrStatus::Redirect => 4,
            SidrStatus::UnsupportedVersion => 5,
            SidrStatus::Other(code) => code,
        }
    }

    /// The status for a code.
    pub const fn from_code(code: u8) -> Self {
        match code {
            0 => SidrStatus::Success,
            1 => SidrStatus::Unsupported,
            2 => SidrStatus::Reject,
            3 => SidrStatus::NoQp,
            4 => SidrStatus::Redirect,
            5 => SidrStatus::UnsupportedVersion,
            other => SidrStatus::Other(other),
        }
    }
}

header_view! {
    /// A view of a SIDR_REP (ServiceIDResReqResp, Table 120) over the MAD
    /// data:
    ///
    /// ```text
    ///  0..4   request ID
    ///  4      status               5     additional information length
    ///  6..8   ECE vendor ID bits 23..8
    ///  8..11  QPN                 11     ECE vendor ID bits 7..0
    /// 12..20  service ID
    /// 20..24  Q_Key
    /// 24..96  class port info / additional information (72)
    /// 96..232 private data (136)
    /// ```
    CmSidrRep, CM_MSG_LEN
}

wire_fields! { CmSidrRep {
    /// Request ID of the SIDR_REQ answered.
    request_id / set_request_id: u32 @ 0;
    /// Status ([`SidrStatus::code`]).
    status / set_status: u8 @ 4;
    /// Bytes of the additional information in use.
    additional_info_length / set_additional_info_length: u8 @ 5;
    /// QP number of the service (24 bits).
    qpn / set_qpn: u24 @ 8;
    /// Service ID.
    service_id / set_service_id: u64 @ 12;
    /// Q_Key of the service's QP.
    qkey / set_qkey: u32 @ 20;
}}

wire_areas! { CmSidrRep {
    /// Additional information: a ClassPortInfo on redirect (72 bytes).
    additional_info / additional_info_mut / ADDITIONAL_INFO_LEN @ 24, 72;
    /// Private data (136 bytes).
    private_data / private_data_mut / PRIVATE_DATA_LEN @ 96, 136;
}}

impl<T: AsRef<[u8]>> CmSidrRep<T> {
    /// ECE vendor ID (24 bits: bytes 6..8 and 11).
    pub fn vendor_id(&self) -> u32 {
        let b = self.buffer.as_ref();
        (u32::from(get_u16(b, 6)) << 8) | u32::from(b[11])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmSidrRep<T> {
    /// Sets the ECE vendor ID (low 24 bits).
    pub fn set_vendor_id(&mut self, id: u32) {
        let b = self.buffer.as_mut();
        set_u16(b, 6, (id >> 8) as u16);
        b[11] = id as u8;
    }
}

/// A SIDR_REP's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmSidrRepRepr {
    /// Request ID.
    pub request_id: u32,
    /// Status.
    pub status: SidrStatus,
    /// Bytes of `additional_info` in use (at most 72).
    pub additional_info_length: u8,
    /// ECE vendor ID (24 bits).
    pub vendor_id: u32,
    /// QPN (24 bits).
    pub qpn: u32,
    /// Service ID.
    pub service_id: u64,
    /// Q_Key.
    pub qkey: u32,
    /// Additional information (a ClassPortInfo on redirect).
    pub additional_info: [u8; 72],
    /// Private data.
    pub private_data: [u8; 136],
}

impl CmSidrRepRepr {
    /// Reads a view; an additional information length over 72 is an error.
    pub fn parse<T: AsRef<[u8]>>(m: &CmSidrRep<T>) -> Result<Self> {
        m.check_len()?;
        let additional_info_length = m.additional_info_length();
        if usize::from(additional_info_length) > ADDITIONAL_INFO_LEN {
            return Err(Error::InvalidField {
                field: "SIDR_REP additional information length",
                value: additional_info_length.into(),
            });
        }
        Ok(CmSidrRepRepr {
            request_id: m.request_id(),
            status: SidrStatus::from_code(m.status()),
            additional_info_length,
            vendor_id: m.vendor_id(),
            qpn: m.qpn(),
            service_id: m.service_id(),
            qkey: m.qkey(),
            additional_info: copy_area(m.additional_info()),
            private_data: copy_area(m.private_data()),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        CM_MSG_LEN
    }

    /// Writes the message.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, m: &mut CmSidrRep<T>) {
        m.set_request_id(self.request_id);
        m.set_status(self.status.code());
        m.set_additional_info_length(self.additional_info_length);
        m.set_vendor_id(self.vendor_id);
        m.set_qpn(self.qpn);
        m.set_service_id(self.service_id);
        m.set_qkey(self.qkey);
        m.additional_info_mut()
            .copy_from_slice(&self.additional_info);
        m.private_data_mut().copy_from_slice(&self.private_data);
    }
}

// ------------------------------------------------- by attribute ID

/// One CM message, of any kind a connection uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessageRepr {
    /// ConnectRequest.
    Req(CmReqRepr),
    /// MsgRcptAck.
    Mra(CmMraRepr),
    /// ConnectReject.
    Rej(CmRejRepr),
    /// ConnectReply.
    Rep(CmRepRepr),
    /// ReadyToUse.
    Rtu(CmRtuRepr),
    /// DisconnectRequest.
    Dreq(CmDreqRepr),
    /// DisconnectReply.
    Drep(CmDrepRepr),
    /// ServiceIDResReq.
    SidrReq(CmSidrReqRepr),
    /// ServiceIDResReqResp.
    SidrRep(CmSidrRepRepr),
}

impl CmMessageRepr {
    /// The MAD attribute ID of this message.
    pub const fn attribute_id(&self) -> u16 {
        match self {
            CmMessageRepr::Req(_) => cm_attr::REQ,
            CmMessageRepr::Mra(_) => cm_attr::MRA,
            CmMessageRepr::Rej(_) => cm_attr::REJ,
            CmMessageRepr::Rep(_) => cm_attr::REP,
            CmMessageRepr::Rtu(_) => cm_attr::RTU,
            CmMessageRepr::Dreq(_) => cm_attr::DREQ,
            CmMessageRepr::Drep(_) => cm_attr::DREP,
            CmMessageRepr::SidrReq(_) => cm_attr::SIDR_REQ,
            CmMessageRepr::SidrRep(_) => cm_attr::SIDR_REP,
        }
    }

    /// Parses the MAD data `data` as the message `attribute_id` names.
    /// ClassPortInfo, LAP, APR and unknown attributes are
    /// [`Error::InvalidField`].
    pub fn parse(attribute_id: u16, data: &[u8]) -> Result<Self> {
        check_msg_len(data.len())?;
        Ok(match attribute_id {
            cm_attr::REQ => CmMessageRepr::Req(CmReqRepr::parse(&CmReq::new_unchecked(data))?),
            cm_attr::MRA => CmMessageRepr::Mra(CmMraRepr::parse(&CmMra::new_unchecked(data))?),
            cm_attr::REJ => CmMessageRepr::Rej(CmRejRepr::parse(&CmRej::new_unchecked(data))?),
            cm_attr::REP => CmMessageRepr::Rep(CmRepRepr::parse(&CmRep::new_unchecked(data))?),
            cm_attr::RTU => CmMessageRepr::Rtu(CmRtuRepr::parse(&CmRtu::new_unchecked(data))?),
            cm_attr::DREQ => CmMessageRepr::Dreq(CmDreqRepr::parse(&CmDreq::new_unchecked(data))?),
            cm_attr::DREP => CmMessageRepr::Drep(CmDrepRepr::parse(&CmDrep::new_unchecked(data))?),
            cm_attr::SIDR_REQ => {
                CmMessageRepr::SidrReq(CmSidrReqRepr::parse(&CmSidrReq::new_unchecked(data))?)
            }
            cm_attr::SIDR_REP => {
                CmMessageRepr::SidrRep(CmSidrRepRepr::parse(&CmSidrRep::new_unchecked(data))?)
            }
            other => {
                return Err(Error::InvalidField {
                    field: "CM attribute ID",
                    value: other.into(),
                })
            }
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        CM_MSG_LEN
    }

    /// Writes the message into the MAD data `data` (at least 232 bytes).
    ///
    /// # Panics
    ///
    /// If `data` is shorter than [`CM_MSG_LEN`], like the views' setters.
    pub fn emit(&self, data: &mut [u8]) {
        match self {
            CmMessageRepr::Req(r) => r.emit(&mut CmReq::new_unchecked(data)),
            CmMessageRepr::Mra(r) => r.emit(&mut CmMra::new_unchecked(data)),
            CmMessageRepr::Rej(r) => r.emit(&mut CmRej::new_unchecked(data)),
            CmMessageRepr::Rep(r) => r.emit(&mut CmRep::new_unchecked(data)),
            CmMessageRepr::Rtu(r) => r.emit(&mut CmRtu::new_unchecked(data)),
            CmMessageRepr::Dreq(r) => r.emit(&mut CmDreq::new_unchecked(data)),
            CmMessageRepr::Drep(r) => r.emit(&mut CmDrep::new_unchecked(data)),
            CmMessageRepr::SidrReq(r) => r.emit(&mut CmSidrReq::new_unchecked(data)),
            CmMessageRepr::SidrRep(r) => r.emit(&mut CmSidrRep::new_unchecked(data)),
        }
    }
}

/// A whole CM MAD: the header fields a CM message varies and the message.
/// Base version, management class, class version and attribute ID follow
/// from the kind of MAD and of message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMadRepr {
    /// Method byte ([`METHOD_SEND`](crate::mad::METHOD_SEND) for every message).
    pub method: u8,
    /// Status.
    pub status: u16,
    /// Class-specific field.
    pub class_specific: u16,
    /// Transaction ID.
    pub transaction_id: u64,
    /// Attribute modifier (ECE options, else 0).
    pub attribute_modifier: u32,
    /// The message.
    pub message: CmMessageRepr,
}

impl CmMadRepr {
    /// A message sent with method Send, status 0 and modifier 0.
    pub const fn send(transaction_id: u64, message: CmMessageRepr) -> Self {
        CmMadRepr {
            method: crate::mad::METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_modifier: 0,
            message,
        }
    }

    /// Parses a MAD (the UD payload, 256 bytes or more). Base version other
    /// than 1, a management class other than the CM's, a class version
    /// other than 2 and an attribute without a [`CmMessageRepr`] are
    /// [`Error::InvalidField`].
    pub fn parse(mad: &[u8]) -> Result<Self> {
        let mad = Mad::new_checked(mad)?;
        let hdr = MadRepr::parse(&mad)?;
        let expect = |field, value: u8, want: u8| {
            if value == want {
                Ok(())
            } else {
                Err(Error::InvalidField {
                    field,
                    value: value.into(),
                })
            }
        };
        expect(
            "MAD base version",
            hdr.base_version,
            crate::mad::BASE_VERSION,
        )?;
        expect("MAD management class", hdr.mgmt_class, MGMT_CLASS_CM)?;
        expect("CM class version", hdr.class_version, CM_CLASS_VERSION)?;
        Ok(CmMadRepr {
            method: hdr.method,
            status: hdr.status,
            class_specific: hdr.class_specific,
            transaction_id: hdr.transaction_id,
            attribute_modifier: hdr.attribute_modifier,
            message: CmMessageRepr::parse(hdr.attribute_id, mad.data())?,
        })
    }

    /// The MAD header this message goes out with.
    pub const fn header(&self) -> MadRepr {
        MadRepr {
            method: self.method,
            status: self.status,
            class_specific: self.class_specific,
            attribute_modifier: self.attribute_modifier,
            ..MadRepr::cm_send(self.message.attribute_id(), self.transaction_id)
        }
    }

    /// Bytes [`emit`](Self::emit) writes: a whole MAD.
    pub const fn buffer_len(&self) -> usize {
        crate::mad::MAD_LEN
    }

    /// Writes the whole MAD.
    ///
    /// # Panics
    ///
    /// If `mad` is shorter than [`MAD_LEN`](crate::mad::MAD_LEN).
    pub fn emit(&self, mad: &mut [u8]) {
        let mut view = Mad::new_unchecked(mad);
        self.header().emit(&mut view);
        self.message.emit(view.data_mut());
    }
}

// Binary literals below are grouped by field (`0b10100_01_1`: a 5-bit, a
// 2-bit and a 1-bit field), not by nibble.
#[cfg(test)]
#[allow(clippy::unusual_byte_groupings)]
mod tests {
    use super::*;

    fn pattern<const N: usize>(seed: u8) -> [u8; N] {
        core::array::from_fn(|i| seed.wrapping_add(i as u8))
    }

    fn gid_v4(a: [u8; 4]) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10..12].copy_from_slice(&[0xff, 0xff]);
        g[12..].copy_from_slice(&a);
        g
    }

    fn req_repr() -> CmReqRepr {
        CmReqRepr {
            local_comm_id: 0x1122_3344,
            vendor_id: 0x00_02c9,
            service_id: 0x0000_0000_0106_1c06,
            local_ca_guid: 0x0002_c903_00a1_b2c3,
            local_qkey: 0x0bad_f00d,
            local_qpn: 0x00_0123,
            responder_resources: 4,
            local_eecn: 0x00_0456,
            initiator_depth: 5,
            remote_eecn: 0x00_0789,
            remote_cm_response_timeout: 20,
            transport_service_type: TRANSPORT_SERVICE_UC,
            end_to_end_flow_control: true,
            starting_psn: Psn::new(0xab_cdef),
            local_cm_response_timeout: 18,
            retry_count: 7,
            pkey: 0xffff,
            path_mtu: 5,
            rdc_exists: false,
            rnr_retry_count: 6,
            max_cm_retries: 15,
            srq: true,
            extended_transport_type: EXTENDED_TRANSPORT_XRC,
            primary_path: CmReqPathRepr {
                local_lid: 0xffff,
                remote_lid: 0xfffe,
                local_gid: gid_v4([10, 0, 0, 1]),
                remote_gid: gid_v4([10, 0, 0, 2]),
                flow_label: 0xa_bcde,
                packet_rate: 3,
                traffic_class: 0x20,
                hop_limit: 64,
                sl: 3,
                subnet_local: false,
                local_ack_timeout: 14,
            },
            alternate_path: CmReqPathRepr {
                subnet_local: true,
                local_ack_timeout: 31,
                ..CmReqPathRepr::default()
            },
            sap_supported: true,
            private_data: pattern(0x80),
        }
    }

    /// REQ by Table 106's offsets (from the start of the MAD data).
    fn req_bytes() -> [u8; CM_MSG_LEN] {
        let mut b = [0u8; CM_MSG_LEN];
        b[0..4].copy_from_slice(&[0x11, 0x22, 0x33, 0x44]); // 0: local comm ID
        b[5..8].copy_from_slice(&[0x00, 0x02, 0xc9]); // 5: vendor ID (byte 4 reserved)
        b[8..16].copy_from_slice(&[0, 0, 0, 0, 0x01, 0x06, 0x1c, 0x06]); // 8: service ID
        b[16..24].copy_from_slice(&[0x00, 0x02, 0xc9, 0x03, 0x00, 0xa1, 0xb2, 0xc3]); // 16: CA GUID
        b[28..32].copy_from_slice(&[0x0b, 0xad, 0xf0, 0x0d]); // 28: local Q_Key (24..28 reserved)
        b[32..36].copy_from_slice(&[0x00, 0x01, 0x23, 4]); // 32: QPN, 35: responder resources
        b[36..40].copy_from_slice(&[0x00, 0x04, 0x56, 5]); // 36: local EECN, 39: initiator depth
        b[40..43].copy_from_slice(&[0x00, 0x07, 0x89]); // 40: remote EECN
        b[43] = 0b10100_01_1; // 43[0..5] remote CM timeout 20, [5..7] UC, [7] e2e flow control
        b[44..47].copy_from_slice(&[0xab, 0xcd, 0xef]); // 44: starting PSN
        b[47] = 0b10010_111; // 47[0..5] local CM timeout 18, [5..8] retry count 7
        b[48..50].copy_from_slice(&[0xff, 0xff]); // 48: P_Key
        b[50] = 0b0101_0_110; // 50[0..4] MTU 4096, [4] RDC exists, [5..8] RNR retry 6
        b[51] = 0b1111_1_001; // 51[0..4] max CM retries 15, [4] SRQ, [5..8] XRC
        b[52..56].copy_from_slice(&[0xff, 0xff, 0xff, 0xfe]); // 52, 54: primary LIDs
        b[56..72].copy_from_slice(&gid_v4([10, 0, 0, 1])); // 56: primary local GID
        b[72..88].copy_from_slice(&gid_v4([10, 0, 0, 2])); // 72: primary remote GID
        b[88..92].copy_from_slice(&[0xab, 0xcd, 0xe0, 0x03]); // 88[0..20] flow label, 91[2..8] rate
        b[92] = 0x20; // 92: traffic class
        b[93] = 64; // 93: hop limit
        b[94] = 0b0011_0_000; // 94[0..4] SL 3, [4] subnet local
        b[95] = 0b01110_000; // 95[0..5] local ACK timeout 14
        b[138] = 0b0000_1_000; // 138[4] alternate subnet local
        b[139] = 0b11111_1_00; // 139[0..5] alternate ACK timeout 31, [5] SAP supported
        b[140..].copy_from_slice(&pattern::<92>(0x80)); // 140: private data
        b
    }

    #[test]
    fn req_fields_sit_at_the_spec_offsets() {
        let mut out = [0xa5u8; CM_MSG_LEN];
        req_repr().emit(&mut CmReq::new_unchecked(&mut out[..]));
        assert_eq!(out, req_bytes());

        let view = CmReq::new_checked(&out[..]).unwrap();
        assert_eq!(view.primary_path().flow_label(), 0xa_bcde);
        assert_eq!(view.alternate_path().local_ack_timeout(), 31);
        assert_eq!(CmReqRepr::parse(&view), Ok(req_repr()));
    }

    #[test]
    fn req_setters_touch_only_their_bits() {
        // Field by field on a zeroed buffer, in an order unlike emit's.
        let r = req_repr();
        let mut out = [0u8; CM_MSG_LEN];
        let mut m = CmReq::new_unchecked(&mut out[..]);
        m.private_data_mut().copy_from_slice(&r.private_data);
        m.set_sap_supported(true);
        m.alternate_path_mut().set_local_ack_timeout(31);
        m.alternate_path_mut().set_subnet_local(true);
        r.primary_path.emit(&mut m.primary_path_mut());
        m.set_extended_transport_type(r.extended_transport_type);
        m.set_srq(true);
        m.set_max_cm_retries(r.max_cm_retries);
        m.set_rnr_retry_count(r.rnr_retry_count);
        m.set_rdc_exists(false);
        m.set_path_mtu(r.path_mtu);
        m.set_pkey(r.pkey);
        m.set_retry_count(r.retry_count);
        m.set_local_cm_response_timeout(r.local_cm_response_timeout);
        m.set_starting_psn(r.starting_psn);
        m.set_end_to_end_flow_control(true);
        m.set_transport_service_type(r.transport_service_type);
        m.set_remote_cm_response_timeout(r.remote_cm_response_timeout);
        m.set_remote_eecn(r.remote_eecn);
        m.set_initiator_depth(r.initiator_depth);
        m.set_local_eecn(r.local_eecn);
        m.set_responder_resources(r.responder_resources);
        m.set_local_qpn(r.local_qpn);
        m.set_local_qkey(r.local_qkey);
        m.set_local_ca_guid(r.local_ca_guid);
        m.set_service_id(r.service_id);
        m.set_vendor_id(r.vendor_id);
        m.set_local_comm_id(r.local_comm_id);
        assert_eq!(out, req_bytes());

        // Out-of-range values are masked to the field, not spilled over.
        let mut m = CmReq::new_unchecked(&mut out[..]);
        m.set_retry_count(0xff);
        m.set_local_qpn(0xffff_ffff);
        assert_eq!(m.local_cm_response_timeout(), 18);
        assert_eq!(m.responder_resources(), 4);
        assert_eq!((m.retry_count(), m.local_qpn()), (7, 0xff_ffff));
    }

    fn rep_repr() -> CmRepRepr {
        CmRepRepr {
            local_comm_id: 0x5566_7788,
            remote_comm_id: 0x1122_3344,
            local_qkey: 0x0102_0304,
            local_qpn: 0x00_0321,
            local_eecn: 0x0a_0b0c,
            vendor_id: 0xaa_bbcc,
            starting_psn: Psn::new(0x12_3456),
            responder_resources: 4,
            initiator_depth: 3,
            target_ack_delay: 15,
            failover_accepted: 1,
            end_to_end_flow_control: true,
            rnr_retry_count: 7,
            srq: true,
            local_ca_guid: 0x0011_2233_4455_6677,
            private_data: pattern(7),
        }
    }

    #[test]
    fn rep_fields_sit_at_the_spec_offsets() {
        // REP by Table 110's offsets.
        let mut want = [0u8; CM_MSG_LEN];
        want[0..4].copy_from_slice(&[0x55, 0x66, 0x77, 0x88]); // 0: local comm ID
        want[4..8].copy_from_slice(&[0x11, 0x22, 0x33, 0x44]); // 4: remote comm ID
        want[8..12].copy_from_slice(&[1, 2, 3, 4]); // 8: local Q_Key
        want[12..16].copy_from_slice(&[0x00, 0x03, 0x21, 0xaa]); // 12: QPN, 15: vendor ID 23..16
        want[16..20].copy_from_slice(&[0x0a, 0x0b, 0x0c, 0xbb]); // 16: EECN, 19: vendor ID 15..8
        want[20..24].copy_from_slice(&[0x12, 0x34, 0x56, 0xcc]); // 20: PSN, 23: vendor ID 7..0
        want[24] = 4; // 24: responder resources
        want[25] = 3; // 25: initiator depth
        want[26] = 0b01111_01_1; // 26[0..5] target ACK delay 15, [5..7] failover 1, [7] e2e
        want[27] = 0b111_1_0000; // 27[0..3] RNR retry count 7, [3] SRQ
        want[28..36].copy_from_slice(&[0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77]); // 28: GUID
        want[36..].copy_from_slice(&pattern::<196>(7)); // 36: private data

        let mut out = [0xa5u8; CM_MSG_LEN];
        rep_repr().emit(&mut CmRep::new_unchecked(&mut out[..]));
        assert_eq!(out, want);
        let view = CmRep::new_checked(&out[..]).unwrap();
        assert_eq!(view.vendor_id(), 0xaa_bbcc);
        assert_eq!(view.local_qpn(), 0x321);
        assert_eq!(CmRepRepr::parse(&view), Ok(rep_repr()));
    }

    fn rej_repr() -> CmRejRepr {
        CmRejRepr {
            local_comm_id: 0x0102_0304,
            remote_comm_id: 0x0506_0708,
            message_rejected: CmMsgRef::Rep,
            ari_length: 16,
            reason: RejReason::ConsumerDefined,
            ari: pattern(0x40),
            private_data: pattern(0xc0),
        }
    }

    #[test]
    fn rej_fields_sit_at_the_spec_offsets() {
        // REJ by Table 108's offsets.
        let mut want = [0u8; CM_MSG_LEN];
        want[0..4].copy_from_slice(&[1, 2, 3, 4]); // 0: local comm ID
        want[4..8].copy_from_slice(&[5, 6, 7, 8]); // 4: remote comm ID
        want[8] = 0b01_000000; // 8[0..2] message rejected: REP
        want[9] = 16 << 1; // 9[0..7] reject info length 16
        want[10..12].copy_from_slice(&[0, 28]); // 10: reason 28, consumer defined
        want[12..84].copy_from_slice(&pattern::<72>(0x40)); // 12: ARI
        want[84..].copy_from_slice(&pattern::<148>(0xc0)); // 84: private data

        let mut out = [0xa5u8; CM_MSG_LEN];
        rej_repr().emit(&mut CmRej::new_unchecked(&mut out[..]));
        assert_eq!(out, want);
        let view = CmRej::new_checked(&out[..]).unwrap();
        assert_eq!(view.reason(), 28);
        assert_eq!(CmRejRepr::parse(&view), Ok(rej_repr()));
    }

    #[test]
    fn dreq_fields_sit_at_the_spec_offsets() {
        // DREQ by Table 112's offsets.
        let mut want = [0u8; CM_MSG_LEN];
        want[0..4].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]); // 0: local comm ID
        want[4..8].copy_from_slice(&[0xfe, 0xed, 0xfa, 0xce]); // 4: remote comm ID
        want[8..11].copy_from_slice(&[0x00, 0xab, 0xcd]); // 8: remote QPN (11 reserved)
        want[12..].copy_from_slice(&pattern::<220>(3)); // 12: private data
        let repr = CmDreqRepr {
            local_comm_id: 0xdead_beef,
            remote_comm_id: 0xfeed_face,
            remote_qpn: 0xabcd,
            private_data: pattern(3),
        };
        let mut out = [0xa5u8; CM_MSG_LEN];
        repr.emit(&mut CmDreq::new_unchecked(&mut out[..]));
        assert_eq!(out, want);
        assert_eq!(
            CmDreqRepr::parse(&CmDreq::new_checked(&out[..]).unwrap()),
            Ok(repr)
        );
    }

    #[test]
    fn mra_rtu_drep_sidr_fields_sit_at_the_spec_offsets() {
        // MRA (Table 107): 8[0..2] message MRAed, 9[0..5] service timeout.
        let mra = CmMraRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_mraed: CmMsgRef::Other,
            service_timeout: 20,
            private_data: pattern(9),
        };
        let mut out = [0xa5u8; CM_MSG_LEN];
        mra.emit(&mut CmMra::new_unchecked(&mut out[..]));
        assert_eq!(
            out[..10],
            [0, 0, 0, 1, 0, 0, 0, 2, 0b10_000000, 0b10100_000]
        );
        assert_eq!(out[10..], pattern::<222>(9));
        assert_eq!(
            CmMraRepr::parse(&CmMra::new_checked(&out[..]).unwrap()),
            Ok(mra)
        );

        // RTU (Table 111) and DREP (Table 113): IDs, then private data at 8.
        let rtu = CmRtuRepr {
            local_comm_id: 3,
            remote_comm_id: 4,
            private_data: pattern(1),
        };
        rtu.emit(&mut CmRtu::new_unchecked(&mut out[..]));
        assert_eq!(out[..8], [0, 0, 0, 3, 0, 0, 0, 4]);
        assert_eq!(out[8..], pattern::<224>(1));
        assert_eq!(
            CmRtuRepr::parse(&CmRtu::new_checked(&out[..]).unwrap()),
            Ok(rtu)
        );
        let drep = CmDrepRepr {
            local_comm_id: 5,
            remote_comm_id: 6,
            private_data: pattern(2),
        };
        drep.emit(&mut CmDrep::new_unchecked(&mut out[..]));
        assert_eq!(out[..8], [0, 0, 0, 5, 0, 0, 0, 6]);
        assert_eq!(
            CmDrepRepr::parse(&CmDrep::new_checked(&out[..]).unwrap()),
            Ok(drep)
        );

        // SIDR_REQ (Table 119): request ID 0, P_Key 4, service ID 8, data 16.
        let sidr_req = CmSidrReqRepr {
            request_id: 0x0a0b_0c0d,
            pkey: 0x8001,
            service_id: 0x0111_4e20,
            private_data: pattern(4),
        };
        out.fill(0xa5);
        sidr_req.emit(&mut CmSidrReq::new_unchecked(&mut out[..]));
        assert_eq!(
            out[..16],
            [0x0a, 0x0b, 0x0c, 0x0d, 0x80, 0x01, 0, 0, 0, 0, 0, 0, 0x01, 0x11, 0x4e, 0x20]
        );
        assert_eq!(
            CmSidrReqRepr::parse(&CmSidrReq::new_checked(&out[..]).unwrap()),
            Ok(sidr_req)
        );

        // SIDR_REP (Table 120): status 4, info length 5, vendor ID 6..8 and
        // 11, QPN 8, service ID 12, Q_Key 20, info 24, private data 96.
        let sidr_rep = CmSidrRepRepr {
            request_id: 0x0a0b_0c0d,
            status: SidrStatus::Redirect,
            additional_info_length: 72,
            vendor_id: 0x12_3456,
            qpn: 0x00_0042,
            service_id: 0x0111_4e20,
            qkey: 0x0000_1234,
            additional_info: pattern(5),
            private_data: pattern(6),
        };
        sidr_rep.emit(&mut CmSidrRep::new_unchecked(&mut out[..]));
        assert_eq!(
            out[..24],
            [
                0x0a, 0x0b, 0x0c, 0x0d, 4, 72, 0x12, 0x34, 0x00, 0x00, 0x42, 0x56, 0, 0, 0, 0,
                0x01, 0x11, 0x4e, 0x20, 0, 0, 0x12, 0x34
            ]
        );
        assert_eq!(out[24..96], pattern::<72>(5));
        assert_eq!(out[96..], pattern::<136>(6));
        assert_eq!(
            CmSidrRepRepr::parse(&CmSidrRep::new_checked(&out[..]).unwrap()),
            Ok(sidr_rep)
        );
    }

    #[test]
    fn lap_and_apr_fields_sit_at_the_spec_offsets() {
        let mut out = [0u8; CM_MSG_LEN];
        let mut lap = CmLap::new_unchecked(&mut out[..]);
        lap.set_remote_qpn(0x12_3456);
        lap.set_remote_cm_response_timeout(31);
        lap.set_alternate_local_lid(0x0102);
        lap.set_alternate_remote_lid(0x0304);
        lap.set_alternate_local_gid([0x11; 16]);
        lap.set_alternate_remote_gid([0x22; 16]);
        lap.set_alternate_flow_label(0xf_ffff);
        lap.set_alternate_traffic_class(0x33);
        lap.set_alternate_hop_limit(0x44);
        lap.set_alternate_packet_rate(0x3f);
        lap.set_alternate_sl(0xf);
        lap.set_alternate_subnet_local(true);
        lap.set_alternate_local_ack_timeout(1);
        lap.private_data_mut().fill(0x55);
        let mut want = [0u8; CM_MSG_LEN];
        want[12..16].copy_from_slice(&[0x12, 0x34, 0x56, 0b11111_000]); // 12: QPN, 15: timeout
        want[20..24].copy_from_slice(&[1, 2, 3, 4]); // 20, 22: LIDs
        want[24..40].fill(0x11); // 24: local GID
        want[40..56].fill(0x22); // 40: remote GID
        want[56..59].copy_from_slice(&[0xff, 0xff, 0xf0]); // 56[0..20] flow label
        want[59..62].copy_from_slice(&[0x33, 0x44, 0x3f]); // 59 TClass, 60 hop limit, 61 rate
        want[62..64].copy_from_slice(&[0b1111_1_000, 0b00001_000]); // 62 SL/subnet local, 63 ACK
        want[64..].fill(0x55); // 64: private data
        assert_eq!(out, want);

        let mut out = [0u8; CM_MSG_LEN];
        let mut apr = CmApr::new_unchecked(&mut out[..]);
        apr.set_additional_info_length(8);
        apr.set_ap_status(5);
        apr.additional_info_mut().fill(0x66);
        apr.private_data_mut().fill(0x77);
        assert_eq!(out[8..12], [8, 5, 0, 0]);
        assert!(out[12..84].iter().all(|&b| b == 0x66));
        assert!(out[84..].iter().all(|&b| b == 0x77));
    }

    #[test]
    fn reserved_codes_are_errors() {
        let mut b = [0u8; CM_MSG_LEN];
        b[8] = 0b11_000000;
        assert_eq!(
            CmMraRepr::parse(&CmMra::new_checked(&b[..]).unwrap()),
            Err(Error::InvalidField {
                field: "MRA message MRAed",
                value: 3
            })
        );
        assert!(CmRejRepr::parse(&CmRej::new_checked(&b[..]).unwrap()).is_err());
        b[8] = 0;
        b[9] = 73 << 1;
        assert_eq!(
            CmRejRepr::parse(&CmRej::new_checked(&b[..]).unwrap()),
            Err(Error::InvalidField {
                field: "REJ reject info length",
                value: 73
            })
        );
        b[9] = 72 << 1;
        assert!(CmRejRepr::parse(&CmRej::new_checked(&b[..]).unwrap()).is_ok());
        b[5] = 73;
        assert!(CmSidrRepRepr::parse(&CmSidrRep::new_checked(&b[..]).unwrap()).is_err());
    }

    #[test]
    fn codes_round_trip() {
        for code in 0..=u16::MAX {
            assert_eq!(RejReason::from_code(code).code(), code);
        }
        assert_eq!(RejReason::from_code(28), RejReason::ConsumerDefined);
        assert_eq!(RejReason::from_code(26), RejReason::InvalidMtu);
        assert_eq!(RejReason::from_code(8), RejReason::InvalidServiceId);
        assert_eq!(RejReason::from_code(34), RejReason::Other(34));
        for code in 0..=u8::MAX {
            assert_eq!(SidrStatus::from_code(code).code(), code);
        }
    }

    #[test]
    fn a_whole_cm_mad_round_trips() {
        let mad = CmMadRepr::send(0x0000_0001_dead_beef, CmMessageRepr::Req(req_repr()));
        let mut out = [0u8; crate::mad::MAD_LEN];
        mad.emit(&mut out);
        assert_eq!(
            out[..4],
            [1, MGMT_CLASS_CM, CM_CLASS_VERSION, crate::mad::METHOD_SEND]
        );
        assert_eq!(out[16..18], [0x00, 0x10]);
        assert_eq!(out[24..], req_bytes());
        assert_eq!(CmMadRepr::parse(&out), Ok(mad));

        // Not a CM MAD, or not a message with a Repr.
        let mut other = out;
        other[1] = 0x03; // subnet administration
        assert!(matches!(
            CmMadRepr::parse(&other),
            Err(Error::InvalidField {
                field: "MAD management class",
                value: 3
            })
        ));
        let mut lap = out;
        lap[16..18].copy_from_slice(&cm_attr::LAP.to_be_bytes());
        assert!(matches!(
            CmMadRepr::parse(&lap),
            Err(Error::InvalidField {
                field: "CM attribute ID",
                value: 0x19
            })
        ));
        for n in 0..out.len() {
            assert!(CmMadRepr::parse(&out[..n]).is_err(), "{n} bytes");
        }
    }
}
