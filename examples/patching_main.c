/*
 * patching_main.c — the command line of build/examples/patching: patching.c is docs/patching.md's program
 * verbatim (tests/check_page.py compares them), so the flags are handled here.
 */
#include <stdio.h>
#include <string.h>

#include "args.h"

int patching_tutorial(const char *out_dir);

static void usage(FILE *out) {
    fprintf(out, "usage: patching [--out DIR]\n"
                 "docs/patching.md's program: a two-layer attention-only model trained to recall the first token,\n"
                 "then activation patching (the residual stream by position, each head's output), direct logit\n"
                 "attribution and the logit lens. With --out, the patching tables as SVG heat maps in DIR.\n");
}

int main(int argc, char **argv) {
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (args_is_help(f)) return usage(stdout), 0;
        else if (!strcmp(f, "--out") && i + 1 < argc) out = argv[++i];
        else return args_unknown("patching", f);
    }
    return patching_tutorial(out);
}
