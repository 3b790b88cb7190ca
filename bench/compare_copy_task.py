#!/usr/bin/python3
"""Copy-task training steps/s: qkv (build/bench/copy_task) against PyTorch eager, same configuration,
same run, one thread each. Needs Debian's python3-torch (run with /usr/bin/python3); prints the ratio.

The PyTorch model is the same as examples/copy_model.c: fixed embeddings (one-hot token + one-hot
position for d16; N(0,1) tokens + sinusoidal positions for d256), trainable W^Q, W^K, W^V, the seed's
reference attention (matmul, / sqrt(d_k), softmax, matmul), cross-entropy, Adam; each step draws a new
batch. Timed the same way: warm-up, then the median steps/s of several runs.

Each side runs in a child process pinned to one thread as bench/torch_child.py says (OMP_NUM_THREADS =
OPENBLAS_NUM_THREADS = MKL_NUM_THREADS = 1 in the child's environment before torch is imported, and
torch.set_num_threads(1); OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed for the PyTorch child only), and
the script prints which OpenBLAS kernel and how many threads PyTorch actually used. The children run in
--rounds (5) interleaved rounds (qkv, PyTorch, qkv, PyTorch, ...); the table shows the median round of each
side. Steps/s are wall-clock inside each child (bench/copy_task's clock), so the load average is printed.

    /usr/bin/python3 bench/compare_copy_task.py [--runs 5] [--rounds 5]
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

CONFIGS = {
    "d16": dict(embed="onehot", V=8, n=8, d_model=16, d_k=16, batch=32, lr=0.1, steps=1000),
    "d256": dict(embed="gauss", V=8, n=8, d_model=256, d_k=16, batch=32, lr=0.001, steps=500),
}


def torch_rate(cfg, runs):
    """In the PyTorch child (threads pinned by tc.torch_env): the median steps/s of `runs` runs."""
    import torch
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
    out = subprocess.run([exe, "--config", name, "--runs", str(runs), "--threads", "1", "--json"], check=True,
                         capture_output=True, text=True, env=tc.torch_env(1, torch_side=False)).stdout
    return json.loads(out)["median_steps_per_s"]


def torch_run(name, runs):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name, "--runs", str(runs)],
                         check=True, capture_output=True, text=True, env=tc.torch_env(1)).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="timed runs inside each child")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of both children")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--exe", default=os.path.join(os.path.dirname(__file__), "..", "build", "bench", "copy_task"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        rate = torch_rate(CONFIGS[a.child], a.runs)
        print(json.dumps(dict(median_steps_per_s=rate, report=tc.torch_config())))
        return
    tc.require_openblas()
    names = [c for c in a.configs.split(",") if c]
    load = os.getloadavg()
    results, report = {}, None
    for name in names:
        qs, ts = [], []
        for _ in range(a.rounds):
            qs.append(qkv_rate(name, a.runs, a.exe))
            t = torch_run(name, a.runs)
            ts.append(t["median_steps_per_s"])
            report = t["report"]
        results[name] = (qs, ts)
    print(tc.torch_config_line(report))
    print(tc.env_line(1))
    print(f"copy_task steps/s, one thread, each child's median of {a.runs} runs, median of {a.rounds} interleaved "
          f"rounds; wall time; load average {load[0]:.1f} at the start")
    print(f"{'config':8} {'qkv':>10} {'pytorch':>10} {'ratio':>8}   rounds (qkv / pytorch)")
    for name in names:
        qs, ts = results[name]
        q, t = statistics.median(qs), statistics.median(ts)
        rounds = ", ".join(f"{x:.0f} / {y:.0f}" for x, y in zip(qs, ts))
        print(f"{name:8} {q:10.0f} {t:10.0f} {q / t:7.1f}x   {rounds}")


if __name__ == "__main__":
    main()
