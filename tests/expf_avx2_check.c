/*
 * expf_avx2_check.c — test-only, compiled with -mavx2 -mfma: ops/kernels/expf_avx2.h's inline exp and
 * logf_avx2.h's inline log against the SLEEF functions they replace (Sleef_expf8_u10avx2, Sleef_logf8_u10avx2),
 * bit for bit (a NaN for a NaN), over a list of float bit patterns.
 */
#include <stdint.h>
#include <string.h>

#include "expf_avx2_check.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(QKV_HAVE_SLEEF)

#include <immintrin.h>
#include <sleef.h>

#include "../ops/kernels/expf_avx2.h"
#include "../ops/kernels/logf_avx2.h"

bool qkv_test_expf_avx2_built(void) { return true; }

uint64_t qkv_test_expf_avx2_mismatches(int fn, uint32_t start, uint32_t stride, uint64_t count, uint32_t *first) {
    uint64_t bad = 0;
    for (uint64_t i = 0; i < count; i += 8) {
        uint32_t bits[8], got[8], want[8];
        for (int k = 0; k < 8; k++) bits[k] = start + (uint32_t)((i + (uint64_t)k) * stride); // wraps mod 2^32
        __m256 x;
        memcpy(&x, bits, sizeof x);
        __m256 a = fn ? qkv_logf8_avx2_(x) : qkv_expf8_avx2_(x), b = fn ? Sleef_logf8_u10avx2(x) : Sleef_expf8_u10avx2(x);
        memcpy(got, &a, sizeof got);
        memcpy(want, &b, sizeof want);
        qkv_test_count_mismatches(bits, got, want, count - i < 8 ? (int)(count - i) : 8, &bad, first);
    }
    return bad;
}

#else

bool qkv_test_expf_avx2_built(void) { return false; }

uint64_t qkv_test_expf_avx2_mismatches(int fn, uint32_t start, uint32_t stride, uint64_t count, uint32_t *first) {
    (void)fn, (void)start, (void)stride, (void)count, (void)first;
    return 0;
}

#endif
