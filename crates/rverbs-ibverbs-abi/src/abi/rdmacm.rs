//! The C ABI of `<rdma/rdma_cma.h>` (librdmacm, Debian bookworm, rdma-core
//! 44, x86_64) as `#[repr(C)]` Rust types, with what it takes from
//! `<infiniband/sa.h>` (`ibv_sa_path_rec`, and `ibv_path_record` /
//! `ibv_path_data`, the payload of `RDMA_OPTION_IB_PATH`) and the constants
//! of `<rdma/rsocket.h>`.
//!
//! The mapping is the one of the parent module: C names, C field order, a
//! named C enum is a type alias of the integer gcc gives it (`u32` here: no
//! negative values) with its values as constants, an anonymous enum takes
//! the type it is used as (`u8` for `RDMA_MAX_RESP_RES`, stored in
//! `rdma_conn_param`'s `u8` fields; `c_int` for the option levels and names,
//! `rdma_set_option`'s `int` arguments, and for `RAI_*`, `ai_flags`), and an
//! anonymous member union gets a named field:
//! - [`rdma_addr::src`] (C's `src_addr`/`src_sin`/`src_sin6`/`src_storage`,
//!   type [`rdma_addr_src`]) and [`rdma_addr::dst`] (type [`rdma_addr_dst`]);
//! - the unions C does name keep their names: [`rdma_addr::addr`] (type
//!   [`rdma_addr_addr`]) and [`rdma_cm_event::param`] (type
//!   [`rdma_cm_event_param`]).
//!
//! The socket addresses are glibc's, from `libc`. `tests/layout_rdmacm.rs`
//! checks every size, alignment, field offset and constant here against the
//! real headers.
//!
//! Every struct is plain old data: `Copy`, and `Default` is all-zero.

use core::ffi::{c_char, c_int, c_void};

use libc::{sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t};

use super::{
    __be16, __be32, __be64, ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd,
    ibv_qp, ibv_qp_type, ibv_srq,
};

/// `enum rdma_cm_event_type`: what an `rdma_cm_event` reports.
pub type rdma_cm_event_type = u32;
/// `rdma_resolve_addr` finished: the id is bound to a local device.
pub const RDMA_CM_EVENT_ADDR_RESOLVED: rdma_cm_event_type = 0;
/// `rdma_resolve_addr` failed.
pub const RDMA_CM_EVENT_ADDR_ERROR: rdma_cm_event_type = 1;
/// `rdma_resolve_route` finished.
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: rdma_cm_event_type = 2;
/// `rdma_resolve_route` failed.
pub const RDMA_CM_EVENT_ROUTE_ERROR: rdma_cm_event_type = 3;
/// A connection request arrived on a listening id (the event's `id` is new).
pub const RDMA_CM_EVENT_CONNECT_REQUEST: rdma_cm_event_type = 4;
/// A reply to a connection request arrived (ids without a QP only).
pub const RDMA_CM_EVENT_CONNECT_RESPONSE: rdma_cm_event_type = 5;
/// Establishing the connection failed.
pub const RDMA_CM_EVENT_CONNECT_ERROR: rdma_cm_event_type = 6;
/// The remote side did not answer.
pub const RDMA_CM_EVENT_UNREACHABLE: rdma_cm_event_type = 7;
/// The remote side rejected the request (`status` says why).
pub const RDMA_CM_EVENT_REJECTED: rdma_cm_event_type = 8;
/// The connection is established.
pub const RDMA_CM_EVENT_ESTABLISHED: rdma_cm_event_type = 9;
/// The connection was disconnected.
pub const RDMA_CM_EVENT_DISCONNECTED: rdma_cm_event_type = 10;
/// The id's device went away.
pub const RDMA_CM_EVENT_DEVICE_REMOVAL: rdma_cm_event_type = 11;
/// A multicast join finished.
pub const RDMA_CM_EVENT_MULTICAST_JOIN: rdma_cm_event_type = 12;
/// A multicast join failed, or the group went away.
pub const RDMA_CM_EVENT_MULTICAST_ERROR: rdma_cm_event_type = 13;
/// The id's address changed (its network device went down, or bonding
/// failed over).
pub const RDMA_CM_EVENT_ADDR_CHANGE: rdma_cm_event_type = 14;
/// The QP of a disconnected connection left TIMEWAIT and may be reused.
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: rdma_cm_event_type = 15;

/// `enum rdma_port_space`: the port space (and so the QP type) of an id.
pub type rdma_port_space = u32;
/// IPoIB port space (not for applications).
pub const RDMA_PS_IPOIB: rdma_port_space = 0x0002;
/// Connected, reliable: RC QPs (the TCP port space).
pub const RDMA_PS_TCP: rdma_port_space = 0x0106;
/// Datagrams: UD QPs (the UDP port space).
pub const RDMA_PS_UDP: rdma_port_space = 0x0111;
/// Any QP type (native InfiniBand service ids).
pub const RDMA_PS_IB: rdma_port_space = 0x013F;

/// Mask of the port space in an IB service id built from an IP port.
pub const RDMA_IB_IP_PS_MASK: u64 = 0xFFFF_FFFF_FFFF_0000;
/// Mask of the IP port in such a service id.
pub const RDMA_IB_IP_PORT_MASK: u64 = 0x0000_0000_0000_FFFF;
/// Service id prefix of the TCP port space.
pub const RDMA_IB_IP_PS_TCP: u64 = 0x0000_0000_0106_0000;
/// Service id prefix of the UDP port space.
pub const RDMA_IB_IP_PS_UDP: u64 = 0x0000_0000_0111_0000;
/// Service id prefix of the IB port space.
pub const RDMA_IB_PS_IB: u64 = 0x0000_0000_013F_0000;

/// The Q_Key of UD QPs in the UDP port space (`rdma_ud_param::qkey`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// `struct rdma_ib_addr`: an id's GIDs and P_Key.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination GID.
    pub dgid: ibv_gid,
    /// P_Key (big-endian).
    pub pkey: __be16,
}

/// `rdma_addr`'s first (anonymous) union: the source address.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_addr_src {
    /// As a generic socket address.
    pub src_addr: sockaddr,
    /// As IPv4.
    pub src_sin: sockaddr_in,
    /// As IPv6.
    pub src_sin6: sockaddr_in6,
    /// Room for any family.
    pub src_storage: sockaddr_storage,
}

/// `rdma_addr`'s second (anonymous) union: the destination address.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_addr_dst {
    /// As a generic socket address.
    pub dst_addr: sockaddr,
    /// As IPv4.
    pub dst_sin: sockaddr_in,
    /// As IPv6.
    pub dst_sin6: sockaddr_in6,
    /// Room for any family.
    pub dst_storage: sockaddr_storage,
}

/// `rdma_addr.addr`: the transport's addresses.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_addr_addr {
    /// InfiniBand/RoCE GIDs and P_Key.
    pub ibaddr: rdma_ib_addr,
}

/// `struct rdma_addr`: an id's source and destination, as socket addresses
/// and as GIDs.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    /// Source socket address (C's anonymous union of `src_*`).
    pub src: rdma_addr_src,
    /// Destination socket address (C's anonymous union of `dst_*`).
    pub dst: rdma_addr_dst,
    /// GIDs and P_Key.
    pub addr: rdma_addr_addr,
}

/// `struct rdma_route`: an id's addresses and resolved path records.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    /// Source and destination.
    pub addr: rdma_addr,
    /// `num_paths` path records, owned by the library.
    pub path_rec: *mut ibv_sa_path_rec,
    /// How many records `path_rec` holds.
    pub num_paths: c_int,
}

/// `struct rdma_event_channel`: where an id's events are queued; `fd` is
/// readable when one is.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_event_channel {
    /// The file descriptor to poll.
    pub fd: c_int,
}

/// `struct rdma_cm_id`: a communication identifier, the rdma_cm's socket.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_cm_id {
    /// The device context the id is bound to (NULL until bound).
    pub verbs: *mut ibv_context,
    /// Where the id's events go (NULL: synchronous id).
    pub channel: *mut rdma_event_channel,
    /// The program's pointer, given to `rdma_create_id`.
    pub context: *mut c_void,
    /// The QP `rdma_create_qp` made for the id.
    pub qp: *mut ibv_qp,
    /// Addresses and path.
    pub route: rdma_route,
    /// The [`rdma_port_space`].
    pub ps: rdma_port_space,
    /// The device port the id is bound to.
    pub port_num: u8,
    /// The last event of a synchronous id.
    pub event: *mut rdma_cm_event,
    /// Send CQ's channel (`rdma_create_ep`).
    pub send_cq_channel: *mut ibv_comp_channel,
    /// Send CQ (`rdma_create_ep`).
    pub send_cq: *mut ibv_cq,
    /// Receive CQ's channel (`rdma_create_ep`).
    pub recv_cq_channel: *mut ibv_comp_channel,
    /// Receive CQ (`rdma_create_ep`).
    pub recv_cq: *mut ibv_cq,
    /// SRQ (`rdma_create_srq`).
    pub srq: *mut ibv_srq,
    /// PD the id's resources were made in.
    pub pd: *mut ibv_pd,
    /// The [`ibv_qp_type`] of the id's QP.
    pub qp_type: ibv_qp_type,
}

/// Largest `responder_resources` (`rdma_conn_param`): "as many as the
/// device allows".
pub const RDMA_MAX_RESP_RES: u8 = 0xFF;
/// Largest `initiator_depth` (`rdma_conn_param`): "as many as the device
/// allows".
pub const RDMA_MAX_INIT_DEPTH: u8 = 0xFF;

/// `struct rdma_conn_param`: what `rdma_connect`/`rdma_accept` offer, and
/// what a connect request or reply carried.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    /// Data for the peer.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// RDMA READs/atomics the peer may have outstanding at us.
    pub responder_resources: u8,
    /// RDMA READs/atomics we may have outstanding at the peer.
    pub initiator_depth: u8,
    /// Whether end-to-end flow control is used.
    pub flow_control: u8,
    /// Transport retries (ignored when accepting).
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// Whether the QP uses an SRQ (ids without a QP only).
    pub srq: u8,
    /// The QP number (ids without a QP only).
    pub qp_num: u32,
}

/// `struct rdma_ud_param`: a UD or multicast event's address data.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    /// Data from the peer.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// Address vector to reach the peer.
    pub ah_attr: ibv_ah_attr,
    /// The peer's QP number.
    pub qp_num: u32,
    /// The peer's Q_Key.
    pub qkey: u32,
}

/// `rdma_cm_event.param`: connected or datagram parameters, by the id's
/// port space.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    /// Connected (RDMA_PS_TCP, RDMA_PS_IB with RC).
    pub conn: rdma_conn_param,
    /// Datagram and multicast (RDMA_PS_UDP).
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event`: one event, from `rdma_get_cm_event` until
/// `rdma_ack_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_cm_event {
    /// The id the event is about (a new id for a connect request).
    pub id: *mut rdma_cm_id,
    /// The listening id of a connect request.
    pub listen_id: *mut rdma_cm_id,
    /// The [`rdma_cm_event_type`].
    pub event: rdma_cm_event_type,
    /// 0, or a negative errno / a reject reason.
    pub status: c_int,
    /// The event's parameters.
    pub param: rdma_cm_event_param,
}

/// `rdma_getaddrinfo` hint: the address is for a passive (listening) side.
pub const RAI_PASSIVE: c_int = 0x0000_0001;
/// `rdma_getaddrinfo` hint: the node is a numeric address.
pub const RAI_NUMERICHOST: c_int = 0x0000_0002;
/// `rdma_getaddrinfo` hint: do not resolve a route.
pub const RAI_NOROUTE: c_int = 0x0000_0004;
/// `rdma_getaddrinfo` hint: `ai_family` is set.
pub const RAI_FAMILY: c_int = 0x0000_0008;

/// `struct rdma_addrinfo`: one result of `rdma_getaddrinfo` (a list).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addrinfo {
    /// `RAI_*` flags.
    pub ai_flags: c_int,
    /// Address family (`AF_INET`, `AF_INET6`, `AF_IB`).
    pub ai_family: c_int,
    /// `ibv_qp_type`.
    pub ai_qp_type: c_int,
    /// [`rdma_port_space`].
    pub ai_port_space: c_int,
    /// Length of `ai_src_addr`.
    pub ai_src_len: socklen_t,
    /// Length of `ai_dst_addr`.
    pub ai_dst_len: socklen_t,
    /// Source address.
    pub ai_src_addr: *mut sockaddr,
    /// Destination address.
    pub ai_dst_addr: *mut sockaddr,
    /// Source host name.
    pub ai_src_canonname: *mut c_char,
    /// Destination host name.
    pub ai_dst_canonname: *mut c_char,
    /// Length of `ai_route`.
    pub ai_route_len: usize,
    /// Route data (`ibv_path_data` array).
    pub ai_route: *mut c_void,
    /// Length of `ai_connect`.
    pub ai_connect_len: usize,
    /// Connection data.
    pub ai_connect: *mut c_void,
    /// The next result.
    pub ai_next: *mut rdma_addrinfo,
}

/// `enum rdma_cm_join_mc_attr_mask`: the valid fields of
/// `rdma_cm_join_mc_attr_ex`.
pub type rdma_cm_join_mc_attr_mask = u32;
/// `addr` is set.
pub const RDMA_CM_JOIN_MC_ATTR_ADDRESS: rdma_cm_join_mc_attr_mask = 1 << 0;
/// `join_flags` is set.
pub const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: rdma_cm_join_mc_attr_mask = 1 << 1;
/// First unknown bit.
pub const RDMA_CM_JOIN_MC_ATTR_RESERVED: rdma_cm_join_mc_attr_mask = 1 << 2;

/// `enum rdma_cm_mc_join_flags`: how to join a multicast group.
pub type rdma_cm_mc_join_flags = u32;
/// As a full member (send and receive).
pub const RDMA_MC_JOIN_FLAG_FULLMEMBER: rdma_cm_mc_join_flags = 0;
/// As a send-only full member.
pub const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: rdma_cm_mc_join_flags = 1;
/// First unknown value.
pub const RDMA_MC_JOIN_FLAG_RESERVED: rdma_cm_mc_join_flags = 2;

/// `struct rdma_cm_join_mc_attr_ex`: `rdma_join_multicast_ex`'s request.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_cm_join_mc_attr_ex {
    /// [`rdma_cm_join_mc_attr_mask`] bits.
    pub comp_mask: u32,
    /// An [`rdma_cm_mc_join_flags`] value.
    pub join_flags: u32,
    /// The group's address.
    pub addr: *mut sockaddr,
}

/// `rdma_set_option` level: the id itself.
pub const RDMA_OPTION_ID: c_int = 0;
/// `rdma_set_option` level: InfiniBand.
pub const RDMA_OPTION_IB: c_int = 1;
/// `RDMA_OPTION_ID` option: type of service (`uint8_t`, RFC 2474).
pub const RDMA_OPTION_ID_TOS: c_int = 0;
/// `RDMA_OPTION_ID` option: reuse the address (`int`, like SO_REUSEADDR).
pub const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
/// `RDMA_OPTION_ID` option: IPv6 only (`int`, like IPV6_V6ONLY).
pub const RDMA_OPTION_ID_AFONLY: c_int = 2;
/// `RDMA_OPTION_ID` option: the QP's ACK timeout (`uint8_t`).
pub const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
/// `RDMA_OPTION_IB` option: the path records (`struct ibv_path_data[]`).
pub const RDMA_OPTION_IB_PATH: c_int = 1;

/// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`): a path record, unpacked.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sa_path_rec {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination LID (big-endian).
    pub dlid: __be16,
    /// Source LID (big-endian).
    pub slid: __be16,
    /// Non-zero for raw traffic.
    pub raw_traffic: c_int,
    /// Flow label (big-endian).
    pub flow_label: __be32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Non-zero when the path is reversible.
    pub reversible: c_int,
    /// Number of paths.
    pub numb_path: u8,
    /// P_Key (big-endian).
    pub pkey: __be16,
    /// Service level.
    pub sl: u8,
    /// MTU selector.
    pub mtu_selector: u8,
    /// Path MTU (`ibv_mtu`).
    pub mtu: u8,
    /// Rate selector.
    pub rate_selector: u8,
    /// Static rate (`ibv_rate`).
    pub rate: u8,
    /// Packet lifetime selector.
    pub packet_life_time_selector: u8,
    /// Packet lifetime.
    pub packet_life_time: u8,
    /// Preference.
    pub preference: u8,
}

/// `ibv_path_record::reversible_numpath`'s reversible bit.
pub const IBV_PATH_RECORD_REVERSIBLE: u8 = 0x80;

/// `struct ibv_path_record` (`<infiniband/sa.h>`): a path record in wire
/// format.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_path_record {
    /// Service id (big-endian).
    pub service_id: __be64,
    /// Destination GID.
    pub dgid: ibv_gid,
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination LID (big-endian).
    pub dlid: __be16,
    /// Source LID (big-endian).
    pub slid: __be16,
    /// Flow label (bits 27:8) and hop limit (7:0), big-endian.
    pub flowlabel_hoplimit: __be32,
    /// Traffic class.
    pub tclass: u8,
    /// Reversible (bit 7) and number of paths (6:0).
    pub reversible_numpath: u8,
    /// P_Key (big-endian).
    pub pkey: __be16,
    /// QoS class (15:4) and SL (3:0), big-endian.
    pub qosclass_sl: __be16,
    /// MTU selector (7:6) and MTU (5:0).
    pub mtu: u8,
    /// Rate selector (7:6) and rate (5:0).
    pub rate: u8,
    /// Lifetime selector (7:6) and packet lifetime (5:0).
    pub packetlifetime: u8,
    /// Preference.
    pub preference: u8,
    /// Reserved.
    pub reserved: [u8; 6],
}

/// `ibv_path_data::flags`: a GMP path.
pub const IBV_PATH_FLAG_GMP: u32 = 1 << 0;
/// `ibv_path_data::flags`: the primary path.
pub const IBV_PATH_FLAG_PRIMARY: u32 = 1 << 1;
/// `ibv_path_data::flags`: the alternate path.
pub const IBV_PATH_FLAG_ALTERNATE: u32 = 1 << 2;
/// `ibv_path_data::flags`: outbound.
pub const IBV_PATH_FLAG_OUTBOUND: u32 = 1 << 3;
/// `ibv_path_data::flags`: inbound.
pub const IBV_PATH_FLAG_INBOUND: u32 = 1 << 4;
/// `ibv_path_data::flags`: inbound, reversed.
pub const IBV_PATH_FLAG_INBOUND_REVERSE: u32 = 1 << 5;
/// `ibv_path_data::flags`: both directions.
pub const IBV_PATH_FLAG_BIDIRECTIONAL: u32 = IBV_PATH_FLAG_OUTBOUND | IBV_PATH_FLAG_INBOUND_REVERSE;

/// `struct ibv_path_data` (`<infiniband/sa.h>`): one element of
/// `RDMA_OPTION_IB_PATH`'s array.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_path_data {
    /// `IBV_PATH_FLAG_*` bits.
    pub flags: u32,
    /// Reserved.
    pub reserved: u32,
    /// The path record.
    pub path: ibv_path_record,
}

/// `<rdma/rsocket.h>`: the socket option level of rsockets.
pub const SOL_RDMA: c_int = 0x10000;
/// `SOL_RDMA` option: send queue size.
pub const RDMA_SQSIZE: c_int = 0;
/// `SOL_RDMA` option: receive queue size.
pub const RDMA_RQSIZE: c_int = 1;
/// `SOL_RDMA` option: inline data size.
pub const RDMA_INLINE: c_int = 2;
/// `SOL_RDMA` option: size of the remote I/O mapping table.
pub const RDMA_IOMAPSIZE: c_int = 3;
/// `SOL_RDMA` option: the route (`ibv_path_data[]`).
pub const RDMA_ROUTE: c_int = 4;

zeroed_default!(
    rdma_ib_addr,
    rdma_addr_src,
    rdma_addr_dst,
    rdma_addr_addr,
    rdma_addr,
    rdma_route,
    rdma_cm_id,
    rdma_conn_param,
    rdma_ud_param,
    rdma_cm_event_param,
    rdma_cm_event,
    rdma_addrinfo,
    rdma_cm_join_mc_attr_ex,
    ibv_sa_path_rec,
    ibv_path_record,
    ibv_path_data,
);
