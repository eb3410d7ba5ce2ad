/* gguf.h - read-only, memory-mapped parser of GGUF v2/v3 files (metadata and tensor infos). */
#ifndef PAGODA_GGUF_H
#define PAGODA_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "util/dtype.h"
#include "util/file.h"

enum gguf_type {
  GGUF_TYPE_UINT8 = 0,
  GGUF_TYPE_INT8 = 1,
  GGUF_TYPE_UINT16 = 2,
  GGUF_TYPE_INT16 = 3,
  GGUF_TYPE_UINT32 = 4,
  GGUF_TYPE_INT32 = 5,
  GGUF_TYPE_FLOAT32 = 6,
  GGUF_TYPE_BOOL = 7,
  GGUF_TYPE_STRING = 8,
  GGUF_TYPE_ARRAY = 9,
  GGUF_TYPE_UINT64 = 10,
  GGUF_TYPE_INT64 = 11,
  GGUF_TYPE_FLOAT64 = 12,
  GGUF_TYPE_COUNT
};

/* ggml tensor type ids that pagoda reads. */
enum gguf_ggml_type {
  GGUF_GGML_F32 = 0,
  GGUF_GGML_F16 = 1,
  GGUF_GGML_Q8_0 = 8,
  GGUF_GGML_BF16 = 30,
};

struct gguf_kv {
  char *key;                 /* owned, NUL-terminated */
  enum gguf_type type;
  const uint8_t *value;      /* scalar: points at the value in the map; string: at its bytes */
  uint64_t len;              /* string: byte length; array: element count */
  enum gguf_type elem_type;  /* arrays only */
  uint64_t *str_offsets;     /* arrays of strings only: (len) offsets of each string's bytes
                                from the start of the map; owned */
  uint64_t *str_lens;        /* arrays of strings only: (len) byte lengths; owned */
};

struct gguf_tensor {
  char *name;                /* owned */
  int num_dims;
  int64_t ne[4];             /* ne[0] is the innermost (contiguous) dimension, as in ggml */
  uint32_t ggml_type;
  int dtype;                 /* enum dtype, or -1 when pagoda cannot read the type */
  const void *data;          /* into the map; (nbytes) bytes */
  size_t nbytes;
};

struct gguf_file {
  struct mapped_file map;
  uint32_t version;
  uint32_t alignment;
  int64_t num_kv;
  struct gguf_kv *kv;        /* (num_kv) */
  int64_t num_tensors;
  struct gguf_tensor *tensors; /* (num_tensors) */
};

/* Opens and validates PATH: every offset, count and size is checked against the file, so a
 * truncated or malformed file is an error naming the file (and tensor), never a crash.
 * Returns NULL with err_last() set. Free with gguf_close. */
struct gguf_file *gguf_open(const char *path);
/* Same over a caller-owned buffer that must outlive the result (used by the fuzz target). */
struct gguf_file *gguf_open_memory(const void *data, size_t size, const char *name);
void gguf_close(struct gguf_file *g);

/* Metadata lookups: NULL / -1 when the key is absent or of an incompatible type. */
const struct gguf_kv *gguf_find(const struct gguf_file *g, const char *key);
/* Any integer or bool type; floats are refused. */
int gguf_get_int(const struct gguf_file *g, const char *key, int64_t *out);
/* Any float or integer type. */
int gguf_get_float(const struct gguf_file *g, const char *key, double *out);
/* Pointer into the map (not NUL-terminated) and its length. */
const char *gguf_get_str(const struct gguf_file *g, const char *key, size_t *len);
/* Array element I as a string / integer / float (bounds- and type-checked). */
const char *gguf_arr_str(const struct gguf_file *g, const struct gguf_kv *kv, uint64_t i,
                         size_t *len);
int gguf_arr_int(const struct gguf_kv *kv, uint64_t i, int64_t *out);
int gguf_arr_float(const struct gguf_kv *kv, uint64_t i, double *out);

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *g, const char *name);

#endif
