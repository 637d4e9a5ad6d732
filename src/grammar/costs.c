/* Completion costs in tokens. gr_finish counts the bytes that finish each
 * position; with a vocabulary the budget is in tokens, and literal text
 * (a run of one-byte classes, such as "</parameter>") takes far fewer
 * tokens than bytes. Each run is costed by its best cut into vocabulary
 * tokens, every other class as one token, references by their rule's
 * cost. Cuts never cross an element boundary that is not inside a run, so
 * the cost is an upper bound on the tokens that finish the grammar, and a
 * path meeting it exists: a budget honoured against it can always end. */
#include <stdlib.h>

#include "grammar/costs.h"
#include "grammar/worklist.h"

#define INF_COST 0x3FFFFFFFu

static int single_byte(const gr_grammar *g, uint32_t e, unsigned *b) {
    if (GR_KIND(e) != GR_CLASS) return 0;
    const gr_class *c = &g->classes[GR_ARG(e)];
    if (gr_class_count(c) != 1) return 0;
    for (unsigned x = 0; x < 256; x++)
        if (gr_class_has(c, x)) { *b = x; return 1; }
    return 0;
}

/* The trie node under parent (UINT32_MAX: the root) reading byte b, or
 * UINT32_MAX. */
static uint32_t child(const tern_grammar_vocab *v, uint32_t parent, unsigned b) {
    uint32_t i = parent == UINT32_MAX ? 0 : parent + 1, end = parent == UINT32_MAX ? v->n_nodes : v->t_skip[parent];
    for (; i < end; i = v->t_skip[i])
        if (v->t_byte[i] == b) return i;
    return UINT32_MAX;
}

static uint32_t add(uint32_t a, uint32_t b) { return a + b >= INF_COST ? INF_COST : a + b; }

/* The costs of one alternative's positions, from its end back. */
static void alt_costs(gr_grammar *g, const tern_grammar_vocab *v, uint32_t start, uint32_t end, const uint32_t *rule_cost,
                      uint32_t *cost) {
    cost[end] = 0;
    for (uint32_t p = end; p-- > start;) {
        uint32_t e = g->elems[p];
        unsigned b;
        if (GR_KIND(e) == GR_REF) { cost[p] = add(rule_cost[GR_ARG(e)], cost[p + 1]); continue; }
        if (!single_byte(g, e, &b)) { cost[p] = add(1, cost[p + 1]); continue; }
        /* the best cut of the run from p: a token reading elements p..q-1, then cost[q] */
        uint32_t best = add(1, cost[p + 1]), node = UINT32_MAX;
        for (uint32_t q = p; q < end && single_byte(g, g->elems[q], &b); q++) {
            if ((node = child(v, node, b)) == UINT32_MAX) break;
            if (v->t_tok[node] >= 0 && add(1, cost[q + 1]) < best) best = add(1, cost[q + 1]);
        }
        cost[p] = best;
    }
}

void gr_token_costs(gr_grammar *g, const tern_grammar_vocab *v) {
    uint32_t *rule_cost = malloc(((size_t)g->n_rules + 1) * sizeof *rule_cost);
    gr_worklist w;
    if (!rule_cost || gr_wl_init(&w, g)) {
        free(rule_cost);
        return;   /* the byte counts stay: larger, still an upper bound */
    }
    for (int r = 0; r < g->n_rules; r++) rule_cost[r] = INF_COST;
    uint32_t *cost = g->rem_min;
    /* a rule is revisited whenever a rule it refers to gets cheaper, so
     * every alternative's costs end up computed from the final ones */
    gr_wl_push_all(&w);
    while (w.len) {
        int r = gr_wl_pop(&w);
        uint32_t best = rule_cost[r];
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            uint32_t start = g->alt_pos[a], end = g->alt_pos[a + 1] - 1;
            alt_costs(g, v, start, end, rule_cost, cost);
            if (cost[start] < best) best = cost[start];
        }
        if (best < rule_cost[r]) rule_cost[r] = best, gr_wl_push_referrers(&w, r);
    }
    gr_wl_free(&w);
    for (int r = 0; r < g->n_rules; r++) g->rule_min[r] = rule_cost[r];
    free(rule_cost);
}
