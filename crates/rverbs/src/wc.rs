//! Work completions: what a CQ hands back when a work request finishes
//! (`struct ibv_wc`), with the status and opcode values of `<infiniband/verbs.h>`.

use bitflags::bitflags;

/// `enum ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
#[non_exhaustive]
pub enum WcStatus {
    /// The work request completed.
    #[default]
    Success = 0,
    /// Local length error: a message did not fit the receive buffers.
    LocLenErr = 1,
    /// Local QP operation error.
    LocQpOpErr = 2,
    /// Local EE context operation error.
    LocEecOpErr = 3,
    /// Local protection error: bad lkey, PD or bounds in an SGE.
    LocProtErr = 4,
    /// Flushed: the QP went to the error state before this WR ran.
    WrFlushErr = 5,
    /// Memory window bind error.
    MwBindErr = 6,
    /// Bad response from the responder.
    BadRespErr = 7,
    /// Local access error.
    LocAccessErr = 8,
    /// The responder found the request invalid.
    RemInvReqErr = 9,
    /// Remote access error: rkey, bounds or access rejected by the responder.
    RemAccessErr = 10,
    /// The responder could not complete the operation.
    RemOpErr = 11,
    /// Transport retries exhausted (`retry_cnt`).
    RetryExcErr = 12,
    /// RNR retries exhausted (`rnr_retry`).
    RnrRetryExcErr = 13,
    /// Local RDD violation.
    LocRddViolErr = 14,
    /// Remote invalid RD request.
    RemInvRdReqErr = 15,
    /// Remote aborted.
    RemAbortErr = 16,
    /// Invalid EE context number.
    InvEecnErr = 17,
    /// Invalid EE context state.
    InvEecStateErr = 18,
    /// Fatal error.
    FatalErr = 19,
    /// Response timeout.
    RespTimeoutErr = 20,
    /// General error.
    GeneralErr = 21,
}

impl WcStatus {
    /// The string `ibv_wc_status_str` returns.
    pub fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        }
    }
}

/// `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
#[non_exhaustive]
pub enum WcOpcode {
    /// A SEND completed on the send queue.
    #[default]
    Send = 0,
    /// An RDMA WRITE completed.
    RdmaWrite = 1,
    /// An RDMA READ completed.
    RdmaRead = 2,
    /// An atomic compare-and-swap completed.
    CompSwap = 3,
    /// An atomic fetch-and-add completed.
    FetchAdd = 4,
    /// A memory window bind completed.
    BindMw = 5,
    /// A local invalidate completed.
    LocalInv = 6,
    /// An ATOMIC WRITE completed (`IBV_WC_ATOMIC_WRITE`).
    AtomicWrite = 9,
    /// A receive WR consumed an incoming SEND.
    Recv = 128,
    /// A receive WR consumed an incoming RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
}

bitflags! {
    /// `enum ibv_wc_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// The receive buffer starts with a 40-byte GRH (UD).
        const GRH = 1;
        /// `imm_data` is valid.
        const WITH_IMM = 1 << 1;
        /// The IP checksum was verified.
        const IP_CSUM_OK = 1 << 2;
        /// `invalidated_rkey` is valid.
        const WITH_INV = 1 << 3;
    }
}

/// `sl` of a UD receive whose packet came over IPv4 (RoCEv2): the L3
/// header type mlx5 reports there for RoCE, which UCX's `ud_verbs` reads to
/// find the destination address in the 40 bytes ahead of the payload (the
/// kernel's mlx5 driver turns the same value into `network_hdr_type`).
pub const ROCE_L3_TYPE_IPV4: u8 = 2;
/// `sl` of a UD receive whose packet came over IPv6 (RoCEv2); see
/// [`ROCE_L3_TYPE_IPV4`].
pub const ROCE_L3_TYPE_IPV6: u8 = 1;

/// One completion (`struct ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkCompletion {
    /// The `wr_id` of the work request that completed.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was (valid only when `status` is `Success`, as in libibverbs).
    pub opcode: WcOpcode,
    /// Vendor error syndrome.
    pub vendor_err: u32,
    /// Bytes transferred (receives: bytes placed, GRH included on UD).
    pub byte_len: u32,
    /// Immediate data in host order when `wc_flags` has `WITH_IMM`, or the
    /// invalidated rkey with `WITH_INV`.
    pub imm_data: u32,
    /// The local QP number.
    pub qp_num: u32,
    /// The remote QP number (UD receives).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// P_Key index (UD / GSI).
    pub pkey_index: u16,
    /// Source LID (0 on RoCE).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// DLID path bits.
    pub dlid_path_bits: u8,
}

impl WorkCompletion {
    /// The immediate data, if the completion carries one.
    pub fn imm(&self) -> Option<u32> {
        self.wc_flags
            .contains(WcFlags::WITH_IMM)
            .then_some(self.imm_data)
    }

    /// Whether the work request succeeded.
    pub fn is_success(&self) -> bool {
        self.status == WcStatus::Success
    }
}
