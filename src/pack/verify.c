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
#include "util/err.h"
#include "util/file.h"
#include "util/path.h"
#include "util/progress.h"

/* ---- receipt ------------------------------------------------------------ */

/* The status of every payload file: sts[i] when given, else as it is now. */
static json_t *payload_files(int dfd, const tern_manifest *m, const struct stat *sts, tern_error *err) {
    json_t *files = json_object();
    for (int i = 0; files && i < m->n_files; i++) {
        struct stat now;
        if (!sts) {
            int fd = tern_packed_open_file(dfd, ".", m->files[i].path, err);
            int ok = fd >= 0 && fstat(fd, &now) == 0;
            if (fd >= 0) close(fd);
            if (!ok) { json_decref(files); return NULL; }
        }
        json_t *e = tern_receipt_file_entry(m->files[i].size, m->files[i].sha256, sts ? &sts[i] : &now);
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
    json_object_set_new(files, "manifest.json", tern_receipt_file_entry(manifest_size, manifest_sha256, NULL));
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
        if (tern_check_file(root, dir, &m->files[i], bar, &sts[i], &e) == 0) continue;
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
    if (rc == 0) rc = tern_packed_manifest_size(root, dir, &msize, err);
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
