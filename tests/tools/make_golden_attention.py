#!/usr/bin/python3
"""Write PyTorch golden files for qkv's attention tests (run by hand; needs Debian's python3-torch).

For each case, the seed's reference attention (../shared/seed/README.md),

    scores = Q K^T / sqrt(d_k);  scores.masked_fill(mask == 0, -inf);  attn = softmax(scores, -1);
    out = attn V;  return out, attn

runs in float64 on fixed random inputs, and the gradients of L = sum(out * R) for a fixed random R
are taken by autograd. Everything is written as .npy under tests/data/golden/<case>_<name>.npy:
q, k, v, mask (u8, 1 keep), r, out, attn, dq, dk, dv. Rows that are fully masked come out of
PyTorch 1.13 as NaN; the test checks qkv's defined zeros there instead.

    /usr/bin/python3 tests/tools/make_golden_attention.py
"""
import math
import os

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden")


def reference_attention(q, k, v, mask=None):
    d_k = q.size(-1)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, float("-inf"))
    attn = torch.softmax(scores, dim=-1)
    return torch.matmul(attn, v), attn


def defined_attention(q, k, v, mask):
    """qkv's definition, computed with PyTorch: a row with every key dropped gets zero weights."""
    d_k = q.size(-1)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d_k)
    scores = scores.masked_fill(mask == 0, float("-inf"))
    attn = torch.softmax(scores, dim=-1)
    attn = torch.where(mask.bool().any(dim=-1, keepdim=True), attn, torch.zeros_like(attn))
    return torch.matmul(attn, v), attn


def write(case, name, array):
    np.save(os.path.join(OUT, f"{case}_{name}.npy"), np.ascontiguousarray(array))


def make(case, q, k, v, mask, seed):
    gen = torch.Generator().manual_seed(seed)
    q0, k0, v0 = q, k, v
    q = q.clone().requires_grad_(True)
    k = k.clone().requires_grad_(True)
    v = v.clone().requires_grad_(True)
    out, attn = reference_attention(q, k, v, None if mask is None else torch.from_numpy(mask))
    r = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    (out * r).sum().backward()
    if mask is None:
        mask = np.ones((q.shape[0], q.shape[1], k.shape[1]), dtype=np.uint8)
    write(case, "q", q.detach().numpy())
    write(case, "k", k.detach().numpy())
    write(case, "v", v.detach().numpy())
    write(case, "mask", mask.astype(np.uint8))
    write(case, "r", r.numpy())
    write(case, "out", out.detach().numpy())
    write(case, "attn", attn.detach().numpy())
    write(case, "dq", q.grad.numpy())
    write(case, "dk", k.grad.numpy())
    write(case, "dv", v.grad.numpy())
    if (mask.reshape(-1, mask.shape[-1]).max(axis=1) == 0).any():
        # PyTorch's own result has NaN here; also write qkv's defined semantics, computed by PyTorch
        q = q0.clone().requires_grad_(True)
        k = k0.clone().requires_grad_(True)
        v = v0.clone().requires_grad_(True)
        out, attn = defined_attention(q, k, v, torch.from_numpy(mask))
        (out * r).sum().backward()
        write(case, "defined_out", out.detach().numpy())
        write(case, "defined_attn", attn.detach().numpy())
        write(case, "defined_dq", q.grad.numpy())
        write(case, "defined_dk", k.grad.numpy())
        write(case, "defined_dv", v.grad.numpy())


def randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def main():
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(1234)
    seed_q = torch.tensor([[[1, 0], [0, 1], [1, 1]]], dtype=torch.float64)
    seed_k = torch.tensor([[[1, 0], [0, 1], [1, 0]]], dtype=torch.float64)
    seed_v = torch.tensor([[[10, 0], [0, 10], [5, 5]]], dtype=torch.float64)
    make("seed", seed_q, seed_k, seed_v, None, 1)
    make("batch2_n4_d8", randn(gen, 2, 4, 8), randn(gen, 2, 4, 8), randn(gen, 2, 4, 8), None, 2)
    make("nonsquare_b2_3x5", randn(gen, 2, 3, 6), randn(gen, 2, 5, 6), randn(gen, 2, 5, 4), None, 3)
    causal = np.tril(np.ones((1, 6, 6), dtype=np.uint8)).repeat(3, axis=0)
    make("causal_b3_n6_d16", randn(gen, 3, 6, 16), randn(gen, 3, 6, 16), randn(gen, 3, 6, 16), causal, 4)
    # padding: batch 1 has its last two keys padded, and query 2 of batch 0 sees no key at all
    pad = np.ones((2, 5, 5), dtype=np.uint8)
    pad[1, :, 3:] = 0
    pad[0, 2, :] = 0
    make("masked_rows_b2_n5_d4", randn(gen, 2, 5, 4), randn(gen, 2, 5, 4), randn(gen, 2, 5, 4), pad, 5)
    print("wrote", len(os.listdir(OUT)), "files to", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
