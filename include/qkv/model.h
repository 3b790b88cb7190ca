/*
 * qkv/model.h — the model layer: small decoder-only transformers built from qkv's public operators
 * (included by qkv.h; include qkv.h, not this file).
 *
 * A model is token embedding (+ positions), n_layer pre-norm residual blocks, a final norm and an
 * unembedding. Block l, on the residual stream x [B, n, d_model]:
 *
 *   h = norm(x);  q, k, v = h W_Q (+ b_Q), h W_K (+ b_K), h W_V (+ b_V)  -> heads [B*n_head, n, d_head]
 *   q, k = qk_norm(q), qk_norm(k) (optional);  q, k = rope(q), rope(k) (positions = rope)
 *   z = softmax(softcap(scale q k^T), causal) v   (one fused qkv_attention, or qkv_attention_ex with the
 *                                                  soft-cap and attn_variant's weights inside the kernel)
 *   z = (A1 - lambda A2) v, normed per head       (attn_diff: differential attention, below)
 *   z = z * sigmoid(h W_G (+ b_G))               (attn_gate head or element: gated attention output)
 *   x = x + dropout(merge(z) W_O (+ b_O))       (the biases when attn_bias)
 *   x = x + dropout(act(norm(x) W_in + b_in) W_out + b_out)   (when d_mlp > 0)
 *   x = x + dropout((act(h W_gate) * (h W_in) + b_in) W_out + b_out), h = norm(x)   (swiglu, geglu)
 *
 * and logits = norm(x) W_U (or norm(x) W_E^T when tied: the final norm comes first either way). The backward
 * comes from the tape.
 *
 * Parameters (names as TransformerLens spells them; every weight is [d_in, d_out], so y = x W):
 *   embed.W_E            [vocab, d_model]
 *   pos_embed.W_pos      [n_ctx, d_model]           positions = learned only
 *   blocks.L.ln1.w, .b   [d_model]                  norm = layer (.w only for rms; none for none)
 *   blocks.L.attn.W_Q    [d_model, n_head*d_head]   head j owns columns j*d_head ... (j+1)*d_head-1
 *   blocks.L.attn.W_K, W_V [d_model, n_kv_head*d_head] (n_head*d_head unless grouped);
 *                        blocks.L.attn.W_O [n_head*d_head, d_model] (rows by head)
 *   blocks.L.attn.b_Q, b_O [d_model], b_K, b_V [n_kv_head*d_head]   attn_bias (TransformerLens's b_Q
 *                        [n_head, d_head] reshaped)
 *   blocks.L.attn.q_ln.w, k_ln.w [d_head]           qk_norm != off: one gain shared by the heads
 *   blocks.L.attn.sink   [n_head]                   attn_variant sink: each head's sink logit (0 at first)
 *   blocks.L.attn.ssmax_c [n_head]                  attn_variant ssmax: each head's factor c (1 at first)
 *   blocks.L.attn.lambda_q1, lambda_k1, lambda_q2, lambda_k2 [d_head / 2]   attn_diff: lambda's vectors,
 *                        N(0, 0.1^2) at first (the paper's code)
 *   blocks.L.attn.sub_ln.w [d_head]                 attn_diff: the per-head RMS norm's gain, shared by the heads
 *   blocks.L.attn.W_G    [d_model, n_head]          attn_gate head: column j gates head j;
 *                        [d_model, n_head*d_head]   attn_gate element: column c gates column c of merge(z)
 *   blocks.L.attn.b_G    [n_head] or [n_head*d_head]  attn_gate with attn_bias (0 at first)
 *                        (TransformerLens has no gate; the name follows its W_Q..W_O, G for gate, as the
 *                        paper's W_theta; the MLP's own gate is mlp.W_gate)
 *   blocks.L.ln2.w, .b   [d_model]                  d_mlp > 0 and norm != none
 *   blocks.L.mlp.W_in [d_model, d_mlp], b_in [d_mlp], W_out [d_mlp, d_model], b_out [d_model]
 *   blocks.L.mlp.W_gate  [d_model, d_mlp]           activation swiglu or geglu
 *   ln_final.w, .b       [d_model]
 *   unembed.W_U          [d_model, vocab]           unless tied (then logits = norm(x) W_E^T)
 * PyTorch's nn.Linear stores [d_out, d_in]: its weight is W.T. TransformerLens's per-head
 * W_Q [n_head, d_model, d_head] is W_Q.reshape(d_model, n_head, d_head).permute(1, 0, 2).
 *
 * Initialisation, by parameter group (the defaults are GPT-2's, as nanoGPT and TransformerLens's "gpt2" mode):
 *   embeddings      embed.W_E, pos_embed.W_pos                  N(0, init_embed_std^2)      (0.02)
 *   weight matrices W_Q, W_K, W_V, W_G, W_in, W_gate, W_U         N(0, init_std^2)            (0.02)
 *   residual outs   W_O, W_out                                    N(0, init_resid_std^2), GPT-2's
 *                   init_std / sqrt(2 n_layer) when init_resid_std < 0 (the default, -1)
 *   biases 0, norm gains 1; all from the context RNG reseeded with config.seed (the model is a function of
 *   its config). Toy models in the literature often start the embeddings at N(0, 1): init_embed_std = 1.
 *
 * Memory: parameters and the model are persistent (the context's allocator); a forward makes only step
 * tensors, so a training step allocates nothing on the heap after the first.
 */
#ifndef QKV_MODEL_H
#define QKV_MODEL_H

#include "../qkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which normalisation a model uses (config.norm, config.qk_norm). */
typedef enum qkv_norm_kind {
    QKV_NORM_NONE = 0,  /* no normalisation (the identity)            */
    QKV_NORM_LAYER,     /* qkv_layer_norm, with gamma and beta          */
    QKV_NORM_RMS,       /* qkv_rms_norm, with gamma                     */
    QKV_NORM_KIND_COUNT /* the number of kinds (not one)                */
} qkv_norm_kind;
/* How a model knows positions (config.positions). */
typedef enum qkv_positions_kind {
    QKV_POS_LEARNED = 0, /* a trained table pos_embed.W_pos added to the token embedding */
    QKV_POS_SINUSOIDAL,  /* the fixed qkv_sinusoidal_positions table added                */
    QKV_POS_ROPE,        /* qkv_rope on q and k of every layer (base config.rope_base)    */
    QKV_POS_NONE,        /* no position information (a causal mask still orders tokens)   */
    QKV_POS_KIND_COUNT   /* the number of kinds (not one)                                  */
} qkv_positions_kind;
/* The MLP's activation (config.activation). */
typedef enum qkv_activation_kind {
    QKV_ACT_GELU = 0, /* exact erf GELU       */
    QKV_ACT_GELU_TANH, /* GPT-2's tanh GELU   */
    QKV_ACT_RELU,      /* max(x, 0)          */
    /* Gated MLPs (Shazeer 2020) with a third weight blocks.L.mlp.W_gate [d_model, d_mlp], as TransformerLens's
     * gated MLP: post = act(h W_gate) * (h W_in) + b_in, then post W_out + b_out. */
    QKV_ACT_SWIGLU,    /* act = SiLU, x sigmoid(x) (Llama's MLP)   */
    QKV_ACT_GEGLU,     /* act = exact erf GELU                     */
    QKV_ACT_KIND_COUNT /* the number of kinds (not one) */
} qkv_activation_kind;

/* Differential attention (config.attn_diff; Ye et al. 2024, "Differential Transformer", arXiv 2410.05258).
 * Each head's q and k [.., d_head] are split in halves q1 | q2, k1 | k2 of d_head / 2 (v stays whole); with
 * positions = rope each half is rotated on its own (as the paper's heads of d_head / 2). For block l (0-based):
 *   A1 = softmax(scale q1 k1^T), A2 = softmax(scale q2 k2^T)     (causal as the model; two fused kernels)
 *   lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init,
 *   lambda_init = 0.8 - 0.6 exp(-0.3 l)                           (the paper's l - 1 for its 1-based l)
 *   z = rms_norm((A1 - lambda A2) v, sub_ln.w) (1 - lambda_init)  (the norm over each head's d_head, eps norm_eps,
 *                                                                  with a gain shared by the heads, as the
 *                                                                  paper's code's RMSNorm "subln")
 * scale: QKV_SCALE_DEFAULT is 1/sqrt(d_head / 2) (the width of q1 . k1, as the paper); a set attn_scale is used
 * as given. Needs d_head even (a multiple of 4 with rope); refused with attn_variant other than softmax, a
 * soft-cap or a user's weights. Hook points: hook_pattern is A1 - lambda A2 (a replacement A' gives z = A' v
 * before the norm), hook_z the normed (and gated) z; there is no hook_attn_scores (two score matrices), and
 * qkv_model_inspect's SCORES is refused. Grouped-query attention, the gate and the sampling cache combine. */

/* Gated attention output (config.attn_gate; Qiu et al. 2025, "Gated Attention for Large Language Models",
 * arXiv 2505.06708, their best variant G1: a sigmoid gate on the attention's output before W_O, computed from
 * the same normed input h the projections read). Per block, with z the heads' output [B*n_head, n, d_head]:
 *   QKV_GATE_NONE     z as it is (no W_G)
 *   QKV_GATE_HEAD     g = sigmoid(h W_G + b_G) [B, n, n_head], one gate per head and position, broadcast over
 *                     d_head: z[b*H + j, i, :] *= g[b, i, j]            (the paper's "headwise")
 *   QKV_GATE_ELEMENT  g = sigmoid(h W_G + b_G) [B, n, d_model], one gate per element of merge(z):
 *                     merge(z)[b, i, c] *= g[b, i, c]                    (the paper's "elementwise")
 * The gated z is what W_O reads, and it is the value at blocks.L.attn.hook_z (qkv/hooks.h); the gate itself
 * is at blocks.L.attn.hook_gate. */
typedef enum qkv_attn_gate_kind {
    QKV_GATE_NONE = 0,  /* no gate                                           */
    QKV_GATE_HEAD,      /* one gate per head: W_G [d_model, n_head]           */
    QKV_GATE_ELEMENT,   /* one gate per element of z: W_G [d_model, d_model]  */
    QKV_GATE_KIND_COUNT /* the number of kinds (not one)                      */
} qkv_attn_gate_kind;

/* A user's attention weights in place of the softmax (config.attn_weights; docs/extending.md builds one):
 *   scores  [B*n_head, n, n]  scale q k^T of one layer, after qk-norm, rope and any soft-cap
 *   mask    u8 [n, n], 1 where query i may see key j (j <= i in a causal forward); NULL when every position
 *           sees every other (flags 0)
 *   returns [B*n_head, n, n] weights of the scores' dtype, z = weights v. Build them from qkv operators or a
 *           user-defined operator (qkv/custom.h) so gradients flow. A causal forward checks that every masked
 *           weight is 0 (a model that sees the future is refused, QKV_ERR_NUMERIC naming the layer). On failure
 *           return NULL with an error stored (a failing qkv call does that; or qkv_set_error). */
typedef qkv_tensor *(*qkv_attn_weights_fn)(qkv_ctx *ctx, qkv_tensor *scores, const qkv_tensor *mask, void *user);

/* The whole description of a model. Start from qkv_model_default_config() and change fields; every field is
 * checked by qkv_model_new with a message naming it. */
typedef struct qkv_model_config {
    int64_t vocab;            /* tokens are 0 .. vocab-1                               default 256  */
    int64_t n_ctx;            /* longest sequence                                      default 128  */
    int64_t d_model;          /* residual width                                        default 128  */
    int64_t n_layer;          /* blocks, >= 1                                          default 2    */
    int64_t n_head;           /* heads per block; d_head = d_model / n_head            default 4    */
    int64_t n_kv_head;        /* key/value heads, dividing n_head (grouped-query attention; 1 = multi-query),
                               * query head h reading key/value head h / (n_head / n_kv_head), in place in
                               * the fused attention (qkv_attention_options.kv_heads); 0 = n_head
                               * (every head its own)                                  default 0    */
    int64_t d_mlp;            /* MLP hidden width; 0 = attention-only                  default 512  */
    qkv_norm_kind norm;       /* ln1, ln2, ln_final                                    default layer */
    qkv_positions_kind positions; /*                                                   default learned */
    qkv_norm_kind qk_norm;    /* per-head norm of q and k before the scores            default none */
    double attn_scale;        /* QKV_SCALE_DEFAULT: 1/sqrt(d_head); else any finite    default that */
    double attn_softcap;      /* scores become cap tanh(s / cap); 0 = off              default 0    */
    bool tied_embeddings;     /* logits = norm(x) W_E^T, not norm(x) W_U                  default false */
    double dropout;           /* after the embedding, attention and MLP; [0, 1)        default 0    */
    qkv_activation_kind activation; /* MLP activation (swiglu, geglu: gated)            default gelu */
    bool attn_bias;           /* biases b_Q, b_K, b_V, b_O [d_model] (GPT-2's)        default false */
    qkv_attn_variant attn_variant; /* the attention's weights (qkv/attention.h): softmax, softmax1, sink
                               * (a trained logit per head, blocks.L.attn.sink [n_head], initially 0),
                               * sigmoid (bias -log(n_ctx), fixed per model so that a cached step and a
                               * rerun agree), ssmax (blocks.L.attn.ssmax_c [n_head], initially 1),
                               * softpick (eps 1e-6); one fused kernel each, attn_softcap capping the
                               * scores they see. Only the softmax combines with attn_weights
                               *                                                     default softmax */
    qkv_attn_gate_kind attn_gate; /* gate on the attention's output (above): none, head or element; combines
                               * with every attn_variant, soft-cap and user's weights  default none */
    bool attn_diff;           /* differential attention (above): blocks.L.attn.lambda_* and sub_ln.w
                               *                                                     default false */
    double norm_eps;          /* eps of every norm, > 0                                default 1e-5 */
    double init_std;          /* std of the weight matrices, finite >= 0 (above)      default 0.02 */
    double init_embed_std;    /* std of W_E and W_pos, finite >= 0                     default 0.02 */
    double init_resid_std;    /* std of W_O and W_out; < 0: init_std / sqrt(2 n_layer)  default -1   */
    double rope_base;         /* > 1                                                   default 10000 */
    qkv_dtype dtype;          /* f32 or f64                                            default f32  */
    uint64_t seed;            /* initialisation seed                                   default 0    */
    /* A user's attention weights (see qkv_attn_weights_fn); NULL = the softmax.       default NULL
     * attn_weights_name names it (1-63 printable characters, not "softmax"; required with it, the model keeps a
     * copy): checkpoints record it as qkv.model.attn_weights, and qkv_model_load refuses such a checkpoint
     * (it cannot rebuild a C function): make the model with qkv_model_new and the function, then
     * qkv_model_restore, which checks that the names agree. */
    qkv_attn_weights_fn attn_weights;
    void *attn_weights_user;       /* handed to attn_weights                        default NULL */
    const char *attn_weights_name; /*                                                default NULL */
} qkv_model_config;

/* The documented defaults of every field (the column on the right above). */
QKV_API qkv_model_config qkv_model_default_config(void);
/* Check cfg as qkv_model_new does (QKV_OK, or the error stored in ctx naming the field and its value). */
QKV_API qkv_status qkv_model_config_check(qkv_ctx *ctx, const qkv_model_config *cfg);
/* Names used in checkpoints and messages: "none" "layer" "rms"; "learned" "sinusoidal" "rope" "none";
 * "gelu" "gelu_tanh" "relu" "swiglu" "geglu"; "none" "head" "element". NULL for a value out of range. */
QKV_API const char *qkv_norm_kind_name(qkv_norm_kind kind);
QKV_API const char *qkv_positions_kind_name(qkv_positions_kind kind);
QKV_API const char *qkv_activation_kind_name(qkv_activation_kind kind);
QKV_API const char *qkv_attn_gate_kind_name(qkv_attn_gate_kind kind);

/* A model: its configuration and parameters (opaque; qkv_model_new, qkv_model_load). */
typedef struct qkv_model qkv_model;

/* A new model with freshly initialised parameters (persistent tensors of ctx). NULL on error. */
QKV_API qkv_model *qkv_model_new(qkv_ctx *ctx, const qkv_model_config *cfg);
/* Release the model and its parameters. Call before qkv_ctx_free, or not at all (qkv_ctx_free releases
 * everything). NULL is a no-op. */
QKV_API void qkv_model_free(qkv_model *m);
QKV_API const qkv_model_config *qkv_model_get_config(const qkv_model *m);

/* The parameters in a fixed order (embedding, blocks in order, final norm, unembedding) and their names;
 * both arrays belong to the model. Pass them to qkv_optim_new (params, and names as param_names). */
QKV_API int qkv_model_param_count(const qkv_model *m);
QKV_API qkv_tensor *const *qkv_model_params(const qkv_model *m);
QKV_API const char *const *qkv_model_param_names(const qkv_model *m);
/* A parameter by name, or NULL (no error) when the model has none of that name. */
QKV_API qkv_tensor *qkv_model_param(const qkv_model *m, const char *name);
/* Total number of parameter elements. */
QKV_API int64_t qkv_model_param_elements(const qkv_model *m);

/* logits [B, n, vocab] for i32 ids [B, n] (or [n]: logits [n, vocab]); n <= n_ctx, every id in
 * [0, vocab). flags: QKV_CAUSAL (a decoder), or 0 (every position sees every other). Dropout applies
 * only while gradient recording is on (qkv_set_grad_enabled). */
QKV_API qkv_tensor *qkv_model_forward(qkv_ctx *ctx, qkv_model *m, const qkv_tensor *ids, int flags);

/* Next-token targets for ids [B, n] (or [n]): t[.., i] = ids[.., i+1], and -1 (ignored) at the last
 * position. An i32 step tensor of ids's shape. */
QKV_API qkv_tensor *qkv_next_token_targets(qkv_ctx *ctx, const qkv_tensor *ids);
/* Mean cross-entropy (nats per token) of logits [.., vocab] against targets (negative = ignored): the
 * training loss. The same as qkv_cross_entropy, named for the model's use. */
QKV_API qkv_tensor *qkv_model_loss(qkv_ctx *ctx, qkv_tensor *logits, const qkv_tensor *targets);

/* ---- inspection and ablation (interpretability) ------------------------------------------------- */

/* What a forward can leave behind, per layer (TransformerLens's hook names in brackets):
 *   RESID_PRE   [B, n, d_model]        the residual stream into block l      (blocks.l.hook_resid_pre)
 *   RESID_MID   [B, n, d_model]        after the attention's residual add    (blocks.l.hook_resid_mid)
 *   RESID_POST  [B, n, d_model]        out of block l                        (blocks.l.hook_resid_post)
 *   PATTERN     [B*n_head, n, n]       attention weights; batch b head j is b*n_head + j
 *                                                                            (blocks.l.attn.hook_pattern)
 *   HEAD_OUT    [B*n_head, n, d_head]  each head's output z before W_O, after any head ablation below
 *                                                                            (blocks.l.attn.hook_z)
 *   SCORES      [B*n_head, n, n]       the attention logits scale q k^T, after qk-norm and rope and
 *                                      before any soft-cap and the softmax    (blocks.l.attn.hook_attn_scores)
 * (for an unbatched forward B is 1.) SCORES holds every (i, j), also those a causal forward masks
 * (j > i), which the softmax never reads. Read it, do not build a loss on it: without a soft-cap it is
 * computed (only when inspected) with gradient recording off. A model with attn_diff has no SCORES (two score
 * matrices; QKV_ERR_STATE) and its PATTERN is A1 - lambda A2. */
typedef enum qkv_inspect_kind {
    QKV_INSPECT_RESID_PRE = 0,
    QKV_INSPECT_RESID_MID,
    QKV_INSPECT_RESID_POST,
    QKV_INSPECT_PATTERN,
    QKV_INSPECT_HEAD_OUT,
    QKV_INSPECT_SCORES,
    QKV_INSPECT_KIND_COUNT
} qkv_inspect_kind;

/* (Inspection is a reader of the hook points of qkv/hooks.h: the tensors are the cache's values there.)
 * Keep the tensors above in every later forward (off by default; off costs nothing: no attention matrix
 * is formed when the fused kernel is used). Returns the previous setting. */
QKV_API bool qkv_model_set_inspect(qkv_model *m, bool on);
/* The tensor of the last forward (a step tensor: valid until qkv_step_end), or NULL with QKV_ERR_STATE
 * when inspection was off or no forward ran since the last step end, QKV_ERR_ARG for a bad layer/kind. */
QKV_API qkv_tensor *qkv_model_inspect(qkv_ctx *ctx, const qkv_model *m, qkv_inspect_kind what, int64_t layer);

/* Ablation of one head's output z, in every later forward until cleared (a writer at the hook point
 * blocks.L.attn.hook_z of qkv/hooks.h, after any hook or patch there; qkv_model_ablate ablates at any point):
 *   ZERO  z of that head is 0
 *   MEAN  z of that head is replaced, at every position, by its mean over the batch and positions of the
 *         same forward (computed from that forward's values, with no gradient through the mean)
 *   NONE  the head runs as trained. */
/* (RESAMPLE, a value from another batch, is for qkv_model_ablate of qkv/hooks.h, which ablates at any hook point;
 * qkv_model_ablate_head refuses it.) */
typedef enum qkv_ablation_kind {
    QKV_ABLATE_NONE = 0,
    QKV_ABLATE_ZERO,
    QKV_ABLATE_MEAN,
    QKV_ABLATE_RESAMPLE,
    QKV_ABLATE_KIND_COUNT
} qkv_ablation_kind;
QKV_API qkv_status qkv_model_ablate_head(qkv_ctx *ctx, qkv_model *m, int64_t layer, int64_t head,
                                         qkv_ablation_kind kind);
QKV_API void qkv_model_clear_ablations(qkv_model *m);

/* ---- checkpoints -------------------------------------------------------------------------------- */

/* Write the parameters under their names, the configuration in the metadata (keys "qkv.model.<field>",
 * enums by name, numbers exactly), and, when opt is not NULL, the optimizer's state under "optim.<name>"
 * (see qkv_optim_state). extra holds 2 * n_extra strings (key, value, ...) of the caller's own metadata
 * (keys must not start with "qkv."). Atomic: the file is complete or absent. */
QKV_API qkv_status qkv_model_save(qkv_ctx *ctx, const qkv_model *m, const char *path, qkv_optimizer *opt,
                                  const char *const *extra, int n_extra);
/* The configuration a checkpoint holds (QKV_ERR_FORMAT naming the key when one is missing or malformed). For a
 * model with a user's attention weights, cfg->attn_weights_name points into st's metadata (valid while st is)
 * and cfg->attn_weights is NULL: set the function before qkv_model_new. */
QKV_API qkv_status qkv_model_config_from_checkpoint(qkv_ctx *ctx, const qkv_safetensors *st,
                                                    qkv_model_config *cfg);
/* Copy a checkpoint into m (and its optimizer state into opt, when not NULL). The checkpoint's
 * configuration must equal m's (QKV_ERR_ARG naming the field and both values), and every parameter must
 * be present with m's dtype and shape (the message names the tensor and both shapes). Everything is
 * checked before anything is copied: on failure m and opt are unchanged. */
QKV_API qkv_status qkv_model_restore(qkv_ctx *ctx, qkv_model *m, const qkv_safetensors *st, qkv_optimizer *opt);
/* A new model of the checkpoint's configuration holding its parameters (the two calls above). A checkpoint of
 * a model with a user's attention weights (qkv.model.attn_weights other than "softmax") is QKV_ERR_ARG naming
 * the function: rebuild it with qkv_model_new and qkv_model_restore. */
QKV_API qkv_model *qkv_model_load(qkv_ctx *ctx, const char *path);

/* ---- sampling ----------------------------------------------------------------------------------- */

/* How qkv_model_sample picks each token. */
typedef struct qkv_sample_options {
    double temperature; /* 0: greedy (argmax, the lowest id on ties); > 0: softmax(logits / T)      */
    int64_t top_k;      /* 0: every token; k > 0: only the k most likely (ties by lower id)          */
} qkv_sample_options;

/* Extend prompt (n_prompt >= 1 ids) by n_new tokens with the causal model, written to out[0 .. n_new-1].
 * Each token comes from the model on the last min(n, n_ctx) tokens with recording off, drawn from the context
 * RNG (reseed it with qkv_seed for a reproducible sample). While prompt and output fit in n_ctx a key/value
 * cache serves it: the keys and values of every layer (n_layer x 2 x [n_head, n_ctx, d_head], kept with the
 * model and reused by later calls) are computed once per position, so a token costs O(n) and not the O(n^2) of
 * a rerun; the logits are those of the rerun up to rounding. Once the window slides (every position moves),
 * with a user's attention weights, with a mean-ablated head, or with the cache turned off
 * (qkv_model_set_sample_cache), each token reruns the window. The step arena is returned to where it was. */
QKV_API qkv_status qkv_model_sample(qkv_ctx *ctx, qkv_model *m, const int32_t *prompt, int64_t n_prompt,
                                    int64_t n_new, const qkv_sample_options *options, int32_t *out);
/* Sample with the key/value cache (on, the default) or by rerunning the window every token (off: to compare
 * the two, or to time the difference). Returns the previous setting; false for a NULL model. */
QKV_API bool qkv_model_set_sample_cache(qkv_model *m, bool on);

#ifdef __cplusplus
}
#endif

#endif /* QKV_MODEL_H */
