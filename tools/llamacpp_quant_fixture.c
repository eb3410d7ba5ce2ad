/* llamacpp_quant_fixture.c - llama.cpp's quantization (ggml_quantize_chunk without an importance
 * matrix: what llama-quantize writes) of a test tensor to Q4_K, Q5_K and Q6_K, the reference of
 * tests/c/test_quant_llamacpp.c, which builds the same tensor:
 *   tests/fixtures/quant/src.f32 (2048 values), then their squares (>= 0: every sub-block's
 *   minimum at zero), then 256 zeros: 4352 values, one row.
 *
 *   cc -O1 -o llamacpp_quant_fixture tools/llamacpp_quant_fixture.c -I$LLAMA/ggml/include \
 *      -L$LLAMA/build/bin -lggml-base -Wl,-rpath,$LLAMA/build/bin
 *   llamacpp_quant_fixture tests/fixtures/quant
 * writes OUTDIR/q4_k.llamacpp, q5_k.llamacpp, q6_k.llamacpp (LLAMA: the llama.cpp tree of
 * tools/llamacpp_fixtures.sh, never committed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"

#define N_SRC 2048
#define N_ALL (2 * N_SRC + 256)

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: llamacpp_quant_fixture OUTDIR (holding src.f32)\n");
    return 2;
  }
  static float x[N_ALL];
  char path[1024];
  snprintf(path, sizeof path, "%s/src.f32", argv[1]);
  FILE *f = fopen(path, "rb");
  if (!f || fread(x, sizeof(float), N_SRC, f) != N_SRC) {
    fprintf(stderr, "error: cannot read %d floats from %s\n", N_SRC, path);
    return 1;
  }
  fclose(f);
  for (int i = 0; i < N_SRC; i++)
    x[N_SRC + i] = x[i] * x[i];
  static const struct {
    enum ggml_type t;
    const char *name;
  } types[] = {{GGML_TYPE_Q4_K, "q4_k"}, {GGML_TYPE_Q5_K, "q5_k"}, {GGML_TYPE_Q6_K, "q6_k"}};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    size_t n = ggml_row_size(types[i].t, N_ALL);
    void *q = malloc(n);
    if (ggml_quantize_chunk(types[i].t, x, q, 0, 1, N_ALL, NULL) != n)
      return fprintf(stderr, "error: %s: unexpected size\n", types[i].name), 1;
    snprintf(path, sizeof path, "%s/%s.llamacpp", argv[1], types[i].name);
    if (!(f = fopen(path, "wb")) || fwrite(q, 1, n, f) != n || fclose(f))
      return fprintf(stderr, "error: cannot write %s\n", path), 1;
    printf("%s: %zu bytes\n", path, n);
    free(q);
  }
  return 0;
}
