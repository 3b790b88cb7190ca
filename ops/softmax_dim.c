/*
 * softmax_dim.c — qkv_softmax_dim: y = the softmax of x along one axis, without a mask.
 *   x [outer, n, inner] -> y [outer, n, inner]
 * y = e^(x - lse), lse = log sum_j e^x[j] along the axis (logsumexp_dim.c: no overflow). A line of only -inf
 * gives zeros with a zero gradient (as qkv_softmax's fully masked row; PyTorch 1.13 gives NaN); a +inf or NaN
 * makes its whole line NaN (as PyTorch). The backward reads only y.
 */
#include "qkv_internal.h"

#include <math.h>

// dx[o, j, i] += y[o, j, i] (dy[o, j, i] - sum_k dy[o, k, i] y[o, k, i])
static void softmax_dim_backward(qkv_ctx *ctx, qkv_node_ *node) {
    const qkv_axis_ *p = node->saved;
    qkv_tensor *x = node->in[0];
    qkv_tensor *dx = qkv_grad_of_(ctx, x);
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    const double *yv = qkv_as_f64_(ctx, node->op, node->out);
    double *work = qkv_arena_array_(ctx, node->op, (size_t)x->numel + 1, sizeof(double));
    if (!dx || !dy || !yv || !work) return;
    for (int64_t o = 0; o < p->outer; o++)
        for (int64_t i = 0; i < p->inner; i++) {
            int64_t base = o * p->n * p->inner + i;
            // dot = sum_k dy[k] y[k]
            double dot = 0.0;
            for (int64_t k = 0; k < p->n; k++) dot += dy[base + k * p->inner] * yv[base + k * p->inner];
            for (int64_t j = 0; j < p->n; j++) {
                int64_t at = base + j * p->inner;
                work[at] = yv[at] * (dy[at] - dot);
            }
        }
    qkv_accumulate_f64_(dx, work);
}

qkv_tensor *qkv_softmax_dim(qkv_ctx *ctx, qkv_tensor *x, int axis) {
    const char *fn = "qkv_softmax_dim";
    if (!ctx || ctx->status) return NULL;
    qkv_axis_ plan;
    if (!qkv_axis_plan_(ctx, fn, x, axis, true, &plan)) return NULL;
    qkv_tensor *y = qkv_new_like_(ctx, fn, x);
    const double *xv = qkv_as_f64_(ctx, fn, x);
    double *yv = y ? qkv_out_f64_(ctx, fn, y) : NULL;
    double *lse = qkv_arena_array_(ctx, fn, (size_t)(plan.outer * plan.inner) + 1, sizeof(double));
    if (!y || !xv || !yv || !lse) return NULL;
    qkv_logsumexp_lines_(xv, &plan, lse);
    for (int64_t o = 0; o < plan.outer; o++)
        for (int64_t j = 0; j < plan.n; j++)
            for (int64_t i = 0; i < plan.inner; i++) {
                int64_t at = (o * plan.n + j) * plan.inner + i;
                double l = lse[o * plan.inner + i];
                // y = e^(x - lse); a line of -inf: 0; one with +inf or NaN: NaN
                yv[at] = l == -INFINITY ? 0.0 : isfinite(l) ? exp(xv[at] - l) : NAN;
            }
    qkv_store_f64_(y, yv);
    qkv_tensor *in[1] = {x};
    if (qkv_needs_grad_(ctx, in, 1)) {
        qkv_axis_ *saved = qkv_arena_alloc_(ctx, fn, sizeof *saved);
        if (!saved) return NULL;
        *saved = plan;
        qkv_node_ *node = qkv_record_(ctx, fn, softmax_dim_backward, y, in, 1);
        if (!node) return NULL;
        node->saved = saved;
    }
    return y;
}
