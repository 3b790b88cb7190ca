/*
 * concat.c — qkv_concat: tensors joined along one axis (a copy).
 *   xs[k] [..., a_k, ...] for k = 0 .. n-1 (equal elsewhere) -> y [..., a_0 + ... + a_{n-1}, ...]
 * With o over the axes before the axis and i over those after it:
 *   y[o, off_k + j, i] = xs[k][o, j, i],  off_k = a_0 + ... + a_{k-1};   dxs[k][o, j, i] += dy[o, off_k + j, i].
 * Any dtype is copied bit for bit; the gradient flows to the f32/f64 inputs that need it. A tape node holds at
 * most QKV_NODE_MAX_INPUTS inputs, so when more than that many are joined with gradients on, groups of them are
 * joined first and the groups joined after (the same values, each element copied once more per level).
 */
#include "shape_common.h"

typedef struct concat_saved {
    int64_t outer, inner, total;             /* axes before the axis, after it; y's size along it */
    int64_t offset[QKV_NODE_MAX_INPUTS];     /* off_k */
} concat_saved;

// dxs[k][o, j, i] += dy[o, off_k + j, i]
static void concat_backward(qkv_ctx *ctx, qkv_node_ *node) {
    const concat_saved *s = node->saved;
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    if (!dy) return;
    for (int k = 0; k < node->n_in; k++) {
        qkv_tensor *x = node->in[k];
        if (!qkv_wants_grad_(x)) continue;
        double *dx = qkv_arena_array_(ctx, node->op, (size_t)x->numel + 1, sizeof(double));
        if (!dx) return;
        int64_t slab = x->numel / (s->outer ? s->outer : 1); // a_k * inner elements per o
        for (int64_t o = 0; o < s->outer && slab > 0; o++)
            memcpy(dx + o * slab, dy + (o * s->total + s->offset[k]) * s->inner, (size_t)slab * sizeof(double));
        qkv_tensor *gx = qkv_grad_of_(ctx, x);
        if (!gx) return;
        qkv_accumulate_f64_(gx, dx);
    }
}

static qkv_tensor *concat(qkv_ctx *ctx, const char *fn, qkv_tensor *const *xs, int n, int axis);

/* More than a node's inputs need a gradient: join groups of QKV_NODE_MAX_INPUTS first, then the groups. */
static qkv_tensor *concat_grouped(qkv_ctx *ctx, const char *fn, qkv_tensor *const *xs, int n, int axis) {
    int groups = (n + QKV_NODE_MAX_INPUTS - 1) / QKV_NODE_MAX_INPUTS;
    qkv_tensor **parts = qkv_arena_array_(ctx, fn, (size_t)groups, sizeof *parts);
    if (!parts) return NULL;
    for (int g = 0; g < groups; g++) {
        int first = g * QKV_NODE_MAX_INPUTS, count = n - first < QKV_NODE_MAX_INPUTS ? n - first : QKV_NODE_MAX_INPUTS;
        if (!(parts[g] = concat(ctx, fn, xs + first, count, axis))) return NULL;
    }
    return concat(ctx, fn, parts, groups, axis);
}

/* xs checked (n >= 1, each a live tensor); axis already counted from 0. */
static qkv_tensor *concat(qkv_ctx *ctx, const char *fn, qkv_tensor *const *xs, int n, int axis) {
    const qkv_tensor *x0 = xs[0];
    int nd = x0->ndim;
    int64_t total = 0;
    for (int k = 0; k < n; k++) {
        const qkv_tensor *x = xs[k];
        char name[32];
        snprintf(name, sizeof name, "xs[%d]", k);
        if (k > 0 && !qkv_check_same_dtype_(ctx, fn, x0, "xs[0]", x, name)) return NULL;
        if (x->ndim != nd)
            return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: xs[0] is %s and %s is %s: the tensors must have the same number "
                             "of dimensions", fn, QKV_SHAPE(x0), name, QKV_SHAPE(x));
        for (int d = 0; d < nd; d++)
            if (d != axis && x->shape[d] != x0->shape[d])
                return qkv_fail_(ctx, QKV_ERR_SHAPE,
                                 "%s: xs[0] is %s and %s is %s: dimension %d is %lld and %lld; only axis %d may differ",
                                 fn, QKV_SHAPE(x0), name, QKV_SHAPE(x), d, (long long)x0->shape[d],
                                 (long long)x->shape[d], axis);
        // total = a_0 + ... + a_k, kept within a tensor's bound so the sum never overflows
        if (x->shape[axis] > QKV_MAX_NUMEL - total)
            return qkv_fail_(ctx, QKV_ERR_OVERFLOW, "%s: xs[0] is %s, %s is %s: the sizes along axis %d add up to more "
                             "than QKV_MAX_NUMEL", fn, QKV_SHAPE(x0), name, QKV_SHAPE(x), axis);
        total += x->shape[axis];
    }
    bool grad = qkv_is_float_(x0->dtype) && qkv_needs_grad_(ctx, xs, n);
    if (grad && n > QKV_NODE_MAX_INPUTS) return concat_grouped(ctx, fn, xs, n, axis);
    int64_t shape[QKV_MAX_DIMS] = {0};
    for (int d = 0; d < nd; d++) shape[d] = d == axis ? total : x0->shape[d];
    qkv_tensor *y = qkv_new_tensor_(ctx, fn, x0->dtype, nd, shape);
    if (!y) return NULL;
    int64_t outer = qkv_dims_product_(x0, 0, axis), inner = qkv_dims_product_(x0, axis + 1, nd);
    size_t esize = qkv_dtype_size(x0->dtype);
    // y[o, off_k + j, i] = xs[k][o, j, i]: per o, each input's slab of a_k * inner elements in turn
    if (y->numel > 0) {
        unsigned char *dst = y->data;
        for (int64_t o = 0; o < outer; o++)
            for (int k = 0; k < n; k++) {
                size_t slab = (size_t)(xs[k]->shape[axis] * inner) * esize;
                if (slab) memcpy(dst, (const unsigned char *)xs[k]->data + (size_t)o * slab, slab);
                dst += slab;
            }
    }
    if (grad) {
        concat_saved *s = qkv_arena_alloc_(ctx, fn, sizeof *s);
        if (!s) return NULL;
        *s = (concat_saved){.outer = outer, .inner = inner, .total = total};
        for (int k = 1; k < n; k++) s->offset[k] = s->offset[k - 1] + xs[k - 1]->shape[axis]; // off_k
        qkv_node_ *node = qkv_record_(ctx, fn, concat_backward, y, xs, n);
        if (!node) return NULL;
        node->saved = s;
    }
    return y;
}

qkv_tensor *qkv_concat(qkv_ctx *ctx, qkv_tensor *const *xs, int n, int axis) {
    const char *fn = "qkv_concat";
    if (!ctx || ctx->status) return NULL;
    if (!xs) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: xs is NULL", fn);
    if (n < 1) return qkv_fail_(ctx, QKV_ERR_ARG, "%s: n is %d: at least one tensor is needed", fn, n);
    for (int k = 0; k < n; k++) {
        char name[32];
        snprintf(name, sizeof name, "xs[%d]", k);
        if (!qkv_check_tensor_(ctx, fn, name, xs[k])) return NULL;
    }
    int a;
    if (!qkv_shape_axis_(ctx, fn, "axis", axis, "xs[0]", xs[0], &a)) return NULL;
    return concat(ctx, fn, xs, n, a);
}
