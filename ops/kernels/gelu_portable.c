/*
 * gelu_portable.c — the f32 exact-GELU kernels and erf / erfc in plain C, one element at a time, and the
 * choice of the set the CPU runs. The maths, the constants and the error bounds: gelu_kernels.h. Every
 * a b + c is an explicit fmaf, and every other operation is written as gelu_avx2.c does it, in the same
 * order, so that the two sets give the same bits (tests/test_embed_norm_gelu.c compares them).
 */
#include "qkv_internal.h"

#include "gelu_kernels.h"

#include <math.h>
#include <string.h>

/* exp(-hi - lo) = e 2^h 2^(n-h), returned as e (in [0.7, 1.5]) and the two factors, for 0 <= hi <= 122 (or
 * NaN, which gives a NaN e): n = round(-hi / ln 2) by the 1.5 2^23 trick, r = -hi - lo - n ln 2. */
static inline float expneg(float hi, float lo, float *s1, float *s2) {
    float tn = fmaf(-hi, QKV_LOG2E_F, QKV_ROUND_MAGIC_F);
    uint32_t tb;
    memcpy(&tb, &tn, sizeof tb);
    uint32_t ni = tb - 0x4B400000u; /* n as the low bits (two's complement), for |n| < 2^22 */
    float n = tn - QKV_ROUND_MAGIC_F;
    float r = fmaf(n, -QKV_LN2_HI_F, -hi); // r = -hi - n ln2_hi (exact)
    r = fmaf(n, -QKV_LN2_LO_F, r);         //     - n ln2_lo
    r = r - lo;                            //     - lo
    float q = QKV_EXP_E5;
    q = fmaf(q, r, QKV_EXP_E4);
    q = fmaf(q, r, QKV_EXP_E3);
    q = fmaf(q, r, QKV_EXP_E2);
    q = fmaf(q, r, QKV_EXP_E1);
    q = fmaf(q, r, QKV_EXP_E0);
    float e = fmaf(q, r * r, r) + 1.0f; // e = exp(r) = 1 + r + r^2 E(r)
    /* h = floor(n / 2) as an arithmetic shift of the bits; n - h and h are in [-88, 0] */
    uint32_t h = (ni >> 1) | (ni & 0x80000000u);
    uint32_t b1 = (h + 127u) << 23, b2 = (ni - h + 127u) << 23;
    memcpy(s1, &b1, sizeof *s1);
    memcpy(s2, &b2, sizeof *s2);
    return e;
}

/* f erfc(a) for a in [0, 11] (or NaN), a^2 = hi + lo, f = 1 or 1/2 */
static inline float erfc_core(float a, float hi, float lo, float f, float *e_out, float *s1, float *s2) {
    float t = 1.0f / fmaf(a, 0.5f, 1.0f); // t = 1 / (1 + a / 2)
    float p = QKV_ERFC_P10;
    p = fmaf(p, t, QKV_ERFC_P9);
    p = fmaf(p, t, QKV_ERFC_P8);
    p = fmaf(p, t, QKV_ERFC_P7);
    p = fmaf(p, t, QKV_ERFC_P6);
    p = fmaf(p, t, QKV_ERFC_P5);
    p = fmaf(p, t, QKV_ERFC_P4);
    p = fmaf(p, t, QKV_ERFC_P3);
    p = fmaf(p, t, QKV_ERFC_P2);
    p = fmaf(p, t, QKV_ERFC_P1);
    p = fmaf(p, t, QKV_ERFC_P0);
    float e = expneg(hi, lo, s1, s2);
    *e_out = e;
    return (((t * f) * p) * e * *s1) * *s2; // f erfc(a) = f t P(t) exp(-a^2)
}

/* the clamp of a NaN-preserving min / max: c < v ? c : v keeps a NaN v (as _mm256_min_ps(c, v) does) */
static inline float min_keep_nan(float c, float v) { return c < v ? c : v; }
static inline float max_keep_nan(float c, float v) { return c > v ? c : v; }

static void erfc_portable(const float *z, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float a = min_keep_nan(QKV_ERFC_CLAMP_F, fabsf(z[i]));
        float hi = a * a, lo = fmaf(a, a, -hi), e, s1, s2;
        float c = erfc_core(a, hi, lo, 1.0f, &e, &s1, &s2);
        out[i] = z[i] < 0.0f ? 2.0f - c : c; // erfc(-a) = 2 - erfc(a)
    }
}

static void erf_portable(const float *z, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = z[i], s = v * v;
        float q = QKV_ERF_Q6;
        q = fmaf(q, s, QKV_ERF_Q5);
        q = fmaf(q, s, QKV_ERF_Q4);
        q = fmaf(q, s, QKV_ERF_Q3);
        q = fmaf(q, s, QKV_ERF_Q2);
        q = fmaf(q, s, QKV_ERF_Q1);
        q = fmaf(q, s, QKV_ERF_Q0);
        float small = v * q; // erf(z) = z P2(z^2) for |z| < 1
        float a = min_keep_nan(QKV_ERFC_CLAMP_F, fabsf(v));
        float hi = a * a, lo = fmaf(a, a, -hi), e, s1, s2;
        float large = copysignf(1.0f - erfc_core(a, hi, lo, 1.0f, &e, &s1, &s2), v); // sign(z) (1 - erfc|z|)
        out[i] = fabsf(v) < 1.0f ? small : large;
    }
}

/* x clamped to [-15.6, 15.6] (NaN kept), a = |x| / sqrt 2, x^2 / 2 = hi + lo; returns Phi(x) */
static inline float phi_of(float v, float *xc_out, float *e, float *s1, float *s2) {
    float xc = min_keep_nan(QKV_GELU_CLAMP_F, max_keep_nan(-QKV_GELU_CLAMP_F, v));
    float a = fabsf(xc) * QKV_INV_SQRT2_F;
    float hx = xc * xc, hi = 0.5f * hx, lo = 0.5f * fmaf(xc, xc, -hx);
    float c = erfc_core(a, hi, lo, 0.5f, e, s1, s2); // c = erfc(|x| / sqrt 2) / 2
    *xc_out = xc;
    return v < 0.0f ? c : 1.0f - c;
}

static void gelu_erf_forward_portable(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float xc, e, s1, s2;
        y[i] = x[i] * phi_of(x[i], &xc, &e, &s1, &s2); // y = x Phi(x)
    }
}

static void gelu_erf_backward_portable(const float *x, const float *dy, float *dx, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float xc, e, s1, s2;
        float phi = phi_of(x[i], &xc, &e, &s1, &s2);
        float xpdf = (((xc * QKV_INV_SQRT2PI_F) * e) * s1) * s2; // x phi(x) = x exp(-x^2 / 2) / sqrt(2 pi)
        dx[i] = fmaf(dy[i], phi + xpdf, dx[i]);                   // dx += dy (Phi(x) + x phi(x))
    }
}

const qkv_gelu_kernel_set_ qkv_gelu_kernels_portable_ = {
    .name = "portable",
    .available = true,
    .erf_forward = gelu_erf_forward_portable,
    .erf_backward = gelu_erf_backward_portable,
    .erf = erf_portable,
    .erfc = erfc_portable,
};

const qkv_gelu_kernel_set_ *qkv_gelu_kernels_isa_(int isa) {
    if (isa == QKV_ISA_PORTABLE_) return &qkv_gelu_kernels_portable_;
    if (isa == QKV_ISA_AVX2_ && qkv_gelu_kernels_avx2_.available && qkv_isa_supported_(QKV_ISA_AVX2_))
        return &qkv_gelu_kernels_avx2_;
    return NULL;
}

const qkv_gelu_kernel_set_ *qkv_gelu_kernels_(void) {
    static const qkv_gelu_kernel_set_ *_Atomic best = NULL; /* decided once; a race repeats the same answer */
    const qkv_gelu_kernel_set_ *k = best;
    if (!k) {
        k = qkv_gelu_kernels_isa_(QKV_ISA_AVX2_);
        if (!k) k = &qkv_gelu_kernels_portable_;
        best = k;
    }
    return k;
}
