/*
 * test_linear_ops.c — projection Y = X W (+ b), batched matmul with transpose flags, and scale:
 *   - values and gradients against small hand-computed cases, f32 and f64, every flag combination;
 *   - qkv_gradcheck (f64, default tolerances) over 20+ configurations per operator, each failure named;
 *   - the f32 path against the f64 path on the same inputs (norm-wise relative error < 1e-4);
 *   - bad input: the status code, and a message naming the function and the shapes.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "qkv_internal.h"
#include "test_ops.h"

/* ---- helpers ------------------------------------------------------------------------------------- */

static qkv_ctx *new_ctx(uint64_t seed) {
    qkv_options o = qkv_default_options();
    o.seed = seed;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    cr_assert_not_null(ctx);
    return ctx;
}

/* Number of elements of t that differ from want by more than tol; t must have want_n elements. */
static int count_mismatch(const qkv_tensor *t, const double *want, int64_t want_n, double tol) {
    if (!t || t->numel != want_n) return (int)want_n + 1;
    int bad = 0;
    for (int64_t i = 0; i < want_n; i++)
        if (!(fabs(at(t, i) - want[i]) <= tol)) bad++;
    return bad;
}

static bool has_shape(const qkv_tensor *t, int ndim, const int64_t *shape) {
    if (!t || t->ndim != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i]) return false;
    return true;
}

static const char *dt_name(qkv_dtype dt) { return dt == QKV_F64 ? "f64" : "f32"; }

/* ---- projection: hand-computed ------------------------------------------------------------------- */

/* X = [[1,2,3],[4,5,6]], W = [[1,0],[0,1],[1,-1]], b = [0.5,-1], dY = [[1,2],[3,4]]
 * Y  = X W + b   = [[4.5,-2],[10.5,-2]]
 * dX = dY W^T    = [[1,2,-1],[3,4,-1]]
 * dW = X^T dY    = [[13,18],[17,24],[21,30]]
 * db = colsum dY = [4,6] */
static const double P_X[6] = {1, 2, 3, 4, 5, 6}, P_W[6] = {1, 0, 0, 1, 1, -1}, P_B[2] = {0.5, -1},
                    P_DY[4] = {1, 2, 3, 4};
static const double P_Y[4] = {4.5, -2, 10.5, -2}, P_Y_NOBIAS[4] = {4, -1, 10, -1},
                    P_DX[6] = {1, 2, -1, 3, 4, -1}, P_DW[6] = {13, 18, 17, 24, 21, 30}, P_DB[2] = {4, 6};

static void projection_by_hand(qkv_dtype dt, bool bias, int x_ndim, const int64_t *x_shape,
                               const int64_t *y_shape) {
    qkv_ctx *ctx = new_ctx(1);
    qkv_tensor *x = tensor_of(ctx, dt, x_ndim, x_shape, P_X);
    qkv_tensor *w = tensor_of(ctx, dt, 2, (int64_t[]){3, 2}, P_W);
    qkv_tensor *b = bias ? tensor_of(ctx, dt, 1, (int64_t[]){2}, P_B) : NULL;
    qkv_set_requires_grad(ctx, x, true);
    qkv_set_requires_grad(ctx, w, true);
    if (b) qkv_set_requires_grad(ctx, b, true);
    qkv_tensor *y = qkv_projection(ctx, x, w, b);
    cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
    cr_expect(has_shape(y, x_ndim, y_shape), "%s y shape %s", dt_name(dt), QKV_SHAPE(y));
    cr_expect_eq(y->dtype, dt);
    cr_expect_eq(count_mismatch(y, bias ? P_Y : P_Y_NOBIAS, 4, 1e-6), 0, "%s bias=%d: wrong Y",
                 dt_name(dt), bias);
    qkv_tensor *dy = tensor_of(ctx, dt, x_ndim, y_shape, P_DY);
    cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect_eq(count_mismatch(x->grad, P_DX, 6, 1e-6), 0, "%s: wrong dX", dt_name(dt));
    cr_expect_eq(count_mismatch(w->grad, P_DW, 6, 1e-6), 0, "%s: wrong dW", dt_name(dt));
    if (b) cr_expect_eq(count_mismatch(b->grad, P_DB, 2, 1e-6), 0, "%s: wrong db", dt_name(dt));
    qkv_ctx_free(ctx);
}

Test(projection, hand_computed_2d_with_bias) {
    projection_by_hand(QKV_F64, true, 2, (int64_t[]){2, 3}, (int64_t[]){2, 2});
    projection_by_hand(QKV_F32, true, 2, (int64_t[]){2, 3}, (int64_t[]){2, 2});
}

Test(projection, hand_computed_2d_without_bias) {
    projection_by_hand(QKV_F64, false, 2, (int64_t[]){2, 3}, (int64_t[]){2, 2});
    projection_by_hand(QKV_F32, false, 2, (int64_t[]){2, 3}, (int64_t[]){2, 2});
}

Test(projection, hand_computed_3d_and_4d_rows_flatten) {
    projection_by_hand(QKV_F64, true, 3, (int64_t[]){2, 1, 3}, (int64_t[]){2, 1, 2});
    projection_by_hand(QKV_F32, true, 3, (int64_t[]){2, 1, 3}, (int64_t[]){2, 1, 2});
    projection_by_hand(QKV_F64, true, 4, (int64_t[]){1, 2, 1, 3}, (int64_t[]){1, 2, 1, 2});
    projection_by_hand(QKV_F32, false, 4, (int64_t[]){1, 2, 1, 3}, (int64_t[]){1, 2, 1, 2});
}

Test(projection, one_dimensional_x) {
    qkv_ctx *ctx = new_ctx(1);
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F32 : QKV_F64;
        qkv_tensor *x = tensor_of(ctx, dt, 1, (int64_t[]){3}, P_X + 3); /* [4,5,6] */
        qkv_tensor *w = tensor_of(ctx, dt, 2, (int64_t[]){3, 2}, P_W);
        qkv_tensor *b = tensor_of(ctx, dt, 1, (int64_t[]){2}, P_B);
        qkv_tensor *y = qkv_projection(ctx, x, w, b);
        cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
        cr_expect(has_shape(y, 1, (int64_t[]){2}), "y is %s", QKV_SHAPE(y));
        cr_expect_eq(count_mismatch(y, P_Y + 2, 2, 1e-6), 0, "%s: wrong Y of a 1-D x", dt_name(dt));
    }
    qkv_ctx_free(ctx);
}

/* Gradients add (+=): a persistent W used in two steps holds the sum of both steps' dW. */
Test(projection, gradients_accumulate_over_steps) {
    qkv_ctx *ctx = new_ctx(1);
    qkv_tensor *w = qkv_param(ctx, tensor_of(ctx, QKV_F64, 2, (int64_t[]){3, 2}, P_W));
    qkv_tensor *b = qkv_param(ctx, tensor_of(ctx, QKV_F64, 1, (int64_t[]){2}, P_B));
    cr_assert_not_null(w);
    for (int step = 0; step < 2; step++) {
        qkv_tensor *x = tensor_of(ctx, QKV_F64, 2, (int64_t[]){2, 3}, P_X);
        qkv_tensor *y = qkv_projection(ctx, x, w, b);
        qkv_tensor *dy = tensor_of(ctx, QKV_F64, 2, (int64_t[]){2, 2}, P_DY);
        cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
        qkv_step_end(ctx);
    }
    double dw2[6], db2[2];
    for (int i = 0; i < 6; i++) dw2[i] = 2 * P_DW[i];
    for (int i = 0; i < 2; i++) db2[i] = 2 * P_DB[i];
    cr_expect_eq(count_mismatch(w->grad, dw2, 6, 1e-12), 0, "dW must be the sum of two steps");
    cr_expect_eq(count_mismatch(b->grad, db2, 2, 1e-12), 0, "db must be the sum of two steps");
    qkv_ctx_free(ctx);
}

/* ---- matmul: hand-computed ----------------------------------------------------------------------- */

/* A = [[1,2,3],[4,5,6]] (2x3), B = [[7,8],[9,10],[11,12]] (3x2), dC = [[1,2],[3,4]]
 * C  = A B    = [[58,64],[139,154]]
 * dA = dC B^T = [[23,29,35],[53,67,81]]
 * dB = A^T dC = [[13,18],[17,24],[21,30]]
 * With QKV_TRANS_A, A is stored as A^T (3x2) and dA comes back as dA^T; likewise B with QKV_TRANS_B. */
static const double M_A[6] = {1, 2, 3, 4, 5, 6}, M_AT[6] = {1, 4, 2, 5, 3, 6};
static const double M_B[6] = {7, 8, 9, 10, 11, 12}, M_BT[6] = {7, 9, 11, 8, 10, 12};
static const double M_C[4] = {58, 64, 139, 154}, M_DC[4] = {1, 2, 3, 4};
static const double M_DA[6] = {23, 29, 35, 53, 67, 81}, M_DAT[6] = {23, 53, 29, 67, 35, 81};
static const double M_DB[6] = {13, 18, 17, 24, 21, 30}, M_DBT[6] = {13, 17, 21, 18, 24, 30};

static const char *flag_name(int flags) {
    static const char *names[4] = {"A B", "A^T B", "A B^T", "A^T B^T"};
    return names[flags & 3];
}

static void matmul_by_hand(qkv_dtype dt, int flags) {
    bool ta = flags & QKV_TRANS_A, tb = flags & QKV_TRANS_B;
    qkv_ctx *ctx = new_ctx(1);
    qkv_tensor *a = tensor_of(ctx, dt, 2, ta ? (int64_t[]){3, 2} : (int64_t[]){2, 3}, ta ? M_AT : M_A);
    qkv_tensor *b = tensor_of(ctx, dt, 2, tb ? (int64_t[]){2, 3} : (int64_t[]){3, 2}, tb ? M_BT : M_B);
    qkv_set_requires_grad(ctx, a, true);
    qkv_set_requires_grad(ctx, b, true);
    qkv_tensor *c = qkv_matmul(ctx, a, b, flags);
    cr_assert_not_null(c, "%s", qkv_errmsg(ctx));
    cr_expect(has_shape(c, 2, (int64_t[]){2, 2}), "%s: C is %s", flag_name(flags), QKV_SHAPE(c));
    cr_expect_eq(count_mismatch(c, M_C, 4, 1e-5), 0, "%s %s: wrong C", dt_name(dt), flag_name(flags));
    cr_assert_eq(qkv_backward(ctx, c, tensor_of(ctx, dt, 2, (int64_t[]){2, 2}, M_DC)), QKV_OK, "%s",
                 qkv_errmsg(ctx));
    cr_expect_eq(count_mismatch(a->grad, ta ? M_DAT : M_DA, 6, 1e-5), 0, "%s %s: wrong dA",
                 dt_name(dt), flag_name(flags));
    cr_expect_eq(count_mismatch(b->grad, tb ? M_DBT : M_DB, 6, 1e-5), 0, "%s %s: wrong dB",
                 dt_name(dt), flag_name(flags));
    qkv_ctx_free(ctx);
}

Test(matmul, hand_computed_every_flag_combination) {
    for (int flags = 0; flags < 4; flags++) {
        matmul_by_hand(QKV_F64, flags);
        matmul_by_hand(QKV_F32, flags);
    }
}

/* Broadcast: batch 0 uses A, batch 1 uses 2A (or 2B), the other side is shared; dC = M_DC in both.
 * C_0 = A B, C_1 = 2 A B; the shared side's gradient sums the batches: 1 + 2 = 3 times the 2-D one,
 * and each batch of the batched side gets the 2-D gradient. */
static void matmul_broadcast_by_hand(qkv_dtype dt, bool broadcast_a, int flags) {
    bool ta = flags & QKV_TRANS_A, tb = flags & QKV_TRANS_B;
    const double *a1 = ta ? M_AT : M_A, *b1 = tb ? M_BT : M_B;
    double a2[12], b2[12], dc2[8], c_want[8], shared_want[6];
    for (int i = 0; i < 6; i++) {
        a2[i] = a1[i], a2[6 + i] = 2 * a1[i];
        b2[i] = b1[i], b2[6 + i] = 2 * b1[i];
    }
    for (int i = 0; i < 4; i++) dc2[i] = dc2[4 + i] = M_DC[i], c_want[i] = M_C[i], c_want[4 + i] = 2 * M_C[i];
    int64_t a_shape[3] = {2, ta ? 3 : 2, ta ? 2 : 3}, b_shape[3] = {2, tb ? 2 : 3, tb ? 3 : 2};
    qkv_ctx *ctx = new_ctx(1);
    qkv_tensor *a, *b;
    if (broadcast_a) {
        a = tensor_of(ctx, dt, 2, a_shape + 1, a1);
        b = tensor_of(ctx, dt, 3, b_shape, b2);
    } else {
        a = tensor_of(ctx, dt, 3, a_shape, a2);
        b = tensor_of(ctx, dt, 2, b_shape + 1, b1);
    }
    qkv_set_requires_grad(ctx, a, true);
    qkv_set_requires_grad(ctx, b, true);
    qkv_tensor *c = qkv_matmul(ctx, a, b, flags);
    cr_assert_not_null(c, "%s", qkv_errmsg(ctx));
    cr_expect(has_shape(c, 3, (int64_t[]){2, 2, 2}), "C is %s", QKV_SHAPE(c));
    cr_expect_eq(count_mismatch(c, c_want, 8, 1e-4), 0, "%s %s broadcast %c: wrong C", dt_name(dt),
                 flag_name(flags), broadcast_a ? 'A' : 'B');
    cr_assert_eq(qkv_backward(ctx, c, tensor_of(ctx, dt, 3, (int64_t[]){2, 2, 2}, dc2)), QKV_OK, "%s",
                 qkv_errmsg(ctx));
    /* the batched side's gradient depends only on the shared side and dC: the 2-D one in both batches */
    const double *g1 = broadcast_a ? (tb ? M_DBT : M_DB) : (ta ? M_DAT : M_DA);
    const double *s1 = broadcast_a ? (ta ? M_DAT : M_DA) : (tb ? M_DBT : M_DB);
    double batched_want[12];
    for (int i = 0; i < 6; i++) {
        batched_want[i] = batched_want[6 + i] = g1[i];
        shared_want[i] = 3 * s1[i];
    }
    qkv_tensor *batched = broadcast_a ? b : a, *shared = broadcast_a ? a : b;
    cr_expect_eq(count_mismatch(batched->grad, batched_want, 12, 1e-4), 0, "%s %s: wrong batched gradient",
                 dt_name(dt), flag_name(flags));
    cr_expect_eq(count_mismatch(shared->grad, shared_want, 6, 1e-4), 0,
                 "%s %s broadcast %c: the shared gradient must be the sum over the batch", dt_name(dt),
                 flag_name(flags), broadcast_a ? 'A' : 'B');
    qkv_ctx_free(ctx);
}

Test(matmul, hand_computed_broadcast_each_side) {
    for (int flags = 0; flags < 4; flags++)
        for (int side = 0; side < 2; side++) {
            matmul_broadcast_by_hand(QKV_F64, side, flags);
            matmul_broadcast_by_hand(QKV_F32, side, flags);
        }
}

Test(matmul, result_shapes) {
    qkv_ctx *ctx = new_ctx(1);
    qkv_tensor *a2 = qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){3, 4});
    qkv_tensor *b2 = qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){4, 5});
    qkv_tensor *a3 = qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){1, 3, 4});
    qkv_tensor *b3 = qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){6, 4, 5});
    cr_expect(has_shape(qkv_matmul(ctx, a2, b2, 0), 2, (int64_t[]){3, 5}), "2-D x 2-D is 2-D");
    cr_expect(has_shape(qkv_matmul(ctx, a3, b2, 0), 3, (int64_t[]){1, 3, 5}), "[1,3,4] x [4,5]");
    cr_expect(has_shape(qkv_matmul(ctx, a2, b3, 0), 3, (int64_t[]){6, 3, 5}), "[3,4] x [6,4,5]");
    cr_expect(has_shape(qkv_matmul(ctx, a3, b3, 0), 3, (int64_t[]){6, 3, 5}), "[1,3,4] x [6,4,5]");
    cr_expect(has_shape(qkv_matmul(ctx, a2, a2, QKV_TRANS_B), 2, (int64_t[]){3, 3}), "X X^T");
    cr_expect(has_shape(qkv_matmul(ctx, a2, a2, QKV_TRANS_A), 2, (int64_t[]){4, 4}), "X^T X");
    cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

/* Q K^T for the same tensor on both sides: both gradient contributions land in one tensor. */
Test(matmul, same_tensor_on_both_sides) {
    qkv_ctx *ctx = new_ctx(1);
    /* X = [[1,2],[3,4]], C = X X^T = [[5,11],[11,25]], dC = ones: dX = dC X + dC^T X = 2 * [[4,6],[4,6]] */
    qkv_tensor *x = tensor_of(ctx, QKV_F64, 2, (int64_t[]){2, 2}, (double[]){1, 2, 3, 4});
    qkv_set_requires_grad(ctx, x, true);
    qkv_tensor *c = qkv_matmul(ctx, x, x, QKV_TRANS_B);
    cr_assert_not_null(c);
    cr_expect_eq(count_mismatch(c, (double[]){5, 11, 11, 25}, 4, 0), 0);
    cr_assert_eq(qkv_backward(ctx, c, qkv_ones(ctx, QKV_F64, 2, (int64_t[]){2, 2})), QKV_OK);
    cr_expect_eq(count_mismatch(x->grad, (double[]){8, 12, 8, 12}, 4, 0), 0, "dX must hold both terms");
    qkv_ctx_free(ctx);
}

/* ---- scale: hand-computed ------------------------------------------------------------------------ */

Test(scale, hand_computed_values_and_gradient) {
    const double x_vals[4] = {1, -2, 3.5, 0.25}, dy_vals[4] = {1, 2, -3, 4};
    const double scales[5] = {-2, 1, 0, 0.5 /* 1/sqrt(4) */, 0.125};
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F32 : QKV_F64;
        for (int s = 0; s < 5; s++) {
            qkv_ctx *ctx = new_ctx(1);
            qkv_tensor *x = tensor_of(ctx, dt, 2, (int64_t[]){2, 2}, x_vals);
            qkv_set_requires_grad(ctx, x, true);
            qkv_tensor *y = qkv_scale(ctx, x, scales[s]);
            cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
            cr_expect(y != x, "a new tensor even for s = 1");
            cr_expect(has_shape(y, 2, (int64_t[]){2, 2}));
            double y_want[4], dx_want[4];
            for (int i = 0; i < 4; i++) {
                y_want[i] = scales[s] * x_vals[i];
                dx_want[i] = scales[s] * dy_vals[i];
            }
            cr_expect_eq(count_mismatch(y, y_want, 4, 0), 0, "%s s=%g: wrong y", dt_name(dt), scales[s]);
            cr_assert_eq(qkv_backward(ctx, y, tensor_of(ctx, dt, 2, (int64_t[]){2, 2}, dy_vals)), QKV_OK);
            cr_expect_eq(count_mismatch(x->grad, dx_want, 4, 0), 0, "%s s=%g: wrong dx", dt_name(dt),
                         scales[s]);
            qkv_ctx_free(ctx);
        }
    }
}

Test(scale, scalar_tensor_and_no_grad_mode) {
    qkv_ctx *ctx = new_ctx(1);
    qkv_tensor *x = qkv_scalar(ctx, QKV_F64, 3.0);
    qkv_set_requires_grad(ctx, x, true);
    qkv_set_grad_enabled(ctx, false);
    qkv_tensor *y = qkv_scale(ctx, x, -0.5);
    cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
    cr_expect_eq(y->ndim, 0);
    cr_expect_eq(qkv_f64(y)[0], -1.5);
    cr_expect_not(y->requires_grad, "no node is recorded with grad recording off");
    qkv_ctx_free(ctx);
}

/* ---- gradcheck over many configurations ---------------------------------------------------------- */

/* Every table below: random f64 inputs of the configuration's shapes, checked with seed 7 for R. */
static const qkv_gradcheck_options GC_OPTIONS = {.seed = 7};

/* projection */
typedef struct proj_config {
    const char *name;
    int x_ndim;
    int64_t x_shape[4];
    int64_t d_out;
    bool bias;
} proj_config;

static qkv_tensor *proj_fn(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)user;
    return qkv_projection(ctx, in[0], in[1], n > 2 ? in[2] : NULL);
}

static const proj_config PROJ_CONFIGS[] = {
    {"2-D [3,4] -> 5, bias", 2, {3, 4}, 5, true},
    {"2-D [3,4] -> 5, no bias", 2, {3, 4}, 5, false},
    {"n = 1 [1,4] -> 3, bias", 2, {1, 4}, 3, true},
    {"n = 1 [1,4] -> 3, no bias", 2, {1, 4}, 3, false},
    {"1-D [4] -> 3, bias", 1, {4}, 3, true},
    {"1-D [4] -> 2, no bias", 1, {4}, 2, false},
    {"square [4,4] -> 4, bias", 2, {4, 4}, 4, true},
    {"d_out = 1 [5,3] -> 1, bias", 2, {5, 3}, 1, true},
    {"d_in = 1 [5,1] -> 3, bias", 2, {5, 1}, 3, true},
    {"wide [2,7] -> 6, no bias", 2, {2, 7}, 6, false},
    {"3-D batch 2 [2,3,4] -> 5, bias", 3, {2, 3, 4}, 5, true},
    {"3-D batch 2 [2,3,4] -> 5, no bias", 3, {2, 3, 4}, 5, false},
    {"3-D n = 1 [3,1,4] -> 2, bias", 3, {3, 1, 4}, 2, true},
    {"3-D batch 1 [1,5,3] -> 4, bias", 3, {1, 5, 3}, 4, true},
    {"3-D non-square [4,2,6] -> 3, no bias", 3, {4, 2, 6}, 3, false},
    {"4-D [2,2,3,4] -> 3, bias", 4, {2, 2, 3, 4}, 3, true},
    {"4-D [2,2,3,4] -> 3, no bias", 4, {2, 2, 3, 4}, 3, false},
    {"4-D n = 1 [2,3,1,5] -> 2, bias", 4, {2, 3, 1, 5}, 2, true},
    {"4-D [1,2,4,3] -> 5, bias", 4, {1, 2, 4, 3}, 5, true},
    {"4-D d_out = 1 [2,1,3,2] -> 1, no bias", 4, {2, 1, 3, 2}, 1, false},
    {"d_model 8 -> d_k 4 [2,5,8], bias", 3, {2, 5, 8}, 4, true},
    {"d_model 6 -> d_v 9 [3,2,6], no bias", 3, {3, 2, 6}, 9, false},
};

static int proj_build(qkv_ctx *ctx, int c, void *user, qkv_tensor **in, void **fn_user) {
    (void)user, (void)fn_user;
    const proj_config *cfg = &PROJ_CONFIGS[c];
    int64_t d_in = cfg->x_shape[cfg->x_ndim - 1];
    in[0] = qkv_randn(ctx, QKV_F64, cfg->x_ndim, cfg->x_shape, 0.0, 1.0);
    in[1] = qkv_randn(ctx, QKV_F64, 2, (int64_t[]){d_in, cfg->d_out}, 0.0, 1.0);
    if (!cfg->bias) return 2;
    in[2] = qkv_randn(ctx, QKV_F64, 1, (int64_t[]){cfg->d_out}, 0.0, 1.0);
    return 3;
}

static void proj_name(char *buf, size_t size, int c, const void *user) {
    (void)user;
    snprintf(buf, size, "projection '%s'", PROJ_CONFIGS[c].name);
}

Test(projection, gradcheck_configurations) {
    int n_configs = (int)(sizeof PROJ_CONFIGS / sizeof PROJ_CONFIGS[0]);
    cr_expect_geq(n_configs, 20);
    gradcheck_table t = {n_configs, 1100, proj_build, proj_name, proj_fn, NULL, &GC_OPTIONS};
    check_gradcheck_table(&t, 500);
}

/* matmul */
typedef struct matmul_config {
    const char *name;
    int a_ndim;
    int64_t a_shape[4];
    int b_ndim;
    int64_t b_shape[4];
    int flags;
} matmul_config;

static qkv_tensor *matmul_fn(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)n;
    return qkv_matmul(ctx, in[0], in[1], ((const matmul_config *)user)->flags);
}

enum { TA = QKV_TRANS_A, TB = QKV_TRANS_B, TAB = QKV_TRANS_A | QKV_TRANS_B };

static const matmul_config MATMUL_CONFIGS[] = {
    {"2-D A B [3,4]x[4,5]", 2, {3, 4}, 2, {4, 5}, 0},
    {"2-D A^T B [4,3]x[4,5]", 2, {4, 3}, 2, {4, 5}, TA},
    {"2-D A B^T [3,4]x[5,4]", 2, {3, 4}, 2, {5, 4}, TB},
    {"2-D A^T B^T [4,3]x[5,4]", 2, {4, 3}, 2, {5, 4}, TAB},
    {"batch 3 A B [3,2,4]x[3,4,5]", 3, {3, 2, 4}, 3, {3, 4, 5}, 0},
    {"batch 3 A^T B [3,4,2]x[3,4,5]", 3, {3, 4, 2}, 3, {3, 4, 5}, TA},
    {"batch 3 Q K^T [3,5,4]x[3,6,4]", 3, {3, 5, 4}, 3, {3, 6, 4}, TB},
    {"batch 3 A^T B^T [3,4,2]x[3,5,4]", 3, {3, 4, 2}, 3, {3, 5, 4}, TAB},
    {"batch 2 A V [2,5,6]x[2,6,3]", 3, {2, 5, 6}, 3, {2, 6, 3}, 0},
    {"n = 1 Q K^T [2,1,4]x[2,1,4]", 3, {2, 1, 4}, 3, {2, 1, 4}, TB},
    {"n = 1 A V [2,1,1]x[2,1,3]", 3, {2, 1, 1}, 3, {2, 1, 3}, 0},
    {"k = 1 outer product [4,1]x[1,3]", 2, {4, 1}, 2, {1, 3}, 0},
    {"square [4,4]x[4,4]", 2, {4, 4}, 2, {4, 4}, 0},
    {"broadcast A 2-D, A B [3,4]x[2,4,5]", 2, {3, 4}, 3, {2, 4, 5}, 0},
    {"broadcast A 2-D, A^T B^T [4,3]x[3,5,4]", 2, {4, 3}, 3, {3, 5, 4}, TAB},
    {"broadcast A [1,..], A B^T [1,3,4]x[3,5,4]", 3, {1, 3, 4}, 3, {3, 5, 4}, TB},
    {"broadcast A [1,..], A^T B [1,4,3]x[2,4,2]", 3, {1, 4, 3}, 3, {2, 4, 2}, TA},
    {"broadcast B 2-D, A B [2,3,4]x[4,5]", 3, {2, 3, 4}, 2, {4, 5}, 0},
    {"broadcast B 2-D, A B^T [3,3,4]x[5,4]", 3, {3, 3, 4}, 2, {5, 4}, TB},
    {"broadcast B [1,..], A^T B [2,4,3]x[1,4,5]", 3, {2, 4, 3}, 3, {1, 4, 5}, TA},
    {"broadcast B [1,..], A^T B^T [3,4,2]x[1,5,4]", 3, {3, 4, 2}, 3, {1, 5, 4}, TAB},
    {"both batch 1 [1,3,4]x[1,4,2]", 3, {1, 3, 4}, 3, {1, 4, 2}, 0},
    {"3-D batch 1 with 2-D, A B^T [1,2,3]x[4,3]", 3, {1, 2, 3}, 2, {4, 3}, TB},
    {"non-square batch 4 A B [4,2,7]x[4,7,3]", 3, {4, 2, 7}, 3, {4, 7, 3}, 0},
};

static int matmul_build(qkv_ctx *ctx, int c, void *user, qkv_tensor **in, void **fn_user) {
    (void)user;
    const matmul_config *cfg = &MATMUL_CONFIGS[c];
    in[0] = qkv_randn(ctx, QKV_F64, cfg->a_ndim, cfg->a_shape, 0.0, 1.0);
    in[1] = qkv_randn(ctx, QKV_F64, cfg->b_ndim, cfg->b_shape, 0.0, 1.0);
    *fn_user = (void *)cfg;
    return 2;
}

static void matmul_name(char *buf, size_t size, int c, const void *user) {
    (void)user;
    snprintf(buf, size, "matmul '%s'", MATMUL_CONFIGS[c].name);
}

Test(matmul, gradcheck_configurations) {
    int n_configs = (int)(sizeof MATMUL_CONFIGS / sizeof MATMUL_CONFIGS[0]);
    int per_flag[4] = {0};
    for (int c = 0; c < n_configs; c++) per_flag[MATMUL_CONFIGS[c].flags]++;
    cr_expect_geq(n_configs, 20);
    cr_expect(per_flag[0] && per_flag[TA] && per_flag[TB] && per_flag[TAB], "every flag combination");
    gradcheck_table t = {n_configs, 1200, matmul_build, matmul_name, matmul_fn, NULL, &GC_OPTIONS};
    check_gradcheck_table(&t, 1000);
}

/* X X^T and X^T X with one input: both gradient terms land in the same tensor. */
static qkv_tensor *gram_fn(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)n;
    return qkv_matmul(ctx, in[0], in[0], *(const int *)user);
}

/* X X^T [2,3,4] (flags B^T) and X^T X [3,5] (flags A^T) */
static const struct {
    const char *name;
    int flags, ndim;
    int64_t shape[3];
} GRAM_CONFIGS[] = {{"X X^T [2,3,4]", TB, 3, {2, 3, 4}}, {"X^T X [3,5]", TA, 2, {3, 5}}};

static int gram_build(qkv_ctx *ctx, int c, void *user, qkv_tensor **in, void **fn_user) {
    (void)user;
    in[0] = qkv_randn(ctx, QKV_F64, GRAM_CONFIGS[c].ndim, GRAM_CONFIGS[c].shape, 0.0, 1.0);
    *fn_user = (void *)&GRAM_CONFIGS[c].flags;
    return 1;
}

static void gram_name(char *buf, size_t size, int c, const void *user) {
    (void)user;
    snprintf(buf, size, "matmul '%s'", GRAM_CONFIGS[c].name);
}

Test(matmul, gradcheck_same_input_twice) {
    gradcheck_table t = {2, 1300, gram_build, gram_name, gram_fn, NULL, &GC_OPTIONS};
    check_gradcheck_table(&t, 30);
}

/* scale */
typedef struct scale_config {
    const char *name;
    int ndim;
    int64_t shape[4];
    double s;
} scale_config;

static qkv_tensor *scale_fn(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)n;
    return qkv_scale(ctx, in[0], ((const scale_config *)user)->s);
}

static const scale_config SCALE_CONFIGS[] = {
    {"s = 1 [3,4]", 2, {3, 4}, 1.0},
    {"s = 1/sqrt(4) [2,3,3]", 3, {2, 3, 3}, 0.5},
    {"s = 1/sqrt(8) [2,5,5]", 3, {2, 5, 5}, 0.35355339059327373},
    {"s = 1/sqrt(64) [1,4,4]", 3, {1, 4, 4}, 0.125},
    {"s = 0.125 [3,2,6]", 3, {3, 2, 6}, 0.125},
    {"s = -2 [2,3]", 2, {2, 3}, -2.0},
    {"s = -2 [2,2,2,2]", 4, {2, 2, 2, 2}, -2.0},
    {"s = 0 [3,3]", 2, {3, 3}, 0.0},
    {"s = 1/sqrt(3) [4,3]", 2, {4, 3}, 0.57735026918962584},
    {"s = 10 [5]", 1, {5}, 10.0},
    {"s = 1e-3 [2,4]", 2, {2, 4}, 1e-3},
    {"s = -0.7 [1,1]", 2, {1, 1}, -0.7},
    {"s = 1 n = 1 [3,1,4]", 3, {3, 1, 4}, 1.0},
    {"s = 1/sqrt(16) [2,1,5]", 3, {2, 1, 5}, 0.25},
    {"s = 3 scalar", 0, {0}, 3.0},
    {"s = -1 [6]", 1, {6}, -1.0},
    {"s = 2.5 [2,3,4,2]", 4, {2, 3, 4, 2}, 2.5},
    {"s = 0.125 non-square [7,2]", 2, {7, 2}, 0.125},
    {"s = -2 [1,6,1]", 3, {1, 6, 1}, -2.0},
    {"s = 1e3 [2,2]", 2, {2, 2}, 1e3},
    {"s = 1/sqrt(5) [5,5]", 2, {5, 5}, 0.44721359549995793},
};

static int scale_build(qkv_ctx *ctx, int c, void *user, qkv_tensor **in, void **fn_user) {
    (void)user;
    const scale_config *cfg = &SCALE_CONFIGS[c];
    in[0] = qkv_randn(ctx, QKV_F64, cfg->ndim, cfg->shape, 0.0, 1.0);
    *fn_user = (void *)cfg;
    return 1;
}

static void scale_name(char *buf, size_t size, int c, const void *user) {
    (void)user;
    snprintf(buf, size, "scale '%s'", SCALE_CONFIGS[c].name);
}

Test(scale, gradcheck_configurations) {
    int n_configs = (int)(sizeof SCALE_CONFIGS / sizeof SCALE_CONFIGS[0]);
    cr_expect_geq(n_configs, 20);
    gradcheck_table t = {n_configs, 1400, scale_build, scale_name, scale_fn, NULL, &GC_OPTIONS};
    check_gradcheck_table(&t, 200);
}

/* ---- f32 against f64 ----------------------------------------------------------------------------- */

static double norm2(const qkv_tensor *t) {
    double sum = 0;
    for (int64_t i = 0; t && i < t->numel; i++) sum += at(t, i) * at(t, i);
    return t ? sqrt(sum) : 0.0;
}

/* rel_norm_err of a against b, or inf when either is missing or their sizes differ. */
static double rel_err(const qkv_tensor *a, const qkv_tensor *b) {
    return a && b && a->numel == b->numel ? rel_norm_err(a, b) : INFINITY;
}

typedef enum { OP_PROJ, OP_MATMUL, OP_SCALE } op_kind;

typedef struct mixed_config {
    const char *name;
    op_kind op;
    int n_in;
    int ndims[3];
    int64_t shapes[3][4];
    int flags;
    double s;
} mixed_config;

static qkv_tensor *apply(qkv_ctx *ctx, const mixed_config *cfg, qkv_tensor **in) {
    switch (cfg->op) {
    case OP_PROJ: return qkv_projection(ctx, in[0], in[1], cfg->n_in > 2 ? in[2] : NULL);
    case OP_MATMUL: return qkv_matmul(ctx, in[0], in[1], cfg->flags);
    default: return qkv_scale(ctx, in[0], cfg->s);
    }
}

static const mixed_config MIXED_CONFIGS[] = {
    {"projection [4,16,32]x[32,24]+b", OP_PROJ, 3, {3, 2, 1}, {{4, 16, 32}, {32, 24}, {24}}, 0, 0},
    {"projection [2,3,9,40]x[40,8]", OP_PROJ, 2, {4, 2}, {{2, 3, 9, 40}, {40, 8}}, 0, 0},
    {"projection [1,64]x[64,64]+b", OP_PROJ, 3, {2, 2, 1}, {{1, 64}, {64, 64}, {64}}, 0, 0},
    {"matmul A B [3,17,33]x[3,33,9]", OP_MATMUL, 2, {3, 3}, {{3, 17, 33}, {3, 33, 9}}, 0, 0},
    {"matmul A^T B [3,33,17]x[3,33,9]", OP_MATMUL, 2, {3, 3}, {{3, 33, 17}, {3, 33, 9}}, TA, 0},
    {"matmul Q K^T [4,20,16]x[4,24,16]", OP_MATMUL, 2, {3, 3}, {{4, 20, 16}, {4, 24, 16}}, TB, 0},
    {"matmul A^T B^T [2,33,17]x[2,9,33]", OP_MATMUL, 2, {3, 3}, {{2, 33, 17}, {2, 9, 33}}, TAB, 0},
    {"matmul broadcast A [20,16]x[5,16,12]", OP_MATMUL, 2, {2, 3}, {{20, 16}, {5, 16, 12}}, 0, 0},
    {"matmul broadcast B [5,20,16]x[1,12,16]", OP_MATMUL, 2, {3, 3}, {{5, 20, 16}, {1, 12, 16}}, TB, 0},
    {"scale 1/sqrt(64) [4,32,32]", OP_SCALE, 1, {3}, {{4, 32, 32}}, 0, 0.125},
    {"scale -2 [3,50]", OP_SCALE, 1, {2}, {{3, 50}}, 0, -2.0},
    {"scale 1 [100]", OP_SCALE, 1, {1}, {{100}}, 0, 1.0},
    {"scale 1/sqrt(3) [7,9]", OP_SCALE, 1, {2}, {{7, 9}}, 0, 0.57735026918962584},
};

/* Each configuration in its own context: the inputs are parameters (drawn in f32 and widened, so both
 * paths see exactly the same numbers) whose gradients outlive a step; step 1 runs f64 forward + backward,
 * step 2 runs f32, both with the same upstream gradient. */
Test(linear_ops, f32_against_f64) {
    int n_configs = (int)(sizeof MIXED_CONFIGS / sizeof MIXED_CONFIGS[0]), failures = 0, compared = 0;
    char report[8192] = "";
    for (int c = 0; c < n_configs; c++) {
        const mixed_config *cfg = &MIXED_CONFIGS[c];
        qkv_ctx *ctx = new_ctx(100 + (uint64_t)c);
        qkv_tensor *p32[3], *p64[3];
        for (int i = 0; i < cfg->n_in; i++) {
            qkv_tensor *src = qkv_randn(ctx, QKV_F32, cfg->ndims[i], cfg->shapes[i], 0.0, 1.0);
            p32[i] = qkv_param(ctx, src);
            p64[i] = qkv_param(ctx, qkv_to_dtype(ctx, src, QKV_F64));
        }
        qkv_tensor *y64 = apply(ctx, cfg, p64);
        cr_assert_not_null(y64, "%s: %s", cfg->name, qkv_errmsg(ctx));
        qkv_tensor *dy32 = qkv_keep(ctx, qkv_randn(ctx, QKV_F32, y64->ndim, y64->shape, 0.0, 1.0));
        qkv_tensor *dy64 = qkv_keep(ctx, qkv_to_dtype(ctx, dy32, QKV_F64));
        qkv_tensor *y64_kept = qkv_keep(ctx, y64);
        cr_assert_eq(qkv_backward(ctx, y64, dy64), QKV_OK, "%s: %s", cfg->name, qkv_errmsg(ctx));
        qkv_step_end(ctx);
        qkv_tensor *y32 = apply(ctx, cfg, p32);
        cr_assert_not_null(y32, "%s: %s", cfg->name, qkv_errmsg(ctx));
        cr_assert_eq(y32->dtype, QKV_F32);
        cr_assert_eq(qkv_backward(ctx, y32, dy32), QKV_OK, "%s: %s", cfg->name, qkv_errmsg(ctx));

        double worst = rel_err(y32, y64_kept);
        const char *worst_name = "output";
        static const char *grad_names[3] = {"input 0 gradient", "input 1 gradient", "input 2 gradient"};
        for (int i = 0; i < cfg->n_in; i++) {
            double e = rel_err(p32[i]->grad, p64[i]->grad);
            if (!(e <= worst)) worst = e, worst_name = grad_names[i];
            /* a gradient that never arrived would compare as equal zeros: require a non-zero f64 gradient */
            if (!(norm2(p64[i]->grad) > 0))
                worst = INFINITY, worst_name = grad_names[i];
        }
        if (!(worst < 1e-4)) {
            failures++;
            size_t len = strlen(report);
            snprintf(report + len, sizeof report - len, "\n  %s: %s relative error %g", cfg->name, worst_name,
                     worst);
        }
        compared++;
        qkv_ctx_free(ctx);
    }
    cr_expect_eq(compared, n_configs);
    cr_expect_eq(failures, 0, "%d of %d configurations over 1e-4:%s", failures, n_configs, report);
}

/* ---- bad input ----------------------------------------------------------------------------------- */

/* One misuse: up to three tensors (ndim -1 means NULL), the call, the code and what the message says. */
typedef struct err_case {
    const char *name;
    op_kind op;
    qkv_dtype dt[3];
    int ndim[3];
    int64_t shape[3][4];
    int flags;
    double s;
    qkv_status want;
    const char *needles[4];
} err_case;

#define F32 QKV_F32
#define F64 QKV_F64
#define NONE -1

static const err_case ERR_CASES[] = {
    /* projection: x, w, b */
    {"projection: x is i32", OP_PROJ, {QKV_I32, F32, F32}, {2, 2, NONE}, {{2, 3}, {3, 4}}, 0, 0,
     QKV_ERR_DTYPE, {"qkv_projection", "x", "[2,3]", "i32"}},
    {"projection: w is u8", OP_PROJ, {F32, QKV_U8, F32}, {2, 2, NONE}, {{2, 3}, {3, 4}}, 0, 0,
     QKV_ERR_DTYPE, {"qkv_projection", "w", "[3,4]", "u8"}},
    {"projection: x f32, w f64", OP_PROJ, {F32, F64, F32}, {2, 2, NONE}, {{2, 3}, {3, 4}}, 0, 0,
     QKV_ERR_DTYPE, {"qkv_projection", "[2,3]", "[3,4]", "f64"}},
    {"projection: b f64 with f32 x", OP_PROJ, {F32, F32, F64}, {2, 2, 1}, {{2, 3}, {3, 4}, {4}}, 0, 0,
     QKV_ERR_DTYPE, {"qkv_projection", "[2,3]", "[4]", "f64"}},
    {"projection: w 3-D", OP_PROJ, {F64, F64, F64}, {2, 3, NONE}, {{2, 3}, {1, 3, 4}}, 0, 0, QKV_ERR_RANK,
     {"qkv_projection", "[2,3]", "[1,3,4]", "2-D"}},
    {"projection: w 1-D", OP_PROJ, {F64, F64, F64}, {2, 1, NONE}, {{2, 3}, {3}}, 0, 0, QKV_ERR_RANK,
     {"qkv_projection", "[2,3]", "[3]", "2-D"}},
    {"projection: x a scalar", OP_PROJ, {F64, F64, F64}, {0, 2, NONE}, {{0}, {1, 4}}, 0, 0, QKV_ERR_RANK,
     {"qkv_projection", "[]", "[1,4]", NULL}},
    {"projection: inner dims differ", OP_PROJ, {F64, F64, F64}, {3, 2, NONE}, {{2, 3, 4}, {5, 6}}, 0, 0,
     QKV_ERR_SHAPE, {"qkv_projection", "[2,3,4]", "[5,6]", "4 and 5"}},
    {"projection: inner dims differ, 4-D x", OP_PROJ, {F32, F32, F32}, {4, 2, NONE}, {{2, 2, 3, 7}, {6, 6}},
     0, 0, QKV_ERR_SHAPE, {"qkv_projection", "[2,2,3,7]", "[6,6]", "7 and 6"}},
    {"projection: b has d_in entries", OP_PROJ, {F64, F64, F64}, {2, 2, 1}, {{2, 4}, {4, 6}, {4}}, 0, 0,
     QKV_ERR_SHAPE, {"qkv_projection", "[4,6]", "[4]", "[6]"}},
    {"projection: b is 2-D", OP_PROJ, {F64, F64, F64}, {2, 2, 2}, {{2, 4}, {4, 6}, {1, 6}}, 0, 0,
     QKV_ERR_SHAPE, {"qkv_projection", "[4,6]", "[1,6]", NULL}},
    {"projection: x NULL", OP_PROJ, {F64, F64, F64}, {NONE, 2, NONE}, {{0}, {4, 6}}, 0, 0, QKV_ERR_NULL,
     {"qkv_projection", "x", NULL, NULL}},
    {"projection: w NULL", OP_PROJ, {F64, F64, F64}, {2, NONE, NONE}, {{2, 4}}, 0, 0, QKV_ERR_NULL,
     {"qkv_projection", "w", NULL, NULL}},
    /* matmul: a, b */
    {"matmul: inner dims differ", OP_MATMUL, {F64, F64}, {3, 3}, {{2, 3, 4}, {2, 5, 6}}, 0, 0, QKV_ERR_SHAPE,
     {"qkv_matmul", "[2,3,4]", "[2,5,6]", "4 and 5"}},
    {"matmul: inner dims differ, TRANS_A", OP_MATMUL, {F64, F64}, {3, 3}, {{2, 4, 3}, {2, 5, 6}}, TA, 0,
     QKV_ERR_SHAPE, {"qkv_matmul", "[2,4,3]", "[2,5,6]", "4 and 5"}},
    {"matmul: inner dims differ, TRANS_B", OP_MATMUL, {F32, F32}, {3, 3}, {{2, 3, 4}, {2, 6, 5}}, TB, 0,
     QKV_ERR_SHAPE, {"qkv_matmul", "[2,3,4]", "[2,6,5]", "4 and 5"}},
    {"matmul: inner dims differ, both", OP_MATMUL, {F64, F64}, {2, 2}, {{4, 3}, {6, 5}}, TAB, 0,
     QKV_ERR_SHAPE, {"qkv_matmul", "[4,3]", "[6,5]", "4 and 5"}},
    {"matmul: Q K^T without TRANS_B", OP_MATMUL, {F64, F64}, {3, 3}, {{2, 5, 4}, {2, 6, 4}}, 0, 0,
     QKV_ERR_SHAPE, {"qkv_matmul", "[2,5,4]", "[2,6,4]", "4 and 6"}},
    {"matmul: batches differ", OP_MATMUL, {F64, F64}, {3, 3}, {{2, 3, 4}, {3, 4, 5}}, 0, 0, QKV_ERR_SHAPE,
     {"qkv_matmul", "[2,3,4]", "[3,4,5]", "2 and 3"}},
    {"matmul: a 1-D", OP_MATMUL, {F64, F64}, {1, 2}, {{4}, {4, 5}}, 0, 0, QKV_ERR_RANK,
     {"qkv_matmul", "[4]", "[4,5]", NULL}},
    {"matmul: b 4-D", OP_MATMUL, {F64, F64}, {3, 4}, {{2, 3, 4}, {1, 2, 4, 5}}, 0, 0, QKV_ERR_RANK,
     {"qkv_matmul", "[2,3,4]", "[1,2,4,5]", NULL}},
    {"matmul: unknown flag", OP_MATMUL, {F64, F64}, {2, 2}, {{3, 4}, {4, 5}}, 4, 0, QKV_ERR_ARG,
     {"qkv_matmul", "[3,4]", "[4,5]", "flags 4"}},
    {"matmul: dtypes differ", OP_MATMUL, {F32, F64}, {2, 2}, {{3, 4}, {4, 5}}, 0, 0, QKV_ERR_DTYPE,
     {"qkv_matmul", "[3,4]", "[4,5]", "f32"}},
    {"matmul: a is i32", OP_MATMUL, {QKV_I32, QKV_I32}, {2, 2}, {{3, 4}, {4, 5}}, 0, 0, QKV_ERR_DTYPE,
     {"qkv_matmul", "[3,4]", "i32", NULL}},
    {"matmul: b NULL", OP_MATMUL, {F64, F64}, {2, NONE}, {{3, 4}}, 0, 0, QKV_ERR_NULL,
     {"qkv_matmul", "b", NULL, NULL}},
    /* scale: x */
    {"scale: s NaN", OP_SCALE, {F64}, {2}, {{2, 3}}, 0, NAN, QKV_ERR_ARG,
     {"qkv_scale", "[2,3]", "nan", NULL}},
    {"scale: s +inf", OP_SCALE, {F32}, {3}, {{2, 3, 4}}, 0, INFINITY, QKV_ERR_ARG,
     {"qkv_scale", "[2,3,4]", "inf", NULL}},
    {"scale: s -inf", OP_SCALE, {F64}, {1}, {{5}}, 0, -INFINITY, QKV_ERR_ARG,
     {"qkv_scale", "[5]", "-inf", NULL}},
    {"scale: x is u8", OP_SCALE, {QKV_U8}, {2}, {{2, 3}}, 0, 2.0, QKV_ERR_DTYPE,
     {"qkv_scale", "[2,3]", "u8", NULL}},
    {"scale: x NULL", OP_SCALE, {F64}, {NONE}, {{0}}, 0, 2.0, QKV_ERR_NULL, {"qkv_scale", "x", NULL, NULL}},
};

static qkv_tensor *err_apply(qkv_ctx *ctx, const err_case *e, qkv_tensor **t) {
    switch (e->op) {
    case OP_PROJ: return qkv_projection(ctx, t[0], t[1], t[2]);
    case OP_MATMUL: return qkv_matmul(ctx, t[0], t[1], e->flags);
    default: return qkv_scale(ctx, t[0], e->s);
    }
}

Test(linear_ops, bad_input_table) {
    int n_cases = (int)(sizeof ERR_CASES / sizeof ERR_CASES[0]), failures = 0;
    char report[8192] = "";
    for (int c = 0; c < n_cases; c++) {
        const err_case *e = &ERR_CASES[c];
        qkv_ctx *ctx = new_ctx(1);
        qkv_tensor *t[3] = {NULL, NULL, NULL};
        int n_tensors = e->op == OP_PROJ ? 3 : e->op == OP_MATMUL ? 2 : 1;
        for (int i = 0; i < n_tensors; i++)
            if (e->ndim[i] != NONE) t[i] = qkv_zeros(ctx, e->dt[i], e->ndim[i], e->shape[i]);
        bool ok = qkv_error(ctx) == QKV_OK; /* the setup itself is valid */
        qkv_tensor *y = ok ? err_apply(ctx, e, t) : NULL;
        ok = ok && y == NULL && qkv_error(ctx) == e->want;
        const char *msg = qkv_errmsg(ctx);
        for (int k = 0; k < 4 && ok; k++)
            if (e->needles[k] && !strstr(msg, e->needles[k])) ok = false;
        /* sticky: a valid call on the errored context returns NULL and keeps the first message */
        qkv_tensor *ok_x = ok ? qkv_scale(ctx, NULL, 1.0) : NULL;
        ok = ok && ok_x == NULL && qkv_error(ctx) == e->want && strstr(qkv_errmsg(ctx), e->needles[0]);
        if (!ok) {
            failures++;
            size_t len = strlen(report);
            snprintf(report + len, sizeof report - len, "\n  %s: got %s \"%s\", want %s", e->name,
                     qkv_status_name(qkv_error(ctx)), qkv_errmsg(ctx), qkv_status_name(e->want));
        }
        qkv_ctx_free(ctx);
    }
    cr_expect_eq(failures, 0, "%d of %d misuse cases wrong:%s", failures, n_cases, report);
}

/* The design guide's example message, word for word. */
Test(linear_ops, matmul_message_matches_the_design_guide) {
    qkv_ctx *ctx = new_ctx(1);
    qkv_tensor *a = qkv_zeros(ctx, QKV_F32, 3, (int64_t[]){2, 3, 4});
    qkv_tensor *b = qkv_zeros(ctx, QKV_F32, 3, (int64_t[]){2, 5, 6});
    cr_expect_null(qkv_matmul(ctx, a, b, 0));
    cr_expect_str_eq(qkv_errmsg(ctx),
                     "qkv_matmul: a is [2,3,4], b is [2,5,6]: inner dimensions 4 and 5 differ");
    qkv_ctx_free(ctx);
}

/* An errored context or a NULL context: every operator returns NULL at once. */
Test(linear_ops, errored_context_short_circuits) {
    qkv_ctx *ctx = new_ctx(1);
    qkv_tensor *x = qkv_ones(ctx, QKV_F64, 2, (int64_t[]){2, 2});
    cr_expect_null(qkv_projection(NULL, x, x, NULL));
    cr_expect_null(qkv_matmul(NULL, x, x, 0));
    cr_expect_null(qkv_scale(NULL, x, 2.0));
    cr_expect_null(qkv_scale(ctx, x, NAN));
    cr_expect_null(qkv_projection(ctx, x, x, NULL));
    cr_expect_null(qkv_matmul(ctx, x, x, 0));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_ARG);
    qkv_clear_error(ctx);
    cr_expect_not_null(qkv_matmul(ctx, x, x, 0), "works again after qkv_clear_error");
    qkv_ctx_free(ctx);
}

/* The header's promise: the mean of an empty tensor is NaN (0 / 0, as PyTorch), in f32 and f64, not an error,
 * and a backward through it succeeds and touches no element; the sum of one is 0. */
Test(reduce_all, empty_tensor_mean_is_nan_and_sum_is_zero) {
    for (int d = 0; d < 2; d++) {
        qkv_ctx *c = new_ctx(1);
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_tensor *x = qkv_zeros(c, dt, 2, (int64_t[]){0, 3});
        qkv_set_requires_grad(c, x, true);
        qkv_tensor *m = qkv_mean(c, x), *s = qkv_sum(c, x);
        cr_assert_eq(qkv_error(c), QKV_OK, "%s", qkv_errmsg(c));
        cr_assert(m && m->ndim == 0 && isnan(qkv_get_flat(c, m, 0)), "mean of [0,3] %s", qkv_dtype_name(dt));
        cr_assert(s && qkv_get_flat(c, s, 0) == 0.0);
        cr_assert_eq(qkv_backward(c, m, NULL), QKV_OK, "%s", qkv_errmsg(c));
        cr_assert(x->grad && x->grad->numel == 0);
        qkv_ctx_free(c);
    }
}
