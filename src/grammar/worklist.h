/* Fixpoints over a grammar's rules (rule lengths, FIRST and FOLLOW sets,
 * token costs) that revisit only the rules whose inputs changed: a queue
 * holding each rule at most once, and for each rule the rules that refer
 * to it. Sweeping every rule until nothing changes would take as many
 * sweeps as the longest chain of references. */
#ifndef TERN_GRAMMAR_WORKLIST_H
#define TERN_GRAMMAR_WORKLIST_H

#include "grammar/grammar.h"

typedef struct gr_worklist {
    int *q, n, head, len;        /* a ring of n rules */
    uint8_t *in;                 /* per rule: queued */
    uint32_t *off, *ref;         /* the referrers of rule r: ref[off[r] .. off[r + 1]) */
} gr_worklist;

/* Empty, with the referrers of g's flat form (gr_finish's). */
int gr_wl_init(gr_worklist *w, const gr_grammar *g);
void gr_wl_free(gr_worklist *w);
void gr_wl_push(gr_worklist *w, int r);
void gr_wl_push_all(gr_worklist *w);
/* Queues the rules that refer to r (its value changed). */
void gr_wl_push_referrers(gr_worklist *w, int r);
/* The next rule; call while w->len. */
int gr_wl_pop(gr_worklist *w);

#endif
