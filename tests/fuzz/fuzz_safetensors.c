/* fuzz_safetensors.c - fuzz target: the safetensors reader on arbitrary bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

int fuzz_one(const uint8_t *data, size_t size) {
  struct safetensors_file *f = safetensors_open_memory(data, size, "fuzz.safetensors");
  if (!f)
    return 0;
  /* Touch every accepted tensor's first and last byte and look each one up by name. */
  volatile uint64_t sink = 0;
  for (int i = 0; i < f->num_tensors; i++) {
    const struct safetensors_tensor *t = &f->tensors[i];
    if (t->nbytes)
      sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
    sink += safetensors_find(f, t->name) == t;
  }
  const char *m = safetensors_metadata(f, "format");
  if (m)
    sink += (uint8_t)m[0];
  (void)sink;
  safetensors_close(f);
  return 0;
}

/* Seeds: a valid file of three tensors (f32, f16, bf16) with metadata, like the library writes
 * (header padded with spaces to a multiple of 8), and one with an empty and a scalar tensor. */
static void add_image(void (*add)(const uint8_t *, size_t), const char *header, size_t ndata) {
  size_t hl = (strlen(header) + 7) / 8 * 8, size = 8 + hl + ndata;
  uint8_t *b = calloc(1, size);
  for (int i = 0; i < 8; i++)
    b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
  memset(b + 8, ' ', hl);
  memcpy(b + 8, header, strlen(header));
  for (size_t i = 0; i < ndata; i++)
    b[8 + hl + i] = (uint8_t)(i * 37 + 11);
  add(b, size);
  free(b);
}

void fuzz_seeds(void (*add)(const uint8_t *data, size_t size)) {
  add_image(add,
            "{\"__metadata__\":{\"format\":\"pt\"},"
            "\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
            "\"model.norm.weight\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[24,32]},"
            "\"lm_head.weight\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[32,40]}}",
            40);
  add_image(add,
            "{\"e\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[0,0]},"
            "\"s\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[0,2]}}",
            2);
}
