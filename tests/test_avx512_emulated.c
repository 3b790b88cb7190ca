/*
 * test_avx512_emulated.c — the AVX-512 kernels (ops/kernels/gemm_avx512.c, attention_avx512.c) on a CPU
 * without AVX-512: the same sources compiled through SIMDe's emulation of the AVX-512 intrinsics
 * (tests/avx512_emulation.h, tests/meson.build), entry points qkv_emu_*, against the portable kernels, on the
 * cases of test_kernels.c and test_fused.c, at their bars:
 *   - the packed GEMM (12 x 32 tiles, masked edges, direct A) and the small unpacked path with its register
 *     transpose against a double oracle, ||C - C_ref||_F / ||M||_F < 1e-5 (test_kernels.c's bar, M the sum of
 *     absolute products), the portable packed GEMM on the same operands within twice that, nothing written
 *     past C;
 *   - the fused attention as an AVX-512 CPU runs it: ops/attention.c compiled again (qkv_emu_attention_)
 *     with the emulated kernel set and, for its products, qkv_emu_gemm_f32_ below (qkv_gemm_f32_'s choice on
 *     an AVX-512 CPU, with the emulated kernels). Forward and the three gradients against composed within
 *     1e-5, beside the portable set (qkv_attention with the portable set forced) on the same inputs; masks of
 *     every kind with fully masked rows, causal, several key tiles; the short path (n_k <= 16, d <= 32)
 *     against f64 and the tiled path; inf / NaN in a dropped key's K or V row reaching neither out nor dq;
 *     exact zeros for fully masked rows; a NaN query row; the softmax row kernels against a double oracle;
 *   - the f64 fused attention with the AVX-512 f64 row kernels (attention_f64_avx512.c, the driver picks them
 *     with the emulated f32 set) against composed within 1e-12;
 *   - the exact GELU's and the layer norm's AVX-512 kernels (gelu_avx512.c, layer_norm_avx512.c) bit for bit
 *     against the portable ones.
 * Emulation is slow (the 512-bit operations are SIMDe's, two AVX2 halves or lane loops), so the cases are a
 * subset of those files' sizes. Needs AVX2 + FMA (the emulation's halves); skipped without.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv_internal.h"

#include "../ops/kernels/attention_f64_kernels.h"
#include "../ops/kernels/attention_kernels.h"
#include "../ops/kernels/gelu_kernels.h"
#include "../ops/kernels/gemm_kernels.h"
#include "../ops/kernels/layer_norm_kernels.h"
#include "gemm_cases.h" /* the GEMM checks of test_kernels.c */
#include "fused_cases.h" /* the configurations, masks and differences of test_fused.c */
#include "elementwise_cases.h" /* GELU and layer-norm sets compared bit for bit */
#include "test_deadline.h"
#include "variant_kernel_cases.h" /* the variants' tile kernels against the portable set's */

/* ---- the emulated build's entry points (tests/avx512_emulation.h renames them) -------------------- */

bool qkv_emu_gemm_f32_avx512_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                              bool trans_a, bool trans_b, bool accumulate, float *apack, float *bpack);
bool qkv_emu_gemm_f32_small_avx512_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                                    bool trans_a, bool accumulate);
void qkv_emu_transpose_f32_avx512_(const float *src, int64_t rows, int64_t cols, float *dst);
extern const qkv_attn_kernel_set_ qkv_emu_attn_kernels_avx512_;
extern const qkv_attn_f64_kernels_ qkv_emu_attn_f64_kernels_avx512_;
extern const qkv_gelu_kernel_set_ qkv_emu_gelu_kernels_avx512_;
extern const qkv_layer_norm_kernel_set_ qkv_emu_layer_norm_kernels_avx512_;
/* ops/attention.c's qkv_attention, compiled with the emulated kernels (tests/meson.build) */
qkv_tensor *qkv_emu_attention_(qkv_ctx *ctx, qkv_tensor *q, qkv_tensor *k, qkv_tensor *v, const qkv_tensor *mask,
                               double scale, int flags, qkv_tensor **attn);

/* The emulated GEMMs' packing buffers. Every context here runs one thread, so one block serves. */
static _Alignas(64) float pack_block[QKV_GEMM_APACK + QKV_GEMM_BPACK];

/* The emulated small path, as qkv_gemm_f32_small_isa_ (ops/gemm.c) takes it on an AVX-512 CPU: a B stored
 * [p, k] transposed first by the AVX-512 transpose into the packing block. */
static bool emu_small(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p, bool ta, bool tb,
                      bool acc) {
    if (k * p > 4096) return false;
    if (tb) {
        qkv_emu_transpose_f32_avx512_(b, p, k, pack_block);
        b = pack_block;
    }
    return qkv_emu_gemm_f32_small_avx512_(a, b, c, m, k, p, ta, acc);
}

/* What qkv_gemm_f32_ (ops/gemm.c) does on an AVX-512 CPU, with the emulated kernels; the fused attention
 * compiled for this test calls it for its products. op(B) of at most 4096 floats (QKV_GEMM_SMALL_B): the
 * small path, with AVX2's tiles when p <= 8 (the library's, native here: an AVX-512 CPU has AVX2); else
 * below 512 multiply-adds (QKV_GEMM_SMALL) or one row of an untransposed B, the reference loops; else the
 * packed GEMM with the AVX-512 micro-kernel. Mirrors ops/gemm.c: keep the two in step. */
void qkv_emu_gemm_f32_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p, bool trans_a,
                       bool trans_b, bool accumulate);
void qkv_emu_gemm_f32_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p, bool trans_a,
                       bool trans_b, bool accumulate) {
    if (m <= 0 || p <= 0) return;
    if (k > 0 && k * p <= QKV_GEMM_SMALL_B) { /* ops/gemm.c's dispatch, with the emulated kernels */
        if (p <= 8 && qkv_gemm_f32_small_isa_(QKV_ISA_AVX2_, a, b, c, m, k, p, trans_a, trans_b, accumulate)) return;
        if (p > 8 && emu_small(a, b, c, m, k, p, trans_a, trans_b, accumulate)) return;
    }
    if (k <= 0 || (double)m * (double)k * (double)p < QKV_GEMM_SMALL || (m == 1 && !trans_b) ||
        !qkv_emu_gemm_f32_avx512_(a, b, c, m, k, p, trans_a, trans_b, accumulate, pack_block,
                                  pack_block + QKV_GEMM_APACK))
        qkv_gemm_f32_ref_(a, b, c, m, k, p, trans_a, trans_b, accumulate);
}

/* The kernel set the emulated attention driver runs. */
const qkv_attn_kernel_set_ *qkv_emu_attn_kernels_(void);
const qkv_attn_kernel_set_ *qkv_emu_attn_kernels_(void) { return &qkv_emu_attn_kernels_avx512_; }

static void need_avx2(void) {
    if (!qkv_isa_supported_(QKV_ISA_AVX2_)) cr_skip_test("the emulation runs on AVX2 + FMA, which this CPU lacks");
}

static void need_attention(void) {
    need_avx2();
    if (!qkv_emu_attn_kernels_avx512_.available) cr_skip_test("built without SLEEF: no AVX-512 attention kernels");
}

/* ---- GEMM ---------------------------------------------------------------------------------------- */


enum { EMU_PACKED, EMU_SMALL };

typedef struct tally {
    long cases, failures;
    double worst, worst_vs_portable;
    int64_t wm, wk, wp;
    int wflags;
} tally;

/* One GEMM through the emulated kernel (packed or small path) with fresh random operands: against the double
 * oracle (TOL) and the portable packed GEMM on the same operands (2 TOL), norm-wise relative to the sum of
 * absolute products; nothing written past C, no NaN left from the NaN-filled C of a non-accumulating call. */
static void check_one(tally *t, int path, int64_t m, int64_t k, int64_t p, int flags) {
    bool ta = flags & 1, tb = flags & 2, acc = flags & 4;
    float *a = rand_array(m * k), *b = rand_array(k * p);
    float *c = malloc((size_t)(m * p + GUARD) * sizeof *c), *cp = malloc((size_t)(m * p) * sizeof *cp);
    double *ref = malloc((size_t)(m * p) * sizeof *ref), *mag = malloc((size_t)(m * p) * sizeof *mag);
    cr_assert(c && cp && ref && mag);
    for (int64_t i = 0; i < m * p; i++) c[i] = cp[i] = acc ? frand() : NAN; /* without accumulate C is never read */
    for (int i = 0; i < GUARD; i++) c[m * p + i] = 12345.0f;
    gemm_oracle(a, b, c, ref, mag, m, k, p, ta, tb, acc);
    bool ran = path == EMU_SMALL ? emu_small(a, b, c, m, k, p, ta, tb, acc)
                                 : qkv_emu_gemm_f32_avx512_(a, b, c, m, k, p, ta, tb, acc, pack_block,
                                                            pack_block + QKV_GEMM_APACK);
    qkv_gemm_f32_isa_(QKV_ISA_PORTABLE_, a, b, cp, m, k, p, ta, tb, acc);
    double num = 0.0, num_p = 0.0, den = 0.0;
    bool finite = true, guard_ok = true;
    for (int64_t i = 0; i < m * p; i++) {
        finite = finite && isfinite(c[i]);
        num += ((double)c[i] - ref[i]) * ((double)c[i] - ref[i]);
        num_p += ((double)c[i] - cp[i]) * ((double)c[i] - cp[i]);
        den += mag[i] * mag[i];
    }
    double err = finite ? sqrt(num / den) : INFINITY, err_p = finite ? sqrt(num_p / den) : INFINITY;
    for (int i = 0; i < GUARD; i++) guard_ok = guard_ok && c[m * p + i] == 12345.0f;
    t->cases++;
    if (!ran || !(err < TOL) || !(err_p < 2 * TOL) || !guard_ok) t->failures++;
    t->worst_vs_portable = fmax(t->worst_vs_portable, err_p);
    if (!ran || !guard_ok || !(err <= t->worst)) {
        t->worst = ran && guard_ok ? err : INFINITY;
        t->wm = m, t->wk = k, t->wp = p, t->wflags = flags;
    }
    free(a), free(b), free(c), free(cp), free(ref), free(mag);
}

static void check_all_flags(tally *t, int path, int64_t m, int64_t k, int64_t p) {
    for (int flags = 0; flags < 8; flags++) check_one(t, path, m, k, p, flags);
}

static void report(const tally *t, const char *what) {
    cr_assert_gt(t->cases, 0);
    cr_expect_eq(t->failures, 0,
                 "emulated AVX-512 %s: %ld of %ld GEMMs failed; worst relative error %.3g at m=%lld k=%lld p=%lld "
                 "trans_a=%d trans_b=%d accumulate=%d (a GEMM the kernel declined or that wrote past C counts inf)",
                 what, t->failures, t->cases, t->worst, (long long)t->wm, (long long)t->wk, (long long)t->wp,
                 t->wflags & 1, (t->wflags >> 1) & 1, (t->wflags >> 2) & 1);
    if (getenv("QKV_EMU_VERBOSE"))
        fprintf(stderr, "%s: %ld GEMMs, worst %.3g against double, %.3g against portable\n", what, t->cases,
                t->worst, t->worst_vs_portable);
}

/* m, k, p each over odd sizes with the other two at odd values, and cubes (test_kernels.c's odd sizes). */
Test(avx512_emulated, gemm_odd_sizes) {
    need_avx2();
    static const int64_t sizes[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 64, 65, 127, 129, 255, 257};
    tally t = {0};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        check_all_flags(&t, EMU_PACKED, n, 17, 33);
        check_all_flags(&t, EMU_PACKED, 33, n, 17);
        check_all_flags(&t, EMU_PACKED, 17, 33, n);
        check_all_flags(&t, EMU_PACKED, n, n, n);
    }
    report(&t, "packed GEMM, odd sizes");
}

/* Every (m, k, p) of small and tile-edge sizes: full and partial 12-row and 32-column tiles, 16-column halves. */
Test(avx512_emulated, gemm_all_small_shapes) {
    need_avx2();
    static const int64_t sizes[] = {1, 2, 3, 7, 12, 16, 17, 33, 65};
    const int n = (int)(sizeof sizes / sizeof sizes[0]);
    tally t = {0};
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            for (int l = 0; l < n; l++) check_all_flags(&t, EMU_PACKED, sizes[i], sizes[j], sizes[l]);
    report(&t, "packed GEMM, small shapes");
}

/* Past one cache block in every direction (MC 48 rows, KC 256 deep, KC * NC floats of packed B), the
 * attention products at n = 128, d = 64, and p <= 128 with narrow rows (A read in place, the direct path). */
Test(avx512_emulated, gemm_cache_blocks_and_direct_a) {
    QKV_TEST_DEADLINE(300);
    need_avx2();
    tally t = {0};
    check_all_flags(&t, EMU_PACKED, 60, 300, 530);
    check_all_flags(&t, EMU_PACKED, 20, 64, 2100);
    check_all_flags(&t, EMU_PACKED, 100, 385, 70);
    check_all_flags(&t, EMU_PACKED, 128, 64, 128); /* Q K^T */
    check_all_flags(&t, EMU_PACKED, 128, 128, 64); /* A V */
    check_all_flags(&t, EMU_PACKED, 37, 1000, 64);
    report(&t, "packed GEMM, cache blocks");
}

/* The small path (op(B) of at most 4096 floats, A and B read in place): rows past several 12-row tiles,
 * columns past 16 and 32, the largest op(B) it takes. */
Test(avx512_emulated, gemm_small_path) {
    need_avx2();
    static const int64_t rows[] = {1, 2, 3, 5, 8, 12, 13, 25, 33};
    static const int64_t sizes[] = {1, 2, 3, 7, 9, 15, 16, 17, 31, 32, 33, 64, 65, 256, 4096};
    tally t = {0};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        for (size_t j = 0; j < sizeof sizes / sizeof sizes[0]; j++)
            for (size_t l = 0; l < sizeof sizes / sizeof sizes[0]; l++)
                if (sizes[j] * sizes[l] <= 4096) check_all_flags(&t, EMU_SMALL, rows[i], sizes[j], sizes[l]);
    report(&t, "small path");
}

/* The register transpose against the definition, around its 16-wide blocks, nothing past the destination. */
Test(avx512_emulated, transpose) {
    need_avx2();
    static const int64_t sizes[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 64};
    const int n = (int)(sizeof sizes / sizeof sizes[0]);
    int tried = 0, bad = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            int64_t rows = sizes[i], cols = sizes[j];
            float *src = rand_array(rows * cols), *dst = malloc((size_t)(rows * cols + GUARD) * sizeof *dst);
            cr_assert_not_null(dst);
            for (int64_t e = 0; e < rows * cols + GUARD; e++) dst[e] = -7.0f;
            qkv_emu_transpose_f32_avx512_(src, rows, cols, dst);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++) bad += dst[c * rows + r] != src[r * cols + c];
            for (int g = 0; g < GUARD; g++) bad += dst[rows * cols + g] != -7.0f;
            tried++;
            free(src), free(dst);
        }
    cr_expect_eq(bad, 0, "%d wrong or stray elements over %d transposes", bad, tried);
}

/* Same inputs, same bits, on the packed and the small path; and on an AVX-512 CPU the emulation gives the
 * bits of the real kernel. */
Test(avx512_emulated, gemm_deterministic_and_like_the_real_kernel) {
    need_avx2();
    const int64_t m = 50, k = 70, p = 90;
    float *a = rand_array(m * k), *b = rand_array(k * p), *c[3];
    for (int r = 0; r < 3; r++) c[r] = calloc((size_t)(m * p), sizeof(float));
    cr_assert(c[0] && c[1] && c[2]);
    qkv_emu_gemm_f32_avx512_(a, b, c[0], m, k, p, false, true, false, pack_block, pack_block + QKV_GEMM_APACK);
    qkv_emu_gemm_f32_avx512_(a, b, c[1], m, k, p, false, true, false, pack_block, pack_block + QKV_GEMM_APACK);
    cr_expect(!memcmp(c[0], c[1], (size_t)(m * p) * sizeof(float)), "two calls gave different bits");
    if (qkv_isa_supported_(QKV_ISA_AVX512_)) {
        qkv_gemm_f32_isa_(QKV_ISA_AVX512_, a, b, c[2], m, k, p, false, true, false);
        cr_expect(!memcmp(c[0], c[2], (size_t)(m * p) * sizeof(float)), "the emulation differs from the CPU's AVX-512");
    }
    for (int r = 0; r < 3; r++) free(c[r]);
    free(a), free(b);
}

/* ---- fused attention ------------------------------------------------------------------------------ */

/* Which attention a run takes. */
typedef enum { EMULATED, PORTABLE, COMPOSED } path;

/* The attention of one path: EMULATED the AVX-512 driver and kernels through the emulation, PORTABLE the
 * library's fused path with the portable kernel set forced, COMPOSED the operators (the reference). */
static qkv_tensor *attention(path which, qkv_ctx *ctx, qkv_tensor *q, qkv_tensor *k, qkv_tensor *v,
                             const qkv_tensor *mask, double scale, int flags) {
    qkv_tensor *attn = NULL, *out = NULL;
    if (which == EMULATED) {
        out = qkv_emu_attention_(ctx, q, k, v, mask, scale, flags, NULL);
    } else if (which == PORTABLE) {
        cr_assert(qkv_attn_force_isa_(QKV_ISA_PORTABLE_));
        out = qkv_attention(ctx, q, k, v, mask, scale, flags, NULL);
        qkv_attn_force_isa_(-1);
    } else {
        out = qkv_attention_composed_(ctx, "composed", q, k, v, mask, scale, flags, &attn);
    }
    cr_assert_not_null(out, "%s", qkv_errmsg(ctx));
    return out;
}

/* Forward and backward (dloss random) of one configuration in a fresh one-thread context seeded with seed. */
static run do_run(const cfg *c, qkv_dtype dt, path which, uint64_t seed) {
    qkv_options o = qkv_default_options();
    o.seed = seed;
    o.threads = 1;
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
    r.out = attention(which, ctx, r.q, r.k, r.v, r.mask, c->scale, c->causal ? QKV_CAUSAL : 0);
    qkv_backward(ctx, r.out, dout);
    cr_assert_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    return r;
}

/* test_fused.c's odd-size configurations (n 1, 7, 33, 65, 130 against d 1, 3, 16, 64, every mask kind, causal
 * every other one, batch 1-3, a third non-square; the short path takes those without a mask and n_k <= 16),
 * and a few of its longer ones: several key tiles of the forward (256) and backward (128), two query blocks,
 * decoding rows, many queries over few keys. */
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
        {1, 70, 600, 16, 8, M_NONE, false, QKV_SCALE_DEFAULT, 1},   {1, 150, 150, 8, 8, M_NONE, true, QKV_SCALE_DEFAULT, 1},
        {2, 40, 520, 4, 5, M_LATE, false, QKV_SCALE_DEFAULT, 1},    {3, 33, 530, 3, 3, M_PAD, false, QKV_SCALE_DEFAULT, 1},
        {1, 140, 270, 16, 16, M_FULL, true, QKV_SCALE_DEFAULT, 1},  {2, 257, 129, 7, 9, M_BM1, false, 0.3, 1},
        {1, 65, 300, 64, 64, M_NONE, false, QKV_SCALE_DEFAULT, 3},  {1, 7, 1000, 5, 3, M_PAD_BM1, false, 1.0, 2},
        {3, 1, 600, 64, 64, M_NONE, false, QKV_SCALE_DEFAULT, 1},   {1, 4, 300, 5, 67, M_2D, true, QKV_SCALE_DEFAULT, 1},
        {2, 5, 129, 33, 31, M_BM1, false, QKV_SCALE_DEFAULT, 1},    {1, 300, 16, 64, 64, M_NONE, false, QKV_SCALE_DEFAULT, 1},
        {2, 200, 9, 12, 67, M_LATE, false, QKV_SCALE_DEFAULT, 1},   {1, 129, 513, 2, 2, M_2D, true, QKV_SCALE_DEFAULT, 1},
        {1, 200, 200, 1, 1, M_LATE, true, QKV_SCALE_DEFAULT, 1},    {3, 3, 530, 70, 9, M_PAD, false, QKV_SCALE_DEFAULT, 2},
        {2, 2, 257, 16, 16, M_LATE, false, 0.7, 1},
    };
    for (size_t i = 0; i < sizeof longer / sizeof longer[0]; i++)
        if (count < cap) out[count++] = longer[i];
    return count;
}

/* Emulated AVX-512 against composed within 1e-5 (test_fused.c's bar for every kernel set), and the portable
 * set against composed on the same inputs; the two fused paths within 2e-5 of each other. */
Test(avx512_emulated, fused_matches_composed_and_the_portable_set) {
    QKV_TEST_DEADLINE(300);
    need_attention();
    cfg cs[64];
    int n = make_configs(cs, 64), failed = 0;
    double worst_e = 0, worst_p = 0, worst_ep = 0;
    for (int i = 0; i < n; i++) {
        run e = do_run(&cs[i], QKV_F32, EMULATED, 500 + (uint64_t)i);
        run p = do_run(&cs[i], QKV_F32, PORTABLE, 500 + (uint64_t)i);
        run c = do_run(&cs[i], QKV_F32, COMPOSED, 500 + (uint64_t)i);
        double we = worst_diff(&e, &c), wp = worst_diff(&p, &c), wep = worst_diff(&e, &p);
        worst_e = fmax(worst_e, we), worst_p = fmax(worst_p, wp), worst_ep = fmax(worst_ep, wep);
        if (getenv("QKV_EMU_VERBOSE")) fprintf(stderr, "cfg %d: emulated %.3g portable %.3g e-p %.3g\n", i, we, wp, wep);
        if (!(we <= 1e-5) || !(wp <= 1e-5) || !(wep <= 2e-5)) {
            char d[160];
            describe(&cs[i], d, sizeof d);
            if (failed++ < 5)
                cr_log_error("%s: emulated AVX-512 off composed by %.3g, portable by %.3g, the two by %.3g", d, we, wp,
                             wep);
        }
        qkv_ctx_free(e.ctx), qkv_ctx_free(p.ctx), qkv_ctx_free(c.ctx);
    }
    cr_expect_geq(n, 30);
    cr_expect_eq(failed, 0, "%d of %d configurations off (worst: emulated %.3g, portable %.3g, between %.3g)", failed,
                 n, worst_e, worst_p, worst_ep);
}

/* f64: the emulated driver takes the AVX-512 f64 row kernels with its AVX-512 f32 set; against composed
 * within 1e-12 (test_fused.c's f64 bar) on the same configurations. */
Test(avx512_emulated, fused_f64_matches_composed) {
    QKV_TEST_DEADLINE(300);
    need_attention();
    cr_assert(qkv_emu_attn_f64_kernels_avx512_.available, "the emulated f64 set was not built");
    cfg cs[64];
    int n = make_configs(cs, 64), failed = 0;
    double worst = 0;
    for (int i = 0; i < n; i++) {
        run e = do_run(&cs[i], QKV_F64, EMULATED, 700 + (uint64_t)i);
        run c = do_run(&cs[i], QKV_F64, COMPOSED, 700 + (uint64_t)i);
        double w = worst_diff(&e, &c);
        worst = fmax(worst, w);
        if (!(w <= 1e-12)) {
            char d[160];
            describe(&cs[i], d, sizeof d);
            if (failed++ < 5) cr_log_error("%s f64: emulated AVX-512 off composed by %.3g", d, w);
        }
        qkv_ctx_free(e.ctx), qkv_ctx_free(c.ctx);
    }
    cr_expect_eq(failed, 0, "%d of %d f64 configurations off (worst %.3g)", failed, n, worst);
}

/* ---- the elementwise kernels: GELU and layer norm ---------------------------------------------------- */

/* The emulated AVX-512 exact GELU gives the portable set's bits (tests/elementwise_cases.h) over x in [-20, 20]
 * by 2^-8 and the special values. */
Test(avx512_emulated, gelu_matches_portable_bit_for_bit) {
    need_avx2();
    const qkv_gelu_kernel_set_ *p = qkv_gelu_kernels_isa_(QKV_ISA_PORTABLE_);
    cr_assert(p && qkv_emu_gelu_kernels_avx512_.available);
    enum { N = 10241 + 8 };
    static float x[N];
    for (int i = 0; i < 10241; i++) x[i] = (float)(-20.0 + i / 256.0);
    const float specials[8] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 0x1p-149f, -3.0f, 6.0f};
    memcpy(x + 10241, specials, sizeof specials);
    int64_t differ = gelu_sets_differ(p, &qkv_emu_gelu_kernels_avx512_, x, N);
    cr_expect_eq(differ, 0, "%lld values differ", (long long)differ);
}

/* The emulated AVX-512 layer-norm kernels give the portable ones' bits (tests/elementwise_cases.h). */
Test(avx512_emulated, layer_norm_matches_portable_bit_for_bit) {
    need_avx2();
    const qkv_layer_norm_kernel_set_ *p = qkv_layer_norm_kernels_isa_(QKV_ISA_PORTABLE_);
    cr_assert(p && qkv_emu_layer_norm_kernels_avx512_.available);
    int cases = 0, differ = layer_norm_sets_differ(p, &qkv_emu_layer_norm_kernels_avx512_, &cases);
    cr_expect_eq(differ, 0, "%d of %d cases differ", differ, cases);
}

/* test_fused.c's short configurations (n_k 1 .. 16, d_k and d_v 1 .. 33, any n_q, causal or not, three
 * scales, spreads up to 3), and partly full second blocks of 16 columns. */
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
    const cfg partial[] = {{2, 9, 8, 20, 12, M_NONE, true, QKV_SCALE_DEFAULT, 1}, {1, 3, 5, 24, 30, M_NONE, false, 0.3, 1},
                           {2, 6, 12, 28, 19, M_NONE, false, QKV_SCALE_DEFAULT, 1}};
    for (size_t i = 0; i < sizeof partial / sizeof partial[0]; i++)
        if (count < cap) out[count++] = partial[i];
    return count;
}

/* The short path (the AVX-512 set's: n_k <= 16, d <= 32) and the tiled path on the same shapes (short path
 * off), both emulated, and the portable set, all against f64: the short path within 2e-5 or no more than
 * 1.5x as far as the worse of the tiled and portable ones (test_fused.c's bar, with composed there); the
 * short and tiled paths really differ somewhere in the last bits. */
Test(avx512_emulated, short_sequences_match_f64_the_tiled_path_and_portable) {
    need_attention();
    cfg cs[32];
    int n = short_configs(cs, 32), failed = 0, differ_bits = 0;
    for (int i = 0; i < n; i++) {
        run s = do_run(&cs[i], QKV_F32, EMULATED, 900 + (uint64_t)i);
        qkv_attn_allow_short_(false);
        run t = do_run(&cs[i], QKV_F32, EMULATED, 900 + (uint64_t)i);
        qkv_attn_allow_short_(true);
        run p = do_run(&cs[i], QKV_F32, PORTABLE, 900 + (uint64_t)i);
        run f = do_run(&cs[i], QKV_F64, COMPOSED, 900 + (uint64_t)i);
        double err_s = worst_diff(&s, &f), err_t = worst_diff(&t, &f), err_p = worst_diff(&p, &f);
        if (getenv("QKV_EMU_VERBOSE"))
            fprintf(stderr, "short cfg %d: short %.3g tiled %.3g portable %.3g\n", i, err_s, err_t, err_p);
        if (!(err_s <= fmax(2e-5, 1.5 * fmax(err_t, err_p))) || !(err_t <= fmax(2e-5, 1.5 * err_p))) {
            char d[160];
            describe(&cs[i], d, sizeof d);
            if (failed++ < 5)
                cr_log_error("%s: off f64 by short %.3g, tiled %.3g (emulated AVX-512), portable %.3g", d, err_s,
                             err_t, err_p);
        }
        differ_bits += !same_bits(s.out, t.out) || !same_bits(s.q->grad, t.q->grad);
        qkv_ctx_free(s.ctx), qkv_ctx_free(t.ctx), qkv_ctx_free(p.ctx), qkv_ctx_free(f.ctx);
    }
    cr_expect_eq(failed, 0, "%d of %d short configurations less accurate than the portable set", failed, n);
    cr_expect_gt(differ_bits, 0, "the short and tiled paths gave identical bits everywhere");
}

/* Special values on the short path give what the tiled path gives (test_fused.c's
 * short_sequences_special_values_like_the_tiled_path): a NaN, +inf or -inf query element, 7 keys (two queries
 * a vector) and 12 (one), causal or not; only the tiled path's dK may spread a NaN into a dropped key's row. */
Test(avx512_emulated, short_special_values_like_the_tiled_path) {
    need_attention();
    const int n_ks[2] = {7, 12};
    const float specials[3] = {NAN, INFINITY, -INFINITY};
    int bad = 0, cases = 0;
    for (int ki = 0; ki < 2; ki++)
        for (int si = 0; si < 3; si++)
            for (int causal = 0; causal < 2; causal++) {
                qkv_tensor *outs[2][4];
                qkv_ctx *ctxs[2];
                for (int tiled = 0; tiled < 2; tiled++) {
                    qkv_options o = qkv_default_options();
                    o.seed = 21;
                    o.threads = 1;
                    qkv_ctx *ctx = ctxs[tiled] = qkv_ctx_new(&o);
                    qkv_tensor *q = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){2, 5, 4}, 0, 1);
                    qkv_tensor *k = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){2, n_ks[ki], 4}, 0, 1);
                    qkv_tensor *v = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){2, n_ks[ki], 3}, 0, 1);
                    qkv_f32(q)[1 * 4 + 2] = specials[si];
                    qkv_f32(q)[(5 + 4) * 4 + 0] = specials[si];
                    qkv_set_requires_grad(ctx, q, true);
                    qkv_set_requires_grad(ctx, k, true);
                    qkv_set_requires_grad(ctx, v, true);
                    qkv_attn_allow_short_(!tiled);
                    qkv_tensor *out = attention(EMULATED, ctx, q, k, v, NULL, QKV_SCALE_DEFAULT, causal ? QKV_CAUSAL : 0);
                    qkv_attn_allow_short_(true);
                    cr_assert_eq(qkv_backward(ctx, out, qkv_ones(ctx, QKV_F32, 3, out->shape)), QKV_OK, "%s",
                                 qkv_errmsg(ctx));
                    outs[tiled][0] = out, outs[tiled][1] = q->grad, outs[tiled][2] = k->grad, outs[tiled][3] = v->grad;
                }
                for (int t = 0; t < 4; t++)
                    for (int64_t i = 0; i < outs[0][t]->numel; i++) {
                        float a = qkv_f32(outs[0][t])[i], b = qkv_f32(outs[1][t])[i];
                        bool nan_spread = t == 2 && causal && isnan(b) && !isnan(a);
                        bad += isnan(a) ? !isnan(b) : !nan_spread && !(fabsf(a - b) <= 1e-5f * (1.0f + fabsf(b)));
                        cases++;
                    }
                qkv_ctx_free(ctxs[0]), qkv_ctx_free(ctxs[1]);
            }
    cr_expect_eq(bad, 0, "%d of %d output and gradient elements differ between the short and tiled paths", bad, cases);
}

/* Fully masked rows: exact zeros in out and dq, nothing non-finite anywhere. */
Test(avx512_emulated, fully_masked_rows_give_exact_zeros) {
    need_attention();
    const cfg cs[] = {{3, 33, 40, 16, 8, M_FULL, false, QKV_SCALE_DEFAULT, 1}, {3, 70, 300, 3, 3, M_PAD, true, QKV_SCALE_DEFAULT, 1},
                      {2, 7, 7, 2, 2, M_2D, false, QKV_SCALE_DEFAULT, 1}};
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const cfg *c = &cs[ci];
        run r = do_run(c, QKV_F32, EMULATED, 77 + ci);
        int empty_rows = 0, bad = 0, nonfinite = 0;
        const qkv_tensor *m = r.mask;
        int64_t bm = m->ndim == 3 ? m->shape[0] : 1, rows = m->shape[m->ndim - 2];
        for (int b = 0; b < c->batch; b++)
            for (int i = 0; i < c->n_q; i++) {
                bool any = false;
                int64_t mb = b / (c->batch / bm), mi = rows == 1 ? 0 : i;
                for (int j = 0; j < c->n_k; j++) any |= qkv_u8(m)[(mb * rows + mi) * c->n_k + j] && (!c->causal || j <= i);
                if (any) continue;
                empty_rows++;
                for (int e = 0; e < c->d_v; e++) bad += val(r.out, ((int64_t)b * c->n_q + i) * c->d_v + e) != 0;
                for (int e = 0; e < c->d_k; e++) bad += val(r.q->grad, ((int64_t)b * c->n_q + i) * c->d_k + e) != 0;
            }
        const qkv_tensor *ts[4] = {r.out, r.q->grad, r.k->grad, r.v->grad};
        for (int t = 0; t < 4; t++)
            for (int64_t e = 0; e < ts[t]->numel; e++) nonfinite += !isfinite(val(ts[t], e));
        cr_expect_gt(empty_rows, 0, "config %zu has no fully masked row", ci);
        cr_expect_eq(bad, 0, "config %zu: %d non-zero values in fully masked rows", ci, bad);
        cr_expect_eq(nonfinite, 0, "config %zu: %d non-finite values", ci, nonfinite);
        qkv_ctx_free(r.ctx);
    }
}

/* A NaN query: its row of out and of dq NaN (the online max must not drop it), the other rows finite. */
Test(avx512_emulated, a_nan_query_makes_its_row_nan) {
    need_attention();
    qkv_options o = qkv_default_options();
    o.threads = 1;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    qkv_tensor *q = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){2, 5, 3}, 0, 1);
    qkv_tensor *k = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){2, 300, 3}, 0, 1);
    qkv_tensor *v = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){2, 300, 4}, 0, 1);
    qkv_set_requires_grad(ctx, q, true);
    qkv_set_flat(ctx, q, (1 * 5 + 2) * 3, NAN); /* q[1, 2, 0]; causal: row 2 keeps keys 0-2 only */
    qkv_tensor *out = attention(EMULATED, ctx, q, k, v, NULL, QKV_SCALE_DEFAULT, QKV_CAUSAL);
    cr_assert_eq(qkv_backward(ctx, out, qkv_ones(ctx, QKV_F32, 3, out->shape)), QKV_OK, "%s", qkv_errmsg(ctx));
    int wrong = 0;
    for (int64_t r = 0; r < 10; r++) {
        bool nan_row = r == 7;
        for (int e = 0; e < 4; e++) wrong += isnan(val(out, r * 4 + e)) != nan_row;
        for (int e = 0; e < 3; e++) wrong += isnan(val(q->grad, r * 3 + e)) != nan_row;
    }
    cr_expect_eq(wrong, 0, "%d entries NaN where they should not be or the reverse", wrong);
    qkv_ctx_free(ctx);
}

/* ---- a dropped key's K and V rows are never read (test_fused.c's poisoned keys, f32) --------------- */

typedef struct poison_case {
    const char *name;
    int64_t n_q, n_k;
    int mask; /* 0: none (causal drops keys >= n_q), 1: [B, 1, n_k] padding key j, 2: [n_q, n_k] even queries drop j */
    bool causal, short_ok;
} poison_case;

static void poison_run(const poison_case *pc, path which, int64_t j, bool which_v, double bad, qkv_ctx **ctx_out,
                       qkv_tensor *res[4]) {
    qkv_options o = qkv_default_options();
    o.seed = 5;
    o.threads = 1;
    qkv_ctx *ctx = *ctx_out = qkv_ctx_new(&o);
    int64_t B = 2, d = 5;
    qkv_tensor *q = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){B, pc->n_q, d}, 0, 1);
    qkv_tensor *k = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){B, pc->n_k, d}, 0, 1);
    qkv_tensor *v = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){B, pc->n_k, 3}, 0, 1);
    qkv_tensor *dout = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){B, pc->n_q, 3}, 0, 1);
    qkv_tensor *m = NULL;
    if (pc->mask == 1) {
        m = qkv_ones(ctx, QKV_U8, 3, (int64_t[]){B, 1, pc->n_k});
        for (int64_t b = 0; b < B; b++) qkv_set(ctx, m, (int64_t[]){b, 0, j}, 0);
    } else if (pc->mask == 2) {
        m = qkv_ones(ctx, QKV_U8, 2, (int64_t[]){pc->n_q, pc->n_k});
        for (int64_t i = 0; i < pc->n_q; i += 2) qkv_set(ctx, m, (int64_t[]){i, j}, 0);
        qkv_set(ctx, m, (int64_t[]){1, 0}, 7); /* any nonzero byte keeps */
    }
    if (bad != 0)
        for (int64_t b = 0; b < B; b++)
            for (int64_t e = 0; e < (which_v ? 3 : d); e++)
                qkv_set(ctx, which_v ? v : k, (int64_t[]){b, j, e}, e == 1 ? bad : -bad);
    qkv_set_requires_grad(ctx, q, true);
    qkv_set_requires_grad(ctx, k, true);
    qkv_set_requires_grad(ctx, v, true);
    qkv_attn_allow_short_(pc->short_ok);
    qkv_tensor *out = attention(which, ctx, q, k, v, m, QKV_SCALE_DEFAULT, pc->causal ? QKV_CAUSAL : 0);
    qkv_attn_allow_short_(true);
    cr_assert_eq(qkv_backward(ctx, out, dout), QKV_OK, "%s", qkv_errmsg(ctx));
    res[0] = out, res[1] = q->grad, res[2] = k->grad, res[3] = v->grad;
}

/* A query's row of out and dq never depends on the K or V row of a key it drops (inf, NaN, 1e308 there
 * against the same run with finite values: equal within 2e-5); a key every query drops changes nothing, and
 * its own dk and dv rows are exactly 0. The emulated AVX-512 run's clean results also match the portable
 * set's within 2e-5. */
Test(avx512_emulated, a_dropped_keys_k_and_v_rows_never_reach_out_or_dq) {
    need_attention();
    const poison_case cases[] = {
        {"padding key, one tile", 7, 9, 1, false, true},  {"padding key, 2 tiles", 7, 300, 1, false, true},
        {"padding key + causal", 40, 300, 1, true, true}, {"causal, keys past n_q, short", 5, 8, 0, true, true},
        {"causal, keys past n_q, tiled", 5, 8, 0, true, false}, {"causal, long", 40, 300, 0, true, true},
        {"explicit mask, even queries drop it", 7, 9, 2, false, true},
        {"explicit mask, 2 tiles", 7, 300, 2, true, true},
        {"padding key, 2 query blocks", 70, 300, 1, false, true}, {"explicit mask, 2 query blocks", 70, 300, 2, true, true},
        {"decode, padding key", 1, 300, 1, false, true}, {"decode, explicit mask", 3, 9, 2, false, false}};
    const double bads[3] = {INFINITY, NAN, 1e308};
    const double tol = 2e-5;
    int wrong = 0, compared = 0, off_portable = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int which_v = 0; which_v < 2; which_v++) {
            const poison_case *pc = &cases[ci];
            int64_t j = pc->mask == 0 ? pc->n_k - 2 : pc->n_k - 3; /* causal: j >= n_q */
            if (pc->mask == 2 && pc->causal) j = 1;
            qkv_ctx *cc, *pctx;
            qkv_tensor *clean[4], *port[4];
            poison_run(pc, EMULATED, j, which_v, 0, &cc, clean);
            poison_run(pc, PORTABLE, j, which_v, 0, &pctx, port);
            for (int x = 0; x < 4; x++) off_portable += !(rel_diff(clean[x], port[x], 0) <= tol);
            qkv_ctx_free(pctx);
            for (int bi = 0; bi < 3; bi++) {
                qkv_ctx *px;
                qkv_tensor *pois[4];
                poison_run(pc, EMULATED, j, which_v, bads[bi], &px, pois);
                bool every_query_drops = pc->mask != 2;
                int64_t dims[4] = {3, 5, 5, 3};
                for (int x = 0; x < (every_query_drops ? 4 : 2); x++)
                    for (int64_t e = 0; e < clean[x]->numel; e++) {
                        int64_t row = e / dims[x], i = row % (x < 2 ? pc->n_q : pc->n_k);
                        if (!every_query_drops && i % 2 != 0) continue; /* odd queries keep key j */
                        double a = val(pois[x], e), b = val(clean[x], e);
                        bool ok = x >= 2 && i == j ? a == 0 : fabs(a - b) <= tol * (1 + fabs(b));
                        if (!ok && wrong++ < 5)
                            cr_log_error("%s, %s row %g: %s[%lld] = %g, finite run %g", pc->name, which_v ? "V" : "K",
                                         bads[bi], (const char *[]){"out", "dq", "dk", "dv"}[x], (long long)e, a, b);
                        compared++;
                    }
                qkv_ctx_free(px);
            }
            qkv_ctx_free(cc);
        }
    cr_expect_gt(compared, 5000);
    cr_expect_eq(wrong, 0, "%d of %d elements read a dropped key's K or V row", wrong, compared);
    cr_expect_eq(off_portable, 0, "%d clean results differ from the portable set's by more than %g", off_portable, tol);
}

/* ---- the softmax row kernels ------------------------------------------------------------------------ */

/* One row of the emulated set's softmax_row against a double oracle (test_fused.c's check_row): a few ulps,
 * exactly 0 below FLT_MIN and where dropped, no subnormal, nothing past the row. Returns the bad entries. */
static int check_row(const float *s, int64_t n, const uint8_t *mrow, int64_t len, char *why, size_t why_size) {
    const qkv_attn_kernel_set_ *ks = &qkv_emu_attn_kernels_avx512_;
    float *a = malloc((size_t)(n + 1) * sizeof *a);
    double *ref = malloc((size_t)(n + 1) * sizeof *ref);
    cr_assert(a && ref);
    a[n] = 12345.0f;
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
        double tol = want * (4e-7 + 1.2e-7 * fabs((double)s[j] - m));
        bool ok = fabs(got - want) <= tol || (want < 1.5 * FLT_MIN && got == 0.0);
        ok = ok && fpclassify(a[j]) != FP_SUBNORMAL;
        if (!(j < len && (!mrow || mrow[j]))) ok = ok && got == 0.0;
        if (!ok && bad++ == 0)
            snprintf(why, why_size, "n %lld len %lld j %lld: %.9g want %.9g", (long long)n, (long long)len,
                     (long long)j, got, want);
    }
    if (a[n] != 12345.0f && bad++ == 0) snprintf(why, why_size, "n %lld: wrote past the row", (long long)n);
    free(a);
    free(ref);
    return bad;
}

Test(avx512_emulated, softmax_row_matches_the_oracle_on_odd_lengths_masks_and_saturated_rows) {
    need_attention();
    int bad = 0, rows = 0;
    char why[200] = "";
    const int64_t lens[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 47, 65, 100, 129, 255, 1000, 4097};
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
            if (kind == 4)
                for (int64_t j = 0; j < n; j++) m[j] = 0;
            if (mrow) /* a dropped score is never read: NaN there */
                for (int64_t j = 0; j < n; j++)
                    if (!m[j]) s[j] = NAN;
            for (int64_t j = len; j < n; j++) s[j] = NAN;
            bad += check_row(s, n, mrow, len, why, sizeof why);
            rows++;
            free(s);
            free(m);
        }
    cr_expect_eq(bad, 0, "%d bad entries in %d rows; first: %s", bad, rows, why);
}

/* softmax_rows gives, row for row, the bits of softmax_row (two rows a vector up to 8 entries), NaN, +inf
 * and -inf rows included; and against the portable set's rows within the oracle's few ulps. */
Test(avx512_emulated, softmax_rows_gives_the_bits_of_softmax_row) {
    need_attention();
    const qkv_attn_kernel_set_ *ks = &qkv_emu_attn_kernels_avx512_;
    int bad = 0, far = 0, rows_checked = 0;
    float s[19 * 20], a[19 * 20], b[20], c[20];
    for (int64_t n = 1; n <= 20; n++)
        for (int64_t rows = 1; rows <= 19; rows++) {
            for (int64_t i = 0; i < rows * n; i++) s[i] = (float)((urand() - 0.5) * (n % 3 == 0 ? 400 : 8));
            if (rows >= 3) s[1 * n + n / 2] = NAN, s[2 * n] = INFINITY;
            if (rows >= 5)
                for (int64_t j = 0; j < n; j++) s[4 * n + j] = -INFINITY;
            if (rows >= 6) s[5 * n + n - 1] = -INFINITY;
            qkv_attn_softmax_rows_(ks, s, a, rows, n);
            for (int64_t r = 0; r < rows; r++, rows_checked++) {
                ks->softmax_row(s + r * n, b, n, NULL, n);
                qkv_attn_kernels_portable_.softmax_row(s + r * n, c, n, NULL, n);
                for (int64_t j = 0; j < n; j++) {
                    float x = a[r * n + j], y = b[j], z = c[j];
                    bad += isnan(x) ? !isnan(y) : memcmp(&x, &y, sizeof x) != 0;
                    far += isnan(z) ? !isnan(y) : !(fabsf(y - z) <= 1e-6f * fabsf(z) || (y == 0 && z < 1.5f * FLT_MIN));
                }
            }
        }
    cr_expect_gt(rows_checked, 0);
    cr_expect_eq(bad, 0, "%d entries differ between softmax_rows and softmax_row", bad);
    cr_expect_eq(far, 0, "%d entries differ from the portable set's by more than 1e-6 relative", far);
}

/* Around the flush point (test_fused.c's saturated_softmax_flushes_only_what_is_below_flt_min); and a kept
 * NaN or +inf makes the whole row NaN. */
Test(avx512_emulated, softmax_flushes_only_below_flt_min_and_keeps_nan_rows) {
    need_attention();
    const qkv_attn_kernel_set_ *ks = &qkv_emu_attn_kernels_avx512_;
    const float s[8] = {0.0f, -87.0f, -87.3f, -88.0f, -95.0f, -103.0f, -200.0f, -1.0f};
    float a[40];
    ks->softmax_row(s, a, 8, NULL, 8);
    double total = 1.0 + exp(-87.0) + exp(-87.3) + exp(-1.0);
    cr_expect(fabs(a[0] - 1.0 / total) < 1e-7, "a[0] = %.9g", a[0]);
    cr_expect(fabs(a[1] / (exp(-87.0) / total) - 1) < 1e-6 && fpclassify(a[1]) == FP_NORMAL, "a[1] = %g", a[1]);
    for (int j = 2; j < 7; j++) cr_expect_eq(a[j], 0.0f, "a[%d] = %g", j, a[j]);
    const float bad_values[2] = {NAN, INFINITY};
    for (int v = 0; v < 2; v++)
        for (int64_t n = 1; n <= 40; n += 13) {
            float x[40];
            for (int64_t j = 0; j < n; j++) x[j] = (float)(j % 5) - 2.0f;
            x[n / 2] = bad_values[v];
            ks->softmax_row(x, a, n, NULL, n);
            int numbers = 0;
            for (int64_t j = 0; j < n; j++) numbers += !isnan(a[j]);
            cr_expect_eq(numbers, 0, "%g at %lld of %lld: %d entries are numbers", (double)bad_values[v],
                         (long long)(n / 2), (long long)n, numbers);
        }
}

/* The attention variants' tile kernels (sigmoid, softpick) of the AVX-512 set against the portable set's. */
Test(avx512_emulated, variant_kernels_match_the_portable_set) {
    need_attention();
    char why[256] = "";
    cr_expect_not_null(qkv_emu_attn_kernels_avx512_.sigmoid_p);
    cr_expect_eq(variant_kernels_against_portable(&qkv_emu_attn_kernels_avx512_, why, sizeof why), 0, "%s", why);
}

qkv_tensor *qkv_emu_attention_ex_(qkv_ctx *ctx, qkv_tensor *q, qkv_tensor *k, qkv_tensor *v,
                                  const qkv_attention_options *options, qkv_tensor **attn);

/* Each variant's fused attention as an AVX-512 CPU runs it, against the composed operators (f32, 1e-5 as in
 * tests/test_attention_variants.c, 6e-5 for SSMax and 3e-5 for softpick, which says why). */
Test(avx512_emulated, attention_variants_match_composed) {
    need_attention();
    const cfg cs[] = {{2, 33, 40, 16, 8, M_FULL, true, QKV_SCALE_DEFAULT, 1},
                      {3, 70, 300, 8, 19, M_PAD, false, QKV_SCALE_DEFAULT, 1},
                      {2, 5, 17, 3, 5, M_NONE, false, 0.8, 2}};
    const qkv_attn_variant vs[] = {QKV_ATTN_SOFTMAX1, QKV_ATTN_SINK, QKV_ATTN_SIGMOID, QKV_ATTN_SSMAX, QKV_ATTN_SOFTPICK};
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++)
        for (size_t j = 0; j < sizeof cs / sizeof cs[0]; j++) {
            const cfg *c = &cs[j];
            run r[2];
            qkv_tensor *param[2] = {NULL, NULL};
            for (int path = 0; path < 2; path++) {
                qkv_options o = qkv_default_options();
                o.seed = 77 + j;
                qkv_ctx *ctx = qkv_ctx_new(&o);
                r[path] = (run){ctx, qkv_randn(ctx, QKV_F32, 3, (int64_t[]){c->batch, c->n_q, c->d_k}, 0, c->spread),
                                qkv_randn(ctx, QKV_F32, 3, (int64_t[]){c->batch, c->n_k, c->d_k}, 0, c->spread),
                                qkv_randn(ctx, QKV_F32, 3, (int64_t[]){c->batch, c->n_k, c->d_v}, 0, 1), NULL, NULL};
                qkv_tensor *dout = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){c->batch, c->n_q, c->d_v}, 0, 1);
                lcg_state = 99 + j;
                r[path].mask = make_mask(ctx, c);
                param[path] = qkv_zeros(ctx, QKV_F32, 1, (int64_t[]){1});
                qkv_f32(param[path])[0] = 0.7f;
                qkv_set_requires_grad(ctx, r[path].q, true);
                qkv_set_requires_grad(ctx, r[path].k, true);
                qkv_set_requires_grad(ctx, r[path].v, true);
                qkv_set_requires_grad(ctx, param[path], true);
                qkv_attention_options ao = qkv_attention_default_options();
                ao.variant = vs[i];
                ao.scale = c->scale;
                ao.flags = c->causal ? QKV_CAUSAL : 0;
                ao.mask = r[path].mask;
                ao.sink = ao.ssmax_c = param[path];
                r[path].out = path ? qkv_attention_composed_ex_(ctx, "composed", r[path].q, r[path].k, r[path].v, &ao, NULL)
                                   : qkv_emu_attention_ex_(ctx, r[path].q, r[path].k, r[path].v, &ao, NULL);
                cr_assert_not_null(r[path].out, "%s", qkv_errmsg(ctx));
                qkv_backward(ctx, r[path].out, dout);
                cr_assert_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
            }
            double tol = vs[i] == QKV_ATTN_SSMAX ? 6e-5 : vs[i] == QKV_ATTN_SOFTPICK ? 3e-5 : 1e-5;
            double w = worst_diff(&r[0], &r[1]);
            if (vs[i] == QKV_ATTN_SINK || vs[i] == QKV_ATTN_SSMAX)
                w = fmax(w, rel_diff(param[0]->grad, param[1]->grad, 1e-3));
            cr_expect(w <= tol, "variant %d config %zu: emulated AVX-512 fused differs from composed by %.3g", (int)vs[i],
                      j, w);
            qkv_ctx_free(r[0].ctx);
            qkv_ctx_free(r[1].ctx);
        }
}
