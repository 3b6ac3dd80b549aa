//! The software RoCE device: one instance per configured address, shared by
//! every context opened on it, plus the process-wide device list.
//!
//! A device owns its UDP endpoint (`ADDR:4791`), its identity (GID, node
//! GUID), the attributes and limits every verb enforces, its key table and
//! the handles of its objects. Disassociation — a hot-unplug — is modelled
//! here: the endpoint closes, every context gets `IBV_EVENT_DEVICE_FATAL`,
//! and later verbs fail with EIO. A failure of the device's engine (a panic
//! in it) ends the device the same way, as a fatal error does a NIC.

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use rverbs_wire::icrc::ROCE_V2_PORT;

use crate::attr::{
    AtomicCap, DeviceAttr, DeviceCapFlags, Gid, LinkLayer, Mtu, PortAttr, PortCapFlags, PortState,
    PHYS_STATE_DISABLED, PHYS_STATE_LINK_UP,
};
use crate::error::{Error, ErrorKind, Verb};
use crate::event::AsyncEventType;
use crate::soft::cm::service::CmService;
use crate::soft::config::{self, DeviceAddr, DeviceConfig};
use crate::soft::context::AsyncSource;
use crate::soft::context::ContextCore;
use crate::soft::engine::{Engine, EngineLimits, NetStats, Watch};
use crate::soft::link::{self, LinkWatch};
use crate::soft::memory::MrTable;

/// IEEE OUI rverbs reports as `vendor_id`: 52:56:45 ("RVE"), a locally
/// administered OUI (bit 1 of the first octet), so it is no real vendor's —
/// in particular not Mellanox's or Amazon's (EFA), which programs such as
/// perftest special-case.
pub const VENDOR_ID: u32 = 0x52_56_45;
/// `vendor_part_id` of the software device.
pub const VENDOR_PART_ID: u32 = 0x7276;
/// Number of completion vectors (one progress engine).
pub const NUM_COMP_VECTORS: u32 = 1;
/// The only port.
pub const PORT_NUM: u8 = 1;
/// Entries in the GID table: one device, one address, one GID.
pub const GID_TABLE_LEN: u32 = 1;
/// The only P_Key: the default full-membership key.
pub const DEFAULT_PKEY: u16 = 0xffff;

/// Environment variable that turns EIO from destroy verbs after a
/// disassociation into success (read once per process).
pub const ALLOW_DISASSOC_DESTROY_ENV: &str = "RDMAV_ALLOW_DISASSOC_DESTROY";

/// Whether `RDMAV_ALLOW_DISASSOC_DESTROY` is set (present and not "0"), read
/// once per process as libibverbs does at initialization.
pub fn allow_disassoc_destroy() -> bool {
    static ALLOW: OnceLock<bool> = OnceLock::new();
    *ALLOW.get_or_init(|| std::env::var_os(ALLOW_DISASSOC_DESTROY_ENV).is_some_and(|v| v != "0"))
}

fn device_attr(node_guid: u64) -> DeviceAttr {
    const MAX_QP: u32 = 16 * 1024;
    const MAX_QP_RD_ATOM: u32 = 128;
    DeviceAttr {
        fw_ver: env!("CARGO_PKG_VERSION").to_string(),
        node_guid,
        sys_image_guid: node_guid,
        max_mr_size: 1 << 46,
        page_size_cap: 0xffff_f000,
        vendor_id: VENDOR_ID,
        vendor_part_id: VENDOR_PART_ID,
        hw_ver: 1,
        max_qp: MAX_QP,
        max_qp_wr: 16 * 1024,
        // Memory windows of type 1 and 2B, as rxe advertises them.
        device_cap_flags: DeviceCapFlags::SYS_IMAGE_GUID
            .union(DeviceCapFlags::SRQ_RESIZE)
            .union(DeviceCapFlags::MEM_WINDOW)
            .union(DeviceCapFlags::MEM_WINDOW_TYPE_2B),
        max_sge: 32,
        max_sge_rd: 32,
        max_cq: 16 * 1024,
        // As a ConnectX's (2^22 - 1): a CQ's entries take memory only as
        // completions wait in it, and libfabric's RxM sizes its CQs from
        // max_qp_wr (16 × 16,384 = 262,144 entries).
        max_cqe: (1 << 22) - 1,
        max_mr: 64 * 1024,
        max_pd: 64 * 1024,
        max_qp_rd_atom: MAX_QP_RD_ATOM,
        max_ee_rd_atom: 0,
        max_res_rd_atom: MAX_QP * MAX_QP_RD_ATOM,
        max_qp_init_rd_atom: MAX_QP_RD_ATOM,
        max_ee_init_rd_atom: 0,
        atomic_cap: AtomicCap::Hca,
        max_ee: 0,
        max_rdd: 0,
        max_mw: 64 * 1024,
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: 8192,
        max_mcast_qp_attach: 56,
        max_total_mcast_qp_attach: 8192 * 56,
        max_ah: 32 * 1024,
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: 16 * 1024,
        max_srq_wr: 16 * 1024,
        max_srq_sge: 32,
        max_pkeys: 1,
        local_ca_ack_delay: 15,
        phys_port_cnt: 1,
    }
}

fn port_attr(active_mtu: Mtu) -> PortAttr {
    PortAttr {
        state: PortState::Active,
        max_mtu: Mtu::Mtu4096,
        active_mtu,
        gid_tbl_len: GID_TABLE_LEN,
        port_cap_flags: PortCapFlags::CM_SUP | PortCapFlags::IP_BASED_GIDS,
        max_msg_sz: crate::soft::transport::MAX_MSG_SZ,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: 1,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        // 1X at 25 Gbps: the order of what a software device moves.
        active_width: 1,
        active_speed: 32,
        phys_state: PHYS_STATE_LINK_UP,
        link_layer: LinkLayer::Ethernet,
        // IBV_QPF_GRH_REQUIRED: every RoCE packet is routed.
        flags: 1,
        port_cap_flags2: 0,
        active_speed_ex: 0,
    }
}

/// The node GUID for an address: the OUI, then `ff` and the IPv4 address
/// (readable in `ibv_devinfo`: `5256:45ff:7f00:0001` is 127.0.0.1), or `fe`
/// and a 32-bit FNV-1a hash of an IPv6 address. Stable across runs.
pub fn node_guid_for(addr: IpAddr) -> u64 {
    let low: u64 = match addr {
        IpAddr::V4(v4) => (0xff << 32) | u64::from(u32::from(v4)),
        IpAddr::V6(v6) => {
            let hash = v6.octets().iter().fold(0x811c_9dc5u32, |h, &b| {
                (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
            });
            (0xfe << 32) | u64::from(hash)
        }
    };
    (u64::from(VENDOR_ID) << 40) | low
}

/// A device-wide count against a `max_*` limit.
pub(crate) struct Quota {
    used: AtomicU32,
    limit: u32,
}

impl Quota {
    fn new(limit: u32) -> Self {
        Quota {
            used: AtomicU32::new(0),
            limit,
        }
    }

    /// Takes one unit; false when the limit is reached.
    pub(crate) fn try_acquire(&self) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok()
    }

    /// Gives one unit back.
    pub(crate) fn release(&self) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Units in use.
    #[cfg(test)]
    pub(crate) fn used(&self) -> u32 {
        self.used.load(Ordering::Acquire)
    }
}

/// Which path a destroy verb takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DestroyPath {
    /// The device is alive: the usual checks (EBUSY …) apply.
    Checked,
    /// The device is gone and RDMAV_ALLOW_DISASSOC_DESTROY is set: release
    /// without checks or waits, report success.
    Forced,
}

/// Whether a device is alive, and if not, why (`SoftDevice::gone`).
const ALIVE: u8 = 0;
const DISASSOCIATED: u8 = 1;
const FAILED: u8 = 2;

/// How a device goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Hot-unplugged: every QP goes to ERR with its work flushed, then the
    /// endpoint closes.
    Disassociated,
    /// Its engine failed (panicked): its state may be half-updated, so it
    /// is left as it is — no flush — and only the endpoint closes.
    Failed,
}

/// One software RoCE device.
pub(crate) struct SoftDevice {
    pub(crate) name: String,
    pub(crate) addr: IpAddr,
    pub(crate) gid: Gid,
    pub(crate) node_guid: u64,
    pub(crate) attr: DeviceAttr,
    pub(crate) port: PortAttr,
    /// The network interface the address is on, if found.
    pub(crate) interface: Option<String>,
    pub(crate) ifindex: u32,
    /// The UDP endpoint, the QP table and progress.
    pub(crate) engine: Arc<Engine>,
    /// `ALIVE`, `DISASSOCIATED` or `FAILED`.
    gone: AtomicU8,
    next_handle: AtomicU64,
    /// Registered memory (the engine holds it too).
    pub(crate) mrs: Arc<MrTable>,
    pub(crate) pds: Quota,
    pub(crate) cqs: Quota,
    pub(crate) qps: Quota,
    pub(crate) srqs: Quota,
    pub(crate) ahs: Quota,
    contexts: Mutex<Vec<Weak<ContextCore>>>,
    /// The port is ACTIVE: its address is on an interface that is up.
    port_active: AtomicBool,
    /// Address and link changes of the host (`None`: not watchable here).
    pub(crate) link_watch: Option<Arc<LinkWatch>>,
    /// The connection manager, started by the first rdma_cm-style id that
    /// needs the device.
    cm: Mutex<Option<CmService>>,
    /// The interface's hardware address as last seen (empty: none, or
    /// unknown), followed from the link notifications.
    hw_addr: Mutex<Vec<u8>>,
    /// Who hears of a bonding failover of the interface (the connection
    /// manager ids attached to the device).
    failover_watchers: Mutex<Vec<Weak<dyn FailoverWatcher>>>,
}

/// Who hears that the device's interface, a bond, failed over to another
/// slave (a connection manager id attached to the device).
pub(crate) trait FailoverWatcher: Send + Sync {
    /// The bond's active slave changed; `hw_addr` is the bond's hardware
    /// address now.
    fn bonding_failover(&self, hw_addr: &[u8]);
}

impl SoftDevice {
    fn create(name: String, addr: DeviceAddr, origin: &str) -> Result<Arc<SoftDevice>, Error> {
        let socket = bind_endpoint(addr, origin)?;
        let local = socket
            .local_addr()
            .map_err(|e| Error::from_io(Verb::GetDeviceList, &e, "UDP endpoint"))?
            .ip();
        let link = find_interface(local);
        let link_mtu = match &link {
            Some(l) => l.mtu,
            None => {
                tracing::warn!("no interface found for {local}; assuming a 1500-byte MTU");
                1500
            }
        };
        let active_mtu = Mtu::for_link_mtu(link_mtu).unwrap_or(Mtu::Mtu256);
        let node_guid = node_guid_for(local);
        let attr = device_attr(node_guid);
        let mrs = Arc::new(MrTable::with_limits(
            attr.max_mr as usize,
            attr.max_mw as usize,
        ));
        let limits = EngineLimits {
            max_mcast_grp: attr.max_mcast_grp,
            max_mcast_qp_attach: attr.max_mcast_qp_attach,
        };
        let ifindex = link.as_ref().map_or(0, |l| l.index);
        let engine = Engine::new(socket, ifindex, mrs.clone(), limits)
            .map_err(|e| Error::from_io(Verb::GetDeviceList, &e, "UDP endpoint setup"))?;
        tracing::debug!(%name, %local, link_mtu, "software RoCE device up");
        let device = Arc::new(SoftDevice {
            name,
            addr: local,
            gid: Gid::from_ip(local),
            node_guid,
            port: port_attr(active_mtu),
            interface: link.as_ref().map(|l| l.name.clone()),
            ifindex,
            engine: Arc::new(engine),
            gone: AtomicU8::new(ALIVE),
            next_handle: AtomicU64::new(1),
            mrs,
            pds: Quota::new(attr.max_pd),
            cqs: Quota::new(attr.max_cq),
            qps: Quota::new(attr.max_qp),
            srqs: Quota::new(attr.max_srq),
            ahs: Quota::new(attr.max_ah),
            attr,
            contexts: Mutex::new(Vec::new()),
            port_active: AtomicBool::new(link::address_usable(local)),
            link_watch: match LinkWatch::open() {
                Ok(w) => Some(Arc::new(w)),
                Err(e) => {
                    tracing::warn!("cannot watch address changes ({e}); the port stays ACTIVE");
                    None
                }
            },
            cm: Mutex::new(None),
            hw_addr: Mutex::new(if ifindex == 0 {
                Vec::new()
            } else {
                link::hw_addr(ifindex)
            }),
            failover_watchers: Mutex::new(Vec::new()),
        });
        // A failed engine ends the device (held weakly: the engine lives
        // inside it).
        let weak = Arc::downgrade(&device);
        device.engine.on_failure(move || {
            if let Some(dev) = weak.upgrade() {
                dev.go_away(Ending::Failed);
            }
        });
        Ok(device)
    }

    /// Whether the device is gone: disassociated, or failed (which
    /// disassociates it too).
    pub(crate) fn is_disassociated(&self) -> bool {
        self.gone.load(Ordering::Acquire) != ALIVE
    }

    /// Whether the device failed: its engine panicked.
    pub(crate) fn has_failed(&self) -> bool {
        self.gone.load(Ordering::Acquire) == FAILED || self.engine.has_failed()
    }

    /// Fails with EIO once the device is gone: the entry check of every verb.
    pub(crate) fn check_alive(&self, verb: Verb) -> Result<(), Error> {
        if self.is_disassociated() || self.engine.has_failed() {
            Err(self.gone_error(verb))
        } else {
            Ok(())
        }
    }

    /// The EIO a verb fails with on a device that is gone, saying why.
    pub(crate) fn gone_error(&self, verb: Verb) -> Error {
        let why = if self.has_failed() {
            "failed (its network engine panicked; see the log)"
        } else {
            "was disassociated"
        };
        Error::new(verb, ErrorKind::Io, format!("device {} {why}", self.name))
    }

    /// The path of a destroy verb: checked while alive; after disassociation
    /// EIO, or forced success with RDMAV_ALLOW_DISASSOC_DESTROY.
    pub(crate) fn destroy_path(&self, verb: Verb) -> Result<DestroyPath, Error> {
        match self.check_alive(verb) {
            Ok(()) => Ok(DestroyPath::Checked),
            Err(_) if allow_disassoc_destroy() => Ok(DestroyPath::Forced),
            Err(mut e) => {
                e = Error::new(
                    verb,
                    ErrorKind::Io,
                    format!(
                        "{}; set {ALLOW_DISASSOC_DESTROY_ENV}=1 to have destroy verbs succeed",
                        e.message()
                    ),
                );
                Err(e)
            }
        }
    }

    /// Whether a destroy verb may go ahead: on a live device when `busy`
    /// finds nothing holding the object (else EBUSY with its reason); after
    /// disassociation EIO, or yes without checks under
    /// RDMAV_ALLOW_DISASSOC_DESTROY (see [`destroy_path`](Self::destroy_path)).
    pub(crate) fn may_destroy(
        &self,
        verb: Verb,
        busy: impl FnOnce() -> Option<String>,
    ) -> Result<(), Error> {
        match self.destroy_path(verb)? {
            DestroyPath::Forced => Ok(()),
            DestroyPath::Checked => busy().map_or(Ok(()), |why| Err(Error::busy(verb, why))),
        }
    }

    /// A new handle, unique on this device for the life of the process (a
    /// 64-bit count does not wrap), so handles also serve as identities: the
    /// PD check compares PD handles.
    pub(crate) fn new_handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// The port's attributes as of now: DOWN (physical state disabled)
    /// while the device's address is gone.
    pub(crate) fn port_attr(&self) -> PortAttr {
        let mut port = self.port.clone();
        // The port's violation counters are the engine's, saturating at
        // 16 bits as the IBTA's PortInfo fields (and rxe) do.
        let stats = self.engine.stats();
        port.bad_pkey_cntr = stats.rx_bad_pkey.min(0xffff) as u32;
        port.qkey_viol_cntr = stats.qkey_violations.min(0xffff) as u32;
        if !self.port_active.load(Ordering::Acquire) {
            port.state = PortState::Down;
            port.phys_state = PHYS_STATE_DISABLED;
        }
        port
    }

    /// Looks whether the address is still usable; on a change the port
    /// follows, with IBV_EVENT_PORT_ERR or IBV_EVENT_PORT_ACTIVE to every
    /// open context.
    pub(crate) fn check_link(&self) {
        let up = link::address_usable(self.addr);
        if self.port_active.swap(up, Ordering::AcqRel) == up {
            return;
        }
        tracing::info!(name = %self.name, addr = %self.addr, up, "port state changed");
        let event = if up {
            AsyncEventType::PortActive
        } else {
            AsyncEventType::PortErr
        };
        let contexts: Vec<_> = {
            let list = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
            list.iter().filter_map(Weak::upgrade).collect()
        };
        for ctx in contexts {
            ctx.post_async(event, AsyncSource::Port(PORT_NUM));
        }
    }

    /// The interface's hardware address as last seen (empty: none, or not
    /// known).
    pub(crate) fn hw_addr(&self) -> Vec<u8> {
        self.hw_addr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Tells `watcher` of the interface's bonding failovers from now on
    /// (while it lives), and starts the engine thread, which watches for
    /// them.
    pub(crate) fn watch_failovers(self: &Arc<Self>, watcher: Weak<dyn FailoverWatcher>) {
        {
            let mut list = self
                .failover_watchers
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            list.retain(|w| w.strong_count() > 0);
            list.push(watcher);
        }
        self.start_engine();
    }

    /// Follows the link notifications about the device's interface: its
    /// hardware address, and a bonding failover, which every watcher hears
    /// (the kernel's rdma_cm raises ADDR_CHANGE on it). Lost notifications
    /// (`lost`) or the first look (`refresh`) read the address afresh.
    pub(crate) fn follow_link(&self, notices: &link::Notices, refresh: bool) {
        if self.ifindex == 0 {
            return;
        }
        if refresh || notices.lost {
            *self.hw_addr.lock().unwrap_or_else(|p| p.into_inner()) = link::hw_addr(self.ifindex);
        }
        for notice in notices.links.iter().filter(|n| n.ifindex == self.ifindex) {
            if let Some(hw) = &notice.hw_addr {
                hw.clone_into(&mut self.hw_addr.lock().unwrap_or_else(|p| p.into_inner()));
            }
            if !notice.bonding_failover {
                continue;
            }
            let hw = self.hw_addr();
            tracing::info!(name = %self.name, interface = ?self.interface, "bonding failover");
            let watchers: Vec<_> = {
                let mut list = self
                    .failover_watchers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                list.retain(|w| w.strong_count() > 0);
                list.iter().filter_map(Weak::upgrade).collect()
            };
            // No lock held: a watcher takes its own, and reports.
            for w in watchers {
                w.bonding_failover(&hw);
            }
        }
    }

    /// Starts the device's engine thread (once): it then also watches the
    /// host's address changes for the port, and the device's counters are
    /// published for `rverbs counters`.
    pub(crate) fn start_engine(self: &Arc<Self>) {
        let watch = PortWatch {
            link: self.link_watch.clone(),
            device: Arc::downgrade(self),
            looked: AtomicBool::new(false),
        };
        if self.engine.start_thread(&self.name, Box::new(watch)) {
            crate::soft::counters::publish(self);
            // Devices of this host may now reach it through shared memory.
            self.engine.start_local();
        }
    }

    /// Adds a context to those disassociation reaches; false if the device
    /// is gone already. Checked under the list's lock, which disassociation
    /// holds while it marks the device gone, so every context hears of it
    /// exactly once.
    pub(crate) fn register_context(&self, ctx: &Arc<ContextCore>) -> bool {
        let mut list = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_disassociated() {
            return false;
        }
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(ctx));
        true
    }

    /// The device's counters: its engine's and its connection manager's.
    pub(crate) fn net_stats(&self) -> NetStats {
        let mut stats = self.engine.stats();
        if let Some(cm) = self.cm.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            cm.add_counters(&mut stats);
        }
        stats
    }

    /// The device's connection manager service, started on first use
    /// (ENODEV once the device is gone). The engine thread starts too (as
    /// for a first context): it is what reads MADs from the socket while
    /// nobody polls a CQ.
    pub(crate) fn cm_service(self: &Arc<Self>, verb: Verb) -> Result<CmService, Error> {
        self.check_alive(verb)?;
        self.start_engine();
        let mut cm = self.cm.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(service) = cm.as_ref() {
            return Ok(service.clone());
        }
        let service = CmService::start(&self.engine, self.gid, self.node_guid)
            .map_err(|e| Error::from_io(verb, &e, "the connection manager's GSI QP"))?;
        *cm = Some(service.clone());
        Ok(service)
    }

    /// Hot-unplug: closes the endpoint, takes the device off the device list
    /// and sends IBV_EVENT_DEVICE_FATAL to every open context.
    pub(crate) fn disassociate(self: &Arc<Self>) {
        self.go_away(Ending::Disassociated);
    }

    /// The device goes away (once): it is marked gone, so verbs fail with
    /// EIO; its engine shuts down (disassociation: QPs to ERR, work
    /// flushed) or is abandoned as it is (failure); it leaves the device
    /// list; and every open context gets IBV_EVENT_DEVICE_FATAL.
    fn go_away(self: &Arc<Self>, ending: Ending) {
        let mark = match ending {
            Ending::Disassociated => DISASSOCIATED,
            Ending::Failed => FAILED,
        };
        let contexts: Vec<_> = {
            let mut list = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
            if self
                .gone
                .compare_exchange(ALIVE, mark, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return;
            }
            list.drain(..).filter_map(|w| w.upgrade()).collect()
        };
        match ending {
            Ending::Disassociated => self.engine.shutdown(),
            Ending::Failed => self.engine.abandon(),
        }
        // Out of the lock first: the ids told run with it free.
        let cm = self.cm.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(cm) = cm {
            cm.shutdown();
        }
        forget(self);
        let told = contexts.len();
        for ctx in contexts {
            ctx.device_fatal();
        }
        match ending {
            Ending::Disassociated => tracing::info!(name = %self.name, "device disassociated"),
            // The panic itself was logged (as an error) where it was caught.
            Ending::Failed => tracing::warn!(
                name = %self.name,
                "device failed: IBV_EVENT_DEVICE_FATAL sent to {told} context(s)"
            ),
        }
    }
}

/// What a device's engine thread watches for its port: the host's address
/// changes (if they can be watched here), after which the device looks
/// again whether its address is usable.
struct PortWatch {
    link: Option<Arc<LinkWatch>>,
    device: Weak<SoftDevice>,
    /// The first look is done (the interface's address was read afresh).
    looked: AtomicBool,
}

impl Watch for PortWatch {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.link.as_ref().map(|w| w.fd())
    }

    fn on_ready(&self) {
        let notices = match &self.link {
            Some(w) => w.drain(),
            None => link::Notices::default(),
        };
        if let Some(dev) = self.device.upgrade() {
            dev.check_link();
            dev.follow_link(&notices, !self.looked.swap(true, Ordering::AcqRel));
        }
    }
}

struct Link {
    name: String,
    index: u32,
    mtu: u32,
}

/// The interface holding `addr` (exactly, or by subnet as 127.0.0.2 is on
/// `lo`), with its index and MTU from sysfs.
fn find_interface(addr: IpAddr) -> Option<Link> {
    let ifaces: Vec<_> = nix::ifaddrs::getifaddrs().ok()?.collect();
    let ip_of = |s: &Option<nix::sys::socket::SockaddrStorage>| -> Option<IpAddr> {
        let s = s.as_ref()?;
        if let Some(v4) = s.as_sockaddr_in() {
            Some(IpAddr::V4(v4.ip()))
        } else {
            s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
        }
    };
    let in_subnet = |ifa: &nix::ifaddrs::InterfaceAddress| -> bool {
        match (ip_of(&ifa.address), ip_of(&ifa.netmask), addr) {
            (Some(IpAddr::V4(a)), Some(IpAddr::V4(m)), IpAddr::V4(x)) => {
                u32::from(a) & u32::from(m) == u32::from(x) & u32::from(m)
            }
            (Some(IpAddr::V6(a)), Some(IpAddr::V6(m)), IpAddr::V6(x)) => {
                u128::from(a) & u128::from(m) == u128::from(x) & u128::from(m)
            }
            _ => false,
        }
    };
    let ifa = ifaces
        .iter()
        .find(|i| ip_of(&i.address) == Some(addr))
        .or_else(|| ifaces.iter().find(|i| in_subnet(i)))?;
    let sys = std::path::Path::new("/sys/class/net").join(&ifa.interface_name);
    let read = |f: &str| -> Option<u32> {
        std::fs::read_to_string(sys.join(f))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some(Link {
        name: ifa.interface_name.clone(),
        index: read("ifindex").unwrap_or(0),
        mtu: read("mtu")?,
    })
}

/// Binds the device's UDP endpoint.
fn bind_endpoint(addr: DeviceAddr, origin: &str) -> Result<UdpSocket, Error> {
    let verb = Verb::GetDeviceList;
    match addr {
        DeviceAddr::LoopbackAuto => {
            for n in 1..=254u8 {
                let ip = Ipv4Addr::new(127, 0, 0, n);
                match UdpSocket::bind((ip, ROCE_V2_PORT)) {
                    Ok(s) => return Ok(s),
                    Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                    Err(e) => {
                        return Err(Error::from_io(
                            verb,
                            &e,
                            &format!("cannot bind UDP {ip}:{ROCE_V2_PORT} (is lo up?)"),
                        ))
                    }
                }
            }
            Err(Error::new(
                verb,
                ErrorKind::AddrInUse,
                format!(
                    "UDP port {ROCE_V2_PORT} is taken on every loopback address \
                     127.0.0.1-127.0.0.254; set {} to an address of this host",
                    config::ADDR_ENV
                ),
            ))
        }
        DeviceAddr::Ip(ip) => UdpSocket::bind((ip, ROCE_V2_PORT)).map_err(|e| {
            let why = match e.kind() {
                std::io::ErrorKind::AddrInUse => format!(
                    "UDP {ip}:{ROCE_V2_PORT} is taken by another process (another rverbs \
                     device or a kernel rxe?); address from {origin}"
                ),
                std::io::ErrorKind::AddrNotAvailable => {
                    format!("{ip} is not an address of this host; address from {origin}")
                }
                _ => format!("cannot bind UDP {ip}:{ROCE_V2_PORT}; address from {origin}"),
            };
            Error::from_io(verb, &e, &why)
        }),
    }
}

struct Registry {
    initialized: bool,
    devices: Vec<Arc<SoftDevice>>,
    /// Every name ever given in this process, so a hot-unplugged device's
    /// name is not reused for another device.
    names: Vec<String>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    initialized: false,
    devices: Vec::new(),
    names: Vec::new(),
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

impl Registry {
    fn ensure_initialized(&mut self) -> Result<(), Error> {
        if self.initialized {
            return Ok(());
        }
        // Library initialization: read the once-per-process settings now.
        allow_disassoc_destroy();
        let (configs, origin) = config::load().map_err(|e| {
            Error::new(
                Verb::GetDeviceList,
                ErrorKind::InvalidArgument,
                e.to_string(),
            )
        })?;
        // Explicit names first, so an unnamed device never takes one of them.
        let mut taken = self.names.clone();
        taken.extend(configs.iter().filter_map(|c| c.name.clone()));
        let mut created = Vec::new();
        for c in configs {
            let name = match c.name {
                Some(n) => n,
                None => {
                    let n = next_free_name(&taken);
                    taken.push(n.clone());
                    n
                }
            };
            created.push(SoftDevice::create(name, c.addr, &origin)?);
        }
        self.names.extend(created.iter().map(|d| d.name.clone()));
        self.devices.extend(created);
        self.initialized = true;
        Ok(())
    }
}

/// The first `rverbsN` not in `taken`.
fn next_free_name(taken: &[String]) -> String {
    (0..)
        .map(|i| format!("rverbs{i}"))
        .find(|n| !taken.contains(n))
        .unwrap_or_default()
}

/// The devices of this process, created from the configuration on first use.
pub(crate) fn list() -> Result<Vec<Arc<SoftDevice>>, Error> {
    let mut reg = registry();
    reg.ensure_initialized()?;
    Ok(reg.devices.clone())
}

/// The devices this process has made so far (none made here).
pub(crate) fn created() -> Vec<Arc<SoftDevice>> {
    registry().devices.clone()
}

/// Adds a device at run time (tests, tools). Its name must be new.
pub(crate) fn add(config: DeviceConfig) -> Result<Arc<SoftDevice>, Error> {
    let mut reg = registry();
    reg.ensure_initialized()?;
    config::check(std::slice::from_ref(&config))
        .map_err(|e| Error::invalid(Verb::GetDeviceList, e))?;
    if let Some(name) = &config.name {
        if reg.names.contains(name) {
            return Err(Error::invalid(
                Verb::GetDeviceList,
                format!("a device named {name:?} exists already in this process"),
            ));
        }
    }
    let name = config
        .name
        .clone()
        .unwrap_or_else(|| next_free_name(&reg.names));
    let dev = SoftDevice::create(name, config.addr, "the device config passed to add_device")?;
    reg.names.push(dev.name.clone());
    reg.devices.push(dev.clone());
    Ok(dev)
}

fn forget(dev: &Arc<SoftDevice>) {
    registry().devices.retain(|d| !Arc::ptr_eq(d, dev));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_is_stable_and_readable() {
        assert_eq!(
            node_guid_for("127.0.0.1".parse().unwrap()),
            0x5256_45ff_7f00_0001
        );
        let v6: IpAddr = "fd00::2".parse().unwrap();
        assert_eq!(node_guid_for(v6), node_guid_for(v6));
        assert_ne!(node_guid_for(v6), node_guid_for("fd00::3".parse().unwrap()));
        assert_eq!(node_guid_for(v6) >> 32, 0x5256_45fe);
    }

    #[test]
    fn quota_stops_at_limit() {
        let q = Quota::new(2);
        assert!(q.try_acquire());
        assert!(q.try_acquire());
        assert!(!q.try_acquire());
        q.release();
        assert_eq!(q.used(), 1);
        assert!(q.try_acquire());
    }

    #[test]
    fn loopback_interface_found_with_its_mtu() {
        let link = find_interface("127.0.0.7".parse().unwrap()).expect("lo holds 127.0.0.0/8");
        assert_eq!(link.name, "lo");
        let sys_mtu: u32 = std::fs::read_to_string("/sys/class/net/lo/mtu")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(link.mtu, sys_mtu);
        assert!(link.index > 0);
    }
}
