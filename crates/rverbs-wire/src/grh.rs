//! Global Route Header (40 bytes): the header UD receive buffers start with
//! (libibverbs' convention), laid out like an IPv6 header — IP version 6,
//! traffic class, flow label, payload length, next header, hop limit, source
//! and destination GID.

use crate::bytes::{get_u16, get_u32, set_u16, set_u32};
use crate::macros::header_view;
use crate::{Error, Result};

/// Length of the GRH.
pub const GRH_LEN: usize = 40;

/// The GRH's next-header value when an IBA transport header follows
/// directly (InfiniBand and RoCE v1).
pub const NEXT_HEADER_IBA: u8 = 0x1b;
/// The next-header value in a RoCE v2 GRH: UDP. (For RoCE v2 over IPv4 a UD
/// receive buffer holds the IPv4 header in bytes 20..40 instead of a GRH.)
pub const NEXT_HEADER_UDP: u8 = 17;

header_view! {
    /// A view of a GRH at the start of a buffer.
    Grh, GRH_LEN
}

impl<T: AsRef<[u8]>> Grh<T> {
    fn word0(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }

    /// IP version (6).
    pub fn ip_ver(&self) -> u8 {
        (self.word0() >> 28) as u8
    }

    /// Traffic class.
    pub fn tclass(&self) -> u8 {
        (self.word0() >> 20) as u8
    }

    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        self.word0() & 0x000f_ffff
    }

    /// Payload length.
    pub fn payload_len(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 4)
    }

    /// Next header.
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[6]
    }

    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[7]
    }

    /// Source GID.
    pub fn sgid(&self) -> [u8; 16] {
        let mut g = [0; 16];
        g.copy_from_slice(&self.buffer.as_ref()[8..24]);
        g
    }

    /// Destination GID.
    pub fn dgid(&self) -> [u8; 16] {
        let mut g = [0; 16];
        g.copy_from_slice(&self.buffer.as_ref()[24..40]);
        g
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Grh<T> {
    /// Sets version, traffic class and flow label together (they share a word).
    pub fn set_word0(&mut self, ip_ver: u8, tclass: u8, flow_label: u32) {
        let w = (u32::from(ip_ver & 0xf) << 28)
            | (u32::from(tclass) << 20)
            | (flow_label & 0x000f_ffff);
        set_u32(self.buffer.as_mut(), 0, w);
    }

    /// Sets the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 4, v);
    }

    /// Sets the next header.
    pub fn set_next_header(&mut self, v: u8) {
        self.buffer.as_mut()[6] = v;
    }

    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[7] = v;
    }

    /// Sets the source GID.
    pub fn set_sgid(&mut self, g: &[u8; 16]) {
        self.buffer.as_mut()[8..24].copy_from_slice(g);
    }

    /// Sets the destination GID.
    pub fn set_dgid(&mut self, g: &[u8; 16]) {
        self.buffer.as_mut()[24..40].copy_from_slice(g);
    }
}

/// The GRH's fields (IP version is always 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GrhRepr {
    /// Traffic class.
    pub tclass: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Payload length.
    pub payload_len: u16,
    /// Next header.
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source GID.
    pub sgid: [u8; 16],
    /// Destination GID.
    pub dgid: [u8; 16],
}

impl GrhRepr {
    /// Reads a view; the IP version must be 6.
    pub fn parse<T: AsRef<[u8]>>(h: &Grh<T>) -> Result<Self> {
        h.check_len()?;
        if h.ip_ver() != 6 {
            return Err(Error::BadIpHeader("GRH IP version is not 6"));
        }
        Ok(GrhRepr {
            tclass: h.tclass(),
            flow_label: h.flow_label(),
            payload_len: h.payload_len(),
            next_header: h.next_header(),
            hop_limit: h.hop_limit(),
            sgid: h.sgid(),
            dgid: h.dgid(),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        GRH_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Grh<T>) {
        h.set_word0(6, self.tclass, self.flow_label);
        h.set_payload_len(self.payload_len);
        h.set_next_header(self.next_header);
        h.set_hop_limit(self.hop_limit);
        h.set_sgid(&self.sgid);
        h.set_dgid(&self.dgid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes() -> [u8; 40] {
        let mut b = [0u8; 40];
        b[..8].copy_from_slice(&[0x6a, 0xbc, 0xde, 0xf1, 0x00, 0x24, 0x1b, 0x40]);
        b[8..24].copy_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]);
        b[24..40].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        b
    }

    #[test]
    fn parse_and_emit() {
        let b = bytes();
        let r = GrhRepr::parse(&Grh::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!((r.tclass, r.flow_label), (0xab, 0xcdef1));
        assert_eq!(
            (r.payload_len, r.next_header, r.hop_limit),
            (0x24, NEXT_HEADER_IBA, 0x40)
        );
        assert_eq!(r.sgid[12..], [10, 0, 0, 1]);
        assert_eq!(r.dgid[15], 2);
        let mut out = [0u8; 40];
        r.emit(&mut Grh::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
    }

    #[test]
    fn not_version_6_is_an_error() {
        let mut b = bytes();
        b[0] = 0x45;
        assert!(GrhRepr::parse(&Grh::new_checked(&b[..]).unwrap()).is_err());
        assert!(Grh::new_checked(&b[..39]).is_err());
    }
}
