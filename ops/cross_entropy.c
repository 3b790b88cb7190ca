/*
 * cross_entropy.c — mean cross-entropy of logits against i32 targets, through a stable log-softmax.
 *   logits [..., V], targets i32 [...] (logits' leading shape) -> loss [] (a scalar, logits' dtype)
 *
 * A target < 0 is ignored (padding): it adds nothing to the loss, is not counted, its logits row is never
 * read, and nothing is added to its gradient row (the f64 path adds zeros). The mean is over the counted
 * tokens; with none the loss is 0 and the gradient is left as it was. A target >= V is QKV_ERR_ARG. When
 * recording, the forward keeps each counted row's softmax (in the logits' dtype), so the backward needs
 * no exp of its own, and a copy of the targets (4 bytes a row), so the backward reads nothing of the
 * caller's: targets changed or freed between forward and backward change nothing.
 *
 * f64 logits run the reference loops in double (libm exp and log). f32 logits run the counted rows, up to 16
 * consecutive ones a call, through the softmax row kernels of this CPU (ops/kernels/attention_*.c: SLEEF's
 * vector expf, two rows a vector for V <= 8 on AVX-512, each row's sum in double, entries below FLT_MIN
 * flushed to 0), straight into the saved f32 softmax. The row's loss is then read
 * off that softmax in double, as log(1 + sum_{j != t} a[j] / a[t]) (from the row's argmax instead when a[t]
 * underflowed to 0: the loss stays accurate far below FLT_MIN), and the rows' logs are summed as the
 * log1p of four running products (rows taken in turn, so the products' chains overlap), so that no row pays
 * for a log. The f32 backward adds
 * (softmax - onehot) * dloss / count straight into the f32 gradient.
 * A NaN or +inf logit in a counted row makes its loss and its gradient row NaN, in both dtypes; a -inf
 * logit has probability 0 (an infinite loss if it is the target's, NaN if the whole row is -inf).
 * Over qkv_threads(ctx) threads (ops/parallel.h), when recording, the f32 forward's chunks (the same chunks
 * as on one thread) are split between the threads, each row's softmax, excess and argmax gap kept, and the
 * rows' losses then summed by one thread in row order; the f32 backward splits the rows. The same bits for
 * any count.
 */
#include "qkv_internal.h"

#include "kernels/attention_kernels.h"
#include "parallel.h"

#include <math.h>
#include <string.h>

/* What the forward saves for the backward: the softmax of every counted row, in the logits' dtype (rows
 * of ignored tokens are left unset and never read), and its own copy of the targets, each checked < V: the
 * backward indexes rows with them, and the caller's targets tensor may have been changed (a target of 1e9
 * would write far outside the gradient) or freed since the forward. */
typedef struct ce_saved {
    void *softmax;     /* [rows, vocab]: double for f64 logits, float for f32 */
    int32_t *targets;  /* [rows]: the targets the forward used               */
    int64_t rows, vocab;
} ce_saved;

static void cross_entropy_backward(qkv_ctx *ctx, qkv_node_ *node);

enum { F32_CHUNK = 16 };

/* Eight lanes (GCC and clang vector extensions: one AVX-512 register, two AVX2 ones, or four SSE2 ones). */
typedef double f64x8 __attribute__((vector_size(64)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef int64_t i64x8 __attribute__((vector_size(64)));
typedef int32_t i32x8 __attribute__((vector_size(32)));

// s[i] = z_k - 1 = sum_{j != k} a[i, j] / a[i, k]  for each of rows <= F32_CHUNK rows (k = at[i], a[i, k] > 0;
// z_k = sum_j exp(x[j] - x[k])): the sum in double as eight interleaved partials, one lane each, summed in a
// fixed tree (the same order on every CPU); the divisions after all the sums, in one vectorised loop
// (rows of exactly 8 go eight rows at a time, transposed: lane l of column c is row l's a[c], the same sums)
QKV_VECTOR_LOOP static void excess_rows(const float *a, const int64_t *at, int64_t rows, int64_t n, double *s) {
    double others[F32_CHUNK], own[F32_CHUNK];
    const i64x8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
    int64_t i = 0;
    for (; n == 8 && i + 8 <= rows; i += 8) {
        f32x8 r[8], t[8], u[8], col[8];
        for (int l = 0; l < 8; l++) memcpy(&r[l], a + (i + l) * 8, sizeof r[l]);
        for (int l = 0; l < 8; l += 2) { /* 128-bit halves: rows l, l+1 interleaved */
            t[l] = __builtin_shufflevector(r[l], r[l + 1], 0, 8, 1, 9, 4, 12, 5, 13);
            t[l + 1] = __builtin_shufflevector(r[l], r[l + 1], 2, 10, 3, 11, 6, 14, 7, 15);
        }
        for (int l = 0; l < 8; l += 4) { /* u[l + c], half h: column c + 4h of rows l .. l+3 */
            u[l] = __builtin_shufflevector(t[l], t[l + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            u[l + 1] = __builtin_shufflevector(t[l], t[l + 2], 2, 3, 10, 11, 6, 7, 14, 15);
            u[l + 2] = __builtin_shufflevector(t[l + 1], t[l + 3], 0, 1, 8, 9, 4, 5, 12, 13);
            u[l + 3] = __builtin_shufflevector(t[l + 1], t[l + 3], 2, 3, 10, 11, 6, 7, 14, 15);
        }
        for (int c = 0; c < 4; c++) {
            col[c] = __builtin_shufflevector(u[c], u[c + 4], 0, 1, 2, 3, 8, 9, 10, 11);
            col[c + 4] = __builtin_shufflevector(u[c], u[c + 4], 4, 5, 6, 7, 12, 13, 14, 15);
        }
        i32x8 k;
        for (int l = 0; l < 8; l++) k[l] = (int32_t)at[i + l];
        f64x8 part[8];
        for (int c = 0; c < 8; c++) part[c] = __builtin_convertvector((f32x8)((i32x8)col[c] & (k != c)), f64x8);
        f64x8 sum = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
        memcpy(others + i, &sum, sizeof sum);
        for (int l = 0; l < 8; l++) own[i + l] = (double)a[(i + l) * 8 + at[i + l]];
    }
    for (; i < rows; i++) {
        const float *row = a + i * n;
        int64_t k = at[i], j = 0;
        f64x8 part = {0};
        for (; j + 8 <= n; j += 8) {
            f32x8 x;
            memcpy(&x, row + j, sizeof x);
            i64x8 not_k = (lane + j) != k; /* all ones except at k */
            part += (f64x8)((i64x8)__builtin_convertvector(x, f64x8) & not_k);
        }
        double tail = 0.0;
        for (; j < n; j++) tail += j == k ? 0.0 : (double)row[j];
        others[i] = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7])) + tail;
        own[i] = (double)row[k];
    }
    for (i = 0; i < rows; i++) s[i] = others[i] / own[i];
}

/* The running f32 loss: sum_r loss_r = gaps + logs + sum_i log1p(q[i]). */
enum { LOSS_CHAINS = 4 };
typedef struct loss_sum {
    double gaps;           /* sum of x[k] - x[t] over the rows measured from their argmax k         */
    double logs;           /* logs of the products q flushed before they could overflow             */
    double q[LOSS_CHAINS]; /* prod_r z_r - 1 over the rows since the last flush, rows taken in turn */
    int64_t rows;          /* rows added so far (which product the next row joins)                  */
} loss_sum;

/* The column loss_r is measured from for a row (logits xr, its softmax a, target t): t itself, or its first
 * argmax when a[t] underflowed to 0 (or the row is NaN), the difference x[k] - x[t] then noted in gaps. */
static inline int64_t measured_from(loss_sum *ls, const float *xr, const float *a, int64_t vocab, int64_t t) {
    // loss_r = lse - x[t] = log z_t,  z_t = sum_j exp(x[j] - x[t]) = 1 + sum_{j != t} a[j] / a[t]
    if (a[t] > 0.0f) return t;
    int64_t k = 0;
    for (int64_t j = 1; j < vocab; j++)
        if (xr[j] > xr[k]) k = j;
    // lse - x[t] = (x[k] - x[t]) + log z_k,  a[k] = exp(0) / z >= 1 / V: nothing underflows
    ls->gaps += (double)xr[k] - (double)xr[t];
    return k;
}

/* Adds log z = log1p(s) of one row to the sum. */
static inline void add_row_loss(loss_sum *ls, double s) {
    // sum_r log z_r = log1p(q),  q = prod_r (1 + s_r) - 1 built as q' = q + s + q s (no cancellation)
    double *q = &ls->q[ls->rows++ % LOSS_CHAINS];
    *q = (*q + s) + *q * s;
    if (*q > 0x1p800) { /* before q could overflow (z_r < 2^127: a[k] >= FLT_MIN): log what is there */
        ls->logs += log1p(*q);
        *q = 0.0;
    }
}

/* The f64 rows (the reference): softmax into e (every row's when recording, else one row reused) and the
 * summed loss of the counted rows. */
static double forward_f64(const double *x, const int32_t *tg, int64_t rows, int64_t vocab, bool recording,
                          double *e, int64_t *count) {
    double total = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        if (tg[r] < 0) continue; /* ignored: its row is never read */
        int64_t base = r * vocab;
        double *row = recording ? e + base : e;
        // m = max_j x[j]
        double m = x[base];
        for (int64_t j = 1; j < vocab; j++) {
            double v = x[base + j];
            if (v > m) m = v;
        }
        // z = sum_j exp(x[j] - m)
        double z = 0.0;
        for (int64_t j = 0; j < vocab; j++) z += row[j] = exp(x[base + j] - m);
        // softmax[j] = exp(x[j] - m) / z, kept for the backward
        if (recording)
            for (int64_t j = 0; j < vocab; j++) row[j] /= z;
        // loss_r = lse - x[t] = (m - x[t]) + log z: the difference first, so large logits keep their digits
        // (m + log z rounds log z to m's ulp: at m = 1e12 a loss of log 2 came out wrong in the fourth digit)
        total += (m - x[base + tg[r]]) + log(z);
        (*count)++;
    }
    return total;
}

/* The chunk of the f32 forward that starts at or after row r: its first row (rows when none is left), and in
 * *end the row after its last. A chunk is up to F32_CHUNK consecutive counted rows; ignored rows (target < 0)
 * are skipped, never read. */
static int64_t f32_chunk(const int32_t *tg, int64_t rows, int64_t r, int64_t *end) {
    while (r < rows && tg[r] < 0) r++;
    int64_t e = r < rows ? r + 1 : rows;
    while (e < rows && e - r < F32_CHUNK && tg[e] >= 0) e++;
    *end = e;
    return r;
}

/* The f32 rows, in chunks of up to F32_CHUNK consecutive counted rows: qkv_attn_softmax_rows_ writes
 * their softmax (into the saved softmax when recording, else into a chunk-sized scratch), then each row's
 * loss is read off it; the summed loss of the counted rows comes back in double. A whole chunk is written
 * before any of it is read back (reading a row the kernel has just stored, under masks, would stall). */
static double forward_f32(const float *x, const int32_t *tg, int64_t rows, int64_t vocab, bool recording,
                          float *sm, int64_t *count) {
    const qkv_attn_kernel_set_ *ks = qkv_attn_kernels_();
    loss_sum ls = {0.0, 0.0, {0.0}, 0};
    int64_t r1;
    for (int64_t r0 = f32_chunk(tg, rows, 0, &r1); r0 < rows; r0 = f32_chunk(tg, rows, r1, &r1)) {
        float *a = recording ? sm + r0 * vocab : sm;
        // a[r, j] = exp(x[r, j] - m_r) / z_r,  m_r = max_j x[r, j],  z_r = sum_j exp(x[r, j] - m_r)
        qkv_attn_softmax_rows_(ks, x + r0 * vocab, a, r1 - r0, vocab);
        // loss_r = log1p(s_r),  s_r = sum_{j != k} a[j] / a[k]  (k = t, or the argmax when a[t] underflowed)
        int64_t at[F32_CHUNK];
        double excess[F32_CHUNK];
        for (int64_t r = r0; r < r1; r++)
            at[r - r0] = measured_from(&ls, x + r * vocab, a + (r - r0) * vocab, vocab, tg[r]);
        excess_rows(a, at, r1 - r0, vocab, excess);
        for (int64_t i = 0; i < r1 - r0; i++) add_row_loss(&ls, excess[i]);
        *count += r1 - r0;
    }
    double logs = ls.logs;
    for (int i = 0; i < LOSS_CHAINS; i++) logs += log1p(ls.q[i]);
    return ls.gaps + logs;
}

/* The f32 forward over threads (recording: the softmax of every row is kept, so chunks need no scratch).
 * Chunk k is rows [r0[k], r1[k]); a chunk's rows get their softmax, excess s_r and, when measured from the
 * argmax, the gap x[k] - x[t] (has_gap[r]), all kept per row, as forward_f32 computes them. */
typedef struct ce_job {
    const float *x;
    const int32_t *tg;
    float *sm;
    const int64_t *r0, *r1;
    double *excess, *gap;
    unsigned char *has_gap;
    int64_t vocab;
} ce_job;

static void ce_chunks_range(void *arg, int64_t k0, int64_t k1) {
    const ce_job *j = arg;
    const qkv_attn_kernel_set_ *ks = qkv_attn_kernels_();
    int64_t vocab = j->vocab;
    for (int64_t k = k0; k < k1; k++) {
        int64_t r0 = j->r0[k], r1 = j->r1[k];
        float *a = j->sm + r0 * vocab;
        qkv_attn_softmax_rows_(ks, j->x + r0 * vocab, a, r1 - r0, vocab);
        int64_t at[F32_CHUNK];
        for (int64_t r = r0; r < r1; r++) {
            loss_sum ls = {0.0, 0.0, {0.0}, 0};
            at[r - r0] = measured_from(&ls, j->x + r * vocab, a + (r - r0) * vocab, vocab, j->tg[r]);
            j->has_gap[r] = !(a[(r - r0) * vocab + j->tg[r]] > 0.0f); /* measured_from's test */
            j->gap[r] = ls.gaps; /* 0.0 + (x[k] - x[t]): the difference itself */
        }
        excess_rows(a, at, r1 - r0, vocab, j->excess + r0);
    }
}

static double forward_f32_threads(int threads, const float *x, const int32_t *tg, int64_t rows, int64_t vocab,
                                  float *sm, int64_t *count, int64_t chunks, const int64_t *r0, const int64_t *r1,
                                  double *per_row, unsigned char *has_gap) {
    ce_job job = {x, tg, sm, r0, r1, per_row, per_row + rows, has_gap, vocab};
    qkv_parallel_ranges_(threads, chunks, 1, (double)rows * (double)vocab, QKV_GRAIN_ELEMENTS_, ce_chunks_range,
                         &job);
    loss_sum ls = {0.0, 0.0, {0.0}, 0};
    for (int64_t k = 0; k < chunks; k++) /* the rows in order, as forward_f32 adds them */
        for (int64_t r = r0[k]; r < r1[k]; r++) {
            if (has_gap[r]) ls.gaps += job.gap[r];
            add_row_loss(&ls, job.excess[r]);
            (*count)++;
        }
    double logs = ls.logs;
    for (int i = 0; i < LOSS_CHAINS; i++) logs += log1p(ls.q[i]);
    return ls.gaps + logs;
}

/* Every chunk of forward_f32, for forward_f32_threads: chunk k is the rows [r0[k], r1[k]). Returns their number. */
static int64_t f32_chunks(const int32_t *tg, int64_t rows, int64_t *r0, int64_t *r1) {
    int64_t n = 0, end;
    for (int64_t r = f32_chunk(tg, rows, 0, &end); r < rows; r = f32_chunk(tg, rows, end, &end)) {
        r0[n] = r;
        r1[n++] = end;
    }
    return n;
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
    bool f32 = logits->dtype == QKV_F32;
    size_t elem = f32 ? sizeof(float) : sizeof(double);
    size_t e_rows = (size_t)(recording ? rows : f32 ? F32_CHUNK : 1);
    void *e = qkv_arena_array_(ctx, fn, e_rows * (size_t)vocab, elem);
    if (!loss || !e) return NULL;
    int64_t count = 0;
    double total;
    int threads = qkv_range_threads_(qkv_threads(ctx), (rows + F32_CHUNK - 1) / F32_CHUNK, 1,
                                     (double)rows * (double)vocab, QKV_GRAIN_ELEMENTS_);
    if (f32 && recording && threads > 1) {
        int64_t *first = qkv_arena_array_(ctx, fn, (size_t)(2 * rows), sizeof(int64_t));
        double *per_row = qkv_arena_array_(ctx, fn, (size_t)(2 * rows), sizeof(double));
        unsigned char *has_gap = qkv_arena_array_(ctx, fn, (size_t)rows, 1);
        if (!first || !per_row || !has_gap) return NULL;
        int64_t *end = first + rows;
        int64_t chunks = f32_chunks(tg, rows, first, end); // chunk k: the rows [first[k], end[k])
        total = forward_f32_threads(threads, logits->data, tg, rows, vocab, e, &count, chunks, first, end, per_row,
                                    has_gap);
    } else
        total = f32 ? forward_f32(logits->data, tg, rows, vocab, recording, e, &count)
                    : forward_f64(logits->data, tg, rows, vocab, recording, e, &count);
    // loss = sum_r loss_r / count   (0 when nothing is counted)
    double value = count ? total / (double)count : 0.0;
    if (f32) *(float *)loss->data = (float)value;
    else *(double *)loss->data = value;

    if (recording) {
        ce_saved *saved = qkv_arena_alloc_(ctx, fn, sizeof *saved);
        int32_t *tg_copy = qkv_arena_array_(ctx, fn, (size_t)(rows > 0 ? rows : 1), sizeof(int32_t));
        if (!saved || !tg_copy) return NULL;
        if (rows > 0) memcpy(tg_copy, tg, (size_t)rows * sizeof(int32_t)); /* what was checked and used */
        saved->softmax = e;
        saved->targets = tg_copy;
        saved->rows = rows;
        saved->vocab = vocab;
        qkv_node_ *node = qkv_record_(ctx, fn, cross_entropy_backward, loss, in, 1);
        if (!node) return NULL;
        node->scalar = (double)count;
        node->saved = saved;
    }
    return loss;
}

// dx[r, :] += (softmax[r, :] - onehot(t_r)) * f  over the counted rows (f32 softmax and gradient)
QKV_VECTOR_LOOP static void backward_f32(float *dx, const float *sm, const int32_t *tg, int64_t rows,
                                         int64_t vocab, double f) {
    for (int64_t r = 0; r < rows; r++) {
        if (tg[r] < 0) continue; /* ignored: nothing added */
        float *d = dx + r * vocab;
        const float *p = sm + r * vocab;
        float dt = (float)((double)d[tg[r]] + ((double)p[tg[r]] - 1.0) * f);
        for (int64_t j = 0; j < vocab; j++) d[j] = (float)((double)d[j] + (double)p[j] * f);
        d[tg[r]] = dt;
    }
}

typedef struct ce_back_job {
    float *dx;
    const float *sm;
    const int32_t *tg;
    int64_t vocab;
    double f;
} ce_back_job;

static void ce_backward_range(void *arg, int64_t r0, int64_t r1) {
    const ce_back_job *j = arg;
    backward_f32(j->dx + r0 * j->vocab, j->sm + r0 * j->vocab, j->tg + r0, r1 - r0, j->vocab, j->f);
}

// dlogits = (softmax - onehot) * dloss / count;  nothing for ignored tokens
static void cross_entropy_backward(qkv_ctx *ctx, qkv_node_ *node) {
    const char *fn = "qkv_backward (the backward of qkv_cross_entropy)"; /* what the user called */
    qkv_tensor *logits = node->in[0];
    if (!qkv_wants_grad_(logits)) return;
    const ce_saved *saved = node->saved;
    const int32_t *tg = saved->targets; /* the forward's copy, never the caller's tensor */
    double count = node->scalar;
    const qkv_tensor *dl = node->out->grad;
    double g = dl->dtype == QKV_F64 ? *(const double *)dl->data : (double)*(const float *)dl->data;
    qkv_tensor *dx = qkv_grad_of_(ctx, logits);
    if (!dx) return;
    double f = count > 0 ? g / count : 0.0;
    if (logits->dtype == QKV_F32) {
        ce_back_job job = {dx->data, saved->softmax, tg, saved->vocab, f};
        qkv_parallel_ranges_(qkv_threads(ctx), saved->rows, 1, (double)saved->rows * (double)saved->vocab,
                             QKV_GRAIN_ELEMENTS_, ce_backward_range, &job);
        return;
    }
    double *work = qkv_arena_array_(ctx, fn, (size_t)logits->numel, sizeof(double));
    if (!work) return;
    for (int64_t r = 0; r < saved->rows; r++) {
        double *w = work + r * saved->vocab;
        int64_t base = r * saved->vocab;
        if (tg[r] < 0) {
            for (int64_t j = 0; j < saved->vocab; j++) w[j] = 0.0;
            continue;
        }
        const double *p = (const double *)saved->softmax + base;
        for (int64_t j = 0; j < saved->vocab; j++) w[j] = p[j] * f;
        w[tg[r]] -= f;
    }
    qkv_accumulate_f64_(dx, work);
}
