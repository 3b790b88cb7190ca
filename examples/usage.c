#include <stdio.h>
#include "qkv.h"

int main(void) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);                  /* owns all memory, the RNG and the error */
    qkv_tensor *x = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){2, 5, 16}, 0, 1);   /* [B, n, d_model] */
    qkv_tensor *wq = qkv_param(ctx, qkv_xavier_uniform(ctx, QKV_F32, 16, 8));  /* lives on */
    qkv_tensor *wk = qkv_param(ctx, qkv_xavier_uniform(ctx, QKV_F32, 16, 8));
    qkv_tensor *wv = qkv_param(ctx, qkv_xavier_uniform(ctx, QKV_F32, 16, 8));
    qkv_tensor *attn = NULL;
    qkv_tensor *out = qkv_self_attention(ctx, x, wq, wk, wv, NULL, QKV_SCALE_DEFAULT,
                                         QKV_CAUSAL, &attn);                   /* [2, 5, 8] */
    qkv_tensor *loss = qkv_mean(ctx, qkv_mul(ctx, out, out));
    if (qkv_backward(ctx, loss, NULL) != QKV_OK) {     /* one check for the whole graph */
        fprintf(stderr, "%s\n", qkv_errmsg(ctx));
        return 1;
    }
    qkv_print(ctx, attn, stdout);                      /* causal: zeros above the diagonal */
    printf("dL/dWq[0][0] = %g\n", qkv_get(ctx, wq->grad, (int64_t[]){0, 0}));
    qkv_step_end(ctx);                                 /* frees the step; wq..wv and grads stay */
    qkv_ctx_free(ctx);
    return 0;
}
