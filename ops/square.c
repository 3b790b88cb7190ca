/*
 * square.c — qkv_square, elementwise.   x [...] -> y [...]
 * y = x^2.
 */
#include "qkv_internal.h"

#include <math.h>

// y = x * x
static double square_f(double x, const qkv_unary_params_ *p) {
    (void)p;
    return x * x;
}

// dy/dx = 2x
static double square_df(double x, double y, const qkv_unary_params_ *p) {
    (void)x, (void)y, (void)p;
    return 2.0 * x;
}

QKV_UNARY_F32_LOOPS_(square, square_f, square_df)
static const qkv_unary_f32_ square_f32 = {-1, square_forward_f32, -1, square_backward_f32};

qkv_tensor *qkv_square(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_square", x, square_f, square_df, (qkv_unary_params_){0, 0}, &square_f32);
}
