/*
 * softmax_study — why attention divides its scores by sqrt(d_k), in numbers and plots a reader can rerun.
 * Four parts (study.h): the spread of q.k, saturation of the softmax, gradients at initialisation, and
 * training the copy task. Each prints a table and writes CSV and SVG files into --out.
 * docs/scaling.md shows a default run and what it says.
 */
#define _POSIX_C_SOURCE 200809L /* mkdir */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "atomic_file.h"
#include "study.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: softmax_study [--out DIR] [--quick] [--seed S] [--part 1|2|3|4]\n"
            "Measure why scaled dot-product attention divides Q K^T by sqrt(d_k), with qkv's operators.\n\n"
            "  --out DIR    folder for the CSV and SVG files, made if missing     (study-out)\n"
            "  --quick      small samples and training budgets (seconds instead of about a minute)\n"
            "  --seed S     seed of every random draw                             (0)\n"
            "  --part P     run only part P (repeatable; default all four)\n"
            "  --help       this text (a bad flag or value is an error naming it, exit 2)\n\n"
            "Parts: 1 spread of q.k against sqrt(d_k); 2 softmax saturation for a row of 64 keys;\n"
            "3 |dL/dS| and |dL/dW^Q| at initialisation in f64 and f32; 4 the copy task per d_k, scale, seed.\n"
            "Scales compared: 1/sqrt(d_k), 1 (left out) and 1/d_k.\n");
}

int main(int argc, char **argv) {
    study_options opt = {"study-out", false, 0, stdout};
    bool parts[5] = {false};
    bool any_part = false;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int64_t v;
        if (args_is_help(f)) {
            usage(stdout);
            return 0;
        } else if (!strcmp(f, "--quick")) {
            opt.quick = true;
        } else if (!strcmp(f, "--out")) {
            if (!(opt.out_dir = args_value("softmax_study", argc, argv, &i))) return ARGS_USAGE_ERROR;
        } else if (!strcmp(f, "--seed")) {
            if (!args_int_flag("softmax_study", argc, argv, &i, 0, INT64_MAX, &v)) return ARGS_USAGE_ERROR;
            opt.seed = (uint64_t)v;
        } else if (!strcmp(f, "--part")) {
            if (!args_int_flag("softmax_study", argc, argv, &i, 1, 4, &v)) return ARGS_USAGE_ERROR;
            parts[v] = any_part = true;
        } else {
            return args_unknown("softmax_study", f);
        }
    }
    if (!any_part) parts[1] = parts[2] = parts[3] = parts[4] = true;
    if (!make_out_dir("softmax_study", opt.out_dir)) return 1;
    printf("softmax_study: %s run, seed %llu, output in %s/\n", opt.quick ? "quick" : "default",
           (unsigned long long)opt.seed, opt.out_dir);

    static study_spread_result spread;
    static study_saturation_result saturation;
    static study_gradients_result gradients;
    static study_training_result training;
    double t_all = study_now(), elapsed[5] = {0};
    bool ok = true;
    for (int p = 1; p <= 4 && ok; p++) {
        if (!parts[p]) continue;
        double t0 = study_now();
        switch (p) {
        case 1: ok = study_spread(&opt, &spread); break;
        case 2: ok = study_saturation(&opt, &saturation); break;
        case 3: ok = study_gradients(&opt, &gradients); break;
        default: ok = study_training(&opt, &training); break;
        }
        elapsed[p] = study_now() - t0;
        printf("part %d: %.2f s\n", p, elapsed[p]);
        fflush(stdout);
    }
    if (!ok) {
        fprintf(stderr, "softmax_study: stopped after an error\n");
        return 1;
    }
    printf("\ntime per part:");
    for (int p = 1; p <= 4; p++)
        if (parts[p]) printf(" %d: %.2f s;", p, elapsed[p]);
    printf(" total %.2f s\n", study_now() - t_all);
    return 0;
}
