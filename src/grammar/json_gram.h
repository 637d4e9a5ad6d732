/* JSON as grammar rules, made once per grammar on first use: whitespace,
 * strings, numbers, any value, literals; and the rules for text that may
 * not contain a given string (the reasoning before "</think>", a raw tool
 * parameter before "</parameter>").
 *
 * Whitespace between tokens is bounded (nothing, one space, or a newline
 * and at most JG_INDENT spaces or tabs), so a model cannot loop on it.
 * Integers have at most 15 digits, fractions 15, exponents 2, so every
 * number a grammar allows parses as a double or a 64-bit integer.
 * Strings are valid UTF-8 without raw control characters; \u escapes name
 * no surrogate and not U+0000. In "xml" mode (values inside the tool-call
 * markup) a string never holds "</parameter>", which would end the value
 * for the output parser ("<\/parameter>" says the same). */
#ifndef TERN_GRAMMAR_JSON_GRAM_H
#define TERN_GRAMMAR_JSON_GRAM_H

#include <jansson.h>

#include "grammar/grammar.h"

#define JG_INDENT 24
#define JG_INT_DIGITS 15

typedef struct jg_rules {
    gr_grammar *g;
    int ws, lead;                    /* between tokens; before a whole answer */
    int string[2], value[2], object[2], array[2];   /* [xml] */
    int integer, number, boolean, null_;
} jg_rules;

void jg_init(jg_rules *j, gr_grammar *g);
int jg_ws(jg_rules *j);
/* Up to 2 spaces or newlines: after "</think>", before a whole answer. */
int jg_lead(jg_rules *j);
int jg_string(jg_rules *j, int xml);
int jg_integer(jg_rules *j);
int jg_number(jg_rules *j);
int jg_boolean(jg_rules *j);
int jg_null(jg_rules *j);
/* Any JSON value; any JSON object; any JSON array. */
int jg_value(jg_rules *j, int xml);
int jg_object(jg_rules *j, int xml);
int jg_array(jg_rules *j, int xml);
/* The JSON text of v (compact; "/" escaped in xml mode) appended to s. */
int jg_literal(jg_rules *j, gr_seq *s, json_t *v, int xml);

/* Text that does not contain `stop` (ASCII, at most 32 bytes), ending
 * anywhere: raw bytes when utf8 is 0; valid UTF-8 without control
 * characters other than tab, newline and carriage return when 1. */
int jg_text_without(jg_rules *j, const char *stop, int utf8);

#endif
