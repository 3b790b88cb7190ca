/*
 * row_sums.h — the row sums of the f32 norm kernels (layer_norm.c, rms_norm.c), of the f32 attention
 * backward's D = rowsum(dO * O) (attention.c, and the short kernels of kernels/attention_avx2.c), and of the
 * reductions along the last axis (sum_dim.c, logsumexp_dim.c, softmax_dim.c, log_softmax.c): values summed in 8
 * double lanes, the lanes added in a fixed order. Double, because an f32 sum of a row of |x| ~ 1e4 loses
 * its spread (and d f32 roundings would dominate the f32 result); 8 independent lanes, because GCC never
 * vectorises a single FP accumulator without -ffast-math (it may not reorder the sum), while 8 lanes are
 * 8 separate sums it can keep in one AVX-512 (or two AVX2) registers. Same bits on every machine.
 */
#ifndef QKV_ROW_SUMS_H
#define QKV_ROW_SUMS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* sum of x[0..d) in 8 double lanes, lanes added in a fixed order (the same bits on every machine) */
static inline double sum8_f32(const float *restrict x, int64_t d) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 8 <= d; j += 8)
        for (int k = 0; k < 8; k++) acc[k] += (double)x[j + k];
    for (int k = 0; j < d; j++, k++) acc[k] += (double)x[j];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* sum8_f32's sum of doubles, in the same order (so an f32 row and its f64 copy give the same sum) */
static inline double sum8_f64(const double *restrict x, int64_t d) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 8 <= d; j += 8)
        for (int k = 0; k < 8; k++) acc[k] += x[j + k];
    for (int k = 0; j < d; j++, k++) acc[k] += x[j];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* sum of a[j] b[j] over [0, d), products and sums in double, 8 lanes */
static inline double dot8_f32(const float *restrict a, const float *restrict b, int64_t d) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 8 <= d; j += 8)
        for (int k = 0; k < 8; k++) acc[k] += (double)a[j + k] * (double)b[j + k];
    for (int k = 0; j < d; j++, k++) acc[k] += (double)a[j] * (double)b[j];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* the largest of x[0..d) in 8 float lanes (-inf for d = 0), and *nan set when some element is NaN: 32
 * independent maxima (four vectors of 8, folded into one at the end) instead of one chain of dependent compares.
 * Written with GCC's vector extensions (which clang has too): GCC vectorised neither the compare-and-select nor
 * the NaN flags of the array form, and the scalar loop took a third of log_softmax's forward; with one vector
 * the chain of compares and blends still took two thirds of it on an AVX-512 Xeon. The largest value does not
 * depend on the order, but for the sign of a zero: of +0 and -0 either may come back. x - m and e^(x - m) are the
 * same for both; only a zero result of log_softmax or logsumexp could take the sign, in a row whose largest is a
 * zero and whose other exps all round to 0. */
typedef float qkv_v8f_ __attribute__((vector_size(32)));
typedef int32_t qkv_v8i_ __attribute__((vector_size(32)));

/* lanewise top = v > top ? v : top, and the NaN lanes of v into unordered (by pointer: a vector passed by value
 * changes the ABI where the caller has no AVX) */
static inline void max8_step_(qkv_v8f_ *top, const qkv_v8f_ *v, qkv_v8i_ *unordered) {
    qkv_v8i_ greater = *v > *top; // all ones where v > top
    *unordered |= *v != *v;       // all ones where v is NaN
    *top = (qkv_v8f_)((greater & (qkv_v8i_)*v) | (~greater & (qkv_v8i_)*top));
}

static inline float max8_f32(const float *restrict x, int64_t d, bool *nan) {
    const qkv_v8f_ low = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    qkv_v8f_ top[4] = {low, low, low, low};
    qkv_v8i_ unordered = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 32 <= d; j += 32)
        for (int a = 0; a < 4; a++) {
            qkv_v8f_ v;
            memcpy(&v, x + j + 8 * a, sizeof v);
            max8_step_(&top[a], &v, &unordered);
        }
    for (; j + 8 <= d; j += 8) {
        qkv_v8f_ v;
        memcpy(&v, x + j, sizeof v);
        max8_step_(&top[0], &v, &unordered);
    }
    for (int a = 1; a < 4; a++) max8_step_(&top[0], &top[a], &unordered); /* the maxima hold no NaN */
    float t[8];
    int32_t u[8];
    memcpy(t, &top[0], sizeof t);
    memcpy(u, &unordered, sizeof u);
    for (int k = 0; j < d; j++, k++) {
        u[k] |= x[j] != x[j];
        t[k] = x[j] > t[k] ? x[j] : t[k];
    }
    float m = t[0];
    int32_t any = u[0];
    for (int k = 1; k < 8; k++) {
        m = t[k] > m ? t[k] : m;
        any |= u[k];
    }
    *nan = any != 0;
    return m;
}

#endif
