//! Whether a stretch of this process's address space is mapped with the
//! access a memory registration asks for: what pinning the pages checks on
//! hardware (`ib_umem_get` fails with EFAULT on a hole, on a PROT_NONE
//! page, and on a read-only page when the MR asks for write access).
//!
//! The device reaches foreign memory (registered through
//! `ProtectionDomain::reg_mr_raw`, and everything the drop-in libibverbs
//! registers) with plain CPU copies on its engine thread: memory that is not
//! mapped as the MR needs would take the whole process down with SIGSEGV at
//! a peer's first access. So registration checks it first, once, against
//! `/proc/self/maps`: one pass over the process's mappings, whatever the
//! MR's size (no page is touched or faulted in), which gives the
//! permissions too. Where `/proc` is not mounted, the fallback reads one
//! byte of each page with `process_vm_readv` on this process, which fails
//! with EFAULT instead of faulting (and cannot tell read-only pages apart).
//!
//! Only a registration is checked: a program that unmaps memory it still
//! has registered has a use-after-free, as it would on hardware (where the
//! device goes on reaching the pinned pages); see docs/design.md.

use std::fs::File;
use std::io::{BufRead, BufReader, IoSliceMut};

use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::Pid;

/// Why a range cannot be registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MappingError {
    /// No mapping covers `at`, or the range wraps around the address space.
    #[error("address {at:#x} is not mapped")]
    Unmapped {
        /// The first address found unmapped.
        at: u64,
    },
    /// The page at `at` is mapped without read access (PROT_NONE).
    #[error("address {at:#x} is mapped without read access")]
    NotReadable {
        /// The first address found unreadable.
        at: u64,
    },
    /// Write access was asked and the page at `at` is mapped read-only.
    #[error("address {at:#x} is mapped read-only and the MR asks for write access")]
    NotWritable {
        /// The first address found read-only.
        at: u64,
    },
}

/// Checks that `[addr, addr + len)` is mapped readable, and writable when
/// `write`. Costs one pass over `/proc/self/maps` (or, without `/proc`, one
/// `process_vm_readv` per 512 pages).
pub(crate) fn check_mapped(addr: u64, len: usize, write: bool) -> Result<(), MappingError> {
    let end = addr
        .checked_add(len as u64)
        .ok_or(MappingError::Unmapped { at: addr })?;
    if len == 0 {
        return Ok(());
    }
    match File::open("/proc/self/maps") {
        Ok(maps) => check_in_maps(BufReader::new(maps), addr, end, write),
        Err(e) => {
            tracing::debug!("/proc/self/maps: {e}; probing pages with process_vm_readv");
            probe_pages(addr, end)
        }
    }
}

/// One line of `/proc/PID/maps`: `start-end perms …`, addresses in hex.
fn parse_line(line: &str) -> Option<(u64, u64, bool, bool)> {
    let mut fields = line.split_ascii_whitespace();
    let (lo, hi) = fields.next()?.split_once('-')?;
    let perms = fields.next()?.as_bytes();
    let lo = u64::from_str_radix(lo, 16).ok()?;
    let hi = u64::from_str_radix(hi, 16).ok()?;
    Some((
        lo,
        hi,
        perms.first() == Some(&b'r'),
        perms.get(1) == Some(&b'w'),
    ))
}

/// The check over the lines of a maps file (sorted by address; the kernel
/// reports every mapping that exists for the whole read, even while other
/// threads change others).
fn check_in_maps(maps: impl BufRead, addr: u64, end: u64, write: bool) -> Result<(), MappingError> {
    // Everything below `covered` is mapped as needed.
    let mut covered = addr;
    // Lines split as bytes: a mapped file's path need not be UTF-8, and
    // only the first two fields (ASCII) are read.
    for line in maps.split(b'\n') {
        let Ok(line) = line else { break };
        let head = line.splitn(3, |&b| b == b' ').take(2).collect::<Vec<_>>();
        let Some((lo, hi, readable, writable)) = head
            .iter()
            .map(|f| std::str::from_utf8(f))
            .collect::<Result<Vec<_>, _>>()
            .ok()
            .and_then(|f| parse_line(&f.join(" ")))
        else {
            continue;
        };
        if hi <= covered {
            continue;
        }
        if lo > covered {
            break;
        }
        if !readable {
            return Err(MappingError::NotReadable { at: covered });
        }
        if write && !writable {
            return Err(MappingError::NotWritable { at: covered });
        }
        covered = hi;
        if covered >= end {
            return Ok(());
        }
    }
    Err(MappingError::Unmapped { at: covered })
}

/// Pages probed per `process_vm_readv` call (well under IOV_MAX).
const PROBE_BATCH: usize = 512;

/// Without `/proc`: reads the first byte of each page of `[addr, end)`
/// through the kernel, which reports a hole or a PROT_NONE page as a short
/// read or EFAULT instead of faulting. A kernel that refuses the call
/// (seccomp, no CONFIG_CROSS_MEMORY_ATTACH) leaves the range unchecked.
fn probe_pages(addr: u64, end: u64) -> Result<(), MappingError> {
    let page = page_size();
    let first = addr & !(page - 1);
    let pid = Pid::this();
    let mut sink = [0u8; PROBE_BATCH];
    let mut at = first;
    while at < end {
        let mut remote = [RemoteIoVec { base: 0, len: 1 }; PROBE_BATCH];
        let mut n = 0;
        while n < PROBE_BATCH && at < end {
            // The first page is probed at `addr` itself, the others at their start.
            remote[n].base = at.max(addr) as usize;
            n += 1;
            at = at.saturating_add(page);
        }
        let mut local = [IoSliceMut::new(&mut sink[..n])];
        match process_vm_readv(pid, &mut local, &remote[..n]) {
            Ok(got) if got == n => {}
            Ok(got) => {
                return Err(MappingError::Unmapped {
                    at: remote[got].base as u64,
                })
            }
            Err(nix::errno::Errno::EFAULT) => {
                return Err(MappingError::Unmapped {
                    at: remote[0].base as u64,
                })
            }
            Err(e) => {
                tracing::debug!("process_vm_readv: {e}; registration not probed");
                return Ok(());
            }
        }
    }
    Ok(())
}

/// The page size (4 KiB when the system does not say).
fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon
00651000-00652000 r--p 00051000 08:02 173521      /usr/bin/dbus-daemon
00652000-00655000 rw-p 00052000 08:02 173521      /usr/bin/dbus-daemon
00655000-00656000 rw-p 00000000 00:00 0
00660000-00670000 ---p 00000000 00:00 0
00670000-00680000 rw-p 00000000 00:00 0           [heap]
";

    fn check(addr: u64, len: u64, write: bool) -> Result<(), MappingError> {
        check_in_maps(MAPS.as_bytes(), addr, addr + len, write)
    }

    #[test]
    fn adjacent_mappings_cover_a_range() {
        check(0x400000, 0x52000, false).unwrap();
        check(0x651000, 0x5000, false).unwrap();
        check(0x651800, 0x4800, false).unwrap();
        check(0x652000, 0x4000, true).unwrap();
        check(0x655fff, 1, true).unwrap();
        check(0x670000, 0x10000, true).unwrap();
    }

    #[test]
    fn holes_protection_and_read_only_pages_are_refused() {
        assert_eq!(
            check(0x655000, 0x2000, false),
            Err(MappingError::Unmapped { at: 0x656000 })
        );
        assert_eq!(
            check(0x300000, 0x1000, false),
            Err(MappingError::Unmapped { at: 0x300000 })
        );
        assert_eq!(
            check(0x680000, 1, false),
            Err(MappingError::Unmapped { at: 0x680000 })
        );
        assert_eq!(
            check(0x665000, 1, false),
            Err(MappingError::NotReadable { at: 0x665000 })
        );
        assert_eq!(
            check(0x651000, 0x2000, true),
            Err(MappingError::NotWritable { at: 0x651000 })
        );
    }

    #[test]
    fn this_process_is_probed_both_ways() {
        let v = vec![1u8; 3 * 4096];
        let (addr, len) = (v.as_ptr() as u64, v.len());
        check_mapped(addr, len, true).unwrap();
        probe_pages(addr, addr + len as u64).unwrap();
        assert!(check_mapped(u64::MAX - 4, 8, false).is_err());
        // The zero page is never mapped.
        assert!(check_mapped(16, 8, false).is_err());
        // The fallback sees the hole too, where the kernel lets a process
        // read itself (a seccomp policy may not: then nothing is probed).
        let mut byte = [0u8; 1];
        let readable = process_vm_readv(
            Pid::this(),
            &mut [IoSliceMut::new(&mut byte)],
            &[RemoteIoVec {
                base: addr as usize,
                len: 1,
            }],
        );
        match readable {
            Ok(1) => assert!(probe_pages(16, 24).is_err()),
            other => eprintln!("process_vm_readv on this process: {other:?}; not probed"),
        }
    }
}
