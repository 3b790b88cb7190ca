/*
 * gradcheck.c — compare the analytic gradient of every element of every checked f64 input with finite
 * differences of L = sum(out * R), R a fixed random tensor with entries in [-1, 1).
 *
 * Why R and not sum(out): softmax rows sum to 1, so d sum(softmax(s)) / ds = 0 whatever the backward
 * computes; a random projection exercises every output direction.
 *
 * Memory: everything the check makes is released before it returns. The order is
 *   mark0: one forward without recording, to learn out's shape; rewind;
 *          R and the analytic-gradient copy are allocated;
 *   mark1: forward with recording, backward with dloss = R, gradients copied out; rewind to mark1;
 *          for each element, forwards without recording (each rewound to mark1);
 *   rewind to mark0.
 *
 * The caller's state: the check touches nothing of the caller's but what it restores.
 *  - The caller's tape is set aside (the check's nodes start a fresh chain, so a backward from the check's
 *    output walks only them) and restored at the end.
 *  - The backward adds into the gradient of every input of every node the check recorded: the inputs, but
 *    also tensors fn reads that the caller made (a parameter, a step tensor of the caller's graph). Each of
 *    them has its gradient set aside (->grad = NULL) for the backward, and given back after it; a gradient
 *    the backward made on the persistent heap is freed, one it made in the arena goes with the rewind.
 *  - Refused, with nothing changed: an output fn did not compute during the call (a tensor the caller
 *    recorded: the backward would walk the caller's tape), a tensor passed twice in inputs, and an fn that
 *    calls qkv_step_end (which releases R, the check's marks and any step input: after it, the check
 *    touches no arena memory; it gives back only what lives on the persistent heap) or qkv_backward.
 */
#include "qkv_internal.h"

#include <math.h>

/* A tensor whose gradient the check sets aside and gives back. */
typedef struct saved_grad {
    qkv_tensor *t;
    qkv_tensor *grad;
    bool requires_grad;
} saved_grad;

/* One check: fn and its inputs, and what the check must know about the caller's state. */
typedef struct check_state {
    qkv_ctx *ctx;
    qkv_gradcheck_fn fn;
    qkv_tensor *const *inputs;
    int n;
    void *user;
    uint32_t epoch;        /* the step the check runs in; fn must not end it                          */
    bool step_ended;       /* fn called qkv_step_end: no arena memory may be touched again            */
    saved_grad in[64];     /* the inputs' flags and gradients, as the caller left them                 */
    bool persistent[64];   /* inputs on the persistent heap: still valid after a qkv_step_end         */
} check_state;

/* Deterministic R entries in [-1, 1) from a local xoshiro-free splitmix stream (the context RNG is not
 * touched, so a check does not change the user's random stream). */
static double r_entry(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-52 - 1.0;
}

static double value_at(const qkv_tensor *t, int64_t i) {
    return t->dtype == QKV_F64 ? ((const double *)t->data)[i] : ((const float *)t->data)[i];
}

/* Run fn; check its result. NULL (error stored) if fn failed, ended the step, ran a backward, or returned
 * something unusable. After a qkv_step_end in fn nothing fn returned is looked at: it may be released. */
static qkv_tensor *run_fn(check_state *c) {
    qkv_ctx *ctx = c->ctx;
    qkv_tensor *out = c->fn(ctx, c->inputs, c->n, c->user);
    if (ctx->epoch != c->epoch) {
        c->step_ended = true;
        return qkv_fail_(ctx, QKV_ERR_STATE,
                         "qkv_gradcheck: fn called qkv_step_end, which released the check's tensors and every "
                         "step tensor; fn must only compute its output (end the step after qkv_gradcheck)");
    }
    if (ctx->tape_consumed)
        return qkv_fail_(ctx, QKV_ERR_STATE,
                         "qkv_gradcheck: fn called qkv_backward; fn must only compute its output (the check "
                         "runs the backward itself)");
    if (ctx->status) return NULL;
    if (!out) return qkv_fail_(ctx, QKV_ERR_ARG, "qkv_gradcheck: fn returned NULL without an error");
    if (!qkv_check_float_(ctx, "qkv_gradcheck", "fn's output", out)) return NULL;
    return out;
}

/* out has the shape R was made for (else the error is stored). */
static bool same_shape_as_r(qkv_ctx *ctx, const qkv_tensor *out, const qkv_tensor *r) {
    if (qkv_same_shape_(out, r)) return true;
    qkv_fail_(ctx, QKV_ERR_STATE, "qkv_gradcheck: fn's output changed shape from %s to %s", QKV_SHAPE(r),
              QKV_SHAPE(out));
    return false;
}

/* L = sum(out * R) with recording off; NaN (error stored) on failure. */
static double eval_loss(check_state *c, const qkv_tensor *r, qkv_mark_ mark) {
    qkv_tensor *out = run_fn(c);
    if (c->step_ended) return NAN; /* R and the mark are gone: touch neither */
    double loss = NAN;
    if (out && same_shape_as_r(c->ctx, out, r)) {
        loss = 0.0;
        for (int64_t i = 0; i < out->numel; i++) loss += value_at(out, i) * ((const double *)r->data)[i];
    }
    qkv_rewind_to_(c->ctx, mark);
    return loss;
}

static bool is_checked(const qkv_gradcheck_options *o, qkv_tensor *const *inputs, int i) {
    return o->check ? o->check[i] : inputs[i]->dtype == QKV_F64;
}

/* Is node one of the check's own nodes (the chain from ctx->tape, which the check started empty)? */
static bool on_check_tape(const qkv_ctx *ctx, const qkv_node_ *node) {
    for (const qkv_node_ *n = ctx->tape; n; n = n->prev)
        if (n == node) return true;
    return false;
}

/* Refuse an output the backward must not start from: one the caller recorded (its node is on the caller's
 * tape, which the backward would walk), or a leaf that is not an input. */
static bool check_output(check_state *c, const qkv_tensor *out) {
    qkv_ctx *ctx = c->ctx;
    if (out->node_ && !on_check_tape(ctx, out->node_)) {
        qkv_fail_(ctx, QKV_ERR_STATE,
                  "qkv_gradcheck: fn's output %s (made by %s) was recorded before qkv_gradcheck was called; "
                  "fn must compute its output from the inputs during the call",
                  QKV_SHAPE(out), out->node_->op);
        return false;
    }
    bool is_input = false;
    for (int i = 0; i < c->n; i++) is_input = is_input || out == c->inputs[i];
    if (!out->requires_grad || (!out->node_ && !is_input)) {
        qkv_fail_(ctx, QKV_ERR_STATE, "qkv_gradcheck: fn's output %s does not depend on any checked input",
                  QKV_SHAPE(out));
        return false;
    }
    return true;
}

/* Every input of every node the check recorded that requires grad (the tensors the backward adds into),
 * with its gradient as it is now; the gradients are then set aside (->grad = NULL). A tensor used by
 * several nodes is listed once per use: given back in reverse order, the first entry (the caller's
 * gradient) is the one that stays. NULL (error stored) on allocation failure. */
static saved_grad *set_aside_node_inputs(qkv_ctx *ctx, int64_t *count) {
    int64_t n = 0;
    for (const qkv_node_ *node = ctx->tape; node; node = node->prev)
        for (int i = 0; i < node->n_in && i < QKV_NODE_MAX_INPUTS; i++) n += qkv_wants_grad_(node->in[i]);
    saved_grad *list = qkv_arena_array_(ctx, "qkv_gradcheck", (size_t)(n > 0 ? n : 1), sizeof *list);
    if (!list) return NULL;
    n = 0;
    for (const qkv_node_ *node = ctx->tape; node; node = node->prev) {
        for (int i = 0; i < node->n_in && i < QKV_NODE_MAX_INPUTS; i++) {
            qkv_tensor *t = node->in[i];
            if (!qkv_wants_grad_(t)) continue;
            list[n++] = (saved_grad){t, t->grad, t->requires_grad};
            t->grad = NULL;
        }
    }
    *count = n;
    return list;
}

/* Give t its gradient g back, freeing one the backward made on the persistent heap in the meantime. */
static void give_back(qkv_ctx *ctx, qkv_tensor *t, qkv_tensor *g) {
    if (t->grad && t->grad != g && t->epoch_ == 0) {
        t->grad->magic_ = 0;
        qkv_persistent_free_(ctx, t->grad);
    }
    t->grad = g;
}

/* The numeric derivative of L at element j of input i (x its data), by central or 5-point differences;
 * x[j] is restored before returning. false (error stored) when fn failed or ended the step; after a
 * qkv_step_end x[j] is restored only if the input is persistent (a step input was released with the step). */
static bool numeric_at(check_state *c, int i, double *x, int64_t j, double eps, bool five_point,
                       const qkv_tensor *r, qkv_mark_ mark, double *numeric) {
    static const double offsets[4] = {1.0, -1.0, 2.0, -2.0};
    double orig = x[j], f[4];
    for (int p = 0; p < (five_point ? 4 : 2); p++) {
        x[j] = orig + offsets[p] * eps;
        f[p] = eval_loss(c, r, mark);
        if (c->ctx->status) {
            if (!c->step_ended || c->persistent[i]) x[j] = orig;
            return false;
        }
    }
    x[j] = orig;
    if (five_point) // f'(x) = (-f(x+2h) + 8 f(x+h) - 8 f(x-h) + f(x-2h)) / 12h
        *numeric = (-f[2] + 8 * f[0] - 8 * f[1] + f[3]) / (12 * eps);
    else // f'(x) = (f(x+h) - f(x-h)) / 2h
        *numeric = (f[0] - f[1]) / (2 * eps);
    return true;
}

/* After fn ended the step: give back what lives on the persistent heap (the persistent inputs' flags and
 * gradients) and nothing else; the arena, the caller's tape and every step tensor went with the step. */
static qkv_status after_step_end(check_state *c, bool grad_was) {
    for (int i = 0; i < c->n; i++) {
        if (!c->persistent[i]) continue;
        give_back(c->ctx, c->inputs[i], c->in[i].grad);
        c->inputs[i]->requires_grad = c->in[i].requires_grad;
    }
    c->ctx->grad_enabled = grad_was;
    return c->ctx->status;
}

qkv_status qkv_gradcheck(qkv_ctx *ctx, qkv_gradcheck_fn fn, qkv_tensor *const *inputs, int n_inputs,
                         void *user, const qkv_gradcheck_options *options, qkv_gradcheck_result *result) {
    const char *name = "qkv_gradcheck";
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!fn || !inputs || !result)
        return qkv_failc_(ctx, QKV_ERR_NULL, "%s: %s is NULL", name, !fn ? "fn" : !inputs ? "inputs" : "result");
    if (n_inputs <= 0 || n_inputs > 64)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: n_inputs is %d, must be 1 to 64", name, n_inputs);
    qkv_gradcheck_options o = {0};
    if (options) o = *options;
    double eps = o.eps > 0 ? o.eps : 1e-6, atol = o.atol > 0 ? o.atol : 1e-7, rtol = o.rtol > 0 ? o.rtol : 1e-6;
    if (!isfinite(eps) || !isfinite(atol) || !isfinite(rtol))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: eps, atol and rtol must be finite", name);

    memset(result, 0, sizeof *result);
    result->worst_input = -1;
    result->worst_index = -1;
    int n_checked = 0;
    for (int i = 0; i < n_inputs; i++) {
        char arg[32];
        snprintf(arg, sizeof arg, "inputs[%d]", i);
        if (!qkv_check_tensor_(ctx, name, arg, inputs[i])) return ctx->status;
        for (int j = 0; j < i; j++)
            if (inputs[j] == inputs[i])
                return qkv_failc_(ctx, QKV_ERR_ARG,
                                  "%s: inputs %d and %d are the same tensor %s; pass each tensor once (fn may "
                                  "use it twice)",
                                  name, j, i, QKV_SHAPE(inputs[i]));
        if (!is_checked(&o, inputs, i)) continue;
        if (inputs[i]->dtype != QKV_F64)
            return qkv_failc_(ctx, QKV_ERR_DTYPE, "%s: inputs[%d] %s is %s; checked inputs must be f64", name,
                              i, QKV_SHAPE(inputs[i]), qkv_dtype_name(inputs[i]->dtype));
        n_checked++;
    }
    if (n_checked == 0) return qkv_failc_(ctx, QKV_ERR_ARG, "%s: no f64 input to check", name);

    /* Set the user's state aside. */
    check_state c = {ctx, fn, inputs, n_inputs, user, ctx->epoch, false, {{0}}, {0}};
    for (int i = 0; i < n_inputs; i++) {
        c.in[i] = (saved_grad){inputs[i], inputs[i]->grad, inputs[i]->requires_grad};
        c.persistent[i] = inputs[i]->epoch_ == 0;
    }
    bool grad_was = ctx->grad_enabled;
    qkv_mark_ mark0 = qkv_mark_now_(ctx);
    ctx->tape = NULL;
    ctx->tape_consumed = false;

    /* 1. Learn the output's shape, then make R and room for the analytic gradients. */
    ctx->grad_enabled = false;
    qkv_tensor *probe = run_fn(&c);
    if (c.step_ended) return after_step_end(&c, grad_was);
    qkv_tensor *r = NULL;
    double *analytic = NULL;
    int64_t total = 0;
    if (probe) {
        int ndim = probe->ndim;
        int64_t shape[QKV_MAX_DIMS];
        memcpy(shape, probe->shape, sizeof shape);
        qkv_rewind_to_(ctx, (qkv_mark_){mark0.chunk, mark0.offset, mark0.used_before, NULL, false});
        r = qkv_new_tensor_(ctx, name, QKV_F64, ndim, shape);
        for (int i = 0; i < n_inputs; i++)
            if (is_checked(&o, inputs, i)) total += inputs[i]->numel;
        analytic = qkv_arena_array_(ctx, name, (size_t)total, sizeof(double));
    }
    if (r && analytic) {
        uint64_t state = o.seed ^ 0x5eedc0deull;
        double *rv = r->data;
        for (int64_t i = 0; i < r->numel; i++) rv[i] = r_entry(&state);
    }

    /* 2. Analytic gradients: backward of out with upstream R, every gradient it adds into set aside. */
    qkv_mark_ mark1 = qkv_mark_now_(ctx);
    if (!ctx->status) {
        ctx->grad_enabled = true;
        for (int i = 0; i < n_inputs; i++) {
            inputs[i]->grad = NULL;
            if (is_checked(&o, inputs, i)) inputs[i]->requires_grad = true;
        }
        qkv_tensor *out = run_fn(&c);
        if (c.step_ended) return after_step_end(&c, grad_was);
        saved_grad *aside = NULL;
        int64_t n_aside = 0;
        if (out && same_shape_as_r(ctx, out, r) && check_output(&c, out))
            aside = set_aside_node_inputs(ctx, &n_aside);
        if (aside && qkv_backward(ctx, out, r) != QKV_OK) {
            char why[QKV_ERRMSG_SIZE];
            snprintf(why, sizeof why, "%s", ctx->errmsg);
            snprintf(ctx->errmsg, sizeof ctx->errmsg, "%s: the backward of fn's output failed: %.440s", name, why);
        }
        int64_t at = 0;
        for (int i = 0; i < n_inputs && !ctx->status; i++) {
            if (!is_checked(&o, inputs, i)) continue;
            const qkv_tensor *g = inputs[i]->grad;
            for (int64_t j = 0; j < inputs[i]->numel; j++) analytic[at + j] = g ? value_at(g, j) : 0.0;
            at += inputs[i]->numel;
        }
        /* give back, newest first, what the backward added into, then the inputs' own state */
        for (int64_t k = n_aside - 1; k >= 0; k--) {
            give_back(ctx, aside[k].t, aside[k].grad);
            aside[k].t->requires_grad = aside[k].requires_grad;
        }
        for (int i = 0; i < n_inputs; i++) {
            give_back(ctx, inputs[i], c.in[i].grad);
            inputs[i]->requires_grad = c.in[i].requires_grad;
        }
        qkv_rewind_to_(ctx, mark1);
        ctx->tape = NULL;
        ctx->tape_consumed = false;
    }

    /* 3. Numeric gradients, element by element, with recording off. */
    ctx->grad_enabled = false;
    double worst_ratio = -1.0;
    int64_t at = 0;
    for (int i = 0; i < n_inputs && !ctx->status; i++) {
        if (!is_checked(&o, inputs, i)) continue;
        double *x = inputs[i]->data;
        for (int64_t j = 0; j < inputs[i]->numel; j++) {
            double numeric;
            if (!numeric_at(&c, i, x, j, eps, o.five_point, r, mark1, &numeric)) break;
            double a = analytic[at + j];
            double abs_err = fabs(a - numeric), tol = atol + rtol * fabs(numeric);
            double ratio = abs_err / tol;
            if (!(ratio <= 1.0)) result->failed++; /* NaN counts as a failure */
            if (ratio > worst_ratio || (ratio != ratio && worst_ratio == worst_ratio)) {
                worst_ratio = ratio != ratio ? INFINITY : ratio;
                result->worst_input = i;
                result->worst_index = j;
                result->analytic = a;
                result->numeric = numeric;
                result->abs_err = abs_err;
                result->rel_err = abs_err / fmax(fabs(numeric), 1e-300);
            }
            result->checked++;
        }
        if (c.step_ended) return after_step_end(&c, grad_was);
        at += inputs[i]->numel;
    }

    /* Give the user's state back. */
    qkv_rewind_to_(ctx, mark0);
    ctx->grad_enabled = grad_was;
    if (ctx->status) return ctx->status;
    result->passed = result->failed == 0;
    snprintf(result->message, sizeof result->message,
             "%s: %lld of %lld elements outside %.1e + %.1e*|numeric|; worst: input %d index %lld analytic "
             "%.12g numeric %.12g abs err %.3g rel err %.3g",
             result->passed ? "passed" : "FAILED", (long long)result->failed, (long long)result->checked,
             atol, rtol, result->worst_input, (long long)result->worst_index, result->analytic,
             result->numeric, result->abs_err, result->rel_err);
    return QKV_OK;
}
