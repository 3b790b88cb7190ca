/*
 * neg.c — qkv_neg, elementwise.   x [...] -> y [...]
 * y = -x.
 */
#include "qkv_internal.h"

#include <math.h>

// y = -x
static double neg_f(double x, const qkv_unary_params_ *p) {
    (void)p;
    return -x;
}

// dy/dx = -1
static double neg_df(double x, double y, const qkv_unary_params_ *p) {
    (void)x, (void)y, (void)p;
    return -1.0;
}

qkv_tensor *qkv_neg(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_neg", x, neg_f, neg_df, (qkv_unary_params_){0, 0});
}
