/*
 * test_heads.c — qkv_split_heads / qkv_merge_heads: the index mapping checked by value, split then merge
 * (and merge then split) is the identity, 2-D inputs are a batch of one, the backward by value,
 * gradcheck over 22 configurations, and the error table.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "qkv.h"
#include "test_ops.h"

/* x[b, i, c] = 1000 b + 100 i + c: every element names its own position. */
static qkv_tensor *labelled(qkv_ctx *ctx, qkv_dtype dt, int64_t B, int64_t n, int64_t c) {
    qkv_tensor *x = qkv_zeros(ctx, dt, 3, (int64_t[]){B, n, c});
    cr_assert_not_null(x);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t k = 0; k < c; k++)
                qkv_set_flat(ctx, x, (b * n + i) * c + k, 1000.0 * b + 100.0 * i + k);
    return x;
}

Test(heads, split_index_mapping_by_value) {
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        const int64_t B = 2, n = 3, h = 2, dh = 4;
        qkv_tensor *x = labelled(ctx, dt, B, n, h * dh);
        qkv_tensor *y = qkv_split_heads(ctx, x, (int)h);
        cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
        cr_expect(y->dtype == dt && y->ndim == 3 && y->shape[0] == B * h && y->shape[1] == n &&
                      y->shape[2] == dh,
                  "split of [2,3,8] into 2 heads gives %s", qkv_shape_str(y, (char[32]){0}, 32));
        /* y[b*h + j, i, k] = x[b, i, j*d + k] */
        int bad = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < h; j++)
                for (int64_t i = 0; i < n; i++)
                    for (int64_t k = 0; k < dh; k++)
                        bad += at(y, ((b * h + j) * n + i) * dh + k) !=
                               1000.0 * b + 100.0 * i + (double)(j * dh + k);
        cr_expect_eq(bad, 0, "%s: %d elements in the wrong place", qkv_dtype_name(dt), bad);
        /* spot checks written out: head 1 of batch 1 is y batch 3; y[3, 1, 2] = x[1, 1, 6] */
        cr_expect_eq(qkv_get(ctx, y, (int64_t[]){3, 1, 2}), 1106.0);
        cr_expect_eq(qkv_get(ctx, y, (int64_t[]){1, 2, 0}), 204.0);  /* batch 0 head 1: x[0, 2, 4] */
        cr_expect_eq(qkv_get(ctx, y, (int64_t[]){2, 0, 3}), 1003.0); /* batch 1 head 0: x[1, 0, 3] */

        /* merge: z[b, i, j*d + k] = y[b*h + j, i, k]; merge of the split is x */
        qkv_tensor *z = qkv_merge_heads(ctx, y, (int)h);
        cr_assert_not_null(z, "%s", qkv_errmsg(ctx));
        cr_expect(z->ndim == 3 && z->shape[0] == B && z->shape[1] == n && z->shape[2] == h * dh);
        cr_expect(memcmp(z->data, x->data, (size_t)x->numel * (d ? 8 : 4)) == 0, "merge(split(x)) != x");
        qkv_ctx_free(ctx);
    }
}

Test(heads, merge_index_mapping_by_value) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    /* y [B*h = 6, n = 2, d = 2] with h = 3: y[b*3 + j, i, k] lands at z[b, i, j*2 + k] */
    qkv_tensor *y = labelled(ctx, QKV_F64, 6, 2, 2);
    qkv_tensor *z = qkv_merge_heads(ctx, y, 3);
    cr_assert_not_null(z, "%s", qkv_errmsg(ctx));
    cr_expect(z->shape[0] == 2 && z->shape[1] == 2 && z->shape[2] == 6);
    int bad = 0;
    for (int64_t b = 0; b < 2; b++)
        for (int64_t i = 0; i < 2; i++)
            for (int64_t j = 0; j < 3; j++)
                for (int64_t k = 0; k < 2; k++)
                    bad += qkv_f64(z)[(b * 2 + i) * 6 + j * 2 + k] !=
                           1000.0 * (double)(b * 3 + j) + 100.0 * i + k;
    cr_expect_eq(bad, 0, "%d elements in the wrong place", bad);
    cr_expect_eq(qkv_get(ctx, z, (int64_t[]){1, 0, 5}), 5001.0); /* y[5, 0, 1] */
    qkv_ctx_free(ctx);
}

Test(heads, split_then_merge_and_merge_then_split_are_identities) {
    const int64_t shapes[][4] = {/* B, n, h, d */
                                 {1, 1, 1, 1}, {1, 4, 1, 8}, {2, 3, 4, 1},
                                 {3, 5, 2, 3}, {4, 1, 8, 2}, {2, 7, 3, 5}};
    int bad = 0;
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        for (int d = 0; d < 2; d++) {
            qkv_dtype dt = d ? QKV_F64 : QKV_F32;
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            int64_t B = shapes[c][0], n = shapes[c][1], h = shapes[c][2], dh = shapes[c][3];
            qkv_tensor *x = qkv_randn(ctx, dt, 3, (int64_t[]){B, n, h * dh}, 0, 1);
            qkv_tensor *back = qkv_merge_heads(ctx, qkv_split_heads(ctx, x, (int)h), (int)h);
            qkv_tensor *y = qkv_randn(ctx, dt, 3, (int64_t[]){B * h, n, dh}, 0, 1);
            qkv_tensor *yback = qkv_split_heads(ctx, qkv_merge_heads(ctx, y, (int)h), (int)h);
            cr_assert(back && yback, "%s", qkv_errmsg(ctx));
            size_t bytes = (size_t)x->numel * (d ? 8 : 4);
            bad += back->shape[0] != B || back->shape[2] != h * dh || memcmp(back->data, x->data, bytes) != 0;
            bad +=
                yback->shape[0] != B * h || yback->shape[2] != dh || memcmp(yback->data, y->data, bytes) != 0;
            if (h > 1 && dh > 1 && n > 1) { /* a real permutation (n = 1 is the identity layout) */
                qkv_tensor *s = qkv_split_heads(ctx, x, (int)h);
                bad += memcmp(s->data, x->data, bytes) == 0;
            }
            qkv_ctx_free(ctx);
        }
    }
    cr_expect_eq(bad, 0, "%d round trips failed", bad);
}

Test(heads, two_d_input_is_a_batch_of_one) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_randn(ctx, QKV_F64, 2, (int64_t[]){3, 6}, 0, 1); /* [n, h*d], h = 2 */
    qkv_tensor *y = qkv_split_heads(ctx, x, 2);
    cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
    cr_expect(y->ndim == 3 && y->shape[0] == 2 && y->shape[1] == 3 && y->shape[2] == 3);
    cr_expect_eq(qkv_get(ctx, y, (int64_t[]){1, 2, 0}), qkv_get(ctx, x, (int64_t[]){2, 3}));
    qkv_tensor *z = qkv_merge_heads(ctx, y, 2);
    cr_assert_not_null(z);
    cr_expect(z->ndim == 3 && z->shape[0] == 1 && z->shape[1] == 3 && z->shape[2] == 6);
    cr_expect(memcmp(z->data, x->data, 18 * 8) == 0);
    /* merge of a 2-D [n, d] is a batch of one: heads must be 1 */
    qkv_tensor *m1 = qkv_merge_heads(ctx, x, 1);
    cr_expect(m1 && m1->ndim == 3 && m1->shape[0] == 1 && memcmp(m1->data, x->data, 18 * 8) == 0);
    cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

Test(heads, backward_by_value) {
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        /* split: dx = merge(dy) */
        qkv_tensor *x = qkv_randn(ctx, dt, 3, (int64_t[]){2, 3, 6}, 0, 1);
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *y = qkv_split_heads(ctx, x, 3);
        cr_assert_not_null(y);
        qkv_tensor *dy = labelled(ctx, dt, 6, 3, 2);
        cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
        int bad = 0;
        for (int64_t b = 0; b < 2; b++)
            for (int64_t i = 0; i < 3; i++)
                for (int64_t c = 0; c < 6; c++)
                    bad += at(x->grad, (b * 3 + i) * 6 + c) !=
                           1000.0 * (double)(b * 3 + c / 2) + 100.0 * i + c % 2;
        cr_expect_eq(bad, 0, "%s split backward: %d wrong", qkv_dtype_name(dt), bad);
        qkv_step_end(ctx);
        /* merge: dx = split(dy), accumulated (+=) onto a gradient that already holds 1 */
        qkv_tensor *w = qkv_randn(ctx, dt, 3, (int64_t[]){4, 2, 3}, 0, 1);
        qkv_set_requires_grad(ctx, w, true);
        qkv_tensor *z = qkv_merge_heads(ctx, w, 2);
        qkv_tensor *z2 = qkv_merge_heads(ctx, w, 2); /* w used twice: gradients add */
        qkv_tensor *l = qkv_add(ctx, z, z2);
        cr_assert_not_null(l, "%s", qkv_errmsg(ctx));
        qkv_tensor *dz = labelled(ctx, dt, 2, 2, 6);
        cr_assert_eq(qkv_backward(ctx, l, dz), QKV_OK, "%s", qkv_errmsg(ctx));
        bad = 0;
        for (int64_t b = 0; b < 2; b++)
            for (int64_t j = 0; j < 2; j++)
                for (int64_t i = 0; i < 2; i++)
                    for (int64_t k = 0; k < 3; k++)
                        bad += at(w->grad, ((b * 2 + j) * 2 + i) * 3 + k) !=
                               2.0 * (1000.0 * b + 100.0 * i + (double)(j * 3 + k));
        cr_expect_eq(bad, 0, "%s merge backward: %d wrong", qkv_dtype_name(dt), bad);
        qkv_ctx_free(ctx);
    }
}

/* ---- gradcheck ----------------------------------------------------------------------------------- */

enum { OP_SPLIT, OP_MERGE, OP_SPLIT_MERGE, OP_MERGE_SPLIT, OP_SPLIT_SOFTMAX };

typedef struct heads_config {
    int op;
    int ndim; /* 2 or 3 */
    int64_t B, n, h, d;
} heads_config;

static qkv_tensor *heads_fn(qkv_ctx *ctx, qkv_tensor *const *in, int n_in, void *user) {
    (void)n_in;
    const heads_config *c = user;
    int h = (int)c->h;
    switch (c->op) {
    case OP_SPLIT: return qkv_split_heads(ctx, in[0], h);
    case OP_MERGE: return qkv_merge_heads(ctx, in[0], h);
    case OP_SPLIT_MERGE: /* square it so the composition is not linear: a wrong index shows */
        return qkv_merge_heads(
            ctx, qkv_mul(ctx, qkv_split_heads(ctx, in[0], h), qkv_split_heads(ctx, in[0], h)), h);
    case OP_MERGE_SPLIT: return qkv_split_heads(ctx, qkv_merge_heads(ctx, in[0], h), h);
    default: return qkv_softmax(ctx, qkv_split_heads(ctx, in[0], h), NULL, 0);
    }
}

static const heads_config HEADS_CONFIGS[] = {
    {OP_SPLIT, 3, 1, 1, 1, 1},         {OP_SPLIT, 3, 2, 3, 2, 2},         {OP_SPLIT, 3, 3, 1, 4, 2},
    {OP_SPLIT, 3, 2, 4, 1, 3},         {OP_SPLIT, 3, 1, 5, 6, 1},         {OP_SPLIT, 2, 1, 3, 3, 2},
    {OP_SPLIT, 2, 1, 1, 2, 4},         {OP_MERGE, 3, 1, 1, 1, 1},         {OP_MERGE, 3, 2, 3, 2, 2},
    {OP_MERGE, 3, 3, 2, 3, 2},         {OP_MERGE, 3, 1, 4, 4, 1},         {OP_MERGE, 3, 4, 1, 2, 3},
    {OP_MERGE, 2, 1, 3, 1, 4},         {OP_SPLIT_MERGE, 3, 2, 3, 2, 3},   {OP_SPLIT_MERGE, 2, 1, 4, 4, 1},
    {OP_SPLIT_MERGE, 3, 3, 2, 3, 2},   {OP_MERGE_SPLIT, 3, 2, 2, 2, 3},   {OP_MERGE_SPLIT, 3, 1, 3, 4, 2},
    {OP_SPLIT_SOFTMAX, 3, 2, 3, 2, 4}, {OP_SPLIT_SOFTMAX, 3, 1, 2, 3, 3}, {OP_SPLIT_SOFTMAX, 2, 1, 4, 2, 5},
    {OP_SPLIT_SOFTMAX, 3, 3, 1, 2, 2},
};

/* Configuration c's input: [B*h, n, d] for what merges first, [B, n, h*d] otherwise; 2-D drops B. fn gets
 * the configuration. */
static int heads_build(qkv_ctx *ctx, int c, void *user, qkv_tensor **in, void **fn_user) {
    (void)user;
    const heads_config *cfg = &HEADS_CONFIGS[c];
    bool merge_first = cfg->op == OP_MERGE || cfg->op == OP_MERGE_SPLIT;
    int64_t shape[3];
    if (merge_first) { /* [B*h, n, d] */
        shape[0] = cfg->B * cfg->h, shape[1] = cfg->n, shape[2] = cfg->d;
    } else { /* [B, n, h*d] */
        shape[0] = cfg->B, shape[1] = cfg->n, shape[2] = cfg->h * cfg->d;
    }
    in[0] = cfg->ndim == 3 ? qkv_randn(ctx, QKV_F64, 3, shape, 0, 1) : qkv_randn(ctx, QKV_F64, 2, shape + 1, 0, 1);
    *fn_user = (void *)cfg;
    return 1;
}

static void heads_name(char *buf, size_t size, int c, const void *user) {
    (void)user;
    static const char *const ops[] = {"split", "merge", "split-merge", "merge-split", "split-softmax"};
    const heads_config *cfg = &HEADS_CONFIGS[c];
    snprintf(buf, size, "heads config %d (%s, %d-D, B %lld, n %lld, h %lld, d %lld)", c,
             cfg->op >= 0 && cfg->op < 5 ? ops[cfg->op] : "?", cfg->ndim, (long long)cfg->B, (long long)cfg->n,
             (long long)cfg->h, (long long)cfg->d);
}

Test(heads, gradcheck_over_22_configurations) {
    int n_configs = (int)(sizeof HEADS_CONFIGS / sizeof HEADS_CONFIGS[0]);
    cr_assert(n_configs >= 20);
    gradcheck_table t = {n_configs, 500, heads_build, heads_name, heads_fn, NULL, NULL};
    check_gradcheck_table(&t, 200);
}

/* ---- errors -------------------------------------------------------------------------------------- */

Test(heads, errors) {
    struct {
        const char *name;
        bool split;
        int kind; /* 0 f64 with shape, 1 i32, 2 NULL */
        int ndim;
        int64_t shape[4];
        int heads;
        qkv_status status;
        const char *frag[4];
    } cases[] = {
        {"split heads 0", true, 0, 3, {2, 3, 6}, 0,
         QKV_ERR_ARG, {"qkv_split_heads", "[2,3,6]", "heads is 0", NULL}},
        {"split heads -2", true, 0, 3, {2, 3, 6}, -2,
         QKV_ERR_ARG, {"qkv_split_heads", "-2", NULL}},
        {"merge heads 0", false, 0, 3, {2, 3, 6}, 0,
         QKV_ERR_ARG, {"qkv_merge_heads", "[2,3,6]", "heads is 0", NULL}},
        {"split last dim", true, 0, 3, {2, 3, 6}, 4,
         QKV_ERR_SHAPE, {"qkv_split_heads", "[2,3,6]", "6", "heads = 4"}},
        {"split 2-D last dim", true, 0, 2, {3, 5}, 2,
         QKV_ERR_SHAPE, {"qkv_split_heads", "[3,5]", "5", NULL}},
        {"merge batch", false, 0, 3, {3, 2, 4}, 2,
         QKV_ERR_SHAPE, {"qkv_merge_heads", "[3,2,4]", "batch dimension 3", "heads = 2"}},
        {"merge 2-D heads 2", false, 0, 2, {3, 4}, 2,
         QKV_ERR_SHAPE, {"qkv_merge_heads", "[3,4]", NULL}},
        {"split 1-D", true, 0, 1, {6}, 2,
         QKV_ERR_RANK, {"qkv_split_heads", "[6]", NULL}},
        {"merge 4-D", false, 0, 4, {1, 2, 3, 4}, 1,
         QKV_ERR_RANK, {"qkv_merge_heads", "[1,2,3,4]", NULL}},
        {"split i32", true, 1, 3, {2, 3, 6}, 2,
         QKV_ERR_DTYPE, {"qkv_split_heads", "i32", NULL}},
        {"merge NULL", false, 2, 0, {0}, 2,
         QKV_ERR_NULL, {"qkv_merge_heads", "x", NULL}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *x = cases[c].kind == 2 ? NULL
                                           : qkv_zeros(ctx, cases[c].kind ? QKV_I32 : QKV_F64, cases[c].ndim,
                                                       cases[c].shape);
        cr_assert_eq(qkv_error(ctx), QKV_OK);
        qkv_tensor *y = cases[c].split ? qkv_split_heads(ctx, x, cases[c].heads)
                                       : qkv_merge_heads(ctx, x, cases[c].heads);
        expect_misuse(ctx, cases[c].name, y, cases[c].status, cases[c].frag);
        qkv_ctx_free(ctx);
    }
    cr_expect_null(qkv_split_heads(NULL, NULL, 1));
    cr_expect_null(qkv_merge_heads(NULL, NULL, 1));
}
