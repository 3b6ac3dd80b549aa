//! ICRC throughput for full 4 KiB-payload packets (an RDMA WRITE middle
//! packet at path MTU 4096), plus parsing and emitting the same packet; and
//! the same for the small packets that make up latency (an 8-byte SEND,
//! an ACK). Run with `cargo bench -p rverbs-wire`; criterion prints GB/s.

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rverbs_wire::icrc::{self, Ipv4Header, ROCE_V2_PORT};
use rverbs_wire::{BthRepr, Opcode, PacketRepr, Psn};

fn packet(opcode: Opcode, len: u32) -> (Vec<u8>, [u8; 20], [u8; 8]) {
    let payload: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
    let p = PacketRepr {
        payload: &payload,
        ..PacketRepr::new(BthRepr::new(opcode, 0x12, Psn::new(1000)))
    };
    let mut buf = vec![0u8; p.buffer_len()];
    p.emit(&mut buf).unwrap();
    let udp_len = (buf.len() + 8) as u16;
    let ip = Ipv4Header {
        src: Ipv4Addr::new(127, 0, 0, 1),
        dst: Ipv4Addr::new(127, 0, 0, 2),
        id: 0,
        dont_fragment: true,
        tos: 0,
        ttl: 64,
    }
    .to_bytes(udp_len);
    (buf, ip, icrc::udp_header(49152, ROCE_V2_PORT, udp_len))
}

fn bench(c: &mut Criterion) {
    for (name, opcode, len) in [
        ("4KiB packet", Opcode::RC_RDMA_WRITE_MIDDLE, 4096),
        ("8-byte SEND", Opcode::RC_SEND_ONLY, 8),
    ] {
        let (mut buf, ip, udp) = packet(opcode, len);
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Bytes(buf.len() as u64));
        g.bench_function("icrc compute", |b| {
            let body = buf.len() - 4;
            b.iter(|| icrc::compute(black_box(&ip), black_box(&udp), black_box(&buf[..body])))
        });
        g.bench_function("icrc fill", |b| {
            b.iter(|| icrc::fill(black_box(&ip), black_box(&udp), black_box(&mut buf)))
        });
        g.bench_function("parse", |b| {
            b.iter(|| PacketRepr::parse(black_box(&buf)).map(|p| p.payload.len()))
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
