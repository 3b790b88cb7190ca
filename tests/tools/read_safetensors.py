#!/usr/bin/env python3
"""read_safetensors.py - an independent safetensors reader, Python standard library only.

It shares no code with qkv: it checks a file against the format (8-byte little-endian header size,
at most 100,000,000 bytes; a UTF-8 JSON object without duplicate keys; entries with a dtype, a shape
of non-negative integers and two data offsets; offsets contiguous from 0 and ending at the end of
the file; each byte range the size of its shape) and decodes the tensors with struct and array.

    read_safetensors.py FILE                 print the metadata and every tensor (first values)
    read_safetensors.py --tap --tool ST_TOOL the interoperability test, as TAP: ST_TOOL (the
                                             tests/tools/st_tool.c program) writes a checkpoint with
                                             qkv, this script checks it value by value, then writes
                                             files of its own for qkv to read back (or refuse)
"""
import argparse
import array
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

MAX_HEADER = 100_000_000
CRC_PREFIX = "qkv.crc32."
HEADER_CRC = "qkv.header_crc32"


def header_crc(raw):
    """qkv's header checksum of a file's bytes, computed here from its rule (include/qkv/safetensors.h): zlib's
    CRC-32 of the 8-byte size and the header, with the checksum's own 8 digits read as "00000000"."""
    n = struct.unpack("<Q", raw[:8])[0]
    head = raw[:8 + n]
    key = b'"' + HEADER_CRC.encode() + b'":"'
    at = head.index(key) + len(key)
    return "%08x" % zlib.crc32(head[:at] + b"00000000" + head[at + 8:])
DTYPES = {  # safetensors dtype -> (array typecode, bytes)
    "F64": ("d", 8), "F32": ("f", 4), "I64": ("q", 8), "I32": ("i", 4), "I16": ("h", 2),
    "U16": ("H", 2), "I8": ("b", 1), "U8": ("B", 1), "BOOL": ("B", 1),
}


class FormatError(Exception):
    pass


def _no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise FormatError("duplicate key %r" % key)
        seen[key] = value
    return seen


def _is_uint(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def read(path):
    """Return (metadata, tensors, layout): tensors maps name -> (dtype, shape, list of values);
    layout holds the header size and each tensor's absolute byte offset."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise FormatError("%d bytes, shorter than the header size" % len(data))
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER:
        raise FormatError("header size %d over the limit" % n)
    if 8 + n > len(data):
        raise FormatError("header size %d runs past the end" % n)
    try:
        text = data[8:8 + n].decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError("header is not UTF-8: %s" % e)
    if not text.startswith("{"):
        raise FormatError("header does not start with '{'")
    try:
        header = json.loads(text, object_pairs_hook=_no_duplicates)
    except ValueError as e:
        raise FormatError("header is not JSON: %s" % e)
    if not isinstance(header, dict):
        raise FormatError("header is not an object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FormatError("__metadata__ is not a string -> string map")
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise FormatError("entry %r does not have exactly dtype, shape, data_offsets" % name)
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPES:
            raise FormatError("entry %r: unknown dtype %r" % (name, dtype))
        if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
            raise FormatError("entry %r: bad shape %r" % (name, shape))
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_uint(o) for o in offsets):
            raise FormatError("entry %r: bad data_offsets %r" % (name, offsets))
        entries.append((offsets[0], offsets[1], name, dtype, shape))
    entries.sort(key=lambda e: (e[0], e[1]))
    at, data_size = 0, len(data) - 8 - n
    tensors, layout = {}, {"header_size": n, "offsets": {}, "bytes": {}}
    for begin, end, name, dtype, shape in entries:
        if begin != at or end < begin:
            raise FormatError("entry %r: offsets [%d, %d] do not follow %d" % (name, begin, end, at))
        code, size = DTYPES[dtype]
        count = 1
        for d in shape:
            count *= d
        if count * size != end - begin:
            raise FormatError("entry %r: shape %r of %s is not %d bytes" % (name, shape, dtype, end - begin))
        values = array.array(code)
        values.frombytes(data[8 + n + begin:8 + n + end])
        if sys.byteorder != "little":
            values.byteswap()
        tensors[name] = (dtype, shape, values.tolist())
        layout["offsets"][name] = 8 + n + begin
        layout["bytes"][name] = data[8 + n + begin:8 + n + end]
        at = end
    if at != data_size:
        raise FormatError("tensors end at data byte %d, the file has %d" % (at, data_size))
    return metadata, tensors, layout


# ---- the values st_tool writes, computed here independently ----------------------------------------

def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def pattern(dtype, count):
    if dtype == "F32":
        return [f32(f32(1.0 / (i + 3)) - 0.25) for i in range(count)]
    if dtype == "F64":
        return [1.0 / (i + 7) - i for i in range(count)]
    if dtype == "I32":
        return [(i - 3) * 1000003 for i in range(count)]
    return [(i * 37 + 11) % 256 for i in range(count)]


EXPECTED = {  # name -> (dtype, shape); st_tool.c writes these
    "wq": ("F32", [4, 3]), "wk": ("F64", [2, 3, 2]), "targets": ("I32", [7]), "mask": ("U8", [3, 5]),
    "scale": ("F64", []), "big": ("F32", [2, 3, 4, 5]), "empty": ("F32", [0, 3]),
}
EXPECTED_META = {"step": "1200", "seed": "7", "config": '{"task": "reverse",\n\t"d_model": 16}',
                 "note": "h\u00e9llo \u2713"}


def count_of(shape):
    c = 1
    for d in shape:
        c *= d
    return c


def write_file(path, tensors, metadata=None, raw_header=None, extra=b""):
    """A safetensors file laid out unlike qkv's: tensors in the given order (no alignment), metadata
    last, no padding. tensors: list of (name, dtype, shape, values)."""
    header, chunks, at = {}, [], 0
    for name, dtype, shape, values in tensors:
        blob = array.array(DTYPES[dtype][0], values).tobytes()
        header[name] = {"shape": shape, "dtype": dtype, "data_offsets": [at, at + len(blob)]}
        chunks.append(blob)
        at += len(blob)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = (raw_header if raw_header is not None else json.dumps(header, ensure_ascii=False)).encode("utf-8")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks) + extra)


def parse_dump(text):
    """st_tool dump's output -> (metadata, {name: (dtype, shape, values as strings)})."""
    def unescape(s):
        return s.replace("\\\\", "\0").replace("\\n", "\n").replace("\\t", "\t").replace("\0", "\\")
    meta, tensors = {}, {}
    for line in text.splitlines():
        parts = line.split("\t")
        if parts[0] == "meta":
            meta[unescape(parts[1])] = unescape(parts[2])
        elif parts[0] == "tensor":
            shape = [int(d) for d in parts[3].split(",")] if parts[3] else []
            tensors[parts[1]] = (parts[2], shape, parts[4].split(" ") if parts[4] else [])
    return meta, tensors


def same_values(dtype, got_strings, want):
    if len(got_strings) != len(want):
        return False
    if dtype == "F32":
        return all(f32(float(g)) == w for g, w in zip(got_strings, want))
    if dtype == "F64":
        return all(float(g) == w for g, w in zip(got_strings, want))
    return all(int(g) == w for g, w in zip(got_strings, want))


class Tap:
    def __init__(self):
        self.results = []

    def check(self, ok, what, detail=""):
        self.results.append((bool(ok), what, detail))
        return ok

    def finish(self):
        print("1..%d" % len(self.results))
        for i, (ok, what, detail) in enumerate(self.results, 1):
            print("%s %d - %s" % ("ok" if ok else "not ok", i, what))
            if not ok and detail:
                for line in str(detail).splitlines():
                    print("# " + line)
        return 0 if all(ok for ok, _, _ in self.results) else 1


def run_tool(tool, *args):
    return subprocess.run([tool] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, encoding="utf-8")


def interop_test(tool):
    tap = Tap()
    with tempfile.TemporaryDirectory(prefix="qkv_st_py_") as tmp:
        path = os.path.join(tmp, "qkv.safetensors")
        r = run_tool(tool, "write", path)
        tap.check(r.returncode == 0 and os.path.exists(path), "st_tool writes a checkpoint with qkv", r.stderr)
        try:
            meta, tensors, layout = read(path)
            error = None
        except (OSError, FormatError) as e:
            meta, tensors, layout, error = {}, {}, {"header_size": -1, "offsets": {}, "bytes": {}}, e
        tap.check(error is None, "the qkv file passes the independent format checks", error)
        aligned = layout["header_size"] % 8 == 0 and all(
            layout["offsets"][name] % DTYPES[tensors[name][0]][1] == 0 for name in tensors)
        tap.check(aligned, "header padded to 8 bytes, every tensor aligned to its element size", layout)
        tap.check(set(tensors) == set(EXPECTED), "the tensor names are wq, wk, targets, mask, scale, big, empty",
                  sorted(tensors))
        for name, (dtype, shape) in sorted(EXPECTED.items()):
            got = tensors.get(name)
            want = pattern(dtype, count_of(shape))
            ok = got is not None and got[0] == dtype and got[1] == shape and got[2] == want
            tap.check(ok, "tensor %s: %s %s with the expected values" % (name, dtype, shape),
                      got and (got[0], got[1], got[2][:6]))
        # qkv adds "qkv.crc32.<name>": zlib's CRC-32 of the tensor's bytes, 8 lowercase hex digits
        crcs = {k[len(CRC_PREFIX):]: v for k, v in meta.items() if k.startswith(CRC_PREFIX)}
        with open(path, "rb") as f:
            raw = f.read()
        tap.check(HEADER_CRC in meta and meta[HEADER_CRC] == header_crc(raw),
                  "qkv.header_crc32 is zlib.crc32 of the size and header with its own digits as zeros",
                  "file: %s, computed here: %s" % (meta.get(HEADER_CRC), raw and header_crc(raw)))
        meta = {k: v for k, v in meta.items() if not k.startswith(CRC_PREFIX) and k != HEADER_CRC}
        want_crcs = {name: "%08x" % zlib.crc32(blob) for name, blob in layout["bytes"].items()}
        tap.check(crcs == want_crcs and crcs, "every tensor's qkv.crc32.<name> is zlib.crc32 of its bytes",
                  "file: %s\nzlib: %s" % (crcs, want_crcs))
        tap.check(meta == EXPECTED_META, "__metadata__ round-trips (escapes, UTF-8)", meta)

        # files written here, read by qkv
        mine = os.path.join(tmp, "python.safetensors")
        written = [
            ("\u00fcmask", "U8", [3], [0, 128, 255]),           # first: every later offset is misaligned
            ("alpha", "F64", [2], [-1.5, 1e300]),
            ("ids", "I32", [2, 2], [-2147483648, -1, 0, 2147483647]),
            ("w", "F32", [1, 1, 1, 2], [0.1, -3.25]),
            ("s", "F32", [], [2.5]),
            ("z", "F64", [0], []),
        ]
        # a checksum for every tensor (once a file has one, qkv needs them all): checked, then hidden
        crcs_here = {CRC_PREFIX + name: "%08x" % zlib.crc32(array.array(DTYPES[dtype][0], values).tobytes())
                     for name, dtype, _, values in written}
        write_file(mine, written, dict({"framework": "python", "k": "v\tw"}, **crcs_here))
        r = run_tool(tool, "dump", mine)
        dmeta, dtensors = parse_dump(r.stdout) if r.returncode == 0 else ({}, {})
        ok = r.returncode == 0 and set(dtensors) == {w[0] for w in written}
        for name, dtype, shape, values in written:
            want = [f32(v) for v in values] if dtype == "F32" else values
            got = dtensors.get(name)
            ok = ok and got is not None and got[0] == dtype and got[1] == shape and same_values(dtype, got[2], want)
        tap.check(ok, "qkv reads a file laid out by this script (unaligned, metadata last, no padding)",
                  r.stderr or dtensors)
        tap.check(dmeta == {"framework": "python", "k": "v\tw"}, "qkv reads this script's metadata", dmeta)

        # PyTorch's long and bool, as a PyTorch user's checkpoint holds them: qkv loads I32 and U8
        ints = os.path.join(tmp, "i64_bool.safetensors")
        write_file(ints, [("m", "BOOL", [3], [1, 0, 1]), ("ids", "I64", [2, 2], [-2**31, -1, 0, 2**31 - 1])])
        r = run_tool(tool, "dump", ints)
        _, itensors = parse_dump(r.stdout) if r.returncode == 0 else ({}, {})
        tap.check(itensors == {"ids": ("I32", [2, 2], ["-2147483648", "-1", "0", "2147483647"]),
                               "m": ("U8", [3], ["1", "0", "1"])},
                  "qkv reads I64 as I32 and BOOL as U8 (exact values)", r.stderr or itensors)

        refusals = [
            ("duplicate names", '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                '"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\0\0", "appears twice"),
            ("a gap between tensors", '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                      '"b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}}', b"\0\0\0", "(gap)"),
            ("trailing bytes", '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0\0", "trailing bytes"),
            ("an F16 tensor", '{"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}}', b"\0\0", "F16"),
            ("an I64 value over int32", '{"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}}',
             struct.pack("<2q", 7, 2**31), "element 1 is 2147483648, which does not fit in int32"),
            ("a BOOL byte that is not 0 or 1", '{"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}}',
             b"\1\2", "element 1 is the byte 2"),
            ("a checksum that does not match its tensor",
             '{"__metadata__":{"qkv.crc32.w":"%08x"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
             % zlib.crc32(struct.pack("<2f", 1.0, 2.0)), struct.pack("<2f", 1.0, 2.5), "tensor 'w' is corrupt"),
            ("a checksum for one tensor and none for another",
             '{"__metadata__":{"qkv.crc32.w":"%08x"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
             '"v":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}'
             % zlib.crc32(struct.pack("<2f", 1.0, 2.0)), struct.pack("<3f", 1.0, 2.0, 3.0), "tensor 'v' has no checksum"),
            ("a header checksum that does not match the header",
             '{"__metadata__":{"qkv.header_crc32":"00000000","qkv.crc32.w":"%08x"},'
             '"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
             % zlib.crc32(struct.pack("<2f", 1.0, 2.0)), struct.pack("<2f", 1.0, 2.0), "the header is corrupt"),
        ]
        for what, header, blob, fragment in refusals:
            bad = os.path.join(tmp, "bad.safetensors")
            write_file(bad, [], raw_header=header, extra=blob)
            r = run_tool(tool, "dump", bad)
            tap.check(r.returncode == 1 and fragment in r.stderr,
                      "qkv refuses a file with %s" % what, r.stderr)
    return tap.finish()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?")
    ap.add_argument("--tap", action="store_true", help="run the interoperability test")
    ap.add_argument("--tool", help="the st_tool program (with --tap)")
    args = ap.parse_args()
    if args.tap:
        if not args.tool:
            ap.error("--tap needs --tool")
        return interop_test(args.tool)
    if not args.file:
        ap.error("give a file, or --tap --tool ST_TOOL")
    try:
        meta, tensors, layout = read(args.file)
    except (OSError, FormatError) as e:
        print("%s: %s" % (args.file, e), file=sys.stderr)
        return 1
    for k, v in sorted(meta.items()):
        print("meta %s = %r" % (k, v))
    for name in sorted(tensors):
        dtype, shape, values = tensors[name]
        more = " ..." if len(values) > 8 else ""
        print("%s %s %s @%d: %s%s" % (name, dtype, shape, layout["offsets"][name],
                                      " ".join(repr(v) for v in values[:8]), more))
    return 0


if __name__ == "__main__":
    sys.exit(main())
