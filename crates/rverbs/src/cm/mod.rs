//! Connecting queue pairs, two ways:
//! - rdma_cm's way ([`CmId`], [`EventChannel`]): by IP address and port,
//!   with the InfiniBand CM on the wire, so the peer may be another rverbs
//!   program (in this process, another, or on another host) or the Linux
//!   kernel's rdma_cm (see `id` for how it finds the peer);
//! - by hand ([`connect`]): the peers exchange their GID, QP number,
//!   starting PSN (and optionally an rkey and buffer address) over any
//!   byte stream — usually a TCP connection, as `ibv_rc_pingpong` does —
//!   then each brings its QP to RTS.
//!
//! ```no_run
//! # fn demo(qp: &rverbs::QueuePair, mr: &rverbs::MemoryRegion) -> rverbs::Result<()> {
//! use rverbs::cm::{self, ConnectOptions, Endpoint};
//! let stream = std::net::TcpStream::connect("192.0.2.2:18515").expect("peer listening");
//! let me = Endpoint::for_qp(qp).with_buffer(mr);
//! let peer = cm::connect(qp, stream, &me, &ConnectOptions::default())?;
//! println!("connected to QP {:#x} at {}", peer.qpn, peer.gid);
//! # Ok(()) }
//! ```

mod channel;
mod id;

pub use channel::{CmEvent, CmEventKind, ConnEventParam, EventChannel, EventParam, UdParam};
pub use id::{CmId, ConnParam, PortSpace, RDMA_UDP_QKEY, RESOLVE_TIMEOUT};

use std::io::{Read, Write};
use std::net::Ipv6Addr;

use crate::attr::{AccessFlags, Gid, Mtu};
use crate::error::{Error, ErrorKind, Result, Verb};
use crate::verbs::mr::MemoryRegion;
use crate::verbs::qp::QueuePair;

/// What a peer needs to know to talk to a QP. It goes through serde (the
/// GID as its text), so programs may exchange it in JSON, TOML or any other
/// format rather than [`encode`](Self::encode)'s line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Endpoint {
    /// The QP's GID (its device's address).
    pub gid: Gid,
    /// The QP number.
    pub qpn: u32,
    /// The first PSN the QP sends.
    pub psn: u32,
    /// An rkey the peer may use (0: none).
    pub rkey: u32,
    /// The address of the buffer behind `rkey`.
    pub addr: u64,
    /// Its length.
    pub len: u64,
}

impl Endpoint {
    /// The endpoint of `qp` with a random starting PSN and no buffer.
    pub fn for_qp(qp: &QueuePair) -> Endpoint {
        Endpoint {
            gid: qp.local_gid(),
            qpn: qp.qp_num(),
            psn: random_psn(),
            rkey: 0,
            addr: 0,
            len: 0,
        }
    }

    /// The same, offering `mr` to the peer for RDMA.
    pub fn with_buffer(mut self, mr: &MemoryRegion) -> Endpoint {
        self.rkey = mr.rkey();
        self.addr = mr.iova();
        self.len = mr.len() as u64;
        self
    }

    /// One line of text: `rverbs1 GID QPN PSN RKEY ADDR LEN`, numbers in hex.
    pub fn encode(&self) -> String {
        format!(
            "rverbs1 {} {:06x} {:06x} {:08x} {:x} {:x}\n",
            std::net::Ipv6Addr::from(self.gid.0),
            self.qpn,
            self.psn,
            self.rkey,
            self.addr,
            self.len
        )
    }

    /// Parses what [`encode`](Self::encode) wrote.
    pub fn decode(line: &str) -> Result<Endpoint> {
        let bad = || {
            Error::new(
                Verb::Connect,
                ErrorKind::InvalidArgument,
                format!("not an rverbs endpoint: {:?}", line.trim_end()),
            )
        };
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 7 || f[0] != "rverbs1" {
            return Err(bad());
        }
        let hex32 = |s: &str| u32::from_str_radix(s, 16).map_err(|_| bad());
        let hex64 = |s: &str| u64::from_str_radix(s, 16).map_err(|_| bad());
        let gid: Ipv6Addr = f[1].parse().map_err(|_| bad())?;
        let ep = Endpoint {
            gid: Gid(gid.octets()),
            qpn: hex32(f[2])?,
            psn: hex32(f[3])?,
            rkey: hex32(f[4])?,
            addr: hex64(f[5])?,
            len: hex64(f[6])?,
        };
        if ep.qpn > 0xff_ffff || ep.psn > 0xff_ffff {
            return Err(bad());
        }
        Ok(ep)
    }
}

/// A random 24-bit starting PSN.
pub fn random_psn() -> u32 {
    getrandom::u32().unwrap_or(0x1234) & 0x00ff_ffff
}

/// How [`QueuePair::connect`] sets up the QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Path MTU (default: the port's active MTU).
    pub path_mtu: Option<Mtu>,
    /// What the peer may do to this QP's memory.
    pub access: AccessFlags,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Retries before RETRY_EXC_ERR.
    pub retry_cnt: u8,
    /// RNR retries (7: for ever).
    pub rnr_retry: u8,
    /// RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// Outstanding READs/atomics each way.
    pub max_rd_atomic: u8,
}

impl Default for ConnectOptions {
    /// The values ibv_rc_pingpong and perftest use: timeout 14 (~67 ms),
    /// 7 retries, RNR retries for ever, RNR timer 12 (0.64 ms), 16
    /// outstanding READs/atomics, all remote access.
    fn default() -> Self {
        ConnectOptions {
            path_mtu: None,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
        }
    }
}

/// Reads one line (at most 256 bytes) without reading past it.
fn read_line(stream: &mut impl Read) -> Result<String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < 256 {
        stream.read_exact(&mut b).map_err(io_err)?;
        if b[0] == b'\n' {
            return String::from_utf8(line).map_err(|_| {
                Error::new(
                    Verb::Connect,
                    ErrorKind::InvalidArgument,
                    "endpoint line is not UTF-8",
                )
            });
        }
        line.push(b[0]);
    }
    Err(Error::new(
        Verb::Connect,
        ErrorKind::InvalidArgument,
        "endpoint line too long",
    ))
}

fn io_err(e: std::io::Error) -> Error {
    Error::from_io(Verb::Connect, &e, "exchanging endpoints")
}

/// Sends `local`, reads the peer's endpoint, brings `qp` to RTS connected
/// to it, then waits until the peer's QP is ready too (one byte each way),
/// so neither side sends before the other can receive. The stream is read
/// byte by byte, never past the peer's last byte, so the caller can go on
/// using it (for more QPs, or its own protocol).
pub fn connect<S: Read + Write>(
    qp: &QueuePair,
    mut stream: S,
    local: &Endpoint,
    opts: &ConnectOptions,
) -> Result<Endpoint> {
    stream
        .write_all(local.encode().as_bytes())
        .map_err(io_err)?;
    let line = read_line(&mut stream)?;
    let remote = Endpoint::decode(&line)?;
    qp.connect(local.psn, &remote, opts)?;
    stream.write_all(b"R").map_err(io_err)?;
    let mut ready = [0u8; 1];
    stream.read_exact(&mut ready).map_err(io_err)?;
    if ready != *b"R" {
        return Err(Error::new(
            Verb::Connect,
            ErrorKind::InvalidArgument,
            "the peer did not get ready",
        ));
    }
    Ok(remote)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_round_trip_and_garbage() {
        let ep = Endpoint {
            gid: Gid::from_ip("127.0.0.9".parse().unwrap()),
            qpn: 0x12345,
            psn: 0xabcdef,
            rkey: 0xdeadbeef,
            addr: 0x7f00_1234_5000,
            len: 4096,
        };
        assert_eq!(Endpoint::decode(&ep.encode()).unwrap(), ep);
        for bad in [
            "",
            "rverbs1",
            "rverbs2 ::1 1 1 1 1 1",
            "rverbs1 nope 1 1 1 1 1",
            "rverbs1 ::1 1000000 1 1 1 1",
        ] {
            assert_eq!(
                Endpoint::decode(bad).unwrap_err().kind(),
                ErrorKind::InvalidArgument,
                "{bad}"
            );
        }
        assert!(random_psn() <= 0xff_ffff);
    }
}
