#include "server/pcdisk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"
#include "util/file.h"
#include "util/sha256.h"

struct pcdisk {
    char *dir;
    const tern_model *m;
    char id[65];                 /* tern_model_identity: every file name starts with it */
};

int pcdisk_check_dir(const char *dir, tern_error *err) {
    struct stat st;
    if (!*dir) return tern_fail(err, "an empty directory name");
    if (mkdir(dir, 0700) && errno != EEXIST) return tern_fail(err, "'%s' cannot be created: %s", dir, strerror(errno));
    if (stat(dir, &st)) return tern_fail(err, "'%s': %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return tern_fail(err, "'%s' is not a directory", dir);
    if (access(dir, W_OK | X_OK)) return tern_fail(err, "'%s' is not writable", dir);
    return 0;
}

void pcdisk_sweep(pcdisk *d, int (*keep)(void *ud, pcdisk_key k), void *ud) {
    DIR *dp = opendir(d->dir);
    if (!dp) return;
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (strncmp(e->d_name, d->id, 64) || e->d_name[64] != '-') continue;
        unsigned long long hash, serial;
        int end = 0;
        /* a checkpoint's file exactly as path_of names it; anything else
         * of this model's (the index, a temporary) goes */
        if (keep && sscanf(e->d_name + 65, "%16llx-%llu.snap%n", &hash, &serial, &end) == 2 &&
            e->d_name[65 + end] == '\0' && keep(ud, (pcdisk_key){hash, serial}))
            continue;
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", d->dir, e->d_name) < (int)sizeof path) unlink(path);
    }
    closedir(dp);
}

/* Files of this model that another process left, with no index read. */
static void remove_stale(pcdisk *d) { pcdisk_sweep(d, NULL, NULL); }

pcdisk *pcdisk_open(const char *dir, const tern_model *m, tern_error *err) {
    if (pcdisk_check_dir(dir, err)) return NULL;
    pcdisk *d = calloc(1, sizeof *d);
    if (!d || !(d->dir = strdup(dir))) {
        free(d);
        tern_fail(err, "out of memory");
        return NULL;
    }
    d->m = m;
    if (tern_model_identity(m, d->id, err)) {
        pcdisk_close(d);
        return NULL;
    }
    return d;
}

int pcdisk_matches(const pcdisk *d, const tern_model *m, tern_error *err) {
    char id[65];
    if (tern_model_identity(m, id, err)) return -1;
    return strcmp(id, d->id) == 0;
}

int pcdisk_rebind(pcdisk *d, const tern_model *m, tern_error *err) {
    d->m = m;
    if (!m) return 0;
    char id[65];
    if (tern_model_identity(m, id, err)) return -1;
    if (strcmp(id, d->id) == 0) return 0;
    memcpy(d->id, id, sizeof id);
    remove_stale(d);
    return 0;
}

void pcdisk_close(pcdisk *d) {
    if (!d) return;
    free(d->dir);
    free(d);
}

uint64_t pcdisk_hash(const int32_t *t, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) {
        uint32_t v = (uint32_t)t[i];
        for (int b = 0; b < 4; b++) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
    }
    return h;
}

static int path_of(const pcdisk *d, pcdisk_key k, const char *suffix, char *out, size_t cap) {
    int n = snprintf(out, cap, "%s/%s-%016llx-%llu.snap%s", d->dir, d->id, (unsigned long long)k.hash,
                     (unsigned long long)k.serial, suffix);
    return n > 0 && (size_t)n < cap ? 0 : -1;
}

/* The bytes to a temporary file, synced, then renamed over the name: a
 * crash leaves the old file or the new one, never a part. */
int pcdisk_write(pcdisk *d, pcdisk_key k, const tern_snapshot *snap, size_t *bytes, tern_error *err) {
    char tmp[4096], path[4096];
    if (path_of(d, k, ".tmp", tmp, sizeof tmp) || path_of(d, k, "", path, sizeof path))
        return tern_fail(err, "the cache directory's name is too long");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        tern_fail(err, "%s: %s", tmp, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    int rc = tern_snapshot_write(snap, f, err);
    long size = rc == 0 ? ftell(f) : -1;
    if (rc == 0 && (fflush(f) || fsync(fd) || size < 0)) rc = tern_fail(err, "%s: %s", tmp, strerror(errno));
    if (fclose(f) && rc == 0) rc = tern_fail(err, "%s: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path)) rc = tern_fail(err, "%s: %s", path, strerror(errno));
    if (rc) unlink(tmp);
    else *bytes = (size_t)size;
    return rc;
}

tern_snapshot *pcdisk_read(pcdisk *d, pcdisk_key k, const tern_snapshot *base, tern_error *err) {
    char path[4096];
    if (path_of(d, k, "", path, sizeof path)) {
        tern_fail(err, "the cache directory's name is too long");
        return NULL;
    }
    FILE *f = fopen(path, "rbe");
    if (!f) {
        tern_fail(err, "%s: %s", path, strerror(errno));
        return NULL;
    }
    tern_snapshot *s = tern_snapshot_read(d->m, f, base, err);
    /* bytes after the checksum: not the file that was written */
    if (s && fgetc(f) != EOF) {
        tern_snapshot_free(s);
        s = NULL;
        tern_fail(err, "%s: longer than its snapshot", path);
    }
    fclose(f);
    return s;
}

void pcdisk_remove(pcdisk *d, pcdisk_key k) {
    char path[4096];
    if (path_of(d, k, "", path, sizeof path) == 0) unlink(path);
}

/* ---- the index ----------------------------------------------------------
 * "TERNPCIX", version, entry count, the model identity; per entry its
 * serial, path hash, base serial, file size, shares flag, token count and
 * token ids (host byte order: the index is read on the machine that wrote
 * it); then the SHA-256 (hex) of all bytes before it. */

#define INDEX_MAGIC "TERNPCIX"
#define INDEX_VERSION 1u
#define INDEX_MAX ((size_t)1 << 32)

static int index_path(const pcdisk *d, const char *suffix, char *out, size_t cap) {
    int n = snprintf(out, cap, "%s/%s-index%s", d->dir, d->id, suffix);
    return n > 0 && (size_t)n < cap ? 0 : -1;
}

static void put(FILE *f, const void *p, size_t n) { fwrite(p, 1, n, f); }

int pcdisk_write_index(pcdisk *d, const pcdisk_entry *e, int n, tern_error *err) {
    char *buf = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&buf, &len);
    if (!mf) return tern_fail(err, "out of memory");
    uint32_t version = INDEX_VERSION, count = (uint32_t)n;
    put(mf, INDEX_MAGIC, 8);
    put(mf, &version, 4);
    put(mf, &count, 4);
    put(mf, d->id, 64);
    for (int i = 0; i < n; i++) {
        uint64_t w[4] = {e[i].key.serial, e[i].key.hash, e[i].base, e[i].bytes};
        uint32_t h[2] = {(uint32_t)e[i].shares, (uint32_t)e[i].n};
        put(mf, w, sizeof w);
        put(mf, h, sizeof h);
        put(mf, e[i].tokens, (size_t)e[i].n * sizeof *e[i].tokens);
    }
    if (fclose(mf)) {
        free(buf);
        return tern_fail(err, "out of memory");
    }
    char hex[65], tmp[4096], path[4096];
    int rc = tern_sha256_buf(buf, len, hex, err);
    if (rc == 0 && (index_path(d, ".tmp", tmp, sizeof tmp) || index_path(d, "", path, sizeof path)))
        rc = tern_fail(err, "the cache directory's name is too long");
    int fd = rc == 0 ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
    if (rc == 0 && fd < 0) rc = tern_fail(err, "%s: %s", tmp, strerror(errno));
    if (rc == 0 && (write(fd, buf, len) != (ssize_t)len || write(fd, hex, 64) != 64 || fsync(fd)))
        rc = tern_fail(err, "%s: %s", tmp, strerror(errno));
    if (fd >= 0 && close(fd) && rc == 0) rc = tern_fail(err, "%s: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path)) rc = tern_fail(err, "%s: %s", path, strerror(errno));
    if (rc && fd >= 0) unlink(tmp);
    free(buf);
    return rc;
}

/* The whole index file into memory, its checksum verified: *len bytes
 * before the checksum. NULL and *len 0 when there is none. */
static uint8_t *read_index(const pcdisk *d, size_t *len, tern_error *err) {
    char path[4096], *text;
    size_t size;
    *len = 0;
    if (index_path(d, "", path, sizeof path) || !tern_file_exists(path)) return NULL;
    if (tern_file_read(path, O_NOFOLLOW, INDEX_MAX, &text, &size, err)) return NULL;
    uint8_t *buf = (uint8_t *)text;
    size_t n = size - 64;
    char hex[65];
    const char *why = NULL;
    if (size < 80 + 64) why = "too short for an index";
    else if (tern_sha256_buf(buf, n, hex, err)) why = err->msg;
    else if (memcmp(hex, buf + n, 64)) why = "its checksum does not match (a damaged file)";
    else if (memcmp(buf, INDEX_MAGIC, 8) || memcmp(buf + 16, d->id, 64)) why = "not this model's index";
    if (why) {
        tern_fail(err, "%s: %s", path, why);
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* The entries fill the index's bytes exactly, each with at least one token. */
static int index_sound(const uint8_t *buf, size_t len, uint32_t count) {
    size_t off = 80;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t h[2];
        if (len - off < 40) return 0;
        memcpy(h, buf + off + 32, sizeof h);
        if (h[1] < 1 || h[1] > (len - off - 40) / 4) return 0;
        off += 40 + (size_t)h[1] * 4;
    }
    return off == len;
}

/* The entry's file is there at its recorded size, and its path hashes to
 * its name. */
static int entry_ok(const pcdisk *d, const pcdisk_entry *e) {
    char path[4096];
    struct stat st;
    return pcdisk_hash(e->tokens, e->n) == e->key.hash && path_of(d, e->key, "", path, sizeof path) == 0 &&
           stat(path, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == e->bytes;
}

int pcdisk_read_index(pcdisk *d, pcdisk_entry_fn fn, void *ud, tern_error *err) {
    size_t len;
    err->msg[0] = '\0';
    uint8_t *buf = read_index(d, &len, err);
    if (!buf) return err->msg[0] ? -1 : 0;
    uint32_t version, count;
    memcpy(&version, buf + 8, 4);
    memcpy(&count, buf + 12, 4);
    if (version != INDEX_VERSION) {
        free(buf);
        return tern_fail(err, "the prefix cache's index has version %u, this tern reads %u", version, INDEX_VERSION);
    }
    if (!index_sound(buf, len, count)) {
        free(buf);
        return tern_fail(err, "the prefix cache's index is malformed");
    }
    int passed = 0;
    size_t off = 80;
    for (uint32_t i = 0; i < count; i++) {
        uint64_t w[4];
        uint32_t h[2];
        memcpy(w, buf + off, sizeof w);
        memcpy(h, buf + off + 32, sizeof h);
        int32_t *tokens = malloc((size_t)h[1] * sizeof *tokens);
        if (!tokens) break;
        memcpy(tokens, buf + off + 40, (size_t)h[1] * sizeof *tokens);
        off += 40 + (size_t)h[1] * 4;
        pcdisk_entry e = {{w[1], w[0]}, w[2], w[3], h[0] != 0, (int)h[1], tokens};
        int stop = 0;
        if (entry_ok(d, &e)) {
            stop = fn(ud, &e);
            passed++;
        }
        free(tokens);
        if (stop) break;
    }
    free(buf);
    return passed;
}
