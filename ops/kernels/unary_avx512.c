/*
 * unary_avx512.c — the f32 maps of unary_kernels.h on AVX512, 16 lanes, with SLEEF's 1-ulp float functions
 * (unary_simd.h). Compiled with -mavx512f; without them or SLEEF it compiles to a set marked unavailable.
 */
#include "unary_kernels.h"

#if defined(__AVX512F__) && defined(QKV_HAVE_SLEEF)

#include <immintrin.h>
#include <sleef.h>

#define W 16
#define V_F __m512
#define V_SET1(f) _mm512_set1_ps(f)
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps(p, v)
#define V_ADD(a, b) _mm512_add_ps(a, b)
#define V_DIV(a, b) _mm512_div_ps(a, b)
#define V_MAX(a, b) _mm512_max_ps(a, b)
#define S_EXP(x) Sleef_expf16_u10avx512f(x)
#define S_LOG(x) Sleef_logf16_u10avx512f(x)
#define S_TANH(x) Sleef_tanhf16_u10avx512f(x)
#define S_TANH_FAST(x) Sleef_tanhf16_u35avx512f(x)
#define S_LOG1P(x) Sleef_log1pf16_u10avx512f(x)
#define S_POW(x, p) Sleef_powf16_u10avx512f(x, p)
#define V_ABS(x) _mm512_abs_ps(x)
#define V_NEG(x) _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)))
#define V_GE_SELECT(x, a, b) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ), b, a)
#define V_EQ_SELECT(x, c, a, b) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, c, _CMP_EQ_OQ), b, a)
#define V_SQRT(x) _mm512_sqrt_ps(x)

#include "unary_simd.h"

const qkv_unary_kernel_set_ qkv_unary_kernels_avx512_ = {.name = "avx512", .available = true, .map = map_simd};

#else

const qkv_unary_kernel_set_ qkv_unary_kernels_avx512_ = {.name = "avx512", .available = false, .map = 0};

#endif
