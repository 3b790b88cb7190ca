#!/usr/bin/python3
"""compare_ops.py — qkv's building blocks against PyTorch eager, forward + backward, f32, one thread, one run.

Runs build/bench/ops --tsv (qkv: embedding, layer norm, RMS norm, GELU erf and tanh on x [32*128, 256],
see bench/ops.c), then the same in PyTorch 1.13 eager in a child process whose environment has
OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 before torch is imported, and torch.set_num_threads(1):

    embedding   F.embedding(ids, table)                         table [4096, 256], ids [32, 128]
    layer_norm  F.layer_norm(x, (256,), gamma, beta, 1e-5)
    rms_norm    x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gamma
    gelu_erf    F.gelu(x, approximate='none')
    gelu_tanh   F.gelu(x, approximate='tanh')
    each: out.backward(dy), then the inputs' .grad set to None (PyTorch's cheapest path)

and prints the times and the speedup (PyTorch time / qkv time: 2.00x means qkv takes half PyTorch's time).
Median of >= 5 samples each, a sample averaging enough iterations to last >= 20 ms. The machine may be
shared and its load comes and goes: each side is measured twice, interleaved (qkv, PyTorch, qkv,
PyTorch), and each side's lower median is kept. Prints figures, asserts nothing. Needs Debian's
python3-torch; run by hand:

    /usr/bin/python3 bench/compare_ops.py [--bench build/bench/ops] [--quick] [--cpu-time]

--cpu-time times both sides by their process's CPU time (time.process_time, CLOCK_PROCESS_CPUTIME_ID)
instead of the wall clock: on a shared machine under load, each side is charged only for its own cycles.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

OPS = ["embedding", "layer_norm", "rms_norm", "gelu_erf", "gelu_tanh"]
ROWS, D, V, EPS = 32 * 128, 256, 4096, 1e-5


def torch_child(samples, sample_seconds, clock):
    """Runs in the child process (OMP_NUM_THREADS and OPENBLAS_NUM_THREADS already 1): one tsv line per op."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(42)
    x = torch.randn(ROWS, D, generator=g).requires_grad_(True)
    gamma = (1 + 0.1 * torch.randn(D, generator=g)).requires_grad_(True)
    beta = (0.1 * torch.randn(D, generator=g)).requires_grad_(True)
    table = torch.randn(V, D, generator=g).requires_grad_(True)
    ids = (torch.arange(ROWS) % V)[torch.randperm(ROWS, generator=g)].reshape(32, 128)
    dy = torch.randn(ROWS, D, generator=g)
    dy3 = dy.reshape(32, 128, D)
    forward = {
        "embedding": lambda: F.embedding(ids, table),
        "layer_norm": lambda: F.layer_norm(x, (D,), gamma, beta, EPS),
        "rms_norm": lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * gamma,
        "gelu_erf": lambda: F.gelu(x, approximate="none"),
        "gelu_tanh": lambda: F.gelu(x, approximate="tanh"),
    }

    def iterate(op):
        out = forward[op]()
        out.backward(dy3 if op == "embedding" else dy)
        x.grad = gamma.grad = beta.grad = table.grad = None

    for op in OPS:
        iterate(op)  # warm up
        t0 = clock()
        iterate(op)
        once = clock() - t0
        inner = max(1, int(sample_seconds / once) + 1) if once > 0 else 1000
        times = []
        for _ in range(samples):
            start = clock()
            for _ in range(inner):
                iterate(op)
            times.append((clock() - start) / inner)
        print(f"{op}\t{statistics.median(times):.9g}\t{min(times):.9g}", flush=True)
    print(f"version\t{torch.__version__}\t{torch.get_num_threads()}")


def parse(text):
    rows = {}
    for line in text.splitlines():
        name, a, b = line.split("\t")
        rows[name] = (a, b)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", default="build/bench/ops", help="path of qkv's bench/ops")
    parser.add_argument("--quick", action="store_true", help="3 shorter samples (qkv and PyTorch alike)")
    parser.add_argument("--cpu-time", action="store_true", help="process CPU time instead of wall time")
    parser.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    samples, sample_seconds = (3, 0.005) if args.quick else (7, 0.02)
    if args.torch_child:
        torch_child(samples, sample_seconds, time.process_time if args.cpu_time else time.perf_counter)
        return 0

    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    flags = (["--quick"] if args.quick else []) + (["--cpu-time"] if args.cpu_time else [])
    child = [sys.executable, os.path.abspath(__file__), "--torch-child"] + flags
    bench = [args.bench, "--tsv"] + flags
    qkv, pt = {op: float("inf") for op in OPS}, {op: float("inf") for op in OPS}
    version = "?"
    for _ in range(2):  # interleaved: qkv, PyTorch, qkv, PyTorch; the lower median of each side
        q = parse(subprocess.run(bench, check=True, capture_output=True, text=True).stdout)
        t = parse(subprocess.run(child, check=True, capture_output=True, text=True, env=env).stdout)
        version = f"{t['version'][0]}, {t['version'][1]} thread"
        for op in OPS:
            qkv[op] = min(qkv[op], float(q[op][0]))
            pt[op] = min(pt[op], float(t[op][0]))

    print(f"building blocks forward+backward, f32, x [{ROWS}, {D}], one thread; PyTorch {version} (eager); "
          f"median of {samples} samples, lower of 2 interleaved runs; {'CPU' if args.cpu_time else 'wall'} time")
    print(f"{'op':<12} {'PyTorch ms':>11} {'qkv ms':>9} {'PyTorch/qkv':>12}  goal 2x")
    for op in OPS:
        ratio = pt[op] / qkv[op]
        print(f"{op:<12} {pt[op] * 1e3:11.3f} {qkv[op] * 1e3:9.3f} {ratio:11.2f}x  {'met' if ratio >= 2 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
