/*
 * norm_cases.h — the layer-norm kernel sets compared bit for bit (y, mean, rstd, dx, dgamma, dbeta), shared by
 * tests/test_embed_norm_gelu.c (every set this CPU runs) and tests/test_avx512_emulated.c (the AVX-512 set
 * through SIMDe): d from 1 to 40 and 256 (every tail past 8- and 16-lane vectors), rows from 1 to 37 (a
 * partial dgamma block), uniform, offset (1e4 + uniform) and constant rows, with and without dx.
 */
#ifndef QKV_TESTS_NORM_CASES_H
#define QKV_TESTS_NORM_CASES_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "../ops/kernels/layer_norm_kernels.h"

/* [-1, 1), from its own generator (the same inputs in every file and run) */
static inline double norm_cases_uniform(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*state >> 11) * 0x1.0p-52 - 1.0;
}

/* The cases where `other` differs from `ref` in any output bit (the first five logged); *cases: how many. */
static int layer_norm_sets_differ(const qkv_layer_norm_kernel_set_ *ref, const qkv_layer_norm_kernel_set_ *other,
                                  int *cases) {
    enum { MAXR = 37, MAXD = 256 };
    static float x[MAXR * MAXD], dy[MAXR * MAXD], g[MAXD], b[MAXD], y[2][MAXR * MAXD], dx[2][MAXR * MAXD];
    static float gb[MAXD], bb[MAXD];
    static double mean[2][MAXR], rstd[2][MAXR], dg[2][MAXD], db[2][MAXD];
    const qkv_layer_norm_kernel_set_ *k[2] = {ref, other};
    uint64_t state = 12345;
    int differ = 0;
    *cases = 0;
    for (int64_t d = 1; d <= MAXD; d = d < 40 ? d + 1 : MAXD + (d == MAXD)) {
        for (int kind = 0; kind < 3; kind++) {
            int64_t rows = 1 + (d * 7 + kind * 11) % MAXR;
            for (int64_t i = 0; i < rows * d; i++) {
                double v = norm_cases_uniform(&state);
                x[i] = (float)(kind == 0 ? v : kind == 1 ? 1e4 + v : (i / d) % 2 ? 0.75 : v);
                dy[i] = (float)norm_cases_uniform(&state);
            }
            for (int64_t j = 0; j < d; j++)
                g[j] = (float)(1 + 0.5 * norm_cases_uniform(&state)), b[j] = (float)norm_cases_uniform(&state);
            bool with_dx = (d + kind) % 4 != 0;
            for (int s = 0; s < 2; s++) {
                for (int64_t i = 0; i < rows * d; i++) dx[s][i] = (float)(i % 5) - 2.0f;
                memset(dg[s], 0, sizeof dg[s]);
                memset(db[s], 0, sizeof db[s]);
                k[s]->forward(x, g, b, y[s], rows, d, 1e-5, mean[s], rstd[s]);
                k[s]->backward(x, g, dy, mean[s], rstd[s], rows, d, with_dx ? dx[s] : NULL, dg[s], db[s], gb, bb);
            }
            ++*cases;
            bool same = memcmp(y[0], y[1], (size_t)(rows * d) * sizeof(float)) == 0 &&
                        memcmp(dx[0], dx[1], (size_t)(rows * d) * sizeof(float)) == 0 &&
                        memcmp(mean[0], mean[1], (size_t)rows * sizeof(double)) == 0 &&
                        memcmp(rstd[0], rstd[1], (size_t)rows * sizeof(double)) == 0 &&
                        memcmp(dg[0], dg[1], (size_t)d * sizeof(double)) == 0 &&
                        memcmp(db[0], db[1], (size_t)d * sizeof(double)) == 0;
            if (!same && differ++ < 5)
                cr_log_error("d = %lld, rows = %lld, kind %d%s: the %s kernels differ from the %s ones", (long long)d,
                             (long long)rows, kind, with_dx ? "" : " (no dx)", other->name, ref->name);
        }
    }
    return differ;
}

#endif
