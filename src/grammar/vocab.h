/* A tokenizer's vocabulary as grammars see it (tern_grammar_vocab): every
 * id's bytes and kind, a trie of the byte strings, and the cache of
 * per-position token tables shared by all grammars of this vocabulary.
 *
 * The trie is stored in preorder: node i reads byte t_byte[i] at depth
 * t_depth[i] (1 for the root's children), its subtree ends before
 * t_skip[i], and t_tok[i] is the first id whose bytes end there (-1: none;
 * tok_next chains ids with the same bytes). */
#ifndef TERN_GRAMMAR_VOCAB_H
#define TERN_GRAMMAR_VOCAB_H

#include <pthread.h>
#include <stdint.h>

#include "tern.h"

enum { GV_BYTES = 0, GV_NEVER = 1, GV_EOS = 2 };

typedef struct gt_table gt_table;
typedef struct gv_entry gv_entry;

struct tern_grammar_vocab {
    const tern_tokenizer *tok;
    int n_vocab, words;
    uint8_t *kind;               /* per id (n_vocab) */
    const char **bytes;          /* per id: the tokenizer's bytes (GV_BYTES) */
    uint32_t *len;
    int32_t *eos;
    int n_eos;
    uint32_t n_nodes, max_depth;
    uint8_t *t_byte;
    uint16_t *t_depth;
    uint32_t *t_skip;
    int32_t *t_tok;
    int32_t *tok_next;
    /* the table cache (tables.c) */
    pthread_mutex_t mu;
    gv_entry *cache;
    int n_cache, cap_cache;
    uint32_t *index;             /* open addressing by signature hash: entry + 1, 0 empty */
    uint32_t index_cap;          /* a power of two, over twice n_cache */
    size_t cache_bytes, cache_budget;
    unsigned long long clock;
};

#endif
