/*
 * test_npy.c — .npy save and load: round trips in every dtype and rank, bytes laid out as NumPy lays
 * them out (built by hand here), a table of malformed inputs each refused with its code and message,
 * and the atomic writer: injected write / fsync / rename failures leave the previous file intact
 * and no temporary file behind.
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

static tmpdir make_tmpdir(void) { return make_tmpdir_tagged("npy"); }

/* A .npy file as NumPy would write it: magic, version, header length, the dict padded with spaces
 * and '\n' to a multiple of align, then the data. Version 1 uses a 2-byte length, 2 and 3 a 4-byte. */
static unsigned char *npy_bytes(int major, const char *dict, size_t align, const void *data, size_t ndata,
                                size_t *size) {
    size_t prefix = major == 1 ? 10 : 12, len = strlen(dict);
    size_t total = prefix + len + 1;
    total += (align - total % align) % align;
    size_t hlen = total - prefix;
    unsigned char *b = malloc(total + ndata + 1);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major;
    b[7] = 0;
    for (size_t i = 0; i < prefix - 8; i++) b[8 + i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + prefix, dict, len);
    memset(b + prefix + len, ' ', hlen - len - 1);
    b[total - 1] = '\n';
    if (ndata) memcpy(b + total, data, ndata);
    *size = total + ndata;
    return b;
}

/* Fill t with values that differ per element and per dtype. */
static void fill_pattern(qkv_tensor *t) {
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

static bool same_tensor(const qkv_tensor *a, const qkv_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->numel != b->numel) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return memcmp(a->data, b->data, (size_t)a->numel * qkv_dtype_size(a->dtype)) == 0;
}

/* ---- round trips --------------------------------------------------------------------------------- */

Test(npy, round_trip_every_dtype_and_rank) {
    static const int64_t shapes[5][4] = {{0}, {5}, {2, 3}, {2, 1, 3}, {2, 3, 1, 2}};
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    int failures = 0, checked = 0;
    for (int dt = 0; dt < QKV_DTYPE_COUNT; dt++) {
        for (int rank = 0; rank <= 4; rank++) {
            qkv_tensor *t = qkv_zeros(ctx, (qkv_dtype)dt, rank, shapes[rank]);
            cr_assert_not_null(t, "%s", qkv_errmsg(ctx));
            fill_pattern(t);
            char name[32];
            snprintf(name, sizeof name, "t_%d_%d.npy", dt, rank);
            const char *path = in_dir(&d, name);
            cr_assert_eq(qkv_npy_save(ctx, t, path), QKV_OK, "%s", qkv_errmsg(ctx));
            qkv_tensor *back = qkv_npy_load(ctx, path);
            cr_assert_not_null(back, "%s", qkv_errmsg(ctx));
            checked++;
            if (!same_tensor(t, back)) failures++;
            /* the header is NumPy's: a multiple of 64 bytes with the prefix, ending in '\n' */
            size_t size;
            unsigned char *bytes = read_all(path, &size);
            size_t hlen = (size_t)bytes[8] | (size_t)bytes[9] << 8;
            if (bytes[6] != 1 || bytes[7] != 0 || (10 + hlen) % 64 != 0 || bytes[9 + hlen] != '\n' ||
                size != 10 + hlen + (size_t)t->numel * qkv_dtype_size(t->dtype))
                failures++;
            free(bytes);
        }
    }
    cr_expect_eq(checked, 20);
    cr_expect_eq(failures, 0, "%d of %d round trips differ", failures, checked);
    cr_expect_eq(count_tmp_files(&d), 0);
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

Test(npy, zero_size_and_long_dimensions_round_trip) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *empty = qkv_zeros(ctx, QKV_F32, 2, (int64_t[]){0, 3});
    qkv_tensor *wide = qkv_zeros(ctx, QKV_U8, 4, (int64_t[]){1, 1, 1, 100003});
    fill_pattern(wide);
    cr_assert_eq(qkv_npy_save(ctx, empty, in_dir(&d, "e.npy")), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_assert_eq(qkv_npy_save(ctx, wide, in_dir(&d, "w.npy")), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_tensor *e = qkv_npy_load(ctx, in_dir(&d, "e.npy"));
    qkv_tensor *w = qkv_npy_load(ctx, in_dir(&d, "w.npy"));
    cr_assert(e && w, "%s", qkv_errmsg(ctx));
    cr_expect(same_tensor(empty, e));
    cr_expect(same_tensor(wide, w));
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

Test(npy, saved_bytes_are_numpys) {
    /* np.save of np.arange(6.0).reshape(2, 3): header length 118 ('v'), 128 bytes before the data */
    static const char expect[] =
        "\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }";
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    double v[6] = {0, 1, 2, 3, 4, 5};
    qkv_tensor *t = qkv_from_data(ctx, QKV_F64, 2, (int64_t[]){2, 3}, v);
    cr_assert_eq(qkv_npy_save(ctx, t, in_dir(&d, "a.npy")), QKV_OK, "%s", qkv_errmsg(ctx));
    size_t size;
    unsigned char *b = read_all(in_dir(&d, "a.npy"), &size);
    cr_assert_eq(size, 128 + sizeof v);
    cr_expect_eq(memcmp(b, expect, sizeof expect - 1), 0, "header differs: %.70s", (const char *)b + 10);
    for (size_t i = sizeof expect - 1; i < 127; i++) cr_expect_eq(b[i], ' ', "byte %zu", i);
    cr_expect_eq(b[127], '\n');
    cr_expect_eq(memcmp(b + 128, v, sizeof v), 0);
    free(b);

    /* 1-d shapes carry a trailing comma, 0-d ones are (), u8 is '|u1', i32 '<i4', f32 '<f4' */
    struct { qkv_dtype dtype; int ndim; int64_t shape[1]; const char *dict; } cases[] = {
        {QKV_U8, 1, {7}, "{'descr': '|u1', 'fortran_order': False, 'shape': (7,), }"},
        {QKV_I32, 0, {0}, "{'descr': '<i4', 'fortran_order': False, 'shape': (), }"},
        {QKV_F32, 1, {0}, "{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qkv_tensor *c = qkv_zeros(ctx, cases[i].dtype, cases[i].ndim, cases[i].shape);
        cr_assert_eq(qkv_npy_save(ctx, c, in_dir(&d, "c.npy")), QKV_OK, "%s", qkv_errmsg(ctx));
        unsigned char *cb = read_all(in_dir(&d, "c.npy"), &size);
        cr_expect_eq(memcmp(cb + 10, cases[i].dict, strlen(cases[i].dict)), 0, "case %zu: %.64s", i,
                     (const char *)cb + 10);
        cr_expect_eq(size, 128 + (size_t)c->numel * qkv_dtype_size(c->dtype));
        free(cb);
    }
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

Test(npy, loaded_tensors_are_step_tensors) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    float v[3] = {1.5f, -2.0f, 3.25f};
    size_t size;
    unsigned char *b = npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 64, v,
                                 sizeof v, &size);
    qkv_tensor *t = qkv_npy_load_mem(ctx, b, size);
    cr_assert_not_null(t, "%s", qkv_errmsg(ctx));
    cr_expect_eq((uintptr_t)t->data % 64, 0);
    cr_expect_eq(qkv_f32(t)[2], 3.25f);
    qkv_step_end(ctx);
    cr_expect_null(qkv_copy(ctx, t), "a loaded tensor does not outlive the step");
    cr_expect_eq(qkv_error(ctx), QKV_ERR_STALE);
    free(b);
    qkv_ctx_free(ctx);
}

/* ---- NumPy-written bytes, built by hand ---------------------------------------------------------- */

Test(npy, reads_numpy_files_of_every_version_and_spelling) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    double f8[6] = {0.5, -1.0, 2.0, 1e-300, -0.0, 42.0};
    float f4[6] = {0.5f, -1.0f, 2.0f, 1e-30f, -0.0f, 42.0f};
    int32_t i4[6] = {-2147483647 - 1, -1, 0, 1, 7, 2147483647};
    uint8_t u1[6] = {0, 1, 127, 128, 254, 255};
    struct {
        int major;
        size_t align;
        const char *dict;
        qkv_dtype dtype;
        const void *data;
        int ndim;
        int64_t shape[4];
    } cases[] = {
        /* NumPy >= 1.14 (version 1.0, 64-byte alignment) */
        {1, 64, "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", QKV_F64, f8, 2, {2, 3}},
        /* NumPy < 1.14 aligned to 16 */
        {1, 16, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", QKV_F32, f4, 1, {6}},
        /* version 2.0 and 3.0 headers (4-byte length) */
        {2, 64, "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 2), }", QKV_I32, i4, 2, {3, 2}},
        {3, 64, "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3), }", QKV_U8, u1, 3, {1, 2, 3}},
        /* native and bare byte orders, keys in another order, double quotes, no trailing comma */
        {1, 64, "{'shape': (6,), 'fortran_order': False, 'descr': '=f8'}", QKV_F64, f8, 1, {6}},
        {1, 64, "{\"descr\": \"f4\", \"fortran_order\": False, \"shape\": (2,3)}", QKV_F32, f4, 2, {2, 3}},
        {1, 64, "{'descr': 'u1', 'fortran_order': False, 'shape': (6,), }", QKV_U8, u1, 1, {6}},
        {1, 64, "{'descr': '<u1', 'fortran_order': False, 'shape': (6,), }", QKV_U8, u1, 1, {6}},
        /* Python 2 long suffixes and spacing */
        {1, 64, "{ 'descr' : '<i4' , 'fortran_order' : False , 'shape' : ( 2L , 3L , ) , }", QKV_I32, i4,
         2, {2, 3}},
        /* 4-d and 0-d */
        {1, 64, "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2, 1, 3), }", QKV_F64, f8, 4,
         {1, 2, 1, 3}},
        {1, 64, "{'descr': '<f8', 'fortran_order': False, 'shape': (), }", QKV_F64, f8, 0, {0}},
    };
    int failures = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = 1;
        for (int k = 0; k < cases[i].ndim; k++) n *= (size_t)cases[i].shape[k];
        size_t nbytes = n * qkv_dtype_size(cases[i].dtype), size;
        unsigned char *b =
            npy_bytes(cases[i].major, cases[i].dict, cases[i].align, cases[i].data, nbytes, &size);
        qkv_tensor *t = qkv_npy_load_mem(ctx, b, size);
        bool ok = t && t->dtype == cases[i].dtype && t->ndim == cases[i].ndim &&
                  memcmp(t->data, cases[i].data, nbytes) == 0;
        for (int k = 0; ok && k < cases[i].ndim; k++) ok = t->shape[k] == cases[i].shape[k];
        if (!ok) {
            failures++;
            cr_log_error("case %zu (%s) failed: %s", i, cases[i].dict, qkv_errmsg(ctx));
            qkv_clear_error(ctx);
        }
        free(b);
    }
    cr_expect_eq(failures, 0);
    qkv_ctx_free(ctx);
}

/* ---- malformed input ----------------------------------------------------------------------------- */

typedef struct bad_case {
    const char *what;
    int major;       /* 0: use raw/raw_len instead of building a file */
    const char *dict;
    size_t data_len; /* bytes of data after the header */
    const char *raw;
    size_t raw_len;
    qkv_status status;
    const char *fragment;
} bad_case;

#define HDR(descr, shape) "{'descr': '" descr "', 'fortran_order': False, 'shape': " shape ", }"

static const bad_case bad_cases[] = {
    {"empty buffer", 0, NULL, 0, "", 0, QKV_ERR_FORMAT, "truncated"},
    {"bad magic", 0, NULL, 0, "\x93NUMPZ\x01\x00\x10\x00{}", 12, QKV_ERR_FORMAT, "not a .npy file"},
    {"text file", 0, NULL, 0, "hello, world", 12, QKV_ERR_FORMAT, "magic"},
    {"magic only", 0, NULL, 0, "\x93NUMPY\x01\x00", 8, QKV_ERR_FORMAT, "truncated"},
    {"version 4.0", 0, NULL, 0, "\x93NUMPY\x04\x00\x02\x00{}", 12, QKV_ERR_FORMAT, "version 4.0"},
    {"version 1.1", 0, NULL, 0, "\x93NUMPY\x01\x01\x02\x00{}", 12, QKV_ERR_FORMAT, "version 1.1"},
    {"truncated header", 0, NULL, 0, "\x93NUMPY\x01\x00\x76\x00{'descr': '<f8'", 25, QKV_ERR_FORMAT,
     "truncated: the header needs 118 bytes"},
    {"v2 length field cut", 0, NULL, 0, "\x93NUMPY\x02\x00\x10\x00", 10, QKV_ERR_FORMAT,
     "end inside the header length"},
    {"huge header length", 0, NULL, 0, "\x93NUMPY\x02\x00\xff\xff\xff\x7f{}", 14, QKV_ERR_FORMAT,
     "over the 65536-byte limit"},
    {"header is a list", 1, "[('descr', '<f4')]", 0, NULL, 0, QKV_ERR_FORMAT, "not a dict"},
    {"missing shape", 1, "{'descr': '<f4', 'fortran_order': False}", 0, NULL, 0, QKV_ERR_FORMAT,
     "no 'shape' key"},
    {"missing descr", 1, "{'fortran_order': False, 'shape': ()}", 0, NULL, 0, QKV_ERR_FORMAT, "no 'descr' key"},
    {"extra key", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}", 0, NULL, 0,
     QKV_ERR_FORMAT, "unexpected key 'x'"},
    {"duplicate key", 1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}", 0, NULL,
     0, QKV_ERR_FORMAT, "'descr' twice"},
    {"fortran order", 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16, NULL, 0,
     QKV_ERR_FORMAT, "fortran_order is True"},
    {"fortran_order not a bool", 1, "{'descr': '<f4', 'fortran_order': 0, 'shape': ()}", 4, NULL, 0,
     QKV_ERR_FORMAT, "not True or False"},
    {"big-endian", 1, HDR(">f4", "(2,)"), 8, NULL, 0, QKV_ERR_FORMAT, "big-endian"},
    {"big-endian f8", 1, HDR(">f8", "(2,)"), 16, NULL, 0, QKV_ERR_FORMAT, "a.astype('<f8')"},
    {"object array", 1, HDR("|O", "(2,)"), 16, NULL, 0, QKV_ERR_FORMAT, "object array"},
    {"float16", 1, HDR("<f2", "(2,)"), 4, NULL, 0, QKV_ERR_FORMAT,
     "'<f2' is not supported (qkv reads '<f4', '<f8', '<i4', '|u1', and '<i8' and '|b1' where they convert "
     "exactly); in NumPy: a.astype(np.float32) (exact)"},
    {"float128", 1, HDR("<f16", "(2,)"), 32, NULL, 0, QKV_ERR_FORMAT, "'<f16' is not supported"},
    {"float128 fix", 1, HDR("<f16", "(2,)"), 32, NULL, 0, QKV_ERR_FORMAT, "in NumPy: a.astype(np.float64)"},
    {"uint32", 1, HDR("<u4", "(2,)"), 8, NULL, 0, QKV_ERR_FORMAT,
     "'<u4' is not supported (qkv reads '<f4', '<f8', '<i4', '|u1', and '<i8' and '|b1' where they convert "
     "exactly); in NumPy: a.astype(np.int32) (exact while a.max() < 2**31)"},
    {"uint16", 1, HDR("<u2", "(2,)"), 4, NULL, 0, QKV_ERR_FORMAT, "in NumPy: a.astype(np.int32) (exact)"},
    {"int16", 1, HDR("<i2", "(2,)"), 4, NULL, 0, QKV_ERR_FORMAT, "in NumPy: a.astype(np.int32) (exact)"},
    {"int8", 1, HDR("|i1", "(2,)"), 2, NULL, 0, QKV_ERR_FORMAT, "'|i1' is not supported"},
    {"complex64", 1, HDR("<c8", "(2,)"), 16, NULL, 0, QKV_ERR_FORMAT, "a.real.astype(np.float32)"},
    {"unicode", 1, HDR("<U3", "(2,)"), 24, NULL, 0, QKV_ERR_FORMAT, "qkv loads numbers only"},
    {"big-endian int64", 1, HDR(">i8", "(2,)"), 16, NULL, 0, QKV_ERR_FORMAT, "'>i8' is big-endian"},
    {"int64 without byte order", 1, HDR("|i8", "(2,)"), 16, NULL, 0, QKV_ERR_FORMAT,
     "a 8-byte type needs one"},
    {"int64 data cut short", 1, HDR("<i8", "(2, 3)"), 44, NULL, 0, QKV_ERR_FORMAT,
     "data is 44 bytes but shape (2, 3) of '<i8' needs 48 (truncated)"},
    {"int64 data of i4 size", 1, HDR("<i8", "(2, 3)"), 24, NULL, 0, QKV_ERR_FORMAT, "needs 48 (truncated)"},
    {"bool data too long", 1, HDR("|b1", "(3,)"), 4, NULL, 0, QKV_ERR_FORMAT,
     "data is 4 bytes but shape (3,) of '|b1' needs 3 (trailing bytes)"},
    {"no byte order on f4", 1, HDR("|f4", "(2,)"), 8, NULL, 0, QKV_ERR_FORMAT, "needs one"},
    {"structured dtype", 1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", 4, NULL, 0,
     QKV_ERR_FORMAT, "structured"},
    {"descr not a string", 1, "{'descr': 4, 'fortran_order': False, 'shape': (1,)}", 4, NULL, 0,
     QKV_ERR_FORMAT, "'descr' is not a string"},
    {"negative dimension", 1, HDR("<f4", "(2, -1)"), 0, NULL, 0, QKV_ERR_FORMAT, "negative dimension -1"},
    {"5 dimensions", 1, HDR("<f4", "(1, 1, 1, 1, 1)"), 4, NULL, 0, QKV_ERR_FORMAT, "more than 4 dimensions"},
    {"product overflow", 1, HDR("<f8", "(4294967296, 4294967296, 4294967296)"), 0, NULL, 0, QKV_ERR_FORMAT,
     "overflow"},
    {"bytes overflow int64", 1, HDR("<f8", "(2305843009213693952,)"), 0, NULL, 0, QKV_ERR_FORMAT,
     "overflow"},
    {"dimension over 64 bits", 1, HDR("<f4", "(99999999999999999999,)"), 0, NULL, 0, QKV_ERR_FORMAT,
     "64 bits"},
    {"shape not a tuple", 1, HDR("<f4", "(3)"), 12, NULL, 0, QKV_ERR_FORMAT, "not a tuple"},
    {"shape a list", 1, HDR("<f4", "[3]"), 12, NULL, 0, QKV_ERR_FORMAT, "'shape' is not a tuple"},
    {"shape holds a name", 1, HDR("<f4", "(3, n)"), 12, NULL, 0, QKV_ERR_FORMAT, "other than an integer"},
    {"shape without commas", 1, HDR("<f4", "(3 4)"), 48, NULL, 0, QKV_ERR_FORMAT, "separated by commas"},
    {"data too short", 1, HDR("<f4", "(2, 3)"), 20, NULL, 0, QKV_ERR_FORMAT, "needs 24 (truncated)"},
    {"data too long", 1, HDR("<f4", "(2, 3)"), 28, NULL, 0, QKV_ERR_FORMAT, "needs 24 (trailing bytes)"},
    {"no data at all", 1, HDR("<f8", "(1000000,)"), 0, NULL, 0, QKV_ERR_FORMAT, "data is 0 bytes"},
    {"text after the dict", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': ()} x", 4, NULL, 0,
     QKV_ERR_FORMAT, "text after its dict"},
    {"unclosed dict", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': ()", 4, NULL, 0,
     QKV_ERR_FORMAT, "no ',' or '}'"},
    {"unclosed string", 1, "{'descr: '<f4'}", 4, NULL, 0, QKV_ERR_FORMAT, "unexpected key"},
    {"key not a string", 1, "{descr: '<f4', 'fortran_order': False, 'shape': ()}", 4, NULL, 0,
     QKV_ERR_FORMAT, "key that is not a string"},
    {"escape in a string", 1, "{'de\\x73cr': '<f4', 'fortran_order': False, 'shape': ()}", 4, NULL, 0,
     QKV_ERR_FORMAT, "escapes"},
    {"missing colon", 1, "{'descr' '<f4', 'fortran_order': False, 'shape': ()}", 4, NULL, 0,
     QKV_ERR_FORMAT, "no ':'"},
};

Test(npy, malformed_inputs_are_refused_with_a_reason) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    size_t n_cases = sizeof bad_cases / sizeof bad_cases[0];
    cr_assert_geq(n_cases, 15);
    int failures = 0;
    for (size_t i = 0; i < n_cases; i++) {
        const bad_case *c = &bad_cases[i];
        size_t size;
        unsigned char *b;
        if (c->major) {
            unsigned char *data = calloc(c->data_len + 1, 1);
            b = npy_bytes(c->major, c->dict, 64, data, c->data_len, &size);
            free(data);
        } else {
            size = c->raw_len;
            b = malloc(size + 1);
            memcpy(b, c->raw, size);
        }
        qkv_tensor *t = qkv_npy_load_mem(ctx, b, size);
        const char *msg = qkv_errmsg(ctx);
        if (t || qkv_error(ctx) != c->status || !strstr(msg, c->fragment) ||
            !strstr(msg, "qkv_npy_load_mem: buffer: ")) {
            failures++;
            cr_log_error("case '%s': got %s \"%s\", wanted %s with \"%s\"", c->what,
                         qkv_status_name(qkv_error(ctx)), msg, qkv_status_name(c->status), c->fragment);
        }
        qkv_clear_error(ctx);
        free(b);
    }
    cr_expect_eq(failures, 0, "%d of %zu malformed inputs not refused as expected", failures, n_cases);
    qkv_ctx_free(ctx);
}

/* ---- NumPy's defaults: int64 integers and bool masks -------------------------------------------- */

/* The bytes of n little-endian int64 values (the host's order is irrelevant to the test). */
static void put_i64(unsigned char *b, const int64_t *v, size_t n) {
    for (size_t i = 0; i < n; i++) qkv_put_le64_(b + 8 * i, (uint64_t)v[i]);
}

Test(npy, int64_loads_as_i32_when_every_value_fits) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const int64_t v[6] = {INT32_MIN, -1, 0, 1, 1000003, INT32_MAX};
    unsigned char data[48];
    put_i64(data, v, 6);
    static const char *const dicts[] = {HDR("<i8", "(2, 3)"), HDR("=i8", "(2, 3)"), HDR("i8", "(2, 3)")};
    for (int k = 0; k < 3; k++) {
        size_t size;
        unsigned char *b = npy_bytes(k + 1, dicts[k], 64, data, sizeof data, &size);
        qkv_tensor *t = qkv_npy_load_mem(ctx, b, size);
        cr_assert_not_null(t, "%s: %s", dicts[k], qkv_errmsg(ctx));
        cr_expect_eq(t->dtype, QKV_I32, "%s", dicts[k]);
        cr_expect(t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->numel == 6);
        for (int i = 0; i < 6; i++) cr_expect_eq(qkv_i32(t)[i], (int32_t)v[i], "%s element %d", dicts[k], i);
        free(b);
    }
    /* 0-d and empty int64 arrays */
    size_t size;
    unsigned char *b = npy_bytes(1, HDR("<i8", "()"), 64, data + 8 * 4, 8, &size);
    qkv_tensor *t = qkv_npy_load_mem(ctx, b, size);
    cr_assert_not_null(t, "%s", qkv_errmsg(ctx));
    cr_expect(t->dtype == QKV_I32 && t->ndim == 0 && qkv_i32(t)[0] == 1000003);
    free(b);
    b = npy_bytes(1, HDR("<i8", "(0, 4)"), 64, NULL, 0, &size);
    t = qkv_npy_load_mem(ctx, b, size);
    cr_assert_not_null(t, "%s", qkv_errmsg(ctx));
    cr_expect(t->dtype == QKV_I32 && t->numel == 0 && t->shape[1] == 4);
    free(b);
    qkv_ctx_free(ctx);
}

Test(npy, int64_that_does_not_fit_names_the_value_its_index_and_the_fix) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    struct {
        const char *shape;
        int64_t v[6];
        size_t n;
        const char *fragment;
    } cases[] = {
        {"(2, 3)", {0, 1, 2, 3, (int64_t)INT32_MAX + 1, -5}, 6, "element 4 at index (1, 1) is 2147483648,"},
        {"(2, 3)", {0, (int64_t)INT32_MIN - 1, 2, INT64_MAX, 0, 0}, 6, "element 1 at index (0, 1) is -2147483649,"},
        {"(6,)", {0, 1, 2, 3, 4, INT64_MIN}, 6, "element 5 is -9223372036854775808,"},
        {"(1, 1, 2, 1)", {7, 4294967296}, 2, "element 1 at index (0, 0, 1, 0) is 4294967296,"},
        {"()", {3000000000}, 1, "element 0 is 3000000000,"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        unsigned char data[48];
        put_i64(data, cases[k].v, cases[k].n);
        char dict[128];
        snprintf(dict, sizeof dict, "{'descr': '<i8', 'fortran_order': False, 'shape': %s, }", cases[k].shape);
        size_t size;
        unsigned char *b = npy_bytes(1, dict, 64, data, 8 * cases[k].n, &size);
        cr_expect_null(qkv_npy_load_mem(ctx, b, size), "case %zu", k);
        const char *msg = qkv_errmsg(ctx);
        cr_expect_eq(qkv_error(ctx), QKV_ERR_FORMAT, "case %zu: %s", k, msg);
        cr_expect(strstr(msg, "qkv_npy_load_mem: buffer: int64 ('<i8') ") != NULL, "case %zu: %s", k, msg);
        cr_expect(strstr(msg, cases[k].fragment) != NULL, "case %zu: %s", k, msg);
        cr_expect(strstr(msg, "which does not fit in int32") != NULL, "case %zu: %s", k, msg);
        cr_expect(strstr(msg, "ids.astype(np.int32)") != NULL, "case %zu: %s", k, msg);
        qkv_clear_error(ctx);
        free(b);
    }
    qkv_ctx_free(ctx);
}

Test(npy, bool_loads_as_u8_and_a_byte_other_than_0_or_1_is_refused) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const uint8_t mask[6] = {1, 0, 0, 1, 1, 0};
    static const char *const dicts[] = {HDR("|b1", "(3, 2)"), HDR("<b1", "(3, 2)"), HDR("b1", "(3, 2)")};
    for (int k = 0; k < 3; k++) {
        size_t size;
        unsigned char *b = npy_bytes(1, dicts[k], 64, mask, sizeof mask, &size);
        qkv_tensor *t = qkv_npy_load_mem(ctx, b, size);
        cr_assert_not_null(t, "%s: %s", dicts[k], qkv_errmsg(ctx));
        cr_expect(t->dtype == QKV_U8 && t->ndim == 2 && t->shape[0] == 3 && t->shape[1] == 2);
        cr_expect_arr_eq(qkv_u8(t), mask, 6, "%s", dicts[k]);
        free(b);
    }
    static const uint8_t bad[][6] = {{0, 1, 2, 1, 0, 0}, {1, 1, 1, 1, 1, 255}};
    static const char *const fragments[] = {"qkv_npy_load_mem: buffer: bool ('|b1') element 2 at index (1, 0) is the "
                                            "byte 2, not 0 (False) or 1 (True)",
                                            "element 5 at index (2, 1) is the byte 255"};
    for (int k = 0; k < 2; k++) {
        size_t size;
        unsigned char *b = npy_bytes(1, dicts[0], 64, bad[k], 6, &size);
        cr_expect_null(qkv_npy_load_mem(ctx, b, size));
        cr_expect_eq(qkv_error(ctx), QKV_ERR_FORMAT);
        cr_expect(strstr(qkv_errmsg(ctx), fragments[k]) != NULL, "%s", qkv_errmsg(ctx));
        qkv_clear_error(ctx);
        free(b);
    }
    qkv_ctx_free(ctx);
}

Test(npy, int64_and_bool_files_load_through_the_path_too) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const int64_t v[3] = {-7, 0, 2147483647}, big[3] = {-7, 2147483648, 0};
    unsigned char data[24];
    put_i64(data, v, 3);
    size_t size;
    unsigned char *b = npy_bytes(1, HDR("<i8", "(3,)"), 64, data, sizeof data, &size);
    const char *ids = in_dir(&d, "ids.npy");
    FILE *f = fopen(ids, "wb");
    cr_assert_eq(fwrite(b, 1, size, f), size);
    fclose(f);
    free(b);
    qkv_tensor *t = qkv_npy_load(ctx, ids);
    cr_assert_not_null(t, "%s", qkv_errmsg(ctx));
    cr_expect(t->dtype == QKV_I32 && qkv_i32(t)[0] == -7 && qkv_i32(t)[1] == 0 && qkv_i32(t)[2] == INT32_MAX);

    put_i64(data, big, 3);
    b = npy_bytes(1, HDR("<i8", "(3,)"), 64, data, sizeof data, &size);
    const char *wide = in_dir(&d, "wide.npy");
    f = fopen(wide, "wb");
    cr_assert_eq(fwrite(b, 1, size, f), size);
    fclose(f);
    free(b);
    cr_expect_null(qkv_npy_load(ctx, wide));
    char want[256];
    snprintf(want, sizeof want, "qkv_npy_load: %s: int64 ('<i8') element 1 is 2147483648", wide);
    cr_expect(strstr(qkv_errmsg(ctx), want) != NULL, "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);

    const uint8_t mask[4] = {0, 1, 1, 0};
    b = npy_bytes(1, HDR("|b1", "(2, 2)"), 64, mask, 4, &size);
    const char *m = in_dir(&d, "mask.npy");
    f = fopen(m, "wb");
    cr_assert_eq(fwrite(b, 1, size, f), size);
    fclose(f);
    free(b);
    t = qkv_npy_load(ctx, m);
    cr_assert_not_null(t, "%s", qkv_errmsg(ctx));
    cr_expect(t->dtype == QKV_U8 && t->numel == 4);
    cr_expect_arr_eq(qkv_u8(t), mask, 4);
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

/* Files numpy itself wrote (tests/tools/make_numpy_files.py; the values are repeated there). */
Test(npy, reads_files_numpy_wrote_with_its_default_dtypes) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *ids = qkv_npy_load(ctx, QKV_TEST_DATA "/numpy/ids_int64.npy");
    cr_assert_not_null(ids, "%s", qkv_errmsg(ctx));
    static const int32_t want_ids[8] = {0, 5, -7, 42, 2147483647, -2147483647 - 1, 3, 1};
    cr_expect(ids->dtype == QKV_I32 && ids->ndim == 2 && ids->shape[0] == 2 && ids->shape[1] == 4);
    cr_expect_arr_eq(qkv_i32(ids), want_ids, sizeof want_ids);

    qkv_tensor *mask = qkv_npy_load(ctx, QKV_TEST_DATA "/numpy/causal_bool.npy");
    cr_assert_not_null(mask, "%s", qkv_errmsg(ctx));
    cr_expect(mask->dtype == QKV_U8 && mask->ndim == 2 && mask->shape[0] == 3 && mask->shape[1] == 4);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            cr_expect_eq(qkv_u8(mask)[i * 4 + j], j <= i, "mask[%d][%d]", i, j);

    cr_expect_null(qkv_npy_load(ctx, QKV_TEST_DATA "/numpy/wide_int64.npy"));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_FORMAT);
    cr_expect(strstr(qkv_errmsg(ctx), "element 2 is 4294967296, which does not fit in int32") != NULL, "%s",
              qkv_errmsg(ctx));
    qkv_clear_error(ctx);

    cr_expect_null(qkv_npy_load(ctx, QKV_TEST_DATA "/numpy/half.npy"));
    cr_expect(strstr(qkv_errmsg(ctx), "'<f2' is not supported") && strstr(qkv_errmsg(ctx), "a.astype(np.float32)"),
              "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

Test(npy, every_truncation_is_refused_and_corruption_never_crashes) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    int32_t v[12];
    for (int i = 0; i < 12; i++) v[i] = i * 3 - 5;
    size_t size;
    unsigned char *b = npy_bytes(1, HDR("<i4", "(3, 4)"), 64, v, sizeof v, &size);
    int wrong = 0;
    for (size_t len = 0; len < size; len++) {
        unsigned char *cut = malloc(len + 1); /* exactly len bytes, so ASan sees any over-read */
        memcpy(cut, b, len);
        if (qkv_npy_load_mem(ctx, cut, len) || qkv_error(ctx) != QKV_ERR_FORMAT) wrong++;
        qkv_clear_error(ctx);
        free(cut);
    }
    cr_expect_eq(wrong, 0, "%d truncations were not refused as QKV_ERR_FORMAT", wrong);
    /* every byte of the header replaced by a few values: accepted or QKV_ERR_FORMAT, nothing else */
    static const unsigned char subst[] = {0, ' ', '\'', '(', ')', ',', '-', '9', '{', '}', 0x80, 0xff};
    int other = 0, refused = 0;
    for (size_t pos = 0; pos < 64; pos++) {
        for (size_t k = 0; k < sizeof subst; k++) {
            unsigned char *m = malloc(size);
            memcpy(m, b, size);
            m[pos] = subst[k];
            qkv_tensor *t = qkv_npy_load_mem(ctx, m, size);
            if (!t && qkv_error(ctx) != QKV_ERR_FORMAT) other++;
            if (!t) refused++;
            qkv_clear_error(ctx);
            qkv_step_end(ctx);
            free(m);
        }
    }
    cr_expect_eq(other, 0);
    cr_expect_gt(refused, 300, "most corruptions of the header are caught (%d)", refused);
    free(b);
    qkv_ctx_free(ctx);
}

Test(npy, file_errors_name_the_path) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const char *missing = in_dir(&d, "missing.npy");
    cr_expect_null(qkv_npy_load(ctx, missing));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_IO);
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_npy_load: ") && strstr(qkv_errmsg(ctx), missing) &&
                  strstr(qkv_errmsg(ctx), strerror(ENOENT)),
              "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);

    cr_expect_null(qkv_npy_load(ctx, d.path));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_IO);
    cr_expect(strstr(qkv_errmsg(ctx), strerror(EISDIR)), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);

    /* a malformed file names its path */
    FILE *f = fopen(in_dir(&d, "bad.npy"), "wb");
    fwrite("\x93NUMPY\x01\x00\x04\x00{}\n\n", 1, 14, f);
    fclose(f);
    cr_expect_null(qkv_npy_load(ctx, in_dir(&d, "bad.npy")));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_FORMAT);
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_npy_load: ") && strstr(qkv_errmsg(ctx), "bad.npy: ") &&
                  strstr(qkv_errmsg(ctx), "no 'descr' key"),
              "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);

    /* saving into a directory that does not exist */
    qkv_tensor *t = qkv_ones(ctx, QKV_F32, 1, (int64_t[]){2});
    const char *nodir = in_dir(&d, "no/such/dir/x.npy");
    cr_expect_eq(qkv_npy_save(ctx, t, nodir), QKV_ERR_IO);
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_npy_save: ") && strstr(qkv_errmsg(ctx), nodir) &&
                  strstr(qkv_errmsg(ctx), strerror(ENOENT)),
              "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

Test(npy, argument_errors) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *t = qkv_ones(ctx, QKV_F32, 1, (int64_t[]){2});
    qkv_status s;
    s = qkv_npy_save(ctx, NULL, "/tmp/never.npy");
    cr_expect(s == QKV_ERR_NULL && strstr(qkv_errmsg(ctx), "qkv_npy_save: tensor is NULL"), "%s",
              qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    s = qkv_npy_save(ctx, t, NULL);
    cr_expect(s == QKV_ERR_NULL && strstr(qkv_errmsg(ctx), "qkv_npy_save: path is NULL"), "%s",
              qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    s = qkv_npy_save(ctx, t, "");
    cr_expect(s == QKV_ERR_ARG && strstr(qkv_errmsg(ctx), "names a directory"), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_expect_null(qkv_npy_load(ctx, NULL));
    cr_expect(qkv_error(ctx) == QKV_ERR_NULL && strstr(qkv_errmsg(ctx), "qkv_npy_load: path is NULL"));
    qkv_clear_error(ctx);
    cr_expect_null(qkv_npy_load_mem(ctx, NULL, 10));
    cr_expect(qkv_error(ctx) == QKV_ERR_NULL && strstr(qkv_errmsg(ctx), "qkv_npy_load_mem: bytes is NULL"));
    qkv_clear_error(ctx);
    /* a stale tensor is refused */
    qkv_step_end(ctx);
    cr_expect_eq(qkv_npy_save(ctx, t, "/tmp/never.npy"), QKV_ERR_STALE);
    cr_expect_eq(access("/tmp/never.npy", F_OK), -1);
    /* the sticky error: later calls return at once */
    cr_expect_null(qkv_npy_load_mem(ctx, "x", 1));
    cr_expect_eq(qkv_npy_save(ctx, t, "/tmp/never.npy"), QKV_ERR_STALE);
    cr_expect_eq(qkv_npy_save(NULL, t, "/tmp/never.npy"), QKV_ERR_NULL);
    cr_expect_null(qkv_npy_load(NULL, "/tmp/never.npy"));
    qkv_ctx_free(ctx);
}

/* ---- atomic writes: injected failures ------------------------------------------------------------ */

static int write_calls, fsync_calls, fail_write_at, fail_fsync_at, fail_rename, max_chunk, eintr_once;

static ssize_t test_write(int fd, const void *buf, size_t count) {
    write_calls++;
    if (eintr_once) {
        eintr_once = 0;
        errno = EINTR;
        return -1;
    }
    if (fail_write_at && write_calls == fail_write_at) {
        errno = ENOSPC;
        return -1;
    }
    if (max_chunk && count > (size_t)max_chunk) count = (size_t)max_chunk;
    return write(fd, buf, count);
}

static int test_fsync(int fd) {
    fsync_calls++;
    if (fail_fsync_at && fsync_calls == fail_fsync_at) {
        errno = EIO;
        return -1;
    }
    return fsync(fd);
}

static int test_rename(const char *from, const char *to) {
    if (fail_rename) {
        errno = EXDEV;
        return -1;
    }
    return rename(from, to);
}

static void install_hooks(void) {
    write_calls = fsync_calls = fail_write_at = fail_fsync_at = fail_rename = max_chunk = eintr_once = 0;
    qkv_fileio_hooks_ h = {test_write, test_fsync, test_rename};
    qkv_fileio_set_hooks_(&h);
}

Test(npy, injected_failures_keep_the_previous_file) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const char *path = in_dir(&d, "model.npy");
    qkv_tensor *old = qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){3, 4});
    fill_pattern(old);
    qkv_tensor *new_ = qkv_full(ctx, QKV_F64, 2, (int64_t[]){5, 5}, 9.0);
    cr_assert_eq(qkv_npy_save(ctx, old, path), QKV_OK, "%s", qkv_errmsg(ctx));

    struct {
        const char *what;
        int write_at, fsync_at, rename;
        const char *fragment, *err;
    } faults[] = {
        {"first write", 1, 0, 0, "write failed", "No space left on device"},
        {"second write", 2, 0, 0, "write failed", "No space left on device"},
        {"fsync", 0, 1, 0, "fsync of the temporary file failed", "Input/output error"},
        {"rename", 0, 0, 1, "rename of the temporary file over the target failed", "Invalid cross-device link"},
    };
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        install_hooks();
        fail_write_at = faults[i].write_at;
        fail_fsync_at = faults[i].fsync_at;
        fail_rename = faults[i].rename;
        cr_expect_eq(qkv_npy_save(ctx, new_, path), QKV_ERR_IO, "%s: %s", faults[i].what, qkv_errmsg(ctx));
        const char *msg = qkv_errmsg(ctx);
        cr_expect(strstr(msg, "qkv_npy_save: ") && strstr(msg, path) && strstr(msg, faults[i].fragment) &&
                      strstr(msg, faults[i].err),
                  "%s: %s", faults[i].what, msg);
        qkv_clear_error(ctx);
        qkv_fileio_set_hooks_(NULL);
        qkv_tensor *back = qkv_npy_load(ctx, path);
        cr_expect(back && same_tensor(back, old), "%s: the previous file changed (%s)", faults[i].what,
                  qkv_errmsg(ctx));
        cr_expect_eq(count_tmp_files(&d), 0, "%s left a temporary file", faults[i].what);
    }

    /* a failure when there was no previous file leaves nothing at all */
    install_hooks();
    fail_write_at = 2;
    const char *fresh = in_dir(&d, "fresh.npy");
    cr_expect_eq(qkv_npy_save(ctx, new_, fresh), QKV_ERR_IO);
    qkv_clear_error(ctx);
    cr_expect_eq(access(fresh, F_OK), -1);
    cr_expect_eq(count_tmp_files(&d), 0);

    /* the directory fsync failing comes after the rename: reported, and the new file is in place */
    install_hooks();
    fail_fsync_at = 2;
    cr_expect_eq(qkv_npy_save(ctx, new_, path), QKV_ERR_IO);
    cr_expect(strstr(qkv_errmsg(ctx), "fsync of its directory failed"), "%s", qkv_errmsg(ctx));
    cr_expect_eq(fsync_calls, 2);
    qkv_clear_error(ctx);
    qkv_fileio_set_hooks_(NULL);
    qkv_tensor *back = qkv_npy_load(ctx, path);
    cr_expect(back && same_tensor(back, new_));
    cr_expect_eq(count_tmp_files(&d), 0);
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

Test(npy, short_writes_and_eintr_are_retried) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *t = qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){7, 9});
    fill_pattern(t);
    install_hooks();
    max_chunk = 5;
    eintr_once = 1;
    const char *path = in_dir(&d, "short.npy");
    cr_assert_eq(qkv_npy_save(ctx, t, path), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect_geq(write_calls, (64 + 7 * 9 * 4) / 5, "writes were cut to 5 bytes (%d calls)", write_calls);
    cr_expect_eq(fsync_calls, 2, "the file and its directory are synced");
    qkv_fileio_set_hooks_(NULL);
    qkv_tensor *back = qkv_npy_load(ctx, path);
    cr_expect(back && same_tensor(back, t), "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

/* ---- allocation failures ------------------------------------------------------------------------- */

Test(npy, allocation_failures_are_reported_and_leak_nothing) {
    tmpdir d = make_tmpdir();
    const char *path = in_dir(&d, "a.npy");
    int nomem = 0, done_at = 0, leaks = 0;
    /* save then load, with the k-th allocation after the setup failing */
    for (long k = 1; k < 50 && !done_at; k++) {
        counting c = {0};
        qkv_options o = qkv_default_options();
        o.allocator = counting_allocator(&c);
        o.arena_chunk = 4096; /* small, so loading the tensor needs a new chunk */
        qkv_ctx *ctx = qkv_ctx_new(&o);
        qkv_tensor *t = qkv_ones(ctx, QKV_F64, 2, (int64_t[]){30, 30});
        cr_assert_not_null(t);
        long live_before = c.live;
        c.fail_at = c.calls + k;
        unlink(path);
        qkv_status s = qkv_npy_save(ctx, t, path);
        qkv_tensor *back = s == QKV_OK ? qkv_npy_load(ctx, path) : NULL;
        if (back) {
            done_at = (int)k;
            cr_expect(same_tensor(back, t));
        } else if (qkv_error(ctx) == QKV_ERR_NOMEM) {
            nomem++;
        } else {
            cr_log_error("allocation %ld: %s", k, qkv_errmsg(ctx));
        }
        if (!back && c.live != live_before) leaks++;
        qkv_ctx_free(ctx);
        if (c.live != 0) leaks++;
    }
    cr_expect_gt(done_at, 2, "the writer and the reader each allocate");
    cr_expect_eq(nomem, done_at - 1);
    cr_expect_eq(leaks, 0);
    cr_expect_eq(count_tmp_files(&d), 0);
    remove_tmpdir(&d);
}
