/* The concise system prompt (tern serve --concise, tern chat --concise):
 * one text, quoted in docs/SERVER.md. */
#ifndef TERN_TEXT_CONCISE_H
#define TERN_TEXT_CONCISE_H

extern const char *const tern_concise_prompt;

#endif
