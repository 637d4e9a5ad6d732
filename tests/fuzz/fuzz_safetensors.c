/* A safetensors file (tern_st_open): the header length, the JSON header and
 * the data it points at. Every tensor the reader accepts must lie inside
 * the file with nbytes = numel x dtype size = the product of its shape. */
#include "fuzz.h"
#include "model/safetensors.h"

static volatile uint8_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", fuzz_dir());
    fuzz_write(fuzz_dir(), "model.safetensors", data, size);
    tern_st_file f;
    tern_error err;
    if (tern_st_open(&f, path, &err) != 0) {
        FUZZ_NOTE("%s", err.msg);
        FUZZ_CHECK(err.msg[0], "tern_st_open failed without a message");
        return 0;
    }
    const uint8_t *base = f.map, *end = base + f.size;
    for (int i = 0; i < f.n_tensors; i++) {
        const tern_tensor *t = &f.tensors[i];
        FUZZ_CHECK(t->name && t->ndim >= 0 && t->ndim <= TERN_MAX_DIMS, "tensor %d: bad name/ndim", i);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            FUZZ_CHECK(t->shape[d] >= 0, "%s: negative dim", t->name);
            FUZZ_CHECK(!__builtin_mul_overflow(numel, t->shape[d], &numel), "%s: shape overflows", t->name);
        }
        FUZZ_CHECK(numel == t->numel, "%s: numel %lld, shape gives %lld", t->name, (long long)t->numel,
                   (long long)numel);
        FUZZ_CHECK((uint64_t)numel * tern_dtype_size(t->dtype) == t->nbytes, "%s: nbytes %llu for %lld x %zu",
                   t->name, (unsigned long long)t->nbytes, (long long)numel, tern_dtype_size(t->dtype));
        const uint8_t *p = t->data;
        FUZZ_CHECK(t->nbytes == 0 || (p >= base + 8 && p <= end && t->nbytes <= (uint64_t)(end - p)),
                   "%s: data outside the file", t->name);
        /* touch the bytes: a read outside the mapping faults */
        for (uint64_t b = 0; b < t->nbytes; b += 4096) sink += p[b];
        if (t->nbytes) sink += p[t->nbytes - 1];
    }
    tern_st_close(&f);
    return 0;
}
