#!/usr/bin/python3
"""Write PyTorch golden files for qkv_relu, qkv_softcap, qkv_rope and qkv_sinusoidal_positions (run by hand;
needs Debian's python3-torch 1.13). qkv_dropout has none: its mask comes from qkv's own RNG, and
tests/test_rope_dropout.c checks it against the mask itself.

Each case runs in float64 on fixed random inputs; the gradient of L = sum(y * r) for a fixed random r is
taken by autograd. Files: tests/data/golden/blocks_<case>_<name>.npy with x, r, y, dx and params (the
operator's scalars: [cap] for softcap, [base, offset] for rope, [n, d] for the sinusoidal table).

RoPE is written here the way GPT-NeoX and LLaMA (Hugging Face) write it, independently of qkv's loops:

    inv_freq = 1 / base^(arange(0, d, 2) / d);  freqs = outer(positions, inv_freq)
    emb = cat(freqs, freqs);  y = x cos(emb) + rotate_half(x) sin(emb),  rotate_half(x) = cat(-x2, x1)

The sinusoidal table is the one of "The Annotated Transformer" (div_term = exp(arange(0, d, 2) * -ln(1e4)/d),
pe[:, 0::2] = sin(pos div_term), pe[:, 1::2] = cos(pos div_term)), with the cos columns cut to d // 2 for
an odd d.

    /usr/bin/python3 tests/tools/make_golden_blocks.py
"""
import math
import os

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden")


def write(case, name, array):
    np.save(os.path.join(OUT, f"blocks_{case}_{name}.npy"), np.ascontiguousarray(array))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope_reference(x, base, offset):
    n, d = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    positions = torch.arange(offset, offset + n, dtype=torch.float64)
    freqs = torch.outer(positions, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return x * emb.cos() + rotate_half(x) * emb.sin()


def sinusoidal_reference(n, d):
    pe = torch.zeros(n, d, dtype=torch.float64)
    position = torch.arange(0, n, dtype=torch.float64).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * -(math.log(10000.0) / d))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term[: d // 2])
    return pe


def make(case, fn, x, params, gen):
    x = x.clone().requires_grad_(True)
    y = fn(x)
    r = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    (y * r).sum().backward()
    write(case, "x", x.detach().numpy())
    write(case, "r", r.numpy())
    write(case, "y", y.detach().numpy())
    write(case, "dx", x.grad.numpy())
    write(case, "params", np.array(params, dtype=np.float64))


def main():
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(1414)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    # relu: ties at exactly 0 (PyTorch's gradient there is 0), odd last dimension
    x = randn(3, 7)
    x[0, 0] = 0.0
    x[1, 3] = 0.0
    x[2, 6] = -0.0
    make("relu_3x7", torch.relu, x, [], gen)
    make("relu_b2_4x5", torch.relu, randn(2, 4, 5), [], gen)

    # softcap: cap tanh(x / cap); small and large caps, saturation at |x| = 1e4
    for case, shape, scale, cap in [("softcap_cap0.5", (2, 3, 5), 2.0, 0.5),
                                    ("softcap_cap30", (4, 9), 40.0, 30.0),
                                    ("softcap_cap1e3", (3, 7), 1e3, 1e3)]:
        make(case, lambda t, c=cap: c * torch.tanh(t / c), randn(*shape, scale=scale), [cap], gen)
    x = randn(2, 5)
    x[0, :] = torch.tensor([1e4, -1e4, 3e3, -50.0, 0.0], dtype=torch.float64)
    make("softcap_saturated", lambda t: 0.5 * torch.tanh(t / 0.5), x, [0.5], gen)

    # rope: offsets 0, 1 and 1000 (and 100000), batch and no batch, d = 2 the smallest
    for case, shape, base, offset in [("rope_n5_d8_off0", (5, 8), 10000.0, 0),
                                      ("rope_b3_n4_d16_off1", (3, 4, 16), 10000.0, 1),
                                      ("rope_b2_n6_d2_off1000", (2, 6, 2), 10000.0, 1000),
                                      ("rope_b4_n3_d32_off1000_base500", (4, 3, 32), 500.0, 1000),
                                      ("rope_n2_d6_off100000", (2, 6), 10000.0, 100000)]:
        make(case, lambda t, b=base, o=offset: rope_reference(t, b, o), randn(*shape), [base, offset], gen)

    # the sinusoidal table
    for n, d in [(50, 16), (7, 5), (1, 1), (3, 2)]:
        write(f"sinusoidal_{n}x{d}", "y", sinusoidal_reference(n, d).numpy())
        write(f"sinusoidal_{n}x{d}", "params", np.array([n, d], dtype=np.float64))
    print("wrote blocks_* files to", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
