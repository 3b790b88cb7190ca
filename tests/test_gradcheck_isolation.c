/*
 * test_gradcheck_isolation.c — qkv_gradcheck touches nothing of the caller's but what it restores, or
 * refuses. fn may build on tensors the caller made (a parameter with a gradient, a step leaf, a recorded
 * intermediate of the caller's graph): their gradients, the caller's tape and the arena are exactly as
 * before, and the caller's backward afterwards gives the gradient it would have given. Refused, each with
 * a message naming qkv_gradcheck and the problem, and with the caller's state unchanged: an output the
 * caller recorded, a tensor passed twice, an fn that calls qkv_step_end (at every call of fn: the probe,
 * the recorded forward, the finite differences) or qkv_backward, and a failing backward (an allocation
 * fault). Run under ASan (./build.sh asan) these also show that nothing released is read or written.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "qkv_internal.h"
#include "test_alloc.h"
#include "test_ops.h"

/* What a test snapshots of the caller's state, to compare after the check. */
typedef struct snapshot {
    qkv_node_ *tape;
    bool tape_consumed, grad_enabled;
    size_t arena_used;
    uint32_t epoch;
} snapshot;

static snapshot snap(const qkv_ctx *ctx) {
    return (snapshot){ctx->tape, ctx->tape_consumed, ctx->grad_enabled, qkv_arena_used(ctx), ctx->epoch};
}

static void expect_same_state(const qkv_ctx *ctx, snapshot s, const char *what) {
    cr_expect_eq(ctx->tape, s.tape, "%s: the caller's tape moved", what);
    cr_expect_eq(ctx->tape_consumed, s.tape_consumed, "%s: the tape's consumed flag changed", what);
    cr_expect_eq(ctx->grad_enabled, s.grad_enabled, "%s: the grad mode changed", what);
    cr_expect_eq(qkv_arena_used(ctx), s.arena_used, "%s: the arena was not rewound", what);
    cr_expect_eq(ctx->epoch, s.epoch, "%s: the step changed", what);
}

/* A copy of t's gradient values (n of them), to compare after the check. */
static void copy_grad(const qkv_tensor *t, double *dst, int64_t n) {
    cr_assert_not_null(t->grad);
    cr_assert_eq(t->grad->numel, n);
    for (int64_t i = 0; i < n; i++) dst[i] = at(t->grad, i);
}

static void expect_grad_values(const qkv_tensor *t, const double *want, int64_t n, const char *what) {
    cr_assert_not_null(t->grad, "%s: the gradient is gone", what);
    for (int64_t i = 0; i < n; i++)
        cr_expect_eq(at(t->grad, i), want[i], "%s: gradient element %lld is %.17g, was %.17g", what, (long long)i,
                     at(t->grad, i), want[i]);
}

/* The tensors fn builds on, passed through `user`. */
typedef struct world {
    qkv_tensor *w;     /* a parameter (persistent, requires grad, has a gradient) */
    qkv_tensor *fresh; /* a parameter with no gradient yet                         */
    qkv_tensor *s;     /* a step leaf that requires grad, no gradient              */
    qkv_tensor *h;     /* h = w * s, recorded by the caller                        */
    int calls, end_at; /* fn's calls so far; the call that ends the step (0: none)  */
    bool backward_in_fn;
} world;

/* out = (a + h) * w + a * fresh * s: every kind of caller tensor, and a, the checked input. */
static qkv_tensor *builds_on_caller(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)n;
    world *wd = user;
    return qkv_add(ctx, qkv_mul(ctx, qkv_add(ctx, in[0], wd->h), wd->w),
                   qkv_mul(ctx, qkv_mul(ctx, in[0], wd->fresh), wd->s));
}

static world make_world(qkv_ctx *ctx) {
    world wd = {0};
    wd.w = qkv_param(ctx, qkv_randn(ctx, QKV_F64, 1, (int64_t[]){4}, 0, 1));
    wd.fresh = qkv_param(ctx, qkv_randn(ctx, QKV_F64, 1, (int64_t[]){4}, 0, 1));
    /* w gets a gradient from an earlier step */
    qkv_tensor *x0 = qkv_randn(ctx, QKV_F64, 1, (int64_t[]){4}, 0, 1);
    cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, wd.w, x0)), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_step_end(ctx);
    wd.s = qkv_randn(ctx, QKV_F64, 1, (int64_t[]){4}, 0, 1);
    cr_assert_eq(qkv_set_requires_grad(ctx, wd.s, true), QKV_OK);
    wd.h = qkv_mul(ctx, wd.w, wd.s);
    cr_assert_not_null(wd.h, "%s", qkv_errmsg(ctx));
    return wd;
}

Test(gradcheck_isolation, fn_building_on_the_callers_tensors_changes_none_of_them) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    world wd = make_world(ctx);
    qkv_tensor *loss = qkv_sum(ctx, wd.h); /* the caller's graph, not yet walked */
    qkv_tensor *w_grad = wd.w->grad;
    double w_before[4];
    copy_grad(wd.w, w_before, 4);
    qkv_tensor *a = qkv_randn(ctx, QKV_F64, 1, (int64_t[]){4}, 0, 1);
    snapshot s = snap(ctx);

    qkv_gradcheck_result res;
    cr_assert_eq(qkv_gradcheck(ctx, builds_on_caller, &a, 1, &wd, NULL, &res), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect(res.passed, "%s", res.message);
    cr_expect_eq(res.checked, 4);
    expect_same_state(ctx, s, "builds on the caller's tensors");
    cr_expect_eq(wd.w->grad, w_grad, "the parameter's gradient tensor was replaced");
    expect_grad_values(wd.w, w_before, 4, "the parameter w");
    cr_expect_null(wd.fresh->grad, "a parameter with no gradient got one (the next optimizer step would apply it)");
    cr_expect_null(wd.s->grad, "the step leaf's gradient points into memory the check released");
    cr_expect_null(wd.h->grad, "the caller's intermediate got a gradient");
    cr_expect_null(a->grad);
    cr_expect(!a->requires_grad);

    /* the caller's own backward still runs, and gives what it would have: dw += s, ds = w */
    cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(at(wd.w->grad, i), w_before[i] + at(wd.s, i), "dw[%d]", i);
        cr_expect_eq(at(wd.s->grad, i), at(wd.w, i), "ds[%d]", i);
    }
    cr_expect_null(wd.fresh->grad);
    qkv_ctx_free(ctx);
}

/* fn returns what the caller recorded, or one of the caller's leaves. */
static qkv_tensor *returns_callers_h(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)ctx, (void)in, (void)n;
    return ((world *)user)->h;
}

static qkv_tensor *returns_callers_param(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)ctx, (void)in, (void)n;
    return ((world *)user)->w;
}

/* in[1] is a caller-recorded tensor passed as an input; fn returns it as it is. */
static qkv_tensor *returns_input_1(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)ctx, (void)n, (void)user;
    return qkv_add(ctx, in[0], in[1]) ? in[1] : NULL;
}

Test(gradcheck_isolation, an_output_the_caller_recorded_is_refused) {
    struct {
        qkv_gradcheck_fn fn;
        const char *frag;
    } cases[] = {
        {returns_callers_h, "fn's output [4] (made by qkv_mul) was recorded before qkv_gradcheck was called"},
        {returns_input_1, "fn's output [4] (made by qkv_mul) was recorded before qkv_gradcheck was called"},
        {returns_callers_param, "fn's output [4] does not depend on any checked input"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        world wd = make_world(ctx);
        qkv_tensor *w_grad = wd.w->grad;
        double w_before[4];
        copy_grad(wd.w, w_before, 4);
        qkv_tensor *in[2] = {qkv_randn(ctx, QKV_F64, 1, (int64_t[]){4}, 0, 1), wd.h};
        snapshot s = snap(ctx);
        qkv_gradcheck_result res;
        cr_expect_eq(qkv_gradcheck(ctx, cases[c].fn, in, 2, &wd, NULL, &res), QKV_ERR_STATE, "case %zu: %s", c,
                     qkv_errmsg(ctx));
        cr_expect(strncmp(qkv_errmsg(ctx), "qkv_gradcheck: ", 15) == 0 && strstr(qkv_errmsg(ctx), cases[c].frag),
                  "case %zu: %s", c, qkv_errmsg(ctx));
        expect_same_state(ctx, s, "a refused output");
        cr_expect_eq(wd.w->grad, w_grad);
        expect_grad_values(wd.w, w_before, 4, "the parameter w");
        cr_expect_null(wd.s->grad, "case %zu: the caller's graph was walked", c);
        cr_expect_null(wd.h->grad, "case %zu", c);
        cr_expect_null(wd.fresh->grad, "case %zu", c);
        qkv_ctx_free(ctx);
    }
}

static qkv_tensor *square(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)user;
    return n == 2 ? qkv_mul(ctx, in[0], in[1]) : qkv_mul(ctx, in[0], in[0]);
}

Test(gradcheck_isolation, the_same_tensor_twice_is_refused) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *p = qkv_param(ctx, qkv_randn(ctx, QKV_F64, 2, (int64_t[]){2, 3}, 0, 1));
    qkv_tensor *x = qkv_randn(ctx, QKV_F64, 2, (int64_t[]){2, 3}, 0, 1);
    cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, p, x)), NULL), QKV_OK);
    qkv_tensor *p_grad = p->grad;
    double before[6];
    copy_grad(p, before, 6);
    snapshot s = snap(ctx);
    qkv_tensor *in[3] = {x, p, p};
    qkv_gradcheck_result res;
    cr_expect_eq(qkv_gradcheck(ctx, square, in + 1, 2, NULL, NULL, &res), QKV_ERR_ARG);
    cr_expect_str_eq(qkv_errmsg(ctx),
                     "qkv_gradcheck: inputs 0 and 1 are the same tensor [2,3]; pass each tensor once (fn may use "
                     "it twice)");
    qkv_clear_error(ctx);
    cr_expect_eq(qkv_gradcheck(ctx, square, in, 3, NULL, NULL, &res), QKV_ERR_ARG);
    cr_expect(strstr(qkv_errmsg(ctx), "inputs 1 and 2 are the same tensor") != NULL, "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    expect_same_state(ctx, s, "the same tensor twice");
    cr_expect_eq(p->grad, p_grad, "p's gradient tensor was replaced (or freed)");
    expect_grad_values(p, before, 6, "p");
    /* once is fine, and leaves p as it was */
    cr_assert_eq(qkv_gradcheck(ctx, square, &p, 1, NULL, NULL, &res), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect(res.passed, "%s", res.message);
    cr_expect_eq(p->grad, p_grad);
    expect_grad_values(p, before, 6, "p");
    qkv_ctx_free(ctx);
}

/* out = in[0]^2 (+ in[1]); calls qkv_step_end at call end_at (then returns a tensor of the new step), or
 * qkv_backward of its own output at every call when backward_in_fn. */
static qkv_tensor *ends_the_step(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    world *wd = user;
    if (++wd->calls == wd->end_at) {
        qkv_step_end(ctx);
        return qkv_zeros(ctx, QKV_F64, 1, (int64_t[]){3});
    }
    qkv_tensor *y = qkv_mul(ctx, in[0], in[0]);
    if (n == 2) y = qkv_add(ctx, y, in[1]);
    if (wd->backward_in_fn && y && y->requires_grad) qkv_backward(ctx, y, y);
    return y;
}

Test(gradcheck_isolation, fn_that_ends_the_step_is_refused_at_every_call) {
    /* calls: 1 the probe, 2 the recorded forward, 3.. the finite differences (2 per element, 3 elements) */
    for (int end_at = 1; end_at <= 8; end_at++) {
        for (int with_step_input = 0; with_step_input < 2; with_step_input++) {
            /* small arena chunks: the caller's step spans several, which qkv_step_end frees (it keeps one) */
            qkv_options opt = qkv_default_options();
            opt.arena_chunk = 4096;
            qkv_ctx *ctx = qkv_ctx_new(&opt);
            qkv_tensor *p = qkv_param(ctx, qkv_randn(ctx, QKV_F64, 1, (int64_t[]){3}, 0, 1));
            for (int i = 0; i < 8; i++) qkv_zeros(ctx, QKV_F64, 1, (int64_t[]){400}); /* several chunks */
            qkv_tensor *x = qkv_randn(ctx, QKV_F64, 1, (int64_t[]){3}, 0, 1);
            cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, p, x)), NULL), QKV_OK);
            qkv_tensor *p_grad = p->grad;
            double grad_before[3], p_before[3];
            copy_grad(p, grad_before, 3);
            memcpy(p_before, p->data, sizeof p_before);
            world wd = {.end_at = end_at};
            qkv_tensor *in[2] = {p, x};
            qkv_gradcheck_result res;
            qkv_status st = qkv_gradcheck(ctx, ends_the_step, in, 1 + with_step_input, &wd, NULL, &res);
            cr_expect_eq(st, QKV_ERR_STATE, "end at call %d: %s", end_at, qkv_errmsg(ctx));
            cr_expect_str_eq(qkv_errmsg(ctx),
                             "qkv_gradcheck: fn called qkv_step_end, which released the check's tensors and every "
                             "step tensor; fn must only compute its output (end the step after qkv_gradcheck)");
            cr_expect_eq(wd.calls, end_at, "fn was called again after it ended the step");
            cr_expect_eq(p->grad, p_grad, "end at call %d: p's gradient tensor was replaced", end_at);
            expect_grad_values(p, grad_before, 3, "p");
            cr_expect(memcmp(p_before, p->data, sizeof p_before) == 0, "end at call %d: p's values not restored",
                      end_at);
            cr_expect(p->requires_grad);
            cr_expect(qkv_grad_enabled(ctx), "the grad mode was not given back");
            /* the context goes on: a step that allocates and walks a tape */
            qkv_clear_error(ctx);
            qkv_tensor *y = qkv_randn(ctx, QKV_F64, 1, (int64_t[]){3}, 0, 1);
            for (int i = 0; i < 8; i++) qkv_zeros(ctx, QKV_F64, 1, (int64_t[]){400});
            cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, p, y)), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
            for (int i = 0; i < 3; i++) cr_expect_eq(at(p->grad, i), grad_before[i] + at(y, i));
            qkv_ctx_free(ctx);
        }
    }
}

Test(gradcheck_isolation, fn_that_runs_a_backward_is_refused) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *p = qkv_param(ctx, qkv_randn(ctx, QKV_F64, 1, (int64_t[]){3}, 0, 1));
    world wd = {.backward_in_fn = true};
    snapshot s = snap(ctx);
    qkv_gradcheck_result res;
    cr_expect_eq(qkv_gradcheck(ctx, ends_the_step, &p, 1, &wd, NULL, &res), QKV_ERR_STATE);
    cr_expect_str_eq(qkv_errmsg(ctx), "qkv_gradcheck: fn called qkv_backward; fn must only compute its output (the "
                                      "check runs the backward itself)");
    expect_same_state(ctx, s, "fn ran a backward");
    cr_expect_null(p->grad, "p kept a gradient made during the check");
    qkv_ctx_free(ctx);
}

/* A failing backward (its gradient allocation fails): the message names qkv_gradcheck, nothing leaks. */
Test(gradcheck_isolation, a_failing_backward_is_reported_as_gradchecks) {
    counting cnt = {0};
    qkv_options opt = qkv_default_options();
    opt.allocator = counting_allocator(&cnt);
    qkv_ctx *ctx = qkv_ctx_new(&opt);
    qkv_tensor *p = qkv_param(ctx, qkv_randn(ctx, QKV_F64, 1, (int64_t[]){3}, 0, 1));
    /* the arena's first chunk exists, and the step's header ring has room for every tensor the check makes */
    for (int i = 0; i < 400; i++) (void)qkv_zeros(ctx, QKV_F64, 1, (int64_t[]){1});
    snapshot s = snap(ctx);
    long live = cnt.live;
    cnt.fail_at = cnt.calls + 1; /* the check's first heap allocation: p's gradient, in the backward */
    qkv_gradcheck_result res;
    cr_expect_eq(qkv_gradcheck(ctx, square, &p, 1, NULL, NULL, &res), QKV_ERR_NOMEM, "%s", qkv_errmsg(ctx));
    cr_expect_eq(cnt.failed, 1);
    const char *prefix = "qkv_gradcheck: the backward of fn's output failed: qkv_backward: ";
    cr_expect(strncmp(qkv_errmsg(ctx), prefix, strlen(prefix)) == 0, "%s", qkv_errmsg(ctx));
    expect_same_state(ctx, s, "a failing backward");
    cr_expect_null(p->grad);
    cr_expect(p->requires_grad);
    cr_expect_eq(cnt.live, live, "the check leaked %ld blocks", cnt.live - live);
    qkv_ctx_free(ctx);
    cr_expect_eq(cnt.live, 0);
}
