/*
 * tanh.c — qkv_tanh, elementwise.   x [...] -> y [...]
 * y = tanh(x).  Saturates to +-1 (gradient 0) beyond |x| of about 19 (f64).
 */
#include "qkv_internal.h"

#include "kernels/unary_kernels.h"

#include <math.h>

// y = tanh(x)
static double tanh_f(double x, const qkv_unary_params_ *p) {
    (void)p;
    return tanh(x);
}

// dy/dx = 1 - tanh^2 x = 1 - y^2
static double tanh_df(double x, double y, const qkv_unary_params_ *p) {
    (void)x, (void)y, (void)p;
    return 1.0 - y * y;
}

QKV_UNARY_F32_BACKWARD_(tanh, tanh_df)
static const qkv_unary_f32_ tanh_f32 = {QKV_VF_TANH_, NULL, -1, tanh_backward_f32}; // f32: SLEEF's map

qkv_tensor *qkv_tanh(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_tanh", x, tanh_f, tanh_df, (qkv_unary_params_){0, 0}, &tanh_f32);
}
