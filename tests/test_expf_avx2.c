/*
 * test_expf_avx2.c — ops/kernels/expf_avx2.h, the AVX2 kernels' inline exp, gives SLEEF's Sleef_expf8_u10avx2
 * bits (the function the kernels called before, so every result and page that went through it is unchanged):
 * 1 in 61 of all 2^32 float bit patterns (70 million, both signs, NaNs and infinities among them), and every
 * pattern around the edges: the underflow cut at -104 and the overflow cut at 100, the zeros and subnormals,
 * and the ties of the rounding of x / ln 2 near small multiples of ln 2 / 2.
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

/* the count bit patterns centred on f's give SLEEF's bits */
static void expect_same_around(float f, uint64_t count, const char *what) {
    uint32_t first = 0;
    uint64_t bad = qkv_test_expf_avx2_mismatches(bits_of(f) - (uint32_t)(count / 2), 1, count, &first);
    float x;
    memcpy(&x, &first, sizeof x);
    cr_expect_eq(bad, 0, "%s: %llu of %llu inputs differ from SLEEF, the first %a (bits 0x%08x)", what,
                 (unsigned long long)bad, (unsigned long long)count, (double)x, first);
}

Test(expf_avx2, sleef_bits_on_a_sample_of_all_floats) {
    if (!qkv_test_expf_avx2_built() || !cpu_has_avx2()) {
        cr_skip_test("no AVX2 build of the check, or this CPU has no AVX2 and FMA");
        return;
    }
    uint32_t first = 0;
    uint64_t count = ((uint64_t)1 << 32) / 61 + 1;
    uint64_t bad = qkv_test_expf_avx2_mismatches(0, 61, count, &first);
    cr_expect_eq(bad, 0, "%llu of %llu inputs differ from SLEEF, the first bits 0x%08x", (unsigned long long)bad,
                 (unsigned long long)count, first);
}

Test(expf_avx2, sleef_bits_at_every_edge) {
    if (!qkv_test_expf_avx2_built() || !cpu_has_avx2()) {
        cr_skip_test("no AVX2 build of the check, or this CPU has no AVX2 and FMA");
        return;
    }
    expect_same_around(-104.0f, 1 << 20, "the underflow cut");
    expect_same_around(-87.3f, 1 << 20, "the smallest normal results");
    expect_same_around(100.0f, 1 << 20, "the overflow cut");
    expect_same_around(88.72f, 1 << 20, "the largest finite results");
    expect_same_around(0.0f, 1 << 22, "+0 and the positive subnormals");
    expect_same_around(-0.0f, 1 << 22, "-0 and the negative subnormals");
    for (int k = -8; k <= 8; k++) expect_same_around((float)(k * 0.34657359027997264), 1 << 16, "a rounding tie of x / ln 2");
    expect_same_around(INFINITY, 1 << 16, "+inf and the NaNs above it");
    expect_same_around(-INFINITY, 1 << 16, "-inf and the NaNs above it");
}
