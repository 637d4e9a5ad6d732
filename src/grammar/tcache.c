/* What a position's table depends on, and the vocabulary's cache of
 * tables keyed by it (tables.h). */
#include <stdlib.h>
#include <string.h>

#include "grammar/tables.h"

/* ---- signatures: what a position's table depends on ------------------------ */

static void sig_add(gt_sig *s, const void *p, size_t n) {
    if (s->too_big) return;
    if (s->n + n > GT_SIG_MAX) { s->too_big = 1; return; }
    if (s->n + n > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        while (cap < s->n + n) cap *= 2;
        uint8_t *q = realloc(s->b, cap);
        if (!q) { s->too_big = 1; return; }
        s->b = q;
        s->cap = cap;
    }
    memcpy(s->b + s->n, p, n);
    s->n += n;
}

static void sig_elems(gt_sig *s, const gr_grammar *g, uint32_t p, int32_t *local, uint32_t *queue, uint32_t *nq) {
    for (;; p++) {
        uint32_t e = g->elems[p], out[9];
        if (GR_KIND(e) == GR_END) {
            uint8_t end = 'E';
            sig_add(s, &end, 1);
            return;
        }
        if (GR_KIND(e) == GR_CLASS) {
            out[0] = 'C';
            memcpy(out + 1, &g->classes[GR_ARG(e)], 32);
            sig_add(s, out, 36);
        } else {
            uint32_t r = GR_ARG(e);
            if (local[r] < 0) local[r] = (int32_t)*nq, queue[(*nq)++] = r;
            out[0] = 'R';
            out[1] = (uint32_t)local[r];
            sig_add(s, out, 8);
        }
    }
}

static uint64_t fnv(const uint8_t *b, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

int gt_signature(const gr_grammar *g, uint32_t p, int32_t *local, uint32_t *queue, gt_sig *s) {
    uint32_t nq = 0;
    s->n = 0;
    s->too_big = 0;
    uint32_t r0 = g->rule_of[p];
    sig_add(s, &g->follow[r0], sizeof g->follow[r0]);
    sig_add(s, &g->follow_end[r0], 1);
    sig_elems(s, g, p, local, queue, &nq);
    for (uint32_t k = 0; k < nq && !s->too_big; k++) {
        uint32_t r = queue[k], n = g->rule_alt[r + 1] - g->rule_alt[r];
        sig_add(s, &n, 4);
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) sig_elems(s, g, g->alt_pos[a], local, queue, &nq);
    }
    for (uint32_t k = 0; k < nq; k++) local[queue[k]] = -1;
    if (!s->too_big) s->h = fnv(s->b, s->n);
    return s->too_big ? -1 : 0;
}


/* ---- the cache, its entries indexed by signature ---------------------------- */

struct gv_entry {
    uint64_t h;
    uint8_t *key;
    size_t klen;
    gt_table *t;
    int refs;
    unsigned long long used;
};

static void index_add(tern_grammar_vocab *v, int i) {
    uint32_t m = v->index_cap - 1, k = (uint32_t)v->cache[i].h & m;
    while (v->index[k]) k = (k + 1) & m;
    v->index[k] = (uint32_t)i + 1;
}

/* Every entry indexed afresh: after removals, or into a larger index. */
static int index_rebuild(tern_grammar_vocab *v, uint32_t cap) {
    if (cap != v->index_cap) {
        uint32_t *ix = malloc((size_t)cap * sizeof *ix);
        if (!ix) return -1;
        free(v->index);
        v->index = ix;
        v->index_cap = cap;
    }
    memset(v->index, 0, (size_t)v->index_cap * sizeof *v->index);
    for (int i = 0; i < v->n_cache; i++) index_add(v, i);
    return 0;
}

static gv_entry *index_find(const tern_grammar_vocab *v, const gt_sig *s) {
    uint32_t m = v->index_cap - 1;
    for (uint32_t k = (uint32_t)s->h & m; v->index_cap && v->index[k]; k = (k + 1) & m) {
        gv_entry *e = &v->cache[v->index[k] - 1];
        if (e->h == s->h && e->klen == s->n && !memcmp(e->key, s->b, s->n)) return e;
    }
    return NULL;
}

/* Room for one more entry, in the array and in the index. */
static int make_room(tern_grammar_vocab *v) {
    if (v->n_cache == v->cap_cache) {
        int cap = v->cap_cache ? v->cap_cache * 2 : 64;
        gv_entry *c = realloc(v->cache, (size_t)cap * sizeof *c);
        if (!c) return -1;
        v->cache = c;
        v->cap_cache = cap;
    }
    if (((uint32_t)v->n_cache + 1) * 2 > v->index_cap) return index_rebuild(v, v->index_cap ? v->index_cap * 2 : 128);
    return 0;
}

gt_table *gt_cache_get(tern_grammar_vocab *v, const gt_sig *s) {
    gt_table *t = NULL;
    pthread_mutex_lock(&v->mu);
    gv_entry *e = index_find(v, s);
    if (e) {
        e->refs++;
        e->used = ++v->clock;
        t = e->t;
    }
    pthread_mutex_unlock(&v->mu);
    return t;
}

static int by_use(const void *a, const void *b) {
    unsigned long long x = (*(gv_entry *const *)a)->used, y = (*(gv_entry *const *)b)->used;
    return (x > y) - (x < y);
}

/* Over the budget: the least recently used tables no grammar holds go
 * until a quarter of the budget is free, in one pass (a sort, then the
 * array compacted and the index rebuilt once), so a cache that stays full
 * costs a pass per quarter of its budget, not a scan per table added. */
static void cache_evict(tern_grammar_vocab *v) {
    if (v->cache_bytes <= v->cache_budget) return;
    gv_entry **free_ones = malloc((size_t)v->n_cache * sizeof *free_ones);
    if (!free_ones) return;   /* (over budget until the next put) */
    int n = 0;
    for (int i = 0; i < v->n_cache; i++)
        if (!v->cache[i].refs) free_ones[n++] = &v->cache[i];
    if (!n) {   /* every table is held: nothing to compact or re-index */
        free(free_ones);
        return;
    }
    qsort(free_ones, (size_t)n, sizeof *free_ones, by_use);
    size_t low = v->cache_budget / 4 * 3;
    for (int k = 0; k < n && v->cache_bytes > low; k++) {
        gv_entry *e = free_ones[k];
        v->cache_bytes -= e->t->bytes + e->klen;
        gt_table_free(e->t);
        free(e->key);
        e->t = NULL;
    }
    free(free_ones);
    int kept = 0;
    for (int i = 0; i < v->n_cache; i++) {
        if (!v->cache[i].t) continue;
        v->cache[kept] = v->cache[i];
        v->cache[kept].t->slot = kept;
        kept++;
    }
    v->n_cache = kept;
    index_rebuild(v, v->index_cap);   /* (the same size: it cannot fail) */
}

gt_table *gt_cache_put(tern_grammar_vocab *v, const gt_sig *s, gt_table *t) {
    uint8_t *key = malloc(s->n);
    if (!key) return t;
    memcpy(key, s->b, s->n);
    pthread_mutex_lock(&v->mu);
    gv_entry *e = index_find(v, s);
    gt_table *found = e ? e->t : NULL;
    if (e) {
        e->refs++;
    } else if (make_room(v) == 0) {   /* (else it stays the grammar's own) */
        t->cached = 1;
        t->slot = v->n_cache;
        v->cache[v->n_cache++] = (gv_entry){s->h, key, s->n, t, 1, ++v->clock};
        index_add(v, t->slot);
        v->cache_bytes += t->bytes + s->n;
        key = NULL;
        cache_evict(v);
    }
    pthread_mutex_unlock(&v->mu);
    free(key);
    if (found) gt_table_free(t);
    return found ? found : t;
}

void gt_release(tern_grammar_vocab *v, gt_table **tabs, int n) {
    if (!tabs) return;
    pthread_mutex_lock(&v->mu);
    for (int p = 0; p < n; p++) {
        gt_table *t = tabs[p];
        if (!t) continue;
        if (t->cached) v->cache[t->slot].refs--;
        else gt_table_free(t);
    }
    cache_evict(v);
    pthread_mutex_unlock(&v->mu);
    free(tabs);
}

void gt_cache_clear(tern_grammar_vocab *v) {
    for (int i = 0; i < v->n_cache; i++) {
        gt_table_free(v->cache[i].t);
        free(v->cache[i].key);
    }
    free(v->cache);
    free(v->index);
    v->cache = NULL;
    v->index = NULL;
    v->n_cache = v->cap_cache = 0;
    v->index_cap = 0;
    v->cache_bytes = 0;
}

int gt_cache_check(tern_grammar_vocab *v) {
    pthread_mutex_lock(&v->mu);
    size_t bytes = 0;
    int held = 0, rc = 0;
    for (int i = 0; i < v->n_cache && rc == 0; i++) {
        const gv_entry *e = &v->cache[i];
        gt_sig s = {.b = e->key, .n = e->klen, .h = e->h};
        if (!e->t || !e->t->cached || e->t->slot != i || e->refs < 0 || index_find(v, &s) != e) rc = -1;
        else bytes += e->t->bytes + e->klen, held += e->refs > 0;
    }
    int indexed = 0;
    for (uint32_t k = 0; k < v->index_cap; k++) {
        indexed += v->index[k] != 0;
        if (v->index[k] > (uint32_t)v->n_cache) rc = -1;
    }
    if (rc == 0 && (indexed != v->n_cache || bytes != v->cache_bytes || (bytes > v->cache_budget && held < v->n_cache)))
        rc = -1;
    pthread_mutex_unlock(&v->mu);
    return rc;
}
