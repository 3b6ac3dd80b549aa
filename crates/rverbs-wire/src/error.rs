//! Why bytes are not a well-formed RoCEv2 packet or header.

/// A parse failure. Parsing never panics: every malformed input ends here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The buffer is shorter than the headers (or packet) need.
    #[error("truncated: need {needed} bytes, have {got}")]
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// The BTH opcode is not an RC, UC or UD opcode (or CNP).
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The BTH transport header version (TVer) is not 0.
    #[error("unsupported transport header version {0}")]
    UnsupportedVersion(u8),
    /// BTH through pad is not a multiple of 4 bytes.
    #[error("packet length {len} (without ICRC) is not a multiple of 4")]
    Unaligned {
        /// Length of BTH..pad.
        len: usize,
    },
    /// PadCnt is larger than the data after the headers.
    #[error("pad count {pad} exceeds the {body} bytes after the headers")]
    BadPadCount {
        /// BTH PadCnt.
        pad: u8,
        /// Bytes after the headers.
        body: usize,
    },
    /// An opcode without payload carries bytes after its headers.
    #[error("opcode {opcode:#04x} carries no payload but {len} bytes follow its headers")]
    UnexpectedPayload {
        /// The opcode.
        opcode: u8,
        /// Bytes after the headers.
        len: usize,
    },
    /// A packet to emit holds other extension headers than its opcode calls for.
    #[error("opcode {opcode:#04x} needs other extension headers than the packet has")]
    HeaderMismatch {
        /// The opcode.
        opcode: u8,
    },
    /// An AETH syndrome with a reserved encoding.
    #[error("reserved AETH syndrome {0:#04x}")]
    ReservedSyndrome(u8),
    /// An IP header that is not IPv4 or IPv6, or is malformed.
    #[error("bad IP header: {0}")]
    BadIpHeader(&'static str),
    /// A field of a MAD, a CM message or an RDMA IP CM header holds a value
    /// the spec reserves, or one this crate does not handle (another
    /// management class, an attribute with no representation).
    #[error("{field} holds {value:#x}, which is reserved or unsupported")]
    InvalidField {
        /// The field.
        field: &'static str,
        /// What it holds.
        value: u32,
    },
}

/// Result of parsing.
pub type Result<T> = core::result::Result<T, Error>;
