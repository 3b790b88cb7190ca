/*
 * unary_kernels.h — the f32 maps of the transcendental elementwise operators (ops/exp.c, log.c, tanh.c,
 * sigmoid.c, softplus.c, pow_scalar.c), one set per instruction set:
 *   unary_portable.c   each element in double with libm, rounded once to float (the correctly rounded result
 *                      but for a double rounding, about one input in 2^29)
 *   unary_avx2.c       SLEEF's 1-ulp float functions, 8 lanes (Sleef_expf8_u10avx2, ...)
 *   unary_avx512.c     the same functions, 16 lanes (Sleef_expf16_u10avx512f, ...)
 * The SIMD sets agree with the portable one to within 1 ulp for exp, log, tanh and pow, 3 ulp for sigmoid
 * and softplus, 4 for the fast tanh (a SLEEF exp or log1p, then a division or an addition in float); they may
 * differ from each other in the last bit. Edges follow C's functions (IEEE): exp(-inf) = 0, log 0 = -inf, log of x < 0 = NaN,
 * tanh(+-inf) = +-1, NaN in NaN out; sigmoid and softplus never overflow (e^-|x| only).
 */
#ifndef QKV_UNARY_KERNELS_H
#define QKV_UNARY_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

typedef enum {
    QKV_VF_EXP_,      /* y = e^x                                   */
    QKV_VF_LOG_,      /* y = ln x                                  */
    QKV_VF_TANH_,     /* y = tanh x                                */
    QKV_VF_SIGMOID_,  /* y = 1 / (1 + e^-x), as e / (1 + e) for x < 0, e = e^-|x| */
    QKV_VF_SOFTPLUS_, /* y = max(x, 0) + log1p(e^-|x|)             */
    QKV_VF_POW_,      /* y = x^p                                   */
    QKV_VF_TANH_FAST_, /* y = tanh x within 4 ulp (SLEEF's 3.5-ulp tanhf, 2.5x faster than its 1-ulp one on AVX2):
                        * the soft-capped fused attention's tiles (ops/attention.c), where the scores themselves
                        * carry f32 rounding; the portable set's is tanh's */
    QKV_VF_COUNT_,
    QKV_VF_SQRT_POW_ = QKV_VF_COUNT_ /* inside the SIMD maps only: pow with p = 0.5, as sqrt (see unary_simd.h) */
} qkv_vf_;

typedef struct qkv_unary_kernel_set_ {
    const char *name;
    bool available; /* compiled with its ISA flags and SLEEF */
    /* y[i] = f(x[i]) for i < n (p: pow's exponent, unused otherwise); x and y may be the same array */
    void (*map)(qkv_vf_ f, const float *x, float *y, int64_t n, float p);
    /* Optional (NULL: map, then sum8_f32 of ops/row_sums.h). For two rows of n, x0 and x1 (the same row twice is
     * allowed): sums[r] = sum_{i < n} e^(xr[i] - shift_r) with the bits of map(QKV_VF_EXP_) over the floats
     * xr[i] - shift_r followed by sum8_f32 of the results (8 double lanes, lane i mod 8), in one pass and nothing
     * stored (log_softmax's forward needs only the sums). Two rows, because one row's sum is a chain of
     * dependent additions that bounded the loop: two chains interleaved run in the time of one. */
    void (*exp_sum2)(const float *x0, float shift0, const float *x1, float shift1, int64_t n, double sums[2]);
} qkv_unary_kernel_set_;

extern const qkv_unary_kernel_set_ qkv_unary_kernels_portable_;
extern const qkv_unary_kernel_set_ qkv_unary_kernels_avx2_;
extern const qkv_unary_kernel_set_ qkv_unary_kernels_avx512_;

/* The set this CPU runs (decided once). */
const qkv_unary_kernel_set_ *qkv_unary_kernels_(void);
/* The set of one ISA (QKV_ISA_PORTABLE_, QKV_ISA_AVX2_, QKV_ISA_AVX512_), or NULL when not compiled in or not
 * supported. */
const qkv_unary_kernel_set_ *qkv_unary_kernels_isa_(int isa);

#endif
