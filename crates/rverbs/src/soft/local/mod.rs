//! The same-host path: when a QP's peer is an rverbs device on this host,
//! in this network namespace and of this user, packets go through a ring in
//! shared memory instead of the kernel's UDP stack.
//!
//! - `handshake`: who is local, and the agreement (an abstract UNIX socket
//!   per device, the peer's credentials checked, the shared memory and the
//!   doorbell passed, whether cross-memory attach works both ways);
//! - `ring`: the single-producer, single-consumer byte ring in that shared
//!   memory, one each way.
//!
//! The engine (`engine::local`) sends a QP's packets into the ring when it
//! has a link to the peer's device, and drains every link's ring in each
//! receive pass; the transports above see the same packets either way.

pub(crate) mod handshake;
pub(crate) mod ring;

use std::net::IpAddr;
use std::os::fd::OwnedFd;

/// What a handshake agreed with a peer device on this host.
#[derive(Debug)]
pub(crate) struct LinkSetup {
    /// The shared memory (a memfd) holding the two rings, made by the side
    /// that connected: [`ring::RingPair::map`] maps it.
    pub(crate) shm: OwnedFd,
    /// The peer device's doorbell (an eventfd): written when records were
    /// pushed while the peer's consumer sleeps.
    pub(crate) peer_doorbell: OwnedFd,
    /// Whether this side connected: it produces into ring 0 and consumes
    /// ring 1 (the other side the opposite).
    pub(crate) initiator: bool,
    /// The peer device's address (its GID's IP).
    pub(crate) peer_addr: IpAddr,
    /// The peer's process ID (as this process's PID namespace sees it).
    pub(crate) peer_pid: u32,
    /// Cross-memory attach (`process_vm_readv`/`process_vm_writev`) was
    /// tried both ways and works.
    pub(crate) cma: bool,
    /// Why cross-memory attach is off when `cma` is false: the error of
    /// this side's probe, else the one the peer reported for its own
    /// (EPERM: a seccomp profile or Yama's ptrace scope; ESRCH: the peer's
    /// process is not visible from here, as from another PID namespace).
    pub(crate) cma_refused: Option<nix::errno::Errno>,
    /// The handshake's socket, kept open: it reads end-of-file when the
    /// peer's device goes away.
    pub(crate) conn: OwnedFd,
}
