/*
 * reshape.c — y = a with a new shape of the same element count (a copy; tensors are contiguous, so the
 * flat order is unchanged).   a [...] -> y [new shape]
 */
#include "qkv_internal.h"

// da += dy (flat order is the same)
static void reshape_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *a = node->in[0];
    qkv_tensor *da = qkv_grad_of_(ctx, a);
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    if (da && dy) qkv_accumulate_f64_(da, dy);
}

qkv_tensor *qkv_reshape(qkv_ctx *ctx, qkv_tensor *a, int ndim, const int64_t *shape) {
    const char *fn = "qkv_reshape";
    if (!ctx || ctx->status || !qkv_check_tensor_(ctx, fn, "a", a)) return NULL;
    qkv_tensor *y = qkv_new_tensor_(ctx, fn, a->dtype, ndim, shape);
    if (!y) return NULL;
    if (y->numel != a->numel)
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "qkv_reshape: a is %s (%lld elements), new shape %s has %lld",
                         QKV_SHAPE(a), (long long)a->numel, QKV_SHAPE(y), (long long)y->numel);
    memcpy(y->data, a->data, (size_t)a->numel * qkv_dtype_size(a->dtype));
    qkv_tensor *in[1] = {a};
    if (qkv_is_float_(a->dtype) && qkv_needs_grad_(ctx, in, 1) &&
        !qkv_record_(ctx, fn, reshape_backward, y, in, 1))
        return NULL;
    return y;
}
