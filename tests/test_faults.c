/*
 * test_faults.c — allocation failures at every allocation site of a training run.
 *
 * Method: an allocator (the context's hooks) counts its calls and live blocks. One clean run counts the
 * allocations of each phase (N); then, for every k = 1..N, a fresh run makes the k-th allocation of that
 * phase return NULL. Every such run must
 *   - report the failure: the step returns an error, the context holds QKV_ERR_NOMEM and an "out of memory"
 *     message (the one allocation allowed to fail silently is qkv_step_end's: it merges the arena's chunks
 *     into one and keeps the old chain when it cannot);
 *   - recover: after qkv_clear_error, zeroing the gradients the partial backward touched and qkv_step_end,
 *     the same step runs clean, and the parameters after the remaining steps are bit-identical to those of
 *     a run that never failed (a failure never updates a parameter or an optimizer moment halfway);
 *   - leak nothing: after the context is freed no block is live (counted here; LeakSanitizer checks the
 *     same in the ASan build).
 * Phases: building the model (context, tables, parameters, optimizer state), the first training step
 * (which sizes the step arena and makes the parameters' gradients), a later step of the same shape (which
 * must make no allocation at all), and a later step with a larger batch (which must grow the arena).
 * Two models: the copy-task model of examples/copy_model.h (2 heads, W^O, Adam), and a graph built here
 * from the public API with a small arena chunk, so that nearly every operator meets a chunk boundary:
 * projections, split/merge heads, masked causal attention, self-attention, add, scale, cross-entropy with
 * ignored targets, gradient clipping and AdamW, in f32 and f64.
 */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "copy_model.h"
#include "qkv.h"
#include "test_alloc.h"

/* After a run whose k-th allocation (of step `step`, -1 for none) was failed: 1, with a log line, unless
 * exactly one failure was injected and every block was given back. */
static int leaked_or_not_failed(const counting *c, int step, long k) {
    if (c->live == 0 && c->failed == 1) return 0;
    cr_log_error("step %d k=%ld: %ld blocks leaked, %ld failures injected", step, k, c->live, c->failed);
    return 1;
}

/* Bytes of every parameter, appended to buf (for bitwise comparison); returns the length. */
static size_t param_bytes(qkv_ctx *ctx, unsigned char *buf, size_t cap) {
    int n = 0;
    qkv_tensor *const *ps = qkv_params(ctx, &n);
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        size_t b = (size_t)ps[i]->numel * qkv_dtype_size(ps[i]->dtype);
        if (len + b > cap) return 0;
        memcpy(buf + len, ps[i]->data, b);
        len += b;
    }
    return len;
}

/* The error a failed allocation must leave. */
static bool is_nomem(const qkv_ctx *ctx) {
    return qkv_error(ctx) == QKV_ERR_NOMEM && strstr(qkv_errmsg(ctx), "out of memory") != NULL;
}

enum { PARAM_CAP = 1 << 20 };

/* ---- the copy-task model -------------------------------------------------------------------------- */

static copy_config copy_cfg(counting *c) {
    copy_config cfg = copy_default_config();
    cfg.task = TASK_REVERSE;
    cfg.batch = 16;
    cfg.n = 12;
    cfg.vocab = 8;
    cfg.heads = 2;
    cfg.wo = true;
    cfg.d_k = 8;
    cfg.eval_size = 8;
    cfg.allocator = counting_allocator(c);
    return cfg;
}

Test(faults, copy_model_every_allocation_of_init_fails_cleanly) {
    counting ref = {0};
    copy_config cfg = copy_cfg(&ref);
    copy_model m;
    char err[1024];
    cr_assert(copy_model_init(&m, &cfg, err, sizeof err), "%s", err);
    long n_init = ref.calls;
    copy_model_free(&m);
    cr_assert_gt(n_init, 8, "init allocates the context, tables, parameters and optimizer state (%ld)", n_init);
    cr_assert_eq(ref.live, 0);

    int bad = 0;
    for (long k = 1; k <= n_init; k++) {
        counting c = {0};
        c.fail_at = k;
        cfg = copy_cfg(&c);
        bool ok = copy_model_init(&m, &cfg, err, sizeof err);
        if (ok || strstr(err, "out of memory") == NULL) {
            bad++;
            cr_log_error("k=%ld: init %s (\"%s\")", k, ok ? "succeeded" : "failed without \"out of memory\"", err);
        }
        if (m.ctx && !is_nomem(m.ctx)) {
            bad++;
            cr_log_error("k=%ld: the context holds %s: %s", k, qkv_status_name(qkv_error(m.ctx)), qkv_errmsg(m.ctx));
        }
        if (m.ctx) { /* the context itself works again */
            qkv_clear_error(m.ctx);
            qkv_tensor *t = qkv_sum(m.ctx, qkv_ones(m.ctx, QKV_F32, 1, (int64_t[]){5}));
            if (!t || qkv_f32(t)[0] != 5.0f) {
                bad++;
                cr_log_error("k=%ld: the context does not work after qkv_clear_error", k);
            }
        }
        copy_model_free(&m);
        bad += leaked_or_not_failed(&c, -1, k);
    }
    cr_expect_eq(bad, 0, "%d problems over %ld allocation sites", bad, n_init);
    cr_log_info("copy model init: %ld allocation sites failed in turn", n_init);
}

Test(faults, copy_model_every_allocation_of_the_first_step_fails_and_the_run_recovers) {
    /* reference: parameters after steps 1, 2 and 3; allocations of each step */
    static unsigned char want[3][PARAM_CAP], got[PARAM_CAP];
    size_t want_len[3];
    long per_step[3];
    counting ref = {0};
    copy_config cfg = copy_cfg(&ref);
    copy_model m;
    char err[1024];
    cr_assert(copy_model_init(&m, &cfg, err, sizeof err), "%s", err);
    long n_init = ref.calls;
    for (int s = 0; s < 3; s++) {
        long before = ref.calls;
        cr_assert(copy_train_step(&m, NULL), "%s", qkv_errmsg(m.ctx));
        per_step[s] = ref.calls - before;
        want_len[s] = param_bytes(m.ctx, want[s], PARAM_CAP);
        cr_assert_gt(want_len[s], 0);
    }
    copy_model_free(&m);
    cr_assert_eq(ref.live, 0);
    cr_assert_gt(per_step[0], 0, "the first step allocates (gradients, arena)");
    cr_expect_eq(per_step[1], 0, "a later step makes no allocation (%ld)", per_step[1]);
    cr_expect_eq(per_step[2], 0, "a later step makes no allocation (%ld)", per_step[2]);

    int bad = 0, reported = 0;
    for (long k = 1; k <= per_step[0]; k++) {
        counting c = {0};
        cfg = copy_cfg(&c);
        cr_assert(copy_model_init(&m, &cfg, err, sizeof err), "%s", err);
        c.fail_at = n_init + k;
        bool ok = copy_train_step(&m, NULL);
        if (!ok) {
            reported++;
            if (!is_nomem(m.ctx)) {
                bad++;
                cr_log_error("k=%ld: %s: %s", k, qkv_status_name(qkv_error(m.ctx)), qkv_errmsg(m.ctx));
            }
            /* recover: clear the error, drop what the partial backward accumulated, end the step */
            qkv_clear_error(m.ctx);
            qkv_optim_zero_grad(m.opt);
            qkv_step_end(m.ctx);
        } else if (k != per_step[0]) { /* only qkv_step_end's merge (the step's last allocation) may fail */
            bad++;
            cr_log_error("k=%ld of %ld: the step succeeded although an allocation failed", k, per_step[0]);
        }
        while (m.step < 3)
            if (!copy_train_step(&m, NULL)) {
                bad++;
                cr_log_error("k=%ld: step %lld after recovery: %s", k, (long long)m.step, qkv_errmsg(m.ctx));
                break;
            }
        size_t len = param_bytes(m.ctx, got, PARAM_CAP);
        if (len != want_len[2] || memcmp(got, want[2], len) != 0) {
            bad++;
            cr_log_error("k=%ld: the parameters after 3 steps differ from an uninterrupted run", k);
        }
        copy_model_free(&m);
        bad += leaked_or_not_failed(&c, -1, k);
    }
    cr_expect_eq(bad, 0, "%d problems over %ld allocation sites", bad, per_step[0]);
    cr_log_info("copy model first step: %ld allocation sites failed in turn (%d reported)", per_step[0], reported);
    cr_expect_geq(reported, per_step[0] - 1, "every failure but qkv_step_end's is reported (%d of %ld)", reported,
                  per_step[0]);
}

/* ---- a graph built from the public API ------------------------------------------------------------ */

enum { N = 6, DM = 10, DK = 4, HEADS = 2, V = 5 };

typedef struct graph {
    qkv_ctx *ctx;
    qkv_dtype dt;
    qkv_tensor *wq, *wk, *wv, *bv, *wq2, *wk2, *wv2, *wo, *bo;
    qkv_optimizer *opt;
} graph;

/* A deterministic value stream independent of the context's RNG (a retried step sees the same data). */
static double stream(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return ((double)(*s >> 11) / 9007199254740992.0 - 0.5) * 2.0;
}

static qkv_tensor *data_tensor(qkv_ctx *ctx, qkv_dtype dt, int ndim, const int64_t *shape, uint64_t seed,
                               double scale) {
    qkv_tensor *t = qkv_zeros(ctx, dt, ndim, shape);
    if (!t) return NULL;
    for (int64_t i = 0; i < t->numel; i++) qkv_set_flat(ctx, t, i, scale * stream(&seed));
    return t;
}

/* Parameters and optimizer. false on failure (error in the context). calls_before_end (may be NULL)
 * receives the allocator's count before the qkv_step_end that ends the building. */
static bool graph_setup(void *net, counting *c, long *calls_before_end) {
    graph *g = net;
    qkv_ctx *ctx = g->ctx;
    int64_t hk = HEADS * DK;
    g->wq = qkv_param(ctx, data_tensor(ctx, g->dt, 2, (int64_t[]){DM, hk}, 1, 0.5));
    g->wk = qkv_param(ctx, data_tensor(ctx, g->dt, 2, (int64_t[]){DM, hk}, 2, 0.5));
    g->wv = qkv_param(ctx, data_tensor(ctx, g->dt, 2, (int64_t[]){DM, hk}, 3, 0.5));
    g->bv = qkv_param(ctx, data_tensor(ctx, g->dt, 1, (int64_t[]){hk}, 4, 0.1));
    g->wq2 = qkv_param(ctx, data_tensor(ctx, g->dt, 2, (int64_t[]){DM, hk}, 5, 0.5));
    g->wk2 = qkv_param(ctx, data_tensor(ctx, g->dt, 2, (int64_t[]){DM, hk}, 6, 0.5));
    g->wv2 = qkv_param(ctx, data_tensor(ctx, g->dt, 2, (int64_t[]){DM, hk}, 7, 0.5));
    g->wo = qkv_param(ctx, data_tensor(ctx, g->dt, 2, (int64_t[]){hk, V}, 8, 0.5));
    g->bo = qkv_param(ctx, data_tensor(ctx, g->dt, 1, (int64_t[]){V}, 9, 0.1));
    if (calls_before_end) *calls_before_end = c->calls;
    qkv_step_end(ctx);
    if (qkv_error(ctx)) return false;
    qkv_optim_options o = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    o.lr = 0.05;
    qkv_tensor *ps[] = {g->wq, g->wk, g->wv, g->bv, g->wq2, g->wk2, g->wv2, g->wo, g->bo};
    g->opt = qkv_optim_new(ctx, &o, ps, 9);
    return g->opt != NULL;
}

/* One training step on a batch of `batch` sequences made from seed. calls_before_end (may be NULL)
 * receives the allocator's count just before qkv_step_end. Returns the step's status. */
static qkv_status graph_step(void *net, int64_t batch, uint64_t seed, counting *c, long *calls_before_end) {
    graph *g = net;
    qkv_ctx *ctx = g->ctx;
    qkv_tensor *x = data_tensor(ctx, g->dt, 3, (int64_t[]){batch, N, DM}, seed, 1.0);
    qkv_tensor *targets = qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){batch, N});
    qkv_tensor *mask = qkv_ones(ctx, QKV_U8, 3, (int64_t[]){batch, 1, N});
    if (targets && mask) {
        for (int64_t i = 0; i < batch * N; i++) qkv_i32(targets)[i] = (int32_t)((i * 7 + (int64_t)seed) % V);
        qkv_i32(targets)[0] = -1;                                   /* an ignored (padding) target  */
        for (int64_t b = 1; b < batch; b += 2) qkv_u8(mask)[b * N + N - 1] = 0; /* a padded last key */
    }
    // Q, K, V = X Wq, X Wk, X Wv + bv, split into heads: [B h, n, d_k]
    qkv_tensor *q = qkv_split_heads(ctx, qkv_projection(ctx, x, g->wq, NULL), HEADS);
    qkv_tensor *k = qkv_split_heads(ctx, qkv_projection(ctx, x, g->wk, NULL), HEADS);
    qkv_tensor *v = qkv_split_heads(ctx, qkv_projection(ctx, x, g->wv, g->bv), HEADS);
    // O = merge(softmax(Q K^T / sqrt(d_k), mask, causal) V)   [B, n, h d_k]
    qkv_tensor *o = qkv_merge_heads(ctx, qkv_attention(ctx, q, k, v, mask, QKV_SCALE_DEFAULT, QKV_CAUSAL, NULL),
                                    HEADS);
    // S = self_attention(X; Wq2, Wk2, Wv2) with scale 1/2, H = 0.5 (O + S)
    qkv_tensor *s = qkv_self_attention(ctx, x, g->wq2, g->wk2, g->wv2, mask, 0.5, 0, NULL);
    qkv_tensor *h = qkv_scale(ctx, qkv_add(ctx, o, s), 0.5);
    // L = cross_entropy(H Wo + bo, targets)
    qkv_tensor *loss = qkv_cross_entropy(ctx, qkv_projection(ctx, h, g->wo, g->bo), targets);
    qkv_status st = qkv_backward(ctx, loss, NULL);
    if (st != QKV_OK) return st;
    qkv_tensor *ps[] = {g->wq, g->wk, g->wv, g->bv, g->wq2, g->wk2, g->wv2, g->wo, g->bo};
    qkv_clip_grad_norm(ctx, ps, 9, 1.0);
    if (qkv_optim_step(g->opt) != QKV_OK || qkv_optim_zero_grad(g->opt) != QKV_OK) return qkv_error(ctx);
    if (calls_before_end) *calls_before_end = c->calls;
    qkv_step_end(ctx);
    return qkv_error(ctx);
}

static const int64_t step_batch[] = {2, 2, 3, 3}; /* step 3 is larger: the arena must grow again */
enum { STEPS = 4 };

static bool graph_open(void *net, qkv_dtype dt, counting *c) {
    graph *g = net;
    memset(g, 0, sizeof *g);
    g->dt = dt;
    qkv_options o = qkv_default_options();
    o.allocator = counting_allocator(c);
    o.arena_chunk = 1024; /* small: the first step crosses many chunk boundaries */
    g->ctx = qkv_ctx_new(&o);
    return g->ctx != NULL;
}

static void graph_close(void *net) {
    graph *g = net;
    qkv_optim_free(g->opt);
    qkv_ctx_free(g->ctx);
}

/* A network the allocation-failure sweep drives (the API graph here, the building-block graphs below): open a
 * context on the counting allocator, make parameters and optimizer, run one training step, close. Every one
 * starts with its qkv_ctx *ctx. */
typedef struct fault_net {
    const char *name;
    bool (*open)(void *net, qkv_dtype dt, counting *c);
    bool (*setup)(void *net, counting *c, long *calls_before_end);
    qkv_status (*step)(void *net, int64_t batch, uint64_t seed, counting *c, long *calls_before_end);
    void (*close)(void *net);
    qkv_optimizer *(*optimizer)(void *net);
    uint64_t seed;       /* step s draws from seed + s                                          */
    long min_first_step; /* the first step allocates more than this                           */
    bool grows;          /* step_batch[2] is larger than [0] and [1]: step 2 must grow the arena */
    int min_sites;       /* the sweep fails more allocation sites than this                      */
} fault_net;

static qkv_ctx *net_ctx(void *net) { return *(qkv_ctx **)net; }

/* A clean run counts each phase's allocations; then each allocation of setup and of every step is failed in
 * turn in a fresh run, which must report QKV_ERR_NOMEM (or succeed when only qkv_step_end's merge of the arena
 * failed), leak nothing, recover, and end with the parameters of the clean run, bit for bit. g is storage for
 * one network. */
static void sweep_faults(const fault_net *n, void *g, qkv_dtype dt) {
    static unsigned char want[PARAM_CAP], got[PARAM_CAP];
    counting ref = {0};
    cr_assert(n->open(g, dt, &ref));
    long setup_before_end = 0;
    cr_assert(n->setup(g, &ref, &setup_before_end), "%s", qkv_errmsg(net_ctx(g)));
    long n_setup = ref.calls, per_step[STEPS], before_end[STEPS];
    for (int s = 0; s < STEPS; s++) {
        long before = ref.calls;
        cr_assert_eq(n->step(g, step_batch[s], n->seed + (uint64_t)s, &ref, &before_end[s]), QKV_OK, "%s step %d: %s",
                     n->name, s, qkv_errmsg(net_ctx(g)));
        per_step[s] = ref.calls - before;
        before_end[s] -= before;
    }
    size_t want_len = param_bytes(net_ctx(g), want, PARAM_CAP);
    n->close(g);
    cr_assert_eq(ref.live, 0);
    cr_assert_gt(per_step[0], n->min_first_step, "%s: the first step allocates across chunks (%ld)", n->name, per_step[0]);
    cr_expect_eq(per_step[1], 0, "%s: a second step of the same shape allocates nothing (%ld)", n->name, per_step[1]);
    if (n->grows) {
        cr_expect_gt(per_step[2], 0, "%s: a larger step grows the arena (%ld)", n->name, per_step[2]);
        cr_expect_eq(per_step[3], 0, "%s: and the next one of that size allocates nothing (%ld)", n->name, per_step[3]);
    }

    int bad = 0, sites = 0;
    /* building: every allocation of the context, the parameters and the optimizer */
    for (long k = 1; k <= n_setup; k++, sites++) {
        counting c = {0};
        c.fail_at = k;
        if (!n->open(g, dt, &c)) {
            if (k != 1) bad++, cr_log_error("%s setup k=%ld: qkv_ctx_new failed", n->name, k);
            continue;
        }
        qkv_ctx *ctx = net_ctx(g);
        bool ok = n->setup(g, &c, NULL);
        if (ok ? k <= setup_before_end : !is_nomem(ctx)) { /* qkv_step_end may fail silently */
            bad++;
            cr_log_error("%s setup k=%ld: %s: %s", n->name, k, qkv_status_name(qkv_error(ctx)), qkv_errmsg(ctx));
        }
        qkv_clear_error(ctx);
        qkv_tensor *t = qkv_sum(ctx, qkv_ones(ctx, dt, 2, (int64_t[]){3, 3}));
        if (!t || qkv_get_flat(ctx, t, 0) != 9.0) bad++, cr_log_error("%s setup k=%ld: no recovery", n->name, k);
        n->close(g);
        if (c.live != 0) bad++, cr_log_error("%s setup k=%ld: %ld blocks leaked", n->name, k, c.live);
    }
    /* the steps that allocate: fail each allocation, recover, finish the run, compare */
    for (int s = 0; s < STEPS; s++) {
        for (long k = 1; k <= per_step[s]; k++, sites++) {
            counting c = {0};
            cr_assert(n->open(g, dt, &c));
            cr_assert(n->setup(g, &c, NULL));
            qkv_ctx *ctx = net_ctx(g);
            for (int t = 0; t < s; t++) cr_assert_eq(n->step(g, step_batch[t], n->seed + (uint64_t)t, &c, NULL), QKV_OK);
            c.fail_at = c.calls + k;
            qkv_status st = n->step(g, step_batch[s], n->seed + (uint64_t)s, &c, NULL);
            bool in_step_end = k > before_end[s];
            if (st == QKV_OK ? !in_step_end : !is_nomem(ctx)) {
                bad++;
                cr_log_error("%s step %d k=%ld of %ld: %s: %s", n->name, s, k, per_step[s], qkv_status_name(st),
                             qkv_errmsg(ctx));
            }
            if (st != QKV_OK) { /* recover and redo the step */
                qkv_clear_error(ctx);
                qkv_optim_zero_grad(n->optimizer(g));
                qkv_step_end(ctx);
                if (n->step(g, step_batch[s], n->seed + (uint64_t)s, &c, NULL) != QKV_OK) {
                    bad++;
                    cr_log_error("%s step %d k=%ld: the retried step failed: %s", n->name, s, k, qkv_errmsg(ctx));
                }
            }
            for (int t = s + 1; t < STEPS; t++)
                if (n->step(g, step_batch[t], n->seed + (uint64_t)t, &c, NULL) != QKV_OK) {
                    bad++;
                    cr_log_error("%s step %d k=%ld: step %d failed afterwards: %s", n->name, s, k, t, qkv_errmsg(ctx));
                }
            size_t len = param_bytes(ctx, got, PARAM_CAP);
            if (len != want_len || memcmp(got, want, len) != 0) {
                bad++;
                cr_log_error("%s step %d k=%ld: the final parameters differ from an uninterrupted run", n->name, s, k);
            }
            n->close(g);
            bad += leaked_or_not_failed(&c, s, k);
        }
    }
    cr_expect_eq(bad, 0, "%s %s: %d problems over %d allocation sites", n->name, qkv_dtype_name(dt), bad, sites);
    cr_expect_gt(sites, n->min_sites, "%s: %d allocation sites were failed", n->name, sites);
    cr_log_info("%s %s: %d allocation sites failed in turn (setup %ld, steps %ld/%ld/%ld/%ld)", n->name,
                qkv_dtype_name(dt), sites, n_setup, per_step[0], per_step[1], per_step[2], per_step[3]);
}

static qkv_optimizer *graph_optimizer(void *net) { return ((graph *)net)->opt; }
static const fault_net graph_net = {"api graph", graph_open, graph_setup, graph_step, graph_close, graph_optimizer,
                                    100, 15, true, 40};

static void graph_faults(qkv_dtype dt) {
    graph g;
    sweep_faults(&graph_net, &g, dt);
}

Test(faults, api_graph_f32_every_allocation_of_setup_first_and_later_steps) { graph_faults(QKV_F32); }
Test(faults, api_graph_f64_every_allocation_of_setup_first_and_later_steps) { graph_faults(QKV_F64); }

/* ---- anomaly mode: the first operator whose gradient is NaN or inf -------------------------------- */
/*
 * tests/test_autograd.c checks one case (an inf reaching qkv_mul's gradient). These run the attention
 * operators: a NaN score that the mask keeps (stops at qkv_softmax, or at qkv_matmul when V wants a
 * gradient), a NaN score under the mask and a fully masked row (no stop), a NaN query through the fused
 * qkv_attention and through the composed path, an inf logit (stops at qkv_cross_entropy), a gradient
 * that overflows mid-graph while the operators after it stay finite (stops at the inner qkv_scale), and an
 * inf input of qkv_self_attention. Besides the expected operator, shape and index, each report is checked
 * against the tape itself (verify_anomaly): the node it names is the first node, in backward order, with a
 * non-finite input gradient; the shape is that input's; the index is its gradient's first bad element;
 * and nothing before it in the graph was reached (the leaves upstream have no gradient).
 */
#include "qkv_internal.h"

static int64_t first_nonfinite(const qkv_tensor *t) {
    for (int64_t i = 0; i < t->numel; i++)
        if (!isfinite(t->dtype == QKV_F64 ? qkv_f64(t)[i] : (double)qkv_f32(t)[i])) return i;
    return -1;
}

typedef struct anomaly {
    char op[64], shape[64];
    int input;
    long long index;
} anomaly;

/* Parse the report of a QKV_ERR_NUMERIC backward and check it against the tape (see above). The graphs
 * here share no tensor between two nodes' inputs, so a processed node's input gradients are final. */
static anomaly verify_anomaly(qkv_ctx *ctx, const qkv_tensor *loss) {
    anomaly a;
    memset(&a, 0, sizeof a);
    const char *msg = qkv_errmsg(ctx);
    cr_assert_eq(qkv_error(ctx), QKV_ERR_NUMERIC, "%s: %s", qkv_status_name(qkv_error(ctx)), msg);
    double value = 0;
    int got = sscanf(msg, "qkv_backward: anomaly in the backward of %63[^:]: gradient of input %d %63s is %lf at flat index %lld",
                     a.op, &a.input, a.shape, &value, &a.index);
    cr_assert_eq(got, 5, "unexpected report: %s", msg);
    cr_expect(!isfinite(value), "the reported value %g is not NaN or inf: %s", value, msg);
    for (const qkv_node_ *node = loss->node_; node; node = node->prev) {
        if (!node->out->grad) continue;
        for (int i = 0; i < node->n_in; i++) {
            const qkv_tensor *in = node->in[i];
            if (!in || !in->requires_grad || !in->grad) continue;
            int64_t bad = first_nonfinite(in->grad);
            if (bad < 0) continue;
            char shape[64];
            qkv_shape_str(in, shape, sizeof shape);
            cr_expect_str_eq(a.op, node->op, "the first non-finite gradient is %s's: %s", node->op, msg);
            cr_expect_eq(a.input, i, "input %d of %s: %s", i, node->op, msg);
            cr_expect_str_eq(a.shape, shape, "%s", msg);
            cr_expect_eq(a.index, (long long)bad, "its first bad element is %lld: %s", (long long)bad, msg);
            return a;
        }
    }
    cr_assert_fail("no node has a non-finite input gradient, yet backward reported: %s", msg);
    return a;
}

static qkv_tensor *pattern(qkv_ctx *ctx, qkv_dtype dt, int ndim, const int64_t *shape, uint64_t seed, bool grad) {
    qkv_tensor *t = data_tensor(ctx, dt, ndim, shape, seed, 1.0);
    cr_assert_not_null(t, "%s", qkv_errmsg(ctx));
    if (grad) cr_assert_eq(qkv_set_requires_grad(ctx, t, true), QKV_OK);
    return t;
}

/* scores = Q K^T [2,3,4] with a NaN written at [1,2,1] (kept, or dropped when drop_it), a padding mask
 * that drops key 3 of every row of batch 0 (and every key of row 0 of batch 1 when empty_row), then
 * out = softmax(scores) V [2,3,6] and L = sum(out * R). */
static qkv_tensor *kept_nan_graph(qkv_ctx *ctx, qkv_dtype dt, bool v_grad, bool drop_it, bool empty_row,
                                  qkv_tensor **q_out) {
    qkv_tensor *q = pattern(ctx, dt, 3, (int64_t[]){2, 3, 2}, 11, true);
    qkv_tensor *k = pattern(ctx, dt, 3, (int64_t[]){2, 4, 2}, 12, false);
    qkv_tensor *v = pattern(ctx, dt, 3, (int64_t[]){2, 4, 6}, 13, v_grad);
    qkv_tensor *r = pattern(ctx, dt, 3, (int64_t[]){2, 3, 6}, 14, false);
    qkv_tensor *mask = qkv_ones(ctx, QKV_U8, 3, (int64_t[]){2, 3, 4});
    cr_assert_not_null(mask);
    for (int i = 0; i < 3; i++) qkv_u8(mask)[i * 4 + 3] = 0;
    if (drop_it) qkv_u8(mask)[12 + 2 * 4 + 1] = 0;
    if (empty_row)
        for (int j = 0; j < 4; j++) qkv_u8(mask)[12 + j] = 0;
    qkv_tensor *scores = qkv_matmul(ctx, q, k, QKV_TRANS_B);
    cr_assert_not_null(scores, "%s", qkv_errmsg(ctx));
    cr_assert_eq(qkv_set_flat(ctx, scores, 12 + 2 * 4 + 1, NAN), QKV_OK); // scores[1, 2, 1] = NaN
    qkv_tensor *out = qkv_matmul(ctx, qkv_softmax(ctx, scores, mask, 0), v, 0);
    qkv_tensor *loss = qkv_sum(ctx, qkv_mul(ctx, out, r));
    cr_assert_not_null(loss, "%s", qkv_errmsg(ctx));
    *q_out = q;
    return loss;
}

Test(anomaly, a_kept_nan_score_stops_backward_at_qkv_softmax_with_shape_and_index) {
    for (int dt = QKV_F32; dt <= QKV_F64; dt++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *q;
        qkv_tensor *loss = kept_nan_graph(ctx, (qkv_dtype)dt, false, false, false, &q);
        qkv_set_anomaly_mode(ctx, true);
        cr_expect_eq(qkv_backward(ctx, loss, NULL), QKV_ERR_NUMERIC);
        anomaly a = verify_anomaly(ctx, loss);
        /* dS = A * (dA - rowsum(dA * A)): row [1, 2] of A is NaN, so dS[1, 2, 0] (flat 12 + 8 = 20) first */
        cr_expect_str_eq(a.op, "qkv_softmax");
        cr_expect_str_eq(a.shape, "[2,3,4]");
        cr_expect_eq(a.index, 20);
        cr_expect(strstr(qkv_errmsg(ctx), "qkv_softmax") && strstr(qkv_errmsg(ctx), "[2,3,4]") &&
                      strstr(qkv_errmsg(ctx), "index 20"),
                  "%s", qkv_errmsg(ctx));
        cr_expect_null(q->grad, "backward stopped before the Q K^T matmul");
        qkv_ctx_free(ctx);

        /* without anomaly mode the same backward runs to the end and the NaN reaches q's gradient */
        ctx = qkv_ctx_new(NULL);
        loss = kept_nan_graph(ctx, (qkv_dtype)dt, false, false, false, &q);
        cr_expect_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        cr_expect(q->grad && first_nonfinite(q->grad) == 1 * 3 * 2 + 2 * 2, "the NaN reaches dq[1, 2, 0]");
        qkv_ctx_free(ctx);
    }
}

Test(anomaly, with_v_wanting_a_gradient_it_stops_earlier_at_the_av_matmul) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *q;
    qkv_tensor *loss = kept_nan_graph(ctx, QKV_F64, true, false, false, &q);
    qkv_set_anomaly_mode(ctx, true);
    cr_expect_eq(qkv_backward(ctx, loss, NULL), QKV_ERR_NUMERIC);
    anomaly a = verify_anomaly(ctx, loss);
    /* dV = A^T dOut: every key of batch 1 meets the NaN row, so dV[1, 0, 0] (flat 4 * 6 = 24) first */
    cr_expect_str_eq(a.op, "qkv_matmul");
    cr_expect_eq(a.input, 1);
    cr_expect_str_eq(a.shape, "[2,4,6]");
    cr_expect_eq(a.index, 24);
    cr_expect_null(q->grad);
    qkv_ctx_free(ctx);
}

Test(anomaly, a_nan_under_the_mask_and_a_fully_masked_row_do_not_stop_backward) {
    for (int dt = QKV_F32; dt <= QKV_F64; dt++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *q;
        qkv_tensor *loss = kept_nan_graph(ctx, (qkv_dtype)dt, true, true, true, &q);
        qkv_set_anomaly_mode(ctx, true);
        cr_expect_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        cr_expect(q->grad && first_nonfinite(q->grad) < 0, "every gradient finite");
        qkv_ctx_free(ctx);
    }
}

Test(anomaly, a_nan_query_through_fused_and_composed_attention) {
    for (int composed = 0; composed <= 1; composed++)
        for (int dt = QKV_F32; dt <= QKV_F64; dt++) {
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            qkv_tensor *q = pattern(ctx, (qkv_dtype)dt, 3, (int64_t[]){2, 3, 2}, 21, true);
            qkv_tensor *k = pattern(ctx, (qkv_dtype)dt, 3, (int64_t[]){2, 5, 2}, 22, true);
            qkv_tensor *v = pattern(ctx, (qkv_dtype)dt, 3, (int64_t[]){2, 5, 4}, 23, true);
            qkv_tensor *r = pattern(ctx, (qkv_dtype)dt, 3, (int64_t[]){2, 3, 4}, 24, false);
            /* q is a leaf, so route it through a scale to have an operator upstream that must not be reached */
            qkv_tensor *q2 = qkv_scale(ctx, q, 1.0);
            cr_assert_eq(qkv_set_flat(ctx, q2, (1 * 3 + 2) * 2, NAN), QKV_OK); // q[1, 2, 0] = NaN
            qkv_tensor *attn = NULL;
            qkv_tensor *out = composed ? qkv_attention_composed_(ctx, "composed", q2, k, v, NULL, QKV_SCALE_DEFAULT,
                                                                 QKV_CAUSAL, &attn)
                                      : qkv_attention(ctx, q2, k, v, NULL, QKV_SCALE_DEFAULT, QKV_CAUSAL, NULL);
            qkv_tensor *loss = qkv_sum(ctx, qkv_mul(ctx, out, r));
            cr_assert_not_null(loss, "%s", qkv_errmsg(ctx));
            qkv_set_anomaly_mode(ctx, true);
            cr_expect_eq(qkv_backward(ctx, loss, NULL), QKV_ERR_NUMERIC);
            anomaly a = verify_anomaly(ctx, loss);
            if (!composed) { /* one node, "qkv_attention" (which of dq, dk, dv: see the next test) */
                cr_expect_str_eq(a.op, "qkv_attention");
            } else { /* matmul, scale, softmax, matmul: the A V matmul's dV first */
                cr_expect_str_eq(a.op, "qkv_matmul");
                cr_expect_eq(a.input, 1);
                cr_expect_str_eq(a.shape, "[2,5,4]");
            }
            cr_expect_null(q->grad, "the scale before the attention was not reached");
            qkv_ctx_free(ctx);
        }
}

Test(anomaly, an_inf_logit_stops_at_qkv_cross_entropy) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *logits = pattern(ctx, QKV_F32, 3, (int64_t[]){2, 3, 5}, 31, true);
    qkv_f32(logits)[(1 * 3 + 0) * 5 + 2] = INFINITY; // logits[1, 0, 2] = +inf, an input
    qkv_tensor *targets = qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){2, 3});
    for (int i = 0; i < 6; i++) qkv_i32(targets)[i] = i % 5;
    qkv_tensor *loss = qkv_cross_entropy(ctx, logits, targets);
    qkv_set_anomaly_mode(ctx, true);
    cr_expect_eq(qkv_backward(ctx, loss, NULL), QKV_ERR_NUMERIC);
    anomaly a = verify_anomaly(ctx, loss);
    cr_expect_str_eq(a.op, "qkv_cross_entropy");
    cr_expect_str_eq(a.shape, "[2,3,5]");
    cr_expect_eq(a.index, 15, "the row of logits[1, 0] starts at 15");
    qkv_ctx_free(ctx);
}

Test(anomaly, a_gradient_that_overflows_mid_graph_stops_at_that_operator) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = pattern(ctx, QKV_F64, 2, (int64_t[]){2, 2}, 41, true);
    qkv_tensor *y = qkv_scale(ctx, x, 1e200);   // y = 1e200 x
    qkv_tensor *z = qkv_scale(ctx, y, 1e200);   // z = 1e200 y: inf in the forward already
    qkv_tensor *loss = qkv_sum(ctx, z);         // dz = 1, dy = 1e200 (finite), dx = 1e400 = inf
    qkv_set_anomaly_mode(ctx, true);
    cr_expect_eq(qkv_backward(ctx, loss, NULL), QKV_ERR_NUMERIC);
    anomaly a = verify_anomaly(ctx, loss);
    cr_expect_str_eq(a.op, "qkv_scale");
    cr_expect_str_eq(a.shape, "[2,2]");
    cr_expect_eq(a.index, 0);
    cr_expect(y->grad && first_nonfinite(y->grad) < 0 && qkv_f64(y->grad)[0] == 1e200,
              "the outer scale's gradient was finite and passed");
    /* the context recovers: clear, end the step, and a clean graph passes with anomaly mode still on */
    qkv_clear_error(ctx);
    qkv_step_end(ctx);
    qkv_tensor *w = pattern(ctx, QKV_F64, 1, (int64_t[]){3}, 42, true);
    cr_expect_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, w, w)), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

Test(anomaly, an_inf_input_of_self_attention_is_reported_consistently) {
    for (int dt = QKV_F32; dt <= QKV_F64; dt++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *x = pattern(ctx, (qkv_dtype)dt, 3, (int64_t[]){2, 4, 3}, 51, false);
        qkv_set_flat(ctx, x, (1 * 4 + 2) * 3, INFINITY); // x[1, 2, 0] = +inf
        qkv_tensor *wq = qkv_param(ctx, pattern(ctx, (qkv_dtype)dt, 2, (int64_t[]){3, 2}, 52, false));
        qkv_tensor *wk = qkv_param(ctx, pattern(ctx, (qkv_dtype)dt, 2, (int64_t[]){3, 2}, 53, false));
        qkv_tensor *wv = qkv_param(ctx, pattern(ctx, (qkv_dtype)dt, 2, (int64_t[]){3, 5}, 54, false));
        qkv_tensor *r = pattern(ctx, (qkv_dtype)dt, 3, (int64_t[]){2, 4, 5}, 55, false);
        qkv_tensor *loss = qkv_sum(ctx, qkv_mul(ctx, qkv_self_attention(ctx, x, wq, wk, wv, NULL, QKV_SCALE_DEFAULT, 0, NULL), r));
        cr_assert_not_null(loss, "%s", qkv_errmsg(ctx));
        qkv_set_anomaly_mode(ctx, true);
        cr_expect_eq(qkv_backward(ctx, loss, NULL), QKV_ERR_NUMERIC);
        anomaly a = verify_anomaly(ctx, loss);
        cr_expect(strncmp(a.op, "qkv_", 4) == 0, "%s", a.op);
        qkv_ctx_free(ctx);
    }
}

/* A NaN query makes its whole score row NaN. The composed path (and PyTorch) then gives a NaN output row and
 * NaN in dq's row, dk and dv; the fused path must not turn that row into zeros (as it does for a row whose
 * every key is dropped), or a NaN would vanish silently from the forward and from dq. */
Test(anomaly, a_kept_nan_propagates_the_same_through_fused_and_composed_attention) {
    for (int dt = QKV_F32; dt <= QKV_F64; dt++) {
        int64_t nonfinite[2][4]; /* out, dq, dk, dv: index of the first non-finite element */
        for (int composed = 0; composed <= 1; composed++) {
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            qkv_tensor *q = pattern(ctx, (qkv_dtype)dt, 3, (int64_t[]){2, 3, 2}, 61, true);
            qkv_tensor *k = pattern(ctx, (qkv_dtype)dt, 3, (int64_t[]){2, 5, 2}, 62, true);
            qkv_tensor *v = pattern(ctx, (qkv_dtype)dt, 3, (int64_t[]){2, 5, 4}, 63, true);
            cr_assert_eq(qkv_set_flat(ctx, q, (1 * 3 + 2) * 2, NAN), QKV_OK); // q[1, 2, 0] = NaN
            qkv_tensor *attn = NULL;
            qkv_tensor *out = composed ? qkv_attention_composed_(ctx, "composed", q, k, v, NULL, QKV_SCALE_DEFAULT,
                                                                 QKV_CAUSAL, &attn)
                                      : qkv_attention(ctx, q, k, v, NULL, QKV_SCALE_DEFAULT, QKV_CAUSAL, NULL);
            cr_assert_not_null(out, "%s", qkv_errmsg(ctx));
            cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, out), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
            nonfinite[composed][0] = first_nonfinite(out);
            nonfinite[composed][1] = first_nonfinite(q->grad);
            nonfinite[composed][2] = first_nonfinite(k->grad);
            nonfinite[composed][3] = first_nonfinite(v->grad);
            qkv_ctx_free(ctx);
        }
        const char *names[4] = {"out", "dq", "dk", "dv"};
        cr_expect_eq(nonfinite[1][0], (1 * 3 + 2) * 4, "%s composed: out[1, 2, :] is NaN", qkv_dtype_name((qkv_dtype)dt));
        for (int i = 0; i < 4; i++)
            cr_expect_eq(nonfinite[0][i], nonfinite[1][i], "%s %s: first non-finite element %lld fused, %lld composed",
                         qkv_dtype_name((qkv_dtype)dt), names[i], (long long)nonfinite[0][i], (long long)nonfinite[1][i]);
    }
}

/* ---- the building blocks (relu, softcap, rope, dropout, sinusoidal positions) under allocation failure --- */
/*
 * A small rotary-attention model built from the blocks, with the same sweep as graph_faults: every allocation
 * of setup and of each step that allocates fails in turn; the run must report QKV_ERR_NOMEM, recover, and end
 * with the parameters of an uninterrupted run, bit for bit, leaking nothing. Each step seeds the context RNG
 * first (as a reproducible training loop does), so a retried step draws the same dropout mask.
 *   X + P (sinusoidal [n, DM]) -> Q, K, V = split(X Wq), split(X Wk), split(X Wv); Q, K = rope(Q), rope(K)
 *   O = merge(attention(Q, K, V, causal));  H = dropout(relu(O), 0.25);  L = CE(softcap(H Wo + bo, 5))
 */
typedef struct blocks_net {
    qkv_ctx *ctx;
    qkv_dtype dt;
    qkv_tensor *wq, *wk, *wv, *wo, *bo;
    qkv_optimizer *opt;
} blocks_net;

static bool blocks_open(void *net, qkv_dtype dt, counting *c) {
    blocks_net *g = net;
    memset(g, 0, sizeof *g);
    g->dt = dt;
    qkv_options o = qkv_default_options();
    o.allocator = counting_allocator(c);
    o.arena_chunk = 1024;
    g->ctx = qkv_ctx_new(&o);
    return g->ctx != NULL;
}

static void blocks_close(void *net) {
    blocks_net *g = net;
    qkv_optim_free(g->opt);
    qkv_ctx_free(g->ctx);
}

static bool blocks_setup(void *net, counting *c, long *calls_before_end) {
    blocks_net *g = net;
    qkv_ctx *ctx = g->ctx;
    int64_t hk = HEADS * DK;
    g->wq = qkv_param(ctx, data_tensor(ctx, g->dt, 2, (int64_t[]){DM, hk}, 71, 0.5));
    g->wk = qkv_param(ctx, data_tensor(ctx, g->dt, 2, (int64_t[]){DM, hk}, 72, 0.5));
    g->wv = qkv_param(ctx, data_tensor(ctx, g->dt, 2, (int64_t[]){DM, hk}, 73, 0.5));
    g->wo = qkv_param(ctx, data_tensor(ctx, g->dt, 2, (int64_t[]){hk, V}, 74, 0.5));
    g->bo = qkv_param(ctx, data_tensor(ctx, g->dt, 1, (int64_t[]){V}, 75, 0.1));
    if (calls_before_end) *calls_before_end = c->calls;
    qkv_step_end(ctx);
    if (qkv_error(ctx)) return false;
    qkv_optim_options o = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    o.lr = 0.05;
    qkv_tensor *ps[] = {g->wq, g->wk, g->wv, g->wo, g->bo};
    g->opt = qkv_optim_new(ctx, &o, ps, 5);
    return g->opt != NULL;
}

static qkv_status blocks_step(void *net, int64_t batch, uint64_t seed, counting *c, long *calls_before_end) {
    blocks_net *g = net;
    qkv_ctx *ctx = g->ctx;
    qkv_seed(ctx, 7000 + seed);
    qkv_tensor *x = qkv_add(ctx, data_tensor(ctx, g->dt, 3, (int64_t[]){batch, N, DM}, seed, 1.0),
                            qkv_sinusoidal_positions(ctx, N, DM, g->dt));
    qkv_tensor *targets = qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){batch, N});
    if (targets)
        for (int64_t i = 0; i < batch * N; i++) qkv_i32(targets)[i] = (int32_t)((i * 3 + (int64_t)seed) % V);
    qkv_tensor *q = qkv_rope(ctx, qkv_split_heads(ctx, qkv_projection(ctx, x, g->wq, NULL), HEADS), 10000.0, 2);
    qkv_tensor *k = qkv_rope(ctx, qkv_split_heads(ctx, qkv_projection(ctx, x, g->wk, NULL), HEADS), 10000.0, 2);
    qkv_tensor *v = qkv_split_heads(ctx, qkv_projection(ctx, x, g->wv, NULL), HEADS);
    qkv_tensor *o = qkv_merge_heads(ctx, qkv_attention(ctx, q, k, v, NULL, QKV_SCALE_DEFAULT, QKV_CAUSAL, NULL), HEADS);
    qkv_tensor *h = qkv_dropout(ctx, qkv_relu(ctx, o), 0.25);
    qkv_tensor *logits = qkv_softcap(ctx, qkv_projection(ctx, h, g->wo, g->bo), 5.0);
    qkv_status st = qkv_backward(ctx, qkv_cross_entropy(ctx, logits, targets), NULL);
    if (st != QKV_OK) return st;
    qkv_tensor *ps[] = {g->wq, g->wk, g->wv, g->wo, g->bo};
    qkv_clip_grad_norm(ctx, ps, 5, 1.0);
    if (qkv_optim_step(g->opt) != QKV_OK || qkv_optim_zero_grad(g->opt) != QKV_OK) return qkv_error(ctx);
    if (calls_before_end) *calls_before_end = c->calls;
    qkv_step_end(ctx);
    return qkv_error(ctx);
}

static qkv_optimizer *blocks_optimizer(void *net) { return ((blocks_net *)net)->opt; }
static const fault_net blocks_fault_net = {"blocks graph", blocks_open, blocks_setup, blocks_step, blocks_close,
                                           blocks_optimizer, 200, 10, true, 30};

static void blocks_faults(qkv_dtype dt) {
    blocks_net g;
    sweep_faults(&blocks_fault_net, &g, dt);
}

Test(faults, blocks_graph_f32_every_allocation_fails_in_turn) { blocks_faults(QKV_F32); }
Test(faults, blocks_graph_f64_every_allocation_fails_in_turn) { blocks_faults(QKV_F64); }

/* ---- anomaly mode through the building blocks ---------------------------------------------------- */
/*
 * softcap and relu read x in their backward: a NaN x makes their input gradient NaN, and backward stops
 * there, naming the operator (relu gives NaN, not 0, for a NaN x: see ops/relu.c). rope and dropout never
 * read x in their backward (a rotation, a mask), so a NaN x leaves their input gradient finite, as the
 * mathematics does; a NaN arriving in their upstream gradient stops there. Each graph puts a qkv_scale
 * before the operator, so that "not reached" is visible (its input, a leaf, gets no gradient).
 */
enum { AN_RELU, AN_SOFTCAP, AN_ROPE, AN_DROPOUT };

static const char *const AN_NAMES[] = {"qkv_relu", "qkv_softcap", "qkv_rope", "qkv_dropout"};

static qkv_tensor *anomaly_block(qkv_ctx *ctx, int op, qkv_tensor *x) {
    switch (op) {
    case AN_RELU: return qkv_relu(ctx, x);
    case AN_SOFTCAP: return qkv_softcap(ctx, x, 2.0);
    case AN_ROPE: return qkv_rope(ctx, x, 10000.0, 3);
    default: qkv_seed(ctx, 5); return qkv_dropout(ctx, x, 0.5);
    }
}

Test(anomaly, a_nan_stops_backward_at_relu_softcap_rope_and_dropout) {
    for (int op = AN_RELU; op <= AN_DROPOUT; op++)
        for (int dt = QKV_F32; dt <= QKV_F64; dt++) {
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            qkv_tensor *x = pattern(ctx, (qkv_dtype)dt, 3, (int64_t[]){2, 3, 4}, 81, true);
            for (int64_t i = 0; i < x->numel; i++) /* positive: relu passes it, dropout keeps it nonzero */
                qkv_set_flat(ctx, x, i, 0.5 + fabs(qkv_get_flat(ctx, x, i)));
            qkv_tensor *x2 = qkv_scale(ctx, x, 1.0);
            qkv_tensor *dy = pattern(ctx, (qkv_dtype)dt, 3, (int64_t[]){2, 3, 4}, 82, false);
            int64_t at = 13; /* [1, 0, 1] */
            if (op == AN_RELU || op == AN_SOFTCAP) cr_assert_eq(qkv_set_flat(ctx, x2, at, NAN), QKV_OK);
            qkv_tensor *y = anomaly_block(ctx, op, x2);
            cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
            if (op == AN_DROPOUT)
                while (qkv_get_flat(ctx, y, at) == 0) at++; /* a kept element: a dropped one never reads dy */
            if (op == AN_ROPE || op == AN_DROPOUT) cr_assert_eq(qkv_set_flat(ctx, dy, at, NAN), QKV_OK);
            qkv_set_anomaly_mode(ctx, true);
            cr_expect_eq(qkv_backward(ctx, y, dy), QKV_ERR_NUMERIC, "%s: %s", AN_NAMES[op], qkv_errmsg(ctx));
            anomaly a = verify_anomaly(ctx, y);
            cr_expect_str_eq(a.op, AN_NAMES[op]);
            cr_expect_str_eq(a.shape, "[2,3,4]");
            /* rope's NaN spreads to the pair partner: dx[j] and dx[j + d/2] of that row, j = 1 -> flat 13 */
            cr_expect_eq(a.index, op == AN_ROPE ? 13 : at, "%s: index %lld", AN_NAMES[op], a.index);
            cr_expect_null(x->grad, "%s: the scale before it was not reached", AN_NAMES[op]);
            qkv_ctx_free(ctx);
        }
}

Test(anomaly, a_nan_input_of_rope_and_dropout_leaves_their_input_gradient_finite) {
    for (int op = AN_ROPE; op <= AN_DROPOUT; op++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *x = pattern(ctx, QKV_F64, 2, (int64_t[]){3, 4}, 91, true);
        qkv_tensor *x2 = qkv_scale(ctx, x, 1.0);
        cr_assert_eq(qkv_set_flat(ctx, x2, 5, NAN), QKV_OK);
        qkv_tensor *y = anomaly_block(ctx, op, x2);
        cr_assert_not_null(y);
        qkv_set_anomaly_mode(ctx, true);
        cr_expect_eq(qkv_backward(ctx, y, pattern(ctx, QKV_F64, 2, (int64_t[]){3, 4}, 92, false)), QKV_OK, "%s: %s",
                     AN_NAMES[op], qkv_errmsg(ctx));
        cr_expect(x->grad && first_nonfinite(x->grad) < 0, "%s: the input gradient stays finite", AN_NAMES[op]);
        qkv_ctx_free(ctx);
    }
}

/* ---- the building blocks: embedding, layer norm, GELU, RMS norm ----------------------------------- */
/*
 * The same sweep over a second graph, X = embedding(table, ids), H = gelu(layer_norm(X)), G = gelu(rms_norm(H))
 * (tanh and erf), L = cross_entropy(G Wo + bo), with AdamW: every allocation of its setup and of each step
 * fails in turn; each run reports QKV_ERR_NOMEM, recovers, ends with the parameters of a clean run, leaks
 * nothing. And anomaly mode: a NaN input of each operator stops the backward there.
 */
enum { BV = 7, BD = 6 };

typedef struct norms {
    qkv_ctx *ctx;
    qkv_dtype dt;
    qkv_tensor *ps[7]; /* table [BV, BD], ln gamma, ln beta, rms gamma [BD], Wo [BD, BV], bo [BV] */
    int n_ps;
    qkv_optimizer *opt;
} norms;

static bool norms_open(void *net, qkv_dtype dt, counting *c) {
    norms *g = net;
    memset(g, 0, sizeof *g);
    g->dt = dt;
    qkv_options o = qkv_default_options();
    o.allocator = counting_allocator(c);
    o.arena_chunk = 1024;
    g->ctx = qkv_ctx_new(&o);
    return g->ctx != NULL;
}

static void norms_close(void *net) {
    norms *g = net;
    qkv_optim_free(g->opt);
    qkv_ctx_free(g->ctx);
}

static bool norms_setup(void *net, counting *c, long *calls_before_end) {
    norms *g = net;
    qkv_ctx *ctx = g->ctx;
    const struct {
        int ndim;
        int64_t shape[2];
        double scale, offset;
    } spec[6] = {{2, {BV, BD}, 1.0, 0}, {1, {BD}, 0.3, 1}, {1, {BD}, 0.1, 0}, {1, {BD}, 0.3, 1},
                 {2, {BD, BV}, 0.5, 0}, {1, {BV}, 0.1, 0}};
    g->n_ps = 6;
    for (int i = 0; i < 6; i++) {
        qkv_tensor *t = data_tensor(ctx, g->dt, spec[i].ndim, spec[i].shape, 40 + (uint64_t)i, spec[i].scale);
        if (t && spec[i].offset != 0)
            for (int64_t j = 0; j < t->numel; j++) qkv_set_flat(ctx, t, j, qkv_get_flat(ctx, t, j) + spec[i].offset);
        g->ps[i] = qkv_param(ctx, t);
    }
    if (calls_before_end) *calls_before_end = c->calls;
    qkv_step_end(ctx);
    if (qkv_error(ctx)) return false;
    qkv_optim_options o = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    o.lr = 0.05;
    g->opt = qkv_optim_new(ctx, &o, g->ps, g->n_ps);
    return g->opt != NULL;
}

static qkv_status norms_step(void *net, int64_t batch, uint64_t seed, counting *c, long *calls_before_end) {
    norms *g = net;
    qkv_ctx *ctx = g->ctx;
    qkv_tensor *ids = qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){batch, N});
    qkv_tensor *targets = qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){batch, N});
    if (ids && targets)
        for (int64_t i = 0; i < batch * N; i++) {
            qkv_i32(ids)[i] = (int32_t)((i * 3 + (int64_t)seed) % BV); /* repeated ids */
            qkv_i32(targets)[i] = (int32_t)((i * 5 + (int64_t)seed) % BV);
        }
    // X = table[ids], H = gelu_tanh(layer_norm(X)), G = gelu_erf(rms_norm(H)), L = cross_entropy(G Wo + bo)
    qkv_tensor *x = qkv_embedding(ctx, g->ps[0], ids);
    qkv_tensor *h = qkv_gelu(ctx, qkv_layer_norm(ctx, x, g->ps[1], g->ps[2], 1e-5), QKV_GELU_TANH);
    qkv_tensor *gg = qkv_gelu(ctx, qkv_rms_norm(ctx, h, g->ps[3], 1e-6), QKV_GELU_ERF);
    qkv_tensor *loss = qkv_cross_entropy(ctx, qkv_projection(ctx, gg, g->ps[4], g->ps[5]), targets);
    qkv_status st = qkv_backward(ctx, loss, NULL);
    if (st != QKV_OK) return st;
    qkv_clip_grad_norm(ctx, g->ps, g->n_ps, 1.0);
    if (qkv_optim_step(g->opt) != QKV_OK || qkv_optim_zero_grad(g->opt) != QKV_OK) return qkv_error(ctx);
    if (calls_before_end) *calls_before_end = c->calls;
    qkv_step_end(ctx);
    return qkv_error(ctx);
}

static qkv_optimizer *norms_optimizer(void *net) { return ((norms *)net)->opt; }
static const fault_net norms_fault_net = {"norms graph", norms_open, norms_setup, norms_step, norms_close,
                                          norms_optimizer, 200, 5, true, 20};

static void norms_faults(qkv_dtype dt) {
    norms g;
    sweep_faults(&norms_fault_net, &g, dt);
}

Test(faults, norms_graph_f32_every_allocation_fails_in_turn) { norms_faults(QKV_F32); }
Test(faults, norms_graph_f64_every_allocation_fails_in_turn) { norms_faults(QKV_F64); }

/* y = op(x) with x [2, 3, 4] holding a NaN at [1, 2, 1] (flat 21), then L = sum(y * R). */
static void nan_input_stops_at(const char *op_name, int op) {
    for (int dt = QKV_F32; dt <= QKV_F64; dt++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *x = pattern(ctx, (qkv_dtype)dt, 3, (int64_t[]){2, 3, 4}, 51, true);
        qkv_tensor *gamma = pattern(ctx, (qkv_dtype)dt, 1, (int64_t[]){4}, 52, true);
        qkv_tensor *r = pattern(ctx, (qkv_dtype)dt, 3, (int64_t[]){2, 3, 4}, 53, false);
        cr_assert_eq(qkv_set_flat(ctx, x, 21, NAN), QKV_OK);
        qkv_tensor *y = op == 0   ? qkv_gelu(ctx, x, QKV_GELU_ERF)
                        : op == 1 ? qkv_gelu(ctx, x, QKV_GELU_TANH)
                        : op == 2 ? qkv_layer_norm(ctx, x, gamma, NULL, 1e-5)
                                  : qkv_rms_norm(ctx, x, gamma, 1e-5);
        qkv_tensor *loss = qkv_sum(ctx, qkv_mul(ctx, y, r));
        cr_assert_not_null(loss, "%s", qkv_errmsg(ctx));
        qkv_set_anomaly_mode(ctx, true);
        cr_expect_eq(qkv_backward(ctx, loss, NULL), QKV_ERR_NUMERIC, "%s", qkv_errmsg(ctx));
        anomaly a = verify_anomaly(ctx, loss);
        cr_expect_str_eq(a.op, op_name);
        cr_expect_eq(a.input, 0);
        cr_expect_str_eq(a.shape, "[2,3,4]");
        /* GELU: the NaN element itself; a norm: the NaN's row (the mean and rstd of row [1, 2] are NaN) */
        cr_expect_eq(a.index, op < 2 ? 21 : 20, "%s: index %lld", op_name, a.index);
        qkv_ctx_free(ctx);
    }
}

Test(anomaly, a_nan_input_stops_at_qkv_gelu_erf) { nan_input_stops_at("qkv_gelu", 0); }
Test(anomaly, a_nan_input_stops_at_qkv_gelu_tanh) { nan_input_stops_at("qkv_gelu", 1); }
Test(anomaly, a_nan_input_stops_at_qkv_layer_norm) { nan_input_stops_at("qkv_layer_norm", 2); }
Test(anomaly, a_nan_input_stops_at_qkv_rms_norm) { nan_input_stops_at("qkv_rms_norm", 3); }

/* The embedding's backward does not read the table (dtable is a scatter of dy), so a NaN in the table
 * stops the backward at the operator after it; a NaN reaching the embedding's output gradient stops it
 * at qkv_embedding, with the row of the id at that position. */
/* table [5, 3] (requires grad) and ids [4] = {4, 2, 2, 0} */
static qkv_tensor *nan_table_and_ids(qkv_ctx *ctx, qkv_dtype dt, qkv_tensor **ids) {
    qkv_tensor *table = pattern(ctx, dt, 2, (int64_t[]){5, 3}, 61, true);
    *ids = qkv_zeros(ctx, QKV_I32, 1, (int64_t[]){4});
    cr_assert_not_null(*ids);
    const int32_t idv[4] = {4, 2, 2, 0};
    memcpy(qkv_i32(*ids), idv, sizeof idv);
    return table;
}

Test(anomaly, a_nan_table_row_stops_after_the_embedding_and_a_nan_gradient_at_it) {
    for (int dt = QKV_F32; dt <= QKV_F64; dt++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *ids, *table = nan_table_and_ids(ctx, (qkv_dtype)dt, &ids);
        cr_assert_eq(qkv_set_flat(ctx, table, 2 * 3 + 1, NAN), QKV_OK); // table[2, 1] = NaN
        qkv_tensor *y = qkv_embedding(ctx, table, ids);
        qkv_tensor *loss = qkv_sum(ctx, qkv_mul(ctx, y, y));
        qkv_set_anomaly_mode(ctx, true);
        cr_expect_eq(qkv_backward(ctx, loss, NULL), QKV_ERR_NUMERIC, "%s", qkv_errmsg(ctx));
        anomaly a = verify_anomaly(ctx, loss);
        cr_expect_str_eq(a.op, "qkv_mul");
        cr_expect_str_eq(a.shape, "[4,3]");
        cr_expect_eq(a.index, 4, "y[1, 1] (id 2) is the first NaN");
        qkv_ctx_free(ctx);

        /* the embedding's own output as the loss, with a NaN in the upstream gradient at y[2, 0] */
        ctx = qkv_ctx_new(NULL);
        table = nan_table_and_ids(ctx, (qkv_dtype)dt, &ids);
        y = qkv_embedding(ctx, table, ids);
        qkv_tensor *dy = pattern(ctx, (qkv_dtype)dt, 2, (int64_t[]){4, 3}, 62, false);
        cr_assert_eq(qkv_set_flat(ctx, dy, 2 * 3 + 0, NAN), QKV_OK);
        qkv_set_anomaly_mode(ctx, true);
        cr_expect_eq(qkv_backward(ctx, y, dy), QKV_ERR_NUMERIC, "%s", qkv_errmsg(ctx));
        a = verify_anomaly(ctx, y);
        cr_expect_str_eq(a.op, "qkv_embedding");
        cr_expect_str_eq(a.shape, "[5,3]");
        cr_expect_eq(a.index, 2 * 3 + 0, "dtable[2, 0] (position 2 has id 2)");
        qkv_ctx_free(ctx);
    }
}
