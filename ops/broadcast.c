/*
 * broadcast.c — NumPy broadcasting for the elementwise operators of two or three operands (div, maximum,
 * minimum, where): the broadcast shape, each operand's strides in it, the walk over its elements, and the
 * binary forward and backward on top of them.
 *   a [2, 1, 4], b [3, 1] -> [2, 3, 4]: trailing dimensions aligned; a 1 (or a missing dimension) stretches.
 */
#include "qkv_internal.h"

bool qkv_bcast_plan_(qkv_ctx *ctx, const char *fn, const qkv_tensor *const *ops, const char *const *names, int n,
                     qkv_bcast_ *plan) {
    memset(plan, 0, sizeof *plan);
    plan->n = n;
    for (int k = 0; k < n; k++)
        if (ops[k]->ndim > plan->ndim) plan->ndim = ops[k]->ndim;
    // out[d] = the operands' common size of dimension d, counted from the right
    for (int d = 0; d < plan->ndim; d++) {
        int64_t size = 1;
        for (int k = 0; k < n; k++) {
            int at = ops[k]->ndim - plan->ndim + d; /* this operand's dimension, or < 0 when it has none */
            int64_t s = at >= 0 ? ops[k]->shape[at] : 1;
            if (s == 1) continue;
            if (size != 1 && s != size) {
                int other = 0;
                while (other < k && (ops[other]->ndim - plan->ndim + d < 0 ||
                                     ops[other]->shape[ops[other]->ndim - plan->ndim + d] != size))
                    other++;
                return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: %s is %s and %s is %s: dimension %d (from the right) is %lld "
                                 "and %lld, neither 1, so they do not broadcast", fn, names[other],
                                 QKV_SHAPE(ops[other]), names[k], QKV_SHAPE(ops[k]), plan->ndim - d, (long long)size,
                                 (long long)s), false;
            }
            size = s;
        }
        plan->shape[d] = size;
    }
    // numel = the product of the broadcast shape ([n, 1] and [1, n] give n^2: checked, as a tensor's own is)
    plan->numel = 1;
    bool empty = false;
    for (int d = 0; d < plan->ndim; d++) empty |= plan->shape[d] == 0;
    for (int d = 0; d < plan->ndim && !empty; d++) {
        if (plan->numel > QKV_MAX_NUMEL / plan->shape[d])
            return qkv_fail_(ctx, QKV_ERR_OVERFLOW, "%s: the broadcast of %s and %s has more than 2^60 elements", fn,
                             QKV_SHAPE(ops[0]), QKV_SHAPE(ops[n - 1])), false;
        plan->numel *= plan->shape[d];
    }
    if (empty) plan->numel = 0;
    // stride[k][d]: the step in operand k's elements along output dimension d (0 where it is broadcast)
    for (int k = 0; k < n; k++) {
        int64_t step = 1;
        for (int d = plan->ndim - 1; d >= 0; d--) {
            int at = ops[k]->ndim - plan->ndim + d;
            int64_t s = at >= 0 ? ops[k]->shape[at] : 1;
            plan->stride[k][d] = s == 1 ? 0 : step;
            step *= s;
        }
    }
    return true;
}

void qkv_bcast_each_(const qkv_bcast_ *plan, void (*visit)(int64_t i, const int64_t *off, void *user), void *user) {
    int64_t idx[QKV_MAX_DIMS] = {0}, off[3] = {0, 0, 0};
    for (int64_t i = 0; i < plan->numel; i++) {
        visit(i, off, user);
        // next index: the last dimension moves fastest; each operand's offset follows by its stride
        for (int d = plan->ndim - 1; d >= 0; d--) {
            for (int k = 0; k < plan->n; k++) off[k] += plan->stride[k][d];
            if (++idx[d] < plan->shape[d]) break;
            for (int k = 0; k < plan->n; k++) off[k] -= plan->stride[k][d] * plan->shape[d];
            idx[d] = 0;
        }
    }
}

void qkv_bcast_rows_(const qkv_bcast_ *plan, int64_t *row_stride,
                     void (*visit_row)(int64_t i0, const int64_t *off, int64_t len, void *user), void *user) {
    int64_t off[3] = {0, 0, 0};
    if (plan->numel == 0) return;
    // one run when each operand is whole (its strides those of the output) or a single element (all 0)
    bool one_run = true;
    for (int k = 0; k < plan->n; k++) {
        bool whole = true, single = true;
        int64_t step = 1;
        for (int d = plan->ndim - 1; d >= 0; d--) {
            int64_t want = plan->shape[d] == 1 ? plan->stride[k][d] : step; /* a size-1 dimension: any stride */
            whole &= plan->stride[k][d] == want;
            single &= plan->stride[k][d] == 0 || plan->shape[d] == 1;
            step *= plan->shape[d];
        }
        one_run &= whole || single;
        row_stride[k] = whole && !single ? 1 : single ? 0 : 1;
    }
    if (one_run || plan->ndim == 0) {
        visit_row(0, off, plan->numel, user);
        return;
    }
    int last = plan->ndim - 1;
    int64_t len = plan->shape[last], idx[QKV_MAX_DIMS] = {0};
    for (int k = 0; k < plan->n; k++) row_stride[k] = plan->stride[k][last];
    for (int64_t i0 = 0; i0 < plan->numel; i0 += len) {
        visit_row(i0, off, len, user);
        // next run: the dimensions before the last, the last of them fastest
        for (int d = last - 1; d >= 0; d--) {
            for (int k = 0; k < plan->n; k++) off[k] += plan->stride[k][d];
            if (++idx[d] < plan->shape[d]) break;
            for (int k = 0; k < plan->n; k++) off[k] -= plan->stride[k][d] * plan->shape[d];
            idx[d] = 0;
        }
    }
}

/* ---- z = f(a, b) ---------------------------------------------------------------------------------- */

typedef struct binary_rows_f32 {
    const qkv_binary_f32_ *f32;
    const float *a, *b, *z, *dz;
    float *out, *ga; /* ga: a's float gradient (backward_full_a) */
    bool store_a;
    double *da, *db;
    int64_t stride[3];
} binary_rows_f32;

static void forward_row_f32(int64_t i0, const int64_t *off, int64_t len, void *user) {
    binary_rows_f32 *w = user;
    w->f32->forward(w->a + off[0], w->stride[0], w->b + off[1], w->stride[1], w->out + i0, len);
}

static void backward_row_f32(int64_t i0, const int64_t *off, int64_t len, void *user) {
    binary_rows_f32 *w = user;
    w->f32->backward(w->a + off[0], w->stride[0], w->b + off[1], w->stride[1], w->z + i0, w->dz + i0,
                     w->da ? w->da + off[0] : NULL, w->db ? w->db + off[1] : NULL, len);
}

static void backward_full_a_row_f32(int64_t i0, const int64_t *off, int64_t len, void *user) {
    binary_rows_f32 *w = user;
    w->f32->backward_full_a(w->a + off[0], w->b + off[1], w->stride[1], w->z + i0, w->dz + i0,
                            w->ga ? w->ga + off[0] : NULL, w->store_a, w->db ? w->db + off[1] : NULL, len);
}

typedef struct binary_walk {
    const double *a, *b, *z, *dz;
    double *out, *da, *db; /* forward: out; backward: da, db (either may be NULL) */
    qkv_binary_f_ f;
    qkv_binary_df_ df;
} binary_walk;

// z[i] = f(a[ia], b[ib])
static void forward_visit(int64_t i, const int64_t *off, void *user) {
    binary_walk *w = user;
    w->out[i] = w->f(w->a[off[0]], w->b[off[1]]);
}

// da[ia] += dz[i] * dz/da;  db[ib] += dz[i] * dz/db   (in output order)
static void backward_visit(int64_t i, const int64_t *off, void *user) {
    binary_walk *w = user;
    double pa, pb;
    w->df(w->a[off[0]], w->b[off[1]], w->z[i], &pa, &pb);
    if (w->da) w->da[off[0]] += w->dz[i] * pa;
    if (w->db) w->db[off[1]] += w->dz[i] * pb;
}

typedef struct binary_saved {
    qkv_binary_df_ df;
    qkv_bcast_ plan;
    const qkv_binary_f32_ *f32;
} binary_saved;

// f32: da, db in double buffers over runs, then added into the float gradients; without broadcasting (and a, b
// distinct), straight into the float gradients, a fresh one stored rather than zeroed and added to; with only b
// broadcast, a's straight into its float gradient and b's through the double buffer
static void broadcast_binary_backward_f32(qkv_ctx *ctx, qkv_node_ *node) {
    const binary_saved *s = node->saved;
    qkv_tensor *a = node->in[0], *b = node->in[1];
    if (a != b && a->numel == node->out->numel && b->numel == node->out->numel) {
        bool store_a = false, store_b = false;
        qkv_tensor *ga = qkv_wants_grad_(a) ? qkv_grad_to_write_(ctx, a, &store_a) : NULL;
        if (qkv_wants_grad_(a) && !ga) return;
        qkv_tensor *gb = qkv_wants_grad_(b) ? qkv_grad_to_write_(ctx, b, &store_b) : NULL;
        if (qkv_wants_grad_(b) && !gb) return;
        s->f32->backward_same(a->data, b->data, node->out->data, node->out->grad->data, ga ? ga->data : NULL,
                              gb ? gb->data : NULL, store_a, store_b, a->numel);
        return;
    }
    binary_rows_f32 w = {.f32 = s->f32, .a = a->data, .b = b->data, .z = node->out->data, .dz = node->out->grad->data};
    if (a != b && a->numel == node->out->numel) { /* only b is broadcast: a's gradient needs no double buffer */
        qkv_tensor *ga = qkv_wants_grad_(a) ? qkv_grad_to_write_(ctx, a, &w.store_a) : NULL;
        if (qkv_wants_grad_(a) && !ga) return;
        w.ga = ga ? ga->data : NULL;
        if (qkv_wants_grad_(b) && !(w.db = qkv_arena_array_(ctx, node->op, (size_t)b->numel + 1, sizeof(double))))
            return;
        if (w.db) memset(w.db, 0, (size_t)b->numel * sizeof(double));
        qkv_bcast_rows_(&s->plan, w.stride, backward_full_a_row_f32, &w);
        qkv_tensor *gb = w.db ? qkv_grad_of_(ctx, b) : NULL;
        if (gb) qkv_accumulate_f64_(gb, w.db);
        return;
    }
    if (qkv_wants_grad_(a) && !(w.da = qkv_arena_array_(ctx, node->op, (size_t)a->numel + 1, sizeof(double)))) return;
    if (qkv_wants_grad_(b) && !(w.db = qkv_arena_array_(ctx, node->op, (size_t)b->numel + 1, sizeof(double)))) return;
    if (w.da) memset(w.da, 0, (size_t)a->numel * sizeof(double));
    if (w.db) memset(w.db, 0, (size_t)b->numel * sizeof(double));
    qkv_bcast_rows_(&s->plan, w.stride, backward_row_f32, &w);
    qkv_tensor *ga = w.da ? qkv_grad_of_(ctx, a) : NULL, *gb = w.db ? qkv_grad_of_(ctx, b) : NULL;
    if (ga) qkv_accumulate_f64_(ga, w.da);
    if (gb) qkv_accumulate_f64_(gb, w.db);
}

static void broadcast_binary_backward(qkv_ctx *ctx, qkv_node_ *node) {
    const binary_saved *s = node->saved;
    qkv_tensor *a = node->in[0], *b = node->in[1];
    if (a->dtype == QKV_F32 && s->f32) {
        broadcast_binary_backward_f32(ctx, node);
        return;
    }
    binary_walk w = {.df = s->df};
    w.a = qkv_as_f64_(ctx, node->op, a);
    w.b = qkv_as_f64_(ctx, node->op, b);
    w.z = qkv_as_f64_(ctx, node->op, node->out);
    w.dz = qkv_as_f64_(ctx, node->op, node->out->grad);
    if (!w.a || !w.b || !w.z || !w.dz) return;
    if (qkv_wants_grad_(a) && !(w.da = qkv_arena_array_(ctx, node->op, (size_t)a->numel + 1, sizeof(double)))) return;
    if (qkv_wants_grad_(b) && !(w.db = qkv_arena_array_(ctx, node->op, (size_t)b->numel + 1, sizeof(double)))) return;
    if (w.da) memset(w.da, 0, (size_t)a->numel * sizeof(double));
    if (w.db) memset(w.db, 0, (size_t)b->numel * sizeof(double));
    qkv_bcast_each_(&s->plan, backward_visit, &w);
    qkv_tensor *ga = w.da ? qkv_grad_of_(ctx, a) : NULL, *gb = w.db ? qkv_grad_of_(ctx, b) : NULL;
    if (ga) qkv_accumulate_f64_(ga, w.da);
    if (gb) qkv_accumulate_f64_(gb, w.db);
}

qkv_tensor *qkv_broadcast_binary_(qkv_ctx *ctx, const char *fn, qkv_tensor *a, qkv_tensor *b, qkv_binary_f_ f,
                                  qkv_binary_df_ df, const qkv_binary_f32_ *f32) {
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "a", a) || !qkv_check_float_(ctx, fn, "b", b) ||
        !qkv_check_same_dtype_(ctx, fn, a, "a", b, "b"))
        return NULL;
    const qkv_tensor *ops[2] = {a, b};
    static const char *const names[2] = {"a", "b"};
    qkv_bcast_ plan;
    if (!qkv_bcast_plan_(ctx, fn, ops, names, 2, &plan)) return NULL;
    qkv_tensor *z = qkv_new_tensor_(ctx, fn, a->dtype, plan.ndim, plan.shape);
    if (!z) return NULL;
    if (a->dtype == QKV_F32 && f32) { // on the float arrays, run by run
        binary_rows_f32 r = {.f32 = f32, .a = a->data, .b = b->data, .out = z->data};
        qkv_bcast_rows_(&plan, r.stride, forward_row_f32, &r);
    } else {
        binary_walk w = {.f = f};
        w.a = qkv_as_f64_(ctx, fn, a);
        w.b = qkv_as_f64_(ctx, fn, b);
        w.out = qkv_out_f64_(ctx, fn, z);
        if (!w.a || !w.b || !w.out) return NULL;
        qkv_bcast_each_(&plan, forward_visit, &w);
        qkv_store_f64_(z, w.out);
    }
    qkv_tensor *in[2] = {a, b};
    if (qkv_needs_grad_(ctx, in, 2)) {
        binary_saved *s = qkv_arena_alloc_(ctx, fn, sizeof *s);
        if (!s) return NULL;
        *s = (binary_saved){df, plan, f32};
        qkv_node_ *node = qkv_record_(ctx, fn, broadcast_binary_backward, z, in, 2);
        if (!node) return NULL;
        node->saved = s;
    }
    return z;
}
