//! The string and rate helpers: `ibv_*_str`, `ibv_rate_to_mult` and friends,
//! answering as libibverbs does. Completion statuses and async event types
//! are rverbs' own strings (`WcStatus::as_str`, `AsyncEventType::as_str`);
//! the tables here are what rverbs has no type for: rates, node types, port
//! states, and the two tag-matching completion statuses.

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::OnceLock;

use rverbs::{AsyncEventType, WcStatus};

use crate::ffi::guard;

/// `enum ibv_rate` values with their multiple of 2.5 Gb/s (`-1`: not a
/// multiple) and their Mb/s.
const RATES: [(c_int, c_int, c_int); 23] = [
    (2, 1, 2500),       // IBV_RATE_2_5_GBPS
    (5, 2, 5000),       // IBV_RATE_5_GBPS
    (3, 4, 10000),      // IBV_RATE_10_GBPS
    (6, 8, 20000),      // IBV_RATE_20_GBPS
    (4, 12, 30000),     // IBV_RATE_30_GBPS
    (7, 16, 40000),     // IBV_RATE_40_GBPS
    (8, 24, 60000),     // IBV_RATE_60_GBPS
    (9, 32, 80000),     // IBV_RATE_80_GBPS
    (10, 48, 120000),   // IBV_RATE_120_GBPS
    (11, -1, 14062),    // IBV_RATE_14_GBPS
    (12, -1, 56250),    // IBV_RATE_56_GBPS
    (13, -1, 112500),   // IBV_RATE_112_GBPS
    (14, -1, 168750),   // IBV_RATE_168_GBPS
    (15, -1, 25781),    // IBV_RATE_25_GBPS
    (16, -1, 103125),   // IBV_RATE_100_GBPS
    (17, -1, 206250),   // IBV_RATE_200_GBPS
    (18, -1, 309375),   // IBV_RATE_300_GBPS
    (19, 11, 28125),    // IBV_RATE_28_GBPS
    (20, 20, 53125),    // IBV_RATE_50_GBPS
    (21, 160, 425000),  // IBV_RATE_400_GBPS
    (22, 240, 637500),  // IBV_RATE_600_GBPS
    (23, 320, 850000),  // IBV_RATE_800_GBPS
    (24, 480, 1275000), // IBV_RATE_1200_GBPS
];

export! { "IBVERBS_1.0"
    /// The rate as a multiple of 2.5 Gb/s, or -1.
    pub unsafe extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
        RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
    }
}

export! { "IBVERBS_1.0"
    /// The rate for a multiple of 2.5 Gb/s, or IBV_RATE_MAX (0).
    pub unsafe extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
        RATES.iter().find(|r| r.1 == mult && mult > 0).map_or(0, |r| r.0)
    }
}

export! { "IBVERBS_1.1"
    /// The rate in Mb/s, or -1.
    pub unsafe extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
        RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
    }
}

export! { "IBVERBS_1.1"
    /// The rate for a speed in Mb/s, or IBV_RATE_MAX (0).
    pub unsafe extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
        RATES.iter().find(|r| r.2 == mbps).map_or(0, |r| r.0)
    }
}

const NODE_TYPES: [&CStr; 7] = [
    c"InfiniBand channel adapter",
    c"InfiniBand switch",
    c"InfiniBand router",
    c"iWARP NIC",
    c"usNIC",
    c"usNIC UDP",
    c"unspecified",
];

export! { "IBVERBS_1.1"
    /// `ibv_node_type_str`.
    pub unsafe extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
        let s = usize::try_from(node_type.wrapping_sub(1))
            .ok()
            .and_then(|i| NODE_TYPES.get(i))
            .copied()
            .unwrap_or(UNKNOWN);
        s.as_ptr()
    }
}

const PORT_STATES: [&CStr; 6] = [
    c"no state change (NOP)",
    c"down",
    c"init",
    c"armed",
    c"active",
    c"active defer",
];

export! { "IBVERBS_1.1"
    /// `ibv_port_state_str`.
    pub unsafe extern "C" fn ibv_port_state_str(state: c_int) -> *const c_char {
        let s = usize::try_from(state)
            .ok()
            .and_then(|i| PORT_STATES.get(i))
            .copied()
            .unwrap_or(UNKNOWN);
        s.as_ptr()
    }
}

/// What the `*_str` functions answer for a value they do not know.
const UNKNOWN: &CStr = c"unknown";

/// C copies of strings (NUL-terminated), by value, made on first use and
/// kept for the life of the process: C holds the pointers it is given.
type CStrings = OnceLock<Vec<(c_int, CString)>>;

/// The C string of `value` among `strings` (filled from `entries` on first
/// use), or "unknown".
fn lookup(
    strings: &'static CStrings,
    entries: impl FnOnce() -> Vec<(c_int, &'static str)>,
    value: c_int,
) -> *const c_char {
    guard(UNKNOWN.as_ptr(), || {
        let strings = strings.get_or_init(|| {
            entries()
                .into_iter()
                .map(|(v, s)| (v, CString::new(s).expect("no NUL inside")))
                .collect()
        });
        strings
            .iter()
            .find(|(v, _)| *v == value)
            .map_or(UNKNOWN, |(_, s)| s.as_c_str())
            .as_ptr()
    })
}

/// Every `enum ibv_event_type` value (rverbs has them all).
const EVENT_TYPES: [AsyncEventType; 20] = [
    AsyncEventType::CqErr,
    AsyncEventType::QpFatal,
    AsyncEventType::QpReqErr,
    AsyncEventType::QpAccessErr,
    AsyncEventType::CommEst,
    AsyncEventType::SqDrained,
    AsyncEventType::PathMig,
    AsyncEventType::PathMigErr,
    AsyncEventType::DeviceFatal,
    AsyncEventType::PortActive,
    AsyncEventType::PortErr,
    AsyncEventType::LidChange,
    AsyncEventType::PkeyChange,
    AsyncEventType::SmChange,
    AsyncEventType::SrqErr,
    AsyncEventType::SrqLimitReached,
    AsyncEventType::QpLastWqeReached,
    AsyncEventType::ClientReregister,
    AsyncEventType::GidChange,
    AsyncEventType::WqFatal,
];

export! { "IBVERBS_1.1"
    /// `ibv_event_type_str`.
    pub unsafe extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
        static STRINGS: CStrings = OnceLock::new();
        let entries = || EVENT_TYPES.iter().map(|&e| (e as u32 as c_int, e.as_str())).collect();
        lookup(&STRINGS, entries, event)
    }
}

/// The `enum ibv_wc_status` values rverbs has (0 to 21).
const WC_STATUSES: [WcStatus; 22] = [
    WcStatus::Success,
    WcStatus::LocLenErr,
    WcStatus::LocQpOpErr,
    WcStatus::LocEecOpErr,
    WcStatus::LocProtErr,
    WcStatus::WrFlushErr,
    WcStatus::MwBindErr,
    WcStatus::BadRespErr,
    WcStatus::LocAccessErr,
    WcStatus::RemInvReqErr,
    WcStatus::RemAccessErr,
    WcStatus::RemOpErr,
    WcStatus::RetryExcErr,
    WcStatus::RnrRetryExcErr,
    WcStatus::LocRddViolErr,
    WcStatus::RemInvRdReqErr,
    WcStatus::RemAbortErr,
    WcStatus::InvEecnErr,
    WcStatus::InvEecStateErr,
    WcStatus::FatalErr,
    WcStatus::RespTimeoutErr,
    WcStatus::GeneralErr,
];

/// The statuses rverbs has no value for: tag matching's, which it does
/// not do (IBV_WC_TM_ERR, IBV_WC_TM_RNDV_INCOMPLETE).
const WC_STATUSES_TM: [(c_int, &str); 2] = [(22, "TM error"), (23, "TM software rendezvous")];

export! { "IBVERBS_1.1"
    /// `ibv_wc_status_str`.
    pub unsafe extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
        static STRINGS: CStrings = OnceLock::new();
        let entries = || {
            WC_STATUSES
                .iter()
                .map(|&s| (s as u32 as c_int, s.as_str()))
                .chain(WC_STATUSES_TM)
                .collect()
        };
        lookup(&STRINGS, entries, status)
    }
}
