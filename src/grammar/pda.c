/* Frames, closures and byte steps of the grammar automaton (pda.h). */
#include "grammar/pda.h"

#include <stdlib.h>
#include <string.h>

#define PDA_BUSY 0xFFFFFFFCu
#define INF_LEN 0x3FFFFFFFu

static uint32_t hash2(uint32_t a, uint32_t b) {
    uint64_t x = ((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 32);
}

int pda_init(pda *p, const gr_grammar *g, uint32_t max_frames) {
    memset(p, 0, sizeof *p);
    p->g = g;
    p->max_frames = max_frames;
    p->ht_cap = 1024;
    p->ht = malloc(p->ht_cap * sizeof *p->ht);
    p->pool_cap = 4096;
    p->pool = malloc(p->pool_cap * sizeof *p->pool);
    if (!p->ht || !p->pool) return -1;
    memset(p->ht, 0xFF, p->ht_cap * sizeof *p->ht);
    /* offset 0: the empty closure */
    p->pool[0] = 0;
    p->pool[1] = 0;
    p->pool_n = 2;
    return 0;
}

void pda_free(pda *p) {
    free(p->f);
    free(p->ht);
    free(p->pool);
    free(p->scratch);
    memset(p, 0, sizeof *p);
}

static int rehash(pda *p) {
    uint32_t cap = p->ht_cap * 2;
    uint32_t *ht = malloc(cap * sizeof *ht);
    if (!ht) return -1;
    memset(ht, 0xFF, cap * sizeof *ht);
    for (uint32_t i = 0; i < p->n; i++) {
        uint32_t h = hash2(p->f[i].pos, p->f[i].parent) & (cap - 1);
        while (ht[h] != 0xFFFFFFFFu) h = (h + 1) & (cap - 1);
        ht[h] = i;
    }
    free(p->ht);
    p->ht = ht;
    p->ht_cap = cap;
    return 0;
}

uint32_t pda_frame_get(pda *p, uint32_t pos, uint32_t parent) {
    uint32_t h = hash2(pos, parent) & (p->ht_cap - 1);
    for (;; h = (h + 1) & (p->ht_cap - 1)) {
        uint32_t id = p->ht[h];
        if (id == 0xFFFFFFFFu) break;
        if (p->f[id].pos == pos && p->f[id].parent == parent) return id;
    }
    if (p->n >= p->max_frames) { p->oom = 1; return PDA_UNSET; }
    if (p->n == p->cap) {
        uint32_t cap = p->cap ? p->cap * 2 : 256;
        pda_frame *f = realloc(p->f, (size_t)cap * sizeof *f);
        if (!f) { p->oom = 1; return PDA_UNSET; }
        p->f = f;
        p->cap = cap;
    }
    int bottom = parent == PDA_ROOT || parent == PDA_SENTINEL;
    uint32_t depth = bottom ? 1 : p->f[parent].depth + 1;
    if (depth > PDA_MAX_DEPTH) { p->oom = 1; return PDA_UNSET; }
    uint32_t id = p->n++;
    uint32_t d = p->g->rem_min[pos] + (bottom ? 0 : p->f[parent].dmin);
    p->f[id] = (pda_frame){pos, parent, PDA_UNSET, PDA_UNSET, d > INF_LEN ? INF_LEN : d, depth};
    p->ht[h] = id;
    if (p->n * 2 > p->ht_cap && rehash(p)) { p->oom = 1; return PDA_UNSET; }
    return id;
}

static int scratch_push(pda *p, uint32_t v) {
    if (p->sn == p->scap) {
        size_t cap = p->scap ? p->scap * 2 : 256;
        uint32_t *s = realloc(p->scratch, cap * sizeof *s);
        if (!s) return -1;
        p->scratch = s;
        p->scap = cap;
    }
    p->scratch[p->sn++] = v;
    return 0;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorts and deduplicates v[0..n); returns the new count. */
static uint32_t unique(uint32_t *v, uint32_t n) {
    if (n < 2) return n;
    if (n == 2) {
        if (v[0] == v[1]) return 1;
        if (v[0] > v[1]) { uint32_t t = v[0]; v[0] = v[1]; v[1] = t; }
        return 2;
    }
    qsort(v, n, sizeof *v, cmp_u32);
    uint32_t k = 1;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] != v[k - 1]) v[k++] = v[i];
    return k;
}

/* Appends closure o's ids to the scratch segment; its flags into *flags. */
static int merge(pda *p, uint32_t o, uint32_t *flags) {
    if (o == PDA_UNSET) return -1;
    *flags |= p->pool[o];
    uint32_t n = p->pool[o + 1];
    for (uint32_t i = 0; i < n; i++)
        if (scratch_push(p, p->pool[o + 2 + i])) return -1;
    return 0;
}

static uint32_t store(pda *p, size_t start, uint32_t flags) {
    uint32_t n = p->sn > start ? unique(p->scratch + start, (uint32_t)(p->sn - start)) : 0;
    if (p->pool_n + n + 2 > p->pool_cap) {
        size_t cap = p->pool_cap * 2;
        while (cap < p->pool_n + n + 2) cap *= 2;
        if (cap > (size_t)p->max_frames * 16 + 4096) return PDA_UNSET;
        uint32_t *q = realloc(p->pool, cap * sizeof *q);
        if (!q) return PDA_UNSET;
        p->pool = q;
        p->pool_cap = cap;
    }
    uint32_t o = (uint32_t)p->pool_n;
    p->pool[o] = flags;
    p->pool[o + 1] = n;
    if (n) memcpy(p->pool + o + 2, p->scratch + start, n * sizeof(uint32_t));
    p->pool_n += n + 2;
    return o;
}

static int expand(pda *p, uint32_t f, uint32_t *flags) {
    const gr_grammar *g = p->g;
    uint32_t pos = p->f[f].pos, parent = p->f[f].parent, e = g->elems[pos];
    switch (GR_KIND(e)) {
    case GR_CLASS: return scratch_push(p, f);
    case GR_END:
        if (parent == PDA_ROOT) *flags |= PDA_COMPLETE;
        else if (parent == PDA_SENTINEL) *flags |= PDA_POPPED;
        else return merge(p, pda_closure(p, parent), flags);
        return 0;
    default: {
        uint32_t r = GR_ARG(e);
        uint32_t ret = GR_KIND(g->elems[pos + 1]) == GR_END ? parent : pda_frame_get(p, pos + 1, parent);
        if (ret == PDA_UNSET) return -1;
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            uint32_t c = pda_frame_get(p, g->alt_pos[a], ret);
            if (c == PDA_UNSET || merge(p, pda_closure(p, c), flags)) return -1;
        }
        return 0;
    }
    }
}

uint32_t pda_closure(pda *p, uint32_t f) {
    uint32_t o = p->f[f].clo;
    /* A frame met again inside its own closure adds nothing new (gr_finish
     * rules out the left recursion that would make it matter). */
    if (o == PDA_BUSY) return 0;
    if (o != PDA_UNSET) return o;
    p->f[f].clo = PDA_BUSY;
    size_t start = p->sn;
    uint32_t flags = 0;
    o = expand(p, f, &flags) ? PDA_UNSET : store(p, start, flags);
    p->sn = start;
    if (o == PDA_UNSET) p->oom = 1;
    p->f[f].clo = o;
    return o;
}

void pda_state_free(pda_state *s) {
    free(s->ids);
    memset(s, 0, sizeof *s);
}

static int state_reserve(pda_state *s, uint32_t n) {
    if (n <= s->cap) return 0;
    uint32_t cap = s->cap ? s->cap : 8;
    while (cap < n) cap *= 2;
    uint32_t *ids = realloc(s->ids, cap * sizeof *ids);
    if (!ids) return -1;
    s->ids = ids;
    s->cap = cap;
    return 0;
}

int pda_state_copy(pda_state *dst, const pda_state *src) {
    if (state_reserve(dst, src->n)) return -1;
    if (src->n) memcpy(dst->ids, src->ids, src->n * sizeof *src->ids);
    dst->n = src->n;
    dst->flags = src->flags;
    return 0;
}

static int state_add(pda *p, pda_state *out, uint32_t o) {
    if (o == PDA_UNSET) return -1;
    uint32_t n = p->pool[o + 1];
    if (state_reserve(out, out->n + n)) return -1;
    if (n) memcpy(out->ids + out->n, p->pool + o + 2, n * sizeof(uint32_t));
    out->n += n;
    out->flags |= p->pool[o];
    return 0;
}

int pda_start(pda *p, pda_state *out) {
    const gr_grammar *g = p->g;
    out->n = 0;
    out->flags = 0;
    for (uint32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++) {
        uint32_t f = pda_frame_get(p, g->alt_pos[a], PDA_ROOT);
        if (f == PDA_UNSET || state_add(p, out, pda_closure(p, f))) return -1;
    }
    out->n = unique(out->ids, out->n);
    return 0;
}

int pda_advance(pda *p, const uint32_t *ids, uint32_t n, unsigned b, pda_state *out) {
    const gr_grammar *g = p->g;
    out->n = 0;
    out->flags = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t f = ids[i];
        if (!gr_class_has(&g->classes[GR_ARG(g->elems[p->f[f].pos])], b)) continue;
        uint32_t nx = p->f[f].next;
        if (nx == PDA_UNSET) {
            nx = pda_frame_get(p, p->f[f].pos + 1, p->f[f].parent);
            if (nx == PDA_UNSET) return -1;
            p->f[f].next = nx;
        }
        if (state_add(p, out, pda_closure(p, nx))) { p->oom = 1; return -1; }
    }
    out->n = unique(out->ids, out->n);
    return 0;
}

uint32_t pda_state_min(const pda *p, const pda_state *s) {
    if (s->flags & (PDA_COMPLETE | PDA_POPPED)) return 0;
    uint32_t m = INF_LEN;
    for (uint32_t i = 0; i < s->n; i++)
        if (p->f[s->ids[i]].dmin < m) m = p->f[s->ids[i]].dmin;
    return m;
}
