//! Work requests (`struct ibv_send_wr`, `struct ibv_recv_wr`, `struct
//! ibv_sge`) and queue pair states, as the verbs take them.

use bitflags::bitflags;

use crate::attr::AccessFlags;
use crate::verbs::ah::AddressHandle;

/// One piece of a gather or scatter list: `length` bytes at `addr` of the MR
/// whose lkey is `lkey` (`struct ibv_sge`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct Sge {
    /// Address of the first byte (in the MR's iova space).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// The MR's local key.
    pub lkey: u32,
}

bitflags! {
    /// `enum ibv_send_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for earlier RDMA READs and atomics to complete first.
        const FENCE = 1;
        /// Generate a completion (always on with `sq_sig_all`).
        const SIGNALED = 1 << 1;
        /// Set the solicited-event bit: the receiver's CQ fires a
        /// solicited-only notification.
        const SOLICITED = 1 << 2;
        /// The payload is copied into the work request at post time
        /// (use [`Payload::Inline`]).
        const INLINE = 1 << 3;
        /// Offload the IP checksum (UD over Ethernet; accepted and ignored).
        const IP_CSUM = 1 << 4;
    }
}

/// What a send work request does, with its operation's arguments
/// (`ibv_wr_opcode` and the matching union member of `ibv_send_wr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WrOpcode {
    /// SEND: the payload lands in the peer's next receive WR.
    Send,
    /// SEND with 32 bits of immediate data for the receiver's completion.
    SendWithImm {
        /// The immediate value.
        imm: u32,
    },
    /// RDMA WRITE into the peer's memory.
    RdmaWrite {
        /// Remote address.
        remote_addr: u64,
        /// The remote MR's rkey.
        rkey: u32,
    },
    /// RDMA WRITE that also consumes a receive WR, which completes with `imm`.
    RdmaWriteWithImm {
        /// Remote address.
        remote_addr: u64,
        /// The remote MR's rkey.
        rkey: u32,
        /// The immediate value.
        imm: u32,
    },
    /// RDMA READ from the peer's memory into the local scatter list.
    RdmaRead {
        /// Remote address.
        remote_addr: u64,
        /// The remote MR's rkey.
        rkey: u32,
    },
    /// Atomic compare-and-swap of the 8 bytes at `remote_addr`; the original
    /// value lands in the (8-byte) local buffer.
    AtomicCmpAndSwp {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// The remote MR's rkey.
        rkey: u32,
        /// Swap only if the value equals this.
        compare: u64,
        /// The new value.
        swap: u64,
    },
    /// Atomic fetch-and-add on the 8 bytes at `remote_addr`; the original
    /// value lands in the (8-byte) local buffer.
    AtomicFetchAndAdd {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// The remote MR's rkey.
        rkey: u32,
        /// What to add.
        add: u64,
    },
    /// SEND that also asks the responder to invalidate `rkey` (a memory
    /// window of its own, `IBV_WR_SEND_WITH_INV`); RC only. The receiver's
    /// completion carries the key ([`WcFlags::WITH_INV`](crate::WcFlags::WITH_INV)).
    SendWithInv {
        /// The peer's rkey to invalidate.
        rkey: u32,
    },
    /// Binds a memory window (`IBV_WR_BIND_MW`): the window whose current
    /// rkey is `mw_rkey` comes to cover `info`, under a key whose low 8 bits
    /// are `rkey`'s. Nothing goes on the wire; it completes as
    /// [`WcOpcode::BindMw`](crate::WcOpcode::BindMw), or
    /// [`WcStatus::MwBindErr`](crate::WcStatus::MwBindErr) if the bind is
    /// refused. [`MemoryWindow::bind_op`](crate::MemoryWindow::bind_op)
    /// builds one; RC and UC only.
    BindMw {
        /// The window's rkey now.
        mw_rkey: u32,
        /// Its rkey after the bind: only the low 8 bits (the key's tag) are taken.
        rkey: u32,
        /// What the window covers.
        info: MwBindInfo,
    },
    /// Invalidates a type 2 memory window of this QP's PD (`IBV_WR_LOCAL_INV`):
    /// later remote accesses through `rkey` fail. Completes as
    /// [`WcOpcode::LocalInv`](crate::WcOpcode::LocalInv), or
    /// [`WcStatus::LocQpOpErr`](crate::WcStatus::LocQpOpErr) if the key
    /// names no such window; RC and UC only.
    LocalInv {
        /// The key to invalidate.
        rkey: u32,
    },
    /// ATOMIC WRITE (IBTA 1.5, `IBV_WR_ATOMIC_WRITE`): the 8 bytes of
    /// `value` land at `remote_addr` in one 64-bit store, so a reader of
    /// the word sees all of them or none (an RDMA WRITE of 8 bytes may
    /// land a byte at a time). RC only. The remote MR needs `REMOTE_WRITE`
    /// (as an RDMA WRITE, not `REMOTE_ATOMIC`) and the address 8-byte
    /// alignment: a misaligned one completes with `RemInvReqErr`. The
    /// value travels in the opcode, so the WR's payload must be empty (no
    /// SGEs); it completes as [`WcOpcode::AtomicWrite`](crate::WcOpcode::AtomicWrite).
    /// Like READs and atomics it takes one of the QP's `max_rd_atomic`
    /// credits while outstanding, and a fenced WR waits for it.
    AtomicWrite {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// The remote MR's rkey.
        rkey: u32,
        /// The bytes to store, in memory order (`u64::to_ne_bytes` for a
        /// word in the responder's byte order).
        value: [u8; 8],
    },
}

impl WrOpcode {
    /// Whether the operation is done on this side alone (a memory window
    /// bind or a local invalidate): it takes no PSN and sends nothing.
    pub fn is_local(&self) -> bool {
        matches!(self, WrOpcode::BindMw { .. } | WrOpcode::LocalInv { .. })
    }
}

/// `enum ibv_mw_type`: how a memory window is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MwType {
    /// Bound by [`QueuePair::bind_mw`](crate::QueuePair::bind_mw)
    /// (`ibv_bind_mw`), unbound by a zero-length bind; not invalidated.
    Type1 = 1,
    /// Bound by a [`WrOpcode::BindMw`] send WR to the QP that posts it
    /// (type 2B), invalidated by [`WrOpcode::LocalInv`] or a peer's
    /// [`WrOpcode::SendWithInv`].
    Type2 = 2,
}

/// What a memory window bind covers (`struct ibv_mw_bind_info`): `length`
/// bytes at `addr` (in the MR's iova space) of the MR whose lkey is
/// `mr_lkey`, with `access` rights for peers. The MR needs
/// [`AccessFlags::MW_BIND`] (and `LOCAL_WRITE` for a window peers may write
/// or run atomics on); a length of 0 unbinds a type 1 window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MwBindInfo {
    /// lkey of the MR the window lies in (ignored when `length` is 0).
    pub mr_lkey: u32,
    /// First byte of the window.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// `REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC` (others are ignored;
    /// `ZERO_BASED`, type 2 only, makes peers' addresses offsets in the window).
    pub access: AccessFlags,
}

impl MwBindInfo {
    /// A window over `length` bytes at `addr` of the MR with `mr_lkey`.
    pub fn new(mr_lkey: u32, addr: u64, length: u64, access: AccessFlags) -> MwBindInfo {
        MwBindInfo {
            mr_lkey,
            addr,
            length,
            access,
        }
    }

    /// A zero-length bind: unbinds a type 1 window.
    pub fn unbind() -> MwBindInfo {
        MwBindInfo::new(0, 0, 0, AccessFlags::empty())
    }
}

/// A type 1 memory window bind (`struct ibv_mw_bind`), for
/// [`QueuePair::bind_mw`](crate::QueuePair::bind_mw).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MwBind {
    /// Returned in the completion.
    pub wr_id: u64,
    /// `SIGNALED` (a completion) and `FENCE`; others are ignored.
    pub flags: SendFlags,
    /// What the window covers.
    pub info: MwBindInfo,
}

/// `ibv_inc_rkey`: `rkey` with its low 8 bits (the tag a bind may change)
/// counted up by one, wrapping within them.
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// Where a send work request's data comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload<'a> {
    /// Gathered from registered memory at transmission time.
    Sges(&'a [Sge]),
    /// Copied into the work request at post time (`IBV_SEND_INLINE`); at
    /// most the QP's `max_inline_data` bytes.
    Inline(&'a [u8]),
}

/// A send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub opcode: WrOpcode,
    /// The data (for READ and atomics: where the result lands; nothing for
    /// an ATOMIC WRITE, whose value is in the opcode).
    pub payload: Payload<'a>,
    /// Flags.
    pub flags: SendFlags,
    /// Where a UD send goes (`wr.ud`); `None` on connected QPs.
    pub ud: Option<UdAddress<'a>>,
}

/// The destination of a UD send (`struct ibv_send_wr`'s `wr.ud`).
#[derive(Clone, Copy, Debug)]
pub struct UdAddress<'a> {
    /// The address handle.
    pub ah: &'a AddressHandle,
    /// The remote QP number (0xFFFFFF: every QP attached to the multicast
    /// group the AH names).
    pub remote_qpn: u32,
    /// The remote Q_Key; with its high bit set the sending QP's own Q_Key
    /// goes instead.
    pub remote_qkey: u32,
}

impl PartialEq for UdAddress<'_> {
    fn eq(&self, o: &Self) -> bool {
        std::ptr::eq(self.ah, o.ah)
            && self.remote_qpn == o.remote_qpn
            && self.remote_qkey == o.remote_qkey
    }
}

impl Eq for UdAddress<'_> {}

impl<'a> SendWr<'a> {
    /// A work request for `opcode` over `sges`, not signaled.
    pub fn new(wr_id: u64, opcode: WrOpcode, sges: &'a [Sge]) -> Self {
        SendWr {
            wr_id,
            opcode,
            payload: Payload::Sges(sges),
            flags: SendFlags::empty(),
            ud: None,
        }
    }

    /// A work request for `opcode` carrying `data` inline.
    pub fn inline(wr_id: u64, opcode: WrOpcode, data: &'a [u8]) -> Self {
        SendWr {
            wr_id,
            opcode,
            payload: Payload::Inline(data),
            flags: SendFlags::INLINE,
            ud: None,
        }
    }

    /// The same, generating a completion.
    pub fn signaled(mut self) -> Self {
        self.flags |= SendFlags::SIGNALED;
        self
    }

    /// The same, with the solicited-event bit.
    pub fn solicited(mut self) -> Self {
        self.flags |= SendFlags::SOLICITED;
        self
    }

    /// The same, sent to UD QP `remote_qpn` at `ah` with `remote_qkey`.
    pub fn to(mut self, ah: &'a AddressHandle, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.ud = Some(UdAddress {
            ah,
            remote_qpn,
            remote_qkey,
        });
        self
    }

    /// The same, fenced behind earlier READs and atomics.
    pub fn fenced(mut self) -> Self {
        self.flags |= SendFlags::FENCE;
        self
    }
}

/// A receive work request: where an incoming SEND's payload lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The scatter list.
    pub sg_list: &'a [Sge],
}

impl<'a> RecvWr<'a> {
    /// A receive work request over `sges`.
    pub fn new(wr_id: u64, sges: &'a [Sge]) -> Self {
        RecvWr {
            wr_id,
            sg_list: sges,
        }
    }
}

/// `enum ibv_qp_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum QpState {
    /// Just created; nothing happens.
    Reset = 0,
    /// Receive WRs may be posted; packets are dropped.
    Init = 1,
    /// Ready to receive.
    Rtr = 2,
    /// Ready to send.
    Rts = 3,
    /// Send queue drain: no new send WRs start.
    Sqd = 4,
    /// Send queue error (UC/UD).
    Sqe = 5,
    /// Error: every WR completes with a flush error.
    Err = 6,
}

impl QpState {
    /// The name `ibv_qp_state_str`-style tools print.
    pub fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }
}
