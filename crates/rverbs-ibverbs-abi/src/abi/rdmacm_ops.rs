//! `RdmacmOps`: the private interface between rverbs' two drop-in C
//! libraries. It is no C header's: `librdmacm.so.1`
//! (`crates/rverbs-librdmacm`) holds no connection manager of its own: every
//! rdma_cm call must reach the devices, contexts and QPs of the
//! `libibverbs.so.1` the program loaded (`crates/rverbs-libibverbs`), and a
//! second copy of the engine inside librdmacm would have its own statics and
//! could never see them. So the rdma_cm lives in libibverbs, which exports
//! one function, [`RDMACM_OPS_SYMBOL`] at version node [`RDMACM_OPS_NODE`],
//! returning a static [`RdmacmOps`]: one slot per librdmacm function, with
//! that function's C prototype. librdmacm's exported functions call through
//! it.
//!
//! The slots are listed once, by [`for_each_rdmacm_function!`](crate::for_each_rdmacm_function), which hands
//! every prototype to a macro of the caller's: this module builds the struct
//! with it, libibverbs its table, librdmacm its exported forwarders. The
//! prototypes are those of `<rdma/rdma_cma.h>` and `<rdma/rsocket.h>` but
//! one: `rfcntl(int, int, ...)` is variadic, which stable Rust cannot
//! define, so its slot takes the third argument as a `c_long`. On x86_64
//! (System V) a variadic integer or pointer argument travels in the same
//! register as a named one, so librdmacm's `rfcntl`, defined with three named
//! arguments, receives it unchanged; with a command that takes no argument
//! (`F_GETFL`) the value is garbage and must be ignored, as C's `va_arg` is
//! never called for it.
//!
//! Compatibility: `size` is the size of the table libibverbs built (slots
//! are only ever appended, so a caller checks `size >=
//! size_of::<RdmacmOps>()` of the struct it was built with); `version` is
//! [`RDMACM_OPS_VERSION`], bumped when a slot changes meaning or prototype.
//! A `None` slot is a function the table's builder does not provide: the
//! caller fails it as librdmacm does an unimplemented call (ENOSYS).

use core::ffi::CStr;

/// The names the prototypes of [`for_each_rdmacm_function!`](crate::for_each_rdmacm_function) use: the
/// caller's macro expands in the caller's module, where these must be in
/// scope (`use rverbs_ibverbs_abi::abi::rdmacm_ops::prototype_types::*`) if
/// it spells the types out.
pub mod prototype_types {
    pub use crate::abi::rdmacm::*;
    pub use crate::abi::{
        __be16, ibv_context, ibv_ece, ibv_event_type, ibv_pd, ibv_qp_attr, ibv_qp_init_attr,
        ibv_qp_init_attr_ex, ibv_srq_init_attr, ibv_srq_init_attr_ex,
    };
    pub use core::ffi::{c_char, c_int, c_long, c_void};
    pub use libc::{
        fd_set, iovec, msghdr, nfds_t, off_t, pollfd, size_t, sockaddr, socklen_t, ssize_t, timeval,
    };
}

/// The name of the function libibverbs exports (`const RdmacmOps
/// *__rverbs_rdmacm_ops(void)`), which returns its static table.
pub const RDMACM_OPS_SYMBOL: &CStr = c"__rverbs_rdmacm_ops";

/// The version node of [`RDMACM_OPS_SYMBOL`] (a node of its own, parentless,
/// in libibverbs' version script): the symbol is looked up with `dlvsym`.
pub const RDMACM_OPS_NODE: &CStr = c"RVERBS_PRIVATE_1";

/// The version of [`RdmacmOps`] this crate describes.
pub const RDMACM_OPS_VERSION: u32 = 1;

/// The type of [`RDMACM_OPS_SYMBOL`].
pub type RdmacmOpsFn = unsafe extern "C" fn() -> *const RdmacmOps;

/// Hands every librdmacm function, as `"NODE" fn name(arg: type, ...) ->
/// ret;` (no `-> ret` for a `void` one; NODE is the version node Debian's
/// librdmacm exports it at), to the macro named by its argument: the 43
/// `rdma_*` functions of `<rdma/rdma_cma.h>`, then the 25 rsocket calls
/// (`rfcntl` with its third argument as a `c_long`: see the module doc).
/// The types are bare names: a caller whose macro expands them into code
/// must have [`prototype_types`](crate::abi::rdmacm_ops::prototype_types)`::*`
/// in scope. The order is the order of [`RdmacmOps`]' slots.
#[macro_export]
macro_rules! for_each_rdmacm_function {
    ($callback:ident) => {
        $callback! {
            // Event channels and events.
            "RDMACM_1.0" fn rdma_create_event_channel() -> *mut rdma_event_channel;
            "RDMACM_1.0" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel);
            "RDMACM_1.0" fn rdma_get_cm_event(
                channel: *mut rdma_event_channel,
                event: *mut *mut rdma_cm_event,
            ) -> c_int;
            "RDMACM_1.0" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int;
            "RDMACM_1.0" fn rdma_event_str(event: rdma_cm_event_type) -> *const c_char;

            // Ids and endpoints.
            "RDMACM_1.0" fn rdma_create_id(
                channel: *mut rdma_event_channel,
                id: *mut *mut rdma_cm_id,
                context: *mut c_void,
                ps: rdma_port_space,
            ) -> c_int;
            "RDMACM_1.0" fn rdma_create_ep(
                id: *mut *mut rdma_cm_id,
                res: *mut rdma_addrinfo,
                pd: *mut ibv_pd,
                qp_init_attr: *mut ibv_qp_init_attr,
            ) -> c_int;
            "RDMACM_1.0" fn rdma_destroy_ep(id: *mut rdma_cm_id);
            "RDMACM_1.0" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int;
            "RDMACM_1.0" fn rdma_migrate_id(
                id: *mut rdma_cm_id,
                channel: *mut rdma_event_channel,
            ) -> c_int;
            "RDMACM_1.0" fn rdma_set_option(
                id: *mut rdma_cm_id,
                level: c_int,
                optname: c_int,
                optval: *mut c_void,
                optlen: usize,
            ) -> c_int;

            // Addresses and routes.
            "RDMACM_1.0" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int;
            "RDMACM_1.0" fn rdma_resolve_addr(
                id: *mut rdma_cm_id,
                src_addr: *mut sockaddr,
                dst_addr: *mut sockaddr,
                timeout_ms: c_int,
            ) -> c_int;
            "RDMACM_1.0" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int;
            "RDMACM_1.0" fn rdma_get_src_port(id: *mut rdma_cm_id) -> __be16;
            "RDMACM_1.0" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> __be16;
            "RDMACM_1.0" fn rdma_getaddrinfo(
                node: *const c_char,
                service: *const c_char,
                hints: *const rdma_addrinfo,
                res: *mut *mut rdma_addrinfo,
            ) -> c_int;
            "RDMACM_1.0" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo);

            // Devices.
            "RDMACM_1.0" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context;
            "RDMACM_1.0" fn rdma_free_devices(list: *mut *mut ibv_context);

            // QPs and SRQs on an id.
            "RDMACM_1.0" fn rdma_create_qp(
                id: *mut rdma_cm_id,
                pd: *mut ibv_pd,
                qp_init_attr: *mut ibv_qp_init_attr,
            ) -> c_int;
            "RDMACM_1.0" fn rdma_create_qp_ex(
                id: *mut rdma_cm_id,
                qp_init_attr: *mut ibv_qp_init_attr_ex,
            ) -> c_int;
            "RDMACM_1.0" fn rdma_destroy_qp(id: *mut rdma_cm_id);
            "RDMACM_1.0" fn rdma_create_srq(
                id: *mut rdma_cm_id,
                pd: *mut ibv_pd,
                attr: *mut ibv_srq_init_attr,
            ) -> c_int;
            "RDMACM_1.0" fn rdma_create_srq_ex(
                id: *mut rdma_cm_id,
                attr: *mut ibv_srq_init_attr_ex,
            ) -> c_int;
            "RDMACM_1.0" fn rdma_destroy_srq(id: *mut rdma_cm_id);
            "RDMACM_1.2" fn rdma_init_qp_attr(
                id: *mut rdma_cm_id,
                qp_attr: *mut ibv_qp_attr,
                qp_attr_mask: *mut c_int,
            ) -> c_int;

            // Connections.
            "RDMACM_1.0" fn rdma_connect(
                id: *mut rdma_cm_id,
                conn_param: *mut rdma_conn_param,
            ) -> c_int;
            "RDMACM_1.2" fn rdma_establish(id: *mut rdma_cm_id) -> c_int;
            "RDMACM_1.0" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int;
            "RDMACM_1.0" fn rdma_get_request(
                listen: *mut rdma_cm_id,
                id: *mut *mut rdma_cm_id,
            ) -> c_int;
            "RDMACM_1.0" fn rdma_accept(
                id: *mut rdma_cm_id,
                conn_param: *mut rdma_conn_param,
            ) -> c_int;
            "RDMACM_1.0" fn rdma_reject(
                id: *mut rdma_cm_id,
                private_data: *const c_void,
                private_data_len: u8,
            ) -> c_int;
            "RDMACM_1.3" fn rdma_reject_ece(
                id: *mut rdma_cm_id,
                private_data: *const c_void,
                private_data_len: u8,
            ) -> c_int;
            "RDMACM_1.0" fn rdma_notify(id: *mut rdma_cm_id, event: ibv_event_type) -> c_int;
            "RDMACM_1.0" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int;
            "RDMACM_1.3" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int;
            "RDMACM_1.3" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int;

            // Multicast.
            "RDMACM_1.0" fn rdma_join_multicast(
                id: *mut rdma_cm_id,
                addr: *mut sockaddr,
                context: *mut c_void,
            ) -> c_int;
            "RDMACM_1.1" fn rdma_join_multicast_ex(
                id: *mut rdma_cm_id,
                mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
                context: *mut c_void,
            ) -> c_int;
            "RDMACM_1.0" fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int;

            // rsockets.
            "RDMACM_1.0" fn rsocket(domain: c_int, r#type: c_int, protocol: c_int) -> c_int;
            "RDMACM_1.0" fn rbind(socket: c_int, addr: *const sockaddr, addrlen: socklen_t) -> c_int;
            "RDMACM_1.0" fn rlisten(socket: c_int, backlog: c_int) -> c_int;
            "RDMACM_1.0" fn raccept(
                socket: c_int,
                addr: *mut sockaddr,
                addrlen: *mut socklen_t,
            ) -> c_int;
            "RDMACM_1.0" fn rconnect(
                socket: c_int,
                addr: *const sockaddr,
                addrlen: socklen_t,
            ) -> c_int;
            "RDMACM_1.0" fn rshutdown(socket: c_int, how: c_int) -> c_int;
            "RDMACM_1.0" fn rclose(socket: c_int) -> c_int;
            "RDMACM_1.0" fn rrecv(
                socket: c_int,
                buf: *mut c_void,
                len: size_t,
                flags: c_int,
            ) -> ssize_t;
            "RDMACM_1.0" fn rrecvfrom(
                socket: c_int,
                buf: *mut c_void,
                len: size_t,
                flags: c_int,
                src_addr: *mut sockaddr,
                addrlen: *mut socklen_t,
            ) -> ssize_t;
            "RDMACM_1.0" fn rrecvmsg(socket: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
            "RDMACM_1.0" fn rsend(
                socket: c_int,
                buf: *const c_void,
                len: size_t,
                flags: c_int,
            ) -> ssize_t;
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
            "RDMACM_1.0" fn rfcntl(socket: c_int, cmd: c_int, arg: c_long) -> c_int;
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
    };
}

/// Defines [`RdmacmOps`] from the list of [`for_each_rdmacm_function!`](crate::for_each_rdmacm_function).
macro_rules! define_rdmacm_ops {
    ($($node:literal fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        /// The table of librdmacm's functions that libibverbs'
        /// [`RDMACM_OPS_SYMBOL`] returns (see the module doc): `size` and
        /// `version` first, at offsets 0 and 8 in every version, then one
        /// slot per function, in the order of
        /// [`for_each_rdmacm_function!`](crate::for_each_rdmacm_function), each with the function's C
        /// prototype.
        #[repr(C)]
        #[derive(Clone, Copy)]
        pub struct RdmacmOps {
            /// `sizeof` the table as its builder laid it out.
            pub size: usize,
            /// [`RDMACM_OPS_VERSION`] of its builder.
            pub version: u32,
            $(
                #[doc = concat!("`", stringify!($name), "` (librdmacm's, at ", $node, ").")]
                pub $name: Option<unsafe extern "C" fn($($arg: $ty),*) $(-> $ret)?>,
            )*
        }

        /// How many function slots [`RdmacmOps`] has.
        pub const RDMACM_OPS_FUNCTIONS: usize = [$(stringify!($name)),*].len();
    };
}

use prototype_types::*;

crate::for_each_rdmacm_function!(define_rdmacm_ops);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn one_slot_per_librdmacm_function_after_size_and_version() {
        // 43 rdma_* functions and 25 rsocket calls: librdmacm's 68 symbols.
        assert_eq!(RDMACM_OPS_FUNCTIONS, 68);
        assert_eq!(offset_of!(RdmacmOps, size), 0);
        assert_eq!(offset_of!(RdmacmOps, version), 8);
        assert_eq!(offset_of!(RdmacmOps, rdma_create_event_channel), 16);
        assert_eq!(offset_of!(RdmacmOps, riowrite), 16 + 67 * 8);
        assert_eq!(size_of::<RdmacmOps>(), 16 + 68 * 8);
    }
}
