/*
 * gelu_simd.h — the f32 exact-GELU kernels and erf / erfc written once for any vector width, the operations
 * of gelu_portable.c one for one (the same bits; the maths and the bounds: gelu_kernels.h). Included by
 * gelu_avx2.c (8 lanes) and gelu_avx512.c (16 lanes), each of which first defines, for its ISA:
 *   W                     lanes per vector
 *   V_F, V_I, V_M         the float vector, the int32 vector, a lane mask (a comparison's result)
 *   V_SET1(f), V_SET1I(i) broadcast;  V_LOAD(p), V_STORE(p, v) unaligned W floats
 *   V_ADD V_SUB V_MUL V_DIV V_MIN V_MAX, V_FMA(a, b, c) = a b + c, V_FMS(a, b, c) = a b - c (one rounding)
 *   V_AND V_OR V_XOR, V_ANDNOT(a, b) = ~a & b, bitwise on floats
 *   V_ADDI V_SUBI V_SRAI(v, k) V_SLLI(v, k) on int32 lanes;  V_AS_I, V_AS_F reinterpret the bits
 *   V_LT(a, b), V_GT(a, b)  ordered, quiet (false for NaN);  V_BLEND(a, b, m) = m ? b : a per lane
 *   V_ALL(m)              every lane of m set
 *   V_COLUMN(i)           i made ready for V_PERMUTE8 (i & 7 where the permute reads more than 3 bits)
 *   V_PERMUTE8(row, col)  row[col & 7] per lane, row: 8 floats (a piece's coefficients)
 *   SIMD_NAME(f)          f with the ISA's suffix (f_avx2), the name perf shows
 *   SIMD_SET, SIMD_SET_NAME  the kernel set this defines (qkv_gelu_kernels_avx2_) and its name ("avx2")
 * The min / max are the x86 ones (the second operand when either is NaN), as in gelu_portable.c. The tail of
 * fewer than W elements goes through a zero-padded buffer (no masked loads: AMD's vmaskmovps is slow), so
 * every element sees the same operations whatever W is.
 */
#ifndef QKV_GELU_SIMD_H
#define QKV_GELU_SIMD_H

#include "gelu_kernels.h"

#include <string.h>

typedef struct exp_parts {
    V_F e, s1, s2;
} exp_parts;

/* exp(-hi - lo) = e 2^h 2^(n-h) (expneg in gelu_portable.c) */
static inline exp_parts expneg_v(V_F hi, V_F lo) {
    const V_F magic = V_SET1(QKV_ROUND_MAGIC_F);
    V_F neg_hi = V_XOR(hi, V_SET1(-0.0f)); /* -hi, as the C negation */
    V_F tn = V_FMA(neg_hi, V_SET1(QKV_LOG2E_F), magic);
    V_I ni = V_SUBI(V_AS_I(tn), V_AS_I(magic));
    V_F n = V_SUB(tn, magic);
    V_F r = V_FMA(n, V_SET1(-QKV_LN2_HI_F), neg_hi);
    r = V_FMA(n, V_SET1(-QKV_LN2_LO_F), r);
    r = V_SUB(r, lo);
    V_F q = V_SET1(QKV_EXP_E5);
    q = V_FMA(q, r, V_SET1(QKV_EXP_E4));
    q = V_FMA(q, r, V_SET1(QKV_EXP_E3));
    q = V_FMA(q, r, V_SET1(QKV_EXP_E2));
    q = V_FMA(q, r, V_SET1(QKV_EXP_E1));
    q = V_FMA(q, r, V_SET1(QKV_EXP_E0));
    exp_parts out;
    out.e = V_ADD(V_FMA(q, V_MUL(r, r), r), V_SET1(1.0f));
    V_I h = V_SRAI(ni, 1), bias = V_SET1I(127);
    out.s1 = V_AS_F(V_SLLI(V_ADDI(h, bias), 23));
    out.s2 = V_AS_F(V_SLLI(V_ADDI(V_SUBI(ni, h), bias), 23));
    return out;
}

/* f erfc(a) (erfc_core in gelu_portable.c) */
static inline V_F erfc_core_v(V_F a, V_F hi, V_F lo, V_F f, exp_parts *x) {
    V_F t = V_DIV(V_SET1(1.0f), V_FMA(a, V_SET1(0.5f), V_SET1(1.0f)));
    V_F p = V_SET1(QKV_ERFC_P10);
    p = V_FMA(p, t, V_SET1(QKV_ERFC_P9));
    p = V_FMA(p, t, V_SET1(QKV_ERFC_P8));
    p = V_FMA(p, t, V_SET1(QKV_ERFC_P7));
    p = V_FMA(p, t, V_SET1(QKV_ERFC_P6));
    p = V_FMA(p, t, V_SET1(QKV_ERFC_P5));
    p = V_FMA(p, t, V_SET1(QKV_ERFC_P4));
    p = V_FMA(p, t, V_SET1(QKV_ERFC_P3));
    p = V_FMA(p, t, V_SET1(QKV_ERFC_P2));
    p = V_FMA(p, t, V_SET1(QKV_ERFC_P1));
    p = V_FMA(p, t, V_SET1(QKV_ERFC_P0));
    *x = expneg_v(hi, lo);
    V_F m = V_MUL(V_MUL(V_MUL(t, f), p), x->e);
    return V_MUL(V_MUL(m, x->s1), x->s2);
}

static inline V_F abs_v(V_F v) { return V_ANDNOT(V_SET1(-0.0f), v); }

static inline V_F erfc_v(V_F z) {
    V_F a = V_MIN(V_SET1(QKV_ERFC_CLAMP_F), abs_v(z));
    V_F hi = V_MUL(a, a), lo = V_FMS(a, a, hi);
    exp_parts x;
    V_F c = erfc_core_v(a, hi, lo, V_SET1(1.0f), &x);
    V_M neg = V_LT(z, V_SET1(0.0f));
    return V_BLEND(c, V_SUB(V_SET1(2.0f), c), neg);
}

static inline V_F erf_v(V_F v) {
    V_F s = V_MUL(v, v);
    V_F q = V_SET1(QKV_ERF_Q6);
    q = V_FMA(q, s, V_SET1(QKV_ERF_Q5));
    q = V_FMA(q, s, V_SET1(QKV_ERF_Q4));
    q = V_FMA(q, s, V_SET1(QKV_ERF_Q3));
    q = V_FMA(q, s, V_SET1(QKV_ERF_Q2));
    q = V_FMA(q, s, V_SET1(QKV_ERF_Q1));
    q = V_FMA(q, s, V_SET1(QKV_ERF_Q0));
    V_F small = V_MUL(v, q);
    V_F av = abs_v(v), a = V_MIN(V_SET1(QKV_ERFC_CLAMP_F), av);
    V_F hi = V_MUL(a, a), lo = V_FMS(a, a, hi);
    exp_parts x;
    V_F one_minus = V_SUB(V_SET1(1.0f), erfc_core_v(a, hi, lo, V_SET1(1.0f), &x));
    V_F sign = V_AND(v, V_SET1(-0.0f));
    V_F large = V_OR(abs_v(one_minus), sign); // copysign(1 - erfc|z|, z)
    return V_BLEND(large, small, V_LT(av, V_SET1(1.0f)));
}

/* Phi(x) (phi_of in gelu_portable.c); *xc: x clamped to [-15.6, 15.6] */
static inline V_F phi_v(V_F v, V_F *xc_out, exp_parts *x) {
    const V_F cl = V_SET1(QKV_GELU_CLAMP_F);
    V_F xc = V_MIN(cl, V_MAX(V_SET1(-QKV_GELU_CLAMP_F), v));
    V_F a = V_MUL(abs_v(xc), V_SET1(QKV_INV_SQRT2_F));
    V_F half = V_SET1(0.5f), hx = V_MUL(xc, xc);
    V_F hi = V_MUL(half, hx), lo = V_MUL(half, V_FMS(xc, xc, hx));
    V_F c = erfc_core_v(a, hi, lo, half, x);
    *xc_out = xc;
    V_M neg = V_LT(v, V_SET1(0.0f));
    return V_BLEND(V_SUB(V_SET1(1.0f), c), c, neg);
}

/* The polynomial path (poly_u and horner_col in gelu_portable.c): u = min(x, 6) - k, k = round(min(x, 4));
 * *col: the float 1.5 2^23 + k, whose low 3 bits (k mod 8) pick the column (V_PERMUTE8). */
static inline V_F poly_u_v(V_F v, V_I *col) {
    const V_F magic = V_SET1(QKV_ROUND_MAGIC_F);
    V_F km = V_ADD(V_MIN(V_SET1(4.0f), v), magic);
    *col = V_COLUMN(V_AS_I(km));
    return V_SUB(V_MIN(V_SET1(6.0f), v), V_SUB(km, magic));
}

/* sum_j c[j][k] u^j by Horner, k = the lane's piece (horner_col in gelu_portable.c; deg is a constant at
 * both call sites, so the loop unrolls) */
static inline V_F horner_col_v(const float (*c)[8], int deg, V_I col, V_F u) {
    V_F p = V_PERMUTE8(c[deg], col);
    for (int j = deg - 1; j >= 0; j--) p = V_FMA(p, u, V_PERMUTE8(c[j], col));
    return p;
}

static inline V_F phi_poly_v(V_F v) { // Phi(x), x > -3
    V_I col;
    V_F u = poly_u_v(v, &col);
    return horner_col_v(qkv_gelu_phi_c_, QKV_GELU_PHI_DEG, col, u);
}

static inline V_F dphi_poly_v(V_F v) { // Phi(x) + x phi(x), x > -3
    V_I col;
    V_F u = poly_u_v(v, &col);
    return horner_col_v(qkv_gelu_dphi_c_, QKV_GELU_DPHI_DEG, col, u);
}

/* lanes with x > -3 (false for NaN) */
static inline V_M poly_lanes(V_F v) { return V_GT(v, V_SET1(-3.0f)); }

static inline V_F gelu_v(V_F v) {
    V_F y = V_MUL(v, phi_poly_v(v)); // y = x Phi(x)
    V_M ok = poly_lanes(v);
    if (!V_ALL(ok)) { /* a lane of the erfc path */
        V_F xc;
        exp_parts x;
        y = V_BLEND(V_MUL(v, phi_v(v, &xc, &x)), y, ok);
    }
    return y;
}

/* dy/dx = Phi(x) + x phi(x) */
static inline V_F gelu_grad_v(V_F v) {
    V_F g = dphi_poly_v(v);
    V_M ok = poly_lanes(v);
    if (!V_ALL(ok)) {
        V_F xc;
        exp_parts x;
        V_F phi = phi_v(v, &xc, &x);
        V_F xpdf = V_MUL(V_MUL(V_MUL(V_MUL(xc, V_SET1(QKV_INV_SQRT2PI_F)), x.e), x.s1), x.s2); // x phi(x)
        g = V_BLEND(V_ADD(phi, xpdf), g, ok);
    }
    return g;
}

/* out = f(in) over n floats, W at a time, the tail through a padded buffer */
#define UNARY_LOOP(name, f)                                                                                  \
    static void name(const float *in, float *out, int64_t n) {                                               \
        int64_t i = 0;                                                                                       \
        for (; i + W <= n; i += W) V_STORE(out + i, f(V_LOAD(in + i)));                                      \
        if (i < n) {                                                                                         \
            float buf[W] = {0};                                                                              \
            memcpy(buf, in + i, (size_t)(n - i) * sizeof *buf);                                              \
            V_STORE(buf, f(V_LOAD(buf)));                                                                    \
            memcpy(out + i, buf, (size_t)(n - i) * sizeof *buf);                                             \
        }                                                                                                    \
    }

UNARY_LOOP(SIMD_NAME(erf), erf_v)
UNARY_LOOP(SIMD_NAME(erfc), erfc_v)
UNARY_LOOP(SIMD_NAME(gelu_erf_forward), gelu_v)

/* dx = dy (Phi(x) + x phi(x)) (+ dx when add) */
static void SIMD_NAME(gelu_erf_backward)(const float *x, const float *dy, float *dx, int64_t n, bool add) {
    int64_t i = 0;
    if (add)
        for (; i + W <= n; i += W)
            V_STORE(dx + i, V_FMA(V_LOAD(dy + i), gelu_grad_v(V_LOAD(x + i)), V_LOAD(dx + i))); // dx += dy g
    else
        for (; i + W <= n; i += W)
            V_STORE(dx + i, V_MUL(V_LOAD(dy + i), gelu_grad_v(V_LOAD(x + i)))); // dx = dy g
    if (i < n) {
        float bx[W] = {0}, bdy[W] = {0}, bdx[W] = {0};
        size_t left = (size_t)(n - i) * sizeof(float);
        memcpy(bx, x + i, left);
        memcpy(bdy, dy + i, left);
        if (add) memcpy(bdx, dx + i, left);
        V_F g = gelu_grad_v(V_LOAD(bx)), d = V_LOAD(bdy);
        V_STORE(bdx, add ? V_FMA(d, g, V_LOAD(bdx)) : V_MUL(d, g));
        memcpy(dx + i, bdx, left);
    }
}

const qkv_gelu_kernel_set_ SIMD_SET = {
    .name = SIMD_SET_NAME,
    .available = true,
    .erf_forward = SIMD_NAME(gelu_erf_forward),
    .erf_backward = SIMD_NAME(gelu_erf_backward),
    .erf = SIMD_NAME(erf),
    .erfc = SIMD_NAME(erfc),
};

#endif
