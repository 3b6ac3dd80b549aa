//! Where a local listener is: the connection manager's rendezvous on one
//! host.
//!
//! Every rverbs process has a device of its own, on an address of its own
//! (a loopback address by default), yet users type `rping -s` in one shell
//! and `rping -c -a 127.0.0.1` in another. A listener therefore registers
//! its port here, and a connect to a local address asks here which device
//! listens on that port:
//! - a listener binds two abstract UNIX socket names:
//!   `rverbs-cm/v1/<space>/<port>` (`<space>` the rdma_cm port space in
//!   hex: `0106` for RDMA_PS_TCP, `0111` for RDMA_PS_UDP) and
//!   `rverbs-cm/v1/<space>/<port>@<device address>`. Abstract names belong
//!   to the network namespace — the same scope as the IP addresses a
//!   connect names — and the kernel keeps them unique (a second bind of the
//!   first name gets EADDRINUSE, which is what a second `rdma_listen` on
//!   the port reports, as the kernel's CM does) and frees them the moment
//!   their sockets close, however their process ends;
//! - a connect to a local address looks for the second name in the
//!   namespace's socket table (`/proc/net/unix`): the device address is in
//!   it. No one has to answer, so a listener's process needs no thread for
//!   it, and a port is free again as soon as its listener is gone. Nobody
//!   there is nobody listening: the connect is rejected, as the kernel CM
//!   rejects a REQ for a service nobody listens on.
//!
//! The connection itself then goes over the wire, REQ to the listener's
//! device as to any other: only the address comes from here. One port is
//! one listener for the whole namespace, whichever local address it is
//! bound to (stricter than the kernel, whose ports are per address; on one
//! host every rverbs device is a local address).

use std::io;
use std::net::IpAddr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};

/// The exclusive name of `port` in `space`.
fn name(space: u16, port: u16) -> String {
    format!("rverbs-cm/v1/{space:04x}/{port}")
}

/// The name that tells the device listening on `port` in `space`.
fn device_name(space: u16, port: u16, device: IpAddr) -> String {
    format!("{}@{device}", name(space, port))
}

/// A listener's registration: holds the names while it lives.
#[derive(Debug)]
pub(crate) struct Registration {
    _port: UnixDatagram,
    _device: UnixDatagram,
}

impl Registration {
    /// Registers `port` of port space `space` as listened on by the
    /// device at `device`. EADDRINUSE if a listener in this network
    /// namespace has it.
    pub(crate) fn new(space: u16, port: u16, device: IpAddr) -> io::Result<Registration> {
        let bind = |name: String| {
            let addr = UnixAddr::from_abstract_name(name)?;
            UnixDatagram::bind_addr(&addr)
        };
        let port_socket = bind(name(space, port))?;
        let device_socket = bind(device_name(space, port, device))?;
        Ok(Registration {
            _port: port_socket,
            _device: device_socket,
        })
    }
}

/// The address of the device listening on `port` of `space` in this
/// network namespace; `Ok(None)` if nobody listens there.
pub(crate) fn lookup(space: u16, port: u16) -> io::Result<Option<IpAddr>> {
    let table = std::fs::read_to_string("/proc/net/unix")?;
    Ok(find(&table, space, port))
}

/// The device address of `port` in `space` in a socket table in the
/// format of `/proc/net/unix` (the path is the last column; abstract names
/// start with `@`).
fn find(table: &str, space: u16, port: u16) -> Option<IpAddr> {
    let prefix = format!("@{}@", name(space, port));
    table
        .lines()
        .filter_map(|line| line.split_whitespace().last())
        .find_map(|path| path.strip_prefix(&prefix)?.parse().ok())
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
        let _reg = Registration::new(TCP, port, device).unwrap();
        assert_eq!(lookup(TCP, port).unwrap(), Some(device));
        // Another port space is another name; so is another port.
        assert_eq!(lookup(UDP, port).unwrap(), None);
        assert_eq!(lookup(TCP, port.wrapping_add(1)).unwrap(), None);
        let v6: IpAddr = "fd00::7".parse().unwrap();
        let _reg6 = Registration::new(UDP, port, v6).unwrap();
        assert_eq!(lookup(UDP, port).unwrap(), Some(v6));
    }

    #[test]
    fn the_table_is_read_by_name_not_by_prefix() {
        let table = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00000000 0002 01 1 @rverbs-cm/v1/0106/71@127.0.0.9\n\
            0000000000000000: 00000002 00000000 00000000 0002 01 2 @rverbs-cm/v1/0106/7174\n\
            0000000000000000: 00000002 00000000 00000000 0002 01 3 @rverbs-cm/v1/0106/7174@127.9.8.7\n\
            0000000000000000: 00000002 00000000 00000000 0002 01 4\n";
        assert_eq!(find(table, TCP, 7174), Some("127.9.8.7".parse().unwrap()));
        assert_eq!(find(table, TCP, 71), Some("127.0.0.9".parse().unwrap()));
        assert_eq!(find(table, TCP, 717), None);
        assert_eq!(find(table, UDP, 7174), None);
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
        let again = Registration::new(TCP, port, device).expect("free after the listener went");
        assert_eq!(lookup(TCP, port).unwrap(), Some(device));
        drop(again);
    }
}
