/*
 * test_fresh_grad.c — backwards that store a new gradient instead of zero-filling it and adding
 * (qkv_grad_to_write_: projection's dX, split/merge heads, f32 add/sub, f32 where without broadcasting, f32
 * scale, f32 log_softmax, matmul's dA and dB, the f32 softmax, f32 div / maximum / minimum without
 * broadcasting, the f32 unary operators, the f32 softmax_dim and logsumexp_dim along the last axis): the step
 * arena is reused, so a gradient that was not fully stored would show the previous step's values. Each step first fills the arena with a value of its own (7, 8, ...),
 * then runs the same graph; every gradient must have the first step's bits, and follow the f64 run.
 */
#include <string.h>

#include "test_ops.h"

enum { B = 2, N = 5, D = 8 };

/* Fill the step arena with value, then end the step: the graph's tensors that follow reuse that memory. */
static void fill_arena(qkv_ctx *ctx, qkv_dtype dtype, double value) {
    qkv_tensor *dirt = qkv_full(ctx, dtype, 1, (int64_t[]){1 << 16}, value);
    cr_assert_not_null(dirt, "%s", qkv_errmsg(ctx));
    qkv_step_end(ctx);
}

/* loss = sum(t * t) + sum(t log_softmax(0.5 t)), t = where(mask, m + s, m) - 2 P2,
 * m = 0.75 merge(split((0.5 s) W)), s = 1.5 P: each of the new-gradient paths once (s's gradient is stored by
 * add's db, then added to by the scale's backward; m's is stored by where's b, then added to by add's a;
 * merge's output's is stored by scale's; 0.5 t's by log_softmax's). */
static void step(qkv_ctx *ctx, qkv_tensor *p, qkv_tensor *w, qkv_tensor *p2, double dirt_value) {
    fill_arena(ctx, p->dtype, dirt_value);
    qkv_tensor *s = qkv_scale(ctx, p, 1.5);
    qkv_tensor *q = qkv_projection(ctx, qkv_scale(ctx, s, 0.5), w, NULL);
    qkv_tensor *m = qkv_scale(ctx, qkv_merge_heads(ctx, qkv_split_heads(ctx, q, 2), 2), 0.75);
    qkv_tensor *r = qkv_add(ctx, m, s);
    qkv_tensor *mask = qkv_zeros(ctx, QKV_U8, 3, (int64_t[]){B, N, D});
    cr_assert_not_null(mask, "%s", qkv_errmsg(ctx));
    for (int64_t i = 0; i < mask->numel; i++) qkv_u8(mask)[i] = (uint8_t)(i % 3 != 1);
    qkv_tensor *t = qkv_sub(ctx, qkv_where(ctx, mask, r, m), qkv_scale(ctx, p2, 2.0));
    qkv_tensor *loss = qkv_add(ctx, qkv_sum(ctx, qkv_mul(ctx, t, t)), qkv_sum(ctx, qkv_mul(ctx, t, qkv_log_softmax(ctx, qkv_scale(ctx, t, 0.5), -1))));
    cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
}

typedef void step_fn(qkv_ctx *ctx, qkv_tensor *p, qkv_tensor *w, qkv_tensor *p2, double dirt_value);

/* Four steps of step in f32 and in f64, each over an arena dirtied with another value: every step's
 * gradients of P [B,N,D], W [D,D] and P2 [B,N,D] must have the first step's bits. grads[d][j] gets
 * parameter j's gradient in f32 (d 0) and f64 (d 1), which must agree within 1e-4 (relative). */
static void run_steps(step_fn *step_once, double grads[2][3][B * N * D]) {
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_seed(ctx, 11);
        qkv_tensor *p = qkv_param(ctx, qkv_to_dtype(ctx, qkv_randn(ctx, QKV_F64, 3, (int64_t[]){B, N, D}, 0, 1), dt));
        qkv_tensor *w = qkv_param(ctx, qkv_to_dtype(ctx, qkv_randn(ctx, QKV_F64, 2, (int64_t[]){D, D}, 0, 0.5), dt));
        qkv_tensor *p2 = qkv_param(ctx, qkv_to_dtype(ctx, qkv_randn(ctx, QKV_F64, 3, (int64_t[]){B, N, D}, 0, 1), dt));
        cr_assert_not_null(p2, "%s", qkv_errmsg(ctx));
        qkv_tensor *params[3] = {p, w, p2};
        for (int k = 0; k < 4; k++) {
            step_once(ctx, p, w, p2, 7.0 + k + 10.0 * d); /* a different fill each step and dtype */
            int bad = 0;
            for (int j = 0; j < 3; j++)
                for (int64_t i = 0; i < params[j]->numel; i++) {
                    if (k == 0) grads[d][j][i] = at(params[j]->grad, i);
                    else bad += memcmp(&grads[d][j][i], &(double){at(params[j]->grad, i)}, sizeof(double)) != 0;
                }
            cr_expect_eq(bad, 0, "%s step %d: %d gradient values differ from the first step's", qkv_dtype_name(dt),
                         k, bad);
            qkv_step_end(ctx);
            qkv_zero_grads(ctx);
        }
        cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
        qkv_ctx_free(ctx);
    }
    double worst = 0;
    for (int j = 0; j < 3; j++)
        for (int64_t i = 0; i < (j == 1 ? D * D : B * N * D); i++)
            worst = fmax(worst, fabs(grads[0][j][i] - grads[1][j][i]) / (1.0 + fabs(grads[1][j][i])));
    cr_expect(worst < 1e-4, "f32 gradients differ from f64 by %g (relative)", worst);
}

/* run_steps, for a step whose gradients reach P and P2 (their first elements are not 0 in f64) */
static void run_steps_reaching_p_and_p2(step_fn *step_once) {
    double grads[2][3][B * N * D];
    run_steps(step_once, grads);
    cr_expect(grads[1][0][0] != 0.0 && grads[1][2][0] != 0.0, "no gradient reached P (%g) or P2 (%g)", grads[1][0][0],
              grads[1][2][0]);
}

Test(fresh_grad, reused_arena_gives_the_same_gradients_and_f32_follows_f64) {
    double grads[2][3][B * N * D];
    run_steps(step, grads);
    /* d loss / d P2 = -4 t: the sign of sub's stored gradient shows */
    cr_expect(grads[1][2][0] != 0.0);
}

/* loss = sum(softmax(0.1 x x^T, mask, causal) x + softmax(0.2 x x^T, causal) x) + sum(t E), x = u w, u = 1.5 P, w = 0.5 W (2-D: broadcast
 * over the batch), t = 3 P2, E a [D, 0] constant: matmul's fresh gradients stored by every batch (u's), by
 * batch 0 then added to (w's, broadcast), stored by dA then added to by dB (x x^T's x), and an empty
 * product's (t's: dt = 0, written as zeros, since nothing else writes it); the f32 softmax's, stored with
 * its dropped entries (the mask's, the causal ones and a row with none kept) as 0. */
static void matmul_softmax_step(qkv_ctx *ctx, qkv_tensor *p, qkv_tensor *w, qkv_tensor *p2, double dirt_value) {
    fill_arena(ctx, p->dtype, dirt_value);
    qkv_tensor *u = qkv_scale(ctx, p, 1.5), *wh = qkv_scale(ctx, w, 0.5);
    qkv_tensor *x = qkv_matmul(ctx, u, wh, 0);
    qkv_tensor *mask = qkv_zeros(ctx, QKV_U8, 2, (int64_t[]){N, N});
    cr_assert_not_null(mask, "%s", qkv_errmsg(ctx));
    for (int64_t i = N; i < N * N; i++) qkv_u8(mask)[i] = (uint8_t)(i % 4 != 1); /* row 0: nothing kept */
    qkv_tensor *y = qkv_matmul(ctx, x, x, QKV_TRANS_B);
    qkv_tensor *a = qkv_softmax(ctx, qkv_scale(ctx, y, 0.1), mask, QKV_CAUSAL);
    qkv_tensor *a_causal = qkv_softmax(ctx, qkv_scale(ctx, y, 0.2), NULL, QKV_CAUSAL); /* the unmasked rows' path */
    qkv_tensor *e = qkv_zeros(ctx, p->dtype, 2, (int64_t[]){D, 0});
    qkv_tensor *te = qkv_matmul(ctx, qkv_scale(ctx, p2, 3.0), e, 0);
    qkv_tensor *z = qkv_add(ctx, qkv_matmul(ctx, a, x, 0), qkv_matmul(ctx, a_causal, x, 0));
    qkv_tensor *loss = qkv_add(ctx, qkv_sum(ctx, z), qkv_sum(ctx, te));
    cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
}

Test(fresh_grad, matmul_and_softmax_store_new_gradients) {
    double grads[2][3][B * N * D];
    run_steps(matmul_softmax_step, grads);
    for (int64_t i = 0; i < B * N * D; i++)
        cr_expect_eq(grads[1][2][i], 0.0, "P2's gradient %lld is %g, not 0", (long long)i, grads[1][2][i]);
    cr_expect(grads[1][0][0] != 0.0 && grads[1][1][0] != 0.0);
}

/* loss = sum(d d) + sum(m m) + sum(u W), d = u / v, m = maximum(0.5 P, 0.7 P2), u = 1.5 P, v = |P2| + 0.5: the
 * f32 div's and maximum's same-shape backward stores both operands' new gradients (u's and v's by div; the
 * two scales' by maximum), which the scales, abs and add_scalar then carry to P and P2. */
static void binary_step(qkv_ctx *ctx, qkv_tensor *p, qkv_tensor *w, qkv_tensor *p2, double dirt_value) {
    fill_arena(ctx, p->dtype, dirt_value);
    qkv_tensor *u = qkv_scale(ctx, p, 1.5), *v = qkv_add_scalar(ctx, qkv_abs(ctx, p2), 0.5);
    qkv_tensor *d = qkv_div(ctx, u, v);
    qkv_tensor *m = qkv_maximum(ctx, qkv_scale(ctx, p, 0.5), qkv_scale(ctx, p2, 0.7));
    qkv_tensor *sq = qkv_add(ctx, qkv_sum(ctx, qkv_mul(ctx, d, d)), qkv_sum(ctx, qkv_mul(ctx, m, m)));
    qkv_tensor *loss = qkv_add(ctx, sq, qkv_sum(ctx, qkv_matmul(ctx, u, w, 0)));
    cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
}

Test(fresh_grad, div_and_maximum_store_new_gradients) {
    run_steps_reaching_p_and_p2(binary_step);
}

/* loss = sum(e^(0.3 u)) + sum(sigmoid(0.5 P2)) + sum(softplus(0.25 P2)) + sum((0.75 P)^2) + sum((2 P2)^0) + sum(u W),
 * u = 1.5 P: the f32 unary backward (a map's: exp, sigmoid; with the backward's own map: softplus, pow) stores
 * each scale's new gradient, and pow by 0 stores zeros. */
static void unary_step(qkv_ctx *ctx, qkv_tensor *p, qkv_tensor *w, qkv_tensor *p2, double dirt_value) {
    fill_arena(ctx, p->dtype, dirt_value);
    qkv_tensor *u = qkv_scale(ctx, p, 1.5);
    qkv_tensor *terms[6] = {
        qkv_sum(ctx, qkv_exp(ctx, qkv_scale(ctx, u, 0.3))),
        qkv_sum(ctx, qkv_sigmoid(ctx, qkv_scale(ctx, p2, 0.5))),
        qkv_sum(ctx, qkv_softplus(ctx, qkv_scale(ctx, p2, 0.25))),
        qkv_sum(ctx, qkv_pow_scalar(ctx, qkv_scale(ctx, p, 0.75), 2.0)),
        qkv_sum(ctx, qkv_pow_scalar(ctx, qkv_scale(ctx, p2, 2.0), 0.0)),
        qkv_sum(ctx, qkv_matmul(ctx, u, w, 0)),
    };
    qkv_tensor *loss = terms[0];
    for (int i = 1; i < 6; i++) loss = qkv_add(ctx, loss, terms[i]);
    cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
}

Test(fresh_grad, unary_operators_store_new_gradients) {
    run_steps_reaching_p_and_p2(unary_step);
}

/* loss = sum(softmax_dim(0.25 P) P2) + sum(logsumexp_dim(0.5 P2 + bias, -1, keep)) + sum(u W), u = 1.5 P, bias a
 * constant of 0 and -inf with row 0 of every batch all -inf (the loss is -inf; the gradients are finite): the f32
 * softmax_dim and logsumexp_dim backwards along the last axis store the new gradients of their inputs (the row of
 * -inf as zeros), which the scales and the add carry to P and P2. */
static void reduce_step(qkv_ctx *ctx, qkv_tensor *p, qkv_tensor *w, qkv_tensor *p2, double dirt_value) {
    fill_arena(ctx, p->dtype, dirt_value);
    qkv_tensor *bias = qkv_zeros(ctx, p->dtype, 3, (int64_t[]){B, N, D});
    cr_assert_not_null(bias, "%s", qkv_errmsg(ctx));
    for (int64_t i = 0; i < bias->numel; i++)
        if (i % (N * D) < D || i % 5 == 2) qkv_set_flat(ctx, bias, i, -INFINITY);
    qkv_tensor *lse = qkv_logsumexp_dim(ctx, qkv_add(ctx, qkv_scale(ctx, p2, 0.5), bias), -1, true);
    qkv_tensor *sm = qkv_mul(ctx, qkv_softmax_dim(ctx, qkv_scale(ctx, p, 0.25), -1), qkv_scale(ctx, p2, 1.0));
    qkv_tensor *u = qkv_scale(ctx, p, 1.5);
    qkv_tensor *loss = qkv_add(ctx, qkv_add(ctx, qkv_sum(ctx, sm), qkv_sum(ctx, lse)), qkv_sum(ctx, qkv_matmul(ctx, u, w, 0)));
    cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
}

Test(fresh_grad, softmax_dim_and_logsumexp_dim_store_new_gradients) {
    run_steps_reaching_p_and_p2(reduce_step);
}
