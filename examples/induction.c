/*
 * induction — watch a two-layer attention-only transformer learn to copy in context (an induction head,
 * [A][B] ... [A] -> [B]) while a one-layer model cannot (Elhage et al. 2021; Olsson et al. 2022).
 *
 *   build/examples/induction --out induction-out            the default run (docs/induction.md)
 *   build/examples/induction --quick --out induction-out    the small run tests/test_induction.c checks
 *   build/examples/induction --compare                      also the scale comparison (3 arms x 3 seeds)
 *
 * The experiment is in induction_run.c (data, training, measurements) and induction_study.c (tables, CSV,
 * plots); induction.h defines every measured quantity.
 */
#define _POSIX_C_SOURCE 200809L /* mkdir */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "atomic_file.h"
#include "induction.h"

#define PROG "induction"

static void usage(FILE *out) {
    ind_config d = ind_default_config(false), q = ind_default_config(true);
    fprintf(out,
            "usage: " PROG " [--out DIR] [--quick] [--preset literature] [--seed S] [--compare] [flags]\n"
            "Train a two-layer attention-only transformer (and a one-layer control) on sequences that repeat a\n"
            "random segment, and watch an induction head form: loss of both halves, previous-token, induction\n"
            "and duplicate-token scores of every head, attention patterns, head and layer ablations, activation\n"
            "patching of every head, the phase change step.\n\n"
            "  --out DIR          folder for the CSV and SVG files, made if missing      (induction-out)\n"
            "  --quick            a small run (%" PRId64 " steps instead of %" PRId64 ")\n"
            "  --preset literature  the literature's toy run: 2 layers, d_model 64, 4 heads of 16, n 64, V 64,\n"
            "                     learned positions, a segment of 8-24 tokens repeated at a random place,\n"
            "                     embeddings N(0, 1), AdamW 3e-3, batch 32, 3000 steps (--quick: 1500); the\n"
            "                     comparison runs as long; other flags change it (--norm none: the other setting)\n"
            "  --seed S           seed of the model and of every sequence                (0)\n"
            "  --compare          also the phase change step for scale 1/sqrt(d_head), 1 and qk-norm, over 3\n"
            "                     seeds (S, S+1, S+2): 9 more runs of the two-layer model\n"
            "  --compare-steps N  training steps of each of those runs     (1500; with --preset: --steps)\n"
            "data:\n"
            "  --data segment|repeat  segment: random prefix, then a segment of random length repeated;\n"
            "                     repeat: the second half repeats the first                    (segment)\n"
            "  --place end|random  where the repeat sits: ending the sequence, or anywhere after the first\n"
            "                     copy with random tokens around it                            (end)\n"
            "  --vocab V (%" PRId64 ")  --n N (sequence length, %" PRId64 ")  --min-segment K (%" PRId64 ")\n"
            "  --max-segment K (n/2)\n"
            "model (attention-only, causal; the control has --layers 1):\n"
            "  --layers L (%" PRId64 ")  --n-head H (%" PRId64 ")  --d-model D (%" PRId64 ")\n"
            "  --scale X|default  the score scale (default 1/sqrt(d_head))\n"
            "  --qk-norm none|layer|rms (none)  --norm none|layer|rms (layer)\n"
            "  --positions learned|sinusoidal|rope|none (rope)\n"
            "  --init gpt2|unit-embed  initial weights: every matrix and embedding N(0, 0.02^2), W_O scaled by\n"
            "                     1/sqrt(2 layers) (GPT-2's), or the same with embeddings N(0, 1)      (gpt2)\n"
            "  --init-std X (0.02)  --init-embed-std X (0.02)  the two stds on their own\n"
            "training (AdamW, linear warm-up then a flat learning rate):\n"
            "  --steps N (%" PRId64 ")  --batch B (%" PRId64 ")  --lr X (%g)  --warmup N (%" PRId64 ")\n"
            "  --weight-decay X (%g)  --clip X|off (%g)\n"
            "  --eval-every K (%" PRId64 ")  --eval-batch B (%" PRId64 ")  --threads N (1)\n"
            "  --quiet            no progress line\n"
            "  --help             this text (a bad flag or value is an error naming it, exit 2)\n",
            q.steps, d.steps, d.vocab, d.n, d.min_segment, d.n_layer, d.n_head, d.d_model, d.steps, d.batch, d.lr,
            d.warmup, d.weight_decay, d.clip, d.eval_every, d.eval_batch);
}

/* The enums' names as the library spells them (filled in main), indexed by value. */
static const char *norm_names[QKV_NORM_KIND_COUNT], *pos_names[QKV_POS_KIND_COUNT];
static const char *const data_names[] = {"segment", "repeat"};
static const char *const place_names[] = {"end", "random"};
static const char *const init_names[] = {"gpt2", "unit-embed"};

/* The flags that change the configuration, applied after --quick chose the base (so their order does not
 * matter). 1 parsed, 0 not one of them, -1 bad value. */
static int config_flag(ind_config *c, int argc, char **argv, int *i) {
    const char *f = argv[*i], *s;
    int64_t v;
    double x;
    int k;
#define INT_FLAG(flag, field, lo, hi)                                                                                \
    if (!strcmp(f, flag)) {                                                                                          \
        if (!args_int_flag(PROG, argc, argv, i, lo, hi, &v)) return -1;                                              \
        c->field = v;                                                                                                \
        return 1;                                                                                                    \
    }
#define CHOICE_FLAG(flag, field, type, names)                                                                        \
    if (!strcmp(f, flag)) {                                                                                          \
        if (!(s = args_value(PROG, argc, argv, i)) ||                                                                \
            (k = args_choice(PROG, flag, s, names, (int)(sizeof names / sizeof names[0]))) < 0)                      \
            return -1;                                                                                               \
        c->field = (type)k;                                                                                          \
        return 1;                                                                                                    \
    }
    INT_FLAG("--vocab", vocab, 2, 1 << 16)
    INT_FLAG("--n", n, 8, IND_MAX_N)
    INT_FLAG("--min-segment", min_segment, 4, IND_MAX_N / 2)
    INT_FLAG("--max-segment", max_segment, 4, IND_MAX_N / 2)
    INT_FLAG("--layers", n_layer, 1, IND_MAX_LAYERS)
    INT_FLAG("--n-head", n_head, 1, IND_MAX_HEADS)
    INT_FLAG("--d-model", d_model, 1, 4096)
    INT_FLAG("--steps", steps, 1, 10000000)
    INT_FLAG("--batch", batch, 1, 4096)
    INT_FLAG("--warmup", warmup, 0, 10000000)
    INT_FLAG("--eval-every", eval_every, 1, 10000000)
    INT_FLAG("--eval-batch", eval_batch, 1, 4096)
    CHOICE_FLAG("--data", data, ind_data_kind, data_names)
    CHOICE_FLAG("--place", place, ind_place_kind, place_names)
    CHOICE_FLAG("--norm", norm, qkv_norm_kind, norm_names)
    CHOICE_FLAG("--qk-norm", qk_norm, qkv_norm_kind, norm_names)
    CHOICE_FLAG("--positions", positions, qkv_positions_kind, pos_names)
#undef INT_FLAG
#undef CHOICE_FLAG
    if (!strcmp(f, "--lr")) return args_double_flag(PROG, argc, argv, i, 1e-9, 10, &c->lr) ? 1 : -1;
    if (!strcmp(f, "--init")) {
        if (!(s = args_value(PROG, argc, argv, i)) || (k = args_choice(PROG, f, s, init_names, 2)) < 0) return -1;
        c->init_std = 0.02, c->init_embed_std = k ? 1.0 : 0.02;
        return 1;
    }
    if (!strcmp(f, "--init-std")) return args_double_flag(PROG, argc, argv, i, 0, 1e3, &c->init_std) ? 1 : -1;
    if (!strcmp(f, "--init-embed-std")) return args_double_flag(PROG, argc, argv, i, 0, 1e3, &c->init_embed_std) ? 1 : -1;
    if (!strcmp(f, "--weight-decay")) return args_double_flag(PROG, argc, argv, i, 0, 10, &c->weight_decay) ? 1 : -1;
    if (!strcmp(f, "--threads")) {
        if (!args_int_flag(PROG, argc, argv, i, 1, QKV_MAX_THREADS, &v)) return -1;
        c->threads = (int)v;
        return 1;
    }
    if (!strcmp(f, "--seed")) {
        if (!args_int_flag(PROG, argc, argv, i, 0, INT64_MAX, &v)) return -1;
        c->seed = (uint64_t)v;
        return 1;
    }
    if (!strcmp(f, "--clip")) {
        if (!(s = args_value(PROG, argc, argv, i))) return -1;
        if (!strcmp(s, "off")) c->clip = 0;
        else if (!args_double(PROG, "--clip", s, 1e-9, 1e9, &c->clip)) return -1;
        return 1;
    }
    if (!strcmp(f, "--scale")) {
        if (!(s = args_value(PROG, argc, argv, i))) return -1;
        if (!strcmp(s, "default")) c->scale = QKV_SCALE_DEFAULT;
        else if (args_double(PROG, "--scale", s, -1e6, 1e6, &x)) c->scale = x;
        else return -1;
        return 1;
    }
    return 0;
}

static ind_result result; /* large: static */

int main(int argc, char **argv) {
    for (int k = 0; k < QKV_NORM_KIND_COUNT; k++) norm_names[k] = qkv_norm_kind_name((qkv_norm_kind)k);
    for (int k = 0; k < QKV_POS_KIND_COUNT; k++) pos_names[k] = qkv_positions_kind_name((qkv_positions_kind)k);
    ind_options o = {"induction-out", {0}, false, 1500, stdout, stderr};
    bool quick = false, quiet = false;
    const char *preset = NULL;
    for (int i = 1; i < argc; i++) { /* --quick and --preset first: they set the base the other flags change */
        if (!strcmp(argv[i], "--quick")) quick = true;
        if (!strcmp(argv[i], "--preset")) {
            if (!(preset = args_value(PROG, argc, argv, &i))) return ARGS_USAGE_ERROR;
            if (strcmp(preset, "literature"))
                return fprintf(stderr, PROG ": --preset %s: the one preset is \"literature\"\n", preset), ARGS_USAGE_ERROR;
        }
    }
    o.cfg = ind_default_config(quick);
    if (preset) {
        ind_literature_preset(&o.cfg, quick);
        o.compare_steps = 0; /* as long as the run itself */
    }
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int r = config_flag(&o.cfg, argc, argv, &i);
        if (r < 0) return ARGS_USAGE_ERROR;
        if (r > 0) continue;
        if (args_is_help(f)) return usage(stdout), 0;
        else if (!strcmp(f, "--quick")) continue;
        else if (!strcmp(f, "--preset")) i++;
        else if (!strcmp(f, "--quiet")) quiet = true;
        else if (!strcmp(f, "--compare")) o.compare = true;
        else if (!strcmp(f, "--compare-steps")) {
            int64_t v;
            if (!args_int_flag(PROG, argc, argv, &i, 1, 10000000, &v)) return ARGS_USAGE_ERROR;
            o.compare_steps = v;
        }
        else if (!strcmp(f, "--out")) {
            if (!(o.out_dir = args_value(PROG, argc, argv, &i))) return ARGS_USAGE_ERROR;
        } else return args_unknown(PROG, f);
    }
    char err[256];
    if (!ind_config_check(&o.cfg, err, sizeof err)) {
        fprintf(stderr, PROG ": %s\n", err);
        return ARGS_USAGE_ERROR;
    }
    if (quiet) o.progress = NULL;
    if (!make_out_dir(PROG, o.out_dir)) return 1;
    printf(PROG ": %s%s run, seed %" PRIu64 ", output in %s/\n", quick ? "quick" : "default",
           preset ? " literature-preset" : "", o.cfg.seed, o.out_dir);
    fflush(stdout);
    bool ok = ind_study(&o, &result);
    if (ok) printf("time: %.2f s (two layers %.2f s, one layer %.2f s%s)\n", result.seconds, result.two.seconds,
                   result.one.seconds, result.compared ? ", then the scale comparison" : "");
    ind_result_free(&result);
    if (!ok) fprintf(stderr, PROG ": stopped after an error\n");
    return ok ? 0 : 1;
}
