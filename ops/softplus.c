/*
 * softplus.c — qkv_softplus, elementwise.   x [...] -> y [...]
 * y = ln(1 + e^x) = max(x, 0) + log1p(e^-|x|), exact at every x. PyTorch's default (threshold 20)
 * returns x itself for x > 20, a relative difference below 1e-9 there; with threshold=inf they agree.
 */
#include "qkv_internal.h"

#include "kernels/unary_kernels.h"

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

// f32: dx (+)= dy s, s = sigmoid(x) from unary_kernels.h's map
QKV_VECTOR_LOOP
static void softplus_backward_f32(const float *restrict x, const float *restrict y, const float *restrict s,
                                  const float *restrict dy, float *restrict dx, int64_t n, const qkv_unary_params_ *p,
                                  bool store) {
    (void)x, (void)y, (void)p;
    for (int64_t i = 0; i < n; i++) dx[i] = (float)((store ? 0.0 : (double)dx[i]) + (double)dy[i] * (double)s[i]);
}
static const qkv_unary_f32_ softplus_f32 = {QKV_VF_SOFTPLUS_, NULL, QKV_VF_SIGMOID_, softplus_backward_f32};

qkv_tensor *qkv_softplus(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_softplus", x, softplus_f, softplus_df, (qkv_unary_params_){0, 0}, &softplus_f32);
}
