#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"
#include "util/file.h"

/* A header larger than this is not a model header but a corrupt length. */
#define MAX_HEADER_BYTES (256ull << 20)

static const struct {
    const char *name;
    size_t size;
} dtype_info[TERN_DTYPE_COUNT] = {
    [TERN_DTYPE_F32] = {"F32", 4},       [TERN_DTYPE_F16] = {"F16", 2},
    [TERN_DTYPE_BF16] = {"BF16", 2},     [TERN_DTYPE_F64] = {"F64", 8},
    [TERN_DTYPE_I64] = {"I64", 8},       [TERN_DTYPE_I32] = {"I32", 4},
    [TERN_DTYPE_I16] = {"I16", 2},       [TERN_DTYPE_I8] = {"I8", 1},
    [TERN_DTYPE_U8] = {"U8", 1},         [TERN_DTYPE_BOOL] = {"BOOL", 1},
    [TERN_DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [TERN_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
    [TERN_DTYPE_U16] = {"U16", 2},       [TERN_DTYPE_U32] = {"U32", 4},
    [TERN_DTYPE_U64] = {"U64", 8},
};

const char *tern_dtype_name(int dtype) {
    return dtype >= 0 && dtype < TERN_DTYPE_COUNT ? dtype_info[dtype].name : "?";
}

size_t tern_dtype_size(int dtype) {
    return dtype >= 0 && dtype < TERN_DTYPE_COUNT ? dtype_info[dtype].size : 0;
}

static int dtype_from_name(const char *s) {
    for (int i = 0; i < TERN_DTYPE_COUNT; i++)
        if (strcmp(s, dtype_info[i].name) == 0) return i;
    return -1;
}

void tern_st_close(tern_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    if (f->map) munmap(f->map, f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

static int map_file(tern_st_file *f, const char *path, tern_error *err) {
    int fd = tern_file_open(path, 0, err);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return tern_fail(err, "%s: not a regular file", path);
    }
    f->size = (size_t)st.st_size;
    if (f->size < 8) {
        close(fd);
        return tern_fail(err, "%s: truncated: %zu bytes, too short for the 8-byte header length",
                         path, f->size);
    }
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        return tern_fail(err, "%s: mmap failed: %s", path, strerror(errno));
    }
    return 0;
}

/* Reads a JSON integer that must be a non-negative int64. */
static int get_u64(json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int parse_entry(tern_st_file *f, const char *name, json_t *e, uint64_t data_size,
                       const uint8_t *data, tern_tensor *t, tern_error *err) {
    const char *p = f->path;
    if (!json_is_object(e)) return tern_fail(err, "%s: tensor '%s': entry is not an object", p, name);
    json_t *jd = json_object_get(e, "dtype");
    json_t *js = json_object_get(e, "shape");
    json_t *jo = json_object_get(e, "data_offsets");
    if (!json_is_string(jd)) return tern_fail(err, "%s: tensor '%s': missing dtype", p, name);
    t->dtype = dtype_from_name(json_string_value(jd));
    if (t->dtype < 0)
        return tern_fail(err, "%s: tensor '%s': unknown dtype '%s'", p, name, json_string_value(jd));
    if (!json_is_array(js)) return tern_fail(err, "%s: tensor '%s': missing shape", p, name);
    if (json_array_size(js) > TERN_MAX_DIMS)
        return tern_fail(err, "%s: tensor '%s': %zu dimensions (at most %d)", p, name,
                         json_array_size(js), TERN_MAX_DIMS);
    t->ndim = (int)json_array_size(js);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t n;
        if (get_u64(json_array_get(js, (size_t)d), &n) != 0)
            return tern_fail(err, "%s: tensor '%s': shape[%d] is not a non-negative integer", p, name, d);
        if (n != 0 && numel > (1ull << 62) / n)
            return tern_fail(err, "%s: tensor '%s': shape overflows", p, name);
        numel *= n;
        t->shape[d] = (int64_t)n;
    }
    t->numel = (int64_t)numel;
    size_t esz = tern_dtype_size(t->dtype);
    if (numel > UINT64_MAX / esz)
        return tern_fail(err, "%s: tensor '%s': shape x %s overflows 64 bits", p, name, tern_dtype_name(t->dtype));
    uint64_t begin, end;
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        get_u64(json_array_get(jo, 0), &begin) != 0 || get_u64(json_array_get(jo, 1), &end) != 0)
        return tern_fail(err, "%s: tensor '%s': data_offsets must be [begin, end]", p, name);
    if (begin > end || end > data_size)
        return tern_fail(err, "%s: tensor '%s': data_offsets [%llu, %llu] out of range (data is %llu bytes)",
                         p, name, (unsigned long long)begin, (unsigned long long)end,
                         (unsigned long long)data_size);
    if (end - begin != numel * esz)
        return tern_fail(err, "%s: tensor '%s': %llu bytes of data but shape x %s needs %llu", p, name,
                         (unsigned long long)(end - begin), tern_dtype_name(t->dtype),
                         (unsigned long long)(numel * esz));
    t->data = data + begin;
    t->nbytes = end - begin;
    if (((uintptr_t)t->data) % esz != 0)
        return tern_fail(err, "%s: tensor '%s': data not aligned to its %zu-byte elements", p, name, esz);
    t->file = f->path;
    t->name = strdup(name);
    if (!t->name) return tern_fail(err, "%s: out of memory", p);
    return 0;
}

static int cmp_by_offset(const void *a, const void *b) {
    const tern_tensor *x = a, *y = b;
    uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
    return px < py ? -1 : px > py;
}

/* The tensors must tile the data section: a gap or trailing bytes mean the
 * header does not describe the file (a header length off by a few bytes
 * shows up here when the elements are bytes). */
static int check_tiling(tern_st_file *f, const uint8_t *data, uint64_t data_size, tern_error *err) {
    tern_tensor *sorted = malloc((size_t)f->n_tensors * sizeof *sorted + 1);
    if (!sorted) return tern_fail(err, "%s: out of memory", f->path);
    memcpy(sorted, f->tensors, (size_t)f->n_tensors * sizeof *sorted);
    qsort(sorted, (size_t)f->n_tensors, sizeof *sorted, cmp_by_offset);
    int rc = 0;
    uint64_t cursor = 0;
    const tern_tensor *prev = NULL;
    for (int i = 0; i < f->n_tensors && rc == 0; i++) {
        const tern_tensor *t = &sorted[i];
        if (t->nbytes == 0) continue;
        uint64_t begin = (uint64_t)((const uint8_t *)t->data - data);
        if (begin < cursor)
            rc = tern_fail(err, "%s: tensors '%s' and '%s' overlap", f->path, prev->name, t->name);
        else if (begin > cursor)
            rc = tern_fail(err, "%s: data bytes [%llu, %llu) before tensor '%s' belong to no tensor", f->path,
                           (unsigned long long)cursor, (unsigned long long)begin, t->name);
        cursor = begin + t->nbytes;
        prev = t;
    }
    if (rc == 0 && cursor != data_size)
        rc = tern_fail(err, "%s: %llu data bytes after the last tensor belong to no tensor (is the header length "
                       "right?)", f->path, (unsigned long long)(data_size - cursor));
    free(sorted);
    return rc;
}

static int parse_header(tern_st_file *f, tern_error *err) {
    const uint8_t *base = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | base[i];
    if (hlen > f->size - 8)
        return tern_fail(err, "%s: header length %llu runs past the end of the file (%zu bytes)",
                         f->path, (unsigned long long)hlen, f->size);
    if (hlen > MAX_HEADER_BYTES)
        return tern_fail(err, "%s: header length %llu is implausibly large", f->path,
                         (unsigned long long)hlen);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return tern_fail(err, "%s: header is not valid JSON (%s at byte %d)", f->path, jerr.text,
                         jerr.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return tern_fail(err, "%s: header is not a JSON object", f->path);
    }
    const uint8_t *data = base + 8 + hlen;
    uint64_t data_size = f->size - 8 - hlen;
    f->tensors = calloc(json_object_size(root) + 1, sizeof *f->tensors);
    int rc = f->tensors ? 0 : tern_fail(err, "%s: out of memory", f->path);
    const char *name;
    json_t *e;
    json_object_foreach(root, name, e) {
        if (rc != 0) break;
        if (strcmp(name, "__metadata__") == 0) continue;
        rc = parse_entry(f, name, e, data_size, data, &f->tensors[f->n_tensors], err);
        if (rc == 0) f->n_tensors++;
    }
    json_decref(root);
    if (rc == 0) rc = check_tiling(f, data, data_size, err);
    return rc;
}

int tern_st_open(tern_st_file *f, const char *path, tern_error *err) {
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return tern_fail(err, "%s: out of memory", path);
    if (map_file(f, path, err) != 0 || parse_header(f, err) != 0) {
        tern_st_close(f);
        return -1;
    }
    return 0;
}
