/* What `tern pack` will write, decided before a byte is written: every
 * resident tensor's canonical name, encoding and place in resident.bin,
 * the routed-expert blob layout, the list of output files and their sizes.
 * The plan is a pure function of the source and the options, which is what
 * makes the output deterministic and a resumed pack identical to an
 * uninterrupted one. */
#ifndef TERN_PACK_PLAN_H
#define TERN_PACK_PLAN_H

#include <stdint.h>

#include "model/config.h"
#include "model/manifest.h"
#include "pack/source.h"

typedef struct pk_options {
    int bits[TERN_QC_COUNT];       /* 4, 8 or 16 (keep float) */
    int explicit_bits[TERN_QC_COUNT];   /* given by the user: an MLX source refuses a change */
    int group;                     /* 32, 64 or 128 */
} pk_options;

/* How an output tensor is made from its source. */
enum pk_mode {
    PK_MODE_COPY,                  /* float bytes as stored */
    PK_MODE_FLOAT,                 /* converted (or shifted) to the output float type */
    PK_MODE_QUANT,                 /* fp32 -> tern_quantize */
    PK_MODE_MLX,                   /* MLX packed words, scales, biases copied */
    PK_MODE_SYNTH,                 /* drawn by src/synth (tern synth) */
};

typedef struct pk_item {
    pk_mat src;
    int mode;                      /* enum pk_mode */
} pk_item;

enum { PK_MAX_SIDECARS = 8 };

typedef struct pk_plan {
    tern_manifest man;             /* everything but `files` (filled as files are written) */
    pk_item *items;                /* [man.n_tensors], in man.tensors order */
    int n_expert_files;            /* decoder layers, + 1 with an MTP layer */
    pk_item *experts;              /* [n_expert_files][n_experts][3] */
    uint64_t resident_size;
    /* every output file in writing order: resident.bin, expert files, sidecars */
    char **out_paths;
    uint64_t *out_sizes;
    int n_out;
    int first_sidecar;             /* index in out_paths */
    uint64_t out_bytes;
} pk_plan;

int pk_plan_build(pk_plan *p, const pk_source *s, const tern_config *c, const pk_options *o, tern_error *err);
void pk_plan_free(pk_plan *p);

static inline const pk_item *pk_plan_expert(const pk_plan *p, int file, int e, int part) {
    return &p->experts[((int64_t)file * p->man.n_experts + e) * 3 + part];
}

/* Encodes rows [r0, r0 + n) of `it` into the output tensor `out`'s layout:
 * `data` receives the rows' bytes (float, or packed q), `scales`/`biases`
 * the rows' bf16 groups (quantized encodings only). `scratch` holds
 * n x cols floats. Rows of a small (non-matrix) tensor: it is one row. */
void pk_encode_rows(const pk_item *it, const tern_pk_tensor *out, int64_t r0, int64_t n, uint8_t *data,
                    uint16_t *scales, uint16_t *biases, float *scratch);

/* Expert e of expert file `file` encoded into its blob (zeroed, stride
 * bytes): gate, up and down at the manifest's offsets. scratch holds
 * pk_blob_scratch_floats(p) floats. */
void pk_encode_blob(const pk_plan *p, int file, int e, uint8_t *blob, float *scratch);
size_t pk_blob_scratch_floats(const pk_plan *p);

/* Bytes of one output row and of one row's scales (0 for float). */
uint64_t pk_row_bytes(const tern_pk_tensor *out, int64_t cols);

#endif
