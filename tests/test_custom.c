/*
 * test_custom.c — user-defined operators (qkv/custom.h): a hand-written backward passes gradcheck and agrees
 * with the same operator built from primitives; the tape treats the node like a built-in one (inputs used
 * twice, several outputs, no-grad mode, anomaly mode, mixing with built-in operators, f32); errors raised in
 * callbacks become the context's error naming the operator; what a callback may not do is refused; and
 * every malformed definition or result is refused with a message.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "qkv.h"
#include "test_ops.h"

/* ---- softmax plus one along the last axis: w_i = e^s_i / (1 + sum_j e^s_j) ------------------------- */

/* Built from primitives: w = softmax(s) sigmoid(lse), lse = log sum_j e^s_j, since sum_j w_j = e^lse / (1 +
 * e^lse); written p / (1 + e^-lse) with the broadcasting division. */
static qkv_tensor *plus_one_composed(qkv_ctx *ctx, qkv_tensor *s) {
    qkv_tensor *p = qkv_softmax_dim(ctx, s, -1);
    qkv_tensor *lse = qkv_logsumexp_dim(ctx, s, -1, true);
    return qkv_div(ctx, p, qkv_add_scalar(ctx, qkv_exp(ctx, qkv_neg(ctx, lse)), 1.0));
}

typedef struct counts {
    int forward, backward;
} counts;

// forward: w = e^(s - m) / (e^-m + sum_j e^(s_j - m)) in double, row by row; saves nothing (w is the output)
static qkv_status plus_one_forward(qkv_ctx *ctx, qkv_custom_call *call) {
    qkv_tensor *s = call->inputs[0];
    if (call->user) ((counts *)call->user)->forward++;
    qkv_tensor *w = qkv_zeros(ctx, s->dtype, s->ndim, s->shape);
    if (!w) return qkv_error(ctx);
    int64_t n = s->shape[s->ndim - 1], rows = n ? s->numel / n : 0;
    for (int64_t r = 0; r < rows; r++) {
        double m = 0.0, den = 0.0;
        for (int64_t j = 0; j < n; j++) m = fmax(m, at(s, r * n + j));
        den = exp(-m);
        for (int64_t j = 0; j < n; j++) den += exp(at(s, r * n + j) - m);
        for (int64_t j = 0; j < n; j++) qkv_set_flat(ctx, w, r * n + j, exp(at(s, r * n + j) - m) / den);
    }
    call->outputs[0] = w;
    return QKV_OK;
}

// backward: ds_i += w_i (dw_i - sum_j dw_j w_j), the softmax's rule (the 1 in the denominator is a constant)
static qkv_status plus_one_backward(qkv_ctx *ctx, qkv_custom_call *call) {
    if (call->user) ((counts *)call->user)->backward++;
    const qkv_tensor *w = call->outputs[0], *dw = call->grad_outputs[0];
    qkv_tensor *ds = call->grad_inputs[0];
    if (!ds) return QKV_OK;
    int64_t n = w->shape[w->ndim - 1], rows = n ? w->numel / n : 0;
    for (int64_t r = 0; r < rows; r++) {
        double dot = 0.0;
        for (int64_t j = 0; j < n; j++) dot += at(dw, r * n + j) * at(w, r * n + j);
        for (int64_t j = 0; j < n; j++)
            qkv_set_flat(ctx, ds, r * n + j, at(ds, r * n + j) + at(w, r * n + j) * (at(dw, r * n + j) - dot));
    }
    return qkv_error(ctx);
}

static const qkv_custom_op plus_one = {"softmax_plus_one", 1, 1, plus_one_forward, plus_one_backward, NULL};

static qkv_tensor *plus_one_custom(qkv_ctx *ctx, qkv_tensor *const *in, int n_in, void *user) {
    (void)n_in;
    qkv_custom_op op = plus_one;
    op.user = user;
    return qkv_custom1(ctx, &op, in);
}

static qkv_tensor *plus_one_prims(qkv_ctx *ctx, qkv_tensor *const *in, int n_in, void *user) {
    (void)n_in, (void)user;
    return plus_one_composed(ctx, in[0]);
}

static void fill_scores(qkv_tensor *t, int salt) {
    for (int64_t i = 0; i < t->numel; i++) qkv_f64(t)[i] = 3.0 * sin(0.77 * (double)i + salt) + 0.01 * (double)i;
}

/* The hand-written backward passes qkv_gradcheck in f64 over [B, n, n] scores with n in {1, 3, 7, 33} and
 * B = 2, and so does the version built from primitives. */
Test(custom, softmax_plus_one_passes_gradcheck_both_ways) {
    static const int64_t sizes[] = {1, 3, 7, 33};
    for (int way = 0; way < 2; way++)
        for (int k = 0; k < 4; k++) {
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            qkv_tensor *s = qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){2, sizes[k], sizes[k]});
            fill_scores(s, k);
            qkv_set_requires_grad(ctx, s, true);
            counts c = {0, 0};
            qkv_gradcheck_result r;
            qkv_gradcheck_options o = {0};
            o.seed = (uint64_t)(k + 1);
            cr_assert_eq(qkv_gradcheck(ctx, way ? plus_one_prims : plus_one_custom, &s, 1, &c, &o, &r), QKV_OK, "%s",
                         qkv_errmsg(ctx));
            cr_expect(r.passed, "%s, n %lld: %s", way ? "primitives" : "custom", (long long)sizes[k], r.message);
            cr_expect_eq(r.checked, s->numel, "checked %lld of %lld", (long long)r.checked, (long long)s->numel);
            if (!way) cr_expect(c.forward > 2 && c.backward >= 1, "forward %d, backward %d", c.forward, c.backward);
            qkv_ctx_free(ctx);
        }
}

/* The user-defined operator and the one built from primitives give the same weights and gradients (1e-14),
 * in f64 and (1e-6) in f32; rows sum to less than 1, the rest going to the implicit zero logit. */
Test(custom, softmax_plus_one_custom_equals_primitives) {
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        double tol = d ? 1e-14 : 1e-6;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        int64_t shape[3] = {3, 5, 7};
        double v[105], wv[105], gv[105];
        for (int i = 0; i < 105; i++) v[i] = (double)(float)(4.0 * sin(1.3 * i) - 1.0);
        qkv_tensor *dw = qkv_zeros(ctx, dt, 3, shape);
        for (int i = 0; i < 105; i++) qkv_set_flat(ctx, dw, i, cos(0.4 * i));
        dw = qkv_keep(ctx, dw);
        for (int way = 0; way < 2; way++) {
            qkv_tensor *s = tensor_of(ctx, dt, 3, shape, v);
            qkv_set_requires_grad(ctx, s, true);
            qkv_tensor *w = way ? plus_one_composed(ctx, s) : qkv_custom1(ctx, &plus_one, &s);
            cr_assert_not_null(w, "%s", qkv_errmsg(ctx));
            cr_assert_eq(qkv_backward(ctx, w, dw), QKV_OK, "%s", qkv_errmsg(ctx));
            for (int i = 0; i < 105; i++) {
                if (!way) {
                    wv[i] = at(w, i), gv[i] = at(s->grad, i);
                    continue;
                }
                cr_expect(fabs(wv[i] - at(w, i)) <= tol, "%s w[%d]: custom %.17g, primitives %.17g",
                          qkv_dtype_name(dt), i, wv[i], at(w, i));
                cr_expect(fabs(gv[i] - at(s->grad, i)) <= tol, "%s ds[%d]: custom %.17g, primitives %.17g",
                          qkv_dtype_name(dt), i, gv[i], at(s->grad, i));
            }
            if (way)
                for (int r = 0; r < 15; r++) {
                    double row = 0;
                    for (int j = 0; j < 7; j++) row += wv[r * 7 + j];
                    cr_expect(row < 1.0 && row > 0.0, "row %d sums to %.17g", r, row);
                }
            qkv_step_end(ctx);
        }
        qkv_ctx_free(ctx);
    }
}

/* ---- the tape's rules ------------------------------------------------------------------------------ */

// z = a * b elementwise, same shapes; backward da += dz b, db += dz a
static qkv_status product_forward(qkv_ctx *ctx, qkv_custom_call *call) {
    call->outputs[0] = qkv_mul(ctx, call->inputs[0], call->inputs[1]);
    return qkv_error(ctx);
}
static qkv_status product_backward(qkv_ctx *ctx, qkv_custom_call *call) {
    for (int i = 0; i < 2; i++) {
        qkv_tensor *g = call->grad_inputs[i];
        if (!g) continue;
        const qkv_tensor *other = call->inputs[1 - i], *dz = call->grad_outputs[0];
        for (int64_t e = 0; e < g->numel; e++) qkv_set_flat(ctx, g, e, at(g, e) + at(dz, e) * at(other, e));
    }
    return qkv_error(ctx);
}
static const qkv_custom_op product = {"product", 2, 1, product_forward, product_backward, NULL};

/* An input used twice gets both gradients (d(x*x)/dx = 2x), and one also used by a built-in operator gets
 * theirs added (d(x*x + e^x)/dx = 2x + e^x); the qkv_mul inside the forward records nothing (the gradient is
 * the hand-written one: a forward's operators would add a second 2x). */
Test(custom, an_input_used_twice_and_mixed_with_builtins_gets_the_sum) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = tensor_of(ctx, QKV_F64, 1, (int64_t[]){4}, (const double[]){-1.5, 0.0, 0.5, 2.0});
    qkv_set_requires_grad(ctx, x, true);
    qkv_tensor *sq = qkv_custom1(ctx, &product, (qkv_tensor *[]){x, x});
    cr_assert_not_null(sq, "%s", qkv_errmsg(ctx));
    cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_add(ctx, sq, qkv_exp(ctx, x))), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    for (int i = 0; i < 4; i++)
        cr_expect(fabs(qkv_f64(x->grad)[i] - (2 * qkv_f64(x)[i] + exp(qkv_f64(x)[i]))) < 1e-15, "dx[%d] = %.17g", i,
                  qkv_f64(x->grad)[i]);
    qkv_ctx_free(ctx);
}

/* With recording off, or with no input that requires grad, nothing is recorded: the output requires no grad
 * and a backward from it is refused; the backward callback never runs. An integer input (a mask) needs no
 * gradient and gets grad_inputs NULL. */
Test(custom, no_grad_records_nothing) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    counts c = {0, 0};
    qkv_custom_op op = plus_one;
    op.user = &c;
    qkv_tensor *s = qkv_ones(ctx, QKV_F64, 2, (int64_t[]){2, 3});
    qkv_set_requires_grad(ctx, s, true);
    bool was = qkv_set_grad_enabled(ctx, false);
    qkv_tensor *w = qkv_custom1(ctx, &op, &s);
    qkv_set_grad_enabled(ctx, was);
    cr_assert_not_null(w, "%s", qkv_errmsg(ctx));
    cr_expect(!w->requires_grad, "recorded in no-grad mode");
    qkv_tensor *plain = qkv_custom1(ctx, &op, (qkv_tensor *[]){qkv_ones(ctx, QKV_F64, 1, (int64_t[]){3})});
    cr_expect(plain && !plain->requires_grad, "recorded with no input requiring grad");
    cr_expect_neq(qkv_backward(ctx, qkv_sum(ctx, w), NULL), QKV_OK);
    cr_expect_eq(c.forward, 2);
    cr_expect_eq(c.backward, 0);
    qkv_ctx_free(ctx);
}

// two outputs: y0 = 2a, y1 = a^2 (f64), and an integer output: the index of the largest element
static qkv_status two_forward(qkv_ctx *ctx, qkv_custom_call *call) {
    qkv_tensor *a = call->inputs[0];
    call->outputs[0] = qkv_mul_scalar(ctx, a, 2.0);
    call->outputs[1] = qkv_square(ctx, a);
    qkv_tensor *arg = qkv_zeros(ctx, QKV_I32, 1, (int64_t[]){1});
    if (arg)
        for (int64_t i = 1; i < a->numel; i++)
            if (at(a, i) > at(a, qkv_i32(arg)[0])) qkv_i32(arg)[0] = (int32_t)i;
    call->outputs[2] = arg;
    call->saved[0] = a, call->n_saved = 1;
    return qkv_error(ctx);
}
static qkv_status two_backward(qkv_ctx *ctx, qkv_custom_call *call) {
    cr_expect_null(call->grad_outputs[2], "an integer output has no gradient");
    const qkv_tensor *a = call->saved[0];
    for (int64_t i = 0; i < a->numel; i++) // da += 2 dy0 + 2 a dy1
        qkv_set_flat(ctx, call->grad_inputs[0], i,
                     at(call->grad_inputs[0], i) + 2 * at(call->grad_outputs[0], i) +
                         2 * at(a, i) * at(call->grad_outputs[1], i));
    return qkv_error(ctx);
}

/* Several outputs: the backward runs once with every output's gradient, zeros for the one the loss does not
 * use (here y0, then y1), and an integer output is no node's and has no gradient. */
Test(custom, several_outputs_one_backward) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const qkv_custom_op op = {"two", 1, 3, two_forward, two_backward, NULL};
    const double v[3] = {0.5, -2.0, 3.0};
    for (int use = 0; use < 3; use++) { // the loss uses y1, y0, both
        // dirty the step arena first, so a gradient that is not zeroed shows
        qkv_tensor *dirt = qkv_zeros(ctx, QKV_F64, 1, (int64_t[]){4096});
        for (int64_t i = 0; i < 4096; i++) qkv_f64(dirt)[i] = NAN;
        qkv_step_end(ctx);
        qkv_tensor *a = tensor_of(ctx, QKV_F64, 1, (int64_t[]){3}, v);
        qkv_set_requires_grad(ctx, a, true);
        qkv_tensor *out[3];
        cr_assert_eq(qkv_custom(ctx, &op, &a, out), QKV_OK, "%s", qkv_errmsg(ctx));
        cr_expect_eq(qkv_i32(out[2])[0], 2);
        cr_expect(out[0]->requires_grad && out[1]->requires_grad && !out[2]->requires_grad);
        qkv_tensor *loss = use == 0 ? qkv_sum(ctx, out[1]) : use == 1 ? qkv_sum(ctx, out[0])
                                                                     : qkv_add(ctx, qkv_sum(ctx, out[0]), qkv_sum(ctx, out[1]));
        cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        for (int i = 0; i < 3; i++) {
            double want = (use != 0 ? 2.0 : 0.0) + (use != 1 ? 2 * v[i] : 0.0);
            cr_expect_eq(qkv_f64(a->grad)[i], want, "use %d: da[%d] = %g, want %g", use, i, qkv_f64(a->grad)[i], want);
        }
        qkv_step_end(ctx);
    }
    qkv_ctx_free(ctx);
}

static qkv_status nan_backward(qkv_ctx *ctx, qkv_custom_call *call) {
    (void)ctx;
    qkv_f64(call->grad_inputs[0])[1] = NAN;
    return QKV_OK;
}

/* Anomaly mode names the operator whose backward left a NaN; without it the NaN passes (as any operator's). */
Test(custom, anomaly_mode_names_the_operator) {
    for (int anomaly = 0; anomaly < 2; anomaly++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_set_anomaly_mode(ctx, anomaly);
        const qkv_custom_op op = {"leaky_gate", 1, 1, plus_one_forward, nan_backward, NULL};
        qkv_tensor *s = qkv_ones(ctx, QKV_F64, 1, (int64_t[]){3});
        qkv_set_requires_grad(ctx, s, true);
        qkv_status st = qkv_backward(ctx, qkv_sum(ctx, qkv_custom1(ctx, &op, &s)), NULL);
        if (anomaly) {
            cr_expect_eq(st, QKV_ERR_NUMERIC, "%s", qkv_errmsg(ctx));
            cr_expect(strstr(qkv_errmsg(ctx), "anomaly in the backward of leaky_gate: gradient of input 0"), "%s",
                      qkv_errmsg(ctx));
        } else {
            cr_expect_eq(st, QKV_OK, "%s", qkv_errmsg(ctx));
            cr_expect(isnan(qkv_f64(s->grad)[1]));
        }
        qkv_ctx_free(ctx);
    }
}

/* ---- errors inside callbacks ----------------------------------------------------------------------- */

typedef enum { BAD_QKV_CALL, BAD_RETURN, BAD_SET_ERROR, BAD_STEP_END, BAD_BACKWARD, BAD_CTX_FREE } bad_kind;

static qkv_status misbehave(qkv_ctx *ctx, qkv_custom_call *call) {
    bad_kind how = *(const bad_kind *)call->user;
    qkv_tensor *x = call->inputs[0];
    switch (how) {
    case BAD_QKV_CALL: qkv_div(ctx, x, qkv_ones(ctx, QKV_F64, 1, (int64_t[]){5})); break;
    case BAD_RETURN: return QKV_ERR_NUMERIC;
    case BAD_SET_ERROR: return qkv_set_error(ctx, QKV_ERR_ARG, "scale %g is negative", -2.0);
    case BAD_STEP_END: qkv_step_end(ctx); break;
    case BAD_BACKWARD: qkv_backward(ctx, x, NULL); break;
    case BAD_CTX_FREE: qkv_ctx_free(ctx); break;
    }
    call->outputs[0] = qkv_copy(ctx, x);
    if (call->grad_inputs[0]) qkv_f64(call->grad_inputs[0])[0] += 1.0;
    return qkv_error(ctx);
}

static qkv_status copy_forward(qkv_ctx *ctx, qkv_custom_call *call) {
    call->outputs[0] = qkv_copy(ctx, call->inputs[0]);
    return qkv_error(ctx);
}

/* An error in the forward (a failing qkv call, a status returned bare, qkv_set_error, a forbidden call) or in
 * the backward becomes the context's error, naming qkv_custom, the operator and the callback; outputs NULL. */
Test(custom, errors_in_callbacks_name_the_operator) {
    static const struct {
        bad_kind how;
        qkv_status status;
        const char *says;
    } cases[] = {
        {BAD_QKV_CALL, QKV_ERR_SHAPE, "qkv_div: a is [2]"},
        {BAD_RETURN, QKV_ERR_NUMERIC, "returned QKV_ERR_NUMERIC (12) without setting an error"},
        {BAD_SET_ERROR, QKV_ERR_ARG, "scale -2 is negative"},
        {BAD_STEP_END, QKV_ERR_STATE, "qkv_step_end: called from a callback of a user-defined operator"},
        {BAD_BACKWARD, QKV_ERR_STATE, "qkv_backward: called from a callback of a user-defined operator"},
        {BAD_CTX_FREE, QKV_ERR_STATE, "qkv_ctx_free: called from a callback"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int in_backward = 0; in_backward < 2; in_backward++) {
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            bad_kind how = cases[k].how;
            qkv_custom_op op = {"wobbly", 1, 1, misbehave, misbehave, &how};
            if (in_backward) op.forward = copy_forward;
            qkv_tensor *x = qkv_ones(ctx, QKV_F64, 1, (int64_t[]){2});
            qkv_set_requires_grad(ctx, x, true);
            qkv_tensor *out[1] = {x};
            qkv_status st = qkv_custom(ctx, &op, &x, out);
            char want[160];
            if (!in_backward) {
                snprintf(want, sizeof want, "qkv_custom: wobbly: forward: %s", cases[k].says);
                cr_expect_null(out[0], "case %zu: an output despite the error", k);
            } else {
                cr_assert_eq(st, QKV_OK, "%s", qkv_errmsg(ctx));
                st = qkv_backward(ctx, qkv_sum(ctx, out[0]), NULL);
                snprintf(want, sizeof want, "qkv_backward: qkv_custom: wobbly: backward: %s", cases[k].says);
            }
            cr_expect_eq(st, cases[k].status, "case %zu %s: %s (%s)", k, in_backward ? "backward" : "forward",
                         qkv_status_name(st), qkv_errmsg(ctx));
            cr_expect(strncmp(qkv_errmsg(ctx), want, strlen(want)) == 0, "case %zu: \"%s\", want \"%s...\"", k,
                      qkv_errmsg(ctx), want);
            qkv_ctx_free(ctx);
        }
}

/* A backward walk that reaches an operator with no backward is QKV_ERR_STATE naming it; without a walk
 * through it (no-grad mode) it just runs. */
Test(custom, no_backward_is_refused_only_when_a_walk_needs_it) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const qkv_custom_op op = {"forward_only", 1, 1, copy_forward, NULL, NULL};
    qkv_tensor *x = qkv_ones(ctx, QKV_F64, 1, (int64_t[]){2});
    qkv_set_requires_grad(ctx, x, true);
    qkv_tensor *y = qkv_custom1(ctx, &op, &x);
    cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
    cr_expect_eq(qkv_backward(ctx, qkv_sum(ctx, y), NULL), QKV_ERR_STATE);
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_backward: qkv_custom: forward_only: backward: the operator has no backward"),
              "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

/* ---- malformed definitions and results ------------------------------------------------------------- */

typedef enum { OUT_NULL, OUT_INPUT, OUT_KEPT, OUT_TWICE, OUT_RECORDED, SAVED_TOO_MANY, SAVED_STALE } bad_result;
typedef struct bad_case {
    bad_result how;
    qkv_tensor *earlier; /* a tensor made before the call */
} bad_case;

static qkv_status bad_results(qkv_ctx *ctx, qkv_custom_call *call) {
    bad_case *b = call->user;
    qkv_tensor *x = call->inputs[0];
    call->outputs[0] = qkv_copy(ctx, x);
    call->outputs[1] = qkv_copy(ctx, x);
    switch (b->how) {
    case OUT_NULL: call->outputs[1] = NULL; break;
    case OUT_INPUT: call->outputs[1] = x; break;
    case OUT_KEPT: call->outputs[1] = qkv_keep(ctx, qkv_copy(ctx, x)); break;
    case OUT_TWICE: call->outputs[1] = call->outputs[0]; break;
    case OUT_RECORDED: call->outputs[1] = b->earlier; break;
    case SAVED_TOO_MANY: call->n_saved = QKV_CUSTOM_MAX_SAVED + 1; break;
    case SAVED_STALE: call->saved[0] = b->earlier, call->n_saved = 1; break;
    }
    return qkv_error(ctx);
}

Test(custom, malformed_definitions_and_results_are_refused) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_ones(ctx, QKV_F64, 1, (int64_t[]){2});
    qkv_set_requires_grad(ctx, x, true);
    qkv_tensor *out[QKV_CUSTOM_MAX_OUTPUTS];
    char long_name[80];
    memset(long_name, 'a', sizeof long_name - 1), long_name[sizeof long_name - 1] = '\0';
    const struct {
        qkv_custom_op op;
        qkv_status status;
        const char *says;
    } defs[] = {
        {{NULL, 1, 1, copy_forward, NULL, NULL}, QKV_ERR_ARG, "qkv_custom: op->name is NULL"},
        {{"", 1, 1, copy_forward, NULL, NULL}, QKV_ERR_ARG, "op->name is empty"},
        {{long_name, 1, 1, copy_forward, NULL, NULL}, QKV_ERR_ARG, "op->name is too long"},
        {{"tab\tname", 1, 1, copy_forward, NULL, NULL}, QKV_ERR_ARG, "unprintable byte 0x09 at 3"},
        {{"f", 1, 1, NULL, NULL, NULL}, QKV_ERR_NULL, "qkv_custom: f: op->forward is NULL"},
        {{"f", 0, 1, copy_forward, NULL, NULL}, QKV_ERR_ARG, "f: n_inputs is 0, must be 1 to 8"},
        {{"f", 9, 1, copy_forward, NULL, NULL}, QKV_ERR_ARG, "n_inputs is 9"},
        {{"f", 1, 5, copy_forward, NULL, NULL}, QKV_ERR_ARG, "n_outputs is 5, must be 1 to 4"},
    };
    for (size_t k = 0; k < sizeof defs / sizeof defs[0]; k++) {
        qkv_status st = qkv_custom(ctx, &defs[k].op, &x, out);
        cr_expect_eq(st, defs[k].status, "definition %zu: %s (%s)", k, qkv_status_name(st), qkv_errmsg(ctx));
        cr_expect(strstr(qkv_errmsg(ctx), defs[k].says), "definition %zu: \"%s\" lacks \"%s\"", k, qkv_errmsg(ctx),
                  defs[k].says);
        qkv_clear_error(ctx);
    }
    cr_expect_eq(qkv_custom(ctx, NULL, &x, out), QKV_ERR_NULL);
    qkv_clear_error(ctx);
    cr_expect_eq(qkv_custom(ctx, &plus_one, NULL, out), QKV_ERR_NULL);
    qkv_clear_error(ctx);
    cr_expect_eq(qkv_custom(ctx, &plus_one, (qkv_tensor *[]){NULL}, out), QKV_ERR_NULL);
    cr_expect(strstr(qkv_errmsg(ctx), "softmax_plus_one: input 0"), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_expect_null(qkv_custom1(ctx, &(qkv_custom_op){"pair", 1, 2, bad_results, NULL, NULL}, &x));
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_custom1: pair has 2 outputs"), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);

    static const struct {
        bad_result how;
        const char *says;
    } results[] = {
        {OUT_NULL, "qkv_custom: pair: forward: it left output 1 NULL"},
        {OUT_INPUT, "output 1 is input 0 itself"},
        {OUT_KEPT, "output 1 [2] is a kept tensor"},
        {OUT_TWICE, "outputs 0 and 1 are the same tensor"},
        {OUT_RECORDED, "output 1 [2] was made by a recorded operator before the call"},
        {SAVED_TOO_MANY, "n_saved is 9, must be 0 to 8"},
        {SAVED_STALE, "saved tensor 0"},
    };
    for (size_t k = 0; k < sizeof results / sizeof results[0]; k++) {
        bad_case b = {results[k].how, qkv_exp(ctx, x)};
        if (results[k].how == SAVED_STALE) { // a step tensor of an earlier step
            qkv_step_end(ctx);
            x = qkv_ones(ctx, QKV_F64, 1, (int64_t[]){2});
            qkv_set_requires_grad(ctx, x, true);
        }
        qkv_custom_op op = {"pair", 1, 2, bad_results, NULL, &b};
        out[0] = out[1] = x;
        cr_expect_neq(qkv_custom(ctx, &op, &x, out), QKV_OK, "result %zu accepted", k);
        cr_expect(out[0] == NULL && out[1] == NULL, "result %zu: outputs despite the error", k);
        cr_expect(strstr(qkv_errmsg(ctx), results[k].says), "result %zu: \"%s\" lacks \"%s\"", k, qkv_errmsg(ctx),
                  results[k].says);
        qkv_clear_error(ctx);
    }
    qkv_ctx_free(ctx);
}

static qkv_status save_kept_forward(qkv_ctx *ctx, qkv_custom_call *call) {
    call->outputs[0] = qkv_mul(ctx, call->inputs[0], call->inputs[1]);
    call->saved[0] = call->inputs[1], call->n_saved = 1;
    return qkv_error(ctx);
}

/* A saved tensor freed between the forward and the backward is refused by name before the backward reads it;
 * the caller's definition, name string included, may be gone by the backward. */
Test(custom, saved_tensors_are_checked_and_the_definition_is_copied) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_ones(ctx, QKV_F64, 1, (int64_t[]){2});
    qkv_set_requires_grad(ctx, x, true);
    qkv_tensor *k = qkv_keep(ctx, qkv_ones(ctx, QKV_F64, 1, (int64_t[]){2}));
    char name[16] = "scaled";
    qkv_custom_op *op = malloc(sizeof *op);
    *op = (qkv_custom_op){name, 2, 1, save_kept_forward, product_backward, NULL};
    qkv_tensor *y = qkv_custom1(ctx, op, (qkv_tensor *[]){x, k});
    cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
    memset(op, 0, sizeof *op), free(op), strcpy(name, "overwritten");
    qkv_free(ctx, k);
    cr_expect_neq(qkv_backward(ctx, qkv_sum(ctx, y), NULL), QKV_OK);
    cr_expect(strstr(qkv_errmsg(ctx), "input 1 of scaled"), "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}
