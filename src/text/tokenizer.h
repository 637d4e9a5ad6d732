/* Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json.
 *
 * Covers the GPT-2 / Qwen family of tokenizers (Qwen2, Qwen3, Qwen3.5/3.6),
 * not one vocabulary: everything model-specific (vocabulary, merges, the
 * pre-tokenizer regex, added tokens) is read from the file.
 *
 *     tern_error err;
 *     tern_tokenizer *tok = tern_tokenizer_load("models/x", &err);
 *     int32_t *ids; size_t n;
 *     tern_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n, &err);
 *     char *s; size_t len;
 *     tern_tokenizer_decode(tok, ids, n, &s, &len, &err);
 *     free(ids); free(s);
 *     tern_tokenizer_free(tok);
 *
 * encode(text) follows the Hugging Face pipeline, so ids match
 * `Tokenizer.encode(text, add_special_tokens=False)` of the `tokenizers`
 * library:
 *   1. added tokens are matched whole in the raw text (leftmost-longest, the
 *      tokens with normalized=false);
 *   2. each piece between them is NFC-normalised (when the file's normalizer
 *      is NFC), then searched for the added tokens with normalized=true;
 *   3. each remaining piece is split by the pre-tokenizer regex(es) (PCRE2,
 *      UTF + UCP; `\s`/`\S` are rewritten to Unicode White_Space, which is
 *      what Hugging Face's Oniguruma means by them; PCRE2 also counts U+180E).
 *      Other escapes whose meaning differs between the two engines (`\w`,
 *      `\b`, `\h`) are not rewritten: none of this family's regexes use
 *      them. Characters assigned in a Unicode version newer than PCRE2's
 *      tables may be classed differently from Hugging Face;
 *   4. each split is BPE-encoded over its UTF-8 bytes, merges applied lowest
 *      rank first (leftmost on ties).
 * No template tokens (BOS/EOS) are ever added; the caller decides.
 *
 * Supported tokenizer.json (anything else fails to load with an error that
 * names the field):
 *   model          BPE; merges as "a b" strings or [a, b] pairs; dropout null;
 *                  byte_fallback false; no subword prefix/suffix; unk_token and
 *                  ignore_merges honoured.
 *   normalizer     null, NFC, or a Sequence of those.
 *   pre_tokenizer  ByteLevel(use_regex=true: the GPT-2 regex; add_prefix_space
 *                  false), or a Sequence of Split(pattern Regex|String,
 *                  behavior Isolated, invert false) followed by ByteLevel(
 *                  use_regex=false).
 *   decoder        null or ByteLevel.   post_processor  null or ByteLevel.
 *   truncation, padding   null.
 *   added_tokens   special, normalized, lstrip, rstrip and single_word are all
 *                  honoured as the `tokenizers` library does (Qwen sets all of
 *                  them false except special). single_word's "word character"
 *                  is letters, marks, decimal digits, letter numbers, '_' and
 *                  ZWJ/ZWNJ (Rust regex \w minus a few Other_Alphabetic
 *                  symbols).
 * tokenizer_config.json (optional) gives bos/eos/pad/unk tokens, as strings
 * or {"content": ...} objects; null or absent means none.
 *
 * Invalid UTF-8 in the input to encode is REJECTED: encode fails with
 * "invalid UTF-8 at byte N" (overlong forms, surrogates and code points past
 * U+10FFFF included). Hugging Face never sees such input (a Python str cannot
 * hold it), so there is no reference behaviour to match, and silently
 * replacing bytes would make ids that do not round-trip. Callers that want
 * the lossy behaviour convert the text first (tern_utf8_sanitize in
 * text/utf8.h replaces each maximal invalid subpart with U+FFFD, as Python's
 * errors="replace" does). Embedded NUL bytes are valid UTF-8 and encoded.
 *
 * decode() returns the exact bytes of the tokens (added tokens give their
 * content), which need not be valid UTF-8 when the ids end or start inside a
 * character; the streaming detokenizer (text/detok.h) is the way to get
 * valid UTF-8 text as ids arrive.
 *
 * Threads: the loaded vocabulary is read-only. encode keeps a per-tokenizer
 * word cache and regex scratch; a call that finds them in use by another
 * thread works with its own scratch and no cache, so concurrent calls are
 * safe (and only the first is cached).
 */
#ifndef TERN_TEXT_TOKENIZER_H
#define TERN_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "tern.h"



#endif
