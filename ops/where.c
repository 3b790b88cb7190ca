/*
 * where.c — qkv_where: z = mask ? a : b elementwise, NumPy broadcasting of all three.
 *   mask u8 [n, 1], a [n, d], b [d] -> z [n, d]
 * Any nonzero mask byte picks a. The gradient goes whole to the operand picked and 0 to the other, so a NaN
 * or inf in the operand not picked reaches neither z nor a gradient (summed over broadcast dimensions). The
 * mask is not differentiable; the node keeps its own copy (the caller may change or free it before the
 * backward). f32 runs on the float arrays, run by run (a copy: the bits of a and b); the gradients are summed in
 * double in output order, as f64's.
 */
#include "qkv_internal.h"

typedef struct where_walk {
    const uint8_t *mask;
    const double *a, *b, *dz;
    double *z, *da, *db;
} where_walk;

// z[i] = mask[im] ? a[ia] : b[ib]
static void where_forward(int64_t i, const int64_t *off, void *user) {
    where_walk *w = user;
    w->z[i] = w->mask[off[0]] ? w->a[off[1]] : w->b[off[2]];
}

// da[ia] += mask ? dz : 0;  db[ib] += mask ? 0 : dz
static void where_backward_visit(int64_t i, const int64_t *off, void *user) {
    where_walk *w = user;
    if (w->mask[off[0]]) {
        if (w->da) w->da[off[1]] += w->dz[i];
    } else if (w->db) {
        w->db[off[2]] += w->dz[i];
    }
}

/* f32, run by run (qkv_bcast_rows_) on the float arrays */
typedef struct where_rows {
    const uint8_t *mask;
    const float *a, *b, *dz;
    float *z;
    double *da, *db;
    int64_t stride[3]; /* mask, a, b along a run */
} where_rows;

// z[j] = mask[j sm] ? a[j sa] : b[j sb]
QKV_VECTOR_LOOP
static void where_forward_run(int64_t i0, const int64_t *off, int64_t len, void *user) {
    const where_rows *w = user;
    const uint8_t *m = w->mask + off[0];
    const float *a = w->a + off[1], *b = w->b + off[2];
    float *z = w->z + i0;
    int64_t sm = w->stride[0], sa = w->stride[1], sb = w->stride[2];
    if (sm && sa && sb)
        for (int64_t j = 0; j < len; j++) z[j] = m[j] ? a[j] : b[j];
    else
        for (int64_t j = 0; j < len; j++) z[j] = m[j * sm] ? a[j * sa] : b[j * sb];
}

// da[j sa] += mask ? dz : 0;  db[j sb] += mask ? 0 : dz   (in order)
static void where_backward_run(int64_t i0, const int64_t *off, int64_t len, void *user) {
    const where_rows *w = user;
    const uint8_t *m = w->mask + off[0];
    const float *dz = w->dz + i0;
    double *da = w->da ? w->da + off[1] : NULL, *db = w->db ? w->db + off[2] : NULL;
    int64_t sm = w->stride[0], sa = w->stride[1], sb = w->stride[2];
    for (int64_t j = 0; j < len; j++) {
        if (m[j * sm]) {
            if (da) da[j * sa] += (double)dz[j];
        } else if (db) {
            db[j * sb] += (double)dz[j];
        }
    }
}

/* f32 when mask, a, b and z all have one shape (no broadcasting): each gradient element gets exactly one
 * contribution, so it goes straight into the float gradient in one pass, the same bits as summing into a zeroed
 * double array and adding that, (float)((double)g + pick), and into a fresh gradient (float)(0.0 + pick): both are
 * one addition of two floats, which carried out in double and rounded once to float is the float addition itself
 * (Figueroa, qkv_internal.h's QKV_UNARY_F32_FLOAT_*), so it runs in float, on twice the lanes. */
QKV_VECTOR_LOOP
static void where_backward_whole_f32(const uint8_t *restrict mask, const float *restrict dz, float *restrict g,
                                     int64_t n, bool pick_when_set, bool fresh) {
    if (fresh) // g = 0 + (mask picks this operand ? dz : 0)
        for (int64_t i = 0; i < n; i++) g[i] = 0.0f + ((mask[i] != 0) == pick_when_set ? dz[i] : 0.0f);
    else // g += mask picks this operand ? dz : 0
        for (int64_t i = 0; i < n; i++) g[i] = g[i] + ((mask[i] != 0) == pick_when_set ? dz[i] : 0.0f);
}

typedef struct where_saved {
    qkv_bcast_ plan;
    uint8_t *mask; /* the node's copy */
    int64_t mask_numel;
} where_saved;

static void where_backward(qkv_ctx *ctx, qkv_node_ *node) {
    const where_saved *s = node->saved;
    qkv_tensor *a = node->in[0], *b = node->in[1];
    where_walk w = {.mask = s->mask};
    where_rows r = {.mask = s->mask};
    bool f32 = a->dtype == QKV_F32;
    int64_t n = s->plan.numel;
    if (f32 && s->mask_numel == n && a->numel == n && b->numel == n && n > 0) { // no broadcasting: one pass each
        bool fresh;
        qkv_tensor *g;
        if (qkv_wants_grad_(a) && (g = qkv_grad_to_write_(ctx, a, &fresh)))
            where_backward_whole_f32(s->mask, node->out->grad->data, g->data, n, true, fresh);
        if (qkv_wants_grad_(b) && (g = qkv_grad_to_write_(ctx, b, &fresh)))
            where_backward_whole_f32(s->mask, node->out->grad->data, g->data, n, false, fresh);
        return;
    }
    if (f32) r.dz = node->out->grad->data;
    else if (!(w.dz = qkv_as_f64_(ctx, node->op, node->out->grad))) return;
    if (qkv_wants_grad_(a) && !(w.da = qkv_arena_array_(ctx, node->op, (size_t)a->numel + 1, sizeof(double)))) return;
    if (qkv_wants_grad_(b) && !(w.db = qkv_arena_array_(ctx, node->op, (size_t)b->numel + 1, sizeof(double)))) return;
    if (w.da) memset(w.da, 0, (size_t)a->numel * sizeof(double));
    if (w.db) memset(w.db, 0, (size_t)b->numel * sizeof(double));
    r.da = w.da, r.db = w.db;
    if (f32) qkv_bcast_rows_(&s->plan, r.stride, where_backward_run, &r);
    else qkv_bcast_each_(&s->plan, where_backward_visit, &w);
    qkv_tensor *ga = w.da ? qkv_grad_of_(ctx, a) : NULL, *gb = w.db ? qkv_grad_of_(ctx, b) : NULL;
    if (ga) qkv_accumulate_f64_(ga, w.da);
    if (gb) qkv_accumulate_f64_(gb, w.db);
}

qkv_tensor *qkv_where(qkv_ctx *ctx, const qkv_tensor *mask, qkv_tensor *a, qkv_tensor *b) {
    const char *fn = "qkv_where";
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_tensor_(ctx, fn, "mask", mask)) return NULL;
    if (mask->dtype != QKV_U8)
        return qkv_fail_(ctx, QKV_ERR_DTYPE, "%s: mask is %s %s; it must be u8 (nonzero picks a)", fn,
                         qkv_dtype_name(mask->dtype), QKV_SHAPE(mask));
    if (!qkv_check_float_(ctx, fn, "a", a) || !qkv_check_float_(ctx, fn, "b", b) ||
        !qkv_check_same_dtype_(ctx, fn, a, "a", b, "b"))
        return NULL;
    const qkv_tensor *ops[3] = {mask, a, b};
    static const char *const names[3] = {"mask", "a", "b"};
    qkv_bcast_ plan;
    if (!qkv_bcast_plan_(ctx, fn, ops, names, 3, &plan)) return NULL;
    qkv_tensor *z = qkv_new_tensor_(ctx, fn, a->dtype, plan.ndim, plan.shape);
    if (!z) return NULL;
    if (a->dtype == QKV_F32) { // on the float arrays, run by run
        where_rows r = {.mask = mask->data, .a = a->data, .b = b->data, .z = z->data};
        qkv_bcast_rows_(&plan, r.stride, where_forward_run, &r);
    } else {
        where_walk w = {.mask = mask->data};
        w.a = qkv_as_f64_(ctx, fn, a);
        w.b = qkv_as_f64_(ctx, fn, b);
        w.z = qkv_out_f64_(ctx, fn, z);
        if (!w.a || !w.b || !w.z) return NULL;
        qkv_bcast_each_(&plan, where_forward, &w);
        qkv_store_f64_(z, w.z);
    }
    qkv_tensor *in[2] = {a, b};
    if (qkv_needs_grad_(ctx, in, 2)) {
        where_saved *s = qkv_arena_alloc_(ctx, fn, sizeof *s);
        uint8_t *copy = qkv_arena_array_(ctx, fn, (size_t)mask->numel + 1, 1);
        if (!s || !copy) return NULL;
        memcpy(copy, mask->data, (size_t)mask->numel);
        *s = (where_saved){plan, copy, mask->numel};
        qkv_node_ *node = qkv_record_(ctx, fn, where_backward, z, in, 2);
        if (!node) return NULL;
        node->saved = s;
    }
    return z;
}
