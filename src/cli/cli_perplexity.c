/* cli_perplexity.c - `pagoda perplexity`: the perplexity of a model on a text file, computed as
 * llama.cpp's llama-perplexity computes it (its default mode), so the figures compare directly:
 *   - the whole file is tokenized once with BOS added as the tokenizer says;
 *   - it is cut into floor(n / ctx) non-overlapping windows of ctx tokens; the first token of
 *     each window is replaced by BOS (when the tokenizer adds one);
 *   - in each window only the second half is scored: positions first = ctx/2 .. ctx-2 each
 *     predict the next token, nll += -log p, nll2 += (log p)^2;
 *   - PPL = exp(nll / count), and its error is ppl * sqrt((nll2/count - (nll/count)^2) / (count-1)).
 * The windows go through the engine as parallel sequences, batch / ctx of them per pass (at
 * least one), each a request with prompt_logprobs. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/cli_io.h"
#include "cli/engine_flags.h"
#include "pagoda.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: pagoda perplexity [-m MODEL] -f TEXT [--ctx N] [--batch N] [--chunks N] [options]\n\n"
          "Perplexity over TEXT as llama.cpp's llama-perplexity computes it: non-overlapping windows\n"
          "of N tokens, each starting with BOS, the second half of each scored. Progress and the\n"
          "running estimate per window ([k]PPL,) go to stdout; the last line is\n"
          "'Final estimate: PPL = X +/- Y'.\n\n"
          "  -f, --file TEXT               the text file (needs at least 2 * ctx tokens)\n"
          "  -c, --ctx N                   window length in tokens (default 512)\n"
          "  -b, --batch N                 tokens per pass (default 2048): batch / ctx windows run\n"
          "                                as parallel sequences; below ctx, windows are prefilled\n"
          "                                in chunks of N\n"
          "  --chunks N                    score at most N windows (default -1: all)\n\n");
  struct pagoda_engine_params d; /* the values the parse starts from */
  pagoda_engine_params_default(&d);
  engine_flags_usage(f, &d);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int cli_perplexity(int argc, char **argv) {
  struct pagoda_engine_params ep;
  pagoda_engine_params_default(&ep);
  const char *file = NULL, *v;
  int num_ctx = 512, num_batch = 2048, max_chunks = -1, r;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    }
    if ((r = engine_flags_parse(&ep, argc, argv, &i)) != 0) {
      if (r < 0)
        return 2;
      continue;
    }
    ON_FLAG("-f", &i, 2) file = v;
    else ON_FLAG("--file", &i, 2) file = v;
    else ON_FLAG("-c", &i, 2) { if (flag_int("-c", v, 4, 1 << 20, &num_ctx)) return 2; }
    else ON_FLAG("--ctx", &i, 2) { if (flag_int("--ctx", v, 4, 1 << 20, &num_ctx)) return 2; }
    else ON_FLAG("-b", &i, 2) { if (flag_int("-b", v, 1, 1 << 24, &num_batch)) return 2; }
    else ON_FLAG("--batch", &i, 2) { if (flag_int("--batch", v, 1, 1 << 24, &num_batch)) return 2; }
    else ON_FLAG("--chunks", &i, 2) { if (flag_int("--chunks", v, -1, 1 << 30, &max_chunks)) return 2; }
    else {
      fprintf(stderr, "error: unknown option '%s' (see pagoda perplexity --help)\n", a);
      return 2;
    }
  }
  if (!file) {
    fprintf(stderr, "error: no text given (-f TEXT)\n");
    return 2;
  }
  /* As llama-perplexity: num_seqs windows per pass, the batch capped at what they hold. */
  int num_seqs = num_batch / num_ctx > 1 ? num_batch / num_ctx : 1;
  if (num_batch > num_seqs * num_ctx)
    num_batch = num_seqs * num_ctx;
  if (num_batch > num_ctx && num_batch % num_ctx) {
    fprintf(stderr, "error: --batch %d must be below --ctx %d or a multiple of it\n", num_batch, num_ctx);
    return 2;
  }
  int worker_rc; /* --tp-rank > 0: this process serves rank 0's model calls instead */
  if (cli_tp_worker(&ep, &worker_rc))
    return worker_rc;
  size_t len = 0;
  char *text = cli_read_file(file, &len);
  if (!text) {
    fprintf(stderr, "error: %s: %s (check -f)\n", file, strerror(errno));
    return 1;
  }
  ep.max_num_seqs = num_seqs;
  ep.max_num_batched_tokens = num_batch > num_ctx ? num_batch : num_ctx;
  ep.prefill_chunk_size = num_batch < num_ctx ? num_batch : num_ctx;
  ep.max_model_len = num_ctx + 1; /* the window and the one token each request must generate */
  ep.prefix_cache_n = 0;        /* windows share nothing */
  if (!ep.pa_memory_mb && !ep.pa_memory_fraction && !ep.pa_context_len)
    ep.pa_context_len = num_ctx + 1;
  pagoda_engine_t *e;
  int rc = 1;
  int32_t *ids = NULL;
  if (pagoda_engine_create(&ep, &e)) {
    fprintf(stderr, "error: %s\n", pagoda_last_error());
    free(text);
    return 1;
  }
  int32_t bos[4];
  int num_bos = pagoda_tokenize(e, "", 0, 1, 0, bos, 4); /* 1: the tokenizer adds BOS */
  double t0 = now_s();
  fprintf(stderr, "perplexity: tokenizing the input ..\n");
  int n = pagoda_tokenize(e, text, len, 1, 0, NULL, 0);
  ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
  if (n < 0 || !ids || pagoda_tokenize(e, text, len, 1, 0, ids, n) != n) {
    fprintf(stderr, "error: %s: cannot tokenize: %s\n", file, n < 0 ? pagoda_last_error() : "out of memory");
    goto done;
  }
  fprintf(stderr, "perplexity: tokenization took %g ms\n", 1e3 * (now_s() - t0));
  if (n < 2 * num_ctx) {
    fprintf(stderr, "error: %s tokenizes to only %d tokens; perplexity with --ctx %d needs at least %d\n",
            file, n, num_ctx, 2 * num_ctx);
    goto done;
  }
  int num_chunks = n / num_ctx;
  if (max_chunks >= 0 && max_chunks < num_chunks)
    num_chunks = max_chunks;
  fprintf(stderr, "perplexity: calculating perplexity over %d chunks, n_ctx=%d, batch_size=%d, n_seq=%d\n",
          num_chunks, num_ctx, num_batch, num_seqs);
  const int first = num_ctx / 2;
  double nll = 0, nll2 = 0;
  long count = 0;
  int32_t *win = malloc((size_t)num_seqs * num_ctx * sizeof *win);
  uint64_t *req = malloc((size_t)num_seqs * sizeof *req);
  double *seq_nll = malloc((size_t)num_seqs * sizeof *seq_nll), *seq_nll2 = malloc((size_t)num_seqs * sizeof *seq_nll2);
  int *seq_done = malloc((size_t)num_seqs * sizeof *seq_done);
  if (!win || !req || !seq_nll || !seq_nll2 || !seq_done) {
    fprintf(stderr, "error: out of memory\n");
    goto done_win;
  }
  struct pagoda_sampling_params sp;
  pagoda_sampling_params_default(&sp);
  sp.temperature = 0;
  sp.max_tokens = 1;
  sp.ignore_eos = 1;
  sp.prompt_logprobs = 1;
  for (int i = 0; i < num_chunks; i += num_seqs) {
    double tp = now_s();
    int num_batch_seqs = num_chunks - i < num_seqs ? num_chunks - i : num_seqs;
    for (int s = 0; s < num_batch_seqs; s++) {
      int32_t *w = win + (size_t)s * num_ctx;
      memcpy(w, ids + (size_t)(i + s) * num_ctx, (size_t)num_ctx * sizeof *w);
      if (num_bos == 1)
        w[0] = bos[0];
      seq_nll[s] = seq_nll2[s] = 0;
      seq_done[s] = 0;
      if (pagoda_add_request_tokens(e, w, num_ctx, &sp, &req[s])) {
        fprintf(stderr, "error: %s\n", pagoda_last_error());
        goto done_win;
      }
    }
    while (pagoda_engine_has_work(e)) {
      const struct pagoda_output *outs;
      int no;
      if (pagoda_engine_step(e, &outs, &no)) {
        fprintf(stderr, "error: %s\n", pagoda_last_error());
        goto done_win;
      }
      for (int k = 0; k < no; k++) {
        const struct pagoda_output *o = &outs[k];
        if (!o->prompt_logprobs)
          continue;
        for (int s = 0; s < num_batch_seqs; s++) {
          if (req[s] != o->request_id)
            continue;
          for (int p = first; p < num_ctx - 1; p++) { /* entry p scores token p + 1 */
            double lp = o->prompt_logprobs[p];
            seq_nll[s] -= lp;
            seq_nll2[s] += lp * lp;
          }
          seq_done[s] = 1;
        }
      }
    }
    if (i == 0) {
      double t = now_s() - tp;
      int total = (int)(t * num_chunks / num_seqs);
      fprintf(stderr, "perplexity: %.2f seconds per pass - ETA ", t);
      if (total >= 3600) {
        fprintf(stderr, "%d hours ", total / 3600);
        total %= 3600;
      }
      fprintf(stderr, "%.2f minutes\n", total / 60.0);
    }
    for (int s = 0; s < num_batch_seqs; s++) {
      if (!seq_done[s]) {
        fprintf(stderr, "error: the engine reported no prompt logprobs for window %d\n", i + s + 1);
        goto done_win;
      }
      nll += seq_nll[s];
      nll2 += seq_nll2[s];
      count += num_ctx - first - 1;
      printf("[%d]%.4f,", i + s + 1, exp(nll / (double)count));
      fflush(stdout);
    }
  }
  printf("\n");
  nll2 /= (double)count;
  nll /= (double)count;
  double ppl = exp(nll);
  nll2 -= nll * nll;
  if (nll2 > 0) {
    printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, sqrt(nll2 / (double)(count - 1)) * ppl);
    rc = 0;
  } else {
    fprintf(stderr, "error: unexpected negative standard deviation of log(prob)\n");
  }
done_win:
  free(win);
  free(req);
  free(seq_nll);
  free(seq_nll2);
  free(seq_done);
done:
  free(ids);
  free(text);
  pagoda_engine_free(e);
  return rc;
}
