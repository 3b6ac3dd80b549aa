//! Finding the rdma_cm: the [`RdmacmOps`] table of rverbs'
//! `libibverbs.so.1`, looked up once per process.
//!
//! The library is normally loaded already (a program that uses the rdma_cm
//! links libibverbs too), so it is first taken with `RTLD_NOLOAD`; else it
//! is loaded here, `RTLD_GLOBAL`, as a DT_NEEDED entry would have loaded it.
//! (This library has no DT_NEEDED on libibverbs.so.1: linking against it
//! would need libibverbs.so built first, and cargo does not order the builds
//! of two cdylibs; loading it at the first call gives the same library, the
//! one the loader's search path finds.) The handle is never closed: the
//! table's functions must stay valid for the life of the process. The
//! symbol is looked up with `dlvsym` at its own version node, so only
//! rverbs' libibverbs can answer, and its table must be of the version this
//! library was built for and at least as large. When it is not (Debian's
//! libibverbs is loaded, or none at all) one line on stderr says so, and
//! every call fails as an unimplemented one (`crate::forward`).

use std::ffi::{c_void, CStr};
use std::io::Write as _;
use std::mem::size_of;
use std::sync::OnceLock;

use rverbs_ibverbs_abi::abi::rdmacm_ops::{
    RdmacmOps, RdmacmOpsFn, RDMACM_OPS_NODE, RDMACM_OPS_SYMBOL, RDMACM_OPS_VERSION,
};

/// The SONAME the table is looked for in.
const LIBIBVERBS: &CStr = c"libibverbs.so.1";

/// The table, or `None` when the loaded libibverbs has none (decided once).
static TABLE: OnceLock<Option<&'static RdmacmOps>> = OnceLock::new();

/// The rdma_cm's table, or `None` (after saying why on stderr, once) when
/// the libibverbs.so.1 of this process is not rverbs'.
pub(crate) fn table() -> Option<&'static RdmacmOps> {
    *TABLE.get_or_init(|| match find() {
        Ok(ops) => Some(ops),
        Err(why) => {
            // A failed write to stderr is not worth failing for.
            let _ = writeln!(
                std::io::stderr(),
                "librdmacm (rverbs): libibverbs.so.1 is not rverbs' drop-in ({why}); \
                 rdma_cm calls fail with ENOSYS"
            );
            None
        }
    })
}

/// Loads (or finds loaded) libibverbs.so.1 and checks its table.
fn find() -> Result<&'static RdmacmOps, String> {
    // SAFETY: a NUL-terminated name and valid flags. With RTLD_NOLOAD,
    // dlopen only returns a library that is already loaded (matched by its
    // SONAME), taking a reference that is never dropped.
    let mut handle =
        unsafe { libc::dlopen(LIBIBVERBS.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        // SAFETY: as above; this loads the library and runs its
        // constructors, as the loader would for a DT_NEEDED entry.
        handle = unsafe { libc::dlopen(LIBIBVERBS.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    }
    if handle.is_null() {
        return Err(format!("cannot load it: {}", dl_error()));
    }
    // SAFETY: a handle dlopen returned, and NUL-terminated names.
    let symbol: *mut c_void =
        unsafe { libc::dlvsym(handle, RDMACM_OPS_SYMBOL.as_ptr(), RDMACM_OPS_NODE.as_ptr()) };
    if symbol.is_null() {
        return Err(dl_error());
    }
    // SAFETY: at this version node, only rverbs' libibverbs defines this
    // symbol, and it is a function of type RdmacmOpsFn
    // (`rverbs_ibverbs_abi::abi::rdmacm_ops`); a function pointer has the
    // size and representation of the address dlvsym returns.
    let get_ops = unsafe { std::mem::transmute::<*mut c_void, RdmacmOpsFn>(symbol) };
    // SAFETY: it takes nothing and returns its static table.
    let ops = unsafe { get_ops() };
    if ops.is_null() {
        return Err("its rdma_cm table is NULL".to_string());
    }
    // SAFETY: every version of the table begins with `size` and `version`
    // (offsets 0 and 8, inside any table); they are read through the raw
    // pointer, without a reference to the whole struct, whose size is not
    // known to fit yet.
    let (size, version) = unsafe {
        (
            std::ptr::addr_of!((*ops).size).read(),
            std::ptr::addr_of!((*ops).version).read(),
        )
    };
    if version != RDMACM_OPS_VERSION || size < size_of::<RdmacmOps>() {
        return Err(format!(
            "its rdma_cm table is version {version}, {size} bytes; this librdmacm needs \
             version {RDMACM_OPS_VERSION}, at least {} bytes",
            size_of::<RdmacmOps>()
        ));
    }
    // SAFETY: the table is a static of the loaded library, which is never
    // unloaded (the handle is never closed), of this version and at least
    // as large as RdmacmOps; it is never written.
    Ok(unsafe { &*ops })
}

/// The last `dl*` error of this thread.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string that stays
    // valid until the next dl* call of this thread; it is copied at once.
    let text = unsafe { libc::dlerror() };
    if text.is_null() {
        return "no dlerror".to_string();
    }
    // SAFETY: as above: non-NULL, NUL-terminated, valid for this read.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}
