/*
 * unary_avx512.c — the f32 maps of unary_kernels.h on AVX512, 16 lanes, with SLEEF's 1-ulp float functions
 * (unary_simd.h). Compiled with -mavx512f; without them or SLEEF it compiles to a set marked unavailable.
 */
#include "unary_kernels.h"

#if defined(__AVX512F__) && defined(QKV_HAVE_SLEEF)

#include <immintrin.h>
#include <sleef.h>

#include "expf_avx512.h"

#define W 16
#define V_F __m512
#define V_SET1(f) _mm512_set1_ps(f)
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps(p, v)
#define V_ADD(a, b) _mm512_add_ps(a, b)
#define V_DIV(a, b) _mm512_div_ps(a, b)
#define V_MAX(a, b) _mm512_max_ps(a, b)
#define S_EXP(x) qkv_expf16_avx512_(x) /* SLEEF's Sleef_expf16_u10avx512f, inline (expf_avx512.h) */
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

/* The live lanes of e^(x[i..i+16) - shift), 0 in the others (a partial last vector), added to acc as sum8_f32 adds
 * them: the low half, elements i .. i+7, then the high half, i+8 .. i+15, so lane k adds element i + k before
 * i + 8 + k, as sum8_f32's lane k does (adding +0 to a sum of exps changes nothing). */
static inline __m512d exp_sum_step(__m512d acc, const float *x, __m512 shift, __mmask16 live) {
    __m512 v = _mm512_sub_ps(_mm512_mask_loadu_ps(shift, live, x), shift);
    __m512 e = _mm512_maskz_mov_ps(live, S_EXP(V_MAX(_mm512_set1_ps(-104.0f), v)));
    acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    return _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
}

/* sum8_f32's last step: the 8 lanes added pairwise */
static inline double lanes_sum(__m512d acc) {
    double a[8];
    _mm512_storeu_pd(a, acc);
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* unary_kernels.h's exp_sum2: the two rows' steps interleaved, each its own chain of additions */
static void exp_sum2_avx512(const float *x0, float shift0, const float *x1, float shift1, int64_t n, double sums[2]) {
    const __m512 s0 = _mm512_set1_ps(shift0), s1 = _mm512_set1_ps(shift1);
    __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += W) {
        __mmask16 live = n - i >= W ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        acc0 = exp_sum_step(acc0, x0 + i, s0, live);
        acc1 = exp_sum_step(acc1, x1 + i, s1, live);
    }
    sums[0] = lanes_sum(acc0);
    sums[1] = lanes_sum(acc1);
}

const qkv_unary_kernel_set_ qkv_unary_kernels_avx512_ = {
    .name = "avx512", .available = true, .map = map_simd, .exp_sum2 = exp_sum2_avx512};

#else

const qkv_unary_kernel_set_ qkv_unary_kernels_avx512_ = {.name = "avx512", .available = false, .map = 0};

#endif
