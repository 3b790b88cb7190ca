/*
 * embedding.c — rows of a table picked by integer ids.
 *   table [V, d] (f32 or f64), ids i32 [n] or [B, n] -> y [n, d] or [B, n, d] (table's dtype)
 *
 * Every id is checked against [0, V) before anything is written; the first bad one is QKV_ERR_ARG naming
 * the id, its position and V. The forward copies rows (O(n d), never a one-hot product, which is O(V)).
 * ids is not differentiable. The node keeps its own copy of the ids (node->saved): a caller who changes
 * the ids tensor between forward and backward does not move, or break, the scatter.
 * The backward adds the rows of dy into dtable in position order, in the table's dtype: a repeated id gets
 * the sum. Over qkv_threads(ctx) threads (ops/parallel.h) the forward splits the positions and the backward
 * the columns (each thread walks every position in order over its own columns), so every element is
 * written by one thread in the order of one: the same bits for any count. Both loops prefetch the table
 * row of the id 8 positions ahead (see prefetch_row).
 */
#include "qkv_internal.h"

#include "parallel.h"

#include <string.h>

typedef struct embedding_saved {
    int32_t *ids; /* the count ids the forward used, each in [0, V) */
    int64_t count;
} embedding_saved;

/* The rows the ids name are scattered over the table: the hardware prefetcher follows a row once it is
 * being read, but not the jump to the next id's row. Each loop asks for the row EMB_AHEAD ids ahead (its
 * first EMB_LINES cache lines: a whole row of 256 floats), so that it is on its way before it is needed;
 * for the scatter, with intent to write. A prefetch never faults and changes no value. Measured on the
 * bench/ops.c shape (AMD EPYC, load average ~35, 3 interleaved A/B runs of the operator alone): forward
 * about 8% and backward about 15-20% faster than without; in bench/compare_ops.py's 5 rounds at load ~45
 * the whole iteration (with qkv_backward's seed) showed no difference in the median (4.46 ms both). */
#define EMB_AHEAD 8
#define EMB_LINES 16
static inline void prefetch_row(const void *base, size_t row_bytes, int32_t id, int write) {
    const char *p = (const char *)base + (size_t)id * row_bytes;
    size_t lines = row_bytes / 64 < EMB_LINES ? row_bytes / 64 : EMB_LINES;
    for (size_t k = 0; k < lines; k++) {
        if (write) __builtin_prefetch(p + 64 * k, 1);
        else __builtin_prefetch(p + 64 * k, 0);
    }
}

// y[p, :] = table[ids[p], :]
static void embedding_rows(const void *table, const int32_t *ids, int64_t count, int64_t d, size_t esize,
                           void *y) {
    size_t row = (size_t)d * esize;
    for (int64_t p = 0; p < count; p++) {
        if (p + EMB_AHEAD < count) prefetch_row(table, row, ids[p + EMB_AHEAD], 0);
        memcpy((unsigned char *)y + (size_t)p * row, (const unsigned char *)table + (size_t)ids[p] * row, row);
    }
}

// dtable[ids[p], c0:c1] += dy[p, c0:c1]   for p = 0, 1, ... in order (a repeated id sums its rows); rows of d
QKV_VECTOR_LOOP
static void embedding_scatter_f32(float *restrict dt, const float *restrict dy, const int32_t *ids, int64_t count,
                                  int64_t d, int64_t c0, int64_t c1) {
    for (int64_t p = 0; p < count; p++) {
        if (p + EMB_AHEAD < count) prefetch_row(dt + c0, (size_t)d * sizeof *dt, ids[p + EMB_AHEAD], 1);
        float *restrict dst = dt + (int64_t)ids[p] * d;
        const float *restrict src = dy + p * d;
        for (int64_t j = c0; j < c1; j++) dst[j] += src[j];
    }
}

typedef struct emb_job {
    const void *table, *dy;
    void *out;
    const int32_t *ids;
    int64_t count, d;
    size_t esize;
} emb_job;

static void embedding_rows_range(void *arg, int64_t p0, int64_t p1) {
    const emb_job *j = arg;
    size_t row = (size_t)j->d * j->esize;
    embedding_rows(j->table, j->ids + p0, p1 - p0, j->d, j->esize, (unsigned char *)j->out + (size_t)p0 * row);
}

static void embedding_scatter_range(void *arg, int64_t c0, int64_t c1) {
    const emb_job *j = arg;
    embedding_scatter_f32(j->out, j->dy, j->ids, j->count, j->d, c0, c1);
}

static void embedding_scatter_f64(double *restrict dt, const double *restrict dy, const int32_t *ids,
                                  int64_t count, int64_t d) {
    for (int64_t p = 0; p < count; p++) {
        double *restrict dst = dt + (int64_t)ids[p] * d;
        const double *restrict src = dy + p * d;
        for (int64_t j = 0; j < d; j++) dst[j] += src[j];
    }
}

static void embedding_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *table = node->in[0];
    if (!qkv_wants_grad_(table)) return;
    const embedding_saved *s = node->saved;
    qkv_tensor *dt = qkv_grad_of_(ctx, table);
    const qkv_tensor *dy = node->out->grad;
    if (!dt) return;
    int64_t d = table->shape[1];
    if (table->dtype == QKV_F32) { /* columns in ranges of 16 floats, a cache line of each row */
        emb_job job = {.dy = dy->data, .out = dt->data, .ids = s->ids, .count = s->count, .d = d};
        qkv_parallel_ranges_(qkv_threads(ctx), d, 16, (double)s->count * (double)d, QKV_GRAIN_ELEMENTS_,
                             embedding_scatter_range, &job);
    } else
        embedding_scatter_f64(dt->data, dy->data, s->ids, s->count, d);
}

qkv_tensor *qkv_embedding(qkv_ctx *ctx, qkv_tensor *table, const qkv_tensor *ids) {
    const char *fn = "qkv_embedding";
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "table", table)) return NULL;
    if (!qkv_check_tensor_(ctx, fn, "ids", ids)) return NULL;
    if (table->ndim != 2)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: table is %s: it must be [V, d]", fn, QKV_SHAPE(table));
    if (ids->dtype != QKV_I32)
        return qkv_fail_(ctx, QKV_ERR_DTYPE, "%s: table is %s, ids %s is %s: ids are i32", fn, QKV_SHAPE(table),
                         QKV_SHAPE(ids), qkv_dtype_name(ids->dtype));
    if (ids->ndim != 1 && ids->ndim != 2)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: table is %s, ids is %s: ids must be [n] or [B, n]", fn,
                         QKV_SHAPE(table), QKV_SHAPE(ids));
    int64_t V = table->shape[0], d = table->shape[1], count = ids->numel;
    const int32_t *idv = ids->data;
    for (int64_t p = 0; p < count; p++) {
        if (idv[p] >= 0 && idv[p] < V) continue;
        if (ids->ndim == 2) {
            int64_t n = ids->shape[1];
            return qkv_fail_(ctx, QKV_ERR_ARG,
                             "%s: table is %s, ids is %s: id %d at position [%lld, %lld] is outside [0, V = %lld)",
                             fn, QKV_SHAPE(table), QKV_SHAPE(ids), (int)idv[p], (long long)(p / n),
                             (long long)(p % n), (long long)V);
        }
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: table is %s, ids is %s: id %d at position %lld is outside [0, V = %lld)",
                         fn, QKV_SHAPE(table), QKV_SHAPE(ids), (int)idv[p], (long long)p, (long long)V);
    }
    int64_t shape[3] = {ids->shape[0], ids->ndim == 2 ? ids->shape[1] : d, d};
    qkv_tensor *y = qkv_new_tensor_(ctx, fn, table->dtype, ids->ndim + 1, shape);
    if (!y) return NULL;
    emb_job job = {.table = table->data, .out = y->data, .ids = idv, .count = count, .d = d,
                   .esize = qkv_dtype_size(table->dtype)};
    qkv_parallel_ranges_(qkv_threads(ctx), count, 1, (double)count * (double)d, QKV_GRAIN_ELEMENTS_,
                         embedding_rows_range, &job);

    qkv_tensor *in[1] = {table};
    if (qkv_needs_grad_(ctx, in, 1)) {
        embedding_saved *s = qkv_arena_alloc_(ctx, fn, sizeof *s);
        int32_t *copy = qkv_arena_array_(ctx, fn, (size_t)(count > 0 ? count : 1), sizeof(int32_t));
        if (!s || !copy) return NULL;
        if (count > 0) memcpy(copy, idv, (size_t)count * sizeof(int32_t));
        s->ids = copy;
        s->count = count;
        qkv_node_ *node = qkv_record_(ctx, fn, embedding_backward, y, in, 1);
        if (!node) return NULL;
        node->saved = s;
    }
    return y;
}
