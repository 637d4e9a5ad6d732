/* A packed model's manifest.json (tern_manifest_read). An accepted
 * manifest must give tensors whose ranges have the sizes their shapes and
 * encodings need, safe relative paths, and must round-trip: written out
 * (tern_manifest_dumps) and read again, it gives the same text. */
#include "fuzz.h"
#include "model/manifest.h"

static void check_tensor(const tern_pk_tensor *t, const char *what) {
    uint64_t data, scales;
    FUZZ_CHECK(tern_pk_tensor_bytes(t, &data, &scales) == 0, "%s: shape cannot hold its encoding", what);
    FUZZ_CHECK(t->data.size == data, "%s: data %llu bytes, shape needs %llu", what,
               (unsigned long long)t->data.size, (unsigned long long)data);
    FUZZ_CHECK(t->scales.size == scales, "%s: scales %llu bytes, shape needs %llu", what,
               (unsigned long long)t->scales.size, (unsigned long long)scales);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = fuzz_dir();
    fuzz_write(dir, "manifest.json", data, size);
    tern_manifest m;
    tern_error err;
    if (tern_manifest_read(&m, dir, &err) != 0) {
        FUZZ_NOTE("%s", err.msg);
        FUZZ_CHECK(err.msg[0], "tern_manifest_read failed without a message");
        return 0;
    }
    for (int i = 0; i < m.n_tensors; i++) check_tensor(&m.tensors[i], m.tensors[i].name);
    for (int p = 0; p < 3; p++) {
        check_tensor(&m.parts[p], "experts part");
        FUZZ_CHECK(m.parts[p].data.off + m.parts[p].data.size <= m.stride, "experts part %d outside the blob", p);
    }
    for (int i = 0; i < m.n_layer_files; i++) FUZZ_CHECK(tern_manifest_path_ok(m.layer_files[i]), "layer file path");
    for (int i = 0; i < m.n_files; i++) FUZZ_CHECK(tern_manifest_path_ok(m.files[i].path), "file path");
    char *text = tern_manifest_dumps(&m, &err);
    FUZZ_CHECK(text, "dumps: %s", err.msg);
    fuzz_write(dir, "manifest.json", text, strlen(text));
    tern_manifest m2;
    FUZZ_CHECK(tern_manifest_read(&m2, dir, &err) == 0, "its own dump is refused: %s", err.msg);
    char *text2 = tern_manifest_dumps(&m2, &err);
    FUZZ_CHECK(text2 && strcmp(text, text2) == 0, "the dump does not round-trip");
    free(text);
    free(text2);
    tern_manifest_free(&m2);
    tern_manifest_free(&m);
    return 0;
}
