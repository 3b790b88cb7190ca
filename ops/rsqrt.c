/*
 * rsqrt.c — qkv_rsqrt, elementwise.   x [...] -> y [...]
 * y = 1 / sqrt(x).  rsqrt 0 = +inf with gradient -inf (as PyTorch); x < 0 gives NaN.
 */
#include "qkv_internal.h"

#include <math.h>

// y = 1.0 / sqrt(x)
static double rsqrt_f(double x, const qkv_unary_params_ *p) {
    (void)p;
    return 1.0 / sqrt(x);
}

// dy/dx = -x^(-3/2) / 2 = -y^3 / 2
static double rsqrt_df(double x, double y, const qkv_unary_params_ *p) {
    (void)x, (void)y, (void)p;
    return -0.5 * y * y * y;
}

QKV_UNARY_F32_LOOPS_(rsqrt, rsqrt_f, rsqrt_df)
static const qkv_unary_f32_ rsqrt_f32 = {-1, rsqrt_forward_f32, -1, rsqrt_backward_f32};

qkv_tensor *qkv_rsqrt(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_rsqrt", x, rsqrt_f, rsqrt_df, (qkv_unary_params_){0, 0}, &rsqrt_f32);
}
