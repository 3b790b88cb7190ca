/*
 * sum_dim.c — qkv_sum_dim: y = the sum of x along one axis.   x [outer, n, inner] -> y [outer, inner]
 * Summed in double in index order (f32 too: one rounding at the end). An empty axis sums to 0.
 */
#include "qkv_internal.h"

// y[o, i] = sum_j x[o, j, i]
static void sum_axis(const double *x, const qkv_axis_ *p, double factor, double *y) {
    for (int64_t o = 0; o < p->outer; o++)
        for (int64_t i = 0; i < p->inner; i++) {
            double s = 0.0;
            for (int64_t j = 0; j < p->n; j++) s += x[(o * p->n + j) * p->inner + i];
            y[o * p->inner + i] = s * factor;
        }
}

typedef struct sum_saved {
    qkv_axis_ plan;
    double factor;
} sum_saved;

// dx[o, j, i] += factor * dy[o, i]
static void sum_dim_backward(qkv_ctx *ctx, qkv_node_ *node) {
    const sum_saved *s = node->saved;
    const qkv_axis_ *p = &s->plan;
    qkv_tensor *x = node->in[0];
    qkv_tensor *dx = qkv_grad_of_(ctx, x);
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    double *work = qkv_arena_array_(ctx, node->op, (size_t)x->numel + 1, sizeof(double));
    if (!dx || !dy || !work) return;
    for (int64_t o = 0; o < p->outer; o++)
        for (int64_t j = 0; j < p->n; j++)
            for (int64_t i = 0; i < p->inner; i++) work[(o * p->n + j) * p->inner + i] = s->factor * dy[o * p->inner + i];
    qkv_accumulate_f64_(dx, work);
}

/* The sum times factor (1 for sum_dim, 1/n for mean_dim), under the name fn. */
qkv_tensor *qkv_sum_dim_scaled_(qkv_ctx *ctx, const char *fn, qkv_tensor *x, int axis, bool keepdim, bool mean) {
    if (!ctx || ctx->status) return NULL;
    qkv_axis_ plan;
    if (!qkv_axis_plan_(ctx, fn, x, axis, keepdim, &plan)) return NULL;
    double factor = mean ? 1.0 / (double)plan.n : 1.0; /* an empty axis: 0 * inf = NaN, as PyTorch's mean */
    qkv_tensor *y = qkv_new_tensor_(ctx, fn, x->dtype, plan.ndim, plan.shape);
    if (!y) return NULL;
    const double *xv = qkv_as_f64_(ctx, fn, x);
    double *yv = qkv_out_f64_(ctx, fn, y);
    if (!xv || !yv) return NULL;
    sum_axis(xv, &plan, factor, yv);
    qkv_store_f64_(y, yv);
    qkv_tensor *in[1] = {x};
    if (qkv_needs_grad_(ctx, in, 1)) {
        sum_saved *s = qkv_arena_alloc_(ctx, fn, sizeof *s);
        if (!s) return NULL;
        *s = (sum_saved){plan, factor};
        qkv_node_ *node = qkv_record_(ctx, fn, sum_dim_backward, y, in, 1);
        if (!node) return NULL;
        node->saved = s;
    }
    return y;
}

qkv_tensor *qkv_sum_dim(qkv_ctx *ctx, qkv_tensor *x, int axis, bool keepdim) {
    return qkv_sum_dim_scaled_(ctx, "qkv_sum_dim", x, axis, keepdim, false);
}
