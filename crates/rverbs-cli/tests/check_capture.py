#!/usr/bin/python3
"""Checks a capture of rverbs traffic with scapy's RoCE layer, independently
of `rverbs decode` (tests/capture.rs compares the two).

    check_capture.py CAPTURE BATCHES

CAPTURE: a pcap of IPv4 RoCEv2 packets (every frame UDP to port 4791).
BATCHES: one line "FRAME SIZE" per UDP GSO batch in the capture (frames
numbered from 1): that frame's datagram holds RoCE packets of SIZE bytes
back to back, the last one maybe shorter, as a capture taken before
segmentation shows them.

Prints one line per RoCE packet, in capture order:

    FRAME OPCODE DESTQP PSN ok|bad

"ok" when the ICRC scapy computes equals the one in the packet: over the
IP and UDP headers as captured for an ordinary frame, and for segment k of
a batch over the headers Linux gives it on the wire — IPv4 ID the batch's
plus k, IP total length and UDP length of the segment (scapy fills those
in from the segment itself).
"""

import sys

from scapy.all import IP, UDP, PcapReader, raw
from scapy.contrib.roce import BTH


def verdict(pkt, wire):
    """'OPCODE DESTQP PSN ok|bad' for an IP/UDP/BTH packet whose ICRC on
    the wire is the four bytes `wire`."""
    bth = pkt[BTH]
    bth.icrc = None  # scapy computes it when building
    ok = raw(pkt)[-4:] == wire
    return "%d %d %d %s" % (bth.opcode, bth.dqpn, bth.psn, "ok" if ok else "bad")


def main(capture, batches):
    sizes = {}
    with open(batches) as f:
        for line in f:
            frame, size = line.split()
            sizes[int(frame)] = int(size)
    out = []
    for n, frame in enumerate(PcapReader(capture), 1):
        ip = frame[IP]
        udp = ip[UDP]
        # The IP packet as captured: the end of the frame (no link trailer on lo).
        packet = bytes(frame.original)[-ip.len:]
        assert packet[0] == 0x45 and len(packet) == ip.len, "frame %d" % n
        if n not in sizes:
            out.append("%d %s" % (n, verdict(ip, packet[-4:])))
            continue
        size = sizes.pop(n)
        data = packet[ip.ihl * 4 + 8:]
        for k, at in enumerate(range(0, len(data), size)):
            seg = data[at:at + size]
            pkt = IP(src=ip.src, dst=ip.dst, id=(ip.id + k) & 0xFFFF, flags=ip.flags,
                     ttl=ip.ttl, tos=ip.tos) / \
                UDP(sport=udp.sport, dport=udp.dport) / BTH(seg)
            out.append("%d %s" % (n, verdict(pkt, seg[-4:])))
    if sizes:
        sys.exit("batches past the end of the capture: %s" % sorted(sizes))
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
