/* test_quant_llamacpp.c - pagoda's K-quant quantizers (what --isq q4_k / q5_k / q6_k run) give
 * llama-quantize's bytes: tests/fixtures/quant/{q4_k,q5_k,q6_k}.llamacpp are llama.cpp's
 * quantization (ggml_quantize_chunk, no importance matrix) of the tensor built below, written by
 * tools/llamacpp_quant_fixture.c against llama-cpp-python 0.3.36's vendored ggml. The tensor:
 * quant/src.f32 (2048 values), their squares (sub-blocks whose minimum is 0), 256 zeros. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "util/dtype.h"
#include "util/quant.h"

#define N_SRC 2048
#define N_ALL (2 * N_SRC + 256)

int main(void) {
  size_t len = 0;
  float *src = (float *)test_read_file(test_fixture_path("quant/src.f32"), &len);
  if (!src || len != N_SRC * sizeof(float)) {
    CHECK(0, "quant/src.f32: %zu bytes", len);
    return test_finish("test_quant_llamacpp");
  }
  static float x[N_ALL];
  memcpy(x, src, N_SRC * sizeof(float));
  for (int i = 0; i < N_SRC; i++)
    x[N_SRC + i] = x[i] * x[i];
  free(src);
  static const struct {
    enum dtype t;
    const char *file;
  } types[] = {{DTYPE_Q4_K, "quant/q4_k.llamacpp"}, {DTYPE_Q5_K, "quant/q5_k.llamacpp"},
               {DTYPE_Q6_K, "quant/q6_k.llamacpp"}};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    size_t n = dtype_row_bytes(types[i].t, N_ALL), bb = dtype_block_bytes(types[i].t), got_len = 0;
    char *want = test_read_file(test_fixture_path(types[i].file), &got_len);
    char *got = malloc(n);
    CHECK(want && got_len == n, "%s: %zu bytes, expected %zu", types[i].file, got_len, n);
    CHECK(quant_quantize_row(types[i].t, x, got, N_ALL) == 0, "%s quantizes", dtype_name(types[i].t));
    if (want && got_len == n) {
      size_t first = n;
      int blocks = 0;
      for (size_t b = 0; b < n / bb; b++)
        if (memcmp(got + b * bb, want + b * bb, bb) != 0)
          first = first < n ? first : b, blocks++;
      CHECK(blocks == 0, "%s: %d of %zu super-blocks differ from llama.cpp's (first: %zu)", dtype_name(types[i].t),
            blocks, n / bb, first);
    }
    free(want);
    free(got);
  }
  return test_finish("test_quant_llamacpp");
}
