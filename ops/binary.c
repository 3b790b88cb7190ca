/*
 * binary.c — what add, sub and mul share: operand checks with trailing-dimension broadcasting, the
 * f64 working buffers, recording, and reducing a per-element gradient onto a broadcast bias.
 * The f32 forward and the f32 backward of add and sub split their elements over qkv_threads(ctx) threads
 * (ops/parallel.h): whole rows of b when b is broadcast, and a bias gradient's column sums by columns, each
 * column summed over the rows in order by one thread, so the same bits with any count.
 */
#include "qkv_internal.h"

#include "parallel.h"

#include <string.h>

/* y = kernel(a, b) over a range of elements (b of a's shape) or of whole rows of nb (b broadcast) */
typedef struct binary_job {
    qkv_binary_kernel_f32_ kernel;
    const float *a, *b;
    float *y;
    int64_t nb;
    bool same_shape;
} binary_job;

static void binary_range(void *arg, int64_t i0, int64_t i1) {
    const binary_job *j = arg;
    if (j->same_shape) j->kernel(j->a + i0, j->b + i0, j->y + i0, i1 - i0, i1 - i0);
    else j->kernel(j->a + i0, j->b, j->y + i0, i1 - i0, j->nb);
}

/* The elementwise f32 gradients of y = a + sign * b over a range: out = dy, out += dy, out = -dy, out -= dy. */
typedef enum { GRAD_COPY, GRAD_ADD, GRAD_NEG, GRAD_SUB } grad_mode;
typedef struct grad_job {
    grad_mode mode;
    float *out;
    const float *dy;
} grad_job;

static void grad_range(void *arg, int64_t i0, int64_t i1) {
    const grad_job *j = arg;
    float *restrict out = j->out;
    const float *restrict dy = j->dy;
    switch (j->mode) {
    case GRAD_COPY: memcpy(out + i0, dy + i0, (size_t)(i1 - i0) * sizeof(float)); break; // d = dy
    case GRAD_ADD:
        for (int64_t i = i0; i < i1; i++) out[i] += dy[i]; // d += dy
        break;
    case GRAD_NEG:
        for (int64_t i = i0; i < i1; i++) out[i] = 0.0f - dy[i]; // d = -dy
        break;
    case GRAD_SUB:
        for (int64_t i = i0; i < i1; i++) out[i] -= dy[i]; // d -= dy
        break;
    }
}

static void grad_threads(qkv_ctx *ctx, grad_mode mode, float *out, const float *dy, int64_t n) {
    grad_job job = {.mode = mode, .out = out, .dy = dy};
    qkv_parallel_ranges_(qkv_threads(ctx), n, 64, (double)n, QKV_GRAIN_ELEMENTS_, grad_range, &job);
}

qkv_tensor *qkv_binary_(qkv_ctx *ctx, const char *fn, qkv_tensor *a, qkv_tensor *b,
                        qkv_binary_kernel_ kernel, qkv_binary_kernel_f32_ kernel_f32, qkv_backward_fn_ backward) {
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "a", a) || !qkv_check_float_(ctx, fn, "b", b) ||
        !qkv_check_same_dtype_(ctx, fn, a, "a", b, "b") || !qkv_check_broadcast_(ctx, fn, a, b))
        return NULL;
    qkv_tensor *y = qkv_new_like_(ctx, fn, a);
    if (!y) return NULL;
    qkv_tensor *in[2] = {a, b};
    if (a->dtype == QKV_F32 && kernel_f32) {
        int64_t n = a->numel, nb = b->numel;
        binary_job job = {kernel_f32, a->data, b->data, y->data, nb, nb == n};
        if (nb > 0) // y[i] = a[i] op b[i % nb], whole rows of b to a thread when b is broadcast
            qkv_parallel_ranges_(qkv_threads(ctx), n, nb == n ? 64 : nb, (double)n, QKV_GRAIN_ELEMENTS_, binary_range,
                                 &job);
        if (qkv_needs_grad_(ctx, in, 2) && !qkv_record_(ctx, fn, backward, y, in, 2)) return NULL;
        return y;
    }
    const double *av = qkv_as_f64_(ctx, fn, a), *bv = qkv_as_f64_(ctx, fn, b);
    double *yv = qkv_out_f64_(ctx, fn, y);
    if (!av || !bv || !yv) return NULL;
    kernel(av, bv, yv, a->numel, b->numel);
    qkv_store_f64_(y, yv);
    if (qkv_needs_grad_(ctx, in, 2) && !qkv_record_(ctx, fn, backward, y, in, 2)) return NULL;
    return y;
}

bool qkv_binary_operands_(qkv_ctx *ctx, const qkv_node_ *node, const double **dy, const double **a,
                          const double **b) {
    *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    *a = qkv_as_f64_(ctx, node->op, node->in[0]);
    *b = qkv_as_f64_(ctx, node->op, node->in[1]);
    return *dy && *a && *b;
}

bool qkv_accumulate_bias_grad_(qkv_ctx *ctx, qkv_tensor *b, const double *per_element, int64_t n,
                               double sign) {
    qkv_tensor *db = qkv_grad_of_(ctx, b);
    double *sums = qkv_arena_array_(ctx, "qkv_backward", (size_t)b->numel, sizeof(double));
    if (!db || !sums) return false;
    /* hardening fix (fuzz_graph): an empty b (then a is empty too) has nothing to sum, and n / 0 was UB */
    if (b->numel == 0) return true;
    qkv_sum_rows_f64_(per_element, n / b->numel, b->numel, sums);
    for (int64_t j = 0; j < b->numel; j++) sums[j] *= sign;
    qkv_accumulate_f64_(db, sums);
    return true;
}

/* The f32 backward of y = a + sign * b: da += dy in float; db += sign * dy when b has a's shape, else
 * sign * (the column sums of dy, in double) -- the bits of the f64 path, without its working copies. */
static void linear_binary_backward_f32(qkv_ctx *ctx, qkv_node_ *node, double sign) {
    qkv_tensor *a = node->in[0], *b = node->in[1];
    const float *dy = node->out->grad->data;
    int64_t n = a->numel;
    bool fresh;
    if (qkv_wants_grad_(a)) {
        qkv_tensor *da = qkv_grad_to_write_(ctx, a, &fresh);
        if (!da) return;
        grad_threads(ctx, fresh ? GRAD_COPY : GRAD_ADD, da->data, dy, n); // da = dy (a new gradient), or da += dy
    }
    if (!qkv_wants_grad_(b)) return;
    int64_t nb = b->numel;
    if (nb == n) {
        qkv_tensor *db = qkv_grad_to_write_(ctx, b, &fresh);
        if (!db) return;
        // db = dy, db = -dy, db += dy or db -= dy
        grad_threads(ctx, fresh ? (sign > 0 ? GRAD_COPY : GRAD_NEG) : (sign > 0 ? GRAD_ADD : GRAD_SUB), db->data, dy, n);
        return;
    }
    qkv_tensor *db = qkv_grad_of_(ctx, b);
    if (!db) return;
    float *dbv = db->data;
    double *sums = qkv_arena_array_(ctx, "qkv_backward", (size_t)(nb > 0 ? nb : 1), sizeof(double));
    if (!sums || nb == 0) return;
    // db[j] += sign * sum_r dy[r, j]   (parallel.h: columns over threads, rows in order)
    qkv_column_sums_f32_(qkv_threads(ctx), dy, n / nb, nb, sums);
    for (int64_t j = 0; j < nb; j++) dbv[j] = (float)((double)dbv[j] + sign * sums[j]);
}

void qkv_linear_binary_backward_(qkv_ctx *ctx, qkv_node_ *node, double sign) {
    qkv_tensor *a = node->in[0], *b = node->in[1];
    if (a->dtype == QKV_F32) {
        linear_binary_backward_f32(ctx, node, sign);
        return;
    }
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    if (!dy) return;
    if (qkv_wants_grad_(a)) {
        qkv_tensor *da = qkv_grad_of_(ctx, a);
        if (!da) return;
        qkv_accumulate_f64_(da, dy);
    }
    if (qkv_wants_grad_(b)) qkv_accumulate_bias_grad_(ctx, b, dy, a->numel, sign);
}
