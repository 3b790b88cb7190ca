/* expf_avx2_check.h — see expf_avx2_check.c and expf_avx512_check.c. */
#ifndef QKV_EXPF_AVX2_CHECK_H
#define QKV_EXPF_AVX2_CHECK_H

#include <stdbool.h>
#include <stdint.h>

/* Whether the check was compiled (x86-64 with -mavx2 -mfma and SLEEF). */
bool qkv_test_expf_avx2_built(void);
/* How many of the count inputs with bits start + i stride (mod 2^32) give other bits than SLEEF's (fn 0: exp,
 * 1: log; any NaN matches any NaN); the first such input's bits in *first. Run it only on a CPU with AVX2 and
 * FMA. */
uint64_t qkv_test_expf_avx2_mismatches(int fn, uint32_t start, uint32_t stride, uint64_t count, uint32_t *first);
/* The same for ops/kernels/expf_avx512.h's exp against Sleef_expf16_u10avx512f (compiled with -mavx512f and
 * SLEEF; run it only on a CPU with AVX-512F). */
bool qkv_test_expf_avx512_built(void);
uint64_t qkv_test_expf_avx512_mismatches(uint32_t start, uint32_t stride, uint64_t count, uint32_t *first);

/* Of lanes results (got against SLEEF's want, for the inputs bits), the first live ones that differ (any NaN
 * matches any NaN): their number, added to *bad, and the first one's input bits in *first when *bad was 0. */
static inline void qkv_test_count_mismatches(const uint32_t *bits, const uint32_t *got, const uint32_t *want,
                                             int live, uint64_t *bad, uint32_t *first) {
    for (int k = 0; k < live; k++) {
        bool nan_both = (got[k] & 0x7fffffffu) > 0x7f800000u && (want[k] & 0x7fffffffu) > 0x7f800000u;
        if (got[k] != want[k] && !nan_both && (*bad)++ == 0) *first = bits[k];
    }
}

#endif
