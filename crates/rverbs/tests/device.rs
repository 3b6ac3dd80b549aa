//! The software device as programs see it: enumeration, attributes that
//! ibv_devinfo, ibv_rc_pingpong and perftest accept, and the query verbs'
//! error paths.

use std::net::IpAddr;

use rverbs::{
    devices, AtomicCap, ErrorKind, Gid, GidType, LinkLayer, Mtu, NodeType, PortCapFlags, PortState,
    TransportType,
};

const MELLANOX_OUI: u32 = 0x02c9;
const AMAZON_OUI: u32 = 0x1d0f;

#[test]
fn rverbs0_is_listed_on_a_loopback_address() {
    let list = devices().unwrap();
    let dev = list
        .iter()
        .find(|d| d.name() == "rverbs0")
        .expect("rverbs0");
    assert_eq!(dev.node_type(), NodeType::Ca);
    assert_eq!(dev.transport_type(), TransportType::Ib);
    if std::env::var_os("RVERBS_ADDR").is_none() {
        match dev.addr() {
            IpAddr::V4(v4) => assert!(v4.is_loopback(), "{v4}"),
            other => panic!("default device on {other}"),
        }
        assert_eq!(dev.interface(), Some("lo"));
    }
    assert_eq!(dev.gid(), Gid::from_ip(dev.addr()));
    // The list is the same devices every time: one instance per process.
    assert_eq!(devices().unwrap()[0], list[0]);
}

#[test]
fn device_attributes_programs_accept() {
    let dev = &devices().unwrap()[0];
    let ctx = dev.open().unwrap();
    let a = ctx.query_device().unwrap();
    assert_eq!(a.phys_port_cnt, 1);
    assert!(a.max_qp_wr > 0 && a.max_cqe > 0 && a.max_sge > 0 && a.max_qp_rd_atom > 0);
    assert!(a.max_qp >= 256);
    assert_ne!(a.vendor_id, MELLANOX_OUI);
    assert_ne!(a.vendor_id, AMAZON_OUI);
    assert_eq!(
        a.vendor_id & 0x02_0000,
        0x02_0000,
        "locally administered OUI"
    );
    assert_eq!(a.node_guid, dev.guid());
    assert_eq!(a.sys_image_guid, a.node_guid);
    assert_eq!(a.atomic_cap, AtomicCap::Hca);
    assert_eq!(a.max_pkeys, 1);
    assert!(!a.fw_ver.is_empty());
    assert_eq!(ctx.num_comp_vectors(), 1);
}

#[test]
fn guid_is_derived_from_the_address() {
    let dev = &devices().unwrap()[0];
    if let IpAddr::V4(v4) = dev.addr() {
        assert_eq!(dev.guid() & 0xffff_ffff, u64::from(u32::from(v4)));
        assert_eq!(dev.guid() >> 32, 0x5256_45ff);
    }
}

#[test]
fn port_is_an_active_roce_port() {
    let dev = &devices().unwrap()[0];
    let ctx = dev.open().unwrap();
    let p = ctx.query_port(1).unwrap();
    assert_eq!(p.state, PortState::Active);
    assert_eq!(p.phys_state, 5, "LinkUp");
    assert_eq!(p.link_layer, LinkLayer::Ethernet);
    assert_eq!(p.lid, 0);
    assert_eq!(p.max_mtu, Mtu::Mtu4096);
    if dev.interface() == Some("lo") {
        assert_eq!(
            p.active_mtu,
            Mtu::Mtu4096,
            "loopback carries 4096-byte packets"
        );
    }
    assert!(p.active_mtu >= Mtu::Mtu1024);
    assert!(p.gid_tbl_len >= 1);
    assert_eq!(p.pkey_tbl_len, 1);
    assert!(p.port_cap_flags.contains(PortCapFlags::IP_BASED_GIDS));
    assert!(p.max_msg_sz >= 1 << 30);
}

#[test]
fn gid0_is_the_ipv4_mapped_address_of_type_rocev2() {
    let dev = &devices().unwrap()[0];
    let ctx = dev.open().unwrap();
    let gid = ctx.query_gid(1, 0).unwrap();
    assert_eq!(gid.to_ip(), dev.addr());
    if let IpAddr::V4(v4) = dev.addr() {
        assert_eq!(
            &gid.raw()[..12],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]
        );
        assert_eq!(gid.to_ipv4(), Some(v4));
    }
    let entry = ctx.query_gid_entry(1, 0).unwrap();
    assert_eq!(entry.gid, gid);
    assert_eq!(entry.gid_type, GidType::RoceV2);
    assert_eq!((entry.gid_index, entry.port_num), (0, 1));
    let table = ctx.query_gid_table().unwrap();
    assert_eq!(table.len() as u32, ctx.query_port(1).unwrap().gid_tbl_len);
    assert_eq!(table[0], entry);
}

#[test]
fn pkey_table_is_the_default_key() {
    let ctx = devices().unwrap()[0].open().unwrap();
    assert_eq!(ctx.query_pkey(1, 0).unwrap(), 0xffff);
}

#[test]
fn query_error_paths_are_einval() {
    let ctx = devices().unwrap()[0].open().unwrap();
    let port = ctx.query_port(1).unwrap();
    for bad_port in [0u8, 2, 255] {
        let e = ctx.query_port(bad_port).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().starts_with("ibv_query_port: port"), "{e}");
        assert_eq!(ctx.query_gid(bad_port, 0).unwrap_err().errno(), 22);
        assert_eq!(ctx.query_pkey(bad_port, 0).unwrap_err().errno(), 22);
    }
    let e = ctx.query_gid(1, port.gid_tbl_len).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("gid_tbl_len"), "{e}");
    let e = ctx.query_pkey(1, port.pkey_tbl_len).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn contexts_share_the_one_device() {
    let dev = &devices().unwrap()[0];
    let a = dev.open().unwrap();
    let b = devices().unwrap()[0].open().unwrap();
    assert_eq!(a.device(), b.device());
    assert_eq!(a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    // MR keys come from the device's one key table: unique across contexts.
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let mut keys = std::collections::HashSet::new();
    let mut mrs = Vec::new();
    for _ in 0..200 {
        for pd in [&pa, &pb] {
            let mr = pd.alloc_mr(64, rverbs::AccessFlags::LOCAL_WRITE).unwrap();
            assert!(keys.insert(mr.lkey()), "duplicate key");
            mrs.push(mr);
        }
    }
    // Handles are device-unique too.
    assert_ne!(pa.handle(), pb.handle());
}

#[test]
fn device_by_name_and_unknown_names() {
    assert_eq!(rverbs::device_by_name("rverbs0").unwrap().name(), "rverbs0");
    let e = rverbs::device_by_name("mlx5_0").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoDevice);
}
