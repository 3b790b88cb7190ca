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
#include "stability.h"

#define PROG "stability"

static void usage(FILE *out) {
    fprintf(out,
            "usage: stability [--out DIR] [--quick] [--seed S] [--jobs N] [--threads N]\n"
            "Sweep the peak learning rate of a small causal transformer for four attention arms (scale\n"
            "1/sqrt(d_head), scale 1, qk-layernorm, soft-cap 5) and record the final loss, divergence, the\n"
            "largest attention logit and the smallest attention entropy (after Wortsman et al. 2024).\n\n"
            "  --out DIR    folder for the CSV and SVG files, made if missing     (stability-out)\n"
            "  --quick      3 learning rates, 1 seed, 40 steps (seconds, for the test)\n"
            "  --seed S     seed of the language, the initialisations and batches (0)\n"
            "  --jobs N     runs trained at once, one context each                (2)\n"
            "  --threads N  kernel threads per run                                (1)\n"
            "  --help       this text (a bad flag or value is an error naming it, exit 2)\n\n"
            "The result does not depend on --jobs or --threads: every run is a function of the seed.\n");
}

int main(int argc, char **argv) {
    stab_options opt = {"stability-out", false, 0, 2, 1, stdout};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int64_t v;
        if (args_is_help(f)) {
            usage(stdout);
            return 0;
        } else if (!strcmp(f, "--quick")) {
            opt.quick = true;
        } else if (!strcmp(f, "--out")) {
            if (!(opt.out_dir = args_value(PROG, argc, argv, &i))) return ARGS_USAGE_ERROR;
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
    if (!make_out_dir(PROG, opt.out_dir)) return 1;
    printf(PROG ": %s run, seed %llu, %d jobs x %d threads, output in %s/\n", opt.quick ? "quick" : "default",
           (unsigned long long)opt.seed, opt.jobs, opt.threads, opt.out_dir);
    static stab_result r;
    if (!stability_run(&opt, &r)) {
        fprintf(stderr, PROG ": stopped after an error\n");
        return 1;
    }
    printf("\ntime: %.1f s\n", r.seconds);
    return 0;
}
