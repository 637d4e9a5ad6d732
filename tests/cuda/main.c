/* tern-cuda-tests [--time] [--reps N] [--out DIR] [--only NAME[,NAME..]] [--seed N]
 * Runs every op check (check.h) and exits non-zero if any case fails. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/kvquant.h"
#include "util/half.h"

/* ---- random numbers ------------------------------------------------------ */

uint64_t rnd_u64(checker *ck) {
    uint64_t z = (ck->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float rnd_uniform(checker *ck, float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(rnd_u64(ck) >> 11) * 0x1.0p-53);
}

float rnd_normal(checker *ck) {
    double u1 = ((double)(rnd_u64(ck) >> 11) + 1.0) * 0x1.0p-53, u2 = (double)(rnd_u64(ck) >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void rnd_floats(checker *ck, float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = rnd_normal(ck) * scale;
}

void rnd_kv_rows(checker *ck, const tern_kvq *L, uint8_t *K, uint8_t *V, int n) {
    float *row = xmalloc((size_t)L->row_len * sizeof(float));
    for (int j = 0; j < n; j++) {
        rnd_floats(ck, row, (size_t)L->row_len, 1.0f);
        tern_kv_quantize_row(L, row, K + (size_t)j * L->row_bytes);
        rnd_floats(ck, row, (size_t)L->row_len, 1.0f);
        tern_kv_quantize_row(L, row, V + (size_t)j * L->row_bytes);
    }
    free(row);
}

/* ---- device helpers -------------------------------------------------------- */

void die_err(const char *what, const tern_error *err) {
    fprintf(stderr, "tern-cuda-tests: %s: %s\n", what, err->msg);
    exit(2);
}

void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "tern-cuda-tests: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

void *dev_alloc(size_t bytes) {
    tern_error err;
    void *p = tern_cuda_alloc(bytes, &err);
    if (!p) die_err("alloc", &err);
    return p;
}

void *dev_upload(const void *host, size_t bytes) {
    tern_error err;
    void *p = dev_alloc(bytes);
    if (tern_cuda_upload(p, host, bytes, &err)) die_err("upload", &err);
    return p;
}

void dev_download(void *host, const void *dev, size_t bytes) {
    tern_error err;
    if (tern_cuda_download(host, dev, bytes, &err)) die_err("download", &err);
}

float *dev_poison(size_t n) {
    tern_error err;
    float *p = dev_alloc(n * sizeof(float));
    if (tern_cuda_fill(p, 0xff, n * sizeof(float), NULL, &err) || tern_cuda_sync(NULL, &err)) die_err("poison", &err);
    return p;
}

void dev_zero(void *p, size_t bytes) {
    tern_error err;
    if (tern_cuda_fill(p, 0, bytes, NULL, &err) || tern_cuda_sync(NULL, &err)) die_err("zero", &err);
}

void dev_sync(checker *ck, const char *what) {
    tern_error err;
    if (tern_cuda_sync(ck->stream, &err)) die_err(what, &err);
}

/* ---- results --------------------------------------------------------------- */

static void row(checker *ck, const char *op, const char *shape, const char *abs, const char *rel, const char *tol,
                int ok) {
    printf("| %-14s | %-40s | %10s | %10s | %8s | %s |\n", op, shape, abs, rel, tol, ok ? "pass" : "FAIL");
    fflush(stdout);
    ck->cases++;
    if (!ok) ck->failures++;
}

void report(checker *ck, const char *op, const char *shape, const float *gpu, const float *ref, size_t n, double tol) {
    double max_abs = 0, max_ref = 0;
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(gpu[i]) && isfinite(ref[i])) { bad++; continue; }
        double d = fabs((double)gpu[i] - (double)ref[i]);
        if (d > max_abs) max_abs = d;
        if (fabs(ref[i]) > max_ref) max_ref = fabs(ref[i]);
    }
    double rel = max_ref > 0 ? max_abs / max_ref : max_abs;
    char a[32], r[32], t[32];
    snprintf(a, sizeof a, "%.2e", max_abs);
    if (bad) snprintf(r, sizeof r, "%ld NaN", bad);
    else snprintf(r, sizeof r, "%.2e", rel);
    snprintf(t, sizeof t, "%.0e", tol);
    row(ck, op, shape, a, r, t, !bad && rel <= tol);
}

void report_scaled(checker *ck, const char *op, const char *shape, const float *gpu, const float *ref,
                   const float *scale, size_t n, double tol) {
    double max_abs = 0, max_rel = 0;
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(gpu[i]) && isfinite(ref[i])) { bad++; continue; }
        double d = fabs((double)gpu[i] - (double)ref[i]);
        if (d > max_abs) max_abs = d;
        if (scale[i] > 0 && d / scale[i] > max_rel) max_rel = d / scale[i];
        else if (scale[i] <= 0 && d > 0) max_rel = INFINITY;
    }
    char a[32], r[32], t[32];
    snprintf(a, sizeof a, "%.2e", max_abs);
    if (bad) snprintf(r, sizeof r, "%ld NaN", bad);
    else snprintf(r, sizeof r, "%.2e", max_rel);
    snprintf(t, sizeof t, "%.0e", tol);
    row(ck, op, shape, a, r, t, !bad && max_rel <= tol);
}

void report_exact(checker *ck, const char *op, const char *shape, long mismatches, long total) {
    char a[32];
    snprintf(a, sizeof a, "%ld/%ld", mismatches, total);
    row(ck, op, shape, a, "exact", "0", mismatches == 0);
}

static void timer_mark(checker *ck, int i) {
    if (tern_cuda_mark(ck->timer, i, ck->stream)) {
        fprintf(stderr, "tern-cuda-tests: recording a timing event failed\n");
        exit(2);
    }
}

void timer_start(checker *ck) { timer_mark(ck, 0); }

float timer_stop(checker *ck) {
    tern_error err;
    timer_mark(ck, 1);
    if (tern_cuda_sync(ck->stream, &err)) die_err("timing", &err);
    return tern_cuda_marks_ms(ck->timer, 0, 1);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double time_op(checker *ck, void (*fn)(void *arg, int rep), void *arg) {
    tern_error err;
    for (int i = 0; i < 3; i++) fn(arg, i);
    dev_sync(ck, "warm-up");
    /* ck->reps calls captured in one graph: back-to-back kernels without
     * the CPU launch cost, as the engine will replay a decode step */
    if (tern_cuda_capture_begin(ck->stream, &err)) die_err("capture", &err);
    for (int i = 0; i < ck->reps; i++) fn(arg, i);
    tern_graph g = tern_cuda_capture_end(ck->stream, &err);
    if (!g) die_err("capture", &err);
    if (tern_cuda_graph_launch(g, ck->stream, &err)) die_err("graph", &err);
    dev_sync(ck, "graph warm-up");
    double ms[5];
    for (int r = 0; r < 5; r++) {
        timer_start(ck);
        if (tern_cuda_graph_launch(g, ck->stream, &err)) die_err("graph", &err);
        ms[r] = timer_stop(ck) / ck->reps;
    }
    dev_sync(ck, "timing");
    tern_cuda_graph_destroy(g);
    qsort(ms, 5, sizeof(double), cmp_double);
    return ms[2];
}

void report_time(checker *ck, const char *op, const char *shape, double ms, double bytes) {
    double gbs = bytes / (ms * 1e-3) / 1e9;
    printf("| time %-9s | %-40s | %8.1f us | %9.1f MB | %7.0f GB/s | %4.1f%% of 4.4 TB/s |\n", op, shape, ms * 1e3,
           bytes / 1e6, gbs, gbs / 4400.0 * 100.0);
    fflush(stdout);
    if (ck->times) fprintf(ck->times, "%s\t%s\t%.2f\t%.3f\t%.0f\n", op, shape, ms * 1e3, bytes / 1e6, gbs);
}

double time_eager(checker *ck, void (*fn)(void *arg, int rep), void *arg, int reps) {
    fn(arg, 0);
    dev_sync(ck, "warm-up");
    double ms[64];
    if (reps > 64) reps = 64;
    if (reps < 1) reps = 1;
    for (int r = 0; r < reps; r++) {
        timer_start(ck);
        fn(arg, r + 1);
        ms[r] = timer_stop(ck);
    }
    dev_sync(ck, "timing");
    qsort(ms, (size_t)reps, sizeof(double), cmp_double);
    return ms[reps / 2];
}

void report_rate(checker *ck, const char *op, const char *shape, double ms, double flops, double bytes) {
    double tf = flops / (ms * 1e-3) / 1e12, gbs = bytes / (ms * 1e-3) / 1e9;
    printf("| time %-9s | %-40s | %8.3f ms | %7.2f TFLOP/s | %7.0f GB/s (%.1f MB) |\n", op, shape, ms, tf, gbs,
           bytes / 1e6);
    fflush(stdout);
    if (ck->times) fprintf(ck->times, "%s\t%s\t%.2f\t%.3f\t%.0f\t%.2f\n", op, shape, ms * 1e3, bytes / 1e6, gbs, tf);
}

int n_copies(size_t bytes) {
    size_t want = (size_t)120 << 20;
    int n = (int)((want + bytes - 1) / (bytes ? bytes : 1));
    return n < 1 ? 1 : n > 32 ? 32 : n;
}

/* ---- random weights -------------------------------------------------------- */

void fill_quant(checker *ck, uint8_t *q, uint16_t *s, uint16_t *b, int64_t rows, int64_t cols, int bits, int group) {
    size_t qb = (size_t)rows * (size_t)cols * (size_t)bits / 8, ng = (size_t)rows * (size_t)(cols / group);
    for (size_t i = 0; i < qb; i += 8) {
        uint64_t r = rnd_u64(ck);
        memcpy(q + i, &r, qb - i < 8 ? qb - i : 8);
    }
    float mid = bits == 4 ? 7.5f : 127.5f;
    for (size_t i = 0; i < ng; i++) {
        float sc = rnd_uniform(ck, 1e-3f, 1e-2f) * (bits == 4 ? 1.0f : 1.0f / 16.0f);
        s[i] = tern_f32_to_bf16(sc);
        b[i] = tern_f32_to_bf16(-mid * sc + rnd_uniform(ck, -0.01f, 0.01f));
    }
}

size_t mat_bytes(const tern_mat *m) {
    if (m->bits) return (size_t)m->rows * m->cols * m->bits / 8 + (size_t)4 * m->rows * (m->cols / m->group);
    return (size_t)m->rows * m->cols * 2;
}

void make_mat(checker *ck, test_mat *m, int64_t rows, int64_t cols, int bits, int dtype, int group) {
    memset(m, 0, sizeof *m);
    tern_mat h = {0};
    h.rows = rows;
    h.cols = cols;
    h.bits = bits;
    h.group = group;
    h.dtype = bits ? TERN_DTYPE_U8 : dtype;
    if (bits) {
        m->q_bytes = (size_t)rows * cols * bits / 8;
        m->sb_bytes = (size_t)rows * (cols / group) * 2;
        uint8_t *q = xmalloc(m->q_bytes);
        uint16_t *s = xmalloc(m->sb_bytes), *b = xmalloc(m->sb_bytes);
        fill_quant(ck, q, s, b, rows, cols, bits, group);
        h.data = q;
        h.scales = s;
        h.biases = b;
    } else {
        m->q_bytes = (size_t)rows * cols * 2;
        uint16_t *w = xmalloc(m->q_bytes);
        for (size_t i = 0; i < (size_t)rows * cols; i++) {
            float v = rnd_normal(ck) * 0.05f;
            if (dtype == TERN_DTYPE_BF16) {
                w[i] = tern_f32_to_bf16(v);
            } else {   /* f16 by way of bf16 bits: any bf16 in range is an exact f16 when small enough */
                float r = tern_bf16_to_f32(tern_f32_to_bf16(v));
                uint32_t u;
                memcpy(&u, &r, 4);
                int e = (int)((u >> 23) & 0xff) - 127;
                uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
                w[i] = (e < -14) ? sign : (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)((u >> 13) & 0x3ffu));
            }
        }
        h.data = w;
    }
    m->h = h;
    m->d = copy_dev_mat(m);
}

tern_mat copy_dev_mat(const test_mat *m) {
    tern_mat d = m->h;
    d.data = dev_upload(m->h.data, m->q_bytes);
    if (m->h.bits) {
        d.scales = dev_upload(m->h.scales, m->sb_bytes);
        d.biases = dev_upload(m->h.biases, m->sb_bytes);
    }
    return d;
}

void free_dev_mat(tern_mat *d) {
    tern_cuda_free((void *)d->data);
    tern_cuda_free((void *)d->scales);
    tern_cuda_free((void *)d->biases);
}

void free_mat(test_mat *m) {
    free((void *)m->h.data);
    free((void *)m->h.scales);
    free((void *)m->h.biases);
    free_dev_mat(&m->d);
}

/* ---- main -------------------------------------------------------------------- */

typedef struct {
    const char *name;
    void (*fn)(checker *);
} check_entry;

static const check_entry checks[] = {
    {"gemv", check_gemv},           {"moe", check_moe},         {"route", check_route}, {"count_experts", check_count_experts},
    {"rmsnorm", check_rmsnorm},     {"attn_prep", check_attn_prep}, {"attention", check_attention},
    {"gdn", check_gdn},             {"sample", check_sample},   {"gemm", check_gemm},
    {"gdn_chunked", check_gdn_chunked}, {"moe_grouped", check_moe_grouped},
    {"attention_prefill", check_attention_prefill}, {"embed", check_embed},
};

/* name is one of the comma-separated names in list */
static int listed(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    checker ck = {0};
    ck.reps = 50;
    ck.rng = 0x7465726e;   /* "tern" */
    const char *out = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--time")) ck.time = 1;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) ck.reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) ck.rng = strtoull(argv[++i], NULL, 0);
        else {
            fprintf(stderr, "usage: %s [--time] [--reps N] [--out DIR] [--only NAME[,NAME..]] [--seed N]\n", argv[0]);
            return 2;
        }
    }
    if (ck.reps < 1) ck.reps = 1;
    tern_error err;
    char name[256];
    if (tern_cuda_init(0, name, sizeof name, &err)) die_err("init", &err);
    if (!(ck.stream = tern_cuda_stream_create(&err)) || !(ck.timer = tern_cuda_marks_create(2, &err))) die_err("init", &err);
    ck.pool = tern_pool_create(0);
    if (out) {
        char path[4096];
        snprintf(path, sizeof path, "%s/cuda-times.tsv", out);
        if (!(ck.times = fopen(path, "w"))) fprintf(stderr, "tern-cuda-tests: cannot write %s\n", path);
        else fprintf(ck.times, "op\tshape\tus\tMB\tGB/s\tTFLOP/s (prefill ops)\n");
    }
    printf("device: %s, seed %#llx\n\n", name, (unsigned long long)ck.rng);
    printf("| %-14s | %-40s | %10s | %10s | %8s | %s |\n", "op", "shape", "max abs", "max rel", "tol", "result");
    printf("|----------------|------------------------------------------|------------|------------|----------|------|\n");
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++)
        if (!only || listed(only, checks[i].name)) checks[i].fn(&ck);
    printf("\n%d cases, %d failed\n", ck.cases, ck.failures);
    if (ck.times) fclose(ck.times);
    tern_pool_destroy(ck.pool);
    tern_cuda_marks_destroy(ck.timer);
    tern_cuda_stream_destroy(ck.stream);
    return ck.failures ? 1 : 0;
}
