/*
 * minimum.c — qkv_minimum: z = min(a, b) elementwise, NumPy broadcasting; maximum.c's mirror.
 * NaN where either operand is NaN (as torch.minimum, unlike C's fmin). The gradient goes to the operand chosen;
 * on a tie it is split, dz/2 to each; where either is NaN both get dz (as PyTorch 1.13).
 */
#include "qkv_internal.h"

#include <math.h>

// z = min(a, b), NaN if either is
static double minimum_f(double a, double b) { return isnan(a) || isnan(b) ? NAN : a < b ? a : b; }

// dz/da = 1 where a wins, 1/2 on a tie, 0 where b wins; dz/db the rest
static void minimum_df(double a, double b, double z, double *dz_da, double *dz_db) {
    (void)z;
    *dz_da = a == b ? 0.5 : a > b ? 0.0 : 1.0;
    *dz_db = a == b ? 0.5 : b > a ? 0.0 : 1.0;
}

QKV_BINARY_F32_(minimum, minimum_f, minimum_df)

qkv_tensor *qkv_minimum(qkv_ctx *ctx, qkv_tensor *a, qkv_tensor *b) {
    return qkv_broadcast_binary_(ctx, "qkv_minimum", a, b, minimum_f, minimum_df, &minimum_f32);
}
