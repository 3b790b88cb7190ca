#!/usr/bin/python3
"""compare_attention.py — qkv's attention against PyTorch eager, forward + backward, f32, in one run.

Runs build/bench/attention --tsv (qkv: fused and composed, one thread; 2 threads against 1 at (4,512,64);
the extra peak memory at (1,4096,64)), then PyTorch 1.13 eager's version of the seed's attention on the same
shapes in the same process run, single-threaded (torch.set_num_threads(1)):

    scores = q @ k^T / sqrt(d);  scores.masked_fill(~mask, -inf) when causal;  A = softmax(scores);  out = A @ v
    out.backward(dO)

and prints the times and the ratios (PyTorch time / qkv time: > 1 means qkv is faster). Median of >= 5
samples each, a sample averaging enough iterations to last >= 20 ms (as bench/attention.c does). The
machine may be shared, and load comes and goes: each shape is therefore measured twice on each side,
interleaved (qkv, PyTorch, qkv, PyTorch), and each side's lower median is kept. Prints figures, asserts
nothing. Needs Debian's python3-torch; run by hand:

    /usr/bin/python3 bench/compare_attention.py [--bench build/bench/attention] [--quick]
"""
import argparse
import math
import resource
import statistics
import subprocess
import sys
import time

import torch

SHAPES = [(1, 3, 2), (1, 64, 16), (8, 128, 64), (4, 512, 64), (1, 2048, 64)]


def seed_attention(q, k, v, causal):
    d = q.shape[-1]
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d)
    if causal:
        n_q, n_k = scores.shape[-2], scores.shape[-1]
        keep = torch.ones(n_q, n_k, dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    a = torch.softmax(scores, dim=-1)
    return torch.matmul(a, v)


def make_inputs(shape):
    g = torch.Generator().manual_seed(42)
    q, k, v, dout = (torch.randn(shape, generator=g) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    return q, k, v, dout


def iterate(q, k, v, dout, causal):
    out = seed_attention(q, k, v, causal)
    out.backward(dout)
    q.grad = k.grad = v.grad = None


def time_torch(shape, causal, samples, sample_seconds):
    q, k, v, dout = make_inputs(shape)
    iterate(q, k, v, dout, causal)  # warm up
    t0 = time.perf_counter()
    iterate(q, k, v, dout, causal)
    once = time.perf_counter() - t0
    inner = max(1, int(sample_seconds / once)) if once > 0 else 1000
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        for _ in range(inner):
            iterate(q, k, v, dout, causal)
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times)


def torch_peak_extra_mib(shape):
    """Growth of the process's maximum RSS over one forward + backward (run first, in a fresh process)."""
    q, k, v, dout = make_inputs(shape)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    iterate(q, k, v, dout, False)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (after - before) / 1024.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", default="build/bench/attention", help="path of qkv's bench/attention")
    parser.add_argument("--quick", action="store_true", help="3 shorter samples (qkv and PyTorch alike)")
    args = parser.parse_args()
    samples, sample_seconds = (3, 0.005) if args.quick else (7, 0.02)

    torch.set_num_threads(1)
    torch_mem = torch_peak_extra_mib((1, 4096, 64))

    cmd = [args.bench, "--tsv"] + (["--quick"] if args.quick else [])
    qkv = {}
    for line in subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines():
        kind, b, n, d, causal, x, y = line.split("\t")
        qkv[(kind, int(b), int(n), int(d), int(causal))] = (float(x), float(y))

    print(f"attention forward+backward, f32, one thread; PyTorch {torch.__version__} eager (seed's attention), "
          f"median of {samples} samples")
    print(f"{'(B, n, d)':<16} {'mask':<7} {'PyTorch ms':>11} {'qkv fused':>11} {'qkv composed':>13} "
          f"{'fused/PT':>9} {'composed/PT':>12}")
    def qkv_shape(shape, causal):
        cmd = [args.bench, "--shape", *map(str, shape), str(causal)] + (["--quick"] if args.quick else [])
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split("\t")
        return float(out[5]), float(out[6])

    for shape in SHAPES:
        for causal in (0, 1):
            runs = []
            for _ in range(2):  # interleaved: qkv, PyTorch, qkv, PyTorch; the lower median of each side
                runs.append(qkv_shape(shape, causal) + (time_torch(shape, bool(causal), samples, sample_seconds),))
            fused, composed, pt = (min(r[i] for r in runs) for i in range(3))
            name = f"({shape[0]}, {shape[1]}, {shape[2]})"
            print(f"{name:<16} {'causal' if causal else 'none':<7} {pt * 1e3:11.4f} {fused * 1e3:11.4f} "
                  f"{composed * 1e3:13.4f} {pt / fused:8.2f}x {pt / composed:11.2f}x")

    one, two = qkv[("threads", 4, 512, 64, 0)]
    one_best, two_best = qkv[("threads_best", 4, 512, 64, 0)]
    torch.set_num_threads(2)
    pt2 = time_torch((4, 512, 64), False, samples, sample_seconds)
    torch.set_num_threads(1)
    pt1 = time_torch((4, 512, 64), False, samples, sample_seconds)
    print(f"\n2 threads against 1 at (4, 512, 64): qkv fused {one * 1e3:.3f} -> {two * 1e3:.3f} ms "
          f"({one / two:.2f}x; fastest samples {one_best * 1e3:.3f} -> {two_best * 1e3:.3f} ms, "
          f"{one_best / two_best:.2f}x); PyTorch {pt1 * 1e3:.3f} -> {pt2 * 1e3:.3f} ms ({pt1 / pt2:.2f}x)")

    fused_mem, composed_mem = qkv[("memory", 1, 4096, 64, 0)]
    print(f"\nextra peak memory at (1, 4096, 64), forward+backward: qkv fused {fused_mem / 2**20:.2f} MiB, "
          f"qkv composed {composed_mem / 2**20:.2f} MiB (step arena); PyTorch {torch_mem:.1f} MiB (max RSS growth)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
