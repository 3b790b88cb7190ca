/*
 * gemm.c — the reference GEMM: C[m,p] (+)= op(A)[m,k] op(B)[k,p], plain loops, f32 and f64.
 * It is the oracle the fast kernels (ops/kernels/) are tested against, and the path every operator
 * takes when no fast kernel applies. Loop order i-l-j keeps the inner loop contiguous in B and C
 * when B is not transposed; with B transposed the inner loop is a dot product over contiguous rows.
 * The f32 version accumulates in float, as a fast f32 kernel does.
 */
#include "qkv_internal.h"

/* A element (i, l) of op(A): A is [m,k] row-major, or [k,m] when transposed. */
#define OP_A(i, l) (trans_a ? a[(l) * m + (i)] : a[(i) * k + (l)])

#define GEMM_BODY(T)                                                                                   \
    for (int64_t i = 0; i < m; i++) {                                                                  \
        T *c_row = c + i * p;                                                                          \
        if (!accumulate)                                                                               \
            for (int64_t j = 0; j < p; j++) c_row[j] = 0;                                              \
        if (trans_b) {                                                                                 \
            for (int64_t j = 0; j < p; j++) {                                                          \
                T dot = 0; /* c[i,j] += sum_l op(A)[i,l] B[j,l] */                                     \
                for (int64_t l = 0; l < k; l++) dot += OP_A(i, l) * b[j * k + l];                      \
                c_row[j] += dot;                                                                       \
            }                                                                                          \
        } else {                                                                                       \
            for (int64_t l = 0; l < k; l++) {                                                          \
                T a_il = OP_A(i, l); /* c[i,:] += op(A)[i,l] B[l,:] */                                 \
                const T *b_row = b + l * p;                                                            \
                for (int64_t j = 0; j < p; j++) c_row[j] += a_il * b_row[j];                           \
            }                                                                                          \
        }                                                                                              \
    }

void qkv_gemm_f64_(const double *a, const double *b, double *c, int64_t m, int64_t k, int64_t p,
                   bool trans_a, bool trans_b, bool accumulate) {
    GEMM_BODY(double)
}

void qkv_gemm_f32_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                   bool trans_a, bool trans_b, bool accumulate) {
    GEMM_BODY(float)
}
