/* All tensors of a model directory: one model.safetensors, or the shards
 * named by model.safetensors.index.json, looked up by name. */
#ifndef TERN_MODEL_TENSORS_H
#define TERN_MODEL_TENSORS_H

#include "model/safetensors.h"
#include "util/strmap.h"

typedef struct tern_tensor_set {
    tern_st_file *files;
    int n_files;
    tern_strmap *by_name;   /* name -> tern_tensor * */
    /* A packed model (model/packed.h) owns its tensors and one mapping, and
     * keeps routed experts out of the set. */
    tern_tensor *owned;
    int n_owned;
    void *map;
    size_t map_size;
    int experts_external;
} tern_tensor_set;

/* Opens the weights of dir. If the directory has no weights file at all and
 * allow_missing is set, returns 0 with n_files == 0. */
int tern_tensors_open(tern_tensor_set *ts, const char *dir, int allow_missing, tern_error *err);
void tern_tensors_close(tern_tensor_set *ts);
const tern_tensor *tern_tensors_get(const tern_tensor_set *ts, const char *name);

#endif
