/*
 * max_dim.c — qkv_max_dim: y = the largest element of x along one axis.   x [outer, n, inner] -> y [outer, inner]
 * The gradient goes whole to one element: the first largest one (the lowest index) on ties, and the first NaN
 * when there is one (y is then NaN): the index torch.max(x, dim) returns in PyTorch 1.13. An empty axis is
 * QKV_ERR_SHAPE (no largest element; PyTorch refuses it too).
 */
#include "qkv_internal.h"

#include <math.h>

typedef struct max_saved {
    qkv_axis_ plan;
    int64_t *arg; /* [outer * inner]: j of the element chosen */
} max_saved;

// dx[o, arg[o, i], i] += dy[o, i]
static void max_dim_backward(qkv_ctx *ctx, qkv_node_ *node) {
    const max_saved *s = node->saved;
    const qkv_axis_ *p = &s->plan;
    qkv_tensor *x = node->in[0];
    qkv_tensor *dx = qkv_grad_of_(ctx, x);
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    double *work = qkv_arena_array_(ctx, node->op, (size_t)x->numel + 1, sizeof(double));
    if (!dx || !dy || !work) return;
    memset(work, 0, (size_t)x->numel * sizeof(double));
    for (int64_t o = 0; o < p->outer; o++)
        for (int64_t i = 0; i < p->inner; i++)
            work[(o * p->n + s->arg[o * p->inner + i]) * p->inner + i] = dy[o * p->inner + i];
    qkv_accumulate_f64_(dx, work);
}

qkv_tensor *qkv_max_dim(qkv_ctx *ctx, qkv_tensor *x, int axis, bool keepdim) {
    const char *fn = "qkv_max_dim";
    if (!ctx || ctx->status) return NULL;
    qkv_axis_ plan;
    if (!qkv_axis_plan_(ctx, fn, x, axis, keepdim, &plan)) return NULL;
    if (plan.n == 0 && plan.outer * plan.inner > 0)
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: x is %s: axis %d is empty, so it has no largest element", fn,
                         QKV_SHAPE(x), axis);
    qkv_tensor *y = qkv_new_tensor_(ctx, fn, x->dtype, plan.ndim, plan.shape);
    int64_t rows = plan.outer * plan.inner;
    int64_t *arg = qkv_arena_array_(ctx, fn, (size_t)rows + 1, sizeof(int64_t));
    const double *xv = qkv_as_f64_(ctx, fn, x);
    double *yv = y ? qkv_out_f64_(ctx, fn, y) : NULL;
    if (!y || !arg || !xv || !yv) return NULL;
    for (int64_t o = 0; o < plan.outer; o++)
        for (int64_t i = 0; i < plan.inner; i++) {
            // k = the first j with x[o, j, i] largest (or NaN)
            const double *col = xv + o * plan.n * plan.inner + i;
            int64_t k = 0;
            for (int64_t j = 1; j < plan.n && !isnan(col[k * plan.inner]); j++)
                if (col[j * plan.inner] > col[k * plan.inner] || isnan(col[j * plan.inner])) k = j;
            arg[o * plan.inner + i] = k;
            yv[o * plan.inner + i] = col[k * plan.inner];
        }
    qkv_store_f64_(y, yv);
    qkv_tensor *in[1] = {x};
    if (qkv_needs_grad_(ctx, in, 1)) {
        max_saved *s = qkv_arena_alloc_(ctx, fn, sizeof *s);
        if (!s) return NULL;
        *s = (max_saved){plan, arg};
        qkv_node_ *node = qkv_record_(ctx, fn, max_dim_backward, y, in, 1);
        if (!node) return NULL;
        node->saved = s;
    }
    return y;
}
