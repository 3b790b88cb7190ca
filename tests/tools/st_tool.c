/*
 * st_tool.c — the qkv side of the safetensors interoperability test (read_safetensors.py drives it).
 *
 *   st_tool write PATH   write the fixed checkpoint below (every dtype, ranks 0..4, a zero-size
 *                        tensor, metadata with escapes and UTF-8) with qkv_safetensors_save
 *   st_tool dump PATH    load PATH with qkv_safetensors_load and print, one line each,
 *                          meta<TAB>key<TAB>value              (value with \n \t \\ escaped)
 *                          tensor<TAB>name<TAB>dtype<TAB>d0,d1,...<TAB>v0 v1 ...   (%.17g / %.9g)
 *                        exit status 1 with the error message on stderr if the load fails
 *
 * The values are a formula the Python script computes independently:
 *   f32: (float)(1 / (i + 3)) - 0.25     f64: 1 / (i + 7) - i
 *   i32: (i - 3) * 1000003               u8:  (i * 37 + 11) mod 256
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv.h"

static void fill(qkv_tensor *t) {
    for (int64_t i = 0; i < t->numel; i++) {
        switch (t->dtype) {
        case QKV_F32: qkv_f32(t)[i] = (float)(1.0 / (double)(i + 3)) - 0.25f; break;
        case QKV_F64: qkv_f64(t)[i] = 1.0 / (double)(i + 7) - (double)i; break;
        case QKV_I32: qkv_i32(t)[i] = (int32_t)((i - 3) * 1000003); break;
        case QKV_U8: qkv_u8(t)[i] = (uint8_t)(i * 37 + 11); break;
        default: break;
        }
    }
}

static int write_checkpoint(qkv_ctx *ctx, const char *path) {
    qkv_tensor *wq = qkv_zeros(ctx, QKV_F32, 2, (int64_t[]){4, 3});
    qkv_tensor *wk = qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){2, 3, 2});
    qkv_tensor *targets = qkv_zeros(ctx, QKV_I32, 1, (int64_t[]){7});
    qkv_tensor *mask = qkv_zeros(ctx, QKV_U8, 2, (int64_t[]){3, 5});
    qkv_tensor *scale = qkv_zeros(ctx, QKV_F64, 0, NULL);
    qkv_tensor *big = qkv_zeros(ctx, QKV_F32, 4, (int64_t[]){2, 3, 4, 5});
    qkv_tensor *empty = qkv_zeros(ctx, QKV_F32, 2, (int64_t[]){0, 3});
    if (!wq || !wk || !targets || !mask || !scale || !big || !empty) return 1;
    fill(wq), fill(wk), fill(targets), fill(mask), fill(scale), fill(big);
    qkv_named_tensor t[] = {{"wq", wq},       {"wk", wk},   {"targets", targets}, {"mask", mask},
                            {"scale", scale}, {"big", big}, {"empty", empty}};
    const char *meta[] = {"step", "1200", "seed", "7", "config", "{\"task\": \"reverse\",\n\t\"d_model\": 16}",
                          "note", "h\xc3\xa9llo \xe2\x9c\x93"};
    return qkv_safetensors_save(ctx, path, t, 7, meta, 4) != QKV_OK;
}

static void print_escaped(const char *s) {
    for (; *s; s++) {
        if (*s == '\n') fputs("\\n", stdout);
        else if (*s == '\t') fputs("\\t", stdout);
        else if (*s == '\\') fputs("\\\\", stdout);
        else putchar(*s);
    }
}

static int dump(qkv_ctx *ctx, const char *path) {
    qkv_safetensors *st = qkv_safetensors_load(ctx, path);
    if (!st) return 1;
    for (int i = 0; i < qkv_safetensors_metadata_count(st); i++) {
        const char *k = qkv_safetensors_metadata_key(st, i);
        fputs("meta\t", stdout);
        print_escaped(k);
        putchar('\t');
        print_escaped(qkv_safetensors_metadata(st, k));
        putchar('\n');
    }
    for (int i = 0; i < qkv_safetensors_count(st); i++) {
        const char *name = qkv_safetensors_name(st, i);
        const qkv_tensor *t = qkv_safetensors_get(st, name);
        static const char *tags[] = {"F32", "F64", "I32", "U8"};
        printf("tensor\t%s\t%s\t", name, tags[t->dtype]);
        for (int d = 0; d < t->ndim; d++) printf(d ? ",%lld" : "%lld", (long long)t->shape[d]);
        putchar('\t');
        for (int64_t j = 0; j < t->numel; j++) {
            if (j) putchar(' ');
            switch (t->dtype) {
            case QKV_F32: printf("%.9g", (double)qkv_f32(t)[j]); break;
            case QKV_F64: printf("%.17g", qkv_f64(t)[j]); break;
            case QKV_I32: printf("%d", (int)qkv_i32(t)[j]); break;
            case QKV_U8: printf("%d", (int)qkv_u8(t)[j]); break;
            default: break;
            }
        }
        putchar('\n');
    }
    qkv_safetensors_free(ctx, st);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[1], "write") && strcmp(argv[1], "dump"))) {
        fprintf(stderr, "usage: %s write|dump PATH\n", argv[0]);
        return 2;
    }
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    if (!ctx) return 1;
    int rc = strcmp(argv[1], "write") == 0 ? write_checkpoint(ctx, argv[2]) : dump(ctx, argv[2]);
    if (rc) fprintf(stderr, "st_tool: %s\n", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
    return rc;
}
