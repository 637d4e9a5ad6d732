/* tern_model_synth: the model `tern synth` would write, built in memory.
 * The same plan and the same encoder fill anonymous mappings instead of
 * files, so the bytes are those of the packed directory and the engine
 * runs it exactly like a resident packed model. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "engine/engine.h"
#include "model/packed.h"
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

static int fill_resident(tern_model *m, const pk_plan *p, uint8_t *base, tern_error *err) {
    for (int i = 0; i < p->man.n_tensors; i++) {
        tensor_job j = {p, &p->items[i], &p->man.tensors[i], base, 0};
        int64_t tasks = (j.it->src.rows + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
        tern_pool_for(m->pool, tasks, encode_tensor_rows, &j);
        if (j.failed) return tern_fail(err, "out of memory");
    }
    return 0;
}

static int fill_experts(tern_model *m, const pk_plan *p, tern_error *err) {
    int nf = p->n_expert_files;
    m->expert_map_size = (size_t)p->man.n_experts * p->man.stride;
    m->expert_maps = calloc((size_t)nf, sizeof *m->expert_maps);
    if (!m->expert_maps) return tern_fail(err, "out of memory");
    for (int f = 0; f < nf; f++) {
        if (!(m->expert_maps[f] = anon(m->expert_map_size)))
            return tern_fail(err, "cannot allocate %zu bytes for the experts of layer %d", m->expert_map_size, f);
        expert_job j = {p, f, m->expert_maps[f], 0};
        tern_pool_for(m->pool, p->man.n_experts, encode_expert_range, &j);
        if (j.failed) return tern_fail(err, "out of memory");
        tern_moe_w *moe = f < m->cfg.n_layers ? &m->w.layers[f].moe : &m->w.mtp.layer.moe;
        moe->experts = calloc((size_t)p->man.n_experts, sizeof *moe->experts);
        if (!moe->experts) return tern_fail(err, "out of memory");
        for (int e = 0; e < p->man.n_experts; e++)
            tern_packed_expert_view(&p->man, (const uint8_t *)m->expert_maps[f] + (size_t)e * p->man.stride,
                                    &moe->experts[e]);
    }
    return 0;
}

static int build(tern_model *m, const tern_synth_params *sp, const tern_load_params *lp, tern_error *err) {
    if (sp->bits && sp->bits != 4 && sp->bits != 8) return tern_fail(err, "bits must be 4 or 8 (got %d)", sp->bits);
    if (sp->expert_bits && sp->expert_bits != 4 && sp->expert_bits != 8)
        return tern_fail(err, "expert bits must be 4 or 8 (got %d)", sp->expert_bits);
    if (lp && lp->expert_budget)
        return tern_fail(err, "an in-memory synthetic model has no files to stream experts from: write it with "
                              "tern synth and load that directory with a budget");
    pk_source src;
    if (pk_source_synth(&src, sp, err) != 0) return -1;
    pk_options o = {.group = 64};
    for (int q = 0; q < TERN_QC_COUNT; q++) o.bits[q] = sp->bits ? sp->bits : 4;
    if (sp->expert_bits) o.bits[TERN_QC_EXPERTS] = sp->expert_bits;
    m->cfg = src.synth->cfg;
    pk_plan p;
    int rc = pk_plan_build(&p, &src, &m->cfg, &o, err);
    if (rc != 0) { pk_source_close(&src); return -1; }
    uint8_t *base = anon(p.resident_size);
    rc = base ? 0 : tern_fail(err, "cannot allocate %llu resident bytes", (unsigned long long)p.resident_size);
    if (rc == 0) rc = fill_resident(m, &p, base, err);
    if (rc == 0) rc = tern_packed_open_mem(&m->ts, &p.man, base, p.resident_size, err);
    else if (base) munmap(base, p.resident_size);
    if (rc == 0) rc = tern_weights_bind(&m->w, &m->cfg, &m->ts, err);
    if (rc == 0) rc = fill_experts(m, &p, err);
    /* the model keeps the manifest (names and layout the tensors point into) */
    m->man = p.man;
    memset(&p.man, 0, sizeof p.man);
    m->packed = 1;
    pk_plan_free(&p);
    pk_source_close(&src);
    return rc;
}

tern_model *tern_model_synth(const tern_synth_params *sp, const tern_load_params *lp, tern_error *err) {
    tern_model *m = tern_model_alloc(lp, err);
    if (!m) return NULL;
    if (build(m, sp, lp, err) != 0) {
        tern_model_free(m);
        return NULL;
    }
    if (tern_model_finish(m, err) != 0 || tern_model_place(m, lp, err) != 0) {
        tern_model_free(m);
        return NULL;
    }
    for (int l = 0; l < m->cfg.n_layers; l++) m->w.layers[l].moe.stream_index = l;
    m->w.mtp.layer.moe.stream_index = m->man.n_layer_files;
    char *dir = strdup(m->man.source_path ? m->man.source_path : "synthetic");
    if (!dir) {
        tern_fail(err, "out of memory");
        tern_model_free(m);
        return NULL;
    }
    free(m->dir);
    m->dir = dir;
    return m;
}
