//! RDMA verbs in safe Rust, over a software RoCEv2 device that runs in user
//! space over UDP.
//!
//! ```no_run
//! use rverbs::AccessFlags;
//!
//! let device = rverbs::devices()?.into_iter().next().expect("rverbs0 is always there");
//! let ctx = device.open()?;
//! let port = ctx.query_port(1)?;
//! println!("{}: {:?}, MTU {}", device.name(), port.state, port.active_mtu.bytes());
//!
//! let channel = ctx.create_comp_channel()?;
//! let cq = ctx.cq_builder().cqe(256).channel(&channel).build()?;
//! let pd = ctx.alloc_pd()?;
//! let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! mr.write_at(0, b"hello")?;
//! println!("lkey {:#x} rkey {:#x}", mr.lkey(), mr.rkey());
//! # Ok::<(), rverbs::Error>(())
//! ```
//!
//! # The device
//! Each process has its own software device, `rverbs0`, whose UDP endpoint
//! binds `ADDR:4791`. By default ADDR is the first free address of
//! 127.0.0.1, 127.0.0.2, …, so several processes on one host each get their
//! own address and GID with no configuration. For real networks set
//! `RVERBS_ADDR` (a comma-separated list of `[NAME=]ADDR`, one device each)
//! or write `/etc/rverbs/rverbs.toml` (or the file `RVERBS_CONFIG` names):
//!
//! ```toml
//! [[device]]
//! name = "rverbs0"     # optional
//! addr = "192.0.2.2"   # an address of this host, IPv4 or IPv6, or "auto"
//! ```
//!
//! # Semantics
//! Verbs behave as in libibverbs and fail with the errno it would report
//! ([`Error::errno`]). Differences come from ownership:
//! - children hold their parents alive (CQ → channel → context → device,
//!   MR → PD → context), so no resource can be orphaned; an explicit
//!   `destroy`/`dealloc`/`dereg`/`close` reports EBUSY and hands the object
//!   back ([`Rejected`]), while `Drop` releases it once nothing uses it;
//! - completion and async events acknowledge themselves when dropped, and a
//!   destroy with an event still held fails with EBUSY instead of waiting.
//!
//! After [`Device::disassociate`] (a hot-unplug), `IBV_EVENT_DEVICE_FATAL`
//! reaches every context and verbs fail with EIO; destroy verbs too, unless
//! `RDMAV_ALLOW_DISASSOC_DESTROY` is set (present and not `0`, read once per
//! process), when they succeed. A panic in a device's network engine (a bug)
//! fails the device the same way ([`Device::has_failed`]), as a fatal error
//! does a NIC: it is logged, and never reaches the caller.
//!
//! Every object is `Send + Sync`: share it between threads by reference or
//! in an `Arc`.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

/// A warning the first time this call site runs and a debug line after:
/// a failure that may repeat per packet or per pass shows once on stderr
/// (`RVERBS_LOG` in the CLI and the drop-in), not once per occurrence.
macro_rules! warn_once {
    ($($arg:tt)*) => {{
        static SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if SEEN.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::debug!($($arg)*);
        } else {
            tracing::warn!($($arg)*);
        }
    }};
}

pub mod attr;
pub mod cm;
pub mod error;
pub mod event;
pub mod qp_attr;
pub mod resources;
mod soft;
#[cfg(feature = "tokio")]
pub mod tokio;
mod verbs;
pub mod wc;
pub mod wr;

pub use attr::{
    AccessFlags, AtomicCap, DeviceAttr, DeviceCapFlags, Gid, GidEntry, GidType, LinkLayer, Mtu,
    NodeType, PortAttr, PortCapFlags, PortState, TransportType,
};
pub use error::{Error, ErrorDetail, ErrorKind, Rejected, Result, Verb};
pub use event::AsyncEventType;
pub use qp_attr::{AhAttr, QpAttr, QpAttrMask, QpCaps, QpType, TransitionError};
pub use resources::{LiveResource, ResourceCounts, ResourceKind};
pub use soft::config::{DeviceAddr, DeviceConfig};
pub use soft::device::{allow_disassoc_destroy, ALLOW_DISASSOC_DESTROY_ENV};
pub use soft::engine::NetStats;
pub use verbs::ah::AddressHandle;
pub use verbs::async_event::{AsyncEvent, AsyncEventElement};
pub use verbs::channel::{CompletionChannel, CqEvent};
pub use verbs::context::Context;
pub use verbs::cq::{CompletionQueue, CqBuilder};
pub use verbs::device::{add_device, device_by_name, devices, Device};
pub use verbs::mr::{MemoryRegion, MrBuffer, Rereg};
pub use verbs::mw::MemoryWindow;
pub use verbs::pd::ProtectionDomain;
pub use verbs::qp::{QpBuilder, QueuePair};
pub use verbs::srq::{SharedReceiveQueue, SrqAttr, SrqAttrMask};
pub use wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion, ROCE_L3_TYPE_IPV4, ROCE_L3_TYPE_IPV6};
pub use wr::{
    inc_rkey, MwBind, MwBindInfo, MwType, Payload, QpState, RecvWr, SendFlags, SendWr, Sge,
    UdAddress, WrOpcode,
};

/// Device counters of running programs — this one's and, over their
/// counter sockets, other processes' (what `rverbs counters` shows and
/// `RVERBS_COUNTERS=1` prints at a C program's exit).
pub mod counters {
    pub use crate::soft::counters::{running, summary, RunningDevice};
}

/// `RVERBS_LOG` (the `log-env` cargo feature): rverbs' tracing events (a
/// device coming up, a refused GSO send, an assumed MTU, a poller that
/// stopped parking …) to stderr, filtered with tracing's env-filter syntax
/// (`debug`, `rverbs::soft::engine=trace`, …); unset, warnings and errors
/// only.
#[cfg(feature = "log-env")]
pub mod log {
    /// Installs the stderr subscriber `RVERBS_LOG` asks for, unless the
    /// program installed one of its own; a filter that does not parse is
    /// reported, and warnings are logged. Never panics.
    pub fn init_from_env() {
        let _ = std::panic::catch_unwind(|| {
            use tracing_subscriber::EnvFilter;
            let filter = match std::env::var("RVERBS_LOG") {
                Ok(spec) => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
                    eprintln!(
                        "rverbs: RVERBS_LOG={spec:?} is not a filter ({e}); logging warnings"
                    );
                    EnvFilter::new("warn")
                }),
                Err(_) => EnvFilter::new("warn"),
            };
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .try_init();
        });
    }
}

/// Test-only fault injection (the `fault-injection` cargo feature, which the
/// crate's own tests turn on; never enabled in a build that ships): makes a
/// device's engine panic, so tests can check that the device then fails
/// safely — `IBV_EVENT_DEVICE_FATAL` to every context, EIO from later verbs,
/// no hang and no abort — or stall, so tests can check what a starved
/// engine does when it runs again.
#[cfg(feature = "fault-injection")]
pub mod fault {
    pub use crate::soft::engine::PanicSite;

    /// Arms one panic in `device`'s engine, with its lock held: the next
    /// progress pass on a `site` thread that receives a packet panics in
    /// its middle (after the receive, before the transmit); at
    /// [`PanicSite::Post`], the next QP verb panics after its change,
    /// before its transmit.
    pub fn arm_panic(device: &crate::Device, site: PanicSite) {
        device.core.engine.arm_panic(site);
    }

    /// Makes the next QP verb on `device` (a post, say) hold its engine's
    /// lock for `hold` after its transmit: the whole engine kept off the
    /// cores, as a busy host does to a process's threads, while what it
    /// just sent waits in the sockets.
    pub fn arm_stall(device: &crate::Device, hold: std::time::Duration) {
        device.core.engine.arm_stall(hold);
    }
}

/// The UDP port RoCEv2 packets go to (4791), where every device's endpoint
/// listens.
pub use rverbs_wire::icrc::ROCE_V2_PORT;
