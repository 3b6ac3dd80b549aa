//! rdma_cm-style connection ids: [`CmId`] binds to an address, resolves a
//! peer's, listens, connects, accepts, rejects and disconnects, speaking
//! the IB CM on the wire through its device's connection manager (the
//! `soft::cm` service), so a peer may be another rverbs process or the
//! Linux kernel's rdma_cm.
//!
//! Addresses are IP addresses and rdma_cm ports (the port is not a UDP
//! port: it names a service, `port space << 16 | port`). On one host, a
//! connect to a local address (loopback, or one of the host's) finds the
//! device that listens on the port through the rendezvous
//! (`soft::cm::rendezvous`); across hosts the peer's address is its
//! device's, resolved as the kernel resolves it — by the route's next hop,
//! whose neighbour must answer (`soft::neigh`): until it does the id is in
//! ADDR_QUERY and the outcome (ADDR_RESOLVED, or ADDR_ERROR) comes from
//! the resolver thread.
//!
//! As librdmacm does for a QP created through it, an id given a QP brings
//! it up itself: INIT on connect or accept, RTR and RTS with what the
//! peer's REQ or REP says (before the REP on the passive side, on the REP
//! on the active side, which then sends the RTU and reports ESTABLISHED),
//! and ERR on disconnect (its work flushes).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use rverbs_wire::{IpCmHdr, IpCmHdrRepr, RdmaPortSpace};

use super::channel::{
    ChannelCore, CmEvent, CmEventKind, ConnEventParam, EventChannel, EventParam, UdParam,
};
use crate::attr::{AccessFlags, Gid, Mtu};
use crate::error::{Error, ErrorKind, Result, Verb};
use crate::qp_attr::{AhAttr, QpAttr, QpAttrMask, QpType};
use crate::soft::cm::agent::CmEvent as AgentEvent;
use crate::soft::cm::agent::{
    AcceptParams, CmError, ConnId, ConnectParams, ConnectResponse, ListenId,
};
use crate::soft::cm::msg::{CmTransport, Req, SidrStatus};
use crate::soft::cm::rendezvous::{self, Registration};
use crate::soft::cm::service::{CmService, CmSink, Owner};
use crate::soft::device::{FailoverWatcher, PORT_NUM};
use crate::soft::memory::random_u32;
use crate::soft::neigh::{self, NeighbourWaiter, Resolution};
use crate::verbs::device::Device;
use crate::verbs::qp::QueuePair;
use crate::wr::QpState;

/// The QP number that sends to every QP attached to a multicast group.
const MULTICAST_QPN: u32 = 0x00ff_ffff;
/// The Q_Key rdma_cm gives UD ids' QPs (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// Bytes of rdma_cm's IP CM header at the start of a REQ's and a
/// SIDR_REQ's private data.
const IP_CM_HDR: usize = 36;
/// The most private data a connect carries in TCP and UDP port spaces
/// (REQ: 92 − 36; SIDR_REQ: 216 − 36) and an accept (REP) or reject.
const REQ_USER_DATA: usize = 56;
const SIDR_REQ_USER_DATA: usize = 180;
/// The local ACK timeout the kernel's rdma_cm gives RoCE paths (packet
/// life 18, + 1; seen in its REQs).
const LOCAL_ACK_TIMEOUT: u8 = 19;
/// The RNR timer the kernel's CM sets on RTR (code 0: 655 ms).
const MIN_RNR_TIMER: u8 = 0;
/// The CA ACK delay a REP announces (as the Linux CM on rxe).
const TARGET_ACK_DELAY: u8 = 15;
/// How long a SIDR_REQ waits for its answer before it is sent again
/// (rdma_cm's: 2^(20 − 8) ms), up to 15 times.
const SIDR_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(4096);
/// Ephemeral rdma_cm ports (as the kernel's `ip_local_port_range`).
const EPHEMERAL: std::ops::RangeInclusive<u16> = 32768..=60999;
/// How long [`CmId::resolve_addr`] gives the next hop's neighbour (what
/// rping and `rdma_create_ep` ask).
pub const RESOLVE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(2000);

/// An rdma_cm port space: which services a port names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connections (RC).
    Tcp,
    /// `RDMA_PS_UDP`: UD QPs, resolved with SIDR.
    Udp,
    /// `RDMA_PS_IPOIB`: UD, as IPoIB uses it.
    Ipoib,
    /// `RDMA_PS_IB`: RC or UD, no IP CM header in the private data.
    Ib,
}

impl PortSpace {
    fn wire(self) -> RdmaPortSpace {
        match self {
            PortSpace::Tcp => RdmaPortSpace::Tcp,
            PortSpace::Udp => RdmaPortSpace::Udp,
            PortSpace::Ipoib => RdmaPortSpace::Ipoib,
            PortSpace::Ib => RdmaPortSpace::Ib,
        }
    }

    /// The `enum rdma_port_space` value.
    pub fn code(self) -> u16 {
        self.wire().code()
    }

    /// The port space of an `enum rdma_port_space` value.
    pub fn from_code(code: u16) -> Option<PortSpace> {
        Some(match RdmaPortSpace::from_code(code)? {
            RdmaPortSpace::Tcp => PortSpace::Tcp,
            RdmaPortSpace::Udp => PortSpace::Udp,
            RdmaPortSpace::Ipoib => PortSpace::Ipoib,
            RdmaPortSpace::Ib => PortSpace::Ib,
        })
    }

    /// Whether its ids are UD (resolved with SIDR).
    pub fn is_ud(self) -> bool {
        matches!(self, PortSpace::Udp | PortSpace::Ipoib)
    }

    /// Whether rdma_cm's IP CM header leads its private data.
    fn has_ip_header(self) -> bool {
        !matches!(self, PortSpace::Ib)
    }
}

/// What a connect or accept offers (`struct rdma_conn_param`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data for the peer: at most 56 bytes on a connect (UD: 180),
    /// 196 on an accept, 148 on a reject.
    pub private_data: Vec<u8>,
    /// RDMA READs/atomics this side serves at once.
    pub responder_resources: u8,
    /// RDMA READs/atomics this side has outstanding at once.
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Transport retries (0..=7) the peer's side… and ours use.
    pub retry_count: u8,
    /// RNR retries (0..=7; 7: for ever) the peer should use.
    pub rnr_retry_count: u8,
    /// This side's QP uses an SRQ (taken from the QP when one is given).
    pub srq: bool,
    /// This side's QP number when no QP is given (the program brings its
    /// QP up itself).
    pub qp_num: u32,
}

impl ConnParam {
    /// `responder_resources` or `initiator_depth` at this value asks for
    /// the most (`RDMA_MAX_RESP_RES`, `RDMA_MAX_INIT_DEPTH`): the device's
    /// on a connect, what the request offered (within the device's) on an
    /// accept.
    pub const MAX: u8 = 0xff;
}

impl Default for ConnParam {
    /// What rping offers: one READ each way, 7 retries, RNR retries for ever.
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            flow_control: false,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: 0,
        }
    }
}

/// Where the peer's connection manager is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// Not resolved.
    None,
    /// The device at this address.
    Device(IpAddr),
    /// A local address where no device listens on the port: a connect is
    /// rejected (after [`LISTEN_GRACE`]), as a REQ to a port nobody
    /// listens on is.
    NoListener,
}

/// Where an id is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Bound,
    /// Resolving the address: waiting for the next hop's neighbour.
    AddrQuery,
    AddrResolved,
    RouteResolved,
    Listening,
    Connecting,
    /// A connection request not yet answered (passive).
    Requested,
    Accepting,
    Established,
    Disconnected,
    Failed,
}

struct Listening {
    id: ListenId,
    _registration: Registration,
}

struct IdState {
    phase: Phase,
    device: Option<Device>,
    service: Option<CmService>,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    target: Target,
    conn: Option<ConnId>,
    listen: Option<Listening>,
    qp: Option<QueuePair>,
    local_psn: u32,
    /// The connect's offer (active side), for bringing the QP up.
    offer: Option<ConnParam>,
    /// The REQ being answered (passive side).
    req: Option<Box<Req>>,
    /// The parameters reported with ESTABLISHED.
    established_param: EventParam,
    /// What RTR and RTS take, once the peer's REQ or REP is known.
    rtr: Option<Rtr>,
    /// Attached to its device (bound to an address, resolved, or made by a
    /// request): the interface's hardware address then, as the kernel's
    /// rdma_cm records it; a bonding failover to another one is reported
    /// as ADDR_CHANGE. `None` while not attached.
    attached_hw_addr: Option<Vec<u8>>,
}

impl IdState {
    /// The address is resolved: the peer's connection manager is at
    /// `target`.
    fn resolved(&mut self, target: Target, dst: SocketAddr) {
        self.target = target;
        // As the kernel's rdma_cm puts the route's source in place of a
        // wildcard: the connection comes from the device's address, and
        // `rdma_get_local_addr` must say so (libfabric's rxm sends it to
        // its peers as the address to connect back to).
        if let (Some(local), Some(device)) = (self.local, &self.device) {
            let from = device.addr();
            if local.ip().is_unspecified() && from.is_ipv4() == dst.is_ipv4() {
                self.local = Some(SocketAddr::new(from, local.port()));
            }
        }
        self.peer = Some(dst);
        self.phase = Phase::AddrResolved;
    }

    /// A new id's state: nothing bound, resolved or connected, a fresh
    /// starting PSN.
    fn new() -> IdState {
        IdState {
            phase: Phase::Idle,
            device: None,
            service: None,
            local: None,
            peer: None,
            target: Target::None,
            conn: None,
            listen: None,
            qp: None,
            local_psn: random_psn(),
            offer: None,
            req: None,
            established_param: EventParam::None,
            rtr: None,
            attached_hw_addr: None,
        }
    }
}

pub(crate) struct IdCore {
    space: PortSpace,
    /// The program's word for the id (the C library keeps its
    /// `rdma_cm_id` pointer here).
    user_data: std::sync::atomic::AtomicU64,
    /// Where its events go. Weak: the program's channel handle keeps the
    /// channel alive, not its ids (events in a channel hold their ids: a
    /// strong link back would keep both alive for ever).
    channel: Mutex<Weak<ChannelCore>>,
    st: Mutex<IdState>,
    me: Weak<IdCore>,
}

/// A connection manager id (`struct rdma_cm_id`). Clones share it; when
/// the last goes (events hold it too), its connection is torn down on the
/// wire (DREQ or REJ, as its state asks) and its port freed.
#[derive(Clone)]
pub struct CmId {
    core: Arc<IdCore>,
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.core.lock();
        f.debug_struct("CmId")
            .field("space", &self.core.space)
            .field("phase", &st.phase)
            .field("local", &st.local)
            .field("peer", &st.peer)
            .finish_non_exhaustive()
    }
}

impl PartialEq for CmId {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.core, &other.core)
    }
}

impl Eq for CmId {}

fn cm_error(verb: Verb, e: CmError) -> Error {
    Error::new(verb, ErrorKind::from_errno(e.errno()), e.to_string())
}

fn einval(verb: Verb, what: impl Into<String>) -> Error {
    Error::new(verb, ErrorKind::InvalidArgument, what)
}

/// Whether `ip` is this host's: loopback, unspecified, or on one of its
/// interfaces (in this network namespace).
fn is_local(ip: IpAddr) -> bool {
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    nix::ifaddrs::getifaddrs().is_ok_and(|mut addrs| {
        addrs.any(|a| {
            a.address.is_some_and(|s| {
                s.as_sockaddr_in().map(|v4| IpAddr::V4(v4.ip())) == Some(ip)
                    || s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())) == Some(ip)
            })
        })
    })
}

/// The device for local address `ip` (unspecified or not a device's: the
/// first device).
fn device_for(verb: Verb, ip: Option<IpAddr>) -> Result<Device> {
    let devices = crate::verbs::device::devices()?;
    if let Some(ip) = ip {
        if let Some(d) = devices.iter().find(|d| d.addr() == ip) {
            return Ok(d.clone());
        }
        if !is_local(ip) {
            return Err(Error::new(
                verb,
                ErrorKind::AddrNotAvailable,
                format!("no rverbs device has the address {ip} (see RVERBS_ADDR)"),
            ));
        }
    }
    devices
        .into_iter()
        .next()
        .ok_or_else(|| Error::new(verb, ErrorKind::NoDevice, "no rverbs device"))
}

fn random_psn() -> u32 {
    random_u32() & 0x00ff_ffff
}

impl CmId {
    /// A new id whose events go to `channel` (`rdma_create_id`).
    pub fn new(channel: &EventChannel, space: PortSpace) -> Result<CmId> {
        Ok(CmId::with_state(
            Arc::downgrade(&channel.core),
            space,
            IdState::new(),
        ))
    }

    fn with_state(channel: Weak<ChannelCore>, space: PortSpace, st: IdState) -> CmId {
        CmId {
            core: Arc::new_cyclic(|me| IdCore {
                space,
                user_data: std::sync::atomic::AtomicU64::new(0),
                channel: Mutex::new(channel),
                st: Mutex::new(st),
                me: me.clone(),
            }),
        }
    }

    /// The program's word for the id (0 until set; a new id a connection
    /// request brings starts at 0).
    pub fn user_data(&self) -> u64 {
        self.core
            .user_data
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Sets [`user_data`](Self::user_data).
    pub fn set_user_data(&self, value: u64) {
        self.core
            .user_data
            .store(value, std::sync::atomic::Ordering::Release);
    }

    /// Its port space.
    pub fn port_space(&self) -> PortSpace {
        self.core.space
    }

    /// The device it is bound to (after bind, resolve or a request).
    pub fn device(&self) -> Option<Device> {
        self.core.lock().device.clone()
    }

    /// The path MTU its connections use: its device's port's active MTU.
    pub fn path_mtu(&self) -> Option<Mtu> {
        self.core
            .lock()
            .device
            .as_ref()
            .map(|d| d.core.port.active_mtu)
    }

    /// Its local address and port.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.core.lock().local
    }

    /// Whether a connection is up or on its way (connect or accept sent,
    /// or established): a [`disconnect`](Self::disconnect) then ends in a
    /// DISCONNECTED event. After that event, or before any connection,
    /// none comes.
    pub fn is_connected(&self) -> bool {
        matches!(
            self.core.lock().phase,
            Phase::Established | Phase::Accepting | Phase::Connecting
        )
    }

    /// The peer's address and port.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.core.lock().peer
    }

    /// The GID of the peer's device (after resolving, or on a request).
    pub fn peer_gid(&self) -> Option<Gid> {
        match self.core.lock().target {
            Target::Device(ip) => Some(Gid::from_ip(ip)),
            Target::None | Target::NoListener => None,
        }
    }

    /// Readies a QP for this id as `rdma_create_qp` does: INIT (with
    /// remote READ, WRITE and atomic access) for a connection, RTS with
    /// rdma_cm's Q_Key ([`RDMA_UDP_QKEY`]) for a UD id — so receive WRs may
    /// be posted before [`connect`](Self::connect) or
    /// [`accept`](Self::accept) bring it the rest of the way. A QP past
    /// RESET is left as it is.
    pub fn prepare_qp(&self, qp: &QueuePair) -> Result<()> {
        prepare_qp(Verb::ModifyQp, qp, self.core.space)
    }

    /// The attributes (and mask) that bring a QP of `qp_type` to `state`
    /// for this id (`rdma_init_qp_attr`), for a program that moves its QP
    /// itself: INIT at any time; RTR and RTS once the peer's request or
    /// response is known (EINVAL before).
    pub fn init_qp_attr(&self, qp_type: QpType, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        let verb = Verb::ModifyQp;
        let ud = qp_type == QpType::Ud;
        match state {
            QpState::Init => Ok(init_attr(ud)),
            QpState::Rtr | QpState::Rts if ud => Ok((
                QpAttr {
                    qp_state: state,
                    sq_psn: self.core.lock().local_psn,
                    ..QpAttr::default()
                },
                if state == QpState::Rts {
                    QpAttrMask::STATE | QpAttrMask::SQ_PSN
                } else {
                    QpAttrMask::STATE
                },
            )),
            QpState::Rtr | QpState::Rts => {
                let rtr = self.core.lock().rtr.ok_or_else(|| {
                    einval(verb, "the peer's request or response is not known yet")
                })?;
                let [rtr_pair, rts_pair] = rtr_attrs(qp_type, &rtr);
                Ok(if state == QpState::Rtr {
                    rtr_pair
                } else {
                    rts_pair
                })
            }
            other => Err(einval(
                verb,
                format!(
                    "rdma_init_qp_attr takes INIT, RTR or RTS, not {}",
                    other.name()
                ),
            )),
        }
    }

    /// Sends its future events to `channel` (`rdma_migrate_id`).
    pub fn migrate(&self, channel: &EventChannel) {
        let old = std::mem::replace(
            &mut *self.core.channel.lock().unwrap_or_else(|p| p.into_inner()),
            Arc::downgrade(&channel.core),
        );
        // Its events not yet read move along, in order.
        if let Some(old) = old.upgrade() {
            if !Arc::ptr_eq(&old, &channel.core) {
                for event in old.take_events_of(self) {
                    channel.core.push(event);
                }
            }
        }
    }

    /// Binds the id to a local address and port (`rdma_bind_addr`): the
    /// address of a device, this host's (loopback, unspecified: the
    /// default device), port 0 for any free one. EADDRNOTAVAIL for an
    /// address no device has.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let verb = Verb::BindAddr;
        let mut st = self.core.lock();
        if st.phase != Phase::Idle {
            return Err(einval(verb, "the id is bound already"));
        }
        let device = device_for(verb, Some(addr.ip()))?;
        let port = if addr.port() == 0 {
            ephemeral_port()
        } else {
            addr.port()
        };
        st.device = Some(device);
        st.local = Some(SocketAddr::new(addr.ip(), port));
        st.phase = Phase::Bound;
        if !addr.ip().is_unspecified() {
            self.core.attach(&mut st);
        }
        Ok(())
    }

    /// Resolves the peer's address (`rdma_resolve_addr`) within
    /// [`RESOLVE_TIMEOUT`]: see [`resolve_addr_timeout`](Self::resolve_addr_timeout).
    pub fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr) -> Result<()> {
        self.resolve_addr_timeout(src, dst, RESOLVE_TIMEOUT)
    }

    /// Resolves the peer's address (`rdma_resolve_addr` with `timeout`):
    /// binds the id if it is not (to `src`, or any address) and finds
    /// where the peer's connection manager is; the outcome comes on the
    /// channel, as the kernel's rdma_cm reports it.
    ///
    /// A local destination (loopback, one of this host's addresses)
    /// resolves at once through the rendezvous: ADDR_RESOLVED is queued
    /// before this returns. Another host's goes by its route's next hop,
    /// whose neighbour (ARP, IPv6 ND) must be valid: if it is (or the
    /// route needs none), ADDR_RESOLVED is queued before this returns;
    /// if not, the kernel is made to resolve it and this returns at once,
    /// the id resolving in the background — ADDR_RESOLVED when the
    /// neighbour is valid, or ADDR_ERROR with status `-ETIMEDOUT` if it is
    /// not within `timeout` (the id is then bound, as before, and may
    /// resolve again). Without a route there the call fails at once
    /// (ENETUNREACH, or the route's error). EINVAL while a resolution is
    /// pending, or for a listening or connected id.
    pub fn resolve_addr_timeout(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: std::time::Duration,
    ) -> Result<()> {
        let verb = Verb::ResolveAddr;
        if self.core.lock().phase == Phase::Idle {
            let any = SocketAddr::new(
                match dst.ip() {
                    IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                    IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                },
                0,
            );
            self.bind_addr(src.unwrap_or(any))?;
        }
        let mut st = self.core.lock();
        if !matches!(
            st.phase,
            Phase::Bound | Phase::AddrResolved | Phase::RouteResolved
        ) {
            return Err(einval(verb, "the id is listening or connected"));
        }
        let resolving = |e: std::io::Error| Error::from_io(verb, &e, &format!("resolving {dst}"));
        let target = if is_local(dst.ip()) {
            local_target(self.core.space, dst).map_err(resolving)?
        } else {
            let waiter: Weak<IdCore> = self.core.me.clone();
            match neigh::resolve(dst.ip(), timeout, waiter).map_err(resolving)? {
                Resolution::Now => Target::Device(dst.ip()),
                Resolution::Later => {
                    // The kernel's rdma_cm knows the destination from the
                    // call on (`rdma_get_peer_addr`), the device's GID once
                    // resolved.
                    st.peer = Some(dst);
                    st.target = Target::None;
                    st.phase = Phase::AddrQuery;
                    return Ok(());
                }
            }
        };
        st.resolved(target, dst);
        self.core.attach(&mut st);
        drop(st);
        self.core
            .report(self.clone(), CmEventKind::AddrResolved, 0, EventParam::None);
        Ok(())
    }

    /// Resolves the route to the peer (`rdma_resolve_route`): on RoCE the
    /// address is the route; reports ROUTE_RESOLVED.
    pub fn resolve_route(&self) -> Result<()> {
        let mut st = self.core.lock();
        if st.phase != Phase::AddrResolved {
            return Err(einval(
                Verb::ResolveRoute,
                "resolve the address first (rdma_resolve_addr)",
            ));
        }
        st.phase = Phase::RouteResolved;
        drop(st);
        self.core.report(
            self.clone(),
            CmEventKind::RouteResolved,
            0,
            EventParam::None,
        );
        Ok(())
    }

    /// Listens for connection requests (`rdma_listen`); binds to any
    /// address and a free port first if the id is not bound. EADDRINUSE
    /// if another listener (any process in this network namespace) has
    /// the port. `backlog` ≤ 0: the most.
    pub fn listen(&self, backlog: i32) -> Result<()> {
        let verb = Verb::Listen;
        if self.core.lock().phase == Phase::Idle {
            self.bind_addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))?;
        }
        let mut st = self.core.lock();
        if st.phase != Phase::Bound {
            return Err(einval(verb, "the id is not bound, or already in use"));
        }
        let (device, local) = match (&st.device, st.local) {
            (Some(d), Some(l)) => (d.clone(), l),
            _ => return Err(einval(verb, "the id is not bound")),
        };
        let registration = Registration::new(self.core.space.code(), local.port(), device.addr())
            .map_err(|e| Error::from_io(verb, &e, "the port"))?;
        let service = device.core.cm_service(verb)?;
        let service_id = self.core.space.wire().service_id(local.port());
        let backlog = u32::try_from(backlog).unwrap_or(0);
        let id = service
            .with_agent_for(
                self.core.sink(),
                |&l| Owner::Listen(l),
                |a, _| a.listen(service_id, backlog),
            )
            .map_err(|e| cm_error(verb, e))?;
        st.listen = Some(Listening {
            id,
            _registration: registration,
        });
        st.service = Some(service);
        st.phase = Phase::Listening;
        Ok(())
    }

    /// Connects to the resolved peer (`rdma_connect`). With `qp`, the id
    /// brings it up (INIT now; RTR and RTS when the peer accepts, then the
    /// RTU, then ESTABLISHED); without, the program gets CONNECT_RESPONSE
    /// and calls [`establish`](Self::establish). UD ids resolve the
    /// peer's QP (SIDR): ESTABLISHED carries it. A connect to a port of
    /// this host that nobody listens on waits up to 100 ms for a listener
    /// (programs race their listen against their peer's connect), then
    /// the id gets REJECTED (status 8, invalid service ID).
    pub fn connect(&self, qp: Option<&QueuePair>, param: &ConnParam) -> Result<()> {
        let verb = Verb::RdmaConnect;
        let mut st = self.core.lock();
        if st.phase != Phase::RouteResolved {
            return Err(einval(verb, "resolve the route first (rdma_resolve_route)"));
        }
        let space = self.core.space;
        let limit = if space.is_ud() {
            SIDR_REQ_USER_DATA
        } else {
            REQ_USER_DATA
        };
        let room = if space.has_ip_header() {
            limit
        } else {
            limit + IP_CM_HDR
        };
        if param.private_data.len() > room {
            return Err(einval(
                verb,
                format!(
                    "{} bytes of private data; a connect carries at most {room}",
                    param.private_data.len()
                ),
            ));
        }
        let (device, local, peer) = match (&st.device, st.local, st.peer) {
            (Some(d), Some(l), Some(p)) => (d.clone(), l, p),
            _ => return Err(einval(verb, "the id is not resolved")),
        };
        // A listener may have come (or gone) since the address was resolved.
        st.target = connect_target(space, peer)
            .map_err(|e| Error::from_io(verb, &e, "the local rendezvous"))?;
        let service = device.core.cm_service(verb)?;
        let mut private_data = Vec::with_capacity(IP_CM_HDR + param.private_data.len());
        if space.has_ip_header() {
            let src = if local.ip().is_unspecified() {
                device.addr()
            } else {
                local.ip()
            };
            ip_cm_header(&mut private_data, local.port(), src, peer.ip());
        }
        private_data.extend_from_slice(&param.private_data);
        let service_id = space.wire().service_id(peer.port());
        let target = match st.target {
            Target::Device(ip) => ip,
            Target::None => return Err(einval(verb, "the id is not resolved")),
            Target::NoListener => {
                st.phase = Phase::Failed;
                drop(st);
                let (kind, status) = if space.is_ud() {
                    (
                        CmEventKind::Unreachable,
                        i32::from(SidrStatus::Unsupported.code()),
                    )
                } else {
                    (CmEventKind::Rejected, 8)
                };
                self.core
                    .report(self.clone(), kind, status, EventParam::None);
                return Ok(());
            }
        };
        if let Some(qp) = qp {
            prepare_qp(verb, qp, space)?;
            st.qp = Some(qp.view());
        }
        let qp_num = qp.map_or(param.qp_num, QueuePair::qp_num);
        // The id takes the connection's events from before its REQ
        // leaves: the answer may beat this thread back.
        let sink = self.core.sink();
        let owner = |&c: &ConnId| Owner::Conn(c);
        let conn = if space.is_ud() {
            service
                .with_agent_for(sink, owner, |a, now| {
                    a.sidr_request(
                        now,
                        Gid::from_ip(target),
                        service_id,
                        0xffff,
                        &private_data,
                        SIDR_TIMEOUT,
                        15,
                    )
                })
                .map_err(|e| cm_error(verb, e))?
        } else {
            let srq = qp.map_or(param.srq, |q| q.core.srq.is_some());
            let transport = match qp.map(QueuePair::qp_type) {
                Some(QpType::Uc) => CmTransport::Uc,
                _ => CmTransport::Rc,
            };
            let mut p = ConnectParams::rdma_cm_defaults(
                Gid::from_ip(target),
                service_id,
                qp_num,
                st.local_psn,
            );
            p.transport = transport;
            let max = device.core.attr.max_qp_rd_atom;
            p.responder_resources = depth(verb, param.responder_resources, max, max)?;
            p.initiator_depth = depth(verb, param.initiator_depth, max, max)?;
            p.retry_count = param.retry_count.min(7);
            p.rnr_retry_count = param.rnr_retry_count.min(7);
            p.path_mtu = device.core.port.active_mtu;
            p.srq = srq;
            p.flow_control = param.flow_control;
            p.local_ack_timeout = LOCAL_ACK_TIMEOUT;
            p.flow_label = flow_label(local.port(), peer.port());
            p.private_data = private_data;
            service
                .with_agent_for(sink, owner, |a, now| a.connect(now, p))
                .map_err(|e| cm_error(verb, e))?
        };
        st.conn = Some(conn);
        st.offer = Some(param.clone());
        st.service = Some(service);
        st.phase = Phase::Connecting;
        Ok(())
    }

    /// Accepts a connection request (`rdma_accept`, on the id a
    /// CONNECT_REQUEST event brought). With `qp`, the id brings it to RTS
    /// before its REP goes (ESTABLISHED follows the peer's RTU); UD ids
    /// answer with the QP's number and rdma_cm's Q_Key.
    pub fn accept(&self, qp: Option<&QueuePair>, param: &ConnParam) -> Result<()> {
        let verb = Verb::Accept;
        let mut st = self.core.lock();
        if st.phase != Phase::Requested {
            return Err(einval(verb, "the id has no connection request to accept"));
        }
        if param.private_data.len() > 196 {
            return Err(einval(
                verb,
                "an accept carries at most 196 bytes of private data",
            ));
        }
        let (Some(conn), Some(service)) = (st.conn, st.service.clone()) else {
            return Err(einval(verb, "the id has no connection request to accept"));
        };
        let qp_num = qp.map_or(param.qp_num, QueuePair::qp_num);
        if self.core.space.is_ud() {
            if let Some(qp) = qp {
                prepare_qp(verb, qp, self.core.space)?;
            }
            service
                .with_agent(|a, now| {
                    a.sidr_reply(
                        now,
                        conn,
                        SidrStatus::Success,
                        qp_num,
                        RDMA_UDP_QKEY,
                        &param.private_data,
                    )
                })
                .map_err(|e| cm_error(verb, e))?;
            st.phase = Phase::Established;
            return Ok(());
        }
        let max = st.device.as_ref().map_or(0, |d| d.core.attr.max_qp_rd_atom);
        // RDMA_MAX_*: what the request offered, as far as the device goes.
        let (offered_rr, offered_id) = st.rtr.map_or((max, max), |r| {
            (u32::from(r.max_dest_rd_atomic), u32::from(r.max_rd_atomic))
        });
        let responder_resources = depth(verb, param.responder_resources, offered_rr.min(max), max)?;
        let initiator_depth = depth(verb, param.initiator_depth, offered_id.min(max), max)?;
        if let Some(rtr) = st.rtr.as_mut() {
            rtr.max_dest_rd_atomic = responder_resources;
            rtr.max_rd_atomic = initiator_depth;
        }
        if let Some(qp) = qp {
            prepare_qp(verb, qp, self.core.space)?;
            let Some(rtr) = st.rtr else {
                return Err(einval(verb, "the id has no connection request to accept"));
            };
            bring_up(verb, qp, &rtr)?;
            st.qp = Some(qp.view());
        }
        let srq = qp.map_or(param.srq, |q| q.core.srq.is_some());
        let accept = AcceptParams {
            local_qpn: qp_num,
            starting_psn: st.local_psn,
            responder_resources,
            initiator_depth,
            rnr_retry_count: param.rnr_retry_count.min(7),
            target_ack_delay: TARGET_ACK_DELAY,
            srq,
            flow_control: param.flow_control,
            private_data: param.private_data.clone(),
        };
        service
            .with_agent(|a, now| a.accept(now, conn, accept))
            .map_err(|e| cm_error(verb, e))?;
        st.established_param = EventParam::Conn(ConnEventParam::default());
        st.phase = Phase::Accepting;
        Ok(())
    }

    /// Rejects a connection request (`rdma_reject`) with private data (at
    /// most 148 bytes): the peer gets REJECTED, reason 28 ("consumer
    /// defined"). UD: the peer gets UNREACHABLE.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let verb = Verb::Reject;
        let mut st = self.core.lock();
        let (Some(conn), Some(service)) = (st.conn, st.service.clone()) else {
            return Err(einval(verb, "the id has no connection to reject"));
        };
        if !matches!(st.phase, Phase::Requested | Phase::Connecting) {
            return Err(einval(verb, "the id has no connection to reject"));
        }
        if self.core.space.is_ud() {
            service
                .with_agent(|a, now| {
                    a.sidr_reply(now, conn, SidrStatus::Reject, 0, 0, private_data)
                })
                .map_err(|e| cm_error(verb, e))?;
        } else {
            service
                .with_agent(|a, now| a.reject(now, conn, private_data))
                .map_err(|e| cm_error(verb, e))?;
        }
        st.phase = Phase::Failed;
        Ok(())
    }

    /// Disconnects (`rdma_disconnect`): the QP the id brought up goes to
    /// ERR (its work flushes), a DREQ goes to the peer; DISCONNECTED
    /// follows. On an id whose connection is over already — the peer hung
    /// up first, or it was rejected — it only moves the QP to ERR and
    /// succeeds, as the kernel's does (both sides of a program often hang
    /// up at once).
    pub fn disconnect(&self) -> Result<()> {
        let verb = Verb::Disconnect;
        let st = self.core.lock();
        if matches!(st.phase, Phase::Disconnected | Phase::Failed) {
            if let Some(qp) = &st.qp {
                to_error(qp);
            }
            return Ok(());
        }
        let (Some(conn), Some(service)) = (st.conn, st.service.clone()) else {
            return Err(einval(verb, "the id is not connected"));
        };
        if !matches!(
            st.phase,
            Phase::Established | Phase::Accepting | Phase::Connecting
        ) {
            return Err(einval(verb, "the id is not connected"));
        }
        if let Some(qp) = &st.qp {
            to_error(qp);
        }
        service
            .with_agent(|a, now| a.disconnect(now, conn, &[]))
            .map_err(|e| cm_error(verb, e))
    }

    /// Joins the IP multicast group `group` (`rdma_join_multicast`): on
    /// RoCE the group's GID is its IP address (IPv4-mapped), and joining
    /// needs no exchange — `qp` (a UD QP, if given) is attached to it now,
    /// and MULTICAST_JOIN reports what sending to the group takes: the
    /// group's GID, QP number 0xFFFFFF and rdma_cm's Q_Key. A send-only
    /// member (`send_only`) is not attached. The id must have its device
    /// (bind or resolve first): EINVAL otherwise, and for an address that
    /// is not multicast.
    pub fn join_multicast(
        &self,
        group: IpAddr,
        qp: Option<&QueuePair>,
        send_only: bool,
    ) -> Result<()> {
        let verb = Verb::JoinMulticast;
        if !group.is_multicast() {
            return Err(einval(verb, format!("{group} is not a multicast address")));
        }
        if self.core.lock().device.is_none() {
            return Err(einval(verb, "bind or resolve the id first"));
        }
        let mgid = Gid::from_ip(group);
        if let (Some(qp), false) = (qp, send_only) {
            qp.attach_mcast(mgid, 0)?;
        }
        self.core.report(
            self.clone(),
            CmEventKind::MulticastJoin,
            0,
            EventParam::Ud(UdParam {
                private_data: Vec::new(),
                remote_gid: mgid,
                qp_num: MULTICAST_QPN,
                qkey: RDMA_UDP_QKEY,
            }),
        );
        Ok(())
    }

    /// Leaves `group` (`rdma_leave_multicast`): `qp` is detached from it.
    pub fn leave_multicast(&self, group: IpAddr, qp: Option<&QueuePair>) -> Result<()> {
        if !group.is_multicast() {
            return Err(einval(
                Verb::LeaveMulticast,
                format!("{group} is not a multicast address"),
            ));
        }
        match qp {
            Some(qp) => qp.detach_mcast(Gid::from_ip(group), 0),
            None => Ok(()),
        }
    }

    /// Says the connection is up (`rdma_establish`): on the active side
    /// after CONNECT_RESPONSE when the program brought its QP up itself
    /// (the RTU goes, ESTABLISHED follows); on the passive side when data
    /// came before the RTU.
    pub fn establish(&self) -> Result<()> {
        let verb = Verb::Establish;
        let st = self.core.lock();
        let (Some(conn), Some(service)) = (st.conn, st.service.clone()) else {
            return Err(einval(verb, "the id is not connecting"));
        };
        service
            .with_agent(|a, now| a.establish(now, conn, &[]))
            .map_err(|e| cm_error(verb, e))
    }
}

impl IdCore {
    fn lock(&self) -> MutexGuard<'_, IdState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Attaches the id to its device, once: it records the interface's
    /// hardware address and hears of the interface's bonding failovers.
    fn attach(&self, st: &mut IdState) {
        if st.attached_hw_addr.is_some() {
            return;
        }
        let Some(device) = &st.device else { return };
        st.attached_hw_addr = Some(device.core.hw_addr());
        let me: Weak<IdCore> = self.me.clone();
        device.core.watch_failovers(me);
    }

    fn sink(&self) -> Weak<dyn CmSink> {
        let me: Weak<IdCore> = self.me.clone();
        me
    }

    fn channel_weak(&self) -> Weak<ChannelCore> {
        self.channel
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The id's channel, unless the program dropped it.
    fn channel(&self) -> Option<Arc<ChannelCore>> {
        self.channel_weak().upgrade()
    }

    /// Queues an event about `id` on the id's channel (nowhere, if the
    /// program dropped its channel).
    fn report(&self, id: CmId, kind: CmEventKind, status: i32, param: EventParam) {
        let Some(channel) = self.channel() else {
            return;
        };
        channel.push(CmEvent {
            id,
            listen_id: None,
            kind,
            status,
            param,
            peer: None,
        });
    }

    fn handle(&self) -> Option<CmId> {
        self.me.upgrade().map(|core| CmId { core })
    }

    /// A connection request on this listener: a new id for it, reported.
    /// A connection request (or, `sidr` given, a UD resolution request with
    /// its private data) on this listener: a new id for it, reported.
    fn on_request(
        &self,
        service: &CmService,
        conn: ConnId,
        peer: Gid,
        req: Box<Req>,
        sidr: Option<&[u8]>,
    ) {
        let Some(listener) = self.handle() else {
            return;
        };
        let space = self.space;
        let pd = sidr.unwrap_or(req.private_data.as_slice());
        let (hdr, user) = if space.has_ip_header() {
            let hdr = pd
                .get(..IP_CM_HDR)
                .and_then(|h| IpCmHdrRepr::parse(&IpCmHdr::new_unchecked(h)).ok());
            (hdr, pd.get(IP_CM_HDR..).unwrap_or(&[]))
        } else {
            (None, pd)
        };
        if space.has_ip_header() && hdr.is_none() {
            // Not from rdma_cm: no addresses to report. Refuse it.
            let _ = service.with_agent(|a, now| a.reject(now, conn, &[]));
            return;
        }
        let (device, local) = {
            let st = self.lock();
            (st.device.clone(), st.local)
        };
        let port = local.map_or(0, |l| l.port());
        let local = hdr.map(|h| SocketAddr::new(h.dst, port)).or(local);
        let peer_addr = hdr.map(|h| SocketAddr::new(h.src, h.src_port));
        let Some(channel) = self.channel() else {
            // Nobody will read the request: refuse it now.
            let _ = service.with_agent(|a, now| a.reject(now, conn, &[]));
            return;
        };
        let id = CmId::with_state(
            Arc::downgrade(&channel),
            space,
            IdState {
                phase: Phase::Requested,
                device,
                service: Some(service.clone()),
                local,
                peer: peer_addr,
                target: Target::Device(peer.to_ip()),
                conn: Some(conn),
                ..IdState::new()
            },
        );
        service.set_sink(Owner::Conn(conn), id.core.sink());
        let param = match sidr {
            Some(_) => EventParam::Ud(UdParam {
                private_data: user.to_vec(),
                remote_gid: peer,
                qp_num: 0,
                qkey: 0,
            }),
            None => EventParam::Conn(ConnEventParam {
                private_data: user.to_vec(),
                responder_resources: req.initiator_depth,
                initiator_depth: req.responder_resources,
                flow_control: req.flow_control,
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
                srq: req.srq,
                qp_num: req.local_qpn,
            }),
        };
        {
            let mut st = id.core.lock();
            id.core.attach(&mut st);
            let port_mtu = st
                .device
                .as_ref()
                .map_or(Mtu::Mtu1024, |d| d.core.port.active_mtu);
            st.rtr = Some(Rtr::passive(&req, st.local_psn, port_mtu, peer));
            st.req = Some(req);
        }
        channel.push(CmEvent {
            id,
            listen_id: Some(listener),
            kind: CmEventKind::ConnectRequest,
            status: 0,
            param,
            peer: peer_addr,
        });
    }

    /// The peer accepted this side's REQ.
    fn on_response(&self, service: &CmService, conn: ConnId, response: &ConnectResponse) {
        let Some(id) = self.handle() else { return };
        let param = ConnEventParam {
            private_data: response.private_data.as_slice().to_vec(),
            responder_resources: response.responder_resources,
            initiator_depth: response.initiator_depth,
            flow_control: response.flow_control,
            retry_count: 0,
            rnr_retry_count: response.rnr_retry_count,
            srq: response.srq,
            qp_num: response.remote_qpn,
        };
        let mut st = self.lock();
        let offer = st.offer.clone().unwrap_or_default();
        let peer = match st.target {
            Target::Device(ip) => Gid::from_ip(ip),
            _ => Gid::ZERO,
        };
        let mtu = st
            .device
            .as_ref()
            .map_or(Mtu::Mtu1024, |d| d.core.port.active_mtu);
        let rtr = Rtr::active(response, &offer, st.local_psn, mtu, peer);
        st.rtr = Some(rtr);
        let Some(qp) = st.qp.as_ref() else {
            // The program brings its QP up and calls establish.
            st.established_param = EventParam::Conn(param.clone());
            drop(st);
            self.report(id, CmEventKind::ConnectResponse, 0, EventParam::Conn(param));
            return;
        };
        let up = bring_up(Verb::RdmaConnect, qp, &rtr);
        match up {
            Ok(()) => {
                st.established_param = EventParam::Conn(param);
                drop(st);
                let _ = service.with_agent(|a, now| a.establish(now, conn, &[]));
            }
            Err(e) => {
                st.phase = Phase::Failed;
                drop(st);
                tracing::debug!("rdma_connect: bringing the QP up failed: {e}");
                let _ = service.with_agent(|a, now| a.reject(now, conn, &[]));
                self.report(id, CmEventKind::ConnectError, -e.errno(), EventParam::None);
            }
        }
    }
}

impl NeighbourWaiter for IdCore {
    /// The background resolution `resolve_addr` started is over:
    /// ADDR_RESOLVED, or ADDR_ERROR with the kernel's status (the id is
    /// bound again, as the kernel's goes back to ADDR_BOUND).
    fn neighbour_resolved(&self, result: std::result::Result<(), nix::errno::Errno>) {
        let Some(id) = self.handle() else { return };
        let mut st = self.lock();
        if st.phase != Phase::AddrQuery {
            return;
        }
        let Some(dst) = st.peer else { return };
        let (kind, status) = match result {
            Ok(()) => {
                st.resolved(Target::Device(dst.ip()), dst);
                self.attach(&mut st);
                (CmEventKind::AddrResolved, 0)
            }
            Err(e) => {
                st.phase = Phase::Bound;
                (CmEventKind::AddrError, -(e as i32))
            }
        };
        drop(st);
        self.report(id, kind, status, EventParam::None);
    }
}

impl FailoverWatcher for IdCore {
    /// ADDR_CHANGE if the bond's hardware address is not the one the id
    /// was attached with (`cma_netdev_change`).
    fn bonding_failover(&self, hw_addr: &[u8]) {
        let Some(id) = self.handle() else { return };
        let changed = self
            .lock()
            .attached_hw_addr
            .as_deref()
            .is_some_and(|was| was != hw_addr);
        if changed {
            self.report(id, CmEventKind::AddrChange, 0, EventParam::None);
        }
    }
}

impl CmSink for IdCore {
    fn on_device_removal(&self) {
        let Some(id) = self.handle() else { return };
        let mut st = self.lock();
        st.phase = Phase::Failed;
        st.attached_hw_addr = None;
        if let Some(qp) = &st.qp {
            to_error(qp);
        }
        drop(st);
        self.report(id, CmEventKind::DeviceRemoval, 0, EventParam::None);
    }

    fn on_event(&self, service: &CmService, event: AgentEvent) {
        match event {
            AgentEvent::ConnectRequest {
                conn, peer, req, ..
            } => {
                self.on_request(service, conn, peer, req, None);
            }
            AgentEvent::SidrRequest {
                conn,
                peer,
                private_data,
                ..
            } => {
                let req = Box::new(sidr_as_req());
                self.on_request(service, conn, peer, req, Some(private_data.as_slice()));
            }
            AgentEvent::ConnectResponse { conn, response } => {
                self.on_response(service, conn, &response);
            }
            AgentEvent::Established { .. } => {
                let Some(id) = self.handle() else { return };
                let mut st = self.lock();
                st.phase = Phase::Established;
                let param = std::mem::replace(&mut st.established_param, EventParam::None);
                drop(st);
                self.report(id, CmEventKind::Established, 0, param);
            }
            AgentEvent::Rejected {
                reason,
                private_data,
                ..
            } => {
                let Some(id) = self.handle() else { return };
                self.lock().phase = Phase::Failed;
                let param = EventParam::Conn(ConnEventParam {
                    private_data: private_data.as_slice().to_vec(),
                    ..ConnEventParam::default()
                });
                self.report(id, CmEventKind::Rejected, i32::from(reason.code()), param);
            }
            AgentEvent::Unreachable { .. } => {
                let Some(id) = self.handle() else { return };
                self.lock().phase = Phase::Failed;
                self.report(
                    id,
                    CmEventKind::Unreachable,
                    -(nix::errno::Errno::ETIMEDOUT as i32),
                    EventParam::None,
                );
            }
            AgentEvent::Disconnected { .. } => {
                let Some(id) = self.handle() else { return };
                let mut st = self.lock();
                st.phase = Phase::Disconnected;
                if let Some(qp) = &st.qp {
                    to_error(qp);
                }
                // Queued under the id's lock: whoever sees the id
                // disconnected (a synchronous rdma_disconnect deciding
                // whether an event will come) finds the event there too.
                // (The channel's locks never take an id's.)
                self.report(id, CmEventKind::Disconnected, 0, EventParam::None);
                drop(st);
            }
            AgentEvent::TimewaitExit { .. } => {
                let Some(id) = self.handle() else { return };
                self.report(id, CmEventKind::TimewaitExit, 0, EventParam::None);
            }
            AgentEvent::SidrReply {
                status,
                qpn,
                qkey,
                private_data,
                ..
            } => {
                let Some(id) = self.handle() else { return };
                let mut st = self.lock();
                let remote_gid = match st.target {
                    Target::Device(ip) => Gid::from_ip(ip),
                    _ => Gid::ZERO,
                };
                if status == SidrStatus::Success {
                    st.phase = Phase::Established;
                    drop(st);
                    let param = EventParam::Ud(UdParam {
                        private_data: private_data.as_slice().to_vec(),
                        remote_gid,
                        qp_num: qpn,
                        qkey,
                    });
                    self.report(id, CmEventKind::Established, 0, param);
                } else {
                    st.phase = Phase::Failed;
                    drop(st);
                    self.report(
                        id,
                        CmEventKind::Unreachable,
                        i32::from(status.code()),
                        EventParam::None,
                    );
                }
            }
        }
    }
}

impl Drop for IdCore {
    fn drop(&mut self) {
        let st = self.st.get_mut().unwrap_or_else(|p| p.into_inner());
        let Some(service) = st.service.take() else {
            return;
        };
        if let Some(l) = st.listen.take() {
            service.remove_sink(Owner::Listen(l.id));
            let _ = service.with_agent(|a, _| a.unlisten(l.id));
        }
        if let Some(conn) = st.conn.take() {
            service.remove_sink(Owner::Conn(conn));
            let _ = service.with_agent(|a, now| a.destroy(now, conn));
        }
    }
}

/// The request fields a UD resolution request has none of (its private
/// data goes apart, at its own room).
fn sidr_as_req() -> Req {
    use crate::soft::cm::msg::{CmBytes, PathInfo};
    Req {
        tid: 0,
        local_comm_id: 0,
        service_id: 0,
        local_ca_guid: 0,
        local_qkey: 0,
        local_qpn: 0,
        responder_resources: 0,
        initiator_depth: 0,
        remote_cm_response_timeout: 0,
        transport: CmTransport::Rc,
        flow_control: false,
        starting_psn: 0,
        local_cm_response_timeout: 0,
        retry_count: 0,
        rnr_retry_count: 0,
        max_cm_retries: 0,
        path_mtu: Mtu::Mtu1024,
        pkey: 0xffff,
        srq: false,
        primary: PathInfo {
            local_gid: Gid::ZERO,
            remote_gid: Gid::ZERO,
            flow_label: 0,
            traffic_class: 0,
            hop_limit: 0,
            sl: 0,
            local_ack_timeout: 0,
        },
        private_data: CmBytes::empty(),
    }
}

/// Where the CM of the peer at `dst` is: a local address asks the
/// rendezvous which device listens on the port.
/// Where a connect to `dst` goes now: for another host's address, the
/// address itself (the host must still have a route there: without one
/// the kernel's rdma_cm fails at once, ENETUNREACH); for a local one, the
/// device the rendezvous names.
fn resolve_target(space: PortSpace, dst: SocketAddr) -> std::io::Result<Target> {
    if !is_local(dst.ip()) {
        neigh::check_route(dst.ip())?;
        return Ok(Target::Device(dst.ip()));
    }
    local_target(space, dst)
}

/// How long a connect to a port of this host that nobody listens on waits
/// for a listener before it is rejected. Programs race their own listen
/// against their peer's connect — perftest's `-R` server creates the
/// test's listener just as its client connects, qperf's server sends its
/// port before it listens — and on this host the answer needs no round
/// trip: without the wait, the client that comes first is rejected in
/// microseconds, where a kernel's REQ would still be on its way.
const LISTEN_GRACE: std::time::Duration = std::time::Duration::from_millis(100);
/// How often a connect that waits for a listener looks again.
const LISTEN_RECHECK: std::time::Duration = std::time::Duration::from_millis(1);

/// Where a connect to `dst` goes: as [`resolve_target`], but a local port
/// nobody listens on yet is looked at again for up to [`LISTEN_GRACE`]
/// (the connect waits; a listener that comes gets the request).
fn connect_target(space: PortSpace, dst: SocketAddr) -> std::io::Result<Target> {
    let until = std::time::Instant::now() + LISTEN_GRACE;
    loop {
        let target = resolve_target(space, dst)?;
        if target != Target::NoListener || std::time::Instant::now() >= until {
            return Ok(target);
        }
        std::thread::sleep(LISTEN_RECHECK);
    }
}

/// The device listening on `dst`'s port in this network namespace (the
/// rendezvous), for a local `dst`.
fn local_target(space: PortSpace, dst: SocketAddr) -> std::io::Result<Target> {
    Ok(match rendezvous::lookup(space.code(), dst.port())? {
        Some(ip) => Target::Device(ip),
        None => Target::NoListener,
    })
}

/// A READ/atomic depth a connect or accept offers: [`ConnParam::MAX`]
/// means `or_max` (the device's most, or what the request offered);
/// above the device's most `max` is EINVAL, as librdmacm checks.
fn depth(verb: Verb, asked: u8, or_max: u32, max: u32) -> Result<u8> {
    if asked == ConnParam::MAX {
        return Ok(u8::try_from(or_max).unwrap_or(u8::MAX - 1));
    }
    if u32::from(asked) > max {
        return Err(einval(
            verb,
            format!("{asked} outstanding READs/atomics asked; the device takes at most {max}"),
        ));
    }
    Ok(asked)
}

/// The flow label the kernel's rdma_cm gives a RoCEv2 connection's path,
/// from its ports (seen in its REQs): `(src × 31 + dst) mod 2^20`.
fn flow_label(src_port: u16, dst_port: u16) -> u32 {
    (u32::from(src_port) * 31 + u32::from(dst_port)) & 0x000f_ffff
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soft::cm::codec;
    use crate::soft::cm::msg::CmMessage;

    /// The kernel's rping REQ (soft/cm/testdata): a whole IPv4 packet; the
    /// MAD follows the IPv4, UDP, BTH and DETH headers.
    fn kernel_rping_req() -> Box<Req> {
        let pkt: &[u8] = include_bytes!("../soft/cm/testdata/kernel-rping-req.bin");
        match codec::decode(&pkt[48..48 + 256]) {
            Ok(CmMessage::Req(req)) => req,
            other => panic!("not a REQ: {other:?}"),
        }
    }

    #[test]
    fn the_passive_side_sends_from_the_reqs_starting_psn() {
        // A REQ's (and a REP's) starting PSN is the PSN its sender's QP
        // expects first: the kernel's CM makes the REQ's the passive
        // side's sq_psn (and rdma_cm its own rq_psn), the REP's the
        // passive side's rq_psn.
        let req = kernel_rping_req();
        assert_eq!(req.starting_psn, 0x3b_2e27);
        let in_our_rep = 0x12_3456;
        let rtr = Rtr::passive(&req, in_our_rep, Mtu::Mtu4096, Gid::ZERO);
        assert_eq!(
            (rtr.sq_psn, rtr.rq_psn),
            (0x3b_2e27, in_our_rep),
            "(sq_psn, rq_psn)"
        );
    }

    #[test]
    fn the_active_side_sends_from_the_reps_starting_psn() {
        let in_our_req = 0x12_3456;
        let response = ConnectResponse {
            remote_qpn: 0x11,
            remote_starting_psn: 0x3b_2e27,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            target_ack_delay: 15,
            srq: false,
            flow_control: false,
            remote_ca_guid: 0x5054_00ff_fe7e_0002,
            private_data: Default::default(),
        };
        let offer = ConnParam::default();
        let rtr = Rtr::active(&response, &offer, in_our_req, Mtu::Mtu4096, Gid::ZERO);
        assert_eq!(
            (rtr.sq_psn, rtr.rq_psn),
            (0x3b_2e27, in_our_req),
            "(sq_psn, rq_psn)"
        );
    }

    #[test]
    fn the_flow_label_is_the_kernels() {
        // The kernel's rping REQ (soft/cm/testdata): source port 0xbddc,
        // port 7174, flow label 0x719aa.
        assert_eq!(super::flow_label(0xbddc, 7174), 0x719aa);
        assert_eq!(
            super::flow_label(u16::MAX, u16::MAX),
            (65535 * 32) & 0xfffff
        );
    }

    #[test]
    fn a_bonding_failover_to_another_address_reaches_the_attached_ids() {
        use crate::soft::link::{LinkNotice, Notices};
        // A device of its own: no other test's ids are attached to it.
        let dev = crate::add_device(crate::DeviceConfig::loopback().named("cm-failover")).unwrap();
        let ch = EventChannel::new().unwrap();
        let bound = CmId::new(&ch, PortSpace::Tcp).unwrap();
        bound.bind_addr(SocketAddr::new(dev.addr(), 0)).unwrap();
        let resolved = CmId::new(&ch, PortSpace::Udp).unwrap();
        resolved
            .resolve_addr(
                Some(SocketAddr::new(dev.addr(), 0)),
                SocketAddr::new(dev.addr(), 9),
            )
            .unwrap();
        assert_eq!(ch.try_get_event().unwrap().kind, CmEventKind::AddrResolved);
        // Not bound: attached to no device.
        let _idle = CmId::new(&ch, PortSpace::Tcp).unwrap();

        let failover = |ifindex: u32, hw: &[u8], bonding_failover: bool| {
            dev.core.follow_link(
                &Notices {
                    links: vec![LinkNotice {
                        ifindex,
                        hw_addr: Some(hw.to_vec()),
                        bonding_failover,
                    }],
                    lost: false,
                },
                false,
            )
        };
        let was = dev.core.hw_addr();
        let other = [0x02, 0, 0, 0, 0x0f, 0x0f];
        // The same address, another interface's failover, or a plain
        // address change: no event.
        failover(dev.core.ifindex, &was, true);
        failover(dev.core.ifindex + 1000, &other, true);
        failover(dev.core.ifindex, &other, false);
        assert!(ch.try_get_event().is_none());
        // A failover to another address: each attached id hears of it.
        failover(dev.core.ifindex, &other, true);
        let mut heard: Vec<CmId> = std::iter::from_fn(|| ch.try_get_event())
            .map(|ev| {
                assert_eq!((ev.kind, ev.status), (CmEventKind::AddrChange, 0));
                ev.id
            })
            .collect();
        assert_eq!(heard.len(), 2, "{heard:?}");
        heard.retain(|id| id != &bound && id != &resolved);
        assert!(heard.is_empty(), "{heard:?}");
        dev.disassociate();
    }
}

/// A free-looking ephemeral port.
fn ephemeral_port() -> u16 {
    let span = u32::from(EPHEMERAL.end() - EPHEMERAL.start()) + 1;
    EPHEMERAL.start() + (random_u32() % span) as u16
}

/// Appends rdma_cm's IP CM header.
fn ip_cm_header(out: &mut Vec<u8>, src_port: u16, src: IpAddr, dst: IpAddr) {
    let mut hdr = [0u8; IP_CM_HDR];
    IpCmHdrRepr { src_port, src, dst }.emit(&mut IpCmHdr::new_unchecked(&mut hdr[..]));
    out.extend_from_slice(&hdr);
}

/// The INIT attributes rdma_cm gives a QP: remote READ, WRITE and atomic
/// access (UD: rdma_cm's Q_Key).
fn init_attr(ud: bool) -> (QpAttr, QpAttrMask) {
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: PORT_NUM,
        ..QpAttr::default()
    };
    let base = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
    if ud {
        attr.qkey = RDMA_UDP_QKEY;
        (attr, base | QpAttrMask::QKEY)
    } else {
        attr.qp_access_flags = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        (attr, base | QpAttrMask::ACCESS_FLAGS)
    }
}

/// The RTR and RTS attributes (and masks) of `r` for a QP of `qp_type`.
fn rtr_attrs(qp_type: QpType, r: &Rtr) -> [(QpAttr, QpAttrMask); 2] {
    let rc = qp_type == QpType::Rc;
    let rc_only = |m: QpAttrMask| if rc { m } else { QpAttrMask::empty() };
    let mut attr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: r.mtu,
        dest_qp_num: r.dest_qpn,
        rq_psn: r.rq_psn,
        max_dest_rd_atomic: r.max_dest_rd_atomic,
        min_rnr_timer: MIN_RNR_TIMER,
        ah_attr: AhAttr {
            dgid: r.peer,
            hop_limit: 64,
            port_num: PORT_NUM,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    let rtr = (
        attr,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | rc_only(QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER),
    );
    attr.qp_state = QpState::Rts;
    attr.sq_psn = r.sq_psn;
    attr.timeout = r.timeout;
    attr.retry_cnt = r.retry_cnt.min(7);
    attr.rnr_retry = r.rnr_retry.min(7);
    attr.max_rd_atomic = r.max_rd_atomic;
    let rts = (
        attr,
        QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | rc_only(
                QpAttrMask::TIMEOUT
                    | QpAttrMask::RETRY_CNT
                    | QpAttrMask::RNR_RETRY
                    | QpAttrMask::MAX_QP_RD_ATOMIC,
            ),
    );
    [rtr, rts]
}

/// Brings a QP in RESET to INIT as rdma_cm does (UD: on to RTS, with
/// rdma_cm's Q_Key); a QP past RESET is left as it is.
fn prepare_qp(verb: Verb, qp: &QueuePair, space: PortSpace) -> Result<()> {
    if qp.state() != QpState::Reset {
        return Ok(());
    }
    let ud = qp.qp_type() == QpType::Ud;
    if ud != space.is_ud() {
        return Err(einval(
            verb,
            format!("a {:?} QP on an id of port space {space:?}", qp.qp_type()),
        ));
    }
    let (mut attr, mask) = init_attr(ud);
    qp.modify(&attr, mask)?;
    if ud {
        attr.qp_state = QpState::Rtr;
        qp.modify(&attr, QpAttrMask::STATE)?;
        attr.qp_state = QpState::Rts;
        attr.sq_psn = random_psn();
        qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::SQ_PSN)?;
    }
    Ok(())
}

/// What RTR and RTS take from the CM exchange.
#[derive(Debug, Clone, Copy)]
struct Rtr {
    peer: Gid,
    dest_qpn: u32,
    rq_psn: u32,
    mtu: Mtu,
    max_dest_rd_atomic: u8,
    sq_psn: u32,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    max_rd_atomic: u8,
}

impl Rtr {
    /// The passive side's QP, from the peer's REQ and the PSN this side
    /// puts in its REP (`local_psn`) toward `peer`. A REQ's or REP's
    /// starting PSN is the one its sender's QP expects first: this QP
    /// sends from the REQ's and receives from the REP's (the kernel's CM
    /// gives the passive side the REQ's as its sq_psn, and rdma_cm gives
    /// each side the PSN of its own message as its rq_psn).
    fn passive(req: &Req, local_psn: u32, port_mtu: Mtu, peer: Gid) -> Rtr {
        Rtr {
            peer,
            dest_qpn: req.local_qpn,
            rq_psn: local_psn,
            mtu: req.path_mtu.min(port_mtu),
            max_dest_rd_atomic: req.initiator_depth,
            sq_psn: req.starting_psn,
            timeout: req.primary.local_ack_timeout,
            retry_cnt: req.retry_count,
            rnr_retry: req.rnr_retry_count,
            max_rd_atomic: req.responder_resources,
        }
    }

    /// The active side's QP, from the peer's REP, what this side offered
    /// and the PSN it put in its REQ (`local_psn`): it sends from the
    /// REP's starting PSN and receives from the REQ's.
    fn active(
        response: &ConnectResponse,
        offer: &ConnParam,
        local_psn: u32,
        mtu: Mtu,
        peer: Gid,
    ) -> Rtr {
        Rtr {
            peer,
            dest_qpn: response.remote_qpn,
            rq_psn: local_psn,
            mtu,
            max_dest_rd_atomic: offer.responder_resources.min(response.responder_resources),
            sq_psn: response.remote_starting_psn,
            timeout: LOCAL_ACK_TIMEOUT,
            retry_cnt: offer.retry_count.min(7),
            rnr_retry: response.rnr_retry_count,
            max_rd_atomic: offer.initiator_depth.min(response.initiator_depth),
        }
    }
}

/// INIT → RTR → RTS (UC takes no timers, retries or READ depths).
fn bring_up(verb: Verb, qp: &QueuePair, r: &Rtr) -> Result<()> {
    let _ = verb;
    for (attr, mask) in rtr_attrs(qp.qp_type(), r) {
        qp.modify(&attr, mask)?;
    }
    Ok(())
}

/// Moves a QP to ERR (its outstanding work flushes), as rdma_disconnect
/// does; a QP already gone or in RESET is left alone.
fn to_error(qp: &QueuePair) {
    if matches!(qp.state(), QpState::Reset | QpState::Err) {
        return;
    }
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    if let Err(e) = qp.modify(&attr, QpAttrMask::STATE) {
        tracing::debug!("moving QP {:#x} to ERR: {e}", qp.qp_num());
    }
}
