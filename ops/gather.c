/*
 * gather.c — qkv_gather: along one axis, each position of index picks the entry of x it names (a copy;
 * torch.gather).
 *   x [d0, d1, d2], index i32 [e0, e1, e2] with e_d <= d_d for d != axis -> y [e0, e1, e2]
 * For axis 1:  y[i, j, k] = x[i, index[i, j, k], k];   dx[i, index[i, j, k], k] += dy[i, j, k]
 * (the positions of index walked in row-major order, so repeated indices add up in the same order every run).
 * Every index is checked against [0, d_axis) before anything is written. index is not differentiable; the node
 * keeps its own copy (the caller may change or free it before the backward).
 */
#include "shape_common.h"

typedef struct gather_saved {
    int32_t *index;                          /* the node's copy, in [0, x's size along the axis) */
    int64_t shape4[4], xstride4[4];          /* index's shape, padded to 4 axes; x's strides     */
    int axis4;                               /* the axis among the 4                              */
} gather_saved;

/* off(p) = the flat element of x that index position p = (p0, p1, p2, p3) names: sum over d != axis of p_d
 * stride_x[d], plus index[p] stride_x[axis]. visit(p, off) for every p in row-major order. */
#define GATHER_WALK(shape4, xstride4, axis4, index, BODY)                                                              \
    do {                                                                                                               \
        int64_t p_ = 0, q_[4];                                                                                         \
        for (q_[0] = 0; q_[0] < (shape4)[0]; q_[0]++)                                                                  \
            for (q_[1] = 0; q_[1] < (shape4)[1]; q_[1]++)                                                              \
                for (q_[2] = 0; q_[2] < (shape4)[2]; q_[2]++)                                                          \
                    for (q_[3] = 0; q_[3] < (shape4)[3]; q_[3]++, p_++) {                                              \
                        int64_t off = (int64_t)(index)[p_] * (xstride4)[axis4];                                        \
                        for (int d_ = 0; d_ < 4; d_++)                                                                 \
                            if (d_ != (axis4)) off += q_[d_] * (xstride4)[d_];                                         \
                        int64_t p = p_;                                                                                \
                        BODY;                                                                                          \
                    }                                                                                                  \
    } while (0)

// dx[off(p)] += dy[p]   (p in row-major order)
static void gather_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *x = node->in[0];
    if (!qkv_wants_grad_(x)) return;
    const gather_saved *s = node->saved;
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    double *dx = qkv_arena_array_(ctx, node->op, (size_t)x->numel + 1, sizeof(double));
    if (!dy || !dx) return;
    memset(dx, 0, (size_t)x->numel * sizeof(double));
    GATHER_WALK(s->shape4, s->xstride4, s->axis4, s->index, dx[off] += dy[p]);
    qkv_tensor *gx = qkv_grad_of_(ctx, x);
    if (gx) qkv_accumulate_f64_(gx, dx);
}

qkv_tensor *qkv_gather(qkv_ctx *ctx, qkv_tensor *x, int axis, const qkv_tensor *index) {
    const char *fn = "qkv_gather";
    if (!ctx || ctx->status || !qkv_check_tensor_(ctx, fn, "x", x) || !qkv_check_tensor_(ctx, fn, "index", index))
        return NULL;
    int a;
    if (!qkv_shape_axis_(ctx, fn, "axis", axis, "x", x, &a)) return NULL;
    if (index->dtype != QKV_I32)
        return qkv_fail_(ctx, QKV_ERR_DTYPE, "%s: x is %s, index %s is %s: index must be i32", fn, QKV_SHAPE(x),
                         QKV_SHAPE(index), qkv_dtype_name(index->dtype));
    if (index->ndim != x->ndim)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: x is %s, index is %s: index must have x's number of dimensions (%d)",
                         fn, QKV_SHAPE(x), QKV_SHAPE(index), x->ndim);
    for (int d = 0; d < x->ndim; d++)
        if (d != a && index->shape[d] > x->shape[d])
            return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: x is %s, index is %s: dimension %d of index (%lld) exceeds x's "
                             "(%lld); only axis %d may be larger", fn, QKV_SHAPE(x), QKV_SHAPE(index), d,
                             (long long)index->shape[d], (long long)x->shape[d], a);
    int64_t size = x->shape[a];
    const int32_t *idx = index->data;
    for (int64_t p = 0; p < index->numel; p++) {
        if (idx[p] >= 0 && idx[p] < size) continue;
        // the position as a multi-index [p0,p1,...]
        char pos[96];
        int len = 0;
        int64_t rest = p, q[QKV_MAX_DIMS];
        for (int d = index->ndim - 1; d >= 0; d--) q[d] = rest % index->shape[d], rest /= index->shape[d];
        for (int d = 0; d < index->ndim; d++)
            len += snprintf(pos + len, sizeof pos - (size_t)len, "%s%lld", d ? "," : "[", (long long)q[d]);
        snprintf(pos + len, sizeof pos - (size_t)len, "]");
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: x is %s, index is %s: index %d at position %s is outside [0, %lld) "
                         "(axis %d)", fn, QKV_SHAPE(x), QKV_SHAPE(index), (int)idx[p], pos, (long long)size, a);
    }
    qkv_tensor *y = qkv_new_tensor_(ctx, fn, x->dtype, index->ndim, index->shape);
    if (!y) return NULL;
    gather_saved plan;
    int64_t xstride[QKV_MAX_DIMS] = {0};
    qkv_shape_strides_(x, xstride);
    qkv_shape_pad4_(x->ndim, index->shape, xstride, plan.shape4, plan.xstride4);
    plan.axis4 = a + QKV_MAX_DIMS - x->ndim;
    plan.index = NULL;
    // y[p] = x[off(p)]
    size_t esize = qkv_dtype_size(x->dtype);
    unsigned char *dst = y->data;
    const unsigned char *src = x->data;
    if (y->numel > 0)
        GATHER_WALK(plan.shape4, plan.xstride4, plan.axis4, idx,
                    memcpy(dst + (size_t)p * esize, src + (size_t)off * esize, esize));
    qkv_tensor *in[1] = {x};
    if (qkv_is_float_(x->dtype) && qkv_needs_grad_(ctx, in, 1)) {
        gather_saved *s = qkv_arena_alloc_(ctx, fn, sizeof *s);
        int32_t *copy = qkv_arena_array_(ctx, fn, (size_t)index->numel + 1, sizeof(int32_t));
        if (!s || !copy) return NULL;
        if (index->numel > 0) memcpy(copy, idx, (size_t)index->numel * sizeof(int32_t));
        *s = plan;
        s->index = copy;
        qkv_node_ *node = qkv_record_(ctx, fn, gather_backward, y, in, 1);
        if (!node) return NULL;
        node->saved = s;
    }
    return y;
}
