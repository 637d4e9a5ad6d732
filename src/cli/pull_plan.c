/* tern pull: which files to fetch, safe names and paths, the receipt, and
 * removing the download once it is packed. */
#include "cli/pull.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"
#include "util/file.h"
#include "util/path.h"

#define INDEX_NAME "model.safetensors.index.json"

/* What tern pack and the loader read; the rest of a repository (images,
 * the vision processor's configs, other formats) is not fetched. */
static const char *const sidecars[] = {
    "config.json",       "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "vocab.json",   "merges.txt",
    "chat_template.jinja", "chat_template.json",
};

int pull_name_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 1024 || name[0] == '/') return 0;
    for (const char *s = name;;) {
        const char *slash = strchr(s, '/');
        size_t len = slash ? (size_t)(slash - s) : strlen(s);
        if (len == 0 || len > NAME_MAX || (len == 1 && s[0] == '.') || (len == 2 && !strncmp(s, "..", 2))) return 0;
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f || s[i] == '\\') return 0;
        if (!slash) return 1;
        s = slash + 1;
    }
}

/* The name as it can be printed: control characters as '?'. */
static void printable(const char *in, char *out, size_t cap) {
    size_t i = 0;
    for (; in[i] && i + 1 < cap; i++) out[i] = (unsigned char)in[i] < 0x20 || in[i] == 0x7f ? '?' : in[i];
    out[i] = '\0';
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The listing is sorted: a hub listing many files must not make the
 * lookups of an index's many tensors quadratic. */
static int listed(const hub_listing *l, const char *name) {
    return l->n > 0 && bsearch(&name, l->names, (size_t)l->n, sizeof *l->names, cmp_str) != NULL;
}

/* Appends files (names distinct, and distinct from the files held). */
static int add_files(pull_job *j, const char *const *names, size_t n, tern_error *err) {
    pull_file *grown = realloc(j->files, ((size_t)j->n_files + n) * sizeof *grown);
    if (!grown) return tern_fail(err, "out of memory");
    j->files = grown;
    for (size_t i = 0; i < n; i++) {
        memset(&j->files[j->n_files], 0, sizeof *grown);
        if (!(j->files[j->n_files].name = strdup(names[i]))) return tern_fail(err, "out of memory");
        j->n_files++;
    }
    return 0;
}

int pull_select(pull_job *j, const hub_listing *l, tern_error *err) {
    char shown[256];
    const char *want[1 + sizeof sidecars / sizeof *sidecars];
    size_t n = 0;
    for (int i = 0; i < l->n; i++)
        if (!pull_name_ok(l->names[i])) {
            printable(l->names[i], shown, sizeof shown);
            return tern_fail(err, "%s@%.12s: the hub lists an unsafe file name '%s' (refused)", j->repo, j->commit,
                             shown);
        }
    if (!listed(l, "config.json")) return tern_fail(err, "%s@%.12s: no config.json in the repository", j->repo, j->commit);
    /* the index first: its shards are known once it is fetched */
    if (listed(l, INDEX_NAME)) want[n++] = INDEX_NAME;
    else if (listed(l, "model.safetensors")) want[n++] = "model.safetensors";
    else return tern_fail(err, "%s@%.12s: no model.safetensors or %s in the repository", j->repo, j->commit, INDEX_NAME);
    for (size_t i = 0; i < sizeof sidecars / sizeof *sidecars; i++)
        if (listed(l, sidecars[i])) want[n++] = sidecars[i];
    return add_files(j, want, n, err);
}

int pull_add_shards(pull_job *j, const hub_listing *l, tern_error *err) {
    const char *base;
    int pfd = tern_open_parent(j->root, INDEX_NAME, 0, &base, NULL, err);
    if (pfd < 0) return -1;
    char label[4200];
    snprintf(label, sizeof label, "%s/%s", j->dir, INDEX_NAME);
    int fd = tern_file_openat(pfd, base, O_NOFOLLOW, label, err);
    close(pfd);
    json_t *root = fd >= 0 ? tern_json_load_fd(fd, label, 0, TERN_JSON_SMALL_MAX, err) : NULL;
    if (fd >= 0) close(fd);
    if (!root) return -1;
    json_t *map = json_object_get(root, "weight_map");
    size_t n = json_object_size(map), k = 0;
    const char **names = calloc(n + 1, sizeof *names);
    int rc = !json_is_object(map) ? tern_fail(err, "%s: no 'weight_map' object", label)
             : !names             ? tern_fail(err, "out of memory") : 0;
    const char *key;
    json_t *v;
    json_object_foreach(map, key, v) {
        const char *shard = json_string_value(v);
        if (rc != 0) break;
        char shown[256], tensor[201];
        printable(shard ? shard : "", shown, sizeof shown);
        printable(key, tensor, sizeof tensor);
        size_t len = shard ? strlen(shard) : 0;
        if (!shard || !pull_name_ok(shard) || len < 12 || strcmp(shard + len - 12, ".safetensors") != 0)
            rc = tern_fail(err, "%s: tensor '%s' maps to an unsafe or odd file name '%s' (refused)", label, tensor,
                           shown);
        else if (!listed(l, shard)) rc = tern_fail(err, "%s: shard '%s' is not in the repository", label, shown);
        else names[k++] = shard;
    }
    if (rc == 0 && k == 0) rc = tern_fail(err, "%s: the weight map is empty", label);
    /* many tensors share a shard: each shard once, in order */
    size_t u = 0;
    if (rc == 0) qsort(names, k, sizeof *names, cmp_str);
    for (size_t i = 0; rc == 0 && i < k; i++)
        if (u == 0 || strcmp(names[i], names[u - 1]) != 0) names[u++] = names[i];
    if (rc == 0) rc = add_files(j, names, u, err);
    free(names);
    json_decref(root);
    return rc;
}

void pull_files_free(pull_job *j) {
    for (int i = 0; i < j->n_files; i++) free(j->files[i].name);
    free(j->files);
    j->files = NULL;
    j->n_files = 0;
}

/* ---- the receipt -------------------------------------------------------- */

static json_t *receipt_json(const pull_job *j) {
    json_t *files = json_object();
    for (int i = 0; i < j->n_files; i++) {
        const pull_file *f = &j->files[i];
        json_object_set_new(files, f->name,
                            json_pack("{s:I, s:s, s:b}", "size", (json_int_t)f->meta.size, "sha256", f->sha256,
                                      "lfs", f->meta.lfs));
    }
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "endpoint", hub_endpoint(j->h), "repo", j->repo, "revision",
                     j->revision, "commit", j->commit, "files", files);
}

int pull_write_receipt(const pull_job *j, int dfd, const char *label, tern_error *err) {
    json_t *r = receipt_json(j);
    char *text = r ? json_dumps(r, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(r);
    if (!text) return tern_fail(err, "%s: cannot encode the receipt", label);
    static const char tmp[] = "." PULL_RECEIPT ".tmp";
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    size_t n = strlen(text);
    int rc = fd < 0 ? -1 : 0;
    for (size_t off = 0; rc == 0 && off < n;) {
        ssize_t w = write(fd, text + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) rc = -1;
        else off += (size_t)w;
    }
    if (rc == 0 && (write(fd, "\n", 1) != 1 || fsync(fd) != 0)) rc = -1;
    if (rc == 0 && renameat(dfd, tmp, dfd, PULL_RECEIPT) != 0) rc = -1;
    if (rc != 0) tern_fail(err, "%s/%s: cannot write: %s", label, PULL_RECEIPT, strerror(errno));
    if (fd >= 0) close(fd);
    if (rc != 0) unlinkat(dfd, tmp, 0);
    if (rc == 0) fsync(dfd);
    free(text);
    return rc;
}

/* ---- the lock and removing the download --------------------------------- */

int pull_lock(pull_job *j, tern_error *err) {
    j->lock = openat(j->root, PULL_LOCK, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (j->lock < 0) return tern_fail(err, "%s/%s: cannot open: %s", j->dir, PULL_LOCK, strerror(errno));
    if (flock(j->lock, LOCK_EX | LOCK_NB) == 0) return 0;
    int busy = errno == EWOULDBLOCK;
    close(j->lock);
    j->lock = -1;
    return tern_fail(err, "%s: %s", j->dir, busy ? "another tern pull is using it" : "cannot lock");
}

void pull_unlock(pull_job *j) {
    if (j->lock < 0) return;
    unlinkat(j->root, PULL_LOCK, 0);
    close(j->lock);
    j->lock = -1;
}


static int by_depth(const void *a, const void *b) {
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    int dx = 0, dy = 0;
    for (const char *p = x; *p; p++) dx += *p == '/';
    for (const char *p = y; *p; p++) dy += *p == '/';
    return dx != dy ? dy - dx : strcmp(x, y);
}

/* Every directory the files' names make (a/b/c gives a/b and a). */
static int dirs_of(const pull_job *j, char ***out) {
    int n = 0;
    char **dirs = NULL;
    for (int i = 0; i < j->n_files; i++) {
        for (const char *s = j->files[i].name; (s = strchr(s, '/')); s++) {
            char **grown = realloc(dirs, (size_t)(n + 1) * sizeof *grown);
            if (!grown) break;
            dirs = grown;
            if (!(dirs[n] = strndup(j->files[i].name, (size_t)(s - j->files[i].name)))) break;
            n++;
        }
    }
    if (n) qsort(dirs, (size_t)n, sizeof *dirs, by_depth);
    *out = dirs;
    return n;
}

int pull_remove_download(pull_job *j) {
    char partial[NAME_MAX + 32];
    for (int i = 0; i < j->n_files; i++) {
        const char *base;
        int pfd = tern_open_parent(j->root, j->files[i].name, 0, &base, NULL, NULL);
        if (pfd < 0) continue;
        unlinkat(pfd, base, 0);
        snprintf(partial, sizeof partial, "%s%s", base, PULL_PARTIAL_SUFFIX);
        unlinkat(pfd, partial, 0);
        close(pfd);
    }
    unlinkat(j->root, PULL_RECEIPT, 0);
    pull_unlock(j);
    char **dirs;
    int n = dirs_of(j, &dirs);
    for (int i = 0; i < n; i++) {
        if (i == 0 || strcmp(dirs[i], dirs[i - 1]) != 0) unlinkat(j->root, dirs[i], AT_REMOVEDIR);
        free(dirs[i]);
    }
    free(dirs);
    return rmdir(j->dir);
}
