/*
 * relu.c — y = max(x, 0), elementwise.   x [...] -> y [...] (same shape)
 * The gradient at x = 0 is 0, as PyTorch's. A NaN x gives NaN in y and in dx (the derivative there is
 * undefined), so anomaly mode stops at qkv_relu instead of a zero hiding the NaN.
 */
#include "qkv_internal.h"

#include <math.h>

// y = x > 0 ? x : 0 (NaN stays NaN)
static void relu_kernel(const double *x, double *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : (x[i] <= 0 ? 0.0 : x[i]);
}

// dx += dy * (x > 0)   (NaN where x is NaN)
static void relu_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *x = node->in[0];
    qkv_tensor *dx = qkv_grad_of_(ctx, x);
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    const double *xv = qkv_as_f64_(ctx, node->op, x);
    double *work = qkv_arena_array_(ctx, node->op, (size_t)x->numel, sizeof(double));
    if (!dx || !dy || !xv || !work) return;
    for (int64_t i = 0; i < x->numel; i++) work[i] = xv[i] > 0 ? dy[i] : (xv[i] <= 0 ? 0.0 : xv[i]);
    qkv_accumulate_f64_(dx, work);
}

qkv_tensor *qkv_relu(qkv_ctx *ctx, qkv_tensor *x) {
    const char *fn = "qkv_relu";
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "x", x)) return NULL;
    qkv_tensor *y = qkv_new_like_(ctx, fn, x);
    if (!y) return NULL;
    const double *xv = qkv_as_f64_(ctx, fn, x);
    double *yv = qkv_out_f64_(ctx, fn, y);
    if (!xv || !yv) return NULL;
    relu_kernel(xv, yv, x->numel);
    qkv_store_f64_(y, yv);
    qkv_tensor *in[1] = {x};
    if (qkv_needs_grad_(ctx, in, 1) && !qkv_record_(ctx, fn, relu_backward, y, in, 1)) return NULL;
    return y;
}
