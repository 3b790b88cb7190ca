#!/usr/bin/env python3
"""A training step of bench/model's preset a (2 layers attention-only, d_model 64, 4 heads, n 64, batch 32,
V 64, f32, AdamW, 1 thread, release_grads) from Python (the qkv package), against the same loop in C
(bench/model --json), and the ratio of the two medians.

usage: QKV_LIBRARY=build/libqkv.so PYTHONPATH=python python3 bench/python_model.py [build/bench/model]
"""
import json
import os
import subprocess
import sys
import time

import numpy as np

import qkv

RUNS, STEPS, WARMUP, BATCH = 5, 40, 3, 32


def python_rate():
    ctx = qkv.Context(threads=1, release_grads=True)
    m = qkv.Model(ctx, n_layer=2, d_model=64, n_head=4, d_mlp=0, n_ctx=64, vocab=64)
    opt = qkv.Optimizer(m.params.values(), "adamw")
    rng = np.random.default_rng(1234)

    def step():
        ids = ctx.tensor(rng.integers(0, 64, (BATCH, 64), dtype=np.int32))
        loss = m.loss(m.forward(ids), qkv.next_token_targets(ids))
        loss.backward()
        opt.step()
        opt.zero_grad()
        ctx.step_end()

    for _ in range(WARMUP):
        step()
    rates = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        for _ in range(STEPS):
            step()
        rates.append(STEPS / (time.perf_counter() - t0))
    return float(np.median(rates))


def main():
    py = python_rate()
    print(f"python: {py:.2f} steps/s (median of {RUNS} runs of {STEPS} steps)")
    exe = sys.argv[1] if len(sys.argv) > 1 else os.path.join("build", "bench", "model")
    if not os.path.exists(exe):
        print(f"no {exe}: build it with -Dbench=true for the C side")
        return 0
    out = subprocess.run([exe, "--json", "--runs", str(RUNS)], capture_output=True, text=True, check=True).stdout
    c = json.loads(out.strip().splitlines()[-1])["median_steps_per_s"]
    print(f"C:      {c:.2f} steps/s")
    print(f"C / Python: {c / py:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
