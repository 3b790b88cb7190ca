/*
 * narrow.c — qkv_narrow: length consecutive entries of x along one axis, from start (a copy; torch.narrow).
 *   x [..., a, ...], start, length -> y [..., length, ...]
 * With o over the axes before the axis and i over those after it:
 *   y[o, j, i] = x[o, start + j, i];   dx[o, start + j, i] += dy[o, j, i], and nothing elsewhere (a zero gradient).
 * start may be negative, counting from the end (start + a); both bounds are checked as torch.narrow's.
 */
#include "shape_common.h"

typedef struct narrow_saved {
    int64_t outer, inner, size, start; /* axes before, after; x's size along the axis; start from 0 */
} narrow_saved;

// dx[o, start + j, i] += dy[o, j, i]
static void narrow_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *x = node->in[0], *y = node->out;
    if (!qkv_wants_grad_(x)) return;
    const narrow_saved *s = node->saved;
    const double *dy = qkv_as_f64_(ctx, node->op, y->grad);
    double *dx = qkv_arena_array_(ctx, node->op, (size_t)x->numel + 1, sizeof(double));
    if (!dy || !dx) return;
    memset(dx, 0, (size_t)x->numel * sizeof(double));
    int64_t in_slab = s->size * s->inner, out_slab = y->numel / (s->outer ? s->outer : 1);
    for (int64_t o = 0; o < s->outer && out_slab > 0; o++)
        memcpy(dx + o * in_slab + s->start * s->inner, dy + o * out_slab, (size_t)out_slab * sizeof(double));
    qkv_tensor *gx = qkv_grad_of_(ctx, x);
    if (gx) qkv_accumulate_f64_(gx, dx);
}

qkv_tensor *qkv_narrow(qkv_ctx *ctx, qkv_tensor *x, int axis, int64_t start, int64_t length) {
    const char *fn = "qkv_narrow";
    if (!ctx || ctx->status || !qkv_check_tensor_(ctx, fn, "x", x)) return NULL;
    int a;
    if (!qkv_shape_axis_(ctx, fn, "axis", axis, "x", x, &a)) return NULL;
    int64_t size = x->shape[a];
    if (start < -size || start > size)
        return qkv_fail_(ctx, QKV_ERR_ARG,
                         "%s: x is %s: start %lld is out of range for axis %d of size %lld: it must be in [%lld, %lld]",
                         fn, QKV_SHAPE(x), (long long)start, a, (long long)size, (long long)-size, (long long)size);
    if (start < 0) start += size; // counted from the end
    if (length < 0 || length > size - start)
        return qkv_fail_(ctx, QKV_ERR_ARG,
                         "%s: x is %s: length %lld from start %lld does not fit axis %d of size %lld: it must be in "
                         "[0, %lld]", fn, QKV_SHAPE(x), (long long)length, (long long)start, a,
                         (long long)size, (long long)(size - start));
    int64_t shape[QKV_MAX_DIMS] = {0};
    for (int d = 0; d < x->ndim; d++) shape[d] = d == a ? length : x->shape[d];
    qkv_tensor *y = qkv_new_tensor_(ctx, fn, x->dtype, x->ndim, shape);
    if (!y) return NULL;
    int64_t outer = qkv_dims_product_(x, 0, a), inner = qkv_dims_product_(x, a + 1, x->ndim);
    size_t esize = qkv_dtype_size(x->dtype);
    // y[o, j, i] = x[o, start + j, i]: per o, one run of length * inner elements
    size_t run = (size_t)(length * inner) * esize, in_slab = (size_t)(size * inner) * esize;
    for (int64_t o = 0; o < outer && run > 0; o++)
        memcpy((unsigned char *)y->data + (size_t)o * run,
               (const unsigned char *)x->data + (size_t)o * in_slab + (size_t)(start * inner) * esize, run);
    qkv_tensor *in[1] = {x};
    if (qkv_is_float_(x->dtype) && qkv_needs_grad_(ctx, in, 1)) {
        narrow_saved *s = qkv_arena_alloc_(ctx, fn, sizeof *s);
        if (!s) return NULL;
        *s = (narrow_saved){outer, inner, size, start};
        qkv_node_ *node = qkv_record_(ctx, fn, narrow_backward, y, in, 1);
        if (!node) return NULL;
        node->saved = s;
    }
    return y;
}
