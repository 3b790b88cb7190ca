/*
 * clamp.c — qkv_clamp: y = min(max(x, lo), hi), elementwise.   x [...] -> y [...]
 * lo = -inf or hi = +inf clamps one side only. The gradient passes where lo <= x <= hi, the bounds included
 * (as PyTorch 1.13), and is 0 outside; a NaN x gives NaN with gradient 0 (as PyTorch). lo or hi NaN, or lo > hi, is
 * QKV_ERR_ARG (PyTorch would return hi everywhere for lo > hi).
 */
#include "qkv_internal.h"

#include <math.h>

// y = min(max(x, lo), hi)   (NaN stays NaN)
static double clamp_f(double x, const qkv_unary_params_ *p) { return x < p->a ? p->a : x > p->b ? p->b : x; }

// dy/dx = 1 for lo <= x <= hi, else 0
static double clamp_df(double x, double y, const qkv_unary_params_ *p) {
    (void)y;
    return x >= p->a && x <= p->b ? 1.0 : 0.0; /* 0 for a NaN x, as PyTorch */
}

QKV_UNARY_F32_LOOPS_(clamp, clamp_f, clamp_df)
static const qkv_unary_f32_ clamp_f32 = {-1, clamp_forward_f32, -1, clamp_backward_f32};

qkv_tensor *qkv_clamp(qkv_ctx *ctx, qkv_tensor *x, double lo, double hi) {
    const char *fn = "qkv_clamp";
    if (!ctx || ctx->status) return NULL;
    if (isnan(lo) || isnan(hi) || lo > hi)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: the bounds lo = %g, hi = %g must be numbers with lo <= hi", fn, lo,
                         hi);
    return qkv_unary_(ctx, fn, x, clamp_f, clamp_df, (qkv_unary_params_){lo, hi}, &clamp_f32);
}
