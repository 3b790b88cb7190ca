/*
 * cross_entropy.c — mean cross-entropy of logits against i32 targets, through a stable log-softmax.
 *   logits [..., V], targets i32 [...] (logits' leading shape) -> loss [] (a scalar, logits' dtype)
 *
 * A target < 0 is ignored (padding): it adds nothing to the loss, is not counted, and its logits row is
 * never read and gets a zero gradient. The mean is over the counted tokens; with none the loss is 0 and
 * every gradient is 0. A target >= V is QKV_ERR_ARG. When recording, the forward keeps each counted
 * row's softmax, so the backward needs no exp of its own.
 */
#include "qkv_internal.h"

#include <math.h>

/* What the forward saves for the backward: the softmax of every counted row (rows of ignored tokens are
 * left unset and never read). */
typedef struct ce_saved {
    double *softmax; /* [rows, vocab] */
    int64_t rows, vocab;
} ce_saved;

static void cross_entropy_backward(qkv_ctx *ctx, qkv_node_ *node);

static double logit_at(const qkv_tensor *t, int64_t i) {
    return t->dtype == QKV_F64 ? ((const double *)t->data)[i] : (double)((const float *)t->data)[i];
}

qkv_tensor *qkv_cross_entropy(qkv_ctx *ctx, qkv_tensor *logits, const qkv_tensor *targets) {
    const char *fn = "qkv_cross_entropy";
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "logits", logits) || !qkv_check_tensor_(ctx, fn, "targets", targets))
        return NULL;
    if (targets->dtype != QKV_I32)
        return qkv_fail_(ctx, QKV_ERR_DTYPE, "%s: logits is %s, targets %s is %s; targets are i32", fn,
                         QKV_SHAPE(logits), QKV_SHAPE(targets), qkv_dtype_name(targets->dtype));
    if (logits->ndim < 1)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: logits is %s, targets is %s: logits must be [..., V]", fn,
                         QKV_SHAPE(logits), QKV_SHAPE(targets));
    int lead = logits->ndim - 1;
    if (targets->ndim != lead)
        return qkv_fail_(ctx, QKV_ERR_SHAPE,
                         "%s: logits is %s, targets is %s: targets must have %d dimensions (logits' leading "
                         "shape), not %d",
                         fn, QKV_SHAPE(logits), QKV_SHAPE(targets), lead, targets->ndim);
    for (int i = 0; i < lead; i++)
        if (targets->shape[i] != logits->shape[i])
            return qkv_fail_(ctx, QKV_ERR_SHAPE,
                             "%s: logits is %s, targets is %s: dimension %d is %lld in targets and %lld in "
                             "logits",
                             fn, QKV_SHAPE(logits), QKV_SHAPE(targets), i, (long long)targets->shape[i],
                             (long long)logits->shape[i]);
    int64_t rows = targets->numel, vocab = logits->shape[lead];
    const int32_t *tg = targets->data;
    for (int64_t r = 0; r < rows; r++)
        if (tg[r] >= vocab)
            return qkv_fail_(ctx, QKV_ERR_ARG,
                             "%s: logits is %s, targets is %s: target at flat position %lld is %d, must be "
                             "< V = %lld (or < 0 to ignore)",
                             fn, QKV_SHAPE(logits), QKV_SHAPE(targets), (long long)r, (int)tg[r],
                             (long long)vocab);

    qkv_tensor *in[1] = {logits};
    bool recording = qkv_needs_grad_(ctx, in, 1);
    qkv_tensor *loss = qkv_new_tensor_(ctx, fn, logits->dtype, 0, NULL);
    double *e = qkv_arena_array_(ctx, fn, (size_t)(recording ? rows : 1) * (size_t)vocab, sizeof(double));
    if (!loss || !e) return NULL;
    double total = 0.0;
    int64_t count = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (tg[r] < 0) continue; /* ignored: its row is never read */
        int64_t base = r * vocab;
        double *row = recording ? e + base : e;
        // m = max_j x[j]
        double m = logit_at(logits, base);
        for (int64_t j = 1; j < vocab; j++) {
            double v = logit_at(logits, base + j);
            if (v > m) m = v;
        }
        // z = sum_j exp(x[j] - m);  lse = m + log z
        double z = 0.0;
        for (int64_t j = 0; j < vocab; j++) z += row[j] = exp(logit_at(logits, base + j) - m);
        double lse = m + log(z);
        // softmax[j] = exp(x[j] - m) / z, kept for the backward
        if (recording)
            for (int64_t j = 0; j < vocab; j++) row[j] /= z;
        // loss_r = lse - x[t]
        total += lse - logit_at(logits, base + tg[r]);
        count++;
    }
    // loss = sum_r loss_r / count   (0 when nothing is counted)
    double value = count ? total / (double)count : 0.0;
    if (loss->dtype == QKV_F64) *(double *)loss->data = value;
    else *(float *)loss->data = (float)value;

    if (recording) {
        ce_saved *saved = qkv_arena_alloc_(ctx, fn, sizeof *saved);
        if (!saved) return NULL;
        saved->softmax = e;
        saved->rows = rows;
        saved->vocab = vocab;
        qkv_node_ *node = qkv_record_(ctx, fn, cross_entropy_backward, loss, in, 1);
        if (!node) return NULL;
        node->scalar = (double)count;
        node->aux = targets;
        node->saved = saved;
    }
    return loss;
}

// dlogits = (softmax - onehot) * dloss / count;  0 rows for ignored tokens
static void cross_entropy_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *logits = node->in[0];
    if (!qkv_wants_grad_(logits)) return;
    const ce_saved *saved = node->saved;
    const qkv_tensor *targets = node->aux;
    if (!qkv_check_tensor_(ctx, node->op, "targets", targets)) return; /* freed since the forward */
    const int32_t *tg = targets->data;
    double count = node->scalar;
    const qkv_tensor *dl = node->out->grad;
    double g = dl->dtype == QKV_F64 ? *(const double *)dl->data : (double)*(const float *)dl->data;
    qkv_tensor *dx = qkv_grad_of_(ctx, logits);
    double *work = qkv_arena_array_(ctx, node->op, (size_t)logits->numel, sizeof(double));
    if (!dx || !work) return;
    double f = count > 0 ? g / count : 0.0;
    for (int64_t r = 0; r < saved->rows; r++) {
        double *w = work + r * saved->vocab;
        int64_t base = r * saved->vocab;
        if (tg[r] < 0) {
            for (int64_t j = 0; j < saved->vocab; j++) w[j] = 0.0;
            continue;
        }
        const double *p = saved->softmax + base;
        for (int64_t j = 0; j < saved->vocab; j++) w[j] = p[j] * f;
        w[tg[r]] -= f;
    }
    qkv_accumulate_f64_(dx, work);
}
