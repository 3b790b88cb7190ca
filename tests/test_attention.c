/*
 * test_attention.c — qkv_attention and qkv_self_attention: gradcheck in f64 over many configurations
 * (batch, n = 1, non-square, heads, masks with fully masked rows, causal, ties, large scores, scales),
 * f32 against f64, the attention matrix it hands back, masked rows, and misuse.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "qkv.h"
#include "test_ops.h"

typedef struct config {
    const char *name;
    int batch, n_q, n_k, d_k, d_v, heads; /* heads > 1: q, k, v are split from [B, n, heads * d] */
    int mask;                             /* 0 none, 1 [n_q, n_k] random with a fully masked row,
                                             2 [B, 1, n_k] padding, 3 [B, n_q, n_k] random */
    int flags;
    double scale; /* QKV_SCALE_DEFAULT: 1/sqrt(d_k) */
    double spread; /* std of the inputs: large values push the scores towards +-80 */
    bool ties;     /* identical keys, so several scores tie */
} config;

static const config CONFIGS[] = {
    {"seed-sized", 1, 3, 3, 2, 2, 1, 0, 0, QKV_SCALE_DEFAULT, 1, false},
    {"batch 3", 3, 4, 4, 3, 2, 1, 0, 0, QKV_SCALE_DEFAULT, 1, false},
    {"n = 1", 2, 1, 1, 4, 3, 1, 0, 0, QKV_SCALE_DEFAULT, 1, false},
    {"one query, many keys", 2, 1, 5, 3, 2, 1, 0, 0, QKV_SCALE_DEFAULT, 1, false},
    {"non-square 3x5", 2, 3, 5, 4, 2, 1, 0, 0, QKV_SCALE_DEFAULT, 1, false},
    {"non-square 6x2", 1, 6, 2, 2, 3, 1, 0, 0, QKV_SCALE_DEFAULT, 1, false},
    {"scale 1", 2, 4, 4, 8, 4, 1, 0, 0, 1.0, 1, false},
    {"scale 1/d_k", 2, 4, 4, 8, 4, 1, 0, 0, 0.125, 1, false},
    {"scale 0 (uniform)", 1, 3, 4, 2, 2, 1, 0, 0, 0.0, 1, false},
    {"causal", 2, 5, 5, 3, 3, 1, 0, 1, QKV_SCALE_DEFAULT, 1, false},
    {"causal non-square", 1, 3, 6, 2, 2, 1, 0, 1, QKV_SCALE_DEFAULT, 1, false},
    {"mask with a fully masked row", 2, 4, 5, 3, 2, 1, 1, 0, QKV_SCALE_DEFAULT, 1, false},
    {"padding mask", 3, 4, 4, 2, 3, 1, 2, 0, QKV_SCALE_DEFAULT, 1, false},
    {"padding + causal", 2, 5, 5, 2, 2, 1, 2, 1, QKV_SCALE_DEFAULT, 1, false},
    {"per-batch mask", 2, 3, 4, 3, 2, 1, 3, 0, QKV_SCALE_DEFAULT, 1, false},
    {"per-batch mask + causal", 2, 4, 4, 2, 2, 1, 3, 1, QKV_SCALE_DEFAULT, 1, false},
    {"ties", 2, 3, 4, 2, 2, 1, 0, 0, QKV_SCALE_DEFAULT, 1, true},
    {"ties + causal", 1, 4, 4, 3, 2, 1, 0, 1, QKV_SCALE_DEFAULT, 1, true},
    {"large scores (near +-80)", 1, 3, 3, 4, 2, 1, 0, 0, 1.0, 4.5, false},
    {"large scores, masked", 2, 3, 4, 4, 2, 1, 1, 0, 1.0, 4.5, false},
    {"2 heads", 2, 4, 4, 3, 3, 2, 0, 0, QKV_SCALE_DEFAULT, 1, false},
    {"3 heads, padding mask", 2, 3, 3, 2, 2, 3, 2, 0, QKV_SCALE_DEFAULT, 1, false},
    {"2 heads, causal", 1, 5, 5, 2, 4, 2, 0, 1, QKV_SCALE_DEFAULT, 1, false},
};
#define N_CONFIGS ((int)(sizeof CONFIGS / sizeof CONFIGS[0]))

typedef struct setup {
    const config *c;
    const qkv_tensor *mask;
} setup;

static qkv_tensor *make_mask(qkv_ctx *ctx, const config *c) {
    qkv_tensor *m = NULL;
    if (c->mask == 1) {
        m = qkv_ones(ctx, QKV_U8, 2, (int64_t[]){c->n_q, c->n_k});
        for (int j = 0; j < c->n_k; j++) qkv_set(ctx, m, (int64_t[]){1, j}, 0); /* row 1 fully masked */
        qkv_set(ctx, m, (int64_t[]){0, c->n_k - 1}, 0);
    } else if (c->mask == 2) {
        m = qkv_ones(ctx, QKV_U8, 3, (int64_t[]){c->batch, 1, c->n_k});
        for (int b = 0; b < c->batch; b++) /* batch b has b padded keys at the end */
            for (int j = c->n_k - b; j < c->n_k; j++)
                if (j >= 0) qkv_set(ctx, m, (int64_t[]){b, 0, j}, 0);
    } else if (c->mask == 3) {
        m = qkv_ones(ctx, QKV_U8, 3, (int64_t[]){c->batch, c->n_q, c->n_k});
        for (int64_t i = 0; i < m->numel; i++) qkv_u8(m)[i] = (uint8_t)((i * 7 + 3) % 5 != 0);
    }
    return m;
}

/* q, k, v as [B, n, heads * d] split into [B * heads, n, d] when heads > 1. */
static qkv_tensor *attend(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)n;
    const setup *s = user;
    qkv_tensor *q = in[0], *k = in[1], *v = in[2];
    if (s->c->heads > 1) {
        q = qkv_split_heads(ctx, q, s->c->heads);
        k = qkv_split_heads(ctx, k, s->c->heads);
        v = qkv_split_heads(ctx, v, s->c->heads);
    }
    qkv_tensor *out = qkv_attention(ctx, q, k, v, s->mask, s->c->scale, s->c->flags, NULL);
    return s->c->heads > 1 ? qkv_merge_heads(ctx, out, s->c->heads) : out;
}

static void make_inputs(qkv_ctx *ctx, const config *c, qkv_dtype dt, qkv_tensor *in[3]) {
    int h = c->heads;
    in[0] = qkv_randn(ctx, dt, 3, (int64_t[]){c->batch, c->n_q, h * c->d_k}, 0, c->spread);
    in[1] = qkv_randn(ctx, dt, 3, (int64_t[]){c->batch, c->n_k, h * c->d_k}, 0, c->spread);
    in[2] = qkv_randn(ctx, dt, 3, (int64_t[]){c->batch, c->n_k, h * c->d_v}, 0, 1);
    if (c->ties) { /* every key equal to the first key of its batch */
        int64_t row = h * c->d_k;
        for (int b = 0; b < c->batch; b++)
            for (int j = 1; j < c->n_k; j++)
                for (int64_t e = 0; e < row; e++) {
                    int64_t first = ((int64_t)b * c->n_k) * row + e, here = ((int64_t)b * c->n_k + j) * row + e;
                    qkv_set_flat(ctx, in[1], here, qkv_get_flat(ctx, in[1], first));
                }
    }
}

/* Configuration c's q, k, v and mask; *user is the setup fn reads. */
static int attention_build(qkv_ctx *ctx, int c, void *user, qkv_tensor **in, void **fn_user) {
    (void)fn_user;
    setup *s = user;
    *s = (setup){&CONFIGS[c], make_mask(ctx, &CONFIGS[c])};
    make_inputs(ctx, &CONFIGS[c], QKV_F64, in);
    return 3;
}

static void attention_name(char *buf, size_t size, int c, const void *user) {
    (void)user;
    snprintf(buf, size, "attention config '%s'", CONFIGS[c].name);
}

Test(attention, gradcheck_over_configurations) {
    setup s;
    gradcheck_table t = {N_CONFIGS, 100, attention_build, attention_name, attend, &s, NULL};
    check_gradcheck_table(&t, 1500);
}

/* Norm-wise relative difference |a - b| / |b| of two tensors living in two contexts. */
static double rel_diff(qkv_ctx *ca, const qkv_tensor *a, qkv_ctx *cb, const qkv_tensor *b) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < a->numel; i++) {
        double x = qkv_get_flat(ca, a, i), y = qkv_get_flat(cb, b, i);
        num += (x - y) * (x - y);
        den += y * y;
    }
    return sqrt(num) / fmax(sqrt(den), 1e-30);
}

/* Forward and backward of sum(out * R) in dtype dt; the inputs and R come from the context's seed. */
static qkv_tensor *run_in(qkv_ctx *ctx, const config *c, qkv_dtype dt, qkv_tensor *in[3]) {
    setup s = {c, make_mask(ctx, c)};
    make_inputs(ctx, c, QKV_F64, in);
    for (int j = 0; j < 3; j++) {
        in[j] = qkv_to_dtype(ctx, in[j], dt);
        qkv_set_requires_grad(ctx, in[j], true);
    }
    qkv_tensor *out = attend(ctx, in, 3, &s);
    qkv_tensor *r = out ? qkv_randn(ctx, dt, out->ndim, out->shape, 0, 1) : NULL;
    qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, out, r)), NULL);
    return out;
}

/* Norm of a tensor in its context. */
static double norm(qkv_ctx *ctx, const qkv_tensor *t) {
    double s = 0;
    for (int64_t i = 0; i < t->numel; i++) s += qkv_get_flat(ctx, t, i) * qkv_get_flat(ctx, t, i);
    return sqrt(s);
}

/* Each gradient is compared norm-wise. Two kinds of configuration are set apart:
 * - a gradient that is zero by symmetry (ties: every key equal makes dq = s * k * rowsum(dS) = 0) has only
 *   rounding noise in both dtypes; it is compared against the largest gradient's norm instead of its own;
 * - saturated softmax (scores near +-80) is skipped: rounding the inputs to f32 moves the scores by about
 *   1e-5, which changes the exponentially small gradients there by O(1) relative. That is f32's limit,
 *   not an error, and it is what examples/softmax_study measures. */
Test(attention, f32_matches_f64) {
    int failed = 0, compared = 0;
    for (int i = 0; i < N_CONFIGS; i++) {
        const config *c = &CONFIGS[i];
        if (c->spread > 1) continue;
        qkv_options o = qkv_default_options();
        o.seed = 7 + (uint64_t)i;
        qkv_ctx *c64 = qkv_ctx_new(&o), *c32 = qkv_ctx_new(&o);
        qkv_tensor *in64[3], *in32[3];
        qkv_tensor *out64 = run_in(c64, c, QKV_F64, in64), *out32 = run_in(c32, c, QKV_F32, in32);
        cr_assert(!qkv_error(c64) && !qkv_error(c32), "%s %s", qkv_errmsg(c64), qkv_errmsg(c32));
        double worst = rel_diff(c32, out32, c64, out64), largest = 0;
        for (int j = 0; j < 3; j++) largest = fmax(largest, norm(c64, in64[j]->grad));
        for (int j = 0; j < 3; j++) {
            double own = norm(c64, in64[j]->grad);
            double err = rel_diff(c32, in32[j]->grad, c64, in64[j]->grad) * fmax(own, 1e-300);
            worst = fmax(worst, err / (own > 1e-10 * largest ? own : largest));
        }
        compared++;
        if (!(worst < 1e-4)) {
            failed++;
            cr_log_error("config '%s': f32 differs from f64 by %.3g (norm-wise, output and gradients)", c->name,
                         worst);
        }
        qkv_ctx_free(c64);
        qkv_ctx_free(c32);
    }
    cr_expect_geq(compared, 20);
    cr_expect_eq(failed, 0);
}

Test(attention, returns_the_attention_matrix_and_zero_rows_where_everything_is_masked) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *q = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){1, 3, 2}, 0, 1);
    qkv_tensor *k = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){1, 3, 2}, 0, 1);
    qkv_tensor *v = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){1, 3, 2}, 0, 1);
    qkv_tensor *mask = qkv_ones(ctx, QKV_U8, 2, (int64_t[]){3, 3});
    for (int j = 0; j < 3; j++) qkv_set(ctx, mask, (int64_t[]){2, j}, 0);
    qkv_set_requires_grad(ctx, q, true);
    qkv_set_requires_grad(ctx, k, true);
    qkv_tensor *attn = NULL;
    qkv_tensor *out = qkv_attention(ctx, q, k, v, mask, QKV_SCALE_DEFAULT, 0, &attn);
    cr_assert_not_null(attn, "%s", qkv_errmsg(ctx));
    cr_expect_eq(attn->shape[1], 3);
    cr_expect_eq(attn->shape[2], 3);
    for (int i = 0; i < 2; i++) {
        double row = 0;
        for (int j = 0; j < 3; j++) row += qkv_get(ctx, attn, (int64_t[]){0, i, j});
        cr_expect(fabs(row - 1) < 1e-12, "row %d sums to %g", i, row);
    }
    for (int j = 0; j < 3; j++) cr_expect_eq(qkv_get(ctx, attn, (int64_t[]){0, 2, j}), 0.0);
    for (int j = 0; j < 2; j++) cr_expect_eq(qkv_get(ctx, out, (int64_t[]){0, 2, j}), 0.0);
    cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, out), NULL), QKV_OK);
    for (int j = 0; j < 2; j++) cr_expect_eq(qkv_get(ctx, q->grad, (int64_t[]){0, 2, j}), 0.0, "masked row: dq = 0");
    for (int64_t i = 0; i < k->numel; i++) cr_expect(isfinite(qkv_get_flat(ctx, k->grad, i)));
    qkv_ctx_free(ctx);
}

typedef struct sa_setup {
    const qkv_tensor *mask;
    int flags;
    double scale;
} sa_setup;

static qkv_tensor *self_attend(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)n;
    const sa_setup *s = user;
    return qkv_self_attention(ctx, in[0], in[1], in[2], in[3], s->mask, s->scale, s->flags, NULL);
}

/* 24 configurations of self-attention: batch 1-3, n = 1 to 6, d_model != d_k != d_v, default scale, 1 and
 * 1/d_k, causal, a [n, n] mask with a fully masked row, and a [B, 1, n] padding mask. Configuration i: */
typedef struct sa_config {
    int batch, n, d_model, d_k, d_v, flags, mask_kind;
    double scale;
} sa_config;

static sa_config sa_config_of(int i) {
    sa_config c = {1 + i % 3, 1 + (i * 5) % 6, 2 + i % 4, 2 + (i / 2) % 3, 1 + (i / 3) % 4,
                   (i / 4) % 2 ? QKV_CAUSAL : 0, (i / 8) % 3, 0};
    c.scale = i % 3 == 0 ? QKV_SCALE_DEFAULT : i % 3 == 1 ? 1.0 : 1.0 / c.d_k;
    return c;
}

/* Configuration i's x, W_Q, W_K, W_V and mask; *user is the sa_setup fn reads. */
static int sa_build(qkv_ctx *ctx, int i, void *user, qkv_tensor **in, void **fn_user) {
    (void)fn_user;
    sa_config c = sa_config_of(i);
    int batch = c.batch, n = c.n;
    qkv_tensor *mask = NULL;
    if (c.mask_kind == 1) { /* [n, n], the last query sees no key */
        mask = qkv_ones(ctx, QKV_U8, 2, (int64_t[]){n, n});
        for (int j = 0; j < n; j++) qkv_set(ctx, mask, (int64_t[]){n - 1, j}, 0);
    } else if (c.mask_kind == 2) { /* [B, 1, n], batch b pads its last b keys */
        mask = qkv_ones(ctx, QKV_U8, 3, (int64_t[]){batch, 1, n});
        for (int b = 0; b < batch; b++)
            for (int j = n - b; j < n; j++)
                if (j >= 0) qkv_set(ctx, mask, (int64_t[]){b, 0, j}, 0);
    }
    in[0] = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){batch, n, c.d_model}, 0, 1);
    in[1] = qkv_randn(ctx, QKV_F64, 2, (int64_t[]){c.d_model, c.d_k}, 0, 1);
    in[2] = qkv_randn(ctx, QKV_F64, 2, (int64_t[]){c.d_model, c.d_k}, 0, 1);
    in[3] = qkv_randn(ctx, QKV_F64, 2, (int64_t[]){c.d_model, c.d_v}, 0, 1);
    *(sa_setup *)user = (sa_setup){mask, c.flags, c.scale};
    return 4;
}

static void sa_name(char *buf, size_t size, int i, const void *user) {
    (void)user;
    sa_config c = sa_config_of(i);
    snprintf(buf, size, "self-attention config %d (B %d, n %d, d_model %d, d_k %d, d_v %d, flags %d, mask %d, scale %g)",
             i, c.batch, c.n, c.d_model, c.d_k, c.d_v, c.flags, c.mask_kind, c.scale);
}

Test(attention, self_attention_gradcheck_reaches_x_and_all_three_weights) {
    sa_setup s;
    gradcheck_table t = {24, 500, sa_build, sa_name, self_attend, &s, NULL};
    check_gradcheck_table(&t, 1200);
}

Test(attention, misuse_names_the_function_and_the_shapes) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *q = qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){2, 3, 4});
    qkv_tensor *k = qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){2, 5, 3});
    qkv_tensor *v = qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){2, 5, 2});
    cr_expect_null(qkv_attention(ctx, q, k, v, NULL, QKV_SCALE_DEFAULT, 0, NULL));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_SHAPE);
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_attention") && strstr(qkv_errmsg(ctx), "[2,3,4]") &&
                  strstr(qkv_errmsg(ctx), "[2,5,3]"),
              "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    qkv_tensor *x = qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){2, 3, 4});
    qkv_tensor *w = qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){4, 2});
    qkv_tensor *wbad = qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){5, 2});
    cr_expect_null(qkv_self_attention(ctx, x, w, wbad, w, NULL, QKV_SCALE_DEFAULT, 0, NULL));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_SHAPE);
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_self_attention") && strstr(qkv_errmsg(ctx), "wk is [5,2]"), "%s",
              qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_expect_null(qkv_attention(ctx, q, q, q, NULL, INFINITY, 0, NULL));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_ARG);
    qkv_ctx_free(ctx);
}

/* QKV_SCALE_DEFAULT is -HUGE_VAL and means 1/sqrt(d_k) exactly; NaN (what 0.0/0.0 gives) and +inf are
 * refused by both entry points with a message naming the function, the shapes and the value; every finite
 * value (0, negative, 1) is used as given: out equals the composed path run with that number. */
Test(attention, the_scale_default_is_minus_inf_and_nan_or_plus_inf_are_refused) {
    cr_expect(QKV_SCALE_DEFAULT == -HUGE_VAL && isinf(QKV_SCALE_DEFAULT) && QKV_SCALE_DEFAULT < 0);
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int dt = 0; dt < 2; dt++) {
        qkv_dtype t = dt ? QKV_F64 : QKV_F32;
        qkv_tensor *q = qkv_randn(ctx, t, 3, (int64_t[]){2, 3, 4}, 0, 1);
        qkv_tensor *k = qkv_randn(ctx, t, 3, (int64_t[]){2, 5, 4}, 0, 1);
        qkv_tensor *v = qkv_randn(ctx, t, 3, (int64_t[]){2, 5, 2}, 0, 1);
        qkv_tensor *x = qkv_randn(ctx, t, 3, (int64_t[]){2, 3, 6}, 0, 1);
        qkv_tensor *w = qkv_randn(ctx, t, 2, (int64_t[]){6, 4}, 0, 1);
        const double bad[3] = {NAN, -NAN, INFINITY};
        for (int i = 0; i < 3; i++)
            for (int fused = 0; fused < 2; fused++) {
                qkv_tensor *attn = NULL;
                cr_expect_null(qkv_attention(ctx, q, k, v, NULL, bad[i], 0, fused ? NULL : &attn));
                cr_expect_eq(qkv_error(ctx), QKV_ERR_ARG, "scale %g", bad[i]);
                const char *m = qkv_errmsg(ctx);
                cr_expect(strstr(m, "qkv_attention") && strstr(m, "[2,3,4]") && strstr(m, "[2,5,4]") &&
                              strstr(m, "scale") && strstr(m, isnan(bad[i]) ? "nan" : "inf"),
                          "%s", m);
                qkv_clear_error(ctx);
                cr_expect_null(qkv_self_attention(ctx, x, w, w, w, NULL, bad[i], 0, fused ? NULL : &attn));
                cr_expect_eq(qkv_error(ctx), QKV_ERR_ARG, "scale %g", bad[i]);
                m = qkv_errmsg(ctx);
                cr_expect(strstr(m, "qkv_self_attention") && strstr(m, "[2,3,6]") && strstr(m, "scale") &&
                              strstr(m, isnan(bad[i]) ? "nan" : "inf"),
                          "%s", m);
                qkv_clear_error(ctx);
            }
        /* the default is 1/sqrt(4) = 0.5 exactly; 0, a negative value and 1 are used as given */
        const double given[4] = {QKV_SCALE_DEFAULT, 0.0, -0.7, 1.0}, as_number[4] = {0.5, 0.0, -0.7, 1.0};
        for (int i = 0; i < 4; i++)
            for (int fused = 0; fused < 2; fused++) {
                qkv_tensor *attn = NULL;
                qkv_tensor *out = qkv_attention(ctx, q, k, v, NULL, given[i], 0, fused ? NULL : &attn);
                qkv_tensor *ref = qkv_attention(ctx, q, k, v, NULL, as_number[i], 0, fused ? NULL : &attn);
                cr_assert(out && ref, "%s", qkv_errmsg(ctx));
                int differ = 0;
                for (int64_t e = 0; e < out->numel; e++)
                    differ += qkv_get_flat(ctx, out, e) != qkv_get_flat(ctx, ref, e);
                cr_expect_eq(differ, 0, "scale %g (%s, %s) is not the number %g", given[i], qkv_dtype_name(t),
                             fused ? "fused" : "composed", as_number[i]);
                qkv_tensor *sa = qkv_self_attention(ctx, x, w, w, w, NULL, given[i], 0, NULL);
                qkv_tensor *sr = qkv_self_attention(ctx, x, w, w, w, NULL, as_number[i], 0, NULL);
                cr_assert(sa && sr, "%s", qkv_errmsg(ctx));
                for (int64_t e = 0; e < sa->numel; e++) differ += qkv_get_flat(ctx, sa, e) != qkv_get_flat(ctx, sr, e);
                cr_expect_eq(differ, 0, "self-attention, scale %g", given[i]);
            }
        /* scale 0: uniform attention, out = mean of v over the keys */
        qkv_tensor *u = qkv_attention(ctx, q, k, v, NULL, 0.0, 0, NULL);
        double mean = 0;
        for (int j = 0; j < 5; j++) mean += qkv_get(ctx, v, (int64_t[]){1, j, 1}) / 5;
        cr_expect(fabs(qkv_get(ctx, u, (int64_t[]){1, 2, 1}) - mean) < 1e-6, "scale 0: %g, mean %g",
                  qkv_get(ctx, u, (int64_t[]){1, 2, 1}), mean);
    }
    cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}
