/*
 * layer_norm_portable.c — the f32 layer-norm row kernels in plain C (the reference for layer_norm_avx2.c and
 * layer_norm_avx512.c, which give the same bits), and the choice of the set the CPU runs. Lanes and order:
 * layer_norm_kernels.h; the maths: ops/layer_norm.c.
 */
#include "qkv_internal.h"

#include "layer_norm_kernels.h"

#define LN_LANES 16

/* the 16 lanes added in the fixed order of layer_norm_kernels.h */
static inline float lanes_total(const float *acc) {
    float t[8];
    for (int k = 0; k < 8; k++) t[k] = acc[k] + acc[k + 8];
    return ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
}

static void layer_norm_forward_portable(const float *restrict x, const float *restrict g, const float *restrict b,
                                        float *restrict y, int64_t rows, int64_t d, double eps, double *mean_out,
                                        double *rstd_out) {
    int64_t whole = d - d % LN_LANES;
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict xr = x + r * d;
        float *restrict yr = y + r * d;
        float acc[LN_LANES] = {0}, a1[LN_LANES] = {0}, a2[LN_LANES] = {0}, t0 = 0.0f, t1 = 0.0f, t2 = 0.0f;
        int64_t j;
        for (j = 0; j < whole; j += LN_LANES)
            for (int k = 0; k < LN_LANES; k++) acc[k] += xr[j + k];
        t0 = qkv_ln_sum_tail_(xr, j, d);
        float m0 = (lanes_total(acc) + t0) / (float)d; // m0 = sum(x) / d, a first guess
        for (j = 0; j < whole; j += LN_LANES)
            for (int k = 0; k < LN_LANES; k++) {
                float c = xr[j + k] - m0;
                a1[k] += c;     // s1 = sum(x - m0)
                a2[k] += c * c; // s2 = sum((x - m0)^2)
            }
        qkv_ln_centred_tail_(xr, m0, j, d, &t1, &t2);
        double mean, rstd;
        qkv_layer_norm_stats_(m0, lanes_total(a1) + t1, lanes_total(a2) + t2, d, eps, &mean, &rstd);
        float hi = (float)mean, lo = (float)(mean - (double)hi), rs = (float)rstd; // mean = hi + lo
        qkv_ln_y_tail_(xr, g, b, hi, lo, rs, 0, d, yr); // y = (x - mean) rstd gamma + beta
        mean_out[r] = mean;
        rstd_out[r] = rstd;
    }
}

static void layer_norm_backward_portable(const float *restrict x, const float *restrict g, const float *restrict dy,
                                         const double *mean, const double *rstd, int64_t rows, int64_t d,
                                         float *restrict dx, double *restrict dg, double *restrict db,
                                         float *restrict gb, float *restrict bb) {
    int64_t whole = d - d % LN_LANES;
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict xr = x + r * d, *restrict dyr = dy + r * d;
        float hi = (float)mean[r], lo = (float)(mean[r] - (double)hi), rs = (float)rstd[r];
        qkv_ln_start_blocks_(r, d, gb, bb, dg, db);
        if (dx) {
            // pass 1: a = sum(dxh) / d, c = sum(dxh xhat) / d, and this row's dy xhat and dy into the blocks
            float sa[LN_LANES] = {0}, sc[LN_LANES] = {0}, ta = 0.0f, tc = 0.0f;
            int64_t j;
            for (j = 0; j < whole; j += LN_LANES)
                for (int k = 0; k < LN_LANES; k++) {
                    float xh = ((xr[j + k] - hi) - lo) * rs, dxh = dyr[j + k] * g[j + k]; // xhat, dxh = dy gamma
                    sa[k] += dxh;
                    sc[k] += dxh * xh;
                    gb[j + k] += dyr[j + k] * xh;
                    bb[j + k] += dyr[j + k];
                }
            qkv_ln_pass1_tail_(xr, dyr, g, hi, lo, rs, j, d, &ta, &tc, gb, bb);
            float a = (lanes_total(sa) + ta) / (float)d, c = (lanes_total(sc) + tc) / (float)d;
            // pass 2: dx += rstd ((dxh - a) - xhat c)
            qkv_ln_pass2_tail_(xr, dyr, g, hi, lo, rs, a, c, 0, d, dx + r * d);
        } else {
            qkv_ln_blocks_tail_(xr, dyr, hi, lo, rs, 0, d, gb, bb);
        }
        qkv_ln_fold_blocks_(r, rows, d, gb, bb, dg, db);
    }
}

const qkv_layer_norm_kernel_set_ qkv_layer_norm_kernels_portable_ = {
    .name = "portable",
    .available = true,
    .forward = layer_norm_forward_portable,
    .backward = layer_norm_backward_portable,
};

const qkv_layer_norm_kernel_set_ *qkv_layer_norm_kernels_isa_(int isa) {
    if (isa == QKV_ISA_PORTABLE_) return &qkv_layer_norm_kernels_portable_;
    if (isa == QKV_ISA_AVX512_ && qkv_layer_norm_kernels_avx512_.available && qkv_isa_supported_(QKV_ISA_AVX512_))
        return &qkv_layer_norm_kernels_avx512_;
    if (isa == QKV_ISA_AVX2_ && qkv_layer_norm_kernels_avx2_.available && qkv_isa_supported_(QKV_ISA_AVX2_))
        return &qkv_layer_norm_kernels_avx2_;
    return NULL;
}

const qkv_layer_norm_kernel_set_ *qkv_layer_norm_kernels_(void) {
    static const qkv_layer_norm_kernel_set_ *_Atomic best = NULL; /* decided once; a race repeats the answer */
    const qkv_layer_norm_kernel_set_ *k = best;
    if (!k) {
        k = qkv_layer_norm_kernels_isa_(QKV_ISA_AVX512_);
        if (!k) k = qkv_layer_norm_kernels_isa_(QKV_ISA_AVX2_);
        if (!k) k = &qkv_layer_norm_kernels_portable_;
        best = k;
    }
    return k;
}
