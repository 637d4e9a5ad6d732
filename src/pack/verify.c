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

#include "pack/install.h"
#include "pack/sha256.h"
#include "util/err.h"

#define MAX_RECEIPT_BYTES (16u << 20)

/* ---- hashing ------------------------------------------------------------ */

static int open_payload(int root, const char *label, const char *rel, tern_error *err) {
    tern_error e2;
    int fd = tern_open_in(root, rel, NULL, &e2);
    if (fd < 0) tern_fail(err, "%s/%s", label, e2.msg);
    return fd;
}

int tern_check_file(int root, const char *label, const tern_pk_file *f, tern_progress *bar, tern_error *err) {
    int fd = open_payload(root, label, f->path, err);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != f->size) {
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

static int check_size(int root, const char *label, const char *rel, uint64_t want, tern_error *err) {
    int fd = open_payload(root, label, rel, err);
    if (fd < 0) return -1;
    struct stat st;
    int ok = fstat(fd, &st) == 0 && (uint64_t)st.st_size == want;
    close(fd);
    if (!ok)
        return tern_fail(err, "%s/%s: size %llu bytes, the manifest says %llu", label, rel,
                         (unsigned long long)st.st_size, (unsigned long long)want);
    return 0;
}

/* ---- receipt ------------------------------------------------------------ */

static json_t *file_json(uint64_t size, const char *sha) {
    return json_pack("{s:I, s:s}", "size", (json_int_t)size, "sha256", sha);
}

int tern_receipt_write(int dfd, const tern_manifest *m, const char *model_dir, const char *manifest_sha256,
                       uint64_t manifest_size, tern_error *err) {
    char when[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_t *files = json_object();
    json_object_set_new(files, "manifest.json", file_json(manifest_size, manifest_sha256));
    for (int i = 0; i < m->n_files; i++)
        json_object_set_new(files, m->files[i].path, file_json(m->files[i].size, m->files[i].sha256));
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

static int same_file_entry(json_t *e, uint64_t size, const char *sha) {
    json_t *s = json_object_get(e, "size");
    const char *h = json_string_value(json_object_get(e, "sha256"));
    return json_is_integer(s) && (uint64_t)json_integer_value(s) == size && h && !strcmp(h, sha);
}

/* 1 if dir's receipt binds exactly this manifest, this directory and this
 * file list; 0 otherwise (the reason is of no use: we rehash either way). */
static int receipt_matches(int root, const char *dir, const tern_manifest *m, uint64_t manifest_size) {
    int fd = tern_open_in(root, TERN_RECEIPT_NAME, NULL, NULL);
    if (fd < 0) return 0;
    struct stat st;
    json_t *r = NULL;
    if (fstat(fd, &st) == 0 && st.st_size <= MAX_RECEIPT_BYTES) r = json_loadfd(fd, JSON_REJECT_DUPLICATES, NULL);
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
    json_decref(r);
    return ok;
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
    int fast = rc == 0 && receipt_matches(root, dir, m, msize);
    if (how) *how = fast ? TERN_CHECK_RECEIPT : TERN_CHECK_REHASH;
    for (int i = 0; rc == 0 && i < m->n_files; i++)
        rc = fast ? check_size(root, dir, m->files[i].path, m->files[i].size, err)
                  : tern_check_file(root, dir, &m->files[i], NULL, err);
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
static int rehash_all(int root, const char *dir, const tern_manifest *m, FILE *report, tern_error *err) {
    tern_progress *bar = tern_progress_create(report, "verify", total_bytes(m));
    int failed = 0;
    for (int i = 0; i < m->n_files; i++) {
        tern_error e;
        if (tern_check_file(root, dir, &m->files[i], bar, &e) == 0) continue;
        if (report) fprintf(report, "%sFAILED %s\n", failed ? "" : "\n", e.msg);
        if (!failed) *err = e;
        failed++;
    }
    if (!failed) tern_progress_finish(bar);
    tern_progress_destroy(bar);
    return failed;
}

int tern_verify(const char *dir, FILE *report, tern_error *err) {
    tern_manifest m;
    if (tern_manifest_read(&m, dir, err) != 0) return -1;
    int root = tern_open_dir(AT_FDCWD, dir, 0, dir, err);
    if (root < 0) { tern_manifest_free(&m); return -1; }
    uint64_t msize = 0;
    int rc = manifest_size_of(root, dir, &msize, err);
    int failed = rc == 0 ? rehash_all(root, dir, &m, report, err) : 0;
    if (failed > 1) tern_err_prefix(err, "%d of %d files failed verification; first", failed, m.n_files);
    if (failed) rc = -1;
    if (rc == 0 && report) report_unexpected(root, "", &m, report, 0);
    char *real = rc == 0 ? realpath(dir, NULL) : NULL;
    if (rc == 0 && !real) rc = tern_fail(err, "%s: cannot resolve its real path: %s", dir, strerror(errno));
    if (rc == 0) rc = tern_receipt_write(root, &m, real, m.manifest_sha256, msize, err);
    if (rc == 0 && report)
        fprintf(report, "verified %d files (%.1f MB) of %s; receipt %s written\n", m.n_files, total_bytes(&m) / 1e6,
                real, TERN_RECEIPT_NAME);
    free(real);
    close(root);
    tern_manifest_free(&m);
    return rc;
}
