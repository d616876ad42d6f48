#!/usr/bin/env python3
"""Decode a PNG (stdlib only: zlib, struct) and print how much of it is drawn.

usage: png_stats.py FILE.png
prints one line: width=W height=H nonblank=F colors=C
  nonblank: fraction of pixels that differ from the most common colour
  colors:   distinct colours (capped at 10000)
exit 1 when the file is not a PNG this script understands (8-bit RGB/RGBA/grey).
Used by tests/test_report.cpp to check that the headless browser drew the report.
"""
import struct
import sys
import zlib
from collections import Counter


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG (bad signature)")
    pos, idat, hdr = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    w, h, depth, ctype, _, _, interlace = hdr
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(ctype)
    if depth != 8 or channels is None or interlace:
        raise ValueError("unsupported PNG: depth %d colour type %d interlace %d" % (depth, ctype, interlace))
    raw = zlib.decompress(b"".join(idat))
    stride = w * channels
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(h):
        f = raw[i]
        line = bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b = prev[x]
            c = prev[x - channels] if x >= channels else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + ((a + b) >> 1)) & 255
            elif f == 4:
                line[x] = (line[x] + paeth(a, b, c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, channels, rows


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    try:
        w, h, ch, rows = decode(sys.argv[1])
    except Exception as e:  # noqa: BLE001 -- report any decoding problem to the test
        print("error: %s" % e)
        return 1
    counts = Counter()
    for r in rows:
        for x in range(0, len(r), ch * 2):  # every other pixel: fast enough, same answer
            counts[r[x:x + ch]] += 1
    total = sum(counts.values())
    common = counts.most_common(1)[0][1] if counts else 0
    print("width=%d height=%d nonblank=%.4f colors=%d" % (w, h, 1 - common / max(total, 1), min(len(counts), 10000)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
