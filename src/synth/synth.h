/* Random-weight models at exact shapes (`tern synth`, `tern bench
 * --synth`): the named shapes, the config.json they get, and the value of
 * every weight as a pure function of (seed, tensor name, row), so any row
 * can be produced on any thread in any order and the output is
 * byte-reproducible.
 *
 * The distributions (docs/experiments/synth-bench.md has the
 * measured effect):
 *
 *   "uniform" routing (the pessimistic mode): every matrix N(0, 1/fan_in)
 *   (an Irwin-Hall(4) approximation: bounded, so activations stay finite),
 *   residual-branch outputs (o_proj, out_proj, expert and shared down_proj)
 *   scaled by 1/sqrt(2 x layers), RMSNorm weights 0 (the (1 + w) norms
 *   multiply by 1), the DeltaNet's A_log, dt_bias and conv as Hugging Face
 *   initialises them. A random router sends tokens almost uniformly.
 *
 *   "prose" routing: the same shapes, with the hidden state split into a
 *   constant bias band (dims [0, B)), a token band (the embedding's random
 *   part) and a context band that every DeltaNet layer writes an
 *   exponential moving average of its recent tokens into (its q and k are
 *   constant, so the delta rule reduces to m_t = rho m_{t-1} + (1 - rho)
 *   v_t). Router row e of layer l reads the three bands so that its logit is
 *
 *       pop * P[l][e]  +  ctx * C_t[l][e]  +  tok * N_t[l][e]
 *
 *   with P fixed per expert (popularity), C an AR(1) process of lag-1
 *   correlation rho (topic), N fresh for every token, all unit variance.
 *   tools/synth/calibrate_routing.py fits (pop, ctx, rho) to the routing
 *   trace published for the real model (../shared/docs/seed-system.md §3a).
 *
 * Routed experts are drawn directly in the packed encoding: q uniform over
 * 0..levels, per group scale = sigma (0.75 + 0.5 u) / std(q), bias = -levels/2
 * x scale, so each weight is uniform on a symmetric interval of std ~sigma. */
#ifndef TERN_SYNTH_SYNTH_H
#define TERN_SYNTH_SYNTH_H

#include <stdint.h>
#include <stdio.h>

#include "model/config.h"
#include "tern.h"

typedef struct synth_shape {
    const char *name, *about;
    int hidden, layers, interval, vocab;
    int heads, kv_heads, head_dim;
    int gdn_k_heads, gdn_v_heads, gdn_k_dim, gdn_v_dim;
    int experts, top_k, moe_inter, shared_inter;
    int mtp;
} synth_shape;

enum synth_routing { SYNTH_ROUTING_UNIFORM, SYNTH_ROUTING_PROSE };

/* What a tensor is, which decides how its values are drawn. */
enum synth_role {
    SR_EMBED, SR_HEAD, SR_NORM1P, SR_GDN_NORM,
    SR_ATTN_QKV, SR_ATTN_O,
    SR_GDN_QKV, SR_GDN_Z, SR_GDN_B, SR_GDN_A, SR_GDN_OUT, SR_GDN_CONV, SR_GDN_DT, SR_GDN_ALOG,
    SR_ROUTER, SR_SHARED_GATE, SR_FFN_IN, SR_SHARED_DOWN, SR_EXPERT_DOWN, SR_MTP_FC,
};

typedef struct synth synth;

typedef struct synth_tensor {
    const synth *s;
    char *name;                  /* canonical Hugging Face name */
    int role;                    /* enum synth_role */
    int layer;                   /* decoder layer; n_layers for the MTP layer; -1 none */
    int ndim;
    int64_t shape[3];
    int f32;                     /* stored float32 (A_log, dt_bias) rather than bf16 */
    uint64_t key;                /* hash of (seed, name) */
} synth_tensor;

struct synth {
    synth_shape shape;
    uint64_t seed;
    int routing;                 /* enum synth_routing */
    double pop, ctx, rho;        /* prose routing parameters (tok is 1) */
    tern_config cfg;
    char *config_json;           /* the config.json text */
    synth_tensor *tensors;       /* every tensor, experts as fused [E, 2I, H] / [E, H, I] */
    int n_tensors;
    /* prose bands of the hidden state */
    int band_b, band_t, band_c;  /* [0, b), [b, t), [t, H) */
};

/* The named shapes; NULL-terminated by a zero entry. */
const synth_shape *synth_shapes(void);
const synth_shape *synth_shape_find(const char *name);

/* Builds the description of p's model (shape, config, tensor list). */
int synth_create(synth *s, const tern_synth_params *p, tern_error *err);
void synth_free(synth *s);

/* Rows [r0, r0 + n) of matrix `slice` of t (2-D tensors: slice 0; a 1-D or
 * 3-D small tensor is one row of all its values) as fp32, cols per row. */
void synth_rows_f32(const synth_tensor *t, int64_t slice, int64_t r0, int64_t n, int64_t cols, float *out);

/* 1 if t is drawn directly in a quantized encoding (routed experts). */
int synth_direct_q(const synth_tensor *t);
/* Direct draw of rows [r0, r0 + n) of `slice` (row0 added: the up half of a
 * fused gate_up) in affine `bits`/`group`: q packed as cpu/quant.h,
 * scales/biases bf16 [n, cols/group]. */
void synth_rows_q(const synth_tensor *t, int64_t slice, int64_t r0, int64_t n, int64_t cols, int bits, int group,
                  uint8_t *q, uint16_t *scales, uint16_t *biases);

/* The routing mode's name ("uniform", "prose") and its parser. */
const char *synth_routing_name(int routing);
int synth_routing_parse(const char *name, int *routing);

#endif
