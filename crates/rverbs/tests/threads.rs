//! Every object is usable from many threads at once, as in libibverbs.

use std::sync::Arc;
use std::thread;

use rverbs::{devices, AccessFlags, WorkCompletion};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn every_object_is_send_and_sync() {
    assert_send_sync::<rverbs::Device>();
    assert_send_sync::<rverbs::Context>();
    assert_send_sync::<rverbs::CompletionChannel>();
    assert_send_sync::<rverbs::CompletionQueue>();
    assert_send_sync::<rverbs::ProtectionDomain>();
    assert_send_sync::<rverbs::MemoryRegion>();
    assert_send_sync::<rverbs::MrBuffer>();
    assert_send_sync::<rverbs::CqEvent>();
    assert_send_sync::<rverbs::AsyncEvent>();
    assert_send_sync::<rverbs::Error>();
}

#[test]
fn hammer_create_destroy_and_query_from_many_threads() {
    let ctx = Arc::new(devices().unwrap()[0].open().unwrap());
    let shared_pd = Arc::new(ctx.alloc_pd().unwrap());
    let shared_cq = Arc::new(ctx.create_cq(64).unwrap());
    let shared_mr = Arc::new(shared_pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap());
    const THREADS: usize = 8;
    const ROUNDS: usize = 300;

    thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (ctx, pd, cq, mr) = (&ctx, &shared_pd, &shared_cq, &shared_mr);
                s.spawn(move || {
                    for i in 0..ROUNDS {
                        // Queries race with everything else.
                        assert_eq!(ctx.query_port(1).unwrap().gid_tbl_len, 1);
                        ctx.query_device().unwrap();
                        ctx.query_gid(1, 0).unwrap();
                        // Objects made and destroyed on every thread.
                        let ch = ctx.create_comp_channel().unwrap();
                        let cq2 = ctx.cq_builder().cqe(8).channel(&ch).build().unwrap();
                        let own_pd = ctx.alloc_pd().unwrap();
                        let mr2 = own_pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
                        let mr3 = pd.alloc_mr(32, AccessFlags::LOCAL_WRITE).unwrap();
                        let keys = [mr.lkey(), mr2.lkey(), mr3.lkey()];
                        assert!(keys[0] != keys[1] && keys[1] != keys[2] && keys[0] != keys[2]);
                        // Shared objects used concurrently.
                        let off = (t * 512) + (i % 8) * 64;
                        mr.write_at(off, &[t as u8; 64]).unwrap();
                        let mut back = [0u8; 64];
                        mr.read_at(off, &mut back).unwrap();
                        assert_eq!(back, [t as u8; 64], "threads write disjoint ranges");
                        cq.req_notify(i % 2 == 0).unwrap();
                        cq.poll(&mut [WorkCompletion::default(); 4]).unwrap();
                        // Teardown in order, through the checked verbs.
                        mr2.dereg().unwrap();
                        mr3.dereg().unwrap();
                        own_pd.dealloc().unwrap();
                        cq2.destroy().unwrap();
                        ch.destroy().unwrap();
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
    });

    let r = ctx.resources();
    assert_eq!((r.pds, r.mrs, r.cqs, r.comp_channels), (1, 1, 1, 0));
    drop(shared_mr);
    assert_eq!(ctx.resources().mrs, 0);
}

#[test]
fn contexts_opened_and_closed_concurrently() {
    thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| {
                for _ in 0..100 {
                    let ctx = devices().unwrap()[0].open().unwrap();
                    let pd = ctx.alloc_pd().unwrap();
                    pd.dealloc().unwrap();
                    ctx.close().unwrap();
                }
            });
        }
    });
}

#[test]
fn owner_copies_never_see_a_half_written_range() {
    let ctx = devices().unwrap()[0].open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(64 * 1024, AccessFlags::LOCAL_WRITE).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            for i in 0..2000u32 {
                mr.write_at(0, &[(i % 2) as u8 * 0xff; 64 * 1024]).unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Release);
        });
        let mut buf = vec![0u8; 64 * 1024];
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            mr.read_at(0, &mut buf).unwrap();
            assert!(
                buf.iter().all(|&b| b == buf[0]),
                "a read saw two writes at once"
            );
        }
    });
}
