//! Atomic Extended Transport Header (28 bytes: address, R_Key, swap or add
//! value, compare value) and Atomic ACK ETH (8 bytes: the original value).

use crate::bytes::{get_u32, get_u64, set_u32, set_u64};
use crate::macros::header_view;
use crate::Result;

/// Length of the AtomicETH.
pub const ATOMIC_ETH_LEN: usize = 28;
/// Length of the AtomicAckETH.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;

header_view! {
    /// A view of an AtomicETH at the start of a buffer.
    AtomicEth, ATOMIC_ETH_LEN
}

header_view! {
    /// A view of an AtomicAckETH at the start of a buffer.
    AtomicAckEth, ATOMIC_ACK_ETH_LEN
}

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// Remote virtual address (8-byte aligned).
    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 0)
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 8)
    }

    /// Swap value (compare & swap) or add value (fetch & add).
    pub fn swap_add(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 12)
    }

    /// Compare value (compare & swap).
    pub fn compare(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 20)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), 0, v);
    }

    /// Sets the remote key.
    pub fn set_rkey(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 8, v);
    }

    /// Sets the swap or add value.
    pub fn set_swap_add(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), 12, v);
    }

    /// Sets the compare value.
    pub fn set_compare(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), 20, v);
    }
}

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// The value at the address before the atomic.
    pub fn orig(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    /// Sets the original value.
    pub fn set_orig(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), 0, v);
    }
}

/// The AtomicETH's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicEthRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap or add value.
    pub swap_add: u64,
    /// Compare value.
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Reads a view.
    pub fn parse<T: AsRef<[u8]>>(h: &AtomicEth<T>) -> Result<Self> {
        h.check_len()?;
        Ok(AtomicEthRepr {
            va: h.va(),
            rkey: h.rkey(),
            swap_add: h.swap_add(),
            compare: h.compare(),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ETH_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AtomicEth<T>) {
        h.set_va(self.va);
        h.set_rkey(self.rkey);
        h.set_swap_add(self.swap_add);
        h.set_compare(self.compare);
    }
}

/// The AtomicAckETH's field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicAckEthRepr {
    /// The original remote value.
    pub orig: u64,
}

impl AtomicAckEthRepr {
    /// Reads a view.
    pub fn parse<T: AsRef<[u8]>>(h: &AtomicAckEth<T>) -> Result<Self> {
        h.check_len()?;
        Ok(AtomicAckEthRepr { orig: h.orig() })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ACK_ETH_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AtomicAckEth<T>) {
        h.set_orig(self.orig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_eth_bytes() {
        let bytes: [u8; 28] = [
            0, 0, 0, 0, 0x10, 0, 0, 0x08, // va
            0xaa, 0xbb, 0xcc, 0xdd, // rkey
            0, 0, 0, 0, 0, 0, 0, 0x05, // swap/add
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe, // compare
        ];
        let r = AtomicEthRepr::parse(&AtomicEth::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            AtomicEthRepr {
                va: 0x1000_0008,
                rkey: 0xaabb_ccdd,
                swap_add: 5,
                compare: u64::MAX - 1
            }
        );
        let mut out = [0u8; 28];
        r.emit(&mut AtomicEth::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert!(AtomicEth::new_checked(&bytes[..27]).is_err());
    }

    #[test]
    fn atomic_ack_eth_bytes() {
        let bytes = [0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef];
        let r = AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(r.orig, 0x0123_4567_89ab_cdef);
        let mut out = [0u8; 8];
        r.emit(&mut AtomicAckEth::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }
}
