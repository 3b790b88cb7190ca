/*
 * logits_tool.c — the qkv side of the nanoGPT interoperability test (tests/tools/check_nanogpt.py drives it).
 *
 *   logits_tool CHECKPOINT IDS.npy OUT.npy   load the model (qkv_model_load), run it causally on the i32 ids
 *                                            [B, n] and write the logits [B, n, vocab] (the model's dtype)
 * Exit status 1 with qkv's message on stderr when anything fails.
 */
#include <stdio.h>

#include "qkv.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: logits_tool CHECKPOINT IDS.npy OUT.npy\n");
        return 2;
    }
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model *m = qkv_model_load(ctx, argv[1]);
    qkv_tensor *ids = m ? qkv_npy_load(ctx, argv[2]) : NULL;
    qkv_tensor *logits = ids ? qkv_model_forward(ctx, m, ids, QKV_CAUSAL) : NULL;
    if (logits) qkv_npy_save(ctx, logits, argv[3]);
    int status = qkv_error(ctx) != QKV_OK;
    if (status) fprintf(stderr, "logits_tool: %s\n", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
    return status;
}
