/* Weight GEMV throughput at the shapes of Qwen3.6 35B-A3B decode, in GB/s of
 * weight bytes streamed (packed q + bf16 scales + biases), for each ISA
 * variant on 1 and 2 threads, against this machine's memory bandwidth as
 * the roofline; then the small-batch kernel and the KV attention loops.
 *
 *   build/bench/bench_kernels [--quick]
 *
 * "hot" multiplies the same matrix again and again, so a matrix that fits
 * the caches measures the kernel's arithmetic; "cold" cycles through
 * copies totalling >= 1 GiB, so every byte comes from DRAM, as routed
 * experts do in decode. Every call (one matrix, one pool loop) is timed
 * on its own and a cell is "median/best" over the calls: on a machine
 * shared with other work a long timed run is always preempted somewhere,
 * while most single calls are not, so the median call is what the kernel
 * does and the best its ceiling; the load average is printed with them.
 * Threads split the rows with tern_pool_for, one parallel loop per matrix
 * (so the small expert shapes pay the pool's wake-up every call, as the
 * engine would). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attention.h"
#include "cpu/kvquant.h"
#include "cpu/qmatvec.h"
#include "model/safetensors.h"
#include "util/pool.h"
#include "util/clock.h"

#define COLD_BYTES ((size_t)1 << 30)

static int quick;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Rates (work / time) of the median and the fastest of n timed runs. */
typedef struct {
    double med, best;
} rate;

static rate rate_of(double work, double *t, int n) {
    double lo = t[0];
    for (int i = 1; i < n; i++) lo = t[i] < lo ? t[i] : lo;
    return (rate){work / median(t, n), work / lo};
}

static void print_loadavg(const char *when) {
    FILE *f = fopen("/proc/loadavg", "r");
    char buf[128] = "";
    if (f) {
        if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
        fclose(f);
    }
    buf[strcspn(buf, "\n")] = 0;
    printf("load average %s: %s\n", when, buf[0] ? buf : "n/a");
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "bench_kernels: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* Kernel speed does not depend on the values: fill with cheap noise, and
 * keep scales/biases small finite bf16 so no float goes inf/NaN. */
static void fill_noise(void *p, size_t n, uint64_t seed) {
    uint8_t *b = p;
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        memcpy(b + i, &s, 8);
    }
    for (; i < n; i++) b[i] = (uint8_t)i;
}

static void fill_bf16(uint16_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint16_t)(0x3c00 + (i * 2654435761u >> 20) % 0x100);   /* ~2^-7 .. 2^-6 */
}

/* n copies of one quantized matrix, each one contiguous blob. */
typedef struct {
    tern_mat *m;
    int n;
    void *mem;
    size_t bytes;            /* weight bytes of one matrix */
} mat_set;

static mat_set make_set(int64_t rows, int64_t cols, int bits, int group, int n) {
    mat_set s = {0};
    size_t qb = (size_t)rows * (size_t)cols * (size_t)bits / 8, sb = (size_t)rows * (size_t)(cols / group) * 2;
    size_t stride = (qb + 2 * sb + 4095) & ~(size_t)4095;
    s.bytes = qb + 2 * sb;
    s.n = n;
    s.mem = xmalloc(stride * (size_t)n);
    s.m = xmalloc(sizeof(tern_mat) * (size_t)n);
    for (int i = 0; i < n; i++) {
        uint8_t *base = (uint8_t *)s.mem + stride * (size_t)i;
        fill_noise(base, qb, (uint64_t)i + 1);
        fill_bf16((uint16_t *)(base + qb), 2 * sb / 2);
        s.m[i] = (tern_mat){.data = base, .dtype = TERN_DTYPE_U8, .rows = rows, .cols = cols, .bits = bits,
                            .group = group, .scales = (const uint16_t *)(base + qb),
                            .biases = (const uint16_t *)(base + qb + sb)};
    }
    return s;
}

static void free_set(mat_set *s) {
    free(s->mem);
    free(s->m);
}

typedef struct {
    tern_isa isa;
    const tern_mat *W;
    const float *prep;
    int T;
    float *y;
} gemv_job;

static void gemv_range(void *ctx, int64_t b, int64_t e) {
    const gemv_job *j = ctx;
    tern_gemv_batch(j->isa, j->W, b, e, j->prep, j->T, j->y);
}

/* GB/s of weight bytes over `passes` passes of `count` calls (cycling
 * through the set), each call timed. */
static rate time_gemv(tern_pool *pool, tern_isa isa, const mat_set *s, int count, const float *prep, int T,
                      float *y, int passes) {
    double *t = xmalloc((size_t)count * (size_t)passes * sizeof(double));
    for (int i = 0; i < (count < s->n ? count : s->n); i++) {   /* warm up (and fault in) */
        gemv_job j = {isa, &s->m[i], prep, T, y};
        tern_pool_for(pool, j.W->rows, gemv_range, &j);
    }
    for (int i = 0; i < count * passes; i++) {
        gemv_job j = {isa, &s->m[i % s->n], prep, T, y};
        double t0 = tern_now_s();
        tern_pool_for(pool, j.W->rows, gemv_range, &j);
        t[i] = tern_now_s() - t0;
    }
    rate r = rate_of((double)s->bytes / 1e9, t, count * passes);
    free(t);
    return r;
}

/* How many matrices make a timed run of about `secs` (at a guessed 10
 * GB/s; only the run length depends on it). */
static int count_for(size_t bytes, double secs) {
    double c = secs * 10e9 / (double)bytes;
    return c < 1 ? 1 : (int)c;
}

/* ---- rooflines --------------------------------------------------------- */

typedef struct {
    uint8_t *src, *dst;
    size_t n;
} copy_job;

static void copy_range(void *ctx, int64_t b, int64_t e) {
    const copy_job *j = ctx;
    memcpy(j->dst + b, j->src + b, (size_t)(e - b));
}

typedef struct {
    const float *a;
    float *sums;             /* one per thread slot, by range start */
    int64_t n;
    tern_isa isa;
} read_job;

/* Reads [b, e) of the buffer as two streams (its halves), as a GEMV reads
 * weights; the result is kept so the loads cannot be optimised away. */
static void read_range(void *ctx, int64_t b, int64_t e) {
    const read_job *j = ctx;
    int64_t h = (e - b) / 2;
    j->sums[b * 4 / j->n] = tern_dot_fast(j->isa, j->a + b, j->a + b + h, h);
}

static void rooflines(tern_pool *pool1, tern_pool *pool2) {
    size_t n = COLD_BYTES;
    uint8_t *a = xmalloc(n), *b = xmalloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    float sums[4];
    printf("Roofline (1 GiB buffers in 4 MiB calls, GB/s; memcpy counts the bytes copied once; read =\n"
           "bytes read by tern_dot_fast, two streams):\n");
    printf("  %-10s %11s %11s\n", "", "1 thread", "2 threads");
    tern_pool *pools[2] = {pool1, pool2};
    rate res[2][2];
    size_t piece = (size_t)4 << 20;
    int np = (int)(n / piece);
    double *t = xmalloc((size_t)np * sizeof(double));
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 2; k++) {
            /* one untimed pass faults in and warms up; then each 4 MiB
             * piece is one timed pool loop, as each matrix is below */
            for (int pass = 0; pass < 2; pass++)
                for (int i = 0; i < np; i++) {
                    copy_job cj = {a + (size_t)i * piece, b + (size_t)i * piece, piece};
                    read_job rj = {(const float *)(a + (size_t)i * piece), sums, (int64_t)(piece / 4), tern_isa_best()};
                    double t0 = tern_now_s();
                    if (k == 0) tern_pool_for(pools[p], (int64_t)piece, copy_range, &cj);
                    else tern_pool_for(pools[p], rj.n, read_range, &rj);
                    t[i] = tern_now_s() - t0;
                }
            res[k][p] = rate_of((double)piece / 1e9, t, np);
        }
    free(t);
    for (int k = 0; k < 2; k++)
        printf("  %-10s %5.1f/%-5.1f %5.1f/%-5.1f\n", k ? "read" : "memcpy", res[k][0].med, res[k][0].best,
               res[k][1].med, res[k][1].best);
    printf("\n");
    free(a);
    free(b);
}

/* ---- the GEMV table ---------------------------------------------------- */

typedef struct {
    const char *name;
    int64_t rows, cols;
} shape;

static const shape SHAPES[] = {
    {"expert gate/up", 512, 2048},
    {"expert down", 2048, 512},
    {"attn qkv", 8192, 2048},
    {"lm_head", 248320, 2048},
};

static void gemv_table(tern_pool *pool1, tern_pool *pool2) {
    printf("GEMV, 1 token: GB/s of weight bytes (q + scales + biases); group 64\n");
    printf("%-15s %-4s %7s %-7s %11s %11s %11s %11s\n", "shape", "fmt", "MB", "isa", "hot 1T", "hot 2T", "cold 1T",
           "cold 2T");
    tern_pool *pools[2] = {pool1, pool2};
    for (size_t si = 0; si < sizeof SHAPES / sizeof *SHAPES; si++)
        for (int bits = 4; bits <= 8; bits += 4) {
            const shape *sh = &SHAPES[si];
            mat_set one = make_set(sh->rows, sh->cols, bits, 64, 1);
            int ncold = (int)((COLD_BYTES + one.bytes - 1) / one.bytes);
            if (ncold < 2) ncold = 2;
            mat_set cold = make_set(sh->rows, sh->cols, bits, 64, ncold);
            float *x = xmalloc((size_t)sh->cols * sizeof(float));
            for (int64_t i = 0; i < sh->cols; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
            float *prep = xmalloc(tern_gemv_prep_len(&one.m[0]) * sizeof(float));
            float *y = xmalloc((size_t)sh->rows * sizeof(float));
            tern_gemv_prep(&one.m[0], x, prep);
            for (int v = 0; v < TERN_ISA_COUNT; v++) {
                tern_isa isa = (tern_isa)v;
                if (!tern_isa_supported(isa)) continue;
                rate g[4];
                for (int p = 0; p < 2; p++) {
                    g[p] = time_gemv(pools[p], isa, &one, count_for(one.bytes, quick ? 0.05 : 0.2), prep, 1, y, 1);
                    g[2 + p] = time_gemv(pools[p], isa, &cold, ncold, prep, 1, y, quick ? 1 : 2);
                }
                printf("%-15s q%-3d %7.2f %-7s", sh->name, bits, (double)one.bytes / 1e6, tern_isa_name(isa));
                for (int k = 0; k < 4; k++) printf(" %5.1f/%-5.1f", g[k].med, g[k].best);
                printf("\n");
                fflush(stdout);
            }
            free(x);
            free(prep);
            free(y);
            free_set(&one);
            free_set(&cold);
        }
    printf("\n");
}

/* ---- small batch ------------------------------------------------------- */

static void batch_table(tern_pool *pool1) {
    tern_isa isa = tern_isa_best();
    printf("GEMV batch (tern_gemv_batch, %s, 1 thread, attn qkv 8192x2048, cold): weight GB/s and per-token us\n",
           tern_isa_name(isa));
    printf("%-4s %4s %11s %12s\n", "fmt", "T", "GB/s", "us/token");
    for (int bits = 4; bits <= 8; bits += 4) {
        mat_set one = make_set(8192, 2048, bits, 64, 1);
        int ncold = (int)((COLD_BYTES + one.bytes - 1) / one.bytes);
        free_set(&one);
        mat_set cold = make_set(8192, 2048, bits, 64, ncold);
        size_t plen = tern_gemv_prep_len(&cold.m[0]);
        float *x = xmalloc(2048 * sizeof(float)), *prep = xmalloc(plen * TERN_GEMV_MAX_T * sizeof(float));
        float *y = xmalloc((size_t)8192 * TERN_GEMV_MAX_T * sizeof(float));
        for (int t = 0; t < TERN_GEMV_MAX_T; t++) {
            for (int i = 0; i < 2048; i++) x[i] = (float)((i * (37 + t)) % 101) / 50.0f - 1.0f;
            tern_gemv_prep(&cold.m[0], x, prep + (size_t)t * plen);
        }
        static const int Ts[] = {1, 2, 4, 8};
        for (int k = 0; k < 4; k++) {
            rate gbs = time_gemv(pool1, isa, &cold, ncold, prep, Ts[k], y, quick ? 1 : 2);
            double us = (double)cold.bytes / (gbs.med * 1e9) * 1e6 / Ts[k];
            printf("q%-3d %4d %5.1f/%-5.1f %12.1f\n", bits, Ts[k], gbs.med, gbs.best, us);
            fflush(stdout);
        }
        free(x);
        free(prep);
        free(y);
        free_set(&cold);
    }
    printf("\n");
}

/* ---- KV attention loops ------------------------------------------------ */

/* One decode step of one full-attention layer for one KV head: the 8 query
 * heads of its GQA group against n cached rows (Qwen3.6: 16 query heads, 2
 * KV heads x 256), scores + weighted sum of V, vs the fp32 tern_attend per
 * query head. */
static void kv_table(void) {
    const int nkv = 2, hd = 256, nq = 8;
    static const int ctx[] = {4096, 32768};
    printf("KV attention, one KV head x %d query heads, head_dim %d, 1 thread: us per step, median/best\n(tern_kv_attend; fp32: 8 x tern_attend)\n", nq, hd);
    printf("%-8s %-7s %17s %17s\n", "kv", "isa", "n=4096", "n=32768");
    int nmax = ctx[1];
    float *x = xmalloc((size_t)nkv * hd * sizeof(float));
    float *q = xmalloc((size_t)nq * 2 * hd * sizeof(float)), *o = xmalloc((size_t)nq * hd * sizeof(float));
    float *s = xmalloc((size_t)nq * nmax * sizeof(float));
    for (int i = 0; i < nq * 2 * hd; i++) q[i] = (float)((i * 13) % 17) / 8.0f - 1.0f;
    /* fp32 baseline: the reference engine's cache and tern_attend */
    {
        float *K = xmalloc((size_t)nmax * nkv * hd * sizeof(float)), *V = xmalloc((size_t)nmax * nkv * hd * sizeof(float));
        for (size_t i = 0; i < (size_t)nmax * nkv * hd; i++) K[i] = V[i] = (float)(i % 29) / 14.0f - 1.0f;
        rate us[2];
        for (int c = 0; c < 2; c++) {
            double t[16];
            int reps = quick ? 3 : 15;
            for (int r = 0; r < reps; r++) {
                double t0 = tern_now_s();
                for (int h = 0; h < nq; h++) tern_attend(o + h * hd, q + h * 2 * hd, K, V, ctx[c], nkv * hd, hd, 0.0625f, s);
                t[r] = tern_now_s() - t0;
            }
            us[c] = rate_of(1e-6, t, reps);
        }
        printf("%-8s %-7s %8.0f/%-8.0f %8.0f/%-8.0f\n", "fp32", "ref", 1 / us[0].med, 1 / us[0].best, 1 / us[1].med,
               1 / us[1].best);
        free(K);
        free(V);
    }
    for (int bits = 16; bits >= 4; bits /= 2) {
        tern_kvq L;
        tern_kvq_init(&L, nkv, hd, bits);
        uint8_t *K = xmalloc(L.row_bytes * (size_t)nmax), *V = xmalloc(L.row_bytes * (size_t)nmax);
        for (int j = 0; j < nmax; j++) {
            for (int i = 0; i < nkv * hd; i++) x[i] = (float)((i * 7 + j) % 31) / 15.0f - 1.0f;
            tern_kv_quantize_row(&L, x, K + (size_t)j * L.row_bytes);
            tern_kv_quantize_row(&L, x, V + (size_t)j * L.row_bytes);
        }
        for (int v = 0; v < TERN_ISA_COUNT; v++) {
            tern_isa isa = (tern_isa)v;
            if (!tern_isa_supported(isa)) continue;
            rate us[2];
            for (int c = 0; c < 2; c++) {
                double t[16];
                int reps = quick ? 3 : 15;
                for (int r = 0; r < reps; r++) {
                    double t0 = tern_now_s();
                    tern_kv_attend(isa, &L, 0, q, nq, 2 * hd, K, V, L.row_bytes, ctx[c], 0.0625f, s, o, hd);
                    t[r] = tern_now_s() - t0;
                }
                us[c] = rate_of(1e-6, t, reps);
            }
            char name[16];
            snprintf(name, sizeof name, "%d-bit", bits);
            printf("%-8s %-7s %8.0f/%-8.0f %8.0f/%-8.0f\n", name, tern_isa_name(isa), 1 / us[0].med, 1 / us[0].best,
                   1 / us[1].med, 1 / us[1].best);
            fflush(stdout);
        }
        free(K);
        free(V);
    }
    free(x);
    free(q);
    free(o);
    free(s);
    printf("\n");
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) quick = 1;
        else {
            fprintf(stderr, "usage: %s [--quick]\n", argv[0]);
            return 2;
        }
    }
    tern_pool *pool1 = tern_pool_create(1), *pool2 = tern_pool_create(2);
    if (!pool1 || !pool2) return 1;
    printf("bench_kernels: best ISA %s\n", tern_isa_name(tern_isa_best()));
    print_loadavg("at start");
    printf("\n");
    rooflines(pool1, pool2);
    gemv_table(pool1, pool2);
    batch_table(pool1);
    kv_table();
    print_loadavg("at end");
    tern_pool_destroy(pool1);
    tern_pool_destroy(pool2);
    return 0;
}
