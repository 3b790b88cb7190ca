#!/usr/bin/python3
"""Write PyTorch golden files for qkv's attention variants (include/qkv/attention.h; run by hand with
Debian's python3-torch 1.13):

    /usr/bin/python3 tests/tools/make_golden_variants.py

Each variant's weights are written here from its paper's formula, in float64, on fixed random inputs
(batch element b uses head b % heads), and the gradients of L = sum(out * R) for a fixed random R are taken by
autograd. Files go to tests/data/variants/<case>_<name>.npy: q, k, v, mask (u8 [B, n_q, n_k], 1 keep), r,
param (the sink logits or the SSMax factors [heads], when the variant has one), out, dq, dk, dv, dparam.
Cases per variant: plain (no mask, non-square, a batch of 4 over 2 heads), masked (a [B, n_q, n_k] mask with
padding, a fully masked row and a row of one key) and causal (the causal rule as a mask; the C test passes
QKV_CAUSAL instead).
Soft-capped cases softcap_<variant>_<kind> (every variant and softmax itself, options.softcap = CAP): each score
x = scale q . k becomes CAP tanh(x / CAP) before the variant's weights (SSMax: x from its scaled q), drawn from
a generator of their own so that the cases above keep their bits.
tests/test_attention_variants.c and tests/test_attention_softcap.c read them (no PyTorch at run time) and
check qkv_attention_ex to 1e-10.
"""
import math
import os

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "variants")
EPS = 1e-6  # softpick's eps (qkv_attention_default_options)
CAP = 1.5  # the soft-cap of the softcap_ cases (tests/test_attention_softcap.c passes the same)


def per_head(param, batch, heads):
    """param [heads] -> [B, 1, 1], batch element b taking param[b % heads]."""
    idx = torch.tensor([b % heads for b in range(batch)])
    return param[idx].reshape(batch, 1, 1)


def weights(variant, x, keep, param, heads):
    """The weights of one variant for scaled scores x [B, n_q, n_k] and the keep mask (bool)."""
    batch, n_q, n_k = x.shape
    if variant in ("softmax1", "sink"):
        extra = torch.zeros(batch, n_q, 1, dtype=x.dtype) if variant == "softmax1" else \
            per_head(param, batch, heads).expand(batch, n_q, 1)
        logits = torch.cat([extra, x.masked_fill(~keep, float("-inf"))], dim=-1)
        return torch.softmax(logits, dim=-1)[..., 1:]
    if variant == "sigmoid":
        b = -math.log(n_k)  # Ramapuram et al.: b = -log(n)
        return torch.where(keep, torch.sigmoid(x + b), torch.zeros_like(x))
    if variant == "softpick":
        u = torch.exp(torch.where(keep, x, torch.zeros_like(x))) - 1.0
        return torch.relu(u) / (u.abs().sum(dim=-1, keepdim=True) + EPS)
    if variant == "softmax":  # SSMax after scaling q; a fully masked row gives 0
        w = torch.softmax(x.masked_fill(~keep, float("-inf")), dim=-1)
        return torch.where(keep.any(dim=-1, keepdim=True), w, torch.zeros_like(w))
    raise ValueError(variant)


def attention(variant, q, k, v, keep, param, heads, cap=0.0):
    scale = 1.0 / math.sqrt(q.shape[-1])
    if variant == "ssmax":
        n = keep.sum(dim=-1, keepdim=True).double()
        logn = torch.where(n > 1, torch.log(n.clamp(min=1)), torch.zeros_like(n))
        q = q * (per_head(param, q.shape[0], heads) * logn)
        variant = "softmax"
    x = torch.matmul(q, k.transpose(-2, -1)) * scale
    if cap > 0:  # Gemma 2's soft-cap of the logits
        x = cap * torch.tanh(x / cap)
    return torch.matmul(weights(variant, x, keep, param, heads), v)


def write(case, name, array):
    np.save(os.path.join(OUT, f"{case}_{name}.npy"), np.ascontiguousarray(array))


def make(case, variant, gen, batch, heads, n_q, n_k, d_k, d_v, keep, cap=0.0, spread=1.0):
    q = (spread * torch.randn(batch, n_q, d_k, generator=gen, dtype=torch.float64)).requires_grad_(True)
    k = torch.randn(batch, n_k, d_k, generator=gen, dtype=torch.float64).requires_grad_(True)
    v = torch.randn(batch, n_k, d_v, generator=gen, dtype=torch.float64).requires_grad_(True)
    param = None
    if variant == "sink":
        param = torch.randn(heads, generator=gen, dtype=torch.float64).requires_grad_(True)
    if variant == "ssmax":
        param = (0.3 + torch.rand(heads, generator=gen, dtype=torch.float64)).requires_grad_(True)
    out = attention(variant, q, k, v, torch.from_numpy(keep).bool(), param, heads, cap)
    r = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    (out * r).sum().backward()
    for name, t in (("q", q), ("k", k), ("v", v)):
        write(case, name, t.detach().numpy())
    write(case, "mask", keep.astype(np.uint8))
    write(case, "r", r.numpy())
    write(case, "out", out.detach().numpy())
    write(case, "dq", q.grad.numpy())
    write(case, "dk", k.grad.numpy())
    write(case, "dv", v.grad.numpy())
    if param is not None:
        write(case, "param", param.detach().numpy())
        write(case, "dparam", param.grad.numpy())


def cases(variants, gen, prefix="", cap=0.0, spread=1.0):
    for variant in variants:
        # no mask, non-square, 2 heads over a batch of 4
        make(f"{prefix}{variant}_plain", variant, gen, 4, 2, 5, 7, 3, 4, np.ones((4, 5, 7), dtype=np.uint8), cap, spread)
        # causal, batch 2 pads its last 3 keys, query 1 of batch 1 keeps no key, query 2 of batch 3 one key
        keep = np.tril(np.ones((6, 6), dtype=np.uint8))[None].repeat(4, axis=0)
        keep[2, :, 3:] = 0
        keep[1, 1, :] = 0
        keep[3, 2, :] = 0
        keep[3, 2, 4] = 1
        make(f"{prefix}{variant}_masked", variant, gen, 4, 2, 6, 6, 5, 3, keep, cap, spread)
        # causal alone (the C test passes QKV_CAUSAL and no mask), non-square: query i keeps keys j <= i
        make(f"{prefix}{variant}_causal", variant, gen, 2, 2, 7, 5, 4, 2,
             np.tril(np.ones((7, 5), dtype=np.uint8))[None].repeat(2, axis=0), cap, spread)


def main():
    os.makedirs(OUT, exist_ok=True)
    cases(("softmax1", "sink", "sigmoid", "ssmax", "softpick"), torch.Generator().manual_seed(3131))
    # soft-capped, q drawn with std 2 so that many scores reach the cap's bend
    cases(("softmax", "softmax1", "sink", "sigmoid", "ssmax", "softpick"), torch.Generator().manual_seed(2727),
          "softcap_", CAP, 2.0)
    print("wrote", len(os.listdir(OUT)), "files to", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
