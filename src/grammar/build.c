/* Building a grammar: rules, sequences, the repetition helpers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "util/strmap.h"

void gr_class_range(gr_class *c, unsigned lo, unsigned hi) {
    for (unsigned b = lo; b <= hi && b < 256; b++) gr_class_add(c, b);
}

int gr_class_count(const gr_class *c) {
    int n = 0;
    for (int i = 0; i < 4; i++) n += __builtin_popcountll(c->bits[i]);
    return n;
}

gr_grammar *gr_create(void) { return calloc(1, sizeof(gr_grammar)); }

void gr_destroy(gr_grammar *g) {
    if (!g) return;
    for (int r = 0; r < g->n_rules; r++) {
        free(g->rules[r].name);
        for (int a = 0; a < g->rules[r].n_alts; a++) gr_seq_free(&g->rules[r].alts[a]);
        free(g->rules[r].alts);
    }
    free(g->rules);
    tern_strmap_destroy(g->names);
    free(g->classes);
    free(g->elems);
    free(g->alt_pos);
    free(g->rule_alt);
    free(g->rule_of);
    free(g->rem_min);
    free(g->rule_min);
    free(g->follow);
    free(g->follow_end);
    free(g);
}

static int grow(void **p, int *cap, int need, size_t size) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static int add_rule(gr_grammar *g, char *name) {
    if (!name || grow((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof *g->rules)) {
        free(name);
        g->oom = 1;
        return 0;
    }
    g->rules[g->n_rules] = (gr_rule){.name = name};
    return g->n_rules++;
}

int gr_rule_named(gr_grammar *g, const char *name) {
    if (!g->names && !(g->names = tern_strmap_create())) {
        g->oom = 1;
        return 0;
    }
    intptr_t known = (intptr_t)tern_strmap_get(g->names, name);
    if (known) return (int)known - 1;
    int r = add_rule(g, strdup(name));
    if (!g->oom && tern_strmap_put(g->names, g->rules[r].name, (void *)(intptr_t)(r + 1))) g->oom = 1;
    return r;
}

int gr_rule_new(gr_grammar *g, const char *hint) {
    char buf[96];
    snprintf(buf, sizeof buf, "%s#%d", hint, g->n_rules);   /* "#": never a GBNF name */
    return add_rule(g, strdup(buf));
}

int gr_class_id(gr_grammar *g, const gr_class *c) {
    for (int i = 0; i < g->n_classes; i++)
        if (!memcmp(&g->classes[i], c, sizeof *c)) return i;
    if (grow((void **)&g->classes, &g->cap_classes, g->n_classes + 1, sizeof *g->classes)) {
        g->oom = 1;
        return 0;
    }
    g->classes[g->n_classes] = *c;
    return g->n_classes++;
}

static void seq_push(gr_seq *s, uint32_t e) {
    if (grow((void **)&s->e, &s->cap, s->n + 1, sizeof *s->e)) {
        s->oom = 1;
        return;
    }
    s->e[s->n++] = e;
}

void gr_seq_class(gr_seq *s, int class_id) { seq_push(s, GR_ELEM(GR_CLASS, class_id)); }
void gr_seq_ref(gr_seq *s, int rule) { seq_push(s, GR_ELEM(GR_REF, rule)); }

void gr_seq_lit(gr_grammar *g, gr_seq *s, const char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        gr_class c = {{0}};
        gr_class_add(&c, (unsigned char)bytes[i]);
        gr_seq_class(s, gr_class_id(g, &c));
    }
}

void gr_seq_str(gr_grammar *g, gr_seq *s, const char *text) { gr_seq_lit(g, s, text, strlen(text)); }

void gr_seq_cat(gr_seq *s, const gr_seq *t) {
    for (int i = 0; i < t->n; i++) seq_push(s, t->e[i]);
    if (t->oom) s->oom = 1;
}

void gr_seq_free(gr_seq *s) {
    free(s->e);
    *s = (gr_seq){0};
}

void gr_alt(gr_grammar *g, int rule, const gr_seq *s) {
    gr_rule *r = &g->rules[rule];
    r->defined = 1;
    if (s->oom || grow((void **)&r->alts, &r->cap_alts, r->n_alts + 1, sizeof *r->alts)) {
        g->oom = 1;
        return;
    }
    gr_seq copy = {0};
    gr_seq_cat(&copy, s);
    if (copy.oom) g->oom = 1;
    r->alts[r->n_alts++] = copy;
}

int gr_rule_of_seq(gr_grammar *g, const char *hint, const gr_seq *s) {
    int r = gr_rule_new(g, hint);
    gr_alt(g, r, s);
    return r;
}

/* R ::= s R | empty: the tail reference keeps the automaton's stack flat. */
int gr_star(gr_grammar *g, const gr_seq *s) {
    int r = gr_rule_new(g, "star");
    gr_seq a = {0}, empty = {0};
    gr_seq_cat(&a, s);
    gr_seq_ref(&a, r);
    gr_alt(g, r, &a);
    gr_alt(g, r, &empty);
    gr_seq_free(&a);
    return r;
}

int gr_plus(gr_grammar *g, const gr_seq *s) {
    int star = gr_star(g, s);
    gr_seq a = {0};
    gr_seq_cat(&a, s);
    gr_seq_ref(&a, star);
    int r = gr_rule_of_seq(g, "plus", &a);
    gr_seq_free(&a);
    return r;
}

int gr_opt(gr_grammar *g, const gr_seq *s) {
    int r = gr_rule_new(g, "opt");
    gr_seq empty = {0};
    gr_alt(g, r, s);
    gr_alt(g, r, &empty);
    return r;
}

/* min copies, then up to max - min more as nested optionals
 * (C_k ::= s C_(k-1) | empty), or a star when unbounded. */
int gr_repeat(gr_grammar *g, const gr_seq *s, int min, int max) {
    gr_seq a = {0};
    for (int i = 0; i < min; i++) gr_seq_cat(&a, s);
    if (max < 0) {
        gr_seq_ref(&a, gr_star(g, s));
    } else if (max > min) {
        int chain = -1;
        gr_seq empty = {0};
        for (int k = 1; k <= max - min; k++) {
            int c = gr_rule_new(g, "upto");
            gr_seq b = {0};
            gr_seq_cat(&b, s);
            if (chain >= 0) gr_seq_ref(&b, chain);
            gr_alt(g, c, &b);
            gr_alt(g, c, &empty);
            gr_seq_free(&b);
            chain = c;
        }
        gr_seq_ref(&a, chain);
    }
    int r = gr_rule_of_seq(g, "repeat", &a);
    gr_seq_free(&a);
    return r;
}
