/* qkv/safetensors.h — safetensors checkpoints (included by qkv.h). Being written. */
#ifndef QKV_SAFETENSORS_H
#define QKV_SAFETENSORS_H
#endif
