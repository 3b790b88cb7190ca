/*
 * model_internal.h — what the model layer's files share: the model's struct (its parameters by role and
 * by name, the inspection slots, the ablation switches) and the configuration's metadata helpers.
 */
#ifndef QKV_MODEL_INTERNAL_H
#define QKV_MODEL_INTERNAL_H

#include "qkv_internal.h"

#define QKV_MODEL_FORMAT_KEY "qkv.format"
#define QKV_MODEL_FORMAT "qkv-model-1"
/* A user's attention-weights name: 1 to QKV_MODEL_ATTN_NAME_MAX printable ASCII characters, not "softmax". */
#define QKV_MODEL_ATTN_NAME_MAX 63

/* One block's parameters (NULL where the configuration has none). */
typedef struct qkv_model_block_ {
    qkv_tensor *ln1_w, *ln1_b;
    qkv_tensor *W_Q, *W_K, *W_V, *W_O;
    qkv_tensor *q_ln_w, *k_ln_w;
    qkv_tensor *ln2_w, *ln2_b;
    qkv_tensor *W_in, *b_in, *W_out, *b_out;
    qkv_tensor *W_gate;             /* gated activations (swiglu, geglu) */
    qkv_tensor *b_Q, *b_K, *b_V, *b_O; /* attn_bias */
    qkv_ablation_kind *ablation; /* [n_head] */
} qkv_model_block_;

struct qkv_model {
    qkv_ctx *ctx;
    qkv_model_config cfg;
    int64_t d_head;
    double scale; /* the attention scale resolved: 1/sqrt(d_head) for QKV_SCALE_DEFAULT */

    qkv_tensor *W_E, *W_pos, *W_U, *lnf_w, *lnf_b;
    qkv_tensor *sin_table; /* [n_ctx, d_model], kept (no gradient), for sinusoidal positions */
    qkv_model_block_ *blocks;

    int n_params;
    qkv_tensor **params;
    char **names;

    bool inspect;
    uint32_t inspected_epoch; /* ctx->epoch of the forward that filled `inspected`, 0 for none */
    qkv_tensor **inspected;   /* [n_layer * QKV_INSPECT_KIND_COUNT] */
    bool any_ablation;
    char attn_weights_name[QKV_MODEL_ATTN_NAME_MAX + 1]; /* cfg.attn_weights_name points here (or is NULL) */
    /* The key/value cache of sampling (model/sample.c): per layer, kept [n_head, n_ctx, d_head] tensors of the
     * model's dtype holding k (after qk-norm and rope) and v of positions 0 .. cache_len-1; made at the first
     * cached sampling and reused by later ones. */
    qkv_tensor **cache_k, **cache_v;
    int64_t cache_len;
    bool no_sample_cache; /* qkv_model_set_sample_cache(m, false) */
};

/* Where a forward stands with the key/value cache (model/model.c, model/sample.c). */
typedef enum {
    QKV_CACHE_OFF_ = 0, /* an ordinary forward                                                       */
    QKV_CACHE_FILL_,    /* ids [1, n] at positions 0 .. n-1: run causally, store every k and v       */
    QKV_CACHE_STEP_,    /* ids [1, 1] at position cache_len: store its k and v, attend to all cached */
} qkv_cache_mode_;
/* The forward of qkv_model_forward for one sequence ids2 [1, n] with the cache (recording off, causal); logits
 * [1, n, vocab]. Refuses a configuration the cache does not serve (see qkv_model_cache_serves_). */
qkv_tensor *qkv_model_forward_cached_(qkv_ctx *ctx, qkv_model *m, qkv_tensor *ids2, qkv_cache_mode_ mode);
/* The cache gives qkv_model_forward's logits for this model: not with a user's attention weights (they take
 * square scores) or a mean ablation (its mean is over the forward's positions). */
bool qkv_model_cache_serves_(const qkv_model *m);

qkv_status qkv_model_config_check_(qkv_ctx *ctx, const char *fn, const qkv_model_config *cfg);
bool qkv_model_attn_name_ok_(const char *name);
bool qkv_model_scale_is_default_(double scale);
qkv_model *qkv_model_new_(qkv_ctx *ctx, const char *fn, const qkv_model_config *cfg);

/* The configuration's fields, in checkpoint order: count, name, value as text (exact), and the first field
 * in which two configurations differ (-1 if none). */
int qkv_model_config_field_count_(void);
const char *qkv_model_config_field_name_(int i);
void qkv_model_config_field_str_(const qkv_model_config *c, int i, char *buf, size_t size);
int qkv_model_config_diff_(const qkv_model_config *a, const qkv_model_config *b);
qkv_status qkv_model_config_from_metadata_(qkv_ctx *ctx, const char *fn, const qkv_safetensors *st,
                                           qkv_model_config *cfg);

#endif /* QKV_MODEL_INTERNAL_H */
