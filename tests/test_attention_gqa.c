/*
 * test_attention_gqa.c — grouped-query attention in the fused kernel (qkv_attention_options.kv_heads;
 * include/qkv/attention.h, ops/attention.c): q [B H, n_q, d], k and v [B H_kv, n_k, d], query row r reading
 * key/value row r / (H / H_kv), in place.
 *   - against the ungrouped kernel on k and v repeated by qkv_index_select (out, dq, dk, dv and the variant's
 *     parameter; f64 within 1e-12, f32 within 1e-5 norm-wise) for every variant, with and without the soft-cap,
 *     H = 4 over H_kv = 2 and 1 (multi-query), odd sizes, every mask layout, causal, several key tiles; and
 *     against qkv_attention_composed_ex_ (which repeats k and v itself);
 *   - qkv_gradcheck in f64 of every variant with H_kv = 2 and 1;
 *   - 1 and 2 or 3 threads give the same bits; attn (the weights) as the ungrouped call's; kv_heads = heads or
 *     0 is the ungrouped call, bit for bit; the misuse entries.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv_internal.h"
#include "test_ops.h"

#include "../ops/kernels/attention_kernels.h"
#include "fused_cases.h"
#include "test_deadline.h"
#include "variant_runs.h"

static const qkv_attn_variant VARIANTS[] = {QKV_ATTN_SOFTMAX, QKV_ATTN_SOFTMAX1, QKV_ATTN_SINK,
                                            QKV_ATTN_SIGMOID, QKV_ATTN_SSMAX,    QKV_ATTN_SOFTPICK};
#define N_VARIANTS ((int)(sizeof VARIANTS / sizeof VARIANTS[0]))
#define HEADS 4

/* How do_run attends: grouped in the kernel; the ungrouped kernel on k and v repeated by qkv_index_select; the
 * composed operators (qkv_attention_composed_ex_, grouped options). */
enum { GROUPED, REPEATED, COMPOSED };

typedef struct grun {
    run r;
    qkv_tensor *param;
    qkv_tensor *attn;
} grun;

static qkv_tensor *make_param(qkv_ctx *ctx, qkv_dtype dt, qkv_attn_variant variant) {
    return variant_param(ctx, dt, variant, HEADS);
}

static qkv_attention_options options_for(const cfg *c, qkv_attn_variant variant, const qkv_tensor *mask,
                                         qkv_tensor *param, int kv_heads, double cap) {
    return variant_options(c, variant, HEADS, mask, param, kv_heads, cap);
}

/* k or v [B H_kv, n, d] repeated to [B H, n, d]: row r from row r / (H / H_kv). */
static qkv_tensor *repeat_kv(qkv_ctx *ctx, qkv_tensor *t, int kv_heads) {
    int64_t rows = t->shape[0] / kv_heads * HEADS;
    qkv_tensor *idx = qkv_empty(ctx, QKV_I32, 1, (int64_t[]){rows});
    for (int64_t r = 0; r < rows; r++) qkv_i32(idx)[r] = (int32_t)(r / (HEADS / kv_heads));
    return qkv_index_select(ctx, t, 0, idx);
}

/* Forward and backward (dloss random) of one configuration (c->batch is q's batch, a multiple of HEADS). */
static grun do_run(const cfg *c, qkv_dtype dt, qkv_attn_variant variant, int how, int kv_heads, double cap,
                   int threads, uint64_t seed) {
    qkv_options opt = qkv_default_options();
    opt.seed = seed;
    opt.threads = threads;
    grun g = {{qkv_ctx_new(&opt), NULL, NULL, NULL, NULL, NULL}, NULL, NULL};
    run *r = &g.r;
    qkv_ctx *ctx = r->ctx;
    int64_t kv_batch = c->batch / HEADS * kv_heads;
    r->q = qkv_randn(ctx, dt, 3, (int64_t[]){c->batch, c->n_q, c->d_k}, 0, c->spread);
    r->k = qkv_randn(ctx, dt, 3, (int64_t[]){kv_batch, c->n_k, c->d_k}, 0, c->spread);
    r->v = qkv_randn(ctx, dt, 3, (int64_t[]){kv_batch, c->n_k, c->d_v}, 0, 1);
    qkv_tensor *dout = qkv_randn(ctx, dt, 3, (int64_t[]){c->batch, c->n_q, c->d_v}, 0, 1);
    uint64_t saved = lcg_state;
    lcg_state = seed * 7919u + 1;
    r->mask = make_mask(ctx, c);
    g.param = make_param(ctx, dt, variant);
    lcg_state = saved;
    qkv_set_requires_grad(ctx, r->q, true);
    qkv_set_requires_grad(ctx, r->k, true);
    qkv_set_requires_grad(ctx, r->v, true);
    if (g.param) qkv_set_requires_grad(ctx, g.param, true);
    if (how == REPEATED) {
        qkv_attention_options o = options_for(c, variant, r->mask, g.param, 0, cap);
        r->out = qkv_attention_ex(ctx, r->q, repeat_kv(ctx, r->k, kv_heads), repeat_kv(ctx, r->v, kv_heads), &o, &g.attn);
    } else {
        qkv_attention_options o = options_for(c, variant, r->mask, g.param, kv_heads, cap);
        r->out = how == COMPOSED ? qkv_attention_composed_ex_(ctx, "composed", r->q, r->k, r->v, &o, &g.attn)
                                 : qkv_attention_ex(ctx, r->q, r->k, r->v, &o, &g.attn);
    }
    cr_assert_not_null(r->out, "%s: %s", qkv_attn_variant_name(variant), qkv_errmsg(ctx));
    qkv_backward(ctx, r->out, dout);
    cr_assert_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    return g;
}

static double worst_gdiff(const grun *a, const grun *b) {
    double w = worst_diff(&a->r, &b->r);
    if (a->param) w = fmax(w, rel_diff(a->param->grad, b->param->grad, 1e-3));
    return fmax(w, rel_diff(a->attn, b->attn, 1e-3));
}

/* q batches of 4 heads (one or several sequences), odd sizes, every mask layout, causal, several key tiles of the
 * forward (256 keys) and backward (128), decoding rows. */
static const cfg CONFIGS[] = {
    {4, 1, 1, 3, 2, M_NONE, false, QKV_SCALE_DEFAULT, 1},      {8, 3, 3, 1, 3, M_NONE, true, QKV_SCALE_DEFAULT, 1},
    {4, 7, 5, 3, 4, M_2D, false, QKV_SCALE_DEFAULT, 1},        {8, 7, 7, 16, 16, M_PAD, true, QKV_SCALE_DEFAULT, 1},
    {8, 33, 33, 16, 8, M_FULL, false, QKV_SCALE_DEFAULT, 1.5}, {4, 33, 7, 3, 64, M_BM1, false, QKV_SCALE_DEFAULT, 1},
    {4, 7, 33, 64, 3, M_PAD_BM1, false, QKV_SCALE_DEFAULT, 1}, {4, 33, 40, 5, 5, M_LATE, true, QKV_SCALE_DEFAULT, 1},
    {8, 130, 130, 16, 16, M_NONE, true, QKV_SCALE_DEFAULT, 1}, {4, 70, 300, 8, 8, M_LATE, false, 0.7, 1},
    {4, 1, 257, 32, 32, M_NONE, false, QKV_SCALE_DEFAULT, 1},  {4, 16, 16, 16, 16, M_NONE, false, QKV_SCALE_DEFAULT, 1},
};
#define N_CONFIGS ((int)(sizeof CONFIGS / sizeof CONFIGS[0]))

static int grouped_vs(int how, qkv_attn_variant variant, qkv_dtype dt, double tol) {
    int failed = 0;
    for (int i = 0; i < N_CONFIGS; i++)
        for (int kv = 1; kv <= 2; kv++)
            for (int capped = 0; capped < 2; capped++) {
                double cap = capped ? 1.5 : 0.0;
                uint64_t seed = 300 + (uint64_t)i;
                grun a = do_run(&CONFIGS[i], dt, variant, GROUPED, kv, cap, 1, seed);
                grun b = do_run(&CONFIGS[i], dt, variant, how, kv, cap, 1, seed);
                double w = worst_gdiff(&a, &b);
                if (!(w <= tol)) {
                    char d[160];
                    describe(&CONFIGS[i], d, sizeof d);
                    if (failed++ < 5)
                        cr_log_error("%s %s %s kv_heads %d softcap %g: grouped differs from %s by %.3g",
                                     qkv_attn_variant_name(variant), d, qkv_dtype_name(dt), kv, cap,
                                     how == REPEATED ? "repeated" : "composed", w);
                }
                qkv_ctx_free(a.r.ctx);
                qkv_ctx_free(b.r.ctx);
            }
    return failed;
}

Test(gqa, matches_the_repeated_heads_in_f64) {
    QKV_TEST_DEADLINE(600);
    for (int v = 0; v < N_VARIANTS; v++)
        cr_expect_eq(grouped_vs(REPEATED, VARIANTS[v], QKV_F64, 1e-12), 0, "%s", qkv_attn_variant_name(VARIANTS[v]));
}

Test(gqa, matches_the_repeated_heads_in_f32_with_every_kernel_set) {
    QKV_TEST_DEADLINE(600);
    int sets = 0;
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++) {
        if (!qkv_attn_force_isa_(isa)) continue;
        sets++;
        for (int v = 0; v < N_VARIANTS; v++)
            cr_expect_eq(grouped_vs(REPEATED, VARIANTS[v], QKV_F32, 1e-5), 0, "%s with %s",
                         qkv_attn_variant_name(VARIANTS[v]), qkv_isa_name_((qkv_isa_)isa));
    }
    qkv_attn_force_isa_(-1);
    cr_expect_geq(sets, 1);
}

Test(gqa, matches_the_composed_operators_in_f64) {
    QKV_TEST_DEADLINE(600);
    for (int v = 0; v < N_VARIANTS; v++)
        cr_expect_eq(grouped_vs(COMPOSED, VARIANTS[v], QKV_F64, 1e-12), 0, "%s", qkv_attn_variant_name(VARIANTS[v]));
}

/* ---- gradcheck in f64 ---------------------------------------------------------------------------- */

static const cfg GC_CONFIGS[] = {
    {4, 1, 1, 2, 2, M_NONE, false, QKV_SCALE_DEFAULT, 1}, {4, 3, 3, 2, 2, M_NONE, true, QKV_SCALE_DEFAULT, 1},
    {4, 3, 7, 3, 2, M_2D, false, QKV_SCALE_DEFAULT, 1},   {8, 4, 5, 2, 2, M_PAD, true, QKV_SCALE_DEFAULT, 1},
    {4, 5, 5, 2, 2, M_FULL, false, QKV_SCALE_DEFAULT, 1.5}, {4, 2, 270, 1, 1, M_LATE, false, QKV_SCALE_DEFAULT, 2},
};
#define N_GC ((int)(sizeof GC_CONFIGS / sizeof GC_CONFIGS[0]))

static void gradcheck_variant(qkv_attn_variant variant) {
    for (int kv_heads = 1; kv_heads <= 2; kv_heads++) {
        variant_gc g = {GC_CONFIGS, N_GC, 71, variant, HEADS, kv_heads, 0.0, NULL, NULL, 0};
        variant_gradcheck(&g, 970, 500);
    }
}

Test(gqa, gradcheck_softmax) { gradcheck_variant(QKV_ATTN_SOFTMAX); }
Test(gqa, gradcheck_softmax1) { gradcheck_variant(QKV_ATTN_SOFTMAX1); }
Test(gqa, gradcheck_sink) { gradcheck_variant(QKV_ATTN_SINK); }
Test(gqa, gradcheck_sigmoid) { gradcheck_variant(QKV_ATTN_SIGMOID); }
Test(gqa, gradcheck_ssmax) { gradcheck_variant(QKV_ATTN_SSMAX); }
Test(gqa, gradcheck_softpick) { gradcheck_variant(QKV_ATTN_SOFTPICK); }

/* ---- guarantees ------------------------------------------------------------------------------------ */

Test(gqa, one_and_several_threads_give_the_same_bits) {
    const cfg cs[] = {{8, 130, 130, 16, 16, M_NONE, true, QKV_SCALE_DEFAULT, 1},
                      {4, 65, 530, 16, 8, M_PAD, false, QKV_SCALE_DEFAULT, 1},
                      {12, 200, 200, 32, 32, M_LATE, false, QKV_SCALE_DEFAULT, 1}};
    int differ = 0;
    for (int v = 0; v < N_VARIANTS; v++)
        for (int dt = 0; dt < 2; dt++)
            for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
                for (int kv = 1; kv <= 2; kv++) {
                    qkv_dtype t = dt ? QKV_F64 : QKV_F32;
                    double cap = v % 2 ? 2.0 : 0.0;
                    grun a = do_run(&cs[i], t, VARIANTS[v], GROUPED, kv, cap, 1, 41);
                    grun b = do_run(&cs[i], t, VARIANTS[v], GROUPED, kv, cap, 2 + (int)(i % 2), 41);
                    bool same = same_bits(a.r.out, b.r.out) && same_bits(a.r.q->grad, b.r.q->grad) &&
                                same_bits(a.r.k->grad, b.r.k->grad) && same_bits(a.r.v->grad, b.r.v->grad) &&
                                (!a.param || same_bits(a.param->grad, b.param->grad));
                    if (!same && differ++ < 5)
                        cr_log_error("%s %s config %zu kv_heads %d: 1 and 2-3 threads differ",
                                     qkv_attn_variant_name(VARIANTS[v]), qkv_dtype_name(t), i, kv);
                    qkv_ctx_free(a.r.ctx);
                    qkv_ctx_free(b.r.ctx);
                }
    cr_expect_eq(differ, 0);
}

/* kv_heads = heads (and 0) is the ungrouped call, bit for bit. */
Test(gqa, kv_heads_equal_to_heads_is_no_grouping) {
    const cfg c = {8, 33, 40, 8, 8, M_FULL, true, QKV_SCALE_DEFAULT, 1};
    for (int v = 0; v < N_VARIANTS; v++) {
        grun a = do_run(&c, QKV_F32, VARIANTS[v], GROUPED, HEADS, 0.0, 1, 5);
        qkv_ctx *ctx = a.r.ctx;
        qkv_attention_options o = options_for(&c, VARIANTS[v], a.r.mask, a.param, 0, 0.0);
        qkv_tensor *out = qkv_attention_ex(ctx, a.r.q, a.r.k, a.r.v, &o, NULL);
        cr_assert_not_null(out, "%s", qkv_errmsg(ctx));
        cr_expect(same_bits(out, a.r.out), "%s", qkv_attn_variant_name(VARIANTS[v]));
        qkv_ctx_free(ctx);
    }
}

Test(gqa, misuse_names_the_function_and_the_shapes) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *q = qkv_zeros(ctx, QKV_F32, 3, (int64_t[]){8, 3, 2});
    qkv_tensor *k2 = qkv_zeros(ctx, QKV_F32, 3, (int64_t[]){4, 5, 2}), *v2 = qkv_zeros(ctx, QKV_F32, 3, (int64_t[]){4, 5, 2});
    qkv_tensor *k8 = qkv_zeros(ctx, QKV_F32, 3, (int64_t[]){8, 5, 2}), *v3 = qkv_zeros(ctx, QKV_F32, 3, (int64_t[]){3, 5, 2});
    qkv_tensor *q2d = qkv_zeros(ctx, QKV_F32, 2, (int64_t[]){3, 2}), *k2d = qkv_zeros(ctx, QKV_F32, 2, (int64_t[]){5, 2});
    const struct {
        qkv_tensor *q, *k, *v;
        int heads, kv_heads;
        const char *frag;
    } cases[] = {
        {q, k2, v2, 4, 3, "kv_heads 3 does not divide heads 4"},
        {q, k2, v2, 4, -1, "kv_heads -1 does not divide heads 4"},
        {q, k2, v2, 4, 8, "kv_heads 8 does not divide heads 4"},
        {q, k8, k8, 4, 2, "need batch B / heads * kv_heads = 4"},
        {q, k2, v3, 4, 2, "v is [3,5,2]"},
        {q, k2, v2, 3, 1, "heads 3 does not divide the batch 8"},
        {q2d, k2d, k2d, 2, 1, "heads 2 does not divide the batch 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qkv_clear_error(ctx);
        qkv_attention_options o = qkv_attention_default_options();
        o.heads = cases[i].heads;
        o.kv_heads = cases[i].kv_heads;
        cr_expect_null(qkv_attention_ex(ctx, cases[i].q, cases[i].k, cases[i].v, &o, NULL), "case %zu", i);
        cr_expect_eq(qkv_error(ctx), QKV_ERR_SHAPE, "case %zu: %s", i, qkv_errmsg(ctx));
        const char *msg = qkv_errmsg(ctx);
        cr_expect(strstr(msg, "qkv_attention_ex") && strstr(msg, QKV_SHAPE(cases[i].q)) && strstr(msg, cases[i].frag),
                  "case %zu: %s", i, msg);
    }
    cr_expect_eq(qkv_attention_default_options().kv_heads, 0);
    qkv_ctx_free(ctx);
}
