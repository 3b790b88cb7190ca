/* qkv/optim.h — optimizers and gradient clipping (included by qkv.h). Being written. */
#ifndef QKV_OPTIM_H
#define QKV_OPTIM_H
#endif
