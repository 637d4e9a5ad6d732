/* Streaming detokenizer: ids go in one at a time as the model samples them,
 * text comes out as soon as it is complete UTF-8.
 *
 * A byte-level BPE token can end in the middle of a character (an emoji is
 * often two or three tokens), so the bytes of a started but unfinished
 * character are held back until the token that completes it arrives. Bytes
 * that can no longer become valid UTF-8 come out as U+FFFD, one per maximal
 * invalid subpart, so what is emitted is always valid UTF-8 and the whole
 * stream equals Hugging Face's decode of all the ids (from_utf8_lossy).
 * flush() ends the stream: a held partial character becomes one U+FFFD.
 *
 *     tern_detok *d = tern_detok_create(tok, 0, &err);
 *     for each sampled id:
 *         tern_detok_push(d, id, &s, &n, &err);  fwrite(s, 1, n, out);
 *     tern_detok_flush(d, &s, &n);  fwrite(s, 1, n, out);
 */
#ifndef TERN_TEXT_DETOK_H
#define TERN_TEXT_DETOK_H

#include <stddef.h>
#include <stdint.h>

#include "tern.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

typedef struct tern_detok tern_detok;

/* skip_special: added tokens marked special produce no text. The tokenizer
 * must outlive the detokenizer. */
tern_detok *tern_detok_create(const tern_tokenizer *tok, int skip_special, tern_error *err);
void tern_detok_free(tern_detok *d);

/* Feeds one id. *text and *len get the text that became complete (possibly
 * empty); it stays valid until the next call on d. Fails on an id outside the
 * vocabulary (the stream is unchanged then). */
int tern_detok_push(tern_detok *d, int32_t id, const char **text, size_t *len, tern_error *err);

/* Ends the stream: releases what is held (as U+FFFD) and starts over. */
void tern_detok_flush(tern_detok *d, const char **text, size_t *len);

/* Drops what is held and starts over. */
void tern_detok_reset(tern_detok *d);

#endif
