//! The README's RC example, verbatim between the markers, so it keeps
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

/// The README block and this file agree (modulo indentation).
#[test]
fn readme_block_matches() {
    let readme = include_str!("../../../README.md");
    let this = include_str!("readme.rs");
    let block = readme
        .split("```rust\n")
        .find(|b| b.contains("qp_builder"))
        .and_then(|b| b.split("```").next())
        .expect("the README's RC example");
    let ours: String = this
        .split("// README begin\n")
        .nth(1)
        .and_then(|s| s.split("    // README end").next())
        .expect("markers")
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(block.trim(), ours.trim());
}
