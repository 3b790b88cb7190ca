/*
 * sub.c — y = a - b, b of a's shape, a trailing-dimension bias, or one element.
 *   a [..., d], b [d] -> y [..., d]
 */
#include "qkv_internal.h"

// y[i] = a[i] - b[i % nb]
static void sub_forward(const double *a, const double *b, double *y, int64_t n, int64_t nb) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] - b[i % nb];
}

// the same in float, a row of nb at a time (nb divides n)
static void sub_forward_f32(const float *a, const float *b, float *y, int64_t n, int64_t nb) {
    for (int64_t r = 0; nb > 0 && r < n; r += nb)
        for (int64_t j = 0; j < nb; j++) y[r + j] = a[r + j] - b[j];
}

// da += dy;  db[j] -= sum over rows of dy
static void sub_backward(qkv_ctx *ctx, qkv_node_ *node) { qkv_linear_binary_backward_(ctx, node, -1.0); }

qkv_tensor *qkv_sub(qkv_ctx *ctx, qkv_tensor *a, qkv_tensor *b) {
    return qkv_binary_(ctx, "qkv_sub", a, b, sub_forward, sub_forward_f32, sub_backward);
}
