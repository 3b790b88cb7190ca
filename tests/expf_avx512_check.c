/*
 * expf_avx512_check.c — test-only, compiled with -mavx512f: ops/kernels/expf_avx512.h's inline exp against the
 * SLEEF function it replaces (Sleef_expf16_u10avx512f), bit for bit (a NaN for a NaN), over a list of float bit
 * patterns.
 */
#include <stdint.h>
#include <string.h>

#include "expf_avx2_check.h"

#if defined(__AVX512F__) && defined(QKV_HAVE_SLEEF)

#include <immintrin.h>
#include <sleef.h>

#include "../ops/kernels/expf_avx512.h"

bool qkv_test_expf_avx512_built(void) { return true; }

uint64_t qkv_test_expf_avx512_mismatches(uint32_t start, uint32_t stride, uint64_t count, uint32_t *first) {
    uint64_t bad = 0;
    for (uint64_t i = 0; i < count; i += 16) {
        uint32_t bits[16], got[16], want[16];
        for (int k = 0; k < 16; k++) bits[k] = start + (uint32_t)((i + (uint64_t)k) * stride); // wraps mod 2^32
        __m512 x;
        memcpy(&x, bits, sizeof x);
        __m512 a = qkv_expf16_avx512_(x), b = Sleef_expf16_u10avx512f(x);
        memcpy(got, &a, sizeof got);
        memcpy(want, &b, sizeof want);
        qkv_test_count_mismatches(bits, got, want, count - i < 16 ? (int)(count - i) : 16, &bad, first);
    }
    return bad;
}

#else

bool qkv_test_expf_avx512_built(void) { return false; }

uint64_t qkv_test_expf_avx512_mismatches(uint32_t start, uint32_t stride, uint64_t count, uint32_t *first) {
    (void)start, (void)stride, (void)count, (void)first;
    return 0;
}

#endif
