//! Plain data the verbs exchange: device and port attributes, GIDs, access
//! flags and the enumerations of `<infiniband/verbs.h>`, with the same
//! numeric values so the C ABI can pass them through unchanged.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bitflags::bitflags;

/// A 128-bit global identifier. On a RoCEv2 port it is the port's IP address
/// (IPv4 addresses in their IPv4-mapped IPv6 form, `::ffff:a.b.c.d`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID of an empty table entry.
    pub const ZERO: Gid = Gid([0; 16]);

    /// The GID of an IP address: IPv6 as is, IPv4 mapped into `::ffff:0:0/96`.
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address this GID stands for on a RoCEv2 port.
    pub fn to_ip(&self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// The IPv4 address, if this is an IPv4-mapped GID.
    pub fn to_ipv4(&self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.0).to_ipv4_mapped()
    }

    /// The raw bytes, network order.
    pub fn raw(&self) -> &[u8; 16] {
        &self.0
    }

    /// Whether this is the empty (all-zero) GID.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl fmt::Display for Gid {
    /// Formats as `inet_ntop(AF_INET6)` does, as `ibv_devinfo` prints RoCEv2 GIDs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Ipv6Addr::from(self.0), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

impl From<IpAddr> for Gid {
    fn from(ip: IpAddr) -> Gid {
        Gid::from_ip(ip)
    }
}

impl std::str::FromStr for Gid {
    type Err = std::net::AddrParseError;

    /// Parses a GID as [`Display`](fmt::Display) writes it (an IPv6
    /// address), or an IPv4 address (mapped, as on a RoCEv2 port).
    fn from_str(s: &str) -> std::result::Result<Gid, Self::Err> {
        match s.parse::<Ipv6Addr>() {
            Ok(v6) => Ok(Gid(v6.octets())),
            Err(_) => s.parse::<Ipv4Addr>().map(|v4| Gid::from_ip(IpAddr::V4(v4))),
        }
    }
}

/// A GID goes to and from serde formats as its text (`"::ffff:10.0.0.1"`).
impl serde::Serialize for Gid {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Gid {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Gid, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// `enum ibv_gid_type`: which protocol a GID table entry is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GidType {
    /// InfiniBand.
    Ib = 0,
    /// RoCE v1 (Ethernet, no IP header).
    RoceV1 = 1,
    /// RoCE v2 (IP/UDP port 4791).
    RoceV2 = 2,
}

/// One entry of a port's GID table (`struct ibv_gid_entry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Its index in the table.
    pub gid_index: u32,
    /// The port the table belongs to.
    pub port_num: u32,
    /// The protocol it is for.
    pub gid_type: GidType,
    /// The network interface index the address lives on (0 if unknown).
    pub ndev_ifindex: u32,
}

/// `enum ibv_node_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum NodeType {
    /// A channel adapter (an RDMA NIC).
    Ca = 1,
    /// A switch.
    Switch = 2,
    /// A router.
    Router = 3,
    /// An iWARP NIC.
    Rnic = 4,
    /// usNIC.
    UsnicUdp = 6,
}

/// `enum ibv_transport_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum TransportType {
    /// InfiniBand transport (also RoCE).
    Ib = 0,
    /// iWARP.
    Iwarp = 1,
}

impl TransportType {
    /// The name `ibv_devinfo` prints.
    pub fn name(self) -> &'static str {
        match self {
            TransportType::Ib => "InfiniBand",
            TransportType::Iwarp => "iWARP",
        }
    }
}

/// `enum ibv_atomic_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AtomicCap {
    /// No atomics.
    None = 0,
    /// Atomic against other operations of this device.
    Hca = 1,
    /// Atomic against everything (CPU included).
    Glob = 2,
}

impl AtomicCap {
    /// The name `ibv_devinfo` prints.
    pub fn name(self) -> &'static str {
        match self {
            AtomicCap::None => "ATOMIC_NONE",
            AtomicCap::Hca => "ATOMIC_HCA",
            AtomicCap::Glob => "ATOMIC_GLOB",
        }
    }
}

/// `enum ibv_mtu`: the path MTUs InfiniBand knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// The MTU in bytes of payload per packet.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// The enum value for a C `enum ibv_mtu`.
    pub fn from_raw(raw: u32) -> Option<Mtu> {
        Some(match raw {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// The largest IB MTU whose RoCEv2 packets fit in an Ethernet/IP MTU of
    /// `link_mtu` bytes, counting the worst-case headers as the Linux RDMA
    /// core does (GRH/IPv6 40, UDP 8, BTH 12, XRC ETH 4, AtomicETH 28, ICRC 4).
    /// `None` when not even 256 bytes fit.
    pub fn for_link_mtu(link_mtu: u32) -> Option<Mtu> {
        const OVERHEAD: u32 = 40 + 8 + 12 + 4 + 28 + 4;
        let room = link_mtu.checked_sub(OVERHEAD)?;
        [
            Mtu::Mtu4096,
            Mtu::Mtu2048,
            Mtu::Mtu1024,
            Mtu::Mtu512,
            Mtu::Mtu256,
        ]
        .into_iter()
        .find(|m| m.bytes() <= room)
    }
}

/// `enum ibv_port_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum PortState {
    /// No state change.
    Nop = 0,
    /// The link is down.
    Down = 1,
    /// Initializing.
    Init = 2,
    /// Armed.
    Armed = 3,
    /// Up and passing traffic.
    Active = 4,
    /// Active, deferring.
    ActiveDefer = 5,
}

impl PortState {
    /// The name `ibv_devinfo` prints.
    pub fn name(self) -> &'static str {
        match self {
            PortState::Nop => "PORT_NOP",
            PortState::Down => "PORT_DOWN",
            PortState::Init => "PORT_INIT",
            PortState::Armed => "PORT_ARMED",
            PortState::Active => "PORT_ACTIVE",
            PortState::ActiveDefer => "PORT_ACTIVE_DEFER",
        }
    }
}

/// Physical port state `LinkUp`, the value `ibv_port_attr::phys_state` has on a working port.
pub const PHYS_STATE_LINK_UP: u8 = 5;
/// `phys_state` value for a port whose link is disabled (as `ibv_devinfo` prints it).
pub const PHYS_STATE_DISABLED: u8 = 3;

/// The link layer of a port (`IBV_LINK_LAYER_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LinkLayer {
    /// Not reported.
    Unspecified = 0,
    /// InfiniBand.
    InfiniBand = 1,
    /// Ethernet (RoCE).
    Ethernet = 2,
}

impl LinkLayer {
    /// The name `ibv_devinfo` prints.
    pub fn name(self) -> &'static str {
        match self {
            LinkLayer::Unspecified => "Unspecified",
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
        }
    }
}

bitflags! {
    /// `enum ibv_access_flags`: what an MR allows.
    ///
    /// Local reads are always allowed. `REMOTE_WRITE` and `REMOTE_ATOMIC`
    /// need `LOCAL_WRITE` too, as in libibverbs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// The device may write into the MR (receives, READ responses, atomics' results).
        const LOCAL_WRITE = 1;
        /// Peers may RDMA WRITE into it.
        const REMOTE_WRITE = 1 << 1;
        /// Peers may RDMA READ from it.
        const REMOTE_READ = 1 << 2;
        /// Peers may run atomics on it.
        const REMOTE_ATOMIC = 1 << 3;
        /// Memory windows may be bound to it.
        const MW_BIND = 1 << 4;
        /// Addresses are offsets from the start of the MR.
        const ZERO_BASED = 1 << 5;
        /// On-demand paging (not supported by the software device).
        const ON_DEMAND = 1 << 6;
        /// Hint that the memory is backed by huge pages.
        const HUGETLB = 1 << 7;
        /// Global-visibility FLUSH target (not supported).
        const FLUSH_GLOBAL = 1 << 8;
        /// Persistence FLUSH target (not supported).
        const FLUSH_PERSISTENT = 1 << 9;
        /// Relaxed ordering allowed (an optional flag: ignored where unsupported).
        const RELAXED_ORDERING = 1 << 20;
        /// The rest of libibverbs' optional range (`IBV_ACCESS_OPTIONAL_RANGE`).
        const OPTIONAL_RANGE = 0x3ff0_0000;
    }
}

bitflags! {
    /// `enum ibv_device_cap_flags` as reported in [`DeviceAttr::device_cap_flags`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct DeviceCapFlags: u32 {
        /// `IBV_DEVICE_RESIZE_MAX_WR`.
        const RESIZE_MAX_WR = 1;
        /// `IBV_DEVICE_BAD_PKEY_CNTR`.
        const BAD_PKEY_CNTR = 1 << 1;
        /// `IBV_DEVICE_BAD_QKEY_CNTR`.
        const BAD_QKEY_CNTR = 1 << 2;
        /// `IBV_DEVICE_RAW_MULTI`.
        const RAW_MULTI = 1 << 3;
        /// `IBV_DEVICE_AUTO_PATH_MIG`.
        const AUTO_PATH_MIG = 1 << 4;
        /// `IBV_DEVICE_CHANGE_PHY_PORT`.
        const CHANGE_PHY_PORT = 1 << 5;
        /// `IBV_DEVICE_UD_AV_PORT_ENFORCE`.
        const UD_AV_PORT_ENFORCE = 1 << 6;
        /// `IBV_DEVICE_CURR_QP_STATE_MOD`.
        const CURR_QP_STATE_MOD = 1 << 7;
        /// `IBV_DEVICE_SHUTDOWN_PORT`.
        const SHUTDOWN_PORT = 1 << 8;
        /// `IBV_DEVICE_INIT_TYPE`.
        const INIT_TYPE = 1 << 9;
        /// `IBV_DEVICE_PORT_ACTIVE_EVENT`.
        const PORT_ACTIVE_EVENT = 1 << 10;
        /// `IBV_DEVICE_SYS_IMAGE_GUID`.
        const SYS_IMAGE_GUID = 1 << 11;
        /// `IBV_DEVICE_RC_RNR_NAK_GEN`.
        const RC_RNR_NAK_GEN = 1 << 12;
        /// `IBV_DEVICE_SRQ_RESIZE`.
        const SRQ_RESIZE = 1 << 13;
        /// `IBV_DEVICE_N_NOTIFY_CQ`.
        const N_NOTIFY_CQ = 1 << 14;
        /// `IBV_DEVICE_MEM_WINDOW`.
        const MEM_WINDOW = 1 << 17;
        /// `IBV_DEVICE_UD_IP_CSUM`.
        const UD_IP_CSUM = 1 << 18;
        /// `IBV_DEVICE_XRC`.
        const XRC = 1 << 20;
        /// `IBV_DEVICE_MEM_MGT_EXTENSIONS`.
        const MEM_MGT_EXTENSIONS = 1 << 21;
        /// `IBV_DEVICE_MEM_WINDOW_TYPE_2A`.
        const MEM_WINDOW_TYPE_2A = 1 << 23;
        /// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`.
        const MEM_WINDOW_TYPE_2B = 1 << 24;
        /// `IBV_DEVICE_RC_IP_CSUM`.
        const RC_IP_CSUM = 1 << 25;
        /// `IBV_DEVICE_RAW_IP_CSUM`.
        const RAW_IP_CSUM = 1 << 26;
        /// `IBV_DEVICE_MANAGED_FLOW_STEERING`.
        const MANAGED_FLOW_STEERING = 1 << 29;
    }
}

bitflags! {
    /// `enum ibv_port_cap_flags` as reported in [`PortAttr::port_cap_flags`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct PortCapFlags: u32 {
        /// `IBV_PORT_SM`.
        const SM = 1 << 1;
        /// `IBV_PORT_NOTICE_SUP`.
        const NOTICE_SUP = 1 << 2;
        /// `IBV_PORT_TRAP_SUP`.
        const TRAP_SUP = 1 << 3;
        /// `IBV_PORT_AUTO_MIGR_SUP`.
        const AUTO_MIGR_SUP = 1 << 5;
        /// `IBV_PORT_SL_MAP_SUP`.
        const SL_MAP_SUP = 1 << 6;
        /// `IBV_PORT_LED_INFO_SUP`.
        const LED_INFO_SUP = 1 << 13;
        /// `IBV_PORT_SYS_IMAGE_GUID_SUP`.
        const SYS_IMAGE_GUID_SUP = 1 << 14;
        /// `IBV_PORT_CM_SUP`: the port answers connection management.
        const CM_SUP = 1 << 16;
        /// `IBV_PORT_DEVICE_MGMT_SUP`.
        const DEVICE_MGMT_SUP = 1 << 19;
        /// `IBV_PORT_VENDOR_CLASS_SUP`.
        const VENDOR_CLASS_SUP = 1 << 20;
        /// `IBV_PORT_IP_BASED_GIDS`: GIDs are IP addresses (RoCE).
        const IP_BASED_GIDS = 1 << 26;
    }
}

/// `struct ibv_device_attr`: what the device is and the limits every verb enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID, host byte order (stable, derived from the device's address).
    pub node_guid: u64,
    /// System image GUID, host byte order.
    pub sys_image_guid: u64,
    /// Largest MR in bytes.
    pub max_mr_size: u64,
    /// Supported page sizes (bit n set: 2^n bytes).
    pub page_size_cap: u64,
    /// IEEE OUI of the vendor.
    pub vendor_id: u32,
    /// Vendor's part number.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Most QPs at once.
    pub max_qp: u32,
    /// Most outstanding WRs per queue of a QP.
    pub max_qp_wr: u32,
    /// Capabilities.
    pub device_cap_flags: DeviceCapFlags,
    /// Most SGEs per send or receive WR.
    pub max_sge: u32,
    /// Most SGEs per RDMA READ WR.
    pub max_sge_rd: u32,
    /// Most CQs at once.
    pub max_cq: u32,
    /// Most entries in one CQ.
    pub max_cqe: u32,
    /// Most MRs at once.
    pub max_mr: u32,
    /// Most PDs at once.
    pub max_pd: u32,
    /// Most outstanding RDMA READ/atomic requests a QP accepts as responder.
    pub max_qp_rd_atom: u32,
    /// Same, per EE context (no RD: 0).
    pub max_ee_rd_atom: u32,
    /// Total RDMA READ/atomic responder resources.
    pub max_res_rd_atom: u32,
    /// Most outstanding RDMA READ/atomic requests a QP initiates.
    pub max_qp_init_rd_atom: u32,
    /// Same, per EE context (no RD: 0).
    pub max_ee_init_rd_atom: u32,
    /// Atomicity of atomic operations.
    pub atomic_cap: AtomicCap,
    /// Most EE contexts (no RD: 0).
    pub max_ee: u32,
    /// Most RD domains (no RD: 0).
    pub max_rdd: u32,
    /// Most memory windows.
    pub max_mw: u32,
    /// Most raw IPv6 QPs.
    pub max_raw_ipv6_qp: u32,
    /// Most raw Ethernet QPs.
    pub max_raw_ethy_qp: u32,
    /// Most multicast groups.
    pub max_mcast_grp: u32,
    /// Most QPs attached to one multicast group.
    pub max_mcast_qp_attach: u32,
    /// Most QP attachments over all groups.
    pub max_total_mcast_qp_attach: u32,
    /// Most address handles.
    pub max_ah: u32,
    /// Most FMRs (obsolete: 0).
    pub max_fmr: u32,
    /// Most remaps per FMR (obsolete: 0).
    pub max_map_per_fmr: u32,
    /// Most SRQs.
    pub max_srq: u32,
    /// Most WRs per SRQ.
    pub max_srq_wr: u32,
    /// Most SGEs per SRQ WR.
    pub max_srq_sge: u32,
    /// P_Key table size.
    pub max_pkeys: u16,
    /// Local CA ACK delay (4.096 µs × 2^n).
    pub local_ca_ack_delay: u8,
    /// Number of ports.
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// Logical port state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use (from the network interface's MTU).
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// Capabilities.
    pub port_cap_flags: PortCapFlags,
    /// Largest message in bytes.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// Base LID (0 on Ethernet).
    pub lid: u16,
    /// Subnet manager LID (0 on Ethernet).
    pub sm_lid: u16,
    /// LID mask control.
    pub lmc: u8,
    /// Virtual lanes supported (encoded as in `ibv_port_attr`).
    pub max_vl_num: u8,
    /// Subnet manager SL.
    pub sm_sl: u8,
    /// Subnet propagation delay.
    pub subnet_timeout: u8,
    /// Init type reply.
    pub init_type_reply: u8,
    /// Link width (encoded as in `ibv_port_attr`: 1 = 1X, 2 = 4X …).
    pub active_width: u8,
    /// Link speed (encoded as in `ibv_port_attr`: 32 = 25 Gbps …).
    pub active_speed: u8,
    /// Physical state (5 = LinkUp).
    pub phys_state: u8,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// `IBV_QPF_GRH_REQUIRED` (1) on RoCE ports.
    pub flags: u8,
    /// More capabilities.
    pub port_cap_flags2: u16,
    /// Extended speed (0: use `active_speed`).
    pub active_speed_ex: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_of_ipv4_is_mapped() {
        let gid = Gid::from_ip("127.0.0.2".parse().unwrap());
        assert_eq!(
            gid.0,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 2]
        );
        assert_eq!(gid.to_string(), "::ffff:127.0.0.2");
        assert_eq!(gid.to_ip(), "127.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(gid.to_ipv4(), Some(Ipv4Addr::new(127, 0, 0, 2)));
    }

    #[test]
    fn gid_of_ipv6_is_the_address() {
        let ip: IpAddr = "fd00::2".parse().unwrap();
        let gid = Gid::from_ip(ip);
        assert_eq!(gid.to_ip(), ip);
        assert_eq!(gid.to_ipv4(), None);
        assert!(!gid.is_zero());
        assert!(Gid::ZERO.is_zero());
    }

    #[test]
    fn mtu_from_link_mtu_matches_the_rdma_core_rule() {
        assert_eq!(Mtu::for_link_mtu(65536), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::for_link_mtu(9000), Some(Mtu::Mtu4096));
        // 4096 + 96 bytes of worst-case headers is the smallest link MTU for 4096.
        assert_eq!(Mtu::for_link_mtu(4192), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::for_link_mtu(4191), Some(Mtu::Mtu2048));
        assert_eq!(Mtu::for_link_mtu(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::for_link_mtu(1400), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::for_link_mtu(1119), Some(Mtu::Mtu512));
        assert_eq!(Mtu::for_link_mtu(300), None);
    }

    #[test]
    fn mtu_bytes_and_raw_values() {
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::from_raw(5), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::from_raw(0), None);
        assert_eq!(Mtu::from_raw(6), None);
    }

    #[test]
    fn access_flag_values_match_verbs_h() {
        assert_eq!(AccessFlags::LOCAL_WRITE.bits(), 1);
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(AccessFlags::FLUSH_PERSISTENT.bits(), 0x200);
        assert_eq!(AccessFlags::RELAXED_ORDERING.bits(), 0x10_0000);
    }
}
