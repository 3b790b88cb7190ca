/*
 * test_optim.c — SGD, Adam, AdamW and clipping by global norm.
 *
 * Two independent oracles:
 *   - hand values: 2-3 element parameters over 3 steps, worked out on paper (closed forms in comments);
 *   - PyTorch 1.13 golden numbers: tests/data/optim/optim_golden.h, written by tests/tools/optim_golden.py
 *     (torch.optim on f64 parameters, 5 steps, fixed gradients, some clipped, one parameter joining late).
 * Plus: f32 against the same numbers, f32 against f64 and a plain reference at every vector tail length,
 * the checkpoint state (names, restore, a bad restored count), no heap allocation or arena use in a step,
 * allocation failures in qkv_optim_new, and the error table.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qkv_internal.h"
#include "test_alloc.h"
#include "test_ops.h"

#include "data/optim/optim_golden.h"

/* ---- helpers ------------------------------------------------------------------------------------- */

static qkv_tensor *param_of(qkv_ctx *ctx, qkv_dtype dt, int ndim, const int64_t *shape, const double *v) {
    qkv_tensor *t = qkv_zeros(ctx, dt, ndim, shape);
    cr_assert_not_null(t, "%s", qkv_errmsg(ctx));
    for (int64_t i = 0; i < t->numel; i++) qkv_set_flat(ctx, t, i, v[i]);
    qkv_tensor *p = qkv_param(ctx, t);
    cr_assert_not_null(p, "%s", qkv_errmsg(ctx));
    return p;
}

/* Give p a gradient (made if it has none) holding v. */
static void set_grad(qkv_ctx *ctx, qkv_tensor *p, const double *v) {
    qkv_tensor *g = qkv_grad_of_(ctx, p);
    cr_assert_not_null(g, "%s", qkv_errmsg(ctx));
    for (int64_t i = 0; i < g->numel; i++) qkv_set_flat(ctx, g, i, v[i]);
}

/* Worst relative error of got against want over n elements; counts those above tol. */
typedef struct compare {
    int bad;
    double worst;
    char where[96];
} compare;

static void check_close(compare *c, const char *what, int step, int64_t i, double got, double want,
                        double rtol, double atol) {
    double err = fabs(got - want), lim = atol + rtol * fabs(want);
    if (!(err <= lim)) {
        c->bad++;
        if (!(err / lim <= c->worst)) {
            c->worst = err / lim;
            snprintf(c->where, sizeof c->where, "%s[%lld] after step %d: %.17g, want %.17g", what,
                     (long long)i, step, got, want);
        }
    }
}

static qkv_optimizer *must_optim(qkv_ctx *ctx, const qkv_optim_options *o, qkv_tensor *const *p, int n) {
    qkv_optimizer *opt = qkv_optim_new(ctx, o, p, n);
    cr_assert_not_null(opt, "%s", qkv_errmsg(ctx));
    return opt;
}

static qkv_optim_options sgd(double lr, double momentum, double dampening, bool nesterov, double wd) {
    qkv_optim_options o = qkv_optim_defaults(QKV_OPTIM_SGD);
    o.lr = lr;
    o.momentum = momentum;
    o.dampening = dampening;
    o.nesterov = nesterov;
    o.weight_decay = wd;
    return o;
}

static qkv_optim_options adam(qkv_optim_kind kind, double lr, double b1, double b2, double eps, double wd) {
    qkv_optim_options o = qkv_optim_defaults(kind);
    o.lr = lr;
    o.beta1 = b1;
    o.beta2 = b2;
    o.eps = eps;
    o.weight_decay = wd;
    return o;
}

/* Run steps of o on a 3-element f64 parameter from p0 with grads[step]; want[step] after each step. */
static void run_hand(const char *name, qkv_optim_options o, const double p0[3], const double (*grads)[3],
                     const double (*want)[3], int steps, double rtol) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *p = param_of(ctx, QKV_F64, 1, (int64_t[]){3}, p0);
    qkv_optimizer *opt = must_optim(ctx, &o, &p, 1);
    compare c = {0};
    for (int s = 0; s < steps; s++) {
        set_grad(ctx, p, grads[s]);
        cr_assert_eq(qkv_optim_step(opt), QKV_OK, "%s: %s", name, qkv_errmsg(ctx));
        for (int i = 0; i < 3; i++) check_close(&c, "p", s + 1, i, qkv_f64(p)[i], want[s][i], rtol, 1e-300);
    }
    cr_expect_eq(c.bad, 0, "%s: %d elements off; worst %s", name, c.bad, c.where);
    cr_expect_eq(qkv_optim_step_count(opt), steps);
    qkv_optim_free(opt);
    qkv_ctx_free(ctx);
}

/* ---- SGD by hand ------------------------------------------------------------------------------------
 * p0 = [1, 2, 3], constant g = [1, -2, 0.5], lr 0.1. With momentum mu, buf_1 = g and
 * buf_t = mu buf_(t-1) + (1 - tau) g; the step is buf (or g + mu buf with nesterov). */

static const double P0[3] = {1, 2, 3};
static const double G3[3][3] = {{1, -2, 0.5}, {1, -2, 0.5}, {1, -2, 0.5}};

Test(optim_hand, sgd_plain) {
    // p_t = p0 - 0.1 t g
    const double want[3][3] = {{0.9, 2.2, 2.95}, {0.8, 2.4, 2.9}, {0.7, 2.6, 2.85}};
    run_hand("sgd", sgd(0.1, 0, 0, false, 0), P0, G3, want, 3, 1e-15);
}

Test(optim_hand, sgd_weight_decay) {
    // p_t = p - 0.1 (g + 0.1 p) = 0.99 p - 0.1 g:  p1 = [0.89, 2.18, 2.92], p2 = 0.99 p1 - 0.1 g,
    // p3 = 0.970299 p0 - 0.29701 g = [0.673289, 2.534618, 2.762392]
    const double want[3][3] = {{0.89, 2.18, 2.92}, {0.7811, 2.3582, 2.8408}, {0.673289, 2.534618, 2.762392}};
    run_hand("sgd wd", sgd(0.1, 0, 0, false, 0.1), P0, G3, want, 3, 1e-15);
}

Test(optim_hand, sgd_momentum) {
    // buf = g, 1.9 g, 2.71 g;  p_t = p0 - 0.1 (1, 2.9, 5.61) g
    const double want[3][3] = {{0.9, 2.2, 2.95}, {0.71, 2.58, 2.855}, {0.439, 3.122, 2.7195}};
    run_hand("sgd momentum", sgd(0.1, 0.9, 0, false, 0), P0, G3, want, 3, 1e-15);
}

Test(optim_hand, sgd_momentum_dampening) {
    // tau 0.5: buf = g (no dampening on the first step), 0.9 + 0.5 = 1.4 g, 1.26 + 0.5 = 1.76 g;
    // p_t = p0 - 0.1 (1, 2.4, 4.16) g
    const double want[3][3] = {{0.9, 2.2, 2.95}, {0.76, 2.48, 2.88}, {0.584, 2.832, 2.792}};
    run_hand("sgd dampening", sgd(0.1, 0.9, 0.5, false, 0), P0, G3, want, 3, 1e-15);
}

Test(optim_hand, sgd_nesterov) {
    // buf = g, 1.9 g, 2.71 g; step = g + 0.9 buf = 1.9 g, 2.71 g, 3.439 g;
    // p_t = p0 - 0.1 (1.9, 4.61, 8.049) g
    const double want[3][3] = {{0.81, 2.38, 2.905}, {0.539, 2.922, 2.7695}, {0.1951, 3.6098, 2.59755}};
    run_hand("sgd nesterov", sgd(0.1, 0.9, 0, true, 0), P0, G3, want, 3, 1e-15);
}

/* ---- Adam and AdamW by hand ---------------------------------------------------------------------------
 * Constant g: m_hat = g and v_hat = g^2 at every step, so each step moves p by lr g / (|g| + eps). */

Test(optim_hand, adam_constant_gradient_moves_lr_per_step) {
    double want[3][3];
    for (int t = 1; t <= 3; t++)
        for (int i = 0; i < 3; i++) want[t - 1][i] = P0[i] - 0.1 * t * G3[0][i] / (fabs(G3[0][i]) + 1e-8);
    run_hand("adam constant", adam(QKV_OPTIM_ADAM, 0.1, 0.9, 0.999, 1e-8, 0), P0, G3, want, 3, 1e-14);
}

/* b1 = 0.5, b2 = 0.75, lr = 0.1, eps = 1e-8; element 0 sees g = 1, 3, -1, element 1 g = 2, -2, 0,
 * element 2 always 0 (m = v = 0: it must not move, 0 / (0 + eps) = 0).
 *   1 - b1^t = 1/2, 3/4, 7/8;  1 - b2^t = 1/4, 7/16, 37/64
 *   element 0: m = 1/2, 7/4, 3/8;  v = 1/4, 39/16, 133/64;
 *              m_hat = 1, 7/3, 3/7;  v_hat = 1, 39/7, 133/37
 *   element 1: m = 1, -1/2, -1/4;  v = 1, 7/4, 21/16;  m_hat = 2, -2/3, -2/7;  v_hat = 4, 4, 84/37
 * Each step: p -= 0.1 m_hat / (sqrt(v_hat) + eps). AdamW (wd 0.5) first multiplies p by 1 - 0.1 * 0.5. */
static void adam_hand_steps(double decay, double want[3][3]) {
    const double mh[3][2] = {{1, 2}, {7.0 / 3, -2.0 / 3}, {3.0 / 7, -2.0 / 7}};
    const double vh[3][2] = {{1, 4}, {39.0 / 7, 4}, {133.0 / 37, 84.0 / 37}};
    double p[3] = {P0[0], P0[1], P0[2]};
    for (int t = 0; t < 3; t++) {
        for (int i = 0; i < 3; i++) p[i] *= decay;
        for (int i = 0; i < 2; i++) p[i] -= 0.1 * mh[t][i] / (sqrt(vh[t][i]) + 1e-8);
        for (int i = 0; i < 3; i++) want[t][i] = p[i];
    }
}

static const double GV[3][3] = {{1, 2, 0}, {3, -2, 0}, {-1, 0, 0}};

Test(optim_hand, adam_varying_gradient) {
    double want[3][3];
    adam_hand_steps(1.0, want);
    cr_expect_eq(want[2][2], 3.0);
    run_hand("adam", adam(QKV_OPTIM_ADAM, 0.1, 0.5, 0.75, 1e-8, 0), P0, GV, want, 3, 1e-14);
}

Test(optim_hand, adamw_decouples_the_decay) {
    double want[3][3];
    adam_hand_steps(0.95, want);
    cr_expect(fabs(want[2][2] - 3 * 0.95 * 0.95 * 0.95) < 1e-15, "element 2 only decays");
    run_hand("adamw", adam(QKV_OPTIM_ADAMW, 0.1, 0.5, 0.75, 1e-8, 0.5), P0, GV, want, 3, 1e-14);
}

/* beta1 = 0 is taken as 0 (PyTorch's betas=(0, b2)): m = g and 1 - 0^t = 1, so with b2 = 0.75, lr = 0.1,
 * eps = 1e-8 each step is p -= 0.1 g / (sqrt(v) / sqrt(1 - b2^t) + eps), v = b2 v + (1 - b2) g^2. */
Test(optim_hand, adam_beta1_zero_is_zero) {
    double want[3][3], v[3] = {0, 0, 0}, p[3] = {P0[0], P0[1], P0[2]};
    for (int t = 1; t <= 3; t++)
        for (int i = 0; i < 3; i++) {
            double g = GV[t - 1][i];
            v[i] = 0.75 * v[i] + 0.25 * g * g;
            p[i] -= 0.1 * g / (sqrt(v[i]) / sqrt(1 - pow(0.75, t)) + 1e-8);
            want[t - 1][i] = p[i];
        }
    run_hand("adam beta1 0", adam(QKV_OPTIM_ADAM, 0.1, 0.0, 0.75, 1e-8, 0), P0, GV, want, 3, 1e-14);
    run_hand("adamw beta1 0", adam(QKV_OPTIM_ADAMW, 0.1, 0.0, 0.75, 1e-8, 0), P0, GV, want, 3, 1e-14);
}

/* Every field is taken as given: a hand-written struct keeps its zeros, an SGD lr of 0 does not move p,
 * and qkv_optim_get_options returns the fields unchanged. */
Test(optim_options, fields_are_taken_as_given) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *p = param_of(ctx, QKV_F64, 1, (int64_t[]){3}, P0);
    qkv_optim_options o = {.kind = QKV_OPTIM_ADAM, .lr = 0.1, .beta2 = 0.5};
    qkv_optimizer *opt = must_optim(ctx, &o, &p, 1);
    qkv_optim_options r = qkv_optim_get_options(opt);
    cr_expect(r.lr == 0.1 && r.beta1 == 0 && r.beta2 == 0.5 && r.eps == 0 && r.weight_decay == 0,
              "lr %g beta1 %g beta2 %g eps %g wd %g", r.lr, r.beta1, r.beta2, r.eps, r.weight_decay);
    // beta1 0, eps 0, t = 1: p -= 0.1 g / |g|
    set_grad(ctx, p, (double[]){2, -4, 0.5});
    cr_assert_eq(qkv_optim_step(opt), QKV_OK, "%s", qkv_errmsg(ctx));
    for (int i = 0; i < 3; i++)
        cr_expect(fabs(qkv_f64(p)[i] - (P0[i] - 0.1 * (i == 1 ? -1 : 1))) < 1e-15, "p[%d] %.17g", i, qkv_f64(p)[i]);
    qkv_optim_free(opt);

    qkv_tensor *q = param_of(ctx, QKV_F64, 1, (int64_t[]){3}, P0);
    o = sgd(0, 0.9, 0, false, 0);
    opt = must_optim(ctx, &o, &q, 1);
    set_grad(ctx, q, (double[]){1, 1, 1});
    cr_assert_eq(qkv_optim_step(opt), QKV_OK, "%s", qkv_errmsg(ctx));
    for (int i = 0; i < 3; i++) cr_expect_eq(qkv_f64(q)[i], P0[i], "lr 0 moves nothing");
    cr_expect_eq(qkv_optim_get_options(opt).lr, 0.0);
    qkv_optim_free(opt);
    cr_expect(isnan(qkv_optim_defaults(QKV_OPTIM_SGD).lr), "SGD's lr is left unset");
    qkv_ctx_free(ctx);
}

/* The three zero-grad functions differ only in which tensors they zero, as qkv.h says. */
Test(optim_options, the_three_zero_grads_zero_what_their_names_say) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = param_of(ctx, QKV_F64, 1, (int64_t[]){2}, (double[]){1, 2});
    qkv_tensor *b = param_of(ctx, QKV_F32, 1, (int64_t[]){2}, (double[]){3, 4});
    qkv_tensor *c = param_of(ctx, QKV_F64, 1, (int64_t[]){2}, (double[]){5, 6}); /* never gets a grad */
    qkv_tensor *k = qkv_keep(ctx, qkv_zeros(ctx, QKV_F64, 1, (int64_t[]){2}));  /* not a qkv_param */
    cr_assert_eq(qkv_set_requires_grad(ctx, k, true), QKV_OK);
    qkv_optim_options o = sgd(0.1, 0, 0, false, 0);
    qkv_optimizer *opt = must_optim(ctx, &o, (qkv_tensor *[]){a, c}, 2);
    const double ones[2] = {1, 1};
    set_grad(ctx, a, ones);
    set_grad(ctx, b, ones);
    set_grad(ctx, k, ones);
    cr_assert_eq(qkv_optim_zero_grad(opt), QKV_OK); /* a (and c, which has none), not b */
    cr_expect(at(a->grad, 0) == 0 && at(a->grad, 1) == 0 && at(b->grad, 0) == 1 && at(k->grad, 0) == 1);
    cr_expect_null(c->grad, "no gradient is made");
    set_grad(ctx, a, ones);
    qkv_zero_grads(ctx); /* every qkv_param: a and b, not k */
    cr_expect(at(a->grad, 0) == 0 && at(b->grad, 1) == 0 && at(k->grad, 0) == 1 && at(k->grad, 1) == 1);
    cr_expect_null(c->grad);
    cr_assert_eq(qkv_zero_grad(ctx, k), QKV_OK); /* one tensor */
    cr_expect(at(k->grad, 0) == 0 && at(k->grad, 1) == 0);
    cr_expect_eq(qkv_zero_grad(ctx, c), QKV_OK);
    cr_expect_null(c->grad);
    /* on an errored context: qkv_zero_grad and qkv_optim_zero_grad change nothing, qkv_zero_grads zeros */
    set_grad(ctx, a, ones);
    set_grad(ctx, k, ones);
    qkv_get_flat(ctx, a, 99);
    cr_assert_eq(qkv_error(ctx), QKV_ERR_ARG);
    cr_expect_eq(qkv_optim_zero_grad(opt), QKV_ERR_ARG);
    cr_expect_eq(qkv_zero_grad(ctx, k), QKV_ERR_ARG);
    cr_expect(at(a->grad, 0) == 1 && at(k->grad, 0) == 1, "nothing zeroed");
    qkv_zero_grads(ctx);
    cr_expect(at(a->grad, 0) == 0 && at(k->grad, 0) == 1);
    qkv_optim_free(opt);
    qkv_ctx_free(ctx);
}

Test(optim_hand, adam_adds_l2_decay_to_the_gradient) {
    // p0 = [1, -1], g = [0.5, 0.5], wd 0.5: g + wd p = [1, 0]. Element 1's effective gradient is 0, so it
    // stays; element 0 moves by lr = 0.1 (m_hat = 1, v_hat = 1). AdamW would move both.
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *p = param_of(ctx, QKV_F64, 1, (int64_t[]){2}, (double[]){1, -1});
    qkv_optim_options o = adam(QKV_OPTIM_ADAM, 0.1, 0.9, 0.999, 1e-8, 0.5);
    qkv_optimizer *opt = must_optim(ctx, &o, &p, 1);
    set_grad(ctx, p, (double[]){0.5, 0.5});
    cr_assert_eq(qkv_optim_step(opt), QKV_OK);
    cr_expect(fabs(qkv_f64(p)[0] - (1 - 0.1 / (1 + 1e-8))) < 1e-15, "%.17g", qkv_f64(p)[0]);
    cr_expect_eq(qkv_f64(p)[1], -1.0);
    qkv_ctx_free(ctx);
}

/* ---- clipping by hand ---------------------------------------------------------------------------- */

Test(optim_hand, clip_grad_norm) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = param_of(ctx, QKV_F64, 1, (int64_t[]){2}, (double[]){0, 0});
    qkv_tensor *b = param_of(ctx, QKV_F32, 1, (int64_t[]){1}, (double[]){0});
    qkv_tensor *none = param_of(ctx, QKV_F64, 1, (int64_t[]){1}, (double[]){0});
    qkv_tensor *ps[3] = {a, none, b};
    cr_expect_eq(qkv_clip_grad_norm(ctx, ps, 3, 1.0), 0.0, "no gradients at all: norm 0");
    set_grad(ctx, a, (double[]){3, 0});
    set_grad(ctx, b, (double[]){4});
    // norm 5 <= 10 - 1e-6: unchanged
    cr_expect_eq(qkv_clip_grad_norm(ctx, ps, 3, 10.0), 5.0);
    cr_expect_eq(qkv_f64(a->grad)[0], 3.0);
    cr_expect_eq(qkv_f32(b->grad)[0], 4.0f);
    // norm 5 > 1: g *= 1 / (5 + 1e-6)
    cr_expect_eq(qkv_clip_grad_norm(ctx, ps, 3, 1.0), 5.0);
    cr_expect(fabs(qkv_f64(a->grad)[0] / (3 / 5.000001) - 1) < 1e-15, "%.17g", qkv_f64(a->grad)[0]);
    cr_expect_eq(qkv_f64(a->grad)[1], 0.0);
    cr_expect(fabs(qkv_f32(b->grad)[0] - (float)(4 / 5.000001)) == 0, "%.9g", (double)qkv_f32(b->grad)[0]);
    cr_expect_null(none->grad, "a parameter with no gradient gets none");
    // squares that overflow double: norm 1e200 sqrt(2), computed by rescaling, and clipped to 1
    set_grad(ctx, a, (double[]){1e200, -1e200});
    qkv_tensor *only_a[1] = {a};
    double norm = qkv_clip_grad_norm(ctx, only_a, 1, 1.0);
    cr_expect(fabs(norm / (1e200 * sqrt(2.0)) - 1) < 1e-15, "%g", norm);
    cr_expect(fabs(qkv_f64(a->grad)[0] - sqrt(0.5)) < 1e-15, "%.17g", qkv_f64(a->grad)[0]);
    cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

Test(optim_hand, clip_reports_a_nonfinite_gradient_and_changes_nothing) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = param_of(ctx, QKV_F64, 1, (int64_t[]){2}, (double[]){0, 0});
    qkv_tensor *b = param_of(ctx, QKV_F32, 2, (int64_t[]){2, 2}, (double[]){0, 0, 0, 0});
    set_grad(ctx, a, (double[]){30, 40});
    set_grad(ctx, b, (double[]){1, 2, INFINITY, 3});
    qkv_tensor *ps[2] = {a, b};
    double norm = qkv_clip_grad_norm(ctx, ps, 2, 1.0);
    cr_expect(isinf(norm), "%g", norm);
    cr_expect_eq(qkv_error(ctx), QKV_ERR_NUMERIC);
    cr_expect(strstr(qkv_errmsg(ctx), "params[1] [2,2]") && strstr(qkv_errmsg(ctx), "flat index 2"), "%s",
              qkv_errmsg(ctx));
    cr_expect_eq(qkv_f64(a->grad)[0], 30.0, "gradients untouched");
    qkv_clear_error(ctx);
    qkv_set_flat(ctx, b->grad, 2, NAN);
    cr_expect(isnan(qkv_clip_grad_norm(ctx, ps, 2, 1.0)));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_NUMERIC);
    cr_expect(strstr(qkv_errmsg(ctx), "is nan"), "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

/* ---- PyTorch golden numbers ------------------------------------------------------------------------ */

static qkv_optim_options golden_options(const golden_case *gc) {
    qkv_optim_options o = qkv_optim_defaults((qkv_optim_kind)gc->kind);
    o.lr = gc->lr;
    o.momentum = gc->momentum;
    o.dampening = gc->dampening;
    o.nesterov = gc->nesterov != 0;
    o.weight_decay = gc->weight_decay;
    o.beta1 = gc->beta1;
    o.beta2 = gc->beta2;
    o.eps = gc->eps;
    return o;
}

/* Run a golden case in dtype dt; returns the number of elements outside the tolerance. */
static int run_golden(const golden_case *gc, qkv_dtype dt, double rtol, double atol, compare *c) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = param_of(ctx, dt, 1, (int64_t[]){3}, golden_a0);
    qkv_tensor *b = param_of(ctx, dt, 2, (int64_t[]){2, 2}, golden_b0);
    qkv_tensor *ps[2] = {a, b};
    qkv_optim_options o = golden_options(gc);
    o.param_names = (const char *const[]){"a", "b"};
    qkv_optimizer *opt = must_optim(ctx, &o, ps, 2);
    for (int s = 0; s < GOLDEN_STEPS; s++) {
        set_grad(ctx, a, golden_grad_a[s]);
        if (s + 1 >= gc->b_from) set_grad(ctx, b, golden_grad_b[s]);
        else cr_assert_null(b->grad);
        if (gc->max_norm > 0) {
            double norm = qkv_clip_grad_norm(ctx, ps, 2, gc->max_norm);
            check_close(c, "norm", s + 1, 0, norm, gc->norms[s], rtol, atol);
        }
        cr_assert_eq(qkv_optim_step(opt), QKV_OK, "%s: %s", gc->name, qkv_errmsg(ctx));
        for (int i = 0; i < 3; i++) check_close(c, "a", s + 1, i, at(a, i), gc->a[s][i], rtol, atol);
        for (int i = 0; i < 4; i++) check_close(c, "b", s + 1, i, at(b, i), gc->b[s][i], rtol, atol);
    }
    cr_expect_eq(qkv_optim_step_count(opt), GOLDEN_STEPS);
    /* b's own step count lags when it joined late (Adam and SGD with momentum keep one) */
    for (int k = 0; k < qkv_optim_state_count(opt); k++) {
        const char *name;
        qkv_tensor *t = qkv_optim_state(opt, k, &name);
        if (strcmp(name, "b.step") == 0)
            cr_expect_eq(qkv_f64(t)[0], GOLDEN_STEPS - gc->b_from + 1, "%s: b.step", gc->name);
    }
    cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
    return c->bad;
}

Test(optim_golden, pytorch_f64_within_1e_12) {
    int n = (int)(sizeof golden_cases / sizeof golden_cases[0]);
    cr_assert_geq(n, 16);
    for (int k = 0; k < n; k++) {
        compare c = {0};
        run_golden(&golden_cases[k], QKV_F64, 1e-12, 0.0, &c);
        cr_expect_eq(c.bad, 0, "%s: %d values off by more than 1e-12 relative; worst %s",
                     golden_cases[k].name, c.bad, c.where);
    }
}

Test(optim_golden, pytorch_f32_within_f32_rounding) {
    int n = (int)(sizeof golden_cases / sizeof golden_cases[0]);
    for (int k = 0; k < n; k++) {
        compare c = {0};
        run_golden(&golden_cases[k], QKV_F32, 2e-5, 1e-6, &c);
        cr_expect_eq(c.bad, 0, "%s f32: %d values off; worst %s", golden_cases[k].name, c.bad, c.where);
    }
}

Test(optim_golden, pytorch_clip_grad_norm) {
    int n = (int)(sizeof golden_clips / sizeof golden_clips[0]);
    cr_assert_eq(n, 3);
    for (int k = 0; k < n; k++) {
        const golden_clip *gc = &golden_clips[k];
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *a = param_of(ctx, QKV_F64, 1, (int64_t[]){3}, golden_a0);
        qkv_tensor *b = param_of(ctx, QKV_F64, 2, (int64_t[]){2, 2}, golden_b0);
        double ga[3], gb[4];
        for (int i = 0; i < 3; i++) ga[i] = gc->scale * golden_grad_a[2][i];
        for (int i = 0; i < 4; i++) gb[i] = gc->scale * golden_grad_b[2][i];
        set_grad(ctx, a, ga);
        set_grad(ctx, b, gb);
        double norm = qkv_clip_grad_norm(ctx, (qkv_tensor *[]){a, b}, 2, gc->max_norm);
        compare c = {0};
        check_close(&c, "norm", 0, 0, norm, gc->norm, 1e-12, 0);
        for (int i = 0; i < 7; i++)
            check_close(&c, "grad", 0, i, i < 3 ? qkv_f64(a->grad)[i] : qkv_f64(b->grad)[i - 3], gc->grads[i],
                        1e-12, 0);
        cr_expect_eq(c.bad, 0, "clip case %d (max_norm %g, norm %g): worst %s", k, gc->max_norm, gc->norm,
                     c.where);
        bool scaled = gc->grads[0] != ga[0];
        cr_expect_eq(scaled, k != 1, "case %d: PyTorch scales unless max_norm >= norm + 1e-6", k);
        qkv_ctx_free(ctx);
    }
}

/* ---- the vector loops at every tail length ------------------------------------------------------------
 * The updates and the norm run in loops 2 to 16 elements wide (per CPU) with a scalar remainder, so sizes
 * 1, 7, 15, 17, 33 and 1000 exercise a remainder alone, one after a single vector, and long runs. Every
 * configuration runs 20 steps from the same start on the same gradients, in f64 and in f32; starts are in
 * [1, 2) and gradients in [-1, 1), multiples of 1/1024, so both dtypes read the same numbers. */

static const int64_t TAIL_SIZES[] = {1, 7, 15, 17, 33, 1000};
enum { N_TAIL_SIZES = 6, TAIL_STEPS = 20 };

static uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static double tail_start(int64_t i) { return 1.0 + (double)(mix((uint32_t)i) % 1024) / 1024; }

static double tail_grad(int64_t i, int step) {
    return ((double)(mix((uint32_t)(i * 131 + step * 7919 + 1)) % 2048) - 1024) / 1024;
}

/* Element i after TAIL_STEPS steps of o, by the formulas of qkv/optim.h written out plainly in double. */
static double tail_reference(const qkv_optim_options *o, int64_t i) {
    double p = tail_start(i), m = 0, v = 0, buf = 0;
    for (int s = 0; s < TAIL_STEPS; s++) {
        double g = tail_grad(i, s), t = s + 1;
        if (o->kind == QKV_OPTIM_SGD) {
            double d = g + o->weight_decay * p;
            if (o->momentum != 0) {
                buf = s == 0 ? d : o->momentum * buf + (1 - o->dampening) * d;
                d = o->nesterov ? d + o->momentum * buf : buf;
            }
            p = p - o->lr * d;
        } else {
            if (o->kind == QKV_OPTIM_ADAMW) p = p * (1 - o->lr * o->weight_decay);
            else g = g + o->weight_decay * p;
            m = o->beta1 * m + (1 - o->beta1) * g;
            v = o->beta2 * v + (1 - o->beta2) * g * g;
            double denom = sqrt(v) / sqrt(1 - pow(o->beta2, t)) + o->eps;
            p = p - o->lr / (1 - pow(o->beta1, t)) * (m / denom);
        }
    }
    return p;
}

/* Run o for TAIL_STEPS steps on an n-element parameter of dtype dt. out gets the parameter's values,
 * then every state tensor's (as double: exact for f32, so equal bits compare equal); returns the count. */
static int64_t run_tail(qkv_optim_options o, qkv_dtype dt, int64_t n, double *out) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    double *v = malloc((size_t)n * sizeof *v);
    cr_assert_not_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = tail_start(i);
    qkv_tensor *p = param_of(ctx, dt, 1, &n, v);
    qkv_optimizer *opt = must_optim(ctx, &o, &p, 1);
    for (int s = 0; s < TAIL_STEPS; s++) {
        for (int64_t i = 0; i < n; i++) v[i] = tail_grad(i, s);
        set_grad(ctx, p, v);
        cr_assert_eq(qkv_optim_step(opt), QKV_OK, "%s", qkv_errmsg(ctx));
    }
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) out[k++] = at(p, i);
    for (int j = 1; j < qkv_optim_state_count(opt); j++) {
        const qkv_tensor *t = qkv_optim_state(opt, j, NULL);
        for (int64_t i = 0; i < t->numel; i++) out[k++] = at(t, i);
    }
    free(v);
    qkv_ctx_free(ctx);
    return k;
}

Test(optim_vector, f32_and_f64_runs_at_every_tail_size) {
    /* lr small enough that every reference value stays in [0.4, 2.6] (checked below) */
    const struct {
        const char *name;
        qkv_optim_options o;
    } configs[] = {
        {"sgd", sgd(0.01, 0, 0, false, 0)},
        {"sgd wd", sgd(0.01, 0, 0, false, 0.05)},
        {"sgd momentum", sgd(0.002, 0.9, 0.1, false, 0)},
        {"sgd momentum wd", sgd(0.002, 0.9, 0, false, 0.02)},
        {"sgd nesterov", sgd(0.002, 0.9, 0, true, 0)},
        {"sgd nesterov wd", sgd(0.002, 0.9, 0, true, 0.01)},
        {"adam", adam(QKV_OPTIM_ADAM, 0.01, 0.9, 0.999, 1e-8, 0)},
        {"adam l2", adam(QKV_OPTIM_ADAM, 0.01, 0.9, 0.999, 1e-8, 0.1)},
        {"adamw", adam(QKV_OPTIM_ADAMW, 0.01, 0.8, 0.99, 1e-6, 0.1)},
    };
    const int64_t most = 4 * 1000 + 4;
    double *f64a = malloc(most * sizeof(double)), *f64b = malloc(most * sizeof(double));
    double *f32a = malloc(most * sizeof(double)), *f32b = malloc(most * sizeof(double));
    cr_assert(f64a && f64b && f32a && f32b);
    for (int c = 0; c < (int)(sizeof configs / sizeof configs[0]); c++) {
        compare ref = {0}, f32 = {0};
        int repeat = 0, outside = 0;
        for (int z = 0; z < N_TAIL_SIZES; z++) {
            int64_t n = TAIL_SIZES[z];
            int64_t k64 = run_tail(configs[c].o, QKV_F64, n, f64a);
            int64_t k32 = run_tail(configs[c].o, QKV_F32, n, f32a);
            cr_assert_eq(k64, k32);
            cr_assert_eq(run_tail(configs[c].o, QKV_F64, n, f64b), k64);
            cr_assert_eq(run_tail(configs[c].o, QKV_F32, n, f32b), k32);
            /* a second identical run gives the same bits, parameter and state */
            repeat += memcmp(f64a, f64b, (size_t)k64 * sizeof(double)) != 0;
            repeat += memcmp(f32a, f32b, (size_t)k32 * sizeof(double)) != 0;
            for (int64_t i = 0; i < n; i++) {
                double want = tail_reference(&configs[c].o, i);
                outside += !(want >= 0.4 && want <= 2.6);
                /* f64: the same operations as the reference, up to the library's multiply by
                 * 1 / sqrt(1 - b2^t) where the reference divides: a few ulp */
                check_close(&ref, "f64 p", TAIL_STEPS, i, f64a[i], want, 1e-14, 0);
                /* f32 against f64: each step rounds p to f32, at most half an ulp, 1.2e-7 below 2.6;
                 * 20 steps make at most 2.4e-6, 6e-6 relative to p >= 0.4. Rounding m, v or buf to f32
                 * reaches p only through lr and adds under 1e-7. A wrong or skipped step moves p by
                 * about lr |g|, 1e-3 to 1e-2, far outside. */
                check_close(&f32, "f32 p", TAIL_STEPS, i, f32a[i], f64a[i], 1e-5, 0);
            }
        }
        cr_expect_eq(outside, 0, "%s: %d reference values outside [0.4, 2.6]", configs[c].name, outside);
        cr_expect_eq(repeat, 0, "%s: %d repeated runs gave other bits", configs[c].name, repeat);
        cr_expect_eq(ref.bad, 0, "%s: %d f64 values off the reference; worst %s", configs[c].name, ref.bad,
                     ref.where);
        cr_expect_eq(f32.bad, 0, "%s: %d f32 values off f64 by more than 1e-5; worst %s", configs[c].name,
                     f32.bad, f32.where);
    }
    free(f64a);
    free(f64b);
    free(f32a);
    free(f32b);
}

/* Gradients of full precision for the norm: x in (-1.5, 1.5), not a short binary fraction, f32-exact. */
static double clip_value(int64_t i) { return (double)(float)((tail_grad(i, 3) + 1.0 / 3) / (1 + i % 5)); }

/* Clip a (n elements of dtype dt, values clip_value(i) * 2^shift) with b (3 elements of f64) to half
 * their norm. Checks the norm against a long double sum (relative 1e-12: any order of adding n positive
 * terms is within (n - 1) 2^-53, 1.1e-13 at n = 1000, of the exact sum, and the square root halves it),
 * that every gradient became g coef exactly, and that a second call on the same gradients gives the
 * same bits. Returns the number of failed checks; what describes the first. */
static int clip_tail(qkv_dtype dt, int64_t n, int shift, char *what, size_t what_size) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    double *g0 = malloc((size_t)(n + 3) * sizeof *g0);
    cr_assert_not_null(g0);
    long double exact = 0;
    for (int64_t i = 0; i < n + 3; i++) {
        double x = clip_value(i);
        exact += (long double)x * x;
        g0[i] = ldexp(x, shift);
    }
    exact = ldexpl(sqrtl(exact), shift);
    qkv_tensor *a = param_of(ctx, dt, 1, &n, g0), *b = param_of(ctx, QKV_F64, 1, (int64_t[]){3}, g0 + n);
    qkv_tensor *ps[2] = {a, b};
    int bad = 0;
    double norms[2], max_norm = 0.5 * (double)exact;
    for (int call = 0; call < 2; call++) {
        set_grad(ctx, a, g0);
        set_grad(ctx, b, g0 + n);
        norms[call] = qkv_clip_grad_norm(ctx, ps, 2, max_norm);
        double coef = max_norm / (norms[call] + 1e-6);
        int64_t off = 0;
        for (int64_t i = 0; i < n + 3; i++) {
            double got = i < n ? at(a->grad, i) : qkv_f64(b->grad)[i - n];
            double want = i < n && dt == QKV_F32 ? (double)(float)(g0[i] * coef) : g0[i] * coef;
            if (got != want && !off++)
                snprintf(what, what_size, "grad[%lld] %.17g, want %.17g", (long long)i, got, want);
        }
        bad += off != 0;
    }
    if (qkv_error(ctx) != QKV_OK) bad++, snprintf(what, what_size, "%s", qkv_errmsg(ctx));
    if (!(fabsl(norms[0] - exact) <= 1e-12L * exact))
        bad++, snprintf(what, what_size, "norm %.17g, want %.17Lg", norms[0], exact);
    if (memcmp(&norms[0], &norms[1], sizeof(double)) != 0)
        bad++, snprintf(what, what_size, "norms %.17g then %.17g", norms[0], norms[1]);
    free(g0);
    qkv_ctx_free(ctx);
    return bad;
}

Test(optim_vector, clip_at_every_tail_size) {
    for (int z = 0; z < N_TAIL_SIZES; z++) {
        char what[160] = "";
        int64_t n = TAIL_SIZES[z];
        cr_expect_eq(clip_tail(QKV_F64, n, 0, what, sizeof what), 0, "f64, n %lld: %s", (long long)n, what);
        cr_expect_eq(clip_tail(QKV_F32, n, 0, what, sizeof what), 0, "f32, n %lld: %s", (long long)n, what);
        /* 2^700: the squares overflow double, so the norm comes from the rescaled sum */
        cr_expect_eq(clip_tail(QKV_F64, n, 700, what, sizeof what), 0, "f64 * 2^700, n %lld: %s", (long long)n,
                     what);
    }
}

/* ---- state for checkpoints --------------------------------------------------------------------------- */

Test(optim_state, names_order_and_defaults) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *w = param_of(ctx, QKV_F32, 2, (int64_t[]){2, 3}, (double[]){1, 2, 3, 4, 5, 6});
    qkv_tensor *v = param_of(ctx, QKV_F64, 1, (int64_t[]){2}, (double[]){1, 2});
    qkv_tensor *ps[2] = {w, v};

    qkv_optim_options o = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    o.param_names = (const char *const[]){"wq", "bias"};
    qkv_optimizer *opt = must_optim(ctx, &o, ps, 2);
    const char *want[] = {"step", "wq.step", "wq.exp_avg", "wq.exp_avg_sq", "bias.step", "bias.exp_avg",
                          "bias.exp_avg_sq"};
    cr_assert_eq(qkv_optim_state_count(opt), 7);
    for (int k = 0; k < 7; k++) {
        const char *name = NULL;
        qkv_tensor *t = qkv_optim_state(opt, k, &name);
        cr_assert_not_null(t);
        cr_expect_str_eq(name, want[k]);
        bool scalar = strstr(name, "step") != NULL;
        qkv_tensor *like = k < 4 ? w : v;
        cr_expect_eq(t->dtype, scalar ? QKV_F64 : like->dtype, "%s dtype", name);
        cr_expect_eq(t->numel, scalar ? 1 : like->numel, "%s numel", name);
        cr_expect_eq(t->ndim, scalar ? 0 : like->ndim, "%s ndim", name);
        cr_expect_eq(at(t, 0), 0.0, "%s starts at zero", name);
        cr_expect(!t->requires_grad);
    }
    /* the options come back as given: PyTorch's AdamW defaults */
    qkv_optim_options r = qkv_optim_get_options(opt);
    cr_expect(r.lr == 1e-3 && r.beta1 == 0.9 && r.beta2 == 0.999 && r.eps == 1e-8 && r.weight_decay == 1e-2);
    cr_expect_null(r.param_names);
    qkv_optim_free(opt);

    qkv_optim_options aw = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    cr_expect(aw.lr == 1e-3 && aw.weight_decay == 1e-2 && aw.beta1 == 0.9 && aw.beta2 == 0.999 &&
              aw.eps == 1e-8);
    opt = must_optim(ctx, NULL, ps, 2); /* NULL options: Adam's defaults */
    cr_expect_eq(qkv_optim_get_options(opt).kind, QKV_OPTIM_ADAM);
    const char *name;
    qkv_optim_state(opt, 6, &name);
    cr_expect_str_eq(name, "param1.exp_avg_sq");
    qkv_optim_free(opt);

    o = sgd(0.1, 0.9, 0, false, 0);
    opt = must_optim(ctx, &o, ps, 2);
    cr_expect_eq(qkv_optim_state_count(opt), 5);
    qkv_optim_state(opt, 2, &name);
    cr_expect_str_eq(name, "param0.momentum_buffer");
    qkv_optim_free(opt);
    o = sgd(0.1, 0, 0, false, 0);
    opt = must_optim(ctx, &o, ps, 2);
    cr_expect_eq(qkv_optim_state_count(opt), 1, "plain SGD keeps only the step count");
    qkv_optim_free(opt);
    cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

/* Train 3 steps, copy the state into a fresh optimizer over copies of the parameters, train both 2 more
 * steps: the results match bit for bit (what --save / --load relies on). */
static void restore_matches(qkv_optim_options o) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = param_of(ctx, QKV_F32, 1, (int64_t[]){3}, golden_a0);
    qkv_tensor *b = param_of(ctx, QKV_F64, 2, (int64_t[]){2, 2}, golden_b0);
    qkv_optimizer *opt = must_optim(ctx, &o, (qkv_tensor *[]){a, b}, 2);
    for (int s = 0; s < 3; s++) {
        set_grad(ctx, a, golden_grad_a[s]);
        if (s >= 1) set_grad(ctx, b, golden_grad_b[s]);
        cr_assert_eq(qkv_optim_step(opt), QKV_OK, "%s", qkv_errmsg(ctx));
    }
    qkv_tensor *a2 = qkv_param(ctx, a), *b2 = qkv_param(ctx, b);
    qkv_optimizer *opt2 = must_optim(ctx, &o, (qkv_tensor *[]){a2, b2}, 2);
    cr_assert_eq(qkv_optim_state_count(opt2), qkv_optim_state_count(opt));
    for (int k = 0; k < qkv_optim_state_count(opt); k++) {
        const char *n1, *n2;
        qkv_tensor *from = qkv_optim_state(opt, k, &n1), *to = qkv_optim_state(opt2, k, &n2);
        cr_expect_str_eq(n1, n2);
        cr_assert_eq(qkv_copy_into(ctx, to, from), QKV_OK, "%s", qkv_errmsg(ctx));
    }
    cr_expect_eq(qkv_optim_step_count(opt2), 3);
    for (int s = 3; s < 5; s++) {
        set_grad(ctx, a, golden_grad_a[s]);
        set_grad(ctx, b, golden_grad_b[s]);
        set_grad(ctx, a2, golden_grad_a[s]);
        set_grad(ctx, b2, golden_grad_b[s]);
        cr_assert_eq(qkv_optim_step(opt), QKV_OK);
        cr_assert_eq(qkv_optim_step(opt2), QKV_OK);
    }
    cr_expect(memcmp(a->data, a2->data, 3 * sizeof(float)) == 0, "a resumes bit for bit");
    cr_expect(memcmp(b->data, b2->data, 4 * sizeof(double)) == 0, "b resumes bit for bit");
    cr_expect(qkv_f64(b)[0] != golden_b0[0], "b moved");
    qkv_ctx_free(ctx);
}

Test(optim_state, restore_resumes_bit_for_bit) {
    restore_matches(adam(QKV_OPTIM_ADAM, 0.01, 0.9, 0.999, 1e-8, 0.1));
    restore_matches(adam(QKV_OPTIM_ADAMW, 0.01, 0.8, 0.99, 1e-6, 0.1));
    restore_matches(sgd(0.05, 0.9, 0.1, false, 0.01));
}

Test(optim_state, a_bad_restored_step_count_is_refused_and_changes_nothing) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *p = param_of(ctx, QKV_F64, 1, (int64_t[]){2}, (double[]){1, 2});
    qkv_optim_options o = adam(QKV_OPTIM_ADAM, 0.1, 0.9, 0.999, 1e-8, 0);
    o.param_names = (const char *const[]){"wk"};
    qkv_optimizer *opt = must_optim(ctx, &o, &p, 1);
    set_grad(ctx, p, (double[]){1, 1});
    cr_assert_eq(qkv_optim_step(opt), QKV_OK);
    double before = qkv_f64(p)[0];
    const double bad[] = {-1, 1.5, NAN, INFINITY};
    for (int k = 0; k < 4; k++) {
        for (int which = 0; which < 2; which++) {
            qkv_tensor *t = qkv_optim_state(opt, which, NULL);
            double keep = qkv_f64(t)[0];
            qkv_f64(t)[0] = bad[k];
            cr_expect_eq(qkv_optim_step(opt), QKV_ERR_STATE);
            cr_expect(strstr(qkv_errmsg(ctx), which ? "\"wk.step\"" : "\"step\"") &&
                          strstr(qkv_errmsg(ctx), "whole number"),
                      "%s", qkv_errmsg(ctx));
            cr_expect_eq(qkv_f64(p)[0], before, "nothing changed");
            qkv_f64(t)[0] = keep;
            qkv_clear_error(ctx);
        }
    }
    cr_expect_eq(qkv_optim_step(opt), QKV_OK);
    cr_expect_eq(qkv_optim_step_count(opt), 2);
    qkv_ctx_free(ctx);
}

/* ---- behaviour ----------------------------------------------------------------------------------- */

Test(optim_behaviour, params_without_gradients_are_skipped) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = param_of(ctx, QKV_F64, 1, (int64_t[]){2}, (double[]){1, 2});
    qkv_tensor *b = param_of(ctx, QKV_F64, 1, (int64_t[]){2}, (double[]){3, 4});
    qkv_optimizer *opt = must_optim(ctx, NULL, (qkv_tensor *[]){a, b}, 2);
    set_grad(ctx, a, (double[]){1, 1});
    cr_assert_eq(qkv_optim_step(opt), QKV_OK);
    cr_expect(qkv_f64(a)[0] < 1.0);
    cr_expect(qkv_f64(b)[0] == 3.0 && qkv_f64(b)[1] == 4.0 && b->grad == NULL);
    cr_expect_eq(qkv_f64(qkv_optim_state(opt, 4, NULL))[0], 0.0, "param1.step did not advance");
    cr_expect_eq(qkv_f64(qkv_optim_state(opt, 1, NULL))[0], 1.0, "param0.step did");
    qkv_ctx_free(ctx);
}

Test(optim_behaviour, set_lr_zero_grad_and_sticky_errors) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *p = param_of(ctx, QKV_F32, 1, (int64_t[]){2}, (double[]){1, 2});
    qkv_optim_options o = sgd(0.5, 0, 0, false, 0);
    qkv_optimizer *opt = must_optim(ctx, &o, &p, 1);
    set_grad(ctx, p, (double[]){1, -1});
    cr_expect_eq(qkv_optim_lr(opt), 0.5);
    cr_assert_eq(qkv_optim_set_lr(opt, 0.0), QKV_OK, "lr 0 is legal later (warm-up)");
    cr_assert_eq(qkv_optim_step(opt), QKV_OK);
    cr_expect(qkv_f32(p)[0] == 1.0f && qkv_f32(p)[1] == 2.0f);
    cr_assert_eq(qkv_optim_set_lr(opt, 0.25), QKV_OK);
    cr_assert_eq(qkv_optim_step(opt), QKV_OK);
    cr_expect(qkv_f32(p)[0] == 0.75f && qkv_f32(p)[1] == 2.25f, "%g %g", (double)qkv_f32(p)[0],
              (double)qkv_f32(p)[1]);
    cr_expect(qkv_f32(p->grad)[0] == 1.0f, "a step does not zero the gradients");
    cr_assert_eq(qkv_optim_zero_grad(opt), QKV_OK);
    cr_expect(qkv_f32(p->grad)[0] == 0.0f && qkv_f32(p->grad)[1] == 0.0f);
    cr_expect_eq(qkv_optim_step_count(opt), 2);

    /* an errored context: every call returns the stored code and changes nothing */
    qkv_fail_(ctx, QKV_ERR_SHAPE, "an earlier failure");
    set_grad(ctx, p, (double[]){1, 1});
    cr_expect_eq(qkv_optim_step(opt), QKV_ERR_SHAPE);
    cr_expect_eq(qkv_optim_set_lr(opt, 1.0), QKV_ERR_SHAPE);
    cr_expect_eq(qkv_optim_zero_grad(opt), QKV_ERR_SHAPE);
    cr_expect(isnan(qkv_clip_grad_norm(ctx, &p, 1, 1.0)));
    cr_expect_null(qkv_optim_new(ctx, &o, &p, 1));
    cr_expect(qkv_f32(p)[0] == 0.75f && qkv_optim_lr(opt) == 0.25 && qkv_optim_step_count(opt) == 2);
    cr_expect_str_eq(qkv_errmsg(ctx), "an earlier failure");
    qkv_ctx_free(ctx);
}

Test(optim_behaviour, null_optimizer) {
    cr_expect_eq(qkv_optim_step(NULL), QKV_ERR_NULL);
    cr_expect_eq(qkv_optim_zero_grad(NULL), QKV_ERR_NULL);
    cr_expect_eq(qkv_optim_set_lr(NULL, 1), QKV_ERR_NULL);
    cr_expect_eq(qkv_optim_step_count(NULL), 0);
    cr_expect_eq(qkv_optim_state_count(NULL), 0);
    cr_expect(isnan(qkv_optim_lr(NULL)));
    const char *name = "x";
    cr_expect_null(qkv_optim_state(NULL, 0, &name));
    cr_expect_null(name);
    qkv_optim_free(NULL);
    cr_expect_null(qkv_optim_new(NULL, NULL, NULL, 0));
    cr_expect(isnan(qkv_clip_grad_norm(NULL, NULL, 0, 1)));
}

/* ---- memory -------------------------------------------------------------------------------------- */

static qkv_ctx *counting_ctx(counting *c) {
    qkv_options o = qkv_default_options();
    o.allocator = counting_allocator(c);
    o.arena_chunk = 4096;
    return qkv_ctx_new(&o);
}

/* One training-like step: forward, backward, clip, update, zero. */
static void train_step(qkv_ctx *ctx, qkv_optimizer *opt, qkv_tensor *w, qkv_tensor *b) {
    qkv_tensor *x = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){4, 8, 16}, 0, 1);
    qkv_tensor *y = qkv_add(ctx, qkv_mul(ctx, x, w), b);
    qkv_tensor *loss = qkv_mean(ctx, qkv_mul(ctx, y, y));
    cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    size_t used = qkv_arena_used(ctx);
    qkv_tensor *ps[2] = {w, b};
    cr_assert(isfinite(qkv_clip_grad_norm(ctx, ps, 2, 0.5)));
    cr_assert_eq(qkv_optim_step(opt), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_assert_eq(qkv_optim_zero_grad(opt), QKV_OK);
    cr_assert_eq(qkv_arena_used(ctx), used, "clip, step and zero_grad use no arena memory");
    qkv_step_end(ctx);
}

Test(optim_memory, a_step_makes_no_heap_allocation) {
    const qkv_optim_options opts[3] = {sgd(0.1, 0.9, 0, true, 0.01), adam(QKV_OPTIM_ADAM, 0.01, 0.9, 0.999, 1e-8, 0.1),
                                       adam(QKV_OPTIM_ADAMW, 0.01, 0.9, 0.999, 1e-8, 0.1)};
    for (int k = 0; k < 3; k++) {
        counting c = {0};
        qkv_ctx *ctx = counting_ctx(&c);
        qkv_tensor *w = qkv_param(ctx, qkv_randn(ctx, QKV_F32, 2, (int64_t[]){8, 16}, 0, 1));
        qkv_tensor *b = qkv_param(ctx, qkv_zeros(ctx, QKV_F32, 1, (int64_t[]){16}));
        qkv_optimizer *opt = must_optim(ctx, &opts[k], (qkv_tensor *[]){w, b}, 2);
        qkv_step_end(ctx);
        train_step(ctx, opt, w, b); /* makes the gradients and grows the arena */
        long before = c.calls;
        for (int s = 0; s < 5; s++) train_step(ctx, opt, w, b);
        cr_expect_eq(c.calls, before, "kind %d: steps 2-6 made %ld heap allocations", k,
                     c.calls - before);
        cr_expect_eq(qkv_optim_step_count(opt), 6);
        long live = c.live;
        qkv_optim_free(opt);
        cr_expect_lt(c.live, live, "qkv_optim_free releases its memory");
        qkv_ctx_free(ctx);
        cr_expect_eq(c.live, 0);
    }
}

Test(optim_memory, allocation_failures_in_new_are_reported_and_leak_nothing) {
    int failures = 0;
    for (long k = 1; k <= 40; k++) {
        counting c = {0};
        qkv_ctx *ctx = counting_ctx(&c);
        qkv_tensor *w = qkv_param(ctx, qkv_ones(ctx, QKV_F64, 2, (int64_t[]){4, 4}));
        qkv_tensor *b = qkv_param(ctx, qkv_ones(ctx, QKV_F32, 1, (int64_t[]){4}));
        cr_assert_eq(qkv_error(ctx), QKV_OK);
        long live = c.live;
        c.fail_at = c.calls + k;
        qkv_optimizer *opt = qkv_optim_new(ctx, NULL, (qkv_tensor *[]){w, b}, 2);
        if (!opt) {
            failures++;
            cr_expect_eq(qkv_error(ctx), QKV_ERR_NOMEM, "k=%ld: %s", k, qkv_errmsg(ctx));
            cr_expect(strstr(qkv_errmsg(ctx), "out of memory") != NULL, "%s", qkv_errmsg(ctx));
            cr_expect_eq(c.live, live, "k=%ld: a failed qkv_optim_new leaked %ld blocks", k, c.live - live);
        } else {
            cr_expect_eq(qkv_error(ctx), QKV_OK);
            qkv_optim_free(opt);
            cr_expect_eq(c.live, live, "k=%ld: qkv_optim_free left %ld blocks", k, c.live - live);
        }
        qkv_ctx_free(ctx);
        cr_expect_eq(c.live, 0);
    }
    cr_expect_geq(failures, 7, "every allocation of qkv_optim_new was failed once (%d)", failures);
}

/* ---- misuse ------------------------------------------------------------------------------------------ */

typedef struct misuse {
    const char *what;
    qkv_optim_options o;
    int which; /* 0: good params; 1: NULL params; 2: n = 0; 3: a NULL entry; 4: i32; 5: step tensor;
                  6: a duplicate; 7: NULL name; 8: empty name; 9: duplicate names */
    qkv_status status;
    const char *fragment;
} misuse;

Test(optim_errors, optim_new_table) {
    qkv_optim_options bad_kind = qkv_optim_defaults(QKV_OPTIM_ADAM);
    bad_kind.kind = (qkv_optim_kind)7;
    qkv_optim_options adam_d = qkv_optim_defaults(QKV_OPTIM_ADAM);
    qkv_optim_options sgd_ok = sgd(0.1, 0, 0, false, 0);
    qkv_optim_options sgd_beta = sgd_ok;
    sgd_beta.beta1 = 0.9;
    qkv_optim_options adam_mom = adam_d;
    adam_mom.momentum = 0.9;
    qkv_optim_options adam_nest = adam_d;
    adam_nest.nesterov = true;
    qkv_optim_options sgd_unset = qkv_optim_defaults(QKV_OPTIM_SGD);
    sgd_unset.momentum = 0.9;
    const misuse table[] = {
        {"params NULL", adam_d, 1, QKV_ERR_NULL, "qkv_optim_new: params is NULL"},
        {"n 0", adam_d, 2, QKV_ERR_ARG, "qkv_optim_new: n is 0"},
        {"NULL entry", adam_d, 3, QKV_ERR_NULL, "qkv_optim_new: params[1] is NULL"},
        {"i32 param", adam_d, 4, QKV_ERR_DTYPE, "params[1] [3] is i32, must be f32 or f64"},
        {"step tensor", adam_d, 5, QKV_ERR_ARG, "params[1] [3] is a step tensor"},
        {"duplicate", adam_d, 6, QKV_ERR_ARG, "params[0] and params[1] are the same tensor [2,2]"},
        {"NULL name", adam_d, 7, QKV_ERR_NULL, "param_names[1] is NULL"},
        {"empty name", adam_d, 8, QKV_ERR_ARG, "param_names[1] is empty"},
        {"same names", adam_d, 9, QKV_ERR_ARG, "param_names[0] and param_names[1] are both \"w\""},
        {"bad kind", bad_kind, 0, QKV_ERR_ARG, "kind 7 is not"},
        {"sgd lr not set", sgd_unset, 0, QKV_ERR_ARG, "SGD needs a learning rate (lr is nan"},
        {"lr < 0", sgd(-0.1, 0, 0, false, 0), 0, QKV_ERR_ARG, "lr -0.1 must be finite"},
        {"lr nan", adam(QKV_OPTIM_ADAM, NAN, 0, 0, 0, 0), 0, QKV_ERR_ARG, "lr nan must be finite"},
        {"lr inf", adam(QKV_OPTIM_ADAM, INFINITY, 0, 0, 0, 0), 0, QKV_ERR_ARG, "lr inf"},
        {"momentum < 0", sgd(0.1, -0.5, 0, false, 0), 0, QKV_ERR_ARG, "momentum -0.5"},
        {"dampening nan", sgd(0.1, 0.5, NAN, false, 0), 0, QKV_ERR_ARG, "dampening nan"},
        {"nesterov, no momentum", sgd(0.1, 0, 0, true, 0), 0, QKV_ERR_ARG, "nesterov needs momentum > 0"},
        {"nesterov, dampening", sgd(0.1, 0.9, 0.1, true, 0), 0, QKV_ERR_ARG, "and dampening 0"},
        {"weight decay < 0", sgd(0.1, 0, 0, false, -1), 0, QKV_ERR_ARG, "weight_decay -1"},
        {"beta1 1", adam(QKV_OPTIM_ADAM, 0.1, 1.0, 0, 0, 0), 0, QKV_ERR_ARG,
         "beta1 1 must be finite and in [0, 1)"},
        {"beta2 < 0", adam(QKV_OPTIM_ADAMW, 0.1, 0, -0.1, 0, 0), 0, QKV_ERR_ARG, "beta2 -0.1"},
        {"eps < 0", adam(QKV_OPTIM_ADAM, 0.1, 0, 0, -1e-8, 0), 0, QKV_ERR_ARG, "eps -1e-08"},
        {"SGD with a beta", sgd_beta, 0, QKV_ERR_ARG, "apply to Adam and AdamW, not SGD"},
        {"Adam with momentum", adam_mom, 0, QKV_ERR_ARG, "apply to SGD, not Adam"},
        {"Adam with nesterov", adam_nest, 0, QKV_ERR_ARG, "apply to SGD, not Adam"},
    };
    int n = (int)(sizeof table / sizeof table[0]);
    for (int k = 0; k < n; k++) {
        const misuse *m = &table[k];
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *w = param_of(ctx, QKV_F64, 2, (int64_t[]){2, 2}, (double[]){1, 2, 3, 4});
        qkv_tensor *v = param_of(ctx, QKV_F32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
        qkv_tensor *i32 = qkv_keep(ctx, qkv_zeros(ctx, QKV_I32, 1, (int64_t[]){3}));
        qkv_tensor *step = qkv_zeros(ctx, QKV_F32, 1, (int64_t[]){3});
        qkv_tensor *ps[2] = {w, v};
        qkv_optim_options o = m->o;
        const char *null_name[2] = {"w", NULL}, *empty[2] = {"w", ""}, *same[2] = {"w", "w"};
        if (m->which == 3) ps[1] = NULL;
        if (m->which == 4) ps[1] = i32;
        if (m->which == 5) ps[1] = step;
        if (m->which == 6) ps[1] = w;
        if (m->which == 7) o.param_names = null_name;
        if (m->which == 8) o.param_names = empty;
        if (m->which == 9) o.param_names = same;
        qkv_optimizer *opt = qkv_optim_new(ctx, &o, m->which == 1 ? NULL : ps, m->which == 2 ? 0 : 2);
        cr_expect_null(opt, "%s: accepted", m->what);
        cr_expect_eq(qkv_error(ctx), m->status, "%s: %s, want %s (%s)", m->what,
                     qkv_status_name(qkv_error(ctx)), qkv_status_name(m->status), qkv_errmsg(ctx));
        cr_expect(strstr(qkv_errmsg(ctx), m->fragment) != NULL, "%s: message \"%s\" lacks \"%s\"", m->what,
                  qkv_errmsg(ctx), m->fragment);
        qkv_ctx_free(ctx);
    }
}

Test(optim_errors, other_functions) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *p = param_of(ctx, QKV_F64, 1, (int64_t[]){2}, (double[]){1, 2});
    qkv_optimizer *opt = must_optim(ctx, NULL, &p, 1);
    const struct {
        int call;
        double arg;
        qkv_status status;
        const char *fragment;
    } table[] = {
        {0, -1, QKV_ERR_ARG, "qkv_optim_set_lr: lr -1 must be finite and >= 0"},
        {0, NAN, QKV_ERR_ARG, "qkv_optim_set_lr: lr nan"},
        {1, 4, QKV_ERR_ARG, "qkv_optim_state: index 4 is outside [0, 4)"},
        {1, -1, QKV_ERR_ARG, "qkv_optim_state: index -1"},
        {2, -1, QKV_ERR_ARG, "qkv_clip_grad_norm: max_norm -1 must be finite and >= 0"},
        {2, NAN, QKV_ERR_ARG, "qkv_clip_grad_norm: max_norm nan"},
        {3, 1, QKV_ERR_NULL, "qkv_clip_grad_norm: params is NULL"},
        {4, 1, QKV_ERR_ARG, "qkv_clip_grad_norm: n is 0"},
        {5, 1, QKV_ERR_NULL, "qkv_clip_grad_norm: params[1] is NULL"},
        {6, 1, QKV_ERR_DTYPE, "qkv_clip_grad_norm: params[1] [3] is u8"},
        {7, 1, QKV_ERR_ARG, "params[0] and params[1] are the same tensor [2]"},
    };
    for (int k = 0; k < (int)(sizeof table / sizeof table[0]); k++) {
        qkv_tensor *u8 = qkv_zeros(ctx, QKV_U8, 1, (int64_t[]){3});
        qkv_tensor *two[2] = {p, NULL};
        double r = 0;
        switch (table[k].call) {
        case 0: cr_expect_eq(qkv_optim_set_lr(opt, table[k].arg), table[k].status); break;
        case 1: cr_expect_null(qkv_optim_state(opt, (int)table[k].arg, NULL)); break;
        case 2: r = qkv_clip_grad_norm(ctx, &p, 1, table[k].arg); break;
        case 3: r = qkv_clip_grad_norm(ctx, NULL, 1, 1); break;
        case 4: r = qkv_clip_grad_norm(ctx, &p, 0, 1); break;
        case 5: r = qkv_clip_grad_norm(ctx, two, 2, 1); break;
        case 6: two[1] = u8; r = qkv_clip_grad_norm(ctx, two, 2, 1); break;
        case 7: two[1] = p; r = qkv_clip_grad_norm(ctx, two, 2, 1); break;
        }
        if (table[k].call >= 2) cr_expect(isnan(r), "row %d returns NaN", k);
        cr_expect_eq(qkv_error(ctx), table[k].status, "row %d: %s", k, qkv_errmsg(ctx));
        cr_expect(strstr(qkv_errmsg(ctx), table[k].fragment) != NULL, "row %d: \"%s\" lacks \"%s\"", k,
                  qkv_errmsg(ctx), table[k].fragment);
        qkv_clear_error(ctx);
    }
    cr_expect_eq(qkv_optim_lr(opt), 1e-3, "a refused lr changes nothing");
    qkv_ctx_free(ctx);
}

/* AdamW on a parameter large enough to be split between threads (3 QKV_ADAM_GRAIN_ + 5 elements, f32 and f64):
 * 1, 2 and 3 threads give the same bits after three steps. */
Test(optim_threads, adamw_same_bits_with_any_thread_count) {
    const int64_t n = 3 * QKV_ADAM_GRAIN_ + 5;
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        size_t bytes = (size_t)n * qkv_dtype_size(dt);
        unsigned char *result[3];
        for (int t = 0; t < 3; t++) {
            qkv_options co = qkv_default_options();
            co.threads = t + 1;
            co.seed = 11;
            qkv_ctx *ctx = qkv_ctx_new(&co);
            cr_assert_not_null(ctx);
            qkv_tensor *p = qkv_param(ctx, qkv_randn(ctx, dt, 1, (int64_t[]){n}, 0, 1));
            qkv_optim_options o = adam(QKV_OPTIM_ADAMW, 1e-2, 0.9, 0.999, 1e-8, 0.1);
            qkv_optimizer *opt = must_optim(ctx, &o, &p, 1);
            for (int step = 0; step < 3; step++) {
                qkv_tensor *g = qkv_randn(ctx, dt, 1, (int64_t[]){n}, 0, 1);
                cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, p, g)), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
                cr_assert_eq(qkv_optim_step(opt), QKV_OK, "%s", qkv_errmsg(ctx));
                qkv_optim_zero_grad(opt);
                qkv_step_end(ctx);
            }
            result[t] = malloc(bytes);
            cr_assert_not_null(result[t]);
            memcpy(result[t], p->data, bytes);
            qkv_optim_free(opt);
            qkv_ctx_free(ctx);
        }
        cr_expect_eq(memcmp(result[0], result[1], bytes), 0, "%s: 1 and 2 threads differ", qkv_dtype_name(dt));
        cr_expect_eq(memcmp(result[0], result[2], bytes), 0, "%s: 1 and 3 threads differ", qkv_dtype_name(dt));
        for (int t = 0; t < 3; t++) free(result[t]);
    }
}
