/* Per-position token tables: what a mask needs that does not depend on
 * the rest of the stack, computed once per grammar position (in the
 * manner of xgrammar's adaptive token mask cache).
 *
 * A position is run alone over PDA_SENTINEL through the vocabulary trie.
 * A token whose bytes the position's own rules take whole is accepted
 * whatever lies below (acc; g: the fewest bytes left in those rules after
 * it). A token that dies inside them is rejected. A token that can leave
 * them part way (the rule ends, and the next byte may follow the rule) is
 * uncertain: the rest of its bytes (its suffix) must be read by the stack
 * below, which only the matcher knows; suffixes are kept sorted and
 * shared, so the matcher reads each common prefix once.
 *
 * Tables are shared through the vocabulary's cache, keyed by everything
 * the walk depends on: the rules reachable from the position and the
 * bytes that may follow its rule. The same JSON string, whitespace or
 * reasoning rule in another grammar finds its tables there. */
#ifndef TERN_GRAMMAR_TABLES_H
#define TERN_GRAMMAR_TABLES_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"
#include "grammar/vocab.h"

/* Accepted sets this large are kept as a mask, smaller ones as ids. */
#define GT_LIST_MAX 4096

/* Suffixes sorted, each with its tokens: per suffix, its offset in sfx,
 * length, common prefix with the previous one, first index in tok and
 * count. */
typedef struct gt_suffixes {
    uint32_t n;
    uint32_t *s;
    uint8_t *sfx;
    uint32_t *tok;
} gt_suffixes;

struct gt_table {
    uint32_t n_acc;
    uint32_t *acc;               /* ids (n_acc < GT_LIST_MAX) */
    uint32_t *bits;              /* or a mask of words */
    uint32_t gmin, gmax;         /* over acc: fewest bytes left in the position's rules */
    uint32_t n_grow;
    uint32_t *grow;              /* (id, g) pairs of acc with g > gmin, g descending */
    gt_suffixes unc;             /* the uncertain tokens */
    gt_suffixes unc_acc;         /* accepted tokens that may also leave the position's rules: with a budget
                                  * that cuts them, the way out may still end in time */
    size_t bytes;                /* memory held */
    int cached;                  /* owned by the vocabulary's cache */
    int slot;                    /* then its entry there */
};

#define GT_UNC_FIELDS 5

void gt_table_free(gt_table *t);

/* A position's signature: the bytes its walk depends on (its rule's
 * follow set, the rest of its alternative, every rule reachable from
 * there) and their hash. */
#define GT_SIG_MAX (64 << 10)
typedef struct gt_sig {
    uint8_t *b;
    size_t n, cap;
    int too_big;                 /* more than GT_SIG_MAX bytes: not cached */
    uint64_t h;
} gt_sig;
/* 0, or -1 when too big to key a cache entry. local and queue: scratch of
 * n_rules entries (local all -1, and left so). */
int gt_signature(const gr_grammar *g, uint32_t p, int32_t *local, uint32_t *queue, gt_sig *s);
/* The cached table of that signature (one more reference), or NULL. */
gt_table *gt_cache_get(tern_grammar_vocab *v, const gt_sig *s);
/* Takes t into the cache (with one reference) unless another thread put
 * the same one there first: then that one is returned and t freed. */
gt_table *gt_cache_put(tern_grammar_vocab *v, const gt_sig *s, gt_table *t);

/* The table of every class position of g (NULL for the others). */
int gt_compile(tern_grammar_vocab *v, const gr_grammar *g, gt_table ***out, tern_error *err);
/* Drops a grammar's hold on its tables. */
void gt_release(tern_grammar_vocab *v, gt_table **tabs, int n);
/* Frees every cached table (the vocabulary's end). */
void gt_cache_clear(tern_grammar_vocab *v);
/* The cache's invariants (tests): each entry's table knows its slot and
 * the index finds it, the bytes add up, and the cache is within its
 * budget unless every table is held. 0, or -1. */
int gt_cache_check(tern_grammar_vocab *v);

#endif
