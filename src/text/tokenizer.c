/* Byte-level BPE tokenizer (see tokenizer.h for what is supported and why).
 *
 * Sections, in the order text flows through them:
 *   hash tables      bytes -> id, merge pair -> (rank, id), word cache
 *   loading          tokenizer.json / tokenizer_config.json via jansson
 *   added tokens     leftmost-longest matching with the HF flags
 *   normalisation    NFC via utf8proc
 *   pre-tokenizer    PCRE2 regex splits (Isolated)
 *   BPE              merges by rank over the bytes of one split
 *   encode / decode
 *
 * Internally tokens are raw bytes: the GPT-2 byte<->unicode map is applied to
 * the vocabulary once at load, so encode never builds byte-level strings.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/utf8.h"
#include "util/err.h"
#include "util/file.h"

/* The regex ByteLevel(use_regex=true) applies (GPT-2's), as `tokenizers`
 * hard-codes it. */
static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Words longer than this are BPE-encoded every time rather than cached: they
 * are rare, and a cap keeps one pathological input from filling the cache. */
enum { CACHE_MAX_WORD = 128 };
/* The cache is dropped and restarted when it holds this many words; bounded
 * memory matters more for a long-running server than the hit rate. */
enum { CACHE_MAX_ENTRIES = 1 << 16 };

/* ---- small growable arrays -------------------------------------------- */

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

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

/* ---- byte-level map ----------------------------------------------------- */

/* GPT-2's map: printable Latin-1 bytes stand for themselves, the other 68
 * bytes take the code points 256, 257, ... in byte order. */
static void byte_level_map(uint32_t byte_to_cp[256], int16_t cp_to_byte[512]) {
    for (int i = 0; i < 512; i++) cp_to_byte[i] = -1;
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        byte_to_cp[b] = printable ? (uint32_t)b : next++;
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

/* Converts a byte-level string to bytes (out must hold strlen(s) bytes).
 * Returns the length, or -1 if s has a character outside the map. */
static long byte_level_decode(const int16_t cp_to_byte[512], const char *s, size_t len,
                              char *out) {
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int n = tern_utf8_decode(s + i, len - i, &cp);
        if (n == 0 || cp >= 512 || cp_to_byte[cp] < 0) return -1;
        out[o++] = (char)cp_to_byte[cp];
        i += (size_t)n;
    }
    return (long)o;
}

/* ---- bytes -> id -------------------------------------------------------- */

static int32_t byte_map_get(const tern_tokenizer *t, const char *s, size_t n) {
    size_t i = hash_bytes(s, n) & t->byte_map_mask;
    for (;;) {
        int32_t id = t->byte_map[i];
        if (id < 0) return -1;
        const token *k = &t->tok[id];
        if (k->len == n && memcmp(t->bytes + k->off, s, n) == 0) return id;
        i = (i + 1) & t->byte_map_mask;
    }
}

/* First one wins: a later token with the same bytes is unreachable by BPE
 * anyway. */
static void byte_map_put(tern_tokenizer *t, int32_t id) {
    const token *k = &t->tok[id];
    size_t i = hash_bytes(t->bytes + k->off, k->len) & t->byte_map_mask;
    for (;;) {
        int32_t o = t->byte_map[i];
        if (o < 0) {
            t->byte_map[i] = id;
            return;
        }
        if (t->tok[o].len == k->len && memcmp(t->bytes + t->tok[o].off, t->bytes + k->off, k->len) == 0)
            return;
        i = (i + 1) & t->byte_map_mask;
    }
}

/* ---- merges: (left, right) -> (rank, id) -------------------------------- */

static size_t merge_hash(uint64_t key, size_t mask) {
    key *= 0x9E3779B97F4A7C15ull;
    return (size_t)(key >> 29) & mask;
}

static const merge_slot *merge_get(const tern_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = merge_hash(key, t->merges_mask);
    for (;;) {
        const merge_slot *s = &t->merges[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
        i = (i + 1) & t->merges_mask;
    }
}

/* A pair listed twice keeps the later rank, as `tokenizers` does (it collects
 * the list into a map). */
static void merge_put(tern_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = merge_hash(key, t->merges_mask);
    while (t->merges[i].key != UINT64_MAX && t->merges[i].key != key)
        i = (i + 1) & t->merges_mask;
    t->merges[i] = (merge_slot){key, rank, id};
}

/* ---- word cache --------------------------------------------------------- */

static word_cache *cache_create(void) {
    word_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->slot = calloc(2 * CACHE_MAX_ENTRIES, sizeof *c->slot);
    if (!c->slot) {
        free(c);
        return NULL;
    }
    return c;
}

static void cache_free(word_cache *c) {
    if (!c) return;
    free(c->slot);
    free(c->keys);
    free(c->ids);
    free(c);
}

static const cache_slot *cache_get(const word_cache *c, uint64_t h, const char *s, size_t n) {
    size_t mask = 2 * CACHE_MAX_ENTRIES - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const cache_slot *e = &c->slot[i];
        if (e->n_ids == 0) return NULL;
        if (e->hash == h && e->key_len == n && memcmp(c->keys + e->key_off, s, n) == 0) return e;
    }
}

/* Best effort: a failed allocation just means the word is not cached. */
static void cache_put(word_cache *c, uint64_t h, const char *s, size_t n, const int32_t *ids,
                      size_t n_ids) {
    if (n_ids == 0) return;
    if (c->n >= CACHE_MAX_ENTRIES) {
        memset(c->slot, 0, 2 * CACHE_MAX_ENTRIES * sizeof *c->slot);
        c->n = c->keys_len = c->ids_len = 0;
    }
    if (grow((void **)&c->keys, &c->keys_cap, c->keys_len + n, 1) ||
        grow((void **)&c->ids, &c->ids_cap, c->ids_len + n_ids, sizeof(int32_t)))
        return;
    size_t mask = 2 * CACHE_MAX_ENTRIES - 1;
    size_t i = h & mask;
    while (c->slot[i].n_ids != 0) i = (i + 1) & mask;
    memcpy(c->keys + c->keys_len, s, n);
    memcpy(c->ids + c->ids_len, ids, n_ids * sizeof *ids);
    c->slot[i] = (cache_slot){h, (uint32_t)c->keys_len, (uint32_t)n, (uint32_t)c->ids_len,
                              (uint32_t)n_ids};
    c->keys_len += n;
    c->ids_len += n_ids;
    c->n++;
}

/* ---- scratch ------------------------------------------------------------ */

static void scratch_free(scratch *s) {
    if (!s) return;
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mctx);
    pcre2_jit_stack_free(s->jit_stack);
    cache_free(s->cache);
    free(s->sym);
    free(s->prev);
    free(s->next);
    free(s->heap);
    free(s->splits);
    free(s);
}

static scratch *scratch_create(const tern_tokenizer *t, bool with_cache) {
    scratch *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->md = pcre2_match_data_create(t->max_captures + 1, NULL);
    s->mctx = pcre2_match_context_create(NULL);
    /* The default 32 KiB JIT stack can run out on very long splits (a
     * megabyte of one script without punctuation); 8 MiB is only reserved. */
    s->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!s->md || !s->mctx || !s->jit_stack) goto fail;
    pcre2_jit_stack_assign(s->mctx, NULL, s->jit_stack);
    if (with_cache && !(s->cache = cache_create())) goto fail;
    return s;
fail:
    scratch_free(s);
    return NULL;
}

/* ---- loading ------------------------------------------------------------ */

static bool json_flag(json_t *o, const char *key, bool dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static const char *json_type_of(json_t *o) {
    return json_string_value(json_object_get(o, "type"));
}

/* `\s` and `\S` mean Unicode White_Space in the Oniguruma regexes that
 * `tokenizers` runs; PCRE2's UCP \s also takes U+180E. Rewriting them to the
 * White_Space property (valid inside and outside classes) makes PCRE2 agree. */
static char *rewrite_regex(const char *in, size_t len) {
    char *out = malloc(len * 8 + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (in[i] != '\\' || i + 1 >= len) {
            out[o++] = in[i];
            continue;
        }
        char c = in[i + 1];
        if (c == 's' || c == 'S') {
            memcpy(out + o, c == 's' ? "\\p{White_Space}" : "\\P{White_Space}", 15);
            o += 15;
            i++;
        } else if (c == 'Q') {          /* \Q...\E is literal: copy as is */
            const char *e = NULL;
            for (size_t j = i + 2; j + 1 < len; j++)
                if (in[j] == '\\' && in[j + 1] == 'E') {
                    e = in + j;
                    break;
                }
            size_t stop = e ? (size_t)(e - in) + 2 : len;
            memcpy(out + o, in + i, stop - i);
            o += stop - i;
            i = stop - 1;
        } else {
            out[o++] = in[i];
            out[o++] = c;
            i++;
        }
    }
    out[o] = '\0';
    return out;
}

static int add_regex(tern_tokenizer *t, const char *pat, size_t len, bool literal,
                     const char *where, tern_error *err) {
    char *rewritten = literal ? NULL : rewrite_regex(pat, len);
    if (!literal && !rewritten) return tern_fail(err, "out of memory");
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(literal ? pat : rewritten),
                                   literal ? len : PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
    free(rewritten);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return tern_fail(err, "%s: regex does not compile at offset %zu: %s", where, (size_t)eo,
                         (char *)msg);
    }
    /* JIT is a speed-up only; without it (no JIT on this CPU) the
     * interpreter runs the same pattern. */
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    uint32_t caps = 0;
    pcre2_pattern_info(re, PCRE2_INFO_CAPTURECOUNT, &caps);
    if (caps > t->max_captures) t->max_captures = caps;
    pcre2_code **r = realloc(t->re, (t->n_re + 1) * sizeof *r);
    if (!r) {
        pcre2_code_free(re);
        return tern_fail(err, "out of memory");
    }
    t->re = r;
    t->re[t->n_re++] = re;
    return 0;
}

/* ByteLevel: the byte mapping itself needs nothing here (the vocabulary is
 * converted once); use_regex adds the GPT-2 split. */
static int load_byte_level(tern_tokenizer *t, json_t *pt, bool last, const char *where,
                           tern_error *err) {
    if (!last)
        return tern_fail(err, "%s: ByteLevel must be the last pre-tokenizer", where);
    if (json_flag(pt, "add_prefix_space", false))
        return tern_fail(err, "%s.add_prefix_space=true is not supported", where);
    if (json_flag(pt, "use_regex", true))
        return add_regex(t, GPT2_REGEX, strlen(GPT2_REGEX), false, where, err);
    return 0;
}

static int load_split(tern_tokenizer *t, json_t *pt, const char *where, tern_error *err) {
    const char *behavior = json_string_value(json_object_get(pt, "behavior"));
    if (!behavior || strcmp(behavior, "Isolated") != 0)
        return tern_fail(err, "%s.behavior '%s' is not supported (only Isolated)", where,
                         behavior ? behavior : "(missing)");
    if (json_flag(pt, "invert", false))
        return tern_fail(err, "%s.invert=true is not supported", where);
    json_t *pat = json_object_get(pt, "pattern");
    json_t *re = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
    if (json_is_string(re))
        return add_regex(t, json_string_value(re), json_string_length(re), false, where, err);
    if (json_is_string(lit))
        return add_regex(t, json_string_value(lit), json_string_length(lit), true, where, err);
    return tern_fail(err, "%s.pattern must be {\"Regex\": ...} or {\"String\": ...}", where);
}

static int load_pre_tokenizer(tern_tokenizer *t, json_t *pt, tern_error *err) {
    const char *type = json_type_of(pt);
    if (json_is_null(pt) || !pt)
        return tern_fail(err, "pre_tokenizer is null; a byte-level BPE needs ByteLevel");
    if (!type) return tern_fail(err, "pre_tokenizer has no type");
    if (strcmp(type, "ByteLevel") == 0) return load_byte_level(t, pt, true, "pre_tokenizer", err);
    if (strcmp(type, "Sequence") != 0)
        return tern_fail(err, "pre_tokenizer.type '%s' is not supported", type);
    json_t *list = json_object_get(pt, "pretokenizers");
    if (!json_is_array(list)) return tern_fail(err, "pre_tokenizer.pretokenizers is not an array");
    size_t n = json_array_size(list);
    bool have_byte_level = false;
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_array_get(list, i);
        char where[64];
        snprintf(where, sizeof where, "pre_tokenizer.pretokenizers[%zu]", i);
        const char *ty = json_type_of(p);
        int rc;
        if (ty && strcmp(ty, "Split") == 0) {
            rc = load_split(t, p, where, err);
        } else if (ty && strcmp(ty, "ByteLevel") == 0) {
            rc = load_byte_level(t, p, i + 1 == n, where, err);
            have_byte_level = true;
        } else {
            return tern_fail(err, "%s.type '%s' is not supported", where, ty ? ty : "(missing)");
        }
        if (rc) return rc;
    }
    if (!have_byte_level)
        return tern_fail(err, "pre_tokenizer: Sequence without ByteLevel is not supported");
    return 0;
}

static int load_normalizer(tern_tokenizer *t, json_t *nm, const char *where, tern_error *err) {
    if (!nm || json_is_null(nm)) return 0;
    const char *type = json_type_of(nm);
    if (type && strcmp(type, "NFC") == 0) {
        t->nfc = true;
        return 0;
    }
    if (type && strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(nm, "normalizers");
        for (size_t i = 0; i < json_array_size(list); i++) {
            char w[64];
            snprintf(w, sizeof w, "%s.normalizers[%zu]", where, i);
            if (load_normalizer(t, json_array_get(list, i), w, err)) return -1;
        }
        return 0;
    }
    return tern_fail(err, "%s.type '%s' is not supported (only NFC)", where,
                     type ? type : "(missing)");
}

static int check_optional(json_t *root, const char *field, const char *allowed, tern_error *err) {
    json_t *v = json_object_get(root, field);
    if (!v || json_is_null(v)) return 0;
    const char *type = json_type_of(v);
    if (allowed && type && strcmp(type, allowed) == 0) return 0;
    if (allowed)
        return tern_fail(err, "%s.type '%s' is not supported (only null or %s)", field,
                         type ? type : "(missing)", allowed);
    return tern_fail(err, "%s must be null", field);
}

/* Registers a token: id, bytes, spelling. A token seen twice (an added token
 * that is also in the vocabulary) keeps the added token's entry. */
typedef struct builder {
    char *bytes;
    size_t bytes_len, bytes_cap;
    char *text;
    size_t text_len, text_cap;
} builder;

static int set_token(tern_tokenizer *t, builder *b, int32_t id, const char *bytes, size_t n,
                     const char *text, size_t text_n, uint8_t flags) {
    if (grow((void **)&b->bytes, &b->bytes_cap, b->bytes_len + n, 1) ||
        grow((void **)&b->text, &b->text_cap, b->text_len + text_n + 1, 1))
        return -1;
    token *k = &t->tok[id];
    k->off = (uint32_t)b->bytes_len;
    k->len = (uint32_t)n;
    k->text_off = (uint32_t)b->text_len;
    k->flags = flags;
    memcpy(b->bytes + b->bytes_len, bytes, n);
    b->bytes_len += n;
    memcpy(b->text + b->text_len, text, text_n);
    b->text[b->text_len + text_n] = '\0';
    b->text_len += text_n + 1;
    return 0;
}

/* NFC of s into a malloc'ed string; *out_len its length. */
static char *nfc_dup(const char *s, size_t n, size_t *out_len) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) return NULL;
    *out_len = (size_t)r;
    return (char *)dst;
}

static int cmp_added(const void *a, const void *b) {
    const added_token *x = *(added_token *const *)a, *y = *(added_token *const *)b;
    unsigned char fx = (unsigned char)x->content[0], fy = (unsigned char)y->content[0];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int build_added_set(tern_tokenizer *t, added_set *set, bool normalized) {
    set->tok = calloc(t->n_added + 1, sizeof *set->tok);
    if (!set->tok) return -1;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && t->added[i].len > 0)
            set->tok[set->n++] = &t->added[i];
    qsort(set->tok, set->n, sizeof *set->tok, cmp_added);
    size_t j = 0;
    for (int b = 0; b <= 256; b++) {
        while (j < set->n && (unsigned char)set->tok[j]->content[0] < b) j++;
        set->first[b] = (uint32_t)j;
    }
    return 0;
}

static int load_added_tokens(tern_tokenizer *t, builder *b, json_t *list, tern_error *err) {
    size_t n = json_array_size(list);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) return tern_fail(err, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(list, i);
        json_t *id = json_object_get(o, "id"), *content = json_object_get(o, "content");
        if (!json_is_integer(id) || !json_is_string(content))
            return tern_fail(err, "added_tokens[%zu] needs an integer id and a string content", i);
        json_int_t v = json_integer_value(id);
        if (v < 0 || v >= t->n_tok)
            return tern_fail(err, "added_tokens[%zu].id %lld out of range", i, (long long)v);
        added_token *a = &t->added[t->n_added++];
        a->id = (int32_t)v;
        a->special = json_flag(o, "special", false);
        a->normalized = json_flag(o, "normalized", !a->special);
        a->single_word = json_flag(o, "single_word", false);
        a->lstrip = json_flag(o, "lstrip", false);
        a->rstrip = json_flag(o, "rstrip", false);
        const char *c = json_string_value(content);
        size_t clen = json_string_length(content);
        uint8_t flags = TOK_PRESENT | TOK_ADDED | (a->special ? TOK_SPECIAL : 0);
        if (set_token(t, b, a->id, c, clen, c, clen, flags)) return tern_fail(err, "out of memory");
        /* Normalized tokens are looked for in NFC'd text, so their content
         * is NFC'd too (as `tokenizers` does with the normalizer). */
        if (a->normalized && t->nfc) {
            a->content = nfc_dup(c, clen, &a->len);
        } else {
            a->content = malloc(clen + 1);
            if (a->content) memcpy(a->content, c, clen + 1);
            a->len = clen;
        }
        if (!a->content) return tern_fail(err, "added_tokens[%zu]: out of memory", i);
    }
    if (build_added_set(t, &t->raw_set, false) || build_added_set(t, &t->norm_set, true))
        return tern_fail(err, "out of memory");
    return 0;
}

/* Looks a merge side up by its tokenizer.json spelling. */
static int32_t merge_side(const tern_tokenizer *t, const char *s, size_t n, char *buf) {
    long m = byte_level_decode(t->cp_to_byte, s, n, buf);
    return m < 0 ? -1 : byte_map_get(t, buf, (size_t)m);
}

static int load_merges(tern_tokenizer *t, json_t *merges, tern_error *err) {
    size_t n = json_array_size(merges);
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    t->merges = malloc(cap * sizeof *t->merges);
    if (!t->merges) return tern_fail(err, "out of memory");
    for (size_t i = 0; i < cap; i++) t->merges[i].key = UINT64_MAX;
    t->merges_mask = cap - 1;
    char *buf = NULL, *joined = NULL;
    size_t buf_cap = 0, joined_cap = 0;
    int rc = -1;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a, *b;
        size_t an, bn;
        if (json_is_string(m)) {
            /* legacy "a b": byte-level tokens never contain a space */
            a = json_string_value(m);
            const char *sp = memchr(a, ' ', json_string_length(m));
            if (!sp || memchr(sp + 1, ' ', json_string_length(m) - (size_t)(sp + 1 - a))) {
                tern_fail(err, "model.merges[%zu] \"%s\" is not two tokens separated by a space",
                          i, a);
                goto out;
            }
            an = (size_t)(sp - a);
            b = sp + 1;
            bn = json_string_length(m) - an - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            an = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            bn = json_string_length(json_array_get(m, 1));
        } else {
            tern_fail(err, "model.merges[%zu] is neither \"a b\" nor [a, b]", i);
            goto out;
        }
        if (grow((void **)&buf, &buf_cap, an + bn + 1, 1) ||
            grow((void **)&joined, &joined_cap, an + bn + 1, 1)) {
            tern_fail(err, "out of memory");
            goto out;
        }
        int32_t ia = merge_side(t, a, an, buf);
        int32_t ib = merge_side(t, b, bn, buf);
        if (ia < 0 || ib < 0) {
            tern_fail(err, "model.merges[%zu]: '%.*s' is not in the vocabulary", i,
                      (int)(ia < 0 ? an : bn), ia < 0 ? a : b);
            goto out;
        }
        const token *ka = &t->tok[ia], *kb = &t->tok[ib];
        memcpy(joined, t->bytes + ka->off, ka->len);
        memcpy(joined + ka->len, t->bytes + kb->off, kb->len);
        int32_t id = byte_map_get(t, joined, ka->len + kb->len);
        if (id < 0) {
            tern_fail(err, "model.merges[%zu]: the merge of '%.*s' and '%.*s' is not in the vocabulary",
                      i, (int)an, a, (int)bn, b);
            goto out;
        }
        merge_put(t, ia, ib, (int32_t)i, id);
    }
    rc = 0;
out:
    free(buf);
    free(joined);
    return rc;
}

static int load_model(tern_tokenizer *t, builder *b, json_t *model, json_t *added,
                      tern_error *err) {
    const char *type = json_type_of(model);
    if (!type || strcmp(type, "BPE") != 0)
        return tern_fail(err, "model.type '%s' is not supported (only BPE)", type ? type : "(missing)");
    json_t *v;
    if ((v = json_object_get(model, "dropout")) && !json_is_null(v) &&
        !(json_is_number(v) && json_number_value(v) == 0.0))
        return tern_fail(err, "model.dropout is not supported (must be null)");
    if (json_flag(model, "byte_fallback", false))
        return tern_fail(err, "model.byte_fallback=true is not supported");
    const char *fields[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        v = json_object_get(model, fields[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return tern_fail(err, "model.%s is not supported (must be null)", fields[i]);
    }
    if (!json_is_array(json_object_get(model, "merges")))
        return tern_fail(err, "model.merges is not an array");
    t->ignore_merges = json_flag(model, "ignore_merges", false);
    t->fuse_unk = json_flag(model, "fuse_unk", false);

    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return tern_fail(err, "model.vocab is not an object");
    /* ids: the largest of the vocabulary and the added tokens. The file's
     * own counts bound them (ids may leave holes, but not more ids than
     * entries), so a small file cannot ask for a huge table. */
    json_int_t max_id = -1, n_ids = (json_int_t)(json_object_size(vocab) + json_array_size(added));
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= n_ids)
            return tern_fail(err, "model.vocab[\"%s\"] is not an id in [0, %lld) (the vocabulary and added "
                             "tokens hold %lld entries)", key, (long long)n_ids, (long long)n_ids);
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *id = json_object_get(json_array_get(added, i), "id");
        if (json_is_integer(id) && (json_integer_value(id) < 0 || json_integer_value(id) >= n_ids))
            return tern_fail(err, "added_tokens[%zu].id %lld is not an id in [0, %lld) (the vocabulary and added "
                             "tokens hold %lld entries)", i, (long long)json_integer_value(id), (long long)n_ids,
                             (long long)n_ids);
        if (json_is_integer(id) && json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    t->n_tok = (int32_t)(max_id + 1);
    t->tok = calloc((size_t)t->n_tok + 1, sizeof *t->tok);
    size_t cap = 16;
    while (cap < (size_t)t->n_tok * 2) cap *= 2;
    t->byte_map = malloc(cap * sizeof *t->byte_map);
    if (!t->tok || !t->byte_map) return tern_fail(err, "out of memory");
    memset(t->byte_map, 0xFF, cap * sizeof *t->byte_map);
    t->byte_map_mask = cap - 1;

    char *buf = NULL;
    size_t buf_cap = 0;
    json_object_foreach(vocab, key, val) {
        size_t klen = strlen(key);
        if (grow((void **)&buf, &buf_cap, klen + 1, 1)) {
            free(buf);
            return tern_fail(err, "out of memory");
        }
        int32_t id = (int32_t)json_integer_value(val);
        long n = byte_level_decode(t->cp_to_byte, key, klen, buf);
        /* A vocabulary string outside the byte-level alphabet cannot come
         * out of BPE; decode gives its UTF-8, as the ByteLevel decoder does. */
        uint8_t flags = TOK_PRESENT | (n >= 0 ? TOK_BYTES : 0);
        if (set_token(t, b, id, n >= 0 ? buf : key, n >= 0 ? (size_t)n : klen, key, klen, flags)) {
            free(buf);
            return tern_fail(err, "out of memory");
        }
    }
    free(buf);
    t->bytes = b->bytes;    /* final for the byte map and the merges below */
    for (int32_t id = 0; id < t->n_tok; id++)
        if (t->tok[id].flags & TOK_BYTES) byte_map_put(t, id);
    for (int c = 0; c < 256; c++) {
        char ch = (char)c;
        t->byte_id[c] = byte_map_get(t, &ch, 1);
    }
    return load_merges(t, json_object_get(model, "merges"), err);
}

/* tokenizer_config.json names tokens as a string or {"content": ...}. */
static int config_token(tern_tokenizer *t, json_t *cfg, const char *field, int32_t *id,
                        tern_error *err) {
    *id = -1;
    json_t *v = json_object_get(cfg, field);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v))
        return tern_fail(err, "tokenizer_config.json: %s is not a string or {\"content\": ...}",
                         field);
    *id = tern_tokenizer_token_id(t, json_string_value(v));
    if (*id < 0)
        return tern_fail(err, "tokenizer_config.json: %s '%s' is not in the vocabulary", field,
                         json_string_value(v));
    return 0;
}

static int load_json(tern_tokenizer *t, json_t *root, tern_error *err) {
    if (!json_is_object(root)) return tern_fail(err, "not a JSON object");
    if (check_optional(root, "truncation", NULL, err) || check_optional(root, "padding", NULL, err) ||
        check_optional(root, "decoder", "ByteLevel", err) ||
        check_optional(root, "post_processor", "ByteLevel", err))
        return -1;
    if (load_normalizer(t, json_object_get(root, "normalizer"), "normalizer", err)) return -1;
    if (load_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"), err)) return -1;
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added))
        return tern_fail(err, "added_tokens is not an array");
    builder b = {0};
    int rc = load_model(t, &b, json_object_get(root, "model"), added, err);
    if (rc == 0) rc = load_added_tokens(t, &b, added, err);
    t->bytes = b.bytes;     /* final: set_token is done reallocating */
    t->text = b.text;
    if (rc) return rc;
    /* unk may be an added token, so it is looked up last */
    json_t *unk = json_object_get(json_object_get(root, "model"), "unk_token");
    t->unk_id = -1;
    if (json_is_string(unk) && (t->unk_id = tern_tokenizer_token_id(t, json_string_value(unk))) < 0)
        return tern_fail(err, "model.unk_token '%s' is not in the vocabulary", json_string_value(unk));
    return 0;
}

tern_tokenizer *tern_tokenizer_load_files(const char *path, const char *config_path,
                                          tern_error *err) {
    tern_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        tern_fail(err, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&t->lock, NULL);
    t->bos_id = t->eos_id = t->pad_id = t->unk_id = -1;
    uint32_t byte_to_cp[256];
    byte_level_map(byte_to_cp, t->cp_to_byte);

    json_t *root = tern_json_load(path, JSON_ALLOW_NUL, TERN_JSON_LARGE_MAX, err);
    if (!root) goto fail;
    int rc = load_json(t, root, err);
    json_decref(root);
    if (rc) {
        tern_err_prefix(err, "%s", path);
        goto fail;
    }
    if (config_path) {
        json_t *cfg = tern_json_load(config_path, 0, TERN_JSON_SMALL_MAX, err);
        if (!cfg) goto fail;
        rc = config_token(t, cfg, "bos_token", &t->bos_id, err) ||
             config_token(t, cfg, "eos_token", &t->eos_id, err) ||
             config_token(t, cfg, "pad_token", &t->pad_id, err);
        json_decref(cfg);
        if (rc) goto fail;
    }
    if (!(t->own = scratch_create(t, true))) {
        tern_fail(err, "out of memory");
        goto fail;
    }
    return t;
fail:
    tern_tokenizer_free(t);
    return NULL;
}

tern_tokenizer *tern_tokenizer_load(const char *dir, tern_error *err) {
    size_t n = strlen(dir) + 32;
    char *tj = malloc(n), *cj = malloc(n);
    if (!tj || !cj) {
        free(tj);
        free(cj);
        tern_fail(err, "out of memory");
        return NULL;
    }
    snprintf(tj, n, "%s/tokenizer.json", dir);
    snprintf(cj, n, "%s/tokenizer_config.json", dir);
    int has_config = tern_file_exists(cj);
    tern_tokenizer *t = tern_tokenizer_load_files(tj, has_config ? cj : NULL, err);
    free(tj);
    free(cj);
    return t;
}

void tern_tokenizer_free(tern_tokenizer *t) {
    if (!t) return;
    scratch_free(t->own);
    for (size_t i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    free(t->re);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t->raw_set.tok);
    free(t->norm_set.tok);
    free(t->merges);
    free(t->byte_map);
    free(t->tok);
    free(t->bytes);
    free(t->text);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

/* ---- added tokens ------------------------------------------------------- */

/* Unicode White_Space, what `tokenizers` strips for lstrip/rstrip. */
static bool is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* Rust regex's Unicode \w, used by single_word: letters, marks, decimal
 * digits, letter numbers, connector punctuation, ZWNJ/ZWJ. */
static bool is_word_char(uint32_t c) {
    if (c < 0x80)
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (c == 0x200C || c == 0x200D) return true;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

/* The code point that ends s[0..end) (valid UTF-8). */
static uint32_t last_cp(const char *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    uint32_t cp = 0;
    tern_utf8_decode(s + i, end - i, &cp);
    return cp;
}

static uint32_t first_cp(const char *s, size_t len) {
    uint32_t cp = 0;
    tern_utf8_decode(s, len, &cp);
    return cp;
}

/* Splits s into added tokens and the text between them, the way
 * `tokenizers` does (AddedVocabulary::find_matches): non-overlapping
 * leftmost-longest matches in order; a match that fails single_word, or a
 * special token under TERN_ENCODE_SPLIT_SPECIAL, is dropped but still
 * consumed; lstrip/rstrip take the adjacent White_Space into the token. The
 * splits are left in sc->splits (id -1 = text); returns their count or -1. */
static long find_added(const added_set *set, scratch *sc, const char *s, size_t len,
                       unsigned flags) {
    size_t n = 0, start_offset = 0;
    for (size_t i = set->n ? 0 : len; i < len;) {
        unsigned char c = (unsigned char)s[i];
        const added_token *hit = NULL;
        for (uint32_t k = set->first[c]; k < set->first[c + 1]; k++) {
            const added_token *a = set->tok[k];
            if (a->len <= len - i && memcmp(s + i, a->content, a->len) == 0) {
                hit = a;
                break;
            }
        }
        if (!hit) {
            i++;
            continue;
        }
        size_t start = i, stop = i + hit->len;
        i = stop;
        if ((flags & TERN_ENCODE_SPLIT_SPECIAL) && hit->special) continue;
        if (hit->single_word) {
            bool start_ok = start == 0 || !is_word_char(last_cp(s, start));
            bool stop_ok = stop == len || !is_word_char(first_cp(s + stop, len - stop));
            if (!start_ok || !stop_ok) continue;
        }
        if (hit->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t p = ns - 1;
                while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
                uint32_t cp = 0;
                tern_utf8_decode(s + p, ns - p, &cp);
                if (!is_white_space(cp)) break;
                ns = p;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (hit->rstrip) {
            while (stop < len) {
                uint32_t cp = 0;
                int k = tern_utf8_decode(s + stop, len - stop, &cp);
                if (k == 0 || !is_white_space(cp)) break;
                stop += (size_t)k;
            }
        }
        /* rstrip may have run past where the next search starts; a later
         * match can then begin inside it, and `tokenizers` would emit
         * overlapping pieces. Clamping keeps the pieces a partition. */
        if (start < start_offset) start = start_offset;
        if (grow((void **)&sc->splits, &sc->splits_cap, n + 2, sizeof *sc->splits)) return -1;
        if (start_offset < start) sc->splits[n++] = (struct split){start_offset, start, -1};
        sc->splits[n++] = (struct split){start, stop, hit->id};
        start_offset = stop;
    }
    if (grow((void **)&sc->splits, &sc->splits_cap, n + 1, sizeof *sc->splits)) return -1;
    if (start_offset < len) sc->splits[n++] = (struct split){start_offset, len, -1};
    return (long)n;
}

/* ---- output ------------------------------------------------------------- */

typedef struct idvec {
    int32_t **ids;
    size_t *n, *cap;
} idvec;

static int push_ids(idvec *v, const int32_t *ids, size_t n) {
    if (n == 0) return 0;
    if (grow((void **)v->ids, v->cap, *v->n + n, sizeof(int32_t))) return -1;
    memcpy(*v->ids + *v->n, ids, n * sizeof *ids);
    *v->n += n;
    return 0;
}

/* ---- BPE ---------------------------------------------------------------- */

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = v;
    return top;
}

/* BPE over the bytes of one pre-tokenizer split. Merges go lowest rank
 * first, leftmost first on equal rank (the same pair twice), which is the
 * order of `tokenizers`' priority queue. Heap entries are rank << 32 | left
 * symbol index; an entry whose pair has changed since it was pushed is
 * skipped when popped (its pair no longer has that rank). */
static int bpe_word(const tern_tokenizer *t, scratch *sc, const char *w, size_t n, idvec *out) {
    if (t->ignore_merges) {
        int32_t id = byte_map_get(t, w, n);
        if (id >= 0) return push_ids(out, &id, 1);
    }
    if (n == 1 && t->byte_id[(unsigned char)w[0]] >= 0)
        return push_ids(out, &t->byte_id[(unsigned char)w[0]], 1);
    uint64_t h = 0;
    bool cacheable = sc->cache && n <= CACHE_MAX_WORD;
    if (cacheable) {
        h = hash_bytes(w, n);
        const cache_slot *e = cache_get(sc->cache, h, w, n);
        if (e) return push_ids(out, sc->cache->ids + e->ids_off, e->n_ids);
    }
    if (grow((void **)&sc->sym, &sc->sym_cap, n, sizeof *sc->sym)) return -1;
    size_t cap = sc->sym_cap;   /* prev/next follow sym's capacity */
    int32_t *p = realloc(sc->prev, cap * sizeof *p), *q = p ? realloc(sc->next, cap * sizeof *q) : NULL;
    if (p) sc->prev = p;
    if (!p || !q) return -1;
    sc->next = q;
    if (grow((void **)&sc->heap, &sc->heap_cap, 3 * n + 4, sizeof *sc->heap)) return -1;

    /* symbols: one per byte; a byte missing from the vocabulary becomes unk
     * (fused with a preceding unk when fuse_unk) or is dropped, as in HF */
    int32_t *sym = sc->sym, *prev = sc->prev, *next = sc->next;
    size_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[(unsigned char)w[i]];
        if (id < 0) {
            if (t->unk_id < 0) continue;
            if (t->fuse_unk && ns > 0 && sym[ns - 1] == t->unk_id) continue;
            id = t->unk_id;
        }
        sym[ns++] = id;
    }
    for (size_t i = 0; i < ns; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const merge_slot *m = merge_get(t, sym[i], sym[i + 1]);
        if (m) heap_push(sc->heap, &hn, ((uint64_t)(uint32_t)m->rank << 32) | i);
    }
    while (hn > 0) {
        uint64_t top = heap_pop(sc->heap, &hn);
        int32_t pos = (int32_t)(top & 0xFFFFFFFF), rank = (int32_t)(top >> 32);
        if (sym[pos] < 0 || next[pos] < 0) continue;
        int32_t r = next[pos];
        const merge_slot *m = merge_get(t, sym[pos], sym[r]);
        if (!m || m->rank != rank) continue;
        sym[pos] = m->id;
        sym[r] = -1;
        next[pos] = next[r];
        if (next[r] >= 0) prev[next[r]] = pos;
        if (grow((void **)&sc->heap, &sc->heap_cap, hn + 2, sizeof *sc->heap)) return -1;
        if (prev[pos] >= 0 && (m = merge_get(t, sym[prev[pos]], sym[pos])))
            heap_push(sc->heap, &hn, ((uint64_t)(uint32_t)m->rank << 32) | (uint32_t)prev[pos]);
        if (next[pos] >= 0 && (m = merge_get(t, sym[pos], sym[next[pos]])))
            heap_push(sc->heap, &hn, ((uint64_t)(uint32_t)m->rank << 32) | (uint32_t)pos);
    }
    /* compact the surviving symbols to the front of sym, in order */
    size_t k = 0;
    for (int32_t i = ns ? 0 : -1; i >= 0; i = next[i]) sym[k++] = sym[i];
    if (cacheable) cache_put(sc->cache, h, w, n, sym, k);
    return push_ids(out, sym, k);
}

/* ---- pre-tokenizer ------------------------------------------------------ */

/* Applies regex `level` to s (Isolated: matches and the gaps between them
 * are all pieces, empty ones dropped), passing each piece to the next level
 * and finally to BPE. Each piece is its own subject, so lookarounds such as
 * (?!\S) see the piece's end, as in `tokenizers`. */
static int pre_tokenize(const tern_tokenizer *t, scratch *sc, size_t level, const char *s,
                        size_t len, idvec *out, tern_error *err) {
    if (len == 0) return 0;
    if (level == t->n_re) {
        if (bpe_word(t, sc, s, len, out)) return tern_fail(err, "out of memory");
        return 0;
    }
    size_t start = 0, pos = 0;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
    while (pos <= len) {
        int rc = pcre2_match(t->re[level], (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, sc->md,
                             sc->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return tern_fail(err, "pre-tokenizer regex %zu: %s", level, (char *)msg);
        }
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {
            /* An empty match still splits, as in `tokenizers` (Oniguruma's
             * find_iter): the gap before it is a piece of its own. Then
             * step over one character. */
            if (ms > start && pre_tokenize(t, sc, level + 1, s + start, ms - start, out, err)) return -1;
            if (ms > start) start = ms;
            if (ms >= len) break;
            pos = ms + 1;
            while (pos < len && ((unsigned char)s[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (ms > start && pre_tokenize(t, sc, level + 1, s + start, ms - start, out, err)) return -1;
        if (pre_tokenize(t, sc, level + 1, s + ms, me - ms, out, err)) return -1;
        start = pos = me;
    }
    if (start < len) return pre_tokenize(t, sc, level + 1, s + start, len - start, out, err);
    return 0;
}

/* ---- encode ------------------------------------------------------------- */

/* Text between raw added tokens: NFC, then normalized added tokens, then the
 * pre-tokenizer. */
static int encode_segment(const tern_tokenizer *t, scratch *sc, const char *s, size_t len,
                          unsigned flags, idvec *out, tern_error *err) {
    char *norm = NULL;
    if (t->nfc) {
        /* Every code point below U+0300 is NFC-stable and combines with
         * nothing before it; such text is its own NFC. Lead bytes >= 0xCC
         * are the only way to write U+0300 or above. */
        bool plain = true;
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)s[i] >= 0xCC) {
                plain = false;
                break;
            }
        if (!plain) {
            size_t nl;
            if (!(norm = nfc_dup(s, len, &nl))) return tern_fail(err, "NFC normalisation failed");
            s = norm;
            len = nl;
        }
    }
    int rc = 0;
    if (t->norm_set.n == 0) {
        rc = pre_tokenize(t, sc, 0, s, len, out, err);
    } else {
        long ns = find_added(&t->norm_set, sc, s, len, flags);
        if (ns < 0) {
            free(norm);
            return tern_fail(err, "out of memory");
        }
        /* a copy, like encode_with's: the splits live in the scratch, and
         * nothing called while walking them may reuse it */
        struct split *sp = malloc((size_t)ns * sizeof *sp + 1);
        if (!sp) {
            free(norm);
            return tern_fail(err, "out of memory");
        }
        memcpy(sp, sc->splits, (size_t)ns * sizeof *sp);
        for (long i = 0; i < ns && rc == 0; i++) {
            if (sp[i].id >= 0)
                rc = push_ids(out, &sp[i].id, 1) ? tern_fail(err, "out of memory") : 0;
            else
                rc = pre_tokenize(t, sc, 0, s + sp[i].start, sp[i].end - sp[i].start, out, err);
        }
        free(sp);
    }
    free(norm);
    return rc;
}

static int encode_with(const tern_tokenizer *t, scratch *sc, const char *text, size_t len,
                       unsigned flags, idvec *out, tern_error *err) {
    long ns = find_added(&t->raw_set, sc, text, len, flags);
    if (ns < 0) return tern_fail(err, "out of memory");
    /* copied: encode_segment runs find_added again on the same scratch */
    struct split *sp = malloc((size_t)ns * sizeof *sp + 1);
    if (!sp) return tern_fail(err, "out of memory");
    memcpy(sp, sc->splits, (size_t)ns * sizeof *sp);
    int rc = 0;
    for (long i = 0; i < ns && rc == 0; i++) {
        if (sp[i].id >= 0)
            rc = push_ids(out, &sp[i].id, 1) ? tern_fail(err, "out of memory") : 0;
        else
            rc = encode_segment(t, sc, text + sp[i].start, sp[i].end - sp[i].start, flags, out, err);
    }
    free(sp);
    return rc;
}

int tern_tokenizer_encode_append(tern_tokenizer *t, const char *text, size_t len, unsigned flags,
                                 int32_t **ids, size_t *n, size_t *cap, tern_error *err) {
    size_t valid = tern_utf8_valid_prefix(text, len);
    if (valid != len) return tern_fail(err, "tokenizer: invalid UTF-8 at byte %zu", valid);
    size_t n0 = *n;
    idvec out = {ids, n, cap};
    int rc;
    if (pthread_mutex_trylock(&t->lock) == 0) {
        rc = encode_with(t, t->own, text, len, flags, &out, err);
        pthread_mutex_unlock(&t->lock);
    } else {
        scratch *sc = scratch_create(t, false);
        if (!sc) return tern_fail(err, "out of memory");
        rc = encode_with(t, sc, text, len, flags, &out, err);
        scratch_free(sc);
    }
    if (rc) *n = n0;
    return rc;
}

int tern_tokenizer_encode(tern_tokenizer *t, const char *text, size_t len, unsigned flags,
                          int32_t **ids, size_t *n, tern_error *err) {
    int32_t *v = NULL;
    size_t nv = 0, cap = 0;
    if (tern_tokenizer_encode_append(t, text, len, flags, &v, &nv, &cap, err)) {
        free(v);
        return -1;
    }
    *ids = v;
    *n = nv;
    return 0;
}

/* ---- decode and lookups ------------------------------------------------- */

const char *tern_tokenizer_token_bytes(const tern_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_tok || !(t->tok[id].flags & TOK_PRESENT)) return NULL;
    if (len) *len = t->tok[id].len;
    return t->bytes + t->tok[id].off;
}

const char *tern_tokenizer_token_text(const tern_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_tok || !(t->tok[id].flags & TOK_PRESENT)) return NULL;
    return t->text + t->tok[id].text_off;
}

int tern_tokenizer_decode(const tern_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                          char **out, size_t *out_len, tern_error *err) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_tok || !(t->tok[ids[i]].flags & TOK_PRESENT))
            return tern_fail(err, "tokenizer: id %d at position %zu is not in the vocabulary",
                             (int)ids[i], i);
        total += t->tok[ids[i]].len;
    }
    char *s = malloc(total + 1);
    if (!s) return tern_fail(err, "out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const token *k = &t->tok[ids[i]];
        if (skip_special && (k->flags & TOK_SPECIAL)) continue;
        memcpy(s + o, t->bytes + k->off, k->len);
        o += k->len;
    }
    s[o] = '\0';
    *out = s;
    *out_len = o;
    return 0;
}

int32_t tern_tokenizer_token_id(const tern_tokenizer *t, const char *str) {
    size_t len = strlen(str);
    for (size_t i = 0; i < t->n_added; i++) {
        const token *k = &t->tok[t->added[i].id];
        if (k->len == len && memcmp(t->bytes + k->off, str, len) == 0) return t->added[i].id;
    }
    char stack[256];
    char *buf = len < sizeof stack ? stack : malloc(len + 1);
    if (!buf) return -1;
    long n = byte_level_decode(t->cp_to_byte, str, len, buf);
    int32_t id = n < 0 ? -1 : byte_map_get(t, buf, (size_t)n);
    if (buf != stack) free(buf);
    return id;
}

int tern_tokenizer_is_added(const tern_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_tok || !(t->tok[id].flags & TOK_ADDED)) return 0;
    return (t->tok[id].flags & TOK_SPECIAL) ? 2 : 1;
}

int32_t tern_tokenizer_vocab_size(const tern_tokenizer *t) { return t->n_tok; }
int32_t tern_tokenizer_bos_id(const tern_tokenizer *t) { return t->bos_id; }
int32_t tern_tokenizer_eos_id(const tern_tokenizer *t) { return t->eos_id; }
int32_t tern_tokenizer_pad_id(const tern_tokenizer *t) { return t->pad_id; }
