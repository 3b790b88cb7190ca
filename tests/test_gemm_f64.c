/*
 * test_gemm_f64.c — the fast f64 GEMM (qkv_gemm_f64_, ops/gemm.c; the packed kernels of
 * ops/kernels/gemm_f64_*.c) against a long-double oracle: each f64 kernel this CPU supports (forced through
 * qkv_gemm_f64_isa_) and the dispatcher, over odd sizes with m, k, p varied independently, all four
 * transpose combinations, accumulate on and off, shapes that cross the f64 KC / MC / NC blocks (256, 96, 176),
 * k = 0, determinism, and no write outside C.
 * Bar: ||C - C_ref||_F / ||M||_F < 1e-14, C_ref = (C0 +) op(A) op(B) in long double and M the same sum of
 * absolute values (the scale of a dot product's rounding error). A correct f64 kernel lands near 1e-16; one
 * that rounds through float, drops a depth block or misplaces an edge lands at 1e-8 or worse.
 * (1 and 2 threads giving the same bits for f64 attention, which runs on this GEMM: tests/test_fused.c.)
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qkv_internal.h"

#define TOL 1e-14
#define GUARD 16
#define DISPATCH (-1) /* "isa" meaning qkv_gemm_f64_ itself */

static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static double urand(void) { /* uniform in [-1, 1), xorshift64*, 53 bits */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t x = rng_state * 0x2545f4914f6cdd1du;
    return (double)(x >> 11) / (double)(1ull << 52) - 1.0;
}

static double *rand_array(int64_t n) {
    double *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    cr_assert_not_null(x);
    for (int64_t i = 0; i < n; i++) x[i] = urand();
    return x;
}

static void run_gemm(int isa, const double *a, const double *b, double *c, int64_t m, int64_t k, int64_t p,
                     bool ta, bool tb, bool acc) {
    if (isa == DISPATCH) qkv_gemm_f64_(a, b, c, m, k, p, ta, tb, acc);
    else qkv_gemm_f64_isa_((qkv_isa_)isa, a, b, c, m, k, p, ta, tb, acc);
}

/* One GEMM with fresh random operands against the long-double oracle: the relative error, or +inf when C
 * holds a NaN or something past C was written. */
static double check_one(int isa, int64_t m, int64_t k, int64_t p, bool ta, bool tb, bool acc) {
    double *a = rand_array(m * k), *b = rand_array(k * p);
    double *c = malloc((size_t)(m * p + GUARD) * sizeof *c);
    long double *ref = malloc((size_t)(m * p > 0 ? m * p : 1) * sizeof *ref);
    long double *mag = malloc((size_t)(m * p > 0 ? m * p : 1) * sizeof *mag);
    cr_assert(c && ref && mag);
    for (int64_t i = 0; i < m * p; i++) c[i] = acc ? urand() : NAN; /* without accumulate C is never read */
    for (int i = 0; i < GUARD; i++) c[m * p + i] = 12345.0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < p; j++) {
            long double s = acc ? (long double)c[i * p + j] : 0.0L, size = fabsl(s);
            for (int64_t l = 0; l < k; l++) {
                long double x = ta ? a[l * m + i] : a[i * k + l];
                long double y = tb ? b[j * k + l] : b[l * p + j];
                s += x * y;
                size += fabsl(x * y);
            }
            ref[i * p + j] = s;
            mag[i * p + j] = size;
        }

    run_gemm(isa, a, b, c, m, k, p, ta, tb, acc);

    long double num = 0.0L, den = 0.0L;
    bool ok = true;
    for (int64_t i = 0; i < m * p; i++) {
        if (!isfinite(c[i])) ok = false;
        long double d = (long double)c[i] - ref[i];
        num += d * d;
        den += mag[i] * mag[i];
    }
    for (int i = 0; i < GUARD; i++)
        if (c[m * p + i] != 12345.0) ok = false;
    double err = (double)(den > 0.0L ? sqrtl(num / den) : sqrtl(num));
    free(a), free(b), free(c), free(ref), free(mag);
    return ok ? err : INFINITY;
}

typedef struct tally {
    long cases, failures;
    double worst;
    int64_t wm, wk, wp;
    int wflags;
} tally;

static void check_all_flags(tally *t, int isa, int64_t m, int64_t k, int64_t p) {
    for (int flags = 0; flags < 8; flags++) {
        double err = check_one(isa, m, k, p, flags & 1, flags & 2, flags & 4);
        t->cases++;
        if (!(err < TOL)) t->failures++;
        if (!(err <= t->worst)) {
            t->worst = err;
            t->wm = m, t->wk = k, t->wp = p, t->wflags = flags;
        }
    }
}

static const char *isa_label(int isa) { return isa == DISPATCH ? "dispatch" : qkv_isa_name_((qkv_isa_)isa); }

static void sweep(int isa) {
    if (isa != DISPATCH && !qkv_isa_supported_((qkv_isa_)isa))
        cr_skip_test("the %s kernel is not available on this CPU/build", isa_label(isa));
    static const int64_t sizes[] = {1, 2, 3, 5, 6, 7, 8, 9, 13, 23, 24, 25, 64, 65, 129};
    const int n = (int)(sizeof sizes / sizeof sizes[0]);
    tally t = {0, 0, 0.0, 0, 0, 0, 0};
    for (int i = 0; i < n; i++) {
        check_all_flags(&t, isa, sizes[i], 17, 19);
        check_all_flags(&t, isa, 13, sizes[i], 11);
        check_all_flags(&t, isa, 7, 29, sizes[i]);
    }
    /* across the blocks: k > KC (two and three depth blocks), m > MC, p > NC, and both at k < KC (MC and NC
     * grow: at KC 256, MC 96, NC 176, a depth block of 160 takes 150 rows and 280 columns, one of 40 takes
     * 1120 columns, one of 20 takes 1224 rows), each with a ragged last block */
    const int64_t big[][3] = {{31, 257, 37},  {50, 600, 9},  {25, 40, 300},  {49, 300, 263},
                              {7, 100, 700},  {200, 300, 37}, {7, 300, 300}, {13, 40, 1200}, {1300, 20, 9}};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) check_all_flags(&t, isa, big[i][0], big[i][1], big[i][2]);
    cr_assert_gt(t.cases, 0);
    cr_expect_eq(t.failures, 0,
                 "%s: %ld of %ld f64 GEMMs failed; worst relative error %.3g at m=%lld k=%lld p=%lld trans_a=%d "
                 "trans_b=%d accumulate=%d",
                 isa_label(isa), t.failures, t.cases, t.worst, (long long)t.wm, (long long)t.wk, (long long)t.wp,
                 t.wflags & 1, (t.wflags >> 1) & 1, (t.wflags >> 2) & 1);
}

Test(gemm_f64, dispatch_matches_the_oracle) { sweep(DISPATCH); }
Test(gemm_f64, portable_matches_the_oracle) { sweep(QKV_ISA_PORTABLE_); }
Test(gemm_f64, avx2_matches_the_oracle) { sweep(QKV_ISA_AVX2_); }
Test(gemm_f64, avx512_cpu_matches_the_oracle) { sweep(QKV_ISA_AVX512_); }

/* The packed path and the reference loops agree to f64 rounding on the attention shapes, and the fast path
 * gives the same bits on every call. */
Test(gemm_f64, attention_shapes_and_determinism) {
    const int64_t shapes[][5] = {{128, 64, 128, 0, 1}, {128, 128, 64, 0, 0}, {128, 128, 64, 1, 0},
                                 {64, 64, 256, 0, 1}, {512, 64, 512, 0, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t m = shapes[s][0], k = shapes[s][1], p = shapes[s][2];
        bool ta = shapes[s][3], tb = shapes[s][4];
        double *a = rand_array(m * k), *b = rand_array(k * p), *c1 = rand_array(m * p), *c2 = rand_array(m * p);
        double *r = rand_array(m * p);
        qkv_gemm_f64_(a, b, c1, m, k, p, ta, tb, false);
        qkv_gemm_f64_(a, b, c2, m, k, p, ta, tb, false);
        qkv_gemm_f64_ref_(a, b, r, m, k, p, ta, tb, false);
        cr_expect(!memcmp(c1, c2, (size_t)(m * p) * sizeof *c1), "shape %zu: two calls differ", s);
        double worst = 0.0;
        for (int64_t i = 0; i < m * p; i++) worst = fmax(worst, fabs(c1[i] - r[i]));
        /* |entries| <= 1, so each dot product is <= k in size: its rounding about k * 2^-53 */
        cr_expect_lt(worst, (double)k * 0x1p-50, "shape %zu: packed and reference differ by %.3g", s, worst);
        free(a), free(b), free(c1), free(c2), free(r);
    }
}

/* k = 0: C = 0, or unchanged with accumulate; m or p = 0: nothing written. */
Test(gemm_f64, empty_sums) {
    double a[1] = {1.0}, b[1] = {1.0}, c[6] = {5, 5, 5, 5, 5, 5};
    qkv_gemm_f64_(a, b, c, 2, 0, 3, false, false, true);
    for (int i = 0; i < 6; i++) cr_expect_eq(c[i], 5.0);
    qkv_gemm_f64_(a, b, c, 2, 0, 3, false, false, false);
    for (int i = 0; i < 6; i++) cr_expect_eq(c[i], 0.0);
    c[0] = 7.0;
    qkv_gemm_f64_(a, b, c, 0, 4, 3, false, false, false);
    qkv_gemm_f64_(a, b, c, 2, 4, 0, false, false, false);
    cr_expect_eq(c[0], 7.0);
}
