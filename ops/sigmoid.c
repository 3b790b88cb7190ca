/*
 * sigmoid.c — qkv_sigmoid, elementwise.   x [...] -> y [...]
 * y = 1 / (1 + e^-x), written so that neither side overflows: e^x / (1 + e^x) for x < 0.
 */
#include "qkv_internal.h"

#include "kernels/unary_kernels.h"

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

QKV_UNARY_F32_BACKWARD_(sigmoid, sigmoid_df)
static const qkv_unary_f32_ sigmoid_f32 = {QKV_VF_SIGMOID_, NULL, -1, sigmoid_backward_f32}; // f32: SLEEF's map

qkv_tensor *qkv_sigmoid(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_sigmoid", x, sigmoid_f, sigmoid_df, (qkv_unary_params_){0, 0}, &sigmoid_f32);
}
