/*
 * test_fused.c — the fused attention (qkv_attention with attn == NULL, ops/attention.c) and the f32
 * softmax/attention row kernels (ops/kernels/attention_*.c):
 *   - fused against composed (attn != NULL: matmul, scale, softmax, matmul) in f32, forward and all three
 *     gradients within 1e-5 relative (norm-wise), over odd sizes (n 1, 7, 33, 65, 130 and longer rows that
 *     cross several key tiles; d 1, 3, 16, 64; batch 1-3), every mask kind with fully masked rows, causal,
 *     non-square; and again with each kernel set this CPU has forced;
 *   - the short-sequence kernels (n_k, d_k, d_v <= 16, no mask) against composed and against the tiled path,
 *     across threads and for every subset of wanted gradients;
 *   - exact zeros for fully masked rows (output and dq), a NaN in a dropped key never read; an inf or NaN
 *     in the K or V row of a dropped key reaches neither out nor dq of the queries that drop it;
 *   - qkv_gradcheck of the fused path in f64 over >= 20 configurations;
 *   - 1 and 2 threads give the same bits; q, k, v passed as one tensor;
 *   - the softmax row kernels of every ISA against a double oracle on odd lengths, masks, saturated rows
 *     (no subnormal output, exact 0 below FLT_MIN), NaN at dropped positions;
 *   - peak memory of a fused forward + backward far below one n x n matrix; errors of the fused path.
 * QKV_FUSED_VERBOSE=1 in the environment prints each configuration's fused-vs-composed difference.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv_internal.h"
#include "test_ops.h"

#include "../ops/kernels/attention_kernels.h"
#include "fused_cases.h"

/* ---- helpers ------------------------------------------------------------------------------------- */

/* Forward and backward (dloss random) of one configuration in a fresh context seeded with seed. */
static run do_run(const cfg *c, qkv_dtype dt, bool fused, int threads, uint64_t seed) {
    qkv_options o = qkv_default_options();
    o.seed = seed;
    o.threads = threads;
    run r = {qkv_ctx_new(&o), NULL, NULL, NULL, NULL, NULL};
    qkv_ctx *ctx = r.ctx;
    r.q = qkv_randn(ctx, dt, 3, (int64_t[]){c->batch, c->n_q, c->d_k}, 0, c->spread);
    r.k = qkv_randn(ctx, dt, 3, (int64_t[]){c->batch, c->n_k, c->d_k}, 0, c->spread);
    r.v = qkv_randn(ctx, dt, 3, (int64_t[]){c->batch, c->n_k, c->d_v}, 0, 1);
    qkv_tensor *dout = qkv_randn(ctx, dt, 3, (int64_t[]){c->batch, c->n_q, c->d_v}, 0, 1);
    uint64_t saved = lcg_state;
    lcg_state = seed * 7919u + 1; /* the same mask in every run of this seed */
    r.mask = make_mask(ctx, c);
    lcg_state = saved;
    qkv_set_requires_grad(ctx, r.q, true);
    qkv_set_requires_grad(ctx, r.k, true);
    qkv_set_requires_grad(ctx, r.v, true);
    qkv_tensor *attn = NULL;
    r.out = fused ? qkv_attention(ctx, r.q, r.k, r.v, r.mask, c->scale, c->causal ? QKV_CAUSAL : 0, NULL)
                  : qkv_attention_composed_(ctx, "composed", r.q, r.k, r.v, r.mask, c->scale,
                                            c->causal ? QKV_CAUSAL : 0, &attn);
    qkv_backward(ctx, r.out, dout);
    cr_assert_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_assert(fused ? attn == NULL : attn != NULL);
    return r;
}

/* The odd-size configurations: n 1, 7, 33, 65, 130 against d 1, 3, 16, 64, every mask kind, causal every
 * other one, batch 1-3, a third of them non-square; then rows long enough to cross several key tiles of
 * the forward (256 keys) and the backward (128 keys and 128 queries). */
static int make_configs(cfg *out, int cap) {
    const int ns[5] = {1, 7, 33, 65, 130}, ds[4] = {1, 3, 16, 64};
    int count = 0;
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 4; j++) {
            int idx = i * 4 + j;
            cfg c = {1 + idx % 3, ns[i], ns[i], ds[j], ds[(j + 1) % 4], idx % M_KINDS, idx % 2 == 1, QKV_SCALE_DEFAULT, 1};
            if (idx % 3 == 2) c.n_k = ns[(i + 2) % 5]; /* non-square */
            if (c.mask == M_PAD && c.batch < 3) c.batch = 3;
            if (count < cap) out[count++] = c;
        }
    const cfg longer[] = {
        {2, 70, 600, 16, 8, M_NONE, false, QKV_SCALE_DEFAULT, 1},   {1, 300, 300, 8, 8, M_NONE, true, QKV_SCALE_DEFAULT, 1},
        {2, 40, 520, 4, 5, M_LATE, false, QKV_SCALE_DEFAULT, 1},    {3, 33, 530, 3, 3, M_PAD, false, QKV_SCALE_DEFAULT, 1},
        {1, 260, 270, 16, 16, M_FULL, true, QKV_SCALE_DEFAULT, 1},  {2, 257, 129, 7, 9, M_BM1, false, 0.3, 1},
        {1, 129, 513, 2, 2, M_2D, true, QKV_SCALE_DEFAULT, 1},      {2, 65, 700, 64, 64, M_NONE, false, QKV_SCALE_DEFAULT, 3},
        {1, 7, 1000, 5, 3, M_PAD_BM1, false, 1.0, 2}, {1, 200, 200, 1, 1, M_LATE, true, QKV_SCALE_DEFAULT, 1},
        /* decoding: 1 .. 4 query rows take the few-row products (attention_kernels.h), 5 the GEMM */
        {3, 1, 600, 64, 64, M_NONE, false, QKV_SCALE_DEFAULT, 1},   {3, 3, 530, 70, 9, M_PAD, false, QKV_SCALE_DEFAULT, 2},
        {1, 4, 300, 5, 67, M_2D, true, QKV_SCALE_DEFAULT, 1},       {2, 2, 257, 16, 16, M_LATE, false, 0.7, 1},
        {2, 5, 129, 33, 31, M_BM1, false, QKV_SCALE_DEFAULT, 1},
        /* many queries, few keys: D = rowsum(dO * O) over d_v 64 and 67, dQ of a whole column strip */
        {1, 300, 16, 64, 64, M_NONE, false, QKV_SCALE_DEFAULT, 1},  {2, 200, 9, 12, 67, M_LATE, false, QKV_SCALE_DEFAULT, 1},
    };
    for (size_t i = 0; i < sizeof longer / sizeof longer[0]; i++)
        if (count < cap) out[count++] = longer[i];
    return count;
}

/* Fused against composed for every configuration; returns the number that failed. */
static int fused_vs_composed(qkv_dtype dtype, double tol, int *compared) {
    cfg cs[64];
    int n = make_configs(cs, 64), failed = 0;
    for (int i = 0; i < n; i++) {
        run f = do_run(&cs[i], dtype, true, 1, 500 + (uint64_t)i);
        run c = do_run(&cs[i], dtype, false, 1, 500 + (uint64_t)i);
        double w = worst_diff(&f, &c);
        if (getenv("QKV_FUSED_VERBOSE")) fprintf(stderr, "cfg %d %s: %.3g\n", i, qkv_attn_kernels_()->name, w);
        if (!(w <= tol)) {
            char d[160];
            describe(&cs[i], d, sizeof d);
            if (failed++ < 5) cr_log_error("%s %s (kernels %s): fused differs from composed by %.3g", d,
                                           qkv_dtype_name(dtype), qkv_attn_kernels_()->name, w);
        }
        qkv_ctx_free(f.ctx);
        qkv_ctx_free(c.ctx);
    }
    *compared = n;
    return failed;
}

/* ---- fused against composed ---------------------------------------------------------------------- */

Test(fused, matches_composed_in_f32_over_odd_sizes_and_masks) {
    int compared = 0;
    int failed = fused_vs_composed(QKV_F32, 1e-5, &compared);
    cr_expect_geq(compared, 30);
    cr_expect_eq(failed, 0, "%d of %d configurations off by more than 1e-5", failed, compared);
}

Test(fused, matches_composed_with_every_kernel_set_this_cpu_has) {
    int sets = 0;
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++) {
        if (!qkv_attn_force_isa_(isa)) continue; /* not compiled in, or not this CPU's */
        sets++;
        int compared = 0;
        int failed = fused_vs_composed(QKV_F32, 1e-5, &compared);
        cr_expect_eq(failed, 0, "kernels %s: %d of %d configurations off", qkv_isa_name_((qkv_isa_)isa), failed,
                     compared);
    }
    qkv_attn_force_isa_(-1);
    cr_expect_geq(sets, 1, "at least the portable set");
}

/* f64: each f32 set forced brings its f64 row kernels (ops/attention.c's f64_kernels: plain C, AVX2 or
 * AVX-512), each within 1e-12 of the composed operators over the same odd sizes, masks and causal cases. */
Test(fused, matches_composed_in_f64_with_every_kernel_set_this_cpu_has) {
    int sets = 0;
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++) {
        if (!qkv_attn_force_isa_(isa)) continue;
        sets++;
        int compared = 0;
        int failed = fused_vs_composed(QKV_F64, 1e-12, &compared);
        cr_expect_geq(compared, 30);
        cr_expect_eq(failed, 0, "kernels %s: %d of %d f64 configurations off", qkv_isa_name_((qkv_isa_)isa), failed,
                     compared);
    }
    qkv_attn_force_isa_(-1);
    cr_expect_geq(sets, 1, "at least the portable set");
    cr_expect(!qkv_attn_force_isa_(QKV_ISA_COUNT_), "an unknown ISA is refused");
}

/* P kept from the forward (the tiled path when the keys fit one forward tile and P is no larger than Q, K and
 * V) against P recomputed in the backward, on the same configurations, with every kernel set, f32 and f64:
 * out and the three gradients within 1e-5 (f32) and 1e-12 (f64) of each other, and different somewhere in
 * the last bits (P / l and exp(s S - L) round differently: the kept path was taken). */
Test(fused, a_kept_p_gives_what_a_recomputed_p_gives) {
    cfg cs[64];
    int n = make_configs(cs, 64), sets = 0;
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++) {
        if (!qkv_attn_force_isa_(isa)) continue;
        sets++;
        for (int dt = 0; dt < 2; dt++) {
            qkv_dtype t = dt ? QKV_F64 : QKV_F32;
            double tol = dt ? 1e-12 : 1e-5, worst = 0;
            int failed = 0, differed = 0;
            for (int i = 0; i < n; i++) {
                run kept = do_run(&cs[i], t, true, 1, 300 + (uint64_t)i);
                qkv_attn_allow_keep_p_(false);
                run again = do_run(&cs[i], t, true, 1, 300 + (uint64_t)i);
                qkv_attn_allow_keep_p_(true);
                double w = worst_diff(&kept, &again);
                worst = fmax(worst, w);
                differed += w > 0;
                if (!(w <= tol) && failed++ < 5) {
                    char d[160];
                    describe(&cs[i], d, sizeof d);
                    cr_log_error("%s %s (kernels %s): kept P and recomputed P differ by %.3g", d, qkv_dtype_name(t),
                                 qkv_attn_kernels_()->name, w);
                }
                qkv_ctx_free(kept.ctx);
                qkv_ctx_free(again.ctx);
            }
            cr_expect_eq(failed, 0, "kernels %s %s: %d of %d configurations differ (worst %.3g)",
                         qkv_attn_kernels_()->name, qkv_dtype_name(t), failed, n, worst);
            cr_expect_gt(differed, 0, "kernels %s %s: kept and recomputed P agree to the bit everywhere",
                         qkv_attn_kernels_()->name, qkv_dtype_name(t));
        }
    }
    qkv_attn_force_isa_(-1);
    cr_expect_geq(sets, 1);
}

/* Decoding's few-row products: a set that has them uses its own; the AVX-512 set, which has none, borrows
 * AVX2's where this CPU runs AVX2 (else the GEMM); the portable set has none and borrows none. */
Test(fused, a_set_without_few_row_products_borrows_a_narrower_sets) {
    const qkv_attn_kernel_set_ *avx2 = qkv_isa_supported_(QKV_ISA_AVX2_) && qkv_attn_kernels_avx2_.available
                                           ? &qkv_attn_kernels_avx2_
                                           : NULL;
    cr_expect_null(qkv_attn_few_rows_kernels_(&qkv_attn_kernels_portable_), "the portable set borrows nothing");
    cr_expect_eq(qkv_attn_few_rows_kernels_(&qkv_attn_kernels_avx512_), avx2, "AVX-512 borrows AVX2's (or none)");
    if (avx2) {
        cr_expect_not_null(avx2->rows_dot, "the AVX2 set has the few-row products");
        cr_expect_eq(qkv_attn_few_rows_kernels_(avx2), avx2, "a set that has them keeps its own");
    }
}

Test(fused, the_fused_path_really_differs_from_the_composed_one) {
    /* Guard against both runs taking the same path: the composed one hands back A, and its tape has four
     * nodes where the fused one has one. */
    cfg c = {2, 9, 11, 4, 3, M_NONE, false, QKV_SCALE_DEFAULT, 1};
    run f = do_run(&c, QKV_F32, true, 1, 3), k = do_run(&c, QKV_F32, false, 1, 3);
    int nodes_f = 0, nodes_c = 0;
    for (qkv_node_ *x = f.out->node_; x; x = x->prev) nodes_f++;
    for (qkv_node_ *x = k.out->node_; x; x = x->prev) nodes_c++;
    cr_expect_eq(nodes_f, 1);
    cr_expect_eq(nodes_c, 4);
    cr_expect_str_eq(f.out->node_->op, "qkv_attention");
    double w = worst_diff(&f, &k);
    cr_expect(w > 0 && w < 1e-5, "difference %g: two different roundings expected, both close", w);
    qkv_ctx_free(f.ctx);
    qkv_ctx_free(k.ctx);
}

Test(fused, fully_masked_rows_give_exact_zeros_and_zero_gradients) {
    const cfg cs[] = {{3, 33, 40, 16, 8, M_FULL, false, QKV_SCALE_DEFAULT, 1}, {3, 70, 300, 3, 3, M_PAD, true, QKV_SCALE_DEFAULT, 1},
                      {2, 7, 7, 2, 2, M_2D, false, QKV_SCALE_DEFAULT, 1}};
    for (int dt = 0; dt < 2; dt++)
        for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
            const cfg *c = &cs[ci];
            run r = do_run(c, dt ? QKV_F64 : QKV_F32, true, 1, 77 + ci);
            int empty_rows = 0, bad = 0;
            for (int b = 0; b < c->batch; b++)
                for (int i = 0; i < c->n_q; i++) {
                    bool any = false;
                    for (int j = 0; j < c->n_k; j++) {
                        const qkv_tensor *m = r.mask;
                        int64_t bm = m->ndim == 3 ? m->shape[0] : 1, rows = m->shape[m->ndim - 2];
                        int64_t mb = b / (c->batch / bm), mi = rows == 1 ? 0 : i;
                        any |= qkv_u8(m)[(mb * rows + mi) * c->n_k + j] && (!c->causal || j <= i);
                    }
                    if (any) continue;
                    empty_rows++;
                    for (int e = 0; e < c->d_v; e++)
                        bad += val(r.out, ((int64_t)b * c->n_q + i) * c->d_v + e) != 0;
                    for (int e = 0; e < c->d_k; e++)
                        bad += val(r.q->grad, ((int64_t)b * c->n_q + i) * c->d_k + e) != 0;
                }
            int nonfinite = 0;
            const qkv_tensor *ts[4] = {r.out, r.q->grad, r.k->grad, r.v->grad};
            for (int t = 0; t < 4; t++)
                for (int64_t e = 0; e < ts[t]->numel; e++) nonfinite += !isfinite(val(ts[t], e));
            cr_expect_gt(empty_rows, 0, "config %zu has no fully masked row", ci);
            cr_expect_eq(bad, 0, "config %zu %s: %d non-zero values in fully masked rows", ci, dt ? "f64" : "f32",
                         bad);
            cr_expect_eq(nonfinite, 0, "config %zu: %d non-finite values", ci, nonfinite);
            qkv_ctx_free(r.ctx);
        }
}

Test(fused, a_nan_in_a_dropped_key_is_never_read) {
    /* Key 5 of every batch is padding and holds NaN in k: its scores are NaN but dropped. */
    for (int dt = 0; dt < 2; dt++) {
        qkv_dtype t = dt ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        int64_t B = 2, n = 9, d = 4;
        qkv_tensor *q = qkv_randn(ctx, t, 3, (int64_t[]){B, n, d}, 0, 1);
        qkv_tensor *k = qkv_randn(ctx, t, 3, (int64_t[]){B, n, d}, 0, 1);
        qkv_tensor *v = qkv_randn(ctx, t, 3, (int64_t[]){B, n, d}, 0, 1);
        qkv_tensor *m = qkv_ones(ctx, QKV_U8, 3, (int64_t[]){B, 1, n});
        for (int b = 0; b < B; b++) {
            qkv_set(ctx, m, (int64_t[]){b, 0, 5}, 0);
            for (int e = 0; e < d; e++) qkv_set(ctx, k, (int64_t[]){b, 5, e}, NAN);
        }
        qkv_set_requires_grad(ctx, v, true);
        qkv_tensor *out = qkv_attention(ctx, q, k, v, m, QKV_SCALE_DEFAULT, 0, NULL);
        cr_assert_not_null(out, "%s", qkv_errmsg(ctx));
        cr_assert_eq(qkv_backward(ctx, out, qkv_randn(ctx, t, 3, out->shape, 0, 1)), QKV_OK);
        int bad = 0;
        for (int64_t i = 0; i < out->numel; i++) bad += !isfinite(val(out, i)) + !isfinite(val(v->grad, i));
        for (int b = 0; b < B; b++)
            for (int e = 0; e < d; e++) bad += qkv_get(ctx, v->grad, (int64_t[]){b, 5, e}) != 0; /* P = 0 there */
        cr_expect_eq(bad, 0, "%s: %d NaN or non-zero values", qkv_dtype_name(t), bad);
        qkv_ctx_free(ctx);
    }
}

/* ---- gradcheck in f64 ---------------------------------------------------------------------------- */

typedef struct gc_user {
    const cfg *c;
    const qkv_tensor *mask;
} gc_user;

static qkv_tensor *attend(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)n;
    const gc_user *u = user;
    return qkv_attention(ctx, in[0], in[1], in[2], u->mask, u->c->scale, u->c->causal ? QKV_CAUSAL : 0, NULL);
}

static const cfg GC_CONFIGS[] = {
    {1, 3, 3, 2, 2, M_NONE, false, QKV_SCALE_DEFAULT, 1},    {2, 1, 1, 3, 2, M_NONE, false, QKV_SCALE_DEFAULT, 1},
    {3, 4, 6, 3, 2, M_NONE, false, QKV_SCALE_DEFAULT, 1},    {2, 6, 3, 2, 4, M_NONE, true, QKV_SCALE_DEFAULT, 1},
    {2, 5, 5, 4, 3, M_NONE, true, QKV_SCALE_DEFAULT, 1},     {1, 3, 7, 1, 1, M_NONE, true, QKV_SCALE_DEFAULT, 1},
    {2, 4, 5, 3, 2, M_2D, false, QKV_SCALE_DEFAULT, 1},      {3, 4, 4, 2, 3, M_PAD, false, QKV_SCALE_DEFAULT, 1},
    {3, 5, 5, 2, 2, M_PAD, true, QKV_SCALE_DEFAULT, 1},      {2, 4, 6, 3, 2, M_FULL, false, QKV_SCALE_DEFAULT, 1},
    {2, 5, 5, 2, 2, M_FULL, true, QKV_SCALE_DEFAULT, 1},     {2, 3, 4, 3, 3, M_BM1, false, QKV_SCALE_DEFAULT, 1},
    {2, 4, 7, 2, 2, M_PAD_BM1, false, QKV_SCALE_DEFAULT, 1}, {1, 4, 8, 2, 2, M_LATE, false, QKV_SCALE_DEFAULT, 1},
    {2, 4, 4, 8, 4, M_NONE, false, 1.0, 1},    {1, 4, 4, 3, 2, M_NONE, false, 0.0, 1},
    {1, 3, 3, 4, 2, M_NONE, false, 1.0, 4.5},  {2, 3, 4, 4, 2, M_2D, false, 1.0, 4.5},
    /* several key tiles of the forward (256) and backward (128), with the online rescale */
    {1, 3, 300, 2, 2, M_NONE, false, QKV_SCALE_DEFAULT, 1},  {1, 2, 530, 1, 2, M_LATE, false, QKV_SCALE_DEFAULT, 1},
    {1, 140, 5, 2, 2, M_NONE, false, QKV_SCALE_DEFAULT, 1},  {1, 130, 140, 1, 1, M_NONE, true, QKV_SCALE_DEFAULT, 1},
    {2, 2, 270, 2, 1, M_PAD, false, QKV_SCALE_DEFAULT, 2},   {1, 66, 9, 2, 3, M_FULL, true, QKV_SCALE_DEFAULT, 1},
};

/* Configuration i's q, k, v and mask (the mask's LCG seeded 31 + i); *user is the gc_user fn reads. */
static int gc_build(qkv_ctx *ctx, int i, void *user, qkv_tensor **in, void **fn_user) {
    (void)fn_user;
    const cfg *c = &GC_CONFIGS[i];
    lcg_state = 31 + (uint64_t)i;
    *(gc_user *)user = (gc_user){c, make_mask(ctx, c)};
    in[0] = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){c->batch, c->n_q, c->d_k}, 0, c->spread);
    in[1] = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){c->batch, c->n_k, c->d_k}, 0, c->spread);
    in[2] = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){c->batch, c->n_k, c->d_v}, 0, 1);
    return 3;
}

static void gc_name(char *buf, size_t size, int i, const void *user) {
    (void)user;
    char d[160];
    describe(&GC_CONFIGS[i], d, sizeof d);
    snprintf(buf, size, "fused config %d (%s)", i, d);
}

Test(fused, gradcheck_in_f64_over_24_configurations) {
    int n = (int)(sizeof GC_CONFIGS / sizeof GC_CONFIGS[0]);
    cr_assert_geq(n, 20);
    gc_user u;
    gradcheck_table t = {n, 900, gc_build, gc_name, attend, &u, NULL};
    check_gradcheck_table(&t, 3000);
}

/* ---- threads, aliasing, memory ------------------------------------------------------------------- */

Test(fused, one_and_two_threads_give_the_same_bits) {
    const cfg cs[] = {{3, 130, 130, 16, 16, M_NONE, false, QKV_SCALE_DEFAULT, 1}, {2, 300, 300, 8, 8, M_NONE, true, QKV_SCALE_DEFAULT, 1},
                      {4, 65, 530, 16, 8, M_PAD, false, QKV_SCALE_DEFAULT, 1},    {1, 520, 260, 4, 4, M_FULL, true, QKV_SCALE_DEFAULT, 1},
                      {2, 200, 200, 64, 64, M_LATE, false, QKV_SCALE_DEFAULT, 1}};
    int differ = 0;
    for (int dt = 0; dt < 2; dt++)
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
            qkv_dtype t = dt ? QKV_F64 : QKV_F32;
            run a = do_run(&cs[i], t, true, 1, 40 + i), b = do_run(&cs[i], t, true, 2, 40 + i);
            cr_assert_eq(qkv_threads(b.ctx), 2);
            bool same = same_bits(a.out, b.out) && same_bits(a.q->grad, b.q->grad) &&
                        same_bits(a.k->grad, b.k->grad) && same_bits(a.v->grad, b.v->grad);
            if (!same) {
                differ++;
                cr_log_error("config %zu %s: 1 and 2 threads differ", i, qkv_dtype_name(t));
            }
            qkv_ctx_free(a.ctx);
            qkv_ctx_free(b.ctx);
        }
    cr_expect_eq(differ, 0);
}

/* For each of the 7 non-empty subsets of q, k, v wanting a gradient: the fused path's gradients against the
 * composed path's (within 1e-5), and no gradient where none was wanted. Returns the number of mismatches. */
static int gradient_subsets_match(const cfg *c, uint64_t seed) {
    int bad = 0;
    for (int want = 1; want < 8; want++) {
        qkv_tensor *grads[2][3] = {{NULL}};
        qkv_ctx *ctxs[2];
        for (int fused = 0; fused < 2; fused++) {
            qkv_options o = qkv_default_options();
            o.seed = seed;
            qkv_ctx *ctx = ctxs[fused] = qkv_ctx_new(&o);
            qkv_tensor *in[3] = {qkv_randn(ctx, QKV_F32, 3, (int64_t[]){c->batch, c->n_q, c->d_k}, 0, 1),
                                 qkv_randn(ctx, QKV_F32, 3, (int64_t[]){c->batch, c->n_k, c->d_k}, 0, 1),
                                 qkv_randn(ctx, QKV_F32, 3, (int64_t[]){c->batch, c->n_k, c->d_v}, 0, 1)};
            lcg_state = 99;
            qkv_tensor *mask = make_mask(ctx, c);
            for (int i = 0; i < 3; i++)
                if (want & (1 << i)) qkv_set_requires_grad(ctx, in[i], true);
            qkv_tensor *attn = NULL;
            int flags = c->causal ? QKV_CAUSAL : 0;
            qkv_tensor *out = fused ? qkv_attention(ctx, in[0], in[1], in[2], mask, c->scale, flags, NULL)
                                    : qkv_attention_composed_(ctx, "composed", in[0], in[1], in[2], mask, c->scale,
                                                              flags, &attn);
            cr_assert_eq(qkv_backward(ctx, out, qkv_randn(ctx, QKV_F32, 3, out->shape, 0, 1)), QKV_OK, "%s",
                         qkv_errmsg(ctx));
            for (int i = 0; i < 3; i++) grads[fused][i] = in[i]->grad;
        }
        for (int i = 0; i < 3; i++) {
            bool wanted = want & (1 << i);
            if (!wanted) {
                bad += grads[1][i] != NULL;
                continue;
            }
            double d = grads[1][i] ? rel_diff(grads[1][i], grads[0][i], 0) : INFINITY;
            if (!(d < 1e-5)) {
                bad++;
                cr_log_error("inputs %d wanted, gradient %d: fused differs by %g", want, i, d);
            }
        }
        qkv_ctx_free(ctxs[0]);
        qkv_ctx_free(ctxs[1]);
    }
    return bad;
}

/* ---- short sequences (the kernel set's short path: n_k <= short_keys, d_k, d_v <= short_dims, no mask) -- */

/* Short configurations: n_k from 1 to 16 (inside and at half an AVX-512 vector, whose 8-key kernels take two
 * queries a vector, and at a whole one), d_k and d_v from 1 to 33 (one or two vectors a row, and just past
 * the short path's 32; the AVX2 set takes d <= 16 only), any n_q, causal or not, batch 1-3, three scales,
 * and spreads up to 3 (sharp rows; saturated ones are checked against f64 below, in
 * saturated_attention_stays_right_and_makes_no_subnormals: in f32 their rounding moves every fused and
 * composed path apart by more than this test's bar). */
static int short_configs(cfg *out, int cap) {
    const int nq[5] = {1, 5, 8, 16, 23}, nk[5] = {1, 3, 7, 8, 16}, dk[5] = {1, 4, 16, 32, 33},
              dv[5] = {1, 8, 16, 17, 32};
    const double scales[3] = {QKV_SCALE_DEFAULT, 0.3, 0.0}, spreads[3] = {1, 1, 3};
    int count = 0;
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 5; j++) {
            int idx = i * 5 + j;
            cfg c = {1 + idx % 3, nq[i], nk[j], dk[idx % 5], dv[(idx + 2) % 5], M_NONE, idx % 2 == 0,
                     scales[idx % 3], spreads[(idx / 3) % 3]};
            if (count < cap) out[count++] = c;
        }
    /* and a second 16-column block that is partly full, for d_k and d_v each (8 keys or fewer and more) */
    const cfg partial[] = {{2, 9, 8, 20, 12, M_NONE, true, QKV_SCALE_DEFAULT, 1}, {1, 3, 5, 24, 30, M_NONE, false, 0.3, 1},
                           {2, 6, 12, 28, 19, M_NONE, false, QKV_SCALE_DEFAULT, 1}};
    for (size_t i = 0; i < sizeof partial / sizeof partial[0]; i++)
        if (count < cap) out[count++] = partial[i];
    /* and the AVX2 set's 9-64-key short path (d_k, d_v <= 16): key counts on and off its blocks of 4 and 8,
     * up to 64, and more than 64 queries (its backward runs in chunks of 64 queries) */
    const cfg keys64[] = {{2, 65, 17, 8, 8, M_NONE, true, QKV_SCALE_DEFAULT, 1},
                          {1, 130, 31, 16, 16, M_NONE, false, 0.3, 1},
                          {3, 33, 33, 5, 7, M_NONE, true, QKV_SCALE_DEFAULT, 3},
                          {1, 70, 64, 16, 12, M_NONE, true, QKV_SCALE_DEFAULT, 1},
                          {2, 64, 64, 8, 8, M_NONE, false, QKV_SCALE_DEFAULT, 1},
                          {1, 129, 13, 3, 6, M_NONE, true, 0.0, 1}};
    for (size_t i = 0; i < sizeof keys64 / sizeof keys64[0]; i++)
        if (count < cap) out[count++] = keys64[i];
    return count;
}

/* Runs body once with each kernel set this CPU has forced in turn (each set has its own short kernels, or
 * none); returns how many sets ran. */
static int for_each_kernel_set(void (*body)(const char *set)) {
    int sets = 0;
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++) {
        if (!qkv_attn_force_isa_(isa)) continue; /* not compiled in, or not this CPU's */
        sets++;
        body(qkv_attn_kernels_()->name);
    }
    qkv_attn_force_isa_(-1);
    return sets;
}

/* The short path against the composed one, and against the tiled path on the same shapes; with it off
 * (a kernel set without one runs the tiled path anyway). All three are measured against f64: the short path
 * must be within 2e-5 of it norm-wise, or no more than 1.5x as far as the worse of the other two where
 * f32 itself does not reach 2e-5 (B 1, n_q 5, n_k 3, d_k 4, d_v 17, causal: both fused paths at 6e-5, whose
 * D = rowsum(dO * O) cancels in dP - D). */
static void short_vs_composed_and_tiled(const char *set) {
    cfg cs[40];
    int n = short_configs(cs, 40), failed = 0, differ_bits = 0;
    for (int i = 0; i < n; i++) {
        run c = do_run(&cs[i], QKV_F32, false, 1, 900 + (uint64_t)i);
        run s = do_run(&cs[i], QKV_F32, true, 1, 900 + (uint64_t)i);
        qkv_attn_allow_short_(false);
        run t = do_run(&cs[i], QKV_F32, true, 1, 900 + (uint64_t)i);
        qkv_attn_allow_short_(true);
        run f = do_run(&cs[i], QKV_F64, false, 1, 900 + (uint64_t)i);
        double err_s = worst_diff(&s, &f), err_t = worst_diff(&t, &f), err_c = worst_diff(&c, &f);
        if (!(err_s <= fmax(2e-5, 1.5 * fmax(err_t, err_c)))) {
            char d[160];
            describe(&cs[i], d, sizeof d);
            if (failed++ < 5)
                cr_log_error("%s (kernels %s): short path off f64 by %.3g, tiled by %.3g, composed by %.3g", d, set,
                             err_s, err_t, err_c);
        }
        differ_bits += !same_bits(s.out, t.out) || !same_bits(s.q->grad, t.q->grad);
        qkv_ctx_free(c.ctx), qkv_ctx_free(s.ctx), qkv_ctx_free(t.ctx), qkv_ctx_free(f.ctx);
    }
    cr_expect_eq(failed, 0, "kernels %s: %d of %d short configurations less accurate than the others", set, failed, n);
    if (qkv_attn_kernels_()->short_keys > 0) /* a different path really ran: some last bits differ */
        cr_expect_gt(differ_bits, 0, "kernels %s: the short and tiled paths gave identical bits everywhere", set);
}

Test(fused, short_sequences_match_composed_and_tiled) {
    cr_expect_geq(for_each_kernel_set(short_vs_composed_and_tiled), 1);
}

/* The short path: 1 and 2 threads give the same bits; every subset of q, k, v wanting a gradient matches
 * the composed path (the kernel skips the sums nobody asked for). 8 keys: inside every set's vector. */
static void short_threads_and_subsets(const char *set) {
    const cfg c = {3, 11, 8, 16, 8, M_NONE, true, QKV_SCALE_DEFAULT, 1};
    run a = do_run(&c, QKV_F32, true, 1, 77), b = do_run(&c, QKV_F32, true, 2, 77);
    cr_expect(same_bits(a.out, b.out) && same_bits(a.q->grad, b.q->grad) && same_bits(a.k->grad, b.k->grad) &&
              same_bits(a.v->grad, b.v->grad), "kernels %s: 1 and 2 threads differ on the short path", set);
    qkv_ctx_free(a.ctx), qkv_ctx_free(b.ctx);
    cr_expect_eq(gradient_subsets_match(&c, 13), 0, "kernels %s", set);
}

Test(fused, short_sequences_threads_and_gradient_subsets) {
    cr_expect_geq(for_each_kernel_set(short_threads_and_subsets), 1);
}

/* Special values on the short path give what the tiled path gives, element for element NaN or not (finite
 * ones within 1e-5), in the output and in all three gradients: a NaN query, a +inf or -inf query element
 * (scores of +-inf and inf - inf), with 8 keys or fewer (two queries per vector, the odd last one alone) and
 * with 12 (one query per vector), causal or not. One difference is allowed, in one direction: with causal,
 * the tiled path's dK = dS^T Q multiplies the zeros of the keys a query dropped by that query's NaN, so it
 * spreads the NaN into those keys' gradients; the short path adds nothing for a dropped key, so there its
 * dK stays finite (the mathematics: a dropped score does not depend on the key). */
static void short_special_values(const char *set) {
    const int n_ks[2] = {7, 12};
    const float specials[3] = {NAN, INFINITY, -INFINITY};
    int bad = 0, cases = 0;
    for (int ki = 0; ki < 2; ki++)
        for (int si = 0; si < 3; si++)
            for (int causal = 0; causal < 2; causal++) {
                qkv_tensor *outs[2][4]; /* out, dq, dk, dv */
                qkv_ctx *ctxs[2];
                for (int tiled = 0; tiled < 2; tiled++) {
                    qkv_options o = qkv_default_options();
                    o.seed = 21;
                    qkv_ctx *ctx = ctxs[tiled] = qkv_ctx_new(&o);
                    qkv_tensor *q = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){2, 5, 4}, 0, 1);
                    qkv_tensor *k = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){2, n_ks[ki], 4}, 0, 1);
                    qkv_tensor *v = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){2, n_ks[ki], 3}, 0, 1);
                    qkv_f32(q)[1 * 4 + 2] = specials[si]; /* batch 0, query 1 */
                    qkv_f32(q)[(5 + 4) * 4 + 0] = specials[si]; /* batch 1, query 4: the odd last one */
                    qkv_set_requires_grad(ctx, q, true);
                    qkv_set_requires_grad(ctx, k, true);
                    qkv_set_requires_grad(ctx, v, true);
                    qkv_attn_allow_short_(!tiled);
                    qkv_tensor *out = qkv_attention(ctx, q, k, v, NULL, QKV_SCALE_DEFAULT, causal ? QKV_CAUSAL : 0,
                                                    NULL);
                    qkv_attn_allow_short_(true);
                    cr_assert_not_null(out, "%s", qkv_errmsg(ctx));
                    cr_assert_eq(qkv_backward(ctx, out, qkv_ones(ctx, QKV_F32, 3, out->shape)), QKV_OK, "%s",
                                 qkv_errmsg(ctx));
                    outs[tiled][0] = out, outs[tiled][1] = q->grad, outs[tiled][2] = k->grad, outs[tiled][3] = v->grad;
                }
                for (int t = 0; t < 4; t++)
                    for (int64_t i = 0; i < outs[0][t]->numel; i++) {
                        float a = qkv_f32(outs[0][t])[i], b = qkv_f32(outs[1][t])[i];
                        bool nan_spread = t == 2 && causal && isnan(b) && !isnan(a); /* see above */
                        bad += isnan(a) ? !isnan(b) : !nan_spread && !(fabsf(a - b) <= 1e-5f * (1.0f + fabsf(b)));
                        cases++;
                    }
                qkv_ctx_free(ctxs[0]), qkv_ctx_free(ctxs[1]);
            }
    cr_expect_eq(bad, 0, "kernels %s: %d of %d output and gradient elements differ between the short and tiled paths",
                 set, bad, cases);
}

Test(fused, short_sequences_special_values_like_the_tiled_path) {
    cr_expect_geq(for_each_kernel_set(short_special_values), 1);
}

/* attention(x, x, x) and attention(x, x, v): the gradients of a tensor used twice add up. */
Test(fused, one_tensor_as_q_k_and_v) {
    for (int shared = 0; shared < 2; shared++) {
        double grads[2][3 * 140 * 8];
        int64_t numel = 0;
        for (int fused = 0; fused < 2; fused++) {
            qkv_options o = qkv_default_options();
            o.seed = 5;
            o.threads = 2;
            qkv_ctx *ctx = qkv_ctx_new(&o);
            qkv_tensor *x = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){3, 140, 8}, 0, 1);
            qkv_tensor *v = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){3, 140, 8}, 0, 1);
            qkv_set_requires_grad(ctx, x, true);
            qkv_set_requires_grad(ctx, v, true);
            qkv_tensor *attn = NULL;
            qkv_tensor *vv = shared ? x : v;
            qkv_tensor *out = fused ? qkv_attention(ctx, x, x, vv, NULL, QKV_SCALE_DEFAULT, QKV_CAUSAL, NULL)
                                    : qkv_attention_composed_(ctx, "composed", x, x, vv, NULL, QKV_SCALE_DEFAULT,
                                                              QKV_CAUSAL, &attn);
            cr_assert_eq(qkv_backward(ctx, out, qkv_randn(ctx, QKV_F64, 3, out->shape, 0, 1)), QKV_OK, "%s",
                         qkv_errmsg(ctx));
            numel = x->numel;
            for (int64_t i = 0; i < numel; i++) grads[fused][i] = qkv_f64(x->grad)[i];
            qkv_ctx_free(ctx);
        }
        double num = 0, den = 0;
        for (int64_t i = 0; i < numel; i++) {
            num += (grads[1][i] - grads[0][i]) * (grads[1][i] - grads[0][i]);
            den += grads[0][i] * grads[0][i];
        }
        cr_expect(sqrt(num) <= 1e-12 * sqrt(den) && den > 0, "%s: fused dx differs by %g (relative)",
                  shared ? "q = k = v" : "q = k", sqrt(num / den));
    }
}

Test(fused, peak_memory_is_far_below_one_n_by_n_matrix) {
    const int64_t n = 2048, d = 16;
    for (int fused = 1; fused >= 0; fused--) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *q = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){1, n, d}, 0, 1);
        qkv_tensor *k = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){1, n, d}, 0, 1);
        qkv_tensor *v = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){1, n, d}, 0, 1);
        qkv_tensor *dout = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){1, n, d}, 0, 1);
        qkv_set_requires_grad(ctx, q, true);
        qkv_set_requires_grad(ctx, k, true);
        qkv_set_requires_grad(ctx, v, true);
        size_t before = qkv_arena_used(ctx);
        ctx->arena.high_water = before;
        qkv_tensor *attn = NULL;
        qkv_tensor *out = fused ? qkv_attention(ctx, q, k, v, NULL, QKV_SCALE_DEFAULT, 0, NULL)
                                : qkv_attention_composed_(ctx, "composed", q, k, v, NULL, QKV_SCALE_DEFAULT, 0, &attn);
        cr_assert_eq(qkv_backward(ctx, out, dout), QKV_OK, "%s", qkv_errmsg(ctx));
        size_t extra = ctx->arena.high_water - before, matrix = (size_t)(n * n) * sizeof(float);
        if (fused)
            cr_expect(extra < matrix / 4, "fused: %zu bytes at the peak, one n x n matrix is %zu", extra, matrix);
        else
            cr_expect(extra > matrix, "composed: %zu bytes (the check itself would be blind)", extra);
        qkv_ctx_free(ctx);
    }
}

Test(fused, errors_name_the_function_and_the_shapes) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *q = qkv_zeros(ctx, QKV_F32, 3, (int64_t[]){2, 3, 4});
    qkv_tensor *k = qkv_zeros(ctx, QKV_F32, 3, (int64_t[]){2, 5, 4});
    qkv_tensor *v = qkv_zeros(ctx, QKV_F32, 3, (int64_t[]){2, 5, 2});
    struct {
        qkv_tensor *mask;
        int flags;
        qkv_status status;
        const char *frag;
    } cases[] = {
        {qkv_zeros(ctx, QKV_U8, 2, (int64_t[]){3, 4}), 0, QKV_ERR_SHAPE, "must be n_k = 5"},
        {qkv_zeros(ctx, QKV_U8, 2, (int64_t[]){2, 5}), 0, QKV_ERR_SHAPE, "must be n_q = 3"},
        {qkv_zeros(ctx, QKV_U8, 3, (int64_t[]){3, 1, 5}), 0, QKV_ERR_SHAPE, "does not divide"},
        {qkv_zeros(ctx, QKV_U8, 1, (int64_t[]){5}), 0, QKV_ERR_RANK, "2 or 3 dimensions"},
        {qkv_zeros(ctx, QKV_F32, 2, (int64_t[]){3, 5}), 0, QKV_ERR_DTYPE, "u8"},
        {NULL, 4, QKV_ERR_ARG, "unknown bits"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qkv_clear_error(ctx);
        cr_expect_null(qkv_attention(ctx, q, k, v, cases[i].mask, QKV_SCALE_DEFAULT, cases[i].flags, NULL));
        cr_expect_eq(qkv_error(ctx), cases[i].status, "case %zu: %s", i, qkv_errmsg(ctx));
        const char *msg = qkv_errmsg(ctx);
        cr_expect(strstr(msg, "qkv_attention") && strstr(msg, "[2,3,4]") && strstr(msg, "[2,5,4]") &&
                      strstr(msg, cases[i].frag),
                  "case %zu: %s", i, msg);
    }
    qkv_ctx_free(ctx);
}

/* ---- the softmax row kernels --------------------------------------------------------------------- */

/* Checks one kernel row against a double oracle; returns the number of bad entries (why: the first). */
static int check_row(const qkv_attn_kernel_set_ *ks, const float *s, int64_t n, const uint8_t *mrow, int64_t len,
                     char *why, size_t why_size) {
    float *a = malloc((size_t)(n + 1) * sizeof *a);
    double *ref = malloc((size_t)(n + 1) * sizeof *ref);
    cr_assert(a && ref);
    a[n] = 12345.0f; /* guard: nothing written past the row */
    ks->softmax_row(s, a, n, mrow, len);
    double m = -INFINITY;
    bool any = false;
    for (int64_t j = 0; j < len; j++)
        if (!mrow || mrow[j]) m = any ? fmax(m, s[j]) : s[j], any = true;
    double total = 0;
    for (int64_t j = 0; j < n; j++) {
        ref[j] = any && j < len && (!mrow || mrow[j]) ? exp((double)s[j] - m) : 0.0;
        total += ref[j];
    }
    int bad = 0;
    for (int64_t j = 0; j < n; j++) {
        double want = total > 0 ? ref[j] / total : 0.0, got = a[j];
        /* f32: 1-ulp exp of a rounded difference s - m, a sum and a division: a few ulps, plus the
         * difference's own rounding, |s - m| * 2^-24 relative. Below FLT_MIN the kernels give exactly 0. */
        double tol = want * (4e-7 + 1.2e-7 * fabs((double)s[j] - m));
        bool ok = fabs(got - want) <= tol || (want < 1.5 * FLT_MIN && got == 0.0);
        ok = ok && fpclassify(a[j]) != FP_SUBNORMAL;
        if (!(j < len && (!mrow || mrow[j]))) ok = ok && got == 0.0;
        if (!ok && bad++ == 0)
            snprintf(why, why_size, "%s n %lld len %lld j %lld: %.9g want %.9g", ks->name, (long long)n,
                     (long long)len, (long long)j, got, want);
    }
    if (a[n] != 12345.0f && bad++ == 0)
        snprintf(why, why_size, "%s n %lld: wrote past the row", ks->name, (long long)n);
    free(a);
    free(ref);
    return bad;
}

static const qkv_attn_kernel_set_ *kernel_sets[QKV_ISA_COUNT_];
static int usable_sets(void) {
    int count = 0;
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++)
        if (qkv_attn_force_isa_(isa)) kernel_sets[count++] = qkv_attn_kernels_();
    qkv_attn_force_isa_(-1);
    return count;
}

Test(fused, softmax_kernels_match_the_oracle_on_odd_lengths_masks_and_saturated_rows) {
    int sets = usable_sets(), bad = 0, rows = 0;
    char why[200] = "";
    const int64_t lens[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 47, 65, 100, 129, 255, 1000, 4097};
    for (int si = 0; si < sets; si++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
            for (int kind = 0; kind < 6; kind++) {
                int64_t n = lens[li];
                float *s = malloc((size_t)n * sizeof *s);
                uint8_t *m = malloc((size_t)n);
                cr_assert(s && m);
                double spread = kind >= 3 ? 60.0 : 3.0; /* saturated rows: most exp arguments below -87 */
                for (int64_t j = 0; j < n; j++) {
                    s[j] = (float)(spread * (2 * urand() - 1));
                    m[j] = urand() < 0.7;
                }
                const uint8_t *mrow = kind % 3 == 1 ? m : NULL;
                int64_t len = kind % 3 == 2 ? 1 + n / 2 : n; /* a causal row */
                if (kind == 4) /* fully masked */
                    for (int64_t j = 0; j < n; j++) m[j] = 0;
                if (mrow) /* a dropped score is never read: plant NaN there */
                    for (int64_t j = 0; j < n; j++)
                        if (!m[j]) s[j] = NAN;
                for (int64_t j = len; j < n; j++) s[j] = NAN;
                bad += check_row(kernel_sets[si], s, n, mrow, len, why, sizeof why);
                rows++;
                free(s);
                free(m);
            }
    cr_expect_geq(sets, 1);
    cr_expect_eq(bad, 0, "%d bad entries in %d rows; first: %s", bad, rows, why);
}

/* softmax_rows gives, row for row, the bits of softmax_row, in every kernel set: row lengths 1 to 20 (two
 * rows per vector up to 8 on AVX-512, 16 rows a block), odd and even row counts up to 19 (past one block),
 * spreads up to saturation, and rows holding a NaN, +inf or -inf, or only -inf (NaN rows compare as NaN). */
Test(fused, softmax_rows_gives_the_bits_of_softmax_row) {
    int sets = usable_sets(), bad = 0, rows_checked = 0;
    float s[19 * 20], a[19 * 20], b[20];
    for (int si = 0; si < sets; si++)
        for (int64_t n = 1; n <= 20; n++)
            for (int64_t rows = 1; rows <= 19; rows++) {
                for (int64_t i = 0; i < rows * n; i++) s[i] = (float)((urand() - 0.5) * (n % 3 == 0 ? 400 : 8));
                if (rows >= 3) s[1 * n + n / 2] = NAN, s[2 * n] = INFINITY;
                if (rows >= 5)
                    for (int64_t j = 0; j < n; j++) s[4 * n + j] = -INFINITY;
                if (rows >= 6) s[5 * n + n - 1] = -INFINITY;
                qkv_attn_softmax_rows_(kernel_sets[si], s, a, rows, n);
                for (int64_t r = 0; r < rows; r++, rows_checked++) {
                    kernel_sets[si]->softmax_row(s + r * n, b, n, NULL, n);
                    for (int64_t j = 0; j < n; j++) {
                        float x = a[r * n + j], y = b[j];
                        bad += isnan(x) ? !isnan(y) : memcmp(&x, &y, sizeof x) != 0;
                    }
                }
            }
    cr_expect_gt(rows_checked, 0);
    cr_expect_eq(bad, 0, "%d entries differ between softmax_rows and softmax_row", bad);
}

Test(fused, saturated_softmax_flushes_only_what_is_below_flt_min) {
    /* One row around the flush point: exp(-87.0) / total stays (normal), exp(-87.3) / total and exp(-88 ..
     * -104) would be subnormal and are exactly 0, exp(-200) is 0 anyway. The rest are right to a few ulps. */
    const float s[8] = {0.0f, -87.0f, -87.3f, -88.0f, -95.0f, -103.0f, -200.0f, -1.0f};
    int sets = usable_sets();
    for (int si = 0; si < sets; si++) {
        float a[8];
        kernel_sets[si]->softmax_row(s, a, 8, NULL, 8);
        double total = 1.0 + exp(-87.0) + exp(-87.3) + exp(-1.0);
        cr_expect(fabs(a[0] - 1.0 / total) < 1e-7, "%s: a[0] = %.9g", kernel_sets[si]->name, a[0]);
        cr_expect(fabs(a[1] / (exp(-87.0) / total) - 1) < 1e-6, "%s: a[1] = %g", kernel_sets[si]->name, a[1]);
        cr_expect(fpclassify(a[1]) == FP_NORMAL, "%s: a[1] = %g", kernel_sets[si]->name, a[1]);
        for (int j = 2; j < 7; j++) /* a[2] = exp(-87.3) / total is below FLT_MIN after the division */
            cr_expect_eq(a[j], 0.0f, "%s: a[%d] = %g", kernel_sets[si]->name, j, a[j]);
    }
    /* and through qkv_softmax, f32, with its backward */
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *t = qkv_from_data(ctx, QKV_F32, 2, (int64_t[]){1, 8}, s);
    qkv_set_requires_grad(ctx, t, true);
    qkv_tensor *a = qkv_softmax(ctx, t, NULL, 0);
    cr_assert_eq(qkv_backward(ctx, a, qkv_ones(ctx, QKV_F32, 2, (int64_t[]){1, 8})), QKV_OK);
    for (int j = 0; j < 8; j++) {
        cr_expect(fpclassify(qkv_f32(a)[j]) != FP_SUBNORMAL, "A[%d] subnormal", j);
        cr_expect(isfinite(qkv_f32(t->grad)[j]) && fabsf(qkv_f32(t->grad)[j]) < 1e-6f, "dS[%d] = %g", j,
                  qkv_f32(t->grad)[j]);
    }
    qkv_ctx_free(ctx);
}

Test(fused, saturated_attention_stays_right_and_makes_no_subnormals) {
    /* Large scores: most entries of P fall below FLT_MIN. Fused f32 against the f64 composed result, on the
     * tiled path (300 keys) and on the short one (7 and 16 keys, d up to 32). */
    const cfg cs[3] = {{2, 65, 300, 16, 16, M_NONE, false, 1.0, 6.0}, {3, 9, 7, 16, 8, M_NONE, true, 1.0, 6.0},
                       {2, 11, 16, 32, 17, M_NONE, false, 1.0, 6.0}};
    for (int i = 0; i < 3; i++) {
        run f = do_run(&cs[i], QKV_F32, true, 1, 8), r = do_run(&cs[i], QKV_F64, false, 1, 8);
        cr_expect(rel_diff(f.out, r.out, 0) < 1e-5, "config %d: out differs by %g", i, rel_diff(f.out, r.out, 0));
        cr_expect(rel_diff(f.v->grad, r.v->grad, 0) < 1e-5, "config %d: dv differs by %g", i,
                  rel_diff(f.v->grad, r.v->grad, 0));
        int subnormal = 0;
        for (int64_t j = 0; j < f.out->numel; j++) subnormal += fpclassify(qkv_f32(f.out)[j]) == FP_SUBNORMAL;
        cr_expect_eq(subnormal, 0, "config %d", i);
        qkv_ctx_free(f.ctx);
        qkv_ctx_free(r.ctx);
    }
}

Test(fused, a_kept_nan_or_inf_gives_nan_in_its_row_like_the_reference) {
    /* The masked softmax's rule: kept scores are used as given, so a kept NaN (or +inf, inf - inf) makes
     * its row NaN; the flush clamp must not turn that NaN into a number. */
    int sets = usable_sets();
    const float bad_values[2] = {NAN, INFINITY};
    for (int si = 0; si < sets; si++)
        for (int v = 0; v < 2; v++)
            for (int64_t n = 1; n <= 40; n += 13) {
                float s[40], a[40];
                for (int64_t j = 0; j < n; j++) s[j] = (float)(j % 5) - 2.0f;
                s[n / 2] = bad_values[v];
                kernel_sets[si]->softmax_row(s, a, n, NULL, n);
                int numbers = 0;
                for (int64_t j = 0; j < n; j++) numbers += !isnan(a[j]);
                cr_expect_eq(numbers, 0, "%s, %g at %lld of %lld: %d entries are numbers", kernel_sets[si]->name,
                             (double)bad_values[v], (long long)(n / 2), (long long)n, numbers);
            }
}

Test(fused, gradients_of_any_subset_of_q_k_v) {
    /* Each input alone (and pairs) requiring grad takes a different route through the backward (no dS
     * strip without dq, no dS at all with only dv); every route must match the composed path. */
    const cfg c = {3, 70, 140, 8, 5, M_PAD, true, QKV_SCALE_DEFAULT, 1};
    cr_expect_eq(gradient_subsets_match(&c, 12), 0);
}

Test(fused, a_nan_query_makes_its_row_nan_in_every_kernel_set_and_in_f64) {
    /* Every kept score of the row is NaN: the online softmax's max must not drop it (which would make the
     * row look fully masked and give zeros); out's row and dq's row are NaN, as in the composed path. */
    for (int isa = -1; isa < QKV_ISA_COUNT_; isa++) {
        if (isa >= 0 && !qkv_attn_force_isa_(isa)) continue;
        for (int dt = 0; dt < 2; dt++) {
            qkv_dtype t = dt ? QKV_F64 : QKV_F32;
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            qkv_tensor *q = qkv_randn(ctx, t, 3, (int64_t[]){2, 5, 3}, 0, 1);
            qkv_tensor *k = qkv_randn(ctx, t, 3, (int64_t[]){2, 300, 3}, 0, 1);
            qkv_tensor *v = qkv_randn(ctx, t, 3, (int64_t[]){2, 300, 4}, 0, 1);
            qkv_set_requires_grad(ctx, q, true);
            qkv_set_flat(ctx, q, (1 * 5 + 2) * 3, NAN); /* q[1, 2, 0] */
            /* causal: row 2 keeps keys 0-2 only, so the NaN lanes share a vector with dropped ones */
            qkv_tensor *out = qkv_attention(ctx, q, k, v, NULL, QKV_SCALE_DEFAULT, QKV_CAUSAL, NULL);
            cr_assert_eq(qkv_backward(ctx, out, qkv_ones(ctx, t, 3, out->shape)), QKV_OK, "%s", qkv_errmsg(ctx));
            int wrong = 0;
            for (int64_t r = 0; r < 10; r++) {
                bool nan_row = r == 7;
                for (int e = 0; e < 4; e++) wrong += isnan(val(out, r * 4 + e)) != nan_row;
                for (int e = 0; e < 3; e++) wrong += isnan(val(q->grad, r * 3 + e)) != nan_row;
            }
            cr_expect_eq(wrong, 0, "kernels %s, %s: %d entries NaN where they should not be or the reverse",
                         qkv_attn_kernels_()->name, qkv_dtype_name(t), wrong);
            qkv_ctx_free(ctx);
        }
    }
    qkv_attn_force_isa_(-1);
}

/* ---- a dropped key's K and V rows are never read -------------------------------------------------- */

/* One run of the poisoned-key study: key j of every batch element holds `bad` in its K row (which_v false)
 * or its V row, or (bad = 0) its original finite values; out, dq, dk, dv of the run. */
typedef struct poison_case {
    const char *name;
    int64_t n_q, n_k;
    int mask;        /* 0: none (causal drops keys >= n_q), 1: [B, 1, n_k] padding key j, 2: [n_q, n_k] even queries drop j */
    bool causal, short_ok;
} poison_case;

static void poison_run(const poison_case *pc, qkv_dtype t, int64_t j, bool which_v, double bad, bool want_attn,
                       qkv_ctx **ctx_out, qkv_tensor *res[4]) {
    qkv_options o = qkv_default_options();
    o.seed = 5;
    qkv_ctx *ctx = *ctx_out = qkv_ctx_new(&o);
    int64_t B = 2, d = 5;
    qkv_tensor *q = qkv_randn(ctx, t, 3, (int64_t[]){B, pc->n_q, d}, 0, 1);
    qkv_tensor *k = qkv_randn(ctx, t, 3, (int64_t[]){B, pc->n_k, d}, 0, 1);
    qkv_tensor *v = qkv_randn(ctx, t, 3, (int64_t[]){B, pc->n_k, 3}, 0, 1);
    qkv_tensor *dout = qkv_randn(ctx, t, 3, (int64_t[]){B, pc->n_q, 3}, 0, 1);
    qkv_tensor *m = NULL;
    if (pc->mask == 1) {
        m = qkv_ones(ctx, QKV_U8, 3, (int64_t[]){B, 1, pc->n_k});
        for (int64_t b = 0; b < B; b++) qkv_set(ctx, m, (int64_t[]){b, 0, j}, 0);
    } else if (pc->mask == 2) {
        m = qkv_ones(ctx, QKV_U8, 2, (int64_t[]){pc->n_q, pc->n_k});
        for (int64_t i = 0; i < pc->n_q; i += 2) qkv_set(ctx, m, (int64_t[]){i, j}, 255); /* any nonzero keeps */
        for (int64_t i = 0; i < pc->n_q; i += 2) qkv_set(ctx, m, (int64_t[]){i, j}, 0);
        qkv_set(ctx, m, (int64_t[]){1, 0}, 7);
    }
    if (bad != 0)
        for (int64_t b = 0; b < B; b++)
            for (int64_t e = 0; e < (which_v ? 3 : d); e++)
                qkv_set(ctx, which_v ? v : k, (int64_t[]){b, j, e}, e == 1 ? bad : -bad);
    qkv_set_requires_grad(ctx, q, true);
    qkv_set_requires_grad(ctx, k, true);
    qkv_set_requires_grad(ctx, v, true);
    qkv_attn_allow_short_(pc->short_ok);
    qkv_tensor *attn = NULL;
    qkv_tensor *out = qkv_attention(ctx, q, k, v, m, QKV_SCALE_DEFAULT, pc->causal ? QKV_CAUSAL : 0,
                                    want_attn ? &attn : NULL);
    qkv_attn_allow_short_(true);
    cr_assert_not_null(out, "%s", qkv_errmsg(ctx));
    cr_assert(want_attn == (attn != NULL));
    cr_assert_eq(qkv_backward(ctx, out, dout), QKV_OK, "%s", qkv_errmsg(ctx));
    res[0] = out, res[1] = q->grad, res[2] = k->grad, res[3] = v->grad;
}

/* What qkv.h promises, with or without A handed back (out comes from the fused path either way): a query's row of out and of dq never depends on the K or V row of a
 * key it drops, whatever that row holds (inf, -inf, NaN): against the same run with finite values there, those
 * rows agree to rounding (the GEMM is swapped for a loop that skips the zeros of P or dS in the tiles that
 * hold such a row). A key every query drops (padding, causal keys past the last query) therefore changes
 * nothing at all, and its own dk and dv rows are exactly 0. A key some queries keep is read by them: only
 * their rows (and, through their dS, the dk and dv sums) may become non-finite. Every kernel set this CPU
 * has, the short path on and off, and f64. Without the skip (the plain GEMM), every dq row of the batch
 * element turned NaN (0 * inf in dQ = dS K), and every out row with a V row of inf (0 * inf in O = P V). */
static void poisoned_keys(const char *set) {
    const poison_case cases[] = {
        {"padding key, one tile", 7, 9, 1, false, true},  {"padding key, 3 tiles", 7, 300, 1, false, true},
        {"padding key + causal", 40, 300, 1, true, true}, {"causal, keys past n_q, short", 5, 8, 0, true, true},
        {"causal, keys past n_q, tiled", 5, 8, 0, true, false}, {"causal, long", 40, 300, 0, true, true},
        {"explicit mask, even queries drop it", 7, 9, 2, false, true},
        {"explicit mask, 2 tiles", 7, 300, 2, true, true},
        /* more than one query block (n_q > 64): the keys are flagged in a pass before the forward */
        {"padding key, 2 query blocks", 70, 300, 1, false, true}, {"explicit mask, 2 query blocks", 70, 300, 2, true, true},
        /* decoding: 1 .. 4 queries, the few-row products */
        {"decode, padding key", 1, 300, 1, false, true}, {"decode, explicit mask", 3, 9, 2, false, false}};
    const double bads[3] = {INFINITY, NAN, 1e308};
    int wrong = 0, compared = 0;
    for (int dt = 0; dt < 2; dt++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
            for (int which_v = 0; which_v < 4; which_v++) /* K, V; K with A asked for, V with A */
                for (int bi = 0; bi < 3; bi++) {
                    const poison_case *pc = &cases[ci];
                    qkv_dtype t = dt ? QKV_F64 : QKV_F32;
                    int64_t j = pc->mask == 0 ? pc->n_k - 2 : pc->n_k - 3; /* causal: j >= n_q */
                    if (pc->mask == 2 && pc->causal) j = 1;
                    qkv_ctx *cc, *pcx;
                    qkv_tensor *clean[4], *pois[4];
                    bool in_v = which_v % 2, with_attn = which_v >= 2;
                    poison_run(pc, t, j, in_v, 0, with_attn, &cc, clean);
                    poison_run(pc, t, j, in_v, bads[bi], with_attn, &pcx, pois);
                    bool every_query_drops = pc->mask != 2;
                    double tol = dt ? 1e-12 : 2e-5;
                    int64_t dims[4] = {3, 5, 5, 3};
                    for (int x = 0; x < (every_query_drops ? 4 : 2); x++)
                        for (int64_t e = 0; e < clean[x]->numel; e++) {
                            int64_t row = e / dims[x], i = row % (x < 2 ? pc->n_q : pc->n_k);
                            if (!every_query_drops && i % 2 != 0) continue; /* odd queries keep key j */
                            double a = val(pois[x], e), b = val(clean[x], e);
                            bool ok = x >= 2 && i == j ? a == 0 : fabs(a - b) <= tol * (1 + fabs(b));
                            if (!ok && wrong++ < 5)
                                cr_log_error("kernels %s, %s, %s, %s row %g%s: %s[%lld] = %g, finite run %g", set,
                                             qkv_dtype_name(t), pc->name, in_v ? "V" : "K", bads[bi],
                                             with_attn ? " (A asked for)" : "",
                                             (const char *[]){"out", "dq", "dk", "dv"}[x], (long long)e, a, b);
                            compared++;
                        }
                    qkv_ctx_free(cc), qkv_ctx_free(pcx);
                }
    cr_expect_gt(compared, 10000);
    cr_expect_eq(wrong, 0, "kernels %s: %d of %d elements read a dropped key's K or V row", set, wrong, compared);
}

Test(fused, a_dropped_keys_k_and_v_rows_never_reach_out_or_dq) {
    cr_expect_geq(for_each_kernel_set(poisoned_keys), 1);
}
