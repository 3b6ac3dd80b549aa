//! The RoCEv2 invariant CRC.
//!
//! CRC-32 (IEEE, as zlib) over a pseudo-packet: eight `0xff` bytes standing
//! for the IB LRH, the IP header with its variant fields set to all ones
//! (IPv4: TOS, TTL, header checksum; IPv6: traffic class, flow label, hop
//! limit), the UDP header with its checksum set to `0xffff`, the BTH with
//! byte 4 (FECN, BECN, reserved) set to `0xff`, then everything after the BTH
//! up to the ICRC. Everything else in the IP and UDP headers — total length,
//! IPv4 identification, flags, addresses, ports, UDP length — counts as sent.
//! The ICRC is stored least significant byte first.
//!
//! The functions take the IP and UDP headers as bytes, as captured or as the
//! sender will have the kernel write them ([`Ipv4Header`], [`Ipv6Header`],
//! [`udp_header`] build those).

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::bth::BTH_LEN;
use crate::packet::ICRC_LEN;
use crate::{Error, Result};

/// UDP destination port of RoCEv2.
pub const ROCE_V2_PORT: u16 = 4791;

/// Length of a UDP header.
pub const UDP_HEADER_LEN: usize = 8;

/// Computes the ICRC of `roce` (BTH through pad, without the ICRC) sent in
/// the IP packet whose header is `ip_header` (IPv4 with any options, or the
/// fixed IPv6 header) and the UDP header `udp_header`.
pub fn compute(ip_header: &[u8], udp_header: &[u8], roce: &[u8]) -> Result<u32> {
    compute_vectored(ip_header, udp_header, roce, &[])
}

/// [`compute`] over a packet in pieces, as a sender that sends straight from
/// several buffers has it: `head` (starting with the whole BTH) then each of
/// `rest`, together BTH through pad without the ICRC.
pub fn compute_vectored(
    ip_header: &[u8],
    udp_header: &[u8],
    head: &[u8],
    rest: &[&[u8]],
) -> Result<u32> {
    // The masked pseudo-header (LRH stand-in, IP, UDP, BTH) is gathered in
    // one buffer, with as much of the packet after it as fits: CRC-32 over
    // one buffer beats many small updates (a small packet is one update).
    let mut buf = [0u8; PSEUDO_BUFFER];
    buf[..8].fill(0xff);
    let mut n = 8;
    match ip_header.first().map(|b| b >> 4) {
        Some(4) => {
            let ihl = usize::from(ip_header[0] & 0x0f) * 4;
            if ihl < 20 || ip_header.len() < ihl {
                return Err(Error::BadIpHeader("IPv4 header length"));
            }
            let h = &mut buf[n..n + ihl];
            h.copy_from_slice(&ip_header[..ihl]);
            h[1] = 0xff; // TOS
            h[8] = 0xff; // TTL
            h[10] = 0xff; // header checksum
            h[11] = 0xff;
            n += ihl;
        }
        Some(6) => {
            if ip_header.len() < 40 {
                return Err(Error::BadIpHeader("IPv6 header shorter than 40 bytes"));
            }
            let h = &mut buf[n..n + 40];
            h.copy_from_slice(&ip_header[..40]);
            h[0] |= 0x0f; // traffic class, high nibble
            h[1] = 0xff; // traffic class low nibble, flow label high nibble
            h[2] = 0xff; // flow label
            h[3] = 0xff;
            h[7] = 0xff; // hop limit
            n += 40;
        }
        _ => return Err(Error::BadIpHeader("not IPv4 or IPv6")),
    }
    if udp_header.len() < UDP_HEADER_LEN {
        return Err(Error::BadIpHeader("UDP header shorter than 8 bytes"));
    }
    let u = &mut buf[n..n + UDP_HEADER_LEN];
    u.copy_from_slice(&udp_header[..UDP_HEADER_LEN]);
    u[6] = 0xff;
    u[7] = 0xff;
    n += UDP_HEADER_LEN;
    let roce = head;
    if roce.len() < BTH_LEN {
        return Err(Error::Truncated {
            needed: BTH_LEN,
            got: roce.len(),
        });
    }
    buf[n..n + BTH_LEN].copy_from_slice(&roce[..BTH_LEN]);
    buf[n + 4] = 0xff;
    n += BTH_LEN;
    let mut hasher = crc32fast::Hasher::new();
    // Then the rest of the packet: into the buffer while it fits.
    let mut pieces = std::iter::once(&roce[BTH_LEN..]).chain(rest.iter().copied());
    for piece in pieces.by_ref() {
        if n + piece.len() <= buf.len() {
            buf[n..n + piece.len()].copy_from_slice(piece);
            n += piece.len();
        } else {
            hasher.update(&buf[..n]);
            hasher.update(piece);
            n = 0;
            break;
        }
    }
    hasher.update(&buf[..n]);
    for piece in pieces {
        hasher.update(piece);
    }
    Ok(hasher.finalize())
}

/// Room for the pseudo-header (8 + 60 + 8 + 12 bytes at most) and the start
/// of the packet after the BTH.
const PSEUDO_BUFFER: usize = 192;

/// Computes the ICRC of `packet` (a whole RoCE packet, its last four bytes
/// the ICRC field) and writes it there.
pub fn fill(ip_header: &[u8], udp_header: &[u8], packet: &mut [u8]) -> Result<u32> {
    let body = packet.len().checked_sub(ICRC_LEN).ok_or(Error::Truncated {
        needed: ICRC_LEN,
        got: packet.len(),
    })?;
    let crc = compute(ip_header, udp_header, &packet[..body])?;
    packet[body..].copy_from_slice(&crc.to_le_bytes());
    Ok(crc)
}

/// Whether the ICRC at the end of `packet` matches; `Ok((computed, on_wire))`.
pub fn check(ip_header: &[u8], udp_header: &[u8], packet: &[u8]) -> Result<(u32, u32)> {
    let body = packet.len().checked_sub(ICRC_LEN).ok_or(Error::Truncated {
        needed: ICRC_LEN,
        got: packet.len(),
    })?;
    let computed = compute(ip_header, udp_header, &packet[..body])?;
    let t = &packet[body..];
    Ok((computed, u32::from_le_bytes([t[0], t[1], t[2], t[3]])))
}

/// The fields of an IPv4 header as a sender controls them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Header {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Identification (Linux writes 0 on DF packets of unconnected UDP sockets).
    pub id: u16,
    /// Don't Fragment.
    pub dont_fragment: bool,
    /// DSCP and ECN (not covered by the ICRC).
    pub tos: u8,
    /// Time to live (not covered by the ICRC).
    pub ttl: u8,
}

impl Ipv4Header {
    /// The 20-byte header of a UDP packet with `udp_len` bytes of UDP
    /// header and payload, checksum included.
    pub fn to_bytes(&self, udp_len: u16) -> [u8; 20] {
        let mut h = [0u8; 20];
        h[0] = 0x45;
        h[1] = self.tos;
        h[2..4].copy_from_slice(&(udp_len.wrapping_add(20)).to_be_bytes());
        h[4..6].copy_from_slice(&self.id.to_be_bytes());
        h[6] = if self.dont_fragment { 0x40 } else { 0 };
        h[8] = self.ttl;
        h[9] = 17; // UDP
        h[12..16].copy_from_slice(&self.src.octets());
        h[16..20].copy_from_slice(&self.dst.octets());
        let checksum = !ones_complement_sum(&h);
        h[10..12].copy_from_slice(&checksum.to_be_bytes());
        h
    }
}

/// The 16-bit one's-complement sum of `bytes` (an even count), as the IPv4
/// header checksum uses it: the checksum is the complement of the sum with
/// the field zero, and a header whose sum is `0xffff` checks.
pub fn ones_complement_sum(bytes: &[u8]) -> u16 {
    let sum = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum::<u32>();
    let folded = (sum & 0xffff) + (sum >> 16);
    ((folded & 0xffff) + (folded >> 16)) as u16
}

/// The fields of an IPv6 header as a sender controls them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Header {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Traffic class (not covered by the ICRC).
    pub traffic_class: u8,
    /// Flow label (not covered by the ICRC).
    pub flow_label: u32,
    /// Hop limit (not covered by the ICRC).
    pub hop_limit: u8,
}

impl Ipv6Header {
    /// The 40-byte header of a UDP packet with `udp_len` bytes of UDP
    /// header and payload.
    pub fn to_bytes(&self, udp_len: u16) -> [u8; 40] {
        let mut h = [0u8; 40];
        let w = (6u32 << 28) | (u32::from(self.traffic_class) << 20) | (self.flow_label & 0xf_ffff);
        h[..4].copy_from_slice(&w.to_be_bytes());
        h[4..6].copy_from_slice(&udp_len.to_be_bytes());
        h[6] = 17;
        h[7] = self.hop_limit;
        h[8..24].copy_from_slice(&self.src.octets());
        h[24..40].copy_from_slice(&self.dst.octets());
        h
    }
}

/// A UDP header with checksum 0 (the ICRC masks it anyway).
pub fn udp_header(src_port: u16, dst_port: u16, udp_len: u16) -> [u8; 8] {
    let mut u = [0u8; 8];
    u[..2].copy_from_slice(&src_port.to_be_bytes());
    u[2..4].copy_from_slice(&dst_port.to_be_bytes());
    u[4..6].copy_from_slice(&udp_len.to_be_bytes());
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The public vector from scapy's RoCE tests (WIRE.md).
    fn scapy_vector() -> (Vec<u8>, [u8; 8], Vec<u8>) {
        #[rustfmt::skip]
        let ip = vec![
            0x45, 0x01, 0x00, 0x40, 0x04, 0x78, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00,
            192, 168, 0, 7, 192, 168, 0, 7,
        ];
        let udp = udp_header(49152, ROCE_V2_PORT, 44);
        #[rustfmt::skip]
        let roce = vec![
            0x24, 0x60, 0xff, 0xff, 0x00, 0x00, 0x00, 0xd3, 0x00, 0xcf, 0x17, 0x10,
            0x46, 0x30, 0x81, 0x8b, 0xe2, 0x89, 0x35, 0xd9, 0x0e, 0x9a, 0x95, 0x50,
            0x54, 0x01, 0xbe, 0x88, 0x5e, 0x50, 0x00, 0x00,
            0x78, 0xf3, 0x53, 0xf3,
        ];
        (ip, udp, roce)
    }

    #[test]
    fn scapy_public_vector() {
        let (ip, udp, roce) = scapy_vector();
        let (computed, wire) = check(&ip, &udp, &roce).unwrap();
        assert_eq!(computed, wire);
        assert_eq!(computed.to_le_bytes(), [0x78, 0xf3, 0x53, 0xf3]);
    }

    #[test]
    fn variant_fields_do_not_matter_and_invariant_ones_do() {
        let (mut ip, mut udp, mut roce) = scapy_vector();
        let want = compute(&ip, &udp, &roce[..32]).unwrap();
        ip[1] = 0x00; // TOS
        ip[8] = 1; // TTL
        ip[10] = 0x12; // checksum
        udp[6] = 0xab; // UDP checksum
        roce[4] = 0xc0; // FECN/BECN
        assert_eq!(compute(&ip, &udp, &roce[..32]).unwrap(), want);
        ip[5] ^= 1; // identification
        assert_ne!(compute(&ip, &udp, &roce[..32]).unwrap(), want);
    }

    #[test]
    fn vectored_equals_contiguous() {
        let (ip, udp, roce) = scapy_vector();
        let body = &roce[..roce.len() - ICRC_LEN];
        let whole = compute(&ip, &udp, body).unwrap();
        for cut in [BTH_LEN, BTH_LEN + 1, body.len() - 1, body.len()] {
            let (head, tail) = body.split_at(cut);
            let (a, b) = tail.split_at(tail.len() / 2);
            assert_eq!(compute_vectored(&ip, &udp, head, &[a, b]).unwrap(), whole);
        }
        assert!(
            compute_vectored(&ip, &udp, &body[..4], &[&body[4..]]).is_err(),
            "head without the whole BTH"
        );
    }

    #[test]
    fn vectored_equals_contiguous_across_the_gather_buffer() {
        // A 4 KiB-payload packet: the contiguous form overflows the
        // pseudo-header buffer at once; cut into small pieces it fills it
        // piece by piece first.
        let (ip, udp, scapy) = scapy_vector();
        let mut body = scapy[..BTH_LEN].to_vec();
        body.extend((0..4100u32).map(|i| (i * 37 + 11) as u8));
        let whole = compute(&ip, &udp, &body).unwrap();
        for piece_len in [1, 7, 64, 150, 179, 180, 181, 4000] {
            let pieces: Vec<&[u8]> = body[BTH_LEN..].chunks(piece_len).collect();
            let got = compute_vectored(&ip, &udp, &body[..BTH_LEN], &pieces).unwrap();
            assert_eq!(got, whole, "pieces of {piece_len}");
        }
        // And the same bytes as one stream, to a plain CRC-32 of the masked
        // pseudo-packet.
        let mut masked = vec![0xff; 8];
        let mut i = ip.clone();
        (i[1], i[8], i[10], i[11]) = (0xff, 0xff, 0xff, 0xff);
        masked.extend(&i);
        masked.extend(&udp[..6]);
        masked.extend([0xff, 0xff]);
        let mut bth = body[..BTH_LEN].to_vec();
        bth[4] = 0xff;
        masked.extend(&bth);
        masked.extend(&body[BTH_LEN..]);
        assert_eq!(crc32fast::hash(&masked), whole);
    }

    #[test]
    fn fill_then_check() {
        let (ip, udp, mut roce) = scapy_vector();
        let n = roce.len();
        roce[n - 4..].fill(0);
        fill(&ip, &udp, &mut roce).unwrap();
        assert_eq!(&roce[n - 4..], &[0x78, 0xf3, 0x53, 0xf3]);
    }

    #[test]
    fn built_ipv4_header_reproduces_the_vector() {
        let (ip, _, _) = scapy_vector();
        let h = Ipv4Header {
            src: Ipv4Addr::new(192, 168, 0, 7),
            dst: Ipv4Addr::new(192, 168, 0, 7),
            id: 1144,
            dont_fragment: true,
            tos: 1,
            ttl: 64,
        };
        let built = h.to_bytes(44);
        assert_eq!(built[..10], ip[..10]);
        assert_eq!(built[12..], ip[12..]);
        // A valid checksum: the header sums to 0xffff.
        let sum: u32 = built
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        assert_eq!((sum & 0xffff) + (sum >> 16), 0xffff);
    }

    #[test]
    fn ipv6_masks_class_flow_and_hop_limit() {
        let h = Ipv6Header {
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        };
        let udp = udp_header(1, ROCE_V2_PORT, 8 + 16);
        let roce = [0x04u8, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1];
        let a = compute(&h.to_bytes(24), &udp, &roce).unwrap();
        let h2 = Ipv6Header {
            traffic_class: 0xb8,
            flow_label: 0x12345,
            hop_limit: 1,
            ..h
        };
        assert_eq!(compute(&h2.to_bytes(24), &udp, &roce).unwrap(), a);
        let h3 = Ipv6Header {
            dst: "fd00::3".parse().unwrap(),
            ..h
        };
        assert_ne!(compute(&h3.to_bytes(24), &udp, &roce).unwrap(), a);
    }

    #[test]
    fn bad_headers_are_errors_not_panics() {
        let udp = udp_header(1, 2, 3);
        let roce = [0u8; 12];
        assert!(compute(&[], &udp, &roce).is_err());
        assert!(compute(&[0x46, 0, 0, 0], &udp, &roce).is_err()); // IHL 6 but 4 bytes
        assert!(compute(&[0x44; 20], &udp, &roce).is_err()); // IHL 4
        assert!(compute(&[0x60; 39], &udp, &roce).is_err());
        assert!(compute(&[0x45; 20], &udp[..7], &roce).is_err());
        assert!(compute(&[0x45; 20], &udp, &roce[..11]).is_err());
        assert!(check(&[0x45; 20], &udp, &[1, 2]).is_err());
    }
}
