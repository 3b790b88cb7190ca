/*
 * mean.c — m = sum of every element of a / numel, a scalar.   a [...] -> m []
 * The reduction and its backward (da[i] += dm / numel) are sum's, with the factor 1/numel.
 * Of an empty a: 0 * (1/0) = NaN, as the header says and as PyTorch gives (torch.empty(0, 3).mean() is nan),
 * and a backward through it adds into no element.
 */
#include "qkv_internal.h"

qkv_tensor *qkv_mean(qkv_ctx *ctx, qkv_tensor *a) {
    if (!ctx || ctx->status || !qkv_check_float_(ctx, "qkv_mean", "a", a)) return NULL;
    return qkv_reduce_all_(ctx, "qkv_mean", a, 1.0 / (double)a->numel); // 1/0 = inf for an empty a
}
