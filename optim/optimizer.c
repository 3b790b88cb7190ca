/*
 * optimizer.c — the optimizer object: options, creation, the state for checkpoints, the step loop, and
 * zeroing the parameters' gradients. The updates themselves are in sgd.c (torch.optim.SGD) and adam.c
 * (torch.optim.Adam / AdamW), one parameter at a time, declared in update.h.
 *
 * One persistent block holds the optimizer, its pointer arrays and the state names; every state tensor
 * is a persistent tensor of its own (made with qkv_keep, so qkv_free releases it). A step reads and
 * writes the tensors in place: no heap, no arena.
 */
#include "qkv_internal.h"
#include "update.h"

#include "../ops/parallel.h"

#include <math.h>
#include <stdlib.h>

struct qkv_optimizer {
    qkv_ctx *ctx;
    qkv_optim_options o;  /* as given (lr as qkv_optim_set_lr last set it), param_names NULL    */
    int n;                /* parameters                                                          */
    int per_param;        /* state tensors per parameter: 0 (plain SGD), 2 (momentum), 3 (Adam)  */
    int n_state;          /* 1 + n * per_param                                                   */
    qkv_tensor **params;  /* [n]                                                                 */
    qkv_tensor **state;   /* [n_state]: "step", then parameter i's at 1 + i * per_param + j      */
    const char **names;   /* [n_state]                                                           */
};

static const char *const sgd_suffixes[] = {"step", "momentum_buffer"};
static const char *const adam_suffixes[] = {"step", "exp_avg", "exp_avg_sq"};

/* ---- options ------------------------------------------------------------------------------------- */

qkv_optim_options qkv_optim_defaults(qkv_optim_kind kind) {
    qkv_optim_options o;
    memset(&o, 0, sizeof o);
    o.kind = kind;
    if (kind == QKV_OPTIM_ADAM || kind == QKV_OPTIM_ADAMW) {
        o.lr = 1e-3;
        o.beta1 = 0.9;
        o.beta2 = 0.999;
        o.eps = 1e-8;
        if (kind == QKV_OPTIM_ADAMW) o.weight_decay = 1e-2;
    } else {
        o.lr = NAN; /* PyTorch's SGD has no default: qkv_optim_new reports it until it is set */
    }
    return o;
}

static const char *kind_name(qkv_optim_kind kind) {
    return kind == QKV_OPTIM_SGD ? "SGD" : kind == QKV_OPTIM_ADAM ? "Adam" : "AdamW";
}

/* A field must be finite and inside [lo, hi) (hi_open) or [lo, hi]. */
static bool check_range(qkv_ctx *ctx, const char *fn, const char *field, double v, double lo, double hi,
                        bool hi_open) {
    if (isfinite(v) && v >= lo && (hi_open ? v < hi : v <= hi)) return true;
    return qkv_fail_(ctx, QKV_ERR_ARG, "%s: %s %g must be finite and in [%g, %g%s", fn, field, v, lo, hi,
                     hi_open ? ")" : "]"),
           false;
}

/* Check every field, taken as given (no zero stands for a default); false with the error stored. */
static bool check_options(qkv_ctx *ctx, const char *fn, const qkv_optim_options *o) {
    if ((int)o->kind < 0 || o->kind >= QKV_OPTIM_KIND_COUNT)
        return qkv_fail_(ctx, QKV_ERR_ARG,
                         "%s: kind %d is not QKV_OPTIM_SGD, QKV_OPTIM_ADAM or QKV_OPTIM_ADAMW", fn,
                         (int)o->kind),
               false;
    const char *kn = kind_name(o->kind);
    bool adam = o->kind != QKV_OPTIM_SGD;
    if (adam && (o->momentum != 0 || o->dampening != 0 || o->nesterov))
        return qkv_fail_(ctx, QKV_ERR_ARG,
                         "%s: momentum %g, dampening %g and nesterov %d apply to SGD, not %s; leave them 0",
                         fn, o->momentum, o->dampening, (int)o->nesterov, kn),
               false;
    if (!adam && (o->beta1 != 0 || o->beta2 != 0 || o->eps != 0))
        return qkv_fail_(ctx, QKV_ERR_ARG,
                         "%s: beta1 %g, beta2 %g and eps %g apply to Adam and AdamW, not SGD; leave them 0", fn,
                         o->beta1, o->beta2, o->eps),
               false;
    if (!adam && isnan(o->lr))
        return qkv_fail_(ctx, QKV_ERR_ARG,
                         "%s: SGD needs a learning rate (lr is nan, as qkv_optim_defaults(QKV_OPTIM_SGD) "
                         "leaves it: PyTorch's SGD has no default)",
                         fn),
               false;
    if (!check_range(ctx, fn, "lr", o->lr, 0, INFINITY, true)) return false;
    if (!check_range(ctx, fn, "weight_decay", o->weight_decay, 0, INFINITY, true)) return false;
    if (adam) {
        if (!check_range(ctx, fn, "beta1", o->beta1, 0, 1, true)) return false;
        if (!check_range(ctx, fn, "beta2", o->beta2, 0, 1, true)) return false;
        if (!check_range(ctx, fn, "eps", o->eps, 0, INFINITY, true)) return false;
    } else {
        if (!check_range(ctx, fn, "momentum", o->momentum, 0, INFINITY, true)) return false;
        if (!isfinite(o->dampening))
            return qkv_fail_(ctx, QKV_ERR_ARG, "%s: dampening %g must be finite", fn, o->dampening), false;
        if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
            return qkv_fail_(ctx, QKV_ERR_ARG,
                             "%s: nesterov needs momentum > 0 and dampening 0 (momentum %g, dampening %g)",
                             fn, o->momentum, o->dampening),
                   false;
    }
    return true;
}

/* ---- creation ------------------------------------------------------------------------------------ */

/* Check the parameters and their names; false with the error stored. */
static bool check_params(qkv_ctx *ctx, const char *fn, qkv_tensor *const *params, int n,
                         const char *const *names) {
    if (!params) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: params is NULL", fn), false;
    if (n <= 0) return qkv_fail_(ctx, QKV_ERR_ARG, "%s: n is %d, must be >= 1", fn, n), false;
    for (int i = 0; i < n; i++) {
        char what[32];
        snprintf(what, sizeof what, "params[%d]", i);
        if (!qkv_check_float_(ctx, fn, what, params[i])) return false;
        if (params[i]->epoch_ != 0)
            return qkv_fail_(ctx, QKV_ERR_ARG,
                             "%s: params[%d] %s is a step tensor (released by qkv_step_end); optimize "
                             "persistent tensors made by qkv_param",
                             fn, i, QKV_SHAPE(params[i])),
                   false;
        for (int j = 0; j < i; j++)
            if (params[j] == params[i])
                return qkv_fail_(ctx, QKV_ERR_ARG, "%s: params[%d] and params[%d] are the same tensor %s", fn,
                                 j, i, QKV_SHAPE(params[i])),
                       false;
        if (!names) continue;
        if (!names[i]) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: param_names[%d] is NULL", fn, i), false;
        if (!names[i][0]) return qkv_fail_(ctx, QKV_ERR_ARG, "%s: param_names[%d] is empty", fn, i), false;
        for (int j = 0; j < i; j++)
            if (strcmp(names[j], names[i]) == 0)
                return qkv_fail_(ctx, QKV_ERR_ARG, "%s: param_names[%d] and param_names[%d] are both \"%s\"",
                                 fn, j, i, names[i]),
                       false;
    }
    return true;
}

/* Write "P.suffix" (P the name of parameter i) into out (size bytes, or NULL to measure); returns the
 * length without the terminator. */
static size_t state_name(char *out, size_t size, const char *const *names, int i, const char *suffix) {
    int len = names ? snprintf(out, size, "%s.%s", names[i], suffix)
                    : snprintf(out, size, "param%d.%s", i, suffix);
    return len > 0 ? (size_t)len : 0;
}

/* A persistent f64 scalar 0: made in the step arena, kept, and the arena rewound. */
static qkv_tensor *new_counter(qkv_ctx *ctx) {
    qkv_mark_ mark = qkv_mark_now_(ctx);
    qkv_tensor *s = qkv_scalar(ctx, QKV_F64, 0.0);
    qkv_tensor *t = s ? qkv_keep(ctx, s) : NULL;
    qkv_rewind_to_(ctx, mark);
    return t;
}

/* A persistent zero tensor of p's dtype and shape. */
static qkv_tensor *new_buffer(qkv_ctx *ctx, const qkv_tensor *p) {
    qkv_tensor *t = qkv_keep(ctx, p);
    if (t) memset(t->data, 0, (size_t)t->numel * qkv_dtype_size(t->dtype));
    return t;
}

void qkv_optim_free(qkv_optimizer *opt) {
    if (!opt) return;
    for (int i = 0; i < opt->n_state; i++)
        if (opt->state[i]) qkv_free(opt->ctx, opt->state[i]);
    qkv_persistent_free_(opt->ctx, opt);
}

qkv_optimizer *qkv_optim_new(qkv_ctx *ctx, const qkv_optim_options *options, qkv_tensor *const *params,
                             int n) {
    const char *fn = "qkv_optim_new";
    if (!ctx || ctx->status) return NULL;
    qkv_optim_options o = options ? *options : qkv_optim_defaults(QKV_OPTIM_ADAM);
    if (!check_options(ctx, fn, &o)) return NULL;
    const char *const *pnames = o.param_names;
    o.param_names = NULL;
    if (!check_params(ctx, fn, params, n, pnames)) return NULL;

    int per_param = o.kind != QKV_OPTIM_SGD ? 3 : o.momentum != 0 ? 2 : 0;
    const char *const *suffixes = per_param == 3 ? adam_suffixes : sgd_suffixes;
    if ((size_t)n > ((size_t)INT32_MAX - 1) / 3)
        return qkv_fail_(ctx, QKV_ERR_OVERFLOW, "%s: %d parameters are too many", fn, n);
    int n_state = 1 + n * per_param;

    /* one block: the struct, params[n], state[n_state], names[n_state], then the name strings */
    size_t strings = sizeof "step", bytes;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < per_param; j++) {
            size_t len = state_name(NULL, 0, pnames, i, suffixes[j]) + 1;
            if (!qkv_add_size_(strings, len, &strings))
                return qkv_fail_(ctx, QKV_ERR_OVERFLOW, "%s: parameter names overflow size_t", fn);
        }
    size_t arrays = (size_t)n * sizeof(qkv_tensor *) +
                    (size_t)n_state * (sizeof(qkv_tensor *) + sizeof(char *));
    if (!qkv_add_size_(sizeof(qkv_optimizer) + arrays, strings, &bytes))
        return qkv_fail_(ctx, QKV_ERR_OVERFLOW, "%s: parameter names overflow size_t", fn);
    qkv_optimizer *opt = qkv_persistent_alloc_(ctx, fn, bytes);
    if (!opt) return NULL;
    memset(opt, 0, bytes);
    opt->ctx = ctx;
    opt->o = o;
    opt->n = n;
    opt->per_param = per_param;
    opt->params = (qkv_tensor **)(opt + 1);
    opt->state = opt->params + n;
    opt->names = (const char **)(opt->state + n_state);
    char *text = (char *)(opt->names + n_state), *end = (char *)opt + bytes;
    memcpy(opt->params, params, (size_t)n * sizeof *params);

    memcpy(text, "step", sizeof "step");
    opt->names[0] = text;
    text += sizeof "step";
    opt->n_state = n_state; /* set first, so a failure below frees what was made (the rest is NULL) */
    for (int k = 0; k < n_state; k++) {
        if (k == 0) {
            opt->state[k] = new_counter(ctx);
        } else {
            int i = (k - 1) / per_param, j = (k - 1) % per_param;
            opt->names[k] = text;
            text += state_name(text, (size_t)(end - text), pnames, i, suffixes[j]) + 1;
            opt->state[k] = j == 0 ? new_counter(ctx) : new_buffer(ctx, params[i]);
        }
        if (!opt->state[k]) {
            /* name the call the user made, and the state that failed, in front of the inner message */
            char inner[QKV_ERRMSG_SIZE];
            qkv_status status = ctx->status;
            snprintf(inner, sizeof inner, "%s", ctx->errmsg);
            qkv_clear_error(ctx);
            qkv_fail_(ctx, status, "%s: making state \"%s\": %s", fn, opt->names[k], inner);
            qkv_optim_free(opt);
            return NULL;
        }
    }
    return opt;
}

/* ---- the step ------------------------------------------------------------------------------------ */

static double *counter(qkv_tensor *t) { return (double *)t->data; }

/* A restored step count must be a whole number in [0, 2^53). */
static bool check_counter(qkv_ctx *ctx, const char *fn, const qkv_optimizer *opt, int k) {
    double v = *counter(opt->state[k]);
    if (v >= 0 && v < 9007199254740992.0 && v == floor(v)) return true;
    return qkv_fail_(ctx, QKV_ERR_STATE, "%s: state \"%s\" is %g; a step count must be a whole number >= 0",
                     fn, opt->names[k], v),
           false;
}

/* Every parameter is still a live tensor of the context (none freed since qkv_optim_new), decided by its
 * address before anything is read; the message naming params[i] is formatted only for the one that is not. */
static bool params_live(qkv_optimizer *opt, const char *fn) {
    for (int i = 0; i < opt->n; i++) {
        if (qkv_tensor_is_live_(opt->ctx, opt->params[i])) continue;
        char name[32];
        snprintf(name, sizeof name, "params[%d]", i);
        return qkv_check_tensor_(opt->ctx, fn, name, opt->params[i]);
    }
    return true;
}

qkv_status qkv_optim_step(qkv_optimizer *opt) {
    const char *fn = "qkv_optim_step";
    if (!opt) return QKV_ERR_NULL;
    qkv_ctx *ctx = opt->ctx;
    if (ctx->status) return ctx->status;
    /* check everything first, so an error changes nothing */
    if (!check_counter(ctx, fn, opt, 0)) return ctx->status;
    if (!params_live(opt, fn)) return ctx->status;
    for (int i = 0; i < opt->n; i++) {
        const qkv_tensor *p = opt->params[i], *g = p->grad;
        if (opt->per_param && !check_counter(ctx, fn, opt, 1 + i * opt->per_param)) return ctx->status;
        if (g && (g->dtype != p->dtype || g->numel != p->numel))
            return qkv_failc_(ctx, QKV_ERR_STATE, "%s: params[%d] %s is %s but its gradient %s is %s", fn, i,
                              QKV_SHAPE(p), qkv_dtype_name(p->dtype), QKV_SHAPE(g), qkv_dtype_name(g->dtype));
    }
    for (int i = 0; i < opt->n; i++) {
        qkv_tensor *p = opt->params[i];
        if (!p->grad) continue; /* no gradient yet: skipped, its step count does not advance */
        qkv_tensor *const *s = opt->state + 1 + i * opt->per_param;
        double t = opt->per_param ? (*counter(s[0]) += 1.0) : 1.0;
        if (opt->o.kind == QKV_OPTIM_SGD)
            qkv_sgd_update_(&opt->o, t == 1.0, p, p->grad, opt->per_param ? s[1] : NULL);
        else
            qkv_adam_update_(&opt->o, t, p, p->grad, s[1], s[2], qkv_threads(opt->ctx));
    }
    *counter(opt->state[0]) += 1.0;
    return QKV_OK;
}

/* Zeroes bytes [i0, i1) of a gradient (ranges of whole cache lines over the context's threads; a thread gets at
 * least ZERO_GRAIN_BYTES, since a memset streams several times faster than the operators' passes, whose grain is
 * QKV_GRAIN_ELEMENTS_ floats). */
#define ZERO_GRAIN_BYTES (512.0 * 1024.0)
static void zero_range(void *arg, int64_t i0, int64_t i1) { memset((unsigned char *)arg + i0, 0, (size_t)(i1 - i0)); }

qkv_status qkv_optim_zero_grad(qkv_optimizer *opt) {
    if (!opt) return QKV_ERR_NULL;
    if (opt->ctx->status) return opt->ctx->status;
    if (!params_live(opt, "qkv_optim_zero_grad")) return opt->ctx->status;
    for (int i = 0; i < opt->n; i++) {
        qkv_tensor *g = opt->params[i]->grad;
        if (!g) continue;
        int64_t bytes = g->numel * (int64_t)qkv_dtype_size(g->dtype);
        qkv_parallel_ranges_(qkv_threads(opt->ctx), bytes, 64, (double)bytes, ZERO_GRAIN_BYTES, zero_range, g->data);
    }
    return QKV_OK;
}

/* ---- accessors ----------------------------------------------------------------------------------- */

int64_t qkv_optim_step_count(const qkv_optimizer *opt) {
    return opt ? (int64_t)*counter(opt->state[0]) : 0;
}

double qkv_optim_lr(const qkv_optimizer *opt) { return opt ? opt->o.lr : NAN; }

qkv_status qkv_optim_set_lr(qkv_optimizer *opt, double lr) {
    if (!opt) return QKV_ERR_NULL;
    if (opt->ctx->status) return opt->ctx->status;
    if (!(isfinite(lr) && lr >= 0))
        return qkv_failc_(opt->ctx, QKV_ERR_ARG, "qkv_optim_set_lr: lr %g must be finite and >= 0", lr);
    opt->o.lr = lr;
    return QKV_OK;
}

qkv_optim_options qkv_optim_get_options(const qkv_optimizer *opt) {
    if (opt) return opt->o;
    qkv_optim_options none;
    memset(&none, 0, sizeof none);
    return none;
}

int qkv_optim_state_count(const qkv_optimizer *opt) { return opt ? opt->n_state : 0; }

qkv_tensor *qkv_optim_state(qkv_optimizer *opt, int index, const char **name) {
    if (name) *name = NULL;
    if (!opt || opt->ctx->status) return NULL;
    if (index < 0 || index >= opt->n_state)
        return qkv_fail_(opt->ctx, QKV_ERR_ARG, "qkv_optim_state: index %d is outside [0, %d)", index,
                         opt->n_state);
    if (name) *name = opt->names[index];
    return opt->state[index];
}
