/*
 * test_shape.c — the operators of qkv/shape.h: values and gradients against PyTorch 1.13 (tests/data/shape/, from
 * tests/tools/make_shape_golden.py), gradcheck in f64 over odd shapes, f32 against f64 and the integer dtypes,
 * empty tensors, the scatter order of repeated indices, the copies a node keeps, and misuse.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "qkv.h"
#include "test_ops.h"

static qkv_tensor *load_data(qkv_ctx *ctx, const char *name, const char *part) {
    char path[512];
    snprintf(path, sizeof path, "%s/shape/%s_%s.npy", QKV_TEST_DATA, name, part);
    qkv_tensor *t = qkv_npy_load(ctx, path);
    cr_assert_not_null(t, "%s: %s", path, qkv_errmsg(ctx));
    return t;
}

/* got equals want within 1e-12 relative (1e-12 absolute near 0): the copies are exact, a scatter-add's sum may
 * round differently from PyTorch's in the last bit. */
static bool same(double got, double want) { return fabs(got - want) <= 1e-12 * fmax(1.0, fabs(want)); }

/* ---- the operators, as cases: the same table as tests/tools/make_shape_golden.py's CASES ---------- */

enum { T_TRANSPOSE, T_PERMUTE, T_CONCAT, T_NARROW, T_INDEX_SELECT, T_GATHER, T_EXPAND };

typedef struct shape_case {
    const char *name;
    int op, n_in;
    int axis, axis2;        /* transpose: dim0, dim1; concat, narrow, index_select, gather: the axis */
    int dims[4];            /* permute */
    int64_t start, length;  /* narrow */
    int ndim;               /* expand: the shape; index_select, gather: the index's shape */
    int64_t shape[4];
    int32_t index[32];      /* index_select, gather: the index, row-major */
} shape_case;

static const shape_case golden_cases[] = {
    {.name = "transpose_0_m1", .op = T_TRANSPOSE, .n_in = 1, .axis = 0, .axis2 = -1},
    {.name = "transpose_1_2", .op = T_TRANSPOSE, .n_in = 1, .axis = 1, .axis2 = 2},
    {.name = "permute_4d", .op = T_PERMUTE, .n_in = 1, .dims = {2, 0, -1, 1}},
    {.name = "permute_3d", .op = T_PERMUTE, .n_in = 1, .dims = {-1, -3, 1}},
    {.name = "concat_m2", .op = T_CONCAT, .n_in = 4, .axis = -2},
    {.name = "concat_0", .op = T_CONCAT, .n_in = 2, .axis = 0},
    {.name = "narrow_neg_start", .op = T_NARROW, .n_in = 1, .axis = 1, .start = -4, .length = 3},
    {.name = "narrow_m1", .op = T_NARROW, .n_in = 1, .axis = -1, .start = 2, .length = 4},
    {"index_select_m2", T_INDEX_SELECT, 1, -2, .ndim = 1, .shape = {5}, .index = {3, 0, 3, 1, 3}},
    {"index_select_0", T_INDEX_SELECT, 1, 0, .ndim = 1, .shape = {4}, .index = {2, 2, 0, 2}},
    {"gather_1", T_GATHER, 1, 1, .ndim = 2, .shape = {2, 6}, .index = {3, 0, 3, 3, 1, 2, 1, 1, 0, 2, 3, 1}},
    {"gather_m3", T_GATHER, 1, -3, .ndim = 3, .shape = {4, 2, 3},
     .index = {2, 0, 2, 1, 1, 1, 0, 2, 0, 2, 2, 1, 1, 0, 0, 0, 2, 2, 2, 2, 2, 0, 0, 1}},
    {"expand_3_1", T_EXPAND, 1, .ndim = 3, .shape = {2, 3, 4}},
    {"expand_keep", T_EXPAND, 1, .ndim = 4, .shape = {2, -1, 4, 3}},
};
#define N_GOLDEN ((int)(sizeof golden_cases / sizeof golden_cases[0]))

/* The case's index as an i32 tensor (index_select, gather), else NULL. */
static qkv_tensor *index_of(qkv_ctx *ctx, const shape_case *c) {
    if (c->op != T_INDEX_SELECT && c->op != T_GATHER) return NULL;
    return qkv_from_data(ctx, QKV_I32, c->ndim, c->shape, c->index);
}

static qkv_tensor *apply_case(qkv_ctx *ctx, const shape_case *c, qkv_tensor *const *xs) {
    switch (c->op) {
    case T_TRANSPOSE: return qkv_transpose(ctx, xs[0], c->axis, c->axis2);
    case T_PERMUTE: return qkv_permute(ctx, xs[0], c->dims);
    case T_CONCAT: return qkv_concat(ctx, xs, c->n_in, c->axis);
    case T_NARROW: return qkv_narrow(ctx, xs[0], c->axis, c->start, c->length);
    case T_INDEX_SELECT: return qkv_index_select(ctx, xs[0], c->axis, index_of(ctx, c));
    case T_GATHER: return qkv_gather(ctx, xs[0], c->axis, index_of(ctx, c));
    default: return qkv_expand(ctx, xs[0], c->ndim, c->shape);
    }
}

static qkv_tensor *apply_gradcheck(qkv_ctx *ctx, qkv_tensor *const *in, int n_in, void *user) {
    (void)n_in;
    return apply_case(ctx, user, in);
}

/* A copy of t in dtype dt (values converted), requiring grad when dt is float. */
static qkv_tensor *copy_as(qkv_ctx *ctx, const qkv_tensor *t, qkv_dtype dt) {
    qkv_tensor *c = qkv_zeros(ctx, dt, t->ndim, t->shape);
    cr_assert_not_null(c, "%s", qkv_errmsg(ctx));
    for (int64_t i = 0; i < t->numel; i++) qkv_set_flat(ctx, c, i, qkv_get_flat(ctx, t, i));
    if (dt == QKV_F32 || dt == QKV_F64) qkv_set_requires_grad(ctx, c, true);
    return c;
}

static void expect_all_same(const qkv_tensor *got, const qkv_tensor *want, const char *what) {
    cr_assert_eq(got->ndim, want->ndim, "%s: %d dimensions, want %d", what, got->ndim, want->ndim);
    for (int d = 0; d < want->ndim; d++)
        cr_assert_eq(got->shape[d], want->shape[d], "%s: dimension %d is %lld, want %lld", what, d,
                     (long long)got->shape[d], (long long)want->shape[d]);
    for (int64_t i = 0; i < want->numel; i++)
        cr_expect(same(qkv_f64_const(got)[i], qkv_f64_const(want)[i]), "%s[%lld] = %.17g, PyTorch %.17g", what,
                  (long long)i, qkv_f64_const(got)[i], qkv_f64_const(want)[i]);
}

/* Every case's value and gradient equal PyTorch 1.13's: negative axes, a negative start, an empty input to concat,
 * repeated indices in index_select and gather, -1 and new leading axes in expand. */
Test(shape, values_and_gradients_match_pytorch) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int k = 0; k < N_GOLDEN; k++) {
        const shape_case *c = &golden_cases[k];
        qkv_tensor *xs[8];
        for (int i = 0; i < c->n_in; i++) {
            char part[16];
            snprintf(part, sizeof part, c->n_in == 1 ? "x" : "x%d", i);
            xs[i] = copy_as(ctx, load_data(ctx, c->name, part), QKV_F64);
        }
        if (c->op == T_INDEX_SELECT || c->op == T_GATHER) { // the table's index is the golden one
            qkv_tensor *gi = load_data(ctx, c->name, "index");
            cr_assert_eq(gi->dtype, QKV_I32, "%s", c->name);
            for (int64_t i = 0; i < gi->numel; i++) cr_assert_eq(qkv_i32_const(gi)[i], c->index[i], "%s", c->name);
        }
        qkv_tensor *y = apply_case(ctx, c, xs);
        cr_assert_not_null(y, "%s: %s", c->name, qkv_errmsg(ctx));
        cr_assert_eq(qkv_backward(ctx, y, load_data(ctx, c->name, "dy")), QKV_OK, "%s: %s", c->name, qkv_errmsg(ctx));
        char what[64];
        snprintf(what, sizeof what, "%s y", c->name);
        expect_all_same(y, load_data(ctx, c->name, "y"), what);
        for (int i = 0; i < c->n_in; i++) {
            char part[16];
            snprintf(part, sizeof part, c->n_in == 1 ? "dx" : "dx%d", i);
            snprintf(what, sizeof what, "%s %s", c->name, part);
            qkv_tensor *want = load_data(ctx, c->name, part);
            if (want->numel == 0) { // an empty input: PyTorch's gradient is empty; qkv's may be absent or empty
                cr_expect(!xs[i]->grad || xs[i]->grad->numel == 0, "%s", what);
                continue;
            }
            cr_assert_not_null(xs[i]->grad, "%s: no gradient", what);
            expect_all_same(xs[i]->grad, want, what);
        }
        qkv_step_end(ctx);
    }
    qkv_ctx_free(ctx);
}

/* ---- gradcheck over odd shapes -------------------------------------------------------------------- */

typedef struct grad_config {
    shape_case c;
    int ndim[8];
    int64_t shape[8][4];
} grad_config;

/* Each configuration: the operator's case, then each input's ndim and shape. */
#define CASE(...) {__VA_ARGS__}
static const grad_config grad_configs[] = {
    {CASE(.name = "transpose [2,3,7] (0, 2)", .op = T_TRANSPOSE, .n_in = 1, .axis = 0, .axis2 = 2), {3}, {{2, 3, 7}}},
    {CASE(.name = "transpose [1,33] (-1, -2)", .op = T_TRANSPOSE, .n_in = 1, .axis = -1, .axis2 = -2), {2}, {{1, 33}}},
    {CASE(.name = "transpose [3,1,7,2] (3, 1)", .op = T_TRANSPOSE, .n_in = 1, .axis = 3, .axis2 = 1), {4},
     {{3, 1, 7, 2}}},
    {CASE(.name = "transpose [7] (0, 0)", .op = T_TRANSPOSE, .n_in = 1, .axis = 0, .axis2 = 0), {1}, {{7}}},
    {CASE(.name = "permute [2,3,7,1] (3,1,0,2)", .op = T_PERMUTE, .n_in = 1, .dims = {3, 1, 0, 2}), {4},
     {{2, 3, 7, 1}}},
    {CASE(.name = "permute [7,3] (-1,0)", .op = T_PERMUTE, .n_in = 1, .dims = {-1, 0}), {2}, {{7, 3}}},
    {CASE(.name = "permute [3,7,2] (1,2,0)", .op = T_PERMUTE, .n_in = 1, .dims = {1, 2, 0}), {3}, {{3, 7, 2}}},
    {CASE(.name = "concat [2,3,7] [2,1,7] [2,7,7] axis 1", .op = T_CONCAT, .n_in = 3, .axis = 1), {3, 3, 3},
     {{2, 3, 7}, {2, 1, 7}, {2, 7, 7}}},
    {CASE(.name = "concat [1,3] [33,3] axis -2", .op = T_CONCAT, .n_in = 2, .axis = -2), {2, 2}, {{1, 3}, {33, 3}}},
    {CASE(.name = "concat 8 x [2,k,3] axis 1 (recorded in groups)", .op = T_CONCAT, .n_in = 8, .axis = 1),
     {3, 3, 3, 3, 3, 3, 3, 3},
     {{2, 1, 3}, {2, 3, 3}, {2, 2, 3}, {2, 1, 3}, {2, 7, 3}, {2, 1, 3}, {2, 3, 3}, {2, 1, 3}}},
    {CASE(.name = "narrow [3,7,2] axis 1 start -5 length 3", .op = T_NARROW, .n_in = 1, .axis = 1, .start = -5,
          .length = 3),
     {3}, {{3, 7, 2}}},
    {CASE(.name = "narrow [33] axis 0 start 0 length 33", .op = T_NARROW, .n_in = 1, .axis = 0, .start = 0,
          .length = 33),
     {1}, {{33}}},
    {CASE(.name = "narrow [2,3,7] axis -1 start 6 length 1", .op = T_NARROW, .n_in = 1, .axis = -1, .start = 6,
          .length = 1),
     {3}, {{2, 3, 7}}},
    {CASE(.name = "index_select [7,3] axis 0 (6,0,6,6,2)", .op = T_INDEX_SELECT, .n_in = 1, .axis = 0, .ndim = 1,
          .shape = {5}, .index = {6, 0, 6, 6, 2}),
     {2}, {{7, 3}}},
    {CASE(.name = "index_select [2,3,7] axis -1 (1,1,5)", .op = T_INDEX_SELECT, .n_in = 1, .axis = -1, .ndim = 1,
          .shape = {3}, .index = {1, 1, 5}),
     {3}, {{2, 3, 7}}},
    {CASE(.name = "gather [3,7] axis 1 index [2,9]", .op = T_GATHER, .n_in = 1, .axis = 1, .ndim = 2, .shape = {2, 9},
          .index = {6, 0, 6, 6, 2, 1, 1, 3, 4, 0, 0, 5, 2, 2, 2, 6, 1, 3}),
     {2}, {{3, 7}}},
    {CASE(.name = "gather [2,3,7] axis 0 index [3,2,2]", .op = T_GATHER, .n_in = 1, .axis = 0, .ndim = 3,
          .shape = {3, 2, 2}, .index = {1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1, 1}),
     {3}, {{2, 3, 7}}},
    {CASE(.name = "expand [3,1] to [2,3,7]", .op = T_EXPAND, .n_in = 1, .ndim = 3, .shape = {2, 3, 7}), {2}, {{3, 1}}},
    {CASE(.name = "expand [1,7] to [33,-1]", .op = T_EXPAND, .n_in = 1, .ndim = 2, .shape = {33, -1}), {2}, {{1, 7}}},
    {CASE(.name = "expand [1] to [3,1,7]", .op = T_EXPAND, .n_in = 1, .ndim = 3, .shape = {3, 1, 7}), {1}, {{1}}},
};
#undef CASE
#define N_GRAD ((int)(sizeof grad_configs / sizeof grad_configs[0]))

static int grad_build(qkv_ctx *ctx, int c, void *user, qkv_tensor **in, void **fn_user) {
    (void)user;
    const grad_config *g = &grad_configs[c];
    for (int i = 0; i < g->c.n_in; i++) {
        in[i] = qkv_randn(ctx, QKV_F64, g->ndim[i], g->shape[i], 0.0, 1.0);
        qkv_set_requires_grad(ctx, in[i], true);
    }
    *fn_user = (void *)&g->c;
    return g->c.n_in;
}

static void grad_name(char *buf, size_t size, int c, const void *user) {
    (void)user;
    snprintf(buf, size, "%s", grad_configs[c].c.name);
}

Test(shape, gradcheck_in_f64_over_odd_shapes) {
    gradcheck_table t = {N_GRAD, 2800, grad_build, grad_name, apply_gradcheck, NULL, NULL};
    check_gradcheck_table(&t, 800);
}

/* ---- dtypes ----------------------------------------------------------------------------------------- */

/* Every golden case in f32 gives the f64 values rounded to float, exactly (a copy), and gradients within 1e-6 of
 * f64's; on i32 and u8 tensors holding each element's flat position the same cases move the same elements (an
 * integer x gets no node). */
Test(shape, f32_equals_f64_and_integer_dtypes_copy) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int k = 0; k < N_GOLDEN; k++) {
        const shape_case *c = &golden_cases[k];
        qkv_tensor *x64[8], *x32[8], *xi[8], *xu[8], *pos[8];
        for (int i = 0; i < c->n_in; i++) {
            char part[16];
            snprintf(part, sizeof part, c->n_in == 1 ? "x" : "x%d", i);
            qkv_tensor *g = load_data(ctx, c->name, part);
            x32[i] = copy_as(ctx, g, QKV_F32);
            x64[i] = copy_as(ctx, x32[i], QKV_F64); // the same (rounded) values in both
            pos[i] = qkv_zeros(ctx, QKV_F64, g->ndim, g->shape);
            for (int64_t j = 0; j < g->numel; j++) qkv_f64(pos[i])[j] = (double)(1000 * i + j);
            xi[i] = copy_as(ctx, pos[i], QKV_I32);
            xu[i] = qkv_zeros(ctx, QKV_U8, g->ndim, g->shape);
            for (int64_t j = 0; j < g->numel; j++) qkv_u8(xu[i])[j] = (uint8_t)(37 * i + j);
        }
        qkv_tensor *y32 = apply_case(ctx, c, x32), *y64 = apply_case(ctx, c, x64);
        qkv_tensor *yi = apply_case(ctx, c, xi), *yu = apply_case(ctx, c, xu), *ypos = apply_case(ctx, c, pos);
        cr_assert(y32 && y64 && yi && yu && ypos, "%s: %s", c->name, qkv_errmsg(ctx));
        cr_expect(yi->dtype == QKV_I32 && yu->dtype == QKV_U8 && y32->dtype == QKV_F32, "%s: dtypes", c->name);
        cr_expect(!yi->requires_grad && !yu->requires_grad, "%s: an integer result requires grad", c->name);
        for (int64_t j = 0; j < y64->numel; j++) {
            cr_expect_eq(qkv_f32(y32)[j], (float)qkv_f64(y64)[j], "%s[%lld]: f32 %.9g, f64 %.17g", c->name,
                         (long long)j, (double)qkv_f32(y32)[j], qkv_f64(y64)[j]);
            double p = qkv_f64(ypos)[j];
            int input = (int)(p / 1000);
            cr_expect_eq(qkv_i32(yi)[j], (int32_t)p, "%s i32[%lld]", c->name, (long long)j);
            cr_expect_eq(qkv_u8(yu)[j], (uint8_t)(37 * input + (int64_t)p - 1000 * input), "%s u8[%lld]", c->name,
                         (long long)j);
        }
        qkv_step_end(ctx);
    }
    qkv_ctx_free(ctx);
}

/* f32 gradients within 1e-6 of f64's, both from the same upstream gradient. */
Test(shape, f32_gradients_match_f64) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int k = 0; k < N_GOLDEN; k++) {
        const shape_case *c = &golden_cases[k];
        double *g64[8] = {0};
        int64_t n[8] = {0};
        for (int pass = 0; pass < 2; pass++) {
            qkv_dtype dt = pass ? QKV_F32 : QKV_F64;
            qkv_tensor *xs[8];
            for (int i = 0; i < c->n_in; i++) {
                char part[16];
                snprintf(part, sizeof part, c->n_in == 1 ? "x" : "x%d", i);
                xs[i] = copy_as(ctx, load_data(ctx, c->name, part), dt);
            }
            qkv_tensor *y = apply_case(ctx, c, xs);
            cr_assert_not_null(y, "%s: %s", c->name, qkv_errmsg(ctx));
            cr_assert_eq(qkv_backward(ctx, y, copy_as(ctx, load_data(ctx, c->name, "dy"), dt)), QKV_OK, "%s",
                         qkv_errmsg(ctx));
            for (int i = 0; i < c->n_in; i++) {
                if (xs[i]->numel == 0) continue;
                cr_assert_not_null(xs[i]->grad, "%s: input %d has no gradient", c->name, i);
                if (!pass) {
                    n[i] = xs[i]->numel;
                    g64[i] = malloc((size_t)n[i] * sizeof(double));
                    memcpy(g64[i], qkv_f64(xs[i]->grad), (size_t)n[i] * sizeof(double));
                    continue;
                }
                for (int64_t j = 0; j < n[i]; j++) {
                    double g32 = qkv_f32(xs[i]->grad)[j];
                    cr_expect(fabs(g32 - g64[i][j]) <= 1e-6 * fmax(1.0, fabs(g64[i][j])),
                              "%s dx%d[%lld]: f32 %.9g, f64 %.17g", c->name, i, (long long)j, g32, g64[i][j]);
                }
                free(g64[i]);
            }
            qkv_step_end(ctx);
        }
    }
    qkv_ctx_free(ctx);
}

/* ---- empty tensors, order, kept copies -------------------------------------------------------------- */

static void expect_shape(const qkv_tensor *t, int ndim, const int64_t *shape, const char *what) {
    cr_assert_not_null(t, "%s: no result", what);
    cr_expect_eq(t->ndim, ndim, "%s: %d dimensions", what, t->ndim);
    for (int d = 0; d < ndim && d < t->ndim; d++)
        cr_expect_eq(t->shape[d], shape[d], "%s: dimension %d is %lld, want %lld", what, d, (long long)t->shape[d],
                     (long long)shape[d]);
}

/* A zero-size dimension anywhere gives an empty result, and the backward gives a zero gradient (or an empty one). */
Test(shape, empty_tensors_give_empty_results) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_randn(ctx, QKV_F64, 2, (int64_t[]){3, 4}, 0.0, 1.0);
    qkv_tensor *e = qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){0, 4});
    qkv_set_requires_grad(ctx, x, true);
    qkv_set_requires_grad(ctx, e, true);
    qkv_tensor *none = qkv_zeros(ctx, QKV_I32, 1, (int64_t[]){0});
    qkv_tensor *r[8];
    r[0] = qkv_transpose(ctx, e, 0, 1);
    expect_shape(r[0], 2, (int64_t[]){4, 0}, "transpose of [0,4]");
    r[1] = qkv_narrow(ctx, x, 1, 4, 0); // start == size, length 0: allowed as torch.narrow
    expect_shape(r[1], 2, (int64_t[]){3, 0}, "narrow length 0");
    r[2] = qkv_index_select(ctx, x, 0, none);
    expect_shape(r[2], 2, (int64_t[]){0, 4}, "index_select of no index");
    r[3] = qkv_gather(ctx, x, 1, qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){3, 0}));
    expect_shape(r[3], 2, (int64_t[]){3, 0}, "gather of an empty index");
    r[4] = qkv_expand(ctx, qkv_narrow(ctx, x, 0, 0, 1), 2, (int64_t[]){0, 4});
    expect_shape(r[4], 2, (int64_t[]){0, 4}, "expand of [1,4] to [0,4]");
    qkv_tensor *pair[2] = {e, x};
    r[5] = qkv_concat(ctx, pair, 2, 0);
    expect_shape(r[5], 2, (int64_t[]){3, 4}, "concat of [0,4] and [3,4]");
    r[6] = qkv_permute(ctx, qkv_zeros(ctx, QKV_U8, 3, (int64_t[]){2, 0, 3}), (int[]){2, 1, 0});
    expect_shape(r[6], 3, (int64_t[]){3, 0, 2}, "permute of u8 [2,0,3]");
    // the loss: sum of the concat (nonempty) and of every empty result (0)
    qkv_tensor *loss = qkv_sum(ctx, r[5]);
    for (int k = 0; k < 5; k++) loss = qkv_add(ctx, loss, qkv_sum(ctx, r[k]));
    cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_assert_not_null(x->grad);
    for (int64_t i = 0; i < 12; i++) cr_expect_eq(qkv_f64(x->grad)[i], 1.0, "dx[%lld]", (long long)i);
    qkv_ctx_free(ctx);
}

/* A repeated index adds its upstream rows in index order: (1e17 - 1e17) + 1 is 1 in that order, and 0 backwards
 * ((1 - 1e17) + 1e17: the 1 is lost), for index_select, gather and expand's sum alike; the same bits on a second
 * run. */
Test(shape, repeated_indices_add_up_in_order) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const double big[3] = {1e17, -1e17, 1.0};
    for (int run = 0; run < 2; run++) {
        qkv_tensor *x = qkv_zeros(ctx, QKV_F64, 1, (int64_t[]){2});
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *idx = qkv_from_data(ctx, QKV_I32, 1, (int64_t[]){4}, (int32_t[]){0, 0, 1, 0});
        qkv_tensor *y1 = qkv_index_select(ctx, x, 0, idx), *y2 = qkv_gather(ctx, x, 0, idx);
        qkv_tensor *y3 = qkv_expand(ctx, qkv_narrow(ctx, x, 0, 1, 1), 1, (int64_t[]){3});
        qkv_tensor *d4 = tensor_of(ctx, QKV_F64, 1, (int64_t[]){4}, (double[]){1e17, -1e17, 5.0, 1.0});
        qkv_tensor *d3 = tensor_of(ctx, QKV_F64, 1, (int64_t[]){3}, big);
        // loss = dot(y1, d4) + dot(y2, d4) + dot(y3, d3)
        qkv_tensor *l1 = qkv_sum(ctx, qkv_mul(ctx, y1, d4)), *l2 = qkv_sum(ctx, qkv_mul(ctx, y2, d4));
        qkv_tensor *loss = qkv_add(ctx, qkv_add(ctx, l1, l2), qkv_sum(ctx, qkv_mul(ctx, y3, d3)));
        cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        // dx[0] = 2 ((1e17 - 1e17) + 1) = 2; dx[1] = 2 * 5 + ((1e17 - 1e17) + 1) = 11
        cr_expect_eq(qkv_f64(x->grad)[0], 2.0, "run %d: dx[0] = %.17g", run, qkv_f64(x->grad)[0]);
        cr_expect_eq(qkv_f64(x->grad)[1], 11.0, "run %d: dx[1] = %.17g", run, qkv_f64(x->grad)[1]);
        qkv_step_end(ctx);
    }
    qkv_ctx_free(ctx);
}

/* The node keeps its own index: changing the caller's index after the forward does not move the scatter. And
 * more than 8 inputs (a node's limit) that need gradients, one of them given twice, each get their slice of dy. */
Test(shape, kept_index_and_many_concat_inputs) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){3, 2});
    qkv_set_requires_grad(ctx, x, true);
    qkv_tensor *idx = qkv_from_data(ctx, QKV_I32, 1, (int64_t[]){2}, (int32_t[]){2, 0});
    qkv_tensor *gidx = qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){1, 2}, (int32_t[]){1, 2});
    qkv_tensor *y1 = qkv_index_select(ctx, x, 0, idx), *y2 = qkv_gather(ctx, x, 0, gidx);
    qkv_i32(idx)[0] = qkv_i32(idx)[1] = 1; // the caller reuses its index tensors
    qkv_i32(gidx)[0] = qkv_i32(gidx)[1] = 0;
    qkv_tensor *loss = qkv_add(ctx, qkv_sum(ctx, y1), qkv_sum(ctx, qkv_mul_scalar(ctx, y2, 10.0)));
    cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    const double want[6] = {1, 1, 10, 0, 1, 11}; // rows 2 and 0 from index_select; 10 at [1,0] and [2,1] from gather
    for (int i = 0; i < 6; i++) cr_expect_eq(qkv_f64(x->grad)[i], want[i], "dx[%d] = %g", i, qkv_f64(x->grad)[i]);
    qkv_step_end(ctx);

    enum { N = 9 };
    qkv_tensor *xs[N];
    for (int k = 0; k < N; k++) {
        xs[k] = k == 8 ? xs[2] : qkv_full(ctx, QKV_F64, 2, (int64_t[]){2, k % 3 + 1}, (double)k);
        qkv_set_requires_grad(ctx, xs[k], true);
    }
    qkv_tensor *y = qkv_concat(ctx, xs, N, -1);
    cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
    int64_t total = 0;
    for (int k = 0; k < N; k++) total += xs[k]->shape[1];
    expect_shape(y, 2, (int64_t[]){2, total}, "concat of 9");
    // dy[r, j] = j + 100 r: input k's gradient is its columns of it (xs[2] twice: both slices added)
    qkv_tensor *dy = qkv_zeros(ctx, QKV_F64, 2, y->shape);
    for (int64_t r = 0; r < 2; r++)
        for (int64_t j = 0; j < total; j++) qkv_f64(dy)[r * total + j] = (double)(j + 100 * r);
    cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
    int64_t off = 0;
    for (int k = 0; k < N; k++) {
        int64_t w = xs[k]->shape[1];
        for (int64_t r = 0; r < 2; r++)
            for (int64_t j = 0; j < w; j++)
                cr_expect_eq(qkv_f64(y)[r * total + off + j], (double)(k == 8 ? 2 : k), "y at input %d", k);
        off += w;
    }
    // xs[2] ([2,3]) sits at columns 3..5 and again after the first 8 inputs; xs[7] just before that
    int64_t off2 = 1 + 2, off8 = 0;
    for (int k = 0; k < 8; k++) off8 += xs[k]->shape[1];
    for (int64_t r = 0; r < 2; r++)
        for (int64_t j = 0; j < 3; j++)
            cr_expect_eq(qkv_f64(xs[2]->grad)[r * 3 + j], (double)(off2 + j + 100 * r) + (double)(off8 + j + 100 * r),
                         "dxs[2][%lld, %lld]", (long long)r, (long long)j);
    int64_t off7 = off8 - xs[7]->shape[1];
    for (int64_t r = 0; r < 2; r++)
        for (int64_t j = 0; j < xs[7]->shape[1]; j++)
            cr_expect_eq(qkv_f64(xs[7]->grad)[r * xs[7]->shape[1] + j], (double)(off7 + j + 100 * r), "dxs[7]");
    qkv_ctx_free(ctx);
}

/* ---- misuse ----------------------------------------------------------------------------------------- */

Test(shape, misuse_is_refused_with_a_message) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_ones(ctx, QKV_F64, 2, (int64_t[]){2, 3}), *y = qkv_ones(ctx, QKV_F64, 2, (int64_t[]){4, 5});
    qkv_tensor *f32 = qkv_ones(ctx, QKV_F32, 2, (int64_t[]){2, 3}), *s = qkv_scalar(ctx, QKV_F64, 1.0);
    qkv_tensor *idx = qkv_from_data(ctx, QKV_I32, 1, (int64_t[]){3}, (int32_t[]){0, 2, 1});
    qkv_tensor *bad_idx = qkv_from_data(ctx, QKV_I32, 1, (int64_t[]){3}, (int32_t[]){0, 5, 1});
    qkv_tensor *neg_idx = qkv_from_data(ctx, QKV_I32, 1, (int64_t[]){2}, (int32_t[]){1, -1});
    qkv_tensor *f_idx = qkv_zeros(ctx, QKV_F32, 1, (int64_t[]){3});
    qkv_tensor *g_idx = qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){2, 2}, (int32_t[]){0, 1, 2, 3});
#define MISUSE(expr, status, f1, f2, f3)                                                                               \
    do {                                                                                                               \
        qkv_tensor *r = (expr);                                                                                        \
        expect_misuse(ctx, #expr, r, status, (const char *const[]){f1, f2, f3, NULL});                                 \
        qkv_clear_error(ctx);                                                                                          \
    } while (0)
    // NULL tensors and arrays
    MISUSE(qkv_transpose(ctx, NULL, 0, 1), QKV_ERR_NULL, "qkv_transpose", "x", NULL);
    MISUSE(qkv_permute(ctx, NULL, (int[]){0}), QKV_ERR_NULL, "qkv_permute", NULL, NULL);
    MISUSE(qkv_permute(ctx, x, NULL), QKV_ERR_NULL, "qkv_permute: x is [2,3], dims is NULL", NULL, NULL);
    MISUSE(qkv_concat(ctx, NULL, 2, 0), QKV_ERR_NULL, "qkv_concat: xs is NULL", NULL, NULL);
    MISUSE(qkv_concat(ctx, (qkv_tensor *[]){x, NULL}, 2, 0), QKV_ERR_NULL, "qkv_concat", "xs[1]", NULL);
    MISUSE(qkv_narrow(ctx, NULL, 0, 0, 1), QKV_ERR_NULL, "qkv_narrow", NULL, NULL);
    MISUSE(qkv_index_select(ctx, x, 0, NULL), QKV_ERR_NULL, "qkv_index_select", "index", NULL);
    MISUSE(qkv_gather(ctx, NULL, 0, g_idx), QKV_ERR_NULL, "qkv_gather", NULL, NULL);
    MISUSE(qkv_expand(ctx, x, 2, NULL), QKV_ERR_NULL, "qkv_expand: x is [2,3], shape is NULL", NULL, NULL);
    // axes out of range: the function, the axis, the shape and the range
    MISUSE(qkv_transpose(ctx, x, 0, 2), QKV_ERR_ARG, "qkv_transpose: dim1 2 is out of range for x [2,3]", "[-2, 2)",
           NULL);
    MISUSE(qkv_transpose(ctx, x, -3, 0), QKV_ERR_ARG, "qkv_transpose: dim0 -3", "x [2,3]", "[-2, 2)");
    MISUSE(qkv_transpose(ctx, s, 0, 0), QKV_ERR_ARG, "qkv_transpose: dim0 0", "scalar has no axis", NULL);
    MISUSE(qkv_permute(ctx, x, (int[]){0, 2}), QKV_ERR_ARG, "qkv_permute: dims entry 2 is out of range for x [2,3]",
           "[-2, 2)", NULL);
    MISUSE(qkv_permute(ctx, x, (int[]){1, -1}), QKV_ERR_ARG, "qkv_permute: x is [2,3]: dims[1] = -1 names axis 1 again",
           NULL, NULL);
    MISUSE(qkv_concat(ctx, (qkv_tensor *[]){x, x}, 2, 2), QKV_ERR_ARG, "qkv_concat: axis 2", "xs[0] [2,3]", "[-2, 2)");
    MISUSE(qkv_narrow(ctx, x, -3, 0, 1), QKV_ERR_ARG, "qkv_narrow: axis -3", "x [2,3]", "[-2, 2)");
    MISUSE(qkv_index_select(ctx, x, 2, idx), QKV_ERR_ARG, "qkv_index_select: axis 2", "x [2,3]", "[-2, 2)");
    MISUSE(qkv_gather(ctx, x, 5, g_idx), QKV_ERR_ARG, "qkv_gather: axis 5", "x [2,3]", "[-2, 2)");
    // narrow's start and length
    MISUSE(qkv_narrow(ctx, x, 1, 4, 0), QKV_ERR_ARG, "qkv_narrow: x is [2,3]: start 4", "size 3", "[-3, 3]");
    MISUSE(qkv_narrow(ctx, x, 1, -4, 1), QKV_ERR_ARG, "qkv_narrow: x is [2,3]: start -4", "[-3, 3]", NULL);
    MISUSE(qkv_narrow(ctx, x, 1, -2, 3), QKV_ERR_ARG, "qkv_narrow: x is [2,3]: length 3 from start 1", "[0, 2]", NULL);
    MISUSE(qkv_narrow(ctx, x, 0, 0, -1), QKV_ERR_ARG, "qkv_narrow", "length -1", NULL);
    // indices out of range: the value, its position and the size
    MISUSE(qkv_index_select(ctx, x, 1, bad_idx), QKV_ERR_ARG, "qkv_index_select: x is [2,3], index is [3]",
           "index 5 at position 1 is outside [0, 3)", NULL);
    MISUSE(qkv_index_select(ctx, x, 0, neg_idx), QKV_ERR_ARG, "qkv_index_select", "index -1 at position 1",
           "[0, 2)");
    MISUSE(qkv_gather(ctx, x, 1, g_idx), QKV_ERR_ARG, "qkv_gather: x is [2,3], index is [2,2]",
           "index 3 at position [1,1] is outside [0, 3)", NULL);
    MISUSE(qkv_gather(ctx, x, 0, qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){1, 3}, (int32_t[]){0, -2, 1})),
           QKV_ERR_ARG, "qkv_gather: x is [2,3], index is [1,3]", "index -2 at position [0,1] is outside [0, 2)", NULL);
    // dtypes
    MISUSE(qkv_index_select(ctx, x, 0, f_idx), QKV_ERR_DTYPE, "qkv_index_select: x is [2,3], index [3] is f32",
           "i32", NULL);
    MISUSE(qkv_gather(ctx, x, 0, qkv_zeros(ctx, QKV_U8, 2, (int64_t[]){1, 3})), QKV_ERR_DTYPE, "qkv_gather", "u8",
           "i32");
    MISUSE(qkv_concat(ctx, (qkv_tensor *[]){x, f32}, 2, 0), QKV_ERR_DTYPE, "qkv_concat: xs[0] [2,3] is f64",
           "xs[1] [2,3] is f32", NULL);
    // ranks and shapes: both shapes named
    MISUSE(qkv_index_select(ctx, x, 0, g_idx), QKV_ERR_RANK, "qkv_index_select: x is [2,3], index is [2,2]", "1-D",
           NULL);
    MISUSE(qkv_gather(ctx, x, 0, idx), QKV_ERR_RANK, "qkv_gather: x is [2,3], index is [3]", NULL, NULL);
    MISUSE(qkv_gather(ctx, x, 0, qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){1, 4})), QKV_ERR_SHAPE,
           "qkv_gather: x is [2,3], index is [1,4]", "dimension 1", NULL);
    MISUSE(qkv_concat(ctx, (qkv_tensor *[]){x, y}, 2, 0), QKV_ERR_SHAPE,
           "qkv_concat: xs[0] is [2,3] and xs[1] is [4,5]", "dimension 1", NULL);
    MISUSE(qkv_concat(ctx, (qkv_tensor *[]){x, qkv_ones(ctx, QKV_F64, 1, (int64_t[]){3})}, 2, 0), QKV_ERR_SHAPE,
           "qkv_concat: xs[0] is [2,3] and xs[1] is [3]", "number of dimensions", NULL);
    MISUSE(qkv_concat(ctx, (qkv_tensor *[]){x}, 0, 0), QKV_ERR_ARG, "qkv_concat: n is 0", NULL, NULL);
    MISUSE(qkv_expand(ctx, x, 2, (int64_t[]){4, 3}), QKV_ERR_SHAPE, "qkv_expand: x is [2,3], shape is [4,3]",
           "dimension 0 is 2 in x and 4 in shape", NULL);
    MISUSE(qkv_expand(ctx, x, 1, (int64_t[]){3}), QKV_ERR_SHAPE, "qkv_expand: x is [2,3], shape is [3]", "fewer", NULL);
    MISUSE(qkv_expand(ctx, x, 3, (int64_t[]){-1, 2, 3}), QKV_ERR_ARG, "qkv_expand: x is [2,3], shape is [-1,2,3]",
           "new leading dimension 0", NULL);
    MISUSE(qkv_expand(ctx, x, 2, (int64_t[]){2, -2}), QKV_ERR_ARG, "qkv_expand", "-2", NULL);
    MISUSE(qkv_expand(ctx, x, 5, (int64_t[]){1, 1, 1, 2, 3}), QKV_ERR_RANK, "qkv_expand", "5", NULL);
    // more elements than a tensor may hold
    MISUSE(qkv_expand(ctx, qkv_ones(ctx, QKV_F64, 1, (int64_t[]){1}), 2,
                      (int64_t[]){INT64_C(1) << 40, INT64_C(1) << 40}),
           QKV_ERR_OVERFLOW, "qkv_expand", NULL, NULL);
    // empty tensors may have huge dimensions; their sum along the axis may not pass a tensor's bound
    qkv_tensor *wide = qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){0, INT64_C(1) << 59});
    cr_assert_not_null(wide, "%s", qkv_errmsg(ctx));
    MISUSE(qkv_concat(ctx, (qkv_tensor *[]){wide, wide}, 2, 1), QKV_ERR_OVERFLOW,
           "qkv_concat: xs[0] is [0,576460752303423488], xs[1] is [0,576460752303423488]", "QKV_MAX_NUMEL", NULL);
    MISUSE(qkv_narrow(ctx, x, 0, INT64_MIN, 1), QKV_ERR_ARG, "qkv_narrow", NULL, NULL);
    MISUSE(qkv_narrow(ctx, x, 0, 1, INT64_MAX), QKV_ERR_ARG, "qkv_narrow", NULL, NULL);
#undef MISUSE
    // a failed call leaves nothing behind: the next one works
    qkv_tensor *t = qkv_transpose(ctx, x, 0, 1);
    cr_expect(t && t->shape[0] == 3 && t->shape[1] == 2, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

/* A chain of every operator gives the same gradient bits with qkv_options.release_grads (each intermediate's
 * gradient and each backward's scratch given back to the arena as the walk goes) as without. */
Test(shape, chain_with_release_grads_gives_the_same_gradient) {
    double got[2][24];
    for (int release = 0; release < 2; release++) {
        qkv_options o = qkv_default_options();
        o.release_grads = release;
        o.seed = 5;
        qkv_ctx *ctx = qkv_ctx_new(&o);
        qkv_tensor *x = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){2, 3, 4}, 0.0, 1.0);
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *t = qkv_transpose(ctx, x, 0, 2);                              // [4, 3, 2]
        qkv_tensor *p = qkv_permute(ctx, t, (int[]){1, 0, 2});                    // [3, 4, 2]
        qkv_tensor *parts[3] = {p, qkv_narrow(ctx, p, 1, -2, 2), p};
        qkv_tensor *c = qkv_concat(ctx, parts, 3, 1);                              // [3, 10, 2]
        qkv_tensor *idx = qkv_from_data(ctx, QKV_I32, 1, (int64_t[]){4}, (int32_t[]){9, 0, 9, 3});
        qkv_tensor *s = qkv_index_select(ctx, c, 1, idx);                          // [3, 4, 2]
        qkv_tensor *first = qkv_zeros(ctx, QKV_I32, 3, (int64_t[]){3, 4, 1});
        qkv_tensor *g = qkv_gather(ctx, s, 2, first);                             // [3, 4, 1]
        qkv_tensor *e = qkv_expand(ctx, g, 4, (int64_t[]){2, 3, 4, 5});            // [2, 3, 4, 5]
        qkv_tensor *w = qkv_randn(ctx, QKV_F64, 4, (int64_t[]){2, 3, 4, 5}, 0.0, 1.0);
        cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, e, w)), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        memcpy(got[release], qkv_f64(x->grad), sizeof got[release]);
        qkv_ctx_free(ctx);
    }
    bool any = false;
    for (int i = 0; i < 24; i++) {
        cr_expect_eq(got[0][i], got[1][i], "dx[%d]: %.17g with release_grads, %.17g without", i, got[1][i], got[0][i]);
        any |= got[0][i] != 0.0;
    }
    cr_expect(any, "the chain's gradient is all zeros");
}
