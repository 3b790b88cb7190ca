/*
 * avx2_transpose.h — an 8 x 8 float transpose in AVX registers, shared by the AVX2 kernel files
 * (gemm_avx2.c: packing and the small path's B^T; attention_avx2.c: K^T and V^T of short sequences).
 * Include only from files compiled with -mavx2.
 */
#ifndef QKV_AVX2_TRANSPOSE_H
#define QKV_AVX2_TRANSPOSE_H

#include <immintrin.h>

/* Transpose 8 rows of 8 floats in registers: afterwards r[j] lane i = (before) r[i] lane j. */
static inline __attribute__((always_inline)) void qkv_transpose8_avx2_(__m256 r[8]) {
    __m256 t[8], s[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) { /* s[i + c], 128-bit half h: column 4h + c of rows i .. i+3 */
        s[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(s[c], s[c + 4], 0x20);
        r[c + 4] = _mm256_permute2f128_ps(s[c], s[c + 4], 0x31);
    }
}

#endif /* QKV_AVX2_TRANSPOSE_H */
