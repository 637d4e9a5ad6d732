/* manifest.json of a packed model directory (docs/FORMAT.md): where every
 * tensor lives in resident.bin, the routed-expert blob layout, and every
 * file's size and SHA-256. */
#ifndef TERN_MODEL_MANIFEST_H
#define TERN_MODEL_MANIFEST_H

#include <stdint.h>

#include "tern.h"

#define TERN_FORMAT_NAME "tern-packed"
#define TERN_FORMAT_VERSION 1

enum tern_encoding { TERN_ENC_F32, TERN_ENC_F16, TERN_ENC_BF16, TERN_ENC_Q4, TERN_ENC_Q8 };

/* Quantization classes (docs/FORMAT.md), in manifest order. */
enum tern_qclass {
    TERN_QC_EMBED, TERN_QC_ATTN, TERN_QC_ROUTER, TERN_QC_SHARED, TERN_QC_EXPERTS, TERN_QC_HEAD,
    TERN_QC_MTP_FC, TERN_QC_COUNT
};

typedef struct tern_range {
    uint64_t off, size;          /* bytes; size 0 = absent */
} tern_range;

typedef struct tern_pk_tensor {
    char *name;
    int ndim;
    int64_t shape[4];
    int encoding;                /* enum tern_encoding */
    int group;                   /* quantized encodings only */
    tern_range data, scales, biases;
} tern_pk_tensor;

/* The architecture summary of manifest.json's "arch" (informational: the
 * engine reads config.json). */
typedef struct tern_pk_arch {
    char model_type[64];
    int hidden, n_layers, n_experts, top_k, expert_inter, vocab;
    int mtp;                     /* 1 if the routed experts of an MTP layer are packed */
} tern_pk_arch;

typedef struct tern_pk_file {
    char *path;                  /* relative to the model directory */
    uint64_t size;
    char sha256[65];             /* lowercase hex */
} tern_pk_file;

typedef struct tern_manifest {
    int version;
    char *source_path;
    struct { int bits, group; } quant[TERN_QC_COUNT];   /* bits 16 = kept as float */
    tern_pk_tensor *tensors;
    int n_tensors;
    int n_experts;               /* blobs per expert file */
    uint64_t stride;             /* bytes per blob, multiple of 4096 */
    char **layer_files;          /* [n_layer_files], relative paths */
    int n_layer_files;
    char *mtp_file;              /* NULL when there is no MTP layer */
    tern_pk_tensor parts[3];     /* gate, up, down; offsets inside a blob */
    tern_pk_file *files;
    int n_files;
    char manifest_sha256[65];    /* of the bytes read (set by tern_manifest_read) */
    char *source_index_sha256;   /* of SRC/model.safetensors.index.json; NULL when there was none */
    tern_pk_arch arch;
} tern_manifest;

/* Reads and validates dir/manifest.json: format and version, encodings,
 * range sizes against shapes, overlaps, relative normalised paths. */
int tern_manifest_read(tern_manifest *m, const char *dir, tern_error *err);
/* Writes JSON (sorted keys, stable) to path and fsyncs it; the path is
 * opened with O_NOFOLLOW. Atomic replacement is the caller's rename. */
int tern_manifest_write(const tern_manifest *m, const char *path, tern_error *err);
/* The same JSON text (malloc'd, no trailing newline). */
char *tern_manifest_dumps(const tern_manifest *m, tern_error *err);
void tern_manifest_free(tern_manifest *m);

const tern_pk_tensor *tern_manifest_tensor(const tern_manifest *m, const char *name);
const tern_pk_file *tern_manifest_file(const tern_manifest *m, const char *path);

/* "f32", "f16", "bf16", "q4", "q8"; -1 / NULL when unknown. */
const char *tern_encoding_name(int encoding);
int tern_encoding_from_name(const char *name);
/* "embed", "attn", ... (the keys of manifest.json's "quant"). */
const char *tern_qclass_name(int qclass);

/* The bytes a tensor's data and each of its scales/biases must span for
 * its shape and encoding (scales 0 for float encodings); -1 when the shape
 * cannot hold that encoding (row length not a multiple of the group). */
int tern_pk_tensor_bytes(const tern_pk_tensor *t, uint64_t *data, uint64_t *scales);

/* 1 if path is a relative, normalised path inside a model directory: no
 * empty, "." or ".." component, no leading '/', no backslash or control
 * character. */
int tern_manifest_path_ok(const char *path);

#endif
