/* The rule worklist of the grammar's fixpoints (worklist.h). */
#include "grammar/worklist.h"

#include <stdlib.h>

void gr_wl_push(gr_worklist *w, int r) {
    if (w->in[r]) return;
    w->in[r] = 1;
    w->q[(w->head + w->len++) % w->n] = r;
}

int gr_wl_pop(gr_worklist *w) {
    int r = w->q[w->head];
    w->head = (w->head + 1) % w->n;
    w->len--;
    w->in[r] = 0;
    return r;
}

void gr_wl_push_all(gr_worklist *w) {
    for (int r = 0; r < w->n; r++) gr_wl_push(w, r);
}

void gr_wl_push_referrers(gr_worklist *w, int r) {
    for (uint32_t i = w->off[r]; i < w->off[r + 1]; i++) gr_wl_push(w, (int)w->ref[i]);
}

void gr_wl_free(gr_worklist *w) {
    free(w->q);
    free(w->in);
    free(w->off);
    free(w->ref);
    *w = (gr_worklist){0};
}

int gr_wl_init(gr_worklist *w, const gr_grammar *g) {
    int n = g->n_rules;
    *w = (gr_worklist){.n = n, .q = malloc(((size_t)n + 1) * sizeof *w->q), .in = calloc((size_t)n + 1, 1),
                       .off = calloc((size_t)n + 2, sizeof *w->off)};
    if (w->q && w->in && w->off) {
        for (int p = 0; p < g->n_elems; p++)
            if (GR_KIND(g->elems[p]) == GR_REF) w->off[GR_ARG(g->elems[p]) + 1]++;
        for (int r = 0; r < n; r++) w->off[r + 1] += w->off[r];
        w->ref = malloc(((size_t)w->off[n] + 1) * sizeof *w->ref);
    }
    if (!w->ref) {
        gr_wl_free(w);
        return -1;
    }
    for (int p = 0; p < g->n_elems; p++)
        if (GR_KIND(g->elems[p]) == GR_REF) w->ref[w->off[GR_ARG(g->elems[p])]++] = g->rule_of[p];
    /* the fill left each rule's start at the next one's */
    for (int r = n; r > 0; r--) w->off[r] = w->off[r - 1];
    w->off[0] = 0;
    return 0;
}
