//! The rsocket calls of `<rdma/rsocket.h>` (sockets over RDMA), not
//! implemented yet: each has its exact C prototype and fails with errno
//! ENOSYS (-1; `(size_t)-1` for `riowrite`).
//!
//! The one prototype Rust cannot spell is `rfcntl(int, int, ...)`: stable
//! Rust cannot define a C-variadic function, so it is defined with its two
//! named arguments. On x86_64 that is ABI-compatible for a function that
//! does not read the variadic part (the caller passes the named arguments in
//! the same registers and the callee may ignore `%al` and the rest); the
//! real `rfcntl` will take the third argument as a register-sized integer,
//! the way F_GETFL/F_SETFL use it.

use std::ffi::{c_int, c_void};

use libc::{
    fd_set, iovec, msghdr, nfds_t, off_t, pollfd, size_t, sockaddr, socklen_t, ssize_t, timeval,
};

not_yet! {
    "RDMACM_1.0" fn rsocket(domain: c_int, r#type: c_int, protocol: c_int) -> c_int;
    "RDMACM_1.0" fn rbind(socket: c_int, addr: *const sockaddr, addrlen: socklen_t) -> c_int;
    "RDMACM_1.0" fn rlisten(socket: c_int, backlog: c_int) -> c_int;
    "RDMACM_1.0" fn raccept(socket: c_int, addr: *mut sockaddr, addrlen: *mut socklen_t) -> c_int;
    "RDMACM_1.0" fn rconnect(socket: c_int, addr: *const sockaddr, addrlen: socklen_t) -> c_int;
    "RDMACM_1.0" fn rshutdown(socket: c_int, how: c_int) -> c_int;
    "RDMACM_1.0" fn rclose(socket: c_int) -> c_int;
    "RDMACM_1.0" fn rrecv(socket: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t;
    "RDMACM_1.0" fn rrecvfrom(
        socket: c_int,
        buf: *mut c_void,
        len: size_t,
        flags: c_int,
        src_addr: *mut sockaddr,
        addrlen: *mut socklen_t,
    ) -> ssize_t;
    "RDMACM_1.0" fn rrecvmsg(socket: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    "RDMACM_1.0" fn rsend(socket: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t;
    "RDMACM_1.0" fn rsendto(
        socket: c_int,
        buf: *const c_void,
        len: size_t,
        flags: c_int,
        dest_addr: *const sockaddr,
        addrlen: socklen_t,
    ) -> ssize_t;
    "RDMACM_1.0" fn rsendmsg(socket: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    "RDMACM_1.0" fn rread(socket: c_int, buf: *mut c_void, count: size_t) -> ssize_t;
    "RDMACM_1.0" fn rreadv(socket: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t;
    "RDMACM_1.0" fn rwrite(socket: c_int, buf: *const c_void, count: size_t) -> ssize_t;
    "RDMACM_1.0" fn rwritev(socket: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t;
    "RDMACM_1.0" fn rpoll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int;
    "RDMACM_1.0" fn rselect(
        nfds: c_int,
        readfds: *mut fd_set,
        writefds: *mut fd_set,
        exceptfds: *mut fd_set,
        timeout: *mut timeval,
    ) -> c_int;
    "RDMACM_1.0" fn rgetpeername(
        socket: c_int,
        addr: *mut sockaddr,
        addrlen: *mut socklen_t,
    ) -> c_int;
    "RDMACM_1.0" fn rgetsockname(
        socket: c_int,
        addr: *mut sockaddr,
        addrlen: *mut socklen_t,
    ) -> c_int;
    "RDMACM_1.0" fn rsetsockopt(
        socket: c_int,
        level: c_int,
        optname: c_int,
        optval: *const c_void,
        optlen: socklen_t,
    ) -> c_int;
    "RDMACM_1.0" fn rgetsockopt(
        socket: c_int,
        level: c_int,
        optname: c_int,
        optval: *mut c_void,
        optlen: *mut socklen_t,
    ) -> c_int;
    "RDMACM_1.0" fn rfcntl(socket: c_int, cmd: c_int) -> c_int;
    "RDMACM_1.0" fn riomap(
        socket: c_int,
        buf: *mut c_void,
        len: size_t,
        prot: c_int,
        flags: c_int,
        offset: off_t,
    ) -> off_t;
    "RDMACM_1.0" fn riounmap(socket: c_int, buf: *mut c_void, len: size_t) -> c_int;
    "RDMACM_1.0" fn riowrite(
        socket: c_int,
        buf: *const c_void,
        count: size_t,
        offset: off_t,
        flags: c_int,
    ) -> size_t;
}
