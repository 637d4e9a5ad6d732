#include "pack/source.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "synth/synth.h"
#include "util/err.h"
#include "util/file.h"
#include "util/half.h"
#include "util/sha256.h"

#define MAX_INDEX_BYTES (64u << 20)

size_t pk_dtype_size(int dtype) {
    switch (dtype) {
    case PK_F32: case PK_U32: return 4;
    case PK_F16: case PK_BF16: return 2;
    case PK_F8E4M3: return 1;
    default: return 0;
    }
}

static int pk_dtype_of(int dtype) {
    switch (dtype) {
    case TERN_DTYPE_F32: return PK_F32;
    case TERN_DTYPE_F16: return PK_F16;
    case TERN_DTYPE_BF16: return PK_BF16;
    case TERN_DTYPE_U32: return PK_U32;
    case TERN_DTYPE_F8_E4M3: return PK_F8E4M3;
    default: return PK_OTHER;
    }
}

/* ---- names -------------------------------------------------------------- */

int pk_check_tensor_name(const char *name, const char *file, tern_error *err) {
    const char *why = NULL;
    if (!*name) why = "is empty";
    else if (name[0] == '/') why = "is an absolute path";
    else if (strlen(name) > 512) why = "is longer than 512 bytes";
    for (const unsigned char *c = (const unsigned char *)name; !why && *c; c++)
        if (*c < 0x20 || *c == 0x7f) why = "contains a control character";
        else if (*c == '\\') why = "contains a backslash";
    for (const char *s = name; !why && *s;) {
        size_t n = strcspn(s, "/");
        if (n == 2 && s[0] == '.' && s[1] == '.') why = "has a '..' path component";
        s += n + (s[n] == '/');
    }
    if (!why) return 0;
    /* print the name with control characters escaped: one line, always */
    char shown[160];
    size_t k = 0;
    for (const unsigned char *c = (const unsigned char *)name; *c && k + 5 < sizeof shown; c++)
        k += (size_t)snprintf(shown + k, sizeof shown - k, *c < 0x20 || *c == 0x7f ? "\\x%02x" : "%c", *c);
    return tern_fail(err, "%s: tensor name '%s' refused: it %s", file, shown, why);
}

/* The canonical name of a stored one, or NULL to drop it. */
static char *canonical_name(const char *n) {
    static const char *const text_roots[] = {"layers.", "embed_tokens.", "norm."};
    const char *rest = NULL;
    if (!strncmp(n, "model.language_model.", 21) || !strncmp(n, "lm_head.", 8) || !strncmp(n, "mtp.", 4))
        return strdup(n);
    if (!strncmp(n, "language_model.lm_head.", 23) || !strncmp(n, "language_model.mtp.", 19))
        return strdup(n + 15);
    if (!strncmp(n, "language_model.model.", 21)) rest = n + 21;
    else if (!strncmp(n, "model.", 6)) rest = n + 6;
    for (size_t i = 0; rest && i < sizeof text_roots / sizeof *text_roots; i++) {
        if (strncmp(rest, text_roots[i], strlen(text_roots[i])) != 0) continue;
        char *out = malloc(strlen(rest) + 22);
        if (out) sprintf(out, "model.language_model.%s", rest);
        return out;
    }
    return NULL;
}

/* ---- tensors ---------------------------------------------------------- */

/* One tensor the loader's parser accepted, under its canonical name. */
static int add_raw(pk_source *s, const tern_tensor *t, tern_error *err) {
    if (pk_check_tensor_name(t->name, t->file, err) != 0) return -1;
    char *canon = canonical_name(t->name);
    if (!canon) {
        s->n_dropped++;
        return 0;
    }
    if (s->n_raw == s->cap_raw) {
        /* a per-expert checkpoint of the full model has ~31 K tensors: grow geometrically */
        int cap = s->cap_raw ? 2 * s->cap_raw : 1024;
        pk_raw *grown = realloc(s->raw, (size_t)cap * sizeof *grown);
        if (!grown) { free(canon); return tern_fail(err, "out of memory"); }
        s->raw = grown;
        s->cap_raw = cap;
    }
    pk_raw *r = &s->raw[s->n_raw++];
    memset(r, 0, sizeof *r);
    r->name = canon;
    r->src_name = strdup(t->name);
    if (!r->src_name) return tern_fail(err, "out of memory");
    r->dtype = pk_dtype_of(t->dtype);
    snprintf(r->dtype_name, sizeof r->dtype_name, "%s", tern_dtype_name(t->dtype));
    r->ndim = t->ndim;
    memcpy(r->shape, t->shape, sizeof r->shape);
    r->numel = t->numel;
    r->data = t->data;
    r->nbytes = t->nbytes;
    r->file = t->file;
    return 0;
}

/* The index's hash goes into the manifest; its contents are the loader's
 * to read. */
static int hash_index(pk_source *s, const char *path, tern_error *err) {
    int fd = tern_file_open(path, 0, err);
    if (fd < 0) return -1;
    uint64_t size;
    int rc = tern_sha256_fd(fd, path, NULL, &size, s->index_sha256, err);
    close(fd);
    if (rc != 0) return -1;
    if (size > MAX_INDEX_BYTES) return tern_fail(err, "%s: larger than %u bytes", path, MAX_INDEX_BYTES);
    s->has_index = 1;
    return 0;
}

/* The shards through the loader's own reader (model/tensors.h), so that a
 * source `tern pack` accepts is one `tern run` would read. */
static int read_tensors(pk_source *s, tern_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", s->dir);
    if (tern_file_exists(path) && hash_index(s, path, err) != 0) return -1;
    if (tern_tensors_open(&s->ts, s->dir, 0, err) != 0) return -1;
    for (int i = 0; i < s->ts.n_files; i++) {
        const tern_st_file *f = &s->ts.files[i];
        s->total_bytes += f->size;
        for (int k = 0; k < f->n_tensors; k++)
            if (add_raw(s, &f->tensors[k], err) != 0) return -1;
    }
    return 0;
}

/* ---- config: MLX quantization, FP8 block size --------------------------- */

/* A config integer narrowed to int; a value out of range becomes -1, which
 * every check after it refuses. */
static int small_int(json_t *v) {
    json_int_t x = json_integer_value(v);
    return json_is_integer(v) && x >= 0 && x <= (1 << 20) ? (int)x : -1;
}

static int read_quant_config(pk_source *s, tern_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", s->dir);
    json_t *root = tern_json_load(path, 0, TERN_JSON_SMALL_MAX, err);
    if (!root) return -1;
    s->fp8_block[0] = s->fp8_block[1] = 128;
    json_t *q = json_object_get(root, "quantization");
    if (!q) q = json_object_get(root, "quantization_config");
    json_t *bs = json_object_get(q, "weight_block_size");
    if (json_is_array(bs) && json_array_size(bs) == 2) {
        s->fp8_block[0] = small_int(json_array_get(bs, 0));
        s->fp8_block[1] = small_int(json_array_get(bs, 1));
    }
    int rc = 0;
    if (s->fp8_block[0] <= 0 || s->fp8_block[1] <= 0)
        rc = tern_fail(err, "%s: weight_block_size must be two positive integers", path);
    if (json_is_integer(json_object_get(q, "bits"))) {
        const char *mode = json_string_value(json_object_get(q, "mode"));
        if (mode && strcmp(mode, "affine") != 0)
            rc = tern_fail(err, "%s: quantization mode '%s' is not supported (affine only)", path, mode);
        s->mlx_bits = small_int(json_object_get(q, "bits"));
        s->mlx_group = json_object_get(q, "group_size") ? small_int(json_object_get(q, "group_size")) : 0;
        s->mlx_quant = json_incref(q);
    }
    json_decref(root);
    return rc;
}

int pk_mlx_params(const pk_source *s, const pk_raw *w, const pk_raw *sc, int *bits, int *group, tern_error *err) {
    char module[600];
    snprintf(module, sizeof module, "%s", w->src_name);
    char *dot = strrchr(module, '.');
    if (dot) *dot = '\0';
    json_t *over = s->mlx_quant ? json_object_get(s->mlx_quant, module) : NULL;
    *bits = s->mlx_bits;
    *group = s->mlx_group;
    if (json_is_object(over)) {
        if (json_is_integer(json_object_get(over, "bits"))) *bits = small_int(json_object_get(over, "bits"));
        if (json_is_integer(json_object_get(over, "group_size"))) *group = small_int(json_object_get(over, "group_size"));
    }
    if (!*bits || !*group)
        return tern_fail(err, "%s: '%s' is MLX-quantized but config.json has no 'quantization' bits/group_size", w->file,
                         w->src_name);
    if (*bits != 4 && *bits != 8)
        return tern_fail(err, "%s: '%s' is %d-bit; the packed format holds 4- and 8-bit (and float) only", w->file,
                         w->src_name, *bits);
    if (*group != 32 && *group != 64 && *group != 128)
        return tern_fail(err, "%s: '%s': group_size %d is not one of MLX's 32, 64, 128", w->file, w->src_name, *group);
    /* each dimension is bounded by the file's size: these products fit */
    int64_t words = w->shape[w->ndim - 1], ngroups = sc->shape[sc->ndim - 1];
    if (words * 32 != (int64_t)*bits * ngroups * *group)
        return tern_fail(err, "%s: '%s': %lld packed words per row do not match %lld groups of %d at %d bits", w->file,
                         w->src_name, (long long)words, (long long)ngroups, *group, *bits);
    return 0;
}

/* ---- open / close ------------------------------------------------------- */

static int cmp_raw(const void *a, const void *b) { return strcmp(((const pk_raw *)a)->name, ((const pk_raw *)b)->name); }

pk_raw *pk_source_get(const pk_source *s, const char *canonical) {
    pk_raw key = {.name = (char *)canonical};
    return s->n_raw ? bsearch(&key, s->raw, (size_t)s->n_raw, sizeof key, cmp_raw) : NULL;
}

static int finish_names(pk_source *s, tern_error *err) {
    qsort(s->raw, (size_t)s->n_raw, sizeof *s->raw, cmp_raw);
    for (int i = 1; i < s->n_raw; i++)
        if (!strcmp(s->raw[i].name, s->raw[i - 1].name))
            return tern_fail(err, "tensors '%s' (%s) and '%s' (%s) both map to '%s'", s->raw[i - 1].src_name,
                             s->raw[i - 1].file, s->raw[i].src_name, s->raw[i].file, s->raw[i].name);
    for (int i = 0; i < s->n_raw; i++) {
        const pk_raw *t = &s->raw[i];
        size_t n = strlen(t->name);
        /* MLX layout: its own prefix, or packed words with .scales beside them */
        if (!strncmp(t->src_name, "language_model.", 15) || strstr(t->name, ".switch_mlp.") ||
            (n > 7 && !strcmp(t->name + n - 7, ".scales")))
            s->mlx = 1;
    }
    return 0;
}

int pk_source_open(pk_source *s, const char *dir, tern_error *err) {
    memset(s, 0, sizeof *s);
    s->dir = realpath(dir, NULL);
    if (!s->dir) return tern_fail(err, "%s: cannot resolve the source directory: %s", dir, strerror(errno));
    struct stat st;
    if (stat(s->dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        pk_source_close(s);
        return tern_fail(err, "%s: not a directory (the source is a checkpoint directory)", dir);
    }
    int rc = read_quant_config(s, err);
    if (rc == 0) rc = read_tensors(s, err);
    if (rc == 0) rc = finish_names(s, err);
    if (rc != 0) pk_source_close(s);
    return rc;
}

/* ---- a synthetic source ------------------------------------------------- */

int pk_source_synth(pk_source *s, const tern_synth_params *p, tern_error *err) {
    memset(s, 0, sizeof *s);
    s->synth = calloc(1, sizeof *s->synth);
    if (!s->synth) return tern_fail(err, "out of memory");
    if (synth_create(s->synth, p, err) != 0) {
        free(s->synth);
        s->synth = NULL;
        return -1;
    }
    const synth *y = s->synth;
    if (asprintf(&s->dir, "synthetic:%s:%s:seed=%llu", y->shape.name, synth_routing_name(y->routing),
                 (unsigned long long)y->seed) < 0)
        s->dir = NULL;
    s->raw = calloc((size_t)y->n_tensors, sizeof *s->raw);
    if (!s->dir || !s->raw) { pk_source_close(s); return tern_fail(err, "out of memory"); }
    for (int i = 0; i < y->n_tensors; i++) {
        const synth_tensor *t = &y->tensors[i];
        pk_raw *r = &s->raw[s->n_raw];
        r->name = strdup(t->name);
        r->src_name = strdup(t->name);
        if (!r->name || !r->src_name) { free(r->name); free(r->src_name); pk_source_close(s); return tern_fail(err, "out of memory"); }
        s->n_raw++;
        r->dtype = t->f32 ? PK_F32 : PK_BF16;
        snprintf(r->dtype_name, sizeof r->dtype_name, "%s", t->f32 ? "F32" : "BF16");
        r->ndim = t->ndim;
        r->numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            r->shape[d] = t->shape[d];
            r->numel *= t->shape[d];
        }
        r->nbytes = (uint64_t)r->numel * pk_dtype_size(r->dtype);
        r->file = "(synthetic)";
        r->synth = t;
    }
    qsort(s->raw, (size_t)s->n_raw, sizeof *s->raw, cmp_raw);
    return 0;
}

void pk_source_close(pk_source *s) {
    if (s->synth) {
        synth_free(s->synth);
        free(s->synth);
    }
    for (int i = 0; i < s->n_raw; i++) {
        free(s->raw[i].name);
        free(s->raw[i].src_name);
    }
    free(s->raw);
    tern_tensors_close(&s->ts);
    json_decref(s->mlx_quant);
    free(s->dir);
    memset(s, 0, sizeof *s);
}

/* ---- matrix views ------------------------------------------------------- */

float pk_f8e4m3_to_f32(uint8_t v) {
    /* E4M3 "fn": bias 7, no infinities, S.1111.111 is NaN */
    int sign = v >> 7, exp = (v >> 3) & 15, man = v & 7;
    float f;
    if (exp == 15 && man == 7) f = NAN;
    else if (exp == 0) f = ldexpf((float)man, -9);           /* man/8 * 2^-6 */
    else f = ldexpf((float)(8 + man), exp - 10);             /* (1 + man/8) * 2^(exp-7) */
    return sign ? -f : f;
}

static float widen(int dtype, const uint8_t *p, int64_t i) {
    uint16_t h;
    switch (dtype) {
    case PK_F32: { float f; memcpy(&f, p + 4 * i, 4); return f; }
    case PK_BF16: memcpy(&h, p + 2 * i, 2); return tern_bf16_to_f32(h);
    case PK_F16: memcpy(&h, p + 2 * i, 2); return tern_f16_to_f32(h);
    default: return 0.0f;
    }
}

/* Row index inside the stored tensor, counting every leading dimension. */
static int64_t stored_row(const pk_mat *m, int64_t r, int64_t rows_per_slice) {
    return m->slice * rows_per_slice + m->row0 + r;
}

static int64_t slice_rows(const pk_raw *t) { return t->ndim == 3 ? t->shape[1] : t->shape[0]; }

const uint8_t *pk_mat_float_row(const pk_mat *m, int64_t r) {
    size_t es = pk_dtype_size(m->w->dtype);
    int64_t sr = m->w->ndim >= 2 ? stored_row(m, r, slice_rows(m->w)) : r;
    return m->w->data + (size_t)sr * (size_t)m->cols * es;
}

const uint8_t *pk_mat_q_row(const pk_mat *m, int64_t r) {
    int64_t words = m->w->shape[m->w->ndim - 1];
    return m->w->data + (size_t)stored_row(m, r, slice_rows(m->w)) * (size_t)words * 4;
}

const uint8_t *pk_mat_sb_row(const pk_mat *m, const pk_raw *sb, int64_t r) {
    int64_t ng = sb->shape[sb->ndim - 1];
    return sb->data + (size_t)stored_row(m, r, slice_rows(sb)) * (size_t)ng * pk_dtype_size(sb->dtype);
}

static void read_mlx_row(const pk_mat *m, int64_t r, float *out) {
    const uint8_t *q = pk_mat_q_row(m, r);
    const uint8_t *sc = pk_mat_sb_row(m, m->scales, r), *bi = pk_mat_sb_row(m, m->biases, r);
    for (int64_t c = 0; c < m->cols; c++) {
        int v = m->bits == 8 ? q[c] : (q[c / 2] >> (4 * (c & 1))) & 15;
        int64_t g = c / m->group;
        out[c] = (float)v * widen(m->scales->dtype, sc, g) + widen(m->biases->dtype, bi, g);
    }
}

/* FP8 blocks: w = fp8 * scale_inv[row / block_rows][col / block_cols]
 * (2-D weights only). */
static void read_fp8_row(const pk_mat *m, int64_t r, const float lut[256], float *out) {
    int64_t sr = m->row0 + r;
    const uint8_t *w = m->w->data + (size_t)sr * (size_t)m->cols;
    int64_t bc = m->scales->shape[m->scales->ndim - 1];
    const uint8_t *srow = m->scales->data + (size_t)(sr / m->block[0]) * (size_t)bc * pk_dtype_size(m->scales->dtype);
    for (int64_t c = 0; c < m->cols; c++) out[c] = lut[w[c]] * widen(m->scales->dtype, srow, c / m->block[1]);
}

/* One row of float storage, converted in a loop per dtype: this is the
 * inner loop of packing a bf16 checkpoint. */
static void widen_row(int dtype, const uint8_t *p, int64_t n, float *out) {
    if (dtype == PK_F32) {
        memcpy(out, p, (size_t)n * sizeof *out);
    } else if (dtype == PK_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)(p[2 * i] | p[2 * i + 1] << 8) << 16;
            memcpy(&out[i], &u, sizeof u);
        }
    } else {
        for (int64_t i = 0; i < n; i++) out[i] = tern_f16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    }
}

void pk_mat_read_f32(const pk_mat *m, int64_t r, int64_t n, float *out) {
    float lut[256];
    if (m->storage == PK_STORE_FP8)
        for (int v = 0; v < 256; v++) lut[v] = pk_f8e4m3_to_f32((uint8_t)v);
    for (int64_t i = 0; i < n; i++) {
        float *o = out + i * m->cols;
        if (m->storage == PK_STORE_MLX) read_mlx_row(m, r + i, o);
        else if (m->storage == PK_STORE_FP8) read_fp8_row(m, r + i, lut, o);
        else widen_row(m->w->dtype, pk_mat_float_row(m, r + i), m->cols, o);
        if (m->add != 0.0f)
            for (int64_t c = 0; c < m->cols; c++) o[c] += m->add;
    }
}
