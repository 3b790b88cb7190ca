/*
 * transpose.c — qkv_permute and qkv_transpose: the axes of x in a new order (a copy: qkv has no views).
 *   permute:   x [d0, d1, d2], dims (p0, p1, p2) -> y [d_p0, d_p1, d_p2]
 *   transpose: x [..., a, ..., b, ...] -> y [..., b, ..., a, ...]   (the permutation that swaps dim0 and dim1)
 * y[i0, .., i_{n-1}] = x[j] where j[dims[k]] = i_k. Any dtype is copied bit for bit; an f32/f64 x gets the
 * gradient dx = permute(dy, inverse(dims)).
 */
#include "shape_common.h"

typedef struct permute_saved {
    int dims[QKV_MAX_DIMS]; /* y's axis k is x's axis dims[k] */
} permute_saved;

// dx += permute(dy, inverse(dims)): dx[j] = dy[i] with i_k = j[dims[k]]
static void permute_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *x = node->in[0], *y = node->out;
    if (!qkv_wants_grad_(x)) return;
    const permute_saved *s = node->saved;
    const double *dy = qkv_as_f64_(ctx, node->op, y->grad);
    double *dx = qkv_arena_array_(ctx, node->op, (size_t)x->numel + 1, sizeof(double));
    if (!dy || !dx) return;
    // walking dx in x's order, x's axis dims[k] steps dy by y's stride along k
    int64_t ystride[QKV_MAX_DIMS] = {0}, step[QKV_MAX_DIMS] = {0}, shape4[4], stride4[4];
    qkv_shape_strides_(y, ystride);
    for (int k = 0; k < y->ndim; k++) step[s->dims[k]] = ystride[k];
    qkv_shape_pad4_(x->ndim, x->shape, step, shape4, stride4);
    qkv_shape_copy_(dx, dy, sizeof(double), shape4, stride4);
    qkv_tensor *gx = qkv_grad_of_(ctx, x);
    if (gx) qkv_accumulate_f64_(gx, dx);
}

/* The permutation dims of x's axes (each counted from either end), checked, copied and recorded under fn. */
static qkv_tensor *permute(qkv_ctx *ctx, const char *fn, qkv_tensor *x, const int *dims) {
    int nd = x->ndim, perm[QKV_MAX_DIMS] = {0};
    bool seen[QKV_MAX_DIMS] = {false};
    for (int k = 0; k < nd; k++) {
        if (!qkv_shape_axis_(ctx, fn, "dims entry", dims[k], "x", x, &perm[k])) return NULL;
        if (seen[perm[k]])
            return qkv_fail_(ctx, QKV_ERR_ARG, "%s: x is %s: dims[%d] = %d names axis %d again; dims must name each of "
                             "the %d axes once", fn, QKV_SHAPE(x), k, dims[k], perm[k], nd);
        seen[perm[k]] = true;
    }
    int64_t shape[QKV_MAX_DIMS] = {0}, xstride[QKV_MAX_DIMS] = {0}, step[QKV_MAX_DIMS] = {0}, shape4[4], stride4[4];
    qkv_shape_strides_(x, xstride);
    for (int k = 0; k < nd; k++) {
        shape[k] = x->shape[perm[k]]; // y's axis k has the size of x's axis perm[k]...
        step[k] = xstride[perm[k]];   // ...and walks x by that axis's stride
    }
    qkv_tensor *y = qkv_new_tensor_(ctx, fn, x->dtype, nd, shape);
    if (!y) return NULL;
    // y[i] = x[sum_k i_k stride_x[perm[k]]]
    qkv_shape_pad4_(nd, shape, step, shape4, stride4);
    qkv_shape_copy_(y->data, x->data, qkv_dtype_size(x->dtype), shape4, stride4);
    qkv_tensor *in[1] = {x};
    if (qkv_is_float_(x->dtype) && qkv_needs_grad_(ctx, in, 1)) {
        permute_saved *s = qkv_arena_alloc_(ctx, fn, sizeof *s);
        if (!s) return NULL;
        memcpy(s->dims, perm, sizeof perm);
        qkv_node_ *node = qkv_record_(ctx, fn, permute_backward, y, in, 1);
        if (!node) return NULL;
        node->saved = s;
    }
    return y;
}

qkv_tensor *qkv_permute(qkv_ctx *ctx, qkv_tensor *x, const int *dims) {
    const char *fn = "qkv_permute";
    if (!ctx || ctx->status || !qkv_check_tensor_(ctx, fn, "x", x)) return NULL;
    if (!dims && x->ndim > 0)
        return qkv_fail_(ctx, QKV_ERR_NULL, "%s: x is %s, dims is NULL: it must hold %d axes", fn, QKV_SHAPE(x),
                         x->ndim);
    return permute(ctx, fn, x, dims);
}

qkv_tensor *qkv_transpose(qkv_ctx *ctx, qkv_tensor *x, int dim0, int dim1) {
    const char *fn = "qkv_transpose";
    if (!ctx || ctx->status || !qkv_check_tensor_(ctx, fn, "x", x)) return NULL;
    int a, b;
    if (!qkv_shape_axis_(ctx, fn, "dim0", dim0, "x", x, &a) || !qkv_shape_axis_(ctx, fn, "dim1", dim1, "x", x, &b))
        return NULL;
    // the identity with a and b swapped
    int dims[QKV_MAX_DIMS];
    for (int k = 0; k < x->ndim; k++) dims[k] = k == a ? b : k == b ? a : k;
    return permute(ctx, fn, x, dims);
}
