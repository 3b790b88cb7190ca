/*
 * mean_dim.c — qkv_mean_dim: y = the mean of x along one axis.   x [outer, n, inner] -> y [outer, inner]
 * sum_dim's reduction with the factor 1/n (its backward: dx += dy / n). An empty axis gives NaN (0 / 0, as
 * PyTorch).
 */
#include "qkv_internal.h"

qkv_tensor *qkv_mean_dim(qkv_ctx *ctx, qkv_tensor *x, int axis, bool keepdim) {
    return qkv_sum_dim_scaled_(ctx, "qkv_mean_dim", x, axis, keepdim, true);
}
