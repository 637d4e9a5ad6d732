#include "model/packed.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"

int tern_is_packed_dir(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    return access(path, F_OK) == 0;
}

static int dtype_of(int encoding) {
    switch (encoding) {
    case TERN_ENC_F32: return TERN_DTYPE_F32;
    case TERN_ENC_F16: return TERN_DTYPE_F16;
    case TERN_ENC_BF16: return TERN_DTYPE_BF16;
    default: return TERN_DTYPE_U8;   /* packed q */
    }
}

static int bits_of(int encoding) {
    return encoding == TERN_ENC_Q4 ? 4 : encoding == TERN_ENC_Q8 ? 8 : 0;
}

/* A manifest entry as a tensor pointing into `base` (the manifest reader
 * has already checked every range against the file). */
static void fill_tensor(tern_tensor *t, const tern_pk_tensor *pk, const uint8_t *base, const char *file) {
    memset(t, 0, sizeof *t);
    t->name = pk->name;
    t->ndim = pk->ndim;
    t->numel = 1;
    for (int d = 0; d < pk->ndim; d++) {
        t->shape[d] = pk->shape[d];
        t->numel *= pk->shape[d];
    }
    t->dtype = dtype_of(pk->encoding);
    t->bits = bits_of(pk->encoding);
    t->group = pk->group;
    t->data = base + pk->data.off;
    t->nbytes = pk->data.size;
    t->file = file;
    if (t->bits) {
        t->scales = (const uint16_t *)(base + pk->scales.off);
        t->biases = (const uint16_t *)(base + pk->biases.off);
    }
}

int tern_packed_open(tern_tensor_set *ts, const tern_manifest *man, const char *dir, tern_error *err) {
    memset(ts, 0, sizeof *ts);
    char path[4096];
    snprintf(path, sizeof path, "%s/resident.bin", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return tern_fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) { close(fd); return tern_fail(err, "%s: cannot stat", path); }
    ts->map_size = (size_t)st.st_size;
    ts->map = ts->map_size ? mmap(NULL, ts->map_size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (ts->map == MAP_FAILED) {
        ts->map = NULL;
        return tern_fail(err, "%s: mmap failed: %s", path, strerror(errno));
    }
    return tern_packed_open_mem(ts, man, ts->map, ts->map_size, err);
}

int tern_packed_open_mem(tern_tensor_set *ts, const tern_manifest *man, void *base, size_t size, tern_error *err) {
    ts->map = base;
    ts->map_size = size;
    ts->by_name = tern_strmap_create();
    ts->owned = calloc((size_t)man->n_tensors + 1, sizeof *ts->owned);
    ts->experts_external = 1;
    if (!ts->by_name || !ts->owned) {
        tern_tensors_close(ts);
        return tern_fail(err, "out of memory");
    }
    for (int i = 0; i < man->n_tensors; i++) {
        const tern_pk_tensor *pk = &man->tensors[i];
        uint64_t end = pk->data.off + pk->data.size;
        if (end > ts->map_size || (bits_of(pk->encoding) &&
                                   (pk->scales.off + pk->scales.size > ts->map_size ||
                                    pk->biases.off + pk->biases.size > ts->map_size))) {
            tern_tensors_close(ts);
            return tern_fail(err, "resident.bin: tensor '%s' lies past the end of the file", pk->name);
        }
        fill_tensor(&ts->owned[i], pk, ts->map, "resident.bin");
        if (tern_strmap_put(ts->by_name, pk->name, &ts->owned[i]) != 0) {
            tern_tensors_close(ts);
            return tern_fail(err, "out of memory");
        }
        ts->n_owned++;
    }
    return 0;
}

static void part_view(const tern_pk_tensor *pk, const uint8_t *blob, tern_mat *m) {
    tern_tensor t;
    fill_tensor(&t, pk, blob, NULL);
    *m = (tern_mat){.data = t.data, .dtype = t.dtype, .rows = pk->shape[0], .cols = pk->shape[1],
                    .bits = t.bits, .group = t.group, .scales = t.scales, .biases = t.biases};
}

void tern_packed_expert_view(const tern_manifest *man, const uint8_t *blob, tern_expert_w *out) {
    part_view(&man->parts[0], blob, &out->gate);
    part_view(&man->parts[1], blob, &out->up);
    part_view(&man->parts[2], blob, &out->down);
}

uint64_t tern_packed_expert_bytes(const tern_manifest *man) {
    int files = man->n_layer_files + (man->mtp_file ? 1 : 0);
    return (uint64_t)files * man->n_experts * man->stride;
}
