/*
 * attribution.c — reading the residual stream in the vocabulary: the logit lens (each layer's residual
 * stream through ln_final and the unembedding) and direct logit attribution (each head's and each MLP's share
 * of a logit difference, with ln_final's scale frozen at the run's value, as TransformerLens's
 * cache.apply_ln_to_stack does). Both run their own forward with the hook points of model/hooks.c.
 *
 *   resid_post[L] = embed (+ pos) + sum_{l <= L} (sum_h z_h W_O[h] + b_O) + (mlp_out_l)      [B, n, d_model]
 *   logit[a] - logit[b] = ((x - mean x) / scale * w + beta) . (W_U[:, a] - W_U[:, b]), x the last resid_post
 */
#include "model_internal.h"

#include <inttypes.h>
#include <stdio.h>

qkv_tensor *qkv_model_logit_lens(qkv_ctx *ctx, qkv_model *m, const qkv_tensor *ids, int flags) {
    const char *fn = "qkv_model_logit_lens";
    if (!ctx || ctx->status) return NULL;
    if (!m) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: model is NULL", fn);
    int64_t L = m->cfg.n_layer;
    qkv_hook_slot_ *saved = qkv_model_hooks_suspend_(ctx, m, fn);
    if (!saved) return NULL;
    qkv_model_hook_keep_(m, 0, QKV_HOOK_RESID_PRE_);
    for (int64_t l = 0; l < L; l++) qkv_model_hook_keep_(m, l, QKV_HOOK_RESID_POST_);
    bool was = qkv_set_grad_enabled(ctx, false);
    qkv_tensor *logits = qkv_model_forward(ctx, m, ids, flags), *lens = NULL;
    if (logits) {
        // lens[0] = unembed(resid_pre of block 0), lens[l + 1] = unembed(resid_post of block l)   [L+1, B, n, V]
        int64_t B = logits->ndim == 3 ? logits->shape[0] : 1, n = logits->shape[logits->ndim - 2], V = m->cfg.vocab;
        lens = qkv_empty(ctx, m->cfg.dtype, 4, (int64_t[]){L + 1, B, n, V});
        size_t bytes = (size_t)(B * n * V) * qkv_dtype_size(m->cfg.dtype);
        for (int64_t l = 0; lens && l <= L; l++) {
            qkv_tensor *resid = m->hook_values[qkv_hook_slot_index_(m, l ? l - 1 : 0, l ? QKV_HOOK_RESID_POST_
                                                                                        : QKV_HOOK_RESID_PRE_)];
            qkv_tensor *row = qkv_model_unembed(ctx, m, resid);
            if (!row) break;
            memcpy((char *)lens->data + (size_t)l * bytes, row->data, bytes);
        }
    }
    qkv_set_grad_enabled(ctx, was);
    qkv_model_hooks_restore_(m, saved);
    if (ctx->status) {
        qkv_name_caller_(ctx, fn);
        return NULL;
    }
    return lens;
}

/* ---- direct logit attribution ------------------------------------------------------------------------------ */

/* The parts, in order: embed, pos_embed (learned or sinusoidal), per block the heads, b_O (attn_bias), the MLP;
 * then ln_final's bias (layer norm). */
int qkv_model_attribution_count(const qkv_model *m) {
    if (!m) return 0;
    const qkv_model_config *c = &m->cfg;
    bool pos = c->positions == QKV_POS_LEARNED || c->positions == QKV_POS_SINUSOIDAL;
    int64_t per_block = c->n_head + (c->attn_bias ? 1 : 0) + (c->d_mlp > 0 ? 1 : 0);
    return (int)(1 + (pos ? 1 : 0) + c->n_layer * per_block + (c->norm == QKV_NORM_LAYER ? 1 : 0));
}

bool qkv_model_attribution_label(const qkv_model *m, int i, char *buf, size_t size) {
    if (!m || !buf || size == 0 || i < 0 || i >= qkv_model_attribution_count(m)) return false;
    const qkv_model_config *c = &m->cfg;
    bool pos = c->positions == QKV_POS_LEARNED || c->positions == QKV_POS_SINUSOIDAL;
    int64_t per_block = c->n_head + (c->attn_bias ? 1 : 0) + (c->d_mlp > 0 ? 1 : 0);
    if (i == 0) return snprintf(buf, size, "embed"), true;
    if (pos && i == 1) return snprintf(buf, size, "pos_embed"), true;
    int64_t j = i - 1 - (pos ? 1 : 0);
    if (j >= c->n_layer * per_block) return snprintf(buf, size, "ln_final.b"), true;
    int64_t l = j / per_block, k = j % per_block;
    if (k < c->n_head) snprintf(buf, size, "L%" PRId64 "H%" PRId64, l, k);
    else if (k == c->n_head && c->attn_bias) snprintf(buf, size, "blocks.%" PRId64 ".attn.b_O", l);
    else snprintf(buf, size, "blocks.%" PRId64 ".mlp", l);
    return true;
}

static double value_at(const qkv_tensor *t, int64_t i) {
    return t->dtype == QKV_F64 ? qkv_f64(t)[i] : (double)qkv_f32(t)[i];
}

/* part . direction through the frozen final norm: sum_d (p_d - mean p) / scale * w_d * dir_d (layer norm);
 * no centring for rms, no scale or gain for none. p is d_model values with stride 1. */
typedef struct frozen_norm {
    const qkv_model *m;
    double scale;       /* ln_final.hook_scale at this row (1 for none) */
    const double *wdir; /* w_d * dir_d, [d_model]                       */
} frozen_norm;
static double through_norm(const frozen_norm *f, const double *p) {
    int64_t d = f->m->cfg.d_model;
    double mean = 0.0, dot = 0.0;
    if (f->m->cfg.norm == QKV_NORM_LAYER) {
        for (int64_t i = 0; i < d; i++) mean += p[i];
        mean /= (double)d;
    }
    for (int64_t i = 0; i < d; i++) dot += (p[i] - mean) * f->wdir[i];
    return dot / f->scale;
}

qkv_tensor *qkv_model_logit_attribution(qkv_ctx *ctx, qkv_model *m, const qkv_tensor *ids, int flags, int64_t pos,
                                        int32_t token_a, int32_t token_b) {
    const char *fn = "qkv_model_logit_attribution";
    if (!ctx || ctx->status) return NULL;
    if (!m) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: model is NULL", fn);
    const qkv_model_config *c = &m->cfg;
    if (token_a < 0 || token_a >= c->vocab || token_b < 0 || token_b >= c->vocab)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: tokens %" PRId32 " and %" PRId32 ": both must be in [0, vocab = %" PRId64
                         ")", fn, token_a, token_b, c->vocab);
    if (!qkv_check_tensor_(ctx, fn, "ids", ids)) return NULL;
    int64_t n = ids->ndim >= 1 ? ids->shape[ids->ndim - 1] : 0;
    if (pos < 0 || pos >= n)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: position %" PRId64 " is outside [0, n = %" PRId64 ") of ids %s", fn, pos,
                         n, QKV_SHAPE(ids));
    int64_t L = c->n_layer, H = c->n_head, dh = m->d_head, d = c->d_model, V = c->vocab;
    bool has_pos = c->positions == QKV_POS_LEARNED || c->positions == QKV_POS_SINUSOIDAL;
    qkv_hook_slot_ *saved = qkv_model_hooks_suspend_(ctx, m, fn);
    if (!saved) return NULL;
    qkv_model_hook_keep_(m, 0, QKV_HOOK_EMBED_);
    if (has_pos) qkv_model_hook_keep_(m, 0, QKV_HOOK_POS_EMBED_);
    if (c->norm != QKV_NORM_NONE) qkv_model_hook_keep_(m, 0, QKV_HOOK_LNF_SCALE_);
    for (int64_t l = 0; l < L; l++) {
        qkv_model_hook_keep_(m, l, QKV_HOOK_Z_);
        if (c->d_mlp > 0) qkv_model_hook_keep_(m, l, QKV_HOOK_MLP_OUT_);
    }
    bool was = qkv_set_grad_enabled(ctx, false);
    qkv_tensor *logits = qkv_model_forward(ctx, m, ids, flags), *parts = NULL;
    int n_parts = qkv_model_attribution_count(m);
    int64_t B = logits && logits->ndim == 3 ? logits->shape[0] : 1;
    double *wdir = qkv_arena_array_(ctx, fn, (size_t)d, sizeof *wdir);
    double *dir = qkv_arena_array_(ctx, fn, (size_t)d, sizeof *dir), *p = qkv_arena_array_(ctx, fn, (size_t)d, sizeof *p);
    if (logits) parts = qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){B, n_parts + 1});
    if (parts && wdir && dir && p) {
        // dir = W_U[:, a] - W_U[:, b] (or W_E[a] - W_E[b] when tied), times the final norm's gain
        for (int64_t i = 0; i < d; i++) {
            dir[i] = c->tied_embeddings ? value_at(m->W_E, token_a * d + i) - value_at(m->W_E, token_b * d + i)
                                        : value_at(m->W_U, i * V + token_a) - value_at(m->W_U, i * V + token_b);
            wdir[i] = dir[i] * (m->lnf_w ? value_at(m->lnf_w, i) : 1.0);
        }
        const qkv_tensor *scale = c->norm != QKV_NORM_NONE ? m->hook_values[qkv_hook_slot_index_(m, 0, QKV_HOOK_LNF_SCALE_)] : NULL;
        for (int64_t b = 0; b < B; b++) {
            int64_t row = b * n + pos; // the row [b, pos] of a [B, n, .] value
            frozen_norm f = {m, scale ? value_at(scale, row) : 1.0, wdir};
            double *out = qkv_f64(parts) + b * (n_parts + 1);
            int k = 0;
            const qkv_tensor *e = m->hook_values[qkv_hook_slot_index_(m, 0, QKV_HOOK_EMBED_)];
            for (int64_t i = 0; i < d; i++) p[i] = value_at(e, row * d + i);
            out[k++] = through_norm(&f, p);
            if (has_pos) {
                e = m->hook_values[qkv_hook_slot_index_(m, 0, QKV_HOOK_POS_EMBED_)];
                for (int64_t i = 0; i < d; i++) p[i] = value_at(e, row * d + i);
                out[k++] = through_norm(&f, p);
            }
            for (int64_t l = 0; l < L; l++) {
                const qkv_model_block_ *blk = &m->blocks[l];
                const qkv_tensor *z = m->hook_values[qkv_hook_slot_index_(m, l, QKV_HOOK_Z_)];
                for (int64_t h = 0; h < H; h++) { // head h writes z_h[pos] W_O[h dh .. (h+1) dh - 1, :]
                    for (int64_t i = 0; i < d; i++) p[i] = 0.0;
                    for (int64_t j = 0; j < dh; j++) {
                        double zj = value_at(z, ((b * H + h) * n + pos) * dh + j);
                        for (int64_t i = 0; i < d; i++) p[i] += zj * value_at(blk->W_O, (h * dh + j) * d + i);
                    }
                    out[k++] = through_norm(&f, p);
                }
                if (c->attn_bias) {
                    for (int64_t i = 0; i < d; i++) p[i] = value_at(blk->b_O, i);
                    out[k++] = through_norm(&f, p);
                }
                if (c->d_mlp > 0) {
                    const qkv_tensor *y = m->hook_values[qkv_hook_slot_index_(m, l, QKV_HOOK_MLP_OUT_)];
                    for (int64_t i = 0; i < d; i++) p[i] = value_at(y, row * d + i);
                    out[k++] = through_norm(&f, p);
                }
            }
            if (c->norm == QKV_NORM_LAYER) { // beta . dir: no scale, no gain
                double dot = 0.0;
                for (int64_t i = 0; i < d; i++) dot += value_at(m->lnf_b, i) * dir[i];
                out[k++] = dot;
            }
            // the last column: the model's own logit difference
            int64_t lrow = row * V;
            out[n_parts] = value_at(logits, lrow + token_a) - value_at(logits, lrow + token_b);
        }
    }
    qkv_set_grad_enabled(ctx, was);
    qkv_model_hooks_restore_(m, saved);
    if (ctx->status) {
        qkv_name_caller_(ctx, fn);
        return NULL;
    }
    return parts;
}
