//! `rverbs decode FILE`: one line per RoCEv2 packet of a pcap or pcapng
//! capture, in the spirit of tcpdump, with the ICRC verified against the IP
//! and UDP headers as captured — so packets of any sender check out,
//! whatever IP ID it used.
//!
//! Link types: Ethernet (VLAN tags skipped), Linux cooked SLL and SLL2,
//! BSD loopback (NULL/LOOP), and raw IP. A UDP datagram to port 4791 that is
//! not one valid RoCE packet but a batch sent with UDP GSO (as a capture on
//! `lo` shows them) is split into its segments, each checked with the IP ID
//! and lengths it had on the wire and printed on a line of its own, marked
//! `(gso segment k/n of packet N)`.
//!
//! A packet to or from QP 1 (the General Services Interface) gets a second
//! line, indented by four spaces, dissecting its MAD ([`mad`]): a CM
//! message by name with its key fields, another class by number, or what
//! makes it one a receiver would drop (`… malformed: why`), which
//! `--strict` counts as a failure.

mod mad;

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use clap::Args;
use etherparse::{LaxNetSlice, LaxSlicedPacket, TransportSlice};
use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, TsResolution};
use rverbs_wire::icrc::{self, ROCE_V2_PORT};
use rverbs_wire::{Bth, Opcode, PacketRepr};

/// Options of `rverbs decode`.
#[derive(Args, Debug)]
pub struct DecodeArgs {
    /// A pcap or pcapng capture (tcpdump -w, tshark -w, dumpcap); `-`
    /// reads it from stdin as it comes (`tcpdump -U -w - | rverbs decode -`).
    pub file: PathBuf,
    /// Exit non-zero if any RoCE packet has a wrong ICRC or is malformed.
    #[arg(long)]
    pub strict: bool,
    /// One JSON object per RoCE packet (JSON Lines) instead of text: the
    /// frame, time, addresses, opcode, QP, PSN, headers, ICRC verdict, and
    /// a MAD's dissection.
    #[arg(long)]
    pub json: bool,
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
    /// RoCE packets to or from QP 1 (the GSI), whose payload is a MAD.
    pub mads: u64,
    /// Of those, the ones a receiver would drop: not a UD SEND Only, a
    /// wrong Q_Key, not 256 bytes, or a MAD that does not parse.
    pub bad_mads: u64,
}

impl Summary {
    /// Packets `--strict` fails on.
    pub fn failures(&self) -> u64 {
        self.bad_icrc + self.malformed + self.bad_mads
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
    let input: Box<dyn std::io::Read> = if args.file.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(
            File::open(&args.file)
                .with_context(|| format!("cannot open {}", args.file.display()))?,
        )
    };
    let mut reader = BufReader::new(input);
    let magic = reader.fill_buf().context("cannot read the capture")?;
    let mut summary = Summary::default();
    let mut on_frame = |f: Frame<'_>| -> Result<()> {
        summary.frames += 1;
        decode_frame(&f, out, &mut summary, args.json)
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

fn decode_frame(
    f: &Frame<'_>,
    out: &mut impl Write,
    summary: &mut Summary,
    json: bool,
) -> Result<()> {
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
    let at = Place {
        frame: f.number,
        time: time_of_day(f.time),
        src: endpoint(src, udp.source_port()),
        dst: endpoint(dst, udp.destination_port()),
        segment: None,
        json,
    };
    if payload.len() < declared || (f.data.len() as u64) < u64::from(f.orig_len) {
        summary.malformed += 1;
        if json {
            let line = serde_json::json!({
                "frame": at.frame, "time": at.time, "src": at.src, "dst": at.dst,
                "truncated": { "captured": payload.len(), "length": declared.max(payload.len()) },
            });
            writeln!(out, "{line}")?;
            return Ok(());
        }
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
            for (k, (seg, verdict)) in segments.into_iter().enumerate() {
                let note = Some(format!(
                    "(gso segment {}/{n} of packet {})",
                    k + 1,
                    f.number
                ));
                let at = Place {
                    segment: Some((k + 1, n)),
                    ..at.clone()
                };
                report(out, summary, &prefix, &at, seg, verdict, note)?;
            }
            return Ok(());
        }
    }
    let note = matches!(whole, Verdict::Malformed(_)).then(|| format!("(packet {})", f.number));
    report(out, summary, &prefix, &at, payload, whole, note)
}

/// Where a packet was in the capture, for `--json`.
#[derive(Clone)]
struct Place {
    frame: u64,
    time: String,
    src: String,
    dst: String,
    /// Its place in a GSO batch: (k, of n).
    segment: Option<(usize, usize)>,
    json: bool,
}

/// One RoCE packet as a JSON object (`--json`).
fn packet_json(at: &Place, packet: &[u8], verdict: &Verdict<'_>) -> serde_json::Value {
    use serde_json::json;
    let mut v = json!({
        "frame": at.frame,
        "time": at.time,
        "src": at.src,
        "dst": at.dst,
        "length": packet.len(),
    });
    if let Some((k, n)) = at.segment {
        v["gso_segment"] = json!({ "index": k, "of": n });
    }
    let p = match verdict {
        Verdict::Good(p) => {
            v["icrc"] = json!("ok");
            p
        }
        Verdict::BadIcrc(p, computed, wire) => {
            v["icrc"] = json!("bad");
            v["icrc_wire"] = json!(format!("{wire:#010x}"));
            v["icrc_expected"] = json!(format!("{computed:#010x}"));
            p
        }
        Verdict::Malformed(e) => {
            v["malformed"] = json!(e.to_string());
            return v;
        }
    };
    v["opcode"] = json!(p.bth.opcode.to_string());
    v["qpn"] = json!(p.bth.dest_qp);
    v["psn"] = json!(p.bth.psn.value());
    v["ack_req"] = json!(p.bth.ack_req);
    v["pkey"] = json!(p.bth.pkey);
    v["payload_len"] = json!(p.payload.len());
    if let Some(r) = &p.reth {
        v["reth"] = json!({ "va": r.va, "rkey": r.rkey, "len": r.dma_len });
    }
    if let Some(a) = &p.aeth {
        v["aeth"] = json!({ "syndrome": format!("{:?}", a.syndrome), "msn": a.msn });
    }
    if let Some(d) = &p.deth {
        v["deth"] = json!({ "qkey": d.qkey, "src_qp": d.src_qp });
    }
    v["text"] = json!(p.to_string());
    if let Some(line) = mad::dissect(p) {
        v["mad"] = json!({ "text": line.text, "malformed": line.malformed });
    }
    v
}

/// Prints one RoCE packet's line, `note` at its end, and its MAD's line if
/// it is to or from QP 1; counts them.
fn report(
    out: &mut impl Write,
    summary: &mut Summary,
    prefix: &str,
    at: &Place,
    packet: &[u8],
    verdict: Verdict<'_>,
    note: Option<String>,
) -> Result<()> {
    if at.json {
        match &verdict {
            Verdict::Good(p) | Verdict::BadIcrc(p, ..) => {
                summary.roce += 1;
                summary.bad_icrc += u64::from(matches!(verdict, Verdict::BadIcrc(..)));
                if let Some(line) = mad::dissect(p) {
                    summary.mads += 1;
                    summary.bad_mads += u64::from(line.malformed);
                }
            }
            Verdict::Malformed(_) => summary.malformed += 1,
        }
        writeln!(out, "{}", packet_json(at, packet, &verdict))?;
        return Ok(());
    }
    let note = note.map(|n| format!(" {n}")).unwrap_or_default();
    match verdict {
        Verdict::Good(p) => {
            summary.roce += 1;
            let crc = rverbs_wire::icrc_field(packet).unwrap_or_default();
            writeln!(out, "{prefix} {p} icrc ok {crc:#010x}{note}")?;
            report_mad(out, summary, &p)?;
        }
        Verdict::BadIcrc(p, computed, wire) => {
            summary.roce += 1;
            summary.bad_icrc += 1;
            writeln!(
                out,
                "{prefix} {p} icrc BAD {wire:#010x} (expected {computed:#010x}){note}"
            )?;
            report_mad(out, summary, &p)?;
        }
        Verdict::Malformed(e) => {
            summary.malformed += 1;
            writeln!(out, "{prefix} malformed RoCE packet: {e}{note}")?;
        }
    }
    Ok(())
}

/// Prints the MAD line of a packet to or from QP 1, indented, and counts it.
fn report_mad(out: &mut impl Write, summary: &mut Summary, p: &PacketRepr<'_>) -> Result<()> {
    if let Some(line) = mad::dissect(p) {
        summary.mads += 1;
        summary.bad_mads += u64::from(line.malformed);
        writeln!(out, "    {}", line.text)?;
    }
    Ok(())
}

enum Verdict<'a> {
    Good(PacketRepr<'a>),
    BadIcrc(PacketRepr<'a>, u32, u32),
    Malformed(rverbs_wire::Error),
}

impl Verdict<'_> {
    fn is_good(&self) -> bool {
        matches!(self, Verdict::Good(_))
    }
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

/// Path MTUs of RoCE, in bytes of payload per packet.
const PATH_MTUS: [usize; 5] = [256, 512, 1024, 2048, 4096];

/// Most payload a RoCE packet carries (the largest path MTU), pad included.
const MAX_PAYLOAD: usize = 4096;

/// The IP and UDP headers of a datagram holding a UDP GSO batch, and those
/// the kernel writes for each of its segments: IPv4 total length (IPv6
/// payload length) and UDP length of the segment, IPv4 ID the batch's plus
/// the segment's index; everything else as captured.
struct GsoHeaders<'h> {
    ip: &'h [u8],
    udp: &'h [u8],
}

impl GsoHeaders<'_> {
    /// The verdict on `seg`, segment `k` of the batch (from 0).
    fn check<'a>(&self, k: usize, seg: &'a [u8]) -> Verdict<'a> {
        // Cheap checks first: most sizes tried are wrong and fail to parse.
        if let Err(e) = PacketRepr::parse(seg) {
            return Verdict::Malformed(e);
        }
        let mut ip = [0u8; 60];
        let Some(ip) = ip.get_mut(..self.ip.len()) else {
            return Verdict::Malformed(rverbs_wire::Error::BadIpHeader("IP header too long"));
        };
        ip.copy_from_slice(self.ip);
        let mut udp = [0u8; 8];
        udp.copy_from_slice(&self.udp[..8]);
        let field = |b: &[u8], at: usize| usize::from(u16::from_be_bytes([b[at], b[at + 1]]));
        let udp_len = seg.len() + 8;
        // Bytes between the IP header and the UDP header (IPv6 extension
        // headers), as the captured lengths say.
        let (len_at, before_udp) = if ip[0] >> 4 == 4 {
            (2, ip.len())
        } else {
            (4, field(ip, 4).saturating_sub(field(&udp, 4)))
        };
        let (Ok(ip_len), Ok(udp_len)) =
            (u16::try_from(before_udp + udp_len), u16::try_from(udp_len))
        else {
            return Verdict::Malformed(rverbs_wire::Error::BadIpHeader(
                "GSO segment longer than an IP packet",
            ));
        };
        ip[len_at..len_at + 2].copy_from_slice(&ip_len.to_be_bytes());
        if ip[0] >> 4 == 4 {
            // Truncating k is right: the ID counts modulo 2^16.
            let id = (field(ip, 4) as u16).wrapping_add(k as u16);
            ip[4..6].copy_from_slice(&id.to_be_bytes());
        }
        udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
        check_one(ip, &udp, seg)
    }
}

/// The segment sizes to try for a GSO batch of `len` bytes that starts with
/// a packet of opcode `op`, likeliest first: its headers with a path MTU of
/// payload (what all but the last packet of a long message carry), then
/// with any payload up to the largest MTU. A packet without payload has one
/// size. Sizes that leave a single segment are not batches.
fn candidate_sizes(op: Opcode, len: usize) -> Vec<usize> {
    let Some(info) = op.info() else {
        return Vec::new();
    };
    let h = info.header_len();
    let mut sizes = vec![h + 4];
    if info.has_payload {
        sizes = PATH_MTUS.iter().map(|mtu| h + mtu + 4).collect();
        sizes.extend(
            (0..=MAX_PAYLOAD)
                .step_by(4)
                .filter(|p| !PATH_MTUS.contains(p))
                .map(|p| h + p + 4),
        );
    }
    sizes.retain(|&s| s < len);
    sizes
}

/// Whether `next` starts with a BTH of the same flow as `first`'s: a known
/// opcode, TVer 0, the same P_Key and destination QP. Sizes that put such
/// a header at the second segment are tried first.
fn same_flow(first: &[u8], next: &[u8]) -> bool {
    let (Ok(a), Ok(b)) = (Bth::new_checked(first), Bth::new_checked(next)) else {
        return false;
    };
    b.opcode().info().is_some()
        && b.tver() == 0
        && a.pkey() == b.pkey()
        && a.dest_qp() == b.dest_qp()
}

/// Splits a UDP GSO batch into its RoCE packets, each with its verdict:
/// every segment but the last has the same size, and segment k went out
/// with IPv4 ID (the batch's ID + k) and its own IP and UDP lengths.
///
/// The size is the one for which the first segment is a valid packet with
/// a valid ICRC — or failing that (a corrupted first packet), the second.
/// A 32-bit ICRC that checks out at the end of a candidate segment is
/// proof enough of its size; the other segments get their own verdicts.
/// `None` if no size makes either segment valid.
///
/// Cost: each size tried costs a parse of the first segment's headers and,
/// if they parse, a CRC over it. Sizes come from the first packet's opcode
/// (at most one per four bytes of a maximum-size packet, about a thousand),
/// the likeliest first, so a real batch is usually split on the first try.
fn split_gso<'a>(ip: &[u8], udp: &[u8], batch: &'a [u8]) -> Option<Vec<(&'a [u8], Verdict<'a>)>> {
    if !matches!(ip.first()? >> 4, 4 | 6) || udp.len() < 8 {
        return None;
    }
    let headers = GsoHeaders { ip, udp };
    let mut sizes = candidate_sizes(Opcode(*batch.first()?), batch.len());
    // Stable: the MTU sizes stay ahead among the likely ones.
    sizes.sort_by_key(|&s| !same_flow(batch, &batch[s..]));
    let mut first_good = None;
    let mut second_good = None;
    for s in sizes {
        // The last segment must have room for a BTH and an ICRC.
        if (batch.len() - 1) % s + 1 < 16 {
            continue;
        }
        if headers.check(0, &batch[..s]).is_good() {
            first_good = Some(s);
            break;
        }
        if second_good.is_none()
            && headers
                .check(1, &batch[s..batch.len().min(2 * s)])
                .is_good()
        {
            second_good = Some(s);
        }
    }
    let s = first_good.or(second_good)?;
    Some(
        batch
            .chunks(s)
            .enumerate()
            .map(|(k, seg)| (seg, headers.check(k, seg)))
            .collect(),
    )
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
    fn candidate_sizes_put_full_mtu_packets_first() {
        let sizes = candidate_sizes(Opcode::RC_RDMA_WRITE_MIDDLE, 65_000);
        assert_eq!(
            sizes[..5],
            [12 + 256 + 4, 12 + 516, 12 + 1028, 12 + 2052, 12 + 4100]
        );
        // Then every multiple of four up to the largest packet, once each.
        assert_eq!(sizes.len(), 4096 / 4 + 1);
        assert!(sizes.contains(&16) && sizes.contains(&(12 + 100 + 4)));
        let reth = candidate_sizes(Opcode::RC_RDMA_WRITE_FIRST, 65_000);
        assert_eq!(reth[4], 12 + 16 + 4096 + 4);
        // No payload: one size. Too long for the datagram: none.
        assert_eq!(candidate_sizes(Opcode::RC_ACKNOWLEDGE, 100), [20]);
        assert!(candidate_sizes(Opcode::RC_RDMA_READ_REQUEST, 32).is_empty());
        assert!(candidate_sizes(Opcode(0x40), 1000).is_empty());
    }

    use rverbs_wire::{AethRepr, BthRepr, Headers, Psn, RethRepr, Syndrome};
    use std::net::Ipv4Addr;

    const QP: u32 = 0x12_3456;

    /// A RoCE packet as rverbs builds it (ICRC not yet filled in).
    fn packet(op: Opcode, psn: u32, payload: &[u8]) -> Vec<u8> {
        let info = op.info().unwrap();
        let mut p = PacketRepr::new(BthRepr {
            ack_req: true,
            ..BthRepr::new(op, QP, Psn::new(psn))
        });
        if info.headers.contains(Headers::RETH) {
            p.reth = Some(RethRepr {
                va: 0x7f00_0000_1000,
                rkey: 0xabcd,
                dma_len: 1 << 20,
            });
        }
        if info.headers.contains(Headers::AETH) {
            p.aeth = Some(AethRepr {
                syndrome: Syndrome::Ack { credits: 31 },
                msn: psn,
            });
        }
        p.payload = payload;
        let mut buf = vec![0; p.buffer_len()];
        p.emit(&mut buf).unwrap();
        buf
    }

    /// Which IP the test batches travel over; IPv4 with the batch's ID.
    #[derive(Clone, Copy)]
    enum Net {
        V4(u16),
        V6,
    }

    /// IP and UDP headers of a datagram with `len` bytes of UDP payload,
    /// IPv4 ID `id`.
    fn headers(net: Net, len: usize, id: u16) -> (Vec<u8>, [u8; 8]) {
        let udp_len = u16::try_from(len + 8).unwrap();
        let udp = icrc::udp_header(49152, ROCE_V2_PORT, udp_len);
        let ip = match net {
            Net::V4(_) => icrc::Ipv4Header {
                src: Ipv4Addr::new(127, 0, 0, 1),
                dst: Ipv4Addr::new(127, 0, 0, 2),
                id,
                dont_fragment: true,
                tos: 0,
                ttl: 64,
            }
            .to_bytes(udp_len)
            .to_vec(),
            Net::V6 => icrc::Ipv6Header {
                src: "fd00::1".parse().unwrap(),
                dst: "fd00::2".parse().unwrap(),
                traffic_class: 0,
                flow_label: 0x1234,
                hop_limit: 64,
            }
            .to_bytes(udp_len)
            .to_vec(),
        };
        (ip, udp)
    }

    /// A GSO batch of `packets` as a capture before segmentation shows it:
    /// one datagram (IP and UDP header, payload), each packet's ICRC filled
    /// in for the headers its segment gets on the wire.
    fn batch(net: Net, packets: &[Vec<u8>]) -> (Vec<u8>, [u8; 8], Vec<u8>) {
        let base = match net {
            Net::V4(id) => id,
            Net::V6 => 0,
        };
        let mut all = Vec::new();
        for (k, p) in packets.iter().enumerate() {
            let mut p = p.clone();
            let (ip, udp) = headers(net, p.len(), base.wrapping_add(k as u16));
            icrc::fill(&ip, &udp, &mut p).unwrap();
            all.extend(p);
        }
        let (ip, udp) = headers(net, all.len(), base);
        (ip, udp, all)
    }

    /// Splits the batch and checks every segment is `packets[k]`, valid.
    fn assert_splits(net: Net, packets: &[Vec<u8>]) {
        let (ip, udp, all) = batch(net, packets);
        assert!(!check_one(&ip, &udp, &all).is_good(), "not one packet");
        let segments = split_gso(&ip, &udp, &all).expect("split");
        assert_eq!(segments.len(), packets.len());
        for (k, ((seg, verdict), want)) in segments.iter().zip(packets).enumerate() {
            assert_eq!(seg.len(), want.len(), "segment {k}");
            assert_eq!(seg[..seg.len() - 4], want[..want.len() - 4], "segment {k}");
            let Verdict::Good(p) = verdict else {
                panic!("segment {k} is not valid");
            };
            assert_eq!(p.bth.opcode, Opcode(want[0]), "segment {k}");
        }
    }

    #[test]
    fn gso_batches_split_into_their_packets() {
        let v4 = Net::V4(0);
        // Full-MTU packets, the last one shorter (with pad).
        let mut write: Vec<Vec<u8>> = (0..3)
            .map(|k| packet(Opcode::RC_RDMA_WRITE_MIDDLE, 100 + k, &[k as u8; 1024]))
            .collect();
        write.push(packet(Opcode::RC_RDMA_WRITE_LAST, 103, &[9; 101]));
        assert_splits(v4, &write);
        // A first packet with a RETH, then a middle one (shorter).
        assert_splits(
            v4,
            &[
                packet(Opcode::RC_RDMA_WRITE_FIRST, 7, &[1; 4096]),
                packet(Opcode::RC_RDMA_WRITE_MIDDLE, 8, &[2; 4096]),
            ],
        );
        // A small SEND with the ACK held for it (latency test).
        assert_splits(
            v4,
            &[
                packet(Opcode::RC_SEND_ONLY, 5, &[0x5a; 8]),
                packet(Opcode::RC_ACKNOWLEDGE, 4, &[]),
            ],
        );
        // Small SENDs of one size: any payload length, not only an MTU.
        let sends: Vec<Vec<u8>> = (0..6)
            .map(|k| packet(Opcode::RC_SEND_ONLY, k, &[0; 333]))
            .collect();
        assert_splits(v4, &sends);
        // READ requests and ACKs: no payload.
        let reads: Vec<Vec<u8>> = (0..15)
            .map(|k| packet(Opcode::RC_RDMA_READ_REQUEST, 16 * k, &[]))
            .collect();
        assert_splits(v4, &reads);
        let acks: Vec<Vec<u8>> = (0..4)
            .map(|k| packet(Opcode::RC_ACKNOWLEDGE, k, &[]))
            .collect();
        assert_splits(v4, &acks);
        // IPv4 IDs count on from the captured one, modulo 2^16.
        assert_splits(Net::V4(65_534), &acks);
        // IPv6, 64 KB: 15 full READ responses and a short one.
        let mut resp: Vec<Vec<u8>> = (0..15)
            .map(|k| packet(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, k, &[k as u8; 4096]))
            .collect();
        resp.push(packet(Opcode::RC_RDMA_READ_RESPONSE_LAST, 15, &[3; 1000]));
        assert_splits(Net::V6, &resp);
    }

    #[test]
    fn gso_segments_need_their_own_ids_and_lengths() {
        // The ICRC of segment k covers ID k: the same bytes glued into one
        // datagram with the ICRCs of single packets (all ID 0) do not split.
        let acks: Vec<Vec<u8>> = (0..4)
            .map(|k| packet(Opcode::RC_ACKNOWLEDGE, k, &[]))
            .collect();
        let (ip, udp, mut all) = batch(Net::V4(0), &acks);
        for seg in all.chunks_mut(20) {
            let (ip, udp) = headers(Net::V4(0), 20, 0);
            icrc::fill(&ip, &udp, seg).unwrap();
        }
        let segments = split_gso(&ip, &udp, &all);
        assert!(segments.is_none_or(|s| s.iter().skip(1).all(|(_, v)| !v.is_good())));
        // Not a batch at all: a single packet with a bad ICRC stays one.
        let mut one = packet(Opcode::RC_SEND_ONLY, 1, &[0; 4096]);
        let (ip, udp) = headers(Net::V4(0), one.len(), 0);
        icrc::fill(&ip, &udp, &mut one).unwrap();
        one[100] ^= 1;
        assert!(split_gso(&ip, &udp, &one).is_none());
    }

    /// Decodes `frames` (raw IP packets) written to a pcap file.
    fn decode_frames(name: &str, frames: &[Vec<u8>], strict: bool) -> (Summary, String) {
        use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
        let path = std::env::temp_dir().join(format!(
            "rverbs-decode-unit-{name}-{}.pcap",
            std::process::id()
        ));
        let header = PcapHeader {
            datalink: DataLink::RAW,
            snaplen: 262_144,
            ..PcapHeader::default()
        };
        let mut w = PcapWriter::with_header(File::create(&path).unwrap(), header).unwrap();
        for f in frames {
            let len = u32::try_from(f.len()).unwrap();
            w.write_packet(&PcapPacket::new(Duration::from_secs(1), len, f))
                .unwrap();
        }
        drop(w);
        let mut out = Vec::new();
        let args = DecodeArgs {
            file: path.clone(),
            strict,
            json: false,
        };
        let summary = decode(&args, &mut out).unwrap();
        std::fs::remove_file(&path).unwrap();
        (summary, String::from_utf8(out).unwrap())
    }

    fn frame(ip: &[u8], udp: &[u8], payload: &[u8]) -> Vec<u8> {
        [ip, udp, payload].concat()
    }

    #[test]
    fn an_atomic_write_is_named() {
        let mut p = PacketRepr::new(BthRepr {
            ack_req: true,
            ..BthRepr::new(Opcode::RC_ATOMIC_WRITE, QP, Psn::new(77))
        });
        p.reth = Some(RethRepr {
            va: 0x7f00_0000_1008,
            rkey: 0xabcd,
            dma_len: 8,
        });
        p.payload = &[9; 8];
        let mut pkt = vec![0; p.buffer_len()];
        p.emit(&mut pkt).unwrap();
        let (ip, udp) = headers(Net::V4(0), pkt.len(), 0);
        icrc::fill(&ip, &udp, &mut pkt).unwrap();
        let (summary, out) = decode_frames("atomic-write", &[frame(&ip, &udp, &pkt)], true);
        assert!(
            out.contains("RC_ATOMIC_WRITE qp 0x123456 psn 77 ")
                && out.contains(" len 8 icrc ok 0x"),
            "{out}"
        );
        assert_eq!((summary.roce, summary.malformed), (1, 0));
    }

    #[test]
    fn a_batch_prints_one_line_per_segment_and_counts_them() {
        let sends: Vec<Vec<u8>> = (0..5)
            .map(|k| packet(Opcode::RC_SEND_ONLY, 40 + k, &[k as u8; 200]))
            .collect();
        let (ip, udp, all) = batch(Net::V4(0), &sends);
        let mut single = packet(Opcode::RC_ACKNOWLEDGE, 44, &[]);
        let (ip1, udp1) = headers(Net::V4(0), single.len(), 0);
        icrc::fill(&ip1, &udp1, &mut single).unwrap();
        let (summary, out) = decode_frames(
            "good",
            &[frame(&ip, &udp, &all), frame(&ip1, &udp1, &single)],
            true,
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 6, "{out}");
        for (k, line) in lines[..5].iter().enumerate() {
            assert!(line.contains(&format!("RC_SEND_ONLY qp 0x123456 psn {} ", 40 + k)));
            assert!(line.contains(" icrc ok 0x"), "{line}");
            assert!(
                line.ends_with(&format!(" (gso segment {}/5 of packet 1)", k + 1)),
                "{line}"
            );
        }
        // An ordinary packet's line is as it always was.
        assert_eq!(
            lines[5],
            format!(
                "00:00:01.000000 127.0.0.1.49152 > 127.0.0.2.4791: RC_ACKNOWLEDGE qp 0x123456 \
                 psn 44 [ACK] ACK credits 31 msn 44 len 0 icrc ok {:#010x}",
                rverbs_wire::icrc_field(&single).unwrap()
            )
        );
        assert_eq!(
            summary,
            Summary {
                frames: 2,
                roce: 6,
                ..Summary::default()
            }
        );
    }

    #[test]
    fn a_corrupted_segment_is_bad_and_fails_strict() {
        let sends: Vec<Vec<u8>> = (0..5)
            .map(|k| packet(Opcode::RC_SEND_ONLY, 40 + k, &[k as u8; 200]))
            .collect();
        let (ip, udp, all) = batch(Net::V4(0), &sends);
        let seg = sends[0].len();
        for (bad, at) in [(2, 2 * seg + 50), (0, 30), (4, 5 * seg - 1)] {
            let mut corrupt = all.clone();
            corrupt[at] ^= 0x10;
            let (summary, out) = decode_frames("bad", &[frame(&ip, &udp, &corrupt)], true);
            assert_eq!(
                summary,
                Summary {
                    frames: 1,
                    roce: 5,
                    bad_icrc: 1,
                    ..Summary::default()
                },
                "segment {bad}: {out}"
            );
            assert!(summary.failures() > 0);
            let lines: Vec<&str> = out.lines().collect();
            assert_eq!(lines.len(), 5, "{out}");
            for (k, line) in lines.iter().enumerate() {
                let verdict = if k == bad { " icrc BAD " } else { " icrc ok " };
                assert!(line.contains(verdict), "segment {bad}: {line}");
                assert!(line.contains(&format!("(gso segment {}/5 of packet 1)", k + 1)));
            }
        }
        // A segment whose headers no longer parse is malformed.
        let mut corrupt = all.clone();
        corrupt[3 * seg] = 0x40; // an RD opcode
        let (summary, out) = decode_frames("malformed", &[frame(&ip, &udp, &corrupt)], true);
        assert_eq!((summary.roce, summary.malformed), (4, 1), "{out}");
        assert!(out
            .lines()
            .nth(3)
            .unwrap()
            .contains("malformed RoCE packet: unknown opcode 0x40 (gso segment 4/5 of packet 1)"));
    }

    #[test]
    fn splitting_64k_datagrams_is_fast() {
        // The worst case: nothing splits, and every size parses (zeros are
        // valid headers), so every size costs a CRC over two segments.
        let sends: Vec<Vec<u8>> = (0..15)
            .map(|k| packet(Opcode::RC_SEND_ONLY, k, &[0; 4096]))
            .collect();
        let (ip, udp, mut all) = batch(Net::V4(0), &sends);
        assert_eq!(split_gso(&ip, &udp, &all).unwrap().len(), 15);
        all[20] ^= 1;
        all[4096 + 40] ^= 1;
        let start = std::time::Instant::now();
        assert!(split_gso(&ip, &udp, &all).is_none());
        let took = start.elapsed();
        // About 4 MB of CRC: milliseconds even unoptimized.
        assert!(took < Duration::from_secs(2), "{took:?}");
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

    // ---------------------------------------------------------------- MADs

    use rverbs_wire::mad::{cm_attr, MadRepr, GSI_QKEY, MAD_HDR_LEN, MAD_LEN};
    use rverbs_wire::{
        CmDrep, CmDreq, CmMra, CmRej, CmRep, CmReq, CmRtu, CmSidrRep, CmSidrReq, DethRepr, IpCmHdr,
        IpCmHdrRepr, Mad, RdmaPortSpace,
    };

    /// A UD SEND Only packet from `src_qp` to `dest_qp` with Q_Key `qkey`
    /// carrying `payload`, as an IPv4 frame with its ICRC filled in.
    fn ud_frame(op: Opcode, dest_qp: u32, src_qp: u32, qkey: u32, payload: &[u8]) -> Vec<u8> {
        let mut p = PacketRepr::new(BthRepr::new(op, dest_qp, Psn::new(7)));
        p.deth = Some(DethRepr { qkey, src_qp });
        if op.info().unwrap().headers.contains(Headers::IMM_DT) {
            p.imm_dt = Some(rverbs_wire::ImmDtRepr(0x1234));
        }
        p.payload = payload;
        let mut buf = vec![0; p.buffer_len()];
        p.emit(&mut buf).unwrap();
        let (ip, udp) = headers(Net::V4(0), buf.len(), 0);
        icrc::fill(&ip, &udp, &mut buf).unwrap();
        frame(&ip, &udp, &buf)
    }

    /// A MAD from QP 1 to QP 1, as the CM sends them.
    fn gsi_frame(mad: &[u8]) -> Vec<u8> {
        ud_frame(Opcode::UD_SEND_ONLY, 1, 1, GSI_QKEY, mad)
    }

    /// A CM MAD (method Send) of attribute `attr`, its message written by `fill`.
    fn cm_mad(attr: u16, tid: u64, fill: impl FnOnce(&mut [u8])) -> Vec<u8> {
        let mut mad = vec![0u8; MAD_LEN];
        MadRepr::cm_send(attr, tid).emit(&mut Mad::new_unchecked(&mut mad[..]));
        fill(&mut mad[MAD_HDR_LEN..]);
        mad
    }

    /// rdma_cm's IP CM header at the start of `pdata`.
    fn ip_cm(pdata: &mut [u8], src: [u8; 4], port: u16, dst: [u8; 4]) {
        IpCmHdrRepr {
            src_port: port,
            src: Ipv4Addr::from(src).into(),
            dst: Ipv4Addr::from(dst).into(),
        }
        .emit(&mut IpCmHdr::new_unchecked(&mut pdata[..36]));
    }

    fn req_mad() -> Vec<u8> {
        cm_mad(cm_attr::REQ, 0x1_0000_0001, |m| {
            let mut req = CmReq::new_unchecked(m);
            req.set_local_comm_id(0x1a2b_3c4d);
            req.set_service_id(RdmaPortSpace::Tcp.service_id(7302));
            req.set_local_qpn(0x12_ab34);
            req.set_starting_psn(Psn::new(4660));
            req.set_responder_resources(4);
            req.set_initiator_depth(2);
            req.set_pkey(0xffff);
            req.set_path_mtu(3);
            req.set_retry_count(7);
            req.set_rnr_retry_count(6);
            req.primary_path_mut().set_local_ack_timeout(14);
            let pdata = req.private_data_mut();
            ip_cm(pdata, [10, 0, 0, 1], 45678, [10, 0, 0, 2]);
            pdata[36..41].copy_from_slice(b"hello");
        })
    }

    /// Every CM message a connection uses, a ClassPortInfo query, an SA
    /// query, and UD traffic of other QPs.
    fn cm_capture() -> Vec<Vec<u8>> {
        let tid = 0x1_0000_0001;
        let rep = cm_mad(cm_attr::REP, tid, |m| {
            let mut rep = CmRep::new_unchecked(m);
            rep.set_local_comm_id(0x5566_7788);
            rep.set_remote_comm_id(0x1a2b_3c4d);
            rep.set_local_qpn(0x321);
            rep.set_starting_psn(Psn::new(99));
            rep.set_responder_resources(2);
            rep.set_initiator_depth(4);
            rep.set_rnr_retry_count(7);
        });
        let rtu = cm_mad(cm_attr::RTU, tid, |m| {
            let mut rtu = CmRtu::new_unchecked(m);
            rtu.set_local_comm_id(0x1a2b_3c4d);
            rtu.set_remote_comm_id(0x5566_7788);
        });
        let rej = |reason: u16, pdata: &[u8]| {
            let pdata = pdata.to_vec();
            cm_mad(cm_attr::REJ, 0x2_0000_0001, move |m| {
                let mut rej = CmRej::new_unchecked(m);
                rej.set_local_comm_id(0x0bad_cafe);
                rej.set_remote_comm_id(0x1a2b_3c4e);
                rej.set_reason(reason);
                rej.private_data_mut()[..pdata.len()].copy_from_slice(&pdata);
            })
        };
        let dreq = cm_mad(cm_attr::DREQ, 0x3_0000_0001, |m| {
            let mut dreq = CmDreq::new_unchecked(m);
            dreq.set_local_comm_id(0x1a2b_3c4d);
            dreq.set_remote_comm_id(0x5566_7788);
            dreq.set_remote_qpn(0x321);
        });
        let drep = cm_mad(cm_attr::DREP, 0x3_0000_0001, |m| {
            let mut drep = CmDrep::new_unchecked(m);
            drep.set_local_comm_id(0x5566_7788);
            drep.set_remote_comm_id(0x1a2b_3c4d);
        });
        let sidr_req = cm_mad(cm_attr::SIDR_REQ, 0x4_0000_0001, |m| {
            let mut sidr = CmSidrReq::new_unchecked(m);
            sidr.set_request_id(0x0a0b_0c0d);
            sidr.set_pkey(0xffff);
            sidr.set_service_id(RdmaPortSpace::Udp.service_id(20000));
            ip_cm(sidr.private_data_mut(), [10, 0, 0, 1], 50000, [10, 0, 0, 2]);
        });
        let sidr_rep = cm_mad(cm_attr::SIDR_REP, 0x4_0000_0001, |m| {
            let mut sidr = CmSidrRep::new_unchecked(m);
            sidr.set_request_id(0x0a0b_0c0d);
            sidr.set_status(0);
            sidr.set_qpn(0x42);
            sidr.set_qkey(0x1234);
            sidr.set_service_id(RdmaPortSpace::Udp.service_id(20000));
        });
        let mut class_port_info = cm_mad(cm_attr::CLASS_PORT_INFO, 5, |_| {});
        class_port_info[3] = rverbs_wire::mad::METHOD_GET;
        let mut sa = vec![0u8; MAD_LEN];
        MadRepr {
            mgmt_class: 0x03,
            method: rverbs_wire::mad::METHOD_GET,
            attribute_id: 0x0035,
            ..MadRepr::cm_send(0, 6)
        }
        .emit(&mut Mad::new_unchecked(&mut sa[..]));
        vec![
            gsi_frame(&req_mad()),
            gsi_frame(&rep),
            gsi_frame(&rtu),
            gsi_frame(&rej(8, &[])),
            gsi_frame(&rej(28, b"go away!!!")),
            gsi_frame(&dreq),
            gsi_frame(&drep),
            gsi_frame(&sidr_req),
            gsi_frame(&sidr_rep),
            gsi_frame(&class_port_info),
            gsi_frame(&sa),
            // Not QP 1's: a datagram of another QP, an RC packet.
            ud_frame(Opcode::UD_SEND_ONLY, 0x42, 0x43, 0x1234, &req_mad()),
            {
                let mut one = packet(Opcode::RC_SEND_ONLY, 1, &[0; 256]);
                let (ip, udp) = headers(Net::V4(0), one.len(), 0);
                icrc::fill(&ip, &udp, &mut one).unwrap();
                frame(&ip, &udp, &one)
            },
        ]
    }

    /// decode's output as (packet line, detail line if any) pairs.
    fn with_details(out: &str) -> Vec<(&str, Option<&str>)> {
        let mut packets: Vec<(&str, Option<&str>)> = Vec::new();
        for line in out.lines() {
            if let Some(detail) = line.strip_prefix("    ") {
                let last = packets.last_mut().expect("a detail line after a packet");
                assert!(last.1.is_none(), "two detail lines: {out}");
                last.1 = Some(detail);
            } else {
                packets.push((line, None));
            }
        }
        packets
    }

    #[track_caller]
    fn assert_has(line: &str, parts: &[&str]) {
        for part in parts {
            assert!(line.contains(part), "{part:?} missing in {line:?}");
        }
    }

    #[test]
    fn cm_mads_are_named_with_their_key_fields() {
        let (summary, out) = decode_frames("cm", &cm_capture(), true);
        let packets = with_details(&out);
        assert_eq!(packets.len(), 13, "{out}");
        for (line, _) in &packets {
            assert!(line.contains(" icrc ok "), "{line}");
        }
        // The packet line is as for any packet; the MAD is on the next one.
        assert_has(
            packets[0].0,
            &[
                "UD_SEND_ONLY qp 0x000001 ",
                " qkey 0x80010000 src-qp 0x000001 len 256 ",
            ],
        );
        let detail = |k: usize| {
            packets[k]
                .1
                .unwrap_or_else(|| panic!("no detail {k}: {out}"))
        };
        assert_eq!(
            detail(0),
            "CM REQ tid 0x100000001 comm 0x1a2b3c4d svc 0x1061c86 (rdma_cm TCP port 7302) \
             RC qpn 0x12ab34 psn 4660 mtu 1024 retry 7 rnr-retry 6 ack-timeout 14 \
             resp-res 4 init-depth 2 pdata 5 B (IP CM 10.0.0.1:45678 → 10.0.0.2:7302)"
        );
        assert_eq!(
            detail(1),
            "CM REP tid 0x100000001 comm 0x55667788→0x1a2b3c4d qpn 0x000321 psn 99 \
             resp-res 2 init-depth 4 rnr-retry 7"
        );
        assert_eq!(
            detail(2),
            "CM RTU tid 0x100000001 comm 0x1a2b3c4d→0x55667788"
        );
        assert_has(
            detail(3),
            &[
                "CM REJ ",
                "comm 0x0badcafe→0x1a2b3c4e",
                " rejects REQ ",
                " reason 8 (invalid service ID)",
            ],
        );
        assert!(!detail(3).contains("pdata"), "{}", detail(3));
        assert_has(
            detail(4),
            &["CM REJ ", " reason 28 (consumer defined) ", " pdata 10 B"],
        );
        assert_eq!(
            detail(5),
            "CM DREQ tid 0x300000001 comm 0x1a2b3c4d→0x55667788 qpn 0x000321"
        );
        assert_eq!(
            detail(6),
            "CM DREP tid 0x300000001 comm 0x55667788→0x1a2b3c4d"
        );
        assert_eq!(
            detail(7),
            "CM SIDR_REQ tid 0x400000001 req-id 0x0a0b0c0d svc 0x1114e20 \
             (rdma_cm UDP port 20000) (IP CM 10.0.0.1:50000 → 10.0.0.2:20000)"
        );
        assert_eq!(
            detail(8),
            "CM SIDR_REP tid 0x400000001 req-id 0x0a0b0c0d status 0 (success) \
             qpn 0x000042 qkey 0x00001234 svc 0x1114e20 (rdma_cm UDP port 20000)"
        );
        assert_eq!(detail(9), "CM ClassPortInfo tid 0x5 method GET");
        assert_eq!(
            detail(10),
            "MAD class 0x03 (SA) method GET attr 0x0035 tid 0x6"
        );
        // Other QPs' packets have no MAD line, whatever they carry.
        assert_eq!((packets[11].1, packets[12].1), (None, None), "{out}");
        assert_eq!(
            summary,
            Summary {
                frames: 13,
                roce: 13,
                mads: 11,
                ..Summary::default()
            }
        );
        assert_eq!(summary.failures(), 0);
    }

    #[test]
    fn a_malformed_mad_is_named_and_fails_strict() {
        let req = req_mad();
        let mra_of_nothing = cm_mad(cm_attr::MRA, 9, |m| {
            CmMra::new_unchecked(m).set_message_mraed(3);
        });
        let mut bad_ip_cm = req.clone();
        bad_ip_cm[MAD_HDR_LEN + 140] = 1; // IP CM header version 1
        let mut old_class = req.clone();
        old_class[2] = 1; // CM class version 1
        let mut long = req.clone();
        long.extend([0; 4]);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (gsi_frame(&req[..100]), "CM REQ malformed: truncated: need 256 bytes, have 100"),
            (gsi_frame(&req[..20]), "MAD malformed: truncated: need 256 bytes, have 20"),
            (gsi_frame(&long), "CM REQ malformed: 260 bytes, a MAD is 256"),
            (
                gsi_frame(&mra_of_nothing),
                "CM MRA malformed: MRA message MRAed holds 0x3, which is reserved or unsupported",
            ),
            (
                gsi_frame(&bad_ip_cm),
                "CM REQ malformed: IP CM header: RDMA IP CM header version holds 0x1, \
                 which is reserved or unsupported",
            ),
            (
                gsi_frame(&old_class),
                "CM REQ malformed: CM class version holds 0x1, which is reserved or unsupported",
            ),
            (
                ud_frame(Opcode::UD_SEND_ONLY, 1, 1, 0x1234, &req),
                "CM REQ malformed: Q_Key 0x00001234, not QP 1's 0x80010000",
            ),
            (
                ud_frame(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE, 1, 1, GSI_QKEY, &req),
                "CM REQ malformed: a MAD travels in a UD_SEND_ONLY, not a UD_SEND_ONLY_WITH_IMMEDIATE",
            ),
        ];
        for (k, (frame, want)) in cases.iter().enumerate() {
            let (summary, out) =
                decode_frames(&format!("badmad{k}"), std::slice::from_ref(frame), true);
            let packets = with_details(&out);
            assert_eq!(packets.len(), 1, "{out}");
            assert!(packets[0].0.contains(" icrc ok "), "{out}");
            assert_eq!(packets[0].1, Some(*want), "case {k}");
            assert_eq!(
                summary,
                Summary {
                    frames: 1,
                    roce: 1,
                    mads: 1,
                    bad_mads: 1,
                    ..Summary::default()
                },
                "case {k}"
            );
            assert_eq!(summary.failures(), 1, "case {k}");
        }
        // Among good ones, only the garbled MAD fails.
        let mut frames = cm_capture();
        frames.insert(3, gsi_frame(&mra_of_nothing));
        let (summary, out) = decode_frames("badmad-among", &frames, true);
        assert_eq!(
            (summary.mads, summary.bad_mads, summary.failures()),
            (12, 1, 1)
        );
        let packets = with_details(&out);
        assert!(
            packets[3].1.unwrap().starts_with("CM MRA malformed: "),
            "{out}"
        );
        assert!(
            packets
                .iter()
                .filter(|p| p.1.is_some_and(|d| d.contains("malformed")))
                .count()
                == 1
        );
    }

    #[test]
    fn a_mad_with_a_bad_icrc_is_still_dissected() {
        let mut frame = gsi_frame(&req_mad());
        let at = frame.len() - 10;
        frame[at] ^= 1; // in the private data: the REQ still parses
        let (summary, out) = decode_frames("badicrc-mad", &[frame], true);
        let packets = with_details(&out);
        assert!(packets[0].0.contains(" icrc BAD "), "{out}");
        assert!(
            packets[0].1.unwrap().starts_with("CM REQ tid 0x100000001 "),
            "{out}"
        );
        assert_eq!(
            (summary.bad_icrc, summary.mads, summary.bad_mads),
            (1, 1, 0)
        );
    }

    #[test]
    fn lap_apr_mra_and_unknown_attributes_are_named() {
        let dissect = |mad: &[u8]| {
            let mut p = PacketRepr::new(BthRepr::new(Opcode::UD_SEND_ONLY, 1, Psn::new(0)));
            p.deth = Some(DethRepr {
                qkey: GSI_QKEY,
                src_qp: 1,
            });
            p.payload = mad;
            let line = mad::dissect(&p).expect("a MAD to QP 1");
            assert!(!line.malformed, "{}", line.text);
            line.text
        };
        let lap = cm_mad(cm_attr::LAP, 1, |m| {
            let mut lap = rverbs_wire::CmLap::new_unchecked(m);
            lap.set_local_comm_id(1);
            lap.set_remote_comm_id(2);
            lap.set_remote_qpn(0x33);
        });
        assert_eq!(
            dissect(&lap),
            "CM LAP tid 0x1 comm 0x00000001→0x00000002 qpn 0x000033"
        );
        let apr = cm_mad(cm_attr::APR, 1, |m| {
            rverbs_wire::CmApr::new_unchecked(m).set_ap_status(5);
        });
        assert_eq!(
            dissect(&apr),
            "CM APR tid 0x1 comm 0x00000000→0x00000000 status 5"
        );
        let mra = cm_mad(cm_attr::MRA, 2, |m| {
            let mut mra = CmMra::new_unchecked(m);
            mra.set_local_comm_id(3);
            mra.set_remote_comm_id(4);
            mra.set_message_mraed(0);
            mra.set_service_timeout(20);
        });
        assert_eq!(
            dissect(&mra),
            "CM MRA tid 0x2 comm 0x00000003→0x00000004 for REQ service-timeout 20"
        );
        let unknown = cm_mad(0x0042, 3, |_| {});
        assert_eq!(dissect(&unknown), "CM attr 0x0042 tid 0x3");
        let mut reply = cm_mad(cm_attr::CLASS_PORT_INFO, 4, |_| {});
        reply[3] = rverbs_wire::mad::METHOD_GET_RESP;
        assert_eq!(dissect(&reply), "CM ClassPortInfo tid 0x4 method GET_RESP");
        let rej = cm_mad(cm_attr::REJ, 5, |m| CmRej::new_unchecked(m).set_reason(34));
        assert!(
            dissect(&rej).ends_with(" rejects REQ reason 34"),
            "{}",
            dissect(&rej)
        );
        let sidr = cm_mad(cm_attr::SIDR_REP, 6, |m| {
            CmSidrRep::new_unchecked(m).set_status(9)
        });
        assert!(
            dissect(&sidr).contains(" status 9 qpn "),
            "{}",
            dissect(&sidr)
        );
        // A REQ for a service ID that is not rdma_cm's: no IP CM header.
        let plain = cm_mad(cm_attr::REQ, 7, |m| {
            let mut req = CmReq::new_unchecked(m);
            req.set_service_id(0x1000_0000_0000_0001);
            req.set_path_mtu(5);
            req.set_transport_service_type(3);
            req.set_extended_transport_type(1);
            req.private_data_mut()[0] = 1;
        });
        assert_eq!(
            dissect(&plain),
            "CM REQ tid 0x7 comm 0x00000000 svc 0x1000000000000001 XRC qpn 0x000000 psn 0 \
             mtu 4096 retry 0 rnr-retry 0 ack-timeout 0 resp-res 0 init-depth 0 pkey 0x0000 \
             pdata 1 B"
        );
    }

    #[test]
    fn no_mad_bytes_make_decode_panic() {
        // Every length, garbage of every attribute and class: a line, never a panic.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for len in 0..=MAD_LEN + 8 {
            for round in 0..40 {
                let mut mad: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                if len >= MAD_HDR_LEN && round % 2 == 0 {
                    // Mostly CM MADs, with every attribute.
                    mad[0] = 1;
                    mad[1] = 0x07;
                    mad[2] = 2;
                    mad[16] = 0;
                    mad[17] = (round / 2) as u8;
                }
                for (dest_qp, src_qp) in [(1, 1), (1, 9), (9, 1)] {
                    let mut p =
                        PacketRepr::new(BthRepr::new(Opcode::UD_SEND_ONLY, dest_qp, Psn::new(0)));
                    p.deth = Some(DethRepr {
                        qkey: GSI_QKEY,
                        src_qp,
                    });
                    p.payload = &mad;
                    let line = mad::dissect(&p).expect("QP 1's");
                    assert!(!line.text.is_empty());
                    assert_eq!(
                        line.malformed,
                        line.text.contains(" malformed: "),
                        "{}",
                        line.text
                    );
                    if len != MAD_LEN {
                        assert!(line.malformed, "{len} bytes: {}", line.text);
                    }
                }
            }
        }
    }
}
