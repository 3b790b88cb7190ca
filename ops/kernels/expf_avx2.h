/*
 * expf_avx2.h — e^x on 8 float lanes, inline, giving the bits of SLEEF's Sleef_expf8_u10avx2 (the 1-ulp exp
 * the AVX2 kernels called before) for every one of the 2^32 inputs; include it only from a file compiled with
 * -mavx2 -mfma.
 *
 * Why: the call into libsleef cannot be inlined, so each vector of exps paid a call, and the loops around it
 * could not overlap one exp's chain of FMAs with the next one's. Inline, the same arithmetic runs 1.3-2x
 * faster in the kernels that are mostly exp (bench/ops exp and sigmoid, the softmax rows).
 *
 * The method is SLEEF's (Cody-Waite reduction, a degree-5 polynomial in FMAs, 2^q in two halves):
 *   q = round(x / ln 2) (to nearest even);  s = x - q ln 2, with ln 2 split in two parts (two FMAs, exact q ln 2_hi)
 *   e^s ~ 1 + s + s^2 P(s), P of degree 5 (Horner in FMAs)
 *   e^x = e^s 2^(q >> 1) 2^(q - (q >> 1))   (two factors, so that q in [-150, 145] needs no subnormal 2^q)
 *   x < -104: +0;  x > 100: +inf;  NaN: NaN.
 * tests/test_elementwise.c compares it with SLEEF bit for bit over a sample of all floats and every edge;
 * the whole 2^32 was compared once when it was written (a loop of 15 s, not kept in the suite).
 */
#ifndef QKV_EXPF_AVX2_H
#define QKV_EXPF_AVX2_H

#include <immintrin.h>

/* The bits hold only without contraction: a multiply and an add fused into one FMA round once, not twice. The
 * library is C17, in which GCC does not contract (-ffp-contract=off); clang is told here. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* 2^e for e in [-126, 127], built from its exponent field. */
static inline __m256 qkv_pow2i8_avx2_(__m256i e) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(0x7f)), 23));
}

static inline __m256 qkv_expf8_avx2_(__m256 x) {
    const __m256 inv_ln2 = _mm256_set1_ps(1.442695040888963407359924681001892137426645954152985934135449406931f);
    const __m256 ln2_hi = _mm256_set1_ps(-0.693145751953125f), ln2_lo = _mm256_set1_ps(-1.428606765330187045e-06f);
    __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(x, inv_ln2)); // round(x / ln 2), ties to even
    __m256 qf = _mm256_cvtepi32_ps(q);
    __m256 s = _mm256_fmadd_ps(qf, ln2_hi, x); // s = x - q ln 2 in two steps
    s = _mm256_fmadd_ps(qf, ln2_lo, s);
    __m256 p = _mm256_set1_ps(0.000198527617612853646278381f); // P(s), Horner
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(0.00139304355252534151077271f));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(0.00833336077630519866943359f));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(0.0416664853692054748535156f));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(0.166666671633720397949219f));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(0.5f));
    __m256 u = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_mul_ps(s, s), p, s)); // e^s = 1 + s + s^2 P
    __m256i half = _mm256_srai_epi32(q, 1);                                                     // 2^q in two factors
    u = _mm256_mul_ps(_mm256_mul_ps(u, qkv_pow2i8_avx2_(half)), qkv_pow2i8_avx2_(_mm256_sub_epi32(q, half)));
    u = _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-104.0f), _CMP_LT_OQ), u); // underflow: +0
    return _mm256_blendv_ps(u, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(_mm256_set1_ps(100.0f), x, _CMP_LT_OQ));
}

#endif
