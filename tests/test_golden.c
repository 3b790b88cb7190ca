/*
 * test_golden.c — qkv against PyTorch 1.13, without PyTorch: tests/tools/make_golden_attention.py wrote the
 * seed's reference attention (inputs, outputs, attention, gradients of sum(out * R)) as .npy files under
 * tests/data/golden/. Where PyTorch gives NaN (a query whose every key is masked), qkv's defined zeros are
 * checked instead, against the same computation with those rows set to zero (the defined_* files).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "qkv.h"
#include "test_ops.h"

static const char *const CASES[] = {"seed", "batch2_n4_d8", "nonsquare_b2_3x5", "causal_b3_n6_d16",
                                    "masked_rows_b2_n5_d4"};


/* Count elements of got that differ from want by more than atol + rtol |want|; NaN in want must be 0 in got. */
static int compare(qkv_ctx *ctx, const char *label, const qkv_tensor *got, const qkv_tensor *want, double atol,
                   double rtol) {
    cr_assert_not_null(got, "%s: %s", label, qkv_errmsg(ctx));
    cr_assert_eq(got->numel, want->numel, "%s: %lld vs %lld elements", label, (long long)got->numel,
                 (long long)want->numel);
    int bad = 0;
    for (int64_t i = 0; i < want->numel; i++) {
        double g = qkv_get_flat(ctx, got, i), w = qkv_get_flat(ctx, want, i);
        bool ok = isnan(w) ? g == 0.0 : fabs(g - w) <= atol + rtol * fabs(w);
        if (!ok && bad++ < 5) cr_log_error("%s[%lld]: qkv %.17g, PyTorch %.17g", label, (long long)i, g, w);
    }
    return bad;
}

static void check_case(const char *name, qkv_dtype dt, bool causal_flag) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *q = load_golden(ctx, name, "q", false), *k = load_golden(ctx, name, "k", false), *v = load_golden(ctx, name, "v", false);
    qkv_tensor *mask = load_golden(ctx, name, "mask", false), *r = load_golden(ctx, name, "r", false);
    qkv_tensor *want[5];
    const char *names[5] = {"out", "attn", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++) {
        char defined[32];
        snprintf(defined, sizeof defined, "defined_%s", names[i]);
        want[i] = load_golden(ctx, name, defined, true);
        if (!want[i]) want[i] = load_golden(ctx, name, names[i], false);
    }
    if (dt != QKV_F64) {
        q = qkv_to_dtype(ctx, q, dt);
        k = qkv_to_dtype(ctx, k, dt);
        v = qkv_to_dtype(ctx, v, dt);
        r = qkv_to_dtype(ctx, r, dt);
    }
    qkv_set_requires_grad(ctx, q, true);
    qkv_set_requires_grad(ctx, k, true);
    qkv_set_requires_grad(ctx, v, true);
    qkv_tensor *attn = NULL;
    qkv_tensor *out = causal_flag ? qkv_attention(ctx, q, k, v, NULL, QKV_SCALE_DEFAULT, QKV_CAUSAL, &attn)
                                  : qkv_attention(ctx, q, k, v, mask, QKV_SCALE_DEFAULT, 0, &attn);
    cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, out, r)), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    double atol = dt == QKV_F64 ? 1e-12 : 2e-5, rtol = dt == QKV_F64 ? 1e-10 : 2e-5;
    const qkv_tensor *got[5] = {out, attn, q->grad, k->grad, v->grad};
    int bad = 0;
    for (int i = 0; i < 5; i++) {
        char label[96];
        snprintf(label, sizeof label, "%s %s %s", name, qkv_dtype_name(dt), names[i]);
        bad += compare(ctx, label, got[i], want[i], atol, rtol);
    }
    cr_expect_eq(bad, 0, "%s (%s): %d elements differ from PyTorch", name, qkv_dtype_name(dt), bad);
    qkv_ctx_free(ctx);
}

Test(golden, every_case_f64) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) check_case(CASES[i], QKV_F64, false);
}

Test(golden, every_case_f32) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) check_case(CASES[i], QKV_F32, false);
}

Test(golden, causal_flag_equals_the_lower_triangular_mask) { check_case("causal_b3_n6_d16", QKV_F64, true); }

Test(golden, pytorch_gives_nan_where_qkv_gives_zeros) {
    /* the recorded PyTorch output really has NaN in the fully masked row, and qkv has exact zeros there */
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *torch_attn = load_golden(ctx, "masked_rows_b2_n5_d4", "attn", false);
    int nans = 0;
    for (int j = 0; j < 5; j++) nans += isnan(qkv_get(ctx, torch_attn, (int64_t[]){0, 2, j}));
    cr_expect_eq(nans, 5, "PyTorch 1.13's row 2 of batch 0 is NaN");
    qkv_tensor *q = load_golden(ctx, "masked_rows_b2_n5_d4", "q", false), *k = load_golden(ctx, "masked_rows_b2_n5_d4", "k", false);
    qkv_tensor *v = load_golden(ctx, "masked_rows_b2_n5_d4", "v", false);
    qkv_tensor *mask = load_golden(ctx, "masked_rows_b2_n5_d4", "mask", false);
    qkv_tensor *attn = NULL;
    qkv_tensor *out = qkv_attention(ctx, q, k, v, mask, QKV_SCALE_DEFAULT, 0, &attn);
    cr_assert_not_null(out, "%s", qkv_errmsg(ctx));
    for (int j = 0; j < 5; j++) cr_expect_eq(qkv_get(ctx, attn, (int64_t[]){0, 2, j}), 0.0);
    for (int j = 0; j < 4; j++) cr_expect_eq(qkv_get(ctx, out, (int64_t[]){0, 2, j}), 0.0);
    qkv_ctx_free(ctx);
}
