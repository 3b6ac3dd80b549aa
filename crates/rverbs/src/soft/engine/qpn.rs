//! QP numbers: a counter over the 24-bit QPN space, sent through a keyed
//! permutation of that space (a Feistel network with random round keys
//! drawn when the device comes up). Numbers stay unique until the counter
//! wraps (2^24 allocations), yet one known QP number tells nothing of the
//! next or the previous: a peer cannot aim packets at its neighbours.

use crate::soft::memory::random_u32;

const QPN_MASK: u32 = 0x00ff_ffff;
const HALF_BITS: u32 = 12;
const HALF_MASK: u32 = (1 << HALF_BITS) - 1;
const ROUNDS: usize = 4;

/// The device's sequence of candidate QP numbers.
pub(super) struct QpnSequence {
    counter: u32,
    keys: [u32; ROUNDS],
}

impl QpnSequence {
    /// A sequence under fresh random keys, from a random start.
    pub(super) fn new() -> QpnSequence {
        QpnSequence {
            counter: random_u32() & QPN_MASK,
            keys: std::array::from_fn(|_| random_u32()),
        }
    }

    /// The next candidate: any 24-bit value, 0, 1 and 0xFFFFFF included
    /// (the caller skips those, and numbers in use).
    pub(super) fn next(&mut self) -> u32 {
        let n = self.counter;
        self.counter = (n + 1) & QPN_MASK;
        self.permute(n)
    }

    /// A bijection of the 24-bit space, keyed by `self.keys`.
    fn permute(&self, n: u32) -> u32 {
        let mut left = (n >> HALF_BITS) & HALF_MASK;
        let mut right = n & HALF_MASK;
        for &key in &self.keys {
            (left, right) = (right, left ^ round(right, key));
        }
        (left << HALF_BITS) | right
    }
}

/// The round function: a 12-bit mix of a half and a round key.
fn round(half: u32, key: u32) -> u32 {
    let mut x = (half ^ key).wrapping_mul(0x9e37_79b1);
    x ^= x >> 15;
    x = x.wrapping_mul(0x85eb_ca6b);
    x ^= x >> 13;
    (x >> 20) & HALF_MASK
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distinct counters give distinct numbers, all 24-bit.
    #[test]
    fn permutation_is_a_bijection() {
        let seq = QpnSequence::new();
        let mut seen = vec![false; 1 << 24];
        for n in 0..1u32 << 24 {
            let q = seq.permute(n);
            assert!(q <= QPN_MASK);
            assert!(
                !std::mem::replace(&mut seen[q as usize], true),
                "{q:#x} twice"
            );
        }
    }
}
