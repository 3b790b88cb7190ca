/*
 * test_limits.c — counts and sizes at their limits: thread counts past what OpenMP survives are capped at
 * QKV_MAX_THREADS, fans near INT64_MAX are refused without a signed overflow, an empty tensor obeys the size
 * bound of a full one whatever the order of its dimensions, empty operands with a huge batch or row count
 * cost nothing (each such case hung for 2^40 iterations before; the tests carry a short timeout), and
 * qkv_print reports a write that fails.
 */
#define _POSIX_C_SOURCE 200809L /* fmemopen */

#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "qkv.h"
#include "test_deadline.h"

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}
#define BIG ((int64_t)1 << 40)

static bool starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static qkv_ctx *ctx_threads(int threads) {
    qkv_options o = qkv_default_options();
    o.threads = threads;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    cr_assert_not_null(ctx);
    return ctx;
}

/* ---- 7: thread counts -------------------------------------------------------------------------- */

Test(threads, a_count_above_the_maximum_is_capped_and_one_below_one_is_one) {
    const struct {
        int asked, used;
    } cases[] = {{INT_MIN, 1}, {-5, 1}, {0, 1}, {1, 1}, {2, 2}, {QKV_MAX_THREADS, QKV_MAX_THREADS},
                 {QKV_MAX_THREADS + 1, QKV_MAX_THREADS}, {50000, QKV_MAX_THREADS},
                 {1000000, QKV_MAX_THREADS}, {INT_MAX, QKV_MAX_THREADS}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qkv_ctx *ctx = ctx_threads(cases[i].asked);
        cr_expect_eq(qkv_threads(ctx), cases[i].used, "threads %d: qkv_threads says %d, want %d", cases[i].asked,
                     qkv_threads(ctx), cases[i].used);
        qkv_ctx_free(ctx);
    }
    cr_expect_eq(QKV_MAX_THREADS, 256, "the documented cap (qkv.h) changed: update the README and examples");
}

/* A context asked for INT_MAX threads computes what one thread does, bit for bit (with the count as given,
 * the largest problems asked OpenMP for up to work / 2^20 threads, and libgomp exits the process above a few
 * tens of thousands). */
Test(threads, attention_with_int_max_threads_gives_the_bits_of_one_thread) {
    QKV_TEST_DEADLINE(60);
    qkv_ctx *one = ctx_threads(1), *many = ctx_threads(INT_MAX);
    qkv_tensor *out[2];
    qkv_tensor *dq[2];
    qkv_ctx *ctxs[2] = {one, many};
    for (int c = 0; c < 2; c++) {
        qkv_ctx *ctx = ctxs[c];
        qkv_seed(ctx, 7);
        qkv_tensor *q = qkv_randn(ctx, QKV_F32, SHAPE(8, 64, 32), 0, 1);
        qkv_tensor *k = qkv_randn(ctx, QKV_F32, SHAPE(8, 64, 32), 0, 1);
        qkv_tensor *v = qkv_randn(ctx, QKV_F32, SHAPE(8, 64, 32), 0, 1);
        qkv_set_requires_grad(ctx, q, true);
        out[c] = qkv_attention(ctx, q, k, v, NULL, QKV_SCALE_DEFAULT, QKV_CAUSAL, NULL);
        cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, out[c]), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        dq[c] = q->grad;
    }
    cr_expect_eq(memcmp(out[0]->data, out[1]->data, (size_t)out[0]->numel * sizeof(float)), 0);
    cr_expect_eq(memcmp(dq[0]->data, dq[1]->data, (size_t)dq[0]->numel * sizeof(float)), 0);
    qkv_ctx_free(one);
    qkv_ctx_free(many);
}

/* ---- 8: sizes ---------------------------------------------------------------------------------- */

/* fan_in + fan_out was summed in int64 (UBSan: signed integer overflow); the shape is refused as too large,
 * in the name of the initialiser the user called. */
Test(sizes, initialisers_with_fans_near_int64_max_are_refused_without_overflow) {
    const struct {
        bool xavier;
        int64_t fan_in, fan_out;
    } cases[] = {{true, INT64_MAX, 1}, {true, 1, INT64_MAX}, {true, INT64_MAX, INT64_MAX},
                 {false, INT64_MAX, 1}, {false, INT64_MAX, INT64_MAX}, {true, (int64_t)1 << 31, (int64_t)1 << 31}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        const char *fn = cases[i].xavier ? "qkv_xavier_uniform" : "qkv_he_normal";
        qkv_tensor *w = cases[i].xavier ? qkv_xavier_uniform(ctx, QKV_F32, cases[i].fan_in, cases[i].fan_out)
                                        : qkv_he_normal(ctx, QKV_F32, cases[i].fan_in, cases[i].fan_out);
        cr_expect_null(w, "%s(%lld, %lld) made a tensor", fn, (long long)cases[i].fan_in,
                       (long long)cases[i].fan_out);
        cr_expect_eq(qkv_error(ctx), QKV_ERR_OVERFLOW, "%s(%lld, %lld): %s", fn, (long long)cases[i].fan_in,
                     (long long)cases[i].fan_out, qkv_errmsg(ctx));
        cr_expect(starts_with(qkv_errmsg(ctx), fn), "%s: message \"%s\"", fn, qkv_errmsg(ctx));
        qkv_ctx_free(ctx);
    }
    /* and an ordinary one still has the Xavier bound: |w| < sqrt(6 / (3 + 5)) */
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *w = qkv_xavier_uniform(ctx, QKV_F64, 3, 5);
    cr_assert_not_null(w, "%s", qkv_errmsg(ctx));
    double bound = sqrt(6.0 / 8.0), most = 0;
    for (int64_t i = 0; i < w->numel; i++) most = fmax(most, fabs(qkv_f64(w)[i]));
    cr_expect(most < bound && most > 0.3 * bound, "largest |w| %g, bound %g", most, bound);
    qkv_ctx_free(ctx);
}

/* An empty tensor's nonzero dimensions obey the bound of a full one in any order: [2^62, 5, 0] was refused
 * while [0, 2^62, 5] was accepted (and then overflowed products of its dimensions in operators). */
Test(sizes, an_empty_shape_is_refused_or_accepted_whatever_the_order_of_its_dimensions) {
    const struct {
        int ndim;
        int64_t shape[4];
        bool ok;
    } cases[] = {
        {3, {0, (int64_t)1 << 62, 5}, false},    {3, {(int64_t)1 << 62, 5, 0}, false},
        {3, {(int64_t)1 << 62, 0, 5}, false},    {2, {(int64_t)1 << 62, 5}, false},
        {4, {BIG, 0, BIG, 2}, false},            {3, {0, INT64_MAX, 1}, false},
        {3, {0, (int64_t)1 << 59, 1}, true},     {3, {(int64_t)1 << 59, 1, 0}, true},
        {3, {BIG, 0, 4}, true},                  {4, {0, 0, 0, 0}, true},
        {2, {QKV_MAX_NUMEL, 0}, true},           {2, {0, QKV_MAX_NUMEL + 1}, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *t = qkv_zeros(ctx, QKV_F64, cases[i].ndim, cases[i].shape);
        if (cases[i].ok) {
            cr_expect_not_null(t, "case %zu: %s", i, qkv_errmsg(ctx));
            if (t) cr_expect_eq(t->numel, 0, "case %zu", i);
        } else {
            cr_expect_null(t, "case %zu: a tensor was made", i);
            cr_expect_eq(qkv_error(ctx), QKV_ERR_OVERFLOW, "case %zu: %s", i, qkv_errmsg(ctx));
            cr_expect(starts_with(qkv_errmsg(ctx), "qkv_zeros: "), "case %zu: %s", i, qkv_errmsg(ctx));
        }
        qkv_ctx_free(ctx);
    }
}

/* ---- 8: empty work costs nothing ---------------------------------------------------------------- */

/* A leaf requiring grad, zeros of the shape. */
static qkv_tensor *leaf(qkv_ctx *ctx, qkv_dtype dt, int ndim, const int64_t *shape) {
    qkv_tensor *t = qkv_zeros(ctx, dt, ndim, shape);
    cr_assert_not_null(t, "%s", qkv_errmsg(ctx));
    qkv_set_requires_grad(ctx, t, true);
    return t;
}

/* y made, then backward from sum(y); every gradient that exists has its leaf's shape. */
static void forward_backward(qkv_ctx *ctx, const char *what, qkv_tensor *y, const int64_t *want, int ndim) {
    cr_assert_not_null(y, "%s: %s", what, qkv_errmsg(ctx));
    cr_expect_eq(y->ndim, ndim, "%s", what);
    for (int i = 0; i < ndim; i++)
        cr_expect_eq(y->shape[i], want[i], "%s: dimension %d is %lld", what, i, (long long)y->shape[i]);
    cr_expect_eq(qkv_backward(ctx, qkv_sum(ctx, y), NULL), QKV_OK, "%s: %s", what, qkv_errmsg(ctx));
}

/* Before: each of these walked 2^40 (or more) batches or rows of nothing, minutes to hours; now each is
 * microseconds. The whole test runs in well under its 10-second timeout, sanitizers included. */
Test(empty, operators_on_an_empty_tensor_with_a_huge_batch_cost_nothing) {
    QKV_TEST_DEADLINE(10);
    clock_t start = clock();
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        // split/merge heads: [2^40, 0, 4] -> [2^41, 0, 2] -> [2^40, 0, 4]
        qkv_tensor *x = leaf(ctx, dt, SHAPE(BIG, 0, 4));
        qkv_tensor *s = qkv_split_heads(ctx, x, 2);
        forward_backward(ctx, "split_heads", s, (int64_t[]){2 * BIG, 0, 2}, 3);
        qkv_step_end(ctx);
        x = leaf(ctx, dt, SHAPE(2 * BIG, 0, 2));
        forward_backward(ctx, "merge_heads", qkv_merge_heads(ctx, x, 2), (int64_t[]){BIG, 0, 4}, 3);
        qkv_step_end(ctx);
        // matmul [2^40, 0, 3] x [3, 4] -> [2^40, 0, 4], and with B transposed
        qkv_tensor *a = leaf(ctx, dt, SHAPE(BIG, 0, 3)), *b = leaf(ctx, dt, SHAPE(3, 4));
        forward_backward(ctx, "matmul", qkv_matmul(ctx, a, b, 0), (int64_t[]){BIG, 0, 4}, 3);
        qkv_step_end(ctx);
        a = leaf(ctx, dt, SHAPE(BIG, 0, 3));
        b = leaf(ctx, dt, SHAPE(BIG, 5, 0));
        cr_assert_null(qkv_matmul(ctx, a, b, QKV_TRANS_B)); /* inner 3 and 0 */
        qkv_clear_error(ctx);
        b = leaf(ctx, dt, SHAPE(BIG, 0, 3));
        forward_backward(ctx, "matmul A B^T", qkv_matmul(ctx, a, b, QKV_TRANS_B), (int64_t[]){BIG, 0, 0}, 3);
        qkv_step_end(ctx);
        // projection [2^40, 0] x [0, 0] (+ [0]) -> [2^40, 0]
        x = leaf(ctx, dt, SHAPE(BIG, 0));
        qkv_tensor *w = leaf(ctx, dt, SHAPE(0, 0)), *bias = leaf(ctx, dt, SHAPE(0));
        forward_backward(ctx, "projection", qkv_projection(ctx, x, w, NULL), (int64_t[]){BIG, 0}, 2);
        qkv_step_end(ctx);
        x = leaf(ctx, dt, SHAPE(BIG, 0));
        w = leaf(ctx, dt, SHAPE(0, 0));
        bias = leaf(ctx, dt, SHAPE(0));
        forward_backward(ctx, "projection + b", qkv_projection(ctx, x, w, bias), (int64_t[]){BIG, 0}, 2);
        qkv_step_end(ctx);
        // attention with A (composed of matmul, scale, softmax, matmul) on [2^40, 0, 4]
        qkv_tensor *q = leaf(ctx, dt, SHAPE(BIG, 0, 4)), *k = leaf(ctx, dt, SHAPE(BIG, 0, 4));
        qkv_tensor *v = leaf(ctx, dt, SHAPE(BIG, 0, 4)), *attn = NULL;
        forward_backward(ctx, "attention with A",
                         qkv_attention(ctx, q, k, v, NULL, QKV_SCALE_DEFAULT, QKV_CAUSAL, &attn),
                         (int64_t[]){BIG, 0, 4}, 3);
        cr_expect(attn && attn->numel == 0);
        qkv_ctx_free(ctx);
    }
    double seconds = (double)(clock() - start) / CLOCKS_PER_SEC;
    cr_expect(seconds < 2.0, "%.3f s of CPU for empty work", seconds);
}

/* An empty sum is not empty work: X [3, 0] W [0, 2] is zeros [3, 2], and f64 gives them as f32 does. */
Test(empty, an_empty_inner_dimension_gives_zeros) {
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *y = qkv_full(ctx, dt, SHAPE(3, 2), 7.0); /* the arena then holds 7s where y goes next */
        qkv_step_end(ctx);
        qkv_tensor *x = leaf(ctx, dt, SHAPE(3, 0)), *w = leaf(ctx, dt, SHAPE(0, 2));
        qkv_tensor *b = qkv_full(ctx, dt, SHAPE(2), 0.5);
        y = qkv_projection(ctx, x, w, b);
        cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
        for (int64_t i = 0; i < 6; i++) cr_expect_eq(qkv_get_flat(ctx, y, i), 0.5, "element %lld", (long long)i);
        qkv_tensor *c = qkv_matmul(ctx, x, w, 0);
        cr_assert_not_null(c, "%s", qkv_errmsg(ctx));
        for (int64_t i = 0; i < 6; i++) cr_expect_eq(qkv_get_flat(ctx, c, i), 0.0, "element %lld", (long long)i);
        qkv_ctx_free(ctx);
    }
}

/* ---- 11: write errors ----------------------------------------------------------------------------- */

/* /dev/full accepts the open and fails every write with ENOSPC; a small tensor's text fits in the stream's
 * buffer, so before the flush the error showed only at fclose and qkv_print returned QKV_OK. */
Test(print, a_write_to_a_full_device_is_qkv_err_io_naming_qkv_print) {
    FILE *full = fopen("/dev/full", "w");
    if (!full) cr_skip_test("no /dev/full");
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *t = qkv_ones(ctx, QKV_F32, SHAPE(2, 3));
    cr_expect_eq(qkv_print(ctx, t, full), QKV_ERR_IO);
    cr_expect_eq(qkv_error(ctx), QKV_ERR_IO);
    cr_expect(starts_with(qkv_errmsg(ctx), "qkv_print: "), "%s", qkv_errmsg(ctx));
    cr_expect(strstr(qkv_errmsg(ctx), "[2,3]") && strstr(qkv_errmsg(ctx), "space"), "%s", qkv_errmsg(ctx));
    fclose(full);
    qkv_ctx_free(ctx);
}

Test(print, a_write_that_succeeds_is_qkv_ok_and_the_text_is_there) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    char buf[256] = {0};
    FILE *mem = fmemopen(buf, sizeof buf, "w");
    cr_assert_not_null(mem);
    qkv_tensor *t = qkv_full(ctx, QKV_F64, SHAPE(2), 1.5);
    cr_expect_eq(qkv_print(ctx, t, mem), QKV_OK, "%s", qkv_errmsg(ctx));
    fclose(mem);
    cr_expect_str_eq(buf, "tensor [2] f64\n[1.5, 1.5]\n");
    qkv_ctx_free(ctx);
}
