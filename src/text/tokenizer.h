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

typedef struct tern_tokenizer tern_tokenizer;

/* Loads dir/tokenizer.json and, when present, dir/tokenizer_config.json. */
tern_tokenizer *tern_tokenizer_load(const char *dir, tern_error *err);
/* Same from explicit paths; config_path may be NULL. */
tern_tokenizer *tern_tokenizer_load_files(const char *tokenizer_json_path,
                                          const char *config_path,
                                          tern_error *err);
void tern_tokenizer_free(tern_tokenizer *tok);

enum tern_encode_flags {
    /* Added tokens marked special (e.g. <|im_end|>) are not matched in the
     * text but tokenized as plain text; non-special added tokens still are.
     * This is `encode_special_tokens = True` in `tokenizers`, for text that
     * must not be able to inject control tokens (user content). */
    TERN_ENCODE_SPLIT_SPECIAL = 1 << 0,
};

/* Encodes len bytes of UTF-8 text. On success *ids is a malloc'ed array of
 * *n ids (NULL when n == 0) that the caller frees. */
int tern_tokenizer_encode(tern_tokenizer *tok, const char *text, size_t len,
                          unsigned flags, int32_t **ids, size_t *n,
                          tern_error *err);

/* Appends the ids of text to a growable array (*ids with *n used and *cap
 * allocated entries; start with NULL/0/0). For building prompts piece by
 * piece. On failure the array keeps what it had. */
int tern_tokenizer_encode_append(tern_tokenizer *tok, const char *text,
                                 size_t len, unsigned flags, int32_t **ids,
                                 size_t *n, size_t *cap, tern_error *err);

/* Decodes ids to bytes. *out is malloc'ed, NUL-terminated (the NUL not
 * counted in *out_len; the bytes may hold NULs of their own). Fails on an id
 * outside the vocabulary. skip_special: leave out added tokens marked
 * special (like skip_special_tokens=True). */
int tern_tokenizer_decode(const tern_tokenizer *tok, const int32_t *ids,
                          size_t n, int skip_special, char **out,
                          size_t *out_len, tern_error *err);

/* The bytes one id stands for (not NUL-terminated), or NULL if the id is not
 * in the vocabulary. Valid while the tokenizer lives. */
const char *tern_tokenizer_token_bytes(const tern_tokenizer *tok, int32_t id,
                                       size_t *len);

/* The token's string as tokenizer.json spells it (byte-level characters for
 * BPE tokens, e.g. "Ġthe"; the content for added tokens), NUL-terminated, or
 * NULL for an unknown id. */
const char *tern_tokenizer_token_text(const tern_tokenizer *tok, int32_t id);

/* The id of a token given as tokenizer.json spells it (an added token's
 * content such as "<|im_end|>", or a vocabulary string), or -1. */
int32_t tern_tokenizer_token_id(const tern_tokenizer *tok, const char *str);

/* 1 if id is an added token, 2 if it is an added token marked special, else 0. */
int tern_tokenizer_is_added(const tern_tokenizer *tok, int32_t id);

/* One past the largest id (BPE vocabulary plus added tokens). The model's
 * embedding may have more rows than this. */
int32_t tern_tokenizer_vocab_size(const tern_tokenizer *tok);

/* From tokenizer_config.json; -1 when not given. */
int32_t tern_tokenizer_bos_id(const tern_tokenizer *tok);
int32_t tern_tokenizer_eos_id(const tern_tokenizer *tok);
int32_t tern_tokenizer_pad_id(const tern_tokenizer *tok);

#endif
