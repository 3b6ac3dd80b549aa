//! Memory the MR does not own (issue 14, items 4 and 5).
//!
//! Registering foreign memory the process has not mapped, or has mapped
//! without the access the MR asks for, fails with EFAULT, as pinning the
//! pages does on hardware — instead of succeeding and crashing the process
//! on the engine thread at the first access. And foreign memory its owner
//! writes while a peer READs it is only ever copied, never borrowed: every
//! READ completes and returns, word by word, values the owner wrote.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rverbs::{AccessFlags, MrBuffer, QpCaps, QpType, Rereg, SendWr, WcStatus, WrOpcode};

mod common;
use common::{sge, wait};

use nix::libc;

const EFAULT: i32 = libc::EFAULT;

fn page() -> usize {
    // SAFETY: sysconf has no memory effects.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// `pages` fresh pages of anonymous memory, readable and writable; the test
/// unmaps and protects parts of them.
fn map(pages: usize) -> *mut u8 {
    // SAFETY: a fresh anonymous mapping; no existing memory is affected.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            pages * page(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(m, libc::MAP_FAILED);
    m.cast()
}

fn unmap(at: *mut u8, pages: usize) {
    // SAFETY: pages this test mapped and nothing references any more.
    assert_eq!(unsafe { libc::munmap(at.cast(), pages * page()) }, 0);
}

fn protect(at: *mut u8, pages: usize, prot: libc::c_int) {
    // SAFETY: pages this test mapped; nothing accesses them meanwhile.
    assert_eq!(
        unsafe { libc::mprotect(at.cast(), pages * page(), prot) },
        0
    );
}

/// Issue 14.4: `reg_mr_raw` (and a rereg to foreign memory) over a range
/// with an unmapped page, a PROT_NONE page, or a read-only page when the MR
/// asks for write access, is EFAULT; the MR a refused rereg leaves is as it
/// was. Pages around a hole still register.
#[test]
fn foreign_registration_of_unmapped_or_protected_memory_is_efault() {
    let ctx = rverbs::devices().unwrap()[0].open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let pg = page();
    // Pages: 0 RW, 1 unmapped, 2 RW, 3 PROT_NONE, 4 read-only.
    let m = map(5);
    let at = |i: usize| m.wrapping_add(i * pg);
    unmap(at(1), 1);
    protect(at(3), 1, libc::PROT_NONE);
    protect(at(4), 1, libc::PROT_READ);
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let reg = |start: usize, bytes: usize, access: AccessFlags| {
        let p = at(start);
        // SAFETY: nothing is registered if the range is not all mapped, and
        // what registers is mapped until the end of the test (the MRs are
        // dropped first).
        unsafe { pd.reg_mr_raw(p, bytes, p as u64, access) }
    };
    let refused = [
        (0, 2 * pg, rw, "a range with an unmapped page"),
        (1, pg, AccessFlags::empty(), "an unmapped page"),
        (1, 8, AccessFlags::empty(), "8 bytes of an unmapped page"),
        (0, 3 * pg, rw, "around an unmapped page"),
        (
            2,
            2 * pg,
            AccessFlags::REMOTE_READ,
            "a range with a PROT_NONE page",
        ),
        (3, pg, AccessFlags::empty(), "a PROT_NONE page"),
        (
            4,
            pg,
            AccessFlags::LOCAL_WRITE,
            "read-only memory for LOCAL_WRITE",
        ),
        (4, pg, rw, "read-only memory for REMOTE_WRITE"),
        (2, 3 * pg, AccessFlags::REMOTE_READ, "RW, PROT_NONE, RO"),
    ];
    for (start, bytes, access, what) in refused {
        let e = reg(start, bytes, access).expect_err(what);
        assert_eq!(e.errno(), EFAULT, "{what}: {e}");
    }
    // The last byte of a page before a hole, a page after it, and
    // read-only memory without write access register.
    let edge = reg(0, pg, rw).expect("the page before the hole");
    reg(2, pg, rw).expect("the page after the hole");
    let ro = reg(4, pg, AccessFlags::REMOTE_READ).expect("read-only, read access");
    // An unaligned range inside mapped memory ending at a hole's edge.
    let p = at(0).wrapping_add(100);
    // SAFETY: inside page 0, mapped for the whole test.
    unsafe { pd.reg_mr_raw(p, pg - 100, p as u64, rw) }.expect("up to the hole");

    // A rereg onto unmapped memory is EFAULT and leaves the MR unchanged.
    let mut edge = edge;
    let (key, addr) = (edge.lkey(), edge.addr());
    // SAFETY: refused: the memory is not mapped.
    let req = unsafe { Rereg::new().foreign_memory(at(1), pg) };
    let e = edge.rereg(req).expect_err("rereg onto a hole");
    assert_eq!(e.error().errno(), EFAULT, "{}", e.error());
    assert_eq!((edge.lkey(), edge.addr()), (key, addr));
    edge.write_at(0, b"still mine").unwrap();
    // So is asking for write access to read-only memory.
    let mut ro = ro;
    let e = ro
        .rereg(Rereg::new().access(AccessFlags::LOCAL_WRITE))
        .expect_err("write access to read-only memory");
    assert_eq!(e.error().errno(), EFAULT, "{}", e.error());
    assert_eq!(ro.access(), AccessFlags::REMOTE_READ);
    // Owned memory is always fine.
    edge.rereg(Rereg::new().memory(MrBuffer::zeroed(64)))
        .expect("owned memory");
}

/// Issue 14.5: while its owner keeps writing foreign memory (whole 8-byte
/// words, atomically), a peer READs it in a loop: every READ completes and
/// every word it returns is one the owner wrote, and no response is sent
/// with an ICRC over other bytes than its own.
#[test]
fn foreign_memory_written_while_a_peer_reads_it() {
    const WORDS: usize = 2048; // 16 KiB: several packets per READ
    const READS: u64 = 60;
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let (a, b) = common::connected_pair(QpType::Rc, caps, WORDS * 8, rw);
    // B's foreign memory, written by its owner through atomics only.
    let words: Arc<Vec<AtomicU64>> = Arc::new((0..WORDS).map(|_| AtomicU64::new(0)).collect());
    let ptr = words.as_ptr().cast::<u8>().cast_mut();
    // SAFETY: `words` outlives the MR (kept by the Arc until the end), and
    // is only written through atomics, never through references the device
    // could race (the device writes nothing: the peer only READs).
    let foreign = unsafe { b.pd.reg_mr_raw(ptr, WORDS * 8, ptr as u64, rw) }.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (words, stop) = (words.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut round = 1u64;
            while !stop.load(Ordering::Relaxed) {
                // Pattern: the round in the high half, the word's index in the low.
                for (i, w) in words.iter().enumerate() {
                    w.store(round << 32 | i as u64, Ordering::Relaxed);
                }
                round += 1;
            }
            round
        })
    };
    let device = &rverbs::devices().unwrap()[0];
    let icrc_errors = device.net_stats().rx_icrc_errors;
    let into = [sge(&a.mr, 0, (WORDS * 8) as u32)];
    for n in 0..READS {
        let wr = SendWr::new(
            n,
            WrOpcode::RdmaRead {
                remote_addr: foreign.iova(),
                rkey: foreign.rkey(),
            },
            &into,
        )
        .signaled();
        a.qp.post_send(&wr).unwrap();
        let wc = wait(&a.cq, 1, "READ of memory being written");
        assert_eq!(wc[0].status, WcStatus::Success, "READ {n}: {wc:?}");
        let mut got = vec![0u8; WORDS * 8];
        a.mr.read_at(0, &mut got).unwrap();
        for (i, w) in got.chunks_exact(8).enumerate() {
            let v = u64::from_ne_bytes(w.try_into().unwrap());
            assert!(
                v == 0 || v & 0xffff_ffff == i as u64,
                "READ {n}: word {i} is {v:#x}, which the owner never wrote"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.join().unwrap();
    assert!(rounds > 1, "the owner wrote while the peer read");
    // The ICRC is computed over the very bytes sent: a payload the owner
    // changes meanwhile is never sent with a checksum of other bytes.
    assert_eq!(
        device.net_stats().rx_icrc_errors,
        icrc_errors,
        "READ responses dropped for a bad ICRC"
    );
    drop(foreign);
    drop(words);
}
