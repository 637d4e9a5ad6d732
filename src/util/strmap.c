#include "util/strmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *key;
    void *value;
} slot;

struct tern_strmap {
    slot *slots;
    size_t cap;     /* power of two */
    size_t count;
};

static uint64_t hash_str(const char *s) {   /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) { h ^= (unsigned char)*s; h *= 1099511628211ull; }
    return h;
}

tern_strmap *tern_strmap_create(void) {
    tern_strmap *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cap = 64;
    m->slots = calloc(m->cap, sizeof *m->slots);
    if (!m->slots) { free(m); return NULL; }
    return m;
}

void tern_strmap_destroy(tern_strmap *m) {
    if (!m) return;
    free(m->slots);
    free(m);
}

static slot *find_slot(slot *slots, size_t cap, const char *key) {
    size_t i = (size_t)hash_str(key) & (cap - 1);
    while (slots[i].key && strcmp(slots[i].key, key) != 0) i = (i + 1) & (cap - 1);
    return &slots[i];
}

static int grow(tern_strmap *m) {
    size_t cap = m->cap * 2;
    slot *s = calloc(cap, sizeof *s);
    if (!s) return -1;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key) *find_slot(s, cap, m->slots[i].key) = m->slots[i];
    free(m->slots);
    m->slots = s;
    m->cap = cap;
    return 0;
}

int tern_strmap_put(tern_strmap *m, const char *key, void *value) {
    if ((m->count + 1) * 2 > m->cap && grow(m) != 0) return -1;
    slot *s = find_slot(m->slots, m->cap, key);
    if (!s->key) { s->key = key; m->count++; }
    s->value = value;
    return 0;
}

void *tern_strmap_get(const tern_strmap *m, const char *key) {
    slot *s = find_slot(m->slots, m->cap, key);
    return s->key ? s->value : NULL;
}

size_t tern_strmap_count(const tern_strmap *m) { return m->count; }
