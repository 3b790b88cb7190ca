/*
 * copy_model.c — data, embeddings, model, training step, evaluation and checkpoints of the copy task.
 * See copy_model.h for the task and the model.
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r */
#include "copy_model.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *copy_task_name(copy_task_kind t) {
    return t == TASK_COPY ? "copy" : t == TASK_SHIFT ? "shift" : "reverse";
}

const char *copy_embed_name(copy_embed_kind e) { return e == EMBED_ONEHOT ? "onehot" : "gauss"; }

copy_config copy_default_config(void) {
    copy_config c;
    memset(&c, 0, sizeof c);
    c.task = TASK_REVERSE;
    c.embed = EMBED_ONEHOT;
    c.seed = 0;
    c.steps = 1000;
    c.batch = 32;
    c.n = 8;
    c.vocab = 8;
    c.d_model = 0; /* onehot: V + n */
    c.d_k = 16;
    c.heads = 1;
    c.eval_size = 512;
    c.lr = 0; /* resolved: 0.1 for onehot, 0.01 for gauss */
    c.clip = 0;
    c.scale = QKV_SCALE_DEFAULT;
    c.optimizer = QKV_OPTIM_ADAM;
    c.dtype = QKV_F32;
    c.threads = 1;
    return c;
}

bool copy_config_resolve(copy_config *c, char *err, size_t size) {
    if (c->embed == EMBED_ONEHOT) {
        if (c->d_model != 0 && c->d_model != c->vocab + c->n) {
            snprintf(err, size, "--embed onehot makes d_model = V + n = %lld; --d-model %lld does not match",
                     (long long)(c->vocab + c->n), (long long)c->d_model);
            return false;
        }
        c->d_model = c->vocab + c->n;
    } else if (c->d_model <= 0) {
        c->d_model = 64;
    }
    const struct {
        const char *flag;
        int64_t value, min;
    } least[] = {{"--n", c->n, 1},         {"--V", c->vocab, 2},    {"--batch", c->batch, 1},
                 {"--d-k", c->d_k, 1},     {"--heads", c->heads, 1}, {"--eval", c->eval_size, 1},
                 {"--steps", c->steps, 0}, {"--d-model", c->d_model, 1}};
    for (size_t i = 0; i < sizeof least / sizeof least[0]; i++)
        if (least[i].value < least[i].min) {
            snprintf(err, size, "%s must be at least %lld, got %lld", least[i].flag, (long long)least[i].min,
                     (long long)least[i].value);
            return false;
        }
    if (c->wo) {
        c->d_v = c->d_k;
    } else {
        if (c->vocab % c->heads != 0) {
            snprintf(err, size, "--heads %lld does not divide --V %lld (without --wo the heads split the V logits)",
                     (long long)c->heads, (long long)c->vocab);
            return false;
        }
        c->d_v = c->vocab / c->heads;
    }
    if (c->lr == 0) c->lr = c->embed == EMBED_ONEHOT ? 0.1 : 0.01;
    if (!(c->lr > 0) || !isfinite(c->lr)) {
        snprintf(err, size, "--lr must be a positive number");
        return false;
    }
    if (c->scale != QKV_SCALE_DEFAULT && !isfinite(c->scale)) {
        snprintf(err, size, "--scale must be a finite number or 'default' (1/sqrt(d_k))");
        return false;
    }
    return true;
}

/* ---- data ---------------------------------------------------------------------------------------- */

/* A small counter-based stream: the data of step t depends only on (seed, stream, t). */
typedef struct stream {
    uint64_t state;
} stream;

static uint64_t next_u64(stream *s) {
    uint64_t z = (s->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static stream stream_for(uint64_t seed, uint64_t kind, uint64_t index) {
    stream s = {seed * 0x100000001b3ull ^ (kind << 56) ^ index * 0xd6e8feb86659fd93ull};
    next_u64(&s);
    return s;
}

enum { STREAM_TRAIN = 1, STREAM_EVAL = 2 };

static void random_tokens(stream *s, int32_t *tokens, int64_t count, int64_t vocab) {
    uint64_t v = (uint64_t)vocab;
    if ((v & (v - 1)) == 0) { /* a power of two: x % v is x & (v - 1), without a 64-bit division per token */
        for (int64_t i = 0; i < count; i++) tokens[i] = (int32_t)(next_u64(s) & (v - 1));
        return;
    }
    for (int64_t i = 0; i < count; i++) tokens[i] = (int32_t)(next_u64(s) % v);
}

/* targets[b, i] from tokens[b, :] by the task's position rule; -1 where there is none. */
static void make_targets(const copy_config *c, const int32_t *tokens, int32_t *targets, int64_t batch) {
    int64_t n = c->n;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < n; i++) {
            const int32_t *x = tokens + b * n;
            int32_t t = c->task == TASK_COPY    ? x[i]
                        : c->task == TASK_SHIFT ? (i > 0 ? x[i - 1] : -1)
                                                : x[n - 1 - i];
            targets[b * n + i] = t;
        }
}

/* dst [d_model] = token_table[t] + position_table[i], summed in double, stored in the model's dtype */
static void embed_row(const copy_model *m, int64_t t, int64_t i, void *dst) {
    int64_t d_model = m->cfg.d_model;
    const double *tok = qkv_f64(m->token_table) + t * d_model, *pos = qkv_f64(m->position_table) + i * d_model;
    if (m->cfg.dtype == QKV_F64)
        for (int64_t d = 0; d < d_model; d++) ((double *)dst)[d] = tok[d] + pos[d];
    else
        for (int64_t d = 0; d < d_model; d++) ((float *)dst)[d] = (float)(tok[d] + pos[d]);
}

/* E [batch, n, d_model] = token_table[tokens] + position_table[positions], in the model's dtype: rows copied
 * from embed_table when there is one, else summed here. */
static qkv_tensor *embed(copy_model *m, const int32_t *tokens, int64_t batch) {
    const copy_config *c = &m->cfg;
    qkv_tensor *x = qkv_empty(m->ctx, c->dtype, 3, (int64_t[]){batch, c->n, c->d_model}); /* every row set below */
    if (!x) return NULL;
    size_t row_bytes = (size_t)c->d_model * qkv_dtype_size(c->dtype);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < c->n; i++) {
            int64_t t = tokens[b * c->n + i];
            char *row = (char *)x->data + (size_t)(b * c->n + i) * row_bytes;
            if (!m->embed_table) {
                embed_row(m, t, i, row);
                continue;
            }
            memcpy(row, (const char *)m->embed_table->data + (size_t)(t * c->n + i) * row_bytes, row_bytes);
        }
    return x;
}

/* ---- model --------------------------------------------------------------------------------------- */

/* logits [batch, n, V] of embedded sequences x [batch, n, d_model]; attn receives the attention. */
static qkv_tensor *forward(copy_model *m, qkv_tensor *x, qkv_tensor **attn) {
    const copy_config *c = &m->cfg;
    qkv_ctx *ctx = m->ctx;
    if (c->heads == 1 && !c->wo) return qkv_self_attention(ctx, x, m->wq, m->wk, m->wv, NULL, c->scale, 0, attn);
    qkv_tensor *q = qkv_projection(ctx, x, m->wq, NULL); // Q = E W^Q   [B, n, h d_k]
    qkv_tensor *k = qkv_projection(ctx, x, m->wk, NULL); // K = E W^K   [B, n, h d_k]
    qkv_tensor *v = qkv_projection(ctx, x, m->wv, NULL); // V = E W^V   [B, n, h d_v]
    if (c->heads > 1) {
        q = qkv_split_heads(ctx, q, (int)c->heads); // [B h, n, d_k]
        k = qkv_split_heads(ctx, k, (int)c->heads);
        v = qkv_split_heads(ctx, v, (int)c->heads);
    }
    qkv_tensor *o = qkv_attention(ctx, q, k, v, NULL, c->scale, 0, attn); // [B h, n, d_v]
    if (c->heads > 1) o = qkv_merge_heads(ctx, o, (int)c->heads);        // [B, n, h d_v]
    return c->wo ? qkv_projection(ctx, o, m->wo, NULL) : o;              // [B, n, V]
}

static void fail_ctx(copy_model *m, char *err, size_t size, const char *what) {
    snprintf(err, size, "%s: %s", what, qkv_errmsg(m->ctx));
}

bool copy_model_init(copy_model *m, const copy_config *cfg, char *err, size_t size) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    if (!copy_config_resolve(&m->cfg, err, size)) return false;
    const copy_config *c = &m->cfg;
    qkv_options o = qkv_default_options();
    o.seed = c->seed;
    o.threads = c->threads;
    o.allocator = c->allocator;
    m->ctx = qkv_ctx_new(&o);
    if (!m->ctx) {
        snprintf(err, size, "out of memory");
        return false;
    }
    qkv_ctx *ctx = m->ctx;

    /* fixed embeddings, in f64 (converted per batch to the model's dtype) */
    qkv_tensor *tok = qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){c->vocab, c->d_model});
    qkv_tensor *pos = qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){c->n, c->d_model});
    if (!tok || !pos) return fail_ctx(m, err, size, "embeddings"), false;
    if (c->embed == EMBED_ONEHOT) {
        for (int64_t t = 0; t < c->vocab; t++) qkv_f64(tok)[t * c->d_model + t] = 1;
        for (int64_t i = 0; i < c->n; i++) qkv_f64(pos)[i * c->d_model + c->vocab + i] = 1;
    } else {
        qkv_tensor *g = qkv_randn(ctx, QKV_F64, 2, (int64_t[]){c->vocab, c->d_model}, 0, 1);
        if (g) memcpy(qkv_f64(tok), qkv_f64(g), (size_t)g->numel * sizeof(double));
        for (int64_t i = 0; i < c->n; i++) /* p(i, 2j) = sin(i / 10000^(2j/d)), p(i, 2j+1) = cos(...) */
            for (int64_t d = 0; d < c->d_model; d++) {
                double angle = (double)i / pow(10000.0, (double)(d - d % 2) / (double)c->d_model);
                qkv_f64(pos)[i * c->d_model + d] = d % 2 ? cos(angle) : sin(angle);
            }
    }
    m->token_table = qkv_keep(ctx, tok);
    m->position_table = qkv_keep(ctx, pos);
    /* every (token, position) row, precomputed when there are few enough: a batch is then row copies */
    if (c->vocab * c->n * c->d_model <= EMBED_TABLE_MAX) {
        qkv_tensor *e = qkv_zeros(ctx, c->dtype, 2, (int64_t[]){c->vocab * c->n, c->d_model});
        size_t row_bytes = (size_t)c->d_model * qkv_dtype_size(c->dtype);
        for (int64_t t = 0; e && t < c->vocab; t++)
            for (int64_t i = 0; i < c->n; i++)
                embed_row(m, t, i, (char *)e->data + (size_t)(t * c->n + i) * row_bytes);
        m->embed_table = qkv_keep(ctx, e);
    }

    /* the held-out set: its own stream, never seen in training batches' stream */
    qkv_tensor *ev = qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){c->eval_size, c->n});
    if (ev) {
        stream s = stream_for(c->seed, STREAM_EVAL, 0);
        random_tokens(&s, qkv_i32(ev), ev->numel, c->vocab);
    }
    m->eval_tokens = qkv_keep(ctx, ev);

    int64_t hk = c->heads * c->d_k, hv = c->heads * c->d_v;
    m->wq = qkv_param(ctx, qkv_xavier_uniform(ctx, c->dtype, c->d_model, hk));
    m->wk = qkv_param(ctx, qkv_xavier_uniform(ctx, c->dtype, c->d_model, hk));
    m->wv = qkv_param(ctx, qkv_xavier_uniform(ctx, c->dtype, c->d_model, hv));
    if (c->wo) m->wo = qkv_param(ctx, qkv_xavier_uniform(ctx, c->dtype, hv, c->vocab));
    qkv_step_end(ctx);
    if (qkv_error(ctx)) return fail_ctx(m, err, size, "parameters"), false;

    qkv_optim_options oo = qkv_optim_defaults(c->optimizer);
    oo.lr = c->lr;
    const char *names[4] = {"wq", "wk", "wv", "wo"};
    oo.param_names = names;
    qkv_tensor *params[4] = {m->wq, m->wk, m->wv, m->wo};
    m->opt = qkv_optim_new(ctx, &oo, params, c->wo ? 4 : 3);
    if (!m->opt) return fail_ctx(m, err, size, "optimizer"), false;
    return true;
}

void copy_model_free(copy_model *m) {
    if (m->opt) qkv_optim_free(m->opt);
    qkv_ctx_free(m->ctx);
    memset(m, 0, sizeof *m);
}

static double scalar_value(const qkv_tensor *t) {
    return t->dtype == QKV_F64 ? *(const double *)t->data : *(const float *)t->data;
}

bool copy_train_step(copy_model *m, copy_stats *stats) {
    const copy_config *c = &m->cfg;
    qkv_ctx *ctx = m->ctx;
    int64_t count = c->batch * c->n;
    qkv_tensor *targets = qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){c->batch, c->n});
    int32_t *tokens = qkv_i32(qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){c->batch, c->n}));
    if (!targets || !tokens) return false;
    stream s = stream_for(c->seed, STREAM_TRAIN, (uint64_t)m->step);
    random_tokens(&s, tokens, count, c->vocab);
    make_targets(c, tokens, qkv_i32(targets), c->batch);

    qkv_tensor *logits = forward(m, embed(m, tokens, c->batch), NULL);
    qkv_tensor *loss = qkv_cross_entropy(ctx, logits, targets); // L = mean -log softmax(logits)[target]
    if (qkv_backward(ctx, loss, NULL) != QKV_OK) return false;
    qkv_tensor *params[4] = {m->wq, m->wk, m->wv, m->wo};
    double norm = qkv_clip_grad_norm(ctx, params, c->wo ? 4 : 3, c->clip > 0 ? c->clip : DBL_MAX);
    if (qkv_optim_step(m->opt) != QKV_OK || qkv_optim_zero_grad(m->opt) != QKV_OK) return false;
    if (stats) {
        stats->loss = scalar_value(loss);
        stats->grad_norm = norm;
    }
    m->step++;
    qkv_step_end(ctx);
    return true;
}

bool copy_evaluate(copy_model *m, double *accuracy, double *attention, int32_t *tokens) {
    const copy_config *c = &m->cfg;
    qkv_ctx *ctx = m->ctx;
    bool was = qkv_set_grad_enabled(ctx, false);
    int64_t batch = c->eval_size, n = c->n, vocab = c->vocab;
    const int32_t *ev = qkv_i32(m->eval_tokens);
    int32_t *targets = qkv_i32(qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){batch, n}));
    qkv_tensor *attn = NULL;
    qkv_tensor *logits = targets ? forward(m, embed(m, ev, batch), &attn) : NULL;
    qkv_set_grad_enabled(ctx, was);
    if (!logits) return false;
    make_targets(c, ev, targets, batch);
    const qkv_tensor *l64 = logits->dtype == QKV_F64 ? logits : qkv_to_dtype(ctx, logits, QKV_F64);
    const qkv_tensor *a64 = attn->dtype == QKV_F64 ? attn : qkv_to_dtype(ctx, attn, QKV_F64);
    if (!l64 || !a64) return false;
    int64_t right = 0, counted = 0;
    for (int64_t p = 0; p < batch * n; p++) {
        if (targets[p] < 0) continue;
        const double *row = qkv_f64(l64) + p * vocab;
        int64_t best = 0;
        for (int64_t v = 1; v < vocab; v++)
            if (row[v] > row[best]) best = v;
        right += best == targets[p];
        counted++;
    }
    *accuracy = counted ? (double)right / (double)counted : 1.0;
    if (attention) memcpy(attention, qkv_f64(a64), (size_t)(n * n) * sizeof(double)); /* batch 0, head 0 */
    if (tokens) memcpy(tokens, ev, (size_t)n * sizeof(int32_t));
    qkv_step_end(ctx);
    return true;
}

bool copy_attention_entropy(copy_model *m, double *entropy) {
    const copy_config *c = &m->cfg;
    qkv_ctx *ctx = m->ctx;
    bool was = qkv_set_grad_enabled(ctx, false);
    qkv_tensor *attn = NULL;
    forward(m, embed(m, qkv_i32(m->eval_tokens), c->eval_size), &attn);
    qkv_set_grad_enabled(ctx, was);
    const qkv_tensor *a = attn && attn->dtype != QKV_F64 ? qkv_to_dtype(ctx, attn, QKV_F64) : attn;
    if (!a) return false;
    double total = 0;
    int64_t rows = 0, n = c->n;
    for (int64_t b = 0; b < c->eval_size; b++) {
        const double *head0 = qkv_f64(a) + b * c->heads * n * n; /* [B h, n, n]: head 0 of batch b */
        for (int64_t i = 0; i < n; i++, rows++)
            for (int64_t j = 0; j < n; j++) {
                double p = head0[i * n + j]; // H = -sum p log p
                if (p > 0) total -= p * log(p);
            }
    }
    *entropy = total / (double)rows;
    qkv_step_end(ctx);
    return true;
}

/* ---- checkpoints --------------------------------------------------------------------------------- */

static const char *optimizer_name(qkv_optim_kind k) {
    return k == QKV_OPTIM_SGD ? "sgd" : k == QKV_OPTIM_ADAM ? "adam" : "adamw";
}

/* Everything that must match for a checkpoint to resume this run (not steps, eval size or threads), as
 * "key=value" words. Files written before the optimizer was stored by name hold its enum value there. */
static void config_string(const copy_config *c, char *buf, size_t size) {
    snprintf(buf, size,
             "task=%s embed=%s seed=%llu batch=%lld n=%lld V=%lld d_model=%lld d_k=%lld heads=%lld wo=%d "
             "optimizer=%s lr=%.17g clip=%.17g scale=%.17g dtype=%s",
             copy_task_name(c->task), copy_embed_name(c->embed), (unsigned long long)c->seed, (long long)c->batch,
             (long long)c->n, (long long)c->vocab, (long long)c->d_model, (long long)c->d_k, (long long)c->heads,
             (int)c->wo, optimizer_name(c->optimizer), c->lr, c->clip, c->scale, qkv_dtype_name(c->dtype));
}

/* The flag that sets a config_string key. */
static const char *flag_of_key(const char *key) {
    static const char *const map[][2] = {{"task", "--task"},   {"embed", "--embed"},         {"seed", "--seed"},
                                         {"batch", "--batch"}, {"n", "--n"},                 {"V", "--V"},
                                         {"d_model", "--d-model"}, {"d_k", "--d-k"},         {"heads", "--heads"},
                                         {"wo", "--wo"},       {"optimizer", "--optimizer"}, {"lr", "--lr"},
                                         {"clip", "--clip"},   {"scale", "--scale"},         {"dtype", "--f64"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(key, map[i][0])) return map[i][1];
    return key;
}

/* A config_string value as a reader knows it: enum values by name, clip 0 as "off", the default scale as
 * "1/sqrt(d_k)", numbers in the fewest digits that read back the same. */
static void readable_value(const char *key, const char *value, char *buf, size_t size) {
    char *end;
    double v = strtod(value, &end);
    bool number = end != value && *end == '\0';
    if (!strcmp(key, "optimizer") && number) snprintf(buf, size, "%s", optimizer_name((qkv_optim_kind)(int)v));
    else if (!strcmp(key, "wo") && number) snprintf(buf, size, "%s", v != 0 ? "on" : "off");
    else if (!strcmp(key, "clip") && number && v == 0) snprintf(buf, size, "off");
    else if (!strcmp(key, "scale") && number && isinf(v) && v < 0) snprintf(buf, size, "1/sqrt(d_k)");
    else if (number && (!strcmp(key, "lr") || !strcmp(key, "clip") || !strcmp(key, "scale"))) {
        for (int digits = 1; digits <= 17; digits++) {
            snprintf(buf, size, "%.*g", digits, v);
            if (strtod(buf, NULL) == v) break;
        }
    } else snprintf(buf, size, "%s", value);
}

/* "--d-k: checkpoint has 8, flags say 16; ..." for the words of have and want that differ. */
static void describe_difference(const char *have, const char *want, char *buf, size_t size) {
    char h[512], w[512];
    snprintf(h, sizeof h, "%s", have);
    snprintf(w, sizeof w, "%s", want);
    size_t used = 0;
    buf[0] = '\0';
    char *hs = NULL, *ws = NULL;
    for (char *hw = strtok_r(h, " ", &hs), *ww = strtok_r(w, " ", &ws); hw || ww;
         hw = hw ? strtok_r(NULL, " ", &hs) : NULL, ww = ww ? strtok_r(NULL, " ", &ws) : NULL) {
        char *he = hw ? strchr(hw, '=') : NULL, *we = ww ? strchr(ww, '=') : NULL;
        if (!he || !we) {
            snprintf(buf, size, "the checkpoint's configuration is not in this program's format");
            return;
        }
        *he++ = '\0', *we++ = '\0';
        char hv[64], wv[64];
        readable_value(hw, he, hv, sizeof hv);
        readable_value(ww, we, wv, sizeof wv);
        if (!strcmp(hw, ww) && !strcmp(hv, wv)) continue;
        int len = strcmp(hw, ww) ? snprintf(buf + used, size - used, "%s%s is not %s", used ? "; " : "", hw, ww)
                                 : snprintf(buf + used, size - used, "%s%s: checkpoint has %s, flags say %s",
                                            used ? "; " : "", flag_of_key(hw), hv, wv);
        if (len < 0 || (size_t)len >= size - used) return;
        used += (size_t)len;
    }
}

/* Every element of t is finite; else a message naming the tensor, the element and its value. */
static bool check_finite(const qkv_tensor *t, const char *name, const char *path, char *err, size_t size) {
    for (int64_t i = 0; i < t->numel; i++) {
        double v = t->dtype == QKV_F64 ? qkv_f64(t)[i] : (double)qkv_f32(t)[i];
        if (!isfinite(v)) {
            snprintf(err, size, "%s: tensor %s has a non-finite value (%g at element %lld of %lld): the checkpoint "
                     "is damaged or was saved after training diverged", path, name, v, (long long)i, (long long)t->numel);
            return false;
        }
    }
    return true;
}

enum { MAX_SAVED = 32 };

bool copy_save(copy_model *m, const char *path, char *err, size_t size) {
    qkv_named_tensor named[MAX_SAVED];
    int n = 0;
    named[n++] = (qkv_named_tensor){"wq", m->wq};
    named[n++] = (qkv_named_tensor){"wk", m->wk};
    named[n++] = (qkv_named_tensor){"wv", m->wv};
    if (m->wo) named[n++] = (qkv_named_tensor){"wo", m->wo};
    char optim_names[MAX_SAVED][64];
    for (int i = 0; i < qkv_optim_state_count(m->opt) && n < MAX_SAVED; i++) {
        const char *name = NULL;
        qkv_tensor *t = qkv_optim_state(m->opt, i, &name);
        if (!t) return fail_ctx(m, err, size, "optimizer state"), false;
        snprintf(optim_names[n], sizeof optim_names[n], "optim.%s", name);
        named[n] = (qkv_named_tensor){optim_names[n], t};
        n++;
    }
    char step[32], seed[32], config[512];
    snprintf(step, sizeof step, "%lld", (long long)m->step);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)m->cfg.seed);
    config_string(&m->cfg, config, sizeof config);
    const char *meta[] = {"step", step, "seed", seed, "config", config, "format", "qkv copy_task checkpoint 1"};
    if (qkv_safetensors_save(m->ctx, path, named, n, meta, 4) != QKV_OK)
        return fail_ctx(m, err, size, "saving"), false;
    return true;
}

bool copy_load(copy_model *m, const char *path, char *err, size_t size) {
    qkv_ctx *ctx = m->ctx;
    qkv_safetensors *st = qkv_safetensors_load(ctx, path);
    if (!st) return fail_ctx(m, err, size, "loading"), false;
    char want[512], diff[512];
    config_string(&m->cfg, want, sizeof want);
    const char *have = qkv_safetensors_metadata(st, "config"), *step = qkv_safetensors_metadata(st, "step");
    char *end = NULL;
    errno = 0; /* a step that does not fit (99999999999999999999) sets ERANGE: refused, not clamped */
    long long saved_step = step ? strtoll(step, &end, 10) : -1;
    bool step_range = errno == 0;
    bool ok = false;
    if (!have || !step) {
        snprintf(err, size, "%s: not a copy_task checkpoint (no config or step in its metadata)", path);
    } else if (end == step || *end || saved_step < 0 || !step_range) {
        snprintf(err, size, "%s: its step '%.40s' is not a non-negative 64-bit integer", path, step);
    } else if (describe_difference(have, want, diff, sizeof diff), diff[0]) {
        snprintf(err, size, "%s was saved with a different configuration: %s\n  file: %s\n  this: %s", path, diff,
                 have, want);
    } else {
        struct {
            const char *name;
            qkv_tensor *tensor;
        } loaded[MAX_SAVED];
        char names[MAX_SAVED][64];
        int n = 0;
        loaded[n].name = "wq", loaded[n++].tensor = m->wq;
        loaded[n].name = "wk", loaded[n++].tensor = m->wk;
        loaded[n].name = "wv", loaded[n++].tensor = m->wv;
        if (m->wo) loaded[n].name = "wo", loaded[n++].tensor = m->wo;
        for (int i = 0; i < qkv_optim_state_count(m->opt) && n < MAX_SAVED; i++, n++) {
            const char *name = NULL;
            loaded[n].tensor = qkv_optim_state(m->opt, i, &name);
            snprintf(names[n], sizeof names[n], "optim.%s", name ? name : "");
            loaded[n].name = names[n];
        }
        ok = true;
        for (int i = 0; ok && i < n; i++)
            ok = loaded[i].tensor && qkv_safetensors_copy_into(ctx, st, loaded[i].name, loaded[i].tensor) == QKV_OK;
        if (!ok) fail_ctx(m, err, size, "loading");
        /* a NaN or Inf here would otherwise surface steps later, blamed on whatever touches it first */
        for (int i = 0; ok && i < n; i++) ok = check_finite(loaded[i].tensor, loaded[i].name, path, err, size);
        if (ok) m->step = saved_step;
    }
    qkv_safetensors_free(ctx, st);
    return ok;
}
