//! Error paths and lifetimes of the object verbs: CQs, PDs, MRs, accounting.

use rverbs::{
    devices, AccessFlags, Context, DeviceConfig, ErrorKind, MrBuffer, Rereg, ResourceKind,
    WorkCompletion,
};

fn ctx() -> Context {
    devices().unwrap()[0].open().unwrap()
}

// ---- CQ ----

#[test]
fn cq_size_is_checked_against_max_cqe() {
    let ctx = ctx();
    let max = ctx.query_device().unwrap().max_cqe;
    for bad in [0, max + 1, u32::MAX] {
        let e = ctx.create_cq(bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "cqe {bad}");
        assert!(e.message().contains("max_cqe"), "{e}");
    }
    let cq = ctx.create_cq(max).unwrap();
    assert_eq!(cq.cqe(), max);
}

#[test]
fn cq_comp_vector_must_exist() {
    let ctx = ctx();
    let n = ctx.num_comp_vectors();
    ctx.cq_builder().comp_vector(n - 1).build().unwrap();
    let e = ctx.cq_builder().comp_vector(n).build().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("num_comp_vectors"), "{e}");
}

#[test]
fn cq_resize_and_empty_poll() {
    let ctx = ctx();
    let cq = ctx.cq_builder().cqe(8).user_data(5).build().unwrap();
    assert_eq!((cq.user_data(), cq.comp_vector()), (5, 0));
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(cq.poll(&mut wc).unwrap(), 0);
    assert_eq!(cq.poll(&mut []).unwrap(), 0);
    cq.resize(100).unwrap();
    assert_eq!(cq.cqe(), 100);
    let max = ctx.query_device().unwrap().max_cqe;
    assert_eq!(cq.resize(0).unwrap_err().kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        cq.resize(max + 1).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(cq.cqe(), 100, "a refused resize changes nothing");
    cq.req_notify(true).unwrap();
    cq.req_notify(false).unwrap();
    cq.destroy().unwrap();
}

#[test]
fn cq_limit_is_enforced_with_enomem() {
    let dev = rverbs::add_device(DeviceConfig::loopback().named("limit-cq")).unwrap();
    let ctx = dev.open().unwrap();
    let max = ctx.query_device().unwrap().max_cq;
    let cqs: Vec<_> = (0..max).map(|_| ctx.create_cq(1).unwrap()).collect();
    let e = ctx.create_cq(1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory);
    assert!(e.message().contains("max_cq"), "{e}");
    drop(cqs);
    ctx.create_cq(1).unwrap();
    dev.disassociate();
}

// ---- PD ----

#[test]
fn pd_dealloc_is_busy_while_an_mr_uses_it() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(16, AccessFlags::empty()).unwrap();
    let e = pd.dealloc().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Busy);
    assert!(e.error().message().contains("still use PD"), "{e}");
    let pd = e.into_inner();
    // Still usable after the refusal.
    let mr2 = pd.alloc_mr(16, AccessFlags::empty()).unwrap();
    drop(mr);
    mr2.dereg().unwrap();
    pd.dealloc().unwrap();
    assert_eq!(ctx.resources().total(), 0);
}

#[test]
fn pd_limit_is_enforced_with_enomem() {
    let dev = rverbs::add_device(DeviceConfig::loopback().named("limit-pd")).unwrap();
    let ctx = dev.open().unwrap();
    let max = ctx.query_device().unwrap().max_pd;
    let pds: Vec<_> = (0..max).map(|_| ctx.alloc_pd().unwrap()).collect();
    assert_eq!(ctx.alloc_pd().unwrap_err().kind(), ErrorKind::OutOfMemory);
    drop(pds);
    ctx.alloc_pd().unwrap();
    dev.disassociate();
}

// ---- MR ----

#[test]
fn access_flags_are_validated_as_libibverbs_does() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    for bad in [
        AccessFlags::REMOTE_WRITE,
        AccessFlags::REMOTE_ATOMIC,
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        AccessFlags::from_bits_retain(1 << 12),
    ] {
        let e = pd.reg_mr(vec![0u8; 64], bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}");
        assert_eq!(e.into_inner().len(), 64, "the buffer comes back");
    }
    for unsupported in [AccessFlags::ON_DEMAND, AccessFlags::FLUSH_GLOBAL] {
        let e = pd
            .reg_mr(vec![0u8; 64], AccessFlags::LOCAL_WRITE | unsupported)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotSupported);
    }
    // Remote read alone needs no local write; optional flags are dropped.
    let mr = pd
        .reg_mr(
            vec![0u8; 64],
            AccessFlags::REMOTE_READ | AccessFlags::RELAXED_ORDERING,
        )
        .unwrap();
    assert_eq!(mr.access(), AccessFlags::REMOTE_READ);
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    assert_eq!(pd.alloc_mr(8, all).unwrap().access(), all);
}

#[test]
fn registration_arguments_are_checked() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let e = pd.reg_mr(Vec::new(), AccessFlags::empty()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.error().message().contains("length is 0"));
    let buf = MrBuffer::zeroed(8192);
    let addr = buf.as_ptr() as u64;
    let e = pd
        .reg_mr_iova(buf, addr + 1, AccessFlags::empty())
        .unwrap_err();
    assert!(
        e.error().message().contains("offset within a 4 KiB page"),
        "{e}"
    );
    let buf = e.into_inner();
    let mr = pd
        .reg_mr_iova(buf, 0x7000_0000_0000 | (addr & 0xfff), AccessFlags::empty())
        .unwrap();
    assert_eq!(mr.iova(), 0x7000_0000_0000 | (addr & 0xfff));
    assert_eq!(mr.addr(), addr);
    // SAFETY: never dereferenced: the NULL pointer is refused.
    let e = unsafe { pd.reg_mr_raw(std::ptr::null_mut(), 8, 0, AccessFlags::empty()) };
    assert_eq!(e.unwrap_err().kind(), ErrorKind::InvalidArgument);
}

#[test]
fn a_large_allocated_mr_keeps_its_bytes_through_registration_and_back() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    // 1 MiB and more live on 2 MiB-aligned huge-page mappings of their own.
    let len = (3 << 20) + 100;
    let mr = pd.alloc_mr(len, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(mr.len(), len);
    assert_eq!(mr.addr() % (2 << 20), 0, "{:#x}", mr.addr());
    let tail: Vec<u8> = (0..200u32).map(|i| i as u8).collect();
    mr.write_at(len - 200, &tail).unwrap();
    assert!(mr.write_at(len - 199, &tail).is_err());
    let mut buf = mr.dereg().unwrap().unwrap();
    assert_eq!(buf.len(), len);
    assert_eq!(&buf[len - 200..], &tail[..]);
    assert!(buf[..len - 200].iter().all(|&b| b == 0));
    // Handed back, it registers again as it is, and a copy is equal.
    buf[0] = 9;
    let copy = buf.clone();
    assert_eq!(copy, buf);
    let mr = pd.reg_mr(buf, AccessFlags::empty()).unwrap();
    let mut first = [0u8; 1];
    mr.read_at(0, &mut first).unwrap();
    assert_eq!(first, [9]);
    let back = mr.dereg().unwrap().unwrap().into_vec();
    assert_eq!(back, copy.into_vec());
}

#[test]
fn read_at_write_at_copy_and_check_bounds() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd
        .reg_mr(b"0123456789".to_vec(), AccessFlags::empty())
        .unwrap();
    assert_eq!(mr.len(), 10);
    let mut out = [0u8; 4];
    mr.read_at(3, &mut out).unwrap();
    assert_eq!(&out, b"3456");
    mr.write_at(8, b"XY").unwrap();
    for (off, len) in [(7usize, 4usize), (10, 1), (usize::MAX, 1)] {
        let e = mr.read_at(off, &mut vec![0; len]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{off}+{len}");
        assert_eq!(
            mr.write_at(off, &vec![0; len]).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }
    mr.read_at(10, &mut []).unwrap();
    assert_eq!(mr.dereg().unwrap().unwrap().into_vec(), b"01234567XY");
}

#[test]
fn foreign_memory_is_read_and_written_in_place() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let mut backing = vec![7u8; 256];
    let ptr = backing.as_mut_ptr();
    // SAFETY: `backing` outlives the MR (deregistered below) and is not
    // touched through references while registered.
    let mr = unsafe { pd.reg_mr_raw(ptr, 256, ptr as u64, AccessFlags::LOCAL_WRITE) }.unwrap();
    assert_eq!(mr.addr(), ptr as u64);
    mr.write_at(10, b"abc").unwrap();
    // SAFETY: nothing writes the MR while the slice lives.
    assert_eq!(unsafe { &mr.as_slice()[9..14] }, &[7, b'a', b'b', b'c', 7]);
    assert!(
        mr.dereg().unwrap().is_none(),
        "foreign memory stays the caller's"
    );
    assert_eq!(&backing[10..13], b"abc");
}

#[test]
fn rereg_keeps_the_keys_for_access_and_pd_and_changes_them_for_translation() {
    let ctx = ctx();
    let pd1 = ctx.alloc_pd().unwrap();
    let pd2 = ctx.alloc_pd().unwrap();
    let mut mr = pd1.reg_mr(vec![1u8; 32], AccessFlags::LOCAL_WRITE).unwrap();
    let key0 = mr.lkey();

    assert!(mr
        .rereg(Rereg::new().access(AccessFlags::REMOTE_READ))
        .unwrap()
        .is_none());
    assert_eq!(mr.access(), AccessFlags::REMOTE_READ);
    // A peer's cached rkey still names the MR (as on rxe and mlx5).
    assert_eq!(mr.lkey(), key0);
    assert_eq!(mr.lkey(), mr.rkey());

    mr.rereg(Rereg::new().pd(&pd2)).unwrap();
    assert_eq!(mr.pd_handle(), pd2.handle());
    assert_eq!(mr.lkey(), key0);
    // pd1 is free now, pd2 is in use.
    pd1.dealloc().unwrap();
    let pd2 = pd2.dealloc().unwrap_err().into_inner();

    let old = mr
        .rereg(
            Rereg::new()
                .memory(vec![9u8; 64])
                .access(AccessFlags::LOCAL_WRITE),
        )
        .unwrap()
        .unwrap();
    assert_eq!(old.into_vec(), vec![1u8; 32]);
    // New memory, new keys: the old rkey reaches nothing.
    assert_ne!(mr.lkey(), key0);
    assert_eq!(mr.lkey(), mr.rkey());
    assert_eq!(mr.len(), 64);
    assert_eq!(mr.iova(), mr.addr());
    let mut b = [0u8; 2];
    mr.read_at(62, &mut b).unwrap();
    assert_eq!(b, [9, 9]);
    drop(mr);
    pd2.dealloc().unwrap();
}

#[test]
fn refused_rereg_changes_nothing_and_returns_the_request() {
    let ctx = ctx();
    let other_ctx = devices().unwrap()[0].open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let foreign_pd = other_ctx.alloc_pd().unwrap();
    let mut mr = pd.reg_mr(vec![3u8; 16], AccessFlags::LOCAL_WRITE).unwrap();
    let key = mr.lkey();

    let e = mr.rereg(Rereg::new()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let e = mr.rereg(Rereg::new().pd(&foreign_pd)).unwrap_err();
    assert!(e.error().message().contains("another context"), "{e}");
    let e = mr
        .rereg(
            Rereg::new()
                .memory(vec![5u8; 8])
                .access(AccessFlags::REMOTE_WRITE),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        e.into_inner().into_buffer().unwrap().into_vec(),
        vec![5u8; 8]
    );
    let e = mr.rereg(Rereg::new().memory(Vec::new())).unwrap_err();
    assert!(e.error().message().contains("length is 0"), "{e}");
    // SAFETY: never dereferenced: the NULL pointer is refused.
    let e = mr
        .rereg(unsafe { Rereg::new().foreign_memory(std::ptr::null_mut(), 8) })
        .unwrap_err();
    assert!(e.error().message().contains("address is NULL"), "{e}");

    assert_eq!(mr.lkey(), key);
    assert_eq!(mr.access(), AccessFlags::LOCAL_WRITE);
    assert_eq!(mr.len(), 16);
    assert_eq!(mr.pd_handle(), pd.handle());
}

#[test]
fn mr_limit_is_enforced_with_enomem() {
    let dev = rverbs::add_device(DeviceConfig::loopback().named("limit-mr")).unwrap();
    let ctx = dev.open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let max = ctx.query_device().unwrap().max_mr;
    let mrs: Vec<_> = (0..max)
        .map(|_| pd.alloc_mr(1, AccessFlags::empty()).unwrap())
        .collect();
    let e = pd.reg_mr(vec![1u8], AccessFlags::empty()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory);
    assert_eq!(e.into_inner().into_vec(), vec![1u8]);
    drop(mrs);
    pd.alloc_mr(1, AccessFlags::empty()).unwrap();
    dev.disassociate();
}

// ---- accounting ----

#[test]
fn resources_count_every_live_object() {
    let ctx = ctx();
    assert_eq!(ctx.resources().total(), 0);
    let ch = ctx.create_comp_channel().unwrap();
    let cq1 = ctx.cq_builder().channel(&ch).build().unwrap();
    let cq2 = ctx.create_cq(4).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mrs: Vec<_> = (0..3)
        .map(|_| pd.alloc_mr(8, AccessFlags::empty()).unwrap())
        .collect();
    let r = ctx.resources();
    assert_eq!(
        (r.comp_channels, r.cqs, r.pds, r.mrs, r.qps, r.srqs, r.ahs),
        (1, 2, 1, 3, 0, 0, 0)
    );
    let live = ctx.live_resources();
    assert_eq!(live.len(), 7);
    assert!(live
        .iter()
        .any(|l| l.kind == ResourceKind::Cq && l.handle == cq2.handle()));
    assert!(live
        .iter()
        .any(|l| l.kind == ResourceKind::Mr && l.handle == mrs[1].handle()));
    drop(mrs);
    cq2.destroy().unwrap();
    assert_eq!(
        ctx.resources().to_string(),
        "1 PD, 1 CQ, 1 completion channel"
    );
    drop((cq1, ch, pd));
    assert_eq!(ctx.resources().total(), 0);
}

#[test]
fn children_hold_their_parents_alive() {
    let ctx = ctx();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.cq_builder().channel(&ch).build().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
    drop(ch);
    drop(pd);
    drop(ctx);
    // Everything still works: the parents live as long as their children.
    cq.req_notify(false).unwrap();
    mr.write_at(0, &[1, 2, 3]).unwrap();
    assert_eq!(mr.dereg().unwrap().unwrap()[..3], [1, 2, 3]);
    cq.destroy().unwrap();
}

/// An endpoint goes through serde — here JSON — with its GID as text, and
/// comes back the same; a GID parses from its text or from an IPv4 address.
#[test]
fn an_endpoint_goes_through_serde_with_its_gid_as_text() {
    let ep = rverbs::cm::Endpoint {
        gid: "10.0.0.1".parse().unwrap(),
        qpn: 0x12_3456,
        psn: 0x00ab_cdef,
        rkey: 0xdead_beef,
        addr: 0x7f00_0000_1000,
        len: 65536,
    };
    let json = serde_json::to_string(&ep).unwrap();
    assert!(json.contains(r#""gid":"::ffff:10.0.0.1""#), "{json}");
    assert!(json.contains(r#""qpn":1193046"#), "{json}");
    let back: rverbs::cm::Endpoint = serde_json::from_str(&json).unwrap();
    assert_eq!(back, ep);
    assert_eq!(
        "fe80::1".parse::<rverbs::Gid>().unwrap().to_string(),
        "fe80::1"
    );
    assert!(serde_json::from_str::<rverbs::cm::Endpoint>(
        &json.replace("::ffff:10.0.0.1", "not a gid")
    )
    .is_err());
}
