#!/usr/bin/python3
"""Write PyTorch golden files for qkv_embedding, qkv_layer_norm, qkv_rms_norm and qkv_gelu (run by hand;
needs Debian's python3-torch 1.13).

Each case runs the PyTorch reference in float64 on fixed random inputs and takes the gradients of
L = sum(out * R) for a fixed random R by autograd:

    embedding   out = torch.nn.functional.embedding(ids, table)
    layer norm  out = torch.nn.functional.layer_norm(x, (d,), gamma, beta, eps)
    RMS norm    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gamma   (no 1.13 function)
    GELU        out = torch.nn.functional.gelu(x, approximate='none' or 'tanh')

Everything is written as .npy under tests/data/golden/<case>_<name>.npy: the inputs (x or table, ids as
int32, gamma and beta when present, eps as a one-element float64 array), r, out, and the gradients
(dx or dtable, dgamma, dbeta). Only the files of these cases are (re)written.

    /usr/bin/python3 tests/tools/make_golden_embed_norm_gelu.py
"""
import os

import numpy as np
import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden")
written = []


def write(case, name, array):
    path = os.path.join(OUT, f"{case}_{name}.npy")
    np.save(path, np.ascontiguousarray(array))
    written.append(path)


def randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def leaf(t):
    return None if t is None else t.clone().requires_grad_(True)


def project(case, out, gen):
    r = randn(gen, *out.shape)
    (out * r).sum().backward()
    write(case, "r", r.numpy())
    write(case, "out", out.detach().numpy())


def embedding(case, table, ids, gen):
    table = leaf(table)
    out = F.embedding(torch.from_numpy(ids).long(), table)
    project(case, out, gen)
    write(case, "table", table.detach().numpy())
    write(case, "ids", ids.astype(np.int32))
    write(case, "dtable", table.grad.numpy())


def norm(case, kind, x, gamma, beta, eps, gen):
    x, gamma, beta = leaf(x), leaf(gamma), leaf(beta)
    if kind == "layer":
        out = F.layer_norm(x, (x.shape[-1],), gamma, beta, eps)
    else:
        out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        if gamma is not None:
            out = out * gamma
    project(case, out, gen)
    write(case, "x", x.detach().numpy())
    write(case, "eps", np.array([eps], dtype=np.float64))
    write(case, "dx", x.grad.numpy())
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p is not None:
            write(case, name, p.detach().numpy())
            write(case, "d" + name, p.grad.numpy())


def gelu(case, approximate, x, gen):
    x = leaf(x)
    out = F.gelu(x, approximate=approximate)
    project(case, out, gen)
    write(case, "x", x.detach().numpy())
    write(case, "dx", x.grad.numpy())


def main():
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(2024)

    ids = np.array([[3, 0, 3, 6, 3], [1, 1, 0, 6, 2]], dtype=np.int32)  # repeats, both ends of [0, V)
    embedding("emb_b2_n5_v7_d4", randn(gen, 7, 4), ids, gen)
    embedding("emb_n6_v5_d3", randn(gen, 5, 3), np.array([4, 4, 4, 0, 2, 4], dtype=np.int32), gen)

    d = 8
    norm("ln_b2_n3_d8", "layer", randn(gen, 2, 3, d), 1 + 0.5 * randn(gen, d), randn(gen, d), 1e-5, gen)
    x = randn(gen, 4, 5)
    x[1] = 0.75  # a constant row
    x[3] = 0.0
    norm("ln_const_rows_d5", "layer", x, None, None, 1e-5, gen)
    norm("ln_offset_d16", "layer", 1e4 + randn(gen, 3, 16), 1 + 0.5 * randn(gen, 16), None, 1e-6, gen)
    norm("ln_d1", "layer", randn(gen, 3, 1), None, randn(gen, 1), 1e-5, gen)
    norm("ln_odd_d33", "layer", 3 * randn(gen, 2, 2, 33), 1 + 0.5 * randn(gen, 33), randn(gen, 33), 1e-5, gen)

    norm("rms_b2_n3_d8", "rms", randn(gen, 2, 3, d), 1 + 0.5 * randn(gen, d), None, 1e-6, gen)
    norm("rms_zero_row_d5", "rms", torch.cat([randn(gen, 2, 5), torch.zeros(1, 5, dtype=torch.float64)]),
         None, None, 1e-5, gen)
    norm("rms_large_d16", "rms", 1e4 * randn(gen, 3, 16), 1 + 0.5 * randn(gen, 16), None, 1e-6, gen)
    norm("rms_odd_d33", "rms", randn(gen, 2, 2, 33), 1 + 0.5 * randn(gen, 33), None, 1e-5, gen)

    x = torch.cat([torch.linspace(-8, 8, 97, dtype=torch.float64), 3 * randn(gen, 30),
                   torch.tensor([0.0, 1e-8, -1e-8, 20.0, -20.0], dtype=torch.float64)]).reshape(4, 33)
    gelu("gelu_erf_4x33", "none", x, gen)
    gelu("gelu_tanh_4x33", "tanh", x, gen)
    print("wrote", len(written), "files to", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
