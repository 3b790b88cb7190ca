/*
 * config.c — the model configuration: its defaults, its checks (each message names the field and its value),
 * the names of its enums, and its round trip through a checkpoint's metadata ("qkv.model.<field>" keys).
 */
#include "model_internal.h"

#include "fileio.h" /* QKV_QUOTE_STR: metadata values are file content */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

qkv_model_config qkv_model_default_config(void) {
    qkv_model_config c;
    memset(&c, 0, sizeof c);
    c.vocab = 256;
    c.n_ctx = 128;
    c.d_model = 128;
    c.n_layer = 2;
    c.n_head = 4;
    c.d_mlp = 512;
    c.norm = QKV_NORM_LAYER;
    c.positions = QKV_POS_LEARNED;
    c.qk_norm = QKV_NORM_NONE;
    c.attn_scale = QKV_SCALE_DEFAULT;
    c.attn_softcap = 0.0;
    c.tied_embeddings = false;
    c.dropout = 0.0;
    c.activation = QKV_ACT_GELU;
    c.norm_eps = 1e-5;
    c.init_std = 0.02;
    c.init_embed_std = 0.02;
    c.init_resid_std = -1.0;
    c.attn_variant = QKV_ATTN_SOFTMAX;
    c.attn_gate = QKV_GATE_NONE;
    c.rope_base = 10000.0;
    c.dtype = QKV_F32;
    c.seed = 0;
    return c;
}

static const char *const norm_names[QKV_NORM_KIND_COUNT] = {"none", "layer", "rms"};
static const char *const positions_names[QKV_POS_KIND_COUNT] = {"learned", "sinusoidal", "rope", "none"};
static const char *const activation_names[QKV_ACT_KIND_COUNT] = {"gelu", "gelu_tanh", "relu", "swiglu", "geglu"};
static const char *const gate_names[QKV_GATE_KIND_COUNT] = {"none", "head", "element"};

const char *qkv_norm_kind_name(qkv_norm_kind k) {
    return (unsigned)k < QKV_NORM_KIND_COUNT ? norm_names[k] : NULL;
}
const char *qkv_positions_kind_name(qkv_positions_kind k) {
    return (unsigned)k < QKV_POS_KIND_COUNT ? positions_names[k] : NULL;
}
const char *qkv_activation_kind_name(qkv_activation_kind k) {
    return (unsigned)k < QKV_ACT_KIND_COUNT ? activation_names[k] : NULL;
}
const char *qkv_attn_gate_kind_name(qkv_attn_gate_kind k) {
    return (unsigned)k < QKV_GATE_KIND_COUNT ? gate_names[k] : NULL;
}

bool qkv_model_scale_is_default_(double scale) { return isinf(scale) && scale < 0; }

bool qkv_model_attn_name_ok_(const char *name) {
    size_t n = 0;
    for (; name[n] && n <= QKV_MODEL_ATTN_NAME_MAX; n++)
        if (name[n] < 0x20 || name[n] > 0x7e) return false;
    return n >= 1 && n <= QKV_MODEL_ATTN_NAME_MAX && strcmp(name, "softmax") != 0;
}

/* Largest width or count a field may take: keeps every product of two of them far from overflow. */
#define FIELD_MAX ((int64_t)1 << 24)

static qkv_status field_range(qkv_ctx *ctx, const char *fn, const char *field, int64_t v, int64_t lo, int64_t hi) {
    if (v >= lo && v <= hi) return QKV_OK;
    return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.%s is %" PRId64 ": it must be in [%" PRId64 ", %" PRId64 "]", fn,
                      field, v, lo, hi);
}

qkv_status qkv_model_config_check_(qkv_ctx *ctx, const char *fn, const qkv_model_config *c) {
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!c) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: config is NULL", fn);
    qkv_status st;
    if ((st = field_range(ctx, fn, "vocab", c->vocab, 1, INT32_MAX)) ||
        (st = field_range(ctx, fn, "n_ctx", c->n_ctx, 1, FIELD_MAX)) ||
        (st = field_range(ctx, fn, "d_model", c->d_model, 1, FIELD_MAX)) ||
        (st = field_range(ctx, fn, "n_layer", c->n_layer, 1, 4096)) ||
        (st = field_range(ctx, fn, "n_head", c->n_head, 1, c->d_model)) ||
        (st = field_range(ctx, fn, "d_mlp", c->d_mlp, 0, FIELD_MAX)))
        return st;
    if (c->n_kv_head < 0 || c->n_kv_head > c->n_head || (c->n_kv_head > 0 && c->n_head % c->n_kv_head))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.n_kv_head is %" PRId64 ": it must divide config.n_head %" PRId64
                          " (0: one per head)", fn, c->n_kv_head, c->n_head);
    if (c->d_model % c->n_head)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.d_model %" PRId64 " is not divisible by config.n_head %" PRId64,
                          fn, c->d_model, c->n_head);
    if ((unsigned)c->norm >= QKV_NORM_KIND_COUNT)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.norm is %d: not a qkv_norm_kind (none, layer, rms)", fn,
                          (int)c->norm);
    if ((unsigned)c->qk_norm >= QKV_NORM_KIND_COUNT)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.qk_norm is %d: not a qkv_norm_kind (none, layer, rms)", fn,
                          (int)c->qk_norm);
    if ((unsigned)c->positions >= QKV_POS_KIND_COUNT)
        return qkv_failc_(ctx, QKV_ERR_ARG,
                          "%s: config.positions is %d: not a qkv_positions_kind (learned, sinusoidal, rope, none)", fn,
                          (int)c->positions);
    if ((unsigned)c->activation >= QKV_ACT_KIND_COUNT)
        return qkv_failc_(ctx, QKV_ERR_ARG,
                          "%s: config.activation is %d: not a qkv_activation_kind (gelu, gelu_tanh, relu, swiglu, geglu)", fn,
                          (int)c->activation);
    if (c->positions == QKV_POS_ROPE && (c->d_model / c->n_head) % 2)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.positions is rope and d_head = %" PRId64 " / %" PRId64
                          " = %" PRId64 " is odd: rope rotates pairs of columns", fn, c->d_model, c->n_head,
                          c->d_model / c->n_head);
    if (!c->attn_weights != !c->attn_weights_name)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.attn_weights is %s but config.attn_weights_name is %s: a user's "
                          "attention weights need both (the name is what checkpoints record)", fn,
                          c->attn_weights ? "set" : "NULL", c->attn_weights_name ? "set" : "NULL");
    if (c->attn_weights_name && !qkv_model_attn_name_ok_(c->attn_weights_name))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.attn_weights_name \"%.63s\" is not a name of 1 to 63 printable "
                          "characters other than \"softmax\"", fn, c->attn_weights_name);
    if (!qkv_attn_variant_name(c->attn_variant))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.attn_variant is %d: not a qkv_attn_variant", fn,
                          (int)c->attn_variant);
    if (c->attn_variant != QKV_ATTN_SOFTMAX && (c->attn_weights || c->attn_weights_name))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.attn_variant %s with config.attn_weights: a user's weights "
                          "replace the softmax, and combine with attn_variant softmax only", fn,
                          qkv_attn_variant_name(c->attn_variant));
    if (c->attn_diff && (c->attn_variant != QKV_ATTN_SOFTMAX || c->attn_softcap > 0 || c->attn_weights ||
                         c->attn_weights_name))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.attn_diff with %s: differential attention is the difference "
                          "of two softmax maps of its own, and combines with attn_variant softmax only, without a "
                          "soft-cap or a user's weights", fn,
                          c->attn_variant != QKV_ATTN_SOFTMAX ? "config.attn_variant other than softmax"
                          : c->attn_softcap > 0 ? "config.attn_softcap > 0" : "config.attn_weights");
    if (c->attn_diff && (c->d_model / c->n_head) % (c->positions == QKV_POS_ROPE ? 4 : 2))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.attn_diff with d_head = %" PRId64 " / %" PRId64 " = %" PRId64
                          ": differential attention splits each head's q and k in two halves, so d_head must be "
                          "even%s", fn, c->d_model, c->n_head, c->d_model / c->n_head,
                          c->positions == QKV_POS_ROPE ? ", and a multiple of 4 with rope (each half is rotated)" : "");
    if ((unsigned)c->attn_gate >= QKV_GATE_KIND_COUNT)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.attn_gate is %d: not a qkv_attn_gate_kind (none, head, element)",
                          fn, (int)c->attn_gate);
    if (!isfinite(c->attn_scale) && !qkv_model_scale_is_default_(c->attn_scale))
        return qkv_failc_(ctx, QKV_ERR_ARG,
                          "%s: config.attn_scale is %g: it must be finite, or QKV_SCALE_DEFAULT for 1/sqrt(d_head)",
                          fn, c->attn_scale);
    if (!(c->attn_softcap >= 0) || !isfinite(c->attn_softcap))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.attn_softcap is %g: it must be finite and >= 0 (0 = off)", fn,
                          c->attn_softcap);
    if (!(c->dropout >= 0 && c->dropout < 1))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.dropout is %g: it must be in [0, 1)", fn, c->dropout);
    if (!(c->norm_eps > 0) || !isfinite(c->norm_eps))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.norm_eps is %g: it must be finite and > 0", fn, c->norm_eps);
    if (!(c->init_std >= 0) || !isfinite(c->init_std))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.init_std is %g: it must be finite and >= 0", fn, c->init_std);
    if (!(c->init_embed_std >= 0) || !isfinite(c->init_embed_std))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.init_embed_std is %g: it must be finite and >= 0", fn,
                          c->init_embed_std);
    if (!isfinite(c->init_resid_std))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.init_resid_std is %g: it must be finite (< 0: GPT-2's "
                          "init_std / sqrt(2 n_layer))", fn, c->init_resid_std);
    if (!(c->rope_base > 1) || !isfinite(c->rope_base))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: config.rope_base is %g: it must be finite and > 1", fn, c->rope_base);
    if (c->dtype != QKV_F32 && c->dtype != QKV_F64)
        return qkv_failc_(ctx, QKV_ERR_DTYPE, "%s: config.dtype is %s: it must be f32 or f64", fn,
                          (unsigned)c->dtype < QKV_DTYPE_COUNT ? qkv_dtype_name(c->dtype) : "not a qkv_dtype");
    return QKV_OK;
}

qkv_status qkv_model_config_check(qkv_ctx *ctx, const qkv_model_config *cfg) {
    return qkv_model_config_check_(ctx, "qkv_model_config_check", cfg);
}

/* ---- the configuration as metadata --------------------------------------------------------------- */

/* Fields as (key, kind, offset, value when absent): one table drives writing, reading and comparing. A field
 * added after the format was first written has the value that reproduces older files' models when it is
 * absent (absent NULL: required). */
typedef enum { F_INT, F_REAL, F_BOOL, F_NORM, F_POS, F_ACT, F_DTYPE, F_U64, F_ATTN, F_VARIANT, F_GATE } field_kind;
typedef struct {
    const char *name;
    field_kind kind;
    size_t offset;
    const char *absent;
} field;

#define FIELD(n, k) {#n, k, offsetof(qkv_model_config, n), NULL}
#define FIELD_SINCE(n, k, absent) {#n, k, offsetof(qkv_model_config, n), absent}
static const field fields[] = {
    FIELD(vocab, F_INT),          FIELD(n_ctx, F_INT),          FIELD(d_model, F_INT),
    FIELD(n_layer, F_INT),        FIELD(n_head, F_INT),         FIELD(d_mlp, F_INT),
    FIELD(norm, F_NORM),          FIELD(positions, F_POS),      FIELD(qk_norm, F_NORM),
    FIELD(attn_scale, F_REAL),    FIELD(attn_softcap, F_REAL),  FIELD(tied_embeddings, F_BOOL),
    FIELD(dropout, F_REAL),       FIELD(activation, F_ACT),     FIELD(norm_eps, F_REAL),
    FIELD(rope_base, F_REAL),     FIELD(dtype, F_DTYPE),        FIELD(seed, F_U64),
    /* the name of a user's attention weights, or "softmax" */
    {"attn_weights", F_ATTN, offsetof(qkv_model_config, attn_weights_name), "softmax"},
    FIELD_SINCE(attn_bias, F_BOOL, "false"),
    FIELD_SINCE(n_kv_head, F_INT, "0"),
    FIELD_SINCE(init_std, F_REAL, "0.02"),
    FIELD_SINCE(init_embed_std, F_REAL, "0.02"),
    FIELD_SINCE(init_resid_std, F_REAL, "-1"),
    FIELD_SINCE(attn_variant, F_VARIANT, "softmax"),
    FIELD_SINCE(attn_gate, F_GATE, "none"),
    FIELD_SINCE(attn_diff, F_BOOL, "false"),
};
#define N_FIELDS ((int)(sizeof fields / sizeof fields[0]))

int qkv_model_config_field_count_(void) { return N_FIELDS; }
const char *qkv_model_config_field_name_(int i) { return fields[i].name; }

/* The field's value as text: integers in decimal, reals exactly (%.17g; the default scale as "default"),
 * enums and dtypes by name, bools as true/false. */
void qkv_model_config_field_str_(const qkv_model_config *c, int i, char *buf, size_t size) {
    const void *p = (const char *)c + fields[i].offset;
    switch (fields[i].kind) {
    case F_INT: snprintf(buf, size, "%" PRId64, *(const int64_t *)p); break;
    case F_U64: snprintf(buf, size, "%" PRIu64, *(const uint64_t *)p); break;
    case F_REAL: {
        double v = *(const double *)p;
        if (qkv_model_scale_is_default_(v)) snprintf(buf, size, "default");
        else snprintf(buf, size, "%.17g", v);
        break;
    }
    case F_BOOL: snprintf(buf, size, "%s", *(const bool *)p ? "true" : "false"); break;
    case F_NORM: {
        const char *s = qkv_norm_kind_name(*(const qkv_norm_kind *)p);
        snprintf(buf, size, "%s", s ? s : "?");
        break;
    }
    case F_POS: {
        const char *s = qkv_positions_kind_name(*(const qkv_positions_kind *)p);
        snprintf(buf, size, "%s", s ? s : "?");
        break;
    }
    case F_ACT: {
        const char *s = qkv_activation_kind_name(*(const qkv_activation_kind *)p);
        snprintf(buf, size, "%s", s ? s : "?");
        break;
    }
    case F_DTYPE: {
        qkv_dtype d = *(const qkv_dtype *)p;
        snprintf(buf, size, "%s", (unsigned)d < QKV_DTYPE_COUNT ? qkv_dtype_name(d) : "?");
        break;
    }
    case F_ATTN: {
        const char *name = *(const char *const *)p;
        snprintf(buf, size, "%s", name ? name : "softmax");
        break;
    }
    case F_VARIANT: {
        const char *s = qkv_attn_variant_name(*(const qkv_attn_variant *)p);
        snprintf(buf, size, "%s", s ? s : "?");
        break;
    }
    case F_GATE: {
        const char *s = qkv_attn_gate_kind_name(*(const qkv_attn_gate_kind *)p);
        snprintf(buf, size, "%s", s ? s : "?");
        break;
    }
    }
}

static int name_index(const char *const *names, int n, const char *s) {
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], s)) return i;
    return -1;
}

/* Parse text into field i of c; false when it is not a value of the field's kind. */
static bool parse_field(qkv_model_config *c, int i, const char *s) {
    void *p = (char *)c + fields[i].offset;
    char *end = NULL;
    errno = 0;
    switch (fields[i].kind) {
    case F_INT: {
        long long v = strtoll(s, &end, 10);
        if (errno || end == s || *end) return false;
        *(int64_t *)p = v;
        return true;
    }
    case F_U64: {
        if (*s == '-') return false;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || end == s || *end) return false;
        *(uint64_t *)p = v;
        return true;
    }
    case F_REAL: {
        if (!strcmp(s, "default")) {
            *(double *)p = QKV_SCALE_DEFAULT;
            return !strcmp(fields[i].name, "attn_scale");
        }
        double v = strtod(s, &end);
        if (end == s || *end || !isfinite(v)) return false;
        *(double *)p = v;
        return true;
    }
    case F_BOOL:
        if (!strcmp(s, "true")) *(bool *)p = true;
        else if (!strcmp(s, "false")) *(bool *)p = false;
        else return false;
        return true;
    case F_NORM: {
        int k = name_index(norm_names, QKV_NORM_KIND_COUNT, s);
        if (k < 0) return false;
        *(qkv_norm_kind *)p = (qkv_norm_kind)k;
        return true;
    }
    case F_POS: {
        int k = name_index(positions_names, QKV_POS_KIND_COUNT, s);
        if (k < 0) return false;
        *(qkv_positions_kind *)p = (qkv_positions_kind)k;
        return true;
    }
    case F_ACT: {
        int k = name_index(activation_names, QKV_ACT_KIND_COUNT, s);
        if (k < 0) return false;
        *(qkv_activation_kind *)p = (qkv_activation_kind)k;
        return true;
    }
    case F_DTYPE:
        if (!strcmp(s, "f32")) *(qkv_dtype *)p = QKV_F32;
        else if (!strcmp(s, "f64")) *(qkv_dtype *)p = QKV_F64;
        else return false;
        return true;
    case F_VARIANT:
        return qkv_attn_variant_from_name(s, (qkv_attn_variant *)p);
    case F_GATE: {
        int k = name_index(gate_names, QKV_GATE_KIND_COUNT, s);
        if (k < 0) return false;
        *(qkv_attn_gate_kind *)p = (qkv_attn_gate_kind)k;
        return true;
    }
    case F_ATTN: // "softmax", or a user's name: the pointer is into the checkpoint's metadata
        if (!strcmp(s, "softmax")) *(const char **)p = NULL;
        else if (qkv_model_attn_name_ok_(s)) *(const char **)p = s;
        else return false;
        return true;
    }
    return false;
}

qkv_status qkv_model_config_from_metadata_(qkv_ctx *ctx, const char *fn, const qkv_safetensors *st,
                                           qkv_model_config *cfg) {
    qkv_model_config c = qkv_model_default_config();
    const char *format = qkv_safetensors_metadata(st, QKV_MODEL_FORMAT_KEY);
    if (!format)
        return qkv_failc_(ctx, QKV_ERR_FORMAT, "%s: the checkpoint has no \"%s\" metadata: it was not written by "
                          "qkv_model_save", fn, QKV_MODEL_FORMAT_KEY);
    if (strcmp(format, QKV_MODEL_FORMAT))
        return qkv_failc_(ctx, QKV_ERR_FORMAT, "%s: the checkpoint's %s is \"%s\"; this qkv reads \"%s\"", fn,
                          QKV_MODEL_FORMAT_KEY, QKV_QUOTE_STR(format), QKV_MODEL_FORMAT);
    for (int i = 0; i < N_FIELDS; i++) {
        char key[64];
        snprintf(key, sizeof key, "qkv.model.%s", fields[i].name);
        const char *v = qkv_safetensors_metadata(st, key);
        if (!v) v = fields[i].absent; /* a file from before the field */
        if (!v) return qkv_failc_(ctx, QKV_ERR_FORMAT, "%s: the checkpoint's metadata has no %s", fn, key);
        if (!parse_field(&c, i, v))
            return qkv_failc_(ctx, QKV_ERR_FORMAT, "%s: the checkpoint's %s is \"%s\": not a value of that field", fn,
                              key, QKV_QUOTE_STR(v));
    }
    qkv_model_config checked = c; /* a user's attention is named without its function: check the rest */
    checked.attn_weights_name = NULL;
    qkv_status st2 = qkv_model_config_check_(ctx, fn, &checked);
    if (st2) return st2;
    *cfg = c;
    return QKV_OK;
}

int qkv_model_config_diff_(const qkv_model_config *a, const qkv_model_config *b) {
    for (int i = 0; i < N_FIELDS; i++) {
        char sa[64], sb[64];
        qkv_model_config_field_str_(a, i, sa, sizeof sa);
        qkv_model_config_field_str_(b, i, sb, sizeof sb);
        if (strcmp(sa, sb)) return i;
    }
    return -1;
}
