/*
 * softmax.c — masked softmax over the last dimension.
 *   scores [n_q, n_k] or [B, n_q, n_k] -> A of the same shape
 *   mask   NULL, or u8 [n_q, n_k], [Bm, n_q, n_k] or [Bm, 1, n_k] with Bm dividing B;
 *          scores batch b reads mask batch b / (B / Bm). Nonzero keeps a score, 0 drops it.
 *   QKV_CAUSAL drops key j > query i (combines with a mask).
 *
 * A dropped score is never read: its value (NaN, inf, anything) cannot reach A or dscores. A row with
 * every entry dropped gives A = 0 and dscores = 0. The f32 forward runs the fast row kernel of
 * ops/kernels/attention_*.c (SLEEF exp in f32, the row sum in double; see softmax_f32); the f64 forward
 * (softmax_row, the reference) runs plain loops in double; the backward computes in double per element, on
 * the f32 arrays directly in f32 (softmax_backward_f32: rowsum(dA A) in 8 double lanes where a row has no mask). The backward reads only A
 * (node->out), the flags and the forward's copy of the mask (one byte an entry, in the step arena; the
 * caller's mask may be changed or freed before the backward); it saves nothing else. Kept scores are used as
 * given: a kept NaN or +inf gives NaN in its row, as the mathematics does.
 */
#include "qkv_internal.h"

#include "kernels/attention_kernels.h"
#include "row_sums.h"

#include <math.h>

/* Where the mask and causal flag say which keys a query row may see. */
typedef struct keep_rule {
    const uint8_t *mask; /* NULL: no mask                                       */
    int64_t mask_batch;  /* Bm (1 for a 2-D mask)                               */
    int64_t mask_rows;   /* n_q, or 1 for a [Bm, 1, n_k] padding mask           */
    bool causal;
} keep_rule;

/* The mask row for scores batch b, query i (NULL when there is no mask). */
static const uint8_t *mask_row(const keep_rule *r, int64_t b, int64_t batch, int64_t i, int64_t n_k) {
    if (!r->mask) return NULL;
    int64_t mb = b / (batch / r->mask_batch);
    int64_t mi = r->mask_rows == 1 ? 0 : i;
    return r->mask + (mb * r->mask_rows + mi) * n_k;
}

static inline bool kept(const uint8_t *mrow, bool causal, int64_t i, int64_t j) {
    return (!causal || j <= i) && (!mrow || mrow[j] != 0);
}

static void softmax_backward(qkv_ctx *ctx, qkv_node_ *node);

static bool check_mask(qkv_ctx *ctx, const char *fn, const qkv_tensor *scores, const qkv_tensor *mask,
                       int64_t batch, int64_t n_q, int64_t n_k, keep_rule *rule) {
    if (!qkv_check_tensor_(ctx, fn, "mask", mask)) return false;
    if (mask->dtype != QKV_U8)
        return qkv_fail_(ctx, QKV_ERR_DTYPE, "%s: scores is %s, mask %s is %s; masks are u8 (0 drops, any other byte keeps)",
                         fn, QKV_SHAPE(scores), QKV_SHAPE(mask), qkv_dtype_name(mask->dtype)),
               false;
    if (mask->ndim != 2 && mask->ndim != 3)
        return qkv_fail_(ctx, QKV_ERR_RANK,
                         "%s: scores is %s, mask is %s: a mask has 2 or 3 dimensions ([n_q, n_k], "
                         "[Bm, n_q, n_k] or [Bm, 1, n_k]), not %d",
                         fn, QKV_SHAPE(scores), QKV_SHAPE(mask), mask->ndim),
               false;
    int last = mask->ndim - 1;
    if (mask->shape[last] != n_k)
        return qkv_fail_(ctx, QKV_ERR_SHAPE,
                         "%s: scores is %s, mask is %s: mask dimension %d is %lld, must be n_k = %lld", fn,
                         QKV_SHAPE(scores), QKV_SHAPE(mask), last, (long long)mask->shape[last],
                         (long long)n_k),
               false;
    int64_t rows = mask->shape[last - 1];
    if (rows != n_q && !(mask->ndim == 3 && rows == 1))
        return qkv_fail_(ctx, QKV_ERR_SHAPE,
                         "%s: scores is %s, mask is %s: mask dimension %d is %lld, must be n_q = %lld%s", fn,
                         QKV_SHAPE(scores), QKV_SHAPE(mask), last - 1, (long long)rows, (long long)n_q,
                         mask->ndim == 3 ? " or 1" : ""),
               false;
    int64_t mb = mask->ndim == 3 ? mask->shape[0] : 1;
    if (mb < 1 || batch % mb != 0)
        return qkv_fail_(ctx, QKV_ERR_SHAPE,
                         "%s: scores is %s, mask is %s: mask dimension 0 is %lld, which does not divide the "
                         "scores batch %lld",
                         fn, QKV_SHAPE(scores), QKV_SHAPE(mask), (long long)mb, (long long)batch),
               false;
    rule->mask = mask->data;
    rule->mask_batch = mb;
    rule->mask_rows = rows;
    return true;
}

// A[i, j] = exp(S[i, j] - m_i) / sum_{kept l} exp(S[i, l] - m_i),  m_i = max_{kept l} S[i, l]
static void softmax_row(const double *s, const uint8_t *mrow, bool causal, int64_t i, int64_t n_k, double *a) {
    double m = -INFINITY;
    bool any = false;
    for (int64_t j = 0; j < n_k; j++) {
        if (!kept(mrow, causal, i, j)) continue; /* a dropped score is never loaded */
        double v = s[j];
        if (!any || v > m) m = v;
        any = true;
    }
    if (!any) { /* every entry dropped: zeros, never 0/0 */
        for (int64_t j = 0; j < n_k; j++) a[j] = 0.0;
        return;
    }
    double total = 0.0;
    for (int64_t j = 0; j < n_k; j++) {
        if (!kept(mrow, causal, i, j)) {
            a[j] = 0.0;
            continue;
        }
        a[j] = exp(s[j] - m);
        total += a[j];
    }
    double inv = 1.0 / total; /* total >= 1: the max term is exp(0) */
    for (int64_t j = 0; j < n_k; j++) a[j] *= inv; /* dropped entries stay 0 */
}

/* Row r (batch r / n_q, query r % n_q) of the f32 forward. */
static inline void softmax_f32_row(const qkv_attn_kernel_set_ *ks, const float *s, float *a, const keep_rule *rule,
                                   int64_t r, int64_t batch, int64_t n_q, int64_t n_k) {
    int64_t b = r / n_q, i = r % n_q;
    int64_t len = rule->causal ? (i + 1 < n_k ? i + 1 : n_k) : n_k;
    ks->softmax_row(s + r * n_k, a + r * n_k, n_k, mask_row(rule, b, batch, i, n_k), len);
}

/* The f32 forward: every row through the fast row kernel of this CPU (ops/kernels/attention_*.c: SLEEF's
 * vector exp, masked loads, exp flushed to exactly 0 below FLT_MIN so saturated rows make no subnormals),
 * rows split over qkv_threads(ctx) threads (each row is one thread's: the same bits with any count). */
static void softmax_f32(qkv_ctx *ctx, const qkv_tensor *scores, qkv_tensor *y, const keep_rule *rule,
                        int64_t batch, int64_t n_q, int64_t n_k) {
    const qkv_attn_kernel_set_ *ks = qkv_attn_kernels_();
    int64_t rows = batch * n_q;
    int threads = qkv_threads(ctx);
    const float *s = scores->data;
    float *a = y->data;
    /* each thread at least QKV_GRAIN_SOFTMAX_ entries; below, no OpenMP region (attention_kernels.h) */
    threads = qkv_grain_threads_(threads, rows, (double)rows * (double)n_k, QKV_GRAIN_SOFTMAX_);
    if (threads <= 1) {
        for (int64_t r = 0; r < rows; r++) softmax_f32_row(ks, s, a, rule, r, batch, n_q, n_k);
        return;
    }
    qkv_parallel_region_opened_();
#ifdef QKV_HAVE_OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t r = 0; r < rows; r++) softmax_f32_row(ks, s, a, rule, r, batch, n_q, n_k);
}

qkv_tensor *qkv_softmax(qkv_ctx *ctx, qkv_tensor *scores, const qkv_tensor *mask, int flags) {
    const char *fn = "qkv_softmax";
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "scores", scores)) return NULL;
    if (scores->ndim != 2 && scores->ndim != 3)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: scores is %s: it must be [n_q, n_k] or [B, n_q, n_k]", fn,
                         QKV_SHAPE(scores));
    if (flags & ~QKV_CAUSAL)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: scores is %s: flags 0x%x has unknown bits (only QKV_CAUSAL)",
                         fn, QKV_SHAPE(scores), (unsigned)flags);
    int64_t batch = scores->ndim == 3 ? scores->shape[0] : 1;
    int64_t n_q = scores->shape[scores->ndim - 2], n_k = scores->shape[scores->ndim - 1];
    keep_rule rule = {NULL, 1, 1, (flags & QKV_CAUSAL) != 0};
    if (mask && !check_mask(ctx, fn, scores, mask, batch, n_q, n_k, &rule)) return NULL;
    if (scores->numel == 0) batch = 0; /* nothing to compute, but [2^16, 2^16, 0] would still walk 2^32 rows */

    qkv_tensor *y = qkv_new_like_(ctx, fn, scores);
    if (!y) return NULL;
    if (scores->dtype == QKV_F32) {
        softmax_f32(ctx, scores, y, &rule, batch, n_q, n_k);
    } else {
        double *a = qkv_out_f64_(ctx, fn, y); /* y->data itself */
        if (!a) return NULL;
        for (int64_t b = 0; b < batch; b++) {
            for (int64_t i = 0; i < n_q; i++) {
                int64_t row = (b * n_q + i) * n_k;
                softmax_row((const double *)scores->data + row, mask_row(&rule, b, batch, i, n_k), rule.causal,
                            i, n_k, a + row);
            }
        }
    }

    qkv_tensor *in[1] = {scores};
    if (qkv_needs_grad_(ctx, in, 1)) {
        /* which entries were kept: a copy, as the caller may change or free the mask before the backward */
        qkv_tensor *kept_mask = mask ? qkv_new_like_(ctx, fn, mask) : NULL;
        if (mask && !kept_mask) return NULL;
        if (mask) memcpy(kept_mask->data, mask->data, (size_t)mask->numel);
        qkv_node_ *node = qkv_record_(ctx, fn, softmax_backward, y, in, 1);
        if (!node) return NULL;
        node->flags = flags;
        node->aux = kept_mask; /* A itself is node->out */
    }
    return y;
}

/* f32, on the float arrays: dS = A (dA - r) over the row's kept entries, r = sum of dA A over them in double
 * (8 lanes, row_sums.h, when the row is a prefix: no mask), added into dS's float gradient, or stored when
 * that gradient is fresh (qkv_grad_to_write_: made for this backward, not zeroed; dropped entries get 0). */
QKV_VECTOR_LOOP static void softmax_backward_f32(const keep_rule *rule, const float *a, const float *da, float *ds, bool fresh,
                                 int64_t batch, int64_t n_q, int64_t n_k) {
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < n_q; i++) {
            int64_t row = (b * n_q + i) * n_k;
            const uint8_t *mrow = mask_row(rule, b, batch, i, n_k);
            const float *ar = a + row, *dar = da + row;
            float *dr = ds + row;
            if (!mrow) { // kept: j < len (all, or j <= i when causal)
                int64_t len = rule->causal ? (i + 1 < n_k ? i + 1 : n_k) : n_k;
                double r = dot8_f32(dar, ar, len);
                if (fresh) {
                    for (int64_t j = 0; j < len; j++) dr[j] = (float)((double)ar[j] * ((double)dar[j] - r));
                    for (int64_t j = len; j < n_k; j++) dr[j] = 0.0f;
                } else {
                    for (int64_t j = 0; j < len; j++) dr[j] = (float)((double)dr[j] + (double)ar[j] * ((double)dar[j] - r));
                }
                continue;
            }
            double r = 0.0;
            for (int64_t j = 0; j < n_k; j++)
                if (kept(mrow, rule->causal, i, j)) r += (double)dar[j] * (double)ar[j];
            for (int64_t j = 0; j < n_k; j++) {
                double g = kept(mrow, rule->causal, i, j) ? (double)ar[j] * ((double)dar[j] - r) : 0.0;
                dr[j] = fresh ? (float)g : (float)((double)dr[j] + g);
            }
        }
}

// dS = A * (dA - rowsum(dA * A))   over kept entries; dS = 0 where dropped
static void softmax_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *scores = node->in[0];
    if (!qkv_wants_grad_(scores)) return;
    const qkv_tensor *y = node->out, *mask = node->aux;
    int64_t batch = y->ndim == 3 ? y->shape[0] : 1;
    int64_t n_q = y->shape[y->ndim - 2], n_k = y->shape[y->ndim - 1];
    keep_rule rule = {NULL, 1, 1, (node->flags & QKV_CAUSAL) != 0};
    if (mask) { /* the forward's own copy */
        rule.mask = mask->data;
        rule.mask_batch = mask->ndim == 3 ? mask->shape[0] : 1;
        rule.mask_rows = mask->shape[mask->ndim - 2];
    }
    if (y->dtype == QKV_F32) {
        bool fresh;
        qkv_tensor *ds_t = qkv_grad_to_write_(ctx, scores, &fresh);
        if (ds_t && y->numel) softmax_backward_f32(&rule, y->data, y->grad->data, ds_t->data, fresh, batch, n_q, n_k);
        return;
    }
    qkv_tensor *ds_t = qkv_grad_of_(ctx, scores);
    const double *a = qkv_as_f64_(ctx, node->op, y);
    const double *da = qkv_as_f64_(ctx, node->op, y->grad);
    double *ds = qkv_arena_array_(ctx, node->op, (size_t)y->numel, sizeof(double));
    if (!ds_t || !a || !da || !ds) return;
    if (y->numel == 0) batch = 0; /* an empty tensor may still have 2^32 empty rows */
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t i = 0; i < n_q; i++) {
            int64_t row = (b * n_q + i) * n_k;
            const uint8_t *mrow = mask_row(&rule, b, batch, i, n_k);
            // r = rowsum(dA * A)
            double r = 0.0;
            for (int64_t j = 0; j < n_k; j++)
                if (kept(mrow, rule.causal, i, j)) r += da[row + j] * a[row + j];
            // dS[j] = A[j] * (dA[j] - r)
            for (int64_t j = 0; j < n_k; j++)
                ds[row + j] = kept(mrow, rule.causal, i, j) ? a[row + j] * (da[row + j] - r) : 0.0;
        }
    }
    qkv_accumulate_f64_(ds_t, ds);
}
