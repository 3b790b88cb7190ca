#!/usr/bin/env python3
"""load_in_torch.py - a qkv checkpoint loaded into PyTorch's nn.Linear: the README's snippet, tested.

    load_in_torch.py --tool LINEAR_TOOL    TAP: LINEAR_TOOL (tests/tools/linear_tool.c) writes a
                                           checkpoint (proj.W [d_in, d_out], proj.b [d_out]) and the
                                           output y = x W + b that qkv computes for an input x; this
                                           script loads the checkpoint, builds nn.Linear(d_in, d_out)
                                           with weight = W^T, runs x through it and compares with y

qkv stores a projection's weight as [d_in, d_out] (Y = X W + b); nn.Linear stores [d_out, d_in]
(y = x W^T + b), hence the transpose. The file is read with the standard library and torch.frombuffer
(load_file below stands in for safetensors.torch.load_file, which Debian does not package), so the
snippet in the README is this script's main() with load_file imported from safetensors.torch.

torch is never a dependency of the suite: when neither this python3 nor /usr/bin/python3 can import
it, the test prints "ok 1 # SKIP torch not installed" and meson counts it as skipped.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

REL_TOL = 1e-6  # max |y_torch - y_qkv| / max |y_qkv|


def import_torch_or_skip():
    try:
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    system = "/usr/bin/python3"
    if (os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system)
            and not os.environ.get("QKV_TORCH_RETRY")):
        os.environ["QKV_TORCH_RETRY"] = "1"
        sys.stdout.flush()
        os.execv(system, [system, os.path.abspath(__file__)] + sys.argv[1:])
    print("1..1")
    print("ok 1 - load a qkv checkpoint into nn.Linear # SKIP torch not installed")
    sys.exit(0)


def load_file(path):
    """name -> torch tensor, as safetensors.torch.load_file returns (little-endian host)."""
    import torch
    dtypes = {"F64": torch.float64, "F32": torch.float32, "I64": torch.int64, "I32": torch.int32,
              "U8": torch.uint8, "BOOL": torch.bool}
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        blob = bytearray(data[8 + n + begin:8 + n + end])  # writable: frombuffer shares it
        dtype = dtypes[entry["dtype"]]
        flat = torch.frombuffer(blob, dtype=dtype) if blob else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(entry["shape"])
    return tensors


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
            for line in str(detail).splitlines() if detail else []:
                print("# " + line)
        return 0 if all(ok for ok, _, _ in self.results) else 1


def rel_error(got, want):
    return float((got - want).abs().max() / want.abs().max())


def interop_test(tool):
    import torch
    tap = Tap()
    with tempfile.TemporaryDirectory(prefix="qkv_torch_") as tmp:
        ckpt, io = os.path.join(tmp, "model.safetensors"), os.path.join(tmp, "io.safetensors")
        r = subprocess.run([tool, ckpt, io], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True)
        if not tap.check(r.returncode == 0, "linear_tool writes the checkpoint and qkv's output", r.stderr):
            return tap.finish()

        # ---- the README snippet ----
        sd = load_file(ckpt)                       # from safetensors.torch import load_file
        d_in, d_out = sd["proj.W"].shape           # qkv: W is [d_in, d_out]
        lin = torch.nn.Linear(d_in, d_out)         # torch: weight is [d_out, d_in]
        with torch.no_grad():
            lin.weight.copy_(sd["proj.W"].T)       # transpose [d_in, d_out] -> [d_out, d_in]
            lin.bias.copy_(sd["proj.b"])
        # ----

        tap.check(list(sd["proj.W"].shape) == [48, 20] and list(lin.weight.shape) == [20, 48],
                  "proj.W is [d_in, d_out] = [48, 20] in the file, nn.Linear's weight [d_out, d_in]",
                  "proj.W %s, weight %s" % (list(sd["proj.W"].shape), list(lin.weight.shape)))
        xy = load_file(io)
        x, y = xy["x"], xy["y"]
        with torch.no_grad():
            y_torch = lin(x)
        err = rel_error(y_torch, y)
        tap.check(y_torch.shape == y.shape and err <= REL_TOL,
                  "nn.Linear(x) equals qkv_projection(x, W, b) to %g relative" % REL_TOL,
                  "shape %s vs %s, max |diff| / max |y| = %.3g" % (list(y_torch.shape), list(y.shape), err))
        print("# max |y_torch - y_qkv| / max |y_qkv| = %.3g over %d values" % (err, y.numel()))

        # the transpose is what makes it work: without it the weight does not fit, and a reshape
        # (right shape, wrong layout) gives another function
        try:
            torch.nn.Linear(d_in, d_out).weight.data.copy_(sd["proj.W"])
            refused = False
        except RuntimeError:
            refused = True
        wrong = torch.nn.Linear(d_in, d_out)
        with torch.no_grad():
            wrong.weight.copy_(sd["proj.W"].reshape(d_out, d_in))
            wrong.bias.copy_(sd["proj.b"])
            wrong_err = rel_error(wrong(x), y)
        tap.check(refused and wrong_err > 1e-2,
                  "without the transpose: copy_ refuses [48, 20], a reshape instead gives another output",
                  "copy_ refused: %s, reshape's error %.3g" % (refused, wrong_err))
    return tap.finish()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", required=True, help="the linear_tool program")
    args = ap.parse_args()
    import_torch_or_skip()
    return interop_test(args.tool)


if __name__ == "__main__":
    sys.exit(main())
