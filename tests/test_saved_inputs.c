/*
 * test_saved_inputs.c — a backward reads only what its forward saved: the non-differentiable inputs an
 * operator takes (cross-entropy's targets, softmax's and attention's masks) may be changed, filled with
 * wild values, or freed by the caller between forward and backward, and the gradient is bit for bit the
 * one of an untouched run, with nothing read or written outside the operator's own memory (the suite also
 * runs under ASan: ./build.sh asan). f32 and f64 for each.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <string.h>

#include "qkv.h"
#include "test_ops.h"

typedef enum { OP_CROSS_ENTROPY, OP_SOFTMAX, OP_ATTENTION } op_kind;
typedef enum { UNTOUCHED, CHANGED, WILD, FREED } tamper;

static const char *const op_names[] = {"qkv_cross_entropy", "qkv_softmax", "qkv_attention"};
static const char *const tamper_names[] = {"untouched", "changed", "wild", "freed"};

enum { N_Q = 4, N_K = 5, ROWS = 6, VOCAB = 7, MAX_GRAD = 128 };

/* Rows 0..3 of the mask [N_Q, N_K]: row 2 drops every key. */
static const uint8_t mask_values[N_Q * N_K] = {
    1, 0, 1, 1, 0, /**/ 1, 1, 1, 1, 1, /**/ 0, 0, 0, 0, 0, /**/ 0, 1, 0, 1, 1,
};
static const int32_t target_values[ROWS] = {1, 3, -1, 0, 6, 2};

/* Apply the tamper to the caller's non-differentiable input t (persistent), after the forward. */
static void apply(qkv_ctx *ctx, qkv_tensor *t, tamper how) {
    if (how == FREED) {
        qkv_free(ctx, t);
        return;
    }
    if (how == UNTOUCHED) return;
    if (t->dtype == QKV_I32) {
        int32_t *v = qkv_i32(t);
        for (int64_t i = 0; i < t->numel; i++)
            v[i] = how == WILD ? (i % 2 ? INT32_MAX : 1000000000) : (int32_t)((v[i] + 2) % VOCAB) - (i == 1);
    } else {
        uint8_t *v = qkv_u8(t);
        for (int64_t i = 0; i < t->numel; i++) v[i] = how == WILD ? (uint8_t)((i * 7 + 1) % 3 * 127) : (uint8_t)!v[i]; /* wild: 0, 127, 254 */
    }
}

/* The gradients of one forward + backward of op in dtype dt, tampered with as said, into grad (returns
 * how many values). */
static int64_t run(op_kind op, qkv_dtype dt, tamper how, double *grad) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    cr_assert_not_null(ctx);
    qkv_tensor *x[3] = {NULL, NULL, NULL}, *out = NULL, *dout = NULL, *side = NULL;
    int n_x = 0;
    if (op == OP_CROSS_ENTROPY) {
        x[n_x++] = qkv_randn(ctx, dt, 2, (int64_t[]){ROWS, VOCAB}, 0, 2);
        side = qkv_keep(ctx, qkv_from_data(ctx, QKV_I32, 1, (int64_t[]){ROWS}, target_values));
    } else {
        side = qkv_keep(ctx, qkv_from_data(ctx, QKV_U8, 2, (int64_t[]){N_Q, N_K}, mask_values));
        if (op == OP_SOFTMAX) {
            x[n_x++] = qkv_randn(ctx, dt, 3, (int64_t[]){2, N_Q, N_K}, 0, 2);
        } else {
            x[n_x++] = qkv_randn(ctx, dt, 3, (int64_t[]){2, N_Q, 3}, 0, 1);
            x[n_x++] = qkv_randn(ctx, dt, 3, (int64_t[]){2, N_K, 3}, 0, 1);
            x[n_x++] = qkv_randn(ctx, dt, 3, (int64_t[]){2, N_K, 2}, 0, 1);
        }
    }
    for (int i = 0; i < n_x; i++) cr_assert_eq(qkv_set_requires_grad(ctx, x[i], true), QKV_OK, "%s", qkv_errmsg(ctx));
    if (op == OP_CROSS_ENTROPY) out = qkv_cross_entropy(ctx, x[0], side);
    else if (op == OP_SOFTMAX) out = qkv_softmax(ctx, x[0], side, 0);
    else out = qkv_attention(ctx, x[0], x[1], x[2], side, QKV_SCALE_DEFAULT, 0, NULL); /* fused */
    cr_assert_not_null(out, "%s", qkv_errmsg(ctx));
    if (out->numel > 1) dout = qkv_randn(ctx, dt, out->ndim, out->shape, 0, 1);
    apply(ctx, side, how);
    cr_assert_eq(qkv_backward(ctx, out, dout), QKV_OK, "%s %s, targets/mask %s: %s", op_names[op],
                 qkv_dtype_name(dt), tamper_names[how], qkv_errmsg(ctx));
    int64_t n = 0;
    for (int i = 0; i < n_x; i++) {
        cr_assert_not_null(x[i]->grad);
        for (int64_t j = 0; j < x[i]->numel; j++) {
            cr_assert_lt(n, MAX_GRAD);
            grad[n++] = at(x[i]->grad, j);
        }
    }
    qkv_ctx_free(ctx);
    return n;
}

/* For each op and dtype, every tamper gives the untouched run's gradient, bit for bit. */
static void expect_tamper_changes_nothing(op_kind op, tamper how) {
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        double want[MAX_GRAD], got[MAX_GRAD];
        int64_t n = run(op, dt, UNTOUCHED, want);
        cr_assert_eq(run(op, dt, how, got), n);
        bool nonzero = false;
        for (int64_t i = 0; i < n; i++) nonzero = nonzero || want[i] != 0.0;
        cr_expect(nonzero, "%s %s: the untouched gradient is all zeros (the test would be blind)", op_names[op],
                  qkv_dtype_name(dt));
        int64_t first = -1;
        for (int64_t i = 0; i < n && first < 0; i++)
            if (memcmp(&want[i], &got[i], sizeof want[i]) != 0) first = i;
        cr_expect_eq(first, -1, "%s %s, %s after the forward: gradient element %lld is %.17g, untouched %.17g",
                     op_names[op], qkv_dtype_name(dt), tamper_names[how], (long long)first,
                     first >= 0 ? got[first] : 0.0, first >= 0 ? want[first] : 0.0);
    }
}

Test(saved_inputs, cross_entropy_targets_changed_after_the_forward) {
    expect_tamper_changes_nothing(OP_CROSS_ENTROPY, CHANGED);
}

Test(saved_inputs, cross_entropy_targets_of_1e9_after_the_forward) {
    expect_tamper_changes_nothing(OP_CROSS_ENTROPY, WILD);
}

Test(saved_inputs, cross_entropy_targets_freed_after_the_forward) {
    expect_tamper_changes_nothing(OP_CROSS_ENTROPY, FREED);
}

Test(saved_inputs, softmax_mask_flipped_after_the_forward) { expect_tamper_changes_nothing(OP_SOFTMAX, CHANGED); }

Test(saved_inputs, softmax_mask_scrambled_after_the_forward) { expect_tamper_changes_nothing(OP_SOFTMAX, WILD); }

Test(saved_inputs, softmax_mask_freed_after_the_forward) { expect_tamper_changes_nothing(OP_SOFTMAX, FREED); }

Test(saved_inputs, attention_mask_flipped_after_the_forward) {
    expect_tamper_changes_nothing(OP_ATTENTION, CHANGED);
}

Test(saved_inputs, attention_mask_scrambled_after_the_forward) {
    expect_tamper_changes_nothing(OP_ATTENTION, WILD);
}

Test(saved_inputs, attention_mask_freed_after_the_forward) { expect_tamper_changes_nothing(OP_ATTENTION, FREED); }

/* The composed attention (attn != NULL) goes through qkv_softmax's node: the same copy protects it. */
Test(saved_inputs, composed_attention_mask_flipped_after_the_forward) {
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        double g[2][MAX_GRAD];
        int64_t n = 0;
        for (int t = 0; t < 2; t++) {
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            qkv_tensor *q = qkv_randn(ctx, dt, 2, (int64_t[]){N_Q, 3}, 0, 1);
            qkv_tensor *k = qkv_randn(ctx, dt, 2, (int64_t[]){N_K, 3}, 0, 1);
            qkv_tensor *v = qkv_randn(ctx, dt, 2, (int64_t[]){N_K, 2}, 0, 1);
            qkv_tensor *mask = qkv_from_data(ctx, QKV_U8, 2, (int64_t[]){N_Q, N_K}, mask_values);
            qkv_set_requires_grad(ctx, q, true);
            qkv_set_requires_grad(ctx, k, true);
            qkv_tensor *attn = NULL;
            qkv_tensor *out = qkv_attention(ctx, q, k, v, mask, QKV_SCALE_DEFAULT, 0, &attn);
            qkv_tensor *dout = qkv_randn(ctx, dt, 2, (int64_t[]){N_Q, 2}, 0, 1);
            cr_assert_not_null(attn, "%s", qkv_errmsg(ctx));
            if (t) apply(ctx, mask, CHANGED);
            cr_assert_eq(qkv_backward(ctx, out, dout), QKV_OK, "%s", qkv_errmsg(ctx));
            n = 0;
            for (int64_t j = 0; j < q->numel; j++) g[t][n++] = at(q->grad, j);
            for (int64_t j = 0; j < k->numel; j++) g[t][n++] = at(k->grad, j);
            qkv_ctx_free(ctx);
        }
        cr_expect(memcmp(g[0], g[1], (size_t)n * sizeof(double)) == 0, "%s: dq, dk moved with the mask",
                  qkv_dtype_name(dt));
    }
}
