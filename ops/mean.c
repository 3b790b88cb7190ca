/*
 * mean.c — m = sum of every element of a / numel, a scalar.   a [...] -> m []
 * The reduction and its backward (da[i] += dm / numel) are sum's, with the factor 1/numel.
 */
#include "qkv_internal.h"

qkv_tensor *qkv_mean(qkv_ctx *ctx, qkv_tensor *a) {
    if (!ctx || ctx->status || !qkv_check_float_(ctx, "qkv_mean", "a", a)) return NULL;
    if (a->numel == 0)
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "qkv_mean: a is %s, the mean of no elements is undefined",
                         QKV_SHAPE(a));
    return qkv_reduce_all_(ctx, "qkv_mean", a, 1.0 / (double)a->numel);
}
