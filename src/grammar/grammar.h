/* The grammar every structured-output source compiles to: rules, each a
 * list of alternatives, each a sequence of elements, an element a byte
 * class or a reference to a rule. JSON Schema (schema.c), GBNF text
 * (gbnf.c) and the tool-call form (tools.c) build one with the builder
 * below; gr_finish checks it (every referenced rule defined, no left
 * recursion, every rule able to finish) and flattens it for the pushdown
 * automaton (pda.h).
 *
 * The flat form: elems holds every alternative as its elements followed by
 * an END element; a position is an index into elems. A rule's alternatives
 * start at alt_pos[rule_alt[r] .. rule_alt[r + 1]). */
#ifndef TERN_GRAMMAR_GRAMMAR_H
#define TERN_GRAMMAR_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "tern.h"

typedef struct gr_class {
    uint64_t bits[4];            /* bit b: byte b is in the class */
} gr_class;

static inline int gr_class_has(const gr_class *c, unsigned b) { return (int)((c->bits[b >> 6] >> (b & 63)) & 1); }
static inline void gr_class_add(gr_class *c, unsigned b) { c->bits[b >> 6] |= 1ull << (b & 63); }
void gr_class_range(gr_class *c, unsigned lo, unsigned hi);
int gr_class_count(const gr_class *c);

/* An element: kind in the top two bits, a class or rule id below. */
enum { GR_END = 0, GR_CLASS = 1, GR_REF = 2 };
#define GR_KIND(e) ((e) >> 30)
#define GR_ARG(e) ((e) & 0x3FFFFFFFu)
#define GR_ELEM(kind, arg) (((uint32_t)(kind) << 30) | (uint32_t)(arg))

/* A sequence being built. */
typedef struct gr_seq {
    uint32_t *e;
    int n, cap;
    int oom;
} gr_seq;

typedef struct gr_rule {
    char *name;
    gr_seq *alts;
    int n_alts, cap_alts;
    int defined;                 /* has a definition (GBNF may reference before defining) */
} gr_rule;

typedef struct tern_strmap tern_strmap;

typedef struct gr_grammar {
    /* built */
    gr_rule *rules;
    int n_rules, cap_rules;
    tern_strmap *names;          /* rule ids (+1) of the named rules (gr_rule_named), made on first use */
    gr_class *classes;
    int n_classes, cap_classes;
    int root;
    int oom;
    /* flat (gr_finish) */
    uint32_t *elems;
    int n_elems;
    uint32_t *alt_pos;           /* start position of each alternative */
    uint32_t *rule_alt;          /* n_rules + 1 entries */
    uint32_t *rule_of;           /* the rule each position belongs to */
    uint32_t *rem_min;           /* fewest bytes that finish the alternative from a position */
    uint32_t *rule_min;          /* fewest bytes a rule matches */
    gr_class *follow;            /* per rule: the bytes that may follow it */
    uint8_t *follow_end;         /* per rule: the input may end after it */
} gr_grammar;

gr_grammar *gr_create(void);
void gr_destroy(gr_grammar *g);

/* The rule named name (created undefined when new). */
int gr_rule_named(gr_grammar *g, const char *name);
/* A new rule; its name is hint plus a number. */
int gr_rule_new(gr_grammar *g, const char *hint);
int gr_class_id(gr_grammar *g, const gr_class *c);

void gr_seq_class(gr_seq *s, int class_id);
void gr_seq_ref(gr_seq *s, int rule);
void gr_seq_lit(gr_grammar *g, gr_seq *s, const char *bytes, size_t n);
void gr_seq_str(gr_grammar *g, gr_seq *s, const char *text);   /* NUL-terminated literal */
void gr_seq_cat(gr_seq *s, const gr_seq *t);
void gr_seq_free(gr_seq *s);

/* Adds an alternative (copied) to a rule and marks the rule defined. */
void gr_alt(gr_grammar *g, int rule, const gr_seq *s);
/* A rule of a single alternative holding s. */
int gr_rule_of_seq(gr_grammar *g, const char *hint, const gr_seq *s);
/* s repeated: zero or more, one or more, at most once, min..max times
 * (max < 0: no bound). Each returns a new rule. */
int gr_star(gr_grammar *g, const gr_seq *s);
int gr_plus(gr_grammar *g, const gr_seq *s);
int gr_opt(gr_grammar *g, const gr_seq *s);
int gr_repeat(gr_grammar *g, const gr_seq *s, int min, int max);

/* The largest grammar (elements, counting each alternative's end), and
 * the longest chain of rules that begin with one another: the automaton
 * expands such a chain recursively without reading a byte. */
#define GR_MAX_ELEMS (1 << 20)
#define GR_MAX_CHAIN 1024

/* Checks and flattens (root: the start rule). Errors name the rule. */
int gr_finish(gr_grammar *g, int root, tern_error *err);

/* A new rule matching one code point of the ranges [lo[i], hi[i]] in
 * UTF-8 (surrogates and values past U+10FFFF left out): one alternative
 * per run of byte ranges, the one-byte ones merged into a class. */
int gr_utf8_rule(gr_grammar *g, const uint32_t *lo, const uint32_t *hi, int n);
/* The same as alternatives of rule, each followed by a reference to then
 * (a tail call; then < 0: none); the one-byte code points go into *ascii
 * instead (the caller adds them). */
void gr_utf8_alts(gr_grammar *g, int rule, const uint32_t *lo, const uint32_t *hi, int n, int then, gr_class *ascii);

#endif
