/*
 * variant_runs.h — what the tests of qkv_attention_ex's options share (tests/test_attention_variants.c,
 * test_attention_softcap.c, test_attention_gqa.c): a variant's per-head parameter, the options of one
 * configuration of fused_cases.h, a forward and backward run (fused, composed, ...) and fused against composed over
 * a list of configurations, the f64 gradcheck table of a variant over a list of configurations, and the
 * check of one PyTorch golden case (tests/data/variants, tests/tools/make_golden_variants.py).
 */
#ifndef QKV_TESTS_VARIANT_RUNS_H
#define QKV_TESTS_VARIANT_RUNS_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>

#include "../ops/kernels/attention_kernels.h"
#include "fused_cases.h"
#include "qkv.h"
#include "qkv_internal.h"
#include "test_ops.h"

/* Heads for a configuration whose K and V rows are q's (no grouping): 2 when the batch is even, else 1. */
static inline int variant_heads_of(const cfg *c) { return c->batch % 2 == 0 ? 2 : 1; }

/* The per-head parameter of a variant, [heads]: sink logits around 0, SSMax factors in [0.3, 1.3); NULL for a
 * variant without one. */
static inline qkv_tensor *variant_param(qkv_ctx *ctx, qkv_dtype dt, qkv_attn_variant variant, int heads) {
    if (variant != QKV_ATTN_SINK && variant != QKV_ATTN_SSMAX) return NULL;
    qkv_tensor *p = qkv_zeros(ctx, dt, 1, (int64_t[]){heads});
    for (int h = 0; h < heads; h++)
        qkv_set_flat(ctx, p, h, variant == QKV_ATTN_SINK ? 2.0 * urand() - 1.0 : 0.3 + urand());
    return p;
}

/* The options of configuration c: the variant, its parameter, heads, kv_heads (0: none) and softcap (0: off). */
static inline qkv_attention_options variant_options(const cfg *c, qkv_attn_variant variant, int heads,
                                                    const qkv_tensor *mask, qkv_tensor *param, int kv_heads,
                                                    double cap) {
    qkv_attention_options o = qkv_attention_default_options();
    o.variant = variant;
    o.scale = c->scale;
    o.flags = c->causal ? QKV_CAUSAL : 0;
    o.mask = mask;
    o.heads = heads;
    o.kv_heads = kv_heads;
    if (variant == QKV_ATTN_SINK) o.sink = param;
    if (variant == QKV_ATTN_SSMAX) o.ssmax_c = param;
    o.softcap = cap;
    return o;
}

/* ---- f64 gradcheck of qkv_attention_ex over a table of configurations ---------------------------------- */

typedef struct variant_gc {
    const cfg *configs;
    int n_configs;
    uint64_t lcg_seed;        /* configuration i draws its mask and parameter from lcg_state = lcg_seed + i */
    qkv_attn_variant variant;
    int heads;                /* 0: variant_heads_of(c) */
    int kv_heads;             /* 0: no grouping (k and v with q's batch), else B / heads * kv_heads rows */
    double cap;               /* options.softcap */
    /* the configuration being checked */
    const cfg *c;
    const qkv_tensor *mask;
    int c_heads;
} variant_gc;

static inline qkv_tensor *variant_gc_attend(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    const variant_gc *g = user;
    qkv_attention_options o = variant_options(g->c, g->variant, g->c_heads, g->mask, n > 3 ? in[3] : NULL,
                                              g->kv_heads, g->cap);
    return qkv_attention_ex(ctx, in[0], in[1], in[2], &o, NULL);
}

static inline int variant_gc_build(qkv_ctx *ctx, int i, void *user, qkv_tensor **in, void **fn_user) {
    (void)fn_user;
    variant_gc *g = user;
    const cfg *c = &g->configs[i];
    lcg_state = g->lcg_seed + (uint64_t)i;
    g->c = c;
    g->mask = make_mask(ctx, c);
    g->c_heads = g->heads > 0 ? g->heads : variant_heads_of(c);
    int64_t kv_batch = g->kv_heads > 0 ? c->batch / g->c_heads * g->kv_heads : c->batch;
    in[0] = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){c->batch, c->n_q, c->d_k}, 0, c->spread);
    in[1] = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){kv_batch, c->n_k, c->d_k}, 0, c->spread);
    in[2] = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){kv_batch, c->n_k, c->d_v}, 0, 1);
    in[3] = variant_param(ctx, QKV_F64, g->variant, g->c_heads);
    return in[3] ? 4 : 3;
}

static inline void variant_gc_name(char *buf, size_t size, int i, const void *user) {
    const variant_gc *g = user;
    char d[160];
    describe(&g->configs[i], d, sizeof d);
    snprintf(buf, size, "%s kv_heads %d softcap %g config %d (%s)", qkv_attn_variant_name(g->variant), g->kv_heads,
             g->cap, i, d);
}

/* qkv_gradcheck of every configuration of g (seed: the contexts' seed base), expecting more than min_checked
 * elements checked. */
static inline void variant_gradcheck(variant_gc *g, uint64_t seed, int64_t min_checked) {
    gradcheck_table t = {g->n_configs, seed, variant_gc_build, variant_gc_name, variant_gc_attend, g, NULL};
    check_gradcheck_table(&t, min_checked);
}

/* ---- PyTorch 1.13 golden values ------------------------------------------------------------------- */

static inline qkv_tensor *golden_load(qkv_ctx *ctx, const char *case_name, const char *what) {
    char path[512];
    snprintf(path, sizeof path, "%s/variants/%s_%s.npy", QKV_TEST_DATA, case_name, what);
    return qkv_npy_load(ctx, path);
}

static inline double max_abs_diff(const qkv_tensor *a, const qkv_tensor *b) {
    cr_assert_eq(a->numel, b->numel);
    double w = 0;
    for (int64_t i = 0; i < a->numel; i++) w = fmax(w, fabs(val(a, i) - val(b, i)));
    return w;
}

/* Golden case `name` (make_golden_variants.py: 2 heads; kind 0 plain, 1 masked, 2 causal, whose C call passes
 * QKV_CAUSAL and not the mask PyTorch used) through qkv_attention_ex with the variant and cap: out and the
 * gradients of q, k, v and the parameter within 1e-10 of PyTorch's. Returns how many tensors were checked. */
static inline int check_golden_case(const char *name, qkv_attn_variant variant, int kind, double cap) {
    int checked = 0;
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *q = golden_load(ctx, name, "q"), *k = golden_load(ctx, name, "k"), *vv = golden_load(ctx, name, "v");
    qkv_tensor *mask = golden_load(ctx, name, "mask"), *r = golden_load(ctx, name, "r");
    cr_assert(q && k && vv && mask && r, "%s: %s", name, qkv_errmsg(ctx));
    qkv_tensor *param = NULL;
    if (variant == QKV_ATTN_SINK || variant == QKV_ATTN_SSMAX) {
        param = golden_load(ctx, name, "param");
        cr_assert_not_null(param, "%s: %s", name, qkv_errmsg(ctx));
        qkv_set_requires_grad(ctx, param, true);
    }
    qkv_set_requires_grad(ctx, q, true);
    qkv_set_requires_grad(ctx, k, true);
    qkv_set_requires_grad(ctx, vv, true);
    qkv_attention_options o = qkv_attention_default_options();
    o.variant = variant;
    o.mask = kind == 1 ? mask : NULL;
    o.flags = kind == 2 ? QKV_CAUSAL : 0;
    o.heads = 2;
    o.sink = o.ssmax_c = param;
    o.softcap = cap;
    qkv_tensor *out = qkv_attention_ex(ctx, q, k, vv, &o, NULL);
    cr_assert_not_null(out, "%s: %s", name, qkv_errmsg(ctx));
    qkv_backward(ctx, out, r);
    cr_assert_eq(qkv_error(ctx), QKV_OK, "%s: %s", name, qkv_errmsg(ctx));
    const qkv_tensor *got[5] = {out, q->grad, k->grad, vv->grad, param ? param->grad : NULL};
    const char *want[5] = {"out", "dq", "dk", "dv", "dparam"};
    for (int i = 0; i < 5; i++) {
        if (!got[i]) continue;
        qkv_tensor *w = golden_load(ctx, name, want[i]);
        cr_assert_not_null(w, "%s_%s: %s", name, want[i], qkv_errmsg(ctx));
        double d = max_abs_diff(got[i], w);
        cr_expect(d <= 1e-10, "%s %s: %.3g from PyTorch", name, want[i], d);
        checked++;
    }
    qkv_ctx_free(ctx);
    return checked;
}

/* A run: the run of fused_cases.h and the variant's parameter (sink or ssmax_c), NULL when it has none. */
typedef struct vrun {
    run r;
    qkv_tensor *param;
} vrun;

/* How variant_run attends: the fused kernel; qkv_attention_composed_ex_; the softmax case written here from the public
 * operators, softmax(qkv_softcap(scale q k^T), mask, flags) v; the fused kernel with NaN and inf in the K and V
 * rows of batch element 1's last 4 keys (padding under M_PAD). */
enum { VARIANT_FUSED, VARIANT_COMPOSED, VARIANT_OPERATORS, VARIANT_POISONED };

/* Forward and backward (dloss random) of one configuration in a fresh context seeded with seed; the mask and the
 * variant's parameter depend on the seed only, so runs of one seed attend the same inputs. cap 0: no soft-cap. */
static inline vrun variant_run(const cfg *c, qkv_dtype dt, qkv_attn_variant variant, int how, int threads, uint64_t seed,
                               double cap) {
    qkv_options opt = qkv_default_options();
    opt.seed = seed;
    opt.threads = threads;
    vrun vr = {{qkv_ctx_new(&opt), NULL, NULL, NULL, NULL, NULL}, NULL};
    run *r = &vr.r;
    qkv_ctx *ctx = r->ctx;
    r->q = qkv_randn(ctx, dt, 3, (int64_t[]){c->batch, c->n_q, c->d_k}, 0, c->spread);
    r->k = qkv_randn(ctx, dt, 3, (int64_t[]){c->batch, c->n_k, c->d_k}, 0, c->spread);
    r->v = qkv_randn(ctx, dt, 3, (int64_t[]){c->batch, c->n_k, c->d_v}, 0, 1);
    qkv_tensor *dout = qkv_randn(ctx, dt, 3, (int64_t[]){c->batch, c->n_q, c->d_v}, 0, 1);
    uint64_t saved = lcg_state;
    lcg_state = seed * 7919u + 1;
    r->mask = make_mask(ctx, c);
    vr.param = variant_param(ctx, dt, variant, variant_heads_of(c));
    lcg_state = saved;
    if (how == VARIANT_POISONED)
        for (int64_t j = c->n_k - 4; j < c->n_k; j++) {
            for (int e = 0; e < c->d_k; e++) qkv_set_flat(ctx, r->k, (c->n_k + j) * c->d_k + e, e % 2 ? NAN : INFINITY);
            for (int e = 0; e < c->d_v; e++) qkv_set_flat(ctx, r->v, (c->n_k + j) * c->d_v + e, NAN);
        }
    qkv_set_requires_grad(ctx, r->q, true);
    qkv_set_requires_grad(ctx, r->k, true);
    qkv_set_requires_grad(ctx, r->v, true);
    if (vr.param) qkv_set_requires_grad(ctx, vr.param, true);
    qkv_attention_options o = variant_options(c, variant, variant_heads_of(c), r->mask, vr.param, 0, cap);
    if (how == VARIANT_COMPOSED) {
        r->out = qkv_attention_composed_ex_(ctx, "composed", r->q, r->k, r->v, &o, NULL);
    } else if (how == VARIANT_OPERATORS) {
        double scale = c->scale == QKV_SCALE_DEFAULT ? 1.0 / sqrt((double)c->d_k) : c->scale;
        qkv_tensor *x = qkv_softcap(ctx, qkv_scale(ctx, qkv_matmul(ctx, r->q, r->k, QKV_TRANS_B), scale), cap);
        r->out = qkv_matmul(ctx, qkv_softmax(ctx, x, r->mask, c->causal ? QKV_CAUSAL : 0), r->v, 0);
    } else {
        r->out = qkv_attention_ex(ctx, r->q, r->k, r->v, &o, NULL);
    }
    cr_assert_not_null(r->out, "%s: %s", qkv_attn_variant_name(variant), qkv_errmsg(ctx));
    qkv_backward(ctx, r->out, dout);
    cr_assert_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    return vr;
}

/* The worst norm-wise difference of out, dq, dk, dv and dparam. */
static inline double worst_vdiff(const vrun *a, const vrun *b) {
    double w = worst_diff(&a->r, &b->r);
    if (a->param) w = fmax(w, rel_diff(a->param->grad, b->param->grad, 1e-3));
    return w;
}

/* Fused against composed for one variant over configs[0 .. n-1] (soft-capped at cap, 0: none); returns the number
 * of configurations that differ by more than tol. */
static inline int variant_fused_vs_composed(const cfg *configs, int n, qkv_attn_variant variant, qkv_dtype dt,
                                            double tol, double cap) {
    int failed = 0;
    for (int i = 0; i < n; i++) {
        vrun f = variant_run(&configs[i], dt, variant, VARIANT_FUSED, 1, 700 + (uint64_t)i, cap);
        vrun c = variant_run(&configs[i], dt, variant, VARIANT_COMPOSED, 1, 700 + (uint64_t)i, cap);
        double w = worst_vdiff(&f, &c);
        if (!(w <= tol)) {
            char d[160];
            describe(&configs[i], d, sizeof d);
            if (failed++ < 5)
                cr_log_error("%s %s %s (kernels %s): fused differs from composed by %.3g", qkv_attn_variant_name(variant),
                             d, qkv_dtype_name(dt), qkv_attn_kernels_()->name, w);
        }
        qkv_ctx_free(f.r.ctx);
        qkv_ctx_free(c.r.ctx);
    }
    return failed;
}

#endif
