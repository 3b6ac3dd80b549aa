//! The README's examples (RC, UD, rdma_cm), verbatim between the markers, so it keeps
//! compiling and working.

#[test]
fn readme_rc_example() -> rverbs::Result<()> {
    // README begin
    use rverbs::cm::{ConnectOptions, Endpoint};
    use rverbs::{AccessFlags, RecvWr, SendWr, Sge, WorkCompletion, WrOpcode};

    let device = &rverbs::devices()?[0];
    let (a, b) = (device.open()?, device.open()?);
    let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
    let (cq_a, cq_b) = (a.create_cq(64)?, b.create_cq(64)?);
    let qp_a = pd_a.qp_builder(&cq_a, &cq_a).build()?;
    let qp_b = pd_b.qp_builder(&cq_b, &cq_b).build()?;
    let mr_a = pd_a.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
    let mr_b = pd_b.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;

    let (ea, eb) = (
        Endpoint::for_qp(&qp_a),
        Endpoint::for_qp(&qp_b).with_buffer(&mr_b),
    );
    qp_a.connect(ea.psn, &eb, &ConnectOptions::default())?;
    qp_b.connect(eb.psn, &ea, &ConnectOptions::default())?;

    mr_a.write_at(0, b"hello, RDMA")?;
    let sge = |mr: &rverbs::MemoryRegion| Sge {
        addr: mr.iova(),
        length: 11,
        lkey: mr.lkey(),
    };
    qp_b.post_recv(&RecvWr::new(1, &[sge(&mr_b)]))?;
    qp_a.post_send(&SendWr::new(2, WrOpcode::Send, &[sge(&mr_a)]).signaled())?;
    let write = WrOpcode::RdmaWrite {
        remote_addr: eb.addr + 100,
        rkey: eb.rkey,
    };
    qp_a.post_send(&SendWr::new(3, write, &[sge(&mr_a)]).signaled())?;

    let mut wc = [WorkCompletion::default(); 4];
    let mut done = 0;
    while done < 2 {
        done += cq_a.poll(&mut wc[done..])?; // polling drives the device's progress
    }
    // README end

    // The example really did what it says.
    assert!(wc[..2]
        .iter()
        .all(|w| w.status == rverbs::WcStatus::Success));
    let mut got = [0u8; 11];
    mr_b.read_at(0, &mut got)?;
    assert_eq!(&got, b"hello, RDMA", "the SEND landed");
    mr_b.read_at(100, &mut got)?;
    assert_eq!(&got, b"hello, RDMA", "the WRITE landed");
    let mut recv = [WorkCompletion::default(); 1];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while cq_b.poll(&mut recv)? == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no receive completion"
        );
    }
    assert_eq!(recv[0].byte_len, 11);
    Ok(())
}

#[test]
fn readme_ud_example() -> rverbs::Result<()> {
    // README UD begin
    use rverbs::{AccessFlags, AhAttr, QpAttr, QpAttrMask, QpState, QpType};
    use rverbs::{RecvWr, SendWr, Sge, WorkCompletion, WrOpcode};

    let device = &rverbs::devices()?[0];
    let ctx = device.open()?;
    let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(64)?);
    let qkey = 0x1111_1111;
    let ud_qp = || -> rverbs::Result<rverbs::QueuePair> {
        let qp = pd.qp_builder(&cq, &cq).qp_type(QpType::Ud).build()?;
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey,
            ..QpAttr::default()
        };
        let init = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
        qp.modify(&attr, init)?;
        attr.qp_state = QpState::Rtr;
        qp.modify(&attr, QpAttrMask::STATE)?;
        attr.qp_state = QpState::Rts;
        qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::SQ_PSN)?;
        Ok(qp)
    };
    let (tx, rx) = (ud_qp()?, ud_qp()?);
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
    mr.write_at(0, b"datagram")?;
    let at = |offset: u64, length: u32| Sge {
        addr: mr.iova() + offset,
        length,
        lkey: mr.lkey(),
    };
    // A UD receive buffer starts with the 40-byte GRH.
    rx.post_recv(&RecvWr::new(1, &[at(1024, 40 + 8)]))?;
    let ah = pd.create_ah(&AhAttr {
        dgid: rx.local_gid(),
        ..AhAttr::default()
    })?;
    let data = [at(0, 8)];
    tx.post_send(
        &SendWr::new(2, WrOpcode::Send, &data)
            .signaled()
            .to(&ah, rx.qp_num(), qkey),
    )?;

    let mut wc = [WorkCompletion::default(); 2];
    let mut done = 0;
    while done < 2 {
        done += cq.poll(&mut wc[done..])?;
    }
    // The receive names its sender (src_qp, and the GRH): answer it.
    let recv = wc
        .iter()
        .find(|w| w.qp_num == rx.qp_num())
        .expect("received");
    let mut grh = [0u8; 40];
    mr.read_at(1024, &mut grh)?;
    let back = pd.create_ah_from_wc(recv, &grh)?;
    // README UD end

    assert!(wc.iter().all(|w| w.status == rverbs::WcStatus::Success));
    assert_eq!(recv.byte_len, 40 + 8);
    assert_eq!(recv.src_qp, tx.qp_num());
    let mut got = [0u8; 8];
    mr.read_at(1024 + 40, &mut got)?;
    assert_eq!(&got, b"datagram");
    assert_eq!(back.attr().dgid, tx.local_gid());
    Ok(())
}

#[test]
fn readme_cm_example() -> rverbs::Result<()> {
    // README CM begin
    use rverbs::cm::{CmEventKind, CmId, ConnParam, EventChannel, PortSpace};

    // The passive side listens on port 20079 of every local address.
    let server_events = EventChannel::new()?;
    let listener = CmId::new(&server_events, PortSpace::Tcp)?;
    listener.bind_addr("0.0.0.0:20079".parse().unwrap())?;
    listener.listen(16)?;

    // The active side (here in the same process; another process or host alike).
    let client_events = EventChannel::new()?;
    let client = CmId::new(&client_events, PortSpace::Tcp)?;
    client.resolve_addr(None, "127.0.0.1:20079".parse().unwrap())?;
    assert_eq!(client_events.get_event()?.kind, CmEventKind::AddrResolved);
    client.resolve_route()?;
    assert_eq!(client_events.get_event()?.kind, CmEventKind::RouteResolved);
    let ctx = client.device().expect("resolved").open()?;
    let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(64)?);
    let qp = pd.qp_builder(&cq, &cq).build()?;
    client.prepare_qp(&qp)?; // INIT, as rdma_create_qp leaves it: post receives now
    let hello = ConnParam {
        private_data: b"hello".to_vec(),
        ..ConnParam::default()
    };
    client.connect(Some(&qp), &hello)?;

    // The request brings a new id; accepting brings its QP to RTS.
    let request = server_events.get_event()?;
    assert_eq!(request.kind, CmEventKind::ConnectRequest);
    let conn = request.id;
    let sctx = conn.device().expect("a request has its device").open()?;
    let (spd, scq) = (sctx.alloc_pd()?, sctx.create_cq(64)?);
    let sqp = spd.qp_builder(&scq, &scq).build()?;
    conn.accept(Some(&sqp), &ConnParam::default())?;

    // ESTABLISHED on both sides: both QPs are in RTS, connected to each other.
    assert_eq!(client_events.get_event()?.kind, CmEventKind::Established);
    assert_eq!(server_events.get_event()?.kind, CmEventKind::Established);
    client.disconnect()?; // the QP goes to ERR; DISCONNECTED on both sides
                          // README CM end

    // The example really did what it says.
    use rverbs::QpState;
    assert_eq!(client_events.get_event()?.kind, CmEventKind::Disconnected);
    assert_eq!(server_events.get_event()?.kind, CmEventKind::Disconnected);
    assert_eq!(qp.state(), QpState::Err);
    assert_eq!(sqp.state(), QpState::Err, "the peer's DREQ moved it to ERR");
    Ok(())
}

/// The README's blocks and this file agree (modulo indentation).
#[test]
fn readme_block_matches() {
    check_block("qp_builder", "README");
    check_block("QpType::Ud", "README UD");
    check_block("CmId::new", "README CM");
}

fn check_block(keyword: &str, marker: &str) {
    let readme = include_str!("../../../README.md");
    let this = include_str!("readme.rs");
    let block = readme
        .split("```rust\n")
        .find(|b| b.contains(keyword))
        .and_then(|b| b.split("```").next())
        .expect("the README's example");
    let ours: String = this
        .split(&format!("// {marker} begin\n"))
        .nth(1)
        .and_then(|s| s.split(&format!("    // {marker} end")).next())
        .expect("markers")
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(block.trim(), ours.trim());
}
