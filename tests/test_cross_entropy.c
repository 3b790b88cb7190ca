/*
 * test_cross_entropy.c — qkv_cross_entropy: hand values and hand gradients, ignored targets (NaN logits
 * on ignored rows do not leak), all ignored (0 and a zero gradient), logits of 1000, every leading shape,
 * f32 against f64, gradcheck over 24 configurations, and the error table. The f32 fast path (the softmax
 * row kernel, the loss read off its softmax) against f64 with every kernel set this CPU has: vector tails
 * (V = 1 .. 1000), spreads up to 1e3 with the target's probability far below FLT_MIN, tiny losses,
 * NaN/inf logits, the running product's overflow guard, and ignored rows whose gradient is left untouched.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv_internal.h"
#include "test_alloc.h"
#include "test_ops.h"
#include "../ops/kernels/attention_kernels.h"

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

/* A row [M, M] with target 0 loses exactly log 2 whatever M: the loss is (m - x[t]) + log z, never
 * (m + log z) - x[t], which rounds log 2 to M's ulp (off by 4e-11 at M = 1e6, 1.9e-9 at 1e8, in the fourth digit
 * at 1e12, 0 at 1e16). f64 to 1 ulp of log 2; f32 (M's up to 1e16 are floats too) to 1e-6. Also negative M and
 * a row [M, M - 1, -inf] (target 1: log(1 + e)). */
Test(cross_entropy, large_logits_keep_every_digit_of_the_loss) {
    const double ms[] = {1e6, 1e8, 1e12, 1e16, -1e12};
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        for (size_t k = 0; k < sizeof ms / sizeof ms[0]; k++) {
            double M = ms[k];
            const double row[2] = {M, M};
            const int32_t t0 = 0;
            qkv_tensor *loss = qkv_cross_entropy(ctx, tensor_of(ctx, dt, 1, (int64_t[]){2}, row),
                                                 targets_of(ctx, 0, NULL, &t0));
            cr_assert_not_null(loss, "%s", qkv_errmsg(ctx));
            double tol = d ? 2.3e-16 : 1e-6;
            cr_expect(fabs(at(loss, 0) - log(2.0)) <= tol, "%s [%g, %g] target 0: loss %.17g, want log 2 = %.17g",
                      qkv_dtype_name(dt), M, M, at(loss, 0), log(2.0));
            if (d && fabs(M) <= 1e12) { // M - 1 is exact in f64 up to 2^53
                const double row3[3] = {M, M - 1, -INFINITY};
                const int32_t t1 = 1;
                loss = qkv_cross_entropy(ctx, tensor_of(ctx, dt, 1, (int64_t[]){3}, row3), targets_of(ctx, 0, NULL, &t1));
                cr_assert_not_null(loss, "%s", qkv_errmsg(ctx));
                double want = log1p(exp(1.0));
                cr_expect(fabs(at(loss, 0) - want) <= 4.5e-16, "f64 [%g, %g - 1] target 1: loss %.17g, want %.17g", M,
                          M, at(loss, 0), want);
            }
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

/* ---- the f32 fast path against f64 ------------------------------------------------------------------ */

/* Loss and dlogits (into grad, x->numel doubles) of qkv_cross_entropy on a copy of x (a kept tensor, f32
 * or f64) against the kept targets t, with upstream dloss; ends the step. */
static double loss_and_grad(qkv_ctx *ctx, const qkv_tensor *x, const qkv_tensor *t, double dloss,
                            double *grad) {
    qkv_tensor *xc = qkv_copy(ctx, x);
    cr_assert_not_null(xc, "%s", qkv_errmsg(ctx));
    qkv_set_requires_grad(ctx, xc, true);
    qkv_tensor *l = qkv_cross_entropy(ctx, xc, t);
    cr_assert_not_null(l, "%s", qkv_errmsg(ctx));
    cr_assert_eq(qkv_backward(ctx, l, qkv_scalar(ctx, x->dtype, dloss)), QKV_OK, "%s", qkv_errmsg(ctx));
    for (int64_t i = 0; i < x->numel; i++) grad[i] = at(xc->grad, i);
    double v = at(l, 0);
    qkv_step_end(ctx);
    return v;
}

/* Both values NaN, or both the same infinity, or within tol of each other. */
static bool same_or_near(double a, double b, double tol) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b)) return a == b;
    return fabs(a - b) <= tol;
}

/* The f32 and f64 losses and gradients of the logits v (rows x V doubles, rounded to f32 first so both
 * dtypes see the same numbers) against targets tg, with upstream dloss. The f32 loss must be within
 * 1e-6 relative of the f64 one, plus 2 V FLT_MIN (the kernel flushes probabilities below FLT_MIN) and
 * 4 eps (1 + max |x|) (f64's own rounding in m + log z - x[t]); each gradient entry within
 * 1e-6 |dloss / count|; and NaN/inf wherever f64 has them. Returns the failures, the first in msg. */
static int f32_vs_f64(const double *v, int64_t rows, int64_t V, const int32_t *tg, double dloss, char *msg,
                      size_t size) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    int64_t shape[2] = {rows, V};
    qkv_tensor *x32 = qkv_keep(ctx, tensor_of(ctx, QKV_F32, 2, shape, v));
    qkv_tensor *x64 = qkv_keep(ctx, qkv_to_dtype(ctx, x32, QKV_F64));
    qkv_tensor *t = qkv_keep(ctx, qkv_from_data(ctx, QKV_I32, 1, shape, tg));
    cr_assert(x32 && x64 && t, "%s", qkv_errmsg(ctx));
    double *g32 = malloc(sizeof(double) * (size_t)(rows * V));
    double *g64 = malloc(sizeof(double) * (size_t)(rows * V));
    cr_assert(g32 && g64);
    double l32 = loss_and_grad(ctx, x32, t, dloss, g32), l64 = loss_and_grad(ctx, x64, t, dloss, g64);
    int64_t count = 0;
    for (int64_t r = 0; r < rows; r++) count += tg[r] >= 0;
    double f = count ? fabs(dloss) / (double)count : 0.0;
    double big = 0.0;
    for (int64_t i = 0; i < rows * V; i++)
        if (isfinite(qkv_f64(x64)[i])) big = fmax(big, fabs(qkv_f64(x64)[i]));
    int bad = 0;
    double tol = 1e-6 * fabs(l64) + 2.0 * (double)V * FLT_MIN + 4.0 * DBL_EPSILON * (1.0 + big);
    if (!same_or_near(l32, l64, tol)) {
        bad++;
        snprintf(msg, size, "loss f32 %.9g, f64 %.17g", l32, l64);
    }
    for (int64_t i = 0; i < rows * V; i++)
        if (!same_or_near(g32[i], g64[i], 1e-6 * f) && bad++ == 0)
            snprintf(msg, size, "dlogits[%lld] f32 %.9g, f64 %.17g (dloss / count %g)", (long long)i, g32[i],
                     g64[i], f);
    free(g32);
    free(g64);
    qkv_ctx_free(ctx);
    return bad;
}

static uint64_t lcg_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}

/* Uniform in [0, 1). */
static double lcg_unit(uint64_t *s) { return (double)lcg_next(s) / 9007199254740992.0; }

/* Runs check(isa) once for every kernel set this CPU has; returns how many sets ran. */
static int for_each_kernel_set(void (*check)(const char *isa)) {
    int sets = 0;
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++) {
        if (!qkv_attn_force_isa_(isa)) continue; /* not compiled in, or not this CPU's */
        sets++;
        check(qkv_isa_name_((qkv_isa_)isa));
    }
    qkv_attn_force_isa_(-1);
    return sets;
}

static void vector_tails(const char *isa) {
    const int64_t vs[] = {1, 2, 7, 8, 16, 17, 33, 1000};
    uint64_t seed = 99;
    for (size_t c = 0; c < sizeof vs / sizeof vs[0]; c++) {
        int64_t V = vs[c], rows = 11;
        double *v = malloc(sizeof(double) * (size_t)(rows * V));
        int32_t tg[11];
        cr_assert(v);
        for (int64_t r = 0; r < rows; r++) {
            tg[r] = r % 4 == 2 ? -1 - (int32_t)r : (int32_t)(lcg_next(&seed) % (uint64_t)V); /* 3 ignored */
            for (int64_t j = 0; j < V; j++) v[r * V + j] = 8.0 * lcg_unit(&seed) - 4.0;
        }
        char msg[256] = "";
        int bad = f32_vs_f64(v, rows, V, tg, 0.75, msg, sizeof msg);
        cr_expect_eq(bad, 0, "kernels %s, V = %lld: %d mismatches; first: %s", isa, (long long)V, bad, msg);
        free(v);
    }
}

Test(cross_entropy, f32_matches_f64_on_vector_tails_with_every_kernel_set) {
    cr_expect_geq(for_each_kernel_set(vector_tails), 1, "at least the portable set");
}

/* Rows of exactly 8 logits go eight rows at a time, transposed: 37 consecutive counted rows (two chunks of
 * 16, each two groups of eight, and a tail of five), every target column in every group slot, rows on
 * different scales, and in some rows a target far below the rest (its probability underflows, so that
 * row's loss is measured from its argmax). */
static void rows_of_eight(const char *isa) {
    enum { ROWS = 37, V = 8 };
    double v[ROWS * V];
    int32_t tg[ROWS];
    uint64_t seed = 1234;
    for (int64_t r = 0; r < ROWS; r++) {
        tg[r] = (int32_t)((r * 3 + r / 8) % V);
        for (int64_t j = 0; j < V; j++) v[r * V + j] = 6.0 * lcg_unit(&seed) - 3.0 + (double)(r % 5);
        if (r % 7 == 3) v[r * V + tg[r]] = -150.0; /* exp(x[t] - m) below every f32 */
    }
    char msg[256] = "";
    int bad = f32_vs_f64(v, ROWS, V, tg, 1.0, msg, sizeof msg);
    cr_expect_eq(bad, 0, "kernels %s, %d rows: %d mismatches; first: %s", isa, ROWS, bad, msg);
}

Test(cross_entropy, f32_rows_of_eight_eight_at_a_time_match_f64_with_every_kernel_set) {
    cr_expect_geq(for_each_kernel_set(rows_of_eight), 1);
}

/* Logits on a 1/64 grid inside [-500, 500]: x - m is then exact in f32, so the f32 errors left are exp's
 * and the division's, and every single row's loss must match f64 to 1e-6 relative. */
static void wide_spreads(const char *isa) {
    const int64_t vs[] = {2, 7, 17, 64};
    const double spreads[] = {1.0, 30.0, 100.0, 300.0, 1000.0};
    uint64_t seed = 7;
    int rows_checked = 0, bad = 0, far_below = 0;
    char first[256 + 96] = ""; /* a 256-byte msg after "V = %lld, spread %g, target %d: " (at most 68) */
    for (size_t c = 0; c < sizeof vs / sizeof vs[0]; c++) {
        int64_t V = vs[c];
        double v[64];
        for (size_t sp = 0; sp < sizeof spreads / sizeof spreads[0]; sp++) {
            for (int rep = 0; rep < 6; rep++) {
                for (int64_t j = 0; j < V; j++)
                    v[j] = round(64.0 * spreads[sp] * (lcg_unit(&seed) - 0.5)) / 64.0;
                int64_t lo = 0, hi = 0;
                for (int64_t j = 1; j < V; j++) {
                    if (v[j] < v[lo]) lo = j;
                    if (v[j] > v[hi]) hi = j;
                }
                if (rep == 1) v[hi] += spreads[sp] / 4; /* a clear winner: a tiny loss if it is the target */
                /* the target: the lowest logit, the highest, then random ones */
                int64_t pick = rep == 0 ? lo : rep == 1 ? hi : (int64_t)(lcg_next(&seed) % (uint64_t)V);
                int32_t t = (int32_t)pick;
                far_below += v[hi] - v[t] > 104.0; /* exp(x[t] - m) < 2^-150: below every f32 */
                char msg[256] = "";
                int b = f32_vs_f64(v, 1, V, &t, 1.0, msg, sizeof msg);
                rows_checked++;
                if (b && bad++ == 0)
                    snprintf(first, sizeof first, "V = %lld, spread %g, target %d: %s", (long long)V,
                             spreads[sp], (int)t, msg);
            }
        }
    }
    cr_expect_eq(bad, 0, "kernels %s: %d of %d rows off; first: %s", isa, bad, rows_checked, first);
    cr_expect_geq(far_below, 20, "kernels %s: only %d rows had the target's probability below every f32",
                  isa, far_below);
}

Test(cross_entropy, f32_matches_f64_per_row_over_spreads_up_to_1e3) {
    cr_expect_geq(for_each_kernel_set(wide_spreads), 1);
}

/* NaN and inf logits in counted rows: the f32 loss and gradient are NaN or inf exactly where f64's are
 * (NaN or +inf in a row: NaN loss and a NaN gradient row; a -inf target: +inf loss, finite gradient; a
 * row of -inf: NaN), alone and in a batch beside an ordinary row. */
static void special_values(const char *isa) {
    const double inf = INFINITY, nan = NAN;
    const double rows[][4] = {
        {0, nan, 1, 2},     {nan, 0, 0, 1},    {0, inf, 1, 2},   {inf, inf, 0, 1},
        {0, -inf, 1, 2},    {0, -inf, 1, 2},   {-inf, -inf, -inf, -inf},
        {-inf, 3, -inf, 1}, {-inf, 3, -inf, 1},
    };
    const int32_t tgs[] = {0, 1, 2, 0, 1, 2, 0, 0, 1};
    const int want[] = {'n', 'n', 'n', 'n', 'i', 'f', 'n', 'i', 'f'}; /* NaN, +inf, finite */
    int n = (int)(sizeof tgs / sizeof tgs[0]), bad = 0, kinds_bad = 0;
    char first[300] = "";
    for (int k = 0; k < n; k++) {
        /* row k alone, then row k after an ordinary row (ignored rows around it) */
        double v[3 * 4] = {0.5, -1, 2, 0.25}; /* then row k, then an ignored row of zeros */
        memcpy(v + 4, rows[k], sizeof rows[k]);
        int32_t tg3[3] = {2, 1, -1};
        char msg[256] = "";
        int b = f32_vs_f64(rows[k], 1, 4, &tgs[k], 1.0, msg, sizeof msg);
        tg3[1] = tgs[k];
        if (!b) b = f32_vs_f64(v, 3, 4, tg3, 2.0, msg, sizeof msg);
        if (b && bad++ == 0) snprintf(first, sizeof first, "row %d: %s", k, msg);
        /* and f64 behaves as documented */
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *x = tensor_of(ctx, QKV_F32, 1, (int64_t[]){4}, rows[k]);
        qkv_tensor *l = qkv_cross_entropy(ctx, x, targets_of(ctx, 0, NULL, &tgs[k]));
        cr_assert_not_null(l, "%s", qkv_errmsg(ctx));
        double lv = at(l, 0);
        int kind = isnan(lv) ? 'n' : lv == inf ? 'i' : isfinite(lv) ? 'f' : '?';
        if (kind != want[k] && kinds_bad++ == 0)
            snprintf(first, sizeof first, "row %d: loss %g, want kind %c", k, lv, want[k]);
        qkv_ctx_free(ctx);
    }
    cr_expect_eq(bad + kinds_bad, 0, "kernels %s: %d rows differ from f64, %d of the wrong kind; first: %s",
                 isa, bad, kinds_bad, first);
}

Test(cross_entropy, f32_nan_and_inf_logits_follow_f64_with_every_kernel_set) {
    cr_expect_geq(for_each_kernel_set(special_values), 1);
}

Test(cross_entropy, f32_many_wide_rows_do_not_overflow_the_running_product) {
    /* 300 rows of 1000 equal logits: every row's loss is log 1000, and prod_r z_r = 1000^300 ~ 2^2990 */
    int64_t rows = 300, V = 1000;
    double *v = calloc((size_t)(rows * V), sizeof(double));
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)rows);
    cr_assert(v && tg);
    for (int64_t r = 0; r < rows; r++) {
        tg[r] = (int32_t)((r * 37) % V);
        for (int64_t j = 0; j < V; j++) v[r * V + j] = (double)(r % 5) - 2.0;
    }
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = tensor_of(ctx, QKV_F32, 2, (int64_t[]){rows, V}, v);
    qkv_tensor *l = qkv_cross_entropy(ctx, x, targets_of(ctx, 1, (int64_t[]){rows}, tg));
    cr_assert_not_null(l, "%s", qkv_errmsg(ctx));
    cr_expect(fabs(at(l, 0) - log(1000.0)) <= 1e-6 * log(1000.0), "loss %.9g, want log 1000 = %.9g", at(l, 0),
              log(1000.0));
    qkv_ctx_free(ctx);
    /* the same with random logits and spreads, against f64 */
    uint64_t seed = 5;
    for (int64_t i = 0; i < rows * V; i++) v[i] = (lcg_unit(&seed) - 0.5) * (i / V % 3 ? 1.0 : 40.0);
    char msg[256] = "";
    int bad = f32_vs_f64(v, rows, V, tg, 1.0, msg, sizeof msg);
    cr_expect_eq(bad, 0, "%d mismatches; first: %s", bad, msg);
    free(v);
    free(tg);
}

Test(cross_entropy, f32_tiny_losses_keep_their_relative_accuracy) {
    /* the target far ahead: loss = log1p(sum_{j != t} exp(x[j] - x[t])) ~ 1e-9 .. 1e-30, which
     * -log(softmax[t]) would round to 0 in f32 (softmax[t] = 1), and m + log z - x[t] in f64 too (1 + z - 1
     * = 1 in double); against that log1p oracle, with every kernel set (the grid keeps x - m exact in f32) */
    const double gaps[] = {20.0, 35.5, 52.25, 69.0};
    int bad = 0, sets = 0;
    char first[300] = "";
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++) {
        if (!qkv_attn_force_isa_(isa)) continue;
        sets++;
        for (size_t g = 0; g < sizeof gaps / sizeof gaps[0]; g++) {
            double v[5] = {0.5, -gaps[g], 0.25 - gaps[g], -1.0 - gaps[g], -gaps[g] - 7.5};
            double rest = 0.0;
            for (int j = 1; j < 5; j++) rest += exp(v[j] - v[0]);
            double want = log1p(rest);
            int32_t t = 0;
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            qkv_tensor *x = tensor_of(ctx, QKV_F32, 1, (int64_t[]){5}, v);
            qkv_tensor *l = qkv_cross_entropy(ctx, x, targets_of(ctx, 0, NULL, &t));
            cr_assert_not_null(l, "%s", qkv_errmsg(ctx));
            if (!(fabs(at(l, 0) - want) <= 1e-6 * want) && bad++ == 0)
                snprintf(first, sizeof first, "kernels %s, gap %g: loss %.9g, want %.9g",
                         qkv_isa_name_((qkv_isa_)isa), gaps[g], at(l, 0), want);
            qkv_ctx_free(ctx);
        }
    }
    qkv_attn_force_isa_(-1);
    cr_expect_geq(sets, 1);
    cr_expect_eq(bad, 0, "%d losses off; first: %s", bad, first);
}

Test(cross_entropy, f32_loss_is_the_same_recording_or_not) {
    /* not recording, the softmax goes to a chunk of scratch rows instead of the saved buffer */
    const int64_t vs[] = {3, 8, 1000};
    for (size_t c = 0; c < 3; c++) {
        qkv_options o = qkv_default_options();
        o.seed = 11 + c;
        qkv_ctx *ctx = qkv_ctx_new(&o);
        int64_t shape[2] = {9, vs[c]};
        qkv_tensor *x = qkv_randn(ctx, QKV_F32, 2, shape, 0, 3);
        int32_t tg[9];
        for (int r = 0; r < 9; r++) tg[r] = r % 3 == 1 ? -1 : (int32_t)((r * 5) % vs[c]);
        qkv_tensor *t = targets_of(ctx, 1, shape, tg);
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *l1 = qkv_cross_entropy(ctx, x, t);
        bool was = qkv_set_grad_enabled(ctx, false);
        qkv_tensor *l2 = qkv_cross_entropy(ctx, x, t);
        qkv_set_grad_enabled(ctx, was);
        cr_assert(l1 && l2, "%s", qkv_errmsg(ctx));
        cr_expect(l1->node_ != NULL && l2->node_ == NULL, "one recorded, one not");
        cr_expect(qkv_f32(l1)[0] == qkv_f32(l2)[0], "V = %lld: %.9g recording, %.9g not", (long long)vs[c],
                  qkv_f32(l1)[0], qkv_f32(l2)[0]);
        qkv_ctx_free(ctx);
    }
}

Test(cross_entropy, f32_gradient_is_the_softmax_kernels_output) {
    /* one token, dloss 1: dlogits[j] = softmax[j] for j != t, softmax[t] - 1, with softmax the f32 row
     * kernel's (qkv_softmax runs the same one): no double work buffer in between */
    qkv_options o = qkv_default_options();
    o.seed = 21;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    for (int64_t V = 1; V <= 40; V += 13) {
        qkv_tensor *x = qkv_randn(ctx, QKV_F32, 2, (int64_t[]){1, V}, 0, 5);
        int32_t t = (int32_t)(V / 2);
        qkv_tensor *a = qkv_softmax(ctx, x, NULL, 0);
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *l = qkv_cross_entropy(ctx, x, targets_of(ctx, 1, (int64_t[]){1}, &t));
        cr_assert(a && l, "%s", qkv_errmsg(ctx));
        cr_assert_eq(qkv_backward(ctx, l, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        int bad = 0;
        for (int64_t j = 0; j < V; j++) {
            float want = j == t ? (float)((double)qkv_f32(a)[j] - 1.0) : qkv_f32(a)[j];
            bad += memcmp(&qkv_f32(x->grad)[j], &want, sizeof want) != 0;
        }
        cr_expect_eq(bad, 0, "V = %lld: %d gradient entries are not the kernel's softmax", (long long)V, bad);
        qkv_step_end(ctx);
    }
    qkv_ctx_free(ctx);
}

Test(cross_entropy, f32_ignored_rows_get_nothing_added) {
    /* a persistent f32 gradient holding -0.0, NaN and 1.5 on the ignored rows keeps them bit for bit (adding
     * 0 would turn -0.0 into +0.0); the counted rows accumulate over two backward calls */
    qkv_options o = qkv_default_options();
    o.seed = 4;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    int64_t shape[2] = {4, 5};
    qkv_tensor *x = qkv_param(ctx, qkv_randn(ctx, QKV_F32, 2, shape, 0, 1));
    qkv_tensor *t = qkv_keep(ctx, targets_of(ctx, 1, shape, (int32_t[]){3, -1, 0, -5}));
    cr_assert(x && t, "%s", qkv_errmsg(ctx));
    cr_assert_eq(qkv_backward(ctx, qkv_cross_entropy(ctx, x, t), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_step_end(ctx);
    float *g = qkv_f32(x->grad), once[20];
    memcpy(once, g, sizeof once);
    const float marks[3] = {-0.0f, NAN, 1.5f};
    for (int j = 0; j < 5; j++) g[5 + j] = g[15 + j] = marks[j % 3];
    float before[20];
    memcpy(before, g, sizeof before);
    cr_assert_eq(qkv_backward(ctx, qkv_cross_entropy(ctx, x, t), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    int touched = 0, counted_bad = 0;
    for (int j = 0; j < 5; j++) {
        touched += memcmp(&g[5 + j], &before[5 + j], sizeof(float)) != 0;
        touched += memcmp(&g[15 + j], &before[15 + j], sizeof(float)) != 0;
        counted_bad += g[j] != 2.0f * once[j] || g[10 + j] != 2.0f * once[10 + j];
    }
    cr_expect_eq(touched, 0, "%d ignored-row gradient entries changed", touched);
    cr_expect_eq(counted_bad, 0, "%d counted entries are not twice the first backward's", counted_bad);
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

/* Configuration c's logits and i32 targets (fn gets the targets). *user is an LCG carried from one
 * configuration to the next. */
static int ce_build(qkv_ctx *ctx, int c, void *user, qkv_tensor **in, void **fn_user) {
    uint64_t *lcg = user;
    const ce_config *cfg = &CE_CONFIGS[c];
    qkv_tensor *x = qkv_randn(ctx, QKV_F64, cfg->ndim, cfg->shape, 0, cfg->scale);
    int64_t V = cfg->shape[cfg->ndim - 1], rows = x ? x->numel / V : 0;
    qkv_tensor *t = qkv_zeros(ctx, QKV_I32, cfg->ndim - 1, cfg->shape);
    cr_assert(t && x, "%s", qkv_errmsg(ctx));
    for (int64_t r = 0; r < rows; r++) {
        *lcg = *lcg * 6364136223846793005ull + 1442695040888963407ull;
        int32_t tv = (int32_t)((*lcg >> 33) % (uint64_t)V);
        if (cfg->targets == T_ALL_IGNORED || (cfg->targets == T_SOME_IGNORED && r % 3 == 1))
            tv = -1 - (int32_t)r;
        qkv_i32(t)[r] = tv;
        double *row = qkv_f64(x) + r * V;
        for (int64_t j = 0; j < V; j++) {
            if (cfg->logits == L_PM80)
                row[j] = -80.0 + 160.0 * (double)((*lcg >> (j % 20)) % 1000) / 999.0;
            if (cfg->logits == L_TIES) row[j] = round(row[j]);
            if (cfg->logits == L_BIG_GAP && tv >= 0 && j == tv) row[j] += r % 2 ? 30.0 : -30.0;
        }
    }
    in[0] = x;
    *fn_user = t;
    return 1;
}

static void ce_name(char *buf, size_t size, int c, const void *user) {
    (void)user;
    static const char *const logits[] = {"randn", "+-80", "ties", "big gap"};
    static const char *const targets[] = {"all counted", "some ignored", "all ignored"};
    const ce_config *cfg = &CE_CONFIGS[c];
    char shape[64] = "";
    for (int i = 0; i < cfg->ndim; i++) {
        size_t len = strlen(shape);
        snprintf(shape + len, sizeof shape - len, i ? ",%lld" : "%lld", (long long)cfg->shape[i]);
    }
    snprintf(buf, size, "cross-entropy config %d (logits [%s] %s x %g, targets %s)", c, shape,
             logits[cfg->logits], cfg->scale, targets[cfg->targets]);
}

Test(cross_entropy, gradcheck_over_24_configurations) {
    int n_configs = (int)(sizeof CE_CONFIGS / sizeof CE_CONFIGS[0]);
    cr_assert(n_configs >= 20);
    uint64_t lcg = 12345;
    gradcheck_table t = {n_configs, 2000, ce_build, ce_name, ce_fn, &lcg, NULL};
    check_gradcheck_table(&t, 300);
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
        expect_misuse(ctx, cases[c].name, loss, cases[c].status, cases[c].frag);
        qkv_ctx_free(ctx);
    }
    cr_expect_null(qkv_cross_entropy(NULL, NULL, NULL));
}

/* An allocation failing in the backward (every one in turn, f32 and f64): the message names qkv_backward,
 * the function the user called (and the operator), and nothing leaks. */
Test(cross_entropy, a_failing_backward_names_qkv_backward) {
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        int failures = 0;
        bool passed = false;
        for (long k = 1; k <= 16 && !passed; k++) {
            counting cnt = {0};
            qkv_options opt = qkv_default_options();
            opt.allocator = counting_allocator(&cnt);
            opt.arena_chunk = 1024; /* small: the backward's gradient and work buffer each need a new chunk */
            qkv_ctx *ctx = qkv_ctx_new(&opt);
            qkv_tensor *logits = qkv_randn(ctx, dt, 2, (int64_t[]){8, 40}, 0, 1);
            qkv_set_requires_grad(ctx, logits, true);
            int32_t tv[8] = {1, 2, -1, 39, 0, 5, 7, 11};
            qkv_tensor *loss = qkv_cross_entropy(ctx, logits, targets_of(ctx, 1, (int64_t[]){8}, tv));
            cr_assert_not_null(loss, "%s", qkv_errmsg(ctx));
            cnt.fail_at = cnt.calls + k;
            qkv_status st = qkv_backward(ctx, loss, NULL);
            if (st == QKV_OK) {
                passed = cnt.failed == 0;
            } else {
                failures++;
                cr_expect_eq(st, QKV_ERR_NOMEM, "%s", qkv_errmsg(ctx));
                cr_expect(strncmp(qkv_errmsg(ctx), "qkv_backward", 12) == 0, "%s, allocation %ld: %s",
                          qkv_dtype_name(dt), k, qkv_errmsg(ctx));
            }
            qkv_ctx_free(ctx);
            cr_expect_eq(cnt.live, 0, "allocation %ld: %ld blocks leaked", k, cnt.live);
        }
        cr_expect(passed, "%s: the backward never ran without a failure", qkv_dtype_name(dt));
        cr_expect_geq(failures, d ? 2 : 1, "%s: only %d allocations failed (the test would be blind)",
                      qkv_dtype_name(dt), failures);
    }
}
