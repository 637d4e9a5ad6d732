/* SHA-256 through OpenSSL's EVP interface: streaming (as a file is
 * written), of a buffer, and of a whole open file. Digests are written as
 * 64 lowercase hex characters plus a NUL. */
#ifndef TERN_UTIL_SHA256_H
#define TERN_UTIL_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "tern.h"

struct tern_progress;

typedef struct tern_sha256 {
    void *ctx;                   /* EVP_MD_CTX */
} tern_sha256;

int tern_sha256_init(tern_sha256 *s, tern_error *err);
void tern_sha256_update(tern_sha256 *s, const void *data, size_t n);
/* Writes the digest and frees the context (init again to reuse). */
void tern_sha256_final(tern_sha256 *s, char hex[65]);
/* Frees the context without a digest (error paths). */
void tern_sha256_discard(tern_sha256 *s);

int tern_sha256_buf(const void *data, size_t n, char hex[65], tern_error *err);
/* Hashes fd from offset 0 to its end; *size gets the bytes read. `name`
 * only labels errors; bar (may be NULL) advances by the bytes read. The
 * file's pages are dropped from the page cache afterwards: hashing a 20 GB
 * model must not leave it cached. */
int tern_sha256_fd(int fd, const char *name, struct tern_progress *bar, uint64_t *size, char hex[65],
                   tern_error *err);

/* 1 if s is 64 lowercase hex characters. */
int tern_sha256_hex_ok(const char *s);

#endif
