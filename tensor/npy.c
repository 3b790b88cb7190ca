/*
 * npy.c — NumPy .npy files (NEP 1, numpy.lib.format), versions 1.0, 2.0 and 3.0.
 *
 * Layout:  "\x93NUMPY" | major | minor | header length (u16 LE for 1.0, u32 LE for 2.0/3.0) | header | data
 * The header is a Python dict literal, e.g.  {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 * padded with spaces and ended by '\n' so the data starts on a multiple of 64 bytes. The data is the
 * array's bytes, shape-product * itemsize of them, C order here.
 *
 * Saving writes version 1.0 (2.0 only if a header ever needed more than 65535 bytes), exactly as
 * NumPy would: '<f4', '<f8', '<i4' or '|u1', fortran_order False. Loading treats the bytes as
 * untrusted: every field is checked, nothing is evaluated, and every refusal is QKV_ERR_FORMAT with
 * the function, the path (or "buffer") and what is wrong. Accepted on load beyond what qkv writes:
 * '=' and bare (native, i.e. little-endian) byte orders, any byte-order mark on u1, keys in any
 * order, double quotes, Python 2's long suffix (3L,), and any 16- or 64-byte header alignment.
 *
 * Two NumPy defaults load through an exact conversion: '<i8' (np.int64, the default integer) as i32
 * when every value fits in int32 (else the first value that does not, its index and the fix), and
 * '|b1' (np.bool_, what comparisons give) as u8 0/1 (a byte other than 0 or 1 is refused). Any other
 * dtype is refused with the NumPy call that converts it (a.astype(np.float32), ...).
 */
#include "fileio.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_ALIGN 64
#define NPY_HEADER_MAX 65536 /* refuse longer headers: ours are under 256 bytes, NumPy's under 10 KB */

/* ---- dtypes -------------------------------------------------------------------------------------- */

static const char *descr_of(qkv_dtype dtype) {
    switch (dtype) {
    case QKV_F32: return "<f4";
    case QKV_F64: return "<f8";
    case QKV_I32: return "<i4";
    case QKV_U8: return "|u1";
    default: return NULL;
    }
}

/* How the file's elements become the tensor's: byte for byte, or converted where that is exact. */
typedef enum npy_conv {
    NPY_AS_IS,      /* '<f4' '<f8' '<i4' '|u1': the tensor's own bytes */
    NPY_I64_TO_I32, /* '<i8' (NumPy's default integer): i32, refused if a value does not fit */
    NPY_BOOL_TO_U8, /* '|b1' (NumPy's bool): u8 0/1, refused if a byte is not 0 or 1 */
} npy_conv;

typedef struct npy_dtype {
    qkv_dtype dtype; /* the tensor's */
    size_t itemsize; /* the file's bytes per element */
    npy_conv conv;
} npy_dtype;

/* What a user with an array of this (refused) kind and size should do, as a NumPy call. */
static const char *fix_for(const char *body, size_t blen) {
    char kind = blen ? body[0] : 0;
    bool two = blen == 2, u1 = two && body[1] == '1', u2 = two && body[1] == '2';
    if (kind == 'f' && u2) return "; in NumPy: a.astype(np.float32) (exact)";
    if (kind == 'f') return "; in NumPy: a.astype(np.float64)";
    if (kind == 'i' && (u1 || u2)) return "; in NumPy: a.astype(np.int32) (exact)";
    if (kind == 'u' && u2) return "; in NumPy: a.astype(np.int32) (exact)";
    if (kind == 'u') return "; in NumPy: a.astype(np.int32) (exact while a.max() < 2**31)";
    if (kind == 'c')
        return "; complex arrays: save a.real.astype(np.float32) and a.imag.astype(np.float32) apart";
    if (kind == 'b') return "; in NumPy: a.astype(np.uint8)";
    return "; qkv loads numbers only: convert the array to one of those dtypes first";
}

/* The dtype of a descr string s[0..n), or false with why in err. */
static bool parse_descr(const char *s, size_t n, npy_dtype *out, char *err, size_t errsize) {
    static const struct {
        char body[3];
        npy_dtype type;
    } known[] = {
        {"f4", {QKV_F32, 4, NPY_AS_IS}},      {"f8", {QKV_F64, 8, NPY_AS_IS}},
        {"i4", {QKV_I32, 4, NPY_AS_IS}},      {"u1", {QKV_U8, 1, NPY_AS_IS}},
        {"i8", {QKV_I32, 8, NPY_I64_TO_I32}}, {"b1", {QKV_U8, 1, NPY_BOOL_TO_U8}},
    };
    char order = n > 0 && s[0] && strchr("<>=|", s[0]) ? s[0] : 0;
    const char *body = order ? s + 1 : s;
    size_t blen = order ? n - 1 : n;
    const npy_dtype *d = NULL;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (blen == 2 && memcmp(body, known[i].body, 2) == 0) d = &known[i].type;
    if (blen >= 1 && body[0] == 'O') {
        snprintf(err, errsize,
                 "dtype '%s' is an object array (pickled Python objects), which qkv never loads",
                 QKV_QUOTE(s, n));
        return false;
    }
    if (!d) {
        snprintf(err, errsize,
                 "dtype '%s' is not supported (qkv reads '<f4', '<f8', '<i4', '|u1', and '<i8' and "
                 "'|b1' where they convert exactly)%s",
                 QKV_QUOTE(s, n), fix_for(body, blen));
        return false;
    }
    if (d->itemsize > 1 && order == '>') {
        snprintf(err, errsize,
                 "dtype '%s' is big-endian, which qkv does not load (in NumPy: a.astype('<%s'))",
                 QKV_QUOTE(s, n), QKV_QUOTE(body, blen));
        return false;
    }
    if (d->itemsize > 1 && order == '|') {
        snprintf(err, errsize, "dtype '%s' has no byte order, but a %zu-byte type needs one",
                 QKV_QUOTE(s, n), d->itemsize);
        return false;
    }
    *out = *d;
    return true;
}

/* ---- the header dict ----------------------------------------------------------------------------- */

typedef struct npy_header {
    npy_dtype type;
    const char *descr; /* as written, for messages */
    int descr_len;
    int ndim;
    int64_t shape[QKV_MAX_DIMS];
    const char *shape_text; /* the tuple as written, for messages */
    int shape_len;
} npy_header;

typedef struct cursor {
    const char *p, *end;
    char *err;
    size_t errsize;
} cursor;

static bool fail(cursor *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(cursor *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->errsize, fmt, ap);
    va_end(ap);
    return false;
}

static void skip_space(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static bool at(cursor *c, char ch) { return c->p < c->end && *c->p == ch; }

/* A quoted string without escapes: 'abc' or "abc". */
static bool parse_string(cursor *c, const char **s, size_t *n) {
    if (!at(c, '\'') && !at(c, '"')) return false;
    char quote = *c->p++;
    const char *start = c->p;
    while (c->p < c->end && *c->p != quote) {
        if (*c->p == '\\' || *c->p == '\n')
            return fail(c, "escapes and line breaks in strings are not supported");
        c->p++;
    }
    if (c->p == c->end) return fail(c, "a string is not closed");
    *s = start;
    *n = (size_t)(c->p - start);
    c->p++;
    return true;
}

static bool word(cursor *c, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0) return false;
    const char *after = c->p + n;
    if (after < c->end && ((*after >= 'a' && *after <= 'z') || (*after >= 'A' && *after <= 'Z') ||
                           (*after >= '0' && *after <= '9') || *after == '_'))
        return false;
    c->p = after;
    return true;
}

/* (), (3,), (2, 3), (2, 3,) — a tuple of up to QKV_MAX_DIMS non-negative integers. */
static bool parse_shape(cursor *c, npy_header *h) {
    const char *start = c->p;
    if (!at(c, '(')) return fail(c, "'shape' is not a tuple");
    c->p++;
    int ndim = 0;
    bool comma = false; /* a comma followed the last element */
    for (;;) {
        skip_space(c);
        if (at(c, ')')) break;
        if (ndim > 0 && !comma) return fail(c, "'shape' elements must be separated by commas");
        bool negative = at(c, '-');
        if (negative) c->p++;
        if (!(c->p < c->end && *c->p >= '0' && *c->p <= '9'))
            return fail(c, "'shape' holds something other than an integer");
        int64_t v = 0;
        bool overflow = false;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            int digit = *c->p++ - '0';
            if (v > (INT64_MAX - digit) / 10) overflow = true;
            else v = v * 10 + digit;
        }
        if (at(c, 'L') || at(c, 'l')) c->p++; /* Python 2 longs */
        if (negative) return fail(c, "'shape' has a negative dimension -%lld", (long long)v);
        if (overflow) return fail(c, "'shape' has a dimension that does not fit in 64 bits");
        if (ndim == QKV_MAX_DIMS)
            return fail(c, "'shape' has more than %d dimensions, qkv tensors have at most %d",
                        QKV_MAX_DIMS, QKV_MAX_DIMS);
        h->shape[ndim++] = v;
        skip_space(c);
        comma = at(c, ',');
        if (comma) c->p++;
    }
    if (ndim == 1 && !comma) return fail(c, "'shape' (n) is a parenthesised number, not a tuple: write (n,)");
    c->p++; /* ')' */
    h->ndim = ndim;
    h->shape_text = start;
    h->shape_len = (int)(c->p - start);
    return true;
}

/* The whole header text: one dict with exactly 'descr', 'fortran_order' and 'shape', then spaces. */
static bool parse_header(const char *text, size_t len, npy_header *h, char *err, size_t errsize) {
    cursor c = {text, text + len, err, errsize};
    bool seen[3] = {false, false, false};
    skip_space(&c);
    if (!at(&c, '{')) return fail(&c, "the header is not a dict");
    c.p++;
    for (;;) {
        skip_space(&c);
        if (at(&c, '}')) break;
        const char *key;
        size_t klen;
        if (!parse_string(&c, &key, &klen)) {
            if (c.err[0]) return false;
            return fail(&c, "the header dict has a key that is not a string");
        }
        int which = klen == 5 && memcmp(key, "descr", 5) == 0            ? 0
                    : klen == 13 && memcmp(key, "fortran_order", 13) == 0 ? 1
                    : klen == 5 && memcmp(key, "shape", 5) == 0           ? 2
                                                                          : -1;
        if (which < 0)
            return fail(&c, "the header has an unexpected key '%s'", QKV_QUOTE(key, klen));
        if (seen[which]) return fail(&c, "the header has the key '%s' twice", QKV_QUOTE(key, klen));
        seen[which] = true;
        skip_space(&c);
        if (!at(&c, ':')) return fail(&c, "the header dict has no ':' after '%s'", QKV_QUOTE(key, klen));
        c.p++;
        skip_space(&c);
        if (which == 0) {
            const char *s;
            size_t n;
            if (at(&c, '[')) return fail(&c, "'descr' is a list: structured dtypes are not supported");
            if (!parse_string(&c, &s, &n)) {
                if (c.err[0]) return false;
                return fail(&c, "'descr' is not a string");
            }
            if (n > 32) return fail(&c, "'descr' is %zu characters long, not a dtype qkv knows", n);
            if (!parse_descr(s, n, &h->type, err, errsize)) return false;
            h->descr = s;
            h->descr_len = (int)n;
        } else if (which == 1) {
            if (word(&c, "True"))
                return fail(&c, "fortran_order is True: column-major data is not supported "
                                "(in NumPy: np.ascontiguousarray(a))");
            if (!word(&c, "False")) return fail(&c, "'fortran_order' is not True or False");
        } else {
            if (!parse_shape(&c, h)) return false;
        }
        skip_space(&c);
        if (at(&c, ',')) {
            c.p++;
            continue;
        }
        if (!at(&c, '}'))
            return fail(&c, "the header dict has no ',' or '}' after '%s'", QKV_QUOTE(key, klen));
    }
    c.p++; /* '}' */
    skip_space(&c);
    if (c.p != c.end) return fail(&c, "the header has text after its dict");
    static const char *const names[3] = {"descr", "fortran_order", "shape"};
    for (int i = 0; i < 3; i++)
        if (!seen[i]) return fail(&c, "the header has no '%s' key", names[i]);
    return true;
}

/* " at index (1, 2)" for element i of a C-order array of h's shape ("" for 0-d and 1-d arrays). */
static const char *index_text(const npy_header *h, size_t i, char *buf, size_t size) {
    if (h->ndim < 2) return "";
    size_t idx[QKV_MAX_DIMS], len = (size_t)snprintf(buf, size, " at index (");
    for (int d = h->ndim - 1; d >= 0; d--) {
        idx[d] = i % (size_t)h->shape[d];
        i /= (size_t)h->shape[d];
    }
    for (int d = 0; d < h->ndim && len < size; d++)
        len += (size_t)snprintf(buf + len, size - len, d ? ", %zu" : "%zu", idx[d]);
    if (len < size) snprintf(buf + len, size - len, ")");
    return buf;
}

/* ---- load ---------------------------------------------------------------------------------------- */

/* Parse bytes[0..size) as a .npy file; name is the path or "buffer" for messages. */
static qkv_tensor *load_bytes(qkv_ctx *ctx, const char *fn, const char *name, const unsigned char *bytes,
                              size_t size) {
    if (memcmp(bytes, NPY_MAGIC, size < NPY_MAGIC_LEN ? size : NPY_MAGIC_LEN) != 0)
        return qkv_fail_(ctx, QKV_ERR_FORMAT, "%s: %s: not a .npy file (no \\x93NUMPY magic string)", fn,
                         name);
    if (size < 10)
        return qkv_fail_(ctx, QKV_ERR_FORMAT, "%s: %s: truncated: %zu bytes, a .npy file has at least 10",
                         fn, name, size);
    unsigned major = bytes[6], minor = bytes[7];
    if (!(major >= 1 && major <= 3) || minor != 0)
        return qkv_fail_(ctx, QKV_ERR_FORMAT,
                         "%s: %s: format version %u.%u is not supported (1.0, 2.0 and 3.0 are)", fn, name,
                         major, minor);
    size_t prefix = major == 1 ? 10 : 12;
    if (size < prefix)
        return qkv_fail_(ctx, QKV_ERR_FORMAT, "%s: %s: truncated: %zu bytes end inside the header length",
                         fn, name, size);
    size_t hlen = major == 1 ? (size_t)bytes[8] | (size_t)bytes[9] << 8
                             : (size_t)bytes[8] | (size_t)bytes[9] << 8 | (size_t)bytes[10] << 16 |
                                   (size_t)bytes[11] << 24;
    if (hlen > NPY_HEADER_MAX)
        return qkv_fail_(ctx, QKV_ERR_FORMAT, "%s: %s: header length %zu is over the %d-byte limit", fn,
                         name, hlen, NPY_HEADER_MAX);
    if (size - prefix < hlen)
        return qkv_fail_(ctx, QKV_ERR_FORMAT,
                         "%s: %s: truncated: the header needs %zu bytes after the first %zu, the %s has %zu",
                         fn, name, hlen, prefix, strcmp(name, "buffer") ? "file" : "buffer", size - prefix);
    npy_header h;
    memset(&h, 0, sizeof h);
    char err[1024] = "";
    if (!parse_header((const char *)bytes + prefix, hlen, &h, err, sizeof err))
        return qkv_fail_(ctx, QKV_ERR_FORMAT, "%s: %s: %s", fn, name, err);

    /* elements and bytes, overflow-checked; tensors also need numel * 8 to fit in int64 */
    size_t numel = 1, nbytes;
    for (int i = 0; i < h.ndim; i++)
        if (!qkv_mul_size_(numel, (size_t)h.shape[i], &numel) || numel > (size_t)INT64_MAX / 8)
            return qkv_fail_(ctx, QKV_ERR_FORMAT, "%s: %s: shape %s has too many elements (overflow)", fn,
                             name, QKV_QUOTE(h.shape_text, (size_t)h.shape_len));
    nbytes = numel * h.type.itemsize;
    size_t have = size - prefix - hlen;
    if (have != nbytes)
        return qkv_fail_(ctx, QKV_ERR_FORMAT,
                         "%s: %s: data is %zu bytes but shape %s of '%s' needs %zu (%s)", fn, name,
                         have, QKV_QUOTE(h.shape_text, (size_t)h.shape_len),
                         QKV_QUOTE(h.descr, (size_t)h.descr_len), nbytes,
                         have < nbytes ? "truncated" : "trailing bytes");
    const unsigned char *data = bytes + prefix + hlen;
    char where[96];
    if (h.type.conv == NPY_I64_TO_I32) {
        for (size_t i = 0; i < numel; i++) {
            int64_t v = (int64_t)qkv_le64_(data + 8 * i);
            if (v < INT32_MIN || v > INT32_MAX)
                return qkv_fail_(ctx, QKV_ERR_FORMAT,
                                 "%s: %s: int64 ('%s') element %zu%s is %lld, which does not fit in int32 "
                                 "(qkv loads int64 as i32 only when every value fits); in NumPy, bring "
                                 "the values into range, then save ids.astype(np.int32)",
                                 fn, name, QKV_QUOTE(h.descr, (size_t)h.descr_len), i,
                                 index_text(&h, i, where, sizeof where), (long long)v);
        }
    } else if (h.type.conv == NPY_BOOL_TO_U8) {
        for (size_t i = 0; i < numel; i++)
            if (data[i] > 1)
                return qkv_fail_(ctx, QKV_ERR_FORMAT,
                                 "%s: %s: bool ('%s') element %zu%s is the byte %u, not 0 (False) or 1 "
                                 "(True)",
                                 fn, name, QKV_QUOTE(h.descr, (size_t)h.descr_len), i,
                                 index_text(&h, i, where, sizeof where), (unsigned)data[i]);
    }
    qkv_tensor *t = qkv_new_tensor_(ctx, fn, h.type.dtype, h.ndim, h.shape);
    if (!t) return NULL;
    if (h.type.conv == NPY_I64_TO_I32) {
        int32_t *out = qkv_i32(t);
        for (size_t i = 0; i < numel; i++) out[i] = (int32_t)(int64_t)qkv_le64_(data + 8 * i);
    } else if (nbytes) {
        memcpy(t->data, data, nbytes);
    }
    return t;
}

qkv_tensor *qkv_npy_load_mem(qkv_ctx *ctx, const void *bytes, size_t size) {
    if (!ctx || ctx->status) return NULL;
    if (!bytes) return qkv_fail_(ctx, QKV_ERR_NULL, "qkv_npy_load_mem: bytes is NULL");
    return load_bytes(ctx, "qkv_npy_load_mem", "buffer", bytes, size);
}

qkv_tensor *qkv_npy_load(qkv_ctx *ctx, const char *path) {
    const char *fn = "qkv_npy_load";
    if (!ctx || ctx->status) return NULL;
    if (!path) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: path is NULL", fn);
    unsigned char *bytes;
    size_t size;
    if (!qkv_read_file_(ctx, fn, path, QKV_FILE_MAX, &bytes, &size)) return NULL;
    qkv_tensor *t = load_bytes(ctx, fn, path, bytes, size);
    qkv_raw_free_(ctx, bytes);
    return t;
}

/* ---- save ---------------------------------------------------------------------------------------- */

qkv_status qkv_npy_save(qkv_ctx *ctx, const qkv_tensor *tensor, const char *path) {
    const char *fn = "qkv_npy_save";
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!qkv_check_tensor_(ctx, fn, "tensor", tensor)) return ctx->status;
    if (!path) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: path is NULL", fn);

    /* the dict as NumPy writes it, then spaces and '\n' up to a multiple of 64 with the prefix */
    char dict[256];
    int len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                       descr_of(tensor->dtype));
    for (int i = 0; i < tensor->ndim; i++)
        len += snprintf(dict + len, sizeof dict - (size_t)len, i ? ", %lld" : "%lld",
                        (long long)tensor->shape[i]);
    len += snprintf(dict + len, sizeof dict - (size_t)len, "%s), }", tensor->ndim == 1 ? "," : "");

    unsigned char header[12 + 256 + NPY_ALIGN];
    size_t prefix = 10;
    size_t total = prefix + (size_t)len + 1;
    total += (NPY_ALIGN - total % NPY_ALIGN) % NPY_ALIGN;
    size_t hlen = total - prefix;
    if (hlen > 65535) { /* cannot happen with 4 dimensions; kept so the writer follows the format */
        prefix = 12;
        total = prefix + (size_t)len + 1;
        total += (NPY_ALIGN - total % NPY_ALIGN) % NPY_ALIGN;
        hlen = total - prefix;
    }
    memcpy(header, NPY_MAGIC, NPY_MAGIC_LEN);
    header[6] = prefix == 10 ? 1 : 2;
    header[7] = 0;
    for (size_t i = 0; i < prefix - 8; i++) header[8 + i] = (unsigned char)(hlen >> (8 * i));
    memcpy(header + prefix, dict, (size_t)len);
    memset(header + prefix + len, ' ', hlen - (size_t)len - 1);
    header[total - 1] = '\n';

    qkv_writer_ w;
    if (!qkv_writer_open_(ctx, &w, fn, path)) return ctx->status;
    qkv_writer_write_(&w, header, total);
    qkv_writer_write_(&w, tensor->data, (size_t)tensor->numel * qkv_dtype_size(tensor->dtype));
    return qkv_writer_commit_(&w);
}
