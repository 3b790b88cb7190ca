#!/usr/bin/python3
"""Copy-task training steps/s: qkv (build/bench/copy_task) against PyTorch eager, same configuration,
same run, one thread each. Needs Debian's python3-torch (run with /usr/bin/python3); prints the ratio.

The PyTorch model is the same as examples/copy_model.c: fixed embeddings (one-hot token + one-hot
position for d16; N(0,1) tokens + sinusoidal positions for d256), trainable W^Q, W^K, W^V, the seed's
reference attention (matmul, / sqrt(d_k), softmax, matmul), cross-entropy, Adam; each step draws a new
batch. Timed the same way: warm-up, then the median steps/s of several runs; each side twice, interleaved,
keeping its better median.

    /usr/bin/python3 bench/compare_copy_task.py [--runs 5]
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import time

import torch

CONFIGS = {
    "d16": dict(embed="onehot", V=8, n=8, d_model=16, d_k=16, batch=32, lr=0.1, steps=1000),
    "d256": dict(embed="gauss", V=8, n=8, d_model=256, d_k=16, batch=32, lr=0.001, steps=500),
}


def torch_rate(cfg, runs):
    torch.set_num_threads(1)
    V, n, d, dk, B = cfg["V"], cfg["n"], cfg["d_model"], cfg["d_k"], cfg["batch"]
    g = torch.Generator().manual_seed(0)
    if cfg["embed"] == "onehot":
        tok = torch.zeros(V, d)
        tok[torch.arange(V), torch.arange(V)] = 1
        pos = torch.zeros(n, d)
        pos[torch.arange(n), V + torch.arange(n)] = 1
    else:
        tok = torch.randn(V, d, generator=g)
        i = torch.arange(n).unsqueeze(1).float()
        j = torch.arange(d).float()
        angle = i / torch.pow(10000.0, (j - j % 2) / d)
        pos = torch.where(j % 2 == 1, torch.cos(angle), torch.sin(angle))
    rev = torch.arange(n - 1, -1, -1)
    rates = []
    for _ in range(runs):
        a = math.sqrt(6 / (d + dk))
        wq = torch.empty(d, dk).uniform_(-a, a).requires_grad_()
        wk = torch.empty(d, dk).uniform_(-a, a).requires_grad_()
        av = math.sqrt(6 / (d + V))
        wv = torch.empty(d, V).uniform_(-av, av).requires_grad_()
        opt = torch.optim.Adam([wq, wk, wv], lr=cfg["lr"])

        def step():
            x = torch.randint(0, V, (B, n), generator=g)
            e = tok[x] + pos
            q, k, v = e @ wq, e @ wk, e @ wv
            attn = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(dk), dim=-1)
            logits = attn @ v
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), x[:, rev].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()

        for _ in range(20):
            step()
        t0 = time.perf_counter()
        for _ in range(cfg["steps"]):
            step()
        rates.append(cfg["steps"] / (time.perf_counter() - t0))
    return statistics.median(rates)


def qkv_rate(name, runs, exe):
    out = subprocess.run([exe, "--config", name, "--runs", str(runs), "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)["median_steps_per_s"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--exe", default=os.path.join(os.path.dirname(__file__), "..", "build", "bench", "copy_task"))
    a = p.parse_args()
    # The machine may be shared and its speed comes and goes: each side is measured twice, interleaved
    # (qkv, PyTorch, qkv, PyTorch), and each side's better median is kept, as bench/compare_attention.py does.
    print(f"copy_task steps/s, one thread, median of {a.runs} runs, better of 2 interleaved rounds "
          f"(torch {torch.__version__})")
    print(f"{'config':8} {'qkv':>10} {'pytorch':>10} {'ratio':>8}   rounds (qkv / pytorch)")
    for name, cfg in CONFIGS.items():
        qs, ts = [], []
        for _ in range(2):
            qs.append(qkv_rate(name, a.runs, a.exe))
            ts.append(torch_rate(cfg, a.runs))
        q, t = max(qs), max(ts)
        rounds = ", ".join(f"{x:.0f} / {y:.0f}" for x, y in zip(qs, ts))
        print(f"{name:8} {q:10.0f} {t:10.0f} {q / t:7.1f}x   {rounds}")


if __name__ == "__main__":
    main()
