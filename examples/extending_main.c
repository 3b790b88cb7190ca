/*
 * extending_main.c — the command line of build/examples/extending: extending.c is docs/extending.md's program
 * verbatim (tests/check_page.py compares them), so the flags are handled here.
 */
#include <stdio.h>
#include <string.h>

#include "args.h"

int extending_tutorial(int steps);

static void usage(FILE *out) {
    fprintf(out, "usage: extending [--steps N]\n"
                 "docs/extending.md's program: softmax plus one built from primitives and as a user-defined\n"
                 "operator, both checked by gradcheck and against each other, then three 2-layer attention-only\n"
                 "models (softmax, and plus one both ways) trained on a copy task for N steps (default 300).\n"
                 "Exits 1 when a check fails or a model ends above 0.1 nats.\n");
}

int main(int argc, char **argv) {
    int64_t steps = 300;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (args_is_help(f)) return usage(stdout), 0;
        else if (!strcmp(f, "--steps")) { if (!args_int_flag("extending", argc, argv, &i, 1, 100000, &steps)) return 2; }
        else return args_unknown("extending", f);
    }
    return extending_tutorial((int)steps);
}
