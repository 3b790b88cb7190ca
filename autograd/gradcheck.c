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
 * The user's tape is set aside during the check (the check's nodes start a fresh chain), so nothing the
 * user recorded is walked, and the user's tape state is restored at the end.
 */
#include "qkv_internal.h"

#include <math.h>

typedef struct saved_input {
    bool requires_grad;
    qkv_tensor *grad;
} saved_input;

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

/* Run fn; check its result. NULL (error stored) if fn failed or returned something unusable. */
static qkv_tensor *run_fn(qkv_ctx *ctx, qkv_gradcheck_fn fn, qkv_tensor *const *inputs, int n, void *user) {
    qkv_tensor *out = fn(ctx, inputs, n, user);
    if (ctx->status) return NULL;
    if (!out) return qkv_fail_(ctx, QKV_ERR_ARG, "qkv_gradcheck: fn returned NULL without an error");
    if (!qkv_check_float_(ctx, "qkv_gradcheck", "fn's output", out)) return NULL;
    return out;
}

/* L = sum(out * R) with recording off; NaN (error stored) on failure. */
static double eval_loss(qkv_ctx *ctx, qkv_gradcheck_fn fn, qkv_tensor *const *inputs, int n, void *user,
                        const qkv_tensor *r, qkv_mark_ mark) {
    qkv_tensor *out = run_fn(ctx, fn, inputs, n, user);
    double loss = NAN;
    if (out) {
        if (out->numel != r->numel) {
            qkv_fail_(ctx, QKV_ERR_STATE, "qkv_gradcheck: fn's output changed shape from %s to %s",
                      QKV_SHAPE(r), QKV_SHAPE(out));
        } else {
            loss = 0.0;
            for (int64_t i = 0; i < out->numel; i++) loss += value_at(out, i) * ((const double *)r->data)[i];
        }
    }
    qkv_rewind_to_(ctx, mark);
    return loss;
}

static bool is_checked(const qkv_gradcheck_options *o, qkv_tensor *const *inputs, int i) {
    return o->check ? o->check[i] : inputs[i]->dtype == QKV_F64;
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
        if (!is_checked(&o, inputs, i)) continue;
        if (inputs[i]->dtype != QKV_F64)
            return qkv_failc_(ctx, QKV_ERR_DTYPE, "%s: inputs[%d] %s is %s; checked inputs must be f64", name,
                              i, QKV_SHAPE(inputs[i]), qkv_dtype_name(inputs[i]->dtype));
        n_checked++;
    }
    if (n_checked == 0) return qkv_failc_(ctx, QKV_ERR_ARG, "%s: no f64 input to check", name);

    /* Set the user's state aside. */
    saved_input saved[64];
    for (int i = 0; i < n_inputs; i++) {
        saved[i].requires_grad = inputs[i]->requires_grad;
        saved[i].grad = inputs[i]->grad;
    }
    bool grad_was = ctx->grad_enabled;
    qkv_mark_ mark0 = qkv_mark_now_(ctx);
    ctx->tape = NULL;
    ctx->tape_consumed = false;

    /* 1. Learn the output's shape, then make R and room for the analytic gradients. */
    ctx->grad_enabled = false;
    qkv_tensor *probe = run_fn(ctx, fn, inputs, n_inputs, user);
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

    /* 2. Analytic gradients: backward of out with upstream R. */
    qkv_mark_ mark1 = qkv_mark_now_(ctx);
    if (!ctx->status) {
        ctx->grad_enabled = true;
        for (int i = 0; i < n_inputs; i++) {
            inputs[i]->grad = NULL;
            if (is_checked(&o, inputs, i)) inputs[i]->requires_grad = true;
        }
        qkv_tensor *out = run_fn(ctx, fn, inputs, n_inputs, user);
        if (out && out->numel != r->numel)
            qkv_fail_(ctx, QKV_ERR_STATE, "%s: fn's output changed shape from %s to %s", name, QKV_SHAPE(r),
                      QKV_SHAPE(out));
        if (out && !ctx->status && !out->requires_grad)
            qkv_fail_(ctx, QKV_ERR_STATE, "%s: fn's output %s does not depend on any checked input", name,
                      QKV_SHAPE(out));
        if (out && !ctx->status) qkv_backward(ctx, out, r);
        int64_t at = 0;
        for (int i = 0; i < n_inputs && !ctx->status; i++) {
            if (!is_checked(&o, inputs, i)) continue;
            const qkv_tensor *g = inputs[i]->grad;
            for (int64_t j = 0; j < inputs[i]->numel; j++) analytic[at + j] = g ? value_at(g, j) : 0.0;
            at += inputs[i]->numel;
        }
        /* release gradients the backward made on the persistent heap for persistent inputs */
        for (int i = 0; i < n_inputs; i++) {
            if (inputs[i]->grad && inputs[i]->epoch_ == 0) qkv_persistent_free_(ctx, inputs[i]->grad);
            inputs[i]->grad = saved[i].grad;
            inputs[i]->requires_grad = saved[i].requires_grad;
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
        for (int64_t j = 0; j < inputs[i]->numel && !ctx->status; j++) {
            double orig = x[j], numeric;
            x[j] = orig + eps;
            double f_p1 = eval_loss(ctx, fn, inputs, n_inputs, user, r, mark1);
            x[j] = orig - eps;
            double f_m1 = eval_loss(ctx, fn, inputs, n_inputs, user, r, mark1);
            if (o.five_point) {
                x[j] = orig + 2 * eps;
                double f_p2 = eval_loss(ctx, fn, inputs, n_inputs, user, r, mark1);
                x[j] = orig - 2 * eps;
                double f_m2 = eval_loss(ctx, fn, inputs, n_inputs, user, r, mark1);
                // f'(x) = (-f(x+2h) + 8 f(x+h) - 8 f(x-h) + f(x-2h)) / 12h
                numeric = (-f_p2 + 8 * f_p1 - 8 * f_m1 + f_m2) / (12 * eps);
            } else {
                // f'(x) = (f(x+h) - f(x-h)) / 2h
                numeric = (f_p1 - f_m1) / (2 * eps);
            }
            x[j] = orig;
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
