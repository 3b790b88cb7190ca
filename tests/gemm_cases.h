/*
 * gemm_cases.h — what tests/test_kernels.c and tests/test_avx512_emulated.c share to check f32 GEMMs: the
 * tolerance, the guard after C, a seeded generator independent of the library's RNG, random operands, and the
 * double oracle with the sum of absolute products each error is measured against.
 */
#ifndef QKV_TESTS_GEMM_CASES_H
#define QKV_TESTS_GEMM_CASES_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#define TOL 1e-5
#define GUARD 16 /* floats after C that no GEMM may touch */

static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static inline float frand(void) { /* uniform in [-1, 1), xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t x = rng_state * 0x2545f4914f6cdd1du;
    return (float)((double)(x >> 40) / (double)(1u << 23) - 1.0);
}

static inline float *rand_array(int64_t n) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    cr_assert_not_null(x);
    for (int64_t i = 0; i < n; i++) x[i] = frand();
    return x;
}

/* ref = op(A) op(B) (+ C when acc) in double, and mag = the sum of |products| (and |C|) of each element: the
 * scale a norm-wise error of C is measured against. */
static inline void gemm_oracle(const float *a, const float *b, const float *c, double *ref, double *mag, int64_t m,
                               int64_t k, int64_t p, bool ta, bool tb, bool acc) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < p; j++) {
            double s = acc ? (double)c[i * p + j] : 0.0, size = fabs(s);
            for (int64_t l = 0; l < k; l++) {
                double x = ta ? a[l * m + i] : a[i * k + l], y = tb ? b[j * k + l] : b[l * p + j];
                s += x * y;
                size += fabs(x * y);
            }
            ref[i * p + j] = s;
            mag[i * p + j] = size;
        }
}

#endif
