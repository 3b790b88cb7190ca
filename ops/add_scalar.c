/*
 * add_scalar.c — qkv_add_scalar: y = x + c, elementwise, for a scalar c.   x [...] -> y [...]
 * c may be +-inf (IEEE: inf + -inf is NaN); a NaN c is QKV_ERR_ARG (a bug, never a request).
 */
#include "qkv_internal.h"

#include <math.h>

// y = x + c
static double add_scalar_f(double x, const qkv_unary_params_ *p) { return x + p->a; }

// dy/dx = 1
static double add_scalar_df(double x, double y, const qkv_unary_params_ *p) {
    (void)x, (void)y, (void)p;
    return 1.0;
}

QKV_UNARY_F32_LOOPS_(add_scalar, add_scalar_f, add_scalar_df)
static const qkv_unary_f32_ add_scalar_f32 = {-1, add_scalar_forward_f32, -1, add_scalar_backward_f32};

qkv_tensor *qkv_add_scalar(qkv_ctx *ctx, qkv_tensor *x, double c) {
    const char *fn = "qkv_add_scalar";
    if (!ctx || ctx->status) return NULL;
    if (isnan(c)) return qkv_fail_(ctx, QKV_ERR_ARG, "%s: the scalar c is NaN", fn);
    return qkv_unary_(ctx, fn, x, add_scalar_f, add_scalar_df, (qkv_unary_params_){c, 0}, &add_scalar_f32);
}
