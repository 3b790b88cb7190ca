/*
 * dropout.c — inverted dropout.   x [...] -> y [...] (same shape), or x itself.
 * Each element is kept with probability 1 - p (the context RNG draws u in [0, 1) per element, in flat order;
 * kept when u >= p) and then scaled: y = x / (1 - p); a dropped element is 0. The same seed gives the same
 * mask. The mask (u8, one byte per element) is kept for the backward. p = 0, or gradient recording off
 * (evaluation), returns x itself and draws nothing. p must be in [0, 1) (QKV_ERR_ARG otherwise, NaN too);
 * it is checked even when x is returned unchanged.
 */
#include "qkv_internal.h"

#include <math.h>

// dx += keep ? dy / (1 - p) : 0   (a dropped element's dy is never read)
static void dropout_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *x = node->in[0];
    const uint8_t *keep = node->saved;
    qkv_tensor *dx = qkv_grad_of_(ctx, x);
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    double *work = qkv_arena_array_(ctx, node->op, (size_t)x->numel, sizeof(double));
    if (!dx || !dy || !work) return;
    const double q = 1.0 - node->scalar;
    for (int64_t i = 0; i < x->numel; i++) work[i] = keep[i] ? dy[i] / q : 0.0;
    qkv_accumulate_f64_(dx, work);
}

qkv_tensor *qkv_dropout(qkv_ctx *ctx, qkv_tensor *x, double p) {
    const char *fn = "qkv_dropout";
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "x", x)) return NULL;
    if (!(p >= 0 && p < 1))
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: x is %s, p is %g: the drop probability must be in [0, 1)", fn,
                         QKV_SHAPE(x), p);
    if (p == 0 || !ctx->grad_enabled) return x;
    qkv_tensor *y = qkv_new_like_(ctx, fn, x);
    uint8_t *keep = qkv_arena_array_(ctx, fn, (size_t)x->numel, 1);
    if (!y || !keep) return NULL;
    const double *xv = qkv_as_f64_(ctx, fn, x);
    double *yv = qkv_out_f64_(ctx, fn, y);
    if (!xv || !yv) return NULL;
    // keep_i = (u_i >= p), u_i ~ U[0, 1);  y = keep ? x / (1 - p) : 0
    const double q = 1.0 - p;
    for (int64_t i = 0; i < x->numel; i++) {
        keep[i] = qkv_rng_uniform_(ctx) >= p;
        yv[i] = keep[i] ? xv[i] / q : 0.0;
    }
    qkv_store_f64_(y, yv);
    qkv_tensor *in[1] = {x};
    if (qkv_needs_grad_(ctx, in, 1)) {
        qkv_node_ *node = qkv_record_(ctx, fn, dropout_backward, y, in, 1);
        if (!node) return NULL;
        node->scalar = p;
        node->saved = keep;
    }
    return y;
}
