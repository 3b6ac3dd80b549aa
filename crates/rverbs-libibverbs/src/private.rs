//! IBVERBS_PRIVATE_34: the interface between libibverbs and its provider
//! plugins. Provider libraries (Debian's libmlx5, libefa …, which perftest
//! links) import these and register themselves from their constructors; on
//! rverbs there is no kernel device for them to drive, so registration is
//! ignored and the provider-private commands report EOPNOTSUPP.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::ffi::set_errno;

/// Defines provider-private functions that only report EOPNOTSUPP: as an
/// int return value (`int`), as -1 with errno (`neg`), as NULL with errno (`ptr`),
/// or nothing (`void`). Arguments are ignored (the C calling convention allows it).
macro_rules! inert {
    ($($kind:ident $name:ident;)*) => {
        $( inert!(@one $kind $name); )*
    };
    (@one int $name:ident) => {
        export! { "IBVERBS_PRIVATE_34"
            /// Provider-private: not supported on rverbs.
            pub unsafe extern "C" fn $name() -> c_int {
                libc::EOPNOTSUPP
            }
        }
    };
    (@one ptr $name:ident) => {
        export! { "IBVERBS_PRIVATE_34"
            /// Provider-private: not supported on rverbs.
            pub unsafe extern "C" fn $name() -> *mut c_void {
                set_errno(libc::EOPNOTSUPP);
                std::ptr::null_mut()
            }
        }
    };
    (@one neg $name:ident) => {
        export! { "IBVERBS_PRIVATE_34"
            /// Provider-private: not supported on rverbs (-1, errno EOPNOTSUPP).
            pub unsafe extern "C" fn $name() -> c_int {
                set_errno(libc::EOPNOTSUPP);
                -1
            }
        }
    };
    (@one void $name:ident) => {
        export! { "IBVERBS_PRIVATE_34"
            /// Provider-private: nothing to do on rverbs.
            pub unsafe extern "C" fn $name() {}
        }
    };
}

inert! {
    int __ioctl_final_num_attrs;
    void __verbs_log;
    ptr _verbs_init_and_alloc_context;
    int execute_ioctl;
    int ibv_cmd_advise_mr;
    int ibv_cmd_alloc_dm;
    int ibv_cmd_alloc_mw;
    int ibv_cmd_alloc_pd;
    int ibv_cmd_attach_mcast;
    int ibv_cmd_close_xrcd;
    int ibv_cmd_create_ah;
    int ibv_cmd_create_counters;
    int ibv_cmd_create_cq;
    int ibv_cmd_create_cq_ex;
    int ibv_cmd_create_flow;
    int ibv_cmd_create_flow_action_esp;
    int ibv_cmd_create_qp;
    int ibv_cmd_create_qp_ex;
    int ibv_cmd_create_qp_ex2;
    int ibv_cmd_create_rwq_ind_table;
    int ibv_cmd_create_srq;
    int ibv_cmd_create_srq_ex;
    int ibv_cmd_create_wq;
    int ibv_cmd_dealloc_mw;
    int ibv_cmd_dealloc_pd;
    int ibv_cmd_dereg_mr;
    int ibv_cmd_destroy_ah;
    int ibv_cmd_destroy_counters;
    int ibv_cmd_destroy_cq;
    int ibv_cmd_destroy_flow;
    int ibv_cmd_destroy_flow_action;
    int ibv_cmd_destroy_qp;
    int ibv_cmd_destroy_rwq_ind_table;
    int ibv_cmd_destroy_srq;
    int ibv_cmd_destroy_wq;
    int ibv_cmd_detach_mcast;
    int ibv_cmd_free_dm;
    int ibv_cmd_get_context;
    int ibv_cmd_modify_cq;
    int ibv_cmd_modify_flow_action_esp;
    int ibv_cmd_modify_qp;
    int ibv_cmd_modify_qp_ex;
    int ibv_cmd_modify_srq;
    int ibv_cmd_modify_wq;
    int ibv_cmd_open_qp;
    int ibv_cmd_open_xrcd;
    int ibv_cmd_poll_cq;
    int ibv_cmd_post_recv;
    int ibv_cmd_post_send;
    int ibv_cmd_post_srq_recv;
    int ibv_cmd_query_context;
    int ibv_cmd_query_device_any;
    int ibv_cmd_query_mr;
    int ibv_cmd_query_port;
    int ibv_cmd_query_qp;
    int ibv_cmd_query_srq;
    int ibv_cmd_read_counters;
    int ibv_cmd_reg_dm_mr;
    int ibv_cmd_reg_dmabuf_mr;
    int ibv_cmd_reg_mr;
    int ibv_cmd_req_notify_cq;
    int ibv_cmd_rereg_mr;
    int ibv_cmd_resize_cq;
    neg ibv_read_ibdev_sysfs_file;
    void verbs_init_cq;
    ptr verbs_open_device;
    void verbs_register_driver_34;
    void verbs_set_ops;
    void verbs_uninit_context;
}

/// `verbs_allow_disassociate_destroy` (a C `bool`, which `AtomicBool`'s
/// layout is): whether RDMAV_ALLOW_DISASSOC_DESTROY was set when the library
/// was loaded, as rverbs reads it; providers read this.
#[export_name = "rverbs_verbs_allow_disassociate_destroy"]
pub static VERBS_ALLOW_DISASSOCIATE_DESTROY: AtomicBool = AtomicBool::new(false);

/// Runs when the library is loaded: the environment is read once, then.
extern "C" fn at_load() {
    // RVERBS_LOG, set up once, when the library is loaded.
    rverbs::log::init_from_env();
    let allow = rverbs::allow_disassoc_destroy();
    VERBS_ALLOW_DISASSOCIATE_DESTROY.store(allow, Ordering::Relaxed);
    // SAFETY: registers a plain extern "C" function with no arguments, as
    // atexit takes; it catches its own panics.
    unsafe { libc::atexit(crate::context::report_at_exit) };
}

#[used]
#[link_section = ".init_array"]
static AT_LOAD: extern "C" fn() = at_load;

core::arch::global_asm!(
    ".symver rverbs_verbs_allow_disassociate_destroy, verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34"
);
