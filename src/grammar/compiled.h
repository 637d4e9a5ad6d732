/* The compiled grammar behind tern_grammar: the flat grammar, its
 * vocabulary (may be NULL) and the table of each class position. */
#ifndef TERN_GRAMMAR_COMPILED_H
#define TERN_GRAMMAR_COMPILED_H

#include "grammar/grammar.h"
#include "grammar/tables.h"
#include "grammar/vocab.h"

struct tern_grammar {
    gr_grammar *g;
    tern_grammar_vocab *v;
    gt_table **tab;              /* per position, NULL without a vocabulary */
};

/* GBNF text into g: returns the rule "root" (gbnf.c). */
int gbnf_parse(gr_grammar *g, const char *text, tern_error *err);

#endif
