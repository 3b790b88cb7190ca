/*
 * expf_avx512.h — e^x on 16 float lanes, inline, giving the bits of SLEEF's Sleef_expf16_u10avx512f (the 1-ulp
 * exp the AVX-512 kernels called before) for every one of the 2^32 inputs; include it only from a file compiled
 * with -mavx512f. The method, written once for every width: expf_simd.h; why inline: expf_avx2.h.
 * tests/test_expf_avx2.c compares it with SLEEF bit for bit over a sample of all floats and every edge on a CPU
 * with AVX-512; the whole 2^32 was compared once when it was written.
 */
#ifndef QKV_EXPF_AVX512_H
#define QKV_EXPF_AVX512_H

#include <immintrin.h>

#define EXPF_NAME qkv_expf16_avx512_
#define EXPF_POW2I qkv_pow2i16_avx512_
#define EXPF_VF __m512
#define EXPF_VI __m512i
#define EXPF_SET1(f) _mm512_set1_ps(f)
#define EXPF_SET1_I(i) _mm512_set1_epi32(i)
#define EXPF_MUL(a, b) _mm512_mul_ps(a, b)
#define EXPF_ADD(a, b) _mm512_add_ps(a, b)
#define EXPF_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define EXPF_CVT_I(x) _mm512_cvtps_epi32(x)
#define EXPF_CVT_F(i) _mm512_cvtepi32_ps(i)
#define EXPF_ADD_I(a, b) _mm512_add_epi32(a, b)
#define EXPF_SUB_I(a, b) _mm512_sub_epi32(a, b)
#define EXPF_SRAI(i, n) _mm512_srai_epi32(i, n)
#define EXPF_SLLI(i, n) _mm512_slli_epi32(i, n)
#define EXPF_AS_F(i) _mm512_castsi512_ps(i)
#define EXPF_ZERO_BELOW(x, c, u) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, c, _CMP_NLT_UQ), u)
#define EXPF_INF_ABOVE(x, c, u) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(c, x, _CMP_LT_OQ), u, _mm512_set1_ps(__builtin_inff()))
#include "expf_simd.h"
#include "expf_simd_undef.h"

#endif
