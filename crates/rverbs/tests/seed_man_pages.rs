//! Every sentence of the user's documents — the man pages of
//! ibv_open_device / ibv_close_device and ibv_create_comp_channel /
//! ibv_destroy_comp_channel — checked against the Rust API. The
//! RDMAV_ALLOW_DISASSOC_DESTROY note is checked in `tests/processes.rs`,
//! because the variable is read once per process.

use std::os::fd::{AsFd, AsRawFd};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use rverbs::{devices, AccessFlags, DeviceConfig, ErrorKind, ResourceKind};

/// "ibv_open_device() opens the device device and creates a context for
/// further use."
#[test]
fn open_device_creates_a_context_for_further_use() {
    let dev = &devices().unwrap()[0];
    let ctx = dev.open().unwrap();
    assert_eq!(ctx.device(), *dev);
    // Further use: the context makes objects.
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let cq = ctx.create_cq(16).unwrap();
    assert_eq!(ctx.resources().total(), 3);
    drop((mr, cq, pd));
    ctx.close().unwrap();
}

/// "ibv_open_device() returns a pointer to the allocated device context, or
/// NULL if the request fails." — in Rust, an error value, never a panic.
#[test]
fn open_device_fails_with_an_error_value() {
    let dev = rverbs::add_device(DeviceConfig::loopback().named("seed-open-fails")).unwrap();
    dev.disassociate();
    let err = dev.open().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoDevice);
    assert_eq!(err.verb(), rverbs::Verb::OpenDevice);
    assert!(err.to_string().contains("seed-open-fails"), "{err}");
}

/// "ibv_close_device() closes the device context context." / "returns 0 on
/// success, -1 on failure."
#[test]
fn close_device_succeeds_or_reports_failure() {
    let ctx = devices().unwrap()[0].open().unwrap();
    ctx.close().unwrap();

    let ctx = devices().unwrap()[0].open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let refused = ctx.close().unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Busy);
    let ctx = refused.into_inner();
    pd.dealloc().unwrap();
    ctx.close().unwrap();
}

/// "ibv_close_device() does not release all the resources allocated using
/// context context. To avoid resource leaks, the user should release all
/// associated resources before closing a context." — in Rust the resources
/// keep the context alive, so nothing leaks or dangles; close names what is
/// still alive.
#[test]
fn close_device_does_not_release_resources_made_through_it() {
    let ctx = devices().unwrap()[0].open().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.cq_builder().cqe(8).channel(&ch).build().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(128, AccessFlags::LOCAL_WRITE).unwrap();

    let refused = ctx.close().unwrap_err();
    let msg = refused.error().message().to_string();
    assert!(
        msg.contains("1 PD")
            && msg.contains("1 MR")
            && msg.contains("1 CQ")
            && msg.contains("1 completion channel"),
        "{msg}"
    );
    // Dropping the context handle releases nothing made through it.
    drop(refused);
    mr.write_at(0, b"still here").unwrap();
    let mut back = [0u8; 10];
    mr.read_at(0, &mut back).unwrap();
    assert_eq!(&back, b"still here");
    cq.req_notify(false).unwrap();
    assert_eq!(cq.poll(&mut [Default::default(); 1]).unwrap(), 0);
    // Released in dependency order by the user, as the man page asks.
    drop(mr);
    pd.dealloc().unwrap();
    cq.destroy().unwrap();
    ch.destroy().unwrap();
}

/// "ibv_create_comp_channel() creates a completion event channel for the RDMA
/// device context context." / "returns a pointer to the created completion
/// event channel, or NULL if the request fails."
#[test]
fn create_comp_channel_for_a_context_or_fail() {
    let ctx = devices().unwrap()[0].open().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    assert_eq!(ctx.live_resources()[0].kind, ResourceKind::CompChannel);
    assert_eq!(ctx.live_resources()[0].handle, ch.handle());
    // A channel of another context is refused by its CQs.
    let other = devices().unwrap()[0].open().unwrap();
    let e = other.cq_builder().channel(&ch).build().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);

    let dev = rverbs::add_device(DeviceConfig::loopback().named("seed-channel-fails")).unwrap();
    let dead = dev.open().unwrap();
    dev.disassociate();
    assert_eq!(
        dead.create_comp_channel().unwrap_err().kind(),
        ErrorKind::Io
    );
}

/// "ibv_destroy_comp_channel() destroys the completion event channel
/// channel." / "returns 0 on success, or the value of errno on failure".
#[test]
fn destroy_comp_channel_returns_the_errno() {
    let ctx = devices().unwrap()[0].open().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    ch.destroy().unwrap();
    assert_eq!(ctx.resources().comp_channels, 0);

    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.cq_builder().channel(&ch).build().unwrap();
    let e = ch.destroy().unwrap_err();
    assert_eq!(e.error().errno(), nix::errno::Errno::EBUSY as i32);
    drop(cq);
}

/// "A completion channel is essentially file descriptor that is used to
/// deliver completion notifications to a userspace process."
#[test]
fn a_completion_channel_is_a_pollable_file_descriptor() {
    let ctx = devices().unwrap()[0].open().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let fd = ch.as_raw_fd();
    assert!(fd >= 0);
    // A real descriptor: fstat works and poll() reports nothing pending.
    nix::sys::stat::fstat(ch.as_fd()).unwrap();
    let mut fds = [PollFd::new(ch.as_fd(), PollFlags::POLLIN)];
    assert_eq!(poll(&mut fds, PollTimeout::ZERO).unwrap(), 0);
    // Distinct channels, distinct descriptors (to steer events to threads).
    let ch2 = ctx.create_comp_channel().unwrap();
    assert_ne!(ch2.as_raw_fd(), fd);
}

/// "ibv_destroy_comp_channel() fails if any CQs are still associated with the
/// completion event channel being destroyed."
#[test]
fn destroy_comp_channel_fails_while_cqs_are_associated() {
    let ctx = devices().unwrap()[0].open().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let a = ctx.cq_builder().cqe(4).channel(&ch).build().unwrap();
    let b = ctx.cq_builder().cqe(4).channel(&ch).build().unwrap();
    assert_eq!(ch.cq_count(), 2);
    let ch = ch.destroy().unwrap_err().into_inner();
    a.destroy().unwrap();
    let e = ch.destroy().unwrap_err();
    assert!(e.error().message().contains("1 CQ still use"), "{e}");
    let ch = e.into_inner();
    // Dropping the CQ handle (not only destroying it) detaches it too.
    drop(b);
    assert_eq!(ch.cq_count(), 0);
    ch.destroy().unwrap();
}
