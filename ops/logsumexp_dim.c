/*
 * logsumexp_dim.c — qkv_logsumexp_dim: y = log sum_j e^x[j] along one axis, without overflow.
 *   x [outer, n, inner] -> y [outer, inner]
 * y = m + log sum_j e^(x[j] - m), m the largest element: no e^x overflows, and the sum is at least 1. Its
 * gradient is the softmax along the axis, e^(x - y). An empty axis, or one whose every element is -inf, gives
 * -inf (log 0) with a zero gradient (PyTorch 1.13 gives NaN gradients there; qkv's masked softmax gives a fully
 * masked row zeros, and this is the same choice). A +inf element gives +inf, and NaN gradients on the +inf
 * elements (as PyTorch); a NaN gives NaN.
 */
#include "qkv_internal.h"

#include "kernels/unary_kernels.h"
#include "exp_sums.h"
#include "row_sums.h"

#include <math.h>

/* lse[o, i] = log sum_j e^x[o, j, i] for x seen as [outer, n, inner]: m + log sum_j e^(x[j] - m), m the largest;
 * -inf for an empty line or one of only -inf, +inf or NaN when the line has them (softmax_dim.c and
 * log_softmax.c use it too). */
void qkv_logsumexp_lines_(const double *x, const qkv_axis_ *p, double *lse) {
    for (int64_t o = 0; o < p->outer; o++)
        for (int64_t i = 0; i < p->inner; i++) {
            const double *line = x + o * p->n * p->inner + i;
            // m = max_j x[j] (NaN if any is)
            double m = -INFINITY;
            for (int64_t j = 0; j < p->n; j++) m = isnan(line[j * p->inner]) || line[j * p->inner] > m ? line[j * p->inner] : m;
            if (isnan(m) || isinf(m)) { // NaN, +inf, or a line of -inf (or empty): log 0 = -inf
                lse[o * p->inner + i] = m;
                continue;
            }
            // lse = m + log sum_j e^(x[j] - m)
            double s = 0.0;
            for (int64_t j = 0; j < p->n; j++) s += exp(line[j * p->inner] - m);
            lse[o * p->inner + i] = m + log(s);
        }
}

/* f32 along the last axis: y[r] = m + log s from exp_sums.h (m, then s in m + rows; scratch: n floats); a row whose
 * m is not finite gives m (-inf, +inf or NaN) */
QKV_VECTOR_LOOP static void logsumexp_last_f32(const float *x, int64_t rows, int64_t n, float *y, double *m,
                                               float *scratch) {
    exp_sums_f32(qkv_unary_kernels_(), x, rows, n, m, m + rows, scratch); // m and s; no e stored
    for (int64_t r = 0; r < rows; r++) y[r] = (float)(isfinite(m[r]) ? m[r] + log(m[rows + r]) : m[r]);
}

/* f32 along the last axis, one row at a time: dx (+)= dy[r] e^(x - y[r]), the exps by the float exp map of
 * x - y[r] (rounded once in float, as the forward's x - m) into the row scratch e of n floats, the product and
 * the sum in double; 0 for a row of -inf (y = -inf). A new gradient (fresh) is stored as 0 + (...), the bits of
 * adding into zeros, without reading them. */
QKV_VECTOR_LOOP static void logsumexp_last_backward_f32(const float *x, const float *y, const float *dy, float *dx,
                                                        int64_t rows, int64_t n, float *e, bool fresh) {
    const qkv_unary_kernel_set_ *k = qkv_unary_kernels_();
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *dr = dx + r * n;
        if (y[r] == -INFINITY) { // no gradient: a new one is 0
            for (int64_t j = 0; fresh && j < n; j++) dr[j] = 0.0f;
            continue;
        }
        for (int64_t j = 0; j < n; j++) e[j] = xr[j] - y[r]; // x - y in float, rounded once
        k->map(QKV_VF_EXP_, e, e, n, 0.0f);                   // e^(x - y): the softmax along the row
        double g = (double)dy[r];
        if (fresh)
            for (int64_t j = 0; j < n; j++) dr[j] = (float)(0.0 + g * (double)e[j]);
        else
            for (int64_t j = 0; j < n; j++) dr[j] = (float)((double)dr[j] + g * (double)e[j]);
    }
}

// dx[o, j, i] += dy[o, i] e^(x[o, j, i] - y[o, i])   (0 for a row of -inf)
static void logsumexp_dim_backward(qkv_ctx *ctx, qkv_node_ *node) {
    const qkv_axis_ *p = node->saved;
    qkv_tensor *x = node->in[0];
    if (x->dtype == QKV_F32 && p->inner == 1) {
        float *e = qkv_arena_array_(ctx, node->op, (size_t)p->n + 1, sizeof(float));
        bool fresh;
        qkv_tensor *dx = e ? qkv_grad_to_write_(ctx, x, &fresh) : NULL;
        if (dx)
            logsumexp_last_backward_f32(x->data, node->out->data, node->out->grad->data, dx->data, p->outer, p->n, e,
                                        fresh);
        return;
    }
    qkv_tensor *dx = qkv_grad_of_(ctx, x);
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    const double *xv = qkv_as_f64_(ctx, node->op, x), *yv = qkv_as_f64_(ctx, node->op, node->out);
    double *work = qkv_arena_array_(ctx, node->op, (size_t)x->numel + 1, sizeof(double));
    if (!dx || !dy || !xv || !yv || !work) return;
    for (int64_t o = 0; o < p->outer; o++)
        for (int64_t j = 0; j < p->n; j++)
            for (int64_t i = 0; i < p->inner; i++) {
                int64_t r = o * p->inner + i, at = (o * p->n + j) * p->inner + i;
                work[at] = yv[r] == -INFINITY ? 0.0 : dy[r] * exp(xv[at] - yv[r]);
            }
    qkv_accumulate_f64_(dx, work);
}

qkv_tensor *qkv_logsumexp_dim(qkv_ctx *ctx, qkv_tensor *x, int axis, bool keepdim) {
    const char *fn = "qkv_logsumexp_dim";
    if (!ctx || ctx->status) return NULL;
    qkv_axis_ plan;
    if (!qkv_axis_plan_(ctx, fn, x, axis, keepdim, &plan)) return NULL;
    qkv_tensor *y = qkv_new_tensor_(ctx, fn, x->dtype, plan.ndim, plan.shape);
    if (!y) return NULL;
    if (x->dtype == QKV_F32 && plan.inner == 1) { // the last axis on the float arrays: y = m + log s
        int64_t rows = plan.outer;
        float *scratch = qkv_arena_array_(ctx, fn, (size_t)plan.n + 1, sizeof(float));
        double *m = qkv_arena_array_(ctx, fn, 2 * (size_t)rows + 1, sizeof(double));
        if (!scratch || !m) return NULL;
        logsumexp_last_f32(x->data, rows, plan.n, y->data, m, scratch);
    } else {
        const double *xv = qkv_as_f64_(ctx, fn, x);
        double *yv = qkv_out_f64_(ctx, fn, y);
        if (!xv || !yv) return NULL;
        qkv_logsumexp_lines_(xv, &plan, yv);
        qkv_store_f64_(y, yv);
    }
    return qkv_axis_record_(ctx, fn, logsumexp_dim_backward, x, y, &plan);
}
