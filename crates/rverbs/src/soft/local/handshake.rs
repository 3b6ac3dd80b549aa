//! Who is local, and the agreement (a stand-in until the handshake lands:
//! every peer is taken to be remote).

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use nix::errno::Errno;

use super::LinkSetup;

/// Why no link was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// No rverbs device of this host answers for the address.
    #[error("no rverbs device of this host has that address")]
    NotLocal,
    /// The peer runs as another user.
    #[error("the peer device runs as another user ({uid})")]
    OtherUser {
        /// The peer's user ID.
        uid: u32,
    },
    /// A system call failed.
    #[error("handshake failed: {0}")]
    Io(Errno),
}

/// Answers handshakes for a device.
pub(crate) struct LocalListener;

impl LocalListener {
    /// Starts answering for the device at `addr`.
    pub(crate) fn start(
        addr: IpAddr,
        on_link: impl Fn(LinkSetup) + Send + Sync + 'static,
    ) -> io::Result<LocalListener> {
        let _ = (addr, on_link);
        Ok(LocalListener)
    }
}

/// Asks the device at `peer` for a link.
pub(crate) fn connect(
    local: IpAddr,
    peer: IpAddr,
    ring_bytes: usize,
    timeout: Duration,
) -> Result<LinkSetup, Refusal> {
    let _ = (local, peer, ring_bytes, timeout);
    Err(Refusal::NotLocal)
}
