//! Datagram Extended Transport Header (8 bytes): the Q_Key and source QP of
//! a UD packet.

use crate::bytes::{get_u24, get_u32, set_u24, set_u32};
use crate::macros::header_view;
use crate::Result;

/// Length of the DETH.
pub const DETH_LEN: usize = 8;

header_view! {
    /// A view of a DETH at the start of a buffer.
    Deth, DETH_LEN
}

impl<T: AsRef<[u8]>> Deth<T> {
    /// Queue key.
    pub fn qkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }

    /// Source QP number (24 bits; byte 4 is reserved).
    pub fn src_qp(&self) -> u32 {
        get_u24(self.buffer.as_ref(), 5)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    /// Sets the queue key.
    pub fn set_qkey(&mut self, qkey: u32) {
        set_u32(self.buffer.as_mut(), 0, qkey);
    }

    /// Sets the source QP and clears the reserved byte.
    pub fn set_src_qp(&mut self, qpn: u32) {
        let b = self.buffer.as_mut();
        b[4] = 0;
        set_u24(b, 5, qpn & 0x00ff_ffff);
    }
}

/// The DETH's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP (24 bits).
    pub src_qp: u32,
}

impl DethRepr {
    /// Reads a view.
    pub fn parse<T: AsRef<[u8]>>(h: &Deth<T>) -> Result<Self> {
        h.check_len()?;
        Ok(DethRepr {
            qkey: h.qkey(),
            src_qp: h.src_qp(),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        DETH_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Deth<T>) {
        h.set_qkey(self.qkey);
        h.set_src_qp(self.src_qp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_emit() {
        let bytes = [0x11, 0x11, 0x11, 0x11, 0xee, 0x00, 0x01, 0x02];
        let r = DethRepr::parse(&Deth::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            DethRepr {
                qkey: 0x1111_1111,
                src_qp: 0x102
            }
        );
        let mut out = [0xffu8; 8];
        r.emit(&mut Deth::new_unchecked(&mut out[..]));
        assert_eq!(out, [0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x01, 0x02]);
        assert!(Deth::new_checked(&bytes[..7]).is_err());
    }
}
