/*
 * layer_norm_lanes.h — the end of a 16-lane f32 row sum, shared by layer_norm_avx2.c and layer_norm_avx512.c
 * (both compiled with AVX2): (lanes 0-7) + (lanes 8-15), added in layer_norm_kernels.h's order.
 */
#ifndef QKV_LAYER_NORM_LANES_H
#define QKV_LAYER_NORM_LANES_H

#include <immintrin.h>

/* ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7)), t_k = lo8_k + hi8_k */
static inline float lanes_total8(__m256 lo8, __m256 hi8) {
    __m256 t = _mm256_add_ps(lo8, hi8);
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)); // u_k = t_k + t_(k+4)
    __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));                                 // v_0 = u_0 + u_2, v_1 = u_1 + u_3
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}

#endif
