//! A drop-in `libibverbs.so.1`: the C verbs ABI of Debian's rdma-core 44
//! (symbols with their version nodes, struct layouts, the inline wrappers'
//! ops slots, errno conventions) over the rverbs software device, so
//! unmodified programs built against `<infiniband/verbs.h>` run on it.
//!
//! This crate is where the C ABI's `unsafe` lives: every exported function
//! takes raw pointers from C, checks what libibverbs checks, and catches
//! panics so none crosses into C.

pub mod abi;
