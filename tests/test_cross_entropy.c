/*
 * test_cross_entropy.c — qkv_cross_entropy: hand values and hand gradients, ignored targets (NaN logits
 * on ignored rows do not leak), all ignored (0 and a zero gradient), logits of 1000, every leading shape,
 * f32 against f64, gradcheck over 24 configurations, and the error table.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "qkv.h"
#include "test_ops.h"

static qkv_tensor *targets_of(qkv_ctx *ctx, int ndim, const int64_t *shape, const int32_t *v) {
    qkv_tensor *t = qkv_from_data(ctx, QKV_I32, ndim, shape, v);
    cr_assert_not_null(t, "%s", qkv_errmsg(ctx));
    return t;
}

/* Oracle: -log softmax(x)[t] = log(sum_j exp(x[j] - x[t])), written without max subtraction. */
static double oracle_token_loss(const double *x, int64_t v, int32_t t) {
    double z = 0.0;
    for (int64_t j = 0; j < v; j++) z += exp(x[j] - x[t]);
    return log(z);
}

Test(cross_entropy, hand_value_and_gradient) {
    /* logits [1, 2, 3], target 2: loss = log(e + e^2 + e^3) - 3 */
    const double want = log(exp(1.0) + exp(2.0) + exp(3.0)) - 3.0;
    const double z = exp(1.0) + exp(2.0) + exp(3.0);
    const double p[3] = {exp(1.0) / z, exp(2.0) / z, exp(3.0) / z};
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *x = tensor_of(ctx, dt, 1, (int64_t[]){3}, (double[]){1, 2, 3});
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *loss = qkv_cross_entropy(ctx, x, targets_of(ctx, 0, NULL, (int32_t[]){2}));
        cr_assert_not_null(loss, "%s", qkv_errmsg(ctx));
        cr_expect(loss->ndim == 0 && loss->numel == 1 && loss->dtype == dt, "a scalar of the logits' dtype");
        double tol = d ? 1e-15 : 1e-6;
        cr_expect(fabs(at(loss, 0) - want) < tol, "%s loss %.17g, want %.17g", qkv_dtype_name(dt),
                  at(loss, 0), want);
        /* dloss = 2: dlogits = 2 (softmax - onehot) / 1 */
        cr_assert_eq(qkv_backward(ctx, loss, qkv_scalar(ctx, dt, 2.0)), QKV_OK, "%s", qkv_errmsg(ctx));
        const double wg[3] = {2 * p[0], 2 * p[1], 2 * (p[2] - 1)};
        for (int j = 0; j < 3; j++)
            cr_expect(fabs(at(x->grad, j) - wg[j]) < tol, "%s dlogits[%d] = %.17g, want %.17g",
                      qkv_dtype_name(dt), j, at(x->grad, j), wg[j]);
        qkv_ctx_free(ctx);
    }
    /* two tokens: the mean of log(1 + e) - ... written out; targets 0 and 2 over [0, 1, 0] and [1, 2, 3] */
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = tensor_of(ctx, QKV_F64, 2, (int64_t[]){2, 3}, (double[]){0, 1, 0, 1, 2, 3});
    qkv_set_requires_grad(ctx, x, true);
    qkv_tensor *loss = qkv_cross_entropy(ctx, x, targets_of(ctx, 1, (int64_t[]){2}, (int32_t[]){0, 2}));
    cr_assert_not_null(loss);
    double l0 = log(2.0 + exp(1.0)), l1 = want;
    cr_expect(fabs(qkv_f64(loss)[0] - (l0 + l1) / 2) < 1e-15, "loss %.17g", qkv_f64(loss)[0]);
    cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK);
    double z0 = 2.0 + exp(1.0);
    const double wg[6] = {(1 / z0 - 1) / 2, exp(1.0) / z0 / 2, 1 / z0 / 2,
                          p[0] / 2,         p[1] / 2,          (p[2] - 1) / 2};
    for (int j = 0; j < 6; j++)
        cr_expect(fabs(qkv_f64(x->grad)[j] - wg[j]) < 1e-15, "dlogits[%d] = %.17g", j, qkv_f64(x->grad)[j]);
    qkv_ctx_free(ctx);
}

Test(cross_entropy, ignored_targets_are_not_counted_or_read) {
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        /* 4 tokens, V = 3; tokens 1 and 3 ignored (-1, -100); their logits are NaN and inf */
        const double v[12] = {0.5, -1, 2, NAN, INFINITY, 1, 3, 0, -2, -INFINITY, NAN, 0};
        qkv_tensor *x = tensor_of(ctx, dt, 3, (int64_t[]){2, 2, 3}, v);
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *loss =
            qkv_cross_entropy(ctx, x, targets_of(ctx, 2, (int64_t[]){2, 2}, (int32_t[]){2, -1, 0, -100}));
        cr_assert_not_null(loss, "%s", qkv_errmsg(ctx));
        double want = (oracle_token_loss(v, 3, 2) + oracle_token_loss(v + 6, 3, 0)) / 2; /* count 2, not 4 */
        double tol = d ? 1e-15 : 1e-6;
        cr_expect(fabs(at(loss, 0) - want) < tol, "%s loss %.17g, want %.17g", qkv_dtype_name(dt),
                  at(loss, 0), want);
        cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        int bad = 0;
        for (int j = 0; j < 3; j++) bad += at(x->grad, 3 + j) != 0.0 || at(x->grad, 9 + j) != 0.0;
        cr_expect_eq(bad, 0, "%s: ignored rows have non-zero gradients", qkv_dtype_name(dt));
        /* counted rows: (softmax - onehot) / 2 */
        double s0 = exp(0.5) + exp(-1.0) + exp(2.0);
        cr_expect(fabs(at(x->grad, 2) - (exp(2.0) / s0 - 1) / 2) < tol, "dlogits[0][2] = %.17g",
                  at(x->grad, 2));
        cr_expect(fabs(at(x->grad, 1) - exp(-1.0) / s0 / 2) < tol, "dlogits[0][1] = %.17g", at(x->grad, 1));
        qkv_ctx_free(ctx);
    }
}

Test(cross_entropy, all_ignored_gives_zero_and_zero_gradient) {
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *x = qkv_randn(ctx, dt, 2, (int64_t[]){3, 4}, 0, 1);
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *loss =
            qkv_cross_entropy(ctx, x, targets_of(ctx, 1, (int64_t[]){3}, (int32_t[]){-1, -1, -7}));
        cr_assert_not_null(loss, "%s", qkv_errmsg(ctx));
        cr_expect(at(loss, 0) == 0.0, "%s: loss %g, want exactly 0", qkv_dtype_name(dt), at(loss, 0));
        cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        int bad = 0;
        for (int j = 0; j < 12; j++) bad += !(at(x->grad, j) == 0.0);
        cr_expect_eq(bad, 0, "%s: %d gradient entries are not exactly 0", qkv_dtype_name(dt), bad);
        qkv_ctx_free(ctx);
    }
    /* no tokens at all ([0, V] logits) is also a count of 0 */
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *loss = qkv_cross_entropy(ctx, qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){0, 5}),
                                         qkv_zeros(ctx, QKV_I32, 1, (int64_t[]){0}));
    cr_expect(loss && qkv_f64(loss)[0] == 0.0, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

Test(cross_entropy, large_logits_stay_finite) {
    /* [1000, 0, -1000]: target 0 -> log(1 + e^-1000 + e^-2000) = 0 (to double precision); target 1 -> 1000;
     * [1000, 1000]: log 2; [-1000, -1000, -999]: target 2 -> log(1 + 2 e^-1). */
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        const double v[4][3] = {
            {1000, 0, -1000}, {1000, 0, -1000}, {1000, 1000, -INFINITY}, {-1000, -1000, -999}};
        const int32_t t[4] = {0, 1, 0, 2};
        const double want[4] = {0.0, 1000.0, log(2.0), log(1.0 + 2.0 * exp(-1.0))};
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        double tol = d ? 1e-12 : 1e-4;
        for (int k = 0; k < 4; k++) {
            qkv_tensor *x = tensor_of(ctx, dt, 1, (int64_t[]){3}, v[k]);
            qkv_set_requires_grad(ctx, x, true);
            qkv_tensor *loss = qkv_cross_entropy(ctx, x, targets_of(ctx, 0, NULL, &t[k]));
            cr_assert_not_null(loss, "%s", qkv_errmsg(ctx));
            cr_expect(isfinite(at(loss, 0)) && fabs(at(loss, 0) - want[k]) <= tol * fmax(1.0, want[k]),
                      "%s case %d: loss %.17g, want %.17g", qkv_dtype_name(dt), k, at(loss, 0), want[k]);
            cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
            double gsum = 0.0;
            for (int j = 0; j < 3; j++) {
                cr_expect(isfinite(at(x->grad, j)), "%s case %d: dlogits[%d] = %g", qkv_dtype_name(dt), k, j,
                          at(x->grad, j));
                gsum += at(x->grad, j);
            }
            cr_expect(fabs(gsum) < 1e-6, "gradient rows of softmax - onehot sum to 0, got %g", gsum);
            qkv_step_end(ctx);
        }
        qkv_ctx_free(ctx);
    }
}

Test(cross_entropy, every_leading_shape) {
    /* [V] with a scalar target, [N, V], [B, n, V], [a, b, c, V]: the same tokens give the same loss */
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const int64_t shapes[3][4] = {{12, 5, 0, 0}, {3, 4, 5, 0}, {2, 3, 2, 5}};
    const int nd[3] = {2, 3, 4};
    qkv_tensor *x = qkv_randn(ctx, QKV_F64, 2, shapes[0], 0, 2);
    int32_t tg[12];
    for (int i = 0; i < 12; i++) tg[i] = i % 4 == 3 ? -1 : (i * 7) % 5;
    double want = 0.0;
    int count = 0;
    for (int i = 0; i < 12; i++)
        if (tg[i] >= 0) want += oracle_token_loss(qkv_f64(x) + i * 5, 5, tg[i]), count++;
    want /= count;
    for (int s = 0; s < 3; s++) {
        qkv_tensor *xs = qkv_reshape(ctx, x, nd[s], shapes[s]);
        qkv_tensor *ts = targets_of(ctx, nd[s] - 1, shapes[s], tg);
        qkv_tensor *loss = qkv_cross_entropy(ctx, xs, ts);
        cr_assert_not_null(loss, "%s", qkv_errmsg(ctx));
        cr_expect(fabs(qkv_f64(loss)[0] - want) < 1e-13, "%d-D: loss %.17g, want %.17g", nd[s],
                  qkv_f64(loss)[0], want);
    }
    qkv_tensor *x1 = qkv_reshape(ctx, x, 1, (int64_t[]){60});
    qkv_tensor *l1 = qkv_cross_entropy(ctx, x1, targets_of(ctx, 0, NULL, (int32_t[]){17}));
    cr_assert_not_null(l1, "%s", qkv_errmsg(ctx));
    cr_expect(fabs(qkv_f64(l1)[0] - oracle_token_loss(qkv_f64(x), 60, 17)) < 1e-13);
    qkv_ctx_free(ctx);
}

Test(cross_entropy, f32_matches_f64) {
    qkv_options o = qkv_default_options();
    o.seed = 3;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    int64_t shape[3] = {3, 5, 11};
    qkv_tensor *x64 = qkv_keep(ctx, qkv_randn(ctx, QKV_F64, 3, shape, 0, 4));
    int32_t tg[15];
    for (int i = 0; i < 15; i++) tg[i] = i % 5 == 2 ? -1 : (i * 3) % 11;
    qkv_tensor *t = qkv_keep(ctx, targets_of(ctx, 2, shape, tg));
    qkv_tensor *x32 = qkv_to_dtype(ctx, x64, QKV_F32);
    qkv_set_requires_grad(ctx, x32, true);
    qkv_tensor *l32 = qkv_cross_entropy(ctx, x32, t);
    cr_assert_eq(qkv_backward(ctx, l32, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    double v32 = at(l32, 0);
    qkv_tensor *g32 = qkv_keep(ctx, x32->grad);
    qkv_step_end(ctx);
    qkv_tensor *xc = qkv_copy(ctx, x64);
    qkv_set_requires_grad(ctx, xc, true);
    qkv_tensor *l64 = qkv_cross_entropy(ctx, xc, t);
    cr_assert_eq(qkv_backward(ctx, l64, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    double v64 = qkv_f64(l64)[0];
    double el = fabs(v32 - v64) / fabs(v64), eg = rel_norm_err(g32, xc->grad);
    cr_expect(el < 1e-4 && eg < 1e-4, "loss rel err %g, gradient rel err %g", el, eg);
    cr_expect(el > 0 || eg > 0, "f32 and f64 identical: did the f32 path run in f32?");
    qkv_ctx_free(ctx);
}

/* ---- gradcheck ----------------------------------------------------------------------------------- */

enum { L_RANDN, L_PM80, L_TIES, L_BIG_GAP };
enum { T_ALL, T_SOME_IGNORED, T_ALL_IGNORED };

typedef struct ce_config {
    int ndim;
    int64_t shape[4];
    int logits;
    int targets;
    double scale;
} ce_config;

static qkv_tensor *ce_fn(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)n;
    return qkv_cross_entropy(ctx, in[0], user);
}

static const ce_config CE_CONFIGS[] = {
    {1, {5}, L_RANDN, T_ALL, 1.0},    /* one token */
    {1, {1}, L_RANDN, T_ALL, 1.0},    /* V = 1: loss 0, gradient 0 */
    {2, {1, 7}, L_RANDN, T_ALL, 1.0}, /* n = 1 */
    {2, {4, 3}, L_RANDN, T_ALL, 1.0},
    {2, {6, 2}, L_RANDN, T_ALL, 3.0},          /* V = 2 */
    {2, {5, 9}, L_RANDN, T_SOME_IGNORED, 1.0}, /* ignored targets */
    {2, {3, 4}, L_RANDN, T_ALL_IGNORED, 1.0},  /* every target ignored */
    {3, {2, 3, 4}, L_RANDN, T_ALL, 1.0},       /* batch */
    {3, {3, 2, 5}, L_RANDN, T_SOME_IGNORED, 2.0},
    {3, {2, 1, 6}, L_RANDN, T_ALL, 0.70710678118654752},
    {4, {2, 2, 2, 3}, L_RANDN, T_ALL, 1.0}, /* 4-D */
    {4, {1, 2, 3, 4}, L_RANDN, T_SOME_IGNORED, 1.0},
    {2, {4, 5}, L_PM80, T_ALL, 1.0}, /* logits over [-80, 80] */
    {3, {2, 2, 6}, L_PM80, T_SOME_IGNORED, 1.0},
    {2, {3, 4}, L_TIES, T_ALL, 1.0}, /* ties */
    {3, {2, 3, 5}, L_TIES, T_SOME_IGNORED, 1.0},
    {2, {4, 4}, L_BIG_GAP, T_ALL, 1.0}, /* the target far ahead or far behind */
    {2, {8, 3}, L_RANDN, T_SOME_IGNORED, 5.0},
    {2, {2, 16}, L_RANDN, T_ALL, 1.0},   /* wider vocabulary */
    {3, {1, 1, 1}, L_RANDN, T_ALL, 1.0}, /* one token, V = 1 */
    {2, {5, 3}, L_PM80, T_ALL_IGNORED, 1.0},
    {3, {4, 2, 3}, L_TIES, T_ALL, 1.0},
    {2, {7, 6}, L_BIG_GAP, T_SOME_IGNORED, 1.0},
    {1, {12}, L_PM80, T_ALL, 1.0},
};

Test(cross_entropy, gradcheck_over_24_configurations) {
    int n_configs = (int)(sizeof CE_CONFIGS / sizeof CE_CONFIGS[0]);
    cr_assert(n_configs >= 20);
    int failed = 0;
    int64_t checked = 0;
    char first[512] = "";
    uint64_t lcg = 12345;
    for (int c = 0; c < n_configs; c++) {
        const ce_config *cfg = &CE_CONFIGS[c];
        qkv_options o = qkv_default_options();
        o.seed = 2000 + (uint64_t)c;
        qkv_ctx *ctx = qkv_ctx_new(&o);
        qkv_tensor *x = qkv_randn(ctx, QKV_F64, cfg->ndim, cfg->shape, 0, cfg->scale);
        int64_t V = cfg->shape[cfg->ndim - 1], rows = x->numel / V;
        qkv_tensor *t = qkv_zeros(ctx, QKV_I32, cfg->ndim - 1, cfg->shape);
        cr_assert(t && x, "%s", qkv_errmsg(ctx));
        for (int64_t r = 0; r < rows; r++) {
            lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
            int32_t tv = (int32_t)((lcg >> 33) % (uint64_t)V);
            if (cfg->targets == T_ALL_IGNORED || (cfg->targets == T_SOME_IGNORED && r % 3 == 1))
                tv = -1 - (int32_t)r;
            qkv_i32(t)[r] = tv;
            double *row = qkv_f64(x) + r * V;
            for (int64_t j = 0; j < V; j++) {
                if (cfg->logits == L_PM80)
                    row[j] = -80.0 + 160.0 * (double)((lcg >> (j % 20)) % 1000) / 999.0;
                if (cfg->logits == L_TIES) row[j] = round(row[j]);
                if (cfg->logits == L_BIG_GAP && tv >= 0 && j == tv) row[j] += r % 2 ? 30.0 : -30.0;
            }
        }
        qkv_gradcheck_result r;
        qkv_status st = qkv_gradcheck(ctx, ce_fn, &x, 1, t, NULL, &r);
        checked += r.checked;
        if (st != QKV_OK || !r.passed || r.checked != x->numel) {
            if (!failed)
                snprintf(first, sizeof first, "config %d: status %s (%s), %s", c, qkv_status_name(st),
                         qkv_errmsg(ctx), r.message);
            failed++;
        }
        qkv_ctx_free(ctx);
    }
    cr_expect_eq(failed, 0, "%d of %d configurations failed; first: %s", failed, n_configs, first);
    cr_expect(checked > 300, "only %lld elements checked", (long long)checked);
}

/* ---- errors -------------------------------------------------------------------------------------- */

Test(cross_entropy, errors) {
    struct {
        const char *name;
        int logits_kind; /* 0 f64, 1 i32, 2 NULL */
        int l_ndim;
        int64_t l_shape[4];
        int t_kind; /* 0 i32, 1 f32, 2 NULL, 3 u8 */
        int t_ndim;
        int64_t t_shape[4];
        int32_t bad_target; /* written at flat position 4 when >= -1000 */
        qkv_status status;
        const char *frag[4];
    } cases[] = {
        {"target == V", 0, 3, {2, 3, 5}, 0, 2, {2, 3}, 5,
         QKV_ERR_ARG, {"qkv_cross_entropy", "position 4", "is 5", "V = 5"}},
        {"target > V", 0, 2, {6, 5}, 0, 1, {6}, 1000000,
         QKV_ERR_ARG, {"qkv_cross_entropy", "[6,5]", "[6]", "1000000"}},
        {"targets f32", 0, 2, {6, 5}, 1, 1, {6}, -2000,
         QKV_ERR_DTYPE, {"qkv_cross_entropy", "[6,5]", "f32", "i32"}},
        {"targets u8", 0, 2, {6, 5}, 3, 1, {6}, -2000,
         QKV_ERR_DTYPE, {"qkv_cross_entropy", "u8", NULL}},
        {"logits i32", 1, 2, {6, 5}, 0, 1, {6}, -2000,
         QKV_ERR_DTYPE, {"qkv_cross_entropy", "logits", "i32", NULL}},
        {"logits NULL", 2, 0, {0}, 0, 1, {6}, -2000,
         QKV_ERR_NULL, {"qkv_cross_entropy", "logits", NULL}},
        {"targets NULL", 0, 2, {6, 5}, 2, 0, {0}, -2000,
         QKV_ERR_NULL, {"qkv_cross_entropy", "targets", NULL}},
        {"targets shape", 0, 3, {2, 3, 5}, 0, 2, {3, 2}, -2000,
         QKV_ERR_SHAPE, {"qkv_cross_entropy", "[2,3,5]", "[3,2]", "dimension 0"}},
        {"targets rank", 0, 3, {2, 3, 5}, 0, 3, {2, 3, 5}, -2000,
         QKV_ERR_SHAPE, {"qkv_cross_entropy", "[2,3,5]", "2 dimensions", NULL}},
        {"targets flat", 0, 3, {2, 3, 5}, 0, 1, {6}, -2000,
         QKV_ERR_SHAPE, {"[2,3,5]", "[6]", NULL}},
        {"logits scalar", 0, 0, {0}, 0, 0, {0}, -2000,
         QKV_ERR_RANK, {"qkv_cross_entropy", "[]", NULL}},
        {"V = 0 target 0", 0, 2, {6, 0}, 0, 1, {6}, 0,
         QKV_ERR_ARG, {"qkv_cross_entropy", "V = 0", NULL}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *x = cases[c].logits_kind == 2 ? NULL
                                                  : qkv_zeros(ctx, cases[c].logits_kind ? QKV_I32 : QKV_F64,
                                                              cases[c].l_ndim, cases[c].l_shape);
        qkv_dtype tdt = cases[c].t_kind == 1 ? QKV_F32 : cases[c].t_kind == 3 ? QKV_U8 : QKV_I32;
        qkv_tensor *t = cases[c].t_kind == 2 ? NULL : qkv_zeros(ctx, tdt, cases[c].t_ndim, cases[c].t_shape);
        if (cases[c].bad_target >= -1000 && t) {
            for (int64_t i = 0; i < t->numel; i++) qkv_i32(t)[i] = i % 2 ? -1 : 0; /* valid elsewhere */
            if (cases[c].bad_target == 0)
                qkv_i32(t)[0] = 0; /* V = 0 case: target 0 at position 0 */
            else
                qkv_i32(t)[4] = cases[c].bad_target;
        }
        cr_assert_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
        qkv_tensor *loss = qkv_cross_entropy(ctx, x, t);
        cr_expect_null(loss, "%s: a result despite the error", cases[c].name);
        cr_expect_eq(qkv_error(ctx), cases[c].status, "%s: %s (%s)", cases[c].name,
                     qkv_status_name(qkv_error(ctx)), qkv_errmsg(ctx));
        for (int i = 0; i < 4 && cases[c].frag[i]; i++)
            cr_expect(strstr(qkv_errmsg(ctx), cases[c].frag[i]) != NULL, "%s: \"%s\" lacks \"%s\"",
                      cases[c].name, qkv_errmsg(ctx), cases[c].frag[i]);
        qkv_ctx_free(ctx);
    }
    cr_expect_null(qkv_cross_entropy(NULL, NULL, NULL));
}
