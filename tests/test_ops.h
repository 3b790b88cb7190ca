/*
 * test_ops.h — what the operator tests share: reading any float element as a double, a tensor from
 * literal values, the norm-wise relative error used for f32-against-f64 checks, and the tally of a
 * gradcheck over a table of configurations.
 */
#ifndef QKV_TEST_OPS_H
#define QKV_TEST_OPS_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>

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

/* The tally of a gradcheck over a table of configurations: how many failed, the first failure's story, and
 * how many elements were checked in all. */
typedef struct gradcheck_tally {
    int failed;
    int64_t checked;
    char first[512];
} gradcheck_tally;

/* Counts configuration c: it fails unless qkv_gradcheck returned OK, passed, and checked all `want` elements. */
static inline void tally_gradcheck(gradcheck_tally *t, int c, qkv_status st, qkv_ctx *ctx,
                                   const qkv_gradcheck_result *r, int64_t want) {
    t->checked += r->checked;
    if (st == QKV_OK && r->passed && r->checked == want) return;
    if (!t->failed++)
        snprintf(t->first, sizeof t->first, "config %d: status %s (%s), %s", c, qkv_status_name(st), qkv_errmsg(ctx),
                 r->message);
}

/* Every configuration passed, and more than min_checked elements were checked. */
static inline void expect_gradcheck_tally(const gradcheck_tally *t, int n_configs, int64_t min_checked) {
    cr_expect_eq(t->failed, 0, "%d of %d configurations failed; first: %s", t->failed, n_configs, t->first);
    cr_expect(t->checked > min_checked, "only %lld elements checked", (long long)t->checked);
}

#endif
