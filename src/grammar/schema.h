/* Grammars of JSON values (schema.c) and of tool calls (tools.c).
 *
 * Supported keywords (everything OpenAI's strict structured outputs take,
 * and a little more): type (a name or a list), properties, required,
 * additionalProperties (false; a schema or true with no properties makes
 * a map; with properties, only those are written), items, minItems,
 * maxItems (at most 4096), enum, const, anyOf, oneOf whose branches have
 * distinct types, allOf of one schema, local $ref with $defs/definitions
 * (recursion included), true and false schemas. Annotations (title,
 * description, default, examples, $schema, $id, $comment, ...) and
 * unknown keywords are ignored. Keywords that constrain values but are
 * not enforced are refused by name: pattern, format, minLength,
 * maxLength, minimum, maximum, exclusiveMinimum, exclusiveMaximum,
 * multipleOf, minProperties, maxProperties, patternProperties,
 * propertyNames, dependencies, dependentRequired, dependentSchemas, if,
 * then, else, not, uniqueItems, contains, prefixItems, additionalItems,
 * unevaluatedProperties, unevaluatedItems. Properties are written in the
 * schema's order; an optional one may be left out. */
#ifndef TERN_GRAMMAR_SCHEMA_H
#define TERN_GRAMMAR_SCHEMA_H

#include <jansson.h>

#include "grammar/json_gram.h"

/* The rule of the JSON text of a value valid under schema ($refs resolve
 * within root). xml: strings without "</" (tool-call markup). Errors:
 * "<what> at <JSON pointer>: <reason naming the keyword>". */
int gs_schema_rule(jg_rules *j, json_t *root, json_t *schema, int xml, const char *what, tern_error *err);

/* One or more tool calls in the Qwen XML form (tool_parse.h) of the tools
 * in an OpenAI-style tools array (name: only that function; parallel: 0
 * for exactly one call), each parameter's value written so that the
 * output parser reads back a value its schema accepts. */
int gs_tool_calls_rule(jg_rules *j, json_t *tools, const char *name, int parallel, tern_error *err);

#endif
