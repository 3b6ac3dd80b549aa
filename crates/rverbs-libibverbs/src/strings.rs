//! The string and rate helpers: `ibv_*_str`, `ibv_rate_to_mult` and friends,
//! with libibverbs' tables.

use std::ffi::{c_char, c_int, CStr};

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
            .unwrap_or(c"unknown");
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
            .unwrap_or(c"unknown");
        s.as_ptr()
    }
}

const EVENT_TYPES: [&CStr; 20] = [
    c"CQ error",
    c"local work queue catastrophic error",
    c"invalid request local work queue error",
    c"local access violation work queue error",
    c"communication established",
    c"send queue drained",
    c"path migrated",
    c"path migration request error",
    c"local catastrophic error",
    c"port active",
    c"port error",
    c"LID change",
    c"P_Key change",
    c"SM change",
    c"SRQ catastrophic error",
    c"SRQ limit reached",
    c"last WQE reached",
    c"client reregistration",
    c"GID table change",
    c"WQ fatal",
];

export! { "IBVERBS_1.1"
    /// `ibv_event_type_str`.
    pub unsafe extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
        let s = usize::try_from(event)
            .ok()
            .and_then(|i| EVENT_TYPES.get(i))
            .copied()
            .unwrap_or(c"unknown");
        s.as_ptr()
    }
}

const WC_STATUSES: [&CStr; 24] = [
    c"success",
    c"local length error",
    c"local QP operation error",
    c"local EE context operation error",
    c"local protection error",
    c"Work Request Flushed Error",
    c"memory management operation error",
    c"bad response error",
    c"local access error",
    c"remote invalid request error",
    c"remote access error",
    c"remote operation error",
    c"transport retry counter exceeded",
    c"RNR retry counter exceeded",
    c"local RDD violation error",
    c"remote invalid RD request",
    c"aborted error",
    c"invalid EE context number",
    c"invalid EE context state",
    c"fatal error",
    c"response timeout error",
    c"general error",
    c"TM error",
    c"TM software rendezvous",
];

export! { "IBVERBS_1.1"
    /// `ibv_wc_status_str`.
    pub unsafe extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
        let s = usize::try_from(status)
            .ok()
            .and_then(|i| WC_STATUSES.get(i))
            .copied()
            .unwrap_or(c"unknown");
        s.as_ptr()
    }
}
