/*
 * unary.c — what the elementwise unary operators share (exp.c, log.c, ...: each gives its f and df): operand
 * checks, the f64 working buffers, recording, and the backward dx += dy * df(x, y).
 *   x [...] -> y [...] (same shape)
 * Values are computed in double: an f32 x is widened and y rounded once to float, so f32 results are the
 * correctly rounded f64 results wherever the libm function is.
 */
#include "qkv_internal.h"

typedef struct unary_saved {
    qkv_unary_df_ df;
    qkv_unary_params_ p;
} unary_saved;

// dx += dy * df(x, y)
static void unary_backward(qkv_ctx *ctx, qkv_node_ *node) {
    const unary_saved *s = node->saved;
    qkv_tensor *x = node->in[0];
    qkv_tensor *dx = qkv_grad_of_(ctx, x);
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    const double *xv = qkv_as_f64_(ctx, node->op, x);
    const double *yv = qkv_as_f64_(ctx, node->op, node->out);
    double *work = qkv_arena_array_(ctx, node->op, (size_t)x->numel, sizeof(double));
    if (!dx || !dy || !xv || !yv || !work) return;
    for (int64_t i = 0; i < x->numel; i++) work[i] = dy[i] * s->df(xv[i], yv[i], &s->p);
    qkv_accumulate_f64_(dx, work);
}

qkv_tensor *qkv_unary_(qkv_ctx *ctx, const char *fn, qkv_tensor *x, qkv_unary_f_ f, qkv_unary_df_ df,
                       qkv_unary_params_ p) {
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "x", x)) return NULL;
    qkv_tensor *y = qkv_new_like_(ctx, fn, x);
    if (!y) return NULL;
    const double *xv = qkv_as_f64_(ctx, fn, x);
    double *yv = qkv_out_f64_(ctx, fn, y);
    if (!xv || !yv) return NULL;
    for (int64_t i = 0; i < x->numel; i++) yv[i] = f(xv[i], &p); // y = f(x)
    qkv_store_f64_(y, yv);
    qkv_tensor *in[1] = {x};
    if (qkv_needs_grad_(ctx, in, 1)) {
        unary_saved *s = qkv_arena_alloc_(ctx, fn, sizeof *s);
        if (!s) return NULL;
        *s = (unary_saved){df, p};
        qkv_node_ *node = qkv_record_(ctx, fn, unary_backward, y, in, 1);
        if (!node) return NULL;
        node->saved = s;
    }
    return y;
}
