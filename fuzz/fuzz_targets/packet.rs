//! Fuzzes the RoCEv2 packet parser and the ICRC: no input may panic, and
//! whatever parses must re-emit to a packet that parses the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rverbs_wire::{icrc, PacketRepr};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = PacketRepr::parse(data) {
        let mut buf = vec![0u8; p.buffer_len()];
        let n = p.emit(&mut buf).expect("a parsed packet emits");
        assert_eq!(n, data.len());
        assert_eq!(PacketRepr::parse(&buf).expect("re-parses"), p);
    }
    // The ICRC over arbitrary "headers": split the input three ways.
    if data.len() >= 2 {
        let a = usize::from(data[0]) % data.len();
        let b = a + (usize::from(data[1]) % (data.len() - a + 1));
        let _ = icrc::compute(&data[..a], &data[a..b], &data[b..]);
    }
});
