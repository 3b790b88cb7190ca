/*
 * scale.c — y = s x for a finite scalar s (the 1/sqrt(d_k) step of attention; s = 1 copies, s = 0 is
 * legal and gives zeros for finite x).   x [...] -> y [...] (same shape)
 * A NaN or infinite s is QKV_ERR_ARG: it would turn every score into NaN or inf without a trace.
 */
#include "qkv_internal.h"

#include <math.h>

// y = s * x, computed in double
static void scale_kernel(const double *x, double s, double *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = s * x[i];
}

// f32: y = s x in double, rounded once (the f64 kernel's result rounded to float), on the float arrays
QKV_VECTOR_LOOP
static void scale_op_f32(const float *restrict x, double s, float *restrict y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = (float)(s * (double)x[i]);
}

// f32: dx += s dy in double, rounded once; a new gradient (fresh) is stored as 0 + s dy, the bits of adding
// into zeros, without reading them
QKV_VECTOR_LOOP
static void scale_op_backward_f32(const float *restrict dy, double s, float *restrict dx, int64_t n, bool fresh) {
    if (fresh)
        for (int64_t i = 0; i < n; i++) dx[i] = (float)(0.0 + s * (double)dy[i]);
    else
        for (int64_t i = 0; i < n; i++) dx[i] = (float)((double)dx[i] + s * (double)dy[i]);
}

// dx += s * dy
static void scale_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *x = node->in[0];
    if (x->dtype == QKV_F32) {
        bool fresh;
        qkv_tensor *dx = qkv_grad_to_write_(ctx, x, &fresh);
        if (dx) scale_op_backward_f32(node->out->grad->data, node->scalar, dx->data, x->numel, fresh);
        return;
    }
    qkv_tensor *dx = qkv_grad_of_(ctx, x);
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    double *work = qkv_arena_array_(ctx, node->op, (size_t)x->numel, sizeof(double));
    if (!dx || !dy || !work) return;
    scale_kernel(dy, node->scalar, work, x->numel);
    qkv_accumulate_f64_(dx, work);
}

qkv_tensor *qkv_scale(qkv_ctx *ctx, qkv_tensor *x, double s) {
    const char *fn = "qkv_scale";
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "x", x)) return NULL;
    if (!isfinite(s))
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: x is %s, s is %g: the scale must be finite", fn, QKV_SHAPE(x),
                         s);
    qkv_tensor *y = qkv_new_like_(ctx, fn, x);
    if (!y) return NULL;
    if (x->dtype == QKV_F32) {
        scale_op_f32(x->data, s, y->data, x->numel);
    } else {
        const double *xv = qkv_as_f64_(ctx, fn, x);
        double *yv = qkv_out_f64_(ctx, fn, y);
        if (!xv || !yv) return NULL;
        scale_kernel(xv, s, yv, x->numel);
        qkv_store_f64_(y, yv);
    }
    qkv_tensor *in[1] = {x};
    if (qkv_needs_grad_(ctx, in, 1)) {
        qkv_node_ *node = qkv_record_(ctx, fn, scale_backward, y, in, 1);
        if (!node) return NULL;
        node->scalar = s;
    }
    return y;
}
