/* Decode speed under a grammar against without one, on the full-shape
 * synthetic model (random weights, built in memory) with a real
 * vocabulary's tokenizer: each schema of a directory in turn, sampled at
 * temperature 1 with top-k 20 (the GPU draws under the grammar's mask), and
 * between them the same number of tokens without a grammar.
 *
 *     build/bench/bench_gdecode TOKENIZER_DIR [SCHEMA_DIR] [TOKENS] [DEVICE] [BITS]
 *
 * TOKENIZER_DIR: the real Qwen vocabulary (tools/tokenizer/fetch_qwen_tokenizer.sh);
 * SCHEMA_DIR: tests/fixtures/schemas; TOKENS: each run's most (128);
 * DEVICE: cuda (or cpu, auto); BITS: 4 or 8 (4). A schema's answer may end
 * sooner (its EOS); the run without a grammar then makes as many tokens.
 * Prints each schema's tokens and both rates, then the totals' rates and
 * their ratio. The machine should be otherwise idle. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tern.h"
#include "util/file.h"

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void die(const char *what, const tern_error *err) {
    fprintf(stderr, "bench_gdecode: %s: %s\n", what, err->msg);
    exit(1);
}

/* One generation of at most n tokens after the prompt; *tokens and *secs
 * get its decode tokens and seconds (the first id, drawn by the prompt's
 * step, not counted). */
static void run(tern_model *m, const tern_tokenizer *tok, const int32_t *prompt, int P, const tern_grammar *g,
                const int32_t *eos, int n, uint64_t seed, int *tokens, double *secs) {
    tern_error err;
    tern_session *s = tern_session_create(m, &(tern_session_params){.kv_bits = 16}, &err);
    if (!s) die("session", &err);
    tern_gen_params p = {.n_predict = n, .grammar = g, .ignore_eos = !g};
    tern_sampler_params_default(&p.sampling);
    p.sampling.do_sample = 1;
    p.sampling.temperature = 1.0f;
    p.sampling.top_k = 20;
    p.sampling.top_p = 1.0f;
    p.sampling.min_p = 0.0f;
    p.sampling.seed = seed;
    p.sampling.n_eos = 2;
    memcpy(p.sampling.eos_ids, eos, 2 * sizeof *eos);
    tern_gen_stats st;
    if (tern_generate(s, (tern_tokenizer *)tok, prompt, (size_t)P, &p, NULL, NULL, &st, &err)) die("generate", &err);
    *tokens = st.n_generated - 1;
    *secs = st.decode_s;
    tern_session_destroy(s);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_gdecode TOKENIZER_DIR [SCHEMA_DIR] [TOKENS] [DEVICE] [BITS]\n");
        return 2;
    }
    const char *dir = argc > 2 ? argv[2] : "tests/fixtures/schemas", *device = argc > 4 ? argv[4] : "cuda";
    int n = argc > 3 ? atoi(argv[3]) : 128, bits = argc > 5 ? atoi(argv[5]) : 4;
    tern_error err;
    tern_tokenizer *tok = tern_tokenizer_load(argv[1], &err);
    if (!tok) die("tokenizer", &err);
    tern_synth_params sp = {.bits = bits};
    tern_load_params lp = {.device = device};
    fprintf(stderr, "bench_gdecode: building the full-shape model (%d-bit) on %s ...\n", bits, device);
    tern_model *m = tern_model_synth(&sp, &lp, &err);
    if (!m) die("model", &err);
    int32_t eos[2] = {tern_tokenizer_token_id(tok, "<|im_end|>"), tern_tokenizer_token_id(tok, "<|endoftext|>")};
    tern_grammar_vocab *v = tern_grammar_vocab_create(tok, tern_model_vocab_size(m), eos, 2, &err);
    if (!v) die("vocabulary", &err);
    int32_t prompt[32];
    for (int i = 0; i < 32; i++) prompt[i] = (int32_t)((i * 7919 + 101) % tern_tokenizer_vocab_size(tok));
    DIR *d = opendir(dir);
    if (!d) { fprintf(stderr, "bench_gdecode: cannot open %s\n", dir); return 1; }
    char *names[512];
    int n_names = 0;
    for (struct dirent *e; (e = readdir(d)) && n_names < 512;)
        if (strstr(e->d_name, ".json")) names[n_names++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n_names, sizeof *names, by_name);
    /* warm-up: the graphs of both forms captured */
    int t;
    double sec;
    run(m, tok, prompt, 32, NULL, eos, 16, 1, &t, &sec);
    printf("| schema | tokens | tok/s with | tok/s without |\n|---|---:|---:|---:|\n");
    double with_s = 0, without_s = 0;
    long with_t = 0, without_t = 0;
    for (int i = 0; i < n_names; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        char *schema;
        size_t len;
        if (tern_file_read(path, 0, 1 << 20, &schema, &len, &err)) die(names[i], &err);
        tern_grammar *g = tern_grammar_create(&(tern_grammar_spec){.json_schema = schema}, v, &err);
        if (!g) die(names[i], &err);
        int tw, to;
        double sw, so;
        run(m, tok, prompt, 32, g, eos, n, 7 + (uint64_t)i, &tw, &sw);
        run(m, tok, prompt, 32, NULL, eos, tw + 1, 7 + (uint64_t)i, &to, &so);
        printf("| %s | %d | %.1f | %.1f |\n", names[i], tw, sw > 0 ? tw / sw : 0, so > 0 ? to / so : 0);
        with_t += tw;
        with_s += sw;
        without_t += to;
        without_s += so;
        tern_grammar_destroy(g);
        free(schema);
        free(names[i]);
    }
    double rw = with_s > 0 ? with_t / with_s : 0, ro = without_s > 0 ? without_t / without_s : 0;
    printf("\nall %d schemas: %ld tokens, %.1f tok/s with a grammar, %.1f without: %.1f %%\n", n_names, with_t, rw, ro,
           ro > 0 ? 100 * rw / ro : 0);
    tern_grammar_vocab_destroy(v);
    tern_model_free(m);
    tern_tokenizer_free(tok);
    return 0;
}
