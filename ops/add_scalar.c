/*
 * add_scalar.c — qkv_add_scalar: y = x + c, elementwise, for a scalar c.   x [...] -> y [...]
 * c may be +-inf (IEEE: inf + -inf is NaN); a NaN c is QKV_ERR_ARG (a bug, never a request).
 */
#include "qkv_internal.h"

#include <math.h>

// y = x + c
static double add_scalar_f(double x, const qkv_unary_params_ *p) { return x + p->a; }

// dy/dx = 1
static double add_scalar_df(double x, double y, const qkv_unary_params_ *p) {
    (void)x, (void)y, (void)p;
    return 1.0;
}

qkv_tensor *qkv_add_scalar(qkv_ctx *ctx, qkv_tensor *x, double c) {
    const char *fn = "qkv_add_scalar";
    if (!ctx || ctx->status) return NULL;
    if (isnan(c)) return qkv_fail_(ctx, QKV_ERR_ARG, "%s: the scalar c is NaN", fn);
    return qkv_unary_(ctx, fn, x, add_scalar_f, add_scalar_df, (qkv_unary_params_){c, 0});
}
