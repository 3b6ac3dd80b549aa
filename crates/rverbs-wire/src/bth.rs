//! Base Transport Header (12 bytes): opcode, flags, P_Key, destination QP,
//! AckReq and PSN.
//!
//! ```text
//!  0      opcode
//!  1      SE(1) MigReq(1) PadCnt(2) TVer(4)
//!  2..4   P_Key
//!  4      FECN(1) BECN(1) reserved(6)
//!  5..8   destination QP
//!  8      AckReq(1) reserved(7)
//!  9..12  PSN
//! ```

use crate::bytes::{get_u16, get_u24, set_u16, set_u24};
use crate::macros::header_view;
use crate::{Opcode, Psn, Result};

/// Length of the BTH.
pub const BTH_LEN: usize = 12;

mod field {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: usize = 2;
    pub const ECN: usize = 4;
    pub const DEST_QP: usize = 5;
    pub const ACK_REQ: usize = 8;
    pub const PSN: usize = 9;
}

header_view! {
    /// A view of a BTH at the start of a buffer.
    Bth, BTH_LEN
}

impl<T: AsRef<[u8]>> Bth<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.b()[field::OPCODE])
    }

    /// Solicited event.
    pub fn solicited(&self) -> bool {
        self.b()[field::FLAGS] & 0x80 != 0
    }

    /// Migration request.
    pub fn mig_req(&self) -> bool {
        self.b()[field::FLAGS] & 0x40 != 0
    }

    /// Pad count: bytes of padding after the payload (0..=3).
    pub fn pad_count(&self) -> u8 {
        (self.b()[field::FLAGS] >> 4) & 0x3
    }

    /// Transport header version (0).
    pub fn tver(&self) -> u8 {
        self.b()[field::FLAGS] & 0x0f
    }

    /// Partition key.
    pub fn pkey(&self) -> u16 {
        get_u16(self.b(), field::PKEY)
    }

    /// Forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.b()[field::ECN] & 0x80 != 0
    }

    /// Backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        self.b()[field::ECN] & 0x40 != 0
    }

    /// Destination QP number (24 bits).
    pub fn dest_qp(&self) -> u32 {
        get_u24(self.b(), field::DEST_QP)
    }

    /// Acknowledge request.
    pub fn ack_req(&self) -> bool {
        self.b()[field::ACK_REQ] & 0x80 != 0
    }

    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(get_u24(self.b(), field::PSN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    fn set_bit(&mut self, at: usize, mask: u8, on: bool) {
        let b = &mut self.bm()[at];
        *b = if on { *b | mask } else { *b & !mask };
    }

    /// Sets the opcode.
    pub fn set_opcode(&mut self, op: Opcode) {
        self.bm()[field::OPCODE] = op.0;
    }

    /// Sets the solicited event bit.
    pub fn set_solicited(&mut self, on: bool) {
        self.set_bit(field::FLAGS, 0x80, on);
    }

    /// Sets the migration request bit.
    pub fn set_mig_req(&mut self, on: bool) {
        self.set_bit(field::FLAGS, 0x40, on);
    }

    /// Sets the pad count (low two bits of `pad`).
    pub fn set_pad_count(&mut self, pad: u8) {
        let b = &mut self.bm()[field::FLAGS];
        *b = (*b & !0x30) | ((pad & 0x3) << 4);
    }

    /// Sets the transport header version (low four bits).
    pub fn set_tver(&mut self, tver: u8) {
        let b = &mut self.bm()[field::FLAGS];
        *b = (*b & !0x0f) | (tver & 0x0f);
    }

    /// Sets the partition key.
    pub fn set_pkey(&mut self, pkey: u16) {
        set_u16(self.bm(), field::PKEY, pkey);
    }

    /// Sets FECN and BECN and clears the reserved bits.
    pub fn set_ecn(&mut self, fecn: bool, becn: bool) {
        self.bm()[field::ECN] = (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }

    /// Sets the destination QP (low 24 bits).
    pub fn set_dest_qp(&mut self, qpn: u32) {
        set_u24(self.bm(), field::DEST_QP, qpn & 0x00ff_ffff);
    }

    /// Sets AckReq and clears the reserved bits.
    pub fn set_ack_req(&mut self, on: bool) {
        self.bm()[field::ACK_REQ] = u8::from(on) << 7;
    }

    /// Sets the PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        set_u24(self.bm(), field::PSN, psn.value());
    }
}

/// The BTH's fields as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request.
    pub mig_req: bool,
    /// Pad count (set by [`PacketRepr::emit`](crate::PacketRepr::emit) from the payload length).
    pub pad_count: u8,
    /// Transport header version.
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// A BTH with the default P_Key (0xffff), version 0 and every flag clear.
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: Psn) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<BthRepr> {
        bth.check_len()?;
        Ok(BthRepr {
            opcode: bth.opcode(),
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pad_count: bth.pad_count(),
            tver: bth.tver(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qp: bth.dest_qp(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        BTH_LEN
    }

    /// Writes the header; reserved bits become zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bth: &mut Bth<T>) {
        bth.set_opcode(self.opcode);
        bth.bm()[field::FLAGS] = 0;
        bth.set_solicited(self.solicited);
        bth.set_mig_req(self.mig_req);
        bth.set_pad_count(self.pad_count);
        bth.set_tver(self.tver);
        bth.set_pkey(self.pkey);
        bth.set_ecn(self.fecn, self.becn);
        bth.set_dest_qp(self.dest_qp);
        bth.set_ack_req(self.ack_req);
        bth.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // UC SEND Only, SE set, P_Key 0xffff, QP 211, PSN 13571856 (opcode, QP and
    // PSN of the scapy vector in WIRE.md).
    const BYTES: [u8; 12] = [
        0x24, 0x80, 0xff, 0xff, 0x00, 0x00, 0x00, 0xd3, 0x00, 0xcf, 0x17, 0x10,
    ];

    fn repr() -> BthRepr {
        BthRepr {
            solicited: true,
            ..BthRepr::new(Opcode::UC_SEND_ONLY, 211, Psn::new(13_571_856))
        }
    }

    #[test]
    fn deconstruct() {
        let b = Bth::new_checked(&BYTES[..]).unwrap();
        assert_eq!(b.opcode(), Opcode::UC_SEND_ONLY);
        assert!(b.solicited() && !b.mig_req());
        assert_eq!((b.pad_count(), b.tver(), b.pkey()), (0, 0, 0xffff));
        assert_eq!(b.dest_qp(), 211);
        assert_eq!(b.psn(), Psn::new(13_571_856));
        assert!(!b.ack_req() && !b.fecn() && !b.becn());
    }

    #[test]
    fn construct_parse_emit() {
        let mut buf = [0xa5u8; 12];
        repr().emit(&mut Bth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert_eq!(
            BthRepr::parse(&Bth::new_checked(&BYTES[..]).unwrap()).unwrap(),
            repr()
        );
    }

    #[test]
    fn all_flag_bits() {
        let bytes = [
            0x11, 0x7a, 0x80, 0x01, 0xc0, 0xab, 0xcd, 0xef, 0x80, 0xff, 0xff, 0xff,
        ];
        let b = Bth::new_checked(&bytes[..]).unwrap();
        assert!(!b.solicited() && b.mig_req());
        assert_eq!((b.pad_count(), b.tver()), (3, 0xa));
        assert!(b.fecn() && b.becn() && b.ack_req());
        assert_eq!(
            (b.pkey(), b.dest_qp(), b.psn().value()),
            (0x8001, 0xabcdef, 0xffffff)
        );
        let r = BthRepr::parse(&b).unwrap();
        let mut out = [0u8; 12];
        r.emit(&mut Bth::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }

    #[test]
    fn reserved_bits_are_ignored_and_zeroed() {
        let mut bytes = BYTES;
        bytes[4] = 0x3f;
        bytes[8] = 0x7f;
        let r = BthRepr::parse(&Bth::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(r, repr());
        let mut out = [0u8; 12];
        r.emit(&mut Bth::new_unchecked(&mut out[..]));
        assert_eq!(out, BYTES);
    }

    #[test]
    fn short_buffer_is_an_error() {
        assert_eq!(
            Bth::new_checked(&BYTES[..11]).unwrap_err(),
            crate::Error::Truncated {
                needed: 12,
                got: 11
            }
        );
    }
}
