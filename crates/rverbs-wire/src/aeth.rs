//! ACK Extended Transport Header (4 bytes): a syndrome (ACK, RNR NAK or NAK)
//! and the responder's message sequence number.
//!
//! ```text
//! syndrome: 0 | kind(2) | value(5)     kind 00 ACK (value: credit count)
//!                                      kind 01 RNR NAK (value: RNR timer code)
//!                                      kind 11 NAK (value: NAK code)
//! MSN: 24 bits
//! ```

use core::time::Duration;

use crate::bytes::{get_u24, set_u24};
use crate::macros::header_view;
use crate::{Error, Result};

/// Length of the AETH.
pub const AETH_LEN: usize = 4;

header_view! {
    /// A view of an AETH at the start of a buffer.
    Aeth, AETH_LEN
}

impl<T: AsRef<[u8]>> Aeth<T> {
    /// The raw syndrome byte.
    pub fn syndrome_raw(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    /// The syndrome, decoded.
    pub fn syndrome(&self) -> Result<Syndrome> {
        Syndrome::from_raw(self.syndrome_raw())
    }

    /// Message sequence number.
    pub fn msn(&self) -> u32 {
        get_u24(self.buffer.as_ref(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    /// Sets the syndrome.
    pub fn set_syndrome(&mut self, s: Syndrome) {
        self.buffer.as_mut()[0] = s.to_raw();
    }

    /// Sets the message sequence number (24 bits).
    pub fn set_msn(&mut self, msn: u32) {
        set_u24(self.buffer.as_mut(), 1, msn & 0x00ff_ffff);
    }
}

/// Why a responder refused a request (`NAK` syndromes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error: a packet arrived out of order; resend from the MSN.
    PsnSequenceError = 0,
    /// Invalid request (bad opcode sequence, length, or unsupported operation).
    InvalidRequest = 1,
    /// Remote access error (R_Key, bounds, access rights).
    RemoteAccessError = 2,
    /// Remote operational error.
    RemoteOperationalError = 3,
    /// Invalid RD request.
    InvalidRdRequest = 4,
}

/// An RNR NAK timer code (0..=31): how long the requester waits before
/// retrying (IBTA table 45).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RnrTimer(u8);

impl RnrTimer {
    /// The timer for a 5-bit code (higher bits are dropped).
    pub const fn new(code: u8) -> Self {
        RnrTimer(code & 0x1f)
    }

    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// The wait it stands for; code 0 is the longest, 655.36 ms.
    pub fn duration(self) -> Duration {
        const MICROS: [u32; 32] = [
            655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920,
            2_560, 3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920,
            122_880, 163_840, 245_760, 327_680, 491_520,
        ];
        Duration::from_micros(u64::from(MICROS[self.0 as usize]))
    }
}

/// An AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement with a credit count (31: no flow-control credits).
    Ack {
        /// Credit code (0..=31).
        credits: u8,
    },
    /// Receiver not ready: retry after the timer.
    RnrNak(RnrTimer),
    /// Negative acknowledgement.
    Nak(NakCode),
}

impl Syndrome {
    /// The "no credit limit" credit code, which rxe sends.
    pub const CREDITS_UNLIMITED: u8 = 31;

    /// Decodes a syndrome byte; reserved encodings are errors.
    pub fn from_raw(raw: u8) -> Result<Syndrome> {
        let value = raw & 0x1f;
        match raw >> 5 {
            0b000 => Ok(Syndrome::Ack { credits: value }),
            0b001 => Ok(Syndrome::RnrNak(RnrTimer::new(value))),
            0b011 => Ok(Syndrome::Nak(match value {
                0 => NakCode::PsnSequenceError,
                1 => NakCode::InvalidRequest,
                2 => NakCode::RemoteAccessError,
                3 => NakCode::RemoteOperationalError,
                4 => NakCode::InvalidRdRequest,
                _ => return Err(Error::ReservedSyndrome(raw)),
            })),
            _ => Err(Error::ReservedSyndrome(raw)),
        }
    }

    /// Encodes the syndrome byte.
    pub fn to_raw(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak(t) => 0x20 | t.code(),
            Syndrome::Nak(code) => 0x60 | code as u8,
        }
    }
}

/// The AETH's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// ACK, RNR NAK or NAK.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Reads a view; a reserved syndrome is an error.
    pub fn parse<T: AsRef<[u8]>>(h: &Aeth<T>) -> Result<Self> {
        h.check_len()?;
        Ok(AethRepr {
            syndrome: h.syndrome()?,
            msn: h.msn(),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        AETH_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Aeth<T>) {
        h.set_syndrome(self.syndrome);
        h.set_msn(self.msn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_rnr_nak_bytes() {
        for (bytes, repr) in [
            (
                [0x1f, 0x00, 0x00, 0x05],
                AethRepr {
                    syndrome: Syndrome::Ack { credits: 31 },
                    msn: 5,
                },
            ),
            (
                [0x21, 0x12, 0x34, 0x56],
                AethRepr {
                    syndrome: Syndrome::RnrNak(RnrTimer::new(1)),
                    msn: 0x12_3456,
                },
            ),
            (
                [0x60, 0xff, 0xff, 0xff],
                AethRepr {
                    syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                    msn: 0xff_ffff,
                },
            ),
            (
                [0x62, 0x00, 0x00, 0x01],
                AethRepr {
                    syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                    msn: 1,
                },
            ),
            (
                [0x64, 0x00, 0x00, 0x00],
                AethRepr {
                    syndrome: Syndrome::Nak(NakCode::InvalidRdRequest),
                    msn: 0,
                },
            ),
        ] {
            let h = Aeth::new_checked(&bytes[..]).unwrap();
            assert_eq!(AethRepr::parse(&h).unwrap(), repr);
            let mut out = [0u8; 4];
            repr.emit(&mut Aeth::new_unchecked(&mut out[..]));
            assert_eq!(out, bytes);
        }
    }

    #[test]
    fn reserved_syndromes_are_errors() {
        for raw in [0x40u8, 0x5f, 0x65, 0x7f, 0x80, 0xff] {
            assert_eq!(
                Syndrome::from_raw(raw),
                Err(Error::ReservedSyndrome(raw)),
                "{raw:#x}"
            );
        }
        for raw in (0x00..=0x3f).chain(0x60..=0x64) {
            assert_eq!(Syndrome::from_raw(raw).unwrap().to_raw(), raw);
        }
    }

    #[test]
    fn rnr_timer_table() {
        assert_eq!(RnrTimer::new(0).duration(), Duration::from_micros(655_360));
        assert_eq!(RnrTimer::new(1).duration(), Duration::from_micros(10));
        assert_eq!(RnrTimer::new(14).duration(), Duration::from_micros(1_280));
        assert_eq!(RnrTimer::new(31).duration(), Duration::from_micros(491_520));
        assert_eq!(RnrTimer::new(0x3f).code(), 31);
    }
}
