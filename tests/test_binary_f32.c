/*
 * test_binary_f32.c — the f32 paths of add, sub and mul (ops/binary.c) compute in float without f64
 * working copies; for +, - and * of two floats that is the correctly rounded result, so every forward and
 * gradient must have exactly the bits of the same sum or product done in double and rounded once, as the
 * f64 path did: b of a's shape, a trailing bias [d], a [n, d] bias and one element, with gradients that
 * already hold a value (they accumulate).
 */
#include <string.h>

#include "test_ops.h"

enum { ADD, SUB, MUL };
static const char *const OP_NAMES[] = {"add", "sub", "mul"};

static qkv_tensor *apply(qkv_ctx *ctx, int op, qkv_tensor *a, qkv_tensor *b) {
    return op == ADD ? qkv_add(ctx, a, b) : op == SUB ? qkv_sub(ctx, a, b) : qkv_mul(ctx, a, b);
}

static float rounded(int op, float x, float y) {
    double r = op == ADD ? (double)x + (double)y : op == SUB ? (double)x - (double)y : (double)x * (double)y;
    return (float)r;
}

Test(binary_f32, forward_and_gradients_have_the_bits_of_double_rounded_once) {
    /* a [3, 4, 5]; b shapes: a's, [5], [4, 5], [1] */
    const int nb_dims[] = {3, 1, 2, 1};
    const int64_t b_shapes[][3] = {{3, 4, 5}, {5}, {4, 5}, {1}};
    const int64_t shape_a[3] = {3, 4, 5}, n = 60;
    int bad = 0, cases = 0;
    for (int op = ADD; op <= MUL; op++)
        for (int s = 0; s < 4; s++) {
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            qkv_seed(ctx, (uint64_t)(7 * op + s));
            qkv_tensor *a = qkv_param(ctx, qkv_randn(ctx, QKV_F32, 3, shape_a, 0.3, 1.7));
            qkv_tensor *b = qkv_param(ctx, qkv_randn(ctx, QKV_F32, nb_dims[s], b_shapes[s], -0.2, 0.9));
            cr_assert_not_null(b, "%s", qkv_errmsg(ctx));
            int64_t nb = b->numel;
            /* two steps: the second one's gradients add onto the first's */
            float ga[60] = {0}, gb[60] = {0};
            for (int step = 0; step < 2; step++) {
                qkv_tensor *y = apply(ctx, op, a, b);
                qkv_tensor *dy = qkv_randn(ctx, QKV_F32, 3, shape_a, 0.1, 1.3);
                cr_assert_not_null(dy, "%s", qkv_errmsg(ctx));
                const float *av = qkv_f32(a), *bv = qkv_f32(b), *yv = qkv_f32(y), *dyv = qkv_f32(dy);
                for (int64_t i = 0; i < n; i++) bad += yv[i] != rounded(op, av[i], bv[i % nb]);
                cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
                /* expected gradients, each rounded once from double */
                double sums[60] = {0};
                for (int64_t i = 0; i < n; i++) {
                    double g = op == MUL ? (double)dyv[i] * (double)bv[i % nb] : (double)dyv[i];
                    ga[i] = (float)((double)ga[i] + g);
                    sums[i % nb] += op == MUL ? (double)dyv[i] * (double)av[i] : (double)dyv[i];
                }
                for (int64_t j = 0; j < nb; j++) gb[j] = (float)((double)gb[j] + (op == SUB ? -sums[j] : sums[j]));
                for (int64_t i = 0; i < n; i++) bad += qkv_f32(a->grad)[i] != ga[i];
                for (int64_t j = 0; j < nb; j++) bad += qkv_f32(b->grad)[j] != gb[j];
                if (bad && !cases) {
                    cr_log_error("%s, b of %lld elements, step %d: first mismatch", OP_NAMES[op], (long long)nb, step);
                    cases = 1;
                }
                qkv_step_end(ctx);
            }
            cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
            qkv_ctx_free(ctx);
        }
    cr_expect_eq(bad, 0, "%d values differ from the once-rounded double result", bad);
}

Test(binary_f32, f32_follows_f64_on_a_residual_stream) {
    /* x + out with both requiring grad, as every block of the model does, against the f64 run */
    double err[2] = {0, 0};
    for (int d = 0; d < 2; d++) {
        qkv_ctx *c32 = qkv_ctx_new(NULL), *c64 = qkv_ctx_new(NULL);
        qkv_seed(c32, 5);
        qkv_seed(c64, 5);
        const int64_t sh[3] = {2, 7, 9};
        qkv_tensor *x64 = qkv_param(c64, qkv_randn(c64, QKV_F64, 3, sh, 0, 1));
        qkv_tensor *o64 = qkv_param(c64, qkv_randn(c64, QKV_F64, 3, sh, 0, 1));
        /* a context uses only its own tensors: the values cross through qkv_from_data */
        qkv_tensor *x32 = qkv_param(c32, qkv_to_dtype(c32, qkv_from_data(c32, QKV_F64, 3, sh, x64->data), QKV_F32));
        qkv_tensor *o32 = qkv_param(c32, qkv_to_dtype(c32, qkv_from_data(c32, QKV_F64, 3, sh, o64->data), QKV_F32));
        qkv_tensor *y64 = d ? qkv_sub(c64, x64, o64) : qkv_add(c64, x64, o64);
        qkv_tensor *y32 = d ? qkv_sub(c32, x32, o32) : qkv_add(c32, x32, o32);
        qkv_tensor *l64 = qkv_sum(c64, qkv_mul(c64, y64, y64)), *l32 = qkv_sum(c32, qkv_mul(c32, y32, y32));
        cr_assert_eq(qkv_backward(c64, l64, NULL), QKV_OK, "%s", qkv_errmsg(c64));
        cr_assert_eq(qkv_backward(c32, l32, NULL), QKV_OK, "%s", qkv_errmsg(c32));
        err[d] = fmax(rel_norm_err(x32->grad, x64->grad), rel_norm_err(o32->grad, o64->grad));
        /* d(sum (x -+ o)^2)/do = -+2 (x -+ o): the sign shows in o's gradient */
        cr_expect(fabs(at(o64->grad, 3) - (d ? -2.0 : 2.0) * at(y64, 3)) < 1e-12);
        qkv_ctx_free(c32);
        qkv_ctx_free(c64);
    }
    cr_expect(err[0] < 1e-6 && err[1] < 1e-6, "f32 against f64 gradients: add %g, sub %g", err[0], err[1]);
}
