/*
 * clip.c — clipping by global gradient norm, as torch.nn.utils.clip_grad_norm_ (PyTorch 1.13, L2).
 *   params[i] [any shape] with grad [the same shape]; n parameters; the norm runs over all of them
 *
 * Computed in double, in place, with no allocation.
 */
#include "qkv_internal.h"

#include <math.h>

static double grad_value(const qkv_tensor *g, int64_t i) {
    return g->dtype == QKV_F64 ? ((const double *)g->data)[i] : ((const float *)g->data)[i];
}

// sum over every gradient element of (g / scale)^2
static double sum_squares(qkv_tensor *const *params, int n, double scale) {
    double s = 0.0;
    for (int k = 0; k < n; k++) {
        const qkv_tensor *g = params[k]->grad;
        if (!g) continue;
        if (g->dtype == QKV_F64) {
            const double *x = g->data;
            if (scale == 1.0)
                for (int64_t i = 0; i < g->numel; i++) s += x[i] * x[i];
            else
                for (int64_t i = 0; i < g->numel; i++) s += (x[i] / scale) * (x[i] / scale);
        } else {
            const float *x = g->data;
            for (int64_t i = 0; i < g->numel; i++) {
                double v = (double)x[i] / scale;
                s += v * v;
            }
        }
    }
    return s;
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
        snprintf(what, sizeof what, "params[%d]", k);
        if (!qkv_check_float_(ctx, fn, what, params[k])) return NAN;
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
                double v = grad_value(g, i);
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
        if (g->dtype == QKV_F64) {
            double *x = g->data;
            for (int64_t i = 0; i < g->numel; i++) x[i] = x[i] * coef; // g = coef g
        } else {
            float *x = g->data;
            for (int64_t i = 0; i < g->numel; i++) x[i] = (float)((double)x[i] * coef);
        }
    }
    return total;
}
