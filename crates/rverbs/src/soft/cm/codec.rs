//! MADs to and from the agent's messages: the wire crate's CM views
//! (`rverbs_wire::cm`) on one side, [`CmMessage`] on the other.
//!
//! What the agent does not model is written as the Linux CM writes it on
//! a RoCE port, and ignored when read: LIDs 0 (RoCE routes by GID), no
//! alternate path, no EECs, no ECE vendor options, packet rate 0 (the
//! port's own), "subnet local" when the hop limit is at most 1. Private
//! data comes back at its message's full room, as it does from the kernel
//! (rdma_cm reports the room, not what the sender filled).

use rverbs_wire::cm::{
    CmDrepRepr, CmDreqRepr, CmMadRepr, CmMessageRepr, CmMraRepr, CmMsgRef, CmRejRepr, CmRepRepr,
    CmReqPathRepr, CmReqRepr, CmRtuRepr, CmSidrRepRepr, CmSidrReqRepr,
};
use rverbs_wire::{Error as WireError, Psn};

use super::msg::{
    CmBytes, CmMessage, CmTransport, Drep, Dreq, Mra, MsgResponse, PathInfo, Rej, Rep, Req, Rtu,
    SidrRep, SidrReq,
};
use crate::attr::{Gid, Mtu};
use crate::soft::engine::MAD_LEN;

/// Transport service type codes of a REQ.
const TRANSPORT_RC: u8 = 0;
const TRANSPORT_UC: u8 = 1;

/// Why a MAD is not a message for the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// Not a CM MAD of class version 2, or malformed (the wire crate says
    /// how).
    Wire(WireError),
    /// A CM message the agent does not take: ClassPortInfo, LAP, APR, a
    /// REQ for RD or XRC, a REQ with a path MTU no IB MTU code names.
    Unsupported(&'static str),
}

impl From<WireError> for DecodeError {
    fn from(e: WireError) -> Self {
        DecodeError::Wire(e)
    }
}

fn bytes<const N: usize>(b: &[u8]) -> CmBytes<N> {
    // Every wire area is at most its message's room: never too long.
    CmBytes::new(&b[..b.len().min(N)]).unwrap_or_default()
}

fn area<const N: usize, const M: usize>(b: &CmBytes<M>) -> [u8; N] {
    let mut out = [0u8; N];
    let s = b.as_slice();
    let n = s.len().min(N);
    out[..n].copy_from_slice(&s[..n]);
    out
}

fn msg_ref(m: MsgResponse) -> CmMsgRef {
    match m {
        MsgResponse::Req => CmMsgRef::Req,
        MsgResponse::Rep => CmMsgRef::Rep,
        MsgResponse::Other => CmMsgRef::Other,
    }
}

fn msg_response(m: CmMsgRef) -> MsgResponse {
    match m {
        CmMsgRef::Req => MsgResponse::Req,
        CmMsgRef::Rep => MsgResponse::Rep,
        CmMsgRef::Other => MsgResponse::Other,
    }
}

/// The agent's message in a MAD, if it holds one.
pub(crate) fn decode(mad: &[u8]) -> Result<CmMessage, DecodeError> {
    let repr = CmMadRepr::parse(mad)?;
    let tid = repr.transaction_id;
    Ok(match repr.message {
        CmMessageRepr::Req(r) => {
            let transport = match r.transport_service_type {
                TRANSPORT_RC => CmTransport::Rc,
                TRANSPORT_UC => CmTransport::Uc,
                _ => return Err(DecodeError::Unsupported("REQ for RD or XRC")),
            };
            let path_mtu = Mtu::from_raw(r.path_mtu.into())
                .ok_or(DecodeError::Unsupported("REQ with an unknown path MTU"))?;
            let p = &r.primary_path;
            CmMessage::Req(Box::new(Req {
                tid,
                local_comm_id: r.local_comm_id,
                service_id: r.service_id,
                local_ca_guid: r.local_ca_guid,
                local_qkey: r.local_qkey,
                local_qpn: r.local_qpn,
                responder_resources: r.responder_resources,
                initiator_depth: r.initiator_depth,
                remote_cm_response_timeout: r.remote_cm_response_timeout,
                transport,
                flow_control: r.end_to_end_flow_control,
                starting_psn: r.starting_psn.value(),
                local_cm_response_timeout: r.local_cm_response_timeout,
                retry_count: r.retry_count,
                rnr_retry_count: r.rnr_retry_count,
                max_cm_retries: r.max_cm_retries,
                path_mtu,
                pkey: r.pkey,
                srq: r.srq,
                primary: PathInfo {
                    local_gid: Gid(p.local_gid),
                    remote_gid: Gid(p.remote_gid),
                    flow_label: p.flow_label,
                    traffic_class: p.traffic_class,
                    hop_limit: p.hop_limit,
                    sl: p.sl,
                    local_ack_timeout: p.local_ack_timeout,
                },
                private_data: bytes(&r.private_data),
            }))
        }
        CmMessageRepr::Mra(r) => CmMessage::Mra(Box::new(Mra {
            tid,
            local_comm_id: r.local_comm_id,
            remote_comm_id: r.remote_comm_id,
            message_mraed: msg_response(r.message_mraed),
            service_timeout: r.service_timeout,
            private_data: bytes(&r.private_data),
        })),
        CmMessageRepr::Rej(r) => CmMessage::Rej(Box::new(Rej {
            tid,
            local_comm_id: r.local_comm_id,
            remote_comm_id: r.remote_comm_id,
            message_rejected: msg_response(r.message_rejected),
            reason: r.reason,
            ari: bytes(&r.ari[..usize::from(r.ari_length).min(r.ari.len())]),
            private_data: bytes(&r.private_data),
        })),
        CmMessageRepr::Rep(r) => CmMessage::Rep(Box::new(Rep {
            tid,
            local_comm_id: r.local_comm_id,
            remote_comm_id: r.remote_comm_id,
            local_qkey: r.local_qkey,
            local_qpn: r.local_qpn,
            starting_psn: r.starting_psn.value(),
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            target_ack_delay: r.target_ack_delay,
            failover_accepted: r.failover_accepted != 0,
            flow_control: r.end_to_end_flow_control,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq,
            local_ca_guid: r.local_ca_guid,
            private_data: bytes(&r.private_data),
        })),
        CmMessageRepr::Rtu(r) => CmMessage::Rtu(Box::new(Rtu {
            tid,
            local_comm_id: r.local_comm_id,
            remote_comm_id: r.remote_comm_id,
            private_data: bytes(&r.private_data),
        })),
        CmMessageRepr::Dreq(r) => CmMessage::Dreq(Box::new(Dreq {
            tid,
            local_comm_id: r.local_comm_id,
            remote_comm_id: r.remote_comm_id,
            remote_qpn: r.remote_qpn,
            private_data: bytes(&r.private_data),
        })),
        CmMessageRepr::Drep(r) => CmMessage::Drep(Box::new(Drep {
            tid,
            local_comm_id: r.local_comm_id,
            remote_comm_id: r.remote_comm_id,
            private_data: bytes(&r.private_data),
        })),
        CmMessageRepr::SidrReq(r) => CmMessage::SidrReq(Box::new(SidrReq {
            tid,
            request_id: r.request_id,
            pkey: r.pkey,
            service_id: r.service_id,
            private_data: bytes(&r.private_data),
        })),
        CmMessageRepr::SidrRep(r) => CmMessage::SidrRep(Box::new(SidrRep {
            tid,
            request_id: r.request_id,
            status: r.status,
            qpn: r.qpn,
            service_id: r.service_id,
            qkey: r.qkey,
            additional_info: bytes(
                &r.additional_info
                    [..usize::from(r.additional_info_length).min(r.additional_info.len())],
            ),
            private_data: bytes(&r.private_data),
        })),
    })
}

/// The MAD that carries `msg`.
pub(crate) fn encode(msg: &CmMessage) -> [u8; MAD_LEN] {
    let message = match msg {
        CmMessage::Req(m) => {
            let p = &m.primary;
            CmMessageRepr::Req(CmReqRepr {
                local_comm_id: m.local_comm_id,
                vendor_id: 0,
                service_id: m.service_id,
                local_ca_guid: m.local_ca_guid,
                local_qkey: m.local_qkey,
                local_qpn: m.local_qpn,
                responder_resources: m.responder_resources,
                local_eecn: 0,
                initiator_depth: m.initiator_depth,
                remote_eecn: 0,
                remote_cm_response_timeout: m.remote_cm_response_timeout,
                transport_service_type: match m.transport {
                    CmTransport::Rc => TRANSPORT_RC,
                    CmTransport::Uc => TRANSPORT_UC,
                },
                end_to_end_flow_control: m.flow_control,
                starting_psn: Psn::new(m.starting_psn),
                local_cm_response_timeout: m.local_cm_response_timeout,
                retry_count: m.retry_count,
                pkey: m.pkey,
                path_mtu: m.path_mtu as u8,
                rdc_exists: false,
                rnr_retry_count: m.rnr_retry_count,
                max_cm_retries: m.max_cm_retries,
                srq: m.srq,
                extended_transport_type: 0,
                primary_path: CmReqPathRepr {
                    local_lid: 0,
                    remote_lid: 0,
                    local_gid: p.local_gid.0,
                    remote_gid: p.remote_gid.0,
                    flow_label: p.flow_label,
                    packet_rate: 0,
                    traffic_class: p.traffic_class,
                    hop_limit: p.hop_limit,
                    sl: p.sl,
                    subnet_local: p.hop_limit <= 1,
                    local_ack_timeout: p.local_ack_timeout,
                },
                alternate_path: CmReqPathRepr::default(),
                sap_supported: false,
                private_data: area(&m.private_data),
            })
        }
        CmMessage::Mra(m) => CmMessageRepr::Mra(CmMraRepr {
            local_comm_id: m.local_comm_id,
            remote_comm_id: m.remote_comm_id,
            message_mraed: msg_ref(m.message_mraed),
            service_timeout: m.service_timeout,
            private_data: area(&m.private_data),
        }),
        CmMessage::Rej(m) => CmMessageRepr::Rej(CmRejRepr {
            local_comm_id: m.local_comm_id,
            remote_comm_id: m.remote_comm_id,
            message_rejected: msg_ref(m.message_rejected),
            ari_length: m.ari.as_slice().len() as u8,
            reason: m.reason,
            ari: area(&m.ari),
            private_data: area(&m.private_data),
        }),
        CmMessage::Rep(m) => CmMessageRepr::Rep(CmRepRepr {
            local_comm_id: m.local_comm_id,
            remote_comm_id: m.remote_comm_id,
            local_qkey: m.local_qkey,
            local_qpn: m.local_qpn,
            local_eecn: 0,
            vendor_id: 0,
            starting_psn: Psn::new(m.starting_psn),
            responder_resources: m.responder_resources,
            initiator_depth: m.initiator_depth,
            target_ack_delay: m.target_ack_delay,
            failover_accepted: u8::from(m.failover_accepted),
            end_to_end_flow_control: m.flow_control,
            rnr_retry_count: m.rnr_retry_count,
            srq: m.srq,
            local_ca_guid: m.local_ca_guid,
            private_data: area(&m.private_data),
        }),
        CmMessage::Rtu(m) => CmMessageRepr::Rtu(CmRtuRepr {
            local_comm_id: m.local_comm_id,
            remote_comm_id: m.remote_comm_id,
            private_data: area(&m.private_data),
        }),
        CmMessage::Dreq(m) => CmMessageRepr::Dreq(CmDreqRepr {
            local_comm_id: m.local_comm_id,
            remote_comm_id: m.remote_comm_id,
            remote_qpn: m.remote_qpn,
            private_data: area(&m.private_data),
        }),
        CmMessage::Drep(m) => CmMessageRepr::Drep(CmDrepRepr {
            local_comm_id: m.local_comm_id,
            remote_comm_id: m.remote_comm_id,
            private_data: area(&m.private_data),
        }),
        CmMessage::SidrReq(m) => CmMessageRepr::SidrReq(CmSidrReqRepr {
            request_id: m.request_id,
            pkey: m.pkey,
            service_id: m.service_id,
            private_data: area(&m.private_data),
        }),
        CmMessage::SidrRep(m) => CmMessageRepr::SidrRep(CmSidrRepRepr {
            request_id: m.request_id,
            status: m.status,
            additional_info_length: m.additional_info.as_slice().len() as u8,
            vendor_id: 0,
            qpn: m.qpn,
            service_id: m.service_id,
            qkey: m.qkey,
            additional_info: area(&m.additional_info),
            private_data: area(&m.private_data),
        }),
    };
    let mut mad = [0u8; MAD_LEN];
    CmMadRepr::send(msg.tid(), message).emit(&mut mad);
    mad
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::soft::cm::msg::{
        RejReason, SidrStatus, DREP_PRIVATE_DATA, DREQ_PRIVATE_DATA, MRA_PRIVATE_DATA,
        REJ_PRIVATE_DATA, REP_PRIVATE_DATA, REQ_PRIVATE_DATA, RTU_PRIVATE_DATA,
        SIDR_REP_PRIVATE_DATA, SIDR_REQ_PRIVATE_DATA,
    };

    /// `N` bytes (a message's whole room: what comes back from the wire).
    fn full<const N: usize>(seed: u8) -> CmBytes<N> {
        let v: Vec<u8> = (0..N).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
        CmBytes::new(&v).unwrap()
    }

    fn gid(ip: &str) -> Gid {
        Gid::from_ip(ip.parse::<IpAddr>().unwrap())
    }

    fn req() -> Req {
        Req {
            tid: 0x1122_3344_5566_7788,
            local_comm_id: 0xdead_beef,
            service_id: 0x0106_1c86,
            local_ca_guid: 0x0102_0304_0506_0708,
            local_qkey: 0,
            local_qpn: 0x12_3456,
            responder_resources: 4,
            initiator_depth: 2,
            remote_cm_response_timeout: 20,
            transport: CmTransport::Rc,
            flow_control: true,
            starting_psn: 0xab_cdef,
            local_cm_response_timeout: 20,
            retry_count: 7,
            rnr_retry_count: 6,
            max_cm_retries: 15,
            path_mtu: Mtu::Mtu1024,
            pkey: 0xffff,
            srq: true,
            primary: PathInfo {
                local_gid: gid("10.0.0.1"),
                remote_gid: gid("10.0.0.2"),
                flow_label: 0xf_ffff,
                traffic_class: 0x20,
                hop_limit: 64,
                sl: 3,
                local_ack_timeout: 17,
            },
            private_data: full::<REQ_PRIVATE_DATA>(1),
        }
    }

    fn every_message() -> Vec<CmMessage> {
        vec![
            CmMessage::Req(Box::new(req())),
            CmMessage::Req(Box::new(Req {
                transport: CmTransport::Uc,
                path_mtu: Mtu::Mtu4096,
                srq: false,
                flow_control: false,
                ..req()
            })),
            CmMessage::Mra(Box::new(Mra {
                tid: 7,
                local_comm_id: 1,
                remote_comm_id: 2,
                message_mraed: MsgResponse::Rep,
                service_timeout: 24,
                private_data: full::<MRA_PRIVATE_DATA>(2),
            })),
            CmMessage::Rej(Box::new(Rej {
                tid: 8,
                local_comm_id: 0,
                remote_comm_id: 3,
                message_rejected: MsgResponse::Req,
                reason: RejReason::InvalidServiceId,
                ari: CmBytes::new(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap(),
                private_data: full::<REJ_PRIVATE_DATA>(3),
            })),
            CmMessage::Rej(Box::new(Rej {
                tid: 9,
                local_comm_id: 4,
                remote_comm_id: 5,
                message_rejected: MsgResponse::Rep,
                reason: RejReason::ConsumerDefined,
                ari: CmBytes::empty(),
                private_data: full::<REJ_PRIVATE_DATA>(4),
            })),
            CmMessage::Rep(Box::new(Rep {
                tid: 10,
                local_comm_id: 6,
                remote_comm_id: 7,
                local_qkey: 0,
                local_qpn: 0xfe_dcba,
                starting_psn: 0x12_3456,
                responder_resources: 1,
                initiator_depth: 3,
                target_ack_delay: 15,
                failover_accepted: false,
                flow_control: true,
                rnr_retry_count: 7,
                srq: true,
                local_ca_guid: 0x1111_2222_3333_4444,
                private_data: full::<REP_PRIVATE_DATA>(5),
            })),
            CmMessage::Rtu(Box::new(Rtu {
                tid: 11,
                local_comm_id: 8,
                remote_comm_id: 9,
                private_data: full::<RTU_PRIVATE_DATA>(6),
            })),
            CmMessage::Dreq(Box::new(Dreq {
                tid: 12,
                local_comm_id: 10,
                remote_comm_id: 11,
                remote_qpn: 0x00_0042,
                private_data: full::<DREQ_PRIVATE_DATA>(7),
            })),
            CmMessage::Drep(Box::new(Drep {
                tid: 13,
                local_comm_id: 12,
                remote_comm_id: 13,
                private_data: full::<DREP_PRIVATE_DATA>(8),
            })),
            CmMessage::SidrReq(Box::new(SidrReq {
                tid: 14,
                request_id: 14,
                pkey: 0xffff,
                service_id: 0x0111_4e20,
                private_data: full::<SIDR_REQ_PRIVATE_DATA>(9),
            })),
            CmMessage::SidrRep(Box::new(SidrRep {
                tid: 15,
                request_id: 15,
                status: SidrStatus::Success,
                qpn: 0x33_4455,
                service_id: 0x0111_4e20,
                qkey: 0x0123_4567,
                additional_info: CmBytes::new(&[9; 16]).unwrap(),
                private_data: full::<SIDR_REP_PRIVATE_DATA>(10),
            })),
        ]
    }

    #[test]
    fn every_message_survives_the_wire() {
        for m in every_message() {
            let mad = encode(&m);
            assert_eq!(decode(&mad).as_ref(), Ok(&m), "{:?}", m.kind());
        }
    }

    #[test]
    fn a_req_is_a_cm_send_mad_with_the_kernels_roce_fields() {
        let mad = encode(&CmMessage::Req(Box::new(req())));
        let hdr =
            rverbs_wire::MadRepr::parse(&rverbs_wire::Mad::new_checked(&mad[..]).unwrap()).unwrap();
        assert_eq!(
            (hdr.base_version, hdr.mgmt_class, hdr.class_version),
            (1, 7, 2)
        );
        assert_eq!((hdr.method, hdr.attribute_id), (0x03, 0x0010));
        assert_eq!(hdr.transaction_id, 0x1122_3344_5566_7788);
        let CmMessageRepr::Req(r) = CmMadRepr::parse(&mad).unwrap().message else {
            panic!("not a REQ");
        };
        assert_eq!(
            (r.primary_path.local_lid, r.primary_path.remote_lid),
            (0, 0)
        );
        assert!(
            !r.primary_path.subnet_local,
            "hop limit 64 is not subnet-local"
        );
        assert_eq!(r.alternate_path, CmReqPathRepr::default());
        assert_eq!(r.path_mtu, 3);
    }

    #[test]
    fn what_the_agent_does_not_take_is_an_error_not_a_panic() {
        // A REQ for RD.
        let mut mad = encode(&CmMessage::Req(Box::new(req())));
        let mut repr = CmMadRepr::parse(&mad).unwrap();
        if let CmMessageRepr::Req(r) = &mut repr.message {
            r.transport_service_type = 2;
        }
        repr.emit(&mut mad);
        assert!(matches!(decode(&mad), Err(DecodeError::Unsupported(_))));
        // A path MTU code no MTU has.
        if let CmMessageRepr::Req(r) = &mut repr.message {
            r.transport_service_type = 0;
            r.path_mtu = 9;
        }
        repr.emit(&mut mad);
        assert!(matches!(decode(&mad), Err(DecodeError::Unsupported(_))));
        // Another management class, a LAP, short and random MADs.
        let mut other = encode(&CmMessage::Req(Box::new(req())));
        other[1] = 0x03;
        assert!(matches!(decode(&other), Err(DecodeError::Wire(_))));
        let mut lap = encode(&CmMessage::Req(Box::new(req())));
        lap[16..18].copy_from_slice(&0x0019u16.to_be_bytes());
        assert!(matches!(decode(&lap), Err(DecodeError::Wire(_))));
        for n in 0..MAD_LEN {
            assert!(decode(&mad[..n]).is_err());
        }
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            let bytes: Vec<u8> = (0..MAD_LEN)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = decode(&bytes);
        }
    }
}
