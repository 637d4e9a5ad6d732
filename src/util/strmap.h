/* String -> pointer hash map (open addressing). Used to look up tensors by
 * name: a per-expert checkpoint of the full model has ~31 K tensors. Keys are
 * borrowed: they must outlive the map. */
#ifndef TERN_UTIL_STRMAP_H
#define TERN_UTIL_STRMAP_H

#include <stddef.h>

typedef struct tern_strmap tern_strmap;

tern_strmap *tern_strmap_create(void);
void tern_strmap_destroy(tern_strmap *m);
/* Returns 0, or -1 on allocation failure. Replaces an existing value. */
int tern_strmap_put(tern_strmap *m, const char *key, void *value);
void *tern_strmap_get(const tern_strmap *m, const char *key);
size_t tern_strmap_count(const tern_strmap *m);

#endif
