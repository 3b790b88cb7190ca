/*
 * test_embed_norm_gelu.c — qkv_embedding, qkv_layer_norm, qkv_rms_norm and qkv_gelu: gradcheck over more
 * than 20 configurations each (batch and no batch, d = 1, odd d, repeated ids, constant rows, tiny eps with
 * a constant row, |x| ~ 1e4 and ~ 1e-8, NULL gamma / beta), values written out by hand, f32 against f64,
 * the embedding's scatter (repeated ids sum; the same bits with 1 and 2 threads; ids changed after the
 * forward do not move the backward), and bad arguments.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv.h"
#include "qkv_internal.h"
#include "test_ops.h"

#include "../ops/kernels/gelu_kernels.h"
#include "../ops/kernels/layer_norm_kernels.h"
#include "elementwise_cases.h" /* GELU and layer-norm sets compared bit for bit */

/* A small deterministic generator for test data (independent of the library's RNG). */
static uint64_t lcg_state = 0x2545F4914F6CDD1Dull;
static double urand(void) { /* [0, 1) */
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg_state >> 11) * 0x1.0p-53;
}
static double nrand(void) { /* N(0, 1), Box-Muller */
    double u = urand(), v = urand();
    return sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * v);
}

/* tally_gradcheck, with the configuration's name at the front of the first failure's story. */
static void tally_named(gradcheck_tally *t, const char *name, int c, qkv_status st, qkv_ctx *ctx,
                        const qkv_gradcheck_result *r, int64_t want) {
    int before = t->failed;
    tally_gradcheck(t, c, st, ctx, r, want);
    if (before == 0 && t->failed == 1) {
        char story[sizeof t->first];
        snprintf(story, sizeof story, "[%.60s] %.440s", name, t->first);
        memcpy(t->first, story, sizeof story);
    }
}

static qkv_ctx *new_ctx(uint64_t seed, int threads) {
    qkv_options o = qkv_default_options();
    o.seed = seed;
    o.threads = threads;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    cr_assert_not_null(ctx);
    return ctx;
}

/* ---- value patterns for x ------------------------------------------------------------------------ */

typedef enum {
    X_NORMAL,     /* N(0, 1)                                                            */
    X_CONST_ROWS, /* every other row constant (0.75), the others N(0, 1)                */
    X_ZERO_ROWS,  /* every other row zero                                               */
    X_LARGE,      /* 1e4 N(0, 1)                                                        */
    X_OFFSET,     /* 1e4 + N(0, 1): a large mean over a small spread                    */
    X_TINY,       /* 1e-8 N(0, 1)                                                       */
    X_WIDE,       /* uniform in [-10, 10]                                               */
} x_kind;

static void fill_x(qkv_tensor *x, x_kind kind) {
    int64_t d = x->shape[x->ndim - 1];
    double *v = qkv_f64(x);
    for (int64_t i = 0; i < x->numel; i++) {
        int64_t row = d ? i / d : 0;
        double z = nrand();
        switch (kind) {
        case X_NORMAL: v[i] = z; break;
        case X_CONST_ROWS: v[i] = row % 2 == 0 ? 0.75 : z; break;
        case X_ZERO_ROWS: v[i] = row % 2 == 0 ? 0.0 : z; break;
        case X_LARGE: v[i] = 1e4 * z; break;
        case X_OFFSET: v[i] = 1e4 + z; break;
        case X_TINY: v[i] = 1e-8 * z; break;
        case X_WIDE: v[i] = -10.0 + 20.0 * urand(); break;
        }
    }
}

static qkv_tensor *new_f64(qkv_ctx *ctx, int ndim, const int64_t *shape) {
    qkv_tensor *t = qkv_zeros(ctx, QKV_F64, ndim, shape);
    cr_assert_not_null(t, "%s", qkv_errmsg(ctx));
    return t;
}

/* ---- gradcheck: layer norm and RMS norm ---------------------------------------------------------- */

typedef struct norm_config {
    const char *name;
    int ndim;
    int64_t shape[4];
    bool gamma, beta; /* beta is ignored by RMS norm */
    x_kind kind;
    double eps;  /* the operator's eps */
    double step; /* the finite-difference step (0: the default 1e-6) */
} norm_config;

static const norm_config NORM_CONFIGS[] = {
    {"2d", 2, {3, 5}, true, true, X_NORMAL, 1e-5, 0},
    {"batch", 3, {2, 3, 4}, true, true, X_NORMAL, 1e-5, 0},
    {"1d", 1, {7}, true, true, X_NORMAL, 1e-5, 0},
    {"4d", 4, {2, 2, 2, 3}, true, true, X_NORMAL, 1e-5, 0},
    {"d=1", 2, {4, 1}, true, true, X_NORMAL, 1e-5, 0},
    {"d=1 batch", 3, {2, 3, 1}, true, true, X_NORMAL, 1e-5, 0},
    {"odd d", 3, {2, 2, 9}, true, true, X_NORMAL, 1e-5, 0},
    {"d=2", 2, {3, 2}, true, true, X_NORMAL, 1e-5, 0},
    {"no gamma", 2, {3, 6}, false, true, X_NORMAL, 1e-5, 0},
    {"no beta", 2, {3, 6}, true, false, X_NORMAL, 1e-5, 0},
    {"no affine", 3, {2, 3, 5}, false, false, X_NORMAL, 1e-5, 0},
    {"const rows", 2, {4, 6}, true, true, X_CONST_ROWS, 1e-5, 0},
    {"const rows batch", 3, {2, 2, 5}, true, false, X_CONST_ROWS, 1e-5, 0},
    {"zero rows", 2, {4, 5}, true, true, X_ZERO_ROWS, 1e-5, 0},
    {"const rows tiny eps", 2, {4, 5}, true, true, X_CONST_ROWS, 1e-8, 1e-8},
    {"zero rows tiny eps", 2, {4, 3}, true, false, X_ZERO_ROWS, 1e-8, 1e-8},
    {"eps 0.5", 2, {3, 4}, true, true, X_NORMAL, 0.5, 0},
    {"large", 2, {3, 6}, true, true, X_LARGE, 1e-5, 1e-2},
    {"large batch", 3, {2, 2, 5}, false, true, X_LARGE, 1e-5, 1e-2},
    {"large offset", 2, {3, 6}, true, true, X_OFFSET, 1e-5, 1e-6},
    {"tiny", 2, {3, 6}, true, true, X_TINY, 1e-5, 0},
    {"tiny no affine", 3, {2, 2, 4}, false, false, X_TINY, 1e-5, 0},
    {"wide", 3, {2, 3, 7}, true, true, X_WIDE, 1e-5, 0},
    {"long row", 2, {2, 33}, true, true, X_NORMAL, 1e-5, 0},
};

typedef struct norm_user {
    bool rms, gamma, beta;
    double eps;
} norm_user;

static qkv_tensor *norm_fn(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)n;
    const norm_user *u = user;
    int k = 1;
    qkv_tensor *g = u->gamma ? in[k++] : NULL;
    if (u->rms) return qkv_rms_norm(ctx, in[0], g, u->eps);
    qkv_tensor *b = u->beta ? in[k++] : NULL;
    return qkv_layer_norm(ctx, in[0], g, b, u->eps);
}

static void gradcheck_norms(bool rms) {
    int n_configs = (int)(sizeof NORM_CONFIGS / sizeof NORM_CONFIGS[0]);
    cr_assert(n_configs >= 20);
    gradcheck_tally tally = {0};
    for (int c = 0; c < n_configs; c++) {
        const norm_config *cfg = &NORM_CONFIGS[c];
        qkv_ctx *ctx = new_ctx(500 + (uint64_t)c, 1);
        int64_t d = cfg->shape[cfg->ndim - 1];
        qkv_tensor *in[3];
        int n_in = 0;
        in[n_in++] = new_f64(ctx, cfg->ndim, cfg->shape);
        fill_x(in[0], cfg->kind);
        norm_user u = {rms, cfg->gamma, cfg->beta && !rms, cfg->eps};
        if (u.gamma) {
            qkv_tensor *g = new_f64(ctx, 1, &d);
            for (int64_t j = 0; j < d; j++) qkv_f64(g)[j] = 1.0 + 0.5 * nrand();
            in[n_in++] = g;
        }
        if (u.beta) {
            qkv_tensor *b = new_f64(ctx, 1, &d);
            for (int64_t j = 0; j < d; j++) qkv_f64(b)[j] = nrand();
            in[n_in++] = b;
        }
        int64_t want = 0;
        for (int i = 0; i < n_in; i++) want += in[i]->numel;
        qkv_gradcheck_options o = {0};
        o.eps = cfg->step;
        o.seed = 77 + (uint64_t)c;
        qkv_gradcheck_result r;
        qkv_status st = qkv_gradcheck(ctx, norm_fn, in, n_in, &u, &o, &r);
        tally_named(&tally, cfg->name, c, st, ctx, &r, want);
        qkv_ctx_free(ctx);
    }
    expect_gradcheck_tally(&tally, n_configs, 500);
}

Test(layer_norm, gradcheck_over_24_configurations) { gradcheck_norms(false); }
Test(rms_norm, gradcheck_over_24_configurations) { gradcheck_norms(true); }

/* ---- gradcheck: GELU ----------------------------------------------------------------------------- */

typedef struct gelu_config {
    const char *name;
    int ndim;
    int64_t shape[4];
    x_kind kind;
    double step;
} gelu_config;

static const gelu_config GELU_CONFIGS[] = {
    {"1d", 1, {9}, X_NORMAL, 0},
    {"2d", 2, {3, 4}, X_NORMAL, 0},
    {"batch", 3, {2, 3, 5}, X_NORMAL, 0},
    {"4d", 4, {2, 1, 2, 3}, X_NORMAL, 0},
    {"one element", 1, {1}, X_NORMAL, 0},
    {"wide", 2, {4, 8}, X_WIDE, 0},
    {"wide batch", 3, {2, 3, 7}, X_WIDE, 0},
    {"large", 2, {2, 5}, X_LARGE, 1e-2},
    {"large offset", 1, {6}, X_OFFSET, 1e-2},
    {"tiny", 2, {3, 5}, X_TINY, 1e-9},
    {"zeros", 2, {2, 3}, X_ZERO_ROWS, 0},
};

typedef struct gelu_user {
    qkv_gelu_approx approx;
} gelu_user;

static qkv_tensor *gelu_fn(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)n;
    return qkv_gelu(ctx, in[0], ((const gelu_user *)user)->approx);
}

Test(gelu, gradcheck_over_22_configurations) {
    int n_shapes = (int)(sizeof GELU_CONFIGS / sizeof GELU_CONFIGS[0]), n_configs = 2 * n_shapes;
    cr_assert(n_configs >= 20);
    gradcheck_tally tally = {0};
    for (int c = 0; c < n_configs; c++) {
        const gelu_config *cfg = &GELU_CONFIGS[c / 2];
        gelu_user u = {c % 2 ? QKV_GELU_TANH : QKV_GELU_ERF};
        char name[64];
        snprintf(name, sizeof name, "%s %s", cfg->name, c % 2 ? "tanh" : "erf");
        qkv_ctx *ctx = new_ctx(900 + (uint64_t)c, 1);
        qkv_tensor *x = new_f64(ctx, cfg->ndim, cfg->shape);
        fill_x(x, cfg->kind);
        qkv_gradcheck_options o = {0};
        o.eps = cfg->step;
        o.seed = 11 + (uint64_t)c;
        qkv_gradcheck_result r;
        qkv_status st = qkv_gradcheck(ctx, gelu_fn, &x, 1, &u, &o, &r);
        tally_named(&tally, name, c, st, ctx, &r, x->numel);
        qkv_ctx_free(ctx);
    }
    expect_gradcheck_tally(&tally, n_configs, 200);
}

/* ---- gradcheck: embedding ------------------------------------------------------------------------ */

typedef enum { IDS_RANDOM, IDS_ALL_SAME, IDS_PAIRS, IDS_EDGES } ids_kind;

typedef struct emb_config {
    const char *name;
    int64_t V, d;
    int64_t B; /* 0: ids [n] */
    int64_t n;
    ids_kind ids;
} emb_config;

static const emb_config EMB_CONFIGS[] = {
    {"1d", 5, 3, 0, 4, IDS_RANDOM},
    {"batch", 6, 4, 2, 3, IDS_RANDOM},
    {"d=1", 4, 1, 0, 6, IDS_RANDOM},
    {"d=1 batch", 3, 1, 2, 4, IDS_RANDOM},
    {"odd d", 5, 7, 0, 5, IDS_RANDOM},
    {"odd d batch", 4, 9, 3, 2, IDS_RANDOM},
    {"V=1", 1, 4, 0, 3, IDS_RANDOM},
    {"V=1 batch", 1, 2, 2, 3, IDS_RANDOM},
    {"all same", 5, 3, 0, 6, IDS_ALL_SAME},
    {"all same batch", 4, 5, 2, 4, IDS_ALL_SAME},
    {"pairs", 6, 3, 0, 8, IDS_PAIRS},
    {"pairs batch", 7, 4, 3, 4, IDS_PAIRS},
    {"edges", 8, 3, 0, 4, IDS_EDGES},
    {"edges batch", 9, 2, 2, 4, IDS_EDGES},
    {"n=1", 5, 4, 0, 1, IDS_RANDOM},
    {"n=1 batch", 5, 4, 3, 1, IDS_RANDOM},
    {"B=1", 6, 3, 1, 5, IDS_RANDOM},
    {"more ids than rows", 3, 4, 4, 5, IDS_RANDOM},
    {"wide table", 40, 2, 0, 6, IDS_RANDOM},
    {"long", 10, 16, 2, 9, IDS_PAIRS},
    {"unused rows", 20, 3, 0, 2, IDS_EDGES},
};

static qkv_tensor *make_ids(qkv_ctx *ctx, int64_t V, int64_t B, int64_t n, ids_kind kind) {
    int64_t shape[2] = {B ? B : n, n};
    qkv_tensor *ids = qkv_zeros(ctx, QKV_I32, B ? 2 : 1, shape);
    cr_assert_not_null(ids, "%s", qkv_errmsg(ctx));
    int32_t *v = qkv_i32(ids);
    for (int64_t p = 0; p < ids->numel; p++) {
        switch (kind) {
        case IDS_RANDOM: v[p] = (int32_t)(urand() * (double)V); break;
        case IDS_ALL_SAME: v[p] = (int32_t)(V / 2); break;
        case IDS_PAIRS: v[p] = (int32_t)((p / 2) % V); break;
        case IDS_EDGES: v[p] = p % 2 ? (int32_t)(V - 1) : 0; break;
        }
    }
    return ids;
}

static qkv_tensor *emb_fn(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)n;
    return qkv_embedding(ctx, in[0], user);
}

Test(embedding, gradcheck_over_21_configurations) {
    int n_configs = (int)(sizeof EMB_CONFIGS / sizeof EMB_CONFIGS[0]);
    cr_assert(n_configs >= 20);
    gradcheck_tally tally = {0};
    for (int c = 0; c < n_configs; c++) {
        const emb_config *cfg = &EMB_CONFIGS[c];
        qkv_ctx *ctx = new_ctx(300 + (uint64_t)c, 1);
        int64_t tshape[2] = {cfg->V, cfg->d};
        qkv_tensor *table = new_f64(ctx, 2, tshape);
        fill_x(table, X_NORMAL);
        qkv_tensor *ids = make_ids(ctx, cfg->V, cfg->B, cfg->n, cfg->ids);
        qkv_gradcheck_options o = {0};
        o.seed = 5 + (uint64_t)c;
        qkv_gradcheck_result r;
        qkv_status st = qkv_gradcheck(ctx, emb_fn, &table, 1, ids, &o, &r);
        tally_named(&tally, cfg->name, c, st, ctx, &r, table->numel);
        qkv_ctx_free(ctx);
    }
    expect_gradcheck_tally(&tally, n_configs, 300);
}

/* ---- f32 against f64 ----------------------------------------------------------------------------- */

typedef enum { OP_LN, OP_RMS, OP_GELU_ERF, OP_GELU_TANH } f32_op;

static qkv_tensor *run_op(qkv_ctx *ctx, f32_op op, qkv_tensor *x, qkv_tensor *g, qkv_tensor *b) {
    switch (op) {
    case OP_LN: return qkv_layer_norm(ctx, x, g, b, 1e-5);
    case OP_RMS: return qkv_rms_norm(ctx, x, g, 1e-6);
    case OP_GELU_ERF: return qkv_gelu(ctx, x, QKV_GELU_ERF);
    default: return qkv_gelu(ctx, x, QKV_GELU_TANH);
    }
}

/* Norm-wise relative errors of the f32 path against the f64 path on the same (f32-representable) inputs
 * and upstream gradient: err[0] y, err[1] dx, err[2] dgamma, err[3] dbeta (dgamma, dbeta: norms only). */
static void f32_vs_f64(f32_op op, int ndim, const int64_t *shape, x_kind kind, double err[4]) {
    qkv_ctx *ctx[2] = {new_ctx(42, 1), new_ctx(42, 1)}; /* one backward per tape: a context per dtype */
    qkv_tensor *x = new_f64(ctx[0], ndim, shape);
    fill_x(x, kind);
    int64_t d = shape[ndim - 1];
    qkv_tensor *g = new_f64(ctx[0], 1, &d), *b = new_f64(ctx[0], 1, &d), *dy = new_f64(ctx[0], ndim, shape);
    for (int64_t j = 0; j < d; j++) qkv_f64(g)[j] = 1.0 + 0.5 * nrand(), qkv_f64(b)[j] = nrand();
    for (int64_t i = 0; i < dy->numel; i++) qkv_f64(dy)[i] = nrand();
    qkv_tensor *src[4] = {x, g, b, dy}, *in[2][4], *y[2];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 4; i++) { /* through f32 for both, so both paths see the same values */
            qkv_tensor *t32 = qkv_to_dtype(ctx[0], src[i], QKV_F32); /* a context uses only its own tensors */
            qkv_tensor *own = qkv_from_data(ctx[k], QKV_F32, t32->ndim, t32->shape, t32->data);
            in[k][i] = qkv_to_dtype(ctx[k], own, k ? QKV_F32 : QKV_F64);
            cr_assert_not_null(in[k][i], "%s", qkv_errmsg(ctx[k]));
        }
        for (int i = 0; i < 3; i++) cr_assert_eq(qkv_set_requires_grad(ctx[k], in[k][i], true), QKV_OK);
        y[k] = run_op(ctx[k], op, in[k][0], in[k][1], in[k][2]);
        cr_assert_not_null(y[k], "%s", qkv_errmsg(ctx[k]));
        cr_assert_eq(qkv_backward(ctx[k], y[k], in[k][3]), QKV_OK, "%s", qkv_errmsg(ctx[k]));
    }
    err[0] = rel_norm_err(y[1], y[0]);
    for (int i = 0; i < 3; i++)
        err[i + 1] = in[0][i]->grad ? rel_norm_err(in[1][i]->grad, in[0][i]->grad) : 0.0;
    qkv_ctx_free(ctx[0]);
    qkv_ctx_free(ctx[1]);
}

/* Bounds, with u = 2^-24 ~ 6e-8 the f32 unit roundoff. Each f32 output is a handful of f32 operations
 * on exact (or double-rounded-once) values: layer norm's y is ((x - hi) - lo) rs g + b, five roundings,
 * so |err| <= ~5u |y| elementwise, 3e-7 norm-wise; 1e-6 leaves a factor 3. GELU: erfcf / tanhf / expf are
 * within a few ulp, then 2-3 products: 1e-6 as well. The backward dx = rs ((dxh - a) - xhat c) cancels
 * (the row sum of dx is 0 for layer norm), so its relative error is larger than the terms': 1e-5. dgamma
 * and dbeta are f32 sums over blocks of 16 rows, added in double (layer norm; RMS norm: every row in
 * double): 1e-6. Measured worst values are below 2e-7.
 * Not compared: RMS norm's dx for d = 1, where dx = rstd dxh eps / (x^2 + eps) is the difference of two
 * terms ~1e6 times larger (f32 gets it to u times those terms, ~1e-2 relative: the f32 limit, not a bug). */
static const double F32_BOUND[4] = {1e-6, 1e-5, 1e-6, 1e-6};

Test(f32, against_f64_for_every_operator) {
    static const struct {
        int ndim;
        int64_t shape[3];
        x_kind kind;
    } cases[] = {
        {3, {4, 8, 256}, X_NORMAL}, {2, {16, 37}, X_NORMAL}, {2, {8, 64}, X_OFFSET},
        {2, {8, 64}, X_LARGE},      {2, {8, 33}, X_CONST_ROWS}, {3, {2, 3, 1}, X_NORMAL},
        {2, {8, 40}, X_WIDE},
    };
    const char *names[4] = {"layer_norm", "rms_norm", "gelu erf", "gelu tanh"};
    for (int op = 0; op < 4; op++) {
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            double err[4];
            f32_vs_f64((f32_op)op, cases[c].ndim, cases[c].shape, cases[c].kind, err);
            bool rms_d1 = op == OP_RMS && cases[c].shape[cases[c].ndim - 1] == 1;
            for (int i = 0; i < 4; i++)
                if (!(rms_d1 && i == 1))
                    cr_expect(err[i] <= F32_BOUND[i], "%s case %zu: error %d (y, dx, dgamma, dbeta) is %.3g > %.3g",
                              names[op], c, i, err[i], F32_BOUND[i]);
            if (getenv("QKV_TEST_VERBOSE"))
                printf("%s case %zu: %.3g %.3g %.3g %.3g\n", names[op], c, err[0], err[1], err[2], err[3]);
        }
    }
}

Test(f32, embedding_matches_f64_exactly) {
    qkv_ctx *ctx = new_ctx(3, 1);
    int64_t ts[2] = {7, 5}, is[2] = {3, 4};
    qkv_tensor *t64 = new_f64(ctx, 2, ts);
    fill_x(t64, X_NORMAL);
    qkv_tensor *t32 = qkv_to_dtype(ctx, t64, QKV_F32), *ids = make_ids(ctx, 7, 3, 4, IDS_RANDOM);
    qkv_tensor *y32 = qkv_embedding(ctx, t32, ids), *y64 = qkv_embedding(ctx, t64, ids);
    cr_assert_not_null(y32, "%s", qkv_errmsg(ctx));
    cr_assert_not_null(y64);
    cr_expect_eq(y32->dtype, QKV_F32);
    cr_expect_eq(y32->ndim, 3);
    for (int64_t p = 0; p < 12; p++)
        for (int64_t j = 0; j < 5; j++) {
            int32_t id = qkv_i32(ids)[p];
            cr_expect_eq(at(y32, p * 5 + j), (double)(float)qkv_f64(t64)[id * 5 + j]);
            cr_expect_eq(at(y64, p * 5 + j), qkv_f64(t64)[id * 5 + j]);
        }
    (void)is;
    qkv_ctx_free(ctx);
}

/* ---- values by hand ------------------------------------------------------------------------------ */

Test(layer_norm, values_by_hand_and_a_constant_row) {
    for (int k = 0; k < 2; k++) {
        qkv_dtype dt = k ? QKV_F32 : QKV_F64;
        double tol = k ? 1e-6 : 1e-15;
        qkv_ctx *ctx = new_ctx(1, 1);
        int64_t xs[2] = {2, 4}, ds = 4;
        const double xv[8] = {1, 2, 3, 4, 3, 3, 3, 3}, gv[4] = {2, 1, 0.5, -1}, bv[4] = {0.1, 0.2, 0.3, 0.4};
        qkv_tensor *x = tensor_of(ctx, dt, 2, xs, xv), *g = tensor_of(ctx, dt, 1, &ds, gv);
        qkv_tensor *b = tensor_of(ctx, dt, 1, &ds, bv);
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *y = qkv_layer_norm(ctx, x, g, b, 1e-5);
        cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
        // row 0: mean 2.5, var 1.25 (biased); row 1 is constant: y = beta exactly
        double rstd = 1.0 / sqrt(1.25 + 1e-5);
        for (int j = 0; j < 4; j++) {
            double want = (xv[j] - 2.5) * rstd * gv[j] + bv[j];
            cr_expect(fabs(at(y, j) - want) <= tol * 4, "%s y[0,%d] = %.17g, want %.17g", qkv_dtype_name(dt), j,
                      at(y, j), want);
            cr_expect_eq(at(y, 4 + j), k ? (double)(float)bv[j] : bv[j], "constant row: y = beta");
        }
        const double dyv[8] = {1, -2, 0.5, 3, 1, -2, 0.5, 3};
        qkv_tensor *dy = tensor_of(ctx, dt, 2, xs, dyv);
        cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
        // constant row: xhat = 0, dx = rstd (dxh - mean(dxh)) with rstd = 1 / sqrt(eps)
        double dxh[4], mean = 0;
        for (int j = 0; j < 4; j++) mean += (dxh[j] = dyv[4 + j] * gv[j]) / 4;
        for (int j = 0; j < 4; j++) {
            double want = (dxh[j] - mean) / sqrt(1e-5);
            cr_expect(fabs(at(x->grad, 4 + j) - want) <= tol * 4 * fabs(want), "dx[1,%d] = %.17g, want %.17g", j,
                      at(x->grad, 4 + j), want);
        }
        qkv_ctx_free(ctx);
    }
}

Test(layer_norm, constant_row_with_tiny_eps_is_finite) {
    qkv_ctx *ctx = new_ctx(1, 1);
    int64_t xs[2] = {1, 5};
    const double xv[5] = {1e4, 1e4, 1e4, 1e4, 1e4}, dyv[5] = {1, 2, 3, 4, 6};
    for (int k = 0; k < 2; k++) {
        qkv_tensor *x = tensor_of(ctx, k ? QKV_F32 : QKV_F64, 2, xs, xv);
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *y = qkv_layer_norm(ctx, x, NULL, NULL, 1e-30);
        cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
        cr_assert_eq(qkv_backward(ctx, y, tensor_of(ctx, x->dtype, 2, xs, dyv)), QKV_OK, "%s", qkv_errmsg(ctx));
        for (int j = 0; j < 5; j++) {
            cr_expect_eq(at(y, j), 0.0, "y[%d] = %g", j, at(y, j));
            double want = (dyv[j] - 3.2) * 1e15; /* (dy - mean(dy)) / sqrt(eps) */
            cr_expect(isfinite(at(x->grad, j)) && fabs(at(x->grad, j) - want) <= 1e-6 * fabs(want),
                      "%s dx[%d] = %g, want %g", qkv_dtype_name(x->dtype), j, at(x->grad, j), want);
        }
        qkv_step_end(ctx);
    }
    qkv_ctx_free(ctx);
}

Test(rms_norm, values_by_hand_and_a_zero_row) {
    for (int k = 0; k < 2; k++) {
        qkv_dtype dt = k ? QKV_F32 : QKV_F64;
        qkv_ctx *ctx = new_ctx(1, 1);
        int64_t xs[2] = {2, 2}, ds = 2;
        const double xv[4] = {3, 4, 0, 0}, gv[2] = {2, -0.5}, dyv[4] = {1, 1, 1, -3};
        qkv_tensor *x = tensor_of(ctx, dt, 2, xs, xv), *g = tensor_of(ctx, dt, 1, &ds, gv);
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *y = qkv_rms_norm(ctx, x, g, 1e-6);
        cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
        double rstd = 1.0 / sqrt(12.5 + 1e-6); // mean(x^2) = (9 + 16) / 2
        cr_expect(fabs(at(y, 0) - 3 * rstd * 2) <= 1e-6, "y[0] = %.17g", at(y, 0));
        cr_expect(fabs(at(y, 1) + 4 * rstd * 0.5) <= 1e-6, "y[1] = %.17g", at(y, 1));
        cr_expect_eq(at(y, 2), 0.0);
        cr_expect_eq(at(y, 3), 0.0);
        cr_assert_eq(qkv_backward(ctx, y, tensor_of(ctx, dt, 2, xs, dyv)), QKV_OK, "%s", qkv_errmsg(ctx));
        // a zero row: xhat = 0, dx = rstd dy gamma with rstd = 1 / sqrt(eps) = 1000
        cr_expect(fabs(at(x->grad, 2) - 1000.0 * 1 * 2) <= 1e-3, "dx[1,0] = %.17g", at(x->grad, 2));
        cr_expect(fabs(at(x->grad, 3) - 1000.0 * -3 * -0.5) <= 1e-3, "dx[1,1] = %.17g", at(x->grad, 3));
        qkv_ctx_free(ctx);
    }
}

Test(gelu, values_from_pytorch) {
    /* torch.nn.functional.gelu(x, approximate='none' / 'tanh') in float64, PyTorch 1.13. PyTorch computes
     * 1 + erf(x / sqrt 2) and 1 + tanh(u), which cancel for x << 0: at x = -3 it is 8e-15 (erf) and 7e-15
     * (tanh) away from the exact values (mpmath: -0.00404969409489028358, -0.00363739208177301884), which
     * qkv's erfc and x / (1 + exp(-2u)) forms hit to 1e-16. Hence 1e-13 relative in f64. f32: the rounding
     * of z = -x / sqrt 2 alone moves erfc(z) by 2 z^2 2^-24 (5e-7 at x = -3), hence 2e-6. */
    const double xv[5] = {1.0, -1.0, 3.0, -3.0, 0.5};
    const double erf_want[5] = {0.841344746068543, -0.15865525393145702, 2.99595030590511, -0.00404969409489031,
                                0.34573123063700656};
    const double tanh_want[5] = {0.8411919906082768, -0.15880800939172324, 2.996362607918227,
                                 -0.0036373920817729943, 0.34571400982514394};
    int64_t n = 5;
    for (int k = 0; k < 4; k++) {
        qkv_dtype dt = k & 1 ? QKV_F32 : QKV_F64;
        qkv_gelu_approx a = k & 2 ? QKV_GELU_TANH : QKV_GELU_ERF;
        const double *want = k & 2 ? tanh_want : erf_want;
        qkv_ctx *ctx = new_ctx(1, 1);
        qkv_tensor *y = qkv_gelu(ctx, tensor_of(ctx, dt, 1, &n, xv), a);
        cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
        for (int i = 0; i < 5; i++)
            cr_expect(fabs(at(y, i) - want[i]) <= (dt == QKV_F32 ? 2e-6 : 1e-13) * fabs(want[i]),
                      "%s %s gelu(%g) = %.17g, want %.17g", qkv_dtype_name(dt), a ? "tanh" : "erf", xv[i], at(y, i),
                      want[i]);
        qkv_ctx_free(ctx);
    }
}

/* ---- embedding: the scatter ---------------------------------------------------------------------- */

Test(embedding, repeated_ids_sum_their_rows_and_gradients_add_up_over_steps) {
    for (int k = 0; k < 2; k++) {
        qkv_dtype dt = k ? QKV_F32 : QKV_F64;
        qkv_ctx *ctx = new_ctx(1, 1);
        int64_t ts[2] = {4, 2}, ns = 5, ys[2] = {5, 2};
        const double tv[8] = {0, 1, 10, 11, 20, 21, 30, 31};
        const int32_t idv[5] = {2, 0, 2, 2, 3};
        const double dyv[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
        qkv_tensor *table = qkv_param(ctx, tensor_of(ctx, dt, 2, ts, tv));
        for (int step = 1; step <= 2; step++) {
            qkv_tensor *ids = qkv_from_data(ctx, QKV_I32, 1, &ns, idv);
            qkv_tensor *y = qkv_embedding(ctx, table, ids);
            cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
            for (int p = 0; p < 5; p++) cr_expect_eq(at(y, 2 * p + 1), tv[2 * idv[p] + 1]);
            cr_assert_eq(qkv_backward(ctx, y, tensor_of(ctx, dt, 2, ys, dyv)), QKV_OK, "%s", qkv_errmsg(ctx));
            // dtable[2] = dy[0] + dy[2] + dy[3], dtable[1] untouched, per step
            const double want[8] = {3, 4, 0, 0, 1 + 5 + 7, 2 + 6 + 8, 9, 10};
            for (int i = 0; i < 8; i++)
                cr_expect_eq(at(table->grad, i), step * want[i], "%s step %d dtable[%d] = %g, want %g",
                             qkv_dtype_name(dt), step, i, at(table->grad, i), step * want[i]);
            qkv_step_end(ctx);
        }
        qkv_ctx_free(ctx);
    }
}

/* Forward and backward of a [B, n] lookup into a [V, d] f32 table: the table's gradient. */
static qkv_tensor *embedding_grad(int threads, qkv_ctx **out_ctx) {
    qkv_ctx *ctx = new_ctx(7, threads);
    int64_t ts[2] = {50, 96}, is[2] = {16, 128};
    qkv_tensor *table = qkv_param(ctx, qkv_randn(ctx, QKV_F32, 2, ts, 0.0, 1.0));
    qkv_tensor *ids = qkv_zeros(ctx, QKV_I32, 2, is);
    for (int64_t p = 0; p < ids->numel; p++) qkv_i32(ids)[p] = (int32_t)((p * 7919) % 50);
    qkv_tensor *y = qkv_embedding(ctx, table, ids);
    cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
    qkv_tensor *dy = qkv_randn(ctx, QKV_F32, 3, y->shape, 0.0, 1.0);
    cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
    *out_ctx = ctx;
    return table->grad;
}

Test(embedding, the_same_bits_with_1_and_2_threads) {
    qkv_ctx *c1, *c2;
    qkv_tensor *g1 = embedding_grad(1, &c1), *g2 = embedding_grad(2, &c2);
    cr_assert_eq(qkv_threads(c2), 2);
    cr_expect(memcmp(g1->data, g2->data, (size_t)g1->numel * sizeof(float)) == 0,
              "the table gradient differs between 1 and 2 threads");
    double total = 0;
    for (int64_t i = 0; i < g1->numel; i++) total += fabs(at(g1, i));
    cr_expect(total > 1000.0, "the gradient is (almost) zero: %g", total);
    qkv_ctx_free(c1);
    qkv_ctx_free(c2);
}

Test(embedding, ids_changed_after_the_forward_do_not_move_the_backward) {
    qkv_ctx *ctx = new_ctx(1, 1);
    int64_t ts[2] = {3, 2}, ns = 2, ys[2] = {2, 2};
    const double tv[6] = {0, 1, 2, 3, 4, 5}, dyv[4] = {1, 2, 3, 4};
    qkv_tensor *table = tensor_of(ctx, QKV_F64, 2, ts, tv);
    qkv_set_requires_grad(ctx, table, true);
    const int32_t idv[2] = {1, 2};
    qkv_tensor *ids = qkv_from_data(ctx, QKV_I32, 1, &ns, idv);
    qkv_tensor *y = qkv_embedding(ctx, table, ids);
    cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
    qkv_i32(ids)[0] = 1000000; /* out of range now: a backward trusting it would write far outside */
    qkv_i32(ids)[1] = 0;
    cr_assert_eq(qkv_backward(ctx, y, tensor_of(ctx, QKV_F64, 2, ys, dyv)), QKV_OK, "%s", qkv_errmsg(ctx));
    const double want[6] = {0, 0, 1, 2, 3, 4};
    for (int i = 0; i < 6; i++) cr_expect_eq(at(table->grad, i), want[i], "dtable[%d] = %g", i, at(table->grad, i));
    qkv_ctx_free(ctx);
}

Test(embedding, shapes_and_an_id_out_of_range) {
    qkv_ctx *ctx = new_ctx(1, 1);
    int64_t ts[2] = {5, 3}, is[2] = {2, 3};
    qkv_tensor *table = qkv_zeros(ctx, QKV_F32, 2, ts);
    qkv_tensor *ids = qkv_zeros(ctx, QKV_I32, 2, is);
    qkv_tensor *y = qkv_embedding(ctx, table, ids);
    cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
    cr_expect(y->ndim == 3 && y->shape[0] == 2 && y->shape[1] == 3 && y->shape[2] == 3 && y->dtype == QKV_F32);
    qkv_i32(ids)[4] = 5;
    cr_expect_null(qkv_embedding(ctx, table, ids));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_ARG);
    const char *frags[] = {"qkv_embedding", "[5,3]", "[2,3]", "id 5", "[1, 1]", "V = 5"};
    for (int i = 0; i < 6; i++)
        cr_expect(strstr(qkv_errmsg(ctx), frags[i]), "message \"%s\" lacks \"%s\"", qkv_errmsg(ctx), frags[i]);
    qkv_clear_error(ctx);
    int64_t ns = 4;
    const int32_t bad[4] = {0, 1, 2, -1};
    cr_expect_null(qkv_embedding(ctx, table, qkv_from_data(ctx, QKV_I32, 1, &ns, bad)));
    cr_expect(strstr(qkv_errmsg(ctx), "id -1 at position 3"), "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

/* y = gelu(x) and dy/dx (a backward with dy = 1) in dtype dt, as doubles in y and g. */
static void gelu_values(qkv_dtype dt, qkv_gelu_approx a, const double *xv, int64_t n, double *y, double *g) {
    qkv_ctx *ctx = new_ctx(1, 1);
    qkv_tensor *x = tensor_of(ctx, dt, 1, &n, xv);
    qkv_set_requires_grad(ctx, x, true);
    qkv_tensor *out = qkv_gelu(ctx, x, a);
    cr_assert_not_null(out, "%s", qkv_errmsg(ctx));
    cr_assert_eq(qkv_backward(ctx, out, qkv_ones(ctx, dt, 1, &n)), QKV_OK, "%s", qkv_errmsg(ctx));
    for (int64_t i = 0; i < n; i++) y[i] = at(out, i), g[i] = at(x->grad, i);
    qkv_ctx_free(ctx);
}

/* The f32 GELU kernels (their own vectorised exp and erfc) against the f64 ones, element by element, over
 * x in [-20, 20] by 1/512 and a few extremes: |y32 - y64| <= (8 + 2 x^2) 2^-24 |y64| + 1e-35, and the same
 * for dy/dx relative to |dy/dx| + 2 y / x (its two terms cancel near x = -0.75, where the slope is 0;
 * y / x is the first, Phi(x) or s, and the second is as large). The x^2 term is erfc's conditioning: z = |x| / sqrt 2 rounded to f32 moves erfc(z) by 2 z^2 u
 * relative, and -z^2 rounded in the exponent by z^2 u more (u = 2^-24); 8 u for the few roundings around.
 * 1e-35 absolute: the tails below that leave f32's normal range (where PyTorch's f32 gives 0 already).
 * And the special values: NaN gives NaN, gelu(inf) = inf with slope 1, gelu(-1e30) = 0 with slope 0. */
Test(gelu, f32_kernels_element_by_element) {
    enum { N = 20481 + 9 };
    static double xv[N], y[2][N], g[2][N];
    for (int i = 0; i < 20481; i++) xv[i] = -20.0 + (double)i / 512.0;
    const double extremes[9] = {1e4, -1e4, 1e-8, -1e-8, 60.0, -60.0, NAN, INFINITY, -1e30};
    for (int i = 0; i < 9; i++) xv[20481 + i] = extremes[i];
    for (int k = 0; k < 2; k++) {
        qkv_gelu_approx a = k ? QKV_GELU_TANH : QKV_GELU_ERF;
        const char *name = k ? "tanh" : "erf";
        for (int t = 0; t < 2; t++) gelu_values(t ? QKV_F32 : QKV_F64, a, xv, N, y[t], g[t]);
        int bad = 0;
        for (int i = 0; i < N - 3; i++) {
            double x32 = (double)(float)xv[i];
            if (x32 != xv[i]) continue; /* not representable: the two paths saw different x */
            double rel = (8.0 + 2.0 * xv[i] * xv[i]) * 0x1p-24;
            double term = xv[i] != 0.0 ? fabs(y[0][i] / xv[i]) : 0.5; /* Phi(x) or s: dy/dx's first term */
            if (fabs(y[1][i] - y[0][i]) <= rel * fabs(y[0][i]) + 1e-35 &&
                fabs(g[1][i] - g[0][i]) <= rel * (fabs(g[0][i]) + 2.0 * term) + 1e-35)
                continue;
            if (bad++ < 5)
                cr_expect(false, "%s x = %.9g: y %.9g vs %.9g, dy/dx %.9g vs %.9g", name, xv[i], y[1][i], y[0][i],
                          g[1][i], g[0][i]);
        }
        cr_expect_eq(bad, 0, "%s: %d elements out of bounds", name, bad);
        for (int t = 0; t < 2; t++) {
            cr_expect(isnan(y[t][N - 3]), "%s gelu(NaN) = %g", name, y[t][N - 3]);
            cr_expect(y[t][N - 2] == INFINITY && g[t][N - 2] == 1.0, "%s gelu(inf) = %g, %g", name, y[t][N - 2],
                      g[t][N - 2]);
            cr_expect(y[t][N - 1] == 0.0 && g[t][N - 1] == 0.0, "%s gelu(-1e30) = %g, %g", name, y[t][N - 1],
                      g[t][N - 1]);
        }
    }
}

/* ---- golden values from PyTorch 1.13 (tests/tools/make_golden_embed_norm_gelu.py) --------------- */


/* Elements of got more than atol + rtol |want| away from want (the first few are logged). */
static int compare_golden(const char *label, const qkv_tensor *got, const qkv_tensor *want, double atol, double rtol) {
    cr_assert_not_null(got, "%s: no result", label);
    cr_assert_eq(got->numel, want->numel, "%s: %lld vs %lld elements", label, (long long)got->numel,
                 (long long)want->numel);
    int bad = 0;
    for (int64_t i = 0; i < want->numel; i++) {
        double g = at(got, i), w = at(want, i);
        if (!(fabs(g - w) <= atol + rtol * fabs(w)) && bad++ < 5)
            cr_log_error("%s[%lld]: qkv %.17g, PyTorch %.17g", label, (long long)i, g, w);
    }
    return bad;
}

typedef enum { G_EMB, G_LN, G_RMS, G_GELU_ERF, G_GELU_TANH } golden_kind;

/* One golden case in dtype dt: inputs converted from the f64 files, backward with dloss = R. f64: 1e-12
 * + 1e-10 |want| (PyTorch's f64 GELU loses ~1e-14 relative for x << 0, see values_from_pytorch). f32: the
 * inputs are rounded to f32 first, so the bound is f32's (2e-5 + 2e-5 |want|, as test_golden's), or f32_tol
 * where rounding the inputs itself moves the result more (ln_offset: x = 1e4 + z moves by up to 5e-4). */
static void check_golden(const char *name, golden_kind kind, qkv_dtype dt, double f32_tol) {
    qkv_ctx *ctx = new_ctx(1, 1);
    const char *first = kind == G_EMB ? "table" : "x";
    qkv_tensor *x = load_golden(ctx, name, first, false), *r = load_golden(ctx, name, "r", false);
    qkv_tensor *gamma = kind == G_LN || kind == G_RMS ? load_golden(ctx, name, "gamma", true) : NULL;
    qkv_tensor *beta = kind == G_LN ? load_golden(ctx, name, "beta", true) : NULL;
    qkv_tensor *ids = kind == G_EMB ? load_golden(ctx, name, "ids", false) : NULL;
    double eps = kind == G_LN || kind == G_RMS ? at(load_golden(ctx, name, "eps", false), 0) : 0.0;
    qkv_tensor **params[3] = {&x, &gamma, &beta};
    for (int i = 0; i < 3; i++) {
        if (!*params[i]) continue;
        if (dt != QKV_F64) *params[i] = qkv_to_dtype(ctx, *params[i], dt);
        qkv_set_requires_grad(ctx, *params[i], true);
    }
    if (dt != QKV_F64) r = qkv_to_dtype(ctx, r, dt);
    qkv_tensor *out = NULL;
    switch (kind) {
    case G_EMB: out = qkv_embedding(ctx, x, ids); break;
    case G_LN: out = qkv_layer_norm(ctx, x, gamma, beta, eps); break;
    case G_RMS: out = qkv_rms_norm(ctx, x, gamma, eps); break;
    case G_GELU_ERF: out = qkv_gelu(ctx, x, QKV_GELU_ERF); break;
    case G_GELU_TANH: out = qkv_gelu(ctx, x, QKV_GELU_TANH); break;
    }
    cr_assert_not_null(out, "%s: %s", name, qkv_errmsg(ctx));
    cr_assert_eq(qkv_backward(ctx, out, r), QKV_OK, "%s: %s", name, qkv_errmsg(ctx));
    double atol = dt == QKV_F64 ? 1e-12 : f32_tol, rtol = dt == QKV_F64 ? 1e-10 : f32_tol;
    const char *what[4] = {"out", kind == G_EMB ? "dtable" : "dx", "dgamma", "dbeta"};
    const qkv_tensor *got[4] = {out, x->grad, gamma ? gamma->grad : NULL, beta ? beta->grad : NULL};
    int bad = 0, compared = 0;
    for (int i = 0; i < 4; i++) {
        if (i >= 2 && !got[i] && !(i == 2 ? gamma : beta)) continue;
        char label[96];
        snprintf(label, sizeof label, "%s %s %s", name, qkv_dtype_name(dt), what[i]);
        bad += compare_golden(label, got[i], load_golden(ctx, name, what[i], false), atol, rtol);
        compared++;
    }
    cr_expect(compared >= 2);
    cr_expect_eq(bad, 0, "%s (%s): %d elements differ from PyTorch", name, qkv_dtype_name(dt), bad);
    qkv_ctx_free(ctx);
}

Test(golden, blocks_against_pytorch_in_f64_and_f32) {
    static const struct {
        const char *name;
        golden_kind kind;
        double f32_tol;
    } cases[] = {
        {"emb_b2_n5_v7_d4", G_EMB, 2e-5},   {"emb_n6_v5_d3", G_EMB, 2e-5},
        {"ln_b2_n3_d8", G_LN, 2e-5},        {"ln_const_rows_d5", G_LN, 2e-5},
        {"ln_offset_d16", G_LN, 3e-3},      {"ln_d1", G_LN, 2e-5},
        {"ln_odd_d33", G_LN, 2e-5},         {"rms_b2_n3_d8", G_RMS, 2e-5},
        {"rms_zero_row_d5", G_RMS, 2e-5},   {"rms_large_d16", G_RMS, 2e-5},
        {"rms_odd_d33", G_RMS, 2e-5},       {"gelu_erf_4x33", G_GELU_ERF, 2e-5},
        {"gelu_tanh_4x33", G_GELU_TANH, 2e-5},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        check_golden(cases[c].name, cases[c].kind, QKV_F64, 0);
        check_golden(cases[c].name, cases[c].kind, QKV_F32, cases[c].f32_tol);
    }
}

/* ---- the f32 erf / erfc / GELU kernels (ops/kernels/gelu_*.c) --------------------------------------- */

/* The error of got against the exact value want (double), in ulps of f32 at want (2^-149 below FLT_MIN). */
static double ulp_error(float got, double want) {
    if (isnan(want)) return isnan(got) ? 0.0 : INFINITY;
    if (isinf(want)) return (double)got == want ? 0.0 : INFINITY;
    double aw = fabs(want), ulp = 0x1p-149;
    if (aw >= 0x1p-126) {
        int e;
        frexp(aw, &e); /* aw in [2^(e-1), 2^e) */
        ulp = ldexp(1.0, e - 1 - 23);
    }
    return fabs((double)got - want) / ulp;
}

typedef struct ulp_tally {
    double worst;
    float worst_at;
    int64_t count;
} ulp_tally;

/* The inputs of the sweep: every 509th f32 in [0, 12] (bit patterns, so every binade down to the
 * subnormals is covered), every f32 around the erf branch point 1 (within 2^-10) and in erfc's subnormal
 * tail [9.1, 10.1], every 61st subnormal, and the special values; each with both signs. */
static int64_t sweep_inputs(float *z, int64_t cap) {
    int64_t n = 0;
    uint32_t top;
    float twelve = 12.0f;
    memcpy(&top, &twelve, sizeof top);
    for (uint32_t b = 0; b <= top && n + 2 <= cap; b += 509) {
        float v;
        memcpy(&v, &b, sizeof v);
        z[n++] = v, z[n++] = -v;
    }
    for (float v = 1.0f - 0x1p-10f; v <= 1.0f + 0x1p-10f && n + 2 <= cap; v = nextafterf(v, 2.0f))
        z[n++] = v, z[n++] = -v;
    for (float v = 9.1f; v <= 10.1f && n + 2 <= cap; v = nextafterf(v, 11.0f)) z[n++] = v, z[n++] = -v;
    for (uint32_t b = 1; b < 0x00800000u && n + 2 <= cap; b += 61) {
        float v;
        memcpy(&v, &b, sizeof v);
        z[n++] = v, z[n++] = -v;
    }
    const float special[] = {0.0f, 0x1p-149f, 0x1p-126f, 0.5f, 1.0f, 3.9f, 11.0f, 30.0f, 1e30f, 3.4e38f, INFINITY};
    for (size_t i = 0; i < sizeof special / sizeof special[0] && n + 2 <= cap; i++)
        z[n++] = special[i], z[n++] = -special[i];
    if (n < cap) z[n++] = NAN;
    return n;
}

enum { SWEEP_CAP = 1 << 23 };

/* erf and erfc of each kernel set within their documented bounds (gelu_kernels.h) of the exact values
 * (double erf / erfc, accurate to < 1 ulp of double), and within one more ulp of libm's erff / erfcf;
 * the special values exactly; and the AVX2 and AVX-512 sets bit for bit equal to the portable one. */
Test(erf_kernels, within_the_documented_ulp_bounds_over_a_dense_sweep) {
    float *z = malloc(SWEEP_CAP * sizeof *z), *out[QKV_ISA_COUNT_][2];
    cr_assert_not_null(z);
    int64_t n = sweep_inputs(z, SWEEP_CAP);
    cr_assert_gt(n, 1000000, "the sweep has %lld inputs", (long long)n);
    int sets = 0;
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++) {
        const qkv_gelu_kernel_set_ *k = qkv_gelu_kernels_isa_(isa);
        out[isa][0] = out[isa][1] = NULL;
        if (!k) continue;
        sets++;
        for (int f = 0; f < 2; f++) {
            out[isa][f] = malloc((size_t)n * sizeof(float));
            cr_assert_not_null(out[isa][f]);
            (f ? k->erfc : k->erf)(z, out[isa][f], n);
            const double bound = f ? QKV_ERFC_F32_ULP : QKV_ERF_F32_ULP;
            ulp_tally vs_exact = {0, 0, 0}, vs_libm = {0, 0, 0};
            for (int64_t i = 0; i < n; i++) {
                double want = f ? erfc((double)z[i]) : erf((double)z[i]);
                float libm = f ? erfcf(z[i]) : erff(z[i]);
                double e = ulp_error(out[isa][f][i], want), el = ulp_error(out[isa][f][i], (double)libm);
                if (!(e <= vs_exact.worst)) vs_exact.worst = e, vs_exact.worst_at = z[i];
                if (!(el <= vs_libm.worst)) vs_libm.worst = el, vs_libm.worst_at = z[i];
                if (!(e <= bound)) vs_exact.count++;
            }
            const char *name = f ? "erfc" : "erf";
            cr_expect(vs_exact.count == 0, "%s %s: %lld of %lld inputs beyond %g ulp; worst %.3g ulp at z = %.9g", k->name,
                      name, (long long)vs_exact.count, (long long)n, bound, vs_exact.worst, (double)vs_exact.worst_at);
            cr_expect(vs_libm.worst <= bound + 1.0, "%s %s: %.3g ulp from libm's %sf at z = %.9g", k->name, name,
                      vs_libm.worst, name, (double)vs_libm.worst_at);
            if (getenv("QKV_TEST_VERBOSE"))
                printf("%s %s over %lld inputs: worst %.3g ulp (z = %.9g) from exact, %.3g ulp (z = %.9g) from libm\n",
                       k->name, name, (long long)n, vs_exact.worst, (double)vs_exact.worst_at, vs_libm.worst,
                       (double)vs_libm.worst_at);
        }
        /* the special values exactly */
        const float zs[7] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 0x1p-149f, -30.0f};
        float e[7], c[7];
        k->erf(zs, e, 7);
        k->erfc(zs, c, 7);
        cr_expect(e[0] == 0.0f && !signbit(e[0]) && e[1] == 0.0f && signbit(e[1]), "%s erf(+-0) = %g, %g", k->name,
                  (double)e[0], (double)e[1]);
        cr_expect(e[2] == 1.0f && e[3] == -1.0f && isnan(e[4]), "%s erf(inf, -inf, NaN) = %g, %g, %g", k->name,
                  (double)e[2], (double)e[3], (double)e[4]);
        cr_expect(e[5] == 0x1p-149f, "%s erf(2^-149) = %a (2 / sqrt(pi) 2^-149 rounds to 2^-149)", k->name,
                  (double)e[5]);
        cr_expect(c[0] == 1.0f && c[1] == 1.0f && c[2] == 0.0f && c[3] == 2.0f && isnan(c[4]) && c[6] == 2.0f,
                  "%s erfc(0, -0, inf, -inf, NaN, -30) = %g %g %g %g %g %g", k->name, (double)c[0], (double)c[1],
                  (double)c[2], (double)c[3], (double)c[4], (double)c[6]);
    }
    cr_expect_geq(sets, 1);
    for (int isa = QKV_ISA_PORTABLE_ + 1; isa < QKV_ISA_COUNT_ && out[0][0]; isa++) {
        if (!out[isa][0]) continue;
        int64_t differ = 0;
        for (int f = 0; f < 2; f++)
            for (int64_t i = 0; i < n; i++)
                if (memcmp(&out[0][f][i], &out[isa][f][i], sizeof(float)) != 0 &&
                    !(isnan(out[0][f][i]) && isnan(out[isa][f][i])))
                    differ++;
        cr_expect_eq(differ, 0, "the %s erf / erfc differ from the portable ones at %lld inputs",
                     qkv_gelu_kernels_isa_(isa)->name, (long long)differ);
    }
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++) free(out[isa][0]), free(out[isa][1]);
    free(z);
}

/* The GELU kernels of every vector set (AVX2, AVX-512) give the portable set's bits (tests/elementwise_cases.h)
 * over x in [-20, 20] by 2^-9, every 509th f32 up to 12 with both signs, and the special values. */
Test(erf_kernels, gelu_vector_sets_match_portable_bit_for_bit) {
    const qkv_gelu_kernel_set_ *p = qkv_gelu_kernels_isa_(QKV_ISA_PORTABLE_);
    cr_assert_not_null(p);
    float *x = malloc(SWEEP_CAP * sizeof *x);
    cr_assert_not_null(x);
    int64_t n = sweep_inputs(x, SWEEP_CAP - 20481);
    for (int i = 0; i < 20481; i++) x[n++] = (float)(-20.0 + i / 512.0);
    int compared = 0;
    for (int isa = QKV_ISA_PORTABLE_ + 1; isa < QKV_ISA_COUNT_; isa++) {
        const qkv_gelu_kernel_set_ *k = qkv_gelu_kernels_isa_(isa);
        if (!k) continue;
        compared++;
        int64_t differ = gelu_sets_differ(p, k, x, n);
        cr_expect_eq(differ, 0, "%s: %lld of %lld inputs' values differ", k->name, (long long)differ, (long long)n);
    }
    if (!compared) cr_log_warn("no AVX2+FMA: nothing to compare");
    free(x);
}

/* ---- the f32 layer-norm kernels (ops/kernels/layer_norm_*.c) --------------------------------------- */

/* The AVX2 and AVX-512 layer-norm kernels give the portable ones' bits (tests/elementwise_cases.h). */
Test(layer_norm_kernels, vector_sets_match_portable_bit_for_bit) {
    const qkv_layer_norm_kernel_set_ *p = qkv_layer_norm_kernels_isa_(QKV_ISA_PORTABLE_);
    cr_assert_not_null(p);
    int compared = 0;
    for (int isa = QKV_ISA_PORTABLE_ + 1; isa < QKV_ISA_COUNT_; isa++) {
        const qkv_layer_norm_kernel_set_ *k = qkv_layer_norm_kernels_isa_(isa);
        if (!k) continue;
        compared++;
        int cases = 0, differ = layer_norm_sets_differ(p, k, &cases);
        cr_expect_eq(differ, 0, "%s: %d of %d cases differ", k->name, differ, cases);
    }
    if (!compared) cr_log_warn("no AVX2: nothing to compare");
}

/* An eps that is 0 or subnormal as an f32 (1e-300) is refused for f32, where a constant row would give
 * 1/sqrt(0) and 0 * inf = NaN; in f64 it is a normal number and the constant row gives beta exactly. */
Test(norms, an_f32_eps_below_flt_min_is_refused_and_f64_takes_it) {
    for (int rms = 0; rms < 2; rms++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *x32 = qkv_full(ctx, QKV_F32, 2, (int64_t[]){2, 4}, 3.0);
        qkv_tensor *y = rms ? qkv_rms_norm(ctx, x32, NULL, 1e-300) : qkv_layer_norm(ctx, x32, NULL, NULL, 1e-300);
        const char *frag[] = {rms ? "qkv_rms_norm" : "qkv_layer_norm", "[2,4]", "FLT_MIN", NULL};
        expect_misuse(ctx, rms ? "rms_norm f32" : "layer_norm f32", y, QKV_ERR_ARG, frag);
        qkv_clear_error(ctx);
        y = rms ? qkv_rms_norm(ctx, x32, NULL, FLT_MIN) : qkv_layer_norm(ctx, x32, NULL, NULL, FLT_MIN);
        cr_assert_not_null(y, "FLT_MIN itself is accepted: %s", qkv_errmsg(ctx));
        for (int64_t i = 0; i < y->numel; i++) cr_expect(isfinite(qkv_f32(y)[i]));
        qkv_tensor *x64 = qkv_full(ctx, QKV_F64, 2, (int64_t[]){2, 4}, 3.0);
        qkv_set_requires_grad(ctx, x64, true);
        y = rms ? qkv_rms_norm(ctx, x64, NULL, 1e-300) : qkv_layer_norm(ctx, x64, NULL, NULL, 1e-300);
        cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
        if (!rms)
            for (int64_t i = 0; i < y->numel; i++) cr_expect_eq(qkv_f64(y)[i], 0.0, "a constant row gives beta (0)");
        cr_expect_eq(qkv_backward(ctx, qkv_sum(ctx, y), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        for (int64_t i = 0; i < x64->numel; i++) cr_expect(isfinite(qkv_f64(x64->grad)[i]));
        qkv_ctx_free(ctx);
    }
}

/* ---- the GELU kernels' polynomial path, and a fresh dx ------------------------------------------------- */

/* y = x Phi(x) and dy/dx = Phi(x) + x phi(x) of each kernel set against double over every 1021st f32 in
 * (-3, 8] (bit patterns: every binade down to the subnormals, both signs), (-3, 8] by 2^-16, and the ends
 * of the pieces:
 * y within QKV_GELU_Y_F32_ULP ulp of y, dy/dx within QKV_GELU_DY_F32_ULP ulp of |dy/dx| + 2 Phi(x) (the
 * two terms cancel near x = -0.75; the scale of tests/test_embed_norm_gelu.c's f32 checks), and for x >= 6
 * (the last piece's end, evaluated there) y = x and dy/dx = 1 exactly. */
Test(erf_kernels, gelu_polynomial_path_within_its_ulp_bounds) {
    enum { CAP = 1 << 22 };
    float *x = malloc(CAP * sizeof *x), *y = malloc(CAP * sizeof *y), *g = malloc(CAP * sizeof *g),
          *one = malloc(CAP * sizeof *one);
    cr_assert(x && y && g && one);
    int64_t n = 0;
    uint32_t top, three;
    memcpy(&top, &(float){8.0f}, sizeof top);
    memcpy(&three, &(float){3.0f}, sizeof three);
    for (uint32_t b = 0; b <= top && n + 2 <= CAP; b += 1021) {
        float v;
        memcpy(&v, &b, sizeof v);
        x[n++] = v;
        if (b < three) x[n++] = -v; /* -3 itself is the erfc path's */
    }
    for (double v = -3.0 + 0x1p-16; v <= 8.0 && n + 1 <= CAP; v += 0x1p-16) x[n++] = (float)v;
    for (int k = -3; k <= 6 && n + 64 <= CAP; k++) /* around each piece's edge k - 1/2, and -3, 4, 6 */
        for (float v = nextafterf((float)k - 0.5f, -INFINITY), c = 0; c < 16; c++, v = nextafterf(v, INFINITY))
            if (v > -3.0f) x[n++] = v, x[n++] = nextafterf((float)k, -INFINITY) + (float)c * 0x1p-20f;
    for (int64_t i = 0; i < n; i++) one[i] = 1.0f;
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++) {
        const qkv_gelu_kernel_set_ *k = qkv_gelu_kernels_isa_(isa);
        if (!k) continue;
        k->erf_forward(x, y, n);
        k->erf_backward(x, one, g, n, false);
        double worst_y = 0, worst_g = 0;
        float at_y = 0, at_g = 0;
        int64_t exact_bad = 0;
        for (int64_t i = 0; i < n; i++) {
            if (!(x[i] > -3.0f)) continue;
            double v = x[i], phi = 0.5 * erfc(-v / sqrt(2.0)), want_y = v * phi;
            double want_g = phi + v * exp(-0.5 * v * v) * 0.3989422804014327; /* 1 / sqrt(2 pi) */
            double ey = want_y == 0.0 ? (y[i] == 0.0f ? 0.0 : INFINITY) : ulp_error(y[i], want_y);
            double eg = fabs((double)g[i] - want_g) / ldexp(1.0, ilogb(fabs(want_g) + 2.0 * phi) - 23);
            if (!(ey <= worst_y)) worst_y = ey, at_y = x[i];
            if (!(eg <= worst_g)) worst_g = eg, at_g = x[i];
            if (x[i] >= 6.0f && !(y[i] == x[i] && g[i] == 1.0f)) exact_bad++;
        }
        cr_expect(worst_y <= QKV_GELU_Y_F32_ULP, "%s y: %.3g ulp at x = %.9g (bound %d)", k->name, worst_y,
                  (double)at_y, QKV_GELU_Y_F32_ULP);
        cr_expect(worst_g <= QKV_GELU_DY_F32_ULP, "%s dy/dx: %.3g ulp at x = %.9g (bound %d)", k->name, worst_g,
                  (double)at_g, QKV_GELU_DY_F32_ULP);
        cr_expect_eq(exact_bad, 0, "%s: %lld inputs x >= 6 with y != x or dy/dx != 1", k->name, (long long)exact_bad);
        if (getenv("QKV_TEST_VERBOSE"))
            printf("%s gelu over %lld inputs: y worst %.3g ulp (x = %.9g), dy/dx %.3g ulp (x = %.9g)\n", k->name,
                   (long long)n, worst_y, (double)at_y, worst_g, (double)at_g);
    }
    free(x), free(y), free(g), free(one);
}

/* A step tensor's dx is stored by the f32 erf backward, not zeroed and added to: over a reused arena (filled
 * with 7s first) the gradient of x used by two GELUs and a scale is the sum of the three, as the f64 run and
 * a run with x a parameter (whose gradient is added to) say. */
Test(gelu, a_fresh_f32_gradient_is_stored_and_a_tensor_used_twice_gets_the_sum) {
    enum { N = 67 };
    double want[N], got[2][N];
    for (int run = 0; run < 3; run++) { /* 0: f64 step tensor, 1: f32 step tensor, 2: f32 parameter */
        qkv_dtype dt = run == 0 ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        int64_t n = N;
        for (int step = 0; step < 3; step++) {
            qkv_tensor *dirt = qkv_full(ctx, dt, 1, (int64_t[]){1 << 14}, 7.0 + step);
            cr_assert_not_null(dirt, "%s", qkv_errmsg(ctx));
            qkv_step_end(ctx); /* the arena now holds 7s where x's gradient will go */
            double xv[N];
            for (int i = 0; i < N; i++) xv[i] = -4.0 + 8.0 * i / (N - 1);
            qkv_tensor *x = tensor_of(ctx, dt, 1, &n, xv);
            if (run == 2) x = qkv_param(ctx, x), qkv_zero_grads(ctx);
            else qkv_set_requires_grad(ctx, x, true);
            /* the backward walks b's GELU first (x has no gradient yet: stored), then a's and c's (added) */
            qkv_tensor *c = qkv_scale(ctx, x, 0.5);
            qkv_tensor *a = qkv_gelu(ctx, x, QKV_GELU_ERF), *b = qkv_gelu(ctx, x, QKV_GELU_ERF);
            qkv_tensor *s = qkv_add(ctx, qkv_add(ctx, c, qkv_scale(ctx, b, 2.0)), a);
            cr_assert_not_null(s, "%s", qkv_errmsg(ctx));
            cr_assert_eq(qkv_backward(ctx, s, qkv_ones(ctx, dt, 1, &n)), QKV_OK, "%s", qkv_errmsg(ctx));
            for (int i = 0; i < N; i++) {
                double v = at(x->grad, i);
                if (run == 0) want[i] = v;
                else got[run - 1][i] = v;
            }
            qkv_step_end(ctx);
            if (run == 2) qkv_free(ctx, x);
        }
        cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
        qkv_ctx_free(ctx);
    }
    int bad = 0;
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < N; i++) {
            /* 3 Phi(x) + 3 x phi(x) + 0.5, each GELU's dy/dx within 1e-6 of |dy/dx| + 2 Phi */
            if (fabs(got[r][i] - want[i]) <= 2e-5 * (1.0 + fabs(want[i]))) continue;
            if (bad++ < 5)
                cr_expect(false, "%s x[%d]: dx %.9g, f64 %.9g", r ? "parameter" : "step tensor", i, got[r][i], want[i]);
        }
    cr_expect_eq(bad, 0, "%d gradients differ", bad);
}

/* qkv_backward(ctx, y, dy) on a step tensor y: y's gradient is dy itself (no copy) when dy is a step tensor
 * of y's dtype and not a gradient; a copy when dy is persistent (it could be freed or outlive the step), a
 * gradient (here x's own, which the walk adds into), of the other dtype, or when the loss is a leaf. Every
 * case gives the same x gradient as the copy would, and dy is left as it was. */
Test(gelu, the_loss_gradient_is_a_step_or_kept_dloss_itself_unless_the_walk_or_an_optimizer_could_write_it) {
    enum { N = 37 };
    double xv[N], dv[N], want[N];
    for (int i = 0; i < N; i++) xv[i] = -3.5 + 7.0 * i / (N - 1), dv[i] = (double)(i % 5) / 8.0 - 0.25;
    int64_t n = N;
    /* dy: 0 step, 1 kept (both taken as they are), 2 f64 step, 3 x's gradient, 4 a parameter (copied) */
    for (int c = 0; c < 5; c++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *x = qkv_param(ctx, tensor_of(ctx, QKV_F32, 1, &n, xv));
        qkv_tensor *kept = qkv_keep(ctx, tensor_of(ctx, QKV_F32, 1, &n, dv));
        qkv_tensor *param_dy = qkv_param(ctx, tensor_of(ctx, QKV_F32, 1, &n, dv));
        cr_assert_not_null(param_dy, "%s", qkv_errmsg(ctx));
        qkv_step_end(ctx);
        if (c == 3) { /* x's gradient made, holding dv */
            qkv_tensor *y0 = qkv_scale(ctx, x, 1.0);
            cr_assert_eq(qkv_backward(ctx, y0, kept), QKV_OK, "%s", qkv_errmsg(ctx));
            qkv_step_end(ctx);
        }
        for (int step = 0; step < 2; step++) { /* the second step reuses the arena */
            qkv_tensor *dy = c == 0 ? tensor_of(ctx, QKV_F32, 1, &n, dv)
                             : c == 1 ? kept
                             : c == 2 ? tensor_of(ctx, QKV_F64, 1, &n, dv)
                             : c == 3 ? x->grad
                                      : param_dy;
            qkv_tensor *y = qkv_gelu(ctx, x, QKV_GELU_ERF);
            cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
            cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
            bool borrowed = c <= 1;
            cr_expect_eq(y->grad == dy, borrowed, "case %d: y's gradient %s dy", c, borrowed ? "is not" : "is");
            int bad = 0;
            for (int i = 0; i < N; i++) {
                double g = at(x->grad, i), base = c == 3 ? dv[i] : 0.0;
                if (c == 0 && step == 0) want[i] = g; /* the others must match it (added to dv in case 3) */
                else bad += fabs(g - (base + want[i])) > 1e-6 * (1.0 + fabs(g));
                if (c != 3) bad += at(dy, i) != dv[i]; /* dy unchanged */
                bad += at(y->grad, i) != dv[i];
            }
            cr_expect_eq(bad, 0, "case %d step %d: %d values differ", c, step, bad);
            if (c == 3) break; /* x's gradient has moved on */
            qkv_step_end(ctx);
            qkv_zero_grads(ctx);
        }
        cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
        qkv_ctx_free(ctx);
    }
    /* a leaf as the loss (a step tensor or a parameter): its gradient is dloss's copy */
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *p = qkv_param(ctx, tensor_of(ctx, QKV_F32, 1, &n, xv));
    qkv_step_end(ctx);
    qkv_tensor *leaf = tensor_of(ctx, QKV_F32, 1, &n, xv), *d = tensor_of(ctx, QKV_F32, 1, &n, dv);
    qkv_set_requires_grad(ctx, leaf, true);
    cr_assert_eq(qkv_backward(ctx, leaf, d), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect(leaf->grad != d && at(leaf->grad, 1) == dv[1], "a step leaf's gradient: %g", at(leaf->grad, 1));
    qkv_step_end(ctx);
    d = tensor_of(ctx, QKV_F32, 1, &n, dv);
    cr_assert_eq(qkv_backward(ctx, p, d), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect(p->grad != d && at(p->grad, 1) == dv[1], "a parameter's own gradient: %g", at(p->grad, 1));
    qkv_ctx_free(ctx);
}
