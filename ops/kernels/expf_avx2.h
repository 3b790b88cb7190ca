/*
 * expf_avx2.h — e^x on 8 float lanes, inline, giving the bits of SLEEF's Sleef_expf8_u10avx2 (the 1-ulp exp
 * the AVX2 kernels called before) for every one of the 2^32 inputs; include it only from a file compiled with
 * -mavx2 -mfma. The method, written once for every width: expf_simd.h.
 *
 * Why: the call into libsleef cannot be inlined, so each vector of exps paid a call, and the loops around it
 * could not overlap one exp's chain of FMAs with the next one's. Inline, the same arithmetic runs 1.3-2x
 * faster in the kernels that are mostly exp (bench/ops exp and sigmoid, the softmax rows).
 * tests/test_expf_avx2.c compares it with SLEEF bit for bit over a sample of all floats and every edge;
 * the whole 2^32 was compared once when it was written (a loop of 15 s, not kept in the suite).
 */
#ifndef QKV_EXPF_AVX2_H
#define QKV_EXPF_AVX2_H

#include <immintrin.h>

#define EXPF_NAME qkv_expf8_avx2_
#define EXPF_POW2I qkv_pow2i8_avx2_
#define EXPF_VF __m256
#define EXPF_VI __m256i
#define EXPF_SET1(f) _mm256_set1_ps(f)
#define EXPF_SET1_I(i) _mm256_set1_epi32(i)
#define EXPF_MUL(a, b) _mm256_mul_ps(a, b)
#define EXPF_ADD(a, b) _mm256_add_ps(a, b)
#define EXPF_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define EXPF_CVT_I(x) _mm256_cvtps_epi32(x)
#define EXPF_CVT_F(i) _mm256_cvtepi32_ps(i)
#define EXPF_ADD_I(a, b) _mm256_add_epi32(a, b)
#define EXPF_SUB_I(a, b) _mm256_sub_epi32(a, b)
#define EXPF_SRAI(i, n) _mm256_srai_epi32(i, n)
#define EXPF_SLLI(i, n) _mm256_slli_epi32(i, n)
#define EXPF_AS_F(i) _mm256_castsi256_ps(i)
#define EXPF_ZERO_BELOW(x, c, u) _mm256_andnot_ps(_mm256_cmp_ps(x, c, _CMP_LT_OQ), u)
#define EXPF_INF_ABOVE(x, c, u) _mm256_blendv_ps(u, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(c, x, _CMP_LT_OQ))
#include "expf_simd.h"
#include "expf_simd_undef.h"

#endif
