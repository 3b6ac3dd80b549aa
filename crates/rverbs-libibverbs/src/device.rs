//! Devices: `ibv_get_device_list` / `ibv_free_device_list`, a device's
//! name, GUID and index, and the `rverbs_device_disassociate` extension.
//! A C device (`handles::Device`) is made on first sight and lives as long
//! as the process.

use std::ffi::{c_char, c_int};
use std::ptr;
use std::sync::{Mutex, OnceLock};

use rverbs_ibverbs_abi::abi::*;

use crate::convert::copy_str;
use crate::ffi::{errno_of, guard, neg, null, set_errno};
use crate::handles::{device_ref, Device};

/// Every device handed out, by name; never freed (C keeps `ibv_device`
/// pointers past `ibv_free_device_list` as long as contexts use them).
fn registry() -> &'static Mutex<Vec<&'static Device>> {
    static DEVICES: OnceLock<Mutex<Vec<&'static Device>>> = OnceLock::new();
    DEVICES.get_or_init(|| Mutex::new(Vec::new()))
}

/// The C device for `dev`, made on first sight.
pub(crate) fn c_device(dev: rverbs::Device) -> &'static Device {
    let mut list = registry().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = list.iter().find(|d| d.rust.name() == dev.name()) {
        return d;
    }
    let mut ibv = ibv_device::default();
    ibv.node_type = IBV_NODE_CA;
    ibv.transport_type = IBV_TRANSPORT_IB;
    let index = list.len();
    copy_str(&mut ibv.name, dev.name());
    copy_str(&mut ibv.dev_name, &format!("uverbs{index}"));
    copy_str(
        &mut ibv.dev_path,
        &format!("/sys/class/infiniband_verbs/uverbs{index}"),
    );
    copy_str(
        &mut ibv.ibdev_path,
        &format!("/sys/class/infiniband/{}", dev.name()),
    );
    let d: &'static Device = Box::leak(Box::new(Device { ibv, rust: dev }));
    list.push(d);
    d
}

export! { "IBVERBS_1.1"
    /// `ibv_get_device_list`: a NULL-terminated array (free it with
    /// `ibv_free_device_list`), its length in `*num_devices` if not NULL.
    pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
        guard(ptr::null_mut(), || {
            let devices = match rverbs::devices() {
                Ok(d) => d,
                Err(e) => {
                    return null(errno_of(&e));
                }
            };
            let n = devices.len();
            // SAFETY: calloc of n + 1 pointers; checked for NULL below.
            let list = unsafe { libc::calloc(n + 1, std::mem::size_of::<*mut ibv_device>()) }
                .cast::<*mut ibv_device>();
            if list.is_null() {
                return null(libc::ENOMEM);
            }
            for (i, dev) in devices.into_iter().enumerate() {
                let d = c_device(dev);
                // SAFETY: i < n, inside the n + 1 slots allocated; the device
                // is leaked, so the pointer stays valid.
                unsafe { *list.add(i) = ptr::from_ref(&d.ibv).cast_mut() };
            }
            if !num_devices.is_null() {
                // SAFETY: the caller passes a writable int or NULL.
                unsafe { *num_devices = n as c_int };
            }
            list
        })
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_free_device_list`: frees the array (the devices stay).
    pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
        // SAFETY: `list` came from ibv_get_device_list's calloc (or is NULL).
        unsafe { libc::free(list.cast()) }
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_get_device_name`.
    pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
        // SAFETY: a device pointer from ibv_get_device_list, or NULL.
        match unsafe { device_ref(device) } {
            Some(d) => d.ibv.name.as_ptr(),
            None => {
                set_errno(libc::EINVAL);
                ptr::null()
            }
        }
    }
}

export! { "IBVERBS_1.1"
    /// `ibv_get_device_guid`: the node GUID in network byte order.
    pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
        // SAFETY: a device pointer from ibv_get_device_list, or NULL.
        match unsafe { device_ref(device) } {
            Some(d) => d.rust.guid().to_be(),
            None => 0,
        }
    }
}

export! { "IBVERBS_1.9"
    /// `ibv_get_device_index`: its position among the devices.
    pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
        // SAFETY: a device pointer from ibv_get_device_list, or NULL.
        let Some(d) = (unsafe { device_ref(device) }) else {
            return neg(libc::EINVAL);
        };
        let list = registry().lock().unwrap_or_else(|p| p.into_inner());
        list.iter()
            .position(|x| ptr::eq(*x, d))
            .map_or(-1, |i| i as c_int)
    }
}

/// `int rverbs_device_disassociate(struct ibv_device *device)` — an rverbs
/// extension (no libibverbs equivalent): what a hot-unplugged NIC does to
/// its device. Every open context gets IBV_EVENT_DEVICE_FATAL, blocked
/// event readers wake, later verbs fail with EIO, and destroys follow
/// RDMAV_ALLOW_DISASSOC_DESTROY. For testing a program's handling of
/// device loss. 0, or EINVAL for a pointer that is not a device.
#[no_mangle]
pub unsafe extern "C" fn rverbs_device_disassociate(device: *mut ibv_device) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a device pointer from ibv_get_device_list, or NULL.
        match unsafe { device_ref(device) } {
            Some(d) => {
                d.rust.disassociate();
                0
            }
            None => libc::EINVAL,
        }
    })
}
