/*
 * test_expf_avx2.c — ops/kernels/expf_avx2.h and logf_avx2.h, the AVX2 kernels' inline exp and log, give the bits
 * of SLEEF's Sleef_expf8_u10avx2 and Sleef_logf8_u10avx2, and expf_avx512.h, the AVX-512 kernels' inline exp,
 * those of Sleef_expf16_u10avx512f (the functions the kernels called before, so every result and page that went
 * through them is unchanged): 1 in 61 of all 2^32 float bit patterns (70 million,
 * both signs, NaNs and infinities among them), and every pattern around the edges: for exp the underflow cut
 * at -104 and the overflow cut at 100, the zeros and subnormals, and the ties of the rounding of x / ln 2 near
 * small multiples of ln 2 / 2; for log the zeros, the subnormals and the smallest normals (scaled by 2^64
 * first), 1 and the cut at 0.75 of its reduction, the largest floats and the infinities.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "qkv_internal.h"

#include "expf_avx2_check.h"

static uint32_t bits_of(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static bool cpu_has_avx2(void) { return qkv_isa_supported_(QKV_ISA_AVX2_); }

static bool cpu_has_avx512(void) { return qkv_isa_supported_(QKV_ISA_AVX512_); }

/* fn 0: the AVX2 exp, 1: the AVX2 log, 2: the AVX-512 exp */
static uint64_t mismatches(int fn, uint32_t start, uint32_t stride, uint64_t count, uint32_t *first) {
    return fn == 2 ? qkv_test_expf_avx512_mismatches(start, stride, count, first)
                   : qkv_test_expf_avx2_mismatches(fn, start, stride, count, first);
}

/* the count bit patterns centred on f's give SLEEF's bits */
static void expect_same_around(int fn, float f, uint64_t count, const char *what) {
    uint32_t first = 0;
    uint64_t bad = mismatches(fn, bits_of(f) - (uint32_t)(count / 2), 1, count, &first);
    float x;
    memcpy(&x, &first, sizeof x);
    cr_expect_eq(bad, 0, "%s: %llu of %llu inputs differ from SLEEF, the first %a (bits 0x%08x)", what,
                 (unsigned long long)bad, (unsigned long long)count, (double)x, first);
}

/* Whether function fn's check can run here (built with its flags, and this CPU has them); why not in *why. */
static bool runs_here(int fn, const char **why) {
    bool ok = fn == 2 ? qkv_test_expf_avx512_built() && cpu_has_avx512() : qkv_test_expf_avx2_built() && cpu_has_avx2();
    *why = fn == 2 ? "no AVX-512 build of the check, or this CPU has no AVX-512F"
                   : "no AVX2 build of the check, or this CPU has no AVX2 and FMA";
    return ok;
}

static const char *const FN_NAME[3] = {"exp (AVX2)", "log (AVX2)", "exp (AVX-512)"};

/* the exp edges of function fn (0: AVX2, 2: AVX-512) */
static void expect_exp_edges(int fn) {
    expect_same_around(fn, -104.0f, 1 << 20, "the underflow cut");
    expect_same_around(fn, -87.3f, 1 << 20, "the smallest normal results");
    expect_same_around(fn, 100.0f, 1 << 20, "the overflow cut");
    expect_same_around(fn, 88.72f, 1 << 20, "the largest finite results");
    expect_same_around(fn, 0.0f, 1 << 22, "+0 and the positive subnormals");
    expect_same_around(fn, -0.0f, 1 << 22, "-0 and the negative subnormals");
    for (int k = -8; k <= 8; k++)
        expect_same_around(fn, (float)(k * 0.34657359027997264), 1 << 16, "a rounding tie of x / ln 2");
    expect_same_around(fn, INFINITY, 1 << 16, "+inf and the NaNs above it");
    expect_same_around(fn, -INFINITY, 1 << 16, "-inf and the NaNs above it");
}

Test(expf_avx2, sleef_bits_on_a_sample_of_all_floats) {
    uint64_t count = ((uint64_t)1 << 32) / 61 + 1;
    int ran = 0;
    for (int fn = 0; fn < 3; fn++) {
        const char *why;
        if (!runs_here(fn, &why)) {
            cr_log_info("%s: not checked: %s", FN_NAME[fn], why);
            continue;
        }
        uint32_t first = 0;
        uint64_t bad = mismatches(fn, 0, 61, count, &first);
        cr_expect_eq(bad, 0, "%s: %llu of %llu inputs differ from SLEEF, the first bits 0x%08x", FN_NAME[fn],
                     (unsigned long long)bad, (unsigned long long)count, first);
        ran++;
    }
    if (!ran) cr_skip_test("neither an AVX2 nor an AVX-512 check runs on this CPU");
}

Test(expf_avx2, sleef_bits_at_every_edge) {
    const char *why;
    bool avx2 = runs_here(0, &why), avx512 = runs_here(2, &why);
    if (!avx2 && !avx512) {
        cr_skip_test("neither an AVX2 nor an AVX-512 check runs on this CPU");
        return;
    }
    if (avx512) expect_exp_edges(2);
    if (!avx2) return;
    expect_exp_edges(0);
    expect_same_around(1, 0.0f, 1 << 24, "log: +0, the subnormals and the smallest normals");
    expect_same_around(1, -0.0f, 1 << 16, "log: -0 and the negative subnormals");
    expect_same_around(1, 1.0f, 1 << 20, "log: around 1");
    expect_same_around(1, 0.75f, 1 << 16, "log: the cut of the reduction at 0.75");
    expect_same_around(1, 1.5f, 1 << 16, "log: the cut of the reduction at 1.5");
    expect_same_around(1, 3.4e38f, 1 << 16, "log: the largest floats");
    expect_same_around(1, INFINITY, 1 << 16, "log: +inf and the NaNs above it");
}
