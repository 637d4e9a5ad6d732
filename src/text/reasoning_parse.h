/* Splits generated text into reasoning and answer, piece by piece.
 *
 * Qwen3.6 thinks inside <think>...</think> before it answers. With
 * thinking on, the prompt already ends in "<think>\n", so the generated
 * text starts inside the reasoning and only the closing tag appears; with
 * thinking off the prompt closed an empty block and the text is all answer
 * (a leading "<think>" is still recognised). The splitter mirrors how the
 * chat template writes reasoning back into history ("<think>\n" + r +
 * "\n</think>\n\n" + answer): the one newline before </think> and the
 * newlines after it are markup, not text, and are not passed on.
 *
 * Pieces can be cut anywhere (per token, per byte): a tag split across
 * pieces is held back until it is decided, so the output does not depend
 * on how the input was cut.
 */
#ifndef TERN_TEXT_REASONING_PARSE_H
#define TERN_TEXT_REASONING_PARSE_H

#include <stddef.h>

#include "tern.h"

/* Receives a piece of reasoning (is_reasoning = 1) or of the answer.
 * Returns 0, or -1 with err set to stop the splitter. */
typedef int (*tern_reasoning_fn)(void *user, int is_reasoning, const char *text, size_t len,
                                 tern_error *err);

typedef struct tern_reasoning_splitter tern_reasoning_splitter;

/* start_in_reasoning: the prompt ended with an open "<think>\n". */
tern_reasoning_splitter *tern_reasoning_splitter_create(int start_in_reasoning,
                                                        tern_reasoning_fn fn, void *user,
                                                        tern_error *err);
void tern_reasoning_splitter_destroy(tern_reasoning_splitter *s);

int tern_reasoning_splitter_feed(tern_reasoning_splitter *s, const char *text, size_t len,
                                 tern_error *err);
/* End of generation: passes on whatever was held back. */
int tern_reasoning_splitter_finish(tern_reasoning_splitter *s, tern_error *err);

/* 1 while the text so far is inside the reasoning block. */
int tern_reasoning_splitter_in_reasoning(const tern_reasoning_splitter *s);

#endif
