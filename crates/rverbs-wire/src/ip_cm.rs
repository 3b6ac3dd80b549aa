//! The RDMA IP CM service (IBA vol. 1 Annex A11) as Linux's rdma_cm speaks
//! it: how an IP address and port become a CM service ID, and the header
//! rdma_cm puts at the start of a REQ's (and a SIDR_REQ's) private data.
//!
//! The service ID of an rdma_cm port is `port_space << 16 | port` (the
//! kernel's `rdma_get_service_id`); the TCP, UDP and IB port spaces carry
//! the annex's `0x01` prefix in their code, so for them it is
//! `0x0000_0000_01PP_pppp` with the IP protocol number in `PP`.
//!
//! [`IpCmHdr`] (36 bytes, the kernel's `struct cma_hdr`):
//!
//! ```text
//!  0      version (0)
//!  1      IP version[0..4] (4 or 6), reserved[4..8]
//!  2..4   source port (the active side's)
//!  4..20  source IP address
//! 20..36  destination IP address
//! ```
//!
//! An IPv4 address sits in the last 4 of its 16 bytes; the kernel writes the
//! other 12 as zero and never reads them, and so does this module. The
//! passive side learns the destination port from the service ID, not from
//! this header. What a REQ has left for the user is its 92 bytes less these
//! 36: [`user_private_data_len::REQ`] = 56, as `rdma_connect(3)` says.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::bytes::{get_u16, set_u16};
use crate::cm::{CmDrep, CmDreq, CmMra, CmRej, CmRep, CmReq, CmRtu, CmSidrRep, CmSidrReq};
use crate::macros::header_view;
use crate::{Error, Result};

/// Length of the RDMA IP CM header.
pub const IP_CM_HDR_LEN: usize = 36;
/// The header version rdma_cm writes and accepts.
pub const IP_CM_VERSION: u8 = 0;

/// An rdma_cm port space (`enum rdma_ucm_port_space`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RdmaPortSpace {
    /// `RDMA_PS_IPOIB` (0x0002).
    Ipoib,
    /// `RDMA_PS_TCP` (0x0106): reliable connections, `rping`'s.
    Tcp,
    /// `RDMA_PS_UDP` (0x0111): UD QPs, resolved with SIDR.
    Udp,
    /// `RDMA_PS_IB` (0x013F): either.
    Ib,
}

impl RdmaPortSpace {
    /// The port space's code.
    pub const fn code(self) -> u16 {
        match self {
            RdmaPortSpace::Ipoib => 0x0002,
            RdmaPortSpace::Tcp => 0x0106,
            RdmaPortSpace::Udp => 0x0111,
            RdmaPortSpace::Ib => 0x013F,
        }
    }

    /// The port space with this code.
    pub const fn from_code(code: u16) -> Option<Self> {
        match code {
            0x0002 => Some(RdmaPortSpace::Ipoib),
            0x0106 => Some(RdmaPortSpace::Tcp),
            0x0111 => Some(RdmaPortSpace::Udp),
            0x013F => Some(RdmaPortSpace::Ib),
            _ => None,
        }
    }

    /// The CM service ID of `port` in this port space.
    pub const fn service_id(self, port: u16) -> u64 {
        ((self.code() as u64) << 16) | port as u64
    }

    /// The port space and port a service ID names, if it is an rdma_cm one
    /// (high 32 bits zero, a known port space).
    pub const fn from_service_id(service_id: u64) -> Option<(Self, u16)> {
        if service_id >> 32 != 0 {
            return None;
        }
        match Self::from_code((service_id >> 16) as u16) {
            Some(ps) => Some((ps, service_id as u16)),
            None => None,
        }
    }
}

/// Private data left to the user of rdma_cm in each message: the CM's
/// private data less the [`IpCmHdr`] for REQ and SIDR_REQ (as
/// `rdma_connect(3)` and `rdma_accept(3)` give them: 56 and 196 bytes for
/// `RDMA_PS_TCP`, 180 and 136 for `RDMA_PS_UDP`).
pub mod user_private_data_len {
    use super::*;

    /// REQ: 92 − 36.
    pub const REQ: usize = CmReq::<&[u8]>::PRIVATE_DATA_LEN - IP_CM_HDR_LEN;
    /// MRA.
    pub const MRA: usize = CmMra::<&[u8]>::PRIVATE_DATA_LEN;
    /// REJ.
    pub const REJ: usize = CmRej::<&[u8]>::PRIVATE_DATA_LEN;
    /// REP.
    pub const REP: usize = CmRep::<&[u8]>::PRIVATE_DATA_LEN;
    /// RTU.
    pub const RTU: usize = CmRtu::<&[u8]>::PRIVATE_DATA_LEN;
    /// DREQ.
    pub const DREQ: usize = CmDreq::<&[u8]>::PRIVATE_DATA_LEN;
    /// DREP.
    pub const DREP: usize = CmDrep::<&[u8]>::PRIVATE_DATA_LEN;
    /// SIDR_REQ: 216 − 36.
    pub const SIDR_REQ: usize = CmSidrReq::<&[u8]>::PRIVATE_DATA_LEN - IP_CM_HDR_LEN;
    /// SIDR_REP.
    pub const SIDR_REP: usize = CmSidrRep::<&[u8]>::PRIVATE_DATA_LEN;
}

mod field {
    pub const VERSION: usize = 0;
    pub const IP_VERSION: usize = 1;
    pub const PORT: usize = 2;
    pub const SRC: usize = 4;
    pub const DST: usize = 20;
}

header_view! {
    /// A view of an RDMA IP CM header at the start of a buffer (a REQ's or a
    /// SIDR_REQ's private data).
    IpCmHdr, IP_CM_HDR_LEN
}

impl<T: AsRef<[u8]>> IpCmHdr<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Header version ([`IP_CM_VERSION`]).
    pub fn version(&self) -> u8 {
        self.b()[field::VERSION]
    }

    /// IP version (4 or 6; high nibble of byte 1).
    pub fn ip_version(&self) -> u8 {
        self.b()[field::IP_VERSION] >> 4
    }

    /// Source port: the active side's.
    pub fn src_port(&self) -> u16 {
        get_u16(self.b(), field::PORT)
    }

    /// The 16 bytes of the source address.
    pub fn src_bytes(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.b()[field::SRC..field::SRC + 16]);
        a
    }

    /// The 16 bytes of the destination address.
    pub fn dst_bytes(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.b()[field::DST..field::DST + 16]);
        a
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IpCmHdr<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets the header version.
    pub fn set_version(&mut self, v: u8) {
        self.bm()[field::VERSION] = v;
    }

    /// Sets the IP version (low four bits of `v`), keeping the reserved nibble.
    pub fn set_ip_version(&mut self, v: u8) {
        let b = &mut self.bm()[field::IP_VERSION];
        *b = (v << 4) | (*b & 0x0f);
    }

    /// Sets the source port.
    pub fn set_src_port(&mut self, port: u16) {
        set_u16(self.bm(), field::PORT, port);
    }

    /// Sets the 16 bytes of the source address.
    pub fn set_src_bytes(&mut self, a: &[u8; 16]) {
        self.bm()[field::SRC..field::SRC + 16].copy_from_slice(a);
    }

    /// Sets the 16 bytes of the destination address.
    pub fn set_dst_bytes(&mut self, a: &[u8; 16]) {
        self.bm()[field::DST..field::DST + 16].copy_from_slice(a);
    }
}

/// An RDMA IP CM header's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpCmHdrRepr {
    /// Source port.
    pub src_port: u16,
    /// Source address (the active side's).
    pub src: IpAddr,
    /// Destination address (the address the passive side listens on).
    pub dst: IpAddr,
}

/// An address in the header's 16-byte form: IPv4 in the last 4 bytes.
fn to_field(ip: IpAddr, as_v6: bool) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) if as_v6 => v4.to_ipv6_mapped().octets(),
        IpAddr::V4(v4) => {
            let mut a = [0; 16];
            a[12..].copy_from_slice(&v4.octets());
            a
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

impl IpCmHdrRepr {
    /// Reads a view: the version must be 0 and the IP version 4 or 6.
    pub fn parse<T: AsRef<[u8]>>(h: &IpCmHdr<T>) -> Result<Self> {
        h.check_len()?;
        if h.version() != IP_CM_VERSION {
            return Err(Error::InvalidField {
                field: "RDMA IP CM header version",
                value: h.version().into(),
            });
        }
        let (src, dst) = (h.src_bytes(), h.dst_bytes());
        let (src, dst) = match h.ip_version() {
            4 => {
                let v4 = |a: [u8; 16]| IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]));
                (v4(src), v4(dst))
            }
            6 => (
                IpAddr::V6(Ipv6Addr::from(src)),
                IpAddr::V6(Ipv6Addr::from(dst)),
            ),
            other => {
                return Err(Error::InvalidField {
                    field: "RDMA IP CM IP version",
                    value: other.into(),
                })
            }
        };
        Ok(IpCmHdrRepr {
            src_port: h.src_port(),
            src,
            dst,
        })
    }

    /// The IP version [`emit`](Self::emit) writes: 4 when both addresses
    /// are IPv4, else 6 (an IPv4 address then goes v4-mapped).
    pub const fn ip_version(&self) -> u8 {
        match (self.src, self.dst) {
            (IpAddr::V4(_), IpAddr::V4(_)) => 4,
            _ => 6,
        }
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        IP_CM_HDR_LEN
    }

    /// Writes the header; reserved bits and an IPv4 address's first 12
    /// bytes become zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut IpCmHdr<T>) {
        let ip_version = self.ip_version();
        h.set_version(IP_CM_VERSION);
        h.bm()[field::IP_VERSION] = 0;
        h.set_ip_version(ip_version);
        h.set_src_port(self.src_port);
        h.set_src_bytes(&to_field(self.src, ip_version == 6));
        h.set_dst_bytes(&to_field(self.dst, ip_version == 6));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids_match_the_kernel_port_spaces() {
        // RDMA_IB_IP_PS_TCP / _UDP / _IB in rdma_cm.h, plus a port.
        assert_eq!(RdmaPortSpace::Tcp.service_id(0), 0x0000_0000_0106_0000);
        assert_eq!(RdmaPortSpace::Udp.service_id(0), 0x0000_0000_0111_0000);
        assert_eq!(RdmaPortSpace::Ib.service_id(0), 0x0000_0000_013f_0000);
        assert_eq!(RdmaPortSpace::Ipoib.service_id(7), 0x0000_0000_0002_0007);
        // rping's default port 7174 (0x1c06).
        assert_eq!(RdmaPortSpace::Tcp.service_id(7174), 0x0106_1c06);
        assert_eq!(
            RdmaPortSpace::from_service_id(0x0106_1c06),
            Some((RdmaPortSpace::Tcp, 7174))
        );
        assert_eq!(RdmaPortSpace::from_service_id(0x0107_1c06), None);
        assert_eq!(RdmaPortSpace::from_service_id(1 << 32 | 0x0106_1c06), None);
        for ps in [
            RdmaPortSpace::Ipoib,
            RdmaPortSpace::Tcp,
            RdmaPortSpace::Udp,
            RdmaPortSpace::Ib,
        ] {
            assert_eq!(RdmaPortSpace::from_code(ps.code()), Some(ps));
            assert_eq!(
                RdmaPortSpace::from_service_id(ps.service_id(65535)),
                Some((ps, 65535))
            );
        }
    }

    #[test]
    fn user_private_data_limits() {
        use user_private_data_len::*;
        assert_eq!(
            [REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP],
            [56, 222, 148, 196, 224, 220, 224, 180, 136]
        );
    }

    #[test]
    fn ipv4_header() {
        // 10.0.0.1:40000 -> 10.0.0.2: version 0, IP version 4, port 0x9c40,
        // each IPv4 address in the last 4 bytes of 16 zero-padded ones.
        let mut bytes = [0u8; 36];
        bytes[1] = 0x40;
        bytes[2..4].copy_from_slice(&[0x9c, 0x40]);
        bytes[16..20].copy_from_slice(&[10, 0, 0, 1]);
        bytes[32..36].copy_from_slice(&[10, 0, 0, 2]);
        let repr = IpCmHdrRepr {
            src_port: 40000,
            src: Ipv4Addr::new(10, 0, 0, 1).into(),
            dst: Ipv4Addr::new(10, 0, 0, 2).into(),
        };
        let mut out = [0xffu8; 36];
        repr.emit(&mut IpCmHdr::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert_eq!(
            IpCmHdrRepr::parse(&IpCmHdr::new_checked(&bytes[..]).unwrap()),
            Ok(repr)
        );

        // The kernel reads only the last 4 bytes; so does parse.
        let mut padded = bytes;
        padded[4..16].fill(0xaa);
        padded[1] |= 0x0f; // reserved nibble
        assert_eq!(
            IpCmHdrRepr::parse(&IpCmHdr::new_checked(&padded[..]).unwrap()),
            Ok(repr)
        );
    }

    #[test]
    fn ipv6_header_and_mixed_families() {
        let src: Ipv6Addr = "fe80::1".parse().unwrap();
        let dst: Ipv6Addr = "fe80::2".parse().unwrap();
        let repr = IpCmHdrRepr {
            src_port: 1,
            src: src.into(),
            dst: dst.into(),
        };
        let mut out = [0u8; 36];
        repr.emit(&mut IpCmHdr::new_unchecked(&mut out[..]));
        assert_eq!(out[..4], [0, 0x60, 0, 1]);
        assert_eq!(out[4..20], src.octets());
        assert_eq!(out[20..36], dst.octets());
        assert_eq!(
            IpCmHdrRepr::parse(&IpCmHdr::new_checked(&out[..]).unwrap()),
            Ok(repr)
        );

        let mixed = IpCmHdrRepr {
            src_port: 1,
            src: Ipv4Addr::new(192, 0, 2, 1).into(),
            dst: dst.into(),
        };
        mixed.emit(&mut IpCmHdr::new_unchecked(&mut out[..]));
        assert_eq!(out[1], 0x60);
        let back = IpCmHdrRepr::parse(&IpCmHdr::new_checked(&out[..]).unwrap()).unwrap();
        assert_eq!(
            back.src,
            IpAddr::V6(Ipv4Addr::new(192, 0, 2, 1).to_ipv6_mapped())
        );
    }

    #[test]
    fn bad_headers_are_errors() {
        let mut bytes = [0u8; 36];
        bytes[1] = 0x40;
        assert!(IpCmHdr::new_checked(&bytes[..35]).is_err());
        bytes[0] = 1;
        assert_eq!(
            IpCmHdrRepr::parse(&IpCmHdr::new_checked(&bytes[..]).unwrap()),
            Err(Error::InvalidField {
                field: "RDMA IP CM header version",
                value: 1
            })
        );
        bytes[0] = 0;
        bytes[1] = 0x50;
        assert_eq!(
            IpCmHdrRepr::parse(&IpCmHdr::new_checked(&bytes[..]).unwrap()),
            Err(Error::InvalidField {
                field: "RDMA IP CM IP version",
                value: 5
            })
        );
    }
}
