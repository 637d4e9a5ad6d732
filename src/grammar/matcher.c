/* tern_matcher: one generation's state in a grammar, and its token masks.
 *
 * A mask is the union, over the state's stacks, of the top position's
 * accepted tokens (its table) and of those uncertain tokens whose suffix
 * the rest of that stack reads. With a budget, a token is kept only if the
 * grammar can still end after it within the budget: a frame's accepted
 * tokens are cut by their g (tables.h), an uncertain one by the state its
 * suffix leads to. Masks computed without such a cut are kept for the
 * states that come back (inside a string, every token returns to the same
 * state), keyed by the state's frames. */
#include <stdlib.h>
#include <string.h>

#include "grammar/compiled.h"
#include "grammar/matcher.h"
#include "grammar/pda.h"
#include "util/err.h"

#define MEMO_N 16
#define MAX_FRAMES (1u << 22)

typedef struct memo_ent {
    uint64_t h;
    uint32_t *ids, n, flags, cap;
    uint32_t need;               /* most bytes left after any token the mask allows */
    uint32_t *mask;
    unsigned long long used;
} memo_ent;

struct tern_matcher {
    const tern_grammar *G;
    const gr_grammar *g;
    const tern_grammar_vocab *v;
    pda p;
    pda_state cur, a, b, ctx;
    pda_state saved;             /* tern_matcher_save's state, and its done */
    int saved_done, has_saved;
    pda_state *lv;               /* suffix walks: the state after each byte */
    uint32_t n_lv;
    int done;                    /* the end-of-sequence token was taken */
    uint32_t *tmpmask;
    memo_ent memo[MEMO_N];
    unsigned long long clock;
};

tern_matcher *tern_matcher_create(const tern_grammar *G, tern_error *err) {
    if (!G) {
        tern_fail(err, "matcher: no grammar");
        return NULL;
    }
    tern_matcher *m = calloc(1, sizeof *m);
    if (!m) goto oom;
    m->G = G;
    m->g = G->g;
    m->v = G->v;
    if (pda_init(&m->p, G->g, MAX_FRAMES)) goto oom;
    if (m->v) {
        m->n_lv = m->v->max_depth + 1;
        m->lv = calloc(m->n_lv, sizeof *m->lv);
        m->tmpmask = malloc((size_t)m->v->words * sizeof *m->tmpmask);
        if (!m->lv || !m->tmpmask) goto oom;
    }
    if (pda_start(&m->p, &m->cur)) goto oom;
    return m;
oom:
    tern_matcher_destroy(m);
    tern_fail(err, "out of memory (grammar matcher)");
    return NULL;
}

void tern_matcher_destroy(tern_matcher *m) {
    if (!m) return;
    pda_free(&m->p);
    pda_state_free(&m->cur);
    pda_state_free(&m->a);
    pda_state_free(&m->b);
    pda_state_free(&m->ctx);
    pda_state_free(&m->saved);
    for (uint32_t d = 0; d < m->n_lv; d++) pda_state_free(&m->lv[d]);
    free(m->lv);
    free(m->tmpmask);
    for (int i = 0; i < MEMO_N; i++) {
        free(m->memo[i].ids);
        free(m->memo[i].mask);
    }
    free(m);
}

int tern_matcher_complete(const tern_matcher *m) { return !m->done && (m->cur.flags & PDA_COMPLETE); }

int tern_matcher_min_bytes(const tern_matcher *m) { return m->done ? 0 : (int)pda_state_min(&m->p, &m->cur); }

/* Frames are never freed while the matcher lives, so a saved state's
 * frame ids stay valid; restore swaps it in without allocating. */
int tern_matcher_save(tern_matcher *m, tern_error *err) {
    if (pda_state_copy(&m->saved, &m->cur)) return tern_fail(err, "out of memory (grammar matcher)");
    m->saved_done = m->done;
    m->has_saved = 1;
    return 0;
}

void tern_matcher_restore(tern_matcher *m) {
    if (!m->has_saved) return;
    pda_state t = m->cur;
    m->cur = m->saved;
    m->saved = t;
    m->done = m->saved_done;
    m->has_saved = 0;
}

/* ---- accepting ------------------------------------------------------------ */

int tern_matcher_accept_bytes(tern_matcher *m, const char *s, size_t n) {
    if (m->done) return -1;
    if (n == 0) return 0;
    pda_state *in = &m->cur, *out = &m->a;
    for (size_t i = 0; i < n; i++) {
        if (in->n == 0) return -1;
        if (pda_advance(&m->p, in->ids, in->n, (unsigned char)s[i], out)) return -1;
        if (!pda_alive(out)) return -1;
        in = out;
        out = out == &m->a ? &m->b : &m->a;
    }
    pda_state t = m->cur;
    m->cur = *in;
    *in = t;
    return 0;
}

int tern_matcher_accept(tern_matcher *m, int32_t id, tern_error *err) {
    if (!m->v) return tern_fail(err, "matcher: the grammar has no vocabulary");
    if (m->done) return tern_fail(err, "grammar: token %d after the end of the grammar", (int)id);
    int kind = id >= 0 && id < m->v->n_vocab ? m->v->kind[id] : GV_NEVER;
    if (kind == GV_EOS) {
        if (!(m->cur.flags & PDA_COMPLETE)) return tern_fail(err, "grammar: end of sequence before the grammar ends");
        m->done = 1;
        return 0;
    }
    if (kind == GV_NEVER || tern_matcher_accept_bytes(m, m->v->bytes[id], m->v->len[id]))
        return tern_fail(err, "grammar: token %d is not allowed here", (int)id);
    return 0;
}

/* ---- masks ---------------------------------------------------------------- */

static void set_bit(uint32_t *mask, uint32_t id) { mask[id >> 5] |= 1u << (id & 31); }

static void or_acc(const gt_table *t, uint32_t *mask, int words) {
    if (t->bits) {
        for (int w = 0; w < words; w++) mask[w] |= t->bits[w];
    } else {
        for (uint32_t i = 0; i < t->n_acc; i++) set_bit(mask, t->acc[i]);
    }
}

/* The accepted tokens whose g exceeds thr leave the mask. */
static void cut_grow(const gt_table *t, uint32_t *mask, uint32_t thr) {
    for (uint32_t i = 0; i < t->n_grow && t->grow[2 * i + 1] > thr; i++)
        mask[t->grow[2 * i] >> 5] &= ~(1u << (t->grow[2 * i] & 31));
}

static int lv_set_closure(tern_matcher *m, pda_state *s, uint32_t ctx) {
    s->n = 0;
    s->flags = 0;
    if (ctx == PDA_ROOT) {
        s->flags = PDA_COMPLETE;
        return 0;
    }
    uint32_t o = pda_closure(&m->p, ctx);
    if (o == PDA_UNSET) return -1;
    pda_state view = {m->p.pool[o], m->p.pool[o + 1], m->p.pool[o + 1], m->p.pool + o + 2};
    return pda_state_copy(s, &view);
}

/* The uncertain tokens of frame f's table whose suffix the stack below f
 * reads; with a budget (thr: the most bytes that may be left after the
 * token), only those that leave no more. *need: the most left. */
static int walk_uncertain(tern_matcher *m, const gt_suffixes *x, uint32_t ctx, uint32_t *mask, long long thr,
                          uint32_t *need, int *cut) {
    if (!x->n || ctx == PDA_ROOT) return 0;
    if (lv_set_closure(m, &m->lv[0], ctx)) return -1;
    uint32_t dead_at = 0xFFFFFFFFu;
    for (uint32_t i = 0; i < x->n; i++) {
        const uint32_t *u = x->s + (size_t)i * GT_UNC_FIELDS;
        uint32_t len = u[1], lcp = u[2];
        if (lcp >= dead_at) continue;
        dead_at = 0xFFFFFFFFu;
        const uint8_t *b = x->sfx + u[0];
        for (uint32_t d = lcp + 1; d <= len; d++) {
            pda_state *prev = &m->lv[d - 1];
            if (prev->n == 0) { dead_at = d; break; }
            if (pda_advance(&m->p, prev->ids, prev->n, b[d - 1], &m->lv[d])) return -1;
        }
        if (dead_at != 0xFFFFFFFFu) continue;
        if (!pda_alive(&m->lv[len])) { dead_at = len; continue; }
        uint32_t left = pda_state_min(&m->p, &m->lv[len]);
        if (thr >= 0 && left > thr) { *cut = 1; continue; }
        if (left > *need) *need = left;
        for (uint32_t k = 0; k < u[4]; k++) set_bit(mask, x->tok[u[3] + k]);
    }
    return 0;
}

/* The mask of the current state; budget < 0: no limit. *cut: some token
 * was left out for the budget. */
static int compute(tern_matcher *m, uint32_t *mask, long long budget, uint32_t *need, int *cut) {
    int W = m->v->words;
    memset(mask, 0, (size_t)W * sizeof *mask);
    *need = 0;
    *cut = 0;
    for (uint32_t i = 0; i < m->cur.n; i++) {
        uint32_t f = m->cur.ids[i], ctx = m->p.f[f].parent;
        const gt_table *t = m->G->tab[m->p.f[f].pos];
        uint32_t ctxmin = ctx == PDA_ROOT ? 0 : m->p.f[ctx].dmin;
        long long thr = budget < 0 ? -1 : budget - 2 - (long long)ctxmin, uthr = budget < 0 ? -1 : budget - 2;
        int acc_cut = 0;
        if (t->n_acc) {
            if (budget < 0 || (long long)t->gmax <= thr) {
                or_acc(t, mask, W);
                if (ctxmin + t->gmax > *need) *need = ctxmin + t->gmax;
            } else if ((long long)t->gmin <= thr) {
                uint32_t *dst = m->cur.n == 1 ? mask : m->tmpmask;
                if (dst != mask) memset(dst, 0, (size_t)W * sizeof *dst);
                or_acc(t, dst, W);
                cut_grow(t, dst, (uint32_t)thr);
                if (dst != mask)
                    for (int w = 0; w < W; w++) mask[w] |= dst[w];
                *cut = acc_cut = 1;
            } else {
                *cut = acc_cut = 1;
            }
        }
        if (walk_uncertain(m, &t->unc, ctx, mask, uthr, need, cut) ||
            (acc_cut && walk_uncertain(m, &t->unc_acc, ctx, mask, uthr, need, cut)))
            return -1;
    }
    if (m->cur.flags & PDA_COMPLETE)
        for (int i = 0; i < m->v->n_eos; i++) set_bit(mask, (uint32_t)m->v->eos[i]);
    return 0;
}

static uint64_t state_hash(const pda_state *s) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ s->flags;
    for (uint32_t i = 0; i < s->n; i++) h = (h ^ s->ids[i]) * 0x100000001b3ull;
    return h;
}

static memo_ent *memo_find(tern_matcher *m, uint64_t h) {
    for (int i = 0; i < MEMO_N; i++) {
        memo_ent *e = &m->memo[i];
        if (e->mask && e->h == h && e->n == m->cur.n && e->flags == m->cur.flags &&
            (!m->cur.n || !memcmp(e->ids, m->cur.ids, m->cur.n * sizeof *e->ids)))
            return e;
    }
    return NULL;
}

static void memo_put(tern_matcher *m, uint64_t h, const uint32_t *mask, uint32_t need) {
    memo_ent *e = &m->memo[0];
    for (int i = 1; i < MEMO_N; i++)
        if (m->memo[i].used < e->used) e = &m->memo[i];
    size_t bytes = (size_t)m->v->words * sizeof *mask;
    if (!e->mask && !(e->mask = malloc(bytes))) return;
    if (e->cap < m->cur.n) {
        uint32_t *ids = realloc(e->ids, (m->cur.n + 1) * sizeof *ids);
        if (!ids) { free(e->mask); e->mask = NULL; return; }
        e->ids = ids;
        e->cap = m->cur.n;
    }
    if (m->cur.n) memcpy(e->ids, m->cur.ids, m->cur.n * sizeof *e->ids);
    e->n = m->cur.n;
    e->flags = m->cur.flags;
    e->h = h;
    e->need = need;
    e->used = ++m->clock;
    memcpy(e->mask, mask, bytes);
}

/* The slow path the masks must agree with: the token's bytes read from
 * the current state (the tests compare the two over whole vocabularies). */
int gm_token_allowed(tern_matcher *m, int32_t id, int budget) {
    if (m->done || id < 0 || id >= m->v->n_vocab) return 0;
    int kind = m->v->kind[id];
    if (kind == GV_EOS) return (m->cur.flags & PDA_COMPLETE) != 0;
    if (kind == GV_NEVER) return 0;
    long long B = budget >= 0 && (long long)pda_state_min(&m->p, &m->cur) + 1 <= budget ? budget : -1;
    pda_state *in = &m->cur, *out = &m->a;
    for (uint32_t i = 0; i < m->v->len[id]; i++) {
        if (in->n == 0) return 0;
        if (pda_advance(&m->p, in->ids, in->n, (unsigned char)m->v->bytes[id][i], out)) return 0;
        in = out;
        out = out == &m->a ? &m->b : &m->a;
    }
    if (!pda_alive(in)) return 0;
    return B < 0 || (long long)pda_state_min(&m->p, in) <= B - 2;
}

int tern_matcher_fill_mask(tern_matcher *m, uint32_t *mask, int budget, tern_error *err) {
    if (!m->v) return tern_fail(err, "matcher: the grammar has no vocabulary");
    int W = m->v->words;
    if (m->done) {
        memset(mask, 0, (size_t)W * sizeof *mask);
        return 0;
    }
    /* a budget too small to end in is no budget: the answer is cut anyway */
    long long B = budget >= 0 && (long long)pda_state_min(&m->p, &m->cur) + 1 <= budget ? budget : -1;
    uint64_t h = state_hash(&m->cur);
    memo_ent *e = memo_find(m, h);
    if (e && (B < 0 || (long long)e->need + 2 <= B)) {
        e->used = ++m->clock;
        memcpy(mask, e->mask, (size_t)W * sizeof *mask);
        return 0;
    }
    uint32_t need;
    int cut;
    if (compute(m, mask, B, &need, &cut))
        return tern_fail(err, "grammar: the automaton outgrew its limits (memory, or nesting deeper than %d)",
                         PDA_MAX_DEPTH);
    if (!cut) memo_put(m, h, mask, need);
    return 0;
}
