/*
 * softplus.c — qkv_softplus, elementwise.   x [...] -> y [...]
 * y = ln(1 + e^x) = max(x, 0) + log1p(e^-|x|), exact at every x. PyTorch's default (threshold 20)
 * returns x itself for x > 20, a relative difference below 1e-9 there; with threshold=inf they agree.
 */
#include "qkv_internal.h"

#include <math.h>

// y = fmax(x, 0.0) + log1p(exp(-fabs(x)))
static double softplus_f(double x, const qkv_unary_params_ *p) {
    (void)p;
    return fmax(x, 0.0) + log1p(exp(-fabs(x)));
}

// dy/dx = sigmoid(x)
static double softplus_df(double x, double y, const qkv_unary_params_ *p) {
    (void)x, (void)y, (void)p;
    return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
}

qkv_tensor *qkv_softplus(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_softplus", x, softplus_f, softplus_df, (qkv_unary_params_){0, 0});
}
