/*
 * copy_task — train W^Q, W^K, W^V of one attention layer to copy, shift or reverse a token sequence,
 * then show what the attention learned. Run with --help for the flags; copy_model.h describes the task.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "copy_model.h"
#include "plot.h"

#define PROG "copy_task"

static void usage(FILE *out) {
    copy_config d = copy_default_config();
    fprintf(out,
            "usage: copy_task [flags]\n"
            "Train one self-attention layer (W^Q, W^K, W^V; W^O with --wo) on a toy sequence task.\n\n"
            "  --task copy|shift|reverse  target at i: x_i, x_{i-1}, x_{n-1-i}        (%s)\n"
            "  --embed onehot|gauss       fixed embeddings: [onehot token, onehot position] (d_model = V + n),\n"
            "                             or N(0,1) token vectors + sinusoidal positions  (%s)\n"
            "  --seed S                   seed of data and initialisation              (%llu)\n"
            "  --steps N                  total training steps, counted from step 0 (%lld); with --load\n"
            "                             the checkpoint's steps count: one at step 500 with --steps 800\n"
            "                             trains 300 more, and --steps below 500 is an error (equal: no\n"
            "                             training, the checkpoint is evaluated as it is)\n"
            "  --batch B                  sequences per step                           (%lld)\n"
            "  --n N                      sequence length                              (%lld)\n"
            "  --V V                      vocabulary size                              (%lld)\n"
            "  --d-model D                embedding width, gauss only                  (64 for gauss)\n"
            "  --d-k D                    query/key width per head                     (%lld)\n"
            "  --heads H                  attention heads                              (%lld)\n"
            "  --wo                       learn an output projection W^O (else logits = attention output)\n"
            "  --lr X                     learning rate > 0                (0.1 onehot, 0.01 gauss)\n"
            "                             (gauss at --d-model 256 stays near chance with Adam at 0.01;\n"
            "                             0.001 to 0.003 learns it in a few hundred steps)\n"
            "  --optimizer sgd|adam|adamw                                              (adam)\n"
            "  --clip X|off               clip the global gradient norm to X > 0       (off)\n"
            "  --scale X|default          score scale, a finite number                 (default: 1/sqrt(d_k))\n"
            "  --no-scale                 scale 1: leave the 1/sqrt(d_k) out\n"
            "  --f64                      train in f64 instead of f32\n"
            "  --threads T                kernel threads                               (%d)\n"
            "  --eval N                   held-out sequences                           (%lld)\n"
            "  --log-every N              print a line every N steps                   (steps / 5)\n"
            "  --save FILE                write a checkpoint (safetensors) at the end\n"
            "  --load FILE                resume from a checkpoint made with the same flags\n"
            "  --svg FILE                 the learned attention as an image            (attention.svg)\n"
            "                             (n <= 64; written also with --quiet when given; a file that\n"
            "                             cannot be written is an error, exit 1)\n"
            "  --json                     print a one-line JSON summary at the end; \"final_loss\" is null\n"
            "                             when no step was trained (--steps 0, or --load at --steps)\n"
            "  --quiet                    no progress lines, no heat map (and no default attention.svg)\n"
            "  --help                     this text\n"
            "A bad flag or value is an error naming it (exit 2); a failure while running exits 1.\n",
            copy_task_name(d.task), copy_embed_name(d.embed), (unsigned long long)d.seed, (long long)d.steps,
            (long long)d.batch, (long long)d.n, (long long)d.vocab, (long long)d.d_k, (long long)d.heads,
            d.threads, (long long)d.eval_size);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct cli {
    copy_config cfg;
    const char *save, *load, *svg;
    bool json, quiet, svg_given;
    int64_t log_every;
} cli;

/* Sizes stay within int32 (tokens and loops), other counts within int64. */
static bool parse_int(const char *flag, const char *s, int64_t min, int64_t max, int64_t *out) {
    return args_int(PROG, flag, s, min, max, out);
}

static bool parse_double(const char *flag, const char *s, double *out) {
    return args_double(PROG, flag, s, -DBL_MAX, DBL_MAX, out);
}

/* A number > 0 (a learning rate, a clipping norm: 0 would mean "nothing" and is refused). */
static bool parse_positive(const char *flag, const char *s, double *out) {
    double v;
    if (!parse_double(flag, s, &v)) return false;
    if (!(v > 0)) {
        fprintf(stderr, PROG ": %s needs a positive number, got '%s'\n", flag, s);
        return false;
    }
    *out = v;
    return true;
}

static bool takes_value(const char *flag) {
    static const char *const valued[] = {"--task", "--embed", "--seed",  "--steps",     "--batch", "--n",
                                         "--V",    "--d-model", "--d-k", "--heads",     "--lr",    "--optimizer",
                                         "--clip", "--scale", "--threads", "--eval",    "--log-every",
                                         "--save", "--load",  "--svg"};
    for (size_t i = 0; i < sizeof valued / sizeof valued[0]; i++)
        if (!strcmp(flag, valued[i])) return true;
    return false;
}

/* Returns 0 to run, 1 for an error (message printed), 2 after --help. */
static int parse(int argc, char **argv, cli *a) {
    static const char *const tasks[] = {"copy", "shift", "reverse"}, *const embeds[] = {"onehot", "gauss"},
                             *const optimizers[] = {"sgd", "adam", "adamw"};
    static const copy_task_kind task_of[] = {TASK_COPY, TASK_SHIFT, TASK_REVERSE};
    static const copy_embed_kind embed_of[] = {EMBED_ONEHOT, EMBED_GAUSS};
    static const qkv_optim_kind optimizer_of[] = {QKV_OPTIM_SGD, QKV_OPTIM_ADAM, QKV_OPTIM_ADAMW};
    const int64_t SIZE = INT32_MAX, COUNT = INT64_MAX;
    a->cfg = copy_default_config();
    a->svg = "attention.svg";
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        int k = 0;
        bool takes = true, ok = true;
        if (args_is_help(f)) {
            usage(stdout);
            return 2;
        } else if (!strcmp(f, "--wo")) a->cfg.wo = true, takes = false;
        else if (!strcmp(f, "--no-scale")) a->cfg.scale = 1.0, takes = false;
        else if (!strcmp(f, "--f64")) a->cfg.dtype = QKV_F64, takes = false;
        else if (!strcmp(f, "--json")) a->json = true, takes = false;
        else if (!strcmp(f, "--quiet")) a->quiet = true, takes = false;
        else if (takes_value(f) && !v) {
            fprintf(stderr, PROG ": %s needs a value (see --help)\n", f);
            return 1;
        } else if (!strcmp(f, "--task")) {
            if ((ok = (k = args_choice(PROG, f, v, tasks, 3)) >= 0)) a->cfg.task = task_of[k];
        } else if (!strcmp(f, "--embed")) {
            if ((ok = (k = args_choice(PROG, f, v, embeds, 2)) >= 0)) a->cfg.embed = embed_of[k];
        } else if (!strcmp(f, "--optimizer")) {
            if ((ok = (k = args_choice(PROG, f, v, optimizers, 3)) >= 0)) a->cfg.optimizer = optimizer_of[k];
        } else if (!strcmp(f, "--seed")) {
            if ((ok = parse_int(f, v, 0, COUNT, &n))) a->cfg.seed = (uint64_t)n;
        } else if (!strcmp(f, "--steps")) ok = parse_int(f, v, 0, COUNT, &a->cfg.steps);
        else if (!strcmp(f, "--batch")) ok = parse_int(f, v, 1, SIZE, &a->cfg.batch);
        else if (!strcmp(f, "--n")) ok = parse_int(f, v, 1, SIZE, &a->cfg.n);
        else if (!strcmp(f, "--V")) ok = parse_int(f, v, 2, SIZE, &a->cfg.vocab);
        else if (!strcmp(f, "--d-model")) ok = parse_int(f, v, 1, SIZE, &a->cfg.d_model);
        else if (!strcmp(f, "--d-k")) ok = parse_int(f, v, 1, SIZE, &a->cfg.d_k);
        else if (!strcmp(f, "--heads")) ok = parse_int(f, v, 1, SIZE, &a->cfg.heads);
        else if (!strcmp(f, "--eval")) ok = parse_int(f, v, 1, SIZE, &a->cfg.eval_size);
        else if (!strcmp(f, "--log-every")) ok = parse_int(f, v, 1, COUNT, &a->log_every);
        else if (!strcmp(f, "--threads")) {
            if ((ok = parse_int(f, v, 1, QKV_MAX_THREADS, &n))) a->cfg.threads = (int)n;
        } else if (!strcmp(f, "--lr")) ok = parse_positive(f, v, &a->cfg.lr);
        else if (!strcmp(f, "--clip")) {
            if (!strcmp(v, "off")) a->cfg.clip = 0; /* copy_config: 0 for none */
            else ok = parse_positive(f, v, &a->cfg.clip);
        }
        else if (!strcmp(f, "--scale")) /* a finite number, or "default" for 1/sqrt(d_k); nan and inf refused */
            ok = !strcmp(v, "default") ? (a->cfg.scale = QKV_SCALE_DEFAULT, true) : parse_double(f, v, &a->cfg.scale);
        else if (!strcmp(f, "--save")) a->save = v;
        else if (!strcmp(f, "--load")) a->load = v;
        else if (!strcmp(f, "--svg")) a->svg = v, a->svg_given = true;
        else return args_unknown(PROG, f), 1;
        if (!ok) return 1; /* the parser said which flag and why */
        if (takes) i++;
    }
    if (a->log_every == 0) a->log_every = a->cfg.steps >= 5 ? a->cfg.steps / 5 : 1;
    if (a->svg_given && a->cfg.n > 64) {
        fprintf(stderr, PROG ": --svg draws the attention of sequences up to n = 64; --n is %lld\n",
                (long long)a->cfg.n);
        return 1;
    }
    return 0;
}

static void progress_bar(int64_t step, int64_t total, double loss) {
    int width = 30, filled = total ? (int)(width * step / total) : width;
    printf("\r  [%.*s%*s] %lld/%lld loss %.4f", filled, "##############################", width - filled, "",
           (long long)step, (long long)total, loss);
    fflush(stdout);
}

int main(int argc, char **argv) {
    cli a;
    memset(&a, 0, sizeof a);
    int p = parse(argc, argv, &a);
    if (p) return p == 2 ? 0 : 2;
    char err[1024];
    copy_config resolved = a.cfg;
    if (!copy_config_resolve(&resolved, err, sizeof err)) { /* a bad combination of flags */
        fprintf(stderr, "copy_task: %s\n", err);
        return 2;
    }
    copy_model m;
    if (!copy_model_init(&m, &a.cfg, err, sizeof err)) {
        fprintf(stderr, "copy_task: %s\n", err);
        copy_model_free(&m);
        return 1;
    }
    const copy_config *c = &m.cfg;
    if (a.load && !copy_load(&m, a.load, err, sizeof err)) {
        fprintf(stderr, "copy_task: %s\n", err);
        copy_model_free(&m);
        return 1;
    }
    if (a.load && m.step > c->steps) {
        fprintf(stderr,
                "copy_task: %s is at step %lld, past --steps %lld: --steps is the total counted from step 0, "
                "so nothing would be trained; give --steps above %lld to train more\n",
                a.load, (long long)m.step, (long long)c->steps, (long long)m.step);
        copy_model_free(&m);
        return 2;
    }
    if (a.load && m.step == c->steps && !a.quiet)
        fprintf(stderr, "copy_task: %s is at step %lld = --steps: nothing to train, evaluating it as it is\n",
                a.load, (long long)m.step);
    bool tty = isatty(STDOUT_FILENO) && !a.quiet;
    if (!a.quiet) {
        char scale[32];
        if (c->scale == QKV_SCALE_DEFAULT) snprintf(scale, sizeof scale, "1/sqrt(%lld)", (long long)c->d_k);
        else snprintf(scale, sizeof scale, "%g", c->scale);
        printf("copy_task: task %s, embed %s, n %lld, V %lld, d_model %lld, d_k %lld, heads %lld%s, scale %s,\n"
               "           %s lr %g, batch %lld, %lld steps, %s, seed %llu%s%s\n",
               copy_task_name(c->task), copy_embed_name(c->embed), (long long)c->n, (long long)c->vocab,
               (long long)c->d_model, (long long)c->d_k, (long long)c->heads, c->wo ? ", W^O" : "", scale,
               c->optimizer == QKV_OPTIM_SGD ? "sgd" : c->optimizer == QKV_OPTIM_ADAM ? "adam" : "adamw", c->lr,
               (long long)c->batch, (long long)c->steps, qkv_dtype_name(c->dtype), (unsigned long long)c->seed,
               a.load ? ", resumed from " : "", a.load ? a.load : "");
        printf("%8s %10s %9s %10s %9s\n", "step", "loss", "held-out", "grad norm", "steps/s");
    }

    copy_stats st = {NAN, NAN};
    double accuracy = NAN, t0 = now_seconds(), t_last = t0, train_seconds = 0;
    int64_t first = m.step, last_logged = m.step;
    while (m.step < c->steps) {
        double ts = now_seconds();
        if (!copy_train_step(&m, &st)) {
            fprintf(stderr, "\ncopy_task: step %lld: %s\n", (long long)m.step, qkv_errmsg(m.ctx));
            copy_model_free(&m);
            return 1;
        }
        train_seconds += now_seconds() - ts;
        if (tty && (m.step % 10 == 0 || m.step == c->steps)) progress_bar(m.step, c->steps, st.loss);
        if (!a.quiet && (m.step % a.log_every == 0 || m.step == c->steps)) {
            if (!copy_evaluate(&m, &accuracy, NULL, NULL)) break;
            double t = now_seconds();
            if (tty) printf("\r%*s\r", 72, "");
            printf("%8lld %10.5f %8.2f%% %10.4f %9.0f\n", (long long)m.step, st.loss, 100 * accuracy, st.grad_norm,
                   (double)(m.step - last_logged) / (t - t_last));
            t_last = t;
            last_logged = m.step;
        }
    }
    double attention[64 * 64];
    int32_t tokens[64];
    bool small = c->n <= 64, draw = small && (!a.quiet || a.svg_given), svg_failed = false;
    if (!copy_evaluate(&m, &accuracy, small ? attention : NULL, small ? tokens : NULL)) {
        fprintf(stderr, "copy_task: evaluation: %s\n", qkv_errmsg(m.ctx));
        copy_model_free(&m);
        return 1;
    }
    double steps_per_s = train_seconds > 0 ? (double)(m.step - first) / train_seconds : 0;
    if (!a.quiet) {
        printf("held-out token accuracy %.2f%% on %lld sequences; %.0f steps/s, %.2f s in all\n", 100 * accuracy,
               (long long)c->eval_size, steps_per_s, now_seconds() - t0);
        if (small) {
            printf("\nattention of held-out sequence 0 (rows: query position, columns: key position)\ntokens:");
            for (int64_t i = 0; i < c->n; i++) printf(" %d", tokens[i]);
            printf("\n");
            plot_heatmap_text(stdout, attention, (int)c->n, (int)c->n, tty);
        }
    }
    if (draw) {
        char title[128];
        snprintf(title, sizeof title, "copy_task --task %s: learned attention (step %lld, %.1f%% held-out)",
                 copy_task_name(c->task), (long long)m.step, 100 * accuracy);
        if (plot_heatmap_svg(a.svg, title, "key position", "query position", attention, (int)c->n, (int)c->n)) {
            if (!a.quiet) printf("wrote %s\n", a.svg);
        } else {
            fprintf(stderr, "copy_task: --svg: cannot write %s: %s\n", a.svg, strerror(errno));
            svg_failed = true; /* still save the checkpoint below, then fail */
        }
    }
    if (a.save) {
        if (!copy_save(&m, a.save, err, sizeof err)) {
            fprintf(stderr, "copy_task: %s\n", err);
            copy_model_free(&m);
            return 1;
        }
        if (!a.quiet) printf("saved step %lld to %s\n", (long long)m.step, a.save);
    }
    char final_loss[32] = "null"; /* JSON has no NaN: null when no step was trained */
    if (m.step > first) snprintf(final_loss, sizeof final_loss, "%.17g", st.loss);
    if (a.json)
        printf("{\"task\":\"%s\",\"embed\":\"%s\",\"seed\":%llu,\"steps\":%lld,\"n\":%lld,\"V\":%lld,\"d_model\":%lld,"
               "\"d_k\":%lld,\"heads\":%lld,\"scale\":%.17g,\"lr\":%g,\"final_loss\":%s,\"accuracy\":%.6f,"
               "\"steps_per_s\":%.1f}\n",
               copy_task_name(c->task), copy_embed_name(c->embed), (unsigned long long)c->seed, (long long)m.step,
               (long long)c->n, (long long)c->vocab, (long long)c->d_model, (long long)c->d_k, (long long)c->heads,
               c->scale == QKV_SCALE_DEFAULT ? 1 / sqrt((double)c->d_k) : c->scale, c->lr, final_loss, accuracy, steps_per_s);
    copy_model_free(&m);
    return svg_failed ? 1 : 0;
}
