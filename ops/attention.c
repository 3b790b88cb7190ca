/*
 * attention.c — scaled dot-product attention, composed from the operators with their own backwards:
 *   q [B, n_q, d_k], k [B, n_k, d_k], v [B, n_k, d_v] -> out [B, n_q, d_v]   (2-D operands: B = 1)
 *   S   = Q K^T                 [B, n_q, n_k]    qkv_matmul(q, k, QKV_TRANS_B)
 *   S'  = scale * S             (scale defaults to 1/sqrt(d_k))
 *   A   = softmax(S', mask)     rows over keys; dropped keys get 0, an all-dropped row is all 0
 *   out = A V                   [B, n_q, d_v]
 * The backward is the chain of the four operators' backwards, recorded on the tape as four nodes.
 */
#include "qkv_internal.h"

#include <math.h>

/* The q, k, v shapes of attention: 2-D or 3-D, same dtype, matching batch and dimensions. */
static bool check_qkv(qkv_ctx *ctx, const char *fn, const qkv_tensor *q, const qkv_tensor *k,
                      const qkv_tensor *v) {
    if (!qkv_check_float_(ctx, fn, "q", q) || !qkv_check_float_(ctx, fn, "k", k) ||
        !qkv_check_float_(ctx, fn, "v", v) || !qkv_check_same_dtype_(ctx, fn, q, "q", k, "k") ||
        !qkv_check_same_dtype_(ctx, fn, q, "q", v, "v"))
        return false;
    const qkv_tensor *ts[3] = {q, k, v};
    const char *names[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++)
        if (ts[i]->ndim != 2 && ts[i]->ndim != 3)
            return qkv_fail_(ctx, QKV_ERR_RANK, "%s: %s is %s; attention takes [B, n, d] or [n, d]", fn,
                             names[i], QKV_SHAPE(ts[i])),
                   false;
    if (q->ndim != k->ndim || q->ndim != v->ndim)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: q is %s, k is %s, v is %s: ranks differ", fn, QKV_SHAPE(q),
                         QKV_SHAPE(k), QKV_SHAPE(v)),
               false;
    int r = q->ndim;
    if (r == 3 && (q->shape[0] != k->shape[0] || q->shape[0] != v->shape[0]))
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: q is %s, k is %s, v is %s: batch dimensions differ", fn,
                         QKV_SHAPE(q), QKV_SHAPE(k), QKV_SHAPE(v)),
               false;
    if (q->shape[r - 1] != k->shape[r - 1])
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: q is %s, k is %s: d_k %lld and %lld differ", fn,
                         QKV_SHAPE(q), QKV_SHAPE(k), (long long)q->shape[r - 1], (long long)k->shape[r - 1]),
               false;
    if (k->shape[r - 2] != v->shape[r - 2])
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: k is %s, v is %s: key counts %lld and %lld differ", fn,
                         QKV_SHAPE(k), QKV_SHAPE(v), (long long)k->shape[r - 2], (long long)v->shape[r - 2]),
               false;
    return true;
}

/* The scale to use: NaN means 1/sqrt(d_k); anything else must be finite. */
static bool resolve_scale(qkv_ctx *ctx, const char *fn, double scale, int64_t d_k, double *out) {
    if (isnan(scale)) {
        *out = d_k > 0 ? 1.0 / sqrt((double)d_k) : 1.0;
        return true;
    }
    if (!isfinite(scale))
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: scale %g is not finite (pass QKV_SCALE_DEFAULT for 1/sqrt(d_k))",
                         fn, scale),
               false;
    *out = scale;
    return true;
}

qkv_tensor *qkv_attention(qkv_ctx *ctx, qkv_tensor *q, qkv_tensor *k, qkv_tensor *v, const qkv_tensor *mask,
                          double scale, int flags, qkv_tensor **attn) {
    const char *fn = "qkv_attention";
    if (attn) *attn = NULL;
    if (!ctx || ctx->status || !check_qkv(ctx, fn, q, k, v)) return NULL;
    double s;
    if (!resolve_scale(ctx, fn, scale, q->shape[q->ndim - 1], &s)) return NULL;
    qkv_tensor *scores = qkv_matmul(ctx, q, k, QKV_TRANS_B); // S = Q K^T
    qkv_tensor *scaled = qkv_scale(ctx, scores, s);            // S' = s S
    qkv_tensor *a = qkv_softmax(ctx, scaled, mask, flags);     // A = softmax(S') by rows
    qkv_tensor *out = qkv_matmul(ctx, a, v, 0);                // out = A V
    if (!out) return NULL;
    if (attn) *attn = a;
    return out;
}

