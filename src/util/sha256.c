#include "util/sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/err.h"
#include "util/progress.h"

int tern_sha256_init(tern_sha256 *s, tern_error *err) {
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c || EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(c);
        s->ctx = NULL;
        return tern_fail(err, "SHA-256: cannot initialise the OpenSSL digest");
    }
    s->ctx = c;
    return 0;
}

void tern_sha256_update(tern_sha256 *s, const void *data, size_t n) {
    if (n) EVP_DigestUpdate(s->ctx, data, n);
}

void tern_sha256_final(tern_sha256 *s, char hex[65]) {
    unsigned char md[32];
    unsigned int len = 0;
    EVP_DigestFinal_ex(s->ctx, md, &len);
    for (int i = 0; i < 32; i++) {
        static const char digits[] = "0123456789abcdef";
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[64] = '\0';
    tern_sha256_discard(s);
}

void tern_sha256_discard(tern_sha256 *s) {
    EVP_MD_CTX_free(s->ctx);
    s->ctx = NULL;
}

int tern_sha256_buf(const void *data, size_t n, char hex[65], tern_error *err) {
    tern_sha256 s;
    if (tern_sha256_init(&s, err) != 0) return -1;
    tern_sha256_update(&s, data, n);
    tern_sha256_final(&s, hex);
    return 0;
}

int tern_sha256_fd(int fd, const char *name, struct tern_progress *bar, uint64_t *size, char hex[65],
                   tern_error *err) {
    enum { CHUNK = 8 << 20 };
    unsigned char *buf = malloc(CHUNK);
    tern_sha256 s;
    if (!buf) return tern_fail(err, "%s: out of memory", name);
    if (tern_sha256_init(&s, err) != 0) { free(buf); return -1; }
    uint64_t total = 0;
    for (;;) {
        ssize_t n = pread(fd, buf, CHUNK, (off_t)total);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            tern_sha256_discard(&s);
            free(buf);
            return tern_fail(err, "%s: read failed: %s", name, strerror(e));
        }
        if (n == 0) break;
        tern_sha256_update(&s, buf, (size_t)n);
        total += (uint64_t)n;
        tern_progress_add(bar, (uint64_t)n);
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    free(buf);
    tern_sha256_final(&s, hex);
    if (size) *size = total;
    return 0;
}

int tern_sha256_hex_ok(const char *s) {
    if (!s || strlen(s) != 64) return 0;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}
