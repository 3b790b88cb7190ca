/*
 * test_kernels.c — the fast f32 GEMM (ops/gemm.c, ops/kernels/) against a double-precision oracle:
 * every micro-kernel this CPU supports (forced through qkv_gemm_f32_isa_), the small unpacked path with each
 * ISA's tiles (qkv_gemm_f32_small_isa_) and the dispatcher qkv_gemm_f32_, over odd sizes (1 .. 257) with m, k,
 * p varied independently, all four transpose combinations, accumulate on and off, shapes that cross the
 * KC / MC / NC cache blocks, k = 0, determinism, and no write outside C.
 * Bar: ||C - C_ref||_F / ||M||_F < 1e-5, C_ref = (C0 +) op(A) op(B) computed in double and M the same sum of
 * absolute values, |C0| + |op(A)| |op(B)| (the scale of a dot product's rounding error, so that a sum that
 * cancels to near zero is not held to a relative bar it cannot meet).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qkv_internal.h"

#include "../ops/kernels/gemm_kernels.h"
#include "gemm_cases.h"
#include "test_deadline.h"

#define DISPATCH (-1) /* "isa" meaning qkv_gemm_f32_ itself */
#define SMALL 100     /* "isa" SMALL + i: the small (unpacked) path with ISA i's tiles */

static const int64_t odd_sizes[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 64, 65, 127, 129, 255, 257};
#define N_ODD ((int)(sizeof odd_sizes / sizeof odd_sizes[0]))

static void run_gemm(int isa, const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                     bool ta, bool tb, bool acc) {
    if (isa == DISPATCH) qkv_gemm_f32_(a, b, c, m, k, p, ta, tb, acc);
    else if (isa >= SMALL)
        cr_assert(qkv_gemm_f32_small_isa_((qkv_isa_)(isa - SMALL), a, b, c, m, k, p, ta, tb, acc),
                  "the small path declined %lld x %lld x %lld", (long long)m, (long long)k, (long long)p);
    else qkv_gemm_f32_isa_((qkv_isa_)isa, a, b, c, m, k, p, ta, tb, acc);
}

typedef struct result {
    double rel_err;   /* norm-wise relative error against the double oracle */
    bool guard_ok;    /* nothing written past C */
    bool finite;      /* no NaN left from the NaN-filled C of a non-accumulating call */
} result;

/* One GEMM with fresh random operands, checked against the double oracle. */
static result check_one(int isa, int64_t m, int64_t k, int64_t p, bool ta, bool tb, bool acc) {
    float *a = rand_array(m * k), *b = rand_array(k * p);
    float *c = malloc((size_t)(m * p + GUARD) * sizeof *c);
    double *ref = malloc((size_t)(m * p > 0 ? m * p : 1) * sizeof *ref);
    double *mag = malloc((size_t)(m * p > 0 ? m * p : 1) * sizeof *mag);
    cr_assert(c && ref && mag);
    for (int64_t i = 0; i < m * p; i++) c[i] = acc ? frand() : NAN; /* without accumulate C is never read */
    for (int i = 0; i < GUARD; i++) c[m * p + i] = 12345.0f;
    gemm_oracle(a, b, c, ref, mag, m, k, p, ta, tb, acc);

    run_gemm(isa, a, b, c, m, k, p, ta, tb, acc);

    result r = {0.0, true, true};
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < m * p; i++) {
        if (!isfinite(c[i])) r.finite = false;
        double d = (double)c[i] - ref[i];
        num += d * d;
        den += mag[i] * mag[i];
    }
    r.rel_err = den > 0.0 ? sqrt(num / den) : sqrt(num);
    if (!r.finite) r.rel_err = INFINITY;
    for (int i = 0; i < GUARD; i++)
        if (c[m * p + i] != 12345.0f) r.guard_ok = false;
    free(a), free(b), free(c), free(ref), free(mag);
    return r;
}

typedef struct tally {
    long cases, failures;
    double worst;
    int64_t wm, wk, wp;
    int wflags;
} tally;

static void check_all_flags(tally *t, int isa, int64_t m, int64_t k, int64_t p) {
    for (int flags = 0; flags < 8; flags++) {
        bool ta = flags & 1, tb = flags & 2, acc = flags & 4;
        result r = check_one(isa, m, k, p, ta, tb, acc);
        t->cases++;
        if (!(r.rel_err < TOL) || !r.guard_ok || !r.finite) t->failures++;
        if (!(r.rel_err <= t->worst)) {
            t->worst = r.rel_err;
            t->wm = m, t->wk = k, t->wp = p, t->wflags = flags;
        }
    }
}

static void report(const tally *t, int isa) {
    cr_assert_gt(t->cases, 0);
    cr_expect_eq(t->failures, 0,
                 "%s%s: %ld of %ld GEMMs failed; worst relative error %.3g at m=%lld k=%lld p=%lld "
                 "trans_a=%d trans_b=%d accumulate=%d",
                 isa == DISPATCH ? "dispatch" : qkv_isa_name_((qkv_isa_)(isa % SMALL)), isa >= SMALL ? " small" : "",
                 t->failures, t->cases, t->worst,
                 (long long)t->wm, (long long)t->wk, (long long)t->wp, t->wflags & 1, (t->wflags >> 1) & 1,
                 (t->wflags >> 2) & 1);
}

static void skip_unless_supported(int isa) {
    if (isa != DISPATCH && !qkv_isa_supported_((qkv_isa_)(isa % SMALL)))
        cr_skip_test("the %s kernel is not available on this CPU/build", qkv_isa_name_((qkv_isa_)(isa % SMALL)));
}

/* m, k, p each swept over the odd sizes with the other two held at odd values, plus cubes. */
static void sweep_independent(int isa) {
    skip_unless_supported(isa);
    tally t = {0};
    for (int s = 0; s < N_ODD; s++) {
        int64_t n = odd_sizes[s];
        check_all_flags(&t, isa, n, 17, 33);
        check_all_flags(&t, isa, 33, n, 17);
        check_all_flags(&t, isa, 17, 33, n);
        check_all_flags(&t, isa, n, n, n);
    }
    report(&t, isa);
}

/* Every (m, k, p) from a set of small and edge sizes: all combinations of full and partial tiles. */
static void sweep_cross(int isa) {
    skip_unless_supported(isa);
    static const int64_t sizes[] = {1, 2, 3, 7, 12, 16, 17, 33, 65};
    const int n = (int)(sizeof sizes / sizeof sizes[0]);
    tally t = {0};
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            for (int l = 0; l < n; l++) check_all_flags(&t, isa, sizes[i], sizes[j], sizes[l]);
    report(&t, isa);
}

/* Shapes past one cache block in every direction (ops/kernels/gemm_kernels.h: MC = 48 rows, KC = 256 deep,
 * and a block of packed B holds KC * NC = 256 * 512 floats, so its width grows as the depth block shrinks):
 *   100 x 777 x 1100: 3 row blocks, 4 depth blocks of 208 (the last 153), 2 column blocks of 608 or 624;
 *   20 x 64 x 2100: one depth block of 64, so column blocks of 2048: 2;
 *   300 x 385 x 70: 7 row blocks, 2 depth blocks;
 * and the attention shapes at n = 128, d = 64. */
static void sweep_blocks(int isa) {
    skip_unless_supported(isa);
    tally t = {0};
    check_all_flags(&t, isa, 100, 777, 1100);
    check_all_flags(&t, isa, 20, 64, 2100);
    check_all_flags(&t, isa, 300, 385, 70);
    check_all_flags(&t, isa, 128, 64, 128); /* Q K^T */
    check_all_flags(&t, isa, 128, 128, 64); /* A V */
    report(&t, isa);
}

/* The small path: every (m, k, p) of odd and tile-edge sizes with op(B) of at most 4096 floats (the largest
 * it takes), rows past several 12- and 6-row tiles, columns past 8, 16 and 32. */
static void sweep_small(int isa) {
    skip_unless_supported(isa);
    static const int64_t rows[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 17, 25, 33, 100, 257};
    static const int64_t sizes[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 65, 127, 256, 257, 4096};
    const int n_rows = (int)(sizeof rows / sizeof rows[0]), n = (int)(sizeof sizes / sizeof sizes[0]);
    tally t = {0};
    for (int i = 0; i < n_rows; i++)
        for (int j = 0; j < n; j++)
            for (int l = 0; l < n; l++)
                if (sizes[j] * sizes[l] <= 4096) check_all_flags(&t, isa, rows[i], sizes[j], sizes[l]);
    report(&t, isa);
}

Test(kernels, avx2_small_path) { sweep_small(SMALL + QKV_ISA_AVX2_); }
Test(kernels, avx512_small_path) { sweep_small(SMALL + QKV_ISA_AVX512_); }

/* Each ISA's register transpose (the small path's B^T) against the definition, over sizes around its 8- and
 * 16-wide blocks, with nothing written past the destination. */
Test(kernels, transpose_every_isa) {
    static const int64_t sizes[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 64};
    const int n = (int)(sizeof sizes / sizeof sizes[0]);
    void (*const fns[2])(const float *, int64_t, int64_t, float *) = {qkv_transpose_f32_avx2_,
                                                                     qkv_transpose_f32_avx512_};
    const qkv_isa_ isas[2] = {QKV_ISA_AVX2_, QKV_ISA_AVX512_};
    int tried = 0, bad = 0;
    for (int f = 0; f < 2; f++) {
        if (!qkv_isa_supported_(isas[f])) continue;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                int64_t rows = sizes[i], cols = sizes[j];
                float *src = rand_array(rows * cols), *dst = malloc((size_t)(rows * cols + GUARD) * sizeof *dst);
                cr_assert_not_null(dst);
                for (int64_t e = 0; e < rows * cols + GUARD; e++) dst[e] = -7.0f;
                fns[f](src, rows, cols, dst);
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t c = 0; c < cols; c++) bad += dst[c * rows + r] != src[r * cols + c];
                for (int g = 0; g < GUARD; g++) bad += dst[rows * cols + g] != -7.0f;
                tried++;
                free(src), free(dst);
            }
    }
    if (!tried) cr_skip_test("neither AVX2 nor AVX-512 here");
    cr_expect_eq(bad, 0, "%d wrong or stray elements over %d transposes", bad, tried);
}

/* The small path declines what it does not take: the portable ISA (the reference serves there) and op(B)
 * past 4096 floats, writing nothing. */
Test(kernels, small_path_declines) {
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, c[2] = {-1, -1};
    float *b = rand_array(4097 * 2);
    cr_expect(!qkv_gemm_f32_small_isa_(QKV_ISA_PORTABLE_, a, b, c, 1, 2, 1, false, false, false));
    for (int isa = QKV_ISA_AVX2_; isa < QKV_ISA_COUNT_; isa++) {
        cr_expect(!qkv_gemm_f32_small_isa_((qkv_isa_)isa, a, b, c, 1, 1, 4097, false, false, false));
        cr_expect(!qkv_gemm_f32_small_isa_((qkv_isa_)isa, a, b, c, 1, 2, 2049, false, true, false));
    }
    cr_expect(c[0] == -1 && c[1] == -1);
    free(b);
}

Test(kernels, portable_odd_sizes) { sweep_independent(QKV_ISA_PORTABLE_); }
Test(kernels, avx2_odd_sizes) { sweep_independent(QKV_ISA_AVX2_); }
Test(kernels, avx512_odd_sizes) { sweep_independent(QKV_ISA_AVX512_); }
Test(kernels, dispatch_odd_sizes) { sweep_independent(DISPATCH); }

Test(kernels, portable_all_small_shapes) { sweep_cross(QKV_ISA_PORTABLE_); }
Test(kernels, avx2_all_small_shapes) { sweep_cross(QKV_ISA_AVX2_); }
Test(kernels, avx512_all_small_shapes) { sweep_cross(QKV_ISA_AVX512_); }
Test(kernels, dispatch_all_small_shapes) { sweep_cross(DISPATCH); }

Test(kernels, portable_cache_blocks) {
    QKV_TEST_DEADLINE(300);
    sweep_blocks(QKV_ISA_PORTABLE_);
}
Test(kernels, avx2_cache_blocks) {
    QKV_TEST_DEADLINE(300);
    sweep_blocks(QKV_ISA_AVX2_);
}
Test(kernels, avx512_cache_blocks) {
    QKV_TEST_DEADLINE(300);
    sweep_blocks(QKV_ISA_AVX512_);
}
Test(kernels, dispatch_cache_blocks) {
    QKV_TEST_DEADLINE(300);
    sweep_blocks(DISPATCH);
}

/* k = 0: an empty sum. C = 0 without accumulate (even from NaN), C unchanged with it. */
Test(kernels, empty_depth) {
    for (int isa = DISPATCH; isa < QKV_ISA_COUNT_; isa++) {
        if (isa != DISPATCH && !qkv_isa_supported_((qkv_isa_)isa)) continue;
        for (int flags = 0; flags < 8; flags++) {
            bool ta = flags & 1, tb = flags & 2, acc = flags & 4;
            float a[1] = {7.0f}, b[1] = {9.0f};
            float c[3 * 5 + GUARD];
            for (int i = 0; i < 3 * 5; i++) c[i] = acc ? (float)i : NAN;
            for (int i = 0; i < GUARD; i++) c[15 + i] = -1.0f;
            run_gemm(isa, a, b, c, 3, 0, 5, ta, tb, acc);
            int bad = 0;
            for (int i = 0; i < 15; i++) bad += c[i] != (acc ? (float)i : 0.0f);
            for (int i = 0; i < GUARD; i++) bad += c[15 + i] != -1.0f;
            cr_expect_eq(bad, 0, "isa %d flags %d: %d wrong elements", isa, flags, bad);
        }
    }
}

/* m = 0 or p = 0: nothing is written. */
Test(kernels, empty_output) {
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4}, c[4] = {5, 5, 5, 5};
    for (int isa = DISPATCH; isa < QKV_ISA_COUNT_; isa++) {
        if (isa != DISPATCH && !qkv_isa_supported_((qkv_isa_)isa)) continue;
        run_gemm(isa, a, b, c, 0, 2, 2, false, false, false);
        run_gemm(isa, a, b, c, 2, 2, 0, true, true, false);
    }
    for (int i = 0; i < 4; i++) cr_expect_eq(c[i], 5.0f);
}

/* A hand-worked product, exact in f32, through every path: [[1,2],[3,4]] [[5,6],[7,8]] = [[19,22],[43,50]]. */
Test(kernels, hand_worked_2x2) {
    const float a[4] = {1, 2, 3, 4}, at[4] = {1, 3, 2, 4};
    const float b[4] = {5, 6, 7, 8}, bt[4] = {5, 7, 6, 8};
    const float want[4] = {19, 22, 43, 50};
    for (int isa = DISPATCH; isa < QKV_ISA_COUNT_; isa++) {
        if (isa != DISPATCH && !qkv_isa_supported_((qkv_isa_)isa)) continue;
        for (int flags = 0; flags < 8; flags++) {
            bool ta = flags & 1, tb = flags & 2, acc = flags & 4;
            float c[4] = {1, 1, 1, 1};
            run_gemm(isa, ta ? at : a, tb ? bt : b, c, 2, 2, 2, ta, tb, acc);
            for (int i = 0; i < 4; i++)
                cr_expect_eq(c[i], want[i] + (acc ? 1.0f : 0.0f), "isa %d flags %d: c[%d] = %g", isa, flags,
                             i, (double)c[i]);
        }
    }
}

/* The same inputs give the same bits on every call, for every ISA, across cache blocks. */
Test(kernels, deterministic_bits) {
    const int64_t m = 150, k = 400, p = 530;
    float *a = rand_array(m * k), *b = rand_array(k * p);
    float *c1 = malloc((size_t)(m * p) * sizeof *c1), *c2 = malloc((size_t)(m * p) * sizeof *c2);
    cr_assert(c1 && c2);
    int differ = 0, runs = 0;
    for (int isa = DISPATCH; isa < QKV_ISA_COUNT_; isa++) {
        if (isa != DISPATCH && !qkv_isa_supported_((qkv_isa_)isa)) continue;
        for (int flags = 0; flags < 4; flags++) {
            bool ta = flags & 1, tb = flags & 2;
            run_gemm(isa, a, b, c1, m, k, p, ta, tb, false);
            for (int rep = 0; rep < 2; rep++) {
                run_gemm(isa, a, b, c2, m, k, p, ta, tb, false);
                differ += memcmp(c1, c2, (size_t)(m * p) * sizeof *c1) != 0;
                runs++;
            }
        }
    }
    cr_expect_gt(runs, 0);
    cr_expect_eq(differ, 0, "%d of %d repeated GEMMs gave different bits", differ, runs);
    free(a), free(b), free(c1), free(c2);
}

/* qkv_gemm_f32_threads_ gives qkv_gemm_f32_'s bits with 1, 2, 3 and 5 threads, every transpose and accumulate,
 * over shapes large enough to be split (at least QKV_GEMM_GRAIN_ multiply-adds a thread): the projections'
 * and weight gradients' shapes of a small model, rows that are no multiple of a panel or of the threads,
 * an A read in place (p <= 128) and a depth past one KC block; and a product below the grain, not split. */
Test(kernels, threads_give_the_same_bits) {
    QKV_TEST_DEADLINE(120);
    static const int64_t shapes[][3] = {{1024, 256, 256}, {256, 1024, 256}, {1021, 96, 128}, {307, 700, 131},
                                        {77, 300, 1000}, {64, 64, 64}};
    int differ = 0, runs = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t m = shapes[s][0], k = shapes[s][1], p = shapes[s][2];
        float *a = rand_array(m * k), *b = rand_array(k * p), *c0 = rand_array(m * p);
        float *want = malloc((size_t)(m * p) * sizeof *want), *got = malloc((size_t)(m * p) * sizeof *got);
        cr_assert(want && got);
        for (int flags = 0; flags < 8; flags++) {
            bool ta = flags & 1, tb = flags & 2, acc = flags & 4;
            memcpy(want, c0, (size_t)(m * p) * sizeof *want);
            qkv_gemm_f32_(a, b, want, m, k, p, ta, tb, acc);
            static const int counts[] = {1, 2, 3, 5};
            for (int t = 0; t < 4; t++) {
                memcpy(got, c0, (size_t)(m * p) * sizeof *got);
                qkv_gemm_f32_threads_(counts[t], a, b, got, m, k, p, ta, tb, acc);
                bool same = memcmp(want, got, (size_t)(m * p) * sizeof *got) == 0;
                cr_expect(same, "%lld x %lld x %lld ta %d tb %d acc %d: %d threads differ from qkv_gemm_f32_",
                          (long long)m, (long long)k, (long long)p, ta, tb, acc, counts[t]);
                differ += !same;
                runs++;
            }
        }
        free(a), free(b), free(c0), free(want), free(got);
    }
    cr_expect_eq(differ, 0, "%d of %d threaded GEMMs differ", differ, runs);
}

/* The dispatcher picks a supported ISA, the best one this CPU has. */
Test(kernels, dispatch_picks_a_supported_isa) {
    qkv_isa_ best = qkv_isa_best_();
    cr_expect(qkv_isa_supported_(best), "best ISA %s is not supported", qkv_isa_name_(best));
    cr_expect(qkv_isa_supported_(QKV_ISA_PORTABLE_));
    for (int isa = best + 1; isa < QKV_ISA_COUNT_; isa++)
        cr_expect(!qkv_isa_supported_((qkv_isa_)isa), "%s is supported but %s was picked",
                  qkv_isa_name_((qkv_isa_)isa), qkv_isa_name_(best));
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) cr_expect_eq(best, QKV_ISA_AVX512_);
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) cr_expect_eq(best, QKV_ISA_AVX2_);
#endif
}

/* The reference f32 kernel itself agrees with the double oracle (it is the fallback). */
Test(kernels, reference_f32_matches_double) {
    tally t = {0};
    for (int flags = 0; flags < 8; flags++) {
        bool ta = flags & 1, tb = flags & 2, acc = flags & 4;
        int64_t m = 33, k = 65, p = 17;
        float *a = rand_array(m * k), *b = rand_array(k * p), *c = rand_array(m * p);
        float *c2 = malloc(sizeof(float) * (size_t)(m * p));
        cr_assert_not_null(c2);
        memcpy(c2, c, sizeof(float) * (size_t)(m * p));
        qkv_gemm_f32_ref_(a, b, c, m, k, p, ta, tb, acc);
        double num = 0, den = 0;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < p; j++) {
                double s = acc ? (double)c2[i * p + j] : 0.0;
                for (int64_t l = 0; l < k; l++)
                    s += (double)(ta ? a[l * m + i] : a[i * k + l]) * (double)(tb ? b[j * k + l] : b[l * p + j]);
                num += (c[i * p + j] - s) * (c[i * p + j] - s);
                den += s * s;
            }
        t.cases++;
        if (!(sqrt(num / den) < TOL)) t.failures++;
        free(a), free(b), free(c), free(c2);
    }
    cr_expect_eq(t.failures, 0);
}

/* Forcing an ISA the CPU or build lacks (or no ISA at all) never runs its code: the reference answers. */
Test(kernels, unsupported_isa_falls_back) {
    const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, -1, 2, 0.5f, 1};
    const float want[4] = {1 * 1 + 2 * -1 + 3 * 0.5f, 1 * 0 + 2 * 2 + 3 * 1, 4 * 1 + 5 * -1 + 6 * 0.5f,
                           4 * 0 + 5 * 2 + 6 * 1};
    int tried = 0;
    for (int isa = 0; isa <= QKV_ISA_COUNT_; isa++) {
        if (isa < QKV_ISA_COUNT_ && qkv_isa_supported_((qkv_isa_)isa)) continue;
        float c[4] = {0};
        qkv_gemm_f32_isa_((qkv_isa_)isa, a, b, c, 2, 3, 2, false, false, false);
        for (int i = 0; i < 4; i++) cr_expect_eq(c[i], want[i], "isa %d: c[%d] = %g", isa, i, (double)c[i]);
        tried++;
    }
    cr_expect_geq(tried, 1); /* at least the out-of-range value */
    cr_expect(!qkv_isa_supported_(QKV_ISA_COUNT_));
}
