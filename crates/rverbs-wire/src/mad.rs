//! Management Datagrams (IBA vol. 1 §13.4): the 256-byte messages the
//! General Services Interface (QP1) sends and receives, here for the
//! Communication Manager.
//!
//! On RoCEv2 a MAD is the payload of a UD SEND Only packet to or from QP1
//! with Q_Key [`GSI_QKEY`]. It starts with a 24-byte common header:
//!
//! ```text
//!  0      base version (1)
//!  1      management class (CM: 0x07)
//!  2      class version (CM: 2)
//!  3      R(1) method(7)
//!  4..6   status
//!  6..8   class specific
//!  8..16  transaction ID
//! 16..18  attribute ID
//! 18..20  reserved
//! 20..24  attribute modifier
//! 24..256 data (232 bytes)
//! ```
//!
//! The data of a CM MAD is one of the messages in [`crate::cm`].

use crate::macros::{header_view, wire_fields};
use crate::Result;

/// Length of a MAD.
pub const MAD_LEN: usize = 256;
/// Length of the MAD common header.
pub const MAD_HDR_LEN: usize = 24;
/// Length of the data after the common header.
pub const MAD_DATA_LEN: usize = MAD_LEN - MAD_HDR_LEN;

/// The QP number of the General Services Interface, which carries CM MADs.
pub const GSI_QPN: u32 = 1;
/// The well-known Q_Key of QP1: the DETH Q_Key of every MAD sent to it.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// The MAD base version.
pub const BASE_VERSION: u8 = 1;
/// The management class of the Communication Manager.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// The CM class version (IBA 1.2 and later).
pub const CM_CLASS_VERSION: u8 = 2;

/// Method: Get.
pub const METHOD_GET: u8 = 0x01;
/// Method: Set.
pub const METHOD_SET: u8 = 0x02;
/// Method: Send (every CM message).
pub const METHOD_SEND: u8 = 0x03;
/// Method: Trap.
pub const METHOD_TRAP: u8 = 0x05;
/// The response bit of the method byte.
pub const METHOD_RESPONSE: u8 = 0x80;
/// Method: GetResp.
pub const METHOD_GET_RESP: u8 = METHOD_GET | METHOD_RESPONSE;

/// The CM attribute IDs (IBA vol. 1 §12.6; the kernel's `CM_*_ATTR_ID`).
pub mod cm_attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// MsgRcptAck.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResReq.
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResReqResp.
    pub const SIDR_REP: u16 = 0x0018;
    /// LoadAlternatePath.
    pub const LAP: u16 = 0x0019;
    /// AlternatePathResponse.
    pub const APR: u16 = 0x001A;
}

mod field {
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: usize = 4;
    pub const CLASS_SPECIFIC: usize = 6;
    pub const TRANSACTION_ID: usize = 8;
    pub const ATTRIBUTE_ID: usize = 16;
    pub const RESERVED: usize = 18;
    pub const ATTRIBUTE_MODIFIER: usize = 20;
}

header_view! {
    /// A view of a whole MAD (header and data) at the start of a buffer.
    Mad, MAD_LEN
}

wire_fields! { Mad {
    /// Base version ([`BASE_VERSION`]).
    base_version / set_base_version: u8 @ field::BASE_VERSION;
    /// Management class ([`MGMT_CLASS_CM`] for the CM).
    mgmt_class / set_mgmt_class: u8 @ field::MGMT_CLASS;
    /// Class version ([`CM_CLASS_VERSION`] for the CM).
    class_version / set_class_version: u8 @ field::CLASS_VERSION;
    /// Method byte, response bit included ([`METHOD_SEND`], [`METHOD_GET_RESP`] …).
    method / set_method: u8 @ field::METHOD;
    /// Status (0 for every CM message).
    status / set_status: u16 @ field::STATUS;
    /// Class-specific field.
    class_specific / set_class_specific: u16 @ field::CLASS_SPECIFIC;
    /// Transaction ID: the same in a request and its replies.
    transaction_id / set_transaction_id: u64 @ field::TRANSACTION_ID;
    /// Attribute ID: which message the data holds ([`cm_attr`]).
    attribute_id / set_attribute_id: u16 @ field::ATTRIBUTE_ID;
    /// Attribute modifier (the CM carries ECE options here).
    attribute_modifier / set_attribute_modifier: u32 @ field::ATTRIBUTE_MODIFIER;
}}

impl<T: AsRef<[u8]>> Mad<T> {
    /// Whether the method's response bit is set.
    pub fn is_response(&self) -> bool {
        self.method() & METHOD_RESPONSE != 0
    }

    /// The 232 data bytes after the header.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[MAD_HDR_LEN..MAD_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Mad<T> {
    /// The 232 data bytes after the header, to write.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[MAD_HDR_LEN..MAD_LEN]
    }
}

/// The MAD common header's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadRepr {
    /// Base version.
    pub base_version: u8,
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// Method byte, response bit included.
    pub method: u8,
    /// Status.
    pub status: u16,
    /// Class-specific field.
    pub class_specific: u16,
    /// Transaction ID.
    pub transaction_id: u64,
    /// Attribute ID.
    pub attribute_id: u16,
    /// Attribute modifier.
    pub attribute_modifier: u32,
}

impl MadRepr {
    /// The header of a CM message: base version 1, class CM version 2,
    /// method Send, status 0, attribute modifier 0.
    pub const fn cm_send(attribute_id: u16, transaction_id: u64) -> MadRepr {
        MadRepr {
            base_version: BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            attribute_modifier: 0,
        }
    }

    /// Reads a view; fails only if the buffer is shorter than a MAD.
    pub fn parse<T: AsRef<[u8]>>(mad: &Mad<T>) -> Result<MadRepr> {
        mad.check_len()?;
        Ok(MadRepr {
            base_version: mad.base_version(),
            mgmt_class: mad.mgmt_class(),
            class_version: mad.class_version(),
            method: mad.method(),
            status: mad.status(),
            class_specific: mad.class_specific(),
            transaction_id: mad.transaction_id(),
            attribute_id: mad.attribute_id(),
            attribute_modifier: mad.attribute_modifier(),
        })
    }

    /// Bytes [`emit`](Self::emit) writes: the header only.
    pub const fn buffer_len(&self) -> usize {
        MAD_HDR_LEN
    }

    /// Writes the header (not the data); the reserved field becomes zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, mad: &mut Mad<T>) {
        mad.set_base_version(self.base_version);
        mad.set_mgmt_class(self.mgmt_class);
        mad.set_class_version(self.class_version);
        mad.set_method(self.method);
        mad.set_status(self.status);
        mad.set_class_specific(self.class_specific);
        mad.set_transaction_id(self.transaction_id);
        mad.set_attribute_id(self.attribute_id);
        crate::bytes::set_u16(mad.buffer.as_mut(), field::RESERVED, 0);
        mad.set_attribute_modifier(self.attribute_modifier);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A DREQ header: base version 1, class CM (7), class version 2, Send,
    // status 0, class specific 0, TID 0x0000_0001_2345_6789, attribute 0x0015,
    // reserved, modifier 0.
    const HDR: [u8; 24] = [
        0x01, 0x07, 0x02, 0x03, // versions, class, method
        0x00, 0x00, 0x00, 0x00, // status, class specific
        0x00, 0x00, 0x00, 0x01, 0x23, 0x45, 0x67, 0x89, // transaction ID
        0x00, 0x15, 0x00, 0x00, // attribute ID, reserved
        0x00, 0x00, 0x00, 0x00, // attribute modifier
    ];

    #[test]
    fn cm_header_parse_and_emit() {
        let mut bytes = [0xeeu8; MAD_LEN];
        bytes[..24].copy_from_slice(&HDR);
        let mad = Mad::new_checked(&bytes[..]).unwrap();
        let r = MadRepr::parse(&mad).unwrap();
        assert_eq!(r, MadRepr::cm_send(cm_attr::DREQ, 0x1_2345_6789));
        assert!(!mad.is_response());
        assert_eq!(mad.data().len(), MAD_DATA_LEN);
        assert!(mad.data().iter().all(|&b| b == 0xee));

        let mut out = [0xffu8; MAD_LEN];
        r.emit(&mut Mad::new_unchecked(&mut out[..]));
        assert_eq!(out[..24], HDR);
        assert!(
            out[24..].iter().all(|&b| b == 0xff),
            "emit writes the header only"
        );
    }

    #[test]
    fn every_header_field_has_its_offset() {
        let r = MadRepr {
            base_version: 0x11,
            mgmt_class: 0x22,
            class_version: 0x33,
            method: METHOD_GET_RESP,
            status: 0x4455,
            class_specific: 0x6677,
            transaction_id: 0x8899_aabb_ccdd_eeff,
            attribute_id: 0x0102,
            attribute_modifier: 0x0304_0506,
        };
        let mut out = [0u8; MAD_LEN];
        let mut mad = Mad::new_unchecked(&mut out[..]);
        r.emit(&mut mad);
        assert!(mad.is_response());
        assert_eq!(
            out[..24],
            [
                0x11, 0x22, 0x33, 0x81, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
                0xee, 0xff, 0x01, 0x02, 0x00, 0x00, 0x03, 0x04, 0x05, 0x06
            ]
        );
        assert_eq!(MadRepr::parse(&Mad::new_checked(&out[..]).unwrap()), Ok(r));
    }

    #[test]
    fn short_buffer_is_an_error() {
        let bytes = [0u8; MAD_LEN - 1];
        assert_eq!(
            Mad::new_checked(&bytes[..]).unwrap_err(),
            crate::Error::Truncated {
                needed: MAD_LEN,
                got: MAD_LEN - 1
            }
        );
        assert!(MadRepr::parse(&Mad::new_unchecked(&bytes[..])).is_err());
    }
}
