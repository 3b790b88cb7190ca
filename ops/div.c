/*
 * div.c — qkv_div: z = a / b elementwise, NumPy broadcasting.   a [2, 3, 4] / b [2, 3, 1] -> [2, 3, 4]
 * IEEE division: x / 0 is +-inf (NaN for 0 / 0), and the gradients there are inf or NaN too, as PyTorch's.
 */
#include "qkv_internal.h"

// z = a / b
static double div_f(double a, double b) { return a / b; }

// dz/da = 1 / b;  dz/db = -a / b^2
static void div_df(double a, double b, double z, double *dz_da, double *dz_db) {
    (void)z;
    *dz_da = 1.0 / b;
    *dz_db = -a / (b * b);
}

QKV_BINARY_F32_(div, div_f, div_df)

qkv_tensor *qkv_div(qkv_ctx *ctx, qkv_tensor *a, qkv_tensor *b) {
    return qkv_broadcast_binary_(ctx, "qkv_div", a, b, div_f, div_df, &div_f32);
}
