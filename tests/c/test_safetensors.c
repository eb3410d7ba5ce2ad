/* test_safetensors.c - the safetensors reader on files written here (valid and damaged in every
 * way the format can be), on the transformers fixtures (written by the safetensors library),
 * and on sharded sets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/safetensors.h"
#include "test_util.h"
#include "util/log.h"

#define NAME "damaged.safetensors"

/* The valid file's data section: a (2, 3) f32, a (4) f16, a (2, 2) bf16 = 24 + 8 + 8 bytes. */
static const float A_VALS[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -7.0f};
static const float B_VALS[4] = {0.5f, -1.0f, 65504.0f, 0.099975586f}; /* exact in f16 */
static const float C_VALS[4] = {1.0f, -3.0f, 0.15625f, 1024.0f};      /* exact in bf16 */
#define VALID_HEADER                                                         \
  "{\"__metadata__\":{\"format\":\"pt\"},"                                   \
  "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"       \
  "\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[24,32]},"        \
  "\"c\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[32,40]}}"

static unsigned char data40[40];

static void make_data(void) {
  memcpy(data40, A_VALS, 24);
  for (int i = 0; i < 4; i++) {
    uint16_t h = f32_to_f16(B_VALS[i]), b = f32_to_bf16(C_VALS[i]);
    memcpy(data40 + 24 + 2 * i, &h, 2);
    memcpy(data40 + 32 + 2 * i, &b, 2);
  }
}

/* A file image: 8-byte little-endian header length, HEADER padded with PAD spaces, DATA. */
static unsigned char *build(const char *header, int pad, const void *data, size_t ndata,
                            size_t *size) {
  size_t hl = strlen(header) + (size_t)pad;
  *size = 8 + hl + ndata;
  unsigned char *b = malloc(*size);
  for (int i = 0; i < 8; i++)
    b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
  memcpy(b + 8, header, strlen(header));
  memset(b + 8 + strlen(header), ' ', (size_t)pad);
  if (ndata)
    memcpy(b + 8 + hl, data, ndata);
  return b;
}

static void check_valid(const struct safetensors_file *f) {
  CHECK(f->num_tensors == 3, "3 tensors, got %d", f->num_tensors);
  const char *fmt = safetensors_metadata(f, "format");
  CHECK(fmt && !strcmp(fmt, "pt"), "metadata format");
  CHECK(safetensors_metadata(f, "nope") == NULL, "absent metadata key");
  CHECK(safetensors_find(f, "__metadata__") == NULL, "metadata is not a tensor");
  const struct safetensors_tensor *a = safetensors_find(f, "a"), *b = safetensors_find(f, "b"),
                                  *c = safetensors_find(f, "c");
  if (!a || !b || !c) {
    CHECK(0, "tensors a, b, c found");
    return;
  }
  CHECK(a->dtype == DTYPE_F32 && a->num_dims == 2 && a->shape[0] == 2 && a->shape[1] == 3 &&
            a->nbytes == 24, "a is f32 (2, 3)");
  CHECK(b->dtype == DTYPE_F16 && b->num_dims == 1 && b->shape[0] == 4 && b->nbytes == 8, "b f16");
  CHECK(c->dtype == DTYPE_BF16 && c->num_dims == 2 && c->nbytes == 8, "c bf16");
  /* The data section need not be aligned (these headers are not padded): copy out first. */
  float out[6], tmp[6];
  memcpy(tmp, a->data, 24);
  dtype_to_f32(out, tmp, a->dtype, 6);
  CHECK(!memcmp(out, A_VALS, 24), "a values");
  memcpy(tmp, b->data, 8);
  dtype_to_f32(out, tmp, b->dtype, 4);
  CHECK(!memcmp(out, B_VALS, 16), "b values %g %g %g %g", out[0], out[1], out[2], out[3]);
  memcpy(tmp, c->data, 8);
  dtype_to_f32(out, tmp, c->dtype, 4);
  CHECK(!memcmp(out, C_VALS, 16), "c values");
  CHECK(safetensors_find(f, "d") == NULL && safetensors_find(f, "") == NULL, "absent tensors");
}

/* HEADER (with the valid data section) must be refused with a message naming the file and
 * containing WANT (the tensor's name, or what is wrong). */
static void expect_error_n(const char *header, size_t ndata, const char *want, int line) {
  size_t size;
  unsigned char *img = build(header, 0, data40, ndata, &size);
  struct safetensors_file *f = safetensors_open_memory(img, size, NAME);
  CHECK(f == NULL, "line %d: damaged header accepted: %s", line, header);
  if (!f) {
    CHECK(strstr(err_last(), NAME) != NULL, "line %d: message names the file: %s", line,
          err_last());
    CHECK(!want || strstr(err_last(), want), "line %d: message has '%s': %s", line, want,
          err_last());
  }
  safetensors_close(f);
  free(img);
}
#define expect_error(h, want) expect_error_n(h, 40, want, __LINE__)

static void test_damage(void) {
  /* Bad JSON and wrong top-level structure. */
  expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}", "JSON");
  expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}}", "trailing");
  expect_error("[1, 2, 3]", "'{'");
  expect_error("{\"a\":5}", "'a'");
  expect_error("{\"__metadata__\":[1]}", "__metadata__");
  expect_error("{\"__metadata__\":{\"format\":1}}", "format");
  /* Unsupported dtypes name the dtype and the tensor. */
  expect_error("{\"ids\":{\"dtype\":\"I64\",\"shape\":[5],\"data_offsets\":[0,40]}}",
               "unsupported dtype I64");
  expect_error("{\"ids\":{\"dtype\":\"F8_E4M3\",\"shape\":[5],\"data_offsets\":[0,5]}}", "'ids'");
  expect_error("{\"ids\":{\"dtype\":7,\"shape\":[5],\"data_offsets\":[0,20]}}", "'ids'");
  expect_error("{\"x\":{\"shape\":[5],\"data_offsets\":[0,20]}}", "dtype");
  /* Shapes. */
  expect_error("{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", "shape[0]");
  expect_error("{\"x\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", "shape[0]");
  expect_error("{\"x\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}", "shape");
  expect_error("{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
               "dimensions");
  expect_error("{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}",
               "'x'");
  /* Offsets: out of range, reversed, wrong span, malformed, overlapping. */
  expect_error("{\"x\":{\"dtype\":\"F32\",\"shape\":[11],\"data_offsets\":[0,44]}}", "past the end");
  expect_error("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[40,44]}}", "past the end");
  expect_error("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[18446744073709551612,"
               "18446744073709551616]}}", "'x'");
  expect_error("{\"x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", "end before");
  expect_error("{\"x\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", "needs 24");
  expect_error("{\"x\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", "needs 12");
  expect_error("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", "two integers");
  expect_error("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", "'x'");
  expect_error("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":\"0-8\"}}", "'x'");
  expect_error("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", "overlap");
  expect_error("{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
               "\"y\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,8]}}", "overlap");
  expect_error("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", "twice");
  /* The valid header over too little data: the last tensor runs past the end. */
  expect_error_n(VALID_HEADER, 39, "'c'", __LINE__);

  /* Absurd header lengths. */
  unsigned char img[64] = {0};
  struct safetensors_file *f;
  uint64_t lens[] = {0, 1, 57, (uint64_t)SAFETENSORS_MAX_HEADER + 1, ~0ull};
  for (int i = 0; i < 5; i++) {
    memcpy(img, &lens[i], 8);
    memcpy(img + 8, "{}", 2);
    f = safetensors_open_memory(img, sizeof img, NAME);
    CHECK(f == NULL && strstr(err_last(), NAME) && strstr(err_last(), "header"),
          "header length %llu refused: %s", (unsigned long long)lens[i], err_last());
    safetensors_close(f);
  }
  /* An empty header is a valid file with no tensors; zero-size and scalar tensors are fine. */
  size_t size;
  unsigned char *ok = build("{}", 6, NULL, 0, &size);
  f = safetensors_open_memory(ok, size, NAME);
  CHECK(f && f->num_tensors == 0, "empty header accepted: %s", err_last());
  safetensors_close(f);
  free(ok);
  ok = build("{\"e\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[0,0]},"
             "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 0, data40, 4, &size);
  f = safetensors_open_memory(ok, size, NAME);
  CHECK(f && f->num_tensors == 2, "empty and scalar tensors: %s", err_last());
  if (f) {
    const struct safetensors_tensor *s = safetensors_find(f, "s");
    CHECK(s && s->num_dims == 0 && s->nbytes == 4, "scalar");
  }
  safetensors_close(f);
  free(ok);
}

static char tmpdir[64];

static void write_file(const char *path, const void *data, size_t n) {
  FILE *fp = fopen(path, "wb");
  if (!fp) {
    CHECK(0, "cannot write %s", path);
    return;
  }
  if (n)
    fwrite(data, 1, n, fp);
  fclose(fp);
}

/* The valid image on disk, then every truncation of it, through the mapped-file path; and every
 * truncation and every single-byte corruption of the header in memory (exact-size buffers, so
 * the ASan build catches any read past the end). */
static void test_file_and_truncations(void) {
  size_t size;
  unsigned char *img = build(VALID_HEADER, 5, data40, 40, &size); /* padded like the library */
  char path[128];
  snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
  write_file(path, img, size);
  struct safetensors_file *f = safetensors_open(path);
  CHECK(f != NULL, "valid file opens: %s", err_last());
  if (f) {
    check_valid(f);
    CHECK(safetensors_find(f, "a")->file == f->name && !strcmp(f->name, path), "file named");
  }
  safetensors_close(f);
  for (size_t cut = 0; cut < size; cut++) {
    write_file(path, img, cut);
    f = safetensors_open(path);
    CHECK(f == NULL, "file truncated to %zu bytes accepted", cut);
    CHECK(f || strstr(err_last(), path), "truncation message names the file: %s", err_last());
    safetensors_close(f);
    unsigned char *part = malloc(cut ? cut : 1);
    memcpy(part, img, cut);
    f = safetensors_open_memory(part, cut, NAME);
    CHECK(f == NULL && strstr(err_last(), NAME), "truncated at %zu: %s", cut, err_last());
    safetensors_close(f);
    free(part);
  }
  /* Flip each header byte to a few values: whatever is accepted must still be in bounds. */
  const unsigned char vals[] = {0, '"', '}', '9', 0xff};
  for (size_t at = 8; at < size - 40; at++)
    for (size_t v = 0; v < sizeof vals; v++) {
      unsigned char *m = malloc(size);
      memcpy(m, img, size);
      m[at] = vals[v];
      f = safetensors_open_memory(m, size, NAME);
      for (int i = 0; f && i < f->num_tensors; i++) {
        const struct safetensors_tensor *t = &f->tensors[i];
        CHECK((const unsigned char *)t->data >= m + 8 &&
                  (const unsigned char *)t->data + t->nbytes <= m + size,
              "tensor in bounds after corrupting byte %zu", at);
      }
      CHECK(f || strstr(err_last(), NAME), "message names the file: %s", err_last());
      safetensors_close(f);
      free(m);
    }
  unlink(path);
  free(img);
  f = safetensors_open("/nonexistent/model.safetensors");
  CHECK(f == NULL && strstr(err_last(), "/nonexistent/model.safetensors"), "missing file");
}

/* A sharded set written here: index + two shards, then broken in each way. */
static void test_sets(void) {
  char dir[128], p[192];
  snprintf(dir, sizeof dir, "%s/sharded", tmpdir);
  mkdir(dir, 0700);
  size_t n1, n2;
  unsigned char *s1 = build("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}",
                            0, data40, 24, &n1);
  unsigned char *s2 = build("{\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                            "\"c\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[8,16]}}",
                            0, data40 + 24, 16, &n2);
  snprintf(p, sizeof p, "%s/one.safetensors", dir);
  write_file(p, s1, n1);
  snprintf(p, sizeof p, "%s/two.safetensors", dir);
  write_file(p, s2, n2);
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  const char *index = "{\"metadata\":{\"total_size\":40},\"weight_map\":{\"a\":\"one.safetensors\","
                      "\"b\":\"two.safetensors\",\"c\":\"two.safetensors\"}}";
  write_file(p, index, strlen(index));
  struct safetensors_set *s = safetensors_set_open(dir);
  CHECK(s != NULL, "sharded set opens: %s", err_last());
  if (s) {
    CHECK(s->num_files == 2 && s->num_entries == 3, "2 files, 3 tensors");
    const struct safetensors_tensor *c = safetensors_set_find(s, "c");
    CHECK(c && c->dtype == DTYPE_BF16 && strstr(c->file, "two.safetensors"), "c in shard two");
    float out[4], tmp[2];
    if (c) {
      memcpy(tmp, c->data, 8);
      dtype_to_f32(out, tmp, c->dtype, 4);
    }
    CHECK(c && !memcmp(out, C_VALS, 16), "c values through the set");
    CHECK(safetensors_set_find(s, "d") == NULL, "absent");
  }
  safetensors_set_close(s);
  struct {
    const char *index, *want;
  } bad[] = {
      {"{\"weight_map\":{\"a\":\"one.safetensors\",\"z\":\"two.safetensors\"}}", "'z'"},
      {"{\"weight_map\":{\"a\":\"three.safetensors\"}}", "three.safetensors"},
      {"{\"weight_map\":{\"a\":\"../sharded/one.safetensors\"}}", "plain file name"},
      {"{\"weight_map\":{\"a\":\"..\"}}", "plain file name"},
      {"{\"weight_map\":{\"a\":7}}", "'a'"},
      {"{\"weight_map\":[]}", "weight_map"},
      {"{\"weight_map\":{\"a\":\"one.safetensors\"}", "JSON"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    write_file(p, bad[i].index, strlen(bad[i].index));
    s = safetensors_set_open(dir);
    CHECK(s == NULL, "bad index %zu accepted", i);
    CHECK(s || (strstr(err_last(), "sharded") && strstr(err_last(), bad[i].want)),
          "bad index %zu: message names the file and '%s': %s", i, bad[i].want, err_last());
    safetensors_set_close(s);
  }
  unlink(p);
  /* Without an index or model.safetensors, the directory is named. */
  s = safetensors_set_open(dir);
  CHECK(s == NULL && strstr(err_last(), dir), "no weights: %s", err_last());
  snprintf(p, sizeof p, "%s/one.safetensors", dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/two.safetensors", dir);
  unlink(p);
  rmdir(dir);
  free(s1);
  free(s2);
}

/* Files written by the safetensors library (through transformers' save_pretrained). */
static void test_fixtures(void) {
  char p[512];
  snprintf(p, sizeof p, "%s/llama/model.safetensors", test_fixture_path(""));
  struct safetensors_file *f = safetensors_open(p);
  if (!f) {
    printf("fixtures absent (%s), skipped\n", err_last());
    return;
  }
  const char *fmt = safetensors_metadata(f, "format");
  CHECK(fmt && !strcmp(fmt, "pt"), "library writes format=pt");
  CHECK(f->num_tensors == 2 * 9 + 3, "llama fixture has 21 tensors, got %d", f->num_tensors);
  const struct safetensors_tensor *e = safetensors_find(f, "model.embed_tokens.weight");
  CHECK(e && e->dtype == DTYPE_F32 && e->num_dims == 2 && e->shape[0] == 256 && e->shape[1] == 64,
        "embed (256, 64) f32");
  /* The library aligns the data section to 8 bytes. */
  CHECK(e && (uintptr_t)e->data % 8 == 0, "aligned data");
  safetensors_close(f);
  snprintf(p, sizeof p, "%s/llama_bf16/model.safetensors", test_fixture_path(""));
  f = safetensors_open(p);
  CHECK(f != NULL, "bf16 fixture: %s", err_last());
  for (int i = 0; f && i < f->num_tensors; i++)
    CHECK(f->tensors[i].dtype == DTYPE_BF16, "%s is bf16", f->tensors[i].name);
  safetensors_close(f);
  snprintf(p, sizeof p, "%s/llama_sharded", test_fixture_path(""));
  struct safetensors_set *s = safetensors_set_open(p);
  CHECK(s && s->num_files == 2 && s->num_entries == 21, "sharded fixture: %s", err_last());
  safetensors_set_close(s);
}

int main(void) {
  make_data();
  snprintf(tmpdir, sizeof tmpdir, "/tmp/pagoda_st_XXXXXX");
  if (!mkdtemp(tmpdir)) {
    CHECK(0, "mkdtemp");
    return test_finish("test_safetensors");
  }
  size_t size;
  unsigned char *img = build(VALID_HEADER, 0, data40, 40, &size);
  struct safetensors_file *f = safetensors_open_memory(img, size, NAME);
  CHECK(f != NULL, "valid image: %s", err_last());
  if (f)
    check_valid(f);
  safetensors_close(f);
  free(img);
  test_damage();
  test_file_and_truncations();
  test_sets();
  test_fixtures();
  rmdir(tmpdir);
  return test_finish("test_safetensors");
}
