#include "testutil.h"

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

const char *fixture_dir(const char *name) {
    static __thread char buf[1024];
    /* the embedded default model carries its own reference outputs */
    if (strcmp(name, "tern_tiny") == 0) return "models/tern-tiny";
    const char *root = getenv("TERN_FIXTURES");
    snprintf(buf, sizeof buf, "%s/%s", root ? root : "tests/fixtures", name);
    return buf;
}

int reference_open(reference *r, const char *fixture) {
    char path[2048];
    snprintf(path, sizeof path, "%s/reference.safetensors", fixture_dir(fixture));
    tern_error err;
    if (tern_st_open(&r->file, path, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

void reference_close(reference *r) { tern_st_close(&r->file); }

const tern_tensor *reference_get(reference *r, const char *name) {
    for (int i = 0; i < r->file.n_tensors; i++)
        if (strcmp(r->file.tensors[i].name, name) == 0) return &r->file.tensors[i];
    return NULL;
}

double rel_err(const float *a, const float *b, size_t n) {
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > md || isnan(d)) md = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > mr) mr = fabs(b[i]);
    }
    return mr > 0 ? md / mr : md;
}

char *make_temp_dir(void) {
    char tmpl[] = "/tmp/tern-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

const char *dir_path(const char *dir, const char *name) {
    static __thread char p[8][1024];
    static __thread int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

void rm_rf(const char *dir) {
    if (dir) nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

int copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
    if (!in || !out) {
        if (in) fclose(in);
        return -1;
    }
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    fclose(in);
    return fclose(out);
}

int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

int write_raw_safetensors(const char *path, const char *header_json, const void *data, size_t data_len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t hl = strlen(header_json), padded = (hl + 7) / 8 * 8;
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header_json, 1, hl, f);
    for (size_t i = hl; i < padded; i++) fputc(' ', f);
    if (data_len) fwrite(data, 1, data_len, f);
    return fclose(f);
}

#include <jansson.h>

int write_model_variant(const char *src, const char *dst_dir, const char *drop, const char *transpose) {
    char from[2048], to[2048];
    const char *files[] = {"config.json", "generation_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof from, "%s/%s", fixture_dir(src), files[i]);
        snprintf(to, sizeof to, "%s/%s", dst_dir, files[i]);
        if (copy_file(from, to) != 0) return -1;
    }
    tern_st_file f;
    tern_error err;
    snprintf(from, sizeof from, "%s/model.safetensors", fixture_dir(src));
    if (tern_st_open(&f, from, &err) != 0) return -1;
    json_t *hdr = json_object();
    size_t total = 0;
    for (int i = 0; i < f.n_tensors; i++) total += f.tensors[i].nbytes;
    uint8_t *data = malloc(total + 1);
    size_t off = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const tern_tensor *t = &f.tensors[i];
        if (drop && strcmp(t->name, drop) == 0) continue;
        json_t *shape = json_array();
        int swap = transpose && strcmp(t->name, transpose) == 0 && t->ndim == 2;
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[swap ? 1 - d : d]));
        json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", tern_dtype_name(t->dtype), "shape", shape,
                              "data_offsets", (json_int_t)off, (json_int_t)(off + t->nbytes));
        json_object_set_new(hdr, t->name, e);
        memcpy(data + off, t->data, t->nbytes);
        off += t->nbytes;
    }
    char *text = json_dumps(hdr, JSON_COMPACT);
    snprintf(to, sizeof to, "%s/model.safetensors", dst_dir);
    int rc = write_raw_safetensors(to, text, data, off);
    free(text);
    free(data);
    json_decref(hdr);
    tern_st_close(&f);
    return rc;
}

const char *tern_bin(void) {
    const char *b = getenv("TERN_BIN");
    return b && *b ? b : "build/tern";
}

char *run_sh(const char *cmd, int *rc) {
    FILE *p = popen(cmd, "r");
    if (!p) {
        *rc = -1;
        return strdup("popen failed");
    }
    size_t cap = 1 << 16, n = 0, r;
    char *out = malloc(cap);
    while (out && (r = fread(out + n, 1, cap - n - 1, p)) > 0) {
        n += r;
        if (n + 1 == cap) out = realloc(out, cap *= 2);
    }
    if (out) out[n] = '\0';
    int st = pclose(p);
    *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}
