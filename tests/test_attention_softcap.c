/*
 * test_attention_softcap.c — soft-capping inside the fused attention (qkv_attention_options.softcap;
 * include/qkv/attention.h, ops/attention.c): every kept score x = scale q . k becomes cap tanh(x / cap) before
 * the variant's weights.
 *   - fused against composed (qkv_attention_composed_ex_: qkv_softcap of the scores, then the variant from the
 *     public operators) for every variant, softmax included, f64 within 1e-12 and f32 within 2e-5 (SSMax 6e-5)
 *     norm-wise, over odd sizes, every mask layout, causal, several key tiles; f32 with each kernel set forced;
 *   - the softmax case against an oracle written here from the public operators alone;
 *   - qkv_gradcheck in f64 of every variant (n_k 1 .. 270: several key tiles), batch > 1;
 *   - PyTorch 1.13 golden values (tests/data/variants/softcap_*, tests/tools/make_golden_variants.py) to 1e-10;
 *   - 1 and 2 or 3 threads give the same bits; a fully masked row gives exact zeros; a NaN in a dropped key is
 *     never read; saturation (a kept inf score becomes the cap, gradient 0); softcap 0 is the uncapped call,
 *     bit for bit; the misuse entries.
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

#define CAP 1.5 /* as tests/tools/make_golden_variants.py's CAP */

static qkv_attention_options options_for(const cfg *c, qkv_attn_variant variant, const qkv_tensor *mask,
                                         qkv_tensor *param, double cap) {
    return variant_options(c, variant, variant_heads_of(c), mask, param, 0, cap);
}

/* Odd sizes, every mask layout, causal, 1-4 batch elements; rows crossing several key tiles of the forward (256
 * keys) and backward (128); decoding rows; spreads that put many scores past the cap's bend. */
static const cfg CONFIGS[] = {
    {1, 1, 1, 3, 2, M_NONE, false, QKV_SCALE_DEFAULT, 1},      {2, 3, 3, 1, 3, M_NONE, true, QKV_SCALE_DEFAULT, 2},
    {2, 7, 5, 3, 4, M_2D, false, QKV_SCALE_DEFAULT, 2},        {3, 7, 7, 16, 16, M_PAD, true, QKV_SCALE_DEFAULT, 1},
    {4, 7, 9, 4, 3, M_PAD, false, QKV_SCALE_DEFAULT, 2.5},     {2, 33, 33, 16, 8, M_FULL, false, QKV_SCALE_DEFAULT, 2},
    {2, 33, 33, 8, 8, M_FULL, true, QKV_SCALE_DEFAULT, 1},     {4, 33, 7, 3, 64, M_BM1, false, QKV_SCALE_DEFAULT, 2},
    {2, 7, 33, 64, 3, M_PAD_BM1, false, QKV_SCALE_DEFAULT, 1}, {1, 33, 40, 5, 5, M_LATE, true, QKV_SCALE_DEFAULT, 2},
    {2, 130, 130, 16, 16, M_NONE, true, QKV_SCALE_DEFAULT, 2}, {1, 70, 300, 8, 8, M_LATE, false, 0.7, 2},
    {2, 40, 520, 4, 5, M_2D, false, QKV_SCALE_DEFAULT, 2},     {3, 3, 300, 16, 16, M_PAD, false, QKV_SCALE_DEFAULT, 1},
    {2, 1, 257, 32, 32, M_NONE, false, QKV_SCALE_DEFAULT, 2},  {1, 300, 16, 64, 64, M_NONE, false, QKV_SCALE_DEFAULT, 1},
    {2, 16, 16, 16, 16, M_NONE, false, QKV_SCALE_DEFAULT, 2},  {2, 64, 64, 64, 64, M_NONE, true, QKV_SCALE_DEFAULT, 3},
};
#define N_CONFIGS ((int)(sizeof CONFIGS / sizeof CONFIGS[0]))

static int fused_vs_composed(qkv_attn_variant variant, qkv_dtype dt, double tol) {
    return variant_fused_vs_composed(CONFIGS, N_CONFIGS, variant, dt, tol, CAP);
}

Test(softcap, fused_matches_composed_in_f64) {
    QKV_TEST_DEADLINE(600);
    for (int v = 0; v < N_VARIANTS; v++)
        cr_expect_eq(fused_vs_composed(VARIANTS[v], QKV_F64, 1e-12), 0, "%s", qkv_attn_variant_name(VARIANTS[v]));
}

/* f32: SSMax's scores are the softmax's times c log(n), as in test_attention_variants.c. */
static double f32_tolerance(qkv_attn_variant v) {
    return v == QKV_ATTN_SSMAX ? 6e-5 : v == QKV_ATTN_SOFTPICK ? 3e-5 : 2e-5;
}

Test(softcap, fused_matches_composed_in_f32_with_every_kernel_set) {
    QKV_TEST_DEADLINE(600);
    int sets = 0;
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++) {
        if (!qkv_attn_force_isa_(isa)) continue;
        sets++;
        for (int v = 0; v < N_VARIANTS; v++)
            cr_expect_eq(fused_vs_composed(VARIANTS[v], QKV_F32, f32_tolerance(VARIANTS[v])), 0, "%s with %s",
                         qkv_attn_variant_name(VARIANTS[v]), qkv_isa_name_((qkv_isa_)isa));
    }
    qkv_attn_force_isa_(-1);
    cr_expect_geq(sets, 1);
}

/* The softmax case against softmax(qkv_softcap(scale q k^T), mask, flags) v written here from the public
 * operators (the composed oracle above shares its code with the library). */
Test(softcap, softmax_matches_public_operators) {
    const cfg cs[] = {{2, 33, 40, 8, 8, M_FULL, true, QKV_SCALE_DEFAULT, 2}, {3, 9, 300, 4, 3, M_PAD, false, 0.9, 2}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        vrun a = variant_run(&cs[i], QKV_F64, QKV_ATTN_SOFTMAX, VARIANT_FUSED, 1, 5 + i, CAP);
        vrun b = variant_run(&cs[i], QKV_F64, QKV_ATTN_SOFTMAX, VARIANT_OPERATORS, 1, 5 + i, CAP);
        cr_expect_leq(worst_diff(&a.r, &b.r), 1e-12, "config %zu", i);
        qkv_ctx_free(a.r.ctx);
        qkv_ctx_free(b.r.ctx);
    }
}

/* ---- gradcheck in f64 ---------------------------------------------------------------------------- */

static const cfg GC_CONFIGS[] = {
    {1, 1, 1, 2, 2, M_NONE, false, QKV_SCALE_DEFAULT, 2},  {2, 3, 3, 2, 2, M_NONE, false, QKV_SCALE_DEFAULT, 2},
    {2, 3, 7, 3, 2, M_NONE, true, QKV_SCALE_DEFAULT, 2},   {2, 7, 3, 2, 3, M_2D, false, QKV_SCALE_DEFAULT, 2},
    {3, 5, 5, 2, 2, M_PAD, true, QKV_SCALE_DEFAULT, 2},    {2, 7, 7, 3, 2, M_FULL, false, QKV_SCALE_DEFAULT, 2.5},
    {2, 3, 4, 3, 3, M_BM1, false, QKV_SCALE_DEFAULT, 2},   {1, 33, 7, 1, 1, M_2D, true, 1.0, 2},
    {2, 2, 33, 2, 1, M_NONE, false, QKV_SCALE_DEFAULT, 2}, {1, 2, 270, 1, 1, M_LATE, false, QKV_SCALE_DEFAULT, 2},
};
#define N_GC ((int)(sizeof GC_CONFIGS / sizeof GC_CONFIGS[0]))

static void gradcheck_variant(qkv_attn_variant variant) {
    variant_gc g = {GC_CONFIGS, N_GC, 61, variant, 0, 0, CAP, NULL, NULL, 0};
    variant_gradcheck(&g, 950, 1000);
}

Test(softcap, gradcheck_softmax) { gradcheck_variant(QKV_ATTN_SOFTMAX); }
Test(softcap, gradcheck_softmax1) { gradcheck_variant(QKV_ATTN_SOFTMAX1); }
Test(softcap, gradcheck_sink) { gradcheck_variant(QKV_ATTN_SINK); }
Test(softcap, gradcheck_sigmoid) { gradcheck_variant(QKV_ATTN_SIGMOID); }
Test(softcap, gradcheck_ssmax) { gradcheck_variant(QKV_ATTN_SSMAX); }
Test(softcap, gradcheck_softpick) { gradcheck_variant(QKV_ATTN_SOFTPICK); }

/* ---- PyTorch 1.13 golden values ------------------------------------------------------------------- */

Test(softcap, agree_with_pytorch_golden_values_in_f64) {
    const char *kinds[3] = {"plain", "masked", "causal"};
    int checked = 0;
    for (int v = 0; v < N_VARIANTS; v++)
        for (int kind = 0; kind < 3; kind++) {
            char name[64];
            snprintf(name, sizeof name, "softcap_%s_%s", qkv_attn_variant_name(VARIANTS[v]), kinds[kind]);
            checked += check_golden_case(name, VARIANTS[v], kind, CAP);
        }
    cr_expect_eq(checked, 3 * (6 * 4 + 2));
}

/* ---- guarantees ------------------------------------------------------------------------------------ */

Test(softcap, one_and_several_threads_give_the_same_bits) {
    const cfg cs[] = {{4, 130, 130, 16, 16, M_NONE, true, QKV_SCALE_DEFAULT, 2},
                      {4, 65, 530, 16, 8, M_PAD, false, QKV_SCALE_DEFAULT, 2},
                      {2, 200, 200, 32, 32, M_LATE, false, QKV_SCALE_DEFAULT, 2}};
    int differ = 0;
    for (int v = 0; v < N_VARIANTS; v++)
        for (int dt = 0; dt < 2; dt++)
            for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
                qkv_dtype t = dt ? QKV_F64 : QKV_F32;
                vrun a = variant_run(&cs[i], t, VARIANTS[v], VARIANT_FUSED, 1, 41, CAP);
                vrun b = variant_run(&cs[i], t, VARIANTS[v], VARIANT_FUSED, 2 + (int)(i % 2), 41, CAP);
                bool same = same_bits(a.r.out, b.r.out) && same_bits(a.r.q->grad, b.r.q->grad) &&
                            same_bits(a.r.k->grad, b.r.k->grad) && same_bits(a.r.v->grad, b.r.v->grad) &&
                            (!a.param || same_bits(a.param->grad, b.param->grad));
                if (!same && differ++ < 5)
                    cr_log_error("%s %s config %zu: 1 and 2-3 threads differ", qkv_attn_variant_name(VARIANTS[v]),
                                 qkv_dtype_name(t), i);
                qkv_ctx_free(a.r.ctx);
                qkv_ctx_free(b.r.ctx);
            }
    cr_expect_eq(differ, 0);
}

/* softcap 0 is the uncapped call, bit for bit (the short path and the kept P included). */
Test(softcap, zero_is_off) {
    const cfg cs[] = {{2, 16, 16, 16, 16, M_NONE, false, QKV_SCALE_DEFAULT, 1},
                      {2, 33, 40, 8, 8, M_FULL, true, QKV_SCALE_DEFAULT, 1}};
    for (int v = 0; v < N_VARIANTS; v++)
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
            vrun a = variant_run(&cs[i], QKV_F32, VARIANTS[v], VARIANT_FUSED, 1, 9, 0.0);
            qkv_ctx *ctx = a.r.ctx;
            qkv_attention_options o = options_for(&cs[i], VARIANTS[v], a.r.mask, a.param, 0.0);
            o.softcap = 0.0;
            qkv_tensor *out = qkv_attention_ex(ctx, a.r.q, a.r.k, a.r.v, &o, NULL);
            cr_assert_not_null(out, "%s", qkv_errmsg(ctx));
            cr_expect(same_bits(out, a.r.out));
            /* and a cap changes the result */
            o.softcap = CAP;
            qkv_tensor *capped = qkv_attention_ex(ctx, a.r.q, a.r.k, a.r.v, &o, NULL);
            cr_assert_not_null(capped, "%s", qkv_errmsg(ctx));
            cr_expect_gt(rel_diff(capped, out, 0), 1e-3, "%s: the cap changed nothing", qkv_attn_variant_name(VARIANTS[v]));
            qkv_ctx_free(ctx);
        }
}

/* A fully masked row: out 0 and dq 0 exactly. */
Test(softcap, fully_masked_rows_give_exact_zeros) {
    const cfg c = {2, 9, 11, 4, 5, M_FULL, false, QKV_SCALE_DEFAULT, 2}; /* rows r % 3 == 1 keep nothing */
    for (int v = 0; v < N_VARIANTS; v++)
        for (int dt = 0; dt < 2; dt++) {
            vrun a = variant_run(&c, dt ? QKV_F64 : QKV_F32, VARIANTS[v], VARIANT_FUSED, 1, 17, CAP);
            int bad = 0;
            for (int64_t b = 0; b < c.batch; b++)
                for (int64_t i = 1; i < c.n_q; i += 3) {
                    for (int64_t e = 0; e < c.d_v; e++) bad += val(a.r.out, (b * c.n_q + i) * c.d_v + e) != 0.0;
                    for (int64_t e = 0; e < c.d_k; e++) bad += val(a.r.q->grad, (b * c.n_q + i) * c.d_k + e) != 0.0;
                }
            cr_expect_eq(bad, 0, "%s %s: %d nonzero entries in fully masked rows", qkv_attn_variant_name(VARIANTS[v]),
                         dt ? "f64" : "f32", bad);
            qkv_ctx_free(a.r.ctx);
        }
}

/* NaN and inf in the K and V rows of padded keys: out and gradients as without them, the padded dk exactly 0. */
Test(softcap, dropped_keys_are_never_read) {
    const cfg c = {3, 7, 12, 4, 3, M_PAD, false, QKV_SCALE_DEFAULT, 2}; /* batch b pads its last 4 b keys */
    for (int v = 0; v < N_VARIANTS; v++)
        for (int dt = 0; dt < 2; dt++) {
            qkv_dtype t = dt ? QKV_F64 : QKV_F32;
            vrun clean = variant_run(&c, t, VARIANTS[v], VARIANT_FUSED, 1, 23, CAP);
            vrun dirty = variant_run(&c, t, VARIANTS[v], VARIANT_POISONED, 1, 23, CAP);
            /* the same to rounding (with a non-finite K or V row the products add only the nonzero weights) */
            double tol = dt ? 1e-13 : 1e-6;
            const char *name = qkv_attn_variant_name(VARIANTS[v]), *tn = qkv_dtype_name(t);
            cr_expect(rel_diff(dirty.r.out, clean.r.out, 0) <= tol, "%s %s: out changed", name, tn);
            cr_expect(rel_diff(dirty.r.q->grad, clean.r.q->grad, 0) <= tol, "%s %s: dq changed", name, tn);
            cr_expect(rel_diff(dirty.r.v->grad, clean.r.v->grad, 0) <= tol, "%s %s: dv changed", name, tn);
            if (dirty.param)
                cr_expect(rel_diff(dirty.param->grad, clean.param->grad, 1e-3) <= tol, "%s %s: dparam changed", name, tn);
            int nonzero = 0;
            for (int64_t j = c.n_k - 4; j < c.n_k; j++)
                for (int e = 0; e < c.d_k; e++) nonzero += val(dirty.r.k->grad, (c.n_k + j) * c.d_k + e) != 0.0;
            cr_expect_eq(nonzero, 0, "%s %s: padded keys got a dk", name, tn);
            qkv_ctx_free(clean.r.ctx);
            qkv_ctx_free(dirty.r.ctx);
        }
}

/* Saturation: a kept +inf score becomes the cap (weight as a score of cap), and its gradient is exactly 0; huge
 * finite scores give finite results and gradients. */
Test(softcap, saturated_scores) {
    for (int dt = 0; dt < 2; dt++) {
        qkv_dtype t = dt ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        /* one query, three keys: scores 1e6, -1e6 (q . k with scale 1), and a third 0 */
        qkv_tensor *q = qkv_from_data(ctx, QKV_F64, 2, (int64_t[]){1, 1}, (double[]){1.0});
        qkv_tensor *k = qkv_from_data(ctx, QKV_F64, 2, (int64_t[]){3, 1}, (double[]){1e6, -1e6, 0.0});
        qkv_tensor *v = qkv_from_data(ctx, QKV_F64, 2, (int64_t[]){3, 1}, (double[]){1.0, 2.0, 3.0});
        if (t == QKV_F32) q = qkv_to_dtype(ctx, q, t), k = qkv_to_dtype(ctx, k, t), v = qkv_to_dtype(ctx, v, t);
        qkv_set_requires_grad(ctx, q, true);
        qkv_set_requires_grad(ctx, k, true);
        qkv_attention_options o = qkv_attention_default_options();
        o.scale = 1.0;
        o.softcap = 2.0;
        qkv_tensor *out = qkv_attention_ex(ctx, q, k, v, &o, NULL);
        cr_assert_not_null(out, "%s", qkv_errmsg(ctx));
        double e2 = exp(2.0), em2 = exp(-2.0), want = (1.0 * e2 + 2.0 * em2 + 3.0) / (e2 + em2 + 1.0);
        cr_expect(fabs(val(out, 0) - want) <= (dt ? 1e-14 : 1e-6), "%s: out %.17g, want %.17g", qkv_dtype_name(t),
                  val(out, 0), want);
        qkv_backward(ctx, out, qkv_ones(ctx, t, 2, out->shape));
        cr_assert_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
        cr_expect(isfinite(val(q->grad, 0)), "dq %g", val(q->grad, 0));
        cr_expect_eq(val(k->grad, 0), 0.0, "saturated key: dk %g", val(k->grad, 0));
        cr_expect_eq(val(k->grad, 1), 0.0, "saturated key: dk %g", val(k->grad, 1));
        cr_expect_neq(val(k->grad, 2), 0.0);
        qkv_ctx_free(ctx);
    }
}

Test(softcap, misuse_names_the_function_and_the_value) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *q = qkv_zeros(ctx, QKV_F32, 3, (int64_t[]){4, 3, 2});
    qkv_tensor *k = qkv_zeros(ctx, QKV_F32, 3, (int64_t[]){4, 5, 2});
    qkv_tensor *v = qkv_zeros(ctx, QKV_F32, 3, (int64_t[]){4, 5, 2});
    const struct {
        double cap;
        const char *frag;
    } cases[] = {{NAN, "softcap nan"}, {INFINITY, "softcap inf"}, {-INFINITY, "softcap -inf"}, {-1.0, "softcap -1"},
                 {-1e-300, "softcap -1e-300"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int variant = 0; variant < 2; variant++) {
            qkv_clear_error(ctx);
            qkv_attention_options o = qkv_attention_default_options();
            o.variant = variant ? QKV_ATTN_SIGMOID : QKV_ATTN_SOFTMAX;
            o.softcap = cases[i].cap;
            cr_expect_null(qkv_attention_ex(ctx, q, k, v, &o, NULL), "case %zu", i);
            cr_expect_eq(qkv_error(ctx), QKV_ERR_ARG, "case %zu: %s", i, qkv_errmsg(ctx));
            const char *msg = qkv_errmsg(ctx);
            cr_expect(strstr(msg, "qkv_attention_ex") && strstr(msg, "[4,3,2]") && strstr(msg, cases[i].frag) &&
                          strstr(msg, "finite and >= 0"),
                      "case %zu: %s", i, msg);
        }
    cr_expect_eq(qkv_attention_default_options().softcap, 0.0);
    qkv_ctx_free(ctx);
}
