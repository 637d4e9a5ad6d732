/* Per-position token tables and their cache (tables.h). */
#include "grammar/tables.h"

#include <stdlib.h>
#include <string.h>

#include "grammar/dfa.h"
#include "grammar/pda.h"
#include "util/err.h"

/* Automaton states a walk may intern (each keeps 1 KiB of transitions),
 * and those kept from one position's walk to the next. */
#define DFA_MAX (1u << 16)
#define DFA_KEEP 8192

typedef struct vec {
    uint32_t *v;
    size_t n, cap;
    int oom;
} vec;

static void vpush(vec *a, uint32_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 256;
        uint32_t *p = realloc(a->v, cap * sizeof *p);
        if (!p) { a->oom = 1; return; }
        a->v = p;
        a->cap = cap;
    }
    a->v[a->n++] = x;
}

void gt_table_free(gt_table *t) {
    if (!t) return;
    free(t->acc);
    free(t->bits);
    free(t->grow);
    gt_suffixes *x[2] = {&t->unc, &t->unc_acc};
    for (int i = 0; i < 2; i++) {
        free(x[i]->s);
        free(x[i]->sfx);
        free(x[i]->tok);
    }
    free(t);
}

/* ---- the walk ------------------------------------------------------------ */

typedef struct walk {
    const tern_grammar_vocab *v;
    const gr_grammar *g;
    pda *sim;
    dfa *dfa;
    int32_t *lv;                 /* the state at each depth */
    uint32_t *pops, *npop;
    uint8_t *alive, *popf;
    vec acc, unc, unc_acc;       /* (id, g) and (id, suffix start) pairs */
} walk;

static int walk_position(walk *w, uint32_t p) {
    const tern_grammar_vocab *v = w->v;
    const gr_class *follow = &w->g->follow[w->g->rule_of[p]];
    /* the states carried from position to position stay bounded */
    if (w->dfa->n > DFA_KEEP) {
        pda *sim = w->dfa->p;
        uint32_t max = w->dfa->max_states;
        dfa_free(w->dfa);
        if (dfa_init(w->dfa, sim, max)) return -1;
    }
    uint32_t f0 = pda_frame_get(w->sim, p, PDA_SENTINEL);
    if (f0 == PDA_UNSET) return -1;
    pda_state start = {0, 1, 1, &f0};
    if ((w->lv[0] = dfa_intern(w->dfa, &start)) < 0) return -1;
    w->alive[0] = 1;
    w->popf[0] = 0;
    w->npop[0] = 0;
    w->acc.n = w->unc.n = w->unc_acc.n = 0;
    for (uint32_t i = 0; i < v->n_nodes;) {
        uint32_t d = v->t_depth[i];
        unsigned b = v->t_byte[i];
        uint32_t np = w->npop[d - 1];
        if (w->popf[d - 1] && gr_class_has(follow, b)) w->pops[np++] = d - 1;
        w->npop[d] = np;
        if (w->alive[d - 1]) {
            if ((w->lv[d] = dfa_step(w->dfa, w->lv[d - 1], b)) < 0) return -1;
            const dfa_state *x = &w->dfa->s[w->lv[d]];
            w->alive[d] = x->n > 0;
            w->popf[d] = (x->flags & PDA_POPPED) != 0;
        } else {
            w->alive[d] = w->popf[d] = 0;
        }
        if (!w->alive[d] && !w->popf[d] && np == 0) {
            i = v->t_skip[i];
            continue;
        }
        for (int32_t t = v->t_tok[i]; t >= 0; t = v->tok_next[t]) {
            int acc = w->alive[d] || w->popf[d];
            if (acc) {
                vpush(&w->acc, (uint32_t)t);
                vpush(&w->acc, w->dfa->s[w->lv[d]].min);
            }
            vec *u = acc ? &w->unc_acc : &w->unc;
            for (uint32_t k = 0; k < np; k++) vpush(u, (uint32_t)t), vpush(u, w->pops[k]);
        }
        i++;
    }
    return w->acc.oom || w->unc.oom || w->unc_acc.oom ? -1 : 0;
}

/* ---- building a table from the walk -------------------------------------- */

static int by_g_desc(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[1] != y[1] ? (x[1] > y[1] ? -1 : 1) : (x[0] < y[0] ? -1 : x[0] > y[0]);
}

typedef struct sfx_item {
    const uint8_t *b;
    uint32_t len, id;
} sfx_item;

static int by_suffix(const void *a, const void *b) {
    const sfx_item *x = a, *y = b;
    int c = memcmp(x->b, y->b, x->len < y->len ? x->len : y->len);
    if (c) return c;
    return x->len != y->len ? (x->len < y->len ? -1 : 1) : (x->id < y->id ? -1 : x->id > y->id);
}

static int build_acc(gt_table *t, const walk *w) {
    size_t n = w->acc.n / 2;
    t->n_acc = (uint32_t)n;
    t->gmin = 0xFFFFFFFFu;
    t->gmax = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t g = w->acc.v[2 * i + 1];
        if (g < t->gmin) t->gmin = g;
        if (g > t->gmax) t->gmax = g;
    }
    if (!n) t->gmin = 0;
    if (n < GT_LIST_MAX) {
        t->acc = malloc((n + 1) * sizeof *t->acc);
        if (!t->acc) return -1;
        for (size_t i = 0; i < n; i++) t->acc[i] = w->acc.v[2 * i];
        t->bytes += n * 4;
    } else {
        t->bits = calloc((size_t)w->v->words, sizeof *t->bits);
        if (!t->bits) return -1;
        for (size_t i = 0; i < n; i++) t->bits[w->acc.v[2 * i] >> 5] |= 1u << (w->acc.v[2 * i] & 31);
        t->bytes += (size_t)w->v->words * 4;
    }
    size_t ng = 0;
    for (size_t i = 0; i < n; i++) ng += w->acc.v[2 * i + 1] > t->gmin;
    t->grow = malloc((ng + 1) * 2 * sizeof *t->grow);
    if (!t->grow) return -1;
    for (size_t i = 0, k = 0; i < n; i++)
        if (w->acc.v[2 * i + 1] > t->gmin) t->grow[2 * k] = w->acc.v[2 * i], t->grow[2 * k + 1] = w->acc.v[2 * i + 1], k++;
    qsort(t->grow, ng, 2 * sizeof *t->grow, by_g_desc);
    t->n_grow = (uint32_t)ng;
    t->bytes += ng * 8;
    return 0;
}

static int build_suffixes(gt_suffixes *x, size_t *bytes, const vec *pairs, const tern_grammar_vocab *v) {
    size_t n = pairs->n / 2, total = 0;
    if (!n) return 0;
    sfx_item *it = malloc(n * sizeof *it);
    if (!it) return -1;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = pairs->v[2 * i], k = pairs->v[2 * i + 1];
        it[i] = (sfx_item){(const uint8_t *)v->bytes[id] + k, v->len[id] - k, id};
    }
    qsort(it, n, sizeof *it, by_suffix);
    size_t groups = 0;
    for (size_t i = 0; i < n; i++)
        if (!i || it[i].len != it[i - 1].len || memcmp(it[i].b, it[i - 1].b, it[i].len)) groups++, total += it[i].len;
    x->s = malloc(groups * GT_UNC_FIELDS * sizeof *x->s);
    x->sfx = malloc(total + 1);
    x->tok = malloc(n * sizeof *x->tok);
    if (!x->s || !x->sfx || !x->tok) { free(it); return -1; }
    size_t gi = 0, off = 0;
    for (size_t i = 0; i < n; i++) {
        int same = i && it[i].len == it[i - 1].len && !memcmp(it[i].b, it[i - 1].b, it[i].len);
        if (!same) {
            uint32_t *u = x->s + gi * GT_UNC_FIELDS;
            uint32_t lcp = 0;
            if (gi) {
                const uint32_t *prev = u - GT_UNC_FIELDS;
                uint32_t m = prev[1] < it[i].len ? prev[1] : it[i].len;
                while (lcp < m && x->sfx[prev[0] + lcp] == it[i].b[lcp]) lcp++;
            }
            memcpy(x->sfx + off, it[i].b, it[i].len);
            u[0] = (uint32_t)off;
            u[1] = it[i].len;
            u[2] = lcp;
            u[3] = (uint32_t)i;
            u[4] = 0;
            off += it[i].len;
            gi++;
        }
        x->s[(gi - 1) * GT_UNC_FIELDS + 4]++;
        x->tok[i] = it[i].id;
    }
    x->n = (uint32_t)groups;
    *bytes += groups * GT_UNC_FIELDS * 4 + total + n * 4;
    free(it);
    return 0;
}

static gt_table *table_of_walk(const walk *w) {
    gt_table *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->bytes = sizeof *t;
    if (build_acc(t, w) || build_suffixes(&t->unc, &t->bytes, &w->unc, w->v) ||
        build_suffixes(&t->unc_acc, &t->bytes, &w->unc_acc, w->v)) {
        gt_table_free(t);
        return NULL;
    }
    return t;
}

/* ---- compiling a grammar --------------------------------------------------- */

static void walk_free(walk *w) {
    free(w->lv);
    free(w->pops);
    free(w->npop);
    free(w->alive);
    free(w->popf);
    free(w->acc.v);
    free(w->unc.v);
    free(w->unc_acc.v);
    if (w->dfa) dfa_free(w->dfa);
    if (w->sim) pda_free(w->sim);
}

int gt_compile(tern_grammar_vocab *v, const gr_grammar *g, gt_table ***out, tern_error *err) {
    uint32_t D = v->max_depth + 1;
    pda sim;
    dfa states;
    memset(&sim, 0, sizeof sim);
    memset(&states, 0, sizeof states);
    walk w = {.v = v, .g = g};
    gt_table **tabs = calloc((size_t)g->n_elems + 1, sizeof *tabs);
    int32_t *local = malloc(((size_t)g->n_rules + 1) * sizeof *local);
    uint32_t *queue = malloc(((size_t)g->n_rules + 1) * sizeof *queue);
    gt_sig s = {0};
    int rc = -1;
    w.lv = malloc((D + 1) * sizeof *w.lv);
    w.pops = malloc((D + 1) * sizeof *w.pops);
    w.npop = malloc((D + 1) * sizeof *w.npop);
    w.alive = malloc(D + 1);
    w.popf = malloc(D + 1);
    if (!tabs || !local || !queue || !w.lv || !w.pops || !w.npop || !w.alive || !w.popf ||
        pda_init(&sim, g, 1u << 22) || dfa_init(&states, &sim, DFA_MAX)) {
        pda_free(&sim);
        dfa_free(&states);
        goto done;
    }
    w.sim = &sim;
    w.dfa = &states;
    for (int r = 0; r < g->n_rules; r++) local[r] = -1;
    for (int p = 0; p < g->n_elems; p++) {
        if (GR_KIND(g->elems[p]) != GR_CLASS) continue;
        int keyed = gt_signature(g, (uint32_t)p, local, queue, &s) == 0;
        if (keyed && (tabs[p] = gt_cache_get(v, &s))) continue;
        if (walk_position(&w, (uint32_t)p)) goto done;
        gt_table *t = table_of_walk(&w);
        if (!t) goto done;
        tabs[p] = keyed ? gt_cache_put(v, &s, t) : t;
    }
    rc = 0;
done:
    walk_free(&w);
    free(local);
    free(queue);
    free(s.b);
    if (rc) {
        gt_release(v, tabs, g->n_elems);
        *out = NULL;
        return tern_fail(err, "the grammar's automaton outgrew its limits (memory, or stacks nested more than %d "
                         "deep) while compiling it against the vocabulary", PDA_MAX_DEPTH);
    }
    *out = tabs;
    return 0;
}
