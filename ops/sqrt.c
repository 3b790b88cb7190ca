/*
 * sqrt.c — qkv_sqrt, elementwise.   x [...] -> y [...]
 * y = sqrt(x).  sqrt 0 = 0 with gradient +inf (as PyTorch); x < 0 gives NaN.
 */
#include "qkv_internal.h"

#include <math.h>

// y = sqrt(x)
static double sqrt_f(double x, const qkv_unary_params_ *p) {
    (void)p;
    return sqrt(x);
}

// dy/dx = 1 / (2 sqrt x) = 0.5 / y
static double sqrt_df(double x, double y, const qkv_unary_params_ *p) {
    (void)x, (void)y, (void)p;
    return 0.5 / y;
}

// f32: y = sqrt(x) in float (qkv_internal.h's QKV_UNARY_F32_FLOAT_FORWARD_: the same bits); the backward
// dx += dy (0.5 / y) in double (three operations)
static inline float sqrt_ff(float x, const qkv_unary_params_ *p) {
    (void)p;
    return sqrtf(x);
}
QKV_UNARY_F32_FLOAT_FORWARD_(sqrt, sqrt_f, sqrt_ff, qkv_unary_float_always_)
QKV_UNARY_F32_BACKWARD_(sqrt, sqrt_df)
static const qkv_unary_f32_ sqrt_f32 = {-1, sqrt_forward_f32, -1, sqrt_backward_f32};

qkv_tensor *qkv_sqrt(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_sqrt", x, sqrt_f, sqrt_df, (qkv_unary_params_){0, 0}, &sqrt_f32);
}
