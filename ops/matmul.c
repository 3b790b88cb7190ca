/*
 * matmul.c — batched C = op(A) op(B), op transposing the last two dimensions when its flag is set.
 *   A [B_a, m, k]  (or [B_a, k, m] with QKV_TRANS_A)
 *   B [B_b, k, p]  (or [B_b, p, k] with QKV_TRANS_B)   ->  C [B, m, p]
 * A 2-D operand is a batch of one, and when both are 2-D so is C ([m, p]). B_a and B_b are equal, or one
 * of them is 1 and broadcasts over the other (B = the other); the broadcast side's gradient is then the
 * sum over the batch, which the accumulating GEMMs produce by adding every batch into the same slice.
 * Q K^T is qkv_matmul(q, k, QKV_TRANS_B); A V is qkv_matmul(attn, v, 0).
 */
#include "qkv_internal.h"

/* What the backward needs besides the inputs. */
typedef struct matmul_dims {
    int64_t batch, m, k, p;
    int64_t a_stride, b_stride; /* elements between batches; 0 for a broadcast operand */
} matmul_dims;

/* Element offset i of a float tensor's data (or of its gradient's). */
static void *at(void *data, qkv_dtype dtype, int64_t i) {
    return (char *)data + (size_t)i * qkv_dtype_size(dtype);
}

/* C[m,p] (+)= op(A) op(B) on the native dtype; f32 on the context's threads (the same bits with any count). */
static void gemm_acc(qkv_ctx *ctx, qkv_dtype dtype, const void *a, const void *b, void *c, int64_t m, int64_t k,
                     int64_t p, bool trans_a, bool trans_b, bool accumulate) {
    if (dtype == QKV_F64) qkv_gemm_f64_(a, b, c, m, k, p, trans_a, trans_b, accumulate);
    else qkv_gemm_f32_threads_(qkv_threads(ctx), a, b, c, m, k, p, trans_a, trans_b, accumulate);
}

/* An operand's gradient, and whether batch i stores (=) into it rather than adds (+=): a fresh gradient
 * (qkv_grad_to_write_: made for this backward, not zeroed) is stored by the first batch that writes each
 * slice, which is every batch, or only batch 0 when the operand broadcasts (stride 0: every batch adds into
 * the one slice). Storing rather than zeroing and adding saves a pass over the gradient; the values are the
 * same (0 + x = x). */
typedef struct grad_slot {
    qkv_tensor *g;
    bool fresh;
} grad_slot;

static bool stores(const grad_slot *s, int64_t stride, int64_t i) { return s->fresh && (stride != 0 || i == 0); }

static void matmul_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *a = node->in[0], *b = node->in[1];
    const matmul_dims *d = node->saved;
    const int64_t m = d->m, k = d->k, p = d->p;
    const bool ta = node->flags & QKV_TRANS_A, tb = node->flags & QKV_TRANS_B;
    qkv_dtype dt = a->dtype;
    qkv_tensor *dc = node->out->grad;
    grad_slot sa = {NULL, false}, sb = {NULL, false};
    if (qkv_wants_grad_(a) && !(sa.g = qkv_grad_to_write_(ctx, a, &sa.fresh))) return;
    if (qkv_wants_grad_(b) && !(sb.g = qkv_grad_to_write_(ctx, b, &sb.fresh))) return;
    qkv_tensor *da = sa.g, *db = sb.g;
    /* an empty C adds nothing to dA or dB (an empty sum), so its batch, maybe 2^40 of them, is not walked;
     * a fresh gradient of it is then zero */
    if (dc->numel == 0 || d->batch == 0) {
        if (sa.fresh) memset(da->data, 0, (size_t)da->numel * qkv_dtype_size(dt));
        if (sb.fresh) memset(db->data, 0, (size_t)db->numel * qkv_dtype_size(dt));
        return;
    }
    for (int64_t i = 0; i < d->batch; i++) {
        void *dci = at(dc->data, dt, i * m * p);
        void *ai = at(a->data, dt, i * d->a_stride), *bi = at(b->data, dt, i * d->b_stride);
        if (da) {
            void *dai = at(da->data, dt, i * d->a_stride);
            bool acc = !stores(&sa, d->a_stride, i);
            if (!ta && !tb) gemm_acc(ctx, dt, dci, bi, dai, m, p, k, false, true, acc);  // C = A B:     dA += dC B^T
            if (!ta && tb) gemm_acc(ctx, dt, dci, bi, dai, m, p, k, false, false, acc);  // C = A B^T:   dA += dC B
            if (ta && !tb) gemm_acc(ctx, dt, bi, dci, dai, k, p, m, false, true, acc);   // C = A^T B:   dA += B dC^T
            if (ta && tb) gemm_acc(ctx, dt, bi, dci, dai, k, p, m, true, true, acc);     // C = A^T B^T: dA += B^T dC^T
        }
        if (db) {
            void *dbi = at(db->data, dt, i * d->b_stride);
            bool acc = !stores(&sb, d->b_stride, i);
            if (!ta && !tb) gemm_acc(ctx, dt, ai, dci, dbi, k, m, p, true, false, acc);  // C = A B:     dB += A^T dC
            if (!ta && tb) gemm_acc(ctx, dt, dci, ai, dbi, p, m, k, true, false, acc);   // C = A B^T:   dB += dC^T A
            if (ta && !tb) gemm_acc(ctx, dt, ai, dci, dbi, k, m, p, false, false, acc);  // C = A^T B:   dB += A dC
            if (ta && tb) gemm_acc(ctx, dt, dci, ai, dbi, p, m, k, true, true, acc);     // C = A^T B^T: dB += dC^T A^T
        }
    }
}

qkv_tensor *qkv_matmul(qkv_ctx *ctx, qkv_tensor *a, qkv_tensor *b, int flags) {
    const char *fn = "qkv_matmul";
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "a", a) || !qkv_check_float_(ctx, fn, "b", b) ||
        !qkv_check_same_dtype_(ctx, fn, a, "a", b, "b"))
        return NULL;
    if (flags & ~(QKV_TRANS_A | QKV_TRANS_B))
        return qkv_fail_(ctx, QKV_ERR_ARG,
                         "%s: a is %s, b is %s: flags %d has bits other than QKV_TRANS_A and QKV_TRANS_B", fn,
                         QKV_SHAPE(a), QKV_SHAPE(b), flags);
    if (a->ndim < 2 || a->ndim > 3 || b->ndim < 2 || b->ndim > 3)
        return qkv_fail_(ctx, QKV_ERR_RANK,
                         "%s: a is %s, b is %s: operands must be 2-D or 3-D (%d-D and %d-D)",
                         fn, QKV_SHAPE(a), QKV_SHAPE(b), a->ndim, b->ndim);
    const bool ta = flags & QKV_TRANS_A, tb = flags & QKV_TRANS_B;
    const char *a_note = ta ? " (transposed)" : "", *b_note = tb ? " (transposed)" : "";
    int64_t a_batch = a->ndim == 3 ? a->shape[0] : 1, b_batch = b->ndim == 3 ? b->shape[0] : 1;
    int64_t a_rows = a->shape[a->ndim - 2], a_cols = a->shape[a->ndim - 1];
    int64_t b_rows = b->shape[b->ndim - 2], b_cols = b->shape[b->ndim - 1];
    int64_t m = ta ? a_cols : a_rows, ka = ta ? a_rows : a_cols;
    int64_t kb = tb ? b_cols : b_rows, p = tb ? b_rows : b_cols;
    if (ka != kb)
        return qkv_fail_(ctx, QKV_ERR_SHAPE,
                         "%s: a is %s%s, b is %s%s: inner dimensions %lld and %lld differ",
                         fn, QKV_SHAPE(a), a_note, QKV_SHAPE(b), b_note, (long long)ka, (long long)kb);
    if (a_batch != b_batch && a_batch != 1 && b_batch != 1)
        return qkv_fail_(ctx, QKV_ERR_SHAPE,
                         "%s: a is %s, b is %s: batch dimensions %lld and %lld differ (must be equal or 1)",
                         fn, QKV_SHAPE(a), QKV_SHAPE(b), (long long)a_batch, (long long)b_batch);
    int64_t batch = a_batch == 1 ? b_batch : a_batch, k = ka;

    qkv_tensor *c = a->ndim == 2 && b->ndim == 2
                        ? qkv_new_tensor_(ctx, fn, a->dtype, 2, (int64_t[]){m, p})
                        : qkv_new_tensor_(ctx, fn, a->dtype, 3, (int64_t[]){batch, m, p});
    if (!c) return NULL;
    /* hardening fix (fuzz_graph): a batch of 0 paired with any m, k, p (a [0, 2^62, 5] was a legal empty
     * tensor), so m * k could overflow (UB); now m * k and k * p are products of a valid tensor's
     * dimensions, which fit (qkv.h, QKV_MAX_NUMEL), and with a batch of 2 or more at most numel / 2 */
    int64_t a_stride = a_batch <= 1 ? 0 : m * k, b_stride = b_batch <= 1 ? 0 : k * p;
    /* an empty C ([2^40, 0, p] from a [2^40, 0, 3]) has nothing to compute: no walk over its batch */
    for (int64_t i = 0; c->numel > 0 && i < batch; i++) {
        // C_i [m, p] = op(A_i) [m, k] op(B_i) [k, p]
        void *ai = at(a->data, a->dtype, i * a_stride), *bi = at(b->data, b->dtype, i * b_stride);
        void *ci = at(c->data, c->dtype, i * m * p);
        gemm_acc(ctx, c->dtype, ai, bi, ci, m, k, p, ta, tb, false);
    }

    qkv_tensor *in[2] = {a, b};
    if (qkv_needs_grad_(ctx, in, 2)) {
        matmul_dims *saved = qkv_arena_alloc_(ctx, fn, sizeof *saved);
        if (!saved) return NULL;
        *saved = (matmul_dims){batch, m, k, p, a_stride, b_stride};
        qkv_node_ *node = qkv_record_(ctx, fn, matmul_backward, c, in, 2);
        if (!node) return NULL;
        node->flags = flags;
        node->saved = saved;
    }
    return c;
}
