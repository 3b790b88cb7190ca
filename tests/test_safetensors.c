/*
 * test_safetensors.c — checkpoints: round trip with metadata, the bytes the reference serializer
 * writes, files laid out differently by other writers, a table of malformed files each refused with
 * its code and message, injected write / fsync / rename failures that leave the old checkpoint
 * intact, allocation failures, and the argument checks of every function.
 */
#define _XOPEN_SOURCE 700
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fileio.h"

#include "test_files.h"
#include "test_alloc.h"

static tmpdir make_tmpdir(void) { return make_tmpdir_tagged("st"); }

/* A safetensors file: the header size, the JSON as given (no padding), data_len bytes 0, 1, 2, ... */
static unsigned char *st_bytes(const char *json, size_t data_len, size_t *size) {
    size_t n = strlen(json);
    unsigned char *b = malloc(8 + n + data_len + 1);
    qkv_put_le64_(b, n);
    memcpy(b + 8, json, n);
    for (size_t i = 0; i < data_len; i++) b[8 + n + i] = (unsigned char)i;
    *size = 8 + n + data_len;
    return b;
}

static void fill_pattern(qkv_tensor *t, int salt) {
    for (int64_t i = 0; i < t->numel; i++) {
        switch (t->dtype) {
        case QKV_F32: qkv_f32(t)[i] = (float)(1.0 / (double)(i + 3 + salt)) - 0.25f; break;
        case QKV_F64: qkv_f64(t)[i] = 1.0 / (double)(i + 7 + salt) - (double)i; break;
        case QKV_I32: qkv_i32(t)[i] = (int32_t)((i - 3 + salt) * 1000003); break;
        case QKV_U8: qkv_u8(t)[i] = (uint8_t)(i * 37 + 11 + salt); break;
        default: break;
        }
    }
}

static bool same_tensor(const qkv_tensor *a, const qkv_tensor *b) {
    if (!a || !b || a->dtype != b->dtype || a->ndim != b->ndim || a->numel != b->numel) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return memcmp(a->data, b->data, (size_t)a->numel * qkv_dtype_size(a->dtype)) == 0;
}

/* ---- round trip ---------------------------------------------------------------------------------- */

Test(safetensors, round_trip_with_metadata) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *wq = qkv_zeros(ctx, QKV_F32, 2, (int64_t[]){16, 8});
    qkv_tensor *wk = qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){2, 3, 5});
    qkv_tensor *ids = qkv_zeros(ctx, QKV_I32, 1, (int64_t[]){7});
    qkv_tensor *mask = qkv_zeros(ctx, QKV_U8, 4, (int64_t[]){1, 2, 3, 3});
    qkv_tensor *step = qkv_scalar(ctx, QKV_F64, 1200.0);
    qkv_tensor *empty = qkv_zeros(ctx, QKV_F32, 2, (int64_t[]){0, 4});
    qkv_tensor *odd = qkv_zeros(ctx, QKV_U8, 1, (int64_t[]){3});
    fill_pattern(wq, 0);
    fill_pattern(wk, 1);
    fill_pattern(ids, 2);
    fill_pattern(mask, 3);
    fill_pattern(odd, 4);
    qkv_named_tensor tensors[] = {
        {"wq", wq}, {"layer.0/wk", wk}, {"ids", ids}, {"mask", mask}, {"step", step}, {"empty", empty},
        {"\xc3\xbc-odd", odd}, /* "ü-odd" */
    };
    const char *meta[] = {
        "step", "1200", "seed", "7", "config", "{\"task\": \"reverse\", \"d_model\": 16}\n\\tab\t",
        "note", "h\xc3\xa9llo \xe2\x9c\x93",
    };
    const char *path = in_dir(&d, "ckpt.safetensors");
    cr_assert_eq(qkv_safetensors_save(ctx, path, tensors, 7, meta, 4), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect_eq(count_tmp_files(&d), 0);

    qkv_safetensors *st = qkv_safetensors_load(ctx, path);
    cr_assert_not_null(st, "%s", qkv_errmsg(ctx));
    cr_expect_eq(qkv_safetensors_count(st), 7);
    static const char *sorted[] = {"empty", "ids", "layer.0/wk", "mask", "step", "wq", "\xc3\xbc-odd"};
    for (int i = 0; i < 7; i++) cr_expect_str_eq(qkv_safetensors_name(st, i), sorted[i]);
    cr_expect_null(qkv_safetensors_name(st, 7));
    cr_expect_null(qkv_safetensors_name(st, -1));
    int differ = 0;
    for (int i = 0; i < 7; i++) {
        const qkv_tensor *t = qkv_safetensors_get(st, tensors[i].name);
        if (!same_tensor(t, tensors[i].tensor)) differ++;
        if (t && (t->requires_grad || (uintptr_t)t->data % 64 != 0)) differ++;
    }
    cr_expect_eq(differ, 0, "%d tensors differ after the round trip", differ);
    cr_expect_null(qkv_safetensors_get(st, "wv"));
    cr_expect_null(qkv_safetensors_get(st, "__metadata__"));

    cr_expect_eq(qkv_safetensors_metadata_count(st), 4);
    for (int i = 0; i < 4; i++)
        cr_expect_str_eq(qkv_safetensors_metadata(st, meta[2 * i]), meta[2 * i + 1], "key %s", meta[2 * i]);
    cr_expect_str_eq(qkv_safetensors_metadata_key(st, 0), "config");
    cr_expect_str_eq(qkv_safetensors_metadata_key(st, 3), "step");
    cr_expect_null(qkv_safetensors_metadata_key(st, 4));
    cr_expect_null(qkv_safetensors_metadata(st, "missing"));

    /* the loaded tensors outlive the step */
    qkv_step_end(ctx);
    const qkv_tensor *k = qkv_safetensors_get(st, "layer.0/wk");
    qkv_tensor *copy = qkv_copy(ctx, k);
    cr_expect_not_null(copy, "%s", qkv_errmsg(ctx));
    qkv_safetensors_free(ctx, st);
    cr_expect_eq(qkv_error(ctx), QKV_OK);

    /* the same bytes through load_mem */
    size_t size;
    unsigned char *bytes = read_all(path, &size);
    qkv_safetensors *m = qkv_safetensors_load_mem(ctx, bytes, size);
    cr_expect_not_null(m, "%s", qkv_errmsg(ctx));
    cr_expect_eq(qkv_safetensors_count(m), 7);
    /* layout: header padded to a multiple of 8, tensors ordered by element size so each is aligned */
    uint64_t n = qkv_le64_(bytes);
    cr_expect_eq(n % 8, 0);
    const char *hdr = (const char *)bytes + 8;
    const char *p_f64 = strstr(hdr, "\"F64\""), *p_f32 = strstr(hdr, "\"F32\""), *p_u8 = strstr(hdr, "\"U8\"");
    cr_expect(p_f64 && p_f32 && p_u8 && p_f64 < p_f32 && p_f32 < p_u8, "F64 entries first, U8 last");
    cr_expect(strstr(hdr, "{\"__metadata__\":{\"config\":"), "metadata first, keys sorted: %.80s", hdr);
    free(bytes);
    qkv_ctx_free(ctx); /* frees m too */
    remove_tmpdir(&d);
}

Test(safetensors, no_tensors_and_no_metadata) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const char *path = in_dir(&d, "empty.safetensors");
    cr_assert_eq(qkv_safetensors_save(ctx, path, NULL, 0, NULL, 0), QKV_OK, "%s", qkv_errmsg(ctx));
    size_t size;
    unsigned char *b = read_all(path, &size);
    /* the reference's bytes for an empty dict with qkv's header checksum as metadata: the CRC-32 of these 56
     * bytes with the digits read as "00000000" (in Python: zlib.crc32(struct.pack('<Q', 48) + json.encode())) */
    size_t want_size;
    unsigned char *want = st_bytes("{\"__metadata__\":{\"qkv.header_crc32\":\"0e57513c\"}}", 0, &want_size);
    cr_expect_eq(size, want_size);
    cr_expect_eq(want_size, 56);
    cr_expect_eq(memcmp(b, want, want_size), 0, "%.*s", (int)size - 8, b + 8);
    free(want);
    free(b);
    qkv_safetensors *st = qkv_safetensors_load(ctx, path);
    cr_assert_not_null(st, "%s", qkv_errmsg(ctx));
    cr_expect_eq(qkv_safetensors_count(st), 0);
    cr_expect_eq(qkv_safetensors_metadata_count(st), 0);
    cr_expect_null(qkv_safetensors_get(st, "x"));
    qkv_safetensors_free(ctx, st);
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

/* The serializer of the reference implementation writes these bytes for one F32 tensor of 0..5 and
 * the metadata qkv adds, {"qkv.crc32.<name>": "%08x" of zlib.crc32(the tensor's 24 bytes), "qkv.header_crc32":
 * "%08x" of zlib.crc32(the 8-byte size + the padded header with these digits as "00000000")}: metadata first,
 * the header padded with spaces to a multiple of 8. The digits were computed in Python, not by qkv. */
Test(safetensors, writes_the_reference_bytes) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    float v[6] = {0, 1, 2, 3, 4, 5};
    struct {
        const char *name, *json;
        int ndim;
        int64_t shape[4];
    } cases[] = {
        {"attn.0",
         "{\"__metadata__\":{\"qkv.crc32.attn.0\":\"91e79017\",\"qkv.header_crc32\":\"27f98f56\"},"
         "\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}   ",
         3,
         {1, 2, 3}},
        {"attn0",
         "{\"__metadata__\":{\"qkv.crc32.attn0\":\"91e79017\",\"qkv.header_crc32\":\"7efeb59d\"},"
         "\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}   ",
         4,
         {1, 1, 2, 3}},
    };
    for (int i = 0; i < 2; i++) {
        qkv_tensor *t = qkv_from_data(ctx, QKV_F32, cases[i].ndim, cases[i].shape, v);
        qkv_named_tensor nt = {cases[i].name, t};
        const char *path = in_dir(&d, "ref.safetensors");
        cr_assert_eq(qkv_safetensors_save(ctx, path, &nt, 1, NULL, 0), QKV_OK, "%s", qkv_errmsg(ctx));
        size_t size, want_size;
        unsigned char *got = read_all(path, &size);
        unsigned char *want = st_bytes(cases[i].json, 0, &want_size);
        cr_expect_eq(size, want_size + sizeof v, "case %d", i);
        cr_expect_eq(memcmp(got, want, want_size), 0, "case %d: %.*s", i, (int)(size - 8), got + 8);
        cr_expect_eq(memcmp(got + want_size, v, sizeof v), 0);
        cr_expect_eq(qkv_le64_(got), 144);
        free(got);
        free(want);
    }
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

Test(safetensors, reads_files_laid_out_by_other_writers) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    /* names not in offset order, a misaligned F64 (after 3 bytes of U8), metadata last, no padding,
     * whitespace and a newline in the JSON, an entry whose keys come in another order */
    const char *json =
        "{ \"b\": {\"data_offsets\": [3, 19], \"shape\": [2], \"dtype\": \"F64\"},\n"
        "  \"a\": {\"dtype\": \"U8\", \"shape\": [3], \"data_offsets\": [0, 3]},\n"
        "  \"z\": {\"dtype\": \"I32\", \"shape\": [], \"data_offsets\": [19, 23]},\n"
        "  \"e\": {\"dtype\": \"F32\", \"shape\": [0, 2], \"data_offsets\": [23, 23]},\n"
        "  \"__metadata__\": {\"format\": \"pt\"} }\n";
    size_t size;
    unsigned char *b = st_bytes(json, 23, &size);
    double f64[2] = {-1.5, 1e100};
    memcpy(b + size - 20, f64, 16);
    int32_t i32 = -123456;
    memcpy(b + size - 4, &i32, 4);
    qkv_safetensors *st = qkv_safetensors_load_mem(ctx, b, size);
    cr_assert_not_null(st, "%s", qkv_errmsg(ctx));
    cr_expect_eq(qkv_safetensors_count(st), 4);
    const qkv_tensor *a = qkv_safetensors_get(st, "a"), *bb = qkv_safetensors_get(st, "b");
    const qkv_tensor *z = qkv_safetensors_get(st, "z"), *e = qkv_safetensors_get(st, "e");
    cr_assert(a && bb && z && e);
    cr_expect(a->dtype == QKV_U8 && a->numel == 3 && qkv_u8(a)[2] == 2);
    cr_expect(bb->dtype == QKV_F64 && qkv_f64(bb)[0] == -1.5 && qkv_f64(bb)[1] == 1e100);
    cr_expect(z->dtype == QKV_I32 && z->ndim == 0 && qkv_i32(z)[0] == -123456);
    cr_expect(e->ndim == 2 && e->shape[0] == 0 && e->shape[1] == 2 && e->numel == 0);
    cr_expect_str_eq(qkv_safetensors_metadata(st, "format"), "pt");
    free(b);
    qkv_ctx_free(ctx);
}

/* ---- malformed files ----------------------------------------------------------------------------- */

typedef struct bad_file {
    const char *what;
    const char *json; /* NULL: use raw */
    size_t data_len;
    const char *raw;
    size_t raw_len;
    const char *fragment;
} bad_file;

/* "name":{"dtype":"F32","shape":[2],"data_offsets":[0,8]} */
#define E(name, dtype, shape, b, e) \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static const bad_file bad_files[] = {
    {"empty", NULL, 0, "", 0, "too short for the 8-byte header size"},
    {"five bytes", NULL, 0, "\x02\x00\x00\x00\x00", 5, "too short"},
    {"header over the cap", NULL, 0, "\x01\xe1\xf5\x05\x00\x00\x00\x00{}", 10, "over the 100000000-byte limit"},
    {"header size 2^64-1", NULL, 0, "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10, "over the 100000000-byte limit"},
    {"header past the end", NULL, 0, "\x40\x00\x00\x00\x00\x00\x00\x00{}", 10, "runs past the end"},
    {"header size 0", NULL, 0, "\x00\x00\x00\x00\x00\x00\x00\x00", 8, "does not start with '{'"},
    {"header is an array", "[]", 0, NULL, 0, "does not start with '{'"},
    {"byte-order mark", "\xef\xbb\xbf{}", 0, NULL, 0, "does not start with '{'"},
    {"not UTF-8", "{\"\xff\":1}", 0, NULL, 0, "not valid UTF-8"},
    {"overlong UTF-8", "{\"\xc0\xaf\":1}", 0, NULL, 0, "not valid UTF-8"},
    {"invalid JSON", "{\"a\":", 0, NULL, 0, "not valid JSON"},
    {"unquoted key", "{a:1}", 0, NULL, 0, "not valid JSON"},
    {"text after the object", "{} x", 0, NULL, 0, "text after its JSON object"},
    {"two objects", "{}{}", 0, NULL, 0, "text after its JSON object"},
    {"NUL inside", "{}\0  ", 0, NULL, 0, "the control byte 0x00"},
    {"entry not an object", "{\"a\":1}", 0, NULL, 0, "entry 'a' is not an object"},
    {"missing dtype", "{\"a\":{\"shape\":[],\"data_offsets\":[0,4]}}", 4, NULL, 0, "entry 'a' has no 'dtype'"},
    {"missing shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, NULL, 0, "has no 'shape'"},
    {"missing offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[]}}", 4, NULL, 0, "has no 'data_offsets'"},
    {"unknown key", "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"foo\":1}}", 4, NULL, 0,
     "unexpected key 'foo'"},
    {"key twice in an entry",
     "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, NULL, 0,
     "the key 'dtype' twice"},
    {"dtype not a string", "{\"a\":{\"dtype\":4,\"shape\":[],\"data_offsets\":[0,4]}}", 4, NULL, 0,
     "dtype is not a string"},
    {"dtype BF16", "{" E("a", "BF16", "[2]", 0, 4) "}", 4, NULL, 0, "dtype \"BF16\" is not one qkv reads"},
    {"dtype lower case", "{" E("a", "f32", "[1]", 0, 4) "}", 4, NULL, 0, "\"f32\" is not one qkv reads"},
    {"dtype F16", "{" E("a", "F16", "[2]", 0, 4) "}", 4, NULL, 0,
     "entry 'a': dtype \"F16\" is not one qkv reads (F32, F64, I32, U8, and I64 and BOOL where they convert "
     "exactly); convert before saving: t.to(torch.float32) in PyTorch, a.astype(np.float32) in NumPy (exact)"},
    {"dtype I16", "{" E("a", "I16", "[2]", 0, 4) "}", 4, NULL, 0, "t.to(torch.int32) in PyTorch"},
    {"dtype U32", "{" E("a", "U32", "[2]", 0, 8) "}", 8, NULL, 0, "(exact while every value < 2**31)"},
    {"dtype i64 lower case", "{" E("a", "i64", "[1]", 0, 8) "}", 8, NULL, 0, "\"i64\" is not one qkv reads"},
    {"I64 range of I32 size", "{" E("ids", "I64", "[2]", 0, 8) "}", 8, NULL, 0,
     "entry 'ids': shape [2] of I64 needs 16 bytes, data_offsets [0, 8] hold 8"},
    {"BOOL range too long", "{" E("m", "BOOL", "[2]", 0, 3) "}", 3, NULL, 0,
     "entry 'm': shape [2] of BOOL needs 2 bytes"},
    {"I64 value over int32", "{" E("ids", "I64", "[2]", 0, 16) "}", 16, NULL, 0,
     "entry 'ids' (I64 [2]): element 0 is 506097522914230528, which does not fit in int32 (qkv loads I64 as "
     "I32 only when every value fits); bring the values into range, then save t.to(torch.int32) in PyTorch "
     "or ids.astype(np.int32) in NumPy"},
    {"BOOL byte 2", "{" E("m", "BOOL", "[2,2]", 0, 4) "}", 4, NULL, 0,
     "entry 'm' (BOOL [2,2]): element 2 is the byte 2, not 0 (false) or 1 (true)"},
    {"shape not an array", "{" E("a", "F32", "4", 0, 4) "}", 4, NULL, 0, "shape is not an array"},
    {"negative dimension", "{" E("a", "F32", "[-1]", 0, 4) "}", 4, NULL, 0,
     "shape element 0 is not an integer"},
    {"fractional dimension", "{" E("a", "F32", "[2,1.5]", 0, 12) "}", 12, NULL, 0, "shape element 1"},
    {"dimension a string", "{" E("a", "F32", "[\"2\"]", 0, 8) "}", 8, NULL, 0, "shape element 0"},
    {"huge dimension", "{" E("a", "U8", "[1e300]", 0, 8) "}", 8, NULL, 0, "not an integer in [0, 2^53]"},
    {"5 dimensions", "{" E("a", "F32", "[1,1,1,1,1]", 0, 4) "}", 4, NULL, 0, "5 dimensions"},
    {"offsets of one number", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", 4, NULL, 0,
     "data_offsets is not two integers"},
    {"offsets of three", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4, NULL, 0,
     "data_offsets is not two integers"},
    {"no data", "{" E("a", "F32", "[1]", 0, 4) "}", 0, NULL, 0, "holds 0 (truncated)"},
    {"offsets not numbers", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0-4\"}}", 4, NULL, 0,
     "data_offsets is not two integers"},
    {"negative offset", "{" E("a", "F32", "[1]", -4, 0) "}", 4, NULL, 0, "data_offsets is not two integers"},
    {"offsets backwards", "{" E("a", "F32", "[1]", 8, 4) "}", 8, NULL, 0, "run backwards"},
    {"not starting at 0", "{" E("a", "F32", "[1]", 4, 8) "}", 8, NULL, 0,
     "starts at data byte 4 where byte 0 was expected (gap)"},
    {"gap between tensors", "{" E("a", "F32", "[1]", 0, 4) "," E("b", "F32", "[1]", 8, 12) "}", 12, NULL, 0,
     "entry 'b' starts at data byte 8 where byte 4 was expected (gap)"},
    {"overlap", "{" E("a", "F32", "[2]", 0, 8) "," E("b", "F32", "[2]", 4, 12) "}", 12, NULL, 0, "(overlap)"},
    {"same range twice", "{" E("a", "F32", "[2]", 0, 8) "," E("b", "F32", "[2]", 0, 8) "}", 8, NULL, 0,
     "(overlap)"},
    {"range bigger than shape", "{" E("a", "F32", "[2]", 0, 12) "}", 12, NULL, 0,
     "shape [2] of F32 needs 8 bytes, data_offsets [0, 12] hold 12"},
    {"range smaller than shape", "{" E("a", "F64", "[2,2]", 0, 16) "}", 16, NULL, 0, "needs 32 bytes"},
    {"trailing bytes", "{" E("a", "F32", "[1]", 0, 4) "}", 9, NULL, 0,
     "cover 4 data bytes but the buffer holds 9 (trailing bytes)"},
    {"data cut short", "{" E("a", "F32", "[4]", 0, 16) "}", 15, NULL, 0,
     "cover 16 data bytes but the buffer holds 15 (truncated)"},
    {"data but no tensors", "{}", 1, NULL, 0, "trailing bytes"},
    {"shape overflow", "{" E("a", "F64", "[4294967296,4294967296,4294967296]", 0, 8) "}", 8, NULL, 0,
     "overflows"},
    {"duplicate names", "{" E("w", "F32", "[1]", 0, 4) "," E("w", "F32", "[1]", 4, 8) "}", 8, NULL, 0,
     "the tensor name 'w' appears twice"},
    {"metadata not an object", "{\"__metadata__\":[\"a\",\"b\"]}", 0, NULL, 0, "__metadata__ is not an object"},
    {"metadata value a number", "{\"__metadata__\":{\"step\":12}}", 0, NULL, 0,
     "__metadata__ value of 'step' is not a string"},
    {"metadata value null", "{\"__metadata__\":{\"x\":null}}", 0, NULL, 0, "value of 'x' is not a string"},
    {"metadata key twice", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, NULL, 0, "the key 'k' twice"},
    {"metadata twice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, NULL, 0, "__metadata__ twice"},
};

Test(safetensors, malformed_files_are_refused_with_a_reason) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    size_t n_cases = sizeof bad_files / sizeof bad_files[0];
    cr_assert_geq(n_cases, 15);
    int failures = 0;
    for (size_t i = 0; i < n_cases; i++) {
        const bad_file *c = &bad_files[i];
        size_t size;
        unsigned char *b;
        if (c->json) {
            if (strcmp(c->what, "NUL inside") == 0) { /* a JSON text with an embedded NUL */
                b = st_bytes("{}   ", c->data_len, &size);
                b[10] = '\0';
            } else {
                b = st_bytes(c->json, c->data_len, &size);
            }
        } else {
            size = c->raw_len;
            b = malloc(size + 1);
            memcpy(b, c->raw, size);
        }
        qkv_safetensors *st = qkv_safetensors_load_mem(ctx, b, size);
        const char *msg = qkv_errmsg(ctx);
        if (st || qkv_error(ctx) != QKV_ERR_FORMAT || !strstr(msg, c->fragment) ||
            !strstr(msg, "qkv_safetensors_load_mem: buffer: ")) {
            failures++;
            cr_log_error("case '%s': got %s \"%s\", wanted QKV_ERR_FORMAT with \"%s\"", c->what,
                         qkv_status_name(qkv_error(ctx)), msg, c->fragment);
        }
        qkv_clear_error(ctx);
        free(b);
    }
    cr_expect_eq(failures, 0, "%d of %zu malformed files not refused as expected", failures, n_cases);
    qkv_ctx_free(ctx);
}

/* ---- I64 and BOOL (PyTorch's long and bool, NumPy's int64 and bool) ------------------------------ */

/* ids I64 [2,3] (both int32 limits), then m BOOL [3] at data byte 48, then w F32 [2] at the unaligned
 * byte 51, then k I64 [1] at byte 59: the tensors a PyTorch user's checkpoint holds. */
static unsigned char *i64_bool_file(const int64_t ids[6], const uint8_t m[3], size_t *size) {
    const char *json = "{" E("ids", "I64", "[2,3]", 0, 48) "," E("m", "BOOL", "[3]", 48, 51) ","
                       E("w", "F32", "[2]", 51, 59) "," E("k", "I64", "[]", 59, 67) "}";
    unsigned char *b = st_bytes(json, 67, size), *data = b + 8 + strlen(json);
    for (int i = 0; i < 6; i++) qkv_put_le64_(data + 8 * i, (uint64_t)ids[i]);
    memcpy(data + 48, m, 3);
    const float w[2] = {0.5f, -2.25f};
    memcpy(data + 51, w, sizeof w);
    qkv_put_le64_(data + 59, (uint64_t)(int64_t)-3);
    return b;
}

Test(safetensors, i64_loads_as_i32_and_bool_as_u8_when_exact) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const int64_t ids[6] = {INT32_MIN, -1, 0, 1, 50257, INT32_MAX};
    const uint8_t m[3] = {1, 0, 1};
    size_t size;
    unsigned char *b = i64_bool_file(ids, m, &size);
    qkv_safetensors *st = qkv_safetensors_load_mem(ctx, b, size);
    free(b); /* the handle holds copies */
    cr_assert_not_null(st, "%s", qkv_errmsg(ctx));
    cr_assert_eq(qkv_safetensors_count(st), 4);
    const qkv_tensor *t = qkv_safetensors_get(st, "ids");
    cr_assert(t && t->dtype == QKV_I32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3);
    for (int i = 0; i < 6; i++) cr_expect_eq(qkv_i32(t)[i], (int32_t)ids[i], "ids[%d]", i);
    t = qkv_safetensors_get(st, "m");
    cr_assert(t && t->dtype == QKV_U8 && t->ndim == 1 && t->shape[0] == 3);
    cr_expect_arr_eq(qkv_u8(t), m, 3);
    t = qkv_safetensors_get(st, "w");
    cr_assert(t && t->dtype == QKV_F32);
    cr_expect(qkv_f32(t)[0] == 0.5f && qkv_f32(t)[1] == -2.25f);
    t = qkv_safetensors_get(st, "k");
    cr_assert(t && t->dtype == QKV_I32 && t->ndim == 0);
    cr_expect_eq(qkv_i32(t)[0], -3);
    /* an I64 entry fills an i32 tensor; a u8 mask takes a BOOL entry */
    qkv_tensor *dst = qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){2, 3});
    cr_assert_eq(qkv_safetensors_copy_into(ctx, st, "ids", dst), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect_eq(qkv_i32(dst)[5], INT32_MAX);
    qkv_safetensors_free(ctx, st);
    qkv_ctx_free(ctx);
}

Test(safetensors, i64_or_bool_that_does_not_convert_is_refused_naming_the_path) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    struct {
        int64_t ids[6];
        uint8_t m[3];
        const char *fragment;
    } cases[] = {
        {{0, 1, 2, 3, (int64_t)INT32_MAX + 1, 0}, {0, 1, 1},
         "entry 'ids' (I64 [2,3]): element 4 is 2147483648, which does not fit in int32"},
        {{0, (int64_t)INT32_MIN - 1, 2, 3, 4, 5}, {0, 1, 1}, "element 1 is -2147483649,"},
        {{0, 1, 2, 3, 4, INT64_MIN}, {0, 1, 1}, "element 5 is -9223372036854775808,"},
        {{0, 1, 2, 3, 4, 5}, {0, 1, 128}, "entry 'm' (BOOL [3]): element 2 is the byte 128, not 0"},
    };
    const char *path = in_dir(&d, "bad.safetensors");
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t size;
        unsigned char *b = i64_bool_file(cases[k].ids, cases[k].m, &size);
        FILE *f = fopen(path, "wb");
        cr_assert_eq(fwrite(b, 1, size, f), size);
        fclose(f);
        free(b);
        cr_expect_null(qkv_safetensors_load(ctx, path), "case %zu", k);
        cr_expect_eq(qkv_error(ctx), QKV_ERR_FORMAT, "case %zu", k);
        char want[160];
        snprintf(want, sizeof want, "qkv_safetensors_load: %s: ", path);
        cr_expect(strstr(qkv_errmsg(ctx), want) == qkv_errmsg(ctx), "case %zu: %s", k, qkv_errmsg(ctx));
        cr_expect(strstr(qkv_errmsg(ctx), cases[k].fragment) != NULL, "case %zu: %s", k, qkv_errmsg(ctx));
        qkv_clear_error(ctx);
    }
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

Test(safetensors, every_truncation_is_refused_and_corruption_never_crashes) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = qkv_zeros(ctx, QKV_F32, 2, (int64_t[]){2, 3});
    qkv_tensor *b = qkv_zeros(ctx, QKV_U8, 1, (int64_t[]){5});
    fill_pattern(a, 0);
    fill_pattern(b, 0);
    qkv_named_tensor nt[] = {{"a", a}, {"b", b}};
    const char *meta[] = {"k", "v"};
    const char *path = in_dir(&d, "t.safetensors");
    cr_assert_eq(qkv_safetensors_save(ctx, path, nt, 2, meta, 1), QKV_OK, "%s", qkv_errmsg(ctx));
    size_t size;
    unsigned char *good = read_all(path, &size);
    int wrong = 0;
    for (size_t len = 0; len < size; len++) {
        unsigned char *cut = malloc(len + 1);
        memcpy(cut, good, len);
        if (qkv_safetensors_load_mem(ctx, cut, len) || qkv_error(ctx) != QKV_ERR_FORMAT) wrong++;
        qkv_clear_error(ctx);
        free(cut);
    }
    cr_expect_eq(wrong, 0, "%d truncations were not refused as QKV_ERR_FORMAT", wrong);
    static const unsigned char subst[] = {0, ' ', '"', ',', ':', '[', ']', '{', '}', '0', '9', '-', 0xc3, 0xff};
    int other = 0, refused = 0;
    size_t header_end = 8 + (size_t)qkv_le64_(good);
    for (size_t pos = 0; pos < header_end; pos++) {
        for (size_t k = 0; k < sizeof subst; k++) {
            unsigned char *m = malloc(size);
            memcpy(m, good, size);
            m[pos] = subst[k];
            qkv_safetensors *st = qkv_safetensors_load_mem(ctx, m, size);
            if (!st && qkv_error(ctx) != QKV_ERR_FORMAT) other++;
            if (!st) refused++;
            qkv_safetensors_free(ctx, st);
            qkv_clear_error(ctx);
            free(m);
        }
    }
    cr_expect_eq(other, 0);
    cr_expect_gt(refused, (int)(header_end * sizeof subst / 2), "most corruptions are caught (%d)", refused);
    free(good);
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

Test(safetensors, file_errors_name_the_path) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const char *missing = in_dir(&d, "none.safetensors");
    cr_expect_null(qkv_safetensors_load(ctx, missing));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_IO);
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_safetensors_load: ") && strstr(qkv_errmsg(ctx), missing) &&
                  strstr(qkv_errmsg(ctx), strerror(ENOENT)),
              "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    FILE *f = fopen(in_dir(&d, "bad.safetensors"), "wb");
    fwrite("\x02\x00\x00\x00\x00\x00\x00\x00{]", 1, 10, f);
    fclose(f);
    cr_expect_null(qkv_safetensors_load(ctx, in_dir(&d, "bad.safetensors")));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_FORMAT);
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_safetensors_load: ") &&
                  strstr(qkv_errmsg(ctx), "bad.safetensors: ") && strstr(qkv_errmsg(ctx), "not valid JSON"),
              "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    qkv_tensor *t = qkv_ones(ctx, QKV_F32, 1, (int64_t[]){2});
    qkv_named_tensor nt = {"t", t};
    const char *nodir = in_dir(&d, "missing/dir/x.safetensors");
    cr_expect_eq(qkv_safetensors_save(ctx, nodir, &nt, 1, NULL, 0), QKV_ERR_IO);
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_safetensors_save: ") && strstr(qkv_errmsg(ctx), nodir),
              "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

/* ---- argument checks ----------------------------------------------------------------------------- */

Test(safetensors, save_argument_errors) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const char *path = in_dir(&d, "x.safetensors");
    qkv_tensor *t = qkv_ones(ctx, QKV_F32, 1, (int64_t[]){2});
    qkv_tensor *u = qkv_ones(ctx, QKV_U8, 1, (int64_t[]){2});
    qkv_named_tensor two_same[] = {{"w", t}, {"w", u}};
    qkv_named_tensor null_name[] = {{"a", t}, {NULL, u}};
    qkv_named_tensor empty_name[] = {{"", t}};
    qkv_named_tensor reserved[] = {{"__metadata__", t}};
    qkv_named_tensor bad_utf8[] = {{"w\xff", t}};
    qkv_named_tensor null_tensor[] = {{"a", t}, {"b", NULL}};
    qkv_named_tensor ok[] = {{"a", t}};
    const char *meta_dup[] = {"k", "1", "k", "2"};
    const char *meta_null[] = {"k", NULL};
    const char *meta_bad[] = {"k", "\xe2\x82"};
    struct {
        const char *what;
        const char *path;
        const qkv_named_tensor *tensors;
        int n;
        const char *const *meta;
        int n_meta;
        qkv_status status;
        const char *fragment;
    } cases[] = {
        {"NULL path", NULL, ok, 1, NULL, 0, QKV_ERR_NULL, "qkv_safetensors_save: path is NULL"},
        {"negative n", path, ok, -1, NULL, 0, QKV_ERR_ARG, "n = -1"},
        {"negative n_metadata", path, ok, 1, NULL, -2, QKV_ERR_ARG, "n_metadata = -2"},
        {"NULL tensors", path, NULL, 2, NULL, 0, QKV_ERR_NULL, "tensors is NULL but n = 2"},
        {"NULL metadata", path, ok, 1, NULL, 1, QKV_ERR_NULL, "metadata is NULL but n_metadata = 1"},
        {"duplicate names", path, two_same, 2, NULL, 0, QKV_ERR_ARG, "the name 'w' is given to two tensors"},
        {"NULL name", path, null_name, 2, NULL, 0, QKV_ERR_NULL, "tensors[1].name is NULL"},
        {"empty name", path, empty_name, 1, NULL, 0, QKV_ERR_ARG, "tensors[0].name is empty"},
        {"reserved name", path, reserved, 1, NULL, 0, QKV_ERR_ARG, "reserves"},
        {"name not UTF-8", path, bad_utf8, 1, NULL, 0, QKV_ERR_ARG, "tensors[0].name is not valid UTF-8"},
        {"NULL tensor", path, null_tensor, 2, NULL, 0, QKV_ERR_NULL, "tensors[1].tensor is NULL"},
        {"metadata key twice", path, ok, 1, meta_dup, 2, QKV_ERR_ARG, "the metadata key 'k' is given twice"},
        {"metadata value NULL", path, ok, 1, meta_null, 1, QKV_ERR_NULL, "metadata value 0 is NULL"},
        {"metadata not UTF-8", path, ok, 1, meta_bad, 1, QKV_ERR_ARG, "metadata pair 0 is not valid UTF-8"},
    };
    int failures = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qkv_status s = qkv_safetensors_save(ctx, cases[i].path, cases[i].tensors, cases[i].n, cases[i].meta,
                                            cases[i].n_meta);
        if (s != cases[i].status || qkv_error(ctx) != s || !strstr(qkv_errmsg(ctx), cases[i].fragment)) {
            failures++;
            cr_log_error("case '%s': got %s \"%s\"", cases[i].what, qkv_status_name(s), qkv_errmsg(ctx));
        }
        qkv_clear_error(ctx);
    }
    cr_expect_eq(failures, 0);
    cr_expect_eq(access(path, F_OK), -1, "no refused save wrote a file");
    cr_expect_eq(count_tmp_files(&d), 0);
    /* a stale tensor, and the sticky error */
    qkv_step_end(ctx);
    cr_expect_eq(qkv_safetensors_save(ctx, path, ok, 1, NULL, 0), QKV_ERR_STALE);
    cr_expect(strstr(qkv_errmsg(ctx), "tensors[0].tensor"), "%s", qkv_errmsg(ctx));
    cr_expect_eq(qkv_safetensors_save(ctx, path, NULL, 0, NULL, 0), QKV_ERR_STALE);
    cr_expect_null(qkv_safetensors_load(ctx, path));
    cr_expect_eq(access(path, F_OK), -1);
    cr_expect_eq(qkv_safetensors_save(NULL, path, NULL, 0, NULL, 0), QKV_ERR_NULL);
    cr_expect_null(qkv_safetensors_load(NULL, path));
    cr_expect_null(qkv_safetensors_load_mem(NULL, "", 0));
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

Test(safetensors, queries_and_copy_into) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const char *json = "{" E("w", "F64", "[2,2]", 0, 32) "," E("m", "U8", "[3]", 32, 35) "}";
    size_t size;
    unsigned char *b = st_bytes(json, 35, &size);
    double w[4] = {1.0, -2.0, 0.5, 4.0};
    memcpy(b + size - 35, w, sizeof w);
    qkv_safetensors *st = qkv_safetensors_load_mem(ctx, b, size);
    free(b);
    cr_assert_not_null(st, "%s", qkv_errmsg(ctx));

    qkv_tensor *param = qkv_param(ctx, qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){2, 2}));
    cr_expect_eq(qkv_safetensors_copy_into(ctx, st, "w", param), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect_eq(memcmp(param->data, w, sizeof w), 0);
    cr_expect(param->requires_grad, "copying keeps dst a parameter");

    qkv_tensor *wrong_shape = qkv_zeros(ctx, QKV_F64, 1, (int64_t[]){4});
    qkv_tensor *wrong_dtype = qkv_zeros(ctx, QKV_F32, 2, (int64_t[]){2, 2});
    struct {
        const char *name;
        qkv_tensor *dst;
        qkv_status status;
        const char *fragment;
    } cases[] = {
        {"wv", param, QKV_ERR_ARG, "the checkpoint has no tensor named 'wv'"},
        {"w", wrong_shape, QKV_ERR_SHAPE, "'w' is [2,2] in the checkpoint, dst is [4]"},
        {"w", wrong_dtype, QKV_ERR_DTYPE, "'w' is f64 [2,2] in the checkpoint, dst [2,2] is f32"},
        {NULL, param, QKV_ERR_NULL, "name is NULL"},
        {"w", NULL, QKV_ERR_NULL, "dst is NULL"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qkv_status s = qkv_safetensors_copy_into(ctx, st, cases[i].name, cases[i].dst);
        cr_expect_eq(s, cases[i].status, "case %zu", i);
        cr_expect(strstr(qkv_errmsg(ctx), cases[i].fragment), "case %zu: %s", i, qkv_errmsg(ctx));
        qkv_clear_error(ctx);
    }
    cr_expect_eq(qkv_safetensors_copy_into(ctx, NULL, "w", param), QKV_ERR_NULL);
    qkv_clear_error(ctx);

    /* NULL handles are harmless in the queries */
    cr_expect_eq(qkv_safetensors_count(NULL), 0);
    cr_expect_null(qkv_safetensors_name(NULL, 0));
    cr_expect_null(qkv_safetensors_get(NULL, "w"));
    cr_expect_null(qkv_safetensors_get(st, NULL));
    cr_expect_eq(qkv_safetensors_metadata_count(st), 0);
    cr_expect_null(qkv_safetensors_metadata(NULL, "k"));
    qkv_safetensors_free(ctx, NULL);
    qkv_safetensors_free(ctx, st);
    cr_expect_eq(qkv_error(ctx), QKV_OK);
    cr_expect_null(qkv_safetensors_load_mem(ctx, NULL, 8));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_NULL);
    qkv_ctx_free(ctx);
}

/* ---- injected failures --------------------------------------------------------------------------- */

static int write_calls, fsync_calls, fail_write_at, fail_fsync_at, fail_rename;

static ssize_t test_write(int fd, const void *buf, size_t count) {
    if (++write_calls == fail_write_at) {
        errno = EDQUOT;
        return -1;
    }
    return write(fd, buf, count);
}

static int test_fsync(int fd) {
    if (fail_fsync_at && ++fsync_calls == fail_fsync_at) {
        errno = EIO;
        return -1;
    }
    return fsync(fd);
}

static int test_rename(const char *from, const char *to) {
    if (fail_rename) {
        errno = EACCES;
        return -1;
    }
    return rename(from, to);
}

Test(safetensors, injected_failures_keep_the_old_checkpoint) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const char *path = in_dir(&d, "model.safetensors");
    qkv_tensor *w1 = qkv_zeros(ctx, QKV_F32, 2, (int64_t[]){4, 4});
    qkv_tensor *w2 = qkv_zeros(ctx, QKV_F64, 1, (int64_t[]){9});
    fill_pattern(w1, 0);
    fill_pattern(w2, 0);
    qkv_named_tensor old[] = {{"wq", w1}, {"wk", w2}};
    const char *old_meta[] = {"step", "100"};
    cr_assert_eq(qkv_safetensors_save(ctx, path, old, 2, old_meta, 1), QKV_OK, "%s", qkv_errmsg(ctx));

    qkv_tensor *n1 = qkv_full(ctx, QKV_F32, 2, (int64_t[]){4, 4}, 7.0);
    qkv_tensor *n2 = qkv_full(ctx, QKV_F64, 1, (int64_t[]){9}, -7.0);
    qkv_named_tensor next[] = {{"wq", n1}, {"wk", n2}};
    const char *new_meta[] = {"step", "200"};
    /* count the writes a save makes (size prefix, JSON, padding if any, each tensor) */
    write_calls = fsync_calls = fail_write_at = fail_fsync_at = fail_rename = 0;
    qkv_fileio_set_hooks_(&(qkv_fileio_hooks_){test_write, test_fsync, test_rename});
    cr_assert_eq(qkv_safetensors_save(ctx, in_dir(&d, "count.safetensors"), next, 2, new_meta, 1), QKV_OK);
    qkv_fileio_set_hooks_(NULL);
    int n_writes = write_calls;
    cr_expect_geq(n_writes, 4);
    /* fail each write in turn, then the fsync, then the rename */
    typedef struct fault {
        int write_at, fsync_at, rename;
        const char *fragment;
    } fault;
    fault faults[16];
    int n_faults = 0;
    for (int k = 1; k <= n_writes && k < 14; k++)
        faults[n_faults++] = (fault){k, 0, 0, "write failed: Disk quota exceeded"};
    faults[n_faults++] = (fault){0, 1, 0, "fsync of the temporary file failed: Input/output error"};
    faults[n_faults++] =
        (fault){0, 0, 1, "rename of the temporary file over the target failed: Permission denied"};
    int failures = 0;
    for (int i = 0; i < n_faults; i++) {
        write_calls = fsync_calls = 0;
        fail_write_at = faults[i].write_at;
        fail_fsync_at = faults[i].fsync_at;
        fail_rename = faults[i].rename;
        qkv_fileio_set_hooks_(&(qkv_fileio_hooks_){test_write, test_fsync, test_rename});
        qkv_status s = qkv_safetensors_save(ctx, path, next, 2, new_meta, 1);
        qkv_fileio_set_hooks_(NULL);
        if (s != QKV_ERR_IO || !strstr(qkv_errmsg(ctx), faults[i].fragment) || !strstr(qkv_errmsg(ctx), path)) {
            failures++;
            cr_log_error("fault %d: %s \"%s\"", i, qkv_status_name(s), qkv_errmsg(ctx));
        }
        qkv_clear_error(ctx);
        qkv_safetensors *st = qkv_safetensors_load(ctx, path);
        if (!st || !same_tensor(qkv_safetensors_get(st, "wq"), w1) ||
            !same_tensor(qkv_safetensors_get(st, "wk"), w2) ||
            strcmp(qkv_safetensors_metadata(st, "step"), "100") != 0) {
            failures++;
            cr_log_error("fault %d: the old checkpoint did not survive (%s)", i, qkv_errmsg(ctx));
        }
        qkv_safetensors_free(ctx, st);
        if (count_tmp_files(&d) != 0) {
            failures++;
            cr_log_error("fault %d left a temporary file", i);
        }
    }
    cr_expect_eq(failures, 0);
    /* with no fault the new checkpoint replaces the old */
    cr_assert_eq(qkv_safetensors_save(ctx, path, next, 2, new_meta, 1), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_safetensors *st = qkv_safetensors_load(ctx, path);
    cr_expect(st && same_tensor(qkv_safetensors_get(st, "wq"), n1));
    cr_expect_str_eq(qkv_safetensors_metadata(st, "step"), "200");
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

/* ---- allocation failures ------------------------------------------------------------------------- */

Test(safetensors, every_allocation_failure_is_reported_and_leaks_nothing) {
    tmpdir d = make_tmpdir();
    const char *path = in_dir(&d, "alloc.safetensors");
    {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *a = qkv_ones(ctx, QKV_F32, 2, (int64_t[]){3, 3});
        qkv_tensor *b = qkv_ones(ctx, QKV_I32, 1, (int64_t[]){4});
        qkv_named_tensor nt[] = {{"a", a}, {"b", b}};
        const char *meta[] = {"k", "v"};
        cr_assert_eq(qkv_safetensors_save(ctx, path, nt, 2, meta, 1), QKV_OK);
        qkv_ctx_free(ctx);
    }
    int nomem = 0, succeeded_at = 0, leaks = 0;
    for (long k = 1; k < 100 && !succeeded_at; k++) {
        counting c = {0};
        qkv_options o = qkv_default_options();
        o.allocator = counting_allocator(&c);
        qkv_ctx *ctx = qkv_ctx_new(&o);
        long live_before = c.live;
        c.fail_at = c.calls + k; /* the k-th allocation after the context's own */
        qkv_safetensors *st = qkv_safetensors_load(ctx, path);
        if (st) {
            succeeded_at = (int)k;
            cr_expect_eq(qkv_safetensors_count(st), 2);
            cr_expect_str_eq(qkv_safetensors_metadata(st, "k"), "v");
            qkv_safetensors_free(ctx, st);
        } else if (qkv_error(ctx) == QKV_ERR_NOMEM) {
            nomem++;
        } else {
            cr_log_error("allocation %ld: %s %s", k, qkv_status_name(qkv_error(ctx)), qkv_errmsg(ctx));
        }
        if (c.live != live_before) {
            leaks++;
            cr_log_error("allocation %ld failing: %ld blocks still live", k, c.live - live_before);
        }
        qkv_ctx_free(ctx);
        if (c.live != 0) leaks++;
    }
    cr_expect_gt(succeeded_at, 1);
    cr_expect_eq(nomem, succeeded_at - 1, "every failing allocation before success is QKV_ERR_NOMEM");
    cr_expect_eq(leaks, 0);

    /* saving: the name arrays come from the context's allocator too */
    int save_nomem = 0, saved_at = 0;
    for (long k = 1; k < 20 && !saved_at; k++) {
        counting c = {0};
        qkv_options o = qkv_default_options();
        o.allocator = counting_allocator(&c);
        qkv_ctx *ctx = qkv_ctx_new(&o);
        qkv_tensor *a = qkv_ones(ctx, QKV_F32, 1, (int64_t[]){3});
        qkv_named_tensor nt[] = {{"a", a}};
        const char *meta[] = {"k", "v"};
        long live_before = c.live;
        c.fail_at = c.calls + k;
        qkv_status s = qkv_safetensors_save(ctx, path, nt, 1, meta, 1);
        if (s == QKV_OK) saved_at = (int)k;
        else if (s == QKV_ERR_NOMEM) save_nomem++;
        else cr_log_error("save, allocation %ld: %s", k, qkv_errmsg(ctx));
        cr_expect_eq(c.live, live_before, "save with allocation %ld failing leaks", k);
        qkv_ctx_free(ctx);
    }
    cr_expect_gt(saved_at, 1);
    cr_expect_eq(save_nomem, saved_at - 1);
    remove_tmpdir(&d);
}
