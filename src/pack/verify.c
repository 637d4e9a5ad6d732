#include "pack/verify.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "model/config.h"
#include "model/packed.h"
#include "pack/install.h"
#include "pack/sha256.h"
#include "util/err.h"
#include "util/file.h"

#define MAX_RECEIPT_BYTES (16u << 20)

/* ---- hashing ------------------------------------------------------------ */

static int open_payload(int root, const char *label, const char *rel, tern_error *err) {
    tern_error e2;
    int fd = tern_open_in(root, rel, NULL, &e2);
    if (fd < 0) tern_fail(err, "%s/%s", label, e2.msg);
    return fd;
}

/* tern_check_file; *st_out (may be NULL) gets the file's status from
 * before it was hashed, so a change made during the hash shows later. */
static int check_file_st(int root, const char *label, const tern_pk_file *f, tern_progress *bar,
                         struct stat *st_out, tern_error *err) {
    int fd = open_payload(root, label, f->path, err);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) memset(&st, 0, sizeof st);
    if (st_out) *st_out = st;
    if ((uint64_t)st.st_size != f->size) {
        close(fd);
        tern_progress_add(bar, f->size);
        return tern_fail(err, "%s/%s: size %llu bytes, the manifest says %llu", label, f->path,
                         (unsigned long long)st.st_size, (unsigned long long)f->size);
    }
    uint64_t size = 0;
    char hex[65], name[4200];
    snprintf(name, sizeof name, "%s/%s", label, f->path);
    int rc = tern_sha256_fd(fd, name, bar, &size, hex, err);
    close(fd);
    if (rc != 0) return -1;
    if (size != f->size || strcmp(hex, f->sha256) != 0)
        return tern_fail(err, "%s: SHA-256 mismatch (manifest %.12s..., file %.12s...)", name, f->sha256, hex);
    return 0;
}

int tern_check_file(int root, const char *label, const tern_pk_file *f, tern_progress *bar, tern_error *err) {
    return check_file_st(root, label, f, bar, NULL, err);
}

static int64_t ns_of(struct timespec t) { return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec; }

static int stat_entry_matches(json_t *e, const struct stat *st) {
    json_t *mt = json_object_get(e, "mtime_ns"), *ct = json_object_get(e, "ctime_ns"), *ino = json_object_get(e, "ino");
    return json_is_integer(mt) && json_integer_value(mt) == ns_of(st->st_mtim) && json_is_integer(ct) &&
           json_integer_value(ct) == ns_of(st->st_ctim) && json_is_integer(ino) &&
           (uint64_t)json_integer_value(ino) == (uint64_t)st->st_ino;
}

/* The receipt's fast path for one file: its size, and that it is the same
 * file, unchanged, as when the receipt was written (inode, mtime, ctime). */
static int check_unchanged(int root, const char *label, const tern_pk_file *f, json_t *entry, tern_error *err) {
    int fd = open_payload(root, label, f->path, err);
    if (fd < 0) return -1;
    struct stat st;
    int ok = fstat(fd, &st) == 0;
    close(fd);
    if (!ok || (uint64_t)st.st_size != f->size)
        return tern_fail(err, "%s/%s: size %llu bytes, the manifest says %llu", label, f->path,
                         ok ? (unsigned long long)st.st_size : 0ull, (unsigned long long)f->size);
    if (!stat_entry_matches(entry, &st))
        return tern_fail(err, "%s/%s: changed since %s was written (modified, replaced or touched); run tern "
                              "verify on the directory", label, f->path, TERN_RECEIPT_NAME);
    return 0;
}

/* ---- receipt ------------------------------------------------------------ */

static json_t *file_json(uint64_t size, const char *sha) {
    return json_pack("{s:I, s:s}", "size", (json_int_t)size, "sha256", sha);
}

static json_t *payload_json(const tern_pk_file *f, const struct stat *st) {
    json_t *o = file_json(f->size, f->sha256);
    if (o && json_object_set_new(o, "mtime_ns", json_integer(ns_of(st->st_mtim))) == 0 &&
        json_object_set_new(o, "ctime_ns", json_integer(ns_of(st->st_ctim))) == 0 &&
        json_object_set_new(o, "ino", json_integer((json_int_t)st->st_ino)) == 0)
        return o;
    json_decref(o);
    return NULL;
}

/* The status of every payload file: sts[i] when given, else as it is now. */
static json_t *payload_files(int dfd, const tern_manifest *m, const struct stat *sts, tern_error *err) {
    json_t *files = json_object();
    for (int i = 0; files && i < m->n_files; i++) {
        struct stat now;
        if (!sts) {
            int fd = open_payload(dfd, ".", m->files[i].path, err);
            int ok = fd >= 0 && fstat(fd, &now) == 0;
            if (fd >= 0) close(fd);
            if (!ok) { json_decref(files); return NULL; }
        }
        json_t *e = payload_json(&m->files[i], sts ? &sts[i] : &now);
        if (!e || json_object_set_new(files, m->files[i].path, e) != 0) {
            json_decref(files);
            files = NULL;
        }
    }
    if (!files) tern_fail(err, "%s: cannot encode JSON", TERN_RECEIPT_NAME);
    return files;
}

static int receipt_write_st(int dfd, const tern_manifest *m, const char *model_dir, const char *manifest_sha256,
                            uint64_t manifest_size, const struct stat *sts, tern_error *err) {
    char when[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_t *files = payload_files(dfd, m, sts, err);
    if (!files) return -1;
    json_object_set_new(files, "manifest.json", file_json(manifest_size, manifest_sha256));
    json_t *root = json_pack("{s:i, s:s, s:s, s:s, s:s, s:o}", "schema", TERN_RECEIPT_SCHEMA, "manifest_sha256",
                             manifest_sha256, "model_dir", model_dir, "verified_at", when, "tern_version",
                             TERN_TOOL_VERSION, "files", files);
    char *text = root ? json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    if (!text) return tern_fail(err, "%s: cannot encode JSON", TERN_RECEIPT_NAME);
    size_t n = strlen(text);
    text[n] = '\n';   /* json_dumps leaves room for the NUL we replace; no NUL is written */
    int rc = tern_atomic_write(dfd, TERN_RECEIPT_NAME, text, n + 1, TERN_RECEIPT_NAME, err);
    free(text);
    return rc;
}

int tern_receipt_write(int dfd, const tern_manifest *m, const char *model_dir, const char *manifest_sha256,
                       uint64_t manifest_size, tern_error *err) {
    return receipt_write_st(dfd, m, model_dir, manifest_sha256, manifest_size, NULL, err);
}

static int same_file_entry(json_t *e, uint64_t size, const char *sha) {
    json_t *s = json_object_get(e, "size");
    const char *h = json_string_value(json_object_get(e, "sha256"));
    return json_is_integer(s) && (uint64_t)json_integer_value(s) == size && h && !strcmp(h, sha);
}

/* dir's receipt if it binds exactly this manifest, this directory and this
 * file list; NULL otherwise (the reason is of no use: we rehash either way). */
static json_t *receipt_matching(int root, const char *dir, const tern_manifest *m, uint64_t manifest_size) {
    int fd = tern_open_in(root, TERN_RECEIPT_NAME, NULL, NULL);
    if (fd < 0) return NULL;
    json_t *r = tern_json_load_fd(fd, TERN_RECEIPT_NAME, JSON_REJECT_DUPLICATES, MAX_RECEIPT_BYTES, NULL);
    close(fd);
    char *real = realpath(dir, NULL);
    json_t *files = json_object_get(r, "files");
    int ok = r && real && json_integer_value(json_object_get(r, "schema")) == TERN_RECEIPT_SCHEMA &&
             json_is_string(json_object_get(r, "manifest_sha256")) &&
             !strcmp(json_string_value(json_object_get(r, "manifest_sha256")), m->manifest_sha256) &&
             json_is_string(json_object_get(r, "model_dir")) &&
             !strcmp(json_string_value(json_object_get(r, "model_dir")), real) && json_is_object(files) &&
             json_object_size(files) == (size_t)m->n_files + 1 &&
             same_file_entry(json_object_get(files, "manifest.json"), manifest_size, m->manifest_sha256);
    for (int i = 0; ok && i < m->n_files; i++)
        ok = same_file_entry(json_object_get(files, m->files[i].path), m->files[i].size, m->files[i].sha256);
    free(real);
    if (!ok) {
        json_decref(r);
        return NULL;
    }
    return r;
}

/* ---- the loader's check ------------------------------------------------- */

static int manifest_size_of(int root, const char *dir, uint64_t *size, tern_error *err) {
    int fd = open_payload(root, dir, "manifest.json", err);
    if (fd < 0) return -1;
    struct stat st;
    int rc = fstat(fd, &st);
    close(fd);
    if (rc != 0) return tern_fail(err, "%s/manifest.json: cannot stat", dir);
    *size = (uint64_t)st.st_size;
    return 0;
}

int tern_packed_check_how(const char *dir, const tern_manifest *m, int *how, tern_error *err) {
    int root = tern_open_dir(AT_FDCWD, dir, 0, dir, err);
    if (root < 0) return -1;
    uint64_t msize;
    int rc = manifest_size_of(root, dir, &msize, err);
    json_t *receipt = rc == 0 ? receipt_matching(root, dir, m, msize) : NULL;
    json_t *files = json_object_get(receipt, "files");
    if (how) *how = receipt ? TERN_CHECK_RECEIPT : TERN_CHECK_REHASH;
    for (int i = 0; rc == 0 && i < m->n_files; i++)
        rc = receipt ? check_unchanged(root, dir, &m->files[i], json_object_get(files, m->files[i].path), err)
                     : tern_check_file(root, dir, &m->files[i], NULL, err);
    json_decref(receipt);
    close(root);
    return rc;
}

int tern_packed_check(const char *dir, const tern_manifest *m, tern_error *err) {
    return tern_packed_check_how(dir, m, NULL, err);
}

/* ---- tern verify -------------------------------------------------------- */

static int listed(const tern_manifest *m, const char *rel) {
    return !strcmp(rel, "manifest.json") || !strcmp(rel, TERN_RECEIPT_NAME) || tern_manifest_file(m, rel);
}

/* Names every file under the directory that the manifest does not list:
 * harmless to the loader, but worth a line in the report. */
static void report_unexpected(int dfd, const char *prefix, const tern_manifest *m, FILE *report, int depth) {
    int fd = dup(dfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) { if (fd >= 0) close(fd); return; }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char rel[4200];
        snprintf(rel, sizeof rel, "%s%s", prefix, e->d_name);
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (S_ISDIR(st.st_mode) && depth < 8) {
            int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            char pfx[4300];
            snprintf(pfx, sizeof pfx, "%s/", rel);
            if (sub >= 0) { report_unexpected(sub, pfx, m, report, depth + 1); close(sub); }
        } else if (!listed(m, rel)) {
            fprintf(report, "note: %s is not in the manifest (ignored)\n", rel);
        }
    }
    closedir(d);
}

static uint64_t total_bytes(const tern_manifest *m) {
    uint64_t t = 0;
    for (int i = 0; i < m->n_files; i++) t += m->files[i].size;
    return t;
}

/* Rehashes every file; reports each failure and returns how many failed
 * (err holds the first). */
static int rehash_all(int root, const char *dir, const tern_manifest *m, FILE *report, struct stat *sts,
                      tern_error *err) {
    tern_progress *bar = tern_progress_create(report, "verify", total_bytes(m));
    int failed = 0;
    for (int i = 0; i < m->n_files; i++) {
        tern_error e;
        if (check_file_st(root, dir, &m->files[i], bar, &sts[i], &e) == 0) continue;
        if (report) fprintf(report, "%sFAILED %s\n", failed ? "" : "\n", e.msg);
        if (!failed) *err = e;
        failed++;
    }
    if (!failed) tern_progress_finish(bar);
    tern_progress_destroy(bar);
    return failed;
}

/* A verify that fails, or is cut short, must leave no receipt behind: the
 * loader would trust it. */
static int remove_receipt(int root, const char *dir, tern_error *err) {
    if (unlinkat(root, TERN_RECEIPT_NAME, 0) != 0 && errno != ENOENT)
        return tern_fail(err, "%s/%s: cannot remove: %s", dir, TERN_RECEIPT_NAME, strerror(errno));
    return tern_fsync_fd(root, dir, err);
}

/* The manifest's shapes and counts against the directory's config.json. */
static int check_against_config(const char *dir, const tern_manifest *m, tern_error *err) {
    tern_config c;
    if (tern_config_load(&c, dir, err) != 0) return -1;
    char label[4200];
    snprintf(label, sizeof label, "%s/manifest.json", dir);
    return tern_packed_check_config(m, &c, label, err);
}

int tern_verify(const char *dir, FILE *report, tern_error *err) {
    int root = tern_open_dir(AT_FDCWD, dir, 0, dir, err);
    if (root < 0) return -1;
    tern_manifest m;
    if (remove_receipt(root, dir, err) != 0 || tern_manifest_read(&m, dir, err) != 0) {
        close(root);
        return -1;
    }
    struct stat *sts = calloc((size_t)m.n_files + 1, sizeof *sts);
    uint64_t msize = 0;
    int rc = sts ? 0 : tern_fail(err, "out of memory");
    if (rc == 0) rc = manifest_size_of(root, dir, &msize, err);
    int failed = rc == 0 ? rehash_all(root, dir, &m, report, sts, err) : 0;
    if (failed > 1) tern_err_prefix(err, "%d of %d files failed verification; first", failed, m.n_files);
    if (failed) rc = -1;
    /* config.json is one of the files: trusted only once its hash matched */
    if (rc == 0) rc = check_against_config(dir, &m, err);
    if (rc == 0 && report) report_unexpected(root, "", &m, report, 0);
    char *real = rc == 0 ? realpath(dir, NULL) : NULL;
    if (rc == 0 && !real) rc = tern_fail(err, "%s: cannot resolve its real path: %s", dir, strerror(errno));
    if (rc == 0) rc = receipt_write_st(root, &m, real, m.manifest_sha256, msize, sts, err);
    if (rc == 0 && report)
        fprintf(report, "verified %d files (%.1f MB) of %s; receipt %s written\n", m.n_files, total_bytes(&m) / 1e6,
                real, TERN_RECEIPT_NAME);
    free(real);
    free(sts);
    close(root);
    tern_manifest_free(&m);
    return rc;
}
