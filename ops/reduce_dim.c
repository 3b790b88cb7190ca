/*
 * reduce_dim.c — what the reductions along one axis share (sum_dim.c, mean_dim.c, max_dim.c,
 * logsumexp_dim.c, softmax_dim.c, log_softmax.c): the axis check, the geometry, and the node that saves the plan.
 *   x [2, 3, 4], axis 1 -> seen as [outer 2, n 3, inner 4]; result [2, 4] (keepdim: [2, 1, 4])
 */
#include "qkv_internal.h"

bool qkv_axis_plan_(qkv_ctx *ctx, const char *fn, const qkv_tensor *x, int axis, bool keepdim, qkv_axis_ *plan) {
    if (!qkv_check_float_(ctx, fn, "x", x)) return false;
    if (x->ndim == 0)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: x is a scalar (ndim 0): it has no axis to reduce", fn), false;
    if (axis < -x->ndim || axis >= x->ndim)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: x is %s: axis %d is out of range [%d, %d]", fn, QKV_SHAPE(x), axis,
                         -x->ndim, x->ndim - 1), false;
    memset(plan, 0, sizeof *plan);
    plan->axis = axis < 0 ? axis + x->ndim : axis;
    plan->n = x->shape[plan->axis];
    plan->outer = qkv_dims_product_(x, 0, plan->axis);
    plan->inner = qkv_dims_product_(x, plan->axis + 1, x->ndim);
    for (int d = 0; d < x->ndim; d++) {
        if (d != plan->axis) plan->shape[plan->ndim++] = x->shape[d];
        else if (keepdim) plan->shape[plan->ndim++] = 1;
    }
    return true;
}

qkv_tensor *qkv_axis_record_(qkv_ctx *ctx, const char *fn, qkv_backward_fn_ backward, qkv_tensor *x, qkv_tensor *y,
                             const qkv_axis_ *plan) {
    qkv_tensor *in[1] = {x};
    if (!y || !qkv_needs_grad_(ctx, in, 1)) return y;
    qkv_axis_ *saved = qkv_arena_alloc_(ctx, fn, sizeof *saved);
    if (!saved) return NULL;
    *saved = *plan;
    qkv_node_ *node = qkv_record_(ctx, fn, backward, y, in, 1);
    if (!node) return NULL;
    node->saved = saved;
    return y;
}
