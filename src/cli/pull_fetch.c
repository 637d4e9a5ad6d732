/* tern pull: fetching files, a few at a time. Each file is written as
 * NAME.incomplete, hashed as it arrives (a resumed one rehashes what it
 * holds first), and takes its name only once its SHA-256 (LFS) or git blob
 * id (a plain file) matches the hub's. */
#include "cli/pull.h"
#include "util/path.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"
#include "util/progress.h"
#include "util/sha256.h"

#define READ_CHUNK ((size_t)1 << 20)

/* ---- progress ----------------------------------------------------------- */

static void progress_add(pull_job *j, int64_t n) {
    pthread_mutex_lock(&j->mu);
    j->done_bytes = n < 0 && (uint64_t)-n > j->done_bytes ? 0 : j->done_bytes + (uint64_t)n;
    tern_progress_set(j->bar, j->done_bytes);
    pthread_mutex_unlock(&j->mu);
}

/* ---- the bytes of one file: on disk, hashed ----------------------------- */

typedef struct fetch {
    pull_job *j;
    const pull_file *f;
    int fd;
    uint64_t pos;
    tern_sha256 sha;
    EVP_MD_CTX *git;             /* the git blob id, for a plain file */
    char label[4200];
} fetch;

static int hash_start(fetch *x, tern_error *err) {
    if (tern_sha256_init(&x->sha, err) != 0) return -1;
    if (!x->f->meta.git_sha1[0]) return 0;
    char head[48];
    int n = snprintf(head, sizeof head, "blob %" PRIu64, x->f->meta.size);
    if (!(x->git = EVP_MD_CTX_new()) || EVP_DigestInit_ex(x->git, EVP_sha1(), NULL) != 1 ||
        EVP_DigestUpdate(x->git, head, (size_t)n + 1) != 1) {
        tern_sha256_discard(&x->sha);
        return tern_fail(err, "SHA-1 is not available from OpenSSL");
    }
    return 0;
}

static void hash_update(fetch *x, const void *data, size_t n) {
    tern_sha256_update(&x->sha, data, n);
    if (x->git) EVP_DigestUpdate(x->git, data, n);
}

static void hash_discard(fetch *x) {
    if (x->sha.ctx) tern_sha256_discard(&x->sha);
    EVP_MD_CTX_free(x->git);
    x->git = NULL;
}

/* 0 if the content matches the hub's hash. */
static int hash_check(fetch *x, char sha256[65], tern_error *err) {
    tern_sha256_final(&x->sha, sha256);
    const hub_file *m = &x->f->meta;
    char got[41] = "";
    if (x->git) {
        unsigned char d[20];
        unsigned int dn = 0;
        EVP_DigestFinal_ex(x->git, d, &dn);
        for (unsigned i = 0; i < dn && i < 20; i++) snprintf(got + 2 * i, 3, "%02x", d[i]);
        EVP_MD_CTX_free(x->git);
        x->git = NULL;
    }
    if (m->sha256[0] && strcmp(m->sha256, sha256) != 0)
        return tern_fail(err, "%s: SHA-256 mismatch (hub %.16s..., downloaded %.16s...): the file was deleted",
                         x->f->name, m->sha256, sha256);
    if (!m->sha256[0] && m->git_sha1[0] && strcmp(m->git_sha1, got) != 0)
        return tern_fail(err, "%s: git blob id mismatch (hub %.12s..., downloaded %.12s...): the file was deleted",
                         x->f->name, m->git_sha1, got);
    return 0;
}

/* Hashes the first `n` bytes of fd (what an earlier run left). */
static int hash_held(fetch *x, uint64_t n, tern_error *err) {
    char *buf = malloc(READ_CHUNK);
    if (!buf) return tern_fail(err, "out of memory");
    int rc = 0;
    for (uint64_t off = 0; off < n;) {
        size_t want = n - off < READ_CHUNK ? (size_t)(n - off) : READ_CHUNK;
        ssize_t r = pread(x->fd, buf, want, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            rc = tern_fail(err, "%s: cannot read: %s", x->label, r < 0 ? strerror(errno) : "file shrank");
            break;
        }
        hash_update(x, buf, (size_t)r);
        off += (uint64_t)r;
    }
    free(buf);
    return rc;
}

/* ---- the sink the hub writes into --------------------------------------- */

static uint64_t sink_offset(void *ctx) { return ((fetch *)ctx)->pos; }

static int sink_write(void *ctx, const void *data, size_t n, tern_error *err) {
    fetch *x = ctx;
    for (size_t off = 0; off < n;) {
        ssize_t w = pwrite(x->fd, (const char *)data + off, n - off, (off_t)(x->pos + off));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return tern_fail(err, "%s: cannot write: %s", x->label, w < 0 ? strerror(errno) : "no progress");
        off += (size_t)w;
    }
    hash_update(x, data, n);
    x->pos += n;
    progress_add(x->j, (int64_t)n);
    return 0;
}

static int sink_restart(void *ctx, tern_error *err) {
    fetch *x = ctx;
    if (ftruncate(x->fd, 0) != 0) return tern_fail(err, "%s: cannot truncate: %s", x->label, strerror(errno));
    progress_add(x->j, -(int64_t)x->pos);
    x->pos = 0;
    hash_discard(x);
    return hash_start(x, err);
}

/* ---- one file ----------------------------------------------------------- */

/* A complete file from an earlier run: kept if it matches (1), removed if
 * not (0). */
static int check_complete(fetch *x, int pfd, const char *base, pull_file *f, tern_error *err) {
    x->fd = openat(pfd, base, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (x->fd < 0) return errno == ENOENT ? 0 : tern_fail(err, "%s: cannot open: %s", x->label, strerror(errno));
    struct stat st;
    int rc = fstat(x->fd, &st) == 0 && S_ISREG(st.st_mode) ? 0 : tern_fail(err, "%s: not a regular file", x->label);
    int keep = 0, full = rc == 0 && (uint64_t)st.st_size == f->meta.size;
    if (full && (rc = hash_start(x, err)) == 0) {
        rc = hash_held(x, f->meta.size, err);
        tern_error e;
        if (rc == 0) keep = hash_check(x, f->sha256, &e) == 0;
        hash_discard(x);
    }
    close(x->fd);
    x->fd = -1;
    if (rc != 0) return -1;
    if (keep) return 1;
    fprintf(stderr, "tern pull: %s differs from the hub's; fetching it again\n", x->label);
    if (full) progress_add(x->j, -(int64_t)f->meta.size);   /* pull_bytes_held counted it */
    if (unlinkat(pfd, base, 0) != 0) return tern_fail(err, "%s: cannot remove: %s", x->label, strerror(errno));
    return 0;
}

static int download(fetch *x, hub_conn *c, int pfd, const char *part, tern_error *err) {
    pull_job *j = x->j;
    x->fd = openat(pfd, part, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (x->fd < 0) return tern_fail(err, "%s%s: cannot open: %s", x->label, PULL_PARTIAL_SUFFIX, strerror(errno));
    struct stat st;
    if (fstat(x->fd, &st) != 0 || !S_ISREG(st.st_mode))
        return tern_fail(err, "%s%s: not a regular file", x->label, PULL_PARTIAL_SUFFIX);
    x->pos = (uint64_t)st.st_size;
    if (x->pos > x->f->meta.size) {
        if (ftruncate(x->fd, 0) != 0) return tern_fail(err, "%s: cannot truncate: %s", x->label, strerror(errno));
        x->pos = 0;
    }
    if (hash_start(x, err) != 0 || hash_held(x, x->pos, err) != 0) return -1;
    hub_sink sink = {x, sink_offset, sink_write, sink_restart};
    if (hub_get(c, j->repo, j->commit, x->f->name, x->f->meta.size, &sink, err) != 0) return -1;
    return fsync(x->fd) == 0 ? 0 : tern_fail(err, "%s: fsync failed: %s", x->label, strerror(errno));
}

static int fetch_file(pull_job *j, hub_conn *c, pull_file *f, tern_error *err) {
    fetch x = {.j = j, .f = f, .fd = -1};
    snprintf(x.label, sizeof x.label, "%s/%s", j->dir, f->name);
    const char *base;
    int pfd = tern_open_parent(j->root, f->name, 1, &base, NULL, err);
    if (pfd < 0) return -1;
    char part[NAME_MAX + 32];
    snprintf(part, sizeof part, "%s%s", base, PULL_PARTIAL_SUFFIX);
    int rc = check_complete(&x, pfd, base, f, err);
    if (rc == 0) {
        rc = download(&x, c, pfd, part, err);
        if (rc == 0 && (rc = hash_check(&x, f->sha256, err)) != 0) unlinkat(pfd, part, 0);
        if (rc == 0 && renameat(pfd, part, pfd, base) != 0)
            rc = tern_fail(err, "%s: cannot rename into place: %s", x.label, strerror(errno));
        if (rc == 0 && fsync(pfd) != 0) rc = tern_fail(err, "%s: fsync of its directory failed", x.label);
    }
    hash_discard(&x);
    if (x.fd >= 0) close(x.fd);
    close(pfd);
    return rc < 0 ? -1 : 0;
}

static int head_file(pull_job *j, hub_conn *c, pull_file *f, tern_error *err) {
    return hub_head(c, j->repo, j->commit, f->name, &f->meta, err);
}

/* ---- workers ------------------------------------------------------------ */

typedef int (*file_fn)(pull_job *, hub_conn *, pull_file *, tern_error *);

typedef struct worker {
    pull_job *j;
    file_fn fn;
    int to;
    pthread_t th;
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    pull_job *j = w->j;
    tern_error e;
    hub_conn *c = hub_conn_create(j->h, &e);
    for (;;) {
        pthread_mutex_lock(&j->mu);
        int i = j->failed || !c ? w->to : j->next++;
        pthread_mutex_unlock(&j->mu);
        if (i >= w->to) break;
        if (w->fn(j, c, &j->files[i], &e) == 0) continue;
        pthread_mutex_lock(&j->mu);
        if (!j->failed) j->first_err = e;
        j->failed = 1;
        pthread_mutex_unlock(&j->mu);
        hub_cancel(j->h);
    }
    if (!c) {
        pthread_mutex_lock(&j->mu);
        if (!j->failed) j->first_err = e;
        j->failed = 1;
        pthread_mutex_unlock(&j->mu);
    }
    hub_conn_destroy(c);
    return NULL;
}

static int run_all(pull_job *j, int from, file_fn fn, tern_error *err) {
    int n = j->n_files - from, k = j->jobs < n ? j->jobs : n;
    if (n <= 0) return 0;
    worker *ws = calloc((size_t)k, sizeof *ws);
    if (!ws) return tern_fail(err, "out of memory");
    j->next = from;
    int started = 0;
    for (; started < k; started++) {
        ws[started] = (worker){.j = j, .fn = fn, .to = j->n_files};
        if (pthread_create(&ws[started].th, NULL, worker_main, &ws[started]) != 0) break;
    }
    if (started == 0) worker_main(&(worker){.j = j, .fn = fn, .to = j->n_files});
    for (int i = 0; i < started; i++) pthread_join(ws[i].th, NULL);
    free(ws);
    if (!j->failed) return 0;
    *err = j->first_err;
    return -1;
}

int pull_head_all(pull_job *j, int from, tern_error *err) { return run_all(j, from, head_file, err); }
int pull_fetch_all(pull_job *j, int from, tern_error *err) { return run_all(j, from, fetch_file, err); }

uint64_t pull_bytes_held(pull_job *j, int from) {
    uint64_t held = 0;
    char part[NAME_MAX + 32];
    for (int i = from; i < j->n_files; i++) {
        const pull_file *f = &j->files[i];
        const char *base;
        int pfd = tern_open_parent(j->root, f->name, 0, &base, NULL, NULL);
        if (pfd < 0) continue;
        struct stat st;
        snprintf(part, sizeof part, "%s%s", base, PULL_PARTIAL_SUFFIX);
        if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == f->meta.size)
            held += f->meta.size;
        else if (fstatat(pfd, part, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            held += (uint64_t)st.st_size <= f->meta.size ? (uint64_t)st.st_size : 0;
        close(pfd);
    }
    return held;
}
