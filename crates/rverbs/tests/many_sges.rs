//! Packets gathered from many SGEs (issue 14, item 6). A payload sent
//! straight from registered memory is one I/O vector entry per SGE piece,
//! so a GSO batch of up to 64 packets of up to 32 pieces each (plus the
//! transmit buffer's stretches between them) can need more than the
//! kernel's 1024 entries per `sendmsg` (UIO_MAXIOV): the kernel refuses the
//! whole send with EMSGSIZE, the batch is lost, and go-back-N resends it.
//! The engine must split such batches: many one-packet WRs of the device's
//! most SGEs each arrive intact with no loss, refusal or resend.

use std::time::Duration;

use rverbs::cm::{ConnectOptions, Endpoint};
use rverbs::{
    devices, CompletionQueue, Context, MemoryRegion, Mtu, NetStats, QpCaps, QpType, QueuePair,
    RecvWr, SendWr, Sge, WcOpcode, WcStatus, WrOpcode,
};

mod common;
use common::stall::StallWatch;
use common::ALL;
use common::{sge, wait_n};

/// Path MTU: 1024 bytes, so ~60 packets make a 64 KB GSO batch.
const MTU: usize = 1024;
/// WRs posted in one list: more than the 64 packets a fresh QP's window
/// lets out at once.
const WRS: usize = 192;
/// Each SGE's bytes are this far apart in A's MR (never adjacent).
const STRIDE: usize = 64;

struct Side {
    _ctx: Context,
    _pd: rverbs::ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn side(max_sge: u32, mr_len: usize) -> Side {
    let ctx = devices().unwrap()[0].open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(2 * WRS as u32).unwrap();
    let qp = pd
        .qp_builder(&cq, &cq)
        .qp_type(QpType::Rc)
        .caps(QpCaps {
            max_send_wr: WRS as u32,
            max_recv_wr: WRS as u32,
            max_send_sge: max_sge,
            max_recv_sge: 1,
            max_inline_data: 0,
        })
        .build()
        .unwrap();
    let mr = pd.alloc_mr(mr_len, ALL).unwrap();
    Side {
        _ctx: ctx,
        _pd: pd,
        cq,
        qp,
        mr,
    }
}

/// Sends `WRS` one-packet WRs of `op` (WRITE or SEND) from A to B, each
/// gathered from the device's most SGEs (a piece of MTU / max_sge bytes
/// each); B's bytes must be A's gathered ones, and neither engine may have
/// counted a transmit error, a refused send or (unless the host stalled) a
/// resend.
fn many_sge_packets(send: bool) {
    let what = if send { "SEND" } else { "WRITE" };
    let max_sge = devices().unwrap()[0]
        .open()
        .unwrap()
        .query_device()
        .unwrap()
        .max_sge;
    assert!(
        max_sge >= 16,
        "max_sge {max_sge}: too few to need the split"
    );
    let piece = MTU / max_sge as usize;
    let a = side(max_sge, WRS * max_sge as usize * STRIDE);
    let b = side(max_sge, WRS * MTU);
    let opts = ConnectOptions {
        path_mtu: Some(Mtu::Mtu1024),
        timeout: 14,
        ..ConnectOptions::default()
    };
    let ea = Endpoint::for_qp(&a.qp);
    let eb = Endpoint::for_qp(&b.qp);
    a.qp.connect(ea.psn, &eb, &opts).unwrap();
    b.qp.connect(eb.psn, &ea, &opts).unwrap();

    let src: Vec<u8> = (0..WRS * max_sge as usize * STRIDE)
        .map(|i| (i * 7 + i / 251) as u8)
        .collect();
    a.mr.write_at(0, &src).unwrap();
    // WR k's SGE j: `piece` bytes at (k * max_sge + j) * STRIDE.
    let sges: Vec<Vec<Sge>> = (0..WRS)
        .map(|k| {
            (0..max_sge as usize)
                .map(|j| {
                    sge(
                        &a.mr,
                        ((k * max_sge as usize + j) * STRIDE) as u64,
                        piece as u32,
                    )
                })
                .collect()
        })
        .collect();
    let want: Vec<u8> = (0..WRS * max_sge as usize)
        .flat_map(|s| &src[s * STRIDE..s * STRIDE + piece])
        .copied()
        .collect();
    if send {
        for k in 0..WRS {
            let at = (k * MTU) as u64;
            b.qp.post_recv(&RecvWr::new(k as u64, &[sge(&b.mr, at, MTU as u32)]))
                .unwrap();
        }
    }
    let wrs: Vec<SendWr<'_>> = sges
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let op = if send {
                WrOpcode::Send
            } else {
                WrOpcode::RdmaWrite {
                    remote_addr: b.mr.iova() + (k * MTU) as u64,
                    rkey: b.mr.rkey(),
                }
            };
            SendWr::new(k as u64, op, s).signaled()
        })
        .collect();

    let watch = StallWatch::start();
    a.qp.post_send_list(&wrs).unwrap();
    let limit = Duration::from_secs(20);
    let wcs = wait_n(&a.cq, WRS, limit, what);
    for (k, wc) in wcs.iter().enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status),
            (k as u64, WcStatus::Success),
            "{what}"
        );
    }
    if send {
        let recvs = wait_n(&b.cq, WRS, limit, what);
        for (k, wc) in recvs.iter().enumerate() {
            assert_eq!(
                (wc.wr_id, wc.status, wc.opcode, wc.byte_len as usize),
                (k as u64, WcStatus::Success, WcOpcode::Recv, MTU),
                "{what}"
            );
        }
    }
    let stalls = watch.stalls();
    drop(watch);
    let mut got = vec![0u8; WRS * MTU];
    b.mr.read_at(0, &mut got).unwrap();
    assert!(got == want, "{what}: B's bytes are not A's gathered ones");

    // Both QPs are on the one device: its engine's counters (since the
    // binary started), which must stay 0.
    let s: NetStats = devices().unwrap()[0].net_stats();
    let report = format!(
        "{what}: tx_packets={} tx_sends={} tx_errors={} tx_too_big={} \
         retransmitted={} timeouts={}; {stalls} stalls",
        s.tx_packets, s.tx_sends, s.tx_errors, s.tx_too_big, s.retransmitted, s.timeouts,
    );
    eprintln!("{report}");
    assert_eq!(s.tx_errors, 0, "{report}");
    assert_eq!(s.tx_too_big, 0, "{report}");
    if !common::stall::excused(stalls, s.timeouts) {
        assert_eq!(s.retransmitted, 0, "{report}");
    }
}

/// WRITEs, then SENDs: one after the other, as the device's counters are
/// shared (and two pairs' bursts at once on one debug engine on a 2-core
/// host can outlast the 10 ms retransmission floor: spurious resends).
#[test]
fn rc_writes_and_sends_of_max_sge_pieces_go_out_without_loss() {
    many_sge_packets(false);
    many_sge_packets(true);
}
