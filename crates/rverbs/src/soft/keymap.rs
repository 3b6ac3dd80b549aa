//! Maps keyed by 32-bit numbers the device itself hands out (QP numbers, MR
//! keys), with a multiplicative hash instead of std's SipHash: the keys are
//! not chosen by an attacker who could insert (only this process creates
//! QPs and MRs), and a lookup on every packet should cost a multiply, not a
//! SipHash round.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` from a device-issued `u32` to `V`.
pub(crate) type KeyMap<V> = HashMap<u32, V, BuildHasherDefault<KeyHasher>>;

/// Fibonacci hashing of one `u32` (other writes fold in byte by byte).
#[derive(Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u32(u32::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        // The product's high bits mix every input bit; fold them down so
        // the low bits (bucket index) get them too.
        self.0 ^ (self.0 >> 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_and_random_keys_spread() {
        let mut map: KeyMap<u32> = KeyMap::default();
        for k in 0..10_000u32 {
            map.insert(0x00ab_cd00 + k, k);
        }
        for k in 0..10_000u32 {
            assert_eq!(map.get(&(0x00ab_cd00 + k)), Some(&k));
        }
        // Consecutive keys land in different low-bit buckets.
        let h = |k: u32| {
            let mut s = KeyHasher::default();
            s.write_u32(k);
            s.finish() & 0xff
        };
        let buckets: std::collections::HashSet<u64> = (0..256).map(h).collect();
        assert!(buckets.len() > 150, "{} distinct of 256", buckets.len());
    }
}
