/*
 * fileio.h — what the .npy and safetensors code shares: an atomic file writer, a bounded whole-file
 * reader, little-endian byte helpers, and a UTF-8 check. Internal (tests include it to inject faults).
 *
 * Atomic write, step by step:
 *   0. remove the temporaries that earlier saves of this target left when their process died: files
 *      "<path>.tmp.<host>.<pid>.<n>" of this host whose pid is no live process and whose lock nobody holds,
 *   1. open "<path>.tmp.<host>.<pid>.<n>" in the target's directory (O_CREAT | O_EXCL, mode 0666 & ~umask)
 *      and take an flock on it, held until it is closed (<host> is gethostname with '/' and '.' as '_'),
 *   2. write every byte (short writes and EINTR are retried),
 *   3. fsync the file, close it,
 *   4. rename it over the target (atomic on POSIX file systems: a reader sees the old file or the new),
 *   5. fsync the directory, so the rename itself survives a crash.
 * A failure in 1-4 removes the temporary file and leaves any old target untouched; every failure is
 * QKV_ERR_IO with the function, the path and strerror(errno). (A failure in 5 is reported too, though
 * the new file is then already in place.) Only a regular file or a missing path is replaced: a
 * device, FIFO, socket or directory at the target (also behind a symlink) is refused, at step 1 and
 * again just before step 4, and left as it was. A symlink to a regular file is itself replaced by
 * the new regular file (the file it pointed to is untouched).
 */
#ifndef QKV_FILEIO_H
#define QKV_FILEIO_H

#include "qkv_internal.h"

#include <sys/types.h>

/* The files qkv writes are little-endian; so is every machine it has been built for. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "qkv's file formats assume a little-endian host");

/* ---- fault injection ----------------------------------------------------------------------------- */

/* The system calls the atomic writer makes, replaceable so tests can fail each one in turn. The
 * defaults call write(2), fsync(2) and rename(2). fsync is called for the file and then for its
 * directory. A replacement sets errno when it fails, as the real call would. */
typedef struct qkv_fileio_hooks_ {
    ssize_t (*write)(int fd, const void *buf, size_t count);
    int (*fsync)(int fd);
    int (*rename)(const char *from, const char *to);
} qkv_fileio_hooks_;

/* Install hooks (any NULL member keeps the default); NULL restores every default. Process-wide and
 * not thread-safe: for tests. */
void qkv_fileio_set_hooks_(const qkv_fileio_hooks_ *hooks);

/* ---- atomic writer ------------------------------------------------------------------------------- */

typedef struct qkv_writer_ {
    qkv_ctx *ctx;
    const char *fn;   /* public function, for messages */
    const char *path; /* target                        */
    char *tmp;        /* temporary path (context allocator), NULL once released */
    int fd;           /* -1 once closed                */
    bool failed;      /* an error is stored; later writes are no-ops, commit aborts */
} qkv_writer_;

/* Create the temporary file. false (error stored, nothing left behind) on failure. */
bool qkv_writer_open_(qkv_ctx *ctx, qkv_writer_ *w, const char *fn, const char *path);
/* Append size bytes. On failure stores the error and marks the writer failed (returns false); later
 * writes do nothing, so a caller can write everything and check once, at commit. */
bool qkv_writer_write_(qkv_writer_ *w, const void *data, size_t size);
/* fsync, close, rename over the target, fsync the directory. Releases the writer in every case;
 * on any failure (now or in an earlier write) the temporary file is removed. Returns the status. */
qkv_status qkv_writer_commit_(qkv_writer_ *w);
/* Give up: close and remove the temporary file, release the writer. No error is stored. */
void qkv_writer_abort_(qkv_writer_ *w);

/* ---- reading ------------------------------------------------------------------------------------- */

/* Read the whole file at path into a buffer from the context's allocator (release it with
 * qkv_raw_free_). Only a regular file is read: the path is opened with O_NONBLOCK (so a FIFO without
 * a writer cannot block the open), the descriptor is fstat'ed, anything but a regular file (FIFO,
 * device such as /dev/zero, socket, directory) is refused with QKV_ERR_IO naming what it is, and
 * O_NONBLOCK is cleared. At most the fstat size is read, so a growing file cannot make the read run
 * on. A file larger than max_size is refused (QKV_ERR_FORMAT) before anything is allocated; OS
 * failures are QKV_ERR_IO with the path and strerror(errno). */
bool qkv_read_file_(qkv_ctx *ctx, const char *fn, const char *path, size_t max_size,
                    unsigned char **data, size_t *size);

/* Files above this are refused by the loaders (a sanity bound on st_size, not a policy). */
#define QKV_FILE_MAX ((size_t)1 << 40)

/* ---- bytes --------------------------------------------------------------------------------------- */

static inline uint64_t qkv_le64_(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static inline void qkv_put_le64_(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* ---- checksums ----------------------------------------------------------------------------------- */

/* CRC-32 as zlib, gzip, PNG and Python's zlib.crc32 compute it (reflected polynomial 0xEDB88320,
 * initial and final XOR 0xFFFFFFFF; crc32(b"123456789") == 0xCBF43926), slicing by 8. The tables
 * are built per use (8 KiB, about 2^14 operations), so there is no global state to initialise. */
typedef struct qkv_crc32_table_ {
    uint32_t t[8][256];
} qkv_crc32_table_;
void qkv_crc32_init_(qkv_crc32_table_ *table);
/* The CRC of data[0..size) continued from crc (0 to start). */
uint32_t qkv_crc32_(const qkv_crc32_table_ *table, uint32_t crc, const void *data, size_t size);

/* ---- quoting file content in messages ------------------------------------------------------------- */

/* Untrusted bytes s[0..n) made safe to print: printable ASCII as it is, a backslash as "\\", every
 * other byte (control bytes, DEL, and the bytes of non-ASCII UTF-8) as "\xNN"; at most
 * QKV_QUOTE_MAX bytes of s, then "...". Every message that quotes a file's header goes through it,
 * so a crafted name cannot put terminal escapes or line breaks into an error message. */
#define QKV_QUOTE_MAX 64
typedef struct qkv_quoted_ {
    char s[4 * QKV_QUOTE_MAX + 4];
} qkv_quoted_;
qkv_quoted_ qkv_quote_(const char *s, size_t n);
/* For use as a "%s" argument (the buffer lives until the end of the full expression). */
#define QKV_QUOTE(str, n) (qkv_quote_((str), (n)).s)
#define QKV_QUOTE_STR(str) (qkv_quote_((str), strlen(str)).s)

/* True when s[0..n) is well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF). */
bool qkv_utf8_valid_(const unsigned char *s, size_t n);

#endif /* QKV_FILEIO_H */
