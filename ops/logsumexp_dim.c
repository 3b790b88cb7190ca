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

// dx[o, j, i] += dy[o, i] e^(x[o, j, i] - y[o, i])   (0 for a row of -inf)
static void logsumexp_dim_backward(qkv_ctx *ctx, qkv_node_ *node) {
    const qkv_axis_ *p = node->saved;
    qkv_tensor *x = node->in[0];
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
    const double *xv = qkv_as_f64_(ctx, fn, x);
    double *yv = y ? qkv_out_f64_(ctx, fn, y) : NULL;
    if (!y || !xv || !yv) return NULL;
    qkv_logsumexp_lines_(xv, &plan, yv);
    qkv_store_f64_(y, yv);
    qkv_tensor *in[1] = {x};
    if (qkv_needs_grad_(ctx, in, 1)) {
        qkv_axis_ *saved = qkv_arena_alloc_(ctx, fn, sizeof *saved);
        if (!saved) return NULL;
        *saved = plan;
        qkv_node_ *node = qkv_record_(ctx, fn, logsumexp_dim_backward, y, in, 1);
        if (!node) return NULL;
        node->saved = saved;
    }
    return y;
}
