/* The tokenizer's private header, shared by its parts (text/tokenizer.h is
 * the interface):
 *   tokenizer.c       the tables (bytes -> id, merges, word cache), the
 *                     scratch, BPE, encode and decode
 *   tokenizer_load.c  tokenizer.json / tokenizer_config.json via jansson
 *   tokenizer_pre.c   added tokens (leftmost-longest, the HF flags) and the
 *                     regex pre-tokenizer
 * Internally tokens are raw bytes: the GPT-2 byte<->unicode map is applied to
 * the vocabulary once at load, so encode never builds byte-level strings. */
#ifndef TERN_TEXT_TOKENIZER_INTERNAL_H
#define TERN_TEXT_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"
#include "util/err.h"

/* Words longer than this are BPE-encoded every time rather than cached: they
 * are rare, and a cap keeps one pathological input from filling the cache. */
enum { CACHE_MAX_WORD = 128 };
/* The cache is dropped and restarted when it holds this many words; bounded
 * memory matters more for a long-running server than the hit rate. */
enum { CACHE_MAX_ENTRIES = 1 << 16 };

/* ---- the tokenizer ------------------------------------------------------ */

/* TOK_BYTES: the tokenizer.json spelling is byte-level, so BPE can produce
 * the token. */
enum { TOK_PRESENT = 1, TOK_ADDED = 2, TOK_SPECIAL = 4, TOK_BYTES = 8 };

typedef struct token {
    uint32_t off, len;      /* bytes in tok->bytes */
    uint32_t text_off;      /* NUL-terminated tokenizer.json spelling in tok->text */
    uint8_t flags;
} token;

typedef struct added_token {
    char *content;          /* what is matched (NFC'd when normalized) */
    size_t len;
    int32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
} added_token;

/* Added tokens of one kind (raw or normalized), sorted by first byte and then
 * longest first, so the first hit at a position is the leftmost-longest. */
typedef struct added_set {
    added_token **tok;
    size_t n;
    uint32_t first[257];    /* tok[first[b] .. first[b+1]) start with byte b */
} added_set;

typedef struct merge_slot {
    uint64_t key;           /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank, id;
} merge_slot;

typedef struct cache_slot {
    uint64_t hash;
    uint32_t key_off, key_len;
    uint32_t ids_off, n_ids;    /* n_ids == 0: empty slot */
} cache_slot;

typedef struct word_cache {
    cache_slot *slot;       /* 2 * CACHE_MAX_ENTRIES slots */
    size_t n;
    char *keys;
    size_t keys_len, keys_cap;
    int32_t *ids;
    size_t ids_len, ids_cap;
} word_cache;

/* Everything encode writes to; one lives in the tokenizer, more are made on
 * the fly when threads collide (see tokenizer.h). */
typedef struct scratch {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    word_cache *cache;      /* NULL: no caching */
    int32_t *sym;           /* BPE symbols of the current word */
    int32_t *prev, *next;
    size_t sym_cap;
    uint64_t *heap;
    size_t heap_cap;
    struct split { size_t start, end; int32_t id; } *splits;
    size_t splits_cap;
} scratch;

struct tern_tokenizer {
    token *tok;
    int32_t n_tok;          /* one past the largest id */
    char *bytes;            /* token bytes, all tokens */
    char *text;             /* token spellings, all tokens */

    /* bytes -> id over BPE tokens (open addressing, -1 = empty) */
    int32_t *byte_map;
    size_t byte_map_mask;
    int32_t byte_id[256];   /* id of each single byte, -1 if absent */

    merge_slot *merges;
    size_t merges_mask;

    added_token *added;
    size_t n_added;
    added_set raw_set, norm_set;

    int16_t cp_to_byte[512];    /* byte-level character -> byte, -1 if none */

    bool nfc;
    bool ignore_merges;
    bool fuse_unk;
    int32_t unk_id;
    int32_t bos_id, eos_id, pad_id;

    pcre2_code **re;        /* pre-tokenizer regexes, applied in order */
    size_t n_re;
    uint32_t max_captures;

    pthread_mutex_t lock;   /* guards `own` */
    scratch *own;
};

/* Where encode appends ids: *ids, *n of them, room for *cap. */
typedef struct idvec {
    int32_t **ids;
    size_t *n, *cap;
} idvec;

/* tokenizer.c: the tables, the scratch, BPE of one piece */
int tern_tok_grow(void **p, size_t *cap, size_t need, size_t elem);
void tern_tok_byte_level_map(uint32_t byte_to_cp[256], int16_t cp_to_byte[512]);
long tern_tok_byte_level_decode(const int16_t cp_to_byte[512], const char *s, size_t len,
                                char *out);
int32_t tern_tok_byte_map_get(const tern_tokenizer *t, const char *s, size_t n);
void tern_tok_byte_map_put(tern_tokenizer *t, int32_t id);
void tern_tok_merge_put(tern_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id);
scratch *tern_tok_scratch_create(const tern_tokenizer *t, bool with_cache);
void tern_tok_scratch_free(scratch *s);
int tern_tok_bpe_word(const tern_tokenizer *t, scratch *sc, const char *w, size_t n, idvec *out);
/* tokenizer_load.c: NFC of s[0..n) into a new string */
char *tern_tok_nfc_dup(const char *s, size_t n, size_t *out_len);
/* tokenizer_pre.c: the next added token of set in s, and the pre-tokenizer's
 * pieces from regex `level` on, each through BPE into out */
long tern_tok_find_added(const added_set *set, scratch *sc, const char *s, size_t len,
                         unsigned flags);
int tern_tok_pre_tokenize(const tern_tokenizer *t, scratch *sc, size_t level, const char *s,
                          size_t len, idvec *out, tern_error *err);

#endif
