/*
 * test_seed.c — the textbook's worked example (../shared/seed/README.md): n = 3 tokens, d_k = d_v = 2.
 * Every value the text prints is reproduced to 1e-6, step by step, in f32 and in f64, both through the
 * four operators and through qkv_attention.
 */
#include <criterion/criterion.h>
#include <math.h>

#include "qkv.h"

static const double Q[3][2] = {{1, 0}, {0, 1}, {1, 1}};
static const double K[3][2] = {{1, 0}, {0, 1}, {1, 0}};
static const double V[3][2] = {{10, 0}, {0, 10}, {5, 5}};

static const double SCORES[3][3] = {{1, 0, 1}, {0, 1, 0}, {1, 1, 1}};
static const double SCALED[3][3] = {{0.7071, 0, 0.7071}, {0, 0.7071, 0}, {0.7071, 0.7071, 0.7071}};
static const double SOFTMAX[3][3] = {{0.401112, 0.197776, 0.401112},
                                     {0.248255, 0.503490, 0.248255},
                                     {1.0 / 3, 1.0 / 3, 1.0 / 3}};
static const double OUT[3][2] = {{6.016681, 3.983319}, {3.723826, 6.276174}, {5, 5}};

static qkv_tensor *matrix(qkv_ctx *ctx, qkv_dtype dt, const double m[3][2]) {
    qkv_tensor *t = qkv_zeros(ctx, dt, 2, (int64_t[]){3, 2});
    for (int i = 0; i < 6; i++) qkv_set_flat(ctx, t, i, m[i / 2][i % 2]);
    return t;
}

/* Compare t [rows, cols] with want to tol; the text prints the scaled scores to 4 decimals. */
static void expect_matrix(qkv_ctx *ctx, const qkv_tensor *t, const double *want, int rows, int cols, double tol,
                          const char *what) {
    cr_assert_not_null(t, "%s: %s", what, qkv_errmsg(ctx));
    cr_assert_eq(t->numel, rows * cols, "%s", what);
    int bad = 0;
    for (int i = 0; i < rows * cols; i++) {
        double got = qkv_get_flat(ctx, t, i);
        if (!(fabs(got - want[i]) <= tol)) {
            bad++;
            cr_log_error("%s[%d][%d]: got %.9f, the text prints %.9f", what, i / cols, i % cols, got, want[i]);
        }
    }
    cr_expect_eq(bad, 0, "%s: %d values differ", what, bad);
}

static void check_seed(qkv_dtype dt) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *q = matrix(ctx, dt, Q), *k = matrix(ctx, dt, K), *v = matrix(ctx, dt, V);
    qkv_tensor *scores = qkv_matmul(ctx, q, k, QKV_TRANS_B);  // Q K^T
    qkv_tensor *scaled = qkv_scale(ctx, scores, 1 / sqrt(2)); // / sqrt(d_k)
    qkv_tensor *a = qkv_softmax(ctx, scaled, NULL, 0);        // softmax by rows
    qkv_tensor *out = qkv_matmul(ctx, a, v, 0);               // A V
    expect_matrix(ctx, scores, &SCORES[0][0], 3, 3, 0, "Q K^T");
    expect_matrix(ctx, scaled, &SCALED[0][0], 3, 3, 5e-5, "Q K^T / sqrt(2)"); /* printed to 4 decimals */
    expect_matrix(ctx, a, &SOFTMAX[0][0], 3, 3, 1e-6, "softmax");
    expect_matrix(ctx, out, &OUT[0][0], 3, 2, 1e-6, "A V");

    qkv_tensor *attn = NULL;
    qkv_tensor *out2 = qkv_attention(ctx, q, k, v, NULL, QKV_SCALE_DEFAULT, 0, &attn);
    expect_matrix(ctx, attn, &SOFTMAX[0][0], 3, 3, 1e-6, "qkv_attention's attn");
    expect_matrix(ctx, out2, &OUT[0][0], 3, 2, 1e-6, "qkv_attention's out");
    /* the third query is equally similar to every key, so its output is the mean of the values */
    cr_expect(fabs(qkv_get(ctx, out2, (int64_t[]){2, 0}) - (10 + 0 + 5) / 3.0) < 1e-6);
    cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

Test(seed, worked_example_f64) { check_seed(QKV_F64); }
Test(seed, worked_example_f32) { check_seed(QKV_F32); }

/* The exact values behind the printed ones: softmax([r, 0, r]) with r = 1/sqrt(2). */
Test(seed, exact_values_f64) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *attn = NULL;
    qkv_tensor *out = qkv_attention(ctx, matrix(ctx, QKV_F64, Q), matrix(ctx, QKV_F64, K),
                                    matrix(ctx, QKV_F64, V), NULL, QKV_SCALE_DEFAULT, 0, &attn);
    double e = exp(1 / sqrt(2)), p = e / (2 * e + 1), r = 1 / (e + 2);
    double want_attn[9] = {p, 1 - 2 * p, p, r, e * r, r, 1.0 / 3, 1.0 / 3, 1.0 / 3};
    double want_out[6] = {10 * p + 5 * p, 10 * (1 - 2 * p) + 5 * p, 10 * r + 5 * r, 10 * e * r + 5 * r, 5, 5};
    expect_matrix(ctx, attn, want_attn, 3, 3, 1e-15, "exact attn");
    expect_matrix(ctx, out, want_out, 3, 2, 1e-14, "exact out");
    qkv_ctx_free(ctx);
}
