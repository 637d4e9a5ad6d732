/* Interned automaton states and their transitions (dfa.h). */
#include "grammar/dfa.h"

#include <stdlib.h>
#include <string.h>

int dfa_init(dfa *d, pda *p, uint32_t max_states) {
    memset(d, 0, sizeof *d);
    d->p = p;
    d->max_states = max_states;
    d->ht_cap = 1024;
    d->ht = malloc(d->ht_cap * sizeof *d->ht);
    if (!d->ht) return -1;
    memset(d->ht, 0xFF, d->ht_cap * sizeof *d->ht);
    return 0;
}

void dfa_free(dfa *d) {
    free(d->s);
    free(d->pool);
    free(d->next);
    free(d->ht);
    pda_state_free(&d->tmp);
    pda_state_free(&d->in);
    memset(d, 0, sizeof *d);
}

static uint32_t hash_of(uint32_t flags, const uint32_t *ids, uint32_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ flags;
    for (uint32_t i = 0; i < n; i++) h = (h ^ ids[i]) * 0x100000001b3ull;
    return (uint32_t)(h ^ h >> 32);
}

static int same(const dfa *d, uint32_t id, const pda_state *s) {
    const dfa_state *x = &d->s[id];
    return x->flags == s->flags && x->n == s->n && (!s->n || !memcmp(d->pool + x->off, s->ids, s->n * sizeof *s->ids));
}

static int rehash(dfa *d) {
    uint32_t cap = d->ht_cap * 2;
    uint32_t *ht = malloc(cap * sizeof *ht);
    if (!ht) return -1;
    memset(ht, 0xFF, cap * sizeof *ht);
    for (uint32_t i = 0; i < d->n; i++) {
        uint32_t h = hash_of(d->s[i].flags, d->pool + d->s[i].off, d->s[i].n) & (cap - 1);
        while (ht[h] != 0xFFFFFFFFu) h = (h + 1) & (cap - 1);
        ht[h] = i;
    }
    free(d->ht);
    d->ht = ht;
    d->ht_cap = cap;
    return 0;
}

int32_t dfa_intern(dfa *d, const pda_state *s) {
    uint32_t h = hash_of(s->flags, s->ids, s->n) & (d->ht_cap - 1);
    for (; d->ht[h] != 0xFFFFFFFFu; h = (h + 1) & (d->ht_cap - 1))
        if (same(d, d->ht[h], s)) return (int32_t)d->ht[h];
    if (d->n >= d->max_states) return -1;
    if (d->n == d->cap) {
        uint32_t cap = d->cap ? d->cap * 2 : 64;
        dfa_state *x = realloc(d->s, cap * sizeof *x);
        int32_t *nx = x ? realloc(d->next, (size_t)cap * 256 * sizeof *nx) : NULL;
        if (x) d->s = x;
        if (!nx) return -1;
        d->next = nx;
        d->cap = cap;
    }
    if (d->pn + s->n > d->pcap) {
        size_t cap = d->pcap ? d->pcap * 2 : 1024;
        while (cap < d->pn + s->n) cap *= 2;
        uint32_t *q = realloc(d->pool, cap * sizeof *q);
        if (!q) return -1;
        d->pool = q;
        d->pcap = cap;
    }
    uint32_t id = d->n++;
    if (s->n) memcpy(d->pool + d->pn, s->ids, s->n * sizeof *s->ids);
    d->s[id] = (dfa_state){(uint32_t)d->pn, s->n, s->flags, pda_state_min(d->p, s)};
    d->pn += s->n;
    for (int b = 0; b < 256; b++) d->next[(size_t)id * 256 + b] = DFA_UNKNOWN;
    d->ht[h] = id;
    if (d->n * 2 > d->ht_cap && rehash(d)) return -1;
    return (int32_t)id;
}

int32_t dfa_step(dfa *d, int32_t s, unsigned b) {
    int32_t nx = d->next[(size_t)s * 256 + b];
    if (nx != DFA_UNKNOWN) return nx;
    const dfa_state *x = &d->s[s];
    /* the ids move to a buffer of their own: interning may move the pool */
    pda_state view = {x->flags, x->n, x->n, d->pool + x->off};
    if (pda_state_copy(&d->in, &view) || pda_advance(d->p, d->in.ids, d->in.n, b, &d->tmp)) return -1;
    nx = dfa_intern(d, &d->tmp);
    if (nx >= 0) d->next[(size_t)s * 256 + b] = nx;
    return nx;
}
