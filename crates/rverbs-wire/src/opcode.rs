//! The BTH opcode table for RC, UC and UD (and CNP), written once as data:
//! for every opcode its transport, operation, position in a message, the
//! extension headers that follow the BTH, and whether a payload follows.

use core::fmt;

use bitflags::bitflags;

/// Transport service of an opcode (its top three bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected (0x00).
    Rc,
    /// Unreliable Connected (0x20).
    Uc,
    /// Unreliable Datagram (0x60).
    Ud,
    /// Congestion notification packet (0x81).
    Cnp,
}

impl Transport {
    /// The name used in opcode names ("RC", "UC", "UD", "CNP").
    pub fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Ud => "UD",
            Transport::Cnp => "CNP",
        }
    }

    const fn prefix(self) -> u8 {
        match self {
            Transport::Rc => 0x00,
            Transport::Uc => 0x20,
            Transport::Ud => 0x60,
            Transport::Cnp => 0x80,
        }
    }
}

/// What a packet does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND (with immediate or invalidate per the headers).
    Send,
    /// RDMA WRITE (with immediate per the headers).
    RdmaWrite,
    /// RDMA READ request.
    RdmaReadRequest,
    /// RDMA READ response.
    RdmaReadResponse,
    /// ACK, NAK or RNR NAK.
    Acknowledge,
    /// Atomic acknowledge (carries the original remote value).
    AtomicAcknowledge,
    /// Atomic compare and swap.
    CompareSwap,
    /// Atomic fetch and add.
    FetchAdd,
    /// Atomic write (IBTA 1.5): 8 bytes stored at once, answered like a
    /// WRITE.
    AtomicWrite,
    /// Congestion notification.
    Cnp,
}

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First of several packets.
    First,
    /// Neither first nor last.
    Middle,
    /// Last of several packets.
    Last,
    /// The whole message in one packet.
    Only,
}

impl Position {
    /// First or only packet: starts a message.
    pub fn starts_message(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }

    /// Last or only packet: ends a message.
    pub fn ends_message(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

bitflags! {
    /// Extension headers after the BTH, in wire order.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct Headers: u8 {
        /// Datagram ETH (8 bytes), UD only.
        const DETH = 1;
        /// RDMA ETH (16 bytes).
        const RETH = 1 << 1;
        /// Atomic ETH (28 bytes).
        const ATOMIC_ETH = 1 << 2;
        /// ACK ETH (4 bytes).
        const AETH = 1 << 3;
        /// Atomic ACK ETH (8 bytes).
        const ATOMIC_ACK_ETH = 1 << 4;
        /// Immediate data (4 bytes).
        const IMM_DT = 1 << 5;
        /// Invalidate ETH (4 bytes).
        const IETH = 1 << 6;
        /// The 16 reserved bytes of a CNP.
        const CNP_RESERVED = 1 << 7;
    }
}

impl Headers {
    /// Every extension header with its length, in wire order.
    pub const WIRE_ORDER: [(Headers, usize); 8] = [
        (Headers::DETH, 8),
        (Headers::RETH, 16),
        (Headers::ATOMIC_ETH, 28),
        (Headers::AETH, 4),
        (Headers::ATOMIC_ACK_ETH, 8),
        (Headers::IMM_DT, 4),
        (Headers::IETH, 4),
        (Headers::CNP_RESERVED, 16),
    ];

    /// Total length of these extension headers.
    pub const fn byte_len(self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < Self::WIRE_ORDER.len() {
            let (flag, len) = Self::WIRE_ORDER[i];
            if self.bits() & flag.bits() != 0 {
                n += len;
            }
            i += 1;
        }
        n
    }
}

/// Everything the table knows about one opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The opcode byte.
    pub code: u8,
    /// Its transport.
    pub transport: Transport,
    /// Its operation.
    pub operation: Operation,
    /// Its place in a message.
    pub position: Position,
    /// Extension headers after the BTH.
    pub headers: Headers,
    /// Whether payload may follow the headers.
    pub has_payload: bool,
    base_name: &'static str,
}

impl OpcodeInfo {
    /// Whether the packet carries immediate data.
    pub fn has_immediate(&self) -> bool {
        self.headers.contains(Headers::IMM_DT)
    }

    /// Whether the packet carries an rkey to invalidate.
    pub fn has_invalidate(&self) -> bool {
        self.headers.contains(Headers::IETH)
    }

    /// Length of BTH plus extension headers.
    pub fn header_len(&self) -> usize {
        crate::bth::BTH_LEN + self.headers.byte_len()
    }
}

// The transports an entry of the base table exists for.
const RC: u8 = 1;
const UC: u8 = 2;
const UD: u8 = 4;

struct Base {
    low: u8,
    name: &'static str,
    operation: Operation,
    position: Position,
    headers: Headers,
    payload: bool,
    transports: u8,
}

const fn base(
    low: u8,
    name: &'static str,
    operation: Operation,
    position: Position,
    headers: Headers,
    payload: bool,
    transports: u8,
) -> Base {
    Base {
        low,
        name,
        operation,
        position,
        headers,
        payload,
        transports,
    }
}

/// The IBTA opcode table (vol. 1, table 38; ATOMIC WRITE from 1.5), low five bits. UD packets add a
/// DETH after the BTH.
const BASE: &[Base] = {
    use Operation::*;
    use Position::*;
    const NONE: Headers = Headers::empty();
    const IMM: Headers = Headers::IMM_DT;
    const RETH: Headers = Headers::RETH;
    const AETH: Headers = Headers::AETH;
    &[
        base(0x00, "SEND_FIRST", Send, First, NONE, true, RC | UC),
        base(0x01, "SEND_MIDDLE", Send, Middle, NONE, true, RC | UC),
        base(0x02, "SEND_LAST", Send, Last, NONE, true, RC | UC),
        base(
            0x03,
            "SEND_LAST_WITH_IMMEDIATE",
            Send,
            Last,
            IMM,
            true,
            RC | UC,
        ),
        base(0x04, "SEND_ONLY", Send, Only, NONE, true, RC | UC | UD),
        base(
            0x05,
            "SEND_ONLY_WITH_IMMEDIATE",
            Send,
            Only,
            IMM,
            true,
            RC | UC | UD,
        ),
        base(
            0x06,
            "RDMA_WRITE_FIRST",
            RdmaWrite,
            First,
            RETH,
            true,
            RC | UC,
        ),
        base(
            0x07,
            "RDMA_WRITE_MIDDLE",
            RdmaWrite,
            Middle,
            NONE,
            true,
            RC | UC,
        ),
        base(
            0x08,
            "RDMA_WRITE_LAST",
            RdmaWrite,
            Last,
            NONE,
            true,
            RC | UC,
        ),
        base(
            0x09,
            "RDMA_WRITE_LAST_WITH_IMMEDIATE",
            RdmaWrite,
            Last,
            IMM,
            true,
            RC | UC,
        ),
        base(
            0x0a,
            "RDMA_WRITE_ONLY",
            RdmaWrite,
            Only,
            RETH,
            true,
            RC | UC,
        ),
        base(
            0x0b,
            "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            RdmaWrite,
            Only,
            RETH.union(IMM),
            true,
            RC | UC,
        ),
        base(
            0x0c,
            "RDMA_READ_REQUEST",
            RdmaReadRequest,
            Only,
            RETH,
            false,
            RC,
        ),
        base(
            0x0d,
            "RDMA_READ_RESPONSE_FIRST",
            RdmaReadResponse,
            First,
            AETH,
            true,
            RC,
        ),
        base(
            0x0e,
            "RDMA_READ_RESPONSE_MIDDLE",
            RdmaReadResponse,
            Middle,
            NONE,
            true,
            RC,
        ),
        base(
            0x0f,
            "RDMA_READ_RESPONSE_LAST",
            RdmaReadResponse,
            Last,
            AETH,
            true,
            RC,
        ),
        base(
            0x10,
            "RDMA_READ_RESPONSE_ONLY",
            RdmaReadResponse,
            Only,
            AETH,
            true,
            RC,
        ),
        base(0x11, "ACKNOWLEDGE", Acknowledge, Only, AETH, false, RC),
        base(
            0x12,
            "ATOMIC_ACKNOWLEDGE",
            AtomicAcknowledge,
            Only,
            AETH.union(Headers::ATOMIC_ACK_ETH),
            false,
            RC,
        ),
        base(
            0x13,
            "COMPARE_SWAP",
            CompareSwap,
            Only,
            Headers::ATOMIC_ETH,
            false,
            RC,
        ),
        base(
            0x14,
            "FETCH_ADD",
            FetchAdd,
            Only,
            Headers::ATOMIC_ETH,
            false,
            RC,
        ),
        base(
            0x16,
            "SEND_LAST_WITH_INVALIDATE",
            Send,
            Last,
            Headers::IETH,
            true,
            RC,
        ),
        base(
            0x17,
            "SEND_ONLY_WITH_INVALIDATE",
            Send,
            Only,
            Headers::IETH,
            true,
            RC,
        ),
        base(0x1d, "ATOMIC_WRITE", AtomicWrite, Only, RETH, true, RC),
    ]
};

const CNP_CODE: u8 = 0x81;

const TABLE: [Option<OpcodeInfo>; 256] = {
    let mut table: [Option<OpcodeInfo>; 256] = [None; 256];
    let transports = [
        (Transport::Rc, RC),
        (Transport::Uc, UC),
        (Transport::Ud, UD),
    ];
    let mut t = 0;
    while t < transports.len() {
        let (transport, bit) = transports[t];
        let mut i = 0;
        while i < BASE.len() {
            let b = &BASE[i];
            if b.transports & bit != 0 {
                let code = transport.prefix() | b.low;
                let headers = if bit == UD {
                    b.headers.union(Headers::DETH)
                } else {
                    b.headers
                };
                table[code as usize] = Some(OpcodeInfo {
                    code,
                    transport,
                    operation: b.operation,
                    position: b.position,
                    headers,
                    has_payload: b.payload,
                    base_name: b.name,
                });
            }
            i += 1;
        }
        t += 1;
    }
    table[CNP_CODE as usize] = Some(OpcodeInfo {
        code: CNP_CODE,
        transport: Transport::Cnp,
        operation: Operation::Cnp,
        position: Position::Only,
        headers: Headers::CNP_RESERVED,
        has_payload: false,
        base_name: "",
    });
    table
};

/// A BTH opcode byte.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

macro_rules! opcodes {
    ($($name:ident = $code:expr;)*) => {
        impl Opcode {
            $(
                #[doc = concat!("`", stringify!($name), "` (", stringify!($code), ").")]
                pub const $name: Opcode = Opcode($code);
            )*
        }
    };
}

opcodes! {
    RC_SEND_FIRST = 0x00;
    RC_SEND_MIDDLE = 0x01;
    RC_SEND_LAST = 0x02;
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03;
    RC_SEND_ONLY = 0x04;
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05;
    RC_RDMA_WRITE_FIRST = 0x06;
    RC_RDMA_WRITE_MIDDLE = 0x07;
    RC_RDMA_WRITE_LAST = 0x08;
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09;
    RC_RDMA_WRITE_ONLY = 0x0a;
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b;
    RC_RDMA_READ_REQUEST = 0x0c;
    RC_RDMA_READ_RESPONSE_FIRST = 0x0d;
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e;
    RC_RDMA_READ_RESPONSE_LAST = 0x0f;
    RC_RDMA_READ_RESPONSE_ONLY = 0x10;
    RC_ACKNOWLEDGE = 0x11;
    RC_ATOMIC_ACKNOWLEDGE = 0x12;
    RC_COMPARE_SWAP = 0x13;
    RC_FETCH_ADD = 0x14;
    RC_SEND_LAST_WITH_INVALIDATE = 0x16;
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17;
    RC_ATOMIC_WRITE = 0x1d;
    UC_SEND_FIRST = 0x20;
    UC_SEND_MIDDLE = 0x21;
    UC_SEND_LAST = 0x22;
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23;
    UC_SEND_ONLY = 0x24;
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25;
    UC_RDMA_WRITE_FIRST = 0x26;
    UC_RDMA_WRITE_MIDDLE = 0x27;
    UC_RDMA_WRITE_LAST = 0x28;
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29;
    UC_RDMA_WRITE_ONLY = 0x2a;
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b;
    UD_SEND_ONLY = 0x64;
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65;
    CNP = 0x81;
}

impl Opcode {
    /// What the table knows about this opcode; `None` for opcodes rverbs
    /// does not speak (RD, XRC, reserved).
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        TABLE[self.0 as usize].as_ref()
    }

    /// Every opcode in the table, in numeric order.
    pub fn all() -> impl Iterator<Item = Opcode> {
        TABLE.iter().flatten().map(|i| Opcode(i.code))
    }
}

impl fmt::Display for Opcode {
    /// `RC_SEND_ONLY`, `UD_SEND_ONLY_WITH_IMMEDIATE`, `CNP`, or the hex value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Some(i) if i.transport == Transport::Cnp => f.write_str("CNP"),
            Some(i) => write!(f, "{}_{}", i.transport.name(), i.base_name),
            None => write!(f, "opcode_{:#04x}", self.0),
        }
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Opcode({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_covers_rc_uc_ud_and_nothing_else() {
        let rc = Opcode::all().filter(|o| o.0 < 0x20).count();
        let uc = Opcode::all()
            .filter(|o| (0x20..0x40).contains(&o.0))
            .count();
        let ud = Opcode::all()
            .filter(|o| (0x60..0x80).contains(&o.0))
            .count();
        assert_eq!((rc, uc, ud), (24, 12, 2));
        assert_eq!(Opcode::all().count(), 24 + 12 + 2 + 1);
        // RD (0x40..) and reserved codes are unknown.
        assert!(Opcode(0x40).info().is_none());
        assert!(Opcode(0x15).info().is_none());
        assert!(Opcode(0x2c).info().is_none());
        assert!(Opcode(0x60).info().is_none());
    }

    #[test]
    fn names_and_constants_agree() {
        assert_eq!(Opcode::UC_SEND_ONLY.to_string(), "UC_SEND_ONLY");
        assert_eq!(
            Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.to_string(),
            "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE"
        );
        assert_eq!(Opcode::UD_SEND_ONLY.to_string(), "UD_SEND_ONLY");
        assert_eq!(Opcode::CNP.to_string(), "CNP");
        assert_eq!(Opcode(0x40).to_string(), "opcode_0x40");
        for op in Opcode::all() {
            assert!(op.info().is_some());
        }
    }

    #[test]
    fn headers_follow_the_spec() {
        let h = |o: Opcode| o.info().unwrap().headers;
        assert_eq!(h(Opcode::RC_SEND_FIRST), Headers::empty());
        assert_eq!(h(Opcode::RC_RDMA_WRITE_FIRST), Headers::RETH);
        assert_eq!(h(Opcode::RC_RDMA_WRITE_MIDDLE), Headers::empty());
        assert_eq!(
            h(Opcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE),
            Headers::RETH | Headers::IMM_DT
        );
        assert_eq!(h(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE), Headers::empty());
        assert_eq!(h(Opcode::RC_RDMA_READ_RESPONSE_LAST), Headers::AETH);
        assert_eq!(
            h(Opcode::RC_ATOMIC_ACKNOWLEDGE),
            Headers::AETH | Headers::ATOMIC_ACK_ETH
        );
        assert_eq!(
            h(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE),
            Headers::DETH | Headers::IMM_DT
        );
        assert_eq!(h(Opcode::RC_SEND_ONLY_WITH_INVALIDATE), Headers::IETH);
        assert_eq!(Opcode::RC_FETCH_ADD.info().unwrap().header_len(), 12 + 28);
        assert_eq!(Opcode::CNP.info().unwrap().header_len(), 12 + 16);
        assert!(!Opcode::RC_RDMA_READ_REQUEST.info().unwrap().has_payload);
        assert!(
            Opcode::RC_RDMA_READ_RESPONSE_ONLY
                .info()
                .unwrap()
                .has_payload
        );
    }

    #[test]
    fn atomic_write_is_rc_only_with_a_reth_and_eight_bytes_of_payload() {
        // IBTA 1.5: RC ATOMIC WRITE, opcode 0x1D — BTH + RETH, then the
        // 8 bytes to store as the payload, one packet.
        let info = Opcode::RC_ATOMIC_WRITE.info().expect("in the table");
        assert_eq!(Opcode::RC_ATOMIC_WRITE.0, 0x1d);
        assert_eq!(info.transport, Transport::Rc);
        assert_eq!(info.operation, Operation::AtomicWrite);
        assert_eq!(info.position, Position::Only);
        assert_eq!(info.headers, Headers::RETH);
        assert!(info.has_payload);
        assert_eq!(info.header_len(), 12 + 16);
        assert_eq!(Opcode::RC_ATOMIC_WRITE.to_string(), "RC_ATOMIC_WRITE");
        // No UC or UD form.
        assert!(Opcode(0x3d).info().is_none());
        assert!(Opcode(0x7d).info().is_none());
    }

    #[test]
    fn positions() {
        let p = |o: Opcode| o.info().unwrap().position;
        assert_eq!(p(Opcode::RC_SEND_FIRST), Position::First);
        assert_eq!(p(Opcode::UC_RDMA_WRITE_MIDDLE), Position::Middle);
        assert_eq!(p(Opcode::RC_SEND_LAST_WITH_INVALIDATE), Position::Last);
        assert!(p(Opcode::RC_ACKNOWLEDGE).starts_message());
        assert!(p(Opcode::RC_SEND_LAST).ends_message());
        assert!(!p(Opcode::RC_SEND_MIDDLE).ends_message());
    }
}
