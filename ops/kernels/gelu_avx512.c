/*
 * gelu_avx512.c — the f32 exact-GELU kernels and erf / erfc on AVX-512F, 16 lanes: gelu_simd.h with the
 * AVX-512F operations below (the same bits as gelu_portable.c and gelu_avx2.c). AVX-512F alone has no
 * bitwise float operations (those are AVX-512DQ), so they go through the integer ones; comparisons give a
 * 16-bit mask. Compiled with -mavx512f -mavx2 -mfma; without them it compiles to a set marked unavailable.
 */
#include "gelu_kernels.h"

#include <stddef.h>

/* QKV_EMULATE_AVX512: the test-only build through SIMDe (tests/avx512_emulation.h), no -mavx512f */
#if (defined(__AVX512F__) || defined(QKV_EMULATE_AVX512)) && defined(__FMA__)

#include <immintrin.h>

#define W 16
#define V_F __m512
#define V_I __m512i
#define V_M __mmask16
#define V_SET1(f) _mm512_set1_ps(f)
#define V_SET1I(i) _mm512_set1_epi32(i)
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps(p, v)
#define V_ADD(a, b) _mm512_add_ps(a, b)
#define V_SUB(a, b) _mm512_sub_ps(a, b)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_DIV(a, b) _mm512_div_ps(a, b)
#define V_MIN(a, b) _mm512_min_ps(a, b)
#define V_MAX(a, b) _mm512_max_ps(a, b)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_FMS(a, b, c) _mm512_fmsub_ps(a, b, c)
#define V_BITS(op, a, b) _mm512_castsi512_ps(op(_mm512_castps_si512(a), _mm512_castps_si512(b)))
#define V_AND(a, b) V_BITS(_mm512_and_si512, a, b)
#define V_OR(a, b) V_BITS(_mm512_or_si512, a, b)
#define V_XOR(a, b) V_BITS(_mm512_xor_si512, a, b)
#define V_ANDNOT(a, b) V_BITS(_mm512_andnot_si512, a, b)
#define V_ADDI(a, b) _mm512_add_epi32(a, b)
#define V_SUBI(a, b) _mm512_sub_epi32(a, b)
#define V_SRAI(v, k) _mm512_srai_epi32(v, k)
#define V_SLLI(v, k) _mm512_slli_epi32(v, k)
#define V_AS_I(v) _mm512_castps_si512(v)
#define V_AS_F(v) _mm512_castsi512_ps(v)
#define V_LT(a, b) _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ)
#define V_GT(a, b) _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ)
#define V_BLEND(a, b, m) _mm512_mask_blend_ps(m, a, b)
#define V_ALL(m) ((m) == (__mmask16)0xFFFF)
/* vpermps on 16 lanes reads the index's low 4 bits: masked to 3 once, so lane i takes row[col & 7] from the 8
 * floats loaded into the low half (the high half is never read) */
#define V_COLUMN(i) _mm512_and_si512(i, _mm512_set1_epi32(7))
#define V_PERMUTE8(row, col) _mm512_permutexvar_ps(col, _mm512_castps256_ps512(_mm256_loadu_ps(row)))
#define SIMD_NAME(f) f##_avx512
#define SIMD_SET qkv_gelu_kernels_avx512_
#define SIMD_SET_NAME "avx512"

#include "gelu_simd.h"

#else

const qkv_gelu_kernel_set_ qkv_gelu_kernels_avx512_ = {.name = "avx512", .available = false};

#endif
