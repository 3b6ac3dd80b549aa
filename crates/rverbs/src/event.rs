//! Asynchronous event types (`enum ibv_event_type`), with libibverbs' values.

/// What an asynchronous event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
#[non_exhaustive]
pub enum AsyncEventType {
    /// A CQ overran or failed (`IBV_EVENT_CQ_ERR`).
    CqErr = 0,
    /// A QP hit a fatal error.
    QpFatal = 1,
    /// A QP received an invalid request.
    QpReqErr = 2,
    /// A QP hit a local access violation.
    QpAccessErr = 3,
    /// The first packet arrived on a QP in RTR.
    CommEst = 4,
    /// A QP in SQD drained its send queue.
    SqDrained = 5,
    /// Path migration completed.
    PathMig = 6,
    /// Path migration failed.
    PathMigErr = 7,
    /// The device failed or was disassociated (`IBV_EVENT_DEVICE_FATAL`).
    DeviceFatal = 8,
    /// A port became active.
    PortActive = 9,
    /// A port went down.
    PortErr = 10,
    /// A port's LID changed.
    LidChange = 11,
    /// A port's P_Key table changed.
    PkeyChange = 12,
    /// The subnet manager changed.
    SmChange = 13,
    /// An SRQ failed.
    SrqErr = 14,
    /// An SRQ fell below its armed limit.
    SrqLimitReached = 15,
    /// A QP on an SRQ reached its last WQE after going to ERR.
    QpLastWqeReached = 16,
    /// The client must re-register with the SM.
    ClientReregister = 17,
    /// A port's GID table changed.
    GidChange = 18,
    /// A work queue failed.
    WqFatal = 19,
}

impl AsyncEventType {
    /// The string `ibv_event_type_str` returns.
    pub fn as_str(self) -> &'static str {
        match self {
            AsyncEventType::CqErr => "CQ error",
            AsyncEventType::QpFatal => "local work queue catastrophic error",
            AsyncEventType::QpReqErr => "invalid request local work queue error",
            AsyncEventType::QpAccessErr => "local access violation work queue error",
            AsyncEventType::CommEst => "communication established",
            AsyncEventType::SqDrained => "send queue drained",
            AsyncEventType::PathMig => "path migrated",
            AsyncEventType::PathMigErr => "path migration request error",
            AsyncEventType::DeviceFatal => "local catastrophic error",
            AsyncEventType::PortActive => "port active",
            AsyncEventType::PortErr => "port error",
            AsyncEventType::LidChange => "LID change",
            AsyncEventType::PkeyChange => "P_Key change",
            AsyncEventType::SmChange => "SM change",
            AsyncEventType::SrqErr => "SRQ catastrophic error",
            AsyncEventType::SrqLimitReached => "SRQ limit reached",
            AsyncEventType::QpLastWqeReached => "last WQE reached",
            AsyncEventType::ClientReregister => "client reregistration",
            AsyncEventType::GidChange => "GID table change",
            AsyncEventType::WqFatal => "WQ fatal",
        }
    }
}
