/*
 * sigmoid.c — qkv_sigmoid, elementwise.   x [...] -> y [...]
 * y = 1 / (1 + e^-x), written so that neither side overflows: e^x / (1 + e^x) for x < 0.
 */
#include "qkv_internal.h"

#include <math.h>

// y = x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x))
static double sigmoid_f(double x, const qkv_unary_params_ *p) {
    (void)p;
    return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
}

// dy/dx = y (1 - y)
static double sigmoid_df(double x, double y, const qkv_unary_params_ *p) {
    (void)x, (void)y, (void)p;
    return y * (1.0 - y);
}

qkv_tensor *qkv_sigmoid(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_sigmoid", x, sigmoid_f, sigmoid_df, (qkv_unary_params_){0, 0});
}
