//! RDMA Extended Transport Header (16 bytes): virtual address, R_Key and DMA
//! length of an RDMA WRITE or READ.

use crate::bytes::{get_u32, get_u64, set_u32, set_u64};
use crate::macros::header_view;
use crate::Result;

/// Length of the RETH.
pub const RETH_LEN: usize = 16;

header_view! {
    /// A view of a RETH at the start of a buffer.
    Reth, RETH_LEN
}

impl<T: AsRef<[u8]>> Reth<T> {
    /// Remote virtual address.
    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 0)
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 8)
    }

    /// Length of the whole RDMA operation in bytes.
    pub fn dma_len(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 12)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, va: u64) {
        set_u64(self.buffer.as_mut(), 0, va);
    }

    /// Sets the remote key.
    pub fn set_rkey(&mut self, rkey: u32) {
        set_u32(self.buffer.as_mut(), 8, rkey);
    }

    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, len: u32) {
        set_u32(self.buffer.as_mut(), 12, len);
    }
}

/// The RETH's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length.
    pub dma_len: u32,
}

impl RethRepr {
    /// Reads a view.
    pub fn parse<T: AsRef<[u8]>>(h: &Reth<T>) -> Result<Self> {
        h.check_len()?;
        Ok(RethRepr {
            va: h.va(),
            rkey: h.rkey(),
            dma_len: h.dma_len(),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        RETH_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Reth<T>) {
        h.set_va(self.va);
        h.set_rkey(self.rkey);
        h.set_dma_len(self.dma_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTES: [u8; 16] = [
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x78, 0x00, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x01, 0x00,
        0x00,
    ];
    const REPR: RethRepr = RethRepr {
        va: 0x7f12_3456_7800,
        rkey: 0xdead_beef,
        dma_len: 65536,
    };

    #[test]
    fn parse_and_emit() {
        let h = Reth::new_checked(&BYTES[..]).unwrap();
        assert_eq!(RethRepr::parse(&h).unwrap(), REPR);
        let mut out = [0u8; 16];
        REPR.emit(&mut Reth::new_unchecked(&mut out[..]));
        assert_eq!(out, BYTES);
        assert!(Reth::new_checked(&BYTES[..15]).is_err());
    }
}
