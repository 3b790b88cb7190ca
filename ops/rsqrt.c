/*
 * rsqrt.c — qkv_rsqrt, elementwise.   x [...] -> y [...]
 * y = 1 / sqrt(x).  rsqrt 0 = +inf with gradient -inf (as PyTorch); x < 0 gives NaN.
 */
#include "qkv_internal.h"

#include <math.h>

// y = 1.0 / sqrt(x)
static double rsqrt_f(double x, const qkv_unary_params_ *p) {
    (void)p;
    return 1.0 / sqrt(x);
}

// dy/dx = -x^(-3/2) / 2 = -y^3 / 2
static double rsqrt_df(double x, double y, const qkv_unary_params_ *p) {
    (void)x, (void)y, (void)p;
    return -0.5 * y * y * y;
}

/* f32: y = 1 / sqrt(x) in float (two roundings: within 1.5 ulp), then one step of Householder's third-order
 * iteration in double, rounded once to float:
 *   e = 1 - x y0^2;   y = y0 (1 + e/2 + 3 e^2/8)   (1 / sqrt(x) = y0 (1 - e)^(-1/2), its series to e^2)
 * |e| < 2^-21, so the step leaves y within about 2^-52 of 1 / sqrt(x), and its float rounding is that of
 * rsqrt_f's double sqrt and division: the same bits for all 2^32 floats, compared once when this was written (a
 * loop of 10 s; test_elementwise compares a sample of them and every edge on each run). y0 of 0, inf or NaN
 * (x = inf, +-0, x < 0 or NaN) is the result itself. Why: the double sqrt and division ran on half the lanes of
 * the float ones, and the forward took three times the backward's time; this runs 8 or 16 float square roots at a
 * time (bench/ops rsqrt: 1.82 to 0.98 ms on an AVX-512 Xeon). */
static inline float rsqrt_ff(float x) {
    float y0 = 1.0f / sqrtf(x);
    double d = (double)y0;
    double e = 1.0 - ((double)x * d) * d;
    float y = (float)(d + d * (e * (0.5 + 0.375 * e)));
    return y == y ? y : y0; // the step is NaN exactly when y0 is 0, inf or NaN (0 inf in e); a select: the loop vectorises
}
QKV_VECTOR_LOOP static void rsqrt_forward_f32(const float *restrict x, float *restrict y, int64_t n,
                                             const qkv_unary_params_ *p) {
    (void)p;
    for (int64_t i = 0; i < n; i++) y[i] = rsqrt_ff(x[i]);
}
QKV_UNARY_F32_BACKWARD_(rsqrt, rsqrt_df)
static const qkv_unary_f32_ rsqrt_f32 = {-1, rsqrt_forward_f32, -1, rsqrt_backward_f32};

qkv_tensor *qkv_rsqrt(qkv_ctx *ctx, qkv_tensor *x) {
    return qkv_unary_(ctx, "qkv_rsqrt", x, rsqrt_f, rsqrt_df, (qkv_unary_params_){0, 0}, &rsqrt_f32);
}
