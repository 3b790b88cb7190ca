/*
 * stability — attention logit growth at high learning rates, and what qk-layernorm and a logit soft-cap do
 * about it, on a small causal model trained on a synthetic language (stability.h). Prints tables, writes
 * CSV and SVG files into --out; docs/scaling.md (Part 5) shows a default run and what it says.
 */
#define _POSIX_C_SOURCE 200809L /* mkdir */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "atomic_file.h"
#include "sinks.h"
#include "stability.h"

#define PROG "stability"

/* The four arms as entries of an arm list, to rerun some of them (--arms softcap): each makes the model config
 * train_one's scale arms make, under the arm's table name. */
static void arm_sqrt(qkv_model_config *c) { (void)c; }
static void arm_one(qkv_model_config *c) { c->attn_scale = 1.0; }
static void arm_qknorm(qkv_model_config *c) { c->qk_norm = QKV_NORM_LAYER; }
static void arm_softcap(qkv_model_config *c) { c->attn_softcap = STAB_SOFTCAP; }
static const sinks_arm scale_arm_table[STAB_ARMS] = {
    [STAB_ARM_SQRT] = {"1/sqrt(d_head)", arm_sqrt}, [STAB_ARM_ONE] = {"scale 1", arm_one},
    [STAB_ARM_QKNORM] = {"qk-layernorm", arm_qknorm}, [STAB_ARM_SOFTCAP] = {"soft-cap 5", arm_softcap}};

/* list = comma-separated keys of the four arms ("qknorm,softcap") into arms; false if any item is not one. */
static bool scale_arms_parse(const char *list, const sinks_arm **arms, int *n) {
    int count = 0;
    for (const char *p = list;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        int found = -1;
        for (int a = 0; a < STAB_ARMS; a++)
            if (strlen(stab_arm_key(a)) == len && !strncmp(p, stab_arm_key(a), len)) found = a;
        if (found < 0 || count >= STAB_MAX_ARMS) return false;
        for (int k = 0; k < count; k++)
            if (arms[k] == &scale_arm_table[found]) return false;
        arms[count++] = &scale_arm_table[found];
        if (!comma) break;
        p = comma + 1;
    }
    *n = count;
    return true;
}

static void usage(FILE *out) {
    stab_config d = stab_default_config(false), w = stab_wortsman_config(false);
    fprintf(out,
            "usage: stability [--out DIR] [--quick] [--preset default|wortsman] [--arms LIST] [--seed S] [--jobs N]\n"
            "                 [--threads N] [settings]\n"
            "Sweep the peak learning rate of a small causal transformer for four attention arms (scale\n"
            "1/sqrt(d_head), scale 1, qk-layernorm, soft-cap 5) and record the final loss, divergence, the\n"
            "largest attention logit and the smallest attention entropy (after Wortsman et al. 2024).\n\n"
            "  --out DIR    folder for the CSV and SVG files, made if missing     (stability-out)\n"
            "  --quick      3 learning rates, 1 seed, 40 steps (seconds, for the test)\n"
            "  --preset P   default: the sweep of docs/scaling.md Part 5 (300 steps of 8 sequences of 32);\n"
            "               wortsman: Wortsman et al.'s small-model setting, where the models train close to the\n"
            "               source's floor (d_mlp 4x, n_ctx 64, 500 steps of 32 sequences, z-loss 1e-4, clip 1,\n"
            "               lr 3e-4 to 0.3); the settings below change either\n"
            "  --arms LIST  scale: the four arms above (the default); variants: the attention variants of\n"
            "               examples/sinks (softmax,softmax1,sink,sigmoid,ssmax,softpick,gate at 1/sqrt(d_head);\n"
            "               not diff, whose two score matrices the probe cannot read); or a comma-separated list\n"
            "               of them (docs/sinks.md quotes such a sweep); or a list of the four arms' keys\n"
            "               (sqrt,one,qknorm,softcap) to rerun some of them (their rows are those of the\n"
            "               whole sweep, but for the lrs-that-train count, taken over the arms run)\n"
            "  --seed S     seed of the language, the initialisations and batches (0)\n"
            "  --jobs N     runs trained at once, one context each                (2)\n"
            "  --threads N  kernel threads per run                                (1)\n"
            "  --help       this text (a bad flag or value is an error naming it, exit 2)\n"
            "settings (default / wortsman):\n"
            "  --layers L (%lld / %lld)  --d-model D (%lld / %lld)  --heads H (%lld / %lld)  --d-mlp M (%lld / %lld)\n"
            "  --n-ctx N (%lld / %lld)  --batch B (%lld / %lld)  --steps N (%lld / %lld)  --warmup N (steps / 10)\n"
            "  --final-lr F  the cosine decays to peak x F (%g)\n"
            "  --decay X     decoupled weight decay per step at the peak (%g)\n"
            "  --clip X      clip the gradient norm (%g / %g; 0: off)\n"
            "  --z-loss X    add X mean (log Z)^2 of the logits to the training loss (%g / %g; 0: off)\n"
            "  --lr-min X  --lr-max X  --lr-per-decade K   the peak learning rates (%g..%g / %g..%g, %d per\n"
            "               decade; 0: three rates, the ends and their geometric middle)\n"
            "  --seeds K    seeds of the initialisation and batches, 1 to %d (%d)\n"
            "  --probe-every N  steps between probes of the logits and entropies (%lld)\n\n"
            "The result does not depend on --jobs or --threads: every run is a function of the seed.\n",
            (long long)d.n_layer, (long long)w.n_layer, (long long)d.d_model, (long long)w.d_model,
            (long long)d.n_head, (long long)w.n_head, (long long)d.d_mlp, (long long)w.d_mlp, (long long)d.n_ctx,
            (long long)w.n_ctx, (long long)d.batch, (long long)w.batch, (long long)d.steps, (long long)w.steps,
            d.final_lr_frac, d.decay_per_step, d.clip, w.clip, d.z_loss, w.z_loss, d.lr_lo, d.lr_hi, w.lr_lo, w.lr_hi,
            d.lr_per_decade, STAB_MAX_SEEDS, d.n_seeds, (long long)d.probe_every);
}

/* The flags that change a setting. 1 parsed, 0 not one of them, -1 bad value. */
static int setting_flag(stab_config *c, bool *warmup_given, int argc, char **argv, int *i) {
    const char *f = argv[*i];
    int64_t v;
#define INT_SETTING(flag, field, lo, hi)                                                                             \
    if (!strcmp(f, flag)) {                                                                                          \
        if (!args_int_flag(PROG, argc, argv, i, lo, hi, &v)) return -1;                                              \
        c->field = v;                                                                                                \
        return 1;                                                                                                    \
    }
#define REAL_SETTING(flag, field, lo, hi)                                                                            \
    if (!strcmp(f, flag)) return args_double_flag(PROG, argc, argv, i, lo, hi, &c->field) ? 1 : -1;
    INT_SETTING("--layers", n_layer, 1, 64)
    INT_SETTING("--d-model", d_model, 1, 4096)
    INT_SETTING("--heads", n_head, 1, 4096)
    INT_SETTING("--d-mlp", d_mlp, 0, 65536)
    INT_SETTING("--n-ctx", n_ctx, 3, 4096)
    INT_SETTING("--batch", batch, 1, 4096)
    INT_SETTING("--steps", steps, 1, 1000000)
    INT_SETTING("--probe-every", probe_every, 1, 1000000)
    INT_SETTING("--lr-per-decade", lr_per_decade, 0, 12)
    INT_SETTING("--seeds", n_seeds, 1, STAB_MAX_SEEDS)
    REAL_SETTING("--final-lr", final_lr_frac, 0, 1)
    REAL_SETTING("--decay", decay_per_step, 0, 0.5)
    REAL_SETTING("--clip", clip, 0, 1e9)
    REAL_SETTING("--z-loss", z_loss, 0, 10)
    REAL_SETTING("--lr-min", lr_lo, 1e-9, 100)
    REAL_SETTING("--lr-max", lr_hi, 1e-9, 100)
#undef INT_SETTING
#undef REAL_SETTING
    if (!strcmp(f, "--warmup")) {
        if (!args_int_flag(PROG, argc, argv, i, 1, 1000000, &v)) return -1;
        c->warmup = v;
        *warmup_given = true;
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    stab_options opt = {"stability-out", false, 0, 2, 1, stdout, NULL};
    const char *preset = "default";
    for (int i = 1; i < argc; i++) { /* --quick and --preset first: they set the base the settings change */
        if (!strcmp(argv[i], "--quick")) opt.quick = true;
        if (!strcmp(argv[i], "--preset")) {
            static const char *const presets[] = {"default", "wortsman"};
            const char *p = args_value(PROG, argc, argv, &i);
            if (!p || args_choice(PROG, "--preset", p, presets, 2) < 0) return ARGS_USAGE_ERROR;
            preset = p;
        }
    }
    static stab_config cfg;
    cfg = strcmp(preset, "wortsman") ? stab_default_config(opt.quick) : stab_wortsman_config(opt.quick);
    bool warmup_given = false;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int64_t v;
        int r = setting_flag(&cfg, &warmup_given, argc, argv, &i);
        if (r < 0) return ARGS_USAGE_ERROR;
        if (r > 0) continue;
        if (args_is_help(f)) {
            usage(stdout);
            return 0;
        } else if (!strcmp(f, "--quick")) {
            continue;
        } else if (!strcmp(f, "--preset")) {
            i++;
        } else if (!strcmp(f, "--out")) {
            if (!(opt.out_dir = args_value(PROG, argc, argv, &i))) return ARGS_USAGE_ERROR;
        } else if (!strcmp(f, "--arms")) {
            const char *list = args_value(PROG, argc, argv, &i);
            if (!list) return ARGS_USAGE_ERROR;
            static const sinks_arm *variant_arms[STAB_MAX_ARMS];
            char err[256];
            if (!strcmp(list, "scale")) {
                cfg.n_variant_arms = 0;
            } else if (!strcmp(list, "variants")) {
                cfg.n_variant_arms = 0; // every arm the sweep can probe (not differential attention)
                for (int a = 0; a < sinks_arm_count && cfg.n_variant_arms < STAB_MAX_ARMS; a++)
                    if (stab_arm_probeable(&sinks_arms[a])) variant_arms[cfg.n_variant_arms++] = &sinks_arms[a];
            } else if (!scale_arms_parse(list, variant_arms, &cfg.n_variant_arms) &&
                       !sinks_arms_parse(list, variant_arms, STAB_MAX_ARMS, &cfg.n_variant_arms, err, sizeof err)) {
                fprintf(stderr, PROG ": %s (or scale, or variants, or a list of sqrt,one,qknorm,softcap)\n", err);
                return ARGS_USAGE_ERROR;
            }
            cfg.variant_arms = variant_arms;
        } else if (!strcmp(f, "--seed")) {
            if (!args_int_flag(PROG, argc, argv, &i, 0, INT64_MAX, &v)) return ARGS_USAGE_ERROR;
            opt.seed = (uint64_t)v;
        } else if (!strcmp(f, "--jobs")) {
            if (!args_int_flag(PROG, argc, argv, &i, 1, 16, &v)) return ARGS_USAGE_ERROR;
            opt.jobs = (int)v;
        } else if (!strcmp(f, "--threads")) {
            if (!args_int_flag(PROG, argc, argv, &i, 1, 64, &v)) return ARGS_USAGE_ERROR;
            opt.threads = (int)v;
        } else {
            return args_unknown(PROG, f);
        }
    }
    if (!warmup_given) cfg.warmup = cfg.steps / 10 > 0 ? cfg.steps / 10 : 1;
    char why[256];
    if (stab_config_problem(&cfg, why, sizeof why)) {
        fprintf(stderr, PROG ": %s\n", why);
        return ARGS_USAGE_ERROR;
    }
    opt.config = &cfg;
    if (!make_out_dir(PROG, opt.out_dir)) return 1;
    printf(PROG ": %s%s run%s, seed %llu, %d jobs x %d threads, output in %s/\n", opt.quick ? "quick" : "default",
           strcmp(preset, "wortsman") ? "" : " wortsman-preset", cfg.n_variant_arms ? " of the arms listed by --arms" : "",
           (unsigned long long)opt.seed, opt.jobs, opt.threads, opt.out_dir);
    static stab_result r;
    if (!stability_run(&opt, &r)) {
        fprintf(stderr, PROG ": stopped after an error\n");
        return 1;
    }
    printf("\ntime: %.1f s\n", r.seconds);
    return 0;
}
