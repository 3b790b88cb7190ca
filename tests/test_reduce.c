/*
 * test_reduce.c — the operators of qkv/reduce.h (sum, mean, max, logsumexp along an axis with keepdim;
 * softmax and log_softmax along an axis): values and gradients against PyTorch 1.13 (tests/data/reduce/, from
 * tests/tools/make_reduce_golden.py), result shapes and negative axes, gradcheck in f64 over odd shapes on
 * every axis, f32 against f64, the edges the header promises, and misuse.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "qkv.h"
#include "test_ops.h"

typedef qkv_tensor *(*axis_op)(qkv_ctx *, qkv_tensor *, int, bool);
static qkv_tensor *softmax_op(qkv_ctx *c, qkv_tensor *x, int axis, bool keepdim) {
    (void)keepdim;
    return qkv_softmax_dim(c, x, axis);
}
static qkv_tensor *log_softmax_op(qkv_ctx *c, qkv_tensor *x, int axis, bool keepdim) {
    (void)keepdim;
    return qkv_log_softmax(c, x, axis);
}

static const struct {
    const char *name;
    axis_op op;
    bool reduces; /* false: the result has x's shape */
} ops[] = {
    {"sum", qkv_sum_dim, true},         {"mean", qkv_mean_dim, true},          {"max", qkv_max_dim, true},
    {"logsumexp", qkv_logsumexp_dim, true}, {"softmax", softmax_op, false}, {"log_softmax", log_softmax_op, false},
};
#define N_OPS ((int)(sizeof ops / sizeof ops[0]))

static qkv_tensor *load_data(qkv_ctx *ctx, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/reduce/%s.npy", QKV_TEST_DATA, name);
    qkv_tensor *t = qkv_npy_load(ctx, path);
    cr_assert_not_null(t, "%s: %s", path, qkv_errmsg(ctx));
    return t;
}

/* got equals want: both NaN, the same infinity, or within 1e-12 relative (1e-12 absolute near 0). */
static bool same(double got, double want) {
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    return fabs(got - want) <= 1e-12 * fmax(1.0, fabs(want));
}

/* Every operator along each axis of x [2, 3, 4] (quarter values: ties along every axis, a repeated maximum, a
 * column of 30s): y and dx for a random dy equal PyTorch 1.13's in f64; max's gradient goes where PyTorch's
 * does on every tie. */
Test(reduce, values_and_gradients_match_pytorch_on_every_axis) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int k = 0; k < N_OPS; k++)
        for (int axis = 0; axis < 3; axis++) {
            qkv_tensor *x0 = load_data(ctx, "x");
            qkv_tensor *x = qkv_from_data(ctx, QKV_F64, x0->ndim, x0->shape, x0->data);
            qkv_set_requires_grad(ctx, x, true);
            char key[64];
#define LOAD(part) (snprintf(key, sizeof key, "%s_%d_%s", ops[k].name, axis, part), load_data(ctx, key))
            qkv_tensor *want_y = LOAD("y"), *want_dx = LOAD("dx"), *dy = LOAD("dy");
#undef LOAD
            qkv_tensor *y = ops[k].op(ctx, x, axis, false);
            cr_assert_not_null(y, "%s axis %d: %s", ops[k].name, axis, qkv_errmsg(ctx));
            cr_assert_eq(y->ndim, want_y->ndim, "%s axis %d: ndim %d", ops[k].name, axis, y->ndim);
            for (int d = 0; d < y->ndim; d++) cr_expect_eq(y->shape[d], want_y->shape[d], "%s axis %d", ops[k].name, axis);
            cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
            for (int64_t i = 0; i < y->numel; i++)
                cr_expect(same(qkv_f64(y)[i], qkv_f64(want_y)[i]), "%s axis %d: y[%lld] = %.17g, PyTorch %.17g",
                          ops[k].name, axis, (long long)i, qkv_f64(y)[i], qkv_f64(want_y)[i]);
            for (int64_t i = 0; i < x->numel; i++)
                cr_expect(same(qkv_f64(x->grad)[i], qkv_f64(want_dx)[i]),
                          "%s axis %d: dx[%lld] = %.17g, PyTorch %.17g", ops[k].name, axis, (long long)i,
                          qkv_f64(x->grad)[i], qkv_f64(want_dx)[i]);
            qkv_step_end(ctx);
        }
    qkv_ctx_free(ctx);
}

/* The result drops the axis, or keeps it as 1 with keepdim; axis -k is axis ndim - k, bit for bit; softmax and
 * log_softmax keep x's shape; and keepdim's result broadcasts back: x / sum_dim(x, -1, keepdim) has rows
 * summing to 1. */
Test(reduce, shapes_keepdim_and_negative_axes) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    int64_t shape[4] = {2, 3, 4, 5};
    qkv_tensor *x = qkv_zeros(ctx, QKV_F64, 4, shape);
    for (int64_t i = 0; i < x->numel; i++) qkv_f64(x)[i] = sin(0.37 * (double)i);
    for (int k = 0; k < N_OPS; k++)
        for (int axis = 0; axis < 4; axis++)
            for (int keep = 0; keep < 2; keep++) {
                qkv_tensor *y = ops[k].op(ctx, x, axis, keep), *yn = ops[k].op(ctx, x, axis - 4, keep);
                cr_assert(y && yn, "%s axis %d: %s", ops[k].name, axis, qkv_errmsg(ctx));
                int want_ndim = ops[k].reduces && !keep ? 3 : 4;
                cr_assert_eq(y->ndim, want_ndim, "%s axis %d keepdim %d: ndim %d", ops[k].name, axis, keep, y->ndim);
                for (int d = 0, s = 0; d < 4; d++) {
                    if (d == axis && ops[k].reduces && !keep) continue;
                    int64_t want = d == axis && ops[k].reduces ? 1 : shape[d];
                    cr_expect_eq(y->shape[s], want, "%s axis %d keepdim %d: dimension %d is %lld", ops[k].name, axis,
                                 keep, s, (long long)y->shape[s]);
                    s++;
                }
                cr_expect_eq(memcmp(y->data, yn->data, (size_t)y->numel * sizeof(double)), 0, "%s: axis %d and %d",
                             ops[k].name, axis, axis - 4);
            }
    qkv_tensor *rows = qkv_div(ctx, qkv_exp(ctx, x), qkv_sum_dim(ctx, qkv_exp(ctx, x), -1, true));
    qkv_tensor *soft = qkv_softmax_dim(ctx, x, -1);
    cr_assert_not_null(rows, "%s", qkv_errmsg(ctx));
    for (int64_t i = 0; i < x->numel; i++)
        cr_expect(fabs(qkv_f64(rows)[i] - qkv_f64(soft)[i]) < 1e-15, "softmax by hand [%lld]: %.17g against %.17g",
                  (long long)i, qkv_f64(rows)[i], qkv_f64(soft)[i]);
    qkv_ctx_free(ctx);
}

typedef struct op_case {
    int op, axis;
} op_case;

static qkv_tensor *apply(qkv_ctx *ctx, qkv_tensor *const *in, int n_in, void *user) {
    (void)n_in;
    const op_case *c = user;
    // keepdim on even axes, dropped on odd ones
    return ops[c->op].op(ctx, in[0], c->axis, c->axis % 2 == 0);
}

/* qkv_gradcheck in f64 passes for every operator on every axis of [n, 3, m] and [m, 1, n] shapes with n, m in
 * {1, 2, 5, 7}; inputs are distinct (no ties for max, where the gradient is not differentiable). */
Test(reduce, gradcheck_in_f64_on_every_axis_of_odd_shapes) {
    static const int64_t sizes[][3] = {{1, 3, 5}, {2, 3, 7}, {7, 1, 2}, {5, 2, 1}};
    int runs = 0;
    int64_t checked = 0;
    for (int k = 0; k < N_OPS; k++)
        for (int s = 0; s < 4; s++)
            for (int axis = -3; axis < 3; axis++) {
                qkv_ctx *ctx = qkv_ctx_new(NULL);
                qkv_tensor *x = qkv_zeros(ctx, QKV_F64, 3, sizes[s]);
                for (int64_t i = 0; i < x->numel; i++) qkv_f64(x)[i] = 1.3 * sin(2.1 * (double)i + s) + 0.01 * (double)i;
                qkv_set_requires_grad(ctx, x, true);
                op_case c = {k, axis};
                qkv_gradcheck_result r;
                qkv_gradcheck_options o = {0};
                o.seed = (uint64_t)(k * 100 + s * 10 + axis + 3);
                cr_assert_eq(qkv_gradcheck(ctx, apply, &x, 1, &c, &o, &r), QKV_OK, "%s", qkv_errmsg(ctx));
                cr_expect(r.passed, "%s axis %d shape %d: %s", ops[k].name, axis, s, r.message);
                checked += r.checked, runs++;
                qkv_ctx_free(ctx);
            }
    cr_expect_eq(runs, N_OPS * 4 * 6);
    cr_expect(checked > 1000, "%lld elements checked", (long long)checked);
}

/* f32: the f64 result of the same (float) inputs rounded once to float (logsumexp, softmax and log_softmax along
 * the last axis, which use float exps: within 2^-21 max(1, |y|)), and gradients within 1e-6 of f64's. */
Test(reduce, f32_is_f64_rounded_once) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    int64_t shape[3] = {3, 6, 5};
    double v[90];
    for (int i = 0; i < 90; i++) v[i] = (double)(float)(4.0 * sin(0.7 * i) + 0.001 * i);
    for (int k = 0; k < N_OPS; k++)
        for (int axis = 0; axis < 3; axis++) {
            // f32 first (its results copied out), then f64 in the next step; the loss weighs outputs unevenly
            float y32[90], g32[90];
            int64_t ny = 0;
            for (int pass = 0; pass < 2; pass++) {
                qkv_dtype dt = pass ? QKV_F64 : QKV_F32;
                qkv_tensor *x = tensor_of(ctx, dt, 3, shape, v);
                qkv_set_requires_grad(ctx, x, true);
                qkv_tensor *y = ops[k].op(ctx, x, axis, false);
                cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
                qkv_tensor *w = qkv_zeros(ctx, dt, y->ndim, y->shape);
                for (int64_t i = 0; i < y->numel; i++) qkv_set_flat(ctx, w, i, 0.5 + 0.25 * (double)(i % 5));
                cr_assert_eq(qkv_backward(ctx, y, w), QKV_OK, "%s", qkv_errmsg(ctx));
                if (!pass) {
                    ny = y->numel;
                    memcpy(y32, qkv_f32(y), (size_t)ny * sizeof(float));
                    memcpy(g32, qkv_f32(x->grad), sizeof g32);
                } else {
                    cr_assert_eq(y->numel, ny);
                    // the exp-based ones along the last axis use float exps (SLEEF): within 2^-21 max(1, |y|)
                    bool float_exp = axis == 2 && k >= 3;
                    for (int64_t i = 0; i < ny; i++) {
                        double y64 = qkv_f64(y)[i], tol = float_exp ? ldexp(fmax(1.0, fabs(y64)), -21) : 0.0;
                        if (!float_exp) cr_expect_eq(y32[i], (float)y64, "%s axis %d y[%lld]: f32 %.9g, f64 %.17g",
                                                     ops[k].name, axis, (long long)i, (double)y32[i], y64);
                        else cr_expect(fabs(y32[i] - y64) <= tol, "%s axis %d y[%lld]: f32 %.9g, f64 %.17g, more than %g apart",
                                       ops[k].name, axis, (long long)i, (double)y32[i], y64, tol);
                    }
                    for (int64_t i = 0; i < x->numel; i++) {
                        double d64 = qkv_f64(x->grad)[i];
                        cr_expect(fabs(g32[i] - d64) <= 1e-6 * fmax(1.0, fabs(d64)), "%s axis %d dx[%lld]: f32 %.9g, f64 %.17g",
                                  ops[k].name, axis, (long long)i, (double)g32[i], d64);
                    }
                }
                qkv_step_end(ctx);
            }
        }
    qkv_ctx_free(ctx);
}

static qkv_tensor *line(qkv_ctx *ctx, int64_t n, const double *v) {
    qkv_tensor *x = tensor_of(ctx, QKV_F64, 1, &n, v);
    qkv_set_requires_grad(ctx, x, true);
    return x;
}

/* The edges the header promises: empty axes, lines of -inf, +inf and NaN, ties of max, no overflow. */
Test(reduce, edges_as_documented) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    // an empty axis: sum 0, mean NaN, logsumexp -inf, max refused; an empty result is fine for max
    qkv_tensor *empty = qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){3, 0});
    qkv_tensor *s = qkv_sum_dim(ctx, empty, 1, false), *m = qkv_mean_dim(ctx, empty, 1, false);
    qkv_tensor *l = qkv_logsumexp_dim(ctx, empty, -1, true);
    cr_assert(s && m && l, "%s", qkv_errmsg(ctx));
    for (int i = 0; i < 3; i++)
        cr_expect(qkv_f64(s)[i] == 0.0 && isnan(qkv_f64(m)[i]) && qkv_f64(l)[i] == -INFINITY, "row %d: %g %g %g", i,
                  qkv_f64(s)[i], qkv_f64(m)[i], qkv_f64(l)[i]);
    cr_expect_null(qkv_max_dim(ctx, empty, 1, false));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_SHAPE, "%s", qkv_errmsg(ctx));
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_max_dim: x is [3,0]") && strstr(qkv_errmsg(ctx), "empty"), "%s",
              qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    qkv_tensor *none = qkv_max_dim(ctx, empty, 0, false); // [3, 0] along axis 0: a result of shape [0]
    cr_expect(none && none->numel == 0, "max of [3,0] along 0: %s", qkv_errmsg(ctx));

    // a line of -inf: logsumexp -inf, softmax zeros, log_softmax -inf, every gradient 0
    const double ninf[3] = {-INFINITY, -INFINITY, -INFINITY};
    axis_op dead_ops[3] = {qkv_logsumexp_dim, softmax_op, log_softmax_op};
    for (int k = 0; k < 3; k++) {
        qkv_tensor *x = line(ctx, 3, ninf);
        qkv_tensor *y = dead_ops[k](ctx, x, 0, false);
        qkv_tensor *dy = y->ndim ? qkv_ones(ctx, QKV_F64, 1, (int64_t[]){3}) : NULL;
        cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
        for (int64_t i = 0; i < y->numel; i++)
            cr_expect(qkv_f64(y)[i] == (k == 1 ? 0.0 : -INFINITY), "op %d: y[%lld] = %g", k, (long long)i, qkv_f64(y)[i]);
        for (int i = 0; i < 3; i++) cr_expect(qkv_f64(x->grad)[i] == 0.0, "op %d: dx[%d] = %g", k, i, qkv_f64(x->grad)[i]);
        qkv_step_end(ctx);
    }
    // the same in f32 along the last axis (log_softmax's row path), the gradient new in an arena left dirty:
    // the dead row's gradient is written as zeros, the live row's is dy - softmax * sum dy = 1 - 3 softmax
    cr_assert_not_null(qkv_full(ctx, QKV_F32, 1, (int64_t[]){4096}, 7.0));
    qkv_step_end(ctx);
    {
        const double rows[6] = {-INFINITY, -INFINITY, -INFINITY, 1.0, 2.0, 3.0};
        qkv_tensor *x = tensor_of(ctx, QKV_F32, 2, (int64_t[]){2, 3}, rows);
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *y = qkv_log_softmax(ctx, x, -1);
        cr_assert_eq(qkv_backward(ctx, y, qkv_ones(ctx, QKV_F32, 2, (int64_t[]){2, 3})), QKV_OK, "%s", qkv_errmsg(ctx));
        double z = exp(1.0) + exp(2.0) + exp(3.0);
        for (int i = 0; i < 6; i++) {
            double want = i < 3 ? 0.0 : 1.0 - 3.0 * exp(rows[i]) / z;
            cr_expect(fabs(at(x->grad, i) - want) < 1e-6, "f32 dx[%d] = %g, want %g", i, at(x->grad, i), want);
        }
        qkv_step_end(ctx);
    }

    // +inf or NaN in a line: softmax and log_softmax NaN in the whole line (as PyTorch); logsumexp +inf / NaN
    const double pinf[3] = {1.0, INFINITY, 2.0}, nan3[3] = {1.0, NAN, 2.0};
    for (int k = 0; k < 2; k++) {
        const double *v = k ? nan3 : pinf;
        qkv_tensor *a = line(ctx, 3, v);
        qkv_tensor *sm = qkv_softmax_dim(ctx, a, 0), *ls = qkv_log_softmax(ctx, a, 0), *le = qkv_logsumexp_dim(ctx, a, 0, false);
        for (int i = 0; i < 3; i++) cr_expect(isnan(qkv_f64(sm)[i]) && isnan(qkv_f64(ls)[i]), "%s: element %d", k ? "NaN" : "+inf", i);
        cr_expect(k ? isnan(qkv_f64(le)[0]) : qkv_f64(le)[0] == INFINITY, "logsumexp: %g", qkv_f64(le)[0]);
        qkv_step_end(ctx);
    }

    // max: the first of tied maxima takes the gradient; the first NaN wins and takes it
    const double ties[5] = {1.0, 3.0, -2.0, 3.0, 3.0}, nans[4] = {5.0, NAN, 7.0, NAN};
    qkv_tensor *t = line(ctx, 5, ties);
    qkv_tensor *mt = qkv_max_dim(ctx, t, 0, false);
    cr_assert_eq(qkv_backward(ctx, mt, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect(qkv_f64(mt)[0] == 3.0, "max %g", qkv_f64(mt)[0]);
    for (int i = 0; i < 5; i++) cr_expect(qkv_f64(t->grad)[i] == (i == 1 ? 1.0 : 0.0), "tie: dx[%d] = %g", i, qkv_f64(t->grad)[i]);
    qkv_step_end(ctx);
    qkv_tensor *nn = line(ctx, 4, nans);
    qkv_tensor *mn = qkv_max_dim(ctx, nn, 0, false);
    cr_assert_eq(qkv_backward(ctx, mn, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect(isnan(qkv_f64(mn)[0]), "max with NaN: %g", qkv_f64(mn)[0]);
    for (int i = 0; i < 4; i++) cr_expect(qkv_f64(nn->grad)[i] == (i == 1 ? 1.0 : 0.0), "NaN: dx[%d] = %g", i, qkv_f64(nn->grad)[i]);
    qkv_step_end(ctx);

    // no overflow: logsumexp of {1000, 1000} is 1000 + log 2; log_softmax of {0, -1000} keeps -1000 exactly
    // where log(softmax) would give log 0 = -inf; in f32 as in f64
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_tensor *big = tensor_of(ctx, dt, 1, (int64_t[]){2}, (const double[]){1000.0, 1000.0});
        qkv_tensor *far = tensor_of(ctx, dt, 1, (int64_t[]){2}, (const double[]){0.0, -1000.0});
        qkv_tensor *lb = qkv_logsumexp_dim(ctx, big, 0, false), *lf = qkv_log_softmax(ctx, far, 0);
        cr_expect(at(lb, 0) == (d ? 1000.0 + log(2.0) : (double)(float)(1000.0 + log(2.0))), "%s: %.17g",
                  qkv_dtype_name(dt), at(lb, 0));
        cr_expect(at(lf, 0) == 0.0 && at(lf, 1) == -1000.0, "%s: log_softmax %g %g", qkv_dtype_name(dt), at(lf, 0),
                  at(lf, 1));
        qkv_step_end(ctx);
    }

    // f32 rows of 75 (two blocks of four 8-lane vectors, one more vector and a tail: every path of row_sums.h's
    // max8_f32) whose largest element, 100 above the rest, sits at each place in turn: the row maximum must be
    // found in every lane, or e^(x - m) overflows to inf
    enum { LEN = 75 };
    for (int top = 0; top < LEN; top++) {
        double v[LEN];
        for (int j = 0; j < LEN; j++) v[j] = j == top ? 200.0 : 100.0 - 0.5 * j;
        qkv_tensor *row = tensor_of(ctx, QKV_F32, 1, (int64_t[]){LEN}, v);
        qkv_tensor *ls = qkv_log_softmax(ctx, row, 0), *sm = qkv_softmax_dim(ctx, row, 0);
        qkv_tensor *le = qkv_logsumexp_dim(ctx, row, 0, false);
        cr_assert_not_null(ls);
        cr_expect(at(ls, top) == 0.0f && at(sm, top) == 1.0f && at(le, 0) == 200.0f,
                  "largest at %d: log_softmax %g, softmax %g, logsumexp %g", top, at(ls, top), at(sm, top), at(le, 0));
        for (int j = 0; j < LEN; j++)
            if (j != top)
                cr_expect(fabs(at(ls, j) - (v[j] - 200.0)) < 1e-4, "largest at %d: log_softmax[%d] = %g", top, j, at(ls, j));
        qkv_step_end(ctx);
    }

    // f32 rows taken in pairs (exp_sums.h): two live rows (0, 1), a live row beside a dead one (2 of -inf, 3) and
    // beside a NaN one (4, 5 with a NaN), and an odd last row (6): a row of -inf gives -inf, a row with a NaN NaN,
    // and each live row f64's result within f32's rounding
    {
        enum { ROWS = 7, COLS = 41 };
        double v[ROWS * COLS];
        for (int i = 0; i < ROWS * COLS; i++) v[i] = 3.0 * sin(0.37 * i);
        for (int j = 0; j < COLS; j++) v[2 * COLS + j] = -INFINITY;
        v[5 * COLS + 7] = NAN;
        qkv_tensor *x32 = tensor_of(ctx, QKV_F32, 2, (int64_t[]){ROWS, COLS}, v);
        qkv_tensor *x64 = tensor_of(ctx, QKV_F64, 2, (int64_t[]){ROWS, COLS}, v);
        qkv_tensor *le32 = qkv_logsumexp_dim(ctx, x32, -1, false), *ls32 = qkv_log_softmax(ctx, x32, -1);
        qkv_tensor *le64 = qkv_logsumexp_dim(ctx, x64, -1, false), *ls64 = qkv_log_softmax(ctx, x64, -1);
        cr_assert(le32 && ls32 && le64 && ls64, "%s", qkv_errmsg(ctx));
        for (int r = 0; r < ROWS; r++) {
            bool dead = r == 2, nan = r == 5;
            double got = at(le32, r), want = at(le64, r);
            cr_expect(dead ? got == -INFINITY : nan ? isnan(got) : fabs(got - want) < 1e-6 * fmax(1.0, fabs(want)),
                      "row %d: logsumexp f32 %.9g, f64 %.17g", r, got, want);
            for (int j = 0; j < COLS; j++) {
                got = at(ls32, r * COLS + j), want = at(ls64, r * COLS + j);
                cr_expect(dead ? got == -INFINITY : nan ? isnan(got) : fabs(got - want) < 1e-5,
                          "row %d: log_softmax[%d] f32 %.9g, f64 %.17g", r, j, got, want);
            }
        }
        qkv_step_end(ctx);
    }
    qkv_ctx_free(ctx);
}

/* Bad input: an error naming the function, the shape and the axis, never a result. */
Test(reduce, misuse_is_refused_with_a_message) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_ones(ctx, QKV_F64, 2, (int64_t[]){2, 3});
    qkv_tensor *ids = qkv_zeros(ctx, QKV_I32, 1, (int64_t[]){3});
    qkv_tensor *scalar = qkv_ones(ctx, QKV_F64, 0, NULL);
#define MISUSE(expr, status, f1, f2)                                                                                  \
    do {                                                                                                               \
        qkv_tensor *r = (expr);                                                                                        \
        expect_misuse(ctx, #expr, r, status, (const char *const[]){f1, f2, NULL});                                     \
        qkv_clear_error(ctx);                                                                                          \
    } while (0)
    for (int k = 0; k < N_OPS; k++) {
        MISUSE(ops[k].op(ctx, NULL, 0, false), QKV_ERR_NULL, NULL, NULL);
        MISUSE(ops[k].op(ctx, ids, 0, false), QKV_ERR_DTYPE, "x", NULL);
        MISUSE(ops[k].op(ctx, x, 2, false), QKV_ERR_ARG, "x is [2,3]: axis 2 is out of range [-2, 1]", NULL);
        MISUSE(ops[k].op(ctx, x, -3, true), QKV_ERR_ARG, "axis -3 is out of range", NULL);
        MISUSE(ops[k].op(ctx, scalar, 0, false), QKV_ERR_RANK, "scalar", NULL);
    }
    MISUSE(qkv_sum_dim(ctx, x, 5, false), QKV_ERR_ARG, "qkv_sum_dim", NULL);
    MISUSE(qkv_mean_dim(ctx, x, 5, false), QKV_ERR_ARG, "qkv_mean_dim", NULL);
    MISUSE(qkv_max_dim(ctx, ids, 0, false), QKV_ERR_DTYPE, "qkv_max_dim", NULL);
    MISUSE(qkv_logsumexp_dim(ctx, scalar, 0, false), QKV_ERR_RANK, "qkv_logsumexp_dim", NULL);
    MISUSE(qkv_softmax_dim(ctx, x, -7), QKV_ERR_ARG, "qkv_softmax_dim", NULL);
    MISUSE(qkv_log_softmax(ctx, NULL, 0), QKV_ERR_NULL, "qkv_log_softmax", NULL);
#undef MISUSE
    qkv_ctx_free(ctx);
}

/* f32 sum_dim's backward adding into an existing gradient along the last axis: each element becomes
 * (float)((double)old + (double)dy), whether the loop adds in double or, as it does, in float (the two agree for
 * every pair of floats): old values of every magnitude and sign against upstream values from 1e-30 to 1e30,
 * subnormals, zeros of both signs and infinities. */
Test(reduce, sum_dim_backward_adds_into_a_kept_gradient_with_the_double_rounded_bits) {
    enum { R = 64, N = 37 };
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_param(ctx, qkv_zeros(ctx, QKV_F32, 2, (int64_t[]){R, N}));
    qkv_tensor *dy = qkv_keep(ctx, qkv_zeros(ctx, QKV_F32, 2, (int64_t[]){R, 1}));
    cr_assert(x && dy, "%s", qkv_errmsg(ctx));
    qkv_tensor *warm = qkv_sum_dim(ctx, x, -1, true); /* a first backward makes x's gradient */
    cr_assert_eq(qkv_backward(ctx, warm, dy), QKV_OK, "%s", qkv_errmsg(ctx));
    float *old = qkv_f32(x->grad), want[R * N];
    uint32_t state = 12345u;
    for (int i = 0; i < R * N; i++) {
        state = state * 1664525u + 1013904223u;
        uint32_t bits = state; /* every float bit pattern but NaN */
        memcpy(&old[i], &bits, sizeof bits);
        if (isnan(old[i])) old[i] = (i % 2 ? -0.0f : 1e-45f);
    }
    for (int r = 0; r < R; r++) {
        double e = -30.0 + 60.0 * r / (R - 1);
        qkv_f32(dy)[r] = (float)((r % 2 ? -1.0 : 1.0) * pow(10.0, e));
    }
    qkv_f32(dy)[3] = INFINITY;
    qkv_f32(dy)[5] = -0.0f;
    qkv_f32(dy)[7] = 1e-45f;
    for (int r = 0; r < R; r++)
        for (int j = 0; j < N; j++) want[r * N + j] = (float)((double)old[r * N + j] + (double)qkv_f32(dy)[r]);
    qkv_step_end(ctx);
    qkv_tensor *y = qkv_sum_dim(ctx, x, -1, true);
    cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
    int bad = 0;
    for (int i = 0; i < R * N; i++) bad += memcmp(&qkv_f32(x->grad)[i], &want[i], sizeof(float)) != 0 && !(isnan(want[i]) && isnan(qkv_f32(x->grad)[i]));
    cr_expect_eq(bad, 0, "%d of %d gradient elements differ from the double-rounded sum", bad, R * N);
    qkv_ctx_free(ctx);
}
