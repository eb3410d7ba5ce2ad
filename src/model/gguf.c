/* gguf.c - GGUF v2/v3 parser: a bounds-checked cursor over the mapped bytes. */
#include "model/gguf.h"

#include <stdlib.h>
#include <string.h>

#include "util/log.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_MAX_DIMS 4

struct cursor {
  const uint8_t *base;
  size_t size, pos;
  const char *name;
  int failed;
};

static int take(struct cursor *c, void *dst, size_t n) {
  if (c->failed || n > c->size - c->pos) {
    if (!c->failed)
      ERR("%s: truncated GGUF file (need %zu bytes at offset %zu, size %zu)", c->name, n, c->pos,
          c->size);
    c->failed = 1;
    return -1;
  }
  if (dst)
    memcpy(dst, c->base + c->pos, n);
  c->pos += n;
  return 0;
}

static uint32_t rd_u32(struct cursor *c) {
  uint32_t v = 0;
  take(c, &v, 4);
  return v;
}

static uint64_t rd_u64(struct cursor *c) {
  uint64_t v = 0;
  take(c, &v, 8);
  return v;
}

/* A string: u64 length then bytes. Returns the offset of the bytes; *len the length. */
static size_t rd_str(struct cursor *c, uint64_t *len) {
  *len = rd_u64(c);
  size_t at = c->pos;
  if (!c->failed && *len > c->size - c->pos) {
    ERR("%s: string of %llu bytes at offset %zu runs past the end of the file", c->name,
        (unsigned long long)*len, c->pos);
    c->failed = 1;
    return 0;
  }
  take(c, NULL, (size_t)*len);
  return at;
}

static size_t scalar_size(enum gguf_type t) {
  switch (t) {
  case GGUF_TYPE_UINT8:
  case GGUF_TYPE_INT8:
  case GGUF_TYPE_BOOL:
    return 1;
  case GGUF_TYPE_UINT16:
  case GGUF_TYPE_INT16:
    return 2;
  case GGUF_TYPE_UINT32:
  case GGUF_TYPE_INT32:
  case GGUF_TYPE_FLOAT32:
    return 4;
  case GGUF_TYPE_UINT64:
  case GGUF_TYPE_INT64:
  case GGUF_TYPE_FLOAT64:
    return 8;
  default:
    return 0;
  }
}

static int read_kv(struct cursor *c, struct gguf_kv *kv) {
  uint64_t klen;
  size_t koff = rd_str(c, &klen);
  if (c->failed)
    return -1;
  kv->key = malloc(klen + 1);
  if (!kv->key)
    return ERR("%s: out of memory", c->name);
  memcpy(kv->key, c->base + koff, klen);
  kv->key[klen] = 0;
  uint32_t t = rd_u32(c);
  if (c->failed)
    return -1;
  if (t >= GGUF_TYPE_COUNT)
    return ERR("%s: metadata key '%s' has unknown type %u", c->name, kv->key, t);
  kv->type = (enum gguf_type)t;
  if (t == GGUF_TYPE_STRING) {
    size_t off = rd_str(c, &kv->len);
    kv->value = c->base + off;
    return c->failed ? -1 : 0;
  }
  if (t != GGUF_TYPE_ARRAY) {
    kv->value = c->base + c->pos;
    return take(c, NULL, scalar_size(kv->type));
  }
  uint32_t et = rd_u32(c);
  kv->len = rd_u64(c);
  if (c->failed)
    return -1;
  if (et >= GGUF_TYPE_COUNT || et == GGUF_TYPE_ARRAY)
    return ERR("%s: metadata array '%s' has unsupported element type %u", c->name, kv->key, et);
  kv->elem_type = (enum gguf_type)et;
  kv->value = c->base + c->pos;
  if (et != GGUF_TYPE_STRING) {
    size_t es = scalar_size(kv->elem_type);
    if (kv->len > (c->size - c->pos) / es)
      return c->failed = 1, ERR("%s: metadata array '%s' (%llu elements) runs past the end of the file",
                               c->name, kv->key, (unsigned long long)kv->len);
    return take(c, NULL, (size_t)kv->len * es);
  }
  /* Each string takes at least 8 bytes, which bounds a sane count before allocating. */
  if (kv->len > (c->size - c->pos) / 8)
    return c->failed = 1, ERR("%s: metadata array '%s' (%llu strings) runs past the end of the file",
                             c->name, kv->key, (unsigned long long)kv->len);
  kv->str_offsets = malloc(sizeof(uint64_t) * (kv->len ? kv->len : 1));
  kv->str_lens = malloc(sizeof(uint64_t) * (kv->len ? kv->len : 1));
  if (!kv->str_offsets || !kv->str_lens)
    return ERR("%s: out of memory", c->name);
  for (uint64_t i = 0; i < kv->len; i++) {
    kv->str_offsets[i] = rd_str(c, &kv->str_lens[i]);
    if (c->failed)
      return -1;
  }
  return 0;
}

static int read_tensor_info(struct cursor *c, struct gguf_tensor *t, uint64_t *offset) {
  uint64_t nlen;
  size_t noff = rd_str(c, &nlen);
  if (c->failed)
    return -1;
  t->name = malloc(nlen + 1);
  if (!t->name)
    return ERR("%s: out of memory", c->name);
  memcpy(t->name, c->base + noff, nlen);
  t->name[nlen] = 0;
  uint32_t nd = rd_u32(c);
  if (c->failed)
    return -1;
  if (nd == 0 || nd > GGUF_MAX_DIMS)
    return ERR("%s: tensor '%s' has %u dimensions (1 to 4 supported)", c->name, t->name, nd);
  t->num_dims = (int)nd;
  for (int i = 0; i < GGUF_MAX_DIMS; i++)
    t->ne[i] = 1;
  for (uint32_t i = 0; i < nd; i++) {
    uint64_t d = rd_u64(c);
    if (d == 0 || d > (1ull << 40))
      return c->failed ? -1 : ERR("%s: tensor '%s' has invalid dimension %llu", c->name, t->name,
                                  (unsigned long long)d);
    t->ne[i] = (int64_t)d;
  }
  t->ggml_type = rd_u32(c);
  *offset = rd_u64(c);
  if (c->failed)
    return -1;
  t->dtype = dtype_from_ggml(t->ggml_type);
  return 0;
}

static struct gguf_file *parse(struct gguf_file *g, const char *name) {
  struct cursor c = {g->map.data, g->map.size, 0, name, 0};
  uint32_t magic = rd_u32(&c);
  if (c.failed || magic != GGUF_MAGIC) {
    if (!c.failed)
      ERR("%s: not a GGUF file (bad magic)", name);
    goto fail;
  }
  g->version = rd_u32(&c);
  if (!c.failed && (g->version < 2 || g->version > 3)) {
    ERR("%s: GGUF version %u is not supported (2 and 3 are)", name, g->version);
    goto fail;
  }
  uint64_t num_tensors = rd_u64(&c), num_kv = rd_u64(&c);
  if (c.failed)
    goto fail;
  /* Each kv takes at least 12 bytes and each tensor info at least 28: bound before alloc. */
  if (num_kv > g->map.size / 12 || num_tensors > g->map.size / 28) {
    ERR("%s: header claims %llu metadata keys and %llu tensors, more than the file can hold",
        name, (unsigned long long)num_kv, (unsigned long long)num_tensors);
    goto fail;
  }
  g->kv = calloc(num_kv ? num_kv : 1, sizeof *g->kv);
  g->tensors = calloc(num_tensors ? num_tensors : 1, sizeof *g->tensors);
  if (!g->kv || !g->tensors) {
    ERR("%s: out of memory", name);
    goto fail;
  }
  for (uint64_t i = 0; i < num_kv; i++) {
    g->num_kv = (int64_t)i + 1;
    if (read_kv(&c, &g->kv[i]) != 0)
      goto fail;
  }
  g->alignment = 32;
  int64_t al;
  if (gguf_get_int(g, "general.alignment", &al) == 0) {
    if (al <= 0 || al > (1 << 20) || (al & (al - 1))) {
      ERR("%s: general.alignment %lld is not a power of two", name, (long long)al);
      goto fail;
    }
    g->alignment = (uint32_t)al;
  }
  uint64_t *offsets = calloc(num_tensors ? num_tensors : 1, sizeof(uint64_t));
  if (!offsets) {
    ERR("%s: out of memory", name);
    goto fail;
  }
  for (uint64_t i = 0; i < num_tensors; i++) {
    g->num_tensors = (int64_t)i + 1;
    if (read_tensor_info(&c, &g->tensors[i], &offsets[i]) != 0) {
      free(offsets);
      goto fail;
    }
  }
  size_t data_start = (c.pos + g->alignment - 1) / g->alignment * g->alignment;
  for (int64_t i = 0; i < g->num_tensors; i++) {
    struct gguf_tensor *t = &g->tensors[i];
    if (t->dtype < 0) {
      t->data = NULL;
      continue; /* unsupported types are reported by whoever asks for the tensor */
    }
    int64_t n = t->ne[0], n2, n3;
    if (__builtin_mul_overflow(n, t->ne[1], &n2) || __builtin_mul_overflow(n2, t->ne[2], &n3) ||
        __builtin_mul_overflow(n3, t->ne[3], &n) || n > (int64_t)g->map.size) {
      ERR("%s: tensor '%s' has more elements than the file can hold", name, t->name);
      free(offsets);
      goto fail;
    }
    if (t->ne[0] % dtype_block_size((enum dtype)t->dtype)) {
      ERR("%s: tensor '%s': %s row length %lld is not a multiple of its block size %d", name,
          t->name, dtype_name((enum dtype)t->dtype), (long long)t->ne[0],
          dtype_block_size((enum dtype)t->dtype));
      free(offsets);
      goto fail;
    }
    t->nbytes = dtype_row_bytes((enum dtype)t->dtype, n);
    if (offsets[i] % g->alignment || data_start > g->map.size ||
        offsets[i] > g->map.size - data_start || t->nbytes > g->map.size - data_start - offsets[i]) {
      ERR("%s: tensor '%s' (%zu bytes at data offset %llu) lies outside the file or is misaligned",
          name, t->name, t->nbytes, (unsigned long long)offsets[i]);
      free(offsets);
      goto fail;
    }
    t->data = g->map.data + data_start + offsets[i];
  }
  free(offsets);
  return g;
fail:
  gguf_close(g);
  return NULL;
}

struct gguf_file *gguf_open(const char *path) {
  struct gguf_file *g = calloc(1, sizeof *g);
  if (!g) {
    ERR("out of memory");
    return NULL;
  }
  if (mapped_file_open(&g->map, path) != 0) {
    free(g);
    return NULL;
  }
  return parse(g, path);
}

struct gguf_file *gguf_open_memory(const void *data, size_t size, const char *name) {
  struct gguf_file *g = calloc(1, sizeof *g);
  if (!g) {
    ERR("out of memory");
    return NULL;
  }
  g->map.data = data;
  g->map.size = size;
  g->map.path = NULL; /* not owned: gguf_close must not unmap */
  struct gguf_file *r = parse(g, name);
  return r;
}

void gguf_close(struct gguf_file *g) {
  if (!g)
    return;
  for (int64_t i = 0; i < g->num_kv; i++) {
    free(g->kv[i].key);
    free(g->kv[i].str_offsets);
    free(g->kv[i].str_lens);
  }
  free(g->kv);
  for (int64_t i = 0; i < g->num_tensors; i++)
    free(g->tensors[i].name);
  free(g->tensors);
  if (g->map.path) /* mapped by gguf_open */
    mapped_file_close(&g->map);
  free(g);
}

const struct gguf_kv *gguf_find(const struct gguf_file *g, const char *key) {
  for (int64_t i = 0; i < g->num_kv; i++)
    if (g->kv[i].key && strcmp(g->kv[i].key, key) == 0)
      return &g->kv[i];
  return NULL;
}

static int scalar_int(enum gguf_type t, const uint8_t *p, int64_t *out) {
  switch (t) {
  case GGUF_TYPE_UINT8:
  case GGUF_TYPE_BOOL: *out = p[0]; return 0;
  case GGUF_TYPE_INT8: *out = (int8_t)p[0]; return 0;
  case GGUF_TYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); *out = v; return 0; }
  case GGUF_TYPE_INT16: { int16_t v; memcpy(&v, p, 2); *out = v; return 0; }
  case GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, p, 4); *out = v; return 0; }
  case GGUF_TYPE_INT32: { int32_t v; memcpy(&v, p, 4); *out = v; return 0; }
  case GGUF_TYPE_UINT64: { uint64_t v; memcpy(&v, p, 8); *out = (int64_t)v; return 0; }
  case GGUF_TYPE_INT64: { int64_t v; memcpy(&v, p, 8); *out = v; return 0; }
  default: return -1;
  }
}

static int scalar_float(enum gguf_type t, const uint8_t *p, double *out) {
  if (t == GGUF_TYPE_FLOAT32) {
    float v;
    memcpy(&v, p, 4);
    *out = v;
    return 0;
  }
  if (t == GGUF_TYPE_FLOAT64) {
    memcpy(out, p, 8);
    return 0;
  }
  int64_t i;
  if (scalar_int(t, p, &i) != 0)
    return -1;
  *out = (double)i;
  return 0;
}

int gguf_get_int(const struct gguf_file *g, const char *key, int64_t *out) {
  const struct gguf_kv *kv = gguf_find(g, key);
  return kv ? scalar_int(kv->type, kv->value, out) : -1;
}

int gguf_get_float(const struct gguf_file *g, const char *key, double *out) {
  const struct gguf_kv *kv = gguf_find(g, key);
  return kv ? scalar_float(kv->type, kv->value, out) : -1;
}

const char *gguf_get_str(const struct gguf_file *g, const char *key, size_t *len) {
  const struct gguf_kv *kv = gguf_find(g, key);
  if (!kv || kv->type != GGUF_TYPE_STRING)
    return NULL;
  if (len)
    *len = (size_t)kv->len;
  return (const char *)kv->value;
}

const char *gguf_arr_str(const struct gguf_file *g, const struct gguf_kv *kv, uint64_t i,
                         size_t *len) {
  if (!kv || kv->type != GGUF_TYPE_ARRAY || kv->elem_type != GGUF_TYPE_STRING || i >= kv->len)
    return NULL;
  if (len)
    *len = (size_t)kv->str_lens[i];
  return (const char *)g->map.data + kv->str_offsets[i];
}

int gguf_arr_int(const struct gguf_kv *kv, uint64_t i, int64_t *out) {
  if (!kv || kv->type != GGUF_TYPE_ARRAY || i >= kv->len || kv->elem_type == GGUF_TYPE_STRING)
    return -1;
  return scalar_int(kv->elem_type, kv->value + i * scalar_size(kv->elem_type), out);
}

int gguf_arr_float(const struct gguf_kv *kv, uint64_t i, double *out) {
  if (!kv || kv->type != GGUF_TYPE_ARRAY || i >= kv->len || kv->elem_type == GGUF_TYPE_STRING)
    return -1;
  return scalar_float(kv->elem_type, kv->value + i * scalar_size(kv->elem_type), out);
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *g, const char *name) {
  for (int64_t i = 0; i < g->num_tensors; i++)
    if (strcmp(g->tensors[i].name, name) == 0)
      return &g->tensors[i];
  return NULL;
}
