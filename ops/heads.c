/*
 * heads.c — split and merge attention heads: one permutation and its inverse.
 *   split: x [B, n, h*d] -> y [B*h, n, d]    y[b*h + j, i, k] = x[b, i, j*d + k]
 *   merge: x [B*h, n, d] -> y [B, n, h*d]    y[b, i, j*d + k] = x[b*h + j, i, k]
 * A 2-D x is a batch of one; results are always 3-D. Each backward is the other permutation, added
 * (+=) straight into dx in the tensors' dtype. Rows (or heads) are split over qkv_threads(ctx) threads
 * (ops/parallel.h); each element is moved by one thread, so the same bits with any count.
 */
#include "qkv_internal.h"

#include "parallel.h"

/* The sizes both directions share: B (batches before splitting), h, n, d. */
typedef struct heads_dims {
    int64_t batch, heads, n, d;
} heads_dims;

// y[k] += x[k] for the d elements of one run, in the tensors' dtype
static void add_run(void *restrict y, const void *restrict x, int64_t d, qkv_dtype dtype) {
    if (dtype == QKV_F64) {
        double *restrict yv = y;
        const double *restrict xv = x;
        for (int64_t k = 0; k < d; k++) yv[k] += xv[k];
    } else {
        float *restrict yv = y;
        const float *restrict xv = x;
        for (int64_t k = 0; k < d; k++) yv[k] += xv[k];
    }
}

typedef struct heads_job {
    const void *src;
    void *dst;
    qkv_dtype dtype;
    heads_dims s;
    bool split, accumulate;
} heads_job;

/* The small heads (d_head 8 or 16 in f32, 4 or 8 in f64) as constant-size copies, a vector move or two each,
 * where a libc memcpy call per run of 32 bytes was a tenth of the induction model's step: the rows
 * [b, i] = u of the joined layout for u in [u0, u1). */
static void permute_small_range(void *arg, int64_t u0, int64_t u1) {
    const heads_job *p = arg;
    heads_dims s = p->s;
    size_t run = (size_t)s.d * qkv_dtype_size(p->dtype);
    const unsigned char *from = p->src;
    unsigned char *to = p->dst;
    bool split = p->split;
    for (int64_t u = u0; u < u1; u++) {
        int64_t b = u / s.n, i = u % s.n;
        for (int64_t j = 0; j < s.heads; j++) {
            size_t joined = (size_t)(u * s.heads + j) * run;            /* [b, i, j*d] */
            size_t apart = (size_t)((b * s.heads + j) * s.n + i) * run; /* [b*h + j, i, 0] */
            if (run == 32) memcpy(to + (split ? apart : joined), from + (split ? joined : apart), 32);
            else memcpy(to + (split ? apart : joined), from + (split ? joined : apart), 64);
        }
    }
}

/* Any head size, the heads [b*h + j] = u of the apart layout for u in [u0, u1). */
static void permute_range(void *arg, int64_t u0, int64_t u1) {
    const heads_job *p = arg;
    heads_dims s = p->s;
    size_t esize = qkv_dtype_size(p->dtype), run = (size_t)s.d * esize;
    for (int64_t u = u0; u < u1; u++) {
        int64_t b = u / s.heads, j = u % s.heads;
        for (int64_t i = 0; i < s.n; i++) {
            size_t joined = (size_t)(((b * s.n + i) * s.heads + j) * s.d) * esize; /* [b, i, j*d] */
            size_t apart = (size_t)((u * s.n + i) * s.d) * esize;                  /* [b*h + j, i, 0] */
            unsigned char *to = (unsigned char *)p->dst + (p->split ? apart : joined);
            const unsigned char *from = (const unsigned char *)p->src + (p->split ? joined : apart);
            if (p->accumulate) add_run(to, from, s.d, p->dtype);
            else memcpy(to, from, run);
        }
    }
}

// split: dst[b*h + j, i, k] = src[b, i, j*d + k];  merge: dst[b, i, j*d + k] = src[b*h + j, i, k]
// (accumulate: += instead of =, for the backward, which adds dy permuted straight into dx). Each element
// moves (or is added) once, by one thread: ranges of rows (or heads) over qkv_threads(ctx) threads.
static void permute_heads(qkv_ctx *ctx, const void *src, void *dst, qkv_dtype dtype, heads_dims s, bool split,
                          bool accumulate) {
    size_t run = (size_t)s.d * qkv_dtype_size(dtype); /* d contiguous elements move together */
    /* hardening fix (fuzz_graph): with d = 0 nothing moves, but the loops below could still count
     * B * h * n (up to 2^31 * n, e.g. an empty [1, n, 0] split into 2^30 heads) empty copies: a hang;
     * and with n = 0, B * h empty loops (an empty [2^40, 0, 4] split in 2) */
    if (run == 0 || s.batch == 0 || s.heads == 0 || s.n == 0) return;
    heads_job job = {src, dst, dtype, s, split, accumulate};
    double work = (double)s.batch * (double)s.heads * (double)s.n * (double)s.d;
    if (!accumulate && (run == 32 || run == 64))
        qkv_parallel_ranges_(qkv_threads(ctx), s.batch * s.n, 1, work, QKV_GRAIN_ELEMENTS_, permute_small_range, &job);
    else
        qkv_parallel_ranges_(qkv_threads(ctx), s.batch * s.heads, 1, work, QKV_GRAIN_ELEMENTS_, permute_range, &job);
}

static void split_heads_backward(qkv_ctx *ctx, qkv_node_ *node);
static void merge_heads_backward(qkv_ctx *ctx, qkv_node_ *node);

static qkv_tensor *heads_op(qkv_ctx *ctx, const char *fn, qkv_tensor *x, int heads, bool split) {
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "x", x)) return NULL;
    if (x->ndim != 2 && x->ndim != 3)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: x is %s: it must be %s (or 2-D, a batch of one)", fn,
                         QKV_SHAPE(x), split ? "[B, n, h*d]" : "[B*h, n, d]");
    if (heads <= 0)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: x is %s: heads is %d, must be positive", fn, QKV_SHAPE(x),
                         heads);
    int64_t lead = x->ndim == 3 ? x->shape[0] : 1;
    int64_t n = x->shape[x->ndim - 2], last = x->shape[x->ndim - 1];
    heads_dims s = {0, heads, n, 0};
    int64_t out_shape[3];
    if (split) {
        if (last % heads != 0)
            return qkv_fail_(ctx, QKV_ERR_SHAPE,
                             "%s: x is %s: last dimension %lld is not divisible by heads = %d", fn,
                             QKV_SHAPE(x), (long long)last, heads);
        s.batch = lead;
        s.d = last / heads;
        if (lead > INT64_MAX / heads)
            return qkv_fail_(ctx, QKV_ERR_OVERFLOW, "%s: x is %s: batch %lld times heads %d overflows", fn,
                             QKV_SHAPE(x), (long long)lead, heads);
        out_shape[0] = lead * heads;
        out_shape[1] = n;
        out_shape[2] = s.d;
    } else {
        if (lead % heads != 0)
            return qkv_fail_(ctx, QKV_ERR_SHAPE,
                             "%s: x is %s: batch dimension %lld is not divisible by heads = %d", fn,
                             QKV_SHAPE(x), (long long)lead, heads);
        s.batch = lead / heads;
        s.d = last;
        if (last > INT64_MAX / heads)
            return qkv_fail_(ctx, QKV_ERR_OVERFLOW,
                             "%s: x is %s: last dimension %lld times heads %d overflows", fn, QKV_SHAPE(x),
                             (long long)last, heads);
        out_shape[0] = s.batch;
        out_shape[1] = n;
        out_shape[2] = last * heads;
    }
    qkv_tensor *y = qkv_new_tensor_(ctx, fn, x->dtype, 3, out_shape);
    if (!y) return NULL;
    permute_heads(ctx, x->data, y->data, x->dtype, s, split, false);

    qkv_tensor *in[1] = {x};
    if (qkv_needs_grad_(ctx, in, 1)) {
        qkv_node_ *node =
            qkv_record_(ctx, fn, split ? split_heads_backward : merge_heads_backward, y, in, 1);
        if (!node) return NULL;
        node->scalar = heads;
    }
    return y;
}

/* dx = the inverse permutation of dy: split's backward merges, merge's backward splits. */
static void heads_backward(qkv_ctx *ctx, qkv_node_ *node, bool forward_was_split) {
    qkv_tensor *x = node->in[0];
    if (!qkv_wants_grad_(x)) return;
    const qkv_tensor *y = node->out;
    heads_dims s;
    s.heads = (int64_t)node->scalar;
    s.n = y->shape[1];
    if (forward_was_split) {
        s.batch = y->shape[0] / s.heads;
        s.d = y->shape[2];
    } else {
        s.batch = y->shape[0];
        s.d = y->shape[2] / s.heads;
    }
    bool fresh;
    qkv_tensor *dx = qkv_grad_to_write_(ctx, x, &fresh);
    if (!dx) return;
    /* in the native dtype, with no working copy: an f32 sum rounds once either way, so these are the bits
     * the former f64 round trip (convert, permute, add in double, round) gave; a new dx (the usual case:
     * x is a projection's output) is stored, a permutation writing every element, instead of zeroed and added */
    permute_heads(ctx, y->grad->data, dx->data, x->dtype, s, !forward_was_split, !fresh);
}

// dx[b, i, j*d + k] += dy[b*h + j, i, k]
static void split_heads_backward(qkv_ctx *ctx, qkv_node_ *node) { heads_backward(ctx, node, true); }

// dx[b*h + j, i, k] += dy[b, i, j*d + k]
static void merge_heads_backward(qkv_ctx *ctx, qkv_node_ *node) { heads_backward(ctx, node, false); }

qkv_tensor *qkv_split_heads(qkv_ctx *ctx, qkv_tensor *x, int heads) {
    return heads_op(ctx, "qkv_split_heads", x, heads, true);
}

qkv_tensor *qkv_merge_heads(qkv_ctx *ctx, qkv_tensor *x, int heads) {
    return heads_op(ctx, "qkv_merge_heads", x, heads, false);
}
