#!/usr/bin/python3
"""Writes the captures tests/decode.rs feeds to `rverbs decode`, with scapy.

    make_captures.py DIR          write the captures
    make_captures.py send COUNT QP
                                  send RoCE packets to QPs QP, QP+1, … at 127.0.0.1:4791

The same frames go into one capture per link type (Ethernet, Linux SLL, SLL2,
BSD loopback, raw IP) as pcap, and Ethernet as pcapng too. DIR/expected.txt
holds one line per RoCE packet the decoder must print, in order:
"<opcode> <dest QP> <PSN> ok|bad", or "malformed".

Frames: RoCE packets of every RC/UC/UD opcode over IPv4 and IPv6 (from the
wire crate's scapy_roce.py), a TCP segment and a UDP datagram to another
port (skipped), one packet with a corrupted ICRC, one with an RD opcode
(malformed), and a UDP GSO batch of three RDMA WRITE middle packets as a
capture on lo shows it (one datagram, IP IDs 0, 1, 2 on the wire).
"""

import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "rverbs-wire", "tests"))

from scapy_roce import packets  # noqa: E402
from scapy.all import IP, IPv6, UDP, TCP, Raw, raw, wrpcap, wrpcapng  # noqa: E402
from scapy.contrib.roce import BTH  # noqa: E402
from scapy.layers.l2 import Ether, CookedLinux, CookedLinuxV2, Loopback  # noqa: E402

BASE_TIME = 1764420000.25  # 2025-11-29 12:40:00.25 UTC


def opcode_of(ip_bytes):
    ip_len = (ip_bytes[0] & 0xF) * 4 if ip_bytes[0] >> 4 == 4 else 40
    roce = ip_bytes[ip_len + 8:]
    qp = int.from_bytes(roce[5:8], "big")
    psn = int.from_bytes(roce[9:12], "big")
    return roce[0], qp, psn


def frames():
    """(IP packet bytes, expectation lines) in capture order."""
    out = []
    for pkt, _ in packets(4242, 76):
        op, qp, psn = opcode_of(pkt)
        out.append((pkt, ["0x%02x %d %d ok" % (op, qp, psn)]))
    out.insert(3, (raw(IP(src="10.0.0.1", dst="10.0.0.2") / TCP(dport=80) / Raw(b"GET /")), []))
    out.insert(7, (raw(IPv6(src="fd00::1", dst="fd00::2") / UDP(dport=53) / Raw(b"dns?")), []))

    good = next(p for p, _ in out[10:] if p[0] >> 4 == 4)
    bad = bytearray(good)
    bad[-1] ^= 0x5A
    op, qp, psn = opcode_of(bad)
    out.insert(12, (bytes(bad), ["0x%02x %d %d bad" % (op, qp, psn)]))

    rd = raw(IP(src="10.0.0.1", dst="10.0.0.2", id=7) / UDP(sport=4000, dport=4791)
             / BTH(opcode=0x40, dqpn=5, psn=9) / Raw(b"\0" * 8))
    out.insert(20, (rd, ["malformed"]))

    # A GSO batch: three segments as sent, then glued into one datagram.
    segs = []
    expect = []
    for k in range(3):
        seg = IP(src="127.0.0.1", dst="127.0.0.2", id=k, flags="DF", ttl=64) / \
            UDP(sport=50000, dport=4791, chksum=0) / \
            BTH(opcode=0x07, dqpn=0x12, psn=100 + k, ackreq=int(k == 2)) / Raw(bytes([k]) * 1024)
        roce = raw(seg)[28:]
        segs.append(roce)
        expect.append("0x07 %d %d ok" % (0x12, 100 + k))
    batch = b"".join(segs)
    glued = raw(IP(src="127.0.0.1", dst="127.0.0.2", id=0, flags="DF", ttl=64) /
                UDP(sport=50000, dport=4791, chksum=0) / Raw(batch))
    out.insert(30, (glued, expect))
    return out


def main(outdir):
    fr = frames()
    with open(os.path.join(outdir, "expected.txt"), "w") as f:
        for _, lines in fr:
            for line in lines:
                f.write(line + "\n")

    def stamp(pkts):
        for i, p in enumerate(pkts):
            p.time = BASE_TIME + i
        return pkts

    def v(p):
        return 4 if p[0] >> 4 == 4 else 6

    eth = stamp([Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02",
                       type=0x0800 if v(p) == 4 else 0x86DD) / Raw(p) for p, _ in fr])
    wrpcap(os.path.join(outdir, "eth.pcap"), eth)
    wrpcapng(os.path.join(outdir, "eth.pcapng"), eth)
    sll = stamp([CookedLinux(pkttype=0, lladdrtype=1, lladdrlen=6,
                             proto=0x0800 if v(p) == 4 else 0x86DD) / Raw(p) for p, _ in fr])
    wrpcap(os.path.join(outdir, "sll.pcap"), sll)
    sll2 = stamp([CookedLinuxV2(proto=0x0800 if v(p) == 4 else 0x86DD) / Raw(p) for p, _ in fr])
    wrpcap(os.path.join(outdir, "sll2.pcap"), sll2)
    null = stamp([Loopback(type=2 if v(p) == 4 else 24) / Raw(p) for p, _ in fr])
    wrpcap(os.path.join(outdir, "null.pcap"), null)
    rawip = stamp([Raw(p) for p, _ in fr])
    wrpcap(os.path.join(outdir, "raw.pcap"), rawip, linktype=101)

    # A frame cut short by the snap length, then a whole one, written by hand.
    good = fr[0][0]
    with open(os.path.join(outdir, "snaplen.pcap"), "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 101))
        f.write(struct.pack("<IIII", 1764420000, 0, 64, len(good)))
        f.write(good[:64])
        f.write(struct.pack("<IIII", 1764420001, 0, len(good), len(good)))
        f.write(good)


def send(count, qp):
    """Sends RoCE packets on lo: half through a raw socket with scapy's own IP
    headers (IDs counting from 1000), half through an ordinary unconnected
    UDP socket with DF set, where Linux writes IP ID 0 — so the ICRC is
    computed for ID 0, as rverbs' data path will do."""
    import socket
    from scapy.all import send as scapy_send
    IP_MTU_DISCOVER, IP_PMTUDISC_DO = 10, 2
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
    sock.bind(("127.0.0.1", 0))
    sport = sock.getsockname()[1]
    for k in range(count):
        bth = BTH(opcode=0x04, dqpn=qp + k, psn=k, ackreq=1) / Raw(b"rverbs-%05d" % k)  # 12 bytes: no pad
        if k % 2 == 0:
            scapy_send(IP(src="127.0.0.1", dst="127.0.0.1", id=1000 + k) /
                       UDP(sport=40000, dport=4791, chksum=0) / bth, iface="lo", verbose=False)
        else:
            whole = IP(src="127.0.0.1", dst="127.0.0.1", id=0, flags="DF", ttl=64) / \
                UDP(sport=sport, dport=4791, chksum=0) / bth
            sock.sendto(raw(whole)[28:], ("127.0.0.1", 4791))


if __name__ == "__main__":
    if sys.argv[1] == "send":
        send(int(sys.argv[2]), int(sys.argv[3], 0))
    else:
        main(sys.argv[1])
