#!/usr/bin/python3
"""compare_attention_skinny.py — qkv's fused attention against PyTorch eager on the skinny shapes of
bench/attention_skinny.c (many queries and few keys, or one query and many keys), forward + backward, f32,
one thread, CPU time, with each shape's memory floor.

qkv: build/bench/attention_skinny --shape B n_q n_k d (its median of 5 samples of >= 20 ms of CPU time, and
the floor: the bytes a forward + backward must move over this machine's bandwidth at that working set).
PyTorch 1.13 eager: the seed's attention on the same shapes,

    scores = q @ k^T / sqrt(d);  A = softmax(scores);  out = A @ v;  out.backward(dO)

median of 5 samples of >= 20 ms of time.process_time. Each side runs in a child process pinned to one
thread as bench/torch_child.py says (thread variables set before torch is imported, torch.set_num_threads(1),
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed for the PyTorch child only); the script prints which OpenBLAS
kernel and how many threads PyTorch used. --rounds (5) interleaved rounds (qkv, PyTorch, qkv, ...) per
shape; the table shows the median round of each side. PyTorch/qkv > 1 means qkv is faster. Prints figures,
asserts nothing. Run by hand:

    /usr/bin/python3 bench/compare_attention_skinny.py [--bench build/bench/attention_skinny] [--rounds 5]
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_child as tc  # noqa: E402  (bench/torch_child.py)

SHAPES = [(1, 4096, 16, 64), (64, 1, 512, 64), (8, 1, 2048, 64), (1, 4096, 8, 64), (4, 2048, 32, 64)]


def torch_child(shape):
    """In the PyTorch child: median CPU seconds of one forward + backward, and what torch ran with."""
    import torch
    torch.set_num_threads(1)
    b, n_q, n_k, d = shape
    g = torch.Generator().manual_seed(42)
    q = torch.randn(b, n_q, d, generator=g).requires_grad_(True)
    k = torch.randn(b, n_k, d, generator=g).requires_grad_(True)
    v = torch.randn(b, n_k, d, generator=g).requires_grad_(True)
    dout = torch.randn(b, n_q, d, generator=g)

    def iterate():
        a = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d), dim=-1)
        torch.matmul(a, v).backward(dout)
        q.grad = k.grad = v.grad = None

    iterate()
    t0 = time.process_time()
    iterate()
    once = time.process_time() - t0
    inner = max(1, int(0.02 / once) + 1) if once > 0 else 1000
    times = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(inner):
            iterate()
        times.append((time.process_time() - start) / inner)
    return dict(seconds=statistics.median(times), report=tc.torch_config())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default=os.path.join(os.path.dirname(__file__), "..", "build", "bench",
                                                    "attention_skinny"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(torch_child(tuple(int(x) for x in a.child.split(",")))))
        return
    tc.require_openblas()
    load = os.getloadavg()
    rows, report = [], None
    for shape in SHAPES:
        qs, fl, ts = [], [], []
        for _ in range(a.rounds):
            out = subprocess.run([a.bench, "--shape", *map(str, shape)], check=True, capture_output=True,
                                 text=True, env=tc.torch_env(1, torch_side=False)).stdout.split("\t")
            qs.append(float(out[5]))
            fl.append(float(out[6]))
            t = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", ",".join(map(str, shape))],
                               check=True, capture_output=True, text=True, env=tc.torch_env(1)).stdout
            t = json.loads(t.strip().splitlines()[-1])
            ts.append(t["seconds"])
            report = t["report"]
        rows.append((shape, statistics.median(qs), statistics.median(ts), statistics.median(fl)))
    print(tc.torch_config_line(report))
    print(tc.env_line(1))
    print(f"fused attention forward+backward, f32, one thread, CPU time; median of {a.rounds} interleaved rounds; "
          f"load average {load[0]:.1f} at the start")
    print(f"{'(B, n_q, n_k, d)':<22} {'PyTorch ms':>11} {'qkv ms':>9} {'PT/qkv':>7} {'floor ms':>9} {'qkv/floor':>10}")
    for shape, q, t, f in rows:
        name = "(" + ", ".join(map(str, shape)) + ")"
        print(f"{name:<22} {t * 1e3:11.3f} {q * 1e3:9.3f} {t / q:6.2f}x {f * 1e3:9.3f} {q / f:9.2f}x")


if __name__ == "__main__":
    main()
