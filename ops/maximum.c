/*
 * maximum.c — qkv_maximum: z = max(a, b) elementwise, NumPy broadcasting (minimum.c is its mirror).
 * A NaN in either operand gives NaN (as torch.maximum, unlike C's fmax). On a tie a = b the gradient is
 * split in halves, dz/2 to each (as PyTorch 1.13); otherwise it goes to the one chosen. Where either is NaN,
 * both get dz (no comparison holds, so neither is "the other one"), as PyTorch 1.13 does.
 */
#include "qkv_internal.h"

#include <math.h>

// z = max(a, b), NaN if either is
static double maximum_f(double a, double b) { return isnan(a) || isnan(b) ? NAN : a > b ? a : b; }

// dz/da = 1 where a wins, 1/2 on a tie, 0 where b wins; dz/db the rest
static void maximum_df(double a, double b, double z, double *dz_da, double *dz_db) {
    (void)z;
    *dz_da = a == b ? 0.5 : a < b ? 0.0 : 1.0;
    *dz_db = a == b ? 0.5 : b < a ? 0.0 : 1.0;
}

QKV_BINARY_F32_(maximum, maximum_f, maximum_df)

qkv_tensor *qkv_maximum(qkv_ctx *ctx, qkv_tensor *a, qkv_tensor *b) {
    return qkv_broadcast_binary_(ctx, "qkv_maximum", a, b, maximum_f, maximum_df, &maximum_f32);
}
