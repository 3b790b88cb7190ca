/*
 * gemm_portable.c — the packed f32 GEMM with a plain C micro-kernel, compiled with the library's default
 * flags: the fallback on CPUs without AVX2, and on other architectures.
 *
 * Micro-tile: 6 rows x 8 columns of C held in a local array the compiler keeps in vector registers
 * (12 SSE registers on x86-64, 12 NEON registers on AArch64).
 *   C[r, 0:8] (+)= sum_l a[l*6 + r] * b[l*8 + 0:8]
 */
#include "gemm_kernels.h"

#define GEMM_MR 6
#define GEMM_NR 8
#define GEMM_NAME qkv_gemm_f32_portable_
#define GEMM_ROWS_NAME qkv_gemm_f32_portable_rows_

static inline void ukernel(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c,
                           int64_t ldc, bool add) {
    float acc[GEMM_MR][GEMM_NR] = {{0}};
    for (int64_t l = 0; l < kc; l++) {
        // c[r, :] += a[l, r] * b[l, :]
        for (int r = 0; r < GEMM_MR; r++) {
            float ar = a[r];
            for (int j = 0; j < GEMM_NR; j++) acc[r][j] += ar * b[j];
        }
        a += GEMM_MR;
        b += GEMM_NR;
    }
    for (int r = 0; r < GEMM_MR; r++) {
        float *cr = c + r * ldc;
        if (add)
            for (int j = 0; j < GEMM_NR; j++) cr[j] += acc[r][j];
        else
            for (int j = 0; j < GEMM_NR; j++) cr[j] = acc[r][j];
    }
}

#include "gemm_packed.h"
