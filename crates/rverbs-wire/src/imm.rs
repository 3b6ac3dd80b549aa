//! The two 4-byte extension headers: Immediate Data (ImmDt) and Invalidate
//! ETH (IETH, the R_Key to invalidate).

use crate::bytes::{get_u32, set_u32};
use crate::macros::header_view;
use crate::Result;

/// Length of ImmDt and of IETH.
pub const IMM_LEN: usize = 4;

header_view! {
    /// A view of an ImmDt header.
    ImmDt, IMM_LEN
}

header_view! {
    /// A view of an IETH.
    Ieth, IMM_LEN
}

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// The immediate value, as the 32 bits on the wire read big-endian.
    pub fn imm(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    /// Sets the immediate value.
    pub fn set_imm(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 0, v);
    }
}

impl<T: AsRef<[u8]>> Ieth<T> {
    /// The R_Key to invalidate.
    pub fn rkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    /// Sets the R_Key to invalidate.
    pub fn set_rkey(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 0, v);
    }
}

/// Immediate data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImmDtRepr(pub u32);

impl ImmDtRepr {
    /// Reads a view.
    pub fn parse<T: AsRef<[u8]>>(h: &ImmDt<T>) -> Result<Self> {
        h.check_len()?;
        Ok(ImmDtRepr(h.imm()))
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        IMM_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut ImmDt<T>) {
        h.set_imm(self.0);
    }
}

/// An R_Key to invalidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IethRepr(pub u32);

impl IethRepr {
    /// Reads a view.
    pub fn parse<T: AsRef<[u8]>>(h: &Ieth<T>) -> Result<Self> {
        h.check_len()?;
        Ok(IethRepr(h.rkey()))
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        IMM_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Ieth<T>) {
        h.set_rkey(self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_emit() {
        let bytes = [0x12, 0x34, 0x56, 0x78];
        assert_eq!(
            ImmDtRepr::parse(&ImmDt::new_checked(&bytes[..]).unwrap()).unwrap(),
            ImmDtRepr(0x1234_5678)
        );
        assert_eq!(
            IethRepr::parse(&Ieth::new_checked(&bytes[..]).unwrap()).unwrap(),
            IethRepr(0x1234_5678)
        );
        let mut out = [0u8; 4];
        ImmDtRepr(0xcafe_f00d).emit(&mut ImmDt::new_unchecked(&mut out[..]));
        assert_eq!(out, [0xca, 0xfe, 0xf0, 0x0d]);
        IethRepr(0x0102_0304).emit(&mut Ieth::new_unchecked(&mut out[..]));
        assert_eq!(out, [1, 2, 3, 4]);
        assert!(ImmDt::new_checked(&bytes[..3]).is_err());
        assert!(Ieth::new_checked(&bytes[..0]).is_err());
    }
}
