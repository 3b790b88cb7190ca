/*
 * test_softmax.c — qkv_softmax: hand values (the seed's rows), every mask shape and the batch mapping
 * b / (B / Bm), causal alone and with a mask, fully masked rows (zeros, zero gradient), NaN/inf at dropped
 * positions, scores near +-80 and +-1000, ties, f32 against f64, a backward that reads only the output,
 * gradcheck over 24 configurations, and the error table.
 *
 * The oracle is written differently from the kernel: A[j] = 1 / sum_l exp(S[l] - S[j]) over kept l (no
 * max subtraction), and dS from the full Jacobian, dS[j] = sum_i dA[i] A[i] (delta_ij - A[j]).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "qkv.h"
#include "test_ops.h"
#include "qkv_internal.h"

#include "../ops/kernels/attention_kernels.h"

/* ---- helpers ------------------------------------------------------------------------------------- */

static qkv_tensor *mask_of(qkv_ctx *ctx, int ndim, const int64_t *shape, const uint8_t *bits) {
    qkv_tensor *m = qkv_from_data(ctx, QKV_U8, ndim, shape, bits);
    cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
    return m;
}

/* A small deterministic generator for test data (independent of the library's RNG). */
static uint64_t lcg_state = 88172645463325252ull;
static double urand(void) { /* [0, 1) */
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg_state >> 11) * 0x1.0p-53;
}

/* Oracle for one row: keep[j] says whether key j is kept. */
static void oracle_row(const double *s, const bool *keep, int64_t n, double *a) {
    for (int64_t j = 0; j < n; j++) {
        a[j] = 0.0;
        if (!keep[j]) continue;
        double denom = 0.0;
        for (int64_t l = 0; l < n; l++)
            if (keep[l]) denom += exp(s[l] - s[j]);
        a[j] = 1.0 / denom;
    }
}

static void oracle_row_backward(const double *a, const double *da, const bool *keep, int64_t n, double *ds) {
    for (int64_t j = 0; j < n; j++) {
        ds[j] = 0.0;
        if (!keep[j]) continue;
        for (int64_t i = 0; i < n; i++)
            if (keep[i]) ds[j] += da[i] * a[i] * ((i == j ? 1.0 : 0.0) - a[j]);
    }
}

/* The documented keep rule, written out independently: mask batch b / (B / Bm), mask row i or 0. */
static bool keep_of(const qkv_tensor *mask, bool causal, int64_t B, int64_t n_q, int64_t n_k, int64_t b,
                    int64_t i, int64_t j) {
    (void)n_q;
    if (causal && j > i) return false;
    if (!mask) return true;
    int64_t bm = mask->ndim == 3 ? mask->shape[0] : 1;
    int64_t rows = mask->shape[mask->ndim - 2];
    int64_t mb = b / (B / bm);
    int64_t mi = rows == 1 ? 0 : i;
    return qkv_u8(mask)[(mb * rows + mi) * n_k + j] != 0;
}

/* Forward and backward of qkv_softmax against the oracle; returns the number of mismatches. */
static int check_against_oracle(qkv_ctx *ctx, qkv_dtype dt, qkv_tensor *scores, const qkv_tensor *mask,
                                int flags, double tol, char *why, size_t why_size) {
    int64_t B = scores->ndim == 3 ? scores->shape[0] : 1;
    int64_t n_q = scores->shape[scores->ndim - 2], n_k = scores->shape[scores->ndim - 1];
    cr_assert_eq(qkv_set_requires_grad(ctx, scores, true), QKV_OK);
    qkv_tensor *a = qkv_softmax(ctx, scores, mask, flags);
    cr_assert_not_null(a, "%s", qkv_errmsg(ctx));
    qkv_tensor *da = qkv_zeros(ctx, dt, scores->ndim, scores->shape);
    for (int64_t i = 0; i < da->numel; i++) qkv_set_flat(ctx, da, i, 2.0 * urand() - 1.0);
    cr_assert_eq(qkv_backward(ctx, a, da), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_assert_not_null(scores->grad);
    int bad = 0;
    double s[64], want[64], dav[64], dsw[64], av[64];
    bool keep[64];
    cr_assert(n_k <= 64);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n_q; i++) {
            int64_t row = (b * n_q + i) * n_k;
            for (int64_t j = 0; j < n_k; j++) {
                keep[j] = keep_of(mask, flags & QKV_CAUSAL, B, n_q, n_k, b, i, j);
                s[j] = at(scores, row + j);
                dav[j] = at(da, row + j);
                av[j] = at(a, row + j);
            }
            oracle_row(s, keep, n_k, want);
            /* the backward oracle uses qkv's own A (stored in dt), so it isolates the backward */
            oracle_row_backward(av, dav, keep, n_k, dsw);
            for (int64_t j = 0; j < n_k; j++) {
                double got = at(a, row + j), g = at(scores->grad, row + j);
                bool ok = fabs(got - want[j]) <= tol && fabs(g - dsw[j]) <= tol;
                if (!keep[j]) ok = ok && got == 0.0 && g == 0.0;
                if (!ok && bad++ == 0)
                    snprintf(why, why_size, "b %lld i %lld j %lld: A %.17g want %.17g, dS %.17g want %.17g",
                             (long long)b, (long long)i, (long long)j, got, want[j], g, dsw[j]);
            }
        }
    return bad;
}

/* ---- hand values --------------------------------------------------------------------------------- */

Test(softmax, seed_rows_f32_and_f64) {
    const double s[9] = {0.7071068, 0, 0.7071068, 0, 0.7071068, 0, 0.7071068, 0.7071068, 0.7071068};
    const double want[9] = {0.401112, 0.197776, 0.401112, 0.248255, 0.503490,
                            0.248255, 1.0 / 3,  1.0 / 3,  1.0 / 3};
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *a = qkv_softmax(ctx, tensor_of(ctx, dt, 2, (int64_t[]){3, 3}, s), NULL, 0);
        cr_assert_not_null(a, "%s", qkv_errmsg(ctx));
        cr_expect_eq(a->dtype, dt);
        cr_expect_eq(a->ndim, 2);
        for (int i = 0; i < 9; i++)
            cr_expect(fabs(at(a, i) - want[i]) <= 1e-6, "%s A[%d] = %.9f, want %.6f", qkv_dtype_name(dt), i,
                      at(a, i), want[i]);
        qkv_ctx_free(ctx);
    }
}

Test(softmax, hand_values_and_backward) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    /* [0, ln 2, ln 3] -> [1, 2, 3] / 6 */
    qkv_tensor *s = tensor_of(ctx, QKV_F64, 2, (int64_t[]){1, 3}, (double[]){0, log(2.0), log(3.0)});
    qkv_set_requires_grad(ctx, s, true);
    qkv_tensor *a = qkv_softmax(ctx, s, NULL, 0);
    cr_assert_not_null(a);
    cr_expect(fabs(qkv_f64(a)[0] - 1.0 / 6) < 1e-15 && fabs(qkv_f64(a)[1] - 2.0 / 6) < 1e-15 &&
                  fabs(qkv_f64(a)[2] - 3.0 / 6) < 1e-15,
              "A = %.17g %.17g %.17g", qkv_f64(a)[0], qkv_f64(a)[1], qkv_f64(a)[2]);
    /* dA = [1, 0, 0]: dS = A * (dA - A[0]) = [5/36, -1/18, -1/12] */
    qkv_tensor *da = tensor_of(ctx, QKV_F64, 2, (int64_t[]){1, 3}, (double[]){1, 0, 0});
    cr_assert_eq(qkv_backward(ctx, a, da), QKV_OK, "%s", qkv_errmsg(ctx));
    const double *g = qkv_f64(s->grad);
    cr_expect(fabs(g[0] - 5.0 / 36) < 1e-15 && fabs(g[1] + 1.0 / 18) < 1e-15 && fabs(g[2] + 1.0 / 12) < 1e-15,
              "dS = %.17g %.17g %.17g", g[0], g[1], g[2]);
    qkv_ctx_free(ctx);

    /* one key: A = 1 and dS = 0 whatever the score; n_k = 1 */
    ctx = qkv_ctx_new(NULL);
    s = tensor_of(ctx, QKV_F64, 3, (int64_t[]){2, 2, 1}, (double[]){-3, 7, 1e300, 0});
    qkv_set_requires_grad(ctx, s, true);
    a = qkv_softmax(ctx, s, NULL, 0);
    cr_assert_not_null(a);
    for (int i = 0; i < 4; i++) cr_expect_eq(qkv_f64(a)[i], 1.0);
    cr_assert_eq(
        qkv_backward(ctx, a, tensor_of(ctx, QKV_F64, 3, (int64_t[]){2, 2, 1}, (double[]){1, 2, 3, 4})),
        QKV_OK);
    for (int i = 0; i < 4; i++) cr_expect_eq(qkv_f64(s->grad)[i], 0.0);
    qkv_ctx_free(ctx);
}

Test(softmax, ties_are_equal_and_exact) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *s = tensor_of(ctx, QKV_F64, 2, (int64_t[]){2, 4}, (double[]){2, 2, 2, 2, 3, 3, 1, 3});
    qkv_tensor *a = qkv_softmax(ctx, s, NULL, 0);
    cr_assert_not_null(a);
    for (int j = 0; j < 4; j++) cr_expect_eq(qkv_f64(a)[j], 0.25, "A[0][%d] = %.17g", j, qkv_f64(a)[j]);
    const double *r = qkv_f64(a) + 4;
    double e = exp(-2.0), want_hi = 1.0 / (3.0 + e), want_lo = e / (3.0 + e);
    cr_expect(r[0] == r[1] && r[1] == r[3], "tied entries differ: %.17g %.17g %.17g", r[0], r[1], r[3]);
    cr_expect(fabs(r[0] - want_hi) < 1e-15 && fabs(r[2] - want_lo) < 1e-15, "%.17g %.17g", r[0], r[2]);
    qkv_ctx_free(ctx);
}

/* ---- masks --------------------------------------------------------------------------------------- */

Test(softmax, padding_mask_batch_mapping_by_hand) {
    /* B = 4 scores, Bm = 2 masks [2,1,3]: batches 0,1 use mask 0 = {1,1,0}; batches 2,3 use {1,0,0}
     * (b / (B / Bm), not b % Bm). Scores are zero, so kept entries share the row evenly. */
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *s = qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){4, 2, 3});
    qkv_tensor *m = mask_of(ctx, 3, (int64_t[]){2, 1, 3}, (uint8_t[]){1, 1, 0, 1, 0, 0});
    qkv_tensor *a = qkv_softmax(ctx, s, m, 0);
    cr_assert_not_null(a, "%s", qkv_errmsg(ctx));
    const double want01[3] = {0.5, 0.5, 0}, want23[3] = {1, 0, 0};
    int bad = 0;
    for (int b = 0; b < 4; b++)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++)
                bad += qkv_f64(a)[(b * 2 + i) * 3 + j] != (b < 2 ? want01 : want23)[j];
    cr_expect_eq(bad, 0, "%d entries differ from the b / (B / Bm) mapping", bad);
    qkv_ctx_free(ctx);
}

Test(softmax, every_mask_shape_against_the_oracle) {
    const int64_t B = 4, n_q = 3, n_k = 5;
    /* mask shapes: 2-D [n_q,n_k]; 3-D with Bm in {4, 2, 1} and rows in {n_q, 1} */
    const int64_t shapes[7][3] = {{n_q, n_k, 0}, {4, n_q, n_k}, {2, n_q, n_k}, {1, n_q, n_k},
                                  {4, 1, n_k},   {2, 1, n_k},   {1, 1, n_k}};
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        for (int k = 0; k < 7; k++) {
            qkv_ctx *ctx = qkv_ctx_new(NULL);
            int nd = shapes[k][2] ? 3 : 2;
            qkv_tensor *m = qkv_zeros(ctx, QKV_U8, nd, shapes[k]);
            for (int64_t i = 0; i < m->numel; i++) qkv_u8(m)[i] = urand() < 0.7 ? (i % 3 ? 1 : 7) : 0;
            qkv_u8(m)[0] = 0, qkv_u8(m)[1] = 0, qkv_u8(m)[2] = 0, qkv_u8(m)[3] = 0, qkv_u8(m)[4] = 0;
            qkv_tensor *s = qkv_randn(ctx, dt, 3, (int64_t[]){B, n_q, n_k}, 0.0, 2.0);
            char why[256] = "";
            int bad = check_against_oracle(ctx, dt, s, m, 0, d ? 1e-14 : 1e-6, why, sizeof why);
            cr_expect_eq(bad, 0, "%s mask %s: %d mismatches; first: %s", qkv_dtype_name(dt),
                         qkv_shape_str(m, (char[32]){0}, 32), bad, why);
            qkv_ctx_free(ctx);
        }
    }
}

Test(softmax, causal_by_hand_square_and_non_square) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = qkv_softmax(ctx, qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){3, 3}), NULL, QKV_CAUSAL);
    cr_assert_not_null(a);
    const double want[9] = {1, 0, 0, 0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3};
    for (int i = 0; i < 9; i++)
        cr_expect(fabs(qkv_f64(a)[i] - want[i]) < 1e-15, "A[%d] = %g", i, qkv_f64(a)[i]);
    /* n_q = 2 < n_k = 4: query i sees keys 0..i */
    a = qkv_softmax(ctx, qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){2, 4}), NULL, QKV_CAUSAL);
    const double want24[8] = {1, 0, 0, 0, 0.5, 0.5, 0, 0};
    for (int i = 0; i < 8; i++) cr_expect_eq(qkv_f64(a)[i], want24[i], "[2,4] A[%d] = %g", i, qkv_f64(a)[i]);
    /* n_q = 3 > n_k = 2: rows 1 and 2 see both keys */
    a = qkv_softmax(ctx, qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){3, 2}), NULL, QKV_CAUSAL);
    const double want32[6] = {1, 0, 0.5, 0.5, 0.5, 0.5};
    for (int i = 0; i < 6; i++) cr_expect_eq(qkv_f64(a)[i], want32[i], "[3,2] A[%d] = %g", i, qkv_f64(a)[i]);
    cr_expect_eq(qkv_error(ctx), QKV_OK);
    qkv_ctx_free(ctx);

    /* random scores, batch 3, against the oracle, both dtypes */
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        ctx = qkv_ctx_new(NULL);
        char why[256] = "";
        qkv_tensor *s = qkv_randn(ctx, dt, 3, (int64_t[]){3, 4, 6}, 0.0, 3.0);
        int bad = check_against_oracle(ctx, dt, s, NULL, QKV_CAUSAL, d ? 1e-14 : 1e-6, why, sizeof why);
        cr_expect_eq(bad, 0, "%s: %d mismatches; first: %s", qkv_dtype_name(dt), bad, why);
        qkv_ctx_free(ctx);
    }
}

Test(softmax, causal_combined_with_mask) {
    /* the mask drops key 0: query 0 (which causally sees only key 0) has nothing left */
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *m = mask_of(ctx, 2, (int64_t[]){3, 3}, (uint8_t[]){0, 1, 1, 0, 1, 1, 0, 1, 1});
    qkv_tensor *a = qkv_softmax(ctx, qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){3, 3}), m, QKV_CAUSAL);
    cr_assert_not_null(a, "%s", qkv_errmsg(ctx));
    const double want[9] = {0, 0, 0, 0, 1, 0, 0, 0.5, 0.5};
    for (int i = 0; i < 9; i++) cr_expect_eq(qkv_f64(a)[i], want[i], "A[%d] = %g", i, qkv_f64(a)[i]);
    qkv_ctx_free(ctx);

    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        ctx = qkv_ctx_new(NULL);
        qkv_tensor *pm = qkv_zeros(ctx, QKV_U8, 3, (int64_t[]){2, 1, 6});
        for (int64_t i = 0; i < 12; i++) qkv_u8(pm)[i] = i != 0 && i != 4 && i != 11;
        qkv_tensor *s = qkv_randn(ctx, dt, 3, (int64_t[]){4, 5, 6}, 0.0, 3.0);
        char why[256] = "";
        int bad = check_against_oracle(ctx, dt, s, pm, QKV_CAUSAL, d ? 1e-14 : 1e-6, why, sizeof why);
        cr_expect_eq(bad, 0, "%s: %d mismatches; first: %s", qkv_dtype_name(dt), bad, why);
        qkv_ctx_free(ctx);
    }
}

Test(softmax, fully_masked_rows_give_zeros_and_zero_gradient) {
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        /* row 1 of every batch is fully masked; its scores are NaN, inf and huge */
        qkv_tensor *s = tensor_of(ctx, dt, 3, (int64_t[]){2, 2, 3},
                                  (double[]){1, 2, 3, NAN, INFINITY, -INFINITY, -1, 0, 1, 1e30, NAN, -1e30});
        qkv_tensor *m = mask_of(ctx, 2, (int64_t[]){2, 3}, (uint8_t[]){1, 1, 1, 0, 0, 0});
        qkv_set_requires_grad(ctx, s, true);
        qkv_tensor *a = qkv_softmax(ctx, s, m, 0);
        cr_assert_not_null(a, "%s", qkv_errmsg(ctx));
        qkv_tensor *da =
            tensor_of(ctx, dt, 3, (int64_t[]){2, 2, 3}, (double[]){1, -2, 3, 4, 5, 6, -1, 2, 0.5, 7, 8, 9});
        cr_assert_eq(qkv_backward(ctx, a, da), QKV_OK, "%s", qkv_errmsg(ctx));
        int bad = 0;
        for (int b = 0; b < 2; b++)
            for (int j = 0; j < 3; j++) {
                int64_t k = (b * 2 + 1) * 3 + j;
                bad += !(at(a, k) == 0.0) + !(at(s->grad, k) == 0.0);
            }
        cr_expect_eq(bad, 0, "%s: fully masked rows are not exactly zero", qkv_dtype_name(dt));
        /* the kept rows are ordinary softmax rows and their gradients are finite and non-zero */
        double sum0 = at(a, 0) + at(a, 1) + at(a, 2);
        cr_expect(fabs(sum0 - 1.0) < 1e-6, "row 0 sums to %g", sum0);
        cr_expect(isfinite(at(s->grad, 0)) && at(s->grad, 0) != 0.0, "dS[0] = %g", at(s->grad, 0));
        /* an all-zero 2-D mask: the whole output and gradient are zero */
        qkv_step_end(ctx);
        s = qkv_randn(ctx, dt, 2, (int64_t[]){3, 4}, 0, 1);
        qkv_set_requires_grad(ctx, s, true);
        a = qkv_softmax(ctx, s, qkv_zeros(ctx, QKV_U8, 2, (int64_t[]){3, 4}), 0);
        cr_assert_not_null(a);
        cr_assert_eq(qkv_backward(ctx, a, qkv_ones(ctx, dt, 2, (int64_t[]){3, 4})), QKV_OK);
        bad = 0;
        for (int k = 0; k < 12; k++) bad += !(at(a, k) == 0.0) + !(at(s->grad, k) == 0.0);
        cr_expect_eq(bad, 0, "%s: an all-zero mask does not give zeros", qkv_dtype_name(dt));
        qkv_ctx_free(ctx);
    }
}

Test(softmax, nonfinite_scores_at_dropped_positions_do_not_leak) {
    /* The same computation twice: once with 0 at every dropped position, once with NaN/inf/-inf there.
     * Outputs and gradients must be identical bit for bit, and finite. A second round also puts NaN/inf
     * in dA at the dropped positions (their A is 0, so they must not enter rowsum(dA * A)). */
    const double junk[3] = {NAN, INFINITY, -INFINITY};
    const uint8_t bits[10] = {1, 0, 1, 1, 0, 1, 1, 0, 1, 1};
    enum { N = 2 * 4 * 5 };
    for (int d = 0; d < 4; d++) {
        qkv_dtype dt = d & 1 ? QKV_F64 : QKV_F32;
        bool v_da_junk = d & 2; /* also NaN/inf in the upstream gradient at dropped positions */
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        int64_t shape[3] = {2, 4, 5};
        double clean[N], dirty[N], da[N], out[2][N], grad[2][N];
        int n_junk = 0;
        for (int64_t b = 0; b < 2; b++)
            for (int64_t i = 0; i < 4; i++)
                for (int64_t j = 0; j < 5; j++) {
                    int64_t k = (b * 4 + i) * 5 + j;
                    clean[k] = dirty[k] = 4.0 * urand() - 2.0;
                    da[k] = 2.0 * urand() - 1.0;
                    if (j > i || !bits[b * 5 + j]) {
                        clean[k] = 0.0;
                        dirty[k] = junk[n_junk++ % 3];
                    }
                    if ((j > i || !bits[b * 5 + j]) && (v_da_junk)) da[k] = junk[(n_junk + 1) % 3];
                }
        cr_assert(n_junk > 10);
        for (int v = 0; v < 2; v++) {
            qkv_tensor *s = tensor_of(ctx, dt, 3, shape, v ? dirty : clean);
            qkv_tensor *m = mask_of(ctx, 3, (int64_t[]){2, 1, 5}, bits);
            qkv_set_requires_grad(ctx, s, true);
            qkv_tensor *a = qkv_softmax(ctx, s, m, QKV_CAUSAL);
            cr_assert_not_null(a, "%s", qkv_errmsg(ctx));
            cr_assert_eq(qkv_backward(ctx, a, tensor_of(ctx, dt, 3, shape, da)), QKV_OK, "%s",
                         qkv_errmsg(ctx));
            for (int k = 0; k < N; k++) {
                out[v][k] = at(a, k);
                grad[v][k] = at(s->grad, k);
            }
            qkv_step_end(ctx);
        }
        int bad = 0, nonzero = 0;
        for (int k = 0; k < N; k++) {
            bad += !isfinite(out[1][k]) || !isfinite(grad[1][k]);
            bad += memcmp(&out[0][k], &out[1][k], sizeof(double)) != 0;
            bad += memcmp(&grad[0][k], &grad[1][k], sizeof(double)) != 0;
            nonzero += grad[1][k] != 0.0;
        }
        cr_expect_eq(bad, 0, "%s%s: %d differences or non-finite values", qkv_dtype_name(dt),
                     v_da_junk ? " (junk dA too)" : "", bad);
        cr_expect(nonzero > 10, "the gradient should not be trivially zero (%d non-zero)", nonzero);
        qkv_ctx_free(ctx);
    }
}

Test(softmax, scores_near_80_and_1000_do_not_overflow) {
    const double s[5][3] = {
        {80, -80, 79.5}, {-80, -80, -80.5}, {80, 80, 80}, {1000, 999, -1000}, {-1000, -999, -1000}};
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *t = tensor_of(ctx, dt, 2, (int64_t[]){5, 3}, &s[0][0]);
        qkv_set_requires_grad(ctx, t, true);
        qkv_tensor *a = qkv_softmax(ctx, t, NULL, 0);
        cr_assert_not_null(a);
        cr_assert_eq(qkv_backward(ctx, a, qkv_randn(ctx, dt, 2, (int64_t[]){5, 3}, 0, 1)), QKV_OK);
        double tol = d ? 1e-15 : 1e-7;
        int bad = 0;
        char why[160] = "";
        for (int i = 0; i < 5; i++) {
            double want[3];
            /* the oracle is exact here because exp(s[l] - s[j]) only overflows to inf -> 1/inf = 0 */
            oracle_row(s[i], (bool[]){true, true, true}, 3, want);
            for (int j = 0; j < 3; j++) {
                double got = at(a, i * 3 + j), g = at(t->grad, i * 3 + j);
                if (!(fabs(got - want[j]) <= tol) || !isfinite(g)) {
                    if (!bad++)
                        snprintf(why, sizeof why, "row %d col %d: A %.17g want %.17g, dS %g", i, j, got,
                                 want[j], g);
                }
            }
        }
        cr_expect_eq(bad, 0, "%s: %s", qkv_dtype_name(dt), why);
        cr_expect(fabs(at(a, 0) - 1.0 / (1.0 + exp(-160.0) + exp(-0.5))) < tol, "A[0][0] = %.17g", at(a, 0));
        qkv_ctx_free(ctx);
    }
}

Test(softmax, f32_matches_f64_on_outputs_and_gradients) {
    qkv_options o = qkv_default_options();
    o.seed = 11;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    int64_t shape[3] = {3, 6, 9};
    qkv_tensor *s64 = qkv_keep(ctx, qkv_randn(ctx, QKV_F64, 3, shape, 0, 3));
    qkv_tensor *da64 = qkv_keep(ctx, qkv_randn(ctx, QKV_F64, 3, shape, 0, 1));
    qkv_tensor *m = qkv_zeros(ctx, QKV_U8, 3, (int64_t[]){3, 1, 9});
    for (int i = 0; i < 27; i++) qkv_u8(m)[i] = i % 4 != 1;
    m = qkv_keep(ctx, m);
    double err_a[2][2] = {{0}}; /* [flags][output, grad] */
    for (int f = 0; f < 2; f++) {
        int flags = f ? QKV_CAUSAL : 0;
        /* one backward per step: the f32 run, its results kept, then the f64 run */
        qkv_tensor *s32, *da32, *a32, *s64c, *a64;
        s32 = qkv_to_dtype(ctx, s64, QKV_F32);
        da32 = qkv_to_dtype(ctx, da64, QKV_F32);
        qkv_set_requires_grad(ctx, s32, true);
        a32 = qkv_softmax(ctx, s32, m, flags);
        cr_assert_eq(qkv_backward(ctx, a32, da32), QKV_OK, "%s", qkv_errmsg(ctx));
        qkv_tensor *a32k = qkv_keep(ctx, a32), *g32k = qkv_keep(ctx, s32->grad);
        qkv_step_end(ctx);
        s64c = qkv_copy(ctx, s64);
        qkv_set_requires_grad(ctx, s64c, true);
        a64 = qkv_softmax(ctx, s64c, m, flags);
        cr_assert_eq(qkv_backward(ctx, a64, da64), QKV_OK, "%s", qkv_errmsg(ctx));
        err_a[f][0] = rel_norm_err(a32k, a64);
        err_a[f][1] = rel_norm_err(g32k, s64c->grad);
        qkv_step_end(ctx);
    }
    for (int f = 0; f < 2; f++) {
        cr_expect(err_a[f][0] < 1e-4 && err_a[f][1] < 1e-4,
                  "flags %d: output rel err %g, gradient rel err %g", f, err_a[f][0], err_a[f][1]);
        cr_expect(err_a[f][0] > 0 && err_a[f][1] > 0,
                  "f32 identical to f64 is suspicious: did both run in f64?");
    }
    qkv_ctx_free(ctx);
}

Test(softmax, backward_reads_only_the_output) {
    /* Overwrite the scores with NaN after the forward: the backward must not notice. */
    for (int d = 0; d < 2; d++) {
        qkv_dtype dt = d ? QKV_F64 : QKV_F32;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *s = qkv_randn(ctx, dt, 3, (int64_t[]){2, 3, 4}, 0, 2);
        qkv_set_requires_grad(ctx, s, true);
        qkv_tensor *a = qkv_softmax(ctx, s, NULL, QKV_CAUSAL);
        cr_assert_not_null(a);
        qkv_tensor *da = qkv_randn(ctx, dt, 3, (int64_t[]){2, 3, 4}, 0, 1);
        double want[24];
        for (int r = 0; r < 6; r++) {
            bool keep[4];
            for (int j = 0; j < 4; j++) keep[j] = j <= r % 3;
            double av[4], dav[4];
            for (int j = 0; j < 4; j++) av[j] = at(a, r * 4 + j), dav[j] = at(da, r * 4 + j);
            oracle_row_backward(av, dav, keep, 4, want + r * 4);
        }
        qkv_fill(ctx, s, NAN);
        cr_assert_eq(qkv_backward(ctx, a, da), QKV_OK, "%s", qkv_errmsg(ctx));
        int bad = 0;
        for (int k = 0; k < 24; k++) bad += !(fabs(at(s->grad, k) - want[k]) <= (d ? 1e-15 : 1e-7));
        cr_expect_eq(bad, 0, "%s: the backward read the scores (%d bad)", qkv_dtype_name(dt), bad);
        qkv_ctx_free(ctx);
    }
}

/* ---- gradcheck ----------------------------------------------------------------------------------- */

enum mask_kind { M_NONE, M_2D, M_FULL, M_PAD, M_FULL_BM1, M_EMPTY_ROWS, M_PAD_HALF };
enum value_kind { V_RANDN, V_TIES, V_PM80, V_NEAR_P80, V_NEAR_M80, V_NAN_DROPPED };

typedef struct sm_config {
    int64_t B, n_q, n_k;
    int mask;
    int flags;
    int values;
    double scale; /* scores are randn * scale before the kind's transform */
    int heads;    /* > 1: the input is [B, n_q, heads * n_k], split, then softmax with a [B, 1, n_k] mask */
} sm_config;

typedef struct sm_user {
    const qkv_tensor *mask;
    int flags, heads;
} sm_user;

static qkv_tensor *softmax_fn(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)n;
    const sm_user *u = user;
    qkv_tensor *s = u->heads > 1 ? qkv_split_heads(ctx, in[0], u->heads) : in[0];
    return qkv_softmax(ctx, s, u->mask, u->flags);
}

static const sm_config SM_CONFIGS[] = {
    {1, 1, 1, M_NONE, 0, V_RANDN, 1.0, 1}, /* n = 1 */
    {1, 1, 5, M_NONE, 0, V_RANDN, 1.0, 1}, /* one query */
    {1, 4, 4, M_NONE, 0, V_RANDN, 1.0, 1},
    {3, 4, 4, M_NONE, 0, V_RANDN, 0.70710678118654752, 1}, /* batch, scale 1/sqrt(2) */
    {2, 3, 7, M_NONE, 0, V_RANDN, 1.0, 1},                 /* non-square n_q < n_k */
    {2, 6, 2, M_NONE, 0, V_RANDN, 1.0, 1},                 /* non-square n_q > n_k */
    {1, 5, 5, M_NONE, QKV_CAUSAL, V_RANDN, 1.0, 1},        /* causal */
    {3, 3, 5, M_NONE, QKV_CAUSAL, V_RANDN, 2.0, 1},        /* causal, non-square */
    {2, 4, 5, M_2D, 0, V_RANDN, 1.0, 1},                   /* 2-D mask */
    {4, 3, 4, M_FULL, 0, V_RANDN, 1.0, 1},                 /* [B, n_q, n_k] mask */
    {4, 3, 6, M_PAD, 0, V_RANDN, 1.0, 1},                  /* [B, 1, n_k] padding */
    {4, 3, 6, M_PAD_HALF, 0, V_RANDN, 1.0, 1},             /* [B/2, 1, n_k] */
    {2, 4, 3, M_FULL_BM1, 0, V_RANDN, 1.0, 1},             /* [1, n_q, n_k] */
    {3, 4, 5, M_EMPTY_ROWS, 0, V_RANDN, 1.0, 1},           /* fully masked rows */
    {3, 4, 4, M_EMPTY_ROWS, QKV_CAUSAL, V_RANDN, 1.0, 1},  /* masked rows and causal */
    {2, 4, 6, M_PAD, QKV_CAUSAL, V_NAN_DROPPED, 1.0, 1},   /* NaN/inf where dropped */
    {2, 3, 6, M_NONE, 0, V_TIES, 1.0, 1},                  /* ties */
    {2, 4, 4, M_FULL, QKV_CAUSAL, V_TIES, 1.0, 1},         /* ties, mask, causal */
    {2, 3, 5, M_NONE, 0, V_PM80, 1.0, 1},                  /* scores spread over [-80, 80] */
    {2, 3, 5, M_NONE, 0, V_NEAR_P80, 1.0, 1},              /* all near +80 */
    {2, 3, 5, M_PAD, 0, V_NEAR_M80, 1.0, 1},               /* all near -80, padded */
    {2, 3, 4, M_PAD, 0, V_RANDN, 1.0, 2},                  /* heads 2, [B, 1, n_k] mask */
    {3, 2, 3, M_PAD, QKV_CAUSAL, V_RANDN, 1.0, 4},         /* heads 4, causal */
    {2, 1, 5, M_PAD, 0, V_NEAR_P80, 1.0, 3},               /* heads 3, n_q = 1, near 80 */
    {2, 5, 5, M_EMPTY_ROWS, 0, V_PM80, 1.0, 1},            /* +-80 with masked rows */
};

/* Make the config's mask (NULL for none). heads > 1 masks a [B*h] batch with a [B] mask. */
static qkv_tensor *make_mask(qkv_ctx *ctx, const sm_config *c) {
    int64_t B = c->B, q = c->n_q, k = c->n_k;
    qkv_tensor *m;
    switch (c->mask) {
    case M_2D: m = qkv_zeros(ctx, QKV_U8, 2, (int64_t[]){q, k}); break;
    case M_FULL: m = qkv_zeros(ctx, QKV_U8, 3, (int64_t[]){B, q, k}); break;
    case M_PAD: m = qkv_zeros(ctx, QKV_U8, 3, (int64_t[]){B, 1, k}); break;
    case M_PAD_HALF: m = qkv_zeros(ctx, QKV_U8, 3, (int64_t[]){B / 2, 1, k}); break;
    case M_FULL_BM1: m = qkv_zeros(ctx, QKV_U8, 3, (int64_t[]){1, q, k}); break;
    case M_EMPTY_ROWS: m = qkv_zeros(ctx, QKV_U8, 3, (int64_t[]){B, q, k}); break;
    default: return NULL;
    }
    uint8_t *bits = qkv_u8(m);
    for (int64_t i = 0; i < m->numel; i++) bits[i] = urand() < 0.7;
    int64_t rows = m->numel / k;
    for (int64_t r = 0; r < rows; r++) bits[r * k + r % k] = 1; /* most rows keep something ... */
    if (c->mask == M_EMPTY_ROWS)
        for (int64_t r = 1; r < rows; r += 3) memset(bits + r * k, 0, (size_t)k); /* ... but these none */
    return m;
}

/* Configuration c's scores (transformed by its value kind, NaN/inf planted where dropped) and mask. */
static int sm_build(qkv_ctx *ctx, int c, void *user, qkv_tensor **in, void **fn_user) {
    (void)fn_user;
    const sm_config *cfg = &SM_CONFIGS[c];
    int64_t shape[3] = {cfg->B, cfg->n_q, cfg->n_k * cfg->heads};
    qkv_tensor *x = qkv_randn(ctx, QKV_F64, 3, shape, 0.0, cfg->scale);
    cr_assert_not_null(x, "%s", qkv_errmsg(ctx));
    double *v = qkv_f64(x);
    for (int64_t i = 0; i < x->numel; i++) {
        switch (cfg->values) {
        case V_TIES: v[i] = round(v[i]); break; /* many equal scores */
        case V_PM80: v[i] = -80.0 + 160.0 * urand(); break;
        case V_NEAR_P80: v[i] = 80.0 + 0.5 * v[i]; break;
        case V_NEAR_M80: v[i] = -80.0 + 0.5 * v[i]; break;
        default: break;
        }
    }
    sm_user *u = user;
    *u = (sm_user){make_mask(ctx, cfg), cfg->flags, cfg->heads};
    if (cfg->values == V_NAN_DROPPED) { /* plant NaN/inf wherever the rule drops a score */
        const double junk[3] = {NAN, INFINITY, -INFINITY};
        for (int64_t b = 0; b < cfg->B; b++)
            for (int64_t i = 0; i < cfg->n_q; i++)
                for (int64_t j = 0; j < cfg->n_k; j++)
                    if (!keep_of(u->mask, cfg->flags & QKV_CAUSAL, cfg->B, cfg->n_q, cfg->n_k, b, i, j))
                        v[(b * cfg->n_q + i) * cfg->n_k + j] = junk[(i + j) % 3];
    }
    in[0] = x;
    return 1;
}

static void sm_name(char *buf, size_t size, int c, const void *user) {
    (void)user;
    const sm_config *cfg = &SM_CONFIGS[c];
    snprintf(buf, size, "softmax config %d (B %lld, n_q %lld, n_k %lld, mask kind %d, flags %d, values %d, "
             "scale %g, heads %d)",
             c, (long long)cfg->B, (long long)cfg->n_q, (long long)cfg->n_k, cfg->mask, cfg->flags, cfg->values,
             cfg->scale, cfg->heads);
}

Test(softmax, gradcheck_over_25_configurations) {
    int n_configs = (int)(sizeof SM_CONFIGS / sizeof SM_CONFIGS[0]);
    cr_assert(n_configs >= 20);
    sm_user u;
    gradcheck_table t = {n_configs, 1000, sm_build, sm_name, softmax_fn, &u, NULL};
    check_gradcheck_table(&t, 500);
}

/* ---- errors -------------------------------------------------------------------------------------- */

typedef struct err_case {
    const char *name;
    qkv_status status;
    const char *frag[4]; /* message fragments, NULL-terminated */
} err_case;

static void expect_error(qkv_ctx *ctx, const qkv_tensor *result, const err_case *e) {
    cr_expect_null(result, "%s: a result despite the error", e->name);
    cr_expect_eq(qkv_error(ctx), e->status, "%s: status %s, want %s (%s)", e->name,
                 qkv_status_name(qkv_error(ctx)), qkv_status_name(e->status), qkv_errmsg(ctx));
    for (int i = 0; i < 4 && e->frag[i]; i++)
        cr_expect(strstr(qkv_errmsg(ctx), e->frag[i]) != NULL, "%s: message \"%s\" lacks \"%s\"", e->name,
                  qkv_errmsg(ctx), e->frag[i]);
}

Test(softmax, errors) {
    const int64_t s234[3] = {2, 3, 4};
    struct {
        err_case e;
        int mask_dtype; /* -1: no mask */
        int mask_ndim;
        int64_t mask_shape[3];
        int flags;
        int scores_kind; /* 0 f64 [2,3,4], 1 i32, 2 1-D [4], 3 4-D, 4 NULL */
    } cases[] = {
        {{"scores NULL", QKV_ERR_NULL, {"qkv_softmax", "scores", NULL}},
         -1, 0, {0}, 0, 4},
        {{"scores i32", QKV_ERR_DTYPE, {"qkv_softmax", "[2,3,4]", "i32", NULL}},
         -1, 0, {0}, 0, 1},
        {{"scores 1-D", QKV_ERR_RANK, {"qkv_softmax", "[4]", NULL}},
         -1, 0, {0}, 0, 2},
        {{"scores 4-D", QKV_ERR_RANK, {"qkv_softmax", "[1,2,3,4]", NULL}},
         -1, 0, {0}, 0, 3},
        {{"unknown flag", QKV_ERR_ARG, {"qkv_softmax", "flags", "[2,3,4]", NULL}},
         -1, 0, {0}, 2, 0},
        {{"negative flags", QKV_ERR_ARG, {"qkv_softmax", "flags", NULL}},
         -1, 0, {0}, -1, 0},
        {{"mask f32", QKV_ERR_DTYPE, {"qkv_softmax", "[2,3,4]", "u8", "f32"}},
         QKV_F32, 3, {2, 3, 4}, 0, 0},
        {{"mask i32", QKV_ERR_DTYPE, {"qkv_softmax", "mask", "i32", NULL}},
         QKV_I32, 3, {2, 3, 4}, 0, 0},
        {{"mask 1-D", QKV_ERR_RANK, {"qkv_softmax", "[2,3,4]", "[4]", NULL}},
         QKV_U8, 1, {4}, 0, 0},
        {{"mask n_k", QKV_ERR_SHAPE, {"[2,3,4]", "[2,3,5]", "is 5", "n_k = 4"}},
         QKV_U8, 3, {2, 3, 5}, 0, 0},
        {{"2-D mask n_k", QKV_ERR_SHAPE, {"qkv_softmax", "[2,3,4]", "[3,6]", "is 6"}},
         QKV_U8, 2, {3, 6}, 0, 0},
        {{"mask n_q", QKV_ERR_SHAPE, {"qkv_softmax", "[2,3,4]", "[2,2,4]", "n_q = 3"}},
         QKV_U8, 3, {2, 2, 4}, 0, 0},
        {{"2-D mask of one row", QKV_ERR_SHAPE, {"[2,3,4]", "[1,4]", "n_q = 3", NULL}},
         QKV_U8, 2, {1, 4}, 0, 0},
        {{"mask batch", QKV_ERR_SHAPE, {"qkv_softmax", "[2,3,4]", "[3,3,4]", "does not divide"}},
         QKV_U8, 3, {3, 3, 4}, 0, 0},
        {{"mask batch 0", QKV_ERR_SHAPE, {"qkv_softmax", "[0,1,4]", NULL}},
         QKV_U8, 3, {0, 1, 4}, 0, 0},
        {{"padding mask batch", QKV_ERR_SHAPE, {"[2,3,4]", "[4,1,4]", "4", NULL}},
         QKV_U8, 3, {4, 1, 4}, 0, 0},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int c = 0; c < n; c++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *s = NULL;
        switch (cases[c].scores_kind) {
        case 0: s = qkv_zeros(ctx, QKV_F64, 3, s234); break;
        case 1: s = qkv_zeros(ctx, QKV_I32, 3, s234); break;
        case 2: s = qkv_zeros(ctx, QKV_F64, 1, (int64_t[]){4}); break;
        case 3: s = qkv_zeros(ctx, QKV_F64, 4, (int64_t[]){1, 2, 3, 4}); break;
        default: break;
        }
        qkv_tensor *m = NULL;
        if (cases[c].mask_dtype >= 0)
            m = qkv_zeros(ctx, (qkv_dtype)cases[c].mask_dtype, cases[c].mask_ndim, cases[c].mask_shape);
        cr_assert_eq(qkv_error(ctx), QKV_OK);
        expect_error(ctx, qkv_softmax(ctx, s, m, cases[c].flags), &cases[c].e);
        /* sticky: a good call afterwards returns NULL and keeps the first message */
        char msg[600];
        snprintf(msg, sizeof msg, "%s", qkv_errmsg(ctx));
        cr_expect_null(qkv_softmax(ctx, qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){2, 2}), NULL, 0));
        cr_expect_str_eq(qkv_errmsg(ctx), msg);
        qkv_ctx_free(ctx);
    }
    cr_expect_null(qkv_softmax(NULL, NULL, NULL, 0), "a NULL context is not dereferenced");
}

Test(softmax, no_node_without_grad_and_bounds_of_valid_masks) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *s = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){6, 2, 3}, 0, 1);
    /* Bm = 3 divides B = 6; rows 1 in a 3-D mask; a 3-D mask over 2-D scores with Bm = 1 */
    qkv_tensor *a = qkv_softmax(ctx, s, qkv_ones(ctx, QKV_U8, 3, (int64_t[]){3, 1, 3}), 0);
    cr_expect_not_null(a, "%s", qkv_errmsg(ctx));
    cr_expect(a && !a->requires_grad, "no input requires grad, so no node");
    qkv_tensor *s2 = qkv_randn(ctx, QKV_F64, 2, (int64_t[]){2, 3}, 0, 1);
    a = qkv_softmax(ctx, s2, qkv_ones(ctx, QKV_U8, 3, (int64_t[]){1, 2, 3}), 0);
    cr_expect_not_null(a, "%s", qkv_errmsg(ctx));
    cr_expect(a && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 3);
    /* empty rows (n_k = 0) and an empty batch are legal and produce empty results */
    a = qkv_softmax(ctx, qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){2, 3, 0}), NULL, QKV_CAUSAL);
    cr_expect(a && a->numel == 0, "%s", qkv_errmsg(ctx));
    a = qkv_softmax(ctx, qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){0, 3, 4}), NULL, 0);
    cr_expect(a && a->numel == 0, "%s", qkv_errmsg(ctx));
    cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

/* Any nonzero mask byte keeps, not only 1 (qkv.h): a mask of bytes 1, 2, 127, 128, 255 gives the bits of
 * the same mask written with 1s, in qkv_softmax and in qkv_attention (fused, on the tiled path of every
 * kernel set this CPU has, and composed), forward and backward, f32 and f64. */
Test(softmax, any_nonzero_mask_byte_keeps) {
    const uint8_t keeps[5] = {1, 2, 127, 128, 255};
    for (int isa = -1; isa < QKV_ISA_COUNT_; isa++) {
        if (isa >= 0 && !qkv_attn_force_isa_(isa)) continue;
        for (int dt = 0; dt < 2; dt++)
            for (int op = 0; op < 3; op++) { /* softmax, fused attention, composed attention */
                qkv_tensor *res[2][3];
                qkv_ctx *ctxs[2];
                for (int odd = 0; odd < 2; odd++) {
                    qkv_options o = qkv_default_options();
                    o.seed = 31;
                    qkv_ctx *ctx = ctxs[odd] = qkv_ctx_new(&o);
                    qkv_dtype t = dt ? QKV_F64 : QKV_F32;
                    int64_t B = 2, n_q = 5, n_k = 37, d = 3;
                    qkv_tensor *m = qkv_zeros(ctx, QKV_U8, 3, (int64_t[]){B, n_q, n_k});
                    for (int64_t e = 0; e < m->numel; e++)
                        if (e % 3 != 1) qkv_u8(m)[e] = odd ? keeps[e % 5] : 1;
                    qkv_tensor *x = qkv_randn(ctx, t, 3, (int64_t[]){B, n_q, op ? d : n_k}, 0, 2);
                    qkv_tensor *k = qkv_randn(ctx, t, 3, (int64_t[]){B, n_k, d}, 0, 1);
                    qkv_tensor *v = qkv_randn(ctx, t, 3, (int64_t[]){B, n_k, d}, 0, 1);
                    qkv_set_requires_grad(ctx, x, true);
                    qkv_set_requires_grad(ctx, k, true);
                    qkv_tensor *attn = NULL;
                    qkv_tensor *y = op == 0 ? qkv_softmax(ctx, x, m, 0)
                                   : op == 1 ? qkv_attention(ctx, x, k, v, m, QKV_SCALE_DEFAULT, 0, NULL)
                                             : qkv_attention_composed_(ctx, "composed", x, k, v, m, QKV_SCALE_DEFAULT,
                                                                       0, &attn);
                    cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
                    cr_assert_eq(qkv_backward(ctx, y, qkv_randn(ctx, t, 3, y->shape, 0, 1)), QKV_OK);
                    res[odd][0] = y, res[odd][1] = x->grad, res[odd][2] = op ? k->grad : x->grad;
                }
                int differ = 0;
                for (int r = 0; r < 3; r++)
                    differ += memcmp(res[0][r]->data, res[1][r]->data,
                                     (size_t)res[0][r]->numel * qkv_dtype_size(res[0][r]->dtype)) != 0;
                cr_expect_eq(differ, 0, "kernels %s, %s, op %d: bytes 2-255 do not keep as 1 does",
                             qkv_attn_kernels_()->name, dt ? "f64" : "f32", op);
                qkv_ctx_free(ctxs[0]), qkv_ctx_free(ctxs[1]);
            }
    }
    qkv_attn_force_isa_(-1);
}

/* A row with every key kept and a length that is a multiple of 8 takes the row kernel's maskless path (AVX2:
 * softmax_row_whole); it must give the bits of the masked path, which an all-ones mask forces: ordinary,
 * saturated and tied rows, rows with -inf, +inf and NaN, one whose maximum is -inf, for n = 8, 64 and 2048. */
Test(softmax, a_whole_row_has_the_bits_of_the_masked_path) {
    const int64_t lengths[3] = {8, 64, 2048};
    for (int l = 0; l < 3; l++) {
        int64_t n = lengths[l], rows = 7;
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *s = qkv_randn(ctx, QKV_F32, 2, (int64_t[]){rows, n}, 0, 3);
        qkv_tensor *ones = qkv_full(ctx, QKV_U8, 2, (int64_t[]){rows, n}, 1);
        cr_assert_not_null(ones, "%s", qkv_errmsg(ctx));
        float *v = qkv_f32(s);
        for (int64_t j = 0; j < n; j++) {
            v[1 * n + j] *= 100.0f;                        // saturated: exps far below the flush point
            v[2 * n + j] = (float)(j % 3);                  // ties
            v[6 * n + j] = -INFINITY;                       // nothing finite
        }
        v[3 * n + n / 2] = -INFINITY;
        v[4 * n + 1] = INFINITY;
        v[5 * n + n - 1] = NAN;
        qkv_tensor *whole = qkv_softmax(ctx, s, NULL, 0), *masked = qkv_softmax(ctx, s, ones, 0);
        cr_assert(whole && masked, "%s", qkv_errmsg(ctx));
        for (int64_t r = 0; r < rows; r++)
            cr_expect(memcmp(qkv_f32(whole) + r * n, qkv_f32(masked) + r * n, (size_t)n * sizeof(float)) == 0,
                      "n %lld row %lld: the maskless path differs from the masked one", (long long)n, (long long)r);
        qkv_ctx_free(ctx);
    }
}
