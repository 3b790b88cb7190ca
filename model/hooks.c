/*
 * hooks.c — the model's hook points (include/qkv/hooks.h): the one table of points and their names, what runs
 * at a point as the forward passes it (a user's hook, a patch or an ablation, then the cache and inspection),
 * name lookup with hints, the cache and its .npy export, qkv_model_inspect over the same slots, and the
 * activation-patching sweep.
 *
 *   forward: ... t = qkv_hook_(ctx, m, layer, kind, t) ...   one test of m->hooks_on when nothing is set
 */
#include "model_internal.h"

#include <inttypes.h>
#include <stdio.h>

/* ---- the table ---------------------------------------------------------------------------------------- */

/* Each kind's name: after "blocks.L." for per-layer kinds, whole for the model's own. NULL: private. */
static const char *const kind_suffix[QKV_HOOK_KIND_COUNT_] = {
    [QKV_HOOK_RESID_PRE_] = "hook_resid_pre",
    [QKV_HOOK_LN1_SCALE_] = "ln1.hook_scale",
    [QKV_HOOK_LN1_NORMALIZED_] = "ln1.hook_normalized",
    [QKV_HOOK_Q_] = "attn.hook_q",
    [QKV_HOOK_K_] = "attn.hook_k",
    [QKV_HOOK_V_] = "attn.hook_v",
    [QKV_HOOK_ROT_Q_] = "attn.hook_rot_q",
    [QKV_HOOK_ROT_K_] = "attn.hook_rot_k",
    [QKV_HOOK_SCORES_RAW_] = NULL,
    [QKV_HOOK_ATTN_SCORES_] = "attn.hook_attn_scores",
    [QKV_HOOK_PATTERN_] = "attn.hook_pattern",
    [QKV_HOOK_GATE_] = "attn.hook_gate",
    [QKV_HOOK_Z_] = "attn.hook_z",
    [QKV_HOOK_ATTN_OUT_] = "hook_attn_out",
    [QKV_HOOK_RESID_MID_] = "hook_resid_mid",
    [QKV_HOOK_LN2_SCALE_] = "ln2.hook_scale",
    [QKV_HOOK_LN2_NORMALIZED_] = "ln2.hook_normalized",
    [QKV_HOOK_MLP_PRE_] = "mlp.hook_pre",
    [QKV_HOOK_MLP_PRE_LINEAR_] = "mlp.hook_pre_linear",
    [QKV_HOOK_MLP_POST_] = "mlp.hook_post",
    [QKV_HOOK_MLP_OUT_] = "hook_mlp_out",
    [QKV_HOOK_RESID_POST_] = "hook_resid_post",
    [QKV_HOOK_EMBED_] = "hook_embed",
    [QKV_HOOK_POS_EMBED_] = "hook_pos_embed",
    [QKV_HOOK_LNF_SCALE_] = "ln_final.hook_scale",
    [QKV_HOOK_LNF_NORMALIZED_] = "ln_final.hook_normalized",
};

/* Whether m's configuration has the part a kind hooks. */
static bool kind_exists(const qkv_model *m, qkv_hook_kind_ k) {
    const qkv_model_config *c = &m->cfg;
    bool mlp = c->d_mlp > 0, norm = c->norm != QKV_NORM_NONE;
    bool gated = c->activation == QKV_ACT_SWIGLU || c->activation == QKV_ACT_GEGLU;
    switch (k) {
    case QKV_HOOK_LN1_SCALE_:
    case QKV_HOOK_LN1_NORMALIZED_:
    case QKV_HOOK_LNF_SCALE_:
    case QKV_HOOK_LNF_NORMALIZED_: return norm;
    case QKV_HOOK_ROT_Q_:
    case QKV_HOOK_ROT_K_: return c->positions == QKV_POS_ROPE;
    case QKV_HOOK_LN2_SCALE_:
    case QKV_HOOK_LN2_NORMALIZED_: return mlp && norm;
    case QKV_HOOK_MLP_PRE_:
    case QKV_HOOK_MLP_POST_:
    case QKV_HOOK_MLP_OUT_: return mlp;
    case QKV_HOOK_MLP_PRE_LINEAR_: return mlp && gated;
    case QKV_HOOK_POS_EMBED_: return c->positions == QKV_POS_LEARNED || c->positions == QKV_POS_SINUSOIDAL;
    case QKV_HOOK_GATE_: return c->attn_gate != QKV_GATE_NONE;
    case QKV_HOOK_ATTN_SCORES_: return !c->attn_diff; // differential attention has two score matrices
    default: return true;
    }
}

/* Heads of a per-head kind's value [B*heads, n, .], or 0 for a kind whose rows are the batch ([B, n, .]). */
static int64_t kind_heads(const qkv_model *m, qkv_hook_kind_ k) {
    switch (k) {
    case QKV_HOOK_K_:
    case QKV_HOOK_V_:
    case QKV_HOOK_ROT_K_: return m->n_kv_head;
    case QKV_HOOK_Q_:
    case QKV_HOOK_ROT_Q_:
    case QKV_HOOK_SCORES_RAW_:
    case QKV_HOOK_ATTN_SCORES_:
    case QKV_HOOK_PATTERN_:
    case QKV_HOOK_GATE_:
    case QKV_HOOK_Z_: return m->cfg.n_head;
    default: return 0;
    }
}

bool qkv_model_hooks_new_(qkv_model *m, const char *fn) {
    qkv_ctx *ctx = m->ctx;
    int64_t L = m->cfg.n_layer;
    size_t slots = (size_t)(L + 1) * QKV_HOOK_KIND_COUNT_;
    m->n_hook_slots = (int)slots;
    m->hook_slots = qkv_persistent_alloc_(ctx, fn, slots * sizeof *m->hook_slots);
    m->hook_values = qkv_persistent_alloc_(ctx, fn, slots * sizeof *m->hook_values);
    m->hook_point_slot = qkv_persistent_alloc_(ctx, fn, slots * sizeof *m->hook_point_slot);
    m->hook_slot_name = qkv_persistent_alloc_(ctx, fn, slots * sizeof *m->hook_slot_name);
    if (m->hook_slot_name) memset(m->hook_slot_name, 0, slots * sizeof *m->hook_slot_name); // before any early return
    if (!m->hook_slots || !m->hook_values || !m->hook_point_slot || !m->hook_slot_name) return false;
    memset(m->hook_slots, 0, slots * sizeof *m->hook_slots);
    memset(m->hook_values, 0, slots * sizeof *m->hook_values);
    /* the points in forward order: the embeddings, each block's kinds in order, the final norm */
    int order[QKV_HOOK_KIND_COUNT_ + 2], n_order = 0;
    order[n_order++] = -QKV_HOOK_EMBED_ - 1;
    order[n_order++] = -QKV_HOOK_POS_EMBED_ - 1;
    for (int k = 0; k < QKV_HOOK_LAYER_KINDS_; k++) order[n_order++] = k;
    order[n_order++] = -QKV_HOOK_LNF_SCALE_ - 1;
    order[n_order++] = -QKV_HOOK_LNF_NORMALIZED_ - 1;
    m->n_hook_points = 0;
    for (int o = 0; o < n_order; o++) {
        bool global = order[o] < 0;
        qkv_hook_kind_ k = (qkv_hook_kind_)(global ? -order[o] - 1 : order[o]);
        if (!kind_suffix[k] || !kind_exists(m, k)) continue;
        for (int64_t l = 0; l < (global ? 1 : L); l++) {
            char name[96];
            if (global) snprintf(name, sizeof name, "%s", kind_suffix[k]);
            else snprintf(name, sizeof name, "blocks.%" PRId64 ".%s", l, kind_suffix[k]);
            int slot = qkv_hook_slot_index_(m, l, k);
            size_t len = strlen(name) + 1;
            m->hook_slot_name[slot] = qkv_persistent_alloc_(ctx, fn, len);
            if (!m->hook_slot_name[slot]) return false;
            memcpy(m->hook_slot_name[slot], name, len);
            m->hook_point_slot[m->n_hook_points++] = slot;
        }
    }
    /* per-layer kinds were added kind-major above; put them layer-major (block 0's points, then block 1's) */
    int first = 0;
    while (first < m->n_hook_points && m->hook_point_slot[first] >= (int)(L * QKV_HOOK_KIND_COUNT_)) first++;
    int last = first;
    while (last < m->n_hook_points && m->hook_point_slot[last] < (int)(L * QKV_HOOK_KIND_COUNT_)) last++;
    for (int i = first + 1; i < last; i++) { // insertion sort by slot: layer * K + kind is layer-major order
        int s = m->hook_point_slot[i], j = i;
        for (; j > first && m->hook_point_slot[j - 1] > s; j--) m->hook_point_slot[j] = m->hook_point_slot[j - 1];
        m->hook_point_slot[j] = s;
    }
    return true;
}

void qkv_model_hooks_free_(qkv_model *m) {
    qkv_ctx *ctx = m->ctx;
    for (int s = 0; m->hook_slot_name && s < m->n_hook_slots; s++) qkv_persistent_free_(ctx, m->hook_slot_name[s]);
    qkv_persistent_free_(ctx, m->hook_slot_name);
    qkv_persistent_free_(ctx, m->hook_point_slot);
    qkv_persistent_free_(ctx, m->hook_values);
    qkv_persistent_free_(ctx, m->hook_slots);
}

void qkv_model_hooks_update_(qkv_model *m) {
    m->hooks_on = false;
    for (int s = 0; s < m->n_hook_slots; s++) m->hooks_on |= m->hook_slots[s].want != 0;
    m->hook_epoch = 0;
}

int qkv_model_hook_count(const qkv_model *m) { return m ? m->n_hook_points : 0; }

const char *qkv_model_hook_name(const qkv_model *m, int i) {
    if (!m || i < 0 || i >= m->n_hook_points) return NULL;
    return m->hook_slot_name[m->hook_point_slot[i]];
}

/* ---- names -------------------------------------------------------------------------------------------- */

/* Edit distance of a and b (for "did you mean"), capped at 99. */
static int distance(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    if (na > 95 || nb > 95) return 99;
    int row[97];
    for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[nb];
}

/* The slot of a point by name, or -1 with QKV_ERR_ARG naming it (fn the caller). */
static int find_slot(qkv_ctx *ctx, const char *fn, const qkv_model *m, const char *name) {
    if (!name) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: the hook name is NULL", fn), -1;
    for (int i = 0; i < m->n_hook_points; i++)
        if (!strcmp(m->hook_slot_name[m->hook_point_slot[i]], name)) return m->hook_point_slot[i];
    int64_t layer;
    int used = 0;
    if (sscanf(name, "blocks.%" SCNd64 ".%n", &layer, &used) == 1 && used > 0 &&
        (layer < 0 || layer >= m->cfg.n_layer))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: no hook point \"%s\": layer %" PRId64 " is outside [0, n_layer = %"
                          PRId64 ")", fn, name, layer, m->cfg.n_layer), -1;
    const char *best = NULL;
    int best_d = 99;
    for (int i = 0; i < m->n_hook_points; i++) {
        int d = distance(name, m->hook_slot_name[m->hook_point_slot[i]]);
        if (d < best_d) best_d = d, best = m->hook_slot_name[m->hook_point_slot[i]];
    }
    qkv_failc_(ctx, QKV_ERR_ARG, "%s: no hook point \"%.80s\" in this model (did you mean \"%s\"? the %d points are "
               "hook_embed, blocks.L.hook_resid_pre, blocks.L.attn.hook_q, ..., ln_final.hook_normalized as "
               "qkv_model_hook_name lists them)", fn, name, best ? best : "", m->n_hook_points);
    return -1;
}

int qkv_model_hook_find(qkv_ctx *ctx, const qkv_model *m, const char *name) {
    const char *fn = "qkv_model_hook_find";
    if (!ctx || ctx->status) return -1;
    if (!m) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: model is NULL", fn), -1;
    int slot = find_slot(ctx, fn, m, name);
    for (int i = 0; slot >= 0 && i < m->n_hook_points; i++)
        if (m->hook_point_slot[i] == slot) return i;
    return -1;
}

/* The kind of a slot, and its name for messages. */
static qkv_hook_kind_ slot_kind(int slot) { return (qkv_hook_kind_)(slot % QKV_HOOK_KIND_COUNT_); }
static const char *slot_name(const qkv_model *m, int slot) {
    return m->hook_slot_name[slot] ? m->hook_slot_name[slot] : "blocks.L.attn.(scores before the soft-cap)";
}

/* ---- what runs at a point ---------------------------------------------------------------------------------- */

/* u8 mask of value's shape: 1 at position pos (-1 all) of head head (-1 all) for every batch element. */
static qkv_tensor *patch_mask(qkv_ctx *ctx, const qkv_model *m, qkv_hook_kind_ k, const qkv_tensor *value,
                              int64_t pos, int64_t head) {
    qkv_tensor *mask = qkv_zeros(ctx, QKV_U8, value->ndim, value->shape);
    if (!mask) return NULL;
    int64_t heads = kind_heads(m, k), rows = value->shape[0], n = value->shape[1];
    int64_t inner = value->numel / (rows * n);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++)
            if ((pos < 0 || i == pos) && (head < 0 || (heads && r % heads == head)))
                memset(qkv_u8(mask) + (r * n + i) * inner, 1, (size_t)inner);
    return mask;
}

/* The mean over the batch of value, broadcast back to its shape (no gradient): rows r and r' of the same head
 * (r % heads) average together; for [B, n, .] every row does. */
static qkv_tensor *batch_mean(qkv_ctx *ctx, const qkv_model *m, qkv_hook_kind_ k, const qkv_tensor *value) {
    qkv_tensor *mean = qkv_zeros(ctx, QKV_F64, value->ndim, value->shape);
    if (!mean) return NULL;
    int64_t heads = kind_heads(m, k), rows = value->shape[0], per = value->numel / rows;
    int64_t groups = heads ? heads : 1, batch = rows / groups;
    double *out = qkv_f64(mean);
    for (int64_t g = 0; g < groups; g++)
        for (int64_t e = 0; e < per; e++) {
            double sum = 0.0; // mean[g, e] = sum_b value[b groups + g, e] / batch
            for (int64_t b = 0; b < batch; b++) {
                int64_t at = (b * groups + g) * per + e;
                sum += value->dtype == QKV_F64 ? qkv_f64(value)[at] : (double)qkv_f32(value)[at];
            }
            for (int64_t b = 0; b < batch; b++) out[(b * groups + g) * per + e] = sum / (double)batch;
        }
    return value->dtype == QKV_F64 ? mean : qkv_to_dtype(ctx, mean, value->dtype);
}

/* A patch or ablation at slot on value: where(mask, fill, value). */
static qkv_tensor *apply_patch(qkv_ctx *ctx, const qkv_model *m, int slot, qkv_tensor *value) {
    const char *fn = "qkv_model_forward";
    const qkv_hook_slot_ *s = &m->hook_slots[slot];
    qkv_hook_kind_ k = slot_kind(slot);
    int64_t n = value->shape[1];
    if (s->pos >= n)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: the patch at \"%s\" is at position %" PRId64 ", outside [0, n = %" PRId64
                         ") of this forward", fn, slot_name(m, slot), s->pos, n);
    qkv_tensor *fill;
    bool was = qkv_set_grad_enabled(ctx, false); // the mask and the mean carry no gradient
    switch (s->ablation) {
    case QKV_ABLATE_ZERO: fill = qkv_zeros(ctx, value->dtype, 1, (int64_t[]){1}); break;
    case QKV_ABLATE_MEAN: fill = batch_mean(ctx, m, k, value); break;
    default: fill = (qkv_tensor *)s->source; break;
    }
    qkv_tensor *mask = patch_mask(ctx, m, k, value, s->pos, s->head);
    qkv_set_grad_enabled(ctx, was);
    if (!fill || !mask) return NULL;
    if (s->ablation == QKV_ABLATE_RESAMPLE) {
        if (!qkv_tensor_is_live_(ctx, fill))
            return qkv_fail_(ctx, QKV_ERR_STATE, "%s: the source patched in at \"%s\" is no longer live (a step tensor of "
                             "an earlier step?)", fn, slot_name(m, slot));
        if (!qkv_same_shape_(fill, value) || fill->dtype != value->dtype)
            return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: the source patched in at \"%s\" is %s %s, the activation is %s %s: "
                             "they must agree", fn, slot_name(m, slot), qkv_dtype_name(fill->dtype), QKV_SHAPE(fill),
                             qkv_dtype_name(value->dtype), QKV_SHAPE(value));
    }
    return qkv_where(ctx, mask, fill, value); // value' = mask ? fill : value
}

/* qkv_model_ablate_head's switches on z [B*H, n, d_head] of one layer: z' = z * keep (+ fill), keep 0 on the rows of
 * an ablated head and 1 elsewhere, fill 0, or (mean ablation) each column's mean over that head's B*n rows. */
static qkv_tensor *ablate_heads(qkv_ctx *ctx, const qkv_model *m, int64_t layer, qkv_tensor *z) {
    const qkv_ablation_kind *kind = m->blocks[layer].ablation;
    int64_t H = m->cfg.n_head, dh = m->d_head, n = z->shape[1], B = z->shape[0] / H;
    bool was = qkv_set_grad_enabled(ctx, false); // keep and fill carry no gradient
    qkv_tensor *keep = qkv_ones(ctx, z->dtype, 3, z->shape), *fill = qkv_zeros(ctx, z->dtype, 3, z->shape);
    qkv_set_grad_enabled(ctx, was);
    if (!keep || !fill) return NULL;
    bool any_mean = false;
    for (int64_t h = 0; h < H; h++) {
        if (kind[h] == QKV_ABLATE_NONE) continue;
        for (int64_t j = 0; j < dh; j++) {
            double sum = 0.0; // mean_j = sum over b, i of z[b H + h, i, j] / (B n)
            for (int64_t b = 0; b < B; b++)
                for (int64_t i = 0; i < n; i++) {
                    int64_t at = ((b * H + h) * n + i) * dh + j;
                    sum += z->dtype == QKV_F64 ? qkv_f64(z)[at] : (double)qkv_f32(z)[at];
                }
            double mean = B * n > 0 ? sum / (double)(B * n) : 0.0;
            for (int64_t b = 0; b < B; b++)
                for (int64_t i = 0; i < n; i++) {
                    int64_t at = ((b * H + h) * n + i) * dh + j;
                    qkv_set_flat(ctx, keep, at, 0.0);
                    if (kind[h] == QKV_ABLATE_MEAN) qkv_set_flat(ctx, fill, at, mean), any_mean = true;
                }
        }
    }
    if (ctx->status) return NULL;
    qkv_tensor *y = qkv_mul(ctx, z, keep);
    return any_mean ? qkv_add(ctx, y, fill) : y;
}

qkv_tensor *qkv_model_hook_run_(qkv_ctx *ctx, qkv_model *m, int slot, qkv_tensor *t) {
    qkv_hook_slot_ *s = &m->hook_slots[slot];
    if (!s->want || ctx->status) return t;
    if (s->want & QKV_WANT_HOOK_) {
        const char *name = slot_name(m, slot);
        qkv_tensor *r = s->fn ? s->fn(ctx, name, t, s->user) : apply_patch(ctx, m, slot, t);
        if (ctx->status) {
            char where[160];
            snprintf(where, sizeof where, "qkv_model_forward: hook \"%s\"", name);
            qkv_name_caller_(ctx, where);
            return NULL;
        }
        if (r && r != t) {
            if (!qkv_tensor_is_live_(ctx, r))
                return qkv_fail_(ctx, QKV_ERR_ARG, "qkv_model_forward: the hook at \"%s\" returned a tensor that is "
                                 "not live", name);
            if (!qkv_same_shape_(r, t) || r->dtype != t->dtype)
                return qkv_fail_(ctx, QKV_ERR_SHAPE, "qkv_model_forward: the hook at \"%s\" returned %s %s for the "
                                 "activation %s %s: a replacement must have the activation's shape and dtype", name,
                                 qkv_dtype_name(r->dtype), QKV_SHAPE(r), qkv_dtype_name(t->dtype), QKV_SHAPE(t));
            t = r;
        }
    }
    if ((s->want & QKV_WANT_ABLATE_HEADS_) && !(t = ablate_heads(ctx, m, slot / QKV_HOOK_KIND_COUNT_, t))) return NULL;
    if ((s->want & (QKV_WANT_CACHE_ | QKV_WANT_INSPECT_)) && !m->hooks_no_keep) m->hook_values[slot] = t;
    return t;
}

/* ---- hooks, patches, ablations ---------------------------------------------------------------------------- */

static qkv_status check_model(qkv_ctx *ctx, const char *fn, const qkv_model *m) {
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!m) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: model is NULL", fn);
    if (m->ctx != ctx) return qkv_failc_(ctx, QKV_ERR_ARG, "%s: the model belongs to another context", fn);
    return QKV_OK;
}

/* The slot of name, free for a hook (QKV_ERR_STATE if it has one), or -1. */
static int free_hook_slot(qkv_ctx *ctx, const char *fn, qkv_model *m, const char *name) {
    int slot = find_slot(ctx, fn, m, name);
    if (slot >= 0 && (m->hook_slots[slot].want & QKV_WANT_HOOK_))
        return qkv_failc_(ctx, QKV_ERR_STATE, "%s: \"%s\" already has a hook, patch or ablation (one per point; "
                          "qkv_model_clear_hooks removes them)", fn, name), -1;
    return slot;
}

qkv_status qkv_model_add_hook(qkv_ctx *ctx, qkv_model *m, const char *name, qkv_hook_fn fn, void *user) {
    const char *f = "qkv_model_add_hook";
    if (check_model(ctx, f, m)) return ctx ? ctx->status : QKV_ERR_NULL;
    if (!fn) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: fn is NULL", f);
    int slot = free_hook_slot(ctx, f, m, name);
    if (slot < 0) return ctx->status;
    qkv_hook_slot_ *s = &m->hook_slots[slot];
    s->fn = fn, s->user = user, s->ablation = QKV_ABLATE_NONE, s->source = NULL;
    s->want |= QKV_WANT_HOOK_;
    qkv_model_hooks_update_(m);
    return QKV_OK;
}

void qkv_model_clear_hooks(qkv_model *m) {
    if (!m) return;
    for (int s = 0; s < m->n_hook_slots; s++) {
        qkv_hook_slot_ *h = &m->hook_slots[s];
        h->want &= (uint8_t)~QKV_WANT_HOOK_;
        h->fn = NULL, h->user = NULL, h->source = NULL, h->ablation = QKV_ABLATE_NONE;
    }
    qkv_model_hooks_update_(m);
}

qkv_status qkv_model_ablate(qkv_ctx *ctx, qkv_model *m, const char *name, int64_t pos, int64_t head,
                            qkv_ablation_kind kind, const qkv_tensor *source) {
    const char *fn = "qkv_model_ablate";
    if (check_model(ctx, fn, m)) return ctx ? ctx->status : QKV_ERR_NULL;
    if (kind != QKV_ABLATE_ZERO && kind != QKV_ABLATE_MEAN && kind != QKV_ABLATE_RESAMPLE)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: kind %d: it must be QKV_ABLATE_ZERO, _MEAN or _RESAMPLE", fn, (int)kind);
    if ((kind == QKV_ABLATE_RESAMPLE) != (source != NULL))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: %s", fn, source ? "source is only for QKV_ABLATE_RESAMPLE"
                                                                 : "QKV_ABLATE_RESAMPLE needs a source");
    if (source && !qkv_check_tensor_(ctx, fn, "source", source)) return ctx->status;
    int slot = free_hook_slot(ctx, fn, m, name);
    if (slot < 0) return ctx->status;
    qkv_hook_kind_ k = slot_kind(slot);
    int64_t heads = kind_heads(m, k);
    if (pos < -1 || pos >= m->cfg.n_ctx)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: \"%s\": position %" PRId64 " is outside [0, n_ctx = %" PRId64
                          ") (or -1 for every position)", fn, name, pos, m->cfg.n_ctx);
    if (head != -1 && (!heads || head < 0 || head >= heads))
        return qkv_failc_(ctx, QKV_ERR_ARG, heads ? "%s: \"%s\": head %" PRId64 " is outside [0, %" PRId64
                          ") (or -1 for every head)" : "%s: \"%s\": head %" PRId64 ": the point has no heads "
                          "(%" PRId64 "); pass -1", fn, name, head, heads);
    if (source && source->ndim >= 2 && source->shape[1] <= pos)
        return qkv_failc_(ctx, QKV_ERR_SHAPE, "%s: \"%s\": source %s has no position %" PRId64, fn, name,
                          QKV_SHAPE(source), pos);
    qkv_hook_slot_ *s = &m->hook_slots[slot];
    s->fn = NULL, s->user = NULL, s->ablation = kind, s->pos = pos, s->head = head, s->source = source;
    s->want |= QKV_WANT_HOOK_;
    qkv_model_hooks_update_(m);
    return QKV_OK;
}

qkv_status qkv_model_patch(qkv_ctx *ctx, qkv_model *m, const char *name, int64_t pos, int64_t head,
                           const qkv_tensor *source) {
    if (ctx && !ctx->status && !source) return qkv_failc_(ctx, QKV_ERR_NULL, "qkv_model_patch: source is NULL");
    qkv_status st = qkv_model_ablate(ctx, m, name, pos, head, QKV_ABLATE_RESAMPLE, source);
    if (ctx && st) qkv_name_caller_(ctx, "qkv_model_patch");
    return st;
}

/* ---- the cache ----------------------------------------------------------------------------------------------- */

/* '*' any run (dots included), '?' one character, else itself. */
static bool glob_match(const char *glob, const char *s) {
    const char *star = NULL, *resume = NULL;
    while (*s) {
        if (*glob == '*') star = glob++, resume = s;
        else if (*glob == '?' || *glob == *s) glob++, s++;
        else if (star) glob = star + 1, s = ++resume;
        else return false;
    }
    while (*glob == '*') glob++;
    return !*glob;
}

qkv_status qkv_model_cache_select(qkv_ctx *ctx, qkv_model *m, const char *glob) {
    const char *fn = "qkv_model_cache_select";
    if (check_model(ctx, fn, m)) return ctx ? ctx->status : QKV_ERR_NULL;
    if (!glob) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: glob is NULL", fn);
    int hits = 0;
    for (int i = 0; i < m->n_hook_points; i++)
        if (glob_match(glob, m->hook_slot_name[m->hook_point_slot[i]])) hits++;
    if (!hits) {
        if (!strpbrk(glob, "*?")) return find_slot(ctx, fn, m, glob), ctx->status; // an exact name: say what is near
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: \"%.80s\" matches none of the model's %d hook points (e.g. "
                          "\"blocks.*.hook_resid_post\", \"*hook_pattern\"; qkv_model_hook_name lists them)", fn, glob,
                          m->n_hook_points);
    }
    for (int i = 0; i < m->n_hook_points; i++)
        if (glob_match(glob, m->hook_slot_name[m->hook_point_slot[i]]))
            m->hook_slots[m->hook_point_slot[i]].want |= QKV_WANT_CACHE_;
    qkv_model_hooks_update_(m);
    return QKV_OK;
}

qkv_status qkv_model_cache_select_fn(qkv_ctx *ctx, qkv_model *m, qkv_hook_filter_fn keep, void *user) {
    const char *fn = "qkv_model_cache_select_fn";
    if (check_model(ctx, fn, m)) return ctx ? ctx->status : QKV_ERR_NULL;
    if (!keep) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: keep is NULL", fn);
    for (int i = 0; i < m->n_hook_points; i++)
        if (keep(m->hook_slot_name[m->hook_point_slot[i]], user))
            m->hook_slots[m->hook_point_slot[i]].want |= QKV_WANT_CACHE_;
    qkv_model_hooks_update_(m);
    return QKV_OK;
}

void qkv_model_cache_clear(qkv_model *m) {
    if (!m) return;
    for (int s = 0; s < m->n_hook_slots; s++) m->hook_slots[s].want &= (uint8_t)~QKV_WANT_CACHE_;
    qkv_model_hooks_update_(m);
}

qkv_tensor *qkv_model_run_with_cache(qkv_ctx *ctx, qkv_model *m, const qkv_tensor *ids, int flags, const char *glob) {
    if (check_model(ctx, "qkv_model_run_with_cache", m)) return NULL;
    qkv_model_cache_clear(m);
    if (qkv_model_cache_select(ctx, m, glob)) {
        qkv_name_caller_(ctx, "qkv_model_run_with_cache");
        return NULL;
    }
    qkv_tensor *logits = qkv_model_forward(ctx, m, ids, flags);
    if (!logits) qkv_name_caller_(ctx, "qkv_model_run_with_cache");
    return logits;
}

/* The last forward's kept value of slot, or NULL with QKV_ERR_STATE (fn the caller, what the consumer). */
static qkv_tensor *kept_value(qkv_ctx *ctx, const char *fn, const qkv_model *m, int slot) {
    if (m->hook_epoch == 0 || m->hook_epoch != ctx->epoch)
        return qkv_fail_(ctx, QKV_ERR_STATE, "%s: no forward that keeps \"%s\" has run in this step", fn,
                         slot_name(m, slot));
    return m->hook_values[slot];
}

qkv_tensor *qkv_model_cached(qkv_ctx *ctx, const qkv_model *m, const char *name) {
    const char *fn = "qkv_model_cached";
    if (check_model(ctx, fn, m)) return NULL;
    int slot = find_slot(ctx, fn, m, name);
    if (slot < 0) return NULL;
    if (!(m->hook_slots[slot].want & QKV_WANT_CACHE_))
        return qkv_fail_(ctx, QKV_ERR_STATE, "%s: \"%s\" is not selected for the cache (qkv_model_cache_select)", fn,
                         name);
    return kept_value(ctx, fn, m, slot);
}

qkv_status qkv_model_cache_save_npy(qkv_ctx *ctx, const qkv_model *m, const char *dir, int *written) {
    const char *fn = "qkv_model_cache_save_npy";
    if (written) *written = 0;
    if (check_model(ctx, fn, m)) return ctx ? ctx->status : QKV_ERR_NULL;
    if (!dir) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: dir is NULL", fn);
    for (int i = 0; i < m->n_hook_points; i++) {
        int slot = m->hook_point_slot[i];
        if (!(m->hook_slots[slot].want & QKV_WANT_CACHE_)) continue;
        qkv_tensor *t = kept_value(ctx, fn, m, slot);
        if (!t) return ctx->status;
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s.npy", dir, m->hook_slot_name[slot]) >= (int)sizeof path)
            return qkv_failc_(ctx, QKV_ERR_ARG, "%s: the path %s/%s.npy is too long", fn, dir, m->hook_slot_name[slot]);
        if (qkv_npy_save(ctx, t, path)) {
            qkv_name_caller_(ctx, fn);
            return ctx->status;
        }
        if (written) (*written)++;
    }
    return QKV_OK;
}

/* ---- inspection (model.h): the same slots ------------------------------------------------------------------ */

static const qkv_hook_kind_ inspect_kind[QKV_INSPECT_KIND_COUNT] = {
    [QKV_INSPECT_RESID_PRE] = QKV_HOOK_RESID_PRE_, [QKV_INSPECT_RESID_MID] = QKV_HOOK_RESID_MID_,
    [QKV_INSPECT_RESID_POST] = QKV_HOOK_RESID_POST_, [QKV_INSPECT_PATTERN] = QKV_HOOK_PATTERN_,
    [QKV_INSPECT_HEAD_OUT] = QKV_HOOK_Z_, [QKV_INSPECT_SCORES] = QKV_HOOK_SCORES_RAW_,
};

bool qkv_model_set_inspect(qkv_model *m, bool on) {
    if (!m) return false;
    bool was = m->inspect;
    m->inspect = on;
    for (int64_t l = 0; l < m->cfg.n_layer; l++)
        for (int k = 0; k < QKV_INSPECT_KIND_COUNT; k++) {
            qkv_hook_slot_ *s = &m->hook_slots[qkv_hook_slot_index_(m, l, inspect_kind[k])];
            s->want = on ? (uint8_t)(s->want | QKV_WANT_INSPECT_) : (uint8_t)(s->want & ~QKV_WANT_INSPECT_);
        }
    qkv_model_hooks_update_(m);
    return was;
}

qkv_tensor *qkv_model_inspect(qkv_ctx *ctx, const qkv_model *m, qkv_inspect_kind what, int64_t layer) {
    const char *fn = "qkv_model_inspect";
    if (!ctx || ctx->status) return NULL;
    if (!m) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: model is NULL", fn);
    if ((unsigned)what >= QKV_INSPECT_KIND_COUNT)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: kind %d is not a qkv_inspect_kind", fn, (int)what);
    if (layer < 0 || layer >= m->cfg.n_layer)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: layer %" PRId64 " is outside [0, n_layer = %" PRId64 ")", fn, layer,
                         m->cfg.n_layer);
    if (!m->inspect)
        return qkv_fail_(ctx, QKV_ERR_STATE, "%s: inspection is off: call qkv_model_set_inspect(m, true) before the "
                         "forward", fn);
    if (m->hook_epoch != ctx->epoch)
        return qkv_fail_(ctx, QKV_ERR_STATE, "%s: no forward with inspection on has run in this step", fn);
    if (what == QKV_INSPECT_SCORES && m->cfg.attn_diff)
        return qkv_fail_(ctx, QKV_ERR_STATE, "%s: QKV_INSPECT_SCORES of a model with config.attn_diff: differential "
                         "attention has two score matrices and no single one (PATTERN is A1 - lambda A2)", fn);
    return m->hook_values[qkv_hook_slot_index_(m, layer, inspect_kind[what])];
}

qkv_hook_slot_ *qkv_model_hooks_suspend_(qkv_ctx *ctx, qkv_model *m, const char *fn) {
    qkv_hook_slot_ *saved = qkv_arena_array_(ctx, fn, (size_t)m->n_hook_slots, sizeof *saved);
    if (!saved) return NULL;
    memcpy(saved, m->hook_slots, (size_t)m->n_hook_slots * sizeof *saved);
    for (int s = 0; s < m->n_hook_slots; s++) m->hook_slots[s] = (qkv_hook_slot_){0};
    qkv_model_hooks_update_(m);
    return saved;
}

void qkv_model_hooks_restore_(qkv_model *m, const qkv_hook_slot_ *saved) {
    memcpy(m->hook_slots, saved, (size_t)m->n_hook_slots * sizeof *saved);
    qkv_model_hooks_update_(m);
}

qkv_status qkv_model_hook_keep_(qkv_model *m, int64_t layer, qkv_hook_kind_ kind) {
    m->hook_slots[qkv_hook_slot_index_(m, layer, kind)].want |= QKV_WANT_CACHE_;
    qkv_model_hooks_update_(m);
    return QKV_OK;
}

/* ---- qkv_model_ablate_head (model.h): a writer at blocks.L.attn.hook_z -------------------------------------- */

qkv_status qkv_model_ablate_head(qkv_ctx *ctx, qkv_model *m, int64_t layer, int64_t head, qkv_ablation_kind kind) {
    const char *fn = "qkv_model_ablate_head";
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!m) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: model is NULL", fn);
    if (layer < 0 || layer >= m->cfg.n_layer || head < 0 || head >= m->cfg.n_head)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: layer %" PRId64 ", head %" PRId64 ": the model has %" PRId64
                          " layers of %" PRId64 " heads", fn, layer, head, m->cfg.n_layer, m->cfg.n_head);
    if ((unsigned)kind >= QKV_ABLATE_KIND_COUNT || kind == QKV_ABLATE_RESAMPLE)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: kind %d is not a qkv_ablation_kind of a head (none, zero, mean; "
                          "qkv_model_ablate resamples at any hook point)", fn, (int)kind);
    m->blocks[layer].ablation[head] = kind;
    bool any = false;
    for (int64_t h = 0; h < m->cfg.n_head; h++) any |= m->blocks[layer].ablation[h] != QKV_ABLATE_NONE;
    qkv_hook_slot_ *s = &m->hook_slots[qkv_hook_slot_index_(m, layer, QKV_HOOK_Z_)];
    s->want = any ? (uint8_t)(s->want | QKV_WANT_ABLATE_HEADS_) : (uint8_t)(s->want & ~QKV_WANT_ABLATE_HEADS_);
    qkv_model_hooks_update_(m);
    return QKV_OK;
}

void qkv_model_clear_ablations(qkv_model *m) {
    if (!m) return;
    for (int64_t l = 0; l < m->cfg.n_layer; l++) {
        for (int64_t h = 0; h < m->cfg.n_head; h++) m->blocks[l].ablation[h] = QKV_ABLATE_NONE;
        m->hook_slots[qkv_hook_slot_index_(m, l, QKV_HOOK_Z_)].want &= (uint8_t)~QKV_WANT_ABLATE_HEADS_;
    }
    qkv_model_hooks_update_(m);
}

/* ---- the patching sweep ---------------------------------------------------------------------------------------- */

qkv_tensor *qkv_model_patch_sweep(qkv_ctx *ctx, qkv_model *m, const char *hook, const qkv_tensor *clean_ids,
                                  const qkv_tensor *corrupted_ids, int flags, int by, qkv_metric_fn metric,
                                  void *user) {
    const char *fn = "qkv_model_patch_sweep";
    if (check_model(ctx, fn, m)) return NULL;
    if (!hook || !metric) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: %s is NULL", fn, !hook ? "hook" : "metric");
    if (by & ~(QKV_PATCH_BY_POS | QKV_PATCH_BY_HEAD))
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: by is %d: it is 0 or QKV_PATCH_BY_POS | QKV_PATCH_BY_HEAD", fn, by);
    if (!qkv_check_tensor_(ctx, fn, "clean_ids", clean_ids) ||
        !qkv_check_tensor_(ctx, fn, "corrupted_ids", corrupted_ids))
        return NULL;
    if (!qkv_same_shape_(clean_ids, corrupted_ids))
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: clean_ids %s and corrupted_ids %s: they must have one shape", fn,
                         QKV_SHAPE(clean_ids), QKV_SHAPE(corrupted_ids));
    /* the point of layer 0 names the kind ("blocks.0.<hook>") */
    char name[128];
    snprintf(name, sizeof name, "blocks.0.%s", hook);
    int slot0 = find_slot(ctx, fn, m, name);
    if (slot0 < 0) return NULL;
    qkv_hook_kind_ kind = slot_kind(slot0);
    if (kind >= QKV_HOOK_LAYER_KINDS_)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: \"%s\" is not a per-layer point (hook is the part after \"blocks.L.\")",
                         fn, hook);
    int64_t heads = kind_heads(m, kind), L = m->cfg.n_layer, n = clean_ids->shape[clean_ids->ndim - 1];
    if ((by & QKV_PATCH_BY_HEAD) && !heads)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: \"%s\" has no heads: QKV_PATCH_BY_HEAD is for attn.hook_q, _k, _v, "
                         "_rot_q, _rot_k, _attn_scores, _pattern and _z", fn, hook);
    int64_t n_pos = by & QKV_PATCH_BY_POS ? n : 1, n_head = by & QKV_PATCH_BY_HEAD ? heads : 1;
    int64_t shape[3] = {L, 0, 0};
    int ndim = 1;
    if (by & QKV_PATCH_BY_POS) shape[ndim++] = n;
    if (by & QKV_PATCH_BY_HEAD) shape[ndim++] = heads;
    qkv_tensor *table = qkv_zeros(ctx, QKV_F64, ndim, shape);
    if (!table) return NULL;

    /* suspend what the user set (slots and inspection), run, and put it back */
    qkv_hook_slot_ *saved = qkv_model_hooks_suspend_(ctx, m, fn);
    if (!saved) return NULL;
    qkv_mark_ mark = qkv_mark_now_(ctx);
    bool was = qkv_set_grad_enabled(ctx, false);
    qkv_tensor **clean = qkv_arena_array_(ctx, fn, (size_t)L, sizeof *clean);
    for (int64_t l = 0; clean && l < L; l++) m->hook_slots[qkv_hook_slot_index_(m, l, kind)].want = QKV_WANT_CACHE_;
    qkv_model_hooks_update_(m);
    if (clean && qkv_model_forward(ctx, m, clean_ids, flags))
        for (int64_t l = 0; l < L; l++) clean[l] = m->hook_values[qkv_hook_slot_index_(m, l, kind)];
    for (int64_t l = 0; l < L && !ctx->status; l++)
        for (int64_t i = 0; i < n_pos && !ctx->status; i++)
            for (int64_t h = 0; h < n_head && !ctx->status; h++) {
                for (int s = 0; s < m->n_hook_slots; s++) m->hook_slots[s] = (qkv_hook_slot_){0};
                qkv_hook_slot_ *s = &m->hook_slots[qkv_hook_slot_index_(m, l, kind)];
                *s = (qkv_hook_slot_){.want = QKV_WANT_HOOK_, .ablation = QKV_ABLATE_RESAMPLE, .source = clean[l],
                                      .pos = by & QKV_PATCH_BY_POS ? i : -1, .head = by & QKV_PATCH_BY_HEAD ? h : -1};
                qkv_model_hooks_update_(m);
                qkv_mark_ run = qkv_mark_now_(ctx);
                qkv_tensor *logits = qkv_model_forward(ctx, m, corrupted_ids, flags);
                double value = logits ? metric(ctx, logits, user) : 0.0;
                if (ctx->status) {
                    char where[200];
                    snprintf(where, sizeof where, "%s: \"blocks.%" PRId64 ".%s\" (position %" PRId64 ", head %" PRId64
                             ")", fn, l, hook, by & QKV_PATCH_BY_POS ? i : -1, by & QKV_PATCH_BY_HEAD ? h : -1);
                    qkv_name_caller_(ctx, where);
                }
                qkv_f64(table)[(l * n_pos + i) * n_head + h] = value;
                qkv_rewind_to_(ctx, run);
            }
    qkv_set_grad_enabled(ctx, was);
    qkv_model_hooks_restore_(m, saved);
    qkv_rewind_to_(ctx, mark);
    return ctx->status ? NULL : table;
}
