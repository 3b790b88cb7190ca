/*
 * unary.c — what the elementwise unary operators share (exp.c, log.c, ...: each gives its f and df): operand
 * checks, recording, and the backward dx += dy * df(x, y).
 *   x [...] -> y [...] (same shape)
 * f64: f and df with libm, on the tensors' arrays. f32: each operator's f32 path (qkv_unary_f32_) on the float
 * arrays, with no f64 copies: a map of ops/kernels/unary_kernels.h (SLEEF's float functions on AVX2 and
 * AVX-512) or the operator's own loop (f in double, rounded once: the f64 result rounded to float), and a
 * backward loop in double per element.
 */
#include "qkv_internal.h"

#include "kernels/unary_kernels.h"

typedef struct unary_saved {
    qkv_unary_df_ df;
    qkv_unary_params_ p;
    const qkv_unary_f32_ *f32;
} unary_saved;

// f32: s = the backward's map at x (if any), then dx += dy * df(x, y, s) on the float arrays (a fresh dx stored)
static void unary_backward_f32(qkv_ctx *ctx, qkv_node_ *node) {
    const unary_saved *sv = node->saved;
    qkv_tensor *x = node->in[0];
    bool fresh;
    qkv_tensor *dx = qkv_grad_to_write_(ctx, x, &fresh);
    const qkv_tensor *dy = node->out->grad;
    if (!dx) return;
    float *s = NULL;
    if (sv->f32->backward_map >= 0) {
        s = qkv_arena_array_(ctx, node->op, (size_t)x->numel + 1, sizeof(float));
        if (!s) return;
        qkv_unary_kernels_()->map((qkv_vf_)sv->f32->backward_map, x->data, s, x->numel, (float)(sv->p.a - 1.0));
    }
    sv->f32->backward(x->data, node->out->data, s, dy->data, dx->data, x->numel, &sv->p, fresh);
}

// dx += dy * df(x, y)
static void unary_backward(qkv_ctx *ctx, qkv_node_ *node) {
    const unary_saved *s = node->saved;
    qkv_tensor *x = node->in[0];
    if (x->dtype == QKV_F32 && s->f32) {
        unary_backward_f32(ctx, node);
        return;
    }
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
                       qkv_unary_params_ p, const qkv_unary_f32_ *f32) {
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "x", x)) return NULL;
    qkv_tensor *y = qkv_new_like_(ctx, fn, x);
    if (!y) return NULL;
    if (x->dtype == QKV_F32 && f32) { // y = f(x) on the float arrays
        if (f32->forward_map >= 0) qkv_unary_kernels_()->map((qkv_vf_)f32->forward_map, x->data, y->data, x->numel, (float)p.a);
        else f32->forward(x->data, y->data, x->numel, &p);
    } else {
        const double *xv = qkv_as_f64_(ctx, fn, x);
        double *yv = qkv_out_f64_(ctx, fn, y);
        if (!xv || !yv) return NULL;
        for (int64_t i = 0; i < x->numel; i++) yv[i] = f(xv[i], &p); // y = f(x)
        qkv_store_f64_(y, yv);
    }
    qkv_tensor *in[1] = {x};
    if (qkv_needs_grad_(ctx, in, 1)) {
        unary_saved *s = qkv_arena_alloc_(ctx, fn, sizeof *s);
        if (!s) return NULL;
        *s = (unary_saved){df, p, f32};
        qkv_node_ *node = qkv_record_(ctx, fn, unary_backward, y, in, 1);
        if (!node) return NULL;
        node->saved = s;
    }
    return y;
}
