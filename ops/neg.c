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

// f32, in float (qkv_internal.h's QKV_UNARY_F32_FLOAT_*: the same bits):  y = -x;  dx += -dy
static inline float neg_ff(float x, const qkv_unary_params_ *p) {
    (void)p;
    return -x;
}
static inline float neg_fdy(float x, float dy, const qkv_unary_params_ *p) {
    (void)x, (void)p;
    return -dy;
}
QKV_UNARY_F32_FLOAT_FORWARD_(neg, neg_f, neg_ff, qkv_unary_float_always_)
QKV_UNARY_F32_FLOAT_BACKWARD_(neg, neg_fdy)
static const qkv_unary_f32_ neg_f32 = {-1, neg_forward_f32, -1, neg_backward_f32};

qkv_tensor *qkv_neg(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_neg", x, neg_f, neg_df, (qkv_unary_params_){0, 0}, &neg_f32);
}
