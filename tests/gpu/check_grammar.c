/* Constrained decoding drawn on the GPU (the sampler kernels under the
 * grammar's mask) against the CPU sampler, on a packed tern-tiny: greedy
 * ids identical under three grammars at limits that cut the answer short
 * and one that lets it end; sampled ids every one of which the grammar
 * allows; and three generations under different grammars stepping
 * together (tern_gen_step_many, each row drawn under its own mask) giving
 * each one's ids alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define N_GRAMMARS 3
#define MAX_IDS 128

typedef struct {
    tern_tokenizer *tok;
    tern_grammar_vocab *v;
    tern_grammar *g[N_GRAMMARS];
    int32_t eos[2];
} grammars;

typedef struct {
    int32_t ids[MAX_IDS];
    int n;
} ids;

static void die(const char *what, const tern_error *err) {
    fprintf(stderr, "%s: %s\n", what, err->msg);
    exit(2);
}

static void open_grammars(grammars *gr, const tern_model *m) {
    tern_error err;
    if (!(gr->tok = tern_tokenizer_load("models/tern-tiny", &err))) die("tokenizer", &err);
    gr->eos[0] = tern_tokenizer_token_id(gr->tok, "<|im_end|>");
    gr->eos[1] = tern_tokenizer_token_id(gr->tok, "<|endoftext|>");
    if (!(gr->v = tern_grammar_vocab_create(gr->tok, tern_model_vocab_size(m), gr->eos, 2, &err))) die("vocab", &err);
    const tern_grammar_spec specs[N_GRAMMARS] = {
        {.json_object = 1},
        {.json_schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"kind\":{\"enum\":"
                        "[\"seed\",\"tree\",\"fruit\"]},\"days\":{\"type\":\"integer\"}},\"required\":[\"name\","
                        "\"kind\",\"days\"],\"additionalProperties\":false}"},
        {.gbnf = "root ::= (\"And \" [a-zA-Z]+ \" \")+ \"said.\""},
    };
    for (int i = 0; i < N_GRAMMARS; i++)
        if (!(gr->g[i] = tern_grammar_create(&specs[i], gr->v, &err))) die("grammar", &err);
}

static void close_grammars(grammars *gr) {
    for (int i = 0; i < N_GRAMMARS; i++) tern_grammar_destroy(gr->g[i]);
    tern_grammar_vocab_destroy(gr->v);
    tern_tokenizer_free(gr->tok);
}

static void collect(void *ctx, int32_t id) {
    ids *l = ctx;
    if (l->n < MAX_IDS) l->ids[l->n++] = id;
}

static tern_gen_params params(const grammars *gr, int i, int n_predict, int sample, uint64_t seed) {
    tern_gen_params p = {.n_predict = n_predict, .on_token = collect, .grammar = gr->g[i]};
    tern_sampler_params_default(&p.sampling);
    p.sampling.do_sample = sample;
    p.sampling.temperature = 1.0f;
    p.sampling.top_k = 20;
    p.sampling.top_p = 1.0f;
    p.sampling.min_p = 0.0f;
    p.sampling.seed = seed;
    p.sampling.n_eos = 2;
    memcpy(p.sampling.eos_ids, gr->eos, sizeof gr->eos);
    return p;
}

/* A prompt of tern-tiny's text, different for each i. */
static void prompt_of(const grammars *gr, int i, int32_t **out, size_t *n) {
    static const char *texts[N_GRAMMARS] = {"And God said, Let there be light: and there was light.", "In the beginning",
                                            "The sea is wide, and the ships upon it are small."};
    tern_error err;
    *out = NULL;
    if (tern_tokenizer_encode(gr->tok, texts[i], strlen(texts[i]), 0, out, n, &err)) die("encode", &err);
}

static void generate(tern_model *m, const grammars *gr, int i, const tern_gen_params *p, ids *out, int *reason) {
    tern_error err;
    tern_session *s = tern_session_create(m, &(tern_session_params){.kv_bits = 16}, &err);
    if (!s) die("session", &err);
    int32_t *prompt;
    size_t P;
    prompt_of(gr, i, &prompt, &P);
    tern_gen_stats st;
    out->n = 0;
    if (tern_generate(s, gr->tok, prompt, P, p, NULL, out, &st, &err)) die("generate", &err);
    *reason = st.stop_reason;
    free(prompt);
    tern_session_destroy(s);
}

static int unlike(const ids *a, const ids *b) {
    int d = a->n != b->n;
    for (int k = 0; k < a->n && k < b->n; k++) d += a->ids[k] != b->ids[k];
    return d;
}

/* Whether a fresh matcher takes every id: 0, else 1. */
static int refused(const tern_grammar *g, const ids *l) {
    tern_error err;
    tern_matcher *m = tern_matcher_create(g, &err);
    if (!m) die("matcher", &err);
    int bad = 0;
    for (int k = 0; k < l->n && !bad; k++) bad = tern_matcher_accept(m, l->ids[k], &err) != 0;
    tern_matcher_destroy(m);
    return bad;
}

static void alone(tern_model *cpu, tern_model *gpu, const grammars *gr) {
    static const int limits[] = {3, 11, 90};
    int differ = 0, cases = 0, ended = 0;
    for (int i = 0; i < N_GRAMMARS; i++)
        for (int l = 0; l < 3; l++) {
            tern_gen_params p = params(gr, i, limits[l], 0, 0);
            ids a, b;
            int ra, rb;
            generate(gpu, gr, i, &p, &a, &ra);
            generate(cpu, gr, i, &p, &b, &rb);
            differ += unlike(&a, &b) + (ra != rb);
            ended += rb == TERN_STOP_EOS;
            cases++;
        }
    char what[128];
    snprintf(what, sizeof what, "grammar, greedy: ids unlike the CPU's (%d cases, %d ended)", cases, ended);
    report(what, differ, 0);
    int bad = 0, n = 0;
    for (int i = 0; i < N_GRAMMARS; i++)
        for (uint64_t seed = 1; seed <= 4; seed++) {
            tern_gen_params p = params(gr, i, 120, 1, seed);
            ids a;
            int ra;
            generate(gpu, gr, i, &p, &a, &ra);
            bad += refused(gr->g[i], &a);
            n += a.n;
        }
    snprintf(what, sizeof what, "grammar, sampled top-k 20: runs the grammar refuses (12, %d ids)", n);
    report(what, bad, 0);
}

/* Three generations, one under each grammar, stepping together. */
static void together(tern_model *gpu, const grammars *gr) {
    tern_error err;
    tern_session *s[N_GRAMMARS];
    tern_gen *g[N_GRAMMARS];
    tern_gen_params p[N_GRAMMARS];
    int32_t *prompt[N_GRAMMARS];
    ids got[N_GRAMMARS], want[N_GRAMMARS];
    for (int i = 0; i < N_GRAMMARS; i++) {
        int reason;
        p[i] = params(gr, i, 40, 0, 0);
        generate(gpu, gr, i, &p[i], &want[i], &reason);
        size_t P;
        prompt_of(gr, i, &prompt[i], &P);
        got[i].n = 0;
        if (!(s[i] = tern_session_create(gpu, &(tern_session_params){.kv_bits = 16}, &err))) die("session", &err);
        if (!(g[i] = tern_gen_create(s[i], gr->tok, prompt[i], P, &p[i], NULL, &got[i], &err))) die("gen", &err);
    }
    float *logits = malloc((size_t)N_GRAMMARS * tern_model_vocab_size(gpu) * sizeof(float));
    tern_gen *live[N_GRAMMARS];
    int rc[N_GRAMMARS];
    for (;;) {
        int n = 0;
        const int32_t *tok;
        for (int i = 0; i < N_GRAMMARS; i++)
            if (tern_gen_input(g[i], &tok) > 0) live[n++] = g[i];
        if (!n) break;
        if (tern_gen_step_many(live, n, NULL, NULL, NULL, 0, logits, rc, &err)) die("step_many", &err);
        for (int i = 0; i < n; i++)
            if (rc[i]) die("step_many row", &err);
    }
    int differ = 0;
    for (int i = 0; i < N_GRAMMARS; i++) {
        tern_gen_end(g[i], 1, NULL);
        differ += unlike(&got[i], &want[i]);
        tern_session_destroy(s[i]);
        free(prompt[i]);
    }
    report("grammar, 3 generations stepping together: ids unlike alone", differ, 0);
    free(logits);
}

void check_grammar(const char *dir) {
    tern_model *cpu = load(dir, NULL), *gpu = load(dir, "cuda");
    grammars gr;
    open_grammars(&gr, gpu);
    alone(cpu, gpu, &gr);
    together(gpu, &gr);
    close_grammars(&gr);
    tern_model_free(cpu);
    tern_model_free(gpu);
}
