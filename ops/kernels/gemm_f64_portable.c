/*
 * gemm_f64_portable.c — the packed f64 GEMM with a plain C micro-kernel, compiled with the library's default
 * flags: the f64 fallback on CPUs without AVX2, and on other architectures.
 *
 * Micro-tile: 6 rows x 4 columns of C held in a local array the compiler keeps in vector registers
 * (12 SSE2 registers of 2 doubles on x86-64, 12 NEON registers on AArch64).
 *   C[r, 0:4] (+)= sum_l a[l*6 + r] * b[l*4 + 0:4]
 */
#include "gemm_kernels.h"

#define GEMM_T double
#define GEMM_KC QKV_GEMM_F64_KC
#define GEMM_MC QKV_GEMM_F64_MC
#define GEMM_NC QKV_GEMM_F64_NC
#define GEMM_MR 6
#define GEMM_NR 4
#define GEMM_NAME qkv_gemm_f64_portable_

static inline void ukernel(int64_t kc, const double *restrict a, const double *restrict b, double *restrict c,
                           int64_t ldc, bool add) {
    double acc[GEMM_MR][GEMM_NR] = {{0}};
    for (int64_t l = 0; l < kc; l++) {
        // c[r, :] += a[l, r] * b[l, :]
        for (int r = 0; r < GEMM_MR; r++) {
            double ar = a[r];
            for (int j = 0; j < GEMM_NR; j++) acc[r][j] += ar * b[j];
        }
        a += GEMM_MR;
        b += GEMM_NR;
    }
    for (int r = 0; r < GEMM_MR; r++) {
        double *cr = c + r * ldc;
        if (add)
            for (int j = 0; j < GEMM_NR; j++) cr[j] += acc[r][j];
        else
            for (int j = 0; j < GEMM_NR; j++) cr[j] = acc[r][j];
    }
}

#include "gemm_packed.h"
