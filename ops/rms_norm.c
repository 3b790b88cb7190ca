/*
 * rms_norm.c — RMS normalisation over the last dimension (as LLaMA's RMSNorm).
 *   x [..., d], gamma [d] or NULL (1), eps finite > 0 -> y [..., d]
 *   per row: rstd = 1 / sqrt(sum(x^2) / d + eps),  xhat = x rstd,  y = xhat gamma
 * A constant row is an ordinary row here (a zero row gives y = 0 and dx = rstd dy gamma). The forward saves
 * each row's rstd (a double, node->saved) for the closed-form backward.
 *
 * f64: plain loops in double. f32: elements in f32, the row sums in 8 double lanes (ops/row_sums.h says
 * why), the loops cloned per CPU (QKV_VECTOR_LOOP). One thread.
 */
#include "qkv_internal.h"

#include "row_sums.h"

#include <float.h>
#include <math.h>

typedef struct rms_saved {
    double *rstd; /* one per row */
} rms_saved;

/* ---- forward ------------------------------------------------------------------------------------ */

static void rms_norm_f64(const double *x, const double *g, double *y, int64_t rows, int64_t d, double eps,
                         double *rstd_out) {
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * d;
        double q = 0.0;
        for (int64_t j = 0; j < d; j++) q += xr[j] * xr[j];
        double rstd = 1.0 / sqrt(q / (double)d + eps); // rstd = 1 / sqrt(mean(x^2) + eps)
        for (int64_t j = 0; j < d; j++) y[r * d + j] = xr[j] * rstd * (g ? g[j] : 1.0); // y = x rstd gamma
        rstd_out[r] = rstd;
    }
}

QKV_VECTOR_LOOP
static void rms_norm_f32(const float *restrict x, const float *restrict g, float *restrict y, int64_t rows,
                         int64_t d, double eps, double *rstd_out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict xr = x + r * d;
        float *restrict yr = y + r * d;
        double rstd = 1.0 / sqrt(dot8_f32(xr, xr, d) / (double)d + eps); // rstd = 1 / sqrt(mean(x^2) + eps)
        float rs = (float)rstd;
        if (g)
            for (int64_t j = 0; j < d; j++) yr[j] = xr[j] * rs * g[j]; // y = x rstd gamma
        else
            for (int64_t j = 0; j < d; j++) yr[j] = xr[j] * rs;
        rstd_out[r] = rstd;
    }
}

/* ---- backward ----------------------------------------------------------------------------------- */
// with dxh = dy gamma:  dx += rstd (dxh - xhat mean(dxh xhat)),  dgamma += sum_rows dy xhat

static void rms_norm_backward_f64(const double *x, const double *g, const double *dy, const double *rstd_of,
                                  int64_t rows, int64_t d, double *dx, double *dg) {
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * d, *dyr = dy + r * d;
        double rstd = rstd_of[r], c = 0.0;
        for (int64_t j = 0; j < d; j++) c += dyr[j] * (g ? g[j] : 1.0) * xr[j] * rstd; // c = sum(dxh xhat)
        c /= (double)d;
        for (int64_t j = 0; j < d; j++) {
            double xhat = xr[j] * rstd, dxh = dyr[j] * (g ? g[j] : 1.0);
            if (dx) dx[r * d + j] += rstd * (dxh - xhat * c);
            if (dg) dg[j] += dyr[j] * xhat;
        }
    }
}

/* xh and dxh are d-float scratch rows; dg (or NULL) is d doubles summed over rows. */
QKV_VECTOR_LOOP
static void rms_norm_backward_f32(const float *restrict x, const float *restrict g, const float *restrict dy,
                                  const double *rstd_of, int64_t rows, int64_t d, float *restrict dx,
                                  double *restrict dg, float *restrict xh, float *restrict dxh) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict xr = x + r * d, *restrict dyr = dy + r * d;
        float rs = (float)rstd_of[r];
        for (int64_t j = 0; j < d; j++) xh[j] = xr[j] * rs; // xhat = x rstd
        if (g)
            for (int64_t j = 0; j < d; j++) dxh[j] = dyr[j] * g[j]; // dxh = dy gamma
        else
            for (int64_t j = 0; j < d; j++) dxh[j] = dyr[j];
        if (dx) {
            float c = (float)(dot8_f32(dxh, xh, d) / (double)d);
            float *restrict dxr = dx + r * d;
            for (int64_t j = 0; j < d; j++) dxr[j] += rs * (dxh[j] - xh[j] * c);
        }
        if (dg)
            for (int64_t j = 0; j < d; j++) dg[j] += (double)(dyr[j] * xh[j]);
    }
}

static void rms_norm_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *x = node->in[0], *gamma = node->in[1];
    const rms_saved *s = node->saved;
    int64_t d = x->shape[x->ndim - 1], rows = d > 0 ? x->numel / d : 0;
    qkv_tensor *dx = qkv_wants_grad_(x) ? qkv_grad_of_(ctx, x) : NULL;
    qkv_tensor *dgt = qkv_wants_grad_(gamma) ? qkv_grad_of_(ctx, gamma) : NULL;
    if (ctx->status) return;
    const qkv_tensor *dy = node->out->grad;
    if (x->dtype == QKV_F64) {
        rms_norm_backward_f64(x->data, gamma ? gamma->data : NULL, dy->data, s->rstd, rows, d,
                              dx ? dx->data : NULL, dgt ? dgt->data : NULL);
        return;
    }
    double *sums = qkv_arena_array_(ctx, node->op, (size_t)(d + 1), sizeof(double));
    float *scratch = qkv_arena_array_(ctx, node->op, (size_t)(2 * d + 1), sizeof(float));
    if (!sums || !scratch) return;
    memset(sums, 0, (size_t)d * sizeof(double));
    rms_norm_backward_f32(x->data, gamma ? gamma->data : NULL, dy->data, s->rstd, rows, d, dx ? dx->data : NULL,
                          dgt ? sums : NULL, scratch, scratch + d);
    if (dgt) qkv_accumulate_f64_(dgt, sums);
}

/* ---- the operator ------------------------------------------------------------------------------- */

qkv_tensor *qkv_rms_norm(qkv_ctx *ctx, qkv_tensor *x, qkv_tensor *gamma, double eps) {
    const char *fn = "qkv_rms_norm";
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "x", x)) return NULL;
    if (x->ndim < 1)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: x is %s: it needs at least one dimension [..., d]", fn,
                         QKV_SHAPE(x));
    int64_t d = x->shape[x->ndim - 1], rows = d > 0 ? x->numel / d : 0;
    if (gamma) {
        if (!qkv_check_float_(ctx, fn, "gamma", gamma) || !qkv_check_same_dtype_(ctx, fn, x, "x", gamma, "gamma"))
            return NULL;
        if (gamma->ndim != 1 || gamma->shape[0] != d)
            return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: x is %s, gamma is %s: gamma must be [d] = [%lld] or NULL", fn,
                             QKV_SHAPE(x), QKV_SHAPE(gamma), (long long)d);
    }
    if (!(eps > 0.0) || !isfinite(eps))
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: x is %s, eps is %g: eps must be finite and > 0", fn, QKV_SHAPE(x),
                         eps);
    if (x->dtype == QKV_F32 && eps < FLT_MIN) /* as an f32 it would be 0 or subnormal: 1/sqrt(eps) overflows */
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: x is %s (f32), eps is %g: an f32 eps must be at least FLT_MIN "
                         "(1.17549e-38), or a constant row would give 0 * inf = NaN", fn, QKV_SHAPE(x), eps);
    qkv_tensor *y = qkv_new_like_(ctx, fn, x);
    rms_saved *s = qkv_arena_alloc_(ctx, fn, sizeof *s);
    double *rstd = qkv_arena_array_(ctx, fn, (size_t)(rows + 1), sizeof(double));
    if (!y || !s || !rstd) return NULL;
    s->rstd = rstd;
    if (x->dtype == QKV_F64)
        rms_norm_f64(x->data, gamma ? gamma->data : NULL, y->data, rows, d, eps, rstd);
    else
        rms_norm_f32(x->data, gamma ? gamma->data : NULL, y->data, rows, d, eps, rstd);

    qkv_tensor *in[2] = {x, gamma};
    if (qkv_needs_grad_(ctx, in, 2)) {
        qkv_node_ *node = qkv_record_(ctx, fn, rms_norm_backward, y, in, 2);
        if (!node) return NULL;
        node->saved = s;
        node->scalar = eps;
    }
    return y;
}
