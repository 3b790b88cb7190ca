/*
 * qkv/elementwise.h — elementwise operators (included by qkv.h): exp, log, sqrt, ..., and the binary ones
 * with NumPy broadcasting. f32 and f64; each result is a step tensor; gradients flow to every float input.
 *
 * f64 values are computed with libm. f32 values are computed on the float arrays: exp, log, tanh, sigmoid,
 * softplus and pow_scalar with SLEEF's 1-ulp float functions where the CPU has AVX2 or AVX-512 (within 1 ulp
 * of the f64 result rounded to float; 3 ulp for sigmoid and softplus, which add a float division or addition;
 * pow_scalar's exponent rounded to float), in double with libm elsewhere; every other operator in double and
 * rounded once (the f64 result rounded to float). Where an
 * operator meets an edge (log 0, sqrt 0, the kink of abs, a bound of clamp, a tie of maximum) its value and
 * gradient are those of PyTorch 1.13, as each comment says, and IEEE arithmetic holds elsewhere (0 * inf is
 * NaN: a gradient of 0 times an infinite derivative is NaN, in PyTorch too). tests/test_elementwise.c checks
 * each against PyTorch 1.13's values and gradients (tests/data/elementwise/, made by
 * tests/tools/make_elementwise_golden.py).
 */
#ifndef QKV_ELEMENTWISE_H
#define QKV_ELEMENTWISE_H

#include "../qkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------------ */
/* Unary operators: x [...] -> y [...] of the same shape, dx += dy * dy/dx                            */
/* ------------------------------------------------------------------------------------------------ */

/* y = e^x; dy/dx = y. Overflows to +inf above 709.78 (f64) or 88.72 (f32). */
QKV_API qkv_tensor *qkv_exp(qkv_ctx *ctx, qkv_tensor *x);
/* y = ln x; dy/dx = 1/x. log 0 = -inf with gradient +inf; x < 0 gives NaN. */
QKV_API qkv_tensor *qkv_log(qkv_ctx *ctx, qkv_tensor *x);
/* y = sqrt(x); dy/dx = 1 / (2 y). sqrt 0 = 0 with gradient +inf; x < 0 gives NaN. */
QKV_API qkv_tensor *qkv_sqrt(qkv_ctx *ctx, qkv_tensor *x);
/* y = 1 / sqrt(x); dy/dx = -y^3 / 2. rsqrt 0 = +inf with gradient -inf. */
QKV_API qkv_tensor *qkv_rsqrt(qkv_ctx *ctx, qkv_tensor *x);
/* y = tanh(x); dy/dx = 1 - y^2. */
QKV_API qkv_tensor *qkv_tanh(qkv_ctx *ctx, qkv_tensor *x);
/* y = 1 / (1 + e^-x) without overflow at either end; dy/dx = y (1 - y). */
QKV_API qkv_tensor *qkv_sigmoid(qkv_ctx *ctx, qkv_tensor *x);
/* y = ln(1 + e^x), exact everywhere (max(x, 0) + log1p(e^-|x|)); dy/dx = sigmoid(x). PyTorch's default
 * threshold (20) returns x itself above it, a relative difference below 1e-9; its threshold=inf agrees. */
QKV_API qkv_tensor *qkv_softplus(qkv_ctx *ctx, qkv_tensor *x);
/* y = |x|; dy/dx = sign(x), 0 at x = 0 and at NaN (as PyTorch). */
QKV_API qkv_tensor *qkv_abs(qkv_ctx *ctx, qkv_tensor *x);
/* y = -x; dy/dx = -1. */
QKV_API qkv_tensor *qkv_neg(qkv_ctx *ctx, qkv_tensor *x);
/* y = x^2; dy/dx = 2x. */
QKV_API qkv_tensor *qkv_square(qkv_ctx *ctx, qkv_tensor *x);
/* y = x^p as C's pow (a negative x with a non-integer p is NaN; 0^p is +inf for p < 0); dy/dx = p x^(p-1),
 * exactly 0 for p = 0 (as PyTorch). A NaN p is QKV_ERR_ARG. */
QKV_API qkv_tensor *qkv_pow_scalar(qkv_ctx *ctx, qkv_tensor *x, double p);
/* y = min(max(x, lo), hi); lo = -INFINITY or hi = INFINITY bounds one side. The gradient passes where
 * lo <= x <= hi, the bounds included, and is 0 outside and at NaN (as PyTorch 1.13). lo or hi NaN, or
 * lo > hi, is QKV_ERR_ARG. */
QKV_API qkv_tensor *qkv_clamp(qkv_ctx *ctx, qkv_tensor *x, double lo, double hi);
/* y = x + c and y = c x for a scalar c (+-inf allowed, NaN is QKV_ERR_ARG); dy/dx = 1 and c. */
QKV_API qkv_tensor *qkv_add_scalar(qkv_ctx *ctx, qkv_tensor *x, double c);
QKV_API qkv_tensor *qkv_mul_scalar(qkv_ctx *ctx, qkv_tensor *x, double c);

/* ------------------------------------------------------------------------------------------------ */
/* Binary operators with NumPy broadcasting                                                           */
/* ------------------------------------------------------------------------------------------------ */

/* Broadcasting, as NumPy and PyTorch: shapes are aligned at their last dimension; in each dimension the
 * sizes are equal, or one of them is 1 (or missing) and stretches: a [B, n, n] / b [B, n, 1] -> [B, n, n],
 * a [n, 1] op b [d] -> [n, d]. The result has the broadcast shape; each operand's gradient is summed over the
 * dimensions it was stretched along, in a fixed order (the same bits every run). Sizes that differ and are not
 * 1 are QKV_ERR_SHAPE naming both shapes and the dimension. (qkv_add, qkv_sub and qkv_mul keep their narrower
 * rule, see qkv.h.) */

/* z = a / b (IEEE: x / 0 is +-inf, 0 / 0 NaN); dz/da = 1/b, dz/db = -a/b^2. */
QKV_API qkv_tensor *qkv_div(qkv_ctx *ctx, qkv_tensor *a, qkv_tensor *b);
/* z = max(a, b) and min(a, b), NaN where either is NaN (as torch.maximum, unlike fmax). The gradient goes to the
 * operand chosen; on a tie it is split in halves, dz/2 to each; where either is NaN both get dz (all three as
 * PyTorch 1.13). */
QKV_API qkv_tensor *qkv_maximum(qkv_ctx *ctx, qkv_tensor *a, qkv_tensor *b);
QKV_API qkv_tensor *qkv_minimum(qkv_ctx *ctx, qkv_tensor *a, qkv_tensor *b);
/* z = mask ? a : b, mask u8 (nonzero picks a), NumPy broadcasting of all three. The gradient goes whole to the
 * operand picked, so a NaN or inf in the one not picked reaches neither z nor any gradient. The node keeps its
 * own copy of the mask. */
QKV_API qkv_tensor *qkv_where(qkv_ctx *ctx, const qkv_tensor *mask, qkv_tensor *a, qkv_tensor *b);

#ifdef __cplusplus
}
#endif

#endif /* QKV_ELEMENTWISE_H */
