/* Helpers shared by the test files: fixture paths, reference tensors, a
 * minimal safetensors writer for malformed-input cases, temp dirs. */
#ifndef TERN_TESTUTIL_H
#define TERN_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "model/safetensors.h"

/* tests/fixtures/<name> (or $TERN_FIXTURES/<name>). */
const char *fixture_dir(const char *name);

/* The reference outputs of a fixture (reference.safetensors), widened to
 * fp32 / int32 copies. */
typedef struct {
    tern_st_file file;
} reference;

int reference_open(reference *r, const char *fixture);
void reference_close(reference *r);
/* NULL if absent; n gets the element count, shape the dims. */
const tern_tensor *reference_get(reference *r, const char *name);

/* max |a - b| / max |b| over n values */
double rel_err(const float *a, const float *b, size_t n);

/* A fresh temporary directory (removed by rm_rf). */
char *make_temp_dir(void);
/* dir/name in one of 8 rotating per-thread buffers (valid for the next 7 calls). */
const char *dir_path(const char *dir, const char *name);
void rm_rf(const char *dir);
int copy_file(const char *from, const char *to);
int write_text(const char *path, const char *text);

/* Writes a safetensors file whose header is `header_json` verbatim (padded
 * to 8 bytes) followed by `data_len` bytes of data. */
int write_raw_safetensors(const char *path, const char *header_json, const void *data, size_t data_len);



/* Copies fixture `src`'s configs into dst_dir and writes its single
 * model.safetensors again, leaving out tensor `drop` (may be NULL) and giving
 * tensor `transpose` (may be NULL; 2-D) its dims swapped (same bytes). */
int write_model_variant(const char *src, const char *dst_dir, const char *drop, const char *transpose);
/* The tern binary the CLI tests run ($TERN_BIN, else build/tern). */
const char *tern_bin(void);
/* Runs a shell command line; returns its output (malloc'd), exit code in *rc. */
char *run_sh(const char *cmd, int *rc);

#endif
