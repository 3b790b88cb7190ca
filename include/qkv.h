/*
 * qkv.h — the one public header of qkv: tensors, a reverse-mode autograd tape and the operators of
 * scaled dot-product self-attention, each with a hand-written backward pass.
 *
 * Model, in five lines:
 *   - A qkv_ctx owns all memory, a seeded RNG, the tape and a sticky error.
 *   - Tensors made by operators live in the context's step arena until qkv_step_end(ctx) rewinds it;
 *     qkv_param() / qkv_keep() make tensors that live as long as the context.
 *   - An operator whose inputs require grad appends a node to the tape; qkv_backward() walks it back.
 *   - The first failing call stores an error code and a message; every later call on that context
 *     returns NULL (or the stored code) at once, so a whole graph can be built and checked once.
 *   - Nothing in the library aborts, exits or prints unless asked (qkv_print).
 *
 * Compiles as C17 and as C++ (extern "C").
 */
#ifndef QKV_H
#define QKV_H

#include <math.h> /* HUGE_VAL, for QKV_SCALE_DEFAULT */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#if defined(_WIN32) && defined(QKV_BUILDING_SHARED)
#define QKV_API __declspec(dllexport)
#elif defined(__GNUC__)
#define QKV_API __attribute__((visibility("default")))
#else
#define QKV_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header; meson.build checks QKV_VERSION against the project's version. */
#define QKV_VERSION_MAJOR 0
#define QKV_VERSION_MINOR 1
#define QKV_VERSION_PATCH 0
#define QKV_VERSION "0.1.0" /* "MAJOR.MINOR.PATCH" */

/* The version of the library linked at run time ("0.1.0"), set from meson's project version when it was
 * built: a program compiled against one header and run with another library can compare it with
 * QKV_VERSION. */
QKV_API const char *qkv_version(void);

/* ------------------------------------------------------------------------------------------------ */
/* Status codes and the sticky error                                                                */
/* ------------------------------------------------------------------------------------------------ */

/* What a call returned: QKV_OK, or why it failed. The first failure is stored in the context (below). */
typedef enum qkv_status {
    QKV_OK = 0,       /* success                                                                    */
    QKV_ERR_NULL,     /* a required pointer argument is NULL                                        */
    QKV_ERR_ARG,      /* an argument has a value the function does not accept                       */
    QKV_ERR_DTYPE,    /* a tensor has a dtype the function does not accept                          */
    QKV_ERR_SHAPE,    /* shapes do not fit together                                                 */
    QKV_ERR_RANK,     /* too many (or too few) dimensions                                           */
    QKV_ERR_OVERFLOW, /* a size computation would overflow                                          */
    QKV_ERR_NOMEM,    /* the allocator returned NULL                                                */
    QKV_ERR_STALE,    /* a step tensor used after qkv_step_end rewound its arena                      */
    QKV_ERR_STATE,    /* the call is not valid now (e.g. a second backward over the same tape)       */
    QKV_ERR_IO,       /* the operating system refused a file operation                              */
    QKV_ERR_FORMAT,   /* a file or buffer is not a valid .npy / safetensors                         */
    QKV_ERR_NUMERIC,  /* a NaN or inf where none is allowed (anomaly mode)                          */
    QKV_STATUS_COUNT  /* the number of codes (not a code)                                           */
} qkv_status;

/* A context: owns every tensor it makes, the step arena, the tape, the RNG and the sticky error (opaque). */
typedef struct qkv_ctx qkv_ctx;

/* The stored code (QKV_OK if none), its message ("" if none), and a reset. A NULL ctx reads as
 * QKV_ERR_NULL / "no context". */
QKV_API qkv_status qkv_error(const qkv_ctx *ctx);
QKV_API const char *qkv_errmsg(const qkv_ctx *ctx);
QKV_API void qkv_clear_error(qkv_ctx *ctx);
/* "QKV_ERR_SHAPE" etc. */
QKV_API const char *qkv_status_name(qkv_status status);

/* ------------------------------------------------------------------------------------------------ */
/* Contexts                                                                                         */
/* ------------------------------------------------------------------------------------------------ */

/* Allocator hooks. malloc_fn may return memory of any alignment (1, 2, 4, ... bytes): qkv asks for 72 bytes
 * more than it needs and aligns every block to 64 bytes inside, passing free_fn the pointer malloc_fn gave. */
typedef struct qkv_allocator {
    void *(*malloc_fn)(size_t size, void *user);
    void (*free_fn)(void *ptr, void *user);
    void *user;
} qkv_allocator;

/* How a context is made (qkv_ctx_new); start from qkv_default_options(). */
typedef struct qkv_options {
    qkv_allocator allocator; /* both NULL: the C library's malloc/free                        */
    uint64_t seed;           /* seed of the context RNG                                       */
    int threads;             /* worker threads for kernels; <= 0 means 1, above QKV_MAX_THREADS
                              * means QKV_MAX_THREADS (qkv_threads tells the count in use)     */
    size_t arena_chunk;      /* first step-arena chunk in bytes; 0 means 1 MiB                */
    bool release_grads;      /* false (default): qkv_backward keeps every gradient until qkv_step_end;
                              * true: it releases each intermediate's gradient as soon as its node's
                              * backward has run, for reuse in the same step (see qkv_backward)   */
} qkv_options;

/* The most kernel threads a context uses. A larger qkv_options.threads is capped to it, not refused (as
 * <= 0 means 1): OpenMP's runtime exits the process, or overflows a stack, when asked for tens of
 * thousands of threads, and results are the same bits for any count. */
#define QKV_MAX_THREADS 256

/* Defaults: system allocator, seed 0, 1 thread. */
QKV_API qkv_options qkv_default_options(void);
/* NULL options means the defaults. Returns NULL only if the context itself cannot be allocated. */
QKV_API qkv_ctx *qkv_ctx_new(const qkv_options *options);
/* Free the context and everything it holds (NULL is a no-op). From inside a callback of a user-defined
 * operator (qkv/custom.h) it is refused (QKV_ERR_STATE) and frees nothing. */
QKV_API void qkv_ctx_free(qkv_ctx *ctx);
QKV_API int qkv_threads(const qkv_ctx *ctx);
/* Reseed the context RNG (every later random tensor follows from this seed). */
QKV_API void qkv_seed(qkv_ctx *ctx, uint64_t seed);

/* End a step: rewind the step arena (every tensor made since the last call becomes invalid; using one
 * afterwards is QKV_ERR_STALE, see "Which tensor pointers are refused" below) and clear the tape.
 * Parameters and their gradients are untouched. After the first step the arena keeps one chunk as large as
 * the largest step so far, and the header ring room for 17 such steps, so later steps of the same shape
 * make no heap allocation. qkv_step_end itself never fails, except from inside a callback of a user-defined
 * operator (qkv/custom.h), where it is refused (QKV_ERR_STATE) and does nothing. */
QKV_API void qkv_step_end(qkv_ctx *ctx);
/* Bytes of step arena in use now, and the capacity it holds. */
QKV_API size_t qkv_arena_used(const qkv_ctx *ctx);
QKV_API size_t qkv_arena_capacity(const qkv_ctx *ctx);

/* ------------------------------------------------------------------------------------------------ */
/* Tensors                                                                                          */
/* ------------------------------------------------------------------------------------------------ */

/* Element types: float and double for values (every operator takes both), int32 for ids and targets, uint8
 * for masks. */
typedef enum qkv_dtype {
    QKV_F32 = 0,    /* float                          */
    QKV_F64 = 1,    /* double                         */
    QKV_I32 = 2,    /* int32_t (ids, targets)         */
    QKV_U8 = 3,     /* uint8_t (masks)                */
    QKV_DTYPE_COUNT /* the number of dtypes (not one) */
} qkv_dtype;

#define QKV_MAX_DIMS 4

/* The most elements a tensor holds: 2^60 - 1, so that its bytes fit in int64. A dimension of 0 makes an
 * empty tensor (numel 0); the product of its other, nonzero, dimensions obeys the same bound in any order
 * ([0, 2^62, 5] is QKV_ERR_OVERFLOW like [2^62, 5, 0] and [2^62, 5]), so no product of the dimensions of a
 * valid tensor overflows. Operators accept empty operands wherever their shapes fit, and an empty operand
 * costs nothing: the work is that of the output (X [n, 0] W [0, d] is an empty sum, zeros [n, d]), never
 * a loop over a batch or row count of a tensor with no elements. */
#define QKV_MAX_NUMEL (INT64_MAX / 8)

/* A contiguous, row-major tensor with 64-byte aligned data. The fields above the line are public and
 * read-only (write through data, never change shape or dtype); the rest belong to the library. */
typedef struct qkv_tensor {
    qkv_dtype dtype;
    int ndim;                      /* 0 (a scalar) ... QKV_MAX_DIMS                             */
    int64_t shape[QKV_MAX_DIMS];   /* unused dimensions are 1                                   */
    int64_t numel;                 /* product of the shape, 1 for a scalar                      */
    void *data;                    /* numel elements of dtype                                   */
    struct qkv_tensor *grad;       /* dL/dthis after a backward reached it, else NULL           */
    bool requires_grad;
    /* ---- private ---- */
    uint32_t magic_;               /* set while the header holds a tensor                      */
    uint32_t epoch_;               /* step in which a step tensor was made; 0 for persistent    */
    struct qkv_node_ *node_;       /* the tape node that made this tensor, or NULL for a leaf   */
} qkv_tensor;

/* Bytes per element (4, 8, 4, 1); 0 for a value that is not a dtype. */
QKV_API size_t qkv_dtype_size(qkv_dtype dtype);
QKV_API const char *qkv_dtype_name(qkv_dtype dtype); /* "f32", "f64", "i32", "u8" */

/* Step tensors (live until qkv_step_end). shape has ndim entries; ndim 0 makes a scalar. */
QKV_API qkv_tensor *qkv_zeros(qkv_ctx *ctx, qkv_dtype dtype, int ndim, const int64_t *shape);
/* As qkv_zeros, but the elements are left as the arena holds them (unspecified values, often an earlier
 * step's): for a tensor the caller fills completely before reading it, without paying for a memset. */
QKV_API qkv_tensor *qkv_empty(qkv_ctx *ctx, qkv_dtype dtype, int ndim, const int64_t *shape);
QKV_API qkv_tensor *qkv_ones(qkv_ctx *ctx, qkv_dtype dtype, int ndim, const int64_t *shape);
QKV_API qkv_tensor *qkv_full(qkv_ctx *ctx, qkv_dtype dtype, int ndim, const int64_t *shape,
                             double value);
/* Copies numel elements of dtype from data. */
QKV_API qkv_tensor *qkv_from_data(qkv_ctx *ctx, qkv_dtype dtype, int ndim, const int64_t *shape,
                                  const void *data);
QKV_API qkv_tensor *qkv_scalar(qkv_ctx *ctx, qkv_dtype dtype, double value);
/* Random tensors from the context RNG (f32 or f64). */
QKV_API qkv_tensor *qkv_randn(qkv_ctx *ctx, qkv_dtype dtype, int ndim, const int64_t *shape,
                              double mean, double std);
QKV_API qkv_tensor *qkv_rand_uniform(qkv_ctx *ctx, qkv_dtype dtype, int ndim, const int64_t *shape,
                                     double low, double high);
/* A [fan_in, fan_out] weight: Xavier/Glorot uniform, U(-a, a) with a = sqrt(6 / (fan_in + fan_out)),
 * and He/Kaiming normal, N(0, 2 / fan_in). */
QKV_API qkv_tensor *qkv_xavier_uniform(qkv_ctx *ctx, qkv_dtype dtype, int64_t fan_in,
                                       int64_t fan_out);
QKV_API qkv_tensor *qkv_he_normal(qkv_ctx *ctx, qkv_dtype dtype, int64_t fan_in, int64_t fan_out);

/* Persistent tensors (live until qkv_free or qkv_ctx_free). qkv_param copies init and marks the copy as
 * requiring grad; qkv_keep copies without. Their gradients are persistent too, owned by their tensor, and
 * add up over backward calls until qkv_zero_grad. qkv_free frees a persistent tensor and its gradient; it
 * is a no-op for NULL and for a step tensor of the current step, and refuses (sticky error, nothing freed)
 * a gradient (QKV_ERR_ARG: it goes with its tensor), a stale step tensor (QKV_ERR_STALE), and a pointer
 * that is not a live tensor of ctx (QKV_ERR_ARG: another context's, or already freed). */
QKV_API qkv_tensor *qkv_param(qkv_ctx *ctx, const qkv_tensor *init);
QKV_API qkv_tensor *qkv_keep(qkv_ctx *ctx, const qkv_tensor *tensor);
QKV_API void qkv_free(qkv_ctx *ctx, qkv_tensor *tensor);

/* Which tensor pointers are refused. A function given a tensor first decides from the pointer's address
 * alone, reading nothing at it, whether it is a tensor of ctx: a step tensor's header is a slot of the
 * context's header ring (its data is in the step arena), and persistent tensors are in a set of live
 * addresses. Only then is the header read. So, with no read of released memory:
 *   - a step tensor used after qkv_step_end is QKV_ERR_STALE, naming the step it was made in and the
 *     current one, in each of the next 16 steps, whatever now sits where its data was (a training loop
 *     makes the same layout each step). Headers are 88 bytes and the ring holds at most 8 MiB: when the 17
 *     latest steps make more than 95,325 tensors together (5,607 a step), the slots are reused sooner, but
 *     never before the second step after (so the step right after always catches it). Past that, the
 *     pointer is QKV_ERR_ARG, or, once its slot holds a new tensor, reads as that tensor (not detectable);
 *   - a step tensor released within its step by a rewind (what qkv_gradcheck does between evaluations):
 *     QKV_ERR_ARG;
 *   - a parameter (qkv_param) after qkv_free, a second qkv_free included, or its gradient, freed with it:
 *     QKV_ERR_ARG "... it was freed with qkv_free", always, until 64 more parameters of ctx have been freed
 *     (qkv_model_free frees each of its parameters): a context holds the 64 parameters it freed last, with
 *     their gradients, memory and all, so no new tensor can take their addresses, and gives each one's
 *     memory back to the allocator when the 65th parameter freed after it pushes it out (qkv_ctx_free gives
 *     back the rest). The cost: up to 64 freed parameters' memory stays allocated that long. After that,
 *     and for any other persistent tensor after qkv_free (qkv_keep's, whose memory goes back at once, as
 *     an optimizer's state does in qkv_optim_free and a checkpoint's tensors in qkv_safetensors_free):
 *     QKV_ERR_ARG "not a live tensor", until the allocator hands the address to a new persistent tensor of
 *     ctx (the pointer then reads as that tensor: not detectable);
 *   - a tensor of another context, as any argument of any function (qkv_free, qkv_keep, an operator, the
 *     loss of qkv_backward): QKV_ERR_ARG. A context uses only its own tensors; copy values across with
 *     qkv_from_data(ctx, t->dtype, t->ndim, t->shape, t->data).
 * The messages name the function and the argument: "qkv_add: a is not a live tensor of this context (made
 * by another context, freed with qkv_free, or a step tensor from more than 16 steps ago)". The cost: a
 * current-step tensor is one range test before the two header loads of old; a persistent one adds a hash
 * probe (bench/handles measures both); memory is the ring (17 steps of 88-byte headers, at most 8 MiB, plus
 * rings a step outgrew, kept 16 steps), 16 to 32 bytes per live persistent tensor, and the 64 freed
 * parameters held (a pointer that is none of these costs a scan of those 64 before its error). */

/* A detached step copy, in the same or another dtype (float <-> int conversions truncate toward 0). */
QKV_API qkv_tensor *qkv_copy(qkv_ctx *ctx, const qkv_tensor *tensor);
QKV_API qkv_tensor *qkv_to_dtype(qkv_ctx *ctx, const qkv_tensor *tensor, qkv_dtype dtype);
/* Copy src into dst (same numel; dtypes may differ). */
QKV_API qkv_status qkv_copy_into(qkv_ctx *ctx, qkv_tensor *dst, const qkv_tensor *src);
QKV_API qkv_status qkv_fill(qkv_ctx *ctx, qkv_tensor *tensor, double value);
/* A step copy with a new shape of the same numel. Gradients flow through it. */
QKV_API qkv_tensor *qkv_reshape(qkv_ctx *ctx, qkv_tensor *tensor, int ndim, const int64_t *shape);

/* Element access by a full index (ndim entries) or by flat row-major position. A bad index sets
 * QKV_ERR_ARG and qkv_get returns NaN. */
QKV_API double qkv_get(qkv_ctx *ctx, const qkv_tensor *tensor, const int64_t *index);
QKV_API qkv_status qkv_set(qkv_ctx *ctx, qkv_tensor *tensor, const int64_t *index, double value);
QKV_API double qkv_get_flat(qkv_ctx *ctx, const qkv_tensor *tensor, int64_t position);
QKV_API qkv_status qkv_set_flat(qkv_ctx *ctx, qkv_tensor *tensor, int64_t position, double value);
/* Typed data pointers; NULL if the dtype differs (no error is stored). The pointer is as writable as the
 * tensor: qkv_f32(t) gives `float *` for a `qkv_tensor *` and `const float *` for a `const qkv_tensor *`
 * (a C11 _Generic macro in C, two overloads in C++), so a read-only tensor cannot be written through it by
 * accident. qkv_f32_mut and qkv_f32_const are the two functions behind it, for a caller that wants to
 * say which (or to take its address); the same for f64, i32 and u8. */
QKV_API float *qkv_f32_mut(qkv_tensor *tensor);
QKV_API const float *qkv_f32_const(const qkv_tensor *tensor);
QKV_API double *qkv_f64_mut(qkv_tensor *tensor);
QKV_API const double *qkv_f64_const(const qkv_tensor *tensor);
QKV_API int32_t *qkv_i32_mut(qkv_tensor *tensor);
QKV_API const int32_t *qkv_i32_const(const qkv_tensor *tensor);
QKV_API uint8_t *qkv_u8_mut(qkv_tensor *tensor);
QKV_API const uint8_t *qkv_u8_const(const qkv_tensor *tensor);
#ifndef __cplusplus
#define qkv_f32(tensor) _Generic((tensor), const qkv_tensor *: qkv_f32_const, default: qkv_f32_mut)(tensor)
#define qkv_f64(tensor) _Generic((tensor), const qkv_tensor *: qkv_f64_const, default: qkv_f64_mut)(tensor)
#define qkv_i32(tensor) _Generic((tensor), const qkv_tensor *: qkv_i32_const, default: qkv_i32_mut)(tensor)
#define qkv_u8(tensor) _Generic((tensor), const qkv_tensor *: qkv_u8_const, default: qkv_u8_mut)(tensor)
#endif

/* Print shape, dtype and values (at most 6 per dimension; more are elided with "...") to out, then flush
 * it: a write that fails (a full disk, a closed pipe, an out already in error) is QKV_ERR_IO. */
QKV_API qkv_status qkv_print(qkv_ctx *ctx, const qkv_tensor *tensor, FILE *out);
/* "[2,3,4]" into buf (always terminated). Returns buf. */
QKV_API char *qkv_shape_str(const qkv_tensor *tensor, char *buf, size_t size);

/* .npy files (format versions 1.0, 2.0 and 3.0, little-endian, C order). Saving writes '<f4', '<f8',
 * '<i4' or '|u1' (the tensor's dtype). Loading reads those four and converts two NumPy defaults where
 * the conversion is exact: '<i8' (np.int64, NumPy's default integer) loads as QKV_I32 when every value
 * fits in int32, else QKV_ERR_FORMAT names the first value that does not, its index and the fix
 * (ids.astype(np.int32)); '|b1' (np.bool_, what comparisons give) loads as QKV_U8 0/1, and a byte other
 * than 0 or 1 is QKV_ERR_FORMAT. Any other dtype ('<f2', '<u4', big-endian, ...) is QKV_ERR_FORMAT with
 * the NumPy call that converts it (a.astype(np.float32), ...). Writes are atomic (temporary file,
 * fsync, rename). The loader treats its input as untrusted. Loaded tensors are step tensors; qkv_keep
 * one to hold it longer. */
QKV_API qkv_status qkv_npy_save(qkv_ctx *ctx, const qkv_tensor *tensor, const char *path);
QKV_API qkv_tensor *qkv_npy_load(qkv_ctx *ctx, const char *path);
QKV_API qkv_tensor *qkv_npy_load_mem(qkv_ctx *ctx, const void *bytes, size_t size);

/* ------------------------------------------------------------------------------------------------ */
/* Autograd                                                                                         */
/* ------------------------------------------------------------------------------------------------ */

/* Mark a float leaf as requiring grad (a step tensor or a persistent one). */
QKV_API qkv_status qkv_set_requires_grad(qkv_ctx *ctx, qkv_tensor *tensor, bool requires_grad);
/* Turn recording on or off; returns the previous setting. With recording off no node is appended and
 * no result requires grad. */
QKV_API bool qkv_set_grad_enabled(qkv_ctx *ctx, bool enabled);
QKV_API bool qkv_grad_enabled(const qkv_ctx *ctx);

/* Walk the tape back from loss, adding (+=) dL/dx into x->grad of every tensor that requires grad.
 * dloss is the upstream gradient (same shape as loss); NULL is allowed only for a one-element loss,
 * and means 1. One backward per tape: a second call before qkv_step_end is QKV_ERR_STATE (the saved
 * values may have been consumed, and accumulating twice silently is a classic bug). Gradients of
 * step tensors live until qkv_step_end; gradients of persistent tensors add up until qkv_zero_grad.
 * A dloss of loss's dtype that is a step tensor or a kept one (qkv_keep; not a parameter, not a gradient)
 * becomes loss's gradient as it is, not a copy: after the backward loss->grad is dloss, and the walk only
 * reads it. A kept dloss freed before qkv_step_end takes loss's gradient with it (loss->grad becomes NULL,
 * never a dangling pointer). A parameter or a gradient given as dloss is copied.
 * With qkv_options.release_grads (off by default), as in PyTorch, only leaves keep their gradients:
 * the gradient of an intermediate (a step tensor an operator made, the loss included) goes back to the
 * step arena as soon as its node's backward has run, and so does the working memory of that backward;
 * later allocations of the same step of the same size reuse it. After qkv_backward such a tensor's
 * ->grad is NULL: the gradient is unavailable, never stale memory. Leaves keep their ->grad as without
 * it: parameters, kept tensors, and step tensors no operator made (marked with qkv_set_requires_grad).
 * The results are the same bits either way; a training step's peak memory is lower (the activations
 * stay until qkv_step_end, the gradients of intermediates do not). */
QKV_API qkv_status qkv_backward(qkv_ctx *ctx, qkv_tensor *loss, const qkv_tensor *dloss);
/* Zeroing gradients. Three functions, which differ only in which tensors they zero; each sets the
 * values of an existing ->grad to 0 in place (the gradient tensor is kept, no allocation), and leaves a
 * tensor that has no gradient yet without one (->grad stays NULL):
 *   qkv_zero_grad(ctx, t)     one tensor, t (any tensor, a parameter or not). On an errored context it
 *                             changes nothing and returns the stored code; t NULL is QKV_ERR_NULL.
 *   qkv_zero_grads(ctx)       every parameter of the context, i.e. every tensor made by qkv_param (not
 *                             one made by qkv_keep and marked with qkv_set_requires_grad). It returns
 *                             nothing and zeros even on an errored context (it cannot fail).
 *   qkv_optim_zero_grad(opt)  the parameters given to qkv_optim_new, and only those (qkv/optim.h).
 * None of them is needed for gradients of step tensors, which qkv_step_end releases. */

/* One tensor: set tensor->grad to zeros (a no-op if it has none yet). */
QKV_API qkv_status qkv_zero_grad(qkv_ctx *ctx, qkv_tensor *tensor);
/* Every parameter of the context: zero the gradient of each tensor made with qkv_param. */
QKV_API void qkv_zero_grads(qkv_ctx *ctx);
/* The parameters made with qkv_param, in creation order; *count receives their number. */
QKV_API qkv_tensor *const *qkv_params(const qkv_ctx *ctx, int *count);

/* Anomaly mode: backward stops at the first operator whose input gradient holds a NaN or inf and
 * reports QKV_ERR_NUMERIC with the operator, the shape and the index of the first bad element. */
QKV_API void qkv_set_anomaly_mode(qkv_ctx *ctx, bool enabled);

/* Numeric gradient check.
 * fn maps the inputs to an output tensor (any shape). For a fixed random R (seeded, non-uniform) the
 * scalar L = sum(out * R) is differentiated twice: analytically by backward, and numerically by central
 * (or 5-point) differences over every element of every f64 input whose check flag is set (all f64
 * inputs when check is NULL). An element passes when |analytic - numeric| <= atol + rtol * |numeric|.
 * The function may be called many times; it must be deterministic. */
typedef qkv_tensor *(*qkv_gradcheck_fn)(qkv_ctx *ctx, qkv_tensor *const *inputs, int n_inputs,
                                        void *user);

/* How qkv_gradcheck differentiates and compares; zeros give the defaults shown. */
typedef struct qkv_gradcheck_options {
    double eps;      /* finite-difference step; 0 means 1e-6                                        */
    double atol;     /* 0 means 1e-7                                                                */
    double rtol;     /* 0 means 1e-6                                                                */
    bool five_point; /* 5-point instead of central differences                                      */
    uint64_t seed;   /* seed of R                                                                   */
    const bool *check; /* n_inputs flags, or NULL for every f64 input                               */
} qkv_gradcheck_options;

/* What qkv_gradcheck found. */
typedef struct qkv_gradcheck_result {
    bool passed;
    int64_t checked;     /* elements compared                                                       */
    int64_t failed;      /* elements outside the tolerance                                          */
    int worst_input;     /* input holding the worst element (largest error / tolerance), -1 if none */
    int64_t worst_index; /* its flat index                                                          */
    double analytic, numeric, abs_err, rel_err;
    char message[256];   /* one line describing the worst element                                   */
} qkv_gradcheck_result;

/* Returns QKV_OK when the check ran (result->passed says whether it passed), or the error that
 * stopped it. Tensors made during the check are released; inputs are left as they were. fn may build on
 * tensors the caller made (parameters, step tensors, even intermediates of a recorded graph): the
 * check's backward adds into their gradients only while it runs and gives them back as they were (a
 * gradient it had to make is freed); the caller's tape, grad mode and RNG are left as they were.
 * Refused with QKV_ERR_ARG: the same tensor twice in inputs (pass it once; fn may use it twice). Refused
 * with QKV_ERR_STATE, the caller's state unchanged: an output fn did not compute during the call (one the
 * caller recorded, or a leaf that is not an input), and an fn that calls qkv_backward or qkv_step_end
 * (which releases every step tensor, the check's and the caller's: only persistent inputs are given back
 * then, and fn is not called again). */
QKV_API qkv_status qkv_gradcheck(qkv_ctx *ctx, qkv_gradcheck_fn fn, qkv_tensor *const *inputs,
                                 int n_inputs, void *user, const qkv_gradcheck_options *options,
                                 qkv_gradcheck_result *result);

/* ------------------------------------------------------------------------------------------------ */
/* Operators (f32 and f64; each result is a step tensor; gradients flow to every float input)       */
/* ------------------------------------------------------------------------------------------------ */

/* Elementwise a (op) b. b has a's shape, or is a trailing-dimension bias: b's shape equals the last
 * b->ndim dimensions of a (a [B, n, d] + b [d], or + b [n, d]), or b is a one-element tensor. */
QKV_API qkv_tensor *qkv_add(qkv_ctx *ctx, qkv_tensor *a, qkv_tensor *b);
QKV_API qkv_tensor *qkv_sub(qkv_ctx *ctx, qkv_tensor *a, qkv_tensor *b);
QKV_API qkv_tensor *qkv_mul(qkv_ctx *ctx, qkv_tensor *a, qkv_tensor *b);
/* Sum and mean of every element: a scalar (ndim 0). Of an empty tensor: sum 0, mean NaN (0 / 0, as PyTorch). */
QKV_API qkv_tensor *qkv_sum(qkv_ctx *ctx, qkv_tensor *a);
QKV_API qkv_tensor *qkv_mean(qkv_ctx *ctx, qkv_tensor *a);

/* Y = X W (+ b): X [..., n, d_in], W [d_in, d_out], b [d_out] or NULL -> Y [..., n, d_out]. */
QKV_API qkv_tensor *qkv_projection(qkv_ctx *ctx, qkv_tensor *x, qkv_tensor *w, qkv_tensor *b);

/* Batched matmul C = op(A) op(B), op transposing the last two dimensions when its flag is set:
 * A [B, m, k] (or [B, k, m] with QKV_TRANS_A), B [B, k, p] (or [B, p, k] with QKV_TRANS_B) -> [B, m, p].
 * 2-D operands are a batch of one; a batch of 1 broadcasts over the other side's batch. */
enum { QKV_TRANS_A = 1, QKV_TRANS_B = 2 };
QKV_API qkv_tensor *qkv_matmul(qkv_ctx *ctx, qkv_tensor *a, qkv_tensor *b, int flags);

/* Y = s X for any finite s (the 1/sqrt(d_k) step; s = 1 is legal and copies). */
QKV_API qkv_tensor *qkv_scale(qkv_ctx *ctx, qkv_tensor *x, double s);

/* Masked softmax over the last dimension of scores [n_q, n_k] or [B, n_q, n_k].
 * mask: NULL, or u8 (0 drops; any nonzero byte keeps, not only 1) of shape [n_q, n_k], [Bm, n_q, n_k] or
 * [Bm, 1, n_k] where Bm divides B (scores batch b uses mask batch b / (B / Bm): a [batch] mask serves
 * [batch * heads] scores made by qkv_split_heads). QKV_CAUSAL drops key j > query i (needs no mask; combines with one).
 * A masked score is never read (a NaN or inf there does not leak). A row with every entry dropped
 * gives zeros and a zero gradient (PyTorch 1.13 gives NaN there). When recording, the node keeps its own
 * copy of the mask: changing or freeing the mask before the backward changes nothing there. */
enum { QKV_CAUSAL = 1 };
QKV_API qkv_tensor *qkv_softmax(qkv_ctx *ctx, qkv_tensor *scores, const qkv_tensor *mask, int flags);

/* [B, n, h*d] -> [B*h, n, d] (head j of batch b becomes batch b*h + j), and back. */
QKV_API qkv_tensor *qkv_split_heads(qkv_ctx *ctx, qkv_tensor *x, int heads);
QKV_API qkv_tensor *qkv_merge_heads(qkv_ctx *ctx, qkv_tensor *x, int heads);

/* Mean cross-entropy of logits [..., V] against i32 targets [...] (the leading shape of logits).
 * A target < 0 is ignored (padding); the mean is over the others (0 with a zero gradient if none). A
 * target >= V is QKV_ERR_ARG. Computed through a stable log-softmax. Returns a scalar. When recording,
 * the node keeps its own copy of the targets (4 bytes each): changing or freeing targets before the
 * backward changes nothing there. */
QKV_API qkv_tensor *qkv_cross_entropy(qkv_ctx *ctx, qkv_tensor *logits, const qkv_tensor *targets);

/* Scaled dot-product attention: out = softmax(scale * Q K^T, mask, flags) V.
 * q [B, n_q, d_k], k [B, n_k, d_k], v [B, n_k, d_v] -> out [B, n_q, d_v] (2-D operands: B = 1).
 * mask and flags: as qkv_softmax (u8; 0 drops, any nonzero byte keeps; QKV_CAUSAL drops key j > query i);
 * as there, the node keeps its own copy of the mask, which the caller may change or free before the backward.
 * What a dropped key cannot change, in f32 and f64, with or without attn: the row of out and of dq of a
 * query never reads the K or V row of a key that query drops, so an inf or NaN there leaves them as they
 * would be with finite values (to rounding). A key that every query of its batch element
 * drops (padding, or with QKV_CAUSAL a key past the last query) is therefore not read at all: out, dq, dk
 * and dv are unchanged and its own rows of dk and dv are exactly 0. A key that some queries keep is read
 * by those queries: an inf or NaN in its K or V row makes their rows of out and dq non-finite, and their
 * gradient then reaches dk and dv of every key they keep. out and its gradients come from the fused path
 * whether attn is NULL or not: asking for A changes neither. A itself is formed beside out by qkv_matmul,
 * qkv_scale and qkv_softmax (its dropped entries are exactly 0); a gradient that flows through A (a loss
 * on the attention matrix) reaches dq through qkv_matmul, which follows IEEE 0 * inf = NaN, so there an
 * inf or NaN in a dropped key's K row makes the dq rows of the queries that drop it NaN.
 * scale: QKV_SCALE_DEFAULT, which is -HUGE_VAL (exactly -inf), means 1/sqrt(d_k); any finite value,
 * 0 and negative ones included, is used as given; NaN and +inf are QKV_ERR_ARG (a NaN scale is a bug,
 * never a request for the default).
 * attn, when not NULL, receives the attention matrix [B, n_q, n_k] (a step tensor; forming it costs one
 * more Q K^T and softmax, and n_q n_k elements of the step arena). */
#define QKV_SCALE_DEFAULT (-HUGE_VAL)
QKV_API qkv_tensor *qkv_attention(qkv_ctx *ctx, qkv_tensor *q, qkv_tensor *k, qkv_tensor *v,
                                  const qkv_tensor *mask, double scale, int flags,
                                  qkv_tensor **attn);

/* Self-attention of x [B, n, d_model] (or [n, d_model]): Q = X Wq, K = X Wk, V = X Wv with
 * Wq, Wk [d_model, d_k], Wv [d_model, d_v], then qkv_attention. Returns [B, n, d_v]. */
QKV_API qkv_tensor *qkv_self_attention(qkv_ctx *ctx, qkv_tensor *x, qkv_tensor *wq, qkv_tensor *wk,
                                       qkv_tensor *wv, const qkv_tensor *mask, double scale,
                                       int flags, qkv_tensor **attn);

/* ------------------------------------------------------------------------------------------------ */
/* Transformer building blocks (f32 and f64 unless said; each result is a step tensor)              */
/* ------------------------------------------------------------------------------------------------ */

/* Rows of table [V, d] picked by i32 ids [n] or [B, n] -> [n, d] or [B, n, d]: y[.., i, :] = table[ids[.., i], :].
 * Backward scatter-adds each row of dy into dtable (a repeated id gets the sum, in position order, the same
 * bits for any thread count). An id outside [0, V) is QKV_ERR_ARG naming the id, its position and V. */
QKV_API qkv_tensor *qkv_embedding(qkv_ctx *ctx, qkv_tensor *table, const qkv_tensor *ids);

/* Normalisation over the last dimension d of x [..., d] (a row is the last dimension):
 *   layer norm  y = (x - mean) / sqrt(var + eps) * gamma + beta   (var the biased variance, as PyTorch)
 *   RMS norm    y = x / sqrt(mean(x^2) + eps) * gamma
 * gamma and beta are [d] or NULL (NULL: 1 and 0, and no gradient). eps must be finite and > 0, and for f32
 * at least FLT_MIN (1.2e-38; a smaller one is 0 or subnormal as an f32, and 1/sqrt(eps) overflows). A constant
 * row is well defined (layer norm gives beta, with a finite gradient). The backward is closed-form. */
QKV_API qkv_tensor *qkv_layer_norm(qkv_ctx *ctx, qkv_tensor *x, qkv_tensor *gamma, qkv_tensor *beta,
                                   double eps);
QKV_API qkv_tensor *qkv_rms_norm(qkv_ctx *ctx, qkv_tensor *x, qkv_tensor *gamma, double eps);

/* Activations, elementwise. relu: y = max(x, 0) (the gradient at 0 is 0, as PyTorch; at a NaN x both y and the
 * gradient are NaN, where PyTorch passes the gradient through, so anomaly mode stops at qkv_relu).
 * gelu: QKV_GELU_ERF is x Phi(x) = x (1 + erf(x / sqrt 2)) / 2 (PyTorch approximate='none');
 * QKV_GELU_TANH is x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2 (approximate='tanh'). */
typedef enum qkv_gelu_approx { QKV_GELU_ERF = 0, QKV_GELU_TANH = 1 } qkv_gelu_approx;
QKV_API qkv_tensor *qkv_relu(qkv_ctx *ctx, qkv_tensor *x);
QKV_API qkv_tensor *qkv_gelu(qkv_ctx *ctx, qkv_tensor *x, qkv_gelu_approx approx);

/* Logit soft-capping, elementwise: y = cap tanh(x / cap), cap finite and > 0. */
QKV_API qkv_tensor *qkv_softcap(qkv_ctx *ctx, qkv_tensor *x, double cap);

/* Rotary position embedding of x [n, d] or [B, n, d] (B may be batch * heads, as qkv_split_heads makes),
 * d even, "rotate half" convention (GPT-NeoX, LLaMA in Hugging Face): for row i (position p = offset + i)
 * and j < d/2, with theta_j = base^(-2j/d):
 *   y[j]       = x[j] cos(p theta_j) - x[j + d/2] sin(p theta_j)
 *   y[j + d/2] = x[j + d/2] cos(p theta_j) + x[j] sin(p theta_j)
 * base finite and > 1 (10000 is usual), offset >= 0. The backward is the inverse rotation. */
QKV_API qkv_tensor *qkv_rope(qkv_ctx *ctx, qkv_tensor *x, double base, int64_t offset);

/* Inverted dropout: each element is kept with probability 1 - p and scaled by 1 / (1 - p), else zeroed.
 * The mask is drawn from the context RNG (same seed, same mask) and kept for the backward. p in [0, 1).
 * p = 0, or gradient recording off (evaluation), returns x itself, unchanged. */
QKV_API qkv_tensor *qkv_dropout(qkv_ctx *ctx, qkv_tensor *x, double p);

/* The fixed sinusoidal position table [n, d] of "Attention Is All You Need" (a tensor maker, no gradient):
 *   P[p, 2j] = sin(p / 10000^(2j/d)),  P[p, 2j+1] = cos(p / 10000^(2j/d)). f32 or f64; n, d >= 1. */
QKV_API qkv_tensor *qkv_sinusoidal_positions(qkv_ctx *ctx, int64_t n, int64_t d, qkv_dtype dtype);

#ifdef __cplusplus
}
/* C++: qkv_f32(t) and the others as overloads on the tensor's constness (the C macros' meaning). */
inline float *qkv_f32(qkv_tensor *tensor) { return qkv_f32_mut(tensor); }
inline const float *qkv_f32(const qkv_tensor *tensor) { return qkv_f32_const(tensor); }
inline double *qkv_f64(qkv_tensor *tensor) { return qkv_f64_mut(tensor); }
inline const double *qkv_f64(const qkv_tensor *tensor) { return qkv_f64_const(tensor); }
inline int32_t *qkv_i32(qkv_tensor *tensor) { return qkv_i32_mut(tensor); }
inline const int32_t *qkv_i32(const qkv_tensor *tensor) { return qkv_i32_const(tensor); }
inline uint8_t *qkv_u8(qkv_tensor *tensor) { return qkv_u8_mut(tensor); }
inline const uint8_t *qkv_u8(const qkv_tensor *tensor) { return qkv_u8_const(tensor); }
#endif

#include "qkv/elementwise.h" /* exp, log, ..., div, maximum, where: elementwise, NumPy broadcasting */
#include "qkv/shape.h"       /* transpose, permute, concat, narrow, index_select, gather, expand: copies */
#include "qkv/reduce.h"      /* sum, mean, max, logsumexp, softmax, log_softmax along an axis */
#include "qkv/attention.h"   /* attention variants: softmax plus one, sinks, sigmoid, SSMax, softpick */
#include "qkv/custom.h"      /* user-defined operators with their own backward */
#include "qkv/optim.h"       /* SGD, Adam, AdamW, gradient clipping */
#include "qkv/safetensors.h" /* checkpoints */
#include "qkv/model.h"       /* small decoder-only transformers */
#include "qkv/hooks.h"       /* hook points, the activation cache, patching, attribution */

#endif /* QKV_H */
