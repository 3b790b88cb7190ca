/*
 * layer_norm_avx2.c — the f32 layer-norm row kernels on AVX2, the operations of layer_norm_portable.c one
 * for one (the same bits: no FMA, the same lanes and order; layer_norm_kernels.h). The 16 lanes of a row
 * sum are two 8-float registers. Compiled with -mavx2 -mfma; without them it compiles to a set marked
 * unavailable.
 */
#include "layer_norm_kernels.h"

#if defined(__AVX2__) && defined(__FMA__)

#include "layer_norm_lanes.h"

static void layer_norm_forward_avx2(const float *x, const float *g, const float *b, float *y, int64_t rows,
                                    int64_t d, double eps, double *mean_out, double *rstd_out) {
    int64_t whole = d - d % 16, whole8 = d - d % 8;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        int64_t j;
        for (j = 0; j < whole; j += 16) {
            s0 = _mm256_add_ps(s0, _mm256_loadu_ps(xr + j));
            s1 = _mm256_add_ps(s1, _mm256_loadu_ps(xr + j + 8));
        }
        float t0 = qkv_ln_sum_tail_(xr, j, d), t1 = 0.0f, t2 = 0.0f;
        float m0 = (lanes_total8(s0, s1) + t0) / (float)d; // m0 = sum(x) / d
        __m256 m = _mm256_set1_ps(m0), c1a = _mm256_setzero_ps(), c1b = c1a, c2a = c1a, c2b = c1a;
        for (j = 0; j < whole; j += 16) {
            __m256 ca = _mm256_sub_ps(_mm256_loadu_ps(xr + j), m), cb = _mm256_sub_ps(_mm256_loadu_ps(xr + j + 8), m);
            c1a = _mm256_add_ps(c1a, ca); // s1 = sum(x - m0)
            c1b = _mm256_add_ps(c1b, cb);
            c2a = _mm256_add_ps(c2a, _mm256_mul_ps(ca, ca)); // s2 = sum((x - m0)^2)
            c2b = _mm256_add_ps(c2b, _mm256_mul_ps(cb, cb));
        }
        qkv_ln_centred_tail_(xr, m0, j, d, &t1, &t2);
        double mean, rstd;
        qkv_layer_norm_stats_(m0, lanes_total8(c1a, c1b) + t1, lanes_total8(c2a, c2b) + t2, d, eps, &mean, &rstd);
        float hi = (float)mean, lo = (float)(mean - (double)hi), rs = (float)rstd;
        __m256 vh = _mm256_set1_ps(hi), vl = _mm256_set1_ps(lo), vr = _mm256_set1_ps(rs);
        for (j = 0; j < whole8; j += 8) { // y = (x - mean) rstd gamma + beta
            __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + j), vh), vl), vr);
            _mm256_storeu_ps(yr + j, _mm256_add_ps(_mm256_mul_ps(v, _mm256_loadu_ps(g + j)), _mm256_loadu_ps(b + j)));
        }
        qkv_ln_y_tail_(xr, g, b, hi, lo, rs, j, d, yr);
        mean_out[r] = mean;
        rstd_out[r] = rstd;
    }
}

static void layer_norm_backward_avx2(const float *x, const float *g, const float *dy, const double *mean,
                                     const double *rstd, int64_t rows, int64_t d, float *dx, double *dg, double *db,
                                     float *gb, float *bb) {
    int64_t whole = d - d % 16, whole8 = d - d % 8;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *dyr = dy + r * d;
        float hi = (float)mean[r], lo = (float)(mean[r] - (double)hi), rs = (float)rstd[r];
        __m256 vh = _mm256_set1_ps(hi), vl = _mm256_set1_ps(lo), vr = _mm256_set1_ps(rs);
        qkv_ln_start_blocks_(r, d, gb, bb, dg, db);
        int64_t j;
        if (dx) {
            // pass 1: a = sum(dxh) / d, c = sum(dxh xhat) / d; dy xhat and dy into the blocks
            __m256 sa[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, sc[2] = {sa[0], sa[0]};
            for (j = 0; j < whole; j += 16)
                for (int h = 0; h < 2; h++) {
                    int64_t i = j + 8 * h;
                    __m256 dyv = _mm256_loadu_ps(dyr + i);
                    __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + i), vh), vl), vr);
                    __m256 dxh = _mm256_mul_ps(dyv, _mm256_loadu_ps(g + i)); // dxh = dy gamma
                    sa[h] = _mm256_add_ps(sa[h], dxh);
                    sc[h] = _mm256_add_ps(sc[h], _mm256_mul_ps(dxh, xh));
                    _mm256_storeu_ps(gb + i, _mm256_add_ps(_mm256_loadu_ps(gb + i), _mm256_mul_ps(dyv, xh)));
                    _mm256_storeu_ps(bb + i, _mm256_add_ps(_mm256_loadu_ps(bb + i), dyv));
                }
            float ta = 0.0f, tc = 0.0f;
            qkv_ln_pass1_tail_(xr, dyr, g, hi, lo, rs, j, d, &ta, &tc, gb, bb);
            float a = (lanes_total8(sa[0], sa[1]) + ta) / (float)d, c = (lanes_total8(sc[0], sc[1]) + tc) / (float)d;
            // pass 2: dx += rstd ((dxh - a) - xhat c)
            float *dxr = dx + r * d;
            __m256 va = _mm256_set1_ps(a), vc = _mm256_set1_ps(c);
            for (j = 0; j < whole8; j += 8) {
                __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + j), vh), vl), vr);
                __m256 dxh = _mm256_mul_ps(_mm256_loadu_ps(dyr + j), _mm256_loadu_ps(g + j));
                __m256 t = _mm256_mul_ps(vr, _mm256_sub_ps(_mm256_sub_ps(dxh, va), _mm256_mul_ps(xh, vc)));
                _mm256_storeu_ps(dxr + j, _mm256_add_ps(_mm256_loadu_ps(dxr + j), t));
            }
            qkv_ln_pass2_tail_(xr, dyr, g, hi, lo, rs, a, c, j, d, dxr);
        } else {
            for (j = 0; j < whole8; j += 8) {
                __m256 dyv = _mm256_loadu_ps(dyr + j);
                __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + j), vh), vl), vr);
                _mm256_storeu_ps(gb + j, _mm256_add_ps(_mm256_loadu_ps(gb + j), _mm256_mul_ps(dyv, xh)));
                _mm256_storeu_ps(bb + j, _mm256_add_ps(_mm256_loadu_ps(bb + j), dyv));
            }
            qkv_ln_blocks_tail_(xr, dyr, hi, lo, rs, j, d, gb, bb);
        }
        qkv_ln_fold_blocks_(r, rows, d, gb, bb, dg, db);
    }
}

const qkv_layer_norm_kernel_set_ qkv_layer_norm_kernels_avx2_ = {
    .name = "avx2",
    .available = true,
    .forward = layer_norm_forward_avx2,
    .backward = layer_norm_backward_avx2,
};

#else

const qkv_layer_norm_kernel_set_ qkv_layer_norm_kernels_avx2_ = {.name = "avx2", .available = false};

#endif
