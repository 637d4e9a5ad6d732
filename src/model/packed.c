#include "model/packed.h"

#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"
#include "util/file.h"

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
    int fd = tern_file_open(path, O_NOFOLLOW, err);
    if (fd < 0) return -1;
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

static int same_int(const char *label, const char *field, int have, int want, tern_error *err) {
    if (have == want) return 0;
    return tern_fail(err, "%s: %s is %d but config.json says %d", label, field, have, want);
}

static int check_part(const tern_pk_tensor *t, int64_t rows, int64_t cols, const char *label, tern_error *err) {
    if (t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols) return 0;
    return tern_fail(err, "%s: experts.parts.%s has shape [%lld, %lld] but the config implies [%lld, %lld]", label,
                     t->name, (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)rows,
                     (long long)cols);
}

int tern_packed_check_config(const tern_manifest *man, const tern_config *c, const char *label, tern_error *err) {
    const tern_pk_arch *a = &man->arch;
    if (same_int(label, "arch.hidden_size", a->hidden, c->hidden, err) ||
        same_int(label, "arch.num_hidden_layers", a->n_layers, c->n_layers, err) ||
        same_int(label, "arch.num_experts", a->n_experts, c->n_experts, err) ||
        same_int(label, "arch.num_experts_per_tok", a->top_k, c->top_k, err) ||
        same_int(label, "arch.moe_intermediate_size", a->expert_inter, c->expert_inter, err) ||
        same_int(label, "arch.vocab_size", a->vocab, c->vocab, err) ||
        same_int(label, "the number of experts.layers", man->n_layer_files, c->n_layers, err) ||
        same_int(label, "experts.count", man->n_experts, c->n_experts, err))
        return -1;
    int64_t I = c->expert_inter, H = c->hidden;
    return check_part(&man->parts[0], I, H, label, err) || check_part(&man->parts[1], I, H, label, err) ||
                   check_part(&man->parts[2], H, I, label, err)
               ? -1 : 0;
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
    uint64_t files = (uint64_t)man->n_layer_files + (man->mtp_file ? 1 : 0), per_file, total;
    /* the manifest reader bounds count x stride; saturate all the same */
    if (__builtin_mul_overflow((uint64_t)man->n_experts, man->stride, &per_file) ||
        __builtin_mul_overflow(files, per_file, &total))
        return UINT64_MAX;
    return total;
}
