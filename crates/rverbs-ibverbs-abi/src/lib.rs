//! The ABI types of `<infiniband/verbs.h>` (Debian's rdma-core 44, x86_64)
//! as `#[repr(C)]` Rust: every struct, union, function-pointer slot and
//! constant a verbs implementation or its callers touch ([`abi`]), checked
//! field by field against the real header by `tests/layout.rs`; and those of
//! `<rdma/rdma_cma.h>` (librdmacm, [`abi::rdmacm`]), which build on them,
//! checked the same way by `tests/layout_rdmacm.rs`.
//!
//! Types only: the verbs themselves, and the `unsafe` of taking raw
//! pointers from C, are in the C library, `crates/rverbs-libibverbs`
//! (`libibverbs.so.1`), and `crates/rverbs-librdmacm` (`librdmacm.so.1`),
//! which build on these. One type is no header's: [`abi::rdmacm_ops`]'s
//! `RdmacmOps`, the table of rdma_cm functions rverbs' libibverbs exports
//! for rverbs' librdmacm to call through (with `for_each_rdmacm_function!`,
//! the list of their prototypes both libraries are generated from).

#![deny(missing_docs)]

pub mod abi;
