/* safetensors.c - safetensors parser: header length, JSON header, bounds-checked tensor table. */
#include "model/safetensors.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

/* JSON numbers are doubles: integers above 2^53 cannot be represented exactly. */
#define JSON_MAX_EXACT 9007199254740992.0

static int parse_dtype(const char *s, enum dtype *out) {
  if (!strcmp(s, "F32"))
    *out = DTYPE_F32;
  else if (!strcmp(s, "F16"))
    *out = DTYPE_F16;
  else if (!strcmp(s, "BF16"))
    *out = DTYPE_BF16;
  else
    return -1;
  return 0;
}

/* A non-negative integer JSON number (exactly representable), or -1. */
static int64_t json_uint(const cJSON *v) {
  if (!cJSON_IsNumber(v))
    return -1;
  double d = v->valuedouble;
  if (!(d >= 0 && d <= JSON_MAX_EXACT) || d != (double)(int64_t)d)
    return -1;
  return (int64_t)d;
}

static int read_tensor(struct safetensors_file *f, const cJSON *item,
                       struct safetensors_tensor *t, uint64_t *begin, uint64_t *end) {
  const char *fn = f->name, *tn = item->string;
  t->name = strdup(tn);
  if (!t->name)
    return ERR("%s: out of memory", fn);
  if (!cJSON_IsObject(item))
    return ERR("%s: tensor '%s': header entry is not an object", fn, tn);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
  if (!cJSON_IsString(dt))
    return ERR("%s: tensor '%s': missing or non-string \"dtype\"", fn, tn);
  if (parse_dtype(dt->valuestring, &t->dtype) != 0)
    return ERR("%s: tensor '%s': unsupported dtype %.32s (F32, F16 and BF16 are supported)", fn,
               tn, dt->valuestring);
  if (!cJSON_IsArray(shape))
    return ERR("%s: tensor '%s': missing or non-array \"shape\"", fn, tn);
  int nd = cJSON_GetArraySize(shape);
  if (nd > SAFETENSORS_MAX_DIMS)
    return ERR("%s: tensor '%s': %d dimensions (at most %d supported)", fn, tn, nd,
               SAFETENSORS_MAX_DIMS);
  t->num_dims = nd;
  /* Element count with overflow check: every dimension and the product stay below 2^53. */
  uint64_t n = 1;
  int i = 0;
  const cJSON *d;
  cJSON_ArrayForEach(d, shape) {
    int64_t v = json_uint(d);
    if (v < 0)
      return ERR("%s: tensor '%s': shape[%d] is not a non-negative integer", fn, tn, i);
    t->shape[i++] = v;
    if (v && n > (uint64_t)JSON_MAX_EXACT / (uint64_t)v)
      return ERR("%s: tensor '%s': shape has too many elements", fn, tn);
    n *= (uint64_t)v;
  }
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
    return ERR("%s: tensor '%s': \"data_offsets\" is not an array of two integers", fn, tn);
  int64_t b = json_uint(cJSON_GetArrayItem(offs, 0)), e = json_uint(cJSON_GetArrayItem(offs, 1));
  if (b < 0 || e < 0)
    return ERR("%s: tensor '%s': \"data_offsets\" are not non-negative integers", fn, tn);
  if (e < b)
    return ERR("%s: tensor '%s': data_offsets [%lld, %lld] end before they begin", fn, tn,
               (long long)b, (long long)e);
  uint64_t want = n * dtype_row_bytes(t->dtype, 1);
  if ((uint64_t)(e - b) != want)
    return ERR("%s: tensor '%s': data_offsets span %lld bytes but shape x %s needs %llu", fn, tn,
               (long long)(e - b), dtype_name(t->dtype), (unsigned long long)want);
  *begin = (uint64_t)b;
  *end = (uint64_t)e;
  t->nbytes = (size_t)want;
  return 0;
}

struct span {
  uint64_t begin, end;
  int idx;
};

static int cmp_span(const void *a, const void *b) {
  const struct span *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

static int cmp_tensor(const void *a, const void *b) {
  return strcmp(((const struct safetensors_tensor *)a)->name,
                ((const struct safetensors_tensor *)b)->name);
}

static int parse(struct safetensors_file *f) {
  const char *fn = f->name;
  const unsigned char *base = f->map.data;
  size_t size = f->map.size;
  if (size < 8)
    return ERR("%s: truncated safetensors file (%zu bytes, the header length alone takes 8)", fn,
               size);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--)
    hlen = hlen << 8 | base[i];
  if (hlen < 2 || hlen > SAFETENSORS_MAX_HEADER)
    return ERR("%s: header length %llu is not plausible (not a safetensors file?)", fn,
               (unsigned long long)hlen);
  if (hlen > size - 8)
    return ERR("%s: truncated safetensors file (header of %llu bytes, file of %zu)", fn,
               (unsigned long long)hlen, size);
  const char *json = (const char *)base + 8;
  if (json[0] != '{')
    return ERR("%s: header does not start with '{' (not a safetensors file?)", fn);
  const char *jend = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)hlen, &jend, 0);
  if (!root) {
    size_t at = jend && jend >= json ? (size_t)(jend - json) : 0;
    return ERR("%s: header is not valid JSON (near byte %zu of %llu)", fn, at,
               (unsigned long long)hlen);
  }
  f->header = root; /* kept until close; freed there (metadata points into it) */
  /* The library pads the header with spaces; anything else after the object is corruption. */
  for (const char *p = jend; p && p < json + hlen; p++)
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != 0)
      return ERR("%s: trailing bytes after the JSON header", fn);
  if (!cJSON_IsObject(root))
    return ERR("%s: header is not a JSON object", fn);
  int n = 0;
  const cJSON *item;
  cJSON_ArrayForEach(item, root) {
    if (strcmp(item->string, "__metadata__") != 0)
      n++;
  }
  f->tensors = calloc(n ? (size_t)n : 1, sizeof *f->tensors);
  struct span *spans = calloc(n ? (size_t)n : 1, sizeof *spans);
  if (!f->tensors || !spans) {
    free(spans);
    return ERR("%s: out of memory", fn);
  }
  uint64_t data_size = size - 8 - hlen;
  const unsigned char *data = base + 8 + hlen;
  int rc = 0;
  cJSON_ArrayForEach(item, root) {
    if (!strcmp(item->string, "__metadata__")) {
      if (!cJSON_IsObject(item)) {
        rc = ERR("%s: \"__metadata__\" is not an object", fn);
        break;
      }
      const cJSON *m;
      cJSON_ArrayForEach(m, item) {
        if (!cJSON_IsString(m)) {
          rc = ERR("%s: \"__metadata__\" value '%s' is not a string", fn, m->string);
          break;
        }
      }
      if (rc)
        break;
      continue;
    }
    struct safetensors_tensor *t = &f->tensors[f->num_tensors];
    struct span *s = &spans[f->num_tensors];
    t->file = f->name;
    s->idx = f->num_tensors++;
    if ((rc = read_tensor(f, item, t, &s->begin, &s->end)) != 0)
      break;
    if (s->end > data_size) {
      rc = ERR("%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the data "
               "(%llu bytes; truncated file?)", fn, t->name, (unsigned long long)s->begin,
               (unsigned long long)s->end, (unsigned long long)data_size);
      break;
    }
    t->data = data + s->begin;
  }
  if (rc == 0) {
    /* No two tensors may share bytes (empty tensors take none). */
    qsort(spans, (size_t)f->num_tensors, sizeof *spans, cmp_span);
    uint64_t prev_end = 0;
    int prev = -1;
    for (int i = 0; i < f->num_tensors; i++) {
      if (spans[i].begin == spans[i].end)
        continue;
      if (prev >= 0 && spans[i].begin < prev_end) {
        rc = ERR("%s: tensors '%s' and '%s' overlap in the data section", fn,
                 f->tensors[spans[prev].idx].name, f->tensors[spans[i].idx].name);
        break;
      }
      prev = i;
      prev_end = spans[i].end;
    }
  }
  free(spans);
  if (rc)
    return rc;
  qsort(f->tensors, (size_t)f->num_tensors, sizeof *f->tensors, cmp_tensor);
  for (int i = 1; i < f->num_tensors; i++)
    if (!strcmp(f->tensors[i - 1].name, f->tensors[i].name))
      return ERR("%s: tensor '%s' appears twice in the header", fn, f->tensors[i].name);
  return 0;
}

static struct safetensors_file *finish(struct safetensors_file *f) {
  if (parse(f) == 0)
    return f;
  safetensors_close(f);
  return NULL;
}

struct safetensors_file *safetensors_open(const char *path) {
  struct safetensors_file *f = calloc(1, sizeof *f);
  if (!f || !(f->name = strdup(path))) {
    free(f);
    ERR("%s: out of memory", path);
    return NULL;
  }
  if (mapped_file_open(&f->map, path) != 0) {
    free(f->name);
    free(f);
    return NULL;
  }
  return finish(f);
}

struct safetensors_file *safetensors_open_memory(const void *data, size_t size, const char *name) {
  struct safetensors_file *f = calloc(1, sizeof *f);
  if (!f || !(f->name = strdup(name))) {
    free(f);
    ERR("%s: out of memory", name);
    return NULL;
  }
  f->map.data = data;
  f->map.size = size;
  f->map.path = NULL; /* not owned: close must not unmap */
  return finish(f);
}

void safetensors_close(struct safetensors_file *f) {
  if (!f)
    return;
  for (int i = 0; i < f->num_tensors; i++)
    free(f->tensors[i].name);
  free(f->tensors);
  cJSON_Delete(f->header);
  if (f->map.path)
    mapped_file_close(&f->map);
  free(f->name);
  free(f);
}

const struct safetensors_tensor *safetensors_find(const struct safetensors_file *f,
                                                  const char *name) {
  int lo = 0, hi = f->num_tensors - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2, c = strcmp(f->tensors[mid].name, name);
    if (c == 0)
      return &f->tensors[mid];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return NULL;
}

const char *safetensors_metadata(const struct safetensors_file *f, const char *key) {
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(f->header, "__metadata__");
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---- sharded sets ---- */

static int cmp_entry(const void *a, const void *b) {
  return strcmp(((const struct safetensors_set_entry *)a)->name,
                ((const struct safetensors_set_entry *)b)->name);
}

static char *join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p)
    snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static int add_file(struct safetensors_set *s, const char *path) {
  struct safetensors_file **nf = realloc(s->files, sizeof *nf * (size_t)(s->num_files + 1));
  if (!nf)
    return ERR("%s: out of memory", path);
  s->files = nf;
  struct safetensors_file *f = safetensors_open(path);
  if (!f)
    return -1;
  s->files[s->num_files++] = f;
  return 0;
}

/* Index of the opened shard called NAME (a file name inside DIR), opening it on first use. */
static int shard_index(struct safetensors_set *s, const char *dir, const char *name) {
  if (!name[0] || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
    return ERR("%s: shard name '%s' is not a plain file name", s->index_path, name);
  char *path = join(dir, name);
  if (!path)
    return ERR("out of memory");
  for (int i = 0; i < s->num_files; i++)
    if (!strcmp(s->files[i]->name, path)) {
      free(path);
      return i;
    }
  int rc = add_file(s, path);
  free(path);
  return rc ? -1 : s->num_files - 1;
}

static int open_index(struct safetensors_set *s, const char *dir) {
  size_t len;
  char *text = file_read_all(s->index_path, &len);
  if (!text)
    return -1;
  cJSON *root = cJSON_ParseWithLength(text, len);
  free(text);
  if (!root)
    return ERR("%s: not valid JSON", s->index_path);
  int rc = 0;
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
  if (!cJSON_IsObject(wm)) {
    cJSON_Delete(root);
    return ERR("%s: no \"weight_map\" object", s->index_path);
  }
  int n = cJSON_GetArraySize(wm);
  s->entries = calloc(n ? (size_t)n : 1, sizeof *s->entries);
  if (!s->entries) {
    cJSON_Delete(root);
    return ERR("%s: out of memory", s->index_path);
  }
  const cJSON *e;
  cJSON_ArrayForEach(e, wm) {
    if (!cJSON_IsString(e)) {
      rc = ERR("%s: weight_map entry '%s' is not a file name", s->index_path, e->string);
      break;
    }
    int si = shard_index(s, dir, e->valuestring);
    if (si < 0) {
      rc = -1;
      break;
    }
    const struct safetensors_tensor *t = safetensors_find(s->files[si], e->string);
    if (!t) {
      rc = ERR("%s: tensor '%s' is listed in %s but is not in that shard", s->files[si]->name,
               e->string, s->index_path);
      break;
    }
    s->entries[s->num_entries].name = t->name;
    s->entries[s->num_entries++].tensor = t;
  }
  cJSON_Delete(root);
  return rc;
}

struct safetensors_set *safetensors_set_open(const char *dir) {
  struct safetensors_set *s = calloc(1, sizeof *s);
  if (!s) {
    ERR("out of memory");
    return NULL;
  }
  char *index = join(dir, "model.safetensors.index.json");
  char *single = join(dir, "model.safetensors");
  int rc;
  if (!index || !single) {
    rc = ERR("out of memory");
  } else if (file_exists(index)) {
    s->index_path = index;
    index = NULL;
    rc = open_index(s, dir);
  } else if (file_exists(single)) {
    rc = add_file(s, single);
    if (rc == 0) {
      struct safetensors_file *f = s->files[0];
      s->entries = calloc(f->num_tensors ? (size_t)f->num_tensors : 1, sizeof *s->entries);
      if (!s->entries)
        rc = ERR("%s: out of memory", single);
      for (int i = 0; rc == 0 && i < f->num_tensors; i++) {
        s->entries[i].name = f->tensors[i].name;
        s->entries[i].tensor = &f->tensors[i];
      }
      if (rc == 0)
        s->num_entries = f->num_tensors;
    }
  } else {
    rc = ERR("%s: neither model.safetensors nor model.safetensors.index.json is there", dir);
  }
  free(index);
  free(single);
  if (rc == 0) {
    qsort(s->entries, (size_t)s->num_entries, sizeof *s->entries, cmp_entry);
    for (int i = 1; i < s->num_entries; i++)
      if (!strcmp(s->entries[i - 1].name, s->entries[i].name))
        rc = ERR("%s: tensor '%s' is listed twice", s->index_path ? s->index_path : dir,
                 s->entries[i].name);
  }
  if (rc) {
    safetensors_set_close(s);
    return NULL;
  }
  return s;
}

void safetensors_set_close(struct safetensors_set *s) {
  if (!s)
    return;
  for (int i = 0; i < s->num_files; i++)
    safetensors_close(s->files[i]);
  free(s->files);
  free(s->entries);
  free(s->index_path);
  free(s);
}

const struct safetensors_tensor *safetensors_set_find(const struct safetensors_set *s,
                                                      const char *name) {
  struct safetensors_set_entry key = {name, NULL};
  const struct safetensors_set_entry *e =
      bsearch(&key, s->entries, (size_t)s->num_entries, sizeof key, cmp_entry);
  return e ? e->tensor : NULL;
}
