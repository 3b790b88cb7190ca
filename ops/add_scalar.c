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

// f32, in float when c is a float (qkv_internal.h's QKV_UNARY_F32_FLOAT_*: the same bits):  y = x + c;  dx += dy
static inline float add_scalar_ff(float x, const qkv_unary_params_ *p) { return x + (float)p->a; }
static inline float add_scalar_fdy(float x, float dy, const qkv_unary_params_ *p) {
    (void)x, (void)p;
    return dy;
}
QKV_UNARY_F32_FLOAT_FORWARD_(add_scalar, add_scalar_f, add_scalar_ff, qkv_unary_scalar_is_float_)
QKV_UNARY_F32_FLOAT_BACKWARD_(add_scalar, add_scalar_fdy)
static const qkv_unary_f32_ add_scalar_f32 = {-1, add_scalar_forward_f32, -1, add_scalar_backward_f32};

qkv_tensor *qkv_add_scalar(qkv_ctx *ctx, qkv_tensor *x, double c) {
    const char *fn = "qkv_add_scalar";
    if (!ctx || ctx->status) return NULL;
    if (isnan(c)) return qkv_fail_(ctx, QKV_ERR_ARG, "%s: the scalar c is NaN", fn);
    return qkv_unary_(ctx, fn, x, add_scalar_f, add_scalar_df, (qkv_unary_params_){c, 0}, &add_scalar_f32);
}
