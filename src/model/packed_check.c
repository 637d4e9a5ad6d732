#include "model/packed_check.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"
#include "util/file.h"
#include "util/path.h"
#include "util/progress.h"
#include "util/sha256.h"

#define MAX_RECEIPT_BYTES (16u << 20)

/* ---- hashing ------------------------------------------------------------ */

int tern_packed_open_file(int root, const char *label, const char *rel, tern_error *err) {
    tern_error e2;
    int fd = tern_open_in(root, rel, NULL, &e2);
    if (fd < 0) tern_fail(err, "%s/%s", label, e2.msg);
    return fd;
}

int tern_check_file(int root, const char *label, const tern_pk_file *f, tern_progress *bar, struct stat *st_out,
                    tern_error *err) {
    int fd = tern_packed_open_file(root, label, f->path, err);
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

static int64_t ns_of(struct timespec t) { return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec; }

json_t *tern_receipt_file_entry(uint64_t size, const char *sha, const struct stat *st) {
    json_t *o = json_pack("{s:I, s:s}", "size", (json_int_t)size, "sha256", sha);
    if (!st) return o;
    if (o && json_object_set_new(o, "mtime_ns", json_integer(ns_of(st->st_mtim))) == 0 &&
        json_object_set_new(o, "ctime_ns", json_integer(ns_of(st->st_ctim))) == 0 &&
        json_object_set_new(o, "ino", json_integer((json_int_t)st->st_ino)) == 0)
        return o;
    json_decref(o);
    return NULL;
}

static int stat_entry_matches(json_t *e, const struct stat *st) {
    json_t *mt = json_object_get(e, "mtime_ns"), *ct = json_object_get(e, "ctime_ns"), *ino = json_object_get(e, "ino");
    return json_is_integer(mt) && json_integer_value(mt) == ns_of(st->st_mtim) && json_is_integer(ct) &&
           json_integer_value(ct) == ns_of(st->st_ctim) && json_is_integer(ino) &&
           (uint64_t)json_integer_value(ino) == (uint64_t)st->st_ino;
}

/* The receipt's fast path for one file: its size, and that it is the same
 * file, unchanged, as when the receipt was written (inode, mtime, ctime). */
static int check_unchanged(int root, const char *label, const tern_pk_file *f, json_t *entry, tern_error *err) {
    int fd = tern_packed_open_file(root, label, f->path, err);
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

/* ---- the check ------------------------------------------------- */

int tern_packed_manifest_size(int root, const char *dir, uint64_t *size, tern_error *err) {
    int fd = tern_packed_open_file(root, dir, "manifest.json", err);
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
    int rc = tern_packed_manifest_size(root, dir, &msize, err);
    json_t *receipt = rc == 0 ? receipt_matching(root, dir, m, msize) : NULL;
    json_t *files = json_object_get(receipt, "files");
    if (how) *how = receipt ? TERN_CHECK_RECEIPT : TERN_CHECK_REHASH;
    for (int i = 0; rc == 0 && i < m->n_files; i++)
        rc = receipt ? check_unchanged(root, dir, &m->files[i], json_object_get(files, m->files[i].path), err)
                     : tern_check_file(root, dir, &m->files[i], NULL, NULL, err);
    json_decref(receipt);
    close(root);
    return rc;
}

int tern_packed_check(const char *dir, const tern_manifest *m, tern_error *err) {
    return tern_packed_check_how(dir, m, NULL, err);
}
