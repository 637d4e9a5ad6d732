/* Opening a packed model directory (docs/FORMAT.md): the resident tensors
 * become a tensor set the weights binder reads like a safetensors model;
 * routed experts stay in their files and are reached blob by blob. */
#ifndef TERN_MODEL_PACKED_H
#define TERN_MODEL_PACKED_H

#include "model/config.h"
#include "model/manifest.h"
#include "model/tensors.h"
#include "model/weights.h"

/* 1 if dir holds a packed model (a manifest.json). */
int tern_is_packed_dir(const char *dir);

/* Maps resident.bin and fills ts with a tensor for every manifest entry
 * (ts->experts_external set). The manifest must already be read and checked. */
int tern_packed_open(tern_tensor_set *ts, const tern_manifest *man, const char *dir, tern_error *err);

/* The same over resident bytes already in memory: base (an mmap of size
 * bytes) becomes the set's mapping, unmapped by tern_tensors_close. */
int tern_packed_open_mem(tern_tensor_set *ts, const tern_manifest *man, void *base, size_t size, tern_error *err);

/* The manifest against the config it was packed from (dir's config.json):
 * the arch summary, the expert file count and the expert part shapes
 * ([I, H], [I, H], [H, I]). Every size the loader derives from the
 * manifest follows from these and the checks of tern_manifest_read; label
 * names the manifest in messages. */
int tern_packed_check_config(const tern_manifest *man, const tern_config *c, const char *label, tern_error *err);

/* Views of one expert's gate/up/down inside its blob. */
void tern_packed_expert_view(const tern_manifest *man, const uint8_t *blob, tern_expert_w *out);

/* Bytes of routed-expert blobs: per layer file, and over all files. */
uint64_t tern_packed_expert_bytes(const tern_manifest *man);

#endif
