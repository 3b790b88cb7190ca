/*
 * self_attention.c — self-attention of one sequence batch, from the seed's matrix form:
 *   x [B, n, d_model], Wq, Wk [d_model, d_k], Wv [d_model, d_v] -> out [B, n, d_v]
 *   Q = X Wq,  K = X Wk,  V = X Wv          three projections (qkv_projection)
 *   out = softmax(scale * Q K^T, mask) V    qkv_attention (scale QKV_SCALE_DEFAULT: 1/sqrt(d_k))
 * Gradients reach x, Wq, Wk and Wv through the recorded operators.
 */
#include "qkv_internal.h"

#include <math.h>

qkv_tensor *qkv_self_attention(qkv_ctx *ctx, qkv_tensor *x, qkv_tensor *wq, qkv_tensor *wk, qkv_tensor *wv,
                               const qkv_tensor *mask, double scale, int flags, qkv_tensor **attn) {
    const char *fn = "qkv_self_attention";
    if (attn) *attn = NULL;
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "x", x) || !qkv_check_float_(ctx, fn, "wq", wq) ||
        !qkv_check_float_(ctx, fn, "wk", wk) || !qkv_check_float_(ctx, fn, "wv", wv))
        return NULL;
    if (x->ndim != 2 && x->ndim != 3)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: x is %s; self-attention takes [B, n, d_model] or [n, d_model]",
                         fn, QKV_SHAPE(x));
    int64_t d_model = x->shape[x->ndim - 1];
    const qkv_tensor *ws[3] = {wq, wk, wv};
    const char *names[3] = {"wq", "wk", "wv"};
    for (int i = 0; i < 3; i++) {
        if (ws[i]->ndim != 2 || ws[i]->shape[0] != d_model)
            return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: x is %s, %s is %s: %s must be [d_model = %lld, d]", fn,
                             QKV_SHAPE(x), names[i], QKV_SHAPE(ws[i]), names[i], (long long)d_model);
        if (!qkv_check_same_dtype_(ctx, fn, x, "x", ws[i], names[i])) return NULL;
    }
    if (wq->shape[1] != wk->shape[1])
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: wq is %s, wk is %s: d_k %lld and %lld differ", fn,
                         QKV_SHAPE(wq), QKV_SHAPE(wk), (long long)wq->shape[1], (long long)wk->shape[1]);
    if (scale != QKV_SCALE_DEFAULT && !isfinite(scale)) /* qkv_attention's rule, checked before any work */
        return qkv_fail_(ctx, QKV_ERR_ARG,
                         "%s: x is %s, wq is %s: scale %g is %s (pass QKV_SCALE_DEFAULT, -HUGE_VAL, for "
                         "1/sqrt(d_k), or a finite value)",
                         fn, QKV_SHAPE(x), QKV_SHAPE(wq), scale, isnan(scale) ? "not a number" : "not finite");
    qkv_tensor *q = qkv_projection(ctx, x, wq, NULL); // Q = X Wq
    qkv_tensor *k = qkv_projection(ctx, x, wk, NULL); // K = X Wk
    qkv_tensor *v = qkv_projection(ctx, x, wv, NULL); // V = X Wv
    qkv_tensor *out = qkv_attention(ctx, q, k, v, mask, scale, flags, attn);
    qkv_name_caller_(ctx, fn); /* an error of the calls above names them: fn goes in front */
    return out;
}
