/*
 * gelu_kernels.h — the f32 kernels of the exact GELU (ops/gelu.c, QKV_GELU_ERF) and the f32 erf / erfc they
 * are built on, one set per instruction set: gelu_portable.c (plain C, fmaf), gelu_avx2.c (AVX2+FMA, 8 lanes)
 * and gelu_avx512.c (AVX-512F, 16 lanes; these two are gelu_simd.h at two widths). All compute the same
 * operations in the same order with one rounding per operation (every a b + c is one fused multiply-add), so
 * the sets give the same bits. qkv_gelu_kernels_ picks the widest set that qkv_isa_supported_ says the CPU
 * runs and that was compiled with its flags.
 *
 * erfc(a), a >= 0, the core (no division by an erfc that could be 0, no 1 + erf that cancels):
 *   a is clamped to 11 (erfc(11) < 2^-150 rounds to 0 in f32; a NaN stays NaN)
 *   t = 1 / (1 + a / 2),  erfc(a) = exp(-a^2) t P(t),  P of degree 10 fitted to erfc(a) exp(a^2) / t on
 *   t in [1/6.5, 1] (a in [0, 11]) by Chebyshev interpolation (mpmath, relative error < 6e-9)
 *   a^2 = hi + lo exactly (hi = a a rounded, lo = fma(a, a, -hi)), so exp(-a^2) does not lose the ~a^2 2^-24
 *   relative that rounding a^2 would cost in the tail; exp(-hi - lo) = 2^n exp(r), n = round(-hi / ln 2),
 *   r = ((-hi - n ln2_hi) - n ln2_lo) - lo, exp(r) by Cephes' expf polynomial; 2^n is applied as 2^h 2^(n-h)
 *   after the product t P(t) exp(r), so a subnormal erfc is rounded once.
 * erf(z): z P2(z^2) for |z| < 1 (P2 of degree 6 fitted to erf(z) / z on z^2 in [0, 1], relative error
 *   < 1.4e-9), sign(z) (1 - erfc(|z|)) above.
 * GELU, x > -3 (every lane of a vector, or an element: the polynomial path): no exp and no division.
 *   Phi(x) and dy/dx = Phi(x) + x phi(x) are each a polynomial in u = x - k on eight pieces, k = round(x)
 *   clamped to [-3, 4] (1.5 2^23 trick; its low 3 bits pick the piece's coefficients, a vpermps in AVX2),
 *   u = min(x, 6) - k exact: piece k is [k - 1/2, k + 1/2], the first [-3, -5/2], the last [7/2, 6], and
 *   x >= 6 is evaluated at 6, where both round to 1. Degree QKV_GELU_PHI_DEG for Phi, QKV_GELU_DPHI_DEG for
 *   dy/dx, fitted by ops/kernels/gelu_fit.py (relative to Phi, and to |dy/dx| + 2 Phi where its two terms
 *   cancel near x = -0.75); evaluated in f32 by Horner (fmaf). The fits' worst errors: Phi 4.1 ulp at x
 *   near -2.5 (where Phi is 0.006 and varies fastest relative to itself; elsewhere below 1.3 ulp), dy/dx
 *   2.1 ulp of |dy/dx| + 2 Phi. Measured on the f32 kernels (erf_kernels_gelu_polynomial_path_*, over 2.8
 *   million x in (-3, 8]): y within 5.5 ulp of y (QKV_GELU_Y_F32_ULP 6, which is the erfc path's own
 *   QKV_ERFC_F32_ULP), dy/dx within 2.4 ulp of |dy/dx| + 2 Phi (QKV_GELU_DY_F32_ULP 3). The rest (x <= -3,
 *   and NaN) takes the erfc path below; a vector of 8 takes it only if one of its lanes needs it (1% of
 *   N(0, 1) vectors), and then each lane keeps the result of its own path, so the bits do not depend on
 *   the neighbours.
 * GELU, the erfc path: Phi(x) = erfc(|x| / sqrt 2) / 2 for x < 0, 1 - that for x >= 0, with |x| / sqrt 2
 *   rounded once but x^2 / 2 = hi + lo taken exactly from x; y = x Phi(x); dy/dx = Phi(x) + x phi(x),
 *   x phi(x) = x exp(-x^2 / 2) / sqrt(2 pi) from the same exp(r) and 2^n (|x| clamped to 15.6 first, where
 *   exp(-x^2 / 2) is 0 in f32: so x phi(x) is 0, not inf 0, at x = +-inf).
 *
 * Measured over every f32 in [-12, 12] plus a sweep of the tails, subnormals, +-inf and NaN
 * (tests/test_embed_norm_gelu.c, erf_kernels_*): erf within QKV_ERF_F32_ULP ulp of erf(z) computed in
 * double, erfc within QKV_ERFC_F32_ULP ulp (an ulp of the f32 result; subnormal results: 2^-149).
 */
#ifndef QKV_GELU_KERNELS_H
#define QKV_GELU_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#define QKV_ERF_F32_ULP 3
#define QKV_ERFC_F32_ULP 6
/* the GELU kernels' polynomial path (x > -3): y in ulps of y, dy/dx in ulps of |dy/dx| + 2 Phi(x) */
#define QKV_GELU_Y_F32_ULP 6
#define QKV_GELU_DY_F32_ULP 3

/* P(t), highest degree first */
#define QKV_ERFC_P10 0.03446011175528348f
#define QKV_ERFC_P9 -0.18398238946871182f
#define QKV_ERFC_P8 0.36501812679513096f
#define QKV_ERFC_P7 -0.2680782628235107f
#define QKV_ERFC_P6 -0.03942015769130717f
#define QKV_ERFC_P5 0.04444665514225484f
#define QKV_ERFC_P4 0.05191552134471226f
#define QKV_ERFC_P3 0.1861785297146221f
#define QKV_ERFC_P2 0.24511895132446015f
#define QKV_ERFC_P1 0.28225431209252555f
#define QKV_ERFC_P0 0.28208860416537673f
/* P2(s), s = z^2, highest degree first */
#define QKV_ERF_Q6 7.875875062685488e-05f
#define QKV_ERF_Q5 -0.000801686428716587f
#define QKV_ERF_Q4 0.005189087423433974f
#define QKV_ERF_Q3 -0.026854212010626412f
#define QKV_ERF_Q2 0.11283594715160218f
#define QKV_ERF_Q1 -0.37612626666720334f
#define QKV_ERF_Q0 1.1283791658483509f
/* exp(r) = 1 + r + r^2 E(r), Cephes expf */
#define QKV_EXP_E5 1.9875691500e-4f
#define QKV_EXP_E4 1.3981999507e-3f
#define QKV_EXP_E3 8.3334519073e-3f
#define QKV_EXP_E2 4.1665795894e-2f
#define QKV_EXP_E1 1.6666665459e-1f
#define QKV_EXP_E0 5.0000001201e-1f
#define QKV_LOG2E_F 1.44269504088896341f
#define QKV_LN2_HI_F 0.693359375f
#define QKV_LN2_LO_F -2.12194440e-4f
#define QKV_ROUND_MAGIC_F 12582912.0f /* 1.5 2^23: adding it rounds to an integer, read from the low bits */
#define QKV_ERFC_CLAMP_F 11.0f
#define QKV_GELU_CLAMP_F 15.6f /* x^2 / 2 > 121.6: exp(-x^2 / 2) < 2^-175 is 0 in f32 */
#define QKV_INV_SQRT2_F 0.70710678118654752f
#define QKV_INV_SQRT2PI_F 0.39894228040143268f

/* the polynomial path: coefficient [power][k mod 8] (gelu_portable.c, from ops/kernels/gelu_fit.py) */
#define QKV_GELU_PHI_DEG 8
#define QKV_GELU_DPHI_DEG 7
extern const float qkv_gelu_phi_c_[QKV_GELU_PHI_DEG + 1][8];
extern const float qkv_gelu_dphi_c_[QKV_GELU_DPHI_DEG + 1][8];

typedef struct qkv_gelu_kernel_set_ {
    const char *name;
    bool available; /* compiled with its ISA flags */
    /* y[i] = x[i] Phi(x[i]) */
    void (*erf_forward)(const float *x, float *y, int64_t n);
    /* dx[i] += dy[i] (Phi(x[i]) + x[i] phi(x[i])) when add, else dx[i] = dy[i] (...) (a fresh gradient:
     * dx is only written) */
    void (*erf_backward)(const float *x, const float *dy, float *dx, int64_t n, bool add);
    /* out[i] = erf(z[i]), erfc(z[i]) (any z: erfc(-a) = 2 - erfc(a)) */
    void (*erf)(const float *z, float *out, int64_t n);
    void (*erfc)(const float *z, float *out, int64_t n);
} qkv_gelu_kernel_set_;

extern const qkv_gelu_kernel_set_ qkv_gelu_kernels_portable_;
extern const qkv_gelu_kernel_set_ qkv_gelu_kernels_avx2_;
extern const qkv_gelu_kernel_set_ qkv_gelu_kernels_avx512_;

/* The set this CPU runs (decided once). */
const qkv_gelu_kernel_set_ *qkv_gelu_kernels_(void);
/* The set of one ISA (QKV_ISA_PORTABLE_, QKV_ISA_AVX2_, QKV_ISA_AVX512_), or NULL when it is not compiled in
 * or the CPU lacks it. */
const qkv_gelu_kernel_set_ *qkv_gelu_kernels_isa_(int isa);

#endif
