/* tern_grammar_vocab: token kinds and the byte trie (vocab.h). */
#include "grammar/vocab.h"

#include <stdlib.h>
#include <string.h>

#include "grammar/tables.h"
#include "util/err.h"

typedef struct sort_item {
    const char *b;
    uint32_t len;
    int32_t id;
} sort_item;

static int by_bytes(const void *a, const void *b) {
    const sort_item *x = a, *y = b;
    int c = memcmp(x->b, y->b, x->len < y->len ? x->len : y->len);
    if (c) return c;
    return x->len != y->len ? (x->len < y->len ? -1 : 1) : (x->id < y->id ? -1 : x->id > y->id);
}

static uint32_t common_prefix(const tern_grammar_vocab *v, int32_t a, int32_t b) {
    uint32_t n = v->len[a] < v->len[b] ? v->len[a] : v->len[b], i = 0;
    while (i < n && v->bytes[a][i] == v->bytes[b][i]) i++;
    return i;
}

static int build_trie(tern_grammar_vocab *v, int32_t *ids, int n) {
    sort_item *items = malloc((size_t)n * sizeof *items + 1);
    if (!items) return -1;
    for (int i = 0; i < n; i++) items[i] = (sort_item){v->bytes[ids[i]], v->len[ids[i]], ids[i]};
    qsort(items, (size_t)n, sizeof *items, by_bytes);
    for (int i = 0; i < n; i++) ids[i] = items[i].id;
    free(items);
    size_t cap = 0;
    for (int i = 0; i < n; i++) cap += v->len[ids[i]];
    v->t_byte = malloc(cap + 1);
    v->t_depth = malloc((cap + 1) * sizeof *v->t_depth);
    v->t_skip = malloc((cap + 1) * sizeof *v->t_skip);
    v->t_tok = malloc((cap + 1) * sizeof *v->t_tok);
    uint32_t *open = malloc((v->max_depth + 2) * sizeof *open);
    if (!v->t_byte || !v->t_depth || !v->t_skip || !v->t_tok || !open) { free(open); return -1; }
    uint32_t nn = 0, depth = 0;
    for (int i = 0; i < n; i++) {
        int32_t t = ids[i];
        uint32_t l = i ? common_prefix(v, ids[i - 1], t) : 0;
        for (; depth > l; depth--) v->t_skip[open[depth - 1]] = nn;
        for (uint32_t d = l; d < v->len[t]; d++) {
            v->t_byte[nn] = (uint8_t)v->bytes[t][d];
            v->t_depth[nn] = (uint16_t)(d + 1);
            v->t_tok[nn] = -1;
            open[depth++] = nn++;
        }
        int32_t *at = &v->t_tok[open[depth - 1]];
        while (*at >= 0) at = &v->tok_next[*at];
        *at = t;
    }
    for (; depth > 0; depth--) v->t_skip[open[depth - 1]] = nn;
    v->n_nodes = nn;
    free(open);
    return 0;
}

tern_grammar_vocab *tern_grammar_vocab_create(const tern_tokenizer *tok, int n_vocab, const int32_t *eos, int n_eos,
                                              tern_error *err) {
    int n_tok = tok ? tern_tokenizer_vocab_size(tok) : 0;
    if (!tok || n_vocab <= 0) {
        tern_fail(err, "grammar vocabulary: a tokenizer and a vocabulary size are needed");
        return NULL;
    }
    if (n_eos < 0 || (n_eos && !eos)) {
        tern_fail(err, "grammar vocabulary: %d end-of-sequence ids without the ids", n_eos);
        return NULL;
    }
    tern_grammar_vocab *v = calloc(1, sizeof *v);
    int32_t *ids = NULL;
    if (!v) goto oom;
    pthread_mutex_init(&v->mu, NULL);
    v->tok = tok;
    v->n_vocab = n_vocab;
    v->words = (n_vocab + 31) / 32;
    v->cache_budget = (size_t)512 << 20;
    v->kind = malloc((size_t)n_vocab);
    v->bytes = calloc((size_t)n_vocab, sizeof *v->bytes);
    v->len = calloc((size_t)n_vocab, sizeof *v->len);
    v->tok_next = malloc((size_t)n_vocab * sizeof *v->tok_next);
    v->eos = malloc((size_t)(n_eos + 1) * sizeof *v->eos);
    ids = malloc((size_t)n_vocab * sizeof *ids);
    if (!v->kind || !v->bytes || !v->len || !v->tok_next || !v->eos || !ids) goto oom;
    memset(v->kind, GV_NEVER, (size_t)n_vocab);
    for (int32_t id = 0; id < n_vocab; id++) v->tok_next[id] = -1;
    int n_ids = 0;
    for (int32_t id = 0; id < n_vocab && id < n_tok; id++) {
        size_t len = 0;
        const char *b = tern_tokenizer_token_bytes(tok, id, &len);
        if (!b || len == 0 || len > 65535 || tern_tokenizer_is_added(tok, id) == 2) continue;
        v->kind[id] = GV_BYTES;
        v->bytes[id] = b;
        v->len[id] = (uint32_t)len;
        if (len > v->max_depth) v->max_depth = (uint32_t)len;
        ids[n_ids++] = id;
    }
    for (int i = 0; i < n_eos; i++) {
        if (eos[i] < 0 || eos[i] >= n_vocab) {
            tern_fail(err, "grammar vocabulary: end-of-sequence id %d is outside the vocabulary (%d)", eos[i], n_vocab);
            tern_grammar_vocab_destroy(v);
            free(ids);
            return NULL;
        }
        v->kind[eos[i]] = GV_EOS;
        v->eos[v->n_eos++] = eos[i];
    }
    n_ids = 0;
    for (int32_t id = 0; id < n_vocab && id < n_tok; id++)
        if (v->kind[id] == GV_BYTES) ids[n_ids++] = id;
    if (build_trie(v, ids, n_ids)) goto oom;
    free(ids);
    return v;
oom:
    free(ids);
    tern_grammar_vocab_destroy(v);
    tern_fail(err, "out of memory (grammar vocabulary of %d tokens)", n_vocab);
    return NULL;
}

void tern_grammar_vocab_destroy(tern_grammar_vocab *v) {
    if (!v) return;
    gt_cache_clear(v);
    free(v->kind);
    free(v->bytes);
    free(v->len);
    free(v->eos);
    free(v->tok_next);
    free(v->t_byte);
    free(v->t_depth);
    free(v->t_skip);
    free(v->t_tok);
    pthread_mutex_destroy(&v->mu);
    free(v);
}

int tern_grammar_mask_words(const tern_grammar_vocab *v) { return v->words; }
