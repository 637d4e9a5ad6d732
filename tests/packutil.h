/* Helpers of the pack/manifest tests: a synthetic Hugging Face checkpoint
 * written in C (for the kill/resume and bad-name cases), the values of a
 * packed tensor, and the full comparison of a packed directory with its
 * source within the quantization bound. */
#ifndef TERN_TESTS_PACKUTIL_H
#define TERN_TESTS_PACKUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "model/manifest.h"

typedef struct synth_spec {
    int hidden, layers, experts, inter, shared_inter, vocab;
    int heads, kv_heads, head_dim;
    int mtp;                     /* 1: an MTP layer (fused experts) */
    int per_expert;              /* 1: experts.{e}.*_proj.weight instead of fused 3-D tensors */
    const char *extra_name;      /* an extra [4, 64] bf16 tensor with exactly this name */
    uint32_t seed;
} synth_spec;

/* A small but well-formed spec; callers scale it up. */
synth_spec synth_default(void);
/* Writes dir/config.json (flat qwen3_5_moe_text) and dir/model.safetensors
 * (bf16, random). Returns the bytes of model.safetensors, 0 on failure. */
uint64_t synth_model(const char *dir, const synth_spec *s);

/* Every value of a packed tensor as fp32 (numel values, malloc'd). */
float *packed_values(const tern_pk_tensor *t, const uint8_t *base);

/* Reads a whole file (malloc'd); NULL on failure. */
uint8_t *read_all(const char *path, size_t *size);
/* XORs one byte of a file in place. */
int flip_byte(const char *path, uint64_t off);

/* Asserts (Criterion) that the packed dst matches src: manifest valid,
 * every resident tensor and every expert blob within the quantization
 * bound of the source values (float encodings exact), 64-byte alignment,
 * file sizes. `norm_add` is added to the source's norm weights before the
 * comparison (-1 for MLX sources). Returns the number of values checked. */
uint64_t check_pack(const char *src, const char *dst);

/* Max |w - deq| allowed for one group: half a step, the bias rounding,
 * and the top of the range the bf16-rounded scale may fall short of. */
double quant_bound(const float *w, int n, float scale, float bias, int bits);

#endif
