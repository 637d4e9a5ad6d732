/* The text model's hyper-parameters, from config.json: either the published
 * nested form (model_type "qwen3_5_moe" with a "text_config" object) or the
 * flat text form (model_type "qwen3_5_moe_text"). */
#ifndef TERN_MODEL_CONFIG_H
#define TERN_MODEL_CONFIG_H

#include <stddef.h>

#include "tern.h"

enum tern_layer_kind { TERN_LAYER_GDN = 0, TERN_LAYER_ATTN = 1 };

/* RoPE scaling, as transformers' _compute_yarn_parameters reads
 * rope_parameters (modeling_rope_utils.py). */
typedef struct tern_rope_cfg {
    int type;                     /* TERN_ROPE_NONE or TERN_ROPE_YARN (enum tern_rope_scaling) */
    int config_type;              /* what config.json itself says */
    int native;                   /* the trained context: original_max_position_embeddings */
    double factor;                /* how far YaRN stretches it */
    double beta_fast, beta_slow;  /* rotations bounding the blend's ramp (32, 1) */
    double attn_factor;           /* cos and sin are scaled by it: 1 without YaRN */
    int attn_given;               /* attention_factor set in config.json, else from factor and mscale */
    double mscale, mscale_all_dim;/* 0: absent */
    int truncate;                 /* the ramp's ends rounded outwards to whole dims (default) */
} tern_rope_cfg;

#define TERN_MAX_LAYERS 256
#define TERN_MAX_EOS 8

typedef struct tern_config {
    char model_type[64];          /* as written at the top level */
    int hidden;                   /* hidden_size */
    int n_layers;
    unsigned char layer_kind[TERN_MAX_LAYERS];
    int vocab;                    /* rows of embed_tokens / lm_head */
    float norm_eps;               /* rms_norm_eps, every RMSNorm */
    int max_pos;
    int tie_embeddings;

    /* gated full attention */
    int n_heads, n_kv_heads, head_dim;
    int rope_dim;                 /* rotated dims per head = head_dim * partial_rotary_factor */
    double rope_theta;
    tern_rope_cfg rope;           /* the scaling (model/rope.h) */

    /* Gated DeltaNet */
    int gdn_k_heads, gdn_v_heads, gdn_k_dim, gdn_v_dim, gdn_conv_kernel;

    /* MoE */
    int n_experts, top_k, expert_inter, shared_inter;
    int norm_topk;                /* renormalise the top-k weights (always 1 for this family) */

    int mtp_layers;               /* mtp_num_hidden_layers (0 or 1) */
    char dtype[16];               /* "bfloat16" ... as declared */

    int n_eos;                    /* from generation_config.json, else config */
    int eos[TERN_MAX_EOS];
} tern_config;

/* Reads dir/config.json (and dir/generation_config.json if present). */
int tern_config_load(tern_config *c, const char *dir, tern_error *err);
/* The same from config.json's text (no generation_config.json); label
 * names it in errors. */
int tern_config_parse(tern_config *c, const char *text, const char *label, tern_error *err);

/* Derived sizes. */
static inline int tern_cfg_gdn_key_dim(const tern_config *c) { return c->gdn_k_heads * c->gdn_k_dim; }
static inline int tern_cfg_gdn_value_dim(const tern_config *c) { return c->gdn_v_heads * c->gdn_v_dim; }
static inline int tern_cfg_gdn_conv_dim(const tern_config *c) {
    return 2 * tern_cfg_gdn_key_dim(c) + tern_cfg_gdn_value_dim(c);
}
/* A DeltaNet layer's sequence state: the conv window ([kernel - 1,
 * conv_dim]) and the recurrent state S ([v_heads, k_dim, v_dim]), in floats. */
static inline size_t tern_cfg_gdn_conv_floats(const tern_config *c) {
    return (size_t)(c->gdn_conv_kernel - 1) * (size_t)tern_cfg_gdn_conv_dim(c);
}
static inline size_t tern_cfg_gdn_state_floats(const tern_config *c) {
    return (size_t)c->gdn_v_heads * (size_t)c->gdn_k_dim * (size_t)c->gdn_v_dim;
}

#endif
