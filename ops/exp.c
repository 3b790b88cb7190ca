/*
 * exp.c — qkv_exp, elementwise.   x [...] -> y [...]
 * y = e^x.  Overflows to +inf above about 709.78 (f64) / 88.72 (f32); underflows to 0.
 */
#include "qkv_internal.h"

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

qkv_tensor *qkv_exp(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_exp", x, exp_f, exp_df, (qkv_unary_params_){0, 0});
}
