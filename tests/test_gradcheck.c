/*
 * test_gradcheck.c — the gradient checker itself: it passes correct backwards, it catches wrong ones
 * (including a bug that a plain sum(out) would hide), and it leaves the caller's state as it found it.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "qkv_internal.h"

/* out = a * b + a: a is used twice, so its gradient is b + 1 summed over both uses. */
static qkv_tensor *mul_add(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)n;
    (void)user;
    return qkv_add(ctx, qkv_mul(ctx, in[0], in[1]), in[0]);
}

Test(gradcheck, passes_a_correct_composite_with_reuse) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = qkv_randn(ctx, QKV_F64, 2, (int64_t[]){3, 4}, 0, 1);
    qkv_tensor *b = qkv_randn(ctx, QKV_F64, 1, (int64_t[]){4}, 0, 1);
    qkv_tensor *in[2] = {a, b};
    qkv_gradcheck_result res;
    cr_assert_eq(qkv_gradcheck(ctx, mul_add, in, 2, NULL, NULL, &res), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect(res.passed, "%s", res.message);
    cr_expect_eq(res.checked, 16);
    cr_expect_eq(res.failed, 0);
    qkv_gradcheck_options five = {.five_point = true};
    cr_assert_eq(qkv_gradcheck(ctx, mul_add, in, 2, NULL, &five, &res), QKV_OK);
    cr_expect(res.passed, "%s", res.message);
    qkv_ctx_free(ctx);
}

/* A deliberately wrong operator: y = 2 x whose backward forgets the factor 2. */
static void double_wrong_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *dx = qkv_grad_of_(ctx, node->in[0]);
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    if (dx && dy) qkv_accumulate_f64_(dx, dy); /* should be 2 * dy */
}

static qkv_tensor *double_wrong(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)n;
    (void)user;
    qkv_tensor *y = qkv_new_like_(ctx, "double_wrong", in[0]);
    for (int64_t i = 0; i < y->numel; i++) qkv_f64(y)[i] = 2 * qkv_f64(in[0])[i];
    if (qkv_needs_grad_(ctx, in, 1)) qkv_record_(ctx, "double_wrong", double_wrong_backward, y, in, 1);
    return y;
}

Test(gradcheck, catches_a_missing_scale_factor) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_randn(ctx, QKV_F64, 1, (int64_t[]){5}, 0, 1);
    qkv_gradcheck_result res;
    cr_assert_eq(qkv_gradcheck(ctx, double_wrong, &x, 1, NULL, NULL, &res), QKV_OK);
    cr_expect(!res.passed);
    cr_expect_gt(res.failed, 0);
    cr_expect_eq(res.worst_input, 0);
    cr_expect(res.worst_index >= 0 && res.worst_index < 5);
    cr_expect(fabs(res.numeric - 2 * res.analytic) < 1e-6, "numeric %g is twice analytic %g", res.numeric,
              res.analytic);
    cr_expect(strstr(res.message, "FAILED") != NULL, "%s", res.message);
    qkv_ctx_free(ctx);
}

/* y = x - mean(x) over a row: its outputs sum to 0 whatever x is, so d sum(y)/dx = 0, and a backward that
 * returns zero passes a check against sum(out). The random projection R catches it. */
static void center_zero_backward(qkv_ctx *ctx, qkv_node_ *node) {
    (void)qkv_grad_of_(ctx, node->in[0]); /* adds nothing: should add dy - mean(dy) */
}

static qkv_tensor *center_wrong(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)n;
    (void)user;
    qkv_tensor *y = qkv_new_like_(ctx, "center_wrong", in[0]);
    double mean = 0;
    for (int64_t i = 0; i < y->numel; i++) mean += qkv_f64(in[0])[i] / (double)y->numel;
    for (int64_t i = 0; i < y->numel; i++) qkv_f64(y)[i] = qkv_f64(in[0])[i] - mean;
    if (qkv_needs_grad_(ctx, in, 1)) qkv_record_(ctx, "center_wrong", center_zero_backward, y, in, 1);
    return y;
}

static qkv_tensor *sum_of_center_wrong(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    return qkv_sum(ctx, center_wrong(ctx, in, n, user));
}

Test(gradcheck, the_random_projection_catches_what_sum_hides) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_randn(ctx, QKV_F64, 1, (int64_t[]){6}, 0, 1);
    qkv_gradcheck_result res;
    /* through a scalar sum, the wrong backward looks right: this is the trap */
    cr_assert_eq(qkv_gradcheck(ctx, sum_of_center_wrong, &x, 1, NULL, NULL, &res), QKV_OK);
    cr_expect(res.passed, "sum(out) cannot see the bug: %s", res.message);
    /* on the vector output, R exposes it */
    cr_assert_eq(qkv_gradcheck(ctx, center_wrong, &x, 1, NULL, NULL, &res), QKV_OK);
    cr_expect(!res.passed, "%s", res.message);
    qkv_ctx_free(ctx);
}

Test(gradcheck, leaves_inputs_grads_tape_and_rng_untouched) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *w = qkv_param(ctx, qkv_randn(ctx, QKV_F64, 1, (int64_t[]){4}, 0, 1));
    qkv_tensor *x = qkv_randn(ctx, QKV_F64, 1, (int64_t[]){4}, 0, 1);
    /* the user has a recorded graph and a gradient on w already */
    cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, w, x)), NULL), QKV_OK);
    double grad_before[4], w_before[4];
    memcpy(grad_before, w->grad->data, sizeof grad_before);
    memcpy(w_before, w->data, sizeof w_before);
    qkv_tensor *grad_ptr = w->grad;
    size_t used = qkv_arena_used(ctx);
    uint64_t rng_before[4];
    memcpy(rng_before, ctx->rng, sizeof rng_before);

    qkv_tensor *in[2] = {w, x};
    qkv_gradcheck_result res;
    cr_assert_eq(qkv_gradcheck(ctx, mul_add, in, 2, NULL, NULL, &res), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect(res.passed, "%s", res.message);
    cr_expect_eq(w->grad, grad_ptr);
    cr_expect(memcmp(grad_before, w->grad->data, sizeof grad_before) == 0, "w's gradient unchanged");
    cr_expect(memcmp(w_before, w->data, sizeof w_before) == 0, "w's values restored exactly");
    cr_expect(!x->requires_grad, "x's flag restored");
    cr_expect_eq(qkv_arena_used(ctx), used, "everything the check made was released");
    cr_expect(memcmp(rng_before, ctx->rng, sizeof rng_before) == 0, "the context RNG was not used");
    /* the user's tape is still marked consumed: a second backward is still refused */
    cr_expect_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, w, x)), NULL), QKV_ERR_STATE);
    qkv_ctx_free(ctx);
}

static qkv_tensor *returns_null(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)ctx, (void)in, (void)n, (void)user;
    return NULL;
}

Test(gradcheck, reports_misuse) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *f = qkv_ones(ctx, QKV_F32, 1, (int64_t[]){3});
    qkv_tensor *d = qkv_ones(ctx, QKV_F64, 1, (int64_t[]){3});
    qkv_gradcheck_result res;
    cr_expect_eq(qkv_gradcheck(ctx, mul_add, &f, 1, NULL, NULL, &res), QKV_ERR_ARG, "no f64 input");
    cr_expect(strstr(qkv_errmsg(ctx), "no f64 input") != NULL, "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    bool check[1] = {true};
    qkv_gradcheck_options o = {.check = check};
    cr_expect_eq(qkv_gradcheck(ctx, mul_add, &f, 1, NULL, &o, &res), QKV_ERR_DTYPE);
    qkv_clear_error(ctx);
    cr_expect_eq(qkv_gradcheck(ctx, returns_null, &d, 1, NULL, NULL, &res), QKV_ERR_ARG);
    cr_expect(strstr(qkv_errmsg(ctx), "returned NULL") != NULL, "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_expect_eq(qkv_gradcheck(ctx, NULL, &d, 1, NULL, NULL, &res), QKV_ERR_NULL);
    qkv_ctx_free(ctx);
}
