/* gr_finish: the checks a grammar must pass before the automaton runs it,
 * the flat form, shortest completions and follow sets. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/worklist.h"
#include "util/err.h"

#define INF_LEN 0x3FFFFFFFu

static uint32_t add_len(uint32_t a, uint32_t b) { return a + b >= INF_LEN ? INF_LEN : a + b; }

static int flatten(gr_grammar *g) {
    int n_alts = 0, n_elems = 0;
    for (int r = 0; r < g->n_rules; r++) {
        n_alts += g->rules[r].n_alts;
        for (int a = 0; a < g->rules[r].n_alts; a++) n_elems += g->rules[r].alts[a].n + 1;
    }
    g->elems = malloc((size_t)(n_elems + 1) * sizeof *g->elems);
    g->alt_pos = malloc((size_t)(n_alts + 1) * sizeof *g->alt_pos);
    g->rule_alt = malloc((size_t)(g->n_rules + 1) * sizeof *g->rule_alt);
    g->rule_of = malloc((size_t)(n_elems + 1) * sizeof *g->rule_of);
    g->rem_min = malloc((size_t)(n_elems + 1) * sizeof *g->rem_min);
    g->rule_min = malloc((size_t)(g->n_rules + 1) * sizeof *g->rule_min);
    g->follow = calloc((size_t)g->n_rules + 1, sizeof *g->follow);
    g->follow_end = calloc((size_t)g->n_rules + 1, 1);
    if (!g->elems || !g->alt_pos || !g->rule_alt || !g->rule_of || !g->rem_min || !g->rule_min || !g->follow ||
        !g->follow_end)
        return -1;
    int e = 0, k = 0;
    for (int r = 0; r < g->n_rules; r++) {
        g->rule_alt[r] = (uint32_t)k;
        for (int a = 0; a < g->rules[r].n_alts; a++) {
            g->alt_pos[k++] = (uint32_t)e;
            const gr_seq *s = &g->rules[r].alts[a];
            for (int i = 0; i < s->n; i++) g->rule_of[e] = (uint32_t)r, g->elems[e++] = s->e[i];
            g->rule_of[e] = (uint32_t)r;
            g->elems[e++] = GR_ELEM(GR_END, 0);
        }
    }
    g->rule_alt[g->n_rules] = (uint32_t)k;
    g->alt_pos[k] = (uint32_t)e;
    g->n_elems = e;
    return 0;
}

static uint32_t elem_min(const gr_grammar *g, uint32_t e) {
    return GR_KIND(e) == GR_CLASS ? 1 : GR_KIND(e) == GR_REF ? g->rule_min[GR_ARG(e)] : 0;
}

static uint32_t rule_min_of(const gr_grammar *g, int r) {
    uint32_t best = INF_LEN;
    for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
        uint32_t len = 0;
        for (uint32_t p = g->alt_pos[a]; GR_KIND(g->elems[p]) != GR_END; p++)
            len = add_len(len, elem_min(g, g->elems[p]));
        if (len < best) best = len;
    }
    return best;
}

/* Fewest bytes of each rule (a fixpoint), then of each position's rest. */
static void min_lengths(gr_grammar *g, gr_worklist *w) {
    for (int r = 0; r < g->n_rules; r++) g->rule_min[r] = INF_LEN;
    gr_wl_push_all(w);
    while (w->len) {
        int r = gr_wl_pop(w);
        uint32_t len = rule_min_of(g, r);
        if (len < g->rule_min[r]) g->rule_min[r] = len, gr_wl_push_referrers(w, r);
    }
    for (int a = (int)g->rule_alt[g->n_rules] - 1; a >= 0; a--) {
        uint32_t end = g->alt_pos[a + 1] - 1;
        g->rem_min[end] = 0;
        for (uint32_t p = end; p-- > g->alt_pos[a];) g->rem_min[p] = add_len(g->rem_min[p + 1], elem_min(g, g->elems[p]));
    }
}

/* Rules reachable from the root (mark[r] = 1), with an explicit stack. */
static int reach(const gr_grammar *g, int root, uint8_t *mark) {
    int *stack = malloc(((size_t)g->n_rules + 1) * sizeof *stack), n = 0;
    if (!stack) return -1;
    mark[root] = 1;
    stack[n++] = root;
    while (n) {
        int r = stack[--n];
        for (uint32_t p = g->alt_pos[g->rule_alt[r]]; p < g->alt_pos[g->rule_alt[r + 1]]; p++) {
            uint32_t e = g->elems[p];
            if (GR_KIND(e) == GR_REF && !mark[GR_ARG(e)]) mark[GR_ARG(e)] = 1, stack[n++] = (int)GR_ARG(e);
        }
    }
    free(stack);
    return 0;
}

/* The rules that can start rule r without a byte read: those referenced
 * before the first element that cannot be empty, in each alternative.
 * Calls f(ud, b) for each (with repeats). */
static void left_edges(const gr_grammar *g, int r, void (*f)(void *, int), void *ud) {
    for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
        for (uint32_t p = g->alt_pos[a]; GR_KIND(g->elems[p]) == GR_REF; p++) {
            int b = (int)GR_ARG(g->elems[p]);
            f(ud, b);
            if (g->rule_min[b] != 0) break;
        }
}

typedef struct dfs {
    int *stack, n;               /* rules on the path */
    uint8_t *color;              /* 0 new, 1 on the path, 2 done */
    uint32_t *depth;             /* done: the longest chain of left edges from the rule */
    int *next;                   /* scratch: the children of the rule being expanded */
    int n_next, culprit;
} dfs;

static void collect(void *ud, int b) {
    dfs *d = ud;
    d->next[d->n_next++] = b;
}

/* Depth-first over left edges with an explicit stack: a rule met again
 * on the path is left-recursive; otherwise the longest chain from each
 * rule (the automaton expands such chains without reading a byte, so
 * their length bounds its recursion). */
static int left_walk(const gr_grammar *g, int root, dfs *d, uint32_t *longest) {
    d->n = 0;
    d->stack[d->n++] = root;
    while (d->n) {
        int r = d->stack[d->n - 1];
        if (d->color[r] == 0) {
            d->color[r] = 1;
            d->n_next = 0;
            left_edges(g, r, collect, d);
            for (int i = 0; i < d->n_next; i++) {
                int b = d->next[i];
                if (d->color[b] == 1) { d->culprit = b; return 1; }
                if (d->color[b] == 0) d->stack[d->n++] = b;
            }
            continue;
        }
        d->n--;
        if (d->color[r] == 2) continue;
        uint32_t best = 0;
        d->n_next = 0;
        left_edges(g, r, collect, d);
        for (int i = 0; i < d->n_next; i++)
            if (d->depth[d->next[i]] + 1 > best) best = d->depth[d->next[i]] + 1;
        d->depth[r] = best;
        d->color[r] = 2;
        if (best > *longest) *longest = best;
    }
    return 0;
}

static void class_or(gr_class *a, const gr_class *b, int *changed) {
    for (int i = 0; i < 4; i++) {
        uint64_t v = a->bits[i] | b->bits[i];
        if (v != a->bits[i]) a->bits[i] = v, *changed = 1;
    }
}

/* The bytes that may come first from position q on, added to *into;
 * returns the position where they stop (an END: everything from q may
 * be empty). */
static uint32_t first_from(const gr_grammar *g, const gr_class *first, uint32_t q, gr_class *into, int *changed) {
    for (; GR_KIND(g->elems[q]) != GR_END; q++) {
        uint32_t e = g->elems[q];
        if (GR_KIND(e) == GR_CLASS) { class_or(into, &g->classes[GR_ARG(e)], changed); break; }
        class_or(into, &first[GR_ARG(e)], changed);
        if (g->rule_min[GR_ARG(e)] != 0) break;
    }
    return q;
}

/* FIRST of each rule, then FOLLOW: what may come after a rule ends. */
static int follow_sets(gr_grammar *g, gr_worklist *w) {
    gr_class *first = calloc((size_t)g->n_rules + 1, sizeof *first);
    if (!first) return -1;
    gr_wl_push_all(w);
    while (w->len) {
        int r = gr_wl_pop(w), changed = 0;
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
            first_from(g, first, g->alt_pos[a], &first[r], &changed);
        if (changed) gr_wl_push_referrers(w, r);
    }
    /* processing r passes its follow set on to the rules it ends with */
    g->follow_end[g->root] = 1;
    gr_wl_push_all(w);
    while (w->len) {
        int r = gr_wl_pop(w);
        for (uint32_t p = g->alt_pos[g->rule_alt[r]]; p < g->alt_pos[g->rule_alt[r + 1]]; p++) {
            if (GR_KIND(g->elems[p]) != GR_REF) continue;
            int b = (int)GR_ARG(g->elems[p]), changed = 0;
            if (GR_KIND(g->elems[first_from(g, first, p + 1, &g->follow[b], &changed)]) == GR_END) {
                class_or(&g->follow[b], &g->follow[r], &changed);
                if (g->follow_end[r] && !g->follow_end[b]) g->follow_end[b] = 1, changed = 1;
            }
            if (changed) gr_wl_push(w, b);
        }
    }
    free(first);
    return 0;
}

int gr_finish(gr_grammar *g, int root, tern_error *err) {
    if (g->oom) return tern_fail(err, "out of memory building the grammar");
    if (root < 0 || root >= g->n_rules) return tern_fail(err, "the grammar has no root rule");
    g->root = root;
    for (int r = 0; r < g->n_rules; r++)
        if (!g->rules[r].defined) return tern_fail(err, "grammar: rule '%.80s' is used but not defined", g->rules[r].name);
    size_t n_elems = 0;
    for (int r = 0; r < g->n_rules; r++)
        for (int a = 0; a < g->rules[r].n_alts; a++) n_elems += (size_t)g->rules[r].alts[a].n + 1;
    if (n_elems > GR_MAX_ELEMS || g->n_rules > GR_MAX_ELEMS)
        return tern_fail(err, "grammar: larger than %d elements", GR_MAX_ELEMS);
    gr_worklist w;
    if (flatten(g) || gr_wl_init(&w, g)) return tern_fail(err, "out of memory building the grammar");
    min_lengths(g, &w);
    uint8_t *mark = calloc((size_t)g->n_rules + 1, 1);
    size_t total = 0;
    for (int a = 0; a < (int)g->rule_alt[g->n_rules]; a++) total += g->alt_pos[a + 1] - g->alt_pos[a];
    dfs d = {.stack = malloc(((size_t)total + 1) * sizeof(int)), .color = calloc((size_t)g->n_rules + 1, 1),
             .depth = calloc((size_t)g->n_rules + 1, sizeof(uint32_t)),
             .next = malloc(((size_t)total + 1) * sizeof(int))};
    int rc = !mark || !d.stack || !d.color || !d.depth || !d.next || reach(g, root, mark)
                 ? tern_fail(err, "out of memory building the grammar") : 0;
    for (int r = 0; r < g->n_rules && rc == 0; r++)
        if (mark[r] && g->rule_min[r] >= INF_LEN)
            rc = tern_fail(err, "grammar: rule '%.80s' can never finish (it always recurses)", g->rules[r].name);
    uint32_t longest = 0;
    for (int r = 0; r < g->n_rules && rc == 0; r++)
        if (!d.color[r] && left_walk(g, r, &d, &longest))
            rc = tern_fail(err, "grammar: rule '%.80s' is left-recursive (it can reach itself without reading a "
                           "byte, e.g. a repetition of something that may be empty)", g->rules[d.culprit].name);
    if (rc == 0 && longest > GR_MAX_CHAIN)
        rc = tern_fail(err, "grammar: rules refer to one another more than %d deep before a byte is read",
                       GR_MAX_CHAIN);
    free(mark);
    free(d.stack);
    free(d.color);
    free(d.depth);
    free(d.next);
    if (rc == 0 && follow_sets(g, &w)) rc = tern_fail(err, "out of memory building the grammar");
    gr_wl_free(&w);
    return rc;
}
