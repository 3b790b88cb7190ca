/*
 * log.c — qkv_log, elementwise.   x [...] -> y [...]
 * y = ln x.  log 0 = -inf with gradient dy / 0 = +inf (a dy of 0 gives NaN, as PyTorch); x < 0 gives NaN.
 */
#include "qkv_internal.h"

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

qkv_tensor *qkv_log(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_log", x, log_f, log_df, (qkv_unary_params_){0, 0});
}
