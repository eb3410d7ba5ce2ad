/* test_quant.c - GGML block layouts and reference (de)quantizers against gguf-py.
 *
 * tests/fixtures/quant/ holds outputs of gguf-py (PyPI `gguf`, written by
 * tools/gen_quant_fixtures.py): dequantizations of random blocks of every type, and
 * quantizations of src.f32 for the types gguf-py can quantize. pagoda's layouts must reproduce
 * them; its own quantizers (K-quants, IQ4, Q8_K) must round-trip within the error bounds below.
 */
#include <math.h>
#include <string.h>

#include "test_util.h"
#include "util/dtype.h"
#include "util/quant.h"

#define N_ELEMS 2048

static const enum dtype all_types[] = {DTYPE_Q4_0, DTYPE_Q4_1, DTYPE_Q5_0, DTYPE_Q5_1,
                                       DTYPE_Q8_0, DTYPE_Q2_K, DTYPE_Q3_K, DTYPE_Q4_K,
                                       DTYPE_Q5_K, DTYPE_Q6_K, DTYPE_IQ4_NL, DTYPE_IQ4_XS};
#define N_TYPES (int)(sizeof all_types / sizeof all_types[0])

static char *read_fixture(const char *type, const char *ext, size_t want) {
  char rel[64];
  snprintf(rel, sizeof rel, "quant/%s.%s", type, ext);
  size_t len = 0;
  char *buf = test_read_file(test_fixture_path(rel), &len);
  CHECK(buf && len == want, "%s: %zu bytes, expected %zu", rel, buf ? len : 0, want);
  if (buf && len != want) {
    free(buf);
    return NULL;
  }
  return buf;
}

/* Dequantizing gguf-py's random blocks gives gguf-py's values: bit-exact, since both compute
 * each value with the same float operations in the same order. */
static void test_dequantize_vs_gguf_py(void) {
  float *y = malloc(sizeof(float) * N_ELEMS);
  for (int i = 0; i < N_TYPES; i++) {
    enum dtype t = all_types[i];
    const char *name = dtype_name(t);
    char *blocks = read_fixture(name, "blocks", dtype_row_bytes(t, N_ELEMS));
    float *ref = (float *)read_fixture(name, "deq", sizeof(float) * N_ELEMS);
    if (blocks && ref) {
      memset(y, 0xff, sizeof(float) * N_ELEMS);
      CHECK(quant_dequantize_row(t, blocks, y, N_ELEMS) == 0, "%s: no dequantizer", name);
      int bad = 0, first = -1;
      for (int j = 0; j < N_ELEMS; j++)
        if (memcmp(&y[j], &ref[j], 4) != 0 && !(y[j] == ref[j])) {
          if (first < 0)
            first = j;
          bad++;
        }
      CHECK(bad == 0, "%s: %d of %d values differ from gguf-py, first at %d: %g vs %g", name, bad,
            N_ELEMS, first, first >= 0 ? y[first] : 0, first >= 0 ? ref[first] : 0);
      /* dtype_to_f32 routes to the same code. */
      float *z = malloc(sizeof(float) * N_ELEMS);
      dtype_to_f32(z, blocks, t, N_ELEMS);
      CHECK(memcmp(z, y, sizeof(float) * N_ELEMS) == 0, "%s: dtype_to_f32 differs", name);
      free(z);
    }
    free(blocks);
    free(ref);
  }
  free(y);
}

/* Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: the same bytes as gguf-py's quantizer (both follow ggml's
 * reference rounding). */
static void test_quantize_vs_gguf_py(void) {
  float *src = (float *)read_fixture("src", "f32", sizeof(float) * N_ELEMS);
  static const enum dtype types[] = {DTYPE_Q4_0, DTYPE_Q4_1, DTYPE_Q5_0, DTYPE_Q5_1, DTYPE_Q8_0};
  for (int i = 0; src && i < 5; i++) {
    enum dtype t = types[i];
    size_t nb = dtype_row_bytes(t, N_ELEMS);
    char *ref = read_fixture(dtype_name(t), "q", nb);
    char *q = calloc(1, nb);
    CHECK(quant_quantize_row(t, src, q, N_ELEMS) == 0, "%s: no quantizer", dtype_name(t));
    if (ref) {
      size_t bs = dtype_block_bytes(t), bad = 0, first = (size_t)-1;
      for (size_t b = 0; b < nb / bs; b++)
        if (memcmp(q + b * bs, ref + b * bs, bs)) {
          bad++;
          if (first == (size_t)-1)
            first = b;
        }
      CHECK(bad == 0, "%s: %zu of %zu blocks differ from gguf-py's quantizer (first: block %zu)",
            dtype_name(t), bad, nb / bs, first);
    }
    free(q);
    free(ref);
  }
  free(src);
}

/* Every quantizer round-trips src.f32 (standard normal, 16 outliers of 8x, a zero block) within
 * a relative L2 error bound. The bounds are 1.1x to 1.5x what each format gives on this data
 * (measured: printed below), so a wrong level, scale or packing fails them; the all-zero block
 * must come back exactly zero. */
static void test_round_trip(void) {
  float *src = (float *)read_fixture("src", "f32", sizeof(float) * N_ELEMS);
  static const struct {
    enum dtype t;
    double bound;
  } cases[] = {
      {DTYPE_Q4_0, 0.16}, {DTYPE_Q4_1, 0.14},  {DTYPE_Q5_0, 0.08},   {DTYPE_Q5_1, 0.07},
      {DTYPE_Q8_0, 0.01}, {DTYPE_Q4_K, 0.14},  {DTYPE_Q5_K, 0.07},   {DTYPE_Q6_K, 0.035},
      {DTYPE_Q8_K, 0.03}, {DTYPE_IQ4_NL, 0.13}, {DTYPE_IQ4_XS, 0.13},
  };
  float *y = malloc(sizeof(float) * N_ELEMS);
  for (size_t i = 0; src && i < sizeof cases / sizeof cases[0]; i++) {
    enum dtype t = cases[i].t;
    char *q = calloc(1, dtype_row_bytes(t, N_ELEMS));
    CHECK(quant_can_quantize(t), "%s", dtype_name(t));
    CHECK(quant_quantize_row(t, src, q, N_ELEMS) == 0, "%s: no quantizer", dtype_name(t));
    CHECK(quant_dequantize_row(t, q, y, N_ELEMS) == 0, "%s: no dequantizer", dtype_name(t));
    double e = test_rel_l2(y, src, N_ELEMS);
    printf("  %-7s round-trip relative L2 error %.4f (bound %.3f)\n", dtype_name(t), e, cases[i].bound);
    CHECK(e < cases[i].bound, "%s: round-trip error %.4f >= %.3f", dtype_name(t), e, cases[i].bound);
    for (int j = 512; j < 768; j++)
      if (y[j] != 0.0f) {
        CHECK(0, "%s: zero block element %d came back as %g", dtype_name(t), j, y[j]);
        break;
      }
    free(q);
  }
  CHECK(!quant_can_quantize(DTYPE_Q2_K) && quant_quantize_row(DTYPE_Q2_K, src, y, 256) == -1,
        "q2_k has no quantizer");
  free(y);
  free(src);
}

static void test_dtype_table(void) {
  static const struct {
    enum dtype t;
    unsigned ggml;
    int block;
    size_t bytes;
  } cases[] = {
      {DTYPE_Q4_0, 2, 32, 18},    {DTYPE_Q4_1, 3, 32, 20},    {DTYPE_Q5_0, 6, 32, 22},
      {DTYPE_Q5_1, 7, 32, 24},    {DTYPE_Q8_0, 8, 32, 34},    {DTYPE_Q2_K, 10, 256, 84},
      {DTYPE_Q3_K, 11, 256, 110}, {DTYPE_Q4_K, 12, 256, 144}, {DTYPE_Q5_K, 13, 256, 176},
      {DTYPE_Q6_K, 14, 256, 210}, {DTYPE_IQ4_NL, 20, 32, 18}, {DTYPE_IQ4_XS, 23, 256, 136},
      {DTYPE_F32, 0, 1, 4},       {DTYPE_F16, 1, 1, 2},       {DTYPE_BF16, 30, 1, 2},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    enum dtype t = cases[i].t;
    CHECK(dtype_from_ggml(cases[i].ggml) == (int)t, "ggml %u -> %d", cases[i].ggml, dtype_from_ggml(cases[i].ggml));
    CHECK(dtype_to_ggml(t) == (int)cases[i].ggml, "%s -> ggml %d", dtype_name(t), dtype_to_ggml(t));
    CHECK(dtype_block_size(t) == cases[i].block, "%s block %d", dtype_name(t), dtype_block_size(t));
    CHECK(dtype_block_bytes(t) == cases[i].bytes, "%s bytes %zu", dtype_name(t), dtype_block_bytes(t));
    CHECK(dtype_row_bytes(t, 4096) == 4096 / cases[i].block * cases[i].bytes, "%s row bytes", dtype_name(t));
    CHECK(dtype_is_quant(t) == (cases[i].block > 1), "%s is_quant", dtype_name(t));
    CHECK(dtype_from_name(dtype_name(t)) == (int)t, "%s by name", dtype_name(t));
  }
  CHECK(dtype_from_name("Q4_K") == DTYPE_Q4_K, "names are case-insensitive");
  CHECK(dtype_from_ggml(15) == -1, "Q8_K is never read from files");
  CHECK(dtype_from_ggml(16) == -1 && strcmp(ggml_type_name(16), "IQ2_XXS") == 0, "IQ2_XXS unsupported");
  CHECK(strcmp(ggml_type_name(12), "Q4_K") == 0 && strcmp(ggml_type_name(999), "unknown") == 0, "names");
}

int main(void) {
  test_dtype_table();
  test_dequantize_vs_gguf_py();
  test_quantize_vs_gguf_py();
  test_round_trip();
  return test_finish("test_quant");
}
