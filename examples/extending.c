#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include "qkv.h"

/* Softmax plus one along the last axis: w_i = e^s_i / (1 + sum_j e^s_j) (Miller 2023, "Attention is off by
 * one"). A row may give its keys less than all of the weight: the rest goes to an implicit key of score 0. */

/* 1. From primitives. sum_j w_j = e^lse / (1 + e^lse) with lse = log sum_j e^s_j, so
 *    w = softmax(s) * sigmoid(lse) = softmax(s) / (1 + e^-lse). Every step is an operator with its backward. */
static qkv_tensor *plus_one_from_primitives(qkv_ctx *ctx, qkv_tensor *s) {
    qkv_tensor *p = qkv_softmax_dim(ctx, s, -1);                    /* [.., n] */
    qkv_tensor *lse = qkv_logsumexp_dim(ctx, s, -1, true);          /* [.., 1] */
    qkv_tensor *den = qkv_add_scalar(ctx, qkv_exp(ctx, qkv_neg(ctx, lse)), 1.0);
    return qkv_div(ctx, p, den);                                    /* [.., n] / [.., 1] broadcasts */
}

/* 2. As a user-defined operator with a hand-written backward. The forward computes w in double, with
 *    m = max(0, max_j s_j) taken out so that nothing overflows: w_i = e^(s_i - m) / (e^-m + sum_j e^(s_j - m)).
 *    The 1 is a constant, so the backward is the softmax's: ds_i += w_i (dw_i - sum_j dw_j w_j). */
static double get(const qkv_tensor *t, int64_t i) {
    return t->dtype == QKV_F64 ? ((const double *)t->data)[i] : ((const float *)t->data)[i];
}

static qkv_status plus_one_forward(qkv_ctx *ctx, qkv_custom_call *call) {
    const qkv_tensor *s = call->inputs[0];
    qkv_tensor *w = qkv_zeros(ctx, s->dtype, s->ndim, s->shape);   /* a new step tensor: the output */
    if (!w) return qkv_error(ctx);
    int64_t n = s->shape[s->ndim - 1], rows = n ? s->numel / n : 0;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t row = r * n;
        double m = 0.0, den;
        for (int64_t j = 0; j < n; j++) m = fmax(m, get(s, row + j));  /* a masked key's -inf is fine */
        den = exp(-m);
        for (int64_t j = 0; j < n; j++) den += exp(get(s, row + j) - m);
        for (int64_t j = 0; j < n; j++) qkv_set_flat(ctx, w, row + j, exp(get(s, row + j) - m) / den);
    }
    call->outputs[0] = w;                 /* the backward finds it again as call->outputs[0] */
    return qkv_error(ctx);
}

static qkv_status plus_one_backward(qkv_ctx *ctx, qkv_custom_call *call) {
    const qkv_tensor *w = call->outputs[0], *dw = call->grad_outputs[0];
    qkv_tensor *ds = call->grad_inputs[0];  /* NULL when s needs no gradient */
    if (!ds) return QKV_OK;
    int64_t n = w->shape[w->ndim - 1], rows = n ? w->numel / n : 0;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t row = r * n;
        double dot = 0.0;
        for (int64_t j = 0; j < n; j++) dot += get(dw, row + j) * get(w, row + j);
        for (int64_t j = 0; j < n; j++)   /* add: s may feed other operators too */
            qkv_set_flat(ctx, ds, row + j, get(ds, row + j) + get(w, row + j) * (get(dw, row + j) - dot));
    }
    return qkv_error(ctx);
}

static const qkv_custom_op plus_one_op = {"softmax_plus_one", 1, 1, plus_one_forward, plus_one_backward, NULL};

static qkv_tensor *plus_one_custom(qkv_ctx *ctx, qkv_tensor *s) { return qkv_custom1(ctx, &plus_one_op, &s); }

/* 3. Check both: each backward against finite differences (qkv_gradcheck, f64), then the two against each
 *    other on the same scores and the same upstream gradient. */
typedef qkv_tensor *(*plus_one_fn)(qkv_ctx *ctx, qkv_tensor *s);

static qkv_tensor *call_way(qkv_ctx *ctx, qkv_tensor *const *in, int n_in, void *way) {
    (void)n_in;
    return (*(plus_one_fn *)way)(ctx, in[0]);
}

static int check_both(qkv_ctx *ctx) {
    const int64_t shape[3] = {2, 5, 7};                             /* scores [B, n_q, n_k] */
    qkv_tensor *s = qkv_keep(ctx, qkv_randn(ctx, QKV_F64, 3, shape, 0.0, 2.0));
    qkv_tensor *dw = qkv_keep(ctx, qkv_randn(ctx, QKV_F64, 3, shape, 0.0, 1.0));
    qkv_set_requires_grad(ctx, s, true);
    plus_one_fn ways[2] = {plus_one_from_primitives, plus_one_custom};
    const char *names[2] = {"from primitives", "user-defined"};
    double w[2][70], ds[2][70];
    for (int k = 0; k < 2; k++) {
        qkv_gradcheck_result r;
        if (qkv_gradcheck(ctx, call_way, &s, 1, &ways[k], NULL, &r) != QKV_OK) return 1;
        printf("gradcheck, %-15s: %s (%lld elements)\n", names[k], r.passed ? "passed" : r.message,
               (long long)r.checked);
        qkv_tensor *out = ways[k](ctx, s);
        qkv_zero_grad(ctx, s);
        if (!r.passed || qkv_backward(ctx, out, dw) != QKV_OK) return 1;
        for (int i = 0; i < 70; i++) w[k][i] = qkv_f64(out)[i], ds[k][i] = qkv_f64(s->grad)[i];
        qkv_step_end(ctx);
    }
    double w_diff = 0, ds_diff = 0;
    for (int i = 0; i < 70; i++) {
        w_diff = fmax(w_diff, fabs(w[0][i] - w[1][i]));
        ds_diff = fmax(ds_diff, fabs(ds[0][i] - ds[1][i]));
    }
    bool agree = w_diff <= 1e-14 && ds_diff <= 1e-14;
    printf("the two agree to 1e-14: %s (weights %.0e apart, gradients %.0e)\n", agree ? "yes" : "NO", w_diff, ds_diff);
    qkv_free(ctx, s), qkv_free(ctx, dw);
    return !agree;
}

/* 4. Inside a model: config.attn_weights maps each layer's scores [B*n_head, n, n] and the causal mask (u8
 *    [n, n], 1 where key j <= query i) to the weights. Masked scores become -inf, which both versions turn
 *    into a weight of exactly 0 (the model checks that). */
static qkv_tensor *plus_one_attention(qkv_ctx *ctx, qkv_tensor *scores, const qkv_tensor *mask, void *way) {
    if (mask) scores = qkv_where(ctx, mask, scores, qkv_full(ctx, scores->dtype, 0, NULL, -INFINITY));
    return (*(plus_one_fn *)way)(ctx, scores);
}

/* 5. Train on a copy task: 8 random tokens, then the same 8 again. Only the copy can be predicted: the loss
 *    counts the positions whose next token is a copied one (targets -1 elsewhere). Returns the final loss. */
enum { VOCAB = 16, HALF = 8, LEN = 2 * HALF, BATCH = 16 };

static double train_copy(qkv_ctx *ctx, qkv_model_config cfg, int steps) {
    cfg.vocab = VOCAB, cfg.n_ctx = LEN, cfg.d_model = 32, cfg.n_layer = 2, cfg.n_head = 2, cfg.d_mlp = 0;
    qkv_model *m = qkv_model_new(ctx, &cfg);
    qkv_optim_options o = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    o.lr = 3e-3;
    qkv_optimizer *opt = qkv_optim_new(ctx, &o, qkv_model_params(m), qkv_model_param_count(m));
    double loss_value = NAN;
    uint64_t state = 12345;                                         /* the data: an LCG, the same for each run */
    for (int step = 0; step < steps && !qkv_error(ctx); step++) {
        int32_t ids[BATCH * LEN], targets[BATCH * LEN];
        for (int b = 0; b < BATCH; b++)
            for (int i = 0; i < LEN; i++) {
                state = state * 6364136223846793005u + 1442695040888963407u;
                int32_t t = i < HALF ? (int32_t)((state >> 33) % VOCAB) : ids[b * LEN + i - HALF];
                ids[b * LEN + i] = t;
                if (i > 0) targets[b * LEN + i - 1] = i >= HALF ? t : -1;  /* predict the copy only */
            }
        for (int b = 0; b < BATCH; b++) targets[b * LEN + LEN - 1] = -1;
        qkv_tensor *x = qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){BATCH, LEN}, ids);
        qkv_tensor *y = qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){BATCH, LEN}, targets);
        qkv_tensor *loss = qkv_model_loss(ctx, qkv_model_forward(ctx, m, x, QKV_CAUSAL), y);
        if (qkv_backward(ctx, loss, NULL) != QKV_OK) break;
        loss_value = qkv_get_flat(ctx, loss, 0);
        qkv_optim_step(opt);
        qkv_optim_zero_grad(opt);
        qkv_step_end(ctx);
    }
    qkv_optim_free(opt);
    qkv_model_free(m);
    return loss_value;
}

int extending_tutorial(int steps) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    int failed = check_both(ctx);
    plus_one_fn ways[2] = {plus_one_from_primitives, plus_one_custom};
    const char *names[3] = {"softmax", "plus one, from primitives", "plus one, user-defined"};
    for (int k = 0; k < 3 && !failed; k++) {
        qkv_model_config cfg = qkv_model_default_config();
        if (k > 0) {
            cfg.attn_weights = plus_one_attention;
            cfg.attn_weights_user = &ways[k - 1];
            cfg.attn_weights_name = "softmax_plus_one";             /* recorded in checkpoints */
        }
        double loss = train_copy(ctx, cfg, steps);
        printf("copy task, %-26s: loss %.3f nats after %d steps (uniform %.3f)\n", names[k], loss, steps,
               log((double)VOCAB));
        failed |= !(loss < 0.1);                                   /* the copy is learnt */
    }
    if (qkv_error(ctx)) fprintf(stderr, "%s\n", qkv_errmsg(ctx));
    failed |= qkv_error(ctx) != QKV_OK;
    qkv_ctx_free(ctx);
    return failed;
}
