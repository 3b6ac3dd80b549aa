//! Big-endian field access. Callers index within a checked header, so the
//! fixed-size conversions cannot fail.

pub(crate) fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(crate) fn get_u24(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}

pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn get_u64(b: &[u8], at: usize) -> u64 {
    (u64::from(get_u32(b, at)) << 32) | u64::from(get_u32(b, at + 4))
}

pub(crate) fn set_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn set_u24(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

pub(crate) fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn set_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// Reads `width` bits of byte `b` starting at `bit`, counted from the most
/// significant bit (the IBTA's `Byte[Bit]` notation: bit 0 is 0x80).
pub(crate) const fn get_bits(b: u8, bit: u32, width: u32) -> u8 {
    let mask = (1u16 << width) - 1;
    ((b as u16 >> (8 - bit - width)) & mask) as u8
}

/// Writes the low `width` bits of `v` into byte `at` at `bit` (counted from
/// the most significant bit), keeping the byte's other bits.
pub(crate) fn set_bits(b: &mut [u8], at: usize, bit: u32, width: u32, v: u8) {
    let mask = (((1u16 << width) - 1) << (8 - bit - width)) as u8;
    let shifted = ((u16::from(v) << (8 - bit - width)) as u8) & mask;
    b[at] = (b[at] & !mask) | shifted;
}

/// Reads the high 20 bits of the 32-bit word at `at` (a GRH-style flow label
/// followed by four other bits).
pub(crate) fn get_hi20(b: &[u8], at: usize) -> u32 {
    get_u32(b, at) >> 12
}

/// Writes the low 20 bits of `v` as the high 20 bits of the word at `at`,
/// keeping the word's low 12 bits.
pub(crate) fn set_hi20(b: &mut [u8], at: usize, v: u32) {
    let low = get_u32(b, at) & 0xfff;
    set_u32(b, at, ((v & 0x000f_ffff) << 12) | low);
}
