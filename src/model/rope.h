/* RoPE scaling: YaRN's inverse frequencies and attention factor (as
 * transformers computes them), the overrides a load asks for, and the
 * context a model then reaches. */
#ifndef TERN_MODEL_ROPE_H
#define TERN_MODEL_ROPE_H

#include <stddef.h>

#include "model/config.h"

/* After rope_parameters are read (or changed): the attention factor when
 * config.json gives none, and the checks that need every field. label
 * names the source in errors. */
int tern_rope_finish(tern_config *c, const char *label, tern_error *err);

/* A load's rope_scaling, rope_factor and rope_context (tern.h) applied to
 * c; p may be NULL (config.json as it is). */
int tern_rope_apply(tern_config *c, const tern_load_params *p, tern_error *err);

/* inv_freq[rope_dim / 2]: 1 / theta^(2i / rope_dim), and with YaRN the
 * blend of that (extrapolation) and it / factor (interpolation) by a
 * linear ramp between the correction range's dims. Computed in double,
 * rounded once. */
void tern_rope_inv_freq(const tern_config *c, float *inv_freq);

/* The positions a session may hold (tern_model_max_context). */
int tern_cfg_max_context(const tern_config *c);
/* 0 if ctx positions fit; otherwise -1 and a line on how to reach further. */
int tern_cfg_check_context(const tern_config *c, int ctx, tern_error *err);
/* One line: "none" or "yarn, factor F over N native positions, ...". */
void tern_rope_describe(const tern_config *c, char *buf, size_t n);

#endif
