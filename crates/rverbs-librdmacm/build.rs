//! Writes the version script that gives every exported symbol the version
//! node Debian's rdma-core 44 librdmacm gives it (symbols.txt: one
//! `name NODE` per line, taken from `objdump -T` of the installed library),
//! and sets the SONAME (build-support/version_script.rs, shared with
//! libibverbs).

#[path = "../../build-support/version_script.rs"]
mod version_script;

fn main() {
    version_script::write(&version_script::Versions {
        script: "librdmacm.map",
        soname: "librdmacm.so.1",
        // `readelf -V`: each node's parent is the one before.
        chain: &["RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"],
        standalone: &[],
    });
}
