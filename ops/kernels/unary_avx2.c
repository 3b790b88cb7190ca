/*
 * unary_avx2.c — the f32 maps of unary_kernels.h on AVX2, 8 lanes, with SLEEF's 1-ulp float functions
 * (unary_simd.h). Compiled with -mavx2 -mfma; without them or SLEEF it compiles to a set marked unavailable.
 */
#include "unary_kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(QKV_HAVE_SLEEF)

#include <immintrin.h>
#include <sleef.h>

#include "expf_avx2.h"
#include "logf_avx2.h"

#define W 8
#define V_F __m256
#define V_SET1(f) _mm256_set1_ps(f)
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps(p, v)
#define V_ADD(a, b) _mm256_add_ps(a, b)
#define V_DIV(a, b) _mm256_div_ps(a, b)
#define V_MAX(a, b) _mm256_max_ps(a, b)
#define S_EXP(x) qkv_expf8_avx2_(x) /* SLEEF's Sleef_expf8_u10avx2, inline (expf_avx2.h) */
#define S_LOG(x) qkv_logf8_avx2_(x) /* SLEEF's Sleef_logf8_u10avx2, inline (logf_avx2.h) */
#define S_TANH(x) Sleef_tanhf8_u10avx2(x)
#define S_TANH_FAST(x) Sleef_tanhf8_u35avx2(x)
#define S_LOG1P(x) Sleef_log1pf8_u10avx2(x)
#define S_POW(x, p) Sleef_powf8_u10avx2(x, p)
#define V_ABS(x) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x)
#define V_NEG(x) _mm256_xor_ps(_mm256_set1_ps(-0.0f), x)
#define V_GE_SELECT(x, a, b) _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ))
#define V_EQ_SELECT(x, c, a, b) _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, c, _CMP_EQ_OQ))
#define V_SQRT(x) _mm256_sqrt_ps(x)

#include "unary_simd.h"

/* The lanes of e^(x[i..i+8) - shift) below left (0 in the others: a partial last vector reads shift there, and
 * its exps are zeroed), added to acc_lo (lanes 0-3) and acc_hi (4-7) as sum8_f32 adds them (adding +0 to a sum of
 * exps changes nothing). */
static inline void exp_sum_step(__m256d *acc_lo, __m256d *acc_hi, const float *x, __m256 shift, int64_t left) {
    __m256 v;
    if (left >= W) {
        v = V_LOAD(x);
    } else {
        float in[W];
        for (int k = 0; k < W; k++) in[k] = k < left ? x[k] : shift[0];
        v = V_LOAD(in);
    }
    __m256 e = S_EXP(V_MAX(_mm256_set1_ps(-104.0f), _mm256_sub_ps(v, shift)));
    if (left < W) {
        float out[W];
        V_STORE(out, e);
        for (int k = (int)left; k < W; k++) out[k] = 0.0f;
        e = V_LOAD(out);
    }
    *acc_lo = _mm256_add_pd(*acc_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    *acc_hi = _mm256_add_pd(*acc_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
}

/* sum8_f32's last step: the 8 lanes added pairwise */
static inline double lanes_sum(__m256d lo, __m256d hi) {
    double a[8];
    _mm256_storeu_pd(a, lo);
    _mm256_storeu_pd(a + 4, hi);
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* unary_kernels.h's exp_sum2: the two rows' steps interleaved, each its own chain of additions */
static void exp_sum2_avx2(const float *x0, float shift0, const float *x1, float shift1, int64_t n, double sums[2]) {
    const __m256 s0 = _mm256_set1_ps(shift0), s1 = _mm256_set1_ps(shift1);
    __m256d lo0 = _mm256_setzero_pd(), hi0 = _mm256_setzero_pd(), lo1 = _mm256_setzero_pd(), hi1 = _mm256_setzero_pd();
    for (int64_t i = 0; i < n; i += W) {
        exp_sum_step(&lo0, &hi0, x0 + i, s0, n - i);
        exp_sum_step(&lo1, &hi1, x1 + i, s1, n - i);
    }
    sums[0] = lanes_sum(lo0, hi0);
    sums[1] = lanes_sum(lo1, hi1);
}

const qkv_unary_kernel_set_ qkv_unary_kernels_avx2_ = {
    .name = "avx2", .available = true, .map = map_simd, .exp_sum2 = exp_sum2_avx2};

#else

const qkv_unary_kernel_set_ qkv_unary_kernels_avx2_ = {.name = "avx2", .available = false, .map = 0};

#endif
