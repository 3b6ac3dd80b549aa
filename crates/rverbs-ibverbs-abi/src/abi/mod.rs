//! The C ABI of `<infiniband/verbs.h>` (Debian bookworm, rdma-core 44,
//! x86_64) as `#[repr(C)]` Rust types.
//!
//! This module mirrors verbs.h: every struct and union a verbs
//! implementation or its callers touch, with the C names (`ibv_context`,
//! `verbs_context`, …), the C field names and the C field order, and the
//! enum values as constants. Function-pointer members are
//! `Option<unsafe extern "C" fn(..)>` with the prototypes verbs.h gives them,
//! so a NULL slot is `None`. `tests/layout.rs` compiles a C program against
//! the real header and checks the size and alignment of every type here, the
//! offset and size of every field (nested members and `verbs_context`'s slots
//! relative to its `context` member included) and the value of every
//! constant.
//!
//! Where C has something Rust cannot spell, the mapping is:
//! - an anonymous member union gets a named field: [`ibv_wc::imm`],
//!   [`ibv_send_wr::imm`] and [`ibv_send_wr::bind_mw_tso`];
//! - an unnamed nested struct or union type gets the name
//!   `<outer>_<member>`, e.g. [`ibv_send_wr_wr`] for `ibv_send_wr.wr` and
//!   [`ibv_send_wr_rdma`] for `ibv_send_wr.wr.rdma`;
//! - members named after Rust keywords are raw identifiers
//!   (`ibv_mw::r#type`, `verbs_context::r#priv`);
//! - struct types verbs.h only points to (`struct verbs_ex_private`,
//!   `struct _compat_ibv_port_attr`, …) are opaque;
//! - a C enum is a type alias of the integer gcc gives it ([`consts`]).
//!
//! `__be16`/`__be32`/`__be64` fields hold network byte order, as in C.
//!
//! The rdma_cm's types (`<rdma/rdma_cma.h>`, librdmacm) are in [`rdmacm`],
//! not re-exported here: they are a second header, built on this one. The
//! table through which rverbs' librdmacm reaches the rdma_cm inside rverbs'
//! libibverbs, [`rdmacm_ops::RdmacmOps`], is no header's: it is in
//! [`rdmacm_ops`].
//!
//! Every struct is plain old data: `Copy`, and `Default` is all-zero (null
//! pointers, `None` slots, zero integers, pthread objects equal to their
//! static initializers).

#![allow(non_camel_case_types)]
// verbs_context's `ABI_placeholder*` slots keep their C names.
#![allow(non_snake_case)]
// verbs.h's function-pointer slots are long prototypes; they stay inline so
// each field reads like its C declaration.
#![allow(clippy::type_complexity)]

/// Implements `Default` as all-zero for plain-old-data C types.
macro_rules! zeroed_default {
    ($($t:ty),* $(,)?) => {$(
        impl Default for $t {
            /// All-zero: null pointers, `None` function slots, zero integers.
            fn default() -> Self {
                // SAFETY: the type is plain-old-data mirroring a C struct or
                // union: its fields are integers, arrays of integers, raw
                // pointers, `Option`s of function pointers, other such types,
                // glibc's `pthread_mutex_t`/`pthread_cond_t` (byte arrays
                // whose all-zero value is also PTHREAD_*_INITIALIZER) and
                // glibc's socket addresses (integers and byte arrays). For
                // each of those all-zero bytes is a valid value.
                unsafe { core::mem::zeroed() }
            }
        }
    )*};
}

/// Declares a C struct that verbs.h only uses behind pointers.
macro_rules! opaque {
    ($($(#[$m:meta])* $name:ident;)*) => {$(
        $(#[$m])*
        #[repr(C)]
        pub struct $name {
            _data: [u8; 0],
            _marker: core::marker::PhantomData<(*mut u8, core::marker::PhantomPinned)>,
        }
    )*};
}

pub mod consts;
mod context;
mod device;
pub mod rdmacm;
pub mod rdmacm_ops;
mod resources;
mod wr;

pub use consts::*;
pub use context::*;
pub use device::*;
pub use resources::*;
pub use wr::*;

/// `__be16`: a 16-bit value in network byte order.
pub type __be16 = u16;
/// `__be32`: a 32-bit value in network byte order.
pub type __be32 = u32;
/// `__be64`: a 64-bit value in network byte order.
pub type __be64 = u64;
