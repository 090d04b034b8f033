"""Just enough PNG decoding (stdlib zlib) to tell a rendered page from a blank one."""

from __future__ import annotations

import struct
import zlib

CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # greyscale, RGB, grey+alpha, RGBA


def decode(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of raw pixel bytes) for an 8-bit non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and interlace == 0 and color in CHANNELS, (depth, color, interlace)
    return width, height, _unfilter(zlib.decompress(idat), width, height, CHANNELS[color])


def _unfilter(raw: bytes, width: int, height: int, bpp: int) -> list[bytes]:
    stride, rows, prev = width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + _predict(kind, a, b, c)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return rows


def _predict(kind: int, a: int, b: int, c: int) -> int:
    if kind == 0:
        return 0
    if kind == 1:
        return a
    if kind == 2:
        return b
    if kind == 3:
        return (a + b) // 2
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def colours(data: bytes, step: int = 3) -> dict[bytes, int]:
    """How many sampled pixels have each colour (every ``step``-th pixel, every row)."""
    width, _, rows = decode(data)
    bpp = len(rows[0]) // width
    seen: dict[bytes, int] = {}
    for row in rows:
        for x in range(0, width, step):
            px = row[x * bpp : x * bpp + 3]
            seen[px] = seen.get(px, 0) + 1
    return seen
