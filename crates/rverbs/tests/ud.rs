//! UD queue pairs and address handles over real UDP sockets, within one
//! process: two contexts on one device.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use rverbs::{
    devices, AccessFlags, AddressHandle, AhAttr, CompletionQueue, Context, ErrorKind, MemoryRegion,
    ProtectionDomain, QpAttr, QpAttrMask, QpState, QpType, QueuePair, RecvWr, SendWr, WcFlags,
    WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

mod common;
use common::{sge, ud_qp};

const QKEY: u32 = 0x1111_2222;
const GRH: usize = 40;

struct Side {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn side(ctx: Context) -> Side {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).unwrap();
    let qp = ud_qp(&pd, &cq, QKEY);
    let mr = pd.alloc_mr(1 << 16, AccessFlags::LOCAL_WRITE).unwrap();
    Side {
        ctx,
        pd,
        cq,
        qp,
        mr,
    }
}

fn pair() -> (Side, Side) {
    let dev = &devices().unwrap()[0];
    (side(dev.open().unwrap()), side(dev.open().unwrap()))
}

fn ah_to(from: &Side, to: &Side) -> AddressHandle {
    from.pd
        .create_ah(&AhAttr {
            dgid: to.qp.local_gid(),
            ..AhAttr::default()
        })
        .unwrap()
}

/// Polls for `d` and returns what arrived (nothing, when a drop is expected).
fn quiet(cq: &CompletionQueue, d: Duration) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + d;
    let mut got = Vec::new();
    let mut buf = [WorkCompletion::default(); 16];
    while Instant::now() < deadline {
        let k = cq.poll(&mut buf).unwrap();
        got.extend_from_slice(&buf[..k]);
        std::thread::sleep(Duration::from_millis(1));
    }
    got
}

/// Polls until `n` completions arrived (10 s at most).
fn wait(cq: &CompletionQueue, n: usize) -> Vec<WorkCompletion> {
    common::wait_n(cq, n, Duration::from_secs(10), "completions")
}

#[test]
fn send_lands_after_a_grh_and_the_reply_goes_back_by_an_ah_from_the_wc() {
    let (a, b) = pair();
    let msg: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 1) as u8).collect();
    a.mr.write_at(0, &msg).unwrap();
    b.qp.post_recv(&RecvWr::new(7, &[sge(&b.mr, 0, 4096)]))
        .unwrap();
    let ah = ah_to(&a, &b);
    let s = [sge(&a.mr, 0, msg.len() as u32)];
    a.qp.post_send(
        &SendWr::new(1, WrOpcode::SendWithImm { imm: 0xfeed }, &s)
            .signaled()
            .to(&ah, b.qp.qp_num(), QKEY),
    )
    .unwrap();
    let sent = wait(&a.cq, 1);
    assert_eq!(sent[0].status, WcStatus::Success);
    assert_eq!(sent[0].opcode, WcOpcode::Send);
    let got = wait(&b.cq, 1)[0];
    assert_eq!(got.status, WcStatus::Success, "{got:?}");
    assert_eq!(got.wr_id, 7);
    assert_eq!(got.opcode, WcOpcode::Recv);
    assert_eq!(got.byte_len as usize, GRH + msg.len());
    assert!(got.wc_flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
    assert_eq!(got.imm(), Some(0xfeed));
    assert_eq!(got.src_qp, a.qp.qp_num());
    assert_eq!(got.qp_num, b.qp.qp_num());
    let mut buf = vec![0u8; GRH + msg.len()];
    b.mr.read_at(0, &mut buf).unwrap();
    assert_eq!(&buf[GRH..], &msg[..]);
    // The GRH: for IPv4, 20 zero bytes, then the IPv4 header.
    let IpAddr::V4(src) = a.qp.local_gid().to_ip() else {
        panic!("the default device is IPv4")
    };
    assert_eq!(&buf[..20], &[0u8; 20]);
    assert_eq!(buf[20], 0x45);
    assert_eq!(buf[29], 17, "UDP");
    assert_eq!(&buf[32..36], &src.octets());

    // Answer the sender from the completion alone.
    let attr = AddressHandle::attr_from_wc(&b.ctx, &got, &buf[..GRH]).unwrap();
    assert_eq!(attr.dgid, a.qp.local_gid());
    let back = b.pd.create_ah_from_wc(&got, &buf[..GRH]).unwrap();
    a.qp.post_recv(&RecvWr::new(9, &[sge(&a.mr, 8192, 256)]))
        .unwrap();
    b.qp.post_send(
        &SendWr::inline(2, WrOpcode::Send, b"pong")
            .to(&back, got.src_qp, QKEY)
            .signaled(),
    )
    .unwrap();
    assert_eq!(wait(&b.cq, 1)[0].status, WcStatus::Success);
    let reply = wait(&a.cq, 1)[0];
    assert_eq!(reply.status, WcStatus::Success);
    assert_eq!(reply.byte_len as usize, GRH + 4);
    assert_eq!(reply.src_qp, b.qp.qp_num());
    let mut pong = [0u8; 4];
    a.mr.read_at(8192 + GRH, &mut pong).unwrap();
    assert_eq!(&pong, b"pong");

    // Without IBV_WC_GRH, or with a short or garbage GRH: EINVAL.
    let mut no_grh = got;
    no_grh.wc_flags = WcFlags::empty();
    let e = b.pd.create_ah_from_wc(&no_grh, &buf[..GRH]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let e = AddressHandle::attr_from_wc(&b.ctx, &got, &buf[..20]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let e = AddressHandle::attr_from_wc(&b.ctx, &got, &[0x11; GRH]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn wrong_qkey_and_missing_receive_wr_drop_silently() {
    let (a, b) = pair();
    let ah = ah_to(&a, &b);
    let dev = b.ctx.device();
    let before = dev.net_stats();
    // No receive WR posted: dropped, the sender still completes.
    a.qp.post_send(&SendWr::inline(1, WrOpcode::Send, b"lost").signaled().to(
        &ah,
        b.qp.qp_num(),
        QKEY,
    ))
    .unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    // Sent is not yet received: wait until the receiver dropped it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while dev.net_stats().ud_no_recv_wr == before.ud_no_recv_wr {
        assert!(Instant::now() < deadline, "the datagram never arrived");
        std::thread::sleep(Duration::from_millis(1));
    }
    b.qp.post_recv(&RecvWr::new(5, &[sge(&b.mr, 0, 256)]))
        .unwrap();
    // A wrong Q_Key: dropped.
    a.qp.post_send(
        &SendWr::inline(2, WrOpcode::Send, b"bad key")
            .signaled()
            .to(&ah, b.qp.qp_num(), QKEY ^ 1),
    )
    .unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    assert!(quiet(&b.cq, Duration::from_millis(200)).is_empty());
    let after = dev.net_stats();
    assert_eq!(after.ud_no_recv_wr - before.ud_no_recv_wr, 1);
    assert_eq!(after.qkey_violations - before.qkey_violations, 1);
    // A Q_Key with the high bit set in the WR sends the QP's own (QKEY).
    a.qp.post_send(
        &SendWr::inline(3, WrOpcode::Send, b"own key").signaled().to(
            &ah,
            b.qp.qp_num(),
            0x8000_0000,
        ),
    )
    .unwrap();
    let got = wait(&b.cq, 1)[0];
    assert_eq!((got.wr_id, got.status), (5, WcStatus::Success));
    assert_eq!(got.byte_len as usize, GRH + 7);
    assert_eq!(b.qp.state(), QpState::Rts);
}

#[test]
fn a_receive_buffer_without_room_for_the_grh_fails_with_loc_len_err() {
    let (a, b) = pair();
    let ah = ah_to(&a, &b);
    b.qp.post_recv(&RecvWr::new(1, &[sge(&b.mr, 0, 40 + 3)]))
        .unwrap();
    b.qp.post_recv(&RecvWr::new(2, &[sge(&b.mr, 256, 40 + 4)]))
        .unwrap();
    for i in 0..2 {
        a.qp.post_send(&SendWr::inline(i, WrOpcode::Send, b"four").to(&ah, b.qp.qp_num(), QKEY))
            .unwrap();
    }
    let got = wait(&b.cq, 2);
    assert_eq!((got[0].wr_id, got[0].status), (1, WcStatus::LocLenErr));
    assert_eq!((got[1].wr_id, got[1].status), (2, WcStatus::Success));
}

#[test]
fn ud_post_errors() {
    let (a, b) = pair();
    let ah = ah_to(&a, &b);
    let mtu = a.ctx.query_port(1).unwrap().active_mtu.bytes();
    let big = [sge(&a.mr, 0, mtu + 1)];
    let cases: Vec<(SendWr<'_>, &str)> = vec![
        (
            SendWr::new(1, WrOpcode::Send, &big).to(&ah, b.qp.qp_num(), QKEY),
            "beyond the MTU",
        ),
        (SendWr::inline(2, WrOpcode::Send, b"x"), "no destination"),
        (
            SendWr::inline(
                3,
                WrOpcode::RdmaWrite {
                    remote_addr: 0,
                    rkey: 1,
                },
                b"x",
            )
            .to(&ah, b.qp.qp_num(), QKEY),
            "a WRITE",
        ),
        (
            SendWr::inline(4, WrOpcode::Send, b"x").to(&ah, 1 << 24, QKEY),
            "a QPN beyond 24 bits",
        ),
    ];
    for (wr, what) in cases {
        let e = a.qp.post_send(&wr).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{what}: {e}");
    }
    // An AH of another PD.
    let other_pd = a.ctx.alloc_pd().unwrap();
    let foreign = other_pd
        .create_ah(&AhAttr {
            dgid: b.qp.local_gid(),
            ..AhAttr::default()
        })
        .unwrap();
    let e =
        a.qp.post_send(&SendWr::inline(5, WrOpcode::Send, b"x").to(&foreign, b.qp.qp_num(), QKEY))
            .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    // A PD with an AH cannot go; once the AH is destroyed it can.
    let other_pd = other_pd.dealloc().unwrap_err().into_inner();
    foreign.destroy().unwrap();
    other_pd.dealloc().unwrap();
    // Nothing was sent.
    assert!(quiet(&a.cq, Duration::from_millis(50)).is_empty());
}

#[test]
fn address_handle_attributes_are_checked() {
    let (a, b) = pair();
    let good = AhAttr {
        dgid: b.qp.local_gid(),
        ..AhAttr::default()
    };
    let ah = a.pd.create_ah(&good).unwrap();
    assert_eq!(ah.attr(), good);
    for bad in [
        AhAttr {
            sgid_index: 1,
            ..good
        },
        AhAttr {
            port_num: 2,
            ..good
        },
        AhAttr {
            dgid: rverbs::Gid::ZERO,
            ..good
        },
    ] {
        let e = a.pd.create_ah(&bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}");
    }
    // A device on the loopback default cannot reach another host: the
    // error says so and names the fix, for an AH and for an RC QP's path.
    let elsewhere = rverbs::Gid::from_ip("198.18.0.1".parse().unwrap());
    let e =
        a.pd.create_ah(&AhAttr {
            dgid: elsewhere,
            ..good
        })
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(e.detail(), Some(rverbs::ErrorDetail::Unreachable));
    assert!(e.to_string().contains("RVERBS_ADDR"), "{e}");
    let rc = a.pd.qp_builder(&a.cq, &a.cq).build().unwrap();
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    let init =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    rc.modify(&attr, init).unwrap();
    attr.qp_state = QpState::Rtr;
    attr.ah_attr.dgid = elsewhere;
    attr.dest_qp_num = 1;
    let rtr = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    let e = rc.modify(&attr, rtr).unwrap_err();
    assert_eq!(e.detail(), Some(rverbs::ErrorDetail::Unreachable), "{e}");
    assert!(e.to_string().contains("RVERBS_ADDR"), "{e}");
    assert_eq!(a.ctx.resources().ahs, 1);
    drop(ah);
    assert_eq!(a.ctx.resources().ahs, 0);
}

#[test]
fn many_datagrams_from_many_senders_arrive_with_their_sources() {
    let (a, b) = pair();
    // A second sender QP on `a`'s context.
    let a2 = ud_qp(&a.pd, &a.cq, QKEY);
    let ah = ah_to(&a, &b);
    const N: u64 = 30;
    for i in 0..2 * N {
        b.qp.post_recv(&RecvWr::new(i, &[sge(&b.mr, i * 128, 128)]))
            .unwrap();
    }
    for i in 0..N {
        for (k, qp) in [&a.qp, &a2].into_iter().enumerate() {
            let data = [(i as u8) ^ (k as u8 * 0x80); 16];
            qp.post_send(&SendWr::inline(i, WrOpcode::Send, &data).signaled().to(
                &ah,
                b.qp.qp_num(),
                QKEY,
            ))
            .unwrap();
        }
        // Keep the send queues short of full.
        wait(&a.cq, 2);
    }
    let got = wait(&b.cq, 2 * N as usize);
    let mut from = [0u64; 2];
    for wc in &got {
        assert_eq!(wc.status, WcStatus::Success);
        let k = usize::from(wc.src_qp == a2.qp_num());
        assert!(k == 1 || wc.src_qp == a.qp.qp_num());
        let mut byte = [0u8; 1];
        b.mr.read_at(wc.wr_id as usize * 128 + GRH, &mut byte)
            .unwrap();
        // Datagrams of one sender arrive in its order on loopback.
        assert_eq!(u64::from(byte[0] ^ (k as u8 * 0x80)), from[k]);
        from[k] += 1;
    }
    assert_eq!(from, [N, N]);
}

/// Multicast over loopback needs nothing but lo (IP_MULTICAST_IF picks it);
/// a host whose lo cannot carry multicast fails the join with a clear error.
#[test]
fn multicast_reaches_every_attached_qp_and_stops_after_detach() {
    let dev = &devices().unwrap()[0];
    let a = side(dev.open().unwrap());
    let b = side(dev.open().unwrap());
    let b2 = ud_qp(&b.pd, &b.cq, QKEY);
    let mgid = rverbs::Gid::from_ip("239.77.0.1".parse().unwrap());
    b.qp.attach_mcast(mgid, 0).unwrap();
    b2.attach_mcast(mgid, 0).unwrap();
    // Twice is a no-op; RC QPs and unicast GIDs are refused.
    b2.attach_mcast(mgid, 0).unwrap();
    let e = b2.attach_mcast(b.qp.local_gid(), 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    for (i, qp) in [&b.qp, &b2].into_iter().enumerate() {
        qp.post_recv(&RecvWr::new(i as u64, &[sge(&b.mr, i as u64 * 256, 256)]))
            .unwrap();
        qp.post_recv(&RecvWr::new(
            10 + i as u64,
            &[sge(&b.mr, 1024 + i as u64 * 256, 256)],
        ))
        .unwrap();
    }
    let group =
        a.pd.create_ah(&AhAttr {
            dgid: mgid,
            ..AhAttr::default()
        })
        .unwrap();
    a.qp.post_send(
        &SendWr::inline(1, WrOpcode::Send, b"to all")
            .signaled()
            .to(&group, 0xff_ffff, QKEY),
    )
    .unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    let mut got = wait(&b.cq, 2);
    got.sort_by_key(|wc| wc.qp_num);
    let mut qpns = [b.qp.qp_num(), b2.qp_num()];
    qpns.sort();
    for (wc, qpn) in got.iter().zip(qpns) {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        assert_eq!(wc.qp_num, qpn);
        assert_eq!(wc.src_qp, a.qp.qp_num());
        assert_eq!(wc.byte_len as usize, GRH + 6);
        let mut buf = [0u8; GRH + 6];
        b.mr.read_at(wc.wr_id as usize * 256, &mut buf).unwrap();
        assert_eq!(&buf[GRH..], b"to all");
        // The GRH names the group as the destination.
        assert_eq!(&buf[36..40], &[239, 77, 0, 1]);
    }
    // After detaching b2 only b gets the next one.
    b2.detach_mcast(mgid, 0).unwrap();
    let e = b2.detach_mcast(mgid, 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    a.qp.post_send(
        &SendWr::inline(2, WrOpcode::Send, b"second")
            .signaled()
            .to(&group, 0xff_ffff, QKEY),
    )
    .unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    let got = wait(&b.cq, 1);
    assert_eq!(got[0].qp_num, b.qp.qp_num());
    assert!(quiet(&b.cq, Duration::from_millis(100)).is_empty());
    // A unicast QPN to a group address reaches nobody.
    let before = dev.net_stats().rx_unknown_qp;
    a.qp.post_send(&SendWr::inline(3, WrOpcode::Send, b"x").signaled().to(
        &group,
        b.qp.qp_num(),
        QKEY,
    ))
    .unwrap();
    wait(&a.cq, 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while dev.net_stats().rx_unknown_qp == before {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(quiet(&b.cq, Duration::from_millis(50)).is_empty());
    // Destroying the QP detaches it: the device leaves the group.
    drop(b2);
    b.qp.detach_mcast(mgid, 0).unwrap();
}

#[test]
fn a_qp_attached_to_a_group_cannot_be_destroyed_until_detached() {
    let dev = &devices().unwrap()[0];
    let a = side(dev.open().unwrap());
    let mgid = rverbs::Gid::from_ip("239.77.0.2".parse().unwrap());
    a.qp.attach_mcast(mgid, 0).unwrap();
    let e = a.qp.destroy().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Busy);
    let qp = e.into_inner();
    qp.detach_mcast(mgid, 0).unwrap();
    qp.destroy().unwrap();
}

#[test]
fn sqd_holds_new_sends_until_rts_and_reports_drained_at_once() {
    let (a, b) = pair();
    let ah = ah_to(&a, &b);
    for i in 0..2 {
        b.qp.post_recv(&RecvWr::new(i, &[sge(&b.mr, i * 256, 256)]))
            .unwrap();
    }
    let attr = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    a.qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY)
        .unwrap();
    let ev = a
        .ctx
        .get_async_event_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("SQ_DRAINED");
    assert_eq!(ev.event_type(), rverbs::AsyncEventType::SqDrained);
    assert!(ev.is_for_qp(&a.qp));
    drop(ev);
    a.qp.post_send(&SendWr::inline(1, WrOpcode::Send, b"held").signaled().to(
        &ah,
        b.qp.qp_num(),
        QKEY,
    ))
    .unwrap();
    assert!(quiet(&a.cq, Duration::from_millis(100)).is_empty());
    assert!(quiet(&b.cq, Duration::from_millis(10)).is_empty());
    assert!(!a.qp.query().unwrap().sq_draining);
    let attr = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    a.qp.modify(&attr, QpAttrMask::STATE).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(wait(&b.cq, 1)[0].byte_len as usize, GRH + 4);
}

/// Datagrams from a sender that numbers its IPv4 IDs, as kernel Soft-RoCE
/// and RoCE NICs do (a receiving socket never sees the ID, yet the ICRC
/// covers it): scapy builds them, ICRC included, and a raw socket sends them
/// with counting IDs. Each is delivered and counted as solved; a
/// corrupt one is right for no ID and dropped, and so are one of another
/// partition, one for no QP, one of another transport, one above the MTU
/// and one for a QP in RESET, each counted by its reason. Needs root and
/// scapy (fails instead of skipping when `CI` is set).
#[test]
fn datagrams_with_counting_ip_ids_are_received_and_corrupt_ones_dropped() {
    let root = common::is_root();
    if !root {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs the tests as root"
        );
        eprintln!("skipping: a raw socket needs root");
        return;
    }
    let scapy = std::process::Command::new(common::PYTHON)
        .args(["-c", "import scapy.contrib.roce"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !scapy {
        assert!(std::env::var_os("CI").is_none(), "python3-scapy is missing");
        eprintln!("skipping: python3-scapy is missing");
        return;
    }
    let dev = rverbs::add_device(rverbs::DeviceConfig::loopback().named("counting-ids")).unwrap();
    let s = side(dev.open().unwrap());
    for i in 0..8u64 {
        s.qp.post_recv(&RecvWr::new(i, &[sge(&s.mr, i * 256, 256)]))
            .unwrap();
    }
    let IpAddr::V4(addr) = s.qp.local_gid().to_ip() else {
        panic!("the loopback device is IPv4")
    };
    let before = dev.net_stats();
    // Five good datagrams with IDs 0xfffe, 0xffff, 0, 1, 2 (wrapping, as a
    // counter does), then a sixth whose payload was changed after its
    // ICRC was computed, one of another partition (P_Key), one for a QP
    // that does not exist, an RC packet, one above the MTU, and one for a QP
    // in RESET: each dropped and counted by its reason.
    let script = r#"
import socket, struct, sys
from scapy.all import IP, UDP, Raw, raw
from scapy.contrib.roce import BTH
addr, qpn, qkey, idle = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
out = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
for k in range(11):
    bth = BTH(opcode=0x64, dqpn=qpn, psn=k)
    payload = b"id-%d" % k if k < 10 else b"id10"
    if k == 6:
        bth.pkey = 0x1234
    if k == 7:
        bth.dqpn = qpn ^ 0x800000
    if k == 8:
        bth.opcode = 0x04  # RC SEND_ONLY
    if k == 9:
        payload = bytes(4104)  # above the path MTU
    if k == 10:
        bth.dqpn = idle
    pkt = IP(src=addr, dst=addr, id=(0xfffe + k) & 0xffff, flags="DF") / \
        UDP(sport=49152, dport=4791, chksum=0) / \
        bth / Raw(struct.pack(">II", qkey, 0x4242) + payload)
    if k == 5:
        b = bytearray(raw(pkt))
        b[-6] ^= 0x01
        pkt = IP(bytes(b))
    out.sendto(raw(pkt), (addr, 0))
"#;
    let idle =
        s.pd.qp_builder(&s.cq, &s.cq)
            .qp_type(QpType::Ud)
            .build()
            .unwrap();
    common::run(
        std::path::Path::new(common::PYTHON),
        &[
            "-c",
            script,
            &addr.to_string(),
            &s.qp.qp_num().to_string(),
            &QKEY.to_string(),
            &idle.qp_num().to_string(),
        ],
    );
    let got = quiet(&s.cq, Duration::from_secs(2));
    assert_eq!(got.len(), 5, "{got:?}\n{:?}", dev.net_stats());
    for (k, wc) in got.iter().enumerate() {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        assert_eq!(wc.src_qp, 0x4242);
        assert_eq!(wc.byte_len as usize, GRH + 4);
        let mut payload = [0u8; 4];
        s.mr.read_at(wc.wr_id as usize * 256 + GRH, &mut payload)
            .unwrap();
        assert_eq!(&payload, format!("id-{k}").as_bytes());
    }
    assert!(
        quiet(&s.cq, Duration::from_millis(300)).is_empty(),
        "the corrupt datagram was delivered"
    );
    let after = dev.net_stats();
    // Every intact one but ID 0 (what an rverbs peer writes, checked at
    // once) had its ID solved for, those dropped after that too.
    assert_eq!(
        after.rx_ip_id_solved - before.rx_ip_id_solved,
        9,
        "{after:?}"
    );
    assert_eq!(after.rx_wrong_transport - before.rx_wrong_transport, 1);
    assert_eq!(after.rx_too_long - before.rx_too_long, 1);
    assert_eq!(after.rx_qp_not_receiving - before.rx_qp_not_receiving, 1);
    assert_eq!(after.rx_icrc_errors - before.rx_icrc_errors, 1, "{after:?}");
    assert_eq!(after.rx_bad_pkey - before.rx_bad_pkey, 1, "{after:?}");
    // ibv_query_port's violation counter shows it too.
    assert_eq!(s.ctx.query_port(1).unwrap().bad_pkey_cntr, 1);
    assert_eq!(after.rx_unknown_qp - before.rx_unknown_qp, 1, "{after:?}");
}

/// A UD receive reports the packet's L3 header type in `sl`, as mlx5 does
/// for RoCE (its CQE's L3 type: 2 = IPv4, 1 = IPv6, 0 = GRH); UCX's
/// `ud_verbs` reads it to know where the destination address lies in the
/// 40 bytes ahead of the payload. The device is IPv4 here; IPv6 is checked
/// in `processes.rs` (a device on `::1` needs a process of its own).
#[test]
fn ud_receive_reports_the_ip_version_in_sl_as_mlx5_does() {
    let (a, b) = pair();
    b.qp.post_recv(&RecvWr::new(1, &[sge(&b.mr, 0, 256)]))
        .unwrap();
    let ah = ah_to(&a, &b);
    a.qp.post_send(&SendWr::inline(2, WrOpcode::Send, b"ipv4").to(&ah, b.qp.qp_num(), QKEY))
        .unwrap();
    let got = wait(&b.cq, 1)[0];
    assert_eq!(got.status, WcStatus::Success, "{got:?}");
    assert_eq!(got.sl, rverbs::ROCE_L3_TYPE_IPV4, "{got:?}");
    assert_eq!(rverbs::ROCE_L3_TYPE_IPV4, 2);
    // The AH made from the completion carries it on, as rdma-core's
    // ibv_init_ah_from_wc copies wc->sl.
    let mut grh = [0u8; GRH];
    b.mr.read_at(0, &mut grh).unwrap();
    let attr = AddressHandle::attr_from_wc(&b.ctx, &got, &grh).unwrap();
    assert_eq!(attr.sl, got.sl);
}

/// The same over IPv6: a device of its own on `::1` reports `sl` 1 and
/// fills all 40 bytes with the IPv6 header. Skipped where loopback has no
/// `::1` (unless `CI` is set) or another process holds its port.
#[test]
fn ud_receive_over_ipv6_reports_ipv6_in_sl() {
    let lo6 = std::net::Ipv6Addr::LOCALHOST;
    if std::net::UdpSocket::bind((lo6, 0)).is_err() {
        assert!(std::env::var_os("CI").is_none(), "CI hosts have ::1");
        eprintln!("skipped: no ::1 on this host");
        return;
    }
    let config = rverbs::DeviceConfig {
        name: Some("ud-ipv6".into()),
        addr: rverbs::DeviceAddr::Ip(IpAddr::V6(lo6)),
    };
    let dev = match rverbs::add_device(config) {
        Ok(d) => d,
        Err(e) if e.to_string().contains("taken by another process") => {
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let (a, b) = (side(dev.open().unwrap()), side(dev.open().unwrap()));
    b.qp.post_recv(&RecvWr::new(1, &[sge(&b.mr, 0, 256)]))
        .unwrap();
    let ah = ah_to(&a, &b);
    a.qp.post_send(&SendWr::inline(2, WrOpcode::Send, b"ipv6").to(&ah, b.qp.qp_num(), QKEY))
        .unwrap();
    let got = wait(&b.cq, 1)[0];
    assert_eq!(got.status, WcStatus::Success, "{got:?}");
    assert_eq!(got.sl, rverbs::ROCE_L3_TYPE_IPV6, "{got:?}");
    assert_eq!(rverbs::ROCE_L3_TYPE_IPV6, 1);
    let mut grh = [0u8; GRH];
    b.mr.read_at(0, &mut grh).unwrap();
    assert_eq!(grh[0] >> 4, 6, "an IPv6 header: {grh:?}");
    assert_eq!(&grh[24..40], &lo6.octets(), "its destination");
}

/// A UD receive into foreign memory its registrant unmapped while still
/// registered (UCX frees its UD receive pool before it destroys the QP, and
/// a late datagram arrived then): the receive completes with a local
/// protection error and the process lives on, where the copy used to take
/// it down with SIGSEGV on the engine thread. (The page is replaced by an
/// inaccessible one rather than unmapped: another test thread's allocation
/// could otherwise be given the freed address, and take the datagram.)
#[test]
fn a_ud_receive_into_unmapped_foreign_memory_fails_without_a_crash() {
    use nix::libc;
    let (a, b) = pair();
    let ah = ah_to(&a, &b);
    // SAFETY: sysconf has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    // SAFETY: a fresh anonymous mapping; no existing memory is affected.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(m, libc::MAP_FAILED);
    let p: *mut u8 = m.cast();
    // SAFETY: the page stays registered while the test plays the careless
    // program: it is unmapped below, which is the point.
    let mr = unsafe { b.pd.reg_mr_raw(p, page, p as u64, AccessFlags::LOCAL_WRITE) }.unwrap();
    b.qp.post_recv(&RecvWr::new(7, &[sge(&mr, 0, page as u32)]))
        .unwrap();
    // SAFETY: our own page, replaced in place by one that cannot be read or
    // written (as good as unmapped, but the address stays taken); nothing
    // of ours references it any more.
    let gone = unsafe {
        libc::mmap(
            m,
            page,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(gone, m);
    a.qp.post_send(&SendWr::inline(1, WrOpcode::Send, b"late").to(&ah, b.qp.qp_num(), QKEY))
        .unwrap();
    let wc = wait(&b.cq, 1)[0];
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::LocProtErr));
    drop(mr);
    // SAFETY: the inaccessible page is ours and no longer registered.
    assert_eq!(unsafe { libc::munmap(m, page) }, 0);
}
