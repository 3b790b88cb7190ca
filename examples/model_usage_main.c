/*
 * model_usage_main.c — the command line of build/examples/model_usage: model_usage.c is the README's model
 * tutorial verbatim (built with its main renamed to model_usage_example), so the flags are handled here. It
 * takes none but --help.
 */

#include "args.h"

int model_usage_example(void);

int main(int argc, char **argv) {
    int status = args_none("model_usage", argc, argv,
                           "Run the README's model tutorial: train a 2-layer decoder for 100 steps to continue\n"
                           "counting sequences, save it to ./tiny.safetensors, load it back and sample 8 tokens\n"
                           "greedily. It takes no flags but --help.\n");
    return status >= 0 ? status : model_usage_example();
}
