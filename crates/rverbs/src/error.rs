//! The one error type of the verbs API.
//!
//! Every failure names the verb that failed (printed as the libibverbs
//! function, e.g. `ibv_create_cq`), an errno-like [`ErrorKind`] — because the C
//! ABI must turn every failure into the errno libibverbs would set — and a
//! message that says what exactly was wrong.
//!
//! Destroying an object can fail (EBUSY while it is in use, EIO after the
//! device went away); the object then comes back inside a [`Rejected`], so
//! it stays usable and nothing is lost. Registering owned memory hands the
//! buffer back the same way when the registration is refused.

use std::fmt;
use std::io;

/// The verb, or library step, that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verb {
    /// `ibv_get_device_list`: enumerating (and, on first use, configuring) devices.
    GetDeviceList,
    /// `ibv_open_device`.
    OpenDevice,
    /// `ibv_close_device`.
    CloseDevice,
    /// `ibv_query_device`.
    QueryDevice,
    /// `ibv_query_port`.
    QueryPort,
    /// `ibv_query_gid` / `ibv_query_gid_ex` / `ibv_query_gid_table`.
    QueryGid,
    /// `ibv_query_pkey`.
    QueryPkey,
    /// `ibv_create_comp_channel`.
    CreateCompChannel,
    /// `ibv_destroy_comp_channel`.
    DestroyCompChannel,
    /// `ibv_get_cq_event`.
    GetCqEvent,
    /// `ibv_create_cq`.
    CreateCq,
    /// `ibv_resize_cq`.
    ResizeCq,
    /// `ibv_destroy_cq`.
    DestroyCq,
    /// `ibv_poll_cq`.
    PollCq,
    /// `ibv_req_notify_cq`.
    ReqNotifyCq,
    /// `ibv_alloc_pd`.
    AllocPd,
    /// `ibv_dealloc_pd`.
    DeallocPd,
    /// `ibv_reg_mr` and its `_iova` variants.
    RegMr,
    /// `ibv_rereg_mr`.
    ReregMr,
    /// `ibv_dereg_mr`.
    DeregMr,
    /// `ibv_alloc_mw`.
    AllocMw,
    /// `ibv_dealloc_mw`.
    DeallocMw,
    /// `ibv_bind_mw`.
    BindMw,
    /// [`MemoryRegion::read_at`](crate::MemoryRegion::read_at).
    MrRead,
    /// [`MemoryRegion::write_at`](crate::MemoryRegion::write_at).
    MrWrite,
    /// `ibv_get_async_event`.
    GetAsyncEvent,
    /// `ibv_create_qp`.
    CreateQp,
    /// `ibv_modify_qp`.
    ModifyQp,
    /// `ibv_query_qp`.
    QueryQp,
    /// `ibv_destroy_qp`.
    DestroyQp,
    /// `ibv_post_send`.
    PostSend,
    /// `ibv_post_recv`.
    PostRecv,
    /// Exchanging connection data with a peer (`rverbs::cm`).
    Connect,
    /// `ibv_create_srq`.
    CreateSrq,
    /// `ibv_modify_srq`.
    ModifySrq,
    /// `ibv_query_srq`.
    QuerySrq,
    /// `ibv_destroy_srq`.
    DestroySrq,
    /// `ibv_post_srq_recv`.
    PostSrqRecv,
    /// `ibv_create_ah`.
    CreateAh,
    /// `ibv_create_ah_from_wc` / `ibv_init_ah_from_wc`.
    CreateAhFromWc,
    /// `ibv_destroy_ah`.
    DestroyAh,
    /// `ibv_attach_mcast`.
    AttachMcast,
    /// `ibv_detach_mcast`.
    DetachMcast,
    /// `rdma_create_event_channel`.
    CreateEventChannel,
    /// `rdma_get_cm_event`.
    GetCmEvent,
    /// `rdma_create_id`.
    CreateId,
    /// `rdma_bind_addr`.
    BindAddr,
    /// `rdma_resolve_addr`.
    ResolveAddr,
    /// `rdma_resolve_route`.
    ResolveRoute,
    /// `rdma_listen`.
    Listen,
    /// `rdma_connect`.
    RdmaConnect,
    /// `rdma_accept`.
    Accept,
    /// `rdma_reject`.
    Reject,
    /// `rdma_disconnect`.
    Disconnect,
    /// `rdma_establish`.
    Establish,
    /// `rdma_join_multicast`.
    JoinMulticast,
    /// `rdma_leave_multicast`.
    LeaveMulticast,
}

impl Verb {
    /// The name users know the verb by.
    pub fn name(self) -> &'static str {
        match self {
            Verb::GetDeviceList => "ibv_get_device_list",
            Verb::OpenDevice => "ibv_open_device",
            Verb::CloseDevice => "ibv_close_device",
            Verb::QueryDevice => "ibv_query_device",
            Verb::QueryPort => "ibv_query_port",
            Verb::QueryGid => "ibv_query_gid",
            Verb::QueryPkey => "ibv_query_pkey",
            Verb::CreateCompChannel => "ibv_create_comp_channel",
            Verb::DestroyCompChannel => "ibv_destroy_comp_channel",
            Verb::GetCqEvent => "ibv_get_cq_event",
            Verb::CreateCq => "ibv_create_cq",
            Verb::ResizeCq => "ibv_resize_cq",
            Verb::DestroyCq => "ibv_destroy_cq",
            Verb::PollCq => "ibv_poll_cq",
            Verb::ReqNotifyCq => "ibv_req_notify_cq",
            Verb::AllocPd => "ibv_alloc_pd",
            Verb::DeallocPd => "ibv_dealloc_pd",
            Verb::RegMr => "ibv_reg_mr",
            Verb::ReregMr => "ibv_rereg_mr",
            Verb::DeregMr => "ibv_dereg_mr",
            Verb::AllocMw => "ibv_alloc_mw",
            Verb::DeallocMw => "ibv_dealloc_mw",
            Verb::BindMw => "ibv_bind_mw",
            Verb::MrRead => "MemoryRegion::read_at",
            Verb::MrWrite => "MemoryRegion::write_at",
            Verb::GetAsyncEvent => "ibv_get_async_event",
            Verb::CreateQp => "ibv_create_qp",
            Verb::ModifyQp => "ibv_modify_qp",
            Verb::QueryQp => "ibv_query_qp",
            Verb::DestroyQp => "ibv_destroy_qp",
            Verb::PostSend => "ibv_post_send",
            Verb::PostRecv => "ibv_post_recv",
            Verb::Connect => "rverbs::cm",
            Verb::CreateSrq => "ibv_create_srq",
            Verb::ModifySrq => "ibv_modify_srq",
            Verb::QuerySrq => "ibv_query_srq",
            Verb::DestroySrq => "ibv_destroy_srq",
            Verb::PostSrqRecv => "ibv_post_srq_recv",
            Verb::CreateAh => "ibv_create_ah",
            Verb::CreateAhFromWc => "ibv_create_ah_from_wc",
            Verb::DestroyAh => "ibv_destroy_ah",
            Verb::AttachMcast => "ibv_attach_mcast",
            Verb::DetachMcast => "ibv_detach_mcast",
            Verb::CreateEventChannel => "rdma_create_event_channel",
            Verb::GetCmEvent => "rdma_get_cm_event",
            Verb::CreateId => "rdma_create_id",
            Verb::BindAddr => "rdma_bind_addr",
            Verb::ResolveAddr => "rdma_resolve_addr",
            Verb::ResolveRoute => "rdma_resolve_route",
            Verb::Listen => "rdma_listen",
            Verb::RdmaConnect => "rdma_connect",
            Verb::Accept => "rdma_accept",
            Verb::Reject => "rdma_reject",
            Verb::Disconnect => "rdma_disconnect",
            Verb::Establish => "rdma_establish",
            Verb::JoinMulticast => "rdma_join_multicast",
            Verb::LeaveMulticast => "rdma_leave_multicast",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What kind of failure, as the errno libibverbs would report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// `EINVAL`: an argument is out of range or a combination is not allowed.
    InvalidArgument,
    /// `EBUSY`: the object is still in use (by children, or by unacknowledged events).
    Busy,
    /// `ENOMEM`: a device limit (`max_*`) or memory is exhausted.
    OutOfMemory,
    /// `EIO`: the device was disassociated (hot-unplugged); the object is dead.
    Io,
    /// `EAGAIN`: nothing to return and the descriptor is non-blocking.
    WouldBlock,
    /// `ENODATA`: the table entry asked for is empty.
    NoData,
    /// `ENODEV`: the device is gone.
    NoDevice,
    /// `EOPNOTSUPP`: the device does not implement this.
    NotSupported,
    /// `EADDRINUSE`: the device's UDP endpoint is taken by another process.
    AddrInUse,
    /// `EADDRNOTAVAIL`: the configured address is not one of this host's.
    AddrNotAvailable,
    /// `EFAULT`: memory to register is not mapped, or not with the access
    /// the MR asks for.
    BadAddress,
    /// `EPERM`: the objects named are not allowed together (a memory
    /// window bound to an MR of another PD).
    PermissionDenied,
    /// Any other errno the operating system returned.
    Os(i32),
}

impl ErrorKind {
    /// The errno value this kind stands for.
    pub fn errno(self) -> i32 {
        use nix::errno::Errno as E;
        match self {
            ErrorKind::InvalidArgument => E::EINVAL as i32,
            ErrorKind::Busy => E::EBUSY as i32,
            ErrorKind::OutOfMemory => E::ENOMEM as i32,
            ErrorKind::Io => E::EIO as i32,
            ErrorKind::WouldBlock => E::EAGAIN as i32,
            ErrorKind::NoData => E::ENODATA as i32,
            ErrorKind::NoDevice => E::ENODEV as i32,
            ErrorKind::NotSupported => E::EOPNOTSUPP as i32,
            ErrorKind::AddrInUse => E::EADDRINUSE as i32,
            ErrorKind::AddrNotAvailable => E::EADDRNOTAVAIL as i32,
            ErrorKind::BadAddress => E::EFAULT as i32,
            ErrorKind::PermissionDenied => E::EPERM as i32,
            ErrorKind::Os(n) => n,
        }
    }

    /// The kind for an errno value.
    pub fn from_errno(errno: i32) -> Self {
        use nix::errno::Errno as E;
        match E::from_raw(errno) {
            E::EINVAL => ErrorKind::InvalidArgument,
            E::EBUSY => ErrorKind::Busy,
            E::ENOMEM => ErrorKind::OutOfMemory,
            E::EIO => ErrorKind::Io,
            E::EAGAIN => ErrorKind::WouldBlock,
            E::ENODATA => ErrorKind::NoData,
            E::ENODEV => ErrorKind::NoDevice,
            E::EOPNOTSUPP => ErrorKind::NotSupported,
            E::EADDRINUSE => ErrorKind::AddrInUse,
            E::EADDRNOTAVAIL => ErrorKind::AddrNotAvailable,
            E::EFAULT => ErrorKind::BadAddress,
            E::EPERM => ErrorKind::PermissionDenied,
            _ => ErrorKind::Os(errno),
        }
    }

    fn errno_name(self) -> &'static str {
        nix::errno::Errno::from_raw(self.errno()).desc()
    }
}

/// Structured details some failures carry besides their message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorDetail {
    /// A modify_qp request the QP state machine refuses: which transition,
    /// or which attributes are missing or not allowed.
    Transition(crate::qp_attr::TransitionError),
    /// In a list of work requests, the one that was refused (libibverbs'
    /// `bad_wr`); the ones before it were posted.
    BadWr {
        /// Its index in the list.
        index: usize,
    },
    /// An address vector names a destination this device cannot reach
    /// from where its address is (another host from the loopback default,
    /// the other IP family): a setup problem, not a program's, which the
    /// drop-in libibverbs also prints on stderr.
    Unreachable,
}

/// A failed verb: which one, the errno-like kind, and a message saying why.
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    verb: Verb,
    kind: ErrorKind,
    message: String,
    detail: Option<ErrorDetail>,
}

impl Error {
    /// A new error for `verb`.
    pub fn new(verb: Verb, kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            verb,
            kind,
            message: message.into(),
            detail: None,
        }
    }

    /// The same error with structured details.
    pub(crate) fn with_detail(mut self, detail: ErrorDetail) -> Self {
        self.detail = Some(detail);
        self
    }

    /// Structured details, when the failure has them.
    pub fn detail(&self) -> Option<ErrorDetail> {
        self.detail
    }

    pub(crate) fn invalid(verb: Verb, message: impl Into<String>) -> Self {
        Self::new(verb, ErrorKind::InvalidArgument, message)
    }

    pub(crate) fn busy(verb: Verb, message: impl Into<String>) -> Self {
        Self::new(verb, ErrorKind::Busy, message)
    }

    pub(crate) fn from_io(verb: Verb, err: &io::Error, what: &str) -> Self {
        let kind = err
            .raw_os_error()
            .map(ErrorKind::from_errno)
            .unwrap_or(ErrorKind::Os(nix::errno::Errno::EIO as i32));
        Self::new(verb, kind, format!("{what}: {err}"))
    }

    pub(crate) fn from_errno(verb: Verb, errno: nix::errno::Errno, what: &str) -> Self {
        Self::new(
            verb,
            ErrorKind::from_errno(errno as i32),
            format!("{what}: {}", errno.desc()),
        )
    }

    /// The verb that failed.
    pub fn verb(&self) -> Verb {
        self.verb
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The errno libibverbs would report for this failure.
    pub fn errno(&self) -> i32 {
        self.kind.errno()
    }

    /// What exactly was wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} ({})",
            self.verb,
            self.message,
            self.kind.errno_name()
        )
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("verb", &self.verb)
            .field("kind", &self.kind)
            .field("message", &self.message)
            .field("detail", &self.detail)
            .finish()
    }
}

impl std::error::Error for Error {}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = io::Error::from_raw_os_error(e.errno()).kind();
        io::Error::new(kind, e)
    }
}

/// Result of a verb.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A verb that did not happen, with what it was given handed back: the
/// object of a refused destroy, dealloc, dereg or close (still usable), or
/// the buffer of a refused registration.
pub struct Rejected<T> {
    error: Error,
    object: T,
}

impl<T> Rejected<T> {
    pub(crate) fn new(error: Error, object: T) -> Self {
        Rejected { error, object }
    }

    /// Why the object was not destroyed.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The errno-like kind (`Busy`, `Io`, …).
    pub fn kind(&self) -> ErrorKind {
        self.error.kind
    }

    /// Takes the object back.
    pub fn into_inner(self) -> T {
        self.object
    }

    /// Splits into the error and the object.
    pub fn into_parts(self) -> (Error, T) {
        (self.error, self.object)
    }
}

impl<T> fmt::Debug for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejected")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Display for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<T> std::error::Error for Rejected<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<T> From<Rejected<T>> for Error {
    fn from(e: Rejected<T>) -> Error {
        e.error
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_round_trip() {
        for kind in [
            ErrorKind::InvalidArgument,
            ErrorKind::Busy,
            ErrorKind::OutOfMemory,
            ErrorKind::Io,
            ErrorKind::WouldBlock,
            ErrorKind::NoData,
            ErrorKind::NoDevice,
            ErrorKind::NotSupported,
            ErrorKind::AddrInUse,
            ErrorKind::AddrNotAvailable,
            ErrorKind::Os(nix::errno::Errno::EMFILE as i32),
        ] {
            assert_eq!(ErrorKind::from_errno(kind.errno()), kind);
        }
        assert_eq!(ErrorKind::Busy.errno(), 16);
        assert_eq!(ErrorKind::InvalidArgument.errno(), 22);
    }

    #[test]
    fn display_names_verb_message_and_errno() {
        let e = Error::busy(Verb::DestroyCompChannel, "2 CQs still use channel 4");
        assert_eq!(
            e.to_string(),
            "ibv_destroy_comp_channel: 2 CQs still use channel 4 (Device or resource busy)"
        );
        let io: io::Error = e.into();
        assert_eq!(io.raw_os_error(), None);
        assert_eq!(io.kind(), io::ErrorKind::ResourceBusy);
    }

    #[test]
    fn would_block_maps_to_io_would_block() {
        let io: io::Error = Error::new(Verb::GetCqEvent, ErrorKind::WouldBlock, "x").into();
        assert_eq!(io.kind(), io::ErrorKind::WouldBlock);
    }
}
