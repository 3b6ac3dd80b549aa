//! Device enumeration (`ibv_get_device_list`) and the device handle.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use crate::attr::{Gid, NodeType, TransportType};
use crate::error::{Error, ErrorKind, Result, Verb};
use crate::soft::config::DeviceConfig;
use crate::soft::context::ContextCore;
use crate::soft::device::{self, SoftDevice};
use crate::verbs::context::Context;

/// The RDMA devices of this process (`ibv_get_device_list`).
///
/// On first use the software devices are created from `RVERBS_ADDR`, the
/// config file, or the loopback default (see the crate docs), and their UDP
/// endpoints are bound. A bad configuration is an error naming the variable
/// or file. Disassociated devices are no longer listed.
pub fn devices() -> Result<Vec<Device>> {
    Ok(device::list()?
        .into_iter()
        .map(|core| Device { core })
        .collect())
}

/// The device called `name`, or ENODEV.
pub fn device_by_name(name: &str) -> Result<Device> {
    devices()?
        .into_iter()
        .find(|d| d.name() == name)
        .ok_or_else(|| {
            Error::new(
                Verb::GetDeviceList,
                ErrorKind::NoDevice,
                format!("no RDMA device named {name:?}"),
            )
        })
}

/// Creates another software device in this process, e.g. a private device a
/// test can disassociate without disturbing others. It joins the device list.
pub fn add_device(config: DeviceConfig) -> Result<Device> {
    Ok(Device {
        core: device::add(config)?,
    })
}

/// An RDMA device (`struct ibv_device`). Cheap to clone; opening it gives a
/// [`Context`].
#[derive(Clone)]
pub struct Device {
    pub(crate) core: Arc<SoftDevice>,
}

impl Device {
    /// Its name (`rverbs0`, …).
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// Node GUID in host byte order (`ibv_get_device_guid` gives it big-endian).
    pub fn guid(&self) -> u64 {
        self.core.node_guid
    }

    /// Always a channel adapter.
    pub fn node_type(&self) -> NodeType {
        NodeType::Ca
    }

    /// Always the InfiniBand transport (RoCE is IB transport over UDP/IP).
    pub fn transport_type(&self) -> TransportType {
        TransportType::Ib
    }

    /// The IP address of the device's UDP endpoint (port 4791).
    pub fn addr(&self) -> IpAddr {
        self.core.addr
    }

    /// GID index 0: the address as a GID.
    pub fn gid(&self) -> Gid {
        self.core.gid
    }

    /// The network interface the address is on (`lo`, `eth0`), if found.
    pub fn interface(&self) -> Option<&str> {
        self.core.interface.as_deref()
    }

    /// Opens a context (`ibv_open_device`). Fails with ENODEV once the device
    /// was disassociated.
    pub fn open(&self) -> Result<Context> {
        Ok(Context {
            core: ContextCore::open(&self.core)?,
        })
    }

    /// Makes the device go away as a hot-unplugged NIC does: its UDP endpoint
    /// closes, it leaves the device list, every open context receives
    /// `IBV_EVENT_DEVICE_FATAL`, blocked event readers wake, and from then on
    /// verbs fail with EIO — destroy, dealloc and dereg too, unless
    /// `RDMAV_ALLOW_DISASSOC_DESTROY` is set, when they succeed. Objects still
    /// alive stay memory-safe to use and drop. Calling it twice does nothing.
    pub fn disassociate(&self) {
        self.core.disassociate();
    }

    /// Counters of the device's network engine.
    pub fn net_stats(&self) -> crate::NetStats {
        self.core.net_stats()
    }

    /// Whether the device is gone: [`disassociate`](Self::disassociate)
    /// happened, or the device failed ([`has_failed`](Self::has_failed)).
    pub fn is_disassociated(&self) -> bool {
        self.core.is_disassociated()
    }

    /// Whether the device failed as a NIC does on a fatal error: its
    /// network engine panicked (a bug; the panic is logged). It then went
    /// away as on [`disassociate`](Self::disassociate) — every open context
    /// got `IBV_EVENT_DEVICE_FATAL` and verbs fail with EIO — except that
    /// its QPs' outstanding work is not flushed: the engine's state may be
    /// half-updated, so nothing touches it again. Completions queued before
    /// stay readable.
    pub fn has_failed(&self) -> bool {
        self.core.has_failed()
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.core, &other.core)
    }
}

impl Eq for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.core.name)
            .field("addr", &self.core.addr)
            .field("disassociated", &self.is_disassociated())
            .finish()
    }
}
