/*
 * qkv/custom.h — user-defined operators (included by qkv.h): an operator written outside the library, with
 * its own forward and its own hand-written backward, that the tape treats like a built-in one (PyTorch's
 * torch.autograd.Function, ggml's custom operators).
 *
 *   static qkv_status plus_one_forward(qkv_ctx *ctx, qkv_custom_call *call) {
 *       call->outputs[0] = ...;          // new tensors, computed from call->inputs with any qkv function
 *       call->saved[0] = call->outputs[0], call->n_saved = 1;  // what the backward will need
 *       return qkv_error(ctx);
 *   }
 *   static qkv_status plus_one_backward(qkv_ctx *ctx, qkv_custom_call *call) {
 *       // add dL/d input i into call->grad_inputs[i] (when not NULL), from call->grad_outputs and call->saved
 *       return QKV_OK;
 *   }
 *   const qkv_custom_op plus_one = {"softmax_plus_one", 1, 1, plus_one_forward, plus_one_backward, NULL};
 *   qkv_tensor *w = qkv_custom1(ctx, &plus_one, (qkv_tensor *[]){scores});
 *
 * docs/extending.md builds one step by step. How the tape treats a user-defined operator:
 *   - The forward runs with gradient recording off: the qkv operators it calls record nothing, whatever the
 *     context's grad mode. When gradients are wanted (recording on, some float input requires grad) one
 *     node is recorded for the whole operator, its float outputs require grad, and a backward walk calls
 *     the operator's backward once, with the gradients of all its outputs (zeros for an output the loss
 *     does not depend on), in the tape's order. Otherwise nothing is recorded and the backward never runs.
 *   - An input used twice (or also used elsewhere) gets the sum of its gradients, as with any operator:
 *     the backward adds (+=) into grad_inputs, never assigns.
 *   - qkv_gradcheck works on a function that calls qkv_custom: it checks the hand-written backward against
 *     finite differences of the forward.
 *   - Anomaly mode (qkv_set_anomaly_mode) names the operator by its name when its backward leaves a NaN or an
 *     inf in an input's gradient.
 *   - An error a callback raises (a failing qkv call inside it, qkv_set_error, or a status it returns
 *     without a message) becomes the context's error, the operator named in it: "qkv_custom: softmax_plus_one:
 *     forward: qkv_div: ..." (in a backward walk "qkv_backward: qkv_custom: softmax_plus_one: backward: ...").
 *     qkv_custom then returns that status with every output NULL.
 *
 * What a callback may call: any qkv function on tensors (operators, qkv_zeros, qkv_f64, qkv_set_flat, ...)
 * and qkv_set_error. It may not call qkv_backward, qkv_step_end or qkv_ctx_free (refused with QKV_ERR_STATE:
 * the tape or the memory the call stands on would go), nor free or change its inputs. Tensors it makes are
 * step tensors: in the forward they live until qkv_step_end (so an output or a saved tensor may be one); in
 * the backward their memory is given back when the backward returns (when the context releases gradients
 * as it walks, qkv_options.release_grads), so nothing made there may be kept. The operator's definition, its
 * name and the call's inputs, outputs and saved tensors are copied at the call: the caller's qkv_custom_op
 * (and its name string) need not outlive qkv_custom.
 */
#ifndef QKV_CUSTOM_H
#define QKV_CUSTOM_H

#include "../qkv.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    QKV_CUSTOM_MAX_INPUTS = 8,  /* inputs of one user-defined operator               */
    QKV_CUSTOM_MAX_OUTPUTS = 4, /* outputs                                           */
    QKV_CUSTOM_MAX_SAVED = 8,   /* tensors a forward may save for its backward       */
};

/* What a callback of one call of a user-defined operator sees. Filled by qkv_custom; the forward fills
 * outputs (and may fill saved); the backward reads everything and adds into grad_inputs. */
typedef struct qkv_custom_call {
    const char *name;                           /* the operator's name                                  */
    void *user;                                 /* the operator's user data                             */
    int n_inputs, n_outputs;
    qkv_tensor *inputs[QKV_CUSTOM_MAX_INPUTS];  /* as passed to qkv_custom (any dtype)                   */
    /* forward: store each output here: a new step tensor the forward made (any dtype; only f32 and f64
     * outputs carry gradients), not an input, a persistent tensor or another output. backward: the outputs */
    qkv_tensor *outputs[QKV_CUSTOM_MAX_OUTPUTS];
    /* backward only: dL/d output k, its output's shape and dtype (zeros when the loss does not depend on it;
     * NULL for an integer output) */
    qkv_tensor *grad_outputs[QKV_CUSTOM_MAX_OUTPUTS];
    /* backward only: add (+=) dL/d input i into grad_inputs[i], its input's shape and dtype; NULL when input
     * i needs no gradient (not a float tensor that requires grad) */
    qkv_tensor *grad_inputs[QKV_CUSTOM_MAX_INPUTS];
    /* forward: tensors the backward needs besides the inputs and outputs (any live tensor of the context:
     * step tensors the forward made, kept tensors); each is checked to be still alive before the backward */
    int n_saved;
    qkv_tensor *saved[QKV_CUSTOM_MAX_SAVED];
} qkv_custom_call;

/* A forward or backward callback. Returns QKV_OK, or the error it met (see the header comment). */
typedef qkv_status (*qkv_custom_fn)(qkv_ctx *ctx, qkv_custom_call *call);

/* A user-defined operator. */
typedef struct qkv_custom_op {
    const char *name;       /* names it in errors and anomaly reports (1-63 printable characters)       */
    int n_inputs;           /* 1..QKV_CUSTOM_MAX_INPUTS                                                 */
    int n_outputs;          /* 1..QKV_CUSTOM_MAX_OUTPUTS                                                */
    qkv_custom_fn forward;  /* required                                                                 */
    qkv_custom_fn backward; /* NULL: no gradient; a backward walk that reaches it is QKV_ERR_STATE      */
    void *user;             /* handed to both callbacks as call->user                                   */
} qkv_custom_op;

/* Run op on inputs (op->n_inputs tensors, none NULL); outputs (op->n_outputs entries) receive the results,
 * or NULL each on error (left untouched when op->n_outputs itself is out of range). Returns the context's status. A definition that breaks the rules above (no name, no
 * forward, counts out of range, an output that is not a new step tensor) is QKV_ERR_ARG naming what. */
QKV_API qkv_status qkv_custom(qkv_ctx *ctx, const qkv_custom_op *op, qkv_tensor *const *inputs,
                              qkv_tensor **outputs);
/* qkv_custom for an operator with one output: the output, or NULL on error. */
QKV_API qkv_tensor *qkv_custom1(qkv_ctx *ctx, const qkv_custom_op *op, qkv_tensor *const *inputs);

/* Store an error in ctx as qkv's own functions do (the first error stays; later ones are ignored), with a
 * printf-style message. Returns the context's status afterwards. For callbacks, and for any code layered on
 * qkv that wants its errors where qkv's are. A status of QKV_OK stores nothing. */
QKV_API qkv_status qkv_set_error(qkv_ctx *ctx, qkv_status status, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#ifdef __cplusplus
}
#endif

#endif /* QKV_CUSTOM_H */
