//! The rsocket calls of `<rdma/rsocket.h>` (sockets over RDMA), not
//! implemented yet: each has its exact C prototype and fails with errno
//! ENOSYS (-1; `(size_t)-1` for `riowrite`).
//!
//! The one prototype Rust cannot spell is `rfcntl(int, int, ...)`: here, as
//! in its `RdmacmOps` slot, it takes the third argument as a `c_long`, which
//! librdmacm's exported `rfcntl` passes on from the register the variadic
//! argument travels in (see `rverbs_ibverbs_abi::abi::rdmacm_ops`); for a
//! command without an argument (F_GETFL) the value is garbage and ignored.

use std::ffi::{c_int, c_long, c_void};

use libc::{
    fd_set, iovec, msghdr, nfds_t, off_t, pollfd, size_t, sockaddr, socklen_t, ssize_t, timeval,
};

not_yet! {
    fn rsocket(domain: c_int, r#type: c_int, protocol: c_int) -> c_int;
    fn rbind(socket: c_int, addr: *const sockaddr, addrlen: socklen_t) -> c_int;
    fn rlisten(socket: c_int, backlog: c_int) -> c_int;
    fn raccept(socket: c_int, addr: *mut sockaddr, addrlen: *mut socklen_t) -> c_int;
    fn rconnect(socket: c_int, addr: *const sockaddr, addrlen: socklen_t) -> c_int;
    fn rshutdown(socket: c_int, how: c_int) -> c_int;
    fn rclose(socket: c_int) -> c_int;
    fn rrecv(socket: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t;
    fn rrecvfrom(
        socket: c_int,
        buf: *mut c_void,
        len: size_t,
        flags: c_int,
        src_addr: *mut sockaddr,
        addrlen: *mut socklen_t,
    ) -> ssize_t;
    fn rrecvmsg(socket: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    fn rsend(socket: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t;
    fn rsendto(
        socket: c_int,
        buf: *const c_void,
        len: size_t,
        flags: c_int,
        dest_addr: *const sockaddr,
        addrlen: socklen_t,
    ) -> ssize_t;
    fn rsendmsg(socket: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    fn rread(socket: c_int, buf: *mut c_void, count: size_t) -> ssize_t;
    fn rreadv(socket: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t;
    fn rwrite(socket: c_int, buf: *const c_void, count: size_t) -> ssize_t;
    fn rwritev(socket: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t;
    fn rpoll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int;
    fn rselect(
        nfds: c_int,
        readfds: *mut fd_set,
        writefds: *mut fd_set,
        exceptfds: *mut fd_set,
        timeout: *mut timeval,
    ) -> c_int;
    fn rgetpeername(
        socket: c_int,
        addr: *mut sockaddr,
        addrlen: *mut socklen_t,
    ) -> c_int;
    fn rgetsockname(
        socket: c_int,
        addr: *mut sockaddr,
        addrlen: *mut socklen_t,
    ) -> c_int;
    fn rsetsockopt(
        socket: c_int,
        level: c_int,
        optname: c_int,
        optval: *const c_void,
        optlen: socklen_t,
    ) -> c_int;
    fn rgetsockopt(
        socket: c_int,
        level: c_int,
        optname: c_int,
        optval: *mut c_void,
        optlen: *mut socklen_t,
    ) -> c_int;
    fn rfcntl(socket: c_int, cmd: c_int, arg: c_long) -> c_int;
    fn riomap(
        socket: c_int,
        buf: *mut c_void,
        len: size_t,
        prot: c_int,
        flags: c_int,
        offset: off_t,
    ) -> off_t;
    fn riounmap(socket: c_int, buf: *mut c_void, len: size_t) -> c_int;
    fn riowrite(
        socket: c_int,
        buf: *const c_void,
        count: size_t,
        offset: off_t,
        flags: c_int,
    ) -> size_t;
}
