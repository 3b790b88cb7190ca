/*
 * checkpoint.c — a model (and optionally its optimizer) as one safetensors file: the parameters under their
 * names, the optimizer state under "optim.<name>", and the configuration in the metadata, so a file can be
 * turned back into the same model, refused with a message naming the field or tensor that differs, or read
 * by PyTorch users (every weight [d_in, d_out]; see qkv/model.h).
 */
#include "model_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>

/* "optim.<name>" in the step arena. */
static char *optim_key(qkv_ctx *ctx, const char *fn, const char *name) {
    size_t len = strlen(name) + sizeof "optim.";
    char *key = qkv_arena_alloc_(ctx, fn, len);
    if (key) snprintf(key, len, "optim.%s", name);
    return key;
}

qkv_status qkv_model_save(qkv_ctx *ctx, const qkv_model *m, const char *path, qkv_optimizer *opt,
                          const char *const *extra, int n_extra) {
    const char *fn = "qkv_model_save";
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!m || !path) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: %s is NULL", fn, !m ? "model" : "path");
    if (n_extra < 0 || (n_extra > 0 && !extra))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: n_extra is %d with extra %s", fn, n_extra, extra ? "set" : "NULL");
    for (int i = 0; i < n_extra; i++) {
        if (!extra[2 * i] || !extra[2 * i + 1])
            return qkv_failc_(ctx, QKV_ERR_NULL, "%s: extra metadata pair %d has a NULL key or value", fn, i);
        if (!strncmp(extra[2 * i], "qkv.", 4))
            return qkv_failc_(ctx, QKV_ERR_ARG, "%s: extra metadata key \"%s\": keys starting with \"qkv.\" are the "
                              "model's own", fn, extra[2 * i]);
    }
    int n_state = opt ? qkv_optim_state_count(opt) : 0;
    int n_fields = qkv_model_config_field_count_();
    qkv_mark_ mark = qkv_mark_now_(ctx);
    qkv_named_tensor *named = qkv_arena_array_(ctx, fn, (size_t)(m->n_params + n_state), sizeof *named);
    const char **meta = qkv_arena_array_(ctx, fn, 2 * (size_t)(1 + n_fields + n_extra), sizeof *meta);
    char *values = qkv_arena_array_(ctx, fn, (size_t)n_fields, 2 * 64);
    qkv_status st = ctx->status;
    if (!st) {
        for (int i = 0; i < m->n_params; i++) named[i] = (qkv_named_tensor){m->names[i], m->params[i]};
        for (int i = 0; i < n_state && !ctx->status; i++) {
            const char *name = NULL;
            qkv_tensor *t = qkv_optim_state(opt, i, &name);
            char *key = t ? optim_key(ctx, fn, name) : NULL;
            named[m->n_params + i] = (qkv_named_tensor){key, t};
        }
        int k = 0;
        meta[k++] = QKV_MODEL_FORMAT_KEY;
        meta[k++] = QKV_MODEL_FORMAT;
        for (int i = 0; i < n_fields; i++) {
            char *key = values + i * 128, *value = key + 64;
            snprintf(key, 64, "qkv.model.%s", qkv_model_config_field_name_(i));
            qkv_model_config_field_str_(&m->cfg, i, value, 64);
            meta[k++] = key;
            meta[k++] = value;
        }
        for (int i = 0; i < 2 * n_extra; i++) meta[k++] = extra[i];
        st = ctx->status ? ctx->status
                         : qkv_safetensors_save(ctx, path, named, m->n_params + n_state, meta, k / 2);
    }
    qkv_rewind_to_(ctx, mark);
    return st;
}

qkv_status qkv_model_config_from_checkpoint(qkv_ctx *ctx, const qkv_safetensors *st, qkv_model_config *cfg) {
    const char *fn = "qkv_model_config_from_checkpoint";
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!st || !cfg) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: %s is NULL", fn, !st ? "checkpoint" : "cfg");
    return qkv_model_config_from_metadata_(ctx, fn, st, cfg);
}

/* The checkpoint's tensor `name` exists with dst's dtype and shape, and (for parameters) is finite. */
static qkv_status check_tensor(qkv_ctx *ctx, const char *fn, const qkv_safetensors *st, const char *name,
                               const qkv_tensor *dst, bool finite) {
    const qkv_tensor *t = qkv_safetensors_get(st, name);
    if (!t) return qkv_failc_(ctx, QKV_ERR_FORMAT, "%s: the checkpoint has no tensor \"%s\" (%s %s)", fn, name,
                              qkv_dtype_name(dst->dtype), QKV_SHAPE(dst));
    if (t->dtype != dst->dtype || !qkv_same_shape_(t, dst))
        return qkv_failc_(ctx, QKV_ERR_FORMAT, "%s: tensor \"%s\" is %s %s in the checkpoint, %s %s in the model", fn,
                          name, qkv_dtype_name(t->dtype), QKV_SHAPE(t), qkv_dtype_name(dst->dtype), QKV_SHAPE(dst));
    for (int64_t i = 0; finite && i < t->numel; i++) {
        double v = t->dtype == QKV_F64 ? qkv_f64(t)[i] : (double)qkv_f32(t)[i];
        if (!isfinite(v))
            return qkv_failc_(ctx, QKV_ERR_FORMAT, "%s: tensor \"%s\" holds %g at flat index %" PRId64
                              ": a parameter must be finite", fn, name, v, i);
    }
    return QKV_OK;
}

/* An optimizer step count ("step" or "<param>.step"): a whole number in [0, 2^53), where a double counts
 * exactly. A count beyond that (1e20, from a bit flip or an edit) is refused here, not clamped, and not left
 * for qkv_optim_step_count to convert to int64_t. */
static bool is_step_counter(const char *name) {
    size_t n = strlen(name);
    return !strcmp(name, "step") || (n > 5 && !strcmp(name + n - 5, ".step"));
}

static qkv_status check_step_counter(qkv_ctx *ctx, const char *fn, const qkv_safetensors *st, const char *key) {
    const qkv_tensor *t = qkv_safetensors_get(st, key);
    double v = t->dtype == QKV_F64 ? qkv_f64(t)[0] : (double)qkv_f32(t)[0];
    if (v >= 0 && v < 9007199254740992.0 && v == floor(v)) return QKV_OK;
    return qkv_failc_(ctx, QKV_ERR_FORMAT, "%s: tensor \"%s\" is %.17g: an optimizer step count must be a whole "
                      "number in [0, 2^53)", fn, key, v);
}

static qkv_status restore(qkv_ctx *ctx, const char *fn, qkv_model *m, const qkv_safetensors *st, qkv_optimizer *opt) {
    qkv_model_config cfg;
    qkv_status s = qkv_model_config_from_metadata_(ctx, fn, st, &cfg);
    if (s) return s;
    int diff = qkv_model_config_diff_(&cfg, &m->cfg);
    if (diff >= 0) {
        char have[64], want[64];
        qkv_model_config_field_str_(&cfg, diff, have, sizeof have);
        qkv_model_config_field_str_(&m->cfg, diff, want, sizeof want);
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.%s is %s in the checkpoint and %s in the model", fn,
                          qkv_model_config_field_name_(diff), have, want);
    }
    // every check first, then every copy: a refused checkpoint leaves the model and optimizer as they were
    for (int i = 0; i < m->n_params; i++)
        if ((s = check_tensor(ctx, fn, st, m->names[i], m->params[i], true))) return s;
    int n_state = opt ? qkv_optim_state_count(opt) : 0;
    qkv_mark_ mark = qkv_mark_now_(ctx);
    for (int i = 0; i < n_state && !s; i++) {
        const char *name = NULL;
        qkv_tensor *t = qkv_optim_state(opt, i, &name);
        char *key = t ? optim_key(ctx, fn, name) : NULL;
        s = key ? check_tensor(ctx, fn, st, key, t, true) : ctx->status;
        if (!s && t->numel == 1 && is_step_counter(name)) s = check_step_counter(ctx, fn, st, key);
    }
    for (int i = 0; i < m->n_params && !s; i++) s = qkv_safetensors_copy_into(ctx, st, m->names[i], m->params[i]);
    for (int i = 0; i < n_state && !s; i++) {
        const char *name = NULL;
        qkv_tensor *t = qkv_optim_state(opt, i, &name);
        char *key = t ? optim_key(ctx, fn, name) : NULL;
        s = key ? qkv_safetensors_copy_into(ctx, st, key, t) : ctx->status;
    }
    qkv_rewind_to_(ctx, mark);
    return s;
}

qkv_status qkv_model_restore(qkv_ctx *ctx, qkv_model *m, const qkv_safetensors *st, qkv_optimizer *opt) {
    const char *fn = "qkv_model_restore";
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!m || !st) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: %s is NULL", fn, !m ? "model" : "checkpoint");
    return restore(ctx, fn, m, st, opt);
}

qkv_model *qkv_model_load(qkv_ctx *ctx, const char *path) {
    const char *fn = "qkv_model_load";
    if (!ctx || ctx->status) return NULL;
    if (!path) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: path is NULL", fn);
    qkv_safetensors *st = qkv_safetensors_load(ctx, path);
    if (!st) return NULL;
    qkv_model_config cfg;
    qkv_model *m = NULL;
    if (!qkv_model_config_from_metadata_(ctx, fn, st, &cfg)) {
        if (cfg.attn_weights_name) // a C function cannot come from a file
            qkv_failc_(ctx, QKV_ERR_ARG,
                       "%s: %s: the model computes its attention weights with the user function \"%s\" "
                       "(qkv.model.attn_weights), which a file cannot hold: make the model with qkv_model_new, that "
                       "function as config.attn_weights and its name, then qkv_model_restore",
                       fn, path, cfg.attn_weights_name);
        else
            m = qkv_model_new_(ctx, fn, &cfg);
    }
    if (m && restore(ctx, fn, m, st, NULL)) {
        qkv_model_free(m);
        m = NULL;
    }
    qkv_safetensors_free(ctx, st);
    return m;
}
