/*
 * unary_avx2.c — the f32 maps of unary_kernels.h on AVX2, 8 lanes, with SLEEF's 1-ulp float functions
 * (unary_simd.h). Compiled with -mavx2 -mfma; without them or SLEEF it compiles to a set marked unavailable.
 */
#include "unary_kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(QKV_HAVE_SLEEF)

#include <immintrin.h>
#include <sleef.h>

#include "expf_avx2.h"

#define W 8
#define V_F __m256
#define V_SET1(f) _mm256_set1_ps(f)
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps(p, v)
#define V_ADD(a, b) _mm256_add_ps(a, b)
#define V_DIV(a, b) _mm256_div_ps(a, b)
#define V_MAX(a, b) _mm256_max_ps(a, b)
#define S_EXP(x) qkv_expf8_avx2_(x) /* SLEEF's Sleef_expf8_u10avx2, inline (expf_avx2.h) */
#define S_LOG(x) Sleef_logf8_u10avx2(x)
#define S_TANH(x) Sleef_tanhf8_u10avx2(x)
#define S_TANH_FAST(x) Sleef_tanhf8_u35avx2(x)
#define S_LOG1P(x) Sleef_log1pf8_u10avx2(x)
#define S_POW(x, p) Sleef_powf8_u10avx2(x, p)
#define V_ABS(x) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x)
#define V_NEG(x) _mm256_xor_ps(_mm256_set1_ps(-0.0f), x)
#define V_GE_SELECT(x, a, b) _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ))

#include "unary_simd.h"

const qkv_unary_kernel_set_ qkv_unary_kernels_avx2_ = {.name = "avx2", .available = true, .map = map_simd};

#else

const qkv_unary_kernel_set_ qkv_unary_kernels_avx2_ = {.name = "avx2", .available = false, .map = 0};

#endif
