//! `rverbs decode FILE`: one line per RoCEv2 packet of a pcap or pcapng
//! capture, in the spirit of tcpdump, with the ICRC verified against the IP
//! and UDP headers as captured — so packets of any sender check out,
//! whatever IP ID it used.
//!
//! Link types: Ethernet (VLAN tags skipped), Linux cooked SLL and SLL2,
//! BSD loopback (NULL/LOOP), and raw IP. A UDP datagram to port 4791 that is
//! not one valid RoCE packet but a batch sent with UDP GSO (as a capture on
//! `lo` shows them) is split into its segments, each checked with the IP ID
//! and lengths it had on the wire.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use clap::Args;
use etherparse::{LaxNetSlice, LaxSlicedPacket, TransportSlice};
use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, TsResolution};
use rverbs_wire::icrc::{self, ROCE_V2_PORT};
use rverbs_wire::{Opcode, PacketRepr};

/// Options of `rverbs decode`.
#[derive(Args, Debug)]
pub struct DecodeArgs {
    /// A pcap or pcapng capture (tcpdump -w, tshark -w, dumpcap).
    pub file: PathBuf,
    /// Exit non-zero if any RoCE packet has a wrong ICRC or is malformed.
    #[arg(long)]
    pub strict: bool,
}

/// What a capture held.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Frames read.
    pub frames: u64,
    /// RoCE packets decoded (GSO segments counted one by one).
    pub roce: u64,
    /// RoCE packets whose ICRC is wrong.
    pub bad_icrc: u64,
    /// UDP 4791 datagrams that are not RoCE packets, or cut short by the snap length.
    pub malformed: u64,
    /// Frames that are not UDP to port 4791.
    pub skipped: u64,
}

impl Summary {
    /// Packets `--strict` fails on.
    pub fn failures(&self) -> u64 {
        self.bad_icrc + self.malformed
    }
}

/// One captured frame.
struct Frame<'a> {
    number: u64,
    time: Duration,
    link: DataLink,
    data: &'a [u8],
    orig_len: u32,
}

/// Decodes `args.file`, writing one line per RoCE packet to `out`.
pub fn decode(args: &DecodeArgs, out: &mut impl Write) -> Result<Summary> {
    let file =
        File::open(&args.file).with_context(|| format!("cannot open {}", args.file.display()))?;
    let mut reader = BufReader::new(file);
    let magic = reader.fill_buf().context("cannot read the capture")?;
    let mut summary = Summary::default();
    let mut on_frame = |f: Frame<'_>| -> Result<()> {
        summary.frames += 1;
        decode_frame(&f, out, &mut summary)
    };
    match magic.get(..4) {
        Some([0x0a, 0x0d, 0x0d, 0x0a]) => read_pcapng(reader, &mut on_frame)?,
        Some([0xd4, 0xc3, 0xb2, 0xa1] | [0xa1, 0xb2, 0xc3, 0xd4])
        | Some([0x4d, 0x3c, 0xb2, 0xa1] | [0xa1, 0xb2, 0x3c, 0x4d]) => {
            read_pcap(reader, &mut on_frame)?
        }
        _ => bail!("{} is not a pcap or pcapng capture", args.file.display()),
    }
    Ok(summary)
}

fn read_pcap(
    reader: impl std::io::Read,
    on_frame: &mut impl FnMut(Frame<'_>) -> Result<()>,
) -> Result<()> {
    let mut pcap = PcapReader::new(reader).context("corrupt pcap file header")?;
    let header = pcap.header();
    let frac_ns = match header.ts_resolution {
        TsResolution::MicroSecond => 1_000,
        TsResolution::NanoSecond => 1,
    };
    let mut number = 0;
    // Raw records: pcap-file's checked packets refuse frames cut by the snap
    // length (orig_len > snaplen), which are normal in captures.
    while let Some(packet) = pcap.next_raw_packet() {
        number += 1;
        let packet =
            packet.with_context(|| format!("packet {number}: capture truncated or corrupt"))?;
        on_frame(Frame {
            number,
            time: Duration::new(u64::from(packet.ts_sec), 0)
                + Duration::from_nanos(u64::from(packet.ts_frac) * frac_ns),
            link: header.datalink,
            data: &packet.data,
            orig_len: packet.orig_len,
        })?;
    }
    Ok(())
}

fn read_pcapng(
    reader: impl std::io::Read,
    on_frame: &mut impl FnMut(Frame<'_>) -> Result<()>,
) -> Result<()> {
    let mut ng = PcapNgReader::new(reader).context("corrupt pcapng section header")?;
    // Per interface: link type and timestamp resolution (if_tsresol).
    let mut interfaces: Vec<(DataLink, u8)> = Vec::new();
    let mut number = 0;
    while let Some(block) = ng.next_block() {
        let block = block
            .with_context(|| format!("packet {}: capture truncated or corrupt", number + 1))?;
        let (iface, raw_time, data, orig_len) = match &block {
            Block::SectionHeader(_) => {
                interfaces.clear();
                continue;
            }
            Block::InterfaceDescription(idb) => {
                let resol = idb
                    .options
                    .iter()
                    .find_map(|o| match o {
                        InterfaceDescriptionOption::IfTsResol(r) => Some(*r),
                        _ => None,
                    })
                    .unwrap_or(6);
                interfaces.push((idb.linktype, resol));
                continue;
            }
            // pcap-file stores the raw 64-bit timestamp as nanoseconds.
            Block::EnhancedPacket(p) => (
                p.interface_id,
                Some(u64::try_from(p.timestamp.as_nanos()).unwrap_or(u64::MAX)),
                &p.data,
                p.original_len,
            ),
            Block::SimplePacket(p) => (0, None, &p.data, p.original_len),
            Block::Packet(p) => (
                u32::from(p.interface_id),
                Some(p.timestamp),
                &p.data,
                p.original_len,
            ),
            _ => continue,
        };
        number += 1;
        let Some(&(link, resol)) = interfaces.get(iface as usize) else {
            bail!("packet {number}: names interface {iface}, which the capture does not describe");
        };
        let time = raw_time.map_or(Duration::ZERO, |t| timestamp(t, resol));
        on_frame(Frame {
            number,
            time,
            link,
            data,
            orig_len,
        })?;
    }
    Ok(())
}

/// A pcapng timestamp in units of `if_tsresol` (10^-n s, or 2^-n s with the
/// top bit set) as a duration since the epoch.
fn timestamp(units: u64, resol: u8) -> Duration {
    // u64 units times 10^9 fits in u128, so nothing below can overflow.
    let units = u128::from(units);
    let n = u32::from(resol & 0x7f);
    let nanos = if resol & 0x80 != 0 {
        (units * 1_000_000_000).checked_shr(n).unwrap_or(0)
    } else if n <= 9 {
        units * 10u128.pow(9 - n)
    } else {
        units / 10u128.checked_pow(n - 9).unwrap_or(u128::MAX)
    };
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// The bytes from the IP header on, by link type.
fn ip_start(link: DataLink, data: &[u8]) -> Option<&[u8]> {
    let ip = match link {
        DataLink::ETHERNET => {
            let mut at = 12;
            loop {
                let ty = u16::from_be_bytes([*data.get(at)?, *data.get(at + 1)?]);
                match ty {
                    0x8100 | 0x88a8 | 0x9100 => at += 4,
                    0x0800 | 0x86dd => break data.get(at + 2..)?,
                    _ => return None,
                }
            }
        }
        DataLink::LINUX_SLL => data.get(16..)?,
        DataLink::LINUX_SLL2 => data.get(20..)?,
        DataLink::NULL | DataLink::LOOP => data.get(4..)?,
        DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => data,
        DataLink::Unknown(12 | 14) => data,
        _ => return None,
    };
    matches!(ip.first()? >> 4, 4 | 6).then_some(ip)
}

fn time_of_day(t: Duration) -> String {
    let s = t.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        s / 3600,
        s / 60 % 60,
        s % 60,
        t.subsec_micros()
    )
}

fn endpoint(ip: IpAddr, port: u16) -> String {
    format!("{ip}.{port}")
}

fn decode_frame(f: &Frame<'_>, out: &mut impl Write, summary: &mut Summary) -> Result<()> {
    let Some(ip_bytes) = ip_start(f.link, f.data) else {
        summary.skipped += 1;
        return Ok(());
    };
    let Ok(sliced) = LaxSlicedPacket::from_ip(ip_bytes) else {
        summary.skipped += 1;
        return Ok(());
    };
    let (ip_header, src, dst, fragmented): (&[u8], IpAddr, IpAddr, bool) = match &sliced.net {
        Some(LaxNetSlice::Ipv4(v4)) => {
            let h = v4.header();
            (
                &ip_bytes[..h.slice().len()],
                IpAddr::V4(h.source_addr()),
                IpAddr::V4(h.destination_addr()),
                v4.is_payload_fragmented(),
            )
        }
        Some(LaxNetSlice::Ipv6(v6)) => {
            let h = v6.header();
            (
                &ip_bytes[..40],
                IpAddr::V6(h.source_addr()),
                IpAddr::V6(h.destination_addr()),
                v6.is_payload_fragmented(),
            )
        }
        _ => {
            summary.skipped += 1;
            return Ok(());
        }
    };
    let Some(TransportSlice::Udp(udp)) = &sliced.transport else {
        summary.skipped += 1;
        return Ok(());
    };
    if udp.destination_port() != ROCE_V2_PORT || fragmented {
        summary.skipped += 1;
        return Ok(());
    }
    let prefix = format!(
        "{} {} > {}:",
        time_of_day(f.time),
        endpoint(src, udp.source_port()),
        endpoint(dst, udp.destination_port())
    );
    let payload = udp.payload();
    let udp_header = udp.header_slice();
    let declared = usize::from(udp.length()).saturating_sub(8);
    if payload.len() < declared || (f.data.len() as u64) < u64::from(f.orig_len) {
        summary.malformed += 1;
        writeln!(
            out,
            "{prefix} truncated by the capture: {} of {} bytes (packet {})",
            payload.len(),
            declared.max(payload.len()),
            f.number
        )?;
        return Ok(());
    }
    // One RoCE packet, or a GSO batch of them.
    let whole = check_one(ip_header, udp_header, payload);
    if !matches!(whole, Verdict::Good(_)) {
        if let Some(segments) = split_gso(ip_header, udp_header, payload) {
            let n = segments.len();
            for (k, (p, crc)) in segments.into_iter().enumerate() {
                summary.roce += 1;
                writeln!(
                    out,
                    "{prefix} {p} icrc ok {crc:#010x} (gso segment {}/{n})",
                    k + 1
                )?;
            }
            return Ok(());
        }
    }
    match whole {
        Verdict::Good(p) => {
            summary.roce += 1;
            let crc = rverbs_wire::icrc_field(payload).unwrap_or_default();
            writeln!(out, "{prefix} {p} icrc ok {crc:#010x}")?;
        }
        Verdict::BadIcrc(p, computed, wire) => {
            summary.roce += 1;
            summary.bad_icrc += 1;
            writeln!(
                out,
                "{prefix} {p} icrc BAD {wire:#010x} (expected {computed:#010x})"
            )?;
        }
        Verdict::Malformed(e) => {
            summary.malformed += 1;
            writeln!(
                out,
                "{prefix} malformed RoCE packet: {e} (packet {})",
                f.number
            )?;
        }
    }
    Ok(())
}

enum Verdict<'a> {
    Good(PacketRepr<'a>),
    BadIcrc(PacketRepr<'a>, u32, u32),
    Malformed(rverbs_wire::Error),
}

fn check_one<'a>(ip: &[u8], udp: &[u8], roce: &'a [u8]) -> Verdict<'a> {
    match PacketRepr::parse(roce) {
        Err(e) => Verdict::Malformed(e),
        Ok(p) => match icrc::check(ip, udp, roce) {
            Ok((computed, wire)) if computed == wire => Verdict::Good(p),
            Ok((computed, wire)) => Verdict::BadIcrc(p, computed, wire),
            Err(e) => Verdict::Malformed(e),
        },
    }
}

/// Sizes a full RoCE packet can have: BTH and extension headers of any
/// opcode that carries payload, a path MTU of payload, and the ICRC.
fn segment_sizes() -> &'static BTreeSet<usize> {
    static SIZES: OnceLock<BTreeSet<usize>> = OnceLock::new();
    SIZES.get_or_init(|| {
        let headers: BTreeSet<usize> = Opcode::all()
            .filter_map(|o| o.info())
            .filter(|i| i.has_payload)
            .map(|i| i.header_len())
            .collect();
        headers
            .iter()
            .flat_map(|h| [256, 512, 1024, 2048, 4096].map(|mtu| h + mtu + 4))
            .collect()
    })
}

/// Splits a UDP GSO batch into its RoCE packets: every segment but the last
/// has the same size, and segment k went out with IP ID (first ID + k) and
/// its own IP and UDP lengths. `None` unless some segment size makes every
/// segment a valid packet with a valid ICRC.
fn split_gso<'a>(ip: &[u8], udp: &[u8], batch: &'a [u8]) -> Option<Vec<(PacketRepr<'a>, u32)>> {
    let v4 = ip.first()? >> 4 == 4;
    let base_id = if v4 {
        u16::from_be_bytes([ip[4], ip[5]])
    } else {
        0
    };
    'sizes: for &size in segment_sizes() {
        if batch.len() <= size {
            continue;
        }
        let mut found = Vec::new();
        for (k, seg) in batch.chunks(size).enumerate() {
            let mut ip_seg = ip.to_vec();
            let mut udp_seg = [0u8; 8];
            udp_seg.copy_from_slice(&udp[..8]);
            let udp_len = u16::try_from(seg.len() + 8).ok()?;
            udp_seg[4..6].copy_from_slice(&udp_len.to_be_bytes());
            if v4 {
                let total = udp_len.checked_add(ip.len() as u16)?;
                ip_seg[2..4].copy_from_slice(&total.to_be_bytes());
                ip_seg[4..6].copy_from_slice(&base_id.wrapping_add(k as u16).to_be_bytes());
            } else {
                ip_seg[4..6].copy_from_slice(&udp_len.to_be_bytes());
            }
            match check_one(&ip_seg, &udp_seg, seg) {
                Verdict::Good(p) => found.push((p, rverbs_wire::icrc_field(seg)?)),
                _ => continue 'sizes,
            }
        }
        return Some(found);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_of_day_is_utc_hh_mm_ss_micros() {
        assert_eq!(
            time_of_day(Duration::new(
                86_400 * 3 + 13 * 3600 + 5 * 60 + 7,
                123_456_789
            )),
            "13:05:07.123456"
        );
    }

    #[test]
    fn pcapng_timestamp_resolutions() {
        assert_eq!(timestamp(1_500_000, 6), Duration::from_millis(1500));
        assert_eq!(timestamp(1_500_000_000, 9), Duration::from_millis(1500));
        assert_eq!(timestamp(15, 1), Duration::from_millis(1500));
        assert_eq!(timestamp(3 << 10, 0x80 | 10), Duration::from_secs(3));
        assert_eq!(timestamp(1, 12), Duration::ZERO);
        assert_eq!(timestamp(u64::MAX, 0), Duration::from_nanos(u64::MAX));
        assert_eq!(timestamp(u64::MAX, 0x80 | 127), Duration::ZERO);
        assert_eq!(timestamp(u64::MAX, 127), Duration::ZERO);
    }

    #[test]
    fn segment_sizes_cover_middle_packets_at_every_mtu() {
        let sizes = segment_sizes();
        for mtu in [256, 512, 1024, 2048, 4096] {
            assert!(sizes.contains(&(12 + mtu + 4)), "{mtu}");
            assert!(sizes.contains(&(12 + 16 + mtu + 4)), "RETH {mtu}");
        }
    }

    #[test]
    fn link_layers() {
        let ip = [0x45u8, 0, 0, 20];
        let mut eth = vec![0u8; 12];
        eth.extend([0x81, 0x00, 0, 1, 0x08, 0x00]);
        eth.extend(ip);
        assert_eq!(ip_start(DataLink::ETHERNET, &eth), Some(&ip[..]));
        let mut sll2 = vec![0x08, 0x00];
        sll2.extend([0u8; 18]);
        sll2.extend(ip);
        assert_eq!(ip_start(DataLink::LINUX_SLL2, &sll2), Some(&ip[..]));
        assert_eq!(
            ip_start(DataLink::NULL, &[2, 0, 0, 0, 0x45]),
            Some(&[0x45u8][..])
        );
        assert_eq!(ip_start(DataLink::RAW, &[0x60]), Some(&[0x60u8][..]));
        assert_eq!(ip_start(DataLink::RAW, &[0x10]), None);
        assert_eq!(ip_start(DataLink::ETHERNET, &[0u8; 13]), None);
        assert_eq!(ip_start(DataLink::ETHERNET, &eth[..17]), None);
    }
}
