/*
 * test_ops.h — what the operator tests share: reading any float element as a double, a tensor from
 * literal values, the norm-wise relative error used for f32-against-f64 checks, and the gradcheck over
 * a table of configurations (check_gradcheck_table), with the tally it keeps.
 */
#ifndef QKV_TEST_OPS_H
#define QKV_TEST_OPS_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

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
    char first[1024];
} gradcheck_tally;

/* Counts the configuration called name: it fails unless qkv_gradcheck returned OK, passed, and checked all
 * `want` elements. Returns whether it passed; a failure is logged, and the first one kept in t->first. */
static inline bool tally_gradcheck_named(gradcheck_tally *t, const char *name, qkv_status st, qkv_ctx *ctx,
                                         const qkv_gradcheck_result *r, int64_t want) {
    t->checked += r->checked;
    if (st == QKV_OK && r->passed && r->checked == want) return true;
    char story[sizeof t->first];
    snprintf(story, sizeof story, "%s: status %s (%s), checked %lld of %lld elements, %s", name,
             qkv_status_name(st), qkv_errmsg(ctx), (long long)r->checked, (long long)want, r->message);
    if (t->failed++ < 8) cr_log_error("%s", story);
    if (t->failed == 1) snprintf(t->first, sizeof t->first, "%s", story);
    return false;
}

/* Counts configuration c (named "config c"), as tally_gradcheck_named. */
static inline void tally_gradcheck(gradcheck_tally *t, int c, qkv_status st, qkv_ctx *ctx,
                                   const qkv_gradcheck_result *r, int64_t want) {
    char name[32];
    snprintf(name, sizeof name, "config %d", c);
    tally_gradcheck_named(t, name, st, ctx, r, want);
}

/* Every configuration passed, and more than min_checked elements were checked. */
static inline void expect_gradcheck_tally(const gradcheck_tally *t, int n_configs, int64_t min_checked) {
    cr_expect_eq(t->failed, 0, "%d of %d configurations failed; first: %s", t->failed, n_configs, t->first);
    cr_expect(t->checked > min_checked, "only %lld elements checked", (long long)t->checked);
}

/* ---- a gradcheck over a table of configurations ---------------------------------------------------- */

enum { GRADCHECK_MAX_INPUTS = 8 };

/* What run_gradcheck_table needs to know of a table. Configuration c runs in a fresh context made with
 * qkv_default_options() and seed + c, so no configuration sees another's tensors or errors. */
typedef struct gradcheck_table {
    int n_configs;
    uint64_t seed;
    /* Make configuration c's f64 inputs in ctx into in[] and return how many (1 to GRADCHECK_MAX_INPUTS).
     * *fn_user is user on entry: what it holds on return is the user pointer fn receives. Called for
     * c = 0, 1, ... in order, so user may carry state from one configuration to the next. */
    int (*build)(qkv_ctx *ctx, int c, void *user, qkv_tensor **in, void **fn_user);
    /* Configuration c in words (its shapes, mask, flags...), for the failure message. */
    void (*name)(char *buf, size_t size, int c, const void *user);
    qkv_gradcheck_fn fn;
    void *user;
    const qkv_gradcheck_options *options; /* NULL for qkv_gradcheck's defaults */
} gradcheck_table;

/* Run qkv_gradcheck on every configuration of the table (each must check every element of every checked
 * input) and expect all of them to pass, with more than min_checked elements checked in all. The failure
 * message names the first failing configuration; the first eight failures are logged. Returns the tally. */
static inline gradcheck_tally check_gradcheck_table(const gradcheck_table *t, int64_t min_checked) {
    gradcheck_tally tally = {0};
    for (int c = 0; c < t->n_configs; c++) {
        qkv_options o = qkv_default_options();
        o.seed = t->seed + (uint64_t)c;
        qkv_ctx *ctx = qkv_ctx_new(&o);
        cr_assert_not_null(ctx, "config %d: no context", c);
        qkv_tensor *in[GRADCHECK_MAX_INPUTS] = {0};
        void *fn_user = t->user;
        int n = t->build(ctx, c, t->user, in, &fn_user);
        cr_assert(n >= 1 && n <= GRADCHECK_MAX_INPUTS, "config %d: build made %d inputs", c, n);
        int64_t want = 0;
        for (int i = 0; i < n; i++)
            if (in[i] && (!t->options || !t->options->check || t->options->check[i])) want += in[i]->numel;
        qkv_gradcheck_result r;
        memset(&r, 0, sizeof r);
        qkv_status st = qkv_gradcheck(ctx, t->fn, in, n, fn_user, t->options, &r);
        char name[256];
        t->name(name, sizeof name, c, t->user);
        tally_gradcheck_named(&tally, name, st, ctx, &r, want);
        qkv_ctx_free(ctx);
    }
    expect_gradcheck_tally(&tally, t->n_configs, min_checked);
    return tally;
}

/* A misuse case's outcome: no result, the expected status, and each of up to 4 fragments (NULL ends them) in
 * the message. name labels the case in failures. */
static inline void expect_misuse(qkv_ctx *ctx, const char *name, const qkv_tensor *result, qkv_status status,
                                 const char *const *frag) {
    cr_expect_null(result, "%s: a result despite the error", name);
    cr_expect_eq(qkv_error(ctx), status, "%s: %s (%s)", name, qkv_status_name(qkv_error(ctx)), qkv_errmsg(ctx));
    for (int i = 0; i < 4 && frag[i]; i++)
        cr_expect(strstr(qkv_errmsg(ctx), frag[i]) != NULL, "%s: \"%s\" lacks \"%s\"", name, qkv_errmsg(ctx), frag[i]);
}

#ifdef QKV_TEST_DATA
/* tests/data/golden/<name>_<what>.npy, loaded (the test fails if it cannot be); NULL when optional and absent. */
static inline qkv_tensor *load_golden(qkv_ctx *ctx, const char *name, const char *what, bool optional) {
    char path[512];
    snprintf(path, sizeof path, "%s/golden/%s_%s.npy", QKV_TEST_DATA, name, what);
    if (optional) {
        FILE *f = fopen(path, "rb");
        if (!f) return NULL;
        fclose(f);
    }
    qkv_tensor *t = qkv_npy_load(ctx, path);
    cr_assert_not_null(t, "%s: %s", path, qkv_errmsg(ctx));
    return t;
}
#endif

#endif
