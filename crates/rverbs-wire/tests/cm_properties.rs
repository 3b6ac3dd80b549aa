//! Property tests of the CM wire layer: every message parses from any 232
//! bytes whose typed fields hold a valid value, emits back the same bytes
//! less the spec's reserved bits, and parses the same again; no byte string
//! of any length makes a MAD, CM message or RDMA IP CM header parser panic,
//! and anything shorter than the message is an error.

use proptest::prelude::*;
use rverbs_wire::cm::{self, CM_MSG_LEN};
use rverbs_wire::mad::{self, MAD_LEN};
use rverbs_wire::{
    CmDrep, CmDrepRepr, CmDreq, CmDreqRepr, CmMadRepr, CmMessageRepr, CmMra, CmMraRepr, CmRej,
    CmRejRepr, CmRep, CmRepRepr, CmReq, CmReqRepr, CmRtu, CmRtuRepr, CmSidrRep, CmSidrRepRepr,
    CmSidrReq, CmSidrReqRepr, Error, IpCmHdr, IpCmHdrRepr,
};

/// Reserved bits of each message, as (byte, mask) pairs from the spec's
/// tables: these are the bits a parse-then-emit clears.
mod reserved {
    pub const REQ: &[(usize, u8)] = &[
        (4, 0xff),  // before the vendor ID
        (24, 0xff), // 24..28 before the local Q_Key
        (25, 0xff),
        (26, 0xff),
        (27, 0xff),
        (90, 0x0f),  // primary flow label's last nibble
        (91, 0xc0),  // above the primary packet rate
        (94, 0x07),  // after primary SL and subnet local
        (95, 0x07),  // after primary local ACK timeout
        (134, 0x0f), // the same four in the alternate path
        (135, 0xc0),
        (138, 0x07),
        (139, 0x03), // after the alternate ACK timeout and SAP supported
    ];
    pub const MRA: &[(usize, u8)] = &[(8, 0x3f), (9, 0x07)];
    pub const REJ: &[(usize, u8)] = &[(8, 0x3f), (9, 0x01)];
    pub const REP: &[(usize, u8)] = &[(27, 0x0f)];
    pub const RTU: &[(usize, u8)] = &[];
    pub const DREQ: &[(usize, u8)] = &[(11, 0xff)];
    pub const DREP: &[(usize, u8)] = &[];
    pub const SIDR_REQ: &[(usize, u8)] = &[(6, 0xff), (7, 0xff)];
    pub const SIDR_REP: &[(usize, u8)] = &[];
}

fn cleared(bytes: &[u8; CM_MSG_LEN], reserved: &[(usize, u8)]) -> [u8; CM_MSG_LEN] {
    let mut b = *bytes;
    for &(at, mask) in reserved {
        b[at] &= !mask;
    }
    b
}

/// Makes the typed fields that have reserved codes valid: message
/// MRAed/rejected 0..=2, reject info length and SIDR information length
/// 0..=72.
fn valid_codes(mut b: [u8; CM_MSG_LEN], attr: u16) -> [u8; CM_MSG_LEN] {
    match attr {
        mad::cm_attr::MRA | mad::cm_attr::REJ => {
            b[8] = (b[8] & 0x3f) | (((b[8] >> 6) % 3) << 6);
            if attr == mad::cm_attr::REJ {
                b[9] = (((b[9] >> 1) % 73) << 1) | (b[9] & 1);
            }
        }
        mad::cm_attr::SIDR_REP => b[5] %= 73,
        _ => {}
    }
    b
}

macro_rules! reemits {
    ($bytes:expr, $view:ident, $repr:ident, $reserved:expr) => {{
        let bytes: [u8; CM_MSG_LEN] = $bytes;
        let repr = $repr::parse(&$view::new_checked(&bytes[..]).unwrap()).unwrap();
        let mut out = [0xa5u8; CM_MSG_LEN];
        repr.emit(&mut $view::new_unchecked(&mut out[..]));
        prop_assert_eq!(out, cleared(&bytes, $reserved));
        prop_assert_eq!(
            $repr::parse(&$view::new_checked(&out[..]).unwrap()).unwrap(),
            repr
        );
        for n in 0..CM_MSG_LEN {
            prop_assert!(
                matches!(
                    $repr::parse(&$view::new_unchecked(&bytes[..n])),
                    Err(Error::Truncated { .. })
                ),
                "{} bytes parse",
                n
            );
        }
    }};
}

fn msg_bytes() -> impl Strategy<Value = [u8; CM_MSG_LEN]> {
    proptest::collection::vec(any::<u8>(), CM_MSG_LEN).prop_map(|v| v.try_into().unwrap())
}

fn attribute_id() -> impl Strategy<Value = u16> {
    prop_oneof![
        0x0010u16..=0x001a,
        Just(mad::cm_attr::CLASS_PORT_INFO),
        any::<u16>()
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn every_message_reemits_its_bytes_less_reserved_bits(b in msg_bytes()) {
        use mad::cm_attr::*;
        reemits!(valid_codes(b, REQ), CmReq, CmReqRepr, reserved::REQ);
        reemits!(valid_codes(b, MRA), CmMra, CmMraRepr, reserved::MRA);
        reemits!(valid_codes(b, REJ), CmRej, CmRejRepr, reserved::REJ);
        reemits!(valid_codes(b, REP), CmRep, CmRepRepr, reserved::REP);
        reemits!(valid_codes(b, RTU), CmRtu, CmRtuRepr, reserved::RTU);
        reemits!(valid_codes(b, DREQ), CmDreq, CmDreqRepr, reserved::DREQ);
        reemits!(valid_codes(b, DREP), CmDrep, CmDrepRepr, reserved::DREP);
        reemits!(valid_codes(b, SIDR_REQ), CmSidrReq, CmSidrReqRepr, reserved::SIDR_REQ);
        reemits!(valid_codes(b, SIDR_REP), CmSidrRep, CmSidrRepRepr, reserved::SIDR_REP);
    }

    #[test]
    fn a_cm_mad_round_trips(
        b in msg_bytes(),
        attr in 0x0010u16..=0x0018,
        tid in any::<u64>(),
        modifier in any::<u32>(),
    ) {
        let message = CmMessageRepr::parse(attr, &valid_codes(b, attr)).unwrap();
        prop_assert_eq!(message.attribute_id(), attr);
        let repr = CmMadRepr {
            attribute_modifier: modifier,
            ..CmMadRepr::send(tid, message)
        };
        let mut out = [0u8; MAD_LEN];
        repr.emit(&mut out);
        prop_assert_eq!(CmMadRepr::parse(&out).unwrap(), repr);
    }

    #[test]
    fn parsing_arbitrary_mads_never_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
        attr in attribute_id(),
        cm_header in any::<bool>(),
    ) {
        let mut bytes = bytes;
        if cm_header && bytes.len() >= 18 {
            // Mostly well-formed CM headers, so the message parsers run too.
            bytes[..3].copy_from_slice(&[mad::BASE_VERSION, mad::MGMT_CLASS_CM, mad::CM_CLASS_VERSION]);
            bytes[16..18].copy_from_slice(&attr.to_be_bytes());
        }
        let parsed = CmMadRepr::parse(&bytes);
        if bytes.len() < MAD_LEN {
            prop_assert!(matches!(parsed, Err(Error::Truncated { .. })), "{:?}", parsed);
        }
        if let Ok(repr) = parsed {
            let mut out = [0u8; MAD_LEN];
            repr.emit(&mut out);
            prop_assert_eq!(CmMadRepr::parse(&out).unwrap(), repr);
        }
    }

    #[test]
    fn parsing_arbitrary_messages_never_panics(
        data in proptest::collection::vec(any::<u8>(), 0..260),
        attr in attribute_id(),
    ) {
        let parsed = CmMessageRepr::parse(attr, &data);
        if data.len() < CM_MSG_LEN {
            prop_assert!(matches!(parsed, Err(Error::Truncated { .. })), "{:?}", parsed);
        }
        // The Reprs check the length even of unchecked views.
        let _ = CmReqRepr::parse(&CmReq::new_unchecked(&data[..]));
        let _ = CmMraRepr::parse(&CmMra::new_unchecked(&data[..]));
        let _ = CmRejRepr::parse(&CmRej::new_unchecked(&data[..]));
        let _ = CmRepRepr::parse(&CmRep::new_unchecked(&data[..]));
        let _ = CmRtuRepr::parse(&CmRtu::new_unchecked(&data[..]));
        let _ = CmDreqRepr::parse(&CmDreq::new_unchecked(&data[..]));
        let _ = CmDrepRepr::parse(&CmDrep::new_unchecked(&data[..]));
        let _ = CmSidrReqRepr::parse(&CmSidrReq::new_unchecked(&data[..]));
        let _ = CmSidrRepRepr::parse(&CmSidrRep::new_unchecked(&data[..]));
        let _ = cm::CmReqPathRepr::parse(&cm::CmReqPath::new_unchecked(&data[..]));
    }

    #[test]
    fn parsing_arbitrary_ip_cm_headers_never_panics(
        data in proptest::collection::vec(any::<u8>(), 0..40),
        ip_version in prop_oneof![Just(4u8), Just(6u8), any::<u8>()],
    ) {
        let mut data = data;
        if data.len() >= 2 {
            data[0] = 0;
            data[1] = (ip_version << 4) | (data[1] & 0x0f);
        }
        match IpCmHdrRepr::parse(&IpCmHdr::new_unchecked(&data[..])) {
            Ok(repr) => {
                prop_assert!(data.len() >= 36);
                let mut out = [0u8; 36];
                repr.emit(&mut IpCmHdr::new_unchecked(&mut out[..]));
                prop_assert_eq!(IpCmHdrRepr::parse(&IpCmHdr::new_checked(&out[..]).unwrap()).unwrap(), repr);
                prop_assert_eq!(&out[2..4], &data[2..4]);
            }
            Err(_) => prop_assert!(data.len() < 36 || ip_version & 0x0f != 4 && ip_version & 0x0f != 6),
        }
    }
}
