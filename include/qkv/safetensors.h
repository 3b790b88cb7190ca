/*
 * qkv/safetensors.h — checkpoints in the safetensors format (included by qkv.h).
 *
 * A safetensors file is: an 8-byte little-endian header size N, N bytes of JSON, then the tensors'
 * bytes back to back. The JSON maps each name to {"dtype": "F32", "shape": [2, 3], "data_offsets":
 * [begin, end]} (offsets into the data part), plus an optional "__metadata__" object of string values.
 * PyTorch users read these files with safetensors.torch.load_file; NumPy users with
 * safetensors.numpy.load_file.
 *
 * qkv writes F32, F64, I32 and U8 (its four dtypes), tensors ordered by element size then name so
 * every tensor's data is aligned to its element size, the header padded with spaces to a multiple of
 * 8, atomically (temporary file, fsync, rename, as .npy). It reads the same four dtypes, and two more
 * where the conversion is exact: I64 (torch.long, NumPy's int64) as I32 when every value fits in int32
 * (else QKV_ERR_FORMAT naming the entry, the first value that does not fit, its index and the fix,
 * t.to(torch.int32) / ids.astype(np.int32)), and BOOL as U8 0/1 (a byte other than 0 or 1 is
 * QKV_ERR_FORMAT). Other dtypes (F16, BF16, I16, U32, ...) are refused with the call that converts
 * them. It treats the file as untrusted, with the checks of the reference implementation: header
 * size at most 100,000,000 bytes, UTF-8 JSON object, every entry with a dtype string, a shape of
 * integers and two data offsets, offsets sorted, contiguous from 0 and ending exactly at the end of
 * the file, shape times dtype size equal to each byte range, checked arithmetic; qkv also refuses
 * duplicate names, unknown keys in an entry, more than 4 dimensions and a __metadata__ that is not a
 * string->string map. Every refusal is QKV_ERR_FORMAT naming the function, the path (or "buffer")
 * and the problem; names, dtypes and metadata quoted from the file are escaped (\xNN for anything
 * but printable ASCII, at most 64 bytes).
 *
 * Checksums: qkv_safetensors_save adds one metadata entry per tensor, "qkv.crc32.<name>": the CRC-32
 * of the tensor's bytes as written, as 8 lowercase hex digits (zlib's CRC-32: in Python,
 * "%08x" % zlib.crc32(bytes)), and one for the header, "qkv.header_crc32": the CRC-32 of the 8-byte size and
 * the whole header as written (JSON and padding) with these 8 digits read as "00000000" (in Python:
 * zlib.crc32(b[:8 + n].replace(b'"qkv.header_crc32":"' + digits, b'"qkv.header_crc32":"00000000"'))), so
 * every metadata value, name, shape and offset is covered. Readers that ignore metadata (PyTorch, NumPy)
 * read the file as before. On load: the header checksum is checked when present (it must appear once, as
 * written, in lowercase); once a file has any checksum, every tensor must have one; and every tensor
 * checksum is checked. A mismatch (a flipped bit, a truncated copy, an edit), a malformed checksum, one for
 * a tensor the file does not hold, a tensor without one, a raw control byte in the header, or a key one byte
 * away from "qkv.header_crc32" (what a damaged byte leaves of it) is QKV_ERR_FORMAT naming what failed and
 * the file: no single changed byte of a header qkv wrote loads (tests/test_files.c changes every bit of a
 * checkpoint's header, and every byte of a small file's to all 255 other values). A file without checksums
 * (written by PyTorch) loads unchecked; a file with tensor checksums and no header checksum (what qkv wrote
 * before 0.1.0 checked headers) loads with its tensors checked and its header not. The checksums are not
 * among the metadata a loaded handle lists, and a caller's key starting with "qkv.crc32.", the key
 * "qkv.header_crc32", and keys one byte from it are refused on save (QKV_ERR_ARG).
 *
 * Files: only regular files are read (a FIFO, a device such as /dev/zero, a socket or a directory is
 * QKV_ERR_IO naming what it is; the open never blocks), and only a missing path or a regular file
 * (also behind a symlink) is replaced on save: a device, FIFO or directory at the target is QKV_ERR_IO
 * and left in place. The same holds for qkv_npy_load / qkv_npy_save and the model checkpoints.
 *
 * Weight layout: qkv stores a projection's weight as [d_in, d_out] (Y = X W + b, see qkv_projection);
 * PyTorch's nn.Linear stores [d_out, d_in] (y = x W^T + b). Transpose when moving weights across:
 *
 *     from safetensors.torch import load_file          # the file qkv_safetensors_save wrote
 *     sd = load_file("model.safetensors")
 *     lin = torch.nn.Linear(d_in, d_out)
 *     with torch.no_grad():
 *         lin.weight.copy_(sd["W"].T)                  # [d_in, d_out] -> [d_out, d_in]
 *         lin.bias.copy_(sd["b"])
 *
 * tests/tools/load_in_torch.py is this snippet's tested twin (standard library + torch.frombuffer).
 */
#ifndef QKV_SAFETENSORS_H
#define QKV_SAFETENSORS_H

#include "../qkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor to save and the name it is saved under (any non-empty UTF-8 but "__metadata__"). */
typedef struct qkv_named_tensor {
    const char *name;
    const qkv_tensor *tensor;
} qkv_named_tensor;

/* A loaded checkpoint: its tensors (persistent, owned by the handle) and its metadata. */
typedef struct qkv_safetensors qkv_safetensors;

/* Write n tensors (names unique) and n_metadata key/value pairs to path. metadata holds
 * 2 * n_metadata strings: key0, value0, key1, value1, ... (keys unique; NULL when n_metadata is 0).
 * The file is complete or absent: a failure leaves any previous file at path as it was. */
QKV_API qkv_status qkv_safetensors_save(qkv_ctx *ctx, const char *path, const qkv_named_tensor *tensors,
                                        int n, const char *const *metadata, int n_metadata);

/* Read a checkpoint. NULL (error stored) on failure. The tensors are persistent allocations of ctx;
 * qkv_safetensors_free releases them (and qkv_ctx_free does, if the handle is never freed); a handle
 * given to qkv_safetensors_free with another context than the one that loaded it is refused (QKV_ERR_ARG
 * on that context, nothing freed). */
QKV_API qkv_safetensors *qkv_safetensors_load(qkv_ctx *ctx, const char *path);
QKV_API qkv_safetensors *qkv_safetensors_load_mem(qkv_ctx *ctx, const void *bytes, size_t size);
QKV_API void qkv_safetensors_free(qkv_ctx *ctx, qkv_safetensors *st);

/* Tensors in name order (strcmp): the i-th name, and a tensor by name (NULL, no error, if absent).
 * Out-of-range i gives NULL. */
QKV_API int qkv_safetensors_count(const qkv_safetensors *st);
QKV_API const char *qkv_safetensors_name(const qkv_safetensors *st, int i);
QKV_API const qkv_tensor *qkv_safetensors_get(const qkv_safetensors *st, const char *name);

/* Copy the tensor called name into dst (a parameter, an optimizer moment, ...). Its dtype and shape
 * must equal dst's: a missing name is QKV_ERR_ARG, a different dtype QKV_ERR_DTYPE, a different
 * shape QKV_ERR_SHAPE, each with both shapes in the message. */
QKV_API qkv_status qkv_safetensors_copy_into(qkv_ctx *ctx, const qkv_safetensors *st, const char *name,
                                             qkv_tensor *dst);

/* Metadata in key order: how many pairs, the i-th key, and a value by key (NULL if absent). */
QKV_API int qkv_safetensors_metadata_count(const qkv_safetensors *st);
QKV_API const char *qkv_safetensors_metadata_key(const qkv_safetensors *st, int i);
QKV_API const char *qkv_safetensors_metadata(const qkv_safetensors *st, const char *key);

#ifdef __cplusplus
}
#endif

#endif /* QKV_SAFETENSORS_H */
