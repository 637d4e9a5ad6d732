/* tern_model_synth: the model `tern synth` would write, built in memory
 * (tern_pack_synth_mem, pack/pack.h): the bytes are those of the packed
 * directory, and the engine runs it exactly like a resident packed model. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "model/packed.h"
#include "pack/pack.h"
#include "util/err.h"

static int build(tern_model *m, const tern_synth_params *sp, const tern_load_params *lp, tern_error *err) {
    /* (on a GPU its experts stream from host memory, where they are) */
    int gpu = lp && lp->device && strncmp(lp->device, "cuda", 4) == 0;
    if (lp && lp->expert_budget && !gpu)
        return tern_fail(err, "an in-memory synthetic model has no files to stream experts from: write it with "
                              "tern synth and load that directory with a budget");
    if (lp && lp->expert_budget && lp->expert_home == TERN_HOME_DISK)
        return tern_fail(err, "expert_home disk: an in-memory synthetic model has no files (write it with tern synth)");
    if (lp && lp->expert_budget && tern_gpu_budget_set(m, lp, err)) return -1;
    tern_packed_mem pm;
    if (tern_pack_synth_mem(sp, m->pool, &pm, err) != 0) return -1;
    /* the model owns the mappings and the manifest from here (tern_model_free) */
    m->cfg = pm.cfg;
    m->man = pm.man;
    m->packed = 1;
    m->expert_maps = pm.expert_maps;
    m->expert_map_size = pm.expert_map_size;
    int rc = tern_packed_open_mem(&m->ts, &m->man, pm.resident, pm.resident_size, err);
    if (rc == 0) rc = tern_weights_bind(&m->w, &m->cfg, &m->ts, err);
    for (int f = 0; rc == 0 && f < pm.n_expert_maps; f++) {
        tern_moe_w *moe = f < m->cfg.n_layers ? &m->w.layers[f].moe : &m->w.mtp.layer.moe;
        moe->experts = calloc((size_t)m->man.n_experts, sizeof *moe->experts);
        if (!moe->experts) return tern_fail(err, "out of memory");
        for (int e = 0; e < m->man.n_experts; e++)
            tern_packed_expert_view(&m->man, (const uint8_t *)m->expert_maps[f] + (size_t)e * m->man.stride,
                                    &moe->experts[e]);
    }
    return rc;
}

tern_model *tern_model_synth(const tern_synth_params *sp, const tern_load_params *lp, tern_error *err) {
    tern_model *m = tern_model_alloc(lp, err);
    if (!m) return NULL;
    if (build(m, sp, lp, err) != 0) {
        tern_model_free(m);
        return NULL;
    }
    if (tern_model_finish(m, lp, err) != 0 || tern_model_place(m, lp, err) != 0) {
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
