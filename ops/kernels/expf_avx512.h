/*
 * expf_avx512.h — e^x on 16 float lanes, inline, giving the bits of SLEEF's Sleef_expf16_u10avx512f (the 1-ulp
 * exp the AVX-512 kernels called before) for every one of the 2^32 inputs; include it only from a file compiled
 * with -mavx512f. expf_avx2.h's method and constants on twice the lanes (see there for the why and the maths):
 *   q = round(x / ln 2);  s = x - q ln 2 (two FMAs);  e^s ~ 1 + s + s^2 P(s);  e^x = e^s 2^(q >> 1) 2^(q - (q >> 1))
 *   x < -104: +0;  x > 100: +inf;  NaN: NaN.
 * tests/test_expf_avx2.c compares it with SLEEF bit for bit over a sample of all floats and every edge on a CPU
 * with AVX-512; the whole 2^32 was compared once when it was written.
 */
#ifndef QKV_EXPF_AVX512_H
#define QKV_EXPF_AVX512_H

#include <immintrin.h>

/* The bits hold only without contraction (expf_avx2.h). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* 2^e for e in [-126, 127], built from its exponent field. */
static inline __m512 qkv_pow2i16_avx512_(__m512i e) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(0x7f)), 23));
}

static inline __m512 qkv_expf16_avx512_(__m512 x) {
    const __m512 inv_ln2 = _mm512_set1_ps(1.442695040888963407359924681001892137426645954152985934135449406931f);
    const __m512 ln2_hi = _mm512_set1_ps(-0.693145751953125f), ln2_lo = _mm512_set1_ps(-1.428606765330187045e-06f);
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(x, inv_ln2)); // round(x / ln 2), ties to even
    __m512 qf = _mm512_cvtepi32_ps(q);
    __m512 s = _mm512_fmadd_ps(qf, ln2_hi, x); // s = x - q ln 2 in two steps
    s = _mm512_fmadd_ps(qf, ln2_lo, s);
    __m512 p = _mm512_set1_ps(0.000198527617612853646278381f); // P(s), Horner
    p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(0.00139304355252534151077271f));
    p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(0.00833336077630519866943359f));
    p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(0.0416664853692054748535156f));
    p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(0.166666671633720397949219f));
    p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(0.5f));
    __m512 u = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(_mm512_mul_ps(s, s), p, s)); // e^s = 1 + s + s^2 P
    __m512i half = _mm512_srai_epi32(q, 1);                                                     // 2^q in two factors
    u = _mm512_mul_ps(_mm512_mul_ps(u, qkv_pow2i16_avx512_(half)), qkv_pow2i16_avx512_(_mm512_sub_epi32(q, half)));
    u = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-104.0f), _CMP_NLT_UQ), u); // underflow: +0
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(_mm512_set1_ps(100.0f), x, _CMP_LT_OQ), u,
                                _mm512_set1_ps(__builtin_inff()));
}

#endif
