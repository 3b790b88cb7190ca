/*
 * qkv/optim.h — optimizers (SGD, Adam, AdamW) and clipping by global gradient norm.
 *
 * Included by qkv.h at its end (include qkv.h, not this file). The updates follow PyTorch 1.13's
 * torch.optim.SGD, Adam and AdamW (single-tensor path, maximize=False, amsgrad=False) step for step:
 *
 *   SGD    d = g + wd p;  buf = d on a parameter's first step, else buf = momentum buf + (1 - dampening) d;
 *          d = d + momentum buf (nesterov) or d = buf (momentum != 0);  p = p - lr d
 *   Adam   g = g + wd p (L2, added to the gradient);  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
 *          p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 *   AdamW  p = p (1 - lr wd) (decoupled decay), then the Adam step without the L2 term
 *
 * where t counts the steps of that parameter (a parameter that had no gradient at a step is skipped and
 * its t does not advance, as in PyTorch). Values are computed in double and stored in the parameter's
 * dtype (f32 or f64); state tensors have the parameter's dtype and shape.
 *
 * Memory: the optimizer and all its state are allocated once by qkv_optim_new (persistent memory through
 * the context's allocator). qkv_optim_step, qkv_clip_grad_norm and qkv_optim_zero_grad make no heap
 * allocation and use no step-arena memory. The parameters must outlive the optimizer.
 *
 * Errors follow the sticky model of qkv.h: a failing call stores a code and a message in the context.
 */
#ifndef QKV_OPTIM_H
#define QKV_OPTIM_H

#ifdef __cplusplus
extern "C" {
#endif

/* The optimizers, each following its PyTorch 1.13 namesake's update rule. */
typedef enum qkv_optim_kind {
    QKV_OPTIM_SGD = 0, /* torch.optim.SGD   */
    QKV_OPTIM_ADAM,    /* torch.optim.Adam  */
    QKV_OPTIM_ADAMW,   /* torch.optim.AdamW */
    QKV_OPTIM_KIND_COUNT /* the number of kinds (not one) */
} qkv_optim_kind;

/* Hyper-parameters. Every field is taken as given: a 0 means 0 (beta1 = 0 is Adam without momentum in
 * m, lr = 0 an optimizer that does not move), never "the default". Start from qkv_optim_defaults(kind),
 * which holds PyTorch's defaults, and change what you need:
 *
 *     qkv_optim_options o = qkv_optim_defaults(QKV_OPTIM_ADAM);
 *     o.lr = 3e-4;
 *     o.beta1 = 0.0;
 *
 * A struct written out by hand ({.kind = QKV_OPTIM_ADAM, .lr = 3e-4}) therefore has beta1 = beta2 =
 * eps = 0, which is legal and not Adam's defaults. SGD has no default lr (as in PyTorch):
 * qkv_optim_defaults(QKV_OPTIM_SGD) leaves lr NaN, and qkv_optim_new reports an lr that was never set.
 * A field that does not apply to the kind must be 0 (momentum, dampening, nesterov for Adam/AdamW;
 * beta1, beta2, eps for SGD), so a mixed-up configuration is reported instead of ignored.
 * Accepted ranges, as PyTorch checks them: lr >= 0, momentum >= 0, weight_decay >= 0,
 * 0 <= beta < 1, eps >= 0, all finite; nesterov needs momentum > 0 and dampening 0. */
typedef struct qkv_optim_options {
    qkv_optim_kind kind;
    double lr;
    double momentum;     /* SGD                                                                   */
    double dampening;    /* SGD: buf = momentum buf + (1 - dampening) d after the first step      */
    bool nesterov;       /* SGD                                                                   */
    double weight_decay; /* SGD and Adam: + wd p in the gradient; AdamW: p *= 1 - lr wd           */
    double beta1, beta2; /* Adam, AdamW                                                           */
    double eps;          /* Adam, AdamW                                                           */
    /* n names for the parameters, used to name their state ("wq" -> "wq.exp_avg"), or NULL for
     * "param0", "param1", ... Names must be non-empty and distinct; they are copied. */
    const char *const *param_names;
} qkv_optim_options;

/* PyTorch 1.13's defaults for a kind: SGD lr NaN (to be set), momentum 0, dampening 0, no nesterov,
 * no decay; Adam lr 1e-3, betas (0.9, 0.999), eps 1e-8, no decay; AdamW the same with weight_decay 1e-2.
 * Every other field is 0 (param_names NULL). */
QKV_API qkv_optim_options qkv_optim_defaults(qkv_optim_kind kind);

/* An optimizer: its options, the parameters it updates and their state (opaque; qkv_optim_new). */
typedef struct qkv_optimizer qkv_optimizer;

/* An optimizer over n persistent float tensors (made by qkv_param or qkv_keep; each at most once).
 * options NULL means qkv_optim_defaults(QKV_OPTIM_ADAM). Returns NULL on error (stored in ctx). */
QKV_API qkv_optimizer *qkv_optim_new(qkv_ctx *ctx, const qkv_optim_options *options,
                                     qkv_tensor *const *params, int n);
/* Release the optimizer and its state. qkv_ctx_free releases it too: call this before qkv_ctx_free,
 * or not at all. NULL is a no-op. */
QKV_API void qkv_optim_free(qkv_optimizer *opt);

/* One update of every parameter from its ->grad; a parameter with no gradient yet is skipped. Reads
 * the gradients, never zeroes them. On an errored context returns the stored code and changes nothing;
 * a bad state (e.g. a restored step count that is not a whole number >= 0) is QKV_ERR_STATE and
 * changes nothing. A NaN or inf in a gradient propagates into the parameter, as in PyTorch (clip first
 * with qkv_clip_grad_norm, which reports it). A parameter freed with qkv_free since qkv_optim_new is
 * QKV_ERR_ARG (found by its address, before anything is read or changed), here and in
 * qkv_optim_zero_grad. */
QKV_API qkv_status qkv_optim_step(qkv_optimizer *opt);
/* The optimizer's parameters only: zero the gradient of each of the n params given to qkv_optim_new
 * (those that have one; a parameter with no gradient keeps none). Other parameters of the context keep
 * theirs (qkv_zero_grads zeros every qkv_param of the context; qkv_zero_grad one tensor: see qkv.h).
 * On an errored context it changes nothing and returns the error code; QKV_ERR_NULL for NULL. */
QKV_API qkv_status qkv_optim_zero_grad(qkv_optimizer *opt);

/* Successful qkv_optim_step calls so far (the "step" state tensor); 0 for NULL. */
QKV_API int64_t qkv_optim_step_count(const qkv_optimizer *opt);
/* The learning rate used by the next step (for schedules); lr must be finite and >= 0. */
QKV_API double qkv_optim_lr(const qkv_optimizer *opt);
QKV_API qkv_status qkv_optim_set_lr(qkv_optimizer *opt, double lr);
/* The options the optimizer was made with, with its current lr; param_names is NULL in the copy. */
QKV_API qkv_optim_options qkv_optim_get_options(const qkv_optimizer *opt);

/* Checkpoints. The whole state of an optimizer is a list of persistent tensors, in this order:
 *   "step"                       f64 scalar: qkv_optim_step_count
 *   then for each parameter P (its name, or "param<i>"), as in PyTorch's optimizer state:
 *     SGD with momentum:  "P.step" (f64 scalar, the parameter's own step count),
 *                         "P.momentum_buffer" (P's dtype and shape)
 *     Adam, AdamW:        "P.step", "P.exp_avg", "P.exp_avg_sq"
 *     plain SGD:          nothing
 * Saving = writing each tensor under its name; restoring = qkv_copy_into each tensor from the file
 * (into an optimizer made with the same options and parameters); a restored step count that is not a
 * whole number >= 0 is refused by the next qkv_optim_step. Tensors and names belong to the optimizer:
 * never qkv_free them. qkv_optim_state returns NULL for a bad index (QKV_ERR_ARG stored) or on an
 * errored context; name, when not NULL, receives the name (NULL on failure). */
QKV_API int qkv_optim_state_count(const qkv_optimizer *opt);
QKV_API qkv_tensor *qkv_optim_state(qkv_optimizer *opt, int index, const char **name);

/* Clip by global L2 norm, as torch.nn.utils.clip_grad_norm_ (1.13): total = sqrt(sum of the squares of
 * every gradient element), computed in double; every gradient is multiplied by
 * max_norm / (total + 1e-6) when that factor is below 1 (so a norm within 1e-6 under max_norm is scaled
 * very slightly, as in PyTorch). Parameters with no gradient are skipped (none at all: returns 0).
 * Returns the norm before clipping. A NaN or inf gradient element is QKV_ERR_NUMERIC (naming the
 * parameter and index), the gradients are left unchanged, and the non-finite norm is returned (PyTorch
 * would silently turn every gradient into NaN). Other errors return NaN. max_norm: finite and >= 0. */
QKV_API double qkv_clip_grad_norm(qkv_ctx *ctx, qkv_tensor *const *params, int n, double max_norm);

#ifdef __cplusplus
}
#endif

#endif /* QKV_OPTIM_H */
