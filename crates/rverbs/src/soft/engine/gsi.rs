//! The GSI QP (QP 1): where the device's management datagrams — the
//! connection manager's MADs — come in from the wire and go out to it.
//!
//! No verbs QP is ever numbered 1 (see `qpn`); packets for QP 1 are not
//! handed to a transport. The engine checks each (a UD SEND ONLY with a
//! DETH, the GSI Q_Key, a P_Key of the default partition, a 256-byte MAD)
//! and queues it in the device's [`GsiInbox`], whose eventfd wakes the
//! connection manager's service thread; a MAD nobody waits for, or one
//! that finds the inbox full, is dropped and counted, as MADs may be (their
//! senders resend). The service sends through its [`GsiPort`]: one UD
//! packet per MAD from QP 1 to the peer's QP 1, on the device's own socket
//! (so from the device's address and port), its ICRC computed for the IP
//! header Linux writes — no engine lock is taken on either side's hot path.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nix::sys::eventfd::{EfdFlags, EventFd};
use rverbs_wire::icrc::{self, IpUdpHeaders};
use rverbs_wire::{BthRepr, DethRepr, Opcode, PacketRepr, Psn};

use super::State;
use crate::soft::transport::pkey_matches;

/// The GSI QP's number.
pub(crate) const GSI_QPN: u32 = 1;
/// The Q_Key of GSI traffic (IBTA 13.4.6.1).
pub(crate) const GSI_QKEY: u32 = 0x8001_0000;
/// The length of a MAD.
pub(crate) const MAD_LEN: usize = 256;
/// The default P_Key, which the connection manager's MADs carry.
pub(crate) const DEFAULT_PKEY: u16 = 0xffff;
/// MADs the inbox holds before it drops: a CM exchange has a few in flight
/// per connection being set up, and its senders resend what is lost.
const INBOX_CAPACITY: usize = 1024;

/// A MAD received on QP 1.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Mad {
    /// The sender's address and port (a RoCE peer's connection manager
    /// listens on port 4791, whatever port it sends from).
    pub(crate) from: SocketAddr,
    /// The sender's QP (1 for a connection manager).
    pub(crate) src_qp: u32,
    /// The packet's P_Key.
    pub(crate) pkey: u16,
    /// The MAD itself.
    pub(crate) bytes: [u8; MAD_LEN],
}

impl std::fmt::Debug for Mad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mad")
            .field("from", &self.from)
            .field("src_qp", &self.src_qp)
            .field("pkey", &format_args!("{:#06x}", self.pkey))
            .field("header", &&self.bytes[..24])
            .finish_non_exhaustive()
    }
}

/// Why a packet for QP 1 was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MadDrop {
    /// Not a UD SEND ONLY with a DETH, or not 256 bytes of payload.
    Malformed,
    /// Not the GSI Q_Key.
    QKey,
    /// Not the default partition.
    PKey,
    /// No connection manager listens on this device.
    NoService,
    /// The inbox is full.
    Full,
}

/// The device's queue of received MADs, and the counters of QP 1.
pub(crate) struct GsiInbox {
    queue: Mutex<VecDeque<Mad>>,
    /// Rung (written) when a MAD is queued into an empty inbox.
    bell: EventFd,
    /// A service holds the port: MADs are queued (else dropped).
    open: AtomicBool,
    /// MADs sent by the port.
    sent: AtomicU64,
    /// MADs the port failed to send.
    send_errors: AtomicU64,
}

impl GsiInbox {
    pub(super) fn new() -> io::Result<GsiInbox> {
        Ok(GsiInbox {
            queue: Mutex::new(VecDeque::new()),
            bell: EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?,
            open: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            send_errors: AtomicU64::new(0),
        })
    }

    /// Queues `mad` for the service.
    fn push(&self, mad: Mad) -> Result<(), MadDrop> {
        if !self.open.load(Ordering::Acquire) {
            return Err(MadDrop::NoService);
        }
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= INBOX_CAPACITY {
            return Err(MadDrop::Full);
        }
        let was_empty = q.is_empty();
        q.push_back(mad);
        drop(q);
        if was_empty {
            let _ = self.bell.write(1);
        }
        Ok(())
    }

    /// MADs sent and MADs the kernel refused.
    pub(super) fn sent(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.send_errors.load(Ordering::Relaxed),
        )
    }
}

/// Checks a packet for QP 1 and queues its MAD (the engine's receive
/// path); drops are counted.
pub(super) fn receive(st: &mut State, from: SocketAddr, pkt: &PacketRepr<'_>) {
    match check(pkt, from).and_then(|mad| st.gsi.push(mad)) {
        Ok(()) => st.stats.mads_received += 1,
        Err(MadDrop::QKey) => {
            st.stats.mads_dropped += 1;
            st.stats.qkey_violations += 1;
        }
        Err(MadDrop::PKey) => {
            st.stats.mads_dropped += 1;
            st.stats.rx_bad_pkey += 1;
        }
        Err(MadDrop::Malformed | MadDrop::NoService | MadDrop::Full) => {
            st.stats.mads_dropped += 1;
        }
    }
}

/// The MAD a packet for QP 1 carries, if it is one.
fn check(pkt: &PacketRepr<'_>, from: SocketAddr) -> Result<Mad, MadDrop> {
    if pkt.bth.opcode != Opcode::UD_SEND_ONLY {
        return Err(MadDrop::Malformed);
    }
    let deth = pkt.deth.ok_or(MadDrop::Malformed)?;
    if deth.qkey != GSI_QKEY {
        return Err(MadDrop::QKey);
    }
    if !pkey_matches(pkt.bth.pkey, DEFAULT_PKEY) {
        return Err(MadDrop::PKey);
    }
    let bytes: [u8; MAD_LEN] = pkt.payload.try_into().map_err(|_| MadDrop::Malformed)?;
    Ok(Mad {
        from,
        src_qp: deth.src_qp,
        pkey: pkt.bth.pkey,
        bytes,
    })
}

/// The connection manager's handle on QP 1: MADs in (after the inbox's
/// eventfd is readable) and out. One per device at a time; dropping it
/// stops the queueing.
pub(crate) struct GsiPort {
    inbox: Arc<GsiInbox>,
    socket: UdpSocket,
    local: SocketAddr,
    psn: AtomicU32,
}

impl GsiPort {
    /// The port, unless another is open on the inbox.
    pub(super) fn new(
        inbox: Arc<GsiInbox>,
        socket: UdpSocket,
        local: SocketAddr,
    ) -> Option<GsiPort> {
        if inbox.open.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(GsiPort {
            inbox,
            socket,
            local,
            psn: AtomicU32::new(0),
        })
    }

    /// The device's address (the source of the MADs sent).
    pub(crate) fn local(&self) -> SocketAddr {
        self.local
    }

    /// The next received MAD, if any (the eventfd is reset when the inbox
    /// is found empty: read until `None`, then wait for it).
    pub(crate) fn recv(&self) -> Option<Mad> {
        let mut q = self.inbox.queue.lock().unwrap_or_else(|p| p.into_inner());
        let mad = q.pop_front();
        if mad.is_none() {
            // Reset the bell while holding the queue: a push after this
            // finds the queue empty and rings again.
            let _ = self.inbox.bell.read();
        }
        mad
    }

    /// Sends `mad` from QP 1 to QP `dest_qp` (1 for a peer's connection
    /// manager) at `to` (a RoCE device: port 4791, see
    /// [`peer_endpoint`](super::peer_endpoint)), in partition `pkey`.
    pub(crate) fn send(
        &self,
        to: SocketAddr,
        dest_qp: u32,
        pkey: u16,
        mad: &[u8; MAD_LEN],
    ) -> io::Result<()> {
        let psn = self.psn.fetch_add(1, Ordering::Relaxed);
        let mut bth = BthRepr::new(Opcode::UD_SEND_ONLY, dest_qp, Psn::new(psn));
        bth.pkey = pkey;
        // As the Linux CM sends its MADs (AckReq means nothing on UD).
        bth.ack_req = true;
        let repr = PacketRepr {
            deth: Some(DethRepr {
                qkey: GSI_QKEY,
                src_qp: GSI_QPN,
            }),
            payload: mad,
            ..PacketRepr::new(bth)
        };
        let mut buf = [0u8; MAD_LEN + 64];
        let n = repr
            .emit(&mut buf)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let peer = to;
        let h = IpUdpHeaders::linux(self.local, peer, n, 0);
        icrc::fill(h.ip(), h.udp(), &mut buf[..n])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        match self.socket.send_to(&buf[..n], peer) {
            Ok(_) => {
                self.inbox.sent.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.inbox.send_errors.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }
}

impl AsFd for GsiPort {
    /// Readable when MADs wait.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inbox.bell.as_fd()
    }
}

impl Drop for GsiPort {
    fn drop(&mut self) {
        self.inbox.open.store(false, Ordering::Release);
        self.inbox
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::soft::engine::tests::engine;
    use crate::soft::engine::Engine;

    /// A MAD whose bytes say which it is.
    fn mad(n: u8) -> [u8; MAD_LEN] {
        std::array::from_fn(|i| (i as u8).wrapping_mul(7) ^ n)
    }

    /// Waits (up to a few seconds, for a loaded machine) for the engine's
    /// thread to hand a MAD to `port`.
    fn recv(port: &GsiPort) -> Option<Mad> {
        for _ in 0..2000 {
            if let Some(m) = port.recv() {
                return Some(m);
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        None
    }

    struct NoWatch;

    impl crate::soft::engine::Watch for NoWatch {
        fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
            None
        }
        fn on_ready(&self) {}
    }

    fn started() -> Arc<Engine> {
        let e = Arc::new(engine());
        assert!(e.start_thread("gsi-test", Box::new(NoWatch)));
        e
    }

    #[test]
    fn a_mad_goes_from_qp1_to_qp1() {
        let (a, b) = (started(), started());
        let pa = a.open_gsi().unwrap();
        let pb = b.open_gsi().unwrap();
        pa.send(b.local_addr, GSI_QPN, DEFAULT_PKEY, &mad(1))
            .unwrap();
        let got = recv(&pb).expect("the MAD arrives");
        assert_eq!(got.from, a.local_addr);
        assert_eq!((got.src_qp, got.pkey), (GSI_QPN, DEFAULT_PKEY));
        assert_eq!(got.bytes, mad(1));
        assert!(pb.recv().is_none());
        let (sa, sb) = (a.stats(), b.stats());
        assert_eq!((sa.mads_sent, sa.mads_send_errors), (1, 0));
        assert_eq!((sb.mads_received, sb.mads_dropped), (1, 0));
        assert_eq!(sb.rx_icrc_errors, 0);
    }

    #[test]
    fn one_port_at_a_time() {
        let a = started();
        let p = a.open_gsi().unwrap();
        let err = a.open_gsi().err().expect("a second port is refused");
        assert_eq!(err.raw_os_error(), Some(nix::errno::Errno::EBUSY as i32));
        drop(p);
        a.open_gsi().expect("the port is free again");
    }

    #[test]
    fn mads_nobody_waits_for_or_with_wrong_keys_are_dropped_and_counted() {
        let (a, b) = (started(), started());
        let pa = a.open_gsi().unwrap();
        // No port open on b: dropped (wait until b has seen it).
        pa.send(b.local_addr, GSI_QPN, DEFAULT_PKEY, &mad(2))
            .unwrap();
        for _ in 0..2000 {
            if b.stats().mads_dropped == 1 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!(b.stats().mads_dropped, 1);
        // Another partition: dropped once b listens.
        let pb = b.open_gsi().unwrap();
        pa.send(b.local_addr, GSI_QPN, 0x8123, &mad(3)).unwrap();
        // Then a good one, so we know the others were handled first.
        pa.send(b.local_addr, GSI_QPN, DEFAULT_PKEY, &mad(4))
            .unwrap();
        let got = recv(&pb).expect("the good MAD arrives");
        assert_eq!(got.bytes, mad(4));
        let s = b.stats();
        assert_eq!((s.mads_received, s.mads_dropped, s.rx_bad_pkey), (1, 2, 1));
        assert_eq!(s.rx_unknown_qp, 0);
    }

    #[test]
    fn packets_for_qp1_that_are_not_mads_are_dropped() {
        let b = started();
        let pb = b.open_gsi().unwrap();
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let from = sock.local_addr().unwrap();
        let send = |repr: PacketRepr<'_>| {
            let mut buf = [0u8; 1024];
            let n = repr.emit(&mut buf).unwrap();
            let h = IpUdpHeaders::linux(from, b.local_addr, n, 0);
            icrc::fill(h.ip(), h.udp(), &mut buf[..n]).unwrap();
            sock.send_to(&buf[..n], b.local_addr).unwrap();
        };
        let deth = |qkey| {
            Some(DethRepr {
                qkey,
                src_qp: GSI_QPN,
            })
        };
        let bth = |op| BthRepr::new(op, GSI_QPN, Psn::new(0));
        let m = mad(5);
        // Too short, wrong Q_Key, an RC opcode, then a good one.
        send(PacketRepr {
            deth: deth(GSI_QKEY),
            payload: &m[..100],
            ..PacketRepr::new(bth(Opcode::UD_SEND_ONLY))
        });
        send(PacketRepr {
            deth: deth(0x1234),
            payload: &m,
            ..PacketRepr::new(bth(Opcode::UD_SEND_ONLY))
        });
        send(PacketRepr {
            payload: &m,
            ..PacketRepr::new(bth(Opcode::RC_SEND_ONLY))
        });
        send(PacketRepr {
            deth: deth(GSI_QKEY),
            payload: &m,
            ..PacketRepr::new(bth(Opcode::UD_SEND_ONLY))
        });
        let got = recv(&pb).expect("the good MAD arrives");
        assert_eq!(got.from, from);
        let s = b.stats();
        assert_eq!((s.mads_received, s.mads_dropped), (1, 3));
        assert_eq!(s.qkey_violations, 1);
    }
}
