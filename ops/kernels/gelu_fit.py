#!/usr/bin/python3
"""gelu_fit.py — the coefficient tables of the f32 exact-GELU kernels' polynomial path (gelu_kernels.h).

Phi(x) = erfc(-x / sqrt 2) / 2 and G(x) = Phi(x) + x phi(x) (dy/dx), on x > -3, are polynomials in u = x - k
on eight pieces, k = round(x) clamped to [-3, 4]: piece k covers [k - 1/2, k + 1/2], the first [-3, -5/2],
the last [7/2, 6] (x >= 6 is evaluated at 6, where both round to 1 in f32: the last piece's constant
term is moved by ulps until its f32 polynomial gives exactly 1 there). Each piece is a weighted
least-squares fit of degree 8 (Phi) or 7 (G), reweighted towards minimax (Lawson), of the relative error
(Phi) or of the error relative to |G| + 2 Phi (the scale tests/test_embed_norm_gelu.c measures dy/dx by;
G's two terms cancel near x = -0.75). The exact values come from math.erfc in
double. Prints the C tables of gelu_portable.c, indexed [power][k mod 8], and the worst error of each piece
evaluated as the kernels do (f32 coefficients, Horner with one rounding per fused step, u = x - k exact).

    /usr/bin/python3 ops/kernels/gelu_fit.py      (numpy only)
"""
import math

import numpy as np

K_MIN, K_MAX, TOP, BOTTOM = -3, 4, 6.0, -3.0
DEG = {"PHI": 8, "DPHI": 7}


def phi_cdf(x):
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def dgelu(x):
    return phi_cdf(x) + x * math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def piece(k):
    return (BOTTOM if k == K_MIN else k - 0.5), (TOP if k == K_MAX else k + 0.5)


def fit(fn, scale, k, d):
    lo, hi = piece(k)
    xs = (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (np.arange(600) + 0.5) / 600)
    a = np.vander(xs - k, d + 1, increasing=True)
    y = np.array([fn(x) for x in xs])
    w = np.array([1.0 / scale(x) for x in xs])
    lw = np.ones_like(xs)
    for _ in range(40):  # Lawson: weights towards the points of largest error
        ww = w * np.sqrt(lw)
        c, *_ = np.linalg.lstsq(a * ww[:, None], y * ww, rcond=None)
        r = np.abs(a @ c - y) * w
        lw = lw * r
        lw /= lw.sum()
    c = [np.float32(v) for v in c]
    if k == K_MAX:  # x >= TOP is evaluated at TOP, where Phi and G round to 1: make the f32 polynomial give 1
        for _ in range(64):
            v = horner32(c, np.float32(TOP - k))
            if v == np.float32(1.0):
                break
            c[0] = np.nextafter(c[0], np.float32(-np.inf) if v > 1 else np.float32(np.inf), dtype=np.float32)
        assert horner32(c, np.float32(TOP - k)) == np.float32(1.0)
    return c


def ulp(v):
    return 2.0 ** (math.frexp(abs(v))[1] - 24)


def horner32(c, u):
    p = c[-1]
    for v in reversed(c[:-1]):
        p = np.float32(float(p) * float(u) + float(v))  # one rounding: the product is exact in double
    return p


def worst(fn, scale, k, c):
    lo, hi = piece(k)
    w, at = 0.0, lo
    for x in np.linspace(lo, hi, 4001, dtype=np.float32):
        u = np.float32(float(x) - k)
        e = abs(float(horner32(c, u)) - fn(float(x))) / ulp(scale(float(x)))
        if e > w:
            w, at = e, float(x)
    return w, at


def main():
    funcs = {"PHI": (phi_cdf, phi_cdf), "DPHI": (dgelu, lambda x: abs(dgelu(x)) + 2 * phi_cdf(x))}
    for name, (fn, scale) in funcs.items():
        d = DEG[name]
        table = [[0.0] * 8 for _ in range(d + 1)]
        for k in range(K_MIN, K_MAX + 1):
            c = fit(fn, scale, k, d)
            for p in range(d + 1):
                table[p][k % 8] = c[p]
            w, at = worst(fn, scale, k, c)
            print(f"/* {name} piece k = {k:2d} {piece(k)}: worst {w:.2f} ulp at x = {at:.6g} */")
        print(f"const float qkv_gelu_{name.lower()}_c_[QKV_GELU_{name}_DEG + 1][8] = {{")
        for p in range(d + 1):
            print("    {" + ", ".join(f"{float(v):.9g}f" for v in table[p]) + "},")
        print("};")


if __name__ == "__main__":
    main()
