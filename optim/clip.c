/*
 * clip.c — clipping by global gradient norm, as torch.nn.utils.clip_grad_norm_ (PyTorch 1.13, L2).
 *   params[i] [any shape] with grad [the same shape]; n parameters; the norm runs over all of them
 *
 * Computed in double, in place, with no allocation. The sum of squares and the scaling run in loops
 * cloned per CPU (QKV_VECTOR_LOOP); the scaling gives the scalar code's bits, the sum its own fixed order.
 */
#include "qkv_internal.h"

#include <math.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* The sum of squares runs in LANES partial sums (element i goes to lane i % LANES), added pairwise at
 * the end: the compiler vectorises the lanes without reassociating anything itself, so the order, and
 * the bits, are the same in every clone and on every run. */
enum { LANES = 16 };

static inline double add_lanes(double acc[LANES]) {
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

/* Element i of an f64 (f64 true) or f32 array, in double. */
static inline __attribute__((always_inline)) double value_at(const void *x, bool f64, int64_t i) {
    return f64 ? ((const double *)x)[i] : (double)((const float *)x)[i];
}

// sum over x of (x / scale)^2 in the LANES partial sums; inlined with scale 1 it divides by nothing
static inline __attribute__((always_inline)) double sum_squares_lanes(const void *x, bool f64, int64_t n,
                                                                      double scale) {
    double acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) {
            double v = value_at(x, f64, i + j) / scale; // s += (x / scale)^2
            acc[j] += v * v;
        }
    for (int j = 0; i + j < n; j++) {
        double v = value_at(x, f64, i + j) / scale;
        acc[j] += v * v;
    }
    return add_lanes(acc);
}

QKV_VECTOR_LOOP
static double sum_squares_f64(const double *restrict x, int64_t n, double scale) {
    return scale == 1.0 ? sum_squares_lanes(x, true, n, 1.0) : sum_squares_lanes(x, true, n, scale);
}

QKV_VECTOR_LOOP
static double sum_squares_f32(const float *restrict x, int64_t n, double scale) {
    return scale == 1.0 ? sum_squares_lanes(x, false, n, 1.0) : sum_squares_lanes(x, false, n, scale);
}

// sum over every gradient element of (g / scale)^2
static double sum_squares(qkv_tensor *const *params, int n, double scale) {
    double s = 0.0;
    for (int k = 0; k < n; k++) {
        const qkv_tensor *g = params[k]->grad;
        if (!g) continue;
        s += g->dtype == QKV_F64 ? sum_squares_f64(g->data, g->numel, scale)
                                 : sum_squares_f32(g->data, g->numel, scale);
    }
    return s;
}

QKV_VECTOR_LOOP
static void scale_f64(double *restrict x, int64_t n, double coef) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * coef; // g = coef g
}

QKV_VECTOR_LOOP
static void scale_f32(float *restrict x, int64_t n, double coef) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)((double)x[i] * coef); // g = coef g, in double
}

/* "params[k]" in out, k >= 0: snprintf would cost more than the norm of a small model's gradients */
static const char *param_label(char out[32], int k) {
    char digits[12];
    int n = 0;
    do digits[n++] = (char)('0' + k % 10);
    while ((k /= 10) > 0);
    memcpy(out, "params[", 7);
    for (int i = 0; i < n; i++) out[7 + i] = digits[n - 1 - i];
    memcpy(out + 7 + n, "]", 2);
    return out;
}

double qkv_clip_grad_norm(qkv_ctx *ctx, qkv_tensor *const *params, int n, double max_norm) {
    const char *fn = "qkv_clip_grad_norm";
    if (!ctx || ctx->status) return NAN;
    if (!params) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: params is NULL", fn), NAN;
    if (n <= 0) return qkv_fail_(ctx, QKV_ERR_ARG, "%s: n is %d, must be >= 1", fn, n), NAN;
    if (!(isfinite(max_norm) && max_norm >= 0))
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: max_norm %g must be finite and >= 0", fn, max_norm), NAN;
    for (int k = 0; k < n; k++) {
        char what[32];
        if (!qkv_check_float_(ctx, fn, param_label(what, k), params[k])) return NAN;
        const qkv_tensor *g = params[k]->grad;
        if (g && (!qkv_is_float_(g->dtype) || g->numel != params[k]->numel))
            return qkv_fail_(ctx, QKV_ERR_STATE, "%s: params[%d] is %s but its gradient is %s %s", fn, k,
                             QKV_SHAPE(params[k]), QKV_SHAPE(g), qkv_dtype_name(g->dtype)),
                   NAN;
        for (int j = 0; j < k; j++)
            if (params[j] == params[k])
                return qkv_fail_(ctx, QKV_ERR_ARG,
                                 "%s: params[%d] and params[%d] are the same tensor %s (its gradient would "
                                 "count twice)",
                                 fn, j, k, QKV_SHAPE(params[k])),
                       NAN;
    }

    double total = sqrt(sum_squares(params, n, 1.0)); // total = sqrt(sum g^2)
    if (!isfinite(total)) {
        /* a NaN or inf element is an error; otherwise the squares overflowed: scale by the largest */
        double big = 0.0;
        for (int k = 0; k < n; k++) {
            const qkv_tensor *g = params[k]->grad;
            for (int64_t i = 0; g && i < g->numel; i++) {
                double v = value_at(g->data, g->dtype == QKV_F64, i);
                if (!isfinite(v))
                    return qkv_fail_(ctx, QKV_ERR_NUMERIC,
                                     "%s: the gradient of params[%d] %s is %g at flat index %lld; the norm "
                                     "is not finite and no gradient was changed",
                                     fn, k, QKV_SHAPE(params[k]), v, (long long)i),
                           total;
                if (fabs(v) > big) big = fabs(v);
            }
        }
        total = big * sqrt(sum_squares(params, n, big)); // total = max|g| sqrt(sum (g / max|g|)^2)
        if (!isfinite(total))
            return qkv_fail_(ctx, QKV_ERR_NUMERIC, "%s: the gradient norm overflows double", fn), total;
    }

    double coef = max_norm / (total + 1e-6); // coef = max_norm / (total + 1e-6), applied when < 1
    if (coef >= 1.0) return total;
    for (int k = 0; k < n; k++) {
        qkv_tensor *g = params[k]->grad;
        if (!g) continue;
        if (g->dtype == QKV_F64)
            scale_f64(g->data, g->numel, coef);
        else
            scale_f32(g->data, g->numel, coef);
    }
    return total;
}
