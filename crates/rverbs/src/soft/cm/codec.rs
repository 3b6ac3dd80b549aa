//! MADs to and from the agent's messages: the wire crate's CM views
//! (`rverbs_wire::cm`) on one side, [`CmMessage`] on the other.
//!
//! What the agent does not model is written as the Linux CM writes it on
//! a RoCE port, and ignored when read: a REQ's LIDs are the permissive LID
//! 0xFFFF when the hop limit is over 1 and 0 otherwise (RoCE routes by
//! GID), no alternate path, no EECs, no ECE vendor options, packet rate 0
//! (the port's own), "subnet local" when the hop limit is at most 1 (the
//! tests check this against REQs captured from the kernel). Private
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

/// The permissive LID, which the Linux CM writes as both of a REQ's LIDs
/// for a path that leaves the subnet (hop limit over 1: every routable
/// RoCEv2 path), having no LID of the peer.
const PERMISSIVE_LID: u16 = 0xffff;

/// The LID a REQ names either port by on a RoCE path with `hop_limit`.
fn roce_req_lid(hop_limit: u8) -> u16 {
    if hop_limit <= 1 {
        0
    } else {
        PERMISSIVE_LID
    }
}

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
                    local_lid: roce_req_lid(p.hop_limit),
                    remote_lid: roce_req_lid(p.hop_limit),
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
            (0xffff, 0xffff),
            "hop limit 64: the permissive LID"
        );
        assert!(
            !r.primary_path.subnet_local,
            "hop limit 64 is not subnet-local"
        );
        assert_eq!(r.alternate_path, CmReqPathRepr::default());
        assert_eq!(r.path_mtu, 3);
        // A subnet-local path (hop limit 1): LIDs 0, subnet local.
        let mut local = req();
        local.primary.hop_limit = 1;
        let mad = encode(&CmMessage::Req(Box::new(local)));
        let CmMessageRepr::Req(r) = CmMadRepr::parse(&mad).unwrap().message else {
            panic!("not a REQ");
        };
        let p = &r.primary_path;
        assert_eq!((p.local_lid, p.remote_lid, p.subnet_local), (0, 0, true));
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

    // ---- What the Linux kernel's CM sends (testdata/README.md) ----
    //
    // Whole IPv4 packets captured on the host side of the rxe guest's tap
    // (scripts/rxe-guest/capture-cm): kernel 6.1.0-50-amd64's ib_cm and
    // rdma_cm on rdma_rxe, rdmacm-utils 44.0-2, guest 10.77.0.2 (the active
    // side) to host 10.77.0.1, where nothing answered. The values asserted
    // below are what the kernel sent.

    /// The guest: kernel rdma_rxe, the active side of every capture.
    const KERNEL_GUEST_IP: [u8; 4] = [10, 77, 0, 2];
    /// The host the guest connected to.
    const KERNEL_HOST_IP: [u8; 4] = [10, 77, 0, 1];
    /// rxe0's node GUID (from the guest's MAC 52:54:00:7e:00:02), which the
    /// kernel sends as the REQ's local CA GUID and a REJ's ARI.
    const KERNEL_NODE_GUID: u64 = 0x5054_00ff_fe7e_0002;
    /// The UDP source port of the guest's QP 1.
    const KERNEL_GSI_SPORT: u16 = 55410;

    /// `rping -c -a 10.77.0.1 -p 7174 -C 1 -v`: its REQ.
    const KERNEL_RPING_REQ: &[u8] = include_bytes!("testdata/kernel-rping-req.bin");
    /// The REJ the kernel sent when rping, unanswered, was killed.
    const KERNEL_RPING_REJ: &[u8] = include_bytes!("testdata/kernel-rping-rej.bin");
    /// `udaddy -s 10.77.0.1`: its SIDR_REQ.
    const KERNEL_UDADDY_SIDR_REQ: &[u8] = include_bytes!("testdata/kernel-udaddy-sidr-req.bin");
    /// `ucmatose -s 10.77.0.1`: its REQ.
    const KERNEL_UCMATOSE_REQ: &[u8] = include_bytes!("testdata/kernel-ucmatose-req.bin");
    /// The REJ the kernel sent when ucmatose was killed.
    const KERNEL_UCMATOSE_REJ: &[u8] = include_bytes!("testdata/kernel-ucmatose-rej.bin");

    const KERNEL_FIXTURES: [(&str, &[u8]); 5] = [
        ("rping REQ", KERNEL_RPING_REQ),
        ("rping REJ", KERNEL_RPING_REJ),
        ("udaddy SIDR_REQ", KERNEL_UDADDY_SIDR_REQ),
        ("ucmatose REQ", KERNEL_UCMATOSE_REQ),
        ("ucmatose REJ", KERNEL_UCMATOSE_REJ),
    ];

    /// The MAD in a captured IPv4 packet, after checking every layer around
    /// it as sent by the kernel: IPv4 from the guest to the host with DF,
    /// UDP from QP 1's port to 4791, a UD SEND ONLY from QP 1 to QP 1 with
    /// the GSI Q_Key, the default P_Key and a 256-byte payload, and an ICRC
    /// that is right for the IPv4 ID on the wire — which the ICRC alone
    /// also gives, as a receiver that sees only the UDP payload solves for
    /// it.
    fn kernel_mad(what: &str, pkt: &'static [u8]) -> &'static [u8] {
        use rverbs_wire::icrc::{self, IpUdpHeaders, Ipv4IdSolver};
        use rverbs_wire::{DethRepr, Opcode, PacketRepr};
        use std::net::{Ipv4Addr, SocketAddr};

        let (ip, rest) = pkt.split_at(20);
        let (udp, roce) = rest.split_at(8);
        assert_eq!(ip[0], 0x45, "{what}: IPv4 without options");
        assert_eq!(usize::from(u16::from_be_bytes([ip[2], ip[3]])), pkt.len());
        assert_eq!(ip[6] & 0x40, 0x40, "{what}: DF");
        assert_eq!(ip[9], 17, "{what}: UDP");
        assert_eq!(
            (&ip[12..16], &ip[16..20]),
            (&KERNEL_GUEST_IP[..], &KERNEL_HOST_IP[..])
        );
        let ipv4_id = u16::from_be_bytes([ip[4], ip[5]]);
        let sport = u16::from_be_bytes([udp[0], udp[1]]);
        assert_eq!(sport, KERNEL_GSI_SPORT, "{what}");
        assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), icrc::ROCE_V2_PORT);
        assert_eq!(
            usize::from(u16::from_be_bytes([udp[4], udp[5]])),
            8 + roce.len()
        );

        let p = PacketRepr::parse(roce).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(p.bth.opcode, Opcode::UD_SEND_ONLY, "{what}");
        assert_eq!((p.bth.dest_qp, p.bth.pkey, p.bth.pad_count), (1, 0xffff, 0));
        assert!(p.bth.ack_req, "{what}: the kernel sets AckReq on its MADs");
        assert_eq!(
            p.deth,
            Some(DethRepr {
                qkey: 0x8001_0000,
                src_qp: 1
            }),
            "{what}"
        );
        assert_eq!(p.payload.len(), MAD_LEN, "{what}");

        let (computed, on_wire) = icrc::check(ip, udp, roce).unwrap();
        assert_eq!(computed, on_wire, "{what}: ICRC for IPv4 ID {ipv4_id}");
        let from = SocketAddr::from((Ipv4Addr::from(KERNEL_GUEST_IP), sport));
        let to = SocketAddr::from((Ipv4Addr::from(KERNEL_HOST_IP), icrc::ROCE_V2_PORT));
        let h = IpUdpHeaders::linux(from, to, roce.len(), 0);
        let (computed_for_0, _) = icrc::check(h.ip(), h.udp(), roce).unwrap();
        let solved = Ipv4IdSolver::new().solve(computed_for_0, on_wire, 0, 20, roce.len() - 4);
        assert_eq!(solved, Some(ipv4_id), "{what}: the IPv4 ID from the ICRC");
        p.payload
    }

    /// The RDMA IP CM header rdma_cm puts at the start of a REQ's or
    /// SIDR_REQ's private data, followed by zeros (rping, udaddy and
    /// ucmatose send no private data of their own).
    fn ip_cm_private_data<const N: usize>(src_port: u16) -> CmBytes<N> {
        use rverbs_wire::{IpCmHdr, IpCmHdrRepr};
        let mut pd = [0u8; N];
        IpCmHdrRepr {
            src_port,
            src: IpAddr::from(KERNEL_GUEST_IP),
            dst: IpAddr::from(KERNEL_HOST_IP),
        }
        .emit(&mut IpCmHdr::new_unchecked(&mut pd[..36]));
        CmBytes::new(&pd).unwrap()
    }

    /// The flow label rdma_cm gives a RoCEv2 path for IPv4 (and for IPv6
    /// without one set): from the rdma_cm source and destination ports.
    fn rdma_cm_flow_label(src_port: u16, dst_port: u16) -> u32 {
        (u32::from(src_port) * 31 + u32::from(dst_port)) & 0xf_ffff
    }

    fn kernel_path() -> PathInfo {
        PathInfo {
            local_gid: Gid::from_ip(IpAddr::from(KERNEL_GUEST_IP)),
            remote_gid: Gid::from_ip(IpAddr::from(KERNEL_HOST_IP)),
            flow_label: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            local_ack_timeout: 19,
        }
    }

    #[test]
    fn the_kernels_rping_req_decodes_to_what_rdma_cm_sent() {
        let mad = kernel_mad("rping REQ", KERNEL_RPING_REQ);
        let Ok(CmMessage::Req(req)) = decode(mad) else {
            panic!("not a REQ: {:?}", decode(mad));
        };
        // The rdma_cm source port, from the IP CM header.
        let src_port = 0xbddc;
        let expected = Req {
            // ib_mad's agent TID (2) high, the comm ID byte-swapped low.
            tid: 0x0000_0002_97db_1ea7,
            local_comm_id: 0xa71e_db97,
            // RDMA_PS_TCP, rping's port 7174.
            service_id: rverbs_wire::RdmaPortSpace::Tcp.service_id(7174),
            local_ca_guid: KERNEL_NODE_GUID,
            local_qkey: 0,
            local_qpn: 0x11,
            // rping's conn_param: 1 and 1, retry 7, RNR retry 7.
            responder_resources: 1,
            initiator_depth: 1,
            remote_cm_response_timeout: 20,
            transport: CmTransport::Rc,
            flow_control: false,
            starting_psn: 0x3b_2e27,
            local_cm_response_timeout: 20,
            retry_count: 7,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            // rxe0's active MTU on a 1500-byte link.
            path_mtu: Mtu::Mtu1024,
            pkey: 0xffff,
            srq: false,
            primary: PathInfo {
                flow_label: rdma_cm_flow_label(src_port, 7174),
                ..kernel_path()
            },
            private_data: ip_cm_private_data(src_port),
        };
        assert_eq!(*req, expected);
        assert_eq!(req.primary.flow_label, 0x7_19aa);
        assert!(req.local_qpn != 0 && req.starting_psn != 0);
        let hdr = rverbs_wire::IpCmHdrRepr::parse(&rverbs_wire::IpCmHdr::new_unchecked(
            req.private_data.as_slice(),
        ))
        .unwrap();
        assert_eq!(
            (hdr.src, hdr.dst),
            (IpAddr::from(KERNEL_GUEST_IP), IpAddr::from(KERNEL_HOST_IP))
        );
    }

    #[test]
    fn the_kernels_rping_req_has_permissive_lids_and_no_alternate_path() {
        // What the agent's `Req` does not hold: the raw REQ.
        let mad = kernel_mad("rping REQ", KERNEL_RPING_REQ);
        let repr = CmMadRepr::parse(mad).unwrap();
        assert_eq!(
            (
                repr.method,
                repr.status,
                repr.class_specific,
                repr.attribute_modifier
            ),
            (0x03, 0, 0, 0)
        );
        let CmMessageRepr::Req(r) = repr.message else {
            panic!("not a REQ");
        };
        let p = &r.primary_path;
        // Hop limit 64 > 1: the kernel's CM writes the permissive LID.
        assert_eq!((p.local_lid, p.remote_lid), (0xffff, 0xffff));
        assert_eq!((p.packet_rate, p.subnet_local), (0, false));
        assert_eq!(r.alternate_path, CmReqPathRepr::default());
        assert_eq!((r.vendor_id, r.local_eecn, r.remote_eecn), (0, 0, 0));
        assert!(!r.rdc_exists && !r.sap_supported);
        assert_eq!(r.extended_transport_type, 0);
    }

    #[test]
    fn the_kernels_ucmatose_req_decodes_to_what_rdma_cm_sent() {
        let mad = kernel_mad("ucmatose REQ", KERNEL_UCMATOSE_REQ);
        let Ok(CmMessage::Req(req)) = decode(mad) else {
            panic!("not a REQ: {:?}", decode(mad));
        };
        let src_port = 0xd418;
        let expected = Req {
            tid: 0x0000_0002_97db_1ea5,
            local_comm_id: 0xa51e_db97,
            // RDMA_PS_TCP, ucmatose's port 7471.
            service_id: rverbs_wire::RdmaPortSpace::Tcp.service_id(7471),
            local_ca_guid: KERNEL_NODE_GUID,
            local_qkey: 0,
            local_qpn: 0x13,
            // ucmatose's conn_param: 1 and 1, retry 5, RNR retry not set.
            responder_resources: 1,
            initiator_depth: 1,
            remote_cm_response_timeout: 20,
            transport: CmTransport::Rc,
            flow_control: false,
            starting_psn: 0xb4_0701,
            local_cm_response_timeout: 20,
            retry_count: 5,
            rnr_retry_count: 0,
            max_cm_retries: 15,
            path_mtu: Mtu::Mtu1024,
            pkey: 0xffff,
            srq: false,
            primary: PathInfo {
                flow_label: rdma_cm_flow_label(src_port, 7471),
                ..kernel_path()
            },
            private_data: ip_cm_private_data(src_port),
        };
        assert_eq!(*req, expected);
        assert_eq!(req.primary.flow_label, 0x9_cc17);
    }

    #[test]
    fn the_kernels_udaddy_sidr_req_decodes_to_what_rdma_cm_sent() {
        let mad = kernel_mad("udaddy SIDR_REQ", KERNEL_UDADDY_SIDR_REQ);
        let Ok(CmMessage::SidrReq(req)) = decode(mad) else {
            panic!("not a SIDR_REQ: {:?}", decode(mad));
        };
        let expected = SidrReq {
            tid: 0x0000_0002_97db_1ea6,
            request_id: 0xa61e_db97,
            pkey: 0xffff,
            // RDMA_PS_UDP, udaddy's port 7174.
            service_id: rverbs_wire::RdmaPortSpace::Udp.service_id(7174),
            private_data: ip_cm_private_data(0x906e),
        };
        assert_eq!(*req, expected);
        assert_eq!(req.service_id, 0x0111_1c06);
    }

    #[test]
    fn the_kernels_rej_of_an_abandoned_req_names_it_by_ca_guid_and_comm_id() {
        // Destroying a connection in REQ_SENT: REJ "timeout", message
        // rejected "other", the REQ's comm ID as the REJ's local one, no
        // remote comm ID, the node GUID as ARI, the REQ's TID.
        for (what, req_pkt, rej_pkt) in [
            ("rping", KERNEL_RPING_REQ, KERNEL_RPING_REJ),
            ("ucmatose", KERNEL_UCMATOSE_REQ, KERNEL_UCMATOSE_REJ),
        ] {
            let Ok(CmMessage::Req(req)) = decode(kernel_mad(what, req_pkt)) else {
                panic!("{what}: not a REQ");
            };
            let Ok(CmMessage::Rej(rej)) = decode(kernel_mad(what, rej_pkt)) else {
                panic!("{what}: not a REJ");
            };
            let expected = Rej {
                tid: req.tid,
                local_comm_id: req.local_comm_id,
                remote_comm_id: 0,
                message_rejected: MsgResponse::Other,
                reason: RejReason::Timeout,
                ari: CmBytes::new(&KERNEL_NODE_GUID.to_be_bytes()).unwrap(),
                private_data: CmBytes::new(&[0; REJ_PRIVATE_DATA]).unwrap(),
            };
            assert_eq!(*rej, expected, "{what}");
        }
    }

    #[test]
    fn the_kernels_mads_survive_our_codec_byte_for_byte() {
        for (what, pkt) in KERNEL_FIXTURES {
            let mad = kernel_mad(what, pkt);
            let msg = decode(mad).unwrap_or_else(|e| panic!("{what}: {e:?}"));
            let again = encode(&msg);
            let differ: Vec<usize> = (0..MAD_LEN).filter(|&i| again[i] != mad[i]).collect();
            assert!(
                differ.is_empty(),
                "{what}: our encoding differs from the kernel's at MAD bytes {differ:?}"
            );
        }
    }

    /// An agent on the host's port, as the fixtures' peer.
    fn host_agent() -> crate::soft::cm::agent::CmAgent {
        use crate::soft::cm::agent::{CmAgent, CmConfig};
        let mut x = 0x1234_5678u32;
        CmAgent::new(
            Gid::from_ip(IpAddr::from(KERNEL_HOST_IP)),
            0x0200_00ff_fe00_0001,
            CmConfig::default(),
            Box::new(move || {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x
            }),
        )
    }

    #[test]
    fn a_listening_agent_takes_the_kernels_req_and_its_rej() {
        use crate::soft::cm::agent::CmEvent;
        let guest = Gid::from_ip(IpAddr::from(KERNEL_GUEST_IP));
        let now = std::time::Instant::now();
        let mut host = host_agent();
        let listen = host.listen(0x0106_1c06, 8).unwrap();
        let req = decode(kernel_mad("rping REQ", KERNEL_RPING_REQ)).unwrap();
        host.handle_message(now, guest, req.clone());
        let Some(CmEvent::ConnectRequest {
            listen: l,
            conn,
            peer,
            req: got,
        }) = host.poll_event()
        else {
            panic!("no connect request");
        };
        assert_eq!((l, peer, got.local_qpn), (listen, guest, 0x11));
        // The kernel's resend (byte-identical): no second request; the
        // agent asks the kernel to wait with an MRA for the REQ.
        host.handle_message(now, guest, req);
        assert!(host.poll_event().is_none());
        let mra = host.poll_transmit().expect("an MRA");
        let CmMessage::Mra(mra) = mra.msg else {
            panic!("not an MRA: {:?}", mra.msg);
        };
        assert_eq!(
            (mra.tid, mra.remote_comm_id, mra.message_mraed),
            (0x0000_0002_97db_1ea7, 0xa71e_db97, MsgResponse::Req)
        );
        // The kernel gives up (rping killed): its REJ names the connection
        // by CA GUID and comm ID only.
        let rej = decode(kernel_mad("rping REJ", KERNEL_RPING_REJ)).unwrap();
        host.handle_message(now, guest, rej);
        let Some(CmEvent::Rejected {
            conn: rejected,
            reason,
            ..
        }) = host.poll_event()
        else {
            panic!("no rejection");
        };
        assert_eq!((rejected, reason), (conn, RejReason::Timeout));
        assert_eq!(host.stats().drops.unknown_conn, 0);
    }

    #[test]
    fn a_listening_agent_takes_the_kernels_sidr_req() {
        use crate::soft::cm::agent::CmEvent;
        let guest = Gid::from_ip(IpAddr::from(KERNEL_GUEST_IP));
        let mut host = host_agent();
        let listen = host.listen(0x0111_1c06, 8).unwrap();
        let req = decode(kernel_mad("udaddy SIDR_REQ", KERNEL_UDADDY_SIDR_REQ)).unwrap();
        host.handle_message(std::time::Instant::now(), guest, req);
        let Some(CmEvent::SidrRequest {
            listen: l,
            peer,
            service_id,
            pkey,
            private_data,
            ..
        }) = host.poll_event()
        else {
            panic!("no SIDR request");
        };
        assert_eq!(
            (l, peer, service_id, pkey),
            (listen, guest, 0x0111_1c06, 0xffff)
        );
        assert_eq!(private_data, ip_cm_private_data(0x906e));
    }

    #[test]
    fn our_rdma_cm_defaults_agree_with_the_kernels_req_where_rdma_cm_decides() {
        // What rdma_cm (not the application, not the address) chooses, as
        // the kernel sent it for rping; ConnectParams::rdma_cm_defaults
        // must send the same. (Fields the application sets — responder
        // resources, initiator depth, retry counts — and those from the
        // addresses — flow label, GIDs — are left out.)
        use crate::soft::cm::agent::ConnectParams;
        let Ok(CmMessage::Req(kernel)) = decode(kernel_mad("rping REQ", KERNEL_RPING_REQ)) else {
            panic!("not a REQ");
        };
        let mut ours = host_agent();
        let p = ConnectParams::rdma_cm_defaults(
            Gid::from_ip(IpAddr::from(KERNEL_GUEST_IP)),
            kernel.service_id,
            0x11,
            0x3b_2e27,
        );
        ours.connect(std::time::Instant::now(), p).unwrap();
        let CmMessage::Req(req) = ours.poll_transmit().expect("a REQ").msg else {
            panic!("not a REQ");
        };
        let rdma_cm = |r: &Req| {
            (
                r.remote_cm_response_timeout,
                r.local_cm_response_timeout,
                r.max_cm_retries,
                r.transport,
                r.path_mtu,
                r.pkey,
                r.srq,
                r.local_qkey,
                r.flow_control,
            )
        };
        assert_eq!(rdma_cm(&req), rdma_cm(&kernel));
        let path = |p: &PathInfo| (p.traffic_class, p.hop_limit, p.sl, p.local_ack_timeout);
        assert_eq!(path(&req.primary), path(&kernel.primary));
        // And the LIDs, which the agent leaves to the codec.
        let (a, b) = (
            CmMadRepr::parse(&encode(&CmMessage::Req(req))).unwrap(),
            CmMadRepr::parse(kernel_mad("rping REQ", KERNEL_RPING_REQ)).unwrap(),
        );
        let (CmMessageRepr::Req(a), CmMessageRepr::Req(b)) = (a.message, b.message) else {
            panic!("not REQs");
        };
        assert_eq!(a.primary_path.local_lid, b.primary_path.local_lid);
        assert_eq!(a.primary_path.remote_lid, b.primary_path.remote_lid);
        assert_eq!(a.alternate_path, b.alternate_path);
    }
}
