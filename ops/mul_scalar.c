/*
 * mul_scalar.c — qkv_mul_scalar: y = c x, elementwise, for a scalar c.   x [...] -> y [...]
 * Unlike qkv_scale (finite s only), c may be +-inf, as PyTorch's x * c (IEEE: 0 * inf is NaN); a NaN c is
 * QKV_ERR_ARG.
 */
#include "qkv_internal.h"

#include <math.h>

// y = c x
static double mul_scalar_f(double x, const qkv_unary_params_ *p) { return p->a * x; }

// dy/dx = c
static double mul_scalar_df(double x, double y, const qkv_unary_params_ *p) {
    (void)x, (void)y;
    return p->a;
}

// f32: y = c x in float when c is a float (qkv_internal.h's QKV_UNARY_F32_FLOAT_FORWARD_: the same bits); the
// backward dx += dy c in double (the product and the sum: two operations, which float would round twice)
static inline float mul_scalar_ff(float x, const qkv_unary_params_ *p) { return (float)p->a * x; }
QKV_UNARY_F32_FLOAT_FORWARD_(mul_scalar, mul_scalar_f, mul_scalar_ff, qkv_unary_scalar_is_float_)
QKV_UNARY_F32_BACKWARD_(mul_scalar, mul_scalar_df)
static const qkv_unary_f32_ mul_scalar_f32 = {-1, mul_scalar_forward_f32, -1, mul_scalar_backward_f32};

qkv_tensor *qkv_mul_scalar(qkv_ctx *ctx, qkv_tensor *x, double c) {
    const char *fn = "qkv_mul_scalar";
    if (!ctx || ctx->status) return NULL;
    if (isnan(c)) return qkv_fail_(ctx, QKV_ERR_ARG, "%s: the scalar c is NaN", fn);
    return qkv_unary_(ctx, fn, x, mul_scalar_f, mul_scalar_df, (qkv_unary_params_){c, 0}, &mul_scalar_f32);
}
