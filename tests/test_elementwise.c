/*
 * test_elementwise.c — the operators of qkv/elementwise.h: values and gradients against PyTorch 1.13
 * (tests/data/elementwise/, from tests/tools/make_elementwise_golden.py), gradcheck in f64 over odd shapes and
 * broadcasts, f32 against f64, the edges each header comment promises, and misuse.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "qkv_internal.h"
#include "../ops/kernels/unary_kernels.h"
#include "../ops/exp_sums.h"
#include "../ops/row_sums.h"
#include "test_ops.h"

static qkv_tensor *load_data(qkv_ctx *ctx, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/elementwise/%s.npy", QKV_TEST_DATA, name);
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

typedef qkv_tensor *(*unary_op)(qkv_ctx *, qkv_tensor *);
static qkv_tensor *op_pow_2(qkv_ctx *c, qkv_tensor *x) { return qkv_pow_scalar(c, x, 2.0); }
static qkv_tensor *op_pow_half(qkv_ctx *c, qkv_tensor *x) { return qkv_pow_scalar(c, x, 0.5); }
static qkv_tensor *op_pow_m15(qkv_ctx *c, qkv_tensor *x) { return qkv_pow_scalar(c, x, -1.5); }
static qkv_tensor *op_pow_3(qkv_ctx *c, qkv_tensor *x) { return qkv_pow_scalar(c, x, 3.0); }
static qkv_tensor *op_pow_0(qkv_ctx *c, qkv_tensor *x) { return qkv_pow_scalar(c, x, 0.0); }
static qkv_tensor *op_clamp_a(qkv_ctx *c, qkv_tensor *x) { return qkv_clamp(c, x, -1.0, 0.5); }
static qkv_tensor *op_clamp_b(qkv_ctx *c, qkv_tensor *x) { return qkv_clamp(c, x, -INFINITY, 0.0); }
static qkv_tensor *op_clamp_c(qkv_ctx *c, qkv_tensor *x) { return qkv_clamp(c, x, 0.25, INFINITY); }
static qkv_tensor *op_add_s(qkv_ctx *c, qkv_tensor *x) { return qkv_add_scalar(c, x, 2.5); }
static qkv_tensor *op_mul_s(qkv_ctx *c, qkv_tensor *x) { return qkv_mul_scalar(c, x, -1.5); }

static const struct {
    const char *golden;
    unary_op op;
} unary_ops[] = {
    {"exp", qkv_exp},         {"log", qkv_log},           {"sqrt", qkv_sqrt},         {"rsqrt", qkv_rsqrt},
    {"tanh", qkv_tanh},       {"sigmoid", qkv_sigmoid},   {"softplus", qkv_softplus}, {"abs", qkv_abs},
    {"neg", qkv_neg},         {"square", qkv_square},     {"pow_2", op_pow_2},        {"pow_0.5", op_pow_half},
    {"pow_-1.5", op_pow_m15}, {"pow_3", op_pow_3},        {"pow_0", op_pow_0},        {"clamp_-1_0.5", op_clamp_a},
    {"clamp_-inf_0", op_clamp_b}, {"clamp_0.25_inf", op_clamp_c}, {"add_scalar_2.5", op_add_s},
    {"mul_scalar_-1.5", op_mul_s},
};
#define N_UNARY ((int)(sizeof unary_ops / sizeof unary_ops[0]))

/* Every unary operator's values and gradients at 16 points (both signs, 0, +-1e-3, +-30: overflow, the edges
 * of log, sqrt and rsqrt at 0 and below) equal PyTorch 1.13's in f64, NaN and inf included. */
Test(elementwise, unary_values_and_gradients_match_pytorch) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *dy = qkv_keep(ctx, load_data(ctx, "dy"));
    for (int k = 0; k < N_UNARY; k++) {
        qkv_tensor *g = load_data(ctx, unary_ops[k].golden); /* [3, n]: x, y, dx */
        int64_t n = g->shape[1];
        qkv_tensor *x = qkv_from_data(ctx, QKV_F64, 1, &n, qkv_f64(g));
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *y = unary_ops[k].op(ctx, x);
        cr_assert_not_null(y, "%s: %s", unary_ops[k].golden, qkv_errmsg(ctx));
        cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
        for (int64_t i = 0; i < n; i++) {
            double xi = qkv_f64(g)[i], want_y = qkv_f64(g)[n + i], want_dx = qkv_f64(g)[2 * n + i];
            cr_expect(same(qkv_f64(y)[i], want_y), "%s(%g) = %.17g, PyTorch %.17g", unary_ops[k].golden, xi,
                      qkv_f64(y)[i], want_y);
            cr_expect(same(qkv_f64(x->grad)[i], want_dx), "%s'(%g): dx %.17g, PyTorch %.17g", unary_ops[k].golden, xi,
                      qkv_f64(x->grad)[i], want_dx);
        }
        qkv_step_end(ctx);
    }
    qkv_ctx_free(ctx);
}

typedef qkv_tensor *(*binary_op)(qkv_ctx *, qkv_tensor *, qkv_tensor *);

static qkv_tensor *param_of(qkv_ctx *ctx, qkv_tensor *t) {
    qkv_tensor *p = qkv_from_data(ctx, t->dtype, t->ndim, t->shape, t->data);
    qkv_set_requires_grad(ctx, p, true);
    return p;
}

static void expect_all_same(const qkv_tensor *got, const qkv_tensor *want, const char *what) {
    cr_assert_eq(got->numel, want->numel, "%s: %lld elements, want %lld", what, (long long)got->numel,
                 (long long)want->numel);
    for (int d = 0; d < want->ndim; d++) cr_expect_eq(got->shape[d], want->shape[d], "%s: dimension %d", what, d);
    for (int64_t i = 0; i < want->numel; i++)
        cr_expect(same(qkv_f64_const(got)[i], qkv_f64_const(want)[i]), "%s[%lld] = %.17g, PyTorch %.17g", what,
                  (long long)i, qkv_f64_const(got)[i], qkv_f64_const(want)[i]);
}

/* div, maximum and minimum of a [2, 3, 1] and b [3, 4] (broadcast both ways to [2, 3, 4], with a tie), and
 * where(mask [2, 1, 4], a [2, 3, 4], b [4]): values and both gradients equal PyTorch 1.13's. */
Test(elementwise, broadcast_binary_values_and_gradients_match_pytorch) {
    const char *names[] = {"div", "maximum", "minimum", "where"};
    binary_op ops[] = {qkv_div, qkv_maximum, qkv_minimum, NULL};
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int k = 0; k < 4; k++) {
        char key[64];
#define LOAD(part) (snprintf(key, sizeof key, "%s_%s", names[k], part), load_data(ctx, key))
        qkv_tensor *a = param_of(ctx, LOAD("a")), *b = param_of(ctx, LOAD("b"));
        qkv_tensor *z = ops[k] ? ops[k](ctx, a, b) : qkv_where(ctx, LOAD("mask"), a, b);
        cr_assert_not_null(z, "%s: %s", names[k], qkv_errmsg(ctx));
        cr_assert_eq(qkv_backward(ctx, z, LOAD("dz")), QKV_OK, "%s", qkv_errmsg(ctx));
        char what[64];
        snprintf(what, sizeof what, "%s z", names[k]);
        expect_all_same(z, LOAD("z"), what);
        snprintf(what, sizeof what, "%s da", names[k]);
        expect_all_same(a->grad, LOAD("da"), what);
        snprintf(what, sizeof what, "%s db", names[k]);
        expect_all_same(b->grad, LOAD("db"), what);
#undef LOAD
        qkv_step_end(ctx);
    }
    qkv_ctx_free(ctx);
}

/* ---- gradcheck over odd shapes and broadcasts ----------------------------------------------------- */

typedef struct op_case {
    int which; /* index into unary_ops, or -1 - k for binary op k (div, maximum, minimum, where) */
} op_case;

static qkv_tensor *apply(qkv_ctx *ctx, qkv_tensor *const *in, int n_in, void *user) {
    (void)n_in;
    int which = ((const op_case *)user)->which;
    if (which >= 0) return unary_ops[which].op(ctx, in[0]);
    switch (-1 - which) {
    case 0: return qkv_div(ctx, in[0], in[1]);
    case 1: return qkv_maximum(ctx, in[0], in[1]);
    case 2: return qkv_minimum(ctx, in[0], in[1]);
    default: { // a mask that keeps every other element of the broadcast shape's last dimension
        int64_t last = in[0]->shape[in[0]->ndim - 1] > in[1]->shape[in[1]->ndim - 1] ? in[0]->shape[in[0]->ndim - 1]
                                                                                    : in[1]->shape[in[1]->ndim - 1];
        qkv_tensor *m = qkv_zeros(ctx, QKV_U8, 1, &last);
        for (int64_t j = 0; m && j < last; j += 2) qkv_u8(m)[j] = 1;
        return qkv_where(ctx, m, in[0], in[1]);
    }
    }
}

/* Inputs kept away from each operator's kinks and poles (gradcheck differentiates numerically): positive
 * for log, sqrt, rsqrt and the fractional powers, apart from ties and clamp bounds by at least 0.05. */
static void fill(qkv_tensor *t, int which, int salt) {
    for (int64_t i = 0; i < t->numel; i++) {
        double u = sin(1.7 * (double)i + 0.9 * salt) * 2.0; // in [-2, 2]
        if (fabs(u) < 0.1) u += 0.3;
        bool positive = which >= 0 && (strncmp(unary_ops[which].golden, "log", 3) == 0 ||
                                       strncmp(unary_ops[which].golden, "sqrt", 4) == 0 ||
                                       strncmp(unary_ops[which].golden, "rsqrt", 5) == 0 ||
                                       strncmp(unary_ops[which].golden, "pow_0.5", 7) == 0 ||
                                       strncmp(unary_ops[which].golden, "pow_-1.5", 8) == 0);
        if (positive || which == -1) u = fabs(u) + 0.2; // div: b away from 0 (a too, harmless)
        for (double bound = -1.0; bound <= 0.5; bound += 0.25) // clamp bounds -1, 0, 0.25, 0.5
            if (fabs(u - bound) < 0.05) u += 0.1;
        qkv_f64(t)[i] = u + (which <= -2 && which >= -3 ? 0.013 * salt : 0.0); // no ties for maximum/minimum
    }
}

Test(elementwise, gradcheck_in_f64_over_odd_shapes_and_broadcasts) {
    static const int64_t sizes[] = {1, 3, 7, 33};
    int64_t checked = 0, runs = 0;
    for (int which = -4; which < N_UNARY; which++) {
        for (int s = 0; s < 4; s++) {
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            int64_t n = sizes[s];
            qkv_tensor *in[2];
            int n_in = which >= 0 ? 1 : 2;
            if (which >= 0) {
                in[0] = qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){2, 3, n}); // batch 2
            } else {                                                     // [2, 1, n] op [3, 1] -> [2, 3, n]
                in[0] = qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){2, 1, n});
                in[1] = qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){3, 1});
            }
            for (int k = 0; k < n_in; k++) fill(in[k], which, k + 1), qkv_set_requires_grad(ctx, in[k], true);
            op_case c = {which};
            qkv_gradcheck_result r;
            qkv_gradcheck_options o = {0};
            o.seed = (uint64_t)(which + 10);
            cr_assert_eq(qkv_gradcheck(ctx, apply, in, n_in, &c, &o, &r), QKV_OK, "%s", qkv_errmsg(ctx));
            cr_expect(r.passed, "%s, n %lld: %s", which >= 0 ? unary_ops[which].golden : "binary", (long long)n,
                      r.message);
            checked += r.checked, runs++;
            qkv_ctx_free(ctx);
        }
    }
    cr_expect_eq(runs, (N_UNARY + 4) * 4);
    cr_expect(checked > 3000, "%lld elements checked", (long long)checked);
}

/* f32 gives the f64 result rounded to float, within the ulps the header allows (f32_ulps), and gradients within
 * 1e-6 of f64's (they read the f32 output, rounded). */
/* How many floats lie between a and b (0: the same; both NaN or the same infinity count as the same). */
static int64_t ulps_apart(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b) ? 0 : INT64_MAX;
    if (a == b) return 0;
    int32_t ia, ib;
    memcpy(&ia, &a, 4), memcpy(&ib, &b, 4);
    int64_t ka = ia < 0 ? (int64_t)INT32_MIN - ia : ia, kb = ib < 0 ? (int64_t)INT32_MIN - ib : ib; // monotone
    return ka > kb ? ka - kb : kb - ka;
}

/* What the header promises of f32 against f64 rounded: SLEEF's 1-ulp maps for exp, log, tanh and pow, 3 ulp for
 * sigmoid and softplus (a map and one float operation), and the correctly rounded result for the rest. */
static int64_t f32_ulps(const char *golden) {
    if (!strncmp(golden, "sigmoid", 7) || !strncmp(golden, "softplus", 8)) return 3;
    if (!strcmp(golden, "exp") || !strcmp(golden, "log") || !strcmp(golden, "tanh") || !strncmp(golden, "pow_", 4))
        return 1;
    return 0;
}

Test(elementwise, f32_matches_f64) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    enum { N = 33 };
    int64_t n = N;
    for (int which = 0; which < N_UNARY; which++) {
        float y32[N], g32[N];
        double x[N];
        qkv_tensor *x64 = qkv_zeros(ctx, QKV_F64, 1, &n);
        fill(x64, which, 1);
        for (int64_t i = 0; i < n; i++) x[i] = (double)(float)qkv_f64(x64)[i]; /* the same inputs in both */
        for (int pass = 0; pass < 2; pass++) {
            qkv_dtype dt = pass ? QKV_F64 : QKV_F32;
            qkv_tensor *xt = tensor_of(ctx, dt, 1, &n, x);
            qkv_set_requires_grad(ctx, xt, true);
            qkv_tensor *y = unary_ops[which].op(ctx, xt);
            cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, y), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
            for (int64_t i = 0; i < n; i++) {
                if (!pass) {
                    y32[i] = qkv_f32(y)[i], g32[i] = qkv_f32(xt->grad)[i];
                    continue;
                }
                double v64 = qkv_f64(y)[i], d64 = qkv_f64(xt->grad)[i];
                int64_t ulps = ulps_apart(y32[i], (float)v64), allowed = f32_ulps(unary_ops[which].golden);
                cr_expect(ulps <= allowed, "%s(%g): f32 %.9g, f64 %.17g: %lld ulp apart, %lld allowed",
                          unary_ops[which].golden, x[i], (double)y32[i], v64, (long long)ulps, (long long)allowed);
                cr_expect(fabs(g32[i] - d64) <= 1e-6 * fmax(1.0, fabs(d64)), "%s'(%g): f32 %.9g against f64 %.17g",
                          unary_ops[which].golden, x[i], (double)g32[i], d64);
            }
            qkv_step_end(ctx);
        }
    }
    qkv_ctx_free(ctx);
}

/* where(mask, a, b) with a mask [n] over the last dimension of the broadcast shape, alternating 1 0 1 ... */
static qkv_tensor *where_alternate(qkv_ctx *ctx, qkv_tensor *a, qkv_tensor *b) {
    int64_t last = a->ndim && b->ndim ? (a->shape[a->ndim - 1] > b->shape[b->ndim - 1] ? a->shape[a->ndim - 1]
                                                                                          : b->shape[b->ndim - 1])
                                      : 1;
    qkv_tensor *m = qkv_zeros(ctx, QKV_U8, 1, &last);
    for (int64_t j = 0; m && j < last; j += 2) qkv_u8(m)[j] = 1;
    return qkv_where(ctx, m, a, b);
}

/* The binary operators and where in f32 (run by run over the float arrays) give the f64 result rounded to float and
 * gradients within 1e-6 of f64's, over shapes that take every path of the walk: the same shape (one run), a
 * single element against a tensor, broadcasts along inner and outer dimensions, both operands stretched. */
Test(elementwise, binary_f32_matches_f64_on_every_broadcast_path) {
    static const int64_t shapes[][2][3] = {
        {{5, 7, 0}, {5, 7, 0}}, {{1, 0, 0}, {3, 2, 0}}, {{2, 3, 1}, {3, 4, 0}}, {{4, 1, 0}, {1, 5, 0}},
        {{2, 1, 3}, {2, 4, 1}}, {{3, 2, 0}, {2, 0, 0}}, {{6, 0, 0}, {1, 0, 0}},
    };
    static const int ndims[][2] = {{2, 2}, {1, 2}, {3, 2}, {2, 2}, {3, 3}, {2, 1}, {1, 1}};
    const char *names[4] = {"div", "maximum", "minimum", "where"};
    binary_op ops[4] = {qkv_div, qkv_maximum, qkv_minimum, where_alternate};
    for (size_t c = 0; c < sizeof ndims / sizeof ndims[0]; c++)
        for (int k = 0; k < 4; k++) {
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            float z32[64], ga32[64], gb32[64];
            for (int pass = 0; pass < 2; pass++) {
                qkv_dtype dt = pass ? QKV_F64 : QKV_F32;
                qkv_tensor *in[2];
                for (int o = 0; o < 2; o++) {
                    in[o] = qkv_zeros(ctx, dt, ndims[c][o], shapes[c][o]);
                    for (int64_t i = 0; i < in[o]->numel; i++) // float values; ties between a and b on some
                        qkv_set_flat(ctx, in[o], i, (double)(float)(0.25 * (double)((i * 5 + o * 3) % 7) + 0.5));
                    qkv_set_requires_grad(ctx, in[o], true);
                }
                qkv_tensor *z = ops[k](ctx, in[0], in[1]);
                cr_assert_not_null(z, "%s: %s", names[k], qkv_errmsg(ctx));
                cr_assert(z->numel <= 64);
                qkv_tensor *w = qkv_zeros(ctx, dt, z->ndim, z->shape);
                for (int64_t i = 0; i < z->numel; i++) qkv_set_flat(ctx, w, i, 1.0 + 0.125 * (double)(i % 5));
                cr_assert_eq(qkv_backward(ctx, z, w), QKV_OK, "%s", qkv_errmsg(ctx));
                for (int64_t i = 0; i < z->numel; i++) {
                    if (!pass) {
                        z32[i] = qkv_f32(z)[i];
                        continue;
                    }
                    cr_expect_eq(z32[i], (float)qkv_f64(z)[i], "%s case %zu z[%lld]: f32 %.9g, f64 %.17g", names[k], c,
                                 (long long)i, (double)z32[i], qkv_f64(z)[i]);
                }
                for (int o = 0; o < 2; o++)
                    for (int64_t i = 0; i < in[o]->numel; i++) {
                        float *g32 = o ? gb32 : ga32;
                        if (!pass) {
                            g32[i] = qkv_f32(in[o]->grad)[i];
                            continue;
                        }
                        double d64 = qkv_f64(in[o]->grad)[i];
                        cr_expect(fabs(g32[i] - d64) <= 1e-6 * fmax(1.0, fabs(d64)), "%s case %zu d%c[%lld]: f32 %.9g, f64 %.17g",
                                  names[k], c, o ? 'b' : 'a', (long long)i, (double)g32[i], d64);
                    }
                qkv_step_end(ctx);
            }
            qkv_ctx_free(ctx);
        }
}

/* exp_sums.h's m and s, with every kernel set this CPU runs (the portable one, whose fallback maps e into the
 * scratch, among them): the bits of the row maximum and of the set's exp map over x - m followed by sum8_f32, for
 * rows taken in pairs, rows beside a row of -inf or one with a NaN, an odd last row, and lengths 1, 8, 33, 75. */
Test(elementwise, exp_sums_have_the_bits_of_the_map_and_the_row_sum) {
    enum { ROWS = 7, MAXN = 75 };
    const int64_t lengths[4] = {1, 8, 33, 75};
    static float x[ROWS * MAXN], e[MAXN], scratch[MAXN];
    int checked = 0;
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++) {
        const qkv_unary_kernel_set_ *k = qkv_unary_kernels_isa_(isa);
        if (!k) continue;
        for (int l = 0; l < 4; l++) {
            int64_t n = lengths[l];
            for (int64_t i = 0; i < ROWS * n; i++) x[i] = (float)(4.0 * sin(0.71 * (double)i));
            for (int64_t j = 0; j < n; j++) x[2 * n + j] = -INFINITY; /* row 2 dead: row 3 goes alone */
            x[5 * n + n / 2] = NAN;                                   /* row 5 NaN: row 4 goes alone; row 6 is last */
            double m[ROWS], s[ROWS];
            exp_sums_f32(k, x, ROWS, n, m, s, scratch);
            for (int r = 0; r < ROWS; r++) {
                const float *xr = x + r * n;
                bool nan;
                float top = max8_f32(xr, n, &nan);
                double want_m = nan ? NAN : (double)top;
                cr_expect(memcmp(&m[r], &want_m, sizeof want_m) == 0 || (isnan(m[r]) && isnan(want_m)),
                          "%s n %lld row %d: m %g, want %g", k->name, (long long)n, r, m[r], want_m);
                if (!isfinite(want_m)) continue;
                for (int64_t j = 0; j < n; j++) e[j] = xr[j] - top;
                k->map(QKV_VF_EXP_, e, e, n, 0.0f);
                double want_s = sum8_f32(e, n);
                cr_expect(memcmp(&s[r], &want_s, sizeof want_s) == 0, "%s n %lld row %d: s %.17g, want %.17g", k->name,
                          (long long)n, r, s[r], want_s);
                checked++;
            }
        }
    }
    cr_expect(checked >= 4 * 5, "checked %d rows", checked);
}

/* a and b the same float, or both NaN */
static bool same_float(float a, float b) { return memcmp(&a, &b, sizeof a) == 0 || (isnan(a) && isnan(b)); }

/* f32 where without broadcasting adds its gradients in float (ops/where.c): the bits of the double loop it
 * replaced, (float)((double)g + pick) into a kept gradient and (float)(0.0 + pick) into a fresh one, over 4099
 * random bit patterns (NaNs, infinities, subnormals and zeros among them). */
Test(elementwise, where_f32_gradients_have_the_bits_of_the_double_loop) {
    enum { N = 4099 };
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = qkv_param(ctx, qkv_zeros(ctx, QKV_F32, 1, (int64_t[]){N}));
    qkv_tensor *b = qkv_param(ctx, qkv_zeros(ctx, QKV_F32, 1, (int64_t[]){N}));
    qkv_tensor *mask = qkv_keep(ctx, qkv_zeros(ctx, QKV_U8, 1, (int64_t[]){N}));
    qkv_tensor *dz = qkv_keep(ctx, qkv_zeros(ctx, QKV_F32, 1, (int64_t[]){N}));
    cr_assert_not_null(dz, "%s", qkv_errmsg(ctx));
    uint32_t state = 77u;
    float old[2][N];
    for (int i = 0; i < N; i++) {
        uint32_t bits[3];
        for (int j = 0; j < 3; j++) bits[j] = state = state * 1664525u + 1013904223u;
        if (i % 97 == 0) bits[0] = 0x80000000u * (uint32_t)(i % 2) + (uint32_t)(i % 3); /* zeros and subnormals */
        memcpy(&qkv_f32(dz)[i], &bits[0], 4);
        memcpy(&old[0][i], &bits[1], 4);
        memcpy(&old[1][i], &bits[2], 4);
        qkv_u8(mask)[i] = (uint8_t)(bits[2] >> 29); /* 0 about one time in eight; any nonzero byte picks a */
    }
    /* kept gradients, added to */
    cr_assert_eq(qkv_backward(ctx, qkv_where(ctx, mask, a, b), dz), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_step_end(ctx);
    memcpy(a->grad->data, old[0], sizeof old[0]);
    memcpy(b->grad->data, old[1], sizeof old[1]);
    cr_assert_eq(qkv_backward(ctx, qkv_where(ctx, mask, a, b), dz), QKV_OK, "%s", qkv_errmsg(ctx));
    int bad = 0;
    for (int i = 0; i < N; i++) {
        double g = qkv_f32(dz)[i];
        bool set = qkv_u8(mask)[i] != 0;
        bad += !same_float(qkv_f32(a->grad)[i], (float)((double)old[0][i] + (set ? g : 0.0)));
        bad += !same_float(qkv_f32(b->grad)[i], (float)((double)old[1][i] + (set ? 0.0 : g)));
    }
    cr_expect_eq(bad, 0, "%d kept gradients differ from the double loop", bad);
    qkv_step_end(ctx);
    /* fresh gradients, stored: of the step tensors 1 * a and 1 * b */
    qkv_tensor *u = qkv_mul_scalar(ctx, a, 1.0), *v = qkv_mul_scalar(ctx, b, 1.0);
    cr_assert_eq(qkv_backward(ctx, qkv_where(ctx, mask, u, v), dz), QKV_OK, "%s", qkv_errmsg(ctx));
    bad = 0;
    for (int i = 0; i < N; i++) {
        double g = qkv_f32(dz)[i];
        bool set = qkv_u8(mask)[i] != 0;
        bad += !same_float(qkv_f32(u->grad)[i], (float)(0.0 + (set ? g : 0.0)));
        bad += !same_float(qkv_f32(v->grad)[i], (float)(0.0 + (set ? 0.0 : g)));
    }
    cr_expect_eq(bad, 0, "%d fresh gradients differ from the double loop", bad);
    qkv_ctx_free(ctx);
}

/* f32 div with only b broadcast (b [R, 1], [C] or [1] against a [R, C]): a's gradient goes straight into its float
 * gradient and b's through a double buffer in output order (ops/broadcast.c); both have the bits of the double
 * buffers, (float)(old + (0 + dz / b)) and (float)(old + the in-order double sum of dz (-a / b^2)), for a kept
 * gradient added to and a fresh one stored (a's, of the step tensor 1 * a). */
Test(elementwise, div_with_b_broadcast_has_the_bits_of_the_double_buffers) {
    enum { R = 5, C = 37 };
    const int64_t b_shapes[3][2] = {{R, 1}, {C, 0}, {1, 0}};
    const int b_ndims[3] = {2, 1, 1};
    for (int c = 0; c < 3; c++)
        for (int fresh = 0; fresh < 2; fresh++) {
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            qkv_seed(ctx, 5);
            qkv_tensor *a = qkv_param(ctx, qkv_randn(ctx, QKV_F32, 2, (int64_t[]){R, C}, 0, 1));
            qkv_tensor *b = qkv_param(ctx, qkv_randn(ctx, QKV_F32, b_ndims[c], b_shapes[c], 2, 0.5));
            qkv_tensor *dz = qkv_keep(ctx, qkv_randn(ctx, QKV_F32, 2, (int64_t[]){R, C}, 0, 1));
            cr_assert_not_null(dz, "%s", qkv_errmsg(ctx));
            /* kept gradients with values of their own: a first backward makes them, then they are overwritten */
            cr_assert_eq(qkv_backward(ctx, qkv_div(ctx, a, b), dz), QKV_OK, "%s", qkv_errmsg(ctx));
            qkv_step_end(ctx);
            float old_a[R * C], old_b[C];
            for (int64_t i = 0; i < a->numel; i++) qkv_f32(a->grad)[i] = old_a[i] = (float)(0.01 * (double)(i % 13) - 0.05);
            for (int64_t i = 0; i < b->numel; i++) qkv_f32(b->grad)[i] = old_b[i] = (float)(0.3 - 0.02 * (double)i);
            qkv_tensor *u = fresh ? qkv_mul_scalar(ctx, a, 1.0) : a; /* a step tensor: its gradient is new */
            cr_assert_eq(qkv_backward(ctx, qkv_div(ctx, u, b), dz), QKV_OK, "%s", qkv_errmsg(ctx));
            double db[C] = {0};
            int bad = 0;
            for (int64_t r = 0; r < R; r++)
                for (int64_t j = 0; j < C; j++) {
                    int64_t i = r * C + j, ib = c == 0 ? r : c == 1 ? j : 0;
                    double av = qkv_f32(a)[i], bv = qkv_f32(b)[ib], g = qkv_f32(dz)[i];
                    db[ib] += g * (-av / (bv * bv));
                    float want = (float)((fresh ? 0.0 : (double)old_a[i]) + (0.0 + g * (1.0 / bv)));
                    bad += !same_float(qkv_f32(u->grad)[i], want);
                }
            cr_expect_eq(bad, 0, "b case %d, %s: %d of a's gradients differ from the double buffer's", c,
                         fresh ? "fresh" : "kept", bad);
            bad = 0;
            for (int64_t i = 0; i < b->numel; i++) bad += !same_float(qkv_f32(b->grad)[i], (float)((double)old_b[i] + db[i]));
            cr_expect_eq(bad, 0, "b case %d, %s: %d of b's gradients differ from the double buffer's", c,
                         fresh ? "fresh" : "kept", bad);
            qkv_ctx_free(ctx);
        }
}

/* Every set of f32 maps this CPU can run (portable, AVX2, AVX-512) agrees with libm in double, rounded to float,
 * within the ulps unary_kernels.h states, at 4000 points per function across its range (both signs, tiny,
 * huge, the overflow and underflow edges, a tail shorter than a vector), and gives the edges' values. */
Test(elementwise, every_kernel_set_agrees_with_libm) {
    enum { N = 4003 };
    static float x[N], y[N];
    const int ulps[QKV_VF_COUNT_] = {1, 1, 1, 3, 3, 1, 4};
    int sets = 0;
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++) {
        const qkv_unary_kernel_set_ *k = qkv_unary_kernels_isa_(isa);
        if (!k) continue;
        sets++;
        for (int f = 0; f < QKV_VF_COUNT_; f++) {
            for (int i = 0; i < N; i++) { // spread over [-120, 120], denser near 0
                double t = (double)(i - N / 2) / (double)(N / 2);
                x[i] = (float)(120.0 * t * t * t);
                if (f == QKV_VF_LOG_ || f == QKV_VF_POW_) x[i] = fabsf(x[i]) + 1e-30f; // their domain
            }
            float p = f == QKV_VF_POW_ ? 1.5f : 0.0f;
            k->map((qkv_vf_)f, x, y, N, p);
            int64_t worst = 0;
            for (int i = 0; i < N; i++) {
                double xd = x[i], want;
                switch (f) {
                case QKV_VF_EXP_: want = exp(xd); break;
                case QKV_VF_LOG_: want = log(xd); break;
                case QKV_VF_TANH_:
                case QKV_VF_TANH_FAST_: want = tanh(xd); break;
                case QKV_VF_SIGMOID_: want = xd >= 0 ? 1.0 / (1.0 + exp(-xd)) : exp(xd) / (1.0 + exp(xd)); break;
                case QKV_VF_SOFTPLUS_: want = fmax(xd, 0.0) + log1p(exp(-fabs(xd))); break;
                default: want = pow(xd, 1.5); break;
                }
                int64_t d = ulps_apart(y[i], (float)want);
                worst = d > worst ? d : worst;
                cr_expect(d <= ulps[f], "%s map %d at %.9g: %.9g, libm %.9g (%lld ulp)", k->name, f, xd, (double)y[i],
                          want, (long long)d);
            }
            cr_log_info("%s map %d: worst %lld ulp", k->name, f, (long long)worst);
        }
        // edges: NaN in NaN out; exp(-inf) = 0, log 0 = -inf, log(-1) NaN, tanh(+-inf) = +-1, sigmoid and softplus at +-inf
        const float e_in[6] = {NAN, -INFINITY, 0.0f, -1.0f, INFINITY, -INFINITY};
        float e_out[6];
        k->map(QKV_VF_EXP_, e_in, e_out, 2, 0.0f);
        cr_expect(isnan(e_out[0]) && e_out[1] == 0.0f, "%s exp edges", k->name);
        k->map(QKV_VF_LOG_, e_in + 2, e_out, 2, 0.0f);
        cr_expect(e_out[0] == -INFINITY && isnan(e_out[1]), "%s log edges", k->name);
        k->map(QKV_VF_TANH_, e_in + 4, e_out, 2, 0.0f);
        cr_expect(e_out[0] == 1.0f && e_out[1] == -1.0f, "%s tanh edges", k->name);
        k->map(QKV_VF_TANH_FAST_, e_in + 4, e_out, 2, 0.0f);
        cr_expect(e_out[0] == 1.0f && e_out[1] == -1.0f, "%s fast tanh edges", k->name);
        k->map(QKV_VF_TANH_FAST_, e_in, e_out, 1, 0.0f);
        cr_expect(isnan(e_out[0]), "%s fast tanh of NaN", k->name);
        k->map(QKV_VF_SIGMOID_, e_in + 4, e_out, 2, 0.0f);
        cr_expect(e_out[0] == 1.0f && e_out[1] == 0.0f, "%s sigmoid edges %g %g", k->name, e_out[0], e_out[1]);
        k->map(QKV_VF_SOFTPLUS_, e_in + 4, e_out, 2, 0.0f);
        cr_expect(e_out[0] == INFINITY && e_out[1] == 0.0f, "%s softplus edges %g %g", k->name, e_out[0], e_out[1]);
        k->map(QKV_VF_SIGMOID_, e_in, e_out, 1, 0.0f);
        cr_expect(isnan(e_out[0]), "%s sigmoid of NaN", k->name);
    }
    cr_expect(sets >= 1, "no kernel set");
}

/* The edges the header promises, in f32 and f64. */
Test(elementwise, edges_as_documented) {
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        const double zero[1] = {0.0};
        struct {
            unary_op op;
            double y, dx;
        } at_zero[] = {{qkv_log, -INFINITY, INFINITY}, {qkv_sqrt, 0.0, INFINITY}, {qkv_rsqrt, INFINITY, -INFINITY},
                       {qkv_abs, 0.0, 0.0},           {op_pow_0, 1.0, 0.0},       {op_pow_half, 0.0, INFINITY},
                       {op_clamp_b, 0.0, 1.0}};
        for (size_t k = 0; k < sizeof at_zero / sizeof at_zero[0]; k++) {
            qkv_tensor *x = tensor_of(ctx, dt, 1, (int64_t[]){1}, zero);
            qkv_set_requires_grad(ctx, x, true);
            qkv_tensor *y = at_zero[k].op(ctx, x);
            cr_assert_eq(qkv_backward(ctx, y, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
            cr_expect(at(y, 0) == at_zero[k].y && at(x->grad, 0) == at_zero[k].dx, "%s case %zu at 0: y %g dx %g",
                      qkv_dtype_name(dt), k, at(y, 0), at(x->grad, 0));
            qkv_step_end(ctx);
        }
        // sigmoid and softplus at +-1000: no overflow, exact limits; clamp passes the gradient at its bounds
        const double big[4] = {-1000.0, 1000.0, -1.0, 0.5};
        qkv_tensor *x = tensor_of(ctx, dt, 1, (int64_t[]){4}, big);
        qkv_set_requires_grad(ctx, x, true);
        qkv_tensor *sg = qkv_sigmoid(ctx, x), *sp = qkv_softplus(ctx, x), *cl = qkv_clamp(ctx, x, -1.0, 0.5);
        cr_expect(at(sg, 0) == 0.0 && at(sg, 1) == 1.0 && at(sp, 0) == 0.0 && at(sp, 1) == 1000.0,
                  "sigmoid %g %g softplus %g %g", at(sg, 0), at(sg, 1), at(sp, 0), at(sp, 1));
        cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, cl), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        cr_expect(at(x->grad, 0) == 0 && at(x->grad, 1) == 0 && at(x->grad, 2) == 1 && at(x->grad, 3) == 1,
                  "clamp gradient %g %g %g %g", at(x->grad, 0), at(x->grad, 1), at(x->grad, 2), at(x->grad, 3));
        qkv_step_end(ctx);
        // where: a NaN in the operand not picked reaches neither the result nor a gradient
        const double va[2] = {1.0, NAN}, vb[2] = {NAN, 2.0};
        qkv_tensor *a = tensor_of(ctx, dt, 1, (int64_t[]){2}, va), *b = tensor_of(ctx, dt, 1, (int64_t[]){2}, vb);
        qkv_set_requires_grad(ctx, a, true), qkv_set_requires_grad(ctx, b, true);
        qkv_tensor *m = qkv_from_data(ctx, QKV_U8, 1, (int64_t[]){2}, (uint8_t[]){1, 0});
        qkv_tensor *z = qkv_where(ctx, m, a, b);
        cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, z), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        cr_expect(at(z, 0) == 1.0 && at(z, 1) == 2.0 && at(a->grad, 0) == 1 && at(a->grad, 1) == 0 &&
                      at(b->grad, 0) == 0 && at(b->grad, 1) == 1,
                  "where: z %g %g", at(z, 0), at(z, 1));
        qkv_ctx_free(ctx);
    }
}

/* Bad input: an error naming the function, the shapes or the value, never a result. */
Test(elementwise, misuse_is_refused_with_a_message) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_ones(ctx, QKV_F64, 2, (int64_t[]){2, 3}), *y = qkv_ones(ctx, QKV_F64, 2, (int64_t[]){4, 3});
    qkv_tensor *i32 = qkv_zeros(ctx, QKV_I32, 1, (int64_t[]){3}), *f32 = qkv_ones(ctx, QKV_F32, 1, (int64_t[]){3});
    qkv_tensor *m8 = qkv_zeros(ctx, QKV_U8, 1, (int64_t[]){3});
#define MISUSE(expr, status, f1, f2)                                                                                  \
    do {                                                                                                               \
        qkv_tensor *r = (expr);                                                                                        \
        expect_misuse(ctx, #expr, r, status, (const char *const[]){f1, f2, NULL});                                     \
        qkv_clear_error(ctx);                                                                                          \
    } while (0)
    MISUSE(qkv_exp(ctx, NULL), QKV_ERR_NULL, "qkv_exp", NULL);
    MISUSE(qkv_log(ctx, i32), QKV_ERR_DTYPE, "qkv_log", "x");
    MISUSE(qkv_pow_scalar(ctx, x, NAN), QKV_ERR_ARG, "qkv_pow_scalar", "NaN");
    MISUSE(qkv_clamp(ctx, x, 1.0, -1.0), QKV_ERR_ARG, "qkv_clamp", "lo <= hi");
    MISUSE(qkv_clamp(ctx, x, NAN, 1.0), QKV_ERR_ARG, "qkv_clamp", NULL);
    MISUSE(qkv_add_scalar(ctx, x, NAN), QKV_ERR_ARG, "qkv_add_scalar", "NaN");
    MISUSE(qkv_mul_scalar(ctx, x, NAN), QKV_ERR_ARG, "qkv_mul_scalar", "NaN");
    MISUSE(qkv_div(ctx, x, y), QKV_ERR_SHAPE, "qkv_div: a is [2,3] and b is [4,3]", "do not broadcast");
    MISUSE(qkv_maximum(ctx, x, f32), QKV_ERR_DTYPE, "qkv_maximum", NULL);
    MISUSE(qkv_minimum(ctx, i32, i32), QKV_ERR_DTYPE, "qkv_minimum", NULL);
    MISUSE(qkv_where(ctx, f32, x, x), QKV_ERR_DTYPE, "qkv_where: mask is f32", "u8");
    MISUSE(qkv_where(ctx, NULL, x, x), QKV_ERR_NULL, "qkv_where", NULL);
    MISUSE(qkv_where(ctx, qkv_zeros(ctx, QKV_U8, 1, (int64_t[]){4}), x, x), QKV_ERR_SHAPE, "qkv_where: mask is [4]",
           "a is [2,3]");
    MISUSE(qkv_where(ctx, m8, f32, x), QKV_ERR_DTYPE, "qkv_where", NULL);
#undef MISUSE
    // a broadcast of more than 2^60 elements: planned (not allocated) from two headers
    qkv_tensor tall = {.dtype = QKV_F64, .ndim = 2, .shape = {INT64_C(1) << 29, 1, 1, 1}};
    qkv_tensor wide = {.dtype = QKV_F64, .ndim = 2, .shape = {1, INT64_C(1) << 30, 1, 1}};
    const qkv_tensor *ops[2] = {&tall, &wide};
    static const char *const names[2] = {"a", "b"};
    qkv_bcast_ plan;
    cr_expect(qkv_bcast_plan_(ctx, "qkv_div", ops, names, 2, &plan)); // 2^59 elements: fits the plan...
    qkv_clear_error(ctx);
    wide.shape[1] = INT64_C(1) << 40;
    cr_expect(!qkv_bcast_plan_(ctx, "qkv_div", ops, names, 2, &plan)); // ...2^71 does not
    cr_expect_eq(qkv_error(ctx), QKV_ERR_OVERFLOW, "%s", qkv_errmsg(ctx));
    cr_expect(strstr(qkv_errmsg(ctx), "more than 2^60 elements"), "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

/* A set's exp_sum2 (where it has one) gives, for each of its two rows, the bits of its exp map over x - shift
 * followed by sum8_f32, for every length from 0 to 41 (each tail), rows with -inf, huge and tiny values, two
 * different rows and one row twice. */
Test(elementwise, exp_sum_has_the_bits_of_the_map_and_the_row_sum) {
    enum { N = 41, ROWS = 3 };
    float x[ROWS][N], e[N];
    const float shift[ROWS] = {3.0f, 3.0f, 40.0f};
    for (int row = 0; row < ROWS; row++) {
        for (int i = 0; i < N; i++) x[row][i] = (float)(row == 2 ? 40.0 * sin(1.7 * i) : 3.0 * cos(0.9 * i + row));
        if (row == 1) x[row][5] = x[row][17] = -INFINITY;
    }
    int checked = 0;
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++) {
        const qkv_unary_kernel_set_ *k = qkv_unary_kernels_isa_(isa);
        if (!k || !k->exp_sum2) continue;
        for (int r0 = 0; r0 < ROWS; r0++)
            for (int r1 = 0; r1 < ROWS; r1++)
                for (int n = 0; n <= N; n++) {
                    double got[2];
                    k->exp_sum2(x[r0], shift[r0], x[r1], shift[r1], n, got);
                    for (int c = 0; c < 2; c++) {
                        int row = c ? r1 : r0;
                        for (int i = 0; i < n; i++) e[i] = x[row][i] - shift[row];
                        k->map(QKV_VF_EXP_, e, e, n, 0.0f);
                        double want = sum8_f32(e, n);
                        cr_expect(memcmp(&got[c], &want, sizeof want) == 0,
                                  "%s rows %d, %d n %d: exp_sum2's sum %d %.17g, map + sum8 %.17g", k->name, r0, r1, n,
                                  c, got[c], want);
                        checked++;
                    }
                }
    }
    cr_log_info("exp_sum2 checked on %d rows", checked);
    if (qkv_unary_kernels_isa_(QKV_ISA_AVX2_)) cr_expect(checked > 0, "the AVX2 set has no exp_sum2");
}

/* The f32 operators computed in float (neg, abs, add and mul by a float scalar, sqrt's forward; qkv_internal.h's
 * QKV_UNARY_F32_FLOAT_*; rsqrt's forward, a float estimate and a step in double, ops/rsqrt.c) give the bits of the double loops they replaced, (float)f((double)x) and (float)((double)dx
 * + (double)dy * df), for 4099 inputs of random bits (NaNs, infinities, subnormals and zeros among them), with a
 * kept gradient added to and a fresh one stored; and add and mul by a scalar that is no float still round once. */
typedef struct float_case {
    const char *name;
    double c;
} float_case;

static double float_case_f(const float_case *k, double x) {
    if (!strcmp(k->name, "neg")) return -x;
    if (!strcmp(k->name, "abs")) return fabs(x);
    if (!strcmp(k->name, "add_scalar")) return x + k->c;
    if (!strcmp(k->name, "mul_scalar")) return k->c * x;
    if (!strcmp(k->name, "rsqrt")) return 1.0 / sqrt(x);
    return sqrt(x);
}

static double float_case_df(const float_case *k, double x, double y) {
    if (!strcmp(k->name, "neg")) return -1.0;
    if (!strcmp(k->name, "abs")) return (double)(x > 0) - (double)(x < 0);
    if (!strcmp(k->name, "add_scalar")) return 1.0;
    if (!strcmp(k->name, "mul_scalar")) return k->c;
    if (!strcmp(k->name, "rsqrt")) return -0.5 * y * y * y;
    return 0.5 / y;
}

static qkv_tensor *float_case_op(qkv_ctx *ctx, const float_case *k, qkv_tensor *x) {
    if (!strcmp(k->name, "neg")) return qkv_neg(ctx, x);
    if (!strcmp(k->name, "abs")) return qkv_abs(ctx, x);
    if (!strcmp(k->name, "add_scalar")) return qkv_add_scalar(ctx, x, k->c);
    if (!strcmp(k->name, "mul_scalar")) return qkv_mul_scalar(ctx, x, k->c);
    if (!strcmp(k->name, "rsqrt")) return qkv_rsqrt(ctx, x);
    return qkv_sqrt(ctx, x);
}

Test(elementwise, f32_in_float_has_the_bits_of_the_double_loops) {
    enum { N = 4099 };
    const float_case cases[] = {{"neg", 0}, {"abs", 0}, {"add_scalar", 0.375}, {"add_scalar", 0.1}, {"mul_scalar", -1.5},
                                {"mul_scalar", 0.1}, {"mul_scalar", INFINITY}, {"sqrt", 0}, {"rsqrt", 0}};
    uint32_t state = 2024u;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const float_case *k = &cases[c];
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *x = qkv_param(ctx, qkv_zeros(ctx, QKV_F32, 1, (int64_t[]){N}));
        qkv_tensor *dy = qkv_keep(ctx, qkv_zeros(ctx, QKV_F32, 1, (int64_t[]){N}));
        cr_assert(x && dy, "%s", qkv_errmsg(ctx));
        float old[N];
        for (int i = 0; i < N; i++) {
            uint32_t b[3];
            for (int j = 0; j < 3; j++) b[j] = state = state * 1664525u + 1013904223u;
            if (i % 97 == 0) b[0] = 0x80000000u * (uint32_t)(i % 2) + (uint32_t)(i % 3); /* zeros and subnormals */
            memcpy(&qkv_f32(x)[i], &b[0], 4);
            memcpy(&qkv_f32(dy)[i], &b[1], 4);
            b[2] &= 0xbfffffffu; /* kept gradients of moderate size, so that sums do not all overflow */
            memcpy(&old[i], &b[2], 4);
            if (isnan(old[i])) old[i] = 1.0f;
        }
        /* the forward, and a fresh gradient (of the step tensor 1 * x, stored) */
        qkv_tensor *y = float_case_op(ctx, k, x);
        cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
        int bad = 0;
        for (int i = 0; i < N; i++) bad += !same_float(qkv_f32(y)[i], (float)float_case_f(k, (double)qkv_f32(x)[i]));
        cr_expect_eq(bad, 0, "%s c=%g: %d forward values differ from the double loop", k->name, k->c, bad);
        /* a kept gradient, added to: a parameter's */
        cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
        qkv_step_end(ctx);
        memcpy(x->grad->data, old, sizeof old);
        y = float_case_op(ctx, k, x);
        cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
        bad = 0;
        for (int i = 0; i < N; i++) {
            double xd = qkv_f32(x)[i], yd = (double)(float)float_case_f(k, xd);
            float want = (float)((double)old[i] + (double)qkv_f32(dy)[i] * float_case_df(k, xd, yd));
            bad += !same_float(qkv_f32(x->grad)[i], want);
        }
        cr_expect_eq(bad, 0, "%s c=%g: %d kept gradients differ from the double loop", k->name, k->c, bad);
        qkv_step_end(ctx);
        /* a fresh gradient, stored: u = 1 * x (a step tensor), then the operator; u's gradient is new */
        qkv_tensor *u = qkv_mul_scalar(ctx, x, 1.0);
        y = float_case_op(ctx, k, u);
        cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s", qkv_errmsg(ctx));
        cr_assert_not_null(u->grad);
        bad = 0;
        for (int i = 0; i < N; i++) {
            double xd = qkv_f32(u)[i], yd = (double)(float)float_case_f(k, xd);
            bad += !same_float(qkv_f32(u->grad)[i], (float)(0.0 + (double)qkv_f32(dy)[i] * float_case_df(k, xd, yd)));
        }
        cr_expect_eq(bad, 0, "%s c=%g: %d fresh gradients differ from the double loop", k->name, k->c, bad);
        qkv_ctx_free(ctx);
    }
}

/* rsqrt's f32 forward (a float 1 / sqrtf and one step in double, ops/rsqrt.c) against the double sqrt and division
 * it replaced, (float)(1.0 / sqrt((double)x)), on every 61st of the 2^32 floats (61 is odd, so every low-bit
 * pattern comes up) and the edges; all 2^32 were compared when it was written. */
Test(elementwise, rsqrt_f32_has_the_bits_of_the_double_sqrt_and_division) {
    enum { CHUNK = 1 << 20, STRIDE = 61 };
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_set_grad_enabled(ctx, false);
    qkv_tensor *x = qkv_keep(ctx, qkv_zeros(ctx, QKV_F32, 1, (int64_t[]){CHUNK}));
    cr_assert_not_null(x, "%s", qkv_errmsg(ctx));
    const float edge[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -1.0f, 1e-45f, 1.17549435e-38f, 3.4028235e38f, 1.0f,
                          4.0f, 0.25f};
    int64_t bad = 0, checked = 0;
    uint64_t bits = 0;
    for (bool first = true; bits < (1ull << 32); first = false) {
        float *xv = qkv_f32(x);
        int64_t n = 0;
        if (first)
            for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) xv[n++] = edge[i];
        for (; n < CHUNK && bits < (1ull << 32); bits += STRIDE) {
            uint32_t b = (uint32_t)bits;
            memcpy(&xv[n++], &b, 4);
        }
        qkv_tensor *y = qkv_rsqrt(ctx, x);
        cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
        for (int64_t i = 0; i < n; i++) {
            float want = (float)(1.0 / sqrt((double)xv[i]));
            if (!same_float(qkv_f32(y)[i], want) && bad++ < 5)
                cr_log_error("rsqrt(%a) = %a, the double sqrt and division give %a", xv[i], qkv_f32(y)[i], want);
        }
        checked += n;
        qkv_step_end(ctx);
    }
    cr_expect_eq(bad, 0, "%lld of %lld rsqrt values differ from the double loop", (long long)bad, (long long)checked);
    cr_expect_gt(checked, (int64_t)70000000);
    qkv_ctx_free(ctx);
}

/* Every SIMD set's pow map with p = 0.5 (the gradient of x^1.5, which takes sqrt's path in unary_simd.h) is C's
 * pow(x, 0.5) rounded to float, edges included: +0 at -0, +inf at -inf, NaN below 0 and at NaN. */
Test(elementwise, pow_one_half_is_c_pow) {
    enum { N = 2003 };
    float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = (float)(1e-3 * i * i) + (float)i * 1e-30f;
    const float edge[8] = {-0.0f, 0.0f, -INFINITY, INFINITY, -1.0f, NAN, 1e-45f, 3.4e38f};
    memcpy(x, edge, sizeof edge);
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++) {
        const qkv_unary_kernel_set_ *k = qkv_unary_kernels_isa_(isa);
        if (!k) continue;
        k->map(QKV_VF_POW_, x, y, N, 0.5f);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            float want = (float)pow((double)x[i], 0.5);
            bool same = memcmp(&y[i], &want, sizeof want) == 0 || (isnan(y[i]) && isnan(want));
            if (!same && bad++ < 3) cr_log_error("%s: pow(%a, 0.5) = %a, C gives %a", k->name, (double)x[i], (double)y[i], (double)want);
        }
        cr_expect_eq(bad, 0, "%s: %d values of x^0.5 differ from C's pow", k->name, bad);
    }
}
