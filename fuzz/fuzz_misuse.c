/*
 * fuzz_misuse.c — libFuzzer target that decodes its bytes into a sequence of public calls on two contexts,
 * A and B, and hands them the handles a careless program has: tensors of the other context, step tensors of
 * earlier steps, persistent tensors after qkv_free, gradients (w->grad), tensors of a freed safetensors
 * handle, NULL; with arguments out of range (shapes, thread counts, scales NaN/inf, ids, eps, lr, heads).
 *
 * The calls: make step tensors (zeros, ones, full, from_data, randn, ...), qkv_param / qkv_keep / qkv_free,
 * qkv_step_end, operators, backward, optimizers (new, step, zero_grad, clipping, free), qkv_gradcheck with
 * small functions (some of which misbehave), .npy and safetensors save/load through a temporary directory,
 * element access, error clearing, and reopening context B with another thread count.
 *
 * Checks after every call, on the context it was made on:
 *   - no crash, no undefined behaviour, no leak (the sanitizers; a live-allocation count per context);
 *   - a failed call leaves an error code and a non-empty message that starts with the qkv_ function's name
 *     ("qkv_..."), a successful one leaves none;
 *   - the error is sticky: a call on a context that holds an error returns NULL (or the stored code), and
 *     leaves the code and the message exactly as they were until qkv_clear_error;
 *   - a call on one context changes nothing in the other's error;
 *   - a call given a live tensor of the other context fails (FOREIGN; a stale or freed handle must not
 *     crash, but its address may hold a newer tensor, so it may be accepted), and so does one given a
 *     parameter freed fewer than FREED_KEPT qkv_free calls of a parameter ago on its context (qkv.h: a
 *     context holds the 64 parameters it freed last), whose address no new tensor may have;
 *   - a successful operator on inputs whose magnitude the harness knows (values it wrote) gives finite
 *     values within the bound the operator guarantees (softmax in [0, 1], attention within max |v|, ...);
 *   - qkv_gradcheck of a correct function on f64 inputs passes, and leaves every live tensor's values and
 *     gradients as they were; cross-entropy's gradient follows the targets of its forward.
 *
 * The misuse classes, one switch each (compile with -DQKV_MISUSE_<CLASS>=0 to leave a class out while its
 * defect is not fixed; fuzz/meson.build holds the list of those off in the build). A class that is off is
 * never generated: the harness only hands out handles and arguments that are legal without it.
 * Deterministic: no clock, no state kept across inputs (the temporary directory is made and removed per input).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <dirent.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_common.h"

#ifndef QKV_MISUSE_STALE /* step tensors (and their gradients) of an earlier step, after qkv_step_end      */
#define QKV_MISUSE_STALE 1
#endif
#ifndef QKV_MISUSE_FREED /* persistent tensors after qkv_free (and w->grad with them), a freed safetensors */
#define QKV_MISUSE_FREED 1
#endif
#ifndef QKV_MISUSE_FREED_UNDER_OPTIM /* qkv_free of a parameter an optimizer still holds, then its step */
#define QKV_MISUSE_FREED_UNDER_OPTIM 1
#endif
#ifndef QKV_MISUSE_GRAD_FREE /* qkv_free of a gradient (w->grad), then the tensor's next backward        */
#define QKV_MISUSE_GRAD_FREE 1
#endif
#ifndef QKV_MISUSE_FOREIGN /* tensors, optimizers and safetensors handles of the other context           */
#define QKV_MISUSE_FOREIGN 1
#endif
#ifndef QKV_MISUSE_GRADCHECK /* gradcheck functions that misbehave, and the isolation checks around it   */
#define QKV_MISUSE_GRADCHECK 1
#endif
#ifndef QKV_MISUSE_XENT /* cross-entropy targets (any i32 tensor: embedding ids) changed before backward */
#define QKV_MISUSE_XENT 1
#endif
#ifndef QKV_MISUSE_TINY_EPS /* a norm eps or softcap cap > 0 as a double and 0 as a float (1e-300), on f32 */
#define QKV_MISUSE_TINY_EPS 1
#endif
#ifndef QKV_MISUSE_THREADS /* thread counts far above the machine's (1 << 20, INT_MAX) for a context      */
#define QKV_MISUSE_THREADS 1
#endif
#ifndef QKV_MISUSE_EMPTY /* empty tensors with huge other dimensions, huge head counts and offsets       */
#define QKV_MISUSE_EMPTY 1
#endif
#ifndef QKV_MISUSE_FILES /* loading and saving paths that are not regular files: a directory, a FIFO,    */
#define QKV_MISUSE_FILES 1 /* /dev/zero, /dev/null, "", a missing directory                             */
#endif

/* ---- reading the program ------------------------------------------------------------------------- */

typedef struct reader {
    const uint8_t *p;
    size_t n, i;
} reader;

static unsigned byte(reader *r) { return r->i < r->n ? r->p[r->i++] : 0; }
static unsigned below(reader *r, unsigned k) { return byte(r) % k; }
static bool more(const reader *r) { return r->i < r->n; }

/* ---- the harness's model of every handle it has seen --------------------------------------------- */

/* qkv.h: a parameter freed fewer than this many qkv_free calls of a parameter ago on its context is refused,
 * and no new tensor is made at its address. */
#define FREED_KEPT 64u

enum { POOL = 48, MAX_CALLS = 96, MAX_DIMS_IN = QKV_MAX_DIMS + 1 };

typedef enum kind { K_STEP, K_PERSIST, K_GRAD, K_LOADED } kind;

/* What the harness knows of a handle, copied when it was made, so that it never reads a tensor that may be
 * gone. bound: every element's |x| is at most this (INFINITY: unknown, or not finite). */
typedef struct handle {
    qkv_tensor *t;
    int owner;       /* 0: A, 1: B                                                     */
    kind kind;
    unsigned step;   /* the owner's step when made (step tensors and their gradients)  */
    int parent;      /* K_GRAD: the slot of the tensor whose gradient it is; K_LOADED: the st slot */
    bool freed;      /* K_PERSIST after qkv_free; K_GRAD of a freed parent; K_LOADED after its st was freed */
    bool param;      /* K_PERSIST made by qkv_param                                     */
    unsigned long freed_at; /* a parameter freed by the harness: the owner's frees count just after   */
    qkv_dtype dtype;
    int ndim;
    int64_t shape[QKV_MAX_DIMS];
    int64_t numel;
    double bound;
} handle;

typedef struct side {
    qkv_ctx *ctx;
    fuzz_alloc alloc;
    unsigned step;          /* 1 + qkv_step_end calls so far (0 marks persistent handles)       */
    int threads;
    qkv_optimizer *opt;     /* at most one live optimizer per context                          */
    int opt_params[4];      /* its parameters' slots                                           */
    int n_opt;
    qkv_safetensors *st;    /* at most one live loaded checkpoint per context                  */
    int st_id;              /* a number per checkpoint, so K_LOADED handles know theirs        */
    unsigned long frees;    /* qkv_free calls on this context that freed a parameter, as far as the
                             * harness can tell                                                   */
} side;

typedef struct run {
    reader in;
    side s[2];
    handle h[POOL];
    int n;
    int next; /* the slot the next handle replaces once the pool is full */
    char dir[64]; /* the temporary directory, "" if none */
    int st_ids;
} run;

static bool tracing(void) { return getenv("QKV_FUZZ_TRACE") != NULL; }

/* ---- classes of a handle ------------------------------------------------------------------------- */

/* Whether the handle is gone for the harness (its memory may be released). */
static bool is_freed(const run *r, const handle *h) {
    if (h->freed) return true;
    if (h->kind == K_GRAD && h->parent >= 0 && r->h[h->parent].t && r->h[h->parent].freed) return true;
    return false;
}

static bool is_stale(const run *r, const handle *h) {
    bool stepwise = h->kind == K_STEP || (h->kind == K_GRAD && h->step != 0);
    return stepwise && h->step != r->s[h->owner].step;
}

/* A handle that is legal to pass to context c under the classes compiled in. */
static bool allowed(const run *r, const handle *h, int c) {
    if (!h->t) return false;
    if (!QKV_MISUSE_FOREIGN && h->owner != c) return false;
    if (!QKV_MISUSE_STALE && is_stale(r, h)) return false;
    if (!QKV_MISUSE_FREED && is_freed(r, h)) return false;
    return true;
}

/* A parameter the harness freed fewer than FREED_KEPT frees of parameters ago on its context: still held
 * there, so refused on either context, and its address is no other tensor's. */
static bool recently_freed(const run *r, const handle *h) {
    return h->t && h->kind == K_PERSIST && h->param && h->freed && r->s[h->owner].frees - h->freed_at < FREED_KEPT;
}

/* A handle that a careful library must refuse on context c, and can: a live tensor of the other context, or
 * a recently freed one. (Another stale or freed handle must not crash it, but its address may hold a new
 * tensor by now, made by the library itself, a gradient say: from the pointer alone it is then valid.) */
static bool misused(const run *r, const handle *h, int c) {
    if (h && recently_freed(r, h)) return true;
    return h && h->t && h->owner != c && !is_stale(r, h) && !is_freed(r, h);
}

/* A handle the harness may read itself (live, of the current step or persistent). */
static bool readable(const run *r, const handle *h) { return h && h->t && !is_freed(r, h) && !is_stale(r, h); }

/* ---- calls and their checks ---------------------------------------------------------------------- */

typedef struct before {
    int c;
    qkv_status st, other_st;
    char msg[512], other_msg[512];
    bool misuse; /* a misused handle was passed                                   */
} before;

static void snap(const run *r, int c, before *b) {
    b->c = c;
    b->st = qkv_error(r->s[c].ctx);
    b->other_st = qkv_error(r->s[1 - c].ctx);
    snprintf(b->msg, sizeof b->msg, "%s", qkv_errmsg(r->s[c].ctx));
    snprintf(b->other_msg, sizeof b->other_msg, "%s", qkv_errmsg(r->s[1 - c].ctx));
    b->misuse = false;
}

/* The checks every call gets. ok: the call returned a result (or QKV_OK); has_result: it is a call whose
 * success is visible (a result or a status; false for void functions). */
static void checked(run *r, const before *b, const char *what, bool ok, bool has_result) {
    qkv_ctx *ctx = r->s[b->c].ctx;
    qkv_status st = qkv_error(ctx);
    if (tracing())
        fprintf(stderr, "[fuzz_misuse] %c %-26s %s%s %s\n", "AB"[b->c], what, has_result ? (ok ? "ok " : "-- ") : "   ",
                b->misuse ? " (misuse)" : "", st ? qkv_errmsg(ctx) : "");
    FUZZ_CHECK(qkv_error(r->s[1 - b->c].ctx) == b->other_st &&
                   strcmp(qkv_errmsg(r->s[1 - b->c].ctx), b->other_msg) == 0,
               "%s on context %c changed context %c's error to %s: %s", what, "AB"[b->c], "AB"[1 - b->c],
               qkv_status_name(qkv_error(r->s[1 - b->c].ctx)), qkv_errmsg(r->s[1 - b->c].ctx));
    if (b->st != QKV_OK) { /* sticky */
        FUZZ_CHECK(st == b->st && strcmp(qkv_errmsg(ctx), b->msg) == 0,
                   "%s replaced the stored error %s (\"%s\") by %s (\"%s\")", what, qkv_status_name(b->st),
                   b->msg, qkv_status_name(st), qkv_errmsg(ctx));
        FUZZ_CHECK(!has_result || !ok, "%s returned a result on a context holding %s", what,
                   qkv_status_name(b->st));
        return;
    }
    if (has_result) fuzz_check_outcome(ctx, ok, what);
    if (st != QKV_OK) {
        FUZZ_CHECK(strncmp(qkv_errmsg(ctx), "qkv_", 4) == 0, "%s failed with a message naming no qkv_ function: %s",
                   what, qkv_errmsg(ctx));
    }
    FUZZ_CHECK(!(has_result && ok && b->misuse), "%s accepted a stale, freed or foreign handle", what);
}

static bool in_optimizer(const run *r, int slot) {
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < r->s[k].n_opt && r->s[k].opt; j++)
            if (r->s[k].opt_params[j] == slot) return true;
    return false;
}

/* Remember a tensor the library handed back. */
static int add(run *r, qkv_tensor *t, int owner, kind k, int parent, double bound) {
    if (!t) return -1;
    for (int i = 0; i < r->n; i++) /* the same live pointer again (a gradient, x itself from dropout(p=0)) */
        if (r->h[i].t == t && readable(r, &r->h[i]) && r->h[i].owner == owner) return i;
    for (int i = 0; i < r->n; i++) { /* a stale or freed handle at this address is this tensor now: drop it */
        if (r->h[i].t != t) continue;
        FUZZ_CHECK(!recently_freed(r, &r->h[i]), "a new tensor of context %c was made at the address of one freed "
                   "%lu frees ago on context %c", "AB"[owner], r->s[r->h[i].owner].frees - r->h[i].freed_at,
                   "AB"[r->h[i].owner]);
        r->h[i].t = NULL;
    }
    int i;
    if (r->n < POOL) i = r->n++;
    else {
        /* the oldest slot, but never an optimizer's parameter (the optimizer refers to them by slot) */
        do {
            i = r->next;
            r->next = (r->next + 1) % POOL;
        } while (in_optimizer(r, i));
        for (int j = 0; j < r->n; j++) /* a gradient whose parent slot is reused loses its parent */
            if (r->h[j].parent == i && r->h[j].kind == K_GRAD) {
                if (is_freed(r, &r->h[j])) r->h[j].freed = true;
                r->h[j].parent = -1;
            }
    }
    handle *h = &r->h[i];
    memset(h, 0, sizeof *h);
    h->t = t;
    h->owner = owner;
    h->kind = k;
    h->parent = parent;
    h->step = k == K_STEP ? r->s[owner].step : 0;
    if (k == K_GRAD && parent >= 0 && r->h[parent].kind == K_STEP) h->step = r->h[parent].step;
    if (k == K_GRAD && parent >= 0 && r->h[parent].kind == K_GRAD) h->step = r->h[parent].step;
    h->dtype = t->dtype;
    h->ndim = t->ndim;
    memcpy(h->shape, t->shape, sizeof h->shape);
    h->numel = t->numel;
    h->bound = (t->dtype == QKV_F32 || t->dtype == QKV_F64) ? bound : INFINITY;
    return i;
}

static bool is_float_dtype(qkv_dtype d) { return d == QKV_F32 || d == QKV_F64; }

static double elem(const qkv_tensor *t, int64_t i) {
    switch (t->dtype) {
    case QKV_F32: return ((const float *)t->data)[i];
    case QKV_F64: return ((const double *)t->data)[i];
    case QKV_I32: return ((const int32_t *)t->data)[i];
    default: return ((const uint8_t *)t->data)[i];
    }
}

/* A successful operator on inputs of known magnitude: finite values, within the bound (to rounding). */
static void check_bound(const qkv_tensor *t, double bound, const char *what) {
    if (!t || !is_float_dtype(t->dtype) || !(bound <= 1e30)) return;
    double lim = bound * 1.001 + 1e-6;
    for (int64_t i = 0; i < t->numel; i++) {
        double x = elem(t, i);
        FUZZ_CHECK(isfinite(x) && fabs(x) <= lim, "%s: element %lld is %g, outside the bound %g its inputs give",
                   what, (long long)i, x, bound);
        if (!(isfinite(x) && fabs(x) <= lim)) return;
    }
}

/* A tensor-returning call: check it, keep its result. Returns the slot or -1. */
static int result(run *r, const before *b, const char *what, qkv_tensor *t, double bound) {
    checked(r, b, what, t != NULL, true);
    if (!t) return -1;
    (void)fuzz_check_tensor(t, 0, what);
    check_bound(t, bound, what);
    return add(r, t, b->c, K_STEP, -1, bound);
}

static void status_call(run *r, const before *b, const char *what, qkv_status st) {
    checked(r, b, what, st == QKV_OK, true);
    FUZZ_CHECK(st == qkv_error(r->s[b->c].ctx), "%s returned %s but the context holds %s", what,
               qkv_status_name(st), qkv_status_name(qkv_error(r->s[b->c].ctx)));
}

/* After a failure, clear the error (most of the time) so that the sequence goes on. */
static void maybe_clear(run *r, int c) {
    if (qkv_error(r->s[c].ctx) != QKV_OK && byte(&r->in) < 200) qkv_clear_error(r->s[c].ctx);
}

/* ---- arguments ----------------------------------------------------------------------------------- */

/* A handle for context c: a pool entry allowed under the classes compiled in, or NULL (1 time in 16).
 * Marks b->misuse when it hands out a misused one. */
static qkv_tensor *pick(run *r, int c, before *b, int *slot) {
    unsigned v = byte(&r->in);
    if (slot) *slot = -1;
    if (r->n == 0 || v >= 240) return NULL;
    int start = (int)(v % (unsigned)r->n);
    for (int k = 0; k < r->n; k++) {
        int i = (start + k) % r->n;
        if (!allowed(r, &r->h[i], c)) continue;
        if (misused(r, &r->h[i], c)) b->misuse = true;
        if (slot) *slot = i;
        return r->h[i].t;
    }
    return NULL;
}

static double bound_of(const run *r, int slot) { return slot >= 0 ? r->h[slot].bound : INFINITY; }

/* One dimension: mostly 1..4, sometimes 0, negative, or (EMPTY) huge. */
static int64_t dim(reader *in) {
    unsigned v = byte(in);
    if (v < 200) return 1 + v % 4;
    if (v < 216) return 0;
    if (v < 232) return 5 + v % 4;
    switch (v % 6) {
    case 0: return -1;
    case 1: return INT64_MIN;
    case 2: return QKV_MISUSE_EMPTY ? (int64_t)1 << 30 : 3;
    case 3: return QKV_MISUSE_EMPTY ? INT64_MAX : 2;
    case 4: return 16;
    default: return 1;
    }
}

/* A shape (ndim -1 .. 5 now and then). An empty shape with huge other dimensions only under EMPTY. */
static int shape_of(reader *in, int64_t *shape) {
    unsigned v = byte(in);
    int ndim = v < 240 ? (int)(v % 5) : (int)(v % 7) - 1;
    for (int i = 0; i < MAX_DIMS_IN; i++) shape[i] = 1;
    for (int i = 0; i < ndim && i < MAX_DIMS_IN; i++) shape[i] = dim(in);
    return ndim;
}

static qkv_dtype dtype_of(reader *in) {
    unsigned v = byte(in);
    if (v < 224) return v & 1 ? QKV_F64 : QKV_F32;
    return (qkv_dtype)(v % 5); /* i32, u8, and 4 (no dtype) now and then */
}

/* Values the harness writes: bounded by 4, or now and then a special one (then the bound is unknown). */
static double value_of(reader *in, double *bound) {
    unsigned v = byte(in);
    if (v < 224) {
        double x = ((double)(v % 33) - 16.0) / 4.0;
        *bound = fmax(*bound, fabs(x));
        return x;
    }
    static const double specials[] = {NAN, INFINITY, -INFINITY, 1e30, -1e308, 1e-310, 3.4e38, 80.0};
    *bound = INFINITY;
    return specials[v % 8];
}

static double scale_of(reader *in) {
    unsigned v = byte(in);
    if (v < 128) return QKV_SCALE_DEFAULT;
    if (v < 192) return 1.0 / (1 + v % 8);
    return (const double[]){0.0, -1.0, 2.0, NAN, INFINITY, -INFINITY, 1e300, -0.0}[v % 8];
}

/* ---- making tensors ------------------------------------------------------------------------------ */

static void op_make(run *r, int c) {
    reader *in = &r->in;
    qkv_ctx *ctx = r->s[c].ctx;
    int64_t shape[MAX_DIMS_IN];
    int ndim = shape_of(in, shape);
    qkv_dtype dt = dtype_of(in);
    before b;
    snap(r, c, &b);
    double bound = 0;
    unsigned how = below(in, 9);
    qkv_tensor *t = NULL;
    const char *what = "";
    switch (how) {
    case 0: what = "qkv_zeros", t = qkv_zeros(ctx, dt, ndim, shape); break;
    case 1: what = "qkv_ones", t = qkv_ones(ctx, dt, ndim, shape), bound = 1; break;
    case 2: {
        double x = value_of(in, &bound);
        what = "qkv_full", t = qkv_full(ctx, dt, ndim, shape, x);
        if (dt == QKV_F32 && fabs(x) > 3.4e38) bound = INFINITY;
        break;
    }
    case 3: what = "qkv_scalar", t = qkv_scalar(ctx, dt, value_of(in, &bound)), bound = INFINITY; break;
    case 4: {
        double mean = byte(in) < 240 ? 0.0 : NAN, sd = byte(in) < 240 ? 1.0 : -1.0;
        what = "qkv_randn", t = qkv_randn(ctx, dt, ndim, shape, mean, sd), bound = INFINITY;
        break;
    }
    case 5: {
        double lo = byte(in) < 240 ? -1.0 : INFINITY, hi = byte(in) < 240 ? 2.0 : -2.0;
        what = "qkv_rand_uniform", t = qkv_rand_uniform(ctx, dt, ndim, shape, lo, hi), bound = 2;
        break;
    }
    case 6: {
        int64_t fi = dim(in), fo = dim(in);
        what = byte(in) & 1 ? "qkv_xavier_uniform" : "qkv_he_normal";
        t = what[4] == 'x' ? qkv_xavier_uniform(ctx, dt, fi, fo) : qkv_he_normal(ctx, dt, fi, fo);
        bound = INFINITY;
        break;
    }
    case 7: {
        int64_t n = dim(in), d = dim(in);
        what = "qkv_sinusoidal_positions", t = qkv_sinusoidal_positions(ctx, n, d, dt), bound = 1;
        break;
    }
    default: {
        /* from_data: values from the program (i32: small ids, some negative or >= 4; u8: 0/1/255) */
        int64_t numel = 1;
        bool small = ndim >= 0 && ndim <= QKV_MAX_DIMS;
        for (int i = 0; small && i < ndim; i++) {
            if (shape[i] < 0 || shape[i] > 64 || numel * shape[i] > 64) small = false;
            else numel *= shape[i];
        }
        if (!small) { /* too large for the buffer: a shape error or an empty zeros */
            what = "qkv_zeros", t = qkv_zeros(ctx, dt, ndim, shape);
            break;
        }
        union {
            double f64[64];
            float f32[64];
            int32_t i32[64];
            uint8_t u8[64];
        } data;
        memset(&data, 0, sizeof data);
        for (int64_t i = 0; i < numel; i++) {
            double x = value_of(in, &bound);
            if (dt == QKV_F64) data.f64[i] = x;
            else if (dt == QKV_F32) /* (a double beyond the float range converts to inf, not by a cast: UB) */
                data.f32[i] = fabs(x) <= 3.4e38 || isnan(x) ? (float)x : (float)copysign(INFINITY, x),
                bound = fabs(x) > 3.4e38 ? INFINITY : bound;
            else if (dt == QKV_I32) data.i32[i] = fabs(x) < 2e9 ? (int32_t)x : INT32_MAX;
            else data.u8[i] = (uint8_t)(isfinite(x) && x > 0 ? (x > 3 ? 255 : 1) : 0);
        }
        what = "qkv_from_data", t = qkv_from_data(ctx, dt, ndim, shape, &data);
        break;
    }
    }
    int slot = result(r, &b, what, t, bound);
    if (slot >= 0 && is_float_dtype(t->dtype) && (byte(in) & 1)) {
        before b2;
        snap(r, c, &b2);
        status_call(r, &b2, "qkv_set_requires_grad", qkv_set_requires_grad(ctx, t, true));
    }
    maybe_clear(r, c);
}

/* qkv_param / qkv_keep of a pool handle, qkv_free of one. */
static void op_persist(run *r, int c) {
    reader *in = &r->in;
    qkv_ctx *ctx = r->s[c].ctx;
    before b;
    snap(r, c, &b);
    int slot;
    unsigned how = below(in, 3);
    qkv_tensor *t = pick(r, c, &b, &slot);
    if (how == 0 || how == 1) {
        double bound = bound_of(r, slot);
        qkv_tensor *p = how == 0 ? qkv_param(ctx, t) : qkv_keep(ctx, t);
        checked(r, &b, how == 0 ? "qkv_param" : "qkv_keep", p != NULL, true);
        int ps = p ? add(r, p, c, K_PERSIST, -1, bound) : -1;
        if (ps >= 0) r->h[ps].param = how == 0;
        maybe_clear(r, c);
        return;
    }
    /* qkv_free: a step tensor is a no-op, a persistent one is gone afterwards */
    if (slot >= 0 && !QKV_MISUSE_FREED_UNDER_OPTIM && in_optimizer(r, slot)) return;
    if (slot >= 0 && r->h[slot].kind == K_LOADED) return; /* belongs to its safetensors handle */
    if (slot >= 0 && r->h[slot].kind == K_GRAD && !QKV_MISUSE_GRAD_FREE) return;
    qkv_free(ctx, t);
    checked(r, &b, "qkv_free", false, false);
    if (slot >= 0 && recently_freed(r, &r->h[slot]))
        FUZZ_CHECK(qkv_error(ctx) == QKV_ERR_ARG || b.st != QKV_OK, "qkv_free of a tensor freed %lu frees ago "
                   "stored %s", r->s[r->h[slot].owner].frees - r->h[slot].freed_at, qkv_status_name(qkv_error(ctx)));
    if (slot >= 0 && r->h[slot].kind == K_PERSIST && r->h[slot].owner == c && !is_freed(r, &r->h[slot])) {
        r->h[slot].freed = true;
        if (r->h[slot].param) r->h[slot].freed_at = ++r->s[c].frees;
    }
}

/* The gradient of a pool handle, as a handle of its own. */
static void op_grad(run *r, int c) {
    for (int k = 0; k < r->n; k++) {
        int i = (int)((byte(&r->in) + (unsigned)k) % (unsigned)r->n);
        handle *h = &r->h[i];
        if (h->owner != c || !readable(r, h) || h->kind == K_LOADED || !h->t->grad) continue;
        qkv_tensor *g = h->t->grad;
        int parent = i;
        int slot = add(r, g, c, K_GRAD, parent, INFINITY);
        if (slot >= 0 && h->kind == K_PERSIST) r->h[slot].step = 0;
        return;
    }
}

static void end_step(run *r, int c) {
    qkv_step_end(r->s[c].ctx);
    r->s[c].step++;
    if (tracing()) fprintf(stderr, "[fuzz_misuse] %c qkv_step_end (step %u begins)\n", "AB"[c], r->s[c].step);
}

/* ---- operators ----------------------------------------------------------------------------------- */

static int64_t last(const run *r, int slot, int from_end) {
    if (slot < 0) return 1;
    const handle *h = &r->h[slot];
    return h->ndim >= from_end ? h->shape[h->ndim - from_end] : 1;
}

static void op_unary(run *r, int c) {
    reader *in = &r->in;
    qkv_ctx *ctx = r->s[c].ctx;
    before b;
    snap(r, c, &b);
    int slot;
    qkv_tensor *x = pick(r, c, &b, &slot);
    double bx = bound_of(r, slot), bound = INFINITY;
    qkv_tensor *y = NULL;
    const char *what = "";
    switch (below(in, 16)) {
    case 0: {
        double s = scale_of(in);
        if (s == QKV_SCALE_DEFAULT) s = 0.5;
        what = "qkv_scale", y = qkv_scale(ctx, x, s), bound = fabs(s) * bx;
        break;
    }
    case 1: what = "qkv_relu", y = qkv_relu(ctx, x), bound = bx; break;
    case 2: {
        int a = byte(in) < 240 ? (int)below(in, 2) : 7;
        what = "qkv_gelu", y = qkv_gelu(ctx, x, (qkv_gelu_approx)a), bound = bx + 0.2;
        break;
    }
    case 3: {
        double cap = (const double[]){1.0, 30.0, 0.0, -1.0, NAN, INFINITY, 1e-300, 5.0}[below(in, 8)];
        if (!QKV_MISUSE_TINY_EPS && cap == 1e-300) cap = 1e-30;
        /* |cap tanh(x / cap)| <= min(|x|, cap) for a finite x; a NaN x gives NaN (bx is then INFINITY) */
        what = "qkv_softcap", y = qkv_softcap(ctx, x, cap), bound = bx < INFINITY ? fmin(bx, fabs(cap)) : INFINITY;
        break;
    }
    case 4: {
        double base = (const double[]){10000.0, 2.0, 1.0, 0.5, NAN, INFINITY, -3.0, 100.0}[below(in, 8)];
        int64_t off = (const int64_t[]){0, 3, -1, INT64_MAX, QKV_MISUSE_EMPTY ? (int64_t)1 << 40 : 7, 1}[below(in, 6)];
        what = "qkv_rope", y = qkv_rope(ctx, x, base, off), bound = 1.4143 * bx;
        break;
    }
    case 5: {
        double p = (const double[]){0.0, 0.5, 0.1, 1.0, -0.1, NAN, 0.999, INFINITY}[below(in, 8)];
        what = "qkv_dropout", y = qkv_dropout(ctx, x, p), bound = bx / (1 - (p >= 0 && p < 1 ? p : 0));
        break;
    }
    case 6: what = "qkv_sum", y = qkv_sum(ctx, x), bound = bx * (double)(slot >= 0 ? r->h[slot].numel : 1); break;
    case 7: /* the mean of no elements is 0 / 0 = NaN */
        what = "qkv_mean", y = qkv_mean(ctx, x), bound = x && slot >= 0 && r->h[slot].numel > 0 ? bx : INFINITY;
        break;
    case 8: what = "qkv_copy", y = qkv_copy(ctx, x), bound = bx; break;
    case 9: {
        qkv_dtype d = dtype_of(in);
        what = "qkv_to_dtype", y = qkv_to_dtype(ctx, x, d), bound = bx;
        break;
    }
    case 10: {
        int64_t shape[MAX_DIMS_IN];
        int nd = shape_of(in, shape);
        if (slot >= 0 && byte(in) < 160) nd = 1, shape[0] = r->h[slot].numel; /* the legal one */
        what = "qkv_reshape", y = qkv_reshape(ctx, x, nd, shape), bound = bx;
        break;
    }
    case 11:
    case 12: {
        static const int heads[] = {1, 2, 3, 4, 0, -1, INT_MIN, 1 << 14, 1 << 30, 2};
        int hd = heads[below(in, 10)];
        if (!QKV_MISUSE_EMPTY && hd > 64) hd = 2;
        bool split = below(in, 2);
        what = split ? "qkv_split_heads" : "qkv_merge_heads";
        y = split ? qkv_split_heads(ctx, x, hd) : qkv_merge_heads(ctx, x, hd), bound = bx;
        break;
    }
    case 13:
    case 14: {
        int sg, sb;
        qkv_tensor *g = byte(in) & 1 ? pick(r, c, &b, &sg) : (sg = -1, NULL);
        bool misuse_without_beta = b.misuse; /* qkv_rms_norm is not given beta */
        qkv_tensor *be = byte(in) & 1 ? pick(r, c, &b, &sb) : (sb = -1, NULL);
        double eps = (const double[]){1e-5, 1e-5, 0.5, 0.0, -1.0, NAN, INFINITY, 1e-300}[below(in, 8)];
        if (!QKV_MISUSE_TINY_EPS && eps == 1e-300) eps = 1e-30;
        double bg = g ? bound_of(r, sg) : 1.0;
        double d = (double)last(r, slot, 1);
        bound = sqrt(d) * bg + (be ? bound_of(r, sb) : 0.0);
        if (!(eps >= 1e-300)) bound = INFINITY;
        if (below(in, 2)) what = "qkv_layer_norm", y = qkv_layer_norm(ctx, x, g, be, eps);
        else
            what = "qkv_rms_norm", b.misuse = misuse_without_beta, y = qkv_rms_norm(ctx, x, g, eps),
            bound = sqrt(d) * bg;
        if (!(bx < INFINITY)) bound = INFINITY;
        break;
    }
    default: {
        int si;
        qkv_tensor *ids = pick(r, c, &b, &si);
        what = "qkv_embedding", y = qkv_embedding(ctx, x, ids), bound = bx;
        break;
    }
    }
    result(r, &b, what, y, bound);
    maybe_clear(r, c);
}

static void op_binary(run *r, int c) {
    reader *in = &r->in;
    qkv_ctx *ctx = r->s[c].ctx;
    before b;
    snap(r, c, &b);
    int sa, sb;
    qkv_tensor *a = pick(r, c, &b, &sa), *bt = pick(r, c, &b, &sb);
    double ba = bound_of(r, sa), bb = bound_of(r, sb), bound = INFINITY;
    qkv_tensor *y = NULL;
    const char *what = "";
    switch (below(in, 5)) {
    case 0: what = "qkv_add", y = qkv_add(ctx, a, bt), bound = ba + bb; break;
    case 1: what = "qkv_sub", y = qkv_sub(ctx, a, bt), bound = ba + bb; break;
    case 2: what = "qkv_mul", y = qkv_mul(ctx, a, bt), bound = ba * bb; break;
    case 3: {
        int flags = (int)below(in, 5); /* 4: not a flag */
        int64_t k = (flags & QKV_TRANS_A) ? last(r, sa, 2) : last(r, sa, 1);
        what = "qkv_matmul", y = qkv_matmul(ctx, a, bt, flags), bound = (double)k * ba * bb;
        break;
    }
    default: {
        int sc;
        qkv_tensor *bias = byte(in) & 1 ? pick(r, c, &b, &sc) : (sc = -1, NULL);
        what = "qkv_projection", y = qkv_projection(ctx, a, bt, bias);
        bound = (double)last(r, sa, 1) * ba * bb + (bias ? bound_of(r, sc) : 0.0);
        break;
    }
    }
    result(r, &b, what, y, bound);
    maybe_clear(r, c);
}

/* A u8 mask [n_q, n_k] made here for scores shaped like slot's handle (or NULL). */
static qkv_tensor *mask_for(run *r, int c, int slot) {
    reader *in = &r->in;
    if (byte(in) < 128) return NULL;
    int64_t shape[2] = {last(r, slot, 2), last(r, slot, 1)};
    if (shape[0] < 0 || shape[1] < 0 || shape[0] * shape[1] > 4096) return NULL;
    before b;
    snap(r, c, &b);
    qkv_tensor *m = qkv_zeros(r->s[c].ctx, QKV_U8, 2, shape);
    checked(r, &b, "qkv_zeros (mask)", m != NULL, true);
    if (!m) return NULL;
    unsigned bits = byte(in);
    for (int64_t i = 0; i < m->numel; i++) ((uint8_t *)m->data)[i] = (uint8_t)((bits >> (i % 8)) & 1);
    add(r, m, c, K_STEP, -1, INFINITY);
    return m;
}

static void op_attention(run *r, int c) {
    reader *in = &r->in;
    qkv_ctx *ctx = r->s[c].ctx;
    unsigned how = below(in, 3);
    if (how == 0) { /* softmax */
        /* the mask first (made here, or any pool handle), then the scores */
        int ss = r->n ? (int)(byte(in) % (unsigned)r->n) : -1;
        qkv_tensor *m = byte(in) & 1 ? mask_for(r, c, ss) : NULL;
        before b;
        snap(r, c, &b);
        if (!m && byte(in) < 64) m = pick(r, c, &b, NULL);
        qkv_tensor *sc = pick(r, c, &b, &ss);
        int flags = (int)below(in, 3);
        qkv_tensor *y = qkv_softmax(ctx, sc, m, flags);
        result(r, &b, "qkv_softmax", y, bound_of(r, ss) < INFINITY ? 1.0 : INFINITY);
        maybe_clear(r, c);
        return;
    }
    before b;
    snap(r, c, &b);
    int sq, sk, sv;
    qkv_tensor *q = pick(r, c, &b, &sq);
    double scale = scale_of(in);
    int flags = (int)below(in, 3);
    qkv_tensor *attn = NULL;
    double attn_bound = INFINITY; /* A is in [0, 1] when every score is finite; NaN rows otherwise */
    bool want = byte(in) & 1;
    if (how == 1) {
        qkv_tensor *k = pick(r, c, &b, &sk), *v = pick(r, c, &b, &sv);
        bool finite_scale = scale == QKV_SCALE_DEFAULT || fabs(scale) <= 1e30;
        bool finite_scores = bound_of(r, sq) < INFINITY && bound_of(r, sk) < INFINITY && finite_scale;
        double bound = finite_scores ? bound_of(r, sv) : INFINITY;
        if (finite_scores) attn_bound = 1.0;
        qkv_tensor *y = qkv_attention(ctx, q, k, v, NULL, scale, flags, want ? &attn : NULL);
        result(r, &b, "qkv_attention", y, bound);
    } else {
        int sk2;
        qkv_tensor *wq = pick(r, c, &b, &sk), *wk = pick(r, c, &b, &sk2), *wv = pick(r, c, &b, &sv);
        /* |v| <= d_model max|x| max|wv|, and out is a convex combination of v's rows */
        double bound = (double)last(r, sq, 1) * bound_of(r, sq) * bound_of(r, sv);
        if (!(bound_of(r, sk) < INFINITY && bound_of(r, sk2) < INFINITY) ||
            !(scale == QKV_SCALE_DEFAULT || fabs(scale) <= 1e30))
            bound = INFINITY;
        if (bound < INFINITY) attn_bound = 1.0;
        qkv_tensor *y = qkv_self_attention(ctx, q, wq, wk, wv, NULL, scale, flags, want ? &attn : NULL);
        result(r, &b, "qkv_self_attention", y, bound);
    }
    if (attn) {
        FUZZ_CHECK(qkv_error(ctx) == QKV_OK, "an attention that failed handed back its attention matrix");
        add(r, attn, c, K_STEP, -1, attn_bound);
    }
    maybe_clear(r, c);
}

/* Cross-entropy on fresh f64 logits [n, V] (leaf requiring grad) and i32 targets [n]; then, under XENT, the
 * targets changed (to another id, an out-of-range one, or all ignored); then the backward, whose gradient
 * must follow the targets of the forward: dlogits[i] = (softmax(logits[i]) - onehot(t[i])) / count. */
static void op_cross_entropy(run *r, int c) {
    reader *in = &r->in;
    qkv_ctx *ctx = r->s[c].ctx;
    int64_t n = 1 + below(in, 4), V = 1 + below(in, 5);
    double lg[4 * 5];
    int32_t tg[4];
    double bound = 0;
    for (int i = 0; i < n * V; i++) lg[i] = value_of(in, &bound);
    for (int i = 0; i < n; i++) {
        unsigned v = byte(in);
        tg[i] = v < 224 ? (int32_t)(v % (unsigned)V) : (v < 240 ? -1 : (int32_t)(V + v % 3));
    }
    if (byte(in) < 32) { /* logits or targets from the pool instead: any misuse */
        before b;
        snap(r, c, &b);
        qkv_tensor *x = pick(r, c, &b, NULL), *t = pick(r, c, &b, NULL);
        result(r, &b, "qkv_cross_entropy", qkv_cross_entropy(ctx, x, t), INFINITY);
        maybe_clear(r, c);
        return;
    }
    if (qkv_error(ctx) != QKV_OK) qkv_clear_error(ctx);
    qkv_tensor *x = qkv_from_data(ctx, QKV_F64, 2, (int64_t[]){n, V}, lg);
    qkv_tensor *t = qkv_from_data(ctx, QKV_I32, 1, (int64_t[]){n}, tg);
    if (!x || !t) {
        FUZZ_CHECK(qkv_error(ctx) != QKV_OK, "qkv_from_data failed with no error");
        qkv_clear_error(ctx);
        return;
    }
    qkv_set_requires_grad(ctx, x, true);
    bool persist_t = byte(in) & 1;
    int st_slot = -1;
    if (persist_t) { /* a persistent targets tensor, which can be freed before the backward */
        t = qkv_keep(ctx, t);
        if (!t) {
            qkv_clear_error(ctx);
            return;
        }
        st_slot = add(r, t, c, K_PERSIST, -1, INFINITY);
    }
    before b;
    snap(r, c, &b);
    bool grad_on = qkv_grad_enabled(ctx);
    qkv_tensor *loss = qkv_cross_entropy(ctx, x, t);
    int valid = 1;
    for (int i = 0; i < n; i++) valid &= tg[i] < V;
    result(r, &b, "qkv_cross_entropy", loss, bound < INFINITY ? 2 * bound + log((double)V) : INFINITY);
    FUZZ_CHECK(valid || !loss || b.st != QKV_OK, "qkv_cross_entropy accepted a target >= V");
    if (!loss) {
        maybe_clear(r, c);
        return;
    }
    if (QKV_MISUSE_XENT) {
        unsigned how = below(in, 5);
        int32_t *p = (int32_t *)t->data;
        if (how == 1) p[0] = (int32_t)((p[0] + 1) % V);           /* another valid id */
        if (how == 2) p[n - 1] = (int32_t)V + 7;                  /* out of range     */
        if (how == 3) p[0] = INT32_MAX;                           /* far out of range */
        if (how == 4 && persist_t && QKV_MISUSE_FREED && !(r->h[st_slot].freed)) { /* freed */
            qkv_free(ctx, t);
            r->h[st_slot].freed = true; /* a kept tensor: not held */
        }
    }
    before b2;
    snap(r, c, &b2);
    qkv_status st = qkv_backward(ctx, loss, NULL);
    status_call(r, &b2, "qkv_backward (cross-entropy)", st);
    if (st == QKV_OK && grad_on && x->grad && bound < 50) {
        int count = 0;
        for (int i = 0; i < n; i++) count += tg[i] >= 0;
        for (int i = 0; i < n; i++) {
            double m = -INFINITY, z = 0;
            for (int j = 0; j < V; j++) m = fmax(m, lg[i * V + j]);
            for (int j = 0; j < V; j++) z += exp(lg[i * V + j] - m);
            for (int j = 0; j < V; j++) {
                double want = tg[i] < 0 ? 0.0 : (exp(lg[i * V + j] - m) / z - (j == tg[i])) / count;
                double got = ((const double *)x->grad->data)[i * V + j];
                FUZZ_CHECK(fabs(got - want) <= 1e-12 + 1e-9 * fabs(want),
                           "qkv_cross_entropy: dlogits[%d,%d] is %.17g, the forward's targets give %.17g", i, j,
                           got, want);
            }
        }
    }
    add(r, x, c, K_STEP, -1, bound);
    maybe_clear(r, c);
}

static void op_backward(run *r, int c) {
    reader *in = &r->in;
    qkv_ctx *ctx = r->s[c].ctx;
    before b;
    snap(r, c, &b);
    int sl;
    qkv_tensor *loss = pick(r, c, &b, &sl);
    qkv_tensor *dloss = byte(in) < 64 ? pick(r, c, &b, NULL) : NULL;
    if (byte(in) < 128 && loss && readable(r, &r->h[sl]) && r->h[sl].owner == c) { /* reduce to a scalar */
        before b0;
        snap(r, c, &b0);
        int s2 = result(r, &b0, "qkv_sum (loss)", qkv_sum(ctx, loss), INFINITY);
        if (s2 >= 0) /* loss is now this context's own scalar and no dloss is passed: nothing misused */
            loss = r->h[s2].t, dloss = NULL, b.misuse = false;
    }
    qkv_status st = qkv_backward(ctx, loss, dloss);
    status_call(r, &b, "qkv_backward", st);
    maybe_clear(r, c);
}

/* Optimizers and gradient clipping, over handles of the pool. */
static void op_optim(run *r, int c) {
    reader *in = &r->in;
    side *s = &r->s[c];
    qkv_ctx *ctx = s->ctx;
    unsigned how = below(in, 6);
    before b;
    snap(r, c, &b);
    if (how == 0 || !s->opt) { /* a new optimizer (the old one freed first) */
        if (s->opt) qkv_optim_free(s->opt), s->opt = NULL, s->n_opt = 0;
        qkv_tensor *params[4];
        int slots[4];
        int n = (int)below(in, 5) - (byte(in) >= 250 ? 3 : 0); /* -3 .. 4 */
        for (int i = 0; i < n && i < 4; i++) {
            params[i] = pick(r, c, &b, &slots[i]);
            /* without FREED_UNDER_OPTIM only tensors that can outlive it (a loaded tensor goes with its
             * checkpoint, a gradient with its tensor) */
            if (!QKV_MISUSE_FREED_UNDER_OPTIM && slots[i] >= 0 && r->h[slots[i]].kind != K_PERSIST)
                params[i] = NULL, slots[i] = -1;
        }
        qkv_optim_options o = qkv_optim_defaults((qkv_optim_kind)below(in, 4));
        o.lr = (const double[]){0.1, 1e-3, 0.0, 1.0, -1.0, NAN, INFINITY, 1e300}[below(in, 8)];
        if (byte(in) >= 240) o.beta1 = 1.0;
        qkv_optimizer *opt = qkv_optim_new(ctx, byte(in) < 250 ? &o : NULL, n > 0 ? params : NULL, n);
        /* a step tensor, NULL or a non-float tensor must be refused too: only persistent float ones are legal */
        bool legal = true;
        for (int i = 0; i < n && i < 4; i++)
            legal &= slots[i] >= 0 && r->h[slots[i]].kind != K_STEP && is_float_dtype(r->h[slots[i]].dtype) &&
                     !(r->h[slots[i]].kind == K_GRAD && r->h[slots[i]].step != 0);
        checked(r, &b, "qkv_optim_new", opt != NULL, true);
        FUZZ_CHECK(!opt || legal || b.st != QKV_OK, "qkv_optim_new accepted a step, NULL or integer tensor");
        if (opt) {
            s->opt = opt;
            s->n_opt = n;
            for (int i = 0; i < n; i++) s->opt_params[i] = slots[i];
        }
        maybe_clear(r, c);
        return;
    }
    /* the optimizer of this context, or (FOREIGN) of the other */
    qkv_optimizer *opt = s->opt;
    int oc = c;
    if (QKV_MISUSE_FOREIGN && r->s[1 - c].opt && byte(in) < 32) opt = r->s[1 - c].opt, oc = 1 - c;
    snap(r, oc, &b);
    /* its parameters: a freed one is misuse, a live one is read (and must be, with FREED_UNDER_OPTIM off) */
    for (int i = 0; i < r->s[oc].n_opt; i++)
        if (r->s[oc].opt_params[i] >= 0 && is_freed(r, &r->h[r->s[oc].opt_params[i]])) b.misuse = true;
    switch (how) {
    case 1:
        status_call(r, &b, "qkv_optim_step", qkv_optim_step(opt));
        for (int i = 0; i < r->s[oc].n_opt; i++) /* the parameters moved */
            if (r->s[oc].opt_params[i] >= 0) r->h[r->s[oc].opt_params[i]].bound = INFINITY;
        break;
    case 2: status_call(r, &b, "qkv_optim_zero_grad", qkv_optim_zero_grad(opt)); break;
    case 3: {
        double lr = (const double[]){0.5, 0.0, -1.0, NAN}[below(in, 4)];
        b.misuse = false; /* the learning rate is the optimizer's own: no parameter is read */
        status_call(r, &b, "qkv_optim_set_lr", qkv_optim_set_lr(opt, lr));
        break;
    }
    case 4: {
        int idx = (int)below(in, 8) - 1;
        const char *name = NULL;
        b.misuse = false; /* the state belongs to the optimizer: no parameter is read */
        qkv_tensor *t = qkv_optim_state(opt, idx, &name);
        checked(r, &b, "qkv_optim_state", t != NULL, true);
        FUZZ_CHECK(!t || (name && name[0]), "qkv_optim_state gave a tensor without a name");
        break;
    }
    default: {
        snap(r, c, &b);
        qkv_tensor *params[4];
        int n = (int)below(in, 5);
        for (int i = 0; i < n; i++) params[i] = pick(r, c, &b, NULL);
        double mx = (const double[]){1.0, 0.0, 1e-3, -1.0, NAN, INFINITY}[below(in, 6)];
        double norm = qkv_clip_grad_norm(ctx, params, n, mx);
        checked(r, &b, "qkv_clip_grad_norm", qkv_error(ctx) == QKV_OK, true);
        if (qkv_error(ctx) == QKV_OK) FUZZ_CHECK(norm >= 0 && isfinite(norm), "qkv_clip_grad_norm gave %g", norm);
        break;
    }
    }
    maybe_clear(r, oc);
}

/* ---- gradcheck ----------------------------------------------------------------------------------- */

typedef struct gc_user {
    run *r;
    int c;
    unsigned mode;
    int calls;
} gc_user;

enum { GC_GOOD = 4 }; /* modes below this are correct functions; the others misbehave */

static qkv_tensor *gc_fn(qkv_ctx *ctx, qkv_tensor *const *x, int n, void *user) {
    gc_user *u = user;
    run *r = u->r;
    u->calls++;
    qkv_tensor *a = x[0], *b = x[n - 1];
    switch (u->mode) {
    case 0: return qkv_scale(ctx, a, 3.0);
    case 1: return qkv_softmax(ctx, a, NULL, 0);
    case 2: return qkv_mul(ctx, a, b);
    case 3: return qkv_layer_norm(ctx, qkv_add(ctx, a, b), NULL, NULL, 1e-5);
    /* misbehaving ones */
    case 4: return NULL; /* NULL with no error stored */
    case 5: return a;    /* an input itself */
    case 6:              /* ends the step the gradcheck runs in */
        end_step(r, u->c);
        return qkv_scale(ctx, a, 2.0);
    case 7: /* a tensor of the other context */
        for (int i = 0; i < r->n; i++)
            if (r->h[i].owner != u->c && readable(r, &r->h[i]) && r->h[i].kind != K_LOADED) return r->h[i].t;
        return NULL;
    case 8: { /* its own backward inside */
        qkv_tensor *y = qkv_scale(ctx, a, 2.0);
        qkv_backward(ctx, qkv_sum(ctx, y), NULL);
        return y;
    }
    case 9: /* recording switched off and left off */
        qkv_set_grad_enabled(ctx, false);
        return qkv_scale(ctx, a, 2.0);
    case 10: /* a step tensor made before the gradcheck */
        for (int i = r->n - 1; i >= 0; i--)
            if (r->h[i].owner == u->c && readable(r, &r->h[i]) && r->h[i].kind == K_STEP) return r->h[i].t;
        return NULL;
    case 11: /* fails on its third call, then clears the error itself */
        if (u->calls == 3) {
            qkv_scale(ctx, a, NAN);
            qkv_clear_error(ctx);
            return NULL;
        }
        return qkv_scale(ctx, a, 2.0);
    default: /* gives a different shape on later calls */
        return u->calls > 2 ? qkv_sum(ctx, a) : qkv_scale(ctx, a, 1.0);
    }
}

/* A hash of what the harness can read of every live handle of context c: values, and gradient values. */
static uint64_t live_hash(run *r, int c) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < r->n; i++) {
        handle *e = &r->h[i];
        if (e->owner != c || !readable(r, e)) continue;
        h = fuzz_hash(h, e->t->data, (size_t)e->numel * qkv_dtype_size(e->dtype));
        if (e->kind != K_LOADED && e->t->grad)
            h = fuzz_hash(h, e->t->grad->data, (size_t)e->t->grad->numel * qkv_dtype_size(e->t->grad->dtype));
        h = fuzz_hash_u64(h, (uint64_t)(uintptr_t)(e->kind != K_LOADED ? e->t->grad : NULL));
    }
    return h;
}

static void op_gradcheck(run *r, int c) {
    reader *in = &r->in;
    qkv_ctx *ctx = r->s[c].ctx;
    before b;
    snap(r, c, &b);
    qkv_tensor *x[3];
    int slots[3];
    int n = 1 + (int)below(in, 3);
    for (int i = 0; i < n; i++) x[i] = pick(r, c, &b, &slots[i]);
    gc_user u = {r, c, below(in, QKV_MISUSE_GRADCHECK ? 13 : GC_GOOD), 0};
    bool good = u.mode < GC_GOOD;
    if (!good) { /* misbehaving functions get legal inputs: the point is the function */
        b.misuse = false;
        for (int i = 0; i < n; i++)
            if (slots[i] < 0 || misused(r, &r->h[slots[i]], c)) return;
    }
    qkv_gradcheck_options o = {0};
    o.seed = byte(in);
    bool defaults = byte(in) < 200;
    if (!defaults) {
        o.eps = (const double[]){1e-3, NAN, -1.0, INFINITY, 1e300, 1e-300}[below(in, 6)];
        o.atol = byte(in) < 128 ? 0.0 : NAN;
    }
    qkv_gradcheck_result res;
    memset(&res, 0, sizeof res);
    bool grad_was = qkv_grad_enabled(ctx);
    unsigned step_before = r->s[c].step;
    uint64_t h_before = live_hash(r, c);
    if (tracing()) fprintf(stderr, "[fuzz_misuse] %c qkv_gradcheck of function %u on %d inputs\n", "AB"[c], u.mode, n);
    qkv_status st = qkv_gradcheck(ctx, gc_fn, x, n, &u, byte(in) < 240 ? &o : NULL, byte(in) < 250 ? &res : NULL);
    status_call(r, &b, "qkv_gradcheck", st);
    if (!QKV_MISUSE_GRADCHECK) return;
    /* isolation: values and gradients of every live tensor as they were, recording as it was */
    if (r->s[c].step == step_before) {
        uint64_t h_after = live_hash(r, c);
        FUZZ_CHECK(h_after == h_before, "qkv_gradcheck (function %u) changed a live tensor's values or gradient",
                   u.mode);
    }
    FUZZ_CHECK(qkv_grad_enabled(ctx) == grad_was, "qkv_gradcheck (function %u) left recording %s", u.mode,
               grad_was ? "off" : "on");
    qkv_set_grad_enabled(ctx, grad_was);
    /* a correct function on bounded f64 inputs of fitting shapes passes */
    if (st == QKV_OK && good && defaults && b.st == QKV_OK) {
        bool all_f64 = true;
        for (int i = 0; i < n; i++)
            all_f64 &= slots[i] >= 0 && r->h[slots[i]].dtype == QKV_F64 && r->h[slots[i]].bound <= 4;
        if (all_f64 && u.mode != 3) FUZZ_CHECK(res.passed, "qkv_gradcheck of a correct function failed: %s", res.message);
    }
    maybe_clear(r, c);
}

/* ---- files --------------------------------------------------------------------------------------- */

/* A path in the temporary directory, or (FILES) one that is not a regular file. Paths to write stay in the
 * temporary directory (the fuzzer may run as root: an atomic write renames over its target). */
static const char *path_of(run *r, char *buf, size_t size, const char *name, bool write) {
    unsigned v = byte(&r->in);
    if (!r->dir[0]) return NULL;
    if (!QKV_MISUSE_FILES || v < 192) {
        snprintf(buf, size, "%s/%s", r->dir, name);
        return buf;
    }
    switch (v % 8) {
    case 0: return r->dir;                                          /* a directory        */
    case 1: snprintf(buf, size, "%s/fifo", r->dir); return buf;     /* a FIFO, no writer  */
    case 2: return write ? "" : "/dev/zero";                        /* endless            */
    case 3: return write ? NULL : "/dev/null";                      /* empty, not regular */
    case 4: return "";
    case 5: snprintf(buf, size, "%s/missing/x", r->dir); return buf;
    case 6: return NULL;
    default: snprintf(buf, size, "%s/", r->dir); return buf;
    }
}

static void op_files(run *r, int c) {
    reader *in = &r->in;
    side *s = &r->s[c];
    qkv_ctx *ctx = s->ctx;
    char pbuf[128];
    before b;
    snap(r, c, &b);
    switch (below(in, 5)) {
    case 0: { /* .npy: save a handle, load it back, compare */
        int slot;
        qkv_tensor *t = pick(r, c, &b, &slot);
        const char *path = path_of(r, pbuf, sizeof pbuf, "t.npy", true);
        qkv_status st = qkv_npy_save(ctx, t, path);
        status_call(r, &b, "qkv_npy_save", st);
        if (st != QKV_OK) break;
        snap(r, c, &b);
        qkv_tensor *back = qkv_npy_load(ctx, path);
        result(r, &b, "qkv_npy_load", back, bound_of(r, slot));
        if (back && readable(r, &r->h[slot]))
            FUZZ_CHECK(back->numel == t->numel && back->dtype == t->dtype &&
                           memcmp(back->data, t->data, (size_t)t->numel * qkv_dtype_size(t->dtype)) == 0,
                       "qkv_npy_load did not give back what qkv_npy_save wrote");
        break;
    }
    case 1: { /* .npy load of whatever the path holds */
        const char *path = path_of(r, pbuf, sizeof pbuf, byte(in) & 1 ? "t.npy" : "s.safetensors", false);
        result(r, &b, "qkv_npy_load", qkv_npy_load(ctx, path), INFINITY);
        /* a file that is not regular is refused, not read until memory runs out (a FIFO with no writer
         * blocks in open: the fuzzer's -timeout, or the replay test's, reports that) */
        if (path && strcmp(path, "/dev/zero") == 0 && b.st == QKV_OK)
            FUZZ_CHECK(qkv_error(ctx) != QKV_ERR_NOMEM, "qkv_npy_load read /dev/zero until memory ran out: %s",
                       qkv_errmsg(ctx));
        break;
    }
    case 2: { /* safetensors save of up to 3 handles */
        qkv_named_tensor nt[3];
        static const char *const names[] = {"a", "b", "c", "a", ""};
        int n = (int)below(in, 4);
        for (int i = 0; i < n; i++) nt[i].name = names[below(in, 5)], nt[i].tensor = pick(r, c, &b, NULL);
        const char *meta[2] = {"k", byte(in) & 1 ? "v" : NULL};
        const char *path = path_of(r, pbuf, sizeof pbuf, "s.safetensors", true);
        status_call(r, &b, "qkv_safetensors_save",
                    qkv_safetensors_save(ctx, path, n ? nt : NULL, n, meta, (int)below(in, 2)));
        break;
    }
    case 3: { /* safetensors load: its tensors join the pool */
        if (s->st) {
            qkv_safetensors_free(ctx, s->st);
            s->st = NULL;
            for (int i = 0; i < r->n; i++)
                if (r->h[i].kind == K_LOADED && r->h[i].parent == s->st_id) r->h[i].freed = true;
        }
        const char *path = path_of(r, pbuf, sizeof pbuf, "s.safetensors", false);
        qkv_safetensors *st = qkv_safetensors_load(ctx, path);
        checked(r, &b, "qkv_safetensors_load", st != NULL, true);
        if (!st) break;
        s->st = st;
        s->st_id = ++r->st_ids;
        for (int i = 0; i < qkv_safetensors_count(st) && i < 3; i++) {
            const qkv_tensor *t = qkv_safetensors_get(st, qkv_safetensors_name(st, i));
            int slot = add(r, (qkv_tensor *)t, c, K_LOADED, s->st_id, INFINITY);
            if (slot >= 0) r->h[slot].parent = s->st_id;
        }
        break;
    }
    default: { /* free a checkpoint: this context's, or (FOREIGN) on the wrong context, or copy from it */
        if (!s->st) break;
        if (byte(in) & 1) {
            int slot;
            qkv_tensor *dst = pick(r, c, &b, &slot);
            if (slot >= 0 && r->h[slot].kind == K_LOADED) break; /* const */
            if (!QKV_MISUSE_XENT && slot >= 0 && r->h[slot].dtype == QKV_I32) break; /* see op_access */
            if (slot >= 0) r->h[slot].bound = INFINITY;
            const char *name = qkv_safetensors_count(s->st) > 0 ? qkv_safetensors_name(s->st, 0) : "none";
            status_call(r, &b, "qkv_safetensors_copy_into", qkv_safetensors_copy_into(ctx, s->st, name, dst));
            break;
        }
        int on = QKV_MISUSE_FOREIGN && byte(in) < 32 ? 1 - c : c;
        qkv_safetensors_free(r->s[on].ctx, s->st);
        if (on == c) {
            s->st = NULL;
            for (int i = 0; i < r->n; i++)
                if (r->h[i].kind == K_LOADED && r->h[i].parent == s->st_id) r->h[i].freed = true;
        }
        break;
    }
    }
    maybe_clear(r, c);
}

/* ---- element access, modes, errors --------------------------------------------------------------- */

static void op_access(run *r, int c) {
    reader *in = &r->in;
    qkv_ctx *ctx = r->s[c].ctx;
    before b;
    snap(r, c, &b);
    int slot;
    qkv_tensor *t = pick(r, c, &b, &slot);
    int64_t pos = (const int64_t[]){0, 1, 5, -1, INT64_MAX, INT64_MIN}[below(in, 6)];
    int64_t idx[QKV_MAX_DIMS] = {(int64_t)below(in, 3), 0, (int64_t)below(in, 3) - 1, 0};
    if (slot >= 0 && r->h[slot].kind == K_LOADED) return; /* const: the checkpoint's */
    unsigned how = below(in, 8);
    /* writing into an integer tensor (ids, targets) that an operator may read again in its backward: XENT */
    if (!QKV_MISUSE_XENT && (how == 2 || how == 3 || how == 4) && slot >= 0 && r->h[slot].dtype == QKV_I32)
        how = 0;
    switch (how) {
    case 0: {
        double v = qkv_get_flat(ctx, t, pos);
        checked(r, &b, "qkv_get_flat", qkv_error(ctx) == QKV_OK, true);
        (void)v;
        break;
    }
    case 1: {
        double v = qkv_get(ctx, t, idx);
        checked(r, &b, "qkv_get", qkv_error(ctx) == QKV_OK, true);
        (void)v;
        break;
    }
    case 2: {
        double bound = 0, v = value_of(in, &bound);
        status_call(r, &b, "qkv_set_flat", qkv_set_flat(ctx, t, pos, v));
        if (slot >= 0 && qkv_error(ctx) == QKV_OK) r->h[slot].bound = fmax(r->h[slot].bound, bound);
        break;
    }
    case 3: {
        double bound = 0, v = value_of(in, &bound);
        status_call(r, &b, "qkv_fill", qkv_fill(ctx, t, v));
        if (slot >= 0 && qkv_error(ctx) == QKV_OK) r->h[slot].bound = bound;
        break;
    }
    case 4: {
        int s2;
        qkv_tensor *src = pick(r, c, &b, &s2);
        status_call(r, &b, "qkv_copy_into", qkv_copy_into(ctx, t, src));
        if (slot >= 0 && qkv_error(ctx) == QKV_OK)
            r->h[slot].bound = s2 >= 0 && is_float_dtype(r->h[s2].dtype) ? bound_of(r, s2) : INFINITY;
        break;
    }
    case 5: status_call(r, &b, "qkv_set_requires_grad", qkv_set_requires_grad(ctx, t, byte(in) & 1)); break;
    case 6: status_call(r, &b, "qkv_zero_grad", qkv_zero_grad(ctx, t)); break;
    default: {
        char buf[8];
        size_t n = byte(in) % 9;
        if (slot >= 0 && readable(r, &r->h[slot])) {
            qkv_shape_str(t, buf, n);
            FUZZ_CHECK(n == 0 || memchr(buf, '\0', n), "qkv_shape_str left its buffer unterminated");
        }
        break;
    }
    }
    maybe_clear(r, c);
}

static void op_modes(run *r, int c) {
    reader *in = &r->in;
    qkv_ctx *ctx = r->s[c].ctx;
    before b;
    snap(r, c, &b);
    switch (below(in, 6)) {
    case 0: qkv_clear_error(ctx); break;
    case 1: qkv_set_grad_enabled(ctx, byte(in) & 1); checked(r, &b, "qkv_set_grad_enabled", false, false); break;
    case 2: qkv_set_anomaly_mode(ctx, byte(in) & 1); checked(r, &b, "qkv_set_anomaly_mode", false, false); break;
    case 3: qkv_seed(ctx, byte(in)); checked(r, &b, "qkv_seed", false, false); break;
    case 4: qkv_zero_grads(ctx); checked(r, &b, "qkv_zero_grads", false, false); break;
    default: {
        int count = -1;
        qkv_tensor *const *p = qkv_params(ctx, &count);
        FUZZ_CHECK(count >= 0 && (count == 0 || p), "qkv_params gave %d parameters", count);
        break;
    }
    }
}

/* ---- the two contexts ---------------------------------------------------------------------------- */

static int threads_of(reader *in) {
    unsigned v = byte(in);
    if (v < 192) return 1 + (int)(v % 3);
    static const int wild[] = {0, -5, 64, INT_MIN, 1 << 20, INT_MAX};
    int t = wild[v % 6];
    if (!QKV_MISUSE_THREADS && t > 64) t = 4;
    return t;
}

static bool open_side(run *r, int c, int threads, size_t chunk) {
    side *s = &r->s[c];
    memset(&s->alloc, 0, sizeof s->alloc);
    s->alloc.limit = (size_t)1 << 24; /* 16 MiB a block: huge shapes meet QKV_ERR_NOMEM at once */
    s->alloc.fill = (unsigned char)(0xA5 * c);
    s->threads = threads;
    s->step = 1;
    s->ctx = fuzz_ctx(&s->alloc, threads, chunk);
    FUZZ_CHECK(s->ctx != NULL, "qkv_ctx_new failed");
    if (!s->ctx) return false;
    if (threads >= 1) FUZZ_CHECK(qkv_threads(s->ctx) >= 1, "qkv_threads gave %d", qkv_threads(s->ctx));
    else FUZZ_CHECK(qkv_threads(s->ctx) == 1, "threads %d: qkv_threads gave %d, not 1", threads, qkv_threads(s->ctx));
    return true;
}

static void close_side(run *r, int c) {
    side *s = &r->s[c];
    if (!s->ctx) return;
    if (byte(&r->in) & 1) qkv_optim_free(s->opt); /* or leave it to qkv_ctx_free */
    if (s->st && (byte(&r->in) & 1)) qkv_safetensors_free(s->ctx, s->st);
    qkv_ctx_free(s->ctx);
    FUZZ_CHECK(s->alloc.live == 0, "context %c: %ld allocations leaked", "AB"[c], s->alloc.live);
    s->ctx = NULL;
    s->opt = NULL;
    s->st = NULL;
    s->n_opt = 0;
    /* its handles are gone: a tensor of a freed context is no handle at all */
    for (int i = 0; i < r->n; i++)
        if (r->h[i].owner == c) r->h[i].t = NULL;
}

/* Reopen B with another thread count (the way a program changes its threads). */
static void op_reopen(run *r) {
    int threads = threads_of(&r->in);
    side *a = &r->s[0];
    for (int j = 0; j < a->n_opt && a->opt; j++) /* an optimizer of A that (wrongly) took B's tensors goes first */
        if (a->opt_params[j] >= 0 && r->h[a->opt_params[j]].owner == 1) {
            qkv_optim_free(a->opt);
            a->opt = NULL;
            a->n_opt = 0;
        }
    close_side(r, 1);
    open_side(r, 1, threads, byte(&r->in) & 1 ? 512 : 1 << 16);
}

static void make_dir(run *r) {
    snprintf(r->dir, sizeof r->dir, "/tmp/qkv-misuse-XXXXXX");
    if (!mkdtemp(r->dir)) {
        r->dir[0] = '\0';
        return;
    }
    char fifo[96];
    snprintf(fifo, sizeof fifo, "%s/fifo", r->dir);
    if (QKV_MISUSE_FILES) mkfifo(fifo, 0600);
}

/* Remove the temporary directory and what is in it (the files written, temporary files a failed atomic
 * write left; a leftover is no error here, the file tests check those). */
static void remove_dir(run *r) {
    if (!r->dir[0]) return;
    DIR *d = opendir(r->dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[384];
        snprintf(p, sizeof p, "%s/%s", r->dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(r->dir);
}

FUZZ_TARGET(misuse) {
    run r;
    memset(&r, 0, sizeof r);
    r.in = (reader){data, size, 0};
    unsigned head = byte(&r.in);
    int ta = threads_of(&r.in), tb = threads_of(&r.in);
    if (!open_side(&r, 0, ta, head & 1 ? 512 : 1 << 16)) return 0;
    if (!open_side(&r, 1, tb, head & 2 ? 512 : 1 << 16)) {
        close_side(&r, 0);
        return 0;
    }
    make_dir(&r);
    for (int call = 0; call < MAX_CALLS && more(&r.in); call++) {
        unsigned op = byte(&r.in);
        int c = (op >> 7) & 1;
        switch (op % 16) {
        case 0:
        case 1:
        case 2: op_make(&r, c); break;
        case 3: op_persist(&r, c); break;
        case 4: end_step(&r, c); break;
        case 5:
        case 6: op_unary(&r, c); break;
        case 7: op_binary(&r, c); break;
        case 8: op_attention(&r, c); break;
        case 9: op_cross_entropy(&r, c); break;
        case 10: op_backward(&r, c); op_grad(&r, c); break;
        case 11: op_optim(&r, c); break;
        case 12: op_gradcheck(&r, c); break;
        case 13: op_files(&r, c); break;
        case 14: op_access(&r, c); break;
        default: (op >> 6) == 3 ? op_reopen(&r) : op_modes(&r, c); break;
        }
    }
    /* both contexts work after clearing and ending the step */
    for (int c = 0; c < 2; c++) {
        fuzz_check_usable_after_clear(r.s[c].ctx);
        qkv_set_grad_enabled(r.s[c].ctx, true);
        qkv_step_end(r.s[c].ctx);
    }
    close_side(&r, 0);
    close_side(&r, 1);
    remove_dir(&r);
    return 0;
}
