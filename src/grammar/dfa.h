/* Automaton states interned as numbers, with their byte transitions
 * remembered: a walk through the vocabulary trie meets the same few
 * states again and again (inside a string, every character leads back
 * to the same one), so each trie node costs a table lookup once its
 * state's transition is known. States are those of one pda (its frame
 * ids). */
#ifndef TERN_GRAMMAR_DFA_H
#define TERN_GRAMMAR_DFA_H

#include <stdint.h>

#include "grammar/pda.h"

#define DFA_UNKNOWN (-2)

typedef struct dfa_state {
    uint32_t off, n;             /* ids in pool */
    uint32_t flags, min;
} dfa_state;

typedef struct dfa {
    pda *p;
    dfa_state *s;
    uint32_t n, cap, max_states;
    uint32_t *pool;
    size_t pn, pcap;
    int32_t *next;               /* n x 256: the state after a byte, or DFA_UNKNOWN */
    uint32_t *ht, ht_cap;        /* state ids by content; 0xFFFFFFFF: empty */
    pda_state tmp, in;
} dfa;

int dfa_init(dfa *d, pda *p, uint32_t max_states);
void dfa_free(dfa *d);
/* The state holding s's frames and flags (interned); -1 when out of room. */
int32_t dfa_intern(dfa *d, const pda_state *s);
/* The state after byte b; -1 when out of room. */
int32_t dfa_step(dfa *d, int32_t s, unsigned b);

#endif
