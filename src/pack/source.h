/* The checkpoint `tern pack` reads: a Hugging Face directory (one
 * model.safetensors or an index + shards) in bf16/f16/f32, an MLX
 * affine-quantized one, or an FP8 block-quantized one. The shards are read
 * by the loader's own parser (model/tensors.h: the same offset, alignment
 * and index checks `tern run` applies); this reader then validates every
 * tensor name and maps each name to its canonical Hugging Face form:
 *
 *   model.language_model.X        kept
 *   model.X, language_model.model.X   -> model.language_model.X  (X = layers.*, embed_tokens.*, norm.*)
 *   language_model.lm_head.X      -> lm_head.X
 *   language_model.mtp.X          -> mtp.X
 *   lm_head.*, mtp.*              kept
 *   anything else (vision, audio) dropped
 *
 * A matrix is then read through a pk_mat view, whatever its storage. */
#ifndef TERN_PACK_SOURCE_H
#define TERN_PACK_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "model/tensors.h"
#include "tern.h"

enum pk_dtype { PK_F32, PK_F16, PK_BF16, PK_U32, PK_F8E4M3, PK_OTHER };

typedef struct pk_raw {
    char *name;                  /* canonical */
    char *src_name;              /* as stored */
    int dtype;                   /* enum pk_dtype */
    char dtype_name[16];
    int ndim;
    int64_t shape[8];
    int64_t numel;
    const uint8_t *data;
    uint64_t nbytes;
    const char *file;
    int used;                    /* consumed by the plan */
    const struct synth_tensor *synth;   /* a synthetic tensor: values drawn, not read (data NULL) */
} pk_raw;

typedef struct pk_source {
    char *dir;                   /* real path */
    tern_tensor_set ts;          /* the shards, read and checked by the loader's parser */
    pk_raw *raw;                 /* sorted by canonical name */
    int n_raw, cap_raw;
    int n_dropped;               /* vision/audio tensors left out */
    int mlx;                     /* MLX layout: language_model.* names, norms stored as 1 + w */
    int mlx_bits, mlx_group;     /* config.json "quantization" defaults (0 = none) */
    void *mlx_quant;             /* json_t * of that object, for per-module overrides */
    int fp8_block[2];            /* weight_block_size, default 128 x 128 */
    int has_index;
    char index_sha256[65];
    uint64_t total_bytes;        /* of all shards */
    struct synth *synth;         /* a synthetic source (tern synth); owned */
} pk_source;

int pk_source_open(pk_source *s, const char *dir, tern_error *err);
/* A synthetic source: every tensor of p's shape, values drawn by
 * src/synth; config.json is the only sidecar. */
struct tern_synth_params;
int pk_source_synth(pk_source *s, const struct tern_synth_params *p, tern_error *err);
void pk_source_close(pk_source *s);
pk_raw *pk_source_get(const pk_source *s, const char *canonical);

/* 0 if a tensor name may be used (no '..' path component, not absolute,
 * no control character or backslash); otherwise an error naming it. */
int pk_check_tensor_name(const char *name, const char *file, tern_error *err);

/* How a logical 2-D matrix is stored in the source. */
enum pk_storage { PK_STORE_FLOAT, PK_STORE_MLX, PK_STORE_FP8, PK_STORE_SYNTH };

typedef struct pk_mat {
    int storage;                 /* enum pk_storage */
    const pk_raw *w;             /* values (float), U32 words (MLX) or F8 (FP8) */
    const pk_raw *scales, *biases;   /* MLX scales/biases; FP8: scales = weight_scale_inv */
    int64_t slice;               /* leading index of a stacked [E, ...] tensor; 0 for 2-D */
    int64_t row0;                /* first row inside the slice (the up half of a fused gate_up) */
    int64_t rows, cols;          /* logical */
    int bits, group;             /* MLX */
    int block[2];                /* FP8: rows x cols of one weight_scale_inv block */
    float add;                   /* added to every value (-1 undoes MLX's 1 + w norms) */
} pk_mat;

/* Rows [r, r + n) as fp32 into out (n * cols values). */
void pk_mat_read_f32(const pk_mat *m, int64_t r, int64_t n, float *out);
/* Float storage: the source dtype (PK_F32/F16/BF16) and a pointer to row r. */
const uint8_t *pk_mat_float_row(const pk_mat *m, int64_t r);
/* MLX storage: pointers to row r's packed words and its scales/biases. */
const uint8_t *pk_mat_q_row(const pk_mat *m, int64_t r);
const uint8_t *pk_mat_sb_row(const pk_mat *m, const pk_raw *sb, int64_t r);

/* Size of one element of a source dtype (U32: 4, F8: 1). */
size_t pk_dtype_size(int dtype);

/* bits/group of an MLX-quantized weight `wname` (the stored name), from
 * the shapes and config.json's "quantization" (per-module override, then
 * defaults); checks they agree. */
int pk_mlx_params(const pk_source *s, const pk_raw *w, const pk_raw *scales, int *bits, int *group,
                  tern_error *err);

float pk_f8e4m3_to_f32(uint8_t v);

#endif
