/* Completion costs in the vocabulary's tokens (costs.c). */
#ifndef TERN_GRAMMAR_COSTS_H
#define TERN_GRAMMAR_COSTS_H

#include "grammar/grammar.h"
#include "grammar/vocab.h"

/* Replaces g's byte counts (rem_min, rule_min) by token counts: an upper
 * bound on the tokens that finish each position, with a path that meets
 * it. Call after gr_finish (whose checks read the byte counts). */
void gr_token_costs(gr_grammar *g, const tern_grammar_vocab *v);

#endif
