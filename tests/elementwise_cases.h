/*
 * elementwise_cases.h — two kernel sets of the exact GELU or of the layer norm compared bit for bit, shared by
 * tests/test_embed_norm_gelu.c (every set this CPU runs) and tests/test_avx512_emulated.c (the AVX-512 sets
 * through SIMDe):
 *   gelu_sets_differ        forward, backward (dx added to and stored fresh), erf and erfc over the caller's
 *                           inputs, the first chunk in pieces of 1 to 33 elements (the 8- and 16-lane tails)
 *   layer_norm_sets_differ  y, mean, rstd, dx, dgamma, dbeta for d from 1 to 40 and 256 (every tail past 8-
 *                           and 16-lane vectors), rows from 1 to 37 (a partial dgamma block), uniform, offset
 *                           (1e4 + uniform) and constant rows, with and without dx
 * Each returns how many values (GELU) or cases (layer norm) differ and logs the first five.
 */
#ifndef QKV_TESTS_ELEMENTWISE_CASES_H
#define QKV_TESTS_ELEMENTWISE_CASES_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "../ops/kernels/gelu_kernels.h"
#include "../ops/kernels/layer_norm_kernels.h"

/* x[0 .. n) through both GELU sets, a chunk at a time: the values that differ (two NaNs count as equal) */
static int64_t gelu_sets_differ(const qkv_gelu_kernel_set_ *ref, const qkv_gelu_kernel_set_ *other, const float *x,
                                int64_t n) {
    enum { CHUNK = 4096, OUTS = 5 };
    static float out[2][OUTS][CHUNK], dy[CHUNK];
    const qkv_gelu_kernel_set_ *k[2] = {ref, other};
    static const char *const what[OUTS] = {"y", "dx fresh", "dx added", "erf", "erfc"};
    int64_t differ = 0;
    for (int64_t at = 0; at < n; at += CHUNK) {
        int64_t m = n - at < CHUNK ? n - at : CHUNK;
        const float *xc = x + at;
        for (int64_t i = 0; i < m; i++) dy[i] = (float)(0.5 + (double)((at + i) % 7) / 8.0);
        for (int s = 0; s < 2; s++) {
            for (int64_t i = 0; i < m; i++) out[s][2][i] = (float)((at + i) % 3) - 1.0f;
            /* the first chunk in pieces of 1, 2, .. 33 elements, the others whole */
            for (int64_t p0 = 0, len = 1; p0 < m; p0 += len, len = len % 33 + 1) {
                if (at > 0) len = m;
                int64_t l = p0 + len <= m ? len : m - p0;
                k[s]->erf_forward(xc + p0, out[s][0] + p0, l);
                k[s]->erf_backward(xc + p0, dy + p0, out[s][1] + p0, l, false);
                k[s]->erf_backward(xc + p0, dy + p0, out[s][2] + p0, l, true);
                k[s]->erf(xc + p0, out[s][3] + p0, l);
                k[s]->erfc(xc + p0, out[s][4] + p0, l);
            }
        }
        for (int f = 0; f < OUTS; f++)
            for (int64_t i = 0; i < m; i++) {
                float a = out[0][f][i], b = out[1][f][i];
                if (memcmp(&a, &b, sizeof a) != 0 && !(isnan(a) && isnan(b)) && differ++ < 5)
                    cr_log_error("%s at x = %.9g: %s %.9g, %s %.9g", what[f], (double)xc[i], other->name, (double)b,
                                 ref->name, (double)a);
            }
    }
    return differ;
}

/* [-1, 1), from its own generator (the same inputs in every file and run) */
static inline double elementwise_uniform(uint64_t *state) {
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
                double v = elementwise_uniform(&state);
                x[i] = (float)(kind == 0 ? v : kind == 1 ? 1e4 + v : (i / d) % 2 ? 0.75 : v);
                dy[i] = (float)elementwise_uniform(&state);
            }
            for (int64_t j = 0; j < d; j++)
                g[j] = (float)(1 + 0.5 * elementwise_uniform(&state)), b[j] = (float)elementwise_uniform(&state);
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

#endif /* QKV_TESTS_ELEMENTWISE_CASES_H */
