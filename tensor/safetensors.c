/*
 * safetensors.c — checkpoints in the safetensors format (see include/qkv/safetensors.h for the
 * format and what is checked).
 *
 * File:  N (u64 LE) | N bytes of JSON, space-padded | data: every tensor's bytes, back to back
 * Load:  read the whole file, check the size prefix, parse the JSON with cJSON, check every entry,
 *        sort the entries by offsets and check they tile [0, data size) exactly, check the values of
 *        I64 and BOOL entries convert exactly (to I32, to U8 0/1), then copy (or convert) each tensor
 *        into a persistent tensor owned by the handle.
 * Save:  check names (non-empty UTF-8, unique), order tensors by element size then name (so each
 *        tensor's offset is a multiple of its element size), build the JSON, pad it to a multiple
 *        of 8, write prefix + JSON + data through the atomic writer.
 *
 * cJSON allocates with the C library's malloc (qkv does not touch cJSON's process-wide hooks); the
 * tensors and the handle go through the context's allocator.
 */
#include "fileio.h"

#include <cjson/cJSON.h>
#include <stdlib.h>

#define ST_HEADER_MAX 100000000u /* the reference implementation's cap */
#define ST_INT_MAX 9007199254740992.0 /* 2^53: integers above it do not survive a JSON double */
#define ST_NAME_SHOWN 64 /* characters of a name quoted in a message */
#define ST_CRC_PREFIX "qkv.crc32." /* metadata key of a tensor's checksum: the prefix, then its name */
#define ST_CRC_PREFIX_LEN (sizeof ST_CRC_PREFIX - 1)

static bool is_crc_key(const char *key) { return strncmp(key, ST_CRC_PREFIX, ST_CRC_PREFIX_LEN) == 0; }

/* The header's checksum: metadata "qkv.header_crc32", 8 hex digits, the CRC-32 of the 8-byte size and the whole
 * header (JSON and padding) as written, with these 8 digits read as "00000000". */
#define ST_HEADER_CRC_KEY "qkv.header_crc32"
#define ST_HEADER_CRC_LITERAL "\"" ST_HEADER_CRC_KEY "\":\"" /* how it sits in the JSON qkv writes */
#define ST_HEADER_CRC_KEY_LEN (sizeof ST_HEADER_CRC_KEY - 1)

/* The checksums qkv writes itself (a tensor's or the header's): hidden from a loaded handle, refused from a caller. */
static bool is_checksum_key(const char *key) { return is_crc_key(key) || !strcmp(key, ST_HEADER_CRC_KEY); }

/* A key one byte away from the header checksum's (refused on save, so that a file qkv wrote never holds one). */
static bool is_damaged_header_key(const char *key) {
    if (strlen(key) != ST_HEADER_CRC_KEY_LEN) return false;
    int differ = 0;
    for (size_t i = 0; i < ST_HEADER_CRC_KEY_LEN; i++) differ += key[i] != ST_HEADER_CRC_KEY[i];
    return differ == 1;
}

typedef struct st_entry {
    const char *name;
    qkv_tensor *tensor;
} st_entry;

typedef struct st_pair {
    const char *key, *value;
} st_pair;

struct qkv_safetensors {
    const qkv_ctx *owner; /* the context that loaded it: its tensors and this block are that context's */
    int count, n_meta;
    st_entry *entries; /* sorted by name */
    st_pair *meta;     /* sorted by key  */
};

static const char *dtype_tag(qkv_dtype dtype) {
    switch (dtype) {
    case QKV_F32: return "F32";
    case QKV_F64: return "F64";
    case QKV_I32: return "I32";
    case QKV_U8: return "U8";
    default: return NULL;
    }
}

/* How a file's elements become the tensor's: byte for byte, or converted where that is exact. */
typedef enum st_conv {
    ST_AS_IS,      /* F32 F64 I32 U8: the tensor's own bytes */
    ST_I64_TO_I32, /* I64 (torch.long, NumPy's default integer): i32, refused if a value does not fit */
    ST_BOOL_TO_U8, /* BOOL: u8 0/1, refused if a byte is not 0 or 1 */
} st_conv;

/* The tensor dtype, the file's bytes per element and the conversion for a dtype tag. */
static bool parse_dtype_tag(const char *s, qkv_dtype *dtype, size_t *itemsize, st_conv *conv) {
    for (int d = 0; d < QKV_DTYPE_COUNT; d++) {
        if (strcmp(s, dtype_tag((qkv_dtype)d)) == 0) {
            *dtype = (qkv_dtype)d;
            *itemsize = qkv_dtype_size(*dtype);
            *conv = ST_AS_IS;
            return true;
        }
    }
    bool i64 = strcmp(s, "I64") == 0;
    if (!i64 && strcmp(s, "BOOL") != 0) return false;
    *dtype = i64 ? QKV_I32 : QKV_U8;
    *itemsize = i64 ? 8 : 1;
    *conv = i64 ? ST_I64_TO_I32 : ST_BOOL_TO_U8;
    return true;
}

/* What a user with a tensor of this (refused) dtype should do before saving it. */
static const char *fix_for(const char *tag) {
    if (strcmp(tag, "F16") == 0 || strcmp(tag, "BF16") == 0)
        return "; convert before saving: t.to(torch.float32) in PyTorch, a.astype(np.float32) in NumPy "
               "(exact)";
    if (strncmp(tag, "F8", 2) == 0) return "; convert before saving: t.to(torch.float32) in PyTorch (exact)";
    if (strcmp(tag, "I8") == 0 || strcmp(tag, "I16") == 0 || strcmp(tag, "U16") == 0)
        return "; convert before saving: t.to(torch.int32) in PyTorch, a.astype(np.int32) in NumPy (exact)";
    if (strcmp(tag, "U32") == 0 || strcmp(tag, "U64") == 0)
        return "; convert before saving: a.astype(np.int32) in NumPy (exact while every value < 2**31)";
    return "";
}

/* ---- load: one entry ----------------------------------------------------------------------------- */

typedef struct st_info {
    const char *name; /* owned by the cJSON tree */
    const char *tag;  /* the file's dtype, owned by the cJSON tree */
    qkv_dtype dtype;  /* the tensor's */
    size_t itemsize;  /* the file's bytes per element */
    st_conv conv;
    int ndim;
    int64_t shape[QKV_MAX_DIMS];
    uint64_t begin, end;
} st_info;

/* A JSON number that is an integer in [0, 2^53]. */
static bool json_uint(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsNumber(item)) return false;
    double v = item->valuedouble;
    if (!(v >= 0.0 && v <= ST_INT_MAX)) return false;
    uint64_t u = (uint64_t)v;
    if ((double)u != v) return false;
    *out = u;
    return true;
}

static bool parse_entry(const cJSON *item, st_info *info, char *err, size_t errsize) {
    const char *name = item->string;
    const cJSON *dtype = NULL, *shape = NULL, *offsets = NULL;
    if (!cJSON_IsObject(item)) {
        snprintf(err, errsize, "entry '%s' is not an object", QKV_QUOTE_STR(name));
        return false;
    }
    for (const cJSON *f = item->child; f; f = f->next) {
        const cJSON **slot = strcmp(f->string, "dtype") == 0          ? &dtype
                             : strcmp(f->string, "shape") == 0        ? &shape
                             : strcmp(f->string, "data_offsets") == 0 ? &offsets
                                                                      : NULL;
        if (!slot) {
            snprintf(err, errsize, "entry '%s' has an unexpected key '%s'", QKV_QUOTE_STR(name),
                     QKV_QUOTE_STR(f->string));
            return false;
        }
        if (*slot) {
            snprintf(err, errsize, "entry '%s' has the key '%s' twice", QKV_QUOTE_STR(name),
                     QKV_QUOTE_STR(f->string));
            return false;
        }
        *slot = f;
    }
    const char *missing = !dtype ? "dtype" : !shape ? "shape" : !offsets ? "data_offsets" : NULL;
    if (missing) {
        snprintf(err, errsize, "entry '%s' has no '%s'", QKV_QUOTE_STR(name), missing);
        return false;
    }
    if (!cJSON_IsString(dtype)) {
        snprintf(err, errsize, "entry '%s': dtype is not a string", QKV_QUOTE_STR(name));
        return false;
    }
    if (!parse_dtype_tag(dtype->valuestring, &info->dtype, &info->itemsize, &info->conv)) {
        snprintf(err, errsize,
                 "entry '%s': dtype \"%s\" is not one qkv reads (F32, F64, I32, U8, and I64 and BOOL "
                 "where they convert exactly)%s",
                 QKV_QUOTE_STR(name), QKV_QUOTE_STR(dtype->valuestring), fix_for(dtype->valuestring));
        return false;
    }
    info->tag = dtype->valuestring;
    if (!cJSON_IsArray(shape)) {
        snprintf(err, errsize, "entry '%s': shape is not an array", QKV_QUOTE_STR(name));
        return false;
    }
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > QKV_MAX_DIMS) {
        snprintf(err, errsize, "entry '%s': shape has %d dimensions, qkv tensors have at most %d",
                 QKV_QUOTE_STR(name), ndim, QKV_MAX_DIMS);
        return false;
    }
    int i = 0;
    for (const cJSON *d = shape->child; d; d = d->next, i++) {
        uint64_t v;
        if (!json_uint(d, &v)) {
            snprintf(err, errsize, "entry '%s': shape element %d is not an integer in [0, 2^53]",
                     QKV_QUOTE_STR(name), i);
            return false;
        }
        info->shape[i] = (int64_t)v;
    }
    info->ndim = ndim;
    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2 ||
        !json_uint(offsets->child, &info->begin) || !json_uint(offsets->child->next, &info->end)) {
        snprintf(err, errsize, "entry '%s': data_offsets is not two integers in [0, 2^53]",
                 QKV_QUOTE_STR(name));
        return false;
    }
    if (info->begin > info->end) {
        snprintf(err, errsize, "entry '%s': data_offsets [%llu, %llu] run backwards", QKV_QUOTE_STR(name),
                 (unsigned long long)info->begin, (unsigned long long)info->end);
        return false;
    }
    info->name = name;
    return true;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const st_info *)a)->name, ((const st_info *)b)->name);
}

static int by_offsets(const void *a, const void *b) {
    const st_info *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int pair_by_key(const void *a, const void *b) {
    return strcmp(((const st_pair *)a)->key, ((const st_pair *)b)->key);
}

/* "[2,3]" for messages. */
static void shape_text(const st_info *in, char *buf, size_t size) {
    size_t len = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < in->ndim && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, i ? ",%lld" : "%lld", (long long)in->shape[i]);
    if (len < size) snprintf(buf + len, size - len, "]");
}

/* ---- load: the whole file ------------------------------------------------------------------------ */

typedef struct st_parse st_parse;
static bool verify_checksums(qkv_ctx *ctx, const char *fn, const char *where, st_parse *p,
                             const unsigned char *bytes, uint64_t header_size);

#define FORMAT_ERR(...) (qkv_fail_(ctx, QKV_ERR_FORMAT, __VA_ARGS__), false)

struct st_parse {
    cJSON *root;
    char *json;       /* NUL-terminated copy of the header */
    st_info *infos;   /* tensor entries */
    st_pair *pairs;   /* metadata, sorted by key */
    int count, n_meta;
    int n_crc;        /* of the metadata, the checksums (hidden from the handle) */
};

/* The value of a checksum: exactly 8 hexadecimal digits. */
static bool parse_crc(const char *s, uint32_t *out) {
    uint32_t v = 0;
    int i = 0;
    for (; s[i] && i < 9; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return false;
        v = v << 4 | (uint32_t)d;
    }
    if (i != 8 || s[i]) return false;
    *out = v;
    return true;
}

/* The metadata value of key (p->pairs is sorted by key), or NULL. */
static const char *meta_value(const st_parse *p, const char *key) {
    st_pair probe = {key, NULL};
    const st_pair *at = p->n_meta ? bsearch(&probe, p->pairs, (size_t)p->n_meta, sizeof *p->pairs, pair_by_key) : NULL;
    return at ? at->value : NULL;
}

/* Once a file has any checksum, every tensor has one (a damaged key would otherwise leave its tensor unchecked). */
static bool every_tensor_has_a_checksum(qkv_ctx *ctx, const char *fn, const char *where, const st_parse *p) {
    for (int i = 0; i < p->count; i++) {
        const char *name = p->infos[i].name;
        bool found = false;
        for (int j = 0; j < p->n_meta && !found; j++) // "qkv.crc32." + name
            found = is_crc_key(p->pairs[j].key) && !strcmp(p->pairs[j].key + ST_CRC_PREFIX_LEN, name);
        if (!found)
            return FORMAT_ERR("%s: %s: tensor '%s' has no checksum (%s%s), though the file has checksums: a "
                              "damaged or edited header", fn, where, QKV_QUOTE_STR(name), ST_CRC_PREFIX,
                              QKV_QUOTE_STR(name));
    }
    return true;
}

/* The rules of the checksums (qkv/safetensors.h): a file with none loads unchecked; once it has any, every tensor
 * has one; the header's is checked when present, and refused when damaged beyond reading. */
static bool verify_header(qkv_ctx *ctx, const char *fn, const char *where, const st_parse *p,
                          const unsigned char *bytes, uint64_t header_size, qkv_crc32_table_ *table) {
    int tensor_crcs = 0;
    for (int i = 0; i < p->n_meta; i++) tensor_crcs += is_crc_key(p->pairs[i].key);
    const char *value = meta_value(p, ST_HEADER_CRC_KEY);
    if (!value) { /* what one changed byte leaves of the checksum's key in the raw JSON (an escape included) */
        const char *lit = ST_HEADER_CRC_LITERAL;
        size_t len = sizeof ST_HEADER_CRC_LITERAL - 1;
        for (size_t i = 0; i + len <= (size_t)header_size; i++) {
            int differ = 0;
            for (size_t j = 0; j < len && differ < 2; j++) differ += p->json[i + j] != lit[j];
            if (differ == 1)
                return FORMAT_ERR("%s: %s: the header is damaged: at byte %zu it holds %s one byte away from the "
                                  "header checksum's key \"%s\"", fn, where, i + 8,
                                  qkv_quote_(p->json + i, len).s, ST_HEADER_CRC_KEY);
        }
    }
    if (!value && tensor_crcs == 0) return true; /* a file without checksums (PyTorch's, NumPy's) */
    if (!value) return true; /* written before qkv checked headers: its tensors are checked, not its header */
    uint32_t want;
    bool lowercase = strspn(value, "0123456789abcdef") == 8; /* as qkv writes it: its digits are outside the CRC */
    if (!lowercase || !parse_crc(value, &want))
        return FORMAT_ERR("%s: %s: the header checksum \"%s\" is not 8 lowercase hexadecimal digits", fn, where,
                          QKV_QUOTE_STR(value));
    const char *json = (const char *)bytes + 8, *at = strstr(p->json, ST_HEADER_CRC_LITERAL);
    if (!at || strstr(at + 1, ST_HEADER_CRC_LITERAL))
        return FORMAT_ERR("%s: %s: the header checksum is not written as qkv writes it (once, as %s\"8 digits\")",
                          fn, where, ST_HEADER_CRC_LITERAL);
    size_t digits = (size_t)(at - p->json) + sizeof ST_HEADER_CRC_LITERAL - 1;
    // crc = CRC-32(size, header[0, digits), "00000000", header[digits + 8, n))
    uint32_t have = qkv_crc32_(table, 0, bytes, 8);
    have = qkv_crc32_(table, have, json, digits);
    have = qkv_crc32_(table, have, "00000000", 8);
    have = qkv_crc32_(table, have, json + digits + 8, (size_t)header_size - digits - 8);
    if (have != want)
        return FORMAT_ERR("%s: %s: the header is corrupt: its CRC-32 is %08x, its checksum (%s) says %08x", fn, where,
                          (unsigned)have, ST_HEADER_CRC_KEY, (unsigned)want);
    return true;
}

/* The header checksum and the tensors' (verify_header), then every "qkv.crc32.<name>" in the metadata names a
 * tensor of the file and matches the CRC-32 of its bytes as stored (before any I64 or BOOL conversion).
 * p->infos is sorted by name. */
static bool verify_checksums(qkv_ctx *ctx, const char *fn, const char *where, st_parse *p,
                             const unsigned char *bytes, uint64_t header_size) {
    const unsigned char *data = bytes + 8 + header_size;
    qkv_crc32_table_ *table = qkv_raw_malloc_(ctx, sizeof *table);
    if (!table) return qkv_fail_(ctx, QKV_ERR_NOMEM, "%s: %s: out of memory for the CRC-32 table", fn, where), false;
    qkv_crc32_init_(table);
    bool ok = verify_header(ctx, fn, where, p, bytes, header_size, table);
    p->n_crc += ok && meta_value(p, ST_HEADER_CRC_KEY) != NULL; /* hidden from the handle, like the tensors' */
    for (int i = 0; ok && i < p->n_meta; i++) {
        const char *key = p->pairs[i].key, *value = p->pairs[i].value;
        if (!is_crc_key(key)) continue;
        p->n_crc++;
        st_info probe = {.name = key + ST_CRC_PREFIX_LEN};
        const st_info *in =
            p->count ? bsearch(&probe, p->infos, (size_t)p->count, sizeof *p->infos, by_name) : NULL;
        uint32_t want;
        if (!in) {
            ok = FORMAT_ERR("%s: %s: the metadata has a checksum %s for a tensor the file does not hold", fn,
                            where, QKV_QUOTE_STR(key));
            break;
        }
        if (!parse_crc(value, &want)) {
            ok = FORMAT_ERR("%s: %s: tensor '%s': its checksum \"%s\" is not 8 hexadecimal digits", fn, where,
                            QKV_QUOTE_STR(in->name), QKV_QUOTE_STR(value));
            break;
        }
        uint32_t have = qkv_crc32_(table, 0, data + in->begin, (size_t)(in->end - in->begin));
        if (have != want)
            ok = FORMAT_ERR("%s: %s: tensor '%s' is corrupt: the CRC-32 of its %llu bytes is %08x, its "
                            "checksum in the metadata (%s%s) is %08x",
                            fn, where, QKV_QUOTE_STR(in->name), (unsigned long long)(in->end - in->begin),
                            (unsigned)have, ST_CRC_PREFIX, QKV_QUOTE_STR(in->name), (unsigned)want);
    }
    qkv_raw_free_(ctx, table);
    return ok && (p->n_crc == 0 || every_tensor_has_a_checksum(ctx, fn, where, p));
}

static void parse_release(qkv_ctx *ctx, st_parse *p) {
    cJSON_Delete(p->root);
    qkv_raw_free_(ctx, p->json);
    qkv_raw_free_(ctx, p->infos);
    qkv_raw_free_(ctx, p->pairs);
}


/* Everything but the tensor copies; on success p holds the validated entries. */
static bool parse_file(qkv_ctx *ctx, const char *fn, const char *where, const unsigned char *bytes,
                       size_t size, st_parse *p) {
    if (size < 8)
        return FORMAT_ERR("%s: %s: %zu bytes, too short for the 8-byte header size", fn, where, size);
    uint64_t n = qkv_le64_(bytes);
    if (n > ST_HEADER_MAX)
        return FORMAT_ERR("%s: %s: header size %llu is over the %u-byte limit", fn, where,
                          (unsigned long long)n, ST_HEADER_MAX);
    if (n > size - 8)
        return FORMAT_ERR("%s: %s: header size %llu runs past the end (%zu bytes follow the size)", fn,
                          where, (unsigned long long)n, size - 8);
    const unsigned char *header = bytes + 8;
    if (n == 0 || header[0] != '{')
        return FORMAT_ERR("%s: %s: the header does not start with '{'", fn, where);
    if (!qkv_utf8_valid_(header, (size_t)n))
        return FORMAT_ERR("%s: %s: the header is not valid UTF-8", fn, where);
    for (uint64_t i = 0; i < n; i++) // JSON has no raw control bytes (a NUL would also end cJSON's strings early)
        if (header[i] < 0x20 && header[i] != '\t' && header[i] != '\n' && header[i] != '\r')
            return FORMAT_ERR("%s: %s: the header holds the control byte 0x%02x at byte %llu, which JSON does not "
                              "allow", fn, where, (unsigned)header[i], (unsigned long long)(i + 8));

    /* cJSON gets a NUL-terminated copy and its length; everything after the JSON must be spaces */
    p->json = qkv_raw_malloc_(ctx, (size_t)n + 1);
    if (!p->json)
        return qkv_fail_(ctx, QKV_ERR_NOMEM, "%s: %s: out of memory for the header", fn, where), false;
    memcpy(p->json, header, (size_t)n);
    p->json[n] = '\0';
    const char *end = NULL;
    p->root = cJSON_ParseWithLengthOpts(p->json, (size_t)n, &end, 0);
    if (!p->root)
        return FORMAT_ERR("%s: %s: the header is not valid JSON (error near byte %td of %llu)", fn, where,
                          end ? end - p->json : (ptrdiff_t)0, (unsigned long long)n);
    for (const char *q = end; q < p->json + n; q++)
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r')
            return FORMAT_ERR("%s: %s: the header has text after its JSON object (byte %td)", fn, where,
                              q - p->json);
    if (!cJSON_IsObject(p->root)) return FORMAT_ERR("%s: %s: the header is not a JSON object", fn, where);

    /* entries and metadata */
    int total = cJSON_GetArraySize(p->root);
    p->infos = qkv_raw_malloc_(ctx, (size_t)total * sizeof *p->infos);
    if (!p->infos)
        return qkv_fail_(ctx, QKV_ERR_NOMEM, "%s: %s: out of memory for %d entries", fn, where, total),
               false;
    const cJSON *meta = NULL;
    char err[768];
    for (const cJSON *item = p->root->child; item; item = item->next) {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (meta) return FORMAT_ERR("%s: %s: the header has __metadata__ twice", fn, where);
            meta = item;
            continue;
        }
        st_info *info = &p->infos[p->count];
        memset(info, 0, sizeof *info);
        if (!parse_entry(item, info, err, sizeof err)) return FORMAT_ERR("%s: %s: %s", fn, where, err);
        p->count++;
    }
    if (meta) {
        if (!cJSON_IsObject(meta)) return FORMAT_ERR("%s: %s: __metadata__ is not an object", fn, where);
        int m = cJSON_GetArraySize(meta);
        p->pairs = qkv_raw_malloc_(ctx, (size_t)m * sizeof *p->pairs);
        if (!p->pairs)
            return qkv_fail_(ctx, QKV_ERR_NOMEM, "%s: %s: out of memory for metadata", fn, where), false;
        for (const cJSON *kv = meta->child; kv; kv = kv->next) {
            if (!cJSON_IsString(kv))
                return FORMAT_ERR("%s: %s: __metadata__ value of '%s' is not a string", fn, where,
                                  QKV_QUOTE_STR(kv->string));
            p->pairs[p->n_meta].key = kv->string;
            p->pairs[p->n_meta].value = kv->valuestring;
            p->n_meta++;
        }
        qsort(p->pairs, (size_t)p->n_meta, sizeof *p->pairs, pair_by_key);
        for (int i = 1; i < p->n_meta; i++)
            if (strcmp(p->pairs[i - 1].key, p->pairs[i].key) == 0)
                return FORMAT_ERR("%s: %s: __metadata__ has the key '%s' twice", fn, where,
                                  QKV_QUOTE_STR(p->pairs[i].key));
    }

    /* names unique */
    if (p->count > 1) qsort(p->infos, (size_t)p->count, sizeof *p->infos, by_name);
    for (int i = 1; i < p->count; i++)
        if (strcmp(p->infos[i - 1].name, p->infos[i].name) == 0)
            return FORMAT_ERR("%s: %s: the tensor name '%s' appears twice", fn, where,
                              QKV_QUOTE_STR(p->infos[i].name));

    /* offsets: sorted, contiguous from 0, each range the size of its shape, ending at the end */
    if (p->count > 1) qsort(p->infos, (size_t)p->count, sizeof *p->infos, by_offsets);
    uint64_t data_size = size - 8 - n, at = 0;
    for (int i = 0; i < p->count; i++) {
        const st_info *in = &p->infos[i];
        if (in->begin != at)
            return FORMAT_ERR("%s: %s: entry '%s' starts at data byte %llu where byte %llu was "
                              "expected (%s)",
                              fn, where, QKV_QUOTE_STR(in->name), (unsigned long long)in->begin,
                              (unsigned long long)at, in->begin < at ? "overlap" : "gap");
        uint64_t bytes_needed = in->itemsize;
        bool overflow = false;
        for (int d = 0; d < in->ndim; d++)
            overflow |= __builtin_mul_overflow(bytes_needed, (uint64_t)in->shape[d], &bytes_needed);
        char shp[128];
        shape_text(in, shp, sizeof shp);
        if (overflow || bytes_needed > (uint64_t)INT64_MAX)
            return FORMAT_ERR("%s: %s: entry '%s': shape %s overflows", fn, where, QKV_QUOTE_STR(in->name),
                              shp);
        if (bytes_needed != in->end - in->begin)
            return FORMAT_ERR("%s: %s: entry '%s': shape %s of %s needs %llu bytes, data_offsets [%llu, "
                              "%llu] hold %llu",
                              fn, where, QKV_QUOTE_STR(in->name), shp, in->tag,
                              (unsigned long long)bytes_needed, (unsigned long long)in->begin,
                              (unsigned long long)in->end, (unsigned long long)(in->end - in->begin));
        at = in->end;
    }
    if (at != data_size)
        return FORMAT_ERR("%s: %s: the tensors cover %llu data bytes but the %s holds %llu (%s)", fn, where,
                          (unsigned long long)at, strcmp(where, "buffer") ? "file" : "buffer",
                          (unsigned long long)data_size, at < data_size ? "trailing bytes" : "truncated");

    /* checksums, where the metadata has them (files written by PyTorch do not) */
    const unsigned char *data = bytes + 8 + n;
    if (p->count > 1) qsort(p->infos, (size_t)p->count, sizeof *p->infos, by_name);
    if (!verify_checksums(ctx, fn, where, p, bytes, n)) return false;

    /* converted entries: every value must convert exactly */
    for (int i = 0; i < p->count; i++) {
        const st_info *in = &p->infos[i];
        const unsigned char *src = data + in->begin;
        uint64_t count = (in->end - in->begin) / in->itemsize;
        char shp[128];
        shape_text(in, shp, sizeof shp);
        for (uint64_t j = 0; in->conv == ST_I64_TO_I32 && j < count; j++) {
            int64_t v = (int64_t)qkv_le64_(src + 8 * j);
            if (v < INT32_MIN || v > INT32_MAX)
                return FORMAT_ERR("%s: %s: entry '%s' (I64 %s): element %llu is %lld, which does not fit "
                                  "in int32 (qkv loads I64 as I32 only when every value fits); bring the "
                                  "values into range, then save t.to(torch.int32) in PyTorch or "
                                  "ids.astype(np.int32) in NumPy",
                                  fn, where, QKV_QUOTE_STR(in->name), shp, (unsigned long long)j,
                                  (long long)v);
        }
        for (uint64_t j = 0; in->conv == ST_BOOL_TO_U8 && j < count; j++)
            if (src[j] > 1)
                return FORMAT_ERR("%s: %s: entry '%s' (BOOL %s): element %llu is the byte %u, not 0 "
                                  "(false) or 1 (true)",
                                  fn, where, QKV_QUOTE_STR(in->name), shp, (unsigned long long)j,
                                  (unsigned)src[j]);
    }
    return true;
}

/* The stored error came from an inner call (qkv_keep, the persistent allocator): restate it as
 * "fn: where: what: <inner message without its function name>", since the user called fn. */
static void prefix_error(qkv_ctx *ctx, const char *fn, const char *where, const char *what) {
    char inner[QKV_ERRMSG_SIZE];
    qkv_status status = ctx->status;
    const char *msg = ctx->errmsg, *colon = strstr(msg, ": ");
    if (!strncmp(msg, "qkv_", 4) && colon) msg = colon + 2;
    snprintf(inner, sizeof inner, "%s", msg);
    qkv_clear_error(ctx);
    qkv_fail_(ctx, status, "%s: %s: %s: %s", fn, where, what, inner);
}

static qkv_safetensors *load_bytes(qkv_ctx *ctx, const char *fn, const char *where,
                                   const unsigned char *bytes, size_t size) {
    st_parse p;
    memset(&p, 0, sizeof p);
    if (!parse_file(ctx, fn, where, bytes, size, &p)) {
        parse_release(ctx, &p);
        return NULL;
    }
    const unsigned char *data = bytes + 8 + qkv_le64_(bytes); /* p.infos are sorted by name */

    /* one persistent block: the handle, the entry and pair arrays, then every string */
    size_t bytes_total = sizeof(qkv_safetensors), entries_at, pairs_at, strings_at;
    bool ok = true;
    entries_at = bytes_total;
    ok &= qkv_add_size_(bytes_total, (size_t)p.count * sizeof(st_entry), &bytes_total);
    pairs_at = bytes_total;
    ok &= qkv_add_size_(bytes_total, (size_t)(p.n_meta - p.n_crc) * sizeof(st_pair), &bytes_total);
    strings_at = bytes_total;
    for (int i = 0; i < p.count; i++)
        ok &= qkv_add_size_(bytes_total, strlen(p.infos[i].name) + 1, &bytes_total);
    for (int i = 0; i < p.n_meta; i++) {
        if (is_checksum_key(p.pairs[i].key)) continue;
        ok &= qkv_add_size_(bytes_total, strlen(p.pairs[i].key) + 1, &bytes_total);
        ok &= qkv_add_size_(bytes_total, strlen(p.pairs[i].value) + 1, &bytes_total);
    }
    unsigned char *block = ok ? qkv_persistent_alloc_(ctx, fn, bytes_total) : NULL;
    if (!block) {
        if (!ok) qkv_fail_(ctx, QKV_ERR_OVERFLOW, "%s: %s: the header's strings overflow size_t", fn, where);
        else if (ctx->status == QKV_ERR_NOMEM) prefix_error(ctx, fn, where, "the handle"); /* add the file */
        parse_release(ctx, &p);
        return NULL;
    }
    qkv_safetensors *st = (qkv_safetensors *)block;
    st->owner = ctx;
    st->count = 0;
    st->n_meta = 0;
    st->entries = (st_entry *)(block + entries_at);
    st->meta = (st_pair *)(block + pairs_at);
    char *s = (char *)block + strings_at;
    for (int i = 0; i < p.n_meta; i++) {
        if (is_checksum_key(p.pairs[i].key)) continue; /* verified; not part of what the user reads */
        size_t k = strlen(p.pairs[i].key) + 1, v = strlen(p.pairs[i].value) + 1;
        st->meta[st->n_meta].key = memcpy(s, p.pairs[i].key, k);
        s += k;
        st->meta[st->n_meta].value = memcpy(s, p.pairs[i].value, v);
        s += v;
        st->n_meta++;
    }
    for (int i = 0; i < p.count; i++) {
        const st_info *in = &p.infos[i];
        size_t k = strlen(in->name) + 1;
        st->entries[i].name = memcpy(s, in->name, k);
        s += k;
        /* a borrowed view of the file's bytes, copied into a persistent tensor by qkv_keep */
        qkv_tensor view;
        memset(&view, 0, sizeof view);
        view.dtype = in->dtype;
        view.ndim = in->ndim;
        view.numel = 1;
        for (int d = 0; d < QKV_MAX_DIMS; d++) {
            view.shape[d] = d < in->ndim ? in->shape[d] : 1;
            view.numel *= view.shape[d];
        }
        view.data = (void *)(data + in->begin);
        view.magic_ = QKV_TENSOR_MAGIC;
        view.epoch_ = 0;
        qkv_tensor *t = qkv_keep_view_(ctx, fn, &view); /* I64: the first half of the bytes, rewritten below */
        if (!t) {
            char what[QKV_QUOTE_MAX * 4 + 96];
            snprintf(what, sizeof what, "tensor '%s' %s", QKV_QUOTE_STR(in->name), QKV_SHAPE(&view));
            prefix_error(ctx, fn, where, what);
            qkv_safetensors_free(ctx, st);
            parse_release(ctx, &p);
            return NULL;
        }
        if (in->conv == ST_I64_TO_I32) /* every value fits: parse_file checked */
            for (int64_t j = 0; j < t->numel; j++)
                qkv_i32(t)[j] = (int32_t)(int64_t)qkv_le64_(data + in->begin + 8 * (uint64_t)j);
        st->entries[i].tensor = t;
        st->count++;
    }
    parse_release(ctx, &p);
    return st;
}

qkv_safetensors *qkv_safetensors_load_mem(qkv_ctx *ctx, const void *bytes, size_t size) {
    if (!ctx || ctx->status) return NULL;
    if (!bytes) return qkv_fail_(ctx, QKV_ERR_NULL, "qkv_safetensors_load_mem: bytes is NULL");
    return load_bytes(ctx, "qkv_safetensors_load_mem", "buffer", bytes, size);
}

qkv_safetensors *qkv_safetensors_load(qkv_ctx *ctx, const char *path) {
    const char *fn = "qkv_safetensors_load";
    if (!ctx || ctx->status) return NULL;
    if (!path) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: path is NULL", fn);
    unsigned char *bytes;
    size_t size;
    if (!qkv_read_file_(ctx, fn, path, QKV_FILE_MAX, &bytes, &size)) return NULL;
    qkv_safetensors *st = load_bytes(ctx, fn, path, bytes, size);
    qkv_raw_free_(ctx, bytes);
    return st;
}

void qkv_safetensors_free(qkv_ctx *ctx, qkv_safetensors *st) {
    if (!ctx || !st) return;
    if (st->owner != ctx) { /* its block and tensors came from another context's allocator: not ours to free */
        qkv_fail_(ctx, QKV_ERR_ARG, "qkv_safetensors_free: the handle (%d tensors) was loaded by another context",
                  st->count);
        return;
    }
    for (int i = 0; i < st->count; i++) qkv_free(ctx, st->entries[i].tensor);
    qkv_persistent_free_(ctx, st);
}

/* ---- queries ------------------------------------------------------------------------------------- */

int qkv_safetensors_count(const qkv_safetensors *st) { return st ? st->count : 0; }

const char *qkv_safetensors_name(const qkv_safetensors *st, int i) {
    return st && i >= 0 && i < st->count ? st->entries[i].name : NULL;
}

static int find_entry(const qkv_safetensors *st, const char *name) {
    int lo = 0, hi = st->count - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(name, st->entries[mid].name);
        if (c == 0) return mid;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return -1;
}

const qkv_tensor *qkv_safetensors_get(const qkv_safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    int i = find_entry(st, name);
    return i < 0 ? NULL : st->entries[i].tensor;
}

int qkv_safetensors_metadata_count(const qkv_safetensors *st) { return st ? st->n_meta : 0; }

const char *qkv_safetensors_metadata_key(const qkv_safetensors *st, int i) {
    return st && i >= 0 && i < st->n_meta ? st->meta[i].key : NULL;
}

const char *qkv_safetensors_metadata(const qkv_safetensors *st, const char *key) {
    if (!st || !key) return NULL;
    int lo = 0, hi = st->n_meta - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(key, st->meta[mid].key);
        if (c == 0) return st->meta[mid].value;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

qkv_status qkv_safetensors_copy_into(qkv_ctx *ctx, const qkv_safetensors *st, const char *name,
                                     qkv_tensor *dst) {
    const char *fn = "qkv_safetensors_copy_into";
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!st) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: st is NULL", fn);
    if (!name) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: name is NULL", fn);
    if (!qkv_check_tensor_(ctx, fn, "dst", dst)) return ctx->status;
    const qkv_tensor *src = qkv_safetensors_get(st, name);
    if (!src)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: the checkpoint has no tensor named '%.*s'", fn,
                          ST_NAME_SHOWN, name);
    if (src->dtype != dst->dtype)
        return qkv_failc_(ctx, QKV_ERR_DTYPE, "%s: '%.*s' is %s %s in the checkpoint, dst %s is %s", fn,
                          ST_NAME_SHOWN, name, qkv_dtype_name(src->dtype), QKV_SHAPE(src), QKV_SHAPE(dst),
                          qkv_dtype_name(dst->dtype));
    if (!qkv_same_shape_(src, dst))
        return qkv_failc_(ctx, QKV_ERR_SHAPE, "%s: '%.*s' is %s in the checkpoint, dst is %s", fn,
                          ST_NAME_SHOWN, name, QKV_SHAPE(src), QKV_SHAPE(dst));
    memcpy(dst->data, src->data, (size_t)src->numel * qkv_dtype_size(src->dtype));
    return QKV_OK;
}

/* ---- save ---------------------------------------------------------------------------------------- */

static int named_by_name(const void *a, const void *b) {
    return strcmp((*(const qkv_named_tensor *const *)a)->name, (*(const qkv_named_tensor *const *)b)->name);
}

/* Larger elements first, then by name: every offset is then a multiple of its element size. */
static int named_by_layout(const void *a, const void *b) {
    const qkv_named_tensor *x = *(const qkv_named_tensor *const *)a, *y = *(const qkv_named_tensor *const *)b;
    size_t sx = qkv_dtype_size(x->tensor->dtype), sy = qkv_dtype_size(y->tensor->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

static bool valid_text(const char *s) { return qkv_utf8_valid_((const unsigned char *)s, strlen(s)); }

/* Check the arguments; order receives the tensors in file order, pairs the metadata by key. */
static bool check_save_args(qkv_ctx *ctx, const char *fn, const qkv_named_tensor *tensors, int n,
                            const char *const *metadata, int n_metadata,
                            const qkv_named_tensor **order, st_pair *pairs) {
    for (int i = 0; i < n; i++) {
        const char *name = tensors[i].name;
        char label[48];
        snprintf(label, sizeof label, "tensors[%d].tensor", i);
        if (!name) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: tensors[%d].name is NULL", fn, i), false;
        if (!name[0]) return qkv_fail_(ctx, QKV_ERR_ARG, "%s: tensors[%d].name is empty", fn, i), false;
        if (strcmp(name, "__metadata__") == 0)
            return qkv_fail_(ctx, QKV_ERR_ARG, "%s: tensors[%d].name is \"__metadata__\", which the format "
                             "reserves", fn, i), false;
        if (!valid_text(name))
            return qkv_fail_(ctx, QKV_ERR_ARG, "%s: tensors[%d].name is not valid UTF-8", fn, i), false;
        if (!qkv_check_tensor_(ctx, fn, label, tensors[i].tensor)) return false;
        order[i] = &tensors[i];
    }
    qsort(order, (size_t)n, sizeof *order, named_by_name);
    for (int i = 1; i < n; i++)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0)
            return qkv_fail_(ctx, QKV_ERR_ARG, "%s: the name '%.*s' is given to two tensors", fn,
                             ST_NAME_SHOWN, order[i]->name), false;
    qsort(order, (size_t)n, sizeof *order, named_by_layout);
    for (int i = 0; i < n_metadata; i++) {
        const char *k = metadata[2 * i], *v = metadata[2 * i + 1];
        if (!k || !v)
            return qkv_fail_(ctx, QKV_ERR_NULL, "%s: metadata %s %d is NULL", fn, k ? "value" : "key", i),
                   false;
        if (!valid_text(k) || !valid_text(v))
            return qkv_fail_(ctx, QKV_ERR_ARG, "%s: metadata pair %d is not valid UTF-8", fn, i), false;
        if (is_checksum_key(k) || is_damaged_header_key(k))
            return qkv_fail_(ctx, QKV_ERR_ARG, "%s: metadata key \"%.*s\": keys starting with \"%s\", \"%s\" and "
                             "keys one byte from it are the checksums qkv writes itself", fn, ST_NAME_SHOWN, k,
                             ST_CRC_PREFIX, ST_HEADER_CRC_KEY), false;
        pairs[i].key = k;
        pairs[i].value = v;
    }
    qsort(pairs, (size_t)n_metadata, sizeof *pairs, pair_by_key);
    for (int i = 1; i < n_metadata; i++)
        if (strcmp(pairs[i - 1].key, pairs[i].key) == 0)
            return qkv_fail_(ctx, QKV_ERR_ARG, "%s: the metadata key '%.*s' is given twice", fn,
                             ST_NAME_SHOWN, pairs[i].key), false;
    return true;
}

static cJSON *raw_uint(uint64_t v) {
    char buf[24];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    return cJSON_CreateRaw(buf);
}

static bool add_uint(cJSON *array, uint64_t v) {
    cJSON *item = raw_uint(v);
    if (!item) return false;
    if (!cJSON_AddItemToArray(array, item)) {
        cJSON_Delete(item);
        return false;
    }
    return true;
}

/* The header JSON (unformatted, from cJSON's allocator), or NULL on out-of-memory. */
static char *build_header(const qkv_named_tensor *const *order, int n, const st_pair *pairs, int n_metadata) {
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    if (ok && n_metadata > 0) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        ok = meta != NULL;
        for (int i = 0; ok && i < n_metadata; i++)
            ok = cJSON_AddStringToObject(meta, pairs[i].key, pairs[i].value);
    }
    uint64_t offset = 0;
    for (int i = 0; ok && i < n; i++) {
        const qkv_tensor *t = order[i]->tensor;
        uint64_t bytes = (uint64_t)t->numel * qkv_dtype_size(t->dtype);
        cJSON *entry = cJSON_AddObjectToObject(root, order[i]->name);
        cJSON *shape = entry ? cJSON_CreateArray() : NULL, *offsets = NULL;
        ok = shape && cJSON_AddStringToObject(entry, "dtype", dtype_tag(t->dtype)) &&
             cJSON_AddItemToObject(entry, "shape", shape);
        if (!ok) {
            cJSON_Delete(shape);
            break;
        }
        for (int d = 0; ok && d < t->ndim; d++) ok = add_uint(shape, (uint64_t)t->shape[d]);
        offsets = ok ? cJSON_CreateArray() : NULL;
        ok = offsets && cJSON_AddItemToObject(entry, "data_offsets", offsets);
        if (!ok) {
            cJSON_Delete(offsets);
            break;
        }
        ok = add_uint(offsets, offset) && add_uint(offsets, offset + bytes);
        offset += bytes;
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return text;
}

qkv_status qkv_safetensors_save(qkv_ctx *ctx, const char *path, const qkv_named_tensor *tensors, int n,
                                const char *const *metadata, int n_metadata) {
    const char *fn = "qkv_safetensors_save";
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!path) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: path is NULL", fn);
    if (n < 0 || n_metadata < 0)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: n = %d and n_metadata = %d must be >= 0", fn, n, n_metadata);
    if (n > 0 && !tensors) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: tensors is NULL but n = %d", fn, n);
    if (n_metadata > 0 && !metadata)
        return qkv_failc_(ctx, QKV_ERR_NULL, "%s: metadata is NULL but n_metadata = %d", fn, n_metadata);

    /* pairs: the caller's metadata, then one checksum per tensor ("qkv.crc32.<name>": 8 hex digits) */
    const qkv_named_tensor **order = qkv_raw_malloc_(ctx, (size_t)n * sizeof *order);
    st_pair *pairs = qkv_raw_malloc_(ctx, ((size_t)n_metadata + (size_t)n + 1) * sizeof *pairs);
    qkv_crc32_table_ *table = qkv_raw_malloc_(ctx, sizeof *table);
    char *json = NULL, *crc_text = NULL;
    if (!order || !pairs || !table) {
        qkv_fail_(ctx, QKV_ERR_NOMEM, "%s: out of memory for %d names", fn, n + n_metadata);
        goto done;
    }
    if (!check_save_args(ctx, fn, tensors, n, metadata, n_metadata, order, pairs)) goto done;
    size_t crc_bytes = 0;
    bool sized = true;
    for (int i = 0; i < n; i++)
        sized &= qkv_add_size_(crc_bytes, strlen(order[i]->name) + ST_CRC_PREFIX_LEN + 1 + 9, &crc_bytes);
    if (!sized || !(crc_text = qkv_raw_malloc_(ctx, crc_bytes ? crc_bytes : 1))) {
        qkv_fail_(ctx, QKV_ERR_NOMEM, "%s: out of memory for %d checksums", fn, n);
        goto done;
    }
    qkv_crc32_init_(table);
    char *c = crc_text;
    for (int i = 0; i < n; i++) {
        const qkv_tensor *t = order[i]->tensor;
        size_t klen = strlen(order[i]->name) + ST_CRC_PREFIX_LEN + 1;
        uint32_t crc = qkv_crc32_(table, 0, t->data, (size_t)t->numel * qkv_dtype_size(t->dtype));
        snprintf(c, klen, "%s%s", ST_CRC_PREFIX, order[i]->name);
        snprintf(c + klen, 9, "%08x", (unsigned)crc);
        pairs[n_metadata + i] = (st_pair){c, c + klen};
        c += klen + 9;
    }
    pairs[n_metadata + n] = (st_pair){ST_HEADER_CRC_KEY, "00000000"}; /* its digits are patched in below */
    int n_pairs = n_metadata + n + 1;
    qsort(pairs, (size_t)n_pairs, sizeof *pairs, pair_by_key);

    /* offsets are JSON numbers: keep them exact (2^53 bytes is 8 PiB, far beyond any checkpoint) */
    uint64_t data_bytes = 0;
    for (int i = 0; i < n; i++) {
        data_bytes += (uint64_t)order[i]->tensor->numel * qkv_dtype_size(order[i]->tensor->dtype);
        if (data_bytes > (uint64_t)ST_INT_MAX) {
            qkv_fail_(ctx, QKV_ERR_OVERFLOW, "%s: the tensors hold more than 2^53 bytes", fn);
            goto done;
        }
    }
    json = build_header(order, n, pairs, n_pairs);
    if (!json) {
        qkv_fail_(ctx, QKV_ERR_NOMEM, "%s: out of memory building the JSON header", fn);
        goto done;
    }
    size_t len = strlen(json), pad = (8 - len % 8) % 8;
    unsigned char prefix[8];
    qkv_put_le64_(prefix, (uint64_t)(len + pad));
    static const char spaces[8] = "        ";
    // the header checksum: CRC-32 of the size, the JSON (its own digits "00000000") and the padding
    char *digits = strstr(json, ST_HEADER_CRC_LITERAL);
    if (!digits || strstr(digits + 1, ST_HEADER_CRC_LITERAL)) { /* cJSON writes keys as given, unescaped */
        qkv_fail_(ctx, QKV_ERR_STATE, "%s: the header checksum could not be placed in the JSON", fn);
        goto done;
    }
    digits += sizeof ST_HEADER_CRC_LITERAL - 1;
    uint32_t header_crc = qkv_crc32_(table, 0, prefix, sizeof prefix);
    header_crc = qkv_crc32_(table, header_crc, json, len);
    header_crc = qkv_crc32_(table, header_crc, spaces, pad);
    char hex[9];
    snprintf(hex, sizeof hex, "%08x", (unsigned)header_crc);
    memcpy(digits, hex, 8);

    qkv_writer_ w;
    if (!qkv_writer_open_(ctx, &w, fn, path)) goto done;
    qkv_writer_write_(&w, prefix, sizeof prefix);
    qkv_writer_write_(&w, json, len);
    qkv_writer_write_(&w, spaces, pad);
    for (int i = 0; i < n; i++) {
        const qkv_tensor *t = order[i]->tensor;
        qkv_writer_write_(&w, t->data, (size_t)t->numel * qkv_dtype_size(t->dtype));
    }
    qkv_writer_commit_(&w);
done:
    cJSON_free(json);
    qkv_raw_free_(ctx, order);
    qkv_raw_free_(ctx, pairs);
    qkv_raw_free_(ctx, table);
    qkv_raw_free_(ctx, crc_text);
    return ctx->status;
}
