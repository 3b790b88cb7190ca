/*
 * layer_norm_kernels.h — the f32 row kernels of layer normalisation (ops/layer_norm.c), one set per
 * instruction set: layer_norm_portable.c (plain C), layer_norm_avx2.c (AVX2, 8 lanes) and layer_norm_avx512.c
 * (AVX-512F, 16 lanes). All do the same operations in the same order (no fused multiply-add in any), so the
 * sets give the same bits.
 * The maths (two-pass f32 mean, the split mean, the fused backward): ops/layer_norm.c.
 *
 * Row sums: 16 f32 lanes, lane k summing elements j = k mod 16 of the whole blocks of 16 (two 8-float
 * registers in AVX2), the lanes added as ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7)) with
 * t_k = lane_k + lane_(k+8), then the d % 16 last elements, summed apart in order, added last.
 */
#ifndef QKV_LAYER_NORM_KERNELS_H
#define QKV_LAYER_NORM_KERNELS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

/* dgamma and dbeta are summed in f32 over blocks of this many rows, each block then added in double */
#define QKV_NORM_BLOCK 16

typedef struct qkv_layer_norm_kernel_set_ {
    const char *name;
    bool available; /* compiled with its ISA flags */
    /* x, y [rows, d]; g, b [d] (never NULL: ones and zeros stand in); mean[r], rstd[r] out */
    void (*forward)(const float *x, const float *g, const float *b, float *y, int64_t rows, int64_t d, double eps,
                    double *mean, double *rstd);
    /* dx += (may be NULL), dg and db += (d doubles, either may be NULL); gb and bb: d-float scratch rows */
    void (*backward)(const float *x, const float *g, const float *dy, const double *mean, const double *rstd,
                     int64_t rows, int64_t d, float *dx, double *dg, double *db, float *gb, float *bb);
} qkv_layer_norm_kernel_set_;

extern const qkv_layer_norm_kernel_set_ qkv_layer_norm_kernels_portable_;
extern const qkv_layer_norm_kernel_set_ qkv_layer_norm_kernels_avx2_;
extern const qkv_layer_norm_kernel_set_ qkv_layer_norm_kernels_avx512_;

/* The set this CPU runs (decided once). */
const qkv_layer_norm_kernel_set_ *qkv_layer_norm_kernels_(void);
/* The set of one ISA (QKV_ISA_PORTABLE_, QKV_ISA_AVX2_, QKV_ISA_AVX512_), or NULL when not compiled in or not
 * supported. */
const qkv_layer_norm_kernel_set_ *qkv_layer_norm_kernels_isa_(int isa);

/* The per-row scalars from the f32 sums (the same double arithmetic in every set):
 *   mean = m0 + s1 / d,  var = s2 / d - (s1 / d)^2 (>= 0),  rstd = 1 / sqrt(var + eps) */
static inline void qkv_layer_norm_stats_(float m0, float s1, float s2, int64_t d, double eps, double *mean,
                                         double *rstd) {
    double dm = (double)s1 / (double)d, var = (double)s2 / (double)d - dm * dm;
    *mean = (double)m0 + dm;
    *rstd = 1.0 / sqrt((var > 0.0 ? var : 0.0) + eps);
}

/* The scalar steps every set takes, the tails past its vectors included (its vector loops do the same per
 * element), with xhat = ((x - hi) - lo) rstd, mean = hi + lo. Forward, from j0:
 *   the sum of x;  t1 += x - m0, t2 += (x - m0)^2;  y = xhat gamma + beta */
static inline float qkv_ln_sum_tail_(const float *xr, int64_t j0, int64_t d) {
    float t = 0.0f;
    for (int64_t j = j0; j < d; j++) t += xr[j];
    return t;
}

static inline void qkv_ln_centred_tail_(const float *xr, float m0, int64_t j0, int64_t d, float *t1, float *t2) {
    for (int64_t j = j0; j < d; j++) {
        float c = xr[j] - m0;
        *t1 += c;     // s1 = sum(x - m0)
        *t2 += c * c; // s2 = sum((x - m0)^2)
    }
}

static inline void qkv_ln_y_tail_(const float *xr, const float *g, const float *b, float hi, float lo, float rs,
                                  int64_t j0, int64_t d, float *yr) {
    for (int64_t j = j0; j < d; j++) yr[j] = ((xr[j] - hi) - lo) * rs * g[j] + b[j]; // y = (x - mean) rstd g + b
}

/* Backward, at row r: a new block of QKV_NORM_BLOCK rows starts with gb = bb = 0 (when dg or db is wanted) */
static inline void qkv_ln_start_blocks_(int64_t r, int64_t d, float *gb, float *bb, const double *dg,
                                        const double *db) {
    if ((dg || db) && r % QKV_NORM_BLOCK == 0)
        for (int64_t j = 0; j < d; j++) gb[j] = 0.0f, bb[j] = 0.0f;
}

/*   pass 1 from j0: ta += dy gamma, tc += dy gamma xhat, gb += dy xhat, bb += dy */
static inline void qkv_ln_pass1_tail_(const float *xr, const float *dyr, const float *g, float hi, float lo, float rs,
                                      int64_t j0, int64_t d, float *ta, float *tc, float *gb, float *bb) {
    for (int64_t j = j0; j < d; j++) {
        float xh = ((xr[j] - hi) - lo) * rs, dxh = dyr[j] * g[j];
        *ta += dxh;
        *tc += dxh * xh;
        gb[j] += dyr[j] * xh;
        bb[j] += dyr[j];
    }
}

/*   pass 2 from j0: dx += rstd ((dy gamma - a) - xhat c) */
static inline void qkv_ln_pass2_tail_(const float *xr, const float *dyr, const float *g, float hi, float lo, float rs,
                                      float a, float c, int64_t j0, int64_t d, float *dxr) {
    for (int64_t j = j0; j < d; j++) {
        float xh = ((xr[j] - hi) - lo) * rs, dxh = dyr[j] * g[j];
        dxr[j] += rs * ((dxh - a) - xh * c);
    }
}

/*   no dx, from j0: gb += dy xhat, bb += dy */
static inline void qkv_ln_blocks_tail_(const float *xr, const float *dyr, float hi, float lo, float rs, int64_t j0,
                                       int64_t d, float *gb, float *bb) {
    for (int64_t j = j0; j < d; j++) {
        float xh = ((xr[j] - hi) - lo) * rs;
        gb[j] += dyr[j] * xh; // dgamma += dy xhat
        bb[j] += dyr[j];      // dbeta += dy
    }
}

/*   after row r: a block of QKV_NORM_BLOCK rows (or the last rows) added into dg and db in double */
static inline void qkv_ln_fold_blocks_(int64_t r, int64_t rows, int64_t d, const float *gb, const float *bb,
                                       double *dg, double *db) {
    if (!(dg || db) || !(r % QKV_NORM_BLOCK == QKV_NORM_BLOCK - 1 || r == rows - 1)) return;
    if (dg)
        for (int64_t j = 0; j < d; j++) dg[j] += (double)gb[j];
    if (db)
        for (int64_t j = 0; j < d; j++) db[j] += (double)bb[j];
}

#endif
