/*
 * layer_norm_avx512.c — the f32 layer-norm row kernels on AVX-512F, the operations of layer_norm_portable.c
 * one for one (the same bits: no FMA, the same lanes and order; layer_norm_kernels.h). The 16 lanes of a row
 * sum are one 16-float register; the elementwise passes go 16 at a time, then the shared scalar tails of
 * layer_norm_kernels.h (each element sees the same operations either way). Compiled with -mavx512f -mavx2 -mfma; without them it compiles to a
 * set marked unavailable.
 */
#include "layer_norm_kernels.h"

/* QKV_EMULATE_AVX512: the test-only build through SIMDe (tests/avx512_emulation.h), no -mavx512f */
#if (defined(__AVX512F__) || defined(QKV_EMULATE_AVX512)) && defined(__FMA__)

#include "layer_norm_lanes.h"

/* lanes_total8 of the two halves (AVX-512F has no 8-float extract: through the f64 one) */
static inline float lanes_total16(__m512 v) {
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return lanes_total8(_mm512_castps512_ps256(v), hi);
}

/* xhat = ((x - hi) - lo) rstd, 16 lanes */
static inline __m512 xhat16(const float *x, __m512 vh, __m512 vl, __m512 vr) {
    return _mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(_mm512_loadu_ps(x), vh), vl), vr);
}

static void layer_norm_forward_avx512(const float *x, const float *g, const float *b, float *y, int64_t rows,
                                      int64_t d, double eps, double *mean_out, double *rstd_out) {
    int64_t whole = d - d % 16;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        __m512 s = _mm512_setzero_ps();
        int64_t j;
        for (j = 0; j < whole; j += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(xr + j));
        float t0 = qkv_ln_sum_tail_(xr, j, d), t1 = 0.0f, t2 = 0.0f;
        float m0 = (lanes_total16(s) + t0) / (float)d; // m0 = sum(x) / d
        __m512 m = _mm512_set1_ps(m0), c1 = _mm512_setzero_ps(), c2 = c1;
        for (j = 0; j < whole; j += 16) {
            __m512 c = _mm512_sub_ps(_mm512_loadu_ps(xr + j), m);
            c1 = _mm512_add_ps(c1, c);                    // s1 = sum(x - m0)
            c2 = _mm512_add_ps(c2, _mm512_mul_ps(c, c)); // s2 = sum((x - m0)^2)
        }
        qkv_ln_centred_tail_(xr, m0, j, d, &t1, &t2);
        double mean, rstd;
        qkv_layer_norm_stats_(m0, lanes_total16(c1) + t1, lanes_total16(c2) + t2, d, eps, &mean, &rstd);
        float hi = (float)mean, lo = (float)(mean - (double)hi), rs = (float)rstd;
        __m512 vh = _mm512_set1_ps(hi), vl = _mm512_set1_ps(lo), vr = _mm512_set1_ps(rs);
        for (j = 0; j < whole; j += 16) { // y = (x - mean) rstd gamma + beta
            __m512 v = xhat16(xr + j, vh, vl, vr);
            _mm512_storeu_ps(yr + j, _mm512_add_ps(_mm512_mul_ps(v, _mm512_loadu_ps(g + j)), _mm512_loadu_ps(b + j)));
        }
        qkv_ln_y_tail_(xr, g, b, hi, lo, rs, j, d, yr);
        mean_out[r] = mean;
        rstd_out[r] = rstd;
    }
}

static void layer_norm_backward_avx512(const float *x, const float *g, const float *dy, const double *mean,
                                       const double *rstd, int64_t rows, int64_t d, float *dx, double *dg,
                                       double *db, float *gb, float *bb) {
    int64_t whole = d - d % 16;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *dyr = dy + r * d;
        float hi = (float)mean[r], lo = (float)(mean[r] - (double)hi), rs = (float)rstd[r];
        __m512 vh = _mm512_set1_ps(hi), vl = _mm512_set1_ps(lo), vr = _mm512_set1_ps(rs);
        qkv_ln_start_blocks_(r, d, gb, bb, dg, db);
        int64_t j;
        if (dx) {
            // pass 1: a = sum(dxh) / d, c = sum(dxh xhat) / d; dy xhat and dy into the blocks
            __m512 sa = _mm512_setzero_ps(), sc = sa;
            for (j = 0; j < whole; j += 16) {
                __m512 dyv = _mm512_loadu_ps(dyr + j), xh = xhat16(xr + j, vh, vl, vr);
                __m512 dxh = _mm512_mul_ps(dyv, _mm512_loadu_ps(g + j)); // dxh = dy gamma
                sa = _mm512_add_ps(sa, dxh);
                sc = _mm512_add_ps(sc, _mm512_mul_ps(dxh, xh));
                _mm512_storeu_ps(gb + j, _mm512_add_ps(_mm512_loadu_ps(gb + j), _mm512_mul_ps(dyv, xh)));
                _mm512_storeu_ps(bb + j, _mm512_add_ps(_mm512_loadu_ps(bb + j), dyv));
            }
            float ta = 0.0f, tc = 0.0f;
            qkv_ln_pass1_tail_(xr, dyr, g, hi, lo, rs, j, d, &ta, &tc, gb, bb);
            float a = (lanes_total16(sa) + ta) / (float)d, c = (lanes_total16(sc) + tc) / (float)d;
            // pass 2: dx += rstd ((dxh - a) - xhat c)
            float *dxr = dx + r * d;
            __m512 va = _mm512_set1_ps(a), vc = _mm512_set1_ps(c);
            for (j = 0; j < whole; j += 16) {
                __m512 xh = xhat16(xr + j, vh, vl, vr);
                __m512 dxh = _mm512_mul_ps(_mm512_loadu_ps(dyr + j), _mm512_loadu_ps(g + j));
                __m512 t = _mm512_mul_ps(vr, _mm512_sub_ps(_mm512_sub_ps(dxh, va), _mm512_mul_ps(xh, vc)));
                _mm512_storeu_ps(dxr + j, _mm512_add_ps(_mm512_loadu_ps(dxr + j), t));
            }
            qkv_ln_pass2_tail_(xr, dyr, g, hi, lo, rs, a, c, j, d, dxr);
        } else {
            for (j = 0; j < whole; j += 16) {
                __m512 dyv = _mm512_loadu_ps(dyr + j), xh = xhat16(xr + j, vh, vl, vr);
                _mm512_storeu_ps(gb + j, _mm512_add_ps(_mm512_loadu_ps(gb + j), _mm512_mul_ps(dyv, xh)));
                _mm512_storeu_ps(bb + j, _mm512_add_ps(_mm512_loadu_ps(bb + j), dyv));
            }
            qkv_ln_blocks_tail_(xr, dyr, hi, lo, rs, j, d, gb, bb);
        }
        qkv_ln_fold_blocks_(r, rows, d, gb, bb, dg, db);
    }
}

const qkv_layer_norm_kernel_set_ qkv_layer_norm_kernels_avx512_ = {
    .name = "avx512",
    .available = true,
    .forward = layer_norm_forward_avx512,
    .backward = layer_norm_backward_avx512,
};

#else

const qkv_layer_norm_kernel_set_ qkv_layer_norm_kernels_avx512_ = {.name = "avx512", .available = false};

#endif
