/*
 * test_autograd.c — the tape and backward on graphs whose gradients are worked out by hand: reuse of a
 * tensor, broadcasting, a 100,000-node chain, upstream gradients, no-grad mode, a second backward,
 * accumulation into parameters, and anomaly mode.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "qkv.h"

static qkv_tensor *vec(qkv_ctx *ctx, qkv_dtype dt, int n, const double *v) {
    qkv_tensor *t = qkv_zeros(ctx, dt, 1, (int64_t[]){n});
    for (int i = 0; i < n; i++) qkv_set_flat(ctx, t, i, v[i]);
    return t;
}

static void expect_values(qkv_ctx *ctx, const qkv_tensor *t, const double *want, int n, double tol) {
    cr_assert_not_null(t);
    cr_assert_eq(t->numel, n);
    for (int i = 0; i < n; i++) {
        double got = qkv_get_flat(ctx, t, i);
        cr_expect(fabs(got - want[i]) <= tol, "element %d: got %.17g want %.17g", i, got, want[i]);
    }
}

Test(autograd, reuse_adds_both_paths_in_f32_and_f64) {
    for (int dt = QKV_F32; dt <= QKV_F64; dt++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *a = vec(ctx, dt, 2, (double[]){1, 2});
        qkv_tensor *b = vec(ctx, dt, 2, (double[]){3, 4});
        qkv_set_requires_grad(ctx, a, true);
        qkv_set_requires_grad(ctx, b, true);
        /* L = sum(a * b + a) = 1*3 + 1 + 2*4 + 2 = 14;  dL/da = b + 1;  dL/db = a */
        qkv_tensor *loss = qkv_sum(ctx, qkv_add(ctx, qkv_mul(ctx, a, b), a));
        cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        expect_values(ctx, loss, (double[]){14}, 1, 0);
        expect_values(ctx, a->grad, (double[]){4, 5}, 2, 0);
        expect_values(ctx, b->grad, (double[]){1, 2}, 2, 0);
        qkv_ctx_free(ctx);
    }
}

Test(autograd, mean_of_squared_difference) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = vec(ctx, QKV_F64, 3, (double[]){1, -2, 0.5});
    qkv_tensor *b = vec(ctx, QKV_F64, 3, (double[]){0, 1, 0.5});
    qkv_set_requires_grad(ctx, a, true);
    qkv_set_requires_grad(ctx, b, true);
    /* L = mean((a-b)^2) = (1 + 9 + 0)/3;  dL/da = 2(a-b)/3 = [2/3, -2, 0];  dL/db = -dL/da */
    qkv_tensor *d = qkv_sub(ctx, a, b);
    qkv_tensor *loss = qkv_mean(ctx, qkv_mul(ctx, d, d));
    cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK);
    expect_values(ctx, loss, (double[]){10.0 / 3}, 1, 1e-15);
    expect_values(ctx, a->grad, (double[]){2.0 / 3, -2, 0}, 3, 1e-15);
    expect_values(ctx, b->grad, (double[]){-2.0 / 3, 2, 0}, 3, 1e-15);
    qkv_ctx_free(ctx);
}

Test(autograd, trailing_bias_gradient_is_the_column_sum) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_from_data(ctx, QKV_F64, 2, (int64_t[]){2, 3}, (double[]){1, 2, 3, 4, 5, 6});
    qkv_tensor *b = vec(ctx, QKV_F64, 3, (double[]){10, 20, 30});
    qkv_tensor *s = qkv_scalar(ctx, QKV_F64, 2);
    qkv_set_requires_grad(ctx, x, true);
    qkv_set_requires_grad(ctx, b, true);
    qkv_set_requires_grad(ctx, s, true);
    /* y = (x + b) * s, upstream g: dx = g s, db = colsum(g) s, ds = sum(g * (x + b)) */
    qkv_tensor *y = qkv_mul(ctx, qkv_add(ctx, x, b), s);
    expect_values(ctx, y, (double[]){22, 44, 66, 28, 50, 72}, 6, 0);
    qkv_tensor *g = qkv_from_data(ctx, QKV_F64, 2, (int64_t[]){2, 3}, (double[]){1, 0, -1, 2, 1, 0});
    cr_assert_eq(qkv_backward(ctx, y, g), QKV_OK, "%s", qkv_errmsg(ctx));
    expect_values(ctx, x->grad, (double[]){2, 0, -2, 4, 2, 0}, 6, 0);
    expect_values(ctx, b->grad, (double[]){6, 2, -2}, 3, 0);
    expect_values(ctx, s->grad, (double[]){11 - 33 + 28 + 25, 0}, 1, 0);
    qkv_ctx_free(ctx);
}

Test(autograd, a_chain_of_100000_nodes_walks_without_recursion) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = qkv_scalar(ctx, QKV_F64, 0.5);
    qkv_tensor *b = qkv_scalar(ctx, QKV_F64, 1.0);
    qkv_set_requires_grad(ctx, a, true);
    qkv_set_requires_grad(ctx, b, true);
    qkv_tensor *y = a;
    for (int i = 0; i < 100000; i++) y = qkv_add(ctx, y, b);
    /* y = a + 100000 b: dy/da = 1, dy/db = 100000 */
    cr_assert_eq(qkv_backward(ctx, y, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    expect_values(ctx, y, (double[]){100000.5}, 1, 0);
    expect_values(ctx, a->grad, (double[]){1}, 1, 0);
    expect_values(ctx, b->grad, (double[]){100000}, 1, 0);
    qkv_ctx_free(ctx);
}

Test(autograd, non_scalar_backward_needs_an_upstream_gradient) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = vec(ctx, QKV_F64, 2, (double[]){1, 2});
    qkv_set_requires_grad(ctx, a, true);
    qkv_tensor *y = qkv_mul(ctx, a, qkv_scalar(ctx, QKV_F64, 3));
    cr_expect_eq(qkv_backward(ctx, y, NULL), QKV_ERR_SHAPE);
    cr_expect(strstr(qkv_errmsg(ctx), "dloss") != NULL, "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_expect_eq(qkv_backward(ctx, y, vec(ctx, QKV_F64, 3, (double[]){1, 1, 1})), QKV_ERR_SHAPE);
    qkv_clear_error(ctx);
    cr_assert_eq(qkv_backward(ctx, y, vec(ctx, QKV_F64, 2, (double[]){1, -1})), QKV_OK);
    expect_values(ctx, a->grad, (double[]){3, -3}, 2, 0);
    qkv_ctx_free(ctx);
}

/* qkv_backward writes the loss's gradient from dloss (a fresh step tensor's gradient: stored, not zeroed then
 * added): every dtype pair, element for element, with values that f32 holds exactly and one it rounds; and
 * 1 for a one-element loss without dloss. The loss is 2 x, so x's gradient is 2 dloss exactly. */
Test(autograd, the_loss_gradient_is_dloss_for_every_dtype_pair) {
    const double want[5] = {1.5, -2.25, 0, 1e-3, 7};
    for (int lt = QKV_F32; lt <= QKV_F64; lt++)
        for (int dt = QKV_F32; dt <= QKV_F64; dt++) {
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            qkv_tensor *x = vec(ctx, lt, 5, (double[]){1, 2, 3, 4, 5});
            qkv_set_requires_grad(ctx, x, true);
            qkv_tensor *loss = qkv_scale(ctx, x, 2.0);
            qkv_tensor *dloss = vec(ctx, dt, 5, want);
            cr_assert_eq(qkv_backward(ctx, loss, dloss), QKV_OK, "%s", qkv_errmsg(ctx));
            double rounded[5], twice[5];
            for (int i = 0; i < 5; i++) {
                rounded[i] = lt == QKV_F32 || dt == QKV_F32 ? (double)(float)want[i] : want[i];
                twice[i] = 2 * rounded[i];
            }
            expect_values(ctx, loss->grad, rounded, 5, 0);
            expect_values(ctx, x->grad, twice, 5, 0);
            qkv_ctx_free(ctx);
        }
    for (int lt = QKV_F32; lt <= QKV_F64; lt++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *x = vec(ctx, lt, 1, (double[]){3});
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *loss = qkv_scale(ctx, x, 2.0);
        cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        expect_values(ctx, loss->grad, (double[]){1}, 1, 0);
        expect_values(ctx, x->grad, (double[]){2}, 1, 0);
        qkv_ctx_free(ctx);
    }
}

Test(autograd, no_grad_mode_records_nothing) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = vec(ctx, QKV_F64, 2, (double[]){1, 2});
    qkv_set_requires_grad(ctx, a, true);
    cr_expect(qkv_set_grad_enabled(ctx, false));
    qkv_tensor *y = qkv_sum(ctx, qkv_mul(ctx, a, a));
    cr_expect(!y->requires_grad);
    cr_expect_eq(qkv_f64(y)[0], 5.0);
    cr_expect_eq(qkv_backward(ctx, y, NULL), QKV_ERR_STATE);
    cr_expect(strstr(qkv_errmsg(ctx), "does not require grad") != NULL, "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_expect(!qkv_set_grad_enabled(ctx, true));
    qkv_tensor *z = qkv_sum(ctx, qkv_mul(ctx, a, a));
    cr_expect(z->requires_grad);
    cr_expect_eq(qkv_backward(ctx, z, NULL), QKV_OK);
    expect_values(ctx, a->grad, (double[]){2, 4}, 2, 0);
    qkv_ctx_free(ctx);
}

Test(autograd, second_backward_on_one_tape_is_an_error_and_params_accumulate_across_steps) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *w = qkv_param(ctx, vec(ctx, QKV_F64, 2, (double[]){1, 2}));
    qkv_tensor *x = vec(ctx, QKV_F64, 2, (double[]){3, 4});
    qkv_tensor *loss = qkv_sum(ctx, qkv_mul(ctx, w, x));
    cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK);
    cr_expect_eq(qkv_backward(ctx, loss, NULL), QKV_ERR_STATE);
    cr_expect(strstr(qkv_errmsg(ctx), "already walked") != NULL, "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    expect_values(ctx, w->grad, (double[]){3, 4}, 2, 0); /* the refused backward added nothing */
    qkv_step_end(ctx);
    x = vec(ctx, QKV_F64, 2, (double[]){-1, 1});
    cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, w, x)), NULL), QKV_OK);
    expect_values(ctx, w->grad, (double[]){2, 5}, 2, 0); /* 3 - 1, 4 + 1 */
    qkv_zero_grads(ctx);
    expect_values(ctx, w->grad, (double[]){0, 0}, 2, 0);
    qkv_ctx_free(ctx);
}

Test(autograd, only_nodes_the_loss_depends_on_are_walked) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = vec(ctx, QKV_F64, 2, (double[]){1, 2});
    qkv_tensor *b = vec(ctx, QKV_F64, 2, (double[]){5, 6});
    qkv_set_requires_grad(ctx, a, true);
    qkv_set_requires_grad(ctx, b, true);
    qkv_tensor *loss = qkv_sum(ctx, a);
    qkv_tensor *later = qkv_sum(ctx, qkv_mul(ctx, a, b)); /* recorded after the loss */
    cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK);
    expect_values(ctx, a->grad, (double[]){1, 1}, 2, 0);
    cr_expect_null(b->grad, "b is not on the loss's path");
    cr_expect_null(later->grad);
    qkv_ctx_free(ctx);
}

Test(autograd, anomaly_mode_names_the_operator_and_the_element) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = vec(ctx, QKV_F64, 3, (double[]){1, INFINITY, 2});
    qkv_tensor *b = vec(ctx, QKV_F64, 3, (double[]){1, 1, 1});
    qkv_set_requires_grad(ctx, b, true);
    qkv_tensor *loss = qkv_sum(ctx, qkv_mul(ctx, a, b)); /* dL/db = a holds an inf at index 1 */
    qkv_set_anomaly_mode(ctx, true);
    cr_expect_eq(qkv_backward(ctx, loss, NULL), QKV_ERR_NUMERIC);
    const char *m = qkv_errmsg(ctx);
    cr_expect(strstr(m, "qkv_mul") && strstr(m, "[3]") && strstr(m, "index 1"), "%s", m);
    qkv_ctx_free(ctx);
}

Test(autograd, zero_grad_and_requires_grad_rules) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = vec(ctx, QKV_F64, 2, (double[]){1, 2});
    qkv_set_requires_grad(ctx, a, true);
    qkv_tensor *y = qkv_mul(ctx, a, a);
    cr_expect_eq(qkv_set_requires_grad(ctx, y, false), QKV_ERR_STATE, "only leaves change");
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_mul") != NULL, "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, y), NULL), QKV_OK);
    expect_values(ctx, a->grad, (double[]){2, 4}, 2, 0);
    cr_expect_eq(qkv_zero_grad(ctx, a), QKV_OK);
    expect_values(ctx, a->grad, (double[]){0, 0}, 2, 0);
    qkv_tensor *i = qkv_zeros(ctx, QKV_I32, 1, (int64_t[]){2});
    cr_expect_eq(qkv_set_requires_grad(ctx, i, true), QKV_ERR_DTYPE);
    qkv_ctx_free(ctx);
}
