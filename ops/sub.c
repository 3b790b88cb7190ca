/*
 * sub.c — y = a - b, b of a's shape, a trailing-dimension bias, or one element.
 *   a [..., d], b [d] -> y [..., d]
 */
#include "qkv_internal.h"

// y[i] = a[i] - b[i % nb]
static void sub_forward(const double *a, const double *b, double *y, int64_t n, int64_t nb) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] - b[i % nb];
}

// da += dy;  db[j] -= sum over rows of dy
static void sub_backward(qkv_ctx *ctx, qkv_node_ *node) { qkv_linear_binary_backward_(ctx, node, -1.0); }

qkv_tensor *qkv_sub(qkv_ctx *ctx, qkv_tensor *a, qkv_tensor *b) {
    return qkv_binary_(ctx, "qkv_sub", a, b, sub_forward, sub_backward);
}
