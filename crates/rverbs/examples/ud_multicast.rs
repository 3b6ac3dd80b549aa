//! Unreliable datagrams to a multicast group, in one process.
//!
//! ```text
//! cargo run --example ud_multicast                    # group 239.1.2.3, 3 messages
//! cargo run --example ud_multicast -- 239.7.7.7 10    # another group, 10 messages
//! ```
//!
//! Two receiving UD QPs attach to a multicast group (`ibv_attach_mcast`: on
//! RoCEv2 the device joins the IP multicast group), a third QP sends datagrams
//! to the group's GID (remote QP number 0xFFFFFF), and each receiver gets every
//! datagram, behind the 40-byte GRH that names the sender and the group. Over
//! loopback this needs no configuration; on a network, the hosts' interfaces
//! must carry multicast (attach fails with the host's error otherwise). Other
//! processes, or hosts, attached to the same group receive the datagrams too.

use std::net::IpAddr;

use rverbs::{
    AccessFlags, AhAttr, Gid, ProtectionDomain, QpAttr, QpAttrMask, QpState, QpType, QueuePair,
    RecvWr, SendWr, Sge, WcStatus, WorkCompletion, WrOpcode,
};

/// The Q_Key every QP of the example uses (a datagram's Q_Key must match the
/// receiver's).
const QKEY: u32 = 0x1111_1111;
/// The remote QP number that means "every QP attached to the group".
const MULTICAST_QPN: u32 = 0xff_ffff;
/// The Global Route Header in front of every received UD payload.
const GRH: usize = 40;
/// Room for one datagram's payload.
const SLOT: usize = 256;

/// A UD QP on `cq`, brought to RTS (UD needs no peer: INIT with its port and
/// Q_Key, then RTR, then RTS).
fn ud_qp(pd: &ProtectionDomain, cq: &rverbs::CompletionQueue) -> rverbs::Result<QueuePair> {
    let qp = pd.qp_builder(cq, cq).qp_type(QpType::Ud).build()?;
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey: QKEY,
        ..QpAttr::default()
    };
    qp.modify(
        &attr,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    )?;
    attr.qp_state = QpState::Rtr;
    qp.modify(&attr, QpAttrMask::STATE)?;
    attr.qp_state = QpState::Rts;
    qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::SQ_PSN)?;
    Ok(qp)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let group: IpAddr = args.next().as_deref().unwrap_or("239.1.2.3").parse()?;
    let count: usize = args.next().as_deref().unwrap_or("3").parse()?;
    if !group.is_multicast() {
        return Err(format!("{group} is not a multicast address").into());
    }

    let device = rverbs::devices()?
        .into_iter()
        .next()
        .ok_or("no rverbs device")?;
    let ctx = device.open()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64)?;
    let sender = ud_qp(&pd, &cq)?;
    let receivers = [ud_qp(&pd, &cq)?, ud_qp(&pd, &cq)?];

    // One buffer: the message to send at 0, then a slot per receive (each
    // receive's buffer holds the GRH, then the payload).
    let slots = receivers.len() * count;
    let mr = pd.alloc_mr(SLOT * (1 + slots), AccessFlags::LOCAL_WRITE)?;
    let slot_sge = |slot: usize| Sge {
        addr: mr.iova() + (SLOT * (1 + slot)) as u64,
        length: SLOT as u32,
        lkey: mr.lkey(),
    };

    // The group's GID (an IPv4 group as an IPv4-mapped GID); attaching joins it.
    let mgid = Gid::from_ip(group);
    for (r, qp) in receivers.iter().enumerate() {
        qp.attach_mcast(mgid, 0)?;
        for i in 0..count {
            let slot = r * count + i;
            qp.post_recv(&RecvWr::new(slot as u64, &[slot_sge(slot)]))?;
        }
    }
    println!(
        "QPs {:#x} and {:#x} joined {group}",
        receivers[0].qp_num(),
        receivers[1].qp_num()
    );

    // Send to the group: an address handle for its GID, remote QPN 0xFFFFFF.
    let to_group = pd.create_ah(&AhAttr {
        dgid: mgid,
        ..AhAttr::default()
    })?;
    for i in 0..count {
        let text = format!("datagram {i} to {group}");
        mr.write_at(0, text.as_bytes())?;
        let data = [Sge {
            addr: mr.iova(),
            length: text.len() as u32,
            lkey: mr.lkey(),
        }];
        let wr = SendWr::new(u64::MAX - i as u64, WrOpcode::Send, &data)
            .signaled()
            .to(&to_group, MULTICAST_QPN, QKEY);
        sender.post_send(&wr)?;
        // Wait for the send's completion (then the buffer may be reused)
        // and for each receiver's receive of this datagram, in any order.
        let (mut sent, mut receives) = (false, 0);
        let mut wc = [WorkCompletion::default(); 4];
        while !sent || receives < receivers.len() {
            let n = cq.poll(&mut wc)?;
            for done in &wc[..n] {
                assert_eq!(done.status, WcStatus::Success, "{done:?}");
                if done.qp_num == sender.qp_num() {
                    sent = true;
                } else {
                    received(&mr, &receivers, done)?;
                    receives += 1;
                }
            }
        }
    }

    for qp in &receivers {
        qp.detach_mcast(mgid, 0)?;
    }
    println!("{count} datagrams, each received by both QPs");
    Ok(())
}

/// Prints what the receive `wc` got: the payload, the sender's QP number,
/// and the source and destination addresses its GRH carries.
fn received(
    mr: &rverbs::MemoryRegion,
    receivers: &[QueuePair],
    wc: &WorkCompletion,
) -> rverbs::Result<()> {
    assert!(
        receivers.iter().any(|qp| qp.qp_num() == wc.qp_num),
        "{wc:?}"
    );
    let mut buf = vec![0u8; wc.byte_len as usize];
    mr.read_at(SLOT * (1 + wc.wr_id as usize), &mut buf)?;
    let (grh, payload) = buf.split_at(GRH);
    let (from, to) = grh_addresses(grh);
    println!(
        "QP {:#x} got {:?} from QP {:#x} at {from} (to {to})",
        wc.qp_num,
        String::from_utf8_lossy(payload),
        wc.src_qp,
    );
    Ok(())
}

/// The source and destination of a received datagram, from the 40 bytes in
/// front of its payload: over IPv4, 20 zero bytes then the IPv4 header (as
/// RoCEv2 NICs write it); over IPv6, the IPv6 header, which is the GRH.
fn grh_addresses(grh: &[u8]) -> (IpAddr, IpAddr) {
    if grh[..20].iter().all(|&b| b == 0) {
        let ip = &grh[20..40];
        let v4 = |b: &[u8]| IpAddr::from(<[u8; 4]>::try_from(b).expect("4 bytes"));
        (v4(&ip[12..16]), v4(&ip[16..20]))
    } else {
        let v6 = |b: &[u8]| IpAddr::from(<[u8; 16]>::try_from(b).expect("16 bytes"));
        (v6(&grh[8..24]), v6(&grh[24..40]))
    }
}
