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

QKV_UNARY_F32_LOOPS_(neg, neg_f, neg_df)
static const qkv_unary_f32_ neg_f32 = {-1, neg_forward_f32, -1, neg_backward_f32};

qkv_tensor *qkv_neg(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_neg", x, neg_f, neg_df, (qkv_unary_params_){0, 0}, &neg_f32);
}
