/*
 * test_rope_dropout.c — the building blocks of ops/relu.c, ops/softcap.c, ops/rope.c, ops/dropout.c and
 * ops/sinusoidal.c: values by hand, the 0 / saturation / NaN edge cases, RoPE's rotation properties,
 * dropout's mask (reproducible, keep fraction, exact scaling, backward against the mask), gradcheck over a
 * table of configurations per operator, and f32 against f64. Goldens from PyTorch are in test_golden.c.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv.h"
#include "test_ops.h"

/* Count configuration c under a short name, so a failure names it (the name goes in front of the message). */
static void tally_named(gradcheck_tally *t, int c, const char *name, qkv_status st, qkv_ctx *ctx,
                        qkv_gradcheck_result *r, int64_t want) {
    char msg[sizeof r->message + 64];
    snprintf(msg, sizeof msg, "[%.60s] %s", name, r->message);
    memcpy(r->message, msg, sizeof r->message - 1);
    r->message[sizeof r->message - 1] = '\0';
    tally_gradcheck(t, c, st, ctx, r, want);
}

/* A random f64 tensor whose values are exact in f32 (so f32 and f64 runs see the same input). */
static qkv_tensor *randn_f32_exact(qkv_ctx *ctx, int ndim, const int64_t *shape, double scale) {
    qkv_tensor *x = qkv_randn(ctx, QKV_F64, ndim, shape, 0, scale);
    cr_assert_not_null(x, "%s", qkv_errmsg(ctx));
    for (int64_t i = 0; i < x->numel; i++) qkv_f64(x)[i] = (double)(float)qkv_f64(x)[i];
    return x;
}

/* The same values in dtype dt. */
static qkv_tensor *convert(qkv_ctx *ctx, const qkv_tensor *x, qkv_dtype dt) {
    qkv_tensor *y = qkv_zeros(ctx, dt, x->ndim, x->shape);
    cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
    for (int64_t i = 0; i < x->numel; i++) qkv_set_flat(ctx, y, i, at(x, i));
    return y;
}

/* ---- relu ---------------------------------------------------------------------------------------- */

Test(relu, values_the_tie_at_zero_and_nan) {
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        const double v[6] = {-2.5, -0.0, 0.0, 1e-30, 3.25, NAN};
        qkv_tensor *x = tensor_of(ctx, dt, 1, (int64_t[]){6}, v);
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *y = qkv_relu(ctx, x);
        cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
        const double want[5] = {0, 0, 0, d ? 1e-30 : (double)1e-30f, 3.25};
        for (int i = 0; i < 5; i++) cr_expect_eq(at(y, i), want[i], "%s y[%d] = %g", qkv_dtype_name(dt), i, at(y, i));
        cr_expect(isnan(at(y, 5)), "relu(NaN) must stay NaN, got %g", at(y, 5));
        const double g[6] = {10, 20, 30, 40, 50, 60};
        qkv_tensor *dy = tensor_of(ctx, dt, 1, (int64_t[]){6}, g);
        cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
        /* the gradient at exactly 0 (either sign) is 0, as PyTorch */
        const double dwant[5] = {0, 0, 0, 40, 50};
        for (int i = 0; i < 5; i++)
            cr_expect_eq(at(x->grad, i), dwant[i], "%s dx[%d] = %g", qkv_dtype_name(dt), i, at(x->grad, i));
        cr_expect(isnan(at(x->grad, 5)), "the gradient at a NaN x is NaN, got %g", at(x->grad, 5));
        qkv_ctx_free(ctx);
    }
}

/* ---- softcap ------------------------------------------------------------------------------------- */

Test(softcap, values_and_saturation) {
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        const double v[5] = {0.0, 1.0, -3.0, 1e4, -1e4};
        qkv_tensor *x = tensor_of(ctx, dt, 1, (int64_t[]){5}, v);
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *y = qkv_softcap(ctx, x, 2.0);
        cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
        double tol = d ? 1e-15 : 3e-7;
        for (int i = 0; i < 3; i++)
            cr_expect(fabs(at(y, i) - 2.0 * tanh(v[i] / 2.0)) <= tol * 2, "%s y[%d] = %.17g", qkv_dtype_name(dt), i,
                      at(y, i));
        cr_expect_eq(at(y, 3), 2.0, "softcap(1e4, 2) saturates at exactly 2, got %.17g", at(y, 3));
        cr_expect_eq(at(y, 4), -2.0);
        const double g[5] = {1, 1, 1, 1, 1};
        cr_assert_eq(qkv_backward(ctx, y, tensor_of(ctx, dt, 1, (int64_t[]){5}, g)), QKV_OK, "%s", qkv_errmsg(ctx));
        cr_expect_eq(at(x->grad, 0), 1.0, "slope 1 at 0");
        double t = tanh(0.5);
        cr_expect(fabs(at(x->grad, 1) - (1 - t * t)) <= tol, "dx[1] = %.17g", at(x->grad, 1));
        cr_expect(at(x->grad, 3) == 0.0 && at(x->grad, 4) == 0.0, "saturated gradient is exactly 0, got %g %g",
                  at(x->grad, 3), at(x->grad, 4));
        qkv_ctx_free(ctx);
    }
}

Test(softcap, near_identity_for_small_x_and_nan_propagates) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = tensor_of(ctx, QKV_F64, 1, (int64_t[]){2}, (double[]){1e-3, NAN});
    qkv_tensor *y = qkv_softcap(ctx, x, 1e3);
    cr_assert_not_null(y);
    /* cap tanh(x / cap) = x - x^3 / (3 cap^2) + ...: 1e-3 - 3.3e-16 */
    cr_expect(fabs(qkv_f64(y)[0] - 1e-3) < 1e-15, "%.17g", qkv_f64(y)[0]);
    cr_expect(isnan(qkv_f64(y)[1]));
    qkv_ctx_free(ctx);
}

/* ---- rope ---------------------------------------------------------------------------------------- */

Test(rope, d2_by_hand) {
    /* d = 2: theta_0 = 1, so row i is rotated by the angle (offset + i) radians */
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        const double v[6] = {1, 0, 0, 1, 3, -2};
        qkv_tensor *x = tensor_of(ctx, dt, 2, (int64_t[]){3, 2}, v);
        qkv_tensor *y = qkv_rope(ctx, x, 10000.0, 5);
        cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
        double tol = d ? 1e-15 : 4e-7;
        for (int i = 0; i < 3; i++) {
            double a = 5.0 + i, x1 = v[2 * i], x2 = v[2 * i + 1];
            double y1 = x1 * cos(a) - x2 * sin(a), y2 = x2 * cos(a) + x1 * sin(a);
            cr_expect(fabs(at(y, 2 * i) - y1) <= tol * 4 && fabs(at(y, 2 * i + 1) - y2) <= tol * 4,
                      "%s row %d: (%.9g, %.9g), want (%.9g, %.9g)", qkv_dtype_name(dt), i, at(y, 2 * i),
                      at(y, 2 * i + 1), y1, y2);
        }
        qkv_ctx_free(ctx);
    }
}

Test(rope, d8_by_hand_pairs_j_and_j_plus_half) {
    /* x = e_1 (column 1) at position 3, d = 8, base 100: y[1] = cos(3 theta_1), y[5] = sin(3 theta_1),
     * theta_1 = 100^(-2/8); every other entry 0 */
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    double v[8] = {0};
    v[1] = 1;
    qkv_tensor *x = tensor_of(ctx, QKV_F64, 2, (int64_t[]){1, 8}, v);
    qkv_tensor *y = qkv_rope(ctx, x, 100.0, 3);
    cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
    double th = pow(100.0, -0.25);
    for (int c = 0; c < 8; c++) {
        double want = c == 1 ? cos(3 * th) : c == 5 ? sin(3 * th) : 0.0;
        cr_expect(fabs(qkv_f64(y)[c] - want) < 1e-15, "y[%d] = %.17g, want %.17g", c, qkv_f64(y)[c], want);
    }
    qkv_ctx_free(ctx);
}

Test(rope, offset_shifts_positions_and_pairs_keep_their_norm) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const int64_t B = 2, n = 6, d = 8, k = 2;
    qkv_tensor *x = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){B, n, d}, 0, 1);
    qkv_tensor *y0 = qkv_rope(ctx, x, 10000.0, 0);
    /* rows k.. of x at offset 0 equal rows 0.. of the same rows cut out at offset k */
    qkv_tensor *xs = qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){B, n - k, d});
    for (int64_t b = 0; b < B; b++)
        memcpy(qkv_f64(xs) + b * (n - k) * d, qkv_f64(x) + (b * n + k) * d, (size_t)((n - k) * d) * 8);
    qkv_tensor *yk = qkv_rope(ctx, xs, 10000.0, k);
    cr_assert(y0 && yk, "%s", qkv_errmsg(ctx));
    double worst = 0, worst_norm = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n - k; i++)
            for (int64_t c = 0; c < d; c++)
                worst = fmax(worst, fabs(qkv_f64(yk)[(b * (n - k) + i) * d + c] -
                                         qkv_f64(y0)[(b * n + i + k) * d + c]));
    for (int64_t r = 0; r < B * n; r++)
        for (int64_t j = 0; j < d / 2; j++) {
            const double *a = qkv_f64(x) + r * d, *o = qkv_f64(y0) + r * d;
            double nx = hypot(a[j], a[j + d / 2]), ny = hypot(o[j], o[j + d / 2]);
            worst_norm = fmax(worst_norm, fabs(nx - ny));
        }
    cr_expect(worst == 0.0, "offset k differs from a k-row shift by %g", worst);
    cr_expect(worst_norm < 1e-15, "a rotation keeps each pair's norm; off by %g", worst_norm);
    /* position 0 (offset 0, row 0) is the identity */
    cr_expect(memcmp(qkv_f64(y0), qkv_f64(x), (size_t)d * 8) == 0, "position 0 must not rotate");
    qkv_ctx_free(ctx);
}

Test(rope, backward_is_the_inverse_rotation) {
    /* L = sum(y * dy) with dy = rope(x) gives dx = R^T R x = x */
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *x = convert(ctx, randn_f32_exact(ctx, 3, (int64_t[]){3, 4, 6}, 1.0), dt);
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *y = qkv_rope(ctx, x, 500.0, 1000);
        cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
        qkv_tensor *dy = convert(ctx, y, dt);
        cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
        double err = rel_norm_err(x->grad, x);
        cr_expect(err < (d ? 1e-15 : 2e-7), "%s: |R^T R x - x| / |x| = %g", qkv_dtype_name(dt), err);
        qkv_ctx_free(ctx);
    }
}

Test(rope, large_offsets_keep_the_angle) {
    /* at p = 10^6 + i the f32 result is the double rotation rounded once: it matches the f64 run to f32
     * precision (an angle computed in f32 would be off by ~0.03 rad there) */
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x64 = randn_f32_exact(ctx, 2, (int64_t[]){5, 4}, 1.0);
    qkv_tensor *y64 = qkv_rope(ctx, x64, 10000.0, 1000000);
    qkv_tensor *y32 = qkv_rope(ctx, convert(ctx, x64, QKV_F32), 10000.0, 1000000);
    cr_assert(y64 && y32, "%s", qkv_errmsg(ctx));
    double err = rel_norm_err(y32, y64);
    cr_expect(err < 1e-7, "f32 against f64 at offset 1e6: %g", err);
    /* row 0 column 0 by hand: angle 1e6 rad exactly */
    double a = 1e6, want = qkv_f64(x64)[0] * cos(a) - qkv_f64(x64)[2] * sin(a);
    cr_expect(fabs(qkv_f64(y64)[0] - want) < 1e-14, "%.17g vs %.17g", qkv_f64(y64)[0], want);
    qkv_ctx_free(ctx);
}

/* ---- dropout ------------------------------------------------------------------------------------- */

Test(dropout, same_seed_same_mask_and_other_seed_another) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_full(ctx, QKV_F64, 2, (int64_t[]){16, 64}, 1.0);
    qkv_seed(ctx, 42);
    qkv_tensor *a = qkv_dropout(ctx, x, 0.5);
    qkv_seed(ctx, 42);
    qkv_tensor *b = qkv_dropout(ctx, x, 0.5);
    qkv_tensor *c = qkv_dropout(ctx, x, 0.5); /* the stream has moved on */
    qkv_seed(ctx, 43);
    qkv_tensor *e = qkv_dropout(ctx, x, 0.5);
    cr_assert(a && b && c && e, "%s", qkv_errmsg(ctx));
    size_t bytes = (size_t)x->numel * 8;
    cr_expect(memcmp(a->data, b->data, bytes) == 0, "same seed, different mask");
    cr_expect(memcmp(a->data, c->data, bytes) != 0, "two draws gave the same mask");
    cr_expect(memcmp(a->data, e->data, bytes) != 0, "seeds 42 and 43 gave the same mask");
    /* a second context with the same seed draws the same mask, in f32 too */
    qkv_ctx *ctx2 = qkv_ctx_new(NULL);
    qkv_tensor *x32 = qkv_full(ctx2, QKV_F32, 2, (int64_t[]){16, 64}, 1.0);
    qkv_seed(ctx2, 42);
    qkv_tensor *a32 = qkv_dropout(ctx2, x32, 0.5);
    cr_assert_not_null(a32);
    int bad = 0;
    for (int64_t i = 0; i < x->numel; i++) bad += (qkv_f64(a)[i] != 0) != (qkv_f32(a32)[i] != 0);
    cr_expect_eq(bad, 0, "f32 and f64 masks from the same seed differ in %d places", bad);
    qkv_ctx_free(ctx2);
    qkv_ctx_free(ctx);
}

Test(dropout, keep_fraction_and_exact_scaling) {
    /* N = 200000 draws, kept ~ Binomial(N, 1 - p): sd = sqrt(N p (1 - p)) <= 224. The bound is 6 sd
     * (two-sided probability of failing by chance < 2e-9 per p); the seed is fixed, so it is deterministic. */
    const double ps[] = {0.1, 0.3, 0.5, 0.9, 0.999};
    const int64_t N = 200000;
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_seed(ctx, 7);
        qkv_tensor *x = qkv_randn(ctx, dt, 1, (int64_t[]){N}, 0.5, 1);
        for (int64_t i = 0; i < N; i++)
            if (at(x, i) == 0) qkv_set_flat(ctx, x, i, 1.0); /* a kept element is then nonzero */
        for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
            double p = ps[k];
            qkv_tensor *y = qkv_dropout(ctx, x, p);
            cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
            int64_t kept = 0, wrong = 0;
            for (int64_t i = 0; i < N; i++) {
                double yi = at(y, i);
                if (yi == 0) continue;
                kept++;
                /* exactly x / (1 - p), rounded once to the dtype */
                double want = d ? at(x, i) / (1 - p) : (double)(float)(at(x, i) / (1 - p));
                wrong += yi != want;
            }
            double mean = (double)N * (1 - p), sd = sqrt((double)N * p * (1 - p));
            cr_expect(fabs((double)kept - mean) <= 6 * sd, "%s p = %g: kept %lld of %lld, expected %g +- %g",
                      qkv_dtype_name(dt), p, (long long)kept, (long long)N, mean, 6 * sd);
            cr_expect_eq(wrong, 0, "%s p = %g: %lld kept elements are not x / (1 - p)", qkv_dtype_name(dt), p,
                         (long long)wrong);
        }
        qkv_ctx_free(ctx);
    }
}

Test(dropout, p_zero_and_evaluation_return_x_itself_and_draw_nothing) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_randn(ctx, QKV_F32, 2, (int64_t[]){4, 8}, 0, 1);
    qkv_seed(ctx, 5);
    cr_expect(qkv_dropout(ctx, x, 0.0) == x, "p = 0 must return x itself");
    bool was = qkv_set_grad_enabled(ctx, false);
    cr_expect(qkv_dropout(ctx, x, 0.7) == x, "grad mode off must return x itself");
    qkv_set_grad_enabled(ctx, was);
    qkv_tensor *y1 = qkv_dropout(ctx, x, 0.5);
    qkv_seed(ctx, 5);
    qkv_tensor *y2 = qkv_dropout(ctx, x, 0.5);
    cr_assert(y1 && y2 && y1 != x);
    cr_expect(memcmp(y1->data, y2->data, (size_t)x->numel * 4) == 0, "the returned-x calls drew from the RNG");
    cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

Test(dropout, backward_against_the_mask) {
    /* dx = dy / (1 - p) where the forward kept the element (y != 0, x being nonzero), 0 where it dropped */
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *x = qkv_full(ctx, dt, 3, (int64_t[]){2, 5, 7}, 2.0);
        qkv_tensor *dy = qkv_randn(ctx, dt, 3, (int64_t[]){2, 5, 7}, 0, 1);
        qkv_set_requires_grad(ctx, x, true);
        const double p = 0.4;
        qkv_tensor *y = qkv_dropout(ctx, x, p);
        cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
        cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
        int wrong = 0, kept = 0;
        for (int64_t i = 0; i < x->numel; i++) {
            bool k = at(y, i) != 0;
            kept += k;
            double want = k ? (d ? at(dy, i) / (1 - p) : (double)(float)(at(dy, i) / (1 - p))) : 0.0;
            wrong += at(x->grad, i) != want;
        }
        cr_expect_eq(wrong, 0, "%s: %d gradient elements disagree with the mask", qkv_dtype_name(dt), wrong);
        cr_expect(kept > 0 && kept < x->numel, "the mask kept %d of %lld", kept, (long long)x->numel);
        qkv_ctx_free(ctx);
    }
}

/* ---- sinusoidal positions ------------------------------------------------------------------------ */

Test(sinusoidal, values_by_hand_and_odd_d) {
    for (int k = 0; k < 2; k++) {
        qkv_dtype dt = k ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *t = qkv_sinusoidal_positions(ctx, 7, 5, dt);
        cr_assert_not_null(t, "%s", qkv_errmsg(ctx));
        cr_expect(t->ndim == 2 && t->shape[0] == 7 && t->shape[1] == 5 && t->dtype == dt && !t->requires_grad);
        double tol = k ? 1e-15 : 1e-7;
        int bad = 0;
        for (int p = 0; p < 7; p++) {
            /* d = 5: w_0 = 1 (cols 0, 1), w_1 = 10000^(-2/5) (cols 2, 3), w_2 = 10000^(-4/5) (col 4, a sin) */
            double w1 = pow(10000.0, -0.4), w2 = pow(10000.0, -0.8);
            const double want[5] = {sin(p), cos(p), sin(p * w1), cos(p * w1), sin(p * w2)};
            for (int c = 0; c < 5; c++) bad += !(fabs(at(t, p * 5 + c) - want[c]) <= tol);
        }
        cr_expect_eq(bad, 0, "%s: %d wrong entries", qkv_dtype_name(dt), bad);
        cr_expect(at(t, 0) == 0 && at(t, 1) == 1 && at(t, 4) == 0, "row 0 is sin 0 = 0, cos 0 = 1");
        qkv_tensor *one = qkv_sinusoidal_positions(ctx, 1, 1, dt);
        cr_expect(one && one->numel == 1 && at(one, 0) == 0.0, "[1, 1] is sin(0)");
        qkv_ctx_free(ctx);
    }
}

/* ---- gradcheck ----------------------------------------------------------------------------------- */

enum { OP_RELU, OP_SOFTCAP, OP_ROPE, OP_DROPOUT, OP_RELU_MUL };

typedef struct block_config {
    const char *name;
    int op;
    int ndim;
    int64_t shape[3];
    double param;   /* cap, base, or p */
    int64_t offset; /* rope */
    double scale;   /* x ~ N(0, scale^2), pushed at least 0.1 scale away from 0 for relu */
} block_config;

static qkv_tensor *block_fn(qkv_ctx *ctx, qkv_tensor *const *in, int n_in, void *user) {
    (void)n_in;
    const block_config *c = user;
    switch (c->op) {
    case OP_RELU: return qkv_relu(ctx, in[0]);
    case OP_RELU_MUL: return qkv_relu(ctx, qkv_mul(ctx, in[0], in[0])); /* relu of x^2 - the chain rule */
    case OP_SOFTCAP: return qkv_softcap(ctx, in[0], c->param);
    case OP_ROPE: return qkv_rope(ctx, in[0], c->param, c->offset);
    default: {
        /* The gradcheck calls fn many times and its differences run with recording off, where dropout
         * returns x: so fn reseeds (the same mask every call) and turns recording on around the call (with
         * the input not requiring grad, nothing is recorded then). */
        qkv_seed(ctx, 1234);
        bool was = qkv_set_grad_enabled(ctx, true);
        qkv_tensor *y = qkv_dropout(ctx, in[0], c->param);
        qkv_set_grad_enabled(ctx, was);
        return y;
    }
    }
}

static void run_block_gradchecks(const block_config *cfg, int n_configs, int64_t min_checked) {
    gradcheck_tally tally = {0};
    for (int c = 0; c < n_configs; c++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_seed(ctx, 100 + (uint64_t)c);
        qkv_tensor *x = qkv_randn(ctx, QKV_F64, cfg[c].ndim, cfg[c].shape, 0, cfg[c].scale);
        cr_assert_not_null(x, "%s", qkv_errmsg(ctx));
        if (cfg[c].op == OP_RELU || cfg[c].op == OP_RELU_MUL)
            for (int64_t i = 0; i < x->numel; i++) { /* keep every point away from the kink at 0 */
                double v = qkv_f64(x)[i];
                qkv_f64(x)[i] = copysign(fabs(v) + 0.1 * cfg[c].scale, v);
            }
        /* The step scales with |x|: at |x| ~ 1e3 the loss is ~1e4 and its rounding (~1e-12) over a step of
         * 1e-6 would be an error of 1e-6 in the numeric slope; a step of 1e-6 |x| keeps the relative
         * perturbation (and the truncation error, eps^2 f''' / 6) as small as at |x| ~ 1. The tolerances stay
         * the defaults. */
        qkv_gradcheck_options o = {.eps = 1e-6 * fmax(1.0, cfg[c].scale)};
        qkv_gradcheck_result r;
        qkv_status st = qkv_gradcheck(ctx, block_fn, &x, 1, (void *)&cfg[c], &o, &r);
        tally_named(&tally, c, cfg[c].name, st, ctx, &r, x->numel);
        qkv_ctx_free(ctx);
    }
    expect_gradcheck_tally(&tally, n_configs, min_checked);
}

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

Test(relu, gradcheck) {
    static const block_config cfg[] = {
        {"relu [1]", OP_RELU, 1, {1}, 0, 0, 1},          {"relu [7] odd", OP_RELU, 1, {7}, 0, 0, 1},
        {"relu [3,5] odd", OP_RELU, 2, {3, 5}, 0, 0, 1}, {"relu [4,8]", OP_RELU, 2, {4, 8}, 0, 0, 1},
        {"relu [2,3,5] batch", OP_RELU, 3, {2, 3, 5}, 0, 0, 1},
        {"relu [3,4,7] batch odd", OP_RELU, 3, {3, 4, 7}, 0, 0, 2},
        {"relu [1,1,9]", OP_RELU, 3, {1, 1, 9}, 0, 0, 1},  {"relu [2,2,2]", OP_RELU, 3, {2, 2, 2}, 0, 0, 1},
        {"relu [6,1]", OP_RELU, 2, {6, 1}, 0, 0, 1},       {"relu [5,3] small", OP_RELU, 2, {5, 3}, 0, 0, 1e-3},
        {"relu [5,3] large", OP_RELU, 2, {5, 3}, 0, 0, 1e3}, {"relu [11]", OP_RELU, 1, {11}, 0, 0, 5},
        {"relu [2,16]", OP_RELU, 2, {2, 16}, 0, 0, 1},     {"relu [4,3,3] batch", OP_RELU, 3, {4, 3, 3}, 0, 0, 1},
        {"relu [1,13] odd", OP_RELU, 2, {1, 13}, 0, 0, 1}, {"relu(x^2) [3,5]", OP_RELU_MUL, 2, {3, 5}, 0, 0, 1},
        {"relu(x^2) [2,3,4]", OP_RELU_MUL, 3, {2, 3, 4}, 0, 0, 1},
        {"relu(x^2) [9]", OP_RELU_MUL, 1, {9}, 0, 0, 1}, {"relu [2,5,3] batch", OP_RELU, 3, {2, 5, 3}, 0, 0, 1},
        {"relu [3,3]", OP_RELU, 2, {3, 3}, 0, 0, 0.5},     {"relu [8,2]", OP_RELU, 2, {8, 2}, 0, 0, 1},
    };
    run_block_gradchecks(cfg, N_OF(cfg), 300);
}

Test(softcap, gradcheck) {
    static const block_config cfg[] = {
        {"cap 0.5 [7] odd", OP_SOFTCAP, 1, {7}, 0.5, 0, 1},
        {"cap 0.5 [3,5]", OP_SOFTCAP, 2, {3, 5}, 0.5, 0, 1},
        {"cap 0.5 [2,3,5] batch", OP_SOFTCAP, 3, {2, 3, 5}, 0.5, 0, 2},
        {"cap 1 [4,8]", OP_SOFTCAP, 2, {4, 8}, 1, 0, 1},
        {"cap 1 [2,3,3] batch odd", OP_SOFTCAP, 3, {2, 3, 3}, 1, 0, 1},
        {"cap 3 [9]", OP_SOFTCAP, 1, {9}, 3, 0, 4},
        {"cap 30 [2,4,6] batch", OP_SOFTCAP, 3, {2, 4, 6}, 30, 0, 40},
        {"cap 50 [5,5]", OP_SOFTCAP, 2, {5, 5}, 50, 0, 60},
        {"cap 1e3 [3,7] odd", OP_SOFTCAP, 2, {3, 7}, 1e3, 0, 1},
        {"cap 1e3 [2,2,5] batch", OP_SOFTCAP, 3, {2, 2, 5}, 1e3, 0, 1e3},
        {"cap 1e3 |x|~1e4 [5]", OP_SOFTCAP, 1, {5}, 1e3, 0, 1e4},
        {"cap 0.5 |x|~1e4 saturated [3,5]", OP_SOFTCAP, 2, {3, 5}, 0.5, 0, 1e4},
        {"cap 1 |x|~1e4 saturated [2,3,3]", OP_SOFTCAP, 3, {2, 3, 3}, 1, 0, 1e4},
        {"cap 0.5 small x [6]", OP_SOFTCAP, 1, {6}, 0.5, 0, 1e-3},
        {"cap 2 [1]", OP_SOFTCAP, 1, {1}, 2, 0, 1},
        {"cap 2 [1,1,1]", OP_SOFTCAP, 3, {1, 1, 1}, 2, 0, 1},
        {"cap 10 [4,3]", OP_SOFTCAP, 2, {4, 3}, 10, 0, 10},
        {"cap 0.5 [3,2,4] batch", OP_SOFTCAP, 3, {3, 2, 4}, 0.5, 0, 0.5},
        {"cap 5 [11] odd", OP_SOFTCAP, 1, {11}, 5, 0, 5},
        {"cap 100 [2,16]", OP_SOFTCAP, 2, {2, 16}, 100, 0, 200},
        {"cap 0.7 [3,3,3]", OP_SOFTCAP, 3, {3, 3, 3}, 0.7, 0, 1},
    };
    run_block_gradchecks(cfg, N_OF(cfg), 300);
}

Test(rope, gradcheck) {
    static const block_config cfg[] = {
        {"rope d2 [1,2] off 0", OP_ROPE, 2, {1, 2}, 10000, 0, 1},
        {"rope d2 [4,2] off 1", OP_ROPE, 2, {4, 2}, 10000, 1, 1},
        {"rope d2 [2,3,2] batch off 1000", OP_ROPE, 3, {2, 3, 2}, 10000, 1000, 1},
        {"rope d4 [3,4] off 0", OP_ROPE, 2, {3, 4}, 10000, 0, 1},
        {"rope d4 [2,3,4] batch off 1", OP_ROPE, 3, {2, 3, 4}, 10000, 1, 1},
        {"rope d6 [5,6] off 1000", OP_ROPE, 2, {5, 6}, 10000, 1000, 1},
        {"rope d6 [3,2,6] batch off 0", OP_ROPE, 3, {3, 2, 6}, 10000, 0, 1},
        {"rope d8 [4,8] off 1", OP_ROPE, 2, {4, 8}, 10000, 1, 1},
        {"rope d8 [2,4,8] batch off 1000", OP_ROPE, 3, {2, 4, 8}, 10000, 1000, 1},
        {"rope d8 base 2 [3,8] off 0", OP_ROPE, 2, {3, 8}, 2, 0, 1},
        {"rope d8 base 100 [2,3,8] off 1", OP_ROPE, 3, {2, 3, 8}, 100, 1, 1},
        {"rope d10 [1,10] off 1000", OP_ROPE, 2, {1, 10}, 10000, 1000, 1},
        {"rope d16 [2,16] off 0", OP_ROPE, 2, {2, 16}, 10000, 0, 1},
        {"rope d16 [4,2,16] batch*heads off 1", OP_ROPE, 3, {4, 2, 16}, 10000, 1, 1},
        {"rope d2 [6,1,2] n=1 off 1000", OP_ROPE, 3, {6, 1, 2}, 10000, 1000, 1},
        {"rope d4 [1,1,4] n=1 off 0", OP_ROPE, 3, {1, 1, 4}, 10000, 0, 1},
        {"rope d12 [3,12] base 1.5 off 7", OP_ROPE, 2, {3, 12}, 1.5, 7, 1},
        {"rope d4 [5,4] large x off 1", OP_ROPE, 2, {5, 4}, 10000, 1, 100},
        {"rope d6 [2,5,6] batch off 123456", OP_ROPE, 3, {2, 5, 6}, 10000, 123456, 1},
        {"rope d2 [7,2] base 1e6 off 0", OP_ROPE, 2, {7, 2}, 1e6, 0, 1},
        {"rope d32 [2,32] off 1000", OP_ROPE, 2, {2, 32}, 10000, 1000, 1},
    };
    run_block_gradchecks(cfg, N_OF(cfg), 500);
}

Test(dropout, gradcheck_with_a_fixed_mask) {
    static const block_config cfg[] = {
        {"p 0.1 [7]", OP_DROPOUT, 1, {7}, 0.1, 0, 1},
        {"p 0.1 [3,5]", OP_DROPOUT, 2, {3, 5}, 0.1, 0, 1},
        {"p 0.5 [4,8]", OP_DROPOUT, 2, {4, 8}, 0.5, 0, 1},
        {"p 0.5 [2,3,5] batch", OP_DROPOUT, 3, {2, 3, 5}, 0.5, 0, 1},
        {"p 0.9 [3,7]", OP_DROPOUT, 2, {3, 7}, 0.9, 0, 1},
        {"p 0.9 [2,4,4] batch", OP_DROPOUT, 3, {2, 4, 4}, 0.9, 0, 1},
        {"p 0.3 [1]", OP_DROPOUT, 1, {1}, 0.3, 0, 1},
        {"p 0.3 [1,1,1]", OP_DROPOUT, 3, {1, 1, 1}, 0.3, 0, 1},
        {"p 0.25 [5,5]", OP_DROPOUT, 2, {5, 5}, 0.25, 0, 10},
        {"p 0.75 [3,3,3]", OP_DROPOUT, 3, {3, 3, 3}, 0.75, 0, 1},
        {"p 0.5 [16]", OP_DROPOUT, 1, {16}, 0.5, 0, 1e-3},
        {"p 0.5 [2,16]", OP_DROPOUT, 2, {2, 16}, 0.5, 0, 1e3},
        {"p 0.2 [6,1]", OP_DROPOUT, 2, {6, 1}, 0.2, 0, 1},
        {"p 0.6 [4,2,3] batch", OP_DROPOUT, 3, {4, 2, 3}, 0.6, 0, 1},
        {"p 0.01 [20]", OP_DROPOUT, 1, {20}, 0.01, 0, 1},
        {"p 0.99 [20]", OP_DROPOUT, 1, {20}, 0.99, 0, 1},
        {"p 0.4 [3,9]", OP_DROPOUT, 2, {3, 9}, 0.4, 0, 1},
        {"p 0.5 [5,2,2] batch", OP_DROPOUT, 3, {5, 2, 2}, 0.5, 0, 1},
        {"p 0.15 [8,3]", OP_DROPOUT, 2, {8, 3}, 0.15, 0, 2},
        {"p 0.8 [2,2,8]", OP_DROPOUT, 3, {2, 2, 8}, 0.8, 0, 1},
    };
    run_block_gradchecks(cfg, N_OF(cfg), 300);
}

/* ---- f32 against f64 ------------------------------------------------------------------------------ */

/* Every operator here computes in double from the input's values and rounds once to the output dtype, and
 * the backward likewise from dy's values: with inputs exact in f32, the f32 result is the f64 result rounded
 * to nearest, so the norm-wise relative error is at most 2^-24 = 6.0e-8 (relu: exactly 0). The bound is
 * 1e-7. (Dropout's mask is the same for both: one uniform per element from the same seed.) */
Test(blocks, f32_against_f64_forward_and_backward) {
    static const block_config cfg[] = {
        {"relu", OP_RELU, 3, {2, 5, 7}, 0, 0, 1},
        {"softcap 0.5", OP_SOFTCAP, 3, {2, 5, 7}, 0.5, 0, 1},
        {"softcap 30", OP_SOFTCAP, 2, {6, 9}, 30, 0, 50},
        {"rope off 0", OP_ROPE, 3, {2, 5, 8}, 10000, 0, 1},
        {"rope off 1000", OP_ROPE, 2, {6, 16}, 10000, 1000, 1},
        {"dropout 0.3", OP_DROPOUT, 3, {2, 5, 7}, 0.3, 0, 1},
    };
    for (int c = 0; c < N_OF(cfg); c++) {
        /* one context per dtype, seeded alike: the same x, dy and (for dropout) mask */
        qkv_ctx *ctx[2];
        qkv_tensor *y[2], *dx[2];
        for (int d = 0; d < 2; d++) {
            qkv_dtype dt = d ? QKV_F64 : QKV_F32;
            ctx[d] = qkv_ctx_new(NULL);
            qkv_seed(ctx[d], 9 + (uint64_t)c);
            qkv_tensor *x = convert(ctx[d], randn_f32_exact(ctx[d], cfg[c].ndim, cfg[c].shape, cfg[c].scale), dt);
            qkv_tensor *dy = convert(ctx[d], randn_f32_exact(ctx[d], cfg[c].ndim, cfg[c].shape, 1.0), dt);
            qkv_set_requires_grad(ctx[d], x, true);
            y[d] = block_fn(ctx[d], &x, 1, (void *)&cfg[c]);
            cr_assert_not_null(y[d], "%s: %s", cfg[c].name, qkv_errmsg(ctx[d]));
            cr_assert_eq(qkv_backward(ctx[d], y[d], dy), QKV_OK, "%s", qkv_errmsg(ctx[d]));
            dx[d] = x->grad;
        }
        double ey = rel_norm_err(y[0], y[1]), edx = rel_norm_err(dx[0], dx[1]);
        /* relu of f32-exact values is exact in both; every other one rounds somewhere (the bound is not 0) */
        bool exact = cfg[c].op == OP_RELU;
        cr_expect(ey <= 1e-7 && (ey > 0) != exact, "%s forward: %g", cfg[c].name, ey);
        cr_expect(edx <= 1e-7 && (edx > 0) != exact, "%s backward: %g", cfg[c].name, edx);
        qkv_ctx_free(ctx[0]);
        qkv_ctx_free(ctx[1]);
    }
}

/* ---- golden values from PyTorch 1.13 (tests/tools/make_golden_blocks.py) ------------------------ */

static qkv_tensor *load_blocks_golden(qkv_ctx *ctx, const char *name, const char *what) {
    char full[128];
    snprintf(full, sizeof full, "blocks_%s", name);
    return load_golden(ctx, full, what, false);
}

/* The largest |got - want| / (atol + rtol |want|) over the elements (> 1 fails). */
static double worst_ratio(const qkv_tensor *got, const qkv_tensor *want, double atol, double rtol) {
    cr_assert_eq(got->numel, want->numel);
    double worst = 0;
    for (int64_t i = 0; i < want->numel; i++) {
        double r = fabs(at(got, i) - at(want, i)) / (atol + rtol * fabs(at(want, i)));
        worst = isnan(r) ? INFINITY : fmax(worst, r);
    }
    return worst;
}

typedef struct golden_case {
    const char *name;
    int op;
    double atol64, rtol64; /* against PyTorch in f64 */
    double atol32, rtol32; /* the f32 run (its input rounded to f32) against PyTorch's f64 result */
} golden_case;

/* f64 tolerances: relu is exact; softcap and rope differ from PyTorch only in the last bits of tanh, pow
 * and cos/sin (a few ulps; at offset 1e5 the angle's own rounding is ~1e-11 rad, so rope's atol grows with
 * the offset). f32: x rounded to f32 moves y by up to 2^-24 |x| |f'|, and y is rounded once more: 2 * 2^-24
 * of the row scale, i.e. an atol of ~1e-7 for |x| ~ 1 (rtol 2.5e-7 covers the large-|x| softcap cases;
 * relu is x rounded once, 2^-24 relative). Measured worst ratios (QKV_GOLDEN_VERBOSE=1): 0.25, and 0.83 for
 * relu in f32 against its exact bound. */
static const golden_case GOLDEN[] = {
    {"relu_3x7", OP_RELU, 1e-300, 0, 1e-300, 0x1p-24},
    {"relu_b2_4x5", OP_RELU, 1e-300, 0, 1e-300, 0x1p-24},
    {"softcap_cap0.5", OP_SOFTCAP, 1e-15, 1e-14, 1e-7, 2.5e-7},
    {"softcap_cap30", OP_SOFTCAP, 1e-13, 1e-14, 1e-6, 2.5e-7},
    {"softcap_cap1e3", OP_SOFTCAP, 1e-12, 1e-14, 1e-5, 2.5e-7},
    {"softcap_saturated", OP_SOFTCAP, 1e-15, 1e-14, 1e-7, 2.5e-7},
    {"rope_n5_d8_off0", OP_ROPE, 1e-14, 1e-14, 3e-7, 2.5e-7},
    {"rope_b3_n4_d16_off1", OP_ROPE, 1e-14, 1e-14, 3e-7, 2.5e-7},
    {"rope_b2_n6_d2_off1000", OP_ROPE, 1e-12, 1e-14, 3e-7, 2.5e-7},
    {"rope_b4_n3_d32_off1000_base500", OP_ROPE, 1e-12, 1e-14, 3e-7, 2.5e-7},
    {"rope_n2_d6_off100000", OP_ROPE, 1e-10, 1e-14, 3e-7, 2.5e-7},
};

Test(golden_blocks, relu_softcap_rope_against_pytorch) {
    for (int g = 0; g < N_OF(GOLDEN); g++) {
        const golden_case *gc = &GOLDEN[g];
        for (int d = 0; d < 2; d++) {
            qkv_dtype dt = d ? QKV_F64 : QKV_F32;
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            qkv_tensor *x64 = load_blocks_golden(ctx, gc->name, "x"), *params = load_blocks_golden(ctx, gc->name, "params");
            qkv_tensor *want_y = load_blocks_golden(ctx, gc->name, "y"), *want_dx = load_blocks_golden(ctx, gc->name, "dx");
            qkv_tensor *x = convert(ctx, x64, dt), *r = convert(ctx, load_blocks_golden(ctx, gc->name, "r"), dt);
            block_config c = {gc->name, gc->op, 0, {0}, params->numel ? qkv_f64(params)[0] : 0,
                              params->numel > 1 ? (int64_t)qkv_f64(params)[1] : 0, 1};
            qkv_set_requires_grad(ctx, x, true);
            qkv_tensor *y = block_fn(ctx, &x, 1, &c);
            cr_assert_not_null(y, "%s: %s", gc->name, qkv_errmsg(ctx));
            cr_assert_eq(qkv_backward(ctx, y, r), QKV_OK, "%s", qkv_errmsg(ctx));
            double atol = d ? gc->atol64 : gc->atol32, rtol = d ? gc->rtol64 : gc->rtol32;
            double ey = worst_ratio(y, want_y, atol, rtol), edx = worst_ratio(x->grad, want_dx, atol, rtol);
            cr_expect(ey <= 1 && edx <= 1, "%s %s: worst |qkv - PyTorch| / tolerance is %g (y), %g (dx)", gc->name,
                      qkv_dtype_name(dt), ey, edx);
            if (getenv("QKV_GOLDEN_VERBOSE"))
                cr_log_info("%s %s: ratio y %.3g dx %.3g", gc->name, qkv_dtype_name(dt), ey, edx);
            qkv_ctx_free(ctx);
        }
    }
}

Test(golden_blocks, sinusoidal_table_against_pytorch) {
    const char *cases[] = {"sinusoidal_50x16", "sinusoidal_7x5", "sinusoidal_1x1", "sinusoidal_3x2"};
    for (int k = 0; k < N_OF(cases); k++)
        for (int d = 0; d < 2; d++) {
            qkv_dtype dt = d ? QKV_F64 : QKV_F32;
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            qkv_tensor *want = load_blocks_golden(ctx, cases[k], "y"), *params = load_blocks_golden(ctx, cases[k], "params");
            qkv_tensor *t = qkv_sinusoidal_positions(ctx, (int64_t)qkv_f64(params)[0], (int64_t)qkv_f64(params)[1], dt);
            cr_assert_not_null(t, "%s", qkv_errmsg(ctx));
            cr_expect(t->shape[0] == want->shape[0] && t->shape[1] == want->shape[1]);
            /* PyTorch's exp(-2j ln(1e4) / d) and qkv's pow(1e4, -2j / d) differ by an ulp or so; at p = 49 the
             * angle's rounding is ~1e-14. f32: one rounding of values in [-1, 1]. */
            double ratio = worst_ratio(t, want, d ? 1e-13 : 6e-8, 0);
            cr_expect(ratio <= 1, "%s %s: worst error / tolerance %g", cases[k], qkv_dtype_name(dt), ratio);
            qkv_ctx_free(ctx);
        }
}
