#!/usr/bin/env python3
"""Writes the demo page's PNG icons (www/icon-192.png, www/icon-512.png) from
the same shapes as www/icon.svg: a rounded square and a bolt, rasterised with
4x4 supersampling. Standard library only: run it again after changing a shape."""
import struct
import zlib
from pathlib import Path

BG = (0x26, 0x21, 0x5C)
BOLT = (0xFF, 0xD2, 0x3F)
# icon.svg's path, in its 512-unit box.
POLY = [(292, 56), (120, 292), (236, 292), (212, 456), (392, 208), (276, 208)]
RADIUS = 96


def inside_poly(x, y):
    n, hit = len(POLY), False
    for i in range(n):
        (x1, y1), (x2, y2) = POLY[i], POLY[(i + 1) % n]
        if (y1 > y) != (y2 > y) and x < x1 + (y - y1) * (x2 - x1) / (y2 - y1):
            hit = not hit
    return hit


def inside_square(x, y):
    cx = min(max(x, RADIUS), 512 - RADIUS)
    cy = min(max(y, RADIUS), 512 - RADIUS)
    return (x - cx) ** 2 + (y - cy) ** 2 <= RADIUS**2


def png(size):
    rows, s = [], 4
    for py in range(size):
        row = bytearray([0])
        for px in range(size):
            acc = [0, 0, 0, 0]
            for sy in range(s):
                for sx in range(s):
                    x = (px + (sx + 0.5) / s) * 512 / size
                    y = (py + (sy + 0.5) / s) * 512 / size
                    if not inside_square(x, y):
                        continue
                    c = BOLT if inside_poly(x, y) else BG
                    acc[0] += c[0]; acc[1] += c[1]; acc[2] += c[2]; acc[3] += 255
            n = s * s
            a = acc[3] // n
            if a:
                row += bytes([acc[0] * 255 // acc[3], acc[1] * 255 // acc[3], acc[2] * 255 // acc[3], a])
            else:
                row += bytes(4)
        rows.append(bytes(row))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"".join(rows), 9)) + chunk(b"IEND", b"")


here = Path(__file__).resolve().parent / "www"
for size in (192, 512):
    (here / f"icon-{size}.png").write_bytes(png(size))
    print(f"www/icon-{size}.png")
