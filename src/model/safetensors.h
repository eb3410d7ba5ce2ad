/* safetensors.h - read-only, memory-mapped reader of safetensors files and sharded sets. */
#ifndef PAGODA_SAFETENSORS_H
#define PAGODA_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "util/dtype.h"
#include "util/file.h"

#define SAFETENSORS_MAX_DIMS 8
/* A header longer than this is refused before parsing (real headers are well under 10 MB). */
#define SAFETENSORS_MAX_HEADER (100u << 20)

struct safetensors_tensor {
  char *name;          /* owned */
  enum dtype dtype;    /* F32, F16 or BF16 (other dtypes are refused at open) */
  int num_dims;        /* 0 (a scalar) to SAFETENSORS_MAX_DIMS */
  int64_t shape[SAFETENSORS_MAX_DIMS]; /* (num_dims), outermost first as in torch */
  const void *data;    /* into the map, (nbytes) bytes; not necessarily aligned to the dtype
                          for files not written by the safetensors library */
  size_t nbytes;       /* product(shape) * element size == data_offsets span */
  const char *file;    /* the path of the file holding it (owned by the file) */
};

struct safetensors_file {
  struct mapped_file map;
  char *name;                          /* path or caller's name, for messages; owned */
  int num_tensors;
  struct safetensors_tensor *tensors;  /* (num_tensors), sorted by name, names unique */
  void *header;                        /* the parsed JSON header (cJSON), owned; read
                                          "__metadata__" through safetensors_metadata */
};

/* Opens and validates PATH: the header length, the JSON header, each tensor's dtype, shape and
 * data_offsets against the file (in range, span == shape * element size, no two overlapping).
 * Returns NULL with err_last() naming the file (and the tensor). Free with safetensors_close. */
struct safetensors_file *safetensors_open(const char *path);
/* Same over a caller-owned buffer that must outlive the result (tests and the fuzz target). */
struct safetensors_file *safetensors_open_memory(const void *data, size_t size, const char *name);
void safetensors_close(struct safetensors_file *f);

/* The tensor called NAME, or NULL. O(log n). */
const struct safetensors_tensor *safetensors_find(const struct safetensors_file *f,
                                                  const char *name);
/* A "__metadata__" string value, or NULL when absent. */
const char *safetensors_metadata(const struct safetensors_file *f, const char *key);

/* A model's weights: one model.safetensors, or the shards listed by
 * model.safetensors.index.json's weight_map. */
struct safetensors_set {
  int num_files;
  struct safetensors_file **files; /* (num_files), owned */
  int num_entries;
  struct safetensors_set_entry {
    const char *name;                       /* borrowed from the tensor */
    const struct safetensors_tensor *tensor;
  } *entries;                               /* (num_entries), sorted by name */
  char *index_path;                         /* the index file, or NULL when unsharded; owned */
};

/* Opens DIR/model.safetensors, or, when DIR/model.safetensors.index.json exists, every shard its
 * weight_map names (shard names must be plain file names inside DIR). Every mapped tensor must
 * be present in its shard. NULL with err_last() naming the file (and tensor) on any problem.
 * Free with safetensors_set_close. */
struct safetensors_set *safetensors_set_open(const char *dir);
void safetensors_set_close(struct safetensors_set *s);
const struct safetensors_tensor *safetensors_set_find(const struct safetensors_set *s,
                                                      const char *name);

#endif
