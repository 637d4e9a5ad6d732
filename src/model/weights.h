/* The model's weights as views into the mapped safetensors: big matrices stay
 * in their stored dtype (bf16/f16/f32) and are widened to fp32 row by row in
 * the matrix kernels; small vectors (norms, conv, A_log, dt_bias) are copied
 * to fp32 arrays at load. Routed experts are views whatever the checkpoint
 * layout: fused 3D (gate_up_proj [E, 2I, H], down_proj [E, H, I]) or one 2D
 * tensor per expert. */
#ifndef TERN_MODEL_WEIGHTS_H
#define TERN_MODEL_WEIGHTS_H

#include <stdint.h>

#include "model/config.h"

#include "model/tensors.h"

/* A row-major matrix [rows, cols]: y = x @ W^T multiplies by rows.
 * bits == 0: `data` holds dtype elements (F32/F16/BF16).
 * bits == 4 or 8: affine-quantized (cpu/quant.h): `data` is the packed q,
 * `scales`/`biases` bf16 [rows, cols / group]. */
typedef struct tern_mat {
    const void *data;
    int dtype;
    int64_t rows, cols;
    int bits, group;
    const uint16_t *scales, *biases;
} tern_mat;

typedef struct tern_expert_w {
    tern_mat gate, up, down;      /* [I, H], [I, H], [H, I] */
} tern_expert_w;

typedef struct tern_moe_w {
    tern_mat router;              /* [E, H] */
    tern_expert_w *experts;       /* E views; NULL when the experts stream */
    int stream_index;             /* expert file of this layer (streamed models) */
    tern_expert_w shared;         /* intermediate = shared_inter */
    tern_mat shared_gate;         /* [1, H] */
} tern_moe_w;

typedef struct tern_attn_w {
    tern_mat q;                   /* [n_heads * 2 * head_dim, H]: per head [query | gate] rows */
    tern_mat k, v;                /* [n_kv * head_dim, H] */
    tern_mat o;                   /* [H, n_heads * head_dim] */
    float *q_norm, *k_norm;       /* [head_dim], (1 + w) */
} tern_attn_w;

typedef struct tern_gdn_w {
    tern_mat qkv;                 /* [conv_dim, H]: q | k | v channels */
    tern_mat z;                   /* [value_dim, H] */
    tern_mat b, a;                /* [v_heads, H] */
    tern_mat out;                 /* [H, value_dim] */
    float *conv;                  /* [conv_dim, kernel] */
    float *dt_bias, *A_log;       /* [v_heads] */
    float *norm;                  /* [v_dim], plain weight (not 1 + w) */
} tern_gdn_w;

typedef struct tern_layer_w {
    int kind;                     /* enum tern_layer_kind */
    float *in_norm, *post_norm;   /* [H], (1 + w) */
    tern_attn_w attn;
    tern_gdn_w gdn;
    tern_moe_w moe;
} tern_layer_w;

typedef struct tern_mtp_w {
    tern_mat fc;                  /* [H, 2H]: embedding half first */
    float *pre_emb_norm, *pre_hidden_norm, *norm;
    tern_layer_w layer;           /* a full-attention layer */
} tern_mtp_w;

typedef struct tern_weights {
    tern_mat embed, lm_head;      /* [vocab, H] */
    float *final_norm;
    tern_layer_w *layers;
    int has_mtp;
    tern_mtp_w mtp;
    char prefix[64];              /* "model.language_model." or "model." */
} tern_weights;

/* Binds every tensor the config calls for, checking shapes. MTP tensors are
 * bound when present. */
int tern_weights_bind(tern_weights *w, const tern_config *c, const tern_tensor_set *ts, tern_error *err);
void tern_weights_free(tern_weights *w, const tern_config *c);

#endif
