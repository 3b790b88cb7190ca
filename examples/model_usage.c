#include <stdio.h>
#include "qkv.h"

/* Train a 2-layer decoder to continue "abcd...", save it, load it back, and sample from it. */
int main(void) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config cfg = qkv_model_default_config();      /* documented defaults, then ours: */
    cfg.vocab = 16, cfg.n_ctx = 16, cfg.d_model = 32, cfg.n_head = 4, cfg.d_mlp = 64;
    qkv_model *m = qkv_model_new(ctx, &cfg);                 /* parameters: embed.W_E, blocks.0.attn.W_Q, ... */
    qkv_optim_options o = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    o.lr = 1e-2;
    qkv_optimizer *opt = qkv_optim_new(ctx, &o, qkv_model_params(m), qkv_model_param_count(m));
    int32_t seq[4 * 16];                                      /* 4 sequences counting up mod 16 */
    for (int i = 0; i < 4 * 16; i++) seq[i] = (i / 16 * 3 + i % 16) % 16;
    for (int step = 0; step < 100; step++) {
        qkv_tensor *ids = qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){4, 16}, seq);
        qkv_tensor *logits = qkv_model_forward(ctx, m, ids, QKV_CAUSAL);          /* [4, 16, 16] */
        qkv_tensor *loss = qkv_model_loss(ctx, logits, qkv_next_token_targets(ctx, ids));
        if (qkv_backward(ctx, loss, NULL) != QKV_OK) break;  /* one check for the whole step */
        if (step % 25 == 0) printf("step %3d  loss %.3f\n", step, qkv_get_flat(ctx, loss, 0));
        qkv_optim_step(opt);
        qkv_optim_zero_grad(opt);
        qkv_step_end(ctx);
    }
    qkv_model_save(ctx, m, "tiny.safetensors", opt, NULL, 0); /* config in the metadata; atomic */
    qkv_model *back = qkv_model_load(ctx, "tiny.safetensors");
    int32_t prompt[3] = {5, 6, 7}, next[8];
    qkv_sample_options greedy = {0.0, 0};                     /* temperature 0: argmax */
    qkv_model_sample(ctx, back, prompt, 3, 8, &greedy, next);
    for (int i = 0; i < 8; i++) printf("%d ", next[i]);      /* 8 9 10 11 12 13 14 15 once trained */
    printf("\n");
    if (qkv_error(ctx)) fprintf(stderr, "%s\n", qkv_errmsg(ctx));
    int status = qkv_error(ctx) != QKV_OK;
    qkv_ctx_free(ctx);                                        /* frees the models and the optimizer too */
    return status;
}
