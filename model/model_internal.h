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

/* The kinds of hook point (include/qkv/hooks.h lists them with their shapes). Kinds up to
 * QKV_HOOK_LAYER_KINDS_ exist once per block (slot layer * QKV_HOOK_KIND_COUNT_ + kind); the rest once per
 * model (slot n_layer * QKV_HOOK_KIND_COUNT_ + kind). QKV_HOOK_SCORES_RAW_ is private: the scores before any
 * soft-cap and unmasked, which qkv_model_inspect's QKV_INSPECT_SCORES has always given. */
typedef enum {
    QKV_HOOK_RESID_PRE_ = 0, QKV_HOOK_LN1_SCALE_, QKV_HOOK_LN1_NORMALIZED_, QKV_HOOK_Q_, QKV_HOOK_K_, QKV_HOOK_V_,
    QKV_HOOK_ROT_Q_, QKV_HOOK_ROT_K_, QKV_HOOK_SCORES_RAW_, QKV_HOOK_ATTN_SCORES_, QKV_HOOK_PATTERN_, QKV_HOOK_GATE_, QKV_HOOK_Z_,
    QKV_HOOK_ATTN_OUT_, QKV_HOOK_RESID_MID_, QKV_HOOK_LN2_SCALE_, QKV_HOOK_LN2_NORMALIZED_, QKV_HOOK_MLP_PRE_,
    QKV_HOOK_MLP_PRE_LINEAR_, QKV_HOOK_MLP_POST_, QKV_HOOK_MLP_OUT_, QKV_HOOK_RESID_POST_,
    QKV_HOOK_LAYER_KINDS_,
    QKV_HOOK_EMBED_ = QKV_HOOK_LAYER_KINDS_, QKV_HOOK_POS_EMBED_, QKV_HOOK_LNF_SCALE_, QKV_HOOK_LNF_NORMALIZED_,
    QKV_HOOK_KIND_COUNT_
} qkv_hook_kind_;

/* What a slot has: consumers (want bits) and, for a hook, the function or the patch/ablation it runs. */
enum { QKV_WANT_CACHE_ = 1, QKV_WANT_INSPECT_ = 2, QKV_WANT_HOOK_ = 4, QKV_WANT_ABLATE_HEADS_ = 8 };
typedef struct qkv_hook_slot_ {
    uint8_t want;
    qkv_hook_fn fn;  /* a user's hook, or NULL for a patch/ablation (ablation != NONE) */
    void *user;
    qkv_ablation_kind ablation; /* NONE: fn; ZERO, MEAN, RESAMPLE (qkv_model_patch is RESAMPLE)       */
    int64_t pos, head;          /* where the patch/ablation applies, -1 for all                        */
    const qkv_tensor *source;   /* RESAMPLE: the values patched in                                      */
} qkv_hook_slot_;

/* One block's parameters (NULL where the configuration has none). */
typedef struct qkv_model_block_ {
    qkv_tensor *ln1_w, *ln1_b;
    qkv_tensor *W_Q, *W_K, *W_V, *W_O;
    qkv_tensor *q_ln_w, *k_ln_w;
    qkv_tensor *ln2_w, *ln2_b;
    qkv_tensor *W_in, *b_in, *W_out, *b_out;
    qkv_tensor *W_gate;             /* gated activations (swiglu, geglu) */
    qkv_tensor *b_Q, *b_K, *b_V, *b_O; /* attn_bias */
    qkv_tensor *sink, *ssmax_c;        /* attn_variant sink, ssmax: [n_head] per-head parameters */
    qkv_tensor *W_G, *b_G;             /* attn_gate: [d_model, n_head or d_model], b_G with attn_bias */
    qkv_tensor *lambda_q1, *lambda_k1, *lambda_q2, *lambda_k2; /* attn_diff: [d_head / 2] each */
    qkv_tensor *sub_ln_w;              /* attn_diff: the per-head RMS norm's gain [d_head] */
    double lambda_init;                /* attn_diff: 0.8 - 0.6 exp(-0.3 l) */
    qkv_ablation_kind *ablation; /* [n_head]: qkv_model_ablate_head's switches, run at blocks.L.attn.hook_z */
} qkv_model_block_;

struct qkv_model {
    qkv_ctx *ctx;
    qkv_model_config cfg;
    int64_t d_head;
    int64_t n_kv_head; /* cfg.n_kv_head resolved: n_head when 0 */
    double scale; /* the attention scale resolved: 1/sqrt(d_head) for QKV_SCALE_DEFAULT */

    qkv_tensor *W_E, *W_pos, *W_U, *lnf_w, *lnf_b;
    qkv_tensor *sin_table; /* [n_ctx, d_model], kept (no gradient), for sinusoidal positions */
    qkv_model_block_ *blocks;

    int n_params;
    qkv_tensor **params;
    char **names;

    bool inspect;
    /* The hook points (model/hooks.c): slot qkv_hook_slot_index_(m, layer, kind); the forward tests hooks_on
     * once per point and does nothing more when it is false. */
    bool hooks_on;               /* some slot has a consumer (want != 0)                          */
    int n_hook_slots;            /* (n_layer + 1) * QKV_HOOK_KIND_COUNT_                            */
    qkv_hook_slot_ *hook_slots;  /* [n_hook_slots]                                                  */
    qkv_tensor **hook_values;    /* [n_hook_slots]: the last forward's kept values                  */
    uint32_t hook_epoch;         /* ctx->epoch of the forward that filled hook_values, 0 for none    */
    bool hooks_no_keep;          /* sampling: hooks run, nothing is kept (its steps are rewound)     */
    int n_hook_points;           /* the points this configuration has, in forward order:           */
    int *hook_point_slot;        /* [n_hook_points] their slots                                    */
    char **hook_slot_name;       /* [n_hook_slots] each slot's name (NULL where the model has none) */
    char attn_weights_name[QKV_MODEL_ATTN_NAME_MAX + 1]; /* cfg.attn_weights_name points here (or is NULL) */
    /* The key/value cache of sampling (model/sample.c): per layer, kept [n_kv_head, n_ctx, d_head] tensors of the
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

/* The hook machinery (model/hooks.c). */
bool qkv_model_hooks_new_(qkv_model *m, const char *fn);
void qkv_model_hooks_free_(qkv_model *m);
static inline int qkv_hook_slot_index_(const qkv_model *m, int64_t layer, qkv_hook_kind_ kind) {
    return (int)((kind < QKV_HOOK_LAYER_KINDS_ ? layer : m->cfg.n_layer) * QKV_HOOK_KIND_COUNT_ + kind);
}
/* Some consumer wants the point (the forward forms optional values only then). */
static inline bool qkv_hook_wanted_(const qkv_model *m, int64_t layer, qkv_hook_kind_ kind) {
    return m->hooks_on && m->hook_slots[qkv_hook_slot_index_(m, layer, kind)].want;
}
/* The slot has a hook that may replace the value. */
static inline bool qkv_hook_replaces_(const qkv_model *m, int64_t layer, qkv_hook_kind_ kind) {
    return m->hooks_on && (m->hook_slots[qkv_hook_slot_index_(m, layer, kind)].want & QKV_WANT_HOOK_);
}
/* Run the point's consumers on t: a hook's replacement (checked) or t; kept for the cache/inspection. */
qkv_tensor *qkv_model_hook_run_(qkv_ctx *ctx, qkv_model *m, int slot, qkv_tensor *t);
/* The forward's hook site: one test when nothing is set. */
static inline qkv_tensor *qkv_hook_(qkv_ctx *ctx, qkv_model *m, int64_t layer, qkv_hook_kind_ kind, qkv_tensor *t) {
    if (!m->hooks_on || !t) return t;
    return qkv_model_hook_run_(ctx, m, qkv_hook_slot_index_(m, layer, kind), t);
}
/* Recompute hooks_on from the slots. */
void qkv_model_hooks_update_(qkv_model *m);
/* Put every slot aside (a copy in the step arena, NULL on failure) and clear them, for a function that runs its
 * own forwards (the patching sweep, the logit lens, attribution); restore puts them back. */
qkv_hook_slot_ *qkv_model_hooks_suspend_(qkv_ctx *ctx, qkv_model *m, const char *fn);
void qkv_model_hooks_restore_(qkv_model *m, const qkv_hook_slot_ *saved);
/* Select one point for the cache. */
qkv_status qkv_model_hook_keep_(qkv_model *m, int64_t layer, qkv_hook_kind_ kind);

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
