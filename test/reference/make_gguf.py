#!/usr/bin/env python3
"""A GGUF file written from the format's description (ggml's docs/gguf.md and
the block layouts of ggml's quantised types), not by xfmr: the reference the
reader is checked against (test/io/test_gguf.cpp).

    python3 test/reference/make_gguf.py OUT.gguf

It holds a metadata key of every value type (arrays of numbers and of
strings among them), and one tensor of each type xfmr reads (F32, F16, BF16,
Q8_0, Q4_0, Q4_K, Q6_K) with random blocks; beside each, an F32 tensor
"<name>.expected" of the values this file's own plain decoder gives them.
"""
import struct
import sys

import numpy as np

ALIGN = 32
rng = np.random.default_rng(74)


def string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def value(vtype, v):
    if vtype == 8:
        return string(v)
    return struct.pack(SCALARS[vtype], v)


def kv(key, vtype, v):
    out = string(key) + struct.pack("<I", vtype)
    if vtype == 9:  # array: (element type, items)
        etype, items = v
        out += struct.pack("<IQ", etype, len(items)) + b"".join(value(etype, x) for x in items)
    else:
        out += value(vtype, v)
    return out


def f16(x):
    return np.float16(x).view(np.uint16).item()


def half(u):
    return float(np.uint16(u).view(np.float16))


# Blocks and their plain decoding, one type at a time.
def q8_0(blocks):
    raw, vals = b"", []
    for _ in range(blocks):
        d = f16(rng.uniform(0.001, 0.1))
        q = rng.integers(-128, 128, 32).astype(np.int8)
        raw += struct.pack("<H", d) + q.tobytes()
        vals += [half(d) * float(x) for x in q]
    return raw, vals


def q4_0(blocks):
    raw, vals = b"", []
    for _ in range(blocks):
        d = f16(rng.uniform(0.001, 0.1))
        nib = rng.integers(0, 16, 32)
        packed = bytes(int(nib[j]) | (int(nib[j + 16]) << 4) for j in range(16))
        raw += struct.pack("<H", d) + packed
        vals += [half(d) * (int(n) - 8) for n in nib]
    return raw, vals


def pack_q4_k(d, dmin, sc, mn, nib):
    """A Q4_K super-block: float16 bits d and dmin, eight 6-bit scales and
    minimums, 256 4-bit values (value = d sc[s] nib - dmin mn[s], s = i / 32)."""
    s = [0] * 12
    for j in range(4):
        s[j] = int(sc[j]) | ((int(sc[j + 4]) >> 4) << 6)
        s[j + 4] = int(mn[j]) | ((int(mn[j + 4]) >> 4) << 6)
        s[j + 8] = (int(sc[j + 4]) & 15) | ((int(mn[j + 4]) & 15) << 4)
    qs = bytearray(128)
    for i in range(4):  # 64 values from 32 bytes: low nibbles sub-block 2i, high 2i + 1
        for l in range(32):
            qs[32 * i + l] = int(nib[64 * i + l]) | (int(nib[64 * i + 32 + l]) << 4)
    return struct.pack("<HH", d, dmin) + bytes(s) + bytes(qs)


def pack_q6_k(q, sc, d):
    """A Q6_K super-block: 256 6-bit values q (value = d sc[i / 16] (q - 32)),
    sixteen int8 scales, float16 bits d."""
    ql, qh = bytearray(128), bytearray(64)
    for h in range(2):  # halves of 128: values l, l+32, l+64, l+96
        for l in range(32):
            a, b, c, e = (int(q[128 * h + l + k]) for k in (0, 32, 64, 96))
            ql[64 * h + l] = (a & 15) | ((c & 15) << 4)
            ql[64 * h + l + 32] = (b & 15) | ((e & 15) << 4)
            qh[32 * h + l] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6)
    return bytes(ql) + bytes(qh) + np.asarray(sc, dtype=np.int8).tobytes() + struct.pack("<H", d)


def q4_k(blocks):
    raw, vals = b"", []
    for _ in range(blocks):
        d, dmin = f16(rng.uniform(0.001, 0.05)), f16(rng.uniform(0.001, 0.05))
        sc = rng.integers(0, 64, 8)
        mn = rng.integers(0, 64, 8)
        nib = rng.integers(0, 16, 256)
        raw += pack_q4_k(d, dmin, sc, mn, nib)
        for sub in range(8):
            for l in range(32):
                vals.append(half(d) * int(sc[sub]) * int(nib[32 * sub + l]) - half(dmin) * int(mn[sub]))
    return raw, vals


def q6_k(blocks):
    raw, vals = b"", []
    for _ in range(blocks):
        q = rng.integers(0, 64, 256)  # stored 6-bit values; a value is q - 32
        sc = rng.integers(-128, 128, 16).astype(np.int8)
        d = f16(rng.uniform(0.0005, 0.01))
        raw += pack_q6_k(q, sc, d)
        for i in range(256):
            vals.append(half(d) * int(sc[i // 16]) * (int(q[i]) - 32))
    return raw, vals


def main(out):
    tensors = []  # (name, shape innermost first, type, raw bytes)
    f32 = rng.standard_normal(2 * 48).astype(np.float32)
    tensors.append(("t.f32", [48, 2], 0, f32.tobytes()))
    h = rng.standard_normal(3 * 16).astype(np.float16)
    tensors.append(("t.f16", [16, 3], 1, h.tobytes()))
    tensors.append(("t.f16.expected", [16, 3], 0, h.astype(np.float32).tobytes()))
    b = rng.standard_normal(2 * 16).astype(np.float32)
    bf = (b.view(np.uint32) >> 16).astype(np.uint16)
    tensors.append(("t.bf16", [16, 2], 30, bf.tobytes()))
    tensors.append(("t.bf16.expected", [16, 2], 0, (bf.astype(np.uint32) << 16).view(np.float32).tobytes()))
    for name, gtype, block, maker in (("t.q8_0", 8, 32, q8_0), ("t.q4_0", 2, 32, q4_0), ("t.q4_k", 12, 256, q4_k),
                                      ("t.q6_k", 14, 256, q6_k)):
        rows, per_row = 3, 2 * block
        raw, vals = maker(rows * per_row // block)
        tensors.append((name, [per_row, rows], gtype, raw))
        tensors.append((name + ".expected", [per_row, rows], 0, np.array(vals, dtype=np.float32).tobytes()))
    meta = [
        kv("general.architecture", 8, "test"), kv("general.alignment", 4, ALIGN),
        kv("test.u8", 0, 200), kv("test.i8", 1, -100), kv("test.u16", 2, 60000), kv("test.i16", 3, -30000),
        kv("test.i32", 5, -2000000000), kv("test.f32", 6, 0.5), kv("test.bool", 7, True),
        kv("test.u64", 10, 1 << 40), kv("test.i64", 11, -(1 << 40)), kv("test.f64", 12, 0.25),
        kv("test.strings", 9, (8, ["a", "", "ü"])), kv("test.floats", 9, (6, [1.5, -2.0])),
        kv("test.ints", 9, (5, [-1, 2, 3])),
    ]
    write(out, meta, tensors)


def write(out, meta, tensors):
    """A GGUF v3 file of metadata `meta` (kv()'s) and `tensors`: (name, shape
    innermost first, ggml type, raw bytes), each at an aligned offset."""
    infos, offset = b"", 0
    for name, shape, gtype, raw in tensors:
        infos += string(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", n) for n in shape)
        infos += struct.pack("<IQ", gtype, offset)
        offset += (len(raw) + ALIGN - 1) // ALIGN * ALIGN
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)) + b"".join(meta) + infos
    head += b"\0" * ((-len(head)) % ALIGN)
    data = b"".join(raw + b"\0" * ((-len(raw)) % ALIGN) for _, _, _, raw in tensors)
    with open(out, "wb") as f:
        f.write(head + data)


if __name__ == "__main__":
    main(sys.argv[1])
