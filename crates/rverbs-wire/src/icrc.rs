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
//! [`udp_header`] build those; [`IpUdpHeaders::linux`] builds both as Linux
//! writes them for an unconnected Don't-Fragment socket).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

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

/// Finds the IPv4 identification a received packet was sent with, from its
/// ICRC, for a receiver that sees only the UDP payload.
///
/// The ICRC covers the IPv4 ID, which a UDP socket never reports, and senders
/// differ: Linux writes 0 on a DF packet of an unconnected socket (and
/// numbers a GSO send's segments 0, 1, 2 …), the kernel's Soft-RoCE and RoCE
/// NICs count. CRC-32 is linear over GF(2): with everything else fixed,
/// `icrc(id) = icrc(a) ^ L(id ^ a)` for any ID `a`, where `L` maps the 16
/// bits of the difference to 32 bits and depends only on how many bytes
/// follow the ID. `L(d)` is `d(x) · x^(32 + 8·after) mod P`; `x` has order
/// `2^32 - 1` modulo the CRC-32 polynomial, so it can be undone by
/// multiplying with `x` to the power left over. So from the ICRC computed for
/// the assumed ID and the one on the wire, one multiplication gives the only
/// difference that could make the packet valid; it is an ID if it fits in 16
/// bits, and if it does not, no ID makes the packet valid (it is corrupt).
///
/// What this costs the check: a packet whose ID is solved for is accepted
/// when its ICRC is right for *some* ID, so a random corruption passes with
/// odds 2^-16 instead of 2^-32. Receivers try the IDs they expect first and
/// count solved packets apart.
///
/// The multiplier per packet length is cached (the lengths a flow uses are
/// few: MTU-sized packets, ACKs, a tail).
#[derive(Debug, Clone)]
pub struct Ipv4IdSolver {
    /// Direct-mapped by `after % len`: (bytes after the ID, multiplier);
    /// `after` is never 0 (the UDP header alone follows the ID), so 0
    /// marks an empty slot.
    cache: [(u32, u32); SOLVER_CACHE],
}

const SOLVER_CACHE: usize = 32;

/// The CRC-32 (IEEE) polynomial, bit-reversed as the CRC runs.
const CRC32_POLY_REFLECTED: u32 = 0xedb8_8320;
/// The multiplicative order of `x` modulo the CRC-32 polynomial (it is
/// primitive); checked by a test.
const X_ORDER: u64 = (1 << 32) - 1;

impl Default for Ipv4IdSolver {
    fn default() -> Self {
        Self {
            cache: [(0, 0); SOLVER_CACHE],
        }
    }
}

impl Ipv4IdSolver {
    /// A solver with an empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The IPv4 ID that makes a packet's ICRC `on_wire`, given the ICRC
    /// `computed` for the same packet under the ID `assumed`, an IPv4 header
    /// of `ip_header_len` bytes, and `roce_len` bytes of BTH through pad
    /// (the ICRC not counted); `None` when no ID does.
    pub fn solve(
        &mut self,
        computed: u32,
        on_wire: u32,
        assumed: u16,
        ip_header_len: usize,
        roce_len: usize,
    ) -> Option<u16> {
        // Bytes of the pseudo-packet after the ID field: the rest of the IP
        // header, the UDP header, the RoCE packet.
        let after = ip_header_len.checked_sub(6)? + UDP_HEADER_LEN + roce_len;
        let after = u32::try_from(after).ok()?;
        let slot = after as usize % SOLVER_CACHE;
        let undo = match self.cache[slot] {
            (a, m) if a == after => m,
            _ => {
                let shift = (32 + 8 * u64::from(after)) % X_ORDER;
                let m = x_pow((X_ORDER - shift) % X_ORDER);
                self.cache[slot] = (after, m);
                m
            }
        };
        let d = gf2_mul(computed ^ on_wire, undo);
        // The difference as a 16-bit message polynomial: the ID's first
        // byte (high) in bits 16..24, its second in bits 24..32.
        if d & 0xffff != 0 {
            return None;
        }
        let diff = (((d >> 16) & 0xff) << 8 | (d >> 24)) as u16;
        Some(assumed ^ diff)
    }
}

/// `a · b` modulo the CRC-32 polynomial, both bit-reversed (`x^0` is bit
/// 31) as the CRC keeps its register.
fn gf2_mul(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    for i in 0..32 {
        if a & (0x8000_0000 >> i) != 0 {
            product ^= b;
        }
        // b · x
        b = if b & 1 != 0 {
            (b >> 1) ^ CRC32_POLY_REFLECTED
        } else {
            b >> 1
        };
    }
    product
}

/// `x^n` modulo the CRC-32 polynomial, bit-reversed.
fn x_pow(mut n: u64) -> u32 {
    let (mut result, mut square) = (0x8000_0000, 0x4000_0000); // x^0, x^1
    while n > 0 {
        if n & 1 != 0 {
            result = gf2_mul(result, square);
        }
        square = gf2_mul(square, square);
        n >>= 1;
    }
    result
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

/// The IP and UDP headers of a RoCEv2 packet as Linux writes them for an
/// unconnected UDP socket with Don't Fragment set — what a sender's ICRC is
/// computed over, and what a receiver that does not see the real headers
/// checks against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpUdpHeaders {
    ip: [u8; 40],
    ip_len: usize,
    udp: [u8; 8],
}

impl IpUdpHeaders {
    /// The headers of a packet of `roce_len` bytes (BTH to ICRC) from `src`
    /// to `dst`, with IPv4 ID `ipv4_id`: Linux writes 0 on DF packets of an
    /// unconnected socket, and k for segment k of a UDP GSO send. Two IPv4
    /// endpoints give an IPv4 header; otherwise both addresses are taken as
    /// IPv6 (IPv4 ones mapped), with traffic class, flow label and hop limit
    /// as Linux's defaults (the ICRC masks them anyway).
    pub fn linux(src: SocketAddr, dst: SocketAddr, roce_len: usize, ipv4_id: u16) -> Self {
        let udp_len = (roce_len + UDP_HEADER_LEN) as u16;
        let udp = udp_header(src.port(), dst.port(), udp_len);
        let mut ip = [0u8; 40];
        let ip_len = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let h = Ipv4Header {
                    src: s,
                    dst: d,
                    id: ipv4_id,
                    dont_fragment: true,
                    tos: 0,
                    ttl: 64,
                };
                ip[..20].copy_from_slice(&h.to_bytes(udp_len));
                20
            }
            (s, d) => {
                let v6 = |a: IpAddr| match a {
                    IpAddr::V6(v) => v,
                    IpAddr::V4(v) => v.to_ipv6_mapped(),
                };
                let h = Ipv6Header {
                    src: v6(s),
                    dst: v6(d),
                    traffic_class: 0,
                    flow_label: 0,
                    hop_limit: 64,
                };
                ip.copy_from_slice(&h.to_bytes(udp_len));
                40
            }
        };
        IpUdpHeaders { ip, ip_len, udp }
    }

    /// The IP header (20 bytes for IPv4, 40 for IPv6).
    pub fn ip(&self) -> &[u8] {
        &self.ip[..self.ip_len]
    }

    /// The UDP header (checksum 0).
    pub fn udp(&self) -> &[u8; 8] {
        &self.udp
    }

    /// Whether the IP header is IPv4 (it then has an ID).
    pub fn is_ipv4(&self) -> bool {
        self.ip_len == 20
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_headers_are_ipv4_between_ipv4_endpoints_else_ipv6() {
        let v4 = |s: &str| s.parse::<SocketAddr>().unwrap();
        let h = IpUdpHeaders::linux(v4("10.0.0.1:49152"), v4("10.0.0.2:4791"), 40, 7);
        assert!(h.is_ipv4());
        assert_eq!(h.ip().len(), 20);
        assert_eq!(&h.ip()[4..6], &7u16.to_be_bytes(), "the ID");
        assert_eq!(h.ip()[6], 0x40, "DF");
        assert_eq!(
            !ones_complement_sum(h.ip()),
            0,
            "the header checksum checks"
        );
        assert_eq!(h.udp(), &udp_header(49152, 4791, 48));
        let h = IpUdpHeaders::linux(v4("10.0.0.1:49152"), v4("[::1]:4791"), 40, 7);
        assert!(!h.is_ipv4());
        assert_eq!(h.ip().len(), 40);
        assert_eq!(
            &h.ip()[8..24],
            &"10.0.0.1"
                .parse::<Ipv4Addr>()
                .unwrap()
                .to_ipv6_mapped()
                .octets()
        );
    }

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
    fn x_is_primitive_modulo_the_crc_polynomial() {
        // x^(2^32 - 1) = 1, and no proper divisor of the order gives 1.
        assert_eq!(x_pow(X_ORDER), 0x8000_0000);
        for p in [3, 5, 17, 257, 65537] {
            assert_ne!(
                x_pow(X_ORDER / p),
                0x8000_0000,
                "order divides (2^32-1)/{p}"
            );
        }
    }

    /// A pseudo-random RoCE body of `len` bytes (a BTH first).
    fn body(len: usize, seed: u32) -> Vec<u8> {
        let mut b: Vec<u8> = (0..len as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
            .collect();
        b[0] = 0x04; // SEND only
        b
    }

    fn ipv4(id: u16, roce_len: usize) -> ([u8; 20], [u8; 8]) {
        let udp_len = (UDP_HEADER_LEN + roce_len + ICRC_LEN) as u16;
        let h = Ipv4Header {
            src: Ipv4Addr::new(198, 18, 0, 1),
            dst: Ipv4Addr::new(198, 18, 0, 2),
            id,
            dont_fragment: true,
            tos: 0,
            ttl: 64,
        };
        (
            h.to_bytes(udp_len),
            udp_header(49_152, ROCE_V2_PORT, udp_len),
        )
    }

    #[test]
    fn the_solver_finds_the_id_a_packet_was_sent_with() {
        let mut solver = Ipv4IdSolver::new();
        for (n, len) in [12usize, 13, 28, 40, 300, 1036, 4108, 9000]
            .iter()
            .enumerate()
        {
            let roce = body(*len, n as u32);
            for sent in [0u16, 1, 2, 63, 0x718c, 0xa8bf, 0xffff] {
                let (ip, udp) = ipv4(sent, roce.len());
                let on_wire = compute(&ip, &udp, &roce).unwrap();
                for assumed in [0u16, 5, sent, 0x8000] {
                    let (ip, udp) = ipv4(assumed, roce.len());
                    let computed = compute(&ip, &udp, &roce).unwrap();
                    let got = solver.solve(computed, on_wire, assumed, 20, roce.len());
                    assert_eq!(got, Some(sent), "len {len}, sent {sent}, assumed {assumed}");
                }
            }
        }
    }

    #[test]
    fn the_solver_finds_the_id_of_scapys_vector() {
        let (mut ip, udp, roce) = scapy_vector();
        let body = &roce[..roce.len() - ICRC_LEN];
        let (_, on_wire) = check(&ip, &udp, &roce).unwrap();
        ip[4..6].fill(0);
        let computed = compute(&ip, &udp, body).unwrap();
        let got = Ipv4IdSolver::new().solve(computed, on_wire, 0, 20, body.len());
        assert_eq!(got, Some(0x0478));
    }

    #[test]
    fn a_packet_right_for_no_id_is_refused() {
        // A wrong ICRC is taken for a different ID with odds 2^-16: the
        // solver refuses nearly all of them.
        let mut solver = Ipv4IdSolver::new();
        let roce = body(1036, 7);
        let (ip, udp) = ipv4(0, roce.len());
        let computed = compute(&ip, &udp, &roce).unwrap();
        let mut false_ids = 0;
        for k in 0..20_000u32 {
            let on_wire = computed ^ k.wrapping_mul(2_654_435_761).max(1);
            if solver.solve(computed, on_wire, 0, 20, roce.len()).is_some() {
                false_ids += 1;
            }
        }
        // 20,000 random wrong ICRCs at odds 2^-16: 0.3 expected.
        assert!(false_ids <= 3, "{false_ids} wrong ICRCs solved to an ID");
        // A flipped payload bit is no ID change.
        for bit in [0usize, 100, 8 * 1023 + 7] {
            let mut bad = roce.clone();
            bad[12 + bit / 8] ^= 1 << (bit % 8);
            let (ip, udp) = ipv4(0, roce.len());
            let wrong = compute(&ip, &udp, &bad).unwrap();
            assert_eq!(
                solver.solve(wrong, computed, 0, 20, roce.len()),
                None,
                "bit {bit}"
            );
        }
    }

    #[test]
    fn the_solver_counts_ip_options_and_ipv4_headers_only() {
        // A 24-byte IPv4 header (one option word): the ID sits as far from
        // the end as the packet and options say.
        let roce = body(60, 3);
        let udp_len = (UDP_HEADER_LEN + roce.len() + ICRC_LEN) as u16;
        let mut ip = [0u8; 24];
        ip[..20].copy_from_slice(&ipv4(0x1234, roce.len()).0);
        ip[0] = 0x46;
        ip[20..].copy_from_slice(&[1, 1, 1, 0]); // NOP NOP NOP EOL
        let udp = udp_header(1, ROCE_V2_PORT, udp_len);
        let on_wire = compute(&ip, &udp, &roce).unwrap();
        ip[4..6].copy_from_slice(&[0, 0]);
        let computed = compute(&ip, &udp, &roce).unwrap();
        let mut solver = Ipv4IdSolver::new();
        assert_eq!(
            solver.solve(computed, on_wire, 0, 24, roce.len()),
            Some(0x1234)
        );
        // Too short to hold an ID: no answer, no panic.
        assert_eq!(solver.solve(computed, on_wire, 0, 4, roce.len()), None);
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
