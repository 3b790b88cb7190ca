/*
 * log.c — qkv_log, elementwise.   x [...] -> y [...]
 * y = ln x.  log 0 = -inf with gradient dy / 0 = +inf (a dy of 0 gives NaN, as PyTorch); x < 0 gives NaN.
 */
#include "qkv_internal.h"

#include "kernels/unary_kernels.h"

#include <math.h>

// y = log(x)
static double log_f(double x, const qkv_unary_params_ *p) {
    (void)p;
    return log(x);
}

// dy/dx = 1 / x
static double log_df(double x, double y, const qkv_unary_params_ *p) {
    (void)x, (void)y, (void)p;
    return 1.0 / x;
}

QKV_UNARY_F32_BACKWARD_(log, log_df)
static const qkv_unary_f32_ log_f32 = {QKV_VF_LOG_, NULL, -1, log_backward_f32}; // f32: SLEEF's map

qkv_tensor *qkv_log(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_log", x, log_f, log_df, (qkv_unary_params_){0, 0}, &log_f32);
}
