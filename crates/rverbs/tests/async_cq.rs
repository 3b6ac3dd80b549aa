//! The `tokio` feature (`rverbs::tokio`): completions awaited on a
//! connected RC pair while another task posts, a CQ as a stream that yields
//! every completion once and in order, futures dropped midway losing
//! nothing, channels shared by CQs, EIO after a disassociation, and rdma_cm
//! events awaited. Run with `cargo test -p rverbs --features tokio --test
//! async_cq`.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Wake;
use std::time::{Duration, Instant};

use rverbs::cm::{CmEventKind, CmId, ConnParam, ConnectOptions, Endpoint, EventChannel, PortSpace};
use rverbs::tokio::{AsyncCompletionChannel, AsyncCompletionQueue, AsyncEventChannel};
use rverbs::{
    AccessFlags, Context, DeviceConfig, ErrorKind, MemoryRegion, QpCaps, QueuePair, RecvWr, SendWr,
    WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

use common::sge;

/// How long any one wait in these tests may take before it fails.
const LIMIT: Duration = Duration::from_secs(30);

/// One side of an RC pair whose CQ is awaited.
struct Side {
    _ctx: Context,
    cq: AsyncCompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn side(device: &rverbs::Device) -> Side {
    let ctx = device.open().unwrap();
    let cq = AsyncCompletionQueue::create(&ctx, 512).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let caps = QpCaps {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd.qp_builder(cq.cq(), cq.cq()).caps(caps).build().unwrap();
    let mr = pd
        .alloc_mr(
            64 * 1024,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    Side {
        _ctx: ctx,
        cq,
        qp,
        mr,
    }
}

/// Two sides on `device`, connected (RC). Must run inside a runtime.
fn rc_pair_on(device: &rverbs::Device) -> (Side, Side) {
    let (a, b) = (side(device), side(device));
    let opts = ConnectOptions {
        timeout: 10,
        ..ConnectOptions::default()
    };
    let (ea, eb) = (Endpoint::for_qp(&a.qp), Endpoint::for_qp(&b.qp));
    a.qp.connect(ea.psn, &eb, &opts).unwrap();
    b.qp.connect(eb.psn, &ea, &opts).unwrap();
    (a, b)
}

fn rc_pair() -> (Side, Side) {
    rc_pair_on(&rverbs::devices().unwrap()[0])
}

/// Posts `n` receives of 64 bytes each, wr_ids `first..first + n`.
fn post_recvs(s: &Side, first: u64, n: u64) {
    for i in 0..n {
        let buf = [sge(&s.mr, (i % 256) * 64, 64)];
        s.qp.post_recv(&RecvWr::new(first + i, &buf)).unwrap();
    }
}

/// Sends the 8 bytes of `id` (written at its own offset), signaled, wr_id `id`.
fn send(s: &Side, id: u64) {
    let offset = (id % 256) * 64;
    s.mr.write_at(offset as usize, &id.to_le_bytes()).unwrap();
    let data = [sge(&s.mr, offset, 8)];
    let wr = SendWr::new(id, WrOpcode::Send, &data).signaled();
    s.qp.post_send(&wr).unwrap();
}

/// `fut`, or a failure naming `what` after [`LIMIT`].
async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing after {LIMIT:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_awaits_completions_while_another_posts() {
    const N: u64 = 64;
    let (a, mut b) = rc_pair();
    post_recvs(&b, 0, N);
    let events_before = b.cq.cq().comp_events().0;

    // The receiver's task waits; the sender starts only once the receiver's
    // first wait found the CQ empty and armed it, so at least that
    // completion comes through the channel's event.
    let (go, started) = tokio::sync::oneshot::channel();
    let receiver = tokio::spawn(async move {
        let mut got = Vec::new();
        let mut wc = [WorkCompletion::default(); 8];
        let n = {
            let mut first = std::pin::pin!(b.cq.next_completions(&mut wc));
            let pending = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(first.as_mut().poll(cx).is_pending())
            })
            .await;
            assert!(pending, "the CQ was empty");
            go.send(()).unwrap();
            within("the first receive", first).await.unwrap()
        };
        got.extend_from_slice(&wc[..n]);
        while got.len() < N as usize {
            let n = within("receiving", b.cq.next_completions(&mut wc))
                .await
                .unwrap();
            assert!(n > 0, "next_completions returned no completion");
            got.extend_from_slice(&wc[..n]);
        }
        (b, got)
    });

    // The sender's task posts one by one, awaiting each send's completion
    // on its own CQ, with a pause now and then so the receiver waits.
    let sender = tokio::spawn(async move {
        let mut a = a;
        let mut wc = [WorkCompletion::default(); 1];
        started.await.unwrap();
        for id in 0..N {
            send(&a, id);
            let n = within("sending", a.cq.next_completions(&mut wc))
                .await
                .unwrap();
            assert_eq!(n, 1);
            assert_eq!((wc[0].wr_id, wc[0].status), (id, WcStatus::Success));
            if id % 8 == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        a
    });

    let _a = sender.await.unwrap();
    let (b, got) = receiver.await.unwrap();
    let ids: Vec<u64> = got.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..N).collect::<Vec<_>>(), "every receive, in order");
    for w in &got {
        assert_eq!(
            (w.status, w.opcode, w.byte_len),
            (WcStatus::Success, WcOpcode::Recv, 8)
        );
        let mut data = [0u8; 8];
        b.mr.read_at((w.wr_id % 256) as usize * 64, &mut data)
            .unwrap();
        assert_eq!(
            u64::from_le_bytes(data),
            w.wr_id,
            "the payload of {}",
            w.wr_id
        );
    }
    // The receiver did wait on the channel (it was not only polling).
    let (reported, acked) = b.cq.cq().comp_events();
    assert!(
        reported > events_before,
        "no completion event was read: the receiver never awaited the channel"
    );
    assert_eq!(reported, acked, "every event read was acknowledged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_yields_every_completion_once_in_order() {
    use futures_core::Stream;
    const N: u64 = 200;
    let (a, b) = rc_pair();
    post_recvs(&b, 1000, N);
    let mut stream = b.cq.into_stream();

    // Bursts of sends from another task, with the receiver's stream
    // draining meanwhile.
    let sender = tokio::spawn(async move {
        let mut a = a;
        let mut wc = [WorkCompletion::default(); 32];
        let mut done = 0;
        for burst in 0..(N / 20) {
            for i in 0..20 {
                send(&a, 1000 + burst * 20 + i);
            }
            while done < (burst + 1) * 20 {
                done += within("sending", a.cq.next_completions(&mut wc))
                    .await
                    .unwrap() as u64;
            }
            tokio::task::yield_now().await;
        }
        a
    });

    let mut ids = Vec::new();
    // Half through the inherent `next`, half through the `Stream` trait.
    while ids.len() < (N / 2) as usize {
        let wc = within("streaming", stream.next()).await.unwrap().unwrap();
        assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Recv));
        ids.push(wc.wr_id);
    }
    while ids.len() < N as usize {
        let next = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx));
        let wc = within("streaming", next).await.unwrap().unwrap();
        assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Recv));
        ids.push(wc.wr_id);
    }
    let _a = sender.await.unwrap();
    assert_eq!(
        ids,
        (1000..1000 + N).collect::<Vec<_>>(),
        "each once, in order"
    );
    // Nothing more: no completion is yielded twice.
    let extra = tokio::time::timeout(Duration::from_millis(200), stream.next()).await;
    assert!(
        extra.is_err(),
        "a completion beyond the {N} posted: {extra:?}"
    );
    let (_, pending) = stream.into_inner();
    assert!(
        pending.is_empty(),
        "completions left in the stream: {pending:?}"
    );
}

/// A waker that records that it was called.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_future_dropped_midway_loses_no_completion() {
    let (a, mut b) = rc_pair();
    post_recvs(&b, 0, 3);
    let mut wc = [WorkCompletion::default(); 4];

    // A wait starts on the empty CQ, is woken by the completion's event,
    // and is dropped before it is polled again (a `select!` branch that
    // lost, say).
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = std::task::Waker::from(flag.clone());
    let mut cx = std::task::Context::from_waker(&waker);
    {
        let mut fut = Box::pin(b.cq.next_completions(&mut wc));
        assert!(fut.as_mut().poll(&mut cx).is_pending(), "the CQ was empty");
        send(&a, 0);
        let deadline = Instant::now() + LIMIT;
        while !flag.0.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the wait was never woken");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    // The next wait still sees the completion.
    let n = within("after the drop", b.cq.next_completions(&mut wc))
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (0, WcStatus::Success));

    // A wait dropped before anything came (a timeout), then a completion:
    // the next wait sees it too, despite the event the dropped wait left
    // armed.
    let timed_out =
        tokio::time::timeout(Duration::from_millis(20), b.cq.next_completions(&mut wc)).await;
    assert!(timed_out.is_err(), "nothing was sent: {timed_out:?}");
    send(&a, 1);
    let n = within("after the timeout", b.cq.next_completions(&mut wc))
        .await
        .unwrap();
    assert_eq!((n, wc[0].wr_id), (1, 1));

    // And a stale event on the channel does not stand for a completion.
    send(&a, 2);
    let n = within("third", b.cq.next_completions(&mut wc))
        .await
        .unwrap();
    assert_eq!((n, wc[0].wr_id), (1, 2));
    let (reported, acked) = b.cq.cq().comp_events();
    assert_eq!(reported, acked, "every event read was acknowledged");
    // The sender's three completions are there, each once.
    let sent = common::wait(a.cq.cq(), 3, "sends");
    assert_eq!(sent.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_queue_needs_a_channel_of_its_own() {
    let ctx = rverbs::devices().unwrap()[0].open().unwrap();
    // Two CQs on one channel: refused.
    let shared = ctx.create_comp_channel().unwrap();
    let cq1 = ctx.cq_builder().channel(&shared).build().unwrap();
    let _cq2 = ctx.cq_builder().channel(&shared).build().unwrap();
    let err = AsyncCompletionQueue::new(cq1, shared).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.message().contains("serves 2 CQs"), "{err}");
    // A CQ on another channel (or none): refused.
    let other = ctx.create_comp_channel().unwrap();
    let plain = ctx.create_cq(4).unwrap();
    let err = AsyncCompletionQueue::new(plain, other).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    // Its own: accepted, and handed back whole.
    let own = ctx.create_comp_channel().unwrap();
    let cq = ctx.cq_builder().channel(&own).build().unwrap();
    let handle = cq.handle();
    let (cq, own) = AsyncCompletionQueue::new(cq, own).unwrap().into_parts();
    assert_eq!((cq.handle(), own.cq_count()), (handle, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_channel_names_the_cq_of_each_event() {
    let device = &rverbs::devices().unwrap()[0];
    let ctx = device.open().unwrap();
    let channel = ctx.create_comp_channel().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq_a = ctx
        .cq_builder()
        .cqe(16)
        .channel(&channel)
        .user_data(1)
        .build()
        .unwrap();
    let cq_b = ctx
        .cq_builder()
        .cqe(16)
        .channel(&channel)
        .user_data(2)
        .build()
        .unwrap();
    let channel = AsyncCompletionChannel::new(channel).unwrap();
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp_a = pd.qp_builder(&cq_a, &cq_a).caps(caps).build().unwrap();
    let qp_b = pd.qp_builder(&cq_b, &cq_b).caps(caps).build().unwrap();
    let opts = ConnectOptions::default();
    let (ea, eb) = (Endpoint::for_qp(&qp_a), Endpoint::for_qp(&qp_b));
    qp_a.connect(ea.psn, &eb, &opts).unwrap();
    qp_b.connect(eb.psn, &ea, &opts).unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    qp_b.post_recv(&RecvWr::new(7, &[sge(&mr, 0, 64)])).unwrap();

    // Only B is armed: the receive fires B's event, not A's.
    cq_b.req_notify(false).unwrap();
    qp_a.post_send(&SendWr::new(8, WrOpcode::Send, &[sge(&mr, 1024, 8)]))
        .unwrap();
    let event = within("B's event", channel.get_cq_event()).await.unwrap();
    assert!(event.is_for(&cq_b) && !event.is_for(&cq_a), "{event:?}");
    assert_eq!(event.user_data(), 2);
    drop(event);
    let got = common::wait(&cq_b, 1, "the receive");
    assert_eq!((got[0].wr_id, got[0].status), (7, WcStatus::Success));
    assert_eq!(cq_b.comp_events(), (1, 1), "read and acknowledged");
    assert_eq!(cq_a.comp_events(), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disassociated_device_ends_the_wait_with_eio() {
    let name = format!("async-cq-gone-{}", std::process::id());
    let dev = rverbs::add_device(DeviceConfig::loopback().named(name)).unwrap();
    let (_a, b) = rc_pair_on(&dev);
    let mut stream = b.cq.into_stream();
    let gone = dev.clone();
    let unplug = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        gone.disassociate();
    });
    // The device goes while the stream waits: its flush completions (the
    // QP goes to ERR with no work queued: none), then EIO, then the end.
    let mut items = Vec::new();
    loop {
        match within("after the unplug", stream.next()).await {
            Some(Ok(wc)) => items.push(wc),
            Some(Err(e)) => {
                assert_eq!(e.kind(), ErrorKind::Io, "{e}");
                break;
            }
            None => panic!("the stream ended without an error"),
        }
    }
    assert!(items.is_empty(), "completions from an idle QP: {items:?}");
    assert!(
        stream.next().await.is_none(),
        "the stream ends after its error"
    );
    unplug.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_cm_events_are_awaited() {
    let server_events = EventChannel::new().unwrap();
    let server = AsyncEventChannel::new(server_events.clone()).unwrap();
    let listener = CmId::new(&server_events, PortSpace::Tcp).unwrap();
    listener.bind_addr("0.0.0.0:0".parse().unwrap()).unwrap();
    listener.listen(4).unwrap();
    let port = listener.local_addr().unwrap().port();

    // The passive side in its own task: awaits the request, accepts.
    let accept = tokio::spawn(async move {
        let request = within("the request", server.get_event()).await.unwrap();
        assert_eq!(request.kind, CmEventKind::ConnectRequest);
        assert_eq!(request.param_private_data(), b"async");
        let conn = request.id;
        let ctx = conn.device().unwrap().open().unwrap();
        let cq = ctx.create_cq(8).unwrap();
        let qp = ctx
            .alloc_pd()
            .unwrap()
            .qp_builder(&cq, &cq)
            .build()
            .unwrap();
        conn.accept(Some(&qp), &ConnParam::default()).unwrap();
        let ev = within("ESTABLISHED (server)", server.get_event())
            .await
            .unwrap();
        assert_eq!(ev.kind, CmEventKind::Established);
        (listener, conn, qp)
    });

    let client_events = EventChannel::new().unwrap();
    let client = AsyncEventChannel::new(client_events.clone()).unwrap();
    let id = CmId::new(&client_events, PortSpace::Tcp).unwrap();
    id.resolve_addr(None, format!("127.0.0.1:{port}").parse().unwrap())
        .unwrap();
    let ev = within("ADDR_RESOLVED", client.get_event()).await.unwrap();
    assert_eq!(ev.kind, CmEventKind::AddrResolved);
    id.resolve_route().unwrap();
    let ev = within("ROUTE_RESOLVED", client.get_event()).await.unwrap();
    assert_eq!(ev.kind, CmEventKind::RouteResolved);
    let ctx = id.device().unwrap().open().unwrap();
    let cq = ctx.create_cq(8).unwrap();
    let qp = ctx
        .alloc_pd()
        .unwrap()
        .qp_builder(&cq, &cq)
        .build()
        .unwrap();
    id.prepare_qp(&qp).unwrap();
    let hello = ConnParam {
        private_data: b"async".to_vec(),
        ..ConnParam::default()
    };
    id.connect(Some(&qp), &hello).unwrap();
    let ev = within("ESTABLISHED (client)", client.get_event())
        .await
        .unwrap();
    assert_eq!(ev.kind, CmEventKind::Established);
    let (_listener, _conn, sqp) = accept.await.unwrap();
    assert_eq!(qp.state(), rverbs::QpState::Rts);
    assert_eq!(sqp.state(), rverbs::QpState::Rts);
    // A wait dropped midway (a timeout) loses no event either.
    let idle = tokio::time::timeout(Duration::from_millis(20), client.get_event()).await;
    assert!(idle.is_err(), "an event nobody caused: {idle:?}");
    id.disconnect().unwrap();
    let ev = within("DISCONNECTED", client.get_event()).await.unwrap();
    assert_eq!(ev.kind, CmEventKind::Disconnected);
}

/// The private data of an event's connection parameters.
trait PrivateData {
    fn param_private_data(&self) -> &[u8];
}

impl PrivateData for rverbs::cm::CmEvent {
    fn param_private_data(&self) -> &[u8] {
        match &self.param {
            rverbs::cm::EventParam::Conn(c) => &c.private_data[..5],
            _ => &[],
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_async_example() -> rverbs::Result<()> {
    // README async begin
    use rverbs::cm::{ConnectOptions, Endpoint};
    use rverbs::tokio::AsyncCompletionQueue;
    use rverbs::{RecvWr, SendWr, WorkCompletion, WrOpcode};

    let ctx = rverbs::devices()?[0].open()?;
    // A CQ with a completion channel of its own, registered with tokio's reactor.
    let mut cq = AsyncCompletionQueue::create(&ctx, 64)?;
    let pd = ctx.alloc_pd()?;
    let a = pd.qp_builder(cq.cq(), cq.cq()).build()?;
    let b = pd.qp_builder(cq.cq(), cq.cq()).build()?;
    let (ea, eb) = (Endpoint::for_qp(&a), Endpoint::for_qp(&b));
    a.connect(ea.psn, &eb, &ConnectOptions::default())?;
    b.connect(eb.psn, &ea, &ConnectOptions::default())?;
    b.post_recv(&RecvWr::new(1, &[]))?;
    a.post_send(&SendWr::new(2, WrOpcode::Send, &[]).signaled())?;

    let mut wc = [WorkCompletion::default(); 2];
    let mut done = 0;
    while done < 2 {
        // Arms the CQ, polls it, and awaits its channel's event only while it is empty.
        done += cq.next_completions(&mut wc[done..]).await?;
    }
    // README async end

    let mut ids: Vec<u64> = wc.iter().map(|w| w.wr_id).collect();
    ids.sort();
    assert_eq!(ids, [1, 2]);
    assert!(wc.iter().all(|w| w.status == WcStatus::Success), "{wc:?}");
    Ok(())
}

/// The README's async block and the test above agree (modulo indentation).
#[test]
fn readme_async_block_matches() {
    let readme = include_str!("../../../README.md");
    let this = include_str!("async_cq.rs");
    let block = readme
        .split("```rust\n")
        .find(|b| b.contains("AsyncCompletionQueue::create"))
        .and_then(|b| b.split("```").next())
        .expect("the README's async example");
    let ours: String = this
        .split("// README async begin\n")
        .nth(1)
        .and_then(|s| s.split("    // README async end").next())
        .expect("markers")
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(block.trim(), ours.trim());
}
