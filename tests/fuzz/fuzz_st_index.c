/* model.safetensors.index.json (tern_tensors_open) next to two small
 * shards (a.safetensors: x, y; b.safetensors: z, written once). Every
 * tensor of an accepted set must be found by name, lie inside its shard's
 * mapping, and come from a shard in the directory. (An empty weight_map
 * opens no shard; the weights binder then names the first missing tensor.) */
#include "fuzz.h"
#include "model/tensors.h"

static volatile uint8_t sink;

/* A safetensors file: 8-byte length, header (padded with spaces so the
 * data is aligned), data. */
static void write_shard(const char *name, const char *header, const void *data, size_t n) {
    size_t hl = (strlen(header) + 7) / 8 * 8;
    uint8_t *buf = calloc(1, 8 + hl + n);
    if (!buf) abort();
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memset(buf + 8, ' ', hl);
    memcpy(buf + 8, header, strlen(header));
    memcpy(buf + 8 + hl, data, n);
    fuzz_write(fuzz_dir(), name, buf, 8 + hl + n);
    free(buf);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    static const float a[4] = {1, 2, 3, 4}, b[3] = {5, 6, 7};
    write_shard("a.safetensors",
                "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"y\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[8,16]}}",
                a, sizeof a);
    write_shard("b.safetensors", "{\"z\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}", b, sizeof b);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write(fuzz_dir(), "model.safetensors.index.json", data, size);
    tern_tensor_set ts;
    tern_error err;
    if (tern_tensors_open(&ts, fuzz_dir(), 0, &err) != 0) {
        FUZZ_NOTE("%s", err.msg);
        FUZZ_CHECK(err.msg[0], "tern_tensors_open failed without a message");
        return 0;
    }
    FUZZ_CHECK(ts.n_files <= 2, "%d shards open", ts.n_files);
    for (int f = 0; f < ts.n_files; f++) {
        const tern_st_file *sf = &ts.files[f];
        for (int i = 0; i < sf->n_tensors; i++) {
            const tern_tensor *t = &sf->tensors[i];
            FUZZ_CHECK(tern_tensors_get(&ts, t->name), "%s is in a shard but not found by name", t->name);
            const uint8_t *p = t->data, *base = sf->map;
            FUZZ_CHECK(p >= base && t->nbytes <= (uint64_t)(base + sf->size - p), "%s outside its shard", t->name);
            if (t->nbytes) sink += p[t->nbytes - 1];
        }
    }
    tern_tensors_close(&ts);
    return 0;
}
