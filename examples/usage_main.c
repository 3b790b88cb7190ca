/*
 * usage_main.c — the command line of build/examples/usage: usage.c is the README's snippet verbatim (built
 * with its main renamed to usage_example), so the flags are handled here. It takes none but --help.
 */
#include <stdio.h>

#include "args.h"

int usage_example(void);

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (args_is_help(argv[i])) {
            printf("usage: usage\nRun the README's usage example: causal self-attention on a [2, 5, 16] input,\n"
                   "its backward, and the attention weights and one gradient printed. It takes no flags.\n");
            return 0;
        }
        return args_unknown("usage", argv[i]);
    }
    return usage_example();
}
