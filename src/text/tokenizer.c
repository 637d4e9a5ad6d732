/* Byte-level BPE tokenizer (see tokenizer.h for what is supported and why;
 * tokenizer_internal.h for its parts). Here, in the order text flows
 * through them:
 *   hash tables      bytes -> id, merge pair -> (rank, id), word cache
 *   BPE              merges by rank over the bytes of one split
 *   encode / decode  raw added tokens, NFC (utf8proc), normalized added
 *                    tokens, the pre-tokenizer (tokenizer_pre.c), BPE
 */
#include "text/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/utf8.h"

/* ---- small growable arrays -------------------------------------------- */

int tern_tok_grow(void **p, size_t *cap, size_t need, size_t elem) {
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

/* ---- byte-level map ----------------------------------------------------- */

/* GPT-2's map: printable Latin-1 bytes stand for themselves, the other 68
 * bytes take the code points 256, 257, ... in byte order. */
void tern_tok_byte_level_map(uint32_t byte_to_cp[256], int16_t cp_to_byte[512]) {
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
long tern_tok_byte_level_decode(const int16_t cp_to_byte[512], const char *s, size_t len,
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

int32_t tern_tok_byte_map_get(const tern_tokenizer *t, const char *s, size_t n) {
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
void tern_tok_byte_map_put(tern_tokenizer *t, int32_t id) {
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
void tern_tok_merge_put(tern_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id) {
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
    if (tern_tok_grow((void **)&c->keys, &c->keys_cap, c->keys_len + n, 1) ||
        tern_tok_grow((void **)&c->ids, &c->ids_cap, c->ids_len + n_ids, sizeof(int32_t)))
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

void tern_tok_scratch_free(scratch *s) {
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

scratch *tern_tok_scratch_create(const tern_tokenizer *t, bool with_cache) {
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
    tern_tok_scratch_free(s);
    return NULL;
}

/* ---- output ------------------------------------------------------------- */


static int push_ids(idvec *v, const int32_t *ids, size_t n) {
    if (n == 0) return 0;
    if (tern_tok_grow((void **)v->ids, v->cap, *v->n + n, sizeof(int32_t))) return -1;
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
int tern_tok_bpe_word(const tern_tokenizer *t, scratch *sc, const char *w, size_t n, idvec *out) {
    if (t->ignore_merges) {
        int32_t id = tern_tok_byte_map_get(t, w, n);
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
    if (tern_tok_grow((void **)&sc->sym, &sc->sym_cap, n, sizeof *sc->sym)) return -1;
    size_t cap = sc->sym_cap;   /* prev/next follow sym's capacity */
    int32_t *p = realloc(sc->prev, cap * sizeof *p), *q = p ? realloc(sc->next, cap * sizeof *q) : NULL;
    if (p) sc->prev = p;
    if (!p || !q) return -1;
    sc->next = q;
    if (tern_tok_grow((void **)&sc->heap, &sc->heap_cap, 3 * n + 4, sizeof *sc->heap)) return -1;

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
        if (tern_tok_grow((void **)&sc->heap, &sc->heap_cap, hn + 2, sizeof *sc->heap)) return -1;
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
            if (!(norm = tern_tok_nfc_dup(s, len, &nl))) return tern_fail(err, "NFC normalisation failed");
            s = norm;
            len = nl;
        }
    }
    int rc = 0;
    if (t->norm_set.n == 0) {
        rc = tern_tok_pre_tokenize(t, sc, 0, s, len, out, err);
    } else {
        long ns = tern_tok_find_added(&t->norm_set, sc, s, len, flags);
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
                rc = tern_tok_pre_tokenize(t, sc, 0, s + sp[i].start, sp[i].end - sp[i].start, out, err);
        }
        free(sp);
    }
    free(norm);
    return rc;
}

static int encode_with(const tern_tokenizer *t, scratch *sc, const char *text, size_t len,
                       unsigned flags, idvec *out, tern_error *err) {
    long ns = tern_tok_find_added(&t->raw_set, sc, text, len, flags);
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
        scratch *sc = tern_tok_scratch_create(t, false);
        if (!sc) return tern_fail(err, "out of memory");
        rc = encode_with(t, sc, text, len, flags, &out, err);
        tern_tok_scratch_free(sc);
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
    long n = tern_tok_byte_level_decode(t->cp_to_byte, str, len, buf);
    int32_t id = n < 0 ? -1 : tern_tok_byte_map_get(t, buf, (size_t)n);
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
