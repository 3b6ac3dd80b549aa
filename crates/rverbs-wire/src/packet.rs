//! A whole RoCEv2 packet — the UDP payload: BTH, the extension headers its
//! opcode calls for, payload, pad and ICRC.
//!
//! [`PacketRepr::parse`] checks the packet against the opcode table: a known
//! opcode, TVer 0, every header present, length a multiple of 4, PadCnt no
//! larger than what follows the headers, no payload where the opcode has
//! none, a valid AETH syndrome. It never panics, whatever the bytes.
//! The ICRC needs the IP and UDP headers; see [`crate::icrc`].

use core::fmt;

use crate::aeth::{Aeth, AethRepr, NakCode, Syndrome};
use crate::atomic::{AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr};
use crate::bth::{Bth, BthRepr, BTH_LEN};
use crate::deth::{Deth, DethRepr};
use crate::imm::{Ieth, IethRepr, ImmDt, ImmDtRepr};
use crate::opcode::{Headers, OpcodeInfo};
use crate::reth::{Reth, RethRepr};
use crate::{Error, Result};

/// Length of the ICRC that ends every packet.
pub const ICRC_LEN: usize = 4;

/// A parsed (or to-be-emitted) packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketRepr<'a> {
    /// The base transport header.
    pub bth: BthRepr,
    /// DETH (UD).
    pub deth: Option<DethRepr>,
    /// RETH (RDMA WRITE first/only, READ request).
    pub reth: Option<RethRepr>,
    /// AtomicETH (compare & swap, fetch & add).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH (ACK, READ response first/last/only, atomic ACK).
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH (atomic ACK).
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// Immediate data.
    pub imm_dt: Option<ImmDtRepr>,
    /// R_Key to invalidate.
    pub ieth: Option<IethRepr>,
    /// The payload, without pad.
    pub payload: &'a [u8],
}

impl<'a> PacketRepr<'a> {
    /// The opcode's table entry (`None` for an unknown opcode).
    pub fn info(&self) -> Option<&'static OpcodeInfo> {
        self.bth.opcode.info()
    }

    /// Parses a packet: `packet` is the whole UDP payload, ICRC included.
    pub fn parse(packet: &'a [u8]) -> Result<PacketRepr<'a>> {
        let len = packet.len();
        if len < BTH_LEN + ICRC_LEN {
            return Err(Error::Truncated {
                needed: BTH_LEN + ICRC_LEN,
                got: len,
            });
        }
        let bth = BthRepr::parse(&Bth::new_checked(packet)?)?;
        if bth.tver != 0 {
            return Err(Error::UnsupportedVersion(bth.tver));
        }
        let info = bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(bth.opcode.0))?;
        let without_icrc = len - ICRC_LEN;
        if without_icrc % 4 != 0 {
            return Err(Error::Unaligned { len: without_icrc });
        }
        let header_len = info.header_len();
        if without_icrc < header_len {
            return Err(Error::Truncated {
                needed: header_len + ICRC_LEN,
                got: len,
            });
        }
        let mut repr = PacketRepr::new(bth);
        let mut at = BTH_LEN;
        for (flag, len) in Headers::WIRE_ORDER {
            if !info.headers.contains(flag) {
                continue;
            }
            let b = packet.get(at..at + len).ok_or(Error::Truncated {
                needed: at + len + ICRC_LEN,
                got: packet.len(),
            })?;
            at += len;
            match flag {
                Headers::DETH => repr.deth = Some(DethRepr::parse(&Deth::new_checked(b)?)?),
                Headers::RETH => repr.reth = Some(RethRepr::parse(&Reth::new_checked(b)?)?),
                Headers::ATOMIC_ETH => {
                    repr.atomic_eth = Some(AtomicEthRepr::parse(&AtomicEth::new_checked(b)?)?)
                }
                Headers::AETH => repr.aeth = Some(AethRepr::parse(&Aeth::new_checked(b)?)?),
                Headers::ATOMIC_ACK_ETH => {
                    repr.atomic_ack_eth =
                        Some(AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(b)?)?)
                }
                Headers::IMM_DT => repr.imm_dt = Some(ImmDtRepr::parse(&ImmDt::new_checked(b)?)?),
                Headers::IETH => repr.ieth = Some(IethRepr::parse(&Ieth::new_checked(b)?)?),
                _ => {} // CNP_RESERVED: nothing to read
            }
        }
        let body = without_icrc - at;
        let pad = usize::from(bth.pad_count);
        if !info.has_payload {
            if body != 0 || pad != 0 {
                return Err(Error::UnexpectedPayload {
                    opcode: bth.opcode.0,
                    len: body,
                });
            }
        } else if pad > body {
            return Err(Error::BadPadCount {
                pad: bth.pad_count,
                body,
            });
        }
        repr.payload = &packet[at..without_icrc - pad];
        Ok(repr)
    }

    /// A packet with no extension headers and no payload, to fill in.
    pub const fn new(bth: BthRepr) -> PacketRepr<'static> {
        PacketRepr {
            bth,
            deth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            imm_dt: None,
            ieth: None,
            payload: &[],
        }
    }

    /// The extension headers this packet holds (CNP's reserved bytes count
    /// as present for a CNP).
    pub fn headers(&self) -> Headers {
        let mut h = Headers::empty();
        h.set(Headers::DETH, self.deth.is_some());
        h.set(Headers::RETH, self.reth.is_some());
        h.set(Headers::ATOMIC_ETH, self.atomic_eth.is_some());
        h.set(Headers::AETH, self.aeth.is_some());
        h.set(Headers::ATOMIC_ACK_ETH, self.atomic_ack_eth.is_some());
        h.set(Headers::IMM_DT, self.imm_dt.is_some());
        h.set(Headers::IETH, self.ieth.is_some());
        h.set(Headers::CNP_RESERVED, self.bth.opcode == crate::Opcode::CNP);
        h
    }

    /// Length of BTH plus extension headers.
    pub fn header_len(&self) -> usize {
        BTH_LEN + self.headers().byte_len()
    }

    /// Pad bytes after the payload.
    pub fn pad_len(&self) -> usize {
        (4 - self.payload.len() % 4) % 4
    }

    /// Bytes of the whole packet, ICRC included.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len() + self.pad_len() + ICRC_LEN
    }

    /// Checks that the headers present are exactly those the opcode calls for.
    pub fn check_headers(&self) -> Result<()> {
        let info = self.info().ok_or(Error::UnknownOpcode(self.bth.opcode.0))?;
        if self.headers() != info.headers {
            return Err(Error::HeaderMismatch {
                opcode: self.bth.opcode.0,
            });
        }
        if !info.has_payload && !self.payload.is_empty() {
            return Err(Error::UnexpectedPayload {
                opcode: self.bth.opcode.0,
                len: self.payload.len(),
            });
        }
        Ok(())
    }

    /// Writes everything but the payload for a packet carrying
    /// `payload_len` bytes: headers (PadCnt set from `payload_len`), then
    /// zero pad and four zero ICRC bytes after the payload's place, which is
    /// `buf[header_len()..header_len() + payload_len]` and left for the
    /// caller to fill (so payload can be copied once, straight from memory).
    /// `self.payload` is ignored. Returns the packet's whole length.
    pub fn emit_around_payload(&self, payload_len: usize, buf: &mut [u8]) -> Result<usize> {
        let headers_only = PacketRepr {
            payload: &[],
            ..*self
        };
        headers_only.check_headers()?;
        let info = self.info().ok_or(Error::UnknownOpcode(self.bth.opcode.0))?;
        if !info.has_payload && payload_len > 0 {
            return Err(Error::UnexpectedPayload {
                opcode: self.bth.opcode.0,
                len: payload_len,
            });
        }
        let header_len = self.header_len();
        let pad = (4 - payload_len % 4) % 4;
        let total = header_len + payload_len + pad + ICRC_LEN;
        let got = buf.len();
        let buf = buf
            .get_mut(..total)
            .ok_or(Error::Truncated { needed: total, got })?;
        headers_only.emit_parts(buf, pad);
        buf[header_len + payload_len..].fill(0);
        Ok(total)
    }

    /// Writes the packet into the start of `buf`: headers in wire order,
    /// payload, zero pad (PadCnt set from the payload length), and four zero
    /// bytes where the ICRC goes. Returns the bytes written
    /// ([`buffer_len`](Self::buffer_len)).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        self.check_headers()?;
        let total = self.buffer_len();
        let got = buf.len();
        let buf = buf
            .get_mut(..total)
            .ok_or(Error::Truncated { needed: total, got })?;
        self.emit_parts(buf, self.pad_len());
        let headers_end = self.header_len();
        let end = headers_end + self.payload.len();
        buf[headers_end..end].copy_from_slice(self.payload);
        buf[end..].fill(0); // pad and the ICRC's place
        Ok(total)
    }

    /// Writes BTH (with `pad` as PadCnt) and the extension headers into `buf`,
    /// which is long enough (checked by the callers).
    fn emit_parts(&self, buf: &mut [u8], pad: usize) {
        let mut bth = self.bth;
        bth.pad_count = pad as u8;
        bth.emit(&mut Bth::new_unchecked(&mut buf[..BTH_LEN]));
        let mut at = BTH_LEN;
        let mut next = |len: usize| {
            at += len;
            at - len..at
        };
        if let Some(h) = self.deth {
            h.emit(&mut Deth::new_unchecked(&mut buf[next(h.buffer_len())]));
        }
        if let Some(h) = self.reth {
            h.emit(&mut Reth::new_unchecked(&mut buf[next(h.buffer_len())]));
        }
        if let Some(h) = self.atomic_eth {
            h.emit(&mut AtomicEth::new_unchecked(
                &mut buf[next(h.buffer_len())],
            ));
        }
        if let Some(h) = self.aeth {
            h.emit(&mut Aeth::new_unchecked(&mut buf[next(h.buffer_len())]));
        }
        if let Some(h) = self.atomic_ack_eth {
            h.emit(&mut AtomicAckEth::new_unchecked(
                &mut buf[next(h.buffer_len())],
            ));
        }
        if let Some(h) = self.imm_dt {
            h.emit(&mut ImmDt::new_unchecked(&mut buf[next(h.buffer_len())]));
        }
        if let Some(h) = self.ieth {
            h.emit(&mut Ieth::new_unchecked(&mut buf[next(h.buffer_len())]));
        }
        buf[at..self.header_len()].fill(0); // CNP's reserved bytes
    }
}

impl fmt::Display for PacketRepr<'_> {
    /// One line in the spirit of tcpdump: opcode, destination QP, PSN, flags,
    /// every extension header's fields, payload length.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.bth;
        write!(f, "{} qp {:#08x} psn {}", b.opcode, b.dest_qp, b.psn)?;
        let flags: Vec<&str> = [
            (b.solicited, "SE"),
            (b.ack_req, "ACK"),
            (b.mig_req, "MIG"),
            (b.fecn, "FECN"),
            (b.becn, "BECN"),
        ]
        .iter()
        .filter_map(|&(on, name)| on.then_some(name))
        .collect();
        if !flags.is_empty() {
            write!(f, " [{}]", flags.join(","))?;
        }
        if b.pkey != 0xffff {
            write!(f, " pkey {:#06x}", b.pkey)?;
        }
        if let Some(h) = self.deth {
            write!(f, " qkey {:#010x} src-qp {:#08x}", h.qkey, h.src_qp)?;
        }
        if let Some(h) = self.reth {
            write!(
                f,
                " va {:#x} rkey {:#010x} dlen {}",
                h.va, h.rkey, h.dma_len
            )?;
        }
        if let Some(h) = self.atomic_eth {
            write!(
                f,
                " va {:#x} rkey {:#010x} swap-add {:#x} compare {:#x}",
                h.va, h.rkey, h.swap_add, h.compare
            )?;
        }
        if let Some(h) = self.aeth {
            match h.syndrome {
                Syndrome::Ack { credits } => write!(f, " ACK credits {credits}")?,
                Syndrome::RnrNak(t) => {
                    let us = t.duration().as_micros();
                    write!(f, " RNR-NAK {}.{:02}ms", us / 1000, us % 1000 / 10)?
                }
                Syndrome::Nak(code) => write!(
                    f,
                    " NAK {}",
                    match code {
                        NakCode::PsnSequenceError => "psn-sequence-error",
                        NakCode::InvalidRequest => "invalid-request",
                        NakCode::RemoteAccessError => "remote-access-error",
                        NakCode::RemoteOperationalError => "remote-operational-error",
                        NakCode::InvalidRdRequest => "invalid-rd-request",
                    }
                )?,
            }
            write!(f, " msn {}", h.msn)?;
        }
        if let Some(h) = self.atomic_ack_eth {
            write!(f, " orig {:#x}", h.orig)?;
        }
        if let Some(h) = self.imm_dt {
            write!(f, " imm {:#010x}", h.0)?;
        }
        if let Some(h) = self.ieth {
            write!(f, " inv-rkey {:#010x}", h.0)?;
        }
        write!(f, " len {}", self.payload.len())
    }
}

/// The ICRC field of a packet (the last four bytes, least significant byte
/// first), or `None` if the packet is shorter than four bytes.
pub fn icrc_field(packet: &[u8]) -> Option<u32> {
    let tail = packet.get(packet.len().checked_sub(ICRC_LEN)?..)?;
    Some(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aeth::{NakCode, Syndrome};
    use crate::{Opcode, Psn};

    fn bare(op: Opcode) -> PacketRepr<'static> {
        PacketRepr::new(BthRepr {
            ack_req: true,
            ..BthRepr::new(op, 0x11, Psn::new(7))
        })
    }

    #[test]
    fn rdma_write_only_with_imm_layout() {
        let mut p = bare(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE);
        p.reth = Some(RethRepr {
            va: 0x1000,
            rkey: 0xabcd,
            dma_len: 5,
        });
        p.imm_dt = Some(ImmDtRepr(0x0102_0304));
        p.payload = b"hello";
        let mut buf = [0xeeu8; 64];
        let n = p.emit(&mut buf).unwrap();
        assert_eq!(n, 12 + 16 + 4 + 5 + 3 + 4);
        #[rustfmt::skip]
        let want: &[u8] = &[
            0x0b, 0x30, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x00, 0x07,
            0, 0, 0, 0, 0, 0, 0x10, 0x00, 0x00, 0x00, 0xab, 0xcd, 0, 0, 0, 5,
            1, 2, 3, 4,
            b'h', b'e', b'l', b'l', b'o', 0, 0, 0,
            0, 0, 0, 0,
        ];
        assert_eq!(&buf[..n], want);
        let back = PacketRepr::parse(&buf[..n]).unwrap();
        assert_eq!(back.bth.pad_count, 3);
        assert_eq!(back.payload, b"hello");
        assert_eq!(back.reth, p.reth);
        assert_eq!(back.imm_dt, p.imm_dt);
    }

    #[test]
    fn atomic_write_layout() {
        let mut p = bare(Opcode::RC_ATOMIC_WRITE);
        p.reth = Some(RethRepr {
            va: 0x2008,
            rkey: 0x1234,
            dma_len: 8,
        });
        p.payload = &[1, 2, 3, 4, 5, 6, 7, 8];
        let mut buf = [0u8; 64];
        let n = p.emit(&mut buf).unwrap();
        assert_eq!(n, 12 + 16 + 8 + 4, "BTH, RETH, 8 bytes, ICRC; no pad");
        assert_eq!(buf[0], 0x1d);
        assert_eq!(
            &buf[12..28],
            &[0, 0, 0, 0, 0, 0, 0x20, 0x08, 0, 0, 0x12, 0x34, 0, 0, 0, 8]
        );
        assert_eq!(&buf[28..36], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(PacketRepr::parse(&buf[..n]).unwrap(), p);
        // Without its RETH it cannot be built.
        let mut q = p;
        q.reth = None;
        assert!(q.emit(&mut buf).is_err());
    }

    #[test]
    fn atomic_ack_layout() {
        let mut p = bare(Opcode::RC_ATOMIC_ACKNOWLEDGE);
        p.aeth = Some(AethRepr {
            syndrome: Syndrome::Ack { credits: 31 },
            msn: 9,
        });
        p.atomic_ack_eth = Some(AtomicAckEthRepr { orig: 42 });
        let mut buf = [0u8; 28];
        assert_eq!(p.emit(&mut buf).unwrap(), 28);
        assert_eq!(&buf[12..16], &[0x1f, 0, 0, 9]);
        assert_eq!(&buf[16..24], &[0, 0, 0, 0, 0, 0, 0, 42]);
        assert_eq!(PacketRepr::parse(&buf).unwrap(), p);
    }

    #[test]
    fn emit_refuses_wrong_header_sets_and_short_buffers() {
        let p = bare(Opcode::RC_RDMA_WRITE_FIRST); // RETH missing
        assert_eq!(
            p.emit(&mut [0u8; 64]),
            Err(Error::HeaderMismatch { opcode: 0x06 })
        );
        let mut p = bare(Opcode::RC_ACKNOWLEDGE);
        p.aeth = Some(AethRepr {
            syndrome: Syndrome::Nak(NakCode::InvalidRequest),
            msn: 0,
        });
        p.payload = b"x"; // ACKs carry no payload
        assert!(p.emit(&mut [0u8; 64]).is_err());
        p.payload = b"";
        assert_eq!(
            p.emit(&mut [0u8; 19]),
            Err(Error::Truncated {
                needed: 20,
                got: 19
            })
        );
    }

    fn emitted(p: &PacketRepr<'_>) -> Vec<u8> {
        let mut buf = vec![0u8; p.buffer_len()];
        p.emit(&mut buf).unwrap();
        buf
    }

    #[test]
    fn parse_errors() {
        let mut send = bare(Opcode::RC_SEND_ONLY);
        send.payload = b"abcdefgh";
        let good = emitted(&send);
        assert!(PacketRepr::parse(&good).is_ok());

        assert!(matches!(
            PacketRepr::parse(&good[..15]),
            Err(Error::Truncated { .. })
        ));
        assert!(matches!(
            PacketRepr::parse(&good[..good.len() - 1]),
            Err(Error::Unaligned { .. })
        ));

        let mut bad = good.clone();
        bad[1] |= 0x01; // TVer 1
        assert_eq!(PacketRepr::parse(&bad), Err(Error::UnsupportedVersion(1)));

        let mut bad = good.clone();
        bad[0] = 0x40; // RD
        assert_eq!(PacketRepr::parse(&bad), Err(Error::UnknownOpcode(0x40)));

        // Pad count larger than the bytes after the headers.
        let mut empty = bare(Opcode::RC_SEND_ONLY);
        empty.payload = b"";
        let mut bad = emitted(&empty);
        bad[1] |= 0x30;
        assert_eq!(
            PacketRepr::parse(&bad),
            Err(Error::BadPadCount { pad: 3, body: 0 })
        );

        // A READ request with bytes after its RETH.
        let mut read = bare(Opcode::RC_RDMA_READ_REQUEST);
        read.reth = Some(RethRepr {
            va: 0,
            rkey: 1,
            dma_len: 4,
        });
        let mut bad = emitted(&read);
        bad.splice(28..28, [0u8; 4]);
        assert_eq!(
            PacketRepr::parse(&bad),
            Err(Error::UnexpectedPayload {
                opcode: 0x0c,
                len: 4
            })
        );

        // A READ request cut inside its RETH.
        let short = [&emitted(&read)[..24], &[0u8; 4]].concat();
        assert!(matches!(
            PacketRepr::parse(&short),
            Err(Error::Truncated { .. })
        ));

        // A reserved AETH syndrome.
        let mut ack = bare(Opcode::RC_ACKNOWLEDGE);
        ack.aeth = Some(AethRepr {
            syndrome: Syndrome::Ack { credits: 0 },
            msn: 0,
        });
        let mut bad = emitted(&ack);
        bad[12] = 0x40;
        assert_eq!(PacketRepr::parse(&bad), Err(Error::ReservedSyndrome(0x40)));
    }

    #[test]
    fn cnp_has_sixteen_reserved_bytes() {
        let mut cnp = bare(Opcode::CNP);
        cnp.bth.becn = true;
        let mut buf = vec![0xeeu8; cnp.buffer_len()];
        cnp.emit(&mut buf).unwrap();
        assert_eq!(buf.len(), 12 + 16 + 4);
        assert_eq!(
            buf[12..],
            [0u8; 20],
            "reserved bytes and ICRC place are zeroed"
        );
        assert_eq!(PacketRepr::parse(&buf).unwrap(), cnp);
    }

    #[test]
    fn display_is_one_readable_line() {
        let mut p = bare(Opcode::RC_RDMA_WRITE_FIRST);
        p.bth.solicited = true;
        p.reth = Some(RethRepr {
            va: 0x1000,
            rkey: 0xabcd,
            dma_len: 8192,
        });
        p.payload = &[0; 16];
        assert_eq!(
            p.to_string(),
            "RC_RDMA_WRITE_FIRST qp 0x000011 psn 7 [SE,ACK] va 0x1000 rkey 0x0000abcd dlen 8192 len 16"
        );
        let mut ack = bare(Opcode::RC_ACKNOWLEDGE);
        ack.bth.ack_req = false;
        ack.bth.pkey = 0x8001;
        ack.aeth = Some(AethRepr {
            syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
            msn: 3,
        });
        assert_eq!(
            ack.to_string(),
            "RC_ACKNOWLEDGE qp 0x000011 psn 7 pkey 0x8001 NAK remote-access-error msn 3 len 0"
        );
        ack.aeth = Some(AethRepr {
            syndrome: Syndrome::RnrNak(crate::RnrTimer::new(12)),
            msn: 3,
        });
        assert!(ack.to_string().contains("RNR-NAK 0.64ms msn 3"), "{ack}");
    }

    #[test]
    fn emit_around_payload_leaves_the_payload_place() {
        let mut p = bare(Opcode::RC_SEND_ONLY_WITH_IMMEDIATE);
        p.imm_dt = Some(ImmDtRepr(9));
        let mut buf = [0xeeu8; 64];
        let n = p.emit_around_payload(5, &mut buf).unwrap();
        assert_eq!(n, 12 + 4 + 5 + 3 + 4);
        buf[16..21].copy_from_slice(b"hello");
        p.payload = b"hello";
        let mut want = [0u8; 28];
        p.emit(&mut want).unwrap();
        assert_eq!(&buf[..n], &want[..]);
        assert!(bare(Opcode::RC_ACKNOWLEDGE)
            .emit_around_payload(0, &mut buf)
            .is_err());
        let mut ack = bare(Opcode::RC_ACKNOWLEDGE);
        ack.aeth = Some(AethRepr {
            syndrome: Syndrome::Ack { credits: 31 },
            msn: 0,
        });
        assert!(ack.emit_around_payload(4, &mut buf).is_err());
        assert_eq!(ack.emit_around_payload(0, &mut buf), Ok(20));
    }

    #[test]
    fn icrc_field_is_little_endian() {
        assert_eq!(
            icrc_field(&[9, 9, 0x78, 0xf3, 0x53, 0xf3]),
            Some(0xf353_f378)
        );
        assert_eq!(icrc_field(&[1, 2, 3]), None);
    }
}
