/*
 * gelu_avx2.c — the f32 exact-GELU kernels and erf / erfc on AVX2+FMA, 8 lanes, the operations of
 * gelu_portable.c one for one (the same bits; the maths and the bounds: gelu_kernels.h). Compiled with
 * -mavx2 -mfma; without them it compiles to a set marked unavailable. The tail of fewer than 8 elements
 * goes through a zero-padded 8-float buffer (no masked loads: AMD's vmaskmovps is slow).
 */
#include "gelu_kernels.h"

#include <stddef.h>

#if defined(__AVX2__) && defined(__FMA__)

#include <immintrin.h>
#include <string.h>

#define W 8

typedef struct exp_parts {
    __m256 e, s1, s2;
} exp_parts;

/* exp(-hi - lo) = e 2^h 2^(n-h) (expneg in gelu_portable.c) */
static inline exp_parts expneg8(__m256 hi, __m256 lo) {
    const __m256 magic = _mm256_set1_ps(QKV_ROUND_MAGIC_F);
    __m256 neg_hi = _mm256_xor_ps(hi, _mm256_set1_ps(-0.0f)); /* -hi, as the C negation */
    __m256 tn = _mm256_fmadd_ps(neg_hi, _mm256_set1_ps(QKV_LOG2E_F), magic);
    __m256i ni = _mm256_sub_epi32(_mm256_castps_si256(tn), _mm256_castps_si256(magic));
    __m256 n = _mm256_sub_ps(tn, magic);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-QKV_LN2_HI_F), neg_hi);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-QKV_LN2_LO_F), r);
    r = _mm256_sub_ps(r, lo);
    __m256 q = _mm256_set1_ps(QKV_EXP_E5);
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(QKV_EXP_E4));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(QKV_EXP_E3));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(QKV_EXP_E2));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(QKV_EXP_E1));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(QKV_EXP_E0));
    exp_parts out;
    out.e = _mm256_add_ps(_mm256_fmadd_ps(q, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i h = _mm256_srai_epi32(ni, 1), bias = _mm256_set1_epi32(127);
    out.s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, bias), 23));
    out.s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), bias), 23));
    return out;
}

/* f erfc(a) (erfc_core in gelu_portable.c) */
static inline __m256 erfc_core8(__m256 a, __m256 hi, __m256 lo, __m256 f, exp_parts *x) {
    __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(a, _mm256_set1_ps(0.5f), _mm256_set1_ps(1.0f)));
    __m256 p = _mm256_set1_ps(QKV_ERFC_P10);
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(QKV_ERFC_P9));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(QKV_ERFC_P8));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(QKV_ERFC_P7));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(QKV_ERFC_P6));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(QKV_ERFC_P5));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(QKV_ERFC_P4));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(QKV_ERFC_P3));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(QKV_ERFC_P2));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(QKV_ERFC_P1));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(QKV_ERFC_P0));
    *x = expneg8(hi, lo);
    __m256 m = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(t, f), p), x->e);
    return _mm256_mul_ps(_mm256_mul_ps(m, x->s1), x->s2);
}

static inline __m256 abs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

static inline __m256 erfc8(__m256 z) {
    __m256 a = _mm256_min_ps(_mm256_set1_ps(QKV_ERFC_CLAMP_F), abs8(z));
    __m256 hi = _mm256_mul_ps(a, a), lo = _mm256_fmsub_ps(a, a, hi);
    exp_parts x;
    __m256 c = erfc_core8(a, hi, lo, _mm256_set1_ps(1.0f), &x);
    __m256 neg = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
    return _mm256_blendv_ps(c, _mm256_sub_ps(_mm256_set1_ps(2.0f), c), neg);
}

static inline __m256 erf8(__m256 v) {
    __m256 s = _mm256_mul_ps(v, v);
    __m256 q = _mm256_set1_ps(QKV_ERF_Q6);
    q = _mm256_fmadd_ps(q, s, _mm256_set1_ps(QKV_ERF_Q5));
    q = _mm256_fmadd_ps(q, s, _mm256_set1_ps(QKV_ERF_Q4));
    q = _mm256_fmadd_ps(q, s, _mm256_set1_ps(QKV_ERF_Q3));
    q = _mm256_fmadd_ps(q, s, _mm256_set1_ps(QKV_ERF_Q2));
    q = _mm256_fmadd_ps(q, s, _mm256_set1_ps(QKV_ERF_Q1));
    q = _mm256_fmadd_ps(q, s, _mm256_set1_ps(QKV_ERF_Q0));
    __m256 small = _mm256_mul_ps(v, q);
    __m256 av = abs8(v), a = _mm256_min_ps(_mm256_set1_ps(QKV_ERFC_CLAMP_F), av);
    __m256 hi = _mm256_mul_ps(a, a), lo = _mm256_fmsub_ps(a, a, hi);
    exp_parts x;
    __m256 one_minus = _mm256_sub_ps(_mm256_set1_ps(1.0f), erfc_core8(a, hi, lo, _mm256_set1_ps(1.0f), &x));
    __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
    __m256 large = _mm256_or_ps(abs8(one_minus), sign); // copysign(1 - erfc|z|, z)
    return _mm256_blendv_ps(large, small, _mm256_cmp_ps(av, _mm256_set1_ps(1.0f), _CMP_LT_OQ));
}

/* Phi(x) (phi_of in gelu_portable.c); *xc: x clamped to [-15.6, 15.6] */
static inline __m256 phi8(__m256 v, __m256 *xc_out, exp_parts *x) {
    const __m256 cl = _mm256_set1_ps(QKV_GELU_CLAMP_F);
    __m256 xc = _mm256_min_ps(cl, _mm256_max_ps(_mm256_set1_ps(-QKV_GELU_CLAMP_F), v));
    __m256 a = _mm256_mul_ps(abs8(xc), _mm256_set1_ps(QKV_INV_SQRT2_F));
    __m256 half = _mm256_set1_ps(0.5f), hx = _mm256_mul_ps(xc, xc);
    __m256 hi = _mm256_mul_ps(half, hx), lo = _mm256_mul_ps(half, _mm256_fmsub_ps(xc, xc, hx));
    __m256 c = erfc_core8(a, hi, lo, half, x);
    *xc_out = xc;
    __m256 neg = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ);
    return _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), c), c, neg);
}

/* The polynomial path (poly_u and horner_col in gelu_portable.c): u = min(x, 6) - k, k = round(min(x, 4));
 * *col: the float 1.5 2^23 + k, whose low 3 bits (k mod 8) vpermps reads as the column. */
static inline __m256 poly_u8(__m256 v, __m256i *col) {
    const __m256 magic = _mm256_set1_ps(QKV_ROUND_MAGIC_F);
    __m256 km = _mm256_add_ps(_mm256_min_ps(_mm256_set1_ps(4.0f), v), magic);
    *col = _mm256_castps_si256(km);
    return _mm256_sub_ps(_mm256_min_ps(_mm256_set1_ps(6.0f), v), _mm256_sub_ps(km, magic));
}

#define COEF(c, j, col) _mm256_permutevar8x32_ps(_mm256_loadu_ps((c)[j]), col)

static inline __m256 phi_poly8(__m256 v) {
    __m256i col;
    __m256 u = poly_u8(v, &col), p = COEF(qkv_gelu_phi_c_, 8, col);
    p = _mm256_fmadd_ps(p, u, COEF(qkv_gelu_phi_c_, 7, col));
    p = _mm256_fmadd_ps(p, u, COEF(qkv_gelu_phi_c_, 6, col));
    p = _mm256_fmadd_ps(p, u, COEF(qkv_gelu_phi_c_, 5, col));
    p = _mm256_fmadd_ps(p, u, COEF(qkv_gelu_phi_c_, 4, col));
    p = _mm256_fmadd_ps(p, u, COEF(qkv_gelu_phi_c_, 3, col));
    p = _mm256_fmadd_ps(p, u, COEF(qkv_gelu_phi_c_, 2, col));
    p = _mm256_fmadd_ps(p, u, COEF(qkv_gelu_phi_c_, 1, col));
    return _mm256_fmadd_ps(p, u, COEF(qkv_gelu_phi_c_, 0, col)); // Phi(x), x > -3
}

static inline __m256 dphi_poly8(__m256 v) {
    __m256i col;
    __m256 u = poly_u8(v, &col), p = COEF(qkv_gelu_dphi_c_, 7, col);
    p = _mm256_fmadd_ps(p, u, COEF(qkv_gelu_dphi_c_, 6, col));
    p = _mm256_fmadd_ps(p, u, COEF(qkv_gelu_dphi_c_, 5, col));
    p = _mm256_fmadd_ps(p, u, COEF(qkv_gelu_dphi_c_, 4, col));
    p = _mm256_fmadd_ps(p, u, COEF(qkv_gelu_dphi_c_, 3, col));
    p = _mm256_fmadd_ps(p, u, COEF(qkv_gelu_dphi_c_, 2, col));
    p = _mm256_fmadd_ps(p, u, COEF(qkv_gelu_dphi_c_, 1, col));
    return _mm256_fmadd_ps(p, u, COEF(qkv_gelu_dphi_c_, 0, col)); // Phi(x) + x phi(x), x > -3
}

/* lanes with x > -3 (false for NaN) */
static inline __m256 poly_lanes(__m256 v) { return _mm256_cmp_ps(v, _mm256_set1_ps(-3.0f), _CMP_GT_OQ); }

static inline __m256 gelu8(__m256 v) {
    __m256 y = _mm256_mul_ps(v, phi_poly8(v)); // y = x Phi(x)
    __m256 ok = poly_lanes(v);
    if (_mm256_movemask_ps(ok) != 0xFF) { /* a lane of the erfc path */
        __m256 xc;
        exp_parts x;
        y = _mm256_blendv_ps(_mm256_mul_ps(v, phi8(v, &xc, &x)), y, ok);
    }
    return y;
}

/* dy/dx = Phi(x) + x phi(x) */
static inline __m256 gelu_grad8(__m256 v) {
    __m256 g = dphi_poly8(v);
    __m256 ok = poly_lanes(v);
    if (_mm256_movemask_ps(ok) != 0xFF) {
        __m256 xc;
        exp_parts x;
        __m256 phi = phi8(v, &xc, &x);
        __m256 xpdf = _mm256_mul_ps(
            _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(xc, _mm256_set1_ps(QKV_INV_SQRT2PI_F)), x.e), x.s1),
            x.s2); // x phi(x)
        g = _mm256_blendv_ps(_mm256_add_ps(phi, xpdf), g, ok);
    }
    return g;
}

/* out = f(in) over n floats, 8 at a time, the tail through a padded buffer */
#define UNARY_LOOP(name, f)                                                                                  \
    static void name(const float *in, float *out, int64_t n) {                                             \
        int64_t i = 0;                                                                                      \
        for (; i + W <= n; i += W) _mm256_storeu_ps(out + i, f(_mm256_loadu_ps(in + i)));                  \
        if (i < n) {                                                                                        \
            float buf[W] = {0};                                                                             \
            memcpy(buf, in + i, (size_t)(n - i) * sizeof *buf);                                             \
            _mm256_storeu_ps(buf, f(_mm256_loadu_ps(buf)));                                                 \
            memcpy(out + i, buf, (size_t)(n - i) * sizeof *buf);                                            \
        }                                                                                                   \
    }

UNARY_LOOP(erf_avx2, erf8)
UNARY_LOOP(erfc_avx2, erfc8)
UNARY_LOOP(gelu_erf_forward_avx2, gelu8)

/* dx = dy (Phi(x) + x phi(x)) (+ dx when add) */
static void gelu_erf_backward_avx2(const float *x, const float *dy, float *dx, int64_t n, bool add) {
    int64_t i = 0;
    if (add)
        for (; i + W <= n; i += W)
            _mm256_storeu_ps(dx + i, _mm256_fmadd_ps(_mm256_loadu_ps(dy + i), gelu_grad8(_mm256_loadu_ps(x + i)),
                                                     _mm256_loadu_ps(dx + i))); // dx += dy g
    else
        for (; i + W <= n; i += W)
            _mm256_storeu_ps(dx + i, _mm256_mul_ps(_mm256_loadu_ps(dy + i),
                                                   gelu_grad8(_mm256_loadu_ps(x + i)))); // dx = dy g
    if (i < n) {
        float bx[W] = {0}, bdy[W] = {0}, bdx[W] = {0};
        size_t left = (size_t)(n - i) * sizeof(float);
        memcpy(bx, x + i, left);
        memcpy(bdy, dy + i, left);
        if (add) memcpy(bdx, dx + i, left);
        __m256 g = gelu_grad8(_mm256_loadu_ps(bx)), d = _mm256_loadu_ps(bdy);
        _mm256_storeu_ps(bdx, add ? _mm256_fmadd_ps(d, g, _mm256_loadu_ps(bdx)) : _mm256_mul_ps(d, g));
        memcpy(dx + i, bdx, left);
    }
}

const qkv_gelu_kernel_set_ qkv_gelu_kernels_avx2_ = {
    .name = "avx2",
    .available = true,
    .erf_forward = gelu_erf_forward_avx2,
    .erf_backward = gelu_erf_backward_avx2,
    .erf = erf_avx2,
    .erfc = erfc_avx2,
};

#else

const qkv_gelu_kernel_set_ qkv_gelu_kernels_avx2_ = {.name = "avx2", .available = false};

#endif
