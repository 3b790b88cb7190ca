/*
 * index_select.c — qkv_index_select: entries of x along one axis picked by a list of ids (a copy;
 * torch.index_select).
 *   x [..., a, ...], index i32 [m] -> y [..., m, ...]
 * With o over the axes before the axis and i over those after it:
 *   y[o, j, i] = x[o, index[j], i];   dx[o, index[j], i] += dy[o, j, i] for j = 0, 1, ... in order, so a repeated
 *   index gets the sum of its rows, added in the same order (the same bits) every run.
 * Every index is checked against [0, a) before anything is written. index is not differentiable; the node keeps
 * its own copy (the caller may change or free it before the backward).
 */
#include "shape_common.h"

typedef struct index_select_saved {
    int32_t *index; /* the node's copy, m entries, each in [0, size) */
    int64_t m, outer, inner, size;
} index_select_saved;

// dx[o, index[j], i] += dy[o, j, i]   (j in order)
static void index_select_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *x = node->in[0];
    if (!qkv_wants_grad_(x)) return;
    const index_select_saved *s = node->saved;
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    double *dx = qkv_arena_array_(ctx, node->op, (size_t)x->numel + 1, sizeof(double));
    if (!dy || !dx) return;
    memset(dx, 0, (size_t)x->numel * sizeof(double));
    for (int64_t o = 0; o < s->outer; o++)
        for (int64_t j = 0; j < s->m; j++) {
            double *dst = dx + (o * s->size + s->index[j]) * s->inner;
            const double *src = dy + (o * s->m + j) * s->inner;
            for (int64_t i = 0; i < s->inner; i++) dst[i] += src[i];
        }
    qkv_tensor *gx = qkv_grad_of_(ctx, x);
    if (gx) qkv_accumulate_f64_(gx, dx);
}

qkv_tensor *qkv_index_select(qkv_ctx *ctx, qkv_tensor *x, int axis, const qkv_tensor *index) {
    const char *fn = "qkv_index_select";
    if (!ctx || ctx->status || !qkv_check_tensor_(ctx, fn, "x", x) || !qkv_check_tensor_(ctx, fn, "index", index))
        return NULL;
    int a;
    if (!qkv_shape_axis_(ctx, fn, "axis", axis, "x", x, &a)) return NULL;
    if (index->dtype != QKV_I32)
        return qkv_fail_(ctx, QKV_ERR_DTYPE, "%s: x is %s, index %s is %s: index must be i32", fn, QKV_SHAPE(x),
                         QKV_SHAPE(index), qkv_dtype_name(index->dtype));
    if (index->ndim != 1)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: x is %s, index is %s: index must be 1-D [m]", fn, QKV_SHAPE(x),
                         QKV_SHAPE(index));
    int64_t size = x->shape[a], m = index->numel;
    const int32_t *idx = index->data;
    for (int64_t j = 0; j < m; j++)
        if (idx[j] < 0 || idx[j] >= size)
            return qkv_fail_(ctx, QKV_ERR_ARG,
                             "%s: x is %s, index is %s: index %d at position %lld is outside [0, %lld) (axis %d)", fn,
                             QKV_SHAPE(x), QKV_SHAPE(index), (int)idx[j], (long long)j, (long long)size, a);
    int64_t shape[QKV_MAX_DIMS] = {0};
    for (int d = 0; d < x->ndim; d++) shape[d] = d == a ? m : x->shape[d];
    qkv_tensor *y = qkv_new_tensor_(ctx, fn, x->dtype, x->ndim, shape);
    if (!y) return NULL;
    int64_t outer = qkv_dims_product_(x, 0, a), inner = qkv_dims_product_(x, a + 1, x->ndim);
    size_t esize = qkv_dtype_size(x->dtype), run = (size_t)inner * esize;
    // y[o, j, i] = x[o, index[j], i]: one run of inner elements per (o, j)
    unsigned char *dst = y->data;
    for (int64_t o = 0; o < outer && run > 0; o++)
        for (int64_t j = 0; j < m; j++, dst += run)
            memcpy(dst, (const unsigned char *)x->data + (size_t)(o * size + idx[j]) * run, run);
    qkv_tensor *in[1] = {x};
    if (qkv_is_float_(x->dtype) && qkv_needs_grad_(ctx, in, 1)) {
        index_select_saved *s = qkv_arena_alloc_(ctx, fn, sizeof *s);
        int32_t *copy = qkv_arena_array_(ctx, fn, (size_t)m + 1, sizeof(int32_t));
        if (!s || !copy) return NULL;
        if (m > 0) memcpy(copy, idx, (size_t)m * sizeof(int32_t));
        *s = (index_select_saved){copy, m, outer, inner, size};
        qkv_node_ *node = qkv_record_(ctx, fn, index_select_backward, y, in, 1);
        if (!node) return NULL;
        node->saved = s;
    }
    return y;
}
