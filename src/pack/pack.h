/* The packer's entry for callers outside src/pack (the public one is
 * tern_pack, tern.h): a synthetic model packed into memory. */
#ifndef TERN_PACK_PACK_H
#define TERN_PACK_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "model/manifest.h"
#include "tern.h"
#include "util/pool.h"

/* What `tern synth` would write, in anonymous mappings instead of files:
 * the bytes of resident.bin and of each expert file, laid out as on disk. */
typedef struct tern_packed_mem {
    tern_config cfg;
    tern_manifest man;
    uint8_t *resident;           /* resident.bin (munmap, resident_size) */
    size_t resident_size;
    void **expert_maps;          /* [n_expert_maps] one expert file each (munmap, expert_map_size) */
    int n_expert_maps;
    size_t expert_map_size;
} tern_packed_mem;

/* Packs the synthetic model sp describes (bits 4 or 8, every class; the
 * routed experts at expert_bits when set; group 64), encoding on pool's
 * threads. On success the caller owns every field of out. */
int tern_pack_synth_mem(const tern_synth_params *sp, tern_pool *pool, tern_packed_mem *out, tern_error *err);

#endif
