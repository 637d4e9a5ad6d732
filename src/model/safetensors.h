/* Safetensors files: an 8-byte little-endian header length N, N bytes of
 * JSON ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__":
 * {...}}), then the raw tensor bytes. The file is mmapped read-only; every
 * offset and size in the header is checked against the file before a tensor
 * points into it, with the rules of the reference `safetensors` reader: the
 * tensors tile the data exactly (no overlap, no gap, nothing after the
 * last), and each is aligned to its element size. Both the loader and
 * `tern pack` read sources through this parser. */
#ifndef TERN_MODEL_SAFETENSORS_H
#define TERN_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "tern.h"

enum tern_dtype {
    TERN_DTYPE_F32,
    TERN_DTYPE_F16,
    TERN_DTYPE_BF16,
    TERN_DTYPE_F64,
    TERN_DTYPE_I64,
    TERN_DTYPE_I32,
    TERN_DTYPE_I16,
    TERN_DTYPE_I8,
    TERN_DTYPE_U8,
    TERN_DTYPE_BOOL,
    TERN_DTYPE_F8_E4M3,
    TERN_DTYPE_F8_E5M2,
    TERN_DTYPE_U16,            /* the unsigned ones carry MLX's packed words */
    TERN_DTYPE_U32,
    TERN_DTYPE_U64,
    TERN_DTYPE_COUNT
};

const char *tern_dtype_name(int dtype);
size_t tern_dtype_size(int dtype);

#define TERN_MAX_DIMS 8

typedef struct tern_tensor {
    char *name;
    int dtype;
    int ndim;
    int64_t shape[TERN_MAX_DIMS];
    int64_t numel;
    const void *data;          /* points into the file's mapping */
    uint64_t nbytes;
    const char *file;          /* path of the file that holds it */
    /* Packed models only (docs/FORMAT.md): bits 4/8 = affine-quantized with
     * bf16 scales/biases [rows, cols/group]; data is then the packed q. */
    int bits, group;
    const uint16_t *scales, *biases;
} tern_tensor;

typedef struct tern_st_file {
    char *path;
    void *map;
    size_t size;
    tern_tensor *tensors;
    int n_tensors;
} tern_st_file;

/* Opens, maps and validates one file. On failure f is left empty (safe to
 * close) and err names the file and the tensor/field at fault. */
int tern_st_open(tern_st_file *f, const char *path, tern_error *err);
void tern_st_close(tern_st_file *f);

#endif
