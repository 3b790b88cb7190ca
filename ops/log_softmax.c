/*
 * log_softmax.c — qkv_log_softmax: y = log softmax(x) along one axis, without a mask.
 *   x [outer, n, inner] -> y [outer, n, inner]
 * y = x - lse, lse = log sum_j e^x[j] along the axis (logsumexp_dim.c), exact where log(softmax) would round
 * tiny probabilities to log 0. A line of only -inf gives -inf with a zero gradient (PyTorch 1.13 gives NaN);
 * a +inf or NaN makes its whole line NaN (as PyTorch). The backward reads only y.
 */
#include "qkv_internal.h"

#include <math.h>

// dx[o, j, i] += dy[o, j, i] - e^y[o, j, i] sum_k dy[o, k, i]
static void log_softmax_backward(qkv_ctx *ctx, qkv_node_ *node) {
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
            // total = sum_k dy[k]; a line of -inf (y all -inf) passes no gradient
            double total = 0.0;
            bool dead = p->n > 0;
            for (int64_t k = 0; k < p->n; k++) {
                total += dy[base + k * p->inner];
                dead = dead && yv[base + k * p->inner] == -INFINITY;
            }
            for (int64_t j = 0; j < p->n; j++) {
                int64_t at = base + j * p->inner;
                work[at] = dead ? 0.0 : dy[at] - exp(yv[at]) * total;
            }
        }
    qkv_accumulate_f64_(dx, work);
}

qkv_tensor *qkv_log_softmax(qkv_ctx *ctx, qkv_tensor *x, int axis) {
    const char *fn = "qkv_log_softmax";
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
                // y = x - lse; a line of -inf stays -inf; one with +inf or NaN: NaN
                yv[at] = l == -INFINITY ? -INFINITY : isfinite(l) ? xv[at] - l : NAN;
            }
    qkv_store_f64_(y, yv);
    qkv_tensor *in[1] = {x};
    if (qkv_needs_grad_(ctx, in, 1)) {
        qkv_axis_ *saved = qkv_arena_alloc_(ctx, fn, sizeof *saved);
        if (!saved) return NULL;
        *saved = plan;
        qkv_node_ *node = qkv_record_(ctx, fn, log_softmax_backward, y, in, 1);
        if (!node) return NULL;
        node->saved = saved;
    }
    return y;
}
