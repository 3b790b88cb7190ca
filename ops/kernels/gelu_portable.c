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

/* The polynomial path (x > -3): k = round(min(x, 4)) by the 1.5 2^23 trick, its low 3 bits the piece's
 * column in the tables; u = min(x, 6) - k (exact). Returns c[deg](u) by Horner, one fmaf a step. */
static inline float poly_u(float v, uint32_t *col) {
    float km = min_keep_nan(4.0f, v) + QKV_ROUND_MAGIC_F; // 1.5 2^23 + round(min(x, 4))
    uint32_t b;
    memcpy(&b, &km, sizeof b);
    *col = b & 7u; /* k mod 8 */
    return min_keep_nan(6.0f, v) - (km - QKV_ROUND_MAGIC_F); // u = min(x, 6) - k
}

static inline float horner_col(const float (*c)[8], int deg, uint32_t col, float u) {
    float p = c[deg][col];
    for (int j = deg - 1; j >= 0; j--) p = fmaf(p, u, c[j][col]);
    return p;
}

/* the coefficient tables (ops/kernels/gelu_fit.py; the worst error of each piece in its comment) */
/* PHI piece k = -3 (-3.0, -2.5): worst 1.17 ulp at x = -2.51575 */
/* PHI piece k = -2 (-2.5, -1.5): worst 4.07 ulp at x = -2.49975 */
/* PHI piece k = -1 (-1.5, -0.5): worst 1.25 ulp at x = -1.4805 */
/* PHI piece k =  0 (-0.5, 0.5): worst 0.75 ulp at x = -0.49375 */
/* PHI piece k =  1 (0.5, 1.5): worst 1.06 ulp at x = 0.5555 */
/* PHI piece k =  2 (1.5, 2.5): worst 0.64 ulp at x = 2.34625 */
/* PHI piece k =  3 (2.5, 3.5): worst 0.97 ulp at x = 2.943 */
/* PHI piece k =  4 (3.5, 6.0): worst 1.14 ulp at x = 3.76625 */
const float qkv_gelu_phi_c_[QKV_GELU_PHI_DEG + 1][8] = {
    {0.5f, 0.841344774f, 0.977249861f, 0.998650074f, 0.99996835f, 0.00134989806f, 0.0227501318f, 0.158655256f},
    {0.398942262f, 0.241970733f, 0.0539909601f, 0.00443184935f, 0.000133733774f, 0.00443184841f, 0.0539909638f, 0.241970733f},
    {4.27717097e-08f, -0.120985374f, -0.0539909676f, -0.00664777122f, -0.000267381867f, 0.00664777309f, 0.0539910048f, 0.120985299f},
    {-0.0664895922f, -6.16777243e-07f, 0.0269957408f, 0.00590908993f, 0.000335686113f, 0.00590912579f, 0.0269956607f, -5.43778754e-07f},
    {-8.54307132e-07f, 0.0201644301f, -0.00449921563f, -0.00332392054f, -0.000292819663f, 0.00332393078f, 0.00449843332f, -0.0201629736f},
    {0.00996201299f, -0.00402393099f, -0.00225334521f, 0.00110856828f, 0.000180612027f, 0.00110779493f, -0.00225270283f, -0.00402451586f},
    {5.46277715e-06f, -0.0020175972f, 0.00134939584f, -0.000110457506f, -7.48639141e-05f, 0.000110866f, -0.00134421268f, 0.00200820388f},
    {-0.0011246904f, 0.000720160024f, -9.77446107e-05f, -8.7731336e-05f, 1.84105938e-05f, -8.2868326e-05f, -9.92295754e-05f, 0.00072149979f},
    {-1.09187304e-05f, 0.000121667363f, -0.000113370581f, 4.21419318e-05f, -1.99805072e-06f, -4.86438112e-05f, 0.000102749073f, -0.000102773854f},
};
/* DPHI piece k = -3 (-3.0, -2.5): worst 0.78 ulp at x = -2.75738 */
/* DPHI piece k = -2 (-2.5, -1.5): worst 2.09 ulp at x = -2.46425 */
/* DPHI piece k = -1 (-1.5, -0.5): worst 0.65 ulp at x = -1.305 */
/* DPHI piece k =  0 (-0.5, 0.5): worst 0.57 ulp at x = -0.4955 */
/* DPHI piece k =  1 (0.5, 1.5): worst 0.44 ulp at x = 1.4425 */
/* DPHI piece k =  2 (1.5, 2.5): worst 0.44 ulp at x = 2.1665 */
/* DPHI piece k =  3 (2.5, 3.5): worst 0.43 ulp at x = 2.64925 */
/* DPHI piece k =  4 (3.5, 6.0): worst 1.38 ulp at x = 4.105 */
const float qkv_gelu_dphi_c_[QKV_GELU_DPHI_DEG + 1][8] = {
    {0.5f, 1.08331549f, 1.08523178f, 1.01194561f, 1.00050342f, -0.0119456472f, -0.0852318108f, -0.0833154619f},
    {0.797884345f, 0.241970927f, -0.107982032f, -0.03102291f, -0.00187444827f, -0.0310229473f, -0.107981905f, 0.241970837f},
    {2.77972163e-07f, -0.362955034f, -1.49118091e-06f, 0.0332397446f, 0.00321561587f, -0.0332384408f, 1.44834257e-06f, 0.362955004f},
    {-0.265951723f, 0.0806478336f, 0.0719922706f, -0.0162513517f, -0.00329288468f, -0.0162574202f, 0.071988292f, 0.0806507543f},
    {-3.4427369e-06f, 0.080634445f, -0.0449624546f, -1.76771227e-05f, 0.00215296983f, 6.04965935e-05f, 0.0449629016f, -0.0806341171f},
    {0.0597087741f, -0.036181625f, 0.00264559872f, 0.00466893567f, -0.000883746659f, 0.00438789325f, 0.0026775531f, -0.0362059996f},
    {1.02559707e-05f, -0.00858962163f, 0.00760738971f, -0.00243558898f, 0.000206934055f, 0.00317265396f, -0.00760856457f, 0.00858870614f},
    {-0.00883018598f, 0.00656204531f, -0.00252758549f, 0.0002953535f, -2.09789505e-05f, -0.000339548715f, -0.00260080886f, 0.00661928812f},
};

static void gelu_erf_forward_portable(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], xc, e, s1, s2;
        if (v > -3.0f) {
            uint32_t col;
            float u = poly_u(v, &col);
            y[i] = v * horner_col(qkv_gelu_phi_c_, QKV_GELU_PHI_DEG, col, u); // y = x Phi(x)
        } else
            y[i] = v * phi_of(v, &xc, &e, &s1, &s2); // y = x Phi(x), Phi from exp and erfc
    }
}

/* dx = dy (Phi(x) + x phi(x)) (+ dx when add) */
static void gelu_erf_backward_portable(const float *x, const float *dy, float *dx, int64_t n, bool add) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], xc, e, s1, s2, g;
        if (v > -3.0f) {
            uint32_t col;
            float u = poly_u(v, &col);
            g = horner_col(qkv_gelu_dphi_c_, QKV_GELU_DPHI_DEG, col, u); // dy/dx = Phi(x) + x phi(x), x > -3
        } else {
            float phi = phi_of(v, &xc, &e, &s1, &s2);
            float xpdf = (((xc * QKV_INV_SQRT2PI_F) * e) * s1) * s2; // x phi(x) = x exp(-x^2 / 2) / sqrt(2 pi)
            g = phi + xpdf;
        }
        dx[i] = add ? fmaf(dy[i], g, dx[i]) : dy[i] * g; // dx (+)= dy (Phi(x) + x phi(x))
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
    if (isa == QKV_ISA_AVX512_ && qkv_gelu_kernels_avx512_.available && qkv_isa_supported_(QKV_ISA_AVX512_))
        return &qkv_gelu_kernels_avx512_;
    return NULL;
}

const qkv_gelu_kernel_set_ *qkv_gelu_kernels_(void) {
    static const qkv_gelu_kernel_set_ *_Atomic best = NULL; /* decided once; a race repeats the same answer */
    const qkv_gelu_kernel_set_ *k = best;
    if (!k) {
        k = qkv_gelu_kernels_isa_(QKV_ISA_AVX512_);
        if (!k) k = qkv_gelu_kernels_isa_(QKV_ISA_AVX2_);
        if (!k) k = &qkv_gelu_kernels_portable_;
        best = k;
    }
    return k;
}
