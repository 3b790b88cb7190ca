/*
 * attention_f64_kernels.h — the f64 row kernels of the fused attention (ops/attention.c): the same three
 * steps as the f32 set's fwd_tile, bwd_p and bwd_ds (attention_kernels.h, where the tile and its keep rule
 * are defined), in double. ops/attention.c holds the plain C ones (libm exp); attention_f64_avx2.c the
 * AVX2+FMA ones (SLEEF Sleef_expd4_u10avx2, 1-ulp exp), used when the CPU has AVX2 and the set was compiled;
 * attention_f64_avx512.c the AVX-512F ones (Sleef_expd8_u10avx512f), used with the AVX-512 f32 set.
 *
 * Subnormals: the AVX2 and AVX-512 sets' exp(x) for x < QKV_EXP_FLUSH_F64 is exactly 0 (the result would be below
 * DBL_MIN = 2^-1022; SLEEF is slow there), where libm's gives a subnormal: an entry below 2.3e-308 against
 * a row maximum of exp(0) = 1 is lost. Everything else follows the plain C kernels, to rounding: a kept NaN
 * makes its row NaN, a dropped score is never used, a row with nothing kept gets P = 0.
 */
#ifndef QKV_ATTENTION_F64_KERNELS_H
#define QKV_ATTENTION_F64_KERNELS_H

#include "attention_kernels.h"

/* ln(DBL_MIN) = -708.3964...; a hair above it so that a 1-ulp exp is still >= DBL_MIN. */
#define QKV_EXP_FLUSH_F64 (-708.39)

typedef struct qkv_attn_f64_kernels_ {
    const char *name;
    bool available; /* compiled in (AVX2+FMA flags and SLEEF at build time) */
    /* m' = max(m, max_c scale*S[r,c]),  alpha = exp(m - m'),  P[r,c] = exp(scale*S[r,c] - m'),
     * l' = alpha l + rowsum(P),  O[r,:] *= alpha;  P overwrites S (0 where dropped), o is rows x d_v */
    void (*fwd_tile)(double *s, const qkv_attn_tile_ *t, double scale, double *m, double *l, double *o,
                     int64_t d_v);
    /* P[r,c] = exp(scale*S[r,c] - lse[r]) over kept keys, 0 elsewhere and for rows with lse = -inf */
    void (*bwd_p)(double *s, const qkv_attn_tile_ *t, double scale, const double *lse);
    /* dS[r,c] = scale P[r,c] (dP[r,c] - dsum[r]), 0 wherever P is 0 */
    void (*bwd_ds)(const double *p, const double *dp, const qkv_attn_tile_ *t, double scale, const double *dsum,
                   double *ds);
} qkv_attn_f64_kernels_;

extern const qkv_attn_f64_kernels_ qkv_attn_f64_kernels_avx2_;
extern const qkv_attn_f64_kernels_ qkv_attn_f64_kernels_avx512_;

#endif
