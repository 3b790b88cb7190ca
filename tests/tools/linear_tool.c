/*
 * linear_tool.c — the qkv side of the PyTorch loading test (load_in_torch.py drives it).
 *
 *   linear_tool CKPT IO   write CKPT, a checkpoint holding one projection's parameters as qkv stores
 *                         them, and IO, the input x and the output y = qkv_projection(x, W, b) that
 *                         qkv computes, both with qkv_safetensors_save:
 *                           CKPT: proj.W f32 [d_in, d_out], proj.b f32 [d_out], metadata d_in, d_out
 *                           IO:   x f32 [B, n, d_in], y f32 [B, n, d_out]
 *
 * d_in = 48 and d_out = 20 differ, so a weight loaded without its transpose cannot pass for one with it;
 * the values are smooth formulas of the index, signed and of unequal size.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "qkv.h"

enum { B = 2, N = 7, D_IN = 48, D_OUT = 20 };

static int run(qkv_ctx *ctx, const char *ckpt, const char *io) {
    qkv_tensor *w = qkv_zeros(ctx, QKV_F32, 2, (int64_t[]){D_IN, D_OUT});
    qkv_tensor *b = qkv_zeros(ctx, QKV_F32, 1, (int64_t[]){D_OUT});
    qkv_tensor *x = qkv_zeros(ctx, QKV_F32, 3, (int64_t[]){B, N, D_IN});
    if (!w || !b || !x) return 1;
    for (int i = 0; i < D_IN; i++)
        for (int j = 0; j < D_OUT; j++) qkv_f32(w)[i * D_OUT + j] = (float)(0.3 * sin(1.0 + 3.0 * i + 7.0 * j));
    for (int j = 0; j < D_OUT; j++) qkv_f32(b)[j] = (float)(0.1 * j - 0.7);
    for (int64_t k = 0; k < x->numel; k++) qkv_f32(x)[k] = (float)(cos(0.37 * (double)k) * (1.0 + (double)(k % 5)));
    qkv_tensor *y = qkv_projection(ctx, x, w, b); /* Y = X W + b: [B, n, d_in] [d_in, d_out] -> [B, n, d_out] */
    if (!y) return 1;
    qkv_named_tensor params[] = {{"proj.W", w}, {"proj.b", b}};
    const char *meta[] = {"d_in", "48", "d_out", "20", "layout", "proj.W is [d_in, d_out]: y = x W + b"};
    qkv_named_tensor pair[] = {{"x", x}, {"y", y}};
    if (qkv_safetensors_save(ctx, ckpt, params, 2, meta, 3) != QKV_OK) return 1;
    return qkv_safetensors_save(ctx, io, pair, 2, NULL, 0) != QKV_OK;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s CKPT IO\n", argv[0]);
        return 2;
    }
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    if (!ctx) return 1;
    int rc = run(ctx, argv[1], argv[2]);
    if (rc) fprintf(stderr, "linear_tool: %s\n", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
    return rc;
}
