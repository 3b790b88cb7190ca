/*
 * study_training.c — part 4: does the scale matter when the weights are trained?
 *
 * The copy task of examples/copy_model.h (target at i is x_i; n = 8, V = 8, batch 32, Adam, f32):
 * fixed embeddings, one attention layer with trainable W^Q, W^K, W^V initialised Xavier-uniform,
 * logits = softmax(s Q K^T) E W^V. Per embedding (gauss: d_model 64, N(0,1) tokens + sinusoidal positions;
 * onehot: d_model = V + n = 16), d_k in {16, 64, 256}, scale in {1/sqrt(d_k), 1, 1/d_k} and seed:
 * the first evaluated step with 100% held-out token accuracy, the accuracy at the end of the budget, and
 * the attention entropy over training. At initialisation it also measures the std of the components of
 * Q = E W^Q and of the raw scores q.k, to show whether the seed's unit-variance assumption holds:
 *   E [b, n, d_model] -> Q = E W^Q, K = E W^K [b, n, d_k] -> Q K^T [b, n, n]
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "copy_model.h"
#include "qkv.h"
#include "study.h"

/* std of the components of Q and of the raw scores Q K^T at initialisation, over the first 64 held-out
 * sequences. */
static bool init_spread(copy_model *m, double *q_std, double *score_std) {
    const copy_config *c = &m->cfg;
    qkv_ctx *ctx = m->ctx;
    int64_t b = c->eval_size < 64 ? c->eval_size : 64, n = c->n, dm = c->d_model;
    qkv_tensor *e = qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){b, n, dm});
    if (!e) return false;
    const int32_t *tokens = qkv_i32(m->eval_tokens);
    for (int64_t s = 0; s < b; s++) // E[s, i, :] = token_table[x_{s,i}] + position_table[i]
        for (int64_t i = 0; i < n; i++)
            for (int64_t d = 0; d < dm; d++)
                qkv_f64(e)[(s * n + i) * dm + d] =
                    qkv_f64(m->token_table)[tokens[s * n + i] * dm + d] + qkv_f64(m->position_table)[i * dm + d];
    bool was = qkv_set_grad_enabled(ctx, false);
    qkv_tensor *x = qkv_to_dtype(ctx, e, m->wq->dtype);
    qkv_tensor *q = qkv_projection(ctx, x, m->wq, NULL);  // Q = E W^Q   [b, n, d_k]
    qkv_tensor *k = qkv_projection(ctx, x, m->wk, NULL);  // K = E W^K   [b, n, d_k]
    qkv_tensor *raw = qkv_matmul(ctx, q, k, QKV_TRANS_B); // Q K^T       [b, n, n]
    qkv_set_grad_enabled(ctx, was);
    qkv_tensor *q64 = qkv_to_dtype(ctx, q, QKV_F64), *raw64 = qkv_to_dtype(ctx, raw, QKV_F64);
    if (!q64 || !raw64) return false;
    double mean;
    study_mean_std(qkv_f64(q64), q64->numel, &mean, q_std);
    study_mean_std(qkv_f64(raw64), raw64->numel, &mean, score_std);
    qkv_step_end(ctx);
    return true;
}

/* Train one configuration; acc and ent receive the held-out accuracy and attention entropy at steps
 * 0, every, 2 every, ..., steps. */
static bool train_one(int embed, int64_t d_k, int scale, uint64_t seed, int64_t steps, int64_t every, double lr,
                      study_run *run, double *acc, double *ent) {
    copy_config cfg = copy_default_config();
    cfg.task = TASK_COPY;
    cfg.embed = embed == STUDY_EMBED_GAUSS ? EMBED_GAUSS : EMBED_ONEHOT;
    cfg.seed = seed;
    cfg.steps = steps;
    cfg.d_k = d_k;
    cfg.lr = lr;
    cfg.scale = scale == STUDY_SCALE_SQRT ? QKV_SCALE_DEFAULT : study_scale_value(scale, d_k);
    copy_model m;
    char err[512];
    if (!copy_model_init(&m, &cfg, err, sizeof err)) {
        fprintf(stderr, "softmax_study: part 4: %s\n", err);
        copy_model_free(&m);
        return false;
    }
    bool ok = init_spread(&m, &run->init_q_std, &run->init_score_std);
    run->steps_to_100 = -1;
    run->best_accuracy = 0;
    for (int64_t e = 0; ok; e++) {
        ok = copy_evaluate(&m, &acc[e], NULL, NULL) && copy_attention_entropy(&m, &ent[e]);
        if (!ok) break;
        if (acc[e] >= 1.0 && run->steps_to_100 < 0) run->steps_to_100 = m.step;
        run->best_accuracy = fmax(run->best_accuracy, acc[e]);
        if (m.step >= steps) break;
        for (int64_t t = 0; ok && t < every && m.step < steps; t++) ok = copy_train_step(&m, NULL);
    }
    if (!ok) fprintf(stderr, "softmax_study: part 4: step %lld: %s\n", (long long)m.step, qkv_errmsg(m.ctx));
    int64_t last = steps / every;
    run->init_entropy = ent[0];
    run->final_accuracy = acc[last];
    run->final_entropy = ent[last];
    copy_model_free(&m);
    return ok;
}

static bool write_outputs(const study_options *opt, const study_training_result *r, const double *curves);

/* curves: [embed][d_k][scale][2 (accuracy, entropy)][evaluations], means over seeds */
#define CURVE(c, r, e, i, s, what, j) \
    (c)[((((size_t)(e) * STUDY_TRAIN_DK + (i)) * STUDY_SCALES + (s)) * 2 + (what)) * (size_t)(r)->n_evals + (j)]

bool study_training(const study_options *opt, study_training_result *r) {
    memset(r, 0, sizeof *r);
    static const int64_t dks[STUDY_TRAIN_DK] = {16, 64, 256};
    r->n_dk = STUDY_TRAIN_DK;
    memcpy(r->d_k, dks, sizeof dks);
    r->n_seeds = opt->quick ? 1 : STUDY_TRAIN_SEEDS;
    r->steps[STUDY_EMBED_GAUSS] = opt->quick ? 400 : 2000;
    r->steps[STUDY_EMBED_ONEHOT] = opt->quick ? 400 : 1000;
    r->eval_every = 50;
    r->lr = 0.01;
    r->n_tokens = copy_default_config().n;
    r->vocab = copy_default_config().vocab;
    int64_t max_steps = r->steps[0] > r->steps[1] ? r->steps[0] : r->steps[1];
    r->n_evals = max_steps / r->eval_every + 1;
    double *curves = calloc((size_t)STUDY_EMBEDS * STUDY_TRAIN_DK * STUDY_SCALES * 2 * (size_t)r->n_evals, sizeof *curves);
    double *acc = calloc((size_t)r->n_evals, sizeof *acc), *ent = calloc((size_t)r->n_evals, sizeof *ent);
    bool ok = curves && acc && ent;
    FILE *log = opt->log;
    if (log)
        fprintf(log,
                "\nPart 4. Copy task (n %lld, V %lld, batch 32, Adam lr %g, f32, Xavier init), %d seed(s); held-out "
                "accuracy and attention entropy every %lld steps\n"
                "%7s %5s %12s %8s %8s %7s %20s %10s %10s %8s\n",
                (long long)r->n_tokens, (long long)r->vocab, r->lr, r->n_seeds, (long long)r->eval_every, "embed",
                "d_k", "scale", "std q_c", "std q.k", "H init", "steps to 100% /seed", "final acc", "best acc",
                "H final");
    for (int e = 0; ok && e < STUDY_EMBEDS; e++) {
        int64_t steps = r->steps[e], evals = steps / r->eval_every + 1;
        for (int i = 0; ok && i < r->n_dk; i++)
            for (int s = 0; ok && s < STUDY_SCALES; s++) {
                char reached[64] = "";
                double final = 0, best = 0, h_final = 0, q_std = 0, score_std = 0, h_init = 0;
                for (int seed = 0; ok && seed < r->n_seeds; seed++) {
                    study_run *run = &r->run[e][i][s][seed];
                    ok = train_one(e, r->d_k[i], s, opt->seed + (uint64_t)seed, steps, r->eval_every, r->lr, run, acc,
                                   ent);
                    for (int64_t j = 0; ok && j < evals; j++) {
                        CURVE(curves, r, e, i, s, 0, j) += acc[j] / r->n_seeds;
                        CURVE(curves, r, e, i, s, 1, j) += ent[j] / r->n_seeds;
                    }
                    size_t len = strlen(reached);
                    if (run->steps_to_100 >= 0)
                        snprintf(reached + len, sizeof reached - len, " %lld", (long long)run->steps_to_100);
                    else snprintf(reached + len, sizeof reached - len, " -");
                    final += run->final_accuracy / r->n_seeds, best += run->best_accuracy / r->n_seeds;
                    h_final += run->final_entropy / r->n_seeds, h_init += run->init_entropy / r->n_seeds;
                    q_std += run->init_q_std / r->n_seeds, score_std += run->init_score_std / r->n_seeds;
                }
                if (ok && log) {
                    fprintf(log, "%7s %5lld %12s %8.3f %8.3f %7.3f %20s %9.2f%% %9.2f%% %8.3f\n",
                            e == STUDY_EMBED_GAUSS ? "gauss" : "onehot", (long long)r->d_k[i], study_scale_name(s),
                            q_std, score_std, h_init, reached, 100 * final, 100 * best, h_final);
                    fflush(log);
                }
            }
    }
    ok = ok && write_outputs(opt, r, curves);
    free(curves), free(acc), free(ent);
    return ok;
}

static bool write_outputs(const study_options *opt, const study_training_result *r, const double *curves) {
    atomic_file csv_file;
    FILE *csv = study_open(opt, "part4_training.csv", &csv_file);
    if (!csv) return false;
    fprintf(csv, "embed,d_k,scale,scale_value,seed,lr,steps,init_q_std,init_score_std,init_entropy,steps_to_100,"
                 "final_accuracy,best_accuracy,final_entropy\n");
    for (int e = 0; e < STUDY_EMBEDS; e++)
        for (int i = 0; i < r->n_dk; i++)
            for (int s = 0; s < STUDY_SCALES; s++)
                for (int seed = 0; seed < r->n_seeds; seed++) {
                    const study_run *run = &r->run[e][i][s][seed];
                    fprintf(csv, "%s,%lld,%s,%.9g,%llu,%g,%lld,%.9g,%.9g,%.9g,%lld,%.9g,%.9g,%.9g\n",
                            e == STUDY_EMBED_GAUSS ? "gauss" : "onehot", (long long)r->d_k[i], study_scale_name(s),
                            study_scale_value(s, r->d_k[i]), (unsigned long long)(opt->seed + (uint64_t)seed), r->lr,
                            (long long)r->steps[e], run->init_q_std, run->init_score_std, run->init_entropy,
                            (long long)run->steps_to_100, run->final_accuracy, run->best_accuracy,
                            run->final_entropy);
                }
    if (!study_close(&csv_file, "part4_training.csv")) return false;

    csv = study_open(opt, "part4_curves.csv", &csv_file);
    if (!csv) return false;
    fprintf(csv, "embed,d_k,scale,step,mean_accuracy,mean_entropy\n");
    for (int e = 0; e < STUDY_EMBEDS; e++)
        for (int i = 0; i < r->n_dk; i++)
            for (int s = 0; s < STUDY_SCALES; s++)
                for (int64_t j = 0; j <= r->steps[e] / r->eval_every; j++)
                    fprintf(csv, "%s,%lld,%s,%lld,%.9g,%.9g\n", e == STUDY_EMBED_GAUSS ? "gauss" : "onehot",
                            (long long)r->d_k[i], study_scale_name(s), (long long)(j * r->eval_every),
                            CURVE(curves, r, e, i, s, 0, j), CURVE(curves, r, e, i, s, 1, j));
    if (!study_close(&csv_file, "part4_curves.csv")) return false;

    /* per embedding: accuracy and entropy against step; colour family = scale, its shade, the dash and the
     * marker = d_k, so that curves lying on each other near 100% can still be told apart */
    static const char *const DASH[STUDY_TRAIN_DK] = {NULL, "8 4", "2 3"};
    static const plot_marker MARK[STUDY_TRAIN_DK] = {PLOT_MARKER_CIRCLE, PLOT_MARKER_SQUARE, PLOT_MARKER_TRIANGLE};
    static const char *const SHADE[STUDY_SCALES][STUDY_TRAIN_DK] = {
        {"#6baed6", "#3182bd", "#08519c"}, /* 1/sqrt(d_k): blues, light to dark as d_k grows */
        {"#fc9272", "#ef3b2c", "#99000d"}, /* 1: reds */
        {"#74c476", "#31a354", "#006d2c"}, /* 1/d_k: greens */
    };
    bool ok = true;
    double *x = calloc((size_t)r->n_evals, sizeof *x), *uniform = calloc((size_t)r->n_evals, sizeof *uniform);
    if (!x || !uniform) ok = false;
    for (int64_t j = 0; ok && j < r->n_evals; j++) x[j] = (double)(j * r->eval_every), uniform[j] = log((double)r->n_tokens);
    for (int e = 0; ok && e < STUDY_EMBEDS; e++) {
        const char *embed = e == STUDY_EMBED_GAUSS ? "gauss" : "onehot";
        int count = (int)(r->steps[e] / r->eval_every + 1);
        char names[STUDY_TRAIN_DK * STUDY_SCALES][48];
        plot_series as[STUDY_TRAIN_DK * STUDY_SCALES], hs[STUDY_TRAIN_DK * STUDY_SCALES + 1];
        plot_style style[STUDY_TRAIN_DK * STUDY_SCALES + 1];
        int k = 0;
        for (int i = 0; i < r->n_dk; i++)
            for (int s = 0; s < STUDY_SCALES; s++, k++) {
                snprintf(names[k], sizeof names[k], "d_k %lld, %s", (long long)r->d_k[i], study_scale_name(s));
                as[k] = (plot_series){names[k], x, &CURVE(curves, r, e, i, s, 0, 0), count};
                hs[k] = (plot_series){names[k], x, &CURVE(curves, r, e, i, s, 1, 0), count};
                style[k] = (plot_style){SHADE[s][i], DASH[i], MARK[i]};
            }
        hs[k] = (plot_series){"ln n (uniform)", x, uniform, count};
        style[k] = (plot_style){"#7f7f7f", "6 4", PLOT_MARKER_NONE}; /* a reference */
        char name[64], title[128];
        snprintf(name, sizeof name, "part4_accuracy_%s.svg", embed);
        snprintf(title, sizeof title, "Part 4: copy task, %s embeddings: held-out accuracy (mean of %d seed%s)", embed,
                 r->n_seeds, r->n_seeds > 1 ? "s" : "");
        ok = study_lines(opt, name, title, "training step", "held-out token accuracy", as, k, false, false, style) && ok;
        snprintf(name, sizeof name, "part4_entropy_%s.svg", embed);
        snprintf(title, sizeof title, "Part 4: copy task, %s embeddings: attention entropy", embed);
        ok = study_lines(opt, name, title, "training step", "mean row entropy (nats)", hs, k + 1, false, false, style) &&
             ok;
    }
    free(x), free(uniform);
    return ok;
}
