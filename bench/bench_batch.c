/* Decode of B sequences stepping together (tern_gen_step_many: one pass,
 * each row drawn by its own tern_gen, on the device where the engine
 * draws in the step, as the server's batched scheduler does) against one sequence's tern_generate, on a synthetic
 * model: aggregate tok/s, the step's time and its per-sequence share.
 *
 *   build/bench/bench_batch [--synth SHAPE] [--bits 4|8] [--device D] [-b 1,4,16,64] [-c 512] [-n 64] [-r 3]
 *
 * Each sequence gets its own context of c random tokens (prefilled once
 * and snapshotted; every repeat restores them), then n steps sampled at
 * temperature 1, top-k 20. Speaks only the public API (tern.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tern.h"
#include "util/clock.h"

#define MAX_B 256
#define MAX_LIST 16

typedef struct {
    const char *shape, *device;
    int bits, ctx, gen, reps;
    int batch[MAX_LIST], n_batch;
} opts;

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static int32_t random_token(int vocab) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int32_t)(rng % (uint64_t)vocab);
}

static void die(const char *what, const tern_error *err) {
    fprintf(stderr, "bench_batch: %s: %s\n", what, err->msg);
    exit(1);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void count_token(void *ctx, int32_t id) { (void)ctx; (void)id; }

static tern_gen_params gen_params(const opts *o, uint64_t seed) {
    tern_gen_params gp = {.n_predict = o->gen, .ignore_eos = 1, .on_token = count_token};
    tern_sampler_params_default(&gp.sampling);
    gp.sampling.do_sample = 1;
    gp.sampling.temperature = 1.0f;
    gp.sampling.top_k = 20;
    gp.sampling.top_p = 1.0f;
    gp.sampling.seed = seed;
    return gp;
}

/* One repeat of B sequences: n steps of every sequence together. Returns
 * the seconds the steps took. */
static double run_batch(const opts *o, tern_session **s, tern_snapshot **snap, const int32_t *last, int B,
                        float *logits, int vocab, int rep) {
    tern_error err;
    tern_gen *g[MAX_B];
    tern_gen_params gp[MAX_B];
    for (int i = 0; i < B; i++) {
        if (tern_session_restore(s[i], snap[i], &err)) die("restore", &err);
        gp[i] = gen_params(o, (uint64_t)(rep * MAX_B + i));
        if (!(g[i] = tern_gen_create(s[i], NULL, &last[i], 1, &gp[i], NULL, NULL, &err))) die("gen", &err);
    }
    const int32_t *in;
    int rc[MAX_B];
    (void)vocab;
    double t0 = tern_now_s();
    /* every sequence generates o->gen tokens: they end together */
    while (tern_gen_input(g[0], &in) > 0) {
        if (tern_gen_step_many(g, B, NULL, NULL, NULL, 0, logits, rc, &err)) die("step", &err);
        for (int i = 0; i < B; i++)
            if (rc[i]) die("take", &err);
    }
    double dt = tern_now_s() - t0;
    for (int i = 0; i < B; i++) tern_gen_end(g[i], 1, NULL);
    return dt;
}

/* The single-sequence reference: tern_generate (on a GPU the draw stays
 * on the device). */
static double run_one(const opts *o, tern_session *s, tern_snapshot *snap, int32_t last, int rep) {
    tern_error err;
    tern_gen_params gp = gen_params(o, (uint64_t)rep);
    tern_gen_stats st;
    if (tern_session_restore(s, snap, &err)) die("restore", &err);
    double t0 = tern_now_s();
    if (tern_generate(s, NULL, &last, 1, &gp, NULL, NULL, &st, &err)) die("generate", &err);
    return st.decode_s > 0 ? st.decode_s : tern_now_s() - t0;
}

static int parse(int argc, char **argv, opts *o) {
    *o = (opts){.shape = "qwen3.6-35b-a3b", .device = "auto", .bits = 4, .ctx = 512, .gen = 64, .reps = 3,
                .batch = {1, 4, 16}, .n_batch = 3};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--synth")) o->shape = v;
        else if (!strcmp(a, "--device")) o->device = v;
        else if (!strcmp(a, "--bits")) o->bits = atoi(v);
        else if (!strcmp(a, "-c")) o->ctx = atoi(v);
        else if (!strcmp(a, "-n")) o->gen = atoi(v);
        else if (!strcmp(a, "-r")) o->reps = atoi(v);
        else if (!strcmp(a, "-b")) {
            o->n_batch = 0;
            for (char *p = (char *)v; *p && o->n_batch < MAX_LIST; p += *p == ',') {
                o->batch[o->n_batch++] = (int)strtol(p, &p, 10);
                if (*p && *p != ',') return -1;
            }
        } else {
            return -1;
        }
    }
    for (int i = 0; i < o->n_batch; i++)
        if (o->batch[i] < 1 || o->batch[i] > MAX_B) return -1;
    return argc % 2 == 1 && o->ctx >= 2 && o->gen >= 2 && o->reps >= 1 ? 0 : -1;
}

int main(int argc, char **argv) {
    opts o;
    if (parse(argc, argv, &o)) {
        fprintf(stderr, "usage: bench_batch [--synth SHAPE] [--bits 4|8] [--device D] [-b 1,4,16] [-c CTX] [-n N] "
                        "[-r R] (batches 1..%d, c and n at least 2)\n", MAX_B);
        return 2;
    }
    tern_error err;
    tern_load_params lp = {.device = o.device};
    tern_synth_params sp = {.shape = o.shape, .bits = o.bits};
    tern_model *m = tern_model_synth(&sp, &lp, &err);
    if (!m) die("model", &err);
    int vocab = tern_model_vocab_size(m), maxb = 0;
    for (int i = 0; i < o.n_batch; i++) maxb = o.batch[i] > maxb ? o.batch[i] : maxb;
    tern_session *s[MAX_B];
    tern_snapshot *snap[MAX_B];
    int32_t last[MAX_B], *ctx = malloc((size_t)o.ctx * sizeof *ctx);
    float *logits = malloc((size_t)maxb * vocab * sizeof *logits);
    if (!ctx || !logits) return 1;
    tern_session_params spp = {.max_context = o.ctx + o.gen + 8};
    fprintf(stderr, "bench_batch: %d contexts of %d tokens ...\n", maxb, o.ctx);
    for (int i = 0; i < maxb; i++) {
        for (int t = 0; t < o.ctx; t++) ctx[t] = random_token(vocab);
        if (!(s[i] = tern_session_create(m, &spp, &err)) || tern_session_eval(s[i], ctx, o.ctx - 1, NULL, 0, &err) ||
            !(snap[i] = tern_session_snapshot(s[i], &err)))
            die("context", &err);
        last[i] = ctx[o.ctx - 1];
    }
    printf("bench_batch: %s, %d-bit, %s; context %d, %d tokens a sequence, median of %d (1 warm-up)\n\n", o.shape,
           o.bits, tern_model_device(m), o.ctx, o.gen, o.reps);
    printf("| sequences | step ms | tok/s a sequence | tok/s together | against one tern_generate |\n");
    printf("|---:|---:|---:|---:|---:|\n");
    double t[64], one = 0;
    for (int rep = 0; rep <= o.reps && rep < 64; rep++) t[rep] = run_one(&o, s[0], snap[0], last[0], rep);
    qsort(t + 1, (size_t)o.reps, sizeof *t, cmp_double);
    one = o.gen / t[1 + o.reps / 2];
    printf("| 1 (tern_generate) | %.2f | %.1f | %.1f | 1.00 |\n", 1e3 / one, one, one);
    for (int i = 0; i < o.n_batch; i++) {
        int B = o.batch[i];
        for (int rep = 0; rep <= o.reps && rep < 64; rep++) t[rep] = run_batch(&o, s, snap, last, B, logits, vocab, rep);
        qsort(t + 1, (size_t)o.reps, sizeof *t, cmp_double);
        double dt = t[1 + o.reps / 2], per = o.gen / dt;
        printf("| %d | %.2f | %.1f | %.1f | %.2f |\n", B, dt / o.gen * 1e3, per, per * B, per * B / one);
    }
    for (int i = 0; i < maxb; i++) {
        tern_snapshot_free(snap[i]);
        tern_session_destroy(s[i]);
    }
    free(ctx);
    free(logits);
    tern_model_free(m);
    return 0;
}
