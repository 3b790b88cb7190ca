/*
 * usage_main.c — the command line of build/examples/usage: usage.c is the README's snippet verbatim (built
 * with its main renamed to usage_example), so the flags are handled here. It takes none but --help.
 */

#include "args.h"

int usage_example(void);

int main(int argc, char **argv) {
    int status = args_none("usage", argc, argv,
                           "Run the README's usage example: causal self-attention on a [2, 5, 16] input, its\n"
                           "backward, and the attention weights and one gradient printed. It takes no flags\n"
                           "but --help.\n");
    return status >= 0 ? status : usage_example();
}
