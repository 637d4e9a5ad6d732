/* tern: an inference engine for Qwen 3.6 35B-A3B (Hugging Face model_type
 * `qwen3_5_moe`) and the Qwen3.5-MoE models that share its architecture.
 *
 * The whole public API is this header. A model is loaded once; a session
 * holds one sequence's state (KV cache of the full-attention layers, conv and
 * recurrent state of the Gated DeltaNet layers) and is fed tokens:
 *
 *     tern_error err;
 *     tern_model *m = tern_model_load("models/x", NULL, &err);
 *     tern_session *s = tern_session_create(m, NULL, &err);
 *     float *logits = malloc(tern_model_vocab_size(m) * sizeof(float));
 *     tern_session_eval(s, prompt, n_prompt, logits, 0, &err);  // prefill
 *     int32_t next = argmax(logits);
 *     tern_session_eval(s, &next, 1, logits, 0, &err);           // decode
 *
 * Every call that can fail takes a tern_error and on failure writes a single
 * line into err->msg and returns -1 (or NULL).
 */
#ifndef TERN_H
#define TERN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tern_error {
    char msg[512];
} tern_error;

typedef struct tern_model tern_model;
typedef struct tern_session tern_session;
typedef struct tern_snapshot tern_snapshot;

/* ---- model -------------------------------------------------------------- */

typedef struct tern_load_params {
    int n_threads;   /* threads for the large matrix products; 0 = all cores */
} tern_load_params;

/* Loads a Hugging Face model directory (config.json, generation_config.json,
 * model.safetensors or model.safetensors.index.json + shards). Tensor data is
 * memory-mapped. params may be NULL. */
tern_model *tern_model_load(const char *dir, const tern_load_params *params,
                            tern_error *err);
void tern_model_free(tern_model *m);

int tern_model_vocab_size(const tern_model *m);   /* rows of the lm_head */
int tern_model_has_mtp(const tern_model *m);
int tern_model_n_threads(const tern_model *m);
/* 1 if id ends generation (generation_config.json's eos_token_id list). */
int tern_model_is_eos(const tern_model *m, int32_t id);

/* Prints what `tern info` shows for a model directory: architecture, tensor
 * inventory, parameter counts (total and active per token) and bytes per token
 * in the stored dtype. Works from config.json alone when no tensors exist (and
 * says so). */
int tern_model_describe(const char *dir, FILE *out, tern_error *err);

/* ---- session ------------------------------------------------------------ */

enum tern_gdn_mode {
    TERN_GDN_CHUNKED = 0,    /* prefill in chunks of 64 (default) */
    TERN_GDN_RECURRENT = 1,  /* token-by-token recurrence everywhere */
};

typedef struct tern_session_params {
    int max_context;         /* 0 = the model's max_position_embeddings */
    int gdn_mode;            /* enum tern_gdn_mode */
} tern_session_params;

tern_session *tern_session_create(tern_model *m, const tern_session_params *p,
                                  tern_error *err);
void tern_session_destroy(tern_session *s);

/* Appends n tokens to the sequence (n > 1: prefill; n == 1: decode).
 * logits: if all_logits, n * vocab floats (one row per token); otherwise
 * vocab floats for the last token. May be NULL. */
int tern_session_eval(tern_session *s, const int32_t *tokens, int n,
                      float *logits, int all_logits, tern_error *err);

/* Number of tokens the session holds. */
int tern_session_pos(const tern_session *s);

/* Draft logits of the MTP head for the token after `next_token`, where
 * next_token is the token that follows the last one evaluated (the pair is
 * (hidden state of the last token, next_token)). Advances the MTP head's own
 * cache by one position. Fails if the model has no MTP weights. */
int tern_session_mtp_draft(tern_session *s, int32_t next_token, float *logits,
                           tern_error *err);

/* Exact copy of the session state (KV rows, GDN conv + recurrent state, MTP
 * cache, last hidden state); restore brings a session of the same model back
 * to it bit for bit. */
tern_snapshot *tern_session_snapshot(const tern_session *s, tern_error *err);
int tern_session_restore(tern_session *s, const tern_snapshot *snap,
                         tern_error *err);
void tern_snapshot_free(tern_snapshot *snap);
size_t tern_snapshot_bytes(const tern_snapshot *snap);

#ifdef __cplusplus
}
#endif
#endif
