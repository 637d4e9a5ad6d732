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

/* Files of this model that a previous process left: the tree that named
 * them is gone, so nothing could find them again. */
static void remove_stale(pcdisk *d) {
    DIR *dp = opendir(d->dir);
    if (!dp) return;
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (strncmp(e->d_name, d->id, 64) || e->d_name[64] != '-') continue;
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", d->dir, e->d_name) < (int)sizeof path) unlink(path);
    }
    closedir(dp);
}

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
    remove_stale(d);
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
