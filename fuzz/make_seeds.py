#!/usr/bin/env python3
"""Write the fuzz targets' seed corpus (Python standard library only; deterministic).

  fuzz/corpus/npy/          valid .npy files of every dtype, rank and version, and near-valid ones
  fuzz/corpus/safetensors/  valid checkpoints (as qkv writes them and as others may), and near-valid ones
  fuzz/corpus/graph/        byte programs for fuzz_graph.c: one per operator, and random ones
  fuzz/corpus/misuse/       call sequences for fuzz_misuse.c: one per kind of call, and random ones

Run from anywhere: python3 fuzz/make_seeds.py (it rewrites the four directories' seed-* files).
corpus/safetensors/copy-task-checkpoint is a real checkpoint, written by
  build/examples/copy_task --steps 3 --n 4 --V 4 --d-k 2 --heads 2 --wo --save FILE
"""
import json
import os
import random
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
rng = random.Random(20261130)

DTYPES = {"f4": ("<f4", "F32", "f", 4), "f8": ("<f8", "F64", "d", 8), "i4": ("<i4", "I32", "i", 4),
          "u1": ("|u1", "U8", "B", 1), "i8": ("<i8", "I64", "q", 8), "b1": ("|b1", "BOOL", "?", 1)}


def values(code, n):
    fmt = DTYPES[code][2]
    if fmt in "fd":
        vals = [rng.gauss(0, 1) for _ in range(n)]
    elif fmt in "iq":
        vals = [rng.randrange(-5, 10) for _ in range(n)]
    elif fmt == "?":
        vals = [rng.randrange(0, 2) == 1 for _ in range(n)]
    else:
        vals = [rng.randrange(0, 2) for _ in range(n)]
    return struct.pack("<%d%s" % (n, fmt), *vals)


def npy(code, shape, version=1, header_override=None, data_override=None, align=64):
    descr = DTYPES[code][0]
    shape_text = "()" if not shape else "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
    header = header_override or "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_text)
    prefix = 10 if version == 1 else 12
    pad = (-(prefix + len(header) + 1)) % align
    header = header + " " * pad + "\n"
    n = 1
    for d in shape:
        n *= d
    data = data_override if data_override is not None else values(code, n)
    size = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + size + header.encode("latin-1") + data


def safetensors(entries, metadata=None, pad_to=8, order=None, raw_header=None, data_override=None, checksums=False):
    """checksums: add "qkv.crc32.<name>" (zlib.crc32 of the tensor's bytes) to the metadata, as qkv writes."""
    header = {}
    data = b""
    for name, code, shape in (order or entries):
        n = 1
        for d in shape:
            n *= d
        blob = values(code, n)
        header[name] = {"dtype": DTYPES[code][1], "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
        if checksums:
            metadata = dict(metadata or {})
            metadata["qkv.crc32." + name] = "%08x" % zlib.crc32(blob)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % pad_to)
    if data_override is not None:
        data = data_override
    return struct.pack("<Q", len(text)) + text + data


def write(directory, name, blob):
    path = os.path.join(HERE, "corpus", directory, "seed-" + name)
    with open(path, "wb") as f:
        f.write(blob)


def main():
    for d in ("npy", "safetensors", "graph", "misuse"):
        os.makedirs(os.path.join(HERE, "corpus", d), exist_ok=True)
        for f in os.listdir(os.path.join(HERE, "corpus", d)):
            if f.startswith("seed-"):
                os.remove(os.path.join(HERE, "corpus", d, f))

    # ---- .npy: valid ----
    write("npy", "f4-2x3", npy("f4", [2, 3]))
    write("npy", "f8-4", npy("f8", [4]))
    write("npy", "i4-2x2x2", npy("i4", [2, 2, 2]))
    write("npy", "u1-3x1x2x2", npy("u1", [3, 1, 2, 2]))
    write("npy", "f4-scalar", npy("f4", []))
    write("npy", "f8-empty-0x3", npy("f8", [0, 3]))
    write("npy", "f4-v2", npy("f4", [3, 2], version=2))
    write("npy", "f8-v3", npy("f8", [2], version=3))
    write("npy", "f4-align16", npy("f4", [2, 2], align=16))
    write("npy", "f4-keys-reordered", npy("f4", [2, 2], header_override="{'shape': (2, 2), 'fortran_order': False, 'descr': '<f4'}"))
    write("npy", "f8-double-quotes", npy("f8", [3], header_override='{"descr": "<f8", "fortran_order": False, "shape": (3,)}'))
    write("npy", "i4-long-suffix", npy("i4", [2, 3], header_override="{'descr': '<i4', 'fortran_order': False, 'shape': (2L, 3L), }"))
    # ---- .npy: near-valid ----
    write("npy", "bad-fortran", npy("f4", [2, 2], header_override="{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }"))
    write("npy", "bad-big-endian", npy("f8", [2], header_override="{'descr': '>f8', 'fortran_order': False, 'shape': (2,), }"))
    write("npy", "bad-object", npy("f8", [1], header_override="{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"))
    write("npy", "bad-5d", npy("u1", [1, 1, 1, 1, 2]))
    write("npy", "bad-truncated", npy("f4", [4, 4])[:-5])
    write("npy", "bad-trailing", npy("f4", [2]) + b"xx")
    write("npy", "bad-negative-dim", npy("f4", [2], header_override="{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", data_override=b""))
    write("npy", "bad-huge-shape", npy("f8", [2], header_override="{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", data_override=b""))
    write("npy", "bad-version", b"\x93NUMPY\x04\x00" + npy("f4", [1])[8:])
    write("npy", "bad-unterminated", npy("f4", [1], header_override="{'descr': '<f4', 'fortran_order': False, 'shape': (1,"))
    write("npy", "bad-magic", b"\x93NUMPZ" + npy("f4", [1])[6:])

    # ---- safetensors: valid ----
    write("safetensors", "qkv-like", safetensors([("wq", "f4", [4, 4]), ("wk", "f4", [4, 4]), ("step", "f8", [])],
                                                    {"step": "3", "format": "qkv"}))
    write("safetensors", "all-dtypes", safetensors([("a", "f8", [2]), ("b", "f4", [3]), ("c", "i4", [2, 1]), ("d", "u1", [5])]))
    write("safetensors", "empty", safetensors([]))
    write("safetensors", "empty-with-meta", safetensors([], {"k": "v"}))
    write("safetensors", "zero-size", safetensors([("z", "f4", [0, 4]), ("s", "f8", [])]))
    write("safetensors", "4d", safetensors([("x", "f4", [1, 2, 2, 3])]))
    write("safetensors", "no-padding", safetensors([("x", "f8", [1])], pad_to=1))
    write("safetensors", "utf8-names", safetensors([("\u00e9t\u00e9", "f4", [1]), ("\u6ce8\u610f", "u1", [2])], {"\u00fc": "\u00df"}))
    write("safetensors", "optim-state", safetensors([("wq", "f4", [2, 2]), ("optim.step", "f8", []),
                                                       ("optim.wq.exp_avg", "f4", [2, 2]), ("optim.wq.exp_avg_sq", "f4", [2, 2])]))
    # ---- safetensors: near-valid ----
    good = safetensors([("a", "f4", [2])])
    write("safetensors", "bad-offsets-overlap", safetensors([], raw_header=b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', data_override=b"\0" * 8))
    write("safetensors", "bad-offsets-gap", safetensors([], raw_header=b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', data_override=b"\0" * 8))
    write("safetensors", "bad-shape-mismatch", safetensors([], raw_header=b'{"a":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}}', data_override=b"\0" * 8))
    write("safetensors", "bad-dtype", safetensors([], raw_header=b'{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}', data_override=b"\0" * 4))
    write("safetensors", "bad-duplicate", safetensors([], raw_header=b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', data_override=b"\0" * 2))
    write("safetensors", "bad-unknown-key", safetensors([], raw_header=b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}', data_override=b"\0"))
    write("safetensors", "bad-meta-number", safetensors([], raw_header=b'{"__metadata__":{"a":1}}', data_override=b""))
    write("safetensors", "bad-huge-dims", safetensors([], raw_header=b'{"a":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}}', data_override=b""))
    write("safetensors", "bad-negative-dim", safetensors([], raw_header=b'{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', data_override=b"\0" * 4))
    write("safetensors", "bad-float-offset", safetensors([], raw_header=b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4.5]}}', data_override=b"\0" * 4))
    write("safetensors", "bad-5d", safetensors([], raw_header=b'{"a":{"dtype":"U8","shape":[1,1,1,1,1],"data_offsets":[0,1]}}', data_override=b"\0"))
    write("safetensors", "bad-truncated", good[:-3])
    write("safetensors", "bad-header-size", struct.pack("<Q", 1 << 62) + good[8:])
    write("safetensors", "bad-not-json", safetensors([], raw_header=b'{"a":', data_override=b""))
    write("safetensors", "bad-invalid-utf8", safetensors([], raw_header=b'{"\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', data_override=b"\0"))

    # ---- graph programs: byte 0 = head (bit 0 f64, bit 1 small arena chunks, bit 2 anomaly mode,
    # bits 3.. number of operators - 1); then per operator its code (byte % OP_COUNT) and arguments ----
    for op in range(24):
        for variant in range(2):
            head = (variant & 1) | (rng.randrange(4) << 1) | (rng.randrange(4) << 3)
            body = bytes([op]) + bytes(rng.randrange(0, 208) for _ in range(40))
            write("graph", "op%02d-%d" % (op, variant), bytes([head]) + body + bytes(rng.randrange(256) for _ in range(40)))
    for i in range(16):
        n = rng.choice([8, 32, 96, 200])
        write("graph", "random-%02d" % i, bytes(rng.randrange(256) for _ in range(n)))
    # the building blocks: relu, softcap, rope, dropout, the sinusoidal table (codes 24..28), from their own
    # RNG so that the files above stay as they were
    brng = random.Random(1414)
    for op in range(24, 29):
        for variant in range(2):
            head = (variant & 1) | (brng.randrange(4) << 1) | (brng.randrange(4) << 3)
            body = bytes([op]) + bytes(brng.randrange(0, 208) for _ in range(40))
            write("graph", "op%02d-%d" % (op, variant), bytes([head]) + body + bytes(brng.randrange(256) for _ in range(40)))
    # embedding, layer norm, RMS norm, GELU (codes 29..32), from their own generator: of 300 random programs
    # per operator, the three kept are ones whose first call of the operator succeeds and whose backward then
    # runs (found by running the candidates through fuzz_graph with QKV_FUZZ_TRACE=1)
    blocks = random.Random(7)
    keep = {29: (18, 25, 30), 30: (10, 11, 12), 31: (2, 6, 13), 32: (13, 19, 27)}
    for op in range(29, 33):
        for k in range(300):
            head = (k & 1) | (blocks.randrange(4) << 1) | (blocks.randrange(4) << 3)
            body = bytes([op]) + bytes(blocks.randrange(0, 208) for _ in range(60))
            program = bytes([head]) + body + bytes(blocks.randrange(256) for _ in range(60))
            if k in keep[op]:
                write("graph", "op%02d-%d" % (op, keep[op].index(k)), program)

    # ---- NumPy's and PyTorch's defaults, int64 and bool (loaded as i32 / u8 where exact); last, so
    # the seeds above keep their bytes ----
    write("npy", "i8-2x3", npy("i8", [2, 3]))
    write("npy", "i8-int32-limits", npy("i8", [2], data_override=struct.pack("<2q", -2**31, 2**31 - 1)))
    write("npy", "b1-3x4", npy("b1", [3, 4]))
    write("npy", "bad-i8-wide", npy("i8", [3], data_override=struct.pack("<3q", 0, 2**31, 1)))
    write("npy", "bad-b1-byte", npy("b1", [4], data_override=b"\x00\x01\x02\x01"))
    write("npy", "bad-f2", npy("f4", [2], header_override="{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }", data_override=b"\0" * 4))
    write("safetensors", "i64-bool", safetensors([("ids", "i8", [2, 3]), ("mask", "b1", [3, 3]), ("w", "f4", [2])]))
    write("safetensors", "bad-i64-wide", safetensors([], raw_header=b'{"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}}', data_override=struct.pack("<2q", 1, -2**31 - 1)))
    write("safetensors", "bad-bool-byte", safetensors([], raw_header=b'{"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}}', data_override=b"\x01\x07"))

    # ---- per-tensor checksums ("qkv.crc32.<name>" in the metadata, as qkv writes) and control bytes in
    # names (escaped in messages); last, so the seeds above keep their bytes ----
    write("safetensors", "checksummed", safetensors([("wq", "f4", [2, 3]), ("ids", "i8", [3]), ("s", "f8", [])],
                                                       {"step": "3"}, checksums=True))
    a_blob = struct.pack("<2f", 0.5, -2.0)
    a_crc = "%08x" % zlib.crc32(a_blob)
    a_json = '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
    for name, meta in (("bad-checksum", '"qkv.crc32.a":"%08x"' % (int(a_crc, 16) ^ 1)),
                       ("bad-checksum-digits", '"qkv.crc32.a":"%s"' % a_crc[:7]),
                       ("bad-checksum-orphan", '"qkv.crc32.b":"%s"' % a_crc)):
        header = ('{"__metadata__":{%s},%s}' % (meta, a_json)).encode()
        write("safetensors", name, safetensors([], raw_header=header, data_override=a_blob))
    write("safetensors", "bad-control-bytes", safetensors([], raw_header=b'{"a\\u001b[2J":{"dtype":"F\\u0007","shape":[1],"data_offsets":[0,4]}}', data_override=b"\0" * 4))


    misuse_seeds()


# ---- misuse sequences (fuzz_misuse.c): byte 0 = head (bits 0, 1: small arena chunks for A, B), bytes 1, 2 =
# thread counts (< 192: 1..3); then calls, each a code byte (code % 16 the kind of call, bit 7 the context:
# 0 A, 1 B) and its arguments. Arguments below 192 are the common legal values; the generator keeps them
# there mostly, so a seed gets past the first checks. From its own generator, so the files above stay.
MISUSE_KINDS = 16  # make (0-2), persist, step_end, unary (5-6), binary, attention, cross-entropy, backward,
                   # optimizer, gradcheck, files, access, modes/reopen


def misuse_seeds():
    mrng = random.Random(1313)

    def args(n):
        return bytes(mrng.randrange(0, 192) for _ in range(n))

    def call(kind, ctx=0, n=12):
        return bytes([(kind % MISUSE_KINDS) | (ctx << 7) | (mrng.randrange(4) << 4 if kind != 15 else 0)]) + args(n)

    def make(ctx=0):
        return call(mrng.choice([0, 1, 2]), ctx, 16)

    for kind in range(MISUSE_KINDS):
        for variant in range(2):
            ctx = variant
            body = bytes([variant * 3, 0, 1])
            for _ in range(4):
                body += make(ctx)
            body += call(3, ctx)  # a persistent one
            for _ in range(3):
                body += call(kind, ctx, 16)
            body += call(10, ctx) + call(4, ctx) + call(kind, 1 - ctx, 16)
            write("misuse", "kind%02d-%d" % (kind, variant), body)
    # a training-like sequence on both contexts: tensors, params, ops, backward, optimizer, step end
    for i in range(6):
        body = bytes([i & 3, mrng.randrange(192), mrng.randrange(192)])
        for _ in range(8):
            ctx = mrng.randrange(2)
            body += mrng.choice([make(ctx), call(3, ctx), call(5, ctx), call(7, ctx), call(8, ctx), call(9, ctx),
                                 call(10, ctx), call(11, ctx), call(12, ctx), call(13, ctx), call(4, ctx)])
        write("misuse", "train-%02d" % i, body)
    for i in range(8):
        n = mrng.choice([32, 96, 256])
        write("misuse", "random-%02d" % i, bytes(mrng.randrange(256) for _ in range(n)))


if __name__ == "__main__":
    main()
