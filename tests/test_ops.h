/*
 * test_ops.h — what the operator tests share: reading any float element as a double, a tensor from
 * literal values, and the norm-wise relative error used for f32-against-f64 checks.
 */
#ifndef QKV_TEST_OPS_H
#define QKV_TEST_OPS_H

#include <criterion/criterion.h>
#include <math.h>

#include "qkv.h"

/* Element i of an f32 or f64 tensor, as a double. */
static inline double at(const qkv_tensor *t, int64_t i) {
    return t->dtype == QKV_F64 ? qkv_f64(t)[i] : (double)qkv_f32(t)[i];
}

/* A dt tensor of the given shape holding the values v (numel of them). */
static inline qkv_tensor *tensor_of(qkv_ctx *ctx, qkv_dtype dt, int ndim, const int64_t *shape,
                                    const double *v) {
    qkv_tensor *t = qkv_zeros(ctx, dt, ndim, shape);
    cr_assert_not_null(t, "%s", qkv_errmsg(ctx));
    for (int64_t i = 0; i < t->numel; i++) qkv_set_flat(ctx, t, i, v[i]);
    return t;
}

/* |x32 - x64| / |x64| over all elements (|x32 - x64| when x64 is all zeros). */
static inline double rel_norm_err(const qkv_tensor *x32, const qkv_tensor *x64) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < x64->numel; i++) {
        double d = at(x32, i) - at(x64, i);
        num += d * d;
        den += at(x64, i) * at(x64, i);
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
