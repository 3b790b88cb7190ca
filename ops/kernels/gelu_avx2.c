/*
 * gelu_avx2.c — the f32 exact-GELU kernels and erf / erfc on AVX2+FMA, 8 lanes: gelu_simd.h with the
 * AVX2 operations below (the same bits as gelu_portable.c). Compiled with -mavx2 -mfma; without them it
 * compiles to a set marked unavailable.
 */
#include "gelu_kernels.h"

#include <stddef.h>

#if defined(__AVX2__) && defined(__FMA__)

#include <immintrin.h>

#define W 8
#define V_F __m256
#define V_I __m256i
#define V_M __m256 /* a comparison's all-ones / all-zeros lanes */
#define V_SET1(f) _mm256_set1_ps(f)
#define V_SET1I(i) _mm256_set1_epi32(i)
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps(p, v)
#define V_ADD(a, b) _mm256_add_ps(a, b)
#define V_SUB(a, b) _mm256_sub_ps(a, b)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
#define V_DIV(a, b) _mm256_div_ps(a, b)
#define V_MIN(a, b) _mm256_min_ps(a, b)
#define V_MAX(a, b) _mm256_max_ps(a, b)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_FMS(a, b, c) _mm256_fmsub_ps(a, b, c)
#define V_AND(a, b) _mm256_and_ps(a, b)
#define V_OR(a, b) _mm256_or_ps(a, b)
#define V_XOR(a, b) _mm256_xor_ps(a, b)
#define V_ANDNOT(a, b) _mm256_andnot_ps(a, b)
#define V_ADDI(a, b) _mm256_add_epi32(a, b)
#define V_SUBI(a, b) _mm256_sub_epi32(a, b)
#define V_SRAI(v, k) _mm256_srai_epi32(v, k)
#define V_SLLI(v, k) _mm256_slli_epi32(v, k)
#define V_AS_I(v) _mm256_castps_si256(v)
#define V_AS_F(v) _mm256_castsi256_ps(v)
#define V_LT(a, b) _mm256_cmp_ps(a, b, _CMP_LT_OQ)
#define V_GT(a, b) _mm256_cmp_ps(a, b, _CMP_GT_OQ)
#define V_BLEND(a, b, m) _mm256_blendv_ps(a, b, m)
#define V_ALL(m) (_mm256_movemask_ps(m) == 0xFF)
#define V_COLUMN(i) (i) /* vpermps reads the low 3 bits only */
#define V_PERMUTE8(row, col) _mm256_permutevar8x32_ps(_mm256_loadu_ps(row), col)
#define SIMD_NAME(f) f##_avx2
#define SIMD_SET qkv_gelu_kernels_avx2_
#define SIMD_SET_NAME "avx2"

#include "gelu_simd.h"

#else

const qkv_gelu_kernel_set_ qkv_gelu_kernels_avx2_ = {.name = "avx2", .available = false};

#endif
