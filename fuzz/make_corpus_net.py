#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_net_header in fuzz/corpus/fuzz_net_header/ (valid and invalid inputs).

The byte layouts mirror src/net/wire.cpp (little-endian fields, one by one) and the comment at the top of
fuzz/fuzz_net_header.cpp. Re-running rewrites the same files. Usage: python3 fuzz/make_corpus_net.py [corpus dir]
"""
import pathlib
import struct
import sys

from corpus_util import clear_hand_made  # (fuzz/: the script's own folder is on sys.path)

HERE = pathlib.Path(__file__).resolve().parent
MAGIC, VERSION = 0x544E5754, 2
HELLO, AUTH, WELCOME, REFUSED, DATA, CREDIT, PING, BYE = range(1, 9)
SPAN, RUNS, PACKED = 0, 1, 2
FLOAT, UINT, INT = 2, 1, 0


def header(type_, body=0, seq=0, payload=0, flags=0, magic=MAGIC, version=VERSION):
    return struct.pack("<IHHIIQQ", magic, version, type_, flags, body, seq, payload)


def tensor(shape, strides, code=FLOAT, bits=32, carry=SPAN, offset=0, span=None, meta=b""):
    item = bits // 8
    if span is None:
        span = 0 if 0 in shape else (sum((n - 1) * abs(s) for n, s in zip(shape, strides)) + 1) * item
    out = struct.pack("<BBHBBHqQI", code, bits, 1, carry, 0, len(shape), offset, span, len(meta))
    out += b"".join(struct.pack("<q", n) for n in shape) + b"".join(struct.pack("<q", s) for s in strides)
    return out + meta


def message(tensors, kind=0, keys=()):
    out = struct.pack("<BBHI", kind, 0, len(tensors), len(keys))
    out += b"".join(struct.pack("<I", len(k)) + k for k in keys)
    return out + b"".join(tensors)


def data(body, payload=0):
    return bytes([0]) + header(DATA, len(body), 7, payload) + body


SEEDS = {
    "contiguous": data(message([tensor([4, 6], [6, 1])]), 96),
    "runs": data(message([tensor([8, 1024], [2048, 1], code=UINT, bits=8, carry=RUNS)]), 8192),
    "negative": data(message([tensor([5], [-1], code=INT, bits=16, offset=8)]), 10),
    "packed": data(message([tensor([3, 3], [3, 1], carry=PACKED)]), 36),
    "dict": data(message([tensor([2], [1]), tensor([3], [1])], kind=3, keys=(b"a", b"b")), 20),
    "broadcast_runs": data(message([tensor([4, 3], [0, 1], carry=RUNS)]), 48),
    "span_too_big": data(message([tensor([2], [1], span=1 << 40)]), 8),
    "empty": data(message([tensor([0, 3], [3, 1], span=0)]), 0),
    "bad_magic": bytes([0]) + header(DATA, magic=0x12345678),
    "bad_version": bytes([0]) + header(PING, version=9),
    "hello": bytes([1]) + bytes(range(32)) + b"\x01",
    "auth": bytes([2]) + struct.pack("<I", 5) + b"lidar" + bytes(32) + b"\x01" + bytes(32),
    "auth_long_topic": bytes([2]) + struct.pack("<I", 1 << 30) + b"x",
    "welcome": bytes([3]) + struct.pack("<IBB", 8, 0, 0),
    "refused": bytes([4]) + struct.pack("<I", 11) + b"wrong token",
    "refused_not_utf8": bytes([4]) + struct.pack("<I", 2) + b"\xff\xfe",
    "credit": bytes([5]) + header(CREDIT, seq=3),
}


def main():
    out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "corpus" / "fuzz_net_header"
    clear_hand_made(out)
    for name, blob in SEEDS.items():
        (out / name).write_bytes(blob)


if __name__ == "__main__":
    main()
