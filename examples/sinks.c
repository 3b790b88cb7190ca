/*
 * sinks — attention sinks, massive activations and the StreamingLLM test, one small causal language model per
 * attention variant (sinks.h). Prints tables, writes CSV and SVG files into --out; docs/sinks.md shows a
 * default run and what it says.
 */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "atomic_file.h"
#include "sinks.h"

#define PROG "sinks"

static void usage(FILE *out) {
    sinks_config d = sinks_default_config(false), q = sinks_default_config(true);
    fprintf(out,
            "usage: sinks [--out DIR] [--quick] [--arms A,B,...] [--data FILE] [--seed S] [--jobs N] [--threads N]\n"
            "             [settings]\n"
            "Train one small causal transformer per attention arm and measure attention sinks (Gu et al. 2024's sink\n"
            "rate, epsilon %.1f, and the first-token weight per layer over training), massive activations of the\n"
            "residual stream (Sun et al. 2024), attention entropy, the held-out loss, and the StreamingLLM test\n"
            "(Xiao et al. 2023): the loss with the first token removed.\n\n"
            "  --out DIR     folder for the CSV and SVG files, made if missing       (sinks-out)\n"
            "  --quick       the test's small run (seconds)\n"
            "  --arms LIST   comma-separated arms (default all):",
            SINKS_EPSILON);
    for (int a = 0; a < sinks_arm_count; a++) fprintf(out, "%s%s", a ? "," : " ", sinks_arms[a].name);
    fprintf(out,
            "\n  --data FILE   train on the bytes of FILE (vocabulary 257, BOS 256; the last 10%% held out) instead of\n"
            "                the synthetic language (BOS, bigram text and key-value pairs to recall)\n"
            "  --seed S      seed of the data, the initialisation (the same in every arm) and the batches (0)\n"
            "  --jobs N      arms trained at once, one context each                  (2)\n"
            "  --threads N   kernel threads per arm                                  (1)\n"
            "  --help        this text (a bad flag or value is an error naming it, exit 2)\n"
            "settings (default / quick):\n"
            "  --layers L (%lld / %lld)  --d-model D (%lld / %lld)  --heads H (%lld / %lld)  --d-mlp M (%lld / %lld)\n"
            "  --n-ctx N (%lld / %lld)  --batch B (%lld / %lld)  --steps N (%lld / %lld)  --warmup N (steps / 10)\n"
            "  --lr X (%g)  --weight-decay X (%g)  --probe-every N (%lld / %lld)  --eval-batches N (%lld / %lld)\n"
            "  --shift S     the StreamingLLM window starts at position S (n-ctx / 2)\n\n"
            "The result does not depend on --jobs or --threads: every arm is a function of the seed.\n",
            (long long)d.n_layer, (long long)q.n_layer, (long long)d.d_model, (long long)q.d_model,
            (long long)d.n_head, (long long)q.n_head, (long long)d.d_mlp, (long long)q.d_mlp, (long long)d.n_ctx,
            (long long)q.n_ctx, (long long)d.batch, (long long)q.batch, (long long)d.steps, (long long)q.steps, d.lr,
            d.weight_decay,
            (long long)d.probe_every, (long long)q.probe_every, (long long)d.eval_batches, (long long)q.eval_batches);
}

int main(int argc, char **argv) {
    static sinks_options opt;
    opt.out_dir = "sinks-out", opt.jobs = 2, opt.threads = 1, opt.log = stdout, opt.progress = stdout;
    bool quick = false, warmup_given = false, shift_given = false;
    for (int i = 1; i < argc; i++) quick |= !strcmp(argv[i], "--quick"); /* the base the settings change */
    opt.cfg = sinks_default_config(quick);
    sinks_config *c = &opt.cfg;
    const char *arms = NULL;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int64_t v;
#define INT_SETTING(flag, field, lo, hi)                                                                             \
    if (!strcmp(f, flag)) {                                                                                          \
        if (!args_int_flag(PROG, argc, argv, &i, lo, hi, &v)) return ARGS_USAGE_ERROR;                               \
        c->field = v;                                                                                                \
        continue;                                                                                                    \
    }
        INT_SETTING("--layers", n_layer, 1, SINKS_MAX_LAYERS)
        INT_SETTING("--d-model", d_model, 2, 4096)
        INT_SETTING("--heads", n_head, 1, SINKS_MAX_HEADS)
        INT_SETTING("--d-mlp", d_mlp, 0, 65536)
        INT_SETTING("--n-ctx", n_ctx, 4, 1024)
        INT_SETTING("--batch", batch, 1, 4096)
        INT_SETTING("--steps", steps, 1, 1000000)
        INT_SETTING("--probe-every", probe_every, 1, 1000000)
        INT_SETTING("--eval-batches", eval_batches, 1, 10000)
#undef INT_SETTING
        if (!strcmp(f, "--warmup")) {
            if (!args_int_flag(PROG, argc, argv, &i, 1, 1000000, &v)) return ARGS_USAGE_ERROR;
            c->warmup = v, warmup_given = true;
        } else if (!strcmp(f, "--shift")) {
            if (!args_int_flag(PROG, argc, argv, &i, 1, 1024, &v)) return ARGS_USAGE_ERROR;
            c->shift = v, shift_given = true;
        } else if (!strcmp(f, "--lr")) {
            if (!args_double_flag(PROG, argc, argv, &i, 1e-9, 100, &c->lr)) return ARGS_USAGE_ERROR;
        } else if (!strcmp(f, "--weight-decay")) {
            if (!args_double_flag(PROG, argc, argv, &i, 0, 1e6, &c->weight_decay)) return ARGS_USAGE_ERROR;
        } else if (args_is_help(f)) {
            usage(stdout);
            return 0;
        } else if (!strcmp(f, "--quick")) {
            continue;
        } else if (!strcmp(f, "--out")) {
            if (!(opt.out_dir = args_value(PROG, argc, argv, &i))) return ARGS_USAGE_ERROR;
        } else if (!strcmp(f, "--data")) {
            if (!(opt.data_path = args_value(PROG, argc, argv, &i))) return ARGS_USAGE_ERROR;
        } else if (!strcmp(f, "--arms")) {
            if (!(arms = args_value(PROG, argc, argv, &i))) return ARGS_USAGE_ERROR;
        } else if (!strcmp(f, "--seed")) {
            if (!args_int_flag(PROG, argc, argv, &i, 0, INT64_MAX, &v)) return ARGS_USAGE_ERROR;
            opt.seed = (uint64_t)v;
        } else if (!strcmp(f, "--jobs")) {
            if (!args_int_flag(PROG, argc, argv, &i, 1, SINKS_MAX_ARMS, &v)) return ARGS_USAGE_ERROR;
            opt.jobs = (int)v;
        } else if (!strcmp(f, "--threads")) {
            if (!args_int_flag(PROG, argc, argv, &i, 1, 64, &v)) return ARGS_USAGE_ERROR;
            opt.threads = (int)v;
        } else {
            return args_unknown(PROG, f);
        }
    }
    if (!warmup_given) c->warmup = c->steps / 10 > 0 ? c->steps / 10 : 1;
    if (!shift_given) c->shift = c->n_ctx / 2;
    char why[256];
    if (arms && !sinks_arms_parse(arms, opt.arms, SINKS_MAX_ARMS, &opt.n_arms, why, sizeof why)) {
        fprintf(stderr, PROG ": %s\n", why);
        return ARGS_USAGE_ERROR;
    }
    if (sinks_config_problem(c, why, sizeof why)) {
        fprintf(stderr, PROG ": %s\n", why);
        return ARGS_USAGE_ERROR;
    }
    if (!make_out_dir(PROG, opt.out_dir)) return 1;
    printf(PROG ": %s run, seed %llu, %d jobs x %d threads, output in %s/\n", quick ? "quick" : "default",
           (unsigned long long)opt.seed, opt.jobs, opt.threads, opt.out_dir);
    static sinks_result r;
    if (!sinks_run(&opt, &r)) {
        fprintf(stderr, PROG ": stopped after an error\n");
        return 1;
    }
    printf("\ntime: %.1f s\n", r.seconds);
    return 0;
}
