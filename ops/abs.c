/*
 * abs.c — qkv_abs, elementwise.   x [...] -> y [...]
 * y = |x|.  The gradient at the kink x = 0 is 0 (sign 0, as PyTorch).
 */
#include "qkv_internal.h"

#include <math.h>

// y = fabs(x)
static double abs_f(double x, const qkv_unary_params_ *p) {
    (void)p;
    return fabs(x);
}

// dy/dx = sign(x) (0 at 0, and at NaN, as PyTorch)
static double abs_df(double x, double y, const qkv_unary_params_ *p) {
    (void)x, (void)y, (void)p;
    return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
}

QKV_UNARY_F32_LOOPS_(abs, abs_f, abs_df)
static const qkv_unary_f32_ abs_f32 = {-1, abs_forward_f32, -1, abs_backward_f32};

qkv_tensor *qkv_abs(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_abs", x, abs_f, abs_df, (qkv_unary_params_){0, 0}, &abs_f32);
}
