//! Verbs this library does not implement (yet): each reports EOPNOTSUPP the
//! way its C prototype reports errors — as the return value (`int`), as -1
//! with errno (`neg`), as NULL with errno (`ptr`) — or does nothing
//! (`void`). Arguments are ignored (the C calling convention allows it).

use std::ffi::{c_int, c_void};

use crate::ffi::set_errno;

macro_rules! unsupported {
    ($($node:literal $kind:ident $name:ident;)*) => {
        $( unsupported!(@one $node $kind $name); )*
    };
    (@one $node:literal int $name:ident) => {
        export! { $node
            /// Not supported on rverbs: EOPNOTSUPP.
            pub unsafe extern "C" fn $name() -> c_int {
                libc::EOPNOTSUPP
            }
        }
    };
    (@one $node:literal neg $name:ident) => {
        export! { $node
            /// Not supported on rverbs: -1, errno EOPNOTSUPP.
            pub unsafe extern "C" fn $name() -> c_int {
                set_errno(libc::EOPNOTSUPP);
                -1
            }
        }
    };
    (@one $node:literal ptr $name:ident) => {
        export! { $node
            /// Not supported on rverbs: NULL, errno EOPNOTSUPP.
            pub unsafe extern "C" fn $name() -> *mut c_void {
                set_errno(libc::EOPNOTSUPP);
                std::ptr::null_mut()
            }
        }
    };
    (@one $node:literal void $name:ident) => {
        export! { $node
            /// Not supported on rverbs: does nothing.
            pub unsafe extern "C" fn $name() {}
        }
    };
}

unsupported! {
    "IBVERBS_1.1" void ibv_copy_ah_attr_from_kern;
    "IBVERBS_1.0" void ibv_copy_path_rec_from_kern;
    "IBVERBS_1.0" void ibv_copy_path_rec_to_kern;
    "IBVERBS_1.0" void ibv_copy_qp_attr_from_kern;
    "IBVERBS_1.0" neg ibv_get_sysfs_path;
    "IBVERBS_1.10" ptr ibv_import_device;
    "IBVERBS_1.13" ptr ibv_import_dm;
    "IBVERBS_1.10" ptr ibv_import_mr;
    "IBVERBS_1.10" ptr ibv_import_pd;
    "IBVERBS_1.10" int ibv_query_ece;
    "IBVERBS_1.0" neg ibv_read_sysfs_file;
    "IBVERBS_1.12" ptr ibv_reg_dmabuf_mr;
    "IBVERBS_1.1" int ibv_resolve_eth_l2_from_gid;
    "IBVERBS_1.10" int ibv_set_ece;
    "IBVERBS_1.13" void ibv_unimport_dm;
    "IBVERBS_1.10" void ibv_unimport_mr;
    "IBVERBS_1.10" void ibv_unimport_pd;
}
