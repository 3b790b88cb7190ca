/*
 * sinusoidal.c — the fixed position table of "Attention Is All You Need" (a tensor maker: no input, no
 * gradient).   n, d -> P [n, d]
 *   P[p, 2j] = sin(p w_j),  P[p, 2j + 1] = cos(p w_j),  w_j = 10000^(-2j/d)
 * An odd d is allowed: its last column (2j = d - 1) is a sin with no cos partner. Computed in double
 * (the angle from the integer position) and rounded once for f32. n, d >= 1; dtype f32 or f64.
 */
#include "qkv_internal.h"

#include <math.h>

qkv_tensor *qkv_sinusoidal_positions(qkv_ctx *ctx, int64_t n, int64_t d, qkv_dtype dtype) {
    const char *fn = "qkv_sinusoidal_positions";
    if (!ctx || ctx->status) return NULL;
    if (n < 1 || d < 1)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: n is %lld, d is %lld: both must be >= 1", fn, (long long)n,
                         (long long)d);
    if (!qkv_is_float_(dtype))
        return qkv_fail_(ctx, QKV_ERR_DTYPE, "%s: [%lld,%lld] of dtype %s: the table is f32 or f64", fn,
                         (long long)n, (long long)d, qkv_dtype_name(dtype));
    qkv_tensor *t = qkv_new_tensor_(ctx, fn, dtype, 2, (int64_t[]){n, d});
    if (!t) return NULL;
    double *v = qkv_out_f64_(ctx, fn, t);
    if (!v) return NULL;
    for (int64_t c = 0; c < d; c++) {
        double w = pow(10000.0, -(double)(c - c % 2) / (double)d); // w_j, 2j = c rounded down to even
        for (int64_t p = 0; p < n; p++) {
            double angle = (double)p * w;
            v[p * d + c] = c % 2 == 0 ? sin(angle) : cos(angle);
        }
    }
    qkv_store_f64_(t, v);
    return t;
}
