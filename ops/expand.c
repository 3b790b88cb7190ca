/*
 * expand.c — qkv_expand: x broadcast to a larger shape (a copy; torch.expand with NumPy's rules).
 *   x [a, 1, c], shape [B, a, n, c] -> y [B, a, n, c]
 * Shapes are aligned at their last axis; each axis of x keeps its size (or -1 in shape says "keep it") or, when it
 * is 1, stretches to any size (0 included); new leading axes may be added (not as -1).
 *   y[i] = x[sum over x's axes d of i_d stride_x[d]], with stride 0 along a stretched or new axis;
 *   dx[j] += sum of dy over the positions i that read j, walked in y's row-major order (the same bits every run).
 */
#include "shape_common.h"

#include <stdio.h>

typedef struct expand_saved {
    int64_t shape4[4], stride4[4]; /* y's shape padded to 4 axes; x's element step along each (0: stretched) */
} expand_saved;

// dx[off(i)] += dy[i] for i over y in row-major order
static void expand_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *x = node->in[0];
    if (!qkv_wants_grad_(x)) return;
    const expand_saved *s = node->saved;
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    double *dx = qkv_arena_array_(ctx, node->op, (size_t)x->numel + 1, sizeof(double));
    if (!dy || !dx) return;
    memset(dx, 0, (size_t)x->numel * sizeof(double));
    const int64_t *n = s->shape4, *st = s->stride4;
    const double *g = dy;
    for (int64_t i0 = 0; i0 < n[0]; i0++)
        for (int64_t i1 = 0; i1 < n[1]; i1++)
            for (int64_t i2 = 0; i2 < n[2]; i2++) {
                double *row = dx + i0 * st[0] + i1 * st[1] + i2 * st[2];
                for (int64_t i3 = 0; i3 < n[3]; i3++) row[i3 * st[3]] += *g++;
            }
    qkv_tensor *gx = qkv_grad_of_(ctx, x);
    if (gx) qkv_accumulate_f64_(gx, dx);
}

/* "[2,-1,3]" of ndim sizes (ndim <= QKV_MAX_DIMS), for messages. */
static qkv_shapebuf_ sizes_str(int ndim, const int64_t *shape) {
    qkv_shapebuf_ b;
    int len = snprintf(b.s, sizeof b.s, "[");
    for (int d = 0; d < ndim; d++)
        len += snprintf(b.s + len, sizeof b.s - (size_t)len, "%s%lld", d ? "," : "", (long long)shape[d]);
    snprintf(b.s + len, sizeof b.s - (size_t)len, "]");
    return b;
}

qkv_tensor *qkv_expand(qkv_ctx *ctx, qkv_tensor *x, int ndim, const int64_t *shape) {
    const char *fn = "qkv_expand";
    if (!ctx || ctx->status || !qkv_check_tensor_(ctx, fn, "x", x)) return NULL;
    if (ndim < 0 || ndim > QKV_MAX_DIMS)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: x is %s, ndim is %d: qkv tensors have 0 to %d dimensions", fn,
                         QKV_SHAPE(x), ndim, QKV_MAX_DIMS);
    if (!shape && ndim > 0) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: x is %s, shape is NULL", fn, QKV_SHAPE(x));
    if (ndim < x->ndim)
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: x is %s, shape is %s: shape has fewer dimensions than x", fn,
                         QKV_SHAPE(x), sizes_str(ndim, shape).s);
    int lead = ndim - x->ndim;
    int64_t out[QKV_MAX_DIMS] = {0}, xstride[QKV_MAX_DIMS] = {0}, step[QKV_MAX_DIMS] = {0};
    qkv_shape_strides_(x, xstride);
    for (int d = 0; d < ndim; d++) {
        int64_t want = shape[d];
        if (d < lead) { // a new leading axis: any size >= 0, x repeated along it
            if (want < 0)
                return qkv_fail_(ctx, QKV_ERR_ARG, "%s: x is %s, shape is %s: size %lld of new leading dimension %d "
                                 "must be >= 0 (-1 keeps only an existing size)", fn, QKV_SHAPE(x),
                                 sizes_str(ndim, shape).s, (long long)want, d);
            out[d] = want, step[d] = 0;
            continue;
        }
        int64_t have = x->shape[d - lead];
        if (want == -1) want = have;
        if (want < 0)
            return qkv_fail_(ctx, QKV_ERR_ARG, "%s: x is %s, shape is %s: size %lld of dimension %d must be >= 0 or -1",
                             fn, QKV_SHAPE(x), sizes_str(ndim, shape).s, (long long)want, d);
        if (want != have && have != 1)
            return qkv_fail_(ctx, QKV_ERR_SHAPE,
                             "%s: x is %s, shape is %s: dimension %d is %lld in x and %lld in shape; only a size of 1 "
                             "stretches", fn, QKV_SHAPE(x), sizes_str(ndim, shape).s, d,
                             (long long)have, (long long)want);
        out[d] = want;
        step[d] = want == have ? xstride[d - lead] : 0; // 0: a size-1 axis read again at every position
    }
    qkv_tensor *y = qkv_new_tensor_(ctx, fn, x->dtype, ndim, out); // checks the element count for overflow
    if (!y) return NULL;
    expand_saved plan;
    qkv_shape_pad4_(ndim, out, step, plan.shape4, plan.stride4);
    // y[i] = x[sum_d i_d step[d]]
    qkv_shape_copy_(y->data, x->data, qkv_dtype_size(x->dtype), plan.shape4, plan.stride4);
    qkv_tensor *in[1] = {x};
    if (qkv_is_float_(x->dtype) && qkv_needs_grad_(ctx, in, 1)) {
        expand_saved *s = qkv_arena_alloc_(ctx, fn, sizeof *s);
        if (!s) return NULL;
        *s = plan;
        qkv_node_ *node = qkv_record_(ctx, fn, expand_backward, y, in, 1);
        if (!node) return NULL;
        node->saved = s;
    }
    return y;
}
