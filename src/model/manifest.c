/* manifest.json (docs/FORMAT.md): parsed into tern_manifest with every
 * check a reader owes the format — known format and version, encodings,
 * sizes that agree with shapes, ranges inside their file and not
 * overlapping, normalised relative paths — and written back with sorted
 * keys so the same manifest always gives the same bytes. */
#include "model/manifest.h"

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
#include "util/sha256.h"

/* A manifest of the full model is ~1 MB; anything far larger is not one. */
#define MAX_MANIFEST_BYTES (64u << 20)
#define PART_ALIGN 64
/* Far above any real model; they bound the cross-checks' loops. */
#define MAX_LAYER_FILES 4096
#define MAX_FILES 65536

static const char *const enc_names[] = {"f32", "f16", "bf16", "q4", "q8"};
static const char *const qclass_names[TERN_QC_COUNT] = {"embed", "attn", "router", "shared",
                                                         "experts", "head", "mtp_fc"};
static const char *const part_names[3] = {"gate", "up", "down"};

const char *tern_encoding_name(int e) {
    return e >= 0 && e <= TERN_ENC_Q8 ? enc_names[e] : NULL;
}

int tern_encoding_from_name(const char *s) {
    for (int i = 0; s && i <= TERN_ENC_Q8; i++)
        if (strcmp(s, enc_names[i]) == 0) return i;
    return -1;
}

const char *tern_qclass_name(int q) { return q >= 0 && q < TERN_QC_COUNT ? qclass_names[q] : NULL; }

static int enc_bits(int e) { return e == TERN_ENC_Q4 ? 4 : e == TERN_ENC_Q8 ? 8 : 0; }
static int enc_float_size(int e) { return e == TERN_ENC_F32 ? 4 : 2; }

/* Element counts and byte sizes stay below 2^62, so that every later sum
 * of an offset and a size, and every signed product, has room. */
#define MAX_TENSOR_COUNT (1ull << 62)

int tern_pk_tensor_bytes(const tern_pk_tensor *t, uint64_t *data, uint64_t *scales) {
    if (t->ndim < 1 || t->ndim > 4) return -1;
    uint64_t rows = 1, cols = (uint64_t)t->shape[t->ndim - 1], numel;
    for (int d = 0; d < t->ndim - 1; d++)
        if (t->shape[d] <= 0 || __builtin_mul_overflow(rows, (uint64_t)t->shape[d], &rows)) return -1;
    if (t->shape[t->ndim - 1] <= 0 || __builtin_mul_overflow(rows, cols, &numel) || numel > MAX_TENSOR_COUNT)
        return -1;
    int bits = enc_bits(t->encoding);
    if (!bits) {
        *data = numel * (uint64_t)enc_float_size(t->encoding);
        *scales = 0;
        return *data > MAX_TENSOR_COUNT ? -1 : 0;
    }
    if (t->group <= 0 || cols % (uint64_t)t->group != 0) return -1;
    *data = numel / 8 * (uint64_t)bits + numel % 8 * (uint64_t)bits / 8;
    *scales = rows * (cols / (uint64_t)t->group) * 2;
    return 0;
}

int tern_manifest_path_ok(const char *p) {
    if (!p || !*p || p[0] == '/' || strlen(p) > 1024) return 0;
    for (const unsigned char *c = (const unsigned char *)p; *c; c++)
        if (*c < 0x20 || *c == 0x7f || *c == '\\') return 0;
    const char *s = p;
    while (*s) {
        size_t n = strcspn(s, "/");
        if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) return 0;
        s += n;
        if (*s == '/') {
            s++;
            if (!*s) return 0;   /* trailing slash: an empty last component */
        }
    }
    return 1;
}

/* ---- freeing and lookup ------------------------------------------------- */

void tern_manifest_free(tern_manifest *m) {
    if (!m) return;
    for (int i = 0; i < m->n_tensors; i++) free(m->tensors[i].name);
    free(m->tensors);
    for (int i = 0; i < m->n_layer_files; i++) free(m->layer_files[i]);
    free(m->layer_files);
    free(m->mtp_file);
    for (int i = 0; i < 3; i++) free(m->parts[i].name);
    for (int i = 0; i < m->n_files; i++) free(m->files[i].path);
    free(m->files);
    free(m->source_path);
    free(m->source_index_sha256);
    memset(m, 0, sizeof *m);
}

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const tern_pk_tensor *)a)->name, ((const tern_pk_tensor *)b)->name);
}

static int cmp_file(const void *a, const void *b) {
    return strcmp(((const tern_pk_file *)a)->path, ((const tern_pk_file *)b)->path);
}

const tern_pk_tensor *tern_manifest_tensor(const tern_manifest *m, const char *name) {
    tern_pk_tensor key = {.name = (char *)name};
    return m->n_tensors ? bsearch(&key, m->tensors, (size_t)m->n_tensors, sizeof key, cmp_tensor) : NULL;
}

const tern_pk_file *tern_manifest_file(const tern_manifest *m, const char *path) {
    for (int i = 0; i < m->n_files; i++)
        if (strcmp(m->files[i].path, path) == 0) return &m->files[i];
    return NULL;
}

/* ---- reading ------------------------------------------------------------ */

typedef struct {
    const char *path;            /* of manifest.json, for messages */
    tern_error *err;
} rd;

static int get_int(rd *r, json_t *o, const char *key, const char *where, int64_t lo, int64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo)
        return tern_fail(r->err, "%s: %s.%s must be an integer >= %lld", r->path, where, key, (long long)lo);
    *out = json_integer_value(v);
    return 0;
}

static int get_small_int(rd *r, json_t *o, const char *key, const char *where, int *out) {
    int64_t v;
    if (get_int(r, o, key, where, 0, &v) != 0) return -1;
    if (v > (1 << 30)) return tern_fail(r->err, "%s: %s.%s is too large", r->path, where, key);
    *out = (int)v;
    return 0;
}

static int get_range(rd *r, json_t *o, const char *key, const char *where, tern_range *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(json_array_get(v, 0)) ||
        !json_is_integer(json_array_get(v, 1)) || json_integer_value(json_array_get(v, 0)) < 0 ||
        json_integer_value(json_array_get(v, 1)) < 0)
        return tern_fail(r->err, "%s: %s.%s must be [offset, size]", r->path, where, key);
    out->off = (uint64_t)json_integer_value(json_array_get(v, 0));
    out->size = (uint64_t)json_integer_value(json_array_get(v, 1));
    if (out->off % PART_ALIGN != 0)
        return tern_fail(r->err, "%s: %s.%s offset %llu is not %d-byte aligned", r->path, where, key,
                         (unsigned long long)out->off, PART_ALIGN);
    if (out->off + out->size < out->off)
        return tern_fail(r->err, "%s: %s.%s overflows", r->path, where, key);
    return 0;
}

static int dup_string(rd *r, json_t *v, const char *where, char **out) {
    if (!json_is_string(v)) return tern_fail(r->err, "%s: %s must be a string", r->path, where);
    *out = strdup(json_string_value(v));
    return *out ? 0 : tern_fail(r->err, "out of memory");
}

static int parse_shape(rd *r, json_t *o, const char *where, tern_pk_tensor *t) {
    json_t *s = json_object_get(o, "shape");
    if (!json_is_array(s) || json_array_size(s) < 1 || json_array_size(s) > 4)
        return tern_fail(r->err, "%s: %s.shape must be an array of 1 to 4 dimensions", r->path, where);
    t->ndim = (int)json_array_size(s);
    for (int d = 0; d < t->ndim; d++) {
        json_t *v = json_array_get(s, (size_t)d);
        if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1ll << 40))
            return tern_fail(r->err, "%s: %s.shape[%d] must be a positive integer", r->path, where, d);
        t->shape[d] = json_integer_value(v);
    }
    return 0;
}

static int check_sizes(rd *r, const tern_pk_tensor *t, const char *where) {
    uint64_t want_data, want_scales;
    if (tern_pk_tensor_bytes(t, &want_data, &want_scales) != 0)
        return tern_fail(r->err, "%s: %s: shape too large, or row length %lld not a multiple of group %d", r->path,
                         where, (long long)t->shape[t->ndim - 1], t->group);
    if (t->data.size != want_data)
        return tern_fail(r->err, "%s: %s: data is %llu bytes but shape x %s needs %llu", r->path, where,
                         (unsigned long long)t->data.size, tern_encoding_name(t->encoding),
                         (unsigned long long)want_data);
    if (enc_bits(t->encoding) && (t->scales.size != want_scales || t->biases.size != want_scales))
        return tern_fail(r->err, "%s: %s: scales/biases are %llu/%llu bytes but shape and group %d need %llu",
                         r->path, where, (unsigned long long)t->scales.size,
                         (unsigned long long)t->biases.size, t->group, (unsigned long long)want_scales);
    return 0;
}

static int parse_tensor(rd *r, json_t *o, const char *where, tern_pk_tensor *t) {
    if (!json_is_object(o)) return tern_fail(r->err, "%s: %s is not an object", r->path, where);
    if (parse_shape(r, o, where, t) != 0) return -1;
    const char *enc = json_string_value(json_object_get(o, "encoding"));
    t->encoding = tern_encoding_from_name(enc);
    if (t->encoding < 0)
        return tern_fail(r->err, "%s: %s.encoding '%s' is unknown (f32, f16, bf16, q4, q8)", r->path, where,
                         enc ? enc : "(missing)");
    if (get_range(r, o, "data", where, &t->data) != 0) return -1;
    if (enc_bits(t->encoding)) {
        if (get_small_int(r, o, "group", where, &t->group) != 0) return -1;
        if (t->group != 32 && t->group != 64 && t->group != 128)
            return tern_fail(r->err, "%s: %s.group %d is not 32, 64 or 128", r->path, where, t->group);
        if (get_range(r, o, "scales", where, &t->scales) || get_range(r, o, "biases", where, &t->biases))
            return -1;
    } else if (json_object_get(o, "scales") || json_object_get(o, "biases")) {
        return tern_fail(r->err, "%s: %s: a %s tensor has no scales or biases", r->path, where, enc);
    }
    return check_sizes(r, t, where);
}

static int parse_tensors(rd *r, json_t *o, tern_manifest *m) {
    if (!json_is_object(o)) return tern_fail(r->err, "%s: 'tensors' must be an object", r->path);
    m->tensors = calloc(json_object_size(o) + 1, sizeof *m->tensors);
    if (!m->tensors) return tern_fail(r->err, "out of memory");
    const char *name;
    json_t *v;
    json_object_foreach(o, name, v) {
        tern_pk_tensor *t = &m->tensors[m->n_tensors];
        char where[600];
        snprintf(where, sizeof where, "tensors['%s']", name);
        t->name = strdup(name);
        if (!t->name) return tern_fail(r->err, "out of memory");
        m->n_tensors++;
        if (parse_tensor(r, v, where, t) != 0) return -1;
    }
    qsort(m->tensors, (size_t)m->n_tensors, sizeof *m->tensors, cmp_tensor);
    return 0;
}

static int parse_path(rd *r, json_t *v, const char *where, char **out) {
    if (dup_string(r, v, where, out) != 0) return -1;
    if (!tern_manifest_path_ok(*out))
        return tern_fail(r->err, "%s: %s '%s' is not a relative, normalised path", r->path, where, *out);
    return 0;
}

static int parse_experts(rd *r, json_t *o, tern_manifest *m) {
    if (!json_is_object(o)) return tern_fail(r->err, "%s: 'experts' must be an object", r->path);
    int64_t stride;
    if (get_small_int(r, o, "count", "experts", &m->n_experts) != 0 ||
        get_int(r, o, "stride", "experts", 1, &stride) != 0)
        return -1;
    m->stride = (uint64_t)stride;
    if (m->n_experts < 1) return tern_fail(r->err, "%s: experts.count must be >= 1", r->path);
    if (m->stride % 4096 != 0)
        return tern_fail(r->err, "%s: experts.stride %llu is not a multiple of 4096", r->path,
                         (unsigned long long)m->stride);
    json_t *layers = json_object_get(o, "layers");
    if (!json_is_array(layers) || json_array_size(layers) > MAX_LAYER_FILES)
        return tern_fail(r->err, "%s: experts.layers must be an array of at most %d files", r->path, MAX_LAYER_FILES);
    m->layer_files = calloc(json_array_size(layers) + 1, sizeof *m->layer_files);
    if (!m->layer_files) return tern_fail(r->err, "out of memory");
    for (size_t i = 0; i < json_array_size(layers); i++) {
        char where[64];
        snprintf(where, sizeof where, "experts.layers[%zu]", i);
        m->n_layer_files++;
        if (parse_path(r, json_array_get(layers, i), where, &m->layer_files[i]) != 0) return -1;
    }
    json_t *mtp = json_object_get(o, "mtp");
    if (mtp && !json_is_null(mtp) && parse_path(r, mtp, "experts.mtp", &m->mtp_file) != 0) return -1;
    json_t *parts = json_object_get(o, "parts");
    if (!json_is_object(parts)) return tern_fail(r->err, "%s: experts.parts must be an object", r->path);
    for (int p = 0; p < 3; p++) {
        char where[64];
        snprintf(where, sizeof where, "experts.parts.%s", part_names[p]);
        m->parts[p].name = strdup(part_names[p]);
        if (!m->parts[p].name) return tern_fail(r->err, "out of memory");
        if (parse_tensor(r, json_object_get(parts, part_names[p]), where, &m->parts[p]) != 0) return -1;
        if (m->parts[p].ndim != 2)
            return tern_fail(r->err, "%s: %s must be a 2-D matrix", r->path, where);
    }
    return 0;
}

static int parse_files(rd *r, json_t *o, tern_manifest *m) {
    if (!json_is_object(o) || json_object_size(o) > MAX_FILES)
        return tern_fail(r->err, "%s: 'files' must be an object of at most %d files", r->path, MAX_FILES);
    m->files = calloc(json_object_size(o) + 1, sizeof *m->files);
    if (!m->files) return tern_fail(r->err, "out of memory");
    const char *path;
    json_t *v;
    json_object_foreach(o, path, v) {
        tern_pk_file *f = &m->files[m->n_files];
        char where[1100];
        snprintf(where, sizeof where, "files['%s']", path);
        if (!tern_manifest_path_ok(path) || !strcmp(path, "manifest.json") ||
            !strcmp(path, "verified-install.json"))
            return tern_fail(r->err, "%s: %s: not a payload path (relative, normalised, not the manifest or receipt)",
                             r->path, where);
        f->path = strdup(path);
        if (!f->path) return tern_fail(r->err, "out of memory");
        m->n_files++;
        int64_t size;
        if (!json_is_object(v) || get_int(r, v, "size", where, 0, &size) != 0) {
            if (!json_is_object(v)) tern_fail(r->err, "%s: %s is not an object", r->path, where);
            return -1;
        }
        f->size = (uint64_t)size;
        const char *sha = json_string_value(json_object_get(v, "sha256"));
        if (!tern_sha256_hex_ok(sha))
            return tern_fail(r->err, "%s: %s.sha256 must be 64 lowercase hex digits", r->path, where);
        memcpy(f->sha256, sha, 65);
    }
    qsort(m->files, (size_t)m->n_files, sizeof *m->files, cmp_file);
    return 0;
}

static int parse_arch(rd *r, json_t *o, tern_manifest *m) {
    if (!json_is_object(o)) return tern_fail(r->err, "%s: 'arch' must be an object", r->path);
    tern_pk_arch *a = &m->arch;
    const char *mt = json_string_value(json_object_get(o, "model_type"));
    if (!mt) return tern_fail(r->err, "%s: arch.model_type must be a string", r->path);
    snprintf(a->model_type, sizeof a->model_type, "%s", mt);
    if (get_small_int(r, o, "hidden_size", "arch", &a->hidden) ||
        get_small_int(r, o, "num_hidden_layers", "arch", &a->n_layers) ||
        get_small_int(r, o, "num_experts", "arch", &a->n_experts) ||
        get_small_int(r, o, "num_experts_per_tok", "arch", &a->top_k) ||
        get_small_int(r, o, "moe_intermediate_size", "arch", &a->expert_inter) ||
        get_small_int(r, o, "vocab_size", "arch", &a->vocab))
        return -1;
    json_t *mtp = json_object_get(o, "mtp");
    if (!json_is_boolean(mtp)) return tern_fail(r->err, "%s: arch.mtp must be true or false", r->path);
    a->mtp = json_is_true(mtp);
    return 0;
}

static int parse_quant(rd *r, json_t *o, tern_manifest *m) {
    if (!json_is_object(o)) return tern_fail(r->err, "%s: 'quant' must be an object", r->path);
    for (int q = 0; q < TERN_QC_COUNT; q++) {
        char where[32];
        snprintf(where, sizeof where, "quant.%s", qclass_names[q]);
        json_t *c = json_object_get(o, qclass_names[q]);
        if (!json_is_object(c)) return tern_fail(r->err, "%s: %s must be an object", r->path, where);
        if (get_small_int(r, c, "bits", where, &m->quant[q].bits) ||
            get_small_int(r, c, "group", where, &m->quant[q].group))
            return -1;
        int b = m->quant[q].bits;
        if (b != 4 && b != 8 && b != 16)
            return tern_fail(r->err, "%s: %s.bits %d is not 4, 8 or 16", r->path, where, b);
    }
    return 0;
}

static int parse_source(rd *r, json_t *o, tern_manifest *m) {
    if (!json_is_object(o)) return tern_fail(r->err, "%s: 'source' must be an object", r->path);
    if (dup_string(r, json_object_get(o, "path"), "source.path", &m->source_path) != 0) return -1;
    json_t *ix = json_object_get(o, "index_sha256");
    if (ix && !json_is_null(ix)) {
        if (!tern_sha256_hex_ok(json_string_value(ix)))
            return tern_fail(r->err, "%s: source.index_sha256 must be 64 hex digits or null", r->path);
        if (dup_string(r, ix, "source.index_sha256", &m->source_index_sha256) != 0) return -1;
    }
    return 0;
}

/* ---- cross-checks: ranges, files ---------------------------------------- */

typedef struct {
    uint64_t off, end;
    const char *owner, *what;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off ? 1 : (x->end > y->end) - (x->end < y->end);
}

static void add_span(span *s, int *n, const tern_range *r, const char *owner, const char *what) {
    if (r->size == 0) return;
    s[(*n)++] = (span){r->off, r->off + r->size, owner, what};
}

/* Every range ends by `limit` and none overlaps another. */
static int check_spans(rd *r, span *s, int n, uint64_t limit, const char *file) {
    qsort(s, (size_t)n, sizeof *s, cmp_span);
    for (int i = 0; i < n; i++) {
        if (s[i].end > limit)
            return tern_fail(r->err, "%s: %s %s [%llu, +%llu) lies outside %s (%llu bytes)", r->path, s[i].owner,
                             s[i].what, (unsigned long long)s[i].off, (unsigned long long)(s[i].end - s[i].off),
                             file, (unsigned long long)limit);
        if (i > 0 && s[i].off < s[i - 1].end)
            return tern_fail(r->err, "%s: %s %s overlaps %s %s in %s", r->path, s[i].owner, s[i].what,
                             s[i - 1].owner, s[i - 1].what, file);
    }
    return 0;
}

static int check_resident(rd *r, const tern_manifest *m) {
    const tern_pk_file *f = tern_manifest_file(m, "resident.bin");
    if (!f) return tern_fail(r->err, "%s: files does not list resident.bin", r->path);
    span *s = malloc(((size_t)m->n_tensors * 3 + 1) * sizeof *s);
    if (!s) return tern_fail(r->err, "out of memory");
    int n = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const tern_pk_tensor *t = &m->tensors[i];
        add_span(s, &n, &t->data, t->name, "data");
        add_span(s, &n, &t->scales, t->name, "scales");
        add_span(s, &n, &t->biases, t->name, "biases");
    }
    int rc = check_spans(r, s, n, f->size, "resident.bin");
    free(s);
    return rc;
}

static int check_expert_file(rd *r, const tern_manifest *m, const char *path) {
    const tern_pk_file *f = tern_manifest_file(m, path);
    if (!f) return tern_fail(r->err, "%s: files does not list expert file %s", r->path, path);
    uint64_t want;
    if (__builtin_mul_overflow((uint64_t)m->n_experts, m->stride, &want) || want > MAX_TENSOR_COUNT)
        return tern_fail(r->err, "%s: experts.count x experts.stride overflows", r->path);
    if (f->size != want)
        return tern_fail(r->err, "%s: %s is listed with %llu bytes but count x stride is %llu", r->path, path,
                         (unsigned long long)f->size, (unsigned long long)want);
    return 0;
}

static const char *expert_path(const tern_manifest *m, int i) {
    return i < m->n_layer_files ? m->layer_files[i] : m->mtp_file;
}

/* Expert file i (the MTP one after the layers) is named by no other
 * expert file and is not resident.bin. */
static int distinct_expert_file(rd *r, const tern_manifest *m, int i) {
    const char *p = expert_path(m, i);
    if (!strcmp(p, "resident.bin") || !strcmp(p, "config.json"))
        return tern_fail(r->err, "%s: expert file '%s' is not an expert file", r->path, p);
    for (int j = 0; j < i; j++)
        if (!strcmp(p, expert_path(m, j)))
            return tern_fail(r->err, "%s: expert file '%s' is named twice", r->path, p);
    return 0;
}

static int check_experts(rd *r, const tern_manifest *m) {
    span s[9];
    int n = 0;
    for (int p = 0; p < 3; p++) {
        add_span(s, &n, &m->parts[p].data, m->parts[p].name, "data");
        add_span(s, &n, &m->parts[p].scales, m->parts[p].name, "scales");
        add_span(s, &n, &m->parts[p].biases, m->parts[p].name, "biases");
    }
    if (check_spans(r, s, n, m->stride, "an expert blob") != 0) return -1;
    if (m->n_layer_files != m->arch.n_layers)
        return tern_fail(r->err, "%s: experts.layers lists %d files for %d layers", r->path, m->n_layer_files,
                         m->arch.n_layers);
    if (m->n_experts != m->arch.n_experts)
        return tern_fail(r->err, "%s: experts.count %d differs from arch.num_experts %d", r->path, m->n_experts,
                         m->arch.n_experts);
    if (!!m->mtp_file != !!m->arch.mtp)
        return tern_fail(r->err, "%s: experts.mtp and arch.mtp disagree", r->path);
    for (int i = 0; i < m->n_layer_files; i++)
        if (check_expert_file(r, m, m->layer_files[i]) != 0 || distinct_expert_file(r, m, i) != 0) return -1;
    return m->mtp_file ? check_expert_file(r, m, m->mtp_file) || distinct_expert_file(r, m, m->n_layer_files) : 0;
}

static int check_file_paths(rd *r, const tern_manifest *m) {
    for (int i = 1; i < m->n_files; i++) {
        const char *a = m->files[i - 1].path, *b = m->files[i].path;
        size_t la = strlen(a);
        /* "x" and "x/y" cannot both be files */
        if (strncmp(a, b, la) == 0 && b[la] == '/')
            return tern_fail(r->err, "%s: files lists both '%s' and '%s' inside it", r->path, a, b);
    }
    if (!tern_manifest_file(m, "config.json")) return tern_fail(r->err, "%s: files does not list config.json", r->path);
    return 0;
}

static int parse_root(rd *r, json_t *root, tern_manifest *m) {
    if (!json_is_object(root)) return tern_fail(r->err, "%s: not a JSON object", r->path);
    const char *fmt = json_string_value(json_object_get(root, "format"));
    if (!fmt || strcmp(fmt, TERN_FORMAT_NAME) != 0)
        return tern_fail(r->err, "%s: format '%s' is not '%s'", r->path, fmt ? fmt : "(missing)", TERN_FORMAT_NAME);
    json_t *ver = json_object_get(root, "version");
    if (!json_is_integer(ver) || json_integer_value(ver) != TERN_FORMAT_VERSION)
        return tern_fail(r->err, "%s: version %lld is not supported (this tern reads version %d)", r->path,
                         json_is_integer(ver) ? (long long)json_integer_value(ver) : -1LL, TERN_FORMAT_VERSION);
    m->version = TERN_FORMAT_VERSION;
    if (parse_source(r, json_object_get(root, "source"), m) || parse_arch(r, json_object_get(root, "arch"), m) ||
        parse_quant(r, json_object_get(root, "quant"), m) ||
        parse_tensors(r, json_object_get(root, "tensors"), m) ||
        parse_experts(r, json_object_get(root, "experts"), m) || parse_files(r, json_object_get(root, "files"), m))
        return -1;
    return check_file_paths(r, m) || check_resident(r, m) || check_experts(r, m) ? -1 : 0;
}

int tern_manifest_read(tern_manifest *m, const char *dir, tern_error *err) {
    memset(m, 0, sizeof *m);
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    char *text = NULL;
    size_t len = 0;
    if (tern_file_read(path, O_NOFOLLOW, MAX_MANIFEST_BYTES, &text, &len, err) != 0) return -1;
    if (tern_sha256_buf(text, len, m->manifest_sha256, err) != 0) { free(text); return -1; }
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root) return tern_fail(err, "%s: not valid JSON (%s, line %d)", path, jerr.text, jerr.line);
    rd r = {path, err};
    char sha[65];
    memcpy(sha, m->manifest_sha256, sizeof sha);
    int rc = parse_root(&r, root, m);
    json_decref(root);
    if (rc != 0) {
        tern_manifest_free(m);
        return -1;
    }
    memcpy(m->manifest_sha256, sha, sizeof sha);
    return 0;
}

/* ---- writing ------------------------------------------------------------ */

static json_t *range_json(const tern_range *r) {
    return json_pack("[I, I]", (json_int_t)r->off, (json_int_t)r->size);
}

static json_t *tensor_json(const tern_pk_tensor *t) {
    json_t *shape = json_array();
    for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
    json_t *o = json_pack("{s:o, s:s, s:o}", "shape", shape, "encoding", tern_encoding_name(t->encoding), "data",
                          range_json(&t->data));
    if (o && enc_bits(t->encoding)) {
        json_object_set_new(o, "group", json_integer(t->group));
        json_object_set_new(o, "scales", range_json(&t->scales));
        json_object_set_new(o, "biases", range_json(&t->biases));
    }
    return o;
}

static json_t *experts_json(const tern_manifest *m) {
    json_t *layers = json_array(), *parts = json_object();
    for (int i = 0; i < m->n_layer_files; i++) json_array_append_new(layers, json_string(m->layer_files[i]));
    for (int p = 0; p < 3; p++) json_object_set_new(parts, part_names[p], tensor_json(&m->parts[p]));
    return json_pack("{s:i, s:I, s:o, s:o, s:o}", "count", m->n_experts, "stride", (json_int_t)m->stride,
                     "layers", layers, "mtp", m->mtp_file ? json_string(m->mtp_file) : json_null(), "parts",
                     parts);
}

static json_t *head_json(const tern_manifest *m) {
    const tern_pk_arch *a = &m->arch;
    json_t *quant = json_object();
    for (int q = 0; q < TERN_QC_COUNT; q++)
        json_object_set_new(quant, qclass_names[q],
                            json_pack("{s:i, s:i}", "bits", m->quant[q].bits, "group", m->quant[q].group));
    json_t *src = json_pack("{s:s, s:o}", "path", m->source_path ? m->source_path : "", "index_sha256",
                            m->source_index_sha256 ? json_string(m->source_index_sha256) : json_null());
    json_t *arch = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:b}", "model_type", a->model_type,
                             "hidden_size", a->hidden, "num_hidden_layers", a->n_layers, "num_experts",
                             a->n_experts, "num_experts_per_tok", a->top_k, "moe_intermediate_size",
                             a->expert_inter, "vocab_size", a->vocab, "mtp", a->mtp);
    return json_pack("{s:s, s:i, s:o, s:o, s:o}", "format", TERN_FORMAT_NAME, "version", TERN_FORMAT_VERSION,
                     "source", src, "arch", arch, "quant", quant);
}

static json_t *manifest_json(const tern_manifest *m) {
    json_t *root = head_json(m), *tensors = json_object(), *files = json_object();
    for (int i = 0; i < m->n_tensors; i++)
        json_object_set_new(tensors, m->tensors[i].name, tensor_json(&m->tensors[i]));
    for (int i = 0; i < m->n_files; i++)
        json_object_set_new(files, m->files[i].path,
                            json_pack("{s:I, s:s}", "size", (json_int_t)m->files[i].size, "sha256",
                                      m->files[i].sha256));
    json_object_set_new(root, "tensors", tensors);
    json_object_set_new(root, "experts", experts_json(m));
    json_object_set_new(root, "files", files);
    return root;
}

char *tern_manifest_dumps(const tern_manifest *m, tern_error *err) {
    json_t *root = manifest_json(m);
    char *text = root ? json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    if (!text) tern_fail(err, "manifest: cannot encode JSON (out of memory?)");
    return text;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int tern_manifest_write(const tern_manifest *m, const char *path, tern_error *err) {
    char *text = tern_manifest_dumps(m, err);
    if (!text) return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(text);
        return tern_fail(err, "%s: cannot create: %s", path, strerror(errno));
    }
    size_t len = strlen(text);
    int rc = write_all(fd, text, len) == 0 && write_all(fd, "\n", 1) == 0 && fsync(fd) == 0 ? 0 : -1;
    int e = errno;
    free(text);
    if (close(fd) != 0 && rc == 0) rc = -1;
    return rc == 0 ? 0 : tern_fail(err, "%s: write failed: %s", path, strerror(e));
}
