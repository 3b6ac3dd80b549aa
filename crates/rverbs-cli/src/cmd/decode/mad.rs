//! The MADs of `rverbs decode`: what it prints under a RoCE packet to or
//! from QP 1, the General Services Interface.
//!
//! A Communication Manager MAD is named with its key fields (transaction
//! ID, communication IDs, service ID and the rdma_cm port space and port it
//! stands for, QPNs and PSNs, REJ reasons and SIDR statuses by name, the
//! addresses of rdma_cm's IP CM header); a MAD of another management class
//! by its class, method and attribute. What a receiver would drop — a packet
//! to QP 1 that is not a UD SEND Only with QP 1's Q_Key, a payload that is
//! not one 256-byte MAD, a CM message that does not parse — is `… malformed:
//! why`.
//!
//! Private data carries no length on the wire: `pdata N B` counts the bytes
//! up to the last non-zero one (after the IP CM header, when there is one),
//! and is left out when they are all zero.

use std::fmt::Write as _;
use std::net::SocketAddr;

use rverbs_wire::cm::{EXTENDED_TRANSPORT_XRC, TRANSPORT_SERVICE_EXTENDED};
use rverbs_wire::cm::{TRANSPORT_SERVICE_RC, TRANSPORT_SERVICE_RD, TRANSPORT_SERVICE_UC};
use rverbs_wire::ip_cm::IP_CM_HDR_LEN;
use rverbs_wire::mad::{
    cm_attr, BASE_VERSION, CM_CLASS_VERSION, GSI_QKEY, GSI_QPN, MAD_HDR_LEN, MAD_LEN,
    METHOD_RESPONSE, METHOD_SEND, MGMT_CLASS_CM,
};
use rverbs_wire::{
    CmApr, CmLap, CmMessageRepr, CmMsgRef, Error, IpCmHdr, IpCmHdrRepr, Mad, MadRepr, Opcode,
    PacketRepr, RdmaPortSpace, RejReason, SidrStatus,
};

/// What decode says about a packet's MAD.
pub(super) struct MadLine {
    /// The dissection, or `… malformed: why`.
    pub text: String,
    /// Whether a receiver would drop the packet.
    pub malformed: bool,
}

/// The MAD line of a packet to or from QP 1; `None` for other packets.
pub(super) fn dissect(p: &PacketRepr<'_>) -> Option<MadLine> {
    let to_gsi = p.bth.dest_qp == GSI_QPN;
    let from_gsi = p.deth.is_some_and(|d| d.src_qp == GSI_QPN);
    if !to_gsi && !from_gsi {
        return None;
    }
    Some(match describe(p, to_gsi) {
        Ok(text) => MadLine {
            text,
            malformed: false,
        },
        Err(why) => MadLine {
            text: format!("{} malformed: {why}", name(p.payload)),
            malformed: true,
        },
    })
}

/// "CM REQ", "MAD class 0x03 (SA)", or "MAD" when not even the header is there.
fn name(payload: &[u8]) -> String {
    if payload.len() < MAD_HDR_LEN {
        return "MAD".into();
    }
    // The header fields sit in the first 24 bytes; the view reads no further.
    let mad = Mad::new_unchecked(payload);
    match mad.mgmt_class() {
        MGMT_CLASS_CM => format!("CM {}", cm_attr_name(mad.attribute_id())),
        class => class_name(class),
    }
}

fn describe(p: &PacketRepr<'_>, to_gsi: bool) -> Result<String, String> {
    if p.bth.opcode != Opcode::UD_SEND_ONLY {
        return Err(format!(
            "a MAD travels in a {}, not a {}",
            Opcode::UD_SEND_ONLY,
            p.bth.opcode
        ));
    }
    if let Some(deth) = p.deth.filter(|d| to_gsi && d.qkey != GSI_QKEY) {
        return Err(format!(
            "Q_Key {:#010x}, not QP 1's {GSI_QKEY:#010x}",
            deth.qkey
        ));
    }
    let len = p.payload.len();
    if len > MAD_LEN {
        return Err(format!("{len} bytes, a MAD is {MAD_LEN}"));
    }
    let mad = Mad::new_checked(p.payload).map_err(|e| e.to_string())?;
    let hdr = MadRepr::parse(&mad).map_err(|e| e.to_string())?;
    if hdr.mgmt_class == MGMT_CLASS_CM {
        describe_cm(&hdr, mad.data())
    } else {
        Ok(describe_other(&hdr))
    }
}

/// A MAD of another class: class, method, attribute, transaction ID.
fn describe_other(hdr: &MadRepr) -> String {
    let mut s = format!(
        "{} method {} attr {:#06x} tid {:#x}",
        class_name(hdr.mgmt_class),
        method_name(hdr.method),
        hdr.attribute_id,
        hdr.transaction_id
    );
    if hdr.status != 0 {
        let _ = write!(s, " status {:#06x}", hdr.status);
    }
    s
}

fn invalid(field: &'static str, value: u8) -> String {
    Error::InvalidField {
        field,
        value: value.into(),
    }
    .to_string()
}

fn describe_cm(hdr: &MadRepr, data: &[u8]) -> Result<String, String> {
    if hdr.base_version != BASE_VERSION {
        return Err(invalid("MAD base version", hdr.base_version));
    }
    if hdr.class_version != CM_CLASS_VERSION {
        return Err(invalid("CM class version", hdr.class_version));
    }
    let attr = hdr.attribute_id;
    let mut s = format!("CM {} tid {:#x}", cm_attr_name(attr), hdr.transaction_id);
    if hdr.method != METHOD_SEND || attr == cm_attr::CLASS_PORT_INFO {
        let _ = write!(s, " method {}", method_name(hdr.method));
    }
    if hdr.status != 0 {
        let _ = write!(s, " status {:#06x}", hdr.status);
    }
    match attr {
        cm_attr::REQ
        | cm_attr::MRA
        | cm_attr::REJ
        | cm_attr::REP
        | cm_attr::RTU
        | cm_attr::DREQ
        | cm_attr::DREP
        | cm_attr::SIDR_REQ
        | cm_attr::SIDR_REP => {
            let msg = CmMessageRepr::parse(attr, data).map_err(|e| e.to_string())?;
            describe_message(&mut s, &msg)?;
        }
        cm_attr::LAP => {
            let lap = CmLap::new_checked(data).map_err(|e| e.to_string())?;
            comm(&mut s, lap.local_comm_id(), lap.remote_comm_id());
            let _ = write!(s, " qpn {:#08x}", lap.remote_qpn());
            pdata(&mut s, lap.private_data());
        }
        cm_attr::APR => {
            let apr = CmApr::new_checked(data).map_err(|e| e.to_string())?;
            comm(&mut s, apr.local_comm_id(), apr.remote_comm_id());
            let _ = write!(s, " status {}", apr.ap_status());
            pdata(&mut s, apr.private_data());
        }
        // ClassPortInfo, and attributes the CM does not define: the name
        // (`attr 0x…`) and the header say it all.
        _ => {}
    }
    Ok(s)
}

/// The fields of a message with a `Repr`; `Err` only for a bad IP CM header.
fn describe_message(s: &mut String, msg: &CmMessageRepr) -> Result<(), String> {
    match msg {
        CmMessageRepr::Req(r) => {
            let _ = write!(s, " comm {:#010x}", r.local_comm_id);
            service(s, r.service_id);
            let _ = write!(
                s,
                " {} qpn {:#08x} psn {} mtu {} retry {} rnr-retry {} ack-timeout {} \
                 resp-res {} init-depth {}",
                transport_name(r.transport_service_type, r.extended_transport_type),
                r.local_qpn,
                r.starting_psn,
                mtu(r.path_mtu),
                r.retry_count,
                r.rnr_retry_count,
                r.primary_path.local_ack_timeout,
                r.responder_resources,
                r.initiator_depth,
            );
            if r.pkey != 0xffff {
                let _ = write!(s, " pkey {:#06x}", r.pkey);
            }
            if r.srq {
                s.push_str(" srq");
            }
            ip_cm_pdata(s, r.service_id, &r.private_data)?;
        }
        CmMessageRepr::Rep(r) => {
            comm(s, r.local_comm_id, r.remote_comm_id);
            let _ = write!(
                s,
                " qpn {:#08x} psn {} resp-res {} init-depth {} rnr-retry {}",
                r.local_qpn,
                r.starting_psn,
                r.responder_resources,
                r.initiator_depth,
                r.rnr_retry_count
            );
            if r.srq {
                s.push_str(" srq");
            }
            pdata(s, &r.private_data);
        }
        CmMessageRepr::Rtu(r) => {
            comm(s, r.local_comm_id, r.remote_comm_id);
            pdata(s, &r.private_data);
        }
        CmMessageRepr::Rej(r) => {
            comm(s, r.local_comm_id, r.remote_comm_id);
            let code = r.reason.code();
            let _ = write!(
                s,
                " rejects {} reason {code}",
                msg_ref_name(r.message_rejected)
            );
            if let Some(name) = rej_reason_name(r.reason) {
                let _ = write!(s, " ({name})");
            }
            if r.ari_length != 0 {
                let _ = write!(s, " ari {} B", r.ari_length);
            }
            pdata(s, &r.private_data);
        }
        CmMessageRepr::Mra(r) => {
            comm(s, r.local_comm_id, r.remote_comm_id);
            let _ = write!(
                s,
                " for {} service-timeout {}",
                msg_ref_name(r.message_mraed),
                r.service_timeout
            );
            pdata(s, &r.private_data);
        }
        CmMessageRepr::Dreq(r) => {
            comm(s, r.local_comm_id, r.remote_comm_id);
            let _ = write!(s, " qpn {:#08x}", r.remote_qpn);
            pdata(s, &r.private_data);
        }
        CmMessageRepr::Drep(r) => {
            comm(s, r.local_comm_id, r.remote_comm_id);
            pdata(s, &r.private_data);
        }
        CmMessageRepr::SidrReq(r) => {
            let _ = write!(s, " req-id {:#010x}", r.request_id);
            service(s, r.service_id);
            if r.pkey != 0xffff {
                let _ = write!(s, " pkey {:#06x}", r.pkey);
            }
            ip_cm_pdata(s, r.service_id, &r.private_data)?;
        }
        CmMessageRepr::SidrRep(r) => {
            let _ = write!(
                s,
                " req-id {:#010x} status {}",
                r.request_id,
                r.status.code()
            );
            if let Some(name) = sidr_status_name(r.status) {
                let _ = write!(s, " ({name})");
            }
            let _ = write!(s, " qpn {:#08x} qkey {:#010x}", r.qpn, r.qkey);
            service(s, r.service_id);
            if r.additional_info_length != 0 {
                let _ = write!(s, " info {} B", r.additional_info_length);
            }
            pdata(s, &r.private_data);
        }
    }
    Ok(())
}

/// ` comm 0xLOCAL→0xREMOTE`: the sender's ID, then the receiver's.
fn comm(s: &mut String, local: u32, remote: u32) {
    let _ = write!(s, " comm {local:#010x}→{remote:#010x}");
}

/// ` svc 0x…`, with the rdma_cm port space and port it names, if it does.
fn service(s: &mut String, id: u64) {
    let _ = write!(s, " svc {id:#x}");
    if let Some((ps, port)) = RdmaPortSpace::from_service_id(id) {
        let _ = write!(s, " (rdma_cm {} port {port})", port_space_name(ps));
    }
}

/// ` pdata N B` for the bytes up to the last non-zero one, if any.
fn pdata(s: &mut String, data: &[u8]) {
    let n = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    if n != 0 {
        let _ = write!(s, " pdata {n} B");
    }
}

/// A REQ's or SIDR_REQ's private data: for an rdma_cm service ID the IP CM
/// header (which must parse) and the user's bytes after it, else the bytes.
fn ip_cm_pdata(s: &mut String, service_id: u64, data: &[u8]) -> Result<(), String> {
    let Some((_, port)) = RdmaPortSpace::from_service_id(service_id) else {
        pdata(s, data);
        return Ok(());
    };
    let hdr = IpCmHdr::new_checked(data)
        .and_then(|h| IpCmHdrRepr::parse(&h))
        .map_err(|e| format!("IP CM header: {e}"))?;
    pdata(s, &data[IP_CM_HDR_LEN..]);
    let _ = write!(
        s,
        " (IP CM {} → {})",
        SocketAddr::new(hdr.src, hdr.src_port),
        SocketAddr::new(hdr.dst, port)
    );
    Ok(())
}

fn mtu(code: u8) -> String {
    match code {
        1..=5 => (128u32 << code).to_string(),
        other => format!("code {other}"),
    }
}

fn transport_name(service_type: u8, extended: u8) -> String {
    match (service_type, extended) {
        (TRANSPORT_SERVICE_RC, _) => "RC".into(),
        (TRANSPORT_SERVICE_UC, _) => "UC".into(),
        (TRANSPORT_SERVICE_RD, _) => "RD".into(),
        (TRANSPORT_SERVICE_EXTENDED, EXTENDED_TRANSPORT_XRC) => "XRC".into(),
        (_, ext) => format!("ext-transport {ext}"),
    }
}

fn port_space_name(ps: RdmaPortSpace) -> &'static str {
    match ps {
        RdmaPortSpace::Ipoib => "IPoIB",
        RdmaPortSpace::Tcp => "TCP",
        RdmaPortSpace::Udp => "UDP",
        RdmaPortSpace::Ib => "IB",
    }
}

fn msg_ref_name(m: CmMsgRef) -> &'static str {
    match m {
        CmMsgRef::Req => "REQ",
        CmMsgRef::Rep => "REP",
        CmMsgRef::Other => "other",
    }
}

/// `REQ`, `ClassPortInfo`, …, or `attr 0x…` for one the CM does not define.
fn cm_attr_name(attr: u16) -> String {
    let name = match attr {
        cm_attr::CLASS_PORT_INFO => "ClassPortInfo",
        cm_attr::REQ => "REQ",
        cm_attr::MRA => "MRA",
        cm_attr::REJ => "REJ",
        cm_attr::REP => "REP",
        cm_attr::RTU => "RTU",
        cm_attr::DREQ => "DREQ",
        cm_attr::DREP => "DREP",
        cm_attr::SIDR_REQ => "SIDR_REQ",
        cm_attr::SIDR_REP => "SIDR_REP",
        cm_attr::LAP => "LAP",
        cm_attr::APR => "APR",
        other => return format!("attr {other:#06x}"),
    };
    name.into()
}

/// `MAD class 0x03 (SA)`: the number, and the name of a class IBA defines.
fn class_name(class: u8) -> String {
    let name = match class {
        0x01 => Some("SM"),
        0x81 => Some("SM directed route"),
        0x03 => Some("SA"),
        0x04 => Some("PerfMgt"),
        0x05 => Some("BM"),
        0x06 => Some("DevMgt"),
        0x07 => Some("CM"),
        0x08 => Some("SNMP"),
        _ => None,
    };
    match name {
        Some(n) => format!("MAD class {class:#04x} ({n})"),
        None => format!("MAD class {class:#04x}"),
    }
}

/// `GET`, `GET_RESP`, `SEND`, …, or the byte in hex.
fn method_name(method: u8) -> String {
    let base = match method & !METHOD_RESPONSE {
        0x01 => "GET",
        0x02 => "SET",
        0x03 => "SEND",
        0x05 => "TRAP",
        0x06 => "REPORT",
        0x07 => "TRAP_REPRESS",
        0x12 => "GET_TABLE",
        0x13 => "GET_TRACE_TABLE",
        0x14 => "GET_MULTI",
        0x15 => "DELETE",
        _ => return format!("{method:#04x}"),
    };
    if method & METHOD_RESPONSE != 0 {
        format!("{base}_RESP")
    } else {
        base.into()
    }
}

/// A REJ reason's name (the wire crate's enum has the codes only).
fn rej_reason_name(reason: RejReason) -> Option<&'static str> {
    Some(match reason {
        RejReason::NoQp => "no QP",
        RejReason::NoEec => "no EE context",
        RejReason::NoResources => "no resources",
        RejReason::Timeout => "timeout",
        RejReason::Unsupported => "unsupported request",
        RejReason::InvalidCommId => "invalid comm ID",
        RejReason::InvalidCommInstance => "invalid comm instance",
        RejReason::InvalidServiceId => "invalid service ID",
        RejReason::InvalidTransportType => "invalid transport type",
        RejReason::StaleConn => "stale connection",
        RejReason::RdcNotExist => "RDC does not exist",
        RejReason::InvalidGid => "invalid GID",
        RejReason::InvalidLid => "invalid LID",
        RejReason::InvalidSl => "invalid SL",
        RejReason::InvalidTrafficClass => "invalid traffic class",
        RejReason::InvalidHopLimit => "invalid hop limit",
        RejReason::InvalidPacketRate => "invalid packet rate",
        RejReason::InvalidAltGid => "invalid alternate GID",
        RejReason::InvalidAltLid => "invalid alternate LID",
        RejReason::InvalidAltSl => "invalid alternate SL",
        RejReason::InvalidAltTrafficClass => "invalid alternate traffic class",
        RejReason::InvalidAltHopLimit => "invalid alternate hop limit",
        RejReason::InvalidAltPacketRate => "invalid alternate packet rate",
        RejReason::PortCmRedirect => "port CM redirect",
        RejReason::PortRedirect => "port redirect",
        RejReason::InvalidMtu => "invalid MTU",
        RejReason::InsufficientRespResources => "insufficient responder resources",
        RejReason::ConsumerDefined => "consumer defined",
        RejReason::InvalidRnrRetry => "invalid RNR retry count",
        RejReason::DuplicateLocalCommId => "duplicate local comm ID",
        RejReason::InvalidClassVersion => "invalid class version",
        RejReason::InvalidFlowLabel => "invalid flow label",
        RejReason::InvalidAltFlowLabel => "invalid alternate flow label",
        RejReason::VendorOptionNotSupported => "vendor option not supported",
        RejReason::Other(_) => return None,
    })
}

/// A SIDR_REP status's name.
fn sidr_status_name(status: SidrStatus) -> Option<&'static str> {
    Some(match status {
        SidrStatus::Success => "success",
        SidrStatus::Unsupported => "unsupported service ID",
        SidrStatus::Reject => "rejected",
        SidrStatus::NoQp => "no QP",
        SidrStatus::Redirect => "redirect",
        SidrStatus::UnsupportedVersion => "unsupported class version",
        SidrStatus::Other(_) => return None,
    })
}
