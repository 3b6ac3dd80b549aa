//! The transports as sans-IO state machines: no threads, no sockets, no
//! clock. A queue pair takes posted work, incoming packets and "now", and
//! gives back packets to send (written into the caller's buffer),
//! completions, async events and the next timer deadline. The network
//! engine drives it; tests drive it through a simulated lossy link.
//!
//! Registered memory is reached through [`Memory`], which the device's
//! `MrTable` implements with its one access check.

pub(crate) mod rc;
pub(crate) mod recv;
#[cfg(test)]
mod sim;
pub(crate) mod ud;

use std::sync::atomic::Ordering::SeqCst;

use smallvec::SmallVec;

use crate::attr::AccessFlags;
use crate::event::AsyncEventType;
use crate::soft::memory::{AccessError, AccessKind, MrTable, MwError, Resolved};
use crate::wc::WorkCompletion;
use crate::wr::{MwBindInfo, Sge, WrOpcode};

/// The largest message, in bytes: IBTA's maximum message size, which the
/// port reports as `max_msg_sz`. Longer sends are EINVAL at post, and a
/// READ or WRITE request asking for more is an invalid request.
pub(crate) const MAX_MSG_SZ: u32 = 1 << 31;

/// An atomic operation on 8 bytes of registered memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtomicOp {
    CompareSwap {
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        add: u64,
    },
    /// ATOMIC WRITE: these bytes stored in one 64-bit store (needs
    /// `REMOTE_WRITE`, not `REMOTE_ATOMIC`).
    Write {
        value: [u8; 8],
    },
}

/// Registered memory as the transport sees it: every access checked (key,
/// PD, access flags, bounds) before a byte moves.
pub(crate) trait Memory {
    /// Checks an access without moving data.
    fn check(
        &self,
        key: u32,
        va: u64,
        len: u64,
        pd: u64,
        kind: AccessKind,
    ) -> Result<(), AccessError>;
    /// Copies `dst.len()` bytes at `va` into `dst`.
    fn read(
        &self,
        key: u32,
        va: u64,
        pd: u64,
        kind: AccessKind,
        dst: &mut [u8],
    ) -> Result<(), AccessError>;
    /// Copies `src` to `va`.
    fn write(
        &self,
        key: u32,
        va: u64,
        pd: u64,
        kind: AccessKind,
        src: &[u8],
    ) -> Result<(), AccessError>;
    /// Copies `src` to `va` as [`write`](Self::write) does, except that
    /// foreign memory its registrant unmapped while it was registered is
    /// an error, not a fault (see `WriteWindow::write_from_unfaulting`).
    fn write_unfaulting(
        &self,
        key: u32,
        va: u64,
        pd: u64,
        kind: AccessKind,
        src: &[u8],
    ) -> Result<(), AccessError> {
        self.write(key, va, pd, kind, src)
    }
    /// Runs an atomic on the 8 bytes at `va` (native byte order, as rxe; an
    /// ATOMIC WRITE stores its bytes as they are); returns the original
    /// value. `kind`: `RemoteAtomic` or `RemoteAtomicWrite`, or their
    /// `Window…` forms through a memory window.
    fn atomic(
        &self,
        key: u32,
        va: u64,
        pd: u64,
        kind: AccessKind,
        op: AtomicOp,
    ) -> Result<u64, AccessError>;
    /// Resolves a peer's access through `rkey` arriving on QP `qpn`: a
    /// memory window's rkey is checked against the window and becomes the
    /// MR beneath (see `MrTable::resolve_remote`); an MR's stays itself.
    fn resolve_remote(
        &self,
        rkey: u32,
        va: u64,
        len: u64,
        kind: AccessKind,
        pd: u64,
        qpn: u32,
    ) -> Result<Resolved, AccessError> {
        let _ = (len, pd, qpn);
        Ok(Resolved {
            key: rkey,
            va,
            kind,
        })
    }
    /// Binds the memory window `mw_rkey` for a bind WR of QP `qpn` in PD
    /// `pd`; returns its new rkey.
    fn bind_mw(
        &self,
        mw_rkey: u32,
        rkey: u32,
        info: &MwBindInfo,
        pd: u64,
        qpn: u32,
    ) -> Result<u32, MwError> {
        let _ = (rkey, info, pd, qpn);
        Err(MwError::NoSuchWindow(mw_rkey))
    }
    /// Invalidates the memory window `rkey` (a LOCAL_INV WR, `qpn` `None`;
    /// or a peer's SEND with Invalidate arriving on QP `qpn`).
    fn invalidate(&self, rkey: u32, pd: u64, qpn: Option<u32>) -> Result<(), MwError> {
        let _ = (pd, qpn);
        Err(MwError::NoSuchWindow(rkey))
    }
}

impl Memory for MrTable {
    fn check(
        &self,
        key: u32,
        va: u64,
        len: u64,
        pd: u64,
        kind: AccessKind,
    ) -> Result<(), AccessError> {
        self.check_access(key, va, len, kind, Some(pd))
    }

    fn read(
        &self,
        key: u32,
        va: u64,
        pd: u64,
        kind: AccessKind,
        dst: &mut [u8],
    ) -> Result<(), AccessError> {
        MrTable::read(self, key, va, dst.len(), kind, Some(pd), |w| {
            w.read_into(dst);
        })
    }

    fn write(
        &self,
        key: u32,
        va: u64,
        pd: u64,
        kind: AccessKind,
        src: &[u8],
    ) -> Result<(), AccessError> {
        MrTable::write(self, key, va, src.len(), kind, Some(pd), |mut w| {
            w.write_from(src);
        })
    }

    fn write_unfaulting(
        &self,
        key: u32,
        va: u64,
        pd: u64,
        kind: AccessKind,
        src: &[u8],
    ) -> Result<(), AccessError> {
        MrTable::write(self, key, va, src.len(), kind, Some(pd), |mut w| {
            w.write_from_unfaulting(src)
        })?
        .map(|_| ())
        .map_err(AccessError::Unmapped)
    }

    fn atomic(
        &self,
        key: u32,
        va: u64,
        pd: u64,
        kind: AccessKind,
        op: AtomicOp,
    ) -> Result<u64, AccessError> {
        MrTable::write(self, key, va, 8, kind, Some(pd), |mut w| {
            // One atomic read-modify-write (or store) on the word: foreign
            // memory may be read and written by its registrant meanwhile.
            if let Some(word) = w.atomic_u64() {
                return match op {
                    AtomicOp::CompareSwap { compare, swap } => word
                        .compare_exchange(compare, swap, SeqCst, SeqCst)
                        .unwrap_or_else(|old| old),
                    AtomicOp::FetchAdd { add } => word.fetch_add(add, SeqCst),
                    AtomicOp::Write { value } => word.swap(u64::from_ne_bytes(value), SeqCst),
                };
            }
            let mut b = [0u8; 8];
            w.read_into(&mut b);
            let old = u64::from_ne_bytes(b);
            let new = match op {
                AtomicOp::CompareSwap { compare, swap } if old == compare => swap,
                AtomicOp::CompareSwap { .. } => old,
                AtomicOp::FetchAdd { add } => old.wrapping_add(add),
                AtomicOp::Write { value } => u64::from_ne_bytes(value),
            };
            w.write_from(&new.to_ne_bytes());
            old
        })
    }

    fn resolve_remote(
        &self,
        rkey: u32,
        va: u64,
        len: u64,
        kind: AccessKind,
        pd: u64,
        qpn: u32,
    ) -> Result<Resolved, AccessError> {
        MrTable::resolve_remote(self, rkey, va, len, kind, pd, qpn)
    }

    fn bind_mw(
        &self,
        mw_rkey: u32,
        rkey: u32,
        info: &MwBindInfo,
        pd: u64,
        qpn: u32,
    ) -> Result<u32, MwError> {
        MrTable::bind_mw(self, mw_rkey, rkey, info, pd, qpn)
    }

    fn invalidate(&self, rkey: u32, pd: u64, qpn: Option<u32>) -> Result<(), MwError> {
        MrTable::invalidate(self, rkey, pd, qpn)
    }
}

/// A stretch of registered memory a packet's payload is sent from
/// directly, instead of being copied into the packet buffer first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PayloadRef {
    /// Offset in the packet where these bytes belong.
    pub(crate) at: u32,
    pub(crate) key: u32,
    pub(crate) va: u64,
    pub(crate) len: u32,
    /// The PD the access was checked against.
    pub(crate) pd: u64,
    pub(crate) kind: AccessKind,
}

/// Where [`rc::RcQp::poll_transmit`] builds a packet.
pub(crate) struct TxBuffer<'a> {
    /// The packet: headers, payload, pad and a zero ICRC — except payload
    /// bytes described in `refs`, which are left unwritten.
    pub(crate) bytes: &'a mut [u8],
    /// `None`: payloads are copied into `bytes`. `Some`: payloads from
    /// registered memory are checked and described here (appended), for the
    /// engine to send straight from the MR.
    pub(crate) refs: Option<&'a mut Vec<PayloadRef>>,
}

impl<'a> TxBuffer<'a> {
    /// A buffer that receives whole packets.
    #[cfg(test)]
    pub(crate) fn copying(bytes: &'a mut [u8]) -> TxBuffer<'a> {
        TxBuffer { bytes, refs: None }
    }
}

/// Checks the send SGEs' stretch `[offset, offset + len)` for reading and
/// describes it, to go at packet offset `at`, into `refs`.
pub(crate) fn refer(
    mem: &dyn Memory,
    pd: u64,
    sges: &[Sge],
    offset: u64,
    len: usize,
    mut at: u32,
    refs: &mut Vec<PayloadRef>,
) -> Result<(), AccessError> {
    let start = refs.len();
    for (key, va, n) in sge_pieces(sges, offset, len) {
        if let Err(e) = mem.check(key, va, n as u64, pd, AccessKind::LocalRead) {
            refs.truncate(start);
            return Err(e);
        }
        refs.push(PayloadRef {
            at,
            key,
            va,
            len: n as u32,
            pd,
            kind: AccessKind::LocalRead,
        });
        at += n as u32;
    }
    Ok(())
}

/// A WR's scatter/gather list: up to two entries without a heap allocation.
pub(crate) type SgeList = SmallVec<[Sge; 2]>;

/// Inline data of a send WR: up to 64 bytes without a heap allocation.
pub(crate) type InlineData = SmallVec<[u8; 64]>;

/// Where a send WQE's bytes come from.
#[derive(Debug, Clone)]
pub(crate) enum WqeData {
    /// Gathered from registered memory when each packet is built.
    Sges(SgeList),
    /// Copied at post time.
    Inline(InlineData),
}

/// A posted send work request, owned by the QP until it completes.
#[derive(Debug, Clone)]
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) op: WrOpcode,
    pub(crate) data: WqeData,
    /// Bytes of data (READ: to read; atomics: 8).
    pub(crate) length: u32,
    pub(crate) signaled: bool,
    pub(crate) solicited: bool,
    pub(crate) fence: bool,
}

/// A posted receive work request.
#[derive(Debug, Clone)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) sges: SgeList,
    /// Total bytes the scatter list holds.
    pub(crate) length: u64,
    /// The PD its lkeys are checked against: the QP's, or its SRQ's.
    pub(crate) pd: u64,
}

/// The completion of a receive WR flushed by a QP in ERR.
pub(crate) fn recv_flush_wc(wqe: &RecvWqe, qpn: u32, src_qp: u32) -> WorkCompletion {
    WorkCompletion {
        wr_id: wqe.wr_id,
        status: crate::wc::WcStatus::WrFlushErr,
        opcode: crate::wc::WcOpcode::Recv,
        qp_num: qpn,
        src_qp,
        ..Default::default()
    }
}

/// Why a QP's transport dropped a packet addressed to it, before any of
/// the transport's own rules (sequence, keys, Q_Keys …) looked at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RxDrop {
    /// An opcode of another transport (an RC packet for a UD QP, say).
    WrongTransport,
    /// The QP does not receive in its state (RESET, INIT, ERROR).
    NotReceiving,
    /// The BTH's P_Key does not match the QP's.
    PKey,
    /// A UD packet longer than the path MTU.
    TooLong,
}

/// Whether a packet's P_Key `theirs` may reach a QP whose P_Key is `ours`
/// (IBTA 10.9.3): the same partition (low 15 bits, neither the invalid
/// 0), and at least one of the two a full member (high bit).
pub(crate) fn pkey_matches(theirs: u16, ours: u16) -> bool {
    let partition = |k: u16| k & 0x7fff;
    partition(theirs) != 0 && partition(theirs) == partition(ours) && (theirs | ours) & 0x8000 != 0
}

/// What a QP reports to the engine.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum QpEvent {
    /// A send WR completed (to the send CQ).
    SendCompletion(WorkCompletion),
    /// A receive WR completed (to the receive CQ); `solicited` for the
    /// solicited-only CQ arm.
    RecvCompletion(WorkCompletion, bool),
    /// An affiliated async event for this QP.
    Async(AsyncEventType),
    /// The QP's SRQ fell below its armed limit (an event for the SRQ).
    SrqLimitReached,
}

/// Copies `dst.len()` bytes starting `offset` bytes into the data described
/// by `sges` (each checked with `kind` against `pd`).
pub(crate) fn gather(
    mem: &dyn Memory,
    pd: u64,
    sges: &[Sge],
    offset: u64,
    dst: &mut [u8],
) -> Result<(), AccessError> {
    let mut done = 0;
    for (key, va, n) in sge_pieces(sges, offset, dst.len()) {
        mem.read(key, va, pd, AccessKind::LocalRead, &mut dst[done..done + n])?;
        done += n;
    }
    Ok(())
}

/// [`scatter`] through [`Memory::write_unfaulting`]: for UD receives.
pub(crate) fn scatter_unfaulting(
    mem: &dyn Memory,
    pd: u64,
    sges: &[Sge],
    offset: u64,
    src: &[u8],
) -> Result<(), AccessError> {
    scatter_by(sges, offset, src, |key, va, bytes| {
        mem.write_unfaulting(key, va, pd, AccessKind::LocalWrite, bytes)
    })
}

/// Copies `src` into the scatter list `sges`, starting `offset` bytes in.
/// The caller checked that the list holds `offset + src.len()` bytes.
pub(crate) fn scatter(
    mem: &dyn Memory,
    pd: u64,
    sges: &[Sge],
    offset: u64,
    src: &[u8],
) -> Result<(), AccessError> {
    scatter_by(sges, offset, src, |key, va, bytes| {
        mem.write(key, va, pd, AccessKind::LocalWrite, bytes)
    })
}

/// Hands `write` each stretch of `src` with the key and address it goes to
/// in the scatter list `sges`, starting `offset` bytes in.
fn scatter_by(
    sges: &[Sge],
    offset: u64,
    src: &[u8],
    write: impl Fn(u32, u64, &[u8]) -> Result<(), AccessError>,
) -> Result<(), AccessError> {
    let mut done = 0;
    for (key, va, n) in sge_pieces(sges, offset, src.len()) {
        write(key, va, &src[done..done + n])?;
        done += n;
    }
    Ok(())
}

/// The stretches `(key, va, len)` that bytes `[offset, offset + len)` of the
/// data an SGE list describes occupy, in order (fewer bytes if the list
/// ends first). Addresses wrap rather than overflow: the access check then
/// refuses them.
fn sge_pieces(
    sges: &[Sge],
    mut offset: u64,
    len: usize,
) -> impl Iterator<Item = (u32, u64, usize)> + '_ {
    let mut left = len as u64;
    sges.iter().filter_map(move |sge| {
        let sge_len = u64::from(sge.length);
        if left == 0 {
            return None;
        }
        if offset >= sge_len {
            offset -= sge_len;
            return None;
        }
        let n = (sge_len - offset).min(left);
        let va = sge.addr.wrapping_add(offset);
        left -= n;
        offset = 0;
        Some((sge.lkey, va, n as usize))
    })
}

/// The QP access flags that allow incoming requests of each kind.
pub(crate) fn qp_allows(access: AccessFlags, kind: AccessKind) -> bool {
    match kind {
        AccessKind::RemoteRead => access.contains(AccessFlags::REMOTE_READ),
        AccessKind::RemoteWrite | AccessKind::RemoteAtomicWrite => {
            access.contains(AccessFlags::REMOTE_WRITE)
        }
        AccessKind::RemoteAtomic => access.contains(AccessFlags::REMOTE_ATOMIC),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::pkey_matches;

    #[test]
    fn p_keys_match_by_partition_with_a_full_member() {
        assert!(pkey_matches(0xffff, 0xffff));
        assert!(pkey_matches(0x7fff, 0xffff), "limited to full");
        assert!(pkey_matches(0xffff, 0x7fff), "full to limited");
        assert!(!pkey_matches(0x7fff, 0x7fff), "two limited members");
        assert!(!pkey_matches(0x1234, 0xffff), "another partition");
        assert!(!pkey_matches(0x8000, 0x8000), "the invalid P_Key");
        assert!(!pkey_matches(0x0000, 0xffff));
    }
}
