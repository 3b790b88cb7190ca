/*
 * copy_model.h — the copy-task model shared by examples/copy_task (training CLI), bench/copy_task
 * (steps/s) and examples/softmax_study (training part): data, fixed embeddings, one attention layer
 * with trainable W^Q, W^K, W^V (and W^O), a training step and an evaluation.
 *
 * Task: a sequence of n tokens from a vocabulary of V; the target at position i is a token of the input
 * chosen by position: copy (x_i), shift (x_{i-1}; position 0 has no target), reverse (x_{n-1-i}).
 * Embeddings are fixed, so all the learning is in the attention weights:
 *   onehot: e_i = [onehot(x_i, V), onehot(i, n)]          (d_model = V + n)
 *   gauss:  e_i = t(x_i) + p(i), t ~ N(0, 1) per component, p the sinusoidal position code
 * Model: Q = E W^Q, K = E W^K, Vals = E W^V (split into heads), O = softmax(scale Q K^T) Vals,
 * logits = O (d_v = V) or O W^O; loss = cross-entropy against the targets.
 */
#ifndef QKV_EXAMPLES_COPY_MODEL_H
#define QKV_EXAMPLES_COPY_MODEL_H

#include "qkv.h"

typedef enum { TASK_COPY, TASK_SHIFT, TASK_REVERSE } copy_task_kind;
typedef enum { EMBED_ONEHOT, EMBED_GAUSS } copy_embed_kind;

typedef struct copy_config {
    copy_task_kind task;
    copy_embed_kind embed;
    uint64_t seed;
    int64_t steps, batch, n, vocab, d_model, d_k, heads, eval_size;
    bool wo;            /* a trainable output projection W^O [heads * d_v, V]                          */
    int64_t d_v;        /* per-head value width: V / heads without W^O, d_k with it                     */
    double lr, clip;    /* clip: max global gradient norm, 0 for none                                   */
    double scale;       /* QKV_SCALE_DEFAULT (-inf): 1/sqrt(d_k); else finite, used as given            */
    qkv_optim_kind optimizer;
    qkv_dtype dtype;
    int threads;
    qkv_allocator allocator; /* the context's allocator hooks; zero for malloc/free                       */
} copy_config;

/* The defaults of examples/copy_task. */
copy_config copy_default_config(void);
/* Fill derived fields (d_model for onehot, d_v) and check the configuration; on failure writes a
 * message into err and returns false. */
bool copy_config_resolve(copy_config *c, char *err, size_t err_size);
const char *copy_task_name(copy_task_kind t);
const char *copy_embed_name(copy_embed_kind e);

/* Largest precomputed embedding table, in elements (16 MiB of f32). */
#define EMBED_TABLE_MAX ((int64_t)1 << 22)

typedef struct copy_model {
    copy_config cfg;
    qkv_ctx *ctx;
    qkv_tensor *wq, *wk, *wv, *wo;    /* parameters (wo NULL without W^O)                         */
    qkv_tensor *token_table;          /* [V, d_model] fixed token embeddings                       */
    qkv_tensor *position_table;       /* [n, d_model] fixed position embeddings                    */
    qkv_tensor *embed_table;          /* [V n, d_model], row t n + i = token t at position i, in the
                                         model's dtype; NULL above EMBED_TABLE_MAX elements         */
    qkv_tensor *eval_tokens;          /* [eval_size, n] i32, the held-out set                      */
    qkv_optimizer *opt;
    int64_t step;                     /* steps taken so far                                        */
} copy_model;

typedef struct copy_stats {
    double loss;      /* mean cross-entropy of the step's batch                                     */
    double grad_norm; /* global gradient norm before clipping                                       */
} copy_stats;

/* Make the context, the fixed tables, the held-out set, the parameters and the optimizer.
 * Returns false with a message in err. */
bool copy_model_init(copy_model *m, const copy_config *cfg, char *err, size_t err_size);
void copy_model_free(copy_model *m);

/* One training step on the batch for step m->step (the batch depends only on the seed and the step
 * number, so a resumed run sees the same data). */
bool copy_train_step(copy_model *m, copy_stats *stats);

/* Token accuracy on the held-out set; attention, when not NULL, receives the n x n attention of held-out
 * sequence 0 (head 0); tokens, when not NULL, its n tokens. */
bool copy_evaluate(copy_model *m, double *accuracy, double *attention, int32_t *tokens);

/* Mean attention entropy (nats) over the held-out set's rows, head 0. */
bool copy_attention_entropy(copy_model *m, double *entropy);

/* Checkpoints (safetensors): parameters, optimizer state, and the configuration and step in the
 * metadata. Loading checks that the file's configuration matches. */
bool copy_save(copy_model *m, const char *path, char *err, size_t err_size);
bool copy_load(copy_model *m, const char *path, char *err, size_t err_size);

#endif
