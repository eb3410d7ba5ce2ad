/* tokenizer_bench.c - tokenization throughput of one tokenizer on one text file, one thread:
 * encodes the whole file REPEATS times and prints the best time as MB/s (1 MB = 1e6 bytes)
 * as one JSON line, plus the ids (--ids FILE) so a caller can check them against HF.
 * With --lines each line (with its newline) is encoded as its own text, as a server sees
 * many short prompts.
 * usage: tokenizer_bench -m TOKENIZER -f TEXT [-r REPEATS] [--lines] [--ids OUT] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "text/tokenizer.h"
#include "util/file.h"
#include "util/log.h"

int main(int argc, char **argv) {
  const char *model = NULL, *file = NULL, *ids_out = NULL;
  int repeats = 5, lines = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-m") && i + 1 < argc)
      model = argv[++i];
    else if (!strcmp(argv[i], "-f") && i + 1 < argc)
      file = argv[++i];
    else if (!strcmp(argv[i], "-r") && i + 1 < argc)
      repeats = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--lines"))
      lines = 1;
    else if (!strcmp(argv[i], "--ids") && i + 1 < argc)
      ids_out = argv[++i];
    else {
      fprintf(stderr, "usage: tokenizer_bench -m TOKENIZER -f TEXT [-r REPEATS] [--lines] [--ids OUT]\n");
      return 2;
    }
  }
  if (!model || !file || repeats < 1) {
    fprintf(stderr, "usage: tokenizer_bench -m TOKENIZER -f TEXT [-r REPEATS] [--lines] [--ids OUT]\n");
    return 2;
  }
  double t0 = bench_now();
  struct tokenizer *t = tokenizer_load(model);
  double load_s = bench_now() - t0;
  if (!t) {
    fprintf(stderr, "tokenizer_bench: %s\n", err_last());
    return 1;
  }
  size_t len;
  char *text = file_read_all(file, &len);
  if (!text) {
    fprintf(stderr, "tokenizer_bench: %s\n", err_last());
    return 1;
  }
  /* Spans to encode: the whole text, or each line with its newline. */
  size_t n_spans = 0, *span_off = malloc((len + 1) * sizeof *span_off), *span_len = malloc((len + 1) * sizeof *span_len);
  if (!span_off || !span_len)
    return 1;
  for (size_t s = 0; s < len;) {
    size_t e = s;
    if (lines)
      while (e < len && text[e] != '\n')
        e++;
    e = lines ? (e < len ? e + 1 : e) : len;
    span_off[n_spans] = s;
    span_len[n_spans++] = e - s;
    s = e;
  }
  int n = 0;
  for (size_t k = 0; k < n_spans; k++) {
    int c = tokenizer_encode(t, text + span_off[k], span_len[k], 0, 0, NULL, 0);
    if (c < 0) {
      fprintf(stderr, "tokenizer_bench: encode failed: %s\n", err_last());
      return 1;
    }
    n += c;
  }
  int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
  if (!ids)
    return 1;
  double best = 1e30;
  for (int r = 0; r < repeats; r++) {
    double s = bench_now();
    int w = 0;
    for (size_t k = 0; k < n_spans; k++)
      w += tokenizer_encode(t, text + span_off[k], span_len[k], 0, 0, ids + w, n - w);
    double e = bench_now() - s;
    if (e < best)
      best = e;
  }
  /* Decoding throughput over the same ids, for reference. */
  int dl = tokenizer_decode(t, ids, n, 0, NULL, 0);
  char *dec = malloc((size_t)dl + 1);
  double dbest = 1e30;
  for (int r = 0; r < repeats && dec; r++) {
    double s = bench_now();
    tokenizer_decode(t, ids, n, 0, dec, (size_t)dl + 1);
    double e = bench_now() - s;
    if (e < dbest)
      dbest = e;
  }
  if (ids_out) {
    FILE *f = fopen(ids_out, "w");
    for (int i = 0; f && i < n; i++)
      fprintf(f, i ? " %d" : "%d", (int)ids[i]);
    if (f) {
      fputc('\n', f);
      fclose(f);
    }
  }
  printf("{\"bytes\": %zu, \"tokens\": %d, \"load_s\": %.4f, \"encode_s\": %.5f, \"encode_mb_s\": %.2f, "
         "\"decode_mb_s\": %.2f}\n",
         len, n, load_s, best, (double)len / best / 1e6, (double)dl / dbest / 1e6);
  free(dec);
  free(span_off);
  free(span_len);
  free(ids);
  free(text);
  tokenizer_free(t);
  return 0;
}
