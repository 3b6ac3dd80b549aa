//! Packet sequence numbers: 24-bit counters that wrap, compared modulo 2^24.

use std::cmp::Ordering;
use std::fmt;

/// A 24-bit packet sequence number (BTH PSN).
///
/// PSNs wrap from `0xFF_FFFF` to `0`, so they are ordered the way the IBTA
/// spec orders them: `a` is before `b` when `b - a (mod 2^24)` is in
/// `1..2^23`. That is not a total order, so `Psn` does not implement `Ord`;
/// use [`Psn::cmp_wrapping`], [`Psn::is_before`] and [`Psn::distance_to`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Number of distinct PSNs.
    pub const MODULUS: u32 = 1 << 24;
    /// The mask of the 24 PSN bits.
    pub const MASK: u32 = Self::MODULUS - 1;
    /// Half the PSN space: the farthest two PSNs can be apart and still be ordered.
    pub const HALF: u32 = Self::MODULUS / 2;

    /// A PSN from the low 24 bits of `value` (higher bits are dropped, as on the wire).
    pub const fn new(value: u32) -> Self {
        Psn(value & Self::MASK)
    }

    /// The PSN as a 24-bit integer.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// The PSN `n` steps later, wrapping.
    #[allow(clippy::should_implement_trait)]
    pub const fn add(self, n: u32) -> Self {
        Psn::new(self.0.wrapping_add(n))
    }

    /// The PSN `n` steps earlier, wrapping.
    pub const fn sub(self, n: u32) -> Self {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// The next PSN.
    pub const fn next(self) -> Self {
        self.add(1)
    }

    /// How many steps forward from `self` reach `later` (mod 2^24).
    pub const fn distance_to(self, later: Psn) -> u32 {
        later.0.wrapping_sub(self.0) & Self::MASK
    }

    /// Orders two PSNs within the half-space window (IBTA 9.7.2).
    ///
    /// `Less` when `self` precedes `other` by fewer than 2^23 steps,
    /// `Greater` when it follows by at most 2^23 steps.
    pub const fn cmp_wrapping(self, other: Psn) -> Ordering {
        let d = self.distance_to(other);
        if d == 0 {
            Ordering::Equal
        } else if d < Self::HALF {
            Ordering::Less
        } else {
            Ordering::Greater
        }
    }

    /// `self` comes strictly before `other`.
    pub const fn is_before(self, other: Psn) -> bool {
        matches!(self.cmp_wrapping(other), Ordering::Less)
    }

    /// `self` lies in the half-open window `[start, start + len)`, wrapping.
    pub const fn in_window(self, start: Psn, len: u32) -> bool {
        start.distance_to(self) < len
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> u32 {
        p.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_keeps_24_bits() {
        assert_eq!(Psn::new(0x1ff_ffff).value(), 0xff_ffff);
        assert_eq!(Psn::new(0x100_0000).value(), 0);
    }

    #[test]
    fn add_and_sub_wrap() {
        assert_eq!(Psn::new(0xff_ffff).next(), Psn::new(0));
        assert_eq!(Psn::new(0xff_fffe).add(5), Psn::new(3));
        assert_eq!(Psn::new(2).sub(5), Psn::new(0xff_fffd));
    }

    #[test]
    fn ordering_across_the_wrap() {
        let before = Psn::new(0xff_fff0);
        let after = Psn::new(0x10);
        assert!(before.is_before(after));
        assert!(!after.is_before(before));
        assert_eq!(before.distance_to(after), 0x20);
        assert_eq!(after.cmp_wrapping(before), Ordering::Greater);
        assert_eq!(after.cmp_wrapping(after), Ordering::Equal);
    }

    #[test]
    fn half_space_boundary() {
        let a = Psn::new(0);
        assert!(a.is_before(Psn::new(Psn::HALF - 1)));
        // Exactly half the space away counts as behind (a duplicate), as in the spec's window.
        assert!(!a.is_before(Psn::new(Psn::HALF)));
    }

    #[test]
    fn window_membership_wraps() {
        let start = Psn::new(0xff_fffe);
        assert!(Psn::new(0xff_fffe).in_window(start, 4));
        assert!(Psn::new(1).in_window(start, 4));
        assert!(!Psn::new(2).in_window(start, 4));
        assert!(!Psn::new(0xff_fffd).in_window(start, 4));
    }
}
