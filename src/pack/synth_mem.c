/* tern_pack_synth_mem: the same plan and the same encoder as tern synth,
 * filling anonymous mappings instead of files, so the bytes are those of
 * the packed directory. */
#include "pack/pack.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "pack/plan.h"
#include "pack/source.h"
#include "synth/synth.h"
#include "util/err.h"

#define ROWS_PER_TASK 64

typedef struct {
    const pk_plan *p;
    const pk_item *it;
    const tern_pk_tensor *t;
    uint8_t *base;               /* resident bytes */
    int failed;
} tensor_job;

static void encode_tensor_rows(void *arg, int64_t b, int64_t e) {
    tensor_job *j = arg;
    const tern_pk_tensor *t = j->t;
    int64_t cols = j->it->src.cols, rows = j->it->src.rows;
    int64_t r0 = b * ROWS_PER_TASK, r1 = e * ROWS_PER_TASK < rows ? e * ROWS_PER_TASK : rows;
    int64_t ng = t->group ? cols / t->group : 0;
    float *scratch = malloc((size_t)((r1 - r0) * cols) * sizeof(float));
    if (!scratch) { j->failed = 1; return; }
    uint16_t *sc = t->scales.size ? (uint16_t *)(j->base + t->scales.off) + r0 * ng : NULL;
    uint16_t *bi = t->scales.size ? (uint16_t *)(j->base + t->biases.off) + r0 * ng : NULL;
    pk_encode_rows(j->it, t, r0, r1 - r0, j->base + t->data.off + (size_t)r0 * pk_row_bytes(t, cols), sc, bi, scratch);
    free(scratch);
}

typedef struct {
    const pk_plan *p;
    int file;
    uint8_t *blobs;
    int failed;
} expert_job;

static void encode_expert_range(void *arg, int64_t b, int64_t e) {
    expert_job *j = arg;
    float *scratch = malloc(pk_blob_scratch_floats(j->p) * sizeof(float));
    if (!scratch) { j->failed = 1; return; }
    for (int64_t x = b; x < e; x++)
        pk_encode_blob(j->p, j->file, (int)x, j->blobs + (size_t)x * j->p->man.stride, scratch);
    free(scratch);
}

static void *anon(size_t n) {
    void *p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static int fill_resident(tern_pool *pool, const pk_plan *p, uint8_t *base, tern_error *err) {
    for (int i = 0; i < p->man.n_tensors; i++) {
        tensor_job j = {p, &p->items[i], &p->man.tensors[i], base, 0};
        int64_t tasks = (j.it->src.rows + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
        tern_pool_for(pool, tasks, encode_tensor_rows, &j);
        if (j.failed) return tern_fail(err, "out of memory");
    }
    return 0;
}

static int fill_experts(tern_pool *pool, const pk_plan *p, tern_packed_mem *out, tern_error *err) {
    int nf = p->n_expert_files;
    out->expert_map_size = (size_t)p->man.n_experts * p->man.stride;
    out->expert_maps = calloc((size_t)nf, sizeof *out->expert_maps);
    if (!out->expert_maps) return tern_fail(err, "out of memory");
    out->n_expert_maps = nf;
    for (int f = 0; f < nf; f++) {
        if (!(out->expert_maps[f] = anon(out->expert_map_size)))
            return tern_fail(err, "cannot allocate %zu bytes for the experts of layer %d", out->expert_map_size, f);
        expert_job j = {p, f, out->expert_maps[f], 0};
        tern_pool_for(pool, p->man.n_experts, encode_expert_range, &j);
        if (j.failed) return tern_fail(err, "out of memory");
    }
    return 0;
}

static void free_maps(tern_packed_mem *out) {
    if (out->resident) munmap(out->resident, out->resident_size);
    for (int f = 0; f < out->n_expert_maps; f++)
        if (out->expert_maps[f]) munmap(out->expert_maps[f], out->expert_map_size);
    free(out->expert_maps);
}

int tern_pack_synth_mem(const tern_synth_params *sp, tern_pool *pool, tern_packed_mem *out, tern_error *err) {
    memset(out, 0, sizeof *out);
    if (sp->bits && sp->bits != 4 && sp->bits != 8) return tern_fail(err, "bits must be 4 or 8 (got %d)", sp->bits);
    if (sp->expert_bits && sp->expert_bits != 4 && sp->expert_bits != 8)
        return tern_fail(err, "expert bits must be 4 or 8 (got %d)", sp->expert_bits);
    pk_source src;
    if (pk_source_synth(&src, sp, err) != 0) return -1;
    pk_options o = {.group = 64};
    for (int q = 0; q < TERN_QC_COUNT; q++) o.bits[q] = sp->bits ? sp->bits : 4;
    if (sp->expert_bits) o.bits[TERN_QC_EXPERTS] = sp->expert_bits;
    out->cfg = src.synth->cfg;
    pk_plan p;
    if (pk_plan_build(&p, &src, &out->cfg, &o, err) != 0) {
        pk_source_close(&src);
        return -1;
    }
    out->resident_size = p.resident_size;
    out->resident = anon(p.resident_size);
    int rc = out->resident ? 0
                           : tern_fail(err, "cannot allocate %llu resident bytes", (unsigned long long)p.resident_size);
    if (rc == 0) rc = fill_resident(pool, &p, out->resident, err);
    if (rc == 0) rc = fill_experts(pool, &p, out, err);
    if (rc == 0) {
        out->man = p.man;         /* the manifest names and lays out the tensors */
        memset(&p.man, 0, sizeof p.man);
    } else {
        free_maps(out);
    }
    pk_plan_free(&p);
    pk_source_close(&src);
    return rc;
}
