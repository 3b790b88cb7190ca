/*
 * pow_scalar.c — qkv_pow_scalar: y = x^p for a scalar p, elementwise.   x [...] -> y [...]
 * As C's pow: a negative x with a non-integer p gives NaN; 0^p is 0 for p > 0 and +inf for p < 0; x^0 = 1 for
 * every x (NaN included). The gradient p x^(p-1) is +-inf at x = 0 for 0 < p < 1, and exactly 0 for p = 0 (as
 * PyTorch, which masks it). A NaN p is QKV_ERR_ARG.
 */
#include "qkv_internal.h"

#include <math.h>

// y = x^p
static double pow_f(double x, const qkv_unary_params_ *p) { return pow(x, p->a); }

// dy/dx = p x^(p-1)   (0 when p = 0)
static double pow_df(double x, double y, const qkv_unary_params_ *p) {
    (void)y;
    return p->a == 0.0 ? 0.0 : p->a * pow(x, p->a - 1.0);
}

qkv_tensor *qkv_pow_scalar(qkv_ctx *ctx, qkv_tensor *x, double p) {
    const char *fn = "qkv_pow_scalar";
    if (!ctx || ctx->status) return NULL;
    if (isnan(p)) return qkv_fail_(ctx, QKV_ERR_ARG, "%s: the exponent p is NaN", fn);
    return qkv_unary_(ctx, fn, x, pow_f, pow_df, (qkv_unary_params_){p, 0});
}
