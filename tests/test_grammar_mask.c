/* Token masks against the slow path, bit for bit: on random walks through
 * grammars (the schema suite, tool calls, GBNF, the reasoning prefix),
 * every token of the vocabulary is also read byte by byte from the state
 * (gm_token_allowed), with no budget and with one that must make the
 * walk end in time. The embedded model's tokenizer always; the real Qwen
 * vocabulary when TERN_QWEN_TOKENIZER names it
 * (tools/tokenizer/fetch_qwen_tokenizer.sh), on fewer steps. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/compiled.h"
#include "grammar/matcher.h"
#include "grammar/tables.h"
#include "tern.h"
#include "testutil.h"

typedef struct vocab_fixture {
    tern_tokenizer *tok;
    tern_grammar_vocab *v;
    int V, words;
    int32_t eos[2];
} vocab_fixture;

static void vocab_open(vocab_fixture *f, const char *dir) {
    tern_error err;
    f->tok = tern_tokenizer_load(dir, &err);
    cr_assert(f->tok, "%s", err.msg);
    f->V = tern_tokenizer_vocab_size(f->tok);
    f->eos[0] = tern_tokenizer_token_id(f->tok, "<|im_end|>");
    f->eos[1] = tern_tokenizer_token_id(f->tok, "<|endoftext|>");
    cr_assert(f->eos[0] >= 0 && f->eos[1] >= 0);
    f->v = tern_grammar_vocab_create(f->tok, f->V, f->eos, 2, &err);
    cr_assert(f->v, "%s", err.msg);
    f->words = tern_grammar_mask_words(f->v);
}

static void vocab_close(vocab_fixture *f) {
    tern_grammar_vocab_destroy(f->v);
    tern_tokenizer_free(f->tok);
}

static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int bit(const uint32_t *mask, int id) { return (mask[id >> 5] >> (id & 31)) & 1; }

/* A walk of up to `steps` tokens drawn uniformly from the masks, the
 * masks of its first 24 steps and of every 4th after compared with the
 * slow path over the whole vocabulary. With a budget
 * the walk must end (the end-of-sequence token) within it. Returns the
 * text (*n_text bytes, NUL-terminated). */
static char *check_walk(vocab_fixture *f, const tern_grammar *g, int steps, int budget, uint64_t seed, const char *what,
                        size_t *n_text) {
    tern_error err;
    tern_matcher *m = tern_matcher_create(g, &err);
    cr_assert(m, "%s", err.msg);
    uint32_t *mask = malloc((size_t)f->words * sizeof *mask);
    size_t cap = 4096, len = 0;
    char *text = calloc(cap, 1);
    int ended = 0;
    for (int step = 0; step < steps && !ended; step++) {
        int left = budget < 0 ? -1 : budget - step;
        cr_assert_eq(tern_matcher_fill_mask(m, mask, left, &err), 0, "%s", err.msg);
        int n = 0, compare = step < 24 || step % 4 == 0;
        for (int id = 0; id < f->V; id++) {
            int fast = bit(mask, id), slow = compare ? gm_token_allowed(m, id, left) : fast;
            if (fast != slow)
                cr_assert_fail("%s, budget %d, step %d after \"%.200s\": token %d (%s) is %s by the mask, %s byte by byte",
                         what, left, step, text, id, tern_tokenizer_token_text(f->tok, id), fast ? "allowed" : "refused",
                         slow ? "allowed" : "refused");
            n += fast;
        }
        for (int id = f->V; id < f->words * 32; id++) cr_assert(!bit(mask, id), "id %d beyond the vocabulary", id);
        cr_assert(n > 0, "%s: no token allowed at step %d after \"%.200s\"", what, step, text);
        int pick = (int)(rnd(&seed) % (uint64_t)n), id = 0;
        for (id = 0; id < f->V; id++)
            if (bit(mask, id) && pick-- == 0) break;
        cr_assert_eq(tern_matcher_accept(m, id, &err), 0, "%s", err.msg);
        if (id == f->eos[0] || id == f->eos[1]) { ended = 1; break; }
        size_t l;
        const char *b = tern_tokenizer_token_bytes(f->tok, id, &l);
        if (len + l + 1 > cap) text = realloc(text, cap = (len + l + 1) * 2);
        memcpy(text + len, b, l);
        text[len += l] = '\0';
    }
    if (budget >= 0 && steps >= budget) cr_expect(ended, "%s: a walk with a budget of %d did not end: %.300s", what, budget, text);
    free(mask);
    tern_matcher_destroy(m);
    if (n_text) *n_text = len;
    return text;
}

static char *read_file(const char *path) {
    FILE *fp = fopen(path, "rb");
    cr_assert(fp, "%s", path);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    return strdup(buf);
}

/* The JSON answer after the reasoning (if any; any bytes, NULs too) parses. */
static void expect_json(const char *text, size_t len, int after_think, const char *what) {
    const char *s = text;
    if (after_think) {
        s = memmem(text, len, "</think>", 8);
        cr_assert(s, "%s: no </think> in %.300s", what, text);
        s += strlen("</think>");
    }
    json_error_t je;
    json_t *v = json_loads(s, JSON_DECODE_ANY, &je);
    cr_expect(v, "%s: the answer does not parse (%s): %.300s", what, je.text, s);
    json_decref(v);
}

/* Every schema of the suite: walks without and with a budget, half with
 * the reasoning first. */
static void schema_suite(vocab_fixture *f, int steps, int stride) {
    DIR *d = opendir("tests/fixtures/schemas");
    cr_assert(d);
    struct dirent *e;
    int n = 0, i = 0;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".json") || i++ % stride) continue;
        char path[512];
        snprintf(path, sizeof path, "tests/fixtures/schemas/%s", e->d_name);
        char *schema = read_file(path);
        for (int think = 0; think < 2; think++) {
            tern_error err;
            tern_grammar *g = tern_grammar_create(&(tern_grammar_spec){.json_schema = schema, .after_think = think},
                                                  f->v, &err);
            cr_assert(g, "%s: %s", e->d_name, err.msg);
            char what[300];
            snprintf(what, sizeof what, "%s%s", e->d_name, think ? " (reasoning first)" : "");
            free(check_walk(f, g, steps / 3, -1, 7 + (uint64_t)n, what, NULL));
            size_t len;
            char *text = check_walk(f, g, steps, steps, 11 + (uint64_t)n, what, &len);
            expect_json(text, len, think, what);
            free(text);
            tern_grammar_destroy(g);
        }
        free(schema);
        n++;
    }
    closedir(d);
    cr_assert(n > 0);
}

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"write_file\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"path\":{\"type\":\"string\"},\"content\":{\"type\":\"string\"},\"mode\":{\"type\":\"string\",\"enum\":[\"w\","
    "\"a\"]},\"lines\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"n\":{\"type\":[\"integer\",\"null\"]}},"
    "\"required\":[\"path\",\"content\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"ping\",\"parameters\":{}}}]";

static const char GBNF[] =
    "root ::= greeting \" \" [A-Z] [a-z]{1,8} (\", \" number)* \"!\"\n"
    "greeting ::= \"Hello\" | \"Hi\" | \"\\u00a1Hola\"\n"
    "number ::= \"-\"? [0-9]+ (\".\" [0-9]+)?\n";

static void other_grammars(vocab_fixture *f, int steps) {
    tern_grammar_spec specs[] = {
        {.tools_json = TOOLS, .tools_required = 1, .parallel_tool_calls = 1},
        {.tools_json = TOOLS, .tools_required = 1, .after_think = 1},
        {.json_schema = "{\"type\":\"integer\"}", .tools_json = TOOLS, .tool_name = "ping"},
        {.gbnf = GBNF},
        {.json_object = 1, .after_think = 1},
    };
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
        tern_error err;
        tern_grammar *g = tern_grammar_create(&specs[i], f->v, &err);
        cr_assert(g, "grammar %zu: %s", i, err.msg);
        char what[32];
        snprintf(what, sizeof what, "grammar %zu", i);
        free(check_walk(f, g, steps / 2, -1, 3 + i, what, NULL));
        free(check_walk(f, g, steps, steps, 5 + i, what, NULL));
        tern_grammar_destroy(g);
    }
}

Test(grammar_mask, agrees_with_the_slow_path_tern_tiny, .timeout = 600) {
    vocab_fixture f;
    vocab_open(&f, "models/tern-tiny");
    schema_suite(&f, 120, 1);
    other_grammars(&f, 160);
    vocab_close(&f);
}

Test(grammar_mask, agrees_with_the_slow_path_qwen, .timeout = 900) {
    const char *dir = getenv("TERN_QWEN_TOKENIZER");
    if (!dir) cr_skip("TERN_QWEN_TOKENIZER not set (tools/tokenizer/fetch_qwen_tokenizer.sh makes one)");
    vocab_fixture f;
    vocab_open(&f, dir);
    schema_suite(&f, 40, 7);
    other_grammars(&f, 60);
    vocab_close(&f);
}

/* With no room in the vocabulary's table cache, every table no grammar
 * holds is evicted: those still held stay shared and right. */
Test(grammar_mask, an_evicting_table_cache_stays_consistent) {
    vocab_fixture f;
    vocab_open(&f, "models/tern-tiny");
    f.v->cache_budget = 0;
    tern_grammar_spec specs[] = {{.json_object = 1},
                                 {.tools_json = TOOLS, .tools_required = 1, .parallel_tool_calls = 1},
                                 {.gbnf = GBNF}};
    tern_grammar *g[3], *again;
    tern_error err;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 3; i++) cr_assert((g[i] = tern_grammar_create(&specs[i], f.v, &err)), "%s", err.msg);
        tern_grammar_destroy(g[round]);   /* its own tables go */
        for (int i = 0; i < 3; i++) {
            if (i == round) continue;
            cr_assert((again = tern_grammar_create(&specs[i], f.v, &err)), "%s", err.msg);
            int shared = 0;
            for (int p = 0; p < g[i]->g->n_elems; p++) shared += g[i]->tab[p] && again->tab[p] == g[i]->tab[p];
            cr_expect(shared > 0, "grammar %d: no table found in the cache again", i);
            free(check_walk(&f, again, 40, -1, 11 + i, "after eviction", NULL));
            tern_grammar_destroy(again);
            free(check_walk(&f, g[i], 40, 40, 17 + i, "held through eviction", NULL));
            tern_grammar_destroy(g[i]);
            cr_assert_eq(gt_cache_check(f.v), 0, "round %d, grammar %d", round, i);
        }
        cr_expect_eq(f.v->n_cache, 0, "tables no grammar holds stay cached");
    }
    vocab_close(&f);
}

/* A budget too small for the grammar to end is no budget: the mask is the
 * plain one (the answer will be cut), never empty. */
Test(grammar_mask, a_budget_below_the_shortest_answer_is_ignored) {
    vocab_fixture f;
    vocab_open(&f, "models/tern-tiny");
    tern_error err;
    tern_grammar *g = tern_grammar_create(
        &(tern_grammar_spec){.json_schema = "{\"type\":\"object\",\"properties\":{\"first_property\":{\"type\":"
                                            "\"string\"}},\"required\":[\"first_property\"]}"},
        f.v, &err);
    cr_assert(g, "%s", err.msg);
    tern_matcher *m = tern_matcher_create(g, &err);
    int shortest = tern_matcher_min_bytes(m);
    cr_assert(shortest > 3);
    uint32_t *a = malloc((size_t)f.words * 4), *b = malloc((size_t)f.words * 4);
    cr_assert_eq(tern_matcher_fill_mask(m, a, -1, &err), 0);
    cr_assert_eq(tern_matcher_fill_mask(m, b, 2, &err), 0);
    cr_expect_arr_eq(a, b, (size_t)f.words * 4);
    cr_assert_eq(tern_matcher_fill_mask(m, b, shortest + 1, &err), 0);
    int n = 0;
    for (int id = 0; id < f.V; id++) n += bit(b, id);
    cr_expect(n > 0);
    free(a);
    free(b);
    tern_matcher_destroy(m);
    tern_grammar_destroy(g);
    vocab_close(&f);
}

/* tests/server/test_structured.py samples each schema with the max_tokens
 * of tests/fixtures/schema_budgets.json: the grammar must be able to end
 * (its end-of-sequence token included) within it, reasoning first or not. */
Test(grammar_mask, schema_budgets_leave_room_to_end) {
    vocab_fixture f;
    vocab_open(&f, "models/tern-tiny");
    json_error_t je;
    json_t *budgets = json_load_file("tests/fixtures/schema_budgets.json", 0, &je);
    cr_assert(json_is_object(budgets), "%s", je.text);
    DIR *d = opendir("tests/fixtures/schemas");
    cr_assert(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".json")) continue;
        json_t *b = json_object_get(budgets, e->d_name);
        cr_assert(json_is_integer(b), "%s has no budget", e->d_name);
        char path[512];
        snprintf(path, sizeof path, "tests/fixtures/schemas/%s", e->d_name);
        char *schema = read_file(path);
        for (int think = 0; think < 2; think++) {
            tern_error err;
            tern_grammar *g = tern_grammar_create(&(tern_grammar_spec){.json_schema = schema, .after_think = think},
                                                  f.v, &err);
            cr_assert(g, "%s: %s", e->d_name, err.msg);
            tern_matcher *m = tern_matcher_create(g, &err);
            cr_expect(tern_matcher_min_bytes(m) + 1 <= json_integer_value(b), "%s: %d tokens end it, the budget is %d",
                      e->d_name, tern_matcher_min_bytes(m) + 1, (int)json_integer_value(b));
            tern_matcher_destroy(m);
            tern_grammar_destroy(g);
        }
        free(schema);
    }
    closedir(d);
    json_decref(budgets);
    vocab_close(&f);
}

/* A budget a few grammars overflow: tables are evicted a part at a time
 * while other grammars hold theirs, and after every grammar made or
 * freed each entry keeps its slot and its place in the index, the cache
 * is within its budget unless every table is held, and the masks of the
 * grammars still held are right. */
Test(grammar_mask, partial_evictions_keep_the_table_cache_sound) {
    vocab_fixture f;
    vocab_open(&f, "models/tern-tiny");
    tern_grammar_spec specs[] = {{.json_object = 1},
                                 {.tools_json = TOOLS, .tools_required = 1, .parallel_tool_calls = 1},
                                 {.tools_json = TOOLS, .tools_required = 1, .after_think = 1},
                                 {.gbnf = GBNF},
                                 {.json_object = 1, .after_think = 1}};
    enum { N = sizeof specs / sizeof *specs };
    tern_error err;
    tern_grammar *g[N] = {0};
    for (int i = 0; i < N; i++) cr_assert((g[i] = tern_grammar_create(&specs[i], f.v, &err)), "%s", err.msg);
    f.v->cache_budget = f.v->cache_bytes / 3;   /* (the releases evict to it) */
    for (int i = 0; i < N; i++) tern_grammar_destroy(g[i]), g[i] = NULL;
    cr_assert_eq(gt_cache_check(f.v), 0);
    uint64_t seed = 99;
    int partial = 0;
    for (int op = 0; op < 60; op++) {
        int i = (int)(rnd(&seed) % N), before = f.v->n_cache, others = 0;
        for (int k = 0; k < N; k++) others += k != i && g[k];
        if (g[i]) {
            tern_grammar_destroy(g[i]);
            g[i] = NULL;
        } else {
            cr_assert((g[i] = tern_grammar_create(&specs[i], f.v, &err)), "%s", err.msg);
        }
        cr_assert_eq(gt_cache_check(f.v), 0, "after op %d", op);
        partial += others && f.v->n_cache > 0 && f.v->n_cache < before;
        if (op % 10 == 9)
            for (int k = 0; k < N; k++)
                if (g[k]) free(check_walk(&f, g[k], 12, -1, 31 + (uint64_t)op + (uint64_t)k, "held", NULL));
    }
    cr_expect_gt(partial, 0, "no eviction left part of the cache while other grammars held tables");
    for (int i = 0; i < N; i++) tern_grammar_destroy(g[i]);
    cr_expect_eq(gt_cache_check(f.v), 0);
    cr_expect_leq(f.v->cache_bytes, f.v->cache_budget);
    vocab_close(&f);
}
