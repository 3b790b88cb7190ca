/*
 * avx512_transpose.h — a 16 x 16 float transpose in AVX-512 registers, shared by the AVX-512 kernel files
 * (gemm_avx512.c: packing and the small path's B^T; attention_avx512.c: K^T and V^T of short sequences).
 * Include only from files compiled with -mavx512f.
 */
#ifndef QKV_AVX512_TRANSPOSE_H
#define QKV_AVX512_TRANSPOSE_H

#include <immintrin.h>

/* Transpose 16 rows of 16 floats in registers: afterwards r[j] lane i = (before) r[i] lane j. */
static inline __attribute__((always_inline)) void qkv_transpose16_avx512_(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) { /* pairs of rows, interleaved by element */
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* r[i + c], 128-bit block q: column 4q + c of rows i .. i+3 */
        __m512d t0 = _mm512_castps_pd(t[i]), t1 = _mm512_castps_pd(t[i + 1]);
        __m512d t2 = _mm512_castps_pd(t[i + 2]), t3 = _mm512_castps_pd(t[i + 3]);
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
    }
    for (int c = 0; c < 4; c++) { /* gather the 128-bit blocks of column 4q + c from the four row groups */
        t[c] = _mm512_shuffle_f32x4(r[c], r[c + 4], 0x88);
        t[c + 4] = _mm512_shuffle_f32x4(r[c], r[c + 4], 0xdd);
        t[c + 8] = _mm512_shuffle_f32x4(r[c + 8], r[c + 12], 0x88);
        t[c + 12] = _mm512_shuffle_f32x4(r[c + 8], r[c + 12], 0xdd);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm512_shuffle_f32x4(t[c], t[c + 8], 0x88);
        r[c + 8] = _mm512_shuffle_f32x4(t[c], t[c + 8], 0xdd);
        r[c + 4] = _mm512_shuffle_f32x4(t[c + 4], t[c + 12], 0x88);
        r[c + 12] = _mm512_shuffle_f32x4(t[c + 4], t[c + 12], 0xdd);
    }
}

#endif /* QKV_AVX512_TRANSPOSE_H */
