//! Writes the version script that gives every exported symbol the version
//! node Debian's rdma-core 44 libibverbs gives it (symbols.txt: one
//! `name NODE` per line, taken from `objdump -T` of the installed library),
//! and sets the SONAME (build-support/version_script.rs, shared with
//! librdmacm).

#[path = "../../build-support/version_script.rs"]
mod version_script;

fn main() {
    version_script::write(&version_script::Versions {
        script: "libibverbs.map",
        soname: "libibverbs.so.1",
        // IBVERBS_PRIVATE_34 stands alone; so does RVERBS_PRIVATE_1, ours,
        // not Debian's: __rverbs_rdmacm_ops, the rdma_cm table rverbs'
        // librdmacm calls through (src/rdmacm).
        chain: &[
            "IBVERBS_1.0",
            "IBVERBS_1.1",
            "IBVERBS_1.5",
            "IBVERBS_1.6",
            "IBVERBS_1.7",
            "IBVERBS_1.8",
            "IBVERBS_1.9",
            "IBVERBS_1.10",
            "IBVERBS_1.11",
            "IBVERBS_1.12",
            "IBVERBS_1.13",
            "IBVERBS_1.14",
        ],
        standalone: &["IBVERBS_PRIVATE_34", "RVERBS_PRIVATE_1"],
    });
}
