/*
 * logf_avx2.h — ln x on 8 float lanes, inline, giving the bits of SLEEF's Sleef_logf8_u10avx2 (the 1-ulp log the
 * AVX2 maps called before) for every one of the 2^32 inputs; include it only from a file compiled with -mavx2
 * -mfma. Why: as expf_avx2.h, the call into libsleef could be neither inlined nor overlapped with its loop.
 *
 * The method is SLEEF's, in "double-float" arithmetic (a value as an unevaluated sum hi + lo of two floats):
 *   x < FLT_MIN: x 2^64 first (and e - 64 below), so that the subnormals reduce like the normals
 *   e = the exponent of x / 0.75,  m = x 2^-e in [0.75, 1.5)
 *   y = (m - 1) / (m + 1) in double-float;  ln x = e ln 2 + 2 y + y^3 P(y^2), P of degree 2 (FMAs)
 *   ln 2 as the pair 0.69314718246459960938 - 1.904654323148236017e-09;  the sum hi + lo rounded last
 *   +inf: +inf;  x < 0 or NaN: NaN;  +-0: -inf.
 * tests/test_expf_avx2.c compares it with SLEEF bit for bit over a sample of all floats and every edge; the
 * whole 2^32 was compared once when it was written (15 s). Forward + backward of qkv_log on [4096, 256]: 2.0 to
 * 1.7 ms (bench/ops --only log, 3 runs each).
 */
#ifndef QKV_LOGF_AVX2_H
#define QKV_LOGF_AVX2_H

#include <float.h>
#include <immintrin.h>

/* The bits hold only without contraction: a multiply and an add fused into one FMA round once, not twice. The
 * library is C17, in which GCC does not contract (-ffp-contract=off); clang is told here. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* a double-float: the value hi + lo */
typedef struct qkv_df8_ {
    __m256 hi, lo;
} qkv_df8_;

// x + y exactly, as hi + lo (no order of magnitude assumed)
static inline qkv_df8_ qkv_df8_add2_ff_(__m256 x, __m256 y) {
    __m256 s = _mm256_add_ps(x, y), v = _mm256_sub_ps(s, x);
    return (qkv_df8_){s, _mm256_add_ps(_mm256_sub_ps(x, _mm256_sub_ps(s, v)), _mm256_sub_ps(y, v))};
}

// x + y for |x| >= |y|
static inline qkv_df8_ qkv_df8_add_dd_(qkv_df8_ x, qkv_df8_ y) {
    __m256 s = _mm256_add_ps(x.hi, y.hi);
    return (qkv_df8_){s, _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_sub_ps(x.hi, s), y.hi), x.lo), y.lo)};
}

// x + y for |x| >= |y|, y a float
static inline qkv_df8_ qkv_df8_add_df_(qkv_df8_ x, __m256 y) {
    __m256 s = _mm256_add_ps(x.hi, y);
    return (qkv_df8_){s, _mm256_add_ps(_mm256_add_ps(_mm256_sub_ps(x.hi, s), y), x.lo)};
}

// x y, x a double-float, y a float (FMAs recover the product's low part)
static inline qkv_df8_ qkv_df8_mul_df_(qkv_df8_ x, __m256 y) {
    __m256 s = _mm256_mul_ps(x.hi, y);
    return (qkv_df8_){s, _mm256_fmadd_ps(x.lo, y, _mm256_fmsub_ps(x.hi, y, s))};
}

// n / d, both double-floats: one float division, then FMA corrections
static inline qkv_df8_ qkv_df8_div_dd_(qkv_df8_ n, qkv_df8_ d) {
    __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), d.hi);
    __m256 s = _mm256_mul_ps(n.hi, t);
    __m256 u = _mm256_fmsub_ps(t, n.hi, s);
    __m256 v = _mm256_fnmadd_ps(d.lo, t, _mm256_fnmadd_ps(d.hi, t, _mm256_set1_ps(1.0f)));
    return (qkv_df8_){s, _mm256_fmadd_ps(s, v, _mm256_fmadd_ps(n.lo, t, u))};
}

static inline __m256 qkv_logf8_avx2_(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(FLT_MIN), _CMP_LT_OQ); // subnormal (or 0, or < 0)
    __m256 d = _mm256_blendv_ps(x, _mm256_mul_ps(x, _mm256_set1_ps(18446744073709551616.0f)), tiny); // x 2^64
    // e = the exponent field of d / 0.75, unbiased;  m = d 2^-e
    __m256i e = _mm256_sub_epi32(
        _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(_mm256_mul_ps(d, _mm256_set1_ps(1.0f / 0.75f))), 23),
                         _mm256_set1_epi32(0xff)),
        _mm256_set1_epi32(0x7f));
    __m256 m = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(d), _mm256_slli_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), e), 23)));
    e = _mm256_blendv_epi8(e, _mm256_sub_epi32(e, _mm256_set1_epi32(64)), _mm256_castps_si256(tiny));
    // s = e ln 2 as a double-float
    qkv_df8_ s = qkv_df8_mul_df_((qkv_df8_){_mm256_set1_ps(0.69314718246459960938f), _mm256_set1_ps(-1.904654323148236017e-09f)},
                                 _mm256_cvtepi32_ps(e));
    // y = (m - 1) / (m + 1);  ln x = s + 2 y + y^3 P(y^2)
    qkv_df8_ y = qkv_df8_div_dd_(qkv_df8_add2_ff_(_mm256_set1_ps(-1.0f), m), qkv_df8_add2_ff_(one, m));
    __m256 y2 = _mm256_mul_ps(y.hi, y.hi);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(0.3027294874f), y2, _mm256_set1_ps(0.3996108174f));
    p = _mm256_fmadd_ps(p, y2, _mm256_set1_ps(0.6666694880f));
    s = qkv_df8_add_dd_(s, (qkv_df8_){_mm256_mul_ps(y.hi, _mm256_set1_ps(2.0f)), _mm256_mul_ps(y.lo, _mm256_set1_ps(2.0f))});
    s = qkv_df8_add_df_(s, _mm256_mul_ps(_mm256_mul_ps(y2, y.hi), p));
    __m256 r = _mm256_add_ps(s.hi, s.lo);
    // edges: +inf at +inf;  NaN below 0 and at NaN;  -inf at +-0
    r = _mm256_blendv_ps(r, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(x, _mm256_set1_ps(__builtin_inff()), _CMP_EQ_OQ));
    __m256 bad = _mm256_or_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_ps(r, _mm256_set1_ps(__builtin_nanf("")), bad);
    return _mm256_blendv_ps(r, _mm256_set1_ps(-__builtin_inff()), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_EQ_OQ));
}

#endif
