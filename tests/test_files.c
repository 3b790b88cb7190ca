/*
 * test_files.c — what every loader and saver does with paths that are not regular files (a FIFO, /dev/zero,
 * /dev/null, a symlink to a device), the per-tensor CRC-32 in safetensors metadata (bit flips refused with
 * the tensor and the file named, files without checksums still read), step counts that do not fit, and
 * control bytes from a file's header escaped in messages.
 *
 * The FIFO and /dev/zero tests have a short timeout: before the loaders refused non-regular files, a FIFO
 * without a writer blocked open() forever and /dev/zero was read until memory ran out.
 */
#define _XOPEN_SOURCE 700
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"
#include "qkv.h"

#include "test_alloc.h"
#include "test_files.h"
#include "test_deadline.h"

static tmpdir make_tmpdir(void) { return make_tmpdir_tagged("files"); }

static qkv_model_config tiny_config(void) {
    qkv_model_config c = qkv_model_default_config();
    c.vocab = 7;
    c.n_ctx = 4;
    c.d_model = 4;
    c.n_layer = 1;
    c.n_head = 1;
    c.d_mlp = 8;
    c.dtype = QKV_F32;
    c.seed = 3;
    return c;
}

/* The message names the function, the path, and what the path is. */
static void expect_refused(qkv_ctx *ctx, const char *what, const char *fn, const char *path, const char *kind) {
    cr_expect_eq(qkv_error(ctx), QKV_ERR_IO, "%s: status %d: %s", what, qkv_error(ctx), qkv_errmsg(ctx));
    const char *msg = qkv_errmsg(ctx);
    cr_expect(strstr(msg, fn) == msg && strstr(msg, path) && strstr(msg, kind), "%s: %s", what, msg);
    qkv_clear_error(ctx);
}

/* Every loader refuses path, which is `kind`. */
static void expect_every_loader_refuses(qkv_ctx *ctx, const char *path, const char *kind) {
    cr_expect_null(qkv_npy_load(ctx, path));
    expect_refused(ctx, "npy", "qkv_npy_load: ", path, kind);
    cr_expect_null(qkv_safetensors_load(ctx, path));
    expect_refused(ctx, "safetensors", "qkv_safetensors_load: ", path, kind);
    cr_expect_null(qkv_model_load(ctx, path));
    expect_refused(ctx, "model", "qkv_safetensors_load: ", path, kind); /* qkv_model_load reads through it */
}

/* ---- 9: regular files only ------------------------------------------------------------------------ */

Test(files, a_fifo_is_refused_by_every_loader_without_blocking) {
    QKV_TEST_DEADLINE(10);
    tmpdir d = make_tmpdir();
    const char *fifo = in_dir(&d, "pipe.npy");
    cr_assert_eq(mkfifo(fifo, 0600), 0, "mkfifo: %s", strerror(errno));
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    expect_every_loader_refuses(ctx, fifo, "FIFO");
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

Test(files, devices_are_refused_by_every_loader) {
    QKV_TEST_DEADLINE(10);
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    expect_every_loader_refuses(ctx, "/dev/zero", "character device"); /* was: read until out of memory */
    expect_every_loader_refuses(ctx, "/dev/null", "character device"); /* was: "not a .npy file" */
    /* a symlink to a device, too */
    tmpdir d = make_tmpdir();
    const char *link = in_dir(&d, "zero.safetensors");
    cr_assert_eq(symlink("/dev/zero", link), 0);
    expect_every_loader_refuses(ctx, link, "character device");
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

/* Save to path with every saver; each must fail with QKV_ERR_IO naming `kind`. */
static void expect_every_saver_refuses(qkv_ctx *ctx, const char *path, const char *kind) {
    qkv_tensor *x = qkv_ones(ctx, QKV_F32, 1, (int64_t[]){3});
    cr_assert_not_null(x);
    cr_expect_eq(qkv_npy_save(ctx, x, path), QKV_ERR_IO);
    expect_refused(ctx, "npy", "qkv_npy_save: ", path, kind);
    qkv_named_tensor nt = {"x", x};
    cr_expect_eq(qkv_safetensors_save(ctx, path, &nt, 1, NULL, 0), QKV_ERR_IO);
    expect_refused(ctx, "safetensors", "qkv_safetensors_save: ", path, kind);
    qkv_model_config cfg = tiny_config();
    qkv_model *m = qkv_model_new(ctx, &cfg);
    cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
    qkv_optim_options o = qkv_optim_defaults(QKV_OPTIM_ADAM);
    qkv_optimizer *opt = qkv_optim_new(ctx, &o, qkv_model_params(m), qkv_model_param_count(m));
    cr_assert_not_null(opt, "%s", qkv_errmsg(ctx));
    cr_expect_eq(qkv_model_save(ctx, m, path, opt, NULL, 0), QKV_ERR_IO);
    expect_refused(ctx, "model", "qkv_safetensors_save: ", path, kind);
    qkv_optim_free(opt);
    qkv_model_free(m);
    qkv_step_end(ctx);
}

Test(files, saving_to_a_fifo_or_a_device_leaves_it_in_place) {
    QKV_TEST_DEADLINE(10);
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const char *fifo = in_dir(&d, "pipe");
    cr_assert_eq(mkfifo(fifo, 0600), 0, "mkfifo: %s", strerror(errno));
    expect_every_saver_refuses(ctx, fifo, "FIFO");
    struct stat st;
    cr_assert_eq(lstat(fifo, &st), 0);
    cr_expect(S_ISFIFO(st.st_mode), "the FIFO was replaced (mode %o)", (unsigned)st.st_mode);

    /* a symlink to /dev/null: the link stays, and so does the device it names */
    const char *link = in_dir(&d, "null");
    cr_assert_eq(symlink("/dev/null", link), 0);
    expect_every_saver_refuses(ctx, link, "character device");
    cr_assert_eq(lstat(link, &st), 0);
    cr_expect(S_ISLNK(st.st_mode), "the symlink was replaced (mode %o)", (unsigned)st.st_mode);
    cr_assert_eq(stat("/dev/null", &st), 0);
    cr_expect(S_ISCHR(st.st_mode));
    cr_expect_eq(count_tmp_files(&d), 0, "a refused save leaves no temporary file");

    /* a directory at the target */
    const char *sub = in_dir(&d, "sub");
    cr_assert_eq(mkdir(sub, 0700), 0);
    qkv_tensor *x = qkv_ones(ctx, QKV_F32, 1, (int64_t[]){3});
    cr_expect_eq(qkv_npy_save(ctx, x, sub), QKV_ERR_IO);
    expect_refused(ctx, "dir", "qkv_npy_save: ", sub, "directory");
    rmdir(sub);
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

Test(files, regular_files_and_symlinks_to_them_are_still_replaced) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_full(ctx, QKV_F64, 1, (int64_t[]){4}, 2.5);
    const char *path = in_dir(&d, "x.npy");
    cr_assert_eq(qkv_npy_save(ctx, x, path), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_assert_eq(qkv_npy_save(ctx, x, path), QKV_OK, "over an existing file: %s", qkv_errmsg(ctx));
    const char *link = in_dir(&d, "link.npy");
    cr_assert_eq(symlink(path, link), 0);
    cr_assert_eq(qkv_npy_save(ctx, x, link), QKV_OK, "over a symlink to a file: %s", qkv_errmsg(ctx));
    qkv_tensor *y = qkv_npy_load(ctx, link);
    cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
    cr_expect_eq(qkv_f64(y)[3], 2.5);
    /* an empty regular file is read (and refused for what it holds, not for what it is) */
    const char *empty = in_dir(&d, "empty.npy");
    FILE *f = fopen(empty, "wb");
    fclose(f);
    cr_expect_null(qkv_npy_load(ctx, empty));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_FORMAT, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

/* ---- 10: checksums --------------------------------------------------------------------------------- */

Test(files, crc32_is_zlibs) {
    qkv_crc32_table_ t;
    qkv_crc32_init_(&t);
    cr_expect_eq(qkv_crc32_(&t, 0, "123456789", 9), 0xCBF43926u); /* the CRC-32 check value */
    cr_expect_eq(qkv_crc32_(&t, 0, "", 0), 0u);
    /* in pieces (8-byte blocks and a tail) as in one go; python3 -c 'import zlib; zlib.crc32(bytes(range(100)))' */
    unsigned char b[100];
    for (int i = 0; i < 100; i++) b[i] = (unsigned char)i;
    uint32_t whole = qkv_crc32_(&t, 0, b, 100);
    cr_expect_eq(whole, 0x58C932F5u, "%08x", (unsigned)whole);
    cr_expect_eq(qkv_crc32_(&t, qkv_crc32_(&t, 0, b, 13), b + 13, 87), whole);
}

/* A saved checkpoint's bytes with one bit of the data section flipped at data byte `at`. */
static unsigned char *flipped(const char *path, size_t at, size_t *size) {
    unsigned char *b = read_all(path, size);
    size_t data = 8 + (size_t)qkv_le64_(b);
    cr_assert_lt(data + at, *size);
    b[data + at] ^= 0x10;
    return b;
}

static void write_bytes(const char *path, const unsigned char *b, size_t size) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(b, 1, size, f), size);
    fclose(f);
}

Test(files, a_flipped_bit_in_a_tensor_is_refused_naming_the_tensor_and_the_file) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = qkv_full(ctx, QKV_F64, 1, (int64_t[]){3}, 1.0);
    qkv_tensor *b = qkv_full(ctx, QKV_F32, 2, (int64_t[]){2, 2}, -3.0);
    qkv_named_tensor named[] = {{"first", a}, {"second", b}};
    const char *meta[] = {"note", "hello"};
    const char *path = in_dir(&d, "ck.safetensors");
    cr_assert_eq(qkv_safetensors_save(ctx, path, named, 2, meta, 1), QKV_OK, "%s", qkv_errmsg(ctx));

    /* intact: loads, and the checksums are not part of the metadata the user reads */
    qkv_safetensors *st = qkv_safetensors_load(ctx, path);
    cr_assert_not_null(st, "%s", qkv_errmsg(ctx));
    cr_expect_eq(qkv_safetensors_metadata_count(st), 1);
    cr_expect_str_eq(qkv_safetensors_metadata_key(st, 0), "note");
    cr_expect_null(qkv_safetensors_metadata(st, "qkv.crc32.first"));
    qkv_safetensors_free(ctx, st);
    size_t size;
    unsigned char *raw = read_all(path, &size);
    raw[size - 1] = '\0'; /* the header is text; the last data byte is not needed here */
    cr_expect(strstr((char *)raw + 8, "\"qkv.crc32.first\":\"") && strstr((char *)raw + 8, "\"qkv.crc32.second\":\""),
              "the file holds one checksum per tensor: %.200s", raw + 8);
    free(raw);

    /* F64 "first" is data bytes [0, 24), F32 "second" [24, 40) */
    struct {
        size_t at;
        const char *name;
    } flips[] = {{0, "first"}, {23, "first"}, {24, "second"}, {39, "second"}};
    const char *bad = in_dir(&d, "bad.safetensors");
    for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
        unsigned char *bytes = flipped(path, flips[i].at, &size);
        write_bytes(bad, bytes, size);
        cr_expect_null(qkv_safetensors_load(ctx, bad), "flip %zu", i);
        cr_expect_eq(qkv_error(ctx), QKV_ERR_FORMAT, "flip %zu: %s", i, qkv_errmsg(ctx));
        char want[64];
        snprintf(want, sizeof want, "tensor '%s' is corrupt", flips[i].name);
        cr_expect(strstr(qkv_errmsg(ctx), want) && strstr(qkv_errmsg(ctx), bad) &&
                      strstr(qkv_errmsg(ctx), "qkv_safetensors_load: "),
                  "flip %zu: %s", i, qkv_errmsg(ctx));
        qkv_clear_error(ctx);
        cr_expect_null(qkv_safetensors_load_mem(ctx, bytes, size));
        cr_expect(strstr(qkv_errmsg(ctx), want) && strstr(qkv_errmsg(ctx), "buffer"), "%s", qkv_errmsg(ctx));
        qkv_clear_error(ctx);
        free(bytes);
    }
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

/* A safetensors file from JSON and data bytes. */
static unsigned char *st_file(const char *json, const void *data, size_t data_len, size_t *size) {
    size_t n = strlen(json);
    unsigned char *b = malloc(8 + n + data_len + 1);
    qkv_put_le64_(b, n);
    memcpy(b + 8, json, n);
    memcpy(b + 8 + n, data, data_len);
    *size = 8 + n + data_len;
    return b;
}

Test(files, checksums_in_the_metadata_are_checked_when_present) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    float v[2] = {1.0f, 2.0f}; /* zlib.crc32(struct.pack('<2f', 1, 2)) == 0x2e3fa576 */
    struct {
        const char *meta; /* the __metadata__ object */
        qkv_status status;
        const char *fragment;
    } cases[] = {
        {"{}", QKV_OK, NULL}, /* no checksums: written by PyTorch, still read */
        {"{\"format\":\"pt\"}", QKV_OK, NULL},
        {"{\"qkv.crc32.w\":\"2e3fa576\"}", QKV_OK, NULL},
        {"{\"qkv.crc32.w\":\"2E3FA576\"}", QKV_OK, NULL},
        {"{\"qkv.crc32.w\":\"2e3fa577\"}", QKV_ERR_FORMAT, "tensor 'w' is corrupt"},
        {"{\"qkv.crc32.w\":\"2e3fa57\"}", QKV_ERR_FORMAT, "is not 8 hexadecimal digits"},
        {"{\"qkv.crc32.w\":\"2e3fa5760\"}", QKV_ERR_FORMAT, "is not 8 hexadecimal digits"},
        {"{\"qkv.crc32.w\":\"0x3fa576\"}", QKV_ERR_FORMAT, "is not 8 hexadecimal digits"},
        {"{\"qkv.crc32.v\":\"2e3fa576\"}", QKV_ERR_FORMAT, "a checksum qkv.crc32.v for a tensor the file does not hold"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[256];
        snprintf(json, sizeof json,
                 "{\"__metadata__\":%s,\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", cases[i].meta);
        size_t size;
        unsigned char *b = st_file(json, v, sizeof v, &size);
        qkv_safetensors *st = qkv_safetensors_load_mem(ctx, b, size);
        cr_expect_eq(qkv_error(ctx), cases[i].status, "case %zu: %s", i, qkv_errmsg(ctx));
        if (cases[i].fragment)
            cr_expect(strstr(qkv_errmsg(ctx), cases[i].fragment), "case %zu: %s", i, qkv_errmsg(ctx));
        else
            cr_expect(st && qkv_safetensors_get(st, "w") && qkv_f32(qkv_safetensors_get(st, "w"))[1] == 2.0f,
                      "case %zu", i);
        qkv_safetensors_free(ctx, st);
        qkv_clear_error(ctx);
        free(b);
    }
    /* an I64 entry is checked on the bytes as stored, before it becomes I32 */
    int64_t ids[2] = {5, -7}; /* zlib.crc32(struct.pack('<2q', 5, -7)) == 0x14eb9fb1 */
    for (int flip = 0; flip < 2; flip++) {
        size_t size;
        unsigned char *b = st_file("{\"__metadata__\":{\"qkv.crc32.ids\":\"14eb9fb1\"},"
                                   "\"ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}",
                                   ids, sizeof ids, &size);
        if (flip) b[size - 1] ^= 1; /* -7 becomes a value that does not fit in int32: the checksum speaks first */
        qkv_safetensors *st = qkv_safetensors_load_mem(ctx, b, size);
        if (flip) {
            cr_expect_null(st);
            cr_expect(strstr(qkv_errmsg(ctx), "tensor 'ids' is corrupt"), "%s", qkv_errmsg(ctx));
        } else {
            cr_expect(st && qkv_i32(qkv_safetensors_get(st, "ids"))[1] == -7, "%s", qkv_errmsg(ctx));
        }
        qkv_safetensors_free(ctx, st);
        qkv_clear_error(ctx);
        free(b);
    }
    /* the prefix is qkv's own: a caller cannot write a checksum key */
    qkv_tensor *x = qkv_ones(ctx, QKV_F32, 1, (int64_t[]){2});
    qkv_named_tensor nt = {"x", x};
    const char *meta[] = {"qkv.crc32.x", "00000000"};
    cr_expect_eq(qkv_safetensors_save(ctx, "/tmp/never-written.safetensors", &nt, 1, meta, 1), QKV_ERR_ARG);
    cr_expect(strstr(qkv_errmsg(ctx), "keys starting with \"qkv.crc32.\""), "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

Test(files, a_model_checkpoint_with_a_flipped_optimizer_moment_is_refused) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config cfg = tiny_config();
    qkv_model *m = qkv_model_new(ctx, &cfg);
    qkv_optim_options o = qkv_optim_defaults(QKV_OPTIM_ADAM);
    qkv_optimizer *opt = qkv_optim_new(ctx, &o, qkv_model_params(m), qkv_model_param_count(m));
    cr_assert_not_null(opt, "%s", qkv_errmsg(ctx));
    const char *path = in_dir(&d, "model.safetensors");
    cr_assert_eq(qkv_model_save(ctx, m, path, opt, NULL, 0), QKV_OK, "%s", qkv_errmsg(ctx));
    /* the last bytes of the data section belong to some tensor; flip a high exponent bit of it */
    size_t size;
    unsigned char *b = read_all(path, &size);
    b[size - 1] ^= 0x40;
    write_bytes(path, b, size);
    free(b);
    qkv_safetensors *st = qkv_safetensors_load(ctx, path);
    cr_expect_null(st);
    cr_expect(strstr(qkv_errmsg(ctx), "is corrupt") && strstr(qkv_errmsg(ctx), path), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_expect_null(qkv_model_load(ctx, path));
    cr_expect(strstr(qkv_errmsg(ctx), "is corrupt"), "%s", qkv_errmsg(ctx));
    qkv_optim_free(opt);
    qkv_model_free(m);
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

/* ---- the header checksum: every single-bit flip and every single-byte change of a header is refused --- */

/* Load bytes with one changed byte at i; it must be refused as QKV_ERR_FORMAT. Returns the message (static). */
static const char *load_changed(qkv_ctx *ctx, unsigned char *b, size_t size, size_t i, unsigned char value) {
    static char msg[512];
    unsigned char was = b[i];
    b[i] = value;
    qkv_safetensors *st = qkv_safetensors_load_mem(ctx, b, size);
    qkv_status status = qkv_error(ctx);
    snprintf(msg, sizeof msg, "%s", qkv_errmsg(ctx));
    qkv_safetensors_free(ctx, st);
    qkv_clear_error(ctx);
    b[i] = was;
    cr_expect(st == NULL && status == QKV_ERR_FORMAT, "byte %zu: 0x%02x -> 0x%02x loaded (status %s): %s", i, was,
              value, qkv_status_name(status), msg);
    return msg;
}

/* A training checkpoint (a tiny model, its AdamW state and a recipe in the metadata): every one of the
 * 8 (8 + N) single-bit flips of its size and header is refused, and so is every byte of it set to 0, 0xff, a backslash
 * and its value - 1 (for the whole 255 other values of every byte, see the plain file below). Before the
 * header checksum, flips in a metadata value (norm_eps 1.0e-05 -> 1.4e-05) and in the "qkv.crc32." prefix of a
 * tensor's checksum key loaded. */
Test(files, every_single_bit_flip_in_a_checkpoint_header_is_refused) {
    QKV_TEST_DEADLINE(120);
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config cfg = tiny_config();
    qkv_model *m = qkv_model_new(ctx, &cfg);
    qkv_optim_options o = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    qkv_optimizer *opt = qkv_optim_new(ctx, &o, qkv_model_params(m), qkv_model_param_count(m));
    cr_assert_not_null(opt, "%s", qkv_errmsg(ctx));
    const char *path = in_dir(&d, "model.safetensors");
    const char *recipe[] = {"train.lr", "0.003", "train.step", "5000", "train.val_frac", "0.1"};
    cr_assert_eq(qkv_model_save(ctx, m, path, opt, recipe, 3), QKV_OK, "%s", qkv_errmsg(ctx));
    size_t size;
    unsigned char *b = read_all(path, &size);
    size_t header = 8 + (size_t)qkv_le64_(b);
    cr_assert(header < size);
    qkv_safetensors *st = qkv_safetensors_load_mem(ctx, b, size);
    cr_assert_not_null(st, "%s", qkv_errmsg(ctx));
    cr_expect_null(qkv_safetensors_metadata(st, "qkv.header_crc32"), "the checksum is not user metadata");
    qkv_safetensors_free(ctx, st);
    int corrupt = 0;
    for (size_t i = 0; i < header; i++) {
        for (int bit = 0; bit < 8; bit++)
            corrupt += strstr(load_changed(ctx, b, size, i, (unsigned char)(b[i] ^ (1u << bit))),
                              "the header is corrupt") != NULL;
        const unsigned char values[] = {0, 0xff, '\\', (unsigned char)(b[i] - 1)};
        for (size_t k = 0; k < sizeof values; k++)
            if (values[k] != b[i]) load_changed(ctx, b, size, i, values[k]);
    }
    cr_expect(corrupt > 0, "no flip was caught by the header checksum itself");
    cr_log_info("a checkpoint of %zu bytes, %zu of size and header: %d of its bit flips caught by the header CRC", size,
                header, corrupt);
    // a value the JSON still parses: named as the header checksum's finding
    char *eps = strstr((char *)b + 8, "\"qkv.model.norm_eps\":\"");
    cr_assert_not_null(eps);
    size_t at = (size_t)((unsigned char *)strchr(eps + 22, '"') - b) - 1; /* the last digit of the value */
    cr_expect(strstr(load_changed(ctx, b, size, at, (unsigned char)(b[at] ^ 1)), "the header is corrupt: its CRC-32"));
    free(b);
    qkv_optim_free(opt);
    qkv_model_free(m);
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

/* A plain file (one tensor, one metadata pair): all 255 other values of every byte of its size and header. */
Test(files, every_single_byte_change_in_a_small_header_is_refused) {
    QKV_TEST_DEADLINE(120);
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const char *path = in_dir(&d, "small.safetensors");
    qkv_named_tensor nt = {"w", qkv_from_data(ctx, QKV_F32, 1, (int64_t[]){3}, (float[]){1, 2, 3})};
    const char *meta[] = {"note", "x1"};
    cr_assert_eq(qkv_safetensors_save(ctx, path, &nt, 1, meta, 1), QKV_OK, "%s", qkv_errmsg(ctx));
    size_t size;
    unsigned char *b = read_all(path, &size);
    size_t header = 8 + (size_t)qkv_le64_(b);
    for (size_t i = 0; i < header; i++)
        for (unsigned v = 0; v < 256; v++)
            if (v != b[i]) load_changed(ctx, b, size, i, (unsigned char)v);
    free(b);
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

/* Without the header checksum: a file with tensor checksums (as qkv wrote before it checked headers) still loads,
 * its tensors checked; a damaged header checksum key is refused by name; the key is qkv's alone on save. */
Test(files, older_files_load_and_a_damaged_header_checksum_key_is_named) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    static const float v[2] = {1, 2};
    const char *jsons[] = {
        "{\"__metadata__\":{\"qkv.crc32.w\":\"2e3fa576\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
        "{\"__metadata__\":{\"qkv.crc32.w\":\"2e3fa576\",\"qkv.header_crc33\":\"00000000\"},\"w\":{\"dtype\":\"F32\","
        "\"shape\":[2],\"data_offsets\":[0,8]}}",
        "{\"__metadata__\":{\"qkv.crc32.v\":\"aca16a6a\"},\"v\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}"};
    const char *want[] = {NULL, "one byte away from the header checksum's key", "tensor 'w' has no checksum"};
    for (int i = 0; i < 3; i++) {
        size_t size;
        unsigned char *b = st_file(jsons[i], v, sizeof v, &size);
        qkv_safetensors *st = qkv_safetensors_load_mem(ctx, b, size);
        if (!want[i]) cr_expect(st && qkv_safetensors_metadata_count(st) == 0, "case %d: %s", i, qkv_errmsg(ctx));
        else cr_expect(!st && strstr(qkv_errmsg(ctx), want[i]), "case %d: %s", i, qkv_errmsg(ctx));
        qkv_safetensors_free(ctx, st);
        qkv_clear_error(ctx);
        free(b);
    }
    const char *meta[] = {"qkv.header_crc32", "0"};
    qkv_named_tensor nt = {"w", qkv_from_data(ctx, QKV_F32, 1, (int64_t[]){2}, v)};
    cr_expect_eq(qkv_safetensors_save(ctx, "/tmp/qkv-never-written.safetensors", &nt, 1, meta, 1), QKV_ERR_ARG);
    cr_expect(strstr(qkv_errmsg(ctx), "the checksums qkv writes itself"), "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

/* ---- 10: step counts that do not fit ---------------------------------------------------------------- */

Test(files, an_optimizer_step_count_that_does_not_fit_is_refused_on_restore) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config cfg = tiny_config();
    qkv_model *m = qkv_model_new(ctx, &cfg);
    qkv_optim_options o = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    qkv_optimizer *opt = qkv_optim_new(ctx, &o, qkv_model_params(m), qkv_model_param_count(m));
    cr_assert_not_null(opt, "%s", qkv_errmsg(ctx));
    const char *path = in_dir(&d, "good.safetensors"), *bad = in_dir(&d, "bad.safetensors");
    cr_assert_eq(qkv_model_save(ctx, m, path, opt, NULL, 0), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_safetensors *good = qkv_safetensors_load(ctx, path);
    cr_assert_not_null(good, "%s", qkv_errmsg(ctx));
    const double values[] = {1e20, 99999999999999999999.0, 9007199254740992.0, -1.0, 2.5};
    const char *counters[] = {"optim.step", "optim.param0.step"}; /* the optimizer's and one parameter's */
    for (int c = 0; c < 2; c++) {
        for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
            int n = qkv_safetensors_count(good), nm = 0;
            qkv_named_tensor named[128];
            const char *meta[128];
            cr_assert_lt(n, 128);
            cr_assert_not_null(qkv_safetensors_get(good, counters[c]));
            for (int i = 0; i < n; i++) {
                const char *name = qkv_safetensors_name(good, i);
                const qkv_tensor *t = qkv_safetensors_get(good, name);
                if (!strcmp(name, counters[c])) t = qkv_scalar(ctx, QKV_F64, values[v]);
                named[i] = (qkv_named_tensor){name, t};
            }
            for (int i = 0; i < qkv_safetensors_metadata_count(good); i++) {
                meta[nm] = qkv_safetensors_metadata_key(good, i);
                meta[nm + 1] = qkv_safetensors_metadata(good, meta[nm]);
                nm += 2;
            }
            cr_assert_eq(qkv_safetensors_save(ctx, bad, named, n, meta, nm / 2), QKV_OK, "%s", qkv_errmsg(ctx));
            qkv_safetensors *st = qkv_safetensors_load(ctx, bad);
            cr_assert_not_null(st, "%s", qkv_errmsg(ctx));
            cr_expect_eq(qkv_model_restore(ctx, m, st, opt), QKV_ERR_FORMAT, "%s = %g", counters[c], values[v]);
            cr_expect(strstr(qkv_errmsg(ctx), counters[c]) && strstr(qkv_errmsg(ctx), "step count must be a whole"),
                      "%s", qkv_errmsg(ctx));
            qkv_clear_error(ctx);
            cr_expect_eq(qkv_optim_step_count(opt), 0, "a refused checkpoint changes nothing");
            qkv_safetensors_free(ctx, st);
            qkv_step_end(ctx);
        }
    }
    /* the largest count that fits is restored */
    cr_expect_eq(qkv_model_restore(ctx, m, good, opt), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_safetensors_free(ctx, good);
    qkv_optim_free(opt);
    qkv_model_free(m);
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

/* ---- 12: file content in messages is escaped -------------------------------------------------------- */

/* No byte below 0x20 (other than none at all) and no DEL in the message. */
static bool printable(const char *msg) {
    for (const unsigned char *p = (const unsigned char *)msg; *p; p++)
        if (*p < 0x20 || *p == 0x7f) return false;
    return true;
}

Test(files, quoting_escapes_every_byte_but_printable_ascii_and_bounds_the_length) {
    cr_expect_str_eq(QKV_QUOTE("a\x1b[2J\\\n\x7f\xc3\xa9\"'", 12), "a\\x1b[2J\\\\\\x0a\\x7f\\xc3\\xa9\"'");
    cr_expect_str_eq(QKV_QUOTE("ab\0cd", 5), "ab\\x00cd");
    char long_name[200];
    memset(long_name, 'x', sizeof long_name);
    const char *q = QKV_QUOTE(long_name, sizeof long_name);
    cr_expect_eq(strlen(q), QKV_QUOTE_MAX + 3);
    cr_expect_str_eq(q + QKV_QUOTE_MAX, "...");
    memset(long_name, 1, sizeof long_name); /* the longest output: every byte as \xNN */
    cr_expect_eq(strlen(QKV_QUOTE(long_name, sizeof long_name)), 4 * QKV_QUOTE_MAX + 3);
}

Test(files, control_bytes_from_an_npy_header_are_escaped) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    struct {
        const char *dict, *fragment;
    } cases[] = {
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), '\x1b[2J': 1}", "unexpected key '\\x1b[2J'"},
        {"{'descr': '<f\x07', 'fortran_order': False, 'shape': (2,), }", "dtype '<f\\x07' is not supported"},
        {"{'descr': '\x1b]0;pwned\x07', 'fortran_order': False, 'shape': (2,), }", "dtype '\\x1b]0;pwned\\x07'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,\r), }", "shape (2,\\x0d) of '<f4' needs 8"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'k\xff\x80': 1}", "unexpected key 'k\\xff\\x80'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char b[256];
        size_t hlen = strlen(cases[i].dict);
        memcpy(b, "\x93NUMPY\x01\x00", 8);
        b[8] = (unsigned char)hlen;
        b[9] = 0;
        memcpy(b + 10, cases[i].dict, hlen);
        cr_expect_null(qkv_npy_load_mem(ctx, b, 10 + hlen));
        cr_expect(strstr(qkv_errmsg(ctx), cases[i].fragment), "case %zu: %s", i, qkv_errmsg(ctx));
        cr_expect(printable(qkv_errmsg(ctx)), "case %zu: a raw control byte in: %s", i, qkv_errmsg(ctx));
        qkv_clear_error(ctx);
    }
    qkv_ctx_free(ctx);
}

Test(files, control_bytes_from_safetensors_names_dtypes_and_metadata_are_escaped) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    struct {
        const char *json, *fragment;
        size_t data; /* bytes after the header */
    } cases[] = {
        {"{\"a\\u001b[31m\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}",
         "entry 'a\\x1b[31m': shape [1] of F32 needs 4 bytes", 8},
        {"{\"w\":{\"dtype\":\"F\\u0007\",\"shape\":[1],\"data_offsets\":[0,4]}}", "dtype \"F\\x07\" is not one", 4},
        {"{\"w\\n\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\\r\":1}}",
         "entry 'w\\x0a' has an unexpected key 'x\\x0d'", 4},
        {"{\"__metadata__\":{\"k\\u001b\":1}}", "value of 'k\\x1b' is not a string", 0},
        {"{\"__metadata__\":{\"qkv.crc32.\\u001b\":\"00000000\"}}", "checksum qkv.crc32.\\x1b for a tensor", 0},
        {"{\"__metadata__\":{\"qkv.crc32.w\":\"\\u001b[0m\"},\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
         "checksum \"\\x1b[0m\" is not 8", 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        static const unsigned char zeros[8];
        size_t size;
        unsigned char *b = st_file(cases[i].json, zeros, cases[i].data, &size);
        cr_expect_null(qkv_safetensors_load_mem(ctx, b, size));
        cr_expect(strstr(qkv_errmsg(ctx), cases[i].fragment), "case %zu: %s", i, qkv_errmsg(ctx));
        cr_expect(printable(qkv_errmsg(ctx)), "case %zu: a raw control byte in: %s", i, qkv_errmsg(ctx));
        qkv_clear_error(ctx);
        free(b);
    }
    /* a long name is cut, and says so */
    char json[512];
    snprintf(json, sizeof json, "{\"%0200d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 0);
    size_t size;
    unsigned char *b = st_file(json, "\0\0\0\0\0\0\0\0", 4, &size);
    cr_expect_null(qkv_safetensors_load_mem(ctx, b, size));
    char want[80];
    snprintf(want, sizeof want, "entry '%0*d...':", QKV_QUOTE_MAX, 0);
    cr_expect(strstr(qkv_errmsg(ctx), want), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    free(b);
    qkv_ctx_free(ctx);
}

Test(files, control_bytes_in_a_model_checkpoints_metadata_are_escaped) {
    tmpdir d = make_tmpdir();
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config cfg = tiny_config();
    qkv_model *m = qkv_model_new(ctx, &cfg);
    const char *path = in_dir(&d, "m.safetensors"), *bad = in_dir(&d, "bad.safetensors");
    cr_assert_eq(qkv_model_save(ctx, m, path, NULL, NULL, 0), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_safetensors *good = qkv_safetensors_load(ctx, path);
    cr_assert_not_null(good);
    for (int variant = 0; variant < 3; variant++) {
        int n = qkv_safetensors_count(good), nm = 0;
        qkv_named_tensor named[64];
        const char *meta[128];
        for (int i = 0; i < n; i++) {
            named[i].name = qkv_safetensors_name(good, i);
            named[i].tensor = qkv_safetensors_get(good, named[i].name);
        }
        for (int i = 0; i < qkv_safetensors_metadata_count(good); i++) {
            const char *k = qkv_safetensors_metadata_key(good, i), *v = qkv_safetensors_metadata(good, k);
            if (variant == 0 && !strcmp(k, "qkv.model.d_model")) v = "8\x1b[2J";
            if (variant == 1 && !strcmp(k, "qkv.format")) v = "\x1b]0;x\x07";
            if (variant == 2 && !strcmp(k, "qkv.model.seed")) v = "99999999999999999999"; /* not clamped */
            meta[nm++] = k;
            meta[nm++] = v;
        }
        cr_assert_eq(qkv_safetensors_save(ctx, bad, named, n, meta, nm / 2), QKV_OK, "%s", qkv_errmsg(ctx));
        cr_expect_null(qkv_model_load(ctx, bad));
        const char *want = variant == 0   ? "qkv.model.d_model is \"8\\x1b[2J\""
                           : variant == 1 ? "is \"\\x1b]0;x\\x07\""
                                          : "qkv.model.seed is \"99999999999999999999\": not a value";
        cr_expect(strstr(qkv_errmsg(ctx), want), "variant %d: %s", variant, qkv_errmsg(ctx));
        cr_expect(printable(qkv_errmsg(ctx)), "variant %d: %s", variant, qkv_errmsg(ctx));
        qkv_clear_error(ctx);
    }
    qkv_safetensors_free(ctx, good);
    qkv_model_free(m);
    qkv_ctx_free(ctx);
    remove_tmpdir(&d);
}

/* ---- 12: out of memory while loading names the loader ---------------------------------------------- */

Test(files, out_of_memory_in_a_safetensors_load_names_the_loader) {
    /* a file of three tensors, then every allocation of the load failed in turn */
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = qkv_ones(ctx, QKV_F32, 1, (int64_t[]){5});
    qkv_tensor *b = qkv_ones(ctx, QKV_F64, 2, (int64_t[]){2, 3});
    qkv_tensor *c = qkv_ones(ctx, QKV_U8, 1, (int64_t[]){7});
    qkv_named_tensor named[] = {{"a", a}, {"b", b}, {"c", c}};
    tmpdir d = make_tmpdir();
    const char *path = in_dir(&d, "three.safetensors");
    cr_assert_eq(qkv_safetensors_save(ctx, path, named, 3, NULL, 0), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
    int failures = 0, tensor_failures = 0;
    for (long k = 1; k < 200; k++) {
        counting heap = {0};
        qkv_options o = qkv_default_options();
        o.allocator = counting_allocator(&heap);
        qkv_ctx *c2 = qkv_ctx_new(&o);
        cr_assert_not_null(c2);
        heap.fail_at = heap.calls + k;
        qkv_safetensors *st = qkv_safetensors_load(c2, path);
        if (st) {
            qkv_ctx_free(c2);
            break;
        }
        failures++;
        const char *msg = qkv_errmsg(c2);
        cr_expect_eq(qkv_error(c2), QKV_ERR_NOMEM, "k %ld: %s", k, msg);
        cr_expect(strstr(msg, "qkv_safetensors_load: ") == msg && strstr(msg, path), "k %ld: %s", k, msg);
        cr_expect_null(strstr(msg, "qkv_keep"), "k %ld: %s", k, msg);
        if (strstr(msg, "tensor '")) tensor_failures++;
        qkv_ctx_free(c2);
    }
    cr_expect_gt(failures, 3, "the load allocates several times (%d failures seen)", failures);
    cr_expect_gt(tensor_failures, 0, "a failure while copying a tensor names it");
    remove_tmpdir(&d);
}
