/*
 * qkv_internal.h — what the library's own files share and users never see: the context, the step arena,
 * tape nodes, error helpers, and the f64 working buffers the reference kernels compute in.
 */
#ifndef QKV_INTERNAL_H
#define QKV_INTERNAL_H

#include "qkv.h"

#include <stdarg.h>
#include <string.h>

#define QKV_ALIGN 64
#define QKV_HEADER 128 /* bytes a persistent tensor's header takes before its data (a multiple of QKV_ALIGN) */
#define QKV_TENSOR_MAGIC 0x716b7654u /* "qkvT" */
#define QKV_ERRMSG_SIZE 512

/* Put on a hot elementwise loop (optimizer updates, norms, conversions): GCC and clang compile it three
 * times, for AVX-512F, AVX2 and baseline x86-64, and the loader picks the one the CPU runs (an ifunc), so
 * the loop is vectorised for the machine without building the whole library with -march. The clones may
 * differ in the last bits (FMA contraction); one machine always runs the same clone. Elsewhere: one copy.
 * Not under ThreadSanitizer, whose instrumented ifunc resolvers run before its runtime is up and crash. */
#if defined(__SANITIZE_THREAD__)
#define QKV_NO_TARGET_CLONES 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define QKV_NO_TARGET_CLONES 1
#endif
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(QKV_NO_TARGET_CLONES)
#define QKV_VECTOR_LOOP __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define QKV_VECTOR_LOOP
#endif

/* ---- step arena: a list of chunks and a bump pointer --------------------------------------------- */

typedef struct qkv_chunk_ {
    struct qkv_chunk_ *next;
    size_t capacity; /* bytes usable after the header, from data */
    unsigned char *data;
} qkv_chunk_;

/* A block given back to the arena in the middle of a step (qkv_options.release_grads): the first bytes of
 * the block itself hold the list link and its size. */
typedef struct qkv_free_block_ {
    struct qkv_free_block_ *next;
    size_t size; /* bytes, a multiple of QKV_ALIGN */
} qkv_free_block_;

#define QKV_ARENA_LOG 32 /* allocations one node's backward may make that can be given back after it */

typedef struct qkv_arena_ {
    qkv_chunk_ *head;    /* first chunk                                    */
    qkv_chunk_ *current; /* chunk being filled                             */
    size_t offset;       /* bytes used in current                          */
    size_t used_before;  /* bytes used in the chunks before current        */
    size_t high_water;   /* most bytes in use at once since the last rewind */
    /* Reuse inside one qkv_backward with release_grads (tape.c turns it on and off): an allocation takes
     * the newest released block of its exact size before bumping, and each allocation is logged (up to
     * QKV_ARENA_LOG; later ones are simply never given back) so the walk can give back the scratch of a
     * node's backward. Outside a backward the list is empty and nothing is logged. */
    bool reuse;
    qkv_free_block_ *free;             /* released blocks, newest first                     */
    size_t free_bytes;                 /* bytes on that list                                */
    int n_log;                         /* allocations logged since the last qkv_arena_log_ */
    void *log[QKV_ARENA_LOG];
    size_t log_size[QKV_ARENA_LOG];
} qkv_arena_;

/* ---- tape ---------------------------------------------------------------------------------------- */

typedef struct qkv_node_ qkv_node_;
typedef void (*qkv_backward_fn_)(qkv_ctx *ctx, qkv_node_ *node);

#define QKV_NODE_MAX_INPUTS 8

struct qkv_node_ {
    qkv_node_ *prev;            /* the node recorded before this one                      */
    const char *op;             /* operator name, for anomaly reports                     */
    qkv_backward_fn_ backward;
    qkv_tensor *out;
    qkv_tensor *in[QKV_NODE_MAX_INPUTS];
    int n_in;
    void *saved;                /* operator-specific saved state (arena)                  */
    double scalar;              /* a saved scalar (the scale, the token count, ...)       */
    int flags;
    const qkv_tensor *aux;      /* a saved non-differentiable input (mask, targets)       */
    qkv_tensor **more_out;      /* further outputs of a user-defined operator (custom.c)  */
    int n_more_out;
};

/* ---- step-tensor headers: rings of header slots, apart from the data ----------------------------
 *
 * A step tensor's header (the qkv_tensor a user holds) lives in a ring of slots owned by the context; its
 * data lives in the step arena. Slots are taken in order around the ring and a slot is reused only when the
 * tensor in it was made more than QKV_STALE_STEPS steps ago (or, once the ring has grown to
 * QKV_STALE_RING_BYTES, made in an earlier step), so a header outlives its step by that many steps. A ring
 * that must grow mid-step is retired, not freed: it is kept until its newest tensor is QKV_STALE_STEPS steps
 * old. A tensor pointer is validated by its address first (inside a ring of this context, at a slot
 * boundary, or in the set of live persistent tensors); only then is the header read. */
typedef struct qkv_ring_ {
    struct qkv_ring_ *next; /* the retired rings, newest first                          */
    qkv_tensor *slots;
    size_t capacity;        /* slots                                                    */
    size_t end_pos;         /* retired: the slot it would have given next                */
    size_t taken;           /* slots taken in step last_epoch                           */
    uint32_t last_epoch;    /* the last step that took a slot in this ring (0: none)     */
} qkv_ring_;

#define QKV_STALE_STEPS 16u
#define QKV_STALE_RING_BYTES ((size_t)8 << 20)
#define QKV_RING_MIN_SLOTS 64u /* the first ring: 5.5 KiB (a small context stays small) */

/* Where the arena and tape stood at one moment; rewinding to it releases everything made after. */
typedef struct qkv_mark_ {
    qkv_chunk_ *chunk;
    size_t offset, used_before;
    qkv_node_ *tape;
    bool tape_consumed;
} qkv_mark_;

/* The live persistent tensors (parameters, kept tensors, their gradients): an open-addressing hash set of
 * header addresses (linear probing, backward-shift deletion). A key is the address, with bit 0 set for the
 * gradient of a persistent tensor (owned by it: qkv_free refuses it). 0 is an empty slot. */
typedef struct qkv_live_set_ {
    uintptr_t *keys;
    size_t capacity; /* a power of two, or 0 */
    size_t count;
} qkv_live_set_;
#define QKV_LIVE_GRAD ((uintptr_t)1)

/* Parameters freed by qkv_free, kept (memory and all) for the QKV_FREED_KEPT latest qkv_free calls of the
 * context that freed a parameter: until an entry leaves this FIFO its address is not handed to anything else,
 * so a pointer to it (or to its gradient) is recognised as freed, by its address. The oldest entry's blocks
 * are returned to the allocator when a newer free needs its place; qkv_ctx_free returns the rest (they stay
 * on the block list). Only parameters: the other persistent tensors (qkv_keep's, an optimizer's state, a
 * loaded checkpoint's) are released by qkv_optim_free and qkv_safetensors_free, whose callers expect the
 * memory back at once. */
#define QKV_FREED_KEPT 64u
typedef struct qkv_freed_ {
    const qkv_tensor *tensor[QKV_FREED_KEPT];
    const qkv_tensor *grad[QKV_FREED_KEPT]; /* its gradient, freed with it (NULL: none)             */
    unsigned next;                          /* the slot the next free takes (the oldest when full)  */
    unsigned count;                         /* slots in use                                         */
} qkv_freed_;

/* ---- persistent allocations: a doubly linked list, so qkv_free is O(1) and ctx_free frees all ----- */

typedef struct qkv_block_ {
    struct qkv_block_ *prev, *next;
    void *raw; /* what the allocator returned */
} qkv_block_;

struct qkv_ctx {
    qkv_allocator alloc;
    uint64_t rng[4];
    int threads;
    size_t arena_chunk;

    qkv_status status;
    char errmsg[QKV_ERRMSG_SIZE];

    qkv_arena_ arena;
    uint32_t epoch; /* step number, starting at 1; step tensors record it */

    qkv_ring_ *ring;     /* the ring step-tensor headers are taken from (NULL before the first) */
    size_t ring_pos;     /* the next slot to take                                               */
    size_t step_slots;   /* headers taken in this step                                          */
    qkv_ring_ *retired;  /* rings kept for stale detection only                                 */
    qkv_live_set_ live;  /* live persistent tensors                                             */
    qkv_freed_ freed;    /* the latest persistent tensors qkv_free freed, still held             */

    qkv_node_ *tape;    /* last node recorded */
    bool tape_consumed; /* a backward has walked this tape */
    /* a kept (persistent) dloss that this step's backward took as lent_to's gradient (autograd/tape.c's
     * borrows_dloss): qkv_free of it first takes it back (lent_to->grad = NULL); both NULL otherwise */
    const qkv_tensor *lent_dloss;
    qkv_tensor *lent_to;
    bool grad_enabled;
    bool anomaly;
    bool release_grads; /* qkv_options.release_grads */
    int in_custom;      /* callbacks of user-defined operators running now (autograd/custom.c) */

    qkv_block_ *blocks; /* persistent allocations */
    qkv_tensor **params;
    int n_params, cap_params;
};

/* ---- errors -------------------------------------------------------------------------------------- */

/* Store the first error (later ones are ignored) and return NULL, for `return qkv_fail_(...)`. */
void *qkv_fail_(qkv_ctx *ctx, qkv_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
qkv_status qkv_failc_(qkv_ctx *ctx, qkv_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* For a public function fn made of other public calls (qkv_attention with attn, qkv_self_attention), called
 * after them on a context that had no error when fn began: an error they stored names them, so the message
 * gets fn, the function the user called, in front ("qkv_attention: qkv_softmax: out of memory ..."). */
static inline void qkv_name_caller_(qkv_ctx *ctx, const char *fn) {
    size_t len = strlen(fn);
    if (ctx->status == QKV_OK || (!strncmp(ctx->errmsg, fn, len) && ctx->errmsg[len] == ':')) return;
    size_t keep = sizeof ctx->errmsg - len - 3; /* room for "fn: " and the terminator */
    size_t old = strlen(ctx->errmsg);
    if (old > keep) old = keep;
    memmove(ctx->errmsg + len + 2, ctx->errmsg, old);
    ctx->errmsg[len + 2 + old] = '\0';
    memcpy(ctx->errmsg, fn, len);
    ctx->errmsg[len] = ':';
    ctx->errmsg[len + 1] = ' ';
}

/* Check a tensor argument: not NULL, a live tensor of this context (by its address, before any read),
 * not stale. name is the argument's name. */
bool qkv_check_tensor_(qkv_ctx *ctx, const char *fn, const char *name, const qkv_tensor *t);

/* What a pointer is to a context, decided from its address alone (nothing at t is read unless the address
 * is a slot of one of the context's rings, or in its live set). */
typedef enum {
    QKV_HANDLE_STEP_,       /* a step tensor of the current step                                       */
    QKV_HANDLE_PERSISTENT_, /* a live persistent tensor (qkv_param, qkv_keep)                           */
    QKV_HANDLE_GRAD_,       /* the gradient of a live persistent tensor                                 */
    QKV_HANDLE_STALE_,      /* a step tensor of an earlier step (*made_in receives that step)           */
    QKV_HANDLE_FREED_,      /* a parameter (or its gradient) among the last QKV_FREED_KEPT freed          */
    QKV_HANDLE_UNKNOWN_,    /* none of these: another context's, freed, released, or too old to tell    */
} qkv_handle_kind_;
qkv_handle_kind_ qkv_classify_(const qkv_ctx *ctx, const qkv_tensor *t, uint32_t *made_in);
/* t (not NULL) is a live tensor of ctx (STEP, PERSISTENT or GRAD), with no error stored either way. */
bool qkv_tensor_is_live_(const qkv_ctx *ctx, const qkv_tensor *t);
/* Store the error for a tensor argument of that kind (not STEP/PERSISTENT/GRAD); returns false. */
bool qkv_handle_fail_(qkv_ctx *ctx, const char *fn, const char *name, qkv_handle_kind_ kind,
                      uint32_t made_in);
/* ... and of a float dtype (f32 or f64). */
bool qkv_check_float_(qkv_ctx *ctx, const char *fn, const char *name, const qkv_tensor *t);
/* a and b of the same dtype */
bool qkv_check_same_dtype_(qkv_ctx *ctx, const char *fn, const qkv_tensor *a, const char *an,
                           const qkv_tensor *b, const char *bn);
/* A shape as "[2,3,4]" into a small ring of static-lifetime-per-call buffers: use at most 4 per message. */
typedef struct qkv_shapebuf_ {
    char s[64];
} qkv_shapebuf_;
qkv_shapebuf_ qkv_shape_(const qkv_tensor *t);
#define QKV_SHAPE(t) (qkv_shape_(t).s)

/* ---- memory -------------------------------------------------------------------------------------- */

/* Overflow-checked a * b and a + b; false on overflow. */
bool qkv_mul_size_(size_t a, size_t b, size_t *out);
bool qkv_add_size_(size_t a, size_t b, size_t *out);

/* size bytes from the step arena, 64-byte aligned, uninitialised. NULL (error stored) on failure. */
void *qkv_arena_alloc_(qkv_ctx *ctx, const char *fn, size_t size);
/* count elements of elem_size, overflow-checked. */
void *qkv_arena_array_(qkv_ctx *ctx, const char *fn, size_t count, size_t elem_size);
/* Reuse mode (see qkv_arena_): on, it clears the log; off, it also forgets the released blocks (they stay
 * in the arena until qkv_step_end, unused). */
void qkv_arena_reuse_(qkv_ctx *ctx, bool on);
/* Give back a block that qkv_arena_alloc_(ctx, fn, size) returned in reuse mode (a no-op outside it); a
 * later allocation of the same size in the same backward gets it. The caller guarantees nothing reads or
 * writes it any more. */
void qkv_arena_release_(qkv_ctx *ctx, void *p, size_t size);
/* The same from the persistent heap (through the hooks); free with qkv_persistent_free_. */
void *qkv_persistent_alloc_(qkv_ctx *ctx, const char *fn, size_t size);
void qkv_persistent_free_(qkv_ctx *ctx, void *ptr);
/* size bytes through the hooks, QKV_ALIGN-aligned whatever alignment the hook gives (qkv over-allocates
 * and keeps the hook's pointer just before the block); free with qkv_raw_free_. NULL on failure or
 * overflow, with no error stored. */
void *qkv_raw_malloc_(qkv_ctx *ctx, size_t size);
void qkv_raw_free_(qkv_ctx *ctx, void *ptr);

/* A header slot for a step tensor of this step (uninitialised). NULL (error stored) on failure. */
qkv_tensor *qkv_step_header_(qkv_ctx *ctx, const char *fn);
/* The live set: make room for one more (false, error stored, on failure), add, remove (a no-op when absent).
 * qkv_persistent_free_ removes its pointer, so a tensor freed by any path leaves the set. */
bool qkv_live_reserve_(qkv_ctx *ctx, const char *fn);
void qkv_live_add_(qkv_ctx *ctx, const qkv_tensor *t, uintptr_t flags);
void qkv_live_remove_(qkv_ctx *ctx, const void *t);
/* qkv_free of t (a live persistent tensor): it and its gradient leave the live set; with hold (a parameter)
 * they join the freed FIFO, whose oldest entry, when it is full, is returned to the allocator; without, they
 * are returned at once. Allocates nothing. */
void qkv_free_persistent_tensor_(qkv_ctx *ctx, qkv_tensor *t, bool hold);
/* t is about to be freed: if this step's backward took it as the loss's gradient (a kept dloss), the loss
 * lets go of it (loss->grad = NULL). autograd/tape.c. */
void qkv_take_back_dloss_(qkv_ctx *ctx, const qkv_tensor *t);
/* An empty set holds no memory (so a context with no persistent tensor holds only its arena and rings):
 * release it, after a reserve whose tensor could not be made. */
void qkv_live_trim_(qkv_ctx *ctx);

qkv_mark_ qkv_mark_now_(const qkv_ctx *ctx);
void qkv_rewind_to_(qkv_ctx *ctx, qkv_mark_ mark);

/* A new step tensor, uninitialised data. Shape is validated (rank, non-negative, overflow). */
qkv_tensor *qkv_new_tensor_(qkv_ctx *ctx, const char *fn, qkv_dtype dtype, int ndim,
                            const int64_t *shape);
/* qkv_keep of a tensor header the library filled in itself (dtype, ndim, shape, numel, data; e.g. a view
 * of a file's bytes), which no address check would accept: a persistent copy. */
qkv_tensor *qkv_keep_view_(qkv_ctx *ctx, const char *fn, const qkv_tensor *view);
/* Same shape and dtype as like. */
qkv_tensor *qkv_new_like_(qkv_ctx *ctx, const char *fn, const qkv_tensor *like);
bool qkv_is_float_(qkv_dtype dtype);
bool qkv_same_shape_(const qkv_tensor *a, const qkv_tensor *b);
/* Product of dims [from, to) of t's shape. */
int64_t qkv_dims_product_(const qkv_tensor *t, int from, int to);

/* Elementwise binary operands: b has a's shape, is a trailing-dimension bias (b's shape is the last
 * b->ndim dimensions of a's), or has one element. Element i of a pairs with element i % b->numel of b. */
bool qkv_check_broadcast_(qkv_ctx *ctx, const char *fn, const qkv_tensor *a, const qkv_tensor *b);
/* dst[j] = sum over r of src[r * cols + j]: the gradient of a broadcast bias. */
void qkv_sum_rows_f64_(const double *src, int64_t rows, int64_t cols, double *dst);

/* ---- f64 working buffers for reference kernels ---------------------------------------------------- */

/* The values of a float tensor as doubles: the data itself for f64, an arena copy for f32. */
const double *qkv_as_f64_(qkv_ctx *ctx, const char *fn, const qkv_tensor *t);
/* A buffer to compute t's values into: t->data for f64, arena scratch for f32 (then call
 * qkv_store_f64_). */
double *qkv_out_f64_(qkv_ctx *ctx, const char *fn, qkv_tensor *t);
/* Write computed values into t (a no-op when buf is t->data). */
void qkv_store_f64_(qkv_tensor *t, const double *buf);
/* t[i] += buf[i] for every element (t f32 or f64). */
void qkv_accumulate_f64_(qkv_tensor *t, const double *buf);

/* ---- autograd ------------------------------------------------------------------------------------ */

/* True when an operator with these inputs must record a node. */
bool qkv_needs_grad_(const qkv_ctx *ctx, qkv_tensor *const *inputs, int n);
/* Append a node making out from inputs; out->requires_grad becomes true. NULL on allocation failure. */
qkv_node_ *qkv_record_(qkv_ctx *ctx, const char *op, qkv_backward_fn_ backward, qkv_tensor *out,
                       qkv_tensor *const *inputs, int n_in);
/* The gradient tensor of t, made (zeroed) if it has none: in the arena for step tensors, on the
 * persistent heap for persistent ones. NULL on failure (error stored). */
qkv_tensor *qkv_grad_of_(qkv_ctx *ctx, qkv_tensor *t);
/* The same for a backward that will write every element of the gradient: when t is a step tensor with no
 * gradient yet, it is made without zeroing and *fresh is true, and the caller must store (=) every element
 * instead of adding (+=); otherwise *fresh is false and the gradient is qkv_grad_of_'s, to add into. */
qkv_tensor *qkv_grad_to_write_(qkv_ctx *ctx, qkv_tensor *t, bool *fresh);
/* True when a backward should produce a gradient for this input. */
static inline bool qkv_wants_grad_(const qkv_tensor *t) { return t && t->requires_grad; }

/* ---- elementwise binary operators (ops/binary.c) ----------------------------------------------- */

/* y[i] = a[i] (op) b[i % nb] over n elements. */
typedef void (*qkv_binary_kernel_)(const double *a, const double *b, double *y, int64_t n, int64_t nb);
/* The same on f32 operands, computing in float: for +, - and * of two floats the float result is the
 * correctly rounded double result rounded to float, so these give the f64 kernel's bits. */
typedef void (*qkv_binary_kernel_f32_)(const float *a, const float *b, float *y, int64_t n, int64_t nb);
/* Validate a and b (float, same dtype, broadcastable), compute y with kernel (f32 operands: kernel_f32 when
 * not NULL), record backward. */
qkv_tensor *qkv_binary_(qkv_ctx *ctx, const char *fn, qkv_tensor *a, qkv_tensor *b,
                        qkv_binary_kernel_ kernel, qkv_binary_kernel_f32_ kernel_f32, qkv_backward_fn_ backward);
/* The values of dout, a and b of a binary node as doubles; false on allocation failure. */
bool qkv_binary_operands_(qkv_ctx *ctx, const qkv_node_ *node, const double **dy, const double **a,
                          const double **b);
/* Backward of y = a + sign * b: da += dy, db += sign * dy reduced to b's shape. */
void qkv_linear_binary_backward_(qkv_ctx *ctx, qkv_node_ *node, double sign);
/* Add the bias-shaped gradient: b->grad[j] += sign * sum over rows of per_element[r * nb + j]. */
bool qkv_accumulate_bias_grad_(qkv_ctx *ctx, qkv_tensor *b, const double *per_element, int64_t n,
                               double sign);

/* ---- elementwise unary operators (ops/unary.c; one file per operator gives its f and df) ---------- */

/* The scalars of a parametrised operator (pow's p, clamp's lo and hi, add_scalar's c); unused ones are 0. */
typedef struct qkv_unary_params_ {
    double a, b;
} qkv_unary_params_;
/* y = f(x; p), computed in double (an f32 x is widened, y rounded back to float) */
typedef double (*qkv_unary_f_)(double x, const qkv_unary_params_ *p);
/* dy/dx at x, with y = f(x; p) as stored (the backward multiplies it by dy: dx += dy * df) */
typedef double (*qkv_unary_df_)(double x, double y, const qkv_unary_params_ *p);
/* The f32 path of a unary operator, on float arrays with no f64 buffers:
 *   forward_map   a qkv_vf_ of ops/kernels/unary_kernels.h computing y (SLEEF in the SIMD sets; pow at p.a), or
 *                 -1: forward computes y
 *   backward_map  a qkv_vf_ evaluated at x into s before backward (pow: at exponent p.a - 1), or -1: s is NULL
 *   backward      dx += dy * dy/dx from x, y and s, computed in double per element
 * QKV_UNARY_F32_LOOPS_ defines forward and backward from an operator's f and df, inlined (vectorised when f and
 * df are plain arithmetic); QKV_UNARY_F32_BACKWARD_ the backward alone. */
typedef struct qkv_unary_f32_ {
    int forward_map;
    void (*forward)(const float *x, float *y, int64_t n, const qkv_unary_params_ *p);
    int backward_map;
    /* dx (+)= dy * df: stored when store (dx is a fresh gradient, qkv_grad_to_write_: not zeroed, and 0 + v is
     * what adding into zeros gave), else added to */
    void (*backward)(const float *x, const float *y, const float *s, const float *dy, float *dx, int64_t n,
                     const qkv_unary_params_ *p, bool store);
} qkv_unary_f32_;
#define QKV_UNARY_F32_BACKWARD_(name, df)                                                                            \
    QKV_VECTOR_LOOP static void name##_backward_f32(const float *restrict x, const float *restrict y,                 \
                                                    const float *restrict s, const float *restrict dy,               \
                                                    float *restrict dx, int64_t n, const qkv_unary_params_ *p,       \
                                                    bool store) {                                                    \
        (void)s;                                                                                                      \
        for (int64_t i = 0; i < n; i++)                                                                               \
            dx[i] = (float)((store ? 0.0 : (double)dx[i]) + (double)dy[i] * df((double)x[i], (double)y[i], p));     \
    }
/* The f32 loops of an operator whose every step is one IEEE operation on floats (or exact): computed in float
 * when float_ok(p), with the bits of the double loops above, since one addition, subtraction, multiplication,
 * division or square root of floats carried out in double and rounded once to float is the float operation's
 * own result (double's 53 bits are at least 2 * 24 + 2: Figueroa, 1995); in double otherwise. ff(x, p) is y in
 * float; fdy(x, dy, p) is dy * dy/dx in float, exact (dy times +-1, 0 or a power of two). Twice the lanes of the
 * double loops: the memory-bound operators (neg, abs, add and mul by a scalar) ran below PyTorch's speed. */
static inline bool qkv_unary_float_always_(const qkv_unary_params_ *p) {
    (void)p;
    return true;
}
static inline bool qkv_unary_scalar_is_float_(const qkv_unary_params_ *p) { return (double)(float)p->a == p->a; }
#define QKV_UNARY_F32_FLOAT_FORWARD_(name, f, ff, float_ok)                                                          \
    QKV_VECTOR_LOOP static void name##_forward_f32(const float *restrict x, float *restrict y, int64_t n,             \
                                                   const qkv_unary_params_ *p) {                                     \
        if (float_ok(p))                                                                                              \
            for (int64_t i = 0; i < n; i++) y[i] = ff(x[i], p);                                                       \
        else                                                                                                          \
            for (int64_t i = 0; i < n; i++) y[i] = (float)f((double)x[i], p);                                       \
    }
#define QKV_UNARY_F32_FLOAT_BACKWARD_(name, fdy)                                                                     \
    QKV_VECTOR_LOOP static void name##_backward_f32(const float *restrict x, const float *restrict y,                 \
                                                    const float *restrict s, const float *restrict dy,               \
                                                    float *restrict dx, int64_t n, const qkv_unary_params_ *p,       \
                                                    bool store) {                                                    \
        (void)y, (void)s;                                                                                             \
        if (store)                                                                                                    \
            for (int64_t i = 0; i < n; i++) dx[i] = 0.0f + fdy(x[i], dy[i], p);                                      \
        else                                                                                                          \
            for (int64_t i = 0; i < n; i++) dx[i] += fdy(x[i], dy[i], p);                                            \
    }
#define QKV_UNARY_F32_LOOPS_(name, f, df)                                                                            \
    QKV_VECTOR_LOOP static void name##_forward_f32(const float *restrict x, float *restrict y, int64_t n,             \
                                                   const qkv_unary_params_ *p) {                                     \
        for (int64_t i = 0; i < n; i++) y[i] = (float)f((double)x[i], p);                                           \
    }                                                                                                                 \
    QKV_UNARY_F32_BACKWARD_(name, df)
/* Check x (float), compute y = f(x) elementwise, record the node whose backward is dx += dy * df(x, y); f32
 * tensors take the f32 path (not NULL). */
qkv_tensor *qkv_unary_(qkv_ctx *ctx, const char *fn, qkv_tensor *x, qkv_unary_f_ f, qkv_unary_df_ df,
                       qkv_unary_params_ p, const qkv_unary_f32_ *f32);

/* ---- NumPy broadcasting of up to three operands (ops/broadcast.c) ------------------------------- */

/* The broadcast shape of n operands (trailing dimensions aligned; a dimension of 1, or a missing one,
 * stretches) and each operand's element stride along each output dimension (0 where it is broadcast). */
typedef struct qkv_bcast_ {
    int ndim, n;
    int64_t shape[QKV_MAX_DIMS];
    int64_t stride[3][QKV_MAX_DIMS];
    int64_t numel;
} qkv_bcast_;
/* Plan it; QKV_ERR_SHAPE naming fn, the operands and the dimension that does not fit. */
bool qkv_bcast_plan_(qkv_ctx *ctx, const char *fn, const qkv_tensor *const *ops, const char *const *names, int n,
                     qkv_bcast_ *plan);
/* off[k] = the flat element of operand k that output element i reads, for i = 0 .. numel - 1, in order:
 * visit(i, off, user) for each. */
void qkv_bcast_each_(const qkv_bcast_ *plan, void (*visit)(int64_t i, const int64_t *off, void *user), void *user);

/* The same walk by runs: visit_row(i0, off, len, user) for each run of len output elements from i0, off[k] the
 * element of operand k at the run's start; along a run operand k moves by row_stride[k] (0 or 1), written by the
 * walk into the array given. Runs of the last dimension, or a single run of numel when every operand is
 * either whole or one element. Output order, as qkv_bcast_each_. */
void qkv_bcast_rows_(const qkv_bcast_ *plan, int64_t *row_stride,
                     void (*visit_row)(int64_t i0, const int64_t *off, int64_t len, void *user), void *user);

/* z = f(a, b) with NumPy broadcasting; the backward adds dz * dz/da into da and dz * dz/db into db, each summed
 * over the dimensions it was broadcast along (in output order: the same bits for any thread count). */
typedef double (*qkv_binary_f_)(double a, double b);
typedef void (*qkv_binary_df_)(double a, double b, double z, double *dz_da, double *dz_db);
/* The f32 path of a binary operator over runs (qkv_bcast_rows_), on the float arrays: forward z[j] = f(a[j sa],
 * b[j sb]) in double, rounded once; backward da[j sa] += dz[j] dz/da, db[j sb] += dz[j] dz/db into double
 * buffers (either may be NULL), in order. QKV_BINARY_F32_ defines both from an operator's f and df, inlined. */
typedef struct qkv_binary_f32_ {
    void (*forward)(const float *a, int64_t sa, const float *b, int64_t sb, float *z, int64_t n);
    void (*backward)(const float *a, int64_t sa, const float *b, int64_t sb, const float *z, const float *dz,
                     double *da, double *db, int64_t n);
    /* a, b and z of one shape, a and b distinct tensors: straight into the float gradients (either may be
     * NULL), each stored (fresh, qkv_grad_to_write_) or added to: the bits of the double buffers above */
    void (*backward_same)(const float *a, const float *b, const float *z, const float *dz, float *da, float *db,
                          bool store_a, bool store_b, int64_t n);
    /* One run where a has z's shape (a row stride of 1) and b is broadcast (sb 0 or 1), a and b distinct: a's
     * gradient straight into the float ga (NULL: none; stored or added to: the bits of the double buffer, which
     * got one addition per element, 0 + dz dz/da), b's added into the double buffer db in output order as
     * backward adds it (NULL: none; with sb 0 the sum runs in a register, the same additions in the same order) */
    void (*backward_full_a)(const float *a, const float *b, int64_t sb, const float *z, const float *dz, float *ga,
                            bool store_a, double *db, int64_t n);
} qkv_binary_f32_;
#define QKV_BINARY_F32_(name, f, df)                                                                                 \
    QKV_VECTOR_LOOP static void name##_forward_f32(const float *restrict a, int64_t sa, const float *restrict b,    \
                                                   int64_t sb, float *restrict z, int64_t n) {                       \
        if (sa && sb)                                                                                                 \
            for (int64_t j = 0; j < n; j++) z[j] = (float)f((double)a[j], (double)b[j]);                            \
        else if (sa)                                                                                                  \
            for (int64_t j = 0; j < n; j++) z[j] = (float)f((double)a[j], (double)b[0]);                            \
        else if (sb)                                                                                                  \
            for (int64_t j = 0; j < n; j++) z[j] = (float)f((double)a[0], (double)b[j]);                            \
        else                                                                                                          \
            for (int64_t j = 0; j < n; j++) z[j] = (float)f((double)a[0], (double)b[0]);                            \
    }                                                                                                                 \
    QKV_VECTOR_LOOP static void name##_backward_f32(const float *restrict a, int64_t sa, const float *restrict b,   \
                                                    int64_t sb, const float *restrict z, const float *restrict dz,   \
                                                    double *restrict da, double *restrict db, int64_t n) {           \
        double pa, pb;                                                                                                \
        if (sa && sb && da && db)                                                                                     \
            for (int64_t j = 0; j < n; j++) {                                                                         \
                df((double)a[j], (double)b[j], (double)z[j], &pa, &pb);                                               \
                da[j] += (double)dz[j] * pa;                                                                          \
                db[j] += (double)dz[j] * pb;                                                                          \
            }                                                                                                         \
        else                                                                                                          \
            for (int64_t j = 0; j < n; j++) {                                                                         \
                df((double)a[j * sa], (double)b[j * sb], (double)z[j], &pa, &pb);                                     \
                if (da) da[j * sa] += (double)dz[j] * pa;                                                             \
                if (db) db[j * sb] += (double)dz[j] * pb;                                                             \
            }                                                                                                         \
    }                                                                                                                 \
    QKV_VECTOR_LOOP static void name##_backward_same_f32(const float *restrict a, const float *restrict b,          \
                                                         const float *restrict z, const float *restrict dz,          \
                                                         float *restrict da, float *restrict db, bool store_a,       \
                                                         bool store_b, int64_t n) {                                  \
        double pa, pb;                                                                                                \
        for (int64_t j = 0; j < n; j++) {                                                                             \
            df((double)a[j], (double)b[j], (double)z[j], &pa, &pb);                                                   \
            if (da) da[j] = (float)((store_a ? 0.0 : (double)da[j]) + (0.0 + (double)dz[j] * pa));                   \
            if (db) db[j] = (float)((store_b ? 0.0 : (double)db[j]) + (0.0 + (double)dz[j] * pb));                   \
        }                                                                                                             \
    }                                                                                                                 \
    QKV_VECTOR_LOOP static void name##_backward_full_a_f32(const float *restrict a, const float *restrict b,         \
                                                           int64_t sb, const float *restrict z,                      \
                                                           const float *restrict dz, float *restrict ga,             \
                                                           bool store_a, double *restrict db, int64_t n) {           \
        double pa, pb;                                                                                                \
        if (ga)                                                                                                       \
            for (int64_t j = 0; j < n; j++) {                                                                         \
                df((double)a[j], (double)b[j * sb], (double)z[j], &pa, &pb);                                          \
                ga[j] = (float)((store_a ? 0.0 : (double)ga[j]) + (0.0 + (double)dz[j] * pa));                        \
            }                                                                                                         \
        if (db && sb)                                                                                                 \
            for (int64_t j = 0; j < n; j++) {                                                                         \
                df((double)a[j], (double)b[j], (double)z[j], &pa, &pb);                                               \
                db[j] += (double)dz[j] * pb;                                                                          \
            }                                                                                                         \
        else if (db) {                                                                                                \
            double sum = db[0];                                                                                       \
            for (int64_t j = 0; j < n; j++) {                                                                         \
                df((double)a[j], (double)b[0], (double)z[j], &pa, &pb);                                               \
                sum += (double)dz[j] * pb;                                                                            \
            }                                                                                                         \
            db[0] = sum;                                                                                              \
        }                                                                                                             \
    }                                                                                                                 \
    static const qkv_binary_f32_ name##_f32 = {name##_forward_f32, name##_backward_f32, name##_backward_same_f32,   \
                                               name##_backward_full_a_f32};
qkv_tensor *qkv_broadcast_binary_(qkv_ctx *ctx, const char *fn, qkv_tensor *a, qkv_tensor *b, qkv_binary_f_ f,
                                  qkv_binary_df_ df, const qkv_binary_f32_ *f32);

/* ---- reductions along one axis (ops/reduce_dim.c; sum_dim.c, mean_dim.c, max_dim.c, logsumexp_dim.c) -- */

/* x seen as [outer, n, inner] around its axis (n = x->shape[axis]); the result's shape is x's without the axis, or
 * with it as 1 (keepdim). */
typedef struct qkv_axis_ {
    int axis; /* in [0, ndim) */
    int64_t outer, n, inner;
    int ndim;
    int64_t shape[QKV_MAX_DIMS];
} qkv_axis_;
/* Check x (float, ndim >= 1) and axis (in [-ndim, ndim); negative counts from the end, as PyTorch) and plan. */
bool qkv_axis_plan_(qkv_ctx *ctx, const char *fn, const qkv_tensor *x, int axis, bool keepdim, qkv_axis_ *plan);
/* y = sum (mean: mean) of x along axis, under the name fn (ops/sum_dim.c; mean_dim.c uses it). */
qkv_tensor *qkv_sum_dim_scaled_(qkv_ctx *ctx, const char *fn, qkv_tensor *x, int axis, bool keepdim, bool mean);
/* y's node when x needs a gradient, its backward reading a copy of the plan as node->saved; returns y (NULL on
 * failure, or when y is NULL). */
qkv_tensor *qkv_axis_record_(qkv_ctx *ctx, const char *fn, qkv_backward_fn_ backward, qkv_tensor *x, qkv_tensor *y,
                             const qkv_axis_ *plan);
/* lse[o, i] = log sum_j e^x[o, j, i] along the plan's axis, without overflow (ops/logsumexp_dim.c). */
void qkv_logsumexp_lines_(const double *x, const qkv_axis_ *p, double *lse);

/* s = factor * sum(a) as a scalar, and its backward da[i] += factor * ds (ops/sum.c; mean uses it). */
qkv_tensor *qkv_reduce_all_(qkv_ctx *ctx, const char *fn, qkv_tensor *a, double factor);
void qkv_reduce_all_backward_(qkv_ctx *ctx, qkv_node_ *node);

/* ---- optimizers (optim/) ------------------------------------------------------------------------ */

/* One Adam/AdamW update of p from gradient g with moments m, v at the parameter's step t, on up to `threads`
 * threads, each at least QKV_ADAM_GRAIN_ elements (optim/adam.c; see optim/update.h). */
#define QKV_ADAM_GRAIN_ (1 << 16)
void qkv_adam_update_(const qkv_optim_options *o, double t, qkv_tensor *p, const qkv_tensor *g, qkv_tensor *m,
                      qkv_tensor *v, int threads);

/* ---- RNG ----------------------------------------------------------------------------------------- */

uint64_t qkv_rng_next_(qkv_ctx *ctx);    /* xoshiro256** */
double qkv_rng_uniform_(qkv_ctx *ctx);   /* [0, 1), 53 bits */
double qkv_rng_normal_(qkv_ctx *ctx);    /* N(0, 1), Box-Muller */
void qkv_rng_seed_(uint64_t state[4], uint64_t seed);

/* ---- reference GEMM (ops/gemm.c) ------------------------------------------------------------------ */

/* C[m,p] (+)= op(A) op(B), op(A) [m,k], op(B) [k,p]; A stored [m,k] (or [k,m] if trans_a), B stored
 * [k,p] (or [p,k] if trans_b), all row-major and contiguous. accumulate: C += instead of C =.
 * qkv_gemm_f32_ and qkv_gemm_f64_ are the fast ones (packed SIMD kernels of ops/kernels/, chosen from the
 * CPU; reference loops for tiny problems); qkv_gemm_f32_ref_ and qkv_gemm_f64_ref_ are the plain-loop
 * reference kernels. */
void qkv_gemm_f64_(const double *a, const double *b, double *c, int64_t m, int64_t k, int64_t p,
                   bool trans_a, bool trans_b, bool accumulate);
void qkv_gemm_f64_ref_(const double *a, const double *b, double *c, int64_t m, int64_t k, int64_t p,
                       bool trans_a, bool trans_b, bool accumulate);
void qkv_gemm_f32_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                   bool trans_a, bool trans_b, bool accumulate);
void qkv_gemm_f32_ref_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                       bool trans_a, bool trans_b, bool accumulate);
/* qkv_gemm_f32_ on up to `threads` threads (OpenMP), each a range of rows of C, with the same bits as
 * qkv_gemm_f32_ for any thread count: only a product that takes the packed path is split, each thread at
 * least QKV_GEMM_GRAIN_ multiply-adds (about 0.1 ms of one core: a region waits for a thread whose core is
 * busy, see QKV_GRAIN_FLOPS_ in ops/kernels/attention_kernels.h); smaller ones run on the calling thread.
 * (Should a thread's 560 KiB packing block not be allocated, its rows take the reference loops: correct,
 * but not the same bits.) */
#define QKV_GEMM_GRAIN_ (1 << 22)
void qkv_gemm_f32_threads_(int threads, const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                           bool trans_a, bool trans_b, bool accumulate);

/* The instruction sets the fast kernels come in. supported: compiled in and present on this CPU. best: the
 * one qkv_gemm_f32_ uses (decided once). qkv_gemm_f32_isa_ always takes the packed path with that ISA's
 * micro-kernel (tests and benchmarks force each one; an unsupported ISA falls back to the reference). */
typedef enum { QKV_ISA_PORTABLE_, QKV_ISA_AVX2_, QKV_ISA_AVX512_, QKV_ISA_COUNT_ } qkv_isa_;
bool qkv_isa_supported_(qkv_isa_ isa);
qkv_isa_ qkv_isa_best_(void);
const char *qkv_isa_name_(qkv_isa_ isa);
void qkv_gemm_f32_isa_(qkv_isa_ isa, const float *a, const float *b, float *c, int64_t m, int64_t k,
                       int64_t p, bool trans_a, bool trans_b, bool accumulate);
/* The small (unpacked) path with one ISA's tiles, as qkv_gemm_f32_ takes it for op(B) of at most 4096 floats.
 * Returns false, having done nothing, when the ISA is portable or not supported, or op(B) is larger. */
bool qkv_gemm_f32_small_isa_(qkv_isa_ isa, const float *a, const float *b, float *c, int64_t m, int64_t k,
                             int64_t p, bool trans_a, bool trans_b, bool accumulate);
/* The packed f64 GEMM with one ISA's kernel (AVX-512 runs the AVX2 one), as qkv_gemm_f32_isa_. */
void qkv_gemm_f64_isa_(qkv_isa_ isa, const double *a, const double *b, double *c, int64_t m, int64_t k,
                       int64_t p, bool trans_a, bool trans_b, bool accumulate);

/* ---- attention reference (ops/attention.c) ----------------------------------------------------- */

/* out = softmax(scale Q K^T, mask, flags) V composed of qkv_matmul, qkv_scale, qkv_softmax and qkv_matmul,
 * with qkv_attention's checks and messages (under the name fn); A into *attn when attn is not NULL. The
 * reference qkv_attention's fused path is tested against (it follows IEEE 0 * inf = NaN in its matmuls). */
qkv_tensor *qkv_attention_composed_(qkv_ctx *ctx, const char *fn, qkv_tensor *q, qkv_tensor *k, qkv_tensor *v,
                                    const qkv_tensor *mask, double scale, int flags, qkv_tensor **attn);
/* qkv_attention_ex's variants composed of the public operators (include/qkv/attention.h): the same checks and
 * messages under the name fn; the weights into *attn when attn is not NULL. The oracle of the fused variants. */
qkv_tensor *qkv_attention_composed_ex_(qkv_ctx *ctx, const char *fn, qkv_tensor *q, qkv_tensor *k, qkv_tensor *v,
                                       const qkv_attention_options *options, qkv_tensor **attn);

#endif /* QKV_INTERNAL_H */
