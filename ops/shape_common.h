/*
 * shape_common.h — what the copying shape operators share (transpose.c, concat.c, narrow.c, index_select.c,
 * gather.c, expand.c): an axis counted from either end and checked, a tensor's row-major strides, and the
 * strided copy of elements of any dtype over up to 4 dimensions.
 */
#ifndef QKV_SHAPE_COMMON_H
#define QKV_SHAPE_COMMON_H

#include "qkv_internal.h"

#include <string.h>

/* axis of tensor t (called name in messages) as PyTorch counts it: 0 .. ndim-1, or -ndim .. -1 from the end.
 * *out = the axis from 0. Outside [-ndim, ndim): QKV_ERR_ARG naming fn, what (the parameter), the axis, t's
 * shape and the range (a 0-D tensor has no axis at all). */
static inline bool qkv_shape_axis_(qkv_ctx *ctx, const char *fn, const char *what, int axis, const char *name,
                                   const qkv_tensor *t, int *out) {
    int nd = t->ndim;
    if (axis >= -nd && axis < nd) {
        *out = axis < 0 ? axis + nd : axis;
        return true;
    }
    if (nd == 0)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: %s %d is out of range for %s [] (0-D): a scalar has no axis", fn, what,
                         axis, name),
               false;
    return qkv_fail_(ctx, QKV_ERR_ARG, "%s: %s %d is out of range for %s %s: it must be in [%d, %d)", fn, what, axis,
                     name, QKV_SHAPE(t), -nd, nd),
           false;
}

/* stride[d] = the element step of t along axis d (row-major, contiguous), for d < t->ndim. */
static inline void qkv_shape_strides_(const qkv_tensor *t, int64_t *stride) {
    int64_t step = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        stride[d] = step;
        step *= t->shape[d];
    }
}

/* shape and strides of ndim axes, padded in front with size-1 axes to 4 (the walks below are 4 loops). */
static inline void qkv_shape_pad4_(int ndim, const int64_t *shape, const int64_t *stride, int64_t shape4[4],
                                   int64_t stride4[4]) {
    int lead = QKV_MAX_DIMS - ndim;
    for (int d = 0; d < QKV_MAX_DIMS; d++) {
        shape4[d] = d < lead ? 1 : shape[d - lead];
        stride4[d] = d < lead ? 0 : stride[d - lead];
    }
}

/* dst[i] = src[i0 s0 + i1 s1 + i2 s2 + i3 s3] for i = (i0, i1, i2, i3) over shape4 in row-major order: elements of
 * esize bytes (1, 4 or 8; any other size byte by byte), strides s in elements (0 repeats an element). Each
 * element is moved by a memcpy of constant size, so a float is copied bit for bit, NaN payloads included. */
#define QKV_SHAPE_WALK_(SIZE)                                                                                          \
    do {                                                                                                               \
        for (int64_t i0 = 0; i0 < shape4[0]; i0++)                                                                     \
            for (int64_t i1 = 0; i1 < shape4[1]; i1++)                                                                 \
                for (int64_t i2 = 0; i2 < shape4[2]; i2++) {                                                           \
                    const unsigned char *row = s + (i0 * stride4[0] + i1 * stride4[1] + i2 * stride4[2]) * (SIZE);     \
                    for (int64_t i3 = 0; i3 < shape4[3]; i3++, d += (SIZE))                                            \
                        memcpy(d, row + i3 * stride4[3] * (SIZE), (SIZE));                                             \
                }                                                                                                      \
    } while (0)
static inline void qkv_shape_copy_(void *dst, const void *src, size_t esize, const int64_t shape4[4],
                                   const int64_t stride4[4]) {
    unsigned char *d = dst;
    const unsigned char *s = src;
    for (int k = 0; k < 4; k++)
        if (shape4[k] == 0) return; /* an empty tensor: nothing to read or write */
    switch (esize) {
    case 1: QKV_SHAPE_WALK_(1); break;
    case 4: QKV_SHAPE_WALK_(4); break;
    case 8: QKV_SHAPE_WALK_(8); break;
    default: QKV_SHAPE_WALK_((int64_t)esize); break;
    }
}
#undef QKV_SHAPE_WALK_

#endif /* QKV_SHAPE_COMMON_H */
