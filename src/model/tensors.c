#include "model/tensors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "util/err.h"
#include "util/file.h"

static int add_file(tern_tensor_set *ts, const char *dir, const char *fname, tern_error *err) {
    /* A shard name comes from a file we were given: it must name a file in
     * dir itself, never a path out of it. */
    if (fname[0] == '\0' || strchr(fname, '/') || strcmp(fname, "..") == 0 || strcmp(fname, ".") == 0)
        return tern_fail(err, "%s/model.safetensors.index.json: shard name '%s' is not a plain file name",
                         dir, fname);
    tern_st_file *files = realloc(ts->files, (size_t)(ts->n_files + 1) * sizeof *files);
    if (!files) return tern_fail(err, "out of memory");
    ts->files = files;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    if (tern_st_open(&ts->files[ts->n_files], path, err) != 0) return -1;
    tern_st_file *f = &ts->files[ts->n_files++];
    for (int i = 0; i < f->n_tensors; i++) {
        tern_tensor *t = &f->tensors[i];
        const tern_tensor *old = tern_strmap_get(ts->by_name, t->name);
        if (old) return tern_fail(err, "tensor '%s' appears in both %s and %s", t->name, old->file, t->file);
        if (tern_strmap_put(ts->by_name, t->name, t) != 0) return tern_fail(err, "out of memory");
    }
    return 0;
}

static int file_index(const tern_tensor_set *ts, const char *dir, const char *fname) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    for (int i = 0; i < ts->n_files; i++)
        if (strcmp(ts->files[i].path, path) == 0) return i;
    return -1;
}

static int open_index(tern_tensor_set *ts, const char *dir, const char *index_path, tern_error *err) {
    /* a name listed twice could point at two shards: which one wins is not the file's to leave open */
    json_t *root = tern_json_load(index_path, JSON_REJECT_DUPLICATES, TERN_JSON_LARGE_MAX, err);
    if (!root) return -1;
    json_t *map = json_object_get(root, "weight_map");
    int rc = 0;
    if (!json_is_object(map)) rc = tern_fail(err, "%s: missing object 'weight_map'", index_path);
    else if (!json_object_size(map)) rc = tern_fail(err, "%s: 'weight_map' names no tensor", index_path);
    const char *name;
    json_t *v;
    /* First pass: open each distinct shard once. */
    json_object_foreach(map, name, v) {
        if (rc != 0) break;
        if (!json_is_string(v)) {
            rc = tern_fail(err, "%s: weight_map['%s'] is not a file name", index_path, name);
            break;
        }
        const char *fname = json_string_value(v);
        if (!strchr(fname, '/') && file_index(ts, dir, fname) >= 0) continue;
        rc = add_file(ts, dir, fname, err);
    }
    /* Second pass: every tensor the index names is where it says. */
    json_object_foreach(map, name, v) {
        if (rc != 0) break;
        const tern_tensor *t = tern_strmap_get(ts->by_name, name);
        int fi = file_index(ts, dir, json_string_value(v));
        if (!t || fi < 0 || t->file != ts->files[fi].path)
            rc = tern_fail(err, "%s: tensor '%s' is listed in %s but that file does not hold it",
                           index_path, name, json_string_value(v));
    }
    json_decref(root);
    return rc;
}

int tern_tensors_open(tern_tensor_set *ts, const char *dir, int allow_missing, tern_error *err) {
    memset(ts, 0, sizeof *ts);
    ts->by_name = tern_strmap_create();
    if (!ts->by_name) return tern_fail(err, "out of memory");
    char path[4096];
    int rc;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK) == 0) {
        rc = open_index(ts, dir, path, err);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (access(path, F_OK) == 0)
            rc = add_file(ts, dir, "model.safetensors", err);
        else if (allow_missing)
            rc = 0;
        else
            rc = tern_fail(err, "%s: no model.safetensors or model.safetensors.index.json", dir);
    }
    if (rc != 0) tern_tensors_close(ts);
    return rc;
}

void tern_tensors_close(tern_tensor_set *ts) {
    for (int i = 0; i < ts->n_files; i++) tern_st_close(&ts->files[i]);
    free(ts->files);
    free(ts->owned);
    if (ts->map) munmap(ts->map, ts->map_size);
    tern_strmap_destroy(ts->by_name);
    memset(ts, 0, sizeof *ts);
}

const tern_tensor *tern_tensors_get(const tern_tensor_set *ts, const char *name) {
    return ts->by_name ? tern_strmap_get(ts->by_name, name) : NULL;
}
