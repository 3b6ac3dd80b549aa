#!/usr/bin/python3
"""An independent RoCEv2 implementation for rverbs-wire's tests, on scapy.

    scapy_roce.py generate SEED COUNT   print COUNT random packets built with scapy
    scapy_roce.py check FILE            parse packets from FILE with scapy and verify them

Each packet is one line: the whole IP packet in hex, a space, and a canonical
description of its RoCE fields (see describe()). `generate` builds packets for
every RC, UC and UD opcode over IPv4 and IPv6 with scapy's RoCE layer, with
the ICRC computed by scapy (IPv4) or by ipv6_icrc() below, written from the
IBTA rules, not from rverbs. `check` parses each packet with scapy, checks
the description matches what scapy sees, and recomputes the ICRC the same
ways. The extension header layouts here are this file's own table.
"""

import random
import struct
import sys
import zlib

from scapy.all import IP, IPv6, UDP, Raw, raw
from scapy.contrib.roce import BTH, AETH

# low 5 bits -> (name, extension headers after BTH, carries payload)
BASE = {
    0x00: ("SEND_FIRST", [], True),
    0x01: ("SEND_MIDDLE", [], True),
    0x02: ("SEND_LAST", [], True),
    0x03: ("SEND_LAST_WITH_IMMEDIATE", ["imm"], True),
    0x04: ("SEND_ONLY", [], True),
    0x05: ("SEND_ONLY_WITH_IMMEDIATE", ["imm"], True),
    0x06: ("RDMA_WRITE_FIRST", ["reth"], True),
    0x07: ("RDMA_WRITE_MIDDLE", [], True),
    0x08: ("RDMA_WRITE_LAST", [], True),
    0x09: ("RDMA_WRITE_LAST_WITH_IMMEDIATE", ["imm"], True),
    0x0A: ("RDMA_WRITE_ONLY", ["reth"], True),
    0x0B: ("RDMA_WRITE_ONLY_WITH_IMMEDIATE", ["reth", "imm"], True),
    0x0C: ("RDMA_READ_REQUEST", ["reth"], False),
    0x0D: ("RDMA_READ_RESPONSE_FIRST", ["aeth"], True),
    0x0E: ("RDMA_READ_RESPONSE_MIDDLE", [], True),
    0x0F: ("RDMA_READ_RESPONSE_LAST", ["aeth"], True),
    0x10: ("RDMA_READ_RESPONSE_ONLY", ["aeth"], True),
    0x11: ("ACKNOWLEDGE", ["aeth"], False),
    0x12: ("ATOMIC_ACKNOWLEDGE", ["aeth", "atomicack"], False),
    0x13: ("COMPARE_SWAP", ["atomic"], False),
    0x14: ("FETCH_ADD", ["atomic"], False),
    0x16: ("SEND_LAST_WITH_INVALIDATE", ["ieth"], True),
    0x17: ("SEND_ONLY_WITH_INVALIDATE", ["ieth"], True),
    0x1D: ("ATOMIC_WRITE", ["reth"], True),
}
UC_OPS = [0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B]
UD_OPS = [0x04, 0x05]


def opcode_table():
    table = {}
    for low, (name, hdrs, payload) in BASE.items():
        table[low] = ("RC_" + name, hdrs, payload)
    for low in UC_OPS:
        name, hdrs, payload = BASE[low]
        table[0x20 | low] = ("UC_" + name, hdrs, payload)
    for low in UD_OPS:
        name, hdrs, payload = BASE[low]
        table[0x60 | low] = ("UD_" + name, ["deth"] + hdrs, payload)
    return table


OPCODES = opcode_table()
# wire order and size of each extension header
ORDER = ["deth", "reth", "atomic", "aeth", "atomicack", "imm", "ieth"]
SIZE = {"deth": 8, "reth": 16, "atomic": 28, "aeth": 4, "atomicack": 8, "imm": 4, "ieth": 4}
VALID_SYNDROMES = list(range(0x00, 0x40)) + list(range(0x60, 0x65))


def ext_pack(kind, v):
    if kind == "deth":
        return struct.pack("!IB", v["qkey"], 0) + v["srcqp"].to_bytes(3, "big")
    if kind == "reth":
        return struct.pack("!QII", v["va"], v["rkey"], v["dlen"])
    if kind == "atomic":
        return struct.pack("!QIQQ", v["va"], v["rkey"], v["swap"], v["cmp"])
    if kind == "aeth":
        return bytes([v["syn"]]) + v["msn"].to_bytes(3, "big")
    if kind == "atomicack":
        return struct.pack("!Q", v["orig"])
    if kind in ("imm", "ieth"):
        return struct.pack("!I", v["val"])
    raise ValueError(kind)


def ext_unpack(kind, b):
    if kind == "deth":
        return {"qkey": struct.unpack("!I", b[0:4])[0], "srcqp": int.from_bytes(b[5:8], "big")}
    if kind == "reth":
        va, rkey, dlen = struct.unpack("!QII", b)
        return {"va": va, "rkey": rkey, "dlen": dlen}
    if kind == "atomic":
        va, rkey, swap, cmp = struct.unpack("!QIQQ", b)
        return {"va": va, "rkey": rkey, "swap": swap, "cmp": cmp}
    if kind == "aeth":
        return {"syn": b[0], "msn": int.from_bytes(b[1:4], "big")}
    if kind == "atomicack":
        return {"orig": struct.unpack("!Q", b)[0]}
    if kind in ("imm", "ieth"):
        return {"val": struct.unpack("!I", b)[0]}
    raise ValueError(kind)


def ext_random(kind, rnd):
    r32 = lambda: rnd.getrandbits(32)
    r64 = lambda: rnd.getrandbits(64)
    if kind == "deth":
        return {"qkey": r32(), "srcqp": rnd.getrandbits(24)}
    if kind == "reth":
        return {"va": r64(), "rkey": r32(), "dlen": r32()}
    if kind == "atomic":
        return {"va": r64(), "rkey": r32(), "swap": r64(), "cmp": r64()}
    if kind == "aeth":
        return {"syn": rnd.choice(VALID_SYNDROMES), "msn": rnd.getrandbits(24)}
    if kind == "atomicack":
        return {"orig": r64()}
    return {"val": r32()}


def describe(f):
    """The canonical text both implementations print for a packet."""
    parts = [
        "op=0x%02x" % f["opcode"],
        "se=%d" % f["se"],
        "mig=%d" % f["mig"],
        "pad=%d" % f["pad"],
        "pkey=0x%04x" % f["pkey"],
        "fecn=%d" % f["fecn"],
        "becn=%d" % f["becn"],
        "qp=0x%06x" % f["qp"],
        "ack=%d" % f["ack"],
        "psn=%d" % f["psn"],
    ]
    for kind in ORDER:
        if kind in f["ext"]:
            v = f["ext"][kind]
            parts.append(kind + "=" + ",".join("%s:0x%x" % (k, v[k]) for k in sorted(v)))
    parts.append("payload=" + (f["payload"].hex() or "-"))
    return " ".join(parts)


def ipv6_icrc(ip6_header, udp_header, roce_without_icrc):
    """ICRC over an IPv6 packet, from the IBTA Annex A17 rules."""
    h = bytearray(ip6_header[:40])
    h[0] |= 0x0F
    h[1] = h[2] = h[3] = 0xFF
    h[7] = 0xFF
    u = bytearray(udp_header[:8])
    u[6] = u[7] = 0xFF
    bth = bytearray(roce_without_icrc[:12])
    bth[4] = 0xFF
    data = b"\xff" * 8 + bytes(h) + bytes(u) + bytes(bth) + roce_without_icrc[12:]
    return zlib.crc32(data) & 0xFFFFFFFF


def packets(seed, count):
    """Yields (IP packet bytes, description) for `count` random packets
    cycling through every opcode, alternately IPv4 and IPv6."""
    rnd = random.Random(seed)
    codes = sorted(OPCODES)
    for i in range(count):
        code = codes[i % len(codes)]
        name, hdrs, has_payload = OPCODES[code]
        ext = {k: ext_random(k, rnd) for k in hdrs}
        payload = bytes(rnd.getrandbits(8) for _ in range(rnd.choice([0, 1, 2, 3, 4, 7, 64, 255, 1024]))) if has_payload else b""
        pad = (4 - len(payload) % 4) % 4
        f = {
            "opcode": code, "se": rnd.getrandbits(1), "mig": rnd.getrandbits(1), "pad": pad,
            "pkey": rnd.getrandbits(16), "fecn": rnd.getrandbits(1), "becn": rnd.getrandbits(1),
            "qp": rnd.getrandbits(24), "ack": rnd.getrandbits(1), "psn": rnd.getrandbits(24),
            "ext": ext, "payload": payload,
        }
        body = b"".join(ext_pack(k, ext[k]) for k in ORDER if k in ext) + payload + b"\0" * pad
        bth = BTH(opcode=code, solicited=f["se"], migreq=f["mig"], padcount=pad, version=0,
                  pkey=f["pkey"], fecn=f["fecn"], becn=f["becn"], dqpn=f["qp"],
                  ackreq=f["ack"], psn=f["psn"])
        udp = UDP(sport=rnd.randrange(1024, 65536), dport=4791, chksum=0)
        if i % 2 == 0:
            ip = IP(src="%d.%d.%d.%d" % tuple(rnd.getrandbits(8) for _ in range(4)),
                    dst="%d.%d.%d.%d" % tuple(rnd.getrandbits(8) for _ in range(4)),
                    id=rnd.getrandbits(16), tos=rnd.getrandbits(8), ttl=rnd.randrange(1, 256),
                    flags="DF" if rnd.getrandbits(1) else 0)
            pkt = raw(ip / udp / bth / Raw(body))  # scapy fills in the ICRC
        else:
            ip6 = IPv6(src=":".join("%x" % rnd.getrandbits(16) for _ in range(8)),
                       dst=":".join("%x" % rnd.getrandbits(16) for _ in range(8)),
                       tc=rnd.getrandbits(8), fl=rnd.getrandbits(20), hlim=rnd.randrange(1, 256))
            bth.icrc = 0
            pkt = bytearray(raw(ip6 / udp / bth / Raw(body)))
            roce = pkt[48:-4]
            pkt[-4:] = struct.pack("<I", ipv6_icrc(pkt[:40], pkt[40:48], bytes(roce)))
            pkt = bytes(pkt)
        yield pkt, describe(f)


def generate(seed, count):
    for pkt, description in packets(seed, count):
        print(pkt.hex(), description)


def check(path):
    bad = 0
    n = 0
    with open(path) as fh:
        for line in fh:
            hexpkt, _, want = line.strip().partition(" ")
            n += 1
            pkt = bytes.fromhex(hexpkt)
            if pkt[0] >> 4 == 4:
                p = IP(pkt)
                ip_len = p.ihl * 4
                icrc_ok = raw(rebuild_v4(p))[-4:] == pkt[-4:]
            else:
                p = IPv6(pkt)
                ip_len = 40
                icrc_ok = struct.pack("<I", ipv6_icrc(pkt[:40], pkt[40:48], pkt[48:-4])) == pkt[-4:]
            if UDP not in p or p[UDP].dport != 4791 or BTH not in p:
                print("packet %d: scapy sees no RoCE packet" % n)
                bad += 1
                continue
            b = p[BTH]
            code = b.opcode
            if code not in OPCODES:
                print("packet %d: opcode 0x%02x not in the table" % (n, code))
                bad += 1
                continue
            _, hdrs, _ = OPCODES[code]
            rest = pkt[ip_len + 8 + 12:-4]
            ext = {}
            at = 0
            for kind in ORDER:
                if kind in hdrs:
                    ext[kind] = ext_unpack(kind, rest[at:at + SIZE[kind]])
                    at += SIZE[kind]
            if AETH in p and "aeth" in ext:
                # scapy's own AETH layer must agree with our slicing.
                assert p[AETH].syndrome == ext["aeth"]["syn"] and p[AETH].msn == ext["aeth"]["msn"]
            payload = rest[at:len(rest) - b.padcount]
            got = describe({
                "opcode": code, "se": b.solicited, "mig": b.migreq, "pad": b.padcount,
                "pkey": b.pkey, "fecn": b.fecn, "becn": b.becn, "qp": b.dqpn, "ack": b.ackreq,
                "psn": b.psn, "ext": ext, "payload": payload,
            })
            if got != want:
                print("packet %d: fields differ\n  scapy:  %s\n  rverbs: %s" % (n, got, want))
                bad += 1
            elif not icrc_ok:
                print("packet %d: ICRC differs from scapy's" % n)
                bad += 1
    print("checked %d packets, %d bad" % (n, bad))
    return 1 if bad or n == 0 else 0


def rebuild_v4(p):
    """The same IPv4 packet with scapy computing the ICRC afresh."""
    q = p.copy()
    q[BTH].icrc = None
    return q


if __name__ == "__main__":
    if sys.argv[1] == "generate":
        generate(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "check":
        sys.exit(check(sys.argv[2]))
    else:
        sys.exit("usage: scapy_roce.py generate SEED COUNT | check FILE")
