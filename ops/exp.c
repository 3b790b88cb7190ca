/*
 * exp.c — qkv_exp, elementwise.   x [...] -> y [...]
 * y = e^x.  Overflows to +inf above about 709.78 (f64) / 88.72 (f32); underflows to 0.
 */
#include "qkv_internal.h"

#include "kernels/unary_kernels.h"

#include <math.h>

// y = exp(x)
static double exp_f(double x, const qkv_unary_params_ *p) {
    (void)p;
    return exp(x);
}

// dy/dx = e^x = y
static double exp_df(double x, double y, const qkv_unary_params_ *p) {
    (void)x, (void)y, (void)p;
    return y;
}

QKV_UNARY_F32_BACKWARD_(exp, exp_df)
static const qkv_unary_f32_ exp_f32 = {QKV_VF_EXP_, NULL, -1, exp_backward_f32}; // f32: SLEEF's map

qkv_tensor *qkv_exp(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_exp", x, exp_f, exp_df, (qkv_unary_params_){0, 0}, &exp_f32);
}
