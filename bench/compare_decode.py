#!/usr/bin/python3
"""Decoding tokens/s: qkv_model_sample with its key/value cache (build/bench/decode) against the same model
generating greedily in PyTorch 1.13 eager with its own key/value cache, same run, interleaved, one thread each.
Needs Debian's python3-torch (run with /usr/bin/python3).

The model (both sides): 4 layers, d_model 256, 4 heads of 64, d_mlp 1024, vocab 256, n_ctx 1024, learned
positions, pre-norm layer norm, causal softmax attention scaled 1/sqrt(64), GELU (erf) MLP with biases, final
layer norm, unembedding W_U; f32, random weights (N(0, 0.02^2); speed does not depend on them). A timed run
extends a random prompt of P tokens by N = --new tokens, greedily; tokens/s is N over the run's time, which
includes the prompt's forward (the cache's fill) on both sides.

PyTorch's generation, written as a user would for speed under torch.no_grad(): the prompt's forward fills
preallocated caches K, V [H, n_ctx, 64] per layer; each new token runs one position through the layers,
writes its k and v at its position, and attends to K[:, :pos+1], V[:, :pos+1]. qkv's: bench/decode.c
(qkv_model_sample, which fills the cache with the prompt, then one position a token; see model/sample.c).

Threads, OpenBLAS and children as bench/torch_child.py says. Each child does one warm-up run, then --runs runs
and reports the median; the children alternate (qkv, PyTorch, ...) for --rounds rounds and the table shows the
median over rounds of each side's medians. Also prints qkv with the cache off (the window rerun every token),
to show what the cache buys. Prints figures, asserts nothing.

    /usr/bin/python3 bench/compare_decode.py [--prompts 16,512] [--new 64] [--rounds 3] [--runs 5]
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

from torch_child import env_line, require_openblas, torch_config, torch_config_line, torch_env, torch_setup

HERE = os.path.dirname(os.path.abspath(__file__))
L, D, H, DM, V, N_CTX = 4, 256, 4, 1024, 256, 1024


def torch_child(prompt_len, n_new, runs):
    torch = torch_setup(1)
    import torch.nn.functional as F
    dh = D // H
    scale = 1.0 / math.sqrt(dh)
    torch.manual_seed(0)

    def w(*shape):
        return torch.randn(*shape) * 0.02

    P = dict(W_E=w(V, D), W_pos=w(N_CTX, D), lnf_w=torch.ones(D), lnf_b=torch.zeros(D), W_U=w(D, V))
    blocks = [dict(ln1_w=torch.ones(D), ln1_b=torch.zeros(D), W_Q=w(D, D), W_K=w(D, D), W_V=w(D, D), W_O=w(D, D),
                   ln2_w=torch.ones(D), ln2_b=torch.zeros(D), W_in=w(D, DM), b_in=torch.zeros(DM), W_out=w(DM, D),
                   b_out=torch.zeros(D)) for _ in range(L)]
    K = [torch.zeros(H, N_CTX, dh) for _ in range(L)]
    Vc = [torch.zeros(H, N_CTX, dh) for _ in range(L)]

    def forward(ids, pos):
        """ids [n] at positions pos .. pos+n-1, through the cache; the last position's logits [V]."""
        n = ids.shape[0]
        x = P["W_E"][ids] + P["W_pos"][pos:pos + n]
        for l, b in enumerate(blocks):
            h = F.layer_norm(x, (D,), b["ln1_w"], b["ln1_b"], 1e-5)
            q = (h @ b["W_Q"]).view(n, H, dh).transpose(0, 1)  # [H, n, dh]
            K[l][:, pos:pos + n] = (h @ b["W_K"]).view(n, H, dh).transpose(0, 1)
            Vc[l][:, pos:pos + n] = (h @ b["W_V"]).view(n, H, dh).transpose(0, 1)
            k, v = K[l][:, :pos + n], Vc[l][:, :pos + n]
            s = scale * (q @ k.transpose(-2, -1))  # [H, n, pos+n]
            if n > 1:
                s = s.masked_fill(torch.triu(torch.ones(n, pos + n, dtype=torch.bool), pos + 1), float("-inf"))
            z = torch.softmax(s, -1) @ v
            x = x + z.transpose(0, 1).reshape(n, D) @ b["W_O"]
            h = F.layer_norm(x, (D,), b["ln2_w"], b["ln2_b"], 1e-5)
            x = x + F.gelu(h @ b["W_in"] + b["b_in"]) @ b["W_out"] + b["b_out"]
        return F.layer_norm(x[-1], (D,), P["lnf_w"], P["lnf_b"], 1e-5) @ P["W_U"]

    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, V, (prompt_len,), generator=g)

    def generate():
        with torch.no_grad():
            logits = forward(prompt, 0)
            for t in range(n_new):
                nxt = int(torch.argmax(logits))
                if t + 1 < n_new:
                    logits = forward(torch.tensor([nxt]), prompt_len + t)

    generate()
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        generate()
        rates.append(n_new / (time.perf_counter() - t0))
    return dict(median=statistics.median(rates), min=min(rates), max=max(rates), **torch_config())


def run_qkv(exe, prompt_len, n_new, runs, uncached=False):
    args = [exe, "--prompt", str(prompt_len), "--new", str(n_new), "--runs", str(runs), "--tsv"]
    out = subprocess.run(args + (["--uncached"] if uncached else []), check=True, capture_output=True, text=True,
                         env=torch_env(1, False)).stdout.split("\t")
    return float(out[2])


def run_torch(prompt_len, n_new, runs):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(prompt_len), "--new", str(n_new),
                          "--runs", str(runs)], check=True, capture_output=True, text=True, env=torch_env(1)).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="16,512")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--exe", default=os.path.join(HERE, "..", "build", "bench", "decode"))
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(torch_child(a.child, a.new, a.runs)))
        return
    require_openblas()
    print(env_line(1))
    cfg = None
    print("%8s %6s %14s %14s %8s %16s" % ("prompt", "new", "qkv tok/s", "PyTorch tok/s", "ratio", "qkv uncached"))
    for prompt_len in [int(p) for p in a.prompts.split(",") if p]:
        qs, ts = [], []
        for _ in range(a.rounds):
            qs.append(run_qkv(a.exe, prompt_len, a.new, a.runs))
            t = run_torch(prompt_len, a.new, a.runs)
            ts.append(t["median"])
            cfg = t
        unc = run_qkv(a.exe, prompt_len, a.new, max(1, a.runs // 2), uncached=True)
        q, t = statistics.median(qs), statistics.median(ts)
        print("%8d %6d %14.1f %14.1f %7.2fx %16.1f" % (prompt_len, a.new, q, t, q / t, unc))
        print("         rounds: qkv %s, PyTorch %s" % (", ".join("%.1f" % x for x in qs), ", ".join("%.1f" % x for x in ts)))
    if cfg:
        print(torch_config_line(cfg))


if __name__ == "__main__":
    main()
