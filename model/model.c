/*
 * model.c — a decoder-only transformer from qkv's public operators: construction and initialisation, the
 * parameters by name, the forward (embedding, blocks, final norm, unembedding), inspection and ablation.
 *
 *   ids [B, n] -> x = W_E[ids] (+ positions) [B, n, d_model] -> blocks -> norm -> logits [B, n, vocab]
 *
 * Every step below is one qkv_* operator call, so the backward is the tape's.
 */
#include "model_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>

/* ---- construction ---------------------------------------------------------------------------------- */

/* Append a parameter initialised from init (a step tensor) under a printf-made name. */
static qkv_tensor *add_param(qkv_model *m, const char *fn, qkv_tensor *init, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static qkv_tensor *add_param(qkv_model *m, const char *fn, qkv_tensor *init, const char *fmt, ...) {
    qkv_ctx *ctx = m->ctx;
    if (!init) return NULL;
    char name[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    size_t len = strlen(name) + 1;
    char *copy = qkv_persistent_alloc_(ctx, fn, len);
    if (!copy) return NULL;
    memcpy(copy, name, len);
    qkv_tensor *p = qkv_param(ctx, init);
    if (!p) {
        qkv_persistent_free_(ctx, copy);
        return NULL;
    }
    m->params[m->n_params] = p;
    m->names[m->n_params] = copy;
    m->n_params++;
    return p;
}

static qkv_tensor *normal(qkv_ctx *ctx, qkv_dtype dt, int64_t rows, int64_t cols, double std) {
    return qkv_randn(ctx, dt, 2, (int64_t[]){rows, cols}, 0.0, std);
}
static qkv_tensor *constant(qkv_ctx *ctx, qkv_dtype dt, int64_t n, double value) {
    return qkv_full(ctx, dt, 1, (int64_t[]){n}, value);
}

/* The parameters of a norm of width d: gain (always) and bias (layer norm only). */
static bool add_norm(qkv_model *m, const char *fn, qkv_norm_kind kind, int64_t d, qkv_tensor **w, qkv_tensor **b,
                     const char *prefix) {
    if (kind == QKV_NORM_NONE) return true;
    *w = add_param(m, fn, constant(m->ctx, m->cfg.dtype, d, 1.0), "%s.w", prefix);
    if (!*w) return false;
    if (kind == QKV_NORM_LAYER && b) {
        *b = add_param(m, fn, constant(m->ctx, m->cfg.dtype, d, 0.0), "%s.b", prefix);
        if (!*b) return false;
    }
    return true;
}

/* A bound on the parameters a configuration makes: embeddings 2, per block at most 27 (norms 4, W_Q..W_O 4, their
 * biases 4, qk-norms 2, the MLP's 5, a variant's per-head parameter 1, differential attention's 5, the output
 * gate's 2), final norm 2, unembedding 1. */
static int max_params(const qkv_model_config *c) { return (int)(8 + 32 * c->n_layer); }

static bool build_parameters(qkv_model *m, const char *fn) {
    const qkv_model_config *c = &m->cfg;
    qkv_ctx *ctx = m->ctx;
    qkv_dtype dt = c->dtype;
    const double std = c->init_std, embed_std = c->init_embed_std;
    const double resid_std = c->init_resid_std >= 0 ? c->init_resid_std : c->init_std / sqrt(2.0 * (double)c->n_layer);
    int64_t d = c->d_model;
    char prefix[64];

    m->W_E = add_param(m, fn, normal(ctx, dt, c->vocab, d, embed_std), "embed.W_E");
    if (!m->W_E) return false;
    if (c->positions == QKV_POS_LEARNED) {
        m->W_pos = add_param(m, fn, normal(ctx, dt, c->n_ctx, d, embed_std), "pos_embed.W_pos");
        if (!m->W_pos) return false;
    }
    for (int64_t l = 0; l < c->n_layer; l++) {
        qkv_model_block_ *b = &m->blocks[l];
        snprintf(prefix, sizeof prefix, "blocks.%" PRId64 ".ln1", l);
        if (!add_norm(m, fn, c->norm, d, &b->ln1_w, &b->ln1_b, prefix)) return false;
        b->W_Q = add_param(m, fn, normal(ctx, dt, d, d, std), "blocks.%" PRId64 ".attn.W_Q", l);
        int64_t d_kv = m->n_kv_head * m->d_head; // d_model unless grouped
        b->W_K = add_param(m, fn, normal(ctx, dt, d, d_kv, std), "blocks.%" PRId64 ".attn.W_K", l);
        b->W_V = add_param(m, fn, normal(ctx, dt, d, d_kv, std), "blocks.%" PRId64 ".attn.W_V", l);
        b->W_O = add_param(m, fn, normal(ctx, dt, d, d, resid_std), "blocks.%" PRId64 ".attn.W_O", l);
        if (!b->W_Q || !b->W_K || !b->W_V || !b->W_O) return false;
        if (c->attn_bias) {
            b->b_Q = add_param(m, fn, constant(ctx, dt, d, 0.0), "blocks.%" PRId64 ".attn.b_Q", l);
            b->b_K = add_param(m, fn, constant(ctx, dt, d_kv, 0.0), "blocks.%" PRId64 ".attn.b_K", l);
            b->b_V = add_param(m, fn, constant(ctx, dt, d_kv, 0.0), "blocks.%" PRId64 ".attn.b_V", l);
            b->b_O = add_param(m, fn, constant(ctx, dt, d, 0.0), "blocks.%" PRId64 ".attn.b_O", l);
            if (!b->b_Q || !b->b_K || !b->b_V || !b->b_O) return false;
        }
        if (c->attn_variant == QKV_ATTN_SINK) {
            b->sink = add_param(m, fn, constant(ctx, dt, c->n_head, 0.0), "blocks.%" PRId64 ".attn.sink", l);
            if (!b->sink) return false;
        }
        if (c->attn_variant == QKV_ATTN_SSMAX) {
            b->ssmax_c = add_param(m, fn, constant(ctx, dt, c->n_head, 1.0), "blocks.%" PRId64 ".attn.ssmax_c", l);
            if (!b->ssmax_c) return false;
        }
        if (c->attn_diff) { // differential attention: lambda's four vectors N(0, 0.1^2), the per-head norm's gain
            int64_t half = m->d_head / 2;
            qkv_tensor **vec[4] = {&b->lambda_q1, &b->lambda_k1, &b->lambda_q2, &b->lambda_k2};
            const char *vec_name[4] = {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"};
            for (int i = 0; i < 4; i++) {
                *vec[i] = add_param(m, fn, qkv_randn(ctx, dt, 1, (int64_t[]){half}, 0.0, 0.1),
                                    "blocks.%" PRId64 ".attn.%s", l, vec_name[i]);
                if (!*vec[i]) return false;
            }
            snprintf(prefix, sizeof prefix, "blocks.%" PRId64 ".attn.sub_ln", l);
            if (!add_norm(m, fn, QKV_NORM_RMS, m->d_head, &b->sub_ln_w, NULL, prefix)) return false;
            b->lambda_init = 0.8 - 0.6 * exp(-0.3 * (double)l);
        }
        if (c->attn_gate != QKV_GATE_NONE) { // one gate per head, or per element of merge(z)
            int64_t d_gate = c->attn_gate == QKV_GATE_HEAD ? c->n_head : d;
            b->W_G = add_param(m, fn, normal(ctx, dt, d, d_gate, std), "blocks.%" PRId64 ".attn.W_G", l);
            if (!b->W_G) return false;
            if (c->attn_bias) {
                b->b_G = add_param(m, fn, constant(ctx, dt, d_gate, 0.0), "blocks.%" PRId64 ".attn.b_G", l);
                if (!b->b_G) return false;
            }
        }
        if (c->qk_norm != QKV_NORM_NONE) {
            snprintf(prefix, sizeof prefix, "blocks.%" PRId64 ".attn.q_ln", l);
            if (!add_norm(m, fn, c->qk_norm, m->d_head, &b->q_ln_w, NULL, prefix)) return false;
            snprintf(prefix, sizeof prefix, "blocks.%" PRId64 ".attn.k_ln", l);
            if (!add_norm(m, fn, c->qk_norm, m->d_head, &b->k_ln_w, NULL, prefix)) return false;
        }
        if (c->d_mlp > 0) {
            snprintf(prefix, sizeof prefix, "blocks.%" PRId64 ".ln2", l);
            if (!add_norm(m, fn, c->norm, d, &b->ln2_w, &b->ln2_b, prefix)) return false;
            if (c->activation == QKV_ACT_SWIGLU || c->activation == QKV_ACT_GEGLU) {
                b->W_gate = add_param(m, fn, normal(ctx, dt, d, c->d_mlp, std), "blocks.%" PRId64 ".mlp.W_gate", l);
                if (!b->W_gate) return false;
            }
            b->W_in = add_param(m, fn, normal(ctx, dt, d, c->d_mlp, std), "blocks.%" PRId64 ".mlp.W_in", l);
            b->b_in = add_param(m, fn, constant(ctx, dt, c->d_mlp, 0.0), "blocks.%" PRId64 ".mlp.b_in", l);
            b->W_out = add_param(m, fn, normal(ctx, dt, c->d_mlp, d, resid_std), "blocks.%" PRId64 ".mlp.W_out", l);
            b->b_out = add_param(m, fn, constant(ctx, dt, d, 0.0), "blocks.%" PRId64 ".mlp.b_out", l);
            if (!b->W_in || !b->b_in || !b->W_out || !b->b_out) return false;
        }
    }
    if (!add_norm(m, fn, c->norm, d, &m->lnf_w, &m->lnf_b, "ln_final")) return false;
    if (!c->tied_embeddings) {
        m->W_U = add_param(m, fn, normal(ctx, dt, d, c->vocab, std), "unembed.W_U");
        if (!m->W_U) return false;
    }
    if (c->positions == QKV_POS_SINUSOIDAL) {
        m->sin_table = qkv_keep(ctx, qkv_sinusoidal_positions(ctx, c->n_ctx, d, dt));
        if (!m->sin_table) return false;
    }
    return true;
}

qkv_model *qkv_model_new_(qkv_ctx *ctx, const char *fn, const qkv_model_config *cfg) {
    if (!ctx || ctx->status) return NULL;
    if (qkv_model_config_check_(ctx, fn, cfg)) return NULL;
    qkv_model *m = qkv_persistent_alloc_(ctx, fn, sizeof *m);
    if (!m) return NULL;
    memset(m, 0, sizeof *m);
    m->ctx = ctx;
    m->cfg = *cfg;
    if (cfg->attn_weights_name) { /* the model keeps its own copy of the name */
        snprintf(m->attn_weights_name, sizeof m->attn_weights_name, "%s", cfg->attn_weights_name);
        m->cfg.attn_weights_name = m->attn_weights_name;
    }
    m->d_head = cfg->d_model / cfg->n_head;
    m->n_kv_head = cfg->n_kv_head > 0 ? cfg->n_kv_head : cfg->n_head;
    double d_score = cfg->attn_diff ? (double)(m->d_head / 2) : (double)m->d_head; // the width of q . k
    m->scale = qkv_model_scale_is_default_(cfg->attn_scale) ? 1.0 / sqrt(d_score) : cfg->attn_scale;
    size_t n_layer = (size_t)cfg->n_layer, n_head = (size_t)cfg->n_head;
    m->blocks = qkv_persistent_alloc_(ctx, fn, n_layer * sizeof *m->blocks);
    m->params = qkv_persistent_alloc_(ctx, fn, (size_t)max_params(cfg) * sizeof *m->params);
    m->names = qkv_persistent_alloc_(ctx, fn, (size_t)max_params(cfg) * sizeof *m->names);
    qkv_ablation_kind *ablation = qkv_persistent_alloc_(ctx, fn, n_layer * n_head * sizeof *ablation);
    if (!m->blocks || !m->params || !m->names || !ablation || !qkv_model_hooks_new_(m, fn)) {
        qkv_persistent_free_(ctx, ablation);
        if (m->blocks) m->blocks[0].ablation = NULL;
        qkv_model_free(m);
        return NULL;
    }
    memset(m->blocks, 0, n_layer * sizeof *m->blocks);
    for (size_t l = 0; l < n_layer; l++) {
        m->blocks[l].ablation = ablation + l * n_head;
        for (size_t h = 0; h < n_head; h++) m->blocks[l].ablation[h] = QKV_ABLATE_NONE;
    }

    /* The initial values are drawn from an RNG seeded with cfg->seed, and the context's own stream is put
     * back afterwards, so a model is a function of its configuration and leaves the caller's draws alone. */
    uint64_t saved_rng[4];
    memcpy(saved_rng, ctx->rng, sizeof saved_rng);
    qkv_seed(ctx, cfg->seed);
    qkv_mark_ mark = qkv_mark_now_(ctx);
    bool built = build_parameters(m, fn);
    qkv_rewind_to_(ctx, mark); /* the step copies the parameters were made from */
    memcpy(ctx->rng, saved_rng, sizeof saved_rng);
    if (!built) {
        /* the parameters are made by public calls (qkv_randn, qkv_full, qkv_param, qkv_keep), whose errors
         * name them: the message starts with fn, the function the user called ("qkv_model_new: qkv_param:") */
        qkv_name_caller_(ctx, fn);
        qkv_model_free(m);
        return NULL;
    }
    return m;
}

qkv_model *qkv_model_new(qkv_ctx *ctx, const qkv_model_config *cfg) { return qkv_model_new_(ctx, "qkv_model_new", cfg); }

void qkv_model_free(qkv_model *m) {
    if (!m) return;
    qkv_ctx *ctx = m->ctx;
    if (m->params)
        for (int i = 0; i < m->n_params; i++) qkv_free(ctx, m->params[i]);
    if (m->names)
        for (int i = 0; i < m->n_params; i++) qkv_persistent_free_(ctx, m->names[i]);
    qkv_free(ctx, m->sin_table);
    for (int64_t l = 0; m->cache_k && l < m->cfg.n_layer; l++) qkv_free(ctx, m->cache_k[l]), qkv_free(ctx, m->cache_v[l]);
    qkv_persistent_free_(ctx, m->cache_k);
    qkv_persistent_free_(ctx, m->cache_v);
    if (m->blocks) qkv_persistent_free_(ctx, m->blocks[0].ablation);
    qkv_persistent_free_(ctx, m->blocks);
    qkv_persistent_free_(ctx, m->params);
    qkv_persistent_free_(ctx, m->names);
    qkv_model_hooks_free_(m);
    qkv_persistent_free_(ctx, m);
}

const qkv_model_config *qkv_model_get_config(const qkv_model *m) { return m ? &m->cfg : NULL; }
int qkv_model_param_count(const qkv_model *m) { return m ? m->n_params : 0; }
qkv_tensor *const *qkv_model_params(const qkv_model *m) { return m ? m->params : NULL; }
const char *const *qkv_model_param_names(const qkv_model *m) { return m ? (const char *const *)m->names : NULL; }

qkv_tensor *qkv_model_param(const qkv_model *m, const char *name) {
    if (!m || !name) return NULL;
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->names[i], name)) return m->params[i];
    return NULL;
}

int64_t qkv_model_param_elements(const qkv_model *m) {
    int64_t n = 0;
    for (int i = 0; m && i < m->n_params; i++) n += m->params[i]->numel;
    return n;
}

/* ---- forward ----------------------------------------------------------------------------------------- */

/* y = norm(x) over the last dimension with the model's kind (none: x itself). */
static qkv_tensor *apply_norm(qkv_ctx *ctx, const qkv_model *m, qkv_norm_kind kind, qkv_tensor *x, qkv_tensor *w,
                              qkv_tensor *b) {
    switch (kind) {
    case QKV_NORM_LAYER: return qkv_layer_norm(ctx, x, w, b, m->cfg.norm_eps);
    case QKV_NORM_RMS: return qkv_rms_norm(ctx, x, w, m->cfg.norm_eps);
    default: return x;
    }
}

static qkv_tensor *activation(qkv_ctx *ctx, const qkv_model *m, qkv_tensor *x) {
    switch (m->cfg.activation) {
    case QKV_ACT_GELU_TANH: return qkv_gelu(ctx, x, QKV_GELU_TANH);
    case QKV_ACT_RELU: return qkv_relu(ctx, x);
    default: return qkv_gelu(ctx, x, QKV_GELU_ERF);
    }
}

/* norm(x) with its hook points: ln.hook_scale [B, n, 1] and ln.hook_normalized [B, n, d_model] of layer l.
 * A hook that may replace the scale computes the norm from its parts so that the replacement acts:
 *   xc = x - mean(x) (layer norm only), scale = sqrt(mean(xc^2) + eps), y = xc / scale * w (+ b);
 * a scale only read (cache, inspection) is computed beside the fused norm with recording off. */
static qkv_tensor *norm_hooked(qkv_ctx *ctx, qkv_model *m, qkv_norm_kind kind, qkv_tensor *x, qkv_tensor *w,
                               qkv_tensor *b, int64_t l, qkv_hook_kind_ scale_at, qkv_hook_kind_ normalized_at) {
    if (kind == QKV_NORM_NONE || !m->hooks_on || !x) return apply_norm(ctx, m, kind, x, w, b);
    bool replace = qkv_hook_replaces_(m, l, scale_at), read = qkv_hook_wanted_(m, l, scale_at);
    qkv_tensor *y = NULL;
    if (read) {
        bool was = replace ? qkv_grad_enabled(ctx) : qkv_set_grad_enabled(ctx, false);
        qkv_tensor *xc = x; // xc = x - mean(x) over d_model (layer norm)
        if (kind == QKV_NORM_LAYER) xc = qkv_sub(ctx, x, qkv_expand(ctx, qkv_mean_dim(ctx, x, 2, true), 3, x->shape));
        // scale = sqrt(mean(xc^2) + eps)                                    [B, n, 1]
        qkv_tensor *scale = qkv_sqrt(ctx, qkv_add_scalar(ctx, qkv_mean_dim(ctx, qkv_square(ctx, xc), 2, true),
                                                         m->cfg.norm_eps));
        if (!replace) qkv_set_grad_enabled(ctx, was);
        scale = qkv_hook_(ctx, m, l, scale_at, scale);
        if (replace) { // y = xc / scale * w (+ b)
            y = qkv_mul(ctx, qkv_div(ctx, xc, scale), w);
            if (kind == QKV_NORM_LAYER) y = qkv_add(ctx, y, b);
        }
    }
    if (!replace) y = apply_norm(ctx, m, kind, x, w, b);
    return qkv_hook_(ctx, m, l, normalized_at, y);
}

/* The hook point hook_attn_scores sees TransformerLens's value: s with -inf where a causal forward masks
 * (j > i). Returns s itself unless a hook replaced the value (then the replacement). */
static qkv_tensor *scores_hooked(qkv_ctx *ctx, qkv_model *m, int64_t l, qkv_tensor *s, int flags) {
    if (!s || !qkv_hook_wanted_(m, l, QKV_HOOK_ATTN_SCORES_)) return s;
    qkv_tensor *t = s;
    if (flags & QKV_CAUSAL) { // t = keep ? s : -inf
        int64_t n = s->shape[1];
        qkv_tensor *keep = qkv_zeros(ctx, QKV_U8, 2, (int64_t[]){n, n});
        if (keep)
            for (int64_t i = 0; i < n; i++) memset(qkv_u8(keep) + i * n, 1, (size_t)(i + 1));
        t = qkv_where(ctx, keep, s, qkv_full(ctx, s->dtype, 1, (int64_t[]){1}, -HUGE_VAL));
    }
    qkv_tensor *r = qkv_hook_(ctx, m, l, QKV_HOOK_ATTN_SCORES_, t);
    return r == t ? s : r;
}

/* The causal mask of config.attn_weights: u8 [n, n], 1 where key j <= query i. */
static qkv_tensor *causal_mask(qkv_ctx *ctx, int64_t n) {
    qkv_tensor *mask = qkv_zeros(ctx, QKV_U8, 2, (int64_t[]){n, n});
    if (mask)
        for (int64_t i = 0; i < n; i++) memset(qkv_u8(mask) + i * n, 1, (size_t)(i + 1));
    return mask;
}

/* A = config.attn_weights(scores, mask), checked: the scores' shape and dtype, and in a causal forward 0 at
 * every masked (i, j). */
static qkv_tensor *user_weights(qkv_ctx *ctx, const qkv_model *m, int64_t l, qkv_tensor *scores, int flags) {
    const char *fn = "qkv_model_forward";
    const qkv_model_config *c = &m->cfg;
    int64_t n = scores->shape[1];
    qkv_tensor *mask = flags & QKV_CAUSAL ? causal_mask(ctx, n) : NULL;
    if (ctx->status) return NULL;
    qkv_tensor *a = c->attn_weights(ctx, scores, mask, c->attn_weights_user);
    char where[QKV_MODEL_ATTN_NAME_MAX + 64];
    snprintf(where, sizeof where, "%s: config.attn_weights \"%s\" (layer %" PRId64 ")", fn, c->attn_weights_name, l);
    if (ctx->status) {
        qkv_name_caller_(ctx, where);
        return NULL;
    }
    if (!a) return qkv_fail_(ctx, QKV_ERR_ARG, "%s returned NULL without setting an error", where);
    if (!qkv_tensor_is_live_(ctx, a) || a->ndim != 3 || !qkv_same_shape_(a, scores) || a->dtype != scores->dtype)
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s returned %s %s for scores %s %s; the weights must match the scores",
                         where, qkv_tensor_is_live_(ctx, a) ? qkv_dtype_name(a->dtype) : "a tensor that is not live",
                         qkv_tensor_is_live_(ctx, a) ? QKV_SHAPE(a) : "", qkv_dtype_name(scores->dtype),
                         QKV_SHAPE(scores));
    if (!mask) return a;
    for (int64_t r = 0; r < a->shape[0]; r++) // a causal model gives the future no weight
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = i + 1; j < n; j++) {
                int64_t at = (r * n + i) * n + j;
                double w = a->dtype == QKV_F64 ? qkv_f64(a)[at] : (double)qkv_f32(a)[at];
                if (w != 0.0)
                    return qkv_fail_(ctx, QKV_ERR_NUMERIC,
                                     "%s gave weight %g to key %" PRId64 " of query %" PRId64 " (row %" PRId64
                                     "), which the causal mask hides: a causal model's weights must be 0 there",
                                     where, w, j, i, r);
            }
    return a;
}

/* k or v [n_kv_head, n, d_head] of one sequence stored in the layer's cache at positions pos .. pos+n-1; returns
 * the cache's first pos+n positions as a step tensor [n_kv_head, pos+n, d_head]. */
static qkv_tensor *through_cache(qkv_ctx *ctx, qkv_tensor *cache, qkv_tensor *t, int64_t pos) {
    if (!t) return NULL;
    int64_t H = t->shape[0], n = t->shape[1], d = t->shape[2], n_ctx = cache->shape[1];
    size_t es = qkv_dtype_size(t->dtype);
    char *c = cache->data;
    for (int64_t h = 0; h < H; h++) // cache[h, pos + i, :] = t[h, i, :]
        memcpy(c + ((size_t)(h * n_ctx + pos) * (size_t)d) * es, (char *)t->data + (size_t)(h * n * d) * es,
               (size_t)(n * d) * es);
    qkv_tensor *all = qkv_empty(ctx, t->dtype, 3, (int64_t[]){H, pos + n, d});
    if (all)
        for (int64_t h = 0; h < H; h++) // all[h] = cache[h, 0 .. pos+n-1, :]
            memcpy((char *)all->data + (size_t)(h * (pos + n) * d) * es, c + (size_t)(h * n_ctx * d) * es,
                   (size_t)((pos + n) * d) * es);
    return all;
}

/* k or v [B*n_kv, n, d] with each key/value head repeated for the query heads that read it, [B*n_head, n, d]:
 * query head h of batch b reads b n_kv + h / (n_head / n_kv) (qkv_index_select, whose backward adds each query
 * head's part into its shared dK and dV in index order: the same bits every run). Only the composed paths
 * need it (config.attn_weights, config.attn_diff, hooks that replace the scores or the pattern); the fused kernel reads the
 * shared heads in place (options.kv_heads). t itself when every head has its own. */
static qkv_tensor *kv_repeated(qkv_ctx *ctx, qkv_tensor *t, int heads, int kv_heads) {
    if (!t || kv_heads == heads) return t;
    int64_t batch = t->shape[0] / kv_heads;
    qkv_tensor *idx = qkv_empty(ctx, QKV_I32, 1, (int64_t[]){batch * heads});
    for (int64_t i = 0; idx && i < batch * heads; i++)
        qkv_i32(idx)[i] = (int32_t)((i / heads) * kv_heads + (i % heads) / (heads / kv_heads));
    return qkv_index_select(ctx, t, 0, idx);
}

/* z = the fused attention of config.attn_variant over heads q [B*H, n, d_head], k, v [B*n_kv_head, n, d_head]
 * (grouped: read in place), with config.attn_softcap inside the kernel (qkv_attention_ex; the uncapped,
 * ungrouped softmax is qkv_attention), A into *pattern when pattern is not NULL. */
static qkv_tensor *fused_attention(qkv_ctx *ctx, const qkv_model *m, const qkv_model_block_ *b, qkv_tensor *q,
                                   qkv_tensor *k, qkv_tensor *v, int flags, qkv_tensor **pattern) {
    const qkv_model_config *c = &m->cfg;
    if (c->attn_variant == QKV_ATTN_SOFTMAX && !(c->attn_softcap > 0) && m->n_kv_head == c->n_head)
        return qkv_attention(ctx, q, k, v, NULL, m->scale, flags, pattern);
    qkv_attention_options o = qkv_attention_default_options();
    o.variant = c->attn_variant;
    o.scale = m->scale;
    o.flags = flags;
    o.heads = (int)c->n_head;
    o.sink = b->sink;
    o.ssmax_c = b->ssmax_c;
    o.sigmoid_bias = -log((double)c->n_ctx); // -log n for the longest sequence: a cached step and a rerun agree
    o.softcap = c->attn_softcap;
    o.kv_heads = (int)m->n_kv_head;
    return qkv_attention_ex(ctx, q, k, v, &o, pattern);
}

/* Gated attention output (config.attn_gate): z [B*H, n, d_head] times g = sigmoid(h W_G + b_G) of the block's
 * normed input h [B, n, d_model], as heads: [B*H, n, 1] (head: broadcast over d_head) or [B*H, n, d_head]
 * (element), the value at hook_gate. z itself when the model has no gate. */
static qkv_tensor *gate_output(qkv_ctx *ctx, qkv_model *m, int64_t l, qkv_tensor *h, qkv_tensor *z) {
    const qkv_model_block_ *b = &m->blocks[l];
    if (!b->W_G) return z;
    // g = sigmoid(h W_G + b_G)                       [B, n, n_head] or [B, n, d_model] -> heads
    qkv_tensor *g = qkv_split_heads(ctx, qkv_sigmoid(ctx, qkv_projection(ctx, h, b->W_G, b->b_G)),
                                    (int)m->cfg.n_head);
    g = qkv_hook_(ctx, m, l, QKV_HOOK_GATE_, g);
    if (g && z && m->cfg.attn_gate == QKV_GATE_HEAD) g = qkv_expand(ctx, g, 3, z->shape); // over d_head
    return qkv_mul(ctx, z, g); // z' = z * g
}

/* rope over each head's q or k x [B*heads, n, d_head] at position pos; differential attention rotates each half
 * (q1 | q2, k1 | k2, d_head / 2 each) on its own, as the paper's heads of d_head / 2. */
static qkv_tensor *rope_heads(qkv_ctx *ctx, const qkv_model *m, qkv_tensor *x, int64_t pos) {
    if (!m->cfg.attn_diff) return qkv_rope(ctx, x, m->cfg.rope_base, pos);
    int64_t half = m->d_head / 2;
    qkv_tensor *halves[2] = {qkv_rope(ctx, qkv_narrow(ctx, x, 2, 0, half), m->cfg.rope_base, pos),
                             qkv_rope(ctx, qkv_narrow(ctx, x, 2, half, half), m->cfg.rope_base, pos)};
    return halves[0] && halves[1] ? qkv_concat(ctx, halves, 2, 2) : NULL;
}

/* Differential attention (config.attn_diff, Ye et al. 2024) of block l over heads q [B*H, n, d_head] and k, v
 * [B*H, n_k, d_head] (grouped heads repeated by kv_repeated): the heads' z [B*H, n, d_head]. With q = q1 | q2, k = k1 | k2:
 *   lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init
 *   z = (softmax(scale q1 k1^T) - lambda softmax(scale q2 k2^T)) v = z1 - lambda z2  (two fused kernels)
 *   z = rms_norm(z over d_head, sub_ln.w) (1 - lambda_init)
 * The value at hook_pattern is A1 - lambda A2 (formed only when a hook wants it; a replacement A' makes the
 * first z = A' v). */
static qkv_tensor *diff_attention(qkv_ctx *ctx, qkv_model *m, int64_t l, qkv_tensor *q, qkv_tensor *k, qkv_tensor *v,
                                  int flags) {
    const qkv_model_block_ *b = &m->blocks[l];
    int64_t half = m->d_head / 2;
    // lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init                        a scalar
    qkv_tensor *lambda = qkv_add_scalar(
        ctx, qkv_sub(ctx, qkv_exp(ctx, qkv_sum(ctx, qkv_mul(ctx, b->lambda_q1, b->lambda_k1))),
                     qkv_exp(ctx, qkv_sum(ctx, qkv_mul(ctx, b->lambda_q2, b->lambda_k2)))),
        b->lambda_init);
    qkv_tensor *q1 = qkv_narrow(ctx, q, 2, 0, half), *q2 = qkv_narrow(ctx, q, 2, half, half);
    qkv_tensor *k1 = qkv_narrow(ctx, k, 2, 0, half), *k2 = qkv_narrow(ctx, k, 2, half, half);
    bool want_pattern = qkv_hook_wanted_(m, l, QKV_HOOK_PATTERN_);
    qkv_tensor *a1 = NULL, *a2 = NULL; // z_i = softmax(scale q_i k_i^T) v, A_i beside it when wanted
    qkv_tensor *z1 = qkv_attention(ctx, q1, k1, v, NULL, m->scale, flags, want_pattern ? &a1 : NULL);
    qkv_tensor *z2 = qkv_attention(ctx, q2, k2, v, NULL, m->scale, flags, want_pattern ? &a2 : NULL);
    qkv_tensor *z = qkv_sub(ctx, z1, qkv_mul(ctx, z2, lambda)); // z = z1 - lambda z2
    if (want_pattern && a1 && a2) {
        qkv_tensor *pattern = qkv_sub(ctx, a1, qkv_mul(ctx, a2, lambda)); // A = A1 - lambda A2
        qkv_tensor *replaced = qkv_hook_(ctx, m, l, QKV_HOOK_PATTERN_, pattern);
        if (replaced != pattern) z = qkv_matmul(ctx, replaced, v, 0); // z = A' v
    }
    // z = rms_norm(z) * (1 - lambda_init), the norm over each head's d_head
    return qkv_scale(ctx, qkv_rms_norm(ctx, z, b->sub_ln_w, m->cfg.norm_eps), 1.0 - b->lambda_init);
}

/* x + attention(norm(x)) for block l; x [B, n, d_model]. With the cache (B = 1): k and v go into it at
 * position pos (0 to fill), and the queries attend to every cached position (a step's one query needs no mask). */
static qkv_tensor *attention_block(qkv_ctx *ctx, qkv_model *m, int64_t l, qkv_tensor *x, int flags,
                                   qkv_cache_mode_ cache, int64_t pos) {
    const qkv_model_config *c = &m->cfg;
    qkv_model_block_ *b = &m->blocks[l];
    int heads = (int)c->n_head;
    qkv_tensor *h = norm_hooked(ctx, m, c->norm, x, b->ln1_w, b->ln1_b, l, QKV_HOOK_LN1_SCALE_,
                                QKV_HOOK_LN1_NORMALIZED_);
    qkv_tensor *q = qkv_split_heads(ctx, qkv_projection(ctx, h, b->W_Q, b->b_Q), heads); // [B*H, n, d_head]
    int kv_heads = (int)m->n_kv_head; // k, v [B*n_kv_head, n, d_head]
    qkv_tensor *k = qkv_split_heads(ctx, qkv_projection(ctx, h, b->W_K, b->b_K), kv_heads);
    qkv_tensor *v = qkv_split_heads(ctx, qkv_projection(ctx, h, b->W_V, b->b_V), kv_heads);
    q = qkv_hook_(ctx, m, l, QKV_HOOK_Q_, q);
    k = qkv_hook_(ctx, m, l, QKV_HOOK_K_, k);
    v = qkv_hook_(ctx, m, l, QKV_HOOK_V_, v);
    q = apply_norm(ctx, m, c->qk_norm, q, b->q_ln_w, NULL); // qk-norm: each head's q and k over d_head
    k = apply_norm(ctx, m, c->qk_norm, k, b->k_ln_w, NULL);
    if (c->positions == QKV_POS_ROPE) {
        q = qkv_hook_(ctx, m, l, QKV_HOOK_ROT_Q_, rope_heads(ctx, m, q, pos));
        k = qkv_hook_(ctx, m, l, QKV_HOOK_ROT_K_, rope_heads(ctx, m, k, pos));
    }
    if (cache != QKV_CACHE_OFF_) { // the cache holds the key/value heads only
        k = through_cache(ctx, m->cache_k[l], k, pos);
        v = through_cache(ctx, m->cache_v[l], v, pos);
        if (cache == QKV_CACHE_STEP_) flags &= ~QKV_CAUSAL; // the new token sees every cached one
    }
    qkv_tensor *pattern = NULL, *scores = NULL, *z = NULL;
    if (c->attn_diff) { // two softmax maps over the query heads' own copies of k and v (grouped: repeated)
        z = diff_attention(ctx, m, l, q, kv_repeated(ctx, k, heads, kv_heads), kv_repeated(ctx, v, heads, kv_heads),
                           flags);
    } else if (c->attn_weights) {
        // A = the user's weights of (capped) scale q k^T, z = A v: the scores must exist for the user's function
        scores = qkv_scale(ctx, qkv_matmul(ctx, q, kv_repeated(ctx, k, heads, kv_heads), QKV_TRANS_B), m->scale);
        scores = qkv_hook_(ctx, m, l, QKV_HOOK_SCORES_RAW_, scores);
        qkv_tensor *capped = c->attn_softcap > 0 ? qkv_softcap(ctx, scores, c->attn_softcap) : scores;
        capped = scores_hooked(ctx, m, l, capped, flags);
        pattern = capped ? user_weights(ctx, m, l, capped, flags) : NULL;
        z = qkv_matmul(ctx, qkv_hook_(ctx, m, l, QKV_HOOK_PATTERN_, pattern), kv_repeated(ctx, v, heads, kv_heads), 0);
    } else if (c->attn_variant != QKV_ATTN_SOFTMAX && qkv_hook_replaces_(m, l, QKV_HOOK_ATTN_SCORES_)) {
        // the variants' weights come from the fused kernel only: a replaced score has no path to them
        qkv_failc_(ctx, QKV_ERR_STATE, "%s: blocks.%" PRId64 ".attn.hook_attn_scores: a hook that replaces the scores "
                   "needs attn_variant softmax (this model's is %s); replace hook_pattern instead", "qkv_model_forward",
                   l, qkv_attn_variant_name(c->attn_variant));
    } else if (qkv_hook_replaces_(m, l, QKV_HOOK_ATTN_SCORES_) || qkv_hook_replaces_(m, l, QKV_HOOK_PATTERN_)) {
        // a hook on the scores or the pattern: S = (capped) scale q k^T on the tape (a replacement's gradient
        // reaches q and k); A = softmax(S') when the scores were replaced, else the fused kernel's z and A; z = A' v
        // when the pattern was replaced
        qkv_tensor *kr = kv_repeated(ctx, k, heads, kv_heads);
        scores = qkv_hook_(ctx, m, l, QKV_HOOK_SCORES_RAW_, qkv_scale(ctx, qkv_matmul(ctx, q, kr, QKV_TRANS_B), m->scale));
        if (c->attn_softcap > 0) scores = qkv_softcap(ctx, scores, c->attn_softcap);
        qkv_tensor *hooked = scores_hooked(ctx, m, l, scores, flags);
        if (hooked != scores) pattern = qkv_softmax(ctx, hooked, NULL, flags);
        else z = fused_attention(ctx, m, b, q, k, v, flags, &pattern);
        qkv_tensor *replaced = qkv_hook_(ctx, m, l, QKV_HOOK_PATTERN_, pattern);
        if (replaced != pattern || !z) z = qkv_matmul(ctx, replaced, kv_repeated(ctx, v, heads, kv_heads), 0);
    } else {
        // z = softmax(softcap(scale q k^T)) v (or the variant), fused: the pattern is formed only when a hook point
        // wants it
        bool want_pattern = qkv_hook_wanted_(m, l, QKV_HOOK_PATTERN_);
        z = fused_attention(ctx, m, b, q, k, v, flags, want_pattern ? &pattern : NULL);
        qkv_hook_(ctx, m, l, QKV_HOOK_PATTERN_, pattern);
        if (z && (qkv_hook_wanted_(m, l, QKV_HOOK_SCORES_RAW_) || qkv_hook_wanted_(m, l, QKV_HOOK_ATTN_SCORES_))) {
            bool was = qkv_set_grad_enabled(ctx, false); // S = scale q k^T, to read only: recorded on no tape
            qkv_tensor *kr = kv_repeated(ctx, k, heads, kv_heads);
            scores = qkv_hook_(ctx, m, l, QKV_HOOK_SCORES_RAW_, qkv_scale(ctx, qkv_matmul(ctx, q, kr, QKV_TRANS_B), m->scale));
            scores_hooked(ctx, m, l, c->attn_softcap > 0 ? qkv_softcap(ctx, scores, c->attn_softcap) : scores, flags);
            qkv_set_grad_enabled(ctx, was);
        }
    }
    z = qkv_hook_(ctx, m, l, QKV_HOOK_Z_, gate_output(ctx, m, l, h, z));
    qkv_tensor *zm = qkv_merge_heads(ctx, z, heads); // [B, n, d_model]
    qkv_tensor *out = qkv_dropout(ctx, qkv_projection(ctx, zm, b->W_O, b->b_O), c->dropout);
    return qkv_add(ctx, x, qkv_hook_(ctx, m, l, QKV_HOOK_ATTN_OUT_, out));
}

/* x + W_out act(W_in norm(x) + b_in) + b_out for block l. */
static qkv_tensor *mlp_block(qkv_ctx *ctx, qkv_model *m, int64_t l, qkv_tensor *x) {
    const qkv_model_config *c = &m->cfg;
    qkv_model_block_ *b = &m->blocks[l];
    qkv_tensor *h = norm_hooked(ctx, m, c->norm, x, b->ln2_w, b->ln2_b, l, QKV_HOOK_LN2_SCALE_,
                                QKV_HOOK_LN2_NORMALIZED_);
    qkv_tensor *u; // [B, n, d_mlp]
    if (b->W_gate) { // gated: act(h W_gate) * (h W_in) + b_in, TransformerLens's order
        qkv_tensor *g = qkv_hook_(ctx, m, l, QKV_HOOK_MLP_PRE_, qkv_projection(ctx, h, b->W_gate, NULL));
        g = c->activation == QKV_ACT_SWIGLU ? qkv_mul(ctx, g, qkv_sigmoid(ctx, g)) : qkv_gelu(ctx, g, QKV_GELU_ERF);
        qkv_tensor *linear = qkv_hook_(ctx, m, l, QKV_HOOK_MLP_PRE_LINEAR_, qkv_projection(ctx, h, b->W_in, NULL));
        u = qkv_add(ctx, qkv_mul(ctx, g, linear), b->b_in);
    } else {
        u = activation(ctx, m, qkv_hook_(ctx, m, l, QKV_HOOK_MLP_PRE_, qkv_projection(ctx, h, b->W_in, b->b_in)));
    }
    u = qkv_hook_(ctx, m, l, QKV_HOOK_MLP_POST_, u);
    qkv_tensor *y = qkv_dropout(ctx, qkv_projection(ctx, u, b->W_out, b->b_out), c->dropout);
    return qkv_add(ctx, x, qkv_hook_(ctx, m, l, QKV_HOOK_MLP_OUT_, y));
}

/* pos, pos+1, ..., pos+n-1 as i32 [n]: the rows of a position table. */
static qkv_tensor *positions(qkv_ctx *ctx, int64_t pos, int64_t n) {
    qkv_tensor *p = qkv_empty(ctx, QKV_I32, 1, (int64_t[]){n});
    if (p)
        for (int64_t i = 0; i < n; i++) qkv_i32(p)[i] = (int32_t)(pos + i);
    return p;
}

/* ids i32 [B, n] or [n] with n in [1, n_ctx] and every id in [0, vocab); *batched says which. */
static bool check_ids(qkv_ctx *ctx, const char *fn, const qkv_model *m, const qkv_tensor *ids, bool *batched) {
    if (!qkv_check_tensor_(ctx, fn, "ids", ids)) return false;
    if (ids->dtype != QKV_I32)
        return qkv_fail_(ctx, QKV_ERR_DTYPE, "%s: ids are %s %s: they must be i32", fn, qkv_dtype_name(ids->dtype),
                         QKV_SHAPE(ids)),
               false;
    if (ids->ndim != 1 && ids->ndim != 2)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: ids are %s: they must be [n] or [B, n]", fn, QKV_SHAPE(ids)), false;
    int64_t n = ids->shape[ids->ndim - 1];
    if (n < 1 || n > m->cfg.n_ctx || ids->numel < 1)
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: ids are %s: the sequence length %" PRId64
                         " must be in [1, n_ctx = %" PRId64 "] and the batch non-empty", fn, QKV_SHAPE(ids), n,
                         m->cfg.n_ctx),
               false;
    const int32_t *v = qkv_i32(ids);
    for (int64_t i = 0; i < ids->numel; i++)
        if (v[i] < 0 || v[i] >= m->cfg.vocab)
            return qkv_fail_(ctx, QKV_ERR_ARG, "%s: ids %s: id %" PRId32 " at position %" PRId64 " (batch %" PRId64
                             ", index %" PRId64 ") is outside [0, vocab = %" PRId64 ")", fn, QKV_SHAPE(ids), v[i], i,
                             i / n, i % n, m->cfg.vocab),
                   false;
    *batched = ids->ndim == 2;
    return true;
}

static qkv_tensor *forward(qkv_ctx *ctx, qkv_model *m, qkv_tensor *ids2, int flags, qkv_cache_mode_ cache,
                           int64_t pos);

qkv_tensor *qkv_model_forward(qkv_ctx *ctx, qkv_model *m, const qkv_tensor *ids, int flags) {
    const char *fn = "qkv_model_forward";
    if (!ctx || ctx->status) return NULL;
    if (!m) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: model is NULL", fn);
    if (m->ctx != ctx) return qkv_fail_(ctx, QKV_ERR_ARG, "%s: the model belongs to another context", fn);
    if (flags & ~QKV_CAUSAL)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: flags is %d: only QKV_CAUSAL (1) is defined", fn, flags);
    bool batched;
    if (!check_ids(ctx, fn, m, ids, &batched)) return NULL;
    int64_t n = ids->shape[ids->ndim - 1];
    qkv_tensor *ids2 = batched ? (qkv_tensor *)ids : qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){1, n}, ids->data);
    qkv_tensor *logits = forward(ctx, m, ids2, flags, QKV_CACHE_OFF_, 0);
    if (!logits) return NULL;
    return batched ? logits : qkv_reshape(ctx, logits, 2, (int64_t[]){n, m->cfg.vocab});
}

bool qkv_model_cache_serves_(const qkv_model *m) {
    if (m->cfg.attn_weights) return false;
    for (int s = 0; s < m->n_hook_slots; s++) // a hook sees (and may change) whole windows, never cached steps
        if (m->hook_slots[s].want & QKV_WANT_HOOK_) return false;
    for (int64_t l = 0; l < m->cfg.n_layer; l++)
        for (int64_t h = 0; h < m->cfg.n_head; h++)
            if (m->blocks[l].ablation[h] == QKV_ABLATE_MEAN) return false;
    return true;
}

qkv_tensor *qkv_model_forward_cached_(qkv_ctx *ctx, qkv_model *m, qkv_tensor *ids2, qkv_cache_mode_ mode) {
    const char *fn = "qkv_model_sample";
    const qkv_model_config *c = &m->cfg;
    if (!m->cache_k) { // the cache: kept tensors, made once and reused by every later sampling
        m->cache_k = qkv_persistent_alloc_(ctx, fn, (size_t)c->n_layer * sizeof *m->cache_k);
        m->cache_v = qkv_persistent_alloc_(ctx, fn, (size_t)c->n_layer * sizeof *m->cache_v);
        if (!m->cache_k || !m->cache_v) return NULL;
        memset(m->cache_k, 0, (size_t)c->n_layer * sizeof *m->cache_k);
        memset(m->cache_v, 0, (size_t)c->n_layer * sizeof *m->cache_v);
        for (int64_t l = 0; l < c->n_layer; l++) {
            const int64_t shape[3] = {m->n_kv_head, c->n_ctx, m->d_head};
            m->cache_k[l] = qkv_keep(ctx, qkv_zeros(ctx, c->dtype, 3, shape));
            m->cache_v[l] = qkv_keep(ctx, qkv_zeros(ctx, c->dtype, 3, shape));
            if (!m->cache_k[l] || !m->cache_v[l]) return NULL;
        }
    }
    int64_t n = ids2->shape[1], pos = mode == QKV_CACHE_STEP_ ? m->cache_len : 0;
    if (mode == QKV_CACHE_STEP_ && (n != 1 || pos + 1 > c->n_ctx))
        return qkv_fail_(ctx, QKV_ERR_STATE, "%s: a cached step takes one token at position %" PRId64 " < n_ctx", fn, pos);
    qkv_tensor *logits = forward(ctx, m, ids2, QKV_CAUSAL, mode, pos);
    m->cache_len = logits ? pos + n : 0;
    return logits;
}

/* The model on ids2 [B, n] at positions pos .. pos+n-1: logits [B, n, vocab]. */
static qkv_tensor *forward(qkv_ctx *ctx, qkv_model *m, qkv_tensor *ids2, int flags, qkv_cache_mode_ cache, int64_t pos) {
    const qkv_model_config *c = &m->cfg;
    int64_t n = ids2->shape[1];
    m->hook_epoch = 0;
    if (m->hooks_on) memset(m->hook_values, 0, (size_t)m->n_hook_slots * sizeof *m->hook_values);

    // x = W_E[ids] (+ W_pos[pos..pos+n-1] or the sinusoidal table's rows)      [B, n, d_model]
    qkv_tensor *x = qkv_hook_(ctx, m, 0, QKV_HOOK_EMBED_, qkv_embedding(ctx, m->W_E, ids2));
    qkv_tensor *table = c->positions == QKV_POS_LEARNED ? m->W_pos : c->positions == QKV_POS_SINUSOIDAL ? m->sin_table : NULL;
    if (table) {
        qkv_tensor *rows = qkv_embedding(ctx, table, positions(ctx, pos, n)); // [n, d_model]
        if (qkv_hook_wanted_(m, 0, QKV_HOOK_POS_EMBED_) && x) // the hook sees [B, n, d_model], as TransformerLens's
            rows = qkv_hook_(ctx, m, 0, QKV_HOOK_POS_EMBED_, qkv_expand(ctx, rows, 3, x->shape));
        x = qkv_add(ctx, x, rows);
    }
    x = qkv_dropout(ctx, x, c->dropout);
    for (int64_t l = 0; l < c->n_layer && x; l++) {
        x = qkv_hook_(ctx, m, l, QKV_HOOK_RESID_PRE_, x);
        x = qkv_hook_(ctx, m, l, QKV_HOOK_RESID_MID_, attention_block(ctx, m, l, x, flags, cache, pos));
        if (c->d_mlp > 0) x = mlp_block(ctx, m, l, x);
        x = qkv_hook_(ctx, m, l, QKV_HOOK_RESID_POST_, x);
    }
    // logits = norm(x) W_U, or norm(x) W_E^T when tied                  [B, n, vocab]
    x = norm_hooked(ctx, m, c->norm, x, m->lnf_w, m->lnf_b, 0, QKV_HOOK_LNF_SCALE_, QKV_HOOK_LNF_NORMALIZED_);
    qkv_tensor *logits = c->tied_embeddings ? qkv_matmul(ctx, x, m->W_E, QKV_TRANS_B) : qkv_projection(ctx, x, m->W_U, NULL);
    if (logits && m->hooks_on && !m->hooks_no_keep) m->hook_epoch = ctx->epoch;
    return logits;
}

qkv_tensor *qkv_model_unembed(qkv_ctx *ctx, qkv_model *m, qkv_tensor *resid) {
    const char *fn = "qkv_model_unembed";
    if (!ctx || ctx->status) return NULL;
    if (!m) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: model is NULL", fn);
    if (!qkv_check_tensor_(ctx, fn, "resid", resid)) return NULL;
    if (resid->ndim < 1 || resid->ndim > 3 || resid->shape[resid->ndim - 1] != m->cfg.d_model ||
        resid->dtype != m->cfg.dtype)
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: resid is %s %s: it must be %s [.., d_model = %" PRId64 "]", fn,
                         qkv_dtype_name(resid->dtype), QKV_SHAPE(resid), qkv_dtype_name(m->cfg.dtype), m->cfg.d_model);
    // logits = norm(x) W_U, or norm(x) W_E^T when tied: the forward's last two steps
    qkv_tensor *x = apply_norm(ctx, m, m->cfg.norm, resid, m->lnf_w, m->lnf_b);
    qkv_tensor *logits = m->cfg.tied_embeddings ? qkv_matmul(ctx, x, m->W_E, QKV_TRANS_B)
                                                : qkv_projection(ctx, x, m->W_U, NULL);
    if (!logits) qkv_name_caller_(ctx, fn);
    return logits;
}

qkv_tensor *qkv_next_token_targets(qkv_ctx *ctx, const qkv_tensor *ids) {
    const char *fn = "qkv_next_token_targets";
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_tensor_(ctx, fn, "ids", ids)) return NULL;
    if (ids->dtype != QKV_I32 || ids->ndim < 1 || ids->ndim > 2)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: ids are %s %s: they must be i32 [n] or [B, n]", fn,
                         qkv_dtype_name(ids->dtype), QKV_SHAPE(ids));
    qkv_tensor *t = qkv_empty(ctx, QKV_I32, ids->ndim, ids->shape);
    if (!t) return NULL;
    int64_t n = ids->shape[ids->ndim - 1];
    const int32_t *in = qkv_i32(ids);
    int32_t *out = qkv_i32(t);
    for (int64_t i = 0; i < ids->numel; i++) out[i] = i % n == n - 1 ? -1 : in[i + 1]; // t[i] = ids[i+1]
    return t;
}

qkv_tensor *qkv_model_loss(qkv_ctx *ctx, qkv_tensor *logits, const qkv_tensor *targets) {
    return qkv_cross_entropy(ctx, logits, targets);
}
