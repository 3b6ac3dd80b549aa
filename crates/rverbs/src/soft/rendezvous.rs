//! Where a local listener is: the connection manager's rendezvous on one
//! host.
//!
//! Every rverbs process has a device of its own, on an address of its own
//! (a loopback address by default), yet users type `rping -s` in one shell
//! and `rping -c -a 127.0.0.1` in another. A listener therefore registers
//! its port here, and a connect to a local address asks here which device
//! listens on that port:
//! - a listener binds the abstract UNIX socket `rverbs-cm/v1/<space>/<port>`
//!   (`<space>` the rdma_cm port space in hex: `0106` for RDMA_PS_TCP,
//!   `0111` for RDMA_PS_UDP). Abstract names belong to the network
//!   namespace — the same scope as the IP addresses a connect names — and
//!   the kernel keeps them unique (a second bind gets EADDRINUSE, which is
//!   what a second `rdma_listen` on the port reports, as the kernel's CM
//!   does) and frees them when their process ends, however it ends;
//! - the listener's connection manager accepts on it and answers each
//!   caller with one line, `<device address>\n`, then hangs up;
//! - a connect to a local address connects to that name; nobody there is
//!   nobody listening (ECONNREFUSED: the connect is rejected as the kernel
//!   CM rejects a REQ for a service nobody listens on).
//!
//! The connection itself then goes over the wire, REQ to the listener's
//! device as to any other: only the address comes from here. One port is
//! one listener for the whole namespace, whichever local address it is
//! bound to (stricter than the kernel, whose ports are per address; on one
//! host every rverbs device is a local address).
//!
//! (Only the tests use it until the connection manager's service, issue
//! 15's next step, does.)
#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::time::Duration;

/// How long a lookup waits for the listener's answer.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// The abstract socket name of `port` in `space`.
fn name(space: u16, port: u16) -> String {
    format!("rverbs-cm/v1/{space:04x}/{port}")
}

/// A listener's registration: holds the name while it lives.
#[derive(Debug)]
pub(crate) struct Registration {
    socket: UnixListener,
    device: IpAddr,
    space: u16,
    port: u16,
}

impl Registration {
    /// Registers `port` of port space `space` as listened on by the
    /// device at `device`. EADDRINUSE if a listener in this network
    /// namespace has it.
    pub(crate) fn new(space: u16, port: u16, device: IpAddr) -> io::Result<Registration> {
        let addr = UnixAddr::from_abstract_name(name(space, port))?;
        let socket = UnixListener::bind_addr(&addr)?;
        socket.set_nonblocking(true)?;
        Ok(Registration {
            socket,
            device,
            space,
            port,
        })
    }

    /// The port registered.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// The port space registered.
    pub(crate) fn space(&self) -> u16 {
        self.space
    }

    /// Answers every caller waiting (call when the socket is readable).
    /// A caller that does not take its answer is its own loss.
    pub(crate) fn serve(&self) {
        loop {
            match self.socket.accept() {
                Ok((mut caller, _)) => {
                    let _ = caller.set_nonblocking(true);
                    let _ = caller.write_all(format!("{}\n", self.device).as_bytes());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

impl AsFd for Registration {
    /// Readable when callers wait.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

/// The address of the device listening on `port` of `space` in this
/// network namespace; `Ok(None)` if nobody listens there.
pub(crate) fn lookup(space: u16, port: u16) -> io::Result<Option<IpAddr>> {
    let addr = UnixAddr::from_abstract_name(name(space, port))?;
    let mut stream = match UnixStream::connect_addr(&addr) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return Ok(None),
        Err(e) => return Err(e),
    };
    stream.set_read_timeout(Some(LOOKUP_TIMEOUT))?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 64];
    while !answer.ends_with(b"\n") && answer.len() < 64 {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    std::str::from_utf8(&answer)
        .ok()
        .and_then(|s| s.trim_end().parse().ok())
        .map(Some)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "garbled rendezvous answer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port no other test (or program) uses: random in the upper range.
    fn free_port() -> u16 {
        40_000 + (crate::soft::memory::random_u32() % 20_000) as u16
    }

    const TCP: u16 = 0x0106;
    const UDP: u16 = 0x0111;

    #[test]
    fn a_lookup_finds_the_listening_device() {
        let port = free_port();
        let device: IpAddr = "127.31.4.5".parse().unwrap();
        let reg = Registration::new(TCP, port, device).unwrap();
        let server = std::thread::spawn(move || {
            // Serve when the caller comes (poll, as the service thread does).
            let mut fds = [nix::poll::PollFd::new(
                reg.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(5000u16)).unwrap();
            reg.serve();
            reg
        });
        assert_eq!(lookup(TCP, port).unwrap(), Some(device));
        let reg = server.join().unwrap();
        assert_eq!((reg.space(), reg.port()), (TCP, port));
        // Another port space is another name.
        assert_eq!(lookup(UDP, port).unwrap(), None);
    }

    #[test]
    fn a_port_has_one_listener_and_is_free_again_after_it() {
        let port = free_port();
        let device: IpAddr = "127.31.4.6".parse().unwrap();
        let reg = Registration::new(TCP, port, device).unwrap();
        let again = Registration::new(TCP, port, "127.31.4.7".parse().unwrap());
        assert_eq!(
            again.unwrap_err().raw_os_error(),
            Some(nix::errno::Errno::EADDRINUSE as i32)
        );
        drop(reg);
        assert_eq!(lookup(TCP, port).unwrap(), None);
        Registration::new(TCP, port, device).expect("free after the listener went");
    }
}
