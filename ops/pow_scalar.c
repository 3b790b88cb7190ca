/*
 * pow_scalar.c — qkv_pow_scalar: y = x^p for a scalar p, elementwise.   x [...] -> y [...]
 * As C's pow: a negative x with a non-integer p gives NaN; 0^p is 0 for p > 0 and +inf for p < 0; x^0 = 1 for
 * every x (NaN included). The gradient p x^(p-1) is +-inf at x = 0 for 0 < p < 1, and exactly 0 for p = 0 (as
 * PyTorch, which masks it). A NaN p is QKV_ERR_ARG.
 */
#include "qkv_internal.h"

#include "kernels/unary_kernels.h"

#include <math.h>

// y = x^p
static double pow_f(double x, const qkv_unary_params_ *p) { return pow(x, p->a); }

// dy/dx = p x^(p-1)   (0 when p = 0)
static double pow_df(double x, double y, const qkv_unary_params_ *p) {
    (void)y;
    return p->a == 0.0 ? 0.0 : p->a * pow(x, p->a - 1.0);
}

// f32: dx (+)= dy p s, s = x^(p-1) from unary_kernels.h's map (0 when p = 0)
QKV_VECTOR_LOOP
static void pow_backward_f32(const float *restrict x, const float *restrict y, const float *restrict s,
                             const float *restrict dy, float *restrict dx, int64_t n, const qkv_unary_params_ *p,
                             bool store) {
    (void)x, (void)y;
    if (p->a == 0.0) { // d(x^0)/dx = 0, also where x^-1 is inf
        for (int64_t i = 0; store && i < n; i++) dx[i] = 0.0f;
        return;
    }
    for (int64_t i = 0; i < n; i++) dx[i] = (float)((store ? 0.0 : (double)dx[i]) + (double)dy[i] * (p->a * (double)s[i]));
}
static const qkv_unary_f32_ pow_f32 = {QKV_VF_POW_, NULL, QKV_VF_POW_, pow_backward_f32};

qkv_tensor *qkv_pow_scalar(qkv_ctx *ctx, qkv_tensor *x, double p) {
    const char *fn = "qkv_pow_scalar";
    if (!ctx || ctx->status) return NULL;
    if (isnan(p)) return qkv_fail_(ctx, QKV_ERR_ARG, "%s: the exponent p is NaN", fn);
    return qkv_unary_(ctx, fn, x, pow_f, pow_df, (qkv_unary_params_){p, 0}, &pow_f32);
}
