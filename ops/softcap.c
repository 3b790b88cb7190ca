/*
 * softcap.c — logit soft-capping, y = cap tanh(x / cap) (Gemma 2 caps attention logits at 50 and final
 * logits at 30), elementwise.   x [...] -> y [...] (same shape)
 * y is within (-cap, cap), close to x for |x| << cap; for |x| >> cap it saturates at +-cap and the gradient
 * goes to 0 (tanh(1e4 / 0.5) is 1 in double, so dx is exactly 0 there, never NaN).
 * cap must be finite and > 0 (QKV_ERR_ARG otherwise). Computed in double for f32 and f64.
 */
#include "qkv_internal.h"

#include <math.h>

// y = cap * tanh(x / cap)
static void softcap_kernel(const double *x, double cap, double *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = cap * tanh(x[i] / cap);
}

// dx += dy * (1 - tanh^2(x / cap))   (tanh recomputed from x: y rounded to f32 would lose it near +-cap)
static void softcap_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *x = node->in[0];
    qkv_tensor *dx = qkv_grad_of_(ctx, x);
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    const double *xv = qkv_as_f64_(ctx, node->op, x);
    double *work = qkv_arena_array_(ctx, node->op, (size_t)x->numel, sizeof(double));
    if (!dx || !dy || !xv || !work) return;
    const double cap = node->scalar;
    for (int64_t i = 0; i < x->numel; i++) {
        double t = tanh(xv[i] / cap);
        work[i] = dy[i] * (1.0 - t * t);
    }
    qkv_accumulate_f64_(dx, work);
}

qkv_tensor *qkv_softcap(qkv_ctx *ctx, qkv_tensor *x, double cap) {
    const char *fn = "qkv_softcap";
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "x", x)) return NULL;
    if (!isfinite(cap) || !(cap > 0))
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: x is %s, cap is %g: the cap must be finite and > 0", fn,
                         QKV_SHAPE(x), cap);
    qkv_tensor *y = qkv_new_like_(ctx, fn, x);
    if (!y) return NULL;
    const double *xv = qkv_as_f64_(ctx, fn, x);
    double *yv = qkv_out_f64_(ctx, fn, y);
    if (!xv || !yv) return NULL;
    softcap_kernel(xv, cap, yv, x->numel);
    qkv_store_f64_(y, yv);
    qkv_tensor *in[1] = {x};
    if (qkv_needs_grad_(ctx, in, 1)) {
        qkv_node_ *node = qkv_record_(ctx, fn, softcap_backward, y, in, 1);
        if (!node) return NULL;
        node->scalar = cap;
    }
    return y;
}
